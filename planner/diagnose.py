"""`diagnose`: what an existing DeepSpeed or Megatron config costs, against the planner's best."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from .case import load_case
from .configs import read_config
from .engines import ENGINES
from .estimate import Estimate, estimate_job
from .plan import Plan, plan_case


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
    if loaded.training.engine.name == "any":  # the config's engine is the one that will run it
        loaded = replace(loaded, training=replace(loaded.training, engine=ENGINES[engine].behaviour))
    estimate = estimate_job(loaded, loaded.job(layout))
    return Diagnosis(engine, estimate, plan_case(loaded, target=engine))
