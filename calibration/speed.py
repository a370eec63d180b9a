"""The machine's speed now against its speed when it was profiled: one reference GEMM.

A shared host can slow down with no process of its own to show for it: another tenant of
the physical machine takes memory bandwidth and cache, which a virtual machine sees neither
as other processes nor as steal time. On this project's 2-core machine (2026-12-01), a
one-thread 1024³ fp32 GEMM ran 0.157 TFLOP/s at 14:30 and 0.129 at 14:41 with nothing else
running, and every layout of ``bench/validate_loop.py`` measured 4–26 % slower than the
profile taken minutes before predicted.

So `calibrate` times this GEMM just before its ranks start and just after they end, and the
profile keeps both (``machine.reference_gemm_tflops``); `validate` times it before and after
each run. A machine that runs it more than :data:`SLOWER_SHARE` below the profile's speed is
a slower machine than the one profiled: `validate` refuses to measure on it (or, asked to,
warns), and says so when it slows during a run. CPUs only: a GPU's throughput is not shared
this way, and its other users show in its utilisation (:func:`host.gpu_use`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Optional

# The GEMM a rank of the CPU loop spends most of its time in, at about the loop's sizes.
REFERENCE_SIZE = 1024
REPEATS = 15
# Slower than the profile by more than this share, a step's timing describes another machine: it
# alone would spend more than the loop's whole error budget (issue 18: mean |error| ≤ 8 %).
SLOWER_SHARE = 0.10


def reference_gemm_tflops(threads: int) -> float:
    """TFLOP/s of a 1024³ fp32 GEMM on ``threads`` threads, as one rank runs it: the median of
    :data:`REPEATS` timings after two warm-up calls."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(REFERENCE_SIZE, REFERENCE_SIZE), torch.randn(REFERENCE_SIZE, REFERENCE_SIZE)
        for _ in range(2):
            a @ b
        seconds = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            a @ b
            seconds.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    return 2 * REFERENCE_SIZE**3 / statistics.median(seconds) / 1e12


def profiled_speed(machine: dict[str, Any]) -> Optional[float]:
    """The reference GEMM's TFLOP/s while the profile was measured (the mean of the figures taken
    before and after its ranks ran), or None for a profile that did not time it."""
    timed = machine.get("reference_gemm_tflops")
    if not isinstance(timed, dict):
        return None
    figures = [v for v in (timed.get("before"), timed.get("after")) if isinstance(v, (int, float)) and v > 0]
    return statistics.mean(figures) if figures else None


def unchecked_reason(profile: str, machine: dict[str, Any]) -> Optional[str]:
    """Why `validate` cannot check this machine's speed against a CPU profile's, or None where it can:
    a profile without the reference GEMM's figures (one written before `calibrate` timed it, as the
    repo's own ``calibration/profiles/cpu-2core-dev.yaml``) gives no speed to compare with, and a
    slower machine than the one profiled would pass unnoticed. Said, not refused: the documented
    refusal is of a machine shown to be slower, and this one is not shown either way."""
    if profiled_speed(machine) is not None:
        return None
    state = "missing" if "reference_gemm_tflops" not in machine else "holds no figure"
    return (f"{profile}: machine.reference_gemm_tflops: {state} (the reference GEMM's speed when the profile was "
            "measured, which `calibrate` records): this machine's speed is not checked against the profile's, so "
            f"a machine more than {SLOWER_SHARE:.0%} slower than the one profiled is not refused; calibrate again "
            "to have it checked")


def moved_reason(before: float, after: float) -> Optional[str]:
    """Why a calibration whose machine changed speed under it describes neither machine, or None."""
    if abs(after / before - 1) <= SLOWER_SHARE:
        return None
    return (f"this machine's speed moved during the calibration (reference GEMM {before:.3g} TFLOP/s before the "
            f"ranks, {after:.3g} after): the profile mixes two machines; calibrate again when it is quiet")


@dataclass(frozen=True)
class Speed:
    """The reference GEMM's TFLOP/s when the profile was measured, and just before and after a run."""

    profiled: float
    before: float
    after: Optional[float] = None

    @property
    def slowest(self) -> float:
        return self.before if self.after is None else min(self.before, self.after)

    @property
    def ratio(self) -> float:
        """The slower of the two timings over the profile's: below 1, the run met a slower machine."""
        return self.slowest / self.profiled

    def slower_reason(self) -> Optional[str]:
        """Why timings taken beside these figures describe a slower machine than the profile's, or None."""
        if self.ratio >= 1 - SLOWER_SHARE:
            return None
        return (f"this machine runs the reference GEMM {1 - self.ratio:.0%} slower than when it was profiled "
                f"({self.slowest:.3g} against {self.profiled:.3g} TFLOP/s; more than {SLOWER_SHARE:.0%})")

    def to_dict(self) -> dict[str, Any]:
        return {"profiled": self.profiled, "before": self.before, "after": self.after, "ratio": self.ratio}
