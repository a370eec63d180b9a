"""What a profile fitted to a team's runs (`calibrate --from-runs`) covered, and what lies beyond it.

A fitted figure is as good as the runs behind it: a plan at a tensor-parallel degree, a node
count, a ZeRO stage or a precision no run used leans on a figure those runs never exercised
there. The profile's ``fitted.coverage`` lists what the runs used; :func:`outside` says where a
job leaves it, naming the fitted figure the job leans on there.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional

from cost_models.specs import Job

from .limits import MAX_INT

COVERED = ("tp", "pp", "cp", "ep", "zero_stage", "nodes", "precision", "seq_len", "micro_batch_size", "recompute",
           "engine", "model_kind")
# model_kind: "dense" or "moe" (a mixture of experts). Runs of dense models never price the experts'
# grouped GEMMs or their dispatch, nor runs of experts a dense MLP's GEMMs alone: a profile fitted to one
# kind gave a Mixtral at ep 1 no note at all (its degrees all lay inside dense runs'). Profiles written
# before this respect have no such entry and say nothing of it.
# The fitted figure a job leans on where it leaves the runs' coverage in each respect: the expert
# dispatch (an all-to-all) and ZeRO's traffic run over the fabric across nodes, inside one over NVLink
# (:func:`outside`).
LEANS_ON = {"tp": "performance.intra_node_efficiency", "cp": "performance.intra_node_efficiency",
            "ep": "fabric.alltoall_efficiency", "pp": "performance.microbatch_overhead_s",
            "zero_stage": "fabric.efficiency", "nodes": "fabric.efficiency",
            "seq_len": "performance.attention_efficiency", "micro_batch_size": "performance.gemm_efficiency",
            "recompute": "performance.gemm_efficiency", "engine": "performance.gemm_efficiency"}
# Respects in which a job between two of the runs' values lies inside their coverage: a fitted figure
# priced at 2 and 8 nodes (a fabric efficiency, an attention or GEMM efficiency by size) holds between
# them as it does at either; the degrees, ZeRO stages and names are each a regime of their own.
RANGED = ("nodes", "seq_len", "micro_batch_size")
MODEL_KINDS = ("dense", "moe")
# The GEMM figure of a job's precision; any other respect's note that leans on "the GEMMs" names it (an
# fp8 case at an engine no run used leans on gemm_efficiency_fp8, not on the 16-bit figure).
GEMM = "performance.gemm_efficiency"
PRECISION_FIGURE = {"fp8": "performance.gemm_efficiency_fp8", "mxfp8": "performance.gemm_efficiency_fp8",
                    "nvfp4": "performance.gemm_efficiency_fp4"}
ROWWISE = "performance.gemm_efficiency_fp8_rowwise"


def gemm_figure(job: Job) -> str:
    """The GEMM figure ``job``'s GEMMs run at (``Performance.gemm_efficiency_for``): its recipe's row-scaled
    kernels' where its GPU sets a figure of their own (torchao's rowwise recipes), else its precision's."""
    recipe = job.training.recipe
    if recipe is not None and recipe.kernel == "fp8_rowwise" \
            and job.cluster.gpu.performance.gemm_efficiency_fp8_rowwise is not None:
        return ROWWISE
    return PRECISION_FIGURE.get(job.training.precision, GEMM)


def _named_values() -> dict[str, tuple[str, ...]]:
    """The values a respect of coverage given by name may take: the precisions, recomputations and engines."""
    from cost_models.specs import PRECISIONS, RECOMPUTE

    from .engines import ENGINES

    return {"precision": PRECISIONS, "recompute": RECOMPUTE, "engine": tuple(ENGINES), "model_kind": MODEL_KINDS}


def check_fitted_figures_kept(src: str, key: str, cluster: Any, fitted: Optional[dict]) -> None:
    """Refuse a cluster's ``fabric``, or a ``performance`` figure, (at ``key``: cluster, or one of `size`'s
    cluster.options) beside a profile whose fabric or that figure a team's runs fitted: the case's would
    replace the fitted one, silently, while the profile's coverage notes still named it."""
    from .errors import CaseError

    if not isinstance(cluster, dict) or not fitted:
        return
    informed = {name: figure for name, figure in (fitted.get("figures") or {}).items() if figure.get("runs")}
    performance = cluster.get("performance")
    for name in performance if isinstance(performance, dict) else ():
        figure = informed.get(f"performance.{name}")
        if figure is not None:
            raise CaseError(src, f"{key}.performance.{name}",
                            f"replaces the profile's {name} {figure.get('value')}, fitted to {figure['runs']} of the "
                            "team's runs: give either it or that profile, not both")
    fitted_fabric = {name: figure for name, figure in informed.items() if name.startswith("fabric.")}
    if "fabric" in cluster and fitted_fabric:
        name, figure = next(iter(fitted_fabric.items()))
        raise CaseError(src, f"{key}.fabric", f"replaces the profile's fabric, whose {name} {figure.get('value')} "
                                              f"was fitted to {figure['runs']} of the team's runs: give either "
                                              "fabric or that profile, not both (the fabric of another cluster "
                                              "is another profile's)")


def read_fitted(src: str, section: Any) -> Optional[dict]:
    """A profile's ``fitted`` section, as ``learn.profile`` writes it, checked where it is read (a
    coverage of "all" or figures as a list crashed the first plan that left the runs): ``figures``
    maps a figure's name to its ``value``, ``prior`` and ``runs``; ``coverage`` each respect of
    :data:`COVERED` to the values the runs used; ``runs`` the runs' residuals; ``warnings`` what the fit
    warned of; ``notes`` what the runs left out and was guessed. None where absent."""
    from .errors import CaseError
    from .fields import describe

    if section is None:
        return None
    if not isinstance(section, dict):
        raise CaseError(src, "fitted", f"expected a mapping (as calibrate --from-runs writes it), got "
                                       f"{describe(section)}")
    unknown = set(section) - {"figures", "runs", "coverage", "warnings", "notes"}
    if unknown:
        raise CaseError(src, f"fitted.{sorted(map(str, unknown))[0]}",
                        "unknown key; expected figures, runs, coverage, warnings, notes")
    for key, what in (("warnings", "the fit's warnings"), ("notes", "what the runs left out and was guessed")):
        said = section.get(key, [])
        if not isinstance(said, list) or not all(isinstance(line, str) for line in said):
            raise CaseError(src, f"fitted.{key}", f"expected a list of {what}, got {describe(said)}")
    figures, cover = section.get("figures", {}), section.get("coverage", {})
    named = _named_values()
    if not isinstance(figures, dict):
        raise CaseError(src, "fitted.figures", f"expected a mapping of figure names to their value, prior and "
                                               f"runs, got {describe(figures)}")
    from .learn import BY_NAME

    for name, figure in figures.items():
        if name not in BY_NAME:  # a figure no fit writes: its note would name what nothing prices
            raise CaseError(src, f"fitted.figures.{name}", f"unknown figure; expected one of {', '.join(BY_NAME)}")
        if not isinstance(figure, dict):
            raise CaseError(src, f"fitted.figures.{name}", f"expected its value, prior and runs, got {describe(figure)}")
    if not isinstance(cover, dict):
        raise CaseError(src, "fitted.coverage", f"expected a mapping of {', '.join(COVERED)} to the values the "
                                                f"runs used, got {describe(cover)}")
    for key, seen in cover.items():
        if key not in COVERED:
            raise CaseError(src, f"fitted.coverage.{key}", f"unknown key; expected one of {', '.join(COVERED)}")
        allowed = named.get(key)
        ok = isinstance(seen, list) and bool(seen) and all(
            (v in allowed) if allowed is not None else
            (isinstance(v, int) and not isinstance(v, bool) and
             ((0 <= v <= 3) if key == "zero_stage" else (1 <= v <= MAX_INT))) for v in seen)
        if not ok:
            expected = f"one of {', '.join(allowed)}" if allowed is not None else \
                "ZeRO stages from 0 to 3" if key == "zero_stage" else f"whole numbers from 1 to {MAX_INT}"
            raise CaseError(src, f"fitted.coverage.{key}", f"expected a list of the values the runs used ({expected}), "
                                                           f"got {describe(seen)}")
    for name, figure in figures.items():
        for field in ("value", "prior"):
            value = figure.get(field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise CaseError(src, f"fitted.figures.{name}.{field}", f"expected a number, got {describe(value)}")
        runs = figure.get("runs")
        if runs is not None and (isinstance(runs, bool) or not isinstance(runs, int) or runs < 0):
            raise CaseError(src, f"fitted.figures.{name}.runs", f"expected a count of runs, got {describe(runs)}")
    if not isinstance(section.get("runs", []), list):
        raise CaseError(src, "fitted.runs", f"expected a list of the runs' residuals, got "
                                            f"{describe(section['runs'])}")
    return section


def facts(job: Job) -> dict[str, Any]:
    """The job's degrees, nodes, ZeRO stage and precision, as coverage lists them.

    "nodes" counts the NVLink domains the job spans, not its OS nodes: what its traffic leaving a domain
    runs at, the fabric's efficiency, is priced by the domains a group spans
    (``cost_models.topology._group_links``: ``fabric.efficiency_for(domains)``). On DGX-class nodes a domain
    is a node; on an NVL72 rack (GB200, GB300: 4-GPU trays) it is the rack, and 8 GPUs on two trays were
    "2 nodes", so a profile of 72-GPU runs (one rack) said a 36-GPU plan on that rack left its node range."""
    lay = job.layout
    return {"tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "zero_stage": lay.zero_stage,
            "nodes": math.ceil(job.cluster.num_gpus / job.cluster.gpu.nvlink_domain),
            "precision": job.training.precision, "seq_len": job.training.seq_len,
            "micro_batch_size": lay.micro_batch_size, "recompute": lay.recompute, "engine": job.training.engine.name,
            "model_kind": "moe" if job.model.is_moe else "dense"}


def coverage(jobs: Iterable[Job]) -> dict[str, list]:
    """Every value of each respect the ``jobs`` (a team's runs) used."""
    seen: dict[str, set] = {k: set() for k in COVERED}
    for job in jobs:
        for k, v in facts(job).items():
            seen[k].add(v)
    return {k: sorted(v) for k, v in seen.items()}


def outside(fitted: dict, job: Job) -> list[str]:
    """One line for each respect in which ``job`` leaves the coverage of a profile's ``fitted``
    section, with the fitted figures it leans on there: a value the runs did not use, or for the
    :data:`RANGED` counts, one beyond the least and the most they used."""
    cover, figures = fitted.get("coverage") or {}, fitted.get("figures") or {}
    lines = []
    known = facts(job)
    gemm = gemm_figure(job)
    exchange = {k: _exchange(job, k) for k in ("ep", "zero_stage", "nodes")}
    for k, v in known.items():
        seen = cover.get(k)
        if not isinstance(seen, list) or not seen or v in seen:
            continue
        if k in RANGED and min(seen) <= v <= max(seen):
            continue
        if k == "model_kind":
            lines.append(_kind_line(v, seen, figures, gemm, known["ep"], exchange["ep"]))
            continue
        figure = gemm if k == "precision" else exchange.get(k) or LEANS_ON[k]
        if figure == GEMM:
            figure = gemm
        lines.append(f"{_respect(k, job)} {v} lies outside the fitted profile's runs "
                     f"({', '.join(str(x) for x in seen)}); it leans on {_lean(figures, figure)}")
    return lines


def _respect(key: str, job: Job) -> str:
    """A respect of coverage as a note names it: "nodes", said as NVLink domains where a domain is not an OS
    node (an NVL72 rack of 4-GPU trays: "nodes 2" of a 144-GPU job would read as two trays)."""
    gpu = job.cluster.gpu
    if key == "nodes" and gpu.nvlink_domain != gpu.gpus_per_node:
        return f"nodes (NVLink domains of {gpu.nvlink_domain} GPUs)"
    return key.replace("_", " ")


def _exchange(job: Job, respect: str) -> Optional[str]:
    """The figure a respect whose traffic may cross the fabric (the experts' dispatch, ZeRO's gathers and
    reductions, the node count) leans on where that traffic stays inside one NVLink domain: the NVLink's
    efficiency, not the fabric's (None where it crosses domains: LEANS_ON's fabric figure). Domains, not
    nodes, as the cost model prices it (``cost_models.topology.group_links``): on an NVL72 rack 8 GPUs of
    two 4-GPU trays stay on NVLink, and on DGX H100 nodes an ep group of 2 inside a 16-GPU job does too;
    both were said to lean on the fabric's figures, which their step time does not depend on."""
    from cost_models.topology import group_links

    if respect == "nodes":  # every group of the job: inside one domain where the job is
        inside = job.cluster.num_gpus <= job.cluster.gpu.nvlink_domain
    else:  # the experts' group, or ZeRO's: data parallel with context parallel folded in
        inside = group_links(job.cluster, job.layout, "ep" if respect == "ep" else "dp_cp").domains == 1
    return "performance.intra_node_efficiency" if inside else None


def _kind_line(kind: str, seen: list, figures: dict, gemm: str, ep: int, exchange: Optional[str]) -> str:
    """The note of a dense job on a profile fitted to mixtures of experts, or of one of experts on dense
    runs: the GEMM figure those runs fitted on other shapes, and for experts spread over GPUs (ep > 1)
    the all-to-all figure their dispatch and combine run at, which dense runs never exercised."""
    said = {"dense": "dense models", "moe": "mixtures of experts"}
    if kind == "moe":
        leans = [(gemm, "the experts' GEMMs lean")]
        if ep > 1:  # at ep 1 every expert is local: no dispatch crosses GPUs
            leans.append((exchange or "fabric.alltoall_efficiency", "their all-to-all leans"))
        what = "a mixture of experts"
    else:
        leans, what = [(gemm, "its dense MLP's GEMMs lean")], "a dense model"
    ran = " and ".join(said.get(s, str(s)) for s in seen)
    parts = "; ".join(f"{why} on {_lean(figures, figure)}" for figure, why in leans)
    return f"model kind {kind} ({what}) lies outside the fitted profile's runs ({ran} only); {parts}"


def _lean(figures: dict, figure: str) -> str:
    """A fitted figure as a note names it: its value, prior and the runs behind it, or the preset's
    value where no run informed it or the fit left it at its prior (with fewer runs than informed
    figures: "from 2 runs" said two runs had fitted it), just its name where the profile does not
    list it."""
    f = figures.get(figure) if isinstance(figures.get(figure), dict) else {}
    if not f:
        return figure
    stayed = f.get("stayed_at_prior")
    if f.get("runs") and isinstance(stayed, str):  # informed but left at the prior (fewer runs than figures)
        return f"{figure} {f.get('value')}, the preset's: not fitted, {stayed.split(';')[0]}"
    if f.get("runs"):
        n = f["runs"]
        return f"{figure} {f.get('value')} (prior {f.get('prior')}, from {n} run{'' if n == 1 else 's'})"
    return f"{figure} {f.get('value')}, the preset's: no run informed it"


def other_fabric_notes(case: Any) -> list[str]:
    """A line for each cluster section (cluster, or one of `size`'s cluster.options) on a profile fitted to a
    team's runs that names a ``fabric`` other than the runs': one profile is one GPU type on one fabric.
    Where the runs fitted a fabric figure the case's fabric is refused (:func:`check_fitted_figures_kept`);
    where they fitted none the case's is priced with its own figures, which no run exercised, and the
    profile's coverage notes still named the runs' fabric's figure as the one a plan across nodes leaned on.
    Read from the case as written, after it loaded (a case it cannot read is the command's own error)."""
    from dataclasses import replace

    from .case import read_case
    from .case_cluster import _fabric, cluster_profile, fabric_from_mapping
    from .errors import CaseError
    from .presets import fabric_presets

    try:
        data, src, base = read_case(case)
        cluster = data.get("cluster") if isinstance(data, dict) else None
        options = cluster.get("options") if isinstance(cluster, dict) else None
        sections = [("cluster", cluster)] + [(f"cluster.options[{i}]", section)
                                            for i, section in enumerate(options if isinstance(options, list) else [])]
        lines = []
        for key, section in sections:
            found = cluster_profile(src, section, base, key)
            if found is None or "fabric" not in section:
                continue
            path, profile = found
            machine = profile.get("machine") if isinstance(profile.get("machine"), dict) else {}
            if not isinstance(profile.get("fitted"), dict) or profile.get("fabric") is None:
                continue  # a measured profile's fabric is no team's runs', and one with none has nothing to cover
            runs_on, runs_nic = fabric_from_mapping(path, "fabric", "runs", profile["fabric"])
            priced, nic = _fabric(src, section["fabric"], f"{key}.fabric")
            # Compared by figures (and NIC rate), not by name: the runs' preset named again is their
            # fabric, and an inline fabric with the runs' figures is too.
            if (replace(priced, name=runs_on.name), nic) == (runs_on, runs_nic):
                continue
            ran_on = machine.get("fabric")  # learn.profile_of writes the runs' preset, else "custom" or "none"
            ran_on = ran_on if ran_on in fabric_presets() else "a fabric of their own"
            named = section["fabric"] if isinstance(section["fabric"], str) else "an inline fabric"
            figures = "the preset's figures" if isinstance(section["fabric"], str) else "the case's own figures"
            lines.append(f"{src}: {key}.fabric is {named}, but the runs behind {path} ran on "
                         f"{ran_on}: its communication across nodes is priced with "
                         f"{figures}, which those runs' evidence does not cover (one profile is one GPU type on "
                         "one fabric)")
        return lines
    except CaseError:
        return []  # the command itself reports a case it cannot read

