"""Method records: every method of the three papers and their baselines, as data.

A method is a registered fairseq architecture, the model options that make it that method (a
preset, as attribute names), the paper's training recipe, and where it comes from. Everything
that runs or inspects a method reads these records: ``scripts/run.sh --method NAME`` derives the
fairseq-train command line from them (``Method.train_args``), ``fairseq_idpg.models.build``
builds the model of a record (counts, benchmarks, tests), and the test suite checks every
record (tests/test_every_method.py), so a new record is tested with no new test code.

    Method("m-idpg-phm", arch="roberta_idpg", options={"idpg_preset": "m-idpg-phm"},
           preset=dict(idpg_generator="phm", idpg_hidden=16, ...),
           recipe=IDPG_RECIPE, task="idpg_sentence_prediction", source="IDPG Table 1")

A method has one name: where its options name a preset of its own (``"idpg_preset": NAME``), the
record also carries what that preset sets (``preset``), and the architecture reads its presets
from the records (``presets_of``), so ``fairseq-train --idpg-preset NAME`` means what the record
says. A run folder's hash covers its options and the settings its model is resolved to (the preset
included; ``fairseq_idpg.run``).

What a method can do is data on its record too, and every list of methods elsewhere is derived from the
records (``methods_where``, ``representative``), so a new method touches its own record only:

- ``family``: one of ``FAMILIES``, what the method trains inside the frozen encoder (prompts, generated
  prompts, attention keys and values, adapters, a low-rank update, activations shifted or scaled, every
  weight); ``representative``: the record that stands for its family where one record per family runs
  (scripts/check_gpu.sh). The architecture that builds it is ``arch`` (three build the seven families).
- ``frozen_backbone``: the backbone stays frozen, so tasks can share one forward of it (full fine-tuning
  and EFL train it);
- ``exports_to``: the formats of scripts/export_peft.py that hold the trained method exactly
  (``EXPORT_FORMATS``: Hugging Face PEFT, AdapterHub ``adapters``); ``peft_counterpart``: PEFT's method of
  the same kind (its timing pair in check_gpu, whether or not the trained method exports to it);
- ``merges_into_backbone``: the trained tensors fold into the frozen weights (scripts/merge_lora.py), so
  inference is the plain model's; ``ablation_of``: the record this one ablates (inducer-tuning Table 3).

Frozen-backbone methods get the pretrained checkpoint as ``--backbone PATH`` (loaded frozen at
build time, ``models/frozen_roberta.py``); full fine-tuning gets it as ``--finetune-from-model`` (its
weights, without its optimizer state or update count). The encoder size flags are read from the
checkpoint, so one record runs on roberta.large, roberta.base or the offline stand-in.
"""

import math
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

SCHEDULERS = ("fixed", "polynomial_decay")
SELECTION_SPLITS = ("valid", "valid1")  # MNLI: valid = dev-matched, valid1 = dev-mismatched
# the four large GLUE tasks, which IDPG trains with batch 32 for 10 epochs
LARGE_TASKS = ("SST-2", "QNLI", "QQP", "MNLI")
# A method's family: what it trains inside the frozen encoder (the check of a new machine runs one record of
# each, scripts/check_gpu.sh). In this order the check runs them.
FAMILIES = {
    "prompts": "static soft prompts at the input or at every layer: prompt tuning, P-tuning v2, DPT",
    "idpg": "prompts generated from the input: S-/M-IDPG (IDPG section 3)",
    "inducer": "keys and values added inside attention: prefix tuning, inducer-tuning",
    "adapters": "bottleneck modules on the sublayers' outputs: Houlsby, Compacter, the MAM adapter",
    "lora": "a low-rank update of the attention projections: LoRA (Hu et al. 2021), DoRA, PiSSA, VeRA",
    "bitfit": "the encoder's activations shifted or scaled: BitFit's biases, (IA)^3's scales, LoReFT's edits",
    "finetune": "every weight trained: full fine-tuning, EFL",
}
EXPORT_FORMATS = ("peft", "adapters")  # scripts/export_peft.py --format: Hugging Face PEFT, AdapterHub adapters


@dataclass(frozen=True)
class Recipe:
    """The optimisation settings a paper trains a method with: what run.sh passes to fairseq-train.

    - ``lr`` (None: the task's row of fairseq's GLUE table, ``FINETUNE_TABLE``), ``lr_grid``: the
      paper's search grid; ``head_lr``: the classification head's own lr (None: ``lr`` trains it too;
      ``fairseq_idpg/optim.py`` says what the head is); ``scheduler``: "fixed" (constant lr) or
      "polynomial_decay" (linear decay to 0 after ``warmup``, a fraction of the updates).
    - The budget: ``batch`` (effective, per update) and ``epochs``, or ``updates`` given outright;
      ``per_task`` overrides any field for named tasks (IDPG: batch 32, 10 epochs on the large tasks).
    - ``clip_norm`` (0: none), ``weight_decay`` (fairseq's Adam decouples it, as AdamW does),
      ``dropout``: the encoder's dropout and attention dropout (frozen or not; the head's is
      ``--pooler-dropout``),
      ``select_on``: the dev split whose metric picks checkpoint_best (MNLI: valid = matched,
      valid1 = mismatched; single-dev tasks have only valid).
    - ``sources``: where each value comes from (field -> citation), for the recipe table in docs.
    """

    lr: Optional[float] = None
    lr_grid: Tuple[float, ...] = ()
    head_lr: Optional[float] = None
    scheduler: str = "polynomial_decay"
    warmup: float = 0.06
    batch: Optional[int] = None
    epochs: Optional[float] = None
    updates: Optional[int] = None
    clip_norm: float = 0.0
    weight_decay: float = 0.1
    dropout: float = 0.1
    select_on: str = "valid"
    per_task: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}")
        if self.select_on not in SELECTION_SPLITS:
            raise ValueError(f"select_on must be one of {', '.join(SELECTION_SPLITS)}, got {self.select_on!r}")

    def for_task(self, task: str) -> "Recipe":
        """This recipe with the task's overrides applied (and no ``per_task`` left)."""
        return replace(self, **{**self.per_task.get(task, {}), "per_task": {}})

    def num_updates(self, train_examples: int) -> int:
        """Updates of the whole budget: ``updates``, else ``epochs`` x ceil(train examples / batch)."""
        if self.updates is not None:
            return int(self.updates)
        if self.batch is None or self.epochs is None:
            raise ValueError("a recipe needs updates, or batch and epochs")
        return int(self.epochs * math.ceil(train_examples / self.batch))


@dataclass(frozen=True)
class Method:
    """One method: ``arch`` + ``options`` (model attributes, e.g. ``{"idpg_preset": ...}``) +
    the ``recipe``; ``task``: the fairseq task it trains with. ``preset``: the model attributes
    that the preset of this method's name sets (``--idpg-preset NAME``), for a record whose
    options name itself as the preset; empty for the others. The fields after ``source`` say what
    the method can do (the module docstring); ``register`` checks them."""

    name: str
    arch: str
    options: Mapping[str, Any] = field(default_factory=dict)
    preset: Mapping[str, Any] = field(default_factory=dict)
    recipe: Recipe = Recipe()
    task: str = "peft_sentence_prediction"
    frozen_backbone: bool = True
    description: str = ""
    source: str = ""
    family: str = ""
    representative: bool = False
    exports_to: Tuple[str, ...] = ()
    peft_counterpart: str = ""
    merges_into_backbone: bool = False
    ablation_of: str = ""

    def model_args(self) -> List[str]:
        """``--arch`` and the model options as fairseq-train flags."""
        return ["--arch", self.arch, *option_args(self.options)]

    def train_args(self) -> List[str]:
        """The method's part of a fairseq-train command line: task, architecture, options."""
        return ["--task", self.task, *self.model_args()]

    @property
    def model_class(self):
        from fairseq.models import ARCH_MODEL_REGISTRY

        import fairseq_idpg  # noqa: F401  (registers the architectures)

        return ARCH_MODEL_REGISTRY[self.arch]

    @property
    def blocks(self) -> Tuple[str, ...]:
        """The blocks (fairseq_idpg/blocks/) this record's settings turn on; () for another architecture."""
        if self.arch != "roberta_blocks":
            return ()
        from fairseq_idpg.blocks import blocks_turned_on

        return tuple(blocks_turned_on({**self._preset_settings(), **self.options}))

    @property
    def parts(self) -> Tuple[str, ...]:
        """What this record builds on the frozen backbone, by the names its architecture's registries give them:
        its blocks (``roberta_blocks``), its ``--prompt-matrix`` and depth (``roberta_prompt``), its generator
        kind and input (``roberta_idpg``). A test that runs one record of each part covers a new block as soon as
        a record uses it."""
        if self.arch == "roberta_blocks":
            return self.blocks
        settings = {**self._preset_settings(), **self.options}
        keys = {"roberta_prompt": ("prompt_matrix", "prompt_deep"), "roberta_idpg": ("idpg_generator", "idpg_input")}
        return tuple(f"{key}={settings[key]}" for key in keys.get(self.arch, ()) if key in settings)

    def _preset_settings(self) -> Mapping[str, Any]:
        """The settings of the preset the record's options name (its own, or another record's); {} for none."""
        preset = next((v for k, v in self.options.items() if k.endswith("_preset")), None)
        if preset is None:
            return {}
        return self.preset if preset == self.name else METHODS[preset].preset


def option_args(options: Mapping[str, Any]) -> List[str]:
    """``{"idpg_preset": "m-idpg-phm", "save_trainable_only": True}`` ->
    ``["--idpg-preset", "m-idpg-phm", "--save-trainable-only"]`` (False / None: left out)."""
    args = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not None and value is not False:
            args += [flag, str(value)]
    return args


METHODS: Dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` to ``METHODS``, after checking what it says it can do against the other records."""
    problems = {
        "registered twice": method.name in METHODS,
        f"family {method.family!r}: valid are {', '.join(FAMILIES)}": method.family not in FAMILIES,
        f"exports_to {method.exports_to}: valid are {', '.join(EXPORT_FORMATS)}": not set(method.exports_to)
        <= set(EXPORT_FORMATS),
        f"a second representative of {method.family!r}": method.representative
        and bool(methods_where(family=method.family, representative=True)),
        f"ablation_of {method.ablation_of!r}: no such record": method.ablation_of and method.ablation_of not in METHODS,
    }
    if any(problems.values()):
        raise ValueError(f"method {method.name!r}: {'; '.join(p for p, bad in problems.items() if bad)}")
    METHODS[method.name] = method
    return method


def methods_where(**fields) -> List[str]:
    """Names of the records, in registration order, whose fields match: a value must be equal, a callable
    must hold of the field (``methods_where(family="adapters")``, ``methods_where(exports_to=bool)``)."""

    def matches(method):
        values = {key: getattr(method, key) for key in fields}
        return all(want(values[key]) if callable(want) else values[key] == want for key, want in fields.items())

    return [name for name, method in METHODS.items() if matches(method)]


def representative(family: str) -> str:
    """The record that stands for ``family`` where one record per family runs (scripts/check_gpu.sh)."""
    (name,) = methods_where(family=family, representative=True)
    return name


def representatives() -> Dict[str, str]:
    """``{family: its representative}``, in ``FAMILIES``' order."""
    return {family: representative(family) for family in FAMILIES}


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise KeyError(f"unknown method {name!r}; valid: {', '.join(sorted(METHODS))}")
    return METHODS[name]


def presets_of(option: str) -> Dict[str, Mapping[str, Any]]:
    """``{name: settings}`` of the records that carry a preset and name it under ``option``
    (``"prompt_preset"``): the presets ``--prompt-preset`` accepts, read from ``METHODS`` now."""
    return {m.name: m.preset for m in METHODS.values() if m.preset and m.options.get(option) == m.name}


# ---------------------------------------------------------------------------------------- recipes
# fairseq's RoBERTa GLUE fine-tuning table (examples/roberta/README.glue.md, roberta.large): lr, batch, updates
FINETUNE_TABLE = {
    "MNLI": (1e-5, 32, 123873), "QNLI": (1e-5, 32, 33112), "QQP": (1e-5, 32, 113272),
    "RTE": (2e-5, 16, 2036), "SST-2": (1e-5, 32, 20935), "MRPC": (1e-5, 16, 2296),
    "CoLA": (1e-5, 16, 5336), "STS-B": (2e-5, 16, 3598),
}  # fmt: skip
FINETUNE_SOURCE = "fairseq examples/roberta/README.glue.md (roberta.large table)"
FINETUNE_RECIPE = Recipe(
    warmup=0.06, epochs=10, clip_norm=0.0, weight_decay=0.1, select_on="valid",
    per_task={t: {"lr": lr, "batch": batch, "updates": updates} for t, (lr, batch, updates) in FINETUNE_TABLE.items()},
    # tasks outside the table (LM-BFF's MR, CR, MPQA, SUBJ): the SST-2 setting for 10 epochs
    lr=1e-5, batch=32,
    sources={"lr": FINETUNE_SOURCE, "batch": FINETUNE_SOURCE, "updates": FINETUNE_SOURCE + ": 10 epochs",
             "warmup": FINETUNE_SOURCE + " (6% of the updates)", "clip_norm": FINETUNE_SOURCE,
             "weight_decay": FINETUNE_SOURCE, "select_on": "fairseq's GLUE recipe (MNLI-matched)"},
)  # fmt: skip
# IDPG (paper 001, Table 4 and the released fairseq scripts): Adam (0.9, 0.98), eps 1e-6, weight
# decay 0.1, constant lr from {5e-3, 1e-3, 5e-4, 1e-4}, batch 16 for 50 epochs (32 for 10 epochs on
# the large tasks), no clipping (fairseq's GLUE script), best checkpoint by the dev metric.
IDPG_GRID = (5e-3, 1e-3, 5e-4, 1e-4)
IDPG_SOURCE = "IDPG Table 4 and the released scripts"
IDPG_RECIPE = Recipe(
    lr=5e-3, lr_grid=IDPG_GRID, scheduler="fixed", warmup=0.0, batch=16, epochs=50, clip_norm=0.0,
    weight_decay=0.1, select_on="valid", per_task={t: {"batch": 32, "epochs": 10} for t in LARGE_TASKS},
    sources={"lr": IDPG_SOURCE + ": grid {5e-3, 1e-3, 5e-4, 1e-4}, top", "scheduler": IDPG_SOURCE + " (fixed)",
             "batch": IDPG_SOURCE + " (32 on SST-2, QNLI, QQP, MNLI)",
             "epochs": IDPG_SOURCE + " (10 on SST-2, QNLI, QQP, MNLI)", "clip_norm": "released scripts (none)",
             "weight_decay": IDPG_SOURCE, "select_on": "IDPG Table 1 (dev metric; MNLI-matched)"},
)  # fmt: skip
# DPT (paper 002, section 4.2 "Settings", on T5: AdamW, lr 0.3, 100 epochs; the authors' code: wd 1e-5,
# max grad norm 1.0, linear decay with 10% warmup; README: batch 16). Adapted to RoBERTa: lr 0.3 was tuned
# for T5 prompts alone; here the classification head trains with the same lr, so the lr is the top of IDPG's
# grid (dpt-paper-lr, below, trains the prompt at 0.3 beside a head at its own lr).
DPT_SOURCE = "DPT section 4.2 and the authors' code (T5)"
DPT_RECIPE = Recipe(
    lr=5e-3, lr_grid=IDPG_GRID, scheduler="polynomial_decay", warmup=0.1, batch=16, epochs=100, clip_norm=1.0,
    weight_decay=1e-5, select_on="valid",
    sources={"lr": "adapted: DPT's 0.3 is for T5 prompts alone; the head trains too, so IDPG's top lr",
             "scheduler": DPT_SOURCE + " (linear)", "warmup": DPT_SOURCE, "batch": DPT_SOURCE + " (README, RTE)",
             "epochs": DPT_SOURCE, "clip_norm": DPT_SOURCE, "weight_decay": DPT_SOURCE + " (AdamW 1e-5)",
             "select_on": "dev metric (MNLI-matched)"},
)  # fmt: skip
# Long prompts (l = 100) on a frozen encoder: measured on the stand-in (docs/long-prompts.md), dropout
# inside the frozen encoder is ~3x the input-dependent part of the head's input once 100 prompt
# vectors dilute it, and nothing left the majority class with it on; without it DPT learns. So the
# long-prompt records train with the encoder's dropout off (fairseq PR 1710, SuperPos-Prompt).
LONG_PROMPT_RECIPE = replace(
    DPT_RECIPE, dropout=0.0,
    sources={**DPT_RECIPE.sources,
             "dropout": "adapted: 0 in the frozen encoder for l = 100 (docs/long-prompts.md, stand-in runs)"},
)  # fmt: skip
# Inducer-tuning (paper 003, appendix B.2 and the authors' NLU script, roberta-base): Adam (0.9, 0.98),
# eps 1e-6, wd 0.1, lr 2e-4, batch 16, 10 epochs, linear decay with 6% warmup, clip 1.0; MNLI is
# reported on dev-mismatched (following Hu et al. 2021). Every method of its NLU table trains so.
INDUCER_SOURCE = "inducer-tuning appendix B.2 and the authors' NLU script"
INDUCER_RECIPE = Recipe(
    lr=2e-4, scheduler="polynomial_decay", warmup=0.06, batch=16, epochs=10, clip_norm=1.0, weight_decay=0.1,
    select_on="valid1",
    sources={"lr": INDUCER_SOURCE, "scheduler": INDUCER_SOURCE + " (linear)", "warmup": INDUCER_SOURCE,
             "batch": INDUCER_SOURCE, "epochs": INDUCER_SOURCE, "clip_norm": INDUCER_SOURCE,
             "weight_decay": INDUCER_SOURCE,
             "select_on": "inducer-tuning appendix A (MNLI): mismatched accuracy, following Hu et al. 2021"},
)  # fmt: skip
# DoRA and PiSSA-initialised LoRA: the lora record's recipe (inducer-tuning's NLU recipe), each source saying so
LORA_VARIANT_SOURCE = "adapted: the lora record's (inducer-tuning's NLU recipe), so only the update differs"
LORA_VARIANT_RECIPE = replace(
    INDUCER_RECIPE, sources={k: f"{LORA_VARIANT_SOURCE}; {v}" for k, v in INDUCER_RECIPE.sources.items()}
)

# VeRA (Kopiczko et al. 2024), its appendix Table 8 for RoBERTa-large on GLUE: the VeRA vectors and the head at
# their own learning rates per task, linear decay after 6% warmup (AdamW; Hu et al. 2022's setup, whose NLU scripts
# also give the weight decay 0.1 and HF Trainer's clipping at 1.0), batch 32, max length 128; MNLI and QQP are not in
# its table (they take the SST-2 column here, as do tasks outside GLUE). These values were written down from the
# published Table 8 without the PDF at hand (its base column's MRPC, 30 epochs / 4e-3 / 1e-2 at batch 64, agrees with
# a public reproduction's script): check them against the paper before a table is reported.
VERA_SOURCE = "VeRA appendix Table 8 (RoBERTa-large)"
_VERA_TABLE = {  # task: (lr of d and b, lr of the head, epochs)
    "SST-2": (1e-2, 6e-3, 10), "MRPC": (3e-2, 3e-3, 40), "CoLA": (1e-2, 6e-3, 40),
    "QNLI": (1e-2, 2e-4, 20), "RTE": (2e-2, 2e-3, 40), "STS-B": (2e-2, 2e-3, 20),
}  # fmt: skip
VERA_RECIPE = Recipe(
    lr=1e-2, head_lr=6e-3, scheduler="polynomial_decay", warmup=0.06, batch=32, epochs=10, clip_norm=1.0,
    weight_decay=0.1, select_on="valid",
    per_task={t: {"lr": lr, "head_lr": head, "epochs": epochs} for t, (lr, head, epochs) in _VERA_TABLE.items()},
    sources={"lr": VERA_SOURCE + ": learning rate (VeRA), per task; SST-2's elsewhere",
             "head_lr": VERA_SOURCE + ": learning rate (head), per task; SST-2's elsewhere",
             "scheduler": VERA_SOURCE + " (linear)", "warmup": VERA_SOURCE + " (ratio 0.06)",
             "batch": VERA_SOURCE + " (batch size per GPU)", "epochs": VERA_SOURCE + ", per task; SST-2's elsewhere",
             "clip_norm": "Hu et al. 2022's NLU scripts (HF Trainer's 1.0), whose setup VeRA follows",
             "weight_decay": "Hu et al. 2022's NLU scripts, whose setup VeRA follows",
             "select_on": "VeRA section 4.1 (best epoch on dev; MNLI not in its table: matched)"},
)  # fmt: skip

# LoReFT on GLUE (pyreft's examples/loreft README, its RoBERTa GLUE command): AdamW, lr 6e-4, linear decay after
# 9% warmup, batch 32, weight decay 0, clipping at 1 (HF's default), max length 256, the head trained with the
# intervention (--allow_cls_grad); the epochs are per task in the paper's appendix table (3 in that command).
LOREFT_SOURCE = "pyreft examples/loreft README (the GLUE command, roberta-base; ReFT appendix for per-task values)"
LOREFT_RECIPE = Recipe(
    lr=6e-4, scheduler="polynomial_decay", warmup=0.09, batch=32, epochs=3, clip_norm=1.0, weight_decay=0.0,
    sources={"lr": LOREFT_SOURCE, "scheduler": LOREFT_SOURCE + " (linear)", "warmup": LOREFT_SOURCE,
             "batch": LOREFT_SOURCE, "epochs": LOREFT_SOURCE + "; not the paper's per-task epochs",
             "clip_norm": "HF TrainingArguments' default max_grad_norm, which pyreft's train.py leaves",
             "weight_decay": LOREFT_SOURCE},
)  # fmt: skip

# ---------------------------------------------------------------------------------------- records
register(
    Method(
        "finetune",
        arch="roberta",
        frozen_backbone=False,
        recipe=FINETUNE_RECIPE,
        family="finetune",
        representative=True,
        description="full fine-tuning (fairseq's RoBERTa GLUE recipe)",
        source="fairseq examples/roberta/README.glue.md",
    )
)


# Static soft prompts (--arch roberta_prompt): one implementation of prompt tuning, P-tuning v2,
# DPT and its baselines; each preset is --prompt-matrix, --prompt-length l (its name says l) and
# --prompt-deep (a prompt per layer, IDPG's P-tuning v2 scheme).
def _prompt(matrix, length, deep=False, **start):
    return {"prompt_matrix": matrix, "prompt_length": length, "prompt_deep": deep, **start}


# IDPG Table 1's prompts start where the IDPG authors' model starts them: their prompt tables are nn.Embedding,
# redrawn N(0, 0.02^2) by their RobertaModel's init_bert_params (docs/idpg.md, "Where training starts")
IDPG_START = dict(prompt_init="normal", prompt_init_scale=0.02)
_PROMPT_METHODS = (  # name, preset, recipe, description, source[, capabilities]
    ("prompt-tuning-5", _prompt("full", 5, **IDPG_START), IDPG_RECIPE, "prompt tuning, t = 5 (5,120 at roberta-large)",
     "IDPG Table 1", dict(representative=True, peft_counterpart="prompt-tuning")),
    ("prompt-tuning-134", _prompt("full", 134, **IDPG_START), IDPG_RECIPE, "prompt tuning, t = 134 (137,216)",
     "IDPG Table 1"),
    ("p-tuning-v2-5", _prompt("full", 5, deep=True, **IDPG_START), IDPG_RECIPE,
     "P-tuning v2: per-layer additive prompts, t = 5 (122,880)", "IDPG Table 1"),
    ("prompt-tuning-100", _prompt("full", 100), LONG_PROMPT_RECIPE, "vanilla prompt tuning, l = 100 (DPT's baseline)",
     "DPT Table 1"),
    ("dpt", _prompt("low-rank", 100), LONG_PROMPT_RECIPE, "DPT: P = A B, l = 100, b = 10 (Eq. 5)", "DPT section 3"),
    ("dpt-rank-probe", _prompt("rank-probe", 100), LONG_PROMPT_RECIPE,
     "rank probe: P = U ReLU(diag(s)) V, logs prompt_rank", "DPT section 2.2"),
    ("residual-prompt", _prompt("residual", 100), LONG_PROMPT_RECIPE,
     "residual prompt tuning, l = 100, bottleneck 400", "DPT Table 1"),
    ("deep-dpt", _prompt("low-rank", 100, deep=True), LONG_PROMPT_RECIPE,
     "deep DPT: a low-rank prompt A_k B_k at every layer (beyond the paper)", "DPT section 3"),
)  # fmt: skip
# l = 100 prompts start from vocabulary rows (Lester et al.; for DPT their best rank-b approximation):
# with the encoder's dropout off, the largest effect measured on the stand-in (docs/long-prompts.md)
VOCAB_START = ("prompt-tuning-100", "dpt", "deep-dpt")


def prompt_method(name, preset, recipe, description, source, **capabilities):
    """Register the roberta_prompt method ``name`` of the prompts family: ``--prompt-preset name`` sets
    ``preset`` (``_prompt(...)``), checkpoints are compact; ``capabilities``: more ``Method`` fields."""
    return register(
        Method(
            name,
            arch="roberta_prompt",
            options={
                "prompt_preset": name,
                **({"prompt_init": "vocab"} if name in VOCAB_START else {}),
                "save_trainable_only": True,
            },  # fmt: skip
            preset=preset,
            recipe=recipe,
            description=description,
            source=source,
            family="prompts",
            **capabilities,
        )
    )


for _name, _preset, _recipe, _description, _source, *_capabilities in _PROMPT_METHODS:
    prompt_method(_name, _preset, _recipe, _description, _source, **dict(*_capabilities))
# DPT's own lr (section 4.2: 0.3, for T5's prompt alone: no head trains there) for the prompt, beside a
# classification head at its own lr, the 5e-3 the long-prompt records train everything with: a 0.3 head
# is unstable (docs/long-prompts.md, section 4). The dpt model; the lr alone differs.
register(
    replace(
        METHODS["dpt"], name="dpt-paper-lr",
        recipe=replace(
            LONG_PROMPT_RECIPE, lr=0.3, lr_grid=(), head_lr=5e-3,
            sources={**LONG_PROMPT_RECIPE.sources, "lr": "DPT section 4.2: 0.3 (the prompt's)",
                     "head_lr": "adapted: DPT trains no head (T5); the long-prompt records' lr, IDPG's top"},
        ),
        preset={}, description="DPT at the paper's lr: the prompt at 0.3, the head at 5e-3 (--head-lr)",
        source="DPT section 4.2",
    )
)  # fmt: skip

# IDPG (--arch roberta_idpg): instance-dependent prompts; M(x) cached by its task. The presets are the
# IDPG rows of IDPG Table 1 / Table 2 and the released scripts; what they leave open is roberta_idpg's
# DEFAULTS (t = 5, RoBERTa's <s> as M(x), the previous layer's <s> as the multi-layer input).
_M = dict(idpg_depth="multi", idpg_sharing="M")  # M-IDPG: shared W, per-layer c_l (IDPG Table 1)
_IDPG_METHODS = (  # name, preset, description[, capabilities]
    ("s-idpg-phm", dict(idpg_generator="phm", idpg_hidden=256, idpg_phm_n=16, idpg_phm_a_sets=1, idpg_depth="single"),
     "S-IDPG-PHM, m = 256, n = 16, one A set (107,776)"),
    # c is an nn.Linear's bias in the authors' S-IDPG-DNN: zero once their model applies init_bert_params
    ("s-idpg-dnn", dict(idpg_generator="dnn", idpg_hidden=256, idpg_depth="single", idpg_bias_init="zero"),
     "S-IDPG-DNN, m = 256 (1,578,240)"),
    ("m-idpg-phm", dict(idpg_generator="phm", idpg_hidden=16, idpg_phm_n=16, idpg_phm_a_sets=2, **_M),
     "M-IDPG-PHM, m = 16, n = 16, previous-layer input, M version (137,232)", dict(representative=True)),
    ("m-idpg-dnn", dict(idpg_generator="dnn", idpg_hidden=16, **_M),
     "M-IDPG-DNN, m = 16, previous-layer input, M version (221,200)"),
    ("m-idpg-phm-glove", dict(idpg_generator="phm", idpg_hidden=16, idpg_phm_n=4, idpg_phm_a_sets=2,
                              idpg_input="glove", idpg_layer_input="first", **_M),
     "M-IDPG-PHM-GloVe, GloVe M(x), n = 4 (144,704); give --idpg-glove-vectors"),
)  # fmt: skip
for _name, _preset, _description, *_capabilities in _IDPG_METHODS:
    register(
        Method(
            _name,
            arch="roberta_idpg",
            options={"idpg_preset": _name, "save_trainable_only": True},
            preset=_preset,
            recipe=IDPG_RECIPE,
            task="idpg_sentence_prediction",
            description=_description,
            source="IDPG Table 1",
            family="idpg",
            **dict(*_capabilities),
        )
    )
register(
    Method(
        "m-idpg-phm-lowrank",
        arch="roberta_idpg",
        options={"idpg_preset": "m-idpg-phm", "idpg_layer_bias_rank": 2, "save_trainable_only": True},
        recipe=IDPG_RECIPE,
        task="idpg_sentence_prediction",
        description="M-IDPG-PHM with rank-2 layer biases c_l = (U V)_l (29,758 at roberta-large)",
        source="beyond the paper: IDPG section 3.2.2's per-layer biases, low-rank",
        family="idpg",
    )
)

# Blocks in the frozen layers (--arch roberta_blocks): inducer-tuning and the adapter family. Each record's
# ``preset`` is its block settings (fairseq_idpg/blocks/: one file per block, its options and their
# defaults); ``--blocks-preset NAME`` is the record's name.
# inducer-tuning's records put a LoRA given on top of them on W_q only (section 4.5)
_INDUCER = {"lora_targets": "q", "inducer_value": "extended", "inducer_output": "residual"}
# what each record can do (the module docstring): PEFT holds LoRA exactly, adapters the bottleneck adapters and
# prefixes (fairseq_idpg/interop/); LoRA's update and BitFit's biases fold into the frozen weights (interop/merge.py)
_INDUCER_FAMILY, _ABLATION = dict(family="inducer"), dict(family="inducer", ablation_of="inducer")
_ADAPTERS = dict(family="adapters", exports_to=("adapters",))
_BLOCK_METHODS = (  # name, preset, recipe, description, source, capabilities
    # inducer-tuning, Table 5 (NLU rows: r_k / r_v / LoRA rank / FFN-adapter bottleneck)
    ("inducer", dict(_INDUCER, inducer_key_rank=6, inducer_value_rank=4), INDUCER_RECIPE,
     "inducer-tuning 6/4", "Inducer-tuning Table 5 (NLU)", dict(_INDUCER_FAMILY, representative=True)),
    ("inducer-lora", dict(_INDUCER, inducer_key_rank=2, inducer_value_rank=4, lora_rank=4), INDUCER_RECIPE,
     "inducer-tuning + LoRA on W_q, 2/4/4", "Inducer-tuning Table 5 (NLU)", _INDUCER_FAMILY),
    ("mam-inducer",
     dict(_INDUCER, inducer_key_rank=2, inducer_value_rank=2, lora_rank=4, ffn_adapter_dim=12, ffn_adapter_scale=2.0),
     INDUCER_RECIPE, "MAM inducer-tuning 2/2/4/12", "Inducer-tuning Table 5 (NLU)", _INDUCER_FAMILY),
    # Table 3 ablations, at the NLU budget of "inducer"
    ("inducer-adaptive", dict(_INDUCER, inducer_key_rank=0, inducer_value_rank=32, inducer_value="per-head"),
     INDUCER_RECIPE, "ablation Adaptive (k~ = q, per-head value), NLU budget", "Inducer-tuning Table 3", _ABLATION),
    ("inducer-extension", dict(_INDUCER, inducer_key_rank=0, inducer_value_rank=5), INDUCER_RECIPE,
     "ablation Extension (k~ = q, extended value), NLU budget", "Inducer-tuning Table 3", _ABLATION),
    ("inducer-gating", dict(_INDUCER, inducer_key_rank=6, inducer_value_rank=4, inducer_output="gated"),
     INDUCER_RECIPE, "ablation Gating ((1 - lambda) Attn + lambda v~), 6/4", "Inducer-tuning Table 3", _ABLATION),
    # the adapter family
    ("prefix-tuning", {"prefix_length": 32}, INDUCER_RECIPE,
     "prefix tuning, l = 32, MLP-reparameterised (export stores the prefixes)",
     "Li & Liang 2021; inducer-tuning baseline",
     dict(_INDUCER_FAMILY, exports_to=("adapters",), peft_counterpart="prefix-tuning")),
    ("lora", {"lora_rank": 16, "lora_targets": "q,v"}, INDUCER_RECIPE, "LoRA on W_q and W_v, r = 16, alpha = 32",
     "Hu et al. 2021; inducer-tuning baseline",
     dict(family="lora", representative=True, exports_to=("peft",), peft_counterpart="lora",
          merges_into_backbone=True)),
    # LoRA's variants in PEFT's LoraConfig: each is the lora record with one option, at the lora record's recipe,
    # so a table compares the update alone (our choice, said in the recipe's sources: DoRA's experiments are
    # LLaMA, VL-BART and LLaVA; PiSSA's own NLU settings were not checked against its paper here)
    ("dora", {"lora_rank": 16, "lora_targets": "q,v", "lora_dora": True}, LORA_VARIANT_RECIPE,
     "DoRA on W_q and W_v, r = 16, alpha = 32: LoRA and a trained magnitude per output feature (Eq. 5)",
     "Liu et al. 2024 (DoRA), PEFT's use_dora",
     dict(family="lora", exports_to=("peft",), peft_counterpart="dora", merges_into_backbone=True)),
    ("pissa", {"lora_rank": 16, "lora_targets": "q,v", "lora_init": "pissa"}, LORA_VARIANT_RECIPE,
     "PiSSA: LoRA (r = 16, alpha = 32) started from W's top-16 singular factors, the residual frozen",
     "Meng et al. 2024 (PiSSA), PEFT's init_lora_weights='pissa'",
     dict(family="lora", exports_to=("peft",), peft_counterpart="pissa", merges_into_backbone=True)),
    # VeRA on W_q and W_v at its paper's RoBERTa-large rank (Table 1: 0.061M = 61,440 trained at r = 256)
    ("vera", {"vera_rank": 256, "vera_targets": "q,v"}, VERA_RECIPE,
     "VeRA on W_q and W_v: shared frozen random A, B (r = 256, from --vera-seed); trained d, b per projection",
     "Kopiczko et al. 2024 (VeRA) Table 1 and appendix Table 8, PEFT's VeraConfig",
     dict(family="lora", exports_to=("peft",), peft_counterpart="vera", merges_into_backbone=True)),
    ("houlsby-adapter", {"adapter": "houlsby", "adapter_dim": 16}, INDUCER_RECIPE,
     "Houlsby adapter, r = 16, 2 per layer", "Houlsby et al. 2019; IDPG and inducer-tuning baseline",
     dict(_ADAPTERS, representative=True)),
    # Compacter's own configuration trains with 3e-3
    ("compacter", {"adapter": "compacter", "adapter_dim": 16, "compacter_n": 4, "compacter_rank": 1},
     replace(INDUCER_RECIPE, lr=3e-3, sources={**INDUCER_RECIPE.sources, "lr": "Compacter's config"}),
     "Compacter, n = 4, r = 16, PHM rank 1, 2 per layer", "IDPG appendix A.1.2", _ADAPTERS),
    ("mam-adapter", {"prefix_length": 16, "ffn_adapter_dim": 16, "ffn_adapter_scale": 2.0}, INDUCER_RECIPE,
     "MAM adapter: prefix 16 + parallel FFN adapter 16, s = 2", "He et al. 2021; inducer-tuning baseline", _ADAPTERS),
    # biases alone need a larger step: the top of the BitFit paper's range
    ("bitfit", {"bitfit": True},
     replace(INDUCER_RECIPE, lr=1e-3, sources={**INDUCER_RECIPE.sources, "lr": "BitFit paper's range, top"}),
     "BitFit: every bias of the encoder", "Ben Zaken et al. 2021; inducer-tuning baseline",
     dict(family="bitfit", representative=True, merges_into_backbone=True)),
    # inducer-tuning's recipe with the lr of the (IA)^3 paper's T-Few recipe (3e-3; Adafactor there, Adam here)
    ("ia3", {"ia3": True},
     replace(INDUCER_RECIPE, lr=3e-3,
             sources={**INDUCER_RECIPE.sources, "lr": "(IA)^3 paper's T-Few recipe (Liu et al. 2022)"}),
     "(IA)^3: l_k, l_v, l_ff scale keys, values, FFN inner activations (55,296 at roberta-base)",
     "Liu et al. 2022 (T-Few)", dict(family="bitfit")),
    # ReFT's GLUE setting (pyreft examples/loreft, its RoBERTa GLUE command): rank 1 on every layer, the first token
    ("loreft", {"loreft_rank": 1, "loreft_positions": "f1", "loreft_layers": "all", "loreft_dropout": 0.05},
     LOREFT_RECIPE,
     "LoReFT: h + R^T (W h + b - R h) on every layer's <s>, r = 1 (49,176 at roberta.large, 0.014%)",
     "Wu et al. 2024 (ReFT) Eq. 2; pyreft's LoreftIntervention", dict(family="bitfit")),
)  # fmt: skip
for _name, _preset, _recipe, _description, _source, _capabilities in _BLOCK_METHODS:
    register(
        Method(
            _name,
            arch="roberta_blocks",
            options={"blocks_preset": _name, "save_trainable_only": True},
            preset=_preset,
            recipe=_recipe,
            description=_description,
            source=_source,
            **_capabilities,
        )
    )

# EFL (IDPG Table 1's entailment-based fine-tuning; Wang et al. 2021): full fine-tuning of an MNLI-tuned
# RoBERTa (--model: its folder) on every task stated as entailment (--task efl_sentence_prediction; the
# MNLI head "mnli" of fairseq's roberta.large.mnli is reused as the entailment head). IDPG appendix A.1:
# "for both transformer fine-tuning methods including RoBERTa and EFL, we follow their official training
# instructions, i.e., using a polynomial learning rate scheduler with 6% of total steps to warm up and
# tuning for 10 epochs"; lr 1e-5, batch 32, weight decay 0.1: IDPG Table 4 (first column). The batch
# counts examples; each trains with its pairs (one per example for every task of IDPG Table 1).
EFL_SOURCE = "IDPG appendix A.1 (EFL's official instructions: polynomial decay, 6% warmup, 10 epochs)"
EFL_RECIPE = Recipe(
    lr=1e-5, scheduler="polynomial_decay", warmup=0.06, batch=32, epochs=10, clip_norm=0.0, weight_decay=0.1,
    select_on="valid",
    sources={"lr": "IDPG Table 4 (fine-tuning column)", "scheduler": EFL_SOURCE, "warmup": EFL_SOURCE,
             "batch": "IDPG Table 4 (fine-tuning column)", "epochs": EFL_SOURCE,
             "clip_norm": "fairseq's GLUE recipe (none)", "weight_decay": "IDPG Table 4",
             "select_on": "IDPG Table 1 (dev metric)"},
)  # fmt: skip
register(
    Method(
        "efl",
        arch="roberta",
        options={"classification_head_name": "mnli"},
        recipe=EFL_RECIPE,
        task="efl_sentence_prediction",
        frozen_backbone=False,
        description="EFL: full fine-tuning from an MNLI model, each task as entailment with a label description",
        source="IDPG Table 1 (EFL, Wang et al. 2021)",
        family="finetune",
    )
)
