"""The CP-SAT model that holds the decision.

Decision variables are the layout's degrees and choices. The model states the world size
(dp·tp·pp·cp = GPUs), the expert grid folded over the same ranks (etp·ep·edp = tp·cp·dp), the
global batch (micro_batch·accumulation·dp = global batch), the pins and bounds of the case's
``search`` section, and the memory limit; the nonlinear step time and peak memory of each
scored layout enter through a table (one row per layout from :mod:`planner.search`), as
CP-SAT's documentation suggests for tabulated costs. :class:`LayoutModel` states the table as
one boolean per row, exactly one of them true, and each column as the linear expression
Σ value · row over them: the degrees, the products the world size, the expert grid and the
global batch are stated on (each row's own), the step time, the peak memory and the complexity
rank. Presolve reads that at once, where an element constraint per column (as `size`'s model,
:mod:`planner.size_solver`, ties its columns to the row) is expanded into the same booleans
first. The objective is the step time in microseconds, ties broken towards the simpler layout
(one column: time · rows + rank); CP-SAT proves the optimum within the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from cost_models.memory import usable_bytes

from .bands import fit_limit
from .case import Case
from .complexity import RECOMPUTE_LEVEL, complexity
from .cpsat import Linear, Model
from .limits import MAX_GPUS
from .search_rows import Candidate
from .search_options import SearchSpec


@dataclass(frozen=True)
class Solution:
    status: str
    index: Optional[int]


def layout_columns(candidates: list[Candidate], global_batch: int) -> dict[str, list[int]]:
    """Each decision of the scored layouts as an integer column, one entry per row, and the
    row's step time (whole microseconds) and peak memory (whole MB)."""
    lays = [c.layout for c in candidates]
    partitions = sorted({lay.stage_layers or () for lay in lays})
    part_id = {p: i for i, p in enumerate(partitions)}
    return {
        "dp": [lay.dp for lay in lays], "tp": [lay.tp for lay in lays], "pp": [lay.pp for lay in lays],
        "cp": [lay.cp for lay in lays], "micro_batch_size": [lay.micro_batch_size for lay in lays],
        "grad_accum": [global_batch // (lay.micro_batch_size * lay.dp) for lay in lays],
        "zero_stage": [lay.zero_stage for lay in lays], "vpp": [lay.vpp for lay in lays],
        "ep": [lay.ep for lay in lays], "etp": [lay.expert_tp for lay in lays], "edp": [lay.edp for lay in lays],
        "sequence_parallel": [int(lay.sequence_parallel) for lay in lays],
        "recompute": [RECOMPUTE_LEVEL[lay.recompute] for lay in lays],
        "recompute_num_layers": [lay.recompute_num_layers or 0 for lay in lays],
        "partition": [part_id[lay.stage_layers or ()] for lay in lays],
        "step_time_us": [round(c.step_time_s * 1e6) for c in candidates],
        "peak_mb": [int(c.peak_bytes // 1e6) for c in candidates],
    }


def linked_variables(m: Model, row: int, columns: dict[str, list[int]]) -> dict[str, Linear]:
    """A variable per column, over the column's values, tied to the chosen row by an element
    constraint (CP-SAT propagates these far faster than a table over wide time domains)."""
    variables = {}
    for name, column in columns.items():
        variable = m.new_var(column or [0], name)
        m.add_element(row, column, variable)
        variables[name] = Linear.of(variable)
    return variables


def constrain_layout(m: Model, spec: SearchSpec, variables: dict[str, Linear], global_batch: int) -> None:
    """The global batch (micro_batch·accumulation·dp) and the pins and bounds of the case's
    ``search`` section, over the layout's variables."""
    def var(name: str) -> int:
        (index,) = variables[name].vars
        return index

    m.add_product(Linear((), (), global_batch), [var("micro_batch_size"), var("grad_accum"), var("dp")])
    # The expert grid etp·ep·edp folds over the attention's tp·cp·dp ranks (megatron-core parallel_state).
    stage_ranks = Linear.of(m.new_range(1, MAX_GPUS, "tp_cp_dp"))
    m.add_product(stage_ranks, [var("tp"), var("cp"), var("dp")])
    m.add_product(stage_ranks, [var("etp"), var("ep"), var("edp")])
    constrain_pins(m, spec, variables)


def constrain_pins(m: Model, spec: SearchSpec, variables: dict[str, Linear]) -> None:
    """The pins and bounds of the case's ``search`` section, over the layout's variables (or the
    linear expressions of the chosen row's values)."""
    for name in ("dp", "tp", "pp", "cp", "micro_batch_size", "zero_stage", "ep", "etp"):
        if name in spec.pins:
            m.add_equal(variables[name], spec.pins[name])
        low, high = spec.bounds.get(name, (None, None))
        if low is not None or high is not None:
            m.add_between(variables[name], low, high)


def complexity_ranks(candidates: list[Candidate], global_batch: int) -> list[int]:
    """Each row's rank from the simplest layout (0) up; ties by row order."""
    order = sorted(range(len(candidates)), key=lambda i: (complexity(candidates[i], global_batch), i))
    ranks = [0] * len(candidates)
    for r, i in enumerate(order):
        ranks[i] = r
    return ranks


def product_columns(columns: dict[str, list[int]]) -> dict[str, list[int]]:
    """Each row's products the model states its constraints on: GPUs (dp·tp·pp·cp), sequences
    per step (micro_batch·accumulation·dp), and the ranks the attention's grid (tp·cp·dp) and the
    expert grid (etp·ep·edp) fold over."""
    def product(*names: str) -> list[int]:
        return [math.prod(values) for values in zip(*(columns[name] for name in names))]
    return {"gpus": product("dp", "tp", "pp", "cp"), "sequences": product("micro_batch_size", "grad_accum", "dp"),
            "tp_cp_dp": product("tp", "cp", "dp"), "etp_ep_edp": product("etp", "ep", "edp")}


class LayoutModel:
    """The decision over the table of scored layouts: which row (:meth:`solve`), the rows already
    taken left out (:meth:`exclude`)."""

    def __init__(self, case: Case, spec: SearchSpec, candidates: list[Candidate]):
        self.candidates = candidates
        gbs = case.training.global_batch_size
        m = Model()
        self.model = m
        if not candidates:
            return  # nothing fits: solve() answers INFEASIBLE without a model

        self.rows = tuple(m.new_bool(f"row_{i}") for i in range(len(candidates)))
        m.add_exactly_one(self.rows)
        columns = layout_columns(candidates, gbs)
        columns.update(product_columns(columns))
        columns["complexity_rank"] = complexity_ranks(candidates, gbs)
        # Fastest, ties to the simplest: the rank (under the rows' count) breaks ties of whole microseconds.
        columns["objective"] = [time * len(candidates) + rank
                                for time, rank in zip(columns["step_time_us"], columns["complexity_rank"])]
        chosen = {name: Linear(self.rows, tuple(column)) for name, column in columns.items()}
        self.objective = chosen["objective"]
        m.add_equal(chosen["gpus"], case.cluster.num_gpus)
        m.add_equal(chosen["sequences"], gbs)
        m.add_equal(chosen["tp_cp_dp"] - chosen["etp_ep_edp"], 0)
        constrain_pins(m, spec, chosen)
        capacity_mb = int(fit_limit(usable_bytes(case.cluster.gpu, case.overheads, spec.headroom),
                                    case.model, case.cluster, case.training) / 1e6)
        m.add_between(chosen["peak_mb"], high=capacity_mb)

    def solve(self) -> Solution:
        """The fastest row left (ties to the simplest)."""
        m = self.model
        if not self.candidates:
            return Solution("INFEASIBLE", None)
        m.minimize(self.objective)
        answer = m.solve()
        if answer.found:
            return Solution(answer.status, next(i for i, row in enumerate(self.rows) if answer.values[row]))
        return Solution(answer.status, None)

    def exclude(self, index: int) -> None:
        self.model.add_equal(Linear.of(self.rows[index]), 0)
