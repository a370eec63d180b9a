"""`--plot`: the chosen layout's memory by term and stage, and step time against peak memory.

matplotlib is optional (``pip install 'layout-planner[plot]'``) and is imported only
inside :func:`render_plots`, so the rest of the planner never loads it. The figure is
drawn on a bare Agg canvas (no pyplot), which neither switches the caller's backend
nor leaves figures open.
"""

from __future__ import annotations

import io
import textwrap
import os
from pathlib import Path
from typing import TYPE_CHECKING, Union

from .errors import CaseError

if TYPE_CHECKING:
    from .estimate import Estimate
    from .plan import Plan

# Figure size in inches and resolution: the PNG is FIGSIZE * DPI pixels (width, height).
FIGSIZE = (13.0, 5.5)
# The characters of the memory panel's title on one line: at 10 points, about the panel's width.
TITLE_CHARS = 60
DPI = 100
GB = 1e9
# The y axes reach this multiple of the larger of capacity and the tallest bar or point,
# which leaves the legends room above the capacity line.
HEADROOM = 1.4

TERM_COLORS = {
    "parameters": "#4C72B0",
    "gradients": "#DD8452",
    "optimizer_states": "#55A868",
    "activations": "#C44E52",
    "other": "#8C8C8C",
}


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the (step_time, peak_memory) points no other point dominates, by time.

    A point is dominated when another one is no slower and needs no more memory, and
    is strictly better in at least one of the two. Equal points do not dominate each
    other, so all copies of a front point are kept. Ties in time are ordered by memory,
    then by index.
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    front: list[int] = []
    best_memory = float("inf")  # lowest memory among strictly faster points so far
    k = 0
    while k < len(order):
        # One group of equal times: only its lowest memory can be on the front, and only
        # if it beats every strictly faster point.
        time = points[order[k]][0]
        group_end = k
        while group_end < len(order) and points[order[group_end]][0] == time:
            group_end += 1
        lowest = points[order[k]][1]
        if lowest < best_memory:
            front.extend(i for i in order[k:group_end] if points[i][1] == lowest)
            best_memory = lowest
        k = group_end
    return front


def _layout_label(estimate: "Estimate") -> str:
    lay = estimate.to_dict()["layout"]
    parts = [f"dp{lay['dp']}", f"tp{lay['tp']}", f"pp{lay['pp']}"]
    if lay["cp"] > 1:
        parts.append(f"cp{lay['cp']}")
    if lay["vpp"] > 1:
        parts.append(f"vpp{lay['vpp']}")
    if (lay.get("ep") or 1) > 1:
        parts.append(f"ep{lay['ep']}" + (f" etp{lay['etp']}" if (lay.get("etp") or 1) > 1 else ""))
    parts.append(f"mbs{lay['micro_batch_size']}")
    if estimate.job.grad_accum > 1:
        parts.append(f"accum{estimate.job.grad_accum}")
    parts.append(f"ZeRO-{lay['zero_stage']}")
    if lay["sequence_parallel"]:
        parts.append("SP")
    if lay["recompute"] != "none":
        layers = lay.get("recompute_num_layers")
        parts.append(f"recompute {lay['recompute']}" + (f" ({layers} layers)" if layers else ""))
    # what moves the states off the GPU: without it the chart's empty state bars made no sense
    if lay.get("offload_optimizer"):
        share = lay["offload_optimizer"]
        parts.append("optimizer offloaded" + (f" ({share:.0%})" if share < 1 else ""))
    if lay.get("offload_params"):
        parts.append("parameters offloaded")
    if lay.get("offload_activations"):
        parts.append("activations offloaded")
    return " ".join(parts)


def _draw_usable(ax, best: "Estimate", headroom: float) -> None:
    """The line every layout's peak had to stay under: the capacity less the plan's headroom and
    what lives outside PyTorch's allocator (``memory.usable_bytes``)."""
    usable = best.usable_bytes / GB
    if usable < best.capacity_bytes / GB:
        why = f"{headroom:.0%} headroom, " if headroom > 0 else ""
        ax.axhline(usable, color="#C44E52", linestyle=":", linewidth=1.2,
                   label=f"usable ({usable:.1f} GB: {why}CUDA context)")


def _draw_memory(ax, best: "Estimate", headroom: float) -> None:
    stages = [s.stage for s in best.stages]
    bottom = [0.0] * len(stages)
    for term, color in _term_colors(best).items():
        heights = [s.by_term()[term] / GB for s in best.stages]
        ax.bar(stages, heights, bottom=bottom, color=color, width=0.7,
               label=term.replace("_", " "), edgecolor="white", linewidth=0.5)
        bottom = [b + h for b, h in zip(bottom, heights)]
    capacity = best.capacity_bytes / GB
    ax.axhline(capacity, color="black", linestyle="--", linewidth=1.2,
               label=f"GPU capacity ({capacity:.1f} GB)")
    _draw_usable(ax, best, headroom)
    ax.set_ylim(0, max(capacity, max(bottom, default=0.0)) * HEADROOM)
    ax.set_xlim(min(stages) - 0.6, max(stages) + 0.6)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("memory per GPU (GB)")
    # Wrapped: a long label (dp1 tp4 pp2 vpp40 … recompute) ran past the panel, and tight_layout cut
    # the title's start off the figure ("osen layout: …").
    ax.set_title("\n".join(textwrap.wrap(f"Chosen layout: {_layout_label(best)}", TITLE_CHARS)), fontsize=10)
    if len(stages) <= 16:
        ax.set_xticks(stages)
    else:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="upper right", fontsize=8, ncols=2)
    ax.grid(axis="y", alpha=0.3)


def _term_colors(best: "Estimate") -> dict[str, str]:
    terms = list(best.stages[0].by_term()) if best.stages else list(TERM_COLORS)
    fallback = iter(["#937860", "#DA8BC3", "#CCB974", "#64B5CD"])
    return {term: TERM_COLORS.get(term) or next(fallback, "#333333") for term in terms}


def _draw_pareto(ax, plan: "Plan") -> None:
    best = plan.picked("plots")  # render_plots draws a plan that found a layout
    estimates = [best, *plan.alternatives]
    points = [(e.step_time_s, e.peak.total / GB) for e in estimates]
    cloud = [(t, m / GB) for t, m in plan.candidates] or points
    front = pareto_front(cloud)
    if plan.candidates:
        ax.scatter([t for t, _ in cloud], [m for _, m in cloud], s=8, color="#999999", alpha=0.4,
                   label=f"layouts that fit ({len(cloud)})", zorder=1)
    # The best's star under the alternatives: one that ties with it on time and memory
    # still shows, as a dot inside the star.
    ax.scatter([points[0][0]], [points[0][1]], s=160, marker="*", color="#C44E52",
               edgecolor="black", linewidth=0.6, label="best", zorder=3)
    if plan.alternatives:
        ax.scatter([t for t, _ in points[1:]], [m for _, m in points[1:]], s=24, color="#4C72B0",
                   edgecolor="white", linewidth=0.5, alpha=0.9, label=f"alternatives ({len(plan.alternatives)})",
                   zorder=4)
    ax.step([cloud[i][0] for i in front], [cloud[i][1] for i in front], where="post",
            color="#55A868", linewidth=1.5, label="Pareto front", zorder=2)
    ax.annotate(f"{points[0][0]:.3f} s, {points[0][1]:.1f} GB", points[0], xytext=(8, 8),
                textcoords="offset points", fontsize=8)
    capacity = best.capacity_bytes / GB
    ax.axhline(capacity, color="black", linestyle="--", linewidth=1.0, label="GPU capacity")
    _draw_usable(ax, best, plan.headroom)
    times = [t for t, _ in cloud + points]
    span = max(times) - min(times)
    pad = span * 0.08 if span > 0 else max(min(times) * 0.01, 1e-3)
    if max(times) > 5 * min(times):
        ax.set_xscale("log")  # the slow tail would squeeze the front against the axis
    else:
        ax.set_xlim(min(times) - pad, max(times) + pad)
    ax.set_ylim(0, max(capacity, max(m for _, m in cloud + points)) * HEADROOM)
    ax.set_xlabel("step time (s)")
    ax.set_ylabel("peak memory per GPU (GB)")
    ax.set_title("Step time against peak memory", fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)


def render_plots(plan: "Plan", path: Union[str, os.PathLike]) -> bytes:
    """One PNG: the chosen layout's memory by term and stage, and the time/memory trade-off.

    ``path`` (where it will go) names the file in errors; nothing is written here."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise CaseError(str(path), "--plot", "needs matplotlib: pip install 'layout-planner[plot]'") from None
    if plan.best is None:
        raise CaseError(str(path), "--plot", "no layout fits, so there is nothing to plot")

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax_memory, ax_pareto = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.2]})
    _draw_memory(ax_memory, plan.best, plan.headroom)
    _draw_pareto(ax_pareto, plan)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def write_plots(plan: "Plan", path: Union[str, os.PathLike]) -> None:
    """Render the plots and write them to ``path``, whole or not at all (over an existing file)."""
    from .files import write_atomically

    write_atomically(Path(path), render_plots(plan, path), option="--plot")
