"""Fit a GPU type's performance figures to every published run on that GPU type at once.

    python bench/fit_performance.py a100 [../shared/validation/published_runs.yaml]

Sweeps a small grid of the physical figures in ``planner/presets/performance.yaml``
(GEMM efficiency, attention efficiency, per-kernel overhead, link efficiencies) and
prints the best settings by the mean over sources of the mean |error| of tokens/s.
One setting per GPU type: nothing here can fit a row or a source on its own.
"""

from __future__ import annotations

import copy
import itertools
import statistics
import sys

from planner.estimate import estimate
from planner.validation import load_rows, measured_tokens_per_s, row_to_case, source_name

GPUS = {"a100": ("a100-sxm-80gb", "a100-sxm-40gb"), "h100": ("h100-sxm-80gb",)}
GRID = {
    "gemm_efficiency": (0.5, 0.55, 0.6, 0.65, 0.7, 0.75),
    "attention_efficiency": (0.15, 0.2, 0.25, 0.3, 0.4, 0.5),
    "kernel_overhead_s": (5e-6, 20e-6),
    "inter_node_efficiency": (0.6, 0.8),
    "inter_node_rails": (1, 2, 8),
}


def main() -> None:
    gpu = sys.argv[1]
    path = sys.argv[2] if len(sys.argv) > 2 else "../shared/validation/published_runs.yaml"
    presets = GPUS[gpu]
    cases = []
    for row in load_rows(path):
        case, _ = row_to_case(row)
        if case and case["cluster"]["gpu"] in presets:
            cases.append((source_name(row), case, measured_tokens_per_s(row)))
    results = []
    for values in itertools.product(*GRID.values()):
        performance = dict(zip(GRID, values))
        errors: dict[str, list[float]] = {}
        for source, case, measured in cases:
            trial = copy.deepcopy(case)
            trial["cluster"]["performance"] = performance
            errors.setdefault(source, []).append(estimate(trial).tokens_per_s / measured - 1)
        per_source = {s: statistics.mean(abs(e) for e in v) for s, v in errors.items()}
        results.append((statistics.mean(per_source.values()), performance, per_source))
    results.sort(key=lambda r: r[0])
    for score, performance, per_source in results[:5]:
        print(f"{score:.3f}", performance, {s: round(v, 3) for s, v in per_source.items()})


if __name__ == "__main__":
    main()
