"""`diagnose`: what an existing DeepSpeed or Megatron config costs, against the planner's best."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from .case import load_case
from .configs import read_config
from .estimate import Estimate, estimate_job
from .plan import Plan, plan_case
from .search_options import retarget


@dataclass(frozen=True)
class Diagnosis:
    engine: str
    estimate: Estimate  # the config's own layout
    plan: Plan  # the planner's best for the same model, cluster, global batch and engine

    @property
    def speedup(self) -> Optional[float]:
        """Predicted step time of the config over that of the planner's best."""
        if self.plan.best is None:
            return None
        return self.estimate.step_time_s / self.plan.best.step_time_s

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "config": self.estimate.to_dict(),
                "best": self.plan.best.to_dict() if self.plan.best else None,
                "speedup": self.speedup,
                "differs_from_best": self.plan.differences(self.estimate) if self.plan.best else None}


def diagnose(case: Any, config: Optional[Path] = None, megatron_args: Optional[Path] = None,
             pp: int = 1, tp: Optional[int] = None) -> Diagnosis:
    loaded = load_case(case)
    engine = "deepspeed" if config is not None else "megatron"
    layout = read_config(loaded, engine, config if config is not None else megatron_args, pp=pp, tp=tp)
    spec, training = retarget(loaded.source, loaded.search, loaded.training, engine)  # the config's engine runs it
    loaded = replace(loaded, training=training, search=spec)
    estimate = estimate_job(loaded, loaded.job(layout))
    return Diagnosis(engine, estimate, plan_case(loaded, target=engine))
