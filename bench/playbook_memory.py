"""The memory model on the Ultra-Scale Playbook's sweep, per model (the README's fidelity section).

    python bench/playbook_memory.py

For each Playbook model: rows, mean |predicted / published − 1| of the peak, its bias, and the
median of what the published peak holds above the prediction per parameter a GPU holds (bytes),
for the rows with data parallelism (DDP) and those without.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import planner
from planner.published_runs import case_of, load_rows

GIB = 2**30


def main() -> None:
    by_model = defaultdict(list)
    for row in load_rows():
        published = (row.get("measured") or {}).get("memory_gb_per_gpu")
        if "Playbook" not in row["source"] or not published:
            continue
        case, _ = case_of(row)
        if case is None:
            continue
        peak = planner.estimate(case).peak
        # The weights' term is 2 bytes per parameter at ZeRO 0-1 (bf16): the parameters a GPU holds.
        params = peak.parameters / 2
        by_model[case["model"]["name"].split(" ")[0]].append(
            (peak.total / GIB / published - 1, (published * GIB - peak.total) / params, case["layout"]["dp"] > 1))
    print("| model | rows | mean abs error | bias | above the model per parameter, with DDP | without |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for model, rows in sorted(by_model.items()):
        errors = [e for e, _, _ in rows]
        ddp = [x for _, x, d in rows if d]
        alone = [x for _, x, d in rows if not d]
        print(f"| {model} | {len(rows)} | {statistics.mean(map(abs, errors)):.1%} | {statistics.mean(errors):+.1%} "
              f"| {statistics.median(ddp):.1f} B | {statistics.median(alone):.1f} B |")


if __name__ == "__main__":
    main()
