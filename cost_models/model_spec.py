"""The model: a decoder-only transformer, dense or a mixture of experts (:class:`ModelSpec`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .frozen import cached_hash, state_without_hash
from .spec_checks import SpecError, _choice, _non_negative_int, _positive_float, _positive_int

ACTIVATIONS = ("gelu", "swiglu")
ATTENTION_TYPES = ("mha", "gqa", "mla")
NORMALIZATIONS = ("rmsnorm", "layernorm")
POSITION_EMBEDDINGS = ("rope", "learned", "none")
ROUTERS = ("softmax", "sigmoid")

@dataclass(frozen=True)
class ModelSpec:
    __hash__ = cached_hash
    __getstate__ = state_without_hash

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
    # What the router's top-k weights are multiplied by (Hugging Face's ``routed_scaling_factor``,
    # megatron-core's ``moe_router_topk_scaling_factor``; DeepSeek-V3: 2.5): the model a launch builds,
    # no cost.
    moe_router_topk_scaling: float = 1.0
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
    # element-wise pass it is: ``layer_time.elementwise_bytes``; the others are work the layer's
    # kernels already count).
    normalization: Optional[str] = None
    position_embedding: Optional[str] = None
    rope_base: Optional[float] = None
    # The share of each head's dimensions RoPE rotates (Hugging Face's ``partial_rotary_factor``,
    # Megatron-LM's ``--rotary-percent``; GLM-4.5: 0.5): the model a launch builds, no cost.
    rotary_percent: float = 1.0
    linear_bias: Optional[bool] = None
    qk_norm: Optional[bool] = None
    # Llama 4's L2 norm of each head's queries and keys, without weights (transformers'
    # Llama4TextL2Norm under use_qk_norm; megatron-core's qk_l2_norm, --qk-l2-norm): one more
    # element-wise pass, as qk_norm's (``layer_time.elementwise_bytes``).
    qk_l2_norm: Optional[bool] = None
    # Biases on the query, key and value projections alone (Qwen2's, GLM-4.5's attention_bias, with
    # linear_bias false: no output or MLP biases; megatron-core's add_qkv_bias, --add-qkv-bias).
    # Not priced: a bias is an element-wise add the GEMM's epilogue does.
    qkv_bias: Optional[bool] = None
    # Rotary positions skipped in every N-th layer, the last of each N (Llama 4's NoPE layers:
    # transformers' Llama4TextConfig builds them every no_rope_layer_interval = 4; megatron-core's
    # no_rope_freq N, the same pattern); 0 for none. Not priced: the rotation is element-wise.
    nope_every: int = 0
    # Llama 4's chunked local attention: its RoPE layers attend only within their own block of this
    # many tokens (transformers' Llama4TextConfig attention_chunk_size, create_chunked_causal_mask); 0
    # for none. No engine the planner writes for builds it (megatron-core core_v0.16.1's attention has
    # no chunked mask; torchtitan 0.3.0 has no Llama 4): they train full attention. A sequence within one
    # chunk is the same model either way, and the case refuses a longer one (planner.case.build_case).
    attention_chunk_size: int = 0

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
        _positive_float(s, "rotary_percent", self.rotary_percent)
        if self.rotary_percent > 1:
            raise SpecError(s, "rotary_percent", f"expected a share of each head from above 0 to 1, got "
                                                 f"{self.rotary_percent!r}")
        if self.rotary_percent != 1 and self.position_embedding not in (None, "rope"):
            raise SpecError(s, "rotary_percent", "applies only with position_embedding rope")
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
        _non_negative_int(s, "nope_every", self.nope_every)
        _non_negative_int(s, "attention_chunk_size", self.attention_chunk_size)
        if self.nope_every:
            if self.position_embedding != "rope":
                raise SpecError(s, "nope_every", "applies only with position_embedding: rope")
            if self.num_layers % self.nope_every:  # megatron-core asserts it (TransformerConfig no_rope_freq)
                raise SpecError(s, "nope_every", f"{self.nope_every} does not divide the {self.num_layers} layers")
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
                                ("moe_router_topk_scaling", 1.0),
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
            # Named for what leaves none: the leading dense layers where they take every layer, else the
            # frequency, whose first MoE layer is the last of its first group (is_moe_layer).
            key = "moe_first_dense_layers" if self.moe_first_dense_layers >= self.num_layers else "moe_layer_freq"
            raise SpecError(s, key, f"leaves no MoE layer among the {self.num_layers} layers (the first is layer "
                                    f"moe_first_dense_layers + moe_layer_freq - 1 = "
                                    f"{self.moe_first_dense_layers + self.moe_layer_freq - 1}, counted from 0)")
        _choice(s, "moe_router", self.moe_router, ROUTERS)
        self._check_router_groups()
        # No expert takes more than every token of its batch: E/k times the mean, the most
        # either factor can mean.
        most = self.num_experts / self.moe_top_k
        if self.moe_capacity_factor is not None:
            _positive_float(s, "moe_capacity_factor", self.moe_capacity_factor)
            if self.moe_capacity_factor > most:
                raise SpecError(s, "moe_capacity_factor", f"at most num_experts / moe_top_k = {most:g} (an expert "
                                                          f"taking every token), got {self.moe_capacity_factor!r}")
        _positive_float(s, "moe_load_imbalance", self.moe_load_imbalance)
        if not 1 <= self.moe_load_imbalance <= most:
            raise SpecError(s, "moe_load_imbalance", f"expected the busiest rank's share over the mean, from 1 to "
                                                     f"num_experts / moe_top_k = {most:g}, got {self.moe_load_imbalance!r}")

    def _check_router_groups(self) -> None:
        """megatron-core's checks (``TransformerConfig.__post_init__``), and enough experts in
        the picked groups for a token's k (:func:`router_group_problem`)."""
        s = ModelSpec
        _positive_int(s, "moe_router_num_groups", self.moe_router_num_groups)
        _positive_int(s, "moe_router_group_topk", self.moe_router_group_topk)
        _positive_float(s, "moe_router_topk_scaling", self.moe_router_topk_scaling)
        problem = router_group_problem(self.num_experts, self.moe_router_num_groups, self.moe_router_group_topk,
                                       self.moe_top_k)
        if problem is not None:
            raise SpecError(s, *problem)

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


def router_group_problem(num_experts: int, groups: int, group_topk: int, top_k: int) -> Optional[tuple[str, str]]:
    """What is wrong with group-limited routing of ``top_k`` of ``num_experts`` experts in ``groups``
    groups, ``group_topk`` of them picked per token, as (field, what was expected); None where nothing
    is. megatron-core's checks (``TransformerConfig.__post_init__``: the groups divide the experts,
    no more picked than there are), and enough experts in the picked groups for a token's k."""
    if num_experts % groups:
        return "moe_router_num_groups", f"must divide num_experts {num_experts}, got {groups}"
    if group_topk > groups:
        return "moe_router_group_topk", f"at most moe_router_num_groups {groups}, got {group_topk}"
    eligible = group_topk * num_experts // groups
    if top_k > eligible:
        return "moe_router_group_topk", f"leaves {eligible} experts in the picked groups, fewer than moe_top_k {top_k}"
    return None
