"""Cost models speak of their own specs: a SpecError names the spec class and the field, and
the case layer (``planner.case``) alone turns that into the case-file key the user wrote."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

import cost_models.specs as specs
from cost_models.specs import GPUSpec, ModelSpec, Performance, SpecError
from planner.case import load_case
from planner.case_errors import SPEC_FIELD_KEYS, SPEC_SECTIONS, case_key, case_message
from planner.errors import CaseError

CASE = {
    "model": {"preset": "llama2-7b"},
    "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8},
    "training": {"global_batch_size": 64, "seq_len": 4096},
    "layout": {"tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 1},
}
SECTION_NAMES = set(SPEC_SECTIONS.values())


def spec_error(build) -> SpecError:
    with pytest.raises(SpecError) as info:
        build()
    return info.value


def case_error(**sections) -> CaseError:
    case = copy.deepcopy(CASE)
    for section, values in sections.items():
        case[section].update(values)
    with pytest.raises(CaseError) as info:
        load_case(case).job()
    return info.value


def test_a_spec_error_names_its_spec_class_and_field_not_a_case_file_section():
    error = spec_error(lambda: Performance(comm_overlap=1.5))
    assert (error.spec, error.field) == ("Performance", "comm_overlap")
    assert str(error) == f"Performance.comm_overlap: {error.message}"
    assert error.spec not in SECTION_NAMES

    error = spec_error(lambda: ModelSpec("m", num_layers=2, hidden_size=0, num_attention_heads=4, vocab_size=8))
    assert (error.spec, error.field) == ("ModelSpec", "hidden_size")
    assert str(error) == "ModelSpec.hidden_size: expected a positive integer, got 0"


def test_the_case_file_key_of_a_bad_value_is_what_it_was():
    error = case_error(cluster={"performance": {"comm_overlap": 1.5}})
    assert (error.key, error.expected) == ("cluster.performance.comm_overlap", "expected a fraction in [0, 1], got 1.5")
    assert (error.__context__.spec, error.__context__.field) == ("Performance", "comm_overlap")
    error = case_error(model={"hidden_size": 4100})  # past the case layer's own checks: 32 heads do not divide it
    assert error.key == "model.num_attention_heads"
    assert (error.__context__.spec, error.__context__.field) == ("ModelSpec", "num_attention_heads")
    assert error.expected.startswith("must divide hidden_size 4100")


@pytest.mark.parametrize("sections, spec, field, key", [
    # Job checks one spec against another: the error names the spec whose field is wrong.
    ({"layout": {"dp": 8, "offload_optimizer": 1.0}, "cluster": {"gpu": {
        "memory": "80 GiB", "peak_tflops": {"bf16": 989}, "hbm_bandwidth": "3.35 TB/s",
        "intra_node_bandwidth": "450 GB/s", "inter_node_bandwidth": "400 Gbit/s", "gpus_per_node": 8,
        "nvlink_domain": 8}}}, "GPUSpec", "host", "cluster.gpu.host"),
    ({"training": {"global_batch_size": 60}}, "TrainingSpec", "global_batch_size", "training.global_batch_size"),
    ({"layout": {"dp": 4}}, "Layout", "dp", "layout.dp"),
])
def test_cross_spec_checks_name_the_spec_whose_field_is_wrong(sections, spec, field, key):
    error = case_error(**sections)
    assert error.key == key
    raised = error.__context__  # the cost models' own error, behind the case file's
    assert isinstance(raised, SpecError) and (raised.spec, raised.field) == (spec, field)


def test_a_gpu_without_the_precision_names_the_training_precision():
    gpu = GPUSpec(name="v100", memory_bytes=32e9, peak_flops={"fp16": 125e12}, hbm_bandwidth=0.9e12,
                  intra_node_bandwidth=150e9, inter_node_bandwidth=12.5e9, gpus_per_node=8, nvlink_domain=8)
    error = spec_error(lambda: gpu.peak("fp8"))
    assert (error.spec, error.field) == ("TrainingSpec", "precision")
    assert case_key(error) == "training.precision"



def test_a_field_the_message_points_to_is_named_in_the_same_language():
    """A message about one field may point at another (the GPU's block scaling, the layout's
    stage split): the cost models name it as a spec field, the user reads its case-file key."""
    gpu = GPUSpec(name="h100", memory_bytes=80e9, peak_flops={"bf16": 989e12, "fp8": 1979e12}, hbm_bandwidth=3.35e12,
                  intra_node_bandwidth=450e9, inter_node_bandwidth=50e9, gpus_per_node=8, nvlink_domain=8)
    error = spec_error(lambda: gpu.peak("mxfp8"))
    assert error.message.endswith("h100 has none (GPUSpec.block_scaling)")
    assert case_message(error.message).endswith("h100 has none (cluster.gpu.block_scaling)")

    error = case_error(training={"engine": "megatron"}, layout={"pp": 3, "dp": 2}, cluster={"num_gpus": 6})
    assert (error.key, error.expected) == ("layout.pp", "num_layers 32 must divide by pp = 3 (or give layout.stage_layers)")
    assert error.__context__.message.endswith("(or give Layout.stage_layers)")
    # Only spec classes are translated, and a sub-key stays: dotted text of any other kind is kept.
    assert case_message("see GPUSpec.peak_flops.bf16 and torch.cuda, 1.5 GB") == \
        "see cluster.gpu.peak_tflops.bf16 and torch.cuda, 1.5 GB"

def test_the_mapping_covers_every_spec_and_renames_fields_the_case_file_spells_otherwise():
    assert all(isinstance(getattr(specs, name, None), type) for name in SPEC_SECTIONS)
    assert all(hasattr(getattr(specs, name), "__dataclass_fields__") and field in getattr(specs, name).__dataclass_fields__
               for name, field in SPEC_FIELD_KEYS)
    assert case_key(SpecError(GPUSpec, "peak_flops.bf16", "x")) == "cluster.gpu.peak_tflops.bf16"
    assert case_key(SpecError("HostSpec", "memory_bytes", "x")) == "cluster.gpu.host.memory"
    assert case_key(SpecError("Overheads", "fragmentation", "x")) == "overheads.fragmentation"
    assert case_key(SpecError("ClusterSpec", "num_gpus", "x")) == "cluster.num_gpus"


def test_the_cli_line_names_the_case_file_key(tmp_path):
    case = copy.deepcopy(CASE)
    case["cluster"]["performance"] = {"comm_overlap": 1.5}
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case))
    result = subprocess.run([sys.executable, "-m", "planner", "estimate", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"error: {path}: cluster.performance.comm_overlap: expected a fraction in [0, 1], " \
                                    "got 1.5", result.stderr


def test_a_gpu_spec_whose_nvlink_domain_straddles_its_nodes_is_refused_by_the_spec():
    """The API's GPUSpec took a domain of 5 in nodes of 8: topology's domain r // 5 then joined GPUs
    of two nodes over NVLink."""
    figures = dict(name="g", memory_bytes=80e9, peak_flops={"bf16": 1e15}, hbm_bandwidth=3e12,
                   intra_node_bandwidth=450e9, inter_node_bandwidth=50e9)
    error = spec_error(lambda: GPUSpec(**figures, gpus_per_node=8, nvlink_domain=5))
    assert (error.spec, error.field) == ("GPUSpec", "nvlink_domain")
    for per_node, domain in ((8, 4), (8, 8), (4, 72), (16, 8)):  # a part of a node, or whole nodes
        assert GPUSpec(**figures, gpus_per_node=per_node, nvlink_domain=domain).nvlink_domain == domain
