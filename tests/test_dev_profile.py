"""The repo's development profile (calibration/profiles/cpu-2core-dev.yaml) states every figure as
`calibrate` fits it now from the timings it stores. Figures fitted under older formulas had stayed in it
while the code moved on: its attention under an older count of passes (3, 0.2897) with its performance copy
rescaled by hand (0.338); its memory figures under one element-wise share that averaged the add with the
tanh GeLU (hbm_efficiency 0.5872 of the copy's 12.54 GB/s, before 786d642 fitted the GeLU apart and took the
fastest streaming kernel as the bandwidth); its collectives' bus bandwidth over every message size (before
63f1fee read it from the large messages): the file priced figures neither the code nor its own timings gave.

What the run timed decides what can be refitted: a figure whose benchmark it did not run (the in-place add,
the fills, rank 0 alone) is not stated, and comm_overlap, now the mean of samples of which the file keeps
only the median, is the one figure left as the run wrote it (docs/calibration.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from calibration.profile import Measurements, build_profile, compute_figures
from calibration.shapes import AttentionShape, GemmShape
from planner.units import parse_bandwidth, parse_memory

PROFILE = Path(__file__).resolve().parent.parent / "calibration" / "profiles" / "cpu-2core-dev.yaml"
# The profile stores each median at 4 significant figures (calibration.profile.spread): refitted from them,
# a figure moves by up to about a unit of its own fourth figure (0.8198 for the 0.8197 fitted to the raw ones).
STORED_ROUNDING = 1e-3
# The one performance figure the stored timings cannot give: calibrate takes the mean of the overlap
# samples (38fc9ac), and this run, from before that, kept only their median, p10 and p90.
NOT_REFITTABLE = {"comm_overlap"}


def _stored() -> dict:
    return yaml.safe_load(PROFILE.read_text())


def _measurements(data: dict) -> Measurements:
    """The profile's stored medians as the timings `calibrate` gathers, one sample each."""
    stored = data["measurements"]
    m = Measurements()
    m.gemm["fp32"] = [(GemmShape(p["name"], p["m"], p["n"], p["k"], p.get("model_m")), [p["median_s"]])
                      for p in stored["gemm"]["fp32"]["points"]]
    m.attention = [(AttentionShape(p["name"], p["batch"], p["heads"], p["kv_heads"], p["seq_len"], p["head_dim"]),
                    [p["median_s"]]) for p in stored["attention"]["points"]]
    m.memory = {op: [(p["tensor_bytes"], p["bytes_moved"], [p["median_s"]]) for p in points]
                for op, points in stored["memory"].items() if isinstance(points, list)}
    m.collectives = {link: {kind: (d["group_size"], [(p["bytes"], [p["median_s"]]) for p in d["points"]])
                            for kind, d in kinds.items()}
                     for link, kinds in stored["collectives"].items()}
    return m


def _refitted(data: dict) -> dict:
    """The profile `calibrate` writes from the stored timings (a CPU's: gloo ranks, so tiled_attention off)."""
    assert data["machine"]["backend"] == "gloo"
    return build_profile(data["machine"], _measurements(data), memory_bytes=parse_memory(data["gpu"]["memory"]),
                         gpus_per_node=data["gpu"]["gpus_per_node"], main_precision="fp32")


def test_the_dev_profiles_gemm_and_attention_figures_are_its_stored_timings_fitted_as_calibrate_fits_them():
    data = _stored()
    stored = data["measurements"]
    _, performance, measured, _ = compute_figures(_measurements(data), "fp32", None, tiled_attention=False)
    for key in ("gemm_efficiency", "kernel_overhead_s", "attention_efficiency"):
        assert data["performance"][key] == pytest.approx(performance[key], rel=STORED_ROUNDING), key
    assert stored["gemm"]["fp32"]["fit"]["gemm_efficiency"] == pytest.approx(
        measured["gemm"]["fp32"]["fit"]["gemm_efficiency"], rel=STORED_ROUNDING)
    assert stored["attention"]["fit"]["attention_efficiency"] == pytest.approx(
        measured["attention"]["fit"]["attention_efficiency"], rel=STORED_ROUNDING)
    assert stored["attention"]["fit"]["rms_relative_error"] == pytest.approx(
        measured["attention"]["fit"]["rms_relative_error"], rel=STORED_ROUNDING * 10)  # written at 3 figures
    # Each point's rate is 3.5 forward passes over its median (calibration.fit.ATTENTION_PASSES).
    for written, fitted in zip(stored["attention"]["points"], measured["attention"]["points"]):
        assert written["tflops"] == pytest.approx(fitted["tflops"], rel=STORED_ROUNDING), written["name"]


def test_every_performance_figure_of_the_dev_profile_is_its_stored_timings_refitted():
    """The memory shares and the collectives' included: hbm_efficiency is the copy and add's share of the
    fastest streaming kernel timed (the add here, 14.46 GB/s), transcendental_efficiency the tanh GeLU's;
    all_gather and reduce_scatter_efficiency the ratios of bus bandwidths read from the large messages."""
    data = _stored()
    refit = _refitted(data)["performance"]
    stated = data["performance"]
    for key, value in refit.items():
        assert key in stated, f"performance.{key}: the stored timings give {value}, the file states none"
        assert stated[key] == pytest.approx(value, rel=STORED_ROUNDING), key
    # The file states nothing its timings do not give, but the one figure they cannot: and a figure it left out
    # is priced at its fallback, in_place_efficiency at hbm_efficiency (no in-place add was timed).
    assert set(stated) - set(refit) == NOT_REFITTABLE
    assert "add_in_place" not in data["measurements"]["memory"] and "in_place_efficiency" not in stated


def test_the_dev_profiles_bandwidths_and_fits_are_its_stored_timings_refitted():
    data = _stored()
    refit = _refitted(data)
    for key in ("hbm_bandwidth", "intra_node_bandwidth", "inter_node_bandwidth"):
        assert parse_bandwidth(data["gpu"][key]) == pytest.approx(parse_bandwidth(refit["gpu"][key]),
                                                                  rel=STORED_ROUNDING), key
    assert data["gpu"]["peak_tflops"]["fp32"] == pytest.approx(refit["gpu"]["peak_tflops"]["fp32"], rel=STORED_ROUNDING)
    memory, refit_memory = data["measurements"]["memory"], refit["measurements"]["memory"]
    for key in ("hbm_bandwidth_gb_s", "elementwise_gb_s"):
        assert memory[key] == pytest.approx(refit_memory[key], rel=STORED_ROUNDING), key
    for link, kinds in refit["measurements"]["collectives"].items():
        for kind, fitted in kinds.items():
            written = data["measurements"]["collectives"][link][kind]["fit"]
            where = f"measurements.collectives.{link}.{kind}.fit"
            for key in ("latency_s", "bus_bandwidth_gb_s"):
                assert written[key] == pytest.approx(fitted["fit"][key], rel=STORED_ROUNDING), f"{where}.{key}"
            assert written["rms_relative_error"] == pytest.approx(  # written at 3 figures
                fitted["fit"]["rms_relative_error"], rel=STORED_ROUNDING * 10), f"{where}.rms_relative_error"
