"""`plan`: the fastest layout that fits at the case's global batch, its runners-up, and advice when nothing fits."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Optional, Union

from cost_models.memory import peak_stage_memory, usable_bytes
from cost_models.specs import Job, Layout

from .api_values import BoolArg, CaseArg, FloatArg, IntArg
from .bands import NO_GAP, fit_limit, pick_margin
from .case import CASE_ENGINES, Case, check_batch_tokens, load_case, profile_warnings, spec_errors
from .complexity import COMPLEXITY_ORDER, complexity
from .engines import ENGINES
from .errors import CaseError, one_line, safe_repr
from .fields import canonical_choice, read_bool
from .fitted import other_fabric_notes
from .estimate import Estimate, check_step_time, estimate_job, layout_section
from .search_memory import fit_tier
from .limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS, MAX_SIMPLEST_WITHIN_PCT, MAX_STEP_TIME_S, MAX_TOP_K
from .search import search
from .search_rows import Candidate, SearchResult
from .search_options import SearchSpec, retarget
from .units import UnitError, figure_text, parse_tokens, run_days, run_days_band, whole_bytes

# The solver's table holds every fitting layout within this share of the fastest (or the
# --simplest-within margin, if wider), and at least the top-k: all that the answer,
# its alternatives and the simplest-within choice can be drawn from.
TABLE_SLACK = 0.05
# How sure a layout is to fit, by its ``search_memory.fit_tier``, as the report says it.
FIT_TIER_TEXT = ("fits at the upper end of its memory band", "fits as predicted", "fits only at its band's low end")
# Layout keys that mean something under one recomputation mode only (Layout refuses them under
# another): compared between two layouts only where both run that mode.
RECOMPUTE_MODE_OF = {"recompute_num_layers": "full", "recompute_modules": "selective"}


def _table(candidates: list[Candidate], slack: float, top_k: int) -> list[Candidate]:
    by_time = sorted(candidates, key=lambda c: c.step_time_s)
    if not by_time:
        return []
    limit = by_time[0].step_time_s * (1 + slack)
    within = [c for c in by_time if c.step_time_s <= limit]
    return within if len(within) > top_k else by_time[:top_k + 1]


@dataclass(frozen=True)
class NoFit:
    """Why nothing fits, and the smallest changes that would."""

    # Compared by value, never hashed, as every result the API returns (docs/commands.md, Python API): most
    # hold dicts, which may change after hashing; hash() names the type rather than failing on a dict inside.
    __hash__ = None  # type: ignore[assignment]

    term: str  # the largest memory term of the layout closest to fitting
    peak_bytes: float
    limit_bytes: float
    # The job of the layout closest to fitting (its layout: closest_layout), kept whole as the other
    # layouts' below: the case-file section a JSON output prints is the job's (estimate.layout_section).
    closest_job: Optional[Job]
    gpus_that_fit: Optional[int]  # the fewest GPUs at which some layout fits
    seq_len_that_fits: Optional[int]  # the longest sequence (same GPUs) at which some layout fits
    # When no layout was scored at all: what excluded every one (the pins, the engine, ...).
    excluded_by: Optional[str] = None
    # Where no layout of these GPUs exists (their count shares too little with the batch, the heads
    # and the layers: 1,000 GPUs for a batch of 1,024), the whole-node size below (down to half the
    # nodes) whose fastest layout that fits runs the most tokens/s, with those tokens/s and that layout
    # (:func:`_fewer_gpus`). The most GPUs below that have a layout can be a slow, odd one (992 GPUs
    # for Llama 3 8B at that batch: pp 31, half the tokens/s of 768): said beside it, with its tokens/s.
    fewer_gpus_that_fit: Optional[int] = None
    # Whether layouts that offload enough for the GPU to hold their peak overflowed the host's memory:
    # the closest miss alone read as the GPU's memory being all that stood in the way.
    host_overflowed: bool = False
    # With no engine named: the engine whose advice this is, the one whose layouts come closest
    # (fewest GPUs that fit, then the smallest peak) of those `plan` decides between; where none has a
    # layout of these GPUs at all, the one whose size below (fewer_gpus_that_fit) runs fastest.
    engine: Optional[str] = None
    # The figures of fewer_gpus_that_fit's fastest layout, and the most GPUs below that have a layout
    # that fits, with theirs (the same size where it is the fastest).
    fewer_gpus_tokens_per_s: Optional[float] = None
    fewer_gpus_mfu: Optional[float] = None
    fewer_gpus_job: Optional[Job] = None
    most_fewer_gpus_that_fit: Optional[int] = None
    most_fewer_gpus_tokens_per_s: Optional[float] = None
    most_fewer_gpus_mfu: Optional[float] = None
    most_fewer_gpus_job: Optional[Job] = None
    # Where the search section pins or bounds choices and a layout of these GPUs fits without them: the
    # keys it narrows (:func:`narrowed_keys`), the cause, where the advice's GPUs and sequences, searched
    # under the same pins, said nothing or blamed the cluster.
    fits_without: Optional[tuple[str, ...]] = None

    @property
    def closest_layout(self) -> Optional[Layout]:
        return _layout(self.closest_job)

    @property
    def fewer_gpus_layout(self) -> Optional[Layout]:
        return _layout(self.fewer_gpus_job)

    @property
    def most_fewer_gpus_layout(self) -> Optional[Layout]:
        return _layout(self.most_fewer_gpus_job)

    def describe(self) -> str:
        known_layout = self.closest_layout is not None
        if self.closest_layout is None:
            parts = [f"no layout fits: {self.excluded_by or 'no layout could be scored'}"]
        else:
            parts = [f"no layout fits: the {self.term} term overflows (closest layout needs "
                     f"{self.peak_bytes / 1e9:.1f} GB; a predicted peak up to {self.limit_bytes / 1e9:.1f} GB fits, "
                     f"its memory band's low end within the usable memory)"]
        if self.host_overflowed:
            parts.append("layouts offloading enough for the GPU overflow the host's memory")
        if self.fits_without:
            verb = "leaves" if len(self.fits_without) == 1 else "leave"
            parts.append(f"the search section's {', '.join(self.fits_without)} {verb} none that fits: "
                         "without them a layout of these GPUs fits")
        if self.fewer_gpus_that_fit:
            text = f"{self.fewer_gpus_that_fit} GPUs would have a layout that fits"
            if self.fewer_gpus_tokens_per_s is not None:
                differs = self.most_fewer_gpus_that_fit != self.fewer_gpus_that_fit
                speed = _speed_text(self.fewer_gpus_tokens_per_s, self.fewer_gpus_mfu, self.fewer_gpus_layout)
                # The fastest layout's figures, as `size` compares sizes: `plan` there picks the robust one.
                text += (f", {'the' if differs else 'the most below and the'} fastest of the whole-node sizes "
                         f"below down to half these GPUs: its fastest layout (`plan --fastest`) runs {speed}")
                if differs and self.most_fewer_gpus_that_fit:
                    most = _speed_text(self.most_fewer_gpus_tokens_per_s, self.most_fewer_gpus_mfu,
                                       self.most_fewer_gpus_layout)
                    text += f"; the most GPUs below that have one, {self.most_fewer_gpus_that_fit}, would run {most}"
            parts.append(text)
        if self.gpus_that_fit:
            parts.append(f"{self.gpus_that_fit} GPUs would fit")
        if self.seq_len_that_fits:
            parts.append(f"seq_len {self.seq_len_that_fits} would fit")
        if self.engine:
            parts.append(f"{self.engine}'s layouts, which come closest of the engines planned" if known_layout
                         else f"{self.engine}'s layouts, the engine planned whose size below runs fastest")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        known = self.closest_layout is not None
        return {"term": self.term if known else None,
                "peak_bytes": whole_bytes(self.peak_bytes) if known else None,
                "limit_bytes": whole_bytes(self.limit_bytes),
                "closest_layout": _mapping(self.closest_job),
                "gpus_that_fit": self.gpus_that_fit, "seq_len_that_fits": self.seq_len_that_fits,
                "excluded_by": self.excluded_by, "fewer_gpus_that_fit": self.fewer_gpus_that_fit,
                "fewer_gpus_tokens_per_s": self.fewer_gpus_tokens_per_s, "fewer_gpus_mfu": self.fewer_gpus_mfu,
                "fewer_gpus_layout": _mapping(self.fewer_gpus_job),
                "most_fewer_gpus_that_fit": self.most_fewer_gpus_that_fit,
                "most_fewer_gpus_tokens_per_s": self.most_fewer_gpus_tokens_per_s,
                "most_fewer_gpus_mfu": self.most_fewer_gpus_mfu,
                "most_fewer_gpus_layout": _mapping(self.most_fewer_gpus_job),
                "host_overflowed": self.host_overflowed, "engine": self.engine,
                "fits_without": list(self.fits_without) if self.fits_without else None}


def _layout(job: Optional[Job]) -> Optional[Layout]:
    return job.layout if job is not None else None


def _mapping(job: Optional[Job]) -> Optional[dict[str, Any]]:
    """The job's layout in the case-file schema, as `estimate --json` prints its own (None for none)."""
    return layout_section(job) if job is not None else None


def _speed_text(tokens_per_s: Optional[float], mfu: Optional[float], layout: Optional[Layout]) -> str:
    """A size's fastest layout in a few words: its tokens/s, MFU and grid."""
    grid = "" if layout is None else ", ".join(
        f"{key} {getattr(layout, key)}" for key in ("dp", "tp", "pp", "cp", "ep")
        if key in ("dp", "tp", "pp") or getattr(layout, key) > 1)
    mfu_text = "" if mfu is None else f", MFU {mfu:.1%}"
    return f"{tokens_per_s or 0:,.0f} tokens/s{mfu_text}" + (f" ({grid})" if grid else "")


@dataclass(frozen=True)
class Plan:
    # Compared by value, never hashed, as every result the API returns (docs/commands.md, Python API): most
    # hold dicts, which may change after hashing; hash() names the type rather than failing on a dict inside.
    __hash__ = None  # type: ignore[assignment]

    status: str  # CP-SAT's status: OPTIMAL, or INFEASIBLE when nothing fits
    best: Optional[Estimate]
    alternatives: tuple[Estimate, ...]
    scored: int  # layouts whose memory was evaluated
    fitting: int  # of those, layouts that fit
    pruned: int = 0  # layouts skipped as provably too slow to be the answer or an alternative
    no_fit: Optional[NoFit] = None
    # (step time s, peak bytes) of every fitting layout scored: the cloud the Pareto plot shows.
    candidates: tuple[tuple[float, float], ...] = ()
    headroom: float = 0.0  # share of GPU memory every layout had to leave free
    # How the best was chosen: among the layouts within ``margin`` of the fastest (the gap the model
    # cannot tell apart, ``bands.indistinguishable_gap``, or --simplest-within's: ``margin_set_by``
    # "model" or "simplest_within"; "fastest", margin 0, under --fastest), the surest to fit (its memory band's upper end fits, else its
    # predicted peak: ``search_memory.fit_tier``), then the simplest. ``picked_on`` says what set the
    # fastest aside (:func:`picked_on`): "speed" where nothing did (--fastest, or the fastest is the
    # pick), "fit" where the pick is surer to fit, "simplicity" where it is as sure and simpler.
    # ``fastest`` is the raw optimum where it differs.
    picked_on: str = "speed"
    margin: float = 0.0
    margin_set_by: str = "model"
    fastest: Optional[Estimate] = None
    # With no engine named (``any``), the plan of each engine that can run the case, by name (None
    # with the reason where it cannot), and the pick among their bests (the engine of ``best``).
    engines: tuple[tuple[str, Optional["Plan"], str], ...] = ()
    # What the case gives that `plan` does not read (a layout section, `size`'s cluster keys): the CLI
    # prints these on stderr, and the API's caller had no way to learn them.
    notes: tuple[str, ...] = ()
    # What makes the case's hardware profile doubtful (``case.profile_warnings``), which the CLI says on
    # stderr: a script reading the JSON alone could not tell its figures rest on such a profile.
    warnings: tuple[str, ...] = ()
    tokens: Optional[float] = None  # the run's tokens (`plan --tokens`), for the days the best takes
    # Where the best's predicted peak is over the usable memory (within it only at its band's low end:
    # more likely than not to run out by the model's own median), the fastest layout scored whose
    # predicted peak fits, and the fastest that fits at its band's upper end (:func:`surer_layouts`);
    # None where the best fits as predicted, or where the search scored no such layout. The pick stays
    # what the margin gives (docs/robust-plans.md): these say what a layout that fits costs.
    fits_as_predicted: Optional[Estimate] = None
    fits_at_band_upper: Optional[Estimate] = None

    @property
    def days(self) -> Optional[float]:
        """Days the best layout takes for the run's tokens, as `size` counts them; None without either."""
        return None if self.tokens is None or self.best is None else run_days(self.tokens, self.best.tokens_per_s)

    @property
    def days_band(self) -> Optional[tuple[float, float]]:
        """The days at the ends of the best's 80 % tokens/s band, fast end first, as `size`'s days_band
        gives them; None where ``days`` is, or where the best has no band (CPUs)."""
        band = None if self.best is None else self.best.tokens_per_s_band
        return None if self.tokens is None or band is None else run_days_band(self.tokens, band)

    def picked(self, reader: str) -> Estimate:
        """The best, for ``reader`` (a method of the plan's, or a caller that kept only plans with one);
        a CaseError where the plan found no layout."""
        if self.best is None:
            raise CaseError(reader, "best", f"the plan found no layout ({self.status})")
        return self.best

    def differences(self, other: Estimate) -> dict[str, list]:
        """Layout fields where ``other`` differs from the best: {field: [best, other]}, led by the
        engine where another engine runs it (the fastest of a case naming none may be another
        engine's: its layout alone named a change the pick's engine may not run)."""
        mine, theirs = self.picked("Plan.differences").to_dict(), other.to_dict()
        keys = ["engine", "grad_accum"] + list(dict.fromkeys(list(mine["layout"]) + list(theirs["layout"])))
        # A key of one recomputation mode says nothing of a layout in another: recompute none→full is
        # the difference, and its layers unset on the side without full read "2→all" (all layers
        # recomputed, where that side recomputes none; Megatron reads --recompute-num-layers only
        # with --recompute-granularity full, --recompute-modules only with selective).
        keys = [k for k in keys if RECOMPUTE_MODE_OF.get(k) is None
                or mine["layout"].get("recompute") == theirs["layout"].get("recompute") == RECOMPUTE_MODE_OF[k]]

        def value(estimate: dict, key: str) -> Any:
            if key == "grad_accum":
                return estimate[key]
            if key == "engine":
                return estimate["training"]["engine"]
            # A layout that leaves the experts' split unsaid runs ep 1 and etp = tp (Layout.expert_tp).
            section = estimate["layout"]
            return section[key] if key in section else {"ep": 1, "etp": section.get("tp", 1)}.get(key)

        out = {}
        for key in keys:
            a, b = value(mine, key), value(theirs, key)
            if a != b:
                out[key] = [a, b]
        return out

    def _rank_set_apart(self, runner: Estimate) -> Optional[str]:
        """What of the robust pick's order (:func:`robust_rank`) put ``runner`` below the best where
        the order did ("fit" or "complexity"); None where speed did: under --fastest, or beyond the
        margin, or as sure to fit and as simple. A tie on step time said "ranks lower as the more
        complex layout" of a simpler runner-up that --fastest had set below by 1.5 ms."""
        if self.margin_set_by == "fastest":
            return None
        best = self.picked("Plan._rank_set_apart")
        fastest = self.fastest if self.fastest is not None else best
        if runner.step_time_s > fastest.step_time_s * (1 + self.margin):
            return None
        ours, theirs = (robust_rank(_candidate_of(e), e.case)
                        for e in (best, runner))
        if theirs[0] != ours[0]:
            return "fit"
        return "complexity" if theirs[1] != ours[1] else None

    def why_runner_up_lost(self) -> Optional[str]:
        if self.best is None or not self.alternatives:
            return None
        runner = self.alternatives[0]
        gap = runner.step_time_s - self.best.step_time_s
        set_apart = self._rank_set_apart(runner)
        tie = abs(gap) <= 1e-3 * self.best.step_time_s
        if set_apart is not None and not tie and gap < 0:  # a slower, simpler (or safer) layout was picked
            within = (f"within the --simplest-within margin ({self.margin:.1%})" if self.margin_set_by == "simplest_within"
                      else f"within {self.margin:.1%} of the fastest, which the model cannot tell apart")
            # The same rule either way: a simpler layout that fits less surely is not the pick.
            why = (f"the surest to fit of the layouts {within} (at its memory band's upper end, else at its "
                   f"predicted peak), then the simplest")
            # figure_text: a gap on a 5 ms step was "0.000 s faster per step (-1.3%)"
            return f"{figure_text(-gap, 3)} s faster per step ({gap / self.best.step_time_s:+.1%}), but the pick is {why} " \
                   f"(order: {COMPLEXITY_ORDER})"
        if tie and set_apart == "fit":  # a tie on step time the robust order broke
            tiers = [fit_tier(e.job, e.peak.total, self.headroom) for e in (self.best, runner)]
            return (f"ties with the pick on step time and ranks lower as less sure to fit: it "
                    f"{FIT_TIER_TEXT[tiers[1]]}, where the pick {FIT_TIER_TEXT[tiers[0]]}")
        if tie and set_apart == "complexity":
            return f"ties with the pick on step time and ranks lower as the more complex layout " \
                   f"(order: {COMPLEXITY_ORDER})"
        if tie:  # speed set it below, by less than the 3 decimals of a second the slower case gives
            return (f"ties with the pick on step time but is {gap * 1e3:.1f} ms slower per step "
                    f"({gap / self.best.step_time_s:+.2%}), and the faster ranks first")
        mine, theirs = self.best.time.by_part(), runner.time.by_part()
        part = max(theirs, key=lambda k: theirs[k] - mine[k])
        return (f"{figure_text(gap, 3)} s slower per step ({gap / self.best.step_time_s:+.1%}), mostly "
                f"{part.removesuffix('_s')} ({figure_text(mine[part], 3)} s → {figure_text(theirs[part], 3)} s)")

    def _surer_dict(self, surer: Optional[Estimate]) -> Optional[dict[str, Any]]:
        """A layout surer to fit than the best (``fits_as_predicted``, ``fits_at_band_upper``) as the JSON
        gives it: its estimate, what differs from the best, and its step's cost against the best's (a share)."""
        if surer is None:
            return None
        best = self.picked("Plan._surer_dict")
        return {**surer.to_dict(), "differs_from_best": self.differences(surer),
                "step_time_cost": surer.step_time_s / best.step_time_s - 1}

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "best": self.best.to_dict() if self.best else None,
            "alternatives": [{**alt.to_dict(), "differs_from_best": self.differences(alt)}
                             for alt in self.alternatives],
            "runner_up_lost_because": self.why_runner_up_lost(),
            "engines": {name: ({"tokens_per_s": p.best.tokens_per_s, "step_time_s": p.best.step_time_s,
                                "memory_verdict": p.best.memory_verdict, "layout": p.best.layout_mapping(),
                                **({"note": why} if why else {})}
                               if p is not None and p.best is not None else {"why_not": why or "nothing fits"})
                        for name, p, why in self.engines},
            "engine": self.best.job.training.engine.name if self.best else None,
            "tokens": self.tokens, "days": self.days,
            # The point days read alone may be missed: the band's slow end says by how much (size's field).
            "days_band": None if self.days_band is None else list(self.days_band),
            # Where nothing fits nothing was picked: the defaults said "made on speed, within a margin
            # of 0.0 set by the model", whose margin is the 7.9 % gap.
            "pick": None if self.best is None else
            {"made_on": self.picked_on, "margin": self.margin, "margin_set_by": self.margin_set_by,
             # Why no margin was weighed on CPUs (margin_set_by "no_band"), as estimate's no_band says why no band.
             "no_gap": NO_GAP if self.margin_set_by == "no_band" else None,
             "fastest": {**self.fastest.to_dict(), "differs_from_best": self.differences(self.fastest)}
             if self.fastest is not None else None,
             "fits_as_predicted": self._surer_dict(self.fits_as_predicted),
             "fits_at_band_upper": self._surer_dict(self.fits_at_band_upper)},
            "search": {"scored": self.scored, "fitting": self.fitting, "pruned": self.pruned},
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "no_fit": self.no_fit.to_dict() if self.no_fit else None,
        }


def _check_size(case: Case) -> None:
    """Refuse a case the search would take minutes over: it enumerates divisors of these."""
    for key, value, bound, what in (
            ("cluster.num_gpus", case.cluster.num_gpus, MAX_GPUS, "GPUs"),
            ("model.num_layers", case.model.num_layers, MAX_LAYERS, "layers"),
            ("training.global_batch_size", case.training.global_batch_size, MAX_GLOBAL_BATCH, "sequences")):
        if value > bound:
            raise CaseError(case.source, key, f"at most {bound} {what} can be planned, got {value}")
    check_batch_tokens(case.source, case.training.global_batch_size, case.training.seq_len)


class PlanOptions(NamedTuple):
    """`plan`'s options as :func:`plan_options` let them through: Python's numbers (the API's numpy
    scalars made so by ``api_values.plain_arguments``), the tokens read."""

    top_k: Optional[int]
    simplest_within: Optional[float]
    tokens: Optional[float]


def plan_options(top_k: Any, simplest_within: Any, target: Any, names: Optional[dict[str, str]] = None,
                 engine: Any = None, tokens: Any = None) -> PlanOptions:
    """Refuse options `plan` cannot honour, as a CaseError naming the option (``names``: CLI spellings);
    the options let through, the run's tokens read as `size --tokens` reads them (15.6T), or None."""
    names = names or {}

    def refuse(key: str, expected: str, value: Any) -> CaseError:
        return CaseError(names.get(key, "plan"), "" if key in names else key,
                         f"{expected}, got {one_line(safe_repr(value), 60)}")

    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or not 0 <= top_k <= MAX_TOP_K):
        raise refuse("top_k", f"expected an integer from 0 to {MAX_TOP_K}", top_k)
    if simplest_within is not None and (isinstance(simplest_within, bool)
                                        or not isinstance(simplest_within, (int, float))
                                        or not 0 <= simplest_within <= MAX_SIMPLEST_WITHIN_PCT):
        raise refuse("simplest_within", f"expected a percentage from 0 to {MAX_SIMPLEST_WITHIN_PCT:g}",
                     simplest_within)
    targets = tuple(ENGINES)  # as search.target takes them: any is plain PyTorch, as engine="any"
    if target is not None and (not isinstance(target, str) or target not in targets):
        raise refuse("target", f"expected one of {', '.join(targets)}", target)
    if engine is not None and (not isinstance(engine, str) or engine not in CASE_ENGINES):
        # Here, not in load_case: the API's error names its argument (the CLI's, --engine).
        raise refuse("engine", f"expected one of {', '.join(CASE_ENGINES)}", engine)
    try:
        return PlanOptions(top_k, simplest_within, None if tokens is None else parse_tokens(tokens))
    except UnitError as error:
        raise CaseError(names.get("tokens", "plan"), "" if "tokens" in names else "tokens", str(error)) from None


def check_run_tokens(case: Case, tokens: float, source: str) -> None:
    """A run of at least one global batch, the least a run steps: fewer tokens have no days to give
    (`size`'s deadline per step was endless). Said of the option (the case gave the batch, the option
    the tokens): it was blamed on the file."""
    tokens_per_step = case.training.global_batch_size * case.training.seq_len
    if tokens < tokens_per_step:
        raise CaseError(source, "tokens", f"expected at least one global batch of {case.source}, "
                                          f"{tokens_per_step:,} tokens (global_batch_size × seq_len), "
                                          f"got {tokens:,.10g}")


def _check_times(case: Case, result: SearchResult) -> None:
    """The solver works in whole microseconds: a step time past MAX_STEP_TIME_S comes from figures
    no hardware has (a bandwidth of a few bytes per second, say), or a job no cluster steps through.
    The layouts past it are set aside, as no answer beside one under it; where the fastest is past
    it too, the case's error (one slow runner-up refused the case, or dropped an engine whose best
    stepped in a fifth of the bound)."""
    fastest = min(result.candidates, key=lambda c: c.step_time_s, default=None)
    if fastest is not None:
        check_step_time(case.source, fastest.step_time_s, fastest.time.by_part() if fastest.time is not None else None)
    result.candidates = [c for c in result.candidates if c.step_time_s <= MAX_STEP_TIME_S]


def _some_layout_fits(case: Case, spec: SearchSpec) -> bool:
    return bool(search(case, spec, first_only=True).candidates)


def _check_pins_leave_a_layout(case: Case, spec: SearchSpec, result: SearchResult) -> None:
    """Pins under which the engine runs no layout at all, where it runs some without them, are the
    case's error (exit 2): a search that scores nothing would answer that nothing fits (exit 3) and
    look for a cluster where it would, at every size up to 64 times this one (seconds)."""
    if result.tightest is not None or not (spec.pins or spec.bounds):
        return
    with spec_errors(case.source):
        free = search(case, replace(spec, pins={}, bounds={}), first_only=True)
    if free.candidates or free.tightest is not None:
        raise CaseError(case.source, "search", excluded_text(case, spec, () if spec.target == "any" else
                                                             (spec.target,)) + ", though some layout runs without them")


def narrowed_keys(spec: SearchSpec) -> list[str]:
    """The variables the search section pins or bounds, by name."""
    return sorted(set(spec.pins) | set(spec.bounds))


def excluded_text(case: Case, spec: SearchSpec, engines: tuple[str, ...]) -> str:
    """What left no layout to score, of these engines' (any engine's where none is named)."""
    narrowed = narrowed_keys(spec)
    named = "" if not engines else f"{engines[0]} " if len(engines) == 1 else \
        f"{', '.join(engines[:-1])} or {engines[-1]} "
    return (f"no {named}layout of {case.cluster.num_gpus} GPUs for this model and global batch"
            + (f" meets the search section's {', '.join(narrowed)}" if narrowed else ""))


def _advice(case: Case, spec: SearchSpec, tightest: Optional[Job], host_overflowed: bool = False) -> NoFit:
    limit = fit_limit(usable_bytes(case.cluster.gpu, case.overheads, spec.headroom),
                      case.model, case.cluster, case.training)
    excluded_by = None
    if tightest is not None:
        peak = peak_stage_memory(tightest)
        terms = peak.by_term()
        term, peak_bytes = max(terms, key=lambda name: terms[name]), peak.total
    else:  # not one layout was scored: say what left none
        term, peak_bytes = "parameters", math.inf
        excluded_by = excluded_text(case, spec, () if spec.target == "any" else (spec.target,))
    per_node = case.cluster.gpu.gpus_per_node
    nodes = math.ceil(case.cluster.num_gpus / per_node)
    gpus_that_fit = None
    # A cluster short of a whole node: the GPUs up to the node's, one more at a time, first (the
    # doubling below starts at two whole nodes and would skip the one).
    if case.cluster.num_gpus % per_node:
        for gpus in range(case.cluster.num_gpus + 1, min(nodes * per_node, MAX_GPUS) + 1):
            if _some_layout_fits(replace(case, cluster=replace(case.cluster, num_gpus=gpus)), spec):
                gpus_that_fit = gpus
                break
    # Double the nodes until a layout fits, then bisect back to the fewest nodes that fit.
    high = nodes
    while gpus_that_fit is None and high <= 64 * nodes and high * per_node <= MAX_GPUS:
        high *= 2
        if _some_layout_fits(replace(case, cluster=replace(case.cluster, num_gpus=high * per_node)), spec):
            low = high // 2
            while low + 1 < high:
                mid = (low + high) // 2
                if _some_layout_fits(replace(case, cluster=replace(case.cluster, num_gpus=mid * per_node)), spec):
                    high = mid
                else:
                    low = mid
            gpus_that_fit = high * per_node
            break
    seq_that_fits = None
    seq = case.training.seq_len // 2
    while seq >= 128:
        shorter = replace(case, training=replace(case.training, seq_len=seq))
        if _some_layout_fits(shorter, spec):
            seq_that_fits = seq
            break
        seq //= 2
    fits_without = None
    if tightest is not None and (spec.pins or spec.bounds) \
            and _some_layout_fits(case, replace(spec, pins={}, bounds={})):
        fits_without = tuple(narrowed_keys(spec))
    fewer: dict[str, Any] = {}
    if tightest is None and not (spec.pins or spec.bounds) and nodes > 1:
        # No layout of these GPUs at all: the divisors they share with the batch, heads and layers left
        # none (doubling the nodes keeps the odd factor: 125 nodes, 250, 500 … never have one).
        fewer = _fewer_gpus(case, spec, nodes, per_node)
    return NoFit(term, peak_bytes, limit, tightest, gpus_that_fit, seq_that_fits,
                 excluded_by, host_overflowed=host_overflowed, fits_without=fits_without, **fewer)


def _fewer_gpus(case: Case, spec: SearchSpec, nodes: int, per_node: int) -> dict[str, Any]:
    """Of the whole-node sizes below these GPUs, down to half the nodes, the one whose fastest layout
    that fits runs the most tokens/s (the global batch is the case's, so the shortest step), and the
    most GPUs that have a layout that fits, as :class:`NoFit`'s ``fewer_gpus_*`` and
    ``most_fewer_gpus_*`` fields (none where no size has one).

    The most GPUs below is not the answer to give: where these GPUs have no layout at all, the count
    just below often shares as little with the batch (992 GPUs for a batch of 1,024 run Llama 3 8B
    at dp 4 and pp 31, at half the tokens/s of 768 GPUs at dp 64 and pp 3). The sizes are searched
    from the most down, each for its fastest layout alone, under a ceiling of the fastest step found
    so far (the search's own lower bounds skip what cannot beat it), and the walk stops where the
    work no layout on any number of these GPUs goes below (``size.work_lower_bound``), spread over
    this size's GPUs, is slower than that step: no smaller size can beat it."""
    from .size import work_lower_bound  # size imports this module

    with spec_errors(case.source):
        work = work_lower_bound(case, spec, case.cluster.gpu)
    quick = replace(spec, top_k=0)
    most: Optional[tuple[Case, Candidate]] = None
    best: Optional[tuple[Case, Candidate]] = None
    for count in range(nodes - 1, max(nodes // 2, 1) - 1, -1):
        gpus = count * per_node
        ceiling = best[1].step_time_s if best is not None else math.inf
        if work / gpus > ceiling:  # fewer GPUs step slower still: no size below beats the best
            break
        sized = replace(case, cluster=replace(case.cluster, num_gpus=gpus))
        result = search(sized, quick, keep_within=0.0, ceiling=ceiling)
        fastest = min((c for c in result.candidates if c.step_time_s <= MAX_STEP_TIME_S),
                      key=lambda c: c.step_time_s, default=None)
        if fastest is None or fastest.step_time_s >= ceiling:  # a tie goes to the more GPUs, found first
            continue
        best = (sized, fastest)
        most = most or best
    if best is None or most is None:
        return {}

    def figures(prefix: str, entry: tuple[Case, Candidate]) -> dict[str, Any]:
        sized, candidate = entry
        est = estimate_job(sized, candidate.searched_job, candidate.time)
        return {f"{prefix}_that_fit": sized.cluster.num_gpus, f"{prefix}_tokens_per_s": est.tokens_per_s,
                f"{prefix}_mfu": est.mfu, f"{prefix}_job": est.job}

    return {**figures("fewer_gpus", best), **figures("most_fewer_gpus", most)}


def layout_table(case: Case, spec: SearchSpec, slack: float = TABLE_SLACK, ceiling: float = math.inf,
                 robust: Optional[float] = None, safer: Optional[float] = None) -> tuple[SearchResult, list[Candidate]]:
    """The search on this cluster, and the solver's table from it: every fitting layout within
    ``slack`` of the fastest, and at least the top_k + 1 fastest (none slower than ``ceiling``)."""
    with spec_errors(case.source):  # e.g. a precision the GPU (or profile) has no peak for
        result = search(case, spec, keep_within=slack, ceiling=ceiling, robust=robust, safer=safer)
    _check_times(case, result)
    return result, _table(result.candidates, slack, spec.top_k)


def _candidate_of(estimate: Estimate) -> Candidate:
    """An estimate as the search's candidate, for :func:`robust_rank`."""
    return Candidate(estimate.job.layout, estimate.step_time_s, estimate.peak.total, estimate.job)


def robust_rank(candidate: Candidate, case: Case) -> tuple:
    """The robust pick's order among layouts the model cannot tell apart: the surest to fit first
    (``search_memory.fit_tier``: the memory band's upper end fits, else the predicted peak), then the
    simplest (``complexity``), then the faster."""
    return (fit_tier(candidate.searched_job, candidate.peak_bytes, case.search.headroom),
            complexity(candidate, case.training.global_batch_size), candidate.step_time_s)


def robust_choice(table: list[Candidate], fastest: int, margin: float, case: Case) -> int:
    """Among the layouts within ``margin`` of the fastest (which the model cannot tell apart), the
    first by :func:`robust_rank`."""
    limit = table[fastest].step_time_s * (1 + margin)
    near = [i for i, c in enumerate(table) if c.step_time_s <= limit]
    return min(near, key=lambda i: robust_rank(table[i], case))


def plan_case(case: Case, simplest_within: Optional[float] = None, top_k: Optional[int] = None,
              target: Optional[str] = None, fastest: bool = False, fastest_alone: bool = False,
              advise: bool = True, ceiling: float = math.inf) -> Plan:
    """The plan on one engine (``target``, else the case's). With ``fastest_alone``, the fastest
    layout and nothing more: no runner-up, no layout within the margin of it weighed for the
    robust pick, and where nothing fits no advice (``no_fit`` None): :func:`plan_engines` asks so
    of an engine it may not need in full. Without ``advise``, where nothing fits, no advice either
    (it searches again at more GPUs and shorter sequences: most of a plan's time where it runs, and
    wasted where another engine fits). With ``ceiling`` (seconds, with ``fastest_alone`` only), no
    layout whose step cannot come under it is searched for: the plan's ``best`` is the fastest where
    that comes under it, and otherwise None or a slower layout, which says nothing of the fastest."""
    plan_options(top_k, simplest_within, target)
    if fastest_alone:
        top_k, fastest = 0, True
    _check_size(case)
    spec = case.search
    if top_k is not None:
        spec = replace(spec, top_k=top_k)
    spec, training = retarget(case.source, spec, case.training, target)
    case = replace(case, training=training, search=spec)
    # What no layout could meet.
    for key, why in ENGINES[spec.target].training_problems(case.training, case.cluster.gpu, case.model):
        raise CaseError(case.source, key, f"{spec.target} cannot run it: {why}")
    from .solver import LayoutModel  # ortools loads in ~0.3 s: only `plan` pays for it

    # The robust pick, at the gap the model cannot tell apart or, with simplest_within, at a margin set by
    # hand: the same rule either way (it took the least complex within the margin whatever its fit, a
    # layout predicted over memory where the default picked one that fits at its band's upper end).
    robust = not fastest
    margin = _margin(case, simplest_within)
    slack = 0.0 if fastest_alone else max(TABLE_SLACK, margin)
    result, table = layout_table(case, spec, slack, ceiling=ceiling if fastest_alone else math.inf,
                                 robust=margin if robust else None)
    model = LayoutModel(case, spec, table)
    solution = model.solve()
    if solution.index is None:
        if (fastest_alone or not advise) and not (spec.pins or spec.bounds):
            # The advice searches again, at more GPUs and shorter sequences: seconds. (Where the case
            # pins choices, the search in full says whether the pins leave the engine any layout.)
            return Plan(solution.status, None, (), result.scored, 0, headroom=spec.headroom)
        if fastest_alone and ceiling < math.inf:
            # A search under a ceiling that found nothing says nothing of the pins: they may leave the
            # engine layouts, all slower than the ceiling (Llama 3 70B on 64 H100s, tp 8 pinned, no
            # engine named: DeepSpeed's entry said no layout of it meets the search section's tp, where
            # `--engine deepspeed` plans one). Whether they leave any is asked without the ceiling.
            with spec_errors(case.source):
                pinned = search(case, spec, first_only=True)
            if pinned.candidates or pinned.tightest is not None:
                return Plan(solution.status, None, (), result.scored, 0, headroom=spec.headroom)
        # Every search below prices layouts: a figure the cost models refuse (fp8 on a GPU without fp8
        # tensor cores, first met at a pinned tp) is the case's error, not a traceback.
        with spec_errors(case.source):
            result = result.in_full()  # every layout scored: the closest miss is the advice's
            _check_pins_leave_a_layout(case, spec, result)
            advice = _advice(case, spec, result.tightest, result.host_misses > 0)
        return Plan(solution.status, None, (), result.scored, 0, no_fit=advice, headroom=spec.headroom)
    status = solution.status
    chosen = fastest_index = solution.index
    if robust:
        chosen = robust_choice(table, fastest_index, margin, case)
    model.exclude(chosen)
    for index, candidate in enumerate(table):  # a safer twin is the robust pick's to take, not a runner-up
        if candidate.safer and index != chosen:
            model.exclude(index)
    alternatives = []
    for _ in range(spec.top_k):
        nxt = model.solve()
        if nxt.index is None:
            break
        alternatives.append(nxt.index)
        model.exclude(nxt.index)

    def estimate_of(index: int) -> Estimate:
        return estimate_job(case, table[index].searched_job, table[index].time)

    best, fastest_layout = estimate_of(chosen), estimate_of(fastest_index) if chosen != fastest_index else None
    as_predicted, at_upper = surer_layouts(best, result.candidates, spec.headroom)
    return Plan(status, best, tuple(estimate_of(i) for i in alternatives),
                result.scored, len(result.candidates), pruned=result.pruned,
                candidates=tuple((c.step_time_s, c.peak_bytes) for c in result.candidates), headroom=spec.headroom,
                picked_on=picked_on(best, fastest_layout, spec.headroom), margin=margin if robust else 0.0,
                margin_set_by=_margin_set_by(case, simplest_within, fastest), fastest=fastest_layout,
                fits_as_predicted=None if as_predicted is None else
                estimate_job(case, as_predicted.searched_job, as_predicted.time),
                fits_at_band_upper=None if at_upper is None else
                estimate_job(case, at_upper.searched_job, at_upper.time))


def surer_layouts(best: Estimate, scored: list[Candidate],
                  headroom: float) -> tuple[Optional[Candidate], Optional[Candidate]]:
    """Where ``best``'s predicted peak is over the usable memory (``search_memory.fit_tier`` 2), the
    fastest of the ``scored`` layouts that fit whose predicted peak fits (tier 1 or 0), and the fastest
    that fits at its memory band's upper end (tier 0); (None, None) where the best's predicted peak fits.
    Drawn from what the search scored (every layout it kept, with the safer twins of those within the
    margin), not a search of their own: a layout it skipped as too slow to be among the top_k + 1 or
    within the table's slack is not weighed."""
    if fit_tier(best.job, best.peak.total, headroom) < 2:
        return None, None
    tiers = [(fit_tier(c.searched_job, c.peak_bytes, headroom), c) for c in scored]
    as_predicted = min((c for tier, c in tiers if tier <= 1), key=lambda c: c.step_time_s, default=None)
    at_upper = min((c for tier, c in tiers if tier == 0), key=lambda c: c.step_time_s, default=None)
    return as_predicted, at_upper


def picked_on(best: Estimate, fastest: Optional[Estimate], headroom: float) -> str:
    """What set the fastest layout aside for the pick: nothing ("speed"), the memory band ("fit": the
    pick fits more surely, ``search_memory.fit_tier``), or the complexity order ("simplicity": as
    sure to fit, and simpler)."""
    from .search_memory import fit_tier

    if fastest is None:
        return "speed"
    surer = fit_tier(best.job, best.peak.total, headroom) < fit_tier(fastest.job, fastest.peak.total, headroom)
    return "fit" if surer else "simplicity"


def _margin(case: Case, simplest_within: Optional[float]) -> float:
    """The margin the robust pick weighs: --simplest-within's, else the gap the model cannot tell apart,
    else (CPUs, which no published sweep ran on: ``bands.pick_margin``) none."""
    if simplest_within is not None:
        return simplest_within / 100
    gap = pick_margin(case.cluster)
    return 0.0 if gap is None else gap


def _margin_set_by(case: Case, simplest_within: Optional[float], fastest: bool = False) -> str:
    """What set the margin the pick was made within: none with --fastest (the raw optimum, margin 0), nor
    on CPUs with none set by hand ("no_band": no published sweep gives their gap, ``bands.NO_GAP``)."""
    if fastest:
        return "fastest"
    if simplest_within is not None:
        return "simplest_within"
    return "no_band" if pick_margin(case.cluster) is None else "model"


def plan(case: Union[CaseArg, Case], simplest_within: Optional[FloatArg] = None, top_k: Optional[IntArg] = None,
         target: Optional[str] = None, engine: Optional[str] = None, fastest: BoolArg = False,
         tokens: Union[FloatArg, str, None] = None) -> Plan:
    """Python API: plan a case (path or dict in the case-file schema); any ``layout`` section is ignored.

    ``target`` restricts the search to one engine, or with ``"any"`` decides between them, as
    ``search.target`` does; ``engine`` replaces the case's training.engine and search.target
    (`plan --engine`: ``"any"`` is plain PyTorch alone). The best is the robust pick
    (:func:`robust_choice`) unless ``fastest`` (the raw optimum) or ``simplest_within``. With ``tokens``
    (a count, or `size --tokens`'s "15.6T"), ``.days`` is how long the best takes to train on them."""
    # The engines as a case names them, in any letter case ("Megatron" is megatron)
    target, engine = canonical_choice(target, ENGINES), canonical_choice(engine, CASE_ENGINES)
    options = plan_options(top_k, simplest_within, target, engine=engine, tokens=tokens)
    run_tokens = options.tokens
    if target is not None and engine is not None and target != engine:
        raise CaseError("plan", "target", f"{target!r} differs from engine {engine!r}, which replaces the case's "
                                          "engine and target: give one of them")
    fastest = read_bool("plan", "fastest", fastest)  # "no" is truthy: it returned the raw optimum
    if fastest and simplest_within is not None:  # as the CLI refuses --fastest with --simplest-within
        raise CaseError("plan", "fastest", "give either fastest or simplest_within, not both")
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    if isinstance(case, Case):
        if engine is not None:
            raise CaseError(case.source, "engine", "applies to a case path or dict, not to a loaded Case")
        loaded = case
    else:
        notes = tuple(note for note in (check_ignored_layout(case), ignored_sizing_keys(case)) if note)
        loaded = load_case(case, engine=engine, ignore_layout=True)
        notes += case_notes(case, loaded)
        warnings = tuple(profile_warnings(case))
    if run_tokens is not None:
        check_run_tokens(loaded, run_tokens, "plan")
    planned = _planned(loaded, options.simplest_within, options.top_k, target, engine, fastest)
    if planned.best is not None and not isinstance(case, Case):  # the case's layout, if any, is not the plan's
        notes += tuple(note for note in (unstated_loss(loaded.source, planned.best.job),) if note)
    return replace(planned, notes=notes, warnings=warnings, tokens=run_tokens)


def _planned(loaded: Case, simplest_within: Optional[float], top_k: Optional[int], target: Optional[str],
             engine: Optional[str], fastest: bool) -> Plan:
    """:func:`plan` of a loaded case: one engine's, or the decision between them."""
    if engine is None and target == "any" and loaded.search.target != "any":
        raise CaseError(loaded.source, loaded.search.target_key, f"is {loaded.search.target!r} but target 'any' asks "
                                                                 "to decide between the engines; drop one of them")
    if target in (None, "any") and engine is None and loaded.search.target == "any":
        # target "any" as search.target: any says it (plain PyTorch alone was planned)
        return plan_engines(loaded, simplest_within, top_k, fastest)
    return plan_case(loaded, simplest_within=simplest_within, top_k=top_k, target=target, fastest=fastest)


def check_ignored_layout(case: Any, command: str = "plan") -> Optional[str]:
    """A ``layout`` section `plan` (or `size`) ignores is still read for what it is: a malformed one
    (a ZeRO stage 4, dp 0, tp true) is the case's error, as under `estimate`; a well-formed one gets
    a line saying it was ignored (returned, for the CLI to print), since the command chooses the layout."""
    from .case import layout_from_mapping, read_case

    data, src, _ = read_case(case)
    if not isinstance(data, dict) or data.get("layout") is None:
        return None
    # Checked on its own: the GPUs its own degrees make (whether they suit this cluster is `estimate`'s).
    section = data["layout"]
    gpus = 1
    if isinstance(section, dict):
        for key in ("dp", "tp", "pp", "cp"):
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_GPUS:
                gpus *= value
    layout_from_mapping(src, section, min(gpus, MAX_GPUS ** 2))
    return (f"{src}: {command} chooses the layout and ignores the case's layout section (estimate scores it; "
            f"search.<key> pins a choice for {command})")


def case_notes(case: Any, loaded: Case, routing: Optional[str] = None) -> tuple[str, ...]:
    """What `estimate`, `plan`, `size` and `diagnose` say on stderr of the case they price, one line each:
    routing it leaves unstated, a sequence past its hf_config's positions, a pipeline split the engine
    does not run, and a fabric other than the one a fitted profile's runs ran on
    (``fitted.other_fabric_notes``). ``routing``: `diagnose`'s word on a launch that forces its routing
    balanced (``diagnose.forced_routing``), said in the place of the unstated routing's."""
    return tuple(note for note in (routing or unstated_routing(case, loaded), past_positions(case, loaded),
                                   own_split_note(case, loaded), *other_fabric_notes(case)) if note)


def unstated_loss(source: str, job: Job) -> Optional[str]:
    """A line where the case leaves ``training.loss`` unset for an engine that runs either loss (DeepSpeed
    runs the user's train.py): which one was priced, the engine's (Megatron-DeepSpeed's in-place
    vocab-parallel cross-entropy), and what the other (a Hugging Face model's own eager loss on fp32
    logits) would add to ``job``'s peak (``Engine.other_loss``); None where the case states it, the
    engine's loss is its own, or the other changes the peak by less than the 0.01 GB the line shows."""
    other = ENGINES[job.training.engine.name].other_loss(job)
    if job.training.loss is not None or other is None:
        return None
    loss, (name, extra) = job.training.loss_name, other
    if round(extra / 1e9, 2) == 0:  # nothing at stake: the peak is not the loss's (an earlier pipeline stage's)
        return None
    from .engines.deepspeed.engine import LOSS_WORDS

    change = f"adds {extra / 1e9:.2f} GB to" if extra >= 0 else f"takes {-extra / 1e9:.2f} GB off"
    return (f"{source}: training.loss is unstated: priced as {job.training.engine.name}'s default, {loss} "
            f"({LOSS_WORDS[loss][0]}, {LOSS_WORDS[loss][1]}); train.py's loss is yours, and {name} "
            f"({LOSS_WORDS[name][0]}: {LOSS_WORDS[name][1]}) {change} the peak of "
            f"{peak_stage_memory(job).total / 1e9:.2f} GB: state training.loss")


def own_split_note(case: Any, loaded: Case) -> Optional[str]:
    """A line where the case gives ``layout.stage_layers`` (or ``chunk_layers``, which sets it: without
    interleaving, the same split) to an engine that takes no split (nanotron:
    ``EngineBehaviour.splits_by_block_cost``) and it is not the one the engine cuts: the layout is
    priced with the engine's, which is what runs (``placement.stage_layers``). The layout keeps the stated
    split (``Job`` checks it), so the note reads it there."""
    from cost_models.placement import stage_layers

    layout = loaded.layout
    if layout is None or not loaded.training.engine.splits_by_block_cost or layout.stage_layers is None:
        return None
    key = "chunk_layers" if layout.chunk_layers is not None else "stage_layers"
    stated = list(getattr(layout, key))
    own = list(stage_layers(loaded.model, loaded.training, layout))
    if stated == own:
        return None
    return (f"{loaded.source}: layout.{key} {stated} is not a split {loaded.training.engine.name} "
            f"runs: it cuts its stages itself, each rank filled to its share of the layers' running cost "
            f"(nanotron/models/base.py, build_model), here {own}: priced with that split")


def past_positions(case: Any, loaded: Case) -> Optional[str]:
    """A line where ``training.seq_len`` is past the ``max_position_embeddings`` (GPT-2's ``n_positions``) of the case's
    ``model.hf_config``: the model was built for shorter sequences. Said, not refused: a RoPE model
    trains past it (long-context extension sets rope_scaling or a larger rope_theta), but a case
    that says so seldom meant it, and the price is of the sequence as given."""
    from .case import read_case
    from .fields import read_file_path
    from .hf_config import position_limit

    data, src, base = read_case(case)
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or "hf_config" not in model:
        return None
    path = read_file_path(src, "model.hf_config", model["hf_config"], base, "config.json")
    stated = position_limit(path)
    if stated is None or loaded.training.seq_len <= stated[0]:
        return None
    limit, key = stated
    # A learned table (GPT-2's) has no row past it: the run fails unless the table is grown.
    how = ("a RoPE model can be trained past it, with rope_scaling or a larger rope_theta, but check it is meant"
           if loaded.model.position_embedding != "learned" else
           "its learned position table has no row past it, so the run fails unless the table is grown")
    return (f"{src}: training.seq_len {loaded.training.seq_len:,} is past the {limit:,} positions of {path} "
            f"({key}), the longest sequence the model was built for: priced as given ({how})")


def unstated_routing(case: Any, loaded: Case) -> Optional[str]:
    """A line saying that a mixture of experts whose case leaves ``model.moe_load_imbalance`` unstated
    was priced with every expert-parallel rank given the same tokens (the default, 1), as the published
    benchmarks run with forced balancing (Megatron-LM's --moe-router-force-load-balancing, which the
    emitted files leave off: it changes what is trained). A trained router is less even, and each MoE
    layer waits for its busiest rank; None where the case states it, has no experts, or pads them to a
    capacity factor (the busiest rank's share is then the factor, whatever the imbalance:
    ``ModelSpec.routed_factor``)."""
    from .case import read_case

    if not loaded.model.is_moe or loaded.model.moe_capacity_factor is not None:
        return None
    data, src, _ = read_case(case)
    section = data.get("model") if isinstance(data, dict) else None
    if isinstance(section, dict) and "moe_load_imbalance" in section:
        return None
    return (f"{src}: model.moe_load_imbalance is unstated: priced with balanced routing (every expert-parallel "
            "rank given the same tokens, as forced balancing runs); a trained router's busiest rank takes more "
            "and each MoE layer waits for it: state the imbalance your runs measure (the busiest rank's tokens "
            "over the mean)")


def ignored_sizing_keys(case: Any) -> Optional[str]:
    """A line saying which of `size`'s cluster keys (max_gpus, max_nodes, gpu_hour_cost) a case
    gives that `plan` does not read, for the CLI to print; None where it gives none."""
    from .case import read_case
    from .case_cluster import SIZING_KEYS

    data, src, _ = read_case(case)
    cluster = data.get("cluster") if isinstance(data, dict) else None
    given = [k for k in SIZING_KEYS if isinstance(cluster, dict) and k in cluster]
    if not given:
        return None
    return (f"{src}: plan runs on cluster.num_gpus (or nodes) and does not read cluster."
            f"{', cluster.'.join(given)}: `size` does")


# The engines `plan` decides between when a case names none: those it writes launch files for.
DECIDED_ENGINES = ("megatron", "deepspeed", "torchtitan")


def plan_engines(case: Case, simplest_within: Optional[float], top_k: Optional[int], fastest: bool) -> Plan:
    """The engine as a decision: a plan for each engine that can run the case, and the pick among
    their bests as among layouts (:func:`robust_choice`'s rule: the simplest of those within the
    gap the model cannot tell apart that fits at its memory band's upper end; with ``fastest``,
    the fastest).

    The first engine is planned in full, the others first for their fastest alone (a fraction of
    the search: Mixtral 8x7B on 64 H100s, torchtitan's 0.14 s for 0.44 s), and in full only where
    that could be picked: within the margin of the quickest engine's fastest (with ``fastest``, the
    quickest itself). An engine further behind can be picked by neither rule, so its fastest is
    not needed either: its search for it stops at that margin of the quickest fastest found so far
    (torchtitan's, 0.14 s, in 0.02 s), and the report says that no layout of it comes within."""
    _check_size(case)
    margin = _margin(case, simplest_within)
    errors: list[CaseError] = []

    def planned(name: str, alone: bool, advise: bool = True,
                ceiling: float = math.inf) -> tuple[str, Optional[Plan], str]:
        try:
            return name, plan_case(case, simplest_within, top_k, target=name, fastest=fastest,
                                   fastest_alone=alone, advise=advise, ceiling=ceiling), ""
        except CaseError as error:
            errors.append(error)
            return name, None, f"{error.key}: {error.expected}" if error.key else error.expected

    # No engine's advice until no engine fits: the report gives none beside an engine that does
    # (gpt-oss-20b at 2^20 tokens a sequence on 1,024 H100s: Megatron's advice took 46 s of 52,
    # where torchtitan's layout fits).
    plans: list[tuple[str, Optional[Plan], str]] = []
    for name in DECIDED_ENGINES:
        timed = [p for _, p, _ in plans if p is not None and p.best is not None]
        if not timed:  # the first engine, or none before it has a layout: nothing to be within
            plans.append(planned(name, alone=bool(plans), advise=False))
            continue
        quickest = min(timed, key=lambda p: _raw(p).step_time_s)
        ceiling = _raw(quickest).step_time_s * (1 + (0.0 if fastest else margin))
        entry = planned(name, alone=True, advise=False, ceiling=ceiling)
        p = entry[1]
        if p is not None and (p.best is None or p.best.step_time_s > ceiling):
            # Nothing of this engine within the margin (a layout the search found above it says
            # nothing of its fastest): it can be picked by neither rule.
            # The margin is a gap in step time, said so: "within 7.9 % of the fastest (340,817 tokens/s)" read
            # as 7.9 % fewer tokens/s, a step 8.6 % longer than the one weighed.
            near = "as fast as the fastest" if fastest or not margin else \
                f"whose step is within {margin:.1%} (the gap the pick weighs) of the fastest"
            entry = (name, None, f"no layout {near}: {_raw(quickest).job.training.engine.name}'s "
                                 f"{_raw(quickest).step_time_s:.3f} s ({_raw(quickest).tokens_per_s:,.0f} tokens/s), "
                                 "so planned no further")
        plans.append(entry)
    timed = [p for _, p, _ in plans if p is not None and p.best is not None]
    if timed:
        quickest = min(timed, key=lambda p: _raw(p).step_time_s)
        quickest_s = _raw(quickest).step_time_s
        for index, (name, p, _) in enumerate(plans):
            if index == 0 or p is None or p.best is None:
                continue
            behind = p.best.step_time_s / quickest_s - 1
            if behind <= (0.0 if fastest else margin):
                plans[index] = planned(name, alone=False)
            else:
                shown, shown_margin = _told_apart(behind, margin)
                weighs = "" if fastest or not margin else f": beyond the {shown_margin} the pick weighs"
                plans[index] = (name, p, f"its fastest, a step {shown} longer than the fastest of "
                                         f"{_raw(quickest).job.training.engine.name} "
                                         f"({_raw(quickest).tokens_per_s:,.0f} tokens/s){weighs}, so planned no further")
    ran = [p for _, p, _ in plans if p is not None and p.best is not None]
    if not ran:
        # Nothing fits: every engine that can run the case planned again, in full, for its advice (the
        # first's alone said 24 GPUs would fit Llama 3 70B at 128k tokens on A100s of 40 GB, where
        # torchtitan's layouts fit on 16); where none can, their refusals (the case's own, where every
        # engine's is the same).
        plans = [planned(name, alone=False) if p is not None and p.no_fit is None else (name, p, why)
                 for name, p, why in plans]
    if not ran:
        first = next((p for _, p, _ in plans if p is not None), None)
        if first is None:
            if len({str(e) for e in errors}) == 1:  # the case's own error, whatever the engine
                raise errors[0]
            if all(e.key == "search" for e in errors):  # pins no engine's layout meets
                raise CaseError(case.source, "search", excluded_text(case, case.search, DECIDED_ENGINES)
                                + ", though some layout runs without them")
            keys = {e.key for e in errors}
            if len(keys) == 1 and len(errors) == len(plans) and not keys & {"", "training.engine", "layout.zero_stage"}:
                # Every engine stopped on one key of the case (a bandwidth of 1 B/s: the cluster's figures):
                # that key, not the engine, is what to change.
                raise CaseError(case.source, keys.pop(), "; ".join(f"{name}: {e.expected}"
                                                                   for (name, _, _), e in zip(plans, errors)))
            raise CaseError(case.source, "training.engine", "no engine can run it: "
                            + "; ".join(f"{name}: {why}" for name, _, why in plans))
        names = tuple(name for name, p, _ in plans if p is not None)
        advised = [(name, p, p.no_fit) for name, p, _ in plans if p is not None and p.no_fit is not None
                   and p.no_fit.closest_layout is not None]
        if advised:
            def closeness(entry: tuple[str, Plan, NoFit]) -> tuple[float, float]:
                advice = entry[2]
                return (advice.gpus_that_fit or math.inf, advice.peak_bytes)
            name, first, advice = min(advised, key=closeness)  # ties: the first engine's, as before
            if len(advised) > 1:
                first = replace(first, no_fit=replace(advice, engine=name))
        else:
            # No engine has a layout of these GPUs at all: the advice of the engine whose size below runs
            # fastest (Llama 3 8B on 1,000 H100s: Megatron-LM's 768 GPUs, torchtitan's 896 run slower).
            fewer = [(name, p, p.no_fit, p.no_fit.fewer_gpus_tokens_per_s) for name, p, _ in plans
                     if p is not None and p.no_fit is not None and p.no_fit.fewer_gpus_tokens_per_s is not None]
            if fewer:
                # ties: the first engine's
                name, first, advice, _ = max(fewer, key=lambda entry: entry[3])
                if len(fewer) > 1:
                    first = replace(first, no_fit=replace(advice, engine=name))
        if first.no_fit is not None and first.no_fit.excluded_by is not None:
            # Said of the first engine's search: every engine planned came to the same.
            first = replace(first, no_fit=replace(first.no_fit, excluded_by=excluded_text(case, case.search, names)))
        return replace(first, engines=tuple(plans))
    # The fastest of every engine's layouts, whatever each engine's own pick (the robust pick of one
    # engine may be slower than its fastest): the margin is counted from it, as within one engine.
    quickest = min(ran, key=lambda p: _raw(p).step_time_s)
    if fastest:
        return replace(quickest, engines=tuple(plans))
    limit = _raw(quickest).step_time_s * (1 + margin)
    chosen = min((p for p in ran if p.picked("plan_engines").step_time_s <= limit),
                 key=lambda p: robust_rank(_candidate_of(p.picked("plan_engines")), p.picked("plan_engines").case))
    overall = _raw(quickest)
    same = chosen is quickest and chosen.best is overall
    return replace(chosen, engines=tuple(plans), margin=margin, margin_set_by=_margin_set_by(case, simplest_within),
                   picked_on=picked_on(chosen.picked("plan_engines"), None if same else overall, chosen.headroom),
                   fastest=None if same else overall)


def _told_apart(share: float, bound: float) -> tuple[str, str]:
    """Two shares as percentages, to the fewest decimals (one at least) that tell them apart: a gap
    of 8.51 % beyond a margin of 8.46 % read "8.5 % ... beyond the 8.5 %"."""
    for digits in range(1, 5):
        a, b = f"{share:.{digits}%}", f"{bound:.{digits}%}"
        if a != b:
            break
    return a, b


def _raw(plan: Plan) -> Estimate:
    """A plan's fastest layout, whatever its pick (of a plan that found one: `plan_engines` times only those)."""
    return plan.fastest if plan.fastest is not None else plan.picked("plan._raw")
