"""Plan -> trained and scored run: one process at a time per run folder (``.lock``), fairseq-train
(resumed from ``checkpoint_last.pt`` when interrupted), divergence read from its log, fairseq-validate
on ``checkpoint_best.pt``, and the record (``record.py``)."""

import contextlib
import math
import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

from fairseq_idpg.errors import RunError
from fairseq_idpg.files import write_json
from fairseq_idpg.launch import console_script
from fairseq_idpg.layout import REPO
from fairseq_idpg.run.processes import ConsoleFilter, Refused, TrainingEta, tee, tee_here
from fairseq_idpg.run.record import read_run_file, read_run_folder, show_scores, write_record


def checkpoint_updates(path):
    """The number of updates a fairseq checkpoint was saved at (the tensors are not read); a damaged file:
    those of the newest intact checkpoint beside it, which fairseq-train resumes from (fairseq_idpg_compat
    fix 9), saying so. Returns (updates, the file they come from)."""
    from fairseq_idpg_compat import resume_checkpoint

    found, updates, damage = resume_checkpoint(path)
    if damage and found is None:
        raise RunError(f"{path} is damaged ({damage}) and no intact checkpoint is left; --restart trains again")
    if damage:
        print(f"warning: {path} is damaged ({damage}); the newest intact checkpoint is {found}", flush=True)
    return updates, Path(found)


RUN_LOCK = ".lock"  # in the run folder: held by the one process training or scoring it


IN_USE_EXIT = 75  # run.py's exit status for a run folder in use (os.EX_TEMPFAIL): a sweep skips it, not a failure


class InUse(RunError):
    """Another process holds the run folder (``RUN_LOCK``): run.py stops with one line, exit ``IN_USE_EXIT``."""


@contextlib.contextmanager
def run_folder_lock(save):
    """Held while the run in ``save`` is trained or scored, and by whoever writes it: the file descriptor
    it yields is passed on to fairseq-train (``tee(..., hold=fd)``), so a trainer that outlives its
    launcher keeps the folder locked until it ends (fairseq-validate runs in this process, under it).
    A second process on the same configuration (another sweep, a second run.sh) stops with one line
    instead of writing the same checkpoints and logs. A flock goes with the last process holding it:
    a killed run leaves none held."""
    import fcntl

    save.mkdir(parents=True, exist_ok=True)
    fd = os.open(save / RUN_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise InUse(
            f"{save} is in use: another process (a sweep, run.sh, or a trainer still running from an "
            "earlier one) is training or scoring it; wait for it to end, or stop it first"
        ) from None
    try:
        yield fd
    finally:
        os.close(fd)  # the lock ends with the last holder: here, unless a child still runs


def execute(p):
    """Train (or resume) and score the planned run; results.json marks it finished. A finished run's result
    is read without the lock (a read-only copy of a run shows it); a damaged results.json or config.json is
    one line (``DamagedRecord``) before anything is written; the lock is taken only to write."""
    if not p.request.restart:  # --restart removes whatever the folder holds
        done = read_run_folder(p.folder)
        if done is not None:
            return show_cached(p.folder, done)
    new = not p.folder.exists()
    with run_folder_lock(p.folder) as lock:
        return execute_locked(p, new, lock)


def show_cached(save, done):
    print(f"cached: this configuration finished on {done.get('finished', '?')}; not training it again")
    print(f"  (results {save / 'results.json'}; --restart trains it again)")
    if done.get("diverged"):
        print(diverged_line(done["diverged"], done["lr"]))
    else:
        show_scores(done["results"], done["metric"])
    return 0


def execute_locked(p, new, lock=None):
    save = p.folder
    if p.request.restart and not new:
        print(f"--restart: removing {save}", flush=True)
        for child in save.iterdir():  # all but the lock this process holds
            if child.name != RUN_LOCK:
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        new = True  # a refused restart leaves nothing behind either
    done = read_run_folder(save)  # again under the lock: another process may have finished it meanwhile
    if done is not None:
        return show_cached(save, done)
    trained = trained_before(p)
    write_json(p.config, save / "config.json")
    failure = None
    try:
        if not trained:
            train(p, lock)
    except RunError as e:  # fairseq's FloatingPointError is a divergence, any other failure stays one
        failure = e
    if new and isinstance(failure, Refused) and not any(save.glob("checkpoint*.pt")):
        # fairseq-train refused what run.sh could not check (the data); a refusal after checkpoints were
        # saved (a full disk) keeps them: the same command resumes once there is room
        remove_run_folder(save, Path(p.request.work_dir))
        raise failure
    found = divergence(save / "train.log")
    if found is None and failure is not None:
        raise failure
    if found is not None:
        (save / "crash.pt").unlink(missing_ok=True)  # fairseq's copy of the diverged state: nothing to resume
        write_record(p, {}, diverged=found)
        print(diverged_line(found, p.config["lr"]), file=sys.stderr)
        return 0
    results = score(p)
    write_record(p, results)
    return 0


def remove_run_folder(save, work_dir):
    """Remove a run folder made for a refused run, and the parents it leaves empty, up to ``work_dir``."""
    shutil.rmtree(save)
    for parent in save.parents:
        if parent == work_dir or not parent.is_relative_to(work_dir) or any(parent.iterdir()):
            break
        parent.rmdir()


# fairseq's own line, or the compat layer's ``FloatingPointError: REASON at update N (lr ... advice)``
FLOATING_POINT_ERROR = re.compile(r"^FloatingPointError: (.+?)(?: at update (\d+)(?: \(.*\))?)?$", re.M)


def divergence(train_log):
    """``{"update", "reason"}`` where the run diverged, read from fairseq-train's log, or None: the first
    training or validation loss logged as NaN or inf, else fairseq's ``FloatingPointError`` (NaN/Inf
    gradients in fp32, or fp16's loss scale at its minimum: fairseq's normal skipped fp16 updates log no
    loss and are not divergence), at the update after the last one logged."""
    from fairseq_idpg.logs import read_log

    text = Path(train_log).read_text(encoding="utf-8", errors="replace") if Path(train_log).is_file() else ""
    last = 0
    for entry in read_log(text):
        loss, updates = entry.stats.get("loss"), entry.stats.get("num_updates")
        if isinstance(loss, float) and not math.isfinite(loss):
            return {"update": int(updates if isinstance(updates, (int, float)) else last + 1),
                    "reason": f"{entry.tag} loss {loss}"}  # fmt: skip
        last = int(updates) if isinstance(updates, (int, float)) else last
    error = FLOATING_POINT_ERROR.findall(text)
    if not error:
        return None
    reason, update = error[-1]
    return {"update": int(update) if update else last + 1, "reason": reason.strip()}


def diverged_line(diverged, lr):
    return (
        f"diverged at update {diverged['update']} (lr {lr:g}): {diverged['reason']}; "
        "results.json records it without a score (--restart trains it again)"
    )


def trained_before(p):
    """Whether an interrupted run of this configuration had finished training (else it resumes)."""
    save, updates = p.folder, p.config["updates"]
    if not (save / "checkpoint_last.pt").is_file():
        return False
    done_updates, resume = checkpoint_updates(save / "checkpoint_last.pt")
    if done_updates >= updates:
        print(f"training finished earlier ({done_updates} updates in {resume}); scoring it", flush=True)
    else:
        print(f"resuming from {resume} at update {done_updates} of {updates}", flush=True)
    before = (read_run_file(save / "config.json") or {}).get("layout")
    if before and before != p.config["layout"]:
        print(f"note: device layout {before} -> {p.config['layout']}; the same effective batch, other batch shards")
    return done_updates >= updates


def train(p, lock=None):
    """fairseq-train, its output in train.log and on the terminal with the time left."""
    save = p.folder
    with open(save / "train.log", "a", encoding="utf-8") as f:
        f.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} scripts/run.sh {shlex.join(p.argv)}\n")
    cmd = p.train
    if p.request.nproc == 1:
        # the launcher would only print and exec this fairseq-train command: run it from here, the same
        # process and output, one interpreter start (about 4 s) fewer
        from fairseq_idpg.launch import resolve

        _, cmd = resolve(p.train[p.train.index("fairseq_idpg.launch") + 1 :])  # the launcher's arguments
        print("+ " + shlex.join(p.train), flush=True)
        with open(save / "train.log", "a", encoding="utf-8") as f:
            f.write("+ " + shlex.join(cmd) + "\n")
    seconds, _ = tee(
        cmd,
        save / "train.log",
        progress=TrainingEta(p.config["updates"]),
        show=ConsoleFilter(save / "train.log"),
        hold=lock,
    )
    p.timings["train"] = round(seconds, 1)
    p.memory = peak_memory(save / "train.log")
    # checkpoint_<epoch>_<updates>.pt (mid-epoch saves, for resuming) repeat checkpoint_last.pt now
    for interval in save.glob("checkpoint_*_*.pt"):
        if re.fullmatch(r"checkpoint_\d+_\d+\.pt", interval.name):
            interval.unlink()


def peak_memory(train_log):
    """{"mb", "of"}: the peak memory of the fairseq-train that just ended. CUDA: the device's memory less the least
    ``gb_free`` fairseq logged (its peak allocated per update, 0.1 GB steps); else the largest resident set of
    this process's finished children (Linux ``ru_maxrss``): the trainer's, the largest of them."""
    import resource

    from fairseq_idpg.logs import least_free_gb

    free = least_free_gb(Path(train_log).read_text(encoding="utf-8", errors="replace"))
    if free is not None and _cuda():
        import torch

        total = torch.cuda.get_device_properties(0).total_memory / 1024**3  # fairseq's CudaEnvironment's GB
        return {"mb": round((total - free) * 1024), "of": "CUDA, peak allocated"}
    return {"mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024), "of": "host, peak resident"}


def score(p):
    """fairseq-validate's scores of checkpoint_best.pt on every dev (and test) split: {split: {metric: value}}."""
    from fairseq_idpg.logs import validate_scores

    save, select = p.folder, p.config["select_on"]
    # fairseq-validate of this interpreter's environment; the backbone where it is now (the
    # checkpoint names the path it was trained with, which may have moved since)
    validate = [
        console_script("fairseq-validate"), p.data, "--user-dir", REPO / "fairseq_idpg",
        "--path", save / "checkpoint_best.pt",
        "--valid-subset", ",".join(p.evals), "--batch-size", p.batch_size, "--num-workers", 0,
        "--log-format", "json", "--log-interval", 10**9,  # one json line per subset, in order
    ]  # fmt: skip
    if p.method.frozen_backbone:
        validate += ["--model-overrides", repr({"backbone": str(p.model_dir / "model.pt")})]
    if p.request.max_tokens is not None:
        validate += ["--max-tokens", p.request.max_tokens]
    if not _cuda():
        validate.append("--cpu")
    from fairseq_cli.validate import cli_main  # this process has torch and fairseq: no second interpreter

    seconds, out = tee_here(validate, cli_main, save / "validate.log")
    p.timings["validate"] = round(seconds, 1)
    try:
        results = validate_scores(out, p.evals)
    except ValueError as e:
        raise RunError(f"{e} (see {save / 'validate.log'})") from None
    if select not in results:
        raise RunError(f"fairseq-validate printed no score for {select} (see {save / 'validate.log'})")
    return results


def _cuda():
    import torch

    return torch.cuda.is_available()
