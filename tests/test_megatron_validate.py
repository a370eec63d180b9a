"""The emitted Megatron-LM launch.sh read back by Megatron-LM's own parse_args and validate_args
(bench/megatron_validate.py), not by the restated rules of test_emit_megatron.py.

megatron/training/arguments.py is not in megatron-core: it needs a clone of NVIDIA/Megatron-LM, given by
MEGATRON_LM_GIT_DIR or found at the mirror path; without one the test is skipped, saying so. Each case
runs a validator that imports megatron (forked from a Python that has imported torch once:
under a second of CPU each, after a few seconds for the first): marked slow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import megatron_validate  # noqa: E402

GIT_DIR = os.environ.get("MEGATRON_LM_GIT_DIR", megatron_validate.MIRROR)


def has_release(git_dir: str, ref: str) -> bool:
    done = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                          capture_output=True, check=False)
    return Path(git_dir).exists() and done.returncode == 0


# Five cases that reach a pipeline with its stage split, interleaving, context parallelism, experts,
# optimizer offload with partial recomputation, Megatron FSDP (ZeRO 3) with selective recomputation and fp8 on
# Hopper (validate_args's fp8 and Hopper rules), and Adam's moments in bf16 (--use-precision-aware-optimizer).
CASES = [
    {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
     "training": {"global_batch_size": 256, "seq_len": 8192, "precision": "fp8"},
     "search": {"target": "megatron", "vpp": 2}},
    {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
     "training": {"global_batch_size": 64, "seq_len": 4096}, "search": {"target": "megatron", "min_ep": 4}},
    {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 32},
     "training": {"global_batch_size": 64, "seq_len": 32768}, "search": {"target": "megatron", "min_cp": 2, "zero_stage": 3}},
    {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
     "training": {"global_batch_size": 16, "seq_len": 4096},
     "search": {"target": "megatron", "offload_optimizer": 1}},
    # Adam's moments in bf16: the precision-aware optimizer, its master as remainders.
    {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
     "training": {"global_batch_size": 64, "seq_len": 4096, "optimizer_moments": "bf16"},
     "search": {"target": "megatron"}},
]


@pytest.mark.slow
@pytest.mark.skipif(not has_release(GIT_DIR, "core_v0.16.1"),
                    reason=f"no Megatron-LM clone with core_v0.16.1 at {GIT_DIR} (set MEGATRON_LM_GIT_DIR): "
                           "megatron/training/arguments.py is not in megatron-core")
def test_megatron_lms_parse_args_and_validate_args_resolve_the_plan():
    results = megatron_validate.run(GIT_DIR, ["core_v0.16.1"], CASES)
    assert [r.get("skipped") for r in results] == [None] * len(CASES)
    layouts = [r["layout"] for r in results]
    assert any(lay["vpp"] > 1 for lay in layouts) and any(lay["cp"] > 1 for lay in layouts)
    assert any(lay.get("ep", 1) > 1 for lay in layouts) and any(lay.get("offload_optimizer") for lay in layouts)
    assert any(lay["zero_stage"] == 3 for lay in layouts)
    for result in results:
        assert result["issues"] == [], (result["model"], result["layout"], result["issues"])


def test_resolved_arguments_are_compared_key_by_key():
    """The comparison itself (no clone needed): arguments resolved otherwise than planned are each named."""

    class Planned:
        def to_dict(self):
            return {"layout": {"dp": 4, "tp": 2, "pp": 1, "cp": 1, "vpp": 1, "micro_batch_size": 2, "zero_stage": 1,
                               "sequence_parallel": True, "recompute": "none"},
                    "grad_accum": 4, "training": {"engine": "megatron", "fp8_param_gather": False}}

        class job:  # noqa: N801
            class training:  # noqa: N801
                precision, tp_comm_overlap = "bf16", False
                optimizer_moments, master_remainders = "bf16", True

            class model:  # noqa: N801
                is_moe = False

    case = {"training": {"global_batch_size": 32, "seq_len": 4096}}
    resolved = {field: None for field in megatron_validate.FIELDS}
    resolved.update(data_parallel_size=4, tensor_model_parallel_size=2, pipeline_model_parallel_size=1,
                    context_parallel_size=1, micro_batch_size=2, global_batch_size=32, use_distributed_optimizer=True,
                    use_megatron_fsdp=False, sequence_parallel=True, expert_model_parallel_size=1,
                    expert_tensor_parallel_size=2, seq_length=4096, bf16=True, fp16=False, overlap_grad_reduce=True,
                    overlap_param_gather=True, tp_comm_overlap=False, num_layers=32,
                    use_precision_aware_optimizer=True, exp_avg_dtype="torch.bfloat16",
                    exp_avg_sq_dtype="torch.bfloat16", main_params_dtype="torch.float32")
    assert megatron_validate.compare(case, Planned(), resolved) == []
    wrong = {**resolved, "micro_batch_size": 1, "use_distributed_optimizer": False, "overlap_param_gather": False,
             "exp_avg_sq_dtype": "torch.float32", "use_precision_aware_optimizer": False}
    assert megatron_validate.compare(case, Planned(), wrong) == [
        "micro_batch_size: planned 2, Megatron-LM resolved 1",
        "zero_stage: planned 1, Megatron-LM resolved 0",
        "gradient accumulation: planned 4, resolved 8",
        "overlap_param_gather: priced overlapped, resolved off",
        "exp_avg_sq_dtype: planned bf16, resolved torch.float32",
        "use_precision_aware_optimizer: planned True, resolved False",
    ]


@pytest.mark.slow
def test_the_validators_server_goes_when_the_python_that_started_it_is_killed(tmp_path):
    """The server imports torch and serves forever; run() killed it in a finally, which SIGTERM's default
    (a CI job cancelled, `timeout`) and SIGKILL never run: it was left serving, torch imported, its socket
    in a temporary folder nothing removes. It now reads end of file on the pipe its starter holds and goes."""
    import signal
    import time

    starter = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
                               "import megatron_validate as mv; print(mv.start_server(Path(sys.argv[2])).pid, "
                               "flush=True); time.sleep(600)", str(ROOT / "bench"), str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        server = int(starter.stdout.readline())
        assert (tmp_path / "validate.sock").exists()
        starter.send_signal(signal.SIGTERM)
        starter.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _running(server):
            time.sleep(0.1)
        alive = _running(server)
        if alive:
            os.kill(server, signal.SIGKILL)
        assert not alive, "the server outlived the Python that started it"
        assert not (tmp_path / "validate.sock").exists()
    finally:
        starter.kill()
        starter.wait()


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (not gone, nor a zombie its new parent has yet to reap)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False
