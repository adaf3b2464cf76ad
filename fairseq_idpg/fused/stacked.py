"""K members of one method on one frozen backbone, in one forward: the backbone's work is shared, each member's
tensors are its own.

    stacked = StackedMembers(model, members=[state_0, state_1, ...])   # or k=K copies of the model's own
    logits = stacked(tokens, classification_head_name="sentence_classification_head")   # [K, B, ...] -> [K, B, C]
    stacked.member_state(k)                                               # member k's trained tensors

A method's model (any family: prompts, IDPG, DPT, blocks, BitFit) is a frozen backbone plus a few trained
tensors. ``StackedMembers`` keeps each trained tensor once per member, stacked along a new first dimension
[K, ...], and runs the model over a batch [K, B, T] (member k's rows at index k) with ``torch.func.vmap`` over
``torch.func.functional_call``: every operator of the model runs once for all K members. Where an operator
mixes a member's rows with a frozen weight (the backbone's linear layers, its embeddings), vmap folds the K
members into the batch, so the frozen matmuls are one matmul over K x B rows; where it reads a member's
tensor (a prompt, a LoRA factor, an adapter, a head), it is one batched operator over the K members. No
Python loop over members or rows, and the kernel launches of a forward and backward do not grow with K.

- Each member's gradient is its own: members share no trained tensor, so the backward of a sum of the
  members' losses gives each stacked slice exactly the gradient of its own loss.
- Dropout: ``randomness="different"``, each member draws its own masks (a member's masks are not those of the
  same run trained alone; with dropout off, a member computes what it would alone, to float rounding).
- The encoder masks every batch (``modules/frozen_encoder.pads_known``): vmap cannot branch on whether a batch
  has padding, and masking a batch without padding changes nothing.
- Attention runs as one fused kernel over every member's rows (``modules/attention/folded.py``): torch's fused
  attention kernels have no vmap rule on every device (vmap would run them once per member, or as their maths
  with a dozen operators each way per layer); ``folded_members`` gives them one. The other attention paths
  (the inducer's explicit scores; fairseq's own attention in the models that keep it) run as their maths,
  batched by vmap.
- Inputs all members share and the backbone alone computes (IDPG's sentence representation M(x)) are computed
  once, outside vmap, by the model's ``fused_inputs`` (when it has one) and handed to each member's forward.
- Fine-tuning trains the backbone itself: its runs cannot share it, and building one says so.
"""

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from fairseq_idpg.errors import ConfigError
from fairseq_idpg.modules.attention.folded import folded_members
from fairseq_idpg.modules.frozen_encoder import pads_known


class StackedMembers(nn.Module):
    """K members of ``model``'s method sharing its frozen backbone (module docstring).

    Args:
        model: the method's fairseq model; its frozen tensors are the shared backbone, its trained ones
            (``requires_grad``) the shapes and names of each member's.
        k: the number of members, each starting from a copy of ``model``'s trained tensors (when
            ``members`` is not given).
        members: each member's trained tensors by name (``member_state``'s format: a checkpoint's
            model state restricted to them); every name of ``model``'s trained tensors is needed.
    """

    def __init__(self, model, k=None, members=None):
        super().__init__()
        trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
        if not any(not p.requires_grad for p in model.parameters()):
            raise ConfigError(
                f"{model.args.arch}: every tensor trains (fine-tuning), so its runs cannot share one frozen "
                "backbone; they train one at a time"
            )
        if members is None:
            if not k or k < 1:
                raise ValueError(f"StackedMembers: k={k}; give k >= 1 or the members' tensors")
            members = [{name: p.detach() for name, p in trained.items()}] * k
        self.model = model
        self.names = list(trained)
        self.tensors = nn.ParameterList()
        for name, p in trained.items():
            missing = [i for i, m in enumerate(members) if name not in m]
            if missing:
                raise KeyError(f"member(s) {missing} have no tensor {name!r}")
            values = torch.stack([m[name].to(device=p.device, dtype=p.dtype) for m in members])
            self.tensors.append(nn.Parameter(values.clone()))

    @property
    def k(self):
        return self.tensors[0].size(0)

    def stacked(self):
        """{name: [K, ...]} of the members' trained tensors."""
        return dict(zip(self.names, self.tensors, strict=True))

    def member_state(self, k):
        """Member ``k``'s trained tensors {name: tensor} (detached views)."""
        return {name: t[k].detach() for name, t in self.stacked().items()}

    def forward(self, src_tokens, members=None, **kwargs):
        """The model's first output for each member: ``src_tokens`` [K, B, T] (member k's batch at k); tensor
        ``kwargs`` are per member too ([K, B, ...]), the rest (``classification_head_name``, ...) the same for
        all. ``members``: [K'] indices of the members to run (default all), ``src_tokens`` then [K', B, T]: a
        batch that needs only some members does not run the others (serving). Returns [K or K', B, ...]."""
        tensors = self.stacked()
        if members is not None:
            tensors = {name: t[members] for name, t in tensors.items()}
        k = len(members) if members is not None else self.k
        if src_tokens.dim() != 3 or src_tokens.size(0) != k:
            raise ValueError(f"src_tokens: expected [K={k}, B, T], got {list(src_tokens.shape)}")
        per_member = {key: v for key, v in kwargs.items() if torch.is_tensor(v)}
        common = {key: v for key, v in kwargs.items() if not torch.is_tensor(v)}
        shared = getattr(self.model, "fused_inputs", None)
        if shared is not None:  # computed once for every member's rows, outside vmap
            k, b = src_tokens.shape[:2]
            flat = {key: v.flatten(0, 1) for key, v in per_member.items()}
            extra = shared(src_tokens.flatten(0, 1), **flat)
            per_member.update({key: v.unflatten(0, (k, b)) for key, v in extra.items()})

        def one(tensors, tokens, inputs):
            out = functional_call(self.model, tensors, (tokens,), {**inputs, **common})
            return out[0] if isinstance(out, tuple) else out

        # the attention's dropout masks (folded.py): a seed from torch's generator, drawn only when they are drawn
        seed = int(torch.randint(2**31 - 1, ())) if self.model.training else 0
        # fairseq's own attention (the adapter, Compacter, BitFit and (IA)^3 models' frozen layers) as its maths:
        # torch's fused kernels have no vmap rule there, and vmap would run them once per member
        with pads_known(self.model.encoder.sentence_encoder), sdpa_kernel(SDPBackend.MATH), folded_members(seed):
            return vmap(one, randomness="different")(tensors, src_tokens, per_member)
