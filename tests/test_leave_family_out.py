"""`validate-published --leave-family-out` (planner/leave_family_out.py): each MoE family scored with the
figures fitted to published runs refit without it, and nothing of the refit left behind."""

from __future__ import annotations

import copy

import pytest
import yaml

from planner import leave_family_out as lfo
from planner import refit
from planner.errors import CaseError
from planner.presets import fabric_presets, performance_presets
from planner.published_runs import gpu_preset, load_rows

from cli_in_process import run_cli


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


def _memory_only() -> dict:
    """torchao's Llama 3 8B run on H100 with its tokens/s taken away: its peak memory alone is measured."""
    row = next(r for r in load_rows() if r["id"] == "torchao_float8_h100_llama3_8b_8gpu_bf16")
    return {**row, "measured": {**row["measured"], "tokens_per_sec_per_gpu": None}}


def test_a_fit_to_runs_with_no_tokens_per_s_is_refused_naming_what_is_missing():
    """The fit minimises the error of tokens/s (planner/refit.py): runs that measure memory alone give it
    nothing to score, and its objective raised a TypeError (None + a float). Refused, naming the runs and
    the measurement missing; the presets left as they were."""
    before = copy.deepcopy(performance_presets())
    with refit.held(), pytest.raises(CaseError, match=r"^runs\.yaml: measured: expected a tokens/s .*h100.*"
                                                      r"1 with memory alone"):
        refit.fit("h100", [_memory_only()], {"comm_overlap": (0.5, 0.9)}, rounds=1, source="runs.yaml")
    assert performance_presets() == before


def test_leave_family_out_with_no_other_tokens_per_s_on_the_type_exits_2_on_one_line(tmp_path):
    """Qwen3's run is the only H100 run with a tokens/s: the fit without it has nothing to fit to. It ended
    in a TypeError; now exit 2 and one line naming the file, the key and that Qwen3's runs were left out."""
    qwen = next(r for r in load_rows() if r["id"] == "mb_2606_qwen330ba3b_h100_16g_fp8")
    runs = tmp_path / "runs.yaml"
    runs.write_text(yaml.safe_dump([qwen, _memory_only()]))
    done = run_cli("validate-published", str(runs), "--no-experts", "--leave-family-out")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert error == [f"error: {runs}: measured: expected a tokens/s the fit can score among the h100 runs its "
                     "figures are fitted to (1 given), got none (1 with memory alone), Qwen3's runs left out"], done.stderr
