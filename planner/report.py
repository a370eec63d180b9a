"""Rich tables for the terminal: what `estimate` shows a person."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cost_models.activations import selective_modules
from cost_models.topology import domains_spanned

from .bands import NO_BAND, NO_GAP, indistinguishable_gap
from .case import LAYOUT_UNSET_TEXT
from .engines import ENGINES
from .errors import one_line
from .units import figure_text
from .estimate import Estimate, change_takes

GB = 1e9


def count(n: float) -> str:
    """A parameter count as model cards write it: 125M, 8.0B, 1.2T."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:,.1f}{unit}"
    return f"{n:,.0f}"


def describe_layout(est: Estimate) -> str:
    lay, job = est.job.layout, est.job
    parts = [f"dp {lay.dp}", f"tp {lay.tp}", f"pp {lay.pp}"]
    if lay.pp > 1 and len(set(job.stage_layers)) > 1:  # an uneven split, as the search or a launch gives it
        parts[-1] += f" (layers per stage {value_text('stage_layers', list(job.stage_layers))})"
    if lay.vpp > 1:
        parts.append(f"vpp {lay.vpp}")
    if lay.cp > 1:
        parts.append(f"cp {lay.cp}")
    if job.model.is_moe:
        parts.append(f"ep {lay.ep}, etp {lay.expert_tp} (expert data parallel {lay.edp})")
    recompute = f"recompute {lay.recompute}"
    if lay.recompute == "full" and lay.recompute_num_layers is not None \
            and lay.recompute_num_layers < max(job.stage_layers):  # a few layers, not all: said (it read as all)
        recompute += f" ({lay.recompute_num_layers} of a stage's {max(job.stage_layers)} layers)"
    if lay.recompute == "selective" and job.training.engine.selective == "attention":  # by module
        modules = selective_modules(job.model, job.training, lay)
        recompute += f" ({', '.join(modules)})" if modules else " (nothing that frees memory)"
    parts += [f"micro-batch {lay.micro_batch_size} × {job.grad_accum} accumulation",
              f"ZeRO {lay.zero_stage}", recompute]
    if lay.sequence_parallel:
        parts.append("sequence parallel")
    if job.training.fp8_param_gather:  # the case's, or its engine's default at this layout
        parts.append(f"weights kept in {job.training.precision}")
    if not job.training.master_weights:
        parts.append("bf16 master weights" if job.training.engine.bf16_master_partition
                     else "no master weights (pure bf16)")
    if job.training.optimizer_moments != "fp32":
        parts.append(f"Adam's moments in {job.training.optimizer_moments}")
    if job.training.master_remainders:  # the case's, or its engine's at this layout
        parts.append("fp32 master kept as remainders of the bf16 weights")
    if lay.offload_optimizer:
        parts.append("optimizer offloaded" if lay.offload_optimizer == 1
                     else f"{lay.offload_optimizer:.0%} of the optimizer offloaded")
    if lay.offload_params:
        parts.append("parameters offloaded")
    if lay.offload_activations:
        parts.append(f"activations of {lay.offload_activations} layers offloaded")
    return ", ".join(parts)


def describe_domains(est: Estimate) -> str:
    """Which parallel groups stay inside one NVLink domain (a node, or an NVL72 rack) and which
    leave it for the scale-out fabric (``topology.domains_spanned``)."""
    job = est.job
    spans = domains_spanned(job.cluster, job.layout)
    size = job.cluster.gpu.nvlink_domain
    leaving = [f"{dim} ({n} domains)" for dim, n in spans.items() if n > 1]
    return f"NVLink domain of {size} GPUs; " + (
        "groups leaving it: " + ", ".join(leaving) if leaving else "every group stays inside it")


def step_copy_share(est: Estimate) -> float:
    """What the optimizer step's gradient copies add to the peak stage's ``other``, beyond the
    activations they follow (``memory.step_gradient_copy_bytes``, as ``stage_memories`` adds it)."""
    from cost_models.memory import step_gradient_copy_bytes

    held = (1 + est.job.overheads.fragmentation) * est.peak.activations
    return max(0.0, step_gradient_copy_bytes(est.job, est.peak.stage) - held)


def engine_title(name: str) -> str:
    """The engine as a person names it ("Megatron-LM" for ``megatron``, "plain PyTorch" for ``any``)."""
    engine = ENGINES.get(name)
    return engine.title if engine is not None and engine.title else name


def print_estimate(est: Estimate, console: Console) -> None:
    job = est.job
    model = est.to_dict()["model"]
    size = f"{count(model['parameters'])} parameters" + (
        f", {count(model['active_parameters'])} active" if job.model.is_moe else "") + (
        f", with {job.model.mtp_layers} multi-token prediction layer{'s' * (job.model.mtp_layers > 1)}"
        if job.model.mtp_layers else "")
    console.print(f"[bold]{escape(job.model.name)}[/] ({size}) on {job.cluster.num_gpus} × "
                  f"{escape(job.cluster.gpu.name)}, global batch {job.training.global_batch_size} × "
                  f"{job.training.seq_len} tokens, as {escape(engine_title(job.training.engine.name))} runs it")
    console.print(describe_layout(est), markup=False)
    console.print(describe_domains(est), markup=False)
    table = Table(title=f"Memory per GPU, heaviest stage ({est.peak.stage} of {job.layout.pp})")
    table.add_column("term")
    table.add_column("GB", justify="right")
    table.add_column("share", justify="right")
    total = est.peak.total
    for term, value in est.peak.by_term().items():
        table.add_row(term, f"{value / GB:.2f}", f"{value / total:.0%}")
    table.add_row("[bold]peak[/]", f"[bold]{total / GB:.2f}[/]", "")
    # The peak is what PyTorch's allocator reports; the CUDA context and NCCL's buffers sit beside it on a GPU,
    # the process itself on a CPU.
    name, outside = est.outside_allocator
    table.add_row(f"outside the allocator ({name})", f"{outside / GB:.2f}", "")
    # GB are 10^9 bytes throughout; a GPU's memory is sold in GiB (an 80 GB H100 holds 85.9 GB).
    table.add_row(f"capacity ({est.capacity_bytes / 2**30:.3g} GiB)", f"{est.capacity_bytes / GB:.2f}",
                  f"{(total + outside) / est.capacity_bytes:.0%} used")
    # What the verdict holds the peak to: the capacity less the headroom and what lives outside the allocator.
    table.add_row("usable by the peak", f"{est.usable_bytes / GB:.2f}", f"{total / est.usable_bytes:.0%} of it")
    if job.layout.offloads:
        host = job.cluster.gpu.offload_host().memory_bytes
        table.add_row("host (offload)", f"{est.host_bytes / GB:.2f}", f"{est.host_bytes / host:.0%} of "
                                                                        f"{host / GB:.0f} GB a GPU used")
    console.print(table)
    step_copies = step_copy_share(est)
    if step_copies:
        console.print(f"note: other holds {step_copies / GB:.2f} GB of the optimizer step's gradient copies, past "
                      "the activations the step follows (they are freed by then): fewer activations do not lower "
                      "the peak below them", markup=False)
    time = Table(title="Step time (exposed parts)")
    time.add_column("part")
    time.add_column("s", justify="right")
    time.add_column("share", justify="right")
    for part, seconds in est.time.by_part().items():
        time.add_row(part.removesuffix("_s"), f"{seconds:.3f}", f"{seconds / est.step_time_s:.0%}")
    time.add_row("[bold]step[/]", f"[bold]{est.step_time_s:.3f}[/]", "")
    console.print(time)
    for line in est.outside_fitted_runs:
        console.print(f"note: {line}", markup=False)
    band, spread = est.throughput_band, est.tokens_per_s_band
    said = f"no 80% band: {NO_BAND}" if band is None or spread is None else \
        f"80% band {spread[0]:,.0f}–{spread[1]:,.0f}; {band.text()}"
    console.print(f"{est.tokens_per_s:,.0f} tokens/s ({said}), {_tflops(est.model_tflops_per_gpu)} model TFLOP/s per GPU, "
                  f"MFU {est.mfu:.1%}" + (f" ({est.mfu_bf16:.1%} of the bf16 peak)"
                                          if est.job.training.precision == "fp8" and est.mfu_bf16 else ""),
                  markup=False)
    memory = est.memory_band
    spread = (f"peak {est.peak.total / GB:.1f} GB of {est.usable_bytes / GB:.1f} GB usable, no 80% band" if memory is None
              else f"peak {est.peak.total / GB:.1f} GB, 80% band {est.peak.total * memory.low / GB:.1f}–"
              f"{est.peak.total * memory.high / GB:.1f} GB of {est.usable_bytes / GB:.1f} GB usable; "
              # whose peaks: most engines' band is all runs' (only nanotron's class publishes peaks)
              f"{memory.text('peaks')}")
    if est.memory_verdict == "fits":
        console.print(f"[green]fits[/] ({escape(spread)})")
        return
    if est.memory_verdict == "at risk":
        # Between the band's low end and its upper end the usable memory lies: the prediction
        # itself may be over it (a peak of 86.9 GB of 84.0 usable), fitting only at the low end.
        where = "fits as predicted" if est.peak.total <= est.usable_bytes else \
            "over the usable memory as predicted, within it at the band's low end"
        console.print(f"[yellow]at risk[/]: {where}, not at the band's upper end ({escape(spread)})")
        return
    if est.overflows == "host":
        host = est.job.cluster.gpu.offload_host().memory_bytes
        console.print(f"[red]does not fit[/]: the host: the offload takes {est.host_bytes / GB:.1f} GB a GPU of its "
                      f"{host / GB:.0f} GB share of host memory (the GPU holds its {est.peak.total / GB:.1f} GB peak)")
    else:
        console.print(f"[red]does not fit[/]: {est.largest_term} is the largest term "
                      f"({est.peak.by_term()[est.largest_term] / GB:.1f} GB)")
    remedy = est.remedy()
    if remedy is None and est.overflows == "host":
        console.print("no change of the offload fits it at this layout: more GPUs each hold less of the model "
                      "(`plan` on more GPUs, or `size`)", markup=False)
    if remedy is None and est.overflows == "gpu":
        # Every change the ladder tries is at its limit here or one the engine cannot run at this layout
        # (Llama 3.1 405B on eight A100s under DeepSpeed, micro-batch 1, full recomputation, ZeRO-3 with
        # everything offloaded: AutoTP and the pipeline refuse ZeRO-3): the report ended at "does not
        # fit", with no way on.
        experts = ", more expert parallelism" if est.job.model.is_moe else ""
        console.print(f"no change tried (a smaller micro-batch, more recomputation, a higher ZeRO stage, more "
                      f"tensor or pipeline parallelism, offload{experts}) can be made to this "
                      f"layout as {engine_title(est.job.training.engine.name)} runs it; `plan` searches every "
                      f"layout of these GPUs and, where none fits, says how many GPUs would", markup=False)
    if remedy is not None:
        # In the words the estimate of the changed layout says it (a peak over the usable memory that
        # fits only at the band's low end is "at risk", not "fits").
        verdict = {"does not fit": "still does not fit"}.get(remedy.verdict, remedy.verdict)
        if remedy.verdict == "does not fit" and remedy.peak_bytes <= est.usable_bytes:
            # Its GPU peak fits: what overflows is the host, which the offload's share of it cannot hold.
            verdict += ": its offload overflows the host's memory"
        step = "" if remedy.step_time_s is None else \
            f", step {remedy.step_time_s:.3f} s ({remedy.step_time_s / est.step_time_s - 1:+.1%})"
        takes = "".join(f" ({key}: {text})" for key, text in change_takes(est.job, remedy.layout).items())
        if remedy.together:
            head = f"no single change fits; the fewest that fit together ({len(remedy.together)})"
        elif not remedy.fits:
            from .estimate import MAX_CHANGES_TOGETHER

            head = ("no change tried fits, alone or up to " f"{MAX_CHANGES_TOGETHER} together; the closest"
                    if est.overflows != "host" else "no change of the offload fits; the closest")
        else:
            head = "cheapest next change"
        console.print(f"{head}: {remedy.description}{takes} → peak {remedy.peak_bytes / GB:.1f} GB, "
                      f"{verdict}{step}", markup=False)


def value_text(key: str, value: Any) -> str:
    """A layout value for a table: None as what it means, a stage list with repeats folded
    (``5, 6×10, 5``), booleans as on/off."""
    if value is None:
        return LAYOUT_UNSET_TEXT.get(key, "-")
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        runs: list[list] = []
        for item in value:
            if runs and runs[-1][0] == item:
                runs[-1][1] += 1
            else:
                runs.append([item, 1])
        text = ", ".join(f"{item}×{count}" if count > 1 else str(item) for item, count in runs)
        return text if len(text) <= 40 else text[:37] + "..."
    return str(value)


def _layout_summary(layout: dict) -> str:
    keys = ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch_size", "zero_stage", "sequence_parallel", "recompute",
            "recompute_num_layers", "recompute_modules", "stage_layers", "offload_optimizer", "offload_params",
            "offload_activations")
    short = {"micro_batch_size": "mbs", "zero_stage": "zero", "sequence_parallel": "sp",
             "recompute_num_layers": "recompute layers", "recompute_modules": "modules", "stage_layers": "stages",
             "offload_optimizer": "offload optimizer", "offload_params": "offload params",
             "offload_activations": "offload activations"}
    return " ".join(f"{short.get(k, k)}={value_text(k, layout[k])}" for k in keys if k in layout)


def _changes(diff: dict) -> str:
    return ", ".join(f"{k} {value_text(k, a)}→{value_text(k, b)}" for k, (a, b) in diff.items())


def _tflops(value: float) -> str:
    """TFLOP/s as a person reads it: whole above 100, three figures below (a CPU's 0.12 printed as 0)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _print_surer(plan, console: Console) -> None:
    """After the "at risk" line of a pick whose predicted peak is over the usable memory: the fastest
    layout scored that fits as predicted and the fastest that fits at its band's upper end, with what
    each costs (`Plan.fits_as_predicted`, `Plan.fits_at_band_upper`); one line where they are one layout."""
    best, named = plan.best, [(plan.fits_as_predicted, "whose predicted peak fits"),
                              (plan.fits_at_band_upper, "that fits at its memory band's upper end")]
    if plan.fits_as_predicted is not None and plan.fits_at_band_upper is not None \
            and plan.fits_as_predicted.job.layout == plan.fits_at_band_upper.job.layout:
        named = [(plan.fits_as_predicted, "whose predicted peak fits, and at its memory band's upper end")]
    from .plan import _told_apart

    said_margin = False
    for est, what in named:
        if est is None:
            continue
        cost = est.step_time_s / best.step_time_s - 1
        # Beside the margin, to the decimals that tell them apart: "+7.9%" beyond a 7.9 % margin read as within.
        shown, margin = _told_apart(cost, plan.margin)
        beyond = "" if said_margin or not plan.margin else f"; the pick weighs layouts within {margin} of the fastest"
        said_margin = True
        console.print(f"the fastest layout scored {what}: {_changes(plan.differences(est))}, peak "
                      f"{est.peak.total / GB:.1f} GB, step {figure_text(est.step_time_s, 3)} s "
                      f"({'+' if cost >= 0 else ''}{shown} against the pick{beyond}), {est.tokens_per_s:,.0f} tokens/s",
                      markup=False)


def print_plan(plan, console: Console) -> None:
    """The best layout, its runners-up and why the first of them lost; or why nothing fits."""
    if plan.best is None:
        console.print(f"[red]{escape(plan.no_fit.describe())}[/]")
        return
    best = plan.best
    print_estimate(best, console)
    _print_surer(plan, console)
    if plan.days is not None:  # `size`'s figure, for this layout on these GPUs
        spread = "no 80% band" if plan.days_band is None else \
            f"80% band {figure_text(plan.days_band[0], 1)}–{figure_text(plan.days_band[1], 1)}"
        console.print(f"{count_text(plan.tokens)} tokens: {figure_text(plan.days, 1)} days ({spread}) "
                      f"at {best.tokens_per_s:,.0f} tokens/s", markup=False)
    console.print(f"solver: {plan.status} over {plan.fitting} fitting layouts ({plan.scored} scored)")
    if plan.engines:
        parts = [f"{name} {p.best.tokens_per_s:,.0f} tokens/s ({p.best.memory_verdict}{'; ' + why if why else ''})"
                 if p is not None
                 and p.best is not None else f"{name}: {why or 'nothing fits'}" for name, p, why in plan.engines]
        console.print(f"engines (the case names none, or any: each that can run it was planned; --engine any plans "
                      f"plain PyTorch alone): {'; '.join(parts)}; picked {best.job.training.engine.name}", markup=False)
    if plan.margin_set_by == "no_band":  # CPUs: the GPU sweeps' gap is not theirs (bands.pick_margin)
        console.print(f"pick: {NO_GAP} (the {indistinguishable_gap():.1%} gap of the published GPU sweeps is not "
                      "applied; --simplest-within PCT sets a margin by hand)", markup=False)
    if plan.fastest is not None:
        from .search_memory import fit_tier

        fastest = plan.fastest
        within = (f"within --simplest-within ({plan.margin:.1%})" if plan.margin_set_by == "simplest_within" else
                  "as fast as the fastest (no margin on CPUs)" if plan.margin_set_by == "no_band" else
                  f"within {plan.margin:.1%} of the fastest, which the model cannot tell apart (published sweeps: "
                  f"planner/published/bands.yaml)")
        tiers = [fit_tier(e.job, e.peak.total, plan.headroom) for e in (best, fastest)]
        if plan.picked_on == "fit":  # the memory band decided, not the layouts' complexity
            from .plan import FIT_TIER_TEXT

            head = (f"picked as surer to fit: of the layouts {within}, it {FIT_TIER_TEXT[tiers[0]]}, where the "
                    f"fastest {FIT_TIER_TEXT[tiers[1]]}")
        else:
            head = (f"picked on simplicity: the simplest of the layouts {within}, as sure to fit as the fastest "
                    f"(the surest first: at the upper end of their memory band, else as predicted)")
        console.print(f"{head}; the fastest ({_changes(plan.differences(fastest))}) would "
                      f"be {fastest.tokens_per_s:,.0f} tokens/s ({fastest.tokens_per_s / best.tokens_per_s - 1:+.1%}); "
                      f"--fastest returns it", markup=False)
    if not plan.alternatives:
        return
    table = Table(title="Alternatives")
    rows = [(best, {})] + [(alt, plan.differences(alt)) for alt in plan.alternatives]
    cells = [("pick" if i == 0 else str(i), f"{est.step_time_s:.3f}", f"{est.tokens_per_s:,.0f}", f"{est.mfu:.1%}",
              f"{est.peak.total / GB:.1f}", est.memory_verdict,
              escape(_layout_summary(est.to_dict()["layout"]) if i == 0 else _changes(diff)))
             for i, (est, diff) in enumerate(rows)]
    # memory: each row's verdict (an alternative may fit only at its memory band's low end: at risk)
    for k, column in enumerate(("#", "step s", "tokens/s", "MFU", "peak GB", "memory", "differs from the pick")):
        # On a narrow terminal the figures keep their width and the changes fold: "117,0…" hid a
        # figure, "micro_batch_si…" a change.
        text = column == "differs from the pick"
        table.add_column(column, justify="left" if column in ("memory", "differs from the pick") else "right",
                         overflow="fold", no_wrap=not text,
                         min_width=None if text else max(len(row[k]) for row in cells))
    for row in cells:
        table.add_row(*row)
    console.print(table)
    console.print(f"runner-up: {plan.why_runner_up_lost()}", markup=False)


def print_diagnosis(diagnosis, console: Console) -> None:
    """The config's own estimate, then how far the planner's best would take it; last, how a launch
    script was read (its notes: the branches taken on what it does not set)."""
    console.print(f"[bold]{diagnosis.engine} config[/]")
    for line in diagnosis.resolved:
        how = "resolved as the Hugging Face Trainer would" if "auto ->" in line else "read as DeepSpeed reads it"
        console.print(f"{how}: {line}", markup=False)
    print_estimate(diagnosis.estimate, console)
    best = diagnosis.plan.best
    if best is None:
        console.print(f"[red]{escape(diagnosis.plan.no_fit.describe())}[/]")
    else:
        console.print(f"planner's best for {diagnosis.engine}: {_layout_summary(best.to_dict()['layout'])}",
                      markup=False)
        console.print(f"predicted step {best.step_time_s:.3f} s against {diagnosis.estimate.step_time_s:.3f} s: "
                      f"[bold]{diagnosis.speedup:.2f}×[/] speedup: {escape(diagnosis.verdict)}")
        changes = diagnosis.differences()
        if changes:
            # Where the config has no key for a change, what it takes, beside it.
            takes = diagnosis.takes()
            # "change:" where the verdict advises it; else what differs, which no gain asks for.
            label = "change" if diagnosis.change_advised else "differs from the planner's best"
            console.print(f"{label}: " + ", ".join(f"{k} {value_text(k, b)}→{value_text(k, a)}"
                                                 + (f" ({takes[k]})" if k in takes else "")
                                                 for k, (a, b) in changes.items()), markup=False)
        if diagnosis.planned_with:
            console.print(f"planned, as the arguments train where the case leaves it to the engine (so `plan` on the "
                          f"case alone may pick otherwise): {diagnosis.planned_with}", markup=False)
    for note in diagnosis.notes:
        console.print(f"note: {one_line(note, 1000)}", markup=False)


def count_text(value: float) -> str:
    """A count with the suffix `size --tokens` takes: 15T, 300B, 2.5M."""
    if value >= 1e15:  # past the largest suffix: 1e+25, not 1e+13T
        return f"{value:.4g}"
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.4g}{suffix}"
    return f"{value:.4g}"
