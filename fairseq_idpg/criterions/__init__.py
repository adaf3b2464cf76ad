"""Criterions of fairseq-idpg; each module registers itself with fairseq on import."""

import importlib
import os

for _file in sorted(os.listdir(os.path.dirname(__file__))):
    if _file.endswith(".py") and not _file.startswith("_"):
        importlib.import_module(__name__ + "." + _file[:-3])
