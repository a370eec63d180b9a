"""`size` with neither a deadline nor a budget: the trade-off of days against GPU-hours, and its knee.

With no bound, the least GPU-hours is degenerate: the smallest cluster that fits nearly always
wins, for a run of years. What a user asks instead is how days and GPU-hours trade along the
cluster sizes, and where more GPUs stop paying. So `size` answers the Pareto front of days
against spend (GPU-hours, or cost where every GPU type has a price) over the sizes it
considers, with the knee marked:

- **The sizes it considers.** Per GPU type, whole nodes (or racks) in counts 1, 2, 3, 4, 6, 8,
  12, 16, ... (the powers of two and 1.5 times them: steps of at most 2×, about √2 on average)
  up to the limit, and the limit itself; the front lists those that take at most
  :data:`FRONT_SPAN` times the knee's days.
- **The knee** is the point of the front with the least days × spend. Between two points of the
  front, days × spend falls exactly when the move saves a larger share of the days than it adds
  to the spend (in ratios: days' / days × spend' / spend < 1); on one GPU type, doubling the GPUs
  multiplies the spend by 2 × the days' ratio r, so it pays by this measure when 2r² < 1: when
  doubling the GPUs cuts the days by more than 1 - 1/√2 ≈ 29.3 % (a doubling at more than 71 %
  parallel efficiency). The knee is the front's point where the slope in log days against log
  spend crosses -1: 1 % more spend buys 1 % fewer days. The measure is free of units and
  prices' scale, it is a point of the front (a dominated point has both factors larger), and
  it moves only when a point beats it: where the front ends (the limit, the smallest size that
  fits) does not move it, unlike the point farthest from the chord between the front's ends.
  A knee at the front's fast end and at its type's limit says the limit binds: doubling still pays
  there; short of that limit, the larger sizes considered ran no faster, and the limit does not bind.

Sizes are searched the fastest they could be first (by the work bound, :func:`work_lower_bound`),
each under the Pareto ceiling of the points found so far: a size whose fastest step would be no
faster than some found point's and spend no less than it (step ≥ max(q's step, q's spend
÷ its price × GPUs)) is dominated, and plan's search under that ceiling costs only its lower
bounds. A smaller size of a type stops being searched once the work bound proves that it can
be neither the knee (its least days × spend exceeds the knee's) nor within the span (its least
days exceed :data:`FRONT_SPAN` × the knee's): both only grow as the size falls. Below the span,
the work bound still says how little any size could spend (:attr:`FrontSweep.spend_bound`).
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

from .search import Candidate

# The front lists sizes that take at most this many times the knee's days: three doublings below
# it at perfect scaling, where the run is already most of the way to what it could save.
FRONT_SPAN = 8.0
# Doubling the GPUs of one type pays, by the knee's measure, when it cuts the days by more than this.
DOUBLING_SAVES = 1 - 1 / math.sqrt(2)
_EPS = 1e-9


def ladder(limit_units: int, unit: int = 1, global_batch: Optional[int] = None) -> list[int]:
    """The whole units (nodes or racks of ``unit`` GPUs) the front considers up to ``limit_units``:
    1, 2, 3, 4, 6, 8, 12, ... (powers of two and 1.5 times them) and the limit itself, the largest
    first; and between each two of those, the most units whose GPUs the global batch fills
    (:func:`fills_batch`): with a batch of 1,000 sequences, 1,000 and 2,000 GPUs (data parallel 500 or
    1,000) beat every size the ladder alone tried, 1,536 GPUs included."""
    out = {limit_units} if limit_units >= 1 else set()
    power = 1
    while power <= limit_units:
        out.add(power)
        if power >= 2 and power * 3 // 2 <= limit_units:
            out.add(power * 3 // 2)
        power *= 2
    if global_batch is not None:
        steps = sorted(out)
        for low, high in zip(steps, steps[1:]):
            filled = next((u for u in range(high - 1, low, -1) if fills_batch(u * unit, global_batch)), None)
            if filled is not None:
                out.add(filled)
    return sorted(out, reverse=True)


# Model parallelism the batch-filling sizes allow for (tensor, pipeline and context parallel in powers
# of two, as the layouts the search scores mostly hold).
MODEL_PARALLEL_MOST = 64


def fills_batch(gpus: int, global_batch: int) -> bool:
    """Whether ``gpus`` GPUs can run the global batch with every data-parallel rank busy: data
    parallelism a divisor of the batch, times model parallelism a power of two up to
    MODEL_PARALLEL_MOST."""
    model = 1
    while model <= MODEL_PARALLEL_MOST and gpus % model == 0:
        if global_batch % (gpus // model) == 0:
            return True
        model *= 2
    return False


def pareto_front(points: Sequence, days: Callable, spend: Callable) -> list:
    """The points no other beats on both days and spend (no worse in one, better in the other),
    one of any exact duplicates, in order of spend (the cheapest, slowest first)."""
    out: list = []
    for p in sorted(points, key=lambda p: (spend(p), days(p))):
        if not out or days(p) < days(out[-1]):
            out.append(p)
    return out


def knee_index(front: Sequence, days: Callable, spend: Callable) -> Optional[int]:
    """The point with the least days × spend (ties: the less spend, then the fewer days)."""
    if not front:
        return None
    return min(range(len(front)), key=lambda i: (days(front[i]) * spend(front[i]), spend(front[i]), days(front[i])))


class FrontSweep:
    """The search of the considered sizes for the front: which sizes had layouts worth
    keeping, and their tables (plan's fastest layouts there)."""

    def __init__(self, sweep, steps: float, pairs: Optional[list[tuple[int, int]]] = None):
        """``sweep``: size's :class:`planner.size._Sweep` (its options, limits, prices, work
        bounds and plan's search on one size); ``steps``: the run's steps (tokens ÷ tokens per
        step); ``pairs``: the (type, GPUs) to consider, by default each type's :func:`ladder`."""
        self.sweep, self.steps = sweep, steps
        if pairs is None:
            batch = sweep.case.training.global_batch_size
            pairs = [(i, units * o.unit) for i, o in enumerate(sweep.options)
                     for units in ladder(sweep.limits[i] // o.unit, o.unit, batch)]
        # The fastest they could be first: most of the front is found before its cheap end.
        self.pairs = sorted(pairs, key=lambda p: (sweep.work[p[0]] / p[1], p[0], -p[1]))
        self.points: list[tuple[int, int, float]] = []  # (type, GPUs, fastest step) of kept sizes
        self.tables: dict[tuple[int, int], list[Candidate]] = {}

    def days(self, step_s: float) -> float:
        return step_s * self.steps / 86400.0

    def product(self, option: int, gpus: int, step_s: float) -> float:
        """Days × spend (spend: GPU-hours times the type's price, where every type has one)."""
        days = self.days(step_s)
        return days * days * 24 * gpus * self.sweep.weights[option]

    def knee(self) -> Optional[tuple[int, int, float]]:
        if not self.points:
            return None
        return min(self.points, key=lambda p: (self.product(*p), self.sweep.weights[p[0]] * p[1] * p[2], p[2]))

    def beyond(self, option: int, gpus: int, knee: Optional[tuple[int, int, float]]) -> bool:
        """Whether the work bound proves this size neither the knee nor within the span."""
        if knee is None:
            return False
        least_step = self.sweep.work[option] / gpus
        return (self.product(option, gpus, least_step) > self.product(*knee) * (1 + _EPS)
                and least_step > FRONT_SPAN * knee[2] * (1 + _EPS))

    def ceiling(self, option: int, gpus: int) -> float:
        """The slowest step at which this size is not dominated by a point found so far."""
        weight = self.sweep.weights[option] * gpus
        return min((max(step, self.sweep.weights[o] * g * step / weight) for o, g, step in self.points),
                   default=math.inf)

    def run(self) -> "FrontSweep":
        done: set[tuple[int, int]] = set()
        fresh = True
        while fresh:  # again while a moved knee brings skipped sizes back within reach
            fresh = False
            for option, gpus in self.pairs:
                if (option, gpus) in done or self.beyond(option, gpus, self.knee()):
                    continue
                done.add((option, gpus))
                self.sweep.progress(len(done), len(self.pairs))
                fresh = True
                # The solver compares whole microseconds: a step within one of the ceiling may still tie.
                ceiling = self.ceiling(option, gpus) * (1 + _EPS) + 1e-6
                if self.sweep.work[option] / gpus > ceiling:  # dominated whatever its layout
                    continue
                table = self.sweep.fastest(option, gpus, ceiling)
                if table and table[0].step_time_s <= ceiling:
                    self.points.append((option, gpus, table[0].step_time_s))
                    self.tables[(option, gpus)] = table
        if len(done) < len(self.pairs):  # the rest were proven off the front unsearched: done too
            self.sweep.progress(len(self.pairs), len(self.pairs))
        return self

    @property
    def spend_bound(self) -> float:
        """The least spend of any size of any type: the work bound's GPU-seconds per step, times
        the steps, in GPU-hours (times the price)."""
        return min(w * work * self.steps / 3600.0 for w, work in zip(self.sweep.weights, self.sweep.work))
