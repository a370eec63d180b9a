"""A small Megatron-style GPT in PyTorch, to check the cost models against real runs.

The layer follows Megatron-core's pre-LN GPT layer op for op wherever that decides
what autograd keeps for backward, so that the tensors it saves are the ones
``cost_models/activations.py`` counts (Korthikanti et al. 2022, §4.1)::

    norm → fused QKV GEMM → core attention → output projection → dropout → residual add
         → norm → fc1 → GeLU or SwiGLU → fc2 → dropout → residual add

Tensors are batch-first, ``[b, s, h]``. Choices that keep the saved tensors those of
Megatron on a GPU, on CPU too:

- :class:`Dropout` calls ``torch.native_dropout``, which keeps a one-byte boolean
  mask, like the fused CUDA kernel ``F.dropout`` uses on GPUs. On CPU ``F.dropout``
  keeps its mask in the activation dtype (2 or 4 bytes an element).
- :class:`RMSNorm` is an autograd Function that keeps its input and the per-token
  1/rms, as the fused kernels (Apex, Transformer Engine) do. ``F.rms_norm`` on CPU
  decomposes into ops that keep fp32 copies of the input.
- :func:`swiglu` keeps only its 2f-wide input and recomputes silu in backward, as
  Megatron's fused ``bias_swiglu`` does (``megatron/core/fusions/fused_bias_swiglu.py``).
- ``attention="megatron"`` is Megatron's unfused ``DotProductAttention``: scores,
  additive causal mask, softmax, dropout, value GEMM; it keeps the s×s tensors.
  With grouped-query attention it repeats the K and V heads first
  (``repeat_interleave``, as Megatron does), so the score and value GEMMs keep
  full-width copies of K and V.
- ``attention="sdpa"`` is ``F.scaled_dot_product_attention``: a flash kernel, which
  keeps q, k, v, its output and the log-sum-exp and no s×s tensor. PyTorch's CPU
  flash kernel has no dropout: with ``dropout > 0`` in training it falls back to
  the math kernel, which keeps s×s tensors.

Recomputation, as Megatron's ``--recompute-granularity``: ``"selective"`` checkpoints
the core attention (q, k, v → context), ``"full"`` checkpoints whole layers; both
with ``torch.utils.checkpoint`` (non-reentrant, RNG state preserved, so dropout
masks are the same when recomputed).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .gpt_config import GPTConfig


# --------------------------------------------------------------------------- fused ops


class Dropout(nn.Module):
    """Dropout that keeps a one-byte mask for backward on every device.

    ``torch.native_dropout`` is the kernel ``F.dropout`` runs on CUDA; calling it
    directly gives the same saved tensors on CPU.
    """

    def __init__(self, p: float):
        super().__init__()
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return torch.native_dropout(x, self.p, True)[0]

    def extra_repr(self) -> str:
        return f"p={self.p}"


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """fp32 for 16-bit inputs, else the input's dtype (fp64 stays fp64, for gradcheck)."""
    return torch.promote_types(x.dtype, torch.float32)


class _RMSNormFunction(torch.autograd.Function):
    """y = x / rms(x) · w, computed in fp32 (at least); keeps x and the per-token 1/rms."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.to(_compute_dtype(x))
        rstd = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x32 * rstd * weight.to(x32.dtype)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        x_hat = x.to(rstd.dtype) * rstd
        g = grad.to(rstd.dtype)
        gw = g * weight.to(rstd.dtype)
        # d/dx_j of w_i·x_i·r with r = (mean x² + eps)^-1/2: r·(gw_j − x̂_j·mean_i(gw_i·x̂_i))
        grad_x = rstd * (gw - x_hat * (gw * x_hat).mean(dim=-1, keepdim=True))
        grad_w = (g * x_hat).reshape(-1, x.shape[-1]).sum(dim=0)
        return grad_x.to(x.dtype), grad_w.to(weight.dtype), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """x / rms(x) · weight over the last dimension; keeps x and the per-token 1/rms."""
    return _RMSNormFunction.apply(x, weight, eps)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def swiglu_reference(x: torch.Tensor) -> torch.Tensor:
    """silu(x1) · x2 for x = [x1 | x2] along the last dimension, by plain autograd."""
    x1, x2 = x.chunk(2, dim=-1)
    return F.silu(x1) * x2


class _SwiGLUFunction(torch.autograd.Function):
    """Megatron's fused ``bias_swiglu`` (without bias): keeps only its 2f-wide input."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        x1, x2 = x.chunk(2, dim=-1)
        return F.silu(x1) * x2

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        x1, x2 = x.to(_compute_dtype(x)).chunk(2, dim=-1)
        g = grad.to(x1.dtype)
        sig = torch.sigmoid(x1)
        # silu'(x1) = σ(x1)·(1 + x1·(1 − σ(x1)))
        grad_x1 = g * x2 * sig * (1 + x1 * (1 - sig))
        grad_x2 = g * x1 * sig
        return torch.cat((grad_x1, grad_x2), dim=-1).to(x.dtype)


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """silu(x1) · x2 for x = [x1 | x2]; backward recomputes silu from the saved x."""
    return _SwiGLUFunction.apply(x)


def causal_mask(seq_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive causal mask: 0 on and below the diagonal, -inf above.

    Adding it saves nothing for backward (``masked_fill`` would keep a boolean mask).
    """
    return torch.full((seq_len, seq_len), float("-inf"), dtype=dtype, device=device).triu_(1)


# --------------------------------------------------------------------------- attention


class MegatronCoreAttention(nn.Module):
    """Megatron's unfused ``DotProductAttention``: q, k, v [b, heads, s, d] → context [b, a, s, d]."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.scale = 1.0 / math.sqrt(config.head_dim)
        self.dropout = Dropout(config.dropout)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        groups = q.shape[1] // k.shape[1]
        if groups > 1:  # as Megatron: full-width copies of K and V
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        seq_len = q.shape[2]
        # Scaling by a Python float saves nothing; the GEMM keeps q and k.
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        scores = scores + causal_mask(seq_len, scores.dtype, scores.device)
        probs = self.dropout(torch.softmax(scores, dim=-1))  # softmax keeps its output
        return torch.matmul(probs, v)  # keeps probs (after dropout) and v


class SDPACoreAttention(nn.Module):
    """``F.scaled_dot_product_attention`` (flash): keeps q, k, v, output and log-sum-exp."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.dropout = config.dropout

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        dropout_p = self.dropout if self.training else 0.0
        if q.shape[1] != k.shape[1]:  # grouped-query attention: enable_gqa is torch >= 2.5's, named only here
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)


class SelfAttention(nn.Module):
    """Fused QKV GEMM → core attention → output projection (no dropout: the layer's)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        h, kv = config.hidden_size, config.kv_size
        bias = config.activation == "gelu"
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(h, h + 2 * kv, bias=bias)
        core = MegatronCoreAttention if config.attention == "megatron" else SDPACoreAttention
        self.core = core(config)
        self.proj = nn.Linear(h, h, bias=bias)
        self.recompute_core = config.recompute == "selective"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        d = self.head_dim
        q, k, v = self.qkv(x).split([h, self.num_kv_heads * d, self.num_kv_heads * d], dim=-1)
        # Views of the QKV output, [b, heads, s, d].
        q = q.view(b, s, self.num_heads, d).transpose(1, 2)
        k = k.view(b, s, self.num_kv_heads, d).transpose(1, 2)
        v = v.view(b, s, self.num_kv_heads, d).transpose(1, 2)
        if self.recompute_core and torch.is_grad_enabled():
            # Keeps q, k, v (the checkpoint's inputs); recomputes everything in between.
            context = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            context = self.core(q, k, v)
        return self.proj(context.transpose(1, 2).reshape(b, s, h))


# --------------------------------------------------------------------------- layer, model


class MLP(nn.Module):
    """fc1 → GeLU (tanh, Megatron's ``bias_gelu``) or fused SwiGLU → fc2."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        h, f = config.hidden_size, config.ffn_hidden_size
        self.swiglu = config.activation == "swiglu"
        bias = not self.swiglu
        self.fc1 = nn.Linear(h, 2 * f if self.swiglu else f, bias=bias)  # swiglu: [gate | up]
        self.fc2 = nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)
        x = swiglu(x) if self.swiglu else F.gelu(x, approximate="tanh")
        return self.fc2(x)


def make_norm(config: GPTConfig) -> nn.Module:
    """LayerNorm for GeLU (GPT) models, RMSNorm for SwiGLU (Llama) models."""
    if config.activation == "swiglu":
        return RMSNorm(config.hidden_size, eps=config.norm_eps)
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps)


class TransformerLayer(nn.Module):
    """Pre-LN layer: x + dropout(attention(norm(x))), then x + dropout(mlp(norm(x)))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.input_norm = make_norm(config)
        self.attention = SelfAttention(config)
        self.post_attention_norm = make_norm(config)
        self.mlp = MLP(config)
        self.hidden_dropout = Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.hidden_dropout(self.attention(self.input_norm(x)))
        return x + self.hidden_dropout(self.mlp(self.post_attention_norm(x)))


class GPT(nn.Module):
    """Word and learned position embeddings → layers → final norm → LM head → cross-entropy.

    ``forward(input_ids)`` returns the logits [b, s, V]; with ``targets`` it returns
    the mean token loss, computed on fp32 logits (as Megatron's cross-entropy does).
    """

    position_ids: torch.Tensor  # a buffer (register_buffer), which nn.Module's hints type as Tensor | Module

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, h)
        self.position_embeddings = nn.Embedding(config.max_seq_len, h)
        self.register_buffer("position_ids", torch.arange(config.max_seq_len), persistent=False)
        self.embedding_dropout = Dropout(config.dropout)
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(config.num_layers))
        self.final_norm = make_norm(config)
        self.lm_head = nn.Linear(h, config.vocab_size, bias=False)
        if config.tied_embeddings:
            self.lm_head.weight = self.word_embeddings.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Megatron's init: N(0, σ), output projections N(0, σ/√(2L)), norms 1, biases 0."""
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, std)
            elif isinstance(module, (nn.LayerNorm, RMSNorm)):
                module.reset_parameters()
        out_std = std / math.sqrt(2 * self.config.num_layers)
        for layer in self.layers:
            assert isinstance(layer, TransformerLayer)  # a ModuleList's items are Modules to a type checker
            nn.init.normal_(layer.attention.proj.weight, 0.0, out_std)
            nn.init.normal_(layer.mlp.fc2.weight, 0.0, out_std)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq_len = input_ids.shape[1]
        if seq_len > self.config.max_seq_len:
            raise ValueError(f"sequence of {seq_len} tokens exceeds max_seq_len {self.config.max_seq_len}")
        x = self.word_embeddings(input_ids) + self.position_embeddings(self.position_ids[:seq_len])
        return self.embedding_dropout(x)

    def head(self, hidden: torch.Tensor, targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Final norm and LM head; with ``targets``, the mean cross-entropy on fp32 logits."""
        logits = self.lm_head(self.final_norm(hidden))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    def forward(self, input_ids: torch.Tensor, targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.embed(input_ids)
        recompute = self.config.recompute == "full" and torch.is_grad_enabled()
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if recompute else layer(x)
        return self.head(x, targets)
