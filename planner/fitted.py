"""What a profile fitted to a team's runs (`calibrate --from-runs`) covered, and what lies beyond it.

A fitted figure is as good as the runs behind it: a plan at a tensor-parallel degree, a node
count, a ZeRO stage or a precision no run used leans on a figure those runs never exercised
there. The profile's ``fitted.coverage`` lists what the runs used; :func:`outside` says where a
job leaves it, naming the fitted figure the job leans on there.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from cost_models.specs import Job

COVERED = ("tp", "pp", "cp", "ep", "zero_stage", "nodes", "precision")
# The fitted figure a job leans on where it leaves the runs' coverage in each respect.
LEANS_ON = {"tp": "performance.intra_node_efficiency", "cp": "performance.intra_node_efficiency",
            "ep": "fabric.efficiency", "pp": "performance.microbatch_overhead_s",
            "zero_stage": "fabric.efficiency", "nodes": "fabric.efficiency"}
PRECISION_FIGURE = {"fp8": "performance.gemm_efficiency_fp8", "mxfp8": "performance.gemm_efficiency_fp8",
                    "nvfp4": "performance.gemm_efficiency_fp4"}


def facts(job: Job) -> dict[str, Any]:
    """The job's degrees, nodes, ZeRO stage and precision, as coverage lists them."""
    lay = job.layout
    return {"tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "zero_stage": lay.zero_stage,
            "nodes": math.ceil(job.cluster.num_gpus / job.cluster.gpu.gpus_per_node),
            "precision": job.training.precision}


def coverage(jobs: Iterable[Job]) -> dict[str, list]:
    """Every value of each respect the ``jobs`` (a team's runs) used."""
    seen: dict[str, set] = {k: set() for k in COVERED}
    for job in jobs:
        for k, v in facts(job).items():
            seen[k].add(v)
    return {k: sorted(v) for k, v in seen.items()}


def outside(fitted: dict, job: Job) -> list[str]:
    """One line for each respect in which ``job`` leaves the coverage of a profile's ``fitted``
    section, with the fitted figure it leans on there."""
    cover, figures = fitted.get("coverage") or {}, fitted.get("figures") or {}
    lines = []
    for k, v in facts(job).items():
        seen = cover.get(k)
        if not isinstance(seen, list) or not seen or v in seen:
            continue
        figure = PRECISION_FIGURE.get(v, "performance.gemm_efficiency") if k == "precision" else LEANS_ON[k]
        f = figures.get(figure) if isinstance(figures.get(figure), dict) else {}
        if not f:
            lean = ""
        elif f.get("runs"):
            lean = f"; it leans on {figure} {f.get('value')} (prior {f.get('prior')}, from {f['runs']} runs)"
        else:
            lean = f"; it leans on {figure} {f.get('value')}, the preset's: no run informed it"
        lines.append(f"{k.replace('_', ' ')} {v} lies outside the fitted profile's runs "
                     f"({', '.join(str(x) for x in seen)}){lean}")
    return lines
