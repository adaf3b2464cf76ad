"""``--compile-layers``: the frozen encoder's layers run by ``torch.compile`` (models/frozen_roberta.py).

One training step (forward, backward) of a compiled model gives the logits and gradients of the same model
uncompiled, over batches of three shapes (one graph with symbolic shapes: ``dynamic=True``), for prompt tuning
and LoRA (M-IDPG-PHM, DoRA from PiSSA's start and VeRA in the slow tests); the state dict keeps its names;
fairseq-train with the flag (bf16) saves a checkpoint that loads without it; the flag is not a model setting (run
identity: test_run_config.py).
The fast tests compile with the ``aot_eager`` backend (dynamo's capture and AOT autograd, no code generation:
15-30 s on a busy CPU); the slow one with inductor, the default, which generates C++ on the CPU (over a minute).

Tolerance: rtol 1e-5, atol 1e-6 (fp32) for aot_eager, which runs the same operators (seen: logits equal, gradients
within 3e-9); inductor fuses and reorders sums: rtol 1e-4, atol 1e-5.
"""

import copy
import sys
from pathlib import Path

import pytest
import torch
from checkpoint_support import fairseq_train, load_trained
from conftest import build_tiny, tiny_sst2

from fairseq_idpg.models.frozen_roberta import COMPILE_OPTIONS

USER_DIR = Path(__file__).resolve().parents[1] / "fairseq_idpg"
METHODS = {  # arch, options (no dropout anywhere: eager and compiled code draw their masks differently)
    "prompt-tuning-5": ("roberta_prompt", {"prompt_preset": "prompt-tuning-5"}),
    "lora": ("roberta_blocks", {"blocks_preset": "lora", "lora_dropout": 0.0}),
    # LoRA's variant that reads the frozen projection in the layer (DoRA's norms), from PiSSA's start (its buffers)
    "dora-pissa": ("roberta_blocks", {"blocks_preset": "dora", "lora_init": "pissa", "lora_dropout": 0.0}),
    "m-idpg-phm": ("roberta_idpg", {"idpg_preset": "m-idpg-phm", "idpg_cache": "memory", "idpg_dropout": 0.0}),
    # VeRA: every layer's block reads the one shared frozen pair the model owns (a plain reference)
    "vera": ("roberta_blocks", {"blocks_preset": "vera"}),
}
SLOW = {"m-idpg-phm", "dora-pissa", "vera"}  # more compiles: in the slow tests (CI runs them)
SHAPES = [(3, 7), (4, 9), (2, 12)]  # (B, T): each batch padded in its first row


def batch(b, t, seed):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(5, 100, (b, t), generator=g)
    tokens[:, 0], tokens[0, -2:] = 0, 1  # <s>, padding
    return tokens


def step(model, tokens):
    """(logits, {trained tensor: its gradient}) of one training step on ``tokens``."""
    model.zero_grad(set_to_none=True)
    logits, _ = model(tokens, features_only=True, classification_head_name="head")
    (logits.float() * torch.arange(1.0, logits.shape[-1] + 1)).sum().backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def compiled_forward(layer):
    layer = layer.encoder.sentence_encoder.layers[-1] if hasattr(layer, "encoder") else layer
    return hasattr(layer.forward, "_torchdynamo_orig_callable")  # torch.compile's function, over the method


def build_pair(tiny, method, backend):
    arch, options = METHODS[method]
    options = {"dropout": 0.0, "attention_dropout": 0.0, **options}
    torch.manual_seed(0)
    eager = build_tiny(tiny, arch, **options).train()
    compiled = build_tiny(tiny, arch, compile_layers=True, compile_backend=backend, **options).train()
    compiled.load_state_dict(eager.state_dict())  # the same trained tensors (the head's too)
    return eager, compiled


def assert_same_steps(eager, compiled, rtol, atol):
    for seed, (b, t) in enumerate(SHAPES):
        tokens = batch(b, t, seed)
        logits, grads = step(compiled, tokens)
        want, want_grads = step(eager, tokens)
        torch.testing.assert_close(logits, want, rtol=rtol, atol=atol)
        assert grads.keys() == want_grads.keys() and grads
        for name in grads:
            torch.testing.assert_close(grads[name], want_grads[name], rtol=rtol, atol=atol, msg=name)


@pytest.mark.parametrize("method", [pytest.param(m, marks=[pytest.mark.slow] if m in SLOW else []) for m in METHODS])
def test_a_compiled_step_equals_the_eager_one(tiny, method):
    """Logits and gradients equal over three batch shapes; the layers' forward is a compiled function, the
    modules and state-dict names are those of the uncompiled model."""
    torch._dynamo.reset()
    eager, compiled = build_pair(tiny, method, "aot_eager")
    assert all(compiled_forward(layer) for layer in compiled.encoder.sentence_encoder.layers)
    assert not any(compiled_forward(layer) for layer in eager.encoder.sentence_encoder.layers)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    assert not any("_orig_mod" in name for name in compiled.state_dict())
    twin = copy.deepcopy(compiled)  # fairseq's EMA copies the model: the copy's layers run their own tensors
    assert all(t.forward.__self__ is t for t in twin.encoder.sentence_encoder.layers) and compiled_forward(twin)
    assert_same_steps(eager, compiled, rtol=1e-5, atol=1e-6)


def test_compile_options_are_not_model_settings():
    """A run's identity records the model's settings: the compile flags are not among them."""
    from fairseq_idpg.models.roberta_blocks import RobertaBlocksModel

    plain = RobertaBlocksModel.model_settings({"blocks_preset": "lora"})
    flagged = RobertaBlocksModel.model_settings(
        {"blocks_preset": "lora", "compile_layers": True, "compile_backend": "aot_eager"}
    )
    assert flagged == plain and not set(COMPILE_OPTIONS) & set(flagged)


def test_fairseq_train_with_the_flag_saves_a_checkpoint_that_loads_without_it(tmp_path, tiny):
    """fairseq-train --compile-layers (aot_eager, bf16, prompt tuning, 4 updates) trains and saves; the checkpoint
    loads without the flag (the same names) and gives the trained model's logits."""
    torch._dynamo.reset()
    data, dims = tiny_sst2(tmp_path, tiny)
    save = tmp_path / "save"
    # fmt: off
    fairseq_train([
        str(data), "--user-dir", str(USER_DIR),
        "--task", "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", "2",
        "--arch", "roberta_prompt", "--prompt-preset", "prompt-tuning-5", "--save-trainable-only", *dims,
        "--backbone", str(tiny.model_file), "--init-token", "0", "--separator-token", "2",
        "--compile-layers", "--compile-backend", "aot_eager", "--bf16",
        "--optimizer", "adam", "--lr", "1e-2", "--batch-size", "8", "--max-update", "4", "--cpu",
        "--save-dir", str(save), "--no-epoch-checkpoints", "--disable-validation", "--seed", "1",
        "--num-workers", "0", "--log-format", "simple", "--log-interval", "1",
    ])
    # fmt: on
    checkpoint = save / "checkpoint_last.pt"
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == 4 and state["cfg"]["model"].compile_layers
    assert not any("_orig_mod" in name for name in state["model"])
    model, cfg, _ = load_trained(checkpoint, compile_layers=False)
    assert cfg.model.compile_layers is False
    assert not any(compiled_forward(layer) for layer in model.encoder.sentence_encoder.layers)
    head = "sentence_classification_head"
    assert torch.isfinite(model(batch(2, 9, 0), features_only=True, classification_head_name=head)[0]).all()


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="inductor's C++ code generation")
def test_inductor_step_equals_the_eager_one(tiny):
    """The default backend: LoRA's step compiled by inductor, the same logits and gradients (its fused sums:
    rtol 1e-4, atol 1e-5). Its kernels are compiled in this process, one after another (``compile_threads=1``): the
    same C++ and compiler flags, without the pool of worker interpreters inductor would start on 2 cores (each
    imports torch; g++ itself is most of this test's CPU either way)."""
    import torch._inductor.config

    torch._dynamo.reset()
    eager, compiled = build_pair(tiny, "lora", "inductor")
    with torch._inductor.config.patch(compile_threads=1):
        assert_same_steps(eager, compiled, rtol=1e-4, atol=1e-5)
