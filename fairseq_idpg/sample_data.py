"""Made-up data in a task's distributed format (its files, columns, header and labels), for the main job on a
machine that has no task data and cannot download it: the pipeline runs end to end offline, and its score says
nothing about the task. Deterministic, so that its prepared data (and the runs on it) are reused."""

import csv
import os
import random
import tempfile
from pathlib import Path

from fairseq_idpg.preprocessing.formats import LmbffCsv, get_task

SUBJECTS = ("the film", "this story", "the plot", "our meal", "the team", "that song", "the book", "a day out")
VERBS = ("was", "seemed", "felt", "looked", "sounded")
CUES = (  # one cue per label index (regression: by score), so that the sample is learnable
    ("good", "great", "lovely", "fine"),
    ("bad", "awful", "dull", "poor"),
    ("odd", "unclear", "mixed", "plain"),
)
TRAIN_ROWS, DEV_ROWS = 400, 100


def sentence(rng, label_index):
    cue = rng.choice(CUES[label_index % len(CUES)])
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {cue} ."


def examples(spec, rows, rng):
    """``rows`` (texts, label) of ``spec``: labels in turn, the last text carrying the label's cue."""
    for i in range(rows):
        if spec.regression:
            label, index = f"{i % 6:.1f}", int(i % 6 >= 3)
        else:
            index = i % len(spec.labels)
            label = spec.labels[index]
        texts = [sentence(rng, index) for _ in range(2 if spec.pair else 1)]
        yield texts, label


def write_file(spec, path, rows, rng):
    with open(path, "w", encoding="utf-8", newline="") as f:
        if isinstance(spec.reader, LmbffCsv):
            csv.writer(f).writerows([label, texts[0]] for texts, label in examples(spec, rows, rng))
            return
        reader, columns = spec.reader, spec.reader.columns[0]
        label_column = reader.label % columns
        if reader.header is not None:
            header = [f"column{c}" for c in range(columns)]
            header[label_column] = reader.header
            f.write("\t".join(header) + "\n")
        for n, (texts, label) in enumerate(examples(spec, rows, rng)):
            fields = [str(n)] * columns
            for column, text in zip(reader.text, texts, strict=True):
                fields[column] = text
            fields[label_column] = label
            f.write("\t".join(fields) + "\n")


def write_sample(task, folder):
    """Write made-up raw files of ``task`` into ``folder`` (made whole or not at all); returns ``folder``."""
    spec, folder = get_task(task), Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    rng = random.Random(0)
    for n, name in enumerate(spec.files):
        write_file(spec, stage / name, TRAIN_ROWS if n == 0 else DEV_ROWS, rng)
    os.replace(stage, folder)
    return folder
