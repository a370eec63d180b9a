"""The search space of `plan`: every layout worth scoring, with its memory and step time.

Layouts are enumerated structurally (tp, cp, pp, dp, pipeline partition, vpp) and then per
micro-batch, ZeRO stage, sequence parallelism and recomputation. Three dominance rules of
the cost model keep the table small without losing its optimum (the brute-force
enumerator in the tests checks this):

- With tensor parallelism, sequence parallelism always saves memory and moves the same
  collective volume (norms and dropout run on 1/t of the tokens); it costs no time unless
  the engine pays per collective call (a host cost, or a floor in pipelines across nodes:
  ``EngineBehaviour.costs_per_collective``; twice the calls: all-gather and reduce-scatter
  for each all-reduce). Where the engine offers the choice and pays no such cost, only
  ``sequence_parallel: true`` is scored.
- Recomputation only adds time, so for every other choice only the least recomputation
  that fits is scored: none, else selective at the lightest module set that fits (the sets
  are nested: :func:`selective_bundles`), or, where faster, full on the fewest layers per
  stage that fit (selective on every layer and full on a few are not ordered), else full on
  the fewest.
- Memory grows with the micro-batch, so once nothing fits at a micro-batch size, larger
  ones are skipped.

`plan`'s default, robust pick adds rules of its own (``robust``): a layout that cannot be among the
top_k + 1 fastest is skipped once a layout found that fits at its memory band's upper end comes
before it in the pick's order wherever it is within the margin of the fastest
(:meth:`_Search._threshold`, :class:`planner.search_bounds.SimplerFaster`).

The search is split by what it holds: the space it enumerates (:mod:`planner.search_space`), the
rows it works with (:mod:`planner.search_rows`), the least recomputation or offload that fits one
layout (:mod:`planner.search_recompute`), whether a layout fits (:mod:`planner.search_memory`) and
the bounds that skip a layout before the full cost model scores it (:mod:`planner.search_bounds`).
This module walks the groups, most promising first, and keeps what fits.
"""

from __future__ import annotations

import heapq
import math
from typing import Optional

from cost_models.dp_time import zero3_exposed_floor
from cost_models.specs import Job, Layout, SpecError
from cost_models.step_time import StepTime, step_time

from .case import Case
from .complexity import layout_complexity
from .engines.base import DEGREE_KEYS
from .limits import MAX_STEP_TIME_S
from .search_bounds import Incumbents, SimplerFaster, StepBounds, floor, offload_floor, states_cannot_fit, states_fit
from .search_memory import case_job, fit_limit, fit_tier, fits_with_margin, fits_within_tier
from .search_options import SearchSpec
from .search_recompute import least_activation_offload, least_recompute, offload_options, selective_bundles
from .search_rows import Candidate, Group, SearchResult
from .search_space import (MIN_TOKENS_PER_CP_RANK, UNEVEN_VPP, cp_too_thin, divisors, expert_options, family_members,
                           group_families, groups, partitions, structures)

# Names other modules and the tests import from here.
_floor, _states_cannot_fit = floor, states_cannot_fit
__all__ = ["MIN_TOKENS_PER_CP_RANK", "UNEVEN_VPP", "cp_too_thin", "Candidate", "SearchResult", "divisors",
           "expert_options", "offload_options", "partitions", "search", "selective_bundles", "structures"]


def search(case: Case, spec: SearchSpec, first_only: bool = False, keep_within: Optional[float] = None,
           ceiling: float = math.inf, robust: Optional[float] = None, safer: Optional[float] = None) -> SearchResult:
    """Score every non-dominated layout; return those that fit (with ``first_only``, stop at one).

    With ``ceiling`` (seconds), layouts whose step time cannot come under it are skipped too:
    `size` knows how slow a layout on this cluster may be and still matter.

    With ``keep_within`` (a fraction), layouts that cannot come within that share of the
    fastest found so far, nor among the top_k + 1 fastest, are skipped before their memory is
    scored: first on a lower bound per group and micro-batch (:class:`StepBounds`), then on
    their step with neither recomputation nor offload (:func:`floor`).

    With ``robust`` (the robust pick's margin, a fraction), only the layouts `plan`'s robust pick
    (``plan.robust_choice``) and its alternatives can be drawn from are kept: a layout that cannot be
    among the top_k + 1 fastest is skipped where one found fits at its memory band's upper end and
    comes first in the pick's order wherever the layout is within the margin of the fastest
    (:meth:`_threshold`).

    A ZeRO stage of a group whose model states alone overflow the GPU (:func:`states_fit`) is skipped
    before any of its layouts is timed or scored: none of them fits. The closest miss (``tightest``,
    the advice's where nothing fits) may be among them: :meth:`SearchResult.in_full`. Where they fit
    only with the optimizer offloaded, no layout without that offload is scored, and the offload's
    floor (:func:`offload_floor`) joins the bound.

    With ``safer`` (a margin; by default ``robust``'s), beside the least recomputation that fits a layout
    within that margin of the fastest, the least that fits in each surer tier (``search_memory.fit_tier``)
    is kept too: the robust pick prefers it within the margin (:meth:`_safer`).
    """
    return _Search(case, spec, first_only, keep_within, ceiling, robust=robust,
                   safer=robust if safer is None else safer).run()


class _Search:
    """One search: the incumbents, what was scored and pruned, and the closest miss so far."""

    def __init__(self, case: Case, spec: SearchSpec, first_only: bool, keep_within: Optional[float],
                 ceiling: float, skip_unfit: bool = True, robust: Optional[float] = None,
                 safer: Optional[float] = None):
        self.case, self.spec, self.first_only = case, spec, first_only
        self.safer = safer
        self.keep_within, self.ceiling = keep_within, ceiling
        # Without a threshold nothing is skipped on time: the groups are walked as enumerated.
        self.ordered = keep_within is not None or ceiling < math.inf
        self.incumbents = Incumbents(spec.top_k, keep_within, ceiling)
        # The robust pick's margin, and its candidates so far: those that fit at their band's upper end.
        self.robust = robust
        self.simpler = SimplerFaster() if robust is not None else None
        # No layout of the groups still to score is faster than this (their bounds are sorted).
        self._unscored_least = -math.inf
        self._zero3: dict[Group, float] = {}  # a group's ZeRO-3 traffic per micro-batch (_zero3_traffic)
        self.result = SearchResult(candidates=[], scored=0)
        self._tightest_peak = math.inf
        # Whether a ZeRO stage whose model states alone overflow the GPU is skipped before its
        # layouts are timed or scored, and how many were.
        self.skip_unfit = skip_unfit
        self.unfit_skipped = 0

    def note_miss(self, job: Job, peak: float) -> None:
        """Keep the scored layout closest to fitting on the GPU, for the advice when nothing fits."""
        if peak <= fit_limit(job, self.spec.headroom):
            self.result.host_misses += 1  # it missed on host memory: said beside the GPU's closest miss
            return
        if not self._obeys_pins(job.layout):
            return  # an offload tried beside a pinned one: no layout the case would take
        if peak < self._tightest_peak:
            self._tightest_peak, self.result.tightest = peak, job

    def run(self) -> SearchResult:
        if not self.ordered:  # nothing is skipped on time: the groups as enumerated
            for group in groups(self.case, self.spec):
                if self._score_group(group, {}):
                    break
        else:
            self._walk_by_bounds()
        if self.safer is not None and not self.first_only:
            self._add_safer()
        if self.unfit_skipped and not self.first_only:
            # Where nothing fits, the advice's closest miss may be among the layouts the skip left
            # unscored: the search without the skip finds it, should it be asked for.
            self.result.rescore = lambda: _Search(self.case, self.spec, False, self.keep_within, self.ceiling,
                                                  skip_unfit=False, robust=self.robust, safer=self.safer).run()
        return self.result

    def _walk_by_bounds(self) -> None:
        """Score the groups in the order of their least bound (:class:`StepBounds`), ties in the order
        enumerated, so that a good incumbent prunes early, until the next cannot do better.

        A group whose bounds cost more (an MoE model's) enters the queue at a cheaper bound under them
        (:meth:`StepBounds.least`), is bounded in full only when that comes up, and queued again at its
        own: no group comes up before one whose own bound is less, so the order is the one all the
        bounds would give, and groups that never come up are never bounded in full."""
        step_bounds = StepBounds(self.case)
        # (bound, place in the enumeration, group, its bounds or None, the (ep, etp) of its family
        # where it stands for the family still). The cheap bound leaves out ep: a family of groups
        # that differ only in it enters once (:func:`group_families`), and its groups are built
        # and bounded in full only when it comes up, each at its own place in the enumeration.
        Entry = tuple[float, tuple[int, int], Group, Optional[dict[int, float]], tuple]
        queue: list[Entry] = []

        def in_full(group: Group, place: tuple[int, int]) -> Entry:
            bounds = step_bounds.of(group)
            return min(bounds.values()), place, group, bounds, ()

        for index, (head, grids) in enumerate(group_families(self.case, self.spec)):
            cheap = step_bounds.least(head)
            if cheap is None:  # a dense model's bounds cost no more: its family is its one group
                queue += [in_full(group, (index, j)) for j, group in enumerate(family_members(head, grids))]
            else:
                queue.append((cheap, (index, -1), head, None, grids))
        heapq.heapify(queue)
        while queue:
            least, place, group, bounds, grids = heapq.heappop(queue)
            if least > self.incumbents.threshold:  # none after can do better
                self.result.pruned += sum(len(q[2].micro_batches) * max(len(q[4]), 1)
                                          for q in [(least, place, group, bounds, grids), *queue])
                return
            if bounds is None:
                for j, member in enumerate(family_members(group, grids)):
                    heapq.heappush(queue, in_full(member, (place[0], j)))
                continue
            self._unscored_least = least
            if self._score_group(group, bounds):
                return

    def _score_group(self, group: Group, bounds: dict[int, float]) -> bool:
        """Score the group's layouts, ZeRO stage by ZeRO stage; True once ``first_only`` has its layout."""
        engine = self.spec.engine
        fitted_without_recompute: set[int] = set()  # micro-batches where ZeRO 1 fitted with no recomputation
        for zero in group.zeros:
            if not engine.allows(group.tp, group.pp, group.cp, group.vpp, zero, group.sequence_parallel,
                                 "none" if "none" in engine.recompute else engine.recompute[0]):
                continue
            if self.first_only and states_cannot_fit(self.case, self.spec,
                                                     group.layout(min(group.micro_batches), zero)):
                # Only whether anything fits is asked: no layout of this ZeRO stage can, and the
                # closest miss (the advice's) is not needed.
                self.result.pruned += len(group.micro_batches)
                continue
            if self._score_zero_stage(group, zero, bounds, fitted_without_recompute):
                return True
        return False

    def _degrees_refused(self, base: Layout) -> bool:
        """Whether the engine refuses ``base``'s degrees themselves (a problem keyed on one of
        ``engines.base.DEGREE_KEYS``), which no recomputation, offload or micro-batch changes."""
        try:
            job = case_job(self.case, base)
        except SpecError:
            return False
        return any(key in DEGREE_KEYS for key, _ in self.spec.runner.problems(job))

    def _score_zero_stage(self, group: Group, zero: int, bounds: dict[int, float],
                          fitted_without_recompute: set[int]) -> bool:
        """Score one ZeRO stage of the group, micro-batch by micro-batch, smallest first."""
        result, training = self.result, self.case.training
        at_least = 1  # fewest recomputed layers found at the last micro-batch
        states_checked = self.first_only  # first_only checked the ZeRO stage's model states already
        degrees_checked = False
        # Where the model states fit only under offload: every layout that fits offloads the
        # optimizer, and its step takes at least this more than its floor.
        needs_offload, offload_least = False, 0.0
        for index, mbs in enumerate(group.micro_batches):
            # ZeRO 2 takes the time of ZeRO 1 and only saves memory: where ZeRO 1 fits with no
            # recomputation, ZeRO 2 cannot win. Not where ZeRO 1 gathers in the step and ZeRO 2
            # (plain FSDP's) behind the next forward; nor for the robust pick, which prefers a layout
            # surer to fit and is simpler at ZeRO 2 than at ZeRO 3 (Llama 2 7B on 8 A100s of 40 GB:
            # ZeRO 2 recomputing one layer fits at its band's upper end, 2.4 % faster than the ZeRO 3
            # it picked instead).
            if zero == 2 and mbs in fitted_without_recompute and not training.engine.zero1_gather_in_step \
                    and self.safer is None:
                continue
            if self.ordered and bounds[mbs] + offload_least > self.incumbents.threshold:
                # Past the incumbents' threshold, which every layout's own (_threshold) lies under,
                # before the ZeRO-3 traffic adds to the bound: no layout need be built to skip it.
                result.pruned += 1
                continue
            base = group.layout(mbs, zero)
            threshold = self._threshold(base)
            # What the bound leaves out and every layout built on base takes: ZeRO-3's traffic, and
            # the offload the model states need. Only a search that compares times needs it (not one
            # that asks only whether anything fits: the advice's, where it took 40 % of the time).
            traffic = self._zero3_traffic(group, base) if self.ordered or threshold < math.inf else 0.0
            if self.ordered and bounds[mbs] + traffic + offload_least > threshold:
                result.pruned += 1
                continue
            if not degrees_checked:
                # Before the first layout of the ZeRO stage is timed or scored: degrees the engine refuses
                # (context parallelism that does not divide GPT-OSS's key-value groups, say) it refuses
                # at every micro-batch, recomputation and offload, each of which was built to be refused
                # (GPT-OSS 20B at 2^20 tokens on 1,024 H100s, Megatron alone: 20 s of 23).
                degrees_checked = True
                if self._degrees_refused(base):
                    result.pruned += len(group.micro_batches) - index
                    return False
            if not states_checked:
                # Before the first layout of the ZeRO stage is timed or scored: where the model states
                # alone overflow the GPU, neither this micro-batch nor a larger one fits.
                states_checked = True
                where = states_fit(self.case, self.spec, base) if self.skip_unfit else "plain"
                if where is None:
                    self.unfit_skipped += 1
                    result.pruned += len(group.micro_batches) - index
                    return False
                if where == "offload":
                    needs_offload, offload_least = True, offload_floor(self.case, self.spec, base)
                    if self.ordered and bounds[mbs] + traffic + offload_least > threshold:
                        result.pruned += 1
                        continue
            time = None
            if threshold < math.inf:
                # The floor's own step holds the traffic, not the offload (base offloads nothing).
                least, time = floor(self.case, base, threshold - traffic - offload_least)
                if least + (traffic if time is None else 0.0) + offload_least > threshold:
                    result.pruned += 1
                    continue
            plain = None if needs_offload else self._least_plain(group, zero, base, at_least)
            hits = [plain] if plain is not None else []
            if plain is not None:
                if plain[0].layout.recompute == "none" and zero == 1:
                    fitted_without_recompute.add(mbs)
                at_least = plain[0].layout.recompute_num_layers or at_least
            # Offload only adds time: worth scoring only where memory forces recomputation, or
            # where nothing fits without it.
            if plain is None or plain[0].layout.recompute != "none":
                # With a hit already (plain's), whether the micro-batch has one, on which the walk stops
                # (below), is settled: an offload's ladder may then be skipped on its time alone.
                hits += self._least_offloaded(group, zero, base, activations=not needs_offload,
                                              options=not (hits and self._offload_too_slow(base, time)))
            if not hits:
                break  # a larger micro-batch needs more memory still
            if self._keep(hits, base, time):
                return True
        return False

    def _zero3_traffic(self, group: Group, base: Layout) -> float:
        """What a ZeRO-3 layout's step adds to the group's bound (:class:`StepBounds`, which holds no
        data-parallel traffic): each micro-batch's gathers and reduce-scatters, at the least any
        compute leaves of them (``dp_time.zero3_exposed_floor``); 0 at ZeRO 0-2."""
        if base.zero_stage != 3:
            return 0.0
        if group not in self._zero3:
            try:
                job = case_job(self.case, base)
            except SpecError:
                return 0.0
            self._zero3[group] = zero3_exposed_floor(job)
        return self.case.training.global_batch_size // (base.micro_batch_size * base.dp) * self._zero3[group]

    def _threshold(self, base: Layout) -> float:
        """How slow a layout built on ``base`` may be and still matter: within the table's slack of the
        fastest, or among the top_k + 1 (:class:`Incumbents`). For the robust pick, beyond the top_k + 1
        (``plan.robust_choice``: among the layouts within the margin of the fastest, the first that fits
        at its band's upper end, then the simplest, then the fastest), a layout at least as complex as
        ``base`` (recomputation and offload only add to it) matters only while no layout found that fits
        at its band's upper end comes before it wherever it is within the margin of the fastest:

        - one no more complex and faster (:meth:`SimplerFaster.slowest_pick`): wherever the layout is
          within the margin, so is that one;
        - one less complex and within the margin of the fastest there can be, which no layout still to
          score is faster than the least of their bounds (the groups come in the order of their
          bounds): then it is within the margin whatever the fastest, and the layout matters only
          among the top_k + 1.
        """
        threshold = self.incumbents.threshold
        if self.simpler is None:
            return threshold
        complexity = layout_complexity(base, self.case.training.global_batch_size)
        kth = self.incumbents.kth
        fastest_there_can_be = min(self.incumbents.fastest, self._unscored_least)
        if self.simpler.fastest_simpler(complexity) <= fastest_there_can_be * (1 + self.robust):
            return min(threshold, kth)
        return min(threshold, max(kth, self.simpler.slowest_pick(complexity)))

    def _least_plain(self, group: Group, zero: int, base: Layout, at_least: int) -> Optional[tuple[Job, float]]:
        """The least recomputation that fits with no offload, where the ZeRO stage and the pins allow none."""
        spec = self.spec
        if zero in group.offload_only or not (spec.admits("offload_optimizer", 0.0) and spec.admits(
                "offload_params", False) and spec.admits("offload_activations", 0)):
            return None
        hit, scored = least_recompute(self.case, spec, base, at_least, self.note_miss)
        self.result.scored += scored
        return hit

    def _add_safer(self) -> None:
        """Once the fastest is known: the safer twins (:meth:`_safer`) of the layouts within ``safer`` of
        it, but of those a layout found that fits at its band's upper end rules out (no more complex
        than the twin's layout without recomputation, and no slower than the layout itself: it comes
        first wherever the twin, slower and no simpler, would be within the margin)."""
        limit = self.incumbents.fastest * (1 + self.safer)
        gbs = self.case.training.global_batch_size
        for candidate in [c for c in self.result.candidates if c.step_time_s <= limit]:
            plain = _without_recompute(candidate.layout)
            if self.simpler is not None and self.simpler.slowest_pick(layout_complexity(plain, gbs)) \
                    <= candidate.step_time_s:
                continue
            for job, peak in self._safer((candidate.job, candidate.peak_bytes)):
                if self._obeys_pins(job.layout):
                    time = step_time(job)
                    if time.total <= limit:
                        self.result.candidates.append(Candidate(job.layout, time.total, peak, job, time, safer=True))

    def _safer(self, hit: tuple[Job, float]) -> list[tuple[Job, float]]:
        """For the robust pick, beside the least recomputation that fits (``hit``) where it is not sure
        to (``search_memory.fit_tier`` above 0): the least recomputation on the same layout in each surer
        tier, which the pick prefers within the margin of the fastest (Llama 3 70B on 8 A100s of 40 GB:
        40 layers recomputed peak at 42.8 GB of 41.4 usable, 50 at 41.4 GB, 1.9 % slower); where the hit
        offloads activations, the fewest layers offloaded in each surer tier."""
        tier = fit_tier(hit[0], hit[1], self.spec.headroom)
        if tier == 0:
            return []
        lay = hit[0].layout
        base = _without_recompute(lay) \
            if self.spec.admits("recompute", "none") else lay
        safer = []
        for surer in range(tier):
            try:
                if lay.offload_activations and "offload_activations" not in self.spec.pins:
                    # More layers' activations offloaded, where the hit offloads some: 46 of 80 layers put
                    # Llama 3 70B on 128 V100s over the usable memory as predicted, where 64 fit as
                    # predicted in the same step (the copies hidden behind compute).
                    safe, scored = least_activation_offload(self.case, self.spec,
                                                            lay.with_changes(offload_activations=0),
                                                            lambda job, peak: None, fits_within_tier(surer))
                else:
                    safe, scored = least_recompute(self.case, self.spec, base, 1, lambda job, peak: None,
                                                   fits_within_tier(surer), after=lay)
            except SpecError:
                continue
            self.result.scored += scored
            if safe is not None and safe[0].layout != lay and all(s[0].layout != safe[0].layout for s in safer):
                safer.append(safe)
        return safer

    def _offload_too_slow(self, base: Layout, time: Optional[StepTime]) -> bool:
        """Whether no layout on ``base`` that offloads the optimizer can matter, so that the ladders of the
        offloads need not be scored: where ``base``'s own step (``time``, the floor: neither recomputation
        nor offload, each of which only adds to it) and the least the offload adds to any step, its
        optimizer step on the CPU and the weights back in at the least share the search offloads
        (:func:`offload_floor`), pass the incumbents' threshold. (The search already prunes a
        micro-batch whose model states need the offload on that sum.)

        That threshold only falls as the search goes on, and at the end is at least the slowest of the
        top_k + 1 fastest and the table's slack past the fastest: such a layout, should it fit, is in
        neither ``plan._table`` (which keeps those within the slack of the fastest, or else the top_k + 1
        fastest) nor (the slack being no less than the robust pick's margin) within that margin, where
        ``_add_safer`` looks. Kept, it would move no threshold: slower than the slowest of
        the top_k + 1 fastest, :class:`Incumbents` would push it and pop it again, and :class:`SimplerFaster` would give :meth:`_threshold` no
        figure under the incumbents' threshold, of which it takes the least, nor one within the margin of
        the fastest there can be. Its misses only name the closest miss, read where nothing fits: a
        threshold under ``MAX_STEP_TIME_S`` means the top_k + 1 layouts found fit within what the table
        keeps, each obeying the pins the solver holds it to; where the case bounds a field the solver
        weighs, or under a ceiling (which the threshold may lie under), the skip is not made. Only
        ``search.fitting`` and `plot`'s cloud of the fitting layouts scored count such layouts."""
        threshold = self.incumbents.threshold
        # Finite without a ceiling: top_k + 1 layouts found, and the threshold at least the slowest of them and
        # the slack past the fastest (Incumbents.add), a slack no less than the robust pick's margin.
        if time is None or self.ceiling < math.inf or threshold > MAX_STEP_TIME_S or self.spec.bounds or \
                (self.robust is not None and (self.keep_within or 0.0) < self.robust):
            return False
        return time.total + offload_floor(self.case, self.spec, base) > threshold

    def _least_offloaded(self, group: Group, zero: int, base: Layout, activations: bool = True,
                         options: bool = True) -> list[tuple[Job, float]]:
        """The least recomputation that fits under each offload the engine runs (not without ``options``:
        :meth:`_offload_too_slow`), and (with ``activations``: not where
        only an offloaded optimizer lets the states fit) the fewest layers' activations offloaded that fit."""
        hits = []
        for offload in offload_options(self.spec, zero) if options else ():
            hit, scored = least_recompute(self.case, self.spec, base.with_changes(**offload), 1, self.note_miss)
            self.result.scored += scored
            if hit is not None:
                hits.append(hit)
        if activations and zero not in group.offload_only:
            hit, scored = least_activation_offload(self.case, self.spec, base, self.note_miss)
            self.result.scored += scored
            if hit is not None:
                hits.append(hit)
        return hits

    def _obeys_pins(self, layout: Layout) -> bool:
        """Whether ``layout`` holds every value the case's ``search`` section pins: the search
        scores some layouts beside a pinned choice (each offload the engine runs), and none that
        breaks a pin may reach the table."""
        return all(self.spec.admits(name, layout.expert_tp if name == "etp" else getattr(layout, name))
                   for name in self.spec.pins)

    def _keep(self, hits: list[tuple[Job, float]], base: Layout, time: Optional[StepTime]) -> bool:
        """Time the layouts that fit (``base``'s own step is ``time``, where the floor priced it)
        and keep them; True once ``first_only`` has its layout."""
        for job, peak in hits:
            if not self._obeys_pins(job.layout):  # an offload tried beside a pinned one, say
                continue
            timed = time if time is not None and job.layout == base else step_time(job)
            seconds = timed.total
            self.result.candidates.append(Candidate(job.layout, seconds, peak, job, timed))
            if self.first_only:
                return True
            self.incumbents.add(seconds)
            if self.simpler is not None and fits_with_margin(job, peak, self.spec.headroom):
                self.simpler.add(layout_complexity(job.layout, self.case.training.global_batch_size), seconds)
        return False


def _without_recompute(layout: Layout) -> Layout:
    """``layout`` with no activation recomputation: the plainer twin the robust pick weighs."""
    return layout.with_changes(recompute="none", recompute_num_layers=None, recompute_modules=None)
