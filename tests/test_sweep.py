"""Sweeps (fairseq_idpg/sweep.py): specifications and the run counts the examples' READMEs state, one-line
errors, the plan, device slots, progress, the Slurm job array submitit would submit; end to end (slow):
6 stand-in runs with 2 workers, interrupted and resumed without rerunning finished runs, then the table,
its numbers and plots (the Slurm path on a real cluster: test_slurm.py)."""

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lock_support import held_by_another_process
from preloaded_support import preloaded

from fairseq_idpg import run as main_job
from fairseq_idpg import sweep, sweep_progress, sweep_slurm
from fairseq_idpg.methods import METHODS
from fairseq_idpg.results.records import default_budget
from fairseq_idpg.run.execution import RUN_LOCK

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*/*.yaml"))


def write_spec(tmp_path, text, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------------------- specifications
def readme_counts():
    """{spec file: the run count its folder's README states} from the README's spec tables."""
    counts = {}
    for readme in (REPO / "examples").glob("*/README.md"):
        for line in readme.read_text().splitlines():
            m = re.match(r"\|\s*`([\w.-]+\.yaml)`\s*\|.*\|\s*([^|]*?)\s*\|\s*$", line)
            if m:
                numbers = re.findall(r"\d[\d,]*", m.group(2))
                # the spec table comes first (a later GPU-cost table names the specs again)
                counts.setdefault(readme.parent / m.group(1), int(numbers[-1].replace(",", "")))
    return counts


def test_every_example_loads_and_its_readme_states_its_run_count():
    counts = readme_counts()
    assert EXAMPLES and set(counts) == set(EXAMPLES), sorted(set(map(str, EXAMPLES)) ^ set(map(str, counts)))
    for path in EXAMPLES:
        spec = sweep.load_spec(path)
        assert len(spec.runs) == counts[path], path
        assert all(r.method in METHODS for r in spec.runs)
        assert len({(r.task, r.label, r.budget, r.lr, r.seed) for r in spec.runs}) == len(spec.runs)  # no repeats


def test_idpg_table1_count_follows_the_lr_grids():
    spec = sweep.load_spec(REPO / "examples" / "idpg" / "table1.yaml")
    per_label = {}
    for r in spec.runs:
        per_label[r.label] = per_label.get(r.label, 0) + 1
    for label, n in per_label.items():
        grid = METHODS[label].recipe.lr_grid
        assert n == 10 * 5 * (len(grid) or 1), label  # tasks x seeds x lrs
    assert len(spec.runs) == sum(per_label.values())


def test_spec_values(tmp_path):
    path = write_spec(
        tmp_path,
        """
name: s
tasks: [rte, SST-2]
methods:
  - lora
  - {label: pt-long, method: prompt-tuning-5, args: [--prompt-length, 7], lrs: [3e-2, 1.0e-1], seeds: [4]}
lrs: recipe
seeds: [1, 2]
budget: {few_shot: [16, 32], data_seed: 9}
max_update: 5
args: [--dropout, 0]
""",
    )
    spec = sweep.load_spec(path)
    lora = [r for r in spec.runs if r.label == "lora"]
    assert len(lora) == 2 * 2 * 2 and {r.lr for r in lora} == {None} and {r.data_seed for r in lora} == {9}
    long = [r for r in spec.runs if r.label == "pt-long"]
    assert len(long) == 2 * 2 * 2 and {r.lr for r in long} == {3e-2, 1e-1} and {r.seed for r in long} == {4}
    assert long[0].extra_args == ("--dropout", "0", "--prompt-length", "7") and long[0].max_update == 5
    argv = long[0].argv("standin", "/w")
    assert argv[:6] == ["RTE", "--method", "prompt-tuning-5", "--model", "standin", "--seed"]
    for pair in (["--few-shot", "16"], ["--data-seed", "9"], ["--max-update", "5"], ["--lr", "0.03"]):
        assert any(argv[i : i + 2] == pair for i in range(len(argv))), pair
    # a per-task K: one table budget; the sample follows the seed on every task
    per_task = write_spec(
        tmp_path,
        "name: t\ntasks: [SST-2, CR]\nmethods: [lora, dpt]\nseeds: [1, 2]\n"
        "budget: {few_shot: {default: 1000, CR: 775}}\n",
        "per-task.yaml",
    )
    runs = sweep.load_spec(per_task).runs
    assert {(r.task, r.few_shot) for r in runs} == {("SST-2", 1000), ("CR", 775)}
    assert {r.budget for r in runs} == {"K=1000 (CR: 775)"} and all(r.data_seed == r.seed for r in runs)
    assert default_budget(runs[0].budget) == "K=1000"  # the results command's reading of the name: K's paper numbers
    # narrowing: tasks, labels, seeds; max_update overridden
    spec = sweep.load_spec(path, tasks=["RTE"], methods=["lora"], seeds=[2], max_update=9)
    assert [(r.task, r.label, r.seed, r.max_update) for r in spec.runs] == [("RTE", "lora", 2, 9)] * 2


VALID_LR = "is not a positive number (valid: finite numbers > 0, e.g. 1e-3)"


@pytest.mark.parametrize(
    "line,said",
    [
        ("lrs: [.inf]", f"lora: lrs: inf {VALID_LR}"),
        ("lrs: [.nan]", f"lora: lrs: nan {VALID_LR}"),
        ("lrs: [-1.0e-3]", f"lora: lrs: -0.001 {VALID_LR}"),
        ("lrs: [0]", f"lora: lrs: 0 {VALID_LR}"),
        ("head_lrs: [.inf]", f"lora: head_lrs: inf {VALID_LR}"),
        ("seeds: [-1]", "lora: seeds: -1 is too small (valid: integers >= 0)"),
        ("seeds: [1.5]", "lora: seeds: 1.5 is not an integer (valid: integers >= 0)"),
        ("max_update: 0", "lora: max_update: 0 is too small (valid: integers >= 1)"),
        ("budget: {few_shot: -3}", "budget.few_shot (default): -3 is too small (valid: integers >= 1)"),
        ("budget: {dev_from_train: x}", "budget.dev_from_train: 'x' is not an integer (valid: integers >= 1)"),
        ("budget: {few_shot: 16, data_seed: -2}", "budget.data_seed: -2 is too small (valid: integers >= 0)"),
    ],
)
def test_a_spec_number_that_cannot_be_right_is_one_line_naming_the_file_and_key(tmp_path, capsys, line, said):
    path = write_spec(tmp_path, f"name: s\ntasks: [RTE]\nmethods: [lora]\n{line}\n")
    before = sorted(tmp_path.rglob("*"))
    assert sweep.main([str(path), "--work-dir", str(tmp_path), "--dry-run"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"sweep: error: {path}: {said}"]
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    "text, said",
    [
        ("name: s\ntasks: [RTE]\nmethods: [lora]\nlrs: [.inf]\n", f"lora: lrs: inf {VALID_LR}"),
        (
            "name: s\ntasks: [RTE]\nseeds: [1]\nmethods: [lora]\nseeds: [1, 2]\n",
            "line 5: the key 'seeds' is written twice in one mapping (keep one)",
        ),
    ],
)
def test_sweep_sh_refuses_a_bad_spec_in_one_line(tmp_path, text, said):
    """As a user runs it: scripts/sweep.sh SPEC --dry-run, exit 2, one line, nothing written (in a fork of an
    interpreter that imported the package once, tests/preloaded_support.py: what the command alone prints, as
    tests/test_docs_commands.py checks; a process of its own where it cannot fork)."""
    path = write_spec(tmp_path, text)
    argv = ["bash", str(REPO / "scripts" / "sweep.sh"), str(path), "--dry-run"]
    run = preloaded.run(argv, cwd=tmp_path, env=dict(os.environ)) or subprocess.run(
        argv, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert run.returncode == 2 and run.stderr.splitlines() == [f"sweep: error: {path}: {said}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: s\ntasks: [RTE]\nmethods: [lora]\nseed: [1]\n", "unknown key 'seed'; valid: args, budget,"),
        ("name: s\ntasks: [RTE]\nmethods: [lorra]\n", "unknown method 'lorra'; valid: "),
        ("name: s\ntasks: [XNLI]\nmethods: [lora]\n", "unknown task 'XNLI'; valid: SST-2"),
        ("name: s\ntasks: [RTE]\nmethods: [lora, lora]\n", "the label 'lora' is used twice"),
        ("name: s\ntasks: [RTE]\nmethods: [lora]\nlrs: [0]\n", "lrs: 0 is not a positive number"),
        ("name: s\ntasks: [RTE]\nmethods: [lora]\nlrs: best\n", "lrs 'best'; valid: paper, recipe"),
        ("name: s\ntasks: [RTE]\nmethods: [lora]\nseeds: [one]\n", "'one' is not an integer"),
        ("name: s\ntasks: [RTE]\nmethods: [lora]\nbudget: {k: 5}\n", "budget: unknown key 'k'"),
        ("name: s\ntasks: [RTE]\nmethods: [lora]\nbudget: half\n", "budget 'half'; valid: full"),
        ("name: s\nmethods: [lora]\n", "'tasks' is missing"),
        ("name: s\ntasks: [RTE\n", "not valid YAML"),
        ("name: s\ntasks: [RTE]\nmethods: [lora]\nseeds: [1]\nseeds: [2]\n", "line 5: the key 'seeds' is written"),
        ("name: s\ntasks: [RTE]\nmethods: [lora]\nmax_update: 3\nmax_update: 4\n", "line 5: the key 'max_update' is"),
        ("name: s\ntasks: [RTE]\nmethods:\n  - {method: lora, label: a, label: b}\n", "line 4: the key 'label' is"),
        ("name: s\ntasks: [RTE]\nmethods: [{method: lora, lr: 1}]\n", "unknown key 'lr'"),
        (
            "name: s\ntasks: [RTE]\nmethods: [lora]\nargs: [--total-batch, x]\n",
            "lora: args: argument --total-batch: invalid int value: 'x'",
        ),
    ],
)
def test_bad_specifications_are_one_line_errors(tmp_path, capsys, text, message):
    path = write_spec(tmp_path, text)
    assert sweep.main([str(path), "--work-dir", str(tmp_path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sweep: error: ") and message in err and "\n" not in err, err
    assert not (tmp_path / "sweeps").exists() and not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--jobs", "0"], "--jobs must be >= 1, got 0"),
        (["--runs-per-gpu", "-1"], "--runs-per-gpu must be >= 1"),
        (["--seeds", "1,x"], "--seeds '1,x': comma-separated integers"),
        (["--tasks", "RTF"], "--tasks: unknown task 'RTF'"),
        (["--methods", "dpt"], "no run left"),
        (["--model", "models/roberta.large-mnli"], "not found (scripts/convert_hf_to_fairseq.py or examples/idpg/"),
    ],
)
def test_bad_flags_are_one_line_errors(tmp_path, capsys, flags, message):
    path = write_spec(tmp_path, "name: s\ntasks: [RTE]\nmethods: [lora]\n")
    assert sweep.main([str(path), "--work-dir", str(tmp_path), "--dry-run", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err


def test_a_work_dir_that_is_a_file_or_read_only_is_one_line_before_anything_is_written(tmp_path, capsys, monkeypatch):
    spec = write_spec(tmp_path, "name: s\ntasks: [RTE]\nmethods: [lora]\n")
    afile = tmp_path / "afile"
    afile.write_text("")
    before = sorted(tmp_path.rglob("*"))
    for work, dry in [(afile, ["--dry-run"]), (afile, []), (afile / "sub", [])]:
        assert sweep.main([str(spec), "--work-dir", str(work), *dry]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"sweep: error: --work-dir {work}") and "is a file, not a folder" in err, err
        assert "\n" not in err
    import fairseq_idpg.run.cli as run_cli

    read_only = tmp_path / "ro"
    read_only.mkdir()
    monkeypatch.setattr(run_cli, "writable", lambda folder: folder != read_only)  # root writes anywhere
    assert sweep.main([str(spec), "--work-dir", str(read_only)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"sweep: error: --work-dir {read_only} is read-only ({read_only} cannot be written); "
        "give a folder you can write"
    )
    assert sorted(tmp_path.rglob("*")) == sorted([*before, read_only])
    assert sweep.main([str(spec), "--work-dir", str(read_only), "--dry-run"]) == 0  # a plan writes nothing


def test_dry_run_prints_every_run_with_its_budget_and_runs_nothing(tmp_path, capsys):
    spec = REPO / "examples" / "inducer" / "nlu.yaml"
    assert sweep.main([str(spec), "--model", "roberta.large", "--work-dir", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    runs = [line for line in out.splitlines() if " -> " in line]
    assert len(runs) == len(sweep.load_spec(spec).runs) == 54
    mnli = next(line for line in runs if line.startswith("MNLI   inducer-lora"))
    assert "batch 16, 10 epochs = 245,440 updates" in mnli  # the paper's budget (appendix B.2)
    assert re.search(r"54 runs, 0 finished, 54 to run; [\d,]+ updates in all", out)
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "sweeps").exists()


# ---------------------------------------------------------------------------------------- executors
def test_local_slots_pin_gpus_and_split_cores():
    slots = sweep.local_slots(runs_per_gpu=2, gpus=["0", "3"])
    assert [s["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0", "0", "3", "3"]
    assert sweep.local_slots(jobs=3, gpus=["0", "1"]) == sweep.local_slots(gpus=["0", "1"])  # one per GPU
    cpu = sweep.local_slots(jobs=2, gpus=[])
    assert [s["CUDA_VISIBLE_DEVICES"] for s in cpu] == ["", ""]
    assert cpu[0]["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))
    assert sweep.local_slots(jobs=2, threads=3, gpus=[])[1]["MKL_NUM_THREADS"] == "3"


def test_progress_line_counts_and_estimates():
    p = sweep.SweepProgress("s", total=10, cached=2, slots=2)
    p.update(started=2)
    p.update(finished=1, seconds=60)
    p.update(failed=1)
    assert p.line() == "[sweep s] 3/10 done (2 cached), 0 running, 1 failed, 6 left, eta 3m00s"  # 6 x 60 s / 2
    p.update(started=1)
    p.update(in_use=1)  # another process held the run's folder: neither done nor failed, nor left
    assert p.line() == "[sweep s] 3/10 done (2 cached), 0 running, 1 failed, 1 in use elsewhere, 5 left, eta 2m30s"


def test_a_sweep_says_how_its_running_runs_go_while_they_train(tmp_path, capsys):
    """Between a run's start and its end the terminal is not silent: after ``every`` quiet seconds, each
    running run's update and eta (its log's last ``| eta`` line), and the sweep's eta from them before any
    run has finished (time so far + eta)."""
    now = [1000.0]
    p = sweep.SweepProgress("s", total=4, cached=0, slots=2, clock=lambda: now[0], every=60)
    log = tmp_path / "a.log"
    log.write_text(
        "+ fairseq-train ...\n"
        'x | train_inner | {"epoch": 1, "num_updates": "100", "wall": "50"} | eta 2m30s + validation\n'
        'x | valid | {"epoch": 1, "valid_accuracy": "70", "valid_num_updates": "100"}\n'
        'x | train_inner | {"epoch": 1, "num_updates": "120", "wall": "60"} | eta 2m00s\n'
    )
    p.update(started=2)
    p.watch("lora.a", log)
    p.watch("lora.b", tmp_path / "b.log")  # no log yet
    capsys.readouterr()
    now[0] += 59
    p.heartbeat()
    assert capsys.readouterr().out == ""  # quiet for under a minute: nothing to add
    now[0] += 1
    p.heartbeat()
    assert capsys.readouterr().out.splitlines() == [
        "  running lora.a: update 120, eta 2m00s (1m00s so far)",
        "  running lora.b: starting (1m00s so far)",
        # a run takes 60 s so far + 120 s left: 180 s x (2 left + 2 running / 2) / 2 slots
        "[sweep s] 0/4 done (0 cached), 2 running, 0 failed, 2 left, eta 4m30s",
    ]
    p.heartbeat()
    assert capsys.readouterr().out == ""  # it spoke just now
    p.unwatch("lora.a")
    p.unwatch("lora.b")
    now[0] += 600
    p.heartbeat()
    assert capsys.readouterr().out == ""  # nothing running: nothing to say


def test_slurm_job_array_submitit_would_submit(tmp_path, monkeypatch):
    """submitit's SlurmExecutor with a stand-in sbatch: one array, the resources asked, each task's command."""
    from submitit.core.utils import DelayedSubmission

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text('#!/bin/sh\ncp "$1" "$(dirname "$0")/submitted.sh"\necho "Submitted batch job 4242"\n')
    (fake / "srun").write_text("#!/bin/sh\n")
    for tool in ("sbatch", "srun"):
        (fake / tool).chmod(0o755)
    path = os.environ["PATH"]
    spec = write_spec(tmp_path, "name: s\ntasks: [RTE, MRPC]\nmethods: [lora]\nlrs: [1e-4, 2e-4]\nseeds: [1]\n")
    opts = sweep.parse_args(
        [str(spec), "--executor", "slurm", "--partition", "gpu", "--gpus-per-run", "1", "--time", "90"]
        + ["--mem", "32", "--array-parallelism", "3", "--model", "roberta.large", "--work-dir", str(tmp_path)]
    )
    runs = sweep.load_spec(spec, model="roberta.large").runs
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(sweep.SweepError, match="--executor slurm: sbatch and srun not found"):
        sweep_slurm.preflight(opts)
    monkeypatch.setenv("PATH", f"{fake}:{path}")
    submitted = sweep_slurm.submit([(r, None) for r in runs], opts, tmp_path / "sweeps" / "s")
    script = (fake / "submitted.sh").read_text()
    for line in ("#SBATCH --array=0-3%3", "#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1",
                 "#SBATCH --time=90", "#SBATCH --mem=32GB", "#SBATCH --cpus-per-task=8",
                 "#SBATCH --signal=USR2@90"):  # fmt: skip
        assert line in script, line
    assert [job for _, _, job in submitted] == [f"4242_{i}" for i in range(4)]
    ids = json.loads((tmp_path / "sweeps" / "s" / "slurm" / "submitted.json").read_text())
    assert sorted(ids.values()) == [f"4242_{i}" for i in range(4)]
    pickles = sorted((tmp_path / "sweeps" / "s" / "slurm").rglob("*submitted.pkl"))
    commands = sorted(DelayedSubmission.load(p).args[0][3:] for p in pickles)
    assert commands == sorted(r.argv("roberta.large", str(tmp_path)) for r in runs)
    assert all(isinstance(DelayedSubmission.load(p).function, sweep_slurm.RunTask) for p in pickles)


# ---------------------------------------------------------------------------------------- end to end (slow)
SMOKE = """
name: smoke
description: CI smoke sweep on the stand-in, 4 updates each, prompt tuning on MRPC, LoRA on SST-2 at an lr that diverges
model: standin
tasks: [SST-2, MRPC]
methods: [{method: prompt-tuning-5, tasks: [MRPC]}, {method: lora, tasks: [SST-2], lrs: [1.0e-3, 1.0e+10]}]
lrs: recipe
seeds: [1, 2]
max_update: 4
args: [--validate-interval-updates, 4, --total-batch, 8]
"""


def records_of(folder):
    return sorted(Path(folder).rglob("*.json"))


@pytest.fixture(scope="module")
def smoke(glue_slices, tmp_path_factory):
    """The smoke sweep on small slices of the real SST-2 and MRPC files, interrupted after 2 runs
    finished, then run again to the end."""
    work = tmp_path_factory.mktemp("sweep")
    spec = write_spec(work, SMOKE)
    cmd = [sys.executable, "-m", "fairseq_idpg.sweep", str(spec), "--jobs", "2", "--work-dir", str(work)]
    records = work / "sweeps" / "smoke" / "records"
    env = {**os.environ, "GLUE_DIR": str(glue_slices)}
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    deadline = time.time() + 900
    while len(records_of(records)) < 2 and first.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    first.send_signal(signal.SIGTERM)
    first_out = first.communicate(timeout=300)[0]
    done_first = {p: p.stat().st_mtime_ns for p in records_of(records)}
    finished_first = {json.loads(p.read_text())["run"] for p in done_first}
    results_first = {
        p: p.stat().st_mtime_ns for p in (work / "checkpoints").rglob("results.json") if p.parent.name in finished_first
    }
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=REPO, env=env)
    return {
        "work": work,
        "spec": spec,
        "env": env,
        "first": first_out,
        "first_code": first.returncode,
        "second": second,
        "done_first": done_first,
        "results_first": results_first,
        "records": records,
    }


@pytest.mark.slow
@pytest.mark.xdist_group("sweep-smoke")  # one worker: the smoke sweep runs once
def test_smoke_sweep_runs_in_parallel_and_resumes_without_rerunning(smoke):
    assert smoke["first_code"] == 130, smoke["first"][-3000:]
    assert "local: 2 parallel run(s) on cpu" in smoke["first"]
    assert "interrupted" in smoke["first"]
    second = smoke["second"]
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert 2 <= len(smoke["done_first"]) < 6
    # the runs finished before the interruption were not run again: their results.json are untouched
    cached = int(re.search(r"\] \d+/6 done \((\d+) cached[,)]", second.stdout).group(1))
    assert cached >= len(smoke["done_first"])
    for path, mtime in smoke["results_first"].items():
        assert path.stat().st_mtime_ns == mtime, path
    assert "[sweep smoke] 6/6 done" in second.stdout and "0 failed, 0 left" in second.stdout
    records = records_of(smoke["records"])
    assert len(records) == 6
    records = [json.loads(p.read_text()) for p in records]
    assert len({(r["task"], r["label"], r["lr"], r["seed"]) for r in records}) == 6
    # lr 1e10 diverges: a result without a score, listed as diverged, not failed
    diverged = [r for r in records if r.get("diverged")]
    assert sorted((r["task"], r["label"], r["lr"]) for r in diverged) == [("SST-2", "lora", 1e10)] * 2
    assert all(r["score"] is None and r["results"] == {} for r in diverged)
    assert (smoke["first"] + second.stdout).count(" diverged at update ") == 2
    # at most 2 at a time: never 3 runs reported running
    assert not re.search(r"\b[3-9] running", smoke["first"] + second.stdout)


@pytest.mark.slow
@pytest.mark.xdist_group("sweep-smoke")  # one worker: the smoke sweep runs once
def test_smoke_table_and_plots_from_the_records(smoke, tmp_path, monkeypatch, capsys):
    """``python -m fairseq_idpg.results`` in this process (its tables and plots are checked here, not its process)."""
    from fairseq_idpg.results.__main__ import main as results_main

    out = tmp_path / "table"
    monkeypatch.chdir(REPO)
    code = results_main([str(smoke["records"]), "--spec", str(smoke["spec"]), "--out-dir", str(out)])
    assert code == 0, capsys.readouterr().err[-3000:]
    import pandas as pd

    table = pd.read_csv(out / "table.csv")
    records = [json.loads(p.read_text()) for p in records_of(smoke["records"])]
    for task, label in (("MRPC", "prompt-tuning-5"), ("SST-2", "lora")):
        chosen = [r for r in records if r["task"] == task and r["label"] == label and not r.get("diverged")]
        values = [r["results"]["valid"][r["metric"]] for r in chosen]
        row = table[(table["task"] == task) & (table["label"] == label)]
        assert len(values) == 2 and len(row) == 1, (task, label)
        assert row["mean"].item() == pytest.approx(statistics.mean(values), abs=1e-4)  # table.csv: 4 decimals
        assert row["std"].item() == pytest.approx(statistics.stdev(values), abs=1e-4)
        assert row["n"].item() == 2 and row["diverged"].item() == 0
    # LoRA on SST-2: the lr that diverged (1e10) is not chosen; LoRA did not run on MRPC
    lora = table[table["label"] == "lora"].set_index("task")
    assert float(lora.loc["SST-2", "lr"]) == 1e-3 and pd.isna(lora.loc["MRPC", "mean"])
    assert (out / "table.md").read_text().count("±") >= 2  # the two cells that ran: MRPC prompt tuning, SST-2 LoRA
    for png in ("bars.png", "curves.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.xdist_group("sweep-smoke")  # one worker: the smoke sweep runs once
def test_a_second_sweep_skips_a_run_another_process_trains(smoke, tmp_path, monkeypatch, capsys):
    """Two sweeps over one spec: a run whose folder another process holds (its lock, as a sweep's run.py
    holds it while training) is skipped and said so, not trained twice and not listed as failed."""
    args = [str(smoke["spec"]), "--work-dir", str(smoke["work"]), "--tasks", "SST-2", "--methods", "lora"]
    args += ["--seeds", "1", "--max-update", "2", "--records", str(tmp_path)]
    cmd = [sys.executable, "-m", "fairseq_idpg.sweep", *args]
    monkeypatch.setenv("GLUE_DIR", smoke["env"]["GLUE_DIR"])
    assert sweep.main([*args, "--dry-run"]) == 0  # the plan, in this process: the run folders' names
    dry = capsys.readouterr().out
    folders = re.findall(r"^SST-2 .* 2 updates  -> (\S+)$", dry, flags=re.M)
    assert len(folders) == 2, dry[-3000:]  # lr 1e-3 and 1e10 (diverges), 2 updates: not run by the smoke sweep
    held = Path(folders[0])
    held.mkdir(parents=True)
    with held_by_another_process(held):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO, env=smoke["env"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    note = r"  in use: SST-2\.lora\.lr\S+\.seed1 \(another process trains it\); skipped$"
    assert re.search(note, done.stdout, flags=re.M)
    progress = "[sweep smoke] 1/2 done (0 cached, 1 diverged), 0 running, 0 failed, 1 in use elsewhere, 0 left"
    assert progress in done.stdout
    assert "1 run(s) in use by another process (another sweep or run.sh), skipped: run this sweep again" in done.stdout
    assert sorted(p.name for p in held.iterdir()) == [RUN_LOCK]  # nothing written in the held folder
    assert (Path(folders[1]) / "results.json").is_file() and len(records_of(tmp_path)) == 1
    failures = smoke["work"] / "sweeps" / "smoke" / "failures.json"
    assert not failures.is_file() or json.loads(failures.read_text()) == {}  # skipped is not failed


# ---------------------------------------------------------------------------------------- records from elsewhere
def test_a_record_from_another_checkout_is_not_run_again(glue_slices, standin_model, tmp_path, monkeypatch, capsys):
    """A study's records are committed from the checkout that ran them; a fresh clone has the records but
    not the run folders, and its model file has another path (part of the run folder's hash). The record
    of the same configuration counts as finished, announced as such; one of another configuration does not."""
    monkeypatch.setenv("GLUE_DIR", str(glue_slices))
    text = "name: s\nmodel: standin\ntasks: [RTE]\nmethods: [prompt-tuning-5]\nlrs: recipe\nseeds: [1]\nmax_update: 4\n"
    spec = write_spec(tmp_path, text)
    work, records = tmp_path / "work", tmp_path / "records"
    (run,) = sweep.load_spec(spec).runs
    p = sweep.plan_run(run, "standin", str(work), dry=False)  # prepares the data: the hash is known
    assert p.complete and not p.finished
    elsewhere = json.loads(json.dumps(p.config))
    elsewhere["model"]["path"] = "/elsewhere/models/minilm-l6-fairseq/model.pt"
    name = f"{p.folder.name.rsplit('.', 1)[0]}.{main_job.config_hash(elsewhere)}"
    assert name != p.folder.name  # the folder's hash differs with the model's path ...
    dest = sweep_progress.record_dir(run, records) / f"{name}.json"
    dest.parent.mkdir(parents=True)
    dest.write_text(json.dumps({"run": name, "config": elsewhere, "score": 61.0}))
    argv = [str(spec), "--work-dir", str(work), "--records", str(records)]

    assert sweep.main([*argv, "--dry-run"]) == 0  # ... and the record is matched by its configuration
    out = capsys.readouterr().out
    assert "[recorded] RTE    prompt-tuning-5" in out
    assert "1 runs, 0 finished, 1 recorded elsewhere, 0 to run" in out
    assert sweep.main(argv) == 0
    out = capsys.readouterr().out
    assert f"recorded: {run.name} finished in another checkout, not run again ({dest})" in out
    assert "[sweep s] 1/1 done (1 cached), 0 running, 0 failed, 0 left" in out
    assert not p.folder.exists() and json.loads(dest.read_text())["score"] == 61.0  # not run, record kept

    elsewhere["updates"] = 5  # another configuration under the same lr and seed: not this run's record
    dest.write_text(json.dumps({"run": name, "config": elsewhere, "score": 61.0}))
    assert sweep.main([*argv, "--dry-run"]) == 0
    assert "1 runs, 0 finished, 1 to run" in capsys.readouterr().out


def test_a_record_is_matched_by_its_backbones_weights_not_its_files_bytes(
    glue_slices, standin_model, tmp_path, monkeypatch, capsys
):
    """Each build of the stand-in writes other bytes (the model folder's path is in the checkpoint's cfg),
    so a fresh clone's model.pt has another sha256 than the one a study's records name. The record of
    the same weights is this run's; one of other weights is not; one made before the weights' digest
    matches the same file only."""
    monkeypatch.setenv("GLUE_DIR", str(glue_slices))
    text = "name: s\nmodel: standin\ntasks: [RTE]\nmethods: [prompt-tuning-5]\nlrs: recipe\nseeds: [1]\nmax_update: 4\n"
    spec = write_spec(tmp_path, text)
    work, records = tmp_path / "work", tmp_path / "records"
    (run,) = sweep.load_spec(spec).runs
    p = sweep.plan_run(run, "standin", str(work), dry=False)
    assert re.fullmatch(r"[0-9a-f]{64}", p.config["model"]["weights_sha256"])
    argv = [str(spec), "--work-dir", str(work), "--records", str(records), "--dry-run"]

    def matched(model):
        elsewhere = json.loads(json.dumps(p.config))
        elsewhere["model"] = {**elsewhere["model"], "path": "/elsewhere/model.pt", **model}
        if elsewhere["model"].get("weights_sha256") is None:
            del elsewhere["model"]["weights_sha256"]
        name = f"{p.folder.name.rsplit('.', 1)[0]}.{main_job.config_hash(elsewhere)}"
        shutil.rmtree(records, ignore_errors=True)
        dest = sweep_progress.record_dir(run, records) / f"{name}.json"
        dest.parent.mkdir(parents=True)
        dest.write_text(json.dumps({"run": name, "config": elsewhere, "score": 61.0}))
        assert sweep.main(argv) == 0
        return "1 recorded elsewhere, 0 to run" in capsys.readouterr().out

    assert matched({"sha256": "0" * 64})  # another build of the same weights
    assert not matched({"sha256": "0" * 64, "weights_sha256": "1" * 64})  # other weights
    assert matched({"weights_sha256": None})  # an older record of the same file
    assert not matched({"sha256": "0" * 64, "weights_sha256": None})  # an older record of another file
    # the run folder's name does not change with the digest: finished runs keep their folders
    without = json.loads(json.dumps(p.config))
    del without["model"]["weights_sha256"]
    assert main_job.config_hash(without) == main_job.config_hash(p.config)
