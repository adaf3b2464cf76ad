"""fairseq's logged statistics as numbers: the ``--log-format json`` lines the main job writes, and
the ``simple`` format of older logs.

    2026-11-23 05:38:14 | INFO | valid | {"epoch": 1, "valid_loss": "0.69", "valid_accuracy": "71.2",
                                         "valid_num_updates": "100", ...}
    2026-11-23 05:38:14 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 0.69 | accuracy 71.2 | ...

Both give ``Entry(tag="valid", stats={"loss": 0.69, "accuracy": 71.2, "num_updates": 100, ...})``:
the tag is the subset (or ``train_inner`` / ``train``), the keys lose their ``<tag>_`` prefix, and
fairseq's printed values (``"{:g}"`` strings) become ints or floats. fairseq-validate's json lines
carry no subset name (its progress bar prints without a tag); ``validate_scores`` pairs them with
the subsets in the order they were asked for.
"""

import contextlib
import json
import logging
import re
from dataclasses import dataclass
from typing import Dict, List

SIMPLE_VALID = re.compile(r"valid on '([^']+)' subset \| (.*)$")
JSON_LINE = re.compile(r"\| ([\w.]+) \| (\{.*\})\s*$")


@dataclass
class Entry:
    tag: str
    stats: Dict[str, object]


def number(text):
    """fairseq's printed value as a number (int when it has no fraction); other values unchanged."""
    if not isinstance(text, str):
        return text
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def read_log(text: str) -> List[Entry]:
    """Every statistics line of a fairseq log, in order (json and simple formats)."""
    entries = []
    for line in text.splitlines():
        simple = SIMPLE_VALID.search(line)
        if simple:
            fields = [f.strip().split(" ", 1) for f in simple.group(2).split("|")]
            entries.append(
                Entry(simple.group(1), {k: number(v.strip()) for k, v in (f for f in fields if len(f) == 2)})
            )
            continue
        found = JSON_LINE.search(line)
        if not found:
            continue
        try:
            stats = json.loads(found.group(2))
        except json.JSONDecodeError:
            continue
        tag = found.group(1)
        prefix = tag + "_"
        entries.append(
            Entry(tag, {k[len(prefix) :] if k.startswith(prefix) else k: number(v) for k, v in stats.items()})
        )
    return entries


def validations(text: str) -> List[Entry]:
    """The dev-set evaluations fairseq-train logged (subsets ``valid``, ``valid1``, ...), in order."""
    return [e for e in read_log(text) if re.fullmatch(r"valid\d*|test\d*", e.tag) and "num_updates" in e.stats]


def training_speed(text: str):
    """Seconds per update of a fairseq-train log: the median over its ``train_inner`` lines of 1 / ``ups`` (fairseq's
    updates per second over each log interval, 2 decimals): the intervals that hold a start, a resume or a
    validation are the slow few the median leaves out. None without a line of nonzero ``ups``."""
    import statistics

    rates = [e.stats["ups"] for e in read_log(text) if e.tag == "train_inner"
             and isinstance(e.stats.get("ups"), (int, float)) and e.stats["ups"] > 0]  # fmt: skip
    return 1 / statistics.median(rates) if rates else None


def least_free_gb(text: str):
    """The least ``gb_free`` of a fairseq-train log's updates (CUDA: the device's memory less the peak allocated
    in the update, 0.1 GB steps), or None where the log has none (CPU)."""
    free = [e.stats["gb_free"] for e in read_log(text) if isinstance(e.stats.get("gb_free"), (int, float))]
    return min(free) if free else None


def curve(text: str, metrics) -> List[dict]:
    """``[{"updates": 100, "split": "valid", "accuracy": 71.2, "loss": 0.69}, ...]`` from a fairseq-train
    log: each validation with the named metrics it has."""
    return [
        {"updates": e.stats["num_updates"], "split": e.tag, **{m: e.stats[m] for m in metrics if m in e.stats}}
        for e in validations(text)
    ]


def validate_scores(text: str, subsets) -> Dict[str, dict]:
    """``{subset: stats}`` from fairseq-validate's output (``--log-format json``, whose lines name no
    subset, so they are taken in the order of ``subsets``; or the simple format, which names them).
    Raises ValueError when the number of score lines is not the number of subsets."""
    entries = read_log(text)
    named = [e for e in entries if e.tag in subsets]
    if named:
        return {e.tag: e.stats for e in named}
    scored = [e for e in entries if e.tag.startswith("fairseq") and "loss" in e.stats]
    if len(scored) != len(subsets):
        raise ValueError(f"fairseq-validate printed {len(scored)} score line(s) for {len(subsets)} subset(s)")
    return {subset: e.stats for subset, e in zip(subsets, scored, strict=False)}


SETUP_LOGGERS = ("fairseq", "fairseq_idpg")


def quiet_setup_logs():
    """A launcher (run.sh, a sweep) builds models only to check and plan them: fairseq's INFO lines (the
    backbone loaded, the parameter counts) belong to the runs' own output, not before their headers."""
    for name in SETUP_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


@contextlib.contextmanager
def setup_logs_shown():
    """``quiet_setup_logs`` lifted meanwhile: for a fairseq command run in a launcher's process
    (``run.processes.tee_here``), whose log holds all that the command prints as a process of its own."""
    loggers = [logging.getLogger(name) for name in SETUP_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.NOTSET)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
