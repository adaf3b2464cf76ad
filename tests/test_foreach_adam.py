"""fairseq's Adam in foreach operators (compat fix 14, ``fairseq_idpg_compat.py``): ``--optimizer adam`` and
``adam_head_lr`` train every method family as fairseq's per-tensor loop does, in fp32, fp16 (``FP16Optimizer``
and ``MemoryEfficientFP16Optimizer``) and bf16, and the optimizer's step launches as many operators for 40
tensors as for 10.

Tolerance: fp32 parameters within 1e-6 (relative) of the loop's after three clipped updates at lr 1e-2 with
weight decay; half-precision ones within one step of their dtype (one rounding of the written-back value).
On the CPU the foreach operators run the loop's own per-tensor operators, so the values are equal there; the
tolerance is for CUDA's fused foreach kernels.
"""

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from conftest import build_record

from fairseq_idpg.launches import count_launches
from fairseq_idpg.methods import METHODS, representatives

# one record per family, and prefix tuning (in the prompts family by its record, a model of its own)
FAMILIES = sorted({*representatives().values(), "prefix-tuning"})
PRECISIONS = {"fp32": (), "fp16": ("--fp16",), "memory-efficient-fp16": ("--memory-efficient-fp16",)}
PRECISIONS["bf16"] = ("--bf16",)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "memory-efficient-fp16": torch.float16, "bf16": torch.bfloat16}
TARGET = torch.tensor([1, 0])


@functools.lru_cache(maxsize=None)
def training_config(precision, optimizer="adam"):
    """fairseq-train's config (the recipes' Adam: betas, eps, weight decay; lr 1e-2, clip 1.0), CPU."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = ["data", "--task", "sentence_prediction", "--num-classes", "2", "--arch", "roberta_base"]
    argv += ["--criterion", "sentence_prediction", "--optimizer", optimizer, "--lr", "1e-2", "--clip-norm", "1.0"]
    argv += ["--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-6", "--weight-decay", "0.1", "--cpu"]
    argv += ["--head-lr", "3e-2"] if optimizer == "adam_head_lr" else []
    argv += PRECISIONS[precision]
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))


@pytest.fixture(scope="module")
def record_model(tiny4, method_files):
    built = {}

    def get(name):
        if name not in built:
            built[name] = build_record(METHODS[name], tiny4, method_files, seed=0)
        return copy.deepcopy(built[name])

    return get


@pytest.fixture(scope="module")
def tokens(tiny4):
    words = [tiny4.dictionary.index(w) for w in tiny4.dictionary.symbols if w.isalpha()][:7]
    return torch.tensor([[0, *words[:4], 2], [0, *words[4:], 2, 1]])


def build_optimizer(model, precision, optimizer="adam"):
    """The optimizer fairseq's Trainer builds for ``precision`` over the trained parameters."""
    from fairseq import optim

    from fairseq_idpg.optim import mark_head

    cfg = training_config(precision, optimizer)
    params = [p for p in mark_head(model).parameters() if p.requires_grad]
    if precision == "fp32":
        return optim.build_optimizer(cfg.optimizer, params)
    if cfg.common.memory_efficient_fp16:
        return optim.MemoryEfficientFP16Optimizer.build_optimizer(cfg, params)
    return optim.FP16Optimizer.build_optimizer(cfg, params)


def sentence_ids(model, tokens):
    """IDPG's M(x) from an in-memory cache, as its task feeds it (the first forward fills it)."""
    from fairseq_idpg.tasks.model_protocol import SentenceCacheModel

    if not isinstance(model, SentenceCacheModel) or not model.wants_sentence_cache():
        return {}
    rows = [{"net_input.src_tokens": row[row.ne(1)]} for row in tokens]
    model.attach_sentence_cache(0, {"split": "train", "examples": len(rows)}, rows)
    return {"sentence_ids": torch.arange(len(rows))}


def trained_with(adam_class, model, tokens, precision, monkeypatch, optimizer="adam", updates=3):
    """The trained tensors (fp32 copies) after ``updates`` of Trainer.train_step's sequence with
    ``fairseq.optim.adam.Adam`` = ``adam_class``; dropout seeded alike."""
    from fairseq.optim import adam

    monkeypatch.setattr(adam, "Adam", adam_class)
    model = model.to(DTYPES[precision]).train()
    opt = build_optimizer(model, precision, optimizer)
    assert type(opt.optimizer) is adam_class
    extra = sentence_ids(model, tokens)
    torch.manual_seed(0)
    for _ in range(updates):
        opt.zero_grad()
        logits = model(tokens, classification_head_name="head", **extra)[0]
        opt.backward(F.nll_loss(F.log_softmax(logits, dim=-1, dtype=torch.float32), TARGET, reduction="sum"))
        opt.multiply_grads(1.0 / len(TARGET))
        opt.clip_grad_norm(1.0)
        opt.step()
    return {n: p.detach().float().clone() for n, p in model.named_parameters() if p.requires_grad}


def fairseqs_loops(monkeypatch):
    """fairseq's own per-tensor loops back in place of fixes 14 and 15 (undone by ``monkeypatch``)."""
    from fairseq import utils
    from fairseq.optim import adam, fairseq_optimizer, fp16_optimizer

    monkeypatch.setattr(adam, "Adam", adam.Adam.per_tensor)
    monkeypatch.setattr(utils, "clip_grad_norm_", utils.clip_grad_norm_.per_tensor)
    optimizer = fairseq_optimizer.FairseqOptimizer
    monkeypatch.setattr(optimizer, "multiply_grads", optimizer.multiply_grads.per_tensor)
    mixin = fp16_optimizer._FP16OptimizerMixin
    for name, method in mixin._fairseq_idpg_per_tensor.items():
        monkeypatch.setattr(mixin, name, method)
    return adam.Adam


def assert_same_training(record_model, tokens, name, precision, monkeypatch, optimizer="adam"):
    from fairseq.optim import adam

    foreach = adam.Adam
    assert foreach.__name__ == "ForeachAdam", "compat fix 14 is not applied"
    ours = trained_with(foreach, record_model(name), tokens, precision, monkeypatch, optimizer)
    with monkeypatch.context() as patch:
        theirs = trained_with(fairseqs_loops(patch), record_model(name), tokens, precision, patch, optimizer)
    start = {n: p.detach().float() for n, p in record_model(name).named_parameters() if p.requires_grad}
    moved = [n for n in ours if not torch.equal(ours[n], start[n].to(DTYPES[precision]).float())]
    assert moved, "nothing trained"
    tolerance = 1e-6 if precision == "fp32" else torch.finfo(DTYPES[precision]).eps
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=tolerance, atol=tolerance * 1e-2, msg=named(name))


def named(name):
    return lambda message: f"{name}: {message}"


@pytest.mark.parametrize("name", FAMILIES)
def test_foreach_adam_trains_every_family_as_fairseqs_loop_in_fp32(record_model, tokens, name, monkeypatch):
    assert_same_training(record_model, tokens, name, "fp32", monkeypatch)


@pytest.mark.parametrize("precision", ["fp16", "memory-efficient-fp16", "bf16"])
@pytest.mark.parametrize("name", ["lora", "finetune", "m-idpg-phm"])
def test_foreach_adam_trains_as_fairseqs_loop_in_half_precision(record_model, tokens, name, precision, monkeypatch):
    assert_same_training(record_model, tokens, name, precision, monkeypatch)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_adam_head_lr_two_groups_train_as_fairseqs_loop(record_model, tokens, precision, monkeypatch):
    assert_same_training(record_model, tokens, "prompt-tuning-5", precision, monkeypatch, optimizer="adam_head_lr")


def _step_launches(adam_class, tensors, weight_decay=0.1):
    """Operators of the third step of ``adam_class`` over ``tensors`` fp32 tensors with gradients."""
    params = [torch.nn.Parameter(torch.randn(3, 2)) for _ in range(tensors)]
    optimizer = adam_class(params, lr=1e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=weight_decay)
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()
    optimizer.step()
    return count_launches(optimizer.step, trace=False, cuda_like=False).total


def test_the_step_launches_the_same_for_10_and_40_tensors():
    from fairseq.optim import adam

    assert _step_launches(adam.Adam, 10) == _step_launches(adam.Adam, 40) == 8  # 7 without weight decay
    assert _step_launches(adam.Adam, 10, weight_decay=0) == 7
    assert _step_launches(adam.Adam.per_tensor, 10) == 10 * 8  # fairseq's loop: 8 per tensor


def test_state_dicts_load_across_the_two(monkeypatch):
    """The same state keys (``step`` an int, the moments): a checkpoint of either resumes with the other;
    a state loaded into fp16 parameters (torch casts it to their dtype) is used in fp32 again."""
    from fairseq.optim import adam

    params = [torch.nn.Parameter(torch.randn(4)) for _ in range(2)]
    old = adam.Adam.per_tensor(params, lr=1e-2)
    for p in params:
        p.grad = torch.ones_like(p)
    old.step()
    half = [torch.nn.Parameter(p.detach().half()) for p in params]
    new = adam.Adam(half, lr=1e-2)
    new.load_state_dict(old.state_dict())
    for p in half:
        p.grad = torch.ones_like(p)
    new.step()
    state = new.state[half[0]]
    assert state["step"] == 2 and state["exp_avg"].dtype == torch.float32
    assert set(new.state_dict()["state"][0]) == set(old.state_dict()["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
