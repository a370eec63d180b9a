"""The estimate command and the Python API: what a user sees, and bad input."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import planner
from cli_in_process import run_cli
from cost_models.memory import TERMS

EXAMPLE = Path(__file__).parent.parent / "examples" / "llama3-70b-h100.yaml"

CASE = {
    "model": {"preset": "llama2-7b"},
    "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8},
    "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16", "optimizer": "adam"},
    "layout": {"tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"},
}


cli = run_cli  # the real interpreter's start-up is tested below (pandas) and in test_plan.py


def write(tmp_path: Path, case: dict) -> Path:
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case))
    return path


def test_json_equals_the_python_api_and_memory_terms_add_up_to_the_peak(tmp_path):
    result = cli("estimate", str(EXAMPLE), "--json")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    said = planner.estimate(EXAMPLE)
    assert printed == json.loads(json.dumps({**said.to_dict(), "notes": list(said.notes), "warnings": list(said.warnings)}))
    memory = printed["memory"]
    assert set(memory["by_term"]) == set(TERMS)
    assert sum(memory["by_term"].values()) == pytest.approx(memory["peak_bytes"], abs=5)
    assert printed["fits"] is (memory["peak_bytes"] <= memory["capacity_bytes"])
    # tokens/s is the global batch over the step time.
    assert printed["tokens_per_s"] == pytest.approx(512 * 8192 / printed["step_time_s"])


def test_zero1_shards_only_the_optimizer_state():
    """Llama-2-7B, 8 GPUs of data parallelism, ZeRO-1: 2+2 bytes whole, 12/8 sharded; plain
    PyTorch's DDP keeps its 2-byte bucket copy of the gradients beside them."""
    by_term = planner.estimate(CASE).to_dict()["memory"]["by_term"]
    psi = 6_738_415_616
    assert by_term["parameters"] == 2 * psi
    assert by_term["gradients"] == (2 + 2) * psi
    assert by_term["optimizer_states"] == 12 * psi // 8


def test_a_layout_that_does_not_fit_names_the_term_and_a_remedy(tmp_path):
    case = copy.deepcopy(CASE)
    case["layout"].update(micro_batch_size=8)
    result = cli("estimate", str(write(tmp_path, case)))
    assert result.returncode == 3
    assert "does not fit" in result.stdout
    assert "activations is the largest term" in result.stdout
    # The cheapest remedy keeps the global batch: a smaller micro-batch with more accumulation.
    assert "micro_batch_size" in result.stdout and "accumulation steps" in result.stdout


@pytest.mark.parametrize("mutate, key, expected", [
    (lambda c: c["model"].update(hiden_size=4096), "model.hiden_size", "did you mean 'hidden_size'"),
    # A key in the wrong case is suggested in the right one, not as a shorter key sharing letters.
    (lambda c: c["layout"].update(eTp=1), "layout.eTp", "did you mean 'etp'"),
    (lambda c: c["layout"].update(EP=1), "layout.EP", "did you mean 'ep'"),
    (lambda c: c["cluster"].update(memory=80), "cluster.memory", "with a unit"),
    (lambda c: c["layout"].update(tp=True), "layout.tp", "expected an integer"),
    (lambda c: c["layout"].update(tp=3), "layout.tp", "must divide"),
    (lambda c: c["training"].pop("seq_len"), "training.seq_len", "missing"),
    (lambda c: c["training"].update(global_batch_size=-4), "training.global_batch_size", ">= 1"),
    (lambda c: c["training"].update(global_batch_size=60), "training.global_batch_size", "must divide"),
    (lambda c: c["layout"].update(dp=3), "layout.dp", "must equal the cluster's 8 GPUs"),
    (lambda c: c["model"].update(preset="llama2-7"), "model.preset", "did you mean"),
    (lambda c: c["training"].update(engine="nemo"), "training.engine", "megatron"),
    (lambda c: c["training"].update(fp32_grads="yes"), "training.fp32_grads", "true or false"),
    (lambda c: c["training"].update(tp_comm_overlap=1), "training.tp_comm_overlap", "true or false"),
    (lambda c: c.update(search={"target": "deepspeed"}) or c["training"].update(engine="megatron"),
     "search.target", "training.engine is 'megatron'"),
])
def test_bad_input_is_one_line_naming_file_and_key(tmp_path, mutate, key, expected):
    case = copy.deepcopy(CASE)
    mutate(case)
    path = write(tmp_path, case)
    result = cli("estimate", str(path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0] and key in lines[0] and expected in lines[0]
    with pytest.raises(planner.CaseError, match=key.replace(".", r"\.")):
        planner.estimate(path)


def test_malformed_yaml_and_object_tags_are_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    result = cli("estimate", str(bad))
    assert result.returncode == 2 and "expected valid YAML" in result.stderr
    tagged = tmp_path / "tagged.yaml"
    tagged.write_text("model: !!python/object/apply:os.system ['echo pwned']\n")
    result = cli("estimate", str(tagged))
    assert result.returncode == 2 and "pwned" not in result.stdout


@pytest.mark.parametrize("args, expected", [
    (["plan", str(EXAMPLE), "--top", "-1"], "--top"),
    (["estimate", "--bogus", "x"], "--bogus"),
    (["estimate"], "Missing argument"),
    (["plan", str(EXAMPLE), "--emit", "slurm", "--out", "/tmp/x"], "expected one of deepspeed, megatron, torchtitan"),
    (["plan", str(EXAMPLE), "--emit", "megatron"], "--emit needs --out"),
])
def test_bad_options_are_one_line_too(args, expected):
    result = cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr


def test_a_precision_the_gpu_has_no_peak_for_is_a_case_error(tmp_path):
    case = copy.deepcopy(CASE)
    case["cluster"]["gpu"] = {"memory": "16 GiB", "peak_tflops": {"fp32": 0.2}, "hbm_bandwidth": "10 GB/s",
                              "intra_node_bandwidth": "2 GB/s", "inter_node_bandwidth": "1 GB/s",
                              "gpus_per_node": 8, "nvlink_domain": 8}
    for command in ("estimate", "plan"):
        result = cli(command, str(write(tmp_path, case)))
        assert result.returncode == 2 and "training.precision: bf16 has no peak on" in result.stderr, result.stderr
        # the precisions it has, so the one to write is in the refusal (a case that leaves training.precision
        # out trains in bf16; a CPU profile times fp32 alone): it named cluster.gpu.peak_tflops, which a
        # profile's case never wrote
        assert "(its peak_tflops has fp32 alone): give training.precision one of them" in result.stderr


def test_absurd_sizes_are_answered_quickly_or_refused_with_the_bound(tmp_path):
    import time

    huge = copy.deepcopy(CASE)
    huge["cluster"]["num_gpus"] = 10**18
    huge["training"]["global_batch_size"] = 10**18
    huge["layout"] = {"micro_batch_size": 1}
    start = time.perf_counter()
    result = cli("estimate", str(write(tmp_path, huge)), "--json")
    assert result.returncode == 2 and "cluster.num_gpus: expected at most 1048576 GPUs" in result.stderr
    del huge["layout"]
    result = cli("plan", str(write(tmp_path, huge)))
    assert result.returncode == 2 and "at most 1048576 GPUs" in result.stderr
    # About 10^16 parameters: nothing fits anywhere, and the answer says so.
    giant = copy.deepcopy(CASE)
    giant["model"] = {"num_layers": 1000, "hidden_size": 1_000_000, "num_attention_heads": 1000,
                      "vocab_size": 100_000}
    del giant["layout"]
    result = cli("plan", str(write(tmp_path, giant)))
    assert result.returncode == 3 and "no layout fits" in result.stdout
    assert time.perf_counter() - start < 60


def test_plan_json_carries_every_note_the_command_says(tmp_path):
    """`plan --plot` where nothing fits said "--plot: nothing fits, so … was not written" on stderr, but
    `plan --json`'s notes, which a tool reads in place of stderr, left it out. Llama 2 70B's weights alone
    (69e9 parameters, 2 bytes each in bf16: 138 GB) are over one 40 GB A100, whatever the layout."""
    case = copy.deepcopy(CASE)
    case["model"], case["cluster"] = {"preset": "llama2-70b"}, {"gpu": "a100-sxm-40gb", "num_gpus": 1}
    del case["layout"]
    plot = tmp_path / "plots.png"
    result = cli("plan", str(write(tmp_path, case)), "--plot", str(plot), "--json")
    assert result.returncode == 3 and not plot.exists()
    said = [line.removeprefix("note: ") for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert any(line.startswith("--plot: nothing fits") for line in said)
    assert json.loads(result.stdout)["notes"] == said


def test_plan_emit_where_nothing_fits_says_no_files_were_written(tmp_path):
    """`plan --emit` where nothing fits wrote nothing, exit 3, and said nothing of --out, as --plot does
    of its file: Llama 2 70B's bf16 weights (138 GB) are over one 40 GB A100 whatever the layout."""
    case = copy.deepcopy(CASE)
    case["model"], case["cluster"] = {"preset": "llama2-70b"}, {"gpu": "a100-sxm-40gb", "num_gpus": 1}
    del case["layout"]
    out = tmp_path / "launch"
    result = cli("plan", str(write(tmp_path, case)), "--emit", "megatron", "--out", str(out), "--json")
    assert result.returncode == 3 and not out.exists()
    said = [line.removeprefix("note: ") for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert f"--emit: nothing fits, so no launch files were written to {out} (no layout to run)" in said
    assert json.loads(result.stdout)["notes"] == said


PLAYBOOK_3B = {"name": "playbook-3B", "num_layers": 28, "hidden_size": 3072, "num_attention_heads": 32,
               "ffn_hidden_size": 8192, "activation": "swiglu", "vocab_size": 131072, "tied_embeddings": True}


def test_estimate_json_carries_the_notes_the_command_says(tmp_path):
    """`estimate --json` printed no notes where `plan --json` and `size --json` carry theirs: a script
    reading its JSON was not told that nanotron runs another split than the case states. nanotron cuts
    the Playbook's 3B over 8 ranks as [4 × 7, 0] (nanotron/models/base.py, build_model: a layer is
    113.2 M of running cost, the LM head 402.7 M, 3.6 layers), whatever the case says; a case naming no
    engine is priced as plain PyTorch runs it, and says so."""
    layout = {"dp": 1, "tp": 1, "pp": 8, "micro_batch_size": 1, "zero_stage": 0, "recompute": "none",
              "stage_layers": [3, 4, 4, 4, 4, 3, 3, 3]}
    case = {"model": PLAYBOOK_3B, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "bf16", "engine": "nanotron"},
            "layout": layout}
    for training, said_of in ((case["training"], "[4, 4, 4, 4, 4, 4, 4, 0]: priced with that split"),
                              ({**case["training"], "engine": "any"}, "training.engine is unset (or any)")):
        result = cli("estimate", str(write(tmp_path, {**case, "training": training})), "--json")
        assert result.returncode == 0, result.stderr
        said = [line.removeprefix("note: ") for line in result.stderr.splitlines() if line.startswith("note: ")]
        assert len(said) == 1 and said_of in said[0]
        assert json.loads(result.stdout)["notes"] == said


def test_the_cli_plans_without_numpy_or_pandas_and_as_the_api_does(tmp_path):
    """`plan` and `size` solve CP-SAT's message directly (planner/cpsat.py): neither OR-tools'
    Python layer nor the numpy and pandas it imports is loaded; `plan --json` prints exactly
    planner.plan(...).to_dict()."""
    example = Path(__file__).resolve().parent.parent / "examples" / "mixtral-8x7b-64-h100-plan.yaml"
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "planner", "plan", str(example), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "ortools.sat.python.cp_model_helper" in imported
    assert not imported & {"numpy", "pandas", "ortools.sat.python.cp_model"}
    case = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 128, "seq_len": 4096}}
    path = write(tmp_path, case)
    result = cli("plan", str(path), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(json.dumps(planner.plan(path).to_dict()))


@pytest.mark.parametrize("name, preset", [
    ("h100", "h100-sxm-80gb"), ("H100", "h100-sxm-80gb"), ("h200", "h200-sxm-141gb"), ("v100", "v100-sxm-32gb"),
    ("a100-40gb", "a100-sxm-40gb"), ("B200", "b200"), ("mi300", "mi300x"), ("gb200", "gb200"),
])
def test_short_gpu_names_resolve_to_their_preset(name, preset):
    case = copy.deepcopy(CASE)
    case["cluster"]["gpu"] = name
    case["training"]["precision"] = "fp16"  # every preset has a figure for it (V100 has no bf16)
    assert planner.estimate(case).job.cluster.gpu.name == preset


def test_an_ambiguous_gpu_name_suggests_the_presets_it_may_mean(tmp_path):
    case = copy.deepcopy(CASE)
    case["cluster"]["gpu"] = "a100"
    result = cli("estimate", str(write(tmp_path, case)))
    assert result.returncode == 2 and "did you mean 'a100-sxm-80gb' or 'a100-sxm-40gb'" in result.stderr


@pytest.mark.parametrize("key,spelled", [("num_local_experts", "num_experts"), ("moe_router_topk", "moe_top_k"),
                                         ("n_routed_experts", "num_experts")])
def test_moe_keys_of_other_spellings_name_the_case_file_key(tmp_path, key, spelled):
    case = copy.deepcopy(CASE)
    case["model"][key] = 8
    result = cli("estimate", str(write(tmp_path, case)))
    assert result.returncode == 2 and f"model.{key}" in result.stderr
    assert f"spells it '{spelled}'" in result.stderr and "num_layers'?" not in result.stderr


def test_moe_fields_without_experts_are_one_line_errors(tmp_path):
    case = copy.deepcopy(CASE)
    case["model"]["moe_top_k"] = 2
    result = cli("estimate", str(write(tmp_path, case)))
    assert result.returncode == 2 and "model.moe_top_k: applies only to a mixture of experts" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("override, key", [({"moe_layer_freq": 33}, "moe_layer_freq"),
                                           ({"moe_first_dense_layers": 32}, "moe_first_dense_layers")])
def test_a_moe_key_that_leaves_no_moe_layer_is_the_one_named(tmp_path, override, key):
    """Mixtral's 32 layers with an MoE layer every 33rd hold none: the error named
    moe_first_dense_layers, which the case never set."""
    case = {"model": {"preset": "mixtral-8x7b", **override}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096}}
    result = cli("plan", str(write(tmp_path, case)))
    assert result.returncode == 2 and f"model.{key}: leaves no MoE layer among the 32 layers" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_torchtitan_stand_in_is_named_on_stderr(tmp_path):
    case = {"model": {"preset": "qwen2.5-72b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096}}
    result = cli("plan", str(write(tmp_path, case)), "--emit", "torchtitan", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    notes = result.stderr.strip().splitlines()
    assert len(notes) == 1 and notes[0].startswith("note: Qwen2.5 72B is not one of torchtitan's model configs")
    assert "llama3/llama3_8b" in notes[0] and "stand-in" in notes[0]


def test_the_readme_test_command_is_cis_and_pins_the_cpu_torch():
    repo = Path(__file__).parent.parent
    readme = (repo / "README.md").read_text()
    ci = (repo / ".ci" / "run").read_text()
    command = next(line for line in ci.splitlines() if line.startswith("python3 -m venv"))
    assert f"```bash\n{command}\n```" in readme
    assert "--index-url https://download.pytorch.org/whl/cpu" in command and "torch==2.13.0+cpu" in command
    assert "torch==2.13.0+cpu" in (repo / "constraints.txt").read_text().splitlines()
    assert "Python 3.11" in readme


def test_plan_simplest_within_on_the_command_line_is_the_apis_answer(tmp_path):
    """`plan --simplest-within 10` prints what plan(..., simplest_within=10) returns (its
    semantics, within the margin and never more complex, are tests/test_plan.py's)."""
    case = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 128, "seq_len": 4096}}
    path = write(tmp_path, case)
    result = cli("plan", str(path), "--simplest-within", "10", "--top", "1", "--json")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed == json.loads(json.dumps(planner.plan(path, simplest_within=10, top_k=1).to_dict()))
    assert printed["runner_up_lost_because"]  # faster but more complex, or slower: it says which


def test_diagnose_reads_a_hand_written_megatron_argument_list(tmp_path):
    """`diagnose --megatron-args`: the layout as Megatron reads those flags (dp from the world
    size, accumulation from the global batch), and a speedup that is the ratio of the two
    step times."""
    case = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 128, "seq_len": 4096}}
    args = tmp_path / "args.txt"
    args.write_text("--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --micro-batch-size 1 "
                    "--global-batch-size 128 --seq-length 4096 --bf16 --use-distributed-optimizer "
                    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1\n")
    result = cli("diagnose", str(write(tmp_path, case)), "--megatron-args", str(args), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    layout = data["config"]["layout"]
    assert (layout["tp"], layout["pp"], layout["dp"], layout["micro_batch_size"]) == (4, 2, 2, 1)
    assert (layout["zero_stage"], layout["recompute"]) == (1, "full")
    assert data["config"]["grad_accum"] == 128 // (1 * 2)
    assert data["speedup"] == pytest.approx(data["config"]["step_time_s"] / data["best"]["step_time_s"])
    assert data["speedup"] >= 1.0


@pytest.mark.parametrize("command", [["plan", "--json"], ["plan"], ["estimate"]])
def test_an_answer_stdout_cannot_take_is_one_line_not_a_traceback(command):
    """`plan --json > /dev/full` ended in an OSError traceback (ENOSPC from the last print); a reader that
    closes the pipe early (`| head -1`) gets nothing more, and no traceback either."""
    case = str(Path(__file__).resolve().parent.parent / "examples" /
               ("llama3-70b-h100.yaml" if command[0] == "estimate" else "llama3-70b-1024-h100-plan.yaml"))
    args = [sys.executable, "-m", "planner", command[0], case, *command[1:]]
    with open("/dev/full", "w") as full:
        done = subprocess.run(args, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 1
    assert _unnoted(done.stderr) == "error: stdout: the answer could not be written (No space left on device)\n"
    reader = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reader.stdout.readline()
    reader.stdout.close()  # the reader has gone
    assert reader.wait(timeout=120) in (0, 1) and _unnoted(reader.stderr.read()) == ""


def _unnoted(stderr: str) -> str:
    """stderr without the notes a command says of its case (the example names no engine: estimate says so)."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not line.startswith("note: "))


def test_a_broken_terminal_width_closed_stdout_or_ascii_locale_still_answers_or_says_why():
    """COLUMNS=0 printed nothing and exited 0; `>&-` (stdout closed) ended in an AttributeError
    traceback, bad input included (exit 1, not 2); an ASCII stdout (LC_ALL=C without UTF-8 mode)
    died of a UnicodeEncodeError on the report's '×'."""
    import os

    example = str(Path(__file__).resolve().parent.parent / "examples" / "llama3-70b-h100.yaml")
    base = [sys.executable, "-m", "planner", "estimate"]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    narrow = subprocess.run(base + [example], capture_output=True, text=True, env={**env, "COLUMNS": "0"}, timeout=120)
    assert narrow.returncode == 0 and "tokens/s" in narrow.stdout and _unnoted(narrow.stderr) == ""
    closed = subprocess.run(base + [example], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            timeout=120, preexec_fn=lambda: os.close(1))
    assert closed.returncode == 1
    assert _unnoted(closed.stderr) == "error: stdout: closed; the answer could not be written\n"
    bad = subprocess.run(base + ["/nonexistent/case.yaml"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, timeout=120, preexec_fn=lambda: os.close(1))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "file not found" in bad.stderr
    ascii_out = subprocess.run(base + [example], capture_output=True, timeout=120,
                               env={**env, "PYTHONIOENCODING": "ascii", "PYTHONUTF8": "0", "LC_ALL": "C"})
    assert ascii_out.returncode == 0 and b"Traceback" not in ascii_out.stderr
    assert b"tokens/s" in ascii_out.stdout and b" ? h100" in ascii_out.stdout


@pytest.mark.parametrize("args, needle", [
    # typer's Path reads "" as ".": ". expected a regular file, got a directory", no option named
    (("estimate", ""), "layout-planner estimate: CASE: expected a file's path or a value, got an empty argument"),
    (("diagnose", str(EXAMPLE), "--config", ""), "--config: expected a value, got an empty one"),
    (("diagnose", str(EXAMPLE), "--megatron-args="), "--megatron-args: expected a value, got an empty one"),
    # the last one won, exit 0: DeepSpeed's files written where the first said Megatron-LM's
    (("plan", str(EXAMPLE), "--emit", "megatron", "--emit", "deepspeed", "--out", "x"),
     "--emit: given twice, as --emit megatron and --emit deepspeed; expected it once"),
    (("validate-published", "--experts", "--no-experts"), "--experts: given twice, as --experts and --no-experts"),
    (("size", str(EXAMPLE), "--tokens", "15T", "--tokens", "1T"), "--tokens: given twice, as --tokens 15T and --tokens 1T"),
    # accepted, exit 0, with nothing to overwrite
    (("validate-published", "--no-experts", "--force"), "--force: overwrites --write-bands's file: give it with it"),
    # click's own bounds said only "x>=0", "x>=1": the command's check gives the range
    (("plan", str(EXAMPLE), "--top", "-1"), "--top: expected an integer from 0 to 100, got -1"),
    (("validate", str(EXAMPLE), "--steps", "0"), "--steps: expected a number of steps from 1 to 10000, got 0"),
    (("plan", str(EXAMPLE), "--plot", "/dev/null"), "--plot: expected a .png path (the plots are one PNG), got '/dev/null'"),
])
def test_what_the_option_parser_took_silently_or_said_in_part_is_one_line_naming_the_option(tmp_path, args, needle):
    done = run_cli(*args)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and needle in done.stderr, done.stderr
    assert not (Path.cwd() / "x").exists()


def test_an_option_given_twice_alike_is_taken():
    done = run_cli("estimate", str(EXAMPLE), "--json", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["step_time_s"] > 0


def test_an_emit_folder_that_cannot_take_the_files_is_refused_before_the_plan(tmp_path, monkeypatch):
    """`plan --emit megatron --out FOLDER` where FOLDER holds a launch.sh, or is a file, planned in
    full (1.2 s on the example, minutes on a large search) before it said so; --plot was refused at once."""
    import importlib

    def no_plan(*args, **kwargs):
        raise AssertionError("planned before the output folder was checked")

    monkeypatch.setattr(importlib.import_module("planner.plan"), "plan", no_plan)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "launch.sh").write_text("a user's own\n")
    (tmp_path / "afile").write_text("")
    for out, needle in ((tmp_path / "taken", "launch.sh: --out: exists; pass --force to overwrite"),
                        (tmp_path / "afile", "--out: cannot be written:")):
        done = run_cli("plan", str(EXAMPLE), "--emit", "megatron", "--out", str(out))
        assert done.returncode == 2 and needle in done.stderr, done.stderr
    assert (tmp_path / "taken" / "launch.sh").read_text() == "a user's own\n"


def test_a_closed_stdout_writes_no_file(tmp_path):
    """`plan --emit megatron --out DIR >&-` wrote the three files, then exited 1 saying the answer
    could not be written: the caller could not tell whether they landed."""
    import os

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "planner", "plan", str(EXAMPLE), "--emit", "megatron", "--out",
                           str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
                          preexec_fn=lambda: os.close(1))
    assert done.returncode == 1 and "stdout: closed; the answer could not be written, so no file was written" \
        in done.stderr
    assert not out.exists()


@pytest.mark.parametrize("columns", ["99999999999999999999", "100000000", "10", "0", "wide"])
def test_help_at_any_terminal_width_lists_the_options(columns):
    """COLUMNS past 2^63 ended `--help` in an OverflowError traceback, 10^8 printed 500 MB of spaces,
    and 10 drew the options' boxes empty."""
    import os

    done = subprocess.run([sys.executable, "-m", "planner", "size", "--help"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": columns})
    assert done.returncode == 0 and "--tokens" in done.stdout and len(done.stdout) < 100_000, done.stderr[-300:]


def test_estimate_says_what_a_case_leaves_unsaid_prices(tmp_path):
    """A case that names no engine is priced as plain PyTorch runs it, where `plan` decides between the
    engines it writes files for: a plan's layout copied into it priced 68,219 tokens/s against the plan's
    74,668, and nothing said why. A mixture of experts with no stated imbalance is priced balanced, which
    plan said and estimate did not."""
    dense = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
             "training": {"global_batch_size": 64, "seq_len": 4096},
             "layout": {"tp": 2, "pp": 1, "micro_batch_size": 1, "zero_stage": 1, "recompute": "full"}}
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(dense))
    done = run_cli("estimate", str(path))
    assert done.returncode == 0 and "training.engine is unset (or any): priced as plain PyTorch runs it" in done.stderr
    path.write_text(yaml.safe_dump({**dense, "training": {**dense["training"], "engine": "megatron"}}))
    assert run_cli("estimate", str(path)).stderr == ""
    moe = {**dense, "model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
           "training": {**dense["training"], "engine": "megatron"},
           "layout": {"tp": 2, "pp": 1, "ep": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "full",
                      "sequence_parallel": True}}
    path.write_text(yaml.safe_dump(moe))
    done = run_cli("estimate", str(path))
    assert "model.moe_load_imbalance is unstated" in done.stderr and "training.engine" not in done.stderr


@pytest.mark.parametrize("args", [(), ("CASE", "--engine", "deepspeed", "--out", "OUT"), ("--help",)])
def test_emit_is_answered_with_the_plan_command_that_writes_the_launch_files(tmp_path, args):
    """`layout-planner emit ...` (what the planner calls its writers, and what users guess) said typer's
    "No such command 'emit'": the launch files come from `plan CASE --emit ENGINE --out DIR`, which the
    one line names; the command it names writes them, and `emit` wrote nothing."""
    case, out = write(tmp_path, CASE), tmp_path / "out"
    given = [{"CASE": str(case), "OUT": str(out)}.get(a, a) for a in args]
    done = cli("emit", *given)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: layout-planner emit: ")
    assert "`layout-planner plan CASE --emit ENGINE --out DIR`" in done.stderr and "deepspeed" in done.stderr
    assert not out.exists()
    planned = cli("plan", str(case), "--emit", "deepspeed", "--out", str(out))
    assert planned.returncode == 0, planned.stderr
    assert {"ds_config.json", "launch.sh"} <= {p.name for p in out.iterdir()}
