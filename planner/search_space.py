"""The layouts `plan`'s search enumerates: grids (tp, cp, pp, dp), pipeline splits, virtual
stages, sequence parallelism, expert grids, ZeRO stages and micro-batch sizes, as the model,
the batch, the engine and the case's ``search`` section allow, grouped into the
:class:`~planner.search_rows.Group` rows the search scores (:mod:`planner.search`)."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from typing import Iterator, Optional

from cost_models.experts import deepep_group_refusal
from cost_models.layer_time import layer_time_for
from cost_models.partition import (balanced_partition, cost_balanced_partition, default_partition, layer_and_head_cost,
                                   virtual_partition)
from cost_models.pipeline import interleaving_refusal
from cost_models.placement import high_precision_tail
from cost_models.specs import GPUSpec, Layout, ModelSpec, TrainingSpec
from cost_models.stage_time import head_time

from .case import Case
from .engines import EngineSupport
from .search_memory import most_micro_batch
from .search_options import SearchSpec
from .search_recompute import offload_options
from .search_rows import Group

# Unless the case bounds cp itself, every context-parallel rank keeps at least this many
# tokens: below it the ring's per-step latency and the flash-attention tiles (128 × 128)
# leave a rank's chunk too small to pay for the exchange; NeMo's long-context recipes
# keep 4k–16k tokens per rank.
MIN_TOKENS_PER_CP_RANK = 1024
# Model chunks per pipeline rank the search tries where the layers do not divide by pp
# (DeepSeek-V3's 61 layers): the unequal chunks an engine with a pipeline layout runs.
UNEVEN_VPP = (2, 4)


def cp_too_thin(spec: SearchSpec, seq_len: int, cp: int) -> bool:
    """Whether the search leaves out context parallelism of degree ``cp`` by default: each rank
    keeps MIN_TOKENS_PER_CP_RANK tokens where the search section leaves cp free. A section that
    pins or bounds cp (``cp``, ``min_cp``, ``max_cp``) asks for the degrees it names: they are
    tried however short each rank's chunk (``SearchSpec.bounds`` holds cp's bounds under "cp";
    the test for "max_cp" there never held, so ``max_cp: 8`` on 4,096 tokens found no layout)."""
    return (cp > 1 and "cp" not in spec.pins and "cp" not in spec.bounds
            and seq_len < cp * MIN_TOKENS_PER_CP_RANK)


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


def vpp_options(partition: tuple[int, ...], engine: EngineSupport) -> list[int]:
    """Virtual stages per rank that split every stage of ``partition`` into equal chunks."""
    if len(partition) == 1 or not engine.interleaving or min(partition) == 0:
        return [1]
    smallest = min(partition)
    return [v for v in divisors(smallest) if all(n % v == 0 for n in partition)]


def structures(case: Case, spec: SearchSpec) -> Iterator[tuple[int, int, int, int]]:
    """(tp, cp, pp, dp) with tp·cp·pp·dp = GPUs that the model, batch, engine and bounds allow."""
    model, training, cluster = case.model, case.training, case.cluster
    engine = spec.engine
    n = cluster.num_gpus
    # More stages than layers leave ranks without one. An engine that splits evenly refuses that; nanotron,
    # which cuts its stages by block cost, runs it (``build_model`` moves to the next rank at most once a
    # block and never past the last, so the ranks past its blocks hold none: the Playbook measured 28
    # layers on 32 ranks), and those ranks still count in its 1F1B schedule (each rank's warm-up is
    # pp - rank - 1 forwards), which the pricing of its split holds (cost_models.partition).
    # Each degree is taken among the divisors of what it must divide, not of the GPUs alone: tp of
    # the heads and FFN width, cp of half the sequence, dp of the global batch. The same layouts in
    # the same order; `size` enumerates them on a hundred thousand cluster sizes, and the divisors
    # of each size (a million on 2^20 GPUs) took most of its time.
    for tp in divisors(math.gcd(n, model.num_attention_heads, model.ffn_hidden_size)):
        if model.num_kv_heads % tp and tp % model.num_kv_heads:
            continue
        if tp > cluster.gpu.nvlink_domain and not spec.tp_across_nodes:
            continue
        if not spec.admits("tp", tp):
            continue
        halves = training.seq_len // 2 if engine.context_parallel and training.seq_len % 2 == 0 else 1
        for cp in divisors(math.gcd(n // tp, halves)):
            if cp_too_thin(spec, training.seq_len, cp):
                continue
            if not spec.admits("cp", cp):
                continue
            ranks = n // (tp * cp)
            for dp in reversed(divisors(math.gcd(ranks, training.global_batch_size))):  # pp ascending
                pp = ranks // dp
                if pp > model.num_layers and not training.engine.splits_by_block_cost:
                    continue
                if tp > 1 and pp > 1 and not engine.tp_with_pp:
                    continue
                if spec.admits("pp", pp) and spec.admits("dp", dp):
                    yield tp, cp, pp, dp


def expert_options(case: Case, spec: SearchSpec, tp: int, cp: int, dp: int) -> list[tuple[int, Optional[int]]]:
    """(ep, etp) pairs to score for one structure: for a dense model only (1, None); for a
    mixture of experts every ep that divides the experts and, with etp, the attention's
    tp·cp·dp ranks (the expert grid folds over them), and the engine's etp choices (1 and tp
    where it runs any: ``EngineSupport.expert_tp_choices``; any the search section pins) within
    one NVLink domain unless ``tp_across_nodes``; under ``training.expert_dispatch: deepep``, only the
    etp·ep groups DeepEP runs (``experts.deepep_group_refusal``)."""
    model, cluster = case.model, case.cluster
    if not model.is_moe:
        return [(1, None)]
    engine = spec.engine
    out = []
    choices = engine.expert_tp_choices(tp)
    if engine.expert_tp == "any" and "etp" in spec.pins:
        # A pinned etp the engine runs, though the search would not try it (Megatron-LM's
        # --expert-tensor-parallel-size is any: tp 4 with etp 2 was "no layout meets etp, tp").
        choices = (spec.pins["etp"],)
    for etp in choices:
        if model.moe_ffn_hidden_size % etp or not spec.admits("etp", etp):
            continue
        if etp > cluster.gpu.nvlink_domain and not spec.tp_across_nodes:
            continue
        for ep in divisors(model.num_experts):
            if (tp * cp * dp) % (etp * ep) or not spec.admits("ep", ep):
                continue
            if engine.expert_refusals(tp, ep, etp):  # an expert split the engine does not run
                continue
            if case.training.expert_dispatch == "deepep" and deepep_group_refusal(etp, ep):
                continue  # a group DeepEP has no config for, which the case's dispatch refuses (Job)
            out.append((ep, etp))
    return out


def _zero_stages(case: Case, spec: SearchSpec, pp: int, dp: int, cp: int) -> tuple[tuple[int, ...], frozenset[int]]:
    """The ZeRO stages to score on a grid, and those of them scored only for the offload they allow."""
    engine = spec.engine
    zeros = [z for z in engine.zero_stages
             if spec.admits("zero_stage", z) and not (pp > 1 and z > engine.max_zero_with_pp)]
    offload_only: set[int] = set()
    if dp * cp == 1 and not case.training.engine.reduce_bucket_buffers:
        # Nothing to shard over: one ZeRO stage, and those the engine offloads with. (DeepSpeed's
        # ZeRO-1/2 hold reduction buffers of their own, which its stage 3 does not: each is scored.)
        kept = [z for z in zeros if z == 0] or zeros[:1]
        offload_only = {z for z in zeros if z not in kept and offload_options(spec, z)}
        zeros = [z for z in zeros if z in kept or z in offload_only]
    return tuple(zeros), frozenset(offload_only)


def _splits(case: Case, spec: SearchSpec, pp: int) -> list[tuple[Optional[tuple[int, ...]], tuple[int, ...], int]]:
    """(partition, layers per stage, vpp) for each pipeline split to score at ``pp`` stages."""
    splits = [split for split in _engine_splits(case.model, case.training, spec.engine, pp, case.cluster.gpu)
              if spec.admits("vpp", split[2])]
    pinned = spec.pins.get("vpp", 1)
    if not splits and pinned > 1 and spec.engine.interleaving and pp > 1 and case.model.num_layers >= pp * pinned \
            and not case.training.engine.balance_stages:
        # A pinned vpp no even split interleaves (80 layers on 5 stages at 3 chunks): the engine's
        # split over the virtual stages, in unequal chunks where its pipeline layout allows them
        # (an engine that splits equally refuses it by its rules).
        splits = [(None, virtual_partition(case.model.num_layers, pp, pinned), pinned)]
    return splits


@lru_cache(maxsize=1024)
def _engine_splits(model: ModelSpec, training: TrainingSpec, engine: EngineSupport, pp: int, gpu: GPUSpec) \
        -> tuple[tuple[Optional[tuple[int, ...]], tuple[int, ...], int], ...]:
    """:func:`_splits` before the case's pins on vpp. Cached: `size` asks for them at every cluster size."""
    balances = training.engine.balance_stages and pp > 1
    # An engine that cuts its own stages (nanotron) runs that split alone.
    options = [None] if training.engine.splits_by_block_cost else partitions(model.num_layers, pp)
    if balances and None not in options:
        options = [None] + options  # the engine's own split, balanced by compute
    # The engine's own split (partition None) at each vpp: an engine that balances its stages by
    # compute does so without interleaving only (``partition.default_partition``).
    splits = [(partition, partition or default_partition(model, training, Layout(pp=pp, vpp=vpp)), vpp)
              for partition in options
              for vpp in vpp_options(partition or default_partition(model, training, Layout(pp=pp)), engine)]
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
    tail = high_precision_tail(model, training)
    if tail and pp > 1 and not balances:
        # A recipe that keeps its last layers in bf16 (NVFP4's): those layers take a multiple of an
        # FP4 layer's time, and the stages that hold them set the pipeline's pace under any split that
        # counts layers alike (llama3-8b on 72 GB200s: [3, 4, 4, 4, 4, 4, 3, 3, 3] ran at the bf16
        # step, [4, 4, 4, 4, 4, 4, 4, 2, 2] 18 % faster). The split balanced by each layer's time (a
        # micro-batch of one sequence at tp 1: the ratio the split needs, not the step) joins them.
        low = layer_time_for(model, training, gpu, 1, 1, 1, False).total
        kept = layer_time_for(model, training, gpu, 1, 1, 1, False, quantized=False).total
        costs = (low,) * (model.num_layers - tail) + (kept,) * tail
        timed = cost_balanced_partition(costs, pp, head_time(model, training, gpu, 1, training.seq_len))
        if timed not in options and min(timed) > 0:
            splits += [(timed, timed, vpp) for vpp in (1,) + (UNEVEN_VPP if engine.interleaving else ())
                       if min(timed) >= vpp]
    if engine.interleaving and pp > 1 and not balances and model.num_layers % pp:
        # Interleaving where the layers do not divide by pp, so no even split interleaves: the
        # engine's uneven split over the virtual stages (cost_models.partition.virtual_partition),
        # at UNEVEN_VPP model chunks per rank.
        splits += [(None, virtual_partition(model.num_layers, pp, vpp), vpp) for vpp in UNEVEN_VPP
                   if model.num_layers % (pp * vpp) and model.num_layers >= pp * vpp]
    return tuple((partition, tuple(stage_layers), vpp) for partition, stage_layers, vpp in splits
                 if not (vpp > 1 and partition is None and balances and model.num_layers % (pp * vpp)))


def groups(case: Case, spec: SearchSpec) -> Iterator[Group]:
    """Every (structure, partition, vpp, sp, expert grid) with the ZeRO stages and micro-batches
    to score on it, in the search's enumeration order."""
    for head, grids in group_families(case, spec):
        yield from family_members(head, grids)


def family_members(head: Group, grids: tuple[tuple[int, Optional[int]], ...]) -> list[Group]:
    """The groups of a family (:func:`group_families`): its first, and the same at each other (ep, etp)."""
    return [head if (ep, etp) == (head.ep, head.etp) else replace(head, ep=ep, etp=etp) for ep, etp in grids]


def group_families(case: Case, spec: SearchSpec) -> Iterator[tuple[Group, tuple[tuple[int, Optional[int]], ...]]]:
    """:func:`groups`, those that differ only in their expert parallelism (ep) together: the first
    of each such family, and the (ep, etp) of each of its groups in enumeration order. A bound that
    leaves out ep (``StepBounds.least``) is the family's: DeepSeek-V3's 256 experts give each grid
    up to nine ep, and `size` enumerates the groups of thousands of cluster sizes to bound them."""
    training, engine = case.training, spec.engine
    for tp, cp, pp, dp in structures(case, spec):
        sp_options = [sp for sp in ((False,) if tp == 1 else engine.sequence_parallel)
                      if spec.admits("sequence_parallel", sp)]
        if True in sp_options and not training.engine.costs_per_collective:
            sp_options = [True]  # dominates False (planner.search's docstring)
        zeros, offload_only = _zero_stages(case, spec, pp, dp, cp)
        largest = most_micro_batch(case.model, case.cluster, training, case.overheads, spec.headroom, tp, cp, pp)
        families = _expert_families(expert_options(case, spec, tp, cp, dp))
        for partition, stage_layers, vpp in _splits(case, spec, pp):
            micro_batches = tuple(mbs for mbs in divisors(training.global_batch_size // dp)
                                  if spec.admits("micro_batch_size", mbs)
                                  and not (vpp > 1 and interleaving_refusal(pp, training.global_batch_size // (mbs * dp),
                                                                            training.engine.interleaving_rounds)))
            # Past the largest micro-batch that could fit, none does; the smallest stays, as the
            # closest miss where nothing fits.
            micro_batches = micro_batches[:1] + tuple(m for m in micro_batches[1:] if m <= largest)
            if not micro_batches:
                continue
            for sp in sp_options:
                for grids in families:
                    ep, etp = grids[0]
                    yield Group(tp=tp, cp=cp, pp=pp, dp=dp, partition=partition, stage_layers=tuple(stage_layers),
                                vpp=vpp, sequence_parallel=sp, ep=ep, etp=etp, zeros=zeros,
                                offload_only=offload_only, micro_batches=micro_batches), grids


def _expert_families(grids: list[tuple[int, Optional[int]]]) -> list[tuple[tuple[int, Optional[int]], ...]]:
    """The (ep, etp) pairs in their order, in runs of one etp (``expert_options`` gives each etp's
    ep together)."""
    families: list[list[tuple[int, Optional[int]]]] = []
    for ep, etp in grids:
        if families and families[-1][0][1] == etp:
            families[-1].append((ep, etp))
        else:
            families.append([(ep, etp)])
    return [tuple(family) for family in families]
