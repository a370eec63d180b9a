"""The pipeline: its sends across stage boundaries, its stages by kind and the slowest of
them, and its bubble (Narayanan et al. 2021, §2.2)."""

from __future__ import annotations

from dataclasses import dataclass

from .collectives import p2p_time
from .pipeline import microbatches_per_round, round_stall_passes
from .quantization import activation_bytes
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
    activation, re-assembled over NVLink (Narayanan et al. 2021, §4.1; DeepSpeed's
    ``PartitionedTensor`` where the pipeline is model-parallel, ``runtime/pipe/engine.py``).
    Where the engine issues a step's send and receive one after the other
    (``EngineBehaviour.p2p_serial``: DeepSpeed's four blocking transfers a micro-batch), the
    two directions no longer share the time: two sends per micro-batch and direction.
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
    # The chunk passes on the critical path: m·v, the fill and drain, and where the rounds are shorter
    # than the pipeline, the waits between them (pipeline.round_stall_passes).
    passes = job.num_microbatches * lay.vpp + lay.pp - 1 + round_stall_passes(lay.pp, lay.vpp, job.num_microbatches)
    per_pass = 4 if job.training.engine.p2p_serial else 2
    return per_pass * send * passes


@dataclass(frozen=True)
class Pipeline:
    """The stages of a job that differ (one of each kind: layer count and role, first, middle
    or last, take the same time), the slowest of them, which sets every micro-batch's pace, and
    one micro-batch's time on every stage in turn, which sets the bubble."""

    kinds: tuple[int, ...]  # a stage of each kind
    slowest: StageTime
    stages_total_s: float  # Σ_i T_i over the p stages (each stage's forward and backward of a micro-batch)

    @classmethod
    def of(cls, job: Job, times: dict[int, StageTime]) -> "Pipeline":
        """The pipeline of ``times``, a time for the first stage of each kind (:func:`stage_kinds`), each
        counted for every stage of its kind. With the experts' dispatch overlapped a stage's time also
        depends on its place (its warm-up passes pair fewer: ``stage_time``), the first of a kind the
        slowest: the sum is over by that (0.3 % of DeepSeek-V3's step at pp 16), never under."""
        counts = stage_kind_counts(job)
        return cls(tuple(times), max(times.values(), key=lambda s: s.total),
                   sum(counts[i] * t.total for i, t in times.items()))

    def bubble(self, job: Job) -> float:
        """The pipeline's idle time in a step. 1F1B runs the first micro-batch's forward through every
        stage and the last's backward back through them at each stage's own pace, and the steady state
        between at the slowest's: step = (m − 1)·T_max + Σ_i T_i, so the bubble is Σ_i T_i − T_max;
        with equal stages (p − 1)·T (Narayanan et al. 2021, §2.2.1). Interleaving v model chunks a
        stage cuts each fill and drain step to a chunk's time, T_i/v (§2.2.2): (Σ_i T_i − T_max)/v.
        A stage lighter than the slowest (a pipeline whose last stage also runs the LM head and the
        loss) idles less than the slowest would: its share of the fill and drain is its own time.
        Exact where the slowest stage is the last; where one before it is, its warm-up forwards run
        in the fill and the schedule takes less still (tests/test_step_time.py simulates both).

        Rounds of fewer micro-batches than stages (torch's ScheduleInterleaved1F1B runs m < p in one
        round of g = m: ``torch/distributed/pipelining/schedules.py``, :func:`pipeline.microbatches_per_round`)
        leave each rank waiting at its v − 1 turns to the next chunk for the round's first micro-batch
        (:func:`pipeline.round_stall_passes`): the step is then that micro-batch's way through every
        chunk and back, Σ_i T_i, and the m − 1 others behind it at the slowest chunk's pace,
        (m − 1)·T_max/v, which is (1 − 1/v)·(Σ_i T_i − g·T_max) more than the above: (p − g)(v − 1)
        chunk passes at equal stages. Nothing where g ≥ p, as with m ≥ p, since Σ_i T_i ≤ p·T_max
        (tests/test_pipeline_rounds.py simulates torch's own schedule)."""
        lay = job.layout
        fill = (self.stages_total_s - self.slowest.total) / lay.vpp
        group = microbatches_per_round(lay.pp, job.num_microbatches)
        return fill + (1 - 1 / lay.vpp) * max(0.0, self.stages_total_s - group * self.slowest.total)

    def least_step(self, job: Job) -> float:
        """What every micro-batch and the bubble take: the step (:func:`step_time`) less its
        data-parallel, pipeline, optimizer and offload terms."""
        return job.num_microbatches * self.slowest.total + self.bubble(job)


def _kind(job: Job, stage: int) -> tuple:
    """What makes stages take the same time: layer count, MoE and high-precision layers and role
    (first, middle or last)."""
    return (job.stage_layers[stage], job.stage_moe_layers[stage], job.high_precision_layers[stage],
            stage == 0, stage == job.layout.pp - 1)


def stage_kinds(job: Job) -> tuple[int, ...]:
    """The first stage of each kind: stages alike in layer count, MoE and high-precision layers and
    role (first, middle or last) take the same time and hold and move the same parameters."""
    return tuple(stage_kind_counts(job))


# stage_kind_counts' answers by what they depend on: the stages' layer, MoE-layer and high-precision
# counts. Every size `size` searches walks the same pipeline splits again, one Job per layout and
# data-parallel degree (Qwen3 235B on up to 30,240 GB200s: 27,264 calls, 9 % of its time, on a few
# hundred splits).
_KIND_COUNTS: dict[tuple, dict[int, int]] = {}


def stage_kind_counts(job: Job) -> dict[int, int]:
    """How many stages each kind has, by its first stage (:func:`stage_kinds`). Read-only: the
    dict is shared by every job of the same stages."""
    pp = job.layout.pp
    key = (pp, job.stage_layers, job.stage_moe_layers, job.high_precision_layers)
    counts = _KIND_COUNTS.get(key)
    if counts is None:
        first: dict[tuple, int] = {}
        counts = {}
        for i in range(pp):
            head = first.setdefault(_kind(job, i), i)
            counts[head] = counts.get(head, 0) + 1
        if len(_KIND_COUNTS) >= 4096:
            _KIND_COUNTS.clear()
        _KIND_COUNTS[key] = counts
    return counts


def pipeline(job: Job) -> Pipeline:
    """The job's stages by kind, each kind's time computed once (:func:`stage_time`)."""
    return Pipeline.of(job, {i: stage_time(job, i) for i in stage_kinds(job)})
