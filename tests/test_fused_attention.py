"""training.fused_attention: which attention kernel a case's stack runs, priced at its own figure."""

from __future__ import annotations

import pytest

import planner
from cost_models.kernels import flash_attention_time
from planner.case import load_case
from planner.errors import CaseError

FLOPS, HEAD_DIM, KEYS = 4.0e12, 128, 8192


def _case(engine: str, **training) -> dict:
    return {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 8, "seq_len": 8192, "engine": engine, **training},
            "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": 3 if engine == "torchtitan" else 1}}


def test_a_fused_kernel_runs_at_the_fused_efficiency():
    """H100: FlashAttention-2 at 0.33 of the bf16 peak (328 TFLOP/s), Transformer Engine's cuDNN
    kernel at 0.55 (presets/performance.yaml): the same attention FLOPs take 0.33/0.55 of the
    time, less the kernel's fixed cost."""
    gpu = load_case(_case("any")).cluster.gpu
    t0 = gpu.performance.kernel_overhead_s
    flash = flash_attention_time(FLOPS, HEAD_DIM, KEYS, 1, gpu, "bf16", fused=False) - t0
    fused = flash_attention_time(FLOPS, HEAD_DIM, KEYS, 1, gpu, "bf16", fused=True) - t0
    assert fused / flash == pytest.approx(0.33 / 0.55)


def test_a_case_names_its_attention_kernel_over_the_engines_default():
    """A plain PyTorch stack ('any') runs FlashAttention-2-class attention unless its case says it
    runs Transformer Engine's fused one; the step is then shorter by what attention saves alone."""
    plain = planner.estimate(_case("any"))
    fused = planner.estimate(_case("any", fused_attention=True))
    assert (plain.job.training.attention_fused, fused.job.training.attention_fused) == (False, True)
    assert load_case(_case("megatron")).job().training.attention_fused is True
    assert fused.step_time_s < plain.step_time_s
    assert fused.peak.total == plain.peak.total  # the same tensors saved: q, k, v, output, log-sum-exp


@pytest.mark.parametrize("engine, value, words", [
    ("megatron", False, "DotProductAttention"),
    ("torchtitan", True, "scaled_dot_product_attention"),
])
def test_an_engine_with_one_attention_kernel_refuses_the_other_by_key(engine, value, words):
    with pytest.raises(CaseError) as error:
        planner.estimate(_case(engine, fused_attention=value))
    assert error.value.key == "training.fused_attention" and words in error.value.expected


def test_a_fused_kernel_keeps_no_scores_so_it_needs_flash_attention():
    with pytest.raises(CaseError) as error:
        load_case(_case("any", fused_attention=True, flash_attention=False))
    assert error.value.key == "training.fused_attention"


def test_automodel_rows_run_transformer_engines_attention_where_their_kernels_say_so():
    """NeMo AutoModel's rows name their kernels: "TE + DeepEP" runs TE's attention; the Nemotron 3
    rows' TorchSDPA and GPT-OSS's FlexAttn do not."""
    from planner.published_runs import case_of, fused_attention, load_rows

    rows = {r["id"]: r for r in load_rows()}
    assert case_of(rows["automodel_qwen330ba3b_h100_8g_bf16"])[0]["training"]["fused_attention"] is True
    assert "fused_attention" not in case_of(rows["automodel_gptoss20b_h100_8g_bf16"])[0]["training"]
    assert fused_attention(rows["automodel_nemotron3nano_h100_8g_bf16"]) is None  # TorchSDPA
