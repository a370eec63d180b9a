"""What `size` prints: the answer and the next best; with neither a deadline nor a budget, the
front of days against spend with its knee marked; and, when nothing within the limits meets the
target (exit 3), the status, why, the fastest cluster within the limits and what would meet it.
The fields are the `Sizing`'s, as `size --json` gives them."""

from __future__ import annotations

from typing import Optional

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .bands import NO_BAND, indistinguishable_gap
from .report import _layout_summary, count_text
from .size import OBJECTIVE_TEXT, OK, SECONDS_PER_DAY, SizeChoice, Sizing
from .size_front import DOUBLING_SAVES, FRONT_SPAN
from .units import duration_text, figure_text as _figure




def _cluster(choice: SizeChoice) -> str:
    option = choice.option
    units = choice.gpus // option.unit
    part = f", {option.per_unit_text}: plan it with cluster.nvlink_domain {option.unit}" if option.rack else ""
    return f"{choice.gpus:,} × {option.gpu.name} ({units:,} {option.unit_name}{'s' * (units > 1)}{part})"


def _kind(choice: SizeChoice, keyed: bool) -> str:
    """The type as a table row names it: with its entry's key where two entries share the GPU
    (reserved, on demand), and the racks' share where the run uses part of each."""
    kind = f"{choice.option.gpu.name} ({choice.option.key})" if keyed else choice.option.gpu.name
    return f"{kind}, {choice.option.per_unit_text}" if choice.option.rack else kind


def _takes(choice: SizeChoice) -> str:
    cost = f", cost {_figure(choice.cost)}" if choice.cost is not None else ""
    return (f"{choice.tokens_per_s:,.0f} tokens/s (step {choice.step_time_s:.3f} s, MFU {choice.estimate.mfu:.1%}), "
            f"{_figure(choice.days, 1)} days, {_figure(choice.gpu_hours)} GPU-hours{cost}")


def _band(choice: SizeChoice) -> str:
    """The tokens/s band carried to the days and the spend, as `plan` words its tokens/s band."""
    band = choice.estimate.throughput_band
    days, hours, cost = choice.days_band, choice.gpu_hours_band, choice.cost_band
    if band is None or days is None or hours is None:
        return f"no 80% band: {NO_BAND}"
    costs = f", cost {_figure(cost[0])}–{_figure(cost[1])}" if cost is not None else ""
    return (f"80% band {_figure(days[0], 1)}–{_figure(days[1], 1)} days, {_figure(hours[0])}–{_figure(hours[1])} "
            f"GPU-hours{costs} ({band.text()})")


def _print_choice(console: Console, choice: SizeChoice, label: str = "",
                  deadline_s: Optional[float] = None) -> None:
    console.print(f"{label}[bold]{escape(_cluster(choice))}[/], {escape(choice.engine)}: "
                  + escape(_layout_summary(choice.estimate.to_dict()["layout"])))
    console.print(escape(_takes(choice)))
    console.print(escape(_band(choice)))
    slow = None if choice.days_band is None else choice.days_band[1]
    if deadline_s is not None and slow is not None and slow * SECONDS_PER_DAY > deadline_s:
        # The deadline is met by the prediction; the band says how far a measured run may fall short of it.
        console.print(f"[yellow]deadline at risk[/]: at its band's slow end this run takes {_figure(slow, 1)} days, "
                      f"past {escape(duration_text(deadline_s))}")
    est, memory = choice.estimate, choice.estimate.memory_band
    if est.memory_verdict == "at risk" and memory is not None:  # a band straddles: never on CPUs
        # `size` times a cluster by its fastest layout, where `plan`'s robust pick takes one surer to fit.
        where = "within" if est.peak.total <= est.usable_bytes else "over"
        console.print(f"[yellow]at risk[/]: this layout's predicted peak, {est.peak.total / 1e9:.1f} GB, is {where} the "
                      f"{est.usable_bytes / 1e9:.1f} GB usable and its memory band's upper end over it "
                      f"({escape(memory.text('peaks'))}); `plan` on this "
                      f"cluster may pick a layout surer to fit, slower by up to {indistinguishable_gap():.1%}")


def _spend_text(sizing: Sizing) -> str:
    return "cost" if sizing.spend == "cost" else "GPU-hours"


def print_sizing(sizing: Sizing, console: Console, top_k: Optional[int] = None) -> None:
    if sizing.status != OK:
        print_unmet(sizing, console)
        return
    best = sizing.picked("print_sizing")
    job = best.estimate.job
    deadline = f" within {duration_text(sizing.deadline_s)}" if sizing.deadline_s is not None else ""
    what = (f"days against {_spend_text(sizing)} (no deadline or budget), the knee marked" if sizing.front
            else OBJECTIVE_TEXT[sizing.objective])
    console.print(f"[bold]{escape(job.model.name)}[/] on {count_text(sizing.tokens)} tokens{deadline}, global batch "
                  f"{job.training.global_batch_size} × {job.training.seq_len}: {what}")
    if sizing.front:
        print_front(sizing, console)
    else:
        _print_choice(console, best, deadline_s=sizing.deadline_s)
        if sizing.alternatives:
            # The cost's words only where some answer has a price (its column is "-" where none has).
            priced = any(c.cost is not None for c in (best, *sizing.alternatives))
            table = Table(title="Next best", caption="trades: each against the answer above (its type named where it "
                                                     "differs)" + ("; cost: GPU-hours × gpu_hour_cost, in its currency"
                                                                   if priced else ""))
            # Entries of one GPU type at two prices (reserved, on demand) are told apart by their key.
            keys: dict[str, set] = {}
            for c in (best, *sizing.alternatives):
                keys.setdefault(c.option.gpu.name, set()).add(c.option.key)
            rows = [[str(i), f"{alt.gpus:,}", escape(_kind(alt, len(keys[alt.option.gpu.name]) > 1)),
                     _figure(alt.days, 1), _figure(alt.gpu_hours), "-" if alt.cost is None else _figure(alt.cost),
                     escape(best.trade_text(alt))] for i, alt in enumerate(sizing.alternatives, 1)]
            for k, column in enumerate(("#", "GPUs", "type", "days", "GPU-hours", "cost", "trades")):
                # The figures whole at any width (piped, the console is 80 columns); the words fold.
                text = column in ("type", "trades")
                table.add_column(column, justify="left" if text else "right", overflow="fold",
                                 min_width=None if text else max(len(row[k]) for row in rows))
            for row in rows:
                table.add_row(*row)
            console.print(table)
        elif sizing.deadline_s is not None and top_k != 0 and sizing.beaten_meeting:  # --top 0 asked for none
            # Sizes more GPUs for more days at no saving are left out of the list, not said not to exist.
            n = sizing.beaten_meeting
            console.print(f"{n:,} other size{'s' * (n > 1)} within the limits meet{'s' * (n == 1)} "
                          f"{duration_text(sizing.deadline_s)}, each beaten by one of its GPU type on GPUs, days and "
                          f"spend at once: none is listed.", markup=False)
        elif sizing.deadline_s is not None and top_k != 0:  # --top 0 asked for none: others may meet it
            console.print(f"No other size within the limits meets {duration_text(sizing.deadline_s)}.", markup=False)
    console.print(f"solver: {sizing.solver_status} over {sizing.rows} layout{'s' * (sizing.rows != 1)} on "
                  f"{sizing.sizes_searched} of "
                  f"{sizing.sizes:,} cluster sizes ({sizing.layouts_scored:,} layouts scored)")


def print_front(sizing: Sizing, console: Console) -> None:
    """The front, the cheapest first, each row against the one above; the knee marked and spelled out."""
    spend = _spend_text(sizing)
    priced = any(point.cost is not None for point in sizing.front)
    table = Table(title=f"Days against {spend}: the front", caption=f"× days, × {spend}: against the row above",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    columns = ["", "GPUs", "type", "days", "GPU-hours", *(["cost"] if priced else []), "× days", f"× {spend}"]
    rows = []
    for i, point in enumerate(sizing.front):
        before = sizing.front[i - 1] if i else None
        ratio = before.trade(point) if before else None
        rows.append(["knee" if point is sizing.knee else "", f"{point.gpus:,}", escape(_kind(point, False)),
                     _figure(point.days, 1), _figure(point.gpu_hours),
                     *([_figure(point.cost) if point.cost is not None else "-"] if priced else []),
                     f"{ratio['days']:.2f}" if ratio else "",
                     f"{ratio['cost' if sizing.spend == 'cost' else 'gpu_hours']:.2f}" if ratio else ""])
    for k, column in enumerate(columns):  # the figures whole; a long type name folds
        widest = max(len(row[k]) for row in rows)
        table.add_column(column, justify="left" if column in ("", "type") else "right",
                         overflow="fold",
                         min_width=None if column == "type" else widest)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    knee, spend_bound = sizing.knee, sizing.spend_bound
    if knee is None or spend_bound is None:  # size_case gives a front both
        raise ValueError("a front without its knee or its work bound")
    _print_choice(console, knee, "knee: ")
    console.print(f"The knee: the front's least days × {spend}, where 1% more {spend} stops buying 1% fewer days "
                  f"(doubling one type's GPUs pays when it cuts the days by more than {DOUBLING_SAVES:.1%}).",
                  markup=False)
    if knee is sizing.front[-1] and sizing.knee_limit is not None and knee.gpus < sizing.knee_limit:
        # Short of the limit, the larger sizes considered ran no faster (else they would be on the front).
        limit = knee.option.paid_gpus(sizing.knee_limit)  # as the case counts them: whole racks
        console.print(f"The knee is the front's fastest size, short of the limit of {limit:,} {knee.option.gpu.name} "
                      f"GPUs: the limit does not bind, no larger size considered within it runs faster.", markup=False)
    elif knee is sizing.front[-1]:
        console.print("The knee is the front's fastest size: the limit binds, and more GPUs may still pay "
                      "(the case's num_gpus, nodes, max_gpus or max_nodes).", markup=False)
    bound = f"{_figure(spend_bound)} {'in cost' if sizing.spend == 'cost' else 'GPU-hours'}"
    console.print(f"The front lists sizes up to {FRONT_SPAN:g}× the knee's days; no size of any type spends less "
                  f"than {bound} (the work bound).", markup=False)


def print_unmet(sizing: Sizing, console: Console) -> None:
    """Exit 3: the status, why, the fastest cluster within the limits and what would meet the target."""
    console.print(f"[red]{escape(sizing.status)}: {escape(sizing.no_fit or 'no cluster within the limits')}[/]")
    if sizing.fastest is not None:
        _print_choice(console, sizing.fastest, "fastest within the limits: ")
    if sizing.would_meet is not None:
        target = "would meet the deadline: " if sizing.deadline_s is not None else "would fit: "
        _print_choice(console, sizing.would_meet, target, sizing.deadline_s)
