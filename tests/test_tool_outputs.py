"""The tools that write checkpoints and adapter folders (scripts/merge_lora.py, import_peft.py,
export_checkpoint.py, export_peft.py, export_dpt_prompt.py; fairseq_idpg/files.py) never write over a
file they read, nor over an existing file or into another run's folder without --overwrite; damaged inputs end
in one line. Each case: exit status 2, the exact line on stderr, the inputs' bytes unchanged, no temporary
file left."""

import hashlib
import importlib.util
import json
import shutil

import pytest
import torch
from conftest import REPO, tiny_sst2
from interop_support import trained_checkpoint

READS = "is a file this command reads; it never writes over its input, even with --overwrite: give another output file"
EXISTS = "exists; give --overwrite to replace it, or another output file"
TRAINED = "a checkpoint written by fairseq-train (a run's checkpoint_best.pt)"


def script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(*folders):
    """Temporary files or folders (``.NAME.*.tmp`` / ``.old``) left in ``folders``."""
    return [p for folder in folders for p in folder.rglob(".*") if p.suffix in (".tmp", ".old")]


def refused(capsys, name, argv, line, *inputs):
    """``name``'s main(argv) exits 2 with ``NAME.py: error: LINE`` alone on stderr; ``inputs`` keep their bytes."""
    before = [sha(p) for p in inputs]
    capsys.readouterr()
    assert script(name)(list(map(str, argv))) == 2
    err = capsys.readouterr().err
    assert err == f"{name}.py: error: {line}\n", err
    assert [sha(p) for p in inputs] == before
    assert not leftovers(*{p.parent for p in inputs})


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny):
    """(data, RUN, OTHER, ADAPTER, PROMPT): two LoRA run folders (checkpoint_best.pt, config.json, results.json),
    a PEFT folder exported from RUN, and a prompt-tuning checkpoint."""
    root = tmp_path_factory.mktemp("tool_outputs")
    data, _ = tiny_sst2(root, tiny)
    folders = []
    for name in ("run", "other"):
        folder = root / name
        folder.mkdir()
        shutil.move(trained_checkpoint(root, "lora", tiny.model_file, data), folder / "checkpoint_best.pt")
        for file in ("config.json", "results.json"):
            (folder / file).write_text(json.dumps({"run": name}))
        folders.append(folder)
    assert script("export_peft")([str(folders[0]), str(root / "adapter")]) == 0
    prompt = trained_checkpoint(root, "prompt-tuning-5", tiny.model_file, data)
    return data, *folders, root / "adapter", prompt


def truncated(source, target):
    target.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    return target


# ---------------------------------------------------------------------------------------------- merge_lora.py
def test_merge_lora_never_writes_over_the_run_it_merges(runs, capsys):
    _, run, _, _, _ = runs
    best = run / "checkpoint_best.pt"
    for extra in ([], ["--overwrite"]):
        refused(capsys, "merge_lora", [run, best, *extra], f"{best}: {READS}", best)


def test_merge_lora_keeps_off_another_runs_files_without_overwrite(runs, capsys, tmp_path):
    _, run, other, _, _ = runs
    best, theirs = run / "checkpoint_best.pt", other / "checkpoint_best.pt"
    refused(capsys, "merge_lora", [run, theirs], f"{theirs}: {EXISTS}", best, theirs)
    new = other / "merged.pt"
    line = f"{new}: {other} is another run's folder; write outside it, or give --overwrite to write there"
    refused(capsys, "merge_lora", [run, new], line, best, theirs)
    assert not new.exists()
    copy = tmp_path / "other"
    shutil.copytree(other, copy)
    assert script("merge_lora")([str(run), str(copy / "merged.pt"), "--overwrite"]) == 0
    assert script("merge_lora")([str(run), str(copy / "checkpoint_best.pt"), "--overwrite"]) == 0
    assert torch.load(copy / "checkpoint_best.pt", weights_only=False)["cfg"]["model"].arch == "roberta"
    assert not leftovers(copy)


def test_merge_lora_into_its_own_run_folder_and_a_damaged_checkpoint(runs, capsys, tmp_path):
    _, run, _, _, _ = runs
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    assert script("merge_lora")([str(copy), str(copy / "merged.pt")]) == 0  # its own folder: a new file
    refused(capsys, "merge_lora", [copy, copy / "merged.pt"], f"{copy / 'merged.pt'}: {EXISTS}", copy / "merged.pt")
    broken = truncated(run / "checkpoint_best.pt", tmp_path / "broken.pt")
    line = f"{broken}: cannot be read (truncated or damaged); give {TRAINED}, or copy it again"
    refused(capsys, "merge_lora", [broken, tmp_path / "merged.pt"], line, broken)
    assert not (tmp_path / "merged.pt").exists()


# ---------------------------------------------------------------------------------------------- import_peft.py
def test_import_peft_keeps_off_another_runs_checkpoint_and_its_own_files(runs, capsys, tiny, tmp_path):
    data, _, other, adapter, _ = runs
    flags = ["--backbone", tiny.model_file, "--data", data]
    theirs = other / "checkpoint_best.pt"
    refused(capsys, "import_peft", [adapter, theirs, *flags], f"{theirs}: {EXISTS}", theirs)
    weights = adapter / "adapter_model.safetensors"
    line = f"{weights}: {READS}"
    refused(capsys, "import_peft", [adapter, weights, *flags, "--overwrite"], line, weights)
    backbone = tiny.model_file
    refused(capsys, "import_peft", [adapter, backbone, *flags, "--overwrite"], f"{backbone}: {READS}", backbone)
    folder = tmp_path / "out"
    folder.mkdir()
    line = f"{folder}: is a folder; give the file to write, e.g. {folder / 'model.pt'}"
    refused(capsys, "import_peft", [adapter, folder, *flags], line, weights)
    out = tmp_path / "imported.pt"
    out.write_text("old")
    refused(capsys, "import_peft", [adapter, out, *flags], f"{out}: {EXISTS}", out)
    assert script("import_peft")([str(adapter), str(out), *map(str, flags), "--overwrite"]) == 0
    assert "imported_from" in torch.load(out, weights_only=False) and not leftovers(tmp_path)


@pytest.mark.parametrize("file", ["adapter_config.json", "adapter_model.safetensors"])
def test_import_peft_of_a_damaged_adapter_is_one_line(runs, capsys, tiny, tmp_path, file):
    data, _, _, adapter, _ = runs
    damaged = tmp_path / "adapter"
    shutil.copytree(adapter, damaged)
    truncated(adapter / file, damaged / file)
    out = tmp_path / "imported.pt"
    why = "not valid JSON" if file.endswith(".json") else "cannot be read"
    line = f"{damaged / file}: {why} (truncated or damaged); copy the adapter folder again"
    refused(capsys, "import_peft", [damaged, out, "--backbone", tiny.model_file, "--data", data], line, damaged / file)
    assert not out.exists()


# ---------------------------------------------------------------------------------------------- export_checkpoint.py
def test_export_checkpoint_never_writes_over_its_input(runs, capsys, tmp_path):
    _, run, _, _, _ = runs
    best = run / "checkpoint_best.pt"
    for extra in ([], ["--overwrite"]):
        refused(capsys, "export_checkpoint", [best, best, *extra], f"{best}: {READS}", best)
    out = tmp_path / "model.pt"
    out.write_text("old")
    refused(capsys, "export_checkpoint", [best, out], f"{out}: {EXISTS}", best, out)
    assert script("export_checkpoint")([str(best), str(out), "--overwrite"]) == 0
    assert torch.load(out, weights_only=False)["last_optimizer_state"] is None and not leftovers(tmp_path)


def test_export_checkpoint_of_a_damaged_or_foreign_file_is_one_line(runs, capsys, tmp_path):
    _, run, _, _, _ = runs
    broken = truncated(run / "checkpoint_best.pt", tmp_path / "broken.pt")
    line = f"{broken}: cannot be read (truncated or damaged); give {TRAINED}, or copy it again"
    refused(capsys, "export_checkpoint", [broken, tmp_path / "out.pt"], line, broken)
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    line = f"{text}: cannot be read (truncated or damaged); give {TRAINED}, or copy it again"
    refused(capsys, "export_checkpoint", [text, tmp_path / "out.pt"], line, text)
    tensors = tmp_path / "tensors.pt"
    torch.save({"weight": torch.zeros(2)}, tensors)
    line = f"{tensors}: not a fairseq checkpoint (no model and cfg in it); give {TRAINED}"
    refused(capsys, "export_checkpoint", [tensors, tmp_path / "out.pt"], line, tensors)
    assert not (tmp_path / "out.pt").exists()


# ---------------------------------------------------------------------------------------------- export_peft.py
def test_export_peft_never_writes_into_what_it_reads_and_overwrites_only_when_told(runs, capsys, tmp_path):
    _, run, _, adapter, _ = runs
    best = run / "checkpoint_best.pt"
    line = f"{run}: holds {best}, which this command reads; it never writes there, even with --overwrite: "
    line += "give a new folder"
    refused(capsys, "export_peft", [run, run, "--overwrite"], line, best)
    out = tmp_path / "peft"
    shutil.copytree(adapter, out)
    (out / "adapter_config.json").write_text("{}")
    line = f"{out}: exists and is not an empty folder; give a new folder, or --overwrite to replace it"
    refused(capsys, "export_peft", [run, out], line, best, out / "adapter_config.json")
    assert script("export_peft")([str(run), str(out), "--overwrite"]) == 0
    assert json.loads((out / "adapter_config.json").read_text())["peft_type"] == "LORA"
    assert sha(out / "adapter_model.safetensors") == sha(adapter / "adapter_model.safetensors")
    assert not leftovers(tmp_path)


def test_export_peft_of_a_truncated_checkpoint_is_one_line_and_writes_nothing(runs, capsys, tmp_path):
    _, run, _, _, _ = runs
    broken = truncated(run / "checkpoint_best.pt", tmp_path / "broken.pt")
    line = f"{broken}: cannot be read (truncated or damaged); give {TRAINED}, or copy it again"
    refused(capsys, "export_peft", [broken, tmp_path / "peft"], line, broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.pt"]


# ---------------------------------------------------------------------------------------------- export_dpt_prompt.py
def test_export_dpt_prompt_never_writes_over_its_input(runs, capsys, tmp_path):
    _, _, _, _, prompt = runs
    source = tmp_path / "checkpoint_best.pt"
    shutil.copyfile(prompt, source)
    for extra in ([], ["--overwrite"]):
        refused(capsys, "export_dpt_prompt", [source, "--out", source, *extra], f"{source}: {READS}", source)
    assert script("export_dpt_prompt")([str(source)]) == 0
    exported = tmp_path / "checkpoint_best_exported.pt"
    refused(capsys, "export_dpt_prompt", [source], f"{exported}: {EXISTS}", source, exported)
    assert script("export_dpt_prompt")([str(source), "--overwrite"]) == 0
    broken = truncated(prompt, tmp_path / "broken.pt")
    line = (
        f"{broken}: cannot be read (truncated or damaged); give a roberta_prompt checkpoint written by "
        f"fairseq-train, or copy it again"
    )
    refused(capsys, "export_dpt_prompt", [broken, "--out", tmp_path / "p.pt"], line, broken)
    assert not (tmp_path / "p.pt").exists() and not leftovers(tmp_path)


# ---------------------------------------------------------------------------------------------- damaged and full
def test_a_peft_config_without_a_rank_is_one_line(runs, capsys, tiny, tmp_path):
    data, _, _, adapter, _ = runs
    damaged = tmp_path / "adapter"
    shutil.copytree(adapter, damaged)
    config = damaged / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "r": "eight"}))
    line = f"{config}: not a PEFT LoRA config (a JSON object with a positive integer r); copy the adapter folder again"
    refused(
        capsys, "import_peft", [damaged, tmp_path / "x.pt", "--backbone", tiny.model_file, "--data", data], line, config
    )
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.parametrize("file", ["adapter_config.json", "pytorch_adapter.bin", "head_config.json"])
def test_import_of_a_damaged_adapters_folder_is_one_line(runs, capsys, tiny, tmp_path, file):
    data, _, _, _, _ = runs
    run = trained_checkpoint(tmp_path, "houlsby-adapter", tiny.model_file, data)
    adapter = tmp_path / "adapters"
    assert script("export_peft")([str(run), str(adapter), "--format", "adapters"]) == 0
    truncated(adapter / file, tmp_path / file)
    shutil.move(tmp_path / file, adapter / file)
    why = "not valid JSON" if file.endswith(".json") else "cannot be read"
    line = f"{adapter / file}: {why} (truncated or damaged); copy the adapter folder again"
    out = tmp_path / "x.pt"
    refused(capsys, "import_peft", [adapter, out, "--backbone", tiny.model_file, "--data", data], line, adapter / file)
    assert not out.exists()


def test_a_failed_write_is_one_line_and_leaves_no_temporary_file(runs, capsys, tmp_path, monkeypatch):
    """A full disk mid-write (torch's writer says it as a RuntimeError): one line; the old file stays as it was."""
    _, run, _, _, _ = runs
    out = tmp_path / "merged.pt"
    out.write_text("old")

    def full_disk(obj, f):
        f.write(b"half")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 40704 vs 598")

    monkeypatch.setattr(torch, "save", full_disk)
    line = f"{out}: could not be written (the write failed); free some space or write elsewhere"
    refused(capsys, "merge_lora", [run, out, "--overwrite"], line, out, run / "checkpoint_best.pt")
    assert out.read_text() == "old"
