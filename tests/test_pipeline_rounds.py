"""torchtitan's interleaved pipelines at any micro-batch count torch's ScheduleInterleaved1F1B runs
(``torch/distributed/pipelining/schedules.py``, its "flex_pp": max(1, m // pp) rounds that must
divide m), priced as torch's own schedule runs: the order of every rank's passes is built by torch
(no process group: its ``pipeline_order`` is computed in ``__init__`` from the stages' ranks alone)
and simulated pass by pass, against the cost model's bubble and activations in flight."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")

import planner  # noqa: E402
from cost_models.pipeline import first_chunk_in_flight, in_flight_chunks, in_flight_peak  # noqa: E402
from cost_models.pipeline_time import Pipeline  # noqa: E402
from cost_models.stage_time import stage_time  # noqa: E402
from planner.errors import CaseError  # noqa: E402

FORWARD = torch_schedules._ComputationType.FORWARD


def torch_order(pp: int, vpp: int, m: int) -> dict[int, list]:
    """Each rank's passes in the order torch's ScheduleInterleaved1F1B runs them (its no-op slots
    dropped): built by torch itself, on stand-in stages that carry only their place."""
    stages = [SimpleNamespace(group_size=pp, group_rank=0, num_stages=pp * vpp, stage_index=pp * v,
                              is_first=v == 0, is_last=pp * v == pp * vpp - 1) for v in range(vpp)]
    schedule = torch_schedules.ScheduleInterleaved1F1B(stages, m)
    return {rank: [a for a in actions if a is not None] for rank, actions in schedule.pipeline_order.items()}


def simulate(pp: int, vpp: int, m: int, forward: list[float], backward: list[float]) -> float:
    """The step of torch's order, each rank running its passes in turn: a chunk's forward waits for
    the previous virtual stage's forward of the micro-batch, its backward for its own forward and the
    next virtual stage's backward (sends take no time); rank r's chunk passes take forward[r] and
    backward[r]."""
    order, last = torch_order(pp, vpp, m), pp * vpp - 1
    done: dict[tuple, float] = {}
    clock, position = [0.0] * pp, [0] * pp
    moved = True
    while moved:
        moved = False
        for r in range(pp):
            while position[r] < len(order[r]):
                a = order[r][position[r]]
                s, j = a.stage_index, a.microbatch_index
                if a.computation_type == FORWARD:
                    key, after, took = ("F", s, j), ([("F", s - 1, j)] if s > 0 else []), forward[r]
                else:
                    key, took = ("B", s, j), backward[r]
                    after = [("F", s, j)] + ([("B", s + 1, j)] if s < last else [])
                if any(d not in done for d in after):
                    break
                clock[r] = done[key] = max([clock[r]] + [done[d] for d in after]) + took
                position[r] += 1
                moved = True
    assert position == [len(order[r]) for r in range(pp)], "torch's order deadlocked"
    return max(clock)


def held_peak(pp: int, vpp: int, m: int, rank: int, per_chunk: list[float], chunk=None) -> float:
    """The most rank ``rank`` holds at once of what each of its chunks keeps per micro-batch in flight,
    by torch's order (a forward adds its chunk's, its backward frees it); with ``chunk``, right after
    a forward of that chunk."""
    held = peak = 0.0
    for a in torch_order(pp, vpp, m)[rank]:
        local = a.stage_index // pp
        if a.computation_type == FORWARD:
            held += per_chunk[local]
            if chunk is None or local == chunk:
                peak = max(peak, held)
        else:
            held -= per_chunk[local]
    return peak


# (pp, vpp, m) torch runs: m a multiple of pp (priced as before), m ≥ pp that pp does not divide
# (rounds of more than pp) and m < pp (one round of m).
RUNS = [(4, 2, 8), (4, 2, 12), (2, 4, 6), (8, 2, 16),
        (4, 2, 10), (4, 2, 6), (4, 2, 5), (4, 3, 10), (8, 2, 18), (8, 2, 12), (2, 2, 3), (3, 2, 8), (8, 4, 9),
        (4, 2, 3), (4, 2, 2), (4, 3, 2), (8, 2, 5), (8, 4, 3), (4, 2, 1)]


def test_torchtitan_refuses_exactly_the_micro_batch_counts_torch_does():
    """pp 4, vpp 2 on Llama 2 7B and 8 GPUs (dp 2), m = global batch / 2: torch's constructor raises
    for m = 9 (2 rounds), 11, 13, 14 (3 rounds) ..., and runs 10 (2 rounds of 5), 6 (1 round of 6) and
    3 (1 round of 3), all of which the planner refused for pp not dividing them; Megatron-LM's groups of pp
    still need pp to divide m."""
    def case(m: int, engine: str = "torchtitan") -> dict:
        return {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
                "training": {"global_batch_size": 2 * m, "seq_len": 4096, "engine": engine},
                "layout": {"dp": 2, "pp": 4, "vpp": 2, "micro_batch_size": 1,
                           "zero_stage": 3 if engine == "torchtitan" else 1}}
    for m in range(1, 26):
        try:
            torch_order(4, 2, m)
            said = None
        except ValueError as refused:
            said = str(refused)
        if said is None:
            assert planner.estimate(case(m)).job.num_microbatches == m
        else:
            with pytest.raises(CaseError) as refused:
                planner.estimate(case(m))
            assert refused.value.key == "layout.vpp" and said in str(refused.value)
    with pytest.raises(CaseError, match=r"divisible by pp 4"):
        planner.estimate(case(10, "megatron"))


@pytest.mark.parametrize("pp, vpp, m", RUNS)
def test_activations_in_flight_are_torchs_schedules(pp, vpp, m):
    """Every rank's chunks in flight at its peak (the first stage's: its warm-up of (v − 1)·g + 2(p − 1)
    forwards for rounds of g = m // max(1, m // p), and one more), the first chunk's alone (the
    embedding's), and with chunks of unequal size the weighted peak and the last rank's right after a
    forward of its last chunk (its LM head's), all as torch's order holds them."""
    rng = random.Random(pp * 1000 + vpp * 100 + m)
    for rank in range(pp):
        assert in_flight_chunks(pp, vpp, m, rank) == held_peak(pp, vpp, m, rank, [1.0] * vpp)
        sizes = [float(rng.randint(1, 5)) for _ in range(vpp)]
        assert in_flight_peak(pp, vpp, m, rank, sizes) == held_peak(pp, vpp, m, rank, sizes)
    assert first_chunk_in_flight(pp, vpp, m) == held_peak(pp, vpp, m, 0, [1.0] + [0.0] * (vpp - 1))
    sizes = [float(rng.randint(1, 5)) for _ in range(vpp)]
    assert in_flight_peak(pp, vpp, m, pp - 1, sizes, chunk=vpp - 1) == \
        held_peak(pp, vpp, m, pp - 1, sizes, chunk=vpp - 1)


def test_multiples_of_pp_hold_what_they_held():
    """Where pp divides m the rounds are of pp micro-batches, as before: (p − 1 − r)·2 + (v − 1)·p + 1."""
    for pp, vpp, m in [(4, 2, 8), (8, 4, 64), (2, 3, 4), (8, 2, 8)]:
        for rank in range(pp):
            assert in_flight_chunks(pp, vpp, m, rank) == min((pp - 1 - rank) * 2 + (vpp - 1) * pp + 1, m * vpp)


@pytest.mark.parametrize("pp, vpp, m", RUNS)
def test_the_step_is_torchs_schedules(pp, vpp, m):
    """``Pipeline.least_step`` (m·T_max and the bubble) against torch's order simulated, each chunk
    pass a third forward and two thirds backward of its rank's time a micro-batch T_r over v: exact at
    equal stages and where the last stage is the slowest (it runs the LM head), a bound over the
    schedule where a stage before it is (its warm-up forwards run in the fill). With m < p the rounds
    of m leave every rank waiting for the round's first micro-batch at each turn to its next chunk:
    (p − m)(v − 1) chunk passes more than m·v + p − 1."""
    job = SimpleNamespace(layout=SimpleNamespace(pp=pp, vpp=vpp), num_microbatches=m)
    shapes = {"equal": [1.0] * pp, "last": [1.0] * (pp - 1) + [1.5], "last_much": [1.0] * (pp - 1) + [3.0],
              "first": [1.5] + [1.0] * (pp - 1), "mixed": [1.0 + 0.1 * ((7 * r) % 5) for r in range(pp)]}
    for shape, times in shapes.items():
        model = Pipeline(tuple(range(pp)), SimpleNamespace(total=max(times)), sum(times)).least_step(job)
        simulated = simulate(pp, vpp, m, [t / vpp / 3 for t in times], [2 * t / vpp / 3 for t in times])
        if shape in ("equal", "last", "last_much"):
            assert model == pytest.approx(simulated, rel=1e-12), shape
        else:
            assert simulated <= model * (1 + 1e-12), shape
    passes = m * vpp + pp - 1 + (vpp - 1) * max(0, pp - m)
    assert simulate(pp, vpp, m, [1.0] * pp, [2.0] * pp) == pytest.approx(3.0 * passes)


@pytest.mark.parametrize("m", [10, 6, 3])
def test_a_torchtitan_job_at_micro_batches_pp_does_not_divide_is_priced_as_torch_runs_it(m):
    """Llama 2 7B on 8 GPUs, pp 4, vpp 2, m = 10, 6 and 3: the job's own stage times through torch's
    order simulated, its step (``Pipeline.least_step``) as the model prices it, and its first stage's
    activations the warm-up's (torch's _get_warmup_ops: (v − 1)·g + 2(p − 1), and one more)."""
    case = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 2 * m, "seq_len": 4096, "engine": "torchtitan"},
            "layout": {"dp": 2, "pp": 4, "vpp": 2, "micro_batch_size": 1, "zero_stage": 3}}
    estimate = planner.estimate(case)
    job = estimate.job
    times = [stage_time(job, r).total for r in range(4)]
    assert times[-1] == max(times)  # the LM head's stage
    stages = Pipeline(tuple(range(4)), stage_time(job, 3), sum(times))
    simulated = simulate(4, 2, m, [t / 6 for t in times], [t / 3 for t in times])
    assert stages.least_step(job) == pytest.approx(simulated, rel=1e-9)
    group = m // max(1, m // 4)
    assert in_flight_chunks(4, 2, m, 0) == min(group + 2 * 3 + 1, 2 * m) == held_peak(4, 2, m, 0, [1.0, 1.0])
