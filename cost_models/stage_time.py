"""One pipeline stage's time per micro-batch: its layers' compute, recomputation and the
tensor-, context- and expert-parallel traffic it cannot hide (:class:`StageTime`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from .activations import logit_shards, selective_modules
from .collectives import all_to_all_time, collective_time, exposed, latency, p2p_time
from .experts import dispatch_combine_time, moe_recompute_time
from .flops import Gemm, head_gemm, mtp_projection_gemm
from .kernels import gemm_time, high_precision_precision, in_place_time
from .memory import job_head_shards, job_stage_parameters
from .parameters import built_vocab
from .model_states import folds_gradients_into_flat_buffer, folds_gradients_into_fp32
from .quantization import activation_bytes
from .pipeline import interleaved_warmup
from .job import Job, kept_by_stage
from .specs import ClusterSpec, GPUSpec, ModelSpec, TrainingSpec
from .topology import cp_group_links, group_links
from .layer_time import cross_entropy_time, layer_time, moe_layer_time, selective_recompute_time, weight_quantize_share
from .tp_time import (column_linear_backward_time, column_linear_input_widths, cross_domain_pipeline_floor,
                      cross_domain_tp_floor, moe_layer_tp_share, tp_collectives_per_pass, tp_exposed_per_layer)


def cp_exposed_per_layer(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, tp: int, cp: int,
                         micro_batch_size: int, core: float) -> float:
    """Context-parallel time one layer cannot hide, forward and backward, for one micro-batch whose
    attention core's forward takes ``core`` (:func:`cp_exposed_passes`, both passes)."""
    return sum(cp_exposed_passes(model, training, cluster, tp, cp, micro_batch_size, core))


@lru_cache(maxsize=4096)
def cp_exposed_passes(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, tp: int, cp: int,
                      micro_batch_size: int, core: float) -> tuple[float, float]:
    """Context-parallel time one layer cannot hide, (forward, backward), for one micro-batch whose
    attention core's forward takes ``core``. The forward's part runs again wherever the attention's
    forward is recomputed (``_stage_time``). Under Megatron's p2p ring each layer's K and V chunks
    travel around the cp ring (cp − 1 steps) in forward, and K, V plus their gradients in backward,
    overlapped with the attention core (Megatron-core ``AttnFuncWithCPAndKVP2P``). Each ring step waits
    for its block: the transfer's latency is never hidden, and what the step's attention cannot cover
    of the rest shows. Cached: the stages of a search's layouts share a few shapes."""
    if cp == 1:
        return 0.0, 0.0
    if cp_runs_all_to_all(model, training):
        # The same exchanges before and after the core, in forward as in backward.
        half = cp_all_to_all_per_layer(model, training, cluster, tp, cp, micro_batch_size) / 2
        return half, half
    if cp_exchange(training) != "p2p":
        return cp_torch_exposed_passes(model, training, cluster, tp, cp, micro_batch_size, core)
    perf = cluster.gpu.performance
    cp_links = cp_group_links(cluster, tp, cp)
    kv = activation_bytes(training.precision) * micro_batch_size * (training.seq_len / cp) * 2 * \
        max(model.num_kv_heads // tp, 1) * model.head_dim
    crosses = cp_links.domains > 1
    hop = p2p_time(kv, crosses, cp_links, perf)
    wait = cp_links.inter_latency if crosses else perf.link_latency_s
    steps = cp - 1
    exposed_fwd = steps * wait + exposed(steps * (hop - wait), core, perf)
    exposed_bwd = 2 * steps * wait + exposed(2 * steps * (hop - wait), 2 * core, perf)
    return exposed_fwd, exposed_bwd


def cp_exchange(training: TrainingSpec) -> str:
    """The K/V exchange the job's context parallelism runs (``behaviour.CP_EXCHANGES``): the job's
    where it says (a torchtitan 0.2 job file's rotate method), else the engine's."""
    return training.cp_exchange or training.engine.cp_exchange


# torch's ring attention accumulates and rotates the K/V gradients in fp32: _ContextParallelOptions
# convert_to_f32 True, which nothing in torch or torchtitan turns off (torch 2.13,
# torch/distributed/tensor/experimental/_context_parallel/_attention.py).
TORCH_RING_GRAD_BYTES = 4


def cp_kv_shard_bytes(model: ModelSpec, training: TrainingSpec, tp: int, cp: int,
                      micro_batch_size: int) -> tuple[float, float]:
    """(K, V) bytes of one layer one context-parallel rank holds for one micro-batch: its seq/cp
    tokens of its kv_heads/tp heads, head_dim (K) and value_head_dim (V) wide, in the activations'
    dtype. torchtitan 0.3.0 hands K and V to the attention at their own heads (``enable_gqa``,
    models/common/attention.py), not repeated to the query heads, and so does 0.2.2 to SDPA's ring
    (models/llama3/model/model.py ``Attention.forward``). 0.2.0 and 0.2.1 repeat them to the query
    heads first (``repeat_kv``), so their ring moves n_heads/n_kv_heads times these bytes; a 0.2 job
    file does not say which release reads it, and is priced as 0.2.2, the last."""
    elements = micro_batch_size * (training.seq_len / cp) * max(model.num_kv_heads // tp, 1)
    size = activation_bytes(training.precision)
    return size * elements * model.head_dim, size * elements * model.value_head_dim


def cp_torch_collectives(model: ModelSpec, training: TrainingSpec, tp: int, cp: int, micro_batch_size: int,
                         exchange: str) -> dict[str, tuple[tuple[str, float], ...]]:
    """The collectives one context-parallel rank issues per layer per micro-batch under a torch
    exchange, {"forward": ..., "backward": ...}, each (kind, bytes) in issue order: kind "all_gather" or
    "reduce_scatter" with the full buffer (``collectives.collective_time``'s convention), or
    "permute", one rank's send to the next (``ft_c.permute_tensor``, dsts rank + 1).

    - "kv_gather" (torchtitan 0.3.0: under its default ``spmd_types`` backend the attention's
      ShardingConfig takes K and V Replicate on cp and their gradients Partial,
      models/common/decoder_sharding.py; under ``partial_dtensor`` ``apply_cp_to_forward`` calls torch's
      ``flex_cp_allgather``, _context_parallel/_cp_custom_ops.py, for FlexAttention, the registries'
      default ``attn_backend``): all_gather_single of K, then of V; backward reduce_scatter_single of
      their gradients, in the activations' dtype.
    - "allgather" and "alltoall" (torch's ring attention for SDPA, _context_parallel/_attention.py
      ``_templated_ring_attention`` and ``_templated_ring_attention_backward``): the rotater of K and V
      cat together (``_AllGatherRotater``: one all_gather_single of the cp shards at the first step;
      ``_AllToAllRotater``: a permute at each of the first cp − 1 steps), in forward and again in
      backward; the backward's K/V gradients always by ``_AllToAllRotater``, one permute at each of the cp
      steps, in fp32 (:data:`TORCH_RING_GRAD_BYTES`), issue order interleaved step by step."""
    k, v = cp_kv_shard_bytes(model, training, tp, cp, micro_batch_size)
    if exchange == "kv_gather":
        return {"forward": (("all_gather", cp * k), ("all_gather", cp * v)),
                "backward": (("reduce_scatter", cp * k), ("reduce_scatter", cp * v))}
    if exchange == "allgather":
        kv = (("all_gather", cp * (k + v)),)
    elif exchange == "alltoall":
        kv = (("permute", k + v),) * (cp - 1)
    else:
        raise ValueError(f"cp_torch_collectives: no torch exchange {exchange!r}")
    grad = ("permute", (k + v) * TORCH_RING_GRAD_BYTES / activation_bytes(training.precision))
    # Backward step i issues its K/V rotation (if any), then, after its attention, the gradients' permute.
    backward = tuple(op for i in range(cp) for op in (kv[i:i + 1] if exchange == "alltoall" else kv if i == 0 else ()) + (grad,))
    return {"forward": kv, "backward": backward}


def cp_torch_exposed_passes(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, tp: int, cp: int,
                            micro_batch_size: int, core: float) -> tuple[float, float]:
    """Context-parallel time one layer cannot hide, (forward, backward), for one micro-batch whose
    attention core's forward takes ``core``, under a torch exchange (:func:`cp_torch_collectives`).

    "kv_gather": each collective is waited before the attention runs, or after its backward: nothing
    hides. The ring ("allgather", "alltoall"): a load-balanced rank runs a cp-th of its attention at each
    of the cp steps (head-tail sharding: the diagonal pair of chunks, then half of each other block,
    ``_templated_ring_attention``'s Note); a collective issued at one step runs beside that step's
    attention and is waited at the next. ``_AllGatherRotater``'s one all-gather hides behind the first
    step only; a permute behind its own step. In backward (twice the forward per step) the K/V rotation
    issued at step i and the gradients' permute issued at the end of step i − 1 run beside step i, and
    the last gradients' permute, waited after the loop, hides behind nothing. Each wait's latency shows."""
    exchange = cp_exchange(training)
    links = cp_group_links(cluster, tp, cp)
    perf = cluster.gpu.performance
    crosses = links.domains > 1
    hop_wait = links.inter_latency if crosses else perf.link_latency_s

    def timed(kind: str, size: float) -> tuple[float, float]:  # (seconds, latency no compute hides)
        if kind == "permute":
            return p2p_time(size, crosses, links, perf), hop_wait
        return collective_time(kind, size, links, perf), latency(kind, links, perf)

    def beside(comms, compute: float) -> float:
        total = sum(seconds for seconds, _ in comms)
        waits = sum(wait for _, wait in comms)
        return waits + exposed(total - waits, compute, perf) if comms else 0.0

    passes = cp_torch_collectives(model, training, tp, cp, micro_batch_size, exchange)
    if exchange == "kv_gather":
        return tuple(sum(timed(kind, size)[0] for kind, size in passes[name]) for name in ("forward", "backward"))
    step = core / cp
    kv = [timed(kind, size) for kind, size in passes["forward"]]
    grad_ops = list(passes["backward"])
    for op in passes["forward"]:  # what the backward issues beyond the forward's rotation: the gradients
        grad_ops.remove(op)
    grads = [timed(kind, size) for kind, size in grad_ops]
    # The K/V rotation in flight at each step: all of it at step 0 (all-gather), or one permute at each
    # of steps 0 .. cp − 2.
    rotation = [kv if exchange == "allgather" and i == 0 else kv[i:i + 1] if exchange == "alltoall" else []
                for i in range(cp)]
    forward = sum(beside(rotation[i], step) for i in range(cp))
    backward = sum(beside(rotation[i] + grads[i - 1:i] if i else rotation[i], 2 * step) for i in range(cp))
    return forward, backward + beside(grads[-1:], 0.0)


def cp_runs_all_to_all(model: ModelSpec, training: TrainingSpec) -> bool:
    """Whether the job's context parallelism runs as all-to-all rather than the p2p ring: a model
    with sliding-window layers on an engine whose attention takes a window only so
    (``EngineBehaviour.cp_all_to_all_for_windows``)."""
    return bool(model.sliding_window) and training.engine.cp_all_to_all_for_windows


def cp_all_to_all_per_layer(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, tp: int, cp: int,
                            micro_batch_size: int) -> float:
    """Context-parallel time of one layer run as all-to-all, forward and backward, for one
    micro-batch (Transformer Engine's ``AttnFuncWithCPAndQKVOA2A``; DeepSpeed-Ulysses, Jacobs et al.
    2023, §3): before the attention core each rank trades its sequence chunk of every head for the
    whole sequence of its heads' share (Q, K and V), after it the output back; the backward trades
    their gradients alike. The core waits for each exchange: nothing hides it."""
    tokens = micro_batch_size * training.seq_len / cp
    width = (model.num_attention_heads // tp) * (model.head_dim + model.value_head_dim) \
        + max(model.num_kv_heads // tp, 1) * (model.head_dim + model.value_head_dim)
    exchanged = activation_bytes(training.precision) * tokens * width  # Q, K, V in and O out, per rank
    links = cp_group_links(cluster, tp, cp)
    perf = cluster.gpu.performance
    return 2 * 2 * all_to_all_time(exchanged / 2, links, perf)  # fwd and bwd, each before and after the core


@lru_cache(maxsize=4096)
def head_time(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, tp: int, tokens: float,
              shards: Optional[int] = None, weight_shards: Optional[int] = None) -> float:
    """The last stage's LM head and loss on ``tokens`` tokens, forward and backward. The head runs
    in bf16 under every recipe (Transformer Engine's output layer is Megatron's bf16
    ColumnParallelLinear, bar megatron-core's opt-in MXFP8 head of 2026-05-31, ``fp8_output_proj``,
    which no case asks for; torchao's conversions skip lm_head); its backward is twice its forward;
    the loss's traffic is its own. Each multi-token prediction module runs the head and the loss
    again, after its 2h → h projection (priced as the head). Both run over the vocabulary the engine
    builds (``parameters.built_vocab``: Megatron-LM's padded). The loss runs on the logits a rank holds:
    a ``shards``-th of them (``activations.logit_shards``; None: tp), whole where the engine gathers the
    head's output (DeepSpeed's AutoTP). Its GEMMs run on the ``weight_shards``-th of the vocabulary the
    rank's head weight holds (``parameters.head_shards``; None: tp): a tp-th where the head is column-
    parallel, even where its output is gathered; all of it where AutoTP leaves a tied head whole.
    Cached: it depends on no cluster size."""
    high_precision = high_precision_precision(training)
    heads = 1 + model.mtp_layers
    vocab = built_vocab(model, tp, training.engine)
    time = heads * (3 * gemm_time(rank_head_gemm(model, training, tp, tokens, weight_shards), gpu, high_precision)
                    + cross_entropy_time(tokens * vocab / (shards or tp), training, gpu))
    if model.mtp_layers:
        time += model.mtp_layers * 3 * gemm_time(mtp_projection_gemm(model, tokens, tp), gpu, high_precision)
    return time


def rank_head_gemm(model: ModelSpec, training: TrainingSpec, tp: int, tokens: float,
                   weight_shards: Optional[int] = None) -> Gemm:
    """The GEMM one rank's LM head runs on ``tokens`` tokens (forward; each backward GEMM is its size):
    h → the ``weight_shards``-th (None: tp) of the vocabulary the engine builds at ``tp``
    (``parameters.built_vocab``) that the rank's head weight holds (``parameters.head_shards``)."""
    return head_gemm(model, tokens, tp if weight_shards is None else weight_shards, built_vocab(model, tp, training.engine))


def job_head_gemm(job: Job) -> Gemm:
    """The GEMM the last stage's LM head runs per micro-batch (:func:`rank_head_gemm`)."""
    lay = job.layout
    return rank_head_gemm(job.model, job.training, lay.tp, lay.micro_batch_size * job.training.seq_len / lay.cp,
                          job_head_shards(job))


def job_head_time(job: Job) -> float:
    """The last stage's LM head and loss per micro-batch (:func:`head_time`), on the logits a rank
    holds (``activations.logit_shards``) and the vocabulary rows its head weight holds
    (``memory.job_head_shards``), as :func:`job_head_gemm` builds its GEMM."""
    lay, training = job.layout, job.training
    return head_time(job.model, training, job.cluster.gpu, lay.tp, lay.micro_batch_size * training.seq_len / lay.cp,
                     logit_shards(lay, training.engine), job_head_shards(job))


def gathered_logit_bytes(model: ModelSpec, training: TrainingSpec, tp: int, tokens: float) -> float:
    """The buffer one LM head's logits are all-gathered into on ``tokens`` tokens where the engine
    gathers them (:func:`logit_gather_time`): DeepSpeed 0.19.8's ``LinearLayer(gather_output=True)``
    hands its output, in the head's dtype (the model's: bf16 under bf16, fp32 under fp32), to
    ``GatherFromTensorParallelRegion.forward`` (``module_inject/layers.py``), which pads each rank's
    shard of the vocabulary to the widest and runs one ``all_gather_into_tensor`` into tp of them. The
    shards are the ``get_shard_size_list`` split of the vocabulary the engine builds
    (``parameters.built_vocab``; ``module_inject/tp_shard.py``, ``get_shard_size`` at the default
    ``tp_grain_size`` 1: V // tp, one more on the first V mod tp ranks), so the widest is ⌈V/tp⌉."""
    widest = -(-built_vocab(model, tp, training.engine) // tp)
    return activation_bytes(training.precision) * tokens * tp * widest


def logit_gather_time(job: Job) -> float:
    """The last stage's all-gather of the LM head's logits and all-reduce of its input's gradient, per
    micro-batch, where the engine gathers them (``activations.logit_shards`` below tp: DeepSpeed's AutoTP without a pipeline,
    ``EngineBehaviour.gathers_logits_without_pipeline``). ``LinearLayer.forward`` (DeepSpeed 0.19.8,
    ``module_inject/layers.py``) runs ``GatherFromTensorParallelRegion`` on the head's output: one
    all-gather over the tensor-parallel group of :func:`gathered_logit_bytes`, which the loss waits
    for, so nothing hides it; its ``backward`` only narrows the gradient to the rank's shard (no
    collective). Once per head (each multi-token prediction module runs the head again, as
    :func:`head_time` prices), issued from eager Python (``EngineBehaviour.collective_launch_s``); the
    head is outside the checkpointed layers, so recomputation does not repeat it. A head tied to the
    input embedding is left replicated by AutoTP (``module_inject/auto_tp.py``,
    ``_configure_gathered_column_tie_fallbacks``; ``memory.job_head_shards`` 1): it gathers nothing.
    The split head is a column-parallel ``LinearLayer`` like the layers' (``tp_time.
    column_linear_input_widths``): its input runs through ``ColumnParallel``, whose backward all-reduces
    the input's gradient, b·(s/cp)·h elements, over the same group, once per head and micro-batch."""
    model, lay, training = job.model, job.layout, job.training
    if logit_shards(lay, training.engine) == lay.tp or job_head_shards(job) == 1:
        return 0.0
    tokens = lay.micro_batch_size * training.seq_len / lay.cp
    size = gathered_logit_bytes(model, training, lay.tp, tokens)
    links, perf = group_links(job.cluster, lay, "tp"), job.cluster.gpu.performance
    gather = collective_time("all_gather", size, links, perf)
    reduce = collective_time("all_reduce", activation_bytes(training.precision) * tokens * model.hidden_size, links, perf)
    return (1 + model.mtp_layers) * (gather + reduce + 2 * training.engine.collective_launch_s)


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


def gradient_accumulation_time(job: Job, stage: int) -> float:
    """One micro-batch's fold of its 16-bit gradients into the fp32 gradients
    (:func:`folds_gradients_into_fp32`), or into a flat 16-bit accumulator
    (``EngineBehaviour.flat_gradient_accumulator``), over every parameter of the stage's ranks.
    DeepSpeed's BF16_Optimizer does so after every backward (``runtime/pipe/engine.py``
    ``_exec_backward_pass``: ``clear_lp_grads``, ``update_hp_grads``)."""
    if folds_gradients_into_fp32(job):
        per_param = job.training.engine.fp32_accumulation_bytes
    elif folds_gradients_into_flat_buffer(job):
        per_param = FLAT_ACCUMULATION_BYTES
    else:
        return 0.0
    return in_place_time(job_stage_parameters(job, stage).total * per_param, job.cluster.gpu)


# The fold into a 16-bit flat accumulator (``EngineBehaviour.flat_gradient_accumulator``): DeepSpeed's
# BF16_Optimizer ``update_hp_grads`` adds each bf16 gradient into its bf16 buffer (read 2 + 2, write 2;
# the cast to the buffer's dtype is none) and ``clear_lp_grads`` zeroes autograd's (2).
FLAT_ACCUMULATION_BYTES = 8.0


def unpaired_pass_share(job: Job, stage: int) -> float:
    """The share of pipeline rank ``stage``'s forward passes (and as many backward passes) that
    megatron-core's combined 1F1B schedule runs alone, so that their expert-parallel dispatch and
    combine overlap nothing (``--overlap-moe-expert-parallel-comm``). Without a pipeline, the first
    micro-batch's forward and the last one's backward (``combined_1f1b.py``,
    combined_1f1b_schedule_for_no_pipelining: "executed alone"); with the interleaved schedule, its
    warm-up forwards and cool-down backwards, 2(p − r − 1) + (v − 1)·p + 1 of its m·v chunk passes
    (``schedules.py``, get_pp_rank_microbatches: the microbatch group per virtual stage is p, and
    one extra forward with the overlap): all of them where m·v is no more."""
    lay = job.layout
    passes = job.num_microbatches * lay.vpp
    warmup = interleaved_warmup(lay.pp, lay.vpp, job.num_microbatches, stage) + 1 if lay.pp > 1 else 1
    return min(warmup, passes) / passes


def stage_time(job: Job, stage: int) -> StageTime:
    """Forward + backward of one micro-batch through stage ``stage``, with its exposed TP, CP and
    EP traffic. Kept on the job (a Job never changes): the search's floor prices a layout's
    heaviest stages and then its pipeline, which prices them again (a third of the calls in
    `size`'s searches)."""
    return kept_by_stage(job, "_stage_times", stage, _stage_time)


def _stage_time(job: Job, stage: int) -> StageTime:
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
    # The tail the recipe keeps high is counted among the dense layers (no MoE model keeps one).
    high = min(high, layers - moe_layers)
    compute = (layers - high - moe_layers) * low.total + high * kept.total + moe_layers * moe.total
    if last:
        compute += job_head_time(job)
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
    tp_fwd, tp_bwd = tp_exposed_per_layer(model, training, cluster, lay.tp, lay.cp, lay.micro_batch_size,
                                          lay.sequence_parallel)
    tp_layers = layers - moe_layers + moe_layer_tp_share(model) * moe_layers
    # Passes that run the layers' TP collectives: forward, backward, and the forwards recomputed;
    # a recomputed dense MLP, or shared experts, repeat the forward's second half.
    repeated = recomputed * tp_layers / max(layers, 1)
    if "mlp" in modules:
        repeated += (layers - moe_layers) / 2
    if moe_layers and model.moe_shared_expert_ffn_hidden_size and {"moe", "shared_experts"} & set(modules):
        repeated += moe_layers / 2
    backward_collectives = tp_collectives_per_pass(lay.sequence_parallel) * tp_layers
    if training.engine.reduces_each_column_linear_input and lay.pp == 1 and lay.tp > 1:
        # DeepSpeed's AutoTP: one all-reduce per column-parallel linear in backward, not two a layer.
        group = (model, training, cluster, lay.tp, lay.cp, lay.micro_batch_size)
        dense = layers - moe_layers
        tp_bwd_all = dense * column_linear_backward_time(*group) + moe_layers * column_linear_backward_time(*group, True)
        backward_collectives = dense * len(column_linear_input_widths(model)) \
            + moe_layers * len(column_linear_input_widths(model, True))
    else:
        tp_bwd_all = tp_layers * tp_bwd
    tp_comm = tp_layers * tp_fwd + tp_bwd_all + repeated * tp_fwd
    if last:
        tp_comm += logit_gather_time(job)  # the loss waits for it: exposed, and not recomputed

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
            # cover shows (:func:`collectives.exposed`). Passes the schedule runs alone hide nothing.
            unpaired = unpaired_pass_share(job, stage)
            ep_comm = unpaired * ep_comm + (1 - unpaired) * exposed(ep_comm, compute + recompute, perf)

    # A recomputed attention forward runs its K/V exchange again, as exposed as the first: the whole
    # layer under full recomputation (megatron-core's CheckpointFunction, torch's checkpoint re-run the
    # forward in backward), the core attention under Megatron's selective ``core_attn``
    # (``Attention._checkpointed_attention_forward`` checkpoints ``core_attention``, Transformer
    # Engine's DotProductAttention, which runs the cp exchange inside it).
    cp_fwd, cp_bwd = cp_exposed_passes(model, training, cluster, lay.tp, lay.cp, lay.micro_batch_size, low.core)
    cp_recomputed = recomputed + (layers if "core_attn" in modules and training.engine.selective == "attention" else 0)
    cp_comm = layers * (cp_fwd + cp_bwd) + cp_recomputed * cp_fwd
    # A stage whose pipeline neighbours, or tensor-parallel peers, are across the fabric may not run
    # faster than its collectives' floor (the larger of the two): what it adds shows as tensor-parallel time.
    collectives = tp_collectives_per_pass(lay.sequence_parallel) * (tp_layers + repeated) + backward_collectives
    floor = max(cross_domain_pipeline_floor(job, collectives), cross_domain_tp_floor(job, collectives))
    tp_comm += max(0.0, floor - (compute + recompute + tp_comm + cp_comm + ep_comm))
    return StageTime(compute=compute, recompute=recompute, tp_comm=tp_comm, cp_comm=cp_comm, ep_comm=ep_comm)
