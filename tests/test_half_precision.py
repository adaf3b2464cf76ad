"""fp16, memory-efficient fp16 and bf16 training of every method record on the CPU.

What fairseq-train does with ``--fp16`` / ``--memory-efficient-fp16`` / ``--bf16``, without the data
pipeline: the model (and criterion) cast with ``half()`` / ``to(bfloat16)`` (``Trainer.__init__``), the
optimizer built from the trained parameters only (``Trainer._build_optimizer``: ``requires_grad``) by
``FP16Optimizer`` (fp16 and bf16; bf16 without loss scaling nor flattening) or
``MemoryEfficientFP16Optimizer``, and the update of ``Trainer.train_step``: scaled backward, clip (which
checks overflow), step. The CPU path needs compat fix 11 (the flat fp32 copy was keyed by a CUDA device).

Every record (the frozen-backbone methods, full fine-tuning and EFL) is built once on a tiny 4-layer
backbone; a copy of it trains 3 updates of the sentence-prediction loss in each precision. Checks: the
loss stays finite, every trained tensor moved, every frozen backbone tensor is bit-identical, fp32 master
weights exist for the trained parameters only, and what the method generates (the prompts P_0 and P_l,
IDPG's M(x) from its cache, GloVe's M(x), the generator's weights and biases c_l, prefix tuning's
prefixes) has the encoder's dtype. An injected inf gradient skips its update (trained tensors
unchanged), halves the loss scale, and the next update proceeds.

End to end (slow): ``scripts/run.sh --fp16`` and ``--bf16`` train M-IDPG-PHM on the stand-in, and
fairseq-validate scores the compact checkpoint in fp32 within ``fp32_rescore_tolerance`` of the run's own
validation.
"""

import copy
import functools
import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import build_record

from fairseq_idpg.methods import METHODS
from fairseq_idpg.models.prompted_roberta import PromptedRobertaModel
from fairseq_idpg.modules.attention.prefix import PrefixEncoder
from fairseq_idpg.modules.entailment_head import install_entailment_head
from fairseq_idpg.modules.prompts.generator import PromptGenerator
from fairseq_idpg.tasks.model_protocol import SentenceCacheModel

TARGET = torch.tensor([1, 1])  # one class: a bf16 tie of the two rows' probabilities cannot cancel the head's grads
DTYPES = {"--fp16": torch.float16, "--memory-efficient-fp16": torch.float16, "--bf16": torch.bfloat16}
UNUSED_BY_CLASSIFICATION = "encoder.lm_head."  # fine-tuning trains it, a sentence-prediction loss never reaches it


@pytest.fixture(scope="module")
def tokens(tiny4):
    """Two sentences (one padded) of words that the GloVe file has, so GloVe-fed weights get a gradient."""
    words = [tiny4.dictionary.index(w) for w in tiny4.dictionary.symbols if w.isalpha()][:7]
    return torch.tensor([[0, *words[:4], 2], [0, *words[4:], 2, 1]])


@functools.lru_cache(maxsize=None)
def training_config(precision):
    """fairseq-train's config for ``precision`` (Adam, lr 1e-2, clip 1.0, on the CPU); parsed once per
    precision (fairseq's parser takes about 2 s of CPU) and only read by the optimizers."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = ["data", "--task", "sentence_prediction", "--num-classes", "2", "--arch", "roberta_base"]
    argv += ["--criterion", "sentence_prediction", "--optimizer", "adam", "--lr", "1e-2", "--clip-norm", "1.0"]
    argv += ["--cpu", precision]
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))


@pytest.fixture(scope="module")
def record_model(tiny4, method_files):
    """``record_model(name)``: a fresh copy of the record's fp32 model, built once per record (EFL with
    its entailment head, as its task installs it)."""
    built = {}

    def get(name):
        if name not in built:
            built[name] = build_record(METHODS[name], tiny4, method_files, seed=0)
            if METHODS[name].task == "efl_sentence_prediction":
                install_entailment_head(built[name], "head")
        return copy.deepcopy(built[name])

    return get


def half_setup(model, precision):
    """(model, optimizer, trained names) as fairseq's Trainer builds them for ``precision``."""
    from fairseq import optim

    cfg = training_config(precision)
    model = model.to(DTYPES[precision]).train()
    params = [p for p in model.parameters() if p.requires_grad]  # Trainer._build_optimizer
    if cfg.common.memory_efficient_fp16:
        optimizer = optim.MemoryEfficientFP16Optimizer.build_optimizer(cfg, params)
    else:
        optimizer = optim.FP16Optimizer.build_optimizer(cfg, params)
    return model, optimizer, {n for n, p in model.named_parameters() if p.requires_grad}


def with_sentence_cache(model, tokens):
    """An IDPG model reads M(x) from an in-memory cache as under ``idpg_sentence_prediction``: the
    net_input's ``sentence_ids`` (slot 0), or {} for a model without one. The first forward fills it
    (RoBERTa's M(x); GloVe's are filled here), the next ones read it."""
    if not isinstance(model, SentenceCacheModel) or not model.wants_sentence_cache():
        return {}
    rows = [{"net_input.src_tokens": row[row.ne(1)]} for row in tokens]  # the dataset's unpadded rows
    model.attach_sentence_cache(0, {"split": "train", "examples": len(rows)}, rows)
    return {"sentence_ids": torch.arange(len(rows))}


def update(model, optimizer, tokens, inject_inf=None, **net_input):
    """One update of Trainer.train_step: the sentence-prediction loss (log-softmax in fp32, summed),
    scaled backward, grads / sample size, clip (raises OverflowError on inf), step. Returns the loss;
    ``update.zero_grads``: the trained tensors whose gradient was absent or 0, ``update.no_grads``: absent."""
    optimizer.zero_grad()
    logits = model(tokens, classification_head_name="head", **net_input)[0]
    loss = F.nll_loss(F.log_softmax(logits, dim=-1, dtype=torch.float32), TARGET, reduction="sum")
    optimizer.backward(loss)
    if inject_inf is not None:
        inject_inf.grad.view(-1)[0] = float("inf")
    optimizer.multiply_grads(1.0 / len(TARGET))
    optimizer.clip_grad_norm(1.0)
    optimizer.step()
    # after the step the fp16 grads are unscaled in place by the memory-efficient optimizer only
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    update.no_grads = {n for n, g in grads.items() if g is None}
    update.zero_grads = update.no_grads | {n for n, g in grads.items() if g is not None and not g.any()}
    return loss.item()


def master_numel(optimizer):
    """Elements of the optimizer's fp32 master weights (none for the memory-efficient one)."""
    fp32 = getattr(optimizer, "fp32_params", None)
    if fp32 is None:
        return 0
    return sum(p.numel() for p in (fp32.values() if isinstance(fp32, dict) else fp32))


def master_weights(optimizer, trained, model):
    """{trained name: a copy of its fp32 master weight} ({} for the memory-efficient optimizer). The masters
    follow the optimizer's parameter list, which is the model's trained parameters in order (flat or not)."""
    fp32 = getattr(optimizer, "fp32_params", None)
    if fp32 is None:
        return {}
    names = [n for n, p in model.named_parameters() if n in trained]
    if isinstance(fp32, dict):  # flattened: one tensor per device, the parameters end to end
        sizes = [p.numel() for n, p in model.named_parameters() if n in trained]
        return dict(zip(names, (t.detach().clone() for t in torch.cat(list(fp32.values())).split(sizes)), strict=True))
    return {n: p.detach().clone() for n, p in zip(names, fp32, strict=True)}


def watch_generated(model):
    """Records the dtypes of what ``model`` generates in its forward passes, by what it is: {what: {dtype}}.
    Every key is present from the start (an empty set: never produced, which the test refuses)."""
    seen = {}

    def watch(owner, attr, what):
        seen[what] = set()
        original = getattr(owner, attr)

        def recorded(*args, **kwargs):
            out = original(*args, **kwargs)
            seen[what].update(t.dtype for t in (out if isinstance(out, tuple) else (out,)))
            return out

        setattr(owner, attr, recorded)  # on this instance only (a copy of the record's model)

    if isinstance(model, PromptedRobertaModel):  # P_0 [.., t, d], and P_l of the deep variants
        seen["P_0"] = set()
        prompts = model.prompts

        def watched_prompts(*args, **kwargs):
            first, layer_prompts = prompts(*args, **kwargs)
            seen["P_0"].add(first.dtype)
            if layer_prompts is None:
                return first, None
            seen.setdefault("P_l", set())
            return first, lambda layer, x: watched(layer_prompts(layer, x))

        def watched(p):
            seen["P_l"].add(p.dtype)
            return p

        model.prompts = watched_prompts
    if isinstance(model, SentenceCacheModel):
        watch(model, "sentence_representation", "M(x) (GloVe mean)" if model.glove is not None else "M(x)")
    for module in model.modules():
        if isinstance(module, PromptGenerator):
            watch(module, "weights", "generator W1, b1, W2")
            watch(module.biases, "forward", "generator biases c_l")
        elif isinstance(module, PrefixEncoder):
            watch(module, "layer_kv", "prefixes P_k, P_v")
    return seen


def one_record_per_model():
    """Frozen-backbone methods, full fine-tuning, EFL: the first record of each model (a record that differs
    from another by its recipe alone, such as dpt-paper-lr, builds and updates the same model)."""
    models = {}
    for name, m in METHODS.items():
        models.setdefault((m.arch, m.task, repr(sorted(m.options.items()))), name)
    return list(models.values())


RECORDS = one_record_per_model()


@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("name", RECORDS)
def test_three_half_precision_updates(name, precision, record_model, tokens):
    method = METHODS[name]
    model, optimizer, trained = half_setup(record_model(name), precision)
    dtype = DTYPES[precision]
    assert {p.dtype for p in model.parameters()} == {dtype}
    generated = watch_generated(model)
    net_input = with_sentence_cache(model, tokens)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    masters_before = master_weights(optimizer, trained, model)

    losses, underflow, unused = [], set(trained), set(trained)
    for _ in range(3):
        losses.append(update(model, optimizer, tokens, **net_input))
        underflow &= update.zero_grads
        unused &= update.no_grads

    assert all(torch.isfinite(torch.tensor(losses))), f"{name} {precision}: loss {losses}"
    after = dict(model.named_parameters())
    frozen = [n for n in after if n not in trained]
    if method.frozen_backbone:
        assert frozen, f"{name}: nothing frozen"
        assert not unused, f"{name}: trained tensors outside the forward pass: {sorted(unused)[:3]}"
    else:  # full fine-tuning: everything trains; the LM head (tied embeddings aside) has no part in the loss
        assert not frozen and unused and all(n.startswith(UNUSED_BY_CLASSIFICATION) for n in unused), unused
    changed = [n for n in frozen if not torch.equal(before[n], after[n])]
    assert not changed, f"{name} {precision} changed frozen {changed[:3]}"
    # --memory-efficient-fp16 unscales the grads in fp16 (fairseq's design): one below 6e-8 becomes 0 and its
    # tensor stays; with fp32 master weights (--fp16, --bf16) every trained tensor's master must move (its half
    # copy may not yet: Compacter's s and t, grads ~1e-9 against Adam's eps 1e-8, move under bf16's resolution)
    if precision == "--memory-efficient-fp16":
        still = [n for n in trained if torch.equal(before[n], after[n]) and n not in underflow | unused]
    else:
        masters = master_weights(optimizer, trained, model)
        still = [n for n in trained if torch.equal(masters_before[n], masters[n]) and n not in unused]
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

    # what the method generates is in the encoder's dtype (not silently fp32, cast at the insertion)
    assert generated == {what: {dtype} for what in generated}, f"{name} {precision}: {generated}"
    if net_input:  # the cache holds M(x) of every example after the first update, and the next ones read it
        caches = model._caches[0]["by_tag"].values()
        assert caches and all(cache.num_filled == len(TARGET) for cache in caches), f"{name}: M(x) not cached"


@pytest.mark.parametrize("precision", ["--fp16", "--memory-efficient-fp16"])
def test_inf_gradient_skips_the_update_and_lowers_the_loss_scale(precision, record_model, tokens):
    model, optimizer, trained = half_setup(record_model("m-idpg-phm"), precision)
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


# ---------------------------------------------------------------------------------------- end to end
REPO = Path(__file__).resolve().parents[1]
SLICE = {"train.tsv": 12, "dev.tsv": 24}  # 3 updates of 4 = one epoch; one validation, of 24 sentences


def fp32_rescore_tolerance(dtype):
    """(loss in bits, accuracy in points) by which fairseq-validate in fp32 may differ from the validation that
    a ``dtype`` run logged. The weights are the same (fp16/bf16 -> fp32 is exact); only the activations are
    rounded differently, each operation by at most u = 2^-11 (fp16) or 2^-8 (bf16) relative. Along the
    stand-in's 6 layers to a logit some 20 roundings add up, and the loss moves by about the logits' error:
    20 u (fp16 0.0098, bf16 0.078; measured 0.000 and 0.001). A prediction flips only where the two logits
    are closer than that: at most one of the 24 sentences (100 / 24 points)."""
    unit_roundoff = torch.finfo(dtype).eps / 2
    return 20 * unit_roundoff, 100 / SLICE["dev.tsv"]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["--fp16"])  # bf16's tolerance is the same function's; CI time (--bf16 passed)
def test_half_precision_run_rescores_in_fp32(precision, shared_data, standin_model, tmp_path):
    """``scripts/run.sh SST-2 --method m-idpg-phm --fp16`` (or ``--bf16``): 3 updates on the stand-in, the
    compact checkpoint of half-precision weights, scored by run.sh's fairseq-validate in fp32 (its M(x) cache
    is float32: recomputed, not the run's) within ``fp32_rescore_tolerance`` of the run's logged validation."""
    from fairseq_idpg.logs import validations

    dtype = DTYPES[precision]
    raw = tmp_path / "SST-2"
    raw.mkdir()
    for name, rows in SLICE.items():
        lines = (shared_data / "glue" / "SST-2" / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (raw / name).write_text("".join(lines[: rows + 1]), encoding="utf-8")
    cache = tmp_path / "mx-cache"
    cmd = ["bash", str(REPO / "scripts" / "run.sh"), "SST-2", "--raw", str(raw), "--method", "m-idpg-phm"]
    cmd += ["--max-update", "3", "--total-batch", "4", precision, "--work-dir", str(tmp_path)]
    cmd += ["--validate-interval-updates", "3", "--idpg-cache-dir", str(cache)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    save = Path(re.findall(r"^run folder: (.+)$", out.stdout, re.M)[-1])

    state = torch.load(save / "checkpoint_best.pt", map_location="cpu", weights_only=False)
    trained = {k: v for k, v in state["model"].items() if not k.startswith("_")}  # not the fingerprint
    assert trained and not any(k.startswith("encoder.") for k in trained)  # compact: generator + head
    # the half-precision weights, saved as float32 by fairseq (utils.move_to_cpu): every value is a ``dtype`` one
    assert all(torch.equal(v, v.to(dtype).to(v.dtype)) for v in trained.values())
    # M(x) of the run in its own dtype (train, valid); fairseq-validate's in float32 (valid)
    tags = sorted(json.loads((f / "key.json").read_text())["dtype"] for f in cache.iterdir())
    assert tags == sorted([str(dtype).split(".")[1]] * 2 + ["float32"]), tags

    (logged,) = [e.stats for e in validations((save / "train.log").read_text())]
    rescored = json.loads((save / "results.json").read_text())["results"]["valid"]
    loss_tol, accuracy_tol = fp32_rescore_tolerance(dtype)
    assert abs(rescored["loss"] - logged["loss"]) <= loss_tol, (logged, rescored)
    assert abs(rescored["accuracy"] - logged["accuracy"]) <= accuracy_tol, (logged, rescored)
