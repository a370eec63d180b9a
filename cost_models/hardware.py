"""The hardware: what a GPU achieves (:class:`Performance`), the GPU and its host, the fabric
between NVLink domains and the cluster. Bytes, bytes per second, FLOP per second, seconds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional

from .frozen import cached_hash, state_without_hash
from .quantization import RECIPES
from .spec_checks import SpecError, _choice, _positive_float, _positive_int

# Block-scaled formats a GPU's tensor cores run natively (GPUSpec.block_scaling): OCP MX (32-element
# blocks, E8M0 scales) and NVIDIA's NVFP4 (16-element blocks, E4M3 scales).
BLOCK_SCALED_FORMATS = ("mxfp8", "mxfp4", "nvfp4")
GPU_VENDORS = ("nvidia", "amd")


@dataclass(frozen=True)
class Performance:
    """What a GPU type achieves, as opposed to its datasheet: the step-time model's only fitted figures.

    Each has a physical meaning and is set per GPU type (``planner/presets/performance.yaml``)
    or measured by calibration; none is set per published run.
    """

    gemm_efficiency: float = 0.75  # share of dense peak a large GEMM sustains (16-bit, and fp32 unless below)
    # The same for fp32 GEMMs, of the TF32 peak where the GPU has one (a calibration that times
    # both measures both: TF32 kernels reach a different share than bf16). None: as gemm_efficiency.
    gemm_efficiency_fp32: Optional[float] = None
    # The same for fp8 GEMMs, whose share of their (twice as high) peak is lower: H100
    # mamf-finder reaches 0.80 of the bf16 and 0.71 of the fp8 peak. None: as gemm_efficiency.
    gemm_efficiency_fp8: Optional[float] = None
    # Row-scaled fp8 GEMMs (torchao's rowwise recipes: CUTLASS kernels through torch._scaled_mm on
    # NVIDIA, hipBLASLt on AMD) reach less of the fp8 peak than per-tensor ones. None: as fp8.
    gemm_efficiency_fp8_rowwise: Optional[float] = None
    # The same for fp4 GEMMs (NVFP4), of the fp4 peak. None: as fp8.
    gemm_efficiency_fp4: Optional[float] = None
    # Share of dense peak of flash attention, forward + backward, at head dim 128 and 16k keys
    # (the condition FlashAttention's published benchmarks report): FlashAttention-2-class
    # kernels (flash-attn 2, PyTorch SDPA) in ``attention_efficiency``; the vendor's fused
    # kernels where an engine runs them (Transformer Engine's cuDNN attention, FlashAttention-3
    # on Hopper) in ``attention_efficiency_fused`` (None: the same).
    attention_efficiency: float = 0.5
    attention_efficiency_fused: Optional[float] = None
    # Head dim and key length at which a flash-attention tile does half its peak work: smaller
    # heads and shorter key blocks leave the tensor cores idle for a larger share of each tile
    # (``cost_models.kernels.attention_shape_efficiency``).
    attention_head_dim_half: float = 32.0
    attention_seq_half: float = 550.0
    # Tensor-core clock sustained under training load, relative to the one the efficiencies above
    # hold at: a power cap lowers it for GEMMs and attention alike, while HBM-bound kernels keep
    # their bandwidth (``kernels.tensor_core_rate``).
    sustained_clock: float = 1.0
    kernel_overhead_s: float = 8e-6  # fixed time per GEMM: launch, tail wave, prologue/epilogue
    hbm_efficiency: float = 0.8  # achieved share of HBM bandwidth by element-wise kernels
    # The same share for kernels that update their operands in place (the optimizer step): a
    # CPU reads each line a fresh tensor is written to before writing it (write-allocate), so
    # an out-of-place kernel moves a third to a half more bytes than it counts, and an in-place
    # one does not; GPUs write whole sectors and the two agree. None: ``hbm_efficiency``.
    in_place_efficiency: Optional[float] = None
    # The same share for kernels that evaluate a tanh or an exponent per element (the activation
    # function, the loss's softmax): bandwidth-bound on a GPU, but on a CPU the vector units
    # compute them at a fifth of the memory's rate. None: ``hbm_efficiency``.
    transcendental_efficiency: Optional[float] = None
    intra_node_efficiency: float = 0.75  # achieved bus bandwidth over nominal NVLink bandwidth
    link_latency_s: float = 10e-6  # α: time per step of a collective algorithm inside an NVLink domain
    step_overhead_s: float = 0.0  # fixed per optimizer step: data loading, logging, launch gaps
    # Fixed host time per micro-batch that no GPU work hides: the Python and launches between one
    # micro-batch's backward and the next forward, the data loader's next batch, a loss sync.
    # 0 in the presets (no benchmark isolates it); a team's own runs measure it
    # (``planner.learn``: `calibrate --from-runs`).
    microbatch_overhead_s: float = 0.0
    # Time to map one fresh page (``kernels.PAGE_BYTES``) at its first write: a CPU's allocator
    # hands large freed blocks back to the kernel, so a buffer allocated anew faults its pages in
    # (zero-filled) as it is written. 0 where the allocator keeps freed blocks for reuse (PyTorch's
    # CUDA caching allocator): a fresh buffer then costs nothing more than its writes.
    page_fault_s: float = 0.0
    # All-gather and reduce-scatter bus bandwidth as a share of the all-reduce's.
    all_gather_efficiency: float = 1.0
    reduce_scatter_efficiency: float = 1.0
    comm_overlap: float = 1.0  # share of compute time that communication can run under
    # Output tile one SM computes at a time (rows × columns): with the GPU's SM count it sets
    # how full the last wave of a GEMM is (``cost_models.kernels.wave_efficiency``).
    gemm_tile_m: int = 128
    gemm_tile_n: int = 256
    gemm_split_k: int = 1024  # least K per split of a split-K GEMM
    # K at which one wave of output tiles spends as long on its fixed part (filling the K
    # pipeline, writing the tile out) as on its K loop, at the 16-bit rate; a faster precision
    # runs the loop faster and has it larger (``cost_models.kernels.k_loop_efficiency``). It is
    # what makes a GEMM of short K (a small expert's down projection, a weight gradient over few
    # tokens) slower per FLOP than the large ones. 0: not modelled (no published figure).
    gemm_k_half: float = 0.0
    # The K the GEMM efficiencies above hold at: the FLOP-weighted harmonic mean of K over the
    # GEMMs of the runs they were fitted on (`python bench/gemm_reference_k.py`), so that the
    # shape term moves a GEMM relative to those runs, not to an ideal one.
    gemm_reference_k: float = 4096.0
    gemm_reference_k_fp8: Optional[float] = None  # the same for the fp8 and fp4 efficiencies (None: as 16-bit)
    # Offload (``cost_models.offload``): achieved share of the GPU↔host link's datasheet rate
    # by pinned-memory copies, and of the host DRAM bandwidth by the CPU optimizer step.
    host_link_efficiency: float = 0.8
    host_memory_efficiency: float = 0.5

    def __post_init__(self) -> None:
        optional = ("gemm_efficiency_fp32", "gemm_efficiency_fp8", "gemm_efficiency_fp8_rowwise",
                    "gemm_efficiency_fp4", "attention_efficiency_fused", "in_place_efficiency",
                    "transcendental_efficiency")
        for name in ("gemm_efficiency", "gemm_efficiency_fp32", "gemm_efficiency_fp8", "gemm_efficiency_fp8_rowwise", "gemm_efficiency_fp4",
                     "attention_efficiency", "attention_efficiency_fused", "hbm_efficiency", "in_place_efficiency",
                     "transcendental_efficiency", "sustained_clock",
                     "intra_node_efficiency", "all_gather_efficiency",
                     "reduce_scatter_efficiency", "host_link_efficiency", "host_memory_efficiency"):
            value = getattr(self, name)
            if value is None and name in optional:
                continue
            _positive_float(Performance, name, value)
            if value > 1:
                raise SpecError(Performance, name, f"expected a fraction in (0, 1], got {value!r}")
        overlap = self.comm_overlap
        if isinstance(overlap, bool) or not isinstance(overlap, (int, float)) or not 0 <= overlap <= 1:
            raise SpecError(Performance, "comm_overlap", f"expected a fraction in [0, 1], got {overlap!r}")
        for name in ("attention_head_dim_half", "attention_seq_half"):
            _positive_float(Performance, name, getattr(self, name))
            if getattr(self, name) > 1e7:  # a head width or sequence in elements: 2^64 priced a slower attention
                raise SpecError(Performance, name, f"expected a length of at most 1e7 elements, got {getattr(self, name)!r}")
        for name, low in (("gemm_k_half", 0.0), ("gemm_reference_k", 1.0), ("gemm_reference_k_fp8", 1.0)):
            value = getattr(self, name)
            if value is None and name == "gemm_reference_k_fp8":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= 1e6:
                raise SpecError(Performance, name, f"expected a K in [{low:g}, 1e6] elements, got {value!r}")
        for name in ("kernel_overhead_s", "link_latency_s", "step_overhead_s", "microbatch_overhead_s",
                     "page_fault_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise SpecError(Performance, name, f"expected a non-negative time, got {value!r}")
        for name in ("gemm_tile_m", "gemm_tile_n", "gemm_split_k"):
            _positive_int(Performance, name, getattr(self, name))

    def gemm_efficiency_for(self, kernel: str) -> float:
        """Share of its peak a large GEMM of ``kernel`` sustains: a training precision (fp32, fp16,
        bf16), or a recipe's kernel (``quantization.Recipe.kernel``: fp8, fp8_rowwise, fp4), each
        falling back to the one before it (fp4 and row-scaled to fp8, fp8 and fp32 to 16-bit)."""
        if kernel == "fp32" and self.gemm_efficiency_fp32 is not None:
            return self.gemm_efficiency_fp32
        fp8 = self.gemm_efficiency if self.gemm_efficiency_fp8 is None else self.gemm_efficiency_fp8
        if kernel == "fp8":
            return fp8
        if kernel == "fp8_rowwise":
            return fp8 if self.gemm_efficiency_fp8_rowwise is None else self.gemm_efficiency_fp8_rowwise
        if kernel == "fp4":
            return fp8 if self.gemm_efficiency_fp4 is None else self.gemm_efficiency_fp4
        return self.gemm_efficiency


@dataclass(frozen=True)
class HostSpec:
    """The host memory one GPU can offload to, and the ways to it (datasheet figures, per GPU).

    Each is the node's figure shared by its GPUs: DRAM capacity and bandwidth over the GPUs of
    the node; the link is the GPU's own (PCIe x16, or NVLink-C2C to its Grace).
    """

    memory_bytes: float
    link_bandwidth: float  # bytes/s GPU↔host, one direction
    memory_bandwidth: float  # bytes/s of host DRAM, for the optimizer step on the CPU

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "link_bandwidth", "memory_bandwidth"):
            _positive_float(HostSpec, name, getattr(self, name))


# What calibration/worker.py names the device of a profile measured on CPUs ("CPU: " and the CPU model).
CPU_DEVICE_PREFIX = "CPU: "


@dataclass(frozen=True)
class GPUSpec:
    __hash__ = cached_hash
    __getstate__ = state_without_hash

    """One accelerator, with datasheet (or calibrated) figures."""

    name: str
    memory_bytes: float
    # Dense, per precision: fp32, tf32, fp16, bf16, fp8. Left out of the hash (a dict is not
    # hashable); equal specs still hash alike, so cost models can cache on a GPUSpec.
    peak_flops: Mapping[str, float] = field(hash=False)
    hbm_bandwidth: float  # bytes/s
    intra_node_bandwidth: float  # bytes/s per GPU, one direction
    inter_node_bandwidth: float  # bytes/s per GPU, one direction
    gpus_per_node: int
    nvlink_domain: int  # GPUs that share one NVLink/NVSwitch domain
    performance: Performance = field(default_factory=Performance)
    # Streaming multiprocessors (AMD: compute units) that share a GEMM's output tiles;
    # None: no wave quantization is modelled.
    sm_count: Optional[int] = None
    host: Optional[HostSpec] = None  # what offload reaches; None: no offload is modelled
    # Block-scaled formats the tensor cores run (BLOCK_SCALED_FORMATS): Blackwell's fifth-generation
    # tensor cores scale MXFP8, MXFP4 and NVFP4 blocks in hardware; CDNA4 (MI355X) the MX formats.
    block_scaling: tuple[str, ...] = ()
    # Whose GPU it is, for the libraries that run on one vendor's only: DeepEP's dispatch needs NVSHMEM
    # and NVIDIA GPUs (ROCm has no port: ROCm/aiter#421; AMD's MoRI and rccl_ep are other APIs).
    vendor: str = "nvidia"
    # The CUDA compute capability's major (torch.cuda.get_device_properties().major: 8 Ampere, 9 Hopper,
    # 10 Blackwell), what Megatron-LM's validate_args keys CUDA_DEVICE_MAX_CONNECTIONS on; None: not
    # known (AMD GPUs, whose ROCm torch reports HIP's gfx numbers; a profile that does not say).
    compute_capability_major: Optional[int] = None

    @property
    def on_cpu(self) -> bool:
        """Whether this "GPU" is a CPU: a profile `calibrate` measured on one names it "CPU: <model>"."""
        return self.name.startswith(CPU_DEVICE_PREFIX)

    def __post_init__(self) -> None:
        s = GPUSpec
        _choice(s, "vendor", self.vendor, GPU_VENDORS)
        for fmt in self.block_scaling:
            _choice(s, "block_scaling", fmt, BLOCK_SCALED_FORMATS)
        for name in ("memory_bytes", "hbm_bandwidth", "intra_node_bandwidth", "inter_node_bandwidth"):
            _positive_float(s, name, getattr(self, name))
        _positive_int(s, "gpus_per_node", self.gpus_per_node)
        _positive_int(s, "nvlink_domain", self.nvlink_domain)
        if self.nvlink_domain % self.gpus_per_node and self.gpus_per_node % self.nvlink_domain:
            # Ranks fill GPU r of node r // gpus_per_node and domain r // nvlink_domain
            # (cost_models.topology): a domain neither whole nodes (an NVL72 rack's trays) nor a part
            # of a node that divides it (an HGX board's 8, two islands of 4) would join GPUs of two
            # nodes over NVLink that no switch joins.
            raise SpecError(s, "nvlink_domain", f"expected whole nodes of {self.gpus_per_node} GPUs (gpus_per_node) "
                                                f"or a part of one that divides it, got {self.nvlink_domain}")
        if self.sm_count is not None:
            _positive_int(s, "sm_count", self.sm_count)
        if self.compute_capability_major is not None:
            _positive_int(s, "compute_capability_major", self.compute_capability_major)
        for precision, flops in self.peak_flops.items():
            _positive_float(s, f"peak_flops.{precision}", flops)

    def offload_host(self) -> HostSpec:
        """The host that offload reaches; a SpecError where the GPU has none (``Job`` refuses an
        offloading layout on such a GPU, so the cost model's offload terms always find one)."""
        if self.host is None:
            raise SpecError(GPUSpec, "host", "has no host figures (memory, link and memory bandwidth) "
                                             "for the layout's offload")
        return self.host

    @property
    def deepep_refusal(self) -> Optional[str]:
        """Why DeepEP's expert dispatch cannot run on this GPU, None where it can: it needs NVSHMEM and
        NVIDIA GPUs (ROCm has no port: ROCm/aiter#421)."""
        if self.vendor == "nvidia":
            return None
        return f"deepep runs on NVIDIA GPUs only (NVSHMEM; no ROCm port, ROCm/aiter#421), not on {self.name}"

    @property
    def any_layout_fp8_gemm(self) -> bool:
        """Whether fp8 GEMMs take their operands in either layout, not only "TN": Blackwell's
        fifth-generation tensor cores, the ones that scale NVFP4 blocks (Transformer Engine's
        ``is_non_tn_fp8_gemm_supported``: compute capability 10 and above)."""
        return "nvfp4" in self.block_scaling

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s for GEMMs in ``precision`` (fp32 GEMMs use TF32 where the GPU has it);
        a block-scaled training precision (mxfp8, nvfp4) at the peak of its elements (fp8, fp4),
        where the tensor cores scale its blocks."""
        if precision in ("mxfp8", "nvfp4"):
            if precision not in self.block_scaling:
                raise SpecError("TrainingSpec", "precision", f"{precision} needs tensor cores that scale its blocks "
                                                         f"({'Blackwell or CDNA4' if precision == 'mxfp8' else 'Blackwell'}), "
                                                         f"and {self.name} has none (GPUSpec.block_scaling)")
            return self.peak(RECIPES[precision].peak)
        key = peak_key(precision, self.peak_flops)
        if key not in self.peak_flops:
            if precision == "fp8":  # Transformer Engine refuses fp8 below compute capability 8.9
                raise SpecError("TrainingSpec", "precision", f"fp8 needs fp8 tensor cores (Hopper, Ada, Blackwell, "
                                                         f"CDNA3), and {self.name} has none: no fp8 peak")
            if precision == "fp4":
                raise SpecError("TrainingSpec", "precision", f"fp4 GEMMs need fp4 tensor cores (Blackwell, CDNA4), "
                                                         f"and {self.name} has none: no fp4 peak")
            # bf16 on a V100, or a precision a calibrated profile did not measure.
            # What it has, so the one to write is in the refusal: a CPU profile times fp32 alone, and a case
            # that leaves training.precision out trains in bf16.
            has = ", ".join(sorted(self.peak_flops)) or "none"
            raise SpecError("TrainingSpec", "precision", f"{precision} has no peak on {self.name} (its peak_tflops "
                                                     f"has {has} alone): give training.precision one of them")
        return self.peak_flops[key]


def peak_key(precision: str, peak_flops: Mapping[str, float]) -> str:
    """Which tensor-core peak a GEMM in ``precision`` runs at: TF32 for fp32 where the GPU has
    it (PyTorch's allow_tf32 matmuls, cuBLAS's TF32 mode), else the precision's own."""
    return "tf32" if precision == "fp32" and "tf32" in peak_flops else precision


@dataclass(frozen=True)
class FabricSpec:
    """The scale-out network between NVLink domains: a property of the cluster, not the GPU.

    The NIC line rate per GPU is ``GPUSpec.inter_node_bandwidth`` (the cluster's, where it
    sets one); the fabric says what collectives achieve over it and where they slow down.
    """

    name: str = "generic"
    # Achieved bus bandwidth over the NIC line rate, for a collective spanning 2 nodes, and at
    # larger spans ((nodes, efficiency) points, interpolated in log2(nodes), held beyond the
    # last): nccl-tests bus bandwidth falls as rings and trees grow (p5 EFA all-reduce 357 GB/s
    # at 4 nodes, 321 at 32).
    efficiency: float = 0.8
    efficiency_at: tuple[tuple[int, float], ...] = ()
    latency_s: float = 10e-6  # α per algorithm step that crosses the fabric (a ring's)
    # α per step of a tree across the fabric (the all-reduce at scale), where it differs from a
    # ring's: NCCL's tree forwards and reduces each chunk at every level, and a ring step only
    # forwards it. None: ``latency_s``.
    tree_latency_s: Optional[float] = None
    # NICs of a node that one collective drives at once. None: one per group member on the
    # node (NCCL's rail-aligned rings reach the sum of the NICs).
    rails: Optional[float] = None
    # Achieved share of a GPU's NIC line rate for all-to-all traffic that leaves its NVLink
    # domain (expert-parallel dispatch and combine; ``collectives.all_to_all_time``).
    alltoall_efficiency: float = 0.8
    # Nodes under one leaf group (a DGX SuperPOD scalable unit is 32 nodes) and the
    # oversubscription of the links above it (1: non-blocking). A collective whose group
    # spans more nodes than a leaf holds crosses the spine at 1/oversubscription of the NIC rate.
    leaf_nodes: Optional[int] = None
    oversubscription: float = 1.0

    def __post_init__(self) -> None:
        s = FabricSpec
        for name in ("efficiency", "alltoall_efficiency"):
            value = getattr(self, name)
            _positive_float(s, name, value)
            if value > 1.5:
                raise SpecError(s, name, f"expected a fraction of the line rate (at most 1.5), got {value!r}")
        for nodes, value in self.efficiency_at:
            _positive_int(s, "efficiency_at", nodes)
            _positive_float(s, "efficiency_at", value)
            if value > 1.5:
                raise SpecError(s, "efficiency_at", f"expected a fraction of the line rate (at most 1.5), got {value!r}")
        for name in ("latency_s", "tree_latency_s"):
            value = getattr(self, name)
            if name == "tree_latency_s" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise SpecError(s, name, f"expected a non-negative time, got {value!r}")
        if self.rails is not None:
            _positive_float(s, "rails", self.rails)
            if self.rails < 1:
                raise SpecError(s, "rails", f"expected a number of NICs ≥ 1, got {self.rails!r}")
        if self.leaf_nodes is not None:
            _positive_int(s, "leaf_nodes", self.leaf_nodes)
        _positive_float(s, "oversubscription", self.oversubscription)
        if self.oversubscription < 1:
            raise SpecError(s, "oversubscription", f"expected a ratio ≥ 1, got {self.oversubscription!r}")

    def efficiency_for(self, nodes: int) -> float:
        """Achieved share of the line rate for a collective spanning ``nodes`` nodes."""
        points = [(2, self.efficiency)] + sorted(self.efficiency_at)
        x = math.log2(max(nodes, 2))
        for (n0, e0), (n1, e1) in zip(points, points[1:]):
            x0, x1 = math.log2(n0), math.log2(n1)
            if x <= x1:
                return e0 + (e1 - e0) * (x - x0) / (x1 - x0) if x1 > x0 else e1
        return points[-1][1]


@dataclass(frozen=True)
class ClusterSpec:
    __hash__ = cached_hash
    __getstate__ = state_without_hash

    gpu: GPUSpec
    num_gpus: int
    fabric: FabricSpec = field(default_factory=FabricSpec)

    def __post_init__(self) -> None:
        _positive_int(ClusterSpec, "num_gpus", self.num_gpus)

    @property
    def num_nodes(self) -> int:
        return math.ceil(self.num_gpus / self.gpu.gpus_per_node)
