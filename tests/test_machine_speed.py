"""A machine slower than when it was profiled, and GPUs others use: what `calibrate` and
`validate` measure before they time anything, and what they do about it
(``calibration/speed.py``, ``calibration/host.py``)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calibration.host import gpu_busy_reason, gpu_use, visible_gpus
from calibration.speed import SLOWER_SHARE, Speed, moved_reason, profiled_speed

REPO = Path(__file__).resolve().parent.parent


def test_the_speed_ratio_is_the_slower_timing_over_the_profiles():
    assert profiled_speed({"reference_gemm_tflops": {"before": 0.16, "after": 0.14}}) == pytest.approx(0.15)
    assert profiled_speed({"reference_gemm_tflops": {"before": 0.16}}) == 0.16
    assert profiled_speed({}) is None and profiled_speed({"reference_gemm_tflops": {"before": None}}) is None
    slowed = Speed(profiled=0.15, before=0.14, after=0.129)
    assert slowed.ratio == pytest.approx(0.129 / 0.15)
    assert "14% slower" in slowed.slower_reason() and "0.129 against 0.15 TFLOP/s" in slowed.slower_reason()
    assert Speed(profiled=0.15, before=0.136).slower_reason() is None  # 9.3 % slower: within SLOWER_SHARE
    assert Speed(profiled=0.15, before=0.2, after=0.3).ratio == pytest.approx(0.2 / 0.15)  # faster is no harm
    assert SLOWER_SHARE == 0.10
    assert moved_reason(0.157, 0.129) is not None and "0.157" in moved_reason(0.157, 0.129)
    assert moved_reason(0.15, 0.14) is None


def test_the_reference_gemm_counts_two_flops_per_multiply_add_and_leaves_the_threads_alone(monkeypatch):
    torch = pytest.importorskip("torch")
    import calibration.speed as speed

    clock = iter(i * 1e-3 for i in range(1000))  # every timed call takes exactly 1 ms
    monkeypatch.setattr(speed.time, "perf_counter", lambda: next(clock))
    threads = torch.get_num_threads()
    assert speed.reference_gemm_tflops(1) == pytest.approx(2 * 1024**3 / 1e-3 / 1e12)
    assert torch.get_num_threads() == threads


@pytest.fixture
def fake_smi(tmp_path):
    """An nvidia-smi that prints the given lines and records the arguments it was called with."""
    def make(lines: list[str], code: int = 0) -> tuple[Path, Path]:
        script, called = tmp_path / "nvidia-smi", tmp_path / "called"
        script.write_text("#!/bin/sh\n" f'echo "$@" >> {called}\n' + "".join(f"echo '{x}'\n" for x in lines)
                          + f"exit {code}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        return script, called
    return make


def test_gpu_use_is_the_most_any_gpu_was_used_over_the_samples(fake_smi, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    smi, called = fake_smi(["3, 500", "97, 30000"])
    use = gpu_use(2, samples=3, interval_s=0.0, smi=str(smi))
    assert use == {"utilisation": 0.97, "memory_used_mib": 30000.0}
    calls = called.read_text().splitlines()
    assert len(calls) == 3 and calls[0].endswith("--format=csv,noheader,nounits -i 0,1")
    reason = gpu_busy_reason(use)
    assert "utilisation up to 97%" in reason and "30000 MiB" in reason and "--allow-busy" in reason
    assert gpu_busy_reason({"utilisation": 0.0, "memory_used_mib": 600.0}) is None  # a driver's own few hundred MiB
    assert gpu_busy_reason({"utilisation": 0.0, "memory_used_mib": 2048.0}) is not None
    assert gpu_busy_reason(None) is None


def test_gpu_use_reads_the_gpus_cuda_visible_devices_names_and_nothing_it_cannot_parse(fake_smi, monkeypatch,
                                                                                       tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa, GPU-bb,GPU-cc")
    assert visible_gpus(2) == ["GPU-aa", "GPU-bb"]
    smi, called = fake_smi(["0, 1"])
    assert gpu_use(2, samples=1, smi=str(smi)) == {"utilisation": 0.0, "memory_used_mib": 1.0}
    assert called.read_text().strip().endswith("-i GPU-aa,GPU-bb")
    assert gpu_use(1, samples=1, smi=str(fake_smi(["No devices were found"])[0])) is None
    assert gpu_use(1, samples=1, smi=str(fake_smi(["0, 1"], code=9)[0])) is None
    assert gpu_use(1, samples=1, smi=str(tmp_path / "missing")) is None


def write_case(tmp_path: Path, reference_tflops: float) -> tuple[Path, Path]:
    from test_validate_loop import PROFILE, case

    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({**PROFILE, "machine": {
        **PROFILE["machine"], "reference_gemm_tflops": {"before": reference_tflops, "after": reference_tflops}}}))
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case(micro_batch_size=1, zero_stage=0)))
    return path, profile


def validate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner", "validate", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=180, env={**os.environ, "COLUMNS": "200"})


def test_validate_refuses_a_machine_slower_than_profiled_before_running_anything(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import calibration.host as host
    import calibration.validate as validation
    from planner.errors import CaseError

    monkeypatch.setattr(host, "other_cpu_share", lambda: 0.0)  # the tests beside this one are not its subject
    monkeypatch.setattr(validation, "launch", lambda *a, **k: pytest.fail("ran on a machine slower than profiled"))
    path, profile = write_case(tmp_path, 1000.0)  # no CPU runs a 1024³ GEMM at a PFLOP/s
    with pytest.raises(CaseError) as refused:
        validation.validate(path, profile)
    assert str(refused.value).startswith(f"{path}: host: this machine runs the reference GEMM ")
    assert "against 1e+03 TFLOP/s" in str(refused.value) and "--allow-busy" in str(refused.value)


@pytest.mark.slow
def test_validate_times_the_machine_around_the_run_and_records_it(tmp_path):
    pytest.importorskip("torch")
    path, profile = write_case(tmp_path, 1000.0)
    run = validate(str(path), "--profile", str(profile), "--steps", "1", "--warmup", "1", "--timeout", "120",
                   "--json", "--allow-busy")
    assert run.returncode == 0, run.stderr
    timed = json.loads(run.stdout)["host"]["reference_gemm_tflops"]
    assert timed["profiled"] == 1000.0 and 0 < timed["before"] < 1000 and 0 < timed["after"] < 1000
    assert timed["ratio"] == pytest.approx(min(timed["before"], timed["after"]) / 1000)
    assert "warning: this machine runs the reference GEMM" in run.stderr  # measured anyway, and said so


def test_a_profile_without_the_reference_gemm_says_the_speed_went_unchecked(tmp_path, monkeypatch):
    """A profile written before `calibrate` timed the reference GEMM (the repo's own cpu-2core-dev.yaml) gave
    validate no speed to compare with: its refusal of a machine slower than profiled was skipped with no word,
    and --json's host said reference_gemm_tflops: null, as for a GPU, where no such check applies."""
    pytest.importorskip("torch")
    import io

    from rich.console import Console

    import calibration.host as host
    import calibration.validate as validation
    from calibration.train import Measurement
    from test_validate_loop import PROFILE, case

    profile = tmp_path / "profile.yaml"
    assert "reference_gemm_tflops" not in PROFILE["machine"]
    profile.write_text(yaml.safe_dump(PROFILE))
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case(micro_batch_size=1, zero_stage=0)))
    monkeypatch.setattr(host, "other_cpu_share", lambda: 0.0)  # the tests beside this one are not its subject
    timed = []
    monkeypatch.setattr(validation, "reference_gemm_tflops", lambda threads: timed.append(threads) or 0.1)
    # The note's subject is what validate says around the run, not the run: its steps are not started.
    monkeypatch.setattr(validation, "launch", lambda spec, timeout_s, stall_s=None: Measurement(
        step_times_s=(1.0,), optimizer_times_s=(0.1,), warmup_times_s=(1.0,), activation_bytes=1, losses=(2.0, 1.0),
        threads=spec.threads, torch_version="x"))
    warned: list[str] = []
    result = validation.validate(path, profile, steps=1, warmup=1, warn=warned.append)
    note = (f"{profile}: machine.reference_gemm_tflops: missing (the reference GEMM's speed when the profile was "
            "measured, which `calibrate` records): this machine's speed is not checked against the profile's, so a "
            "machine more than 10% slower than the one profiled is not refused; calibrate again to have it checked")
    assert warned == [note] and timed == []  # nothing to compare a timing with: none taken
    host_section = result.to_dict()["host"]
    assert host_section["reference_gemm_tflops"] is None and host_section["speed_not_checked"] == note
    out = io.StringIO()
    validation.print_validation(result, Console(file=out, width=1000))
    assert f"this machine's speed: not checked: {note}" in out.getvalue().splitlines()

    # One that records it is checked, and says nothing of the kind.
    path, profile = write_case(tmp_path, 0.1)
    warned.clear()
    result = validation.validate(path, profile, steps=1, warmup=1, warn=warned.append)
    assert warned == [] and result.to_dict()["host"]["speed_not_checked"] is None
    assert result.speed.profiled == pytest.approx(0.1) and len(timed) == 2  # before and after the run
