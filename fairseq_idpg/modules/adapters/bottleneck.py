"""``BottleneckAdapter``: the Houlsby adapter and He et al. 2021's parallel FFN adapter.

The module computes only the adapter's *contribution* f(x) ([..., d] -> [..., d]); where it is
added (after a sublayer, or in parallel with the FFN) is the layer's business
(``adapted_layer.AdaptedEncoderLayer``):

    f(x) = s * (W_up Dropout(act(W_down x + b_d)) + b_u)      W_down: [r, d], W_up: [d, r]

2 d r + r + d parameters. ``init="bert"`` (the Houlsby adapter's default): weights ~ N(0, 0.02^2),
biases 0: where the IDPG authors' adapter baseline really starts (their adapter's own N(0, 1e-6^2) is
redrawn by the ``init_bert_params`` their RobertaModel applies to the whole model), and AdapterHub's
default (``init_weights="bert"``). ``init="houlsby"``: weights ~ 0.01 * fmod(N(0, 1), 2) (Houlsby et al.
2019 section 3.6: N(0, 1e-2) truncated at two standard deviations), biases 0. Either way f is close to
0 and the layer close to the frozen one. ``init="lora"`` (the parallel FFN adapter of MAM adapters
and MAM inducer-tuning, inducer-tuning section 5.2; the authors' ``ffn_adapter_init_option=lora``):
W_down kaiming-uniform (a = sqrt(5)), W_up and both biases 0, so f = 0 exactly at the start.
act is ReLU by default, as in the inducer authors' ``Adapter_Layer`` (the code behind the inducer paper's
adapter baselines), or exact GELU (``activation="gelu"``), as the IDPG authors' Houlsby adapter
(``nn.Sequential(Linear(d, r), nn.GELU(), Linear(r, d))`` in their encoder), behind IDPG Table 1's Adapter row.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq_idpg.errors import ConfigError

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}  # F.gelu: exact (erf), as nn.GELU()


@torch.no_grad()
def truncated_normal_(tensor, std):
    """``std * fmod(N(0, 1), 2)``: a Gaussian truncated (folded) at two standard deviations."""
    if tensor.is_meta:  # no values to draw (models/build.py's meta builds: counts, checks)
        return tensor
    tensor.copy_(torch.fmod(torch.randn_like(tensor), 2.0) * std)
    return tensor


def check_bottleneck(flag, bottleneck, dim):
    """Build-time check: a bottleneck needs 1 <= r <= d."""
    if not 1 <= bottleneck <= dim:
        raise ConfigError(f"{flag} must be between 1 and the model dimension {dim}, got {bottleneck}")


class BottleneckAdapter(nn.Module):
    """``f(x) = s * (W_up Dropout(act(W_down x + b_d)) + b_u)``; shapes [..., dim] -> [..., dim]."""

    def __init__(self, dim, bottleneck, scale=1.0, dropout=0.0, init="bert", activation="relu"):
        super().__init__()
        check_bottleneck("the adapter bottleneck", bottleneck, dim)
        if activation not in ACTIVATIONS:
            raise ConfigError(f"adapter activation must be {' or '.join(map(repr, ACTIVATIONS))}, got {activation!r}")
        self.activation = activation
        self.act = ACTIVATIONS[activation]
        self.scale = float(scale)
        self.down = nn.Linear(dim, bottleneck)
        self.up = nn.Linear(bottleneck, dim)
        self.dropout = nn.Dropout(dropout)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.bias)
        if init == "bert":
            nn.init.normal_(self.down.weight, 0.0, 0.02)
            nn.init.normal_(self.up.weight, 0.0, 0.02)
        elif init == "houlsby":
            truncated_normal_(self.down.weight, 0.01)
            truncated_normal_(self.up.weight, 0.01)
        elif init == "lora":
            nn.init.kaiming_uniform_(self.down.weight, a=math.sqrt(5))
            nn.init.zeros_(self.up.weight)
        else:
            raise ConfigError(f"adapter init must be 'bert', 'houlsby' or 'lora', got {init!r}")

    def forward(self, x):
        h = self.dropout(self.act(self.down(x)))
        # s = 1 (Houlsby's adapter): no multiply, one kernel launch less each way per adapter on a GPU
        return self.up(h) if self.scale == 1.0 else self.up(h) * self.scale

    def extra_repr(self):
        return f"scale={self.scale}, activation={self.activation}"
