"""The GEMM and attention shapes calibration times: the ones the model will run.

Per layer, the forward GEMMs of :func:`cost_models.flops.layer_gemms` at every
tensor-parallel degree in {1, 2, 4, 8} the model admits and at a few micro-batch
sizes, plus the LM head (:func:`cost_models.flops.head_gemm`). Attention shapes are
the core attention of one layer at the extreme degrees and micro-batches. Without
a case, a default set of GPT shapes spans narrow to wide GEMMs: hidden 256, 512, 768
and 2048 at 512 tokens a sequence on CPUs; those and Llama-like hidden 4096 and 8192 at
4096 tokens on GPUs.

A device can only time what fits and finishes: shapes beyond a FLOP budget keep
their weight matrix but run fewer tokens (rows), and weights beyond an element
budget are dropped. Both are recorded with the measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from cost_models.flops import attention_flops, head_gemm, layer_gemms
from cost_models.specs import ModelSpec

TP_CANDIDATES = (1, 2, 4, 8)
MICRO_BATCHES = (1, 2, 4)

DEFAULT_MODELS = (
    ModelSpec("gpt-h256", num_layers=4, hidden_size=256, num_attention_heads=4, vocab_size=8192),
    ModelSpec("gpt-h512", num_layers=4, hidden_size=512, num_attention_heads=8, vocab_size=8192),
    ModelSpec("gpt-h768", num_layers=12, hidden_size=768, num_attention_heads=12, vocab_size=32000),
    ModelSpec("gpt-h2048", num_layers=24, hidden_size=2048, num_attention_heads=16, vocab_size=32000),
)
DEFAULT_SEQ_LEN = 512
# On GPUs the small shapes alone would not reach the tensor cores' peak: add Llama-like layers.
DEFAULT_GPU_MODELS = DEFAULT_MODELS + (
    ModelSpec("llama-h4096", num_layers=32, hidden_size=4096, num_attention_heads=32, vocab_size=32000,
              activation="swiglu", ffn_hidden_size=11008),
    ModelSpec("llama-h8192", num_layers=80, hidden_size=8192, num_attention_heads=64, num_kv_heads=8,
              vocab_size=128256, activation="swiglu", ffn_hidden_size=28672),
)
DEFAULT_GPU_SEQ_LEN = 4096
QUICK_MODEL = ModelSpec("gpt-quick", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=512)
QUICK_SEQ_LEN = 64


@dataclass(frozen=True)
class GemmShape:
    """(m×k)·(k×n): m tokens, a k×n weight (``F.linear`` with an n×k weight)."""

    name: str
    m: int
    n: int
    k: int
    capped_from_m: Optional[int] = None  # the model's token count when the FLOP budget cut it

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


@dataclass(frozen=True)
class AttentionShape:
    """Causal self-attention of ``batch`` sequences over ``heads`` query heads on one rank."""

    name: str
    batch: int
    heads: int
    kv_heads: int
    seq_len: int
    head_dim: int

    @property
    def forward_flops(self) -> float:
        """Causal forward FLOPs, as ``cost_models.flops.attention_flops`` counts them."""
        model = ModelSpec("attention", num_layers=1, hidden_size=self.heads * self.head_dim,
                          num_attention_heads=self.heads, vocab_size=1)
        return attention_flops(model, self.batch, self.seq_len, self.seq_len, 1)


def tp_degrees(model: ModelSpec) -> list[int]:
    """Tensor-parallel degrees in {1, 2, 4, 8} the model admits (the rules of ``specs.Job``)."""
    return [t for t in TP_CANDIDATES
            if model.num_attention_heads % t == 0 and model.ffn_hidden_size % t == 0
            and (model.num_kv_heads % t == 0 or t % model.num_kv_heads == 0)]


def gemm_shapes(model: ModelSpec, seq_len: int, micro_batches: Iterable[int],
                tps: Optional[Sequence[int]] = None) -> list[GemmShape]:
    """Every distinct forward GEMM of one layer and the LM head, per degree and micro-batch."""
    shapes: dict[tuple[int, int, int], GemmShape] = {}
    for tp in tps or tp_degrees(model):
        for mbs in micro_batches:
            tokens = mbs * seq_len
            for g in (*layer_gemms(model, tokens, tp), head_gemm(model, tokens, tp)):
                m, n, k = (int(math.ceil(x)) for x in (g.m, g.n, g.k))  # vocab/tp: padded, as Megatron does
                shapes.setdefault((m, n, k), GemmShape(f"{model.name} {g.name} tp={tp} mbs={mbs}", m, n, k))
    return list(shapes.values())


def attention_shapes(model: ModelSpec, seq_len: int, micro_batches: Sequence[int],
                     tps: Optional[Sequence[int]] = None) -> list[AttentionShape]:
    """Core attention at the smallest and largest tensor-parallel degree and micro-batch."""
    degrees = list(tps or tp_degrees(model))
    shapes: dict[tuple, AttentionShape] = {}
    for tp in sorted({degrees[0], degrees[-1]}):
        for mbs in sorted({min(micro_batches), max(micro_batches)}):
            heads = model.num_attention_heads // tp
            kv = max(model.num_kv_heads // tp, 1)
            key = (mbs, heads, kv, seq_len, model.head_dim)
            shapes.setdefault(key, AttentionShape(f"{model.name} attention tp={tp} mbs={mbs}", *key))
    return list(shapes.values())


def cap_gemms(shapes: Iterable[GemmShape], max_flops: float, max_elements: float) -> tuple[list[GemmShape], list[str]]:
    """Shapes within the device's budgets, and a note for each shape dropped.

    A GEMM over ``max_flops`` runs fewer rows (tokens), at least 16, rounded down to
    a multiple of 16; one whose weight or output would exceed ``max_elements`` is dropped.
    """
    kept: dict[tuple[int, int, int], GemmShape] = {}
    dropped: list[str] = []
    for s in shapes:
        m = s.m
        if s.flops > max_flops:
            m = max(16, int(max_flops / (2.0 * s.n * s.k)) // 16 * 16)
        if s.n * s.k > max_elements or m * max(s.n, s.k) > max_elements or 2.0 * m * s.n * s.k > 4 * max_flops:
            dropped.append(f"{s.name} ({s.m}x{s.n}x{s.k}): beyond this device's budget")
            continue
        shape = s if m == s.m else GemmShape(s.name, m, s.n, s.k, capped_from_m=s.m)
        kept.setdefault((shape.m, shape.n, shape.k), shape)
    return list(kept.values()), dropped


def cap_attention(shapes: Iterable[AttentionShape], max_flops: float) -> tuple[list[AttentionShape], list[str]]:
    """Attention shapes whose forward + backward is within ``max_flops``, fewer sequences where needed."""
    kept: dict[tuple, AttentionShape] = {}
    dropped: list[str] = []
    for s in shapes:
        per_sequence = 3.0 * s.forward_flops / s.batch
        batch = min(s.batch, int(max_flops / per_sequence))
        if batch < 1:
            dropped.append(f"{s.name}: beyond this device's budget")
            continue
        shape = AttentionShape(s.name, batch, s.heads, s.kv_heads, s.seq_len, s.head_dim)
        kept.setdefault((batch, s.heads, s.kv_heads, s.seq_len, s.head_dim), shape)
    return list(kept.values()), dropped
