"""The optimizer step and the offload traffic around it, per pipeline stage."""

from __future__ import annotations


from .kernels import in_place_time
from .memory import optimizer_local_parameters, per_microbatch
from .model_states import optimizer_step_bytes, state_bytes, steps_master_in_kernel, weights_are_master, zero_shards
from .offload import activation_offload_time, optimizer_offload_floor, optimizer_offload_time, param_offload_time
from .job import Job
from .stage_time import StageTime


def optimizer_time(job: Job, stage: int) -> float:
    """The optimizer step is HBM-bound: its passes over the gradients, the states and the weights
    (:func:`model_states.optimizer_step_bytes`), updated in place (:func:`kernels.in_place_time`)."""
    lay, gpu = job.layout, job.cluster.gpu
    shards = zero_shards(job)
    per_param = state_bytes(job.training, lay.zero_stage, shards)
    local = optimizer_local_parameters(job, stage) * (1 - lay.offload_optimizer)
    master = weights_are_master(job.training, lay.zero_stage, shards)
    return in_place_time(local * optimizer_step_bytes(per_param, master, job.training.engine,
                                                      steps_master_in_kernel(job.training)), gpu)


def offload_time(job: Job, stage: int, slowest: "StageTime") -> float:
    """What offload adds to the step on the stage's ranks (:mod:`cost_models.offload`)."""
    lay = job.layout
    if not lay.offloads:
        return 0.0
    local = optimizer_local_parameters(job, stage)
    forward = slowest.compute / 3
    backward = 2 / 3 * slowest.compute + slowest.recompute
    gathers = 2  # the forward's and the backward's, which a recomputed forward shares (dp_time)
    return (optimizer_offload_time(job, local, backward)
            + param_offload_time(job, local, slowest.compute + slowest.recompute, gathers)
            + activation_offload_time(job, stage, per_microbatch(job).kept, forward, backward))


def least_offload_time(job: Job) -> float:
    """The least :func:`offload_time` the step takes whatever its compute: the optimizer's step on
    the CPU and the weights back in (``offload.optimizer_offload_floor``), on the stage with the
    most (``step_time``'s offload is the most of the stages')."""
    return max(optimizer_offload_floor(job, optimizer_local_parameters(job, stage)) for stage in range(job.layout.pp))
