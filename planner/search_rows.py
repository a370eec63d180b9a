"""The rows `plan`'s search works with: a group of layouts scored together, its bounds, and each
layout that fits (:mod:`planner.search`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from cost_models.frozen import cached_property
from cost_models.specs import Job, Layout
from cost_models.step_time import StepTime


@dataclass(frozen=True)
class Candidate:
    """One scored layout that fits, with the job and step time the search computed for it
    (`plan` reports its winners from these rather than timing them again)."""

    layout: Layout
    step_time_s: float
    peak_bytes: float
    job: Optional[Job] = None
    time: Optional[StepTime] = None
    # A surer-to-fit twin of a layout the search found (more recomputation: search._Search._safer),
    # kept for the robust pick alone, not as one of the runners-up.
    safer: bool = False

    @property
    def searched_job(self) -> Job:
        """The job the search scored; a candidate built without one (a solver's table in a test) has
        none to estimate or rank by fit."""
        if self.job is None:
            raise ValueError(f"the candidate {self.layout} carries no job: only the search's are estimated")
        return self.job


@dataclass
class SearchResult:
    candidates: list[Candidate]
    scored: int  # layouts whose memory was evaluated
    tightest: Optional[Job] = None  # of those that do not fit, the closest to fitting, for advice
    pruned: int = 0  # layouts skipped because they could not be fast enough to matter, or fit
    host_misses: int = 0  # layouts the GPU holds whose offload overflows the host's memory
    # Where the search skipped ZeRO stages whose model states alone overflow the GPU, leaving their
    # layouts unscored: the same search without that skip (:meth:`in_full`).
    rescore: Optional[Callable[[], "SearchResult"]] = field(default=None, repr=False, compare=False)

    def in_full(self) -> "SearchResult":
        """The search as it runs when it skips no ZeRO stage on its model states: the same layouts
        fit, and where none does, its ``tightest`` is the closest miss among all it scores."""
        return self.rescore() if self.rescore is not None else self


@dataclass(frozen=True)
class Group:
    """Layouts scored together: one grid (tp, cp, pp, dp), pipeline split, sequence parallelism
    and expert grid, over the ZeRO stages and micro-batch sizes the engine and the case allow."""

    tp: int
    cp: int
    pp: int
    dp: int
    partition: Optional[tuple[int, ...]]  # the layout's stage_layers: None for the engine's own split
    stage_layers: tuple[int, ...]  # the layers per (virtual) stage the bounds count
    vpp: int
    sequence_parallel: bool
    ep: int
    etp: Optional[int]
    zeros: tuple[int, ...]  # ZeRO stages to score, in order
    offload_only: frozenset[int]  # of those, stages scored only for the offload they allow
    micro_batches: tuple[int, ...]  # ascending

    def layout(self, micro_batch_size: int, zero_stage: int) -> Layout:
        """The group's layout at this micro-batch and ZeRO stage, with neither recomputation nor offload
        (its degrees checked once, in :attr:`_degrees`)."""
        return self._degrees.at_micro_batch(micro_batch_size, zero_stage)

    @cached_property
    def _degrees(self) -> Layout:
        """The group's degrees as a layout (one sequence a micro-batch, ZeRO 0), built with every check."""
        return Layout(dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp, vpp=self.vpp,
                      sequence_parallel=self.sequence_parallel, stage_layers=self.partition, ep=self.ep, etp=self.etp)
