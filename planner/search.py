"""The search space of `plan`: every layout worth scoring, with its memory and step time.

Layouts are enumerated structurally (tp, cp, pp, dp, pipeline partition, vpp) and then per
micro-batch, ZeRO stage, sequence parallelism and recomputation. Three dominance rules of
the cost model keep the table small without losing its optimum (the brute-force
enumerator in the tests checks this):

- With tensor parallelism, sequence parallelism always saves memory and moves the same
  collective volume (norms and dropout run on 1/t of the tokens); it costs no time unless
  the engine pays per collective call (a host cost, or a floor in pipelines across nodes:
  ``EngineBehaviour.costs_per_collective``; twice the calls: all-gather and reduce-scatter
  for each all-reduce). Where the engine offers the choice and pays no such cost, only
  ``sequence_parallel: true`` is scored.
- Recomputation only adds time, so for every other choice only the least recomputation
  that fits is scored: none, else selective at the lightest module set that fits (the sets
  are nested: :func:`selective_bundles`), or, where faster, full on the fewest layers per
  stage that fit (selective on every layer and full on a few are not ordered), else full on
  the fewest.
- Memory grows with the micro-batch, so once nothing fits at a micro-batch size, larger
  ones are skipped.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator, Optional

from cost_models.activations import selective_modules
from cost_models.memory import peak_candidates, peak_stage_memory, stage_memories
from cost_models.partition import balanced_partition, default_partition, layer_and_head_cost, virtual_partition
from cost_models.experts import dispatch_combine_time
from cost_models.specs import Job, Layout, ModelSpec, SpecError, TrainingSpec, moe_layers_per_stage
from cost_models.step_time import (StepTime, layer_time_bound, moe_layer_time_for, pipeline, stage_time, step_time,
                                   tp_exposed_per_layer)

from .case import Case
from .engines import EngineSupport
from .search_options import SearchSpec

# Unless the case bounds cp itself, every context-parallel rank keeps at least this many
# tokens: below it the ring's per-step latency and the flash-attention tiles (128 × 128)
# leave a rank's chunk too small to pay for the exchange; NeMo's long-context recipes
# keep 4k–16k tokens per rank.
MIN_TOKENS_PER_CP_RANK = 1024
# Model chunks per pipeline rank the search tries where the layers do not divide by pp
# (DeepSeek-V3's 61 layers): the unequal chunks an engine with a pipeline layout runs.
UNEVEN_VPP = (2, 4)

@dataclass(frozen=True)
class Candidate:
    """One scored layout that fits, with the job and step time the search computed for it
    (`plan` reports its winners from these rather than timing them again)."""

    layout: Layout
    step_time_s: float
    peak_bytes: float
    job: Optional[Job] = None
    time: Optional[StepTime] = None


@dataclass
class SearchResult:
    candidates: list[Candidate]
    scored: int  # layouts whose memory was evaluated
    tightest: Optional[Job] = None  # the non-fitting layout closest to fitting, for advice
    pruned: int = 0  # layouts skipped because they could not be fast enough to matter


@lru_cache(maxsize=65536)  # `size` searches thousands of cluster sizes that share divisors
def divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


def partitions(layers: int, pp: int) -> list[Optional[tuple[int, ...]]]:
    """Pipeline partitions to score: an even split where layers divide, and one that
    lightens the edge stages, which also hold the embedding and the LM head
    (Megatron-DeepSpeed ``type:transformer|embedding``; Megatron's
    ``--decoder-first/last-pipeline-num-layers`` when the middle stages are equal, else
    ``--pipeline-model-parallel-layout``)."""
    if pp == 1:
        return [None]
    if layers < pp:
        return []
    options: list[Optional[tuple[int, ...]]] = []
    if layers % pp == 0:
        options.append(None)
    base, extra = divmod(layers, pp)
    counts = [base] * pp
    if extra == 0 and base > 1 and pp > 2:
        counts[0] -= 1  # move one layer from each edge to the middle stages
        counts[-1] -= 1
        extra = 2
    if extra:
        order = list(range(1, pp - 1)) + [0, pp - 1]  # middle stages take the remainder first
        while extra:
            for i in order:
                if extra == 0:
                    break
                counts[i] += 1
                extra -= 1
        options.append(tuple(counts))
    return options


def _vpp_options(partition: tuple[int, ...], engine: EngineSupport) -> list[int]:
    if len(partition) == 1 or not engine.interleaving or min(partition) == 0:
        return [1]
    smallest = min(partition)
    return [v for v in divisors(smallest) if all(n % v == 0 for n in partition)]


def fits(job: Job, headroom: float) -> tuple[bool, float]:
    from .estimate import fit_limit, host_fits

    peak = peak_stage_memory(job).total
    return peak <= fit_limit(job, headroom) and host_fits(job, headroom), peak


def offload_options(spec: SearchSpec, zero: int) -> list[dict]:
    """Offloads to score beyond none, as the engine offers them: the whole optimizer, then
    with it ZeRO-3's parameters (every one adds time, so only the least that fits matters)."""
    engine = spec.engine
    options = []
    if engine.optimizer_offload != "none" and zero in engine.optimizer_offload_zero and not engine.offload_together:
        options.append({"offload_optimizer": 1.0, "offload_params": False})
    if engine.param_offload and zero == 3 and engine.optimizer_offload != "none":
        options.append({"offload_optimizer": 1.0, "offload_params": True})
    return [o for o in options if all(spec.admits(k, v) for k, v in o.items())]


def _least_activation_offload(case: Case, spec: SearchSpec, layout: Layout, note_miss) \
        -> tuple[Optional[tuple[Job, float]], int]:
    """Activations of the fewest leading layers per stage offloaded, with no recomputation, that fits
    (memory falls as more are offloaded: bisection), where the engine runs it."""
    if not spec.engine.activation_offload or not spec.admits("recompute", "none"):
        return None, 0
    stage_max = max(layout.stage_layers) if layout.stage_layers else case.model.num_layers // layout.pp
    pinned = spec.pins.get("offload_activations")
    scored = 0

    def trial(n: int) -> Optional[tuple[Job, float]]:
        nonlocal scored
        try:
            job = Job(case.model, case.cluster, case.training,
                      layout.with_changes(recompute="none", recompute_num_layers=None, recompute_modules=None,
                                          offload_activations=n),
                      case.overheads)
        except SpecError:
            return None
        if spec.runner.problems(job):
            return None
        scored += 1
        ok, peak = fits(job, spec.headroom)
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


def structures(case: Case, spec: SearchSpec) -> Iterator[tuple[int, int, int, int]]:
    """(tp, cp, pp, dp) with tp·cp·pp·dp = GPUs that the model, batch, engine and bounds allow."""
    model, training, cluster = case.model, case.training, case.cluster
    engine = spec.engine
    n = cluster.num_gpus
    for tp in divisors(n):
        if model.num_attention_heads % tp or model.ffn_hidden_size % tp \
                or (model.num_kv_heads % tp and tp % model.num_kv_heads):
            continue
        if tp > cluster.gpu.nvlink_domain and not spec.tp_across_nodes:
            continue
        if not spec.admits("tp", tp):
            continue
        for cp in divisors(n // tp):
            if cp > 1 and (not engine.context_parallel or training.seq_len % (2 * cp)):
                continue
            if cp > 1 and "max_cp" not in spec.bounds and training.seq_len < cp * MIN_TOKENS_PER_CP_RANK:
                continue
            if not spec.admits("cp", cp):
                continue
            for pp in divisors(n // (tp * cp)):
                dp = n // (tp * cp * pp)
                if pp > model.num_layers or training.global_batch_size % dp:
                    continue
                if tp > 1 and pp > 1 and not engine.tp_with_pp:
                    continue
                if spec.admits("pp", pp) and spec.admits("dp", dp):
                    yield tp, cp, pp, dp


def expert_options(case: Case, spec: SearchSpec, tp: int, cp: int, dp: int) -> list[tuple[int, Optional[int]]]:
    """(ep, etp) pairs to score for one structure: for a dense model only (1, None); for a
    mixture of experts every ep that divides the experts and, with etp, the attention's
    tp·cp·dp ranks (the expert grid folds over them), and the engine's etp choices (1 and tp
    where it runs any: ``EngineSupport.expert_tp_choices``) within one NVLink domain unless
    ``tp_across_nodes``."""
    model, cluster = case.model, case.cluster
    if not model.is_moe:
        return [(1, None)]
    engine = spec.engine
    out = []
    for etp in engine.expert_tp_choices(tp):
        if model.moe_ffn_hidden_size % etp or not spec.admits("etp", etp):
            continue
        if etp > cluster.gpu.nvlink_domain and not spec.tp_across_nodes:
            continue
        for ep in divisors(model.num_experts):
            if (tp * cp * dp) % (etp * ep) or not spec.admits("ep", ep):
                continue
            if ep > 1 and not engine.expert_parallel:
                continue
            out.append((ep, etp))
    return out


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


def _recompute_ladder(spec: SearchSpec, base: Layout, bundles: tuple = (None,)) -> Iterator[Layout]:
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


def _least_full_recompute(case: Case, spec: SearchSpec, layout: Layout, at_least: int,
                          note_miss, at_most: Optional[int] = None) -> Optional[tuple[Job, float]]:
    """Full recomputation on the fewest layers per stage (no fewer than ``at_least``, no more
    than ``at_most``) that fits.

    Memory falls as more layers are recomputed, so the fewest that fit are found by bisection.
    """
    stage_max = max(layout.stage_layers or default_partition(case.model, case.training, layout))

    def trial(n: int) -> tuple[Optional[Job], float]:
        rnl = None if n >= stage_max or not spec.engine.partial_recompute else n
        job = Job(case.model, case.cluster, case.training, layout.with_changes(recompute_num_layers=rnl),
                  case.overheads)
        ok, peak = fits(job, spec.headroom)
        if not ok and n >= stage_max:  # the most recomputation there is: the advice's closest layout
            note_miss(job, peak)
        return (job if ok else None), peak

    top = stage_max if at_most is None else min(at_most, stage_max)
    best = trial(top)
    if best[0] is None or not spec.engine.partial_recompute:
        return best if best[0] else None
    # With interleaving the count is per model chunk (Megatron's --recompute-num-layers), so
    # the per-stage count moves in steps of vpp.
    step = layout.vpp
    low, high = _fewest_recomputed(stage_max, at_least, step) // step, top // step
    while low < high:
        mid = (low + high) // 2
        attempt = trial(mid * step)
        if attempt[0] is not None:
            high, best = mid, attempt
        else:
            low = mid + 1
    return best


def _fewest_recomputed(stage_max: int, at_least: int, vpp: int) -> int:
    """The fewest layers a stage may recompute in full: ``at_least`` (capped at the stage), in
    whole steps of vpp, since Megatron's --recompute-num-layers counts per model chunk."""
    return max(1, -(-min(at_least, stage_max) // vpp)) * vpp


def _full_layers_faster_than(case: Case, selective: Job, full: Layout, at_least: int) -> int:
    """The most layers a stage can recompute in full and still run faster than ``selective``
    (0 where even the fewest the search tries cannot), on the stage with the most layers: each
    more layer recomputed adds its forward there, so its time grows by one step per layer."""
    partition = full.stage_layers or default_partition(case.model, case.training, full)
    stage_max = max(partition)
    widest = partition.index(stage_max)
    fewest = min(stage_max, _fewest_recomputed(stage_max, at_least, full.vpp))

    def widest_stage(layers: int) -> float:
        job = Job(case.model, case.cluster, case.training, full.with_changes(recompute_num_layers=layers),
                  case.overheads)
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


def _floor(case: Case, base: Layout, threshold: float) -> tuple[float, Optional[StepTime]]:
    """The least step time any layout built on ``base`` can take: ``base``'s own, with neither
    recomputation nor offload, since each only adds work (a recomputed forward, a copy to or
    from the host) to the step; its memory is not needed for that. With that step where it
    took all of it: where the micro-batches and the bubble alone pass ``threshold``, the rest
    of the step is not priced. (0, None) where ``base`` alone is not a layout the cost models
    take."""
    try:
        job = Job(case.model, case.cluster, case.training, base, case.overheads)
    except SpecError:
        return 0.0, None
    stages = pipeline(job)
    least = stages.least_step(job)
    if least > threshold:
        return least, None
    time = step_time(job, stages)
    return time.total, time


def _states_cannot_fit(case: Case, spec: SearchSpec, base: Layout) -> bool:
    """Whether the model states on the GPU alone, with the fixed buffers, fill more than its usable
    memory both without offload and under the most offload the search may try for ``base``'s ZeRO
    stage. They depend on neither the micro-batch nor the recomputation, so then no layout on
    ``base``'s grid and ZeRO stage fits. Offload moves states off the GPU, but an engine's defaults
    may hold more on it once the optimizer is offloaded (Megatron keeps non-delayed fp8 weights in
    16 bits there: ``EngineBehaviour.quantized_param_gather_offloaded``), so both ends are priced."""
    from .estimate import fit_limit

    def least_states(changes: dict) -> float:
        job = Job(case.model, case.cluster, case.training, base.with_changes(**changes), case.overheads)
        o = job.overheads
        return max(m.parameters + m.gradients + m.optimizer_states + m.other - o.fragmentation * m.activations
                   for m in stage_memories(job, peak_candidates(job)))  # which hold the most states too

    strongest = ([{}] + offload_options(spec, base.zero_stage))[-1]
    try:
        least = min(least_states(changes) for changes in ({}, strongest))
    except SpecError:
        return False
    return least > fit_limit(Job(case.model, case.cluster, case.training, base, case.overheads), spec.headroom)


def _least_recompute(case: Case, spec: SearchSpec, base: Layout, at_least: int,
                     note_miss) -> tuple[Optional[tuple[Job, float]], int]:
    """The layout with the least recomputation that fits, and how many layouts were scored.

    Selective recomputation on every layer and full recomputation of a few layers are not
    ordered: either can cost less (the first repeats part of every layer, the second all of a
    few). Where selective is the least that fits and the engine recomputes some layers in full,
    full recomputation of the fewest layers that fit takes its place where that is faster."""
    scored = 0
    bundles = (spec.pins["recompute_modules"],) if "recompute_modules" in spec.pins \
        else selective_bundles(case.model, case.training, spec.engine)
    ladder = list(_recompute_ladder(spec, base, bundles))
    for layout in ladder:
        try:
            if layout.recompute == "full" and layout.recompute_num_layers is None:
                scored += 1
                hit = _least_full_recompute(case, spec, layout, at_least, note_miss)
                if hit is not None and not spec.runner.problems(hit[0]):
                    return hit, scored
                continue
            job = Job(case.model, case.cluster, case.training, layout, case.overheads)
        except SpecError:
            continue
        if spec.runner.problems(job):  # a rule of the engine's own code (planner/engines/)
            continue
        scored += 1
        ok, peak = fits(job, spec.headroom)
        if ok:
            full = [rung for rung in ladder if rung.recompute == "full" and rung.recompute_num_layers is None]
            at_most = _full_layers_faster_than(case, job, full[0], at_least) \
                if layout.recompute == "selective" and full and spec.engine.partial_recompute else 0
            if at_most:
                scored += 1
                hit = _least_full_recompute(case, spec, full[0], at_least, note_miss, at_most)
                if hit is not None and not spec.runner.problems(hit[0]):
                    return hit, scored
            return (job, peak), scored
        note_miss(job, peak)
    return None, scored


def search(case: Case, spec: SearchSpec, first_only: bool = False, keep_within: Optional[float] = None,
           ceiling: float = math.inf) -> SearchResult:
    """Score every non-dominated layout; return those that fit (with ``first_only``, stop at one).

    With ``ceiling`` (seconds), layouts whose step time cannot come under it are skipped too:
    `size` knows how slow a layout on this cluster may be and still matter.

    With ``keep_within`` (a fraction), layouts that cannot come within that share of the
    fastest found so far, nor among the top_k + 1 fastest, are skipped before their memory is
    scored: their step time is at least (m + (p − 1)/v) · L_max · (3 · t_layer + 4 · t_tp) —
    every micro-batch and the bubble run the forward and backward of the stage with the most
    layers, with its four tensor-parallel collectives per layer — and the rest of the step
    only adds to that. Those that pass are skipped still, before their memory is scored, when
    their step with neither recomputation nor offload is too slow (:func:`_floor`).
    """
    model, training = case.model, case.training
    engine = spec.engine
    result = SearchResult(candidates=[], scored=0)
    fastest: list[float] = []
    tightest_peak = math.inf

    from .estimate import fit_limit

    def note_miss(job: Job, peak: float) -> None:
        nonlocal tightest_peak
        if peak <= fit_limit(job, spec.headroom):
            return  # it missed on host memory: the advice is about the GPU's
        if peak < tightest_peak:
            tightest_peak, result.tightest = peak, job

    per_layer: dict[tuple, float] = {}  # many groups share a layer's shape: hash the specs once per shape
    per_moe_layer: dict[tuple, float] = {}

    def lower_bound(tp: int, cp: int, pp: int, dp: int, vpp: int, sp: bool, mbs: int,
                    stage_layers: tuple[int, ...], ep: int, etp: Optional[int]) -> float:
        m = training.global_batch_size // (mbs * dp)
        shape = (tp, cp, mbs, sp)
        if shape not in per_layer:
            layer = layer_time_bound(model, training, case.cluster.gpu, tp, cp, mbs, sp)
            collectives = sum(tp_exposed_per_layer(model, training, case.cluster, tp, cp, mbs, sp))
            per_layer[shape] = (layer + collectives, collectives)
        dense, collectives = per_layer[shape]
        if not model.is_moe:
            return (m + (pp - 1) / vpp) * max(stage_layers) * dense
        # An MoE layer: its compute, half or all of the TP pair, and its dispatches and combines.
        etp = etp or tp
        moe_shape = (tp, cp, mbs, sp, ep, etp)
        if moe_shape not in per_moe_layer:
            per_moe_layer[moe_shape] = \
                moe_layer_time_for(model, training, case.cluster.gpu, tp, cp, mbs, sp, ep, etp, 0.0).total \
                + collectives * (1.0 if model.moe_shared_expert_ffn_hidden_size else 0.5) \
                + 2 * dispatch_combine_time(model, training, case.cluster, tp, cp, mbs, ep, etp)
        moe = per_moe_layer[moe_shape]
        moe_counts = moe_layers_per_stage(model, tuple(stage_layers), vpp)
        stage = max((n - k) * dense + k * moe for n, k in set(zip(stage_layers, moe_counts)))
        return (m + (pp - 1) / vpp) * stage

    # Every (structure, partition, vpp, sp) with its micro-batches, the most promising first,
    # so that a good incumbent prunes early.
    groups = []
    for tp, cp, pp, dp in structures(case, spec):
        sp_options = [sp for sp in ((False,) if tp == 1 else engine.sequence_parallel)
                      if spec.admits("sequence_parallel", sp)]
        if True in sp_options and not training.engine.costs_per_collective:
            sp_options = [True]  # dominates False (module docstring)
        zeros = [z for z in engine.zero_stages_for(training.precision)
                 if spec.admits("zero_stage", z) and not (pp > 1 and z > engine.max_zero_with_pp)]
        offload_only: set[int] = set()  # ZeRO stages scored only for the offload they allow
        if dp * cp == 1:
            # Nothing to shard over: one ZeRO stage, and those the engine offloads with.
            kept = [z for z in zeros if z == 0] or zeros[:1]
            offload_only = {z for z in zeros if z not in kept and offload_options(spec, z)}
            zeros = [z for z in zeros if z in kept or z in offload_only]
        balances = training.engine.balance_stages and pp > 1
        options = partitions(model.num_layers, pp)
        if balances and None not in options:
            options = [None] + options  # the engine's own split, balanced by compute
        splits = [(partition, partition or default_partition(model, training, Layout(pp=pp)), vpp)
                  for partition in options
                  for vpp in _vpp_options(partition or default_partition(model, training, Layout(pp=pp)), engine)]
        if model.mtp_layers and pp > 1 and not balances:
            # Multi-token prediction runs a layer and the LM head again on the last stage, more than
            # lightening the edges offsets: the split balanced by compute (Megatron-Bridge's
            # DeepSeek-V3 layouts likewise leave the last stage one decoder layer beside "mL",
            # recipes/deepseek/h100/deepseek_v3.py), interleaved in unequal chunks where the
            # engine's pipeline layout allows them.
            lighter = balanced_partition(model.num_layers, pp, *layer_and_head_cost(model, training.seq_len))
            if lighter not in options and min(lighter) > 0:
                splits += [(lighter, lighter, vpp) for vpp in (1,) + (UNEVEN_VPP if engine.interleaving else ())
                           if min(lighter) >= vpp]
        if engine.interleaving and pp > 1 and not balances and model.num_layers % pp:
            # Interleaving where the layers do not divide by pp, so no even split interleaves: the
            # engine's uneven split over the virtual stages (cost_models.partition.virtual_partition),
            # at UNEVEN_VPP model chunks per rank.
            splits += [(None, virtual_partition(model.num_layers, pp, vpp), vpp) for vpp in UNEVEN_VPP
                       if model.num_layers % (pp * vpp) and model.num_layers >= pp * vpp]
        for partition, stage_layers, vpp in splits:
            if not spec.admits("vpp", vpp) or (vpp > 1 and partition is None and balances
                                               and model.num_layers % (pp * vpp)):
                continue
            micro_batches = [mbs for mbs in divisors(training.global_batch_size // dp)
                             if spec.admits("micro_batch_size", mbs)
                             and not (vpp > 1 and (training.global_batch_size // (mbs * dp)) % pp)]
            if not micro_batches:
                continue
            for sp in sp_options:
                for ep, etp in expert_options(case, spec, tp, cp, dp):
                    bounds = {mbs: lower_bound(tp, cp, pp, dp, vpp, sp, mbs, stage_layers, ep, etp)
                              for mbs in micro_batches}
                    groups.append((min(bounds.values()), tp, cp, pp, dp, partition, stage_layers, vpp, sp, zeros,
                                   bounds, ep, etp, offload_only))
    if keep_within is not None or ceiling < math.inf:
        groups.sort(key=lambda g: g[0])

    def threshold() -> float:
        if keep_within is None or len(fastest) <= spec.top_k:
            return ceiling
        return min(ceiling, max(-fastest[0], min(-t for t in fastest) * (1 + keep_within)))

    for index, (least, tp, cp, pp, dp, partition, stage_layers, vpp, sp, zeros, bounds, ep, etp, offload_only) \
            in enumerate(groups):
        if least > threshold():
            result.pruned += sum(len(g[10]) for g in groups[index:])  # sorted: none after can do better
            break
        fitted_without_recompute: set[int] = set()  # micro-batches where a lower ZeRO stage needed none
        for zero in zeros:
            if not engine.allows(tp, pp, cp, vpp, zero, sp, "none" if "none" in engine.recompute
                                 else engine.recompute[0]):
                continue
            if first_only and _states_cannot_fit(case, spec, Layout(
                    dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, micro_batch_size=min(bounds), zero_stage=zero,
                    sequence_parallel=sp, stage_layers=partition, ep=ep, etp=etp)):
                # Only whether anything fits is asked: no layout of this ZeRO stage can, and the
                # closest miss (the advice's) is not needed.
                result.pruned += len(bounds)
                continue
            at_least = 1  # fewest recomputed layers found at the last micro-batch
            for mbs, bound in bounds.items():
                # ZeRO 2 takes the time of ZeRO 1 and only saves memory: where ZeRO 1
                # fits with no recomputation, ZeRO 2 cannot win. Not where ZeRO 1 gathers
                # in the step and ZeRO 2 (plain FSDP's) behind the next forward.
                if zero == 2 and mbs in fitted_without_recompute and not training.engine.zero1_gather_in_step:
                    continue
                if bound > threshold():
                    result.pruned += 1
                    continue
                base = Layout(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, micro_batch_size=mbs,
                              zero_stage=zero, sequence_parallel=sp, stage_layers=partition, ep=ep, etp=etp)
                floor = None
                if threshold() < math.inf:
                    least, floor = _floor(case, base, threshold())
                    if least > threshold():
                        result.pruned += 1
                        continue
                hits = []
                if zero not in offload_only and spec.admits("offload_optimizer", 0.0) \
                        and spec.admits("offload_params", False) and spec.admits("offload_activations", 0):
                    hit, scored = _least_recompute(case, spec, base, at_least, note_miss)
                    result.scored += scored
                    if hit is not None:
                        hits.append(hit)
                        if hit[0].layout.recompute == "none" and zero == 1:
                            fitted_without_recompute.add(mbs)
                        at_least = hit[0].layout.recompute_num_layers or at_least
                # Offload only adds time: worth scoring only where memory forces recomputation, or
                # where nothing fits without it.
                if not hits or hits[0][0].layout.recompute != "none":
                    for offload in offload_options(spec, zero):
                        hit, scored = _least_recompute(case, spec, base.with_changes(**offload), 1, note_miss)
                        result.scored += scored
                        if hit is not None:
                            hits.append(hit)
                    if zero not in offload_only:
                        hit, scored = _least_activation_offload(case, spec, base, note_miss)
                        result.scored += scored
                        if hit is not None:
                            hits.append(hit)
                if not hits:
                    break  # a larger micro-batch needs more memory still
                for job, peak in hits:
                    time = floor if floor is not None and job.layout == base else step_time(job)
                    seconds = time.total
                    result.candidates.append(Candidate(job.layout, seconds, peak, job, time))
                    if first_only:
                        return result
                    # The top_k + 1 fastest so far, as a max-heap of negated times.
                    heapq.heappush(fastest, -seconds)
                    if len(fastest) > spec.top_k + 1:
                        heapq.heappop(fastest)
    return result
