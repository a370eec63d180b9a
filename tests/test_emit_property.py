"""`plan --emit ENGINE` on generated jobs: over models, GPUs, cluster sizes, precisions and
training options, for each of the three engines, the planner either writes files the engine's
own code accepts (DeepSpeed's DeepSpeedConfig, megatron-core's TransformerConfig, torchtitan's
ConfigManager and ParallelDims), or answers that nothing fits, or refuses the case itself
with the engine's reason (fp16 for torchtitan, fp8 without fp8 tensor cores, MXFP8 or NVFP4 without
tensor cores that scale their blocks, a recipe the engine has no name for). It never plans
a layout its own emitter then refuses."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("megatron.core")
pytest.importorskip("torchtitan")

import deepspeed.comm as ds_comm  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from test_emit_megatron import parse_args, transformer_config  # noqa: E402
from test_emit_torchtitan import check_emitted, workdir  # noqa: E402,F401

import planner  # noqa: E402
from planner.configs import render  # noqa: E402
from planner.errors import CaseError  # noqa: E402

SEED = 20261130
PER_ENGINE = 10
MODELS = ("gpt-1.7b", "llama2-7b", "llama3-8b", "mistral-7b", "llama2-13b", "llama3-70b")
GPUS = ("v100-sxm-32gb", "a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "b200", "mi300x")
ENGINES = ("megatron", "deepspeed", "torchtitan")


def generated() -> list[tuple[str, dict]]:
    rng = random.Random(SEED)
    out = []
    for engine in ENGINES:
        for _ in range(PER_ENGINE):
            training = {"global_batch_size": rng.choice((32, 64, 128, 256, 512)),
                        "seq_len": rng.choice((1024, 2048, 4096, 8192)),
                        "precision": rng.choice(("fp32", "fp16", "bf16", "bf16", "fp8"))}
            if rng.random() < 0.3:
                training["tp_comm_overlap"] = True
            if rng.random() < 0.3:
                training["fp32_grads"] = rng.choice((True, False))
            out.append((engine, {"model": {"preset": rng.choice(MODELS)},
                                 "cluster": {"gpu": rng.choice(GPUS), "num_gpus": rng.choice((8, 16, 32, 64, 128))},
                                 "training": training}))
    # Low-precision recipes on the GPUs that have their formats and on some that do not.
    for engine in ENGINES:
        for gpu, precision, recipe in (("b200", "mxfp8", None), ("gb200", "nvfp4", None), ("mi355x", "mxfp8", None),
                                       ("h100-sxm-80gb", "nvfp4", None), ("h100-sxm-80gb", "fp8", "tensorwise")):
            training = {"global_batch_size": 64, "seq_len": 4096, "precision": precision}
            if recipe:
                training["fp8_recipe"] = recipe
            out.append((engine, {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": gpu, "num_gpus": 16},
                                 "training": training}))
    return out


CASES = generated()


def no_fp8_tensor_cores(case: dict) -> bool:
    return case["cluster"]["gpu"].startswith(("v100", "a100"))


def no_block_scaling(case: dict, engine: str) -> bool:
    """mxfp8 / nvfp4 where the GPU's tensor cores lack the format, DeepSpeed (no such mode) or
    torchtitan off NVIDIA Blackwell (its converters need SM100)."""
    gpu, precision = case["cluster"]["gpu"], case["training"]["precision"]
    return precision in ("mxfp8", "nvfp4") and (
        gpu.startswith(("v100", "a100", "h100", "h200", "mi300")) or (precision == "nvfp4" and gpu == "mi355x")
        or engine == "deepspeed" or (engine == "torchtitan" and gpu == "mi355x"))


@pytest.mark.parametrize("index", range(len(CASES)))
def test_plan_emits_what_the_engine_accepts_or_says_why_not(index, tmp_path, workdir, monkeypatch):  # noqa: F811
    engine, case = CASES[index]
    try:
        result = planner.plan(case, top_k=0, target=engine, engine=engine)
    except CaseError as error:
        # A case no layout can serve on this engine: refused with the key and the engine's reason.
        assert error.key.startswith("training.") or error.key == "--engine", error
        precision = case["training"]["precision"]
        assert (error.key == "training.precision" and (precision == "fp8" and no_fp8_tensor_cores(case)
                                                        or no_block_scaling(case, engine)
                                                        or precision == "bf16" and case["cluster"]["gpu"] == GPUS[0]
                                                        or engine == "torchtitan" and precision == "fp16")) \
            or error.key in ("training.fp32_grads", "training.tp_comm_overlap") \
            or error.key == "training.fp8_recipe" and engine == "torchtitan", error
        return
    if result.best is None:
        assert result.no_fit is not None and "no layout fits" in result.no_fit.describe()
        return
    best = result.best
    files, _ = render(best, engine, "case.yaml")  # what `plan --emit` writes; must not raise
    lay = best.job.layout
    if engine == "deepspeed":
        (tmp_path / "ds_config.json").write_text(files["ds_config.json"])
        monkeypatch.setattr(ds_comm, "get_world_size", lambda group=None: lay.dp)
        monkeypatch.setattr(ds_comm, "get_rank", lambda group=None: 0)
        config = DeepSpeedConfig(str(tmp_path / "ds_config.json"), mpu=None)
        assert config.train_batch_size == case["training"]["global_batch_size"]
        assert config.zero_optimization_stage == lay.zero_stage
        assert (config.zero_config.offload_optimizer is not None) == bool(lay.offload_optimizer)
        assert json.loads(files["ds_config.json"])["train_micro_batch_size_per_gpu"] == lay.micro_batch_size
        # What DeepSpeed will run is what priced the plan: reductions overlapped with the backward
        # into contiguous buffers, in the buckets the estimate sized (EngineBehaviour.bucket_params),
        # ZeRO-3's prefetch as priced (zero3_prefetch_bucket_h2 of h², zero3_max_live_parameters).
        behaviour, zero = best.job.training.engine, config.zero_config
        if lay.zero_stage in (1, 2):
            # A PipelineModule's engine turns overlap_comm off (runtime/engine.py), and the files say so.
            assert zero.overlap_comm == (lay.pp == 1) and zero.contiguous_gradients
            assert zero.reduce_bucket_size == zero.allgather_bucket_size == behaviour.bucket_params
        elif lay.zero_stage == 3:
            h = best.job.model.hidden_size
            assert zero.overlap_comm and zero.contiguous_gradients
            assert zero.prefetch_bucket_size == int(behaviour.zero3_prefetch_bucket_h2 * h * h)
            assert zero.max_live_parameters == behaviour.zero3_max_live_parameters
    elif engine == "megatron":
        args = parse_args(files["megatron_args.txt"])
        config = transformer_config(args)
        assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (lay.tp, lay.pp)
        assert "--tp-comm-overlap" not in args or "--sequence-parallel" in args
        assert int(args["--global-batch-size"]) == case["training"]["global_batch_size"]
        # What Megatron will run is what priced the plan: its DDP config as Megatron-LM builds it
        # from the arguments hides the bucketed reduction behind the backward and, where the engine's
        # behaviour credits it, the distributed optimizer's gathers behind the next forward; the TP
        # and expert-parallel overlaps are on exactly where the training priced them.
        from megatron.core.distributed import DistributedDataParallelConfig

        training, behaviour = best.job.training, best.job.training.engine
        ddp = DistributedDataParallelConfig(overlap_grad_reduce="--overlap-grad-reduce" in args,
                                            overlap_param_gather="--overlap-param-gather" in args,
                                            use_distributed_optimizer="--use-distributed-optimizer" in args)
        assert ddp.overlap_grad_reduce == (lay.dp * lay.cp > 1)
        assert ddp.overlap_param_gather == (lay.dp * lay.cp > 1 and lay.zero_stage >= 1
                                            and behaviour.overlap_param_gather)
        assert ("--tp-comm-overlap" in args) == bool(training.tp_comm_overlap and lay.tp > 1)
        assert config.overlap_moe_expert_parallel_comm == bool(training.moe_comm_overlap)
    else:
        check_emitted(best, case["training"]["global_batch_size"], workdir, f"tt_property_{index}")


def test_the_generated_jobs_reach_every_outcome():
    """Some fit and are written, some are refused up front; every engine writes some."""
    written = {engine: 0 for engine in ENGINES}
    refused = 0
    for engine, case in CASES:
        try:
            best = planner.plan(case, top_k=0, target=engine, engine=engine).best
        except CaseError:
            refused += 1
            continue
        written[engine] += best is not None
    assert refused >= 3 and all(n >= 3 for n in written.values()), (written, refused)
