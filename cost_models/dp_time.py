"""Data-parallel traffic per step: the gradient reduction and ZeRO's gathers, what the last
micro-batch's backward cannot hide of them (Li et al. 2020, PyTorch DDP, §3.2.3; Megatron's
``overlap_grad_reduce``; FSDP's prefetch), and the tied embedding's reduction."""

from __future__ import annotations

import math
from typing import Optional

from .collectives import collective_time, exposed, p2p_time
from .kernels import elementwise_time, first_touch_time
from .memory import accumulates_unsharded, job_embedding_shards, job_stage_parameters, job_vocab
from .model_spec import ModelSpec
from .parameters import attention_matrices, embedding_parameters, mlp_matrices, norm_parameters, router_parameters
from .model_states import (folds_gradients_into_fp32, fp32_gradients, gathered_weight_bytes, reduced_gradient_bytes,
                           working_bytes, zero_shards)
from .job import Job
from .topology import group_links
from .pipeline_time import stage_kinds
from .stage_time import StageTime


def dp_comm_exposed(job: Job, stage: int, slowest: StageTime) -> float:
    """Data-parallel traffic of one step that compute does not hide, for the stage's ranks.

    - ZeRO 0: gradient all-reduce, bucketed and overlapped with the last micro-batch's backward.
    - ZeRO 1/2: gradient reduce-scatter (overlapped likewise; an all-reduce of each bucket where the
      engine reduces so, ``EngineBehaviour.zero12_bucket_all_reduce``: DeepSpeed) and the parameter all-gather
      after the optimizer step (behind the next forward where the engine prefetches it; one per
      bucket, or per optimizer parameter group where the engine gathers so: :func:`after_step_gather`).
      ZeRO-2 keeps only its gradient shard, so it reduce-scatters every micro-batch's
      gradients as they are produced, not once per step: DeepSpeed's stage 2 reduces in each
      backward's hooks (``zero/stage_1_and_2.py``, ``partition_gradients``) where stage 1
      waits for the accumulation boundary; FSDP's SHARD_GRAD_OP and Megatron-FSDP's
      ``optim_grads`` likewise.
    - The generic engine's ZeRO-1 with fp32 gradients (nanotron's, without DDP): one all-reduce of
      the whole fp32 buffer after the last backward, in the open, and the gather's copies
      (:func:`gather_copies_time`).
    - ZeRO 3: parameter all-gathers in forward and in backward (the recompute's shared with the
      backward's) and a gradient reduce-scatter, for every micro-batch,
      prefetched behind that micro-batch's compute; what a pass's compute cannot cover is
      exposed, so more compute never shortens the step. Where the engine copies units through
      flat buffers (``EngineBehaviour.zero3_unit_copies``), each collective carries its copies.
    Every stage prices its collectives alike (:func:`pipelined`): the first gather or last
    bucket of a pass waits in the open, each collective pays its latency, and overlapped
    traffic still costs what ``Performance.comm_overlap`` leaves.
    - DeepSpeed's pipeline: the whole gradient all-reduce after the last micro-batch.
    - FSDP at every ZeRO stage (``EngineBehaviour.fsdp_always``, torchtitan 0.3.0): at stage 0, HSDP
      over a shard group of one, the fp32 gradients all-reduced unit by unit after every
      micro-batch's backward (its train step never turns their sync off); under
      torch.distributed.pipelining (:func:`memory.accumulates_unsharded`) once, after the last,
      in the open, and at ZeRO 3 with it, the units gathered by each backward (and by the
      warm-up's forwards, before any backward kept them) and reduce-scattered once.
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
                                                 backward_last, first, tensors, expert=group == "edp")
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
        unit += (0 if model.tied_embeddings else embedding_parameters(model, job_vocab(job)) / lay.tp) \
            + norm_parameters(model)
    return unit


def input_embedding_shard(job: Job, stage: int) -> float:
    """Parameters of the input embedding on ``stage``: V·h/tp (vocab-parallel; whole where the engine
    leaves it so, :func:`memory.job_embedding_shards`) on the first, 0 elsewhere."""
    return embedding_parameters(job.model, job_vocab(job)) / job_embedding_shards(job) if stage == 0 else 0.0


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
                        first_unit: float, tensors: int, expert: bool = False) -> float:
    """The exposed data-parallel traffic of ``params`` parameters in ``tensors`` tensors over
    ``dp_links`` (:func:`dp_comm_exposed`); ``first_unit`` of them form the ZeRO-3 unit that opens
    and closes the passes (:func:`first_unit_parameters`); ``expert``: the experts' parameters, over
    the expert data-parallel group."""
    lay, training = job.layout, job.training
    perf = job.cluster.gpu.performance
    tied = 0.0  # counted once, by dp_comm_exposed
    per_param = working_bytes(training)
    grads = params * reduced_gradient_bytes(training)
    weights = params * gathered_weight_bytes(training)
    # Engines issue one collective per bucket (ZeRO 0–2) or per wrapped layer (ZeRO-3:
    # FSDP units, DeepSpeed's per-module gathers): each pays the collective's latency. A bucket
    # holds what autograd writes, gradients in the parameters' dtype, whatever dtype they are
    # then reduced in (:func:`gradient_chunks`).
    chunks = gradient_chunks(job, params, per_param.weights) if lay.zero_stage < 3 else zero3_units(job, stage)

    def chunked(kind: str, size: float) -> float:
        return chunks * collective_time(kind, size / chunks, dp_links, perf)

    engine = training.engine
    unsharded = accumulates_unsharded(job)
    if lay.zero_stage == 0 and engine.fsdp_always:
        # HSDP over a shard group of one: the replicas all-reduce each unit's fp32 gradients.
        units = zero3_units(job, stage)
        reduce = units * collective_time("all_reduce", grads / units, dp_links, perf)
        if unsharded:
            return tied + reduce
        opening = max(1 / units, min(1.0, first_unit / params))
        return tied + job.num_microbatches * pipelined(reduce, units, backward_last, perf, opening)
    if lay.zero_stage < 3 and (lay.pp > 1 and engine.reduce_after_pipeline or folds_gradients_into_fp32(job)
                               or lay.zero_stage == 0 and engine.zero0_reduce_after_backward):
        # DeepSpeed's pipeline all-reduces gradients (its BF16 optimizer's fallback) once the
        # schedule has drained, and so does its BF16_Optimizer without a pipeline, once the last
        # backward is done (``engine.allreduce_gradients`` → ``buffered_allreduce_fallback``: it has no
        # reduce_gradients of its own), as its engine does at stage 0 in fp16 or fp32; ZeRO-1 then
        # gathers the updated weight shards (``BF16_Optimizer.update_lp_params`` → ``all_gather_dp_groups``:
        # one all-gather per parameter group, :func:`after_step_gather`).
        return tied + chunked("all_reduce", grads) \
            + (after_step_gather(job, weights, dp_links, chunks, params, tensors, expert) if lay.zero_stage else 0.0)
    forward = slowest.compute / 3
    if lay.zero_stage < 3:
        # Buckets reduce as the last micro-batch's backward produces them; the last bucket waits,
        # and on the first stage it holds the input embedding's gradients (the last produced).
        # DeepSpeed all-reduces its ZeRO-1/2 buckets whole (EngineBehaviour.zero12_bucket_all_reduce).
        kind = "all_reduce" if lay.zero_stage == 0 or engine.zero12_bucket_all_reduce else "reduce_scatter"
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
        gather = after_step_gather(job, weights, dp_links, chunks, params, tensors, expert)
        return tied + reduce + (pipelined(gather, chunks, forward, perf, last) if engine.overlap_param_gather
                                else gather)
    # ZeRO-3 keeps only gradient shards, so every micro-batch gathers the weights again and
    # reduce-scatters its gradients, unit by unit, each behind the compute of the unit before:
    # the first gather of each pass waits, and what the pass's compute cannot cover.
    gather, reduce = zero3_collectives(job, stage, params, dp_links)
    # One gather serves a recomputed unit's forward and its backward: FSDP recomputes inside the
    # unit its backward pre-hook gathered; DeepSpeed keeps a module gathered only where it is used
    # again within max_reuse_distance, and gathers the rest again (regathered_parameters).
    backward_gathers = 1 + regathered_parameters(job, stage, expert) / params
    # The pass waits in the open for its first unit (the embedding's, where it is larger than a
    # layer's), and the backward for the same unit's reduce-scatter at its end.
    opening = max(1 / chunks, min(1.0, first_unit / params))
    if unsharded:
        # Each backward gathers its units again (the forward resharded them) and keeps them, so only
        # the warm-up's forwards gather; the gradients are reduce-scattered once, after the last.
        warmup = min(lay.pp - stage, job.num_microbatches)
        return tied + warmup * pipelined(gather, chunks, forward, perf, opening) \
            + job.num_microbatches * pipelined(backward_gathers * gather, chunks, backward_last, perf, opening) \
            + reduce
    per_microbatch = pipelined(gather, chunks, forward, perf, opening) \
        + pipelined(backward_gathers * gather + reduce, chunks, backward_last, perf, opening)
    return tied + job.num_microbatches * per_microbatch


def layer_submodules(model: ModelSpec, moe: bool, tp: int, ep: int, etp: int) -> tuple[tuple[float, bool], ...]:
    """A layer's weight-holding submodules in the order its forward runs them, each as (one rank's
    parameters, whether an expert's): standard attention's W_Q, W_K, W_V, then W_O (MLA's projections as
    one), split over tp; then an MoE layer's router (whole), its rank's routed experts (each one's
    matrices, split over etp) and its shared expert, or the dense MLP's matrices (gate, up, down; GeLU's
    up and down). Norms are left out: ZeRO-3 keeps parameters under its persistence threshold (1e5 by
    default, 10·h as the emitter writes it) whole on every rank (``zero/parameter_offload.py``)."""
    h = model.hidden_size
    if model.attention_type == "mla":
        split, whole = attention_matrices(model)
        modules: list[tuple[float, bool]] = [(split / tp + whole, False)]
    else:
        modules = [(h * model.q_size / tp, False), (h * model.kv_size / tp, False), (h * model.v_size / tp, False),
                   (model.context_size * h / tp, False)]
    matrices = mlp_matrices(model)
    if not moe:
        return tuple(modules + [(h * model.ffn_hidden_size / tp, False)] * matrices)
    modules.append((float(router_parameters(model)), False))
    modules += [(h * model.moe_ffn_hidden_size / etp, True)] * (matrices * (model.num_experts // ep))
    if model.moe_shared_expert_ffn_hidden_size:
        modules += [(h * model.moe_shared_expert_ffn_hidden_size / tp, False)] * matrices
    return tuple(modules)


def regathered_parameters(job: Job, stage: int, expert: bool = False) -> float:
    """Parameters (the experts', with ``expert``, else the rest) one rank of the stage gathers a second
    time in each micro-batch's backward under full recomputation, where the engine releases gathered
    weights by their reuse distance (``EngineBehaviour.zero3_max_reuse_distance``: DeepSpeed's ZeRO-3).

    After a submodule runs, DeepSpeed releases its weights unless they appear again among the submodules
    its trace runs next, counted until those hold the distance (``zero/partitioned_param_coordinator.py``,
    ``__params_to_release``: from the next step on, stopping once ``max_reuse_dist_in_numel`` elements are
    traversed). A recomputed layer's recompute forward and its backward run back to back, the backward in
    reverse order: between a submodule's recompute and its backward lie the F parameters of the
    submodules after it, twice; it is gathered again where 2·F reaches the distance (at a distance of 0,
    every submodule). Its first forward is released either way (its next use, the recompute, is the rest
    of the pass away), as without recomputation; at DeepSpeed's default 1e9 only layers above 5e8
    parameters regather any (Llama-3 70B its attention's 151 M of 856 M)."""
    lay, model = job.layout, job.model
    distance = job.training.engine.zero3_max_reuse_distance
    layers = job.stage_layers[stage]
    if distance is None or lay.recompute != "full" or not layers:
        return 0.0
    recomputed = layers if lay.recompute_num_layers is None else min(lay.recompute_num_layers, layers)
    moe_layers = job.stage_moe_layers[stage] if model.is_moe else 0
    again = 0.0
    for moe, count in ((True, moe_layers), (False, layers - moe_layers)):
        modules = layer_submodules(model, moe, lay.tp, lay.ep, lay.expert_tp) if count else ()
        after = sum(size for size, _ in modules)
        for size, of_expert in modules:
            after -= size
            if 2 * after >= distance and of_expert == expert:
                again += count * size
    return again * recomputed / layers


def after_step_gather(job: Job, weights: float, dp_links, buckets: int, params: float, tensors: int,
                      expert: bool = False) -> float:
    """Seconds of the all-gathers of the updated ZeRO-1/2 weights (``weights`` bytes, of ``params``
    parameters in ``tensors`` tensors) after the optimizer step: one per gradient bucket
    (``buckets``, :func:`gradient_chunks`), or where the engine gathers per optimizer parameter group
    (``EngineBehaviour.zero_gather_param_groups``), one per group, whatever the bucket sizes.

    DeepSpeed's ZeRO-1/2 optimizer (``runtime/zero/stage_1_and_2.py``: ``step``, ``update_lp_params``)
    and its BF16_Optimizer (``runtime/bf16_optimizer.py``: ``update_lp_params``) gather with
    ``all_gather_dp_groups`` (``runtime/utils.py``, lines 1008-1022 in 0.19.8): where torch has
    ``all_gather_into_tensor`` (every torch since 1.13, on NCCL) it calls
    ``all_gather_into_tensor_dp_groups``, one ``all_gather_into_tensor`` of each parameter group's
    flat 16-bit buffer (``bit16_groups_flat``, ``bf16_groups_flat``: one per ``optimizer.param_groups``
    entry), and never reads ``allgather_bucket_size``. The experts' groups hold whole tensors up to
    ``EngineBehaviour.zero_gather_expert_group_params`` elements each (``moe/utils.py``,
    ``split_params_into_different_moe_groups_for_optimizer``), packed in order: ``tensors`` of
    ``params / tensors`` elements each here."""
    gathers = after_step_gathers(job.training.engine, buckets, params, tensors, expert)
    return gathers * collective_time("all_gather", weights / gathers, dp_links, job.cluster.gpu.performance)


def after_step_gathers(engine, buckets: int, params: float, tensors: int, expert: bool = False) -> int:
    """How many all-gathers :func:`after_step_gather` prices: the buckets, or one per parameter group,
    the experts' tensors (``params / tensors`` elements each) packed whole into groups of at most
    ``zero_gather_expert_group_params`` elements."""
    if not engine.zero_gather_param_groups:
        return buckets
    if expert and engine.zero_gather_expert_group_params:
        per_group = max(1, math.floor(engine.zero_gather_expert_group_params / (params / max(tensors, 1))))
        return math.ceil(max(tensors, 1) / per_group)
    return engine.zero_gather_param_groups


def zero3_units(job: Job, stage: int) -> int:
    """The ZeRO-3 collectives of one pass over the stage: one per wrapped unit,
    ``EngineBehaviour.zero3_collectives_per_layer`` per layer (FSDP units, DeepSpeed's per-module gathers)."""
    return max(1, job.stage_layers[stage]) * job.training.engine.zero3_collectives_per_layer


def zero3_collectives(job: Job, stage: int, params: float, dp_links) -> tuple[float, float]:
    """One ZeRO-3 micro-batch's parameter all-gather and gradient reduce-scatter of ``params`` over
    ``dp_links`` (:func:`dp_comm_exposed`): one collective per wrapped unit (:func:`zero3_units`),
    each paying its latency, and where the engine copies units through flat buffers
    (``EngineBehaviour.zero3_unit_copies``) those copies."""
    training, gpu = job.training, job.cluster.gpu
    perf = gpu.performance
    grads = params * reduced_gradient_bytes(training)
    weights = params * gathered_weight_bytes(training)
    chunks = zero3_units(job, stage)
    gather = chunks * collective_time("all_gather", weights / chunks, dp_links, perf)
    reduce = chunks * collective_time("reduce_scatter", grads / chunks, dp_links, perf)
    if training.engine.zero3_unit_copies:
        # Each copy reads and writes the unit (or its shard, 1/n of it) beside the collective,
        # at the element-wise kernels' bandwidth.
        gather += elementwise_time(2 * weights * (1 + 1 / dp_links.size), gpu)
        reduce += elementwise_time(2 * grads * (1 + 1 / dp_links.size), gpu)
        # The buffers are allocated per collective and freed after: a gather writes the unit twice
        # afresh, its all-gather output and the unsharded parameters (FSDP2's ``foreach_all_gather``,
        # ``FSDPParam.alloc_all_gather_outputs``), a reduction once, its reduce-scatter input, and
        # its shard (``foreach_reduce``).
        gather += first_touch_time(2 * weights, gpu)
        reduce += first_touch_time(grads * (1 + 1 / dp_links.size), gpu)
    return gather, reduce


def zero3_exposed_floor(job: Job) -> float:
    """The least data-parallel time a ZeRO-3 step leaves exposed per micro-batch, whatever the
    compute beside it: each pass's traffic shows at least (1 − ov) of itself
    (:func:`pipelined`, ``collectives.exposed``), so the forward's gathers and the backward's
    gathers and reduce-scatters (:func:`zero3_collectives`) show (1 − ov)·(2·gather + reduce) at
    least, on the stage that moves the most (``dp_comm_s`` is the most of the stages'). Where the
    stages accumulate unsharded (:func:`memory.accumulates_unsharded`), the backward's gathers alone
    come once a micro-batch: (1 − ov)·gather."""
    lay, cluster = job.layout, job.cluster
    if lay.zero_stage != 3:
        return 0.0
    share = max(0.0, 1.0 - cluster.gpu.performance.comm_overlap)
    unsharded = accumulates_unsharded(job)
    least = 0.0
    for stage in stage_kinds(job):  # stages of a kind move the same traffic
        params = job_stage_parameters(job, stage)
        total = 0.0
        for count, group, shards in ((params.dense, "dp_cp", zero_shards(job)), (params.expert, "edp", lay.edp)):
            if count and shards > 1:
                gather, reduce = zero3_collectives(job, stage, count, group_links(cluster, lay, group))
                total += share * (gather if unsharded else 2 * gather + reduce)
        least = max(least, total)
    return least


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
    per_bucket = max(engine.bucket_params, engine.bucket_bytes / bucketed_bytes,
                     engine.bucket_params_per_dp_rank * job.layout.dp * job.layout.cp)
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
    size = embedding_parameters(model, job_vocab(job)) / lay.tp * working_bytes(job.training).gradients
    links = group_links(job.cluster, lay, "pp")
    return p2p_time(size, links.domains > 1, links, job.cluster.gpu.performance)
