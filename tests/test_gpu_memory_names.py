"""A GPU name's memory, read alike for a published row and a team's run: a module of the preset's family
with other memory is read with that memory where it differs in memory alone, and refused where no preset
holds its part."""

from __future__ import annotations

import pytest

from planner.errors import CaseError
from planner.published_runs import case_of, gpu_preset, unsupported
from planner.team_runs import runs_from_rows


def row(gpu: str, **measured) -> dict:
    # A 1.3B GPT on 8 GPUs in fp16 (the V100 has no bf16), 128 × 2048 tokens in 8 s: 6 · 1.3e9 · 262,144 /
    # 8 s / 8 GPUs = 32 TFLOP/s a GPU, a quarter of the V100's 125.
    return {"id": "run-1", "source": "our cluster", "record_type": "measured_throughput", "framework": "Megatron-Core",
            "gpu": gpu, "num_gpus": 8, "precision": "fp16",
            "model": {"name": "gpt-1.3b", "layers": 24, "hidden": 2048, "heads": 16, "kv_heads": 16, "ffn_hidden": 8192,
                      "ffn_act": "gelu", "vocab": 50304, "seq_len": 2048},
            "parallel": {"tp": 1, "pp": 1, "dp": 8, "zero_stage": 1}, "recompute": "none",
            "batch": {"global_batch_size": 128, "micro_batch_size": 1},
            "measured": {"iteration_time_s": 8.0, **measured}}


@pytest.mark.parametrize("gpu, preset, memory", [
    # The V100 datasheet's SXM2 column: "32/16 GB HBM2", one 900 GB/s and one 125 TFLOPS for both
    ("V100 SXM2 16GB", "v100-sxm-32gb", "16 GiB"), ("Tesla V100-SXM2-16GB", "v100-sxm-32gb", "16 GiB"),
    # Meta's Grand Teton H100 with 96 GB (shared/validation/score.py reads it so)
    ("H100 SXM5 96GB", "h100-sxm-80gb", "96 GiB"),
])
def test_a_module_with_other_memory_is_read_with_it_in_a_row_and_a_team_run_alike(gpu, preset, memory):
    # The 16 GB V100's row was scored as the 32 GB preset's; a team's run of it or of the 96 GB H100 was refused.
    case = case_of(row(gpu))[0]
    assert (case["cluster"]["gpu"], case["cluster"]["memory"]) == (preset, memory)
    assert runs_from_rows([row(gpu)], "runs.yaml")[0].case["cluster"]["memory"] == memory


def test_a_peak_above_the_16_gb_v100s_memory_is_refused():
    # 20 GiB fits the 32 GB preset; it cannot have been measured on a 16 GB V100.
    with pytest.raises(CaseError, match=r"run-1\.measured\.memory_gb_per_gpu: 20 GiB is above the GPU's 16 GiB"):
        runs_from_rows([row("V100-SXM2-16GB", memory_gb_per_gpu=20)], "runs.yaml")


@pytest.mark.parametrize("gpu", [
    # no H100 SXM the H100 datasheet lists (its SXM column: 80 GB HBM3, 3.35 TB/s): a 64 GB or 94 GB part has
    # other HBM stacks, so another bandwidth than the preset's
    "H100 SXM5 64GB", "NVIDIA H100-SXM5-94GB", "V100 8GB", "A100 20GB",
])
def test_a_memory_no_preset_holds_is_refused_naming_the_gpu_in_a_row_and_a_team_run(gpu):
    # Each published row was scored as the 80 GB (32 GB) preset, while a team's run of it was refused.
    assert gpu_preset(gpu) is None and case_of(row(gpu)) == (None, "not a supported row")
    key, expected = unsupported(row(gpu))
    assert key == "gpu" and "GB" in expected.split("got")[0]
    with pytest.raises(CaseError, match=r"runs.yaml: run-1\.gpu: .*is no GPU the planner has a preset for"):
        runs_from_rows([row(gpu)], "runs.yaml")


@pytest.mark.parametrize("gpu, preset", [
    # a link's bandwidth and a network's speed beside the GPU are no memory (the published rows' names)
    ("H800 (NVLink 160 GB/s intra-node, IB 50 GB/s inter-node)", "h800"), ("A100-40GB (1600 Gbps RoCE)", "a100-sxm-40gb"),
    ("NVIDIA H100-SXM5-80GB 81559 MiB [Eos-dfw (64x NVIDIA HGX H100)]", "h100-sxm-80gb"),
])
def test_a_bandwidth_beside_the_gpu_is_no_memory(gpu, preset):
    assert gpu_preset(gpu) == preset and "memory" not in case_of(row(gpu))[0]["cluster"]


@pytest.mark.parametrize("gpu, system, domain", [
    # NVIDIA's GB200 comes as the NVL72 rack (72 GPUs on its NVLink switch trays: the preset) or as NVL36x2,
    # racks of 36 on NVL36 switch trays (NVIDIA's multi-node NVLink tuning guide: "36x2 and 72x1
    # configurations"), and the NVL4 and NVL2 boards; a run's schema has no key for another NVLink domain
    ("GB200 NVL36", "NVL36", 72), ("GB200 NVL36x2", "NVL36", 72), ("GB200 NVL4", "NVL4", 72),
    # the H100 SXM module's NVLink domain is its 8-GPU NVSwitch board (DGX H100 datasheet); no NVL72 holds it
    ("H100 NVL72", "NVL72", 8),
])
def test_another_nvlink_system_is_refused_naming_the_presets_domain(gpu, system, domain):
    # It was refused with the generic list of parts, naming neither the system nor the preset's NVLink domain.
    key, expected = unsupported(row(gpu))
    assert key == "gpu" and f"{system} is another NVLink system" in expected
    assert f"an NVLink domain of {domain} GPUs" in expected
