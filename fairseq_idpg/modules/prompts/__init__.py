"""Prompt-side blocks: what a prompted RoBERTa inserts into, or adds to, its hidden states.

- ``insertion``: where t prompt vectors go in an input (IDPG appendix A.4/A.5, positions 0-4) and
  the vectorised insertion;
- ``encoder.prompted_features``: fairseq's encoder run with an inserted prompt and, optionally,
  prompts added after layers 1..L-1 (P-tuning v2, M-IDPG, deep DPT);
- ``soft_prompts``: static prompts P [l, d]: ``FullPrompt`` (prompt tuning), ``LowRankPrompt``
  (DPT Eq. 5), ``RankProbePrompt`` (DPT Eq. 3), ``ResidualPrompt`` (residual prompt tuning);
- ``generator.PromptGenerator`` and ``layer_biases.LayerBiases``: IDPG's G (IDPG Eq. 2-4);
- ``glove`` and ``detokenize``: IDPG's light sentence encoder M(x) (IDPG Eq. 5).
- ``layer_steps``: M-IDPG's prompts with the generator's weight gradients once per backward (the
  layers' rows stacked), not once per layer.

Importing the package imports its modules (below), so that a prompt parameterisation registers its
``--prompt-matrix`` choice (``soft_prompts.register_prompt_matrix``): a new file adds one import line
at the end of this one.
"""

from . import detokenize, encoder, generator, glove, insertion, layer_biases, layer_steps, soft_prompts  # noqa: F401

# A new module's import line goes at the end: the split makes it an import block of its own, which ruff's
# sorting leaves in place.
# isort: split
