#!/usr/bin/env python3
"""Plot the rank probe over training from a fairseq-train log, like DPT's Figure 3.

    python scripts/plot_rank_probe.py checkpoints/standin/SST-2/dpt-rank-probe/<run>/train.log \
        --out docs/img/rank_probe.png [--title TEXT]

Reads every ``valid on 'valid' subset`` line (``prompt_rank`` = number of positive entries of s
in P = U ReLU(diag(s)) V, logged by ``roberta_prompt`` at each validation, and ``num_updates``) and
the probe size r (``dpt_probe_rank`` in the logged config). Plots the positive entries and the
non-positive ones (r - positive) against training updates; update 0 is the initialisation,
where every s_i is positive by construction. Needs matplotlib (``pip install matplotlib``).
"""

import argparse
import re
import sys

VALID = re.compile(r"valid on '([^']+)' subset \| (.*)$")
PROBE_SIZE = re.compile(r"dpt_probe_rank['\"]?\s*[=:]\s*(\d+)")


def read_log(text, subset="valid"):
    """(probe size r or None, [(num_updates, positive entries)]) from a fairseq-train log."""
    size = None
    points = []
    for line in text.splitlines():
        found = PROBE_SIZE.search(line)
        if found and size is None:
            size = int(found.group(1))
        m = VALID.search(line)
        if not m or m.group(1) != subset:
            continue
        fields = dict(f.strip().split(" ", 1) for f in m.group(2).split("|") if " " in f.strip())
        if "prompt_rank" in fields and "num_updates" in fields:
            points.append((int(fields["num_updates"]), int(round(float(fields["prompt_rank"])))))
    return size, points


def plot(size, points, out, title):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit(
            "plot_rank_probe.py: error: matplotlib is needed for the plot (pip install matplotlib)"
        ) from None
    if size is not None:
        points = [(0, size)] + [p for p in points if p[0] > 0]  # every s_i starts positive
    steps = [u for u, _ in points]
    positive = [n for _, n in points]
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=150)
    ax.plot(steps, positive, marker="o", ms=3, label="positive entries of s")
    if size is not None:
        ax.plot(steps, [size - n for n in positive], marker="s", ms=3, label="non-positive entries of s")
        ax.set_ylim(-0.04 * size, 1.06 * size)
    ax.set_xlabel("training updates")
    ax.set_ylabel("number of diagonal entries")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="fairseq-train log (scripts/run.sh writes train.log beside the checkpoints)")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--subset", default="valid", help="validation subset to read (default valid)")
    parser.add_argument("--rank", type=int, help="probe size r, if the log does not show dpt_probe_rank")
    parser.add_argument("--title", help="plot title (default: the log's path)")
    args = parser.parse_args(argv)
    with open(args.log) as f:
        size, points = read_log(f.read(), args.subset)
    if not points:
        print(
            f"plot_rank_probe.py: error: {args.log}: no '{args.subset}' line with prompt_rank "
            f"(train with --prompt-preset dpt-rank-probe and validate at least once)",
            file=sys.stderr,
        )
        return 2
    size = args.rank or size
    plot(size, points, args.out, args.title or f"rank probe: {args.log}")
    print(
        f"{len(points)} validations, positive entries {points[0][1]} -> {points[-1][1]}"
        + (f" of r = {size}" if size else "")
        + f"; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
