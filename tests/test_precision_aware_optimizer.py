"""Megatron's precision-aware optimizer: what its master weights take, with and without optimizer
offload, against what the estimate prices (``model_states.state_bytes``: a 4-byte fp32 master and
Adam's two 4-byte moments, 12 bytes of optimizer state a parameter).

The emitter writes --use-precision-aware-optimizer only beside --optimizer-cpu-offload
(validate_args asks it of an offload), where megatron-core's HybridDeviceOptimizer steps fp32 copies of
the bf16 shards: the 12 bytes priced. Without offload the flag hands the master to Transformer Engine's
FusedAdam with ``store_param_remainders``, which keeps it in 2 bytes under --bf16: not priced, so
`diagnose --megatron-args` refuses it naming the flag."""

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


def test_diagnose_refuses_the_remainders_it_does_not_price(tmp_path):
    """--use-precision-aware-optimizer without offload was read and priced with a 4-byte fp32 master,
    where megatron-core keeps 2 bytes: refused, naming the file and the flag."""
    case, args = _files(tmp_path, ARGS)
    with pytest.raises(CaseError, match=r"args.txt: --use-precision-aware-optimizer: without "
                                        r"--optimizer-cpu-offload, under --bf16, .*16-bit remainders"):
        diagnose(case, megatron_args=args)
    case, args = _files(tmp_path, ARGS + "--main-params-dtype fp16\n")
    with pytest.raises(CaseError, match=r"--main-params-dtype fp16 and no --optimizer-cpu-offload"):
        diagnose(case, megatron_args=args)


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
