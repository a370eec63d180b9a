"""The CP-SAT model of `size`: which GPU type, how many of it, and which layout.

Decision variables: the GPU type, the cluster size in whole nodes (or racks) and in GPUs, and
every decision of the layout (dp, tp, pp, cp, vpp, micro-batch and accumulation, ZeRO stage,
sequence parallelism, recomputation and how many layers of each stage it covers, the
pipeline partition). Constraints: GPUs = units × the type's GPUs per unit, at most the
type's limit (the case's, and any budget); dp·tp·pp·cp = GPUs; micro_batch·accumulation·dp
= global batch; the pins and bounds of the case's ``search`` section; peak memory within
the chosen type's usable memory; the step time within the deadline's share of a step.

What is not linear in those variables (a layout's step time and peak memory on a type and
size, from the cost models) is precomputed per choice, one row per scored layout, and tied
to the variables by element constraints, as :mod:`planner.solver` does for `plan`. The
rows come from plan's own search on each (type, size) that can still matter
(:mod:`planner.size`): enumerating those sizes with plan's pruning is faster than letting
CP-SAT branch over them, and it makes `size` and `plan` agree on any one cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from cost_models.memory import usable_bytes

from .bands import fit_limit
from cost_models.specs import Overheads

from .cluster_options import ClusterOption
from .cpsat import Linear, Model
from .search import Candidate
from .search_options import SearchSpec
from .solver import Solution, complexity_ranks, constrain_layout, layout_columns, linked_variables

OBJECTIVES = ("gpu_hours", "cost", "time")


@dataclass(frozen=True)
class SizeRow:
    """One scored layout on one GPU type and cluster size."""

    option: int  # index into the options
    gpus: int
    candidate: Candidate


# How far past the deadline's share of a step a step may be, relatively, and still meet it: the
# roundoff between the days a step gives (tokens / tokens/s / 86,400) and the share of a step a
# deadline of those days gives back (deadline · tokens per step / tokens), a few units in the last
# of 16 digits. Whole microseconds (1 µs rounded each way) refused a deadline set to the days
# reported, 51.16044019155041 for 2,048 B200s, by 2 µs a step.
DEADLINE_ROUNDOFF = 1e-12


def within_deadline(step_s: float, step_deadline_s: float) -> bool:
    """Whether a step meets the deadline's share of a step, as the model judges it."""
    return step_s <= step_deadline_s * (1 + DEADLINE_ROUNDOFF)


def dense_ranks(values: Sequence[float]) -> list[int]:
    """Each value's place among the distinct values (0 for the least): the order of the
    floats exactly, in integers small enough to weigh against each other in 64 bits."""
    order = {v: i for i, v in enumerate(sorted(set(values)))}
    return [order[v] for v in values]


class SizeModel:
    """The model over every row; :meth:`solve` answers the best (type, size, layout) not yet excluded."""

    def __init__(self, rows: list[SizeRow], options: Sequence[ClusterOption], limits: Sequence[int],
                 prices: Sequence[float], spec: SearchSpec, global_batch: int, objective: str,
                 step_deadline_s: Optional[float], overheads: Overheads = Overheads()):
        assert objective in OBJECTIVES
        self.rows = rows
        m = Model()
        self.model = m
        if not rows:
            return
        candidates = [r.candidate for r in rows]
        sizes = sorted({(r.option, r.gpus) for r in rows})
        size_id = {s: i for i, s in enumerate(sizes)}
        self.size_id = size_id
        time_us = [round(c.step_time_s * 1e6) for c in candidates]
        # Equal whole microseconds spend alike, so that on one cluster size the order is plan's.
        spend = [prices[r.option] * r.gpus * t for r, t in zip(rows, time_us)]
        columns = layout_columns(candidates, global_batch)
        columns.update(
            gpu_type=[r.option for r in rows],
            gpus=[r.gpus for r in rows],
            units=[r.gpus // options[r.option].unit for r in rows],
            size=[size_id[(r.option, r.gpus)] for r in rows],
            # Whether the row meets the deadline, as within_deadline judges it (every row, without one).
            meets_deadline=[int(step_deadline_s is None or within_deadline(c.step_time_s, step_deadline_s))
                            for c in candidates],
            spend_rank=dense_ranks(spend),
            time_rank=dense_ranks(time_us),
            complexity_rank=complexity_ranks(candidates, global_batch),
        )
        self.row = m.new_range(0, len(rows) - 1, "row")
        v = linked_variables(m, self.row, columns)
        self.size_var = v["size"]
        gpu_type, gpus = v["gpu_type"], v["gpus"]

        def by_type(name: str, values: list[int]) -> Linear:
            variable = m.new_var(values, name)
            m.add_element(gpu_type.vars[0], values, variable)
            return Linear.of(variable)

        unit = by_type("gpus_per_unit", [o.unit for o in options])
        m.add_product(gpus, [v["units"].vars[0], unit.vars[0]])
        m.add_between(gpus - by_type("gpu_limit", list(limits)), high=0)
        # Per GPU type, the fit limit a row of that type is held to (estimate's: ``bands.fit_limit``).
        job_of = {r.option: r.candidate.job for r in reversed(rows) if r.candidate.job is not None}
        usable_mb = [int(fit_limit(usable_bytes(o.gpu, overheads, spec.headroom),
                                   job_of[i].model, job_of[i].cluster, job_of[i].training) / 1e6)
                     if i in job_of else int(usable_bytes(o.gpu, overheads, spec.headroom) / 1e6)
                     for i, o in enumerate(options)]
        m.add_between(v["peak_mb"] - by_type("usable_mb", usable_mb), high=0)
        m.add_product(gpus, [v[k].vars[0] for k in ("dp", "tp", "pp", "cp")])
        constrain_layout(m, spec, v, global_batch)
        m.add_equal(v["meets_deadline"], 1)
        # Lexicographic: the objective, then the other of spend and time, then the simpler layout.
        first, second = ("time_rank", "spend_rank") if objective == "time" else ("spend_rank", "time_rank")
        n = len(rows)
        m.minimize(Linear(v[first].vars + v[second].vars + v["complexity_rank"].vars, (n * n, n, 1)))

    def solve(self) -> Solution:
        if not self.rows:
            return Solution("INFEASIBLE", None)
        answer = self.model.solve()
        return Solution(answer.status, answer.values[self.row] if answer.found else None)

    def exclude_size(self, index: int) -> None:
        """No more answers on the type and size of row ``index``: alternatives differ in either."""
        row = self.rows[index]
        self.model.add_not_equal(self.size_var, self.size_id[(row.option, row.gpus)])
