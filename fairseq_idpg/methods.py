"""Method records: every method of the three papers and their baselines, as data.

A method is a registered fairseq architecture, the model options that make it that method (a
preset, as attribute names), the paper's training recipe, and where it comes from. Everything
that runs or inspects a method reads these records: ``scripts/run.sh --method NAME`` derives the
fairseq-train command line from them (``Method.train_args``), ``fairseq_idpg.models.build``
builds the model of a record (counts, benchmarks, tests), and the test suite checks every
record (tests/test_every_method.py), so a new record is tested with no new test code.

    Method("m-idpg-phm", arch="roberta_idpg", options={"idpg_preset": "m-idpg-phm"},
           recipe=IDPG_RECIPE, task="idpg_sentence_prediction", source="IDPG Table 1")

Frozen-backbone methods get the pretrained checkpoint as ``--backbone PATH`` (loaded frozen at
build time, ``models/frozen_roberta.py``); full fine-tuning gets it as ``--restore-file``. The
encoder size flags are read from the checkpoint, so one record runs on roberta.large,
roberta.base or the offline stand-in.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

SCHEDULERS = ("fixed", "polynomial_decay")


@dataclass(frozen=True)
class Recipe:
    """The optimisation settings a paper trains a method with (what run.sh passes on).

    ``lr`` None means the task's row of fairseq's RoBERTa GLUE fine-tuning table.
    ``scheduler``: "fixed" (constant lr, IDPG's released scripts) or "polynomial_decay"
    (linear decay to 0 after ``warmup`` of the updates)."""

    lr: Optional[float] = None
    lr_grid: Tuple[float, ...] = ()
    scheduler: str = "polynomial_decay"
    warmup: float = 0.06

    def __post_init__(self):
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}")


@dataclass(frozen=True)
class Method:
    """One method: ``arch`` + ``options`` (model attributes, e.g. ``{"idpg_preset": ...}``) +
    the ``recipe``; ``task``: the fairseq task it trains with."""

    name: str
    arch: str
    options: Mapping[str, Any] = field(default_factory=dict)
    recipe: Recipe = Recipe()
    task: str = "peft_sentence_prediction"
    frozen_backbone: bool = True
    description: str = ""
    source: str = ""

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
    if method.name in METHODS:
        raise ValueError(f"method {method.name!r} registered twice")
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise KeyError(f"unknown method {name!r}; valid: {', '.join(sorted(METHODS))}")
    return METHODS[name]


# ---------------------------------------------------------------------------------------- recipes
# IDPG (paper 001, section 4.2 and Table 4): Adam, constant lr from {5e-3, 1e-3, 5e-4, 1e-4}.
IDPG_GRID = (5e-3, 1e-3, 5e-4, 1e-4)
IDPG_RECIPE = Recipe(lr=5e-3, lr_grid=IDPG_GRID, scheduler="fixed")
# DPT (paper 002, section 3.2): linear decay with 10% warmup. Its lr 0.3 was tuned for T5 prompts
# alone; here the classification head trains with the same lr, so the top of IDPG's grid is used
# (docs/dpt.md).
DPT_RECIPE = Recipe(lr=5e-3, lr_grid=IDPG_GRID, scheduler="polynomial_decay", warmup=0.1)
# Inducer-tuning (paper 003, appendix: the authors' NLU script): lr 2e-4, linear decay, 6% warmup;
# every method of its NLU table was trained with that script.
INDUCER_RECIPE = Recipe(lr=2e-4, scheduler="polynomial_decay", warmup=0.06)

# ---------------------------------------------------------------------------------------- records
register(
    Method(
        "finetune",
        arch="roberta",
        frozen_backbone=False,
        description="full fine-tuning (fairseq's RoBERTa GLUE recipe)",
        source="fairseq examples/roberta/README.glue.md",
    )
)

# Static soft prompts (--arch roberta_prompt): one implementation of prompt tuning, P-tuning v2,
# DPT and its baselines; the preset names say the prompt length.
_PROMPT_METHODS = (
    ("prompt-tuning-5", IDPG_RECIPE, "prompt tuning, t = 5 (5,120 at roberta-large)", "IDPG Table 1"),
    ("prompt-tuning-134", IDPG_RECIPE, "prompt tuning, t = 134 (137,216)", "IDPG Table 1"),
    ("p-tuning-v2-5", IDPG_RECIPE, "P-tuning v2: per-layer additive prompts, t = 5 (122,880)", "IDPG Table 1"),
    ("prompt-tuning-100", DPT_RECIPE, "vanilla prompt tuning, l = 100 (DPT's baseline)", "DPT Table 1"),
    ("dpt", DPT_RECIPE, "DPT: P = A B, l = 100, b = 10 (Eq. 5)", "DPT section 3"),
    ("dpt-rank-probe", DPT_RECIPE, "rank probe: P = U ReLU(diag(s)) V, logs prompt_rank", "DPT section 2.2"),
    ("residual-prompt", DPT_RECIPE, "residual prompt tuning, l = 100, bottleneck 400", "DPT Table 1"),
    ("deep-dpt", DPT_RECIPE, "deep DPT: a low-rank prompt A_k B_k at every layer (beyond the paper)", "DPT section 3"),
)
for _name, _recipe, _description, _source in _PROMPT_METHODS:
    register(
        Method(
            _name,
            arch="roberta_prompt",
            options={"prompt_preset": _name, "save_trainable_only": True},
            recipe=_recipe,
            description=_description,
            source=_source,
        )
    )

# IDPG (--arch roberta_idpg): instance-dependent prompts; M(x) cached by its task.
_IDPG_METHODS = (
    ("s-idpg-phm", "S-IDPG-PHM, m = 256, n = 16, one A set (107,776)"),
    ("s-idpg-dnn", "S-IDPG-DNN, m = 256 (1,578,240)"),
    ("m-idpg-phm", "M-IDPG-PHM, m = 16, n = 16, previous-layer input, M version (137,232)"),
    ("m-idpg-dnn", "M-IDPG-DNN, m = 16, previous-layer input, M version (221,200)"),
    ("m-idpg-phm-glove", "M-IDPG-PHM-GloVe, GloVe M(x), n = 4 (144,704); give --idpg-glove-vectors"),
)
for _name, _description in _IDPG_METHODS:
    register(
        Method(
            _name,
            arch="roberta_idpg",
            options={"idpg_preset": _name, "save_trainable_only": True},
            recipe=IDPG_RECIPE,
            task="idpg_sentence_prediction",
            description=_description,
            source="IDPG Table 1",
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
    )
)

# Blocks in the frozen layers (--arch roberta_blocks): inducer-tuning and the adapter family.
_BLOCK_METHODS = (
    ("inducer", INDUCER_RECIPE, "inducer-tuning 6/4", "Inducer-tuning Table 5 (NLU)"),
    ("inducer-lora", INDUCER_RECIPE, "inducer-tuning + LoRA on W_q, 2/4/4", "Inducer-tuning Table 5 (NLU)"),
    ("mam-inducer", INDUCER_RECIPE, "MAM inducer-tuning 2/2/4/12", "Inducer-tuning Table 5 (NLU)"),
    (
        "inducer-adaptive",
        INDUCER_RECIPE,
        "ablation Adaptive (k~ = q, per-head value), NLU budget",
        "Inducer-tuning Table 3",
    ),
    (
        "inducer-extension",
        INDUCER_RECIPE,
        "ablation Extension (k~ = q, extended value), NLU budget",
        "Inducer-tuning Table 3",
    ),
    (
        "inducer-gating",
        INDUCER_RECIPE,
        "ablation Gating ((1 - lambda) Attn + lambda v~), 6/4",
        "Inducer-tuning Table 3",
    ),
    (
        "prefix-tuning",
        INDUCER_RECIPE,
        "prefix tuning, l = 32, MLP-reparameterised, stored compact",
        "Li & Liang 2021; inducer-tuning baseline",
    ),
    ("lora", INDUCER_RECIPE, "LoRA on W_q and W_v, r = 16, alpha = 32", "Hu et al. 2021; inducer-tuning baseline"),
    (
        "houlsby-adapter",
        INDUCER_RECIPE,
        "Houlsby adapter, r = 16, 2 per layer",
        "Houlsby et al. 2019; IDPG and inducer-tuning baseline",
    ),
    # Compacter's own configuration trains with 3e-3
    ("compacter", Recipe(lr=3e-3), "Compacter, n = 4, r = 16, PHM rank 1, 2 per layer", "IDPG appendix A.1.2"),
    (
        "mam-adapter",
        INDUCER_RECIPE,
        "MAM adapter: prefix 16 + parallel FFN adapter 16, s = 2",
        "He et al. 2021; inducer-tuning baseline",
    ),
    # biases alone need a larger step: the top of the BitFit paper's range
    ("bitfit", Recipe(lr=1e-3), "BitFit: every bias of the encoder", "Ben Zaken et al. 2021; inducer-tuning baseline"),
)
for _name, _recipe, _description, _source in _BLOCK_METHODS:
    register(
        Method(
            _name,
            arch="roberta_blocks",
            options={"blocks_preset": _name},
            recipe=_recipe,
            description=_description,
            source=_source,
        )
    )
