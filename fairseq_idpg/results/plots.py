"""The table as figures (matplotlib's object API with the Agg canvas: no pyplot state, no display).

- ``bar_figure``: one axes per (model, budget), tasks grouped on x, one bar per label with its std
  as error bar (none for one seed), the published number as a black tick; missing cells have no bar.
- ``curve_figure``: one panel per (model, budget, task), one line per label: the dev metric over
  updates, averaged over the chosen runs' seeds (points a seed lacks are averaged over the others).
"""

import math

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .table import AVERAGE


def colors(long: pd.DataFrame) -> dict:
    """One colour per label, the same in every figure."""
    palette = [f"C{i % 10}" for i in range(long["label"].nunique())]
    return dict(zip(dict.fromkeys(long["label"]), palette, strict=False))


def _figure(rows: int, cols: int, width: float, height: float) -> tuple:
    figure = Figure(figsize=(width * cols, height * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, cols, squeeze=False)
    return figure, axes


def _message(text: str) -> Figure:
    figure, axes = _figure(1, 1, 6, 2)
    axes[0, 0].axis("off")
    axes[0, 0].text(0.5, 0.5, text, ha="center", va="center")
    return figure


def bar_figure(long: pd.DataFrame, paper_label: str = "paper") -> Figure:
    """Grouped bars from ``table.long_table``; ``paper_label``: the legend of the published numbers' ticks."""
    groups = list(long.groupby(["model", "budget"], sort=False))
    if not groups:
        return _message("no measured cell")
    figure, axes = _figure(len(groups), 1, 10, 3.5)
    color = colors(long)
    for ax, ((model, budget), group) in zip(axes[:, 0], groups, strict=False):
        cells = group[group["task"] != AVERAGE]
        tasks, labels = list(dict.fromkeys(cells["task"])), list(dict.fromkeys(cells["label"]))
        width = 0.8 / len(labels)
        paper_shown = False
        for i, label in enumerate(labels):
            mine = cells[(cells["label"] == label) & cells["mean"].notna()]
            if mine.empty:  # a row still to run: no bar, no legend entry
                continue
            x = np.array([tasks.index(t) for t in mine["task"]]) - 0.4 + width * (i + 0.5)
            ax.bar(
                x,
                mine["mean"],
                width,
                yerr=mine["std"].fillna(0).to_numpy(),
                capsize=2,
                label=label,
                color=color[label],
            )
            paper = mine["published"].notna().to_numpy()
            if paper.any():
                ax.scatter(x[paper], mine["published"][paper], marker="_", s=200, color="black", zorder=3,
                           label=None if paper_shown else paper_label)  # fmt: skip
                paper_shown = True
        measured = cells["mean"].dropna()
        low = min(measured.min(), cells["published"].min(skipna=True)) if len(measured) else 0
        ax.set_ylim(bottom=max(0, math.floor((low - 5) / 5) * 5) if np.isfinite(low) else 0)
        ax.set_xticks(range(len(tasks)), [f"{t}\n({_first(cells, t, 'metric')})" for t in tasks])
        ax.set_title(f"{model}, {'full data' if budget == 'full' else budget}: mean ± std over seeds")
        # beside the axes: over them it hides the bars of the last task
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return figure


def curve_figure(points: pd.DataFrame, long: pd.DataFrame) -> Figure:
    """Learning curves from ``records.curve_points`` of the chosen runs; metric names from ``long``."""
    if points.empty:
        return _message("no learning curve in these records (no 'curve' field)")
    order = {
        key: i for i, key in enumerate(dict.fromkeys(zip(long["model"], long["budget"], long["task"], strict=False)))
    }
    panels = sorted(points.groupby(["model", "budget", "task"], sort=False), key=lambda p: order.get(p[0], len(order)))
    color = colors(long)
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    figure, axes = _figure(rows, cols, 4, 3)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, ((model, budget, task), panel) in zip(axes.flat, panels, strict=False):
        for label in [x for x in color if x in set(panel["label"])]:
            runs = panel[panel["label"] == label]
            mean = runs.groupby("updates")["value"].mean().sort_index()
            seeds = runs.groupby(["seed", "data_seed"], dropna=False).ngroups
            ax.plot(mean.index, mean.to_numpy(), marker=".", label=f"{label} (n {seeds})", color=color[label])
        cells = long[(long["model"] == model) & (long["budget"] == budget)]
        ax.set_title(f"{task} ({model}, {budget})", fontsize="medium")
        ax.set_xlabel("updates")
        ax.set_ylabel(f"dev {_first(cells, task, 'metric')}")
        ax.legend(fontsize="small")
    return figure


def _first(cells: pd.DataFrame, task: str, column: str) -> str:
    values = cells.loc[(cells["task"] == task) & cells[column].notna(), column]
    values = [v for v in values if v]
    return str(values[0]) if values else ""
