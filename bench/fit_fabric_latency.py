"""Fit a fabric's α per algorithm step to nccl-tests' collectives by message size and node count.

    python bench/fit_fabric_latency.py

``planner/published/nccl_tests_p5_efa.yaml`` holds nccl-tests' all-gather and all-reduce bus
bandwidth on AWS p5 (EFA), 32 MiB–8 GiB on 2–32 nodes. The ring all-gather pays the fabric's
``latency_s`` once per node it leaves; the tree all-reduce pays ``tree_latency_s`` per level
(``cost_models.collectives.latency``), each beside the bandwidth term the preset's efficiencies
set. Each α is scanned on its own collective and the one with the least root-mean-square log
error is printed, beside the preset's own.
"""

from __future__ import annotations

from planner.collective_benchmarks import load_points, log_errors, rms
from planner.presets import fabric_presets

GRID_US = (10, 20, 35, 50, 60, 70, 80, 100, 120, 140, 160)
FIELDS = (("all_gather", "latency_s"), ("all_reduce", "tree_latency_s"))


def main() -> None:
    data, _ = load_points()
    preset = fabric_presets()[data["fabric"]]
    for kind, field in FIELDS:
        print(f"{kind} (fabric.{field}): rms log(model / nccl-tests) over the series")
        scores = {us: rms(log_errors(kind, {field: us * 1e-6})) for us in GRID_US}
        for us, score in scores.items():
            print(f"  {us:4d} µs  {score:.3f}")
        best = min(scores, key=scores.get)
        print(f"  best {best} µs ({scores[best]:.3f}); the preset's {preset[field] * 1e6:.0f} µs: "
              f"{rms(log_errors(kind)):.3f}")


if __name__ == "__main__":
    main()
