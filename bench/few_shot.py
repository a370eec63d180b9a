"""What a few of a team's own runs teach the cost model: the few-shot table, and the scatter the fit assumes.

    python bench/few_shot.py [--ks 0,1,3,5] [--draws 5]

1. The scatter: inside each group of published runs from one source on one GPU type (8 runs or more),
   the standard deviation of the model's log error on its presets (log predicted / measured step
   time; peak memory likewise), and its median over groups: ``planner.learn.RUN_SCATTER`` and
   ``MEMORY_SCATTER`` are these medians.
2. The table of `layout-planner validate-published --few-shot`: per group, the mean |error| of
   tokens/s and peak memory on the runs not drawn, after fitting a profile to K drawn runs
   (``planner.few_shot``), and the mean and median over groups. docs/calibration.md shows it.
"""

from __future__ import annotations

import argparse
import math
import statistics

from rich.console import Console

from planner import few_shot
from planner.fidelity import evaluate
from planner.learn import measured_step_s, predict, prior_hardware


def scatter(rows) -> tuple[float, float]:
    """Median over groups of the within-group standard deviation of log error (time, memory)."""
    times, peaks = [], []
    for (source, gpu), members in few_shot.runs_of(rows).items():
        runs = [run for run, _ in members]
        if len(runs) < few_shot.MIN_GROUP:
            continue
        hw = prior_hardware(runs[:1], source)
        t, m = [], []
        for run in runs:
            step, peak = predict(run, hw, {})
            if run.tokens_per_s:
                t.append(step - math.log(measured_step_s(run)))
            if run.peak_gib:
                m.append(peak - math.log(run.peak_gib))
        if len(t) >= few_shot.MIN_GROUP:
            times.append(statistics.stdev(t))
            print(f"  {source[:40]:40s} {gpu:14s} time:   {len(t):5d} runs, sd of log error {statistics.stdev(t):.3f}")
        if len(m) >= few_shot.MIN_GROUP:
            peaks.append(statistics.stdev(m))
            print(f"  {source[:40]:40s} {gpu:14s} memory: {len(m):5d} runs, sd of log error {statistics.stdev(m):.3f}")
    return statistics.median(times), statistics.median(peaks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default="0,1,3,5")
    parser.add_argument("--draws", type=int, default=few_shot.DRAWS)
    args = parser.parse_args()
    fidelity = evaluate(experts=False)
    time_sd, memory_sd = scatter(fidelity.rows)
    print(f"median over groups: time {time_sd:.3f}, memory {memory_sd:.3f} "
          "(planner.learn.RUN_SCATTER, MEMORY_SCATTER)")
    result = few_shot.evaluate(fidelity.rows, tuple(int(k) for k in args.ks.split(",")), args.draws)
    few_shot.print_report(result, Console(width=160))


if __name__ == "__main__":
    main()
