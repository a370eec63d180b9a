"""Pipeline schedules: micro-batches in flight per stage, and the bubble.

Narayanan et al. 2021 (Megatron-LM, SC21), §2.2: under 1F1B, stage i of p
(0-based) runs p − i forward passes before its first backward, so it holds
activations of min(p − i, m) micro-batches. With v interleaved model chunks per
rank, Megatron's warm-up (``megatron/core/pipeline_parallel/schedules.py``,
``forward_backward_pipelining_with_interleaving``) runs (p − i − 1)·2 + (v − 1)·p
chunk forwards before the steady state, so one more chunk is in flight at the
peak. For the first stage that is L·(1 + (p − 1)/(p·v)) layer-activations,
Korthikanti et al. 2022 §4.2.3. torch's ScheduleInterleaved1F1B (torchtitan's) runs the
same schedule in rounds of :func:`microbatches_per_round` micro-batches of a chunk, p
wherever p divides m, so that it also runs micro-batch counts p does not divide.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional, Sequence


def interleaving_round_count(pp: int, microbatches: int) -> int:
    """The rounds torch's ScheduleInterleaved1F1B runs a step's micro-batches in
    (``torch/distributed/pipelining/schedules.py``, "flex_pp"): number_of_rounds = max(1, m // p)."""
    return max(1, microbatches // pp)


def microbatches_per_round(pp: int, microbatches: int) -> int:
    """The micro-batches a pipeline rank runs through one model chunk before it turns to its next
    (a round) under interleaving. torch's ScheduleInterleaved1F1B, which torchtitan builds
    (``torch/distributed/pipelining/schedules.py``, "flex_pp"): number_of_rounds =
    max(1, m // p), microbatches_per_round = m // number_of_rounds (m where m < p; more than p
    where p does not divide m ≥ p). Wherever p divides m that is p, megatron-core's
    ``microbatch_group_size_per_vp_stage`` (its default, the only one Megatron-LM and the
    other engines' interleaving run, all of them needing p to divide m: :func:`interleaving_refusal`)."""
    return microbatches // interleaving_round_count(pp, microbatches)


def interleaving_refusal(pp: int, microbatches: int, rounds: bool) -> Optional[str]:
    """Why an interleaved schedule cannot run ``microbatches`` a step on ``pp`` stages; None if it can.
    ``rounds``: the engine runs torch's ScheduleInterleaved1F1B (``torch/distributed/pipelining/
    schedules.py``), which raises ValueError unless its max(1, m // p) rounds divide m
    (:func:`microbatches_per_round`); the others' micro-batch groups of p need p to divide m
    (megatron-core's ``schedules.py``, forward_backward_pipelining_with_interleaving)."""
    if rounds:
        count = interleaving_round_count(pp, microbatches)
        if microbatches % count:
            return (f"torch's ScheduleInterleaved1F1B runs the {microbatches} micro-batches per step in "
                    f"max(1, m // pp) = {count} rounds: they must divide by it (\"Interleaved 1F1B requires the "
                    f"number of microbatches to be a multiple of the number of rounds ({count}), but got "
                    f"{microbatches}.\")")
        return None
    if microbatches % pp:
        return f"interleaving needs micro-batches per step ({microbatches}) divisible by pp {pp}"
    return None


def round_stall_passes(pp: int, vpp: int, microbatches: int) -> int:
    """Model-chunk passes (a forward and a backward) every rank waits in an interleaved step beyond
    the fill and drain, at equal stages: (v − 1)·max(0, p − g) for rounds of g micro-batches
    (:func:`microbatches_per_round`). With g < p (fewer micro-batches than stages: torch's
    ScheduleInterleaved1F1B, ``torch/distributed/pipelining/schedules.py``, runs them in one round)
    a rank is through a chunk's round before the round's first micro-batch is back from the
    other ranks: each of its v − 1 turns to the next chunk waits p − g passes for it, forward and
    backward, and the step is that micro-batch's way through all p·v chunks and back and the
    other m − 1 behind it, p·v + m − 1 passes in place of m·v + p − 1. 0 where g ≥ p."""
    return (vpp - 1) * max(0, pp - microbatches_per_round(pp, microbatches))


def interleaved_warmup(pp: int, vpp: int, microbatches: int, stage: int) -> int:
    """Chunk forwards rank ``stage`` runs before its steady state under interleaving, uncapped:
    2·(p − 1 − stage) + (v − 1)·g for rounds of g micro-batches (:func:`microbatches_per_round`).
    torch's _get_warmup_ops (``torch/distributed/pipelining/schedules.py``, ScheduleInterleaved1F1B):
    (n_local_stages − 1)·microbatches_per_round + 2·((pp − 1) − rank); Megatron's
    (``schedules.py``, forward_backward_pipelining_with_interleaving) the same with g = p."""
    return (pp - stage - 1) * 2 + (vpp - 1) * microbatches_per_round(pp, microbatches)


def in_flight_chunks(pp: int, vpp: int, microbatches: int, stage: int) -> int:
    """Model-chunk micro-batches whose activations stage ``stage`` holds at its peak: its warm-up
    forwards and the steady state's first, (v − 1)·g + 2·(p − 1 − stage) + 1 for rounds of g
    micro-batches (:func:`microbatches_per_round`), all m·v at most. torch's _get_warmup_ops
    (``torch/distributed/pipelining/schedules.py``, ScheduleInterleaved1F1B): (n_local_stages − 1)·
    microbatches_per_round + 2·((pp − 1) − rank), capped at m·v; Megatron's the same with g = p."""
    if vpp == 1:
        return min(pp - stage, microbatches)
    return min(interleaved_warmup(pp, vpp, microbatches, stage) + 1, microbatches * vpp)


def in_flight_peak(pp: int, vpp: int, microbatches: int, stage: int, per_chunk: Sequence[float],
                   chunk: Optional[int] = None) -> float:
    """The most that stage ``stage`` holds at once of what each of its model chunks keeps per
    micro-batch in flight (``per_chunk``, the rank's chunks in model order); with ``chunk``, the
    most it holds right after a forward of that chunk (the last stage's last chunk: the LM head's).

    Megatron runs each rank's forwards and backwards by its schedule table
    (``schedules.get_schedule_table``, ``microbatch_group_size_per_vp_stage`` = p), torch's
    ScheduleInterleaved1F1B by its forward_stage_index and backward_stage_index in rounds of g
    (:func:`microbatches_per_round`; p wherever p divides m): the k-th forward is of chunk
    ⌊k/g⌋ mod v, the j-th backward of chunk v − 1 − ⌊j/g⌋ mod v. The warm-up
    runs its forwards (:func:`in_flight_chunks`), then each steady-state step one forward before
    one backward, so the first chunk's forwards run ahead of its backwards: with chunks of unequal
    size the peak is where the heavy ones are most in flight, which may come after the warm-up.
    The composition repeats every g·v steps. Chunks of one size: :func:`in_flight_chunks` of them."""
    if vpp == 1 or (len(set(per_chunk)) == 1 and chunk is None):
        return in_flight_chunks(pp, vpp, microbatches, stage) * max(per_chunk)
    return _in_flight_walk(pp, vpp, microbatches, stage, tuple(per_chunk), chunk)


# The walk through a schedule's moments is asked again for the same chunks' figures: a search prices
# a layout's stages at each rung of its recomputation ladder, and many rungs and layouts hold the same
# per-chunk figures (the 70B's plan with no engine named: 951 walks, 176 distinct; Mixtral's 267, 35).
@lru_cache(maxsize=4096)
def _in_flight_walk(pp: int, vpp: int, microbatches: int, stage: int, per_chunk: tuple[float, ...],
                    chunk: Optional[int]) -> float:
    """:func:`in_flight_peak` by its schedule's moments, for chunks of unequal size or ``chunk``."""
    start, steps = _in_flight_steps(pp, vpp, microbatches, stage)
    held, peak = 0.0, 0.0
    group = microbatches_per_round(pp, microbatches)
    for k in range(sum(start)):  # the warm-up's k-th forward is of chunk ⌊k/g⌋ mod v
        held += per_chunk[(k // group) % vpp]
        if chunk is None or (k // group) % vpp == chunk:
            peak = max(peak, held)
    # Each steady-state step adds one chunk's micro-batch (where the rank can peak) and then
    # frees one: the held total moves by two chunks' figures a step, not a sum over all v.
    for added, freed in steps:
        held += per_chunk[added]
        if chunk is None or added == chunk:
            peak = max(peak, held)
        held -= per_chunk[freed]
    return peak


# Asked once per stage memory (Mixtral's plan with no engine named: 1,665 times, 12 distinct).
@lru_cache(maxsize=1024)
def first_chunk_in_flight(pp: int, vpp: int, microbatches: int) -> int:
    """Micro-batches of the first stage's first model chunk in flight at once: what the embedding's
    saved tensors (its dropout mask) are held for, by the schedule of :func:`in_flight_peak` (the
    first chunk alone holds the embedding; all v chunks' micro-batches were counted)."""
    return round(in_flight_peak(pp, vpp, microbatches, 0, [1.0] + [0.0] * (vpp - 1)))


@lru_cache(maxsize=1024)
def _in_flight_steps(pp: int, vpp: int, microbatches: int, stage: int) \
        -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """Micro-batches in flight per chunk after the warm-up's last forward, and for each
    steady-state step the chunk whose forward adds one (the rank can peak after it) and the chunk
    whose backward then frees one (one period of g·v steps suffices, g: :func:`microbatches_per_round`)."""
    forwards = microbatches * vpp
    group = microbatches_per_round(pp, microbatches)
    warmup = min(interleaved_warmup(pp, vpp, microbatches, stage), forwards)
    held = [0] * vpp
    for k in range(warmup):
        held[(k // group) % vpp] += 1
    steps = tuple((((warmup + j) // group) % vpp, vpp - 1 - (j // group) % vpp)
                  for j in range(min(forwards - warmup, group * vpp)))
    return tuple(held), steps
