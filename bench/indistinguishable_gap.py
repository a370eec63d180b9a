"""How the indistinguishable gap is derived, with the figures docs/robust-plans.md quotes.

    python bench/indistinguishable_gap.py

From the repo's published runs (``planner.fidelity.evaluate``, throughput only), every pair of
layouts of one published sweep that both ran within 2x of its best and were both predicted to fit
(``planner.bands.sweep_pairs``): the share the model ordered right by predicted gap, the point
estimate of the gap where the isotonic fit of "ordered right" reaches RIGHT_SHARE, and the range of
that gap over the bootstrap's resamples of the sweeps, whose GAP_PERCENTILE-th percentile is the
shipped ``indistinguishable_gap`` (``planner.bands.indistinguishable_from``).
"""

from __future__ import annotations

import math

from planner import bands
from planner.fidelity import evaluate

# Predicted-gap bins (fractions) for the share ordered right.
BINS = ((0.0, 0.01), (0.01, 0.02), (0.02, 0.03), (0.03, 0.05), (0.05, 0.075), (0.075, 0.10),
        (0.10, 0.15), (0.15, 0.20), (0.20, math.inf))


def main() -> None:
    fidelity = evaluate(experts=False)
    sweeps = bands.sweep_pairs(fidelity.rows)
    pairs = [pair for sweep in sweeps for pair in sweep]
    print(f"{len(sweeps)} sweeps, {len(pairs):,} pairs")
    for low, high in BINS:
        inside = [right for gap, right in pairs if low <= math.expm1(gap) < high]
        if inside:
            print(f"  predicted gap {low:6.1%} – {high:6.1%}: {len(inside):5,} pairs, "
                  f"{sum(inside) / len(inside):5.1%} ordered right")
    gaps = bands.resampled_gaps(sweeps)
    shipped, _ = bands.indistinguishable_from(fidelity.rows)
    print(f"point estimate (all sweeps): {bands.ordering_gap(pairs):.1%}")
    middle = gaps[round(0.05 * len(gaps))], gaps[round(0.95 * len(gaps)) - 1]
    print(f"over {len(gaps)} resamples: {gaps[0]:.1%} – {gaps[-1]:.1%} (the middle 90 %: {middle[0]:.1%} – "
          f"{middle[1]:.1%}); their {bands.GAP_PERCENTILE:.0%} percentile, shipped: {shipped:.2%}")


if __name__ == "__main__":
    main()
