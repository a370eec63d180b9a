"""Refit a GPU type's achieved figures to the published runs on that GPU type: the fit behind
``planner/presets/performance.yaml`` (`python bench/fit_performance.py GPU`), and what
`validate-published --leave-family-out` reruns without one model family's runs.

Coordinate descent over a small grid of the physical figures (GEMM efficiency per precision,
per-kernel overhead, NVLink latency, communication overlap, element-wise HBM efficiency) and the
fabric's latency, minimising the mean over sources of the mean |error| of tokens/s plus the layout
sweeps' rank disagreement (1 − mean rank correlation) and median regret, times ``weight``.
Attention efficiencies are held at their published kernel benchmarks. One setting per GPU type:
nothing here can fit a row or a source on its own. For H100 the engine figures of nanotron (the
engine of the Playbook's sweep) that no benchmark publishes are fitted alongside.

The figures are set in the loaded presets (``planner.presets``) and the cost models' caches are
cleared: :func:`held` puts everything back.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import statistics
import sys
from typing import Callable, Iterator, Optional

import planner.engines as engines
from planner.errors import CaseError
from planner.fidelity import Fidelity, evaluate
from planner.presets import fabric_presets, gpu_presets, performance_presets

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
# MLPerf's and the MoE recipes on GB200): only the figures those runs measure, on finer grids.
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


def grid_for(kind: str) -> dict[str, tuple]:
    """The figures the fit moves on ``kind`` and their grids: the few a handful of runs measure,
    else the full grid (nanotron's and the fp8 figure on H100 only, whose runs measure them)."""
    grid = dict(FEW_RUNS.get(kind, GRID))
    if kind not in FEW_RUNS and kind != "h100":
        grid.pop("gemm_efficiency_fp8")
        for name in ENGINE_FIGURES:
            grid.pop(name)
    return grid


def clear_caches() -> None:
    """The cost models cache on specs; a changed preset or engine figure must not hit them: every
    cache of every cost model loaded is cleared."""
    for name, module in list(sys.modules.items()):
        if name.startswith("cost_models.") and module is not None:
            for value in vars(module).values():
                if hasattr(value, "cache_clear"):
                    value.cache_clear()


def apply(kind: str, figures: dict) -> None:
    """Set ``figures`` (grid names) on ``kind``'s GPU presets, its fabric and nanotron's behaviour."""
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
    """The figure as it stands: the fabric's latency from the GPU's fabric preset, nanotron's host
    costs from its behaviour, the rest from the GPU's performance preset (None where the preset
    leaves it to the default), so that a grid that finds nothing better puts it back."""
    if name == "fabric.latency_s":
        return fabric_presets()[gpu_presets()[TYPES[kind][0]]["fabric"]].get("latency_s")
    if name in ENGINE_FIGURES:
        return getattr(engines.ENGINES["nanotron"].behaviour, name[len("nanotron."):])
    return performance_presets()[TYPES[kind][0]].get(name)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Whatever a fit sets inside, the presets, the fabrics and the engines are as before after."""
    presets, fabrics = performance_presets(), fabric_presets()
    saved = copy.deepcopy(presets), copy.deepcopy(fabrics), dict(engines.ENGINES)
    try:
        yield
    finally:
        presets.clear()
        presets.update(saved[0])
        fabrics.clear()
        fabrics.update(saved[1])
        engines.ENGINES.clear()
        engines.ENGINES.update(saved[2])
        clear_caches()


def objective(rows: list[dict], weight: float) -> tuple[float, dict]:
    return score(evaluate(rows, experts=False), weight)


def score(f: Fidelity, weight: float) -> tuple[float, dict]:
    """The fit's objective on ``f`` (module docstring), which has a throughput score (:func:`check_scored`)."""
    headline, median_regret = f.throughput_headline, f.median_regret
    if headline is None:  # a caller's slip, not the runs': check_scored refuses runs that give none
        raise ValueError("no throughput scored: the fit's objective has nothing to score")
    rho = statistics.mean(s.rho for s in f.sweeps) if f.sweeps else 1.0
    regret = min(median_regret, 1.0) if median_regret is not None else 0.0  # None: no sweep
    value = headline + weight * ((1 - rho) + regret)
    return value, {"throughput": round(headline, 4), "rho": round(rho, 3), "regret": round(regret, 3),
                   **{s[:14]: round(v.mean_abs, 3) for s, v in f.throughput.items()}}


def check_scored(f: Fidelity, kind: str, runs: int, source: str) -> None:
    """Refuse runs none of which has a throughput score: the objective is the error of tokens/s (the
    sweeps' terms need measured tokens/s too), so a memory-only run, or a tokens/s below half its
    sweep's best, gives it nothing to fit, and the figures the fit would return are the presets' own.
    Which runs are scored turns on the measurements alone, not the figures: checked once."""
    if f.throughput_headline is not None:
        return
    why = [f"{n} {reason}" for reason, n in f.skipped.items()] + \
        [f"{len(f.rows)} with memory alone"] * bool(f.rows) + \
        [f"{n} {what}" for n, what in ((len(f.malformed), "malformed"), (len(f.failed), "the model cannot take")) if n]
    raise CaseError(source, "measured", f"expected a tokens/s the fit can score among the {kind} runs its figures "
                                        f"are fitted to ({runs} given), got none ({'; '.join(why) or 'no run'})")


def fit(kind: str, rows: list[dict], grid: dict[str, tuple], rounds: int = 2, weight: float = 0.5,
        progress: Optional[Callable[[str], None]] = None, source: str = "planner/published") -> dict:
    """Coordinate descent of ``grid``'s figures on ``rows``; leaves the best set applied and returns
    it ({name: value}, None where the preset leaves a figure to the default and nothing beat it).
    CaseError (naming ``source``, the runs' files) where no run has a throughput to fit to."""
    current = {name: current_value(kind, name) for name in grid}
    first = evaluate(rows, experts=False)
    check_scored(first, kind, len(rows), source)
    best, report = score(first, weight)
    if progress:
        progress(f"start {best:.4f} {report}")
    for round_ in range(rounds):
        for name, values in grid.items():
            for value in values:
                apply(kind, {name: value})
                trial_score, trial = objective(rows, weight)
                if trial_score < best - 1e-6:
                    best, report, current[name] = trial_score, trial, value
            apply(kind, {name: current[name]} if current[name] is not None else {})
            if progress:
                progress(f"round {round_} {name} = {current[name]}: {best:.4f} {report}")
    return current
