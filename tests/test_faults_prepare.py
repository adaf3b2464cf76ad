"""An interrupted data preparation (scripts/prepare_data.py): Ctrl-C ends it in one line, leaves nothing
half-written, and the same command resumes from the parts it finished, to the same files."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fairseq_idpg.preprocessing.parts import Parts, parts_folder
from fairseq_idpg.preprocessing.prepare import CHUNK_LINES

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "prepare_data.py"


def sst2_rows(shared_data, folder: Path, train_rows: int) -> Path:
    folder.mkdir(parents=True)
    with open(shared_data / "glue/SST-2/train.tsv", encoding="utf-8") as f:
        (folder / "train.tsv").write_text("".join(f.readline() for _ in range(train_rows + 1)), encoding="utf-8")
    (folder / "dev.tsv").write_bytes((shared_data / "glue/SST-2/dev.tsv").read_bytes())
    return folder


def command(raw, out, bpe_dir):
    return [sys.executable, str(SCRIPT), "SST-2", "--raw", str(raw), "--out", str(out), "--bpe-dir", str(bpe_dir),
            "--workers", "2"]  # fmt: skip


def files(folder: Path) -> dict:
    """Relative path -> bytes; preprocess.log records the temporary folders' names, which differ per run."""
    found = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name == "preprocess.log":
            data = re.sub(rb"[^/\s,']*\.tmp\b", b"TMP", data)
        found[str(path.relative_to(folder))] = data
    return found


def interrupt_after_first_part(cmd, parts: Path, timeout=120):
    """Start ``cmd`` in its own process group and Ctrl-C it (the whole group, as a terminal does) as soon as
    its first part is finished (its marker written)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not any(parts.rglob("*.sha256")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


@pytest.mark.slow  # three preparations of 20,872 sentences: ~20 s on 2 idle cores, 40 s on a loaded machine
def test_ctrl_c_is_one_line_and_the_same_command_resumes_to_the_same_files(tmp_path, shared_data, roberta_bpe):
    # two BPE chunks of train: Ctrl-C after the first leaves the other (seconds of work) undone
    raw = sst2_rows(shared_data, tmp_path / "raw", 2 * CHUNK_LINES)
    out = tmp_path / "data" / "SST-2"
    reference = subprocess.run(command(raw, out, roberta_bpe), capture_output=True, text=True, timeout=300)
    assert reference.returncode == 0, reference.stderr
    expected = files(out)
    out.rename(tmp_path / "reference")
    parts = parts_folder(out)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    code, stdout, stderr = interrupt_after_first_part(command(raw, out, roberta_bpe), parts)
    assert code == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr and "ForkPoolWorker" not in stderr
    said = [line for line in stderr.splitlines() if not line.startswith("warning:") and "| INFO |" not in line]
    kept = Parts(parts).kept()
    assert said == [
        f"interrupted: prepare_data SST-2 --out {out}: {len(kept)} finished part(s) kept in {parts}; "
        f"the same command resumes from them"
    ]
    # nothing half-written: no out, no temporary file or folder; in the parts folder only finished parts
    assert not out.exists() and not list(tmp_path.rglob("*.tmp"))
    assert kept and all(Parts(parts).finished(name) for name in kept)
    assert sorted(str(p.relative_to(parts)) for p in parts.rglob("*") if p.is_file()) == sorted(
        ["key"] + kept + [name + ".sha256" for name in kept]
    )
    assert "text/train.input0.0000" in kept and "input0" not in kept  # interrupted before binarizing

    again = subprocess.run(command(raw, out, roberta_bpe), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert (
        f"SST-2: reusing {len(kept)} finished part(s) of an interrupted preparation in {parts} (sha256 checked): "
        in again.stdout
    )
    encoded = int(re.search(r"BPE \(gpt2\) of ([\d,]+) sentences", again.stdout)[1].replace(",", ""))
    assert encoded == 2 * CHUNK_LINES + 872 - len(kept) * CHUNK_LINES
    assert files(out) == expected  # byte for byte what the uninterrupted preparation wrote
    assert not parts.exists() and not list(tmp_path.rglob("*.tmp"))
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if out not in p.parents and p != out) == before


def test_an_interrupted_preparation_removes_what_it_left_under_a_temporary_name(tmp_path):
    """However late the signal lands (between a temporary's creation and its cleanup), the interrupted
    preparation's last step removes its temporaries and keeps its finished parts."""
    import importlib
    from types import SimpleNamespace

    prepare = importlib.import_module("fairseq_idpg.preprocessing.prepare")  # the module, not the function
    out = tmp_path / "data" / "SST-2"
    out.parent.mkdir(parents=True)
    parts = Parts.open(out, "key-1", log=print)
    parts.make("text/train.input0.0000", lambda path: path.write_text("1 2 3\n"))
    left = [parts.folder / "text" / ".train.input0.0001.abc.tmp", parts.folder / ".input0.def.tmp" / "train.bin"]
    for path in left:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half")
    binarized = out.parent / f".SST-2.{prepare._host()}.{os.getpid()}.ghi.tmp"
    binarized.mkdir()
    other = out.parent / ".SST-2.otherhost.1.jkl.tmp"  # another process's, maybe running: kept
    other.mkdir()
    said = prepare._interrupted(SimpleNamespace(name="SST-2"), out, parts)
    assert said.startswith("interrupted: prepare_data SST-2 --out ") and "1 finished part(s) kept" in said
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.tmp")) == ["data/.SST-2.otherhost.1.jkl.tmp"]
    assert parts.kept() == ["text/train.input0.0000"] and parts.finished("text/train.input0.0000")


def test_a_part_changed_after_its_marker_is_made_again(tmp_path):
    parts = Parts.open(tmp_path / "bin", "key-1", log=print)
    parts.make("text/train.input0.0000", lambda path: path.write_text("1 2 3\n"))
    parts.make("input0", lambda dest: (dest / "train.bin").write_bytes(b"\x01\x02"), folder=True)
    assert parts.kept() == ["input0", "text/train.input0.0000"]
    assert parts.finished("input0") and parts.finished("text/train.input0.0000")
    (parts.folder / "text/train.input0.0000").write_text("1 2\n")  # truncated by hand, or a disk error
    (parts.folder / "input0" / "train.bin").write_bytes(b"\x01")
    assert not parts.finished("text/train.input0.0000") and not parts.finished("input0")
    parts.make("text/train.input0.0000", lambda path: path.write_text("1 2 3\n"))
    assert parts.finished("text/train.input0.0000")
    marker = json.loads((parts.folder / "text/train.input0.0000.sha256").read_text())
    assert marker == {"train.input0.0000": hashlib.sha256(b"1 2 3\n").hexdigest()}


def test_parts_of_other_files_or_options_are_removed(tmp_path, capsys):
    parts = Parts.open(tmp_path / "bin", "key-1", log=print)
    parts.make("text/train.input0.0000", lambda path: path.write_text("1 2 3\n"))
    assert Parts.open(tmp_path / "bin", "key-1", log=print).kept() == ["text/train.input0.0000"]
    again = Parts.open(tmp_path / "bin", "key-2", log=print)
    assert again.kept() == [] and (again.folder / "key").read_text() == "key-2"
    assert f"removed {parts.folder}: the parts of a preparation from other files or options" in capsys.readouterr().out


def test_a_failing_part_leaves_nothing(tmp_path):
    parts = Parts.open(tmp_path / "bin", "key-1", log=print)

    def half_written(path):
        path.write_text("1 2")
        raise OSError(28, "No space left on device")

    for folder in (False, True):
        try:
            parts.make("input0", (lambda dest: half_written(dest / "train.bin")) if folder else half_written, folder)
        except OSError:
            pass
        assert sorted(p.name for p in parts.folder.iterdir()) == ["key"]
