"""EFL's label descriptions: how each task is stated as entailment (Wang et al. 2021, "Entailment as
Few-Shot Learner", arXiv 2104.14690), as data, with where each wording comes from.

Three kinds of hypotheses, one per task (``Hypotheses``):

- ``description`` with one text (EFL's binary tasks): the pair ``(x, d)`` is entailed exactly when the
  label is ``entailed_label``. EFL section 3 states sentiment so: "I am in love with these actors
  [SEP] This is a great movie" -> entailment for a positive review, not entailment for a negative one.
  Prediction: the class whose side of the one pair wins, i.e. ``entailed_label`` iff P(entail) > 1/2.
- ``description`` with C texts, one per class in the label-dictionary order (EFL's C-class tasks): C
  pairs ``(x, d_c)``, the gold one entailed, the C - 1 others not; prediction: the class whose
  description is most entailed, ``argmax_c`` of the entailment log-odds of ``(x, d_c)``.
- ``pair`` (sentence-pair tasks: RTE, QNLI, MRPC, QQP): EFL needs no description there; the second
  sentence is the hypothesis, entailed exactly when the label is ``entailed_label`` (RTE, QNLI:
  "entailment"; MRPC: paraphrase "1"; QQP: duplicate "1").

Refused, with one line: STS-B (a 0-5 regression score, not a class with a description; EFL's
reformulation has no class to state) and MNLI (the entailment task the EFL model starts from: train it
with ``--method finetune``).

Wording sources. EFL's own worked example (section 3) is "This is a great movie"; its appendix table of
label descriptions gives one sentence per task. That table was not available to us in full text while
writing this; the wordings below ("It was great", "It is positive", "It is objective", "It is
correct") are those we recall from it, and each entry says so (``EFL_TABLE``). LM-BFF's manual
templates (Gao et al. 2021: "It was great/terrible" for SST-2, MR, CR, MPQA; "This is
subjective/objective" for SUBJ; "This is correct/incorrect" for CoLA) use the same words. IDPG
Table 1's EFL row was produced with EFL's own descriptions.
"""

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from fairseq_idpg.errors import ConfigError

KINDS = ("description", "pair")
EFL_TABLE = "EFL (Wang et al. 2021) appendix table of label descriptions, wording as recalled (not re-checked)"
EFL_PAIRS = "EFL: a sentence-pair task is already (premise, hypothesis); no description"


@dataclass(frozen=True)
class Hypotheses:
    """A task stated as entailment: ``kind``, the description ``texts``, and ``entailed_label`` (the label
    name whose pair is entailed; one-description and pair kinds). ``source``: where the wording comes from."""

    kind: str
    texts: Tuple[str, ...] = ()
    entailed_label: Optional[str] = None
    source: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "pair" and self.texts:
            raise ValueError("pair hypotheses take no description (the second sentence is the hypothesis)")
        if self.kind == "description" and not self.texts:
            raise ValueError("description hypotheses need at least one text")
        if self.kind == "pair" or len(self.texts) == 1:
            if self.entailed_label is None:
                raise ValueError("one description (or a pair task) needs entailed_label")

    @property
    def per_class(self) -> bool:
        """One description per class: C pairs per example, argmax over their entailment."""
        return self.kind == "description" and len(self.texts) > 1

    def entailed_index(self, labels: Sequence[str]) -> Optional[int]:
        """The class index whose pair is entailed (None for per-class descriptions)."""
        if self.per_class:
            return None
        if self.entailed_label not in labels:
            raise ConfigError(f"entailed label {self.entailed_label!r} is not one of the labels {', '.join(labels)}")
        return list(labels).index(self.entailed_label)

    def check(self, num_classes: int) -> None:
        if self.per_class and len(self.texts) != num_classes:
            raise ConfigError(f"{len(self.texts)} descriptions for {num_classes} classes (one per class, in order)")
        if not self.per_class and num_classes != 2:
            raise ConfigError(f"one description (or a pair) states a binary task, not {num_classes} classes")


def _one(text, label="1", source=EFL_TABLE):
    return Hypotheses("description", (text,), label, source)


# label "1": SST-2, MR, CR, MPQA positive; SUBJ objective (0 = subjective); CoLA acceptable
DESCRIPTIONS: Dict[str, Hypotheses] = {
    "SST-2": _one("It was great"),
    "MR": _one("It was great"),
    "CR": _one("It was great"),
    "MPQA": _one("It is positive"),
    "SUBJ": _one("It is objective"),
    "CoLA": _one("It is correct"),
    "RTE": Hypotheses("pair", entailed_label="entailment", source=EFL_PAIRS),
    "QNLI": Hypotheses("pair", entailed_label="entailment", source=EFL_PAIRS),
    "MRPC": Hypotheses("pair", entailed_label="1", source=EFL_PAIRS + " (paraphrase = entailed)"),
    "QQP": Hypotheses("pair", entailed_label="1", source=EFL_PAIRS + " (duplicate = entailed)"),
}
REFUSED = {
    "STS-B": "EFL states classes as entailment; STS-B is a 0-5 regression score with no class to describe",
    "MNLI": "MNLI is the entailment task the EFL model starts from; train it with --method finetune",
}


def hypotheses_for(task: str) -> Hypotheses:
    """The task's hypotheses; ``ValueError`` (one line) for a task EFL does not state."""
    if task in REFUSED:
        raise ConfigError(f"EFL does not apply to {task}: {REFUSED[task]}")
    if task not in DESCRIPTIONS:
        raise ConfigError(f"no EFL label description for task {task!r} (known: {', '.join(DESCRIPTIONS)})")
    return DESCRIPTIONS[task]
