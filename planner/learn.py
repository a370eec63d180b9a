"""A team's own past runs make the cost model theirs: `layout-planner calibrate --from-runs`.

Microbenchmarks (:mod:`calibration.launch`) measure what the hardware can do; a handful of runs
measure what a team's software does with it. Both end in the same hardware profile.

The fit moves a small set of the cost model's own physical figures (:data:`PARAMETERS`), never a
factor per run or per source, each from its prior (the GPU and fabric presets, or the figures the
runs' cases already set) by maximum a posteriori: minimise

    Σ_runs ρ((log predicted − log measured) / s)  +  Σ_figures ρ((u − u₀) / σ),   ρ(x) ≈ x²

where u is a figure in its own coordinate (the log of an efficiency, a time in seconds, a share of
memory), u₀ its prior and σ the prior's width. ``s`` (RUN_SCATTER) is how far one run sits from the
model for reasons no figure holds: the standard deviation of the model's log error among the runs
of one source on one GPU type, median over the dev groups (0.13, `python bench/few_shot.py`). The
efficiencies' width (±12 %) makes the prior worth about two runs that each inform the figure
fully: one such run moves it about a third of the way toward what it alone says, ten runs 70 %
(tests/test_learn.py). Both sums are taken under a heavy-tailed (Cauchy) loss, equal to the
squares above within about two widths: a run far off the others, a stall or a release's
regression, does not drag the figures, and a prior that every run contradicts (a cluster at a
third of the preset's speed: the model's error per source runs from 3 % to 49 % on the dev groups,
heavy-tailed too) yields to them rather than taking them all for outliers. The fit solves the
plain squares first and reweighs from there. Runs the fitted figures still leave more than
UNEXPLAINED× off are named and set aside (the figures fitted again to the other runs, which alone
count as informing them); where they are most runs, the fit is refused (their units, most
likely); a run left nearer than that but well apart from the others (ALONE_SCATTERS scatters off and
APART times the others' rms error: a run mislabelled, or slowed by what no figure holds) is named
too, with any fitted figure that rests on it alone; a figure fitted FAR_FROM_PRIOR× from its prior
is said.

Throughput and memory are fitted apart: no memory figure changes a step time, and no time figure
a peak. A figure no run informs (none of the runs' step times moves by 1 % when it moves by its
prior's width) stays at its prior; with fewer runs than informed figures, as many are fitted as
there are runs, in PARAMETERS' order (compute, bandwidths, host costs), and the report says which
stayed.

Pure Python over the planner's own ``estimate``: no torch, so a team fits on any machine.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Iterable, Optional, Sequence, Union

import yaml

from cost_models.specs import FabricSpec, Overheads, Performance

from .api_values import CasesArg, LogsArg, PathArg
from .case import load_case
from .errors import Argument, CaseError, api_argument, cli_flag, named
from .fields import describe, read_path, read_str
from .estimate import Estimate, estimate
from .fitted import coverage as jobs_coverage
from .presets import fabric_presets, gpu_preset_name, gpu_presets, performance_presets, resolve_gpu_preset
from .team_runs import Run, check_each_run_once, load_runs, runs_from_rows

# What calibrate_from_runs takes: runs files, published-run rows, Run objects, or a list or tuple mixing them.
RunsArg = Union[PathArg, Mapping[str, Any], Run, Sequence[Union[PathArg, Mapping[str, Any], Run]]]

# How far one run's step time (its peak) sits from the model for reasons no fitted figure holds, as
# a log ratio: the standard deviation of the model's log error inside a group of runs of one source
# on one GPU type, median over the dev groups of 8 runs or more (`python bench/few_shot.py`).
RUN_SCATTER = 0.13
MEMORY_SCATTER = 0.18
# Sensitivity below which a run does not inform a figure: moving the figure by its prior's width
# moves the run's predicted step (or peak) by less than this share.
INFORMS = 0.01
ITERATIONS = 30
# Residuals are weighed by a heavy-tailed (Cauchy) likelihood with its scale at ROBUST scatters: a
# run far off the model for a reason no figure holds (an engine's stall, a release's regression:
# the DeepSpeed ZeRO-3 runs of Narayanan et al. 2021 ran 1.3-1.8x below the model, the Playbook's
# slower ZeRO twins lost 0.5-1.2 s per micro-batch, bench/zero_pairs.py) must not drag every
# figure toward it.
ROBUST = 2.0


def robust_loss(x: float) -> float:
    """Cauchy's loss of a residual in scatters, equal to x² near 0."""
    return ROBUST * ROBUST * math.log1p((x / ROBUST) ** 2)


def robust_weight(x: float) -> float:
    """The weight of a residual in iteratively reweighted least squares under :func:`robust_loss`."""
    return 1.0 / (1.0 + (x / ROBUST) ** 2)


@dataclass(frozen=True)
class Parameter:
    """One fitted figure: where it lives in a profile, its coordinate and its prior's width.

    ``log``: fitted as log(value), its width a relative spread (0.15: ±15 %); otherwise fitted as
    is, its width in its own unit. ``low`` and ``high`` bound the value (an efficiency is at most
    1, a time at least 0)."""

    name: str  # "performance.gemm_efficiency", "fabric.efficiency", "overheads.fragmentation"
    log: bool
    width: float
    low: float
    high: float
    memory: bool = False  # a memory figure (fitted to peaks), not a time one
    why: str = ""

    @property
    def section(self) -> str:
        return self.name.split(".")[0]

    @property
    def key(self) -> str:
        return self.name.split(".", 1)[1]

    def coordinate(self, value: float) -> float:
        return math.log(value) if self.log else value

    def value(self, coordinate: float) -> float:
        v = math.exp(coordinate) if self.log else coordinate
        return min(self.high, max(self.low, v))


# The figures a team's runs can move, in the order they are fitted when runs are fewer than
# figures: compute first, then bandwidths, then host costs. Efficiencies' widths ±12 % (above);
# host costs: the Ultra-Scale Playbook's slower ZeRO twins lost a fixed 0.5-1.2 s per micro-batch
# (bench/zero_pairs.py), a tuned stack loses milliseconds: a per-micro-batch cost's width is 10 ms, a
# per-step one's 50 ms (data loading and logging between steps). Memory: the allocator's
# fragmentation is observed at 5-15 % of the activations (cost_models.specs.Overheads), width 0.05;
# the communication buffers take 0.08-1 GB by engine, width 0.5 GiB; a peak's scatter
# (MEMORY_SCATTER) is the Playbook's, the one dev group that publishes peaks (bench/few_shot.py).
PARAMETERS: tuple[Parameter, ...] = (
    Parameter("performance.gemm_efficiency", True, 0.12, 0.02, 1.0,
              why="share of the 16-bit peak a large GEMM sustains"),
    Parameter("performance.gemm_efficiency_fp8", True, 0.12, 0.02, 1.0,
              why="share of the fp8 peak an fp8 GEMM sustains"),
    # Row-scaled fp8 GEMMs (torchao's rowwise recipes, torchtitan's fp8) run their own kernels at their own
    # share of the fp8 peak (cost_models.hardware.Performance.gemm_efficiency_for): a fitted figure where the
    # priors have one (not_priced), else those GEMMs run at gemm_efficiency_fp8's and move with it.
    Parameter("performance.gemm_efficiency_fp8_rowwise", True, 0.12, 0.02, 1.0,
              why="share of the fp8 peak a row-scaled fp8 GEMM sustains (torchao's rowwise recipes)"),
    Parameter("performance.gemm_efficiency_fp4", True, 0.12, 0.02, 1.0,
              why="share of the fp4 peak an fp4 GEMM sustains"),
    Parameter("performance.attention_efficiency", True, 0.12, 0.02, 1.0,
              why="flash attention's share of peak (the fused kernels' figure moves by the same ratio)"),
    Parameter("performance.intra_node_efficiency", True, 0.12, 0.02, 1.0,
              why="achieved bus bandwidth inside an NVLink domain over its nominal rate"),
    Parameter("fabric.efficiency", True, 0.12, 0.02, 1.5,
              why="achieved bus bandwidth across NVLink domains over the NIC line rate"),
    Parameter("fabric.alltoall_efficiency", True, 0.12, 0.02, 1.0,
              why="achieved all-to-all bandwidth across NVLink domains over the NIC line rate (the experts' "
                  "dispatch and combine)"),
    Parameter("performance.microbatch_overhead_s", False, 0.010, 0.0, 10.0,
              why="host time per micro-batch no GPU work hides"),
    Parameter("performance.step_overhead_s", False, 0.05, 0.0, 600.0,
              why="host time per optimizer step no GPU work hides"),
    Parameter("overheads.fragmentation", False, 0.05, 0.0, 0.9, memory=True,
              why="share of the activations the caching allocator holds beyond them"),
    Parameter("overheads.comm_buffers", False, 0.5 * 2**30, 0.0, 64 * 2**30, memory=True,
              why="bytes of communication buckets and staging beside the model's terms"),
)
BY_NAME = {p.name: p for p in PARAMETERS}


@dataclass(frozen=True)
class Hardware:
    """What one profile describes: one GPU type (a preset) on one fabric, and the priors."""

    gpu: str  # the GPU preset
    fabric: str  # the fabric preset, or "custom" for an inline one
    fabric_mapping: dict  # the fabric's fields, as a preset gives them
    performance: Performance  # the prior figures
    overheads: Overheads


def hardware_key(case: dict) -> tuple[str, str]:
    """(GPU, fabric) a run's case names: what one profile may not mix."""
    cluster = case.get("cluster") or {}
    gpu = cluster.get("gpu")
    fabric = cluster.get("fabric")
    if fabric is None and isinstance(gpu, str):
        fabric = (gpu_presets().get(resolve_gpu(gpu)) or {}).get("fabric")
    return (resolve_gpu(gpu) if isinstance(gpu, str) else "custom",
            fabric if isinstance(fabric, str) else "custom" if fabric else "none")


def resolve_gpu(name: str) -> str:
    """The GPU preset a case's name stands for (``presets.gpu_preset_name``: aliases and any case), else the name."""
    found = gpu_preset_name(str(name))
    return found[0] if len(found) == 1 else str(name)


def prior_hardware(runs: Sequence[Run], source: str, gpu_preset: Optional[str] = None,
                   argument: Argument = cli_flag) -> Hardware:
    """The GPU and fabric the runs share, with their figures as priors; a CaseError naming the runs
    where they mix GPU types or fabrics, or where ``gpu_preset`` (named as ``argument`` names it)
    is not theirs."""
    keys: dict[tuple[str, str], list[str]] = {}
    for run in runs:
        keys.setdefault(hardware_key(run.case), []).append(run.id)
    files = {run.source for run in runs}
    if len(files) == 1 and None not in files:  # one runs file: named as the CLI names it, by the API too
        source = files.pop()
    if len(keys) > 1:
        parts = "; ".join(f"{gpu} on {fabric}: {', '.join(ids[:3])}{' …' if len(ids) > 3 else ''}"
                          for (gpu, fabric), ids in keys.items())
        raise CaseError(source, "cluster", f"one profile is one GPU type on one fabric; these runs mix them ({parts})")
    (gpu, fabric), = keys
    if gpu_preset is not None:
        wanted = resolve_gpu_preset(*argument("gpu_preset"), gpu_preset)
        if wanted != gpu:
            raise CaseError(source, "cluster.gpu", f"the runs ran on {gpu}, not on {named(argument, 'gpu_preset')} "
                                                   f"{wanted}")
    if gpu not in gpu_presets():
        if runs[0].case["cluster"].get("profile") is not None:  # said as "cluster.gpu", which the case has not
            raise CaseError(source, "cluster.profile", "a fit starts from a GPU preset's figures: give the run's case "
                                                       "cluster.gpu (its GPU's preset), not a profile")
        raise CaseError(source, "cluster.gpu", "expected a GPU preset name: a profile's priors are a preset's figures")
    case = load_case(runs[0].case)
    section = runs[0].case["cluster"].get("fabric")
    # Copies, not the cached presets' own dicts: the fit and the profile it returns are the caller's
    # to change, and a change to the preset would reach every later call in the process.
    mapping = copy.deepcopy(fabric_presets()[fabric] if fabric in fabric_presets() else dict(section or {}))
    return Hardware(gpu, fabric, mapping, case.cluster.gpu.performance, case.overheads)


def prior_value(p: Parameter, hw: Hardware) -> float:
    if p.section == "performance":
        perf = hw.performance
        if p.key == "gemm_efficiency_fp8":
            return perf.gemm_efficiency_for("fp8")
        if p.key == "gemm_efficiency_fp8_rowwise":
            return perf.gemm_efficiency_for("fp8_rowwise")
        if p.key == "gemm_efficiency_fp4":
            return perf.gemm_efficiency_for("fp4")
        return getattr(perf, p.key)
    if p.section == "fabric":
        return float(hw.fabric_mapping.get(p.key, getattr(FabricSpec, p.key)))
    return float(getattr(hw.overheads, p.key))


def not_priced(p: Parameter, hw: Hardware) -> str:
    """Why no run's step time moves with ``p`` on ``hw`` (its fallback prices those GEMMs), or "".

    Row-scaled fp8 GEMMs run at gemm_efficiency_fp8's figure where the priors set none of their own
    (``Performance.gemm_efficiency_for``): fitting a row-scaled figure there too would fit two figures to
    the same GEMMs, and write one into the profile that the preset never had."""
    if p.key == "gemm_efficiency_fp8_rowwise" and hw.performance.gemm_efficiency_fp8_rowwise is None:
        return "the preset sets no row-scaled fp8 figure: those GEMMs run at gemm_efficiency_fp8's"
    return ""


# --- a case under fitted figures -----------------------------------------------------------

def with_figures(case: dict, hw: Hardware, values: dict[str, float]) -> dict:
    """``case`` with the figures ``values`` gives (profile names) in its cluster and overheads."""
    performance = dict((case.get("cluster") or {}).get("performance") or {})
    fabric = None
    overheads = dict(case.get("overheads") or {})
    for name, value in values.items():
        p = BY_NAME[name]
        if p.section == "performance":
            if p.key == "attention_efficiency":
                ratio = value / hw.performance.attention_efficiency
                performance["attention_efficiency"] = value
                if hw.performance.attention_efficiency_fused is not None:
                    performance["attention_efficiency_fused"] = min(1.0, hw.performance.attention_efficiency_fused
                                                                    * ratio)
            else:
                performance[p.key] = value
        elif p.section == "fabric":
            fabric = fitted_fabric(fabric or hw.fabric_mapping, p.key, value)
        elif p.key == "comm_buffers":
            overheads[p.key] = f"{value:.6g} B"
        else:
            overheads[p.key] = value
    out = {**case, "cluster": {**case["cluster"], "performance": performance}}
    if fabric is not None:
        out["cluster"]["fabric"] = fabric
    if overheads:
        out["overheads"] = overheads
    return out


def fitted_fabric(mapping: dict, key: str, value: float) -> dict:
    """The fabric's fields with its figure ``key`` fitted to ``value``: the all-reduce efficiency as
    :func:`scaled_fabric` moves it, the all-to-all's as it is."""
    return scaled_fabric(mapping, value) if key == "efficiency" else {**mapping, key: value}


def scaled_fabric(mapping: dict, efficiency: float) -> dict:
    """The fabric's fields with its all-reduce efficiency ``efficiency`` at two nodes, and its
    efficiencies at larger spans moved by the same ratio (the fabric's shape kept)."""
    ratio = efficiency / float(mapping.get("efficiency", FabricSpec.efficiency))
    out = {**mapping, "efficiency": efficiency}
    if mapping.get("efficiency_at"):
        out["efficiency_at"] = [[n, min(1.5, e * ratio)] for n, e in mapping["efficiency_at"]]
    return out


def predict(run: Run, hw: Hardware, values: dict[str, float], est=None) -> tuple[float, float]:
    """(log step time, log peak GiB) of ``run`` under ``values`` (its estimate there, where given)."""
    est = est or estimate(with_figures(run.case, hw, values))
    return math.log(est.step_time_s), math.log(predicted_peak(run, est) / 2**30)


def predicted_peak(run: Run, est: Estimate) -> float:
    """The peak (bytes) ``est`` predicts for what ``run`` measured: its stage's, or the heaviest's, as
    the allocator's reserved blocks or, for an allocated peak, its tensors alone (StageMemory.allocated):
    only reserved peaks inform the fragmentation, which allocated ones pulled toward 0."""
    if run.peak_scope == "allocated":
        stages = est.stages if run.memory_stage is None else (est.stages[run.memory_stage],)
        return max(stage.allocated for stage in stages)
    peak = est.peak if run.memory_stage is None else est.stages[run.memory_stage]
    return peak.total


def measured_step_s(run: Run) -> float:
    t = run.case["training"]
    return t["global_batch_size"] * t["seq_len"] / run.tokens_per_s


# --- the fit ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Figure:
    """One figure of the fit: its prior, its fitted value and how many runs inform it."""

    name: str
    prior: float
    value: float
    runs: int  # runs whose prediction moves by INFORMS or more when the figure moves by its width
    fitted: bool
    why_not: str = ""  # why a figure stayed at its prior
    bound: Optional[float] = None  # the bound of its Parameter the fit stopped at, where it did
    # Each informing run's share of what the runs tell of the figure: its squared sensitivity over the
    # sum of all runs' (their Fisher information about it, at the priors), largest first.
    shares: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Residual:
    id: str
    throughput_before: Optional[float]  # predicted / measured − 1 (tokens/s)
    throughput_after: Optional[float]
    memory_before: Optional[float]  # predicted / measured − 1 (peak)
    memory_after: Optional[float]
    # Where the fitted figures predict the run's own layout not to fit its GPU (it ran): its
    # predicted peak and the most a peak may be and fit, in bytes (``search_memory.fit_limit``).
    unfit: Optional[tuple[float, float]] = None


# A run the fitted figures still leave more than this factor from its measurement, either way, is
# one no figure explains: ten times the scatter a run shows about the model (RUN_SCATTER, 13 %, a
# factor of 3 is 8.5 scatters), past the 1.3-1.8x of the slowest engine stalls published (above).
UNEXPLAINED = 3.0
# A run the fit leaves ALONE_SCATTERS of its scatter (RUN_SCATTER, MEMORY_SCATTER) off, and APART times
# the rms of the other runs' residuals, is one the others' figures do not explain: named (FarRun). At
# ROBUST scatters (2: predicted 1.30x or 0.77x of a step time) the heavy-tailed loss already weighs the
# run at under half of one, so the fit has in effect set it aside, and a user should hear which; the
# second test keeps quiet where all runs scatter alike (a cluster as noisy as the model's 13 % error),
# where one run at 30 % is no news. A run mislabelled bf16 among fp8 ones stayed 32 % off while the rest
# fit within 3 %, and moved gemm_efficiency 0.50 -> 0.547 as the one run informing it, unsaid.
ALONE_SCATTERS = ROBUST
APART = 3.0
# A run holding this share of what the runs tell of a figure is what the figure rests on (ALONE: alone).
RESTS_ON, ALONE = 0.5, 0.9

# A fitted figure this factor or more from its prior says the runs' cluster is unlike the preset's,
# or that a run's figures are in other units: said, not refused.
FAR_FROM_PRIOR = 2.0


@dataclass(frozen=True)
class Fit:
    # Compared by value, never hashed, as every result the API returns (docs/commands.md, Python API): most
    # hold dicts, which may change after hashing; hash() names the type rather than failing on a dict inside.
    __hash__ = None  # type: ignore[assignment]

    hardware: Hardware
    figures: tuple[Figure, ...]
    residuals: tuple[Residual, ...]
    coverage: dict[str, list]
    # Each run's file (its id's), where it was read from one: what an error about the run names.
    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    # (run id, "tokens/s" or "peak memory") of each measurement no figure explains, left out of the fit
    # (set_aside): the figures, the runs counted as informing each and the coverage are the other runs'.
    set_aside: tuple[tuple[str, str], ...] = ()
    # What each run left out and the reading guessed (Run.guessed), one line a fact and run, named as
    # warnings name a run: figures fitted on a wrong guess are off, and only the run's author knows.
    notes: tuple[str, ...] = ()

    @property
    def values(self) -> dict[str, float]:
        return {f.name: f.value for f in self.figures if f.fitted}

    def fitted_runs(self) -> list[str]:
        """The runs the figures were fitted to: each with a measurement not set aside."""
        return [r.id for r in self.residuals
                if any(after is not None and (r.id, what) not in self.set_aside
                       for what, after in (("tokens/s", r.throughput_after), ("peak memory", r.memory_after)))]

    def summary(self) -> str:
        """How many runs the figures were fitted to, and how many measurements were set aside."""
        fitted = len(self.fitted_runs())
        line = f"{fitted} run{'' if fitted == 1 else 's'} fitted"
        for kind in ("tokens/s", "peak memory"):
            aside = sum(what == kind for _, what in self.set_aside)
            if aside:
                line += f"; the {kind} of {aside} run{'' if aside == 1 else 's'} set aside, no figure explaining it"
        return line

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON types, for a job that logs it (``json.dumps(fit.to_dict())``): each
        figure beside its prior, each run's error before and after, the runs' coverage and the warnings
        the CLI prints; the hardware the figures price is the profile's (the first of the pair)."""
        return {"figures": [{"name": f.name, "prior": f.prior, "value": f.value, "runs": f.runs, "fitted": f.fitted,
                             "why_not": f.why_not or None, "bound": f.bound} for f in self.figures],
                "residuals": [{"id": r.id, "throughput_before": r.throughput_before,
                               "throughput_after": r.throughput_after, "memory_before": r.memory_before,
                               "memory_after": r.memory_after,
                               "unfit": None if r.unfit is None else {"peak_bytes": r.unfit[0],
                                                                      "limit_bytes": r.unfit[1]}}
                              for r in self.residuals],
                "coverage": {k: list(v) for k, v in self.coverage.items()},
                "fitted_runs": self.fitted_runs(),
                "set_aside": [{"id": rid, "measure": what} for rid, what in self.set_aside],
                "warnings": self.warnings(), "notes": list(self.notes)}

    def unexplained(self) -> list[tuple[str, str, float]]:
        """(run id, "tokens/s" or "peak memory", predicted / measured) of each run the fitted figures
        leave more than UNEXPLAINED× from its measurement."""
        return _unexplained(self.residuals)

    def far_off(self) -> list[tuple[str, str, float, float]]:
        """(run id, "tokens/s" or "peak memory", predicted / measured, the other runs' rms relative error)
        of each run the fit leaves ALONE_SCATTERS scatters and APART times the others' rms error off, but
        within UNEXPLAINED× (:meth:`unexplained` names those)."""
        far = []
        for what, attr, scatter in (("tokens/s", "throughput_after", RUN_SCATTER),
                                    ("peak memory", "memory_after", MEMORY_SCATTER)):
            logs = {r.id: math.log1p(getattr(r, attr)) for r in self.residuals if getattr(r, attr) is not None}
            for rid, x in logs.items():
                # The other runs the figures were fitted to: a run set aside at 10x made the others' rms 100 %.
                others = [y for other, y in logs.items() if other != rid and (other, what) not in self.set_aside]
                if not others or abs(x) >= math.log(UNEXPLAINED) or abs(x) <= ALONE_SCATTERS * scatter:
                    continue
                rms = math.sqrt(sum(y * y for y in others) / len(others))
                if abs(x) > APART * rms:
                    far.append((rid, what, math.exp(x), math.expm1(rms)))
        return far

    def resting_on(self, run_id: str, memory: bool) -> list[tuple[Figure, float]]:
        """The fitted figures (of step times, or of peaks where ``memory``) that rest on ``run_id``:
        it holds RESTS_ON or more of what the runs tell of each; with its share."""
        out = []
        for f in self.figures:
            share = dict(f.shares).get(run_id, 0.0)
            if f.fitted and BY_NAME[f.name].memory == memory and share >= RESTS_ON:
                out.append((f, share))
        return out

    def named(self, run_id: str) -> str:
        """A run as a warning names it: the file that holds it, where it was read from one, and its id (of
        20 runs files, "run llama2-7b-8" alone left the user to search them), as an error names a run."""
        source = self.sources.get(run_id)
        return f"{source}: run {run_id}" if source else f"run {run_id}"

    def warnings(self) -> list[str]:
        """What a user should read before planning on the profile: runs no figure explains, runs the
        others' figures leave far off and the figures resting on them, and figures the runs moved far
        from their priors."""
        lines = [f"{self.named(rid)}: its {what} stays {_factor(what, ratio)} after the fit: no figure explains it "
                 f"(a stall, or a figure in other units); "
                 + ("set aside: the figures are fitted to the other runs" if (rid, what) in self.set_aside
                    else "it weighs little in the fit") for rid, what, ratio in self.unexplained()]
        for rid, what, ratio, others in self.far_off():
            line = (f"{self.named(rid)}: its {what} stays {_factor(what, ratio)} after the fit, while the other runs "
                    f"fit within {others:.0%} (rms): check what it states (its precision, layout, GPU and "
                    "measurement); it weighs little where others inform the same figures")
            for f, share in self.resting_on(rid, what == "peak memory"):
                alone = "alone" if share >= ALONE else f"mostly ({share:.0%} of what the runs tell of it)"
                line += (f"; {f.name} fitted at {_show(f.name, f.value)} (prior {_show(f.name, f.prior)}) rests "
                         f"on this run {alone}")
            lines.append(line)
        # A run that ran, priced as not fitting: its layout, GPU or model misstated, or a plan on the
        # profile would call layouts like it unfit (an 8B at micro-batch 1 on 8 A100s of 40 GB: 63.6 GiB).
        lines += [f"{self.named(r.id)}: its own layout is predicted not to fit after the fit ({r.unfit[0] / 2**30:.1f} GiB "
                  f"a GPU, over the {r.unfit[1] / 2**30:.1f} GiB a peak may take): check its layout, GPU and "
                  "model as written" for r in self.residuals if r.unfit is not None]
        for f in self.figures:
            if f.bound is not None:
                # Two A100 runs at 95 % MFU fitted the GEMMs at 100 % of the datasheet peak, without a word.
                lines.append(f"{f.name} fitted at its bound, {_show(f.name, f.bound)} (the preset's "
                             f"{_show(f.name, f.prior)}): no value the model allows explains the runs; check their "
                             "figures, or what they ran that the model does not price")
                continue
            apart = max(f.value / f.prior, f.prior / f.value) if f.fitted and f.prior > 0 and f.value > 0 else 1.0
            if apart >= FAR_FROM_PRIOR:
                lines.append(f"{f.name} fitted at {_show(f.name, f.value)}, {apart:.1f}x "
                             f"{'below' if f.value < f.prior else 'above'} the preset's {_show(f.name, f.prior)}: the "
                             "runs' cluster is far from the preset's, or their figures are in other units "
                             "(iteration_time_s in seconds, tokens_per_sec_total over all GPUs)")
        return lines


def _factor(what: str, ratio: float) -> str:
    """predicted / measured as a person says it: 'predicted 12.0x faster than measured'."""
    if what == "tokens/s":
        return f"predicted {max(ratio, 1 / ratio):,.1f}x {'faster' if ratio >= 1 else 'slower'} than measured"
    return f"predicted at {ratio:,.1f}x the measured peak" if ratio >= 1 else \
        f"predicted at 1/{1 / ratio:,.1f} of the measured peak"


def _unexplained(residuals: Sequence[Residual]) -> list[tuple[str, str, float]]:
    """``Fit.unexplained`` of ``residuals``."""
    far = []
    for r in residuals:
        for what, after in (("tokens/s", r.throughput_after), ("peak memory", r.memory_after)):
            if after is not None and not 1 / UNEXPLAINED <= after + 1 <= UNEXPLAINED:
                far.append((r.id, what, after + 1))
    return far


def _unexplained_by_kind(residuals: Sequence[Residual]) -> dict[str, tuple[list[tuple[str, str, float]], int]]:
    """For tokens/s and peak memory, each on its own: (the runs ``_unexplained`` names, how many runs measured it)."""
    far = _unexplained(residuals)
    return {kind: ([f for f in far if f[1] == kind], sum(getattr(r, attr) is not None for r in residuals))
            for kind, attr in (("tokens/s", "throughput_after"), ("peak memory", "memory_after"))}


def _to_set_aside(residuals: Sequence[Residual]) -> set[tuple[str, str]]:
    """(run id, measure) of each measurement no figure explains (``_unexplained``), where they are not most
    of their kind's (those check_explained refuses: their units, likely, not the runs)."""
    return {(rid, what) for far, measured in _unexplained_by_kind(residuals).values()
            if 2 * len(far) <= measured for rid, what, _ in far}


def check_explained(result: Fit, source: str) -> None:
    """Refuse a fit where most runs stay more than UNEXPLAINED× off: no figure of the cost model
    explains them (a step time in milliseconds read as seconds, tokens/s per GPU as the total, a
    peak in MB), and the profile would be the priors labelled as fitted."""
    # Speed and memory each on its own: three step times in milliseconds beside three good peaks were
    # 3 of 6 measurements off, not most, and fitted a GEMM efficiency of 0.02 (exit 0).
    for kind, (far, measured) in _unexplained_by_kind(result.residuals).items():
        if far and 2 * len(far) > measured:
            rid, what, ratio = max(far, key=lambda f: abs(math.log(f[2])))
            raise CaseError(result.sources.get(rid, source), f"{rid}.measured",
                            f"{len(far)} of {measured} runs' {kind} stay more than {UNEXPLAINED:g}x from the model "
                            f"after the fit (this run's: {_factor(what, ratio)}): no figure explains them; check their "
                            "units (iteration_time_s in seconds, tokens_per_sec_total over all GPUs, memory_gb_per_gpu "
                            "in GB)")


def _sensitivities(runs: Sequence[Run], hw: Hardware, params: Sequence[Parameter], base: dict[str, float],
                   memory: bool) -> list[list[float]]:
    """∂(log prediction)/∂(coordinate / width) per run and figure, by forward differences."""
    index = 1 if memory else 0
    at = [predict(r, hw, base)[index] for r in runs]
    rows = [[0.0] * len(params) for _ in runs]
    for j, p in enumerate(params):
        u0 = p.coordinate(base[p.name]) if (base[p.name] > 0 or not p.log) else math.log(1e-9)
        step = 0.05 * p.width
        u = u0 + step
        if p.value(u) == base[p.name]:  # at the upper bound: step down
            u, step = u0 - step, -step
        moved = {**base, p.name: p.value(u)}
        for i, r in enumerate(runs):
            rows[i][j] = (predict(r, hw, moved)[index] - at[i]) / (step / p.width)
    return rows


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """x of a·x = b (a small symmetric positive-definite matrix), by Gaussian elimination."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        pivot = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[pivot] = m[pivot], m[c]
        if abs(m[c][c]) < 1e-300:
            continue
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                for k in range(c, n + 1):
                    m[r][k] -= f * m[c][k]
    return [m[i][n] / m[i][i] if abs(m[i][i]) > 1e-300 else 0.0 for i in range(n)]


def _fit_group(runs: Sequence[Run], hw: Hardware, params: Sequence[Parameter], priors: dict[str, float],
               memory: bool) -> dict[str, float]:
    """The MAP figures of ``params`` (normalised coordinates z = (u − u₀)/σ) for ``runs``:
    projected Gauss-Newton on the residuals and the priors' terms."""
    if not params or not runs:
        return {}
    index, scatter = (1, MEMORY_SCATTER) if memory else (0, RUN_SCATTER)
    target = [math.log(r.peak_gib) if memory else math.log(measured_step_s(r)) for r in runs]
    u0 = {p.name: p.coordinate(max(priors[p.name], 1e-9) if p.log else priors[p.name]) for p in params}
    z = [0.0] * len(params)

    def values_of(z: list[float]) -> dict[str, float]:
        return {**priors, **{p.name: p.value(u0[p.name] + zj * p.width) for p, zj in zip(params, z)}}

    def cost(z: list[float], robust: bool) -> float:
        vals = values_of(z)
        res = [(predict(r, hw, vals)[index] - t) / scatter for r, t in zip(runs, target)]
        return sum(robust_loss(x) if robust else x * x for x in res + z)

    # Least squares first, then the heavy-tailed weights from where it ends (graduated robustness):
    # started at the priors, the Cauchy weights take every run as an outlier where all of them sit
    # far from the presets (a cluster at a third of their speed), and the figures stayed nearer the
    # priors the slower the runs were. From the least-squares answer, a run that the others'
    # figures leave far off still weighs little.
    for robust in (False, True):
        current = cost(z, robust)
        for _ in range(ITERATIONS):
            vals = values_of(z)
            jac = _sensitivities(runs, hw, params, vals, memory)
            res = [(predict(r, hw, vals)[index] - t) / scatter for r, t in zip(runs, target)]
            n = len(params)
            w = [robust_weight(x) if robust else 1.0 for x in res]  # reweighted: a run far off counts little
            v = [robust_weight(x) if robust else 1.0 for x in z]  # and a prior the runs all contradict
            # Normal equations of the stacked residuals [res, z]: (JᵀWJ/s² + V) δ = −(JᵀW res/s + V z)
            a = [[sum(w[i] * jac[i][j] * jac[i][k] for i in range(len(runs))) / scatter ** 2
                  + (v[j] if j == k else 0.0) for k in range(n)] for j in range(n)]
            g = [sum(w[i] * jac[i][j] * res[i] for i in range(len(runs))) / scatter + v[j] * z[j] for j in range(n)]
            step = _solve(a, [-x for x in g])
            # Backtrack on the true cost; keep each coordinate inside its bounds.
            for shrink in (1.0, 0.5, 0.25, 0.1):
                trial = [clamp(p, u0[p.name], zj + shrink * dj) for p, zj, dj in zip(params, z, step)]
                c = cost(trial, robust)
                if c < current - 1e-12:
                    break
            else:
                break
            moved = max(abs(a_ - b_) for a_, b_ in zip(trial, z))
            z, current = trial, c
            if moved < 1e-4:
                break
    return {p.name: p.value(u0[p.name] + zj * p.width) for p, zj in zip(params, z)}


def clamp(p: Parameter, u0: float, z: float) -> float:
    """``z`` held where the figure's value stays inside its bounds."""
    lo = (p.coordinate(max(p.low, 1e-12) if p.log else p.low) - u0) / p.width
    hi = (p.coordinate(p.high) - u0) / p.width
    return min(hi, max(lo, z))


def fit(runs: Sequence[Run], source: str = "runs", gpu_preset: Optional[str] = None,
        argument: Argument = cli_flag) -> Fit:
    """The figures ``runs`` teach (module docstring), with their priors and each run's residuals;
    ``argument`` names ``gpu_preset`` in an error (the CLI's flag, the API's argument)."""
    if not runs:
        raise CaseError(source, "", "no runs to fit")
    hw = prior_hardware(runs, source, gpu_preset, argument)
    priors = {p.name: prior_value(p, hw) for p in PARAMETERS}
    figures, values = _fit_figures(runs, hw, priors, set())
    residuals = _residuals(runs, hw, priors, values)
    # A run the fitted figures leave more than UNEXPLAINED× off weighs about 5 % of a run under the
    # heavy-tailed likelihood, yet it counted as a run informing each figure, toward how many figures
    # its runs may fit (two good runs and one at 10x fitted three) and in the runs the report said were
    # used: the figures are fitted again without it, and the report says it was set aside.
    aside = _to_set_aside(residuals)
    if aside:
        figures, values = _fit_figures(runs, hw, priors, aside)
        residuals = _residuals(runs, hw, priors, values)
    kept = [r for r in runs if any(measured and (r.id, what) not in aside
                                   for what, measured in (("tokens/s", r.tokens_per_s), ("peak memory", r.peak_gib)))]
    sources = {r.id: r.source for r in runs if r.source}
    notes = tuple(f"{sources[r.id]}: run {r.id}: {line}" if r.id in sources else f"run {r.id}: {line}"
                  for r in runs for line in r.guessed)
    return Fit(hw, tuple(figures), tuple(residuals), coverage(kept), sources, tuple(sorted(aside)), notes)


def _fit_figures(runs: Sequence[Run], hw: Hardware, priors: dict[str, float],
                 aside: set[tuple[str, str]]) -> tuple[list[Figure], dict[str, float]]:
    """Each figure fitted to ``runs`` (its prior where none informs it), and the values of all: the step
    times and the peaks each on their own, less the measurements ``aside``."""
    timed = [r for r in runs if r.tokens_per_s and (r.id, "tokens/s") not in aside]
    weighed = [r for r in runs if r.peak_gib and (r.id, "peak memory") not in aside]
    figures: list[Figure] = []
    values = dict(priors)
    for memory, group in ((False, timed), (True, weighed)):
        figures += [Figure(p.name, priors[p.name], priors[p.name], 0, False, not_priced(p, hw))
                    for p in PARAMETERS if p.memory == memory and not_priced(p, hw)]
        params = [p for p in PARAMETERS if p.memory == memory and not not_priced(p, hw)]
        if not group:
            figures += [Figure(p.name, priors[p.name], priors[p.name], 0, False,
                               "no run measured " + ("a peak" if memory else "a step time")) for p in params]
            continue
        sens = _sensitivities(group, hw, params, priors, memory)
        informs = [sum(1 for row in sens if abs(row[j]) >= INFORMS) for j in range(len(params))]
        # In PARAMETERS' order: compute first, then bandwidths, then host costs.
        candidates = [j for j in range(len(params)) if informs[j]]
        chosen = set(candidates[:len(group)])
        fitted = _fit_group(group, hw, [params[j] for j in sorted(chosen)], priors, memory)
        values.update(fitted)
        for j, p in enumerate(params):
            why = "" if j in chosen else ("no run informs it" if not informs[j] else
                                          f"fewer runs ({len(group)}) than informed figures ({len(candidates)}); "
                                          "the ones listed first were fitted")
            at = next((b for b in (p.low, p.high) if values[p.name] == b and values[p.name] != priors[p.name]), None)
            total = sum(row[j] ** 2 for row in sens)
            shares = tuple(sorted(((r.id, row[j] ** 2 / total) for r, row in zip(group, sens)
                                   if abs(row[j]) >= INFORMS), key=lambda x: -x[1])) if total > 0 else ()
            figures.append(Figure(p.name, priors[p.name], values[p.name], informs[j], j in chosen, why,
                                  at if j in chosen else None, shares))
    order = {p.name: i for i, p in enumerate(PARAMETERS)}  # the report's and the profile's order
    return sorted(figures, key=lambda f: order[f.name]), values


def _residuals(runs: Sequence[Run], hw: Hardware, priors: dict[str, float],
               values: dict[str, float]) -> list[Residual]:
    """Each run's error (predicted / measured − 1) at the priors and at ``values``, and where its own
    layout is predicted not to fit."""
    residuals = []
    for r in runs:
        fitted_estimate = estimate(with_figures(r.case, hw, values))
        before, after = predict(r, hw, priors), predict(r, hw, values, fitted_estimate)
        peak, limit = fitted_estimate.peak.total, fitted_estimate.fit_limit_bytes
        unfit = (peak, limit) if peak > limit else None
        tb = ta = mb = ma = None
        if r.tokens_per_s:
            m = math.log(measured_step_s(r))
            tb, ta = math.exp(m - before[0]) - 1, math.exp(m - after[0]) - 1
        if r.peak_gib:
            m = math.log(r.peak_gib)
            mb, ma = math.exp(before[1] - m) - 1, math.exp(after[1] - m) - 1
        residuals.append(Residual(r.id, tb, ta, mb, ma, unfit))
    return residuals


# --- what the runs covered -----------------------------------------------------------------

def coverage(runs: Iterable[Run]) -> dict[str, list]:
    """The degrees, node counts, ZeRO stages and precisions the runs used (``planner.fitted``)."""
    return jobs_coverage(load_case(r.case).job() for r in runs)


# --- the profile ---------------------------------------------------------------------------

def profile_of(result: Fit, origin: str) -> dict[str, Any]:
    """The profile document: the GPU preset's fields, the performance and fabric figures with the
    fitted ones in, the allocator's overheads, and ``fitted``: priors, runs and coverage."""
    hw = result.hardware
    gpu = {k: copy.deepcopy(v) for k, v in gpu_presets()[hw.gpu].items() if k != "fabric"}  # not the cached preset's
    values = result.values
    performance = copy.deepcopy(performance_presets().get(hw.gpu) or {})
    performance.pop("<<", None)
    probe = with_figures({"cluster": {}}, hw, {k: v for k, v in values.items() if k.startswith("performance.")})
    performance.update(probe["cluster"]["performance"])
    fabric = with_figures({"cluster": {}}, hw, {k: v for k, v in values.items() if k.startswith("fabric.")})[
        "cluster"].get("fabric") or dict(hw.fabric_mapping)
    overheads = {p.key: values.get(p.name, getattr(hw.overheads, p.key)) for p in PARAMETERS if p.memory}
    warnings = result.warnings()
    return {
        "machine": {"device": hw.gpu, "source": origin, "fabric": hw.fabric},
        "gpu": gpu,
        "performance": {k: _plain(v) for k, v in performance.items()},
        "fabric": {k: [[n, _plain(e)] for n, e in v] if k == "efficiency_at" else _plain(v) for k, v in fabric.items()},
        "overheads": {"fragmentation": _plain(overheads["fragmentation"]),
                      "comm_buffers": f"{overheads['comm_buffers'] / 2**30:.4g} GiB"},
        "fitted": {
            "figures": {f.name: {"prior": _plain(f.prior), "value": _plain(f.value), "runs": f.runs,
                                 **({"stayed_at_prior": f.why_not} if not f.fitted else {})}
                        for f in result.figures},
            "runs": [{"id": r.id, **{k: _plain(v) for k, v in (("throughput_before", r.throughput_before),
                                                                ("throughput_after", r.throughput_after),
                                                                ("memory_before", r.memory_before),
                                                                ("memory_after", r.memory_after)) if v is not None}}
                     for r in result.residuals],
            "coverage": result.coverage,
            # What calibrate printed as warnings, kept where the profile goes: a run the fit left far off
            # and a figure resting on it alone read nowhere after the terminal scrolled.
            **({"warnings": warnings} if warnings else {}),
            **({"notes": list(result.notes)} if result.notes else {}),
        },
    }


def _plain(v: Any) -> Any:
    return float(f"{v:.4g}") if isinstance(v, float) else v


# --- the API, the file and the report ------------------------------------------------------------

def calibrate_from_runs(runs: RunsArg, gpu_preset: Optional[str] = None) -> tuple[dict[str, Any], Fit]:
    """The profile a team's runs teach, and the fit's report.

    ``runs``: published-runs files (paths), rows in that schema (dicts) or :class:`Run` objects,
    or a list mixing them; ``gpu_preset``: the GPU preset whose figures are the priors (default:
    the runs' own)."""
    argument = api_argument("calibrate_from_runs")
    if gpu_preset is not None:
        read_str("calibrate_from_runs", "gpu_preset", gpu_preset)
    items = list(runs) if isinstance(runs, (list, tuple)) else [runs]
    collected: list[Run] = []
    rows: list[Any] = []
    for item in items:
        if isinstance(item, Run):
            collected.append(item)
        elif isinstance(item, dict):
            rows.append(item)
        elif isinstance(item, (str, os.PathLike)):
            collected += load_runs([read_path("calibrate_from_runs", "runs", item)])
        else:
            raise CaseError("runs", "", f"expected runs files, published-run rows or Run objects, got "
                                        f"{type(item).__name__}")
    if rows:
        collected += runs_from_rows(rows, "runs")
    check_each_run_once(collected, "runs")
    result = fit(collected, "runs", gpu_preset, argument)
    check_explained(result, "runs")
    origins = sorted({str(i) for i in items if isinstance(i, (str, os.PathLike))})
    return profile_of(result, ", ".join(origins) or f"{len(collected)} runs"), result


def calibrate_from_logs(logs: LogsArg, cases: CasesArg, gpu_preset: Optional[str] = None) -> tuple[dict[str, Any], Fit]:
    """The profile a team's training logs teach (`calibrate --from-logs`), and the fit's report:
    ``logs``, one path or a list of them, as the engines print them (:mod:`planner.training_logs`);
    ``cases``, the case each ran (a path or a dict in the case-file schema, with its layout): one for
    every log, or one per log in order; ``gpu_preset`` as :func:`calibrate_from_runs` takes it."""
    from .team_runs import runs_from_logs

    argument = api_argument("calibrate_from_logs", {"from_logs": "logs", "case": "cases"})
    if gpu_preset is not None:
        read_str("calibrate_from_logs", "gpu_preset", gpu_preset)
    # Each value as given, checked below (Any: the hint's other sequences are refused by name, not listed).
    each_log: list[Any] = list(logs) if isinstance(logs, (list, tuple)) else [logs]
    paths = [read_path("calibrate_from_logs", "logs", log) for log in each_log]
    each_case: list[Any] = list(cases) if isinstance(cases, (list, tuple)) else [cases]
    if not all(isinstance(c, (dict, str, os.PathLike)) for c in each_case):
        raise CaseError("calibrate_from_logs", "cases", "expected case-file paths or dicts, got "
                                                        f"{', '.join(sorted({type(c).__name__ for c in each_case}))}")
    runs = runs_from_logs(paths, each_case, argument)
    result = fit(runs, "logs", gpu_preset, argument)
    check_explained(result, "logs")
    return profile_of(result, ", ".join(str(p) for p in paths)), result


HEADER = """\
# Hardware profile written by `layout-planner calibrate --from-runs` (or --from-logs). Use it in a case as
#   cluster: {profile: PATH, num_gpus: N}
# gpu: the GPU preset's figures; performance, fabric and overheads: the preset's with the figures the runs
# taught; fitted: each fitted figure's prior and value, the runs behind it with their residuals (predicted /
# measured - 1) before and after, what the runs covered and the fit's warnings. See planner/learn.py.
"""


def render(profile: dict[str, Any]) -> str:
    """The profile's YAML text, under HEADER."""
    if not isinstance(profile, dict) or not profile:
        # Rendered as "null" or "{}", it made a profile file every case then refused on loading.
        raise CaseError("render", "profile", f"expected the profile a calibration returned (a mapping of its "
                                             f"sections), got {describe(profile)}")
    return HEADER + yaml.safe_dump(profile, sort_keys=False, default_flow_style=None, width=120, allow_unicode=True)


def print_fit(result: Fit, console: Any) -> None:
    """Each figure beside its prior with the runs that inform it; each run's residuals."""
    from rich.table import Table  # the CLI's; `import planner` stays without it

    table = Table(title=f"Figures fitted to the runs ({result.hardware.gpu} on {result.hardware.fabric})")
    for column in ("figure", "prior", "fitted", "runs"):
        table.add_column(column, justify="right" if column in ("prior", "fitted", "runs") else "left", no_wrap=True)
    for f in result.figures:
        table.add_row(f.name, _show(f.name, f.prior), _show(f.name, f.value) if f.fitted else "—", str(f.runs))
    console.print(table)
    # Each figure's note under the table, a line of its own that the console wraps between words: as a
    # fifth column it was what the 40-character names left of 80 columns, about 5 characters, each row
    # ten lines tall with its words cut ("16-b…").
    for f in result.figures:
        console.print(f"{f.name}: {f.why_not or BY_NAME[f.name].why}", markup=False, highlight=False)
    runs = Table(title="Runs: predicted / measured − 1, before → after")
    for column in ("run", "tokens/s", "peak memory"):
        runs.add_column(column, justify="left" if column == "run" else "right")

    def pair(a: Optional[float], b: Optional[float]) -> str:
        return "—" if a is None else f"{a:+.1%} → {b:+.1%}"

    for r in result.residuals:
        runs.add_row(r.id, pair(r.throughput_before, r.throughput_after), pair(r.memory_before, r.memory_after))
    console.print(runs)


def _show(name: str, value: float) -> str:
    if name.endswith("comm_buffers"):
        return f"{value / 2**30:.3g} GiB"
    if name.endswith("_s"):
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g}"
