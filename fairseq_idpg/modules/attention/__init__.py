"""Attention-side blocks: what changes a frozen self-attention layer's computation.

- ``prefix.PrefixEncoder``: key/value prefixes of prefix tuning (Li & Liang 2021);
- ``lora.LoRA``: a low-rank update of W_q / W_v (Hu et al. 2021; inducer-tuning section 4.5), ``dora.DoRA`` and
  PiSSA's start (``pissa``) its variants;
- ``vera.VeRA``: VeRA's trained vectors around one shared frozen random pair (Kopiczko et al. 2024);
- ``inducer.Inducer``: inducer-tuning's per-layer tensors (inducer-tuning sections 4.3-4.4);
- ``augmented_self_attention.AugmentedSelfAttention``: fairseq's self-attention running any of them.
"""
