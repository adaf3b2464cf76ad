"""``--arch roberta_idpg``: instance-dependent prompt generation (IDPG, paper 001; SPEC section 1)
and its prompt baselines (prompt tuning, Prompt-tuning-134, the paper's P-tuning v2) on a frozen
RoBERTa. Only the prompt machinery and the classification head train.

Forward (Eq. 1-3): M(x) [B, d_in] -> generator G (``modules/prompt_generator.py``, Eq. 2-4) ->
P_0 [B, t, d] inserted at ``--prompt-position`` (``modules/prompt_insertion.py``) -> the frozen
encoder (``modules/prompted_encoder.py``); multi-layer (M-IDPG, section 3.2.2 / 4.5.3): after each
layer l = 1..L-1, ``x[prompt slots] += P_l`` with P_l = G(input_l) using bias c_l (M version),
the shared c (S version) or layer l's own generator (L version); input_l = M(x) (``first``, the
"layer 0" input) or the ``<s>`` state after layer l (``previous``). The head reads ``<s>``.

M(x) (``--idpg-input``): ``roberta``: the frozen backbone's final ``<s>`` state of the
*unprompted* input, without gradient, in eval mode (**Decision**, SPEC section 1; the authors'
train-mode pass with dropout: ``--idpg-mx-train-mode``); ``glove``: the mean GloVe vector (Eq. 5,
``modules/glove.py``). Computed once per example and cached (``--idpg-cache``; with
``--task idpg_sentence_prediction``, which the registered methods use): eval-mode M(x) is a
function of the frozen backbone and the example, so a cached row equals a recomputed one.

Presets (``--idpg-preset``, one per row of IDPG Table 1 / Table 2; explicit flags override):
see ``PRESETS``. Methods of the same names are registered for ``scripts/run.sh --method``.
"""
import logging
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import base_architecture, roberta_large_architecture

from fairseq_idpg.data.sentence_representation_cache import (
    SentenceRepresentationCache,
    cache_key,
    split_sentence_ids,
    to_device,
)
from fairseq_idpg.methods import register_method
from fairseq_idpg.modules.glove import GloveSentenceEncoder, read_glove_dim
from fairseq_idpg.modules.idpg_detokenize import Detokenizer
from fairseq_idpg.modules.prompt_generator import KINDS, PromptGenerator
from fairseq_idpg.modules.prompt_insertion import MIN_INPUT_TOKENS, check_position, task_is_pair
from fairseq_idpg.modules.prompted_encoder import prompted_features

from .frozen_roberta import FrozenBackboneRobertaModel

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_GLOVE = REPO / "data" / "glove" / "glove.6B.300d.txt"  # where scripts/download.sh glove puts it
DEFAULT_CACHE_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "fairseq_idpg", "idpg")

# One preset per row of IDPG Table 1 / Table 2 (SPEC section 1 and the released scripts).
PRESETS = {
    "prompt-tuning": dict(generator="none", prompt_length=5, depth="single"),
    "prompt-tuning-134": dict(generator="none", prompt_length=134, depth="single"),
    "p-tuning-v2": dict(generator="none", prompt_length=5, depth="multi", sharing="M"),
    "s-idpg-phm": dict(generator="phm", hidden=256, phm_n=16, phm_a_sets=1, depth="single", input="roberta"),
    "s-idpg-dnn": dict(generator="dnn", hidden=256, depth="single", input="roberta"),
    "m-idpg-phm": dict(generator="phm", hidden=16, phm_n=16, phm_a_sets=2, depth="multi", sharing="M",
                       input="roberta", layer_input="previous"),
    "m-idpg-dnn": dict(generator="dnn", hidden=16, depth="multi", sharing="M", input="roberta", layer_input="previous"),
    "m-idpg-phm-glove": dict(generator="phm", hidden=16, phm_n=4, phm_a_sets=2, depth="multi", sharing="M",
                             input="glove", layer_input="first"),
}
# values of the flags a preset leaves open (and of every flag without a preset: M-IDPG-PHM's)
DEFAULTS = dict(
    generator="phm", hidden=16, prompt_length=5, phm_n=16, phm_a_sets=2, depth="multi", sharing="M",
    input="roberta", layer_input="previous", prompt_position=0, dropout=0.1, layer_bias_rank=0, cache="disk",
)
DEFAULT_PRESET = "m-idpg-phm"


def _dest(key):
    return key if key == "prompt_position" else "idpg_" + key


def resolve_idpg_args(args):
    """Fill every IDPG flag left unset (None) from the preset, then ``DEFAULTS``. Idempotent."""
    if getattr(args, "idpg_preset", None) is None:
        args.idpg_preset = DEFAULT_PRESET
    if args.idpg_preset not in PRESETS:
        raise ValueError(f"--idpg-preset {args.idpg_preset!r} is not one of {', '.join(PRESETS)}")
    preset = PRESETS[args.idpg_preset]
    for key, default in DEFAULTS.items():
        if getattr(args, _dest(key), None) is None:
            setattr(args, _dest(key), preset.get(key, default))
    args.idpg_sharing = str(args.idpg_sharing).upper()
    for flag in ("idpg_residual", "idpg_layer_norm", "idpg_mx_train_mode", "idpg_train_backbone"):
        setattr(args, flag, bool(getattr(args, flag, False)))
    for flag in ("idpg_glove_vectors", "idpg_glove_bpe_dir", "idpg_cache_dir"):
        setattr(args, flag, getattr(args, flag, None))


def glove_path(args):
    """The GloVe file to use: ``--idpg-glove-vectors``, else data/glove/glove.6B.300d.txt if present."""
    if args.idpg_glove_vectors:
        return args.idpg_glove_vectors
    if DEFAULT_GLOVE.is_file():
        return str(DEFAULT_GLOVE)
    raise ValueError(
        "--idpg-input glove needs GloVe vectors: give --idpg-glove-vectors PATH "
        "(glove.6B.300d.txt, from scripts/download.sh glove)"
    )


def generator_input_dim(args):
    return read_glove_dim(glove_path(args)) if args.idpg_input == "glove" else args.encoder_embed_dim


def _choice(args, dest, valid):
    value = getattr(args, dest)
    if value not in valid:
        flag = "--" + dest.replace("_", "-")
        raise ValueError(f"{flag} must be one of {', '.join(map(str, valid))}, got {value!r}")


def check_idpg_args(args, task=None):
    """Build-time checks: one clear line naming the flag and what would be valid."""
    _choice(args, "idpg_generator", KINDS)
    _choice(args, "idpg_depth", ("single", "multi"))
    _choice(args, "idpg_sharing", ("S", "M", "L"))
    _choice(args, "idpg_input", ("roberta", "glove"))
    _choice(args, "idpg_layer_input", ("first", "previous"))
    _choice(args, "idpg_phm_a_sets", (1, 2))
    _choice(args, "idpg_cache", ("disk", "memory", "off"))
    t, d, max_pos = args.idpg_prompt_length, args.encoder_embed_dim, args.max_positions
    if t < 1 or t + MIN_INPUT_TOKENS > max_pos:
        raise ValueError(
            f"--idpg-prompt-length {t}: the prompt plus the shortest input ({MIN_INPUT_TOKENS} tokens) "
            f"must fit --max-positions {max_pos}: use 1 to {max_pos - MIN_INPUT_TOKENS}"
        )
    is_pair = task_is_pair(task)
    check_position(args.prompt_position, True if is_pair is None else is_pair)  # range; pairs when known
    generated = args.idpg_generator != "none"
    multi = args.idpg_depth == "multi"
    if (args.idpg_residual or args.idpg_layer_norm) and (not generated or multi):
        raise ValueError(
            "--idpg-residual / --idpg-layer-norm are the single-layer generator ablations of IDPG "
            "appendix A.5.1: use them with --idpg-depth single and --idpg-generator dnn or phm"
        )
    if generated:
        if args.idpg_hidden < 1:
            raise ValueError(f"--idpg-hidden must be >= 1, got {args.idpg_hidden}")
        d_in = generator_input_dim(args)
        if args.idpg_input == "glove" and multi and args.idpg_layer_input == "previous":
            raise ValueError(
                f"--idpg-layer-input previous feeds the {d}-dim <s> state to a generator built for "
                f"GloVe's {d_in}-dim vectors: use --idpg-layer-input first with --idpg-input glove"
            )
        if args.idpg_residual and d_in != d:
            raise ValueError(f"--idpg-residual adds M(x) ({d_in}-dim) to {d}-dim prompts: use --idpg-input roberta")
        if args.idpg_generator == "phm":
            n, m = args.idpg_phm_n, args.idpg_hidden
            if n < 1 or d_in % n or m % n or (t * d) % n:
                valid = [k for k in range(1, min(d_in, m) + 1) if d_in % k == 0 and m % k == 0 and (t * d) % k == 0]
                raise ValueError(
                    f"--idpg-phm-n {n} must divide the generator input size {d_in} ({args.idpg_input}), "
                    f"--idpg-hidden {m} and t*d = {t}*{d} = {t * d}; valid here: {', '.join(map(str, valid))}"
                )
    rank = args.idpg_layer_bias_rank
    if rank:
        per_layer = args.encoder_layers - 1
        if not (multi and args.idpg_sharing == "M"):
            raise ValueError(
                f"--idpg-layer-bias-rank {rank} factorises the per-layer biases c_1..c_(L-1) of the M version: "
                f"use it with --idpg-depth multi --idpg-sharing M"
            )
        if not 0 < rank < per_layer:
            raise ValueError(
                f"--idpg-layer-bias-rank must be between 1 and {per_layer - 1} (the {per_layer} layer biases "
                f"are cheaper stored in full from rank {per_layer}), got {rank}"
            )


def backbone_digest(model):
    """Digest of the frozen weights for the cache key: per tensor, its shape and the sum of
    squares of its values rounded to fp16 (so the fp32 and fp16 copies of one backbone agree),
    in float64, to 10 significant digits (so summation order does not matter)."""
    rows = []
    frozen = model.frozen_names()
    for name, p in sorted(model.named_parameters()):
        if name in frozen:
            s = p.detach().half().double().pow(2).sum().item()
            rows.append([name, list(p.shape), float(f"{s:.10g}")])
    return cache_key(rows)


@register_model("roberta_idpg")
class RobertaIdpgModel(FrozenBackboneRobertaModel):
    """IDPG and its prompt baselines; see the module docstring."""

    @staticmethod
    def add_args(parser):
        FrozenBackboneRobertaModel.add_args(parser)
        g = parser.add_argument_group("IDPG: instance-dependent prompt generation, prompt tuning, P-tuning v2")
        g.add_argument("--idpg-preset", choices=list(PRESETS), help=f"a row of IDPG Table 1/2 (default {DEFAULT_PRESET}); the flags below override it")
        g.add_argument("--idpg-generator", choices=KINDS, help="generator G: dnn, phm (Eq. 4) or none (prompt tuning / P-tuning v2)")
        g.add_argument("--idpg-hidden", type=int, metavar="M", help="generator hidden size m (16 multi-layer, 256 single-layer)")
        g.add_argument("--idpg-prompt-length", type=int, metavar="T", help="prompt length t (5; 134 for Prompt-tuning-134)")
        g.add_argument("--idpg-phm-n", type=int, metavar="N", help="PHM n (Eq. 4): 16 with RoBERTa input, 4 with GloVe")
        g.add_argument("--idpg-phm-a-sets", type=int, choices=(1, 2), help="PHM A sets: 1 shared by W1 and W2, 2 one per generator layer")
        g.add_argument("--idpg-depth", choices=("single", "multi"), help="prompts at the input only (S-IDPG) or added after every layer (M-IDPG)")
        g.add_argument("--idpg-sharing", type=str.upper, choices=("S", "M", "L"), help="multi-layer generators (Figure 2): S shares W and c, M per-layer c, L per-layer W and c")
        g.add_argument("--idpg-input", choices=("roberta", "glove"), help="sentence encoder M(x): frozen RoBERTa <s> or mean GloVe (Eq. 5)")
        g.add_argument("--idpg-layer-input", choices=("first", "previous"), help="multi-layer generator input: M(x) ('layer 0') or the previous layer's <s> state")
        g.add_argument("--prompt-position", type=int, help="insert position 0-4 (IDPG A.5.2; 2 and 3 need sentence pairs); default 0")
        g.add_argument("--idpg-dropout", type=float, metavar="P", help="generator dropout on M(x) and on h (0.1)")
        g.add_argument("--idpg-residual", action="store_true", help="A.5.1 ablation: add M(x) to each generated prompt vector")
        g.add_argument("--idpg-layer-norm", action="store_true", help="A.5.1 ablation: LayerNorm the generated prompts (with --idpg-residual: LN(LN(M(x)) + LN(G)))")
        g.add_argument("--idpg-layer-bias-rank", type=int, metavar="R", help="low-rank per-layer biases c_1..c_(L-1) = U V, U: [L-1, R], V: [R, t*d] (0: full)")
        g.add_argument("--idpg-mx-train-mode", action="store_true", help="compute M(x) in train mode (dropout on, the authors' code; not cached while training)")
        g.add_argument("--idpg-cache", choices=("disk", "memory", "off"), help="keep M(x) per example: on disk (default), in memory, or recompute every step")
        g.add_argument("--idpg-cache-dir", metavar="DIR", help=f"on-disk M(x) cache (default {DEFAULT_CACHE_DIR})")
        g.add_argument("--idpg-glove-vectors", metavar="PATH", help=f"GloVe text file for --idpg-input glove (default {DEFAULT_GLOVE} if present)")
        g.add_argument("--idpg-glove-bpe-dir", metavar="DIR", help="folder with GPT-2 encoder.json, to turn RoBERTa ids back into words for GloVe")
        g.add_argument("--idpg-train-backbone", action="store_true", help="train the backbone too (supplementary MNLI stage, IDPG A.4); never cached")

    @classmethod
    def build_model(cls, args, task):
        resolve_idpg_args(args)
        base_architecture(args)  # encoder sizes, for the checks below
        check_idpg_args(args, task)  # before the backbone is loaded
        return super().build_model(args, task)

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        resolve_idpg_args(args)
        d, L, t = args.encoder_embed_dim, args.encoder_layers, args.idpg_prompt_length
        self.num_inserted_tokens = t  # the task truncates inputs to --max-positions - t
        self.glove = None
        d_in = d
        if args.idpg_generator != "none" and args.idpg_input == "glove":
            self.glove = GloveSentenceEncoder(glove_path(args), Detokenizer(encoder.dictionary, args.idpg_glove_bpe_dir))
            d_in = self.glove.dim
        multi = args.idpg_depth == "multi"
        make = lambda num_biases: PromptGenerator(  # noqa: E731
            d_in, d, t, args.idpg_hidden, args.idpg_generator, args.idpg_phm_n, args.idpg_phm_a_sets,
            num_biases=num_biases, layer_bias_rank=args.idpg_layer_bias_rank, dropout=args.idpg_dropout,
            residual=args.idpg_residual, layer_norm=args.idpg_layer_norm,
        )
        if multi and args.idpg_sharing == "L":
            self.generators = nn.ModuleList([make(1) for _ in range(L)])
            self._plan = [(g, 0) for g in self.generators]
        else:
            self.generator = make(L if multi and args.idpg_sharing == "M" else 1)
            self._plan = [(self.generator, l if args.idpg_sharing == "M" else 0) for l in range(L if multi else 1)]
        self._caches = {}  # slot -> {"identity", "size", "by_tag": {tag: SentenceRepresentationCache}}
        self._backbone_digest = None

    # ------------------------------------------------------------------ freezing
    def trains_backbone_parameter(self, name):
        return self.args.idpg_train_backbone

    def max_positions(self):
        """Input tokens a model call accepts: the prompt takes t of the positions."""
        return self.args.max_positions - self.num_inserted_tokens

    # ------------------------------------------------------------------ M(x)
    @property
    def uses_sentence_representation(self):
        return self.args.idpg_generator != "none"

    def wants_sentence_cache(self):
        """Whether the task should attach caches: a generator that reads M(x), a frozen backbone."""
        return self.uses_sentence_representation and self.args.idpg_cache != "off" and not self.args.idpg_train_backbone

    def _signature(self):
        if self.glove is not None:
            return {"kind": "glove-mean (Eq. 5)", "glove_sha256": self.glove.digest(), "dim": self.glove.dim,
                    "gpt2_ids": self.glove.detokenizer.gpt2}
        if self._backbone_digest is None:
            self._backbone_digest = backbone_digest(self)
        return {"kind": "roberta final <s>, eval mode", "backbone": self._backbone_digest}

    def attach_sentence_cache(self, slot, identity, dataset):
        """Called by ``idpg_sentence_prediction`` for each loaded split (see that task)."""
        self._caches[slot] = {"identity": {"model": self._signature(), "data": identity}, "size": len(dataset), "by_tag": {}}
        if self.glove is not None:  # GloVe vectors: text processing, done here once, not in a step
            cache = self._cache(slot, "float32")
            missing = np.flatnonzero(cache.filled == 0)
            if len(missing):
                rows = [dataset[int(i)]["net_input.src_tokens"] for i in missing]
                cache.store(missing, self.glove.encode_tokens(rows))
                logger.info(f"GloVe sentence vectors of {identity['split']}: {len(missing)} computed ({cache.path or 'in memory'})")

    def _cache(self, slot, tag):
        entry = self._caches[slot]
        if tag not in entry["by_tag"]:
            root = None if self.args.idpg_cache == "memory" else (self.args.idpg_cache_dir or DEFAULT_CACHE_DIR)
            description = {**entry["identity"], "dtype": tag}
            cache = SentenceRepresentationCache(entry["size"], self._input_dim(), cache_key(description), root, description)
            logger.info(
                f"M(x) cache of {entry['identity']['data']['split']} ({tag}): {cache.path or 'in memory'}, "
                f"{cache.num_filled}/{cache.size} rows filled"
            )
            entry["by_tag"][tag] = cache
        return entry["by_tag"][tag]

    def _input_dim(self):
        return self.glove.dim if self.glove is not None else self.args.encoder_embed_dim

    @torch.no_grad()
    def compute_sentence_representation(self, src_tokens, train_mode=False):
        """M(x) [B, d_in] without cache: the frozen encoder's final ``<s>`` state of the
        unprompted input (eval mode unless ``train_mode``), or the GloVe mean (Eq. 5)."""
        like = self.encoder.sentence_encoder.embed_tokens.weight
        if self.glove is not None:
            return to_device(self.glove.encode_tokens(src_tokens.cpu()), like)
        encoder = self.encoder
        switch = encoder.training and not train_mode
        if switch:
            encoder.eval()
        try:
            features, _ = encoder.extract_features(src_tokens)
        finally:
            if switch:
                encoder.train()
        return features[:, 0]

    def sentence_representation(self, src_tokens, sentence_ids=None):
        """M(x) [B, d_in], from the cache when the batch carries ``sentence_ids`` of an attached split."""
        train_mode = self.args.idpg_mx_train_mode and self.training
        if sentence_ids is None or train_mode or not self._caches:
            return self.compute_sentence_representation(src_tokens, train_mode)
        slot, ids = split_sentence_ids(sentence_ids)
        if slot not in self._caches:
            return self.compute_sentence_representation(src_tokens)
        like = self.encoder.sentence_encoder.embed_tokens.weight
        cache = self._cache(slot, "float32" if self.glove is not None else str(like.dtype).replace("torch.", ""))
        values, filled = cache.lookup(ids.numpy())
        if filled.all():
            return to_device(values, like)
        mx = self.compute_sentence_representation(src_tokens)  # the whole batch: same shapes as later
        missing = torch.from_numpy(~filled)
        cache.store(ids[missing].numpy(), mx[missing.to(mx.device)].float().cpu().numpy())
        return mx

    # ------------------------------------------------------------------ forward
    def prompts(self, src_tokens, sentence_ids=None):
        """(P_0 [B, t, d] or [t, d], ``layer_prompts(l, x)`` or None) for ``prompted_features``."""
        per_generator = {}

        def generate(l, x):
            gen, index = self._plan[l]
            if id(gen) not in per_generator:  # dense W and biases once per forward
                per_generator[id(gen)] = (gen.weights(), gen.biases())
            weights, biases = per_generator[id(gen)]
            return gen(x, index, weights=weights, biases=biases)

        u = None
        if self.uses_sentence_representation:
            u = self._plan[0][0].prepare(self.sentence_representation(src_tokens, sentence_ids))
        layer_prompts = None
        if len(self._plan) > 1:
            if self.uses_sentence_representation and self.args.idpg_layer_input == "previous":
                layer_prompts = lambda l, x: generate(l, x[:, 0])  # noqa: E731  (<s> after layer l)
            else:
                layer_prompts = lambda l, x: generate(l, u)  # noqa: E731
        return generate(0, u), layer_prompts

    def forward(self, src_tokens, features_only=False, return_all_hiddens=False, classification_head_name=None, sentence_ids=None, **kwargs):
        """Like ``RobertaModel.forward``: (head logits | features [B, T+t, C] | LM logits, extra);
        ``extra["prompt_slots"]`` [B, T+t] marks the prompt vectors."""
        if return_all_hiddens:
            raise ValueError("roberta_idpg returns the last layer only (return_all_hiddens is not supported)")
        prompt, layer_prompts = self.prompts(src_tokens, sentence_ids)
        features, slots = prompted_features(
            self.encoder.sentence_encoder, src_tokens, prompt, self.args.prompt_position, layer_prompts
        )
        extra = {"inner_states": None, "prompt_slots": slots}
        if classification_head_name is not None:
            return self.classification_heads[classification_head_name](features), extra
        if features_only:
            return features, extra
        return self.encoder.output_layer(features), extra


@register_model_architecture("roberta_idpg", "roberta_idpg")
def roberta_idpg_architecture(args):
    """roberta-base sizes unless the --encoder-* flags say otherwise (the stand-in: 6 x 384)."""
    base_architecture(args)
    resolve_idpg_args(args)


@register_model_architecture("roberta_idpg", "roberta_idpg_base")
def roberta_idpg_base_architecture(args):
    roberta_idpg_architecture(args)


@register_model_architecture("roberta_idpg", "roberta_idpg_large")
def roberta_idpg_large_architecture(args):
    roberta_large_architecture(args)
    resolve_idpg_args(args)


# ---------------------------------------------------------------------- methods (scripts/run.sh --method)
# lr: from the paper's grid {5e-3, 1e-3, 5e-4, 1e-4} (constant, "fixed"); scripts/idpg/ sweeps it.
METHOD_DESCRIPTIONS = {
    "prompt-tuning": ("IDPG Table 1 baseline: prompt tuning, t = 5 (5,120 at roberta-large)", 5e-3),
    "prompt-tuning-134": ("IDPG Table 1 baseline: prompt tuning, t = 134 (137,216)", 5e-3),
    "p-tuning-v2": ("IDPG Table 1 baseline: P-tuning v2, per-layer additive prompts, t = 5 (122,880)", 5e-3),
    "s-idpg-phm": ("IDPG Table 1: S-IDPG-PHM, m = 256, n = 16, one A set (107,776)", 5e-3),
    "s-idpg-dnn": ("IDPG Table 1: S-IDPG-DNN, m = 256 (1,578,240)", 5e-3),
    "m-idpg-phm": ("IDPG Table 1: M-IDPG-PHM, m = 16, n = 16, previous-layer input, M version (137,232)", 5e-3),
    "m-idpg-dnn": ("IDPG Table 1: M-IDPG-DNN, m = 16, previous-layer input, M version (221,200)", 5e-3),
    "m-idpg-phm-glove": ("IDPG Table 1: M-IDPG-PHM-GloVe, GloVe M(x), n = 4 (144,704); give --idpg-glove-vectors", 5e-3),
}
COMMON_TRAIN_ARGS = ["--arch", "roberta_idpg", "--task", "idpg_sentence_prediction", "--save-trainable-only"]
for _name, (_description, _lr) in METHOD_DESCRIPTIONS.items():
    register_method(_name, COMMON_TRAIN_ARGS + ["--idpg-preset", _name], lr=_lr, scheduler="fixed", description=_description)
LOW_RANK = 2
register_method(
    "m-idpg-phm-lowrank", COMMON_TRAIN_ARGS + ["--idpg-preset", "m-idpg-phm", "--idpg-layer-bias-rank", str(LOW_RANK)],
    lr=5e-3, scheduler="fixed",
    description=f"M-IDPG-PHM with rank-{LOW_RANK} layer biases c_l = (U V)_l (issue 5, 4b; 29,758 at roberta-large)",
)
