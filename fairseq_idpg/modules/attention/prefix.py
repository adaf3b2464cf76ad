"""Prefix tuning (Li & Liang 2021, in He et al. 2021's form; inducer-tuning section 4.2): l virtual
key and value vectors per layer, prepended to that layer's self-attention keys and values.

Training form (the reparameterisation, which stabilises training):

    P = tanh(E W_1 + b_1) W_2 + b_2          E: [l, d] (an embedding of the l slots)
                                              W_1: [d, m], W_2: [m, 2 L d], m = 800
    P.view(l, L, 2, d) -> P_k^(layer), P_v^(layer): [l, d] each

Stored form: the prefixes themselves, ``kv`` [L, 2, l, d] (2 L l d values, the "store" column
of inducer-tuning Table 1): ``to_stored()`` drops the MLP; ``stored_prefixes`` computes them from
a training-form state dict. Training checkpoints keep the MLP, so that a resumed run has the same
trainable tensors (and fairseq keeps its optimizer state); an exported checkpoint
(``models/frozen_roberta.export_checkpoint``) holds the stored form, and the model
(``models/roberta_blocks.py``) switches to it when it loads one.

``layer_kv(i)`` returns layer i's [l, d] key and value prefixes: views of all layers' prefixes, which
the MLP computes once per model forward (``begin``, called by the model before its forward, keeps them;
``end`` drops them). One MLP per forward, not one per layer: a layer's own slice of W_2 made a
full-size gradient of W_2 per layer (summed L - 1 times), and tanh(E W_1 + b_1) was recomputed per
layer; each cost kernel launches of its own on a GPU. The views come from one ``unbind``, whose
backward is one ``stack`` of the 2 L gradients. Called outside a forward that ``begin`` opened (a
module alone), ``layer_kv`` computes the prefixes for that call.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq_idpg.errors import ConfigError

MLP_NAMES = ("embedding.weight", "hidden.weight", "hidden.bias", "output.weight", "output.bias")


def stored_prefixes(embedding, hidden_weight, hidden_bias, output_weight, output_bias):
    """The stored form [L, 2, l, d] of the MLP's tensors (``MLP_NAMES``): E [l, d], W_1 [m, d],
    b_1 [m], W_2 [2 L d, m], b_2 [2 L d] (``nn.Linear`` layout); no module needed."""
    length, dim = embedding.shape
    num_layers = output_weight.shape[0] // (2 * dim)
    with torch.no_grad():
        kv = F.linear(torch.tanh(F.linear(embedding, hidden_weight, hidden_bias)), output_weight, output_bias)
    return kv.view(length, num_layers, 2, dim).permute(1, 2, 0, 3).contiguous()


class PrefixEncoder(nn.Module):
    """Per-layer key/value prefixes, reparameterised by an MLP while training.

    Args:
        num_layers: L; dim: d; length: l (>= 1); mid_dim: m of the MLP (800).
    """

    def __init__(self, num_layers, dim, length, mid_dim=800):
        super().__init__()
        if length < 1:
            raise ConfigError(f"prefix length must be >= 1, got {length}")
        self.num_layers, self.dim, self.length, self.mid_dim = num_layers, dim, length, mid_dim
        # PyTorch's default initialisation, as in the authors' Prefix module
        self.embedding = nn.Embedding(length, dim)
        self.hidden = nn.Linear(dim, mid_dim)
        self.output = nn.Linear(mid_dim, num_layers * 2 * dim)

        self._layers = None  # the prefixes of the forward now running (``begin``)

    @property
    def stored(self):
        return "kv" in self._parameters

    def all_layers(self):
        """Every layer's key and value prefixes, 2 L views [l, d] (layer i's key: 2 i, its value: 2 i + 1)."""
        if self.stored:
            return self.kv.view(2 * self.num_layers, self.length, self.dim).unbind(0)
        kv = self.output(torch.tanh(self.hidden(self.embedding.weight)))  # [l, 2 L d]
        return kv.view(self.length, 2 * self.num_layers, self.dim).unbind(1)

    def begin(self):
        """Compute the prefixes of every layer for the model forward that starts (module docstring)."""
        self._layers = self.all_layers()

    def end(self):
        """Drop the prefixes of the forward that ended (and so their graph)."""
        self._layers = None

    def layer_kv(self, layer):
        """Key and value prefixes of ``layer`` (0-based): two [l, d] tensors."""
        layers = self._layers if self._layers is not None else self.all_layers()
        return layers[2 * layer], layers[2 * layer + 1]

    @torch.no_grad()
    def prefixes(self):
        """All prefixes [L, 2, l, d] (the stored form)."""
        if self.stored:
            return self.kv.detach().clone()
        return stored_prefixes(*(self.get_parameter(name) for name in MLP_NAMES))

    def to_stored(self, kv=None):
        """Drop the MLP and keep the prefixes (computed now, or ``kv``) as the trainable tensor."""
        kv = self.prefixes() if kv is None else kv
        for name in ("embedding", "hidden", "output"):
            delattr(self, name)
        self._layers = None
        self.kv = nn.Parameter(kv)

    def extra_repr(self):
        mlp = f"{self.dim}->{self.mid_dim}->{2 * self.num_layers * self.dim}"
        form = "stored" if self.stored else f"reparameterised by MLP {mlp}"
        return f"layers={self.num_layers}, length={self.length}, dim={self.dim}, {form}"
