"""Mixtures of experts as if each family had never been seen: `validate-published --leave-family-out`.

Some of the presets' figures were fitted to published runs that include mixtures of experts
(``planner.refit``; ``planner/presets/performance.yaml`` says which): H100's GEMM efficiencies, kernel
cost, HBM efficiency and overlap (every H100 run at once), GB200's fp8 GEMM efficiency (its MLPerf and
MoE recipes), and GB300's fp8 figure, set at GB200's fitted share of its own best GEMM. A family's
error on the dev rows flatters the model if those fits saw the family.

For each MoE family with scored runs, the fits are rerun twice by the same procedure: on every run
(the reference, "in family") and on every run but the family's ("left out"), and the family's runs
are scored under each. Where none of a family's runs is on a GPU type whose figures were fitted to
runs, nothing was set using them, and the report says so. No other figure of the presets was set
from a published run's measurement (the rest cite kernel and collective benchmarks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from .errors import CaseError
from .fidelity import Summary, evaluate
from .published_runs import gpu_preset
from .refit import TYPES, apply, fit, grid_for, held

# Families by the model name a published run gives.
FAMILIES = (("DeepSeek", r"deepseek"), ("Qwen3", r"qwen3"), ("Mixtral", r"mixtral"), ("Llama 4", r"llama-?4"),
            ("Kimi K2", r"kimi"), ("GPT-OSS", r"gpt-oss"), ("Nemotron 3", r"nemotron"))
# The figures fitted to published runs, per GPU type (``planner.refit.TYPES``), as the presets say.
FITTED = {"h100": ("gemm_efficiency", "gemm_efficiency_fp8", "kernel_overhead_s", "hbm_efficiency", "comm_overlap"),
          "gb200": ("gemm_efficiency_fp8",)}
# Figures set from another type's fit: GB300's fp8 efficiency is GB200's fitted share of its own best
# (performance.yaml), so it moves with GB200's in the same ratio.
DERIVED = {"gb300": ("gb200", "gemm_efficiency_fp8")}


@dataclass(frozen=True)
class FamilyScore:
    family: str
    runs: int
    in_family: Optional[Summary]  # the fits on every run
    left_out: Optional[Summary]  # the fits without the family's runs; None where no fit saw them
    fitted_on: tuple[str, ...]  # the GPU types whose fits saw the family's runs

    @property
    def ratio(self) -> Optional[float]:
        if self.in_family is None or self.left_out is None or not self.in_family.mean_abs:
            return None
        return self.left_out.mean_abs / self.in_family.mean_abs


def family_of(row: dict) -> Optional[str]:
    """The MoE family of a published run, or None for a dense model or one of no listed family."""
    model = row.get("model") or {}
    if not model.get("moe"):
        return None
    name = str(model.get("name", "")).lower()
    return next((family for family, pattern in FAMILIES if re.search(pattern, name)), None)


def _refit(rows: Sequence[dict], leave: Optional[str], ratios: dict[str, float], source: str) -> None:
    """Rerun each fitted type's fit on its runs (without ``leave``'s), one round, and set the derived
    figures at their shipped ratio (``ratios``) to the refit ones. CaseError (naming ``source``) where a
    type's runs give the fit no tokens/s to fit to: without ``leave``'s, the figures kept were fitted
    with them, and its score "left out" would not be."""
    from .presets import performance_presets

    presets = performance_presets()
    for kind, names in FITTED.items():
        own = fitted_rows(rows, kind, leave)
        if own:
            try:
                fit(kind, own, {name: values for name, values in grid_for(kind).items() if name in names}, rounds=1,
                    source=source)
            except CaseError as error:
                if leave is None:
                    raise
                raise CaseError(error.source, error.key, f"{error.expected}, {leave}'s runs left out") from None
    for gpu, (base, name) in DERIVED.items():
        presets[gpu] = {**presets[gpu], name: ratios[gpu] * presets[TYPES[base][0]][name]}
    apply(next(iter(FITTED)), {})  # clears the cost models' caches after the derived figures


def fitted_rows(rows: Sequence[dict], kind: str, leave: Optional[str]) -> list[dict]:
    """The runs a GPU type's figures are refit on: every run on that type, dense ones included,
    but ``leave``'s family's (none left out where ``leave`` is None)."""
    return [r for r in rows if gpu_preset(str(r.get("gpu", ""))) in TYPES[kind]
            and (leave is None or family_of(r) != leave)]


def _derived_ratios() -> dict[str, float]:
    """Each derived figure over its base type's, as shipped."""
    from .presets import performance_presets

    presets = performance_presets()
    return {gpu: presets[gpu][name] / presets[TYPES[base][0]][name] for gpu, (base, name) in DERIVED.items()}


def _errors(rows: Sequence[dict], family: str) -> Optional[Summary]:
    result = evaluate([r for r in rows if family_of(r) == family], experts=False)
    errors = [r.predicted / r.measured - 1 for r in result.rows if r.measured]
    return Summary.of(errors) if errors else None


def evaluate_families(rows: Sequence[dict], progress: Callable[[str], None] = lambda _: None,
                      source: str = "planner/published") -> list[FamilyScore]:
    """Every MoE family's error with the fits on every run and without its own (module docstring);
    CaseError, naming ``source`` (the runs' files), where a refit has no tokens/s to fit to."""
    rows = [r for r in rows if isinstance(r, dict)]
    ratios = _derived_ratios()
    scored = {r.row["id"] for r in evaluate([r for r in rows if family_of(r)], experts=False).rows if r.measured}
    families = sorted({family for r in rows if r.get("id") in scored and (family := family_of(r)) is not None})
    fitted_types = {kind: {family_of(r) for r in rows if r.get("id") in scored
                           and gpu_preset(str(r.get("gpu", ""))) in TYPES[kind]} for kind in FITTED}
    progress("refitting on every run")
    with held():
        _refit(rows, None, ratios, source)
        reference = {family: _errors(rows, family) for family in families}
    out = []
    for family in families:
        seen = tuple(kind for kind, members in fitted_types.items() if family in members)
        runs = sum(1 for r in rows if r.get("id") in scored and family_of(r) == family)
        left = None
        if seen:
            progress(f"refitting without {family}")
            with held():
                _refit(rows, family, ratios, source)
                left = _errors(rows, family)
        out.append(FamilyScore(family, runs, reference[family], left, seen))
    return out


def print_report(scores: Sequence[FamilyScore], console) -> None:
    from rich.table import Table

    if not scores:  # an empty table would read as a result
        console.print("leave-family-out: the runs hold no mixture-of-experts family to leave out", markup=False)
        return

    table = Table(title="Leave one MoE family out: mean |error| of tokens/s on its runs, the fitted figures refit "
                        "with and without them")
    for column in ("family", "runs", "fits that saw it", "in family", "left out", "ratio", "bias left out"):
        table.add_column(column, justify="left" if column in ("family", "fits that saw it") else "right")
    for s in scores:
        table.add_row(s.family, str(s.runs), ", ".join(s.fitted_on) or "none",
                      f"{s.in_family.mean_abs:.1%}" if s.in_family else "—",
                      f"{s.left_out.mean_abs:.1%}" if s.left_out else "(none set from its runs)",
                      f"{s.ratio:.2f}x" if s.ratio else "—",
                      f"{s.left_out.bias:+.1%}" if s.left_out else "—")
    console.print(table)


def to_dict(scores: Sequence[FamilyScore]) -> list[dict]:
    return [{"family": s.family, "runs": s.runs, "fitted_on": list(s.fitted_on),
             "in_family_mean_abs": s.in_family.mean_abs if s.in_family else None,
             "left_out_mean_abs": s.left_out.mean_abs if s.left_out else None,
             "left_out_bias": s.left_out.bias if s.left_out else None, "ratio": s.ratio} for s in scores]
