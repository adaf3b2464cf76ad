"""Many trained tasks on one frozen backbone, in Python (``MultiTaskModel``); ``python -m fairseq_idpg.serve``
serves it over HTTP. docs/serving.md."""

from .multitask import MultiTaskModel

__all__ = ["MultiTaskModel"]
