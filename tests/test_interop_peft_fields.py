"""Every field of PEFT's ``LoraConfig`` on import (fairseq_idpg/interop/peft_config.py, docs/using.md "Which
LoraConfig fields import"): mapped onto our LoRA and then computing PEFT's logits, or refused in one line naming
the field, nothing written; which modules a config selects resolved as PEFT resolves it; the base model checked;
sizes and ranks that do not fit said as such.

Tolerances (TINY_ATOL) and why: tests/interop_support.py.
"""

import dataclasses
import importlib.util
import json
import re
import shutil

import pytest
import torch
from conftest import REPO, tiny_sst2
from interop_support import TINY_ATOL, export, hub, logits_both, refused_in_one_line, trained_checkpoint

peft = pytest.importorskip("peft", reason="the [interop] extra (pip install -e .[interop]) is not installed")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


def import_peft(adapter, out, backbone, data, *extra):
    spec = importlib.util.spec_from_file_location("import_peft", REPO / "scripts" / "import_peft.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main([str(adapter), str(out), "--backbone", str(backbone), "--data", str(data), *extra])


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny):
    """(data, checkpoint, ADAPTER): a LoRA checkpoint on ``tiny`` and its PEFT export."""
    root = tmp_path_factory.mktemp("peft_fields")
    data, _ = tiny_sst2(root, tiny)
    checkpoint = trained_checkpoint(root, "lora", tiny.model_file, data)
    assert export(checkpoint, root / "adapter") == 0
    return data, checkpoint, root / "adapter"


def edited(adapter, folder, **changes):
    """A copy of ``adapter`` whose adapter_config.json has ``changes`` (None: the field removed)."""
    shutil.copytree(adapter, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


# ---------------------------------------------------------------------------------------------- the field table
def test_every_lora_config_field_is_mapped_harmless_or_refused_and_documented():
    from fairseq_idpg.interop.peft_config import HARMLESS, INIT_FIELD, MAPPED, REFUSED

    fields = {f.name for f in dataclasses.fields(peft.LoraConfig)}
    groups = [set(MAPPED), set(HARMLESS), set(REFUSED), {INIT_FIELD}]
    assert sum(map(len, groups)) == len(set().union(*groups)), "a field in two groups"
    assert fields == set().union(*groups), (fields - set().union(*groups), set().union(*groups) - fields)
    doc = (REPO / "docs" / "using.md").read_text()
    table = doc.split("### Which LoraConfig fields import")[1].split("\n### ")[0]
    rows = set(re.findall(r"^\| `(\w+)`", table, flags=re.M))
    assert rows == fields, (fields - rows, rows - fields)


@pytest.mark.parametrize(
    "settings",
    [
        dict(target_modules=["query", "value"]),
        dict(target_modules=r".*\.(query|value)"),
        dict(target_modules=r"roberta\.encoder\.layer\.\d+\.attention\.self\.(query|key)"),
        dict(target_modules=["self.query", "value"], layers_to_transform=[1]),
        dict(target_modules=["query"], layers_to_transform=0, layers_pattern="layer"),
        dict(target_modules=["query", "value", "dense"], exclude_modules=["dense"]),
        dict(target_modules=["query", "dense"], modules_to_save=["classifier"]),
    ],
)
def test_target_modules_resolve_as_peft_resolves_them(tmp_path, settings):
    """Our resolution of target_modules (a regex: re.fullmatch over the full name; a list: the name or its
    ending, then layers_to_transform) selects the modules peft's own check_target_module_exists selects."""
    from peft.tuners.tuners_utils import check_target_module_exists

    from fairseq_idpg.interop.hf_backbone import HFBackbone, module_names
    from fairseq_idpg.interop.peft_config import targeted

    config = peft.LoraConfig(task_type="SEQ_CLS", **settings)
    config.save_pretrained(str(tmp_path))
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    names = module_names(HFBackbone("roberta", None, None, 1e-5), 2)
    found = {n: check_target_module_exists(config, n) for n in names}
    theirs = [n for n, match in found.items() if match is True or isinstance(match, re.Match)]
    ours = [n for n in names if targeted(saved, n, set())]
    assert ours == theirs and ours


# ---------------------------------------------------------------------------------------------- mapped
def peft_adapter(tmp_path, tiny, config, converted=False):
    """(the Hugging Face model with the PEFT LoRA ``config``, its saved folder) on ``tiny``'s RobertaModel,
    every trained tensor moved off its initialisation. ``converted``: saved as PEFT's documented PiSSA recipe
    does, the start saved first (as a plain LoRA's) and the trained adapter then converted against it
    (``path_initial_model_for_weight_conversion``); the unconverted save is then ``adapter-as-trained``."""
    from fairseq_idpg.interop.hf_backbone import hf_backbone_for

    base = tmp_path / "base"
    hf = hf_backbone_for(tiny.model_file, base)._replace(path=str(base))
    torch.manual_seed(0)
    auto = transformers.AutoModelForSequenceClassification.from_pretrained(str(base), num_labels=2)
    model = peft.get_peft_model(auto, config)
    if converted:
        init = model.peft_config["default"].init_lora_weights
        model.peft_config["default"].init_lora_weights = True
        model.save_pretrained(str(tmp_path / "initial"))
        model.peft_config["default"].init_lora_weights = init
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.3)
    if converted:
        model.save_pretrained(str(tmp_path / "adapter-as-trained"))
        model.save_pretrained(
            str(tmp_path / "adapter"), path_initial_model_for_weight_conversion=str(tmp_path / "initial")
        )
    else:
        model.save_pretrained(str(tmp_path / "adapter"))
    return hf, model.eval(), tmp_path / "adapter"


MAPPED_CASES = {
    "regex target_modules": dict(target_modules=r".*\.(query|value)"),
    "use_rslora": dict(target_modules=["query", "value"], r=4, lora_alpha=8, use_rslora=True),
    "uniform rank_pattern": dict(target_modules=["query", "value"], r=8, rank_pattern={"query": 4, "value": 4}),
    "query only, head saved": dict(target_modules=["query"], modules_to_save=["classifier"]),
    "init gaussian": dict(target_modules=["query", "value"], init_lora_weights="gaussian"),
    # DoRA (the dora record): the magnitude imports as --lora-dora's m; PiSSA (the pissa record): PEFT's base is the
    # residual of its own SVD, ours recomputes it (--lora-init pissa); and both at once, with rsLoRA's scaling
    "use_dora": dict(target_modules=["query", "value"], r=4, lora_alpha=8, use_dora=True),
    "pissa": dict(target_modules=["query", "value"], r=4, lora_alpha=8, init_lora_weights="pissa"),
    "dora from pissa, rslora": dict(
        target_modules=["query"], r=4, lora_alpha=8, use_dora=True, init_lora_weights="pissa", use_rslora=True
    ),
}


@pytest.mark.parametrize("case", list(MAPPED_CASES))
def test_a_mapped_lora_config_imports_to_peft_logits(tmp_path, tiny, glue_texts, case):
    """Adapters that peft itself built with these settings import to PEFT's logits within float rounding."""
    data, _ = tiny_sst2(tmp_path, tiny)
    config = peft.LoraConfig(task_type="SEQ_CLS", **MAPPED_CASES[case])
    hf, theirs, adapter = peft_adapter(tmp_path, tiny, config)
    assert import_peft(adapter, tmp_path / "back.pt", tiny.model_file, data) == 0
    mine, other = logits_both(hub(tmp_path / "back.pt", data, tiny.folder / "vocab.txt"), theirs, hf, glue_texts)
    gap = (mine - other).abs().max().item()
    print(f"{case}: max |ours - PEFT| = {gap:.2e}")
    assert gap <= TINY_ATOL, f"max |ours - PEFT| = {gap:.2e}"


def test_a_pissa_adapter_converted_by_peft_imports_as_lora_where_it_carries_the_head(
    tmp_path, tiny, glue_texts, capsys
):
    """PEFT's conversion of a trained PiSSA adapter (save_pretrained with path_initial_model_for_weight_conversion)
    is a plain LoRA of the original base, rank 2r and alpha 2 alpha (A' = [A; A_0], B' = [B, -B_0]), without the
    classification head (PEFT converts the LoRA tensors alone): refused naming the missing head. With the head of
    the same run copied in, it imports as the lora record and computes the PiSSA model's logits."""
    from safetensors.torch import load_file, save_file

    data, _ = tiny_sst2(tmp_path, tiny)
    settings = dict(
        task_type="SEQ_CLS", target_modules=["query", "value"], r=4, lora_alpha=8, init_lora_weights="pissa"
    )
    hf, theirs, adapter = peft_adapter(tmp_path, tiny, peft.LoraConfig(**settings), converted=True)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["init_lora_weights"]) == (8, 16, True)
    out = tmp_path / "back.pt"
    why = "lacks base_model.model.classifier"
    refused_in_one_line(capsys, "import_peft.py", lambda: import_peft(adapter, out, tiny.model_file, data), out, why)
    tensors = load_file(adapter / "adapter_model.safetensors")
    trained = load_file(tmp_path / "adapter-as-trained" / "adapter_model.safetensors")
    save_file(
        {**tensors, **{k: v for k, v in trained.items() if ".classifier." in k}}, adapter / "adapter_model.safetensors"
    )
    assert import_peft(adapter, out, tiny.model_file, data) == 0
    assert torch.load(out, weights_only=False)["cfg"]["model"].blocks_preset == "lora"
    mine, other = logits_both(hub(out, data, tiny.folder / "vocab.txt"), theirs, hf, glue_texts)
    gap = (mine - other).abs().max().item()
    print(f"PiSSA converted by PEFT: max |ours - PEFT| = {gap:.2e}")
    assert gap <= TINY_ATOL, f"max |ours - PEFT| = {gap:.2e}"


def test_fan_in_fan_out_is_harmless_on_roberta(tmp_path, tiny, glue_texts):
    """fan_in_fan_out True in the file: PEFT resets it for an nn.Linear (RoBERTa's query / value) when it loads
    the adapter, so the logits are the same, and ours are PEFT's."""
    data, _ = tiny_sst2(tmp_path, tiny)
    hf, built, adapter = peft_adapter(tmp_path, tiny, peft.LoraConfig(task_type="SEQ_CLS"))
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "fan_in_fan_out": True}))
    auto = transformers.AutoModelForSequenceClassification.from_pretrained(hf.path, num_labels=2)
    theirs = peft.PeftModel.from_pretrained(auto, str(adapter)).eval()
    assert import_peft(adapter, tmp_path / "back.pt", tiny.model_file, data) == 0
    mine, other = logits_both(hub(tmp_path / "back.pt", data, tiny.folder / "vocab.txt"), theirs, hf, glue_texts)
    _, before = logits_both(hub(tmp_path / "back.pt", data, tiny.folder / "vocab.txt"), built, hf, glue_texts)
    assert (mine - other).abs().max() <= TINY_ATOL and torch.allclose(other, before, atol=TINY_ATOL)


# ---------------------------------------------------------------------------------------------- refused
REFUSED_CASES = {
    "lora_bias": (dict(lora_bias=True), "lora_bias True (a bias on lora_B; ours has none)"),
    "use_dora without its magnitude": (dict(use_dora=True), "lacks base_model.model.roberta.encoder.layer.0"),
    "bias": (dict(bias="all"), "bias 'all' (trained biases of the base model)"),
    "pissa_niter": (
        dict(init_lora_weights="pissa_niter_4"),
        "init_lora_weights 'pissa_niter_4' (its base weights are not the original ones: a randomised SVD's residual",
    ),
    "loftq": (dict(init_lora_weights="loftq"), "init_lora_weights 'loftq'"),
    "trainable tokens": (dict(trainable_token_indices=[5, 6]), "trainable_token_indices [5, 6]"),
    "unknown field": (dict(lora_future_option=3), "lora_future_option 3 (a field this importer does not know)"),
    "modules_to_save": (
        dict(modules_to_save=["LayerNorm", "classifier"]),
        "modules_to_save ['LayerNorm', 'classifier'] selects roberta.embeddings.LayerNorm, "
        "roberta.encoder.layer.0.attention.output.LayerNorm, roberta.encoder.layer.0.output.LayerNorm (and 2 more): "
        "ours trains the classification head only (classifier)",
    ),
    "regex with key": (dict(target_modules=r".*\.(query|key)"), "selects roberta.encoder.layer.0.attention.self.key"),
    "all-linear": (dict(target_modules="all-linear"), "target_modules 'all-linear' selects"),
    "layers_to_transform": (
        dict(layers_to_transform=[0]),
        "with layers_to_transform [0] puts LoRA on query in 1 of 2 layers: ours has it in every layer",
    ),
    "exclude_modules": (
        dict(exclude_modules=["layer.1.attention.self.value"]),
        "less exclude_modules ['layer.1.attention.self.value'] puts LoRA on value in 1 of 2 layers",
    ),
    "rank_pattern": (dict(rank_pattern={"layer.1.attention.self.value": 4}), "different ranks or alphas"),
    "alpha_pattern": (dict(alpha_pattern={"value": 16}), "different ranks or alphas"),
    "another PEFT type": (dict(peft_type="IA3"), "a PEFT IA3 adapter; only LORA and VERA have our form here"),
}


@pytest.mark.parametrize("case", list(REFUSED_CASES))
def test_what_our_lora_cannot_hold_is_refused_naming_the_field(exported, tiny, tmp_path, capsys, case):
    data, _, adapter = exported
    changes, why = REFUSED_CASES[case]
    folder, out = edited(adapter, tmp_path / "adapter", **changes), tmp_path / "x.pt"
    assert "modules_to_save" in json.loads((adapter / "adapter_config.json").read_text())
    refused_in_one_line(capsys, "import_peft.py", lambda: import_peft(folder, out, tiny.model_file, data), out, why)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]


def test_lora_bias_tensors_are_refused_by_field_and_by_tensor(tmp_path, tiny, capsys):
    """An adapter peft built with lora_bias=True holds the lora_B biases; refused naming the field, and with the
    field removed from its config, naming the tensors ours has no place for."""
    data, _ = tiny_sst2(tmp_path, tiny)
    _, _, adapter = peft_adapter(tmp_path, tiny, peft.LoraConfig(task_type="SEQ_CLS", lora_bias=True))
    from safetensors.torch import load_file

    assert any(k.endswith("lora_B.bias") for k in load_file(adapter / "adapter_model.safetensors"))
    out = tmp_path / "x.pt"
    run = lambda: import_peft(adapter, out, tiny.model_file, data)  # noqa: E731
    refused_in_one_line(capsys, "import_peft.py", run, out, "lora_bias True")
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "lora_bias": False}))
    why = "adapter_model.safetensors holds tensors ours has no place for: base_model.model.roberta.encoder.layer.0."
    refused_in_one_line(capsys, "import_peft.py", run, out, why)


# ---------------------------------------------------------------------------------------------- base model, sizes
def refused(capsys, main, out, *reasons):
    """``main()`` exits 2 with one line on stderr holding every one of ``reasons``; ``out`` not written."""
    capsys.readouterr()
    assert main() == 2
    err = capsys.readouterr().err
    assert err.startswith("import_peft.py: error: ") and err.count("\n") == 1, err
    assert all(reason in err for reason in reasons), err
    assert not out.exists()


def test_the_base_model_is_named_portably_and_checked(exported, tiny, tiny_backbones, tmp_path, capsys):
    """The export names its base by the backbone's name (no local path) and records its weights' digest; an
    adapter of another backbone of the same shape is refused naming both, by digest, then by name; a local
    folder of other weights by its weights; --ignore-base-model imports it anyway."""
    data, _, adapter = exported
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == tiny.folder.name
    assert json.loads((adapter / "fairseq_backbone.json").read_text())["name"] == tiny.folder.name
    other = tiny_backbones(seed=1)
    out = tmp_path / "x.pt"
    run = lambda folder, *extra: lambda: import_peft(folder, out, other.model_file, data, *extra)  # noqa: E731
    theirs = f"--backbone {other.model_file} is '{other.folder.name}'"
    why = f"exported from the backbone '{tiny.folder.name}' (its fairseq_backbone.json: weights sha256 "
    refused(capsys, run(adapter), out, why, theirs, "--ignore-base-model")
    bare = tmp_path / "bare"
    shutil.copytree(adapter, bare)
    (bare / "fairseq_backbone.json").unlink()
    refused(capsys, run(bare), out, f"was trained on '{tiny.folder.name}' (base_model_name_or_path)", theirs)
    from fairseq_idpg.interop.hf_backbone import hf_backbone_for

    local = edited(bare, tmp_path / "local", base_model_name_or_path=str(tmp_path / "hf"))
    hf_backbone_for(tiny.model_file, tmp_path / "hf")
    refused(capsys, run(local), out, f"was trained on '{tmp_path / 'hf'}'", theirs)
    assert import_peft(local, out, tiny.model_file, data) == 0  # a folder of the same weights: accepted
    out.unlink()
    assert run(bare, "--ignore-base-model")() == 0 and out.exists()


def test_the_standin_is_named_by_its_hugging_face_name(standin_model):
    from fairseq_idpg.interop.base_model import STANDIN_NAME, backbone_name
    from fairseq_idpg.interop.hf_backbone import hf_backbone_for

    assert backbone_name(standin_model / "model.pt", hf_backbone_for(standin_model / "model.pt")) == STANDIN_NAME


def test_another_size_and_an_edited_rank_are_said_as_such(exported, tiny, tiny_backbones, tmp_path, capsys):
    data, _, adapter = exported
    bigger, out = tiny_backbones(layers=4), tmp_path / "x.pt"
    why = (
        f"{adapter}: made for a roberta model with 2 layers and hidden size 32; --backbone is a roberta model with "
        f"4 layers and hidden size 32: the sizes differ"
    )
    refused_in_one_line(capsys, "import_peft.py", lambda: import_peft(adapter, out, bigger.model_file, data), out, why)
    folder = edited(adapter, tmp_path / "adapter", r=8)
    why = (
        "base_model.model.roberta.encoder.layer.0.attention.self.query.lora_A.weight has rank 16, its "
        "adapter_config.json r 8: the config and the weights disagree"
    )
    refused_in_one_line(capsys, "import_peft.py", lambda: import_peft(folder, out, tiny.model_file, data), out, why)


def test_a_regex_adapter_of_the_standins_bert_imports_to_peft_logits(tmp_path, standin_model, glue_texts):
    """On the stand-in's original BERT (module names bert.encoder.layer.N...; the pooler not trained, so BERT's
    own is kept), an adapter peft built with a regex target_modules and rsLoRA imports to PEFT's logits within the
    LayerNorm-epsilon tolerance."""
    from interop_support import STANDIN_ATOL, tiny_backbone_of

    from fairseq_idpg.interop.hf_backbone import hf_backbone_for

    data, _ = tiny_sst2(tmp_path, tiny_backbone_of(standin_model))
    hf = hf_backbone_for(standin_model / "model.pt")
    torch.manual_seed(0)
    auto = transformers.AutoModelForSequenceClassification.from_pretrained(hf.path, num_labels=2)
    config = peft.LoraConfig(task_type="SEQ_CLS", r=4, target_modules=r"bert\..*\.(query|value)", use_rslora=True)
    theirs = peft.get_peft_model(auto, config)
    with torch.no_grad():
        for p in theirs.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    theirs.save_pretrained(str(tmp_path / "adapter"))
    assert import_peft(tmp_path / "adapter", tmp_path / "back.pt", standin_model / "model.pt", data) == 0
    ours = hub(tmp_path / "back.pt", data, standin_model / "vocab.txt")
    mine, other = logits_both(ours, theirs.eval(), hf, glue_texts)
    gap = (mine - other).abs().max().item()
    print(f"stand-in, regex targets and rsLoRA: max |ours - PEFT| = {gap:.2e}, logits up to {mine.abs().max():.2f}")
    assert gap <= STANDIN_ATOL and torch.equal(mine.argmax(-1), other.argmax(-1)), gap


def test_a_head_of_another_number_of_classes_is_said_as_such(exported, tiny, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    data, _, adapter = exported
    folder, out = edited(adapter, tmp_path / "adapter"), tmp_path / "x.pt"
    tensors = load_file(folder / "adapter_model.safetensors")
    for kind, shape in (("weight", (3, 32)), ("bias", (3,))):
        tensors[f"base_model.model.classifier.out_proj.{kind}"] = torch.zeros(shape)
    save_file(tensors, folder / "adapter_model.safetensors")
    why = "out_proj.weight has shape (3, 32), this model (2, 32) (another number of classes than --data's)"
    refused_in_one_line(capsys, "import_peft.py", lambda: import_peft(folder, out, tiny.model_file, data), out, why)
