"""FLOPs of one transformer layer and of the LM head, GEMM by GEMM.

A GEMM of an (m×k) by (k×n) matrix is 2·m·n·k FLOPs. Per layer, with m = b·s tokens
(Narayanan et al. 2021, §5.1; Korthikanti et al. 2022, §6, for the same terms):

- QKV projection: 2·m·h·(a·d + 2·kv)  (GQA narrows K and V to kv = kv_heads·head_dim)
- attention scores QKᵀ and context ·V: 2·2·m·s·a·d, halved for causal masking
  (only the lower triangle is computed: flash attention and cuDNN skip the rest)
- output projection: 2·m·a·d·h
- MLP: 2·m·h·f per matrix, two for GeLU and three for SwiGLU
- LM head: 2·m·h·V

Multi-head latent attention (DeepSeek-V2 report, §2.1) runs, per token, the down-projections
to the query and key-value latents, their up-projections to a heads of d_qk + d_rope (queries,
keys) and d_v (values), and the output projection; its core is 2·m·s·a·(d_qk + d_rope + d_v).

A mixture-of-experts layer (megatron-core ``MoELayer``) runs the router (2·m·h·E), each token
through top-k experts of width f_e and through the shared experts of total width f_s: its
model FLOPs count the experts a token uses, not all of them.

The backward pass is twice the forward (one GEMM each for the input and the
weight gradient). Model FLOPs per token are 3× the forward, recomputation not
counted (Chowdhery et al. 2022, PaLM, Appendix B); for a mixture of experts they are those
of its active parameters, as the MoE papers report MFU (DeepSeek-V3 report §3.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .model_spec import ModelSpec


@dataclass(frozen=True)
class Gemm:
    """One matrix multiply on one GPU: (m×k)·(k×n)."""

    name: str
    m: float
    n: float
    k: float

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads on one tensor-parallel rank: replicated when tp exceeds them."""
    return max(model.num_kv_heads // tp, 1)


def attention_gemms(model: ModelSpec, tokens: float, tp: int) -> tuple[Gemm, ...]:
    """The forward GEMMs of one layer's attention on one tensor-parallel rank (core excluded)."""
    h, a = model.hidden_size, model.num_attention_heads
    proj = Gemm("proj", tokens, h, model.context_size / tp)
    if model.attention_type != "mla":
        kv = kv_heads_per_rank(model, tp)
        qkv = model.q_size / tp + kv * (model.head_dim + model.value_head_dim)
        return Gemm("qkv", tokens, qkv, h), proj
    # MLA: the down-projections are replicated on every tensor-parallel rank.
    heads = a / tp
    gemms = []
    if model.q_lora_rank:
        gemms += [Gemm("q_down", tokens, model.q_lora_rank, h),
                  Gemm("q_up", tokens, heads * model.head_dim, model.q_lora_rank)]
    else:
        gemms.append(Gemm("q", tokens, heads * model.head_dim, h))
    gemms += [Gemm("kv_down", tokens, model.kv_lora_rank + model.qk_rope_head_dim, h),
              Gemm("kv_up", tokens, heads * (model.qk_head_dim + model.v_head_dim), model.kv_lora_rank),
              proj]
    return tuple(gemms)


def mlp_gemms(model: ModelSpec, tokens: float, width: float, split: int = 1, prefix: str = "fc") -> tuple[Gemm, Gemm]:
    """An MLP of ``width`` on ``tokens``, its width split over ``split`` ranks: the up (and gate,
    fused) projection and the down projection."""
    up = 2 * width if model.activation == "swiglu" else width  # gate and up projections fused
    return Gemm(f"{prefix}1", tokens, up / split, model.hidden_size), \
        Gemm(f"{prefix}2", tokens, model.hidden_size, width / split)


def layer_gemms(model: ModelSpec, tokens: float, tp: int) -> tuple[Gemm, ...]:
    """The forward GEMMs of one dense layer on one tensor-parallel rank (attention core excluded)."""
    return attention_gemms(model, tokens, tp) + mlp_gemms(model, tokens, model.ffn_hidden_size, tp)


def moe_mlp_flops(model: ModelSpec, tokens: float) -> float:
    """Forward FLOPs of an MoE layer's MLP part on ``tokens``: router, the top-k experts of each
    token, the shared experts."""
    router = Gemm("router", tokens, model.num_experts, model.hidden_size).flops
    experts = model.moe_top_k * sum(g.flops for g in mlp_gemms(model, tokens, model.moe_ffn_hidden_size))
    shared = sum(g.flops for g in mlp_gemms(model, tokens, model.moe_shared_expert_ffn_hidden_size)) \
        if model.moe_shared_expert_ffn_hidden_size else 0.0
    return router + experts + shared


def head_gemm(model: ModelSpec, tokens: float, tp: int, vocab: Optional[int] = None) -> Gemm:
    """The LM head on ``tokens``: h → V/tp, of the engine's ``vocab`` where given (padded:
    ``parameters.built_vocab``), else the model's, as its model FLOPs count it."""
    return Gemm("lm_head", tokens, (model.vocab_size if vocab is None else vocab) / tp, model.hidden_size)


def attention_flops(model: ModelSpec, batch: float, seq_len: float, kv_len: float, tp: int,
                    causal: bool = True, window: int = 0) -> float:
    """Forward FLOPs of QKᵀ and ·V on one rank: 2·b·s·s_kv·(a/t)·(d_qk + d_v), halved when causal
    (4·b·s·s_kv·h/t for standard attention), times :func:`window_share` under a sliding window."""
    heads = model.num_attention_heads / tp
    full = 2.0 * batch * seq_len * kv_len * heads * (model.head_dim + model.value_head_dim)
    return full / 2 * window_share(kv_len, window) if causal else full


def window_share(seq_len: float, window: int) -> float:
    """Of a causal attention's query-key pairs over ``seq_len`` tokens (s²/2), the share a sliding
    window of w keys keeps: each query past the first w attends to w keys, so (w·s − w²/2)/(s²/2)
    = 2w/s − (w/s)² for w < s, and 1 for a window as long as the sequence. Context parallelism
    splits the queries, not the share."""
    if not window or window >= seq_len:
        return 1.0
    r = window / seq_len
    return 2 * r - r * r


def mean_attention_flops(model: ModelSpec, seq_len: float) -> float:
    """Forward attention FLOPs per token, averaged over the layers: the windowed ones
    (``ModelSpec.windowed_layers``) over the window, the rest over every earlier key."""
    windowed = model.windowed_layers / model.num_layers
    return (1 - windowed) * attention_flops(model, 1, 1, seq_len, 1) \
        + windowed * attention_flops(model, 1, 1, seq_len, 1, window=model.sliding_window)


def layer_forward_flops(model: ModelSpec, seq_len: int, moe: bool) -> float:
    """Forward model FLOPs of one layer per token (GEMMs and causal attention, averaged over the
    windowed and full layers)."""
    attention = sum(g.flops for g in attention_gemms(model, 1, 1)) + mean_attention_flops(model, seq_len)
    if moe:
        return attention + moe_mlp_flops(model, 1)
    return attention + sum(g.flops for g in mlp_gemms(model, 1, model.ffn_hidden_size))


def mtp_projection_gemm(model: ModelSpec, tokens: float, tp: int) -> Gemm:
    """A multi-token prediction module's 2h → h projection (``eh_proj``, column-parallel)."""
    return Gemm("eh_proj", tokens, model.hidden_size / tp, 2 * model.hidden_size)


def mtp_forward_flops(model: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token of the multi-token prediction modules: each one layer of the
    decoder's last kind, its projection and the LM head again (Megatron-LM
    ``num_floating_point_operations``: the MTP layers among the MoE or dense ones by
    ``last_layer_is_moe``, ``eh_proj``, and the logits ``(mtp_num_layers + 1)`` times)."""
    per_module = layer_forward_flops(model, seq_len, model.mtp_layers_are_moe) \
        + mtp_projection_gemm(model, 1, 1).flops + head_gemm(model, 1, 1).flops
    return model.mtp_layers * per_module


def layers_forward_flops(model: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token of the decoder layers, dense and MoE."""
    moe = model.num_moe_layers
    return (model.num_layers - moe) * layer_forward_flops(model, seq_len, False) \
        + moe * layer_forward_flops(model, seq_len, True)


def model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward, no recompute), causal attention; a mixture
    of experts counts the experts each token is routed to; multi-token prediction modules
    count as Megatron-LM counts them (:func:`mtp_forward_flops`).

    The LM head counts the model card's vocabulary, not the one an engine pads it to
    (``parameters.built_vocab``): the padded rows are work no token can use, priced in the step
    time like recomputation but not counted as the model's, so that the MFU of one model compares
    across engines and tensor-parallel degrees. Megatron-LM's own logged TFLOP/s count
    ``args.padded_vocab_size`` (``num_floating_point_operations``, megatron/training/training.py):
    above this by 6·h·(V_padded − V) a token, 0.04 % for Llama 3 8B at tp 8."""
    forward = layers_forward_flops(model, seq_len) + head_gemm(model, 1, 1).flops + mtp_forward_flops(model, seq_len)
    return 3.0 * forward


def recomputed_flops_per_token(model: ModelSpec, seq_len: int, recompute: str, share: float = 1.0) -> float:
    """FLOPs per token that recomputation runs again in the backward, beyond the model's
    (Korthikanti et al. 2022, §4 and §5): full recomputation one more forward of the layers it
    covers (``share`` of them); selective the attention core, softmax(QKᵀ)·V, of every layer."""
    if recompute == "full":
        return share * layers_forward_flops(model, seq_len)
    if recompute == "selective":
        return model.num_layers * mean_attention_flops(model, seq_len)
    return 0.0
