"""ZeRO-1 against ZeRO-0 on the Ultra-Scale Playbook's sweep: the same layout measured at both
stages, measured and predicted (docs/fidelity.md).

    python bench/zero_pairs.py

For every pair of Playbook rows that differ only in the ZeRO stage (trusted rows), two tables:

- the ratio of ZeRO-1's tokens/s to ZeRO-0's, measured and predicted by `planner.estimate` of the
  row's case; medians per model, inside one node (dp ≤ 8) and across nodes;
- without a pipeline, on 8 nodes or more: ZeRO-1's step time less ZeRO-0's, measured, predicted,
  and predicted without the copies out of the gather's flat buffer
  (``EngineBehaviour.zero1_gather_copies``, ``dp_time.gather_copies_time``); medians per model.

A third table shows what no case field can predict: with a pipeline and micro-batches of 1, the pairs
whose two stages ran more than 2x apart, by pipeline depth: which stage was the slow one, on how many
nodes, and the slower run's extra time per micro-batch of its step (median, min-max). The model
prices the two stages within 6 % of each other in every such pair (the first table's
"predicted"), and the Playbook's sweep ranks by the measured row, so a plan that lands on the
stalled twin of a layout takes its full regret.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections import defaultdict

import planner
import planner.engines as engines
from planner.published_runs import case_of, load_rows, measured_tokens_per_s


def pairs() -> dict[str, dict[int, tuple[dict, dict, float]]]:
    """{layout without the stage: {ZeRO stage: (row, case, measured tokens/s)}}."""
    out: dict[str, dict[int, tuple[dict, dict, float]]] = defaultdict(dict)
    for row in load_rows():
        match = re.match(r"(playbook_.*)_z([01])$", row["id"])
        if not match or row.get("trust") == "low":
            continue
        case, _ = case_of(row)
        if case is not None:
            out[match.group(1)][int(match.group(2))] = (row, case, measured_tokens_per_s(row))
    return {key: stages for key, stages in out.items() if 0 in stages and 1 in stages}


def step_s(case: dict, tokens_per_s: float) -> float:
    return case["training"]["global_batch_size"] * case["training"]["seq_len"] / tokens_per_s


def main() -> None:
    ratios, deltas, cross_node, stalls = defaultdict(list), defaultdict(list), [], defaultdict(list)
    for key, stages in pairs().items():
        (_, case0, measured0), (row1, case1, measured1) = stages[0], stages[1]
        predicted0, predicted1 = planner.estimate(case0).tokens_per_s, planner.estimate(case1).tokens_per_s
        dp, model = case1["layout"]["dp"], key.split("_")[1]
        ratios[(model, "across nodes" if dp > 8 else "one node")].append(
            (measured1 / measured0, predicted1 / predicted0))
        lay = case1["layout"]
        if lay["pp"] > 1 and lay["micro_batch_size"] == 1 and max(measured0, measured1) > 2 * min(measured0, measured1):
            slow = 0 if measured0 < measured1 else 1
            extra = abs(step_s(case1, measured1) - step_s(case0, measured0))
            micro_batches = case1["training"]["global_batch_size"] // lay["dp"]
            stalls[lay["pp"]].append((slow, row1["num_gpus"] // 8, extra / micro_batches))
        if case1["layout"]["pp"] == 1 and row1["num_gpus"] >= 64:
            cross_node.append((model, case0, case1, step_s(case1, measured1) - step_s(case0, measured0),
                               step_s(case1, predicted1) - step_s(case0, predicted0)))
    generic = engines.ENGINES["nanotron"]
    engines.ENGINES["nanotron"] = dataclasses.replace(generic, behaviour=dataclasses.replace(
        generic.behaviour, zero1_gather_copies=False))
    for model, case0, case1, measured, predicted in cross_node:
        without = planner.estimate(case1).step_time_s - planner.estimate(case0).step_time_s
        deltas[model].append((measured, predicted, without))
    engines.ENGINES["nanotron"] = generic
    print("| model | data parallelism | pairs | measured ZeRO-1 / ZeRO-0 | predicted |")
    print("| --- | --- | ---: | ---: | ---: |")
    for (model, where), values in sorted(ratios.items()):
        print(f"| {model} | {where} | {len(values)} | {statistics.median(m for m, _ in values):.3f} "
              f"| {statistics.median(p for _, p in values):.3f} |")
    print("\nZeRO-1's step less ZeRO-0's, without a pipeline on 8 nodes or more (s, medians)\n")
    print("| model | pairs | measured | predicted | predicted without the gather's copies |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for model, values in sorted(deltas.items()):
        print(f"| {model} | {len(values)} | {statistics.median(v[0] for v in values):+.3f} "
              f"| {statistics.median(v[1] for v in values):+.3f} | {statistics.median(v[2] for v in values):+.3f} |")
    every = [v for values in deltas.values() for v in values]
    print(f"| all | {len(every)} | {statistics.median(v[0] for v in every):+.3f} "
          f"| {statistics.median(v[1] for v in every):+.3f} | {statistics.median(v[2] for v in every):+.3f} |")
    print("\nPairs with a pipeline at micro-batches of 1 whose stages ran more than 2x apart\n")
    print("| pp | pairs | slow at ZeRO-0 (nodes) | slow at ZeRO-1 (nodes) "
          "| extra time per micro-batch, median (min-max) |")
    print("| ---: | ---: | --- | --- | ---: |")
    for pp, values in sorted(stalls.items()):
        nodes = [sorted({n for s, n, _ in values if s == stage}) for stage in (0, 1)]
        extra = [e for _, _, e in values]
        print(f"| {pp} | {len(values)} | {sum(s == 0 for s, _, _ in values)} ({', '.join(map(str, nodes[0])) or '-'}) "
              f"| {sum(s == 1 for s, _, _ in values)} ({', '.join(map(str, nodes[1])) or '-'}) "
              f"| {statistics.median(extra):.2f} s ({min(extra):.2f}-{max(extra):.2f}) |")


if __name__ == "__main__":
    main()
