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


def in_flight_chunks(pp: int, vpp: int, microbatches: int, stage: int) -> int:
    """Model-chunk micro-batches whose activations stage ``stage`` holds at its peak."""
    if vpp == 1:
        return min(pp - stage, microbatches)
    warmup = (pp - stage - 1) * 2 + (vpp - 1) * pp
    return min(warmup + 1, microbatches * vpp)


def bubble_fraction(pp: int, vpp: int, microbatches: int) -> float:
    """Pipeline bubble over ideal compute time: (p − 1)/(v·m) (Narayanan et al. 2021, §2.2.1–2.2.2)."""
    return (pp - 1) / (vpp * microbatches)
