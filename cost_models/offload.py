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
from .model_states import adam_step_bytes, state_bytes, weights_are_master, zero_shards
from .job import Job


def gradients_on_host(job: Job) -> bool:
    """Gradient shards kept on the host: with ZeRO-3 parameter offload (FSDP2, ZeRO-Infinity), and
    where the engine reduces sharded gradients straight into host buffers when the whole optimizer
    is there (DeepSpeed's ZeRO-2 offload: ``stage_1_and_2.py`` ``cpu_offload``)."""
    lay = job.layout
    return lay.offload_params or (lay.offload_optimizer == 1 and lay.zero_stage >= 2
                                  and job.training.engine.offload_moves_gradients)


def offloaded_activation_layers(job: Job, stage: int) -> float:
    """Layers per model chunk whose saved activations live on the host, of those not recomputed."""
    lay = job.layout
    per_chunk = job.largest_chunk(stage)
    recomputed = 0.0
    if lay.recompute == "full":
        recomputed = per_chunk if lay.recompute_num_layers is None else lay.recompute_num_layers / lay.vpp
    return min(lay.offload_activations / lay.vpp, max(0.0, per_chunk - recomputed))


def optimizer_offload_time(job: Job, local_params: float, backward_s: float) -> float:
    """Gradients out behind the last micro-batch's backward, the step on the CPU, weights back in,
    for the offloaded share of the ``local_params`` whose optimizer states a rank holds."""
    return exposed(_optimizer_offload_parts(job, local_params)[0], backward_s, job.cluster.gpu.performance) \
        + optimizer_offload_floor(job, local_params)


def optimizer_offload_floor(job: Job, local_params: float) -> float:
    """What :func:`optimizer_offload_time` takes whatever the compute beside it: the step on the
    CPU and the weights back in (only the gradients' way out hides behind the backward)."""
    _, cpu_step, back = _optimizer_offload_parts(job, local_params)
    return cpu_step + back


def _optimizer_offload_parts(job: Job, local_params: float) -> tuple[float, float, float]:
    """(the gradients out, the step on the CPU, the weights back in) of the offloaded share of
    ``local_params``: 0 where the optimizer stays on the GPU."""
    lay, gpu = job.layout, job.cluster.gpu
    if not lay.offload_optimizer:
        return 0.0, 0.0, 0.0
    perf, host = gpu.performance, gpu.host
    shards = zero_shards(job)
    per_param = state_bytes(job.training, lay.zero_stage, shards)
    local = local_params * lay.offload_optimizer
    link = host.link_bandwidth * perf.host_link_efficiency
    # DeepSpeed's CPU Adam folds the clip's scale into its step and writes the 16-bit weights in
    # the same loop (csrc/adam/cpu_adam_impl.cpp): the optimizer's own kernel alone.
    cpu_step = local * adam_step_bytes(per_param, weights_are_master(job.training, lay.zero_stage, shards)) \
        / (host.memory_bandwidth * perf.host_memory_efficiency)
    return local * per_param.gradients / link, cpu_step, local * per_param.weights / link


def param_offload_time(job: Job, shard: float, microbatch_s: float, gathers: int) -> float:
    """ZeRO-3 shards (``shard`` parameters a rank) in from the host before each of a micro-batch's
    ``gathers``, the gradient shard out after its reduce-scatter, beside that micro-batch's compute."""
    lay, gpu = job.layout, job.cluster.gpu
    if not lay.offload_params:
        return 0.0
    perf = gpu.performance
    per_param = state_bytes(job.training, lay.zero_stage, zero_shards(job))  # as the host holds them
    copies = shard * (gathers * per_param.weights + per_param.gradients)
    return job.num_microbatches * exposed(copies / (gpu.host.link_bandwidth * perf.host_link_efficiency),
                                          microbatch_s, perf)


def activation_offload_time(job: Job, stage: int, layer_bytes: float, forward_s: float,
                            backward_s: float) -> float:
    """Each micro-batch copies its offloaded layers' activations out in forward, in for backward."""
    layers = offloaded_activation_layers(job, stage) * job.layout.vpp
    if not layers:
        return 0.0
    gpu = job.cluster.gpu
    perf = gpu.performance
    copy = layers * layer_bytes / (gpu.host.link_bandwidth * perf.host_link_efficiency)
    return job.num_microbatches * (exposed(copy, forward_s, perf) + exposed(copy, backward_s, perf))
