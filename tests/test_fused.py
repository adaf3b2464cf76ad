"""Members of a method stacked on one frozen backbone (fairseq_idpg/fused): each member computes what it computes
alone, for every method record that can share a backbone (a new one is covered by its record), and the launches of a
fused forward and backward do not grow with K."""

import pytest
import torch
from conftest import files_taken
from torch.func import functional_call

from fairseq_idpg.errors import ConfigError
from fairseq_idpg.fused import StackedMembers
from fairseq_idpg.launches import Shape, count_launches, ours, tiny_batch
from fairseq_idpg.methods import get_method, methods_where

SHAPE = Shape(layers=2)
DEEP = Shape(layers=4)  # every record's layer-wise options fit (M-IDPG's rank-2 layer biases need L - 1 > 2)
HEAD = "head"
# every record that can share a backbone (its own data: ``frozen_backbone``), so a new block or method is covered by
# its record; the others (fine-tuning, EFL: the backbone trains) are refused
SHARING = methods_where(frozen_backbone=True)
ALONE = methods_where(frozen_backbone=False)
K = 3


def members_of(model, k, scale=0.05):
    """k members: the model's trained tensors moved apart by seeded noise (member 0 is the model's own)."""
    g = torch.Generator().manual_seed(0)
    trained = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    return [{n: v + scale * i * torch.randn(v.shape, generator=g) for n, v in trained.items()} for i in range(k)]


def per_member_batches(model, k):
    """([K, B, T] tokens: member i's rows rolled by i, padded rows included), per-member kwargs."""
    tokens, _ = tiny_batch(SHAPE)
    stacked = torch.stack([tokens.roll(i, 0) for i in range(k)])
    extra = {}
    if model.args.arch == "roberta_idpg":  # M(x) read from the cache, by each row's sentence id
        ids = torch.arange(SHAPE.batch)
        extra["sentence_ids"] = torch.stack([ids.roll(i, 0) for i in range(k)])
    return stacked, extra


def without_dropout(model):
    """``model`` in training mode with every dropout off: a member's masks are its own draws in a fused run."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout) or type(module).__name__ == "FairseqDropout":
            module.p = 0.0
        for key, value in vars(module).items():  # the blocks' own rates (the inducer's lambda_dropout, ...)
            if "dropout" in key and isinstance(value, float):
                setattr(module, key, 0.0)
    return model.train()


@pytest.mark.parametrize("name", SHARING + ["s-idpg-phm-shared-a"])
def test_each_member_computes_what_it_computes_alone(name, method_files):
    record = name.replace("-shared-a", "")
    options = {"idpg_phm_a_sets": 1} if name == "s-idpg-phm-shared-a" else {}
    model, _ = ours(record, DEEP, dtype=torch.float32, **files_taken(get_method(record), method_files), **options)
    without_dropout(model)
    members = members_of(model, K)
    stacked = StackedMembers(model, members=members)
    tokens, extra = per_member_batches(model, K)
    out = stacked(tokens, classification_head_name=HEAD, **extra)
    assert out.shape == (K, SHAPE.batch, 2)
    out.pow(2).sum().backward()
    for i, member in enumerate(members):
        tensors = {n: v.clone().requires_grad_() for n, v in member.items()}
        kwargs = {key: v[i] for key, v in extra.items()}
        alone = functional_call(model, tensors, (tokens[i],), {"classification_head_name": HEAD, **kwargs})[0]
        alone.pow(2).sum().backward()
        torch.testing.assert_close(out[i], alone, rtol=1e-5, atol=1e-6)
        for name_, grad in zip(stacked.names, (t.grad for t in stacked.tensors), strict=True):
            want = tensors[name_].grad
            if want is None:  # a tensor this forward does not read
                assert grad is None or not grad[i].any(), name_
            else:
                torch.testing.assert_close(grad[i], want, rtol=1e-4, atol=1e-6, msg=name_)


def test_members_start_from_the_model_and_are_returned_by_name():
    model, _ = ours("lora", SHAPE, dtype=torch.float32)
    stacked = StackedMembers(model, k=4)
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert stacked.names == list(trained) and stacked.k == 4
    for i in range(4):
        state = stacked.member_state(i)
        assert all(torch.equal(state[n], p) for n, p in trained.items())


def test_dropout_differs_between_members_in_training():
    model, _ = ours("prompt-tuning-5", SHAPE, dtype=torch.float32)
    model.train()
    stacked = StackedMembers(model, k=2)
    tokens, _ = tiny_batch(SHAPE)
    out = stacked(tokens.expand(2, -1, -1), classification_head_name=HEAD)
    assert not torch.equal(out[0], out[1])  # the same tensors and rows: only dropout tells them apart


@pytest.mark.parametrize("name", ALONE)
def test_fine_tuning_cannot_share_a_backbone(name):
    model, _ = ours(name, SHAPE, dtype=torch.float32)
    with pytest.raises(ConfigError, match="every tensor trains .fine-tuning., so its runs cannot share"):
        StackedMembers(model, k=2)


def test_a_batch_of_the_wrong_shape_is_refused():
    model, _ = ours("lora", SHAPE, dtype=torch.float32)
    tokens, _ = tiny_batch(SHAPE)
    with pytest.raises(ValueError, match=r"expected \[K=3, B, T\], got \[4, 32\]"):
        StackedMembers(model, k=3)(tokens)


@pytest.mark.parametrize("name", ["prompt-tuning-5", "m-idpg-phm", "lora"])
def test_launches_do_not_grow_with_the_members(name):
    """A forward and backward of 20 members launches what one member's does, give or take the stacking."""
    model, _ = ours(name, SHAPE, dtype=torch.float32)
    tokens, extra = per_member_batches(model, 1)
    counts = {}
    for k in (1, 20):
        stacked = StackedMembers(model, k=k)
        batch = tokens.expand(k, -1, -1)
        kwargs = {key: v.expand(k, -1) for key, v in extra.items()}

        def step(stacked=stacked, batch=batch, kwargs=kwargs):
            stacked(batch, classification_head_name=HEAD, **kwargs).sum().backward()

        step()  # warm-up: caches filled
        counts[k] = count_launches(step, trace=False).total
    assert counts[20] <= counts[1] * 1.1, counts


@pytest.mark.parametrize("name", ["prompt-tuning-5", "m-idpg-phm", "lora"])
def test_a_fused_step_of_one_member_launches_at_most_a_third_more_than_the_model_alone(name):
    """Attention folded over the members (one fused kernel each way per layer, as alone): a fused forward and
    backward of one member launches at most 1.35 x the lone model's (before the fold: about 2 x)."""
    shape = Shape(layers=12)
    model, forward = ours(name, shape, dtype=torch.float32)
    tokens, extra = tiny_batch(shape)[0], {}
    if model.args.arch == "roberta_idpg":
        extra["sentence_ids"] = torch.arange(shape.batch)[None]
    stacked = StackedMembers(model, k=1)

    def alone():
        forward().sum().backward()

    def fused():
        stacked(tokens[None], classification_head_name=HEAD, **extra).sum().backward()

    counts = {}
    for label, step in (("alone", alone), ("fused", fused)):
        step()
        counts[label] = count_launches(step, trace=False).total
    assert counts["fused"] <= 1.35 * counts["alone"], counts


def folded_inputs(k=3, b=4, t=9, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(k, d, d, generator=g, requires_grad=True)
    x = torch.randn(b, 2, t, d, generator=g)
    mask = torch.ones(b, 1, 1, t, dtype=torch.bool)
    mask[0, ..., t // 2 :] = False  # a padded row
    return weights, x, mask


def test_folded_attention_equals_torchs_per_member_outputs_and_gradients():
    """Under vmap the folded operator computes, for each member, torch's own attention of that member."""
    from fairseq_idpg.modules.attention.folded import attention, folded_members

    weights, x, mask = folded_inputs()

    def member(w, fn):
        return fn(x @ w, x @ w.T, x @ (2 * w), mask)

    def torch_own(q, k, v, m):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3)

    want = torch.stack([member(w, torch_own) for w in weights])
    (want_grad,) = torch.autograd.grad(want.square().sum(), weights)
    with folded_members(0):
        got = torch.vmap(lambda w: member(w, lambda q, k, v, m: attention(q, k, v, m, 0.0, 0.3, 0)))(weights)
    (got_grad,) = torch.autograd.grad(got.square().sum(), weights)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-5)


def test_folded_attention_replays_its_dropout_masks_in_the_backward():
    """With dropout the backward's recomputation draws the forward's masks (from the seed): its gradients are
    those of the forward that ran, as in a reference drawing the same masks once."""
    from fairseq_idpg.modules.attention.folded import attention

    weights, x, mask = folded_inputs()
    got = torch.vmap(lambda w: attention(x @ w, x @ w.T, x @ (2 * w), mask, 0.5, 0.3, 7), randomness="different")(
        weights
    )
    (got_grad,) = torch.autograd.grad(got.square().sum(), weights)
    q, k, v = (
        torch.stack([x @ f(w) for w in weights]).flatten(0, 1) for f in (lambda w: w, lambda w: w.T, lambda w: 2 * w)
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        want = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask.repeat(3, 1, 1, 1), dropout_p=0.5, scale=0.3
        ).unflatten(0, (3, -1))
    (want_grad,) = torch.autograd.grad(want.square().sum(), weights)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-5)
    undropped = torch.vmap(lambda w: attention(x @ w, x @ w.T, x @ (2 * w), mask, 0.0, 0.3, 7))(weights)
    assert not torch.allclose(got, undropped)  # the masks dropped something


class _Logits:
    """A model as sentence_prediction reads it: returns fixed logits; its targets are the sample's."""

    classification_heads = {"sentence_classification_head": None}
    args = None

    def __init__(self, logits):
        self.logits = logits

    def __call__(self, **kwargs):
        return self.logits, {}

    def get_targets(self, sample, net_output):
        return sample["target"]


@pytest.mark.parametrize("regression", [False, True])
def test_members_loss_equals_each_members_criterion_on_its_own_rows(regression):
    """The fused step's one loss for every member (fused/criterion.py) is sentence_prediction's on each member's
    own rows: losses, correct counts and the logits' gradients; a member with fewer rows has the rest masked."""
    from fairseq.criterions.sentence_prediction import SentencePredictionConfig, SentencePredictionCriterion

    from fairseq_idpg.fused.criterion import members_loss

    criterion = SentencePredictionCriterion(SentencePredictionConfig(regression_target=regression), None)
    rows, b, classes = [4, 2, 4], 4, 1 if regression else 3
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(K, b, classes, generator=g, dtype=torch.bfloat16).requires_grad_()
    targets = torch.rand(K, b, generator=g) if regression else torch.randint(classes, (K, b), generator=g)
    losses, values = members_loss(criterion, logits, targets, rows)
    (grad,) = torch.autograd.grad(losses.sum(), logits)
    for k, n in enumerate(rows):
        own = logits[k, :n].detach().requires_grad_()
        loss, size, log = criterion(_Logits(own), {"target": targets[k, :n], "ntokens": 7, "net_input": {}})
        (want,) = torch.autograd.grad(loss, own)
        torch.testing.assert_close(losses[k], loss, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(grad[k, :n], want, rtol=0, atol=0)
        assert size == n and not grad[k, n:].any()
        if not regression:
            assert int(values["ncorrect"][k]) == int(log["ncorrect"])
    assert regression or values["ncorrect"].tolist() != [0] * K  # some rows right: the count is exercised


@pytest.mark.slow
@pytest.mark.parametrize("name", ["prompt-tuning-5", "m-idpg-phm", "lora"])
def test_twenty_runs_together_launch_at_most_a_tenth_per_member_update(name, tmp_path):
    """K = 20 runs trained together (a sweep's 4 lrs x 5 seeds): kernel launches per member-update at most a tenth
    of one run's whole fairseq-train update alone (bf16, 24 layers, the data pipeline aside), as
    ``scripts/bench_fused.py launches`` prints them."""
    from fairseq_idpg.launches import fused_update_launches, one_thread, update_launches

    shape = Shape(layers=24, dim=64)
    alone = update_launches(name, shape, torch.bfloat16, trace=False, folder=str(tmp_path)).total
    with one_thread():
        together = fused_update_launches(name, shape, torch.bfloat16, 20, str(tmp_path))
    assert together <= 0.10 * alone, f"{name}: {together:.1f} launches per member-update, alone {alone}"
