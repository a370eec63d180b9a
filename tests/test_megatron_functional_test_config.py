"""A Megatron-LM functional test's model_config.yaml, read as the CI's _run_training.sh launches it:
its MODEL_ARGS mapping is pretrain_gpt.py's arguments (true: the switch alone), its ENV_VARS exported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from planner.configs import read_config  # noqa: E402
from planner.diagnose import diagnose  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "megatron" / "gpt3_7b_tp1_pp4_memory_speed.model_config.yaml"
# The test's model: its MODEL_ARGS' sizes (no --ffn-hidden-size: 4h; no --swiglu: GeLU), on its one
# node of 8 GPUs (the CI's GPUS_PER_NODE default, _run_training.sh), at its batch and sequence.
CASE = {"model": {"name": "gpt3-7b-functional-test", "num_layers": 32, "hidden_size": 4096,
                  "num_attention_heads": 32, "num_kv_heads": 8, "vocab_size": 131073},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        "training": {"global_batch_size": 8, "seq_len": 8192, "precision": "bf16"}}


def test_a_functional_test_config_is_read_as_its_launch_passes_it(tmp_path):
    case = tmp_path / "case.yaml"
    case.write_text(json.dumps(CASE))
    layout = read_config(str(case), "megatron", FIXTURE)
    # --pipeline-model-parallel-size 4 on 8 GPUs at tp 1: dp 8 / 4 = 2; --num-layers-per-virtual-pipeline-stage 1
    # over 32 layers in 4 stages: 32 / 4 / 1 = 8 model chunks per stage.
    assert (layout.tp, layout.pp, layout.dp, layout.vpp) == (1, 4, 2, 8)
    assert layout.micro_batch_size == 1
    # --use-distributed-optimizer: true, the switch given: the optimizer's states sharded (ZeRO 1).
    assert layout.zero_stage == 1
    # ENV_VARS exports CUDA_DEVICE_MAX_CONNECTIONS=1: no note asks the caller to export it.
    result = diagnose(str(case), megatron_args=FIXTURE)
    assert not [note for note in result.notes if "CUDA_DEVICE_MAX_CONNECTIONS" in note]


def test_a_nemo_functional_tests_overrides_are_refused_in_one_line(tmp_path):
    case = tmp_path / "case.yaml"
    case.write_text(json.dumps(CASE))
    nemo = tmp_path / "model_config.yaml"
    # tests/functional_tests/test_cases/gpt-nemo/*: NeMo recipe overrides, which _run_training.sh passes
    # as key=value to a NeMo script, not pretrain_gpt.py's flags.
    nemo.write_text("ENV_VARS:\n  CUDA_DEVICE_MAX_CONNECTIONS: 1\nMODEL_ARGS:\n  trainer.max_steps: 50\n"
                    "  trainer.strategy.tensor_model_parallel_size: 4\n")
    out = subprocess.run([sys.executable, "-m", "planner", "diagnose", str(case), "--megatron-args", str(nemo)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(nemo) in lines[0] and "trainer.max_steps" in lines[0]
