"""The CP-SAT model that holds the decision.

Decision variables are the layout's degrees and choices. The model states the world size
(dp·tp·pp·cp = GPUs), the expert grid folded over the same ranks (etp·ep·edp = tp·cp·dp), the global batch (micro_batch·accumulation·dp = global batch), the
pins and bounds of the case's ``search`` section, and the memory limit; the nonlinear
step time and peak memory of each scored layout enter through a table constraint (one
row per layout from :mod:`planner.search`), as CP-SAT's documentation suggests for
tabulated costs. The objective is the step time in microseconds, ties broken towards
the simpler layout; CP-SAT proves the optimum within the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ortools.sat.python import cp_model

from .case import Case
from .complexity import RECOMPUTE_LEVEL, complexity
from .search import Candidate, SearchSpec

@dataclass(frozen=True)
class Solution:
    status: str
    index: Optional[int]


class LayoutModel:
    def __init__(self, case: Case, spec: SearchSpec, candidates: list[Candidate]):
        self.candidates = candidates
        gbs = case.training.global_batch_size
        n = case.cluster.num_gpus
        order = sorted(range(len(candidates)), key=lambda i: (complexity(candidates[i], gbs), i))
        self.rank = {i: r for r, i in enumerate(order)}
        partitions = sorted({c.layout.stage_layers or () for c in candidates})
        part_id = {p: i for i, p in enumerate(partitions)}

        m = cp_model.CpModel()
        self.model = m
        if not candidates:
            return  # nothing fits: solve() answers INFEASIBLE without a model

        def var(name: str, values) -> cp_model.IntVar:
            values = sorted(set(values)) or [0]
            return m.NewIntVarFromDomain(cp_model.Domain.FromValues(values), name)

        lays = [c.layout for c in candidates]
        self.idx = m.NewIntVar(0, max(len(candidates) - 1, 0), "row")
        dp = var("dp", [lay.dp for lay in lays])
        tp = var("tp", [lay.tp for lay in lays])
        pp = var("pp", [lay.pp for lay in lays])
        cp = var("cp", [lay.cp for lay in lays])
        mbs = var("micro_batch_size", [lay.micro_batch_size for lay in lays])
        gas = var("grad_accum", [gbs // (lay.micro_batch_size * lay.dp) for lay in lays])
        zero = var("zero_stage", [lay.zero_stage for lay in lays])
        ep = var("ep", [lay.ep for lay in lays])
        etp = var("etp", [lay.expert_tp for lay in lays])
        self.time_us = var("step_time_us", [round(c.step_time_s * 1e6) for c in candidates])
        mem_mb = var("peak_mb", [int(c.peak_bytes // 1e6) for c in candidates])
        rank = m.NewIntVar(0, max(len(candidates) - 1, 0), "complexity_rank")
        self.rank_var = rank
        rest = [var(name, values) for name, values in (
            ("vpp", [lay.vpp for lay in lays]),
            ("sequence_parallel", [int(lay.sequence_parallel) for lay in lays]),
            ("recompute", [RECOMPUTE_LEVEL[lay.recompute] for lay in lays]),
            ("recompute_num_layers", [lay.recompute_num_layers or 0 for lay in lays]),
            ("partition", [part_id[lay.stage_layers or ()] for lay in lays]),
        )]

        world = m.NewConstant(n)
        m.AddMultiplicationEquality(world, [dp, tp, pp, cp])
        m.AddMultiplicationEquality(m.NewConstant(gbs), [mbs, gas, dp])
        capacity_mb = int(case.cluster.gpu.memory_bytes * (1 - spec.headroom) / 1e6)
        m.Add(mem_mb <= capacity_mb)
        for name, variable in (("dp", dp), ("tp", tp), ("pp", pp), ("cp", cp), ("micro_batch_size", mbs),
                               ("zero_stage", zero), ("ep", ep), ("etp", etp)):
            if name in spec.pins:
                m.Add(variable == spec.pins[name])
            low, high = spec.bounds.get(name, (None, None))
            if low is not None:
                m.Add(variable >= low)
            if high is not None:
                m.Add(variable <= high)

        # Each scored layout is one index; every column is tied to it by an element constraint
        # (CP-SAT propagates these far faster than a table over wide time domains).
        m.AddElement(self.idx, [lay.dp for lay in lays], dp)
        m.AddElement(self.idx, [lay.tp for lay in lays], tp)
        m.AddElement(self.idx, [lay.pp for lay in lays], pp)
        m.AddElement(self.idx, [lay.cp for lay in lays], cp)
        m.AddElement(self.idx, [lay.micro_batch_size for lay in lays], mbs)
        m.AddElement(self.idx, [gbs // (lay.micro_batch_size * lay.dp) for lay in lays], gas)
        m.AddElement(self.idx, [lay.zero_stage for lay in lays], zero)
        m.AddElement(self.idx, [lay.ep for lay in lays], ep)
        m.AddElement(self.idx, [lay.expert_tp for lay in lays], etp)
        # The expert grid etp·ep·edp folds over the attention's tp·cp·dp ranks.
        edp = var("edp", [lay.edp for lay in lays])
        m.AddElement(self.idx, [lay.edp for lay in lays], edp)
        stage_ranks = m.NewIntVar(1, n, "tp_cp_dp")
        m.AddMultiplicationEquality(stage_ranks, [tp, cp, dp])
        m.AddMultiplicationEquality(stage_ranks, [etp, ep, edp])
        m.AddElement(self.idx, [round(c.step_time_s * 1e6) for c in candidates], self.time_us)
        m.AddElement(self.idx, [int(c.peak_bytes // 1e6) for c in candidates], mem_mb)
        m.AddElement(self.idx, [self.rank[i] for i in range(len(candidates))], rank)
        for variable, column in zip(rest, (
                [lay.vpp for lay in lays], [int(lay.sequence_parallel) for lay in lays],
                [RECOMPUTE_LEVEL[lay.recompute] for lay in lays], [lay.recompute_num_layers or 0 for lay in lays],
                [part_id[lay.stage_layers or ()] for lay in lays])):
            m.AddElement(self.idx, column, variable)

    def solve(self, time_limit_us: Optional[int] = None, simplest: bool = False) -> Solution:
        """Fastest row (ties to the simplest), or with ``simplest`` the simplest row within ``time_limit_us``."""
        m = self.model
        if not self.candidates:
            return Solution("INFEASIBLE", None)
        m.ClearAssumptions()
        if time_limit_us is not None:
            # Enforced through an assumption, so that it binds this solve only.
            within = m.NewBoolVar(f"within_{time_limit_us}")
            m.Add(self.time_us <= time_limit_us).OnlyEnforceIf(within)
            m.AddAssumptions([within])
        if simplest:
            m.Minimize(self.rank_var)
        else:
            m.Minimize(self.time_us * len(self.candidates) + self.rank_var)
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1  # the table is small; one worker is fastest and deterministic
        # Ctrl-C must interrupt `plan` (exit 130), not end the search early as a time limit would.
        solver.parameters.catch_sigint_signal = False
        status = solver.Solve(m)
        m.ClearAssumptions()
        name = solver.StatusName(status)
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return Solution(name, solver.Value(self.idx))
        return Solution(name, None)

    def exclude(self, index: int) -> None:
        self.model.Add(self.idx != index)
