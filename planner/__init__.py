"""layout-planner: the fastest training layout that fits, at the global batch you chose; and how
many GPUs of which type a run of so many tokens needs."""

from .configs import Emitted, emit, read_config
from .errors import CaseError
from .estimate import Estimate, estimate
from .learn import calibrate_from_runs
from .plan import Plan, plan
from .size import Sizing, size



__all__ = ["CaseError", "Emitted", "Estimate", "Plan", "Sizing", "calibrate_from_runs", "emit", "estimate", "plan",
           "read_config", "size"]
