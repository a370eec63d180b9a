"""What `validate` runs, checked without torchrun. The trainer's optimizers step on FSDP2's
sharded parameters: SGD's fused kernel has no DTensor rule (aten._fused_sgd_), so ZeRO-3 with
SGD crashed before it took the multi-tensor path. One process, a gloo group of one, a two-layer model, one step: the
parameters move by exactly what SGD with momentum prescribes for a first step (-lr · grad)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gloo_one_rank import PRELUDE

pytestmark = pytest.mark.slow  # real training steps in subprocesses

REPO = Path(__file__).resolve().parent.parent

OPTIMIZERS = ("sgd", "adam", "adamw")
# Each optimizer named on the command line steps a model of its own, all in one process: each process spent
# seconds importing torch and FSDP2, the same for each; one that fails says so and leaves the others to run.
SCRIPT = PRELUDE + textwrap.dedent("""
    import sys, traceback
    from torch.distributed.fsdp import fully_shard
    from calibration.train import _optimizer

    def step(name):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        optimizer = _optimizer(name, model.parameters(), sharded=True)
        before = [p.full_tensor().clone() for p in model.parameters()]
        model(torch.randn(4, 8)).sum().backward()
        grads = [p.grad.full_tensor().clone() for p in model.parameters()]
        optimizer.step()
        lr = optimizer.param_groups[0]["lr"]
        if name == "sgd":  # first step with momentum: the buffer is the gradient itself
            for p, b, g in zip(model.parameters(), before, grads):
                torch.testing.assert_close(p.full_tensor(), b - lr * g)
        else:
            assert any(not torch.equal(p.full_tensor(), b) for p, b in zip(model.parameters(), before))

    for name in sys.argv[1:]:
        try:
            step(name)
        except Exception:
            traceback.print_exc()
            print("failed", name)
        else:
            print("stepped", name)
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def stepped() -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, *OPTIMIZERS], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_every_optimizer_steps_on_sharded_parameters(stepped, optimizer):
    assert stepped.returncode == 0 and f"stepped {optimizer}" in stepped.stdout.splitlines(), \
        stepped.stdout + stepped.stderr[-2000:]


def test_validate_refuses_a_prediction_for_another_machine(tmp_path):
    """Without a profile measured here, the prediction is a preset GPU's: refused before any run,
    with the key and exit 2."""
    case = tmp_path / "case.yaml"
    case.write_text("model: {preset: gpt-1.7b}\ncluster: {gpu: h100, num_gpus: 1}\n"
                    "training: {global_batch_size: 8, seq_len: 512, precision: fp32}\n"
                    "layout: {micro_batch_size: 1}\n")
    run = subprocess.run([sys.executable, "-m", "planner", "validate", str(case)], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 2
    assert run.stderr.strip().startswith(f"error: {case}: cluster.profile: validate runs the layout on this machine")


@pytest.mark.parametrize("flags, code, message", [
    ([], 2, "profile.yaml: --profile: is a `calibrate --quick` profile"),
    (["--allow-quick"], 3, "does not fit"),  # past the check: refused for memory before anything runs
])
def test_a_quick_profile_is_refused_unless_asked(tmp_path, flags, code, message):
    import yaml
    from test_validate_loop import PROFILE
    from test_validate_loop import case as small_case

    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({**PROFILE, "machine": {**PROFILE["machine"], "quick": True},
                                       "gpu": {**PROFILE["gpu"], "memory": "1 MiB"},
                                       "overheads": {"cuda_context": "1 KiB"}}))
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump(small_case()))
    run = subprocess.run([sys.executable, "-m", "planner", "validate", str(case), "--profile", str(profile), *flags],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == code and message in run.stderr, run.stderr


def test_validate_says_what_it_runs_before_the_run(tmp_path, monkeypatch):
    import yaml

    import calibration.validate as validation
    from test_validate_loop import PROFILE, case

    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    lines: list[str] = []

    class Launched(Exception):
        pass

    def launch(spec, timeout_s, stall_s=None):
        raise Launched(lines[:])  # what was said before the ranks start

    monkeypatch.setattr(validation, "launch", launch)
    with pytest.raises(Launched) as said:
        validation.validate(case(micro_batch_size=1), profile, steps=3, warmup=1, timeout_s=90, allow_busy=True,
                            progress=lines.append)
    (line,) = said.value.args[0]
    assert line.startswith("validate: predicted ") and \
        line.endswith("running 1 warm-up and 3 timed steps on 2 ranks (cpu), stopped after 90 s at most")


def test_validate_warns_of_a_profile_measured_on_a_busy_or_moving_machine(tmp_path, monkeypatch):
    """A profile calibrated under --allow-busy with other processes at 100 % of the CPU and the reference
    GEMM at 0.0573 then 0.173 TFLOP/s (this machine, 2026-12-07) predicted a step as a quiet one would,
    and validate compared this machine's speed with the mean of the two (0.115), with no word."""
    import yaml

    import calibration.validate as validation
    from test_validate_loop import PROFILE, case

    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({**PROFILE, "machine": {
        **PROFILE["machine"], "other_cpu_share": 1.0, "reference_gemm_tflops": {"before": 0.0573, "after": 0.173}}}))
    warned: list[str] = []

    class Launched(Exception):
        pass

    def launch(spec, timeout_s, stall_s=None):
        raise Launched()

    monkeypatch.setattr(validation, "launch", launch)
    with pytest.raises(Launched):
        validation.validate(case(micro_batch_size=1), profile, steps=1, warmup=0, allow_busy=True, warn=warned.append)
    of_profile = [line for line in warned if line.startswith(str(profile))]
    assert len(of_profile) == 2, warned
    assert "machine.other_cpu_share" in of_profile[0] and "machine.reference_gemm_tflops" in of_profile[1]


def test_a_profile_of_one_rank_is_refused_for_a_layout_of_several(tmp_path, monkeypatch):
    """calibrate --nproc 1 times no collective and writes the copy bandwidth as the link bandwidths (39 GB/s
    on this machine, where two gloo ranks measure 1.3 GB/s): a dp-2 prediction on it prices its all-reduce at
    memory speed, and the run's ratio would be read as the model's. Refused before any rank starts."""
    import yaml

    import calibration.validate as validation
    from planner.errors import CaseError
    from test_validate_loop import PROFILE, case

    monkeypatch.setattr(validation, "launch", lambda *args, **kwargs: pytest.fail("a rank was started"))
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({**PROFILE, "machine": {**PROFILE["machine"], "world_size": 1},
                                       "measurements": {"collectives": {}}}))
    with pytest.raises(CaseError) as error:
        validation.validate(case(num_gpus=2, micro_batch_size=1), profile, steps=1, warmup=0, allow_busy=True)
    assert error.value.key == "--profile" and "measured with one rank" in error.value.expected


def test_a_one_rank_profile_as_calibrate_writes_it_is_refused_for_its_collectives(tmp_path, monkeypatch):
    """`calibrate --nproc 1` gives its one rank every core (machine.threads_per_rank), so a layout of two
    ranks on it was refused as `tiny.yaml: layout.dp: 2 ranks × 2 threads do not fit in this machine's 2
    cores`: the case's key, and no way out, where the profile is what cannot serve (it timed no collective)
    and the documented refusal, with its remedy (calibrate with --nproc 2), never came."""
    import yaml

    import calibration.validate as validation
    from calibration.host import cores
    from planner.errors import CaseError
    from test_validate_loop import PROFILE, case

    monkeypatch.setattr(validation, "launch", lambda *args, **kwargs: pytest.fail("a rank was started"))
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({**PROFILE, "machine": {**PROFILE["machine"], "world_size": 1,
                                                              "threads_per_rank": cores()},
                                       "measurements": {"collectives": {}}}))
    with pytest.raises(CaseError) as error:
        validation.validate(case(num_gpus=2, micro_batch_size=1), profile, steps=1, warmup=0, allow_busy=True)
    assert (error.value.source, error.value.key) == (str(profile), "--profile")
    assert "measured with one rank" in error.value.expected and "--nproc 2" in error.value.expected


def test_a_gpu_profile_needs_a_gpu_for_every_rank(tmp_path, monkeypatch):
    """A GPU profile on a machine with that GPU, but fewer of them than the layout's ranks:
    refused with layout.dp before any rank starts (the ranks would crash on a missing device)."""
    import yaml

    import calibration.host as host
    from calibration.validate import validate
    from planner.errors import CaseError
    from test_validate_loop import PROFILE, case

    monkeypatch.setattr(host, "local_gpu", lambda: "NVIDIA H200")
    monkeypatch.setattr(host, "local_gpu_count", lambda: 1)
    profile = tmp_path / "gpu.yaml"
    profile.write_text(yaml.safe_dump({**PROFILE, "machine": {"device": "NVIDIA H200", "gpu": "NVIDIA H200",
                                                              "backend": "nccl"}}))
    with pytest.raises(CaseError, match=r"layout.dp: 2 ranks need 2 GPUs, one each, and this machine has 1"):
        validate(case(num_gpus=2, micro_batch_size=1), profile, steps=1, warmup=0)
