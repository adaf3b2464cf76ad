"""The main job (scripts/run.sh, fairseq_idpg/run/): each method's recipe in the fairseq-train command
(dry runs, no checkpoint or data needed), one folder per configuration, explicit values checked,
prepared data that follows its raw files, live output, and, end to end on a slice of SST-2 with the
offline stand-in (slow): seeds in separate folders, a cached second call, kill -9 then resume."""

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch
from lock_support import held_by_another_process
from run_support import RUN_SH, SMALL, finish, start, trained, write_slice

from fairseq_idpg import layout
from fairseq_idpg import run as main_job
from fairseq_idpg.logs import read_log, validate_scores, validations
from fairseq_idpg.methods import FINETUNE_TABLE, METHODS
from fairseq_idpg.run import backbone, execution
from fairseq_idpg.run.execution import InUse, checkpoint_updates, divergence
from fairseq_idpg.run.prepared import prepare_if_needed
from fairseq_idpg.run.processes import ConsoleFilter, TrainingEta, tee

REPO = Path(__file__).resolve().parents[1]


def dry_run(capsys, tmp_path, *args):
    """In-process ``run.sh ... --dry-run``: (printed text, the fairseq-train flags as {flag: value})."""
    code = main_job.main([*args, "--dry-run", "--work-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    command = next(line for line in out.splitlines() if line.startswith("+ ") and "fairseq_idpg.launch" in line)
    words = command.split()
    flags = {w: words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else True
             for i, w in enumerate(words) if w.startswith("--")}  # fmt: skip
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "data-bin").exists()  # nothing ran
    return out, flags


def counted_plans(monkeypatch):
    """The requests ``planning.plan`` is called with from now on (check's and the run's)."""
    from fairseq_idpg.run import planning

    calls, plan = [], planning.plan

    def counted(request, *args, **kwargs):
        calls.append(request)
        return plan(request, *args, **kwargs)

    monkeypatch.setattr(planning, "plan", counted)
    return calls


def test_a_request_is_planned_once(capsys, tmp_path, monkeypatch, standin_model):
    """A dry run plans its request once (check's plan, said as planning says it), and so does a read-only work
    folder's refusal; the lines are those of a plan made to print."""
    from fairseq_idpg.run import planning
    from fairseq_idpg.run_config import RunConfig

    argv = ["RTE", "--method", "lora", "--model", "roberta.large"]
    plans = counted_plans(monkeypatch)
    out, _ = dry_run(capsys, tmp_path, *argv)
    assert len(plans) == 1
    printed = []
    planning.plan(
        RunConfig.from_argv([*argv, "--dry-run", "--work-dir", str(tmp_path)]), log=lambda *a, **_: printed.extend(a)
    )
    assert len(printed) >= 3 and all(f"{line}\n" in out for line in printed)
    run = RunConfig.from_argv([*argv, "--work-dir", str(tmp_path)])  # a ready plan is used for the run itself
    checked = dataclasses.replace(planning.check(dataclasses.replace(run, dry_run=True)), ready=True)
    assert checked.request.dry_run and planning.planned(run, checked, argv).request is run
    monkeypatch.setattr("fairseq_idpg.run.cli.writable", lambda folder: False)  # (root writes anywhere)
    del plans[:]
    assert main_job.main(["RTE", "--method", "lora", "--work-dir", str(tmp_path)]) == 2  # the stand-in: it exists
    assert "is read-only" in capsys.readouterr().err and len(plans) == 1


# ---------------------------------------------------------------------------------------- recipes
def test_issue_dry_run_inducer_lora_mnli_roberta_large(tmp_path):
    """The inducer paper's NLU recipe: batch 16, 10 epochs, 6% warmup, clip 1.0, MNLI-mismatched selects;
    no checkpoint and no raw data needed."""
    out = subprocess.run(
        ["bash", str(RUN_SH), "MNLI", "--method", "inducer-lora", "--model", "roberta.large", "--dry-run"]
        + ["--work-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    budget = next(line for line in out.stdout.splitlines() if line.startswith("budget: "))
    for shown in ("batch 16 ", "10 epochs of 392,702 examples = 245,440 updates", "clip 1.0", "lr 0.0002"):
        assert shown in budget, budget
    assert "warmup 6% = 14,726 updates" in budget and "selection on valid1 (" in budget and "mismatched" in budget
    command = next(line for line in out.stdout.splitlines() if "fairseq_idpg.launch" in line)
    for flag in ("--total-batch 16 ", "--max-update 245440 ", "--total-num-update 245440 ", "--warmup-updates 14726 ",
                 "--clip-norm 1.0 ", "--valid-subset valid1,valid ", "--lr-scheduler polynomial_decay ",
                 "--encoder-layers 24 ", "--encoder-embed-dim 1024 ", "--blocks-preset inducer-lora "):  # fmt: skip
        assert flag in command, flag
    assert os.listdir(tmp_path) == []


def test_the_budget_line_shows_the_values_fairseq_flags_give(tmp_path):
    """run.sh RTE ... --dropout 0 --clip-norm=0.5: the budget line says what the run uses, not the recipe."""
    out = subprocess.run(
        ["bash", str(RUN_SH), "RTE", "--method", "lora", "--dry-run", "--work-dir", str(tmp_path), "--dropout", "0",
         "--clip-norm=0.5"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    budget = next(line for line in out.stdout.splitlines() if line.startswith("budget: "))
    assert "clip 0.5 (given), weight decay 0.1, dropout 0 (given), selection" in budget, budget
    command = next(line for line in out.stdout.splitlines() if "fairseq_idpg.launch" in line)
    words = command.split()  # after the recipe's own --dropout 0.1: argparse takes the last
    assert words[len(words) - 1 - words[::-1].index("--dropout") + 1] == "0" and "--clip-norm=0.5" in words


@pytest.mark.parametrize(
    "method,task,expected",
    [
        # fairseq's GLUE table: RTE lr 2e-5, batch 16, 2,036 updates, 6% warmup, no clipping
        ("finetune", "RTE", {"--lr": "2e-05", "--total-batch": "16", "--max-update": "2036", "--warmup-updates": "122",
                             "--clip-norm": "0.0", "--weight-decay": "0.1", "--valid-subset": "valid"}),
        # IDPG Table 4: constant lr, batch 16 for 50 epochs (RTE: 156 updates each), 32 for 10 on SST-2
        ("m-idpg-phm", "RTE", {"--lr": "0.005", "--lr-scheduler": "fixed", "--total-batch": "16",
                               "--max-update": str(50 * 156), "--clip-norm": "0.0", "--weight-decay": "0.1"}),
        ("m-idpg-phm", "SST-2", {"--total-batch": "32", "--max-update": str(10 * 2105)}),
        # DPT (adapted): 100 epochs, 10% warmup, clip 1.0, weight decay 1e-5
        ("dpt", "RTE", {"--lr": "0.005", "--total-batch": "16", "--max-update": str(100 * 156),
                        "--warmup-updates": str(100 * 156 // 10), "--clip-norm": "1.0", "--weight-decay": "1e-05"}),
        # the inducer paper's NLU recipe for its baselines too; Compacter with its own lr
        ("compacter", "MNLI", {"--lr": "0.003", "--total-batch": "16", "--max-update": "245440",
                               "--clip-norm": "1.0", "--valid-subset": "valid1,valid"}),
    ],
)  # fmt: skip
def test_each_family_dry_run_carries_its_paper_recipe(capsys, tmp_path, method, task, expected):
    _, flags = dry_run(capsys, tmp_path, task, "--method", method, "--model", "roberta.large")
    assert {k: flags.get(k) for k in expected} == expected


@pytest.mark.parametrize("task", ["RTE", "MNLI"])
@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_dry_run_follows_its_record(capsys, tmp_path, name, task):
    method = METHODS[name]
    recipe = method.recipe.for_task(task)
    train = {"RTE": 2490, "MNLI": 392702}[task]
    _, flags = dry_run(capsys, tmp_path, task, "--method", name, "--model", "roberta.base")
    updates = recipe.num_updates(train)
    assert float(flags["--lr"]) == recipe.lr and int(flags["--total-batch"]) == recipe.batch
    assert int(flags["--max-update"]) == updates and flags["--lr-scheduler"] == recipe.scheduler
    if recipe.scheduler == "polynomial_decay":
        assert int(flags["--warmup-updates"]) == int(recipe.warmup * updates)
        assert int(flags["--total-num-update"]) == updates
    assert float(flags["--clip-norm"]) == recipe.clip_norm and float(flags["--weight-decay"]) == recipe.weight_decay
    selected = recipe.select_on if task == "MNLI" else "valid"  # RTE has one dev set
    assert flags["--valid-subset"].split(",")[0] == selected
    assert flags["--arch"] == method.arch and flags["--task"] == method.task
    assert ("--backbone" in flags) == method.frozen_backbone
    assert ("--finetune-from-model" in flags) == (not method.frozen_backbone)  # resumes from checkpoint_last.pt
    assert flags["--encoder-layers"] == "12" and flags["--encoder-embed-dim"] == "768"  # roberta.base, no file


def test_standin_keeps_its_smoke_budget(capsys, tmp_path):
    _, flags = dry_run(capsys, tmp_path, "SST-2")
    assert (flags["--lr"], flags["--max-update"], flags["--total-batch"]) == ("5e-05", "300", "32")
    assert flags["--warmup-updates"] == "18" and flags["--validate-interval-updates"] == "100"
    assert flags["--save-interval-updates"] == "100"  # resumable inside the first epoch
    assert flags["--validate-interval"] == flags["--save-interval"] == "1000000"  # not at every (short) epoch
    _, flags = dry_run(capsys, tmp_path, "RTE", "--method", "m-idpg-phm")
    assert (flags["--lr"], flags["--max-update"], flags["--total-batch"]) == ("0.005", "300", "16")


def test_explicit_values_win_and_the_device_layout_keeps_the_batch(capsys, tmp_path):
    out, flags = dry_run(
        capsys, tmp_path, "RTE", "--method", "lora", "--model", "roberta.large", "--lr", "1e-3", "--max-update", "50",
        "--total-batch", "32", "--nproc", "2", "--update-freq", "4", "--max-tokens", "4400", "--seed", "7",
    )  # fmt: skip
    assert (flags["--lr"], flags["--max-update"], flags["--total-num-update"], flags["--warmup-updates"]) == (
        "0.001",
        "50",
        "50",
        "3",
    )
    assert (flags["--total-batch"], flags["--batch-size"], flags["--nproc"]) == ("32", "4", "2")  # 2 x 4 x 4
    assert flags["--max-tokens"] == "4400" and flags["--seed"] == "7"
    assert "run folder: " + str(tmp_path / "checkpoints" / "roberta.large" / "RTE" / "lora" / "lr1e-3.seed7.") in out


def test_epochs_given_set_the_budget(capsys, tmp_path):
    out, flags = dry_run(capsys, tmp_path, "RTE", "--method", "lora", "--model", "roberta.large", "--few-shot", "100",
                         "--epochs", "50", "--total-batch", "16")  # fmt: skip
    assert "50 epochs of 100 examples = 350 updates" in out and flags["--max-update"] == "350"


def test_epochs_follow_the_batch_given(capsys, tmp_path):
    """--total-batch 32 with a 10-epoch recipe: 10 epochs of 32 (the budget stays in epochs)."""
    _, flags = dry_run(capsys, tmp_path, "RTE", "--method", "lora", "--model", "roberta.large", "--total-batch", "32")
    assert flags["--max-update"] == str(10 * 78)


def test_finetune_table_and_records_agree():
    for task, (lr, batch, updates) in FINETUNE_TABLE.items():
        recipe = METHODS["finetune"].recipe.for_task(task)
        assert (recipe.lr, recipe.batch, recipe.num_updates(1)) == (lr, batch, updates)


def test_help_lists_every_method_with_its_description():
    out = subprocess.run(["bash", str(RUN_SH), "--help"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    listed = out.stdout.split("methods (--method):\n", 1)[1]
    for name in ("finetune", "lora", "m-idpg-phm", "dpt", "inducer-lora"):
        assert re.search(rf"^  {re.escape(name)} +{re.escape(METHODS[name].description)}$", listed, re.M), name
    assert len([line for line in listed.splitlines() if line.startswith("  ")]) == len(METHODS)
    assert "--bf16" in out.stdout and "--few-shot K" in out.stdout  # the flags, from RunConfig's fields


# ---------------------------------------------------------------------------------------- values given
@pytest.mark.parametrize(
    "flags,message",
    [
        (["--lr", "0"], "--lr must be > 0, got 0.0"),
        (["--lr", "-0.001"], "--lr must be > 0, got -0.001"),
        (["--max-update", "0"], "--max-update must be > 0, got 0"),
        (["--nproc", "0"], "--nproc must be > 0, got 0"),
        (["--total-batch", "0"], "--total-batch must be > 0, got 0"),
        (["--batch-size", "-2"], "--batch-size must be > 0, got -2"),
        (["--update-freq", "0"], "--update-freq must be > 0, got 0"),
        (["--max-tokens", "0"], "--max-tokens must be > 0, got 0"),
        (["--few-shot", "0"], "--few-shot must be > 0, got 0"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--total-batch", "16", "--batch-size", "6"], "--total-batch 16 is not a multiple of --nproc x --batch-size"),
        (["--method", "nope"], "unknown --method 'nope'"),
        (["--epochs", "0"], "--epochs must be > 0, got 0.0"),
        (["--epochs", "5", "--max-update", "9"], "--max-update and --epochs exclude each other"),
        (["--few-shot", "1491"], "--few-shot 1491: RTE's train file has 2,490 rows and the 1,000-example dev set"),
    ],
)
def test_impossible_values_are_one_line_errors_before_anything_runs(capsys, tmp_path, flags, message):
    assert main_job.main(["RTE", *flags, "--work-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"run.sh: error: {captured.err.split('error: ', 1)[1].strip()}"]
    assert message in captured.err
    assert os.listdir(tmp_path) == []


def test_error_through_run_sh_is_one_line(tmp_path):
    out = subprocess.run(
        ["bash", str(RUN_SH), "RTE", "--max-update", "0", "--work-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == "run.sh: error: --max-update must be > 0, got 0"


# ---------------------------------------------------------------------------------------- one folder per run
BASE = {
    "task": "RTE",
    "method": {"name": "lora", "arch": "roberta_blocks", "options": {"blocks_preset": "lora"}},
    "model": {"name": "standin", "path": "/m/model.pt", "sha256": "aa"},
    "data": {"folder": "/w/data-bin/standin/RTE", "provenance": {"raw": "/raw", "raw_sha256": {"t": "1"}}},
    "seed": 1,
    "lr": 2e-4,
    "batch": 16,
    "updates": 300,
    "clip_norm": 1.0,
    "select_on": "valid",
    "extra_args": [],
    "layout": {"nproc": 1, "batch_size": 16, "update_freq": 1},
}


def changed(path, value):
    config = json.loads(json.dumps(BASE))
    *parents, key = path.split(".")
    target = config
    for p in parents:
        target = target[p]
    target[key] = value
    return config


@pytest.mark.parametrize(
    "path,value",
    [("seed", 2), ("lr", 1e-3), ("batch", 32), ("updates", 8), ("clip_norm", 0.0), ("select_on", "valid1"),
     ("extra_args", ["--dropout", "0.2"]), ("method.options", {"blocks_preset": "lora", "lora_rank": 4}),
     ("model.sha256", "bb"), ("model.path", "/n/model.pt"), ("data.provenance.raw_sha256", {"t": "2"}), ("task", "CB")],
)  # fmt: skip
def test_hash_covers_what_defines_the_run(path, value):
    assert main_job.config_hash(changed(path, value)) != main_job.config_hash(BASE)


@pytest.mark.parametrize(
    "path,value",
    [("layout", {"nproc": 2, "batch_size": 4, "update_freq": 2}), ("data.folder", "/elsewhere"),
     ("data.provenance.raw", "/copy/of/raw"), ("model.name", "/m")],
)  # fmt: skip
def test_hash_ignores_where_and_on_how_many_devices(path, value):
    assert main_job.config_hash(changed(path, value)) == main_job.config_hash(BASE)


def test_folder_names_and_finding_runs(tmp_path):
    assert [main_job.format_lr(x) for x in (5e-3, 2e-5, 1e-05, 0.3, 1.5e-4, 1.0)] == [
        "5e-3",
        "2e-5",
        "1e-5",
        "3e-1",
        "1.5e-4",
        "1e0",
    ]
    root = tmp_path / "checkpoints" / "standin" / "RTE" / "lora"
    for name, seed in (("lr2e-4.seed1.aaaa1111", 1), ("lr2e-4.seed2.bbbb2222", 2)):
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text(json.dumps({"seed": seed, "lr": 2e-4}))
    assert main_job.find_runs(tmp_path, "standin", "RTE", "lora", seed=2) == [root / "lr2e-4.seed2.bbbb2222"]
    assert len(main_job.find_runs(tmp_path, "standin", "RTE", "lora", lr=2e-4)) == 2


def test_scores_are_numbers():
    line = "x | valid | valid on 'valid1' subset | loss 0.95 | accuracy 70 | f1 58.82 | num_updates 8 | odd n/a"
    assert {e.tag: e.stats for e in read_log(line)} == {
        "valid1": {"loss": 0.95, "accuracy": 70, "f1": 58.82, "num_updates": 8, "odd": "n/a"}
    }


# ---------------------------------------------------------------------------------------- live output
def test_eta_from_the_rate_of_updates_and_the_validation_rounds_left():
    clock = iter([100.0, 110.0, 112.0, 122.0, 150.0, 160.0]).__next__
    progress = TrainingEta(100, clock=clock)
    assert progress.annotate("epoch 001:  10 / 50 loss=1, num_updates=10, wall=20") == (
        # 90 left x 20 s / 10 (fairseq's wall); no validation round timed yet
        "epoch 001:  10 / 50 loss=1, num_updates=10, wall=20 | eta 3m00s + validation"
    )
    assert progress.annotate("num_updates=20, wall=30").endswith("| eta 1m20s + validation")  # 10 s per 10 seen
    # a validation round at update 20 takes 10 s: one every 20 updates from now on, and the last at 100
    assert progress.annotate('x | fairseq_cli.train | begin validation on "valid" subset') == (
        'x | fairseq_cli.train | begin validation on "valid" subset'
    )
    assert progress.annotate("valid on 'valid' subset | num_updates 20") == "valid on 'valid' subset | num_updates 20"
    # (150 - 100 - 10 s validating) / 40 updates = 1 s an update: 50 s, plus rounds at 60, 80, 100: 30 s
    assert progress.annotate("train | epoch 001 | num_updates 50 | wall 60").endswith("| eta 1m20s")
    # --log-format json, as run.py trains: training lines annotated, validation lines not
    json_line = 'x | train_inner | {"epoch": 1, "loss": "0.7", "num_updates": "90", "wall": "90"}'
    assert progress.annotate(json_line).endswith("| eta 16s")  # 50 s / 80 x 10 left, + the last round
    valid = 'x | valid | {"epoch": 1, "valid_accuracy": "70", "valid_num_updates": "70"}'
    assert progress.annotate(valid) == valid


def test_the_terminal_gets_fairseqs_progress_and_train_log_its_setup(capsys):
    """fairseq-train's lines as run.sh shows them: progress, checkpoints, warnings of its logger and errors
    shown; its configuration, model repr, data loading and Python warnings left to train.log, said once."""
    lines = [
        "2026-11-26 16:14:19 | INFO | fairseq_cli.train | {'_name': None, 'common': {'_name': None}}",
        "2026-11-26 16:14:20 | INFO | fairseq_idpg.models.frozen_roberta | trainable params: 147,456 || all",
        "2026-11-26 16:14:20 | INFO | fairseq_cli.train | RobertaBlocksModel(",
        "  (encoder): RobertaEncoder(",
        "  )",
        ")",
        "2026-11-26 16:14:20 | INFO | fairseq.data.data_utils | loaded 64 examples from: data/input0/valid",
        "/usr/lib/python3/torch/utils/data/dataloader.py:759: UserWarning: 'pin_memory' argument is set",
        "  super().__init__(loader)",
        '2026-11-26 16:14:22 | INFO | train_inner | {"epoch": 1, "loss": "1.028", "num_updates": "1"}',
        '2026-11-26 16:14:23 | INFO | fairseq_cli.train | begin validation on "valid" subset',
        '2026-11-26 16:14:25 | INFO | valid | {"epoch": 1, "valid_accuracy": "59.4", "valid_num_updates": "3"}',
        "2026-11-26 16:14:25 | INFO | fairseq.trainer | Saving checkpoint to x/checkpoint_1_3.pt",
        "2026-11-26 16:14:25 | INFO | fairseq.checkpoint_utils | Saved checkpoint x/checkpoint_1_3.pt (epoch 1 @ 3",
        "2026-11-26 16:14:25 | WARNING | fairseq.trainer | NaN or Inf found in input tensor.",
        "Traceback (most recent call last):",
        '  File "fairseq_cli/train.py", line 1, in <module>',
        "2026-11-26 16:14:38 | INFO | fairseq_cli.train | done training in 17.3 seconds",
    ]
    show = ConsoleFilter("RUN/train.log")
    shown = [line for line in lines if show(line + "\n")]
    assert capsys.readouterr().out == "(fairseq's setup, the model and warnings: in RUN/train.log)\n"
    assert shown == [lines[i] for i in (1, 9, 10, 11, 13, 14, 15, 16, 17)]


CHILD = (  # fairseq-like log lines, 0.4 s apart
    "import sys, time\nfor i in range(6):\n    print(f'line {i} num_updates={i + 1}, wall={i + 1}')\n"
    "    time.sleep(0.4)\n"
)


def test_output_reaches_the_log_line_by_line_while_the_command_runs(tmp_path, capsys):
    log = tmp_path / "train.log"
    sizes, done = [], threading.Event()

    def poll():
        while not done.is_set():
            sizes.append(log.stat().st_size if log.exists() else 0)
            time.sleep(0.05)

    watcher = threading.Thread(target=poll)
    watcher.start()
    try:
        seconds, _ = tee([sys.executable, "-c", CHILD], log, progress=TrainingEta(6))
    finally:
        done.set()
        watcher.join()
    final = log.stat().st_size
    assert len({s for s in sizes if 0 < s < final}) >= 3  # grew in steps while the command ran
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("line ")]
    assert len(shown) == 6 and all(" | eta " in line for line in shown)  # the terminal got them too, annotated
    assert "eta" not in log.read_text() and log.read_text().count("line ") == 6  # the log has fairseq's own lines


def test_interrupted_command_leaves_its_log(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it): exit 130, the log keeps what was printed."""
    log = tmp_path / "train.log"
    script = (
        "import sys\nfrom fairseq_idpg.run import processes as run\n"
        "try:\n"
        f"    run.tee([sys.executable, '-c', 'import time\\nprint(\"first\")\\ntime.sleep(60)'], {str(log)!r})\n"
        "except run.RunError as e:\n    print('error:', e)\n    sys.exit(130)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, cwd=REPO,
    )  # fmt: skip
    # wait for the event (the command's first line in the log), however loaded the machine: the
    # limits only stop a broken run from hanging the suite
    deadline = time.time() + 600
    while not (log.exists() and "first" in log.read_text()):
        assert proc.poll() is None and time.time() < deadline, "the command never wrote its first line"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130, out
    assert "error: interrupted;" in out and "the same command resumes" in out
    assert log.read_text().splitlines()[0] == "first"  # then whatever the command printed as it stopped


def test_a_command_run_in_this_process_logs_and_fails_as_its_own_process_would(tmp_path, capsys):
    """``tee_here`` (fairseq-validate in run.sh's process): its logging at INFO in fairseq's format (also under the
    launcher's quieted fairseq loggers), stdout and stderr reach the log and the returned output, not the
    terminal; a one-line refusal is a Refused, a crash a RunError naming the exit status with the traceback in the
    log, Ctrl-C an Interrupted; this process's argv, logging and signal handlers are as before each time."""
    import logging

    from fairseq_idpg.errors import Interrupted, RunError
    from fairseq_idpg.logs import quiet_setup_logs
    from fairseq_idpg.run.processes import Refused, tee_here

    def state():
        root, handlers = logging.getLogger(), (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
        return list(sys.argv), root.handlers[:], root.level, logging.getLogger("fairseq").level, handlers

    quiet_setup_logs()
    before = state()

    def scores():
        logging.getLogger("fairseq.logging.progress_bar").info('{"loss": "1.5"}')
        print("argv", sys.argv[1:])
        print("a warning", file=sys.stderr)

    seconds, out = tee_here(["fairseq-validate", "data", "--cpu"], scores, tmp_path / "ok.log")
    assert '| INFO | fairseq.logging.progress_bar | {"loss": "1.5"}' in out and "argv ['data', '--cpu']" in out
    assert "a warning" in out and (tmp_path / "ok.log").read_text() == out and seconds >= 0
    shown = capsys.readouterr()
    assert shown.out == "+ fairseq-validate data --cpu\n" and shown.err == ""

    def refuses():
        print("usage: fairseq-validate ...", file=sys.stderr)
        print("fairseq-validate: error: --path: no such file", file=sys.stderr)
        sys.exit(2)

    with pytest.raises(Refused, match="^--path: no such file$"):
        tee_here(["fairseq-validate"], refuses, tmp_path / "refused.log")

    def crashes():
        raise KeyError("the bug")

    with pytest.raises(RunError, match="exit code 1: fairseq-validate") as failed:
        tee_here(["fairseq-validate"], crashes, tmp_path / "crash.log")
    assert "KeyError: 'the bug'" in str(failed.value) and "Traceback" in (tmp_path / "crash.log").read_text()

    def interrupted():
        print("first")
        raise KeyboardInterrupt

    with pytest.raises(Interrupted, match="the same command resumes"):
        tee_here(["fairseq-validate"], interrupted, tmp_path / "stopped.log")
    assert (tmp_path / "stopped.log").read_text() == "first\n"
    assert state() == before and before[3] == logging.WARNING


def test_a_script_run_in_this_process_says_and_fails_as_its_own_process_would(capsys):
    """``call_here`` (prepare_data.py in run.sh's process): ``+`` and the command, its main given the script's
    arguments; its stderr said after it, but a one-line refusal only as a Refused (run.sh says it once); Ctrl-C or
    SIGTERM (SystemExit 143 from the script's handlers) an Interrupted after the script's own line; a crash a
    RunError with the traceback on stderr."""
    from fairseq_idpg.errors import Interrupted, RunError
    from fairseq_idpg.run.processes import Refused, call_here

    cmd = ["python3", "scripts/prepare_data.py", "SST-2", "--out", "data"]
    given = []
    assert call_here(cmd, lambda argv: given.append(argv) or print("note", file=sys.stderr) or 0) >= 0
    assert given == [["SST-2", "--out", "data"]]
    said = capsys.readouterr()
    assert said.out == "+ python3 scripts/prepare_data.py SST-2 --out data\n" and said.err == "note\n"

    def refuses(argv):
        print("prepare_data.py: error: --raw x: not found", file=sys.stderr)
        return 2

    with pytest.raises(Refused, match=r"^--raw x: not found$"):
        call_here(cmd, refuses)
    assert capsys.readouterr().err == ""

    def stopped(code):
        def main(argv):
            print("interrupted: prepare_data SST-2 --out data: nothing finished yet", file=sys.stderr)
            raise SystemExit(code) if code else KeyboardInterrupt

        return main

    for code in (143, None):
        with pytest.raises(Interrupted, match=r"^interrupted: prepare_data.py; the same command resumes$"):
            call_here(cmd, stopped(code))
        assert capsys.readouterr().err == "interrupted: prepare_data SST-2 --out data: nothing finished yet\n"

    with pytest.raises(RunError, match="exit code 1: python3 scripts/prepare_data.py"):
        call_here(cmd, lambda argv: {}["missing"])
    assert "KeyError: 'missing'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- data provenance
def test_data_prepared_again_when_its_raw_files_or_bpe_differ(shared_data, tiny, tmp_path, capsys):
    sst2 = shared_data / "glue" / "SST-2"
    first = write_slice(tmp_path / "raw1", sst2, {"train.tsv": 20, "dev.tsv": 8})
    data = tmp_path / "data-bin" / "SST-2"
    bpe = ["--bpe", "wordpiece", "--vocab", tiny.folder / "vocab.txt"]

    info, reasons, _, seconds = prepare_if_needed("SST-2", first, data, bpe)
    assert reasons == ["not prepared yet"] and seconds is not None and info.splits == {"train": 20, "valid": 8}
    recorded = info.provenance
    assert recorded["raw"] == str(first.resolve()) and recorded["bpe"] == "wordpiece"
    assert set(recorded["raw_sha256"]) == {"train.tsv", "dev.tsv"} and set(recorded["bpe_sha256"]) == {"vocab.txt"}

    assert prepare_if_needed("SST-2", first, data, bpe)[1:4:2] == ([], None)  # up to date: kept
    copy = shutil.copytree(first, tmp_path / "copy")  # the same files elsewhere: the same data
    assert prepare_if_needed("SST-2", copy, data, bpe)[1] == []

    other = write_slice(tmp_path / "raw2", sst2, {"train.tsv": 30, "dev.tsv": 8})
    info, reasons, _, seconds = prepare_if_needed("SST-2", other, data, bpe)
    assert reasons == [
        f"raw file(s) train.tsv differ by sha256 (prepared from {first.resolve()}, now {other.resolve()})"
    ]
    assert info.splits["train"] == 30 and info.provenance["raw"] == str(other.resolve())
    assert "preparing " + str(data) + " again: raw file(s) train.tsv differ" in capsys.readouterr().out

    # another vocabulary (the same file name): the BPE files differ
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "vocab.txt").write_text((tiny.folder / "vocab.txt").read_text() + "extra-token\n")
    bpe = [*bpe[:3], tmp_path / "v" / "vocab.txt"]
    reasons = prepare_if_needed("SST-2", other, data, bpe)[1]
    assert reasons == ["the wordpiece BPE files (vocab.txt) differ by sha256"]

    # sampling is part of it too, and a folder that is not prepared data is never replaced
    few = prepare_if_needed("SST-2", other, data, bpe, dev_from_train=5, data_seed=3)
    assert few[1] == ["--dev-from-train None -> 5", "sampling seed None -> 3"] and few[0].splits["valid"] == 5
    stranger = tmp_path / "notdata"
    stranger.mkdir()
    (stranger / "keep.txt").write_text("x")
    with pytest.raises(main_job.RunError, match="exists but holds no task.json"):
        prepare_if_needed("SST-2", other, stranger, bpe)
    assert os.listdir(stranger) == ["keep.txt"]


def test_prepare_overwrite_replaces_only_prepared_data(tmp_path, tiny):
    from fairseq_idpg.preprocessing import PrepareError, prepare

    out = tmp_path / "bin"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(PrepareError, match="not a prepared data folder .no task.json.: --overwrite replaces only"):
        prepare("SST-2", tmp_path / "raw", out, bpe="wordpiece", vocab=str(tiny.folder / "vocab.txt"), overwrite=True)
    assert os.listdir(out) == ["keep.txt"]


def test_damaged_checkpoint_last_names_the_file_and_counts_the_newest_intact_one(tmp_path, capsys):
    """A truncated checkpoint_last.pt: the updates (finished or not) are those of the newest intact
    checkpoint, which fairseq-train resumes from; none left: one line (was a PyTorch stream error)."""
    for name, updates in [("checkpoint_best.pt", 3), ("checkpoint_1_4.pt", 4), ("checkpoint_last.pt", 6)]:
        torch.save({"optimizer_history": [{"num_updates": updates}], "extra_state": {"train_iterator": {}}},
                   tmp_path / name)  # fmt: skip
    last = tmp_path / "checkpoint_last.pt"
    assert checkpoint_updates(last) == (6, last)
    last.write_bytes(last.read_bytes()[:100])
    assert checkpoint_updates(last) == (4, tmp_path / "checkpoint_1_4.pt")
    out = capsys.readouterr().out
    assert out.startswith(f"warning: {last} is damaged (truncated or unreadable: ") and out.endswith(
        f"; 100 bytes); the newest intact checkpoint is {tmp_path / 'checkpoint_1_4.pt'}\n"
    )
    for name in ("checkpoint_best.pt", "checkpoint_1_4.pt"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(main_job.RunError, match=r"is damaged .* and no intact checkpoint is left; --restart trains"):
        checkpoint_updates(last)


# ---------------------------------------------------------------------------------------- end to end (slow)
@pytest.fixture(scope="module")
def first_run(shared_data, standin_model, tmp_path_factory):
    """Seed 1, polling train.log's size while fairseq-train runs."""
    work = tmp_path_factory.mktemp("run")
    raw = write_slice(work / "raw", shared_data / "glue" / "SST-2", {"train.tsv": 64, "dev.tsv": 16})
    began = time.time()
    proc = start(work, raw, log=work / "first.out")
    sizes = []
    while proc.poll() is None:
        logs = list((work / "checkpoints").glob("standin/SST-2/lora/*/train.log"))
        sizes.append(logs[0].stat().st_size if logs else 0)
        time.sleep(0.2)
    out = finish(proc, work / "first.out")
    (folder,) = main_job.find_runs(work, "standin", "SST-2", "lora")
    tensors, _ = trained(folder)
    print(f"first run: {time.time() - began:.0f} s")
    return {"work": work, "raw": raw, "folder": folder, "out": out, "sizes": sizes, "tensors": tensors}


@pytest.mark.slow
@pytest.mark.xdist_group("run-first")  # one worker: first_run trains once
def test_first_run_live_log_results_and_folder(first_run):
    folder, out, sizes = first_run["folder"], first_run["out"], first_run["sizes"]
    assert re.fullmatch(r"lr2e-4\.seed1\.[0-9a-f]{8}", folder.name)
    final = (folder / "train.log").stat().st_size
    assert len({s for s in sizes if 0 < s < final}) >= 5  # train.log grew while fairseq-train ran
    assert re.search(r'"num_updates": "3", .* \| eta \d+[hms]', out)  # progress with the time left on the terminal
    results = json.loads((folder / "results.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    assert results["config"] == config and config["seed"] == 1 and config["updates"] == 6 and config["batch"] == 8
    # a run option that is also fairseq-train's flag stays where it was given: the folder a run that passed it
    # through before it became an option was named by (tests/test_run_config.py pins that hash)
    assert config["extra_args"] == ["--validate-interval-updates", "3"] and "validate_interval_updates" not in config
    assert folder.name.endswith(main_job.config_hash(config))
    assert results["seed"] == 1 and isinstance(results["score"], float)
    assert all(isinstance(v, (int, float)) for v in results["results"]["valid"].values())
    assert all(isinstance(v, float) for v in results["timings"].values()) and results["timings"]["train"] > 0
    assert results["device"] == (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
    validated = validate_scores((folder / "validate.log").read_text(), ["valid"])
    assert results["score"] == validated["valid"]["accuracy"]  # what fairseq-validate printed
    trained = validations((folder / "train.log").read_text())  # fairseq-train's --log-format json lines
    assert results["score"] == max(e.stats["accuracy"] for e in trained)  # checkpoint_best was scored
    assert [(c["updates"], c["accuracy"]) for c in results["curve"]] == [
        (3, trained[0].stats["accuracy"]),
        (6, trained[1].stats["accuracy"]),
    ]
    git = results["git"]
    assert git is None or (re.fullmatch(r"[0-9a-f]{40}", git["commit"]) and git["dirty"] in (True, False))
    assert results["command"].startswith("scripts/run.sh SST-2 --raw ")
    assert sorted(p.name for p in folder.glob("checkpoint*.pt")) == ["checkpoint_best.pt", "checkpoint_last.pt"]
    assert any("lora" in k for k in first_run["tensors"])


@pytest.mark.slow
@pytest.mark.xdist_group("run-first")  # one worker: first_run trains once
def test_same_command_again_reports_the_result_without_training(first_run, capsys, monkeypatch):
    """run.sh's command again, in this process (what it reads and prints is checked here; a run.sh process
    reports the cached run in test_a_changed_preset_trains_a_new_run_never_the_cached_one). Its data prepared and
    its raw folder found, the request is planned once (check's dry plan is the run's), and planning's lines said."""
    folder, work = first_run["folder"], first_run["work"]
    log_before = (folder / "train.log").stat()
    plans = counted_plans(monkeypatch)
    assert main_job.main(["SST-2", "--raw", str(first_run["raw"]), "--work-dir", str(work), *SMALL]) == 0
    printed = capsys.readouterr()
    out = printed.out + printed.err
    assert len(plans) == 1 and f"run folder: {folder}\n" in out and "SST-2 | method lora" in out
    assert "cached: this configuration finished on" in out and str(folder / "results.json") in out
    score = json.loads((folder / "results.json").read_text())["score"]
    assert f"accuracy {score}" in out
    assert "fairseq_idpg.launch" not in out and "fairseq-validate" not in out  # nothing ran
    assert (folder / "train.log").stat().st_mtime_ns == log_before.st_mtime_ns


@pytest.mark.slow
@pytest.mark.xdist_group("run-first")  # one worker: first_run trains once
def test_another_seed_trains_in_its_own_folder(first_run):
    work, folder = first_run["work"], first_run["folder"]
    before = (folder / "checkpoint_last.pt").stat().st_mtime_ns
    proc = start(work, first_run["raw"], "--seed", "2", log=work / "seed2.out")
    finish(proc, work / "seed2.out")
    (second,) = main_job.find_runs(work, "standin", "SST-2", "lora", seed=2)
    assert second != folder and second.name.startswith("lr2e-4.seed2.")
    assert "No existing checkpoint found" in (second / "train.log").read_text()  # never read seed 1's checkpoint
    ours, _ = trained(second)
    assert ours.keys() == first_run["tensors"].keys()
    assert not all(torch.equal(ours[k], first_run["tensors"][k]) for k in ours)
    assert (folder / "checkpoint_last.pt").stat().st_mtime_ns == before


@pytest.mark.slow
@pytest.mark.xdist_group("run-first")  # one worker: first_run trains once
def test_reprepares_when_raw_differs(first_run, tmp_path, capsys):
    """run.sh's dry run (in this process: the plan, not the process, is checked here) over raw files other than
    the prepared data's says they would be prepared again."""
    other = write_slice(tmp_path / "raw", first_run["raw"], {"train.tsv": 40, "dev.tsv": 16})
    code = main_job.main(["SST-2", "--raw", str(other), "--work-dir", str(first_run["work"]), *SMALL, "--dry-run"])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    assert "would be prepared (raw file(s) train.tsv differ by sha256" in out.out
    assert "prepare_data.py SST-2 --raw " + str(other) in out.out and "--overwrite" in out.out


@pytest.mark.slow
@pytest.mark.xdist_group("run-first")  # one worker: first_run trains once
def test_kill_then_the_same_command_resumes_to_the_same_weights(first_run):
    """--restart, kill -9 once the update-3 checkpoint is written; the same command resumes from it and
    ends with the tensors of the uninterrupted run (CPU, same seed: dropout is seeded per update)."""
    work, folder = first_run["work"], first_run["folder"]
    proc = start(work, first_run["raw"], "--restart", log=work / "killed.out")
    deadline = time.time() + 600
    while (folder / "results.json").exists() and time.time() < deadline:  # --restart removes the folder first
        time.sleep(0.05)
    while not (folder / "checkpoint_last.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _, state = trained(folder)
    assert state["optimizer_history"][-1]["num_updates"] == 3 and not (folder / "results.json").exists()
    logged = [e.stats["num_updates"] for e in read_log((folder / "train.log").read_text()) if e.tag == "train_inner"]
    assert 3 in logged  # the killed run's log is kept

    proc = start(work, first_run["raw"], log=work / "resumed.out")
    out = finish(proc, work / "resumed.out")
    assert f"resuming from {folder / 'checkpoint_last.pt'} at update 3 of 6" in out
    resumed, state = trained(folder)
    assert state["optimizer_history"][-1]["num_updates"] == 6
    assert resumed.keys() == first_run["tensors"].keys()
    assert all(torch.equal(resumed[k], first_run["tensors"][k]) for k in resumed)
    log = (folder / "train.log").read_text()
    updates = {e.stats["num_updates"] for e in read_log(log) if e.tag == "train_inner"}
    assert log.count("# ") >= 2 and {1, 6} <= updates  # both sessions


# what an edit of methods.py does to every process of a run (run.sh, fairseq-train, fairseq-validate)
LORA_RANK_4 = """import dataclasses
from fairseq_idpg import methods
lora = methods.METHODS["lora"]
methods.METHODS["lora"] = dataclasses.replace(lora, preset={**lora.preset, "lora_rank": 4})
"""


@pytest.mark.slow
@pytest.mark.xdist_group("run-first")  # one worker: first_run trains once
def test_a_changed_preset_trains_a_new_run_never_the_cached_one(first_run, tmp_path):
    """The lora record's preset changed (rank 16 -> 4): the same scripts/run.sh command trains a new run in a
    new folder, where it reported the rank-16 run's score as cached before the preset was part of the hash."""
    work = tmp_path / "work"  # a copy of the finished run: the other tests find one run in first_run's
    shutil.copytree(first_run["work"] / "data-bin", work / "data-bin")
    cached = work / first_run["folder"].relative_to(first_run["work"])
    shutil.copytree(first_run["folder"], cached)
    out = finish(start(work, first_run["raw"], log=tmp_path / "same.out"), tmp_path / "same.out", timeout=300)
    assert "cached: this configuration finished on" in out  # the copy is the finished run

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(LORA_RANK_4)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")])),
    }
    out = finish(start(work, first_run["raw"], log=tmp_path / "rank4.out", env=env), tmp_path / "rank4.out")
    assert "cached:" not in out
    (new,) = [f for f in main_job.find_runs(work, "standin", "SST-2", "lora") if f != cached]
    assert new.name.startswith("lr2e-4.seed1.") and new.name != cached.name
    config = json.loads((new / "config.json").read_text())
    assert config["method"]["settings"]["lora_rank"] == 4 and config["extra_args"] == [
        "--validate-interval-updates",
        "3",
    ]
    tensors, _ = trained(new)
    assert {v.shape[0] for k, v in tensors.items() if k.endswith(".A")} == {4}  # the rank-4 model trained
    assert json.loads((cached / "results.json").read_text())["config"]["method"].get("settings", {}).get(
        "lora_rank"
    ) in (None, 16)


# ---------------------------------------------------------------------------------------- divergence
def train_line(updates, loss, tag="train_inner"):
    stats = {"epoch": 1, "update": f"{updates}.0", "loss": loss, "num_updates": str(updates), "lr": "1e+06"}
    return f"2026-01-01 00:00:00 | INFO | {tag} | {json.dumps(stats)}\n"


@pytest.mark.parametrize(
    "log,expected",
    [
        # what `run.sh RTE --method prompt-tuning-5 --lr 1e6 --max-update 4` logged: finite train loss, NaN on dev
        (train_line(3, "1.7e+16") + train_line(4, "2.65614e+17") + train_line(4, "nan", tag="valid"),
         {"update": 4, "reason": "valid loss nan"}),
        (train_line(1, "0.69") + train_line(2, "inf"), {"update": 2, "reason": "train_inner loss inf"}),
        # fp32 NaN/Inf gradients, and fp16's loss scale at its minimum: fairseq stops with a traceback
        (train_line(5, "0.7") + "Traceback (most recent call last):\nFloatingPointError: gradients are Nan/Inf\n",
         {"update": 6, "reason": "gradients are Nan/Inf"}),
        ("FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding.\n",
         {"update": 1, "reason": "Minimum loss scale reached (0.0001). Your loss is probably exploding."}),
        # the compat layer's one line names the update (here one with no loss logged before it)
        (train_line(1, "0.7") + "FloatingPointError: gradients are Nan/Inf at update 3 (lr 1e+06 is likely too high: "
         "try a lower --lr)\n", {"update": 3, "reason": "gradients are Nan/Inf"}),
        # fp16's normal skipped updates, and a large but finite loss, are not divergence
        (train_line(1, "0.7") + "NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0\n"
         + train_line(2, "3e+38"), None),
    ],
)  # fmt: skip
def test_divergence_is_read_from_the_training_log(tmp_path, log, expected):
    (tmp_path / "train.log").write_text(log)
    assert divergence(tmp_path / "train.log") == expected
    assert divergence(tmp_path / "absent.log") is None


def test_a_diverged_run_is_a_result_without_a_score(tmp_path, capsys, monkeypatch):
    """execute(): fairseq-train's nan (here a fake train that logs it) gives one line, results.json marked
    diverged with no score and no fairseq-validate, crash.pt removed; the same command then reports it cached."""
    plan = types.SimpleNamespace(
        folder=tmp_path / "run", request=types.SimpleNamespace(restart=False, model="standin", method="lora", seed=1),
        config={"updates": 4, "batch": 16, "lr": 1e6, "metric": "accuracy", "select_on": "valid", "layout": None},
        task="RTE", timings={}, start=time.time(), argv=["RTE", "--lr", "1e6"], memory=None,
    )  # fmt: skip

    def diverging_train(p, lock=None):
        (p.folder / "train.log").write_text(train_line(4, "nan", tag="valid"))
        (p.folder / "crash.pt").write_bytes(b"state")
        raise main_job.RunError("command failed with exit code 1: fairseq-train ...")

    monkeypatch.setattr(execution, "train", diverging_train)
    monkeypatch.setattr(execution, "score", lambda p: pytest.fail("a diverged run is not scored"))
    assert main_job.execute(plan) == 0
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        "diverged at update 4 (lr 1e+06): valid loss nan; results.json records it without a score "
        "(--restart trains it again)"
    )
    record = json.loads((plan.folder / "results.json").read_text())
    assert record["diverged"] == {"update": 4, "reason": "valid loss nan"}
    assert record["score"] is None and record["results"] == {} and not (plan.folder / "crash.pt").exists()
    assert main_job.execute(plan) == 0
    out = capsys.readouterr().out
    assert "cached: this configuration finished" in out and "diverged at update 4 (lr 1e+06)" in out


def test_a_fresh_clone_builds_the_standin_before_its_first_run_is_checked(
    glue_slices, standin_model, tmp_path, monkeypatch
):
    """scripts/run.sh in a fresh clone (no models/ yet): the stand-in is built first, since its vocab.txt is
    what prepares the data; the check once refused such a run in one line naming that vocab.txt as missing.
    A dry run builds nothing."""
    monkeypatch.setenv("GLUE_DIR", str(glue_slices))
    folder = tmp_path / "models" / "minilm-l6-fairseq"
    monkeypatch.setattr(layout, "STANDIN_DIR", folder)
    built = []

    def build(cmd, log=print):  # scripts/build_standin.sh FOLDER, without its 25 s: the built files
        assert Path(cmd[1]).name == "build_standin.sh" and Path(cmd[2]) == folder
        built.append(cmd)
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("model.pt", "dict.txt", "vocab.txt"):
            shutil.copy(standin_model / name, folder / name)
        return 0.0

    monkeypatch.setattr(backbone, "call", build)
    argv = ["RTE", "--method", "prompt-tuning-5", "--max-update", "2", "--work-dir", str(tmp_path / "work")]
    assert main_job.check(main_job.parse_args([*argv, "--dry-run"])).missing == []  # the stand-in: not missing
    assert built == [] and not folder.exists()
    missing = main_job.check(main_job.parse_args(argv)).missing
    assert len(built) == 1 and (folder / "model.pt").is_file() and missing == []


def test_a_run_folder_in_use_by_another_process_is_refused(tmp_path, monkeypatch):
    """Two processes on one configuration (a second sweep, a second run.sh) would write the same
    checkpoints: while another process holds the run folder, execute() stops with one line and writes
    nothing; once that process has ended (its lock goes with it), the same plan trains."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text("the other process's\n")
    with held_by_another_process(folder):
        plan = types.SimpleNamespace(
            folder=folder, request=types.SimpleNamespace(restart=True, model="standin", method="lora", seed=1),
            config={"updates": 4, "layout": None}, timings={}, argv=["RTE"],
        )  # fmt: skip
        monkeypatch.setattr(execution, "train", lambda p, lock=None: pytest.fail("trained a folder in use"))
        with pytest.raises(InUse) as refused:  # run.py's exit status 75, which a sweep skips
            main_job.execute(plan)
        assert str(refused.value) == (
            f"{folder} is in use: another process (a sweep, run.sh, or a trainer still running from an earlier "
            "one) is training or scoring it; wait for it to end, or stop it first"
        )
        assert (folder / "config.json").read_text() == "the other process's\n"  # not even --restart touched it
    trained = []
    monkeypatch.setattr(execution, "train", lambda p, lock=None: trained.append(p.folder))
    monkeypatch.setattr(execution, "score", lambda p: (_ for _ in ()).throw(main_job.RunError("scored")))
    with pytest.raises(main_job.RunError, match="^scored$"):
        main_job.execute(plan)  # --restart emptied the folder (its lock kept) and trained it
    assert trained == [folder] and json.loads((folder / "config.json").read_text()) == plan.config
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "config.json"]
