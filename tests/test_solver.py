"""The CP-SAT model of `plan`: the fastest row, ties to the simplest; the runners-up in order; and
rows that break the world size, the global batch, the expert grid, a pin or the memory limit are
never chosen, however fast."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.case import load_case
from planner.complexity import complexity
from planner.search import search
from planner.search_rows import Candidate
from planner.solver import LayoutModel

CASE = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
        "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16"}, "search": {"target": "megatron"}}


@pytest.fixture(scope="module")
def table():
    case = load_case(CASE, ignore_layout=True)
    return case, search(case, case.search, keep_within=0.05).candidates


def order(case, candidates: list[Candidate]) -> list[int]:
    """Rows fastest first (whole microseconds), ties to the simplest, then to the earlier row."""
    gbs = case.training.global_batch_size
    return sorted(range(len(candidates)),
                  key=lambda i: (round(candidates[i].step_time_s * 1e6), complexity(candidates[i], gbs), i))


def test_the_fastest_row_and_its_runners_up_in_order(table):
    case, candidates = table
    model = LayoutModel(case, case.search, candidates)
    picked = []
    for _ in range(4):
        solution = model.solve()
        assert solution.status == "OPTIMAL"
        picked.append(solution.index)
        model.exclude(solution.index)
    assert picked == order(case, candidates)[:4]


@pytest.mark.parametrize("change", [
    lambda lay: {"dp": 2 * lay.dp},  # twice the cluster's GPUs
    lambda lay: {"micro_batch_size": 3},  # 3 · accumulation · dp is not the global batch
    lambda lay: {"ep": 2 * lay.tp * lay.cp * lay.dp},  # an expert grid wider than the ranks it folds over
])
def test_a_row_that_breaks_the_grid_or_the_batch_is_never_chosen(table, change):
    case, candidates = table
    fastest = candidates[order(case, candidates)[0]]
    broken = Candidate(replace(fastest.layout, **change(fastest.layout)), fastest.step_time_s / 2, fastest.peak_bytes)
    assert LayoutModel(case, case.search, [broken] + candidates).solve().index != 0


def test_a_pin_and_the_memory_limit_are_obeyed(table):
    case, candidates = table
    fastest = candidates[order(case, candidates)[0]]
    too_big = Candidate(fastest.layout, fastest.step_time_s / 2, case.cluster.gpu.memory_bytes * 2)
    assert LayoutModel(case, case.search, [too_big] + candidates).solve().index != 0
    pinned = replace(case.search, pins={"pp": fastest.layout.pp * 2})
    index = LayoutModel(case, pinned, candidates).solve().index
    assert index is None or candidates[index].layout.pp == fastest.layout.pp * 2
