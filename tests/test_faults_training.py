"""fairseq-train's faults in one line (fairseq_idpg_compat fixes 12 and 13): a full disk while saving a
checkpoint, and a diverged update; nothing half-written left, the checkpoints saved before intact."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_sst2

from fairseq_idpg.run.processes import ONE_LINE_ERROR

REPO = Path(__file__).resolve().parents[1]

# fairseq-train whose disk fills up at the NTH write (torch.save: the first file of a save; copyfile: its
# copies) to a file named NAME: 4 kB written, then ENOSPC
FULL_DISK = """
import errno, os, sys, shutil, torch
mode, name, nth, calls = sys.argv.pop(1), sys.argv.pop(1), int(sys.argv.pop(1)), []
save, copyfile = torch.save, shutil.copyfile
def full(write):
    def partial(*args):
        target = args[1] if isinstance(args[1], str) else args[1].name
        calls.append(target)
        if sum(os.path.basename(c).startswith(name) for c in calls) != nth:
            return write(*args)
        f = args[1] if mode == "save" else open(args[1], "wb")
        f.write(b"x" * 4096)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return partial
if mode == "save":
    torch.save = full(save)
else:
    shutil.copyfile = full(copyfile)
from fairseq_cli.train import cli_main
sys.argv = ["fairseq-train", *sys.argv[1:]]
cli_main()
"""


def train(data, dims, tiny, save, *extra, code=None, before=()):
    """fairseq-train on the tiny backbone, 4 updates, saving at 2 and 4; ``code`` runs it (given ``before`` its
    arguments) in place of ``python -m fairseq_cli.train``."""
    # fmt: off
    args = [str(data), "--user-dir", str(REPO / "fairseq_idpg"), "--task", "sentence_prediction",
            "--criterion", "sentence_prediction", "--num-classes", "2", "--arch", "roberta", *dims,
            "--finetune-from-model", str(tiny.model_file), "--init-token", "0", "--separator-token", "2",
            "--optimizer", "adam", "--batch-size", "4", "--max-update", "4", "--cpu", "--save-dir", str(save),
            "--no-epoch-checkpoints", "--save-interval-updates", "2", "--validate-interval-updates", "2",
            "--seed", "1", "--num-workers", "0", "--log-format", "simple", "--log-interval", "1", *extra]
    # fmt: on
    fairseq_train = str(Path(sys.executable).parent / "fairseq-train")  # its cli_main, as a user runs it
    cmd = [sys.executable, "-c", code, *before, *args] if code else [fairseq_train, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def said(out):
    """stderr less torch's warnings (a warning's line and the source line it quotes)."""
    lines = out.stderr.strip().splitlines()
    return [line for i, line in enumerate(lines) if "Warning: " not in line and "Warning: " not in lines[i - 1]]


def tree(folder: Path):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("mode", ["save", "copy"])
def test_a_full_disk_while_saving_is_one_line_and_keeps_the_checkpoints_before(tmp_path, tiny, mode):
    """Saves at updates 2 and 4: checkpoint_1_2.pt, then its copies (best, last); at update 4 the disk is
    full while writing checkpoint_1_4.pt (``save``) or while copying it to checkpoint_last.pt (``copy``)."""
    from fairseq_idpg_compat import checkpoint_num_updates

    data, dims = tiny_sst2(tmp_path, tiny)
    save = tmp_path / "save"
    failed = save / ("checkpoint_1_4.pt" if mode == "save" else "checkpoint_last.pt")
    # torch.save writes atomic_path's .checkpoint_1_4.pt.XXXX.tmp; the copies go to checkpoint_last.pt.tmp (fix 8)
    before = (".checkpoint_1_4.pt", "1") if mode == "save" else ("checkpoint_last.pt", "2")
    out = train(data, dims, tiny, save, "--lr", "1e-3", code=FULL_DISK, before=(mode, *before))
    assert out.returncode == 2, out.stderr[-3000:]
    assert said(out) == [
        f"fairseq-train: error: {failed}: could not be written (No space left on device); free some space, or "
        f"give --save-dir a folder with room (the same command then resumes); the checkpoints saved before are "
        f"as they were"
    ]
    assert ONE_LINE_ERROR.match(said(out)[0])  # the form run.sh passes on once
    assert "Traceback" not in out.stdout + out.stderr
    saved = ["checkpoint_1_2.pt", "checkpoint_best.pt", "checkpoint_last.pt"]
    assert tree(save) == sorted(saved + (["checkpoint_1_4.pt"] if mode == "copy" else []))  # no .tmp left
    for name in saved:
        assert checkpoint_num_updates(save / name) == 2  # intact, as saved at update 2

    again = train(data, dims, tiny, save, "--lr", "1e-3")  # room again: the same command resumes
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(r"Loaded checkpoint \S+checkpoint_last.pt \(epoch \d+ @ 2 updates\)", again.stdout)
    assert checkpoint_num_updates(save / "checkpoint_last.pt") == 4


def test_divergence_is_one_line_without_crash_pt(tmp_path, tiny):
    """--lr 1e6: NaN/Inf gradients at the first updates; one line naming the update and the lr, exit status 1."""
    data, dims = tiny_sst2(tmp_path, tiny)
    save = tmp_path / "save"
    out = train(data, dims, tiny, save, "--lr", "1e6")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stdout + out.stderr
    lines = said(out)
    assert len(lines) == 1 and re.fullmatch(
        r"FloatingPointError: gradients are Nan/Inf at update \d+ \(lr 1e\+06 is likely too high: try a lower --lr\)",
        lines[0],
    ), lines
    assert not (save / "crash.pt").exists() and not list(save.glob("*.tmp"))
    # run.sh reads the divergence from train.log (fairseq-train's stdout and stderr) by that line
    from fairseq_idpg.run.execution import divergence

    (tmp_path / "train.log").write_text(out.stdout + out.stderr)
    update = int(re.search(r"at update (\d+)", lines[0]).group(1))  # the update the trainer names, exactly
    assert divergence(tmp_path / "train.log") == {"update": update, "reason": "gradients are Nan/Inf"}
