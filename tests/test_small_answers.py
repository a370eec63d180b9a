"""The smaller answers a user reads (issue 52): `--plot` saying why it wrote nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import planner
from planner.errors import CaseError

from cli_in_process import run_cli



def test_plot_says_why_it_wrote_nothing(tmp_path):
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump({"model": {"preset": "llama3.1-405b"}, "cluster": {"gpu": "h100-sxm-80gb",
                                                                                       "num_gpus": 8},
                                    "training": {"global_batch_size": 64, "seq_len": 4096}}))
    done = run_cli("plan", str(case), "--engine", "megatron", "--plot", str(tmp_path / "p.png"))
    assert done.returncode == 3 and not (tmp_path / "p.png").exists()
    assert "--plot: nothing fits" in done.stderr


def test_size_drops_an_option_another_beats_on_gpus_days_and_spend():
    from types import SimpleNamespace as Pick

    from planner.size import undominated

    h100, b200 = Pick(key="cluster.options[0]"), Pick(key="cluster.options[1]")
    best = Pick(option=h100, gpus=64, gpus_paid=64, days=10.0, cost=None, gpu_hours=15360.0)
    worse = Pick(option=h100, gpus=128, gpus_paid=128, days=12.0, cost=None, gpu_hours=36864.0)  # more GPUs for more days
    trade = Pick(option=h100, gpus=128, gpus_paid=128, days=6.0, cost=None, gpu_hours=18432.0)  # more GPUs for fewer days
    assert undominated([best, worse, trade]) == [best, trade]
    # More GPUs for more days, but cheaper: a trade, kept.
    priced = Pick(option=h100, gpus=64, gpus_paid=64, days=10.0, cost=40000.0, gpu_hours=15360.0)
    cheaper = Pick(option=h100, gpus=128, gpus_paid=128, days=12.0, cost=10000.0, gpu_hours=36864.0)
    assert undominated([priced, cheaper]) == [priced, cheaper]
    # Another GPU type's best is no worse for being beaten on a count of another type's GPUs.
    other = Pick(option=b200, gpus=128, gpus_paid=128, days=12.0, cost=None, gpu_hours=36864.0)
    assert undominated([best, other]) == [best, other]


def test_an_hf_config_without_a_name_says_its_architecture(tmp_path):
    import json
    from pathlib import Path

    from planner.hf_config import read_hf_config

    config = json.loads((Path(__file__).parent / "fixtures" / "hf" / "Meta-Llama-3-8B" / "config.json").read_text())
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    assert read_hf_config(tmp_path / "hf" / "config.json")["name"] == "hf (LlamaForCausalLM)"


def test_validate_published_with_nothing_readable_exits_2_naming_the_rows(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("[]\n")
    done = run_cli("validate-published", str(empty), "--no-experts")
    assert done.returncode == 2 and "no published run could be scored: the files hold no runs" in done.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("- 3\n- {id: x}\n")
    done = run_cli("validate-published", str(bad), "--no-experts")
    assert done.returncode == 2
    assert f"{bad}[0]: expected a mapping, got int; x ({bad}[1]): model: missing" in done.stderr
    # a measurement that is no number names its run and key; a row of an unknown GPU names the run skipped
    row = yaml.safe_load((Path(__file__).parent.parent / "planner" / "published" / "published_runs.yaml")
                         .read_text())[0]
    for field, value, needle in (("tflops_per_gpu", float("nan"), "measured.tflops_per_gpu: expected a number from"),
                                 ("tflops_per_gpu", -1, "measured.tflops_per_gpu: expected a number from"),
                                 ("tflops_per_gpu", 1e-300, "measured.tflops_per_gpu: expected a number from 1e-06"),
                                 ("memory_gb_per_gpu", 1e300, "measured.memory_gb_per_gpu: expected a number from")):
        bad.write_text(yaml.safe_dump([{**row, "measured": {**row["measured"], field: value}}]))
        done = run_cli("validate-published", str(bad), "--no-experts")
        assert done.returncode == 2 and f"{row['id']} ({bad}[0]): {needle}" in done.stderr, done.stderr
    # a row of a GPU no preset is names its file, run and gpu key, and the model numbers the presets are
    # (it was "1 not a supported row", naming no key), on one line
    bad.write_text(yaml.safe_dump([{**row, "gpu": "Quantum GPU 9000"}]))
    done = run_cli("validate-published", str(bad), "--no-experts")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"{row['id']} ({bad}[0]): gpu: expected a GPU the planner has a preset for, by its model number (A100, " \
           in done.stderr and "got 'Quantum GPU 9000'" in done.stderr, done.stderr
    # beside a run it scores, the report names the row skipped, with its key, and still skips a source's
    # other kinds of run (a per-layer time) by reason, naming the first
    bad.write_text(yaml.safe_dump([row, {**row, "id": "tpu-run", "gpu": "TPU-v5"},
                                   {**row, "id": "layer-time", "record_type": "measured_per_layer_time"}]))
    done = run_cli("validate-published", str(bad), "--no-experts")
    flat = " ".join(done.stdout.split())
    assert done.returncode == 0 and "malformed 1;" in flat and "skipped tpu-run (" in flat, done.stdout
    bare = "".join(f"{bad.name}[1]): gpu: expected a GPU the planner has a preset for".split())
    assert bare in "".join(done.stdout.split())  # the path may wrap at the console's width
    assert "skipped 1: not a supported row (first: layer-time (" in flat


@pytest.mark.parametrize("change, needle", [
    ({"precision": "banana"}, "precision: expected the run's training precision (bf16, fp16, fp8, mxfp8, nvfp4 or fp32"),
    ({"recompute": "sometimes"}, "recompute: expected none, selective or full"),
    ({"parallel": {"dp": 7}}, "parallel.dp: 7, but 32 GPUs over tp 1 · pp 1 · cp 1 leave dp 32"),
    ({"framework": None}, "framework: expected the framework that ran it"),
    ({"batch": {"global_batch_size": None}}, "global batch not published (batch.global_batch_size)")])
def test_validate_published_refuses_what_calibrate_from_runs_refuses(tmp_path, change, needle):
    """A team's run with a precision of "banana" was scored as bf16, "sometimes" recomputing as none and
    dp 7 on 32 GPUs unread, exit 0, where `calibrate --from-runs` refuses the same file; a null framework
    or global batch was Python's own words ("'NoneType' object has no attribute 'startswith'")."""
    row = {"id": "team_run_1", "source": "my team", "record_type": "measured_throughput", "framework": "Megatron-LM",
           "gpu": "A100-SXM4-80GB", "num_gpus": 32,
           "model": {"name": "GPT 1.7B", "layers": 24, "hidden": 2304, "heads": 24, "kv_heads": 24,
                     "ffn_hidden": 9216, "ffn_act": "gelu", "vocab": 51200, "seq_len": 2048},
           "parallel": {"dp": 32, "tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": 1, "sp": False, "zero_stage": 0},
           "batch": {"global_batch_size": 512, "micro_batch_size": 16, "grad_accum": 1},
           "recompute": "full", "precision": "fp16 mixed", "measured": {"iteration_time_s": 2.6}}
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump([row]))
    assert run_cli("validate-published", str(path), "--no-experts").returncode == 0
    for key, value in change.items():
        row = {**row, key: {**row[key], **value} if isinstance(value, dict) else value}
    path.write_text(yaml.safe_dump([row]))
    done = run_cli("validate-published", str(path), "--no-experts")
    assert done.returncode == 2 and needle in done.stderr, done.stderr
    assert "NoneType" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_plan_refuses_a_malformed_layout_section_and_says_it_ignores_a_good_one(tmp_path):
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron"}}
    for layout, key in (({"zero_stage": 4}, "layout.zero_stage"), ({"dp": 0}, "layout.dp"), ({"tp": True}, "layout.tp"),
                        ({"sequence_parallel": "yes"}, "layout.sequence_parallel")):
        path = tmp_path / "case.yaml"
        path.write_text(yaml.safe_dump({**case, "layout": layout}))
        done = run_cli("plan", str(path), "--top", "0")
        assert done.returncode == 2 and key in done.stderr, (layout, done.stderr)
    path.write_text(yaml.safe_dump({**case, "layout": {"tp": 8}}))
    done = run_cli("plan", str(path), "--top", "0")
    assert done.returncode == 0 and "ignores the case's layout section" in done.stderr
    # with --emit the emitter's notes once replaced that one
    done = run_cli("plan", str(path), "--top", "0", "--emit", "megatron", "--out", str(tmp_path / "run"))
    assert done.returncode == 0 and "ignores the case's layout section" in done.stderr


def test_size_refuses_a_malformed_layout_section_as_plan_does(tmp_path):
    """`size` chose the layout and ran silently over a ZeRO stage 4 or dp 0 (exit 0)."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron"}}
    path = tmp_path / "case.yaml"
    for layout, key in (({"zero_stage": 4}, "layout.zero_stage"), ({"dp": 0}, "layout.dp"),
                        ({"sequence_parallel": "yes"}, "layout.sequence_parallel")):
        path.write_text(yaml.safe_dump({**case, "layout": layout}))
        done = run_cli("size", str(path), "--tokens", "1T", "--json")
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and f": {key}: " in done.stderr, done.stderr
        with pytest.raises(CaseError, match=key):
            planner.size({**case, "layout": layout}, "1T")
    path.write_text(yaml.safe_dump({**case, "layout": {"tp": 8}}))
    done = run_cli("size", str(path), "--tokens", "1T", "--json")
    assert done.returncode == 0 and "size chooses the layout and ignores the case's layout section" in done.stderr
    # The API's result says it too (its .notes are what the CLI says on stderr): it said only its pricing.
    notes = planner.size({**case, "layout": {"tp": 8}}, "1T").notes
    assert any("size chooses the layout and ignores the case's layout section" in note for note in notes)
    assert json.loads(done.stdout)["notes"] == [note.replace("<case>", str(path)) for note in notes]


def test_few_shot_and_leave_family_out_with_nothing_to_fit_say_so(tmp_path):
    """Each printed an empty table (runs 0, '—' in every cell) and exit 0: read as a result."""
    row = yaml.safe_load((Path(__file__).parent.parent / "planner" / "published" / "published_runs.yaml")
                         .read_text())[0]
    runs = tmp_path / "runs.yaml"
    runs.write_text(yaml.safe_dump([row]))
    done = run_cli("validate-published", str(runs), "--no-experts", "--few-shot", "5")
    assert done.returncode == 0 and "few-shot: no group of 8 or more runs of one source on one GPU type" in \
        " ".join(done.stdout.split())
    done = run_cli("validate-published", str(runs), "--no-experts", "--leave-family-out")
    assert done.returncode == 0 and "leave-family-out: the runs hold no mixture-of-experts family" in \
        " ".join(done.stdout.split())


def test_validate_published_refuses_a_bands_file_it_cannot_write_before_the_work(tmp_path):
    """--write-bands into a path under a file was refused only after the scoring (seconds; a minute
    with --few-shot), and the bands were written before --few-shot's work, after which interrupts
    went unanswered: checked first now, written last."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = run_cli("validate-published", "--no-experts", "--write-bands", str(blocker / "bands.yaml"))
    assert done.returncode == 2 and done.stdout == "" and "--write-bands: cannot be written" in done.stderr


@pytest.mark.parametrize("gpus", [10**30, 2**21])
def test_validate_published_bounds_a_runs_gpu_count_naming_it(tmp_path, gpus):
    """num_gpus of 10^30 beside the run's dp 32 was said as "parallel.dp: 32, but 10^30 GPUs over tp 1 · pp 1 ·
    cp 1 leave dp 10^30": the degree the run stated blamed for the count it overstated, and no bound said.
    num_gpus is bounded where the row is read, as its degrees are, naming the key and the bound."""
    row = yaml.safe_load((Path(__file__).parent.parent / "planner" / "published" / "published_runs.yaml")
                         .read_text())[0]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump([{**row, "num_gpus": gpus}]))
    done = run_cli("validate-published", str(bad), "--no-experts")
    assert done.returncode == 2, done.stderr
    assert f"{row['id']} ({bad}[0]): num_gpus: expected a whole number from 1 to 1,048,576, got {gpus}" in done.stderr, \
        done.stderr
