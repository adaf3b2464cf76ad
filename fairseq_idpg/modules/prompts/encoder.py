"""Run RoBERTa's (fairseq's) TransformerEncoder with prompts: the shared forward pass of every
prompt method (prompt tuning, P-tuning v2, S-/M-IDPG, DPT, deep DPT, residual prompts).

    features, slots = prompted_features(model.encoder.sentence_encoder, src_tokens, prompt,
                                        position=0, layer_prompts=fn)

- ``prompt`` ([B, t, C] or [t, C]) is inserted into the token embeddings at ``position``
  (``insertion``) before the learned positions are added; then come fairseq's own
  embedding LayerNorm and dropout, and its padding mask (0 at the prompt slots).
- ``layer_prompts(l, x)``, if given, is called after layer l = 1 .. L-1 with that layer's
  output ``x`` ([B, T+t, C], batch first) and returns P_l ([B, t, C] or [t, C]), which is
  **added** to the hidden states at the prompt slots: ``x[slots] += P_l`` (the multi-layer
  scheme of M-IDPG and of the P-tuning v2 baseline, IDPG sections 3.2.2 and 4.1). Nothing is added
  after the last layer. Returning None skips a layer. At position 0, a ``layer_prompts`` with an
  ``add_after_bos(l, x)`` method adds its prompts itself: it returns x with P_l added at rows 1..t
  (M-IDPG's ``layer_steps.GeneratedPrompts``: the generator's weight gradients once per backward).

The layer loop is the frozen encoder's (``modules/frozen_encoder.py``) with the addition in
between; the inserted prompt lengths are the same for every example, so the addition is one
gather over the batch (no loop over examples or tokens), from the slots' prompt rows found once
per forward (``slot_rows``), not once per layer. At position 0 the slots are the same in every
row (1..t): the prompt is inserted by one concatenation (``insertion.insert_after_bos``) and
added by one pad (``add_after_bos``), and the encoder is handed the padding mask, not tokens
(its positions are then one ``arange``: ``frozen_encoder.forward_embedding``).
"""

import torch
import torch.nn.functional as F

from ..frozen_encoder import encode_layers
from .insertion import insert_after_bos, insert_prompts, insertion_index, slots_after_bos


def slot_rows(slots, length):
    """What ``add_at_slots`` reads of ``slots`` [B, T], the same after every layer, so computed once per
    forward: the prompt row of each position (the j-th slot of a row reads prompt row j) [B, T] and the
    positions outside the slots [B, T]."""
    return (slots.cumsum(1) - 1).clamp(0, length - 1), ~slots


def add_at_slots(x, slots, prompt, rows=None):
    """``x`` [B, T, C] plus ``prompt`` ([B, t, C] or [t, C]) at the True entries of ``slots``; ``rows``:
    ``slot_rows(slots, t)`` when the caller keeps it across layers.

    Gather + masked fill, like ``insert_prompts``: a boolean-mask assignment would make CUDA
    wait for the host once per layer."""
    bsz, _, dim = x.shape
    if prompt.dim() == 2:
        prompt = prompt.unsqueeze(0).expand(bsz, -1, -1)
    prompt_idx, outside = slot_rows(slots, prompt.size(1)) if rows is None else rows
    gathered = torch.gather(prompt.to(x.dtype), 1, prompt_idx.unsqueeze(-1).expand(-1, -1, dim))
    return x + gathered.masked_fill(outside.unsqueeze(-1), 0)


def add_after_bos(x, prompt):
    """``add_at_slots`` at position 0's slots (1..t): ``x`` [B, T, C] plus ``prompt`` ([B, t, C] or [t, C])
    zero-padded to the rows' length (one pad forward and one slice backward, where the gather takes
    three and four). The same sums: x + 0 outside the slots, x + P_l in them."""
    t = prompt.size(-2)
    return x + F.pad(prompt.to(x.dtype), (0, 0, 1, x.size(1) - 1 - t))


def prompted_features(sentence_encoder, src_tokens, prompt, position=0, layer_prompts=None, filler_idx=None):
    """Final-layer features [B, T+t, C] (batch first) and the prompt ``slots`` [B, T+t].

    Args:
        sentence_encoder: fairseq ``TransformerEncoder`` (``RobertaModel.encoder.sentence_encoder``).
        src_tokens: [B, T] right-padded token ids.
        prompt: [B, t, C] or [t, C], the input-layer prompt (in the embedding space).
        position: IDPG insertion position 0-4 (``insertion.check_position`` at build time).
        layer_prompts: optional ``fn(l, x) -> P_l`` (see the module docstring).
        filler_idx: non-pad id written at the slots (default: ``<unk>`` = padding_idx + 2).
    """
    enc = sentence_encoder
    pad = enc.padding_idx
    eos = enc.dictionary.eos() if hasattr(enc, "dictionary") else 2
    filler = pad + 2 if filler_idx is None else filler_idx
    t = prompt.size(-2)
    if position == 0:  # the same slot in every row: concatenated, and added by one pad
        embeddings, padding_mask = insert_after_bos(enc.embed_tokens(src_tokens), prompt, src_tokens.eq(pad))
        slots = slots_after_bos(src_tokens.size(0), embeddings.size(1), t, src_tokens.device)
        add = add_after_bos
    else:
        index = insertion_index(src_tokens, position, pad, eos)
        tokens, embeddings, slots = insert_prompts(src_tokens, enc.embed_tokens(src_tokens), prompt, index, pad, filler)
        padding_mask = tokens.eq(pad)
        rows = slot_rows(slots, t) if layer_prompts is not None else None

        def add(x, p):
            return add_at_slots(x, slots, p, rows)

    after_layer = None
    adds = getattr(layer_prompts, "add_after_bos", None) if position == 0 else None
    if adds is not None:  # adds its prompts itself (``layer_steps.GeneratedPrompts``)
        after_layer = adds
    elif layer_prompts is not None:

        def after_layer(l, x):
            p = layer_prompts(l, x)
            return x if p is None else add(x, p)

    features, _ = encode_layers(enc, None, embeddings, after_layer=after_layer, padding_mask=padding_mask)
    return features, slots
