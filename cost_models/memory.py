"""Per-GPU memory of every pipeline stage, by term; the heaviest stage is the verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Optional

from .activations import (chunked_loss, embedding_activation_bytes, head_activation_bytes, layer_activation_bytes,
                          layer_activations, loss_gradient_bytes, mtp_projection_activation_bytes)
from .experts import alltoall_buffer_bytes
from .hardware import GPUSpec
from .flops import layer_gemms
from .model_states import (FP32_BYTES, StateBytes, bucket_copy_bytes, folds_gradients_into_flat_buffer,
                           folds_gradients_into_fp32, fp32_gradients,
                           gathered_weight_bytes, keeps_weights_quantized, quantizes_weights_once_a_step,
                           sharded_state_bytes, state_bytes, steps_master_in_kernel, working_bytes, zero_shards)
from .offload import accumulates_on_host, gradients_on_host, host_gradient_bytes, offloaded_activation_layers
from .parameters import (StageParameters, attention_parameters, built_vocab, embedding_parameters, embedding_shards,
                         expert_parameters, head_shards, largest_parameter, mlp_parameters, router_parameters, shared_expert_parameters,
                         stage_dense_linear_parameters, stage_linear_parameters, stage_parameters, total_parameters)
from .quantization import cached_weight_bytes
from .pipeline import first_chunk_in_flight, in_flight_chunks, in_flight_peak
from .job import Job, kept_by_stage
from .layout_spec import Layout, without_activations
from .model_spec import ModelSpec
from .training_spec import Overheads, TrainingSpec

TERMS = ("parameters", "gradients", "optimizer_states", "activations", "other")


@dataclass(frozen=True)
class StageMemory:
    stage: int
    parameters: float
    gradients: float
    optimizer_states: float
    activations: float
    other: float
    # The part of ``other`` that the caching allocator holds beyond its live tensors: blocks cached
    # for the activations' sizes (``Overheads.fragmentation``), less what the step's copies reuse of them.
    fragmentation: float = 0.0

    @property
    def total(self) -> float:
        """What the caching allocator holds at the stage's peak: ``torch.cuda.max_memory_reserved``."""
        return self.parameters + self.gradients + self.optimizer_states + self.activations + self.other

    @property
    def allocated(self) -> float:
        """What the stage's live tensors take at its peak: ``torch.cuda.max_memory_allocated``.
        PyTorch's CUDA semantics notes (docs/stable/notes/cuda.html, "Memory management") say the
        caching allocator keeps freed blocks for reuse: ``memory_allocated`` counts the tensors,
        ``memory_reserved`` all it holds, the cached blocks as well. The gap is the fragmentation
        term, so a peak measured as allocated is held to this, not to :attr:`total` (a fit on
        allocated peaks against the reserved figure read the gap as 0)."""
        return self.total - self.fragmentation

    def by_term(self) -> dict[str, float]:
        return {term: getattr(self, term) for term in TERMS}


def expert_zero_shards(job: Job) -> int:
    """Ranks that hold the same experts and so share their ZeRO shards: the expert data-parallel
    group (megatron-core's distributed optimizer over ``expert_data_parallel``; torchtitan's
    ``efsdp`` mesh)."""
    return job.layout.edp


def job_vocab(job: Job) -> int:
    """The vocabulary the job's engine builds its embedding, LM head and logits for (:func:`built_vocab`)."""
    return built_vocab(job.model, job.layout.tp, job.training.engine)


def job_embedding_shards(job: Job) -> int:
    """The tensor-parallel ranks the job's input embedding is split over (:func:`embedding_shards`)."""
    return embedding_shards(job.layout.tp, job.layout.pp, job.training.engine)


def job_head_shards(job: Job) -> int:
    """The tensor-parallel ranks the job's LM head is split over (:func:`head_shards`)."""
    return head_shards(job.model, job.layout.tp, job.layout.pp, job.training.engine)


def job_stage_parameters(job: Job, stage: int) -> StageParameters:
    """Parameters one GPU of pipeline stage ``stage`` holds before ZeRO sharding. Kept on the job, as
    ``stage_time.stage_time`` keeps its stage times: a Job never changes, and the model states, the
    step's copies, the offload and the gradient accumulation each ask for them (8,895 times a
    three-engine Mixtral 8x7B plan, for 2,900 jobs' stages)."""
    return kept_by_stage(job, "_stage_parameters", stage, _job_stage_parameters)


def _job_stage_parameters(job: Job, stage: int) -> StageParameters:
    lay = job.layout
    if not job.model.is_moe:
        return stage_parameters(job.model, job.stage_layers[stage], stage == 0, stage == lay.pp - 1, lay.tp,
                                vocab=job_vocab(job), embedding_tp=job_embedding_shards(job))
    return stage_parameters(job.model, job.stage_layers[stage], stage == 0, stage == lay.pp - 1, lay.tp,
                            job.stage_moe_layers[stage], lay.ep, lay.expert_tp, job_vocab(job), job_embedding_shards(job))


def job_largest_parameter(job: Job, stage: int) -> float:
    """Elements of the largest parameter tensor a GPU of pipeline stage ``stage`` holds (:func:`largest_parameter`)."""
    lay = job.layout
    return largest_parameter(job.model, stage == 0, stage == lay.pp - 1, lay.tp, job_vocab(job),
                             job_embedding_shards(job))


def optimizer_local_parameters(job: Job, stage: int) -> float:
    """Parameters whose optimizer states one rank of the stage holds: the dense ones over the
    ZeRO shards (dp·cp), the experts' over the expert data-parallel ranks."""
    lay = job.layout
    params = job_stage_parameters(job, stage)
    if lay.zero_stage == 0:
        return params.total
    return params.dense / zero_shards(job) + params.expert / lay.edp


@dataclass(frozen=True)
class PerMicrobatch:
    """Activation bytes per micro-batch that every stage of a job shares."""

    kept: float  # one layer that is not recomputed
    kept_moe: float  # one MoE layer that is not recomputed
    kept_high: float  # one dense layer that is not recomputed, its linears kept in bf16 by the recipe
    checkpointed: float  # one layer under full recomputation: its input only
    embedding: float  # first stage
    head: float  # last stage: saved for backward
    loss_gradients: float  # last stage: the loss's gradients, alive at its peak
    # Under selective recomputation by module: what one layer's recomputed modules hold again
    # while that layer runs its backward, a dense layer's and an MoE layer's (a stage takes the
    # most of the kinds it holds).
    restored: float = 0.0
    restored_moe: float = 0.0
    mtp_projection: float = 0.0  # last stage: one multi-token prediction module beside its layer


def per_microbatch(job: Job) -> PerMicrobatch:
    lay = job.layout
    return _per_microbatch(job.model, job.training, lay.tp, lay.cp, lay.micro_batch_size, lay.sequence_parallel,
                           lay.recompute, lay.expert_tp, lay.recompute_modules, lay.ep > 1)


@lru_cache(maxsize=4096)
def _per_microbatch(model: ModelSpec, training: TrainingSpec, tp: int, cp: int, micro_batch_size: int,
                    sequence_parallel: bool, recompute: str, etp: int = 1,
                    recompute_modules: Optional[tuple[str, ...]] = None, exchanges: bool = False) -> PerMicrobatch:
    # Only these layout fields shape a micro-batch's activations: cache on them, since a
    # search scores many layouts that share them (``exchanges``: expert parallelism's all-to-all,
    # whose outputs op-level selective checkpointing keeps).
    lay = Layout(tp=tp, cp=cp, micro_batch_size=micro_batch_size, sequence_parallel=sequence_parallel,
                 recompute=recompute, etp=etp, recompute_modules=recompute_modules)
    selective = training.engine.selective
    kept = layer_activation_bytes(model, training, lay, recomputed=False, selective=selective)
    kept_moe = layer_activation_bytes(model, training, lay, recomputed=False, selective=selective, moe=True,
                                      exchanges=exchanges) if model.is_moe else 0.0
    restored = restored_moe = 0.0
    if recompute == "selective" and selective == "attention":
        restored = layer_activations(model, training, lay).total - kept
        if model.is_moe:
            restored_moe = layer_activations(model, training, lay, moe=True).total - kept_moe
    return PerMicrobatch(
        kept=kept,
        kept_moe=kept_moe,
        kept_high=layer_activation_bytes(model, training, lay, recomputed=False, selective=selective,
                                         quantized=False),
        checkpointed=layer_activation_bytes(model, training, lay, recomputed=True, selective=selective),
        embedding=embedding_activation_bytes(model, training, lay),
        head=head_activation_bytes(model, training, lay),
        loss_gradients=loss_gradient_bytes(model, lay, training),
        restored=restored,
        restored_moe=restored_moe,
        mtp_projection=mtp_projection_activation_bytes(model, training, lay) if model.mtp_layers else 0.0,
    )


def stage_activation_bytes(job: Job, stage: int, shared: Optional[PerMicrobatch] = None,
                           forward_only: bool = False) -> float:
    """Activations stage ``stage`` holds at its peak under the pipeline schedule.

    Layers recomputed with ``full`` keep only their input; with
    ``recompute_num_layers`` = N, the first N layers of the stage are recomputed
    (Megatron's ``--recompute-method block``). While a recomputed layer runs its
    backward, its full activations are live once more: one layer's worth is added; under
    selective recomputation by module, what one layer's modules hold again. ``forward_only``:
    what the forwards leave saved, without what only a backward holds (the recomputed layer,
    the loss's gradients).
    """
    lay = job.layout
    shared = shared or per_microbatch(job)
    layers = job.stage_layers[stage]
    # Unequal chunks (a stage's layers not divisible by vpp, or a layout's own split): each
    # chunk's micro-batches in flight by the schedule (pipeline.in_flight_peak).
    chunk_sizes = job.rank_chunk_layers(stage)
    # Layers whose linears the recipe keeps in bf16 keep bf16 inputs: counted at their share of
    # the stage in every chunk (they are the model's last layers: NVFP4's tail).
    high = job.high_precision_layers[stage] / layers if layers else 0.0
    dense_kept = (1 - high) * shared.kept + high * shared.kept_high
    # A stage of dense and MoE layers keeps their mean per layer (the recomputed ones are any of them).
    moe = job.stage_moe_layers[stage] if job.model.is_moe else 0
    kept = (dense_kept * (layers - moe) + shared.kept_moe * moe) / layers if moe else dense_kept

    offloaded = offloaded_activation_layers(job, stage)  # on the host (cost_models.offload)

    def chunk_bytes(size: int) -> float:
        recomputed = 0.0
        if lay.recompute == "full":
            recomputed = min(size if lay.recompute_num_layers is None else lay.recompute_num_layers / lay.vpp, size)
        return recomputed * shared.checkpointed + max(0.0, size - recomputed - offloaded) * kept

    # A rank's chunks take a few sizes at most: each priced once (vpp runs to a layer a chunk).
    by_size = {n: chunk_bytes(n) for n in set(chunk_sizes)}
    per_chunk = [by_size[n] for n in chunk_sizes]
    total = in_flight_peak(lay.pp, lay.vpp, job.num_microbatches, stage, per_chunk)
    # What the last stage holds when its LM head is live: right after a forward of its last chunk.
    at_head = total if stage < lay.pp - 1 or lay.vpp == 1 else \
        in_flight_peak(lay.pp, lay.vpp, job.num_microbatches, stage, per_chunk, chunk=lay.vpp - 1)
    dense = layers > moe  # the kinds of layer the stage holds: what one of them holds again is its kind's
    again = 0.0  # what a layer's backward holds again: its recomputed activations, or restored modules
    if lay.recompute == "full" and (lay.recompute_num_layers is None or lay.recompute_num_layers > 0):
        working = max(dense_kept if dense else 0.0, shared.kept_moe if moe else 0.0)
        if lay.pp == 1:
            # One micro-batch in flight: the recomputed (first) layers run their backward once every
            # layer kept whole has freed its activations, beside the checkpoints of those before them.
            recomputed = layers if lay.recompute_num_layers is None else min(lay.recompute_num_layers, layers)
            working = max(0.0, recomputed * shared.checkpointed + working - total)
        again += 0.0 if forward_only else working
    again += max(shared.restored if dense else 0.0, shared.restored_moe if moe else 0.0)
    # The layer whose copy to the host is under way, and the first stage's embedding.
    embedded = first_chunk_in_flight(lay.pp, lay.vpp, job.num_microbatches) if stage == 0 else 0
    extra = (kept if offloaded else 0.0) + embedded * shared.embedding
    total += extra
    if stage == lay.pp - 1:
        ends = shared.head + (0.0 if forward_only else shared.loss_gradients)
        if forward_only:
            total += again + ends
        else:
            # The last stage runs each micro-batch's backward right after the forward of its last chunk,
            # the head's first: its logits and the loss's gradients are freed before any layer holds its
            # activations again, so the two are never held at once; and the head is live only right
            # after that forward (with vpp > 1 the rank may peak at another chunk's without it:
            # megatron-core's schedule table, pipeline.in_flight_peak).
            total = max(total + again, at_head + extra + ends)
        total += mtp_activation_bytes(job, shared, dense_kept)
    else:
        total += again
    return total


def mtp_activation_bytes(job: Job, shared: PerMicrobatch, dense_kept: float) -> float:
    """What the multi-token prediction modules keep on the last stage: for one micro-batch (they
    close its last model chunk, whose backward follows the forward), each module's layer (only
    its input where Megatron's uniform full recomputation takes it in), projection inputs and
    second logits (:func:`activations.mtp_projection_activation_bytes`)."""
    model, lay = job.model, job.layout
    if not model.mtp_layers:
        return 0.0
    if lay.recompute == "full" and lay.recompute_num_layers is None:
        layer = shared.checkpointed
    else:
        layer = shared.kept_moe if model.mtp_layers_are_moe else dense_kept
    return model.mtp_layers * (layer + shared.mtp_projection + shared.head)


def zero3_gather_bytes(job: Job) -> float:
    """ZeRO-3 materialises the weights it runs. FSDP gathers whole units: the current layer and
    one prefetched (its forward prefetch); an MoE layer's, with this GPU's experts; Megatron-FSDP
    more prefetched, and the embedding and LM head held gathered through the step
    (``EngineBehaviour.zero3_prefetch_params``, ``zero3_edges_gathered``). DeepSpeed
    gathers submodule by submodule (``EngineBehaviour.zero3_max_live_parameters``): each module's
    own weights in its pre-forward hook whatever is live, prefetching more only up to the
    live-parameter cap (``partitioned_param_coordinator.py``, ``fetch_sub_module``: a prefetch of
    max_live − available), and keeping a module gathered where it is used again within
    max_reuse_distance (``__params_to_release``: the last layers' between the forward and their
    backward, a recomputed layer's for its backward): the cap, overshot by the module fetched,
    the largest of which is the embedding or the LM head, whole; at most the model. An engine
    that runs FSDP at every ZeRO stage
    (``EngineBehaviour.fsdp_always``) gathers its units so at each, over a shard group of one at
    zero_stage 0."""
    if job.layout.zero_stage < 3 and not job.training.engine.fsdp_always:
        return 0.0
    model, lay = job.model, job.layout
    engine = job.training.engine
    if engine.zero3_max_live_parameters is not None:
        largest = max(max(g.n * g.k for g in layer_gemms(model, 1, lay.tp)),
                      embedding_parameters(model, job_vocab(job)) / job_embedding_shards(job))
        live = min(engine.zero3_max_live_parameters + largest, total_parameters(model) / lay.tp)
        return live * gathered_weight_bytes(job.training)
    per_layer = (attention_parameters(model) + mlp_parameters(model)) / lay.tp
    if model.is_moe:
        moe_layer = (attention_parameters(model) + shared_expert_parameters(model)) / lay.tp \
            + router_parameters(model) + model.num_experts // lay.ep * expert_parameters(model) / lay.expert_tp
        per_layer = max(per_layer, moe_layer) if model.num_moe_layers < model.num_layers else moe_layer
    units = 2  # the running unit and one prefetched
    edges = 0.0
    if engine.zero3_prefetch_params is not None:
        units = 1 + math.ceil(max(engine.zero3_prefetch_params, per_layer) / per_layer)
    if engine.zero3_edges_gathered:
        edges = embedding_parameters(model, job_vocab(job)) * (1 if model.tied_embeddings else 2) / lay.tp
    return (units * per_layer + edges) * gathered_weight_bytes(job.training)


def _quantized_dense_linears(job: Job, stage: int) -> float:
    """The stage's dense (not expert) linear weights one GPU holds that the recipe quantizes: those of
    its layers (and, on the last stage, of the prediction modules), less the layers it keeps in bf16."""
    model, lay = job.model, job.layout
    layers = job.stage_layers[stage]
    moe_layers = job.stage_moe_layers[stage] if model.is_moe else 0
    if stage == lay.pp - 1:
        layers += model.mtp_layers
        moe_layers += model.mtp_moe_layers
    if not layers:
        return 0.0
    return stage_dense_linear_parameters(model, layers, lay.tp, moe_layers) \
        * (1 - job.high_precision_layers[stage] / layers)


def quantized_weight_copy_bytes(job: Job, stage: int) -> float:
    """Quantized copies of the stage's linear weights that Transformer Engine keeps beside the held
    weights (:func:`model_states.state_bytes`) for the whole step, and across steps, where the
    engine keeps them (:func:`model_states.quantizes_weights_once_a_step`) and the weights stay
    whole (below ZeRO-3: Megatron-FSDP drops them after each module's forward,
    ``keep_fp8_transpose_cache``):

    - 16-bit weights: the whole quantized copy, in the layouts the GEMMs read
      (:func:`quantization.cached_weight_bytes`);
    - weights kept quantized (``fp8_param_gather``: state_bytes counts their row-wise data): the
      column-wise layout dgrad reads, where it is not the same data.

    Over the stage's linear weights (:func:`parameters.stage_linear_parameters`), less those of
    the layers the recipe keeps in bf16 (NVFP4's tail, at a layer's mean share)."""
    training, lay = job.training, job.layout
    recipe, layers = training.recipe, job.stage_layers[stage]
    if not quantizes_weights_once_a_step(job) or lay.zero_stage >= 3 or not layers:
        return 0.0
    per_weight = cached_weight_bytes(recipe, job.cluster.gpu.any_layout_fp8_gemm)
    if training.fp8_param_gather:
        per_weight -= recipe.quantized_bytes
    model = job.model
    moe_layers = job.stage_moe_layers[stage] if model.is_moe else 0
    if stage == lay.pp - 1:  # the prediction modules' layers run under the recipe too
        layers += model.mtp_layers
        moe_layers += model.mtp_moe_layers
    linear = stage_linear_parameters(model, layers, lay.tp, moe_layers, lay.ep, lay.expert_tp)
    return per_weight * linear * (1 - job.high_precision_layers[stage] / layers)


def per_parameter_states(job: Job) -> tuple[StateBytes, StateBytes]:
    """Bytes one rank holds per dense and per expert parameter: the dense parameters' states
    sharded over dp·cp by the ZeRO stage, the experts' over the expert data-parallel ranks
    (ZeRO paper §5; megatron-core's expert distributed optimizer)."""
    lay = job.layout
    shards, expert_shards = zero_shards(job), expert_zero_shards(job)
    per_param = sharded_state_bytes(state_bytes(job.training, lay.zero_stage, shards), lay.zero_stage, shards)
    per_expert_param = sharded_state_bytes(state_bytes(job.training, lay.zero_stage, expert_shards), lay.zero_stage,
                                           expert_shards) if job.model.is_moe else per_param
    return per_param, per_expert_param


def stage_state_bytes(job: Job, stage: int, per_parameter: Optional[tuple[StateBytes, StateBytes]] = None) \
        -> StateBytes:
    """Model-state bytes one rank of the stage holds, wherever they live (GPU or host)
    (:func:`per_parameter_states`; a caller scoring every stage passes them in)."""
    per_param, per_expert_param = per_parameter or per_parameter_states(job)
    params = job_stage_parameters(job, stage)
    weights = params.dense * per_param.weights + params.expert * per_expert_param.weights
    if keeps_weights_quantized(job.training) and per_param.weights:
        # Held quantized, only the linears' weights take the recipe's bytes (state_bytes): the rest
        # of the dense parameters, and the linears of the layers the recipe keeps in bf16, take 16 bits.
        unquantized = params.dense - _quantized_dense_linears(job, stage)
        weights += unquantized * per_param.weights * (2 / job.training.recipe.quantized_bytes - 1)
    return StateBytes(weights=weights,
                      gradients=params.dense * per_param.gradients + params.expert * per_expert_param.gradients,
                      optimizer=params.dense * per_param.optimizer + params.expert * per_expert_param.optimizer)


def on_gpu_shares(job: Job) -> StateBytes:
    """The share of each model-state term that stays on the GPU; the rest is offloaded to the host
    (cost_models.offload)."""
    lay = job.layout
    return StateBytes(weights=0.0 if lay.offload_params else 1.0,
                      gradients=0.0 if gradients_on_host(job) else 1.0,
                      optimizer=1.0 - lay.offload_optimizer)


def stage_memories(job: Job, stages: Optional[Iterable[int]] = None, activations: bool = True) \
        -> tuple[StageMemory, ...]:
    """Memory per GPU of the given pipeline stages (all by default), by term: what PyTorch's caching
    allocator holds, the figure ``torch.cuda.max_memory_reserved`` reports. What lives outside it
    (``Overheads.cuda_context``) is taken off the capacity instead (:func:`usable_bytes`).
    ``activations`` False: the model states and fixed buffers alone (activations and the
    fragmentation they cause at 0), what no micro-batch or recomputation changes."""
    lay = job.layout
    shared = per_microbatch(job) if activations else None
    o = job.overheads
    wanted = tuple(range(lay.pp) if stages is None else stages)
    held_states = _stage_states(job, wanted)
    out = []
    for stage, states in zip(wanted, held_states):
        held = stage_activation_bytes(job, stage, shared) if shared is not None else 0.0
        # The step's copies come once the activations are freed: what they add is what they pass them by.
        other = states.other + max(0.0, states.step_copies - (1 + o.fragmentation) * held)
        # Without the cached blocks, the copies pass the activations alone: the allocated peak's ``other``.
        allocated_other = states.other + max(0.0, states.step_copies - held)
        out.append(StageMemory(
            stage=stage,
            parameters=states.parameters,
            gradients=states.gradients,
            optimizer_states=states.optimizer_states,
            activations=held,
            other=other + o.fragmentation * held,
            fragmentation=other + o.fragmentation * held - allocated_other,
        ))
    return tuple(out)


@dataclass(frozen=True)
class _StageStates:
    """What one GPU of a stage holds whatever its layers' recomputation: the terms of
    :class:`StageMemory` but the activations, with ``other`` short of the step's gradient copies
    (``step_copies``), which only add what they pass the activations by."""

    parameters: float
    gradients: float
    optimizer_states: float
    other: float
    step_copies: float


# The layout's fields that only its activations read (their recomputation, and the layers whose
# activations go to the host, ``layout_spec.ACTIVATION_FIELDS``): every other term of a stage's memory
# (model states, buffers, the step's copies) is the same at any of them.


_STATES: dict[tuple, dict[int, "_StageStates"]] = {}
_STATES_LIMIT = 8192  # jobs; emptied when full (a three-engine Mixtral 8x7B plan keeps under 2,000)


def _stage_states(job: Job, stages: tuple[int, ...]) -> tuple[_StageStates, ...]:
    """:func:`_stage_states_of` the stages, kept per job less its recomputation and activation
    offload. Safe: the key is every field of the Job (the training as resolved at its layout) but
    the layout's ``ACTIVATION_FIELDS``, and nothing :func:`_stage_states_of` reads depends on those:
    they reach a stage's memory only through its activations (``stage_activation_bytes``,
    ``offload.offloaded_activation_layers``); the stages' layers (``placement``), the training's
    resolution (``resolution``), the parameters, model states, offloads of states and buffers do not
    read them (``Layout.offloads``, which reads offload_activations, is read by ``host_bytes`` alone).
    A search tries each layout's recomputation ladder, rung by rung and bisected over full
    recomputation's layers, and the activation offload's bisection: the states were priced again at
    every trial (2,742 stage memories in a three-engine Mixtral 8x7B plan)."""
    key = (job.model, job.cluster, job.training, job.overheads, without_activations(job.layout))
    known = _STATES.get(key)
    if known is None:
        if len(_STATES) >= _STATES_LIMIT:
            _STATES.clear()
        known = _STATES[key] = {}
    missing = tuple(stage for stage in stages if stage not in known)
    if missing:
        known.update(zip(missing, _stage_states_of(job, missing)))
    return tuple(known[stage] for stage in stages)


# As functools' caches have it: ``planner.refit.clear_caches`` empties every cost model's cache.
_stage_states.cache_clear = _STATES.clear  # type: ignore[attr-defined]


def _stage_states_of(job: Job, stages: tuple[int, ...]) -> list[_StageStates]:
    """Each stage's memory but its activations (:class:`_StageStates`)."""
    lay = job.layout
    o = job.overheads
    fixed = o.comm_buffers + zero3_gather_bytes(job) + reduce_bucket_bytes(job)
    if job.model.is_moe:
        fixed += alltoall_buffer_bytes(job.model, job.training, lay)
    out = []
    gpu = on_gpu_shares(job)
    on_gpu_weights, on_gpu_gradients, on_gpu_optimizer = gpu.weights, gpu.gradients, gpu.optimizer
    per_parameter = per_parameter_states(job)
    # DDP's buckets stay on the GPU whatever the optimizer offloads.
    buckets = (bucket_copy_bytes(job.training, lay.zero_stage, zero_shards(job)),
               bucket_copy_bytes(job.training, lay.zero_stage, expert_zero_shards(job)))
    unsharded = accumulates_unsharded(job)
    for stage in stages:
        states = stage_state_bytes(job, stage, per_parameter)
        params = job_stage_parameters(job, stage)
        gradients = states.gradients * on_gpu_gradients + params.dense * buckets[0] + params.expert * buckets[1] \
            + offload_gradient_copies(job, stage)[0] + flat_accumulator_bytes(job, stage)
        other = fixed + offload_staging_bytes(job, stage)[0]
        if unsharded:
            # The stage's gradients whole in the reduce dtype, and its 16-bit weights gathered at the
            # end of each backward in place of the two units in flight (an upper bound: at that
            # moment the micro-batch just done has freed its activations).
            gradients = (params.dense + params.expert) * working_bytes(job.training).gradients
            other += (params.dense + params.expert) * gathered_weight_bytes(job.training) - zero3_gather_bytes(job)
        if stage == lay.pp - 1:
            # A transient of the loss's, on the GPU whatever the optimizer offloads (FSDP2 gathers and
            # accumulates there; CPUOffloadPolicy copies the reduced shard out).
            other += chunked_loss_head_bytes(job) + unfused_head_gradient_bytes(job)
        out.append(_StageStates(
            parameters=states.weights * on_gpu_weights + quantized_weight_copy_bytes(job, stage),
            gradients=gradients,
            optimizer_states=states.optimizer * on_gpu_optimizer,
            other=other,
            step_copies=step_gradient_copy_bytes(job, stage),
        ))
    return out


def flat_accumulator_bytes(job: Job, stage: int) -> float:
    """The engine's flat gradient accumulator on one GPU of ``stage``, in the gradients' dtype, every
    parameter of the stage (``EngineBehaviour.flat_gradient_accumulator``: DeepSpeed's BF16_Optimizer
    with bf16 accumulation keeps it whole beside autograd's gradients)."""
    if not folds_gradients_into_flat_buffer(job):
        return 0.0
    return working_bytes(job.training).gradients * job_stage_parameters(job, stage).total


def step_gradient_copy_bytes(job: Job, stage: int) -> float:
    """What the optimizer step holds beside the model states of one GPU of ``stage`` with 16-bit
    gradients, after the backward's activations are gone:

    - at ZeRO 0 (``EngineBehaviour.step_gradient_copy_bytes``), DeepSpeed's FP16_Optimizer casts the
      gradients to fp32 and flattens them before it frees them (``fused_optimizer.py``, ``step``), 8
      bytes a parameter (24 with the states' 16); Megatron's gives every fp32 master a copy of its
      bf16 gradient, 4 (20);
    - sharded (``EngineBehaviour.zero_step_gradient_copy_bytes``), DeepSpeed's ZeRO optimizer flattens
      the rank's gradient partition and casts it to fp32, 6 bytes a parameter of the partition
      (``stage_1_and_2.py``, ``step``), once it has freed a ZeRO-1 rank's gradients of the parameters
      outside its partition (``free_grad_in_param_list``: only what passes them counts), and its ZeRO-3
      step the same, one sub-group at a time (``stage3.py``, ``_prepare_fp32_grad_for_sub_group``);
      Megatron's distributed optimizer casts its shard, 4, its gradient buffer kept; none where the
      optimizer's kernel holds the master as remainders and reads the 16-bit shard itself
      (``model_states.steps_master_in_kernel``)."""
    training, lay = job.training, job.layout
    engine = training.engine
    if training.precision == "fp32" or fp32_gradients(training) or steps_master_in_kernel(training):
        # steps_master_in_kernel: the optimizer reads the 16-bit gradient shard itself (megatron-core's
        # ``decoupled_grad``, a view of the buffer), no fp32 copy
        return 0.0
    if lay.zero_stage == 0:
        return engine.step_gradient_copy_bytes * job_stage_parameters(job, stage).total
    if lay.zero_stage in engine.zero_step_gradient_copy_stages and engine.zero_step_gradient_copy_bytes \
            and not lay.offload_optimizer:
        partition = optimizer_local_parameters(job, stage)
        freed = stage_state_bytes(job, stage).gradients - working_bytes(training).gradients * partition \
            if engine.step_frees_unpartitioned_gradients else 0.0
        copied = partition
        if lay.zero_stage == 3 and engine.zero3_step_sub_group_params is not None:
            # One sub-group's at a time; DeepSpeed closes a sub-group once its partitions reach
            # sub_group_size (stage3.py, _create_fp16_sub_groups), so one holds up to the partition of
            # one parameter past it: at sub_group_size 0, each parameter's alone.
            whole = job_stage_parameters(job, stage).total
            past = job_largest_parameter(job, stage) * partition / whole
            copied = min(partition, engine.zero3_step_sub_group_params + past)
        return max(0.0, engine.zero_step_gradient_copy_bytes * copied - freed)
    return 0.0


def offload_staging_bytes(job: Job, stage: int) -> tuple[float, float]:
    """(on the GPU, on the host) bytes of an offloaded optimizer's staging buffers on one GPU of
    ``stage`` (``EngineBehaviour.offload_staging_buffers``, ZeRO 1-2): the largest parameter's size in
    the 16-bit dtype on each side, and on the host the rank's partition in it too."""
    lay = job.layout
    if not (job.training.engine.offload_staging_buffers and lay.offload_optimizer and lay.zero_stage in (1, 2)):
        return 0.0, 0.0
    dtype = working_bytes(job.training).weights
    largest = dtype * job_largest_parameter(job, stage)
    return largest, largest + dtype * optimizer_local_parameters(job, stage)


def offload_gradient_copies(job: Job, stage: int) -> tuple[float, float]:
    """(on the GPU, on the host) bytes of the fp32 gradient copies an optimizer offload keeps for its
    step (``EngineBehaviour.offload_fp32_gradient_copies``): 4 a parameter of the GPU-kept share,
    where the gradients are 16-bit (an fp32 gradient is the copy), and 4 of the offloaded share,
    pinned on the host, of the parameters whose optimizer states a rank holds."""
    lay = job.layout
    if not (job.training.engine.offload_fp32_gradient_copies and lay.offload_optimizer):
        return 0.0, 0.0
    local = optimizer_local_parameters(job, stage)
    on_gpu = 0.0 if fp32_gradients(job.training) else FP32_BYTES * (1 - lay.offload_optimizer) * local
    return on_gpu, FP32_BYTES * lay.offload_optimizer * local


def chunked_loss_head_bytes(job: Job) -> float:
    """What the LM head holds on a GPU of the last stage while a chunked loss runs
    (:func:`activations.chunked_loss`, in one chunk too), beyond the units ZeRO-3's gather prices in flight
    (:func:`zero3_gather_bytes`), each measured on FSDP2 (``tests/test_chunked_loss_torch.py``):

    - its gradient, whole, upcast to the reduce dtype: torchtitan's ``ChunkedLossWrapper`` turns the
      head's gradient sync off for every chunk but the last, so FSDP2 accumulates it unsharded between
      them (torch ``FSDPParam.to_accumulated_grad_if_needed``, ``accumulate_unsharded_grad_if_needed``;
      torchtitan reduces in fp32), 4·V·h/tp;
    - at the last chunk, the reduce-scatter's input, a copy of that gradient in the reduce dtype,
      allocated while the accumulated one is still referenced (``foreach_reduce``,
      ``_fsdp_collectives.py``), 4·V·h/tp more; its output is the shard's gradient (``gradients``);
    - its weight, gathered in 16 bits through the loss (torchtitan shards the final norm and the head as
      one unit that is not resharded after the forward: ``distributed/fsdp.py``), 2·V·h/tp, in place of
      the decoder layers' units, none of which is gathered then: only what it passes them by.

    Where the stage holds every gradient unsharded anyway (:func:`accumulates_unsharded`), the head's is
    among them and nothing of this is added."""
    model, training = job.model, job.training
    if not chunked_loss(model, training) or accumulates_unsharded(job):
        return 0.0
    head = embedding_parameters(model, job_vocab(job)) / job.layout.tp
    gathered = head * gathered_weight_bytes(training)
    return 2 * FP32_BYTES * head + max(0.0, gathered - zero3_gather_bytes(job))


def unfused_head_gradient_bytes(job: Job) -> float:
    """The LM head's weight gradient, written on its own beside the loss's gradients where the engine
    does not fuse weight gradients into its buffer (``EngineBehaviour.unfused_weight_gradients_from_zero``:
    Megatron-FSDP, the head's V·h/tp in the weights' 16 bits) and copied in after."""
    first = job.training.engine.unfused_weight_gradients_from_zero
    if first is None or job.layout.zero_stage < first:
        return 0.0
    return working_bytes(job.training).weights * embedding_parameters(job.model, job_vocab(job)) / job.layout.tp


def reduce_bucket_bytes(job: Job) -> float:
    """The ZeRO-1/2 optimizer's reduction buffers (``EngineBehaviour.reduce_bucket_buffers``) of
    ``bucket_params`` elements each, in the dtype it accumulates gradients in
    (:func:`model_states.working_bytes`: fp32 where the gradients are, DeepSpeed's
    ``use_grad_accum_attribute``, else 16-bit). Not where DeepSpeed's
    BF16_Optimizer runs ZeRO-1 instead (:func:`model_states.folds_gradients_into_fp32`). One under a
    pipeline whose engine reduces after it (``EngineBehaviour.reduce_after_pipeline``): DeepSpeed's
    PipelineModule turns overlap_comm off ("Pipeline parallelism does not support overlapped
    communication", runtime/engine.py), and the second buffer is overlap_comm's (``setup_buckets``)."""
    engine, lay = job.training.engine, job.layout
    if not engine.reduce_bucket_buffers or lay.zero_stage not in (1, 2) or folds_gradients_into_fp32(job) \
            or folds_gradients_into_flat_buffer(job):
        return 0.0
    buffers = min(engine.reduce_bucket_buffers, 1) if lay.pp > 1 and engine.reduce_after_pipeline \
        else engine.reduce_bucket_buffers
    return buffers * engine.bucket_params * working_bytes(job.training).gradients


def accumulates_unsharded(job: Job) -> bool:
    """Whether the stages hold their gradients unsharded and their weights gathered through the step:
    FSDP2 under torch.distributed.pipelining (``EngineBehaviour.pp_unsharded_accumulation``), which
    reduces once, after the last micro-batch's backward."""
    engine, lay = job.training.engine, job.layout
    return engine.pp_unsharded_accumulation and lay.pp > 1 and (lay.zero_stage == 3 or engine.fsdp_always)


def outside_allocator(gpu: GPUSpec, overheads: Overheads) -> tuple[str, float]:
    """What a rank holds that the priced peak never shows, by its name in reports, and its bytes:
    on a GPU the CUDA context and NCCL's own buffers (``Overheads.cuda_context``); on a CPU, which
    has none, the process itself before its first model tensor (``Overheads.cpu_process``)."""
    if gpu.on_cpu:
        return "the CPU process", overheads.cpu_process
    return "the CUDA context", overheads.cuda_context


def usable_bytes(gpu: GPUSpec, overheads: Overheads, headroom: float) -> float:
    """What the caching allocator may hold at its peak on ``gpu``: the capacity less the headroom a
    layout must leave free, less what lives outside the allocator (:func:`outside_allocator`), which
    its counters never show."""
    return gpu.memory_bytes * (1 - headroom) - outside_allocator(gpu, overheads)[1]


def host_bytes(job: Job) -> float:
    """Host memory one GPU's offload needs, on its heaviest stage: model states and the
    offloaded layers' activations of every micro-batch in flight."""
    if not job.layout.offloads:
        return 0.0
    lay = job.layout
    shared = per_microbatch(job)
    most = 0.0
    for stage in range(lay.pp):
        chunks = in_flight_chunks(lay.pp, lay.vpp, job.num_microbatches, stage)
        activations = chunks * offloaded_activation_layers(job, stage) * shared.kept
        states, gpu = stage_state_bytes(job, stage), on_gpu_shares(job)
        if accumulates_on_host(job):  # the engine's own gradient buffers on the host, not a shard's
            gradients = optimizer_local_parameters(job, stage) * lay.offload_optimizer * host_gradient_bytes(job)
        else:
            gradients = states.gradients * (1 - gpu.gradients) + offload_gradient_copies(job, stage)[1]
        on_host = states.weights * (1 - gpu.weights) + gradients + states.optimizer * (1 - gpu.optimizer) \
            + offload_staging_bytes(job, stage)[1]
        most = max(most, on_host + activations)
    return most


def stage_memory(job: Job, stage: int) -> StageMemory:
    return stage_memories(job, (stage,))[0]


def peak_candidates(job: Job) -> list[int]:
    """Stages that can be the heaviest: the first and last (embedding, head), and each middle
    stage that holds more dense layers, or more MoE layers, than every middle stage before it.
    A later middle stage with no more of either holds fewer micro-batches in flight and the
    same or fewer weights, so it cannot be heavier."""
    pp = job.layout.pp
    stages = {0, pp - 1}
    if not job.model.is_moe:
        most = 0
        for i in range(1, pp - 1):
            if job.stage_layers[i] > most:
                most = job.stage_layers[i]
                stages.add(i)
        return sorted(stages)
    seen: list[tuple[int, int]] = []  # (dense layers, MoE layers) of the middle stages kept so far
    met: set[tuple[int, int]] = set()  # every pair met so far: most stages repeat one
    for i in range(1, pp - 1):
        mine = (job.stage_layers[i] - job.stage_moe_layers[i], job.stage_moe_layers[i])
        if mine in met:
            continue
        met.add(mine)
        if not any(dense >= mine[0] and moe >= mine[1] for dense, moe in seen):
            seen.append(mine)
            stages.add(i)
    return sorted(stages)


def peak_stage_memory(job: Job) -> StageMemory:
    """The stage whose GPUs need the most memory: it decides whether the layout fits."""
    return max(stage_memories(job, peak_candidates(job)), key=lambda m: m.total)
