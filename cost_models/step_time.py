"""Time of one optimizer step: compute, communication over the topology, pipeline bubble, optimizer.

One step runs m micro-batches through each of the dp pipelines. Per micro-batch a
stage spends forward + backward (2× forward) GEMM and attention time, element-wise
(HBM-bound) time, recomputation, and the tensor-parallel collectives it cannot hide.
The slowest stage sets the steady state's clock, and the fill and drain run each stage at its
own pace (Narayanan et al. 2021, §2.2; ``pipeline_time.Pipeline.bubble``):

    step = m·t_slowest + (Σ_i t_i − t_slowest)/v + pipeline sends + exposed DP traffic + optimizer

The exposed part of the data-parallel traffic is what the backward pass of the
last micro-batch cannot hide (Li et al. 2020, PyTorch DDP, §3.2.3; Megatron's
``overlap_grad_reduce``); ZeRO-3 gathers weights for every micro-batch and hides
them behind that micro-batch's compute (FSDP prefetch).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Optional

from .dp_time import dp_comm_exposed
from .flops import model_flops_per_token
from .job import Job
from .optimizer_time import offload_time, optimizer_time
from .pipeline_time import Pipeline, pipeline, pipeline_comm


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
        # The parts in the fields' order, summed by sum() as before (the same values in the same order:
        # the same float); the names are found once (_parts), where dataclasses.fields was asked on every
        # call (2,000 times a three-engine Mixtral 8x7B plan).
        return sum(_parts(self))

    def by_part(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_parts = attrgetter(*(f.name for f in fields(StepTime)))  # a tuple of StepTime's parts, in its fields' order


def step_time(job: Job, stages: Optional[Pipeline] = None) -> StepTime:
    """The step: every micro-batch at the slowest stage's pace, the bubble, and what the
    pipeline, data-parallel, optimizer and offload traffic add (``stages``: :func:`pipeline`'s,
    where the caller has it)."""
    stages = stages or pipeline(job)
    return _with_dp(job, stages, _parts_but_dp(job, stages))


def step_time_under(job: Job, stages: Pipeline, threshold: float) -> tuple[float, Optional[StepTime]]:
    """:func:`step_time`'s total and the step, or, where its parts but the data-parallel traffic
    already pass ``threshold``, their sum and None: the step passes it too, and its data-parallel
    traffic (each stage kind's buckets or ZeRO-3 units over its links: the costliest part to price)
    is not priced. The search's floor (``planner.search_bounds.floor``) prunes most of the layouts it
    prices so (torchtitan's Mixtral 8x7B on 64 H100s: 225 of 436)."""
    parts = _parts_but_dp(job, stages)
    least = sum(parts.values())
    if least > threshold:
        return least, None
    time = _with_dp(job, stages, parts)
    return time.total, time


def _parts_but_dp(job: Job, stages: Pipeline) -> dict[str, float]:
    """Every part of the step (:class:`StepTime`'s fields) but ``dp_comm_s``."""
    kinds, slowest = stages.kinds, stages.slowest
    m = job.num_microbatches
    return dict(
        compute_s=m * slowest.compute,
        recompute_s=m * slowest.recompute,
        tp_comm_s=m * slowest.tp_comm,
        cp_comm_s=m * slowest.cp_comm,
        ep_comm_s=m * slowest.ep_comm,
        pp_comm_s=pipeline_comm(job),
        bubble_s=stages.bubble(job),
        optimizer_s=max(optimizer_time(job, i) for i in kinds),
        offload_s=max(offload_time(job, i, slowest) for i in kinds),
        overhead_s=host_overhead(job),
    )


def _with_dp(job: Job, stages: Pipeline, parts: dict[str, float]) -> StepTime:
    """The step of ``parts`` (:func:`_parts_but_dp`) and its exposed data-parallel traffic."""
    return StepTime(dp_comm_s=max(dp_comm_exposed(job, i, stages.slowest) for i in stages.kinds), **parts)


def host_overhead(job: Job) -> float:
    """Host time per step that no GPU work hides: a fixed cost per optimizer step and one per
    micro-batch each rank runs (``Performance.step_overhead_s``, ``microbatch_overhead_s``)."""
    perf = job.cluster.gpu.performance
    return perf.step_overhead_s + job.num_microbatches * perf.microbatch_overhead_s


def model_flops_per_step(job: Job) -> float:
    tokens = job.training.global_batch_size * job.training.seq_len
    return tokens * model_flops_per_token(job.model, job.training.seq_len)
