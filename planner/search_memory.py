"""Whether a layout fits: the memory limit `estimate`, `diagnose`, `plan` and `size` hold every
layout to, in one place that :mod:`planner.estimate` and the search (:mod:`planner.search`)
both import."""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

from cost_models.activations import head_activation_bytes, loss_gradient_bytes
from cost_models.memory import host_bytes, peak_stage_memory
from cost_models.memory import usable_bytes as allocator_usable_bytes
from cost_models.layout_spec import without_activations
from cost_models.specs import ClusterSpec, Job, Layout, ModelSpec, Overheads, TrainingSpec

from .bands import fit_limit as band_fit_limit
from .bands import memory_band


# A Job of the same case and layout but for its ACTIVATION_FIELDS, by (model, cluster, training,
# overheads, the layout's other fields): a job at another rung is built from it (Job.at_activations).
_SIBLINGS: dict[tuple, Job] = {}
_SIBLINGS_LIMIT = 8192  # emptied when full, as _job's cache holds as many


@lru_cache(maxsize=8192)
def _job(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, overheads: Overheads) -> Job:
    key = (model, cluster, training, overheads, without_activations(layout))
    sibling = _SIBLINGS.get(key)
    if sibling is not None:
        # Safe: the sibling was built from this training with every check and differs from this job in
        # ACTIVATION_FIELDS alone (Job.at_activations: the same Job, the same refusal).
        return sibling.at_activations(layout)
    job = Job(model, cluster, training, layout, overheads)
    if len(_SIBLINGS) >= _SIBLINGS_LIMIT:
        _SIBLINGS.clear()
    _SIBLINGS[key] = job
    return job


# Emptied with _job's cache (planner.refit.clear_caches and the tests empty every cache they find).
_job_cache_clear = _job.cache_clear


def _clear_jobs() -> None:
    _job_cache_clear()
    _SIBLINGS.clear()


# Replaced on purpose, so that whoever empties _job's cache empties _SIBLINGS too: mypy reads it as a method.
_job.cache_clear = _clear_jobs  # type: ignore[method-assign]


def case_job(case, layout: Layout) -> Job:
    """The case's job at ``layout``, built once: a search asks for the same layout's job several times
    (its bound's floor, its ZeRO-3 traffic, its recomputation ladder: a third of a three-engine plan's
    5,748 jobs were built before), and a Job holds what it derives (its stages' layers). Keyed on every
    field of the Job; a layout the Job refuses raises each time, as before."""
    return _job(case.model, case.cluster, case.training, layout, case.overheads)


def usable_bytes(job: Job, headroom: float) -> float:
    """GPU memory a layout's peak may reach (``memory.usable_bytes``): the capacity less the
    headroom it must leave free and what lives outside PyTorch's allocator."""
    return allocator_usable_bytes(job.cluster.gpu, job.overheads, headroom)


def fit_limit(job: Job, headroom: float) -> float:
    """The most a layout's predicted peak may be and fit (``bands.fit_limit``)."""
    return band_fit_limit(usable_bytes(job, headroom), job.model, job.cluster, job.training)


def fits_with_margin(job: Job, peak: float, headroom: float) -> bool:
    """Whether ``peak`` fits at its memory band's upper end (``bands.memory_band``): no risk left. With
    no band (CPUs), where the predicted peak fits: no band straddles the usable memory, none is at risk."""
    band = memory_band(job)
    return peak * (1.0 if band is None else band.high) <= usable_bytes(job, headroom)


def host_fits(job: Job, headroom: float) -> bool:
    """What offload puts on the host fits its share of host memory, less the same headroom."""
    if not job.layout.offloads:
        return True
    return host_bytes(job) <= job.cluster.gpu.offload_host().memory_bytes * (1 - headroom)


def fits(job: Job, headroom: float) -> tuple[bool, float]:
    """Whether the job fits on the GPU (:func:`fit_limit`) and its offload on the host, and its peak."""
    peak = peak_stage_memory(job).total
    return peak <= fit_limit(job, headroom) and host_fits(job, headroom), peak


def fit_tier(job: Job, peak: float, headroom: float) -> int:
    """How sure a layout that fits (:func:`fits`) is to fit, in the robust pick's order: 0 where its
    memory band's upper end fits, 1 where its predicted peak does (the band straddles the usable
    memory), 2 where only the band's low end does (more likely than not to run out of memory)."""
    if fits_with_margin(job, peak, headroom):
        return 0
    return 1 if peak <= usable_bytes(job, headroom) else 2


def fits_within_tier(tier: int) -> Callable[[Job, float], tuple[bool, float]]:
    """:func:`fits`, holding a layout to :func:`fit_tier` ``tier`` or better: the robust pick's safer
    layouts."""
    def fit(job: Job, headroom: float) -> tuple[bool, float]:
        ok, peak = fits(job, headroom)
        return ok and fit_tier(job, peak, headroom) <= tier, peak
    return fit


def most_micro_batch(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, overheads: Overheads,
                     headroom: float, tp: int, cp: int, pp: int) -> float:
    """The largest micro-batch any layout of tensor-, context- and pipeline-parallel widths ``tp``,
    ``cp`` and ``pp`` could fit: the last pipeline stage of every layout holds the LM head's saved
    activations and the loss's gradients at its peak (``memory.stage_activation_bytes``), which neither
    recomputation nor offload removes, and they grow in proportion to the micro-batch (whole logits
    on every tensor-parallel rank where the engine gathers them without a pipeline:
    ``activations.logit_shards``)."""
    one = Layout(tp=tp, cp=cp, pp=pp)
    per_sequence = head_activation_bytes(model, training, one) + loss_gradient_bytes(model, one, training)
    usable = allocator_usable_bytes(cluster.gpu, overheads, headroom)
    return band_fit_limit(usable, model, cluster, training) / per_sequence
