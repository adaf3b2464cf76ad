"""The commands README.md, docs/*.md and examples/*/README.md tell a user to run, as written.

Every command of their ``bash``/``sh`` blocks is either run by a test (here, or the test named) or listed in
``RULES`` as not run in CI, with the reason; a command no rule covers fails the first test, so a new command in
a page is classified when it is written. A command not run is at least parsed: its program's ``--help``, the
command itself with ``--dry-run`` where the program has one, or ``bash -n`` for a script without options.
Only documented placeholders are substituted (``$GLUE_DIR``, a run folder, ``DATA``/``SAVE``).

Also: the pages speak to users (no issue numbers, machines lent to the project, sessions or folders beside the
developers' checkout), docs/sweeps.md's sample estimates are what the commands print, and each example README's
GPU cost is what the sweep's estimate says.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from preloaded_support import preloaded

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "examples").glob("*/README.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
TIMINGS = "docs/data/gpu_check/nvidia-h200.roberta.large.json"


class Command(NamedTuple):
    page: str  # relative to the repository
    text: str  # the command's words joined by spaces (comment dropped, continuation lines joined)
    argv: tuple  # its words, as the shell splits them


def documented_commands():
    """Every command of the pages' bash and sh blocks."""
    found = []
    for page in PAGES:
        for language, body in FENCE.findall(page.read_text(encoding="utf-8")):
            if language not in ("bash", "sh"):
                continue
            for line in body.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words:
                    found.append(Command(page.relative_to(REPO).as_posix(), " ".join(words), tuple(words)))
    return found


# (pattern over "page: command", how it is checked, why it is not run as written here); first match wins.
# How: "run" (run as written, below), "slow-run" (run as written by the slow test below), "help" (its
# program's --help), "dry-run" (the command with --dry-run), "syntax" (bash -n of its script), "shell" (a
# variable or a folder: nothing to check), "elsewhere:TEST" (run by that test, in its own setting).
RULES = [
    (
        r"^docs/architecture\.md: ",
        "elsewhere:tests/test_architecture_docs.py",
        "a worked example's commands, run in a copy with the example applied",
    ),
    (
        r"SPEC\.yaml .*--timings",
        "elsewhere:test_an_example_gpu_cost_is_the_sweeps_estimate",
        "a command for each spec of the table under it: run for each, below",
    ),
    (
        r": scripts/(run|sweep)\.sh .*--model models/",
        "help",
        "needs a model folder an earlier step makes (examples/idpg/supplementary.py, scripts/convert_hf_to_fairseq.py)",
    ),
    (r": bash scripts/install\.sh$", "syntax", "installs packages into the environment (CI runs it first)"),
    (r": python3? -m pytest tests", "help", "the test suite itself"),
    (
        r"^README\.md: scripts/run\.sh SST-2 --method m-idpg-phm$",
        "elsewhere:tests/test_fresh_clone.py",
        "the main job, 300 updates (about 6 minutes); run on a fresh offline clone at 5 updates, and --dry-run here",
    ),
    (
        r": (bash )?scripts/download\.sh ",
        "help",
        "downloads from the internet (CI is offline; its code is tests/test_download.py's, with a fake network)",
    ),
    (r": export |^\S+: \w+=\S+$|: mkdir -p ", "shell", "sets a shell variable or makes a folder"),
    (r": (WATCH_PID=\S+ )?nohup ", "syntax", "starts the stand-in studies in the background (CPU-days)"),
    (r": scripts/check_gpu\.sh ", "help", "needs a GPU (and roberta.large's size)"),
    (
        r": scripts/gpu_proof\.sh",
        "help",
        "the device script: 8 minutes of a GPU at roberta.large's shape (its CPU mode runs in tests/test_gpu_proof.py)",
    ),
    (r": scripts/train\.sh ", "help", "trains roberta.large on several GPUs (a placeholder's arguments)"),
    (r": fairseq-train .* \.\.\.$", "help", "an excerpt: its '...' stands for the rest of a command"),
    (r": python scripts/prepare_data\.py RTE --raw \$GLUE_DIR/RTE .*--bpe gpt2", "slow-run", ""),
    (r": fairseq-validate ", "slow-run", ""),
    (
        r"^docs/using\.md: python3 scripts/(export_checkpoint|export_peft|import_peft|merge_lora)\.py ",
        "elsewhere:tests/test_interop.py",
        "needs a trained run of the method (tests/test_interop.py, "
        "test_interop_adapters.py, test_merge_lora.py, test_tool_outputs.py run these tools on one); --help here",
    ),
    (r": (CUDA_VISIBLE_DEVICES=\S+ )?scripts/sweep\.sh \S+ .*--dry-run", "run", ""),
    (
        r": (CUDA_VISIBLE_DEVICES=\S+ )?scripts/sweep\.sh examples/\w+/(smoke|table3-standin)\.yaml",
        "dry-run",
        "a stand-in sweep of minutes on a CPU (tests/test_sweep.py runs a smoke sweep)",
    ),
    (r": (CUDA_VISIBLE_DEVICES=\S+ )?scripts/sweep\.sh examples/study/", "dry-run", "the stand-in studies: CPU-days"),
    (
        r": scripts/sweep\.sh examples/idpg/fused-standin\.yaml ",
        "dry-run",
        "the --fuse timing: 20 stand-in runs, fused and one by one (most of an hour on a busy 2-core CPU)",
    ),
    (
        r"^docs/benchmarks\.md: python -m fairseq_idpg\.results\.paired sweeps/",
        "help",
        "compares the records of the two sweeps above, which only they write (tests/test_results_paired.py)",
    ),
    (
        r": (CUDA_VISIBLE_DEVICES=\S+ )?scripts/sweep\.sh ",
        "dry-run",
        "a paper's table on GPUs (the example READMEs state its GPU-hours)",
    ),
    (r": scripts/run\.sh .*--dry-run", "run", ""),
    (r": scripts/run\.sh .*--model (roberta|models/)", "dry-run", "needs the roberta.large checkpoint and GPUs"),
    (
        r": scripts/run\.sh ",
        "dry-run",
        "a stand-in run of 100-300 updates (minutes; tests/test_every_method.py trains every method)",
    ),
    (r": python3? examples/idpg/supplementary\.py ", "dry-run", "trains roberta.large on MNLI (GPU-days)"),
    (
        r"^docs/sweeps\.md: (eval \$\(bash scripts/slurm_cluster\.sh start\)|bash scripts/slurm_cluster\.sh stop"
        r"|squeue; )",
        "elsewhere:tests/test_slurm.py",
        "a one-machine Slurm cluster (root, its packages) and its jobs: the Slurm tests start it and drive it",
    ),
    (
        r": python3? -m fairseq_idpg\.(run\.group|fused\.train) ",
        "help",
        "trains runs together (minutes); tests/test_fused_train.py and tests/test_sweep_fused.py train them",
    ),
    (
        r": python3? -m fairseq_idpg\.results ",
        "help",
        "reads a sweep's records (none in CI) or rewrites the committed tables of docs/results/",
    ),
    (r": python3? scripts/count_params\.py ", "run", ""),
    (r": python3? scripts/benchmark_\w+\.py", "help", "a benchmark: minutes of timing"),
    (r": python3? scripts/bench_(serving|fused|updates|start)\.py", "help", "a benchmark: minutes of timing"),
    (
        r"^docs/serving\.md: python3? -m fairseq_idpg\.serve ",
        "help",
        "serves until stopped, and needs trained runs; tests/test_serve.py serves runs it builds, its command too",
    ),
    (r"^docs/serving\.md: curl ", "elsewhere:tests/test_serve.py", "asks the service above (tested over loopback)"),
]


def rule(command):
    where = f"{command.page}: {command.text}"
    return next(((how, why) for pattern, how, why in RULES if re.search(pattern, where)), None)


COMMANDS = documented_commands()


def test_every_documented_command_is_run_or_listed_with_a_reason():
    assert len(COMMANDS) > 60, len(COMMANDS)  # the reader finds the pages' commands
    unclassified = [f"{c.page}: {c.text}" for c in COMMANDS if rule(c) is None]
    assert not unclassified, "commands neither run nor listed as not run (add a rule):\n" + "\n".join(unclassified)
    for command in COMMANDS:
        how, why = rule(command)
        assert how in ("run", "slow-run") or why, f"{command}: not run, and no reason given"
    readme = [c.text for c in COMMANDS if c.page == "README.md"]
    assert "scripts/run.sh SST-2 --method m-idpg-phm" in readme  # the main job, found as written
    assert any(c.startswith("fairseq-validate data-bin/RTE") for c in readme)


def program(argv):
    """The program part of a command (leading VAR=value dropped; python's -m MODULE or script kept)."""
    argv = [a for a in argv if not re.fullmatch(r"\w+=\S*", a)] if "=" in argv[0] else argv
    if argv[0] in ("python", "python3"):
        return ["python", *argv[1:3]] if argv[1] == "-m" else ["python", argv[1]]
    return argv[:2] if argv[0] == "bash" else argv[:1]


def check_of(command):
    """(argv, what it checks) that stands for ``command`` when it is not run as written."""
    how, _ = rule(command)
    argv = command.argv
    if how == "syntax":
        script = next(a for a in argv if a.endswith(".sh"))
        return ["bash", "-n", script]
    if how == "dry-run" or how.endswith("test_fresh_clone.py"):  # the main job: its dry run here
        words = [a for a in argv if not re.fullmatch(r"\w+=\S*", a)]
        return words if "--dry-run" in words else [*words, "--dry-run"]
    return [*program(argv), "--help"]


def checks(how_wanted):
    """Unique (argv, a command it stands for) of the commands checked ``how_wanted``."""
    out = {}
    for command in COMMANDS:
        how, _ = rule(command) or (None, None)  # an unclassified command: the first test says so
        if how in how_wanted:
            argv = check_of(command) if how != "run" else list(command.argv)
            out.setdefault(shlex.join(argv), command)
    return out


def run(argv, cwd=REPO, env=None, timeout=300):
    """The command's result: a dry run or usage of the package's commands in a fork of an interpreter that
    imported the package once (tests/preloaded_support.py), anything else as a process of its own."""
    argv = [sys.executable if a in ("python", "python3") else a for a in argv]
    environment = {**os.environ, **(env or {})}
    done = preloaded.run(argv, cwd=cwd, env=environment, timeout=timeout)
    if done is not None:
        return done
    return subprocess.run(argv, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout)


def test_a_dry_run_in_a_fork_of_the_preloaded_interpreter_prints_what_its_own_process_prints():
    """What ``run`` relies on: the fork path is taken here (one thread after the imports), and a sweep's dry run
    in it prints, exits and writes what the same command as a process of its own does."""
    argv = ["scripts/sweep.sh", "examples/idpg/smoke.yaml", "--dry-run"]
    forked = preloaded.run(argv, cwd=REPO, env=dict(os.environ))
    assert preloaded.forkable and forked is not None
    alone = subprocess.run(["bash", *argv], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert (forked.returncode, forked.stdout, forked.stderr) == (alone.returncode, alone.stdout, alone.stderr)
    assert forked.returncode == 0 and "smoke" in forked.stdout


RUN_HERE = checks({"run"})
PARSED = checks({"help", "dry-run", "syntax", "elsewhere:tests/test_interop.py", "elsewhere:tests/test_fresh_clone.py"})
PARSED = {check: command for check, command in PARSED.items() if check not in RUN_HERE}  # once is enough


def readme_first(checks):
    """README's first-hour commands run in every suite; the other pages' (5-20 s each, minutes together) are slow."""
    return [c if checks[c].page == "README.md" else pytest.param(c, marks=pytest.mark.slow) for c in checks]


@pytest.mark.parametrize("check", readme_first(PARSED))
def test_a_command_not_run_here_parses(check):
    """Its --help, its --dry-run or bash -n ends with exit status 0 (a dry run's warning about missing models or
    data is expected: the reason it is not run)."""
    out = run(shlex.split(check))
    assert out.returncode == 0, f"{check} (for: {PARSED[check].text}):\n{(out.stdout + out.stderr)[-3000:]}"
    if check.endswith("--help"):
        assert "usage:" in out.stdout


@pytest.mark.parametrize("command", readme_first(RUN_HERE))
def test_a_command_runs_as_written(command):
    out = run(shlex.split(command))
    assert out.returncode == 0, f"{command}:\n{(out.stdout + out.stderr)[-3000:]}"


# ---------------------------------------------------------------------------------------- users only
USER_PAGES = ["README.md", "docs", "examples", "fairseq_idpg/published"]
NOT_FOR_USERS = re.compile(r"issue [0-9]|\blent\b|the brief|\.\./shared/(research|papers)|\bsessions?\b", re.I)


def test_the_pages_speak_to_users():
    """No issue numbers, machines lent to the project, sessions or the developers' research notes and papers
    beside the checkout: a user has none of them."""
    found = []
    for top in USER_PAGES:
        files = [REPO / top] if (REPO / top).is_file() else sorted((REPO / top).rglob("*"))
        for path in (f for f in files if f.is_file() and f.suffix in (".md", ".yaml", ".json", ".py")):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if NOT_FOR_USERS.search(line):
                    found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:120]}")
    assert not found, "\n".join(found)


# ---------------------------------------------------------------------------------------- estimates
def sample_outputs(page):
    """(command, the lines shown) of the page's output samples: a fenced block whose first line is ``$ CMD``."""
    text = (REPO / page).read_text(encoding="utf-8")
    return [(body.split("\n", 1)[0][2:], body.split("\n")[1:-1]) for _, body in FENCE.findall(text)
            if body.startswith("$ ")]  # fmt: skip


SWEEPS_SAMPLES = sample_outputs("docs/sweeps.md")


def test_docs_sweeps_shows_two_estimates():
    commands = [command for command, _ in SWEEPS_SAMPLES]
    assert commands[0] == "scripts/sweep.sh examples/idpg/table1.yaml --model roberta.large --dry-run"
    assert f"--timings {TIMINGS}" in commands[1]


@pytest.mark.parametrize("index", range(len(SWEEPS_SAMPLES)))
def test_docs_sweeps_sample_output_is_what_the_command_prints(index):
    command, shown = SWEEPS_SAMPLES[index]
    out = run(shlex.split(command))
    assert out.returncode == 0, out.stderr[-2000:]

    def same(text):  # the local executor's threads are this machine's cores
        return re.sub(r"\d+ thread\(s\)", "N thread(s)", text)

    printed = same((out.stdout + out.stderr).replace(str(REPO), "<checkout>")).splitlines()
    missing = [line for line in shown if line.strip() != "..." and same(line) not in printed]
    assert not missing, f"{command}: lines shown but not printed:\n" + "\n".join(missing)


COST_ROW = re.compile(r"^\| `(\S+)\.yaml` \| ([\d,]+) \| ([\d,]+)", re.M)


def number(text):
    return int(text.replace(",", ""))


def gpu_costs():
    """(README, command with SPEC, {spec: (runs, H200-hours)}) of each example README's "GPU cost" section."""
    found = []
    for page in sorted((REPO / "examples").glob("*/README.md")):
        text = page.read_text(encoding="utf-8")
        section = text.split("## GPU cost", 1)[1].split("\n## ", 1)[0] if "## GPU cost" in text else ""
        command = next((body.strip() for lang, body in FENCE.findall(section) if lang == "bash"), None)
        rows = {
            spec: (int(runs.replace(",", "")), int(h.replace(",", ""))) for spec, runs, h in COST_ROW.findall(section)
        }
        found.append((page.parent.name, command, rows))
    return found


def test_every_paper_example_states_its_gpu_cost_with_the_command():
    costs = {name: (command, rows) for name, command, rows in gpu_costs()}
    assert {"idpg", "dpt", "inducer"} <= set(costs)
    for name in ("idpg", "dpt", "inducer"):
        command, rows = costs[name]
        assert command and f"--dry-run --timings {TIMINGS}" in command and "SPEC" in command, name
        assert rows, f"examples/{name}/README.md: no cost rows"
    assert costs["idpg"][1]["table1"] == (1800, 1013)  # IDPG Table 1: 1,013 H200-hours


@pytest.mark.parametrize(
    "name, spec",
    [pytest.param(n, s, marks=() if (n, s) == ("idpg", "table1") else pytest.mark.slow)
     for n, _, rows in gpu_costs() for s in rows],
)  # fmt: skip
def test_an_example_gpu_cost_is_the_sweeps_estimate(name, spec):
    (command, rows) = next((c, r) for n, c, r in gpu_costs() if n == name)
    out = run(shlex.split(command.replace("SPEC", spec)))
    assert out.returncode == 0, out.stderr[-2000:]
    runs, hours = rows[spec]
    total = re.search(r"^  total\s+([\d,]+)\s+[\d,]+\s+([\d,.]+)", out.stdout, re.M)
    assert int(total[1].replace(",", "")) == runs
    assert round(float(total[2].replace(",", ""))) == hours, total[0]
    assert f"per-update times: {TIMINGS}, measured on NVIDIA H200" in out.stdout


def test_the_estimate_says_where_its_per_update_times_come_from():
    from fairseq_idpg.sweep_estimate import Row, measured_where

    cpu = Row("lora", measured_on=("docs/data/seconds_per_update_cpu.csv (1 thread)", "cpu (2 cores, shared)"))
    line = measured_where([cpu, Row("efl")])
    assert line.startswith("per-update times: CPU measurements (docs/data/seconds_per_update_cpu.csv (1 thread), ")
    assert "these are CPU-hours, not a GPU's; for GPU-hours give --timings FILE" in line
    gpu = Row("lora", measured_on=(TIMINGS, "NVIDIA H200"))
    line = measured_where([gpu, cpu])
    assert "measured on NVIDIA H200" in line and "measured on cpu" in line and "CPU-hours" not in line
    assert measured_where([Row("efl", seconds=None)]) == "per-update times: none measured for these runs"


# ---------------------------------------------------------------------------------------- run as written, slow
def as_written(command, work, data, checkpoint):
    """``command``'s argv with its placeholders filled: $VARIABLES from the environment, the data folder
    (fairseq-validate's first argument) and the checkpoint (``--path``), an optional ``[...]`` part dropped."""
    argv = [os.path.expandvars(a) for a in command.argv]
    argv = [a for a in argv if not (a.startswith("[") or a.endswith("]"))]
    if argv[0] == "fairseq-validate":
        argv[1] = str(data)
        argv[argv.index("--path") + 1] = str(checkpoint)
    return argv


@pytest.mark.slow  # 1 to 2 minutes: a 5-update run, RTE prepared with the GPT-2 BPE, each distinct fairseq-validate
def test_the_pages_scoring_and_preparing_commands_run_as_written(
    tmp_path, standin_model, glue_slices, roberta_bpe, monkeypatch
):
    work = tmp_path / "work"
    (work / "models").mkdir(parents=True)
    (work / "scripts").symlink_to(REPO / "scripts")  # prepare_data.py writes under its cwd: this folder
    (work / "models" / "minilm-l6-fairseq").symlink_to(standin_model)
    (work / "models" / "gpt2_bpe").symlink_to(roberta_bpe)  # scripts/download.sh bpe's folder
    env = {"GLUE_DIR": str(glue_slices), "PYTHONPATH": str(REPO)}
    trained = run(["scripts/run.sh", "SST-2", "--method", "m-idpg-phm", "--max-update", "5", "--work-dir", str(work)],
                  env=env)  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    (folder,) = (work / "checkpoints" / "standin" / "SST-2" / "m-idpg-phm").iterdir()
    data, checkpoint = work / "data-bin" / "standin" / "SST-2", folder / "checkpoint_best.pt"
    ran, done = [], {}
    for command in (c for c in COMMANDS if (rule(c) or ("",))[0] == "slow-run"):
        for key, value in env.items():  # for expandvars; undone after the test (later tests plan without them)
            monkeypatch.setenv(key, value)
        argv = as_written(command, work, data, checkpoint)
        # once each: with their placeholders filled, several pages' fairseq-validate commands are the same command
        # (7 commands, 3 distinct; about 12 s each)
        if tuple(argv) not in done:
            # fairseq-validate's --user-dir fairseq_idpg is the checkout's (it writes nothing there)
            done[tuple(argv)] = run(
                argv, cwd=REPO if argv[0] == "fairseq-validate" else work, env={**env, "SAVE": str(folder)}
            )
        out = done[tuple(argv)]
        assert out.returncode == 0, f"{command.page}: {command.text}\n{(out.stdout + out.stderr)[-3000:]}"
        if argv[0] == "fairseq-validate":
            assert re.search(r"valid on 'valid\d*' subset .*accuracy", out.stdout + out.stderr), command.text
        ran.append(command.page)
    assert (work / "data-bin" / "RTE" / "task.json").is_file()  # README's prepare_data.py command
    assert {"README.md", "docs/training.md", "docs/metrics.md"} <= set(ran), ran
