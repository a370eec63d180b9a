"""FLOPs of one transformer layer and of the LM head, GEMM by GEMM.

A GEMM of an (m×k) by (k×n) matrix is 2·m·n·k FLOPs. Per layer, with m = b·s tokens
(Narayanan et al. 2021, §5.1; Korthikanti et al. 2022, §6, for the same terms):

- QKV projection: 2·m·h·(h + 2·kv)  (GQA narrows K and V to kv = kv_heads·head_dim)
- attention scores QKᵀ and context ·V: 2·2·m·s·h, halved for causal masking
  (only the lower triangle is computed: flash attention and cuDNN skip the rest)
- output projection: 2·m·h²
- MLP: 2·m·h·f per matrix, two for GeLU and three for SwiGLU
- LM head: 2·m·h·V

The backward pass is twice the forward (one GEMM each for the input and the
weight gradient). Model FLOPs per token are 3× the forward, recomputation not
counted (Chowdhery et al. 2022, PaLM, Appendix B).
"""

from __future__ import annotations

from dataclasses import dataclass

from .specs import ModelSpec


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


def layer_gemms(model: ModelSpec, tokens: float, tp: int) -> tuple[Gemm, ...]:
    """The forward GEMMs of one layer on one tensor-parallel rank (attention core excluded)."""
    h, f = model.hidden_size, model.ffn_hidden_size
    kv = max(model.num_kv_heads // tp, 1) * model.head_dim  # kv heads are replicated when tp exceeds them
    up = 2 * f if model.activation == "swiglu" else f  # gate and up projections fused
    return (
        Gemm("qkv", tokens, h / tp + 2 * kv, h),
        Gemm("proj", tokens, h, h / tp),
        Gemm("fc1", tokens, up / tp, h),
        Gemm("fc2", tokens, h, f / tp),
    )


def head_gemm(model: ModelSpec, tokens: float, tp: int) -> Gemm:
    return Gemm("lm_head", tokens, model.vocab_size / tp, model.hidden_size)


def attention_flops(model: ModelSpec, batch: float, seq_len: float, kv_len: float, tp: int,
                    causal: bool = True) -> float:
    """Forward FLOPs of QKᵀ and ·V on one rank: 4·b·s·s_kv·h/t, halved when causal."""
    full = 4.0 * batch * seq_len * kv_len * model.hidden_size / tp
    return full / 2 if causal else full


def model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward, no recompute), causal attention."""
    layer = sum(g.flops for g in layer_gemms(model, 1, 1)) + attention_flops(model, 1, 1, seq_len, 1)
    forward = model.num_layers * layer + head_gemm(model, 1, 1).flops
    return 3.0 * forward
