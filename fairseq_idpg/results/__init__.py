"""Paper tables from run records: ``python -m fairseq_idpg.results DIR [...]`` (docs/results-tables.md).

- ``records``: the records below the folders as one table of runs (``read_records``);
- ``table``: lr selection, mean ± std per cell, the average column, Markdown and the long CSV;
- ``published``: the papers' tables as data (``fairseq_idpg/published/*.yaml``);
- ``plots``: grouped bars and learning curves (matplotlib figures).
"""
