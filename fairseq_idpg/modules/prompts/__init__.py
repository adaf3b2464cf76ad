"""Prompt-side blocks: what a prompted RoBERTa inserts into, or adds to, its hidden states.

- ``insertion``: where t prompt vectors go in an input (IDPG appendix A.4/A.5, positions 0-4) and
  the vectorised insertion;
- ``encoder.prompted_features``: fairseq's encoder run with an inserted prompt and, optionally,
  prompts added after layers 1..L-1 (P-tuning v2, M-IDPG, deep DPT);
- ``soft_prompts``: static prompts P [l, d]: ``FullPrompt`` (prompt tuning), ``LowRankPrompt``
  (DPT Eq. 5), ``RankProbePrompt`` (DPT Eq. 3), ``ResidualPrompt`` (residual prompt tuning);
- ``generator.PromptGenerator`` and ``layer_biases.LayerBiases``: IDPG's G (IDPG Eq. 2-4);
- ``glove`` and ``detokenize``: IDPG's light sentence encoder M(x) (IDPG Eq. 5).
"""
