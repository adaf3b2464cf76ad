"""The twelve tasks and one reader per raw file format, exactly as the files are distributed.

``TASKS`` maps each task to its reader, its fixed label order, its metric and the official
row counts. Readers parse and validate a whole file up front and raise ``PrepareError``
(one line: file, line number, what was expected, what was found) on anything malformed, so
that ``prepare`` can refuse bad input before it writes anything.
"""

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

from ..errors import ConfigError


class PrepareError(ConfigError):
    """Bad input to the data preparation; the CLI prints the message as one line and exits 2."""


class Example(NamedTuple):
    texts: Tuple[str, ...]  # one sentence, or the two of a pair
    label: str  # as written in the file (STS-B: the 0-5 score)


def _open(path: Path):
    if not path.is_file():
        raise PrepareError(f"{path}: file not found")
    # utf-8-sig drops MRPC's byte-order mark; newline="" lets csv see the raw line ends
    # (the LM-BFF train files end their lines with \r\n).
    return open(path, encoding="utf-8-sig", newline="")


def _rows(path: Path, reader) -> Iterator[Tuple[int, List[str]]]:
    """(line number, fields) for each row of an open csv reader, with a clear decoding error."""
    try:
        for row in reader:
            yield reader.line_num, row
    except UnicodeDecodeError as e:
        raise PrepareError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except csv.Error as e:
        raise PrepareError(f"{path}:{reader.line_num}: {e}") from None


def _check_columns(path: Path, line: int, row: List[str], expected: int) -> None:
    if len(row) != expected:
        raise PrepareError(f"{path}:{line}: expected {expected} columns, found {len(row)}")


@dataclass(frozen=True)
class GlueTsv:
    """A GLUE TSV file.

    Read with ``quoting=csv.QUOTE_NONE``, as GLUE's and fairseq's readers do: the sentences
    hold bare quote characters (MRPC: ``" the witness "``) that a quoting reader would take
    for field delimiters, silently merging rows.
    """

    columns: Tuple[int, ...]  # column counts allowed (MNLI: 12 in train, 16 in dev)
    text: Tuple[int, ...]  # 0-based columns of the sentence(s)
    label: int  # 0-based label column (-1: the last one)
    header: Optional[str] = None  # header name of the label column; None: no header (CoLA)

    def read(self, path: Path) -> List[Tuple[int, Example]]:
        with _open(path) as f:
            rows = _rows(path, csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
            expected = self.columns[0]
            if self.header is not None:
                line, head = next(rows, (1, []))
                if len(head) not in self.columns:
                    allowed = " or ".join(map(str, self.columns))
                    raise PrepareError(f"{path}:{line}: expected {allowed} columns, found {len(head)}")
                if head[self.label] != self.header:
                    raise PrepareError(
                        f"{path}:{line}: expected the header line (label column "
                        f"{self.header!r}), found {head[self.label]!r}"
                    )
                expected = len(head)
            examples = []
            for line, row in rows:
                _check_columns(path, line, row, expected)
                texts = tuple(row[i] for i in self.text)
                examples.append((line, Example(texts, row[self.label].strip())))
        return examples


@dataclass(frozen=True)
class LmbffCsv:
    """LM-BFF's ``label,sentence`` CSV: no header, real CSV quoting, empty sentences allowed."""

    def read(self, path: Path) -> List[Tuple[int, Example]]:
        with _open(path) as f:
            examples = []
            for line, row in _rows(path, csv.reader(f)):
                _check_columns(path, line, row, 2)
                examples.append((line, Example((row[1],), row[0].strip())))
        return examples


@dataclass(frozen=True)
class TaskSpec:
    name: str
    reader: object  # GlueTsv or LmbffCsv
    labels: Optional[Tuple[str, ...]]  # label-dictionary order; None: regression (STS-B)
    metric: str  # the paper's metric (task.json picks --best-checkpoint-metric from it)
    files: Tuple[str, ...]  # train file, then the labelled dev/test file(s)
    sizes: Tuple[int, ...]  # official row counts of ``files``
    pair: bool = False

    @property
    def regression(self) -> bool:
        return self.labels is None

    @property
    def num_classes(self) -> int:
        return 1 if self.regression else len(self.labels)

    def read(self, path: Path) -> List[Example]:
        """All examples of one raw file, labels checked against the task's label set."""
        examples = []
        for line, ex in self.reader.read(path):
            if self.regression:
                try:
                    score = float(ex.label)
                except ValueError:
                    score = math.nan
                if not 0.0 <= score <= 5.0:  # also catches nan
                    raise PrepareError(f"{path}:{line}: expected a score between 0 and 5, found {ex.label!r}")
            elif ex.label not in self.labels:
                raise PrepareError(
                    f"{path}:{line}: label {ex.label!r} is not one of the {self.name} labels {', '.join(self.labels)}"
                )
            examples.append(ex)
        return examples


BINARY = ("0", "1")  # index 1 is the positive class (F1 of MRPC and QQP)
ENTAILMENT = ("entailment", "not_entailment")
MNLI_LABELS = ("contradiction", "neutral", "entailment")  # the order of fairseq's roberta.large.mnli
GLUE = ("train.tsv", "dev.tsv")
LMBFF = ("train.csv", "test.csv")


def _task(name, reader, labels, metric, sizes, files=GLUE):
    pair = len(getattr(reader, "text", ())) == 2
    return TaskSpec(name, reader, labels, metric, files, sizes, pair)


TASKS: Dict[str, TaskSpec] = {
    t.name: t
    for t in [
        _task("SST-2", GlueTsv((2,), (0,), 1, "label"), BINARY, "accuracy", (67349, 872)),
        _task("QNLI", GlueTsv((4,), (1, 2), 3, "label"), ENTAILMENT, "accuracy", (104743, 5463)),
        _task("RTE", GlueTsv((4,), (1, 2), 3, "label"), ENTAILMENT, "accuracy", (2490, 277)),
        _task("MRPC", GlueTsv((5,), (3, 4), 0, "Quality"), BINARY, "acc_and_f1", (3668, 408)),
        _task("STS-B", GlueTsv((10,), (7, 8), 9, "score"), None, "pearson_and_spearman", (5749, 1500)),
        _task("QQP", GlueTsv((6,), (3, 4), 5, "is_duplicate"), BINARY, "acc_and_f1", (363846, 40430)),
        _task(
            "MNLI",
            GlueTsv((12, 16), (8, 9), -1, "gold_label"),
            MNLI_LABELS,
            "accuracy",
            (392702, 9815, 9832),
            ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv"),
        ),
        _task("CoLA", GlueTsv((4,), (3,), 1), BINARY, "mcc", (8551, 1043)),
        _task("MPQA", LmbffCsv(), BINARY, "accuracy", (8606, 2000), LMBFF),
        _task("SUBJ", LmbffCsv(), BINARY, "accuracy", (8000, 2000), LMBFF),
        _task("CR", LmbffCsv(), BINARY, "accuracy", (1775, 2000), LMBFF),
        _task("MR", LmbffCsv(), BINARY, "accuracy", (8662, 2000), LMBFF),
    ]
}


def get_task(name: str) -> TaskSpec:
    """The task called ``name``, case-insensitively."""
    for spec in TASKS.values():
        if spec.name.lower() == name.lower():
            return spec
    raise PrepareError(f"unknown task {name!r} (valid: {', '.join(TASKS)})")
