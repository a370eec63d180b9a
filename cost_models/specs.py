"""Specs: the validated, immutable inputs of every cost model.

All quantities are in base SI units: bytes, bytes per second, FLOP per second,
seconds. Validation lives here, in one place (as Megatron-core's
``TransformerConfig.__post_init__`` does): a spec that exists is a spec the
cost models can use. Each failure raises :class:`SpecError` naming the field,
so a caller that knows where the value came from (a case file) can say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from functools import cached_property, lru_cache
from typing import Mapping, Optional

from .behaviour import GENERIC, EngineBehaviour
from .frozen import cached_hash
from .quantization import FP8_RECIPES, Recipe, recipe_for

ACTIVATIONS = ("gelu", "swiglu")
PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4")
# Block-scaled formats a GPU's tensor cores run natively (GPUSpec.block_scaling): OCP MX (32-element
# blocks, E8M0 scales) and NVIDIA's NVFP4 (16-element blocks, E4M3 scales).
BLOCK_SCALED_FORMATS = ("mxfp8", "mxfp4", "nvfp4")
OPTIMIZERS = ("adam", "adamw", "sgd")
# How expert-parallel tokens reach their experts (``TrainingSpec.expert_dispatch``): one
# all-to-all copy per chosen expert, or DeepEP-style kernels that send a token once to each
# NVLink domain holding one of its experts and forward it inside the domain.
EXPERT_DISPATCHES = ("all_to_all", "deepep")
RECOMPUTE = ("none", "selective", "full")
# The parts of a layer selective recomputation can run again, in megatron-core's
# ``--recompute-modules`` names (``TransformerConfig.recompute_modules``); what each frees is
# ``activations.selective_freed_bytes``, what it runs again ``step_time.selective_recompute_time``
# and ``experts.moe_recompute_time``.
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "layernorm", "mlp", "moe_act", "moe", "shared_experts")


class SpecError(ValueError):
    """A spec field holds a value the cost models cannot use.

    The error names the field in the cost models' own terms: ``spec`` is the name of the spec
    class that holds it (``"Layout"``, ``"ModelSpec"``), ``field`` the field's name there
    (``"tp"``, ``"hidden_size"``; a mapping's entry as ``"peak_flops.bf16"``). Where the spec's
    values came from (a case file, a launch command) is the caller's to say: the case layer
    turns ``(spec, field)`` into the case-file key (``planner.case.case_key``).
    """

    def __init__(self, spec: "type | str", field: str, message: str):
        name = spec if isinstance(spec, str) else spec.__name__
        super().__init__(f"{name}.{field}: {message}")
        self.spec = name
        self.field = field
        self.message = message


def _positive_int(spec: "type | str", name: str, value: object) -> None:
    if type(value) is int and value >= 1:  # the common case first: a search builds layouts by the million
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(spec, name, f"expected a positive integer, got {value!r}")


def _non_negative_int(spec: "type | str", name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(spec, name, f"expected a non-negative integer, got {value!r}")


def _positive_float(spec: "type | str", name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(spec, name, f"expected a positive number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise SpecError(spec, name, f"expected a positive finite number, got {value!r}")


def _choice(spec: "type | str", name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(spec, name, f"expected one of {', '.join(choices)}, got {value!r}")


ATTENTION_TYPES = ("mha", "gqa", "mla")
NORMALIZATIONS = ("rmsnorm", "layernorm")
POSITION_EMBEDDINGS = ("rope", "learned", "none")
ROUTERS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class ModelSpec:
    __hash__ = cached_hash

    """A decoder-only transformer (GPT / Llama family), dense or a mixture of experts.

    Attention is multi-head or grouped-query (``num_kv_heads``), or DeepSeek's multi-head
    latent attention (``attention_type: mla``; DeepSeek-V2 report, arXiv:2405.04434, §2.1):
    queries through a rank-``q_lora_rank`` bottleneck (none when 0), keys and values
    up-projected from a shared rank-``kv_lora_rank`` latent, each query and key head
    ``qk_head_dim`` wide plus ``qk_rope_head_dim`` rotary dimensions (the rotary key is one
    head shared by all), each value head ``v_head_dim`` wide. Names follow megatron-core's
    ``MLATransformerConfig``.

    A mixture of experts (``num_experts`` > 0) replaces the MLP of its MoE layers by a router,
    ``num_experts`` routed experts of width ``moe_ffn_hidden_size`` of which each token uses
    ``moe_top_k``, and optionally shared experts every token uses
    (``moe_shared_expert_ffn_hidden_size``: their total width, megatron-core's
    ``moe_shared_expert_intermediate_size``). The first ``moe_first_dense_layers`` layers keep a
    dense MLP of ``ffn_hidden_size`` (DeepSeek's ``first_k_dense_replace``); after them every
    ``moe_layer_freq``-th layer is an MoE layer (Llama 4 Maverick's interleave step 2).
    ``moe_capacity_factor`` caps (and pads) the tokens each expert takes at that multiple of
    the mean (Megatron's ``--moe-expert-capacity-factor`` with
    ``--moe-pad-expert-input-to-capacity``); None is dropless. ``moe_load_imbalance`` is the
    busiest expert-parallel rank's tokens over the mean: 1 for the force-balanced routing of
    published benchmarks, above it for a real router.

    ``mtp_layers`` multi-token prediction modules follow the decoder (DeepSeek-V3 report,
    arXiv:2412.19437, §2.2; megatron-core ``MultiTokenPredictionBlock``, ``--mtp-num-layers``;
    Hugging Face's ``num_nextn_predict_layers``). Each joins the previous depth's hidden state
    and the embedding of the token one further ahead (two norms, a 2h → h projection), runs one
    transformer layer of the decoder's last layer's kind (an MoE layer for DeepSeek-V3), a final
    norm, and the shared LM head and loss again. They run on the last pipeline stage.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    num_kv_heads: int = 0  # 0: same as num_attention_heads (multi-head attention)
    ffn_hidden_size: int = 0  # 0: 4 * hidden_size
    activation: str = "gelu"
    tied_embeddings: bool = False
    # Dropout keeps a one-byte mask per dropped element (Korthikanti et al. 2022, §4.1);
    # modern Llama-style training runs with none.
    dropout: float = 0.0
    # Width of one attention head; 0: hidden_size / num_attention_heads. Qwen3 (128 at hidden
    # 2048 with 32 heads) and GPT-OSS (64 at 2880 with 64 heads) decouple the two.
    head_dim: int = 0
    attention_type: str = "gqa"  # mha and gqa are the same thing here: num_kv_heads says which
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    num_experts: int = 0  # 0: a dense model
    moe_top_k: int = 0
    moe_ffn_hidden_size: int = 0  # 0: ffn_hidden_size (megatron-core's default)
    moe_shared_expert_ffn_hidden_size: int = 0
    moe_first_dense_layers: int = 0
    moe_layer_freq: int = 1
    moe_router: str = "softmax"
    # Group-limited routing: the experts in this many groups of contiguous experts, of which a
    # token picks ``moe_router_group_topk`` before its top k (megatron-core's
    # ``moe_router_num_groups``/``moe_router_group_topk``, Hugging Face's ``n_group``/``topk_group``;
    # DeepSeek-V3: 8 and 4). 1 and 1: none.
    moe_router_num_groups: int = 1
    moe_router_group_topk: int = 1
    moe_capacity_factor: Optional[float] = None
    moe_load_imbalance: float = 1.0
    mtp_layers: int = 0
    # Sliding-window attention: a query attends to the last ``sliding_window`` keys only (0: every
    # earlier key), in every layer, or, with ``sliding_window_full_every`` N, in every layer but each
    # N-th (megatron-core's ``window_size`` and ``window_attn_skip_freq``; GPT-OSS: 128 and 2,
    # Mistral 7B v0.1: 4096 in every layer). Priced in the attention's FLOPs and kernel shape
    # (``flops.attention_flops``); flash attention's memory does not depend on the keys.
    sliding_window: int = 0
    sliding_window_full_every: int = 0
    # The architecture as a launcher must build it, where the case knows it (a preset's, an HF
    # config's; None: not said). The emitters write them, so that the model launched is the model
    # priced: the norm (rmsnorm or layernorm), the position embedding (rope, learned or none) and the
    # rotary base, biases on the linear layers, and a norm on queries and keys (Qwen3, priced as the
    # element-wise pass it is: ``step_time.elementwise_bytes``; the others are work the layer's
    # kernels already count).
    normalization: Optional[str] = None
    position_embedding: Optional[str] = None
    rope_base: Optional[float] = None
    linear_bias: Optional[bool] = None
    qk_norm: Optional[bool] = None

    def __post_init__(self) -> None:
        s = ModelSpec
        for name in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
            _positive_int(s, name, getattr(self, name))
        if self.normalization is not None:
            _choice(s, "normalization", self.normalization, NORMALIZATIONS)
        if self.position_embedding is not None:
            _choice(s, "position_embedding", self.position_embedding, POSITION_EMBEDDINGS)
        if self.rope_base is not None:
            _positive_float(s, "rope_base", self.rope_base)
        _choice(s, "attention_type", self.attention_type, ATTENTION_TYPES)
        mla = self.attention_type == "mla"
        if mla:
            if self.num_kv_heads not in (0, self.num_attention_heads):
                raise SpecError(s, "num_kv_heads", "does not apply to attention_type mla (every head has its own "
                                                   "keys and values, up-projected from the latent)")
            object.__setattr__(self, "num_kv_heads", self.num_attention_heads)
            for name in ("kv_lora_rank", "qk_head_dim", "qk_rope_head_dim", "v_head_dim"):
                _positive_int(s, name, getattr(self, name))
            _non_negative_int(s, "q_lora_rank", self.q_lora_rank)
            if self.head_dim and self.head_dim != self.qk_head_dim + self.qk_rope_head_dim:
                raise SpecError(s, "head_dim", "with attention_type mla it is qk_head_dim + qk_rope_head_dim "
                                               f"= {self.qk_head_dim + self.qk_rope_head_dim}, got {self.head_dim}")
        else:
            for name in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, name):
                    raise SpecError(s, name, "applies only with attention_type mla")
        if self.num_kv_heads == 0:
            object.__setattr__(self, "num_kv_heads", self.num_attention_heads)
        if self.ffn_hidden_size == 0:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        _positive_int(s, "num_kv_heads", self.num_kv_heads)
        _positive_int(s, "ffn_hidden_size", self.ffn_hidden_size)
        _choice(s, "activation", self.activation, ACTIVATIONS)
        if self.head_dim == 0 and not mla:
            if self.hidden_size % self.num_attention_heads:
                raise SpecError(s, "num_attention_heads",
                                f"must divide hidden_size {self.hidden_size}, got {self.num_attention_heads} "
                                "(or give head_dim)")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        elif mla:
            object.__setattr__(self, "head_dim", self.qk_head_dim + self.qk_rope_head_dim)
        _positive_int(s, "head_dim", self.head_dim)
        if self.num_attention_heads % self.num_kv_heads:
            raise SpecError(s, "num_kv_heads",
                            f"must divide num_attention_heads {self.num_attention_heads}, got {self.num_kv_heads}")
        if self.attention_type == "mha" and self.num_kv_heads != self.num_attention_heads:
            raise SpecError(s, "attention_type", f"mha has as many key/value heads as heads "
                                                 f"({self.num_attention_heads}), got num_kv_heads {self.num_kv_heads}; "
                                                 "say gqa")
        if not isinstance(self.tied_embeddings, bool):
            raise SpecError(s, "tied_embeddings", f"expected true or false, got {self.tied_embeddings!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0.0 <= self.dropout < 1.0:
            raise SpecError(s, "dropout", f"expected a probability in [0, 1), got {self.dropout!r}")
        _non_negative_int(s, "mtp_layers", self.mtp_layers)
        _non_negative_int(s, "sliding_window", self.sliding_window)
        _non_negative_int(s, "sliding_window_full_every", self.sliding_window_full_every)
        if self.sliding_window_full_every and not self.sliding_window:
            raise SpecError(s, "sliding_window_full_every", "applies only with a sliding_window")
        if self.sliding_window_full_every == 1:
            raise SpecError(s, "sliding_window_full_every", "1 would leave no layer windowed: expected 0 (every "
                                                            "layer windowed) or at least 2")
        self._check_experts()

    @property
    def windowed_layers(self) -> int:
        """Layers whose attention runs over the sliding window: all, or all but each
        ``sliding_window_full_every``-th (megatron-core ``is_layer_window_attention``: layer numbers
        from 1, full where the number divides by N)."""
        if not self.sliding_window:
            return 0
        every = self.sliding_window_full_every
        return self.num_layers - (self.num_layers // every if every else 0)

    def _check_experts(self) -> None:
        s = ModelSpec
        _non_negative_int(s, "num_experts", self.num_experts)
        if not self.num_experts:
            for name, unset in (("moe_top_k", 0), ("moe_ffn_hidden_size", 0), ("moe_shared_expert_ffn_hidden_size", 0),
                                ("moe_first_dense_layers", 0), ("moe_layer_freq", 1), ("moe_router", "softmax"),
                                ("moe_router_num_groups", 1), ("moe_router_group_topk", 1),
                                ("moe_capacity_factor", None), ("moe_load_imbalance", 1.0)):
                if getattr(self, name) != unset:
                    raise SpecError(s, name, "applies only to a mixture of experts (num_experts > 0)")
            return
        _positive_int(s, "moe_top_k", self.moe_top_k)
        if self.moe_top_k > self.num_experts:
            raise SpecError(s, "moe_top_k", f"at most num_experts {self.num_experts}, got {self.moe_top_k}")
        if self.moe_ffn_hidden_size == 0:
            object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)
        _positive_int(s, "moe_ffn_hidden_size", self.moe_ffn_hidden_size)
        _non_negative_int(s, "moe_shared_expert_ffn_hidden_size", self.moe_shared_expert_ffn_hidden_size)
        _non_negative_int(s, "moe_first_dense_layers", self.moe_first_dense_layers)
        _positive_int(s, "moe_layer_freq", self.moe_layer_freq)
        if self.num_moe_layers == 0:
            raise SpecError(s, "moe_first_dense_layers", f"leaves no MoE layer among the {self.num_layers} layers")
        _choice(s, "moe_router", self.moe_router, ROUTERS)
        self._check_router_groups()
        if self.moe_capacity_factor is not None:
            _positive_float(s, "moe_capacity_factor", self.moe_capacity_factor)
        _positive_float(s, "moe_load_imbalance", self.moe_load_imbalance)
        if self.moe_load_imbalance < 1:
            raise SpecError(s, "moe_load_imbalance", f"expected the busiest rank's share over the mean, at least 1, "
                                                     f"got {self.moe_load_imbalance!r}")

    def _check_router_groups(self) -> None:
        """megatron-core's checks (``TransformerConfig.__post_init__``), and enough experts in
        the picked groups for a token's k."""
        s = ModelSpec
        _positive_int(s, "moe_router_num_groups", self.moe_router_num_groups)
        _positive_int(s, "moe_router_group_topk", self.moe_router_group_topk)
        if self.num_experts % self.moe_router_num_groups:
            raise SpecError(s, "moe_router_num_groups", f"must divide num_experts {self.num_experts}, "
                                                        f"got {self.moe_router_num_groups}")
        if self.moe_router_group_topk > self.moe_router_num_groups:
            raise SpecError(s, "moe_router_group_topk", f"at most moe_router_num_groups {self.moe_router_num_groups}, "
                                                        f"got {self.moe_router_group_topk}")
        eligible = self.moe_router_group_topk * self.num_experts // self.moe_router_num_groups
        if self.moe_top_k > eligible:
            raise SpecError(s, "moe_router_group_topk", f"leaves {eligible} experts in the picked groups, fewer than "
                                                        f"moe_top_k {self.moe_top_k}")

    # --- attention shapes -------------------------------------------------------------

    @property
    def value_head_dim(self) -> int:
        """Width of one value (and attention-output) head."""
        return self.v_head_dim if self.attention_type == "mla" else self.head_dim

    @property
    def q_size(self) -> int:
        """Width of the queries (and of the keys, with all heads): heads × head dim."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the K projection: kv heads × head dim (GQA)."""
        return self.num_kv_heads * self.head_dim

    @property
    def v_size(self) -> int:
        """Width of the V projection: kv heads × value head dim."""
        return self.num_kv_heads * self.value_head_dim

    @property
    def context_size(self) -> int:
        """Width of the attention output, the input of the output projection: heads × value head dim."""
        return self.num_attention_heads * self.value_head_dim

    # --- experts ----------------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) holds experts: after the leading dense layers, every
        ``moe_layer_freq``-th layer, counting from the last of each group (Hugging Face Llama 4:
        ``(layer_idx + 1) % interleave_moe_layer_step == 0``)."""
        if not self.is_moe or index < self.moe_first_dense_layers:
            return False
        return (index - self.moe_first_dense_layers + 1) % self.moe_layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        if not self.is_moe:
            return 0
        return (self.num_layers - self.moe_first_dense_layers) // self.moe_layer_freq if \
            self.num_layers > self.moe_first_dense_layers else 0

    def moe_layers_in(self, start: int, count: int) -> int:
        """MoE layers among layers start … start + count − 1 (those whose index i has
        i − first_dense + 1 a positive multiple of the frequency)."""
        if not self.is_moe or count <= 0:
            return 0
        f = self.moe_layer_freq
        low = max(1, start - self.moe_first_dense_layers + 1)
        high = start + count - self.moe_first_dense_layers
        return max(0, high // f - (low - 1) // f)

    @property
    def mtp_layers_are_moe(self) -> bool:
        """Whether the multi-token prediction layers hold experts: they take the decoder's last
        layer's kind (megatron-core ``get_gpt_mtp_block_spec`` uses the last layer's spec;
        ``num_floating_point_operations``: ``last_layer_is_moe``)."""
        return self.is_moe_layer(self.num_layers - 1)

    @property
    def mtp_moe_layers(self) -> int:
        """The multi-token prediction layers that hold experts: all of them or none
        (:attr:`mtp_layers_are_moe`)."""
        return self.mtp_layers if self.mtp_layers_are_moe else 0

    @property
    def routed_factor(self) -> float:
        """Tokens the busiest expert rank takes, over the balanced mean: the capacity factor where
        experts are padded to it, else the load imbalance of a dropless router."""
        return self.moe_capacity_factor if self.moe_capacity_factor is not None else self.moe_load_imbalance


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


@dataclass(frozen=True)
class GPUSpec:
    __hash__ = cached_hash

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

    def __post_init__(self) -> None:
        s = GPUSpec
        for fmt in self.block_scaling:
            _choice(s, "block_scaling", fmt, BLOCK_SCALED_FORMATS)
        for name in ("memory_bytes", "hbm_bandwidth", "intra_node_bandwidth", "inter_node_bandwidth"):
            _positive_float(s, name, getattr(self, name))
        _positive_int(s, "gpus_per_node", self.gpus_per_node)
        _positive_int(s, "nvlink_domain", self.nvlink_domain)
        if self.sm_count is not None:
            _positive_int(s, "sm_count", self.sm_count)
        for precision, flops in self.peak_flops.items():
            _positive_float(s, f"peak_flops.{precision}", flops)

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
                raise SpecError(TrainingSpec, "precision", f"{precision} needs tensor cores that scale its blocks "
                                                         f"({'Blackwell or CDNA4' if precision == 'mxfp8' else 'Blackwell'}), "
                                                         f"and {self.name} has none (GPUSpec.block_scaling)")
            return self.peak(recipe_for(precision, None).peak)
        key = peak_key(precision, self.peak_flops)
        if key not in self.peak_flops:
            if precision == "fp8":  # Transformer Engine refuses fp8 below compute capability 8.9
                raise SpecError(TrainingSpec, "precision", f"fp8 needs fp8 tensor cores (Hopper, Ada, Blackwell, "
                                                         f"CDNA3), and {self.name} has none: no fp8 peak")
            if precision == "fp4":
                raise SpecError(TrainingSpec, "precision", f"fp4 GEMMs need fp4 tensor cores (Blackwell, CDNA4), "
                                                         f"and {self.name} has none: no fp4 peak")
            # bf16 on a V100, or a precision a calibrated profile did not measure.
            raise SpecError(TrainingSpec, "precision", f"{precision} has no peak on {self.name} "
                                                     f"(cluster.gpu.peak_tflops has no figure for it)")
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

    gpu: GPUSpec
    num_gpus: int
    fabric: FabricSpec = field(default_factory=FabricSpec)

    def __post_init__(self) -> None:
        _positive_int(ClusterSpec, "num_gpus", self.num_gpus)

    @property
    def num_nodes(self) -> int:
        return math.ceil(self.num_gpus / self.gpu.gpus_per_node)


@dataclass(frozen=True)
class TrainingSpec:
    __hash__ = cached_hash

    global_batch_size: int  # sequences per optimizer step
    seq_len: int
    precision: str = "bf16"
    optimizer: str = "adam"
    # Flash attention keeps no s×s score matrix for backward (Dao et al. 2022, §3.1).
    flash_attention: bool = True
    # How the engine runs the job (``cost_models.behaviour``); the planner's engines are in
    # ``planner/engines/``.
    engine: EngineBehaviour = GENERIC
    # Tensor-parallel collectives pipelined with their GEMMs (Megatron --tp-comm-overlap,
    # torchtitan async TP).
    tp_comm_overlap: bool = False
    # Expert-parallel dispatch and combine run beside another micro-batch's compute (Megatron's
    # --overlap-moe-expert-parallel-comm, pairing one micro-batch's forward with another's
    # backward; DeepSeek-V3's DualPipe).
    moe_comm_overlap: bool = False
    # Gradients accumulated and reduced in fp32 under mixed precision; None: the engine's
    # default (``cost_models.model_states.fp32_gradients``).
    fp32_grads: Optional[bool] = None
    # How fp8 scales its tensors (``cost_models.quantization.FP8_RECIPES``); None: the engine's
    # default (``EngineBehaviour.fp8_recipe``). Only with precision fp8: mxfp8 and nvfp4 are recipes.
    fp8_recipe: Optional[str] = None
    # Weights quantized on their shard before the ZeRO gather, which then moves the low-precision
    # weights (Megatron --fp8-param-gather, MLPerf's FP8_PARAM_GATHER; torchao's FSDP float8
    # all-gather). None: the engine's default at the job's layout, which a Job resolves
    # (``EngineBehaviour.gathers_quantized_weights``).
    fp8_param_gather: Optional[bool] = None
    # The expert-parallel dispatch (``EXPERT_DISPATCHES``); None: the engine's
    # (``EngineBehaviour.hierarchical_dispatch``: Megatron's flex dispatcher runs DeepEP).
    expert_dispatch: Optional[str] = None
    # The optimizer keeps an fp32 master copy of the 16-bit weights and fp32 moments (mixed
    # precision, Micikevicius et al. 2018, §3.1). False: "pure bf16": the optimizer steps the
    # bf16 weights themselves and its moments take their dtype, as torch.optim.Adam does for a
    # model built in bf16 (NeMo AutoModel builds its models in config.torch_dtype, bf16).
    master_weights: bool = True
    # The loss compiled by torch.compile (torchtitan's compile.components "loss"; a script's
    # torch.compile(loss_fn)): inductor fuses its upcast, log-softmax and NLL
    # (``EngineBehaviour.compiled_loss``). None: the engine's default (``loss_compiled``).
    compiled_loss: Optional[bool] = None
    # The vendor's fused attention kernel (cuDNN through Transformer Engine's DotProductAttention)
    # rather than a FlashAttention-2-class one, timed at ``Performance.attention_efficiency_fused``
    # (``EngineBehaviour.fused_attention``). None: the engine's default (``attention_fused``).
    fused_attention: Optional[bool] = None

    def __post_init__(self) -> None:
        s = TrainingSpec
        _positive_int(s, "global_batch_size", self.global_batch_size)
        _positive_int(s, "seq_len", self.seq_len)
        _choice(s, "precision", self.precision, PRECISIONS)
        _choice(s, "optimizer", self.optimizer, OPTIMIZERS)
        if not isinstance(self.engine, EngineBehaviour):
            raise SpecError(s, "engine", f"expected an engine's behaviour, got {self.engine!r}")
        for name in ("flash_attention", "tp_comm_overlap", "fp32_grads", "moe_comm_overlap", "fp8_param_gather",
                     "master_weights", "compiled_loss", "fused_attention"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name in ("fp32_grads", "fp8_param_gather", "compiled_loss",
                                                             "fused_attention") and value is None):
                raise SpecError(s, name, f"expected true or false, got {value!r}")
        if self.fused_attention and not self.flash_attention:
            # The fused kernels are flash-style: they never write the s×s scores, which
            # flash_attention false says the attention keeps.
            raise SpecError(s, "fused_attention", "true needs flash_attention true: a fused attention kernel "
                                                  "keeps no s×s scores")
        if not self.master_weights:
            # Without a master copy the weights are the bf16 ones the GEMMs read (fp8 recipes
            # quantize them per GEMM): fp16 would need a master for its loss scaling, and fp32
            # weights are their own master already.
            if self.precision in ("fp32", "fp16"):
                raise SpecError(s, "master_weights", f"false needs 16-bit weights kept in bf16 (precision bf16, fp8, "
                                                     f"mxfp8 or nvfp4), not {self.precision}")
            if self.fp32_grads:
                raise SpecError(s, "master_weights", "false keeps the gradients in bf16, the weights' dtype: "
                                                     "fp32_grads needs the fp32 master weights")
        if self.fp8_recipe is not None:
            _choice(s, "fp8_recipe", self.fp8_recipe, FP8_RECIPES)
            if self.precision != "fp8":
                raise SpecError(s, "fp8_recipe", f"applies only with precision fp8 ({self.precision} is a recipe "
                                                 f"of its own)" if self.precision in ("mxfp8", "nvfp4")
                                else f"applies only with precision fp8, not {self.precision}")
        if self.expert_dispatch is not None:
            _choice(s, "expert_dispatch", self.expert_dispatch, EXPERT_DISPATCHES)
        if self.fp8_param_gather and self.precision not in ("fp8", "mxfp8", "nvfp4"):
            raise SpecError(s, "fp8_param_gather", f"applies only to a low precision (fp8, mxfp8, nvfp4), "
                                                   f"not {self.precision}")

    @property
    def attention_fused(self) -> bool:
        """Whether attention runs the vendor's fused kernel: as the case says, else as the engine does."""
        return self.engine.fused_attention if self.fused_attention is None else self.fused_attention

    @property
    def loss_compiled(self) -> bool:
        """Whether the loss runs compiled: as the case says, else as the engine does."""
        return self.engine.compiled_loss if self.compiled_loss is None else self.compiled_loss

    @property
    def hierarchical_dispatch(self) -> bool:
        """Whether the expert-parallel dispatch sends a token once per NVLink domain
        (``cost_models.experts.dispatch_combine_time``): as the case says, else as the engine does."""
        if self.expert_dispatch is None:
            return self.engine.hierarchical_dispatch
        return self.expert_dispatch == "deepep"

    @property
    def recipe(self) -> Optional[Recipe]:
        """The low-precision recipe the linear GEMMs run (``cost_models.quantization``); None
        for fp32, fp16 and bf16. fp8 without a recipe runs the engine's default."""
        return recipe_for(self.precision, self.fp8_recipe or self.engine.fp8_recipe)

    @property
    def delayed_scaling(self) -> bool:
        """fp8 under delayed scaling, with which megatron-core recomputes neither the experts'
        activation nor the norms (``TransformerConfig.__post_init__``)."""
        return self.recipe is not None and self.recipe.name == "delayed"




@dataclass(frozen=True)
class Overheads:
    """Memory that is neither model state nor activations, each a documented default.

    - ``cuda_context``: what lives outside PyTorch's caching allocator: the CUDA context
      and the NCCL communicators' own buffers, which NCCL allocates itself. PyTorch 2.x on
      Hopper shows 0.5–1 GiB before the first tensor (PyTorch "CUDA semantics" notes; NCCL
      user guide, NCCL_BUFFSIZE 4 MiB per channel and peer); we take 1 GiB. The allocator's
      counters (``max_memory_allocated``, ``max_memory_reserved``, what training logs and
      published peaks report) never hold it, so it is taken off the capacity a layout's peak
      must fit in (``memory.usable_bytes``), not added to the peak.
    - ``comm_buffers``: gradient-reduction buckets and all-gather staging. Megatron's
      DDP bucket holds 40 M parameters by default and DeepSpeed's reduce bucket
      5e8 elements; a 2-byte bucket of 40 M elements is 0.08 GB, 5e8 elements 1 GB.
      We take 0.5 GiB as the middle.
    - ``fragmentation``: share of the dynamic (activation) memory lost to the caching
      allocator's rounding and fragmentation; PyTorch's allocator rounds to 512 B
      blocks inside 2 MiB / 20 MiB segments, observed at 5–15 % for training.
    """

    cuda_context: float = float(2**30)
    comm_buffers: float = float(2**29)
    fragmentation: float = 0.10

    def __post_init__(self) -> None:
        for name in ("cuda_context", "comm_buffers", "fragmentation"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise SpecError(Overheads, name, f"expected a non-negative number, got {value!r}")
        if self.fragmentation >= 1:
            raise SpecError(Overheads, "fragmentation", f"expected a fraction below 1, got {self.fragmentation!r}")


@dataclass(frozen=True)
class Layout:
    """How one training job is spread over the cluster (Megatron rank order: tp, cp, dp, pp)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    vpp: int = 1  # virtual pipeline stages (model chunks) per pipeline rank
    micro_batch_size: int = 1
    # Expert parallelism (Megatron's MoE parallel folding): the MoE layers' experts are split
    # over ep ranks and each expert's matrices over etp ranks, on a grid etp × ep × edp over
    # the same GPUs as the attention's tp × cp × dp (``expert_data_parallel``). etp None: tp
    # (megatron-core's default).
    ep: int = 1
    etp: Optional[int] = None
    zero_stage: int = 0  # Megatron's distributed optimizer is stage 1
    sequence_parallel: bool = False
    recompute: str = "none"
    recompute_num_layers: Optional[int] = None  # with full: layers per stage recomputed; None = all
    # With selective: the modules recomputed (RECOMPUTE_MODULES); None = those that free memory
    # for this model and training (``activations.selective_modules``).
    recompute_modules: Optional[tuple[str, ...]] = None
    # Layers held by each pipeline stage; None leaves the split to the engine
    # (``cost_models.partition``).
    stage_layers: Optional[tuple[int, ...]] = None
    # Layers of each of the pp·vpp model chunks in model order (chunk v·pp + r is rank r's v-th:
    # what a ``--pipeline-model-parallel-layout`` counts); None splits each stage's layers as
    # evenly as they go, the spare ones first (``partition.chunk_layers``). Sets stage_layers. Every
    # chunk holds a layer but the last, which may hold only the MTP layers and the loss.
    chunk_layers: Optional[tuple[int, ...]] = None
    # Megatron's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split:
    # the embedding (loss) counts as one layer of the first (last) virtual stage.
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    # Offload to host memory (``cost_models.offload``): the share of the optimizer states
    # (fp32 master weights and moments) kept and stepped on the CPU; ZeRO-3's parameter (and
    # gradient) shards kept there between uses; the saved activations of the first N layers
    # of each stage, copied out in forward and back in backward.
    offload_optimizer: float = 0.0
    offload_params: bool = False
    offload_activations: int = 0

    def __post_init__(self) -> None:
        s = Layout
        for name in ("dp", "tp", "pp", "cp", "vpp", "micro_batch_size", "ep"):
            _positive_int(s, name, getattr(self, name))
        if self.etp is not None:
            _positive_int(s, "etp", self.etp)
        if isinstance(self.zero_stage, bool) or self.zero_stage not in (0, 1, 2, 3):
            raise SpecError(s, "zero_stage", f"expected 0, 1, 2 or 3, got {self.zero_stage!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise SpecError(s, "sequence_parallel", f"expected true or false, got {self.sequence_parallel!r}")
        _choice(s, "recompute", self.recompute, RECOMPUTE)
        if self.recompute_num_layers is not None:
            if isinstance(self.recompute_num_layers, bool) or not isinstance(self.recompute_num_layers, int) \
                    or self.recompute_num_layers < 0:
                raise SpecError(s, "recompute_num_layers",
                                f"expected a non-negative integer, got {self.recompute_num_layers!r}")
            if self.recompute != "full":
                raise SpecError(s, "recompute_num_layers", "applies only with recompute: full")
        if self.recompute_modules is not None:
            if self.recompute != "selective":
                raise SpecError(s, "recompute_modules", "applies only with recompute: selective")
            if not self.recompute_modules:
                raise SpecError(s, "recompute_modules", "expected at least one module (nothing recomputed is "
                                                        "recompute: none)")
            for name in self.recompute_modules:
                _choice(s, "recompute_modules", name, RECOMPUTE_MODULES)
            if len(set(self.recompute_modules)) != len(self.recompute_modules):
                raise SpecError(s, "recompute_modules", f"names a module twice: {list(self.recompute_modules)}")
        if self.sequence_parallel and self.tp == 1:
            raise SpecError(s, "sequence_parallel", "needs tp > 1")
        for name in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise SpecError(s, name, f"expected true or false, got {value!r}")
            if value and self.pp == 1:
                raise SpecError(s, name, "needs pp > 1")
            if value and self.stage_layers is not None:
                raise SpecError(s, name, "give either stage_layers or the account-for flags, not both")
        if self.vpp > 1 and self.pp == 1:
            raise SpecError(s, "vpp", "interleaving needs pp > 1")
        f = self.offload_optimizer
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= 1:
            raise SpecError(s, "offload_optimizer", f"expected a fraction in [0, 1], got {f!r}")
        if not isinstance(self.offload_params, bool):
            raise SpecError(s, "offload_params", f"expected true or false, got {self.offload_params!r}")
        if self.offload_params and self.zero_stage != 3:
            raise SpecError(s, "offload_params", "needs zero_stage 3 (only sharded parameters live off the GPU)")
        n = self.offload_activations
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise SpecError(s, "offload_activations", f"expected a non-negative integer, got {n!r}")
        if self.chunk_layers is not None:
            self._check_chunk_layers()
        if self.stage_layers is not None:
            if len(self.stage_layers) != self.pp:
                raise SpecError(s, "stage_layers", f"expected {self.pp} entries (one per stage), got {len(self.stage_layers)}")
            for n in self.stage_layers:
                # A stage may hold no decoder layer: the edges still hold the embedding or the LM
                # head, and an engine that spreads blocks over more stages than there are layers
                # (nanotron) leaves some with none.
                if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                    raise SpecError(s, "stage_layers", f"expected non-negative layer counts, got {n!r}")

    def _check_chunk_layers(self) -> None:
        s, chunks = Layout, self.chunk_layers
        if len(chunks) != self.pp * self.vpp:
            raise SpecError(s, "chunk_layers", f"expected pp·vpp = {self.pp * self.vpp} entries (one per model "
                                               f"chunk), got {len(chunks)}")
        # The model's last chunk may hold no decoder layer when it holds the MTP modules and the loss
        # (Megatron-Bridge's DeepSeek-V3 layout on H100, "Et|(tt|)*30mL"); Job checks the model has them.
        for i, n in enumerate(chunks):
            last = i == len(chunks) - 1
            if isinstance(n, bool) or not isinstance(n, int) or n < (0 if last else 1):
                raise SpecError(s, "chunk_layers", f"expected a positive layer count for every model chunk (the last "
                                                   f"may hold none where it holds the MTP layers), got {n!r}")
        from .partition import rank_chunks

        stages = tuple(sum(c) for c in rank_chunks(chunks, self.pp))
        if self.stage_layers is not None and tuple(self.stage_layers) != stages:
            raise SpecError(s, "chunk_layers", f"hold {list(stages)} layers per stage, but stage_layers says "
                                               f"{list(self.stage_layers)}")
        object.__setattr__(self, "stage_layers", stages)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def offloads(self) -> bool:
        return bool(self.offload_optimizer or self.offload_params or self.offload_activations)

    @property
    def expert_tp(self) -> int:
        """Expert tensor parallel degree: etp, else tp."""
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        """Expert data parallel: the ranks that hold the same experts, tp·cp·dp / (etp·ep)
        (megatron-core ``parallel_state``: the expert grid folds over the attention's)."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

    def with_changes(self, **changes) -> "Layout":
        # dataclasses.replace inspects the fields on every call; the search calls this for every
        # rung of every recompute ladder. The new layout is validated all the same.
        return Layout(**{**self.__dict__, **changes})


@lru_cache(maxsize=256)  # a search builds a Job for every layout it scores
def _with_param_gather(training: TrainingSpec, keep: bool) -> TrainingSpec:
    return TrainingSpec(**{**{f.name: getattr(training, f.name) for f in fields(TrainingSpec)},
                           "fp8_param_gather": keep})


@dataclass(frozen=True)
class Job:
    """Everything the cost models need: what is trained, on what, and how it is laid out.

    Cross-spec rules live in :meth:`__post_init__`, the one place a layout is
    checked against the model, cluster and batch.
    """

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layout: Layout
    overheads: Overheads = field(default_factory=Overheads)

    def __post_init__(self) -> None:
        m, c, t, lay = self.model, self.cluster, self.training, self.layout
        s = Layout
        if t.fp8_param_gather is None:
            # The engine's default depends on the layout's ZeRO stage: the cost models read the
            # resolved flag; the request is kept for the same job at another layout (with_layout).
            recipe = t.recipe
            keep = recipe is not None and t.engine.gathers_quantized_weights(recipe.name, lay.zero_stage,
                                                                             lay.offload_optimizer > 0)
            object.__setattr__(self, "_requested", t)
            object.__setattr__(self, "training", _with_param_gather(t, keep))
        if lay.world_size != c.num_gpus:
            raise SpecError(s, "dp", f"dp·tp·pp·cp = {lay.dp}·{lay.tp}·{lay.pp}·{lay.cp} = {lay.world_size} "
                                     f"must equal the cluster's {c.num_gpus} GPUs")
        if m.num_attention_heads % lay.tp:
            raise SpecError(s, "tp", f"must divide num_attention_heads {m.num_attention_heads}, got {lay.tp}")
        if m.num_kv_heads % lay.tp and lay.tp % m.num_kv_heads:
            raise SpecError(s, "tp", f"must divide or be a multiple of num_kv_heads {m.num_kv_heads}, got {lay.tp}")
        if m.ffn_hidden_size % lay.tp and m.num_moe_layers < m.num_layers:
            raise SpecError(s, "tp", f"must divide ffn_hidden_size {m.ffn_hidden_size}, got {lay.tp}")
        if m.moe_shared_expert_ffn_hidden_size % lay.tp:
            raise SpecError(s, "tp", f"must divide moe_shared_expert_ffn_hidden_size "
                                     f"{m.moe_shared_expert_ffn_hidden_size}, got {lay.tp}")
        self._check_experts()
        if t.expert_dispatch == "deepep" and m.moe_capacity_factor is not None:
            raise SpecError(TrainingSpec, "expert_dispatch",
                            "deepep pads no expert to a capacity (megatron-core's flex dispatcher refuses "
                            "moe_pad_expert_input_to_capacity): drop model.moe_capacity_factor or dispatch all_to_all")
        if lay.cp > 1 and t.seq_len % (2 * lay.cp):
            raise SpecError(s, "cp", f"seq_len {t.seq_len} must divide by 2·cp = {2 * lay.cp}")
        if lay.sequence_parallel and t.seq_len % (lay.tp * lay.cp):
            raise SpecError(s, "sequence_parallel", f"seq_len {t.seq_len} must divide by tp·cp = {lay.tp * lay.cp}")
        if lay.stage_layers is not None:
            if sum(lay.stage_layers) != m.num_layers:
                raise SpecError(s, "stage_layers", f"must sum to num_layers {m.num_layers}, got {sum(lay.stage_layers)}")
            # With interleaving, a stage's layers may split into unequal model chunks (Meta's
            # Llama 3 405B: 126 layers on 16 stages, one fewer on the first and last), as
            # Megatron's --pipeline-model-parallel-layout writes them; each chunk holds one at least.
            if lay.vpp > 1 and lay.chunk_layers is None and min(lay.stage_layers) < lay.vpp:
                raise SpecError(s, "stage_layers", f"every stage needs at least vpp {lay.vpp} layers "
                                                   f"(one per model chunk), got {min(lay.stage_layers)}")
            if lay.chunk_layers is not None and lay.chunk_layers[-1] == 0 and not m.mtp_layers:
                raise SpecError(s, "chunk_layers", "the last model chunk holds no decoder layer: only a model with "
                                                   "multi-token prediction layers (mtp_layers) may end in a chunk "
                                                   "of its MTP layers and loss alone")
        elif lay.account_for_embedding_in_pipeline_split or lay.account_for_loss_in_pipeline_split:
            units = m.num_layers + lay.account_for_embedding_in_pipeline_split + lay.account_for_loss_in_pipeline_split
            if units % (lay.pp * lay.vpp):
                raise SpecError(s, "pp", f"num_layers {m.num_layers} with the embedding and loss counted ({units}) "
                                         f"must divide by pp·vpp = {lay.pp * lay.vpp}")
        elif self.training.engine.balance_stages and lay.vpp == 1:  # balanced split (cost_models.partition)
            if m.num_layers < lay.pp - 2:
                raise SpecError(s, "pp", f"num_layers {m.num_layers} cannot fill pp {lay.pp} stages")
        elif lay.vpp > 1 and m.num_layers < lay.pp * lay.vpp:
            raise SpecError(s, "vpp", f"num_layers {m.num_layers} cannot fill pp·vpp = {lay.pp * lay.vpp} model chunks")
        elif lay.vpp == 1 and m.num_layers % lay.pp:
            raise SpecError(s, "pp", f"num_layers {m.num_layers} must divide by pp = {lay.pp} "
                                     "(or give Layout.stage_layers)")
        if lay.offloads and c.gpu.host is None:
            raise SpecError(GPUSpec, "host", "has no host figures (memory, link and memory bandwidth) "
                                                   "for the layout's offload")
        if lay.offload_activations > max(self.stage_layers):
            raise SpecError(s, "offload_activations",
                            f"at most the {max(self.stage_layers)} layers of a stage, got {lay.offload_activations}")
        if lay.recompute_num_layers is not None and lay.recompute_num_layers > max(self.stage_layers):
            raise SpecError(s, "recompute_num_layers",
                            f"at most the {max(self.stage_layers)} layers of a stage, got {lay.recompute_num_layers}")
        per_step = lay.micro_batch_size * lay.dp
        if t.global_batch_size % per_step:
            raise SpecError(TrainingSpec, "global_batch_size",
                            f"{t.global_batch_size} must divide by micro_batch_size·dp = "
                            f"{lay.micro_batch_size}·{lay.dp} = {per_step}")
        if lay.vpp > 1 and self.num_microbatches % lay.pp:
            raise SpecError(s, "vpp", f"interleaving needs micro-batches per step ({self.num_microbatches}) "
                                      f"divisible by pp {lay.pp}")

    def _check_experts(self) -> None:
        """Expert parallelism against the model and the attention's grid (megatron-core
        ``MoELayer``: experts divide by ep; the expert grid etp·ep·edp folds over tp·cp·dp)."""
        m, lay, s = self.model, self.layout, Layout
        if not m.is_moe:
            if lay.ep > 1:
                raise SpecError(s, "ep", f"expert parallelism needs a mixture of experts (model.num_experts), got {lay.ep}")
            if lay.etp is not None and lay.etp != lay.tp:
                raise SpecError(s, "etp", "expert tensor parallelism needs a mixture of experts (model.num_experts)")
            return
        if m.num_experts % lay.ep:
            raise SpecError(s, "ep", f"must divide num_experts {m.num_experts}, got {lay.ep}")
        etp = lay.expert_tp
        if m.moe_ffn_hidden_size % etp:
            raise SpecError(s, "etp", f"must divide moe_ffn_hidden_size {m.moe_ffn_hidden_size}, got {etp}")
        if (lay.tp * lay.cp * lay.dp) % (etp * lay.ep):
            raise SpecError(s, "ep", f"etp·ep = {etp}·{lay.ep} must divide tp·cp·dp = "
                                     f"{lay.tp}·{lay.cp}·{lay.dp} = {lay.tp * lay.cp * lay.dp} (the expert grid "
                                     "folds over the same GPUs)")

    @property
    def grad_accum(self) -> int:
        """Micro-batches each data-parallel rank runs per optimizer step."""
        return self.training.global_batch_size // (self.layout.micro_batch_size * self.layout.dp)

    @property
    def num_microbatches(self) -> int:
        """m in the pipeline formulas: micro-batches through each pipeline per step."""
        return self.grad_accum

    @property
    def requested_training(self) -> TrainingSpec:
        """The training as the case gave it, before its engine's defaults were resolved at this layout."""
        return self.__dict__.get("_requested", self.training)

    def with_layout(self, layout: Layout) -> "Job":
        """The same job at another layout, with the engine's defaults resolved afresh for it."""
        return Job(self.model, self.cluster, self.requested_training, layout, self.overheads)

    @cached_property  # read for every stage by every cost model; a Job never changes
    def stage_layers(self) -> tuple[int, ...]:
        """Layers of each pipeline stage: the layout's, else the engine's own split
        (:mod:`cost_models.partition`)."""
        from .partition import default_partition

        lay = self.layout
        if lay.stage_layers is not None:
            return lay.stage_layers
        return default_partition(self.model, self.training, lay)

    @cached_property
    def chunk_layers(self) -> Optional[tuple[int, ...]]:
        """Layers of each model chunk in model order where they are not each rank's layers split
        evenly (:func:`partition.chunk_layers`): the layout's own, else the engine's uneven
        interleaved split (:func:`partition.default_chunk_layers`); None otherwise."""
        from .partition import default_chunk_layers

        lay = self.layout
        return lay.chunk_layers if lay.chunk_layers is not None else default_chunk_layers(self.model, lay)

    def rank_chunk_layers(self, stage: int) -> tuple[int, ...]:
        """Layers of each of pipeline rank ``stage``'s model chunks, in model order."""
        from .partition import chunk_layers, rank_chunks

        if self.chunk_layers is not None:
            return tuple(rank_chunks(self.chunk_layers, self.layout.pp)[stage])
        return chunk_layers(self.stage_layers[stage], self.layout.vpp)

    @cached_property
    def stage_moe_layers(self) -> tuple[int, ...]:
        """MoE layers of each pipeline stage (:func:`moe_layers_per_stage`)."""
        return moe_layers_per_stage(self.model, self.stage_layers, self.layout.vpp, self.chunk_layers)

    @cached_property
    def high_precision_layers(self) -> tuple[int, ...]:
        """Decoder layers of each stage whose linears the recipe keeps in bf16: the model's last
        ⌈share·L⌉ (``quantization.Recipe.high_precision_layers``; torchtitan's
        ``nvfp4_bf16_tail_fqns`` rounds up likewise), 0 everywhere without such a recipe."""
        from .partition import tail_layers_per_stage

        recipe = self.training.recipe
        tail = math.ceil(recipe.high_precision_layers * self.model.num_layers) if recipe else 0
        if not tail:  # most recipes keep no layer in bf16: no chunk walk for every layout scored
            return (0,) * len(self.stage_layers)
        return tail_layers_per_stage(self.stage_layers, self.layout.vpp, tail, self.chunk_layers)

    def largest_chunk(self, stage: int) -> int:
        """Layers of the largest model chunk of pipeline rank ``stage``."""
        return max(self.rank_chunk_layers(stage))


@lru_cache(maxsize=4096)
def moe_layers_per_stage(model: ModelSpec, stage_layers: tuple[int, ...], vpp: int = 1,
                         chunks: Optional[tuple[int, ...]] = None) -> tuple[int, ...]:
    """MoE layers of each pipeline stage. With interleaving, rank r holds virtual stages
    r, pp + r, … of stage_layers[r] / vpp consecutive layers each (Megatron's order)."""
    if not model.is_moe:
        return (0,) * len(stage_layers)
    from .partition import model_chunks

    counts = [0] * len(stage_layers)
    start = 0
    for rank, layers in model_chunks(stage_layers, vpp, chunks):
        counts[rank] += model.moe_layers_in(start, layers)
        start += layers
    return tuple(counts)
