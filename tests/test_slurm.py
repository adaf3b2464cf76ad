"""Sweeps on a real single-node Slurm (scripts/slurm_cluster.sh: munge, slurmctld, slurmd on 127.0.0.1), started
once for this file and stopped at its end when it started it; skipped, with the reason, where it cannot start.

Bad input: one line naming the flag, exit 2, nothing submitted. End to end (slow): one sweep of LoRA at 2 seeds
and prompt tuning at one (and a third label, the same LoRA run as one of them) through sbatch, with the faults a
cluster brings while it runs: a pending array task cancelled, a running task requeued (preemption), a task
signalled as before its time limit, a task killed with kill -9, and the controller stopped while the sweep waits.
And a sweep with --fuse 2 (two groups of two LoRA runs, each group one array task): a pending group cancelled, a
running one requeued; the same command again submits the cancelled group, the next one follows it. And the same
run through the local and the Slurm executor (equal tensors; a finished sweep reported with the controller down),
and the progress of an array held back by --array-parallelism with a run cancelled after its first checkpoint.
Every wait is for a condition, with a deadline only against a hang: a loaded machine makes each step minutes. The
runs use ``slices``: RTE and SST-2 with 8 dev rows."""

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from fairseq_idpg import sweep, sweep_progress

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "scripts" / "slurm_cluster.sh"
STATE = Path(os.environ.get("SLURM_CLUSTER_DIR", "/tmp/fairseq-idpg-slurm"))
pytestmark = pytest.mark.xdist_group("slurm")  # one worker: one cluster, one sweep at a time on it


@pytest.fixture(scope="module")
def slurm():
    """The cluster's environment ({SLURM_CONF}); stopped at the end when this fixture started it."""
    was_running = subprocess.run(["bash", str(CLUSTER), "status"], capture_output=True).returncode == 0
    started = subprocess.run(["bash", str(CLUSTER), "start"], capture_output=True, text=True, timeout=600)
    if started.returncode:
        pytest.skip((started.stderr.strip().splitlines() or ["slurm_cluster.sh start failed"])[-1])
    conf = started.stdout.strip().split("=", 1)[1]
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield {"SLURM_CONF": conf}
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
    if not was_running:
        subprocess.run(["bash", str(CLUSTER), "stop"], capture_output=True, timeout=60)


def jobs_known():
    return subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True).stdout.split()


def submitted_since(before):
    """Jobs the cluster lists now that it did not list at ``before`` (jobs_known()): a finished job of an earlier
    test leaving the list (Slurm's MinJobAge) is no submission."""
    return sorted(set(jobs_known()) - set(before))


def refused(capsys, argv):
    """sweep.main's exit status and its one stderr line."""
    code = sweep.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return code, err[0]


@pytest.fixture(scope="module")
def slices(glue_slices, tmp_path_factory):
    """glue_slices' RTE and SST-2 (160 train rows) with 8 dev rows, one validation batch, instead of 48: every run
    here validates at each checkpoint it saves and is scored once more, and 6 batches of RTE's long pairs were most
    of a stand-in run's time. The tests check the plumbing (requeues, resumes, equal tensors), not a score; the first
    8 dev rows of each hold both labels."""
    root = tmp_path_factory.mktemp("glue-slurm")
    for task in ("RTE", "SST-2"):
        (root / task).mkdir()
        for raw in sorted((glue_slices / task).glob("*.tsv")):
            with raw.open(encoding="utf-8", newline="") as lines:
                head = "".join(lines if raw.name.startswith("train") else itertools.islice(lines, 8 + 1))
            (root / task / raw.name).write_text(head, encoding="utf-8", newline="")
    return root


SPEC = "name: s\nmodel: standin\ntasks: [SST-2]\nmethods: [lora]\nlrs: recipe\nseeds: [1]\nmax_update: {updates}\n"


# ---------------------------------------------------------------------------------------- a run's environment
THREADS = "import os, torch; print('threads', torch.get_num_threads(), repr(os.environ['CUDA_VISIBLE_DEVICES']))"


def test_an_array_task_loads_and_runs_without_importing_torch_or_this_package(tmp_path):
    """What submitit pickles for a job (``slurm_task.RunTask``, carried by value) is loaded and run by a fresh
    interpreter, as submitit's job does, that imports neither torch, fairseq nor fairseq_idpg: each array task
    starts its run without their 4 s of imports (the run's own process imports them)."""
    from submitit.helpers import DelayedSubmission

    from fairseq_idpg.slurm_task import RunTask, carried_by_value

    carried_by_value()
    log, job = tmp_path / "run.log", tmp_path / "job.pkl"
    DelayedSubmission(RunTask(tolerated=[75]), [sys.executable, "-c", "print('the run ran')"], str(log),
                      str(tmp_path)).dump(job)  # fmt: skip
    load_and_run = ("import sys; from submitit.helpers import DelayedSubmission; code = DelayedSubmission.load("
                    "sys.argv[1]).result(); print(code, sorted({m.split('.')[0] for m in sys.modules} & "
                    "{'torch', 'fairseq', 'fairseq_idpg'}))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", load_and_run, str(job)], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "0 []", done.stdout + done.stderr
    assert log.read_text().splitlines()[-1] == "the run ran"


def test_an_array_task_runs_with_the_threads_of_its_cpus(slurm, tmp_path, monkeypatch):
    """A job of --cpus-per-run 1 runs torch on 1 thread, with no GPU, as the local executor's slot would (Slurm
    bounds the CPUs, not the threads torch starts: without it, the job ran as many threads as the node's cores)."""
    from types import SimpleNamespace

    from fairseq_idpg import sweep_slurm

    opts = SimpleNamespace(time=5, gpus_per_run=0, cpus_per_run=1, array_parallelism=2, mem=None, partition=None,
                           account=None, qos=None, constraint=None)  # fmt: skip
    # what the submitting shell passes on (Slurm exports it to the job): the run's own count must win over it. 2, not
    # this process's count, tells the two apart (a pytest worker runs 1 thread; torch caps the count at the cores)
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 cores to tell 1 thread from the inherited count")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("MKL_NUM_THREADS", "2")
    ex = sweep_slurm.executor(opts, tmp_path)
    logs = {env: tmp_path / f"{env}.log" for env in ("given", "none")}
    jobs = [ex.submit(sweep_slurm.RunTask(), [sys.executable, "-c", THREADS], str(logs["given"]), str(REPO),
                      sweep_slurm.run_environment(opts)),
            ex.submit(sweep_slurm.RunTask(), [sys.executable, "-c", THREADS], str(logs["none"]), str(REPO),
                      {"CUDA_VISIBLE_DEVICES": "x"})]  # fmt: skip
    assert [job.result() for job in jobs] == [0, 0]
    assert logs["given"].read_text().splitlines()[-1] == "threads 1 ''"
    assert logs["none"].read_text().splitlines()[-1] == "threads 2 'x'"

    submitted = []

    class Recording:  # what sweep_slurm.submit hands every job, without a cluster
        def batch(self):
            return __import__("contextlib").nullcontext()

        def submit(self, *args):
            submitted.append(args)
            return SimpleNamespace(job_id=str(len(submitted)))

    monkeypatch.setattr(sweep_slurm, "executor", lambda opts, sweep_dir: Recording())
    monkeypatch.setattr(sweep_progress, "unit_command", lambda unit, opts: ["run", unit[0][0].name])
    runs = [(SimpleNamespace(name=f"r{i}"), None) for i in range(2)]
    more = SimpleNamespace(**{**vars(opts), "cpus_per_run": 3}, fuse=None)
    sweep_slurm.submit(runs, more, tmp_path, units=[[r] for r in runs])
    assert [args[-1] for args in submitted] == [
        {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3", "CUDA_VISIBLE_DEVICES": ""}
    ] * 2


# ---------------------------------------------------------------------------------------- bad input
def test_no_sbatch_on_path_is_one_line(tmp_path, monkeypatch, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(updates=4))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
    code, line = refused(capsys, [str(spec), "--executor", "slurm", "--work-dir", str(tmp_path)])
    assert (code, line) == (2, "sweep: error: --executor slurm: sbatch and srun not found on PATH "
                                "(run it on a Slurm login node)")  # fmt: skip
    assert not (tmp_path / "sweeps").exists() and not (tmp_path / "data-bin").exists()


def test_what_the_cluster_lacks_is_one_line_naming_the_flag(slurm, tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(updates=4))
    base = [str(spec), "--executor", "slurm", "--work-dir", str(tmp_path)]
    cpus = os.cpu_count()
    before = jobs_known()
    cases = {
        ("--partition", "gpu", "--gpus-per-run", "0", "--cpus-per-run", "1"):
            "--partition gpu: no such partition on this cluster; valid: debug",
        ("--gpus-per-run", "1", "--cpus-per-run", "1"):
            "--gpus-per-run 1: partition debug's nodes have no GPUs (gres gpu); valid: 0 to 0",
        ("--gpus-per-run", "0"):  # the default --cpus-per-run 8
            f"--cpus-per-run 8: partition debug's nodes have {cpus} CPUs; valid: 1 to {cpus}",
        ("--gpus-per-run", "0", "--cpus-per-run", "1", "--mem", "100000"):
            "--mem 100000: partition debug's nodes have",
    }  # fmt: skip
    for flags, message in cases.items():
        code, line = refused(capsys, base + list(flags))
        assert code == 2 and line.startswith(f"sweep: error: {message}"), (flags, line)
    assert not submitted_since(before) and not (tmp_path / "sweeps").exists()


def test_time_under_the_estimate_is_one_line(slurm, glue_slices, standin_model, tmp_path, monkeypatch, capsys):
    """600 updates at a measured 10 s each (scaled to the run's tokens): --time 1 is refused before any job."""
    monkeypatch.setenv("GLUE_DIR", str(glue_slices))
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(updates=600) + "args: [--total-batch, 8]\n")
    timings = tmp_path / "timings.json"
    entry = {"method": "lora", "precision": "fp32", "batch_size": 8, "tokens_per_sample": 128, "seconds": 10.0}
    timings.write_text(json.dumps({"device": "cpu", "model": "standin", "seconds_per_update": [entry]}))
    before = jobs_known()
    argv = [str(spec), "--executor", "slurm", "--work-dir", str(tmp_path), "--gpus-per-run", "0"]
    code = sweep.main(argv + ["--cpus-per-run", "1", "--time", "1", "--timings", str(timings)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err and not err[-1].startswith("warning:"), err  # warnings: the slices' sizes
    assert re.fullmatch(r"sweep: error: --time 1: the longest run \(SST-2\.lora\.lr-recipe\.seed1\) needs about "
                        r"\S+ by the estimate \(.*timings\.json; sweep\.sh --dry-run shows it\); valid: --time \d+ "
                        r"or more", err[-1]), err[-1]  # fmt: skip
    assert not submitted_since(before) and not (tmp_path / "sweeps" / "s" / "slurm").exists()


# ---------------------------------------------------------------------------------------- end to end (slow)
FAULTS = """
name: slurm
description: lora at 2 seeds, prompt tuning at 1, on the stand-in through sbatch; lora-again is lora at seed 2 once more
model: standin
tasks: [RTE]
methods:
  - {method: lora, max_update: 6}
  - {method: prompt-tuning-5, max_update: 2, seeds: [2]}
  - {label: lora-again, method: lora, max_update: 6, seeds: [2], args: [--keep-interval-updates, 9]}
lrs: recipe
seeds: [1, 2]
args: [--total-batch, 8, --save-interval-updates, 2, --validate-interval-updates, 6]
"""
LORA1, PT2 = "RTE.lora.lr-recipe.seed1", "RTE.prompt-tuning-5.lr-recipe.seed2"
LORA2, AGAIN = "RTE.lora.lr-recipe.seed2", "RTE.lora-again.lr-recipe.seed2"


# how long a wait may take: each wait is for a condition, never a fixed time, and the deadline only ends a test that
# hangs; on a loaded machine (other jobs on the 2 cores, load 30) a stand-in run of a few updates took minutes
DEADLINE = int(os.environ.get("SLURM_TEST_DEADLINE", 2400))


def wait_for(what, timeout=DEADLINE):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what.__doc__ or what}")


def run_folder(work, name, sweep_name="slurm"):
    """The run folder named in the run's log (None until it started)."""
    log = Path(work) / "sweeps" / sweep_name / "logs" / f"{name}.log"
    found = re.search(r"^run folder: (\S+)", log.read_text(), re.M) if log.is_file() else None
    return Path(found.group(1)) if found else None


def saved_update_2(work, name, sweep_name="slurm"):
    """The run started, saved its checkpoint at update 2, and has not finished."""
    folder = run_folder(work, name, sweep_name)
    return folder and (folder / "checkpoint_1_2.pt").is_file() and not (folder / "results.json").is_file()


def task_process(job):
    """The pid of array task ``job`` (``ID_N``)'s submitit process, or None."""
    array, index = job.split("_")
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if b"submitit.core._submit" not in (proc / "cmdline").read_bytes():
                continue
            env = dict(v.split(b"=", 1) for v in (proc / "environ").read_bytes().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if env.get(b"SLURM_ARRAY_JOB_ID") == array.encode() and env.get(b"SLURM_ARRAY_TASK_ID") == index.encode():
            return int(proc.name)
    return None


def state(job):
    return subprocess.run(["squeue", "-h", "-j", job, "-t", "all", "-o", "%T"], capture_output=True, text=True).stdout


def requeued_again(job):
    """A requeued job waits 2 minutes before it is eligible again (Slurm's own delay): made eligible now."""
    if (
        "BeginTime"
        not in subprocess.run(["squeue", "-h", "-j", job, "-o", "%r"], capture_output=True, text=True).stdout
    ):
        return False
    return subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"]).returncode == 0


def trained(folder):
    checkpoint = torch.load(folder / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    return {k: v for k, v in checkpoint["model"].items() if not k.startswith("_")}


def on_the_cluster(text, tmp_path, slurm, slices, *flags):
    """(the specification's file, the work folder, the sweep's command on the cluster, its environment)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    work = tmp_path / "work"
    cmd = [sys.executable, "-m", "fairseq_idpg.sweep", str(spec), "--executor", "slurm", "--work-dir", str(work)]
    cmd += ["--gpus-per-run", "0", "--cpus-per-run", "1", "--poll", "1", *flags]
    return spec, work, cmd, {**os.environ, **slurm, "GLUE_DIR": str(slices)}


def in_process(cmd, env, monkeypatch, capsys):
    """(exit status, stdout, stderr) of the sweep command ``cmd`` run in this process, an interpreter start less: for
    a command that follows jobs or reports finished runs, not one that trains."""
    monkeypatch.setenv("GLUE_DIR", env["GLUE_DIR"])
    capsys.readouterr()
    code = sweep.main(cmd[cmd.index("fairseq_idpg.sweep") + 1 :])
    said = capsys.readouterr()
    return code, said.out, said.err


@pytest.mark.slow
def test_a_sweep_through_sbatch_survives_the_clusters_faults(slurm, slices, standin_model, tmp_path, monkeypatch,
                                                             capsys):  # fmt: skip
    """4 runs: LoRA at seeds 1 and 2 (one signalled as before its time limit, one requeued), prompt tuning at seed 2
    (killed with kill -9), lora-again (the reference for the requeued run; cancelled while pending, run by the
    second command while the controller stops)."""
    spec, work, cmd, env = on_the_cluster(FAULTS, tmp_path, slurm, slices, "--array-parallelism", "2")
    slurm_dir = work / "sweeps" / "slurm" / "slurm"

    def start(name):
        out = tmp_path / f"{name}.out"
        return subprocess.Popen(cmd, stdout=open(out, "w"), stderr=subprocess.STDOUT, cwd=REPO, env=env), out

    # 1. four runs as one array, 2 at a time; while it runs: a pending task cancelled, a running one signalled
    # as before its time limit, one requeued by the cluster (preemption), one killed with kill -9
    first, first_out = start("first")
    submitted = slurm_dir / "submitted.json"
    ids = wait_for(lambda: submitted.is_file() and json.loads(submitted.read_text()))
    assert ids[LORA1].endswith("_0") and ids[LORA2].endswith("_1") and ids[AGAIN].endswith("_3"), ids
    assert "PENDING" in state(ids[AGAIN])
    subprocess.run(["scancel", ids[AGAIN]], check=True)
    # the run to kill -9 is short and may run while the requeues below are awaited: watched for from now on
    killed = []
    watcher = threading.Thread(
        target=lambda: killed.append(os.kill(wait_for(lambda: run_folder(work, PT2) and task_process(ids[PT2])),
                                             signal.SIGKILL) or True), daemon=True)  # fmt: skip
    watcher.start()
    # the two LoRA runs train side by side: each gets its fault as soon as it saved update 2 (4 updates before its end)
    faulted = {}

    def both_faulted():
        """LORA1 signalled as Slurm does before the time limit, LORA2 requeued, each once it saved update 2."""
        if LORA1 not in faulted and saved_update_2(work, LORA1):
            faulted[LORA1] = subprocess.Popen(["scancel", "--signal=USR2", ids[LORA1]], stderr=subprocess.DEVNULL)
        if LORA2 not in faulted and saved_update_2(work, LORA2):
            faulted[LORA2] = subprocess.run(["scontrol", "requeue", ids[LORA2]], check=True)
        return len(faulted) == 2

    wait_for(both_faulted)
    wait_for(lambda: requeued_again(ids[LORA1]))
    faulted[LORA1].kill()  # scancel goes on asking while the job is requeued
    faulted[LORA1].wait()
    # the sweep says so once a poll sees the job back in the queue (Slurm holds it there about 2 minutes), before
    # it is made eligible at once
    lora2_log = work / "sweeps" / "slurm" / "logs" / f"{LORA2}.log"
    noted = f"requeued: {LORA2} (job {ids[LORA2]}); resumes from its checkpoint"
    wait_for(lambda: noted in first_out.read_text() or "requeued (restart 1)" in lora2_log.read_text())
    assert noted in first_out.read_text(), first_out.read_text()[-3000:]
    wait_for(lambda: requeued_again(ids[LORA2]) or "requeued (restart 1)" in lora2_log.read_text())
    watcher.join(timeout=DEADLINE + 60)
    assert killed, f"{PT2}'s task was never seen running"
    assert first.wait(timeout=DEADLINE) == 1, first_out.read_text()[-3000:]
    out = first_out.read_text()
    # --array-parallelism 2: the tasks it holds back are left, not running
    assert not re.search(r", [3-9] running", out) and re.search(r", [12] running", out), out[-3000:]
    assert f"cancelled: {AGAIN} (job {ids[AGAIN]}, scancel); not run" in out
    assert re.search(rf"FAILED {re.escape(PT2)} \(job {ids[PT2]}: FAILED", out), out[-3000:]
    assert "[sweep slurm] 2/4 done (0 cached), 0 running, 1 failed, 1 cancelled, 0 left" in out
    assert "1 run(s) cancelled (scancel): run this sweep again to train them (each resumes from its last" in out
    logs = work / "sweeps" / "slurm" / "logs"
    assert "time limit near or preempted: requeued" in (logs / f"{LORA1}.log").read_text()
    # ran, requeued by the cluster, ran again: the second job's first line says so
    assert (logs / f"{LORA2}.log").read_text().count("slurm job ") == 2
    assert ": requeued (restart 1), resumes from checkpoint_last.pt" in (logs / f"{LORA2}.log").read_text()

    # 2. the same command runs only the cancelled and the failed run; the controller stops while it waits
    second, second_out = start("second")
    wait_for(lambda: "submitted 2 job(s)" in second_out.read_text())
    again = json.loads(submitted.read_text())
    assert {again[AGAIN], again[PT2]} & {ids[AGAIN], ids[PT2]} == set()

    def again_training():
        """lora-again's job runs and its run (6 updates, then scored) is not finished: the sweep still waits."""
        folder = run_folder(work, AGAIN)
        return "RUNNING" in state(again[AGAIN]) and folder and not (folder / "results.json").is_file()

    wait_for(again_training)
    os.kill(int((STATE / "slurmctld.pid").read_text()), signal.SIGTERM)
    assert second.wait(timeout=DEADLINE) == 1  # 3 polls without an answer, each MessageTimeout (here 5 s) long
    last = second_out.read_text().strip().splitlines()[-1]
    assert re.fullmatch(r"sweep: error: the Slurm controller does not answer \(squeue: .*\); [12] job\(s\) stay "
                        r"as they were: run the same command again to follow them", last), last  # fmt: skip
    subprocess.run(["bash", str(CLUSTER), "start"], check=True, capture_output=True, timeout=600)

    # 3. the same command follows the two jobs (or finds them finished) and submits nothing
    code, third, err = in_process(cmd, env, monkeypatch, capsys)
    assert code == 0, third[-3000:] + err[-3000:]
    assert "[sweep slurm] 4/4 done" in third and not re.search(r"submitted [1-9]", third)
    assert json.loads(submitted.read_text()) == again

    # 4. all cached: nothing submitted
    before = jobs_known()
    code, fourth, _ = in_process(cmd, env, monkeypatch, capsys)
    assert code == 0 and "[sweep slurm] 4/4 done (4 cached)" in fourth, fourth[-2000:]
    assert "submitted" not in fourth and not submitted_since(before)

    # the run requeued mid-training resumed: its trained tensors and scores are the uninterrupted run's
    requeued, reference = run_folder(work, LORA2), run_folder(work, AGAIN)
    assert requeued != reference
    a, b = trained(requeued), trained(reference)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    results = [json.loads((f / "results.json").read_text())["results"] for f in (requeued, reference)]
    assert results[0] == results[1]

    # the table from the records
    records = work / "sweeps" / "slurm" / "records"
    assert len(list(records.rglob("*.json"))) == 4
    table = tmp_path / "table"
    from fairseq_idpg.results.__main__ import main as results_table

    assert results_table([str(records), "--spec", str(spec), "--out-dir", str(table)]) == 0
    rows = (table / "table.csv").read_text()
    assert all(label in rows for label in ("lora", "prompt-tuning-5", "lora-again"))


# ---------------------------------------------------------------------------------------- runs trained together (slow)
FUSED = """
name: slurm-fused
description: 2 groups of 2 LoRA runs trained together through sbatch; lora-again is the same runs again (the reference)
model: standin
tasks: [RTE]
methods:
  - lora
  - {label: lora-again, method: lora, args: [--keep-interval-updates, 9]}
lrs: recipe
seeds: [1, 2]
max_update: 6
args: [--total-batch, 8, --save-interval-updates, 2, --validate-interval-updates, 6]
"""
AGAIN1, AGAIN2 = "RTE.lora-again.lr-recipe.seed1", "RTE.lora-again.lr-recipe.seed2"


def group_folders(work, first):
    """The run folders a group's log names (``FOLDER: training``, once the group started), by seed."""
    log = Path(work) / "sweeps" / "slurm-fused" / "logs" / f"{first}.log"
    names = re.findall(r"^(lr\S+\.seed(\d+)\.\w+): ", log.read_text(), re.M) if log.is_file() else []
    return {int(seed): next((Path(work) / "checkpoints").rglob(name)) for name, seed in names}


@pytest.mark.slow
def test_a_fused_sweep_through_sbatch_trains_each_group_as_one_job(slurm, slices, standin_model, tmp_path, monkeypatch,
                                                                   capsys):  # fmt: skip
    flags = ("--array-parallelism", "1", "--fuse", "2")
    _, work, cmd, env = on_the_cluster(FUSED, tmp_path, slurm, slices, *flags)
    submitted = work / "sweeps" / "slurm-fused" / "slurm" / "submitted.json"

    # 1. two groups, one array task each, one at a time: the pending group cancelled, the running one requeued once
    # both its runs saved update 2
    out = tmp_path / "first.out"
    first = subprocess.Popen(cmd, stdout=open(out, "w"), stderr=subprocess.STDOUT, cwd=REPO, env=env)
    ids = wait_for(lambda: submitted.is_file() and json.loads(submitted.read_text()))
    assert ids[LORA1] == ids[LORA2] and ids[AGAIN1] == ids[AGAIN2] and ids[LORA1] != ids[AGAIN1], ids
    assert "PENDING" in state(ids[AGAIN1])
    subprocess.run(["scancel", ids[AGAIN1]], check=True)

    def saved_update_2():
        """Both runs of the running group saved update 2."""
        folders = group_folders(work, LORA1)
        return len(folders) == 2 and all((f / "checkpoint_1_2.pt").is_file() for f in folders.values())

    wait_for(saved_update_2)
    subprocess.run(["scontrol", "requeue", ids[LORA1]], check=True)
    wait_for(lambda: requeued_again(ids[LORA1]))
    assert first.wait(timeout=DEADLINE) == 1, out.read_text()[-3000:]
    said = out.read_text()
    assert "submitted 2 job(s) (4 runs fused in 2 group(s))" in said
    for name in (AGAIN1, AGAIN2):
        assert f"cancelled: {name} (job {ids[AGAIN1]}, scancel); not run" in said
    assert "[sweep slurm-fused] 2/4 done (0 cached), 0 running, 0 failed, 2 cancelled, 0 left" in said, said[-3000:]
    log = (work / "sweeps" / "slurm-fused" / "logs" / f"{LORA1}.log").read_text()
    assert log.count("slurm job ") == 2 and not (work / "sweeps" / "slurm-fused" / "logs" / f"{LORA2}.log").exists()
    for folder in group_folders(work, LORA1).values():  # each run resumed from its own checkpoint
        assert re.search(r"Loaded checkpoint \S+checkpoint_last\.pt \(epoch \d+ @ [2-5] updates\)",
                         (folder / "train.log").read_text()), folder  # fmt: skip

    # 2. the same command submits the cancelled group again (and is stopped); 3. the next one follows it
    out = tmp_path / "second.out"
    second = subprocess.Popen(cmd, stdout=open(out, "w"), stderr=subprocess.STDOUT, cwd=REPO, env=env)
    wait_for(lambda: "submitted 1 job(s) (2 runs fused in 1 group(s))" in out.read_text())
    second.send_signal(signal.SIGTERM)
    second.wait(timeout=DEADLINE)
    again = json.loads(submitted.read_text())
    assert again[AGAIN1] == again[AGAIN2] != ids[AGAIN1] and again[LORA1] == ids[LORA1]
    code, third, err = in_process(cmd, env, monkeypatch, capsys)
    assert code == 0, third[-3000:] + err[-3000:]
    assert "submitted 0 job(s), following 1 submitted before" in third, third[-3000:]
    assert "[sweep slurm-fused] 4/4 done (2 cached)" in third
    code, fourth, _ = in_process(cmd, env, monkeypatch, capsys)
    assert code == 0 and "[sweep slurm-fused] 4/4 done (4 cached)" in fourth, fourth[-2000:]

    # each run of the requeued group ends with the trained tensors of the same run in the uninterrupted group
    found = (json.loads(p.read_text()) for p in (work / "sweeps" / "slurm-fused" / "records").rglob("*.json"))
    records = {r["run"]: r for r in found}
    assert len(records) == 4 and all(len(r["fused_with"]) == 1 for r in records.values())
    requeued, reference = group_folders(work, LORA1), group_folders(work, AGAIN1)
    for seed in (1, 2):
        a, b = trained(requeued[seed]), trained(reference[seed])
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), seed
        assert records[requeued[seed].name]["results"] == records[reference[seed].name]["results"]


# ---------------------------------------------------------------------------------------- one run, two executors (slow)
ONE = SPEC.format(updates=4) + "args: [--total-batch, 8]\n"
ONE_RUN = "SST-2.lora.lr-recipe.seed1"


def finished_folder(work):
    """The folder of the one run trained under ``work`` (its results.json's)."""
    return next((Path(work) / "checkpoints").rglob("results.json")).parent


@pytest.mark.slow
def test_a_run_on_slurm_is_the_local_run_and_its_report_needs_no_controller(slurm, slices, standin_model, tmp_path,
                                                                             monkeypatch, capsys):  # fmt: skip
    """The same run (1 CPU) through the local executor and through the Slurm executor: the same folder name and
    equal trained tensors. Then, the controller stopped: the finished sweep is reported (exit 0), and a sweep with a
    run to submit is refused in one line (exit 2); these two in this process (neither trains)."""
    spec, work, cmd, env = on_the_cluster(ONE, tmp_path, slurm, slices)
    local = [sys.executable, "-m", "fairseq_idpg.sweep", str(spec), "--work-dir", str(tmp_path / "local"),
             "--jobs", "1", "--threads", "1"]  # fmt: skip
    for argv in (local, cmd):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE, cwd=REPO, env=env)
        assert done.returncode == 0 and "[sweep s] 1/1 done (0 cached)" in done.stdout, done.stdout[-3000:]
    here, there = finished_folder(tmp_path / "local"), finished_folder(work)
    assert here.name == there.name and there == run_folder(work, ONE_RUN, "s")
    a, b = trained(here), trained(there)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    controller = int((STATE / "slurmctld.pid").read_text())
    os.kill(controller, signal.SIGTERM)
    try:
        wait_for(lambda: not Path(f"/proc/{controller}").exists())
        code, cached, err = in_process(cmd, env, monkeypatch, capsys)
        assert code == 0 and "[sweep s] 1/1 done (1 cached)" in cached, err[-3000:]
        assert "submitted" not in cached and not err.strip(), err[-3000:]
        code, line = refused(capsys, cmd[cmd.index(str(spec)) :] + ["--max-update", "5"])
        assert code == 2, line
        assert re.fullmatch(r"sweep: error: --executor slurm: the Slurm controller does not answer \(sinfo: .*\)",
                            line), line  # fmt: skip
    finally:
        subprocess.run(["bash", str(CLUSTER), "start"], check=True, capture_output=True, timeout=600)


# ---------------------------------------------------------------------------------------- progress and scancel (slow)
TWO = """
name: two
model: standin
tasks: [RTE]
methods: [lora]
lrs: recipe
seeds: [1, 2]
max_update: 6
args: [--total-batch, 8, --save-interval-updates, 2, --validate-interval-updates, 6]
"""
SEED1, SEED2 = "RTE.lora.lr-recipe.seed1", "RTE.lora.lr-recipe.seed2"


@pytest.mark.slow
def test_progress_counts_held_tasks_as_left_and_a_cancelled_run_resumes(slurm, slices, standin_model, tmp_path,
                                                                        monkeypatch, capsys):  # fmt: skip
    """2 runs, one array task at a time: the held task is left, not running; the running run gets its heartbeat
    line, and the eta comes from the finished run. The second run, cancelled with scancel once it saved a
    checkpoint, is reported cancelled at its update; the same command resumes it there."""
    spec, work, cmd, env = on_the_cluster(TWO, tmp_path, slurm, slices, "--array-parallelism", "1")
    monkeypatch.setenv("GLUE_DIR", str(slices))
    init = sweep.SweepProgress.__init__  # the heartbeat after 1 s of silence, not a minute: the runs are short
    monkeypatch.setattr(sweep.SweepProgress, "__init__", lambda self, *a, **k: init(self, *a, **{**k, "every": 1}))
    argv = cmd[cmd.index(str(spec)) :]
    outcome = []
    first = threading.Thread(target=lambda: outcome.append(sweep.main(argv)), daemon=True)
    first.start()
    submitted = work / "sweeps" / "two" / "slurm" / "submitted.json"
    ids = wait_for(lambda: submitted.is_file() and json.loads(submitted.read_text()))
    wait_for(lambda: saved_update_2(work, SEED2, "two"))
    subprocess.run(["scancel", ids[SEED2]], check=True)
    first.join(timeout=DEADLINE)
    out = capsys.readouterr().out
    assert outcome == [1], out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("[sweep two]")]
    assert not any(", 2 running" in line for line in lines), out[-3000:]
    assert "[sweep two] 0/2 done (0 cached), 0 running, 0 failed, 2 left, eta ?  submitted 2 job(s)" in out
    assert re.search(rf"\] 0/2 done \(0 cached\), 1 running, 0 failed, 1 left, eta \S+  start {SEED1} ", out)
    assert re.search(rf"^  running {SEED1}: (starting|update \d+)", out, re.M), out[-3000:]
    assert re.search(rf"\] 1/2 done \(0 cached\), [01] running, 0 failed, [01] left, eta \d\S*  done {SEED1} ", out)
    found = re.search(rf"cancelled: {SEED2} \(job {ids[SEED2]}, scancel\) at update (\d+); run the sweep again to "
                      r"resume it", out)  # fmt: skip
    assert found and int(found.group(1)) >= 2, out[-3000:]
    assert "[sweep two] 1/2 done (0 cached), 0 running, 0 failed, 1 cancelled, 0 left" in out
    assert ("1 run(s) cancelled (scancel): run this sweep again to train them (each resumes from its last checkpoint "
            "where it saved one)") in out  # fmt: skip

    assert sweep.main(argv) == 0
    assert "[sweep two] 2/2 done (1 cached)" in capsys.readouterr().out
    log = (work / "sweeps" / "two" / "logs" / f"{SEED2}.log").read_text()
    assert re.search(rf"resuming from \S+ at update {found.group(1)} of 6", log), log[-3000:]
