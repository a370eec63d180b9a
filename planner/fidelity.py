"""How right the cost model is on published runs, four ways.

- throughput: predicted tokens/s against measured, mean |error| per source; the headline is
  the mean over sources, so that one large table cannot dominate it. A layout sweep
  publishes pathological layouts too: rows measured below half the best layout of their own
  job are left to the sweep measure.
- memory: predicted peak memory per GPU against the published peak (GiB, torch's allocator
  counters), per source; where a source publishes one rank's, that rank's stage
  (``published_runs.published_memory_stage``).
- sweeps: in each published sweep (same model, GPUs, global batch, sequence and precision, at
  least five layouts), the layout the model ranks fastest among those it predicts to fit,
  against the best measured: regret = best measured / measured of the pick − 1; and the
  Spearman rank correlation of predicted and measured throughput.
- experts: for each tuned recipe (Megatron-Bridge, NeMo, torchtitan, MLPerf), ``plan`` on the
  same job: the gain it claims over the recipe's own layout, and recipes that ran but are
  predicted not to fit.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from .errors import CaseError, one_line
from .published_runs import (case_of, copied_run, job_key, load_rows, measured_tokens_per_s, published_memory_stage,
                             row_key, row_name, row_problem, source_of, stated_problem, unsupported)
from .team_runs import impossible_measurement

TUNED = ("Megatron-Bridge", "NVIDIA-NeMo/Megatron-Bridge", "torchtitan", "MLPerf", "NVIDIA/NeMo")
MIN_SWEEP = 5


@dataclass(frozen=True)
class Row:
    """One published run the model could estimate."""

    row: dict
    case: dict
    predicted: float  # tokens/s
    measured: Optional[float]  # tokens/s
    fits: bool
    peak_gib: float
    measured_gib: Optional[float]
    verdict: str = "fits"  # the memory verdict: fits, at risk (its band straddles the usable memory)

    @property
    def source(self) -> str:
        return source_of(self.row)

    @property
    def job(self) -> tuple:
        """What a sweep holds fixed."""
        c = self.case
        return (self.source, c["model"]["name"], self.row["num_gpus"], c["training"]["global_batch_size"],
                c["training"]["seq_len"], c["training"]["precision"])


@dataclass(frozen=True)
class Summary:
    count: int
    mean_abs: float
    median_abs: float
    max_abs: float
    bias: float

    @staticmethod
    def of(errors: Iterable[float]) -> "Summary":
        e = list(errors)
        a = [abs(x) for x in e]
        return Summary(len(e), statistics.mean(a), statistics.median(a), max(a), statistics.mean(e))


@dataclass(frozen=True)
class Sweep:
    job: tuple
    size: int
    rho: float
    regret: float  # inf where nothing measured is predicted to fit
    pick: Optional[dict]  # the picked layout


@dataclass
class Fidelity:
    rows: list[Row] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_first: dict[str, str] = field(default_factory=dict)  # the first run skipped for each reason
    malformed: list[tuple[str, str]] = field(default_factory=list)  # (row, why): not a run as the schema has it
    failed: list[tuple[str, str]] = field(default_factory=list)
    throughput: dict[str, Summary] = field(default_factory=dict)
    memory: dict[str, Summary] = field(default_factory=dict)
    sweeps: list[Sweep] = field(default_factory=list)
    expert_gains: list[tuple[str, float]] = field(default_factory=list)
    expert_misfits: list[str] = field(default_factory=list)
    expert_at_risk: list[str] = field(default_factory=list)  # recipes whose memory band straddles the usable
    experts_scored: int = 0

    # Each headline is None where nothing was scored.
    @property
    def throughput_headline(self) -> Optional[float]:
        return statistics.mean(s.mean_abs for s in self.throughput.values()) if self.throughput else None

    @property
    def memory_headline(self) -> Optional[float]:
        return statistics.mean(s.mean_abs for s in self.memory.values()) if self.memory else None

    @property
    def median_regret(self) -> Optional[float]:
        return statistics.median(s.regret for s in self.sweeps) if self.sweeps else None

    @property
    def max_regret(self) -> float:
        return max((s.regret for s in self.sweeps if s.regret != float("inf")), default=0.0)

    @property
    def median_rho(self) -> Optional[float]:
        return statistics.median(s.rho for s in self.sweeps) if self.sweeps else None

    @property
    def median_gain(self) -> Optional[float]:
        return statistics.median(g for _, g in self.expert_gains) if self.expert_gains else None

    @property
    def gains_above_10pct(self) -> list[str]:
        """Recipes plan claims to beat by more than 10 % though the model says they fit with margin."""
        risky = set(self.expert_at_risk)
        return [rid for rid, g in self.expert_gains if g > 0.10 and rid not in risky]


def spearman(a: list[float], b: list[float]) -> float:
    n = len(a)
    ra = {i: k for k, i in enumerate(sorted(range(n), key=lambda i: a[i]))}
    rb = {i: k for k, i in enumerate(sorted(range(n), key=lambda i: b[i]))}
    return 1 - 6 * sum((ra[i] - rb[i]) ** 2 for i in range(n)) / (n * (n * n - 1))


def evaluate(rows: Optional[list[dict]] = None, experts: bool = True,
             estimate: Optional[Callable] = None, plan: Optional[Callable] = None,
             progress: Optional[Callable[[int, int], None]] = None) -> Fidelity:
    """Score the model on ``rows`` (the repo's published runs by default); ``progress(done, total)``
    is told of each tuned recipe planned."""
    if estimate is None or plan is None:
        from .estimate import estimate as estimate_api
        from .plan import plan as plan_api
        # Only each recipe's best layout is scored: no alternatives to search for (top_k 0 lets
        # the search prune against the fastest alone; the best is the same).
        estimate, plan = estimate or estimate_api, plan or (lambda case: plan_api(case, top_k=0))
    rows = load_rows() if rows is None else rows
    out = Fidelity()
    copies: dict[tuple, int] = {}
    for index, r in enumerate(rows):
        if not isinstance(r, dict):
            out.malformed.append((row_name(rows, index), f"expected a mapping, got {type(r).__name__}"))
            continue
        problem = row_problem(r)
        if problem:  # a field the planner cannot read as a number skips its row, named
            out.malformed.append((row_name(rows, index), f"{problem[0]}: {problem[1]}"))
            continue
        try:  # a field of the wrong type (a list of layers, a string of GPUs) skips its row, with why
            case, why = case_of(r)
            measured = measured_tokens_per_s(r) if case else None
            mem = (r.get("measured") or {}).get("memory_gb_per_gpu") if case else None
        except (TypeError, ValueError, AttributeError, KeyError, OverflowError, ZeroDivisionError) as error:
            out.malformed.append((row_name(rows, index),
                                  f"a field has the wrong type or is missing ({one_line(error, 80)})"))
            continue
        problem = stated_problem(r, case) if case else None
        if problem:  # a statement the case would read as another (a precision of "banana" as bf16), named
            out.malformed.append((row_name(rows, index), f"{problem[0]}: {problem[1]}"))
            continue
        problem = unsupported(r) if why == "not a supported row" else None
        if problem and problem[0] == "gpu":
            # A GPU no preset is, the row's error rather than its source's kind of run (a per-layer time,
            # LoRA): named with its key and the names accepted, as a team's run is refused. It was counted
            # among "not a supported row", naming no key.
            out.malformed.append((row_name(rows, index), f"{problem[0]}: {problem[1]}"))
            continue
        if case and not measured and not mem:
            why = "no convention-free measurement"
        if why:
            out.skipped[why] = out.skipped.get(why, 0) + 1
            out.skipped_first.setdefault(why, row_name(rows, index))
            continue
        assert case is not None  # case_of gives a case wherever it gives no why
        # A run copied under another id (the same job, the same measurement) counted twice in every score
        # and band: refused, as load_rows refuses one id twice and calibrate --from-runs a copy.
        first = copies.setdefault((job_key(case), measured, mem), index)
        if first != index:
            origins = getattr(rows, "origins", None)
            raise CaseError(origins[index] if origins else f"row {index}",
                            one_line(r["id"], 80) if r.get("id") is not None else "",
                            copied_run(row_name(rows, first), "count twice in every score"))
        try:
            est = estimate(case)
        except CaseError as error:  # a row the model cannot take counts against it
            out.failed.append((r["id"], f"{row_key(error.key)}: {error.expected}"))
            continue
        tokens = case["training"]["global_batch_size"] * case["training"]["seq_len"]
        stage = published_memory_stage(r)
        # A measurement no run could make (faster than the GPU's peak) skips its row, named: scored, it
        # set its job's best and dropped the job's good runs as below half of it.
        problem = impossible_measurement(est.job, measured, mem, stage)
        if problem:
            out.malformed.append((row_name(rows, index), f"{problem[0]}: {problem[1]}"))
            continue
        peak = est.peak if stage is None else est.stages[stage]
        out.rows.append(Row(r, case, tokens / est.step_time_s, measured, est.fits, peak.total / 2**30, mem,
                            est.memory_verdict))
    _throughput(out)
    _memory(out)
    _sweeps(out)
    if experts:
        _experts(out, plan, progress)
    return out


def _throughput(out: Fidelity) -> None:
    best: dict[tuple, float] = defaultdict(float)
    for r in out.rows:
        if r.measured:
            best[r.job] = max(best[r.job], r.measured)
    errors: dict[str, list[float]] = defaultdict(list)
    implausible = 0
    for r in out.rows:
        if r.measured and r.measured * 2 >= best[r.job]:
            errors[r.source].append(r.predicted / r.measured - 1)
        elif r.measured:
            implausible += 1
    if implausible:
        out.skipped["measured below half the best layout of its sweep (ranked by the sweep measure)"] = implausible
    out.throughput = {s: Summary.of(e) for s, e in sorted(errors.items())}


def _memory(out: Fidelity) -> None:
    errors: dict[str, list[float]] = defaultdict(list)
    for r in out.rows:
        if r.measured_gib:
            errors[r.source].append(r.peak_gib / r.measured_gib - 1)
    out.memory = {s: Summary.of(e) for s, e in sorted(errors.items())}


def _sweeps(out: Fidelity) -> None:
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for r in out.rows:
        if r.measured and r.row.get("trust") != "low":
            groups[r.job].append(r)
    for job, group in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if len(group) < MIN_SWEEP:
            continue
        measured = [r.measured for r in group if r.measured is not None]  # each: only measured rows are grouped
        best = max(measured)
        pick = max((r for r in group if r.fits), key=lambda r: r.predicted, default=None)
        regret = best / pick.measured - 1 if pick and pick.measured else float("inf")
        rho = spearman([r.predicted for r in group], measured)
        out.sweeps.append(Sweep(job, len(group), rho, regret, pick.case["layout"] if pick else None))


def _experts(out: Fidelity, plan: Callable, progress: Optional[Callable[[int, int], None]] = None) -> None:
    # Tables repeat a recipe across containers and releases: each distinct case is planned once.
    plans: dict[str, Any] = {}

    def planned(case: dict) -> Any:
        key = json.dumps(case, sort_keys=True, default=str)
        if key not in plans:
            try:
                plans[key] = plan(case)
            except CaseError as error:
                plans[key] = error
        if isinstance(plans[key], CaseError):
            raise plans[key]
        return plans[key]

    tuned = [r for r in out.rows if r.row["source"].startswith(TUNED)]
    for done, r in enumerate(tuned):
        if progress:
            progress(done, len(tuned))
        out.experts_scored += 1
        if not r.fits:
            out.expert_misfits.append(r.row["id"])
        elif r.verdict == "at risk":
            out.expert_at_risk.append(r.row["id"])
        case = {k: v for k, v in r.case.items() if k != "layout"}
        try:
            best = planned(case)
        except CaseError as error:
            out.expert_misfits.append(f"{r.row['id']} (plan failed: {error.key})")
            continue
        if best.best is None:
            out.expert_misfits.append(f"{r.row['id']} (plan: nothing fits)")
            continue
        tokens = case["training"]["global_batch_size"] * case["training"]["seq_len"]
        out.expert_gains.append((r.row["id"], tokens / best.best.step_time_s / r.predicted - 1))
    if progress:
        progress(len(tuned), len(tuned))


def to_dict(f: Fidelity) -> dict[str, Any]:
    def summaries(d: dict[str, Summary]) -> dict:
        return {s: vars(v) for s, v in d.items()}

    return {
        "throughput": {"headline_mean_abs_error": f.throughput_headline, "by_source": summaries(f.throughput)},
        "memory": {"headline_mean_abs_error": f.memory_headline, "by_source": summaries(f.memory)},
        "sweeps": {"median_regret": f.median_regret, "max_finite_regret": f.max_regret,
                   "median_rank_correlation": f.median_rho,
                   # regret None: nothing measured in the sweep was predicted to fit
                   "sweeps": [{"job": list(s.job), "size": s.size, "rho": s.rho,
                               "regret": s.regret if s.regret != float("inf") else None, "pick": s.pick}
                              for s in f.sweeps]},
        "experts": {"scored": f.experts_scored,
                    "median_claimed_gain": f.median_gain,
                    "max_claimed_gain": max((g for _, g in f.expert_gains), default=None),
                    "predicted_not_to_fit": f.expert_misfits,
                    "predicted_at_risk": f.expert_at_risk,
                    "above_10pct_though_not_at_risk": f.gains_above_10pct,
                    "gains": dict(f.expert_gains)},
        "rows_scored": len(f.rows),
        "skipped": f.skipped,
        "failed": [{"id": i, "why": w} for i, w in f.failed],
        "malformed": [{"id": i, "reason": w} for i, w in f.malformed],
    }


def print_report(f: Fidelity, console, experts: bool = True) -> None:
    from rich.markup import escape
    from rich.table import Table

    for title, d, unit in (("Throughput: predicted / measured tokens/s − 1", f.throughput, "error"),
                           ("Peak memory: predicted / published − 1", f.memory, "error")):
        table = Table(title=title)
        for col in ("source", "rows", "mean |error|", "median", "max", "bias"):
            table.add_column(col, justify="left" if col == "source" else "right")
        for src, s in d.items():
            table.add_row(escape(src), str(s.count), f"{s.mean_abs:.1%}", f"{s.median_abs:.1%}", f"{s.max_abs:.1%}",
                          f"{s.bias:+.1%}")
        if d:
            table.add_row("[bold]mean over sources[/]", "", f"{statistics.mean(s.mean_abs for s in d.values()):.1%}",
                          "", "", "")
        console.print(table)
    if f.sweeps:
        table = Table(title="Layout sweeps: the model's pick against the best measured")
        for col in ("model", "GPUs", "layouts", "rank corr.", "regret", "pick"):
            table.add_column(col, justify="left" if col in ("model", "pick") else "right")
        for sweep in f.sweeps:
            pick = " ".join(f"{k}{sweep.pick[k]}" for k in ("dp", "tp", "pp", "zero_stage", "micro_batch_size")) \
                if sweep.pick else "—"
            table.add_row(escape(str(sweep.job[1])[:30]), str(sweep.job[2]), str(sweep.size), f"{sweep.rho:+.2f}",
                          f"{sweep.regret:.1%}", pick.replace("zero_stage", "z").replace("micro_batch_size", "mb"))
        console.print(table)
        console.print(f"sweeps: median regret {f.median_regret:.1%}, max {f.max_regret:.1%}, "
                      f"median rank correlation {f.median_rho:+.2f} over {len(f.sweeps)} sweeps")
    if experts and f.experts_scored:
        gains = f"median claimed gain {f.median_gain:+.1%}, max {max(g for _, g in f.expert_gains):+.1%}" \
            if f.expert_gains else "no plan"
        console.print(f"experts: {f.experts_scored} tuned recipes; {gains}; "
                      f"{sum(1 for _, g in f.expert_gains if g > 0.10)} above +10 %, "
                      f"{len(f.gains_above_10pct)} of them not at risk; {len(f.expert_at_risk)} at risk; "
                      f"{len(f.expert_misfits)} predicted not to fit")
    console.print(f"rows scored {len(f.rows)}; failed {len(f.failed)}; malformed {len(f.malformed)}; "
                  + "; ".join(f"skipped {n}: {escape(why)}" + (f" (first: {escape(f.skipped_first[why])})"
                                                                 if why in f.skipped_first else "")
                              for why, n in f.skipped.items()))
    for rid, why in f.failed[:5]:
        console.print(f"  failed {escape(rid)}: {escape(why)}")
    for rid, why in f.malformed:  # a partly readable file names the rows it skipped
        console.print(f"  skipped {escape(rid)}: {escape(why)}")
