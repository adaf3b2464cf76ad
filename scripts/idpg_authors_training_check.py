#!/usr/bin/env python3
"""Many updates, not one batch: the authors' IDPG model (github:CSerxy/IDPG) and ours, each trained by
fairseq-train's own loop (``fairseq_cli.train.main``, in this process) from the same initial values on the same
batches, compared at every update (the loss) and at the end (every trained tensor, every frozen one).

    git --git-dir=$(MIRROR) archive HEAD | tar -x -C /tmp/idpg-authors    # github:CSerxy/IDPG
    PYTHONPATH=. python3 scripts/idpg_authors_training_check.py --idpg-authors /tmp/idpg-authors

Our side is what users run: the method record's task, ``--arch``/preset and recipe (``fairseq_idpg/methods.py``:
Adam (0.9, 0.98), eps 1e-6, weight decay 0.1, the fixed scheduler at the recipe's lr and batch, its clipping,
none), with the sizes given as flags (``--idpg-prompt-length``, ``--idpg-hidden``, ``--idpg-phm-n``;
``--prompt-length``), dropout off (``--dropout 0 --attention-dropout 0 --activation-dropout 0 --idpg-dropout 0``)
and ``--idpg-cache off``; then the M(x) cache on (``memory``, ``disk``) and fp16 (``--fp16`` with their scripts'
loss scaling: ``--fp16-init-scale 4 --threshold-loss-scale 1 --fp16-scale-window 128``; on the CPU through
fairseq_idpg_compat's fix 11). Their side is their ``TransformerSentenceEncoder`` shimmed as
scripts/idpg_authors_check.py does (read from the checkout at run time), built with their scripts' flags
(``their_flags``; prompt tuning: ``--add-suffix`` without ``--prompt-generation``, i.e. ``suffix_embed``) and
``--freeze-encoder``'s freezing, under fairseq's RoBERTa classification head (the same class in 0.9), as the
test-only architecture ``idpg_authors_trained`` registered here, trained with fairseq's ``sentence_prediction``
task and criterion and the same optimizer flags.

Both sides start from the same values: the frozen backbone (a tiny random RoBERTa, 2 layers x 16, t 2, m 8,
n 4, fairseq_idpg.conversion.tiny) and trained values drawn once here (our model's initialisation under a seed,
then moved off it by N(0, 0.05^2): ``initial_values``), installed into each model when fairseq-train has built
its trainer, into theirs through the one-batch check's name map, so the check does not depend on either side's
default initialisation. The data is the first rows of the real SST-2 (../shared/data/glue/SST-2) prepared with
the project's own preparation (WordPiece on the tiny model's vocabulary); every batch is recorded on both sides
and must be the same. A case passes when every update's loss and every final trained tensor agree within
--tolerance (largest |diff| over largest |theirs|, per tensor), every frozen tensor is bit-equal to its start on
each side, and the same tensors moved and were given to the optimizer on both sides.

S-IDPG-PHM: our preset has one A set, their code two (docs/idpg.md); trained, the two sets part after the first
update, so the preset is reported apart from the verdict (a known difference), and ``--idpg-phm-a-sets 2`` (both
sets starting from the same A) is the case compared.

Also measured: an input longer than 512 - t tokens (their code cuts the prompted sequence at 512, dropping the
final ``</s>``; ours truncates the text first, keeping it); such inputs are kept out of the batches.

``--save-fixture DIR`` writes their side's fp32 numbers (tests/data/idpg_authors_training/: losses, batch
digests, initial and final trained tensors in our names, read by tests/test_idpg_authors_training.py without the
checkout). Exit status: 0 when every compared case agrees, 1 otherwise, 2 for a refusal.
"""

import argparse
import contextlib
import hashlib
import io
import logging
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))
import idpg_authors_check as check  # noqa: E402  (the shim, the name map, the tiny backbone)

SHARED_DATA = REPO.parent / "shared" / "data"
HEAD = "sentence_classification_head"  # fairseq's --classification-head-name
PROMPT = "prompt-tuning-5"
METHODS = (*check.METHODS, PROMPT)
THEIR_ARCH = "idpg_authors_trained"
TWO_A_SETS = ("--idpg-phm-a-sets", "2")
THEIR_FP16 = ("--fp16", "--fp16-init-scale", "4", "--threshold-loss-scale", "1", "--fp16-scale-window", "128")
# the fixture's sizes (those of tests/data/idpg_authors) and run: 40 updates of the recipe's batch (16) over 320
# SST-2 rows, two epochs (the second reshuffled)
CONFIG = dict(
    layers=2, dim=16, heads=2, ffn=32, seed=0, t=2, hidden=8, n=4, task="SST-2", rows=320, dev_rows=16,
    updates=40, train_seed=1, values_seed=0,
)  # fmt: skip
MAX_POSITIONS = 512


# ---------------------------------------------------------------------------------------------- data
def prepare_slice(shared_data, folder, vocab, rows, dev_rows):
    """(prepared data folder, md5 of the raw slice): the first ``rows`` SST-2 train rows (and ``dev_rows`` dev
    rows) of ``shared_data``, prepared by the project's own preparation (WordPiece on ``vocab``)."""
    import itertools

    from fairseq_idpg.preprocessing import prepare

    source = Path(shared_data) / "glue" / "SST-2"
    if not (source / "train.tsv").is_file():
        raise check.CheckError(f"{source}/train.tsv not found (the real data: ../shared/data, see its README.md)")
    raw = Path(folder) / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    digest = hashlib.md5()
    for name, count in (("train.tsv", rows), ("dev.tsv", dev_rows)):
        with (source / name).open(encoding="utf-8", newline="") as lines:
            text = "".join(itertools.islice(lines, count + 1))  # and the header
        (raw / name).write_text(text, encoding="utf-8", newline="")
        digest.update(text.encode())
    out = Path(folder) / "bin"
    prepare("SST-2", str(raw), str(out), bpe="wordpiece", vocab=str(vocab), workers=1)
    return out, digest.hexdigest()


def batch_digest(sample):
    """sha1 of a batch's tokens and labels: the two sides' batches are the same batch."""
    tokens, target = sample["net_input"]["src_tokens"], sample["target"]
    return hashlib.sha1(tokens.cpu().numpy().tobytes() + target.cpu().numpy().tobytes()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- the two models
def size_options(method, config=CONFIG):
    """Our model attributes for the fixture's sizes (t, m, n); the same as fairseq-train flags: ``size_flags``."""
    if method == PROMPT:
        return dict(prompt_length=config["t"])
    return dict(idpg_prompt_length=config["t"], idpg_hidden=config["hidden"], idpg_phm_n=config["n"])


def size_flags(method, config=CONFIG):
    return [x for k, v in size_options(method, config).items() for x in ("--" + k.replace("_", "-"), str(v))]


def build_template(method, backbone, config=CONFIG, a_sets=None):
    """Our model (dropout 0, cache off, head ``HEAD``) built as fairseq-train builds it: the source of the initial
    values and, for their side, of the frozen weights and the name map."""
    from fairseq_idpg.methods import METHODS as RECORDS
    from fairseq_idpg.models.build import build_method

    model_file, dictionary, dims = backbone
    options = dict(size_options(method, config), dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    if method != PROMPT:
        options.update(idpg_cache="off", idpg_dropout=0.0)
        options.update(idpg_phm_a_sets=a_sets) if a_sets else None
    model = build_method(RECORDS[method], dictionary, backbone=str(model_file), **dims, **options)
    model.register_classification_head(HEAD, num_classes=2)
    return model


def initial_values(method, backbone, seed, config=CONFIG):
    """{our name: tensor} of every trained tensor: our initialisation under ``seed``, moved off it by N(0, 0.05^2)
    (``check.perturb``), so that neither side's default initialisation matters."""
    torch.manual_seed(seed)
    model = build_template(method, backbone, config)
    check.perturb(model, seed)
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def with_second_a_set(values):
    """S-IDPG-PHM's values for a model with two A sets (ours with ``--idpg-phm-a-sets 2``, or theirs): both the
    preset's one A (their code's two sets start equal, as the one-batch check copies them)."""
    if "generator.phm1.A" in values and "generator.phm2.A" not in values:
        return {**values, "generator.phm2.A": values["generator.phm1.A"]}
    return values


def their_name_map(template, method):
    """[(our name, their tensor path, their -> our view)] (check.name_map; prompt tuning: their suffix_embed)."""
    if method == PROMPT:
        return [("prompt.weight", "suffix_embed.weight", None)]
    return check.name_map(template, method)


def their_prompt_encoder(encoder_cls, template, method, dropout=0.0):
    """Their encoder for ``method``: IDPG with their scripts' flags (check.build_theirs); prompt tuning with
    ``--add-suffix`` and no ``--prompt-generation`` (their ``suffix_embed``, inserted after ``<s>``)."""
    if method != PROMPT:
        return check.build_theirs(encoder_cls, template, method, dropout)
    flags = dict(
        add_suffix=True, sentence_generation=None, insert_position=template.args.prompt_position,
        middle_prompt_insert_layer=25, middle_prompt_mode="none",
    )  # fmt: skip
    return check.their_encoder(encoder_cls, template, dropout, template.args.prompt_length, flags)


class _Values:
    """{name: tensor} read as a module's named_parameters (what check.copy_into_theirs reads)."""

    def __init__(self, values):
        self.values = values

    def named_parameters(self):
        return self.values.items()


# the model fairseq-train builds for ``--arch idpg_authors_trained``: set by ``train_theirs`` before each run
THEIR_SPEC = {}


def their_model_class():
    """The test-only fairseq model ``idpg_authors_trained`` (registered once per process): their encoder under
    fairseq's RobertaClassificationHead (dense -> tanh -> dropout -> out_proj on ``<s>``, as in their 0.9 fork)."""
    from fairseq.models import MODEL_REGISTRY, BaseFairseqModel, register_model, register_model_architecture
    from fairseq.models.roberta.model import RobertaClassificationHead

    if THEIR_ARCH in MODEL_REGISTRY:
        return MODEL_REGISTRY[THEIR_ARCH]

    class TheirModel(BaseFairseqModel):
        def __init__(self, args, encoder, pairs):
            super().__init__()
            self.args = args  # fairseq's sentence_prediction criterion reads it (as their RobertaModel has it)
            self.sentence_encoder = encoder
            self.pairs = pairs
            self.classification_heads = torch.nn.ModuleDict()

        @classmethod
        def build_model(cls, args, task):
            s = THEIR_SPEC
            template = build_template(s["method"], s["backbone"], s["config"], a_sets=s.get("a_sets"))
            encoder = their_prompt_encoder(s["encoder_cls"], template, s["method"])
            return cls(args, encoder, their_name_map(template, s["method"]))

        def register_classification_head(self, name, num_classes=None, inner_dim=None, **kwargs):
            d = self.sentence_encoder.embedding_dim
            self.classification_heads[name] = RobertaClassificationHead(d, inner_dim or d, num_classes, "tanh", 0.0)

        def forward(self, src_tokens, features_only=False, classification_head_name=None, **kwargs):
            inner, _ = self.sentence_encoder(src_tokens, last_state_only=True)
            return self.classification_heads[classification_head_name](inner[-1].transpose(0, 1)), {}

        def max_positions(self):
            return MAX_POSITIONS

    register_model(THEIR_ARCH)(TheirModel)
    register_model_architecture(THEIR_ARCH, THEIR_ARCH)(lambda args: None)
    return TheirModel


# ---------------------------------------------------------------------------------------------- training
@dataclass
class Run:
    """What one fairseq-train run did: per call of the task's train_step the update number, the loss (summed
    cross-entropy) and the batch's digest; every parameter at the start (after the initial values were
    installed) and at the end; the trained ones (requires_grad) and those given to the optimizer."""

    updates: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    batches: list = field(default_factory=list)
    start: dict = field(default_factory=dict)
    end: dict = field(default_factory=dict)
    trained: set = field(default_factory=set)
    optimized: set = field(default_factory=set)
    model: object = None

    @property
    def moved(self):
        return {n for n, v in self.end.items() if not torch.equal(v, self.start[n])}


def _attach(run, trainer, task, install):
    """Install the initial values, snapshot the start and record every train_step of ``task``."""
    model = trainer.model
    with torch.no_grad():
        install(model)
    run.model = model
    run.start = {n: p.detach().clone() for n, p in model.named_parameters()}
    run.trained = {n for n, p in model.named_parameters() if p.requires_grad}
    inner = task.train_step

    def train_step(**kwargs):
        out = inner(**kwargs)
        run.updates.append(kwargs["update_num"])
        run.losses.append(float(out[0].detach().float()))
        run.batches.append(batch_digest(kwargs["sample"]))
        return out

    task.train_step = train_step


def fairseq_train(argv, install):
    """fairseq-train's parse + ``main`` in this process, its Trainer recording a ``Run``; ``install(model)``
    writes the initial values once the trainer holds the model (fp16: already half)."""
    from fairseq import distributed_utils, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import train

    run = Run()

    class RecordingTrainer(train.Trainer):
        def __init__(self, cfg, task, model, criterion, *args, **kwargs):
            super().__init__(cfg, task, model, criterion, *args, **kwargs)
            _attach(run, self, task, install)
            run.trainer = self

    args = options.parse_args_and_arch(options.get_training_parser(), [str(a) for a in argv])
    stock, train.Trainer = train.Trainer, RecordingTrainer
    try:
        distributed_utils.call_main(convert_namespace_to_omegaconf(args), train.main)
    finally:
        train.Trainer = stock
    model = run.model
    run.end = {n: p.detach().clone() for n, p in model.named_parameters()}
    names = {id(p): n for n, p in model.named_parameters()}
    optimizer = run.trainer.optimizer
    params = getattr(optimizer, "fp16_params", None) or list(optimizer.params)
    run.optimized = {names[id(p)] for p in params}
    del run.trainer
    return run


def common_flags(record, data, config, save_dir, fp16):
    """The flags both sides train with: the record's recipe (optimizer, lr, batch, clipping, schedule), the
    budget, the seed, on the CPU without saving or validating (dropout: each side's own flags)."""
    r = record.recipe
    assert r.scheduler == "fixed", f"{record.name}: the check runs IDPG's fixed scheduler, not {r.scheduler}"
    # fmt: off
    flags = [
        data, "--num-classes", 2, "--init-token", 0, "--separator-token", 2,
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", 1e-06, "--weight-decay", r.weight_decay,
        "--clip-norm", r.clip_norm, "--lr-scheduler", "fixed", "--lr", r.lr, "--batch-size", r.batch,
        "--max-update", config["updates"], "--seed", config["train_seed"], "--cpu", "--num-workers", 0,
        "--no-save", "--disable-validation", "--save-dir", save_dir, "--log-format", "none",
    ]
    # fmt: on
    return flags + list(THEIR_FP16 if fp16 else ())


def train_ours(method, backbone, data, values, folder, config=CONFIG, cache="off", extra=(), fp16=False):
    """Our method trained by fairseq-train as users run it (the record's task, --arch, preset, recipe), from
    ``values`` (our names)."""
    from fairseq_idpg.methods import METHODS as RECORDS
    from fairseq_idpg.run import model_dims

    record = RECORDS[method]
    model_file = backbone[0]
    argv = common_flags(record, data, config, Path(folder) / "save", fp16)
    argv += ["--user-dir", REPO / "fairseq_idpg", *record.train_args(), "--criterion", "sentence_prediction_metrics"]
    argv += ["--dropout", 0, "--attention-dropout", 0, "--activation-dropout", 0]
    argv += [x for kv in model_dims(str(model_file)).items() for x in kv] + ["--backbone", model_file]
    argv += size_flags(method, config)
    if method != PROMPT:
        argv += ["--idpg-dropout", 0, "--idpg-cache", cache, "--idpg-cache-dir", Path(folder) / "mx-cache"]
    argv += list(extra)

    def install(model):
        params = dict(model.named_parameters())
        for name, value in values.items():
            params[name].copy_(value)

    return fairseq_train(argv, install)


def train_theirs(encoder_cls, method, backbone, data, values, folder, config=CONFIG, fp16=False):
    """Their encoder (+ fairseq's head) trained by fairseq-train with fairseq's sentence_prediction task and
    criterion and the same optimizer flags, from ``values`` (our names, through the name map)."""
    from fairseq_idpg.methods import METHODS as RECORDS

    their_model_class()
    a_sets = 2 if method == "s-idpg-phm" else None  # their two A sets, in our names
    THEIR_SPEC.clear()
    THEIR_SPEC.update(method=method, backbone=backbone, config=config, encoder_cls=encoder_cls, a_sets=a_sets)
    values = with_second_a_set(values)
    argv = common_flags(RECORDS[method], data, config, Path(folder) / "save", fp16)
    argv += ["--user-dir", REPO / "fairseq_idpg", "--task", "sentence_prediction", "--arch", THEIR_ARCH]
    argv += ["--criterion", "sentence_prediction"]

    def install(model):
        check.copy_into_theirs(_Values(values), model.sentence_encoder, model.pairs)
        params = dict(model.named_parameters())
        for name, value in values.items():
            if name.startswith("classification_heads."):
                params[name].copy_(value)

    return fairseq_train(argv, install)


# ---------------------------------------------------------------------------------------------- comparing
def their_names(model):
    """{their parameter name: our name} over the name map and the head (a name map row with a view of part
    of a tensor, e.g. M-IDPG-DNN's one bias table for c_0 and c_1..: every our name of it, joined by '+')."""
    from operator import attrgetter

    out = {}
    params = {id(p): n for n, p in model.named_parameters()}
    for ours, path, _ in model.pairs:
        target = attrgetter(path)(model.sentence_encoder)
        for p in target if isinstance(target, torch.nn.ParameterList) else [target]:
            name = params[id(p)]
            out[name] = "+".join(sorted({*out[name].split("+"), ours})) if name in out else ours
    out.update({n: n for n in params.values() if n.startswith("classification_heads.")})
    return out


def _our_set(names, mapping):
    """Their parameter names in our names (those without a counterpart kept as 'theirs only: NAME')."""
    return {mapping.get(n, f"theirs only: {n}") for n in names}


def _ours_set(names, combined):
    """Our names grouped as their tensors group them (M-IDPG-DNN: c_0 and c_1.. in one table of theirs)."""
    return {next((c for c in combined if n in c.split("+")), n) for n in names}


def relative(a, b):
    """Largest |a - b| over largest |b| (b: their side's)."""
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


def final_values(run, side):
    """The trained tensors at the end in our names (theirs through the name map, S-IDPG-PHM's A sets as two)."""
    model = run.model
    if side == "ours":
        return {n: run.end[n] for n in run.trained}
    values = check.their_values(model.sentence_encoder, model.pairs)
    values.update({n: run.end[n] for n in run.trained if n.startswith("classification_heads.")})
    return values


def compare(ours, theirs_numbers):
    """One case's numbers: ``theirs_numbers`` are their run's (``their_numbers``), so that a fixture stands in."""
    t = theirs_numbers
    n = min(len(ours.losses), len(t["losses"]))
    loss_abs = max(abs(a - b) for a, b in zip(ours.losses[:n], t["losses"][:n], strict=True))
    loss_rel = max(abs(a - b) / abs(b) for a, b in zip(ours.losses[:n], t["losses"][:n], strict=True))
    mine = final_values(ours, "ours")
    finals = {name: relative(value, t["final"][name]) for name, value in mine.items() if name in t["final"]}
    combined = [c for c in t["moved"] | t["optimized"] if "+" in c]
    return dict(
        updates=(len(ours.updates), len(t["updates"])),
        same_batches=ours.batches == t["batches"] and ours.updates == t["updates"],
        loss_abs=loss_abs,
        loss_rel=loss_rel,
        final_rel=max(finals.values()),
        finals=finals,
        unmatched=sorted(set(mine) - set(t["final"])),
        frozen_equal=(frozen_equal(ours), t["frozen_equal"]),
        moved=(_ours_set(ours.moved, combined), t["moved"]),
        optimized=(_ours_set(ours.optimized, combined), t["optimized"]),
    )


def drift(a, b):
    """(largest loss rel, largest final tensor rel) of one side's numbers ``a`` against ``b`` (fp16 against fp32)."""
    loss = max(abs(x - y) / abs(y) for x, y in zip(a["losses"], b["losses"], strict=True))
    return loss, max(relative(a["final"][n], b["final"][n]) for n in b["final"])


def frozen_equal(run):
    """Every tensor not trained (requires_grad False) is bit-equal to its start."""
    return all(torch.equal(run.end[n], run.start[n]) for n in run.start if n not in run.trained)


def their_numbers(run):
    """Their run in our names: what ``compare`` and the fixture read."""
    mapping = their_names(run.model)
    return dict(
        updates=list(run.updates), losses=list(run.losses), batches=list(run.batches),
        final={k: v.float() for k, v in final_values(run, "theirs").items()}, frozen_equal=frozen_equal(run),
        moved=_our_set(run.moved, mapping), optimized=_our_set(run.optimized, mapping),
        trained_without_counterpart=sorted(n for n in run.trained if n not in mapping),
    )  # fmt: skip


# their encoder's LayerNorms for options the scripts leave off (--generator-residual, prompt_insert_mode 2): built
# with requires_grad, so given to the optimizer, but never used (no gradient): a finding, printed, not a failure
THEIRS_UNUSED = tuple(
    f"theirs only: sentence_encoder.{m}.{w}"
    for m in ("multi_layer_norm", "residual_layer_norm")
    for w in ("weight", "bias")
)


def passes(result, tolerance):
    """Every update's loss and every final tensor within ``tolerance``, the same batches, frozen tensors bit-equal,
    the same tensors moved, and the same given to the optimizer but for THEIRS_UNUSED."""
    ours, theirs = result["optimized"]
    same_sets = result["moved"][0] == result["moved"][1] and ours == theirs - set(THEIRS_UNUSED)
    return (
        result["same_batches"]
        and result["loss_rel"] <= tolerance
        and result["final_rel"] <= tolerance
        and not result["unmatched"]
        and all(result["frozen_equal"])
        and same_sets
    )


# ---------------------------------------------------------------------------------------------- > 512 - t tokens
def long_input_rows(encoder_cls, backbone, config=CONFIG):
    """An input of 512 tokens (<s> w_1..w_510 </s>) with prompt tuning, t prompt slots: [(quantity, value)], in a
    batch beside a short padded row. Their forward cuts the prompted sequence (512 + t) at 512, i.e. drops the last
    t tokens, the final </s> among them; ours never sees it: the task truncates the text to 512 - t tokens first
    (<s> w_1..w_(509-t) </s>). Alone (a batch without padding) their cut fails: it prints padding_mask.size()."""
    t = config["t"]
    torch.manual_seed(0)
    ours = build_template(PROMPT, backbone, config).eval()
    theirs = their_prompt_encoder(encoder_cls, ours, PROMPT).eval()
    check.copy_into_theirs(ours, theirs, their_name_map(ours, PROMPT))
    head = ours.classification_heads[HEAD]
    g = torch.Generator().manual_seed(0)
    words = torch.randint(4, len(backbone[1]) - 1, (MAX_POSITIONS - 2,), generator=g)
    long = torch.cat([torch.tensor([0]), words, torch.tensor([2])])
    kept = long[: MAX_POSITIONS - t]  # what survives their cut: no </s>
    truncated = torch.cat([long[: MAX_POSITIONS - t - 1], torch.tensor([2])])  # our task's truncation

    def batch(row):  # the row and a short one, right-padded
        tokens = torch.ones(2, len(row), dtype=torch.long)
        tokens[0], tokens[1, :4] = row, torch.tensor([0, 5, 6, 2])
        return tokens

    def their_logits(tokens):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), torch.no_grad():  # their code prints the sizes when it cuts
            inner, _ = theirs(tokens, last_state_only=True)
            logits = head(inner[-1].transpose(0, 1))[0]
        return logits, printed.getvalue()

    theirs_long, printed = their_logits(batch(long))
    try:
        their_logits(long[None])
        alone = "no error"
    except AttributeError as e:
        alone = f"AttributeError: {e}"
    with torch.no_grad():
        mine = ours(truncated[None], classification_head_name=HEAD)[0][0]
    kept_diff = (theirs_long - their_logits(batch(kept))[0]).abs().max()
    same_row = (their_logits(batch(truncated))[0] - mine).abs().max()
    return [
        ("their cut prints (x, then the cut x)", " ".join(printed.split()[:6])),
        ("the 512-token row alone (no padding in the batch)", alone),
        ("|theirs(512 tokens) - theirs(its first 512 - t: no </s>)|", float(kept_diff)),
        ("|theirs(512 tokens) - ours(our task's truncation)|", float((theirs_long - mine).abs().max())),
        ("|theirs(our truncation) - ours(our truncation)|", float(same_row)),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------- main
def case_list(methods, cache, fp16):
    """[(case label, method, our extra flags, cache, fp16)]: what is compared with their run of (method, fp16)."""
    cases = []
    for precision in (False, True) if fp16 else (False,):
        suffix = " fp16" if precision else ""
        for m in methods:
            cases.append((m + suffix, m, (), "off", precision))
            if m == "s-idpg-phm":
                cases.append((f"{m} --idpg-phm-a-sets 2{suffix}", m, TWO_A_SETS, "off", precision))
            if m != PROMPT and cache and not precision:
                for kind in ("memory", "disk"):
                    extra = TWO_A_SETS if m == "s-idpg-phm" else ()
                    cases.append((f"{m}{' --idpg-phm-a-sets 2' if extra else ''} cache {kind}", m, extra, kind, False))
    return cases


def known_difference(label):
    """S-IDPG-PHM's preset (one A set against their two): reported apart from the verdict."""
    return label.startswith("s-idpg-phm") and "--idpg-phm-a-sets 2" not in label


def run_cases(encoder_cls, backbone, data, folder, methods, cache, fp16, config=CONFIG):
    """{case label: compare(...)} and {method: their fp32 numbers} (the fixture's)."""
    results, theirs_fp32, values = {}, {}, {}
    theirs = {}
    for label, method, extra, kind, precision in case_list(methods, cache, fp16):
        if method not in values:
            values[method] = initial_values(method, backbone, config["values_seed"], config)
        start = with_second_a_set(values[method]) if extra == TWO_A_SETS else values[method]
        if (method, precision) not in theirs:
            run = train_theirs(
                encoder_cls, method, backbone, data, values[method], Path(folder) / "t", config, precision
            )
            theirs[method, precision] = their_numbers(run)
        ours = train_ours(method, backbone, data, start, Path(folder) / "o", config, kind, extra, precision)
        results[label] = compare(ours, theirs[method, precision])
        if precision and (method, False) in theirs:  # the yardstick: fp16's own distance from fp32, on their side
            results[label]["fp16_vs_fp32"] = drift(theirs[method, True], theirs[method, False])
        if not precision:
            theirs_fp32[method] = theirs[method, precision]
    return results, theirs_fp32, values


def print_results(results, tolerance):
    print(f"\n{'case':<44} {'updates':>7} {'batches':>7} {'loss |diff|':>11} {'loss rel':>9} {'final rel':>9} "
          f"{'frozen ==':>9} {'same moved':>10} {'same optim':>10}")  # fmt: skip
    findings = {}  # message -> the cases it holds for
    for label, r in results.items():
        frozen = "yes" if all(r["frozen_equal"]) else f"NO {r['frozen_equal']}"
        moved = "yes" if r["moved"][0] == r["moved"][1] else "NO"
        ours, theirs = r["optimized"]
        optimized = "yes" if ours == theirs else ("theirs +" if ours == theirs - set(THEIRS_UNUSED) else "NO")
        note = " (known difference)" if known_difference(label) else ("" if passes(r, tolerance) else "  <-- DIFFERENT")
        note = " (fp16: below)" if "fp16" in label and not known_difference(label) else note
        print(f"{label:<44} {r['updates'][0]:>7} {'same' if r['same_batches'] else 'DIFF':>7} {r['loss_abs']:11.2e} "
              f"{r['loss_rel']:9.2e} {r['final_rel']:9.2e} {frozen:>9} {moved:>10} {optimized:>10}{note}")  # fmt: skip
        for kind in ("moved", "optimized"):
            a, b = r[kind]
            if a != b:
                message = f"{kind} by ours only {sorted(a - b)}, by theirs only {sorted(b - a)}"
                findings.setdefault(message, []).append(label)
        if r["unmatched"]:
            message = f"trained tensors of ours with no counterpart in theirs: {r['unmatched']}"
            findings.setdefault(message, []).append(label)
    for message, labels in findings.items():
        print(f"\n{message}\n  in: {', '.join(labels)}")


def save_fixture(out_dir, theirs, values, digest, backbone_sum, checkout, config=CONFIG):
    """Their fp32 numbers per method (losses, batch digests, final tensors in our names), the initial values
    (stored, not redrawn: our default initialisation may change), the data's identity and the config."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = {}
    for method, t in theirs.items():
        cases[method] = dict(
            losses=torch.tensor(t["losses"], dtype=torch.float64), updates=t["updates"], batches=t["batches"],
            initial=check.pack(dict(loss=torch.zeros(()), logits=torch.zeros(0), prompts=[], values=values[method])),
            final=check.pack(dict(loss=torch.zeros(()), logits=torch.zeros(0), prompts=[], values=t["final"])),
            moved=sorted(t["moved"]), optimized=sorted(t["optimized"]), frozen_equal=t["frozen_equal"],
        )  # fmt: skip
    fixture = dict(config=config, data_md5=digest, backbone_sum=backbone_sum, cases=cases)
    torch.save(fixture, out_dir / "trained.pt")
    data = f"GLUE SST-2: the first {config['rows']} train rows, {config['dev_rows']} dev rows"
    script = "idpg_authors_training_check.py"
    check.write_provenance(out_dir, checkout, script, config=config, data_md5=digest, data=data)
    return out_dir / "trained.pt"


def fixture_numbers(case):
    """(initial values, their numbers as ``compare`` reads them) of one method of the fixture."""
    values = check.unpack(case["initial"])["values"]
    theirs = dict(
        updates=list(case["updates"]), losses=case["losses"].tolist(), batches=list(case["batches"]),
        final=check.unpack(case["final"])["values"], frozen_equal=case["frozen_equal"],
        moved=set(case["moved"]), optimized=set(case["optimized"]),
    )  # fmt: skip
    return values, theirs


def quiet():
    """fairseq-train logs every run's configuration at INFO: kept to warnings."""
    for name in ("fairseq", "fairseq_cli", "fairseq_idpg", "fairseq_idpg_compat"):
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idpg-authors", required=True, help="an extracted checkout of github:CSerxy/IDPG")
    parser.add_argument("--shared-data", default=str(SHARED_DATA), help="the real task files (../shared/data)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--no-cache", action="store_true", help="skip the cases with our M(x) cache on")
    parser.add_argument("--no-fp16", action="store_true", help="skip the fp16 cases")
    parser.add_argument("--updates", type=int, default=CONFIG["updates"], help="updates per run (fixture: 40)")
    parser.add_argument("--save-fixture", metavar="DIR", help="write their fp32 numbers here")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest relative difference (loss, tensors)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    quiet()
    try:
        return check_all(args)
    except check.CheckError as e:
        print(f"idpg_authors_training_check: {e}", file=sys.stderr)
        return 2


def check_all(args):
    config = dict(CONFIG, updates=args.updates)
    if args.save_fixture and (config != CONFIG or set(args.methods) != set(METHODS)):
        raise check.CheckError("--save-fixture writes every method at the fixture's config (no --updates, --methods)")
    encoder_cls = check.import_authors(args.idpg_authors)
    with tempfile.TemporaryDirectory() as tmp:
        c = config
        backbone = check.tiny_backbone(Path(tmp) / "tiny", c["layers"], c["dim"], c["heads"], c["ffn"], c["seed"])
        data, digest = prepare_slice(args.shared_data, Path(tmp) / "data", Path(tmp) / "tiny" / "vocab.txt",
                                     c["rows"], c["dev_rows"])  # fmt: skip
        results, theirs, values = run_cases(
            encoder_cls, backbone, data, tmp, args.methods, not args.no_cache, not args.no_fp16, config
        )
        long_rows = long_input_rows(encoder_cls, backbone, config)
        if args.save_fixture:
            squares = check.backbone_sum(backbone[0])
            path = save_fixture(args.save_fixture, theirs, values, digest, squares, args.idpg_authors, config)
            print(f"fixture: {path}")
    print(f"tiny random RoBERTa ({c['layers']} layers x {c['dim']}, t {c['t']}, m {c['hidden']}, n {c['n']}); "
          f"SST-2 first {c['rows']} train rows (md5 {digest}); {c['updates']} updates per run")  # fmt: skip
    print_results(results, args.tolerance)
    print("\ninput of 512 tokens, prompt tuning (t prompt slots):")
    for quantity, value in long_rows:
        print(f"  {quantity:<56} {value if isinstance(value, str) else f'{value:.3e}'}")
    compared = {k: r for k, r in results.items() if not known_difference(k) and "fp16" not in k}
    fp16 = {k: r for k, r in results.items() if "fp16" in k and not known_difference(k)}
    worst = max((max(r["loss_rel"], r["final_rel"]) for r in compared.values()), default=0.0)
    ok = all(passes(r, args.tolerance) for r in compared.values())
    if fp16:
        print(
            "\nfp16 (reported, not in the verdict): ours against theirs, both fp16, beside their fp16 against their "
            "fp32 (fp16's own rounding):"
        )
        for label, r in fp16.items():
            own = r.get("fp16_vs_fp32", (float("nan"),) * 2)
            print(
                f"  {label:<40} loss rel {r['loss_rel']:.2e} (theirs fp16 vs fp32 {own[0]:.2e}), "
                f"final rel {r['final_rel']:.2e} (theirs fp16 vs fp32 {own[1]:.2e})"
            )
    print(f"\nfp32: largest relative difference {worst:.2e} (tolerance {args.tolerance:g}): "
          f"{'equal to float rounding' if ok else 'DIFFERENT'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
