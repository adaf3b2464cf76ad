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
  BetterTransformer branch (frozen layers here are never converted to it).
"""

import contextlib

ASSUME_PADS = "_assume_pads"  # the attribute pads_known sets on the sentence encoder


def encode_layers(enc, tokens, embeddings=None, after_layer=None, all_hiddens=False):
    """(features [B, T, C] after the final LayerNorm, the list of each layer's input and output [T, B, C] when
    ``all_hiddens``, else []). ``enc``: fairseq's ``TransformerEncoder`` (``RobertaEncoder.sentence_encoder``);
    ``tokens`` [B, T] right-padded; ``embeddings`` [B, T, C]: the token embeddings when the caller has them
    (prompts written into them), else looked up."""
    padding_mask = tokens.eq(enc.padding_idx)
    has_pads = getattr(enc, ASSUME_PADS, False) or bool(padding_mask.any())
    x, _ = enc.forward_embedding(tokens, embeddings)  # positions, embedding LayerNorm, dropout
    if has_pads:
        x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
    x = x.transpose(0, 1)  # T x B x C
    states = [x] if all_hiddens else []
    last = len(enc.layers)
    for l, layer in enumerate(enc.layers, start=1):
        out = layer(x, encoder_padding_mask=padding_mask if has_pads else None)
        x = out[0] if isinstance(out, tuple) else out
        if after_layer is not None and l < last:
            x = after_layer(l, x.transpose(0, 1)).transpose(0, 1)
        if all_hiddens:
            states.append(x)
    if enc.layer_norm is not None:
        x = enc.layer_norm(x)
    return x.transpose(0, 1), states


@contextlib.contextmanager
def pads_known(enc):
    """Within: ``encode_layers`` masks every batch of ``enc`` without reading from the device whether it has
    padding (module docstring)."""
    setattr(enc, ASSUME_PADS, True)
    try:
        yield
    finally:
        delattr(enc, ASSUME_PADS)
