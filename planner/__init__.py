"""layout-planner: the fastest training layout that fits, at the global batch you chose."""

from .errors import CaseError
from .estimate import Estimate, estimate
from .plan import Plan, plan

__all__ = ["CaseError", "Estimate", "Plan", "estimate", "plan"]
