"""Offload to host memory: what it takes off the GPU, what the host then holds, and what the
copies and the optimizer step on the CPU add to a step.

- Optimizer states (fraction f of each rank's shard; ZeRO-Offload, Ren et al., USENIX ATC 2021,
  §4: gradients copied out as backward produces them, the Adam step on the CPU, the updated
  16-bit weights copied back; Megatron-core's HybridDeviceOptimizer, --optimizer-offload-fraction):
  the step streams the optimizer kernel's bytes (``model_states.adam_step_bytes``), over
  host DRAM instead of HBM.
- Parameters of ZeRO-3 (ZeRO-Infinity, Rajbhandari et al., SC 2021, §5; PyTorch FSDP2's
  CPUOffloadPolicy): each rank's shard lives on the host and is copied in before every gather,
  its gradient shard copied out after every reduce-scatter.
- Activations (Megatron-core ``cpu_offloading_num_layers``): the saved tensors of the first N
  layers of a stage are copied out during forward and back during backward, behind compute;
  one layer's worth stays on the GPU as the copy's buffer.

Copies run on the GPU↔host link (PCIe or NVLink-C2C) at ``Performance.host_link_efficiency``
of its rate, beside compute as :func:`collectives.exposed` allows; the CPU step is in the open.
"""

from __future__ import annotations

from .collectives import exposed
from .model_states import (FP32_BYTES, MASTER_BYTES, adam_step_bytes, fp32_gradients, state_bytes, weights_are_master,
                           zero_shards)
from .job import Job


def gradients_on_host(job: Job) -> bool:
    """Gradient shards kept on the host: with ZeRO-3 parameter offload (FSDP2's CPUOffloadPolicy), or,
    where the engine reduces sharded gradients straight into host buffers when the whole optimizer
    is there (``EngineBehaviour.offload_moves_gradients``), at ZeRO 2-3 with the optimizer offloaded
    whatever the parameters: DeepSpeed's ZeRO-2 (``stage_1_and_2.py`` ``cpu_offload``) and ZeRO-3,
    whose gradient partitions live on the optimizer's device (``stage3.py``: ``self.device`` is the
    CPU only with offload_optimizer; ``grad_partitions_flat_buffer``)."""
    lay = job.layout
    if job.training.engine.offload_moves_gradients:
        return lay.offload_optimizer == 1 and lay.zero_stage >= 2
    return lay.offload_params


def accumulates_on_host(job: Job) -> bool:
    """Whether the engine accumulates the offloaded optimizer's gradients on the host, micro-batch
    by micro-batch (``EngineBehaviour.offload_accumulates_on_host``: DeepSpeed with its optimizer
    offloaded, at ZeRO-1/2 with the gradients accumulated in 16 bits, its default, and at ZeRO-3)."""
    lay = job.layout
    return job.training.engine.offload_accumulates_on_host and lay.offload_optimizer > 0 \
        and (lay.zero_stage == 3 or lay.zero_stage in (1, 2) and not fp32_gradients(job.training))


def _accumulation_bytes(job: Job) -> float:
    """Bytes of a gradient as the engine accumulates it: 4 with fp32 gradients, else 2."""
    return FP32_BYTES if fp32_gradients(job.training) else 2.0


def _partition_bytes(job: Job) -> float:
    """Bytes of a gradient in the optimizer's partition: the master weights' dtype, fp32, or bf16
    where the engine keeps a bf16 master without master weights (DeepSpeed's
    bf16_master_weights_and_grads: ``stage_1_and_2.py`` and ``stage3.py`` make the partition's
    gradient buffer in the master's dtype)."""
    training = job.training
    return 2.0 if not training.master_weights and training.engine.bf16_master_partition else FP32_BYTES


def host_gradient_bytes(job: Job) -> float:
    """Host bytes per offloaded parameter of the gradients where :func:`accumulates_on_host`: the
    optimizer's gradient partition (:func:`_partition_bytes`), pinned for the run (DeepSpeed
    ``stage_1_and_2.py``, ``initialize_optimizer_states``, kept under cpu_offload; ``stage3.py``, each
    sub-group's ``subgroup_gradient_buffer``), and the buffer the micro-batches accumulate into: at
    ZeRO-1/2 with more than one micro-batch, 16-bit (``async_accumulate_grad_in_cpu_via_gpu``,
    ``accumulated_grads_in_cpu``); at ZeRO-3 always, in the accumulation dtype
    (``grad_partitions_flat_buffer``)."""
    if job.layout.zero_stage == 3:
        return _partition_bytes(job) + _accumulation_bytes(job)
    return _partition_bytes(job) + 2 * (job.num_microbatches > 1)


def gradient_copies(job: Job) -> list[tuple[float, int]]:
    """The offloaded optimizer's gradients over the host link, as (bytes per offloaded parameter,
    micro-batches that move them behind their own backward).

    By default the gradients go out once, behind the last micro-batch's backward. Where
    :func:`accumulates_on_host` (DeepSpeed ``stage_1_and_2.py``: ``copy_grads_in_partition``, then
    ``async_accumulate_grad_in_cpu_via_gpu`` wherever ``micro_step_id > 0`` or the boundary is yet
    to come, and ``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` at the boundary): with one
    micro-batch, the partition out in its dtype (4 in fp32: :func:`_partition_bytes`); else ZeRO-2, reducing every micro-batch, sends the
    first's 16-bit partition out (g), each later one's brings the sum back in and sends it out
    (2g), and the last's also goes out in fp32 (2g + 4); ZeRO-1, reducing at the boundary alone,
    moves the last's 2g + 4. ZeRO-3 (``stage3.py``, ``partition_grads``) copies each micro-batch's
    partition into its host buffer and back (the first) or brings the sum in and sends it out (the
    others), 2g each, g in the accumulation dtype, and the last's also goes out in fp32
    (``_offload_grad_partition_at_boundary``): 2g + 4."""
    if not accumulates_on_host(job):
        lay = job.layout
        return [(state_bytes(job.training, lay.zero_stage, zero_shards(job)).gradients, 1)]
    ga, g, partition = job.num_microbatches, _accumulation_bytes(job), _partition_bytes(job)
    if job.layout.zero_stage == 3:
        return [(2 * g, ga - 1), (2 * g + partition, 1)]
    if ga == 1:
        return [(partition, 1)]
    if job.layout.zero_stage == 1:
        return [(2 * g + partition, 1)]
    return [(g, 1), (2 * g, ga - 2), (2 * g + partition, 1)]


def offloaded_activation_layers(job: Job, stage: int) -> float:
    """Layers per model chunk whose saved activations live on the host, of those not recomputed."""
    lay = job.layout
    per_chunk = job.largest_chunk(stage)
    recomputed = 0.0
    if lay.recompute == "full":
        recomputed = per_chunk if lay.recompute_num_layers is None else lay.recompute_num_layers / lay.vpp
    return min(lay.offload_activations / lay.vpp, max(0.0, per_chunk - recomputed))


def optimizer_offload_time(job: Job, local_params: float, backward_s: float) -> float:
    """Gradients out behind the micro-batches' backward (``backward_s`` each: :func:`gradient_copies`),
    the step on the CPU, weights back in, for the offloaded share of the ``local_params`` whose
    optimizer states a rank holds."""
    lay, gpu = job.layout, job.cluster.gpu
    if not lay.offload_optimizer:
        return 0.0
    perf = gpu.performance
    link = gpu.offload_host().link_bandwidth * perf.host_link_efficiency
    local = local_params * lay.offload_optimizer
    out = sum(count * exposed(local * per_param / link, backward_s, perf) for per_param, count in gradient_copies(job)
              if count)
    return out + optimizer_offload_floor(job, local_params)


def optimizer_offload_floor(job: Job, local_params: float) -> float:
    """What :func:`optimizer_offload_time` takes whatever the compute beside it: the step on the
    CPU and the weights back in (only the gradients' way out hides behind the backward)."""
    cpu_step, back = _optimizer_offload_parts(job, local_params)
    return cpu_step + back


def _optimizer_offload_parts(job: Job, local_params: float) -> tuple[float, float]:
    """(the step on the CPU, the weights back in) of the offloaded share of ``local_params``: 0
    where the optimizer stays on the GPU."""
    lay, gpu = job.layout, job.cluster.gpu
    if not lay.offload_optimizer:
        return 0.0, 0.0
    perf, host = gpu.performance, gpu.offload_host()
    shards = zero_shards(job)
    per_param = state_bytes(job.training, lay.zero_stage, shards)
    local = local_params * lay.offload_optimizer
    link = host.link_bandwidth * perf.host_link_efficiency
    step_bytes = adam_step_bytes(per_param, weights_are_master(job.training, lay.zero_stage, shards))
    if gradients_on_host(job) and not job.training.engine.offload_moves_gradients:
        # FSDP2's CPU offload keeps the sharded gradients on the host (_fsdp_collectives.py,
        # foreach_reduce), so the clip the emitted job runs (torchtitan's clip_grad_norm_: the norm
        # reads them, the scale reads and writes them) streams there too (optimizer_step_bytes).
        step_bytes += 3 * per_param.gradients
    if accumulates_on_host(job):
        # DeepSpeed 0.19 steps the fp32 partition alone (ops/adam/cpu_adam.py, DeepSpeedCPUAdam: it reads
        # the fp32 gradient and reads and writes the master and moments), after unscale_and_clip_grads
        # scales the fp32 gradients in a pass of its own (the config's gradient_clipping: read and write),
        # and copies the master into the 16-bit weights after it (read): the fused step that wrote them
        # in Adam's loop is commented out (stage_1_and_2.py, _optimizer_step).
        step_bytes = FP32_BYTES + 2 * per_param.optimizer + 2 * FP32_BYTES + MASTER_BYTES
    cpu_step = local * step_bytes / (host.memory_bandwidth * perf.host_memory_efficiency)
    # The updated 16-bit weights go back to the GPU, unless they live on the host (parameter offload,
    # whose gathers copy them in: param_offload_time).
    return cpu_step, 0.0 if lay.offload_params else local * per_param.weights / link


def param_offload_time(job: Job, shard: float, microbatch_s: float, gathers: int) -> float:
    """ZeRO-3 shards (``shard`` parameters a rank) in from the host before each of a micro-batch's
    ``gathers``, the gradient shard out after its reduce-scatter, beside that micro-batch's compute."""
    lay, gpu = job.layout, job.cluster.gpu
    if not lay.offload_params:
        return 0.0
    perf = gpu.performance
    per_param = state_bytes(job.training, lay.zero_stage, zero_shards(job))  # as the host holds them
    # The gradient shard out, where the parameters' offload takes it (FSDP2); an engine whose offloaded
    # optimizer accumulates them on the host moves them there (:func:`gradient_copies`), or keeps them
    # on the GPU without it (DeepSpeed: :func:`gradients_on_host`).
    out = per_param.gradients if gradients_on_host(job) and not accumulates_on_host(job) else 0.0
    copies = shard * (gathers * per_param.weights + out)
    link = gpu.offload_host().link_bandwidth * perf.host_link_efficiency
    return job.num_microbatches * exposed(copies / link, microbatch_s, perf)


def activation_offload_time(job: Job, stage: int, layer_bytes: float, forward_s: float,
                            backward_s: float) -> float:
    """Each micro-batch copies its offloaded layers' activations out in forward, in for backward."""
    layers = offloaded_activation_layers(job, stage) * job.layout.vpp
    if not layers:
        return 0.0
    gpu = job.cluster.gpu
    perf = gpu.performance
    copy = layers * layer_bytes / (gpu.offload_host().link_bandwidth * perf.host_link_efficiency)
    return job.num_microbatches * (exposed(copy, forward_s, perf) + exposed(copy, backward_s, perf))
