"""Build a model as fairseq-train does, without fairseq-train: for scripts, counts and tests.

    model = build_model("roberta_idpg", dictionary, backbone="model.pt", idpg_preset="s-idpg-phm")
    model = build_method(METHODS["lora"], dictionary, meta=True, **ROBERTA_LARGE)   # for counts

The model's flags are parsed with nothing given (absent, as argparse leaves them), the options
(attribute names) are set, the architecture function fills the rest (roberta-base sizes unless
the ``--encoder-*`` options say otherwise), and the model class builds itself against a minimal
task: its dictionary and, if given, the prepared data's ``TaskInfo`` (``data/task_info.py``).
``meta=True`` builds on the meta device: shapes without memory or values, for parameter counts.
"""

import argparse
import contextlib
import types
import warnings
from unittest import mock

import torch

ROBERTA_BASE = dict(encoder_layers=12, encoder_embed_dim=768, encoder_ffn_embed_dim=3072, encoder_attention_heads=12)
ROBERTA_LARGE = dict(encoder_layers=24, encoder_embed_dim=1024, encoder_ffn_embed_dim=4096, encoder_attention_heads=16)
STANDIN = dict(encoder_layers=6, encoder_embed_dim=384, encoder_ffn_embed_dim=1536, encoder_attention_heads=12)


def stub_task(dictionary, info=None, data=None):
    """What a model's ``build_model`` reads of a task: its dictionary and the data's TaskInfo."""
    return types.SimpleNamespace(
        source_dictionary=dictionary, info=info, cfg=types.SimpleNamespace(data=str(data) if data else None)
    )


def build_model(arch, dictionary, info=None, meta=False, **options):
    """``--arch ARCH`` built with ``options`` (attribute names) on ``dictionary``; see the module docstring."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    import fairseq_idpg  # noqa: F401  (registers the architectures)

    model_cls = ARCH_MODEL_REGISTRY[arch]
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    model_cls.add_args(parser)
    args = parser.parse_args([])
    args.arch = arch
    args.max_positions = 512  # RoBERTa's; the task sets it under fairseq-train
    for key, value in options.items():
        setattr(args, key, value)
    ARCH_CONFIG_REGISTRY[arch](args)
    with on_meta_device() if meta else contextlib.nullcontext():
        return model_cls.build_model(args, stub_task(dictionary, info))


class _NoFillsOnMeta(torch.overrides.TorchFunctionMode):
    """In-place random fills of meta tensors skipped: a meta tensor has no values to fill, and torch implements
    these (normal_, the clamp_ and erfinv_ of a truncated normal, ...) for meta in Python under a dynamo guard,
    whose first call imports torch._dynamo (4-7 s of CPU in every process that only counts or checks)."""

    FILLS = {getattr(torch.Tensor, name) for name in ("normal_", "uniform_", "erfinv_", "clamp_", "clamp_min_",
             "clamp_max_", "exponential_", "log_normal_", "cauchy_", "geometric_", "random_")}  # fmt: skip
    # torch.nn.init's reach the mode as themselves (the tensor methods they call then bypass it)
    FILLS |= {getattr(torch.nn.init, name) for name in ("normal_", "uniform_", "trunc_normal_", "kaiming_uniform_",
              "kaiming_normal_", "xavier_uniform_", "xavier_normal_")}  # fmt: skip

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        filled = args[0] if args else kwargs.get("tensor", kwargs.get("input"))  # torch.nn.init's pass it by name
        if func in self.FILLS and isinstance(filled, torch.Tensor) and filled.is_meta:
            return filled
        return func(*args, **kwargs)


@contextlib.contextmanager
def on_meta_device():
    """Models built inside have shapes without memory or values (counts; fairseq-train's checks before it runs)."""
    with torch.device("meta"), _NoFillsOnMeta(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "for .*: copying from a non-meta parameter")  # a backbone: shapes only
        # fairseq's init_bert_params copies through the CPU, which meta tensors cannot; their values change no count
        with mock.patch("fairseq.models.roberta.model.init_bert_params", lambda module: None):
            yield


def build_method(method, dictionary, info=None, meta=False, **options):
    """The model of a method record (``fairseq_idpg.methods``); ``options`` override its own."""
    return build_model(method.arch, dictionary, info=info, meta=meta, **{**method.options, **options})


def count_trainable(arch_or_method, size, **options):
    """Trained parameters (classification head excluded, as the papers count) at ``size``
    (``ROBERTA_LARGE``, ...), built on the meta device with an empty vocabulary (the embeddings
    are frozen, so the vocabulary changes no count)."""
    from fairseq.data import Dictionary

    if isinstance(arch_or_method, str):
        model = build_model(arch_or_method, Dictionary(), meta=True, **size, **options)
    else:
        model = build_method(arch_or_method, Dictionary(), meta=True, **size, **options)
    return model.num_trainable_parameters()
