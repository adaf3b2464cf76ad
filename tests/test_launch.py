"""The multi-device launcher keeps the effective batch."""

import pytest

from fairseq_idpg.launch import build_command, update_freq_for


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
    tail = cmd[cmd.index("fairseq_cli.train") + 1 :]
    assert tail[:3] == ["data", "--user-dir", "fairseq_idpg"]
    for flag, value in {
        "--batch-size": "4",
        "--update-freq": "2",
        "--distributed-backend": "gloo",
        "--ddp-backend": "legacy_ddp",
    }.items():
        assert tail[tail.index(flag) + 1] == value
    assert "--cpu" in tail


def test_launcher_owns_batch_flags():
    with pytest.raises(ValueError, match="--update-freq is set by the launcher"):
        build_command(["data", "--update-freq", "2"], nproc=1, total_batch=8, batch_size=8, cpu=True)
