"""The least recomputation, or offload, that fits one layout of `plan`'s search: the rungs from
none through selective (by module set, lightest first) to full recomputation on the fewest layers
per stage, and the offloads the engine runs (:mod:`planner.search`'s dominance rules)."""

from __future__ import annotations

import math
from typing import Callable, Iterator, Optional

from cost_models.activations import selective_modules
from cost_models.partition import default_partition
from cost_models.specs import Job, Layout, ModelSpec, SpecError, TrainingSpec
from cost_models.stage_time import stage_time

from .case import Case
from .engines import EngineSupport
from .search_memory import case_job, fits
from .search_options import SearchSpec

# Told of each layout scored that does not fit, with its peak (the search keeps the closest, for advice).
NoteMiss = Callable[[Job, float], None]
# Whether a job fits, and its peak: at the memory band's low end (search_memory.fits), or at its
# upper end for the robust pick's safer layouts (search_memory.fits_at_band_top).
FitTest = Callable[[Job, float], tuple[bool, float]]


def offload_options(spec: SearchSpec, zero: int) -> list[dict]:
    """Offloads to score beyond none, as the engine offers them: the whole optimizer, then
    with it ZeRO-3's parameters (every one adds time, so only the least that fits matters)."""
    engine = spec.engine
    # The whole optimizer, or the share the case's search section pins where the engine offloads a
    # fraction (Megatron-LM's --optimizer-offload-fraction): a pinned 0.5 was never scored.
    pinned = spec.pins.get("offload_optimizer")
    share = pinned if pinned and engine.optimizer_offload == "fraction" else 1.0
    options = []
    if engine.optimizer_offload != "none" and zero in engine.optimizer_offload_zero and not engine.offload_together:
        options.append({"offload_optimizer": share, "offload_params": False})
    if engine.param_offload and zero == 3 and engine.optimizer_offload != "none":
        options.append({"offload_optimizer": share, "offload_params": True})
    return [o for o in options if all(spec.admits(k, v) for k, v in o.items())]


def selective_bundles(model: ModelSpec, training: TrainingSpec, engine: EngineSupport) \
        -> tuple[Optional[tuple[str, ...]], ...]:
    """The module sets selective recomputation is scored with, lightest first, each holding the
    one before (so each frees more and costs more): the modules that free memory for the case
    (None: ``activations.selective_modules``), then, where the engine recomputes by module, those
    with the norms that stand apart (MLA's input norm, MoE layers' pre-MLP norm), then with the
    dense MLPs and MoE layers' whole expert part (``mlp``, ``moe``: the heaviest short of full)."""
    if not engine.recompute_modules:
        return (None,)
    modules = selective_modules(model, training, Layout(recompute="selective"))
    bundles: list[Optional[tuple[str, ...]]] = [None] if modules else []  # nothing frees memory: none's twin
    if (model.attention_type == "mla" or model.is_moe) and not training.delayed_scaling:
        modules += ("layernorm",)
        bundles.append(modules)
    heavy = modules + (("mlp",) if model.num_moe_layers < model.num_layers else ())
    if model.is_moe and not training.moe_comm_overlap:  # megatron-core refuses moe with the overlap
        heavy = tuple(m for m in heavy if m != "moe_act") + ("moe",)
    if heavy != modules:
        bundles.append(heavy)
    return tuple(bundles)


def recompute_ladder(spec: SearchSpec, base: Layout, bundles: tuple = (None,)) -> Iterator[Layout]:
    """Layouts from least to most recomputation that the engine and pins allow, built as needed:
    selective with each of ``bundles`` (:func:`selective_bundles`) in turn."""
    for level in ("none", "selective", "full"):
        if level not in spec.engine.recompute or not spec.admits("recompute", level):
            continue
        if "recompute_num_layers" in spec.pins:
            if level == "full":
                yield base.with_changes(recompute="full", recompute_num_layers=spec.pins["recompute_num_layers"])
            continue
        if level == "selective":
            for modules in bundles:
                yield base.with_changes(recompute="selective", recompute_modules=modules)
            continue
        yield base if level == base.recompute else base.with_changes(recompute=level, recompute_modules=None)


def least_full_recompute(case: Case, spec: SearchSpec, layout: Layout, at_least: int,
                         note_miss: NoteMiss, at_most: Optional[int] = None, fit: FitTest = fits,
                         every_layer: Optional[tuple[Job, float]] = None) -> Optional[tuple[Job, float]]:
    """Full recomputation on the fewest layers per stage (no fewer than ``at_least``, no more
    than ``at_most``) that fits; ``every_layer``: the job recomputing every layer and its peak,
    already found to fit where the engine runs it.

    Memory falls as more layers are recomputed, so the fewest that fit are found by bisection.
    """
    stage_max = max(layout.stage_layers or default_partition(case.model, case.training, layout))

    def job_of(n: int) -> Job:
        rnl = None if n >= stage_max or not spec.engine.partial_recompute else n
        return case_job(case, layout.with_changes(recompute_num_layers=rnl))

    def trial(n: int) -> tuple[Optional[Job], float]:
        job = job_of(n)
        ok, peak = fit(job, spec.headroom)
        if not ok and n >= stage_max and not spec.runner.problems(job):
            # The most recomputation there is: the advice's closest layout, where the engine runs it (a
            # full recomputation --overlap-moe-expert-parallel-comm refuses was named as memory's miss).
            note_miss(job, peak)
        return (job if ok else None), peak

    top = stage_max if at_most is None else min(at_most, stage_max)
    if every_layer is None and spec.runner.problems(job_of(stage_max)):
        # What the engine refuses of full recomputation of every layer (no count to refuse) is the
        # layout's (context parallelism that does not divide the heads, say) or full recomputation's,
        # and holds at any count: the bisection was scored, then refused (GPT-OSS 20B at 2^19 tokens
        # on 8 H100s: 23,381 times).
        return None
    best = every_layer if every_layer is not None and top == stage_max else trial(top)
    if best[0] is None or not spec.engine.partial_recompute:
        return best if best[0] else None
    # With interleaving the count is per model chunk (Megatron's --recompute-num-layers), so
    # the per-stage count moves in steps of vpp.
    step = layout.vpp
    low, high = fewest_recomputed(stage_max, at_least, step) // step, top // step
    while low < high:
        mid = (low + high) // 2
        attempt = trial(mid * step)
        if attempt[0] is not None:
            high, best = mid, attempt
        else:
            low = mid + 1
    return best


def fewest_recomputed(stage_max: int, at_least: int, vpp: int) -> int:
    """The fewest layers a stage may recompute in full: ``at_least`` (capped at the stage), in
    whole steps of vpp, since Megatron's --recompute-num-layers counts per model chunk."""
    return max(1, -(-min(at_least, stage_max) // vpp)) * vpp


def full_layers_faster_than(case: Case, selective: Job, full: Layout, at_least: int) -> int:
    """The most layers a stage can recompute in full and still run faster than ``selective``
    (0 where even the fewest the search tries cannot), on the stage with the most layers: each
    more layer recomputed adds its forward there, so its time grows by one step per layer."""
    partition = full.stage_layers or default_partition(case.model, case.training, full)
    stage_max = max(partition)
    widest = partition.index(stage_max)
    fewest = min(stage_max, fewest_recomputed(stage_max, at_least, full.vpp))

    def widest_stage(layers: int) -> float:
        job = case_job(case, full.with_changes(recompute_num_layers=layers))
        return stage_time(job, widest).total
    target = stage_time(selective, widest).total
    try:
        first = widest_stage(fewest)
        if first >= target:
            return 0
        if fewest + full.vpp > stage_max:
            return stage_max
        per_step = widest_stage(fewest + full.vpp) - first
    except SpecError:
        return stage_max
    if per_step <= 0:
        return stage_max
    return min(stage_max, fewest + full.vpp * math.floor((target - first) / per_step))


def least_recompute(case: Case, spec: SearchSpec, base: Layout, at_least: int,
                    note_miss: NoteMiss, fit: FitTest = fits, after: Optional[Layout] = None) \
        -> tuple[Optional[tuple[Job, float]], int]:
    """The layout with the least recomputation that fits (``fit``: at the memory band's low end by
    default), and how many layouts were scored; with ``after`` (the same layout with some
    recomputation), only heavier rungs than its are tried.

    Selective recomputation on every layer and full recomputation of a few layers are not
    ordered: either can cost less (the first repeats part of every layer, the second all of a
    few). Where selective is the least that fits and the engine recomputes some layers in full,
    full recomputation of the fewest layers that fit takes its place where that is faster."""
    scored = 0
    bundles = (spec.pins["recompute_modules"],) if "recompute_modules" in spec.pins \
        else selective_bundles(case.model, case.training, spec.engine)
    ladder = list(recompute_ladder(spec, base, bundles))
    if after is not None:
        ladder, at_least = _heavier(ladder, after, at_least)
    heaviest = next((r for r in ladder if r.recompute == "full" and r.recompute_num_layers is None), None)
    every_layer = None  # the heaviest rung's job and peak, where it was tried and fits
    for index, layout in enumerate(ladder):
        if index == 2 and heaviest is not None and heaviest is not layout:
            # Past the two lightest rungs: where full recomputation of every layer, which holds the least
            # of any rung (checked over the searches of the examples and of cases that fit on one engine
            # alone: 13,655 ladders), does not fit, no rung between does: their trials are skipped, and
            # it is the closest miss. A search where nothing fits tried every rung of every layout. (Past
            # the lightest alone, the trial was lost on the many layouts the first selective rung fits:
            # Llama 3 70B's example plan 4 % slower.)
            tried = _tried(case, spec, heaviest, fit)
            if tried is not None and not tried[1]:
                note_miss(tried[0], tried[2])
                return None, scored + 1
            if tried is not None:  # it fits: the full rung's own first trial, should the ladder reach it
                every_layer = (tried[0], tried[2])
        try:
            if layout.recompute == "full" and layout.recompute_num_layers is None:
                scored += 1
                hit = least_full_recompute(case, spec, layout, at_least, note_miss, fit=fit,
                                           every_layer=every_layer if layout is heaviest else None)
                if hit is not None and not spec.runner.problems(hit[0]):
                    return hit, scored
                continue
            job = case_job(case, layout)
        except SpecError:
            continue
        if spec.runner.problems(job):  # a rule of the engine's own code (planner/engines/)
            continue
        scored += 1
        ok, peak = fit(job, spec.headroom)
        if ok:
            full = [rung for rung in ladder if rung.recompute == "full" and rung.recompute_num_layers is None]
            at_most = full_layers_faster_than(case, job, full[0], at_least) \
                if layout.recompute == "selective" and full and spec.engine.partial_recompute else 0
            if at_most:
                scored += 1
                hit = least_full_recompute(case, spec, full[0], at_least, note_miss, at_most, fit)
                if hit is not None and not spec.runner.problems(hit[0]):
                    return hit, scored
            return (job, peak), scored
        note_miss(job, peak)
    return None, scored


def _tried(case: Case, spec: SearchSpec, layout: Layout, fit: FitTest) -> Optional[tuple[Job, bool, float]]:
    """(the job, whether it fits, its peak) where ``layout`` is one the engine runs; else None."""
    try:
        job = case_job(case, layout)
    except SpecError:
        return None
    if spec.runner.problems(job):
        return None
    ok, peak = fit(job, spec.headroom)
    return job, ok, peak


def _heavier(ladder: list[Layout], after: Layout, at_least: int) -> tuple[list[Layout], int]:
    """The rungs of ``ladder`` past ``after``'s, and the fewest layers full recomputation may then take.
    Past full recomputation of a few layers: more of them, and selective recomputation, which full
    on a few took the place of where it was faster (``least_recompute``), not where it held more."""
    rank = {"none": 0, "selective": 1, "full": 2}
    if after.recompute == "full":
        selective = [r for r in ladder if r.recompute == "selective"]
        if after.recompute_num_layers is None:
            return selective, at_least
        return selective + [r for r in ladder if r.recompute == "full"], \
            max(at_least, after.recompute_num_layers + after.vpp)
    if after.recompute == "selective":
        same = [i for i, r in enumerate(ladder) if r.recompute == "selective" and r.recompute_modules ==
                after.recompute_modules]
        if same:
            return ladder[same[0] + 1:], at_least
    return [r for r in ladder if rank[r.recompute] > rank[after.recompute]], at_least


def least_activation_offload(case: Case, spec: SearchSpec, layout: Layout, note_miss: NoteMiss,
                             fit: FitTest = fits) -> tuple[Optional[tuple[Job, float]], int]:
    """Activations of the fewest leading layers per stage offloaded, with no recomputation (or the
    recomputation the case's search section pins), that fits (``fit``: at the memory band's low end
    by default; memory falls as more are offloaded: bisection), where the engine runs it."""
    if not spec.engine.activation_offload:
        return None, 0
    recompute = {"recompute": spec.pins.get("recompute", "none"), "recompute_num_layers": None,
                 "recompute_modules": None}
    if recompute["recompute"] == "full":
        recompute["recompute_num_layers"] = spec.pins.get("recompute_num_layers")
    elif recompute["recompute"] == "selective":
        recompute["recompute_modules"] = spec.pins.get("recompute_modules")
    stage_max = max(layout.stage_layers) if layout.stage_layers else case.model.num_layers // layout.pp
    pinned = spec.pins.get("offload_activations")
    scored = 0

    def trial(n: int) -> Optional[tuple[Job, float]]:
        nonlocal scored
        try:
            job = case_job(case, layout.with_changes(**recompute, offload_activations=n))
        except SpecError:
            return None
        if spec.runner.problems(job):
            return None
        scored += 1
        ok, peak = fit(job, spec.headroom)
        if not ok:
            note_miss(job, peak)
        return (job, peak) if ok else None

    if pinned is not None:
        return (trial(pinned) if pinned else None), scored
    high = stage_max
    best = trial(high) or trial(high - 1)  # an engine may keep one layer on the GPU (Megatron)
    if best is None:
        return None, scored
    high = best[0].layout.offload_activations
    low = 1
    while low < high:
        mid = (low + high) // 2
        attempt = trial(mid)
        if attempt is not None:
            high, best = mid, attempt
        else:
            low = mid + 1
    return best, scored
