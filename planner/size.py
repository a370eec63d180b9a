"""`size`: how many GPUs of which type, in which layout, for a run of so many tokens.

A run of T tokens at a global batch of B sequences of S tokens steps T / (B·S) times. On N
GPUs whose layout steps in t seconds it runs at B·S / t tokens/s, takes T ÷ tokens/s ÷
86,400 days and days × 24 × N GPU-hours, which cost GPU-hours × the price of one
(:class:`SizeChoice`, the one place these are computed). `size` chooses the GPU type, N
(whole nodes, or whole racks where an NVLink domain spans several nodes) and the layout,
at the case's global batch, for one objective:

- with a deadline: the least GPU-hours that meets it (the least cost, when every type
  has a price);
- without one, within a budget (``--max-gpus`` or ``--max-nodes``): the shortest time;
- with neither: the Pareto front of days against GPU-hours (cost) over a ladder of sizes
  within the case's limits, its knee (the least days × GPU-hours) the answer
  (:mod:`planner.size_front`): the least GPU-hours alone would be the smallest cluster that
  fits, for a run of years.

Ties go to the other measure (time, or GPU-hours/cost), then to the simpler layout. When
nothing within the limits meets the target, :class:`Sizing` says so in ``status`` (deadline
not met, over budget, nothing fits), with the fastest cluster within the limits and the
fewest GPUs past them that would do.

The cluster sizes of each type are enumerated, the most promising first (the smallest when
spending decides, the largest when time does), under a ceiling on the step time that could
still matter on each: the deadline's share of a step, and what the (k+1)-th best size found
so far leaves for this one. A size too small for any layout to step that fast
(:func:`work_lower_bound`) is skipped outright; the others are searched by plan's own search
with the ceiling, so that one none of whose layouts can come under it costs only the
search's lower bounds. Enumerating sizes this way is faster than letting CP-SAT branch over
them with every size's layouts in its model. The layouts each search keeps (its fastest,
and any the solver cannot tell from it in whole microseconds) are the rows of one CP-SAT
model (:mod:`planner.size_solver`), which decides type, size and layout. Plan's search on
one size is plan's answer on it, so `size` and `plan` agree on any cluster.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence, Union

from cost_models.specs import EXPERT_DISPATCHES, PRECISIONS, GPUSpec, SpecError
from cost_models.layer_time import layer_time_bound

from .api_values import CaseArg, FloatArg, IntArg
from .case import Case, build_case, check_usable_memory, outside_key, profile_warnings, read_case, read_sections, spec_errors
from .cluster_options import ClusterOption, read_cluster_options, with_part_racks
from .errors import CaseError, one_line, safe_repr
from .fields import canonical_choice, read_choice, read_price
from .estimate import Estimate, estimate_job
from .limits import MAX_CLUSTER_SIZES, MAX_GPUS, MAX_TOP_K
from .engines import ENGINES
from .plan import DECIDED_ENGINES, _check_size, check_run_tokens, layout_table, plan
from .search import Candidate, cp_too_thin, divisors
from .search_options import SearchSpec, retarget
from .units import (UnitError, duration_text, figure_text, parse_duration, parse_tokens, run_days, run_days_band,
                    whole_bytes)

SECONDS_PER_DAY = 86400.0
DEFAULT_ALTERNATIVES = 3
# A size's rows: its fastest layout and those within this share of it, and never fewer than
# the solver's whole microsecond holds (so that on one size it breaks ties as `plan` does).
TIE_WINDOW = 1e-4
TIE_SPAN_S = 2e-6
# When no size within the limits meets the deadline, sizes up to this many times the
# limit are tried for one that would.
ADVICE_REACH = 64
OBJECTIVE_TEXT = {"gpu_hours": "the least GPU-hours", "cost": "the least cost", "time": "the shortest time",
                  "front": "days against spend, the knee marked"}


@dataclass(frozen=True)
class SizeTarget:
    """What the run must do and within what: tokens, and optionally a deadline, a budget of
    GPUs (of any one type), and a price per GPU-hour that replaces every type's own."""

    tokens: float
    deadline_s: Optional[float] = None
    max_gpus: Optional[int] = None
    max_nodes: Optional[int] = None
    gpu_hour_cost: Optional[float] = None
    top_k: int = DEFAULT_ALTERNATIVES


def size_target(tokens: Any, deadline: Any = None, max_gpus: Any = None, max_nodes: Any = None,
                gpu_hour_cost: Any = None, top_k: Any = None,
                names: Optional[dict[str, str]] = None) -> SizeTarget:
    """The run's target from option values, or a CaseError naming the option (``names``: CLI spellings)."""
    names = names or {}

    def refuse(key: str, expected: str) -> CaseError:
        return CaseError(names.get(key, "size"), "" if key in names else key, expected)

    def bounded(key: str, value: Any, most: int, least: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
            raise refuse(key, f"expected an integer from {least} to {most}, got {one_line(safe_repr(value), 60)}")
        return value

    def count(key: str, value: Any, most: int, least: int = 1) -> Optional[int]:
        return None if value is None else bounded(key, value, most, least)

    try:
        parsed_tokens = parse_tokens(tokens)
    except UnitError as error:
        raise refuse("tokens", str(error)) from None
    try:
        deadline_s = None if deadline is None else parse_duration(deadline)
    except UnitError as error:
        raise refuse("deadline", str(error)) from None
    if count("top_k", top_k, MAX_TOP_K, least=0) is not None and deadline is None and max_gpus is None \
            and max_nodes is None:
        # With neither, `size` answers the front of days against GPU-hours, every size on it.
        raise refuse("top_k", f"applies with {names.get('deadline', 'deadline')} or a budget "
                              f"({names.get('max_gpus', 'max_gpus')}, {names.get('max_nodes', 'max_nodes')}): "
                              f"without them the answer is the front of days against spend (cost where every "
                              f"type has a price, else GPU-hours), every size on it")
    if max_gpus is not None and max_nodes is not None:
        raise refuse("max_nodes", f"give either {names.get('max_gpus', 'max_gpus')} or "
                                  f"{names.get('max_nodes', 'max_nodes')}, not both")
    price = None if gpu_hour_cost is None else \
        read_price(names.get("gpu_hour_cost", "size"), "" if "gpu_hour_cost" in names else "gpu_hour_cost", gpu_hour_cost)
    return SizeTarget(parsed_tokens, deadline_s, count("max_gpus", max_gpus, MAX_GPUS),
                      count("max_nodes", max_nodes, MAX_GPUS), price,
                      DEFAULT_ALTERNATIVES if top_k is None else bounded("top_k", top_k, MAX_TOP_K, least=0))


def _listed(pair: Optional[tuple[float, float]]) -> Optional[list[float]]:
    return None if pair is None else list(pair)


@dataclass(frozen=True)
class SizeChoice:
    """A GPU type, a cluster size and its layout, and what the run takes on them."""

    # Compared by value, never hashed, as every result the API returns (docs/commands.md, Python API): most
    # hold dicts, which may change after hashing; hash() names the type rather than failing on a dict inside.
    __hash__ = None  # type: ignore[assignment]

    option: ClusterOption
    estimate: Estimate  # the layout on this cluster, as `estimate` gives it
    tokens: float
    price: Optional[float]  # per GPU-hour

    @property
    def gpus(self) -> int:
        return self.estimate.job.cluster.num_gpus

    @property
    def gpus_paid(self) -> int:
        """The GPUs the run takes from the cluster: its own, and the rest of each rack it runs on part of."""
        return self.option.paid_gpus(self.gpus)

    @property
    def nodes(self) -> int:
        return self.estimate.job.cluster.num_nodes

    @property
    def tokens_per_s(self) -> float:
        return self.estimate.tokens_per_s

    @property
    def days(self) -> float:
        return run_days(self.tokens, self.tokens_per_s)

    def _gpu_hours(self, days: float) -> float:
        """The GPUs paid for as long as the run takes: days × 24 × GPUs."""
        return days * 24 * self.gpus_paid

    @property
    def gpu_hours(self) -> float:
        return self._gpu_hours(self.days)

    @property
    def cost(self) -> Optional[float]:
        return None if self.price is None else self.gpu_hours * self.price

    @property
    def tokens_per_s_band(self) -> Optional[tuple[float, float]]:
        """The 80 % band of the tokens/s, as `estimate` gives it on this cluster and layout (None on CPUs)."""
        return self.estimate.tokens_per_s_band

    @property
    def days_band(self) -> Optional[tuple[float, float]]:
        """The days at the band's fast and slow ends (``run_days_band``, `plan --tokens`'s too)."""
        band = self.tokens_per_s_band
        return None if band is None else run_days_band(self.tokens, band)

    @property
    def gpu_hours_band(self) -> Optional[tuple[float, float]]:
        """The GPU-hours at the band's ends."""
        days = self.days_band
        return None if days is None else (self._gpu_hours(days[0]), self._gpu_hours(days[1]))

    @property
    def cost_band(self) -> Optional[tuple[float, float]]:
        hours = self.gpu_hours_band
        if self.price is None or hours is None:
            return None
        return hours[0] * self.price, hours[1] * self.price

    def trade(self, other: "SizeChoice") -> dict[str, Optional[float]]:
        """``other`` against this choice: each measure as a ratio."""
        return {"gpus": other.gpus_paid / self.gpus_paid, "days": other.days / self.days,
                "gpu_hours": other.gpu_hours / self.gpu_hours,
                "cost": None if self.cost is None or other.cost is None else other.cost / self.cost}

    def trade_text(self, other: "SizeChoice") -> str:
        """What ``other`` trades against this choice, e.g. "1.30× the GPUs for 0.80× the days"."""
        ratio = self.trade(other)
        kind = self._differs(other)
        spent = f"{ratio['cost']:.2f}× the cost" if ratio["cost"] is not None else \
            f"{ratio['gpu_hours']:.2f}× the GPU-hours"
        # The ratio is of the GPUs paid: on part of each rack, more than the GPUs the row shows.
        paid = " paid" if (self.gpus_paid, other.gpus_paid) != (self.gpus, other.gpus) else ""
        return f"{kind}{ratio['gpus']:.2f}× the GPUs{paid} for {ratio['days']:.2f}× the days ({spent})"

    def _differs(self, other: "SizeChoice") -> str:
        """What names ``other``'s cluster where it is not this one's: its GPU type where that differs;
        where the case lists one type twice (reserved, on demand) the entry, as the case names it
        ("cluster.options[1]"), with its price where that differs, since the type alone named a cluster
        that does not differ. Nothing for this entry: a same-type option on part of each rack is
        another object of this entry, which the ratio's "paid" tells."""
        if other.option.key == self.option.key:
            return ""
        if other.option.gpu.name != self.option.gpu.name:
            return f"{other.option.gpu.name}: "
        price = "" if other.price is None or other.price == self.price else \
            f" at {figure_text(other.price, 2)} per GPU-hour"
        return f"{other.option.key}{price}: "

    @property
    def engine(self) -> str:
        """The engine the layout is for: the case's, or where it names none the one `size` chose."""
        return self.estimate.job.training.engine.name

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.option.gpu.name, "option": self.option.key, "gpus": self.gpus, "nodes": self.nodes,
                # GPUs taken (whole racks where the run uses part of each) and of each NVLink domain used
                "gpus_paid": self.gpus_paid, "nvlink_domain": self.estimate.job.cluster.gpu.nvlink_domain,
                "engine": self.engine, "layout": self.estimate.to_dict()["layout"], "step_time_s": self.step_time_s,
                "tokens_per_s": self.tokens_per_s, "days": self.days, "gpu_hours": self.gpu_hours,
                "cost": self.cost,
                # The 80 % band of the tokens/s (as `estimate --json` gives it) carried to the days and
                # the spend: a deadline or a budget read off the point figures alone may be missed.
                "tokens_per_s_band": _listed(self.tokens_per_s_band), "days_band": _listed(self.days_band),
                "gpu_hours_band": _listed(self.gpu_hours_band), "cost_band": _listed(self.cost_band),
                # null on CPUs, which no published run measured (``bands.NO_BAND``)
                "band": None if (band := self.estimate.throughput_band) is None else band.to_dict(),
                "mfu": self.estimate.mfu,
                # `size` times each cluster by its fastest layout: one may fit only at its memory band's low end
                "memory_verdict": self.estimate.memory_verdict, "peak_bytes": whole_bytes(self.estimate.peak.total)}

    @property
    def step_time_s(self) -> float:
        return self.estimate.step_time_s


def undominated(picks: list) -> list:
    """The picks less those another of the same GPU type beats on GPUs, days and spend at once (more
    GPUs for more days at no saving is no trade a user would take; GPUs of two types are no one
    count, and a team may have only one of them: 4,096 H100s meeting the deadline were dropped
    beside 2,048 B200s); the first, the answer, always stays."""
    def spend(p) -> float:
        return p.cost if p.cost is not None else p.gpu_hours

    def beaten(p) -> bool:
        return any(q.option.key == p.option.key and _beats(q.gpus_paid, q.days, p.gpus_paid, p.days)
                   and spend(q) <= spend(p)
                   for q in picks)
    return picks[:1] + [p for p in picks[1:] if not beaten(p)]


# What a sizing found (``Sizing.status``).
OK = "ok"  # an answer within the limits (with neither a deadline nor a budget: the front and its knee)
DEADLINE_NOT_MET = "deadline not met"  # clusters within the limits fit, none meets the deadline
OVER_BUDGET = "over budget"  # no layout fits within the limits (the budget, else the case's); a larger cluster fits
NOTHING_FITS = "nothing fits"  # no layout fits within the limits, nor on any cluster past them the search tried
STATUSES = (OK, DEADLINE_NOT_MET, OVER_BUDGET, NOTHING_FITS)
_CHOICE_KEYS = ("gpu", "option", "gpus", "nodes", "gpus_paid", "nvlink_domain", "engine", "layout", "step_time_s",
                "tokens_per_s", "days", "gpu_hours", "cost", "tokens_per_s_band", "days_band", "gpu_hours_band",
                "cost_band", "band", "mfu", "memory_verdict", "peak_bytes")


@dataclass(frozen=True)
class Sizing:
    # Compared by value, never hashed, as every result the API returns (docs/commands.md, Python API): most
    # hold dicts, which may change after hashing; hash() names the type rather than failing on a dict inside.
    __hash__ = None  # type: ignore[assignment]

    status: str  # one of STATUSES: ok, deadline not met, over budget, nothing fits
    objective: str  # gpu_hours, cost or time; front with neither a deadline nor a budget
    tokens: float
    deadline_s: Optional[float]
    best: Optional[SizeChoice]  # the answer; with neither a deadline nor a budget, the front's knee
    alternatives: tuple[SizeChoice, ...]
    sizes: int  # (type, size) pairs within the limits
    sizes_searched: int  # of those, sizes whose layouts were scored (the rest: no layout could matter)
    layouts_scored: int
    rows: int  # layouts the solver chose among
    no_fit: Optional[str] = None  # unless ok: why, and what would do
    fastest: Optional[SizeChoice] = None  # a missed deadline: the fastest cluster within the limits
    would_meet: Optional[SizeChoice] = None  # unless ok: past the limits, the least spend meeting the deadline
    # (the fewest GPUs that fit, without one)
    solver_status: str = "OPTIMAL"  # CP-SAT's: OPTIMAL, or INFEASIBLE when no row meets the target
    spend: str = "gpu_hours"  # the spend measure: cost where every type has a price, else gpu_hours
    front: tuple[SizeChoice, ...] = ()  # neither a deadline nor a budget: days against spend, the cheapest first
    knee: Optional[SizeChoice] = None  # the front's point of least days × spend (``size_front``)
    spend_bound: Optional[float] = None  # the front's: no size of any type spends less (the work bound)
    # The front's: the most GPUs of the knee's type the limits allow (its last whole node or rack). A knee
    # short of it is no limit binding: the larger sizes considered there ran no faster.
    knee_limit: Optional[int] = None
    # By a deadline: the other sizes within the limits that meet it but are not listed, each beaten by a size
    # of its GPU type on GPUs, days and spend at once (so that "no other size meets it" is said only when true).
    beaten_meeting: int = 0
    notes: tuple[str, ...] = ()  # what the case gives that the sizing could not use (a price of some types only)
    # What makes a hardware profile of the case doubtful, cluster's or an option's (``case.profile_warnings``).
    warnings: tuple[str, ...] = ()

    @property
    def deadline_days(self) -> Optional[float]:
        return None if self.deadline_s is None else self.deadline_s / SECONDS_PER_DAY

    @property
    def reason(self) -> Optional[str]:
        """Unless ok: why nothing within the limits meets the target, and what would."""
        return self.no_fit

    @property
    def knee_index(self) -> Optional[int]:
        return next((i for i, c in enumerate(self.front) if c is self.knee), None)

    def spent(self, choice: SizeChoice) -> float:
        """A choice's spend: its cost where every type has a price, else its GPU-hours."""
        return _spend(choice, self.spend == "cost")

    def picked(self, reader: str) -> SizeChoice:
        """The answer, for ``reader`` (one that prints a result whose status is OK, which has one); a
        CaseError where the sizing found none."""
        if self.best is None:
            raise CaseError(reader, "best", f"the sizing found no answer ({self.status})")
        return self.best

    def _alternatives(self) -> list[dict[str, Any]]:
        """The alternatives as to_dict gives them, each with its trade against the best (only a result
        with a best has alternatives: ``size_case``)."""
        best = self.best
        return [] if best is None else [{**alt.to_dict(), "trade": best.trade(alt), "trades": best.trade_text(alt)}
                                        for alt in self.alternatives]

    def to_dict(self) -> dict[str, Any]:
        best = self.best.to_dict() if self.best else dict.fromkeys(_CHOICE_KEYS)
        front = []
        for i, point in enumerate(self.front):
            before = self.front[i - 1] if i else None
            front.append({**point.to_dict(), "knee": point is self.knee,
                          "trade": before.trade(point) if before else None,
                          "trades": before.trade_text(point) if before else None})
        return {
            **best,
            "alternatives": self._alternatives(),
            "objective": self.objective, "tokens": self.tokens, "deadline_days": self.deadline_days,
            "status": self.status, "solver_status": self.solver_status, "spend": self.spend, "notes": list(self.notes),
            "warnings": list(self.warnings),
            "front": front, "knee": self.knee_index, "spend_bound": self.spend_bound,
            # What the report says beside the answer, which a tool reading the JSON was not told: the most
            # GPUs of the knee's type the limits allow, as gpus_paid counts them (a knee short of it holds no
            # limit binding), and by a deadline the other sizes that meet it though beaten, so not listed
            # (no alternatives is not "no other size meets it").
            "knee_limit": None if self.knee is None or self.knee_limit is None
            else self.knee.option.paid_gpus(self.knee_limit),
            "beaten_meeting": self.beaten_meeting,
            "search": {"sizes": self.sizes, "sizes_searched": self.sizes_searched,
                       "layouts_scored": self.layouts_scored, "rows": self.rows},
            "no_fit": None if self.status == OK else {
                "reason": self.no_fit,
                "fastest": self.fastest.to_dict() if self.fastest else None,
                "would_meet": self.would_meet.to_dict() if self.would_meet else None},
        }


def _check_peaks(src: str, options: Sequence[ClusterOption], precision: str) -> None:
    """A type that has no peak for the precision, refused as its entry (the error named cluster.gpu,
    a key an options case does not have)."""
    for option in options:
        try:
            option.gpu.peak(precision)
        except SpecError as error:
            if error.field == "precision":
                raise CaseError(src, option.key, f"{option.gpu.name} cannot train in {precision}: {error.message}; "
                                                 "drop the type, or train in a precision it has") from None


def _spend(choice: SizeChoice, priced: bool) -> float:
    """A choice's spend: its cost where every type has a price (``priced``), else its GPU-hours."""
    if not priced:
        return choice.gpu_hours
    if choice.cost is None:  # size_case prices every choice where it spends by cost
        raise ValueError(f"{choice.option.gpu.name} has no price, but the spend is its cost")
    return choice.cost


def _knee(points: Sequence[SizeChoice], days: Callable[[SizeChoice], float],
          spent: Callable[[SizeChoice], float]) -> SizeChoice:
    """The knee (``size_front.knee_index``) of points that hold one at least."""
    from .size_front import knee_index

    index = knee_index(points, days, spent)
    if index is None:
        raise ValueError("no point to take the knee of")
    return points[index]


def load_sizing_case(case: Any) -> tuple[Case, tuple[ClusterOption, ...]]:
    """The case (on one node of its first GPU type: `size` chooses the cluster) and its GPU types.

    Like `plan`, `size` chooses the layout: any ``layout`` section is ignored."""
    data, src, base = read_case(case)
    data = read_sections(src, data)
    if "cluster" not in data:
        raise CaseError(src, "cluster", "missing section")
    options = read_cluster_options(src, data["cluster"], base)
    training = data.get("training")
    precision = training.get("precision", "bf16") if isinstance(training, dict) else None
    if isinstance(precision, str):
        # Refused as the training's key, not a GPU's (it was "cluster: h100-sxm-80gb cannot train in banana");
        # read as build_case reads it, so that "BF16" is bf16 here too.
        precision = read_choice(src, "training.precision", precision, PRECISIONS)
    if isinstance(precision, str):
        _check_peaks(src, options, precision)
    dispatch = training.get("expert_dispatch") if isinstance(training, dict) else None
    dispatch = canonical_choice(dispatch, EXPERT_DISPATCHES) if isinstance(dispatch, str) else dispatch
    for option in options if dispatch == "deepep" else ():
        # Every layout of such a type would refuse it: the type vanished from the answer without a word
        # where it came after the first (build_case holds the first type to it).
        if option.gpu.deepep_refusal:
            raise CaseError(src, option.key, f"{option.gpu.name} cannot run training.expert_dispatch deepep "
                                             f"({option.gpu.deepep_refusal}); drop the type, or dispatch all_to_all")
    first = options[0]
    loaded = build_case({k: v for k, v in data.items() if k != "layout"}, src, base,
                        cluster=first.cluster(first.unit), cluster_key=first.key)
    stated = outside_key(first.cluster(first.unit).gpu) in (data.get("overheads") or {})
    # Each GPU type leaves the allocator some memory, named where it is given.
    for i, option in enumerate(options[1:], 1):
        check_usable_memory(src, option.cluster(option.unit), loaded.overheads, loaded.search, stated, option.key,
                            data["cluster"]["options"][i])
    return loaded, options


def size(case: CaseArg, tokens: Union[FloatArg, str], deadline: Optional[str] = None,
         max_gpus: Optional[IntArg] = None, max_nodes: Optional[IntArg] = None, gpu_hour_cost: Optional[FloatArg] = None,
         top_k: Optional[IntArg] = None,
         progress: Optional[Callable[[int, int], None]] = None) -> Sizing:
    """Python API: size a case (path or dict in the case-file schema) for ``tokens`` (15e12 or
    "15T"), optionally by a ``deadline`` ("60d", "36h"), within ``max_gpus`` or ``max_nodes``
    (of any one type), at ``gpu_hour_cost`` per GPU-hour (replacing every type's price);
    ``progress(done, total)`` is told of each cluster size as it is searched."""
    from .plan import case_notes, check_ignored_layout, unstated_loss

    target = size_target(tokens, deadline, max_gpus, max_nodes, gpu_hour_cost, top_k)
    if progress is None:  # as documented: no progress told
        progress = lambda done, total: None  # noqa: E731
    if not callable(progress):
        raise CaseError("size", "progress",
                        f"expected a function of (sizes done, sizes in all), got {one_line(safe_repr(progress), 60)}")
    # A malformed layout section is the case's error, as under plan; a well-formed one, a note.
    ignored = check_ignored_layout(case, "size")
    loaded, options = load_sizing_case(case)
    if target.gpu_hour_cost is not None:  # one price for every type: entries that differed only in theirs
        for i, option in enumerate(options):
            same = next((o.key for o in options[:i] if (o.gpu, o.fabric) == (option.gpu, option.fabric)), None)
            if same is not None:
                raise CaseError("size", "gpu_hour_cost", f"gives {option.key} the price of {same}, the same GPU "
                                                         "type and fabric: it would be its own runner-up; give each once")
    result = size_case(loaded, options, target, progress)
    return replace(result, notes=tuple(n for n in (ignored, unread_count_note(case, options, target), *result.notes,
                                                   unpriced_note(options, target),
                                                   part_unit_note(loaded.source, options, target),
                                                   fitted_note(result), *case_notes(case, loaded),
                                                   # the answer's loss, as plan says it of its best
                                                   unstated_loss(loaded.source, result.best.estimate.job)
                                                   if result.best is not None else None) if n),
                   warnings=tuple(profile_warnings(case)))


def fitted_note(result: Sizing) -> Optional[str]:
    """Where the answer (or, with none, the fastest within the limits) runs on a profile fitted to a
    team's runs and leaves what those runs covered: where, and the fitted figure it leans on there
    (``fitted.outside``), as `estimate` and `plan` say it."""
    choice = result.best or result.fastest
    outside = choice.estimate.outside_fitted_runs if choice is not None else []
    if choice is None or not outside:
        return None
    what = "the answer" if result.best is not None else "the fastest within the limits"
    return f"{what}, {choice.gpus:,} × {choice.option.gpu.name}: " + "; ".join(outside)


def unpriced_note(options: Sequence[ClusterOption], target: SizeTarget) -> Optional[str]:
    """Prices given for some GPU types only: cost cannot be weighed, so it goes unused."""
    priced = [o.key for o in options if o.gpu_hour_cost is not None]
    if target.gpu_hour_cost is not None or not priced or len(priced) == len(options):
        return None
    unpriced = [o.key for o in options if o.gpu_hour_cost is None]
    return (f"{', '.join(k + '.gpu_hour_cost' for k in priced)} given, none for {', '.join(unpriced)}: with a price "
            "for some GPU types only, size weighs GPU-hours, not cost; give each type a price (or --gpu-hour-cost)")


def unread_count_note(case: Any, options: Sequence[ClusterOption], target: SizeTarget) -> Optional[str]:
    """A line where the cluster section gives both the GPUs `plan` runs on (num_gpus or nodes) and
    `size`'s limit (max_gpus or max_nodes): size reads the limit alone (``read_cluster_options``), and
    took it over num_gpus without a word, above or below it. The converse of plan's
    ``ignored_sizing_keys``. None where a budget on the command line replaces both (as documented)."""
    if target.max_gpus is not None or target.max_nodes is not None or options[0].key != "cluster":
        return None
    data, src, _ = read_case(case)
    section = data.get("cluster") if isinstance(data, dict) else None
    if not isinstance(section, dict):
        return None
    count = next((k for k in ("num_gpus", "nodes") if k in section), None)
    limit = options[0].limit_key
    if count is None or limit in (None, f"cluster.{count}"):
        return None
    return (f"{src}: size may use up to {limit} ({options[0].max_gpus:,} GPUs) and does not read "
            f"cluster.{count} ({section[count]}), the {'GPUs' if count == 'num_gpus' else 'nodes'} `plan` runs on")


def part_unit_note(source: str, options: Sequence[ClusterOption], target: SizeTarget) -> Optional[str]:
    """A limit that is not whole nodes (or racks): size considers whole ones only, so the GPUs
    past the last whole one go unused; said, not left for the user to find in the answer."""
    parts = []
    limits = [gpu_limit(source, option, target) for option in options]
    for option, most in zip(options, limits):
        if not most % option.unit:
            continue
        given = ("--max-gpus" if most == target.max_gpus else
                 "--max-nodes" if target.max_nodes is not None else option.limit_key or option.key)
        if most >= option.unit:
            parts.append(f"{given} gives {most:,} {option.gpu.name} GPUs, not whole {option.unit_name}s of "
                         f"{option.unit}: size considers whole {option.unit_name}s, up to {most // option.unit * option.unit:,}")
        elif any(n >= o.unit for o, n in zip(options, limits)):
            # Less than one unit: the type is left out whole, while the answer (of another type) reads as if
            # it had been weighed. With no type left at all, the answer's reason says so ("no whole node or rack").
            parts.append(f"{given} gives {most:,} {option.gpu.name} GPUs, less than one {option.unit_name} of "
                         f"{option.unit}: size leaves {option.key} ({option.gpu.name}) out")
    return "; ".join(parts) or None


def gpu_limit(source: str, option: ClusterOption, target: SizeTarget) -> int:
    """The most GPUs of this type `size` may use: a budget given with the call (--max-gpus,
    --max-nodes) is the budget, above or below the case's; else the case's."""
    budget = [n for n in (target.max_gpus, None if target.max_nodes is None
                          else target.max_nodes * option.gpu.gpus_per_node) if n is not None]
    given = budget or ([option.max_gpus] if option.max_gpus is not None else [])
    if not given:
        key = "cluster.num_gpus" if option.key == "cluster" else f"{option.key}.max_gpus"
        raise CaseError(source, key, "missing; size needs the most GPUs of each type it may use: give max_gpus or "
                                     "max_nodes (for one type also num_gpus or nodes), or --max-gpus or --max-nodes")
    most = min(min(given), MAX_GPUS)
    return most // option.rack * option.unit if option.rack else most  # on part of each rack: the GPUs used


def work_lower_bound(case: Case, spec: SearchSpec, gpu: GPUSpec) -> float:
    """GPU-seconds per step that no layout on any number of these GPUs goes below.

    A step is at least m times its slowest stage, each stage runs its layers' forward and
    backward for each micro-batch (``stage_time.stage_time``), so with L layers in pp stages,
    m = B / (b·dp) micro-batches and N = dp·tp·cp·pp GPUs:
    N · step ≥ B·L · t_layer(tp, cp, b) · tp·cp / b, where t_layer is the least forward and
    backward of one layer on one GPU (``layer_time.layer_time_bound``). The least over every shape the search may
    choose (tp, cp, micro-batch b, sequence parallelism) holds on every cluster size: a size
    of N GPUs cannot step faster than this / N."""
    model, training = case.model, case.training
    least = math.inf
    for tp in divisors(model.num_attention_heads):
        if (tp > gpu.nvlink_domain and not spec.tp_across_nodes) or not spec.admits("tp", tp):
            continue
        for cp in sorted({1, *divisors(max(training.seq_len // 2, 1))}):
            if cp_too_thin(spec, training.seq_len, cp):  # plan's floor, lifted where the case names cp
                continue
            if not spec.admits("cp", cp):
                continue
            for mbs in divisors(training.global_batch_size):
                for sp in ((False,) if tp == 1 else (False, True)):
                    if spec.admits("micro_batch_size", mbs) and spec.admits("sequence_parallel", sp):
                        with spec_errors(case.source):
                            layer = layer_time_bound(model, training, gpu, tp, cp, mbs, sp)
                        least = min(least, training.global_batch_size * model.num_layers * layer * tp * cp / mbs)
    return least


# How many times a sweep searches again the sizes its cut skipped, each time the cut loosens.
MAX_RESWEEPS = 8


class _Sweep:
    """The enumeration of (type, size) pairs and their searches, with what it has found so far."""

    def __init__(self, case: Case, spec: SearchSpec, options: tuple[ClusterOption, ...], limits: list[int],
                 weights: list[float], objective: str, step_deadline: Optional[float], keep: int,
                 progress: Callable[[int, int], None] = lambda done, total: None):
        self.case, self.spec, self.options, self.limits = case, spec, options, limits
        self.progress = progress  # (sizes done, sizes in this pass): a terminal's bar
        self.weights, self.objective, self.step_deadline, self.keep = weights, objective, step_deadline, keep
        self.rows: list = []
        self.searched = self.scored = 0
        # The case as each engine runs it on each GPU type: where it names none, every engine that
        # can run it there, as `plan` decides between them (plan_engines); else the case alone.
        self.variants = [engine_variants(case, spec, o.gpu) for o in options]
        self.work = [min((work_lower_bound(c, s, o.gpu) for c, s in v), default=math.inf)
                     for o, v in zip(options, self.variants)]
        self.cut: list[float] = []  # the `keep` best values of sizes that meet the deadline, as a max-heap
        # Per GPU type, the (GPUs, step) of each size meeting the deadline that no other of the type beats on
        # GPUs and step at once (and so on spend): the cut counts only these. A size the type's own beats is
        # no runner-up a user would take (:func:`undominated`): counted, the shortest time's cut filled with
        # larger, slower clusters and skipped the smaller ones worth weighing (Llama 3 70B within 65,536
        # GPUs: 4 sizes kept, 3 of them beaten, no runner-up; 16,384 B200s at 13.9 days is one).
        self.front: list[list[tuple[int, float]]] = [[] for _ in options]

    def sizes(self) -> list[tuple[int, int]]:
        pairs = [(i, n) for i, o in enumerate(self.options) for n in range(o.unit, self.limits[i] + 1, o.unit)]
        return sorted(pairs, key=lambda p: (-p[1] if self.objective == "time" else p[1], p[0]))

    def value(self, option: int, gpus: int, step_s: float) -> float:
        return step_s if self.objective == "time" else self.weights[option] * gpus * step_s

    def ceiling(self, option: int, gpus: int) -> float:
        """The slowest step on this size that could still be the answer or an alternative."""
        ceiling = math.inf if self.step_deadline is None else self.step_deadline
        if len(self.cut) >= self.keep:
            worst = -self.cut[0]
            ceiling = min(ceiling, worst if self.objective == "time" else worst / (self.weights[option] * gpus))
        # The solver compares whole microseconds: a step within one of the ceiling may still tie.
        return ceiling * (1 + 1e-9) + 1e-6

    def cluster_case(self, option: int, gpus: int, engine: Optional[str] = None) -> Case:
        """The case on this size, as ``engine`` runs it (one the sweep plans for) or as written."""
        case = next((c for c, s in self.variants[option] if s.target == engine), self.case)
        return replace(case, cluster=self.options[option].cluster(gpus), fitted=self.options[option].fitted)

    def fastest(self, option: int, gpus: int, ceiling: float = math.inf) -> list[Candidate]:
        """Plan's fastest layouts on this size, and those the solver could not tell from them: of
        each engine the sweep plans for, fastest first."""
        tables: list[Candidate] = []
        searched = False
        for case, spec in self.variants[option]:
            cluster_case = replace(case, cluster=self.options[option].cluster(gpus), fitted=self.options[option].fitted)
            result, table = layout_table(cluster_case, spec, TIE_WINDOW, ceiling)
            searched = searched or bool(result.scored)
            self.scored += result.scored
            if table and table[0].step_time_s * TIE_WINDOW < TIE_SPAN_S:
                result, table = layout_table(cluster_case, spec, TIE_SPAN_S / table[0].step_time_s, ceiling)
                self.scored += result.scored
            tables += table
        self.searched += searched
        return sorted(tables, key=lambda c: c.step_time_s)

    def run(self) -> "_Sweep":
        from .size_solver import SizeRow, within_deadline

        pairs = self.sizes()
        skipped: list[tuple[int, int, float]] = []  # (type, size, the ceiling it was skipped under)

        def visit(option: int, gpus: int) -> None:
            ceiling = self.ceiling(option, gpus)
            if self.work[option] / gpus > ceiling:  # too few GPUs for any layout to step that fast
                skipped.append((option, gpus, ceiling))
                return
            table = self.fastest(option, gpus, ceiling)
            if not table and ceiling < math.inf:
                skipped.append((option, gpus, ceiling))
            self.rows += [SizeRow(option, gpus, c) for c in table]
            if table and (self.step_deadline is None or within_deadline(table[0].step_time_s, self.step_deadline)):
                self._keep_unbeaten(option, gpus, table[0].step_time_s)

        for done, (option, gpus) in enumerate(pairs, 1):
            self.progress(done, len(pairs))
            visit(option, gpus)
        # The cut loosens where a size beats sizes it held (a smaller, faster one of their type): what it
        # skipped under the tighter bound is searched again under the looser (an 8B on 2 GPUs was skipped
        # under the bound of 4 and 8 GPUs that 2 GPUs then beat, and the answer missed a runner-up).
        for _ in range(MAX_RESWEEPS):
            again = [(option, gpus) for option, gpus, ceiling in skipped if self.ceiling(option, gpus) > ceiling]
            if not again:
                break
            searched = set(again)  # a set: a list made this quadratic in the sizes skipped (32 s at 2^20 GPUs)
            skipped = [entry for entry in skipped if entry[:2] not in searched]
            for option, gpus in again:
                visit(option, gpus)
        return self

    def _keep_unbeaten(self, option: int, gpus: int, step_s: float) -> None:
        """Count a size in the cut unless one of its type beats it; drop those it beats."""
        kept = self.front[option]
        if any(_beats(g, s, gpus, step_s) for g, s in kept):
            return
        kept[:] = [(g, s) for g, s in kept if not _beats(gpus, step_s, g, s)] + [(gpus, step_s)]
        values = sorted(self.value(o, g, s) for o, sizes in enumerate(self.front) for g, s in sizes)
        self.cut = [-v for v in values[:self.keep]]
        heapq.heapify(self.cut)

    def unbeaten_rows(self) -> list:
        """The rows of the sizes no size of their type beats on GPUs and fastest step at once."""
        fastest: dict[tuple[int, int], float] = {}
        for row in self.rows:
            key = (row.option, row.gpus)
            fastest[key] = min(fastest.get(key, math.inf), row.candidate.step_time_s)
        by_option: dict[int, list[tuple[int, float]]] = {}
        for (option, gpus), step_s in fastest.items():
            by_option.setdefault(option, []).append((gpus, step_s))
        beaten = {(o, g) for o, sizes in by_option.items() for g, s in sizes
                  if any(_beats(g2, s2, g, s) for g2, s2 in sizes)}
        return [row for row in self.rows if (row.option, row.gpus) not in beaten]


def _beats(gpus: int, step_s: float, other_gpus: int, other_step_s: float) -> bool:
    """Whether a size of one GPU type beats another of the same: no more GPUs, no slower, and better
    in one (then no more spend either: GPUs × step)."""
    return gpus <= other_gpus and step_s <= other_step_s and (gpus < other_gpus or step_s < other_step_s)


def engine_variants(case: Case, spec: SearchSpec, gpu: GPUSpec) -> list[tuple[Case, SearchSpec]]:
    """(the case, its search) as each engine that `plan` decides between runs it on ``gpu``, where
    the case names no engine (``search.target`` any), those whose engine can run its training
    there; else the case as written. `size` on a case with no engine then sizes for the engine
    `plan` would choose on each size, not for plain PyTorch."""
    if spec.target != "any":
        return [(case, spec)]
    variants = []
    for name in DECIDED_ENGINES:
        retargeted, training = retarget(case.source, spec, case.training, name)
        if not ENGINES[name].training_problems(training, gpu, case.model):
            variants.append((replace(case, training=training, search=retargeted), retargeted))
    return variants


def size_case(case: Case, options: tuple[ClusterOption, ...], target: SizeTarget,
              progress: Callable[[int, int], None] = lambda done, total: None) -> Sizing:
    from .size_solver import SizeModel, SizeRow  # ortools loads in ~0.3 s: only `plan` and `size` pay for it

    _check_size(case)  # layers and global batch within what the search can enumerate
    options = with_part_racks(options)
    spec = replace(case.search, top_k=0)  # each size's table: its fastest layouts only
    limits = [gpu_limit(case.source, o, target) for o in options]
    sizes = sum(limit // o.unit for o, limit in zip(options, limits))
    if sizes > MAX_CLUSTER_SIZES:
        raise CaseError(case.source, "cluster", f"{sizes:,} cluster sizes (whole nodes or racks of each GPU type up to "
                                                f"its limit); at most {MAX_CLUSTER_SIZES:,} can be sized: lower "
                                                f"max_gpus, max_nodes, --max-gpus or --max-nodes, or give fewer types")
    prices = [target.gpu_hour_cost if target.gpu_hour_cost is not None else o.gpu_hour_cost for o in options]
    rates = [p for p in prices if p is not None]
    priced = len(rates) == len(prices)
    budget = target.max_gpus is not None or target.max_nodes is not None
    front_mode = target.deadline_s is None and not budget
    objective = "front" if front_mode else "time" if target.deadline_s is None else "cost" if priced else "gpu_hours"
    # Spend per GPU used and second: where a run uses part of each rack, the whole rack's.
    weights = [rate * o.paid_unit / o.unit for rate, o in zip(rates if priced else [1.0] * len(options), options)]
    tokens_per_step = case.training.global_batch_size * case.training.seq_len
    check_run_tokens(case, target.tokens, "size")  # a run shorter than one step: its deadline per step is endless
    step_deadline = None if target.deadline_s is None else target.deadline_s * tokens_per_step / target.tokens
    gbs = case.training.global_batch_size

    def decide(sweep: _Sweep, objective: str, deadline: Optional[float], count: int) -> tuple[str, list[SizeRow]]:
        model = SizeModel(sweep.rows, options, limits, weights, spec, gbs, objective, deadline, case.overheads)
        status, chosen = "INFEASIBLE", list[SizeRow]()
        for _ in range(count):
            solution = model.solve()
            if solution.index is None:
                break
            status = status if chosen else solution.status
            chosen.append(sweep.rows[solution.index])
            model.exclude_size(solution.index)
        return status, chosen

    def choice(sweep: _Sweep, row) -> SizeChoice:
        found = row.candidate  # the search's own job and time where it kept them
        cluster_case = sweep.cluster_case(row.option, row.gpus, found.job.training.engine.name if found.job else None)
        job = found.job or cluster_case.job(found.layout)
        return SizeChoice(options[row.option], estimate_job(cluster_case, job, found.time),
                          target.tokens, prices[row.option])

    def common(sweep: _Sweep, solver_status: str) -> dict[str, Any]:
        return dict(objective=objective, tokens=target.tokens, deadline_s=target.deadline_s, sizes=len(sweep.sizes()),
                    sizes_searched=sweep.searched, layouts_scored=sweep.scored, rows=len(sweep.rows),
                    solver_status=solver_status, spend="cost" if priced else "gpu_hours")

    if front_mode:
        from .size_front import FRONT_SPAN, FrontSweep, pareto_front

        sweep = _Sweep(case, spec, options, limits, weights, "gpu_hours", None, 1, progress)
        steps = target.tokens / tokens_per_step
        found = FrontSweep(sweep, steps).run()
        if not found.points and sweep.sizes():  # no considered size fits: consider every one
            found = FrontSweep(sweep, steps, pairs=sweep.sizes()).run()
        sweep.rows = [SizeRow(option, gpus, c) for (option, gpus), table in found.tables.items() for c in table]
        status, chosen = decide(sweep, "time", None, len(found.tables))  # each size's layout, as plan chooses it
        if chosen:
            picks = [choice(sweep, row) for row in chosen]

            def days(c: SizeChoice) -> float:
                return c.days

            def spent(c: SizeChoice) -> float:
                return _spend(c, priced)

            knee = _knee(picks, days, spent)
            front = pareto_front([c for c in picks if c.days <= FRONT_SPAN * knee.days * (1 + 1e-12)], days, spent)
            knee = _knee(front, days, spent)
            limit = limits[next(i for i, o in enumerate(options) if o is knee.option)]
            return Sizing(OK, best=knee, alternatives=(), front=tuple(front), knee=knee,
                          spend_bound=found.spend_bound, knee_limit=limit // knee.option.unit * knee.option.unit,
                          **common(sweep, status))
        return _unmet(sweep, options, limits, step_deadline, choice, decide, common(sweep, status),
                      lambda: ([], None))

    # --top limits the list, not what is counted: the sweep and the solver look for one runner-up at
    # least, whatever --top, as beaten_meeting needs to know whether the answer stands alone (under
    # --top 0 the cut held one size, skipped the rest as dearer and counted 1 of 3 that met the deadline).
    wanted = max(target.top_k, 1) + 1
    # Racks used whole and in part are two options whose sizes beat each other only once both are
    # priced (undominated): the sweep keeps twice the runners-up there, so that the list can be filled.
    kept = wanted * (2 if any(option.rack for option in options) else 1)
    sweep = _Sweep(case, spec, options, limits, weights, objective, step_deadline, kept, progress).run()
    all_rows, sweep.rows = sweep.rows, sweep.unbeaten_rows()  # the runners-up among sizes not beaten
    # Sizes a rack's whole and partial use beat across each other (undominated) leave the list short of
    # --top: more are asked for until it is full or none is left (GB200's next best lost 14 partial racks).
    count, picks, status = wanted, [], "INFEASIBLE"
    while True:
        status, chosen = decide(sweep, objective, step_deadline, count)
        picks = undominated([choice(sweep, row) for row in chosen])
        if len(picks) >= wanted or len(chosen) < count:
            break
        count += wanted - len(picks)
    sweep.rows = all_rows
    if picks:
        alone = len(picks) == 1  # no runner-up within the limits: the others meeting the deadline are beaten
        return Sizing(OK, best=picks[0], alternatives=tuple(picks[1:target.top_k + 1]),
                      beaten_meeting=_beaten_meeting(all_rows, chosen[0], step_deadline) if alone else 0,
                      **common(sweep, status))

    def quickest() -> tuple[list, Optional[_Sweep]]:
        """The fastest cluster within the limits (none when nothing fits there), and the sweep that found it.
        Its sizes are the first sweep's, searched again: the terminal's bar, which counted them to the end
        once, is not started over."""
        if step_deadline is None:  # the sweep was for the shortest time: it found nothing that fits
            return [], None
        fastest_sweep = _Sweep(case, spec, options, limits, weights, "time", None, 1).run()
        return [choice(fastest_sweep, row) for row in decide(fastest_sweep, "time", None, 1)[1]], fastest_sweep
    return _unmet(sweep, options, limits, step_deadline, choice, decide, common(sweep, status), quickest)


def _beaten_meeting(rows: list, answer, step_deadline: Optional[float]) -> int:
    """Where the answer (its row) is listed alone: the other sizes of ``rows`` that meet the deadline, each
    left out as beaten by one of its type. The sweep's cut skips a size only once it holds as many that meet
    it as the list can take, so where the answer stands alone every size that meets it is among ``rows``."""
    from .size_solver import within_deadline

    if step_deadline is None:
        return 0
    meeting = {(r.option, r.gpus) for r in rows if within_deadline(r.candidate.step_time_s, step_deadline)}
    return len(meeting - {(answer.option, answer.gpus)})


def _unmet(sweep: _Sweep, options: tuple[ClusterOption, ...], limits: list[int], step_deadline: Optional[float],
           choice, decide, common: dict[str, Any], quickest) -> Sizing:
    """Nothing within the limits meets the target: why, the fastest cluster there, and the
    fewest GPUs past the limits that would fit and meet the deadline."""
    def gpus_text(c) -> str:
        part = f" ({c.option.per_unit_text})" if c.option.rack else ""
        return f"{c.gpus:,} {c.option.gpu.name} GPUs{part}"

    fastest, again = quickest() if sweep.sizes() else ([], None)
    if again is not None:  # what the search for the fastest scored counts as searched too
        common = {**common, "sizes_searched": common["sizes_searched"] + again.searched,
                  "layouts_scored": common["layouts_scored"] + again.scored}
    if fastest:  # clusters fit within the limits, none meets the deadline
        fastest = fastest[0]
        reason = (f"no cluster within the limits meets the deadline of {duration_text(common['deadline_s'])}: "
                  f"the fastest, {gpus_text(fastest)}, takes {figure_text(fastest.days, 1)} days")
        would = _would_meet(sweep, options, limits, step_deadline)
        met = choice(sweep, would) if would is not None else None
        reason += f"; {gpus_text(met)} would take {figure_text(met.days, 1)} days" if met else \
            f"; no cluster up to {ADVICE_REACH}× the limits would"
        return Sizing(DEADLINE_NOT_MET, best=None, alternatives=(), **common, no_fit=reason, fastest=fastest,
                      would_meet=met)
    # No layout fits within the limits: plan's advice at the largest, and the fewest GPUs past them that fit.
    refused: Optional[CaseError] = None  # plan's refusal of the case on the largest cluster
    if sweep.sizes():
        option = max(range(len(options)), key=lambda i: limits[i] // options[i].unit * options[i].unit)
        largest = limits[option] // options[option].unit * options[option].unit
        where = f"the largest cluster within the limits: {largest:,} {options[option].gpu.name} GPUs"
        try:
            # `plan` on that cluster, as it answers the same case there: with no engine named, each engine's
            # advice (plan_case alone priced plain PyTorch, which plan does not pick, and said "no layout").
            advice = plan(sweep.cluster_case(option, largest)).no_fit
            reason = f"{advice.describe()} ({where})" if advice else f"no layout fits ({where})"
        except CaseError as error:  # plan refuses it there: pins more GPUs may meet, an engine that cannot run it
            refused, advice, reason = error, None, f"{error.expected} ({where})"
    else:
        units = ", ".join(f"{o.gpu.name} {o.unit} GPUs per {o.unit_name}" for o in options if not o.rack)
        advice, reason = None, f"the limits leave no whole node or rack of any type ({units})"
    would = _would_meet(sweep, options, limits, step_deadline)
    if would is not None:
        met = choice(sweep, would)
        meet = f" and meet the deadline ({figure_text(met.days, 1)} days)" if step_deadline is not None else ""
        if advice:  # the GPUs that would fit are said once, past the limits, with their type
            reason = f"{replace(advice, gpus_that_fit=None).describe()} ({where})"
        return Sizing(OVER_BUDGET, best=None, alternatives=(), **common, would_meet=met,
                      no_fit=f"{reason}; past the limits, {gpus_text(met)} would fit{meet}")
    if step_deadline is not None and (fits := _would_meet(sweep, options, limits, None)) is not None:
        if advice:  # as above: the GPUs that would fit, said once
            reason = f"{replace(advice, gpus_that_fit=None).describe()} ({where})"
        return Sizing(OVER_BUDGET, best=None, alternatives=(), **common,
                      no_fit=f"{reason}; past the limits, {gpus_text(choice(sweep, fits))} would fit, but none up to "
                             f"{ADVICE_REACH}× the limits would meet the deadline")
    if refused is not None:
        # No size within the limits or past them has a layout, and `plan` refuses the case on the largest (pins
        # no layout meets, an engine that cannot run it): the case's error, exit 2 with plan's line, not
        # "nothing fits" (exit 3), which says layouts exist and overflow memory (docs/commands.md, Exit codes).
        raise refused
    return Sizing(NOTHING_FITS, best=None, alternatives=(), **common, no_fit=reason)


def _would_meet(sweep: _Sweep, options: tuple[ClusterOption, ...], limits: list[int],
                step_deadline: Optional[float]):
    """Past the limits, the size on which a layout fits and (with a deadline) meets it: the powers of
    two of nodes (or racks) past the limit until one does, up to ADVICE_REACH (64) times the limit
    (from one node or rack where the limit allows none), then bisecting back in whole nodes (or
    racks). Without a deadline, the fewest GPUs that fit, of the type that spends least there; with
    one, of every size tried that meets it, the one that spends least (as the deadline's answer
    does). The row of its fastest layout, or None."""
    from .size_solver import SizeRow, within_deadline

    tried: list = []  # every size tried that met it

    def meets(option: int, units: int) -> Optional[Candidate]:
        table = sweep.fastest(option, units * options[option].unit,
                              math.inf if step_deadline is None else step_deadline)
        if not table:
            return None
        hit = table[0] if step_deadline is None or within_deadline(table[0].step_time_s, step_deadline) else None
        if hit is not None:
            tried.append(SizeRow(option, units * options[option].unit, hit))
        return hit

    # The degrees the case's search pins multiply into every size that can hold them: the ladder
    # climbs in multiples of the nodes that do (pp 7 pinned: 7 nodes of 8 GPUs; only powers of two
    # of nodes were tried, and 14,336 B200s meeting the deadline were said not to exist).
    pinned = math.prod(sweep.spec.pins.get(degree, 1) for degree in ("dp", "tp", "pp", "cp"))
    found = []
    for option, unit in enumerate(o.unit for o in options):
        step = pinned // math.gcd(pinned, unit)  # nodes (or racks) per size that holds the pinned degrees
        start = limits[option] // unit // step  # in steps: every size up to here is within the limits
        reach = max(start, 1) * ADVICE_REACH
        low = high = start
        hit = None
        while hit is None:
            # Powers of two of nodes: a global batch splits over them where 1,000 · 2^k GPUs leave a
            # factor of 125 that no degree divides (a limit of 1,000 found nothing up to 64,000).
            bigger = 1 << high.bit_length()
            if bigger > reach or bigger * step * unit > MAX_GPUS:
                break
            low, high = high, bigger
            hit = meets(option, high * step)
        if hit is None:
            continue
        while low + 1 < high:
            mid = (low + high) // 2
            attempt = meets(option, mid * step)
            if attempt is not None:
                high, hit = mid, attempt
            else:
                low = mid
        found.append(SizeRow(option, high * step * unit, hit))

    def spend(row) -> tuple[float, int]:
        return sweep.weights[row.option] * row.gpus * row.candidate.step_time_s, row.gpus

    if step_deadline is not None:
        # The deadline's answer spends least: so does its advice, of every size tried (8,192 B200s
        # meet 30.3 days for 17.6M where the fewest that meet, 7,168, spend 23.5M: docs/sizing.md).
        return min(tried, key=spend, default=None)
    return min(found, key=spend, default=None)
