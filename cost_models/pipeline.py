"""Pipeline schedules: micro-batches in flight per stage, and the bubble.

Narayanan et al. 2021 (Megatron-LM, SC21), §2.2: under 1F1B, stage i of p
(0-based) runs p − i forward passes before its first backward, so it holds
activations of min(p − i, m) micro-batches. With v interleaved model chunks per
rank, Megatron's warm-up (``megatron/core/pipeline_parallel/schedules.py``,
``forward_backward_pipelining_with_interleaving``) runs (p − i − 1)·2 + (v − 1)·p
chunk forwards before the steady state, so one more chunk is in flight at the
peak. For the first stage that is L·(1 + (p − 1)/(p·v)) layer-activations,
Korthikanti et al. 2022 §4.2.3.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional, Sequence


def in_flight_chunks(pp: int, vpp: int, microbatches: int, stage: int) -> int:
    """Model-chunk micro-batches whose activations stage ``stage`` holds at its peak."""
    if vpp == 1:
        return min(pp - stage, microbatches)
    warmup = (pp - stage - 1) * 2 + (vpp - 1) * pp
    return min(warmup + 1, microbatches * vpp)


def in_flight_peak(pp: int, vpp: int, microbatches: int, stage: int, per_chunk: Sequence[float],
                   chunk: Optional[int] = None) -> float:
    """The most that stage ``stage`` holds at once of what each of its model chunks keeps per
    micro-batch in flight (``per_chunk``, the rank's chunks in model order); with ``chunk``, the
    most it holds right after a forward of that chunk (the last stage's last chunk: the LM head's).

    Megatron runs each rank's forwards and backwards by its schedule table
    (``schedules.get_schedule_table``, ``microbatch_group_size_per_vp_stage`` = p): the k-th
    forward is of chunk ⌊k/p⌋ mod v, the j-th backward of chunk v − 1 − ⌊j/p⌋ mod v. The warm-up
    runs its forwards (:func:`in_flight_chunks`), then each steady-state step one forward before
    one backward, so the first chunk's forwards run ahead of its backwards: with chunks of unequal
    size the peak is where the heavy ones are most in flight, which may come after the warm-up.
    The composition repeats every p·v steps. Chunks of one size: :func:`in_flight_chunks` of them."""
    if vpp == 1 or (len(set(per_chunk)) == 1 and chunk is None):
        return in_flight_chunks(pp, vpp, microbatches, stage) * max(per_chunk)
    start, steps = _in_flight_steps(pp, vpp, microbatches, stage)
    held, peak = 0.0, 0.0
    for k in range(sum(start)):  # the warm-up's k-th forward is of chunk ⌊k/p⌋ mod v
        held += per_chunk[(k // pp) % vpp]
        if chunk is None or (k // pp) % vpp == chunk:
            peak = max(peak, held)
    # Each steady-state step adds one chunk's micro-batch (where the rank can peak) and then
    # frees one: the held total moves by two chunks' figures a step, not a sum over all v.
    for added, freed in steps:
        held += per_chunk[added]
        if chunk is None or added == chunk:
            peak = max(peak, held)
        held -= per_chunk[freed]
    return peak


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
    whose backward then frees one (one period of p·v steps suffices)."""
    forwards = microbatches * vpp
    warmup = min((pp - stage - 1) * 2 + (vpp - 1) * pp, forwards)
    held = [0] * vpp
    for k in range(warmup):
        held[(k // pp) % vpp] += 1
    steps = tuple((((warmup + j) // pp) % vpp, vpp - 1 - (j // pp) % vpp)
                  for j in range(min(forwards - warmup, pp * vpp)))
    return tuple(held), steps
