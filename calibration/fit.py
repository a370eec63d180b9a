"""Least-squares fits of the cost model's own formulas to measured times.

Each fit is the formula ``cost_models`` evaluates, solved for its figures:

- GEMM (``cost_models.kernels.gemm_time``, compute-bound branch):
  ``t = F / (η · peak) + t₀`` for η (``gemm_efficiency``, at most 1) and t₀
  (``kernel_overhead_s``, at least 0).
- Attention, forward + backward (``cost_models.kernels.flash_attention_time``; its backward
  takes 2.5 forward passes, as FlashAttention counts it):
  ``t = 3.5 · (F_fwd / (η_attn · q · peak) + t₀)`` for η_attn, with q the shape efficiency
  (``attention_shape_efficiency``) and t₀ taken from the GEMM fit.
- Collectives (``cost_models.collectives.collective_time`` and ``p2p_time``):
  ``t = steps · α + volume / B`` for α (``link_latency_s``) and the bus bandwidth B,
  with the cost model's steps and volume factors for the group size; α from all sizes (the
  small ones dominate it), B from the large ones alone (:func:`fit_collective`).

The fits minimise the *relative* squared error, Σ ((model − t) / t)²: timings span
microseconds to seconds, and an absolute fit would let the largest sizes alone set
both figures (the fixed cost would be lost in their noise). Data made by the formula
is recovered exactly either way. Pure Python: no torch, no numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from cost_models.behaviour import EngineBehaviour
from cost_models.collectives import VOLUME, algorithm_steps, volume_per_gpu

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "p2p")

# Messages at least this large set a collective's bus bandwidth: the smallest gradient bucket the
# cost model reduces (PyTorch DDP's bucket_cap_mb = 25 MB, EngineBehaviour's default; Megatron's
# 40 M parameters and DeepSpeed's 5e8 elements are larger), the message the bandwidth mostly prices.
BANDWIDTH_FIT_BYTES = EngineBehaviour.bucket_bytes


@dataclass(frozen=True)
class LinearFit:
    """``y ≈ p·u + q·v`` with ``p ≥ p_min``, ``q ≥ q_min``; ``rms_rel_error`` over the points."""

    p: float
    q: float
    rms_rel_error: float


def fit_two(u: Sequence[float], v: Sequence[float], y: Sequence[float], *,
            p_min: float = 0.0, q_min: float = 0.0) -> LinearFit:
    """Weighted least squares for ``y = p·u + q·v`` inside the box p ≥ p_min, q ≥ q_min.

    Weights are 1/y² (relative error). The objective is a convex quadratic, so its
    minimum over the box is the unconstrained one if that is inside, else the best of
    the one-dimensional minima on the two edges (each clamped to its own bound).
    """
    if not (len(u) == len(v) == len(y)) or not y:
        raise ValueError("fit_two: u, v and y need the same, non-zero length")
    if any(not math.isfinite(t) or t <= 0 for t in y):
        raise ValueError("fit_two: times must be positive and finite")
    w = [1.0 / (t * t) for t in y]
    suu = sum(wi * a * a for wi, a in zip(w, u))
    svv = sum(wi * b * b for wi, b in zip(w, v))
    suv = sum(wi * a * b for wi, a, b in zip(w, u, v))
    suy = sum(wi * a * t for wi, a, t in zip(w, u, y))
    svy = sum(wi * b * t for wi, b, t in zip(w, v, y))

    def sse(p: float, q: float) -> float:
        return sum(wi * (p * a + q * b - t) ** 2 for wi, a, b, t in zip(w, u, v, y))

    candidates: list[tuple[float, float]] = []
    det = suu * svv - suv * suv
    if det > 1e-12 * suu * svv:
        p = (suy * svv - svy * suv) / det
        q = (svy * suu - suy * suv) / det
        if p >= p_min and q >= q_min:
            candidates.append((p, q))
    if svv > 0:  # edge p = p_min: best q
        candidates.append((p_min, max(q_min, (svy - p_min * suv) / svv)))
    if suu > 0:  # edge q = q_min: best p
        candidates.append((max(p_min, (suy - q_min * suv) / suu), q_min))
    candidates.append((p_min, q_min))
    p, q = min(candidates, key=lambda c: sse(*c))
    return LinearFit(p, q, rms_rel_error(u, v, y, p, q))


def rms_rel_error(u: Sequence[float], v: Sequence[float], y: Sequence[float], p: float, q: float) -> float:
    """Root-mean-square relative error of ``p·u + q·v`` against ``y``: the figure a profile's
    fit-error warning reads."""
    return math.sqrt(sum(((p * a + q * b - t) / t) ** 2 for a, b, t in zip(u, v, y)) / len(y))


@dataclass(frozen=True)
class GemmFit:
    efficiency: float  # η: share of ``peak`` a large GEMM sustains
    overhead_s: float  # t₀: fixed time per GEMM
    rms_rel_error: float


def fit_gemm(flops: Sequence[float], times: Sequence[float], peak: float) -> GemmFit:
    """η ≤ 1 and t₀ ≥ 0 of ``t = F/(η·peak) + t₀`` (``peak`` in FLOP/s)."""
    if not peak > 0:
        raise ValueError("fit_gemm: peak must be positive")
    fit = fit_two([f / peak for f in flops], [1.0] * len(flops), times, p_min=1.0, q_min=0.0)
    return GemmFit(1.0 / fit.p, fit.q, fit.rms_rel_error)


@dataclass(frozen=True)
class AttentionFit:
    efficiency: float
    rms_rel_error: float


# Flash attention's backward recomputes the scores: forward + backward is 3.5 forward passes
# (FlashAttention's own count; ``cost_models.stage_time.stage_time`` times it so).
ATTENTION_PASSES = 3.5


def fit_attention(forward_flops: Sequence[float], times: Sequence[float], peak: float,
                  overhead_s: float, shape_efficiency: Optional[Sequence[float]] = None) -> AttentionFit:
    """η_attn ≤ 1 of ``t = 3.5·(F/(η_attn·q·peak) + t₀)`` (forward + backward), t₀ and each
    point's shape efficiency q given (1 where not).

    One free figure, p = 1/η_attn ≥ 1: the relative least-squares p of
    ``t − 3.5·t₀ = p · 3.5·F/(q·peak)``, clamped to 1.
    """
    if not peak > 0:
        raise ValueError("fit_attention: peak must be positive")
    if not times or len(times) != len(forward_flops):
        raise ValueError("fit_attention: flops and times need the same, non-zero length")
    q = list(shape_efficiency) if shape_efficiency is not None else [1.0] * len(times)
    u = [ATTENTION_PASSES * f / (qi * peak) for f, qi in zip(forward_flops, q)]
    fixed = ATTENTION_PASSES * overhead_s
    w = [1.0 / (t * t) for t in times]
    p = sum(wi * a * (t - fixed) for wi, a, t in zip(w, u, times)) / sum(wi * a * a for wi, a in zip(w, u))
    p = max(1.0, p)
    rms = math.sqrt(sum(((p * a + fixed - t) / t) ** 2 for a, t in zip(u, times)) / len(times))
    return AttentionFit(1.0 / p, rms)


def collective_steps_and_volume(kind: str, group_size: int, size_bytes: float) -> tuple[float, float]:
    """Latency steps and bytes per GPU of one collective, as ``cost_models.collectives`` counts them.

    ``size_bytes`` is the full buffer (all-reduce input, all-gather output,
    reduce-scatter input); for ``p2p`` it is the message, sent once.
    """
    if kind == "p2p":
        return 1.0, float(size_bytes)
    if kind not in VOLUME:
        raise ValueError(f"unknown collective {kind!r}")
    return float(algorithm_steps(kind, group_size)), volume_per_gpu(kind, group_size, size_bytes)


@dataclass(frozen=True)
class CollectiveFit:
    latency_s: float  # α: per algorithm step
    bus_bandwidth: float  # B: bytes/s per GPU
    rms_rel_error: float


def fit_collective(kind: str, group_size: int, sizes: Sequence[float], times: Sequence[float]) -> CollectiveFit:
    """α ≥ 0 and B > 0 of ``t = steps·α + volume/B`` over message sizes, read as the alpha-beta
    (Hockney) model is: α from the small messages, B from the large ones.

    nccl-tests reads its timings so (doc/PERFORMANCE.md: time "is useful with small sizes, to
    measure the constant overhead (or latency)"; "on large sizes, it makes more sense to look at
    the bandwidth", its busbw). A bandwidth is no constant: gloo's falls at large sizes (1.2-1.5
    GB/s at 4-16 MiB, 0.92-0.99 at 64 MiB on the 2-core development machine), and one relative
    fit over every size, each weighed alike, read the mid sizes' figure and priced a 64 MiB
    all-reduce 8-30 % fast. So α is that fit's (relative error makes the small messages, mostly
    latency, set it), and B the relative fit of ``volume/B = t − steps·α`` over the messages of at least
    ``BANDWIDTH_FIT_BYTES`` (the largest alone where none is that large). ``rms_rel_error`` is
    the resulting α and B's over every size, so a curve the model cannot follow is still warned of.
    """
    if group_size < 2:
        raise ValueError("fit_collective: a collective needs at least two ranks")
    pairs = [collective_steps_and_volume(kind, group_size, s) for s in sizes]
    steps, volumes = [p[0] for p in pairs], [p[1] for p in pairs]
    fit = fit_two(steps, volumes, times, p_min=0.0, q_min=0.0)
    if fit.q <= 0:
        # The times do not grow with size (too small, or noise): no bandwidth can be read
        # from them. Take the best the largest message achieved (a lower bound on B) and
        # fit α alone against it.
        largest = max(range(len(sizes)), key=lambda i: volumes[i])
        q = times[largest] / volumes[largest]
        fit = fit_two(steps, volumes, times, p_min=0.0, q_min=q)
    alpha, q = fit.p, _large_message_seconds_per_byte(sizes, steps, volumes, times, fit.p) or fit.q
    return CollectiveFit(alpha, 1.0 / q, rms_rel_error(steps, volumes, times, alpha, q))


def _large_message_seconds_per_byte(sizes: Sequence[float], steps: Sequence[float], volumes: Sequence[float],
                                    times: Sequence[float], alpha: float) -> Optional[float]:
    """1/B from the messages of at least ``BANDWIDTH_FIT_BYTES`` (else the largest), their
    latency ``steps·α`` taken off, weighed by 1/t² as every fit here; None where what is left
    is no positive time (latency-bound timings: the caller keeps its own B)."""
    threshold = min(BANDWIDTH_FIT_BYTES, max(sizes))
    large = [i for i, size in enumerate(sizes) if size >= threshold]
    weights = [1.0 / (times[i] * times[i]) for i in large]
    num = sum(w * volumes[i] * (times[i] - steps[i] * alpha) for w, i in zip(weights, large))
    den = sum(w * volumes[i] * volumes[i] for w, i in zip(weights, large))
    return num / den if num > 0 and den > 0 else None


def percentile(values: Sequence[float], fraction: float) -> float:
    """Linear-interpolated percentile (``fraction`` in [0, 1]), as numpy's default."""
    if not values:
        raise ValueError("percentile of nothing")
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
