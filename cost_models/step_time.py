"""Time of one optimizer step: compute, communication over the topology, pipeline bubble, optimizer.

One step runs m micro-batches through each of the dp pipelines. Per micro-batch a
stage spends forward + backward (2× forward) GEMM and attention time, element-wise
(HBM-bound) time, recomputation, and the tensor-parallel collectives it cannot hide.
The slowest stage sets the pipeline's clock (Narayanan et al. 2021, §2.2):

    step = m·t_stage + (p − 1)/v·t_stage + pipeline sends + exposed DP traffic + optimizer

The exposed part of the data-parallel traffic is what the backward pass of the
last micro-batch cannot hide (Li et al. 2020, PyTorch DDP, §3.2.3; Megatron's
``overlap_grad_reduce``); ZeRO-3 gathers weights for every micro-batch and hides
them behind that micro-batch's compute (FSDP prefetch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Optional

from .activations import activation_bytes, selective_modules
from .collectives import collective_time, exposed, p2p_time
from .experts import dispatch_combine_time, moe_mlp_time, moe_recompute_time, norm_forward_time
from .flops import (Gemm, attention_flops, attention_gemms, head_gemm, layer_gemms, mlp_gemms, model_flops_per_token,
                    mtp_projection_gemm)
from .kernels import (NORM_OR_ACTIVATION_INPUTS, activation_passes, elementwise_time, first_touch_time,
                      flash_attention_time, gemm_time, high_precision_precision, in_place_time, linear_time,
                      tensor_core_rate, transcendental_time)
from .memory import job_stage_parameters, per_microbatch
from .parameters import embedding_parameters, norm_parameters
from .model_states import (fp32_gradients, gathered_weight_bytes, gathers_quantized_shards, optimizer_step_bytes,
                           quantizes_weights_once_a_step, state_bytes, weights_are_master, zero_shards)
from .offload import activation_offload_time, optimizer_offload_time, param_offload_time
from .pipeline import bubble_fraction
from .specs import ClusterSpec, GPUSpec, Job, Layout, ModelSpec, TrainingSpec
from .topology import group_links

@dataclass(frozen=True)
class StepTime:
    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    bubble_s: float
    optimizer_s: float
    offload_s: float  # host copies and the optimizer step on the CPU (cost_models.offload)
    overhead_s: float

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def by_part(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class StageTime:
    """One micro-batch through one stage (forward + backward)."""

    compute: float
    recompute: float
    tp_comm: float
    cp_comm: float
    ep_comm: float = 0.0

    @property
    def total(self) -> float:
        return self.compute + self.recompute + self.tp_comm + self.cp_comm + self.ep_comm


def elementwise_bytes(model: ModelSpec, training: TrainingSpec, lay: Layout, tokens: float, mlp: bool = True) -> float:
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
    ``experts.moe_elementwise_bytes``).
    """
    p = activation_bytes(training.precision)
    h, t = model.hidden_size, lay.tp
    fused = training.engine.fused_elementwise
    sp = t if lay.sequence_parallel else 1
    kv = max(model.num_kv_heads // t, 1) * model.head_dim
    multiply = 3 * model.ffn_hidden_size / t if mlp and model.activation == "swiglu" and not fused else 0.0
    rotary = (2 if fused else 5) * (model.q_size / t + kv)
    # A norm on each head's queries and keys (Qwen3's q_norm/k_norm; megatron-core's qk_layernorm)
    # reads and writes them once more.
    qk_norm = 2 * (model.q_size / t + kv) if model.qk_norm else 0.0
    dropout = 2 * (2 * p + 1) * h / sp if model.dropout > 0 else 0.0
    per_token = p * (4 * h + 6 * h) / sp + p * (multiply + rotary + qk_norm) + dropout
    if not training.flash_attention:
        scores = model.num_attention_heads / t * training.seq_len / lay.cp
        per_token += scores * (2 * p + ((2 * p + 1) if model.dropout > 0 else 0))
    return per_token * tokens


def activation_function_bytes(model: ModelSpec, training: TrainingSpec, lay: Layout, tokens: float) -> float:
    """HBM traffic of one layer's forward activation function on one GPU: its passes
    (:func:`activation_passes`) over the f/tp-wide MLP activations of ``tokens``."""
    passes = activation_passes(model.activation, training.engine.fused_elementwise)
    return activation_bytes(training.precision) * passes * model.ffn_hidden_size / lay.tp * tokens


def layer_elementwise_time(model: ModelSpec, training: TrainingSpec, lay: Layout, tokens: float, gpu: GPUSpec,
                           mlp: bool = True) -> float:
    """One layer's forward element-wise kernels: the activation function at the rate of kernels
    that evaluate a tanh or an exponent (:func:`kernels.transcendental_time`), the rest at the
    element-wise one."""
    act = transcendental_time(activation_function_bytes(model, training, lay, tokens), gpu) if mlp else 0.0
    return elementwise_time(elementwise_bytes(model, training, lay, tokens, mlp), gpu) + act


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
        core = heads * (scores.flops + context.flops) / tensor_core_rate(
            gpu, attn_precision, perf.gemm_efficiency_for(attn_precision)) + 2 * perf.kernel_overhead_s
    memory = layer_elementwise_time(model, training, lay, tokens, gpu, mlp)
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
      and w3 of a Llama block, proj and fc2 of a GPT block;
      :func:`activations.matmul_policy_saved_elements`).
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
        gemms = (Gemm("wk", tokens, kv, h), Gemm("wo", tokens, h, model.context_size / tp),
                 Gemm("w3", tokens, f / tp, h))
    else:
        gemms = (Gemm("proj", tokens, h, model.context_size / tp), Gemm("fc2", tokens, h, f / tp))
    memory = layer_elementwise_time(model, training, lay, tokens, gpu)
    return sum(linear_time(g, gpu, training, quantized, weight_share, g.name in NORM_OR_ACTIVATION_INPUTS)[0]
               for g in gemms) + memory


def folds_gradients_into_fp32(job: Job) -> bool:
    """Whether the engine keeps fp32 gradients beside the 16-bit ones autograd writes and folds
    these into them in a pass of its own (``EngineBehaviour.fp32_accumulation_bytes``): at ZeRO 0-1,
    where each rank holds all of its gradients, under mixed precision with fp32 gradients (an fp32
    model's backward writes fp32 gradients itself). DeepSpeed's BF16_Optimizer (``bf16_optimizer.py``)."""
    training = job.training
    return bool(training.engine.fp32_accumulation_bytes) and job.layout.zero_stage <= 1 \
        and training.precision != "fp32" and fp32_gradients(training)


def gradient_accumulation_time(job: Job, stage: int) -> float:
    """One micro-batch's fold of its 16-bit gradients into the fp32 gradients
    (:func:`folds_gradients_into_fp32`), over every parameter of the stage's ranks. DeepSpeed's
    BF16_Optimizer does so after every backward (``runtime/pipe/engine.py`` ``_exec_backward_pass``:
    ``clear_lp_grads``, ``update_hp_grads``)."""
    if not folds_gradients_into_fp32(job):
        return 0.0
    per_param = job.training.engine.fp32_accumulation_bytes
    return in_place_time(job_stage_parameters(job, stage).total * per_param, job.cluster.gpu)


@lru_cache(maxsize=4096)
def tp_collective_time(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, tp: int, cp: int,
                       micro_batch_size: int, sequence_parallel: bool = False) -> float:
    """One of a layer's two tensor-parallel reductions per pass, of a micro-batch's
    activations (b·(s/cp)·h elements): an all-reduce, or with sequence parallelism the
    all-gather and reduce-scatter that move the same bytes as rings (n − 1 steps each: a
    group that spans nodes waits for the fabric at every step)."""
    if tp == 1:
        return 0.0
    p = activation_bytes(training.precision)
    size = p * micro_batch_size * training.seq_len / cp * model.hidden_size
    links = group_links(cluster, Layout(tp=tp, dp=cluster.num_gpus // tp), "tp")
    perf = cluster.gpu.performance
    if sequence_parallel:
        return collective_time("all_gather", size, links, perf) + collective_time("reduce_scatter", size, links, perf)
    return collective_time("all_reduce", size, links, perf)


def tp_collectives_per_pass(sequence_parallel: bool) -> int:
    """Tensor-parallel collectives of one layer's forward (or backward): two all-reduces, or with
    sequence parallelism two all-gathers and two reduce-scatters."""
    return 4 if sequence_parallel else 2


def cross_domain_pipeline_floor(job: Job, collectives: float) -> float:
    """The least time one micro-batch takes through a stage whose pipeline neighbours are in
    another NVLink domain, for the engines that show one: each of its ``collectives``
    tensor-parallel collectives costs at least f₀ + f₁·(tp − 1)
    (``EngineBehaviour.pipeline_collective_floor_s``, ``pipeline_collective_floor_rank_s``), and
    the stage's GPU work runs beneath that, not after it (the Playbook's nanotron sweep: the 1B's
    stages at tp 8 and pp 2 take about 26 ms a layer at micro-batches of 1, 2 and 4). 0 without tensor
    parallelism, without a pipeline, within one domain, or for an engine that shows none."""
    lay, engine = job.layout, job.training.engine
    per_collective = engine.pipeline_collective_floor_s + engine.pipeline_collective_floor_rank_s * (lay.tp - 1)
    if lay.pp == 1 or lay.tp == 1 or not per_collective or group_links(job.cluster, lay, "pp").domains == 1:
        return 0.0
    return collectives * per_collective


def cross_domain_tp_floor(job: Job, collectives: float) -> float:
    """The least time one micro-batch takes through a stage whose tensor-parallel group itself spans
    NVLink domains, for the engines that show one: each of its ``collectives`` tensor-parallel
    collectives costs at least c·(tp − 1) (``EngineBehaviour.cross_domain_tp_rank_s``), the stage's GPU
    work running beneath it. Measured, not derived: in the Playbook's nanotron sweep (8-GPU EFA nodes,
    no pipeline) a layer and micro-batch takes a median 9.8 ms at tp 16 for the 1B and the 3B alike and
    16-20 ms at tp 32, at micro-batches of 1-4, where NCCL's own all-gather of those sizes between 2
    and 4 p5 nodes takes 0.2-0.4 ms (nccl-tests) and the GPU work 4-5 ms (bench/pipeline_floor.py,
    second table). 0 within one domain, or for an engine that shows none."""
    lay, rank_s = job.layout, job.training.engine.cross_domain_tp_rank_s
    if lay.tp == 1 or not rank_s or group_links(job.cluster, lay, "tp").domains == 1:
        return 0.0
    return collectives * rank_s * (lay.tp - 1)


@lru_cache(maxsize=4096)
def tp_exposed_per_layer(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, tp: int, cp: int,
                         micro_batch_size: int, sequence_parallel: bool = False) -> tuple[float, float]:
    """Tensor-parallel time one layer cannot hide, (forward, backward), for one micro-batch.

    Megatron TP runs two collectives in forward and two in backward per layer (all-reduces,
    or the same bytes as all-gather + reduce-scatter with sequence parallelism), not
    overlapped by default. With ``training.tp_comm_overlap`` (Megatron's
    ``--tp-comm-overlap``: Transformer Engine userbuffers; torchtitan's async TP) each of
    the four all-gathers or reduce-scatters is cut into tp chunks pipelined with the GEMM
    it feeds or follows (Wang et al., "Overlap communication with dependent computation via
    decomposition", ASPLOS 2023). That is not free: the first chunk's transfer waits in the
    open (the pipeline fills), what the GEMM cannot cover shows, and the GEMM runs as tp
    GEMMs of 1/tp of the tokens, each with its own launch and a less full last wave.
    Backward pairs each collective with twice the GEMM work (input and weight gradients).
    The chunks move by the copy engines (Transformer Engine userbuffers' ring exchange;
    symmetric-memory async TP), not by SM kernels, so they do not slow the GEMMs beside them
    as NCCL collectives do (``Performance.comm_overlap`` does not apply).

    Without overlap, each collective is also issued from the host on the critical path:
    engines that issue them from eager Python pay ``EngineBehaviour.collective_launch_s``
    per call (two all-reduces per pass, or four all-gathers and reduce-scatters with
    sequence parallelism).
    """
    one = tp_collective_time(model, training, cluster, tp, cp, micro_batch_size, sequence_parallel)
    if not training.tp_comm_overlap:
        launch = tp_collectives_per_pass(sequence_parallel) * training.engine.collective_launch_s if tp > 1 else 0.0
        return 2 * one + launch, 2 * one + launch
    tokens = micro_batch_size * training.seq_len / cp
    gpu, precision, recipe = cluster.gpu, training.precision, training.recipe
    chunk = one / 2 / tp  # one of the four collectives, cut in tp pieces
    forward = backward = 0.0
    for gemm in layer_gemms(model, tokens, tp):
        whole = gemm_time(gemm, gpu, precision, recipe)
        chunked = tp * gemm_time(Gemm(gemm.name, gemm.m / tp, gemm.n, gemm.k), gpu, precision, recipe)
        forward += chunk + max(0.0, chunk * (tp - 1) - chunked) + (chunked - whole)
        backward += chunk + max(0.0, chunk * (tp - 1) - 2 * chunked) + 2 * (chunked - whole)
    return forward, backward


def stage_time(job: Job, stage: int) -> StageTime:
    """Forward + backward of one micro-batch through stage ``stage``, with its exposed TP, CP and
    EP traffic."""
    model, lay, training = job.model, job.layout, job.training
    cluster, gpu = job.cluster, job.cluster.gpu
    perf = gpu.performance
    layers = job.stage_layers[stage]
    # Layers under the recipe, those it keeps in bf16 (none for most recipes), and MoE layers.
    high = job.high_precision_layers[stage]
    moe_layers = job.stage_moe_layers[stage]
    last = stage == lay.pp - 1
    decoder_layers = layers
    if last:
        # The multi-token prediction modules' layers run after the decoder's, on the last stage,
        # with its TP, CP and EP traffic and its recomputation (megatron-core builds them there).
        layers += model.mtp_layers
        moe_layers += model.mtp_moe_layers
    low = layer_time(job)
    kept = layer_time(job, quantized=False) if high else low
    moe = moe_layer_time(job) if moe_layers else low
    tokens = lay.micro_batch_size * training.seq_len / lay.cp
    # The tail the recipe keeps high is counted among the dense layers (no MoE model keeps one).
    high = min(high, layers - moe_layers)
    compute = (layers - high - moe_layers) * low.total + high * kept.total + moe_layers * moe.total
    if last:
        # The LM head runs in bf16 under every recipe (Transformer Engine's output layer is
        # Megatron's bf16 ColumnParallelLinear, bar megatron-core's opt-in MXFP8 head of 2026-05-31,
        # ``fp8_output_proj``, which no case asks for; torchao's conversions skip lm_head); its backward
        # is twice its forward; the loss's traffic is its own. Each multi-token prediction module
        # runs the head and the loss again, after its 2h → h projection (priced as the head).
        high_precision = high_precision_precision(training)
        heads = 1 + model.mtp_layers
        compute += heads * (3 * gemm_time(head_gemm(model, tokens, lay.tp), gpu, high_precision)
                            + cross_entropy_time(tokens * model.vocab_size / lay.tp, training, gpu))
        if model.mtp_layers:
            compute += model.mtp_layers * 3 * gemm_time(mtp_projection_gemm(model, tokens, lay.tp), gpu, high_precision)
    if stage == 0:
        compute += 3 * perf.kernel_overhead_s  # embedding gather: memory-trivial
    compute += gradient_accumulation_time(job, stage)

    recomputed = 0  # layers whose whole forward runs again in backward
    if lay.recompute == "full":
        # Megatron's uniform method recomputes the prediction modules too, its block method only
        # the decoder's first layers (``MultiTokenPredictionBlock``: "block ... Skipping recompute").
        recomputed = layers if lay.recompute_num_layers is None else min(lay.recompute_num_layers, decoder_layers)
    # The recomputed layers are the stage's first (Megatron's block method), the kept-high ones
    # its last; the MoE layers are spread among them.
    recomputed_high = max(0, recomputed - (layers - high))
    moe_share = moe_layers / layers if layers else 0.0
    dense_forward = (1 - moe_share) * low.forward + moe_share * moe.forward
    recompute = (recomputed - recomputed_high) * dense_forward + recomputed_high * kept.forward
    modules = selective_modules(model, training, lay) if lay.recompute == "selective" else ()
    if lay.recompute == "selective":
        share = weight_quantize_share(job) if training.recipe else 1.0
        args = (model, training, gpu, lay.tp, lay.cp, lay.micro_batch_size, lay.sequence_parallel)
        dense = layers - high - moe_layers
        recompute += dense * selective_recompute_time(*args, True, share, modules) \
            + high * selective_recompute_time(*args, False, 1.0, modules)
        if moe_layers:
            recompute += moe_layers * (selective_recompute_time(*args, True, share, modules, False)
                                       + moe_recompute_time(*args, lay.ep, lay.expert_tp, share, modules))

    # Recompute repeats the forward's TP collectives.
    p = activation_bytes(training.precision)
    tp_fwd, tp_bwd = tp_exposed_per_layer(model, training, cluster, lay.tp, lay.cp, lay.micro_batch_size,
                                          lay.sequence_parallel)
    # An MoE layer's routed experts need no tensor-parallel collective (each rank routes its own
    # sequence-parallel tokens); its shared experts need the dense MLP's pair.
    moe_tp = 1.0 if model.moe_shared_expert_ffn_hidden_size else 0.5
    tp_layers = layers - moe_layers + moe_tp * moe_layers
    # Passes that run the layers' TP collectives: forward, backward, and the forwards recomputed;
    # a recomputed dense MLP, or shared experts, repeat the forward's second half.
    repeated = recomputed * tp_layers / max(layers, 1)
    if "mlp" in modules:
        repeated += (layers - moe_layers) / 2
    if moe_layers and model.moe_shared_expert_ffn_hidden_size and {"moe", "shared_experts"} & set(modules):
        repeated += moe_layers / 2
    tp_comm = tp_layers * (tp_fwd + tp_bwd) + repeated * tp_fwd

    # Expert parallelism: each MoE layer dispatches and combines its tokens in forward and again
    # (reversed) in backward, and once more for a recomputed forward; nothing hides them in
    # megatron-core's default schedule.
    ep_comm = 0.0
    if moe_layers:
        pair = dispatch_combine_time(model, training, cluster, lay.tp, lay.cp, lay.micro_batch_size, lay.ep,
                                     lay.expert_tp)
        # A recomputed expert part (``moe``) dispatches and combines its tokens once more.
        ep_comm = moe_layers * 2 * pair + (recomputed * moe_layers / layers + ("moe" in modules) * moe_layers) * pair
        if training.moe_comm_overlap:
            # Each MoE layer's forward dispatch and combine run beside another micro-batch's
            # backward of a layer, its backward pair beside a forward: what that compute cannot
            # cover shows (:func:`collectives.exposed`).
            ep_comm = exposed(ep_comm, compute + recompute, perf)

    # Context parallelism: each layer's K and V chunks travel around the cp ring
    # (cp − 1 steps) in forward, and K, V plus their gradients in backward, overlapped
    # with the attention core (Megatron-core ``AttnFuncWithCPAndKVP2P``).
    cp_comm = 0.0
    if lay.cp > 1:
        kv = p * lay.micro_batch_size * (training.seq_len / lay.cp) * 2 * \
            max(model.num_kv_heads // lay.tp, 1) * model.head_dim
        cp_links = group_links(cluster, lay, "cp")
        crosses = cp_links.domains > 1
        hop = p2p_time(kv, crosses, cp_links, perf)
        # Each ring step waits for its block: the transfer's latency is never hidden, and
        # what the step's attention cannot cover of the rest shows.
        wait = cp_links.inter_latency if crosses else perf.link_latency_s
        steps = lay.cp - 1
        exposed_fwd = steps * wait + exposed(steps * (hop - wait), low.core, perf)
        exposed_bwd = 2 * steps * wait + exposed(2 * steps * (hop - wait), 2 * low.core, perf)
        cp_comm = layers * (exposed_fwd + exposed_bwd)
    # A stage whose pipeline neighbours, or tensor-parallel peers, are across the fabric may not run
    # faster than its collectives' floor (the larger of the two): what it adds shows as tensor-parallel time.
    collectives = tp_collectives_per_pass(lay.sequence_parallel) * (2 * tp_layers + repeated)
    floor = max(cross_domain_pipeline_floor(job, collectives), cross_domain_tp_floor(job, collectives))
    tp_comm += max(0.0, floor - (compute + recompute + tp_comm + cp_comm + ep_comm))
    return StageTime(compute=compute, recompute=recompute, tp_comm=tp_comm, cp_comm=cp_comm, ep_comm=ep_comm)


def dp_comm_exposed(job: Job, stage: int, slowest: StageTime) -> float:
    """Data-parallel traffic of one step that compute does not hide, for the stage's ranks.

    - ZeRO 0: gradient all-reduce, bucketed and overlapped with the last micro-batch's backward.
    - ZeRO 1/2: gradient reduce-scatter (overlapped likewise) and the parameter all-gather
      after the optimizer step (behind the next forward where the engine prefetches it).
      ZeRO-2 keeps only its gradient shard, so it reduce-scatters every micro-batch's
      gradients as they are produced, not once per step: DeepSpeed's stage 2 reduces in each
      backward's hooks (``zero/stage_1_and_2.py``, ``partition_gradients``) where stage 1
      waits for the accumulation boundary; FSDP's SHARD_GRAD_OP and Megatron-FSDP's
      ``optim_grads`` likewise.
    - The generic engine's ZeRO-1 with fp32 gradients (nanotron's, without DDP): one all-reduce of
      the whole fp32 buffer after the last backward, in the open, and the gather's copies
      (:func:`gather_copies_time`).
    - ZeRO 3: parameter all-gathers in forward and in backward (again for the recompute
      where the engine re-gathers) and a gradient reduce-scatter, for every micro-batch,
      prefetched behind that micro-batch's compute; what a pass's compute cannot cover is
      exposed, so more compute never shortens the step. Where the engine copies units through
      flat buffers (``EngineBehaviour.zero3_unit_copies``), each collective carries its copies.
    Every stage prices its collectives alike (:func:`pipelined`): the first gather or last
    bucket of a pass waits in the open, each collective pays its latency, and overlapped
    traffic still costs what ``Performance.comm_overlap`` leaves.
    - DeepSpeed's pipeline: the whole gradient all-reduce after the last micro-batch.
    - First and last stage, tied embeddings with pipelining: :func:`tied_embedding_reduce`.

    What compute hides is scaled by ``Performance.comm_overlap`` (:func:`collectives.exposed`).
    """
    lay, cluster = job.layout, job.cluster
    tied = tied_embedding_reduce(job, stage)
    stage_params = job_stage_parameters(job, stage)
    backward_last = 2 / 3 * slowest.compute + slowest.recompute
    # The experts' gradients are reduced over the expert data-parallel group, the rest over
    # dp·cp; the two share the step's overlap, one after the other.
    exposed_total = tied
    dense_tensors, expert_tensors = parameter_tensors(job, stage)
    for params, tensors, group, shards, first in ((stage_params.dense, dense_tensors, "dp_cp", zero_shards(job),
                                                   first_unit_parameters(job, stage)),
                                                  (stage_params.expert, expert_tensors, "edp", lay.edp, 0.0)):
        if params and shards > 1:
            exposed_total += _dp_traffic_exposed(job, stage, slowest, params, group_links(cluster, lay, group),
                                                 backward_last, first, tensors)
    return exposed_total


def parameter_tensors(job: Job, stage: int) -> tuple[int, int]:
    """(dense, expert) parameter tensors a rank of the stage holds, as nanotron's Llama lays them
    out (``models/llama.py``): a decoder layer's fused qkv_proj, o_proj, fused gate_up_proj,
    down_proj and two RMSNorm weights, six (MLA's kv down- and up-projections and their norm in
    place of qkv_proj's k and v: three more, and with a compressed query its down-projection and
    norm: five); an MoE layer's router and two weights a shared expert in place of its MLP's two, and
    two a local expert; the input embedding on the first stage, the final norm and the LM head on
    the last (one tensor with the embedding where they are tied on one stage)."""
    model, lay = job.model, job.layout
    layers, moe = job.stage_layers[stage], job.stage_moe_layers[stage]
    per_layer = 6 + ((5 if model.q_lora_rank else 3) if model.attention_type == "mla" else 0)
    shared = 2 if model.moe_shared_expert_ffn_hidden_size else 0
    first, last = stage == 0, stage == lay.pp - 1
    edges = first + last * (2 - (first and model.tied_embeddings))
    return layers * per_layer + moe * (1 + shared - 2) + edges, moe * 2 * (model.num_experts // lay.ep)


def first_unit_parameters(job: Job, stage: int) -> float:
    """Parameters of the ZeRO-3 unit that opens the first stage's forward and closes its backward:
    its gather waits in the open before anything can compute, and its gradients are the last
    produced, so their reduce-scatter waits after everything has. On the first stage this is the
    input embedding's unit (vocab-parallel: V·h/tp), with the final norm and the LM head where the
    engine's root unit holds them too (``EngineBehaviour.zero3_root_unit``; on one stage only).
    Other stages open with a layer's unit, as large as the rest (0 here)."""
    lay, model = job.layout, job.model
    if stage != 0:
        return 0.0
    unit = input_embedding_shard(job, stage)
    if job.training.engine.zero3_root_unit and lay.pp == 1:
        unit += (0 if model.tied_embeddings else embedding_parameters(model) / lay.tp) + norm_parameters(model)
    return unit


def input_embedding_shard(job: Job, stage: int) -> float:
    """Parameters of the input embedding on ``stage``: V·h/tp (vocab-parallel) on the first, 0 elsewhere."""
    return embedding_parameters(job.model) / job.layout.tp if stage == 0 else 0.0


def last_bucket_parameters(job: Job, stage: int) -> float:
    """Parameters of the ZeRO 0–2 gradient bucket that closes the first stage's backward: the
    input embedding's gradient is the last one produced, and a parameter larger than the bucket
    size gets a bucket of its own (PyTorch DDP ``_compute_bucket_assignment_by_size``; Megatron's
    ``_ParamAndGradBuffer`` and DeepSpeed's IPG bucket close a bucket once it is full, so the last
    one holds at least the embedding). Its reduction starts once nothing is left to compute, and
    the next step's first weight gather (ZeRO-1/2) is the same bucket's. Vocab-parallel: V·h/tp.
    Other stages end with a layer's bucket, no larger than the rest (0 here)."""
    return input_embedding_shard(job, stage)


def _dp_traffic_exposed(job: Job, stage: int, slowest: StageTime, params: float, dp_links, backward_last: float,
                        first_unit: float, tensors: int) -> float:
    """The exposed data-parallel traffic of ``params`` parameters in ``tensors`` tensors over
    ``dp_links`` (:func:`dp_comm_exposed`); ``first_unit`` of them form the ZeRO-3 unit that opens
    and closes the passes (:func:`first_unit_parameters`)."""
    lay, training = job.layout, job.training
    perf = job.cluster.gpu.performance
    tied = 0.0  # counted once, by dp_comm_exposed
    per_param = state_bytes(training)
    grads = params * per_param.gradients
    weights = params * gathered_weight_bytes(training)
    # Engines issue one collective per bucket (ZeRO 0–2) or per wrapped layer (ZeRO-3:
    # FSDP units, DeepSpeed's per-module gathers): each pays the collective's latency. A bucket
    # holds what autograd writes, gradients in the parameters' dtype, whatever dtype they are
    # then reduced in (:func:`gradient_chunks`).
    chunks = gradient_chunks(job, params, per_param.weights) if lay.zero_stage < 3 else \
        max(1, job.stage_layers[stage]) * training.engine.zero3_collectives_per_layer

    def chunked(kind: str, size: float) -> float:
        return chunks * collective_time(kind, size / chunks, dp_links, perf)

    engine = training.engine
    if lay.zero_stage < 3 and (lay.pp > 1 and engine.reduce_after_pipeline or folds_gradients_into_fp32(job)):
        # DeepSpeed's pipeline all-reduces gradients (its BF16 optimizer's fallback) once the
        # schedule has drained, and so does its BF16_Optimizer without a pipeline, once the last
        # backward is done (``engine.allreduce_gradients`` → ``buffered_allreduce_fallback``: it has no
        # reduce_gradients of its own); ZeRO-1 then gathers the updated weight shards
        # (``BF16_Optimizer.update_lp_params`` → ``all_gather_dp_groups``).
        return tied + chunked("all_reduce", grads) + (chunked("all_gather", weights) if lay.zero_stage else 0.0)
    forward = slowest.compute / 3
    if lay.zero_stage < 3:
        # Buckets reduce as the last micro-batch's backward produces them; the last bucket waits,
        # and on the first stage it holds the input embedding's gradients (the last produced).
        kind = "all_reduce" if lay.zero_stage == 0 else "reduce_scatter"
        last = max(1 / chunks, min(1.0, last_bucket_parameters(job, stage) / params))
        if lay.zero_stage == 1 and engine.zero1_fp32_reduce_after_backward and fp32_gradients(training):
            # No DDP: the whole fp32 gradient buffer in one all-reduce, once the backward is done.
            reduce = collective_time("all_reduce", grads, dp_links, perf)
        else:
            reduce = pipelined(chunked(kind, grads), chunks, backward_last, perf, last)
        if lay.zero_stage == 2:
            reduce *= job.num_microbatches
        if lay.zero_stage == 0:
            return tied + reduce
        # The updated weight shards are gathered after the optimizer step: behind the next
        # step's forward where the engine prefetches them (Megatron --overlap-param-gather,
        # FSDP-style), else in the open.
        if lay.zero_stage == 1 and engine.zero1_gather_in_step:
            # One coalesced all-gather of every updated shard before step() returns (nanotron's
            # ZeroDistributedOptimizer._all_gather_params → all_gather_coalesced): in the open, and
            # paying the collective's latency once, not once per gradient bucket.
            return tied + reduce + collective_time("all_gather", weights, dp_links, perf) \
                + gather_copies_time(job, dp_links.size, tensors)
        gather = chunked("all_gather", weights)
        return tied + reduce + (pipelined(gather, chunks, forward, perf, last) if engine.overlap_param_gather
                                else gather)
    # ZeRO-3 keeps only gradient shards, so every micro-batch gathers the weights again and
    # reduce-scatters its gradients, unit by unit, each behind the compute of the unit before:
    # the first gather of each pass waits, and what the pass's compute cannot cover.
    gather = chunked("all_gather", weights)
    reduce = chunked("reduce_scatter", grads)
    if engine.zero3_unit_copies:
        # Each copy reads and writes the unit (or its shard, 1/n of it) beside the collective,
        # at the element-wise kernels' bandwidth.
        gather += elementwise_time(2 * weights * (1 + 1 / dp_links.size), job.cluster.gpu)
        reduce += elementwise_time(2 * grads * (1 + 1 / dp_links.size), job.cluster.gpu)
        # The buffers are allocated per collective and freed after: a gather writes the unit twice
        # afresh, its all-gather output and the unsharded parameters (FSDP2's ``foreach_all_gather``,
        # ``FSDPParam.alloc_all_gather_outputs``), a reduction once, its reduce-scatter input, and
        # its shard (``foreach_reduce``).
        gather += first_touch_time(2 * weights, job.cluster.gpu)
        reduce += first_touch_time(grads * (1 + 1 / dp_links.size), job.cluster.gpu)
    backward_gathers = 1 + (lay.recompute == "full" and engine.regather_for_recompute)
    # The pass waits in the open for its first unit (the embedding's, where it is larger than a
    # layer's), and the backward for the same unit's reduce-scatter at its end.
    opening = max(1 / chunks, min(1.0, first_unit / params))
    per_microbatch = pipelined(gather, chunks, forward, perf, opening) \
        + pipelined(backward_gathers * gather + reduce, chunks, backward_last, perf, opening)
    return tied + job.num_microbatches * per_microbatch


def gather_copies_time(job: Job, ranks: int, tensors: int) -> float:
    """The host's time to copy every rank's chunk of each of ``tensors`` parameters out of a ZeRO-1
    gather's flat buffer, one kernel launch each, where the engine does so
    (``EngineBehaviour.zero1_gather_copies``: nanotron's ``all_gather_coalesced``). In the Playbook's
    sweep, without a pipeline on 8 nodes or more, a ZeRO-1 step takes a median 0.030 s longer than the
    same layout's at ZeRO-0: 0.031 s with these copies, 0.004 s without (bench/zero_pairs.py)."""
    if not job.training.engine.zero1_gather_copies:
        return 0.0
    return ranks * tensors * job.cluster.gpu.performance.kernel_overhead_s


def pipelined(comm_s: float, pieces: int, compute_s: float, perf, in_the_open: Optional[float] = None) -> float:
    """Communication issued in ``pieces`` collectives beside ``compute_s`` of compute, each
    overlapping the compute before or after it: one piece always waits in the open (the first
    prefetch, or the last bucket), the rest as :func:`collectives.exposed` says. That piece is
    ``in_the_open`` of the traffic where given, else an equal share."""
    piece = comm_s * in_the_open if in_the_open is not None else comm_s / pieces
    return piece + exposed(comm_s - piece, compute_s, perf)


def gradient_chunks(job: Job, params: float, bucketed_bytes: float) -> int:
    """Buckets of a ZeRO 0–2 gradient reduction: each is one collective, and each pays its latency.

    Buckets of a byte size (``EngineBehaviour.bucket_bytes``) are filled with the gradients
    autograd writes, ``bucketed_bytes`` per parameter: the parameters' dtype. PyTorch DDP's
    ``bucket_cap_mb`` counts ``param.grad`` (``_compute_bucket_assignment_by_size``); where the
    engine reduces in fp32 all the same, it does so bucket by bucket: nanotron's fp32
    accumulation hook (``optim/gradient_accumulator.py``, ``get_fp32_accum_hook``) reduces each
    16-bit bucket's fp32 accumulation buffers in one coalesced collective. Megatron's and
    DeepSpeed's buckets count parameters."""
    engine = job.training.engine
    per_bucket = max(engine.bucket_params, engine.bucket_bytes / bucketed_bytes, 1e6 * job.layout.dp
                     if engine.bucket_params else 0.0)
    return max(1, math.ceil(params / per_bucket)) if per_bucket else 1


def tied_embedding_reduce(job: Job, stage: int) -> float:
    """All-reduce of a tied embedding's gradients between the first and the last stage.

    With pipelining the two copies of a tied embedding (input embedding on the first
    stage, LM head on the last) sum their gradients once the pipeline has drained:
    Megatron ``finalize_model_grads`` → ``_allreduce_word_embedding_grads``, DeepSpeed's
    ``ReduceTiedGrads`` instruction. Multi-token prediction keeps such a copy of the input
    embedding on the last stage for an untied head too (megatron-core
    ``is_rank_in_embedding_group``: the last stage where MTP runs). Nothing is left to overlap
    it with. Two ranks: each sends and receives the whole shard once.
    """
    lay, model = job.layout, job.model
    if lay.pp == 1 or not (model.tied_embeddings or model.mtp_layers) or stage not in (0, lay.pp - 1):
        return 0.0
    size = embedding_parameters(model) / lay.tp * state_bytes(job.training).gradients
    links = group_links(job.cluster, lay, "pp")
    return p2p_time(size, links.domains > 1, links, job.cluster.gpu.performance)


def optimizer_time(job: Job, stage: int) -> float:
    """The optimizer step is HBM-bound: read gradients, read and write the fp32 states, write
    weights. The states are updated in place (:func:`kernels.in_place_time`)."""
    lay, gpu = job.layout, job.cluster.gpu
    shards = zero_shards(job)
    per_param = state_bytes(job.training, lay.zero_stage, shards)
    local = optimizer_local_parameters(job, stage) * (1 - lay.offload_optimizer)
    return in_place_time(local * optimizer_step_bytes(per_param, weights_are_master(job.training, lay.zero_stage,
                                                                                    shards)), gpu)


def optimizer_local_parameters(job: Job, stage: int) -> float:
    """Parameters whose optimizer states one rank of the stage holds: the dense ones over the
    ZeRO shards (dp·cp), the experts' over the expert data-parallel ranks."""
    lay = job.layout
    params = job_stage_parameters(job, stage)
    if lay.zero_stage == 0:
        return params.total
    return params.dense / zero_shards(job) + params.expert / lay.edp


def offload_time(job: Job, stage: int, slowest: "StageTime") -> float:
    """What offload adds to the step on the stage's ranks (:mod:`cost_models.offload`)."""
    lay = job.layout
    if not lay.offloads:
        return 0.0
    local = optimizer_local_parameters(job, stage)
    forward = slowest.compute / 3
    backward = 2 / 3 * slowest.compute + slowest.recompute
    gathers = 2 + (lay.recompute == "full" and job.training.engine.regather_for_recompute)
    return (optimizer_offload_time(job, local, backward)
            + param_offload_time(job, local, slowest.compute + slowest.recompute, gathers)
            + activation_offload_time(job, stage, per_microbatch(job).kept, forward, backward))


def pipeline_comm(job: Job) -> float:
    """Activations (forward) and their gradients (backward) sent across each stage boundary.

    On the critical path each micro-batch crosses the v·p − 1 chunk boundaries of its
    pipeline once each way; in the steady state one send per micro-batch and direction
    is exposed per stage, the others overlap with other stages' compute. With tp > 1
    each tensor-parallel rank sends only its 1/t slice over its own NIC: the slice that
    sequence parallelism already holds, or Megatron's scatter-gather of the replicated
    activation, re-assembled over NVLink (Narayanan et al. 2021, §4.1).
    """
    lay, training, cluster = job.layout, job.training, job.cluster
    if lay.pp == 1:
        return 0.0
    p = activation_bytes(training.precision)
    size = p * lay.micro_batch_size * training.seq_len / lay.cp * job.model.hidden_size / lay.tp
    links = group_links(cluster, lay, "pp")
    crosses = links.domains > 1
    send = p2p_time(size, crosses, links, cluster.gpu.performance)
    if lay.vpp > 1 and job.training.engine.p2p_overlap_interleaved:
        # Steady-state sends run under the other chunks' compute, but every chunk of every
        # micro-batch still waits for its receive to be posted and land: the latency shows.
        wait = links.inter_latency if crosses else cluster.gpu.performance.link_latency_s
        return 2 * send * (lay.pp - 1) + 2 * wait * job.num_microbatches * lay.vpp
    return 2 * send * (job.num_microbatches * lay.vpp + lay.pp - 1)


@dataclass(frozen=True)
class Pipeline:
    """The stages of a job that differ (one of each kind: layer count and role, first, middle
    or last, take the same time), and the slowest of them, which sets every micro-batch's pace."""

    kinds: tuple[int, ...]  # a stage of each kind
    slowest: StageTime

    def bubble(self, job: Job) -> float:
        """The pipeline's idle time in a step: its bubble fraction of the micro-batches, at the
        slowest stage's pace (Narayanan et al. 2021, §2.2)."""
        m, lay = job.num_microbatches, job.layout
        return bubble_fraction(lay.pp, lay.vpp, m) * m * self.slowest.total

    def least_step(self, job: Job) -> float:
        """What every micro-batch and the bubble take at the slowest stage's pace: the step
        (:func:`step_time`) less its data-parallel, pipeline, optimizer and offload terms."""
        return job.num_microbatches * self.slowest.total + self.bubble(job)


def pipeline(job: Job) -> Pipeline:
    """The job's stages by kind, each kind's time computed once (:func:`stage_time`)."""
    lay = job.layout
    kinds: dict[tuple, int] = {}
    for i, layers in enumerate(job.stage_layers):
        kinds.setdefault((layers, job.stage_moe_layers[i], job.high_precision_layers[i], i == 0, i == lay.pp - 1), i)
    return Pipeline(tuple(kinds.values()), max((stage_time(job, i) for i in kinds.values()), key=lambda s: s.total))


def step_time(job: Job, stages: Optional[Pipeline] = None) -> StepTime:
    """The step: every micro-batch at the slowest stage's pace, the bubble, and what the
    pipeline, data-parallel, optimizer and offload traffic add (``stages``: :func:`pipeline`'s,
    where the caller has it)."""
    stages = stages or pipeline(job)
    kinds, slowest = stages.kinds, stages.slowest
    m = job.num_microbatches
    return StepTime(
        compute_s=m * slowest.compute,
        recompute_s=m * slowest.recompute,
        tp_comm_s=m * slowest.tp_comm,
        cp_comm_s=m * slowest.cp_comm,
        ep_comm_s=m * slowest.ep_comm,
        pp_comm_s=pipeline_comm(job),
        dp_comm_s=max(dp_comm_exposed(job, i, slowest) for i in kinds),
        bubble_s=stages.bubble(job),
        optimizer_s=max(optimizer_time(job, i) for i in kinds),
        offload_s=max(offload_time(job, i, slowest) for i in kinds),
        overhead_s=host_overhead(job),
    )


def host_overhead(job: Job) -> float:
    """Host time per step that no GPU work hides: a fixed cost per optimizer step and one per
    micro-batch each rank runs (``Performance.step_overhead_s``, ``microbatch_overhead_s``)."""
    perf = job.cluster.gpu.performance
    return perf.step_overhead_s + job.num_microbatches * perf.microbatch_overhead_s


def model_flops_per_step(job: Job) -> float:
    tokens = job.training.global_batch_size * job.training.seq_len
    return tokens * model_flops_per_token(job.model, job.training.seq_len)
