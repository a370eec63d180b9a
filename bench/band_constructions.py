"""Other constructions of the 80 % throughput band, scored as `validate-published` scores the shipped one.

    python bench/band_constructions.py

The shipped band (planner/bands.py) is the 10th-90th percentile of measured / predicted tokens/s over
the most specific class with MIN_RUNS runs; a class with fewer takes its parent's. Its coverage on runs
of a source it never saw is 20 % for Megatron-Bridge and 92 % for llm-foundry, outside 70-90 %. The
constructions below each give an unseen class or an unseen source the dispersion it cannot measure,
from the runs it can:

- shipped: the class's percentiles, as planner/bands.py.
- siblings convolved: a class that falls back to a parent at level l has an unknown offset of its own.
  Its band is the percentiles of (within-class residual) x (sibling offset): every parent run divided
  by the median of its class at level l + 1, times the median of each class at level l + 1 (every
  sibling alike, each weighing as much as the others); a class with MIN_RUNS runs of its own keeps its
  percentiles.
- leaves convolved: the same with the siblings taken at the finest level (all five keys).
- widened in quadrature: the parent's percentiles, each side's log distance from its median widened
  in quadrature by 1.2816 standard deviations of the log medians of the classes at level l + 1.
- between sources, fallen back / every class: a new team is a new source. The band is the percentiles
  of (run / its source's median in the class) x (source offset) x (the class's median), the source
  offsets the medians of the sources of the nearest class (itself or a parent) with at least 3 sources,
  over their median, every source alike; for fallen-back classes only, or for every class.
- widest slice: a fallen-back class takes the widest band of the runs that share one of its keys (every
  MoE run, every Blackwell run, ...), among those slices with 10 runs or more.

Per source with 20 scored runs or more: coverage in sample / with the source's runs left out of the
bands, and the median band width (p90 - p10, a fraction of the prediction) its runs get, in sample /
held out. Last, the narrowest interval that holds 70 % of each source's own runs: no band narrower can
reach 70 % for that source, wherever it is placed.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Callable

from planner.bands import HIGH, KEYS, LOW, MIN_RUNS, _scored, class_of, percentile
from planner.case import load_case
from planner.fidelity import evaluate

Sample = tuple[dict, str, float]  # (class, source, measured / predicted)
Z80 = 1.2816  # the normal's 90th percentile in standard deviations


def _key(cls: dict, level: int) -> tuple:
    return tuple(cls[k] for k in KEYS[:level])


def _groups(samples: list[Sample]) -> dict[tuple, list[Sample]]:
    out: dict[tuple, list[Sample]] = defaultdict(list)
    for s in samples:
        for level in range(len(KEYS) + 1):
            out[_key(s[0], level)].append(s)
    return out


def _class(cls: dict, groups: dict) -> tuple[int, list[Sample]]:
    """The level and runs of the most specific class with MIN_RUNS runs (the root otherwise)."""
    for level in range(len(KEYS), -1, -1):
        runs = groups.get(_key(cls, level), [])
        if len(runs) >= MIN_RUNS or level == 0:
            return level, runs
    raise AssertionError


def _weighted(values: list[float], weights: list[float], fraction: float) -> float:
    """Percentile of weighted values, interpolated between the midpoints of their cumulative weights."""
    pairs = sorted(zip(values, weights))
    total, cum, points = sum(weights), 0.0, []
    for v, w in pairs:
        points.append(((cum + w / 2) / total, v))
        cum += w
    if fraction <= points[0][0]:
        return points[0][1]
    for (a, va), (b, vb) in zip(points, points[1:]):
        if a <= fraction <= b:
            return va + (vb - va) * (fraction - a) / (b - a) if b > a else va
    return points[-1][1]


def _band(values: list[float], weights: list[float] | None = None) -> tuple[float, float]:
    if weights is None:
        return percentile(values, LOW), percentile(values, HIGH)
    return _weighted(values, weights, LOW), _weighted(values, weights, HIGH)


def shipped(cls: dict, samples: list[Sample], groups: dict) -> tuple[float, float]:
    return _band([x for _, _, x in _class(cls, groups)[1]])


def convolved(child_level: Callable[[int], int]) -> Callable:
    def band(cls: dict, samples: list[Sample], groups: dict) -> tuple[float, float]:
        level, runs = _class(cls, groups)
        if level == len(KEYS):
            return _band([x for _, _, x in runs])
        children: dict[tuple, list[float]] = defaultdict(list)
        for c, _, x in runs:
            children[_key(c, child_level(level))].append(x)
        if len(children) < 2:
            return _band([x for _, _, x in runs])
        medians = {k: statistics.median(v) for k, v in children.items()}
        values, weights = [], []
        for k, ratios in children.items():
            for x in ratios:
                for offset in medians.values():
                    values.append(x / medians[k] * offset)
                    weights.append(1 / len(ratios))
        return _band(values, weights)
    return band


def quadrature(cls: dict, samples: list[Sample], groups: dict) -> tuple[float, float]:
    level, runs = _class(cls, groups)
    ratios = [x for _, _, x in runs]
    low, high = _band(ratios)
    if level == len(KEYS):
        return low, high
    children: dict[tuple, list[float]] = defaultdict(list)
    for c, _, x in runs:
        children[_key(c, level + 1)].append(x)
    if len(children) < 2:
        return low, high
    between = Z80 * statistics.pstdev([math.log(statistics.median(v)) for v in children.values()])
    centre = math.log(statistics.median(ratios))
    return (math.exp(centre - math.hypot(centre - math.log(low), between)),
            math.exp(centre + math.hypot(math.log(high) - centre, between)))


def between_sources(every_class: bool, min_sources: int = 3) -> Callable:
    def band(cls: dict, samples: list[Sample], groups: dict) -> tuple[float, float]:
        level, runs = _class(cls, groups)
        if level == len(KEYS) and not every_class:
            return _band([x for _, _, x in runs])

        def by_source(members: list[Sample]) -> dict[str, list[float]]:
            out: dict[str, list[float]] = defaultdict(list)
            for _, s, x in members:
                out[s].append(x)
            return out
        own = by_source(runs)
        for above in range(level, -1, -1):
            sources = by_source(groups.get(_key(cls, above), []))
            if len(sources) >= min_sources:
                break
        medians = [statistics.median(v) for v in sources.values()]
        offsets = [m / statistics.median(medians) for m in medians]
        centre = statistics.median([x for _, _, x in runs])
        values, weights = [], []
        for ratios in own.values():
            mid = statistics.median(ratios)
            for x in ratios:
                for offset in offsets:
                    values.append(centre * x / mid * offset)
                    weights.append(1 / len(ratios))
        return _band(values, weights)
    return band


def widest_slice(min_runs: int = 10) -> Callable:
    def band(cls: dict, samples: list[Sample], groups: dict) -> tuple[float, float]:
        level, runs = _class(cls, groups)
        if level == len(KEYS):
            return _band([x for _, _, x in runs])
        slices = [[x for c, _, x in samples if c[k] == cls[k]] for k in KEYS]
        bands = [_band(v) for v in slices if len(v) >= min_runs]
        if not bands:
            return _band([x for _, _, x in runs])
        return min(b[0] for b in bands), max(b[1] for b in bands)
    return band


CONSTRUCTIONS = {
    "shipped": shipped,
    "siblings convolved": convolved(lambda level: level + 1),
    "leaves convolved": convolved(lambda level: len(KEYS)),
    "widened in quadrature": quadrature,
    "between sources, fallen back": between_sources(every_class=False),
    "between sources, every class": between_sources(every_class=True),
    "widest slice (10 runs)": widest_slice(),
}


def score(construction: Callable, samples: list[Sample]) -> tuple[dict[str, tuple[float, float, float, float]], float]:
    """Per source: (in sample, held out, median width in sample, median width held out); and the median
    width held out over every run."""
    everything = _groups(samples)
    inside, held, width, width_held = (defaultdict(list) for _ in range(4))
    for cls, source, x in samples:
        low, high = construction(cls, samples, everything)
        inside[source].append(low <= x <= high)
        width[source].append(high - low)
    for left_out in {s for _, s, _ in samples}:
        rest = [s for s in samples if s[1] != left_out]
        groups = _groups(rest)
        for cls, source, x in samples:
            if source == left_out:
                low, high = construction(cls, rest, groups)
                held[source].append(low <= x <= high)
                width_held[source].append(high - low)
    return ({s: (sum(inside[s]) / len(inside[s]), sum(held[s]) / len(held[s]),
                 statistics.median(width[s]), statistics.median(width_held[s])) for s in inside},
            statistics.median([w for widths in width_held.values() for w in widths]))


def main() -> None:
    result = evaluate(experts=False)
    jobs = [load_case(r.case).job() for r in result.rows]
    samples = [(class_of(j), r.source, r.measured / r.predicted) for r, j in _scored(result.rows, jobs)]
    counts: dict[str, int] = defaultdict(int)
    for _, s, _ in samples:
        counts[s] += 1
    kept = sorted(s for s, n in counts.items() if n >= MIN_RUNS)
    print("coverage in sample / source held out (median width in sample / held out), per source:")
    print("| construction | " + " | ".join(f"{s[:24]} ({counts[s]})" for s in kept) + " | median width, all runs held out |")
    print("| --- |" + " ---: |" * (len(kept) + 1))
    for name, construction in CONSTRUCTIONS.items():
        scored, all_held = score(construction, samples)
        cells = [f"{scored[s][0]:.0%} / {scored[s][1]:.0%} ({scored[s][2]:.2f} / {scored[s][3]:.2f})" for s in kept]
        print(f"| {name} | " + " | ".join(cells) + f" | {all_held:.2f} |")
    print("narrowest interval of measured / predicted holding 70 % of a source's own runs:")
    for s in kept:
        ratios = sorted(x for _, src, x in samples if src == s)
        m = math.ceil(0.7 * len(ratios))
        print(f"  {s}: {min(ratios[i + m - 1] - ratios[i] for i in range(len(ratios) - m + 1)):.3f}")


if __name__ == "__main__":
    main()
