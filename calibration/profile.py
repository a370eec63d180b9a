"""The hardware profile: measured figures and fits, in the form ``cluster.profile`` reads.

``planner.case_cluster.gpu_from_profile`` reads these sections:

- ``machine``: where and how it was measured (host, device, torch, NCCL, date, ranks);
- ``gpu``: the fields of a GPU preset, measured: ``peak_tflops`` per precision timed,
  ``hbm_bandwidth`` (the fastest streaming kernel, bytes read + written per second), ``intra_node_bandwidth``
  and ``inter_node_bandwidth`` (fitted all-reduce bus bandwidth), ``gpus_per_node`` and
  ``nvlink_domain`` (ranks per node), ``memory`` (the GPU's, or the host's RAM shared by
  its ranks), and on CPUs ``cpu_process`` (the median over ranks of each rank's VmRSS once its
  process group is up, before its first tensor: ``Overheads.cpu_process``, taken off ``memory``);
- ``performance`` and ``fabric``: the cost model's achieved figures, fitted to the measurements
  with its own formulas (:mod:`calibration.fit`); link efficiencies are 1 because the
  bandwidths above are already the achieved bus bandwidths;
- ``alone``: ``peak_tflops``, ``hbm_bandwidth`` and the compute and memory figures of
  ``performance`` fitted to the GEMMs, attention and element-wise kernels timed again on rank 0
  while the others wait: what a case of one rank gets (on a CPU its rank has the shared cores'
  caches and memory bandwidth to itself); absent where one rank was measured;
- ``measurements``: every timing (median, p10, p90 over samples) and fit.

Peaks: with ``datasheet_peaks`` (a GPU preset's ``peak_tflops``) efficiencies are
shares of the datasheet, as in ``planner/presets/performance.yaml``. Without one (a
CPU, or a GPU with no preset named) the peak of a precision is the best FLOP/s any
timed GEMM reached, so ``gemm_efficiency`` comes out near 1 and ``kernel_overhead_s``
carries what small GEMMs lose; the product η·peak, all the cost model uses for GEMM
time, is the measured one either way.

Pure Python: the ranks hand in plain timings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from cost_models.kernels import PAGE_BYTES, attention_shape_efficiency
from cost_models.specs import Performance, peak_key

from .fit import ATTENTION_PASSES, KINDS, CollectiveFit, fit_attention, fit_collective, fit_gemm, percentile
from .shapes import AttentionShape, GemmShape


def sig(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant figures (for a readable profile)."""
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.{digits}g}")


def spread(samples: list[float]) -> dict[str, float]:
    return {"median_s": sig(percentile(samples, 0.5)), "p10_s": sig(percentile(samples, 0.1)),
            "p90_s": sig(percentile(samples, 0.9))}


@dataclass
class Measurements:
    """All timings of a run (per-call seconds, pooled over ranks), as rank 0 gathers them."""

    gemm: dict[str, list[tuple[GemmShape, list[float]]]] = field(default_factory=dict)  # by precision
    attention: list[tuple[AttentionShape, list[float]]] = field(default_factory=list)
    attention_precision: str = "fp32"
    # op → [(tensor bytes, bytes moved per call, samples)]
    memory: dict[str, list[tuple[int, int, list[float]]]] = field(default_factory=dict)
    # link class → kind → (group size, [(buffer bytes, samples)])
    collectives: dict[str, dict[str, tuple[int, list[tuple[int, list[float]]]]]] = field(default_factory=dict)
    # Share of compute a collective ran under (benchmarks.overlap), pooled over ranks; empty: not measured.
    overlap: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The GEMMs, attention and element-wise kernels timed again on rank 0 while every other rank
    # waits: what one rank achieves with the device (on a CPU, the shared cores, caches and memory
    # bandwidth) to itself. None: one rank, whose figures already are that.
    alone: Optional["Measurements"] = None


def _bandwidth(value: float) -> str:
    return f"{value / 1e9:.6g} GB/s"


def _memory(value: float) -> str:
    return f"{value / 2**30:.6g} GiB"


def _median(samples: list[float]) -> float:
    return percentile(samples, 0.5)


def _peak_for(precision: str, peaks: dict[str, float]) -> float:
    """FLOP/s the cost model divides by for ``precision`` (``specs.peak_key``, as ``GPUSpec.peak``)."""
    return peaks[peak_key(precision, peaks)] * 1e12


def page_fault_s(fresh: tuple[int, int, list[float]], written: tuple[int, int, list[float]]) -> float:
    """``Performance.page_fault_s``: what filling a buffer allocated for the call takes beyond filling
    one written before, per page (``cost_models.kernels.PAGE_BYTES``) of the buffer, or 0 where
    it takes no longer (an allocator that reuses freed blocks). A full calibration's largest
    memory size (256 MiB on a CPU) is past glibc's mmap threshold (at most 32 MiB), so every
    call's buffer is mapped afresh; a quick one's 1 MiB may be reused from the heap and read 0."""
    size, _, fresh_times = fresh
    extra = _median(fresh_times) - _median(written[2])
    return max(0.0, extra) / (size / PAGE_BYTES)


def compute_figures(m: Measurements, main_precision: str, datasheet_peaks: Optional[dict[str, float]],
                    tiled_attention: bool) -> tuple[dict[str, float], dict[str, float], dict[str, Any], float]:
    """Peaks (TFLOP/s per precision), the compute and memory figures of ``performance``, their
    measurements section and the copy bandwidth (bytes/s), fitted to ``m``'s GEMM, attention and
    element-wise timings."""
    performance: dict[str, float] = {}
    measured: dict[str, Any] = {}

    # GEMMs: peak per precision, then η and t₀ under the cost model's formula.
    peaks: dict[str, float] = dict(datasheet_peaks or {})
    gemm_section: dict[str, Any] = {}
    fits = {}
    for precision, points in m.gemm.items():
        best = max(s.flops / _median(t) for s, t in points)
        if not datasheet_peaks:
            peaks[precision] = sig(best / 1e12, 6)
        peak = _peak_for(precision, peaks)
        fit = fit_gemm([s.flops for s, _ in points], [_median(t) for _, t in points], peak)
        fits[precision] = fit
        gemm_section[precision] = {
            "peak_tflops": sig(peak / 1e12, 6),
            "peak_source": "datasheet (GPU preset)" if datasheet_peaks else "best measured GEMM",
            "best_measured_tflops": sig(best / 1e12),
            "fit": {"gemm_efficiency": sig(fit.efficiency), "kernel_overhead_s": sig(fit.overhead_s),
                    "rms_relative_error": sig(fit.rms_rel_error, 3)},
            "points": [{"name": s.name, "m": s.m, "n": s.n, "k": s.k, "flops": s.flops,
                        **({"model_m": s.capped_from_m} if s.capped_from_m else {}),
                        "tflops": sig(s.flops / _median(t) / 1e12), **spread(t)} for s, t in points],
        }
    if main_precision not in fits:
        raise ValueError(f"no GEMM timings in {main_precision}")
    # gemm_efficiency is the 16-bit GEMMs' share of their peak where they were timed (GPUs), else
    # the training precision's (a CPU times fp32 alone); fp32 GEMMs timed beside 16-bit ones (TF32
    # on GPUs) get their own share, so an fp32 case is not priced at the bf16 kernels' efficiency.
    sixteen_bit = next((p for p in ("bf16", "fp16") if p in fits), None)
    performance["gemm_efficiency"] = sig(fits[sixteen_bit or main_precision].efficiency)
    if sixteen_bit and "fp32" in fits:
        performance["gemm_efficiency_fp32"] = sig(fits["fp32"].efficiency)
    performance["kernel_overhead_s"] = sig(fits[main_precision].overhead_s)
    measured["gemm"] = gemm_section

    if m.attention:
        p = m.attention_precision
        overhead = fits[p].overhead_s if p in fits else fits[main_precision].overhead_s
        peak = _peak_for(p, peaks)
        # GPU flash-attention kernels fill fewer tensor-core tiles at small head dims and short
        # key blocks (cost_models.kernels.attention_shape_efficiency); a CPU's SDPA has no such
        # tiles: its profile turns the effect off.
        if not tiled_attention:
            performance["attention_head_dim_half"] = performance["attention_seq_half"] = 1e-3
        defaults = Performance()
        shape_perf = Performance(
            attention_head_dim_half=performance.get("attention_head_dim_half", defaults.attention_head_dim_half),
            attention_seq_half=performance.get("attention_seq_half", defaults.attention_seq_half))
        q = [attention_shape_efficiency(s.head_dim, s.seq_len, shape_perf) for s, _ in m.attention]
        attention_fit = fit_attention([s.forward_flops for s, _ in m.attention],
                                      [_median(t) for _, t in m.attention], peak, overhead, q)
        performance["attention_efficiency"] = sig(attention_fit.efficiency)
        measured["attention"] = {
            "precision": p, "kernel": "torch scaled_dot_product_attention, causal, forward + backward",
            "fit": {"attention_efficiency": sig(attention_fit.efficiency), "kernel_overhead_s": sig(overhead),
                    "rms_relative_error": sig(attention_fit.rms_rel_error, 3)},
            "points": [{"name": s.name, "batch": s.batch, "heads": s.heads, "kv_heads": s.kv_heads,
                        "seq_len": s.seq_len, "head_dim": s.head_dim, "forward_flops": s.forward_flops,
                        "tflops": sig(ATTENTION_PASSES * s.forward_flops / _median(t) / 1e12), **spread(t)}
                       for s, t in m.attention],
        }

    # Memory: the fastest rate a streaming kernel reached at the largest size is the HBM (or DRAM)
    # figure: on a GPU the copy's, on a CPU the in-place add's, since a write to a fresh tensor
    # first reads its line there. Each class of element-wise kernel gets its share of it.
    memory_section: dict[str, Any] = {}
    for op, sizes in m.memory.items():
        memory_section[op] = [{"tensor_bytes": size, "bytes_moved": moved,
                               "gb_s": sig(moved / _median(t) / 1e9), **spread(t)} for size, moved, t in sizes]
    largest = {op: max(sizes, key=lambda p: p[0]) for op, sizes in m.memory.items() if sizes}

    def rate(ops: tuple[str, ...]) -> Optional[float]:
        """Bytes per second over ``ops`` together (their bytes over their times)."""
        points = [largest[op] for op in ops if op in largest]
        return sum(p[1] for p in points) / sum(_median(p[2]) for p in points) if points else None

    hbm = max(r for op in ("copy", "add", "add_in_place") if (r := rate((op,))) is not None)
    for name, ops in (("hbm_efficiency", ("copy", "add")), ("in_place_efficiency", ("add_in_place",)),
                      ("transcendental_efficiency", ("gelu",))):
        achieved = rate(ops)
        if achieved is not None:
            performance[name] = sig(min(1.0, achieved / hbm))
    if "fill" in largest and "fill_fresh" in largest:
        performance["page_fault_s"] = sig(page_fault_s(largest["fill_fresh"], largest["fill"]))
    memory_section["hbm_bandwidth_gb_s"] = sig(hbm / 1e9)
    elementwise = rate(("copy", "add"))
    if elementwise is None:  # the worker times every op of benchmarks.MEMORY_OPS
        raise ValueError("no copy or add was timed: no element-wise rate to give")
    memory_section["elementwise_gb_s"] = sig(elementwise / 1e9)
    measured["memory"] = memory_section

    return peaks, performance, measured, hbm


def build_profile(machine: dict[str, Any], m: Measurements, *, memory_bytes: float, gpus_per_node: int,
                  main_precision: str, datasheet_peaks: Optional[dict[str, float]] = None,
                  tiled_attention: Optional[bool] = None, process_bytes: Optional[float] = None) -> dict[str, Any]:
    """The profile document (a dict ready for YAML) from ``m``.

    ``process_bytes`` (a CPU run): the median over ranks of what a rank's process held before its first
    tensor, written as ``gpu.cpu_process`` (``Overheads.cpu_process``); None writes none.

    ``main_precision`` is the training precision whose GEMM fit becomes ``gemm_efficiency``
    and ``kernel_overhead_s``; ``datasheet_peaks`` are TFLOP/s per precision.
    """
    notes = list(m.notes)
    if tiled_attention is None:  # GPUs (NCCL) run tiled flash attention; CPUs (gloo) do not
        tiled_attention = machine.get("backend") == "nccl"
    peaks, performance, measured, hbm = compute_figures(m, main_precision, datasheet_peaks, tiled_attention)

    # Collectives: α and bus bandwidth per kind and link class.
    links: dict[str, dict[str, Any]] = {}
    coll_fits: dict[str, dict[str, CollectiveFit]] = {}
    for link, kinds in m.collectives.items():
        links[link] = {}
        for kind in KINDS:
            if kind not in kinds:
                continue
            n, points = kinds[kind]
            fit = fit_collective(kind, n, [s for s, _ in points], [_median(t) for _, t in points])
            coll_fits.setdefault(link, {})[kind] = fit
            links[link][kind] = {
                "group_size": n,
                "fit": {"latency_s": sig(fit.latency_s), "bus_bandwidth_gb_s": sig(fit.bus_bandwidth / 1e9),
                        "rms_relative_error": sig(fit.rms_rel_error, 3)},
                "points": [{"bytes": s, **spread(t)} for s, t in points],
            }
    measured["collectives"] = links
    intra = coll_fits.get("intra_node", {}).get("all_reduce")
    inter = coll_fits.get("inter_node", {}).get("all_reduce")
    if intra is None and inter is None:
        notes.append("collectives not measured (one rank): intra- and inter-node bandwidth are set to the "
                     "device copy bandwidth as placeholders, link_latency_s is the cost model's default")
        intra_bw = inter_bw = hbm
    else:
        measured_fit = intra if intra is not None else inter
        assert measured_fit is not None  # the branch above takes neither measured
        intra_bw = measured_fit.bus_bandwidth  # the inter-node figure where one rank a node measured none
        inter_bw = inter.bus_bandwidth if inter else intra_bw
        performance["link_latency_s"] = sig(measured_fit.latency_s)
        if intra is None:
            notes.append("one rank per node: intra_node_bandwidth is the inter-node figure")
        if inter is None:
            notes.append("one node: inter_node_bandwidth is the intra-node figure (not measured); "
                         "set cluster.inter_node_bandwidth in a case for a multi-node cluster")
    performance["intra_node_efficiency"] = 1.0
    # The inter-node bus bandwidth is measured as such: the fabric delivers it as it stands.
    fabric: dict[str, Any] = {"efficiency": 1.0}
    if inter is not None:
        # The all-reduce's α is a tree level's (its steps are the tree's: cost_models.collectives);
        # a ring step's is the all-gather's where it was measured across nodes, else the same.
        ring = coll_fits.get("inter_node", {}).get("all_gather")
        fabric["latency_s"] = sig((ring or inter).latency_s)
        fabric["tree_latency_s"] = sig(inter.latency_s)
    # The cost model runs all-gather and reduce-scatter at a share of the all-reduce's bus
    # bandwidth (cost_models.collectives.collective_time): the measured ratios, per link class.
    for link in ("intra_node", "inter_node"):
        link_fits = coll_fits.get(link, {})
        if "all_reduce" in link_fits:
            for kind in ("all_gather", "reduce_scatter"):
                if kind in link_fits:
                    ratio = link_fits[kind].bus_bandwidth / link_fits["all_reduce"].bus_bandwidth
                    performance[f"{kind}_efficiency"] = sig(min(1.0, ratio))
            break
    if m.overlap:
        # The expected share (the model's exposed time is linear in it): the samples are near 0
        # or 1 (the collective ran under the GEMMs or took turns with them), so their median
        # jumps between calibrations where their mean does not (0.02-0.31 against 0.22-0.39 in
        # six repetitions on the 2-core development machine).
        performance["comm_overlap"] = sig(sum(m.overlap) / len(m.overlap))
        measured["overlap"] = {"all_reduce_beside_gemms": {
            "mean": sig(sum(m.overlap) / len(m.overlap)),
            "median": sig(percentile(m.overlap, 0.5)), "p10": sig(percentile(m.overlap, 0.1)),
            "p90": sig(percentile(m.overlap, 0.9)), "samples": len(m.overlap)}}

    gpu = {
        "memory": _memory(memory_bytes),
        **({"cpu_process": f"{process_bytes / 2**20:.6g} MiB"} if process_bytes is not None else {}),
        "peak_tflops": {k: sig(v, 6) for k, v in peaks.items()},
        "hbm_bandwidth": _bandwidth(hbm),
        "intra_node_bandwidth": _bandwidth(intra_bw),
        "inter_node_bandwidth": _bandwidth(inter_bw),
        "gpus_per_node": gpus_per_node,
        "nvlink_domain": gpus_per_node,
    }
    if machine.get("vendor") == "amd":  # a ROCm machine (the GPU's vendor decides what DeepEP can run on)
        gpu["vendor"] = "amd"
    document = {"machine": machine, "gpu": gpu, "performance": performance, "fabric": fabric}
    if m.alone is not None:
        alone_peaks, alone_performance, measured["alone"], alone_hbm = compute_figures(
            m.alone, main_precision, datasheet_peaks, tiled_attention)
        document["alone"] = {"peak_tflops": {k: sig(v, 6) for k, v in alone_peaks.items()},
                             "hbm_bandwidth": _bandwidth(alone_hbm), "performance": alone_performance}
    measured["notes"] = notes
    return {**document, "measurements": measured}


HEADER = """\
# Hardware profile written by `layout-planner calibrate`. Use it in a case file as
#   cluster: {profile: PATH, num_gpus: N}
# machine: where, when and how it was measured (device, torch, ranks, threads, --quick, the
# CPU share others used and a reference GEMM's speed before and after the ranks ran);
# gpu: measured figures in the GPU-preset schema (memory: a GPU's, or on CPUs the host's RAM
# over the ranks sharing it); gpu.cpu_process, on CPUs: what a rank's process holds outside
# its tensors, taken off that memory (VmRSS in /proc/self/status once the rank's process
# group is up, before its first benchmark tensor; the median over the ranks);
# performance and fabric: the cost model's achieved figures fitted
# to the timings under its own formulas; alone: the figures rank 0 measured while the others
# waited, which a case of one GPU takes; measurements: every timing (median, p10, p90 over
# samples, per call) and fit. See docs/calibration.md and calibration/profile.py.
"""


class _Inline(dict):
    """A mapping written on one line (a measurement point)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Inline, lambda dumper, data: dumper.represent_mapping(
    "tag:yaml.org,2002:map", data.items(), flow_style=True))


def _inline_points(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _inline_points(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_Inline(v) if isinstance(v, dict) else _inline_points(v) for v in node]
    return node


def render(profile: dict[str, Any]) -> str:
    """YAML text of a profile: block mappings, one line per measurement point."""
    return HEADER + yaml.dump(_inline_points(profile), Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                              width=160, allow_unicode=True)
