"""`layout-planner validate` end to end at a small size: real training steps against the cost models.

What is asserted, and why it is robust:

- the run completes (DDP with gradient accumulation; FSDP2 with full recomputation;
  one rank with selective recomputation) and trains: the loss on its fixed batch falls;
- the bytes one micro-batch's forward saves for backward (saved-tensor hooks, as in
  ``tests/test_activations_torch.py``) equal the model's activation term to 2 %, and
  are never below it. The model leaves out, by design, only per-token statistics:
  each norm's mean and 1/std (8 bytes a token in fp32), flash attention's log-sum-exp
  (4 bytes a head and token) and cross-entropy's scalars; at h = 128 and 4 heads that
  is about 32 bytes a token per layer against the model's 64·h = 8192, i.e. ≈ 0.4 %;
- predicted and measured step times are positive. No timing is compared: timings
  on a shared CI machine are noise. ``bench/validate_loop.py`` compares them.

The profile here is a fixture (its figures only scale the prediction); the real one
comes from `layout-planner calibrate`.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")

from calibration.host import cpu_model  # noqa: E402
from calibration.train import Unsupported, run_spec  # noqa: E402
from calibration.validate import forward_activation_bytes, load_with_profile, validate  # noqa: E402
from planner.errors import CaseError  # noqa: E402

pytestmark = pytest.mark.slow

PROFILE = {
    "machine": {"device": "test-cpu", "cpu": cpu_model()},  # this machine's: validate checks it
    "gpu": {"memory": "4 GiB", "peak_tflops": {"fp32": 0.1}, "hbm_bandwidth": "10 GB/s",
            "intra_node_bandwidth": "1 GB/s", "inter_node_bandwidth": "1 GB/s",
            "gpus_per_node": 2, "nvlink_domain": 2},
    "performance": {"gemm_efficiency": 0.9, "attention_efficiency": 0.3, "kernel_overhead_s": 5e-6,
                    "hbm_efficiency": 0.5, "link_latency_s": 1e-4, "step_overhead_s": 0.001},
}
MODEL = {"name": "tiny-gpt", "num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "vocab_size": 512}
REL_TOL = 0.02


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    return path


def case(num_gpus: int = 2, model: dict = MODEL, training: dict = None, **layout) -> dict:
    return {"model": dict(model), "cluster": {"num_gpus": num_gpus},
            "training": {"precision": "fp32", "global_batch_size": 4, "seq_len": 64, **(training or {})},
            "layout": {"dp": num_gpus, **layout}}


def check(result) -> None:
    m = result.measurement
    assert len(m.step_times_s) == result.spec.steps and len(m.warmup_times_s) == result.spec.warmup
    assert result.predicted_step_s > 0 and result.measured_step_s > 0
    assert all(math.isfinite(x) for x in m.losses) and m.losses[-1] < m.losses[0]
    modelled = forward_activation_bytes(result.estimate.job)
    assert modelled == result.predicted_activation_bytes
    assert 1 - REL_TOL <= modelled / m.activation_bytes <= 1.0, (modelled, m.activation_bytes)


def test_ddp_with_gradient_accumulation_through_the_cli(tmp_path, profile):
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case(micro_batch_size=1, zero_stage=0)))
    run = subprocess.run([sys.executable, "-m", "planner", "validate", str(path), "--profile", str(profile),
                          "--steps", "2", "--warmup", "1", "--timeout", "120", "--json", "--allow-busy"],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["run"] == {"dp": 2, "micro_batch_size": 1, "grad_accum": 2, "zero_stage": 0, "recompute": "none",
                          "attention": "sdpa", "threads_per_rank": out["run"]["threads_per_rank"],
                          "steps": 2, "warmup": 1}
    assert out["gpu"] == "test-cpu"
    assert out["step_time_s"]["predicted"] > 0 and out["step_time_s"]["measured"] > 0
    acts = out["activation_bytes"]
    assert 1 - REL_TOL <= acts["predicted"] / acts["measured"] <= 1.0


def test_fsdp2_with_full_recomputation(profile):
    result = validate(case(micro_batch_size=2, zero_stage=3, recompute="full"), profile, steps=2, warmup=1,
                      timeout_s=120, allow_busy=True)
    assert result.spec.zero_stage == 3 and result.spec.grad_accum == 1
    check(result)


def test_one_rank_selective_recomputation_swiglu_gqa(profile):
    """One rank on a CPU: no allocator, so no peak to report (null in the JSON, not a zero)."""
    llama = {**MODEL, "activation": "swiglu", "num_kv_heads": 2, "ffn_hidden_size": 352}
    result = validate(case(num_gpus=1, model=llama, micro_batch_size=2, recompute="selective"), profile,
                      steps=2, warmup=1, timeout_s=120, allow_busy=True)
    assert result.spec.dp == 1 and result.spec.grad_accum == 2
    check(result)
    assert result.spec.device == "cpu" and result.measurement.peak_memory_bytes is None
    assert result.to_dict()["peak_allocated_bytes"] is None


@pytest.mark.parametrize("change, key", [
    ({"layout": {"dp": 1, "tp": 2}}, "layout.tp"),
    ({"layout": {"dp": 1, "pp": 2}}, "layout.pp"),
    ({"layout": {"dp": 2, "zero_stage": 1}}, "layout.zero_stage"),
    ({"layout": {"dp": 2, "recompute": "full", "recompute_num_layers": 1}}, "layout.recompute_num_layers"),
    ({"layout": {"dp": 2, "recompute": "selective", "recompute_modules": ["mlp"]}}, "layout.recompute_modules"),
    ({"training": {"precision": "bf16", "global_batch_size": 4, "seq_len": 64}}, "training.precision"),
    ({"model": {**MODEL, "dropout": 0.1}}, "model.dropout"),
    # Models the loop's dense GPT does not build.
    ({"model": {**MODEL, "num_experts": 4, "moe_top_k": 2}}, "model.num_experts"),
    ({"model": {**MODEL, "head_dim": 64}}, "model.head_dim"),
    ({"model": {**MODEL, "mtp_layers": 1}}, "model.mtp_layers"),
    ({"model": {**MODEL, "attention_type": "mla", "kv_lora_rank": 32, "qk_head_dim": 32, "qk_rope_head_dim": 16,
                "v_head_dim": 32}}, "model.attention_type"),
    # What the loop does not run was priced all the same: a window (0.36 against 0.61 without it), the
    # optimizer's offload, a chunked or compiled loss.
    ({"model": {**MODEL, "sliding_window": 16}}, "model.sliding_window"),
    ({"layout": {"dp": 2, "offload_optimizer": 1.0},
      "cluster": {"profile": "PROFILE", "num_gpus": 2,
                  "host": {"memory": "8 GB", "link_bandwidth": "10 GB/s", "memory_bandwidth": "10 GB/s"}}},
     "layout.offload_optimizer"),
    ({"training": {"global_batch_size": 4, "seq_len": 64, "precision": "fp32", "loss_chunks": 2}},
     "training.loss_chunks"),
    ({"training": {"global_batch_size": 4, "seq_len": 64, "precision": "fp32", "compiled_loss": True}},
     "training.compiled_loss"),
])
def test_layouts_the_cpu_loop_cannot_run_are_refused_by_key(profile, change, key):
    data = {**case(), **change}
    if data["cluster"].get("profile") == "PROFILE":
        data["cluster"]["profile"] = str(profile)
    loaded = load_with_profile(data, profile)
    with pytest.raises(Unsupported) as error:
        run_spec(loaded.job(), cpu_count=2)
    assert error.value.key == key
    with pytest.raises(CaseError, match=key.replace(".", r"\.")):
        validate(data, profile)


def test_cli_refusal_is_one_line_with_exit_code_2(tmp_path, profile):
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case(num_gpus=2, tp=2, dp=1)))
    run = subprocess.run([sys.executable, "-m", "planner", "validate", str(path), "--profile", str(profile)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "layout.tp" in run.stderr and "data parallelism only" in run.stderr


@pytest.mark.parametrize("option, value, bound", [
    ("--timeout", "nan", "from 1 to 86400"),  # nan passed `min=1` and disarmed the watchdog
    ("--timeout", "inf", "from 1 to 86400"),
    ("--steps", str(2**70), "from 1 to 10000"),  # accepted, a run without end
    ("--warmup", "100000", "from 0 to 10000"),
])
def test_run_lengths_past_their_bounds_are_refused_before_the_run(tmp_path, profile, option, value, bound):
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case()))
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "planner", "validate", str(path), "--profile", str(profile),
                          "--allow-busy", option, value], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert f"{option}: expected" in run.stderr and bound in run.stderr
    assert time.monotonic() - start < 10  # refused, not run


def test_more_ranks_than_cores_is_refused(profile):
    loaded = load_with_profile(case(num_gpus=4), profile)
    with pytest.raises(Unsupported, match="core"):
        run_spec(loaded.job(), cpu_count=2)


def test_the_parent_of_a_run_does_not_import_torch(tmp_path, profile):
    """validate's own process estimates, writes the run's spec and watches torchrun; the ranks
    need torch, it does not, and importing it there would add 2-3 s to every run."""
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case(micro_batch_size=1)))
    code = ("import sys; from calibration.train import run_spec; from calibration.validate import load_with_profile; "
            f"run_spec(load_with_profile({str(path)!r}, {str(profile)!r}).job()); print('torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "False", run.stderr


def test_ranks_get_the_profiled_threads(tmp_path, profile):
    """A profile measured with N threads a rank describes that device: the run gives each rank N threads."""
    from calibration.validate import profiled_threads

    assert profiled_threads(case(), profile) is None  # the fixture says nothing: an equal share of the cores
    threaded = tmp_path / "threaded.yaml"
    threaded.write_text(yaml.safe_dump({**PROFILE, "machine": {"device": "x", "threads_per_rank": 1}}))
    data = case(num_gpus=1)
    assert profiled_threads(data, threaded) == 1
    assert run_spec(load_with_profile(data, threaded).job(), cpu_count=2, threads=1).threads == 1
    assert run_spec(load_with_profile(data, threaded).job(), cpu_count=2).threads == 2
    data["cluster"]["profile"] = str(threaded)  # found through the case too
    assert profiled_threads(data, None) == 1
    with pytest.raises(Unsupported, match="threads"):
        run_spec(load_with_profile(case(num_gpus=2), threaded).job(), cpu_count=2, threads=2)


def test_a_run_past_its_timeout_is_stopped(profile):
    from calibration.supervisor import RunFailed

    with pytest.raises(RunFailed, match="timeout"):
        validate(case(micro_batch_size=1), profile, steps=1, warmup=0, timeout_s=1, allow_busy=True)


@pytest.mark.parametrize("fault, message", [
    ("1:train:exit", "training run failed: rank 1 exited with code 3 during the timed steps (step 1/1)"),
    ("1:warmup:raise", "training run failed: rank 1 failed during the warm-up steps (step 1/1): "
                       "RuntimeError: injected fault at warmup"),
])
def test_a_rank_that_fails_is_named_with_its_stage(tmp_path, profile, fault, message):
    """The training run goes through calibrate's supervisor: the rank that failed, not the one
    torn down after it, is named with where it was; no rank and no run folder is left."""
    from calibration.progress import FAULT_ENV
    from calibration.supervisor import EXIT_RUN_FAILED

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case(micro_batch_size=1, zero_stage=0)))
    run = subprocess.run([sys.executable, "-m", "planner", "validate", str(path), "--profile", str(profile),
                          "--steps", "1", "--warmup", "1", "--timeout", "240", "--allow-busy"], capture_output=True,
                         text=True, timeout=300, env={**os.environ, FAULT_ENV: fault, "TMPDIR": str(scratch)})
    assert run.returncode == EXIT_RUN_FAILED, run.stderr
    errors = [line for line in run.stderr.splitlines() if not line.startswith("warning: ")]  # a busy machine's
    assert errors == [f"error: {message}"], run.stderr
    assert list(scratch.iterdir()) == []


STALL_S = 6.0


def test_a_rank_that_hangs_is_stopped_by_the_watchdog_and_named(tmp_path, profile, monkeypatch):
    """Rank 1 hangs in its first warm-up step while rank 0 waits for it in a barrier: the
    watchdog stops the run when no rank has made progress for ``stall_s`` (many warm-up steps of
    this model on a loaded 2-core machine; start-up, seconds there, has an allowance of its own),
    long before its timeout, and names rank 1 as the one that hung, with its stage; every rank
    is gone, and the run's folder."""
    import tempfile
    import threading

    from calibration.processes import alive, descendants
    from calibration.progress import FAULT_ENV
    from calibration.supervisor import RunFailed

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv(FAULT_ENV, "1:warmup:hang")
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    seen: set[int] = set()
    running = threading.Event()
    running.set()

    def watch() -> None:  # torchrun and the ranks below this process, while they run
        while running.is_set():
            seen.update(descendants(os.getpid()))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.monotonic()
    try:
        with pytest.raises(RunFailed) as failed:
            validate(case(micro_batch_size=1), profile, steps=1, warmup=1, timeout_s=600, stall_s=STALL_S,
                     allow_busy=True)
    finally:
        running.clear()
        watcher.join()
    assert time.monotonic() - start < STALL_S + 60
    assert str(failed.value).startswith("training run failed: rank 1 hung during the warm-up steps (step 1/1)"), \
        failed.value
    assert len(seen) >= 5  # torchrun, and each rank's supervisor and worker
    assert not [pid for pid in seen if alive(pid)]
    assert list(scratch.iterdir()) == []


def test_a_gpu_profile_runs_the_loop_on_cuda_with_bf16_allowed(tmp_path, profile):
    """A profile measured with NCCL sends the run to the GPUs (one per rank), where bf16 is
    allowed and the prediction keeps the loop's fp32 gradients; a CPU profile refuses bf16."""
    from calibration.validate import profiled_device

    gpu = tmp_path / "gpu.yaml"
    gpu.write_text(yaml.safe_dump({**PROFILE, "machine": {"device": "NVIDIA H200", "backend": "nccl"},
                                   "gpu": {**PROFILE["gpu"], "peak_tflops": {"fp32": 60.0, "bf16": 900.0}}}))
    assert profiled_device(case(), profile) == "cpu" and profiled_device(case(), gpu) == "cuda"
    data = case(num_gpus=4, training={"precision": "bf16"}, micro_batch_size=1)
    spec = run_spec(load_with_profile(data, gpu).job(), cpu_count=2, device="cuda")
    assert (spec.device, spec.precision, spec.dp) == ("cuda", "bf16", 4)  # 4 ranks on 4 GPUs, not 4 cores
    with pytest.raises(Unsupported, match="on a CPU"):
        run_spec(load_with_profile(data, gpu).job(), cpu_count=2, device="cpu")
    with pytest.raises(Unsupported, match="fp32 or bf16"):
        run_spec(load_with_profile(case(num_gpus=4, training={"precision": "fp16"}), gpu).job(), device="cuda")


def test_another_device_is_named():
    from calibration.host import device_mismatch

    profiled = {"cpu": "Intel(R) Xeon(R) Platinum 8480+"}
    assert device_mismatch(profiled, "Intel(R) Xeon(R) Platinum 8480+", "cpu", None) is None
    other = device_mismatch(profiled, "AMD EPYC 9654", "cpu", None)
    assert "another CPU (Intel(R) Xeon(R) Platinum 8480+)" in other and "AMD EPYC 9654" in other
    gpus = {"gpu": "NVIDIA H100 80GB HBM3", "cpu": "x"}
    assert device_mismatch(gpus, "y", "cuda", "NVIDIA H100 80GB HBM3") is None  # the host CPU may differ
    assert "NVIDIA H200" in device_mismatch(gpus, "y", "cuda", "NVIDIA H200")
    assert "no CUDA device" in device_mismatch(gpus, "y", "cuda", None)


def test_validate_refuses_a_profile_from_another_cpu_before_running(tmp_path, profile, monkeypatch):
    import calibration.host as host
    from planner.errors import CaseError

    monkeypatch.setattr(host, "cpu_model", lambda: "AMD EPYC 9654")
    other_cpu = tmp_path / "other.yaml"
    other_cpu.write_text(yaml.safe_dump({**PROFILE, "machine": {"device": "x", "cpu": "Some Other CPU"}}))
    with pytest.raises(CaseError, match=r"other.yaml: --profile: was measured on another CPU \(Some Other CPU\); "
                                        r"this machine has AMD EPYC 9654"):
        validate(case(num_gpus=1, micro_batch_size=2), other_cpu, steps=1, warmup=0, timeout_s=120)


@pytest.mark.parametrize("machine, key", [
    ({"device": "CPU: x", "backend": "gloo"}, "machine.cpu"),
    ({"device": "NVIDIA H200", "backend": "nccl"}, "machine.gpu"),
])
def test_a_profile_that_does_not_say_its_device_is_refused_before_running(tmp_path, monkeypatch, machine, key):
    """A profile whose machine.cpu was left out (every profile `calibrate` writes has it) skipped the
    check of the CPU model: a profile of another machine ran, exit 0, and its ratio was read as the model's."""
    import calibration.host as host
    import calibration.validate as validation

    monkeypatch.setattr(host, "local_gpu", lambda: "NVIDIA H200")
    monkeypatch.setattr(host, "local_gpu_count", lambda: 1)
    monkeypatch.setattr(validation, "launch", lambda *a, **k: pytest.fail("ran on a profile of an unknown device"))
    unnamed = tmp_path / "unnamed.yaml"
    unnamed.write_text(yaml.safe_dump({**PROFILE, "machine": machine}))
    with pytest.raises(CaseError, match=rf"^{unnamed}: {key.replace('.', '[.]')}: missing: expected the "):
        validate(case(num_gpus=1, micro_batch_size=2), unnamed, steps=1, warmup=0, timeout_s=120, allow_busy=True)


def test_a_profile_fitted_to_runs_is_refused_before_anything_runs(tmp_path):
    """validate ran two gloo ranks against a profile `calibrate --from-runs` fitted to eight A100
    runs (exit 0, "predicted 0.0028 s, measured 0.0186 s"): its figures are that cluster's."""
    fitted = tmp_path / "fitted.yaml"
    fitted.write_text(yaml.safe_dump({**PROFILE, "machine": {"device": "a100-sxm-80gb", "source": "runs.yaml"},
                                      "fitted": {"figures": {}}}))
    # Named as given: --profile and its path (it named the case's cluster.profile, which was another
    # file, or none).
    with pytest.raises(CaseError, match="fitted.yaml: --profile: was not measured on this machine by `calibrate`"):
        validate(case(), profile=fitted)
    for given in (tmp_path, tmp_path / "missing.yaml"):  # an empty --profile is the working directory
        with pytest.raises(CaseError, match=f"{given}: --profile: "):
            validate(case(), profile=given)


def test_the_profile_the_case_names_is_the_one_recorded(tmp_path, profile):
    """validate --json said "profile": null where the profile came from the case's cluster.profile, not
    --profile: an archived result did not say which profile gave its prediction."""
    from calibration.validate import profile_in_use

    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump({**case(), "cluster": {"num_gpus": 2, "profile": profile.name}}))
    assert profile_in_use(path, None) == profile and profile_in_use(path, "other.yaml") == Path("other.yaml")
    assert profile_in_use(case(), None) is None


def test_a_profile_that_is_no_yaml_is_said_of_the_profile_given_not_of_the_case(tmp_path):
    """validate CASE --profile p.yaml with p.yaml no YAML said `error: case.yaml: cluster.profile: /…/p.yaml: expected
    valid YAML`: the case file, and a key it never wrote (validate puts --profile there). Said of the file given, as
    a profile missing a key is (`p.yaml: gpu: missing`), exit 2, before anything runs."""
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case()))
    bad = tmp_path / "p.yaml"
    bad.write_text("gpu: [1, 2\n")
    run = subprocess.run([sys.executable, "-m", "planner", "validate", str(path), "--profile", str(bad),
                          "--allow-busy"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith(f"error: {bad}: expected valid YAML"), run.stderr
    assert "cluster.profile" not in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("text, got", [("just a string\n", "str"), ("", "nothing"), ("[1, 2]\n", "list")])
def test_a_profile_that_is_no_mapping_is_said_of_the_profile_given_not_of_the_case(tmp_path, text, got):
    """validate CASE --profile p.yaml with p.yaml valid YAML but no mapping (a string, nothing, a list) said
    `error: case.yaml: cluster.profile: /…/p.yaml: expected a mapping`: the case file, and a key it never wrote
    (validate puts --profile there). Said of the file given and --profile, before anything runs."""
    bad = tmp_path / "p.yaml"
    bad.write_text(text)
    with pytest.raises(CaseError) as raised:
        validate(case(), profile=bad, steps=1, warmup=0, allow_busy=True)
    assert str(raised.value).startswith(f"{bad}: --profile: expected a mapping"), str(raised.value)
    assert got in str(raised.value) and "cluster.profile" not in str(raised.value)


def test_a_layout_that_does_not_fit_is_refused_naming_the_limit_its_peak_passed(tmp_path, monkeypatch):
    """validate refused a layout as `does not fit in the profile's 1.3 GB (peak 0.5 GB, …)`: the capacity, where
    the peak was held to what a layout may use of it (less the headroom and what lives outside the allocator,
    `Estimate.fit_limit_bytes`), so the one line contradicted itself. The line names that limit, which the peak
    is above; nothing runs (exit 3 in the CLI)."""
    import calibration.validate as validation
    from calibration.validate import DoesNotFit

    monkeypatch.setattr(validation, "launch", lambda *a, **k: pytest.fail("ran a layout that does not fit"))
    # 1.25 GiB: above the tiny model's 0.5 GB peak, but less the 1 GiB outside the allocator, below it.
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump({**PROFILE, "gpu": {**PROFILE["gpu"], "memory": "1.25 GiB"}}))
    est = validation.estimate(validation.load_with_profile(case(micro_batch_size=1), small))
    assert est.fit_limit_bytes < est.peak.total < est.capacity_bytes  # the case this test is about
    with pytest.raises(DoesNotFit) as raised:
        validate(case(micro_batch_size=1), small, steps=1, warmup=0, allow_busy=True)
    message = str(raised.value)
    assert message.startswith("<case>: layout: does not fit") and "\n" not in message, message
    assert f"peak {est.peak.total / 1e9:.1f} GB, above the {est.fit_limit_bytes / 1e9:.1f} GB" in message, message
    assert "less 1.07 GB for the CUDA context" in message, message  # a "test-cpu" device is no CPU profile


def test_on_a_cpu_profile_the_does_not_fit_line_and_the_estimate_name_the_cpu_process(tmp_path, monkeypatch):
    """A CPU profile (device "CPU: <model>", as calibrate names one) has no CUDA context: what it leaves outside
    the peak is the process itself (``Overheads.cpu_process``, measured), and every line naming the limit says
    so. 0.6 GiB less 1 % headroom less the process (0.23 GB) is below the tiny model's 0.5 GB peak; with a CUDA
    context of 1 GiB taken off it would have been negative, refused as leaving the allocator nothing."""
    import calibration.validate as validation
    from calibration.validate import DoesNotFit
    from cost_models.training_spec import Overheads

    monkeypatch.setattr(validation, "launch", lambda *a, **k: pytest.fail("ran a layout that does not fit"))
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump({**PROFILE, "machine": {**PROFILE["machine"], "device": f"CPU: {cpu_model()}"},
                                     "gpu": {**PROFILE["gpu"], "memory": "0.6 GiB"}}))
    est = validation.estimate(validation.load_with_profile(case(micro_batch_size=1), small))
    process = Overheads().cpu_process
    assert est.usable_bytes == pytest.approx(0.6 * 2**30 * (1 - est.headroom) - process)
    assert est.to_dict()["memory"]["outside_allocator"] == "the CPU process"
    assert est.to_dict()["memory"]["outside_allocator_bytes"] == round(process)
    with pytest.raises(DoesNotFit) as raised:
        validate(case(micro_batch_size=1), small, steps=1, warmup=0, allow_busy=True)
    message = str(raised.value)
    assert f"less {process / 1e9:.2f} GB for the CPU process" in message and "CUDA" not in message, message
