"""`validate-published --leave-family-out` (planner/leave_family_out.py): each MoE family scored with the
figures fitted to published runs refit without it, and nothing of the refit left behind."""

from __future__ import annotations

import copy

from planner import leave_family_out as lfo
from planner.presets import fabric_presets, performance_presets
from planner.published_runs import gpu_preset, load_rows


def test_families_are_read_from_the_model_name_and_dense_models_have_none():
    assert lfo.family_of({"model": {"name": "DeepSeek-V3", "moe": {"num_experts": 256}}}) == "DeepSeek"
    assert lfo.family_of({"model": {"name": "Llama-4-Scout-17B-16E", "moe": {"num_experts": 16}}}) == "Llama 4"
    assert lfo.family_of({"model": {"name": "gpt-oss-20b", "moe": {"num_experts": 32}}}) == "GPT-OSS"
    assert lfo.family_of({"model": {"name": "Llama 3 70B"}}) is None


def test_the_reference_refit_takes_every_run_of_the_type_dense_ones_included():
    """In family, the figures are refit on every run on the GPU type, as the presets were; left out,
    on all of them but the family's. The reference once took only the runs of some family (a dense
    model's family is None), so GPT-OSS's one run compared a fit on the H100 mixtures of experts
    alone with one on every H100 run but its own: a ratio of 15 from the fit's inputs, not the family."""
    rows = [{"id": "dense", "gpu": "H100 SXM5 80GB", "model": {"name": "Llama 3 70B"}},
            {"id": "oss", "gpu": "H100 SXM5 80GB", "model": {"name": "gpt-oss-120b", "moe": {"num_experts": 128}}},
            {"id": "kimi", "gpu": "H100 SXM5 80GB", "model": {"name": "Kimi-K2", "moe": {"num_experts": 384}}},
            {"id": "a100", "gpu": "A100 SXM4 80GB", "model": {"name": "Llama 3 70B"}}]
    assert [r["id"] for r in lfo.fitted_rows(rows, "h100", None)] == ["dense", "oss", "kimi"]
    assert [r["id"] for r in lfo.fitted_rows(rows, "h100", "GPT-OSS")] == ["dense", "kimi"]


def test_a_family_only_gb200_fitted_is_refit_without_it_and_the_presets_are_left_as_they_were():
    """Mixtral's and Llama 4's runs are on GB200 (whose fp8 GEMM figure was fitted to its published runs) and
    B200 (whose were not): each is scored with GB200's figure refit without it, and only GB200 counts as
    having seen it. Afterwards the presets are as shipped."""
    rows = [r for r in load_rows() if gpu_preset(str(r.get("gpu", ""))) in ("gb200", "b200")
            and lfo.family_of(r) in (None, "Mixtral", "Llama 4")]
    before = copy.deepcopy(performance_presets()), copy.deepcopy(fabric_presets())
    scores = {s.family: s for s in lfo.evaluate_families(rows)}
    assert (copy.deepcopy(performance_presets()), copy.deepcopy(fabric_presets())) == before
    assert set(scores) == {"Mixtral", "Llama 4"}
    for score in scores.values():
        assert score.fitted_on == ("gb200",)
        assert score.in_family is not None and score.left_out is not None and score.ratio is not None
    assert scores["Mixtral"].runs == scores["Llama 4"].runs == 2  # scored: NeMo's 8x7B on GB200 and B200 (8x22B's rows are not fully published)
