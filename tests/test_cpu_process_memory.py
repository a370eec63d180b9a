"""What a rank holds outside the priced peak: on a CPU profile the process itself (measured), not a CUDA
context. A CPU profile of 12.6 GB was left 11.4 GB usable: 1 GiB of CUDA context taken off a machine that
has none."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cost_models.memory import outside_allocator, usable_bytes
from cost_models.training_spec import Overheads
from cost_models.hardware import GPUSpec
from planner.case_cluster import gpu_from_profile
from process_rss import measured_rss

DEV_PROFILE = Path(__file__).resolve().parents[1] / "calibration" / "profiles" / "cpu-2core-dev.yaml"


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="VmRSS is Linux's")
def test_a_cpu_profile_leaves_capacity_less_headroom_less_the_measured_process(tmp_path):
    rss = measured_rss(tmp_path)
    gpu, o = gpu_from_profile(DEV_PROFILE)[0], Overheads()
    capacity = gpu.memory_bytes  # the dev profile's 11.7703 GiB
    usable = usable_bytes(gpu, o, 0.01)
    # Within 10 % of the process on the machine running the test: the stored figure is the dev machine's
    # (5 runs within 0.3 MB of each other there); another machine loads the same wheels but may touch a few
    # more pages. The CUDA context it replaces was 4.6 times as much.
    assert usable == pytest.approx(capacity * 0.99 - rss, abs=0.10 * rss)
    assert usable > capacity * 0.99 - 2**30 + 0.5 * 2**30  # not the CUDA context
    assert outside_allocator(gpu, o)[0] == "the CPU process"


def test_a_gpu_still_leaves_capacity_less_headroom_less_the_cuda_context():
    gpu = GPUSpec(name="NVIDIA H100 80GB HBM3", memory_bytes=80 * 2**30, peak_flops={"bf16": 989e12},
                  hbm_bandwidth=3.35e12, intra_node_bandwidth=450e9, inter_node_bandwidth=50e9, gpus_per_node=8,
                  nvlink_domain=8)
    assert usable_bytes(gpu, Overheads(), 0.01) == gpu.memory_bytes * 0.99 - 2**30
    assert outside_allocator(gpu, Overheads()) == ("the CUDA context", 2**30)


def test_calibrate_of_one_rank_says_one_rank():
    from planner.cli import wrote_line
    assert wrote_line("one.yaml", 1, 12.3) == "wrote one.yaml (1 rank, 12 s)"
    assert wrote_line("two.yaml", 2, 12.3) == "wrote two.yaml (2 ranks, 12 s)"


# A case on a CPU profile: what the profile's gpu.cpu_process moves is its usable memory, nothing else.
CASE = {"model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 512},
        "training": {"global_batch_size": 8, "seq_len": 64, "precision": "fp32"},
        "layout": {"dp": 2, "tp": 1, "pp": 1, "micro_batch_size": 2}}


def profile_with(tmp_path: Path, value) -> Path:
    """The dev profile with ``gpu.cpu_process`` set to ``value``, as `calibrate` now writes it."""
    import yaml
    data = yaml.safe_load(DEV_PROFILE.read_text())
    data["gpu"] = {"memory": data["gpu"]["memory"], "cpu_process": value,
                   **{k: v for k, v in data["gpu"].items() if k != "memory"}}
    path = tmp_path / "measured.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def usable_of(profile: Path, overheads: dict | None = None) -> float:
    from planner.case import load_case
    case = load_case({**CASE, "cluster": {"profile": str(profile), "num_gpus": 2},
                      **({"overheads": overheads} if overheads else {})})
    return usable_bytes(case.cluster.gpu, case.overheads, case.search.headroom)


def test_a_profiles_measured_process_moves_usable_memory_by_exactly_its_figure(tmp_path):
    measured = profile_with(tmp_path, "500 MiB")
    # The dev profile has none: the stored default (232 MB) is taken off; the profile's 500 MiB in its place.
    assert usable_of(DEV_PROFILE) - usable_of(measured) == 500 * 2**20 - Overheads().cpu_process
    # A case's own overheads.cpu_process still overrides the profile's.
    assert usable_of(measured, {"cpu_process": "300 MiB"}) - usable_of(measured) == 200 * 2**20


def test_a_profile_without_the_measured_process_says_it_takes_the_default(tmp_path):
    import yaml
    from planner.case import warnings_of_profile
    note = "has no gpu.cpu_process (written before `calibrate` measured it): a rank's process is taken as 232 MB"
    assert any(note in w for w in warnings_of_profile("dev.yaml", yaml.safe_load(DEV_PROFILE.read_text())))
    measured = profile_with(tmp_path, "500 MiB")
    assert not any("cpu_process" in w for w in warnings_of_profile(str(measured), yaml.safe_load(measured.read_text())))


@pytest.mark.parametrize("value", ["-5 MiB", "lots", 232, None])
def test_a_bad_measured_process_is_refused_naming_the_file_and_key(tmp_path, value):
    from planner.errors import CaseError
    profile = profile_with(tmp_path, value)
    with pytest.raises(CaseError) as error:
        usable_of(profile)
    message = str(error.value)
    assert message.startswith(f"{profile}: gpu.cpu_process: expected a ") and "memory size" in message
    assert "\n" not in message


def test_a_bad_measured_process_exits_2_in_one_line(tmp_path):
    import yaml
    profile = profile_with(tmp_path, "-5 MiB")
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump({**CASE, "cluster": {"profile": str(profile), "num_gpus": 2}}))
    done = subprocess.run([sys.executable, "-m", "planner", "estimate", str(case)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{profile}: gpu.cpu_process: expected a memory size" in lines[0], done.stderr
