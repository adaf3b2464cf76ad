"""fp16, memory-efficient fp16 and bf16 training of every frozen-backbone method record on the CPU.

What fairseq-train does with ``--fp16`` / ``--memory-efficient-fp16`` / ``--bf16``, without the data
pipeline: the model (and criterion) cast with ``half()`` / ``to(bfloat16)`` (``Trainer.__init__``), the
optimizer built from the trained parameters only (``Trainer._build_optimizer``: ``requires_grad``) by
``FP16Optimizer`` (fp16 and bf16; bf16 without loss scaling nor flattening) or
``MemoryEfficientFP16Optimizer``, and the update of ``Trainer.train_step``: scaled backward, clip (which
checks overflow), step. The CPU path needs compat fix 11 (the flat fp32 copy was keyed by a CUDA device).

For each record and precision, 3 updates of the sentence-prediction loss on a tiny 4-layer backbone:
the loss stays finite, every trained tensor moved, every frozen backbone tensor is bit-identical, and
fp32 master weights exist for the trained parameters only. An injected inf gradient skips its update
(trained tensors unchanged), halves the loss scale, and the next update proceeds.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import build_record

from fairseq_idpg.methods import METHODS

FROZEN = sorted(name for name, m in METHODS.items() if m.frozen_backbone)
TARGET = torch.tensor([1, 1])  # one class: a bf16 tie of the two rows' probabilities cannot cancel the head's grads
DTYPES = {"--fp16": torch.float16, "--memory-efficient-fp16": torch.float16, "--bf16": torch.bfloat16}


@pytest.fixture(scope="module")
def tokens(tiny4):
    """Two sentences (one padded) of words that the GloVe file has, so GloVe-fed weights get a gradient."""
    words = [tiny4.dictionary.index(w) for w in tiny4.dictionary.symbols if w.isalpha()][:7]
    return torch.tensor([[0, *words[:4], 2], [0, *words[4:], 2, 1]])


def training_config(precision):
    """fairseq-train's config for ``precision`` (Adam, lr 1e-2, clip 1.0, on the CPU)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = ["data", "--task", "sentence_prediction", "--num-classes", "2", "--arch", "roberta_base"]
    argv += ["--criterion", "sentence_prediction", "--optimizer", "adam", "--lr", "1e-2", "--clip-norm", "1.0"]
    argv += ["--cpu", precision]
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))


def half_setup(name, precision, tiny4, method_files):
    """(model, optimizer, trained names) as fairseq's Trainer builds them for ``precision``."""
    from fairseq import optim

    cfg = training_config(precision)
    model = build_record(METHODS[name], tiny4, method_files, seed=0).to(DTYPES[precision]).train()
    params = [p for p in model.parameters() if p.requires_grad]  # Trainer._build_optimizer
    if cfg.common.memory_efficient_fp16:
        optimizer = optim.MemoryEfficientFP16Optimizer.build_optimizer(cfg, params)
    else:
        optimizer = optim.FP16Optimizer.build_optimizer(cfg, params)
    return model, optimizer, {n for n, p in model.named_parameters() if p.requires_grad}


def update(model, optimizer, tokens, inject_inf=None):
    """One update of Trainer.train_step: the sentence-prediction loss (log-softmax in fp32, summed),
    scaled backward, grads / sample size, clip (raises OverflowError on inf), step. Returns the loss."""
    optimizer.zero_grad()
    logits = model(tokens, classification_head_name="head")[0]
    loss = F.nll_loss(F.log_softmax(logits, dim=-1, dtype=torch.float32), TARGET, reduction="sum")
    optimizer.backward(loss)
    if inject_inf is not None:
        inject_inf.grad.view(-1)[0] = float("inf")
    optimizer.multiply_grads(1.0 / len(TARGET))
    optimizer.clip_grad_norm(1.0)
    optimizer.step()
    # after the step the fp16 grads are unscaled in place by the memory-efficient optimizer only
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    update.zero_grads = {n for n, g in grads.items() if g is None or not g.any()}
    return loss.item()


def master_numel(optimizer):
    """Elements of the optimizer's fp32 master weights (none for the memory-efficient one)."""
    fp32 = getattr(optimizer, "fp32_params", None)
    if fp32 is None:
        return 0
    return sum(p.numel() for p in (fp32.values() if isinstance(fp32, dict) else fp32))


# every record in one precision (in turn: a full 3 x record sweep takes minutes on 2 CPU cores), and
# one record in all three
CASES = [(name, list(DTYPES)[i % len(DTYPES)]) for i, name in enumerate(FROZEN)]
CASES += [("m-idpg-phm", p) for p in DTYPES if ("m-idpg-phm", p) not in CASES]


@pytest.mark.parametrize("name, precision", CASES)
def test_three_half_precision_updates(name, precision, tiny4, method_files, tokens):
    model, optimizer, trained = half_setup(name, precision, tiny4, method_files)
    dtype = DTYPES[precision]
    assert {p.dtype for p in model.parameters()} == {dtype}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    losses, underflow = [], set(trained)
    for _ in range(3):
        losses.append(update(model, optimizer, tokens))
        underflow &= update.zero_grads

    assert all(torch.isfinite(torch.tensor(losses))), f"{name} {precision}: loss {losses}"
    after = dict(model.named_parameters())
    frozen = [n for n in after if n not in trained]
    assert frozen, f"{name}: nothing frozen"
    changed = [n for n in frozen if not torch.equal(before[n], after[n])]
    assert not changed, f"{name} {precision} changed frozen {changed[:3]}"
    # --memory-efficient-fp16 unscales the grads in fp16 (fairseq's design): one below 6e-8 becomes 0 and its
    # tensor stays; with fp32 master weights (--fp16, --bf16) every trained tensor must move
    may_stay = underflow if precision == "--memory-efficient-fp16" else set()
    still = [n for n in trained if torch.equal(before[n], after[n]) and n not in may_stay]
    assert not still, f"{name} {precision}: trained tensors did not move: {still}"
    assert all(after[n].dtype == dtype for n in trained)
    trained_numel = sum(after[n].numel() for n in trained)
    if precision == "--memory-efficient-fp16":
        assert master_numel(optimizer) == 0
        held = [p for group in optimizer.optimizer.param_groups for p in group["params"]]
        assert sum(p.numel() for p in held) == trained_numel
    else:
        assert master_numel(optimizer) == trained_numel
        assert all(p.dtype == torch.float32 for p in optimizer.optimizer.param_groups[0]["params"])


@pytest.mark.parametrize("precision", ["--fp16", "--memory-efficient-fp16"])
def test_inf_gradient_skips_the_update_and_lowers_the_loss_scale(precision, tiny4, method_files, tokens):
    model, optimizer, trained = half_setup("m-idpg-phm", precision, tiny4, method_files)
    update(model, optimizer, tokens)
    scale = optimizer.scaler.loss_scale
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = {n: v.clone() for n, v in optimizer.state_dict()["state"][0].items() if torch.is_tensor(v)}

    victim = next(p for n, p in model.named_parameters() if n in trained and not n.startswith("classification"))
    with pytest.raises(OverflowError, match="setting loss scale to"):
        update(model, optimizer, tokens, inject_inf=victim)
    optimizer.zero_grad()  # what Trainer.train_step does on OverflowError

    assert optimizer.scaler.loss_scale == scale / 2
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert all(torch.equal(v, optimizer.state_dict()["state"][0][k]) for k, v in state.items())
    loss = update(model, optimizer, tokens)
    assert torch.isfinite(torch.tensor(loss))
    assert optimizer.scaler.loss_scale == scale / 2
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters() if n in trained)
