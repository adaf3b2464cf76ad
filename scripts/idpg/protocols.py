#!/usr/bin/env python3
"""IDPG training protocols (full data, supplementary MNLI stage, few-shot) with the released
hyperparameters (IDPG Table 4 and the authors' scripts), as loops over the main job
(``scripts/run.sh``: prepare, fairseq-train, fairseq-validate). ``full.sh``, ``supplementary.sh``
and ``few_shot.sh`` beside this file call it.

    protocols.py full TASK [--method m-idpg-phm] [--model roberta.large] [--lrs 5e-3,1e-3,5e-4,1e-4]
        [--seeds 1,2,3,4,5]
    protocols.py supplementary TASK [--method s-idpg-phm] [--double] [--mnli-raw DIR] [--model roberta.large]
    protocols.py few-shot TASK [--method m-idpg-phm] [--k 100,500,1000] [--seeds 1,2,3,4,5] [--model DIR]
    common: [--work-dir DIR] [--dry-run] [-- fairseq-train flags]

- full: constant lr ("fixed") from the grid {5e-3, 1e-3, 5e-4, 1e-4}, batch 16 (32 for SST-2, QNLI,
  QQP, MNLI), 50 epochs (10 for those large tasks), dropout 0.1, Adam (0.9, 0.98) eps 1e-6, weight
  decay 0.1 (run.sh's defaults), fp16 with the authors' loss-scale flags on CUDA, best checkpoint by
  the dev metric; 5 seeds per lr. Prints mean and std per lr.
- supplementary (appendix A.4): stage 1 trains the method on MNLI with the backbone
  (``--idpg-train-backbone``), the prompt at position 0, lr 1e-5 linearly decayed (6% warmup),
  batch 32, 10 epochs; ``--double`` first doubles MNLI by appending a copy with the two
  sentences swapped (one shard). The stage-1 backbone is exported as a model folder
  (``model.pt`` + dictionary), the frozen backbone of stage 2: the method on TASK as in ``full``.
- few-shot (section 4.4): K in {100, 500, 1000} training examples and a 1,000-example dev set
  sampled from train (``run.sh --few-shot K --data-seed S``, which runs ``prepare_data.py
  --few-shot K --seed S``), the official dev set as test; lr 5e-4, batch 16, 50 epochs, 5 seeds;
  scored on the test split. The authors start from an MNLI-tuned RoBERTa: pass ``--model`` the
  folder exported by ``supplementary``.

Each run gets a work folder (``WORK/<protocol>/<run>``, data-bin shared through a link) and in it
run.sh's folder of that configuration (``checkpoints/<model>/<TASK>/<method>/lr<lr>.seed<seed>.<hash>``,
found again by its config.json), where results.json stays.
"""

import argparse
import json
import math
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from fairseq_idpg.preprocessing.formats import get_task  # noqa: E402
from fairseq_idpg.run import (  # noqa: E402
    RunError,
    bpe_args,
    data_folder,
    find_runs,
    model_dir,
    model_name,
    parse_valid_line,
    raw_dir,
)

RUN = [str(REPO / "scripts" / "run.sh")]
LR_GRID = (5e-3, 1e-3, 5e-4, 1e-4)
LARGE_TASKS = ("SST-2", "QNLI", "QQP", "MNLI")  # batch 32, 10 epochs
FP16_FLAGS = ["--fp16-init-scale", "4", "--threshold-loss-scale", "1", "--fp16-scale-window", "128"]


def full_schedule(task, train_rows):
    """(batch, epochs, updates) of the released full-data scripts."""
    batch, epochs = (32, 10) if task in LARGE_TASKS else (16, 50)
    return batch, epochs, epochs * math.ceil(train_rows / batch)


def _cuda():
    import torch

    return torch.cuda.is_available()


class Runner:
    def __init__(self, opts, extra):
        self.opts, self.extra, self.dry = opts, extra, opts.dry_run
        self.work = Path(opts.work_dir)
        self.model_name = model_name(opts.model)

    def raw(self, task, given=None):
        """The task's raw folder; a placeholder in a dry run where it is absent."""
        try:
            return raw_dir(task, given)
        except RunError:
            if self.dry:
                return f"<raw {task} folder>"
            raise

    def call(self, cmd):
        print("+ " + " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
        if not self.dry:
            subprocess.run([str(c) for c in cmd], check=True)

    def run_dir(self, protocol, name, shared_data=True):
        """A work folder for one run; its data-bin is the shared one unless ``shared_data`` is False."""
        folder = self.work / protocol / name
        if not self.dry:
            (self.work / "data-bin").mkdir(parents=True, exist_ok=True)
            folder.mkdir(parents=True, exist_ok=True)
            if shared_data and not (folder / "data-bin").exists():
                (folder / "data-bin").symlink_to((self.work / "data-bin").resolve(), target_is_directory=True)
        return folder

    def main_job(self, task, folder, lr, seed, batch, updates, epochs, *flags, method=None, model=None):
        """Run run.sh; returns (results.json as a dict, the run's folder), (None, a placeholder) in a dry run."""
        cmd = RUN + [
            task,
            "--method",
            method or self.opts.method,
            "--model",
            model or self.opts.model,
            "--work-dir",
            folder,
            "--lr",
            f"{lr:g}",
            "--seed",
            seed,
            "--total-batch",
            batch,
            "--max-update",
            updates,
            "--max-epoch",
            epochs,
            *flags,
        ]
        if _cuda():
            cmd += ["--fp16", *FP16_FLAGS]
        self.call(cmd + self.extra)
        method = method or self.opts.method
        if self.dry:
            return None, folder / "checkpoints" / self.model_name / task / method / "<run folder>"
        runs = find_runs(folder, self.model_name, task, method, seed=int(seed), lr=float(f"{lr:g}"))
        if not runs or not (runs[-1] / "results.json").is_file():
            raise RunError(f"no results.json of {task} {method} lr {lr:g} seed {seed} under {folder}")
        return json.loads((runs[-1] / "results.json").read_text()), runs[-1]


def summarize(rows, metric):
    """rows: (setting, seed, value); prints mean ± std per setting."""
    by = {}
    for setting, _, value in rows:
        by.setdefault(setting, []).append(value)
    for setting, values in by.items():
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{setting}: {metric} {statistics.mean(values):.2f} ± {std:.2f} over {len(values)} seed(s)")


def cmd_full(r, task):
    spec = get_task(task)
    batch, epochs, updates = full_schedule(spec.name, spec.sizes[0])
    rows = []
    for lr in r.opts.lrs:
        for seed in r.opts.seeds:
            res, _ = r.main_job(
                spec.name,
                r.run_dir("full", f"{spec.name}-{r.opts.method}-lr{lr:g}-seed{seed}"),
                lr,
                seed,
                batch,
                updates,
                epochs,
            )
            if res:
                rows.append((f"lr {lr:g}", seed, float(res["results"]["valid"][res["metric"]])))
    summarize(rows, spec.metric)


def double_pairs(src, dst):
    """``dst`` = ``src`` whose train split is followed by a copy with input0 and input1 swapped
    (IDPG A.4: "double the MNLI dataset by reordering the two sentences on one shard")."""
    from fairseq.data import indexed_dataset

    src, dst = Path(src), Path(dst)
    if not (src / "input1").is_dir():
        raise SystemExit(f"{src}: not a sentence-pair dataset (no input1/), nothing to swap")
    shutil.copytree(src, dst)
    for column, parts in (
        ("input0", ("input0", "input1")),
        ("input1", ("input1", "input0")),
        ("label", ("label", "label")),
    ):
        if not (src / column / "train.idx").exists():
            continue
        dtype = indexed_dataset.MMapIndexedDataset.Index(str(src / column / "train.idx")).dtype
        builder = indexed_dataset.MMapIndexedDatasetBuilder(str(dst / column / "train.bin"), dtype=dtype)
        for part in parts:
            builder.merge_file_(str(src / part / "train"))
        builder.finalize(str(dst / column / "train.idx"))
    if (src / "label" / "train.label").exists():  # regression labels (text)
        (dst / "label" / "train.label").write_text((src / "label" / "train.label").read_text() * 2)
    info = json.loads((src / "task.json").read_text())
    info["splits"]["train"] *= 2
    info["doubled_by_swapping"] = True
    (dst / "task.json").write_text(json.dumps(info, indent=1))


def export_backbone(checkpoint, base_dir, out_dir):
    """A model folder (model.pt + dictionary) whose weights are the backbone of a stage-1
    checkpoint trained with --idpg-train-backbone; the rest of model.pt is the base model's."""
    import torch

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    trained = torch.load(checkpoint, map_location="cpu", weights_only=False)["model"]
    base = torch.load(base_dir / "model.pt", map_location="cpu", weights_only=False)
    missing = [k for k in base["model"] if k not in trained]
    if missing:
        raise SystemExit(f"{checkpoint}: no backbone tensor {missing[0]} (was stage 1 run with --idpg-train-backbone?)")
    base["model"] = {k: trained[k].to(v.dtype) for k, v in base["model"].items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(base, out_dir / "model.pt")
    for name in ("dict.txt", "vocab.txt", "tokenizer_config.json"):
        if (base_dir / name).exists():
            shutil.copy(base_dir / name, out_dir / name)


def cmd_supplementary(r, task):
    mnli = get_task("MNLI")
    base = model_dir(r.opts.model)
    stage1 = r.run_dir(
        "supplementary", f"MNLI{'-doubled' if r.opts.double else ''}-{r.opts.method}", shared_data=not r.opts.double
    )
    data = stage1 / "data-bin" / r.model_name / "MNLI"
    rows = mnli.sizes[0]
    if r.opts.double:  # prepare MNLI, then the doubled copy where run.sh will look for it
        plain = r.work / "data-bin" / r.model_name / "MNLI"
        if r.dry or not (plain / "task.json").exists():
            r.call(
                [
                    sys.executable,
                    REPO / "scripts" / "prepare_data.py",
                    "MNLI",
                    "--raw",
                    r.raw("MNLI", r.opts.mnli_raw),
                    "--out",
                    plain,
                    *bpe_args(base),
                ]
            )
        print(f"+ double_pairs({plain}, {data})")
        if not r.dry and not data.exists():
            double_pairs(plain, data)
        rows *= 2
    batch, epochs = 32, 10
    updates = epochs * math.ceil(rows / batch)
    schedule = [
        "--lr-scheduler",
        "polynomial_decay",
        "--total-num-update",
        updates,
        "--warmup-updates",
        int(0.06 * updates),
    ]
    # the same raw folder as the doubled copy's provenance records, so run.sh keeps that copy
    raw = ["--raw", r.opts.mnli_raw] if r.opts.mnli_raw else []
    _, save = r.main_job(
        "MNLI",
        stage1,
        1e-5,
        r.opts.seeds[0],
        batch,
        updates,
        epochs,
        *raw,
        "--idpg-train-backbone",
        "--prompt-position",
        "0",
        *schedule,
    )
    exported = r.work / "supplementary" / f"{r.model_name}-mnli{'-doubled' if r.opts.double else ''}-{r.opts.method}"
    checkpoint = save / "checkpoint_best.pt"
    print(f"+ export_backbone({checkpoint}, {base}, {exported})")
    if not r.dry:
        export_backbone(checkpoint, base, exported)
    r.opts.model, r.model_name = str(exported), exported.name
    cmd_full(r, task)


def cmd_few_shot(r, task):
    spec = get_task(task)
    rows = []
    for k in r.opts.k:
        for seed in r.opts.seeds:
            # run.sh samples K train examples and the 1,000-example dev set (prepare_data.py --few-shot K --seed S)
            folder = r.run_dir("few-shot", f"{spec.name}-K{k}-seed{seed}")
            updates = 50 * math.ceil(k / 16)
            sample = ["--few-shot", k, "--data-seed", seed]
            _, save = r.main_job(spec.name, folder, 5e-4, seed, 16, updates, 50, *sample)
            data = data_folder(folder, r.model_name, spec.name, few_shot=k, data_seed=seed)
            tests = "test,test1" if spec.name == "MNLI" else "test"
            checkpoint = save / "checkpoint_best.pt"
            cmd = [
                "fairseq-validate",
                data,
                "--user-dir",
                REPO / "fairseq_idpg",
                "--path",
                checkpoint,
                "--valid-subset",
                tests,
                "--batch-size",
                "64",
                "--num-workers",
                "0",
            ] + ([] if _cuda() else ["--cpu"])
            print("+ " + " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
            if not r.dry:
                out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=True)
                score = parse_valid_line(out.stdout + out.stderr)["test"][spec.metric]
                (save / "test_results.json").write_text(json.dumps({"metric": spec.metric, "test": score}))
                rows.append((f"K={k}", seed, float(score)))
    summarize(rows, spec.metric + " (test)")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="scripts/idpg/protocols.py", description=__doc__.split("\n\n")[0])
    p.add_argument("protocol", choices=("full", "supplementary", "few-shot"))
    p.add_argument("task")
    p.add_argument(
        "--method",
        default=None,
        help="a method of fairseq_idpg/methods.py: an IDPG one or a baseline such as prompt-tuning-5 "
        "(default m-idpg-phm; s-idpg-phm for supplementary)",
    )
    p.add_argument("--model", default="standin", help="standin, roberta.base, roberta.large or a model folder")
    p.add_argument("--lrs", type=lambda s: [float(x) for x in s.split(",")], default=list(LR_GRID))
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3, 4, 5])
    p.add_argument(
        "--k", type=lambda s: [int(x) for x in s.split(",")], default=[100, 500, 1000], help="few-shot sizes"
    )
    p.add_argument("--double", action="store_true", help="supplementary: MNLI doubled by swapping the sentences")
    p.add_argument("--mnli-raw", help="supplementary: MNLI's raw folder (default $GLUE_DIR/MNLI or ../shared/data)")
    p.add_argument(
        "--work-dir", default=str(REPO / "checkpoints" / "idpg-protocols"), help="default checkpoints/idpg-protocols"
    )
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    opts = p.parse_args(ours)
    opts.method = opts.method or ("s-idpg-phm" if opts.protocol == "supplementary" else "m-idpg-phm")
    runner = Runner(opts, extra)
    try:
        {"full": cmd_full, "supplementary": cmd_supplementary, "few-shot": cmd_few_shot}[opts.protocol](
            runner, opts.task
        )
    except (RunError, subprocess.CalledProcessError) as e:
        print(f"protocols.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
