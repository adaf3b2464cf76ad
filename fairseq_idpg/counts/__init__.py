"""Parameter-count tables printed by ``scripts/count_params.py``.

Each module here defines ``TABLES``: a list of ``(title, rows_fn)`` where ``rows_fn()``
builds the real modules (at the paper's model size) and returns rows
``(method, ours, paper)``: ``ours`` counted from the built tensors (trainable, classification
head excluded, fairseq's duplicate fast-path tensors excluded by fairseq_idpg_compat),
``paper`` the published figure (int, or a string such as "1.55M" where the paper rounds).
A new module's tables join below: import it and add its ``TABLES``.
"""

from . import blocks, prompts

TABLES = blocks.TABLES + prompts.TABLES
