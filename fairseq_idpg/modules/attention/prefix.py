"""Prefix tuning (Li & Liang 2021, in He et al. 2021's form; inducer-tuning section 4.2): l virtual
key and value vectors per layer, prepended to that layer's self-attention keys and values.

Training form (the reparameterisation, which stabilises training):

    P = tanh(E W_1 + b_1) W_2 + b_2          E: [l, d] (an embedding of the l slots)
                                              W_1: [d, m], W_2: [m, 2 L d], m = 800
    P.view(l, L, 2, d) -> P_k^(layer), P_v^(layer): [l, d] each

Stored form: the prefixes themselves, ``kv`` [L, 2, l, d] (2 L l d values): ``to_stored()``
drops the MLP. The model (``models/roberta_blocks.py``) writes checkpoints in the stored form
(the "store" column of inducer-tuning Table 1) unless ``save_mlp`` is set, and switches to it when it loads one.

``layer_kv(i)`` returns layer i's [l, d] key and value prefixes. In the training form it
computes only that layer's slice of W_2 (the shared tanh layer, l x d x m, is recomputed per
layer: small next to the slice itself, and it keeps the module stateless across layers).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class PrefixEncoder(nn.Module):
    """Per-layer key/value prefixes, reparameterised by an MLP while training.

    Args:
        num_layers: L; dim: d; length: l (>= 1); mid_dim: m of the MLP (800).
        save_mlp: checkpoints keep the training form (resumable) instead of the prefixes.
    """

    def __init__(self, num_layers, dim, length, mid_dim=800, save_mlp=False):
        super().__init__()
        if length < 1:
            raise ValueError(f"prefix length must be >= 1, got {length}")
        self.num_layers, self.dim, self.length, self.mid_dim = num_layers, dim, length, mid_dim
        self.save_mlp = save_mlp
        # PyTorch's default initialisation, as in the authors' Prefix module
        self.embedding = nn.Embedding(length, dim)
        self.hidden = nn.Linear(dim, mid_dim)
        self.output = nn.Linear(mid_dim, num_layers * 2 * dim)

    @property
    def stored(self):
        return "kv" in self._parameters

    def layer_kv(self, layer):
        """Key and value prefixes of ``layer`` (0-based): two [l, d] tensors."""
        if self.stored:
            return self.kv[layer, 0], self.kv[layer, 1]
        h = torch.tanh(self.hidden(self.embedding.weight))  # [l, m]
        width = 2 * self.dim
        rows = slice(layer * width, (layer + 1) * width)
        kv = F.linear(h, self.output.weight[rows], self.output.bias[rows])  # [l, 2d]
        return kv[:, : self.dim], kv[:, self.dim :]

    @torch.no_grad()
    def prefixes(self):
        """All prefixes [L, 2, l, d] (the stored form)."""
        if self.stored:
            return self.kv.detach().clone()
        h = torch.tanh(self.hidden(self.embedding.weight))
        return self.output(h).view(self.length, self.num_layers, 2, self.dim).permute(1, 2, 0, 3).contiguous()

    def to_stored(self, kv=None):
        """Drop the MLP and keep the prefixes (computed now, or ``kv``) as the trainable tensor."""
        kv = self.prefixes() if kv is None else kv
        for name in ("embedding", "hidden", "output"):
            delattr(self, name)
        self.kv = nn.Parameter(kv)

    def extra_repr(self):
        mlp = f"{self.dim}->{self.mid_dim}->{2 * self.num_layers * self.dim}"
        form = "stored" if self.stored else f"reparameterised by MLP {mlp}"
        return f"layers={self.num_layers}, length={self.length}, dim={self.dim}, {form}"
