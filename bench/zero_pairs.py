"""ZeRO-1 against ZeRO-0 on the Ultra-Scale Playbook's sweep: the same layout measured at both
stages, measured and predicted speed ratios (the README's fidelity section).

    python bench/zero_pairs.py

For every pair of Playbook rows that differ only in the ZeRO stage (trusted rows), the ratio of
ZeRO-1's tokens/s to ZeRO-0's, measured and predicted by `planner.estimate` of the row's case;
medians per model, inside one node (dp ≤ 8) and across nodes.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict

import planner
from planner.published_runs import case_of, load_rows, measured_tokens_per_s


def main() -> None:
    pairs: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    for row in load_rows():
        match = re.match(r"(playbook_.*)_z([01])$", row["id"])
        if not match or row.get("trust") == "low":
            continue
        case, _ = case_of(row)
        if case is None:
            continue
        pairs[match.group(1)][int(match.group(2))] = (measured_tokens_per_s(row), planner.estimate(case).tokens_per_s)
    ratios = defaultdict(list)
    for key, stages in pairs.items():
        if 0 in stages and 1 in stages:
            dp = int(re.search(r"_dp(\d+)_", key).group(1))
            group = (key.split("_")[1], "across nodes" if dp > 8 else "one node")
            ratios[group].append((stages[1][0] / stages[0][0], stages[1][1] / stages[0][1]))
    print("| model | data parallelism | pairs | measured ZeRO-1 / ZeRO-0 | predicted |")
    print("| --- | --- | ---: | ---: | ---: |")
    for (model, where), values in sorted(ratios.items()):
        print(f"| {model} | {where} | {len(values)} | {statistics.median(m for m, _ in values):.3f} "
              f"| {statistics.median(p for _, p in values):.3f} |")


if __name__ == "__main__":
    main()
