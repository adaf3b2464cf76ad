"""The multi-device launcher keeps the effective batch."""

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from conftest import tiny_sst2

from fairseq_idpg.launch import build_command, layout, main, update_freq_for

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("nproc,batch,freq", [(1, 32, 1), (1, 8, 4), (2, 8, 2), (4, 8, 1)])
def test_update_freq_keeps_total_batch(nproc, batch, freq):
    assert update_freq_for(32, nproc, batch) == freq


def test_indivisible_batch_is_an_error():
    with pytest.raises(ValueError, match="--total-batch 32 is not a multiple of --nproc x --batch-size = 3 x 8"):
        update_freq_for(32, 3, 8)


def test_cpu_multi_worker_uses_torchrun_gloo_legacy_ddp():
    cmd = build_command(
        ["data", "--user-dir", "fairseq_idpg"], nproc=2, total_batch=16, batch_size=4, cpu=True, python="py"
    )
    assert cmd[:3] == ["py", "-m", "torch.distributed.run"]
    assert cmd[cmd.index("--nproc_per_node") + 1] == "2"
    assert cmd[cmd.index("--no-python") + 1] == "fairseq-train"  # the console script: one-line errors
    tail = cmd[cmd.index("fairseq-train") + 1 :]
    assert tail[:3] == ["data", "--user-dir", "fairseq_idpg"]
    for flag, value in {
        "--batch-size": "4",
        "--update-freq": "2",
        "--distributed-backend": "gloo",
        "--ddp-backend": "legacy_ddp",
    }.items():
        assert tail[tail.index(flag) + 1] == value
    assert "--cpu" in tail


def test_one_process_stays_one_on_a_machine_with_several_gpus():
    """fairseq-train's default --distributed-world-size is the number of visible GPUs (it would spawn one
    process per GPU, each with the per-device batch): one process is pinned to a world of 1."""
    cmd = build_command(["data"], nproc=1, total_batch=32, batch_size=16, cpu=False, python="py")
    assert cmd[0] == "fairseq-train"  # none beside "py": the one on PATH
    assert cmd[cmd.index("--distributed-world-size") + 1] == "1" and cmd[cmd.index("--update-freq") + 1] == "2"


def test_launcher_owns_batch_flags():
    with pytest.raises(ValueError, match="--update-freq is set by the launcher"):
        build_command(["data", "--update-freq", "2"], nproc=1, total_batch=8, batch_size=8, cpu=True)


@pytest.mark.parametrize(
    "nproc,batch_size,update_freq,expected",
    [(1, None, None, (32, 1)), (1, 8, None, (8, 4)), (1, None, 4, (8, 4)), (2, None, 4, (4, 4)), (2, 4, 4, (4, 4))],
)
def test_layout_completes_batch_size_or_update_freq(nproc, batch_size, update_freq, expected):
    assert layout(32, nproc, batch_size, update_freq) == expected


@pytest.mark.parametrize(
    "args,message",
    [
        ((32, 1, 8, 2), "--nproc 1 x --batch-size 8 x --update-freq 2 = 16, not --total-batch 32"),
        ((32, 1, None, 3), "--total-batch 32 is not a multiple of --nproc x --update-freq = 1 x 3"),
        ((32, 0), "--nproc must be >= 1, got 0"),
        ((0, 1), "--total-batch must be >= 1, got 0"),
        ((32, 1, 0), "--batch-size must be >= 1, got 0"),
        ((32, 1, None, -1), "--update-freq must be >= 1, got -1"),
    ],
)
def test_layout_errors_name_the_flag(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        layout(*args)


def test_launcher_accumulates_on_a_small_device(capsys):
    """--update-freq alone: the per-device batch follows (32 = 8 x 4), --max-tokens passes through."""
    assert (
        main(["--total-batch", "32", "--update-freq", "4", "--cpu", "--dry-run", "--", "data", "--max-tokens", "999"])
        == 0
    )
    cmd = capsys.readouterr().out.split()
    assert cmd[cmd.index("--batch-size") + 1] == "8" and cmd[cmd.index("--update-freq") + 1] == "4"
    assert cmd[cmd.index("--max-tokens") + 1] == "999"


def readme_train_command():
    """The README's hand-written scripts/train.sh command, as a list of words."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("scripts/train.sh --nproc")
    lines = []
    for line in text[start:].splitlines():
        lines.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            break
    return shlex.split(" ".join(lines))


@pytest.mark.slow
def test_readme_train_command_resumes_when_run_again(tmp_path, tiny):
    """The README's scripts/train.sh command, on a tiny backbone and 1 CPU worker, run twice: the second run
    goes on from the first one's checkpoint_last.pt (update 2), not from the pretrained model again (an
    explicit --restore-file did that; --finetune-from-model is read only while the save dir has no checkpoint)."""
    data, dims = tiny_sst2(tmp_path, tiny)
    words = readme_train_command()
    assert "--finetune-from-model" in words and "--restore-file" not in words
    swap = {"data-bin/RTE": str(data), "models/roberta.large/model.pt": str(tiny.model_file),
            "checkpoints/RTE": str(tmp_path / "save"), "roberta_large": "roberta", "4": "1"}  # fmt: skip
    words = [swap.get(w, w) for w in words[1:]]  # "4": --nproc 4 -> 1 CPU worker
    words[words.index("--max-update") + 1] = "{updates}"
    tiny_flags = [*dims, "--cpu", "--num-workers", "0", "--log-format", "simple", "--log-interval", "1"]

    def train(updates):
        cmd = ["bash", str(REPO / "scripts" / "train.sh"), *[w.format(updates=updates) for w in words], *tiny_flags]
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=600, cwd=REPO
        )  # as the README: from the checkout
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        return out.stdout + out.stderr

    first = train(2)
    assert f"loading pretrained model from {tiny.model_file}" in first and "num_updates=2" in first
    again = train(3)
    last = tmp_path / "save" / "checkpoint_last.pt"
    assert re.search(rf"[Ll]oaded checkpoint {re.escape(str(last))} \(epoch \d+ @ 2 updates\)", again), again[-3000:]
    assert "loading pretrained model" not in again and "num_updates=3" in again
