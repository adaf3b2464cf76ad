"""A paper's table from run rows (``records.read_records``): the lr chosen per cell, mean ± std over
seeds of the reported split, the average over tasks, the published numbers beside.

Selection (per cell = model, budget, task, label):
- ``mean-dev`` (default, the IDPG protocol): the lr whose mean dev score over its seeds is best;
  its seeds are reported. An lr is the pair (lr, head lr) where runs set the head's own (``--head-lr``).
- ``best-per-seed`` (LM-BFF's ``tools/gather_result.py``): for each seed the lr with the best dev
  score; the seeds' chosen runs are reported.

Reported: the mean and the **sample** standard deviation (ddof = 1; none for one seed) over the
chosen runs of the reported split's score, as the papers print it (the project's metrics are already
x 100, ``fairseq_idpg/metrics.py``). A cell without runs is missing ("—"), never zero. The average
column is the mean over the tasks a row has; a row missing some of the table's tasks gets its
average marked "(k of N tasks)", and the published average beside it is the paper's numbers averaged
over those same tasks.
"""

import math
import re
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pandas as pd

from ..preprocessing.formats import TASKS
from .records import CELL, LRS, REPLICATE, SPLIT_DEV, default_budget

SELECTIONS = ("mean-dev", "best-per-seed")
SELECTION_TEXT = {
    "mean-dev": "per cell, the lr with the best mean dev score over seeds (the IDPG protocol)",
    "best-per-seed": "per cell and seed, the lr with the best dev score (LM-BFF's protocol)",
}
SPLIT_DEV_TEXT = (  # only under split-dev tables: the others' text is as it was
    " Split-dev (ReFT's protocol): each dev set split in half with the data seed; one half selects the "
    "checkpoint, the other is the reported split."
)
AVERAGE = "average"
MISSING = "—"
DIVERGED = "diverged"
# the papers' column order (IDPG Table 1), then the rest of GLUE
TASK_ORDER = ["MPQA", "SUBJ", "CR", "MR", "SST-2", "QNLI", "RTE", "MRPC", "STS-B", "QQP", "MNLI", "CoLA"]


def choose_runs(runs: pd.DataFrame, selection: str = "mean-dev") -> pd.DataFrame:
    """The runs each cell reports: those of its chosen lr (``mean-dev``) or each seed's best (``best-per-seed``).
    Ties go to the smaller lr (the grid is searched from the top; a tie keeps the gentler step). A diverged
    run ranks below every score, so an lr where a seed diverged is chosen only where every lr has one (the
    cell is then shown as diverged)."""
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {', '.join(SELECTIONS)}, got {selection!r}")
    runs = runs if "head_lr" in runs else runs.assign(head_lr=math.nan)
    ordered = runs.sort_values(CELL + LRS + REPLICATE, kind="stable")
    diverged = ordered["diverged"].astype(bool) if "diverged" in ordered else pd.Series(False, index=ordered.index)
    ordered = ordered.assign(diverged=diverged, rank=ordered["dev"].where(~diverged, -math.inf))
    if selection == "best-per-seed":
        best = ordered.loc[ordered.groupby(CELL + REPLICATE, dropna=False, sort=False)["rank"].idxmax()]
        return best.drop(columns="rank").reset_index(drop=True)
    by_lr = ordered.groupby(CELL + LRS, dropna=False, sort=False)["rank"].mean().reset_index()
    chosen = by_lr.loc[by_lr.groupby(CELL, dropna=False, sort=False)["rank"].idxmax(), CELL + LRS]
    return ordered.merge(chosen, on=CELL + LRS).drop(columns="rank").reset_index(drop=True)


def format_lr(lrs) -> str:
    """One lr as ``5e-3``-style ``%g`` (an (lr, head lr) pair where the head had its own: ``0.3, head 0.005``);
    several (best-per-seed) as ``0.005 x3, 0.001 x2``, the largest first (pairs: ``0.3, head 0.005 x2; ...``)."""
    pairs = [lr if isinstance(lr, tuple) else (lr, None) for lr in lrs]
    counts = Counter((float(lr), None if pd.isna(head) else float(head)) for lr, head in pairs)
    ordered = sorted(counts, key=lambda pair: (pair[0], pair[1] or 0.0), reverse=True)
    if len(ordered) == 1:
        return lr_setting(*ordered[0])
    separator = "; " if any(head is not None for _, head in ordered) else ", "
    return separator.join(f"{lr_setting(*pair)} x{counts[pair]}" for pair in ordered)


def lr_setting(lr, head_lr=None) -> str:
    """``0.005``; ``0.3, head 0.005`` where the classification head trained at its own lr."""
    return f"{lr:g}" + (f", head {head_lr:g}" if head_lr is not None else "")


def cells(chosen: pd.DataFrame) -> pd.DataFrame:
    """One row per measured cell: method, metric, split, lr, n, mean, std (NaN for one seed)."""
    head_lrs = chosen["head_lr"] if "head_lr" in chosen else [None] * len(chosen)
    chosen = chosen.assign(lrs=list(zip(chosen["lr"], head_lrs, strict=False)))
    grouped = chosen.groupby(CELL, dropna=False, sort=False)
    out = grouped.agg(
        method=("method", lambda s: "+".join(sorted(set(s)))),
        metric=("metric", "first"),
        split=("split", lambda s: "/".join(sorted(set(s)))),
        lr=("lrs", format_lr),
        n=("reported", "size"),
        mean=("reported", lambda s: s.mean(skipna=False)),  # NaN where a chosen run diverged
        diverged=("diverged", "sum"),
        std=("reported", lambda s: s.std(ddof=1) if len(s) > 1 else math.nan),
    )
    return out.reset_index()


def task_columns(tasks, first: Sequence[str] = ()) -> List[str]:
    """The measured tasks in the order ``first`` gives, then IDPG's, then by name."""
    order = list(first) + [t for t in TASK_ORDER if t not in first]
    return sorted(set(tasks), key=lambda t: (order.index(t) if t in order else len(order), t))


def row_labels(methods: pd.Series, labels: Sequence[str] = (), published_methods: Sequence[str] = ()) -> List[str]:
    """Labels (``methods``: label -> method) in the given order, then the published table's row order, then by name."""
    labels, published_methods = list(labels), list(published_methods)

    def rank(label):
        if label in labels:
            return (0, labels.index(label), "")
        method = methods[label]
        return (1, published_methods.index(method) if method in published_methods else len(published_methods), label)

    return sorted(methods.index, key=rank)


def long_table(
    measured: pd.DataFrame,
    published: Optional[pd.DataFrame] = None,
    labels: Sequence[str] = (),
    tasks: Sequence[str] = (),
    spec_methods: Optional[Dict[str, str]] = None,
) -> pd.DataFrame:
    """Every (model, budget) group's full grid, long: one row per (label, task) including missing
    cells (no mean), plus one ``average`` row per label; ``published`` / ``published_std`` beside.

    ``published``: rows of ``published.lookup`` (budget, task, method, mean, std); ``labels``,
    ``tasks``: the row and column order (a sweep spec's), before the published table's; ``tasks``
    and ``spec_methods`` (a spec's label -> method) are in every group's grid, measured or not."""
    spec_methods = spec_methods or {}
    order = list(tasks) + (_published_tasks(published) or [])
    columns = CELL + ["method", "metric", "split", "lr", "n", "mean", "std", "diverged", "published", "published_std"]
    blocks = []
    for (model, budget), group in measured.groupby(["model", "budget"], sort=False):
        # a spec's cells are all rows and columns, run or not, so a sweep in progress shows what is missing
        task_names = task_columns(list(group["task"]) + list(tasks), order)
        methods = pd.concat([group.groupby("label")["method"].first(), pd.Series(spec_methods, dtype=object)])
        methods = methods[~methods.index.duplicated()]
        label_names = row_labels(methods, labels, _published_methods(published) or [])
        grid = pd.MultiIndex.from_product([label_names, task_names], names=["label", "task"]).to_frame(index=False)
        grid.insert(0, "budget", budget)
        grid.insert(0, "model", model)
        full = grid.merge(group, on=CELL, how="left")
        full["method"] = full["label"].map(methods)
        full["metric"] = full["task"].map(group.groupby("task")["metric"].first())
        full = _with_published(full, published)
        blocks.append(full)
        blocks.append(_averages(full, task_names))
    if not blocks:
        return pd.DataFrame(columns=columns)
    return pd.concat(blocks, ignore_index=True)[columns]


def _published_tasks(published):
    return None if published is None else list(dict.fromkeys(published["task"]))


def _published_methods(published):
    return None if published is None else list(dict.fromkeys(published["method"]))


def _with_published(full: pd.DataFrame, published: Optional[pd.DataFrame]) -> pd.DataFrame:
    """``published`` / ``published_std`` by (budget, task, method), else by the label as a method name.
    A table of per-task K, ``K=1000 (CR: 775)``, takes the paper's numbers at its default K (``K=1000``)
    for every task: the paper samples K = 1000 from CR, whose train file leaves 775 beside the dev set."""
    full = full.assign(published=math.nan, published_std=math.nan)
    if published is None or published.empty:
        return full
    index = published.drop_duplicates(["budget", "task", "method"]).set_index(["budget", "task", "method"])
    for i, row in full.iterrows():
        budgets = dict.fromkeys([row["budget"], default_budget(row["budget"])])
        keys = [(budget, row["task"], name) for budget in budgets for name in (row["method"], row["label"])]
        found = next((key for key in keys if key in index.index), None)
        if found is not None:
            full.loc[i, "published"] = index.loc[found, "mean"]
            full.loc[i, "published_std"] = index.loc[found, "std"]
    return full


def _averages(full: pd.DataFrame, tasks: List[str]) -> pd.DataFrame:
    """Per label: the mean over its measured tasks (``n``: how many) and the published mean over the same tasks."""
    rows = []
    for label, cells_ in full.groupby("label", sort=False):
        measured = cells_.dropna(subset=["mean"])
        paper = measured["published"]
        rows.append({
            "model": cells_["model"].iloc[0], "budget": cells_["budget"].iloc[0], "task": AVERAGE, "label": label,
            "method": cells_["method"].iloc[0], "metric": "", "split": "", "lr": "",
            "n": len(measured), "mean": measured["mean"].mean() if len(measured) else math.nan, "std": math.nan,
            "diverged": 0,
            "published": paper.mean() if len(paper) and paper.notna().all() else math.nan, "published_std": math.nan,
        })  # fmt: skip
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------- Markdown
def score_text(mean, std, published=math.nan, digits=1, diverged=0) -> str:
    if pd.notna(diverged) and diverged > 0:
        return DIVERGED
    if pd.isna(mean):
        return MISSING
    text = f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if pd.notna(std) else "")
    return text + (f" (paper {published:.{digits}f})" if pd.notna(published) else "")


def lr_text(cell: pd.Series) -> str:
    """``0.005 (n 3)``: the chosen lr and the seed count of a cell (``(n 3, 1 diverged)`` where runs diverged)."""
    diverged = _diverged(cell)
    if pd.notna(diverged) and diverged > 0:
        return f"{cell['lr']} (n {cell['n']:.0f}, {diverged:.0f} diverged)"
    return MISSING if pd.isna(cell["mean"]) else f"{cell['lr']} (n {cell['n']:.0f})"


def average_text(average: pd.Series, tasks: int) -> str:
    """``85.0 (paper 86.1)``; ``85.0 (2 of 3 tasks) (paper 86.1)`` for a row with fewer tasks."""
    if pd.isna(average["mean"]):
        return MISSING
    fewer = f" ({average['n']:.0f} of {tasks} tasks)" if average["n"] < tasks else ""
    paper = f" (paper {average['published']:.1f})" if pd.notna(average["published"]) else ""
    return f"{average['mean']:.1f}{fewer}{paper}"


def markdown(long: pd.DataFrame, selection: str = "mean-dev", published_text: Optional[str] = None) -> str:
    """The tables as Markdown: per (model, budget) the scores (rows: labels, columns: tasks and the
    average) and the chosen lr with the seed count per cell, then how they were made."""
    out = []
    for (model, budget), group in long.groupby(["model", "budget"], sort=False):
        measured = group[group["task"] != AVERAGE]
        tasks = list(dict.fromkeys(measured["task"]))
        labels = list(dict.fromkeys(measured["label"]))
        cell = measured.set_index(["label", "task"])
        average = group[group["task"] == AVERAGE].set_index("label")
        metrics = {t: _first(measured.loc[measured["task"] == t, "metric"]) for t in tasks}
        splits = {t: _first(measured.loc[measured["task"] == t, "split"]) for t in tasks}
        out.append(f"## {model}, {'full data' if budget == 'full' else budget}\n")
        out.append(
            "| method | " + " | ".join(f"{t} ({metrics[t]})" if metrics[t] else t for t in tasks) + " | average |"
        )
        out.append("|---|" + "---:|" * (len(tasks) + 1))
        for label in labels:
            scores = [
                score_text(
                    *cell.loc[(label, t), ["mean", "std", "published"]], diverged=_diverged(cell.loc[(label, t)])
                )
                for t in tasks
            ]
            out.append(f"| {label} | " + " | ".join(scores) + f" | {average_text(average.loc[label], len(tasks))} |")
        out.append("")
        out.append("Chosen lr (seeds):\n")
        out.append("| method | " + " | ".join(tasks) + " |")
        out.append("|---|" + "---:|" * len(tasks))
        for label in labels:
            chosen = [lr_text(cell.loc[(label, t)]) for t in tasks]
            out.append(f"| {label} | " + " | ".join(chosen) + " |")
        out.append("")
        reported = {t: split_label(t, splits[t], budget) for t in tasks}
        out.append("Reported split: " + ", ".join(f"{t} {reported[t] or MISSING}" for t in tasks) + ".\n")
        default = default_budget(budget)
        if default != budget and group["published"].notna().any():
            trained = f"where this table trained with {budget}"
            out.append(f"(paper x) is the paper's number at {default} for every task, {trained}.\n")
    out.append(
        f"Selection: {SELECTION_TEXT[selection]}. Each cell: mean ± sample std (ddof = 1; none for one seed) over "
        "seeds of the reported split: the task's official labelled set (GLUE: dev; MR, CR, MPQA, SUBJ: test) "
        "where the dev set that selects was sampled from train, else the selection split itself (full data: "
        f"the official set; the papers report GLUE dev). {MISSING}: no run. {DIVERGED}: at every lr tried, a seed's "
        "loss became NaN or inf (the chosen lr's runs are listed with how many diverged). The average is over the "
        "tasks a row has; '(k of N tasks)' marks a row with fewer."
        + (SPLIT_DEV_TEXT if (long["budget"] == SPLIT_DEV).any() else "")
        + (f" (paper x): {published_text}; its average is over the same tasks as the row's." if published_text else "")
    )  # fmt: skip
    return "\n".join(out) + "\n"


def cost_markdown(chosen: pd.DataFrame) -> str:
    """What each method's chosen runs cost, as Hugging Face PEFT's method comparison shows it beside the scores:
    per model and method, the median seconds per update and the largest peak memory over the runs that recorded
    them (the run record's ``cost``), and how many did; "" when none did."""
    if "seconds_per_update" not in chosen or chosen[["seconds_per_update", "peak_memory_mb"]].isna().all().all():
        return ""
    out = ["## Cost per method\n", "| model | method | s / update (median) | peak memory MB (largest) | runs |",
           "|---|---|---:|---:|---:|"]  # fmt: skip
    kinds = set()
    for (model, label), runs in chosen.groupby(["model", "label"], sort=False):
        speed, memory = runs["seconds_per_update"].dropna(), runs["peak_memory_mb"].dropna()
        kinds.update(k for k in runs["memory"] if k)
        median = f"{speed.median():.3g}" if len(speed) else MISSING
        peak = f"{memory.max():,.0f}" if len(memory) else MISSING
        out.append(f"| {model} | {label} | {median} | {peak} | {max(len(speed), len(memory))} of {len(runs)} |")
    out.append(
        "\nSeconds per update: the median over fairseq-train's log intervals of 1 / its ups (updates per second). "
        f"Peak memory: {' / '.join(sorted(kinds)) or MISSING} (the trainer's; a fused "
        f"group's runs share one process and record none). {MISSING}: no chosen run recorded it.\n"
    )
    return "\n".join(out)


def split_label(task: str, splits: str, budget: str) -> str:
    """The reported split as the task's files name it, for the ``Reported split:`` line. A record names
    fairseq's split: ``valid`` / ``test``, then ``valid1`` / ``test1``... for the task's next labelled file.
    Those files come after train in ``TASKS[task].files``: GLUE's dev set (``dev.tsv``, MNLI's
    ``dev_matched.tsv``; GLUE's test labels are not public) and the test set of MR, CR, MPQA, SUBJ
    (``test.csv``). They are ``test*`` where the dev set that selects was sampled from train (every budget
    but ``full`` and ``split-dev``), else ``valid*``; a sampled ``valid`` is that dev set. ``split-dev`` halves
    each file: ``valid*`` the half that selects, ``test*`` the half that is scored. Unknown tasks keep
    fairseq's name."""
    labels = []
    for split in filter(None, splits.split("/")):
        found = re.fullmatch(r"(valid|test)(\d*)", split)
        files = TASKS[task].files if task in TASKS else ()
        index = 1 + int(found.group(2) or 0) if found else len(files)
        name = Path(files[index]).stem if index < len(files) else split
        if found and budget == SPLIT_DEV:
            labels.append(f"{name} ({'selecting' if found.group(1) == 'valid' else 'scored'} half)")
        elif found and found.group(1) == "valid" and budget != "full":
            labels.append("dev (sampled from train)")
        else:
            labels.append(name)
    return "/".join(dict.fromkeys(labels))


def _diverged(cell: pd.Series):
    return cell["diverged"] if "diverged" in cell else 0


def _first(values):
    values = [v for v in values if isinstance(v, str) and v]
    return "/".join(dict.fromkeys(values)) if values else ""
