"""Enumerated case values read in any letter case, as GPU and model preset names are
(docs/case-reference.md): "BF16" copied from a Megatron log is bf16, "AdamW" from a paper adamw,
"DeepEP" from its README deepep. What is read goes on in the canonical spelling."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

import planner
from cli_in_process import run_cli

# A small mixture of experts, so that every training choice (expert_dispatch too) applies.
MOE = {
    "model": {"preset": "mixtral-8x7b"},
    "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
    "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron", "precision": "fp8",
                 "fp8_recipe": "blockwise", "optimizer": "adamw", "expert_dispatch": "deepep"},
    "layout": {"tp": 2, "ep": 8, "zero_stage": 1, "sequence_parallel": True, "recompute": "full"},
}


def with_value(case: dict, section: str, key: str, value) -> dict:
    changed = copy.deepcopy(case)
    changed[section][key] = value
    return changed


@pytest.mark.parametrize("key, spelled", [("precision", "FP8"), ("optimizer", "AdamW"), ("engine", "Megatron"),
                                          ("fp8_recipe", "Blockwise"), ("expert_dispatch", "DeepEP")])
def test_a_training_choice_in_any_letter_case_is_the_canonical_one(key, spelled):
    canonical = planner.estimate(MOE)
    read = planner.estimate(with_value(MOE, "training", key, spelled))
    shown = read.job.training.engine.name if key == "engine" else getattr(read.job.training, key)
    assert shown == MOE["training"][key]  # kept as the case reference spells it
    # The same job: the same memory and the same step, to the byte and the second.
    assert (read.peak.total, read.step_time_s) == (canonical.peak.total, canonical.step_time_s)


def test_the_estimate_json_shows_the_canonical_spelling(tmp_path: Path):
    example = Path(__file__).parent.parent / "examples" / "llama3-70b-h100.yaml"
    case = yaml.safe_load(example.read_text())
    case["training"].update(precision="BF16", optimizer="AdamW", engine="Megatron")
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case))
    result = run_cli("estimate", str(path), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["training"]["engine"] == "megatron"
    assert not {"BF16", "AdamW", "Megatron"} & set(result.stdout.replace('"', " ").split())


def test_a_value_no_spelling_names_is_refused_naming_the_canonical_choices(tmp_path: Path):
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(with_value(MOE, "training", "precision", "BF17")))
    result = run_cli("estimate", str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"error: {path}: training.precision: expected one of fp32, fp16, bf16, fp8, "
                                     "mxfp8, nvfp4, got 'BF17'")


def test_size_reads_the_precision_as_estimate_does():
    """size checks each GPU type's peak for the precision before it builds the case: "FP8" is fp8
    there too, so an A100 (no fp8 tensor cores) is the type refused, not the spelling."""
    case = {"model": {"preset": "llama3-8b"},
            "cluster": {"options": [{"gpu": "h100-sxm-80gb", "max_gpus": 64}, {"gpu": "a100-sxm-80gb", "max_gpus": 64}]},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "FP8"}}
    with pytest.raises(planner.CaseError) as refused:
        planner.size(case, 1e12)
    assert refused.value.key == "cluster.options[1]" and "cannot train in fp8" in refused.value.expected


@pytest.mark.parametrize("key, spelled", [("activation", "SwiGLU"), ("attention_type", "GQA"), ("moe_router", "Softmax"),
                                          ("normalization", "RMSNorm"), ("position_embedding", "RoPE")])
def test_a_model_choice_in_any_letter_case_is_the_canonical_one(key, spelled):
    # Mixtral's own: SwiGLU experts, grouped-query attention, a softmax router, RMSNorm, RoPE
    canonical = planner.estimate(MOE)
    read = planner.estimate(with_value(MOE, "model", key, spelled))
    assert getattr(read.job.model, key) == spelled.lower()
    assert (read.peak.total, read.step_time_s) == (canonical.peak.total, canonical.step_time_s)


@pytest.mark.parametrize("layout", [{"recompute": "Full"}, {"recompute": "Selective", "recompute_modules": ["MoE_Act"]}])
def test_a_layout_choice_in_any_letter_case_is_the_canonical_one(layout):
    canonical = planner.estimate({**MOE, "layout": {**MOE["layout"], **{k: v.lower() if isinstance(v, str) else
                                                                       [m.lower() for m in v] for k, v in layout.items()}}})
    read = planner.estimate({**MOE, "layout": {**MOE["layout"], **layout}})
    assert read.job.layout.recompute == layout["recompute"].lower()
    assert read.job.layout.recompute_modules == (("moe_act",) if "recompute_modules" in layout else None)
    assert (read.peak.total, read.step_time_s) == (canonical.peak.total, canonical.step_time_s)


def test_the_search_section_reads_its_target_and_pins_in_any_letter_case():
    from planner.case import load_case

    case = {key: value for key, value in MOE.items() if key != "layout"}
    case["training"] = {k: v for k, v in MOE["training"].items() if k != "engine"}
    case["search"] = {"target": "Megatron", "recompute": "Selective", "recompute_modules": ["MoE_Act"]}
    loaded = load_case(case)
    assert loaded.training.engine.name == "megatron"
    assert (loaded.search.pins["recompute"], loaded.search.pins["recompute_modules"]) == ("selective", ("moe_act",))


DENSE = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
         "training": {"global_batch_size": 64, "seq_len": 4096}}


@pytest.mark.parametrize("option", ["engine", "target"])
def test_plan_takes_its_engine_in_any_letter_case(option):
    canonical = planner.plan(DENSE, top_k=0, **{option: "megatron"})
    read = planner.plan(DENSE, top_k=0, **{option: "Megatron"})
    assert read.best.job.training.engine.name == "megatron"
    assert (read.best.job.layout, read.best.step_time_s) == (canonical.best.job.layout, canonical.best.step_time_s)


def files_of(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_emit_and_read_config_take_the_engine_and_recompute_in_any_letter_case(tmp_path: Path):
    case = {**DENSE, "training": {**DENSE["training"], "engine": "deepspeed"}, "layout": {"zero_stage": 1}}
    estimate = planner.estimate(case)
    planner.emit(estimate, "deepspeed", tmp_path / "canonical", source="case")
    planner.emit(estimate, "DeepSpeed", tmp_path / "spelled", source="case")
    assert files_of(tmp_path / "spelled") == files_of(tmp_path / "canonical")  # the same engine's files
    config = tmp_path / "canonical" / "ds_config.json"
    read = planner.read_config(case, "DeepSpeed", config, recompute="Full")
    assert read == planner.read_config(case, "deepspeed", config, recompute="full") and read.recompute == "full"


def test_plan_cli_takes_engine_and_emit_in_any_letter_case(tmp_path: Path):
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(DENSE))
    result = run_cli("plan", str(path), "--engine", "Megatron", "--emit", "Megatron", "--out", str(tmp_path / "run"),
                     "--json", "--top", "0")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["best"]["training"]["engine"] == "megatron"
    assert (tmp_path / "run" / "megatron_args.txt").is_file()


def test_a_cluster_choice_in_any_letter_case_is_the_canonical_one():
    """NVIDIA spells its formats MXFP8 and NVFP4 and nvidia-smi its vendor NVIDIA; fabrics are presets
    named as GPU presets are, which read in any letter case."""
    from planner.presets import gpu_presets

    b200 = copy.deepcopy(gpu_presets()["b200"])
    case = {**DENSE, "training": {**DENSE["training"], "precision": "mxfp8"}, "layout": {"zero_stage": 1}}
    canonical = planner.estimate({**case, "cluster": {"gpu": b200, "num_gpus": 8, "fabric": "infiniband-ndr"}})
    b200.update(vendor="NVIDIA", block_scaling=[f.upper() for f in b200["block_scaling"]])
    read = planner.estimate({**case, "cluster": {"gpu": b200, "num_gpus": 8, "fabric": "InfiniBand-NDR"}})
    gpu = read.job.cluster.gpu
    assert gpu.vendor == "nvidia" and gpu.block_scaling == tuple(gpu_presets()["b200"]["block_scaling"])
    assert read.job.cluster.fabric == canonical.job.cluster.fabric
    assert (read.peak.total, read.step_time_s) == (canonical.peak.total, canonical.step_time_s)
