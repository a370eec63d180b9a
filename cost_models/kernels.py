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

from .flops import Gemm
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


def element_bytes(precision: str) -> int:
    """Bytes per GEMM operand element in ``precision``."""
    return 4 if precision == "fp32" else (1 if precision == "fp8" else 2)


def gemm_time(gemm: Gemm, gpu: GPUSpec, precision: str, cast_bytes: float = 3.0,
              cached_weights: bool = False) -> float:
    """Roofline with SM occupancy and a fixed per-kernel cost:
    max(F / (η·peak·q), bytes / (η_hbm·B_hbm)) + t₀, q = :func:`wave_efficiency`,
    plus :func:`cast_time`.

    The fixed cost t₀ (launch, prologue and epilogue) weighs on small GEMMs.
    """
    return gemm_kernel_time(gemm, gpu, precision) + cast_time(gemm, gpu, precision, cast_bytes, cached_weights)


def gemm_kernel_time(gemm: Gemm, gpu: GPUSpec, precision: str) -> float:
    """The GEMM kernel alone: max(F / (η·peak·q), bytes / (η_hbm·B_hbm)) + t₀."""
    perf = gpu.performance
    traffic = element_bytes(precision) * (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n)
    hbm = perf.hbm_efficiency * gpu.hbm_bandwidth
    compute = gemm.flops / (perf.gemm_efficiency_for(precision) * gpu.peak(precision)
                            * wave_efficiency(gemm.m, gemm.n, gpu, gemm.k))
    return max(compute, traffic / hbm) + perf.kernel_overhead_s


def cast_time(gemm: Gemm, gpu: GPUSpec, precision: str, cast_bytes: float = 3.0,
              cached_weights: bool = False) -> float:
    """fp8 GEMMs first cast their bf16 inputs to fp8 in memory-bound kernels, ``cast_bytes``
    of HBM traffic per element of both operands (``EngineBehaviour.fp8_cast_bytes``):
    Transformer Engine's fused ``cast_transpose`` reads 2 bytes and writes 1; dynamic scaling
    (torchao) first reads the operand once more for its amax. Transformer Engine casts the
    weights once per optimizer step and reuses the fp8 copy for every micro-batch
    (``is_first_microbatch``): with ``cached_weights`` only the activation operand is cast."""
    if precision != "fp8":
        return 0.0
    perf = gpu.performance
    elements = gemm.m * gemm.k + (0.0 if cached_weights else gemm.k * gemm.n)
    return cast_bytes * elements / (perf.hbm_efficiency * gpu.hbm_bandwidth)


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
    rate = efficiency * attention_shape_efficiency(head_dim, keys, perf) * gpu.peak(precision)
    return flops / rate + calls * perf.kernel_overhead_s


def grouped_gemm_time(gemm: Gemm, groups: int, gpu: GPUSpec, precision: str, cast_bytes: float = 3.0,
                      cached_weights: bool = False) -> float:
    """``groups`` GEMMs of the shape ``gemm`` (one per local expert) in one grouped kernel
    (Transformer Engine's and CUTLASS's grouped GEMM, megatron-core ``TEGroupedMLP``): the
    groups' output tiles share the SMs (:func:`wave_efficiency` over all of them), each group's
    rows are rounded up to whole tiles, and the kernel pays its fixed cost once. fp8 casts as
    :func:`cast_time`, for every group's operands."""
    perf = gpu.performance
    rows = math.ceil(gemm.m / perf.gemm_tile_m) * perf.gemm_tile_m if gemm.m else 0.0
    padded = Gemm(gemm.name, rows * groups, gemm.n, gemm.k)  # tiles of all groups, as one wave count
    flops = groups * 2.0 * rows * gemm.n * gemm.k
    traffic = element_bytes(precision) * groups * (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n)
    compute = flops / (perf.gemm_efficiency_for(precision) * gpu.peak(precision)
                       * wave_efficiency(padded.m, padded.n, gpu, padded.k))
    kernel = max(compute, traffic / (perf.hbm_efficiency * gpu.hbm_bandwidth)) + perf.kernel_overhead_s
    return kernel + groups * cast_time(gemm, gpu, precision, cast_bytes, cached_weights)
