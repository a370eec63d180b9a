"""Adam's moments in bf16 beside fp32 master weights (``training.optimizer_moments: bf16``): 2 bytes
each, as torchtitan's optimizer.implementation "fused_opt_states_bf16" creates them
(OptimizersContainer._register_bf16_optimizer_state_hook, measured here on CPU torch). The case
states it (it changes the numerics); engines that cannot keep them so refuse it, naming the key."""

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
        "training": {"global_batch_size": 64, "seq_len": 4096, "optimizer_moments": "bf16"},
        "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": 3, "recompute": "full"}}


def _moment_bytes(implementation: str) -> int:
    """Bytes of Adam's state a parameter holds (its step counter aside) under torchtitan's
    ``optimizer.implementation``, as the optimizer creates them for its first step. torchtitan's
    bf16 hook creates the states in a step pre-hook; CPU torch's fused Adam refuses the mixed dtypes
    that the CUDA kernel steps (FusedAdamMathFunctorMP), so the hooks are run, not the step."""
    torch = pytest.importorskip("torch")
    optimizer_module = pytest.importorskip("torchtitan.components.optimizer")
    linear = torch.nn.Linear(16, 16)  # float32: torchtitan's FSDP2 master, which the optimizer steps
    config = optimizer_module.default_adamw()
    config.implementation = implementation
    container = optimizer_module.OptimizersContainer(config, model_parts=[linear])
    linear(torch.randn(2, 16)).sum().backward()
    adamw = container.optimizers[0]
    for hook in adamw._optimizer_step_pre_hooks.values():
        hook(adamw, (), {})
    if not adamw.state[linear.weight]:  # no hook: torch's own lazy init, in the first step (fp32 steps on CPU)
        container.step()
    return sum(t.element_size() for k, t in adamw.state[linear.weight].items() if k != "step")


def test_the_moments_torchtitan_keeps_in_bf16_are_what_the_model_prices():
    """fp32 master and bf16 moments: 4 + 2 + 2 bytes of optimizer state beside 2 + 2 of weights and
    gradients (12, against mixed precision's 16); where the weights are the fp32 master (FSDP's shards,
    torchtitan at every degree), the optimizer keeps only the moments: 4 bytes, against 8."""
    bf16, fp32 = _moment_bytes("fused_opt_states_bf16"), _moment_bytes("fused")
    assert (bf16, fp32) == (4, 8)
    mixed = TrainingSpec(global_batch_size=8, seq_len=8, engine=behaviour_of("any"), fp32_grads=False)
    moments = TrainingSpec(global_batch_size=8, seq_len=8, engine=behaviour_of("any"), fp32_grads=False,
                           optimizer_moments="bf16")
    assert state_bytes(mixed).optimizer == 4 + fp32 and state_bytes(moments).optimizer == 4 + bf16
    assert state_bytes(moments).total == 12
    titan = TrainingSpec(global_batch_size=8, seq_len=8, engine=behaviour_of("torchtitan"), optimizer_moments="bf16")
    assert weights_are_master(titan, 3, 8) and state_bytes(titan, 3, 8).optimizer == bf16
    # The fused step reads the gradient and the master, reads and writes the master and both moments:
    # 4 + 2·(4 + 2 + 2) + 4 (the fp32 weights it writes are the master it read) = 24 where fp32's are 32.
    per_param = state_bytes(titan, 3, 8)
    assert adam_step_bytes(per_param, True) == 4 + 2 * 4 + 2 * 4


def test_llama3_8b_under_fsdp_holds_a_quarter_less_model_state():
    """8.03 G parameters over 8 shards: 4 + 4 + 4 bytes each with bf16 moments against 16 with fp32's;
    nothing but the model states moves."""
    bf16 = planner_estimate({**CASE, "training": {**CASE["training"], "engine": "torchtitan"}})
    fp32 = planner_estimate({**CASE, "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "torchtitan"}})
    states = lambda e: e.peak.parameters + e.peak.gradients + e.peak.optimizer_states  # noqa: E731
    assert states(fp32) - states(bf16) == pytest.approx(4 * 8.03e9 / 8, rel=2e-3)
    assert bf16.peak.optimizer_states == pytest.approx(fp32.peak.optimizer_states / 2)
    assert bf16.peak.activations == fp32.peak.activations


@pytest.mark.parametrize("training, expected", [
    ({"optimizer": "sgd"}, "needs optimizer adam or adamw, not sgd"),
    ({"master_weights": False}, "it needs master_weights true"),
])
def test_what_cannot_keep_bf16_moments_is_refused(training, expected):
    with pytest.raises(SpecError, match=re.escape(expected)):
        TrainingSpec(global_batch_size=8, seq_len=8, optimizer_moments="bf16", **training)


def test_a_word_for_the_moments_names_the_key():
    with pytest.raises(CaseError) as error:
        load_case({**CASE, "training": {**CASE["training"], "optimizer_moments": "fp8"}})
    assert error.value.key == "training.optimizer_moments" and "bf16" in error.value.expected
    assert load_case({**CASE, "training": {**CASE["training"], "optimizer_moments": "fp32"}}).training \
        == load_case({**CASE, "training": {"global_batch_size": 64, "seq_len": 4096}}).training


@pytest.mark.parametrize("engine, reason", [
    ("deepspeed", "bf16_optimizer_states requires bf16_master_weights_and_grads"),
    ("nanotron", "fp32 master's dtype"),
])
def test_engines_that_keep_fp32_moments_beside_an_fp32_master_refuse_the_case(engine, reason):
    """(Megatron runs them: tests/test_precision_aware_optimizer.py.)"""
    case = {**CASE, "training": {**CASE["training"], "engine": engine},
            "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": 1}}
    with pytest.raises(CaseError) as error:
        planner_estimate(case)
    assert error.value.key == "training.optimizer_moments" and reason in error.value.expected
    assert error.value.expected.endswith("fp32, not bf16")


def test_the_report_says_the_moments_are_bf16():
    from planner.report import describe_layout
    assert describe_layout(planner_estimate(CASE)).endswith(", Adam's moments in bf16")
    plain = {**CASE, "training": {"global_batch_size": 64, "seq_len": 4096}}
    assert "moments" not in describe_layout(planner_estimate(plain))
