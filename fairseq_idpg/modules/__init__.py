"""Building blocks, each usable alone, grouped by role: ``prompts/`` (insertion, the prompted encoder
pass, soft prompts, IDPG generators, GloVe), ``attention/`` (prefixes, LoRA, the inducer, the
self-attention that runs them), ``adapters/`` (bottleneck, Compacter, the adapted layer), and the
PHM layer shared by IDPG and Compacter (``phm.py``); the frozen encoder's layer loop that every model runs
(``frozen_encoder.py``)."""
