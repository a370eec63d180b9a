"""Training without master weights ("pure bf16", ``training.master_weights: false``): the optimizer
steps the bf16 weights themselves and keeps its moments in their dtype, as torch.optim does for a
model built in bf16 (NeMo AutoModel builds its models so). Measured on real PyTorch, and refused
where it cannot be what the case says."""

from __future__ import annotations

import re

import pytest

from cost_models.model_states import adam_step_bytes, state_bytes, weights_are_master
from cost_models.specs import SpecError, TrainingSpec
from planner.case import load_case
from planner.engines import behaviour_of
from planner.errors import CaseError
from planner.estimate import estimate as planner_estimate

CASE = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        "training": {"global_batch_size": 64, "seq_len": 4096, "master_weights": False},
        "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": 3, "recompute": "full"}}


def _held_bytes_per_parameter(optimizer_name: str) -> float:
    """Bytes a bf16 model holds per parameter after one step of ``optimizer_name``: its weights,
    their gradients and every tensor of the optimizer's state but Adam's step counter."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)).to(torch.bfloat16)
    if optimizer_name == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    model(torch.randn(4, 64, dtype=torch.bfloat16)).float().sum().backward()
    optimizer.step()
    params = list(model.parameters())
    held = sum(p.numel() * p.element_size() + p.grad.numel() * p.grad.element_size() for p in params)
    held += sum(t.numel() * t.element_size() for state in optimizer.state.values()
                for name, t in state.items() if name != "step" and torch.is_tensor(t))
    return held / sum(p.numel() for p in params)


@pytest.mark.parametrize("optimizer, measured_bytes, mixed_bytes", [("adam", 8, 16), ("sgd", 6, 12)])
def test_a_bf16_model_holds_what_the_model_prices(optimizer, measured_bytes, mixed_bytes):
    """torch.optim.Adam on bf16 weights: 2 bytes of weights, 2 of gradients, 2 + 2 of moments;
    SGD with momentum one 2-byte buffer. Against 16 and 12 with fp32 master weights and moments."""
    held = _held_bytes_per_parameter(optimizer)
    assert held == measured_bytes
    training = TrainingSpec(global_batch_size=8, seq_len=8, optimizer=optimizer, master_weights=False,
                            engine=behaviour_of("any"))
    assert state_bytes(training).total == held
    mixed = TrainingSpec(global_batch_size=8, seq_len=8, optimizer=optimizer, engine=behaviour_of("any"))
    assert state_bytes(mixed).total == mixed_bytes


def test_the_step_reads_and_writes_the_bf16_weights_it_steps():
    """Adam without master weights reads p, g, m, v and writes p, m, v: 7 tensors of 2 bytes.
    DeepSpeed's bf16 master partition is stepped instead and copied to the weights: it reads g
    and the master, m, v, writes those three and the weights, 8 tensors of 2 bytes."""
    training = load_case(CASE).training
    per_param = state_bytes(training, 3, 8)
    assert adam_step_bytes(per_param, weights_are_master(training, 3, 8)) == 14
    deepspeed = load_case({**CASE, "training": {**CASE["training"], "engine": "deepspeed"}}).training
    per_param = state_bytes(deepspeed, 3, 8)
    assert (per_param.total, weights_are_master(deepspeed, 3, 8)) == (10, False)
    assert adam_step_bytes(per_param, False) == 16


def test_llama3_8b_under_zero3_holds_half_the_model_states():
    """8.03 G parameters over 8 shards: 8 bytes each without master weights (8.03 GB), 16 with
    FSDP's fp32 master shards (16.06 GB); nothing else in the estimate moves."""
    pure = planner_estimate(CASE)
    mixed = planner_estimate({**CASE, "training": {**CASE["training"], "master_weights": True}})
    states = lambda e: e.peak.parameters + e.peak.gradients + e.peak.optimizer_states  # noqa: E731
    assert states(pure) == pytest.approx(8.03e9, rel=2e-3)
    assert states(mixed) == pytest.approx(2 * states(pure))
    assert pure.peak.activations == mixed.peak.activations


@pytest.mark.parametrize("training, expected", [
    ({"precision": "fp16"}, "false needs 16-bit weights kept in bf16 (precision bf16, fp8, mxfp8 or nvfp4), not fp16"),
    ({"precision": "fp32"}, "not fp32"),
    ({"fp32_grads": True}, "fp32_grads needs the fp32 master weights"),
])
def test_what_cannot_go_without_master_weights_is_refused(training, expected):
    with pytest.raises(SpecError, match=re.escape(expected)):
        TrainingSpec(global_batch_size=8, seq_len=8, master_weights=False, **training)


@pytest.mark.parametrize("engine, reason", [
    ("megatron", "--main-params-dtype: fp32, fp16"),
    ("torchtitan", "builds its models in float32"),
])
def test_engines_that_keep_master_weights_refuse_the_case(engine, reason):
    case = {**CASE, "training": {**CASE["training"], "engine": engine}, "layout": {"dp": 8, "micro_batch_size": 1}}
    with pytest.raises(CaseError) as error:
        planner_estimate(case)
    assert error.value.key == "training.master_weights" and reason in error.value.expected


def test_a_word_for_master_weights_names_the_key():
    with pytest.raises(CaseError) as error:
        load_case({**CASE, "training": {**CASE["training"], "master_weights": "no"}})
    assert error.value.key == "training.master_weights" and "true or false" in error.value.expected


def test_the_report_says_there_is_no_master_copy():
    from planner.report import describe_layout
    assert describe_layout(planner_estimate(CASE)).endswith(", no master weights (pure bf16)")
    mixed = {**CASE, "training": {**CASE["training"], "master_weights": True}}
    assert "master" not in describe_layout(planner_estimate(mixed))
    deepspeed = {**CASE, "training": {**CASE["training"], "engine": "deepspeed"}}
    assert describe_layout(planner_estimate(deepspeed)).endswith(", bf16 master weights")
