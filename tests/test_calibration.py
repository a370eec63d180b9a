"""`layout-planner calibrate`: the fits recover known figures, a quick 2-rank gloo run writes a
profile the planner accepts, and a rank that dies or hangs (or an interrupt) ends the run with a
one-line message naming the rank and no profile written."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import planner
from calibration.fit import (collective_steps_and_volume, fit_attention, fit_collective, fit_gemm, fit_two,
                             percentile)
from calibration.profile import Measurements, build_profile, render
from calibration.progress import FAULT_ENV, PEER_FAILURE_EXIT, diagnose
from calibration.shapes import (AttentionShape, GemmShape, attention_shapes, cap_gemms, gemm_shapes,
                                tp_degrees)
from cost_models.collectives import collective_time
from cost_models.flops import attention_flops, head_gemm, layer_gemms
from cost_models.kernels import attention_shape_efficiency, flash_attention_time
from cost_models.specs import GPUSpec, ModelSpec, Performance
from cost_models.topology import GroupLinks
from planner.case import load_case
from planner.case_cluster import gpu_from_profile
from planner.errors import CaseError
from planner.units import parse_memory
from process_rss import measured_rss

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
MODEL = ModelSpec("m", num_layers=2, hidden_size=768, num_attention_heads=12, vocab_size=1001, num_kv_heads=4,
                  activation="swiglu", ffn_hidden_size=2048)


# --- fits: the cost model's formulas, solved back -----------------------------------------

@pytest.mark.parametrize("eta,t0", [(0.7, 8e-6), (0.93, 0.0), (1.0, 3e-5), (0.05, 1e-3)])
def test_gemm_fit_recovers_efficiency_and_overhead(eta, t0):
    peak = 989e12
    flops = [2.0 * m * n * k for m, n, k in ((128, 128, 128), (4096, 4096, 4096), (8192, 1024, 8192),
                                             (512, 28672, 8192), (64, 64, 64))]
    times = [f / (eta * peak) + t0 for f in flops]
    fit = fit_gemm(flops, times, peak)
    assert fit.efficiency == pytest.approx(eta, rel=1e-9)
    assert fit.overhead_s == pytest.approx(t0, rel=1e-9, abs=1e-15)
    assert fit.rms_rel_error == pytest.approx(0.0, abs=1e-9)


def test_gemm_fit_keeps_efficiency_at_most_one_and_overhead_non_negative():
    peak = 1e12
    flops = [1e6, 1e8, 1e10]
    faster = fit_gemm(flops, [f / (1.25 * peak) + 1e-6 for f in flops], peak)  # "η = 1.25": not physical
    assert faster.efficiency == 1.0 and faster.overhead_s >= 0
    negative = fit_gemm(flops, [max(f / (0.5 * peak) - 1e-6, 1e-9) for f in flops], peak)
    assert negative.overhead_s == 0.0 and 0 < negative.efficiency <= 1


def test_fit_two_is_the_constrained_least_squares_optimum():
    """Against a brute-force grid: the box-constrained relative least squares is found exactly."""
    u, v, y = [1.0, 2.0, 3.0, 5.0], [1.0, 1.0, 1.0, 1.0], [2.5, 3.1, 4.9, 6.2]
    fit = fit_two(u, v, y, p_min=1.0, q_min=0.0)

    def sse(p, q):
        return sum(((p * a + q * b - t) / t) ** 2 for a, b, t in zip(u, v, y))

    best = min(((1 + i / 150, j / 150) for i in range(300) for j in range(300)), key=lambda c: sse(*c))
    assert sse(fit.p, fit.q) <= sse(*best) + 1e-12


def test_attention_fit_recovers_efficiency_under_the_cost_models_formula():
    peak, eta, t0 = 312e12, 0.42, 7e-6
    shapes = [AttentionShape("a", b, h, h, s, 128) for b, h, s in ((1, 32, 4096), (2, 8, 2048), (4, 64, 8192))]
    flops = [s.forward_flops for s in shapes]
    # the forward FLOPs are cost_models.flops.attention_flops' (causal), for one rank
    model = ModelSpec("x", num_layers=1, hidden_size=32 * 128, num_attention_heads=32, vocab_size=1)
    assert flops[0] == attention_flops(model, 1, 4096, 4096, 1)
    # Timings made by the cost model itself: a layer's attention forward and its 2.5x backward.
    gpu = GPUSpec(name="g", memory_bytes=80e9, peak_flops={"bf16": peak}, hbm_bandwidth=2e12,
                  intra_node_bandwidth=300e9, inter_node_bandwidth=25e9, gpus_per_node=8, nvlink_domain=8,
                  performance=Performance(attention_efficiency=eta, kernel_overhead_s=t0))
    times = [3.5 * flash_attention_time(f, s.head_dim, s.seq_len, 1, gpu, "bf16") for f, s in zip(flops, shapes)]
    q = [attention_shape_efficiency(s.head_dim, s.seq_len, gpu.performance) for s in shapes]
    fit = fit_attention(flops, times, peak, t0, q)
    assert fit.efficiency == pytest.approx(eta, rel=1e-9)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "p2p"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_collective_fit_recovers_latency_and_bus_bandwidth(kind, n):
    alpha, bandwidth = 12e-6, 150e9
    sizes = [4096 * 4**i for i in range(11)]
    times = []
    for size in sizes:
        steps, volume = collective_steps_and_volume(kind, n, size)
        times.append(steps * alpha + volume / bandwidth)
    fit = fit_collective(kind, n, sizes, times)
    assert fit.latency_s == pytest.approx(alpha, rel=1e-9)
    assert fit.bus_bandwidth == pytest.approx(bandwidth, rel=1e-9)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter"])
def test_collective_steps_and_volume_are_the_cost_models(kind):
    """What the fit inverts is exactly cost_models.collectives.collective_time."""
    perf = Performance(link_latency_s=9e-6, intra_node_efficiency=1.0)
    links = GroupLinks(size=8, per_domain=8, domains=1, intra_bandwidth=200e9, inter_bandwidth=50e9)
    steps, volume = collective_steps_and_volume(kind, 8, 1e8)
    assert steps * 9e-6 + volume / 200e9 == pytest.approx(collective_time(kind, 1e8, links, perf), rel=1e-12)


def test_collective_bandwidth_prices_a_large_all_reduce_as_timed_where_the_bandwidth_falls():
    """gloo's bus bandwidth falls at large sizes (1.52 GB/s at 4 MiB, 0.92 at 64 MiB between two
    ranks of the 2-core development machine). nccl-tests reads bandwidth at large sizes and latency
    at small ones (doc/PERFORMANCE.md); a fit weighing every size alike read the mid sizes' bandwidth
    and the cost model priced a 64 MiB all-reduce (a data-parallel gradient bucket's size) 30 % fast."""
    mib, alpha = 2**20, 150e-6

    def bus_bandwidth(size: float) -> float:  # 1.52 GB/s at 4 MiB, 0.92 GB/s at 64 MiB, as measured
        return 1.6e9 / (1 + size / (88 * mib))

    sizes = [4096 * 4**i for i in range(8)]  # calibrate's CPU sizes: 4 KiB … 64 MiB
    times = []
    for size in sizes:
        steps, volume = collective_steps_and_volume("all_reduce", 2, size)
        times.append(steps * alpha + volume / bus_bandwidth(size))
    fit = fit_collective("all_reduce", 2, sizes, times)
    perf = Performance(link_latency_s=fit.latency_s, intra_node_efficiency=1.0)
    links = GroupLinks(size=2, per_domain=2, domains=1, intra_bandwidth=fit.bus_bandwidth,
                       inter_bandwidth=fit.bus_bandwidth)
    assert collective_time("all_reduce", 64 * mib, links, perf) == pytest.approx(times[-1], rel=0.03)
    assert fit.latency_s == pytest.approx(alpha, rel=0.1)  # the small messages' fixed cost
    # The fit error the profile warns of is the priced figures' against every timing.
    priced = [collective_time("all_reduce", size, links, perf) for size in sizes]
    rms = math.sqrt(sum(((p - t) / t) ** 2 for p, t in zip(priced, times)) / len(times))
    assert fit.rms_rel_error == pytest.approx(rms, rel=1e-9)


def test_collective_fit_without_a_bandwidth_signal_stays_finite():
    fit = fit_collective("all_reduce", 2, [4096, 16384, 65536], [3e-4, 2e-4, 2.5e-4])
    assert math.isfinite(fit.bus_bandwidth) and fit.bus_bandwidth > 0 and fit.latency_s >= 0


def test_percentile_interpolates():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 0.5) == 3.0
    assert percentile(values, 0.1) == pytest.approx(1.4)
    assert percentile(values, 0.9) == pytest.approx(4.6)


# --- shapes -------------------------------------------------------------------------------

def test_shapes_are_the_models_gemms_at_each_admissible_degree():
    assert tp_degrees(MODEL) == [1, 2, 4]  # 8 does not divide 12 heads
    shapes = {(s.m, s.n, s.k) for s in gemm_shapes(MODEL, 256, (1, 2))}
    for tp in tp_degrees(MODEL):
        for mbs in (1, 2):
            for g in (*layer_gemms(MODEL, mbs * 256, tp), head_gemm(MODEL, mbs * 256, tp)):
                assert (int(g.m), int(math.ceil(g.n)), int(g.k)) in shapes
    kept, dropped = cap_gemms([GemmShape("big", 8192, 8192, 8192), GemmShape("huge", 16, 2**20, 2**20)], 1e10, 2**27)
    assert kept[0].flops <= 1e10 and kept[0].capped_from_m == 8192 and len(dropped) == 1
    assert {(s.heads, s.kv_heads) for s in attention_shapes(MODEL, 256, (1, 2))} == {(12, 4), (3, 1)}


# --- the profile: synthetic timings made by the formulas give back their figures ----------

def synthetic_measurements(eta=0.61, t0=2e-5, eta_attn=0.33, hbm=2e12, eff=0.8, act=0.2, alpha=1.5e-5, busbw=90e9,
                           peak=400e12, share=None, overlap=(), fault=1.5e-6) -> Measurements:
    m = Measurements(attention_precision="bf16")
    shapes = [GemmShape(f"g{i}", m_, n, k) for i, (m_, n, k) in
              enumerate(((64, 64, 64), (1024, 1024, 1024), (4096, 8192, 4096), (2048, 512, 2048)))]
    m.gemm["bf16"] = [(s, [s.flops / (eta * peak) + t0] * 3) for s in shapes]
    att = [AttentionShape("a", 1, 16, 16, 2048, 128), AttentionShape("b", 4, 8, 2, 4096, 128)]
    # The cost model's attention (cost_models.kernels, GPU shape efficiency at these defaults).
    q = [attention_shape_efficiency(s.head_dim, s.seq_len, Performance()) for s in att]
    m.attention = [(s, [3.5 * (s.forward_flops / (eta_attn * qi * peak) + t0)] * 3) for s, qi in zip(att, q)]
    size = 2**30
    # The in-place add streams at the full rate, a copy and an add at eff of it (as on a CPU,
    # where they read each destination line first), the GeLU at act of it.
    m.memory = {"copy": [(size, 2 * size, [2 * size / (eff * hbm)] * 3)],
                "add": [(size, 3 * size, [3 * size / (eff * hbm)] * 3)],
                "add_in_place": [(size, 3 * size, [3 * size / hbm] * 3)],
                "gelu": [(size, 2 * size, [2 * size / (act * hbm)] * 3)],
                # A fill of a fresh buffer pays a fault per 4 KiB page on top of the fill.
                "fill": [(size, size, [size / hbm] * 3)],
                "fill_fresh": [(size, size, [size / hbm + size / 4096 * fault] * 3)]}
    sizes = [4096 * 4**i for i in range(8)]
    kinds = {}
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "p2p"):
        points = []
        for s in sizes:
            steps, volume = collective_steps_and_volume(kind, 8, s)
            bandwidth = busbw * (share or {}).get(kind, 1.0)
            points.append((s, [steps * alpha + volume / bandwidth] * 3))
        kinds[kind] = (8, points)
    m.collectives["intra_node"] = kinds
    m.overlap = list(overlap)
    return m


def test_profile_from_synthetic_timings_gives_back_the_figures_and_loads(tmp_path):
    machine = {"hostname": "h", "device": "Synthetic GPU", "backend": "nccl", "world_size": 8}
    profile = build_profile(machine, synthetic_measurements(), memory_bytes=80 * 2**30, gpus_per_node=8,
                            main_precision="bf16", datasheet_peaks={"bf16": 400.0, "fp8": 800.0})
    perf = profile["performance"]
    assert perf["gemm_efficiency"] == pytest.approx(0.61, rel=1e-3)
    assert perf["kernel_overhead_s"] == pytest.approx(2e-5, rel=1e-3)
    assert perf["attention_efficiency"] == pytest.approx(0.33, rel=1e-3)
    assert perf["hbm_efficiency"] == pytest.approx(0.8, rel=1e-3)
    assert perf["in_place_efficiency"] == 1.0
    assert perf["transcendental_efficiency"] == pytest.approx(0.2, rel=1e-3)
    assert perf["page_fault_s"] == pytest.approx(1.5e-6, rel=1e-3)
    assert perf["link_latency_s"] == pytest.approx(1.5e-5, rel=1e-3)
    assert perf["intra_node_efficiency"] == 1.0
    path = tmp_path / "profile.yaml"
    path.write_text(render(profile))
    gpu, fabric = gpu_from_profile(path)
    assert fabric.efficiency == 1.0
    assert gpu.name == "Synthetic GPU"
    assert gpu.hbm_bandwidth == pytest.approx(2e12, rel=1e-5)
    assert gpu.intra_node_bandwidth == pytest.approx(90e9, rel=1e-5)
    assert gpu.peak("bf16") == 400e12 and gpu.gpus_per_node == 8 and gpu.memory_bytes == 80 * 2**30
    assert gpu.performance.gemm_efficiency == perf["gemm_efficiency"]
    assert gpu.performance.transcendental_efficiency == perf["transcendental_efficiency"]
    assert gpu.performance.page_fault_s == perf["page_fault_s"]


def test_a_profile_measured_on_rocm_says_its_gpus_are_amd(tmp_path):
    """calibrate on an MI300X node wrote no vendor, so its profile read as NVIDIA's and a MoE plan on it
    was priced and written with DeepEP's dispatch, which ROCm has no port of."""
    for vendor, expected in (("amd", "amd"), ("nvidia", "nvidia")):
        machine = {"hostname": "h", "device": "AMD Instinct MI300X", "backend": "nccl", "world_size": 8,
                   "vendor": vendor}
        profile = build_profile(machine, synthetic_measurements(), memory_bytes=192 * 2**30, gpus_per_node=8,
                                main_precision="bf16", datasheet_peaks={"bf16": 1307.4})
        path = tmp_path / f"{vendor}.yaml"
        path.write_text(render(profile))
        assert gpu_from_profile(path)[0].vendor == expected


def test_the_profile_fabric_takes_a_tree_level_from_the_all_reduce_and_a_ring_step_from_the_all_gather(tmp_path):
    """Across nodes (one rank per node) the all-reduce runs as a tree, 2·⌈log₂ n⌉ levels, and the
    all-gather as a ring, n − 1 steps (``collective_steps_and_volume``, the cost model's counts):
    timings made with 120 µs a level and 50 µs a step come back as the fabric's
    ``tree_latency_s`` and ``latency_s``."""
    m = synthetic_measurements()
    inter = {}
    for kind, alpha in (("all_reduce", 120e-6), ("all_gather", 50e-6)):
        points = []
        for size in [4096 * 4**i for i in range(8)]:
            steps, volume = collective_steps_and_volume(kind, 16, size)
            points.append((size, [steps * alpha + volume / 40e9] * 3))
        inter[kind] = (16, points)
    m.collectives["inter_node"] = inter
    profile = build_profile({"device": "x"}, m, memory_bytes=1e9, gpus_per_node=8, main_precision="bf16",
                            datasheet_peaks={"bf16": 400.0})
    assert profile["fabric"]["tree_latency_s"] == pytest.approx(120e-6, rel=1e-3)
    assert profile["fabric"]["latency_s"] == pytest.approx(50e-6, rel=1e-3)
    path = tmp_path / "profile.yaml"
    path.write_text(render(profile))
    _, fabric = gpu_from_profile(path)
    assert fabric.tree_latency_s == pytest.approx(120e-6, rel=1e-3) and fabric.latency_s == pytest.approx(50e-6, rel=1e-3)


def test_collective_shares_and_overlap_reach_the_profile(tmp_path):
    """All-gather and reduce-scatter run at their measured share of the all-reduce's bus
    bandwidth; comm_overlap is the mean of the overlap samples, the share to expect (their
    median jumps between 0 and 1 where they are, as on a CPU, mostly one or the other)."""
    m = synthetic_measurements(share={"all_gather": 0.5, "reduce_scatter": 0.25}, overlap=(0.0, 1.0, 0.0, 1.0, 1.0))
    perf = build_profile({"device": "x"}, m, memory_bytes=1e9, gpus_per_node=8, main_precision="bf16",
                         datasheet_peaks={"bf16": 400.0})["performance"]
    assert perf["all_gather_efficiency"] == pytest.approx(0.5, rel=1e-3)
    assert perf["reduce_scatter_efficiency"] == pytest.approx(0.25, rel=1e-3)
    assert perf["comm_overlap"] == pytest.approx(0.6)
    # Without overlap samples the cost model's default (1: side by side, as on GPUs) stays.
    assert "comm_overlap" not in build_profile({"device": "x"}, synthetic_measurements(), memory_bytes=1e9,
                                               gpus_per_node=8, main_precision="bf16",
                                               datasheet_peaks={"bf16": 400.0})["performance"]


def test_a_case_of_one_rank_takes_the_figures_measured_with_one_rank_running(tmp_path):
    """Rank 0 timed alone runs its GEMMs at η 0.7 and its element-wise kernels at 0.9 of a 2.4 TB/s
    copy, where all ranks together got 0.61 and 0.8 of 2 TB/s: a case of one rank gets the first,
    a case of two the second."""
    m = synthetic_measurements()
    m.alone = synthetic_measurements(eta=0.7, eff=0.9, hbm=2.4e12)
    profile = build_profile({"device": "Synthetic GPU", "backend": "nccl"}, m, memory_bytes=80 * 2**30,
                            gpus_per_node=8, main_precision="bf16", datasheet_peaks={"bf16": 400.0})
    profile["gpu"]["peak_tflops"]["fp8"] = 800.0
    alone = profile["alone"]
    assert alone["performance"]["gemm_efficiency"] == pytest.approx(0.7, rel=1e-3)
    assert alone["performance"]["hbm_efficiency"] == pytest.approx(0.9, rel=1e-3)
    assert alone["peak_tflops"] == {"bf16": 400.0}
    path = tmp_path / "profile.yaml"
    path.write_text(render(profile))

    def gpu(num_gpus: int):
        return load_case({"model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 512},
                          "cluster": {"profile": str(path), "num_gpus": num_gpus},
                          "training": {"global_batch_size": 8, "seq_len": 64}}).cluster.gpu

    one, two = gpu(1), gpu(2)
    assert one.performance.gemm_efficiency == pytest.approx(0.7, rel=1e-3)
    assert one.performance.hbm_efficiency == pytest.approx(0.9, rel=1e-3)
    assert one.hbm_bandwidth == pytest.approx(2.4e12, rel=1e-5)
    assert one.peak("fp8") == 800e12  # a precision rank 0 did not time again keeps its figure
    assert two.performance.gemm_efficiency == pytest.approx(0.61, rel=1e-3)
    assert two.hbm_bandwidth == pytest.approx(2e12, rel=1e-5)
    # Measured with one rank, a profile has no second figure.
    assert "alone" not in build_profile({"device": "x"}, synthetic_measurements(), memory_bytes=1e9,
                                        gpus_per_node=1, main_precision="bf16", datasheet_peaks={"bf16": 400.0})
    # A malformed alone section is refused whichever case reads the profile (a case of two passed it),
    # its figures named where the section holds them (alone.peak_tflops.bf16 was named gpu.peak_tflops…).
    # A peak that is no mapping was passed over: a case of one rank took the peak all ranks shared.
    for bad, key in ((3, "alone"), ({**alone, "peak_tflops": {"bf16": 0}}, "alone.peak_tflops.bf16"),
                     ({**alone, "peak_tflops": 500}, "alone.peak_tflops"),
                     ({**alone, "performance": {"gemm_efficiency": float("nan")}}, "alone.performance.gemm_efficiency")):
        path.write_text(render({**profile, "alone": bad}))
        for num_gpus in (1, 2):
            with pytest.raises(CaseError) as error:
                gpu(num_gpus)
            assert error.value.key == key, (bad, num_gpus)


def test_the_header_of_a_profile_says_what_each_of_its_sections_holds():
    """A profile is read by people as well as by the planner: each section calibrate writes is named in
    the comment it opens with (machine and alone, the one-rank figures a case of one GPU takes, were not)."""
    m = synthetic_measurements()
    m.alone = synthetic_measurements(eta=0.7)
    text = render(build_profile({"device": "x", "backend": "gloo"}, m, memory_bytes=1e9, gpus_per_node=2,
                                main_precision="bf16"))
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    sections = [line.split(":")[0] for line in text.splitlines() if line and not line[0] in "# -"]
    assert sections == ["machine", "gpu", "performance", "fabric", "alone", "measurements"]
    for section in sections:
        assert re.search(rf"\b{section}\b", header), section


def test_without_a_datasheet_the_peak_is_the_best_measured_gemm():
    m = synthetic_measurements()
    profile = build_profile({}, m, memory_bytes=1e9, gpus_per_node=2, main_precision="bf16")
    best = max(s.flops / t[0] for s, t in m.gemm["bf16"])
    assert profile["gpu"]["peak_tflops"]["bf16"] == pytest.approx(best / 1e12, rel=1e-5)
    assert 0 < profile["performance"]["gemm_efficiency"] <= 1


# --- failure diagnosis from the ranks' records ---------------------------------------------

def rank(step, stage="gemm", in_comm=False, status="running", error=None, exit=None):
    info = {"step": step, "stage": stage, "label": "", "in_comm": in_comm, "status": status, "error": error}
    if exit is not None:
        info["exit"] = exit
    return info


def test_diagnosis_names_the_rank_that_died_not_those_torn_down_after_it():
    ranks = {0: rank(5, in_comm=True, status="error", error="DistBackendError: connection closed",
                     exit={"code": PEER_FAILURE_EXIT, "terminated": False, "time": 1.0}),
             1: rank(4, exit={"code": 3, "terminated": False, "time": 2.0}),
             2: rank(5, exit={"code": -15, "terminated": True, "time": 3.0})}
    assert diagnose(ranks, [0, 1, 2]) == "rank 1 exited with code 3 during the GEMM benchmarks"
    ranks[1]["exit"]["code"] = -9
    assert "rank 1 was killed by SIGKILL" in diagnose(ranks, [0, 1, 2])


def test_diagnosis_orders_failures_by_when_the_workers_failed_not_when_their_exits_were_seen():
    """Rank 1 raises and dies; rank 0's socket to it breaks outside a marked collective, so it
    exits with an error of its own, and its supervisor happens to record that first."""
    ranks = {0: {**rank(3, "warmup", status="error", error="RuntimeError: Connection closed by peer",
                      exit={"code": 1, "terminated": False, "time": 100.2}), "time": 100.1},
             1: {**rank(3, "warmup", status="error", error="RuntimeError: injected fault at warmup",
                      exit={"code": 1, "terminated": False, "time": 100.4}), "time": 100.0}}
    assert diagnose(ranks, [0, 1]) == "rank 1 failed during the warm-up steps: RuntimeError: injected fault at warmup"


def test_diagnosis_names_a_rank_that_recorded_its_own_error_even_when_its_end_was_recorded_as_stopped():
    """Rank 1 records its error and exits; rank 0's barrier breaks on it, and the launcher's
    teardown reaches rank 1's supervisor before that supervisor has seen its worker end (seen
    once in a fresh-clone run on two loaded cores, where it was then called a hang)."""
    ranks = {0: {**rank(3, "warmup", in_comm=True, status="error", error="DistBackendError: connection closed",
                      exit={"code": PEER_FAILURE_EXIT, "terminated": False, "time": 100.2}), "comm_error": True,
                 "time": 100.1},
             1: {**rank(3, "warmup", status="error", error="RuntimeError: injected fault at warmup",
                      exit={"code": 1, "terminated": True, "time": 100.5}), "comm_error": False, "time": 100.0}}
    expected = "rank 1 failed during the warm-up steps: RuntimeError: injected fault at warmup"
    assert diagnose(ranks, [0, 1]) == expected
    del ranks[1]["exit"]  # its supervisor killed before it wrote the exit record
    assert diagnose(ranks, [0, 1]) == expected


def test_diagnosis_of_a_hang_names_the_rank_behind():
    ranks = {0: rank(7, "collectives", in_comm=True), 1: rank(6, "collectives"), 2: rank(7, in_comm=True)}
    assert diagnose(ranks, [0, 1, 2], stalled_s=30).startswith("rank 1 hung during the collective benchmarks")
    assert diagnose({0: rank(1)}, [0, 1], stalled_s=30) == "rank 1 did not start within 30 s"


def test_a_lone_rank_that_ended_unrecorded_is_not_said_to_have_kept_others_waiting():
    """One rank whose records stop (TMPDIR full: its progress could not be written) and whose torchrun
    exited was "rank 0 hung during start-up: the others timed out waiting for it", where there are no
    others: the records name no cause, and the launcher's own error is given instead. A stall the
    watchdog saw is still the rank's hang."""
    assert diagnose({0: rank(1)}, [0]) is None
    assert diagnose({0: rank(1)}, [0], stalled_s=30).startswith("rank 0 hung")
    assert diagnose({0: rank(6, "collectives"), 1: rank(7, in_comm=True)}, [0, 1]).endswith(
        "the others timed out waiting for it")


def test_the_watchdog_allows_set_up_longer_than_a_measured_step():
    """Ten seconds without progress stop a rank in its warm-up steps (stall 5 s), not one still
    building its model, nor one not yet reported, which have the start-up allowance (120 s)."""
    from calibration.supervisor import _waits

    ranks = {0: rank(3, "build"), 1: rank(4, "warmup"), 3: {**rank(9, "train"), "status": "done"}}
    waits = list(_waits(ranks, [0, 1, 2, 3], {0: 5.0, 1: 5.0}, 0.0, 15.0, stall_s=5.0))
    assert waits == [(10.0, 120.0), (10.0, 5.0), (15.0, 120.0)]
    assert list(_waits(ranks, [0, 1], {}, 0.0, 15.0, stall_s=None)) == []


def test_a_worker_that_ended_before_the_teardown_is_recorded_as_ending_on_its_own(tmp_path, monkeypatch):
    """A rank's worker exits with a fault of its own (code 3); its peer fails on the broken
    connection first and torchrun's teardown (SIGTERM) reaches this rank's supervisor before the
    supervisor has noticed its worker's end. The worker was not stopped: its exit record must say
    so, or the launcher names no cause and reports a hang (what CI saw on a loaded machine)."""
    import json
    import signal

    from calibration import run
    from calibration.progress import exit_path

    class EndedChild:  # already exited with 3 when the teardown's signal arrives
        signalled = False

        def __init__(self, *args, **kwargs):
            pass

        def wait(self, timeout=None):
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # the teardown, before the loop sees the end
            return 3

        def poll(self):
            return 3

        def send_signal(self, signum):
            EndedChild.signalled = True

    monkeypatch.setattr(run.subprocess, "Popen", EndedChild)
    monkeypatch.setenv("RANK", "1")
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        assert run.supervise(["--workdir", str(tmp_path), "calibration.worker"]) == 3
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
    record = json.loads(exit_path(tmp_path, 1).read_text())
    assert (record["code"], record["terminated"], EndedChild.signalled) == (3, False, False)
    ranks = {0: {**rank(1, "train"), "status": "error", "error": "RuntimeError: connection closed",
                 "comm_error": True, "exit": {"code": PEER_FAILURE_EXIT, "terminated": False}},
             1: {**rank(1, "train"), "exit": record}}
    assert diagnose(ranks, [0, 1]) == "rank 1 exited with code 3 during the timed steps"


def test_stopping_a_run_returns_when_every_process_below_it_has_ended():
    """kill_all walks the tree, in which torchrun starts each rank in a session of its own, and
    returns once the processes it killed have ended: SIGKILL is delivered at once, but a process
    holding memory takes a moment to end, and until then the run has not stopped. Without the
    wait, ranks of 300 MB were still running when it returned, in every try."""
    from calibration.processes import alive, descendants, kill_all

    rank = ("import sys, time; b = bytearray(300 << 20); b[::4096] = bytes(len(b[::4096])); "
            "print(flush=True); time.sleep(600)")
    launcher = (f"import subprocess, sys, time; ranks = [subprocess.Popen([sys.executable, '-c', {rank!r}], "
                "start_new_session=True, stdout=sys.stdout) for _ in range(2)]; time.sleep(600)")
    process = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, start_new_session=True)
    try:
        for _ in range(2):  # each rank's memory is touched
            assert process.stdout.readline() == b"\n"
        ranks = descendants(process.pid)
        assert len(ranks) == 2
        kill_all(process)
        assert [pid for pid in ranks if alive(pid)] == []
    finally:
        if process.poll() is None:
            kill_all(process)


def test_a_second_interrupt_while_the_run_is_stopped_waits_for_every_process_to_end(monkeypatch):
    """A second Ctrl-C 10 ms after the first reached kill_all between its freeze (SIGSTOP) and its
    kill: the interrupt was raised there and torchrun with every rank stayed stopped for good. It now
    waits for the kill, and is raised after it where it was the first."""
    from calibration import processes
    from planner.errors import Interrupted, forget_interrupts, interrupt, interrupts_deferred

    launcher = ("import subprocess, sys, time; ranks = [subprocess.Popen([sys.executable, '-c', "
                "'import time; time.sleep(600)'], start_new_session=True) for _ in range(2)]; "
                "print(flush=True); time.sleep(600)")
    process = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, start_new_session=True)
    send = processes._send

    def interrupted_send(pids, sig):
        send(pids, sig)
        if sig == signal.SIGSTOP:  # the tree frozen: Ctrl-C again
            interrupt("SIGINT")

    monkeypatch.setattr(processes, "_send", interrupted_send)
    forget_interrupts()
    try:
        assert process.stdout.readline() == b"\n"
        deadline = time.monotonic() + 30
        while len(processes.descendants(process.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        ranks = processes.descendants(process.pid)
        with pytest.raises(Interrupted):  # the first interrupt of the command: raised once the kill is done
            processes.kill_all(process)
        assert process.poll() is not None and [pid for pid in ranks if running(pid)] == []
        # Where the clean-up runs for an interrupt already on its way, a second one is not raised again.
        with interrupts_deferred():
            interrupt("SIGTERM")
    finally:
        forget_interrupts()
        if process.poll() is None:
            monkeypatch.setattr(processes, "_send", send)
            processes.kill_all(process)


# --- end to end: torchrun, 2 gloo ranks --------------------------------------------------------

def calibrate(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    # --allow-busy: these runs check what calibrate does, not its figures, on a machine others share
    return subprocess.run([sys.executable, "-m", "planner", "calibrate", *args, "--allow-busy"], capture_output=True,
                          text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})})


def errors(stderr: str) -> list[str]:
    """stderr less the warnings a busy machine gives (--allow-busy)."""
    return [line for line in stderr.strip().splitlines() if not line.startswith("warning: ")]


def test_quick_calibration_writes_a_profile_the_planner_uses(tmp_path):
    out = tmp_path / "profiles" / "cpu.yaml"
    result = calibrate("--out", str(out), "--quick", "--nproc", "2")
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}" in result.stdout
    # Said as it is written, as every estimate on it says it (its figures printed without a word: its memory
    # bandwidth 3.8x this CPU's, its all-reduce 1/6, timed on tiny shapes).
    assert f"warning: {out} was written by `calibrate --quick`: a smoke test of tiny shapes" in result.stderr
    profile = yaml.safe_load(out.read_text())
    assert profile["machine"]["backend"] == "gloo" and profile["machine"]["world_size"] == 2
    assert set(profile["gpu"]["peak_tflops"]) == {"fp32"}  # a CPU run times fp32 only
    assert profile["gpu"]["gpus_per_node"] == 2
    assert set(profile["measurements"]["collectives"]["intra_node"]) == {"all_reduce", "all_gather",
                                                                          "reduce_scatter", "p2p"}
    point = profile["measurements"]["gemm"]["fp32"]["points"][0]
    assert point["p10_s"] <= point["median_s"] <= point["p90_s"]
    overlap = profile["measurements"]["overlap"]["all_reduce_beside_gemms"]
    assert 0 <= overlap["p10"] <= overlap["median"] <= overlap["p90"] <= 1
    assert profile["performance"]["comm_overlap"] == pytest.approx(overlap["mean"], rel=1e-3)
    assert 0 <= overlap["mean"] <= 1
    case = {"model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 512},
            "cluster": {"profile": str(out), "num_gpus": 2},
            "training": {"global_batch_size": 8, "seq_len": 64, "precision": "fp32"},
            "layout": {"dp": 2, "tp": 1, "pp": 1, "micro_batch_size": 2}}
    loaded = load_case(case)
    assert loaded.cluster.gpu.performance.gemm_efficiency == profile["performance"]["gemm_efficiency"]
    # Rank 0 timed the training precision's GEMMs and each element-wise kernel again alone.
    alone = profile["measurements"]["alone"]
    assert len(alone["gemm"]["fp32"]["points"]) == len(profile["measurements"]["gemm"]["fp32"]["points"])
    assert set(alone["memory"]) >= {"copy", "add", "gelu", "fill", "fill_fresh"}
    assert profile["performance"]["page_fault_s"] >= 0  # a quick 1 MiB buffer may come from the heap: 0
    # What a rank's process held before its first tensor, against a fresh gloo rank measured here alike
    # (VmRSS after import torch and a group of one; the ranks also hold calibrate's own modules): 10 %.
    process = parse_memory(profile["gpu"]["cpu_process"])
    assert process == pytest.approx(measured_rss(tmp_path), rel=0.10)
    assert loaded.overheads.cpu_process == process  # the profile's figure, not the development machine's
    one_rank = load_case({**case, "cluster": {"profile": str(out), "num_gpus": 1},
                          "layout": {"dp": 1, "tp": 1, "pp": 1, "micro_batch_size": 2}})
    assert one_rank.cluster.gpu.performance.gemm_efficiency == profile["alone"]["performance"]["gemm_efficiency"]
    estimate = planner.estimate(case)
    assert estimate.fits and 0 < estimate.to_dict()["step_time_s"] < math.inf
    assert not list(out.parent.glob(".*"))  # no temporary file left beside the profile
    timed = profile["machine"]["reference_gemm_tflops"]  # this machine's speed, for validate to compare with
    assert timed["before"] > 0 and timed["after"] > 0
    assert f"reference GEMM {timed['before']} TFLOP/s before the ranks, {timed['after']} after" in result.stdout


def test_a_rank_that_dies_fails_the_run_naming_it_and_leaves_the_old_profile(tmp_path):
    out = tmp_path / "profile.yaml"
    out.write_text("old\n")
    result = calibrate("--out", str(out), "--quick", "--force", "--timeout", "30",
                       env={FAULT_ENV: "1:gemm:exit"})
    assert result.returncode == 4
    lines = errors(result.stderr)
    assert len(lines) == 1 and "rank 1 exited with code 3" in lines[0] and "no profile written" in lines[0]
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["profile.yaml"]


def test_a_rank_that_hangs_is_stopped_within_the_timeout(tmp_path):
    """The watchdog's timeout is what a quick step needs on a loaded 2-core machine, many times
    over (start-up has its own allowance: ``calibration.supervisor.STARTUP_S``); what is asserted
    is that the hung run was stopped and named, and left nothing."""
    out = tmp_path / "profile.yaml"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    seen: set[int] = set()

    def note_ranks() -> None:
        for record in scratch.glob("*/rank*.json"):
            try:
                info = json.loads(record.read_text())
            except (OSError, ValueError):
                continue
            seen.update(p for p in (info.get("pid"), info.get("ppid")) if isinstance(p, int))

    process = subprocess.Popen([sys.executable, "-m", "planner", "calibrate", "--out", str(out), "--quick",
                                "--timeout", "7", "--allow-busy"], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env={**os.environ, FAULT_ENV: "1:attention:hang", "TMPDIR": str(scratch)})
    while process.poll() is None:
        note_ranks()
        time.sleep(0.2)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 4, stderr
    (line,) = errors(stderr)
    assert line.startswith("error: calibration failed: rank 1 hung during the attention benchmarks")
    assert not out.exists() and not list(scratch.iterdir())
    assert seen and not [pid for pid in seen if running(pid)]


def test_an_interrupted_run_writes_nothing_and_stops_every_rank(tmp_path):
    out = tmp_path / "profile.yaml"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "planner", "calibrate", "--out", str(out), "--quick",
                                "--allow-busy"],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, FAULT_ENV: "1:memory:hang", "TMPDIR": str(scratch)})
    pids: set[int] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not pids:  # wait until rank 1 is stuck in the memory benchmarks
        for record in scratch.glob("*/rank1.json"):
            try:
                info = json.loads(record.read_text())
            except ValueError:
                continue
            if info.get("stage") == "memory":
                pids = {info["pid"], info["ppid"]}
        time.sleep(0.1)
    assert pids, "rank 1 never reached the memory benchmarks"
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert errors(stderr) == ["error: calibration interrupted; no profile written"]
    assert not out.exists() and not list(scratch.iterdir())
    time.sleep(0.5)
    assert not [pid for pid in pids if running(pid)]


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


def test_calibrate_refuses_more_ranks_than_the_machine_has_and_an_unwritable_out_up_front(tmp_path):
    start = time.monotonic()
    result = calibrate("--out", str(tmp_path / "p.yaml"), "--nproc", "10000", timeout=60)
    assert result.returncode == 2 and "--nproc" in result.stderr and "expected at most" in result.stderr
    (tmp_path / "file").write_text("")
    result = calibrate("--out", str(tmp_path / "file" / "p.yaml"), "--quick", timeout=60)
    assert result.returncode == 2 and "--out" in result.stderr and "is not a folder" in result.stderr
    assert time.monotonic() - start < 30  # refused before any rank starts
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_calibrate_refuses_bad_arguments_before_starting(tmp_path):
    existing = tmp_path / "profile.yaml"
    existing.write_text("old\n")
    result = calibrate("--out", str(existing), "--quick")
    assert result.returncode == 2 and "exists; pass --force" in result.stderr
    result = calibrate("--out", str(tmp_path / "new.yaml"), "--case", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2 and "file not found" in result.stderr
    assert not (tmp_path / "new.yaml").exists()


@pytest.mark.parametrize("args, needle", [
    (("--timeout", "nan"), "--timeout: expected seconds from 1 to 86400"),  # started torchrun, then "hung"
    (("--timeout", "1e308"), "--timeout: expected seconds from 1 to 86400"),
    (("--nnodes", "2", "--rdzv-endpoint", "nohost:notaport"), "--rdzv-endpoint: expected HOST:PORT"),
    (("--nproc", "100000"), "--nproc: expected at most"),  # refused, but after 1.8 s of importing torch
    # One node meets on its own: the endpoint went unused, exit 0 (a 5,000-character host, with two
    # nodes, waited out the two-minute start-up).
    (("--rdzv-endpoint", "bogus.invalid:1"), "--rdzv-endpoint: is where the nodes of a run over several meet"),
    (("--nnodes", "2", "--rdzv-endpoint", "h" * 5000 + ":29500"), "--rdzv-endpoint: expected a host name of at most 253"),
    # torch's parse_rendezvous_endpoint refuses these names once torchrun has started (exit 4 after 5 s).
    (("--nnodes", "2", "--rdzv-endpoint", "a b:1"), "--rdzv-endpoint: expected a host name of letters"),
    (("--nnodes", "2", "--rdzv-endpoint", "[::1]:80:1"), "--rdzv-endpoint: expected a host name of letters"),
    (("--nnodes", "2", "--rdzv-endpoint", "ho\nst:80"), "--rdzv-endpoint: expected a host name of letters"),
    # --quick times tiny shapes: the profile named the case whose shapes it never timed.
    (("--quick", "--case", "examples/llama3-70b-h100.yaml"), "--case: times the case's own shapes, which --quick"),
])
def test_calibrate_refuses_bad_options_within_a_second(tmp_path, args, needle):
    start = time.monotonic()
    result = calibrate("--out", str(tmp_path / "p.yaml"), *args, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and needle in result.stderr, result.stderr
    assert time.monotonic() - start < 3  # a fresh process's imports included: nothing started
    assert not list(tmp_path.iterdir())


def test_fp32_gemms_timed_beside_bf16_get_their_own_efficiency(tmp_path):
    """A GPU calibration times TF32 GEMMs beside bf16 ones: each fit against its own datasheet
    peak, so an fp32 case is priced at what TF32 kernels reach, not at bf16's share."""
    m = synthetic_measurements(eta=0.61, peak=400e12)
    shapes = [s for s, _ in m.gemm["bf16"]]
    m.gemm["fp32"] = [(s, [s.flops / (0.45 * 200e12) + 2e-5] * 3) for s in shapes]
    profile = build_profile({"device": "Synthetic GPU", "backend": "nccl"}, m, memory_bytes=80 * 2**30,
                            gpus_per_node=8, main_precision="bf16", datasheet_peaks={"bf16": 400.0, "tf32": 200.0})
    perf = profile["performance"]
    assert perf["gemm_efficiency"] == pytest.approx(0.61, rel=1e-3)
    assert perf["gemm_efficiency_fp32"] == pytest.approx(0.45, rel=1e-3)
    path = tmp_path / "profile.yaml"
    path.write_text(render(profile))
    gpu, _ = gpu_from_profile(path)
    assert gpu.performance.gemm_efficiency_for("fp32") == perf["gemm_efficiency_fp32"]
    assert gpu.performance.gemm_efficiency_for("bf16") == perf["gemm_efficiency"]
    # A CPU times fp32 alone: its fit is the one efficiency there is.
    cpu = synthetic_measurements()
    cpu.gemm, cpu.attention_precision = {"fp32": m.gemm["fp32"]}, "fp32"
    cpu_perf = build_profile({"device": "cpu"}, cpu, memory_bytes=1e9, gpus_per_node=2, main_precision="fp32",
                             datasheet_peaks={"fp32": 200.0})["performance"]
    assert cpu_perf["gemm_efficiency"] == pytest.approx(0.45, rel=1e-3) and "gemm_efficiency_fp32" not in cpu_perf


def test_the_busy_warning_under_allow_busy_does_not_ask_for_allow_busy():
    """`validate --allow-busy` on a busy machine warned "... or pass --allow-busy to measure anyway"."""
    from calibration.host import busy_reason, measuring_anyway

    refusal = busy_reason(0.9)
    assert refusal.endswith("pass --allow-busy to measure anyway")
    warning = measuring_anyway(refusal)
    assert "pass --allow-busy" not in warning and warning.endswith("measuring anyway (--allow-busy)")
    assert warning.startswith("other processes use 90% of this machine's CPU time")


@pytest.mark.parametrize("where", ["the run folder is made", "the progress bar starts"])
def test_an_interrupt_as_a_calibration_sets_up_leaves_no_run_folder(tmp_path, monkeypatch, where):
    """The run folder (layout-planner-calibrate-* in the temporary folder) was made before the block that
    removes it: a Ctrl-C landing as mkdtemp returned, or while the progress bar started (rich's, on a
    terminal: imports and a thread), left it behind for good. The signal is sent at that moment here,
    and answered by the CLI's handler; the temporary folder must be as it was, and no profile written."""
    import tempfile

    from calibration import launch
    from planner import cli
    from planner.errors import Interrupted, forget_interrupts

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setattr(launch, "reference_gemm_tflops", lambda threads: 1.0)  # its seconds of GEMMs play no part
    hooked = (tempfile, "mkdtemp") if where == "the run folder is made" else (launch, "_ProgressBar")
    real = getattr(*hooked)

    def then_interrupted(*args, **kwargs):
        made = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs as soon as this returns
        return made

    monkeypatch.setattr(*hooked, then_interrupted)
    previous = signal.signal(signal.SIGINT, cli._interrupted)
    forget_interrupts()
    try:
        with pytest.raises(Interrupted):
            launch.calibrate(tmp_path / "profile.yaml", quick=True, nproc=1, allow_busy=True, show_progress=False,
                             warn=lambda line: None)
    finally:
        signal.signal(signal.SIGINT, previous)
        forget_interrupts()
    assert list(scratch.iterdir()) == [] and not (tmp_path / "profile.yaml").exists()


def test_an_interrupt_as_a_validate_run_folder_is_made_leaves_none(tmp_path, monkeypatch):
    """validate's run folder (layout-planner-validate-*), as calibrate's: a signal landing as mkdtemp
    returned, before the block that removes it, left it behind. Nothing of the spec is read before."""
    import tempfile

    from calibration import train
    from planner import cli
    from planner.errors import Interrupted, forget_interrupts

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    real = tempfile.mkdtemp

    def then_terminated(*args, **kwargs):
        made = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return made

    monkeypatch.setattr(tempfile, "mkdtemp", then_terminated)
    previous = signal.signal(signal.SIGTERM, cli._interrupted)
    forget_interrupts()
    try:
        with pytest.raises(Interrupted):
            train.launch(None)  # type: ignore[arg-type]  # interrupted before the spec is written
    finally:
        signal.signal(signal.SIGTERM, previous)
        forget_interrupts()
    assert list(scratch.iterdir()) == []
