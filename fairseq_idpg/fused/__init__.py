"""Many members of one method on one frozen backbone: ``stacked.StackedMembers`` runs them in one forward."""

from .stacked import StackedMembers

__all__ = ["StackedMembers"]
