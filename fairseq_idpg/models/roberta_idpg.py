"""``--arch roberta_idpg``: instance-dependent prompt generation (IDPG, Wu et al., NAACL 2022) on a
frozen RoBERTa. Only the generator and the classification head train. The prompts IDPG compares
with (prompt tuning, Prompt-tuning-134, P-tuning v2) are static: ``--arch roberta_prompt``.

This model supplies the prompts (``prompted_roberta.py`` inserts them and runs the encoder):
M(x) [B, d_in] -> generator G (``modules/prompts/generator.py``, IDPG Eq. 2-4) -> P_0 [B, t, d]
inserted at ``--prompt-position``; multi-layer (M-IDPG, IDPG sections 3.2.2 and 4.5.3): after each
layer l = 1..L-1, ``x[prompt slots] += P_l`` with P_l = G(input_l) using bias c_l (M version),
the shared c (S version) or layer l's own generator (L version); input_l = M(x) (``first``, the
"layer 0" input) or the ``<s>`` state after layer l (``previous``). The head reads ``<s>``.

M(x) (``--idpg-input``): ``roberta``: the frozen backbone's final ``<s>`` state of the
*unprompted* input, without gradient, in eval mode (so that it can be cached; the authors' code
runs that pass in train mode with dropout: ``--idpg-mx-train-mode``); ``glove``: the mean GloVe
vector (IDPG Eq. 5, ``modules/prompts/glove.py``). Computed once per example and cached
(``--idpg-cache``, with ``--task idpg_sentence_prediction``: this model is a ``SentenceCacheModel``
of ``tasks/model_protocol.py``): eval-mode M(x) is a function of the frozen backbone and the
example, so a cached row equals a recomputed one.

Presets (``--idpg-preset NAME``; explicit flags win) are the method records of this architecture,
one per IDPG row of IDPG Table 1 / Table 2 (``fairseq_idpg/methods.py``; docs/idpg.md lists them
with their counts); what a preset leaves open is ``DEFAULTS``, the defaults of the option fields of
``IdpgOptions`` (each field generates its flag, ``fairseq_idpg/options.py``). The default is ``m-idpg-phm``.

The prompt length t is ``--idpg-prompt-length`` (IDPG's t = 5).
"""

import logging
import os
from dataclasses import dataclass
from typing import ClassVar, Optional

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
from fairseq_idpg.errors import ConfigError, MissingFile
from fairseq_idpg.layout import GLOVE_FILE, GPT2_BPE_DIRS
from fairseq_idpg.models.prompted_roberta import PromptedRobertaModel
from fairseq_idpg.modules.prompts import layer_steps
from fairseq_idpg.modules.prompts.detokenize import Detokenizer
from fairseq_idpg.modules.prompts.generator import KINDS, PromptGenerator
from fairseq_idpg.modules.prompts.glove import GloveSentenceEncoder, read_glove_dim
from fairseq_idpg.modules.prompts.layer_biases import INITS as BIAS_INITS
from fairseq_idpg.options import Options, option

logger = logging.getLogger(__name__)

DEFAULT_GLOVE = GLOVE_FILE
DEFAULT_CACHE_DIR = os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "fairseq_idpg", "idpg"
)
PRESET_OPTION = "idpg_preset"
DEPTHS = ("single", "multi")
SHARINGS = ("S", "M", "L")
INPUTS = ("roberta", "glove")
LAYER_INPUTS = ("first", "previous")
CACHES = ("disk", "memory", "off")


@dataclass
class IdpgOptions(Options):
    """The options of ``roberta_idpg`` (``--idpg-preset`` apart); their defaults are what a preset leaves open
    (and every option without a preset: M-IDPG-PHM's)."""

    title: ClassVar[str] = "IDPG: instance-dependent prompt generation"

    idpg_generator: str = option("phm", "generator G: dnn or phm (IDPG Eq. 4)", choices=KINDS)
    idpg_hidden: int = option(16, "generator hidden size m (16 multi, 256 single)", metavar="M", check=">= 1")
    idpg_prompt_length: int = option(5, "prompt length t (5)", metavar="T")
    idpg_phm_n: int = option(16, "PHM n (IDPG Eq. 4): 16 with RoBERTa, 4 with GloVe", metavar="N")
    idpg_phm_a_sets: int = option(2, "PHM A sets: 1 shared by W1, W2; 2 one each", choices=(1, 2))
    idpg_depth: str = option("multi", "prompts at the input only (S-IDPG) or after every layer", choices=DEPTHS)
    idpg_sharing: str = option(
        "M",
        "multi-layer generators (IDPG Figure 2): S shares W and c, M per-layer c, L per-layer W and c",
        choices=SHARINGS,
        type=str.upper,
    )
    idpg_input: str = option("roberta", "sentence encoder M(x): frozen RoBERTa <s> or mean GloVe", choices=INPUTS)
    idpg_layer_input: str = option(
        "previous", "multi-layer input: M(x) or the previous layer's <s>", choices=LAYER_INPUTS
    )
    idpg_dropout: float = option(0.1, "generator dropout on M(x) and on h (0.1)", metavar="P")
    idpg_residual: bool = option(False, "IDPG A.5.1 ablation: add M(x) to each prompt")
    idpg_layer_norm: bool = option(
        False, "IDPG A.5.1 ablation: LayerNorm the prompts (with --idpg-residual: LN(LN(M(x)) + LN(G)))"
    )
    idpg_bias_init: str = option(
        "normal",
        "start of the output biases c: normal N(0, 0.02^2) (the authors' model: init_bert_params redraws them), "
        "uniform U(-0.5, 0.5) (their encoder's own draw) or zero (S-IDPG-DNN's)",
        choices=BIAS_INITS,
    )
    idpg_layer_bias_rank: int = option(
        0, "low-rank per-layer biases c_1..c_(L-1) = U V, U: [L-1, R], V: [R, t*d] (0: full)", metavar="R"
    )
    idpg_mx_train_mode: bool = option(
        False, "compute M(x) in train mode (dropout on, the authors' code; not cached while training)"
    )
    idpg_cache: str = option("disk", "keep M(x) per example: on disk (default), in memory, off", choices=CACHES)
    idpg_cache_dir: Optional[str] = option(None, f"on-disk M(x) cache (default {DEFAULT_CACHE_DIR})", metavar="DIR")
    idpg_glove_vectors: Optional[str] = option(
        None, f"GloVe text file (default {DEFAULT_GLOVE} if present)", metavar="PATH"
    )
    idpg_glove_bpe_dir: Optional[str] = option(
        None, "folder with GPT-2 encoder.json (RoBERTa ids -> words)", metavar="DIR"
    )
    idpg_train_backbone: bool = option(
        False, "train the backbone too (supplementary MNLI stage, IDPG appendix A.4); never cached"
    )


DEFAULTS = IdpgOptions.defaults()


def glove_path(args):
    """The GloVe file to use: ``--idpg-glove-vectors``, else data/glove/glove.6B.300d.txt if present."""
    if args.idpg_glove_vectors:
        return args.idpg_glove_vectors
    if DEFAULT_GLOVE.is_file():
        return str(DEFAULT_GLOVE)
    raise MissingFile(
        "--idpg-input glove needs GloVe vectors: give --idpg-glove-vectors PATH "
        "(glove.6B.300d.txt, from scripts/download.sh glove)"
    )


def generator_input_dim(args):
    return read_glove_dim(glove_path(args)) if args.idpg_input == "glove" else args.encoder_embed_dim


@register_model("roberta_idpg")
class RobertaIdpgModel(PromptedRobertaModel):
    """IDPG's generated prompts on the prompted RoBERTa; see the module docstring."""

    PROMPT_LENGTH = "idpg_prompt_length"
    OPTIONS, DEFAULTS = IdpgOptions, DEFAULTS
    PRESET_OPTION, DEFAULT_PRESET = PRESET_OPTION, "m-idpg-phm"
    RUNTIME_OPTIONS = ("idpg_cache", "idpg_cache_dir")  # where M(x) is kept, not what it is

    @staticmethod
    def add_args(parser):
        PromptedRobertaModel.add_args(parser)
        g = parser.add_argument_group(IdpgOptions.title)
        g.add_argument(
            "--idpg-preset",
            choices=RobertaIdpgModel.presets(),
            help="an IDPG row of IDPG Table 1/2 (fairseq_idpg/methods.py; default m-idpg-phm)",
        )
        IdpgOptions.add_args(parser, g)

    # ------------------------------------------------------------------ configuration
    @classmethod
    def configure(cls, args):
        super().configure(args)
        args.idpg_sharing = str(args.idpg_sharing).upper()

    @classmethod
    def check_args(cls, args, task):
        """Build-time checks of several options (each option's own: ``IdpgOptions``): one clear line naming the
        flag and what would be valid."""
        t, d = args.idpg_prompt_length, args.encoder_embed_dim
        multi = args.idpg_depth == "multi"
        if (args.idpg_residual or args.idpg_layer_norm) and multi:
            raise ConfigError(
                "--idpg-residual / --idpg-layer-norm are the single-layer generator ablations of IDPG "
                "appendix A.5.1: use them with --idpg-depth single"
            )
        d_in = generator_input_dim(args)
        if args.idpg_input == "glove" and multi and args.idpg_layer_input == "previous":
            raise ConfigError(
                f"--idpg-layer-input previous feeds the {d}-dim <s> state to a generator built for "
                f"GloVe's {d_in}-dim vectors: use --idpg-layer-input first with --idpg-input glove"
            )
        if args.idpg_residual and d_in != d:
            raise ConfigError(f"--idpg-residual adds M(x) ({d_in}-dim) to {d}-dim prompts: use --idpg-input roberta")
        if args.idpg_generator == "phm":
            n, m = args.idpg_phm_n, args.idpg_hidden
            if n < 1 or d_in % n or m % n or (t * d) % n:
                valid = [k for k in range(1, min(d_in, m) + 1) if d_in % k == 0 and m % k == 0 and (t * d) % k == 0]
                raise ConfigError(
                    f"--idpg-phm-n {n} must divide the generator input size {d_in} ({args.idpg_input}), "
                    f"--idpg-hidden {m} and t*d = {t}*{d} = {t * d}; valid here: {', '.join(map(str, valid))}"
                )
        rank = args.idpg_layer_bias_rank
        if rank:
            per_layer = args.encoder_layers - 1
            if not (multi and args.idpg_sharing == "M"):
                raise ConfigError(
                    f"--idpg-layer-bias-rank {rank} factorises the per-layer biases c_1..c_(L-1) of the M version: "
                    f"use it with --idpg-depth multi --idpg-sharing M"
                )
            if not 0 < rank < per_layer:
                raise ConfigError(
                    f"--idpg-layer-bias-rank must be between 1 and {per_layer - 1} (the {per_layer} layer biases "
                    f"are cheaper stored in full from rank {per_layer}), got {rank}"
                )

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        d, L, t = args.encoder_embed_dim, args.encoder_layers, args.idpg_prompt_length
        self.glove = None
        d_in = d
        if args.idpg_input == "glove":
            bpe_dirs = [args.idpg_glove_bpe_dir] if args.idpg_glove_bpe_dir else GPT2_BPE_DIRS
            detokenizer = Detokenizer(encoder.dictionary, bpe_dirs)
            self.glove = GloveSentenceEncoder(glove_path(args), detokenizer)
            d_in = self.glove.dim
        multi = args.idpg_depth == "multi"

        def make(num_biases):
            return PromptGenerator(
                d_in, d, t, args.idpg_hidden, args.idpg_generator, args.idpg_phm_n, args.idpg_phm_a_sets,
                num_biases=num_biases, layer_bias_rank=args.idpg_layer_bias_rank, dropout=args.idpg_dropout,
                residual=args.idpg_residual, layer_norm=args.idpg_layer_norm, bias_init=args.idpg_bias_init,
            )  # fmt: skip

        # _plan[l] = (generator, bias index) of the prompt of layer l (0: the inserted one)
        if multi and args.idpg_sharing == "L":
            self.generators = nn.ModuleList([make(1) for _ in range(L)])
            self._plan = [(g, 0) for g in self.generators]
        else:
            self.generator = make(L if multi and args.idpg_sharing == "M" else 1)
            self._plan = [(self.generator, l if args.idpg_sharing == "M" else 0) for l in range(L if multi else 1)]
        self._caches = {}  # slot -> {"identity", "size", "by_tag": {tag: SentenceRepresentationCache}}
        self._backbone_digest = None

    def trains_backbone_parameter(self, name):
        return self.args.idpg_train_backbone

    # ------------------------------------------------------------------ M(x) and its cache (SentenceCacheModel)
    def wants_sentence_cache(self):
        """Whether the task should attach caches: a frozen backbone and a cache asked for."""
        return self.args.idpg_cache != "off" and not self.args.idpg_train_backbone

    def attach_sentence_cache(self, slot, identity, dataset):
        """Called by ``idpg_sentence_prediction`` for each loaded split (``tasks/model_protocol.py``)."""
        self._caches[slot] = {
            "identity": {"model": self._signature(), "data": identity},
            "size": len(dataset),
            "by_tag": {},
        }
        if self.glove is not None:  # GloVe vectors: text processing, done here once, not in a step
            cache = self._cache(slot, "float32")
            missing = np.flatnonzero(cache.filled == 0)
            if len(missing):
                rows = [dataset[int(i)]["net_input.src_tokens"] for i in missing]
                cache.store(missing, self.glove.encode_tokens(rows))
                where = cache.path or "in memory"
                logger.info(f"GloVe sentence vectors of {identity['split']}: {len(missing)} computed ({where})")

    def _signature(self):
        """What M(x) depends on besides the data: the encoder (frozen backbone or GloVe file)."""
        if self.glove is not None:
            return {
                "kind": "glove-mean (Eq. 5)",
                "glove_sha256": self.glove.digest(),
                "dim": self.glove.dim,
                "gpt2_ids": self.glove.detokenizer.gpt2,
            }
        if self._backbone_digest is None:  # hashing every frozen tensor: once per model
            self._backbone_digest = self.backbone_digest()
        return {"kind": "roberta final <s>, eval mode", "backbone": self._backbone_digest}

    def _cache(self, slot, tag):
        entry = self._caches[slot]
        if tag not in entry["by_tag"]:
            root = None if self.args.idpg_cache == "memory" else (self.args.idpg_cache_dir or DEFAULT_CACHE_DIR)
            description = {**entry["identity"], "dtype": tag}
            cache = SentenceRepresentationCache(
                entry["size"], self._input_dim(), cache_key(description), root, description
            )
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
        unprompted input (eval mode unless ``train_mode``), or the GloVe mean (IDPG Eq. 5)."""
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

    # ------------------------------------------------------------------ the prompts
    def fused_inputs(self, src_tokens, sentence_ids=None, **net_input):
        """M(x) of every fused member's rows at once (``fairseq_idpg/fused``): frozen, so the same for all."""
        return {"sentence_representation": self.sentence_representation(src_tokens, sentence_ids)}

    # M-IDPG with one generator at position 0 under plain autograd: the generator's weight gradients once per
    # backward over every layer's rows (``layer_steps``); False: the generic operators (the reference)
    batched_generator_gradients = True

    def _batched_generator_gradients(self):
        """Whether ``layer_steps.GeneratedPrompts`` makes this forward's prompts: multi-layer, one generator (S, M
        versions), position 0, plain autograd or one ``vmap`` (fused members; ``layer_steps.applies``)."""
        return (
            self.batched_generator_gradients
            and len(self._plan) > 1
            and hasattr(self, "generator")
            and self.prompt_position == 0
            and layer_steps.applies()
        )

    def prompts(self, src_tokens, sentence_ids=None, sentence_representation=None, **net_input):
        """(P_0 [B, t, d], ``layer_prompts(l, x)`` for M-IDPG or None); ``sentence_representation``: M(x) when
        the caller has it (``fused_inputs``)."""
        per_generator = {}

        def generate(l, x):
            gen, index = self._plan[l]
            if id(gen) not in per_generator:  # dense W and biases once per forward
                # unbound once: a layer's c_l is then a view whose gradient is one stack of all layers', not a
                # full-size zero gradient of every bias per layer (what indexing the [K, t*d] tensor makes)
                per_generator[id(gen)] = (gen.weights(), gen.biases().unbind(0))
            weights, biases = per_generator[id(gen)]
            return gen(x, index, weights=weights, biases=biases)

        mx = sentence_representation
        u = self._plan[0][0].prepare(self.sentence_representation(src_tokens, sentence_ids) if mx is None else mx)
        if self._batched_generator_gradients():
            steps = layer_steps.GeneratedPrompts(
                self.generator, [index for _, index in self._plan], u, src_tokens.size(1) + self.num_inserted_tokens,
                previous=self.args.idpg_layer_input == "previous",
            )  # fmt: skip
            return steps.first(), steps
        layer_prompts = None
        if len(self._plan) > 1:
            if self.args.idpg_layer_input == "previous":
                layer_prompts = lambda l, x: generate(l, x[:, 0])  # <s> after layer l
            else:
                layer_prompts = lambda l, x: generate(l, u)
        return generate(0, u), layer_prompts


@register_model_architecture("roberta_idpg", "roberta_idpg")
def roberta_idpg_architecture(args):
    """roberta-base sizes unless the --encoder-* flags say otherwise (the stand-in: 6 x 384)."""
    base_architecture(args)
    RobertaIdpgModel.configure(args)


@register_model_architecture("roberta_idpg", "roberta_idpg_base")
def roberta_idpg_base_architecture(args):
    roberta_idpg_architecture(args)


@register_model_architecture("roberta_idpg", "roberta_idpg_large")
def roberta_idpg_large_architecture(args):
    roberta_large_architecture(args)
    RobertaIdpgModel.configure(args)
