"""Megatron's precision-aware optimizer: what its master weights take, with and without optimizer
offload, against what the estimate prices (``model_states.state_bytes``).

With --optimizer-cpu-offload (validate_args asks the flag of an offload) megatron-core's
HybridDeviceOptimizer steps fp32 copies of the bf16 shards: a 4-byte master and two 4-byte moments.
Without offload the flag hands the master to Transformer Engine's FusedAdam with
``store_param_remainders``, which keeps it in 2 bytes under --bf16 (``training.master_remainders``),
and the moments in --exp-avg-dtype / --exp-avg-sq-dtype (``training.optimizer_moments``); under the
tensorwise, blockwise and mxfp8 recipes megatron-core keeps its own 4-byte fp32 master and FusedAdam the
moments alone. The planner plans, emits and reads back each."""

from __future__ import annotations

import sys
import types
from unittest import mock

import pytest
import yaml

import planner
from cost_models.model_states import state_bytes
from planner.diagnose import diagnose
from planner.errors import CaseError

CASE = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16"}}
ARGS = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096\n"
        "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1\n"
        "--micro-batch-size 1 --global-batch-size 64 --bf16 --use-distributed-optimizer\n"
        "--use-precision-aware-optimizer\n")
OFFLOAD = "--optimizer-cpu-offload --optimizer-offload-fraction 0.5 --overlap-cpu-optimizer-d2h-h2d\n"


def _files(tmp_path, args: str):
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(CASE))
    (tmp_path / "args.txt").write_text(args)
    return tmp_path / "case.yaml", tmp_path / "args.txt"


class _FusedAdam:
    """Stands in for Transformer Engine's FusedAdam, absent here, whose signature alone
    OptimizerConfig.__post_init__ reads (the four arguments it asserts TE 2.x's FusedAdam takes)."""

    def __init__(self, params, master_weight_dtype=None, exp_avg_dtype=None, exp_avg_sq_dtype=None,
                 use_decoupled_grad=False):
        pass


def _config(**kwargs):
    """megatron-core's OptimizerConfig as --bf16 --use-distributed-optimizer --use-precision-aware-optimizer
    builds it, its __post_init__ run as under Transformer Engine 2.1 or later (which megatron-core 0.16's
    FusedAdam path needs; this machine has no Transformer Engine, whose version check would fail)."""
    optimizer_config = pytest.importorskip("megatron.core.optimizer.optimizer_config")
    te = types.ModuleType("transformer_engine.pytorch.optimizers")
    te.FusedAdam = _FusedAdam
    with mock.patch.object(optimizer_config, "is_te_min_version", lambda version: True), \
            mock.patch.dict(sys.modules, {"transformer_engine": types.ModuleType("transformer_engine"),
                                          "transformer_engine.pytorch": types.ModuleType("transformer_engine.pytorch"),
                                          "transformer_engine.pytorch.optimizers": te}):
        return optimizer_config.OptimizerConfig(bf16=True, use_distributed_optimizer=True,
                                                use_precision_aware_optimizer=True, **kwargs)


def test_megatron_core_keeps_16_bit_remainders_without_offload():
    """store_param_remainders resolves True (optimizer_config.py ~192, no argument sets it), and the
    master goes to FusedAdam (use_precision_aware_optimizer_no_fp8_or_ds_fp8): distrib_optimizer.py
    ~801 makes its ``master_param`` int16 under bf16, 2 bytes, half the fp32 master priced."""
    torch = pytest.importorskip("torch")
    config = _config()
    assert config.store_param_remainders and config.use_precision_aware_optimizer_no_fp8_or_ds_fp8
    assert torch.empty(0, dtype=torch.int16).element_size() == 2


def test_hybrid_device_optimizer_steps_an_fp32_master_and_fp32_moments():
    """With --optimizer-cpu-offload the flag still resolves store_param_remainders True, but
    get_megatron_optimizer builds a HybridDeviceOptimizer without it (optimizer/__init__.py ~306-334,
    param_update_in_fp32=True, CPUAdam torch.optim.AdamW): it steps fp32 copies of the bf16 shards, and
    AdamW's moments take their dtype: 4 + 4 + 4 = 12 bytes a parameter, what state_bytes prices."""
    torch = pytest.importorskip("torch")
    config = _config(optimizer_cpu_offload=True)
    assert config.store_param_remainders and config.use_precision_aware_optimizer_no_fp8_or_ds_fp8
    hybrid = pytest.importorskip("megatron.core.optimizer.cpu_offloading.hybrid_optimizer")
    from megatron.core.optimizer import CPUAdam
    shard = torch.nn.Parameter(torch.randn(64, dtype=torch.bfloat16))  # the distributed optimizer's bf16 shard
    with mock.patch("torch.cuda.current_stream", lambda: None):  # no CUDA here; the streams go unused
        optimizer = hybrid.HybridDeviceOptimizer([shard], offload_fraction=1.0, cpu_optimizer_cls=CPUAdam,
                                                 gpu_optimizer_cls=CPUAdam, param_update_in_fp32=True,
                                                 overlap_cpu_optimizer_d2h_h2d=False, lr=1e-3)
    (master,) = optimizer.param_to_fp32_param.values()
    assert master.dtype == torch.float32 and master.numel() == shard.numel()
    master.grad = torch.ones_like(master)
    adam = CPUAdam([master], lr=1e-3)  # the sub-optimizer's class, stepped without HDO's CUDA copy-back hook
    adam.step()
    moments = sum(adam.state[master][k].element_size() for k in ("exp_avg", "exp_avg_sq"))
    per_param = master.element_size() + moments
    assert per_param == 12
    training = planner.estimate({**CASE, "training": {**CASE["training"], "engine": "megatron"},
                                 "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": 1,
                                            "offload_optimizer": 0.5}}).job.training
    assert state_bytes(training, 1, 8).optimizer == per_param


def test_megatron_core_keeps_its_own_fp32_master_under_per_tensor_current_scaling():
    """--fp8-recipe tensorwise with --main-params-dtype fp32: use_precision_aware_optimizer_no_fp8_or_ds_fp8
    is False (optimizer_config.py __post_init__), so distrib_optimizer.py makes ``shard_main_param =
    shard_model_param.clone().float()`` and __init__.py hands FusedAdam no ``master_weights``: 4 bytes."""
    assert not _config(fp8_recipe="tensorwise").use_precision_aware_optimizer_no_fp8_or_ds_fp8
    assert _config(fp8_recipe="delayed").use_precision_aware_optimizer_no_fp8_or_ds_fp8


LLAMA_PARAMS = 8_030_261_248  # llama3-8b: the preset's parameter count (embedding and head untied)
ZERO1 = {"dp": 8, "tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 1, "recompute": "full"}


def _megatron(training: dict, layout: dict = ZERO1) -> "planner.Estimate":
    return planner.estimate({**CASE, "training": {**CASE["training"], "engine": "megatron", "fp32_grads": True,
                                                  **training}, "layout": layout})


def _megatron_default_grads(training: dict) -> "planner.Estimate":
    return planner.estimate({**CASE, "training": {**CASE["training"], "engine": "megatron", **training},
                             "layout": ZERO1})


@pytest.mark.parametrize("training, optimizer_bytes", [
    # --bf16, FusedAdam with the master: remainders (int16, distrib_optimizer.py ~801, FusedAdam
    # _initialize_state ``zeros_like(param, dtype=torch.int16)``) 2 + exp_avg 2 + exp_avg_sq 2 (bf16).
    ({"optimizer_moments": "bf16"}, 2 + 2 + 2),
    # --use-precision-aware-optimizer with fp32 moments: remainders 2 + 4 + 4.
    ({"master_remainders": True}, 2 + 4 + 4),
    # fp8 delayed (Megatron runs it with --bf16 weights): as bf16.
    ({"optimizer_moments": "bf16", "precision": "fp8", "fp8_recipe": "delayed"}, 2 + 2 + 2),
    # fp8 tensorwise: megatron-core's fp32 shard (4) + FusedAdam's bf16 moments 2 + 2.
    ({"optimizer_moments": "bf16", "precision": "fp8", "fp8_recipe": "tensorwise", "fp8_param_gather": False},
     4 + 2 + 2),
    # No precision-aware optimizer: Float16OptimizerWithFloat16Params' fp32 master 4 + moments 4 + 4.
    ({}, 4 + 4 + 4),
])
def test_a_bf16_megatron_job_at_zero_1_holds_what_megatron_core_allocates(training, optimizer_bytes):
    """Per parameter on a rank of the distributed optimizer over dp 8: bf16 weights 2 + fp32 gradient
    buffer 4 (--bf16's main_grads, whole on every rank at ZeRO 1) + the optimizer's shard, 1/8 of its
    bytes: 2 + 4 + 6/8 with bf16 moments and remainders against 2 + 4 + 12/8 before."""
    est = _megatron(training)
    if "precision" not in training:  # fp8 holds its weights' quantized copies beside them (not the matter here)
        assert est.peak.parameters == pytest.approx(2 * LLAMA_PARAMS)
    assert est.peak.gradients == pytest.approx(4 * LLAMA_PARAMS)
    assert est.peak.optimizer_states == pytest.approx(optimizer_bytes * LLAMA_PARAMS / 8)


def test_remainders_drop_the_master_copy_and_the_gradient_cast_from_the_step():
    """With bf16 gradients (--grad-reduce-in-bf16) the distributed optimizer casts its shard of them to fp32
    for an fp32 master (``shard_model_grad.float()``: 4 bytes a parameter of the shard, held at the step);
    FusedAdam holding the remainders reads a view of them (``decoupled_grad``): nothing. And the step
    streams per parameter of the shard, the gradient read 2, remainders 2 + 2, moments (2 + 2)·2, the bf16
    weights read and written 2 + 2, clipping 3·2, the buffer zeroed 2: 26, where the fp32 master's step
    (2 + (4 + 4 + 4)·2 + 2, clipping 6, zeroing 2, the master read again by the copy kernel 4) moves 40:
    the step, HBM-bound on the same shard, takes 26/40 of the time."""
    from cost_models.memory import step_gradient_copy_bytes
    plain, remainders = (_megatron({"fp32_grads": False, **t}) for t in ({}, {"optimizer_moments": "bf16"}))
    shard = LLAMA_PARAMS / 8
    assert step_gradient_copy_bytes(plain.job, 0) == pytest.approx(4 * shard)
    assert step_gradient_copy_bytes(remainders.job, 0) == 0
    assert remainders.time.optimizer_s / plain.time.optimizer_s == pytest.approx(26 / 40, rel=1e-9)


@pytest.mark.parametrize("training, layout, key, expected", [
    ({"optimizer_moments": "bf16"}, {**ZERO1, "zero_stage": 0}, "training.optimizer_moments",
     "needs the distributed optimizer"),
    ({"optimizer_moments": "bf16"}, {**ZERO1, "zero_stage": 3}, "training.optimizer_moments",
     "needs the distributed optimizer"),
    ({"optimizer_moments": "bf16"}, {**ZERO1, "offload_optimizer": 1.0}, "layout.offload_optimizer",
     "HybridDeviceOptimizer"),
    ({"optimizer_moments": "bf16", "precision": "fp16"}, ZERO1, "training.optimizer_moments", "under fp16 weights"),
    ({"master_remainders": True, "precision": "fp8", "fp8_recipe": "blockwise", "fp8_param_gather": False}, ZERO1,
     "training.master_remainders", "keeps its own fp32 master"),
    ({"master_remainders": False, "optimizer_moments": "bf16"}, ZERO1, "training.master_remainders",
     "no argument turns it off"),
    ({"optimizer_moments": "bf16", "precision": "fp8", "fp8_recipe": "delayed", "fp8_param_gather": True}, ZERO1,
     "training.fp8_param_gather", "master of fp8 weights"),
])
def test_megatron_refuses_what_megatron_core_runs_otherwise(training, layout, key, expected):
    with pytest.raises(CaseError) as error:
        _megatron(training, layout)
    assert error.value.key == key and expected in error.value.expected


@pytest.mark.parametrize("engine", ["any", "deepspeed", "torchtitan", "nanotron"])
def test_engines_without_transformer_engines_fused_adam_refuse_the_remainders(engine):
    case = {**CASE, "training": {**CASE["training"], "engine": engine, "master_remainders": True},
            "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": 3 if engine == "torchtitan" else 1,
                       "recompute": "full"}}
    with pytest.raises(CaseError) as error:
        planner.estimate(case)
    assert error.value.key == "training.master_remainders" and "not as remainders" in error.value.expected


def test_the_remainders_need_bf16_weights_to_complete():
    from cost_models.specs import SpecError, TrainingSpec
    with pytest.raises(SpecError, match="not fp16"):
        TrainingSpec(global_batch_size=8, seq_len=8, precision="fp16", master_remainders=True)
    with pytest.raises(SpecError, match="fp8_param_gather true keeps the weights quantized"):
        TrainingSpec(global_batch_size=8, seq_len=8, precision="fp8", master_remainders=True, fp8_param_gather=True)


@pytest.mark.parametrize("extra, moments, remainders", [
    ("--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16\n", "bf16", True),
    ("", "fp32", True),
    ("--fp8-format hybrid --fp8-recipe tensorwise --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16\n", "bf16", False),
])
def test_diagnose_reads_the_precision_aware_optimizer_as_megatron_core_runs_it(tmp_path, extra, moments, remainders):
    """--use-precision-aware-optimizer without offload was refused (its remainders were not priced): read now
    as the moments' dtype and the master megatron-core keeps, and priced as the same layout planned."""
    case = CASE
    if "--fp8-format" in extra:
        case = {**CASE, "training": {**CASE["training"], "precision": "fp8"}}
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    (tmp_path / "args.txt").write_text(ARGS + extra)
    read = diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "args.txt").estimate
    assert (read.job.training.optimizer_moments, read.job.training.master_remainders) == (moments, remainders)
    shard_bytes = (2 if remainders else 4) + (2 + 2 if moments == "bf16" else 4 + 4)
    params = read.peak.parameters / 2 if "--fp8-format" not in extra else None
    if params:
        assert read.peak.optimizer_states == pytest.approx(shard_bytes * params / 8)


def test_diagnose_still_refuses_an_fp16_master(tmp_path):
    case, args = _files(tmp_path, ARGS + "--main-params-dtype fp16\n")
    with pytest.raises(CaseError, match=r"--main-params-dtype fp16 and no --optimizer-cpu-offload"):
        diagnose(case, megatron_args=args)


def test_the_emitted_precision_aware_optimizer_reads_back_as_the_case(tmp_path):
    """plan --emit megatron of a case with bf16 moments writes the flags megatron-core needs for them, and
    diagnose of those arguments gives back the same training and the same peak."""
    from planner.engines.megatron.emit import arguments
    planned = _megatron_default_grads({"optimizer_moments": "bf16"})
    args = dict(arguments(planned.job))
    assert "--use-precision-aware-optimizer" in args and "--optimizer-cpu-offload" not in args
    assert (args["--exp-avg-dtype"], args["--exp-avg-sq-dtype"]) == ("bf16", "bf16")
    text = " ".join(k if v is None else f"{k} {v}" for k, v in arguments(planned.job))
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(
        {**CASE, "training": {**CASE["training"], "engine": "megatron", "optimizer_moments": "bf16"}}))
    (tmp_path / "args.txt").write_text(text + "\n")
    read = diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "args.txt").estimate
    for field in ("optimizer_moments", "master_remainders", "fp8_param_gather"):
        assert getattr(read.job.training, field) == getattr(planned.job.training, field), field
    assert read.job.layout == planned.job.layout
    assert read.peak.total == pytest.approx(planned.peak.total)
    assert read.step_time_s == pytest.approx(planned.step_time_s)


def test_diagnose_prices_the_offloaded_precision_aware_optimizer_as_the_plan(tmp_path):
    """With offload (what the emitter writes) the launch is priced as the same layout planned."""
    case, args = _files(tmp_path, ARGS + OFFLOAD + "--grad-reduce-in-bf16\n")
    read = diagnose(case, megatron_args=args).estimate
    assert read.job.layout.offload_optimizer == 0.5
    planned = planner.estimate({**CASE, "training": {**CASE["training"], "engine": "megatron",
                                                     "fp32_grads": False},
                                "layout": {"dp": 8, "tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 1,
                                           "offload_optimizer": 0.5}})
    assert read.peak.total == pytest.approx(planned.peak.total)
    assert read.host_bytes == pytest.approx(planned.host_bytes)
    assert read.host_bytes > 0


def test_the_report_says_the_master_is_kept_as_remainders():
    from planner.report import describe_layout
    assert describe_layout(_megatron({"optimizer_moments": "bf16"})).endswith(
        "Adam's moments in bf16, fp32 master kept as remainders of the bf16 weights")
    assert "remainders" not in describe_layout(_megatron({"optimizer_moments": "bf16", "precision": "fp8",
                                                          "fp8_recipe": "tensorwise", "fp8_param_gather": False}))
