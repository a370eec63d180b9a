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
from functools import lru_cache
from typing import Optional

from .flops import Gemm
from .quantization import LOW_PRECISIONS, Recipe, linear_quantize_bytes, recipe_for
from .hardware import GPUSpec, Performance
from .training_spec import TrainingSpec

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


def k_loop_efficiency(k: float, gpu: GPUSpec, precision: str) -> float:
    """A GEMM's rate at inner dimension ``k``, relative to its rate at the K the efficiencies hold
    at (``Performance.gemm_reference_k``, ``gemm_reference_k_fp8`` for the faster precisions):
    (1 + K½/K_ref) / (1 + K½/K). Each wave of output tiles pays a fixed part (filling the K
    pipeline, writing the tile out) worth K½ of its K loop, so the rate goes as K/(K + K½).

    DeepGEMM's table (deepseek-ai/DeepGEMM README, 2025-03-25: H800, fp8 block-scaled, M 4096)
    runs 1426 TFLOP/s at K 16384, 1168 at 2048, 1125 at 1536 and 751 at 512, within 3 % of
    1469·K/(K + 490) at those shapes; its grouped GEMMs of 4–8 experts run as the plain GEMM of the
    same tiles (1214 at K 2048). The fixed part is a time, so a precision whose loop runs faster
    has a larger K½: ``Performance.gemm_k_half`` is given at the 16-bit peak (Hopper: 245, half
    of fp8's 490) and scales with ``precision``'s peak over the 16-bit one."""
    if not gpu.performance.gemm_k_half or k <= 0:
        return 1.0
    k_half, reference = _k_half_and_reference(gpu, precision)
    return (1 + k_half / reference) / (1 + k_half / k)


@lru_cache(maxsize=256)  # a GEMM's figures at its precision: a search asks for the same few thousands of times
def _k_half_and_reference(gpu: GPUSpec, precision: str) -> tuple[float, float]:
    """(K½ at ``precision``'s peak, the K its efficiency holds at): :func:`k_loop_efficiency`'s."""
    perf = gpu.performance
    sixteen = gpu.peak_flops.get("bf16") or gpu.peak_flops.get("fp16")
    speed = gpu.peak(precision) / sixteen if sixteen else 1.0
    reference = perf.gemm_reference_k_fp8 if speed > 1 and perf.gemm_reference_k_fp8 else perf.gemm_reference_k
    return perf.gemm_k_half * speed, reference


def k_loop_ceiling(gpu: GPUSpec, precision: str) -> float:
    """The most :func:`k_loop_efficiency` reaches at any K (its limit as K grows): 1 + K½/K_ref."""
    if not gpu.performance.gemm_k_half:
        return 1.0
    k_half, reference = _k_half_and_reference(gpu, precision)
    return 1 + k_half / reference


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


@lru_cache(maxsize=256)
def _rate_and_size(gpu: GPUSpec, precision: str, recipe: Optional[Recipe]) -> tuple[float, float]:
    """(FLOP/s, bytes per operand element) of a GEMM in ``precision``, or under ``recipe`` at the
    training precision's peak (the recipe's elements': fp8, fp4) and the recipe's kernels'
    achieved efficiency (``Recipe.kernel``: row-scaled fp8 kernels apart)."""
    perf = gpu.performance
    if recipe is not None:
        return tensor_core_rate(gpu, precision, perf.gemm_efficiency_for(recipe.kernel)), recipe.element_bytes
    return tensor_core_rate(gpu, precision, perf.gemm_efficiency_for(precision)), element_bytes(precision)


def gemm_time(gemm: Gemm, gpu: GPUSpec, precision: str, recipe: Optional[Recipe] = None) -> float:
    """Roofline with SM occupancy, the K loop's share of each wave and a fixed per-kernel cost:
    max(F / (η·peak·q·κ), bytes / (η_hbm·B_hbm)) + t₀, q = :func:`wave_efficiency`,
    κ = :func:`k_loop_efficiency`.

    The GEMM runs at ``precision``'s peak and achieved efficiency, or at a low-precision
    ``recipe``'s (:func:`_rate_and_size`). The fixed cost t₀ (launch, prologue and epilogue)
    weighs on small GEMMs. Quantizing the operands is priced apart (:func:`elementwise_time`).
    """
    return _gemm_time(gemm.m, gemm.n, gemm.k, gpu, precision, recipe)


# A search prices the same GEMM shapes many times over: a linear's backward GEMMs recur under each
# quantize setting and weight share :func:`linear_time` is keyed by, and each engine's training is its
# own key there (DeepSeek-V3's plan with no engine named: 6,620 GEMMs priced, 2,574 of them distinct).
# Keyed by the shape alone (a GEMM's name prices nothing); typed, so that an int dimension and the
# equal float are priced apart, as the arithmetic below would treat them.
@lru_cache(maxsize=16384, typed=True)
def _gemm_time(m: float, n: float, k: float, gpu: GPUSpec, precision: str, recipe: Optional[Recipe]) -> float:
    """:func:`gemm_time` of the m×n×k GEMM."""
    perf = gpu.performance
    rate, size = _rate_and_size(gpu, precision, recipe)
    traffic = size * (m * k + k * n + m * n)
    hbm = perf.hbm_efficiency * gpu.hbm_bandwidth
    compute = 2.0 * m * n * k / (rate * wave_efficiency(m, n, gpu, k) * k_loop_efficiency(k, gpu, precision))
    return max(compute, traffic / hbm) + perf.kernel_overhead_s


def elementwise_time(traffic_bytes: float, gpu: GPUSpec) -> float:
    """Memory-bound kernels that write fresh tensors (norms, residual adds, the loss, quantize
    kernels, copies): their HBM traffic at the element-wise kernels' achieved bandwidth."""
    return traffic_bytes / (gpu.performance.hbm_efficiency * gpu.hbm_bandwidth)


# The unit ``Performance.page_fault_s`` counts in: x86-64 Linux's base page. Calibration divides
# by the same figure, so a host with larger pages still gets its per-byte cost right.
PAGE_BYTES = 4096


def first_touch_time(fresh_bytes: float, gpu: GPUSpec) -> float:
    """The page faults of writing ``fresh_bytes`` into buffers allocated for the purpose, beyond
    the writes themselves: one ``Performance.page_fault_s`` per page. Where the allocator reuses
    freed blocks (CUDA's caching allocator) it is 0; on a CPU, glibc maps every block above its
    mmap threshold (at most 32 MiB: ``mallopt(3)``, M_MMAP_THRESHOLD) afresh and returns it on free.
    On the 2-core development machine (2026-12-01, one thread) a 256 MiB ``torch.empty(n).fill_(1)``
    ran at 2.4 GB/s, against 25 GB/s into a buffer written before: 1.5 µs a page."""
    return fresh_bytes / PAGE_BYTES * gpu.performance.page_fault_s


def in_place_time(traffic_bytes: float, gpu: GPUSpec) -> float:
    """Memory-bound kernels that update their operands in place (the optimizer step): their HBM
    traffic at the in-place kernels' achieved bandwidth (``Performance.in_place_efficiency``),
    which skips the read a CPU makes of every line a fresh tensor is written to."""
    return traffic_bytes / _share_of_hbm(gpu.performance.in_place_efficiency, gpu)


def transcendental_time(traffic_bytes: float, gpu: GPUSpec) -> float:
    """Element-wise kernels that evaluate a tanh or an exponent per element (the activation
    function: GeLU, SiLU, fused SwiGLU; the loss's softmax) over ``traffic_bytes`` of HBM
    traffic, at their achieved share of the bandwidth (``Performance.transcendental_efficiency``):
    the memory's rate on a GPU, the vector units' on a CPU."""
    return traffic_bytes / _share_of_hbm(gpu.performance.transcendental_efficiency, gpu)


def _share_of_hbm(efficiency: Optional[float], gpu: GPUSpec) -> float:
    """Bytes per second at ``efficiency`` of the HBM bandwidth; unset, at the element-wise share."""
    return (gpu.performance.hbm_efficiency if efficiency is None else efficiency) * gpu.hbm_bandwidth


def activation_passes(activation: str, fused: bool) -> int:
    """Tensors of the MLP's width the activation function reads and writes per token: GeLU reads
    and writes one; fused SwiGLU reads two and writes one; eager SwiGLU's SiLU reads and writes
    one (its multiply is a plain element-wise kernel: ``layer_time.elementwise_bytes``)."""
    if activation == "swiglu":
        return 3 if fused else 2
    return 2


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
    pass takes 2.5 times as long (``stage_time.stage_time``)."""
    perf = gpu.performance
    efficiency = perf.attention_efficiency_fused if fused and perf.attention_efficiency_fused else \
        perf.attention_efficiency
    rate = tensor_core_rate(gpu, precision, efficiency) * attention_shape_efficiency(head_dim, keys, perf)
    return flops / rate + calls * perf.kernel_overhead_s


def grouped_gemm_time(gemm: Gemm, groups: int, gpu: GPUSpec, precision: str, recipe: Optional[Recipe] = None,
                      streams: int = 0) -> float:
    """``groups`` GEMMs of the shape ``gemm`` (one per local expert), each group's rows rounded up
    to whole tiles. Rate and element size as :func:`gemm_time`'s; quantizing priced apart.

    - ``streams`` 0: one grouped kernel (``torch._grouped_mm``, CUTLASS's grouped GEMM): the
      groups' output tiles share the SMs (:func:`wave_efficiency` over all of them) and the
      kernel pays its fixed cost once.
    - ``streams`` n: one GEMM kernel per group, issued round-robin on n CUDA streams
      (``EngineBehaviour.grouped_gemm_streams``). At most n groups share the SMs at a time, and
      each stream pays the fixed cost of each of its ⌈groups/n⌉ kernels. Transformer Engine's
      ``GroupedLinear`` runs so (``nvte_multi_stream_cublas_gemm``: one cuBLAS GEMM per group on
      ``nvte_get_num_compute_streams()`` = 4 streams), which is what makes many small local
      experts slower per FLOP than a few large ones.
    """
    return _grouped_gemm_time(gemm.m, gemm.n, gemm.k, groups, gpu, precision, recipe, streams)


@lru_cache(maxsize=16384, typed=True)  # as :func:`_gemm_time`'s, for the experts' GEMMs
def _grouped_gemm_time(m: float, n: float, k: float, groups: int, gpu: GPUSpec, precision: str,
                       recipe: Optional[Recipe], streams: int) -> float:
    """:func:`grouped_gemm_time` of ``groups`` m×n×k GEMMs."""
    perf = gpu.performance
    rate, size = _rate_and_size(gpu, precision, recipe)
    rows = math.ceil(m / perf.gemm_tile_m) * perf.gemm_tile_m if m else 0.0
    flops = groups * 2.0 * rows * n * k
    traffic = size * groups * (m * k + k * n + m * n)
    side_by_side = min(groups, streams or groups)  # one grouped kernel: every group at once
    compute = flops / (rate * wave_efficiency(rows * side_by_side, n, gpu, k)
                       * k_loop_efficiency(k, gpu, precision))
    return max(compute, traffic / (perf.hbm_efficiency * gpu.hbm_bandwidth)) \
        + math.ceil(groups / side_by_side) * perf.kernel_overhead_s


def high_precision_precision(training: TrainingSpec) -> str:
    """What runs outside the recipe's GEMMs (attention, the LM head, routers, the layers a recipe
    keeps high): bf16 under a low-precision recipe, else the training precision."""
    return "bf16" if training.recipe is not None else training.precision


def linear_time_floor(gemm: Gemm, gpu: GPUSpec, training: TrainingSpec) -> float:
    """The least forward + backward time of the linear ``gemm`` (:func:`linear_time`, quantized),
    however its rows are split into groups: its three GEMMs' FLOPs (forward, input gradient, weight
    gradient: 2·m·n·k each) at the fastest rate any of them runs at (the recipe's, or the 16-bit one
    where the recipe keeps the weight gradient there), every wave full and the K loop at its ceiling
    (:func:`k_loop_ceiling`); quantize kernels, memory traffic and fixed costs left out, each of which
    only adds (:func:`gemm_time`, :func:`grouped_gemm_time`, whose padded rows only add FLOPs)."""
    recipe, high = training.recipe, high_precision_precision(training)
    kernels = [(high, None)] if recipe is None else [(training.precision, recipe), (high, None)]
    fastest = max(_rate_and_size(gpu, precision, r)[0] * k_loop_ceiling(gpu, precision) for precision, r in kernels)
    return 3 * gemm.flops / fastest


# The linears whose input a norm (QKV and the first MLP matrix, w1/w3) or the activation (the
# down projection) computes: where a fused library quantizes in that kernel.
NORM_OR_ACTIVATION_INPUTS = ("qkv", "fc1", "fc2", "w3")


# A search prices the same few linear shapes under thousands of layouts (every layout with the same
# tensor-parallel width and micro-batch shares them): the specs are frozen, so the times are cached.
@lru_cache(maxsize=16384)
def linear_time(gemm: Gemm, gpu: GPUSpec, training: TrainingSpec, quantized: bool = True,
                weight_share: float = 1.0, input_in_producer: bool = False, groups: int = 1) \
        -> tuple[float, float]:
    """(forward, backward) of a linear layer Y = X·Wᵀ of shape ``gemm`` (m×k by k×n): the forward
    GEMM, and in backward the input-gradient GEMM (m×n by n×k: K is the layer's output width)
    and the weight-gradient GEMM (k×m by m×n: K is the tokens), the same FLOPs at their own
    shapes (:func:`wave_efficiency`, :func:`k_loop_efficiency`).

    Under the training's low-precision recipe (where ``quantized``) every GEMM runs at the
    recipe's rate, the wgrad in bf16 where the recipe keeps it there, and the quantize kernels of
    each pass (``quantization.linear_quantize_bytes``: ``weight_share``, ``input_in_producer``)
    are added. ``groups`` such linears (one per local expert) run as one grouped kernel
    (:func:`grouped_gemm_time`), each quantizing its own operands.
    """
    recipe = training.recipe if quantized else None
    high = high_precision_precision(training)

    dgrad_gemm = Gemm(gemm.name, gemm.m, gemm.k, gemm.n)
    wgrad_gemm = Gemm(gemm.name, gemm.k, gemm.n, gemm.m)

    def kernel(shape: Gemm, precision: str, r: Optional[Recipe]) -> float:
        return gemm_time(shape, gpu, precision, r) if groups == 1 else \
            grouped_gemm_time(shape, groups, gpu, precision, r, training.engine.grouped_gemm_streams)

    if recipe is None:
        return kernel(gemm, high, None), kernel(dgrad_gemm, high, None) + kernel(wgrad_gemm, high, None)
    low = kernel(gemm, training.precision, recipe)
    dgrad = kernel(dgrad_gemm, training.precision, recipe)
    wgrad = kernel(wgrad_gemm, *((training.precision, recipe) if recipe.wgrad_low else (high, None)))
    q = linear_quantize_bytes(recipe, gemm.m, gemm.n, gemm.k, training.engine.fused_quantize, weight_share,
                              input_in_producer)
    return (low + groups * elementwise_time(q.forward, gpu),
            dgrad + wgrad + groups * elementwise_time(q.backward, gpu))
