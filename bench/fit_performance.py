"""Fit a GPU type's achieved figures to every published run on that GPU type at once.

    python bench/fit_performance.py h100 [--rounds 2] [--only NAME,NAME]

Coordinate descent over a small grid of the physical figures in
``planner/presets/performance.yaml`` (GEMM efficiency per precision, per-kernel overhead,
NVLink latency, communication overlap, element-wise HBM efficiency) and the fabric's
latency, minimising the mean over sources of the mean |error| of tokens/s plus the layout
sweeps' rank disagreement (1 − mean rank correlation) and median regret, weighted by
``--weight``. Attention efficiencies are held at their published kernel benchmarks. One
setting per GPU type: nothing here can fit a row or a source on its own. For H100 the engine
figures of nanotron (the engine of the Playbook's sweep) that no benchmark publishes are fitted alongside: the
host cost per TP collective and the floor of a TP collective in a pipeline across nodes or in a TP
group across nodes.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import planner.engines as engines
from cost_models import memory, partition, step_time, topology
from planner.fidelity import evaluate
from planner.presets import fabric_presets, gpu_presets, performance_presets
from planner.published_runs import gpu_preset, load_rows

TYPES = {"a100": ("a100-sxm-80gb", "a100-sxm-40gb"), "h100": ("h100-sxm-80gb",), "b200": ("b200",),
         "mi300x": ("mi300x",), "gb200": ("gb200",)}
GRID = {
    "gemm_efficiency": (0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8),
    "gemm_efficiency_fp8": (0.45, 0.5, 0.55, 0.6, 0.65, 0.7),
    "kernel_overhead_s": (3e-6, 5e-6, 8e-6, 12e-6, 16e-6),
    "link_latency_s": (2e-6, 4e-6, 8e-6),
    "comm_overlap": (0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
    "hbm_efficiency": (0.6, 0.7, 0.8, 0.9),
    "fabric.latency_s": (5e-6, 1e-5, 2e-5, 4e-5),
    "nanotron.collective_launch_s": (0.0, 1e-4, 2e-4, 3e-4, 4e-4),
    "nanotron.pipeline_collective_floor_s": (0.0, 0.25e-3, 0.5e-3, 0.75e-3, 1.0e-3, 1.25e-3, 1.5e-3),
    "nanotron.pipeline_collective_floor_rank_s": (0.0, 0.1e-3, 0.2e-3, 0.25e-3, 0.3e-3, 0.35e-3, 0.4e-3, 0.5e-3),
    "nanotron.cross_domain_tp_rank_s": (0.0, 0.04e-3, 0.06e-3, 0.07e-3, 0.08e-3, 0.09e-3, 0.1e-3, 0.12e-3),
}
# nanotron's figures in the grid ("nanotron.<EngineBehaviour field>"): engine figures no
# benchmark publishes, fitted on H100 (the Playbook's nanotron sweep) alone.
ENGINE_FIGURES = tuple(name for name in GRID if name.startswith("nanotron."))
# GPU types with a handful of runs of one kind each (torchao's torchtitan runs on B200 and MI300X,
# MLPerf's on GB200): only the figures those runs measure, on finer grids.
FEW_RUNS = {
    # B200: torchao's power-limited machine (its cases carry its clock, published_runs.POWER_LIMITED_CLOCK)
    # measures the fp8 GEMMs in its tensorwise run and the row-scaled ones in its rowwise run; its MXFP8
    # runs are predictions.
    "b200": {"gemm_efficiency_fp8": tuple(round(0.36 + 0.01 * i, 2) for i in range(25)),
             "gemm_efficiency_fp8_rowwise": tuple(round(0.2 + 0.01 * i, 2) for i in range(21))},
    "mi300x": {"gemm_efficiency": tuple(round(0.22 + 0.005 * i, 3) for i in range(21)),
               "gemm_efficiency_fp8": tuple(round(0.14 + 0.002 * i, 3) for i in range(31)),
               "gemm_efficiency_fp8_rowwise": tuple(round(0.12 + 0.01 * i, 2) for i in range(11))},
    "gb200": {"gemm_efficiency_fp8": tuple(round(0.46 + 0.01 * i, 2) for i in range(15))},
}


def clear_caches() -> None:
    """The cost models cache on specs; a changed preset or engine figure must not hit them."""
    for module in (step_time, memory, partition, topology):
        for value in vars(module).values():
            if hasattr(value, "cache_clear"):
                value.cache_clear()


def apply(kind: str, figures: dict) -> None:
    presets, fabrics = performance_presets(), fabric_presets()
    fabric = gpu_presets()[TYPES[kind][0]]["fabric"]
    for name, value in figures.items():
        if name == "fabric.latency_s":
            fabrics[fabric]["latency_s"] = value
        elif name in ENGINE_FIGURES:
            generic = engines.ENGINES["nanotron"]
            engines.ENGINES["nanotron"] = dataclasses.replace(
                generic, behaviour=dataclasses.replace(generic.behaviour, **{name[len("nanotron."):]: value}))
        else:
            for gpu in TYPES[kind]:
                presets[gpu] = {**presets[gpu], name: value}
    clear_caches()


def current_value(kind: str, name: str):
    """The figure as it stands: the fabric's latency from the GPU's fabric preset, the generic
    engine's host cost from its behaviour, the rest from the GPU's performance preset (None where
    the preset leaves it to the default), so that a grid that finds nothing better puts it back."""
    if name == "fabric.latency_s":
        return fabric_presets()[gpu_presets()[TYPES[kind][0]]["fabric"]].get("latency_s")
    if name in ENGINE_FIGURES:
        return getattr(engines.ENGINES["nanotron"].behaviour, name[len("nanotron."):])
    return performance_presets()[TYPES[kind][0]].get(name)


def objective(rows: list[dict], weight: float) -> tuple[float, dict]:
    f = evaluate(rows, experts=False)
    rho = statistics.mean(s.rho for s in f.sweeps) if f.sweeps else 1.0
    regret = min(f.median_regret, 1.0) if f.sweeps else 0.0
    score = f.throughput_headline + weight * ((1 - rho) + regret)
    return score, {"throughput": round(f.throughput_headline, 4), "rho": round(rho, 3), "regret": round(regret, 3),
                   **{s[:14]: round(v.mean_abs, 3) for s, v in f.throughput.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpu", choices=sorted(TYPES))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--weight", type=float, default=0.5)
    parser.add_argument("--only", default="", help="comma-separated figures to fit, the rest held")
    args = parser.parse_args()
    rows = [r for r in load_rows() if gpu_preset(r["gpu"]) in TYPES[args.gpu]]
    grid = dict(FEW_RUNS.get(args.gpu, GRID))
    if args.gpu not in FEW_RUNS and args.gpu != "h100":
        grid.pop("gemm_efficiency_fp8")
        for name in ENGINE_FIGURES:
            grid.pop(name)
    if args.only:
        unknown = set(args.only.split(",")) - set(grid)
        if unknown:
            parser.error(f"--only: not in the {args.gpu} grid: {', '.join(sorted(unknown))}")
        grid = {name: values for name, values in grid.items() if name in args.only.split(",")}
    current = {name: current_value(args.gpu, name) for name in grid}
    best, report = objective(rows, args.weight)
    print(f"start {best:.4f} {report}")
    for round_ in range(args.rounds):
        for name, values in grid.items():
            for value in values:
                apply(args.gpu, {name: value})
                score, trial = objective(rows, args.weight)
                if score < best - 1e-6:
                    best, report, current[name] = score, trial, value
            apply(args.gpu, {name: current[name]} if current[name] is not None else {})
            print(f"round {round_} {name} = {current[name]}: {best:.4f} {report}", flush=True)
    print("fitted:", {k: v for k, v in current.items() if v is not None})


if __name__ == "__main__":
    main()
