"""Runs trained together on one backbone (``python -m fairseq_idpg.fused.train``) end with what each trains to alone
with fairseq-train: the same trained tensors (float tolerance) and the same validations, for a record of each part
the records are built of (``METHODS``: a new block's record is trained here), with dropout off (tiny random
backbone, 40 made-up sentences, 6 updates each: epoch 1 is 5 updates, so the last is epoch 2's first batch, on its
own reshuffle)."""

import contextlib
import json
import logging
import subprocess
import sys

import pytest
import torch
from checkpoint_support import fairseq_train
from conftest import REPO, tiny_sst2

from fairseq_idpg.fused.train import LOG_FORMAT, member_configs, split_members, train_group
from fairseq_idpg.methods import get_method, methods_where

# every record that can share a backbone (``frozen_backbone``) that is the first to use one of the parts the records
# are built of (``Method.parts``: a block, a prompt matrix, a generator kind or input), so a record using a new block
# is trained here; and these variants of a part, for what they do beyond it: M-IDPG's layer-wise generators, LoRA's
# variants (DoRA reads the frozen projection, its norms, in the forward; PiSSA starts from the frozen weights),
# Compacter's factored adapters
VARIANTS = ("m-idpg-phm", "lora", "dora", "pissa", "compacter")


def one_per_part():
    chosen, covered = [], set()
    for name in methods_where(frozen_backbone=True):
        parts = set(get_method(name).parts)
        if parts - covered or name in VARIANTS:
            chosen.append(name)
            covered |= parts
    return chosen


METHODS = one_per_part()
MEMBERS = [("5e-3", "1"), ("1e-2", "2"), ("2e-3", "3")]  # (lr, seed): a sweep's grid


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory, tiny):
    return tiny_sst2(tmp_path_factory.mktemp("fused-data"), tiny)


def own_dropout_off(name, files):
    """The record's own dropout options at 0 (the fused members draw their own masks), IDPG's M(x) cache in memory,
    and the ``files`` (``method_files``: GloVe's vectors) its model takes."""
    import argparse

    from fairseq.models.roberta import RobertaModel

    def parser(model_class):
        p = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
        model_class.add_args(p)
        return p

    roberta = {action.dest for action in parser(RobertaModel)._actions}  # its dropouts: given in shared_args
    flags = []
    for action in parser(get_method(name).model_class)._actions:
        if action.dest in roberta:
            continue
        if "dropout" in action.dest and action.type is float:
            flags += [action.option_strings[0], "0"]
        elif action.dest in files:
            flags += [action.option_strings[0], files[action.dest]]
    return flags


def shared_args(name, data, dims, backbone, files=None):
    """The fairseq-train flags every member shares: run.sh's recipe shape at a smoke budget, dropout off."""
    return [
        str(data), "--user-dir", str(REPO / "fairseq_idpg"), *get_method(name).train_args(), *dims,
        "--backbone", str(backbone), "--criterion", "sentence_prediction_metrics", "--num-classes", "2",
        "--init-token", "0", "--separator-token", "2", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
        "--dropout", "0", "--attention-dropout", "0", *own_dropout_off(name, files or {"idpg_cache": "memory"}),
        "--batch-size", "8", "--max-update", "6", "--lr-scheduler", "polynomial_decay", "--total-num-update", "6",
        "--warmup-updates", "2", "--clip-norm", "1.0", "--best-checkpoint-metric", "accuracy",
        "--maximize-best-checkpoint-metric", "--no-epoch-checkpoints", "--validate-interval-updates", "3",
        "--cpu", "--num-workers", "0", "--log-format", "json", "--log-interval", "2",
    ]  # fmt: skip


@contextlib.contextmanager
def logged_to(path):
    """fairseq's log records (all loggers) also written to ``path``, as fairseq-train's output lands in train.log."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()


def validations(save):
    """(updates, valid accuracy, valid loss) of each validation in a run's train.log."""
    out = []
    for line in (save / "train.log").read_text().splitlines():
        if "| valid |" in line:
            stats = json.loads(line.split("| valid | ", 1)[1])
            out.append((stats["valid_num_updates"], stats["valid_accuracy"], stats["valid_loss"]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS)
def test_fused_members_end_as_they_end_alone(name, tiny, tiny_data, method_files, tmp_path):
    data, dims = tiny_data
    shared = shared_args(name, data, dims, tiny.model_file, method_files)
    members = [["--lr", lr, "--seed", seed, "--save-dir", str(tmp_path / "fused" / seed)] for lr, seed in MEMBERS]
    for lr, seed in MEMBERS:
        save = tmp_path / "alone" / seed
        with logged_to(save / "train.log"):
            fairseq_train([*shared, "--lr", lr, "--seed", seed, "--save-dir", str(save)])
    assert train_group(shared, members) == {0: None, 1: None, 2: None}
    for _, seed in MEMBERS:
        fused, alone = tmp_path / "fused" / seed, tmp_path / "alone" / seed
        for checkpoint in ("checkpoint_last.pt", "checkpoint_best.pt"):
            a = torch.load(fused / checkpoint, map_location="cpu", weights_only=False)
            b = torch.load(alone / checkpoint, map_location="cpu", weights_only=False)
            assert a["model"].keys() == b["model"].keys()
            for key, want in b["model"].items():
                # atol: BitFit's key biases get a gradient that is zero but for rounding (softmax ignores a
                # shift of every score), so Adam moves them by rounding noise, ~1e-6 either way
                torch.testing.assert_close(a["model"][key], want, rtol=1e-4, atol=5e-6, msg=f"{checkpoint} {key}")
            assert a["extra_state"]["train_iterator"] == b["extra_state"]["train_iterator"]
            assert a["optimizer_history"][-1]["num_updates"] == b["optimizer_history"][-1]["num_updates"] == 6
            # a member's checkpoint holds its own tensors only, not the stacked ones its views come from (a saved
            # view keeps its whole storage); its meters hold Python numbers where a lone run's hold tensors
            for key, value in a["model"].items():
                assert value.untyped_storage().nbytes() == value.numel() * value.element_size(), key
        got, want = validations(fused), validations(alone)
        assert [u for u, _, _ in got] == [u for u, _, _ in want] == ["3", "5", "6"]  # each epoch end, every 3
        assert [a for _, a, _ in got] == [a for _, a, _ in want]
        assert [float(x) for _, _, x in got] == pytest.approx([float(x) for _, _, x in want], abs=2e-3)


@pytest.mark.parametrize("name", ["prompt-tuning-5", "m-idpg-phm", "lora", "bitfit"])
def test_member_configs_equal_fairseqs_own_conversion(name, tiny, tiny_data, tmp_path):
    """Only the first member's config is made by fairseq's (slow) conversion; each other member's is derived from
    it and must equal what the conversion makes of that member's command line."""
    from omegaconf import OmegaConf

    def plain(cfg):
        return {k: v if isinstance(v, (dict, type(None))) else vars(v) for k, v in OmegaConf.to_container(cfg).items()}

    data, dims = tiny_data
    shared = shared_args(name, data, dims, tiny.model_file) + ["--fp16"]
    members = [["--lr", lr, "--seed", seed, "--save-dir", str(tmp_path / seed)] for lr, seed in MEMBERS]
    derived = member_configs(shared, members)
    for own, cfg in zip(members[1:], derived[1:], strict=True):
        (converted,) = member_configs(shared, [own])
        assert plain(cfg) == plain(converted)
        assert cfg.optimizer.lr == cfg.lr_scheduler.lr == [float(own[1])] and cfg.common.seed == int(own[3])
    assert plain(derived[0]) != plain(derived[1])


def test_member_flags_are_checked_before_anything_runs(tmp_path):
    with pytest.raises(Exception, match=r"--member '--lr 1 --seed 1 --save-dir a --batch-size 4': --batch-size is not"):
        split_members(["data", "--member", "--lr 1 --seed 1 --save-dir a --batch-size 4"])
    with pytest.raises(Exception, match=r"^--member '--lr 1 --seed 1': --save-dir missing: each member gives its own "
                       r"--lr, --seed, --save-dir$"):  # fmt: skip
        split_members(["data", "--member", "--lr 1 --seed 1"])
    with pytest.raises(Exception, match="two members write --save-dir a; each run needs its own"):
        split_members(["data", "--member", "--lr 1 --seed 1 --save-dir a", "--member", "--lr 2 --seed 2 --save-dir a"])
    with pytest.raises(Exception, match="two members write --save-dir a and a/; each run needs its own"):
        split_members(["data", "--member", "--lr 1 --seed 1 --save-dir a", "--member", "--lr 2 --seed 2 --save-dir a/"])
    (tmp_path / "b").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "b")
    with pytest.raises(Exception, match=f"--save-dir {tmp_path}/b and {tmp_path}/link;"):
        split_members(["data", "--member", f"--lr 1 --seed 1 --save-dir {tmp_path}/b",
                       "--member", f"--lr 1 --seed 2 --save-dir {tmp_path}/link"])  # fmt: skip
    with pytest.raises(Exception, match="--seed is a member's own flag"):
        split_members(["data", "--seed", "3", "--member", "--lr 1 --seed 1 --save-dir a"])
    assert split_members(["data", "--fp16", "--member", "--lr 1 --seed 1 --save-dir a"]) == (
        ["data", "--fp16"],
        [["--lr", "1", "--seed", "1", "--save-dir", "a"]],
    )


def test_fine_tuning_is_refused_in_one_line(tiny, tiny_data, tmp_path):
    data, dims = tiny_data
    shared = shared_args("finetune", data, dims, tiny.model_file)
    shared[shared.index("--backbone")] = "--finetune-from-model"
    cmd = [sys.executable, "-m", "fairseq_idpg.fused.train", *shared]
    cmd += ["--member", f"--lr 1e-3 --seed 1 --save-dir {tmp_path / 'a'}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "its backbone trains (fine-tuning), so its runs cannot share one" in lines[0], lines
    assert not (tmp_path / "a").exists()


def test_a_member_whose_folder_cannot_be_written_fails_alone(tiny, tiny_data, tmp_path):
    """Its line on the console, the group's exit 1; the other member trains to its end as it would."""
    data, dims = tiny_data
    (tmp_path / "file").write_text("not a folder")
    bad, good = tmp_path / "file" / "run", tmp_path / "good"
    cmd = [sys.executable, "-m", "fairseq_idpg.fused.train", *shared_args("lora", data, dims, tiny.model_file)]
    cmd += ["--member", f"--lr 1e-3 --seed 1 --save-dir {bad}", "--member", f"--lr 1e-3 --seed 2 --save-dir {good}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stdout + out.stderr
    assert f"  {bad}: --save-dir {bad} cannot be written: Not a directory ({bad})" in out.stdout.splitlines()
    assert f"  {good}: finished" in out.stdout.splitlines()
    saved = torch.load(good / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert saved["optimizer_history"][-1]["num_updates"] == 6
    assert (tmp_path / "file").read_text() == "not a folder"


def test_compiled_layers_are_refused_in_one_line(tiny, tiny_data, tmp_path, capsys):
    """Members run under vmap, which calls the layers' own code: --compile-layers would do nothing there."""
    from fairseq_idpg.fused.train import main

    data, dims = tiny_data
    argv = [*shared_args("lora", data, dims, tiny.model_file), "--compile-layers"]
    assert main([*argv, "--member", f"--lr 1e-3 --seed 1 --save-dir {tmp_path / 'a'}"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--compile-layers compiles a lone run's layers; runs trained together" in lines[0]
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("precision", ["--bf16", "--fp16"])
def test_fused_gradient_norms_are_fairseqs(precision, tiny, tiny_data, tmp_path, monkeypatch):
    """Under fairseq's FP16Optimizer each member's gradient norm comes from the fused step, computed for all members
    at once (compat fix 19, ``known_gradient_norm``): it equals the norm fairseq computes from the member's own fp32
    gradient copies, at every update, and the members' norms differ (each its own)."""
    import fairseq_idpg_compat
    from fairseq_idpg.tasks.peft_sentence_prediction import FUSED_MEMBER

    seen = []
    known = fairseq_idpg_compat._KnownNorm.__call__

    def recorded(self, max_norm, aggregate_norm_fn=None):
        given = self.norm is not None
        fairseqs = self.own(0)  # fairseq's norm of the same gradients (max_norm 0: no clipping)
        ours = known(self, max_norm, aggregate_norm_fn)
        seen.append((FUSED_MEMBER.get().index, given, float(ours), float(fairseqs)))
        return ours

    monkeypatch.setattr(fairseq_idpg_compat._KnownNorm, "__call__", recorded)
    data, dims = tiny_data
    shared = shared_args("prompt-tuning-5", data, dims, tiny.model_file) + [precision]
    shared[shared.index("--max-update") + 1] = "4"
    members = [["--lr", lr, "--seed", seed, "--save-dir", str(tmp_path / seed)] for lr, seed in MEMBERS[:2]]
    assert train_group(shared, members) == {0: None, 1: None}
    assert sorted({(i, n) for i, *_ in seen for n in [sum(j == i for j, *_ in seen)]}) == [(0, 4), (1, 4)]
    assert all(given for _, given, _, _ in seen)  # every norm came from the fused step
    for _, _, ours, fairseqs in seen:
        assert ours == pytest.approx(fairseqs, rel=1e-5)
    assert seen[0][2] != seen[1][2]


def test_every_fused_step_runs_on_the_groups_one_step_thread(tiny, tiny_data, tmp_path, monkeypatch):
    """The fused step runs on one thread of the group's own, whichever member completes a round: the host allocator
    keeps what a thread frees in that thread's arena, so steps run by each member's thread in turn left a step's
    working memory in every member's arena (host memory growing as K^2: 14.7 GB at K = 20 on the stand-in)."""
    import threading

    from fairseq_idpg.fused import group

    threads = []
    fused_step = group.FusedGroup._fused_step

    def recorded(self, waiting):
        threads.append(threading.current_thread().name)
        return fused_step(self, waiting)

    monkeypatch.setattr(group.FusedGroup, "_fused_step", recorded)
    data, dims = tiny_data
    shared = shared_args("prompt-tuning-5", data, dims, tiny.model_file)
    shared[shared.index("--max-update") + 1] = "4"
    members = [["--lr", lr, "--seed", seed, "--save-dir", str(tmp_path / seed)] for lr, seed in MEMBERS]
    assert train_group(shared, members) == {0: None, 1: None, 2: None}
    assert threads == ["fused-step"] * 4
    assert not any(t.name == "fused-step" for t in threading.enumerate())  # stopped with the group


def fairseq_module_state():
    """Every module-level value of fairseq's modules, and the attributes of their functions, as (identity, shallow
    contents): what one run could leave for another. fairseq's per-run state (compat fix 18: the metrics' mappings,
    ``RunAttributes``) is the current run's, so only its identity is taken."""
    import types

    from fairseq_idpg_compat import RunAttributes, _RunMapping

    state = {}
    for name, module in list(sys.modules.items()):
        if not (name == "fairseq" or name.startswith(("fairseq.", "fairseq_cli"))) or module is None:
            continue
        for key, value in list(vars(module).items()):
            if isinstance(value, types.ModuleType | type) or key.startswith("__"):
                continue
            if isinstance(value, RunAttributes | _RunMapping):
                contents = None
            elif isinstance(value, types.FunctionType):
                contents = tuple((k, id(v)) for k, v in vars(value).items())
            elif isinstance(value, dict):
                contents = tuple((k, id(v)) for k, v in value.items())
            elif isinstance(value, list | set):
                contents = tuple(sorted(map(id, value)))
            else:
                contents = None
            state[f"{name}.{key}"] = (id(value), contents)
        state[name] = None  # the module itself: one imported meanwhile is new, not changed
    return state


def changed_state(before, after):
    """The values of ``fairseq_module_state`` that changed, or appeared in a module that was there before."""
    return sorted(
        k for k in after.keys() | before.keys() if after.get(k) != before.get(k) and k.rpartition(".")[0] in before
    )


def test_no_fairseq_module_state_changes_during_a_members_turn(tiny, tiny_data, tmp_path, monkeypatch):
    """Members run one at a time in threads of their own (fused/group.py): fairseq's module-level state must be
    the same when a member's turn ends as when it began (what a member changed there, the next member would see).
    Checked at every turn of every member, over whole runs with validation, checkpoints and an early-stop
    patience."""
    import threading

    from fairseq.logging import metrics

    from fairseq_idpg.fused import group

    changed, turns = [], []

    class CheckedTurnLock:
        def __init__(self):
            self.lock = threading.Lock()

        def acquire(self):
            self.lock.acquire()
            self.before = fairseq_module_state()

        def release(self):
            after = fairseq_module_state()
            changed.extend(changed_state(self.before, after))
            turns.append(threading.current_thread().name)
            self.lock.release()

        __enter__ = acquire

        def __exit__(self, *exc):
            self.release()

    init = group.FusedGroup.__init__

    def checked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.turn_lock = CheckedTurnLock()

    monkeypatch.setattr(group.FusedGroup, "__init__", checked)
    data, dims = tiny_data
    shared = shared_args("prompt-tuning-5", data, dims, tiny.model_file) + ["--patience", "2"]
    members = [["--lr", lr, "--seed", seed, "--save-dir", str(tmp_path / seed)] for lr, seed in MEMBERS]
    assert train_group(shared, members) == {0: None, 1: None, 2: None}
    assert len(turns) >= 3 * 6 and changed == []  # every update of every member (--max-update 6) was a turn
    # the check sees a change: a value set on a fairseq module, and one set on a function's attributes
    before = fairseq_module_state()
    monkeypatch.setattr(metrics, "left_by_a_member", 1, raising=False)
    monkeypatch.setattr(metrics.reset, "left_by_a_member", 1, raising=False)
    changed = set(changed_state(before, fairseq_module_state()))  # (fairseq.metrics is the same module too)
    assert {"fairseq.logging.metrics.left_by_a_member", "fairseq.logging.metrics.reset"} <= changed
