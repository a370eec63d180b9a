"""DeepSpeed emitter beyond dense bf16 on NVIDIA: mixtures of experts, ZeRO-Offload of the optimizer and
of the parameters, ZeRO-3, fp16 and fp8, on A100, H200, B200 and AMD MI300X/MI325X. Each plan is written
as `plan --emit deepspeed` writes it and read back by DeepSpeed 0.19.8's own ``DeepSpeedConfig``, as
``deepspeed.initialize`` builds it (over the data-parallel ranks, and over the whole world with the mpu
a pipeline grid or AutoTP hands it), and what it resolved is compared with the layout ``plan --json``
prints (``Estimate.to_dict()``): batch arithmetic, ZeRO stage, offload devices, bf16/fp16, AutoTP.

test_emit_deepspeed.py draws dense models on A100 and H100 only; DeepSpeed-MoE's layers themselves
(``deepspeed.moe.layer.MoE`` built as launch.sh says) are checked there.
"""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported: no CUDA probing
pytest.importorskip("deepspeed")
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from deepspeed_world import DataParallelMPU, world  # noqa: E402,F401  (world: a fixture)

import planner  # noqa: E402
from cost_models.model_states import state_bytes  # noqa: E402
from planner.case import load_case  # noqa: E402
from planner.configs import render  # noqa: E402
from planner.engines.deepspeed import read as ds_reader  # noqa: E402

H100 = "h100-sxm-80gb"


def planned(model, gpu, gpus, batch, seq, precision="bf16", **search):
    return {"model": {"preset": model}, "cluster": {"gpu": gpu, "num_gpus": gpus},
            "training": {"global_batch_size": batch, "seq_len": seq, "precision": precision},
            "search": {"target": "deepspeed", **search}}


def given(model, gpu, gpus, batch, seq, layout, precision="bf16"):
    return {"model": {"preset": model}, "cluster": {"gpu": gpu, "num_gpus": gpus},
            "training": {"global_batch_size": batch, "seq_len": seq, "precision": precision, "engine": "deepspeed"},
            "layout": layout}


CASES = {
    # Mixtures of experts (DeepSpeed-MoE: etp = tp, ZeRO 0-2), planned and given.
    "mixtral_h100": planned("mixtral-8x7b", H100, 64, 256, 4096),
    "qwen3_moe_a100": planned("qwen3-30b-a3b", "a100-sxm-80gb", 32, 256, 4096),
    "deepseek_v2_lite_mi300x": planned("deepseek-v2-lite", "mi300x", 16, 128, 4096),
    "gpt_oss_20b_h200": planned("gpt-oss-20b", "h200-sxm-141gb", 16, 128, 4096),
    "mixtral_autotp_ep_zero2": given("mixtral-8x7b", "a100-sxm-80gb", 64, 256, 4096,
                                     {"tp": 2, "ep": 4, "etp": 2, "zero_stage": 2, "recompute": "full"}),
    "mixtral_pipeline_ep": given("mixtral-8x7b", H100, 64, 256, 4096,
                                 {"pp": 4, "ep": 8, "etp": 1, "zero_stage": 1, "micro_batch_size": 1}),
    # ZeRO-Offload: the optimizer (planned: nothing else fits 70B on 8 H100s), then the parameters too.
    "llama3_70b_optimizer_offload": planned("llama3-70b", H100, 8, 32, 4096),
    "zero3_param_offload_mi300x": given("llama3-8b", "mi300x", 8, 64, 4096,
                                        {"zero_stage": 3, "offload_optimizer": 1.0, "offload_params": True,
                                         "micro_batch_size": 2, "recompute": "full"}),
    "zero2_optimizer_offload_a100": given("llama2-7b", "a100-sxm-40gb", 8, 64, 4096,
                                          {"zero_stage": 2, "offload_optimizer": 1.0, "micro_batch_size": 1,
                                           "recompute": "full"}),
    # ZeRO-3 and other precisions on other GPUs.
    "fp16_zero3_a100_40": planned("llama2-7b", "a100-sxm-40gb", 16, 256, 4096, "fp16"),
    "fp8_zero3_b200": planned("llama3-8b", "b200", 16, 256, 8192, "fp8", zero_stage=3),
    # AutoTP runs with ZeRO up to 2 (the planner refuses 3, as DeepSpeed does).
    "autotp_zero1_h200": given("llama3-70b", "h200-sxm-141gb", 32, 128, 4096,
                               {"tp": 4, "zero_stage": 1, "micro_batch_size": 1, "recompute": "full"}),
    "mi325x_planned": planned("llama2-13b", "mi325x", 16, 256, 4096),
    "mi300x_planned": planned("llama3-8b", "mi300x", 32, 512, 8192),
}

_estimates: dict[str, object] = {}


def estimate_of(label: str):
    if label not in _estimates:
        case = CASES[label]
        _estimates[label] = planner.estimate(case) if "layout" in case else planner.plan(case, top_k=0).best
    assert _estimates[label] is not None, f"{label}: nothing fits"
    return _estimates[label]


def test_the_cases_reach_what_the_dense_draws_do_not():
    layouts = [estimate_of(label).job.layout for label in CASES]
    models = [estimate_of(label).job.model for label in CASES]
    assert sum(m.is_moe for m in models) >= 6
    assert any(m.is_moe and lay.tp > 1 for m, lay in zip(models, layouts))
    assert any(m.is_moe and lay.pp > 1 for m, lay in zip(models, layouts))
    assert any(lay.offload_params for lay in layouts) and any(lay.offload_optimizer == 1 for lay in layouts)
    assert {lay.zero_stage for lay in layouts} >= {1, 2, 3}
    gpus = {estimate_of(label).job.cluster.gpu.name for label in CASES}
    assert len(gpus) >= 6, gpus


@pytest.mark.parametrize("label", CASES)
def test_deepspeed_reads_the_plan_back(label, tmp_path, world):
    estimate = estimate_of(label)
    job = estimate.job
    planned_json = estimate.to_dict()  # what plan --json prints
    layout = planned_json["layout"]
    files, _ = render(estimate, "deepspeed", "case.yaml")  # what plan --emit writes
    path = tmp_path / "ds_config.json"
    path.write_text(files["ds_config.json"])

    world(layout["dp"])
    alone = DeepSpeedConfig(str(path), mpu=None)
    world(job.cluster.num_gpus)
    launched = DeepSpeedConfig(str(path), mpu=DataParallelMPU(layout["dp"]))
    for got in (alone, launched):
        assert got.world_size == layout["dp"]
        assert got.train_batch_size == CASES[label]["training"]["global_batch_size"]
        assert got.train_micro_batch_size_per_gpu == layout["micro_batch_size"]
        assert got.gradient_accumulation_steps == planned_json["grad_accum"]
        assert got.train_batch_size == got.train_micro_batch_size_per_gpu * got.gradient_accumulation_steps * layout["dp"]
        assert got.zero_optimization_stage == layout["zero_stage"]
        precision = CASES[label]["training"]["precision"]
        assert got.bfloat16_config.enabled == (precision in ("bf16", "fp8"))
        assert got.float16_config.enabled == (precision == "fp16")
        # AutoTP splits the model without a pipeline; a pipeline's model splits its own layers.
        assert got.tensor_parallel_config.autotp_size == (layout["tp"] if layout["tp"] > 1 and layout["pp"] == 1 else 0)
        zero = got.zero_config
        offload_optimizer = zero.offload_optimizer.device if zero.offload_optimizer is not None else "none"
        offload_param = zero.offload_param.device if zero.offload_param is not None else "none"
        assert offload_optimizer == ("cpu" if layout.get("offload_optimizer") else "none")
        assert offload_param == ("cpu" if layout.get("offload_params") else "none")
        if zero.offload_optimizer is not None:  # all of it (DeepSpeed's ratio 1), pinned for the timed copies
            assert zero.offload_optimizer.ratio == 1.0 and zero.offload_optimizer.pin_memory
        if layout["zero_stage"] >= 1:  # reductions overlapped with the backward, as priced (not in a pipeline)
            assert zero.overlap_comm == (layout["pp"] == 1 or layout["zero_stage"] == 3)
    assert (alone.grad_accum_dtype == "fp32") == (state_bytes(job.training).gradients == 4)
    assert ("activation_checkpointing" in json.loads(path.read_text())) == (layout["recompute"] == "full")

    # The planner's own reader gives the layout back from the file, ep from its planned-layout line.
    read = ds_reader.read(path, load_case(CASES[label]))
    assert (read.dp, read.tp, read.pp, read.micro_batch_size, read.zero_stage, read.recompute, read.ep) == \
        (layout["dp"], layout["tp"], layout["pp"], layout["micro_batch_size"], layout["zero_stage"],
         layout["recompute"], layout.get("ep", 1))
    assert (read.offload_optimizer, read.offload_params) == (layout.get("offload_optimizer", 0),
                                                             layout.get("offload_params", False))
