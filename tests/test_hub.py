"""Using what was trained (docs/using.md): a method of each family (roberta_prompt, roberta_idpg,
roberta_blocks) trained by fairseq-train on the offline stand-in, its backbone then moved; loaded
with fairseq's hub interface given the backbone's new location, it predicts from raw sentences
what the model itself computes, and fairseq-validate takes the new location as a model override.
A missing or wrong backbone fails with one line saying how to give the right one.

Slow (all but the first test): fairseq-train's own ``main`` runs in this process (4 updates per
method, on 64 SST-2 examples), so that the three trainings share one interpreter start.
"""

import shutil
import subprocess

import pytest
import torch
from checkpoint_support import HEAD, REPO, STANDIN, fairseq_train, hub, hub_dev_accuracy, load_trained

from fairseq_idpg.methods import METHODS as RECORDS
from fairseq_idpg.methods import get_method
from fairseq_idpg.models.frozen_roberta import RELOCATE, export_checkpoint

ONE_PER_FAMILY = {"roberta_prompt": "prompt-tuning-5", "roberta_idpg": "m-idpg-phm", "roberta_blocks": "lora"}
METHODS = tuple(ONE_PER_FAMILY.values())
SENTENCES = ["a gripping , funny and moving film .", "the plot is thin and the jokes fall flat .", "it 's fine ."]
DIMS = ["--encoder-layers", "6", "--encoder-embed-dim", "384", "--encoder-ffn-embed-dim", "1536"]
DIMS += ["--encoder-attention-heads", "12", "--max-positions", "512"]
pytestmark = pytest.mark.xdist_group("hub-trained")  # one worker: the module's `trained` runs once


def test_one_method_of_every_frozen_backbone_family_is_trained_here():
    assert set(ONE_PER_FAMILY) == {m.arch for m in RECORDS.values() if m.frozen_backbone}
    assert all(get_method(name).arch == arch for arch, name in ONE_PER_FAMILY.items())


def prepare_script():
    """scripts/prepare_data.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("prepare_data", REPO / "scripts" / "prepare_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shared_data, standin_model):
    """{method: save folder} trained on a backbone at old/model.pt, then moved to new/model.pt."""
    work = tmp_path_factory.mktemp("hub")
    (work / "old").mkdir()
    shutil.copy(STANDIN / "model.pt", work / "old" / "model.pt")
    raw = work / "raw" / "SST-2"
    raw.mkdir(parents=True)
    for name, rows in (("train.tsv", 64), ("dev.tsv", 40)):
        lines = (shared_data / "glue" / "SST-2" / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (raw / name).write_text("".join(lines[: rows + 1]), encoding="utf-8")
    data = work / "data-bin" / "SST-2"
    # scripts/prepare_data.py's main in this process: an interpreter start fewer (its process: test_faults_prepare)
    prepare = ["SST-2", "--raw", str(raw), "--out", str(data), "--bpe", "wordpiece"]
    assert prepare_script().main([*prepare, "--vocab", str(STANDIN / "vocab.txt")]) == 0
    saves = {}
    for name in METHODS:
        saves[name] = work / "checkpoints" / name
        # what scripts/run.sh composes from the method record (fairseq_idpg/run.py), at a smoke budget
        fairseq_train(
            [str(data), "--user-dir", str(REPO / "fairseq_idpg"), *get_method(name).train_args(), *DIMS]
            + ["--backbone", str(work / "old" / "model.pt"), "--criterion", "sentence_prediction_metrics"]
            + ["--num-classes", "2", "--init-token", "0", "--separator-token", "2", "--optimizer", "adam"]
            + ["--lr", "5e-3", "--batch-size", "16", "--max-update", "4", "--save-dir", str(saves[name])]
            + ["--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric", "--no-epoch-checkpoints"]
            + ["--validate-interval-updates", "4", "--cpu", "--num-workers", "0", "--seed", "1"]
            + (["--idpg-cache", "memory"] if name == "m-idpg-phm" else [])
        )
    (work / "old").rename(work / "new")  # the backbone moves (another machine, a new checkout)
    return work, data, raw, saves


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS)
def test_hub_with_the_moved_backbone_predicts_the_models_own_logits(trained, name):
    from fairseq.data.data_utils import collate_tokens

    from fairseq_idpg.data.task_info import TaskInfo
    from fairseq_idpg.models.build import STANDIN as SIZES
    from fairseq_idpg.models.build import build_method

    work, data, _, saves = trained
    backbone = str(work / "new" / "model.pt")
    roberta = hub(saves[name], data=data, backbone=backbone)
    assert roberta.model.args.backbone == backbone
    tokens = collate_tokens([roberta.encode(s) for s in SENTENCES], pad_idx=1)
    with torch.no_grad():
        predicted = roberta.predict(HEAD, tokens, return_logits=True)
        # the model built directly from its method record on the moved backbone, the checkpoint loaded
        state = torch.load(saves[name] / "checkpoint_best.pt", map_location="cpu", weights_only=False)
        options = {**SIZES, **({"idpg_cache": "off"} if name == "m-idpg-phm" else {})}
        model = build_method(
            get_method(name), roberta.task.source_dictionary, info=TaskInfo.read(data), backbone=backbone, **options
        )
        model.register_classification_head(HEAD, num_classes=2)
        model.load_state_dict(state["model"])
        expected = model.eval()(tokens, classification_head_name=HEAD)[0]
    assert predicted.shape == (3, 2) and torch.allclose(predicted, expected, atol=1e-5)
    # one sentence at a time (no padding) gives the same
    alone = roberta.predict(HEAD, roberta.encode(SENTENCES[1]), return_logits=True)
    assert torch.allclose(alone, expected[1:2], atol=1e-5)


@pytest.mark.slow
def test_fairseq_validate_takes_the_new_location_and_agrees_with_the_hub(trained):
    work, data, raw, saves = trained
    backbone = work / "new" / "model.pt"
    validate = ["fairseq-validate", str(data), "--user-dir", str(REPO / "fairseq_idpg"), "--cpu"]
    validate += ["--path", str(saves["lora"] / "checkpoint_best.pt"), "--batch-size", "16", "--num-workers", "0"]
    out = subprocess.run(
        validate + ["--model-overrides", str({"backbone": str(backbone)})], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    accuracy = float(out.stdout.split("valid on 'valid' subset")[1].split("| accuracy ")[1].split()[0])
    assert hub_dev_accuracy(saves["lora"], "SST-2", raw, backbone=str(backbone)) == pytest.approx(accuracy, abs=0.05)

    # without the override: one line naming the recorded path and how to give the new one
    out = subprocess.run(validate, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last == f"fairseq-validate: error: --backbone {work / 'old' / 'model.pt'}: no such file; {RELOCATE}"
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_missing_or_wrong_backbone_fails_with_one_line(trained, tmp_path):
    work, data, _, saves = trained
    with pytest.raises(FileNotFoundError, match="--backbone .*old/model.pt: no such file; a trained checkpoint"):
        hub(saves["lora"], data=data)  # the recorded location, gone
    notes = tmp_path / "notes.txt"
    notes.write_text("not a checkpoint\n")
    with pytest.raises(ValueError, match=f"--backbone {notes}: not a fairseq checkpoint"):
        hub(saves["lora"], data=data, backbone=str(notes))
    # a backbone of the same shapes with other weights: the fingerprint refuses it
    other = torch.load(work / "new" / "model.pt", map_location="cpu", weights_only=False)
    other["model"]["encoder.sentence_encoder.layers.0.fc1.weight"].mul_(1.5)
    torch.save(other, tmp_path / "model.pt")
    with pytest.raises(RuntimeError, match="trained on another backbone") as raised:
        hub(saves["lora"], data=data, backbone=str(tmp_path / "model.pt"))
    assert str(raised.value).endswith(RELOCATE) and str(tmp_path / "model.pt") in str(raised.value)


@pytest.mark.slow
def test_load_trained_reads_the_override_too(trained):
    work, _, _, saves = trained
    model, cfg, _ = load_trained(saves["m-idpg-phm"] / "checkpoint_last.pt", backbone=str(work / "new" / "model.pt"))
    assert cfg.model.backbone == str(work / "new" / "model.pt") and model.num_trainable_parameters() > 0


@pytest.mark.slow
def test_shared_folder_of_an_exported_checkpoint_and_three_data_files(trained, tmp_path):
    """docs/using.md's sharing: model.pt (exported), input0/dict.txt, label/dict.txt, task.json."""
    work, data, _, saves = trained
    shared = tmp_path / "shared"
    for name in ("input0/dict.txt", "label/dict.txt", "task.json"):
        (shared / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(data / name, shared / name)
    export_checkpoint(saves["lora"] / "checkpoint_best.pt", shared / "model.pt")
    backbone = str(work / "new" / "model.pt")
    received = hub(shared, "model.pt", data=".", backbone=backbone)
    original = hub(saves["lora"], data=data, backbone=backbone)
    tokens = original.encode(SENTENCES[0])
    assert torch.equal(received.predict(HEAD, tokens), original.predict(HEAD, tokens))
