"""What a few of a team's own runs teach the cost model: the few-shot table, and the scatter the fit assumes.

    python bench/few_shot.py [--ks 0,1,3,5] [--draws 5] [--ceiling] [--coverage K]

1. The scatter: inside each group of published runs from one source on one GPU type (8 runs or more),
   the standard deviation of the model's log error on its presets (log predicted / measured step
   time; peak memory likewise), and its median over groups: ``planner.learn.RUN_SCATTER`` and
   ``MEMORY_SCATTER`` are these medians.
2. The table of `layout-planner validate-published --few-shot`: per group, the mean |error| of
   tokens/s and peak memory on the runs not drawn, after fitting a profile to K drawn runs
   (``planner.few_shot``), and the mean and median over groups. docs/calibration.md shows it.
3. The band's coverage after a fit (``--coverage``): per group, the share of its runs whose measured
   tokens/s lies inside the 80 % band the estimate gives (its class's, planner/published/bands.yaml), on
   the presets (every run) and on the profile fitted to K drawn runs (the runs not drawn; at most
   COVERAGE_RUNS a draw), beside the same band moved to centre on the fitted prediction (divided by its
   class's median ratio): whether a fitted prediction needs the band recentred.
4. The ceiling of any such fit (``--ceiling``): per group, the profile fitted to as many of its
   drawable runs as CEILING_RUNS allows (a fixed-seed sample where there are more), scored on every
   run of the group, the drawn ones included. No K reaches below it: what stays is the error the
   fitted figures cannot hold (one layout against another inside a group), not the cluster's bias.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics

from rich.console import Console

from planner import few_shot
from planner.fidelity import evaluate
from planner.learn import fit, measured_step_s, predict, prior_hardware

CEILING_RUNS = 60  # the most runs fitted per group for the ceiling (the fit's time grows with them)
COVERAGE_RUNS = 100  # the most runs not drawn scored a draw for the coverage (the Playbook's are 1,260)


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


def ceiling(rows) -> None:
    """Per group: tokens/s and peak mean |error| on all its runs, on its presets and on the profile
    fitted to (up to CEILING_RUNS of) its drawable runs; the means over groups."""
    before_t, after_t, before_m, after_m = [], [], [], []
    for (source, gpu), members in sorted(few_shot.runs_of(rows).items(), key=lambda kv: (-len(kv[1]), kv[0])):
        if len(members) < few_shot.MIN_GROUP:
            continue
        runs = [run for run, _ in members]
        drawable = [run for run, ok in members if ok]
        drawn = random.Random(0).sample(drawable, min(len(drawable), CEILING_RUNS))
        result = fit(drawn, source)
        t0, m0 = few_shot._errors(runs, prior_hardware(runs[:1], source), {})
        t1, m1 = few_shot._errors(runs, result.hardware, result.values)
        line = f"  {source[:40]:40s} {gpu:14s} {len(drawn):3d} fitted of {len(runs):5d}: tok/s " \
               f"{statistics.mean(t0):6.1%} -> {statistics.mean(t1):6.1%}"
        before_t.append(statistics.mean(t0))
        after_t.append(statistics.mean(t1))
        if m0:
            line += f", memory {statistics.mean(m0):6.1%} -> {statistics.mean(m1):6.1%}"
            before_m.append(statistics.mean(m0))
            after_m.append(statistics.mean(m1))
        print(line)
    print(f"ceiling, mean over groups: tok/s {statistics.mean(before_t):.1%} -> {statistics.mean(after_t):.1%}"
          + (f", memory {statistics.mean(before_m):.1%} -> {statistics.mean(after_m):.1%}" if before_m else ""))


def class_medians(rows) -> dict[tuple, float]:
    """The median measured / predicted tokens/s of every band class and parent class, over the runs the
    bands are drawn from (``bands.compute``'s: within 2x of their job's best)."""
    from planner import bands
    from planner.case import load_case

    best: dict[tuple, float] = {}
    for r in rows:
        if r.measured:
            best[r.job] = max(best.get(r.job, 0.0), r.measured)
    pooled: dict[tuple, list[float]] = {}
    for r in rows:
        if r.measured and r.measured * 2 >= best[r.job]:
            cls = bands.class_of(load_case(r.case).job())
            for level in range(len(bands.KEYS) + 1):
                pooled.setdefault(tuple(cls[k] for k in bands.KEYS[:level]), []).append(r.measured / r.predicted)
    return {key: statistics.median(ratios) for key, ratios in pooled.items()}


def coverage(rows, k: int, draws: int) -> None:
    """Per group: the share of runs inside their 80 % band on the presets, and after a fit to ``k`` drawn
    runs (the others), as the class band and recentred on the fitted prediction; the means over groups."""
    from planner import bands
    from planner.learn import estimate, with_figures

    medians = class_medians(rows)
    table = bands._load()["throughput"]

    def inside(run, hw, values) -> tuple[bool, bool]:
        est = estimate(with_figures(run.case, hw, values))
        ratio = est.step_time_s / measured_step_s(run)  # measured / predicted tokens/s
        entry = bands._lookup(table, bands.class_of(est.job), bands.KEYS)
        median = medians[tuple(entry["class"].get(key) for key in bands.KEYS[:len(entry["class"])])]
        return entry["p10"] <= ratio <= entry["p90"], entry["p10"] / median <= ratio <= entry["p90"] / median

    means: list[tuple[float, float, float]] = []
    for (source, gpu), members in sorted(few_shot.runs_of(rows).items(), key=lambda kv: (-len(kv[1]), kv[0])):
        runs = [run for run, _ in members if run.tokens_per_s]
        drawable = [i for i, (run, ok) in enumerate(members) if ok and run.tokens_per_s]
        if len(members) < few_shot.MIN_GROUP or len(drawable) < k:
            continue
        presets = [inside(run, prior_hardware(runs[:1], source), {})[0] for run in runs]
        fitted: list[tuple[bool, bool]] = []
        for seed in range(draws):
            chosen = set(random.Random(seed).sample(drawable, k))
            result = fit([members[i][0] for i in sorted(chosen)], source)
            rest = [run for i, (run, _) in enumerate(members) if i not in chosen and run.tokens_per_s]
            rest = random.Random(seed).sample(rest, min(len(rest), COVERAGE_RUNS))
            fitted += [inside(run, result.hardware, result.values) for run in rest]
        shares = (statistics.mean(presets), statistics.mean(f[0] for f in fitted), statistics.mean(f[1] for f in fitted))
        means.append(shares)
        print(f"  {source[:40]:40s} {gpu:14s} {len(runs):5d} runs: presets {shares[0]:4.0%}, fitted to {k} "
              f"{shares[1]:4.0%}, recentred {shares[2]:4.0%}")
    print(f"80 % band coverage, mean over {len(means)} groups: presets {statistics.mean(m[0] for m in means):.0%}, "
          f"fitted to {k} runs {statistics.mean(m[1] for m in means):.0%}, recentred "
          f"{statistics.mean(m[2] for m in means):.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default="0,1,3,5")
    parser.add_argument("--draws", type=int, default=few_shot.DRAWS)
    parser.add_argument("--ceiling", action="store_true", help="also fit each group on all its runs")
    parser.add_argument("--coverage", type=int, metavar="K", help="only the 80 %% band's coverage after fitting K runs")
    args = parser.parse_args()
    fidelity = evaluate(experts=False)
    if args.coverage is not None:
        coverage(fidelity.rows, args.coverage, args.draws)
        return
    if args.ceiling:
        ceiling(fidelity.rows)
    time_sd, memory_sd = scatter(fidelity.rows)
    print(f"median over groups: time {time_sd:.3f}, memory {memory_sd:.3f} "
          "(planner.learn.RUN_SCATTER, MEMORY_SCATTER)")
    result = few_shot.evaluate(fidelity.rows, tuple(int(k) for k in args.ks.split(",")), args.draws)
    few_shot.print_report(result, Console(width=160))


if __name__ == "__main__":
    main()
