"""``--optimizer adam_head_lr --head-lr LR``: fairseq's Adam, with the classification head at its own lr.

Why: a method's own parameters and the head it trains beside them may need very different steps. DPT
trains its prompt at lr 0.3 (DPT section 4.2, T5, where no head trains); a freshly initialised head at
that lr diverges (docs/long-prompts.md, section 4), so with one shared lr the DPT records use 5e-3.

What trains at which lr: the parameters marked ``param_group = "head"`` (fairseq's mark, which its
composite optimizer and the fp32 copies of ``--fp16 --fp16-no-flatten-grads`` read) at ``--head-lr``; the
others at ``--lr``. ``mark_head`` marks the classification head, every parameter under
``classification_heads.`` (the tasks call it on every model they build): so for a frozen-backbone method
``--lr`` is the method's own parameters' (prompt, generator, blocks), and for full fine-tuning and EFL
the encoder's (EFL's head is the reused MNLI head; it trains at ``--head-lr`` too).

Both follow the one lr schedule: fairseq's schedulers set one lr (``set_lr``), which the head takes times
``head_lr / lr``, so warmup and decay shape both alike. Parameter groups of one Adam, rather than
fairseq's ``--optimizer composite`` (one optimizer and one scheduler per group, configured through a
Hydra config of groups, not flags): the checkpoint keeps one Adam state, and with ``--head-lr`` equal to
``--lr`` training is bit-identical to ``--optimizer adam`` (the gradient norm that ``--clip-norm``
computes sums the tensors in the model's order, as there).
"""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.optim import register_optimizer
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig

from fairseq_idpg.errors import ConfigError

HEAD = "head"  # the param_group of the classification head's parameters
HEAD_PREFIX = "classification_heads."


def mark_head(model):
    """Mark the classification head's parameters (``param_group = "head"``) for ``--head-lr``."""
    for name, p in model.named_parameters():
        if name.startswith(HEAD_PREFIX):
            p.param_group = HEAD
    return model


@dataclass
class AdamHeadLrConfig(FairseqAdamConfig):
    head_lr: Optional[float] = field(
        default=None,
        metadata={"help": "learning rate of the classification head (--lr: the other trained parameters'); "
                  "the lr schedule scales both alike"},
    )  # fmt: skip


@register_optimizer("adam_head_lr", dataclass=AdamHeadLrConfig)
class AdamHeadLr(FairseqAdam):
    """Adam with two parameter groups: the method's own parameters at ``--lr``, the head at ``--head-lr``."""

    def __init__(self, cfg, params):
        params = list(params)
        if cfg.head_lr is None:
            raise ConfigError("--optimizer adam_head_lr needs --head-lr (the classification head's learning rate)")
        if not cfg.head_lr > 0:
            raise ConfigError(f"--head-lr must be > 0 (the classification head's learning rate), got {cfg.head_lr}")
        head = [p for p in params if getattr(p, "param_group", None) == HEAD]
        own = [p for p in params if getattr(p, "param_group", None) != HEAD]
        if not head:
            raise ConfigError(
                f"--head-lr: none of the {len(params)} trained tensors is the classification head's (marked by the "
                "task; with --fp16 give --fp16-no-flatten-grads: the flat fp32 copy merges them)"
            )
        if not own:
            raise ConfigError("--head-lr: only the classification head trains; give its lr as --lr alone")
        super().__init__(cfg, [{"params": own}, {"params": head, "lr": cfg.head_lr}])
        # per group, the scheduled lr's multiple it takes (the first lr of a --lr list: the schedule's peak)
        self.lr_scales = (1.0, cfg.head_lr / self.optimizer_config["lr"])
        self._params = params  # the model's order

    @property
    def params(self):
        # the model's order, as --optimizer adam holds them: the clipped gradient norm sums in it
        return iter(self._params)

    def set_lr(self, lr):
        for group, scale in zip(self.param_groups, self.lr_scales, strict=False):
            group["lr"] = lr * scale
