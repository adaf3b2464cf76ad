"""``python -m fairseq_idpg.run.group``'s members after training: a stop (Ctrl-C, the sweep's SIGTERM) while one
member is scored ends the group there, exit 130 in one line; a member's own failure does not stop the others."""

import os
from types import SimpleNamespace

import pytest

from fairseq_idpg.errors import Interrupted, RunError
from fairseq_idpg.run import group


@pytest.fixture
def members(tmp_path, monkeypatch):
    """Three planned members, trained already: execute_group goes straight to scoring them (``scored``)."""
    plans = [SimpleNamespace(folder=tmp_path / name, config={}) for name in ("a", "b", "c")]
    for p in plans:
        p.folder.mkdir()
    monkeypatch.setattr(group, "read_run_folder", lambda folder: None)
    monkeypatch.setattr(group, "run_folder_lock", lambda folder: __import__("contextlib").nullcontext())
    monkeypatch.setattr(group, "trained_before", lambda p: True)
    scored = []
    return plans, scored


def scoring(scored, fails):
    def finish(p, fused_with):
        scored.append(p.folder.name)
        if p.folder.name in fails:
            raise fails[p.folder.name]

    return finish


def test_a_stop_while_a_member_is_scored_scores_no_other(members, monkeypatch, capsys):
    plans, scored = members
    stop = Interrupted("interrupted; a/valid.log keeps the output; the same command resumes")
    monkeypatch.setattr(group, "_finish", scoring(scored, {"a": stop}))
    with pytest.raises(RunError, match="^interrupted"):
        group.execute_group(plans)
    assert scored == ["a"]  # b's and c's fairseq-validate never started

    monkeypatch.setattr(group, "parse_members", lambda argv: [["SST-2"]])
    monkeypatch.setattr("fairseq_idpg.run.cli.parse_args", lambda m: SimpleNamespace(method="lora"))
    monkeypatch.setattr("fairseq_idpg.run.planning.check", lambda request, m: plans[0])
    monkeypatch.setattr("fairseq_idpg.run.planning.planned", lambda request, checked, m: checked)
    monkeypatch.setattr(group, "trains_alone", lambda p: None)
    monkeypatch.setattr(group, "member_flags", lambda plans: ([], []))
    capsys.readouterr()
    assert group.main([]) == 130
    assert capsys.readouterr().err.splitlines() == [f"run.sh: error: {stop}"]


def test_a_members_failure_is_its_own(members, monkeypatch, capsys):
    plans, scored = members
    monkeypatch.setattr(group, "_finish", scoring(scored, {"a": RunError("fairseq-validate failed")}))
    assert group.execute_group(plans) == ["a: fairseq-validate failed"]
    assert scored == ["a", "b", "c"]
    assert "run.sh: error: a: fairseq-validate failed" in capsys.readouterr().err


def test_two_members_of_one_run_folder_are_refused_in_one_line_before_anything_trains(tmp_path, monkeypatch, capsys):
    """Two ``--member`` lines that plan one run folder (the same run spelled twice: a flag, a preset, a default) would
    train it twice at once: group.main refuses them in one line, exit 2, before any member trains."""
    folder = tmp_path / "lr1e-4.seed1.0123abcd"
    plans = [
        SimpleNamespace(folder=folder, config={}),
        SimpleNamespace(folder=tmp_path / ".." / tmp_path.name / folder.name, config={}),
    ]
    monkeypatch.setattr(group, "parse_members", lambda argv: [["SST-2", "--seed", "1"], ["SST-2", "--seed", "01"]])
    monkeypatch.setattr("fairseq_idpg.run.cli.parse_args", lambda m: SimpleNamespace(method="lora"))
    planned = iter(plans)
    monkeypatch.setattr("fairseq_idpg.run.planning.check", lambda request, m: next(planned))
    monkeypatch.setattr("fairseq_idpg.run.planning.planned", lambda request, checked, m: checked)
    monkeypatch.setattr(group, "trains_alone", lambda p: None)
    monkeypatch.setattr(
        group, "fairseq_train_args", lambda p: ["data", "--lr", "1e-4", "--seed", "1", "--save-dir", str(p.folder)]
    )
    monkeypatch.setattr(group, "execute_group", lambda plans: pytest.fail("a member trained"))
    assert group.main([]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"run.sh: error: two members are one run ({folder.name}): its folder would be trained twice at once; give "
        "each run once"
    ]
    assert not folder.exists()


def test_a_group_stopped_while_training_keeps_its_folders_locked_until_the_process_ends(tmp_path, monkeypatch):
    """A stop (Ctrl-C, SIGTERM) while the members train: their threads end with the process, not when the stop
    reaches execute_group, so each run folder stays locked (flock) until the process exits: a second process taking
    the folder meanwhile would meet a member still writing."""
    import fcntl

    from fairseq_idpg.run.execution import RUN_LOCK

    plans = [SimpleNamespace(folder=tmp_path / name, config={}) for name in ("a", "b")]
    monkeypatch.setattr(group, "read_run_folder", lambda folder: None)
    monkeypatch.setattr(group, "trained_before", lambda p: False)
    monkeypatch.setattr(group, "write_json", lambda config, path: None)
    stop = Interrupted("interrupted; fused.log and each run's train.log keep the output; the same command resumes")
    monkeypatch.setattr(group, "_train", lambda training: (_ for _ in ()).throw(stop))
    held = list(group._HELD_UNTIL_EXIT)
    with pytest.raises(RunError, match="^interrupted"):
        group.execute_group(plans)
    try:
        for p in plans:
            fd = os.open(p.folder / RUN_LOCK, os.O_RDWR)
            try:
                with pytest.raises(BlockingIOError):  # another open file: refused while this process lives
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)
    finally:
        for stack in group._HELD_UNTIL_EXIT[len(held) :]:
            stack.close()  # this test's process goes on: release them here
        group._HELD_UNTIL_EXIT[:] = held
    fd = os.open(plans[0].folder / RUN_LOCK, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released: free again
    os.close(fd)
