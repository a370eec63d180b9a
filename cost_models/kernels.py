"""Time of one kernel on one GPU: GEMMs through a roofline with SM occupancy.

A GEMM's output is cut into tiles; each streaming multiprocessor (SM) computes one tile
at a time (NVIDIA, "Matrix Multiplication Background User's Guide", §"Wave
quantization"). A GEMM with fewer tiles than the GPU has SMs leaves the rest idle: this
is what makes a narrow tensor-parallel shard or a short micro-batch slower per FLOP than
a large GEMM. An H100 fp8 GEMM of 1024³ fills 32 of 132 SMs and reaches 14 % of peak
against 70 % at 16384³; 2048³ (128 tiles, one wave) reaches 51 %, the rest of the gap
being the fixed per-kernel cost (``shared/hardware/achieved.yaml``, Azure ND H100 v5).
Partial later waves are filled by the stream-K and split-K kernels cuBLAS and CUTLASS
pick for them, so only the first wave's occupancy is modelled; a GEMM with few tiles but a
long K splits K over more SMs (split-K), at least ``Performance.gemm_split_k`` of K each
(1024: the 1024³ GEMM above is not split).
"""

from __future__ import annotations

import math
from typing import Optional

from .flops import Gemm
from .quantization import LOW_PRECISIONS, Recipe, recipe_for
from .specs import GPUSpec, Performance

# The benchmark condition ``Performance.attention_efficiency`` is quoted at.
ATTENTION_REFERENCE_HEAD_DIM = 128
ATTENTION_REFERENCE_KEYS = 16384


def wave_efficiency(m: float, n: float, gpu: GPUSpec, k: float = 0.0) -> float:
    """Share of the SMs the output tiles of an m×n×k GEMM keep busy: min(1, tiles · splits / SMs),
    splits = the K-splits the SMs left idle allow, at least gemm_split_k of K each."""
    if gpu.sm_count is None:
        return 1.0
    perf = gpu.performance
    tiles = math.ceil(m / perf.gemm_tile_m) * math.ceil(n / perf.gemm_tile_n)
    splits = max(1, min(math.floor(k / perf.gemm_split_k), math.ceil(gpu.sm_count / tiles)))
    return min(1.0, tiles * splits / gpu.sm_count)


def element_bytes(precision: str) -> float:
    """Bytes per GEMM operand element in ``precision``: 4 in fp32, 2 in 16-bit, and a
    low-precision recipe's element size (``quantization.Recipe.element_bytes``)."""
    if precision == "fp32":
        return 4.0
    recipe = recipe_for(precision, None) if precision in LOW_PRECISIONS else None
    return recipe.element_bytes if recipe else 2.0


def tensor_core_rate(gpu: GPUSpec, peak_key: str, efficiency: float) -> float:
    """FLOP/s a large GEMM or attention kernel sustains: η · peak · the sustained clock
    (``Performance.sustained_clock``: 1 unless a power cap holds the clock down)."""
    return efficiency * gpu.peak(peak_key) * gpu.performance.sustained_clock


def gemm_time(gemm: Gemm, gpu: GPUSpec, precision: str, recipe: Optional[Recipe] = None) -> float:
    """Roofline with SM occupancy and a fixed per-kernel cost:
    max(F / (η·peak·q), bytes / (η_hbm·B_hbm)) + t₀, q = :func:`wave_efficiency`.

    The GEMM runs at ``precision``'s peak and achieved efficiency, or, where a low-precision
    ``recipe`` quantizes it, at the recipe's (``Recipe.peak``, ``Recipe.kernel``: fp8 or fp4,
    row-scaled fp8 kernels apart). The fixed cost t₀ (launch, prologue and epilogue) weighs on
    small GEMMs. Quantizing the operands is priced apart (:func:`quantize_time`).
    """
    perf = gpu.performance
    if recipe is not None:
        # The training precision's peak: the recipe's elements' (fp8, fp4), where the GPU runs its format.
        rate, size = tensor_core_rate(gpu, precision, perf.gemm_efficiency_for(recipe.kernel)), recipe.element_bytes
    else:
        rate, size = tensor_core_rate(gpu, precision, perf.gemm_efficiency_for(precision)), element_bytes(precision)
    traffic = size * (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n)
    hbm = perf.hbm_efficiency * gpu.hbm_bandwidth
    compute = gemm.flops / (rate * wave_efficiency(gemm.m, gemm.n, gpu, gemm.k))
    return max(compute, traffic / hbm) + perf.kernel_overhead_s


def quantize_time(traffic_bytes: float, gpu: GPUSpec) -> float:
    """Quantize kernels are memory-bound: their HBM traffic (``quantization.linear_quantize_bytes``)
    at the element-wise kernels' achieved bandwidth."""
    return traffic_bytes / (gpu.performance.hbm_efficiency * gpu.hbm_bandwidth)


def attention_shape_efficiency(head_dim: float, keys: float, perf: Performance) -> float:
    """Flash attention's efficiency at ``head_dim`` and ``keys`` per query block, relative to
    head dim 128 and 16k keys: d/(d + d½) · s/(s + s½), normalised there.

    FlashAttention-2 fwd+bwd (causal, head dim 128) runs at 0.61 of the A100 peak at 16k
    and 0.32 at 512; on H100 at 0.33 and 0.17 (s½ ≈ 550). Head dim 64 reaches 0.87–0.90
    of head dim 128's rate with FA2 and 0.77 with FA3 (d½ ≈ 32). Dao-AILab/flash-attention
    benchmark figures, ``shared/hardware/achieved.yaml``.
    """
    def per_dim(d: float) -> float:
        return d / (d + perf.attention_head_dim_half)

    def per_keys(s: float) -> float:
        return s / (s + perf.attention_seq_half)

    return (per_dim(head_dim) / per_dim(ATTENTION_REFERENCE_HEAD_DIM)
            * per_keys(keys) / per_keys(ATTENTION_REFERENCE_KEYS))


def flash_attention_time(flops: float, head_dim: float, keys: float, calls: int, gpu: GPUSpec,
                         precision: str, fused: bool = False) -> float:
    """Forward time of flash attention doing ``flops`` in ``calls`` kernels over key blocks of
    ``keys``: F / (η_attn · shape · peak) + calls · t₀, η_attn of the vendor's fused kernels
    (``Performance.attention_efficiency_fused``) where the engine runs them. The backward
    pass takes 2.5 times as long (``step_time.stage_time``)."""
    perf = gpu.performance
    efficiency = perf.attention_efficiency_fused if fused and perf.attention_efficiency_fused else \
        perf.attention_efficiency
    rate = tensor_core_rate(gpu, precision, efficiency) * attention_shape_efficiency(head_dim, keys, perf)
    return flops / rate + calls * perf.kernel_overhead_s
