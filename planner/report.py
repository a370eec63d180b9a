"""Rich tables for the terminal: what `estimate` shows a person."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


from .estimate import Estimate

GB = 1e9


def describe_layout(est: Estimate) -> str:
    lay, job = est.job.layout, est.job
    parts = [f"dp {lay.dp}", f"tp {lay.tp}", f"pp {lay.pp}"]
    if lay.vpp > 1:
        parts.append(f"vpp {lay.vpp}")
    if lay.cp > 1:
        parts.append(f"cp {lay.cp}")
    parts += [f"micro-batch {lay.micro_batch_size} × {job.grad_accum} accumulation",
              f"ZeRO {lay.zero_stage}", f"recompute {lay.recompute}"]
    if lay.sequence_parallel:
        parts.append("sequence parallel")
    return ", ".join(parts)


def print_estimate(est: Estimate, console: Console) -> None:
    job = est.job
    console.print(f"[bold]{job.model.name}[/] on {job.cluster.num_gpus} × {job.cluster.gpu.name}, "
                  f"global batch {job.training.global_batch_size} × {job.training.seq_len} tokens")
    console.print(describe_layout(est))
    table = Table(title=f"Memory per GPU, heaviest stage ({est.peak.stage} of {job.layout.pp})")
    table.add_column("term")
    table.add_column("GB", justify="right")
    table.add_column("share", justify="right")
    total = est.peak.total
    for term, value in est.peak.by_term().items():
        table.add_row(term, f"{value / GB:.2f}", f"{value / total:.0%}")
    table.add_row("[bold]peak[/]", f"[bold]{total / GB:.2f}[/]", "")
    table.add_row("capacity", f"{est.capacity_bytes / GB:.2f}", f"{total / est.capacity_bytes:.0%} used")
    console.print(table)
    time = Table(title="Step time (exposed parts)")
    time.add_column("part")
    time.add_column("s", justify="right")
    time.add_column("share", justify="right")
    for part, seconds in est.time.by_part().items():
        time.add_row(part.removesuffix("_s"), f"{seconds:.3f}", f"{seconds / est.step_time_s:.0%}")
    time.add_row("[bold]step[/]", f"[bold]{est.step_time_s:.3f}[/]", "")
    console.print(time)
    console.print(f"{est.tokens_per_s:,.0f} tokens/s, {est.model_tflops_per_gpu:.0f} model TFLOP/s per GPU, "
                  f"MFU {est.mfu:.1%}")
    if est.fits:
        console.print("[green]fits[/]")
        return
    console.print(f"[red]does not fit[/]: {est.largest_term} is the largest term "
                  f"({est.peak.by_term()[est.largest_term] / GB:.1f} GB)")
    remedy = est.remedy()
    if remedy is not None:
        verdict = "fits" if remedy.fits else "still does not fit"
        console.print(f"cheapest next change: {remedy.description} → peak {remedy.peak_bytes / GB:.1f} GB, {verdict}")
