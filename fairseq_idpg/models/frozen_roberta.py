"""RoBERTa with a frozen pretrained backbone: the base of every parameter-efficient model.

Every backbone parameter (embeddings, embedding LayerNorm, all layers, the LM head) is frozen;
the classification head and the method's own tensors train (IDPG section 3, DPT section 2,
inducer-tuning section 5). Subclasses (``prompted_roberta`` and its prompt models,
``roberta_blocks``) add their modules in ``__init__`` after calling ``super().__init__``;
whatever they add trains. The task-model protocol (``tasks/model_protocol.py``): no inserted
tokens unless a subclass says so.

- ``--backbone PATH``: the fairseq RoBERTa checkpoint (``model.pt`` of roberta.large, of the
  stand-in, ...) loaded into the encoder when the model is built. The path is kept, as given,
  in the checkpoint's cfg, so fairseq-validate and ``from_pretrained`` rebuild the same
  backbone; where it has moved, they take the new location as an override of that option
  (``--model-overrides "{'backbone': PATH}"``, ``from_pretrained(..., backbone=PATH)``). A
  missing file, or one that is not a fairseq checkpoint, fails with one line saying so.
  (``--restore-file`` of a pretrained checkpoint also works: the method's tensors missing
  from it keep their initialisation.)
- Frozen means absent from the optimizer: fairseq's trainer optimizes only tensors with
  ``requires_grad`` (``Trainer._build_optimizer``), which frozen ones lack.
- ``--save-trainable-only``: checkpoints hold the trained tensors (method + head) and a
  fingerprint of the backbone (per-tensor element count and sum of squares of the values
  rounded to fp16, in float64; close under fp16/bf16 rounding, far apart for another
  backbone). Loading one into a model whose backbone does not match is refused with the
  reason. The same fingerprint, rounded to 10 digits and hashed, is ``backbone_digest``: the
  key of caches computed from the frozen weights (IDPG's M(x)). The trained tensors are kept in
  their training form, with fairseq's optimizer and lr-scheduler state beside them, so a run
  resumes from ``checkpoint_last.pt``; ``export_checkpoint`` writes the form to share or deploy
  (``stored_state_dict``: prefix tuning's 2 L l d prefixes instead of its MLP; no optimizer state).
- The frozen layers' GELU is ``torch.nn.functional.gelu`` in the compute dtype (``compute_dtype_gelu``):
  fairseq's casts its input to fp32 and the result back, four casts per layer and step under fp16/bf16
  (each a kernel launch on a GPU), where torch's own half-precision GELU already computes in fp32 inside
  the kernel. fp32: the same function, the same values.
- The encoder runs its layers through ``modules/frozen_encoder.encode_layers`` (``FrozenRobertaEncoder``), as the
  prompt models do: fairseq's computation, and a model that ``torch.func.vmap`` can run over stacked members.
- ``--compile-layers`` (``--compile-backend NAME``, default inductor): each encoder layer's ``forward`` (with the
  method's blocks inside it) is ``torch.compile``d when the model is built (``compile_layers``): the bound
  method is replaced, not the module, so state-dict names stay (no ``_orig_mod.``) and a checkpoint loads with
  or without the flag. Compiled with ``dynamic=True``: batches differ in length and size at nearly every step,
  and one graph over symbolic B and T serves them all (a static first graph would be compiled again at the
  second shape anyway). A runtime option: not part of a run's identity (``COMPILE_OPTIONS``).
"""

import argparse
import itertools
import logging
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from fairseq.models.roberta import RobertaModel
from fairseq.models.roberta.model import RobertaEncoder
from fairseq.utils import get_activation_fn

from fairseq_idpg.data.sentence_representation_cache import cache_key
from fairseq_idpg.errors import BackboneMismatch, BackboneNotFound, ConfigError
from fairseq_idpg.modules.frozen_encoder import encode_layers

logger = logging.getLogger(__name__)

FINGERPRINT_KEY = "_frozen_backbone_fingerprint"
FINGERPRINT_RTOL = 5e-3  # bf16 rounding moves a sum of squares by ~1e-4; another backbone by far more
# how to point a trained checkpoint at its backbone, from each entry point
RELOCATE = (
    "a trained checkpoint names the backbone it was trained on: give its location with "
    "--model-overrides \"{'backbone': 'PATH'}\" (fairseq-validate), backbone='PATH' (RobertaModel.from_pretrained) "
    "or --backbone PATH (fairseq-train)"
)


def read_backbone(path):
    """The weights (``state["model"]``) of the fairseq checkpoint at ``path``; anything else fails
    with one line naming ``--backbone``, the file and how to give the right one."""
    file = Path(path)
    if not file.exists():
        raise BackboneNotFound(f"--backbone {path}: no such file; {RELOCATE}")
    if file.is_dir():
        inside = file / "model.pt"
        hint = f"did you mean {inside}?" if inside.is_file() else RELOCATE
        raise ConfigError(f"--backbone {path}: is a folder, not a fairseq checkpoint file; {hint}")
    try:
        state = load_checkpoint_file(file)
    except Exception as e:  # unpickling, zip and EOF errors of a file that is not a (whole) checkpoint
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"--backbone {path}: not a fairseq checkpoint (torch.load: {reason}); {RELOCATE}") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        held = f"a dict of {', '.join(map(str, list(state)[:4]))}" if isinstance(state, dict) else type(state).__name__
        raise ConfigError(
            f"--backbone {path}: not a fairseq checkpoint (it holds {held}, no 'model' weights); {RELOCATE}"
        )
    return state["model"]


def load_checkpoint_file(file):
    """A fairseq checkpoint file read on the CPU (memory-mapped where it can be)."""
    try:  # memory-mapped: the frozen weights are copied into the model once
        return torch.load(file, map_location="cpu", weights_only=False, mmap=True)
    except RuntimeError:  # legacy (non-zip) serialization cannot be memory-mapped
        return torch.load(file, map_location="cpu", weights_only=False)


def compute_dtype_gelu(layers):
    """Give ``layers`` (fairseq encoder layers) that use fairseq's GELU torch's, in their compute dtype (module
    docstring); other activations stay."""
    fairseq_gelu = get_activation_fn("gelu")
    for layer in layers:
        if getattr(layer, "activation_fn", None) is fairseq_gelu:
            layer.activation_fn = F.gelu


COMPILE_OPTIONS = ("compile_layers", "compile_backend")  # how the layers run, not what they compute


def compile_layers(layers, backend="inductor"):
    """``torch.compile`` each of ``layers``' ``forward`` (module docstring): an instance attribute over the
    class's method, so the modules, their names and their state dicts are untouched. The class's function is
    compiled and bound to the layer, so that a copy of the model (``copy.deepcopy``: fairseq's EMA) runs its own
    layers. Same-shaped layers share one compiled graph (dynamo inlines the modules: their tensors are the
    graph's inputs)."""
    compiled = {}
    for layer in layers:
        if hasattr(layer.forward, "_torchdynamo_orig_callable"):  # not twice (a model built again)
            continue
        kind = type(layer)
        if kind not in compiled:
            compiled[kind] = torch.compile(kind.forward, backend=backend, dynamic=True)
        layer.forward = types.MethodType(compiled[kind], layer)


def export_checkpoint(src, dst):
    """Write ``dst``: the fairseq checkpoint ``src`` to share or deploy. The trained tensors in
    their stored form (the model class's ``stored_state_dict``: prefix tuning's prefixes instead of
    its MLP), the backbone fingerprint, the cfg (and so the backbone's path); no optimizer state, so
    fairseq-validate and ``from_pretrained`` load it, and training on from it needs
    ``--reset-optimizer``. Returns the number of values in its model state. ``dst`` is written atomically and
    is never ``src`` (nor the backbone); a damaged or wrong ``src`` is one line (``fairseq_idpg.files``)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_idpg  # noqa: F401  (registers the architectures)
    from fairseq_idpg.files import check_output_file, read_checkpoint, save_torch

    check_output_file(dst, [src], overwrite=True)  # never over its input
    state = read_checkpoint(src)
    cfg = state.get("cfg")
    model_cfg = cfg["model"] if cfg is not None else state["args"]
    get = model_cfg.get if hasattr(model_cfg, "get") else vars(model_cfg).get  # dict or Namespace
    arch = get("arch") or get("_name")
    stored = getattr(ARCH_MODEL_REGISTRY.get(arch), "stored_state_dict", None)
    if stored is not None:
        state["model"] = stored(state["model"])
    state["last_optimizer_state"] = None
    check_output_file(dst, [src, get("backbone")], overwrite=True)
    save_torch(state, dst)
    return sum(v.numel() for k, v in state["model"].items() if k != FINGERPRINT_KEY)


class FrozenRobertaEncoder(RobertaEncoder):
    """RoBERTa's encoder (the same modules and names) with its layers run by ``encode_layers``."""

    def extract_features(self, src_tokens, return_all_hiddens=False, **kwargs):
        embeddings = kwargs.get("token_embeddings")
        features, states = encode_layers(self.sentence_encoder, src_tokens, embeddings, all_hiddens=return_all_hiddens)
        return features, {"inner_states": states if return_all_hiddens else None}


def _own_storage(state):
    """``state`` with every tensor that is a slice of a larger storage copied to its own: a fused group's members
    train slices of the group's stacked tensors (``fused/group.py``), and torch.save writes a view's whole storage
    (every member's values in each member's checkpoint)."""
    return type(state)(
        (k, v.clone() if torch.is_tensor(v) and v.untyped_storage().nbytes() > v.numel() * v.element_size() else v)
        for k, v in state.items()
    )


class FrozenBackboneRobertaModel(RobertaModel):
    """``RobertaModel`` whose original parameters are frozen (see the module docstring)."""

    num_inserted_tokens = 0  # positions the model inserts into each input (tasks/model_protocol.py)
    RUNTIME_OPTIONS = ()  # options that change how, not what, the model computes: not part of a run's identity

    @classmethod
    def resolve_settings(cls, args):
        """Fill ``args``'s model settings left unset (the architecture's preset, then its defaults). None here."""

    @classmethod
    def resolved_options(cls, options):
        """``options`` with every setting the architecture fills (its preset, then its defaults), sorted: each option
        a flag can set on the model (``fairseq_idpg/run/identity.py`` reads such flags among a run's extra ones)."""
        args = argparse.Namespace(**options)
        cls.resolve_settings(args)
        return dict(sorted(vars(args).items()))

    @classmethod
    def runtime_options(cls):
        """The options that change how, not what, the model computes: no part of a run's identity."""
        return {*cls.RUNTIME_OPTIONS, *COMPILE_OPTIONS}

    @classmethod
    def model_settings(cls, options):
        """The settings a method with these ``options`` is built with (sorted), minus ``RUNTIME_OPTIONS``: what a
        run's identity records of its model (config.json's ``method.settings``; ``fairseq_idpg/run/identity.py``)."""
        runtime = cls.runtime_options()
        return {k: v for k, v in cls.resolved_options(options).items() if k not in runtime}

    def __init__(self, args, encoder):
        if type(encoder) is RobertaEncoder:
            encoder.__class__ = FrozenRobertaEncoder  # in place: the same modules, state-dict names and settings
        super().__init__(args, encoder)
        # the backbone = every tensor the stock model has (tied ones under each name, and
        # buffers); whatever subclasses add later trains
        self.backbone_names = frozenset(name for name, _ in self._named_tensors())
        compute_dtype_gelu(encoder.sentence_encoder.layers)

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        group = parser.add_argument_group("Frozen backbone")
        group.add_argument(
            "--backbone",
            metavar="PATH",
            help="pretrained fairseq RoBERTa checkpoint loaded into the frozen encoder at build time",
        )
        group.add_argument(
            "--save-trainable-only",
            action="store_true",
            help="checkpoints hold only the trained tensors (+ a backbone fingerprint)",
        )
        group.add_argument(
            "--compile-layers",
            action="store_true",
            help="torch.compile each frozen encoder layer's forward (with the method's blocks in it), dynamic "
            "shapes: fewer kernel launches on a GPU, at a compile at the start; the same results and checkpoints",
        )
        group.add_argument(
            "--compile-backend",
            metavar="NAME",
            default="inductor",
            help="torch.compile backend of --compile-layers (default inductor; aot_eager: no code generation)",
        )

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        if getattr(args, "backbone", None):
            model.load_backbone(args.backbone)
        model.start_from_backbone()
        model.freeze_backbone()
        if getattr(args, "compile_layers", False):
            backend = getattr(args, "compile_backend", None) or "inductor"
            compile_layers(model.encoder.sentence_encoder.layers, backend)
            logger.info(f"--compile-layers: the encoder's layers are compiled by torch.compile (backend {backend})")
        logger.info(model.parameter_summary())
        return model

    def start_from_backbone(self):
        """Start the method's tensors that are computed from the frozen weights (DoRA's magnitude, PiSSA's
        factors), once the backbone is loaded; nothing here."""

    # ------------------------------------------------------------------ freezing
    def trains_backbone_parameter(self, name):
        """Whether a backbone parameter trains (False; BitFit-style methods override)."""
        return False

    def _named_tensors(self):
        return itertools.chain(self.named_parameters(remove_duplicate=False), self.named_buffers())

    def freeze_backbone(self):
        for name, p in self.named_parameters(remove_duplicate=False):
            if name in self.backbone_names:
                p.requires_grad = self.trains_backbone_parameter(name)

    def frozen_names(self):
        """Names of the frozen backbone tensors (a tied tensor under each of its names)."""
        return {n for n, t in self._named_tensors() if n in self.backbone_names and not t.requires_grad}

    def num_trainable_parameters(self, include_heads=False):
        """Trained tensor elements, by default without the classification head (as the papers count)."""
        return sum(
            p.numel()
            for n, p in self.named_parameters()
            if p.requires_grad and (include_heads or not n.startswith("classification_heads."))
        )

    def parameter_summary(self):
        """The trained and total parameters, as PEFT's ``print_trainable_parameters`` says them (the
        trained ones as the papers count them: classification head excluded; every run logs it when
        its model is built, before fairseq adds the head)."""
        trained = self.num_trainable_parameters()
        total = sum(p.numel() for p in self.parameters())
        return f"trainable params: {trained:,} || all params: {total:,} || trainable%: {100 * trained / total:.4f}"

    # ------------------------------------------------------------------ backbone loading
    def load_backbone(self, path):
        weights = dict(read_backbone(path))
        self.upgrade_state_dict_named(weights, "")  # old "decoder." names, etc.
        weights = {k: v for k, v in weights.items() if not k.startswith("classification_heads.")}
        own = dict(self.state_dict(full=True))
        missing = sorted(k for k in own if k in self.backbone_names and k not in weights)
        unexpected = sorted(k for k in weights if k not in own)
        mismatched = sorted(k for k in weights if k in own and weights[k].shape != own[k].shape)
        if missing or unexpected or mismatched:
            problem = (
                f"{len(missing)} missing (e.g. {missing[0]})"
                if missing
                else f"{len(unexpected)} unexpected (e.g. {unexpected[0]})"
                if unexpected
                else f"shape of {mismatched[0]}: {tuple(weights[mismatched[0]].shape)} in the file, "
                f"{tuple(own[mismatched[0]].shape)} in the model"
            )
            raise ConfigError(
                f"--backbone {path}: does not fit this architecture ({problem}); give the encoder flags of "
                f"that checkpoint (--encoder-layers, --encoder-embed-dim, ...), or {RELOCATE}"
            )
        own.update(weights)
        torch.nn.Module.load_state_dict(self, own, strict=True)
        logger.info(f"loaded frozen backbone from {path}")

    # ------------------------------------------------------------------ checkpoints
    @classmethod
    def stored_state_dict(cls, state):
        """The form of a checkpoint's model ``state`` to share (``export_checkpoint``); subclasses
        whose training form is larger than what they store override it (prefix tuning)."""
        return state

    def _frozen_parameters(self):
        frozen = self.frozen_names()
        return [(n, p) for n, p in sorted(self.named_parameters()) if n in frozen]

    def backbone_fingerprint(self):
        """[N, 2] float64: element count and sum of squares (values rounded to fp16, so the fp32
        and fp16 copies of one backbone agree) of each frozen tensor, in name order."""
        rows = [
            [float(p.numel()), p.detach().half().double().pow(2).sum().item()] for _, p in self._frozen_parameters()
        ]
        return torch.tensor(rows, dtype=torch.float64).reshape(-1, 2)

    def backbone_digest(self):
        """Hash of the frozen weights for cache keys: names, shapes and the fingerprint's sums to
        10 significant digits (so summation order does not matter)."""
        sums = self.backbone_fingerprint()[:, 1].tolist()
        rows = [
            [n, list(p.shape), float(f"{s:.10g}")] for (n, p), s in zip(self._frozen_parameters(), sums, strict=False)
        ]
        return cache_key(rows)

    def state_dict(self, *args, full=False, **kwargs):
        state = super().state_dict(*args, **kwargs)
        if kwargs.get("prefix", ""):
            return state
        state = _own_storage(state)
        if full or not getattr(self.args, "save_trainable_only", False):
            return state
        frozen = self.frozen_names()
        compact = type(state)((k, v) for k, v in state.items() if k not in frozen)
        compact[FINGERPRINT_KEY] = self.backbone_fingerprint()
        return compact

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        state_dict = dict(state_dict)
        fingerprint = state_dict.pop(FINGERPRINT_KEY, None)
        if fingerprint is not None:
            self.check_backbone(fingerprint)
        own = self.state_dict(full=True)
        missing = [k for k in own if k not in state_dict]
        if missing:
            # compact checkpoints lack the frozen backbone; pretrained ones lack the method
            allowed = self.frozen_names() if fingerprint is not None else set(own) - self.backbone_names
            not_allowed = [k for k in missing if k not in allowed and not k.startswith("classification_heads.")]
            if strict and not_allowed:
                raise RuntimeError(f"checkpoint lacks {len(not_allowed)} trained tensor(s), e.g. {not_allowed[0]}")
            for k in missing:
                state_dict[k] = own[k]
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    def check_backbone(self, saved):
        current = self.backbone_fingerprint()
        backbone = getattr(self.args, "backbone", None) or "the one built (no --backbone given)"
        if saved.shape != current.shape or not torch.equal(saved[:, 0], current[:, 0]):
            raise BackboneMismatch(
                f"checkpoint was trained on another backbone: it froze {saved.shape[0]} tensors "
                f"({int(saved[:, 0].sum()):,} values), this model's backbone {backbone} has "
                f"{current.shape[0]} ({int(current[:, 0].sum()):,}); {RELOCATE}"
            )
        rel = ((saved[:, 1] - current[:, 1]).abs() / current[:, 1].abs().clamp_min(1e-12)).max().item()
        if rel > FINGERPRINT_RTOL:
            raise BackboneMismatch(
                f"checkpoint was trained on another backbone: the frozen weights of {backbone} differ "
                f"from those it was trained with (largest relative change of a tensor's sum of squares "
                f"{rel:.2e} > {FINGERPRINT_RTOL}); {RELOCATE}"
            )
