"""One transformer layer's forward and backward on one GPU: its GEMMs, attention core and
element-wise kernels (dense and MoE layers), what selective recomputation runs again, and the loss."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .experts import moe_mlp_time, norm_forward_time
from .flops import Gemm, attention_flops, attention_gemms, layer_gemms, mlp_gemms
from .kernels import (NORM_OR_ACTIVATION_INPUTS, activation_passes, elementwise_time, flash_attention_time,
                      high_precision_precision, linear_time, tensor_core_rate, transcendental_time)
from .model_states import gathers_quantized_shards, quantizes_weights_once_a_step, zero_shards
from .quantization import activation_bytes
from .hardware import GPUSpec
from .job import Job
from .layout_spec import Layout
from .model_spec import ModelSpec
from .training_spec import TrainingSpec


def elementwise_bytes(model: ModelSpec, training: TrainingSpec, lay: Layout, tokens: float, mlp: bool = True,
                      scores: bool = True) -> float:
    """HBM traffic of one layer's forward element-wise kernels on one GPU, the activation
    function's apart (:func:`activation_function_bytes`).

    Per token, in elements: two norms (read + write h each), two residual adds
    (2 reads + 1 write of h), rotary embeddings on q and k (read + write each), the q/k norms
    where the model has them (read + write each), dropout
    (read, write, 1-byte mask) where on. Non-flash attention adds the scaled-masked softmax
    over a·s scores (read + write) and its dropout. Sequence parallelism shards the norm,
    residual and dropout part.

    Engines without fused kernels (``EngineBehaviour.fused_elementwise`` false: eager
    PyTorch) run SwiGLU as silu then multiply, the multiply here (read 2f, write f), and rotary
    embeddings as x·cos + rotate_half(x)·sin (five passes over q and k instead of two).
    Without ``mlp`` the SwiGLU multiply is left out too (an MoE layer's experts have their own:
    ``experts.moe_elementwise_bytes``); without ``scores``, the non-flash attention's passes over
    its scores (:func:`attention_score_bytes`), which the attention core's time holds.
    """
    p = activation_bytes(training.precision)
    h, t = model.hidden_size, lay.tp
    fused = training.engine.fused_elementwise
    sp = t if lay.sequence_parallel else 1
    kv = max(model.num_kv_heads // t, 1) * model.head_dim
    multiply = 3 * model.ffn_hidden_size / t if mlp and model.activation == "swiglu" and not fused else 0.0
    rotary = (2 if fused else 5) * (model.q_size / t + kv)
    # A norm on each head's queries and keys (Qwen3's q_norm/k_norm; megatron-core's qk_layernorm;
    # Llama 4's weightless L2 norm, qk_l2_norm) reads and writes them once more.
    qk_norm = 2 * (model.q_size / t + kv) if model.qk_norm or model.qk_l2_norm else 0.0
    dropout = 2 * (2 * p + 1) * h / sp if model.dropout > 0 else 0.0
    per_token = p * (4 * h + 6 * h) / sp + p * (multiply + rotary + qk_norm) + dropout
    return per_token * tokens + (attention_score_bytes(model, training, lay, tokens) if scores else 0.0)


def attention_score_bytes(model: ModelSpec, training: TrainingSpec, lay: Layout, tokens: float) -> float:
    """HBM traffic of non-flash attention's forward passes over its a/t·s scores per token: the
    scaled-masked softmax (read + write) and, where on, its dropout (read, write, 1-byte mask).
    0 under flash attention, whose kernel keeps the scores on chip."""
    if training.flash_attention:
        return 0.0
    p = activation_bytes(training.precision)
    scores = model.num_attention_heads / lay.tp * training.seq_len / lay.cp
    return scores * (2 * p + ((2 * p + 1) if model.dropout > 0 else 0)) * tokens


def activation_function_bytes(model: ModelSpec, training: TrainingSpec, lay: Layout, tokens: float) -> float:
    """HBM traffic of one layer's forward activation function on one GPU: its passes
    (:func:`activation_passes`) over the f/tp-wide MLP activations of ``tokens``."""
    passes = activation_passes(model.activation, training.engine.fused_elementwise)
    return activation_bytes(training.precision) * passes * model.ffn_hidden_size / lay.tp * tokens


def layer_elementwise_time(model: ModelSpec, training: TrainingSpec, lay: Layout, tokens: float, gpu: GPUSpec,
                           mlp: bool = True, scores: bool = True) -> float:
    """One layer's forward element-wise kernels: the activation function at the rate of kernels
    that evaluate a tanh or an exponent (:func:`kernels.transcendental_time`), the rest at the
    element-wise one (``scores``: :func:`elementwise_bytes`)."""
    act = transcendental_time(activation_function_bytes(model, training, lay, tokens), gpu) if mlp else 0.0
    return elementwise_time(elementwise_bytes(model, training, lay, tokens, mlp, scores), gpu) + act


def cross_entropy_bytes(logits: float, training: TrainingSpec) -> float:
    """HBM traffic of the loss over ``logits`` elements (one GPU's vocab shard), forward and backward.

    The softmax cross-entropy runs in fp32 whatever the training precision (PyTorch
    autocast's fp32 list holds ``log_softmax``/``cross_entropy``; Megatron's
    ``vocab_parallel_cross_entropy`` calls ``.float()``). Per logit, in bytes: forward
    reads the logits and writes an fp32 copy (p + 4), reads it for the max (4) and
    reads and writes it for exp-and-sum (8); backward reads the probabilities and writes
    the fp32 gradient (8), then casts it to the logits' precision (4 + p).
    Compiled (``TrainingSpec.loss_compiled``), the upcast is fused into the reads: the
    forward reads the logits for the max and again for exp-and-sum (2p), the backward reads
    them and writes their gradient (2p) (``activations.saved_logit_bytes``).
    """
    p = activation_bytes(training.precision)
    if training.loss_compiled:
        return logits * 4 * p
    return logits * ((p + 4) + 4 + 8 + 8 + (4 + p))


def cross_entropy_exponent_bytes(logits: float, training: TrainingSpec) -> float:
    """The loss's traffic in passes that evaluate an exponent per logit (:func:`cross_entropy_bytes`):
    the forward's exp-and-sum and the backward's softmax from the log-probabilities (PyTorch's
    ``log_softmax`` and ``_log_softmax_backward_data``), 8 bytes per logit each; compiled,
    the exp-and-sum read (p) and the backward's read and write (2p)."""
    if training.loss_compiled:
        return logits * 3 * activation_bytes(training.precision)
    return 16 * logits


def cross_entropy_time(logits: float, training: TrainingSpec, gpu: GPUSpec) -> float:
    """The loss over ``logits`` elements, forward and backward (:func:`cross_entropy_bytes`), its
    exponent passes at :func:`kernels.transcendental_time`'s rate (:func:`cross_entropy_exponent_bytes`)."""
    exponent = cross_entropy_exponent_bytes(logits, training)
    return elementwise_time(cross_entropy_bytes(logits, training) - exponent, gpu) + transcendental_time(exponent, gpu)


@dataclass(frozen=True)
class LayerTime:
    """One layer, one micro-batch: forward, backward, and the attention core's forward alone."""

    forward: float
    backward: float
    core: float

    @property
    def total(self) -> float:
        return self.forward + self.backward


def weight_quantize_share(job: Job) -> float:
    """Part of a weight's quantize each micro-batch pays (``quantization.linear_quantize_bytes``):
    once a step where the engine caches the quantized weights (Transformer Engine, as Megatron
    runs it: ``model_states.quantizes_weights_once_a_step``), and on the weight's shard where the
    ZeRO gather moves quantized weights."""
    training = job.training
    share = 1.0 / job.num_microbatches if quantizes_weights_once_a_step(job) else 1.0
    if gathers_quantized_shards(training) and job.layout.zero_stage >= 1:
        share /= zero_shards(job)
    return share


def layer_time(job: Job, quantized: bool = True) -> LayerTime:
    """One layer of the job's layout: its GEMMs under the recipe (``quantized``) or in bf16."""
    lay = job.layout
    share = weight_quantize_share(job) if quantized and job.training.recipe else 1.0
    return layer_time_for(job.model, job.training, job.cluster.gpu, lay.tp, lay.cp, lay.micro_batch_size,
                          lay.sequence_parallel, quantized, share)


def moe_layer_time(job: Job) -> LayerTime:
    """One MoE layer of the job's layout under the recipe, its dispatch and combine excluded."""
    lay = job.layout
    share = weight_quantize_share(job) if job.training.recipe else 1.0
    return moe_layer_time_for(job.model, job.training, job.cluster.gpu, lay.tp, lay.cp, lay.micro_batch_size,
                              lay.sequence_parallel, lay.ep, lay.expert_tp, share)


def layer_time_bound(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, tp: int, cp: int,
                     micro_batch_size: int, sequence_parallel: bool) -> float:
    """Forward + backward of one dense layer that no layout of this shape goes below, for the
    searches' bounds: under the recipe (the layers a recipe keeps in bf16 are slower), with no
    weight quantize (the least share, :func:`weight_quantize_share`, is above 0)."""
    return layer_time_for(model, training, gpu, tp, cp, micro_batch_size, sequence_parallel, True, 0.0).total


def layer_forward_time(job: Job) -> tuple[float, float]:
    """Forward time of one layer for one micro-batch: (whole layer, attention core alone)."""
    t = layer_time(job)
    return t.forward, t.core


def layer_gemm_time(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, tp: int, tokens: float,
                    quantized: bool = True, weight_share: float = 1.0, mlp: bool = True) -> tuple[float, float]:
    """(forward, backward) of one layer's GEMMs (QKV, projection, and the dense MLP unless not
    ``mlp``) on ``tokens`` tokens, each a linear layer's (:func:`kernels.linear_time`): under the
    training's low-precision recipe where ``quantized``, with its quantize kernels."""
    gemms = layer_gemms(model, tokens, tp) if mlp else attention_gemms(model, tokens, tp)
    times = [linear_time(g, gpu, training, quantized, weight_share, g.name in NORM_OR_ACTIVATION_INPUTS)
             for g in gemms]
    return sum(f for f, _ in times), sum(b for _, b in times)


@lru_cache(maxsize=4096)
def moe_layer_time_for(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, tp: int, cp: int,
                       micro_batch_size: int, sequence_parallel: bool, ep: int, etp: int,
                       weight_share: float = 1.0) -> LayerTime:
    """One MoE layer for one micro-batch, its dispatch and combine excluded. The attention half
    is a dense layer's; the MLP half is the experts' (:func:`experts.moe_mlp_time`)."""
    attention = layer_time_for(model, training, gpu, tp, cp, micro_batch_size, sequence_parallel,
                               weight_share=weight_share, mlp=False)
    forward, backward = moe_mlp_time(model, training, gpu, tp, cp, micro_batch_size, ep, etp, weight_share)
    return LayerTime(forward=attention.forward + forward, backward=attention.backward + backward,
                     core=attention.core)


@lru_cache(maxsize=4096)
def layer_time_for(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, tp: int, cp: int,
                   micro_batch_size: int, sequence_parallel: bool, quantized: bool = True,
                   weight_share: float = 1.0, mlp: bool = True) -> LayerTime:
    # Only these layout fields shape one layer's time: cached, since a search scores many
    # layouts that share them.
    lay = Layout(tp=tp, cp=cp, micro_batch_size=micro_batch_size, sequence_parallel=sequence_parallel)
    perf = gpu.performance
    s_local = training.seq_len / lay.cp
    tokens = lay.micro_batch_size * s_local
    gemm_forward, gemm_backward = layer_gemm_time(model, training, gpu, lay.tp, tokens, quantized, weight_share,
                                                  mlp)
    # Attention runs in bf16 under every recipe (Transformer Engine keeps DPA in bf16 unless
    # fp8 attention is asked for; torchao converts linears only).
    attn_precision = high_precision_precision(training)
    # Context parallelism: each rank attends its s/cp queries to all s keys, balanced causally,
    # in cp ring steps of s/cp keys each (Megatron-core ``AttnFuncWithCPAndKVP2P``).
    flops = attention_flops(model, lay.micro_batch_size, s_local, training.seq_len, lay.tp)
    if training.flash_attention:
        core = flash_attention_time(flops, model.head_dim, s_local, lay.cp, gpu, attn_precision,
                                    training.attention_fused)
        if model.sliding_window:
            # The windowed layers' kernels skip the key blocks outside the window: their FLOPs
            # (``flops.window_share``) over blocks of at most the window's keys, which keep the
            # tensor cores busy for less of each tile. This is the mean over the layers.
            windowed = flash_attention_time(
                attention_flops(model, lay.micro_batch_size, s_local, training.seq_len, lay.tp,
                                window=model.sliding_window),
                model.head_dim, min(s_local, model.sliding_window), lay.cp, gpu, attn_precision,
                training.attention_fused)
            share = model.windowed_layers / model.num_layers
            core = (1 - share) * core + share * windowed
    else:
        # Two batched GEMMs (scores and context) over a·b/t heads, full s×s (no causal skipping).
        heads = model.num_attention_heads / lay.tp * lay.micro_batch_size
        scores = Gemm("scores", s_local, training.seq_len, model.head_dim)
        context = Gemm("context", s_local, model.value_head_dim, training.seq_len)
        # The core is what Megatron's selective recomputation runs again: the two GEMMs and the
        # softmax and dropout between them (Korthikanti et al. 2022, §4.2).
        core = heads * (scores.flops + context.flops) / tensor_core_rate(
            gpu, attn_precision, perf.gemm_efficiency_for(attn_precision)) + 2 * perf.kernel_overhead_s \
            + elementwise_time(attention_score_bytes(model, training, lay, tokens), gpu)
    memory = layer_elementwise_time(model, training, lay, tokens, gpu, mlp, scores=False)
    # Backward: element-wise kernels twice the forward's traffic; flash attention's backward also
    # recomputes the scores: 2.5 times its forward (FlashAttention's benchmark counts fwd + bwd as
    # 3.5 forward passes, which is how attention_efficiency is quoted), without flash 2 times.
    attention_backward = 2.5 if training.flash_attention else 2.0
    return LayerTime(forward=gemm_forward + core + memory,
                     backward=gemm_backward + attention_backward * core + 2 * memory, core=core)


@lru_cache(maxsize=4096)
def selective_recompute_time(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, tp: int, cp: int,
                             micro_batch_size: int, sequence_parallel: bool, quantized: bool = True,
                             weight_share: float = 1.0, modules: tuple[str, ...] = (), mlp: bool = True) -> float:
    """What one layer runs again in backward under ``recompute: selective``, per the engine's
    policy (``EngineBehaviour.selective``), its expert part apart (:func:`experts.moe_recompute_time`):

    - "attention": the recomputed ``modules`` (:func:`activations.selective_modules`), each with
      its forward quantize under a low-precision recipe: the attention core (``core_attn``), MLA's
      up-projections (``mla_up_proj``), MLA's input norm, which stands apart from its linears
      (``layernorm``: one read and one write of the hidden states), and the dense MLP's forward
      (``mlp``, where ``mlp``: its two linears and its activation function);
    - "matmuls": the matmuls whose outputs are not kept and every element-wise kernel (wk, wo
      and w3 of a Llama block, wo and w3 where Q, K and V come from one linear, proj and fc2 of a
      GPT block; :func:`activations.matmul_policy_saved_elements`).
    """
    t = layer_time_for(model, training, gpu, tp, cp, micro_batch_size, sequence_parallel, quantized, weight_share)
    lay = Layout(tp=tp, cp=cp, micro_batch_size=micro_batch_size, sequence_parallel=sequence_parallel)
    tokens = micro_batch_size * training.seq_len / cp
    if training.engine.selective == "attention":
        time = t.core if "core_attn" in modules else 0.0
        if "mla_up_proj" in modules:
            up = [g for g in attention_gemms(model, tokens, tp) if g.name in ("q_up", "kv_up", "q")]
            time += sum(linear_time(g, gpu, training, quantized, weight_share)[0] for g in up)
        if "layernorm" in modules and model.attention_type == "mla":
            time += norm_forward_time(model, training, tokens, tp if sequence_parallel else 1, gpu)
        if "mlp" in modules and mlp:
            time += sum(linear_time(g, gpu, training, quantized, weight_share, g.name in NORM_OR_ACTIVATION_INPUTS)[0]
                        for g in mlp_gemms(model, tokens, model.ffn_hidden_size, tp)) \
                + transcendental_time(activation_function_bytes(model, training, lay, tokens), gpu)
        return time
    h, f = model.hidden_size, model.ffn_hidden_size
    kv = max(model.num_kv_heads // tp, 1) * model.head_dim
    if model.activation == "swiglu":
        gemms = (() if training.engine.fused_qkv else (Gemm("wk", tokens, kv, h),)) \
            + (Gemm("wo", tokens, h, model.context_size / tp), Gemm("w3", tokens, f / tp, h))
    else:
        gemms = (Gemm("proj", tokens, h, model.context_size / tp), Gemm("fc2", tokens, h, f / tp))
    memory = layer_elementwise_time(model, training, lay, tokens, gpu)
    return sum(linear_time(g, gpu, training, quantized, weight_share, g.name in NORM_OR_ACTIVATION_INPUTS)[0]
               for g in gemms) + memory
