"""layout-planner: the fastest training layout that fits, at the global batch you chose."""

from .errors import CaseError
from .estimate import Estimate, estimate

__all__ = ["CaseError", "Estimate", "estimate"]
