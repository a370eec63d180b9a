"""Every engine's files hold ``sbatch.sh`` beside ``launch.sh`` (planner/emit/slurm.py): the #SBATCH
lines and the torchrun each node starts give the plan's world size, the script parses, and a case's
values stay quoted (a model name cannot become a line of shell)."""

from __future__ import annotations

import re
import subprocess

import pytest

import planner

CASES = {
    "megatron": {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
                 "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"},
                 "layout": {"dp": 4, "tp": 8, "pp": 2, "micro_batch_size": 1, "zero_stage": 1,
                            "sequence_parallel": True, "recompute": "full"}},
    "deepspeed": {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
                  "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "deepspeed"},
                  "layout": {"dp": 16, "micro_batch_size": 1, "zero_stage": 2}},
    "torchtitan": {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
                   "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "torchtitan"},
                   "layout": {"dp": 8, "tp": 2, "micro_batch_size": 1, "zero_stage": 3, "sequence_parallel": True}},
}


@pytest.mark.parametrize("engine", sorted(CASES))
def test_sbatch_starts_the_plans_world(engine, tmp_path):
    case = {**CASES[engine], "model": {**CASES[engine]["model"], "name": "x'; rm -rf / #\nnewline"}}
    est = planner.estimate(case)
    planner.emit(est, engine, tmp_path, force_unfit=not est.fits)
    path = tmp_path / "sbatch.sh"
    text = path.read_text()
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    sbatch = dict(re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?$", text, re.MULTILINE))
    nodes, per_node = int(sbatch["nodes"]), int(sbatch["gpus-per-node"])
    assert nodes * per_node == est.job.cluster.num_gpus
    assert sbatch["ntasks-per-node"] == "1" and "exclusive" in sbatch
    torchrun = re.search(r"torchrun --nnodes (\d+) --nproc-per-node (\d+)", text)
    assert (int(torchrun.group(1)), int(torchrun.group(2))) == (nodes, per_node)
    assert '--rdzv-endpoint "$HEAD_NODE:' in text and "scontrol show hostnames" in text
    # The model's name appears only inside comments.
    assert all(line.startswith("#") for line in text.splitlines() if "rm -rf" in line)
    if engine == "megatron":  # tp > 1 before Blackwell: validate_args wants it set before the processes start
        assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text
