"""One rank's calibration run: the plan of measurements, running it in lockstep, and (rank 0) the profile.

Started by :mod:`calibration.run` under torchrun (``... calibration.worker [--case CASE]
[--quick] ...``, as :mod:`calibration.launch` asks). Every rank runs every compute and
memory benchmark at the same time as the others (a barrier before each), as ranks
share a node in training; collectives run within each node (and, with several
nodes, between the ranks of the same local index on each node, one NIC each).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist

from . import benchmarks
from .benchmarks import Budget
from .host import cores, cpu_model, resident_bytes
from .profile import Measurements, build_profile, render
from .progress import RankProgress
from .shapes import (DEFAULT_GPU_MODELS, DEFAULT_GPU_SEQ_LEN, DEFAULT_MODELS, DEFAULT_SEQ_LEN, MICRO_BATCHES,
                     QUICK_MODEL, QUICK_SEQ_LEN, AttentionShape, GemmShape, attention_shapes, cap_attention,
                     cap_gemms, gemm_shapes, tp_degrees)
from .train import threads_per_rank

KiB, MiB, GiB = 2**10, 2**20, 2**30


@dataclass
class Plan:
    """What one rank times, the same on every rank."""

    precisions: list[str]
    main_precision: str
    gemms: list[GemmShape]
    attention: list[AttentionShape]
    memory_sizes: list[int]
    collective_sizes: list[int]
    budget: Budget
    memory_budget: Budget
    collective_budget: Budget
    notes: list[str] = field(default_factory=list)


def make_plan(case: Optional[Path], quick: bool, cuda: bool, device: torch.device) -> Plan:
    notes: list[str] = []
    micro_batches: tuple[int, ...] = MICRO_BATCHES
    precision = "bf16" if cuda else "fp32"
    if quick:
        models, seq_len, micro_batches = [QUICK_MODEL], QUICK_SEQ_LEN, (1,)
    elif case is not None:
        from planner.case import load_case

        loaded = load_case(case)
        models, seq_len = [loaded.model], loaded.training.seq_len
        if loaded.layout is not None:
            micro_batches = tuple(sorted({*MICRO_BATCHES, loaded.layout.micro_batch_size}))
        wanted = loaded.training.precision
        if cuda:
            precision = "bf16" if wanted == "fp8" else wanted
            if wanted == "fp8":
                notes.append("fp8 GEMMs are timed in bf16 (no Transformer Engine here)")
        elif wanted != "fp32":
            notes.append(f"the case trains in {wanted}; a CPU run times fp32 only (CPU bf16 is far slower "
                         "than any accelerator's)")
    elif cuda:
        models, seq_len = list(DEFAULT_GPU_MODELS), DEFAULT_GPU_SEQ_LEN
    else:
        models, seq_len = list(DEFAULT_MODELS), DEFAULT_SEQ_LEN
    gemms: list[GemmShape] = []
    attention: list[AttentionShape] = []
    for model in models:
        tps = tp_degrees(model)[:2] if quick else None
        gemms += gemm_shapes(model, seq_len, micro_batches, tps)
        attention += attention_shapes(model, seq_len, micro_batches, tps)
    if cuda:
        max_flops, max_elements, attention_flops = 2e13, 2**30, 2e13
    else:
        max_flops, max_elements, attention_flops = 2e10, 2**27, 6e9
    if quick:
        max_flops, attention_flops = 2e8, 2e8
    gemms, dropped = cap_gemms(gemms, max_flops, max_elements)
    attention, dropped_attention = cap_attention(attention, attention_flops)
    notes += dropped + dropped_attention
    if any(s.capped_from_m for s in gemms):
        notes.append(f"GEMMs over {max_flops:.0e} FLOPs ran fewer tokens (model_m is the model's)")
    if quick:
        budget = memory_budget = collective_budget = Budget(warmup=1, samples=3, target_s=0.002, max_inner=50)
        memory_sizes, collective_sizes = [1 * MiB], [4 * KiB, 16 * KiB, 64 * KiB]
    elif cuda:
        budget = Budget(warmup=5, samples=10, target_s=0.005)
        memory_budget = Budget(warmup=3, samples=10, target_s=0.02)
        collective_budget = Budget(warmup=5, samples=10, target_s=0.005)
        memory_sizes = [64 * MiB, 1 * GiB]
        collective_sizes = [4 * KiB * 4**i for i in range(11)]  # 4 KiB … 4 GiB/4 = 1 GiB
    else:
        budget = Budget(warmup=2, samples=7, target_s=0.02)
        memory_budget = Budget(warmup=2, samples=7, target_s=0.1)
        collective_budget = Budget(warmup=3, samples=15, target_s=0.02)  # gloo's small messages are noisy
        memory_sizes = [16 * MiB, 256 * MiB]
        collective_sizes = [4 * KiB * 4**i for i in range(8)]  # 4 KiB … 64 MiB
    # GPUs time fp32 (TF32) GEMMs beside the 16-bit ones: a case in either precision then has its
    # own peak and efficiency in the profile. A CPU times fp32 alone (its bf16 GEMMs are far slower).
    precisions = [precision, "bf16" if precision == "fp32" else "fp32"] if cuda else [precision]
    return Plan(precisions, precision, gemms, attention, memory_sizes, collective_sizes, budget, memory_budget,
                collective_budget, notes)


def machine_info(cuda: bool, device: torch.device, world: int, local_world: int, nodes: int, backend: str,
                 threads: int, case: Optional[Path], quick: bool) -> dict[str, Any]:
    cpu = cpu_model()
    gpu = torch.cuda.get_device_name(device) if cuda else None
    nccl = None
    if cuda:
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - a build without NCCL
            nccl = None
    return {
        "hostname": socket.gethostname(),
        "device": gpu or f"CPU: {cpu}",
        "cpu": cpu,
        "gpu": gpu,
        # ROCm's torch answers torch.cuda too: its GPUs run none of NVIDIA's libraries (DeepEP).
        "vendor": ("amd" if getattr(torch.version, "hip", None) else "nvidia") if cuda else None,
        "torch": str(torch.__version__),
        "nccl": nccl,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "world_size": world,
        "local_world_size": local_world,
        "nodes": nodes,
        "backend": backend,
        "threads_per_rank": None if cuda else threads,
        "case": str(case) if case else None,
        "quick": quick,
    }


def _groups(places: list[tuple[int, int]]) -> tuple[dict[str, list[list[int]]], int]:
    """Rank lists per link class: intra-node (one per node), inter-node (one per local index)."""
    nodes = sorted({n for n, _ in places})
    locals_ = sorted({lr for _, lr in places})
    intra = [[r for r, (n, _) in enumerate(places) if n == node] for node in nodes]
    inter = [[r for r, (_, lr) in enumerate(places) if lr == index] for index in locals_]
    lists = {}
    if max(len(g) for g in intra) > 1:
        lists["intra_node"] = intra
    if len(nodes) > 1:
        lists["inter_node"] = inter
    return lists, len(nodes)


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m calibration.run ... calibration.worker")
    parser.add_argument("--timeout", type=float, default=300.0)  # the launcher's watchdog, in seconds
    parser.add_argument("--case", type=Path, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gpu-preset", default=None)
    parser.add_argument("--other-cpu-share", type=float, default=None)  # measured by the launcher before the run
    return parser.parse_args(argv)


@dataclass
class _Rank:
    """This rank in the run: where it sits, what it runs on, and its process groups by link."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    node: int
    cuda: bool
    device: Any
    backend: str
    threads: int
    progress: RankProgress
    groups: dict[str, tuple[Optional[Any], list[int], int]] = field(default_factory=dict)
    nodes: int = 1
    # VmRSS once the process groups are up, before the first benchmark tensor (None: no /proc)
    process_bytes: Optional[float] = None

    def barrier(self) -> None:
        with self.progress.comm():
            dist.barrier()


def work(argv: list[str], progress: RankProgress) -> None:
    """This rank's measurements; rank 0 writes ``profile.yaml`` in the run's folder."""
    args = _arguments(argv)
    progress.step("start")
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    me = _start(args, progress)
    plan = make_plan(args.case, args.quick, me.cuda, me.device)
    if me.cuda and "fp32" in plan.precisions:
        torch.backends.cuda.matmul.allow_tf32 = True  # the cost model's fp32 GEMMs run in TF32
        plan.notes.append("fp32 GEMMs ran with TF32 allowed, as the cost model assumes")
    collective_items = [(link, kind, size) for link in me.groups for kind in benchmarks.COLLECTIVES
                        for size in plan.collective_sizes]
    # Overlap of a collective with compute: over the widest group, at the largest size.
    overlap_link = next((link for link in me.groups if len(me.groups[link][1]) > 1), None)
    # The compute benchmarks again on rank 0 alone, where there are other ranks: the GEMMs of
    # the training precision, attention, and each element-wise kernel at the largest size.
    alone_items = (len(plan.gemms) + len(plan.attention) + len(benchmarks.MEMORY_OPS)) if me.world > 1 else 0
    progress.set_total(len(plan.precisions) * len(plan.gemms) + len(plan.attention)
                       + len(benchmarks.MEMORY_OPS) * len(plan.memory_sizes) + alone_items + len(collective_items)
                       + (overlap_link is not None) + 1)
    local, memory_moved = _measure_compute(me, plan)
    alone = _measure_alone(me, plan) if alone_items else None
    if me.cuda:
        torch.cuda.empty_cache()
    collective_bytes = _measure_collectives(me, plan, collective_items, overlap_link, local)
    progress.step("write", "gathering timings")
    gathered: Optional[list[Any]] = [None] * me.world if me.rank == 0 else None
    with progress.comm():
        dist.gather_object((local, {link: g[2] for link, g in me.groups.items()}, me.process_bytes), gathered,
                           dst=0)
    if me.rank == 0:
        assert gathered is not None
        m = _measurements(plan, gathered, memory_moved, collective_bytes, collective_items, me.groups)
        m.alone = alone
        _write_profile(me, args, plan, m, load_before, [g[2] for g in gathered])
    me.barrier()
    dist.destroy_process_group()


def _start(args: argparse.Namespace, progress: RankProgress) -> _Rank:
    """This rank's device and backend, the process group, and a subgroup per link."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    me = _Rank(rank=int(os.environ.get("RANK", "0")), world=int(os.environ.get("WORLD_SIZE", "1")),
               local_rank=local_rank, local_world=local_world, node=int(os.environ.get("GROUP_RANK", "0")),
               cuda=cuda, device=torch.device("cuda", local_rank) if cuda else torch.device("cpu"),
               backend="nccl" if cuda else "gloo", threads=threads_per_rank(local_world, cores()), progress=progress)
    if cuda:
        torch.cuda.set_device(me.device)
    else:
        torch.set_num_threads(me.threads)
    progress.step("init")
    with progress.comm():
        dist.init_process_group(me.backend, timeout=datetime.timedelta(seconds=2 * args.timeout),
                                **({"device_id": me.device} if cuda else {}))
        places: list[Any] = [None] * me.world
        dist.all_gather_object(places, (me.node, me.local_rank))
    group_lists, me.nodes = _groups(places)
    for link, lists in group_lists.items():
        with progress.comm():
            if len(lists) == 1 and len(lists[0]) == me.world:
                mine, members = None, lists[0]
            else:
                mine, _ = dist.new_subgroups_by_enumeration(lists)
                members = next(g for g in lists if me.rank in g)
        me.groups[link] = (mine, members, next(i for i, g in enumerate(lists) if me.rank in g))
    # What the rank is before it holds a tensor of its own: the interpreter, torch's and gloo's libraries
    # and the groups' buffers (Overheads.cpu_process), read before any benchmark allocates.
    me.process_bytes = resident_bytes()
    return me


def _measure_compute(me: _Rank, plan: Any) -> tuple[list[list[float]], list[int]]:
    """Every rank at once: GEMMs per precision, attention, element-wise kernels per size
    (their timings, and the bytes each element-wise kernel moved)."""
    local: list[list[float]] = []
    memory_moved: list[int] = []
    for precision in plan.precisions:
        for shape in plan.gemms:
            me.progress.step("gemm", f"{precision} {shape.m}x{shape.n}x{shape.k}")
            me.barrier()
            local.append(benchmarks.gemm(shape, precision, me.device, plan.budget))
    for shape in plan.attention:
        me.progress.step("attention", f"{plan.main_precision} b={shape.batch} heads={shape.heads} s={shape.seq_len}")
        me.barrier()
        local.append(benchmarks.attention(shape, plan.main_precision, me.device, plan.budget))
    for op in benchmarks.MEMORY_OPS:
        for size in plan.memory_sizes:
            me.progress.step("memory", f"{op} {size // MiB} MiB")
            me.barrier()
            times, moved = benchmarks.memory(op, size, plan.main_precision, me.device, plan.memory_budget)
            local.append(times)
            memory_moved.append(moved)
    return local, memory_moved


def _measure_alone(me: _Rank, plan: Any) -> Measurements:
    """The compute benchmarks again on rank 0 alone. Every rank steps through the items (so the
    watchdog sees them move) and meets at a barrier before each; only rank 0 works between them."""
    alone = Measurements(attention_precision=plan.main_precision, gemm={plan.main_precision: []})
    for shape in plan.gemms:
        me.progress.step("alone", f"{plan.main_precision} {shape.m}x{shape.n}x{shape.k} on rank 0")
        me.barrier()
        if me.rank == 0:
            alone.gemm[plan.main_precision].append(
                (shape, benchmarks.gemm(shape, plan.main_precision, me.device, plan.budget)))
    for shape in plan.attention:
        me.progress.step("alone", f"attention b={shape.batch} heads={shape.heads} s={shape.seq_len} on rank 0")
        me.barrier()
        if me.rank == 0:
            alone.attention.append((shape, benchmarks.attention(shape, plan.main_precision, me.device, plan.budget)))
    size = max(plan.memory_sizes)
    for op in benchmarks.MEMORY_OPS:
        me.progress.step("alone", f"{op} {size // MiB} MiB on rank 0")
        me.barrier()
        if me.rank == 0:
            times, moved = benchmarks.memory(op, size, plan.main_precision, me.device, plan.memory_budget)
            alone.memory[op] = [(size, moved, times)]
    return alone


def _measure_collectives(me: _Rank, plan: Any, items: list[tuple[str, str, int]], overlap_link: Optional[str],
                         local: list[list[float]]) -> list[int]:
    """Each collective per link and size, then one all-reduce beside GEMMs (appended to
    ``local``); the bytes each collective moved."""
    collective_bytes: list[int] = []
    for link, kind, size in items:
        group, members, _ = me.groups[link]
        me.progress.step("collectives", f"{link} {kind} {_size(size)}")
        me.barrier()
        with me.progress.comm():
            times, used = benchmarks.collective(kind, group, members, size, plan.main_precision, me.device,
                                                plan.collective_budget)
        local.append(times)
        collective_bytes.append(used)
    if overlap_link is not None:
        me.progress.step("overlap", f"{overlap_link} all_reduce beside GEMMs")
        me.barrier()
        with me.progress.comm():
            local.append(benchmarks.overlap(me.groups[overlap_link][0], max(plan.collective_sizes),
                                            max(plan.gemms, key=lambda g: g.flops), plan.main_precision,
                                            me.device, plan.collective_budget))
    return collective_bytes


def _write_profile(me: _Rank, args: argparse.Namespace, plan: Any, m: Measurements,
                   load_before: Optional[float], process_bytes: list[Optional[float]]) -> None:
    """Rank 0: the profile from the measurements, written atomically as ``profile.yaml``;
    ``process_bytes``: each rank's resident set before its first tensor."""
    peaks = None
    if args.gpu_preset:
        from planner.presets import gpu_presets

        peaks = dict(gpu_presets()[args.gpu_preset]["peak_tflops"])
    if me.cuda:
        memory_bytes = float(torch.cuda.get_device_properties(me.device).total_memory)
    else:
        memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / me.local_world
    machine = machine_info(me.cuda, me.device, me.world, me.local_world, me.nodes, me.backend, me.threads, args.case,
                           args.quick)
    if args.gpu_preset:
        machine["gpu_preset"] = args.gpu_preset
    if args.other_cpu_share is not None:  # what other processes used just before the run
        machine["other_cpu_share"] = round(args.other_cpu_share, 3)
    if load_before is not None:  # other work on the host skews CPU timings: a load above the ranks' is a sign
        machine["load_average_1min"] = {"start": round(load_before, 2), "end": round(os.getloadavg()[0], 2)}
    # A CPU rank's process comes out of the memory above (a GPU's context is on the GPU, not here).
    measured = [b for b in process_bytes if b is not None]
    process = None
    if not me.cuda:
        if measured:
            process = statistics.median(measured)
        else:
            m.notes.append("the ranks' process memory was not measured (no /proc/self/status): the planner "
                           "takes its default for gpu.cpu_process")
    profile = build_profile(machine, m, memory_bytes=memory_bytes, gpus_per_node=me.local_world,
                            main_precision=plan.main_precision, datasheet_peaks=peaks, process_bytes=process)
    target = me.progress.workdir / "profile.yaml"
    tmp = target.with_name(".profile.yaml.tmp")
    tmp.write_text(render(profile), encoding="utf-8")
    os.replace(tmp, target)


def _size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _measurements(plan: Plan, gathered: list[Any], memory_moved: list[int], collective_bytes: list[int],
                  collective_items: list[tuple[str, str, int]], groups: dict) -> Measurements:
    """Rank 0: pool every rank's samples per item (collectives: slowest member per sample first)."""
    per_rank = [g[0] for g in gathered]
    group_of = [g[1] for g in gathered]
    m = Measurements(attention_precision=plan.main_precision, notes=list(plan.notes))
    i = 0

    def pooled(index: int) -> list[float]:
        return [t for samples in per_rank for t in samples[index]]

    for precision in plan.precisions:
        m.gemm[precision] = []
        for shape in plan.gemms:
            m.gemm[precision].append((shape, pooled(i)))
            i += 1
    for attention in plan.attention:
        m.attention.append((attention, pooled(i)))
        i += 1
    j = 0
    for op in benchmarks.MEMORY_OPS:
        m.memory[op] = []
        for size in plan.memory_sizes:
            m.memory[op].append((size, memory_moved[j], pooled(i)))
            i += 1
            j += 1
    for c, (link, kind, size) in enumerate(collective_items):
        by_group: dict[int, list[list[float]]] = {}
        for r, samples in enumerate(per_rank):
            by_group.setdefault(group_of[r][link], []).append(samples[i])
        times = [max(column) for members in by_group.values() for column in zip(*members)]
        n = len(groups[link][1])
        entry = m.collectives.setdefault(link, {}).setdefault(kind, (n, []))
        entry[1].append((collective_bytes[c], times))
        i += 1
    if i < len(per_rank[0]):  # the overlap samples, last
        m.overlap = pooled(i)
    return m
