"""Prompt-side blocks: what a prompted RoBERTa inserts into, or adds to, its hidden states.

- ``insertion``: where t prompt vectors go in an input (IDPG appendix A.4/A.5, positions 0-4) and
  the vectorised insertion;
- ``encoder.prompted_features``: fairseq's encoder run with an inserted prompt and, optionally,
  prompts added after layers 1..L-1 (P-tuning v2, M-IDPG, deep DPT);
- ``soft_prompts``: static prompts P [l, d]: ``FullPrompt`` (prompt tuning), ``LowRankPrompt``
  (DPT Eq. 5), ``RankProbePrompt`` (DPT Eq. 3), ``ResidualPrompt`` (residual prompt tuning);
- ``generator.PromptGenerator`` and ``layer_biases.LayerBiases``: IDPG's G (IDPG Eq. 2-4);
- ``glove`` and ``detokenize``: IDPG's light sentence encoder M(x) (IDPG Eq. 5).

Every module of the folder is imported with the package, so that a prompt parameterisation in a
new file registers its ``--prompt-matrix`` choice (``soft_prompts.register_prompt_matrix``).
"""

import importlib
import os

for _file in sorted(os.listdir(os.path.dirname(__file__))):
    if _file.endswith(".py") and not _file.startswith("_"):
        importlib.import_module(__name__ + "." + _file[:-3])
