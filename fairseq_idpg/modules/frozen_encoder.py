"""The frozen encoder's layers over a batch: the one loop every model runs (prompted or with blocks).

    features, states = encode_layers(sentence_encoder, tokens)            # [B, T, C], [] (or each layer's)
    features, states = encode_layers(enc, tokens, embeddings, after_layer=hook)

fairseq's ``TransformerEncoder.forward`` does the same computation for RoBERTa; this loop differs where the
methods need it to:

- ``after_layer(l, x)``: a hook after each layer but the last (x [B, T, C]; its result replaces x), where deep
  prompts are added (``prompts/encoder.py``);
- whether the batch has padding is asked of ``pads_known`` first: fairseq reads it from the device
  (``padding_mask.any()``, a host sync), and only masks a padded batch. Under ``pads_known(encoder)`` every
  batch is masked without asking: the same values (a mask of zeros changes nothing), and no data-dependent
  branch, so ``torch.func.vmap`` can run the model over stacked members (``fairseq_idpg/fused/``);
- no ``src_lengths`` (fairseq computes them for callers that read ``encoder_out``; RoBERTa's never do) and no
  BetterTransformer branch (frozen layers here are never converted to it);
- the embeddings (``forward_embedding``) as fairseq's ``forward_embedding`` computes them, in fewer operators:
  no multiply by an ``embed_scale`` of 1 (RoBERTa's), the padded rows zeroed by one ``masked_fill`` (fairseq:
  a cast, ``1 - mask`` and a multiply); a caller that has the padding mask of a right-padded batch (the
  prompted forward) passes it instead of the tokens, and the learned positions are then one ``arange``
  (fairseq's ``make_positions``: seven operators). The same values: x * 1 is x, and a padded row is zeroed
  whatever position it was given.
"""

import contextlib

import torch
import torch.nn.functional as F
from fairseq.modules import LearnedPositionalEmbedding

ASSUME_PADS = "_assume_pads"  # the attribute pads_known sets on the sentence encoder


def encode_layers(enc, tokens, embeddings=None, after_layer=None, all_hiddens=False, padding_mask=None):
    """(features [B, T, C] after the final LayerNorm, the list of each layer's input and output [T, B, C] when
    ``all_hiddens``, else []). ``enc``: fairseq's ``TransformerEncoder`` (``RobertaEncoder.sentence_encoder``);
    ``tokens`` [B, T] right-padded; ``embeddings`` [B, T, C]: the token embeddings when the caller has them
    (prompts written into them), else looked up; ``padding_mask`` [B, T] (True at padding) instead of
    ``tokens`` (None) when the caller has it, with ``embeddings``: the batch is then right-padded."""
    if padding_mask is None:
        padding_mask = tokens.eq(enc.padding_idx)
    has_pads = getattr(enc, ASSUME_PADS, False) or bool(padding_mask.any())
    if not has_pads:
        padding_mask = None
    x = forward_embedding(enc, tokens, embeddings, padding_mask)
    return run_layers(enc, x, padding_mask, after_layer, all_hiddens)


def run_layers(enc, x, padding_mask=None, after_layer=None, all_hiddens=False):
    """``encode_layers`` after the embeddings: ``x`` [B, T, C] (``forward_embedding``'s), ``padding_mask``
    [B, T] or None (a batch without padding)."""
    x = x.transpose(0, 1)  # T x B x C
    states = [x] if all_hiddens else []
    last = len(enc.layers)
    for l, layer in enumerate(enc.layers, start=1):
        out = layer(x, encoder_padding_mask=padding_mask)
        x = out[0] if isinstance(out, tuple) else out
        if after_layer is not None and l < last:
            x = after_layer(l, x.transpose(0, 1)).transpose(0, 1)
        if all_hiddens:
            states.append(x)
    if enc.layer_norm is not None:
        x = enc.layer_norm(x)
    return x.transpose(0, 1), states


def forward_embedding(enc, tokens, embeddings=None, padding_mask=None):
    """fairseq's ``enc.forward_embedding(tokens, embeddings)`` (token embeddings, learned positions, embedding
    LayerNorm, dropout) with the padded rows then zeroed, as fairseq's encoder does when ``padding_mask`` is
    given (module docstring). ``tokens`` None: ``embeddings`` and ``padding_mask`` are of a right-padded
    batch."""
    if embeddings is None:
        embeddings = enc.embed_tokens(tokens)
    x = embeddings if enc.embed_scale == 1.0 else enc.embed_scale * embeddings
    if enc.embed_positions is not None:
        x = x + _positions(enc.embed_positions, tokens, embeddings, padding_mask, enc.padding_idx)
    if enc.layernorm_embedding is not None:
        x = enc.layernorm_embedding(x)
    x = enc.dropout_module(x)
    if enc.quant_noise is not None:
        x = enc.quant_noise(x)
    if padding_mask is not None:
        x = x.masked_fill(padding_mask.unsqueeze(-1), 0)
    return x


def _positions(embed_positions, tokens, embeddings, padding_mask, pad):
    """The positional embeddings fairseq adds: of ``tokens``; without tokens, of a right-padded batch: learned
    positions 0..T-1 at rows pad + 1 .. pad + T for every example ([T, C], broadcast over the batch: only the
    padded rows, zeroed after, differ from fairseq's row ``pad``), else of stand-in tokens."""
    if tokens is not None:
        return embed_positions(tokens)
    bsz, length = embeddings.shape[:2]
    learned = type(embed_positions) is LearnedPositionalEmbedding and embed_positions.padding_idx == pad
    if learned and pad + length < embed_positions.num_embeddings:
        positions = torch.arange(pad + 1, pad + 1 + length, device=embeddings.device)
        e = embed_positions
        return F.embedding(positions, e.weight, pad, e.max_norm, e.norm_type, e.scale_grad_by_freq, e.sparse)
    stand_in = torch.full((bsz, length), pad + 1, dtype=torch.long, device=embeddings.device)  # any non-pad id
    return embed_positions(stand_in if padding_mask is None else stand_in.masked_fill(padding_mask, pad))


@contextlib.contextmanager
def pads_known(enc):
    """Within: ``encode_layers`` masks every batch of ``enc`` without reading from the device whether it has
    padding (module docstring)."""
    setattr(enc, ASSUME_PADS, True)
    try:
        yield
    finally:
        delattr(enc, ASSUME_PADS)
