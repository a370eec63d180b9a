"""A quick or poorly fitted hardware profile is never used silently: `estimate`, `plan` and `size`
say so on stderr (issue 52), and the smaller refusals name where a key belongs."""

from __future__ import annotations

import json

import pytest
import yaml

import planner
from cli_in_process import run_cli


def profile(tmp_path, quick: bool, error: float):
    gpu = {"memory": "80 GiB", "peak_tflops": {"bf16": 989.4}, "hbm_bandwidth": "3.35 TB/s",
           "intra_node_bandwidth": "0.073 GB/s", "inter_node_bandwidth": "50 GB/s", "gpus_per_node": 8,
           "nvlink_domain": 8}
    doc = {"machine": {"device": "test", "quick": quick}, "gpu": gpu, "performance": {}, "fabric": {"efficiency": 1.0},
           "measurements": {"collectives": {"intra_node": {"all_reduce": {"fit": {"rms_relative_error": error}}}}}}
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(doc))
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump({"model": {"preset": "llama3-8b"}, "cluster": {"profile": str(path), "num_gpus": 8},
                                    "training": {"global_batch_size": 64, "seq_len": 4096},
                                    "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": 3}}))
    return case


def test_a_quick_profile_and_a_poor_fit_are_warned_about(tmp_path):
    case = profile(tmp_path, quick=True, error=0.39)
    done = run_cli("estimate", str(case))
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2
    assert "calibrate --quick" in warnings[0]
    assert "measurements.collectives.intra_node.all_reduce.fit fits its timings with a 39% rms error" in warnings[1]


def test_a_profile_that_is_refused_gets_its_one_line_and_no_warnings_before_it(tmp_path):
    """A poorly fitted profile with a figure the planner refuses printed its warnings, then the error."""
    case = profile(tmp_path, quick=True, error=0.39)
    path = tmp_path / "profile.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["performance"]["comm_overlap"] = float("nan")
    path.write_text(yaml.safe_dump(doc))
    done = run_cli("estimate", str(case))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "performance.comm_overlap" in done.stderr


def test_a_good_profile_says_nothing(tmp_path):
    case = profile(tmp_path, quick=False, error=0.05)
    assert "warning" not in run_cli("estimate", str(case)).stderr


def test_a_poor_fit_that_gives_the_profile_no_figure_is_not_said_to_make_one_uncertain(tmp_path):
    """calibrate times point-to-point sends for the record, but no figure of the profile comes from them:
    the cost model sends a pipeline stage's activations at the all-reduce's latency and bus bandwidth
    (cost_models.collectives.p2p_time). A noisy p2p fit (57 % on this machine's quick calibration)
    was said to make "the figure it gives" uncertain."""
    case = profile(tmp_path, quick=False, error=0.05)
    path = tmp_path / "profile.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["measurements"]["collectives"]["intra_node"]["p2p"] = {"fit": {"rms_relative_error": 0.57}}
    path.write_text(yaml.safe_dump(doc))
    assert "warning" not in run_cli("estimate", str(case)).stderr


def test_a_profile_measured_on_a_busy_or_moving_machine_says_so_whenever_it_is_used(tmp_path):
    """calibrate refuses a machine whose other processes take more than a quarter of its CPU time, and
    warns when its reference GEMM moves more than 10 % between before and after its ranks; under
    --allow-busy the profile records both (machine.other_cpu_share, reference_gemm_tflops), and every
    estimate on it then said nothing. The figures here are this machine's calibration of 2026-12-07:
    other processes at 100 %, the reference GEMM at 0.0573 then 0.173 TFLOP/s (3x)."""
    case = profile(tmp_path, quick=False, error=0.05)
    path = tmp_path / "profile.yaml"
    doc = yaml.safe_load(path.read_text())

    def warnings(machine: dict) -> list[str]:
        doc["machine"] = {"device": "test", **machine}
        path.write_text(yaml.safe_dump(doc))
        return [line for line in run_cli("estimate", str(case)).stderr.splitlines() if line.startswith("warning: ")]

    disturbed = warnings({"other_cpu_share": 1.0, "reference_gemm_tflops": {"before": 0.0573, "after": 0.173}})
    assert len(disturbed) == 2, disturbed
    assert "100%" in disturbed[0] and "machine.other_cpu_share" in disturbed[0]
    assert "0.0573" in disturbed[1] and "0.173" in disturbed[1] and "machine.reference_gemm_tflops" in disturbed[1]
    # A quiet calibration (2 % of the CPU to others, the GEMM within 10 %) says nothing.
    assert warnings({"other_cpu_share": 0.02, "reference_gemm_tflops": {"before": 0.150, "after": 0.157}}) == []


def test_a_profile_of_one_rank_under_a_case_of_several_says_its_links_are_placeholders(tmp_path):
    """calibrate --nproc 1 times no collective and writes the device's copy bandwidth as both link
    bandwidths (calibration/profile.py): 39 GB/s on this machine, where two gloo ranks measure 1.3 GB/s
    between them. An estimate of several GPUs on it priced every collective at memory speed, with no word."""
    case = profile(tmp_path, quick=False, error=0.05)
    path = tmp_path / "profile.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["gpu"].update(intra_node_bandwidth="39.08 GB/s", inter_node_bandwidth="39.08 GB/s")
    doc["measurements"] = {"collectives": {}}  # what a run of one rank writes
    path.write_text(yaml.safe_dump(doc))
    data = yaml.safe_load(case.read_text())

    def warnings(cluster: dict, layout: dict) -> list[str]:
        case.write_text(yaml.safe_dump({**data, "cluster": {**data["cluster"], **cluster},
                                        "layout": {**data["layout"], **layout}}))
        done = run_cli("estimate", str(case))  # 3 on one GPU, which an 8B model does not fit: warned all the same
        assert done.returncode in (0, 3), done.stderr
        return [line for line in done.stderr.splitlines() if line.startswith("warning: ")]

    (line,) = warnings({}, {})
    assert f"{path} was measured with one rank" in line and "39.1 GB/s" in line
    assert warnings({"num_gpus": 1}, {"dp": 1}) == []  # one GPU has no collective to price
    assert warnings({"intra_node_bandwidth": "1.3 GB/s", "inter_node_bandwidth": "1.3 GB/s"}, {}) == []


def test_model_presets_are_case_insensitive_and_layout_keys_are_sent_to_layout():
    base = {"cluster": {"gpu": "H100-SXM-80GB", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096}, "layout": {"dp": 8, "micro_batch_size": 1}}
    assert planner.estimate({**base, "model": {"preset": "Llama3-8B"}}).job.model.name == "Llama 3 8B"
    import pytest

    with pytest.raises(planner.CaseError, match=r"training.micro_batch_size: belongs under layout "
                                                r"\(layout.micro_batch_size\), not training"):
        planner.estimate({**base, "model": {"preset": "llama3-8b"},
                          "training": {**base["training"], "micro_batch_size": 1}})


def test_version():
    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.startswith("layout-planner ")


def test_a_case_refused_after_its_profile_was_read_is_one_line_too(tmp_path):
    """A poorly fitted profile's warnings were printed as it was read, before a refusal of the case's
    layout (estimate: tp 3 of 8 GPUs; plan: a tp of true): three lines on stderr where the contract is one."""
    case = profile(tmp_path, quick=True, error=0.39)
    doc = yaml.safe_load(case.read_text())
    for command, layout in (("estimate", {"dp": 1, "tp": 3, "micro_batch_size": 1}), ("plan", {"tp": True})):
        case.write_text(yaml.safe_dump({**doc, "layout": layout}))
        done = run_cli(command, str(case))
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "warning" not in done.stderr, done.stderr
    assert len([line for line in run_cli("plan", str(profile(tmp_path, quick=True, error=0.39))).stderr.splitlines()
                if line.startswith("warning: ")]) == 2


def test_a_profile_among_sizes_gpu_types_is_warned_about_too(tmp_path):
    """`size` on a case whose cluster.options held a quick, poorly fitted profile said nothing of it; the same
    profile under cluster got both warnings."""
    case = profile(tmp_path, quick=True, error=0.39)
    data = yaml.safe_load(case.read_text())
    data["cluster"] = {"options": [{"profile": data["cluster"]["profile"], "max_gpus": 16}, {"gpu": "h100-sxm-80gb",
                                                                                            "max_gpus": 16}]}
    data.pop("layout")
    case.write_text(yaml.safe_dump(data))
    done = run_cli("size", str(case), "--tokens", "1B")
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2 and "calibrate --quick" in warnings[0] and "39% rms error" in warnings[1], done.stderr


def test_json_carries_the_profiles_warnings_stderr_says(tmp_path):
    """A script reading `estimate`, `plan` or `size --json` could not tell that its figures rest on a quick,
    poorly fitted profile: the warnings went to stderr alone. Each carries them under `warnings`, what stderr
    says after `warning: ` (docs/commands.md), and a good profile's list is empty."""
    case = profile(tmp_path, quick=True, error=0.39)
    for command in (("estimate",), ("plan",), ("size", "--tokens", "1B")):
        done = run_cli(*command, str(case), "--json")
        said = [line.removeprefix("warning: ") for line in done.stderr.splitlines() if line.startswith("warning: ")]
        warnings = json.loads(done.stdout)["warnings"]
        assert warnings == said and len(warnings) == 2, (command, done.stderr)
        assert "calibrate --quick" in warnings[0] and "39% rms error" in warnings[1]
    good = profile(tmp_path, quick=False, error=0.05)
    assert json.loads(run_cli("estimate", str(good), "--json").stdout)["warnings"] == []


def test_diagnose_says_the_profiles_warnings_as_the_other_commands_do(tmp_path):
    """`diagnose` priced a DeepSpeed config and the planner's best on a quick, poorly fitted profile without a
    word, on stderr or in its --json: both rest on the profile as `estimate`'s figures do."""
    case = profile(tmp_path, quick=True, error=0.39)
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
                                  "gradient_accumulation_steps": 8, "bf16": {"enabled": True},
                                  "zero_optimization": {"stage": 3}}))
    done = run_cli("diagnose", str(case), "--config", str(config), "--json")
    said = [line.removeprefix("warning: ") for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert said == json.loads(run_cli("estimate", str(case), "--json").stdout)["warnings"]
    assert json.loads(done.stdout)["warnings"] == said and len(said) == 2


def test_a_profile_given_inline_is_warned_about_as_its_file_is(tmp_path):
    """A case may give its profile's contents at cluster.profile (as the API's calibrate_from_runs hands
    one on): a quick one with a poor fit is said of the case's key, as a file is said of its path, by
    the API and by the CLI on a case file that gives it so."""
    on_file = tmp_path / "case.yaml"
    doc = yaml.safe_load(profile(tmp_path, quick=True, error=0.39).read_text())
    doc["cluster"]["profile"] = yaml.safe_load((tmp_path / "profile.yaml").read_text())
    warnings = planner.estimate(doc).warnings
    assert len(warnings) == 2 and all(w.startswith("<case>: cluster.profile") for w in warnings)
    assert "calibrate --quick" in warnings[0] and "with a 39% rms error" in warnings[1]
    assert planner.estimate(doc).to_dict() == planner.estimate(on_file).to_dict()
    on_file.write_text(yaml.safe_dump(doc))
    done = run_cli("estimate", str(on_file))
    assert done.returncode == 0 and f"warning: {on_file}: cluster.profile was written by `calibrate --quick`" \
        in done.stderr, done.stderr


def test_validate_refuses_a_profile_given_inline_saying_to_give_its_file(tmp_path):
    """validate compares this machine with the profile file `calibrate` wrote, which its result records: an
    inline profile was refused as if the case had none ("needs ... cluster.profile in the case")."""
    from calibration.validate import validate

    doc = yaml.safe_load(profile(tmp_path, quick=False, error=0.05).read_text())
    doc["cluster"]["profile"] = yaml.safe_load((tmp_path / "profile.yaml").read_text())
    with pytest.raises(planner.CaseError) as refused:
        validate(doc)
    assert (refused.value.source, refused.value.key) == ("<case>", "cluster.profile")
    assert refused.value.expected.startswith("is given inline") and "give its path (or --profile)" in refused.value.expected
