"""A published row's GPU name that is another part than the SXM preset, and a row that gives no GPU count."""

from __future__ import annotations

import pytest

from planner.published_runs import case_of, gpu_preset


@pytest.mark.parametrize("name", ["H100_NVL", "H100NVL", "H100 PCI-E", "H100-PCI-E-80GB", "A1000", "H1000"])
def test_another_part_or_number_of_a_family_is_no_sxm_preset(name):
    # Each was scored as the H100 / A100 SXM module, with no word.
    assert gpu_preset(name) is None


@pytest.mark.parametrize("name, preset", [("GB200 NVL72", "gb200"), ("H100 SXM5 NVLink", "h100-sxm-80gb"),
                                          ("A100-SXM4-80GB", "a100-sxm-80gb"), ("NVIDIA H200-SXM5-141GB", "h200-sxm-141gb"),
                                          ("NVIDIA Blackwell GPU (GB200) 189471 MiB", "gb200")])
def test_the_sxm_parts_and_racks_keep_their_presets(name, preset):
    assert gpu_preset(name) == preset


def test_a_row_without_num_gpus_is_skipped_naming_the_key():
    # It reached grid_problem and was "a field has the wrong type or is missing (unsupported operand ...)".
    row = {"id": "r", "record_type": "measured_throughput", "framework": "torchtitan", "gpu": "H100", "num_gpus": None,
           "precision": "bf16", "recompute": "none", "source": "s",
           "model": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336, "ffn_act": "swiglu",
                     "vocab": 128256, "seq_len": 8192},
           "parallel": {"dp": 64, "tp": 1, "pp": 1}, "batch": {"global_batch_size": 64, "micro_batch_size": 1},
           "measured": {"tokens_per_sec_per_gpu": 2904}}
    case, why = case_of(row)
    assert case is None and "num_gpus" in why


@pytest.mark.parametrize("local", ["2", -2, 0, 2.0, True])
def test_a_local_batch_that_is_no_whole_count_is_refused_naming_it(local):
    # It was passed over, and the batch checked against micro_batch_size without a word.
    from planner.published_runs import row_problem

    row = {"id": "r", "record_type": "measured_throughput", "framework": "NeMo AutoModel", "gpu": "H100",
           "num_gpus": 8, "source": "s", "model": {"layers": 2}, "parallel": {"tp": 1},
           "batch": {"global_batch_size": 16, "micro_batch_size": 1, "grad_accum": 1, "local_batch_size": local}}
    assert row_problem(row)[0] == "batch.local_batch_size"


@pytest.mark.parametrize("name", ["NVIDIA  H100", "  H100   SXM  ", "H100\tSXM5 80GB"])
def test_a_gpu_name_with_extra_spaces_reads_as_its_preset(name):
    """"NVIDIA  H100" and "  H100   SXM  " were refused as not supported rows where "nvidia h100" was read
    as the H100 SXM: a name's spaces are single, and its ends bare, before the presets are looked up."""
    assert gpu_preset(name) == gpu_preset("nvidia h100") == "h100-sxm-80gb"
