"""How much a team's own runs teach the model: `validate-published --few-shot K`.

Groups of published runs from one source on one GPU type stand for a team's runs on its own
cluster and software. For every group with at least MIN_GROUP runs, K of them (drawn with fixed
seeds, DRAWS times) are handed to ``planner.learn.fit`` as the team's past runs, and the model,
on the profile they teach, is scored on the rest: mean |predicted / measured − 1| of tokens/s and
of peak memory. K = 0 is the model on its presets. The headline is the mean over groups, so that
the 1,265-row Playbook sweep does not stand for all.

The runs drawn are ones a team would hand in: runs of the layouts it trains with, not a sweep's
pathological layouts (those measured below half the best layout of their own job, or marked
``trust: low``, are scored but never drawn).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional, Sequence

from .learn import Hardware, fit, measured_step_s, predict, prior_hardware
from .team_runs import Run
from .published_runs import gpu_preset, published_memory_stage

MIN_GROUP = 8
DRAWS = 5


@dataclass(frozen=True)
class GroupScore:
    """One group's mean |error| on the runs not drawn, per K (None: nothing of that kind to score)."""

    source: str
    gpu: str
    size: int
    throughput: dict[int, Optional[float]]
    memory: dict[int, Optional[float]]


@dataclass
class FewShot:
    ks: tuple[int, ...]
    groups: list[GroupScore] = field(default_factory=list)

    def mean(self, k: int, memory: bool = False) -> Optional[float]:
        values = self._values(k, memory)
        return statistics.mean(values) if values else None

    def median(self, k: int, memory: bool = False) -> Optional[float]:
        values = self._values(k, memory)
        return statistics.median(values) if values else None

    def _values(self, k: int, memory: bool) -> list[float]:
        values = [(g.memory if memory else g.throughput)[k] for g in self.groups]
        return [v for v in values if v is not None]


def ladder(k: int) -> tuple[int, ...]:
    """K = 0, 1, 3 and 5 up to ``k``, and ``k`` itself."""
    return tuple(sorted({x for x in (0, 1, 3, 5) if x <= k} | {k}))


def runs_of(rows: Sequence) -> dict[tuple[str, str], list[tuple[Run, bool]]]:
    """fidelity Rows grouped by (source, GPU): each as a Run, and whether a team would hand it in."""
    best: dict[tuple, float] = defaultdict(float)
    for r in rows:
        if r.measured:
            best[r.job] = max(best[r.job], r.measured)
    groups: dict[tuple[str, str], list[tuple[Run, bool]]] = defaultdict(list)
    for r in rows:
        plausible = bool(r.measured) and r.measured * 2 >= best[r.job]
        tokens = r.measured if plausible else None
        if not tokens and not r.measured_gib:
            continue
        run = Run(r.row["id"], r.case, tokens, r.measured_gib, published_memory_stage(r.row))
        groups[(r.source, gpu_preset(r.row["gpu"]) or str(r.row["gpu"]))].append(
            (run, plausible and r.row.get("trust") != "low"))
    return groups


def _errors(runs: Sequence[Run], hw: Hardware, values: dict[str, float]) -> tuple[list[float], list[float]]:
    throughput, memory = [], []
    for run in runs:
        step, peak = predict(run, hw, values)
        if run.tokens_per_s:
            throughput.append(abs(math.exp(math.log(measured_step_s(run)) - step) - 1))
        if run.peak_gib:
            memory.append(abs(math.exp(peak - math.log(run.peak_gib)) - 1))
    return throughput, memory


def _mean(values: list[float]) -> Optional[float]:
    return statistics.mean(values) if values else None


def evaluate(rows: Sequence, ks: Sequence[int], draws: int = DRAWS, progress=None) -> FewShot:
    """Few-shot scores of the model on the fidelity Rows ``rows`` (module docstring)."""
    out = FewShot(tuple(ks))
    for (source, gpu), members in sorted(runs_of(rows).items(), key=lambda kv: (-len(kv[1]), kv[0])):
        if len(members) < MIN_GROUP:
            continue
        runs = [run for run, _ in members]
        hw = prior_hardware(runs[:1], source)
        throughput: dict[int, Optional[float]] = {}
        memory: dict[int, Optional[float]] = {}
        for k in ks:
            if k == 0:
                t, m = _errors(runs, hw, {})
                throughput[k], memory[k] = _mean(t), _mean(m)
                continue
            drawable = [i for i, (_, ok) in enumerate(members) if ok]
            if len(drawable) < k or len(runs) - k < 1:
                throughput[k] = memory[k] = None
                continue
            per_draw_t, per_draw_m = [], []
            for seed in range(draws):
                chosen = set(random.Random(seed).sample(drawable, k))
                result = fit([runs[i] for i in sorted(chosen)], source)
                t, m = _errors([r for i, r in enumerate(runs) if i not in chosen], result.hardware, result.values)
                if t:
                    per_draw_t.append(statistics.mean(t))
                if m:
                    per_draw_m.append(statistics.mean(m))
            throughput[k], memory[k] = _mean(per_draw_t), _mean(per_draw_m)
        out.groups.append(GroupScore(source, gpu, len(runs), throughput, memory))
        if progress is not None:
            progress(source, gpu)
    return out


def to_dict(f: FewShot) -> dict:
    return {"ks": list(f.ks),
            "mean_over_groups": {str(k): {"throughput": f.mean(k), "memory": f.mean(k, memory=True)} for k in f.ks},
            "median_over_groups": {str(k): {"throughput": f.median(k), "memory": f.median(k, memory=True)}
                                   for k in f.ks},
            "groups": [{"source": g.source, "gpu": g.gpu, "runs": g.size,
                        "throughput": {str(k): v for k, v in g.throughput.items()},
                        "memory": {str(k): v for k, v in g.memory.items()}} for g in f.groups]}


def print_report(f: FewShot, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    if not f.groups:  # an empty table would read as a result
        console.print(f"few-shot: no group of {MIN_GROUP} or more runs of one source on one GPU type among the runs "
                      "scored: nothing to fit", markup=False)
        return

    table = Table(title=f"Few-shot: mean |error| on each group's other runs, fitted on K of its runs "
                        f"({DRAWS} draws)")
    table.add_column("source")
    table.add_column("GPU")
    table.add_column("runs", justify="right")
    for k in f.ks:
        table.add_column(f"K={k} tok/s", justify="right")
    for k in f.ks:
        table.add_column(f"K={k} mem", justify="right")

    def pct(v: Optional[float]) -> str:
        return "—" if v is None else f"{v:.1%}"

    for g in f.groups:
        table.add_row(escape(g.source[:30]), g.gpu, str(g.size), *[pct(g.throughput[k]) for k in f.ks],
                      *[pct(g.memory[k]) for k in f.ks])
    table.add_row("[bold]mean over groups[/]", "", str(len(f.groups)), *[pct(f.mean(k)) for k in f.ks],
                  *[pct(f.mean(k, memory=True)) for k in f.ks])
    table.add_row("median over groups", "", "", *[pct(f.median(k)) for k in f.ks],
                  *[pct(f.median(k, memory=True)) for k in f.ks])
    console.print(table)
