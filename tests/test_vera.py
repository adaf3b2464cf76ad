"""VeRA (Kopiczko et al. 2024; ``modules/attention/vera.py``, the vera record) against PEFT's ``tuners/vera`` on one
batch: the shared A and B are PEFT's draw bit for bit (from the same seed), a projection's output and the gradients
of d and b are PEFT's layer's; the model starts as the frozen one and keeps one pair of A, B that no checkpoint
holds; the count at roberta-large is the paper's and PEFT's. PEFT adapters import (both ``save_projection``
forms) to PEFT's logits, and what ours cannot hold is refused in one line. The export / import round trip of a
trained vera run: tests/test_interop.py (parametrised over the records that export to PEFT).

Tolerances (TINY_ATOL) and why: tests/interop_support.py.
"""

import copy
import dataclasses
import json
import re

import pytest
import torch
import torch.nn as nn
from blocks_support import logits
from conftest import REPO, build_tiny, tiny_sst2
from interop_support import (
    TINY_ATOL,
    assert_same_as_peft,
    hub,
    logits_both,
    peft_count_at_roberta_large,
    refused_in_one_line,
)

from fairseq_idpg.modules.attention.vera import SharedProjections, VeRA

peft = pytest.importorskip("peft", reason="the [interop] extra (pip install -e .[interop]) is not installed")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

DIM, RANK = 12, 5


def peft_layer(linear, seed=0, dropout=0.0):
    """PEFT's VeRA layer on a copy of ``linear``, as ``get_peft_model`` builds it on a module holding it."""
    holder = nn.Module()
    holder.proj = copy.deepcopy(linear)
    config = peft.VeraConfig(r=RANK, target_modules=["proj"], projection_prng_key=seed, vera_dropout=dropout)
    model = peft.get_peft_model(holder, config)
    return model.base_model, model.base_model.model.proj


@pytest.mark.parametrize("seed", [0, 7, 0xABC])
def test_the_shared_projections_are_peft_s_draw_bit_for_bit(seed):
    """A [r, in] and B [out, r], kaiming-uniform (gain sqrt 2) from a generator seeded with projection_prng_key, A
    first: equal to PEFT's vera_A and vera_B, and another seed draws others."""
    tuner, _ = peft_layer(nn.Linear(DIM, DIM), seed)
    ours = SharedProjections(DIM, DIM, RANK, seed)
    assert torch.equal(ours.A, tuner.vera_A["default"]) and torch.equal(ours.B, tuner.vera_B["default"])
    assert ours.A.abs().max() <= (6 / DIM) ** 0.5 and ours.B.abs().max() <= (6 / RANK) ** 0.5
    assert not torch.equal(SharedProjections(DIM, DIM, RANK, seed + 1).A, ours.A)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_a_projection_computes_peft_s_output_and_gradients(dropout):
    """With d and b moved off their start (the same values on both sides): PEFT's output and the same gradients of
    d and b, in eval and in training (dropout on the input, the same draws)."""
    torch.manual_seed(0)
    linear = nn.Linear(DIM, DIM).requires_grad_(False)
    _, theirs = peft_layer(linear, dropout=dropout)
    ours = VeRA(SharedProjections(DIM, DIM, RANK, 0), DIM, DIM, dropout=dropout)
    assert torch.equal(ours.d, theirs.vera_lambda_d["default"]) and torch.equal(ours.b, theirs.vera_lambda_b["default"])
    assert torch.all(ours.d == 0.1) and torch.all(ours.b == 0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for mine, other in ((ours.d, theirs.vera_lambda_d["default"]), (ours.b, theirs.vera_lambda_b["default"])):
            mine.add_(torch.randn(mine.shape, generator=g))
            other.copy_(mine)
    their_params = (theirs.vera_lambda_d["default"], theirs.vera_lambda_b["default"])
    assert_same_as_peft(linear, ours, theirs, (ours.d, ours.b), their_params, torch.randn(3, 4, DIM))
    assert torch.allclose(ours.delta_weight(), theirs.get_delta_weight("default"), atol=1e-6)


def test_the_model_starts_as_the_frozen_one_with_one_pair_no_checkpoint_holds(tiny):
    """b = 0: the logits of the model without blocks' updates (LoRA's, B = 0); one A and one B for every projection,
    still one pair after a cast; none in the state dict; --vera-seed draws another pair, the same seed the same."""
    model = build_tiny(tiny, "roberta_blocks", blocks_preset="vera").eval()
    plain = build_tiny(tiny, "roberta_blocks", blocks_preset="lora").eval()
    plain.classification_heads.load_state_dict(model.classification_heads.state_dict())
    assert torch.allclose(logits(model), logits(plain), atol=1e-6)
    model.to(torch.bfloat16)
    shared = model.vera_projections
    blocks = [getattr(layer.self_attn, f"vera_{t}") for layer in model.encoder.sentence_encoder.layers for t in "qv"]
    assert len(blocks) == 2 * len(model.encoder.sentence_encoder.layers)
    assert all(b.shared is shared and b.factors(torch.bfloat16)[0].data_ptr() == shared.A.data_ptr() for b in blocks)
    assert shared.A.dtype == torch.bfloat16 and not any("vera_projections" in k for k in model.state_dict())
    again = build_tiny(tiny, "roberta_blocks", blocks_preset="vera", vera_seed=0).vera_projections
    other = build_tiny(tiny, "roberta_blocks", blocks_preset="vera", vera_seed=1).vera_projections
    assert torch.equal(again.A.to(torch.bfloat16), shared.A) and not torch.equal(other.A, again.A)


def test_vera_count_at_roberta_large_is_the_paper_s_and_peft_s():
    """PEFT's trainable count of VeraConfig(r=256) on query and value of roberta-large (no head; built on the meta
    device) is the vera record's, the figure scripts/count_params.py checks ours against and the paper's 0.061M."""
    from fairseq_idpg.counts.blocks import PEFT_VERA_LARGE, count

    trainable = peft_count_at_roberta_large(peft.VeraConfig(r=256, target_modules=["query", "value"]))
    assert trainable == PEFT_VERA_LARGE == count("vera", "roberta-large") == 24 * 2 * (256 + 1024) == 61_440


# ---------------------------------------------------------------------------------------------- import from PEFT
def peft_adapter(tmp_path, tiny, **settings):
    """(hf, the PEFT model with VeraConfig(**settings) on ``tiny``'s RobertaModel, its saved folder): every trained
    tensor moved off its start."""
    from fairseq_idpg.interop.hf_backbone import hf_backbone_for

    base = tmp_path / "base"
    hf = hf_backbone_for(tiny.model_file, base)._replace(path=str(base))
    torch.manual_seed(0)
    auto = transformers.AutoModelForSequenceClassification.from_pretrained(str(base), num_labels=2)
    model = peft.get_peft_model(auto, peft.VeraConfig(task_type="SEQ_CLS", **settings))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(str(tmp_path / "adapter"))
    return hf, model.eval(), tmp_path / "adapter"


def import_peft(adapter, out, backbone, data):
    import importlib.util

    spec = importlib.util.spec_from_file_location("import_peft", REPO / "scripts" / "import_peft.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main([str(adapter), str(out), "--backbone", str(backbone), "--data", str(data)])


@pytest.mark.parametrize(
    "settings",
    [
        dict(r=8, target_modules=["query", "value"]),
        dict(r=8, target_modules=["query"], projection_prng_key=0xABC, save_projection=False, d_initial=0.5),
    ],
    ids=["projections saved", "query only, projections from the seed"],
)
def test_a_peft_vera_adapter_imports_to_peft_s_logits(tmp_path, tiny, glue_texts, settings):
    """A VeRA adapter PEFT built and saved, with A and B in the file or redrawn from projection_prng_key, imports
    as the vera record with its settings and gives PEFT's logits."""
    data, _ = tiny_sst2(tmp_path, tiny)
    hf, theirs, adapter = peft_adapter(tmp_path, tiny, **settings)
    assert import_peft(adapter, tmp_path / "back.pt", tiny.model_file, data) == 0
    cfg = torch.load(tmp_path / "back.pt", weights_only=False)["cfg"]["model"]
    assert (cfg.blocks_preset, cfg.vera_rank, cfg.vera_seed) == ("vera", 8, settings.get("projection_prng_key", 0))
    targets = [t for t, m in (("q", "query"), ("v", "value")) if m in settings["target_modules"]]
    assert cfg.vera_targets == ",".join(targets)
    mine, other = logits_both(hub(tmp_path / "back.pt", data, tiny.folder / "vocab.txt"), theirs, hf, glue_texts)
    gap = (mine - other).abs().max().item()
    print(f"PEFT VeRA {settings}: max |ours - PEFT| = {gap:.2e}")
    assert gap <= TINY_ATOL, f"max |ours - PEFT| = {gap:.2e}"


def test_projections_that_are_not_the_seed_s_draw_and_biases_are_refused(tmp_path, tiny, capsys):
    """Ours redraws A and B from the seed: stored ones of another seed are refused naming the key; so is a trained
    bias (bias="vera_only") and a field this importer does not know. Nothing is written."""
    from safetensors.torch import load_file, save_file

    data, _ = tiny_sst2(tmp_path, tiny)
    _, _, adapter = peft_adapter(tmp_path, tiny, r=8, target_modules=["query", "value"])
    out = tmp_path / "x.pt"
    run = lambda: import_peft(adapter, out, tiny.model_file, data)  # noqa: E731
    config_file = adapter / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "projection_prng_key": 5}))
    why = "base_model.vera_A is not the draw of projection_prng_key 5"
    refused_in_one_line(capsys, "import_peft.py", run, out, why)
    for changes, why in (
        (dict(bias="vera_only"), "bias 'vera_only' (trained biases of the base model)"),
        (dict(vera_future_option=3), "vera_future_option 3 (a field this importer does not know)"),
    ):
        config_file.write_text(json.dumps({**config, **changes}))
        refused_in_one_line(capsys, "import_peft.py", run, out, why)
    config_file.write_text(json.dumps(config))
    tensors = load_file(adapter / "adapter_model.safetensors")
    tensors["base_model.vera_B"] = tensors["base_model.vera_B"] * 2
    save_file(tensors, adapter / "adapter_model.safetensors")
    why = "base_model.vera_B is not the draw of projection_prng_key 0"
    refused_in_one_line(capsys, "import_peft.py", run, out, why)


def test_every_vera_config_field_is_mapped_harmless_or_refused_and_documented():
    from fairseq_idpg.interop.peft_vera import HARMLESS, MAPPED, REFUSED

    fields = {f.name for f in dataclasses.fields(peft.VeraConfig)}
    groups = [set(MAPPED), set(HARMLESS), set(REFUSED)]
    assert sum(map(len, groups)) == len(set().union(*groups)), "a field in two groups"
    assert fields == set().union(*groups), (fields - set().union(*groups), set().union(*groups) - fields)
    doc = (REPO / "docs" / "using.md").read_text()
    table = doc.split("### Which VeraConfig fields import")[1].split("\n### ")[0]
    rows = {name for cell in re.findall(r"^\| ([^|]+) \|", table, flags=re.M) for name in re.findall(r"`(\w+)`", cell)}
    assert rows == fields, (fields - rows, rows - fields)
