"""The pipeline: its sends across stage boundaries, its stages by kind and the slowest of
them, and its bubble (Narayanan et al. 2021, §2.2)."""

from __future__ import annotations

from dataclasses import dataclass

from .collectives import p2p_time
from .quantization import activation_bytes
from .pipeline import bubble_fraction
from .job import Job
from .topology import group_links
from .stage_time import StageTime, stage_time


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


def stage_kinds(job: Job) -> tuple[int, ...]:
    """The first stage of each kind: stages alike in layer count, MoE and high-precision layers and
    role (first, middle or last) take the same time and hold and move the same parameters."""
    lay = job.layout
    kinds: dict[tuple, int] = {}
    for i, layers in enumerate(job.stage_layers):
        kinds.setdefault((layers, job.stage_moe_layers[i], job.high_precision_layers[i], i == 0, i == lay.pp - 1), i)
    return tuple(kinds.values())


def pipeline(job: Job) -> Pipeline:
    """The job's stages by kind, each kind's time computed once (:func:`stage_time`)."""
    kinds = stage_kinds(job)
    return Pipeline(kinds, max((stage_time(job, i) for i in kinds), key=lambda s: s.total))
