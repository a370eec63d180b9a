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

from .activations import activation_bytes
from .collectives import collective_time, exposed, p2p_time
from .flops import Gemm, attention_flops, head_gemm, layer_gemms, model_flops_per_token
from .memory import job_stage_parameters, zero_shards
from .parameters import embedding_parameters
from .model_states import state_bytes
from .pipeline import bubble_fraction
from .specs import ClusterSpec, GPUSpec, Job, Layout, ModelSpec, TrainingSpec
from .topology import group_links

# Megatron's DDP bucket: at least 40 M parameters (``megatron/core/distributed/``, bucket_size =
# max(40_000_000, 1_000_000 · dp)); we take the floor. The last bucket cannot overlap with backward.
DDP_BUCKET_PARAMS = 40e6

# Engines whose ZeRO-3 gathers the weights once more for the recompute forward inside
# backward. DeepSpeed fetches a module's partitioned weights in every forward pre-hook
# (``deepspeed/runtime/zero/parameter_offload.py``, ``pre_sub_module_forward_function``),
# the recompute's included, and releases them after. FSDP (torchtitan's FSDP2 and
# PyTorch FSDP) shards the checkpointed block as one unit: its backward pre-hook gathers
# once and the recompute runs inside the unsharded unit. "any" is taken as FSDP-like.
REGATHER_FOR_RECOMPUTE = frozenset({"deepspeed"})

# Engines that overlap interleaved pipelines' sends with compute: Megatron-core posts the
# next chunk's send/receive before computing the current one (``overlap_p2p_comm``, on
# unless --no-overlap-p2p-communication; ``pipeline_parallel/schedules.py``).
P2P_OVERLAP_INTERLEAVED = frozenset({"megatron"})

# Engines whose pipeline reduces data-parallel gradients only after the last micro-batch,
# with nothing to overlap: DeepSpeed's ``TrainSchedule`` ends every step with
# ReduceTiedGrads, ReduceGrads, OptimizerStep (``deepspeed/runtime/pipe/schedule.py``).
REDUCE_AFTER_PIPELINE = frozenset({"deepspeed"})


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    bubble_s: float
    optimizer_s: float
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

    @property
    def total(self) -> float:
        return self.compute + self.recompute + self.tp_comm + self.cp_comm


def gemm_time(gemm: Gemm, gpu: GPUSpec, precision: str) -> float:
    """Roofline with a fixed per-kernel cost: max(FLOPs/(η·peak), bytes/(η_hbm·B_hbm)) + t₀.

    The fixed cost is what makes small GEMMs (narrow tensor-parallel shards, short
    sequences) less efficient than large ones. fp8 GEMMs (Transformer Engine) first
    cast their bf16 inputs to fp8 in memory-bound kernels (read 2 bytes, write 1, per
    element of both operands: ``transformer_engine`` ``cast_transpose``), which this
    adds on top.
    """
    perf = gpu.performance
    element = 4 if precision == "fp32" else (1 if precision == "fp8" else 2)
    operands = gemm.m * gemm.k + gemm.k * gemm.n
    traffic = element * (operands + gemm.m * gemm.n)
    casts = 3 * operands if precision == "fp8" else 0.0
    hbm = perf.hbm_efficiency * gpu.hbm_bandwidth
    return max(gemm.flops / (perf.gemm_efficiency * gpu.peak(precision)), traffic / hbm) \
        + casts / hbm + perf.kernel_overhead_s


def elementwise_bytes(model: ModelSpec, training: TrainingSpec, lay: Layout, tokens: float) -> float:
    """HBM traffic of one layer's forward element-wise kernels on one GPU.

    Per token, in elements: two norms (read + write h each), two residual adds
    (2 reads + 1 write of h), the activation function (GeLU reads and writes f;
    SwiGLU reads 2f and writes f), dropout (read, write, 1-byte mask) where on.
    Non-flash attention adds the scaled-masked softmax over a·s scores (read + write)
    and its dropout. Sequence parallelism shards the norm, residual and dropout part.
    """
    p = activation_bytes(training.precision)
    h, f, t = model.hidden_size, model.ffn_hidden_size, lay.tp
    sp = t if lay.sequence_parallel else 1
    act = (3 if model.activation == "swiglu" else 2) * f / t
    dropout = 2 * (2 * p + 1) * h / sp if model.dropout > 0 else 0.0
    per_token = p * (4 * h + 6 * h) / sp + p * act + dropout
    if not training.flash_attention:
        scores = model.num_attention_heads / t * training.seq_len / lay.cp
        per_token += scores * (2 * p + ((2 * p + 1) if model.dropout > 0 else 0))
    return per_token * tokens


def cross_entropy_bytes(logits: float, training: TrainingSpec) -> float:
    """HBM traffic of the loss over ``logits`` elements (one GPU's vocab shard), forward and backward.

    The softmax cross-entropy runs in fp32 whatever the training precision (PyTorch
    autocast's fp32 list holds ``log_softmax``/``cross_entropy``; Megatron's
    ``vocab_parallel_cross_entropy`` calls ``.float()``). Per logit, in bytes: forward
    reads the logits and writes an fp32 copy (p + 4), reads it for the max (4) and
    reads and writes it for exp-and-sum (8); backward reads the probabilities and writes
    the fp32 gradient (8), then casts it to the logits' precision (4 + p).
    """
    p = activation_bytes(training.precision)
    return logits * ((p + 4) + 4 + 8 + 8 + (4 + p))


def layer_forward_time(job: Job) -> tuple[float, float]:
    """Forward time of one layer for one micro-batch: (whole layer, attention core alone)."""
    lay = job.layout
    return layer_forward_time_for(job.model, job.training, job.cluster.gpu, lay.tp, lay.cp, lay.micro_batch_size,
                               lay.sequence_parallel)


def layer_gemm_time(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, tp: int, tokens: float) -> float:
    """Forward time of one layer's GEMMs (QKV, projection, MLP) on ``tokens`` tokens."""
    return sum(gemm_time(g, gpu, training.precision) for g in layer_gemms(model, tokens, tp))


@lru_cache(maxsize=4096)
def layer_forward_time_for(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, tp: int, cp: int,
                        micro_batch_size: int, sequence_parallel: bool) -> tuple[float, float]:
    # Only these layout fields shape one layer's forward: cached, since a search scores
    # many layouts that share them.
    lay = Layout(tp=tp, cp=cp, micro_batch_size=micro_batch_size, sequence_parallel=sequence_parallel)
    perf = gpu.performance
    s_local = training.seq_len / lay.cp
    tokens = lay.micro_batch_size * s_local
    gemms = layer_gemm_time(model, training, gpu, lay.tp, tokens)
    # Attention runs in bf16 even in fp8 recipes (Transformer Engine keeps DPA in bf16).
    attn_precision = "bf16" if training.precision == "fp8" else training.precision
    # Context parallelism: each rank attends its s/cp queries to all s keys, balanced causally.
    flops = attention_flops(model, lay.micro_batch_size, s_local, training.seq_len, lay.tp)
    if training.flash_attention:
        core = flops / (perf.attention_efficiency * gpu.peak(attn_precision)) + perf.kernel_overhead_s
    else:
        # Two batched GEMMs (scores and context) over a·b/t heads, full s×s (no causal skipping).
        heads = model.num_attention_heads / lay.tp * lay.micro_batch_size
        per_head = Gemm("scores", s_local, training.seq_len, model.head_dim)
        core = 2 * (heads * per_head.flops / (perf.gemm_efficiency * gpu.peak(attn_precision))
                    + perf.kernel_overhead_s)
    memory = elementwise_bytes(model, training, lay, tokens) / (perf.hbm_efficiency * gpu.hbm_bandwidth)
    return gemms + core + memory, core


@lru_cache(maxsize=4096)
def tp_collective_time(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, tp: int, cp: int,
                       micro_batch_size: int) -> float:
    """One of a layer's tensor-parallel all-reduces (or all-gather + reduce-scatter pairs, which
    move the same bytes) of a micro-batch's activations: b·(s/cp)·h elements."""
    if tp == 1:
        return 0.0
    p = activation_bytes(training.precision)
    tokens = micro_batch_size * training.seq_len / cp
    links = group_links(cluster, Layout(tp=tp, dp=cluster.num_gpus // tp), "tp")
    return collective_time("all_reduce", p * tokens * model.hidden_size, links, cluster.gpu.performance)


@lru_cache(maxsize=4096)
def tp_exposed_per_layer(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, tp: int, cp: int,
                         micro_batch_size: int) -> tuple[float, float]:
    """Tensor-parallel time one layer cannot hide, (forward, backward), for one micro-batch.

    Megatron TP runs two collectives in forward and two in backward per layer (all-reduces,
    or the same bytes as all-gather + reduce-scatter with sequence parallelism), not
    overlapped by default. With ``training.tp_comm_overlap`` (Megatron's
    ``--tp-comm-overlap``: Transformer Engine userbuffers; torchtitan's async TP) each
    collective is split into chunks pipelined with the GEMM it feeds or follows, so only
    what exceeds the layer's GEMM time shows (Wang et al., "Overlap communication with
    dependent computation via decomposition", ASPLOS 2023); backward has twice the
    forward's GEMM time.
    """
    one = tp_collective_time(model, training, cluster, tp, cp, micro_batch_size)
    if not training.tp_comm_overlap:
        return 2 * one, 2 * one
    tokens = micro_batch_size * training.seq_len / cp
    gemms = layer_gemm_time(model, training, cluster.gpu, tp, tokens)
    perf = cluster.gpu.performance
    return exposed(2 * one, gemms, perf), exposed(2 * one, 2 * gemms, perf)


def stage_time(job: Job, stage: int) -> StageTime:
    """Forward + backward of one micro-batch through stage ``stage``, with its exposed TP and CP traffic."""
    model, lay, training = job.model, job.layout, job.training
    cluster, gpu = job.cluster, job.cluster.gpu
    perf = gpu.performance
    layers = job.stage_layers[stage]
    layer_fwd, core_fwd = layer_forward_time(job)
    tokens = lay.micro_batch_size * training.seq_len / lay.cp
    forward = layers * layer_fwd
    loss = 0.0
    if stage == lay.pp - 1:
        forward += gemm_time(head_gemm(model, tokens, lay.tp), gpu, training.precision)
        loss = cross_entropy_bytes(tokens * model.vocab_size / lay.tp, training) \
            / (perf.hbm_efficiency * gpu.hbm_bandwidth)
    if stage == 0:
        forward += perf.kernel_overhead_s  # embedding gather: memory-trivial
    compute = 3 * forward + loss  # backward computes input and weight gradients: twice the forward

    recomputed = 0  # layers whose whole forward runs again in backward
    if lay.recompute == "full":
        recomputed = layers if lay.recompute_num_layers is None else min(lay.recompute_num_layers, layers)
    recompute = recomputed * layer_fwd + (layers * core_fwd if lay.recompute == "selective" else 0.0)

    # Recompute repeats the forward's TP collectives.
    p = activation_bytes(training.precision)
    tp_fwd, tp_bwd = tp_exposed_per_layer(model, training, cluster, lay.tp, lay.cp, lay.micro_batch_size)
    tp_comm = layers * (tp_fwd + tp_bwd) + recomputed * tp_fwd

    # Context parallelism: each layer's K and V chunks travel around the cp ring
    # (cp − 1 steps) in forward, and K, V plus their gradients in backward, overlapped
    # with the attention core (Megatron-core ``AttnFuncWithCPAndKVP2P``).
    cp_comm = 0.0
    if lay.cp > 1:
        kv = p * lay.micro_batch_size * (training.seq_len / lay.cp) * 2 * \
            max(model.num_kv_heads // lay.tp, 1) * model.head_dim
        cp_links = group_links(cluster, lay, "cp")
        hop = p2p_time(kv, cp_links.domains > 1, cp_links, perf)
        exposed_fwd = exposed((lay.cp - 1) * hop, core_fwd, perf)
        exposed_bwd = exposed(2 * (lay.cp - 1) * hop, 2 * core_fwd, perf)
        cp_comm = layers * (exposed_fwd + exposed_bwd)
    return StageTime(compute=compute, recompute=recompute, tp_comm=tp_comm, cp_comm=cp_comm)


def dp_comm_exposed(job: Job, stage: int, slowest: StageTime) -> float:
    """Data-parallel traffic of one step that compute does not hide, for the stage's ranks.

    - ZeRO 0: gradient all-reduce, bucketed and overlapped with the last micro-batch's backward.
    - ZeRO 1/2: gradient reduce-scatter (overlapped likewise) and the parameter all-gather
      after the optimizer step (exposed).
    - ZeRO 3: parameter all-gathers in forward and in backward (again for the recompute
      where the engine re-gathers) and a gradient reduce-scatter, for every micro-batch,
      prefetched behind that micro-batch's compute; what a pass's compute cannot cover is
      exposed, so more compute never shortens the step.
    - DeepSpeed's pipeline: the whole gradient all-reduce after the last micro-batch.
    - First and last stage, tied embeddings with pipelining: :func:`tied_embedding_reduce`.

    What compute hides is scaled by ``Performance.comm_overlap`` (:func:`collectives.exposed`).
    """
    lay, training, cluster = job.layout, job.training, job.cluster
    perf = cluster.gpu.performance
    tied = tied_embedding_reduce(job, stage)
    if zero_shards(job) == 1:
        return tied
    params = job_stage_parameters(job, stage)
    per_param = state_bytes(training)
    dp_links = group_links(cluster, lay, "dp_cp")
    grads = params * per_param.gradients
    weights = params * per_param.weights
    backward_last = 2 / 3 * slowest.compute + slowest.recompute
    # Engines issue one collective per bucket (ZeRO 0–2) or per wrapped layer (ZeRO-3:
    # FSDP units, DeepSpeed's per-module gathers): each pays the collective's latency.
    chunks = job.stage_layers[stage] if lay.zero_stage == 3 else max(1, math.ceil(params / DDP_BUCKET_PARAMS))

    def chunked(kind: str, size: float) -> float:
        return chunks * collective_time(kind, size / chunks, dp_links, perf)

    if lay.pp > 1 and lay.zero_stage < 3 and training.engine in REDUCE_AFTER_PIPELINE:
        # DeepSpeed's pipeline all-reduces gradients (its BF16 optimizer's fallback) once the
        # schedule has drained; ZeRO-1 then gathers the updated weight shards.
        return tied + chunked("all_reduce", grads) + (chunked("all_gather", weights) if lay.zero_stage else 0.0)
    if lay.zero_stage == 0:
        reduce = chunked("all_reduce", grads)
        return tied + max(exposed(reduce, backward_last, perf), reduce / chunks)
    if lay.zero_stage in (1, 2):
        reduce = chunked("reduce_scatter", grads)
        return tied + max(exposed(reduce, backward_last, perf), reduce / chunks) + chunked("all_gather", weights)
    # ZeRO-3 keeps only gradient shards, so every micro-batch reduce-scatters its gradients.
    # Forward gathers hide behind the forward; backward gathers and the reduce-scatter share
    # the backward.
    gather = chunked("all_gather", weights)
    reduce = chunked("reduce_scatter", grads)
    backward_gathers = 1 + (lay.recompute == "full" and job.training.engine in REGATHER_FOR_RECOMPUTE)
    forward = slowest.compute / 3
    per_microbatch = exposed(gather, forward, perf) + exposed(backward_gathers * gather + reduce, backward_last, perf)
    return tied + job.num_microbatches * per_microbatch


def tied_embedding_reduce(job: Job, stage: int) -> float:
    """All-reduce of a tied embedding's gradients between the first and the last stage.

    With pipelining the two copies of a tied embedding (input embedding on the first
    stage, LM head on the last) sum their gradients once the pipeline has drained:
    Megatron ``finalize_model_grads`` → ``_allreduce_word_embedding_grads``, DeepSpeed's
    ``ReduceTiedGrads`` instruction. Nothing is left to overlap it with. Two ranks: each
    sends and receives the whole shard once.
    """
    lay, model = job.layout, job.model
    if lay.pp == 1 or not model.tied_embeddings or stage not in (0, lay.pp - 1):
        return 0.0
    size = embedding_parameters(model) / lay.tp * state_bytes(job.training).gradients
    links = group_links(job.cluster, lay, "pp")
    return p2p_time(size, links.domains > 1, links, job.cluster.gpu.performance)


def optimizer_time(job: Job, stage: int) -> float:
    """The optimizer step is HBM-bound: read gradients, read and write the fp32 states, write weights."""
    lay, gpu = job.layout, job.cluster.gpu
    params = job_stage_parameters(job, stage)
    per_param = state_bytes(job.training)
    local = params / (zero_shards(job) if lay.zero_stage >= 1 else 1)
    traffic = per_param.gradients + 2 * per_param.optimizer + per_param.weights
    return local * traffic / (gpu.performance.hbm_efficiency * gpu.hbm_bandwidth)


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
    send = p2p_time(size, links.domains > 1, links, cluster.gpu.performance)
    if lay.vpp > 1 and job.training.engine in P2P_OVERLAP_INTERLEAVED:
        return 2 * send * (lay.pp - 1)  # steady-state sends run under the other chunks' compute
    return 2 * send * (job.num_microbatches * lay.vpp + lay.pp - 1)


def step_time(job: Job) -> StepTime:
    lay = job.layout
    # Stages with the same layer count and role (first, middle, last) take the same time.
    kinds: dict[tuple, int] = {}
    for i, layers in enumerate(job.stage_layers):
        kinds.setdefault((layers, i == 0, i == lay.pp - 1), i)
    stages = [stage_time(job, i) for i in kinds.values()]
    slowest = max(stages, key=lambda s: s.total)
    m = job.num_microbatches
    return StepTime(
        compute_s=m * slowest.compute,
        recompute_s=m * slowest.recompute,
        tp_comm_s=m * slowest.tp_comm,
        cp_comm_s=m * slowest.cp_comm,
        pp_comm_s=pipeline_comm(job),
        dp_comm_s=max(dp_comm_exposed(job, i, slowest) for i in kinds.values()),
        bubble_s=bubble_fraction(lay.pp, lay.vpp, m) * m * slowest.total,
        optimizer_s=max(optimizer_time(job, i) for i in kinds.values()),
        overhead_s=job.cluster.gpu.performance.step_overhead_s,
    )


def model_flops_per_step(job: Job) -> float:
    tokens = job.training.global_batch_size * job.training.seq_len
    return tokens * model_flops_per_token(job.model, job.training.seq_len)
