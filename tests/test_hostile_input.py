"""Hostile and absurd input: every command answers quickly, in one line naming the file,
the key and the bound, with exit code 2; the Python API raises CaseError and nothing else."""

from __future__ import annotations

import copy
import json
import math
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import planner
from cli_in_process import run_cli
from planner.case import layout_to_mapping
from planner.errors import CaseError
from planner.inputs import load_yaml

CASE = {
    "model": {"preset": "llama2-7b"},
    "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8},
    "training": {"global_batch_size": 64, "seq_len": 4096},
    "layout": {"tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 1},
}
# Generous for a loaded 2-core machine; a refusal takes well under a second.
QUICK_S = 20


cli = run_cli  # the commands' one-line refusals do not need an interpreter each


def one_line_error(result: subprocess.CompletedProcess, *needles: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert len(lines[0]) < 1000
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- denial of service --------------------------------------------------------------------

BILLION_LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))


@pytest.mark.parametrize("text, needle", [
    (BILLION_LAUGHS, "YAML nodes"),
    ("model: {preset: llama2-7b, name: &n [[[[x]]]]}\n" + "".join(f"k{i}: *n\n" for i in range(200)), "aliases"),
    ("[" + ",".join(["1"] * 2_000_000) + "]", "YAML nodes"),
    ("[" * 500 + "]" * 500, "nested"),
    # a case of 240,000 list items (480 KB) was composed whole, 3-9 s, before its unknown key was refused
    ("model: {preset: llama3-8b}\nx: [" + ",".join(["1"] * 240_000) + "]\n", "holds more than 20,000 YAML nodes"),
])
def test_yaml_bombs_are_refused_quickly(tmp_path, text, needle):
    path = write(tmp_path / "bomb.yaml", text)
    start = time.monotonic()
    one_line_error(cli("estimate", str(path)), str(path), needle)
    assert time.monotonic() - start < QUICK_S


def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("make, needle", [
    (lambda tmp: Path("/dev/zero"), "character device"),
    (lambda tmp: Path("/dev/urandom"), "character device"),
    (fifo, "FIFO"),
    (lambda tmp: tmp, "directory"),
])
def test_special_files_are_refused_as_every_input(tmp_path, make, needle):
    special = make(tmp_path)
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump(CASE))
    hf = copy.deepcopy(CASE)
    hf["model"] = {"hf_config": str(special)}
    profiled = copy.deepcopy(CASE)
    profiled["cluster"] = {"profile": str(special), "num_gpus": 8}
    runs = [
        ("estimate", str(special)),
        ("estimate", str(write(tmp_path / "hf.yaml", yaml.safe_dump(hf)))),
        ("estimate", str(write(tmp_path / "profiled.yaml", yaml.safe_dump(profiled)))),
        ("diagnose", str(case), "--config", str(special)),
        ("diagnose", str(case), "--megatron-args", str(special)),
        ("validate-published", str(special)),
    ]
    start = time.monotonic()
    for args in runs:
        one_line_error(cli(*args), str(special), needle)
    assert time.monotonic() - start < 6 * QUICK_S


def test_an_input_past_the_size_bound_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "wb") as f:
        f.truncate(17 * 2**20)  # sparse: 17 MiB of NUL bytes
    one_line_error(cli("estimate", str(path)), str(path), "larger than 16 MiB")


@pytest.mark.parametrize("change, args, key, bound", [
    (lambda c: c["model"].update(num_layers=10**18), (), "model.num_layers", "<= 1024"),
    # Mixtral with 10,000 layers on 64 GPUs kept plan busy for 83 s, with 3,000 for 27 s
    (lambda c: (c.update(model={"preset": "mixtral-8x7b", "num_layers": 3000}), c["cluster"].update(num_gpus=64)),
     (), "model.num_layers", "<= 1024"),
    (lambda c: c["training"].update(global_batch_size=2**40), (), "training.global_batch_size", "<= 16777216"),
    # A sequence of 2^62 tokens on 4,096 GPUs kept the search busy past 20 s.
    (lambda c: (c["training"].update(seq_len=2**62), c["cluster"].update(num_gpus=4096)), (), "training.seq_len",
     "<= 16777216"),
    (lambda c: c["cluster"].update(performance={"step_overhead_s": 1e308}), (), "cluster.performance.step_overhead_s",
     "from 0 to 3600"),
    (lambda c: c["cluster"].update(performance={"kernel_overhead_s": 1e308}), (),
     "cluster.performance.kernel_overhead_s", "from 0 to 3600"),
    (lambda c: c["cluster"].update(fabric={"latency_s": 1e300}), (), "cluster.fabric.latency_s", "from 0 to 3600"),
    # DeepSeek-V3 at 15.7 M sequences of 196,608 tokens on 491,520 GPUs kept plan busy for 209 s
    (lambda c: (c.update(model={"preset": "deepseek-v3"}), c["cluster"].update(num_gpus=491520),
                c["training"].update(global_batch_size=15728640, seq_len=196608)), (), "training.global_batch_size",
     "at most 1,073,741,824"),
    (lambda c: None, ("--top", str(10**20)), "--top", "0 to 100"),
    # 0.999999 left "a layout fits up to -1.1 GB"
    (lambda c: c.update(search={"headroom": 0.999999}), (), "search.headroom", "from 0 to 0.9"),
    (lambda c: None, ("--simplest-within", "inf"), "--simplest-within", "0 to 1000"),
    (lambda c: None, ("--simplest-within", "nan"), "--simplest-within", "0 to 1000"),
])
def test_absurd_sizes_for_plan_are_refused_with_the_bound(tmp_path, change, args, key, bound):
    case = copy.deepcopy(CASE)
    del case["layout"]
    change(case)
    path = write(tmp_path / "case.yaml", yaml.safe_dump(case))
    start = time.monotonic()
    one_line_error(cli("plan", str(path), *args), key, bound)
    assert time.monotonic() - start < QUICK_S


@pytest.mark.parametrize("command", [("estimate",), ("size", "--tokens", "1T", "--deadline", "30d")])
@pytest.mark.parametrize("change, key, bound", [
    # estimate blamed the GPU's figures ("cluster: ... steps of 6.41e+10 s") for a batch of 2^40 sequences
    (lambda c: c["training"].update(global_batch_size=2**40), "training.global_batch_size", "<= 16777216"),
    (lambda c: c["training"].update(global_batch_size=2**20, seq_len=2**14), "training.global_batch_size",
     "at most 1,073,741,824"),
    # size named cluster.num_gpus for a node of 2^62 GPUs; plan planned on it
    (lambda c: c["cluster"].update(gpus_per_node=2**62), "cluster.gpus_per_node", "<= 1048576"),
])
def test_every_command_bounds_the_batch_and_the_node_where_it_reads_them(tmp_path, command, change, key, bound):
    case = copy.deepcopy(CASE)
    change(case)
    path = write(tmp_path / "case.yaml", yaml.safe_dump(case))
    one_line_error(cli(command[0], str(path), *command[1:]), key, bound)


def megatron_case(tmp_path: Path) -> Path:
    case = {"model": {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000},
            "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16}, "training": {"global_batch_size": 64, "seq_len": 2048}}
    return write(tmp_path / "case.yaml", yaml.safe_dump(case))


@pytest.mark.parametrize("script, key, needle", [
    ("--pipeline-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 64 "
     "--pipeline-model-parallel-layout 'E|(t|)*100000000000,L'", "--pipeline-model-parallel-layout",
     "past the bound"),
    ("--pipeline-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 64 "
     "--pipeline-model-parallel-layout 'Et*99999|t*99999|t*99999|t*99999|t*99999|t*99999|t*99999|t*99999"
     "|t*99999|t*99999|t*99999|t*99999|t*99999,L'", "--pipeline-model-parallel-layout", "expands past"),
    ("A=--micro-batch-size\n" + "".join(f"V{i + 1}=$V{i}$V{i}\n" for i in range(40)).replace("$V0$V0", "xx")
     + "torchrun pretrain_gpt.py $A 1 $V40\n", "V", "expands past"),
    ("--micro-batch-size 1" + "0" * 5000, "--micro-batch-size", "<= 9223372036854775807"),
    ("--micro-batch-size 1 --tensor-model-parallel-size 1" + "0" * 400, "--tensor-model-parallel-size", "<="),
])
def test_megatron_arguments_that_would_expand_without_end_are_refused(tmp_path, script, key, needle):
    args = write(tmp_path / "launch.sh", script)
    start = time.monotonic()
    one_line_error(cli("diagnose", str(megatron_case(tmp_path)), "--megatron-args", str(args)), key, needle)
    assert time.monotonic() - start < QUICK_S


# --- crashes that are input errors --------------------------------------------------------

@pytest.mark.parametrize("text, key, needle", [
    ("model: {preset: llama2-7b, dropout: 1" + "0" * 400 + "}", "model.dropout", "expected a finite number"),
    ("model: {preset: llama2-7b}\ncluster: {gpu: a100-sxm-80gb, num_gpus: 1" + "0" * 5001 + "}",
     "", "a number of 5,002 characters at line"),
    ("model: {preset: llama2-7b}\ncluster: {gpu: a100-sxm-80gb, num_gpus: 1" + "0" * 30 + "}",
     "cluster.num_gpus", "<= 9223372036854775807"),
    ("model: {preset: llama2-7b}\nmodel: {preset: llama2-13b}\n", "model", "given twice"),
    ("model: {preset: llama2-7b, preset: llama2-13b}\n", "model.preset", "given twice"),
    ("search: {bogus: 1}", "search.bogus", "unknown key"),
    # a bound past ZeRO's stages (2**62) was taken, where the pin is held to 0-3
    ("search: {max_zero_stage: 4611686018427387904}", "search.max_zero_stage", "expected an integer <= 3"),
    ("cluster: {gpu: a100-sxm-80gb, num_gpus: 8, intra_node_bandwidth: '1e-320 GB/s'}",
     "cluster.intra_node_bandwidth", "between 1 B/s"),
    ("cluster: {gpu: a100-sxm-80gb, num_gpus: 8, performance: {gemm_efficiency: 1.0e-320}}",
     "cluster.performance.gemm_efficiency", "at least 1e-06"),
    ("model: {preset: llama2-7b, \"bad\\nkey\": 1}", "model.bad\\nkey", "unknown key"),
    # 1e300 passed as positive and finite, then the expert buffers overflowed to an infinite peak (a traceback)
    ("model: {preset: mixtral-8x7b, moe_capacity_factor: 1.0e+300}", "model.moe_capacity_factor",
     "at most num_experts / moe_top_k = 4"),
    ("model: {preset: mixtral-8x7b, moe_load_imbalance: 1.0e+300}", "model.moe_load_imbalance", "from 1 to"),
    # the experts' dispatch on a dense model went unread (exit 0)
    ("training: {global_batch_size: 64, seq_len: 4096, expert_dispatch: deepep}", "training.expert_dispatch",
     "applies only to a mixture of experts"),
    ("training: {global_batch_size: 64, seq_len: 4096, moe_comm_overlap: true}", "training.moe_comm_overlap",
     "applies only to a mixture of experts"),
    # one word of 60,000 characters took the report 20 s to wrap
    ("model: {preset: llama2-7b, name: " + "x" * 60_000 + "}", "model.name", "at most 4,096 characters"),
    # a null GPU: UnboundLocalError (a traceback) from estimate, plan and the API
    ("cluster: {gpu: null, num_gpus: 8}", "cluster.gpu", "expected a GPU preset name or a mapping, got nothing"),
    # a fabric's rails were any number (1.5 NICs changed the data-parallel time; 2^70 passed), and an
    # efficiency of 1e-300 was blamed on "the GPU's figures" once the step came out endless
    ("cluster: {gpu: a100-sxm-80gb, num_gpus: 16, fabric: {rails: 1.5}}", "cluster.fabric.rails",
     "expected an integer"),
    ("cluster: {gpu: a100-sxm-80gb, num_gpus: 16, fabric: {rails: 1180591620717411303424}}", "cluster.fabric.rails",
     "<= 9223372036854775807"),
    ("cluster: {gpu: a100-sxm-80gb, num_gpus: 16, fabric: {alltoall_efficiency: 1.0e-300}}",
     "cluster.fabric.alltoall_efficiency", "at least 1e-06"),
    ("cluster: {gpu: a100-sxm-80gb, num_gpus: 16, fabric: {efficiency_at: [[4, 1.0e-300]]}}",
     "cluster.fabric.efficiency_at", "at least 1e-06"),
    ("cluster: {gpu: a100-sxm-80gb, num_gpus: 16, fabric: {oversubscription: 1.0e+300}}",
     "cluster.fabric.oversubscription", "at most 1e+06"),
    # unbounded: exit 0, and a 301-digit --rotary-base in Megatron's files; an MFU of 0.0 %; a fabric
    # at 1e308 times its line rate; a 1e308 GB context refused as "a positive memory size" with no bound
    ("model: {preset: llama2-7b, rope_base: 1.0e+300}", "model.rope_base", "at most 1e+12"),
    ("cluster: {gpu: {memory: 80 GB, peak_tflops: {bf16: 1.0e+30}, hbm_bandwidth: 2 TB/s, intra_node_bandwidth: "
     "300 GB/s, inter_node_bandwidth: 25 GB/s, gpus_per_node: 8, nvlink_domain: 8}, num_gpus: 16}",
     "cluster.gpu.peak_tflops.bf16", "at most 100000"),
    ("cluster: {gpu: a100-sxm-80gb, num_gpus: 16, fabric: {efficiency_at: [[4, 1.0e+308]]}}",
     "cluster.fabric.efficiency_at", "at most 1.5"),
    ("overheads: {cuda_context: 1e308 GB}", "overheads.cuda_context", "between 1 B and 1e+21 B"),
    # a 5,000-digit number named a line, not the key; a 5,000-digit float was read as inf
    ("training: {global_batch_size: " + "9" * 5000 + ", seq_len: 4096}", "training.global_batch_size",
     "got a number of 5,000 characters"),
    ("overheads: {fragmentation: " + "9" * 5000 + ".5}", "overheads.fragmentation",
     "got a number of 5,002 characters"),
    # quoted, "0.1" was said to be text YAML reads so, to be written as 1.000000e-01
    ("overheads: {fragmentation: \"0.1\"}", "overheads.fragmentation",
     "a quoted number is text: write it without quotes"),
])
def test_input_that_crashed_is_one_line_naming_the_key(tmp_path, text, key, needle):
    data = yaml.safe_load(yaml.safe_dump(CASE))
    path = tmp_path / "case.yaml"
    # The snippet's sections replace the case's; a duplicate key must survive as written.
    base = "\n".join(f"{k}: {json.dumps(v)}" for k, v in data.items() if k not in {
        line.split(":", 1)[0] for line in text.splitlines()})
    path.write_text(base + "\n" + text + "\n")
    for command in ("estimate", "plan"):
        line = one_line_error(cli(command, str(path)), str(path), needle)
        assert f": {key}: " in line if key else True
    with pytest.raises(CaseError):
        planner.estimate(path)


def test_a_file_name_with_a_line_break_is_shown_on_one_line(tmp_path):
    path = tmp_path / "bad\nname.yaml"
    path.write_text("model: [unclosed\n")
    one_line_error(cli("estimate", str(path)), "bad\\nname.yaml", "expected valid YAML")


def test_a_nul_byte_in_a_case_is_named_by_its_line_and_column(tmp_path):
    """'expected valid YAML: malformed', where every other YAML error says where."""
    path = tmp_path / "case.yaml"
    path.write_text("model: {preset: llama3-8b}\ncluster: {gpu: h100-sxm-80gb, num_gpus: 8}\n"
                    "training: {global_batch_size: 8, seq_len: 40\x0096}\n")
    one_line_error(cli("plan", str(path)), "expected valid YAML: control characters are not allowed (#x0000) at "
                                           "line 3, column 45")


def test_an_absurd_figure_that_gives_endless_steps_is_refused_by_plan(tmp_path):
    case = copy.deepcopy(CASE)
    del case["layout"]
    case["cluster"]["intra_node_bandwidth"] = "1 B/s"
    path = write(tmp_path / "case.yaml", yaml.safe_dump(case))
    one_line_error(cli("plan", str(path)), str(path), "cluster", "steps under 1e+07 s")
    # estimate printed "0 tokens/s" and a step of 1.3e10 s with exit 0
    with_layout = write(tmp_path / "laid-out.yaml", yaml.safe_dump({**case, "layout": CASE["layout"]}))
    one_line_error(cli("estimate", str(with_layout)), str(with_layout), "cluster", "steps under 1e+07 s")


def test_deep_or_huge_json_is_one_line(tmp_path):
    case = write(tmp_path / "case.yaml", yaml.safe_dump({k: v for k, v in CASE.items() if k != "layout"}))
    deep = write(tmp_path / "deep.json", "[" * 100_000 + "]" * 100_000)
    one_line_error(cli("diagnose", str(case), "--config", str(deep)), str(deep), "nested too deeply")
    digits = write(tmp_path / "digits.json", '{"zero_optimization": {"stage": 1' + "0" * 5001 + "}}")
    one_line_error(cli("diagnose", str(case), "--config", str(digits)), str(digits), "zero_optimization.stage",
                   "5,002 digits", "at most 30 digits")
    huge = write(tmp_path / "huge.json", '{"train_batch_size": 1' + "0" * 25 + "}")
    one_line_error(cli("diagnose", str(case), "--config", str(huge)), "train_batch_size", "<= 9223372036854775807")
    hf = write(tmp_path / "config.json", json.dumps({
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "intermediate_size": 11008, "vocab_size": 32000}).replace(
        '"vocab_size": 32000', '"vocab_size": 32000, "attention_dropout": 1' + "0" * 400))
    hf_case = write(tmp_path / "hf.yaml", yaml.safe_dump({**{k: v for k, v in CASE.items() if k != "model"},
                                                          "model": {"hf_config": str(hf)}}))
    one_line_error(cli("estimate", str(hf_case)), str(hf), "attention_dropout", "401 digits")


def test_a_json_key_given_twice_is_refused_as_in_yaml(tmp_path):
    """Python's JSON reader keeps the last of a repeated key: a ds_config with ZeRO stage 1 then 3 read as 3."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({k: v for k, v in CASE.items() if k != "layout"}))
    twice = write(tmp_path / "ds.json", '{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, '
                                        '"zero_optimization": {"stage": 1}, "zero_optimization": {"stage": 3}}')
    one_line_error(cli("diagnose", str(case), "--config", str(twice)), str(twice), ": zero_optimization: ",
                   "given twice")
    hf = write(tmp_path / "config.json", '{"model_type": "llama", "model_type": "mistral", "hidden_size": 64}')
    hf_case = write(tmp_path / "hf.yaml", yaml.safe_dump({**{k: v for k, v in CASE.items() if k != "model"},
                                                          "model": {"hf_config": str(hf)}}))
    one_line_error(cli("estimate", str(hf_case)), str(hf), ": model_type: ", "given twice")


def test_a_key_two_merged_mappings_give_is_refused(tmp_path):
    """``<<: [{global_batch_size: 64}, {global_batch_size: 128}]`` planned a global batch of 128 (PyYAML's
    order, where the YAML merge spec lets the first win): a batch the user may not have meant, said
    nowhere. A key the mapping itself gives over a merged one is what merging is for, and stays."""
    text = ("model: {preset: llama3-8b}\ncluster: {gpu: h100-sxm-80gb, num_gpus: 8}\n"
            "training:\n  <<: [{global_batch_size: 64}, {global_batch_size: 128}]\n  seq_len: 4096\n")
    one_line_error(cli("plan", str(write(tmp_path / "merged.yaml", text))), "merged.yaml",
                   "training.global_batch_size", "given twice")
    from planner.inputs import load_yaml
    assert load_yaml("d: &d {g: 64, s: 4096}\nt:\n  <<: *d\n  g: 32\n", "over.yaml")["t"] == {"g": 32, "s": 4096}
    # Two << keys, or a key a merged mapping merges in turn: the same ambiguity, refused alike.
    for text in ("t:\n  <<: {g: 64}\n  <<: {g: 128}\n", "t:\n  <<: [{<<: {g: 64}, s: 1}, {g: 128}]\n"):
        with pytest.raises(CaseError, match="t.g: given twice"):
            load_yaml(text, "merged.yaml")
    # The same mapping merged twice, or reached by two routes (a base both sources merge), gives nothing
    # twice; nor two sources the mapping overrides itself.
    assert load_yaml("a: &a {g: 64}\nt:\n  <<: [*a, *a]\n", "twice.yaml")["t"] == {"g": 64}
    diamond = "b: &b {s: 4096}\nm: &m {<<: *b, l: 80}\nc: &c {<<: *b, n: 8}\nt: {<<: [*m, *c]}\n"
    assert load_yaml(diamond, "diamond.yaml")["t"] == {"s": 4096, "l": 80, "n": 8}
    assert load_yaml("p: &p {g: 1}\nq: &q {g: 2}\nt: {<<: [*p, *q], g: 32}\n", "own.yaml")["t"] == {"g": 32}


def test_rich_markup_in_names_is_printed_as_written(tmp_path):
    case = copy.deepcopy(CASE)
    case["model"]["name"] = "x[/]y[bold]z[link=u]"
    path = write(tmp_path / "case.yaml", yaml.safe_dump(case))
    for command in ("estimate", "plan"):
        result = cli(command, str(path))
        assert result.returncode == 0, result.stderr
        assert "x[/]y[bold]z[link=u]" in result.stdout


def test_rows_of_the_wrong_type_in_published_runs_are_skipped_with_why(tmp_path):
    rows = [{"id": "bad_layers", "record_type": "measured_throughput", "source": "Narayanan et al. 2021",
             "gpu": "A100-SXM4-80GB", "num_gpus": 8, "model": {"layers": [1, 2], "hidden": "x", "heads": 8,
                                                            "vocab": 1000, "seq_len": 2048},
             "parallel": {"tp": 1, "pp": 1}, "batch": {"global_batch_size": 8, "micro_batch_size": 1},
             "measured": {"tokens_per_sec_total": 1000.0}},
            "not a mapping", 42]
    path = write(tmp_path / "runs.yaml", yaml.safe_dump(rows))
    result = cli("validate-published", str(path), "--json")
    # Nothing readable: exit 2, naming each row and why (an empty table would look like a pass).
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    # Each named by its file and index (and its id where it has one): two files' rows were numbered
    # across both, and the rows with an id had no place at all.
    assert f"bad_layers ({path}[0]): model.layers: expected a whole number from 1, got [1, 2]" in result.stderr
    assert f"{path}[1]: expected a mapping, got str" in result.stderr
    assert f"{path}[2]: expected a mapping, got int" in result.stderr
    other = write(tmp_path / "more.yaml", yaml.safe_dump([7]))
    result = cli("validate-published", str(path), str(other), "--json")
    assert result.returncode == 2 and f"{other}[0]: expected a mapping, got int" in result.stderr


# --- the Python API raises CaseError and nothing else ---------------------------------------

@pytest.mark.parametrize("kwargs, key", [
    ({"top_k": "5"}, "top_k"), ({"top_k": -3}, "top_k"), ({"top_k": 10**20}, "top_k"), ({"top_k": True}, "top_k"),
    ({"simplest_within": math.inf}, "simplest_within"), ({"simplest_within": math.nan}, "simplest_within"),
    ({"simplest_within": -50}, "simplest_within"), ({"simplest_within": "5"}, "simplest_within"),
    ({"target": "nemo"}, "target"), ({"engine": "nemo"}, "engine"),
    # the CLI refuses --fastest with --simplest-within; the API returned the raw optimum
    ({"fastest": True, "simplest_within": 5}, "fastest"),
])
def test_the_api_refuses_bad_arguments_with_a_case_error(kwargs, key):
    case = {k: v for k, v in CASE.items() if k != "layout"}
    with pytest.raises(CaseError) as error:
        planner.plan(case, **kwargs)
    assert key in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("mutate", [
    lambda c: c["model"].update(dropout=10**400),
    lambda c: c["model"].update(dropout=10**5000),
    lambda c: c["cluster"].update(num_gpus=10**5000),
    lambda c: c["model"].update(name=["x"] * 100_000),
    lambda c: c["cluster"].update(performance={"hbm_efficiency": 5e-324}),
])
def test_the_api_raises_only_case_errors_for_absurd_values(mutate):
    case = copy.deepcopy(CASE)
    mutate(case)
    with pytest.raises(CaseError) as error:
        planner.estimate(case)
    assert len(str(error.value)) < 1000


@pytest.mark.parametrize("value", [0, 0.0, False, "", []])
def test_an_overheads_section_that_is_no_mapping_is_refused_even_when_empty(value):
    """overheads: 0 (or [], "", false) was read as no section, where search: 0 or layout: [] is refused."""
    case = copy.deepcopy(CASE)
    case["overheads"] = value
    with pytest.raises(CaseError) as error:
        planner.estimate(case)
    assert error.value.key == "overheads" and "expected a mapping" in str(error.value)


# --- the loader itself ----------------------------------------------------------------------

def test_the_loader_keeps_yaml_aliases_merges_and_numbers():
    text = "base: &b {x: 1, y: [1.5, .inf]}\nother:\n  <<: *b\n  y: 2\ncopy: *b\n"
    assert load_yaml(text, "t") == {"base": {"x": 1, "y": [1.5, math.inf]}, "other": {"x": 1, "y": 2},
                                    "copy": {"x": 1, "y": [1.5, math.inf]}}
    with pytest.raises(CaseError, match="could not determine a constructor"):
        load_yaml("x: !!python/object/apply:os.system ['true']", "t")


@pytest.mark.parametrize("text, key", [("training: {seq_len: 1:08:16}\n", "training.seq_len"),
                                       ("runs:\n  - {mfu: 0:45.5}\n", "runs[0].mfu"),
                                       ("1:30: x\n", "1:30")])
def test_yaml_base_60_numbers_are_refused_naming_their_key(text, key):
    """YAML 1.1 reads digits joined by colons in base 60 (PyYAML's resolver, which every reader of the
    planner's input files shares): a seq_len typed as 1:08:16 was 1*3600 + 8*60 + 16 = 4096 tokens."""
    assert yaml.safe_load("n: 1:08:16")["n"] == 1 * 3600 + 8 * 60 + 16  # the reading refused
    with pytest.raises(CaseError, match="base 60") as error:
        load_yaml(text, "in.yaml")
    assert error.value.source == "in.yaml" and error.value.key == key
    assert load_yaml("t: '1:08:16'\n", "q.yaml") == {"t": "1:08:16"}  # quoted, it is the text it says


def test_a_base_60_seq_len_in_a_case_file_is_one_line(tmp_path):
    case = copy.deepcopy(CASE)
    case["training"]["seq_len"] = "SEQ"
    path = write(tmp_path / "case.yaml", yaml.safe_dump(case).replace("SEQ", "1:08:16"))
    one_line_error(cli("estimate", str(path)), f"{path}: training.seq_len:", "base 60")


def test_an_empty_out_folder_is_refused_not_taken_for_the_current_one(tmp_path, monkeypatch):
    """`plan --emit megatron --out ''` wrote the launch files into the current folder (Path('') is '.')."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({k: v for k, v in CASE.items() if k != "layout"}))
    monkeypatch.chdir(tmp_path)
    one_line_error(cli("plan", str(case), "--emit", "megatron", "--out", ""), "--out", "expected a value, got an empty one")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["case.yaml"]


@pytest.mark.parametrize("text, command, key, needle", [
    # YAML 1.1 reads 1e300 as text: the message said only "got str '1e300'"
    ("model: {preset: llama2-7b, dropout: 1e300}", "estimate", "model.dropout", "write it as 1.000000e+300"),
    # the bound and the value were both printed as 1e+06
    ("cluster: {gpu: a100-sxm-80gb, num_gpus: 8, gpu_hour_cost: 1000001}", "size", "cluster.gpu_hour_cost",
     "got 1000001"),
    # max_nodes past the bound was named max_gpus, with the GPUs it makes
    ("cluster: {gpu: a100-sxm-80gb, max_nodes: 131073}", "size", "cluster.max_nodes", "got 131073"),
])
def test_refusals_name_the_key_and_value_as_written(tmp_path, text, command, key, needle):
    data = {k: v for k, v in CASE.items() if k != "layout" or command == "estimate"}
    base = "\n".join(f"{k}: {json.dumps(v)}" for k, v in data.items() if k not in {
        line.split(":", 1)[0] for line in text.splitlines()})
    path = write(tmp_path / "case.yaml", base + "\n" + text + "\n")
    line = one_line_error(cli(command, str(path), *(("--tokens", "1T") if command == "size" else ())),
                          str(path), needle)
    assert f": {key}: " in line


def test_size_refuses_more_cluster_sizes_than_it_can_plan(tmp_path):
    """Sixteen GPU types of 2^20 GPUs each (two million sizes) kept `size` busy for 203 s."""
    options = [{"gpu": "h100-sxm-80gb", "max_gpus": 2**20}, {"gpu": "b200", "max_gpus": 2**20}]
    case = write(tmp_path / "case.yaml", yaml.safe_dump({"model": {"preset": "llama3-8b"},
                                                         "cluster": {"options": options},
                                                         "training": {"global_batch_size": 64, "seq_len": 4096}}))
    start = time.monotonic()
    one_line_error(cli("size", str(case), "--tokens", "1T", "--deadline", "1d"), str(case), ": cluster: ",
                   "262,144 cluster sizes", "at most 131,072")
    assert time.monotonic() - start < QUICK_S


def test_an_out_folder_without_emit_is_refused(tmp_path):
    """`plan --out DIR` without --emit exited 0 and wrote nothing."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({k: v for k, v in CASE.items() if k != "layout"}))
    one_line_error(cli("plan", str(case), "--out", str(tmp_path / "run")), "--out", "give --emit ENGINE with it")
    assert not (tmp_path / "run").exists()


def test_size_refuses_a_run_shorter_than_one_global_batch(tmp_path):
    """--tokens 1 with a deadline gave a per-step deadline past 2^63 µs, which CP-SAT's integers
    refused (a TypeError traceback); a run of fewer tokens than one global batch (64 × 4,096) is
    no run of this case."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({k: v for k, v in CASE.items() if k != "layout"}))
    for tokens in ("1", "262143"):
        one_line_error(cli("size", str(case), "--tokens", tokens, "--deadline", "60d"), "error: --tokens: ",
                       f"at least one global batch of {case}, 262,144 tokens")
    with pytest.raises(CaseError, match="size: tokens: .*262,144 tokens"):
        planner.size(case, 2, deadline="60d")


def test_a_token_count_past_float_range_is_refused_in_a_short_line():
    """planner.size(case, 10**400) raised OverflowError; a 5,000-digit --tokens was echoed whole."""
    case = {k: v for k, v in CASE.items() if k != "layout"}
    with pytest.raises(CaseError, match="at most 1e[+]25") as error:
        planner.size(case, 10**400)
    assert len(str(error.value)) < 200
    one_line_error(cli("size", "case.yaml", "--tokens", "9" * 5000), "--tokens",
                   "got '9999999999999999999999999999999999999999…' (5,000 characters)")  # its length, not its repr's


@pytest.mark.parametrize("args, expected", [
    (("size", "case.yaml", "--tokens", "1T", "--gpu-hour-cost"), "expected a price per GPU-hour from 1e-06 to 1e+06"),
    (("plan", "case.yaml", "--simplest-within"), "expected a percentage from 0 to 1000"),
    (("validate", "case.yaml", "--timeout"), "expected seconds from 1 to 86400"),
    (("calibrate", "--out", "profile.yaml", "--timeout"), "expected seconds from 1 to 86400")])
@pytest.mark.parametrize("given, shown", [("9" * 5000, "'999999999999999999999999999999…' (5,000 characters)"),
                                          ("1e999", "'1e999'"), ("nan", "'nan'"), ("-inf", "'-inf'")])
def test_a_number_option_past_float_range_is_shown_as_typed(args, expected, given, shown):
    """float() makes a 5,000-digit price, or 1e999, inf: the refusal said "got inf", not what was typed."""
    option = args[-1]
    one_line_error(cli(*args, given), f"error: {option}: {expected}, got {shown}")


def _number_options() -> list[tuple[str, str]]:
    """(command, option) for every option of every command that takes a number."""
    import typer.main
    try:  # click's number types (ranges among them), from typer's own click where it ships one
        from typer._click.types import FloatParamType, IntParamType
    except ImportError:
        from click.types import FloatParamType, IntParamType

    from planner.cli import app

    group = typer.main.get_command(app)
    return [(name, param.opts[0]) for name, command in sorted(group.commands.items()) for param in command.params
            if isinstance(param.type, (FloatParamType, IntParamType))]


@pytest.mark.parametrize("command, option", _number_options())
@pytest.mark.parametrize("given", ["1_0", "\u0661\u0660"])
def test_every_number_option_reads_numbers_as_tokens_does(command, option, given):
    """Python's float() and int() read PEP 515's "1_0" and any script's digits (Arabic-Indic "١٠") as 10,
    which --tokens refuses: every number option took them (`--gpu-hour-cost 1_0` priced a GPU-hour at
    10). One rule for each number typed: refused by every option as --tokens refuses them."""
    assert float("1_0") == 10 and float("\u0661\u0660") == 10  # what the options read them as
    one_line_error(cli("size", "case.yaml", "--tokens", given + "T"), "--tokens")
    one_line_error(cli(command, "case.yaml", option, given), option, "not a number in ASCII digits")


def test_the_number_options_are_found():
    """The test above covers the options a user types numbers into (a new one joins it by itself)."""
    found = set(_number_options())
    assert {("size", "--gpu-hour-cost"), ("plan", "--simplest-within"), ("validate", "--timeout"),
            ("calibrate", "--timeout"), ("size", "--max-gpus"), ("diagnose", "--pp"), ("plan", "--top")} <= found


def test_stage_layers_takes_ascii_digits_only(tmp_path):
    """str.isdigit() is true of "²", which int() refuses: `--stage-layers ²,1` was a ValueError's traceback."""
    config = write(tmp_path / "ds_config.json", "{}")
    one_line_error(cli("diagnose", "case.yaml", "--config", str(config), "--stage-layers", "\u00b2,1"),
                   "--stage-layers", "expected layer counts")


@pytest.mark.parametrize("args, option", [(("plan", "case.yaml", "--top", "9" * 5000), "--top"),
                                          (("size", "case.yaml", "--tokens", "1T", "--max-gpus", "9" * 5000),
                                           "--max-gpus")])
def test_the_option_parsers_refusals_cut_long_values(args, option):
    """The option parser's own message echoed a 5,000-digit value whole: one line of 5,084 characters."""
    line = one_line_error(cli(*args), option, "'9999999999999999999999999999999999999999…' (5,000 characters)")
    assert len(line) < 200


@pytest.mark.parametrize("call, key", [
    (lambda est: planner.emit(est, "megatron", None), "emit: out_dir: expected a path"),
    (lambda est: planner.emit(est, "megatron", 7), "emit: out_dir: expected a path"),
    (lambda est: planner.read_config(CASE, "megatron", None), "read_config: path: expected a path"),
    (lambda est: planner.read_config(CASE, "deepspeed", ["x"]), "read_config: path: expected a path"),
    (lambda est: __import__("planner.diagnose", fromlist=["diagnose"]).diagnose(CASE, config=5),
     "diagnose: config: expected a path"),
    (lambda est: planner.calibrate_from_runs([], gpu_preset=5), "calibrate_from_runs: gpu_preset: expected a string"),
])
def test_the_api_refuses_arguments_of_the_wrong_type_with_a_case_error(call, key):
    """Each raised a raw TypeError or AttributeError ('int' object has no attribute 'strip')."""
    est = planner.estimate(CASE)
    with pytest.raises(CaseError, match=re.escape(key)):
        call(est)


def test_a_deadline_past_its_bound_says_the_bound_in_its_unit():
    """'at most 3.1536e+10' read as days: any deadline written in days below it was still refused."""
    one_line_error(cli("size", "case.yaml", "--tokens", "1T", "--deadline", "1e7d"), "--deadline",
                   "at most 1000 years, got '1e7d'")


@pytest.mark.parametrize("second", [{}, {"max_gpus": 512}])
def test_the_same_gpu_type_twice_among_size_options_is_refused(tmp_path, second):
    """Two identical options, or two that differ in their limit alone: the best listed itself as its
    own runner-up ('1.00x the GPUs for 1.00x the days'), or one size twice."""
    option = {"gpu": "h100-sxm-80gb", "max_gpus": 256, "gpu_hour_cost": 2.5}
    case = write(tmp_path / "case.yaml", yaml.safe_dump({"model": {"preset": "llama3-8b"},
                                                         "cluster": {"options": [option, {**option, **second}]},
                                                         "training": {"global_batch_size": 256, "seq_len": 4096}}))
    one_line_error(cli("size", str(case), "--tokens", "1T", "--deadline", "30d"), str(case), "cluster.options[1]: ",
                   "same GPU type, fabric and price as cluster.options[0]: give each once, with the larger limit")


@pytest.mark.parametrize("price", [5e-324, 1e-320])
def test_a_denormal_price_is_refused_where_every_price_is_read(price):
    """`size --gpu-hour-cost 1e-320` passed "above 0": a denormal float keeps few digits (IEEE 754), so
    that the costs, GPU-hours × the price, lost theirs and the knee's days² × cost underflowed to 0."""
    gpu_hours, days = 197.56675943643666, 0.0020097530053348454  # Llama 3 70B, 1B tokens, 4,096 B200s
    assert (gpu_hours * price) / price != gpu_hours  # the digits lost: GPU-hours no longer come back
    assert days * days * 24 * 4096 * price < 2 ** -1022  # the knee's product below the least normal float
    case = {k: v for k, v in CASE.items() if k != "layout"}
    for given in (case, {**case, "cluster": {**case["cluster"], "gpu_hour_cost": price}}):
        with pytest.raises(CaseError, match="expected a price per GPU-hour from 1e-06 to 1e[+]06"):
            planner.size(given, "1B", gpu_hour_cost=price if given is case else None)
    one_line_error(cli("size", "case.yaml", "--tokens", "1B", "--gpu-hour-cost", repr(price)), "error: --gpu-hour-cost: ",
                   "from 1e-06 to 1e+06")


def test_one_price_for_every_type_that_makes_two_options_one_is_refused(tmp_path):
    """Reserved and on-demand H100s at two prices are two options; --gpu-hour-cost gave them one, and
    each was the other's runner-up."""
    options = [{"gpu": "h100-sxm-80gb", "max_gpus": 64, "gpu_hour_cost": 2.0},
               {"gpu": "h100-sxm-80gb", "max_gpus": 256, "gpu_hour_cost": 3.5}]
    case = write(tmp_path / "case.yaml", yaml.safe_dump({"model": {"preset": "llama3-8b"},
                                                         "cluster": {"options": options},
                                                         "training": {"global_batch_size": 256, "seq_len": 4096}}))
    one_line_error(cli("size", str(case), "--tokens", "1T", "--deadline", "30d", "--gpu-hour-cost", "2"),
                   "--gpu-hour-cost: gives cluster.options[1] the price of cluster.options[0]")


def test_a_plot_path_that_is_no_png_is_refused(tmp_path):
    """--plot out.txt wrote PNG data into a .txt file (exit 0)."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({k: v for k, v in CASE.items() if k != "layout"}))
    one_line_error(cli("plan", str(case), "--plot", str(tmp_path / "out.txt")), "--plot", "expected a .png path")
    assert not (tmp_path / "out.txt").exists()


PINNED = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
          "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron"}}


@pytest.mark.parametrize("search, key, needle", [
    # planned with offload_activations: 1 and no parameter offload (exit 0), where estimate refuses it
    ({"offload_params": True}, "search.offload_params", "megatron cannot run it: keeps parameters on the GPU"),
    # "nothing fits; 24 GPUs would" (false) for a dense model
    ({"ep": 2}, "search.ep", "needs a mixture of experts"),
    ({"etp": 2}, "search.etp", "needs a mixture of experts"),
    # the engines reported "nothing fits" for pins that contradict each other
    ({"recompute_num_layers": 4, "recompute": "none"}, "search.recompute_num_layers", "applies only with recompute: full"),
])
def test_search_pins_no_layout_can_hold_are_refused(tmp_path, search, key, needle):
    case = write(tmp_path / "case.yaml", yaml.safe_dump({**PINNED, "search": search}))
    one_line_error(cli("plan", str(case)), f": {key}: ", needle)


def test_a_pinned_activation_offload_is_what_plan_answers(tmp_path):
    """search.offload_activations: 16 answered the optimizer offloaded and no activation offload (exit 0),
    though 16 layers offloaded fit (estimate: 52.9 GB)."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({**PINNED, "search": {"offload_activations": 16}}))
    result = planner.plan(case)
    assert result.best.job.layout.offload_activations == 16
    assert all(e.job.layout.offload_activations == 16 for e in result.alternatives)


def test_control_characters_in_a_name_reach_no_terminal(tmp_path):
    """An ANSI escape and a line break in model.name reached the report raw: a shared case could
    recolour it or fake a line of it."""
    case = write(tmp_path / "case.yaml", 'model: {name: "x \\e[31mred\\n fake line", preset: llama2-7b}\n'
                 "cluster: {gpu: a100-sxm-80gb, num_gpus: 8}\ntraining: {global_batch_size: 64, seq_len: 4096}\n")
    for command in ("plan", "size"):
        done = cli(command, str(case), *(("--tokens", "100B", "--deadline", "60d") if command == "size" else ()))
        assert done.returncode == 0, done.stderr
        assert "\x1b" not in done.stdout and "\\x1b[31mred\\n fake line" in done.stdout


@pytest.mark.parametrize("args, option, needle", [
    # each exited 0 with the option unread
    (("plan", "CASE", "--force"), "--force", "give one of them with it"),
    (("calibrate", "--out", "OUT", "--from-runs", "RUNS", "--quick"), "--quick", "not to --from-runs"),
    (("calibrate", "--out", "OUT", "--from-runs", "RUNS", "--nnodes", "2"), "--nnodes", "not to --from-runs"),
])
def test_options_that_would_go_unread_are_refused(tmp_path, args, option, needle):
    case = write(tmp_path / "case.yaml", yaml.safe_dump({k: v for k, v in CASE.items() if k != "layout"}))
    runs = write(tmp_path / "runs.yaml", "[]\n")
    named = {"CASE": str(case), "OUT": str(tmp_path / "out.yaml"), "RUNS": str(runs)}
    one_line_error(cli(*(named.get(a, a) for a in args)), option, needle)
    assert not (tmp_path / "out.yaml").exists()


def test_a_bound_of_zero_on_a_count_is_refused(tmp_path):
    """search.max_micro_batch_size: 0 answered 'nothing fits' (exit 3)."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({**{k: v for k, v in CASE.items() if k != "layout"},
                                                         "search": {"max_micro_batch_size": 0}}))
    one_line_error(cli("plan", str(case)), "search.max_micro_batch_size", "expected an integer >= 1")


def test_a_smaller_node_than_the_presets_is_a_smaller_nvlink_domain(tmp_path):
    """H100 nodes of 4 GPUs kept the preset's NVLink domain of 8: tp 8 over two nodes was priced as
    NVLink (the step identical to one 8-GPU node's), and a 7-GPU node was sized as a '56-GPU rack'."""
    def estimate(per_node: int):
        return planner.estimate({"model": {"preset": "llama3-8b"},
                                 "cluster": {"gpu": "h100-sxm-80gb", "nodes": 8 // per_node, "gpus_per_node": per_node},
                                 "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron"},
                                 "layout": {"dp": 1, "tp": 8, "micro_batch_size": 1, "zero_stage": 1,
                                            "sequence_parallel": True}})
    one_node, two_nodes = estimate(8), estimate(4)
    assert two_nodes.job.cluster.gpu.nvlink_domain == 4
    assert two_nodes.time.tp_comm_s > one_node.time.tp_comm_s  # across the fabric, not NVLink: slower


GPU_MAPPING = {"memory": "80 GiB", "peak_tflops": {"bf16": 989.4}, "hbm_bandwidth": "3.35 TB/s",
               "intra_node_bandwidth": "450 GB/s", "inter_node_bandwidth": "50 GB/s"}


@pytest.mark.parametrize("cluster, command, key, needle", [
    # H100's domain of 8 in nodes of 12: GPUs 8-15 of two nodes were one NVLink domain ("NVLink domain of 8
    # GPUs; groups leaving it: dp (3 domains)"), and size priced "whole racks of 24".
    ({"gpu": "h100-sxm-80gb", "num_gpus": 24, "gpus_per_node": 12}, ("plan",), "cluster.gpus_per_node",
     "expected a multiple of the GPU's NVLink domain of 8 GPUs or a divisor of it, got 12"),
    ({"options": [{"gpu": "h100-sxm-80gb", "max_gpus": 48, "gpus_per_node": 12}]}, ("size", "--tokens", "1T"),
     "cluster.options[0].gpus_per_node", "got 12"),
    # A GPU of its own whose domain of 5 straddles its nodes of 8.
    ({"gpu": {**GPU_MAPPING, "gpus_per_node": 8, "nvlink_domain": 5}, "num_gpus": 16}, ("plan",),
     "cluster.gpu.nvlink_domain", "expected whole nodes of 8 GPUs (gpus_per_node) or a part of one that divides it, got 5"),
])
def test_an_nvlink_domain_that_straddles_nodes_is_refused(tmp_path, cluster, command, key, needle):
    case = write(tmp_path / "case.yaml", yaml.safe_dump({
        "model": {"preset": "llama2-7b"}, "cluster": cluster, "training": {"global_batch_size": 48, "seq_len": 4096}}))
    one_line_error(cli(command[0], str(case), *command[1:]), f"{case}: {key}: ", needle)


def test_a_node_that_holds_whole_domains_or_a_part_of_one_is_taken():
    """The rule's two sides: 16 H100s a node hold two domains of 8 (as a DGX-2's 16 GPUs would be cut),
    and GB200's trays of 4 fill its domain of 72."""
    for cluster, domain in (({"gpu": "h100-sxm-80gb", "num_gpus": 32, "gpus_per_node": 16}, 8),
                            ({"gpu": "gb200", "num_gpus": 72}, 72)):
        estimate = planner.estimate({"model": {"preset": "llama2-7b"}, "cluster": cluster,
                                     "training": {"global_batch_size": 144, "seq_len": 4096},
                                     "layout": {"tp": 8, "micro_batch_size": 1}})
        assert estimate.job.cluster.gpu.nvlink_domain == domain


def test_at_risk_says_when_the_prediction_itself_is_over_the_usable_memory(tmp_path):
    """Llama 3.1 405B on 24 H100s: the fastest layout's peak of 86.9 GB of 84.0 usable was reported
    'at risk: fits as predicted' (the band's low end fits, the prediction does not). (The robust pick
    now takes a layout whose prediction fits: --fastest shows the other.)"""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({
        "model": {"preset": "llama3.1-405b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 24},
        "training": {"global_batch_size": 8, "seq_len": 8192, "engine": "megatron"}}))
    best = planner.plan(case, fastest=True).best
    assert best.memory_verdict == "at risk" and best.peak.total > best.usable_bytes
    done = cli("plan", str(case), "--fastest")
    assert done.returncode == 0 and "at risk: over the usable memory as predicted" in " ".join(done.stdout.split())
    assert "fits as predicted" not in done.stdout
    robust = planner.plan(case).best
    assert robust.memory_verdict == "at risk" and robust.peak.total <= robust.usable_bytes


@pytest.mark.parametrize("engine", ["deepspeed", "megatron", "torchtitan"])
@pytest.mark.parametrize("gpus, message", [
    # 13 A100s: DeepSpeed's launch.sh ran `deepspeed --num_nodes 2 --num_gpus 8`, 16 ranks against a
    # train_batch_size for 13; torchtitan's asked for 13 nodes of one GPU.
    (13, "13 GPUs do not fill whole 8-GPU nodes: the plan was priced on 1 full node(s) and 5 GPU(s) of one more, "
         "which no launch that starts the same number of processes on every node runs; plan for 8 or 16 GPUs"),
    # 12: DeepSpeed and torchtitan launched 2 nodes of 6, whose ranks 4-7 (a tp 4 group) sit on two
    # nodes where the plan priced one NVLink domain of 8 and one of 4; 20: torchtitan asked for 4 nodes of 5.
    (12, "plan for 8 or 16 GPUs, or give cluster.gpus_per_node: 6 where the nodes hold 6 GPUs each"),
    (20, "plan for 16 or 24 GPUs, or give cluster.gpus_per_node: 5 where the nodes hold 5 GPUs each"),
])
def test_files_for_gpus_that_do_not_fill_whole_nodes_are_refused_by_every_engine(tmp_path, engine, gpus, message):
    case = write(tmp_path / "case.yaml", yaml.safe_dump({"model": {"preset": "llama2-7b"},
                                                         "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": gpus},
                                                         "training": {"global_batch_size": 4 * gpus,
                                                                      "seq_len": 4096}}))
    done = cli("plan", str(case), "--emit", engine, "--engine", engine, "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and done.stderr.startswith(f"error: --emit: {engine}: ") \
        and message in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "o").exists()


def test_where_no_layout_of_these_gpus_exists_the_fastest_gpus_below_are_named_and_the_most_beside_them(tmp_path):
    """1,000 H100s for a batch of 1,024: no layout at all (dp must divide both, and what is left, 125
    GPUs' worth, no tp, pp and cp of Llama 3 70B fills), and no advice: doubling the nodes keeps the
    factor of 125, so no cluster up to 64 times this one has a layout either. Below: 992 GPUs have one
    (pp 31), 896 the fastest (pp 7), which the advice names, with the 992's tokens/s beside them."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({
        "model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 1000},
        "training": {"global_batch_size": 1024, "seq_len": 8192, "engine": "megatron"}}))
    done = cli("plan", str(case))
    said = " ".join(done.stdout.split())
    assert done.returncode == 3 and "no megatron layout of 1000 GPUs for this model and global batch; 896 GPUs " \
        "would have a layout that fits, the fastest of the whole-node sizes below" in said, done.stdout
    advice = json.loads(cli("plan", str(case), "--json").stdout)["no_fit"]
    fewer = advice["fewer_gpus_that_fit"]
    assert (fewer, advice["fewer_gpus_layout"]["pp"], advice["most_fewer_gpus_that_fit"],
            advice["most_fewer_gpus_layout"]["pp"]) == (896, 7, 992, 31)
    assert advice["fewer_gpus_tokens_per_s"] > advice["most_fewer_gpus_tokens_per_s"]
    assert f"the most GPUs below that have one, 992, would run {advice['most_fewer_gpus_tokens_per_s']:,.0f} " \
        "tokens/s" in said
    smaller = write(tmp_path / "smaller.yaml", yaml.safe_dump({
        "model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": fewer},
        "training": {"global_batch_size": 1024, "seq_len": 8192, "engine": "megatron"}}))
    assert cli("plan", str(smaller)).returncode == 0


def test_where_no_engine_has_a_layout_the_answer_names_every_engine_planned(tmp_path):
    """A global batch of 1 on 1,024 GPUs, no engine named: 'no megatron layout of 1024 GPUs',
    though all three engines were planned and none had one."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({"model": {"preset": "llama3-8b"},
                                                         "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 1024},
                                                         "training": {"global_batch_size": 1, "seq_len": 8}}))
    done = cli("plan", str(case))
    assert done.returncode == 3 and "no megatron, deepspeed or torchtitan layout of 1024 GPUs" in \
        " ".join(done.stdout.split())


def test_a_search_for_any_engine_beside_a_named_engine_is_refused(tmp_path):
    """search.target: any with training.engine: megatron planned Megatron-LM alone, the target unread."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({**{k: v for k, v in CASE.items() if k != "layout"},
                                                         "training": {**CASE["training"], "engine": "megatron"},
                                                         "search": {"target": "any"}}))
    one_line_error(cli("plan", str(case)), ": search.target: is 'any' but training.engine is 'megatron'")


def test_plan_says_it_does_not_read_sizes_cluster_keys(tmp_path):
    """cluster.max_gpus: 16 beside num_gpus: 64 planned 64 GPUs without a word."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({**{k: v for k, v in CASE.items() if k != "layout"},
                                                         "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8,
                                                                     "max_gpus": 16, "gpu_hour_cost": 2.0}}))
    done = cli("plan", str(case))
    assert done.returncode == 0
    assert "does not read cluster.max_gpus, cluster.gpu_hour_cost: `size` does" in done.stderr


@pytest.mark.parametrize("engine, layout", [
    # suggested zero_stage 2, which DeepSpeed's pipeline engine refuses
    ("deepspeed", {"tp": 1, "pp": 4, "zero_stage": 1, "micro_batch_size": 1, "recompute": "full"}),
    # suggested zero_stage 2 beside a pipeline, which Megatron-LM's distributed optimizer refuses
    ("megatron", {"tp": 4, "pp": 2, "zero_stage": 1, "micro_batch_size": 1}),
    # suggested tp 4 without sequence parallelism, which torchtitan's tensor parallelism always uses
    ("torchtitan", {"tp": 1, "pp": 1, "zero_stage": 0, "micro_batch_size": 4}),
    # 70B on 8 H100s: suggested full recomputation (166.7 GB, still not fitting) where the optimizer
    # offloaded fits (79.3 GB), plan's own answer
    ("deepspeed", {"dp": 2, "tp": 4, "zero_stage": 2}),
])
def test_the_cheapest_change_is_one_the_engine_runs(engine, layout):
    model = "llama3-8b" if engine == "torchtitan" else "llama3-70b"
    nodes = 1 if "dp" in layout else {"deepspeed": 4, "megatron": 2, "torchtitan": 1}[engine]
    case = {"model": {"preset": model}, "cluster": {"gpu": "h100-sxm-80gb", "nodes": nodes},
            "training": {"global_batch_size": 256, "seq_len": 4096, "engine": engine}, "layout": layout}
    est = planner.estimate(case)
    remedy = est.remedy()
    assert not est.fits and remedy is not None
    # As the user applies it: the engine runs it (no CaseError), at the peak and verdict it said.
    changed = planner.estimate({**case, "layout": layout_to_mapping(remedy.layout)})
    assert changed.fits == remedy.fits and changed.peak.total == pytest.approx(remedy.peak_bytes)
    if "dp" in layout:
        assert remedy.fits and remedy.layout.offload_optimizer == 1.0


@pytest.mark.parametrize("section, needle", [
    ({"model": {"hf_config": ""}}, "model.hf_config: expected a file's path, got an empty string"),
    ({"cluster": {"profile": "", "num_gpus": 8}}, "cluster.profile: expected a file's path, got an empty string"),
    ({"model": {"hf_config": "."}}, "model.hf_config: expected a file, got the directory"),
])
def test_a_file_key_that_is_empty_or_a_folder_is_named(tmp_path, section, needle):
    """'' or a folder said '<folder>: expected a regular file, got a directory', naming neither the
    case nor the key."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({**{k: v for k, v in CASE.items() if k != "layout"},
                                                         **section}))
    one_line_error(cli("plan", str(case)), str(case), needle)


def test_an_hf_model_folder_stands_for_its_config(tmp_path):
    """HF users give the model's folder; its config.json is read."""
    folder = Path(__file__).parent / "fixtures" / "hf" / "gpt2"
    case = {**{k: v for k, v in CASE.items() if k != "layout"}, "model": {"hf_config": str(folder)}}
    assert planner.estimate({**case, "layout": CASE["layout"]}).job.model == \
        planner.estimate({**case, "model": {"hf_config": str(folder / "config.json")},
                          "layout": CASE["layout"]}).job.model


@pytest.mark.parametrize("changes, key", [
    ({"overheads": {"cuda_context": "100 GiB"}}, "overheads.cuda_context"),
    ({"cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8, "memory": "1 GiB"}}, "cluster.memory"),
])
def test_a_context_as_large_as_the_gpu_is_refused_before_any_answer(changes, key):
    """A negative usable memory was an answer: estimate's usable_bytes -22,333,829,939 (exit 3),
    plan's "a layout fits up to -23.1 GB"."""
    case = {**copy.deepcopy(CASE), **changes}
    for command in (planner.estimate, planner.plan):
        with pytest.raises(CaseError, match=rf"{re.escape(key)}: leaves the allocator no memory: .* expected a CUDA "
                                            r"context below"):
            command(case)


def test_the_apis_reader_and_emitter_refuse_wrong_types_naming_the_argument(tmp_path):
    """read_config(tp="2") raised a TypeError, recompute="bogus" the cost model's SpecError;
    emit(force="no") overwrote the files, "no" being truthy."""
    case = copy.deepcopy(CASE)
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
                                  "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}))
    for kwargs, needle in (({"tp": "2"}, "read_config: tp: expected an integer, got str '2'"),
                           ({"recompute": "bogus"}, "read_config: recompute: expected none, selective or full")):
        with pytest.raises(CaseError, match=re.escape(needle)):
            planner.read_config(case, "deepspeed", config, **kwargs)
    with pytest.raises(CaseError, match="emit: force: expected true or false, got str 'no'"):
        planner.emit(planner.estimate(case), "megatron", tmp_path / "run", force="no")
    assert not (tmp_path / "run").exists()


def test_a_size_option_whose_performance_is_wrong_is_named_by_its_place_in_the_list(tmp_path):
    case = {"model": {"preset": "llama3-8b"}, "training": {"global_batch_size": 64, "seq_len": 4096},
            "cluster": {"options": [{"gpu": "h100-sxm-80gb", "max_gpus": 64},
                                    {"gpu": "b200", "max_gpus": 64, "performance": {"gemm_efficiency": 5}}]}}
    with pytest.raises(CaseError, match=re.escape("cluster.options[1].performance.gemm_efficiency: expected a "
                                                  "fraction in (0, 1], got 5.0")):
        planner.size(case, "1T")


def test_a_quantized_weight_gather_where_no_weights_are_gathered_is_refused():
    """fp8_param_gather: true at ZeRO 0 was echoed by estimate with the same peak and step as false."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 128, "seq_len": 8192, "precision": "fp8", "engine": "any",
                         "fp8_param_gather": True},
            "layout": {"tp": 2, "micro_batch_size": 1, "zero_stage": 0}}
    with pytest.raises(CaseError, match="training.fp8_param_gather: .*ZeRO stage 0 gathers none"):
        planner.estimate(case)
    assert planner.estimate({**case, "layout": {**case["layout"], "zero_stage": 1}}).fits is not None


def test_a_degree_that_does_not_divide_the_gpus_is_the_key_named():
    """layout.cp 4096 on 16 GPUs was reported as layout.tp."""
    case = {**copy.deepcopy(CASE), "layout": {"cp": 4096}}
    with pytest.raises(CaseError, match=r"layout\.cp: tp·pp·cp = 1·1·4096 = 4096 must divide the cluster's 8 GPUs"):
        planner.estimate(case)


def test_an_output_that_is_a_pipe_or_device_is_refused_and_kept(tmp_path):
    """--write-bands (which replaces its file) made a FIFO, and as root /dev/full, a regular file;
    --force replaced them for calibrate --out and plan --plot too."""
    fifo = tmp_path / "bands.yaml"
    os.mkfifo(fifo)
    runs = write(tmp_path / "runs.yaml", yaml.safe_dump(yaml.safe_load(open("planner/published/published_runs.yaml"))[:6]))
    one_line_error(cli("validate-published", str(runs), "--no-experts", "--write-bands", str(fifo)),
                   f"{fifo}: --write-bands: is a pipe, not a file")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    plot = tmp_path / "p.png"
    os.mkfifo(plot)
    one_line_error(cli("plan", "examples/llama3-70b-h100.yaml", "--plot", str(plot), "--force"), "is a pipe")
    assert stat.S_ISFIFO(os.lstat(plot).st_mode)


@pytest.mark.parametrize("flags, needle", [
    (["--pp", "2", "--stage-layers", "9" * 5000 + ",1"], "--stage-layers: expected layer counts from 0 to 1024"),
    (["--tp", "9" * 23], "'--tp': 99999999999999999999999 is not in the range 1<=x<=1048576"),
    (["--pp", "9" * 23], "'--pp'"),
])
def test_diagnose_bounds_its_numeric_flags_naming_them(tmp_path, flags, needle):
    """A 5,000-digit --stage-layers entry was int()'s traceback; a 23-digit --tp was refused as
    "read_config: tp", an internal function's name."""
    case = write(tmp_path / "case.yaml", "model: {preset: llama3-70b}\ncluster: {gpu: h100-sxm-80gb, num_gpus: 8}\n"
                                         "training: {global_batch_size: 64, seq_len: 4096, engine: deepspeed}\n")
    config = write(tmp_path / "ds.json", json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
                                                     "gradient_accumulation_steps": 8, "bf16": {"enabled": True},
                                                     "zero_optimization": {"stage": 3}}))
    one_line_error(cli("diagnose", str(case), "--config", str(config), *flags), needle)


def test_size_refusing_a_case_with_a_layout_section_says_one_line(tmp_path):
    """The note that size ignores the layout section came first, then the refusal: two lines."""
    case = write(tmp_path / "case.yaml", "model: {preset: llama3-70b}\ncluster: {gpu: h100-sxm-80gb, num_gpus: 64}\n"
                                         "training: {global_batch_size: 64, seq_len: 4096}\nlayout: {tp: 8}\nbogus: 1\n")
    one_line_error(cli("size", str(case), "--tokens", "1T"), "bogus: unknown key")


@pytest.mark.parametrize("model, cluster, key", [
    ("{preset: llama3-70b}", "{profile: nope.yaml, num_gpus: 8}", "cluster.profile"),
    ("{hf_config: nope.json}", "{gpu: h100-sxm-80gb, num_gpus: 8}", "model.hf_config"),
])
def test_a_file_the_case_names_that_is_not_there_is_named_by_the_case_and_key(tmp_path, model, cluster, key):
    """It was "<the missing path>: file not found", naming neither the case nor the key."""
    case = write(tmp_path / "case.yaml", f"model: {model}\ncluster: {cluster}\n"
                                         "training: {global_batch_size: 64, seq_len: 4096}\n")
    one_line_error(cli("plan", str(case)), f"{case}: {key}: file not found: {tmp_path}/nope.")


def test_megatron_refuses_a_middle_pipeline_stage_without_layers(tmp_path):
    """[40, 0, 0, 40] was estimated as Megatron-LM's, whose pipeline gives every model chunk but the
    edges' a transformer layer (diagnose refuses the same layout written as its layout string)."""
    case = write(tmp_path / "case.yaml", "model: {preset: llama3-70b}\ncluster: {gpu: h100-sxm-80gb, nodes: 16}\n"
                                         "training: {global_batch_size: 512, seq_len: 4096, engine: megatron}\n"
                                         "layout: {tp: 8, pp: 4, sequence_parallel: true, recompute: full, "
                                         "stage_layers: [40, 0, 0, 40]}\n")
    one_line_error(cli("estimate", str(case)), "layout.stage_layers: megatron cannot run it")
    # the edges may hold none: they hold the embedding and the LM head
    assert cli("estimate", str(write(tmp_path / "edge.yaml", case.read_text().replace("[40, 0, 0, 40]",
                                                                                       "[0, 27, 27, 26]")))).returncode == 0


@pytest.mark.parametrize("key, bound", [("num_layers", "<= 1024"), ("hidden_size", "<= 1048576"),
                                        ("vocab_size", "<= 16777216"), ("ffn_hidden_size", "<= 1048576"),
                                        ("num_experts", "<= 1048576")])
def test_a_model_size_past_its_bound_is_refused_by_estimate_naming_the_key(tmp_path, key, bound):
    """2^62 of any of these gave "cluster: the GPU's figures give steps of 2.64e+18 s", naming the
    GPU; and num_experts had no bound (2^40 of them kept plan busy 4–10 s)."""
    case = write(tmp_path / "case.yaml", f"model: {{preset: llama3-70b, {key}: {2**62}}}\n"
                                         "cluster: {gpu: h100-sxm-80gb, num_gpus: 8}\n"
                                         "training: {global_batch_size: 64, seq_len: 4096}\nlayout: {tp: 8}\n")
    one_line_error(cli("estimate", str(case)), f"model.{key}: expected an integer {bound}")


def test_a_cluster_past_the_bound_is_refused_naming_nodes_as_written(tmp_path):
    """2^62 nodes were refused as training.global_batch_size, which no dp of 2^65 GPUs divides."""
    case = write(tmp_path / "case.yaml", f"model: {{preset: llama3-70b}}\ncluster: {{gpu: h100-sxm-80gb, nodes: {2**62}}}\n"
                                         "training: {global_batch_size: 64, seq_len: 4096}\nlayout: {tp: 8}\n")
    one_line_error(cli("estimate", str(case)), "cluster.nodes: expected at most 131072 nodes of 8 GPUs")


def test_an_answer_is_given_where_stderr_cannot_be_written(tmp_path):
    """A note that could not be written (2>/dev/full) made plan --json exit 1 with nothing on stdout."""
    out = tmp_path / "o.json"
    with open(out, "w") as stdout, open("/dev/full", "w") as stderr:
        done = subprocess.run([sys.executable, "-m", "planner", "plan", "examples/llama3-70b-h100.yaml", "--json"],
                              stdout=stdout, stderr=stderr, timeout=120)
    assert done.returncode == 0 and json.loads(out.read_text())["best"]


def test_calibrate_bounds_its_nodes():
    """--nnodes 10^9 was taken and waited in the rendezvous until killed."""
    one_line_error(cli("calibrate", "--out", "x.yaml", "--nnodes", "1000000000", "--rdzv-endpoint", "localhost:29511"),
                   "'--nnodes': 1000000000 is not in the range 1<=x<=1048576")


def test_calibrate_refuses_a_gpu_preset_on_a_machine_without_one(tmp_path):
    """--gpu-preset b200 on this CPU-only machine ran its ranks and wrote a profile claiming a B200's
    peaks (bf16 2,250 TFLOP/s) at a GEMM efficiency of 6e-5: the CPU's timings, labelled a GPU."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "b200.yaml"
    one_line_error(cli("calibrate", "--out", str(out), "--quick", "--gpu-preset", "b200"),
                   "--gpu-preset: b200: names a GPU, but torch sees none on this machine")
    assert not out.exists()


PROFILE = Path(__file__).resolve().parent.parent / "calibration" / "profiles" / "cpu-2core-dev.yaml"


def _estimated_case(tmp_path, profile: dict) -> dict:
    """A small fp32 case of one rank on ``profile``, written to a file."""
    written = tmp_path / "profile.yaml"
    written.write_text(yaml.safe_dump(profile))
    return {"model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 512},
            "cluster": {"profile": str(written), "num_gpus": 1},
            "training": {"global_batch_size": 2, "seq_len": 64, "precision": "fp32"},
            "layout": {"dp": 1, "micro_batch_size": 1}}


def _estimated_on(tmp_path, profile: dict):
    """The profile written to a file, and the refusal of an estimate of a small fp32 case on it."""
    case = _estimated_case(tmp_path, profile)
    with pytest.raises(CaseError) as info:
        planner.estimate(case)
    return Path(case["cluster"]["profile"]), info


@pytest.mark.parametrize("where, value, key, expected", [
    # quick: "yes" skipped validate's refusal of a --quick profile; cpu: 5 its check of the CPU model;
    # backend: NCCL ran as gloo; an infinite reference GEMM was printed as Infinity in --json.
    ("machine.quick", "yes", "machine.quick", "expected true or false, got str 'yes'"),
    ("machine.cpu", 5, "machine.cpu", "expected a string, got int 5"),
    ("machine.backend", "NCCL", "machine.backend", "expected one of gloo, nccl, got str 'NCCL'"),
    ("machine.threads_per_rank", 0, "machine.threads_per_rank", "expected an integer >= 1, got int 0"),
    ("machine.reference_gemm_tflops", {"before": math.inf, "after": 1.0}, "machine.reference_gemm_tflops.before",
     "expected a number of at most 100000, got float inf"),
    ("machine.other_cpu_share", -5.0, "machine.other_cpu_share", "expected a share from 0 to 1, got float -5.0"),
    ("machine.device", "x" * 10_000, "machine.device", "expected a string of at most 4,096 characters"),
    ("machine", ["a"], "machine", "expected a mapping, got list ['a']"),
    # false, 0 or [] were taken as no section at all
    ("performance", False, "performance", "expected a mapping, got bool False"),
    ("fabric", [], "fabric", "expected a mapping, got list []"),
    # named as the case's cluster.gpu…, in FLOP/s: "got -1000000000000.0"
    ("gpu.peak_tflops.fp32", -1, "gpu.peak_tflops.fp32", "expected a positive number, got int -1"),
    ("fabric.efficiency", 0, "fabric.efficiency", "expected a positive number, got int 0"),
    # a domain of 3 of the profile's 2-GPU node was named as the case's cluster.gpu.nvlink_domain, or taken
    ("gpu.nvlink_domain", 3, "gpu.nvlink_domain", "expected whole nodes of 2 GPUs (gpus_per_node) or a part of one"),
])
def test_a_profile_names_its_own_key_and_the_value_as_written(tmp_path, where, value, key, expected):
    profile = yaml.safe_load(PROFILE.read_text())
    *path, last = where.split(".")
    node = profile
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value
    written, info = _estimated_on(tmp_path, profile)
    assert info.value.source == str(written) and info.value.key == key
    assert expected in str(info.value)



@pytest.mark.parametrize("key", ["gemm_efficiency", "kernel_overhead_s", "attention_efficiency"])
def test_a_calibrated_profile_without_a_figure_its_measurements_fitted_is_refused(tmp_path, key):
    """The development profile with one fitted figure deleted from its performance section was priced on
    Performance()'s generic default for it (GEMMs at 0.75 of the peak for its measured 0.82, no kernel
    overhead for its 85 µs), exit 0 and no word: its measurements section still holds the fit that
    `calibrate` copied there."""
    profile = yaml.safe_load(PROFILE.read_text())
    fits = {"gemm_efficiency": "measurements.gemm.fp32.fit", "kernel_overhead_s": "measurements.gemm.fp32.fit",
            "attention_efficiency": "measurements.attention.fit"}
    *path, last = fits[key].split(".")
    node = profile
    for part in path + [last]:
        node = node[part]
    assert key in node and key in profile["performance"]  # calibrate wrote both
    del profile["performance"][key]
    written, info = _estimated_on(tmp_path, profile)
    assert (info.value.source, info.value.key) == (str(written), f"performance.{key}")
    assert info.value.expected.startswith("missing: ") and fits[key] in info.value.expected


FITS = {"gemm_efficiency": "measurements.gemm.fp32.fit", "kernel_overhead_s": "measurements.gemm.fp32.fit",
        "attention_efficiency": "measurements.attention.fit"}


@pytest.mark.parametrize("key", sorted(FITS))
def test_a_calibrated_profile_whose_two_copies_of_a_figure_disagree_is_refused(tmp_path, key):
    """The development profile's attention figure was rescaled by hand in its performance section (0.338)
    and left as fitted in its measurements (0.2897): every estimate priced the one and the file showed the
    other, with no word. `calibrate` writes both from one figure at 4 significant figures
    (calibration/profile.py), so a copy that differs by more than a unit of the fourth is an edit."""
    profile = yaml.safe_load(PROFILE.read_text())
    fit = profile
    for part in FITS[key].split("."):
        fit = fit[part]
    fitted = fit[key]
    assert profile["performance"][key] == fitted  # calibrate wrote both, the same
    # Within rounding: half a unit of the fourth significant figure where that is the largest share (a
    # leading 1), what writing the unrounded fit at 4 figures can move it by.
    profile["performance"][key] = fitted * (1 + 5e-4)
    planner.estimate(_estimated_case(tmp_path, profile))
    profile["performance"][key] = fitted * 1.005  # half a percent: no rounding of a 4-figure number
    written, info = _estimated_on(tmp_path, profile)
    assert (info.value.source, info.value.key) == (str(written), f"performance.{key}")
    assert info.value.expected == (f"{fitted * 1.005:g} disagrees with the {fitted:g} of {FITS[key]}, which "
                                   "`calibrate` writes as the same figure (an edited or damaged file); calibrate "
                                   "again, or make the two agree")


def test_a_profiles_alone_figures_are_held_to_their_own_fit(tmp_path):
    """Rank 0's figures (alone.performance, which a case of one rank is priced on) come from the fits under
    measurements.alone: a figure there that disagrees with its fit is refused as the shared ones are, and one
    left out still falls back to the shared figure."""
    profile = yaml.safe_load(PROFILE.read_text())
    fitted = profile["measurements"]["attention"]["fit"]["attention_efficiency"]
    profile["measurements"]["alone"] = {"attention": {"fit": {"attention_efficiency": fitted / 2}}}
    profile["alone"] = {"performance": {}}
    planner.estimate(_estimated_case(tmp_path, profile))  # left out: the shared figure stands
    profile["alone"]["performance"]["attention_efficiency"] = fitted
    written, info = _estimated_on(tmp_path, profile)
    assert (info.value.source, info.value.key) == (str(written), "alone.performance.attention_efficiency")
    assert info.value.expected.startswith(f"{fitted:g} disagrees with the {fitted / 2:g} of measurements.attention.fit")


def test_a_profile_without_its_gpu_names_the_key_as_written(tmp_path):
    """It said ".gpu: missing", the top-level key behind a dot."""
    profile = yaml.safe_load(PROFILE.read_text())
    del profile["gpu"]
    written = tmp_path / "profile.yaml"
    written.write_text(yaml.safe_dump(profile))
    case = {"model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 512},
            "cluster": {"profile": str(written), "num_gpus": 1},
            "training": {"global_batch_size": 2, "seq_len": 64, "precision": "fp32"}}
    with pytest.raises(CaseError) as info:
        planner.estimate(case)
    assert str(info.value) == f"{written}: gpu: missing"


@pytest.mark.parametrize("given, key", [
    ({"profile": "PROFILE"}, "cluster.profile"),
    ({"profile": "PROFILE", "memory": "0.2 GiB"}, "cluster.memory"),
    ({"gpu": {"memory": "1 GiB", "peak_tflops": {"bf16": 100}, "hbm_bandwidth": "1 TB/s",
              "intra_node_bandwidth": "100 GB/s", "inter_node_bandwidth": "10 GB/s", "gpus_per_node": 8,
              "nvlink_domain": 8}}, "cluster.gpu.memory"),
])
def test_a_gpu_memory_that_leaves_nothing_is_named_where_it_is_given(tmp_path, given, key):
    """A profile's gpu.memory of 1 GiB (under the 1 GiB CUDA context) was blamed on the case's
    cluster.memory, a key the case did not have. PROFILE is a CPU's, which holds the process outside the
    priced peak (``Overheads.cpu_process``, 0.23 GB), not a CUDA context: 0.2 GiB is under it."""
    profile = yaml.safe_load(PROFILE.read_text())
    profile["gpu"]["memory"] = "0.2 GiB"
    written = tmp_path / "profile.yaml"
    written.write_text(yaml.safe_dump(profile))
    cluster = {k: (str(written) if v == "PROFILE" else v) for k, v in given.items()}
    case = {"model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 512},
            "cluster": {**cluster, "num_gpus": 1},
            "training": {"global_batch_size": 2, "seq_len": 64, "precision": "fp32"}}
    with pytest.raises(CaseError) as info:
        planner.estimate(case)
    assert info.value.key == key and "leaves the allocator no memory" in str(info.value), str(info.value)


def test_size_names_the_option_that_gave_a_value_and_the_entry_that_cannot_run_the_case(tmp_path):
    """--tokens 1K was refused as the case file's key 'tokens'; a V100 among the options, which has no
    bf16, was refused as cluster.gpu.peak_tflops, a key an options case does not have."""
    one_line_error(cli("size", "examples/llama3-70b-15t-size.yaml", "--tokens", "1K", "--deadline", "30d"),
                   "error: --tokens: expected at least one global batch of examples/llama3-70b-15t-size.yaml")
    options = [{"gpu": "h100-sxm-80gb", "max_gpus": 64}, {"gpu": "v100-sxm-32gb", "max_gpus": 64}]
    case = write(tmp_path / "case.yaml", yaml.safe_dump({"model": {"preset": "llama3-8b"}, "cluster": {"options": options},
                                                         "training": {"global_batch_size": 512, "seq_len": 4096}}))
    one_line_error(cli("size", str(case), "--tokens", "1T", "--deadline", "30d"),
                   f"{case}: cluster.options[1]: v100-sxm-32gb cannot train in bf16")


def test_size_names_the_gpu_type_that_cannot_run_deepep(tmp_path):
    """An MI300X after an H100 among the options, with expert_dispatch deepep: every MI300X layout refused
    it and the type vanished from the answer, exit 0; listed first, the case was refused."""
    options = [{"gpu": "h100-sxm-80gb", "max_gpus": 512}, {"gpu": "mi300x", "max_gpus": 512}]
    case = write(tmp_path / "case.yaml", yaml.safe_dump({
        "model": {"preset": "gpt-oss-120b"}, "cluster": {"options": options},
        "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron", "expert_dispatch": "deepep"}}))
    one_line_error(cli("size", str(case), "--tokens", "100B", "--deadline", "30d"),
                   f"{case}: cluster.options[1]: mi300x cannot run training.expert_dispatch deepep")


def test_bands_from_too_few_runs_are_refused_and_a_teams_file_reads_without_its_source(tmp_path):
    """One run wrote a band of zero width into a file that says min_runs 20, its header claiming the
    repo's published runs; a team's runs file without `source` (which calibrate --from-runs takes)
    was unreadable to validate-published: 'a field has the wrong type or is missing ('source')'."""
    rows = [r for r in yaml.safe_load(open("planner/published/published_runs.yaml")) if r.get("id", "").startswith("mpt")]
    team = [{k: v for k, v in r.items() if k != "source"} for r in rows[:1]]
    runs = write(tmp_path / "runs.yaml", yaml.safe_dump(team))
    bands = tmp_path / "bands.yaml"
    one_line_error(cli("validate-published", str(runs), "--no-experts", "--write-bands", str(bands)),
                   "error: --write-bands: 1 scored run: bands need at least 20")
    assert not bands.exists()
    done = cli("validate-published", str(runs), "--no-experts", "--json")
    assert done.returncode == 0, done.stderr
    source, = json.loads(done.stdout)["throughput"]["by_source"]  # the file's name, as the table shortens it
    assert str(runs).startswith(source)


def test_a_profile_is_not_written_over_the_runs_it_is_fitted_to(tmp_path):
    """--out naming the runs file, with --force, replaced the team's runs with the profile."""
    runs = write(tmp_path / "runs.yaml", yaml.safe_dump(yaml.safe_load(open("planner/published/published_runs.yaml"))[:3]))
    before = runs.read_text()
    one_line_error(cli("calibrate", "--from-runs", str(runs), "--out", str(runs), "--force"),
                   f"--out: {runs}: is a file the fit reads")
    assert runs.read_text() == before


def test_the_instinct_gpus_with_presets_are_read_in_a_runs_file():
    """An AMD Instinct MI325X run was refused as a GPU with no preset; mi325x and mi355x are presets."""
    from planner.published_runs import gpu_preset

    assert (gpu_preset("AMD Instinct MI325X"), gpu_preset("AMD Instinct MI355X")) == ("mi325x", "mi355x")


@pytest.mark.parametrize("key", ["attention_seq_half", "attention_head_dim_half"])
def test_an_attention_half_point_past_any_length_is_refused(key):
    """2^64 elements as the sequence half-point was priced (67,434 → 52,617 tokens/s), where every
    other integer past 2^63 - 1 is refused."""
    import planner
    from planner.errors import CaseError

    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8,
                                                          "performance": {key: 2**64}},
            "training": {"global_batch_size": 64, "seq_len": 4096}, "layout": {"tp": 1}}
    with pytest.raises(CaseError) as refused:
        planner.estimate(case)
    assert refused.value.key == f"cluster.performance.{key}"


def test_a_file_the_case_names_that_cannot_be_read_is_named_by_the_case_and_its_key(tmp_path):
    """A device, a link loop or YAML given as the HF config: the message named the file alone, not the
    case that named it nor where (a missing file already said both)."""
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "notjson.yaml").write_text("a: 1\n")
    rest = "training: {global_batch_size: 64, seq_len: 4096}\n"
    for model, cluster, key, said in [
            ("{hf_config: /dev/zero}", "{gpu: h100-sxm-80gb, num_gpus: 8}", "model.hf_config", "character device"),
            ("{hf_config: notjson.yaml}", "{gpu: h100-sxm-80gb, num_gpus: 8}", "model.hf_config", "expected valid JSON"),
            ("{preset: llama3-8b}", "{profile: loop1, num_gpus: 8}", "cluster.profile", "cannot be read")]:
        case = write(tmp_path / "case.yaml", f"model: {model}\ncluster: {cluster}\n{rest}")
        one_line_error(cli("plan", str(case)), f"{case}: {key}: ", said)


def test_an_empty_case_path_is_said_to_be_empty():
    """planner.estimate(""): Path("") is the working directory, refused as "'.': a directory"."""
    for call in (planner.estimate, planner.plan):
        with pytest.raises(CaseError, match="expected a case file's path, got an empty one"):
            call("")


@pytest.mark.parametrize("args", [("plan", "{case}", "--plot", "{tmp}/plots.png/"),
                                  ("validate-published", "--no-experts", "--write-bands", "{tmp}/bands/"),
                                  ("calibrate", "--from-runs", "{case}", "--out", "{tmp}/profile/")])
def test_a_file_to_write_given_with_a_trailing_slash_is_refused(tmp_path, args):
    """typer's Path dropped the '/': `calibrate --out newdir/` wrote a file named newdir."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({k: v for k, v in CASE.items() if k != "layout"}))
    result = cli(*(a.format(case=case, tmp=tmp_path) for a in args))
    one_line_error(result, "ends in '/', which names a folder; expected a file's path")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["case.yaml"]


def test_write_bands_keeps_an_existing_file_unless_forced(tmp_path):
    """--write-bands replaced any file it was given (the command had no --force), where every other
    output refuses "exists; pass --force", before the work."""
    rows = [r for r in yaml.safe_load(open("planner/published/published_runs.yaml")) if r.get("id", "").startswith("mpt")]
    runs = write(tmp_path / "runs.yaml", yaml.safe_dump(rows[:1]))
    kept = write(tmp_path / "keep.yaml", "KEEP ME\n")
    start = time.monotonic()
    one_line_error(cli("validate-published", str(runs), "--no-experts", "--write-bands", str(kept)),
                   f"{kept}: --write-bands: exists; pass --force")
    assert time.monotonic() - start < QUICK_S and kept.read_text() == "KEEP ME\n"
    # with --force it goes on to the scoring (which this one run cannot give bands)
    one_line_error(cli("validate-published", str(runs), "--no-experts", "--write-bands", str(kept), "--force"),
                   "error: --write-bands: 1 scored run: bands need at least 20")


def test_a_step_past_the_bound_names_its_cause_and_a_layout_that_overflows_is_exit_3(tmp_path):
    """Llama 3.1 405B at 2^24 tokens a sequence on 8 H100s: `estimate` said exit 2, "cluster: the GPU's
    figures give steps of 1.25e+08 s", for a layout that does not fit (plan said exit 3); where it fits
    (a GPU of 100 TB), the job's own compute passes the bound, not the GPU's figures; and a bandwidth
    of 1 B/s was "training.engine: no engine can run it", naming no key the case gives."""
    huge = ("model: {preset: llama3.1-405b}\ncluster: {gpu: h100-sxm-80gb, num_gpus: 8%s}\n"
            "training: {global_batch_size: 64, seq_len: 16777216}\nlayout: {tp: 8, recompute: full}\n")
    (tmp_path / "over.yaml").write_text(huge % "")
    assert run_cli("estimate", str(tmp_path / "over.yaml")).returncode == 3
    (tmp_path / "roomy.yaml").write_text(huge % ", memory: 100000 GB")
    done = run_cli("estimate", str(tmp_path / "roomy.yaml"))
    assert done.returncode == 2 and f"{tmp_path / 'roomy.yaml'}: training: its steps compute for" in done.stderr
    # One node: every layout talks over the 1 B/s links (on two, a pipeline across them was priced at
    # the fabric's speed, under the bound, and answered).
    (tmp_path / "slow.yaml").write_text("model: {preset: llama3-8b}\ntraining: {global_batch_size: 64, seq_len: 4096}\n"
                                        "cluster: {gpu: h100-sxm-80gb, num_gpus: 8, intra_node_bandwidth: 1 B/s}\n")
    done = run_cli("plan", str(tmp_path / "slow.yaml"))
    assert done.returncode == 2 and f"{tmp_path / 'slow.yaml'}: cluster: megatron: the GPU's figures" in done.stderr


def test_validate_published_refuses_a_run_given_twice(tmp_path):
    """Two copies of a runs file (or a row repeated, or a YAML alias of it) were scored twice: 8 rows
    from 4, every error and band count doubled; calibrate --from-runs refuses them."""
    from planner.published_runs import DEFAULT_FILES

    import yaml as yaml_module

    rows = yaml_module.safe_load(Path(DEFAULT_FILES[0]).read_text())[:2]
    (tmp_path / "a.yaml").write_text(yaml_module.safe_dump(rows))
    (tmp_path / "b.yaml").write_text(yaml_module.safe_dump(rows[:1]))
    (tmp_path / "aliased.yaml").write_text("- &r " + json.dumps(rows[0]) + "\n- *r\n")
    for files, origin in (((tmp_path / "a.yaml", tmp_path / "b.yaml"), f"{tmp_path / 'b.yaml'}[0]"),
                          ((tmp_path / "aliased.yaml",), f"{tmp_path / 'aliased.yaml'}[1]")):
        done = run_cli("validate-published", *map(str, files))
        assert done.returncode == 2 and done.stderr.startswith(f"error: {origin}: {rows[0]['id']}: the same run id "), \
            done.stderr


@pytest.mark.parametrize("section, key", [
    ("cluster: {num_gpus: 8, gpu: {memory: 80 GB, peak_tflops: {bf16: 989}, hbm_bandwidth: 3.35 TB/s, "
     "intra_node_bandwidth: 900 GB/s, inter_node_bandwidth: 50 GB/s, gpus_per_node: 8, nvlink_domain: 8, "
     "sm_count: 9223372036854775807}}", "cluster.gpu.sm_count"),
    ("cluster: {gpu: h100-sxm-80gb, num_gpus: 8}\nsearch: {min_pp: 4611686018427387904}", "search.min_pp"),
])
def test_a_count_past_any_gpu_or_cluster_is_refused_with_its_bound(tmp_path, section, key):
    """sm_count 2^63 was taken and priced as steps of 2.6e15 s blamed on "the GPU's figures"; min_pp 2^62
    as no layout meeting "the search section's pp"."""
    (tmp_path / "case.yaml").write_text("model: {preset: llama3-8b}\ntraining: {global_batch_size: 64, seq_len: 4096}\n"
                                        + section + "\n")
    done = run_cli("plan", str(tmp_path / "case.yaml"))
    assert done.returncode == 2 and f"case.yaml: {key}: expected an integer <= " in done.stderr, done.stderr


def test_a_config_of_hundreds_of_thousands_of_values_is_refused_before_it_is_read(tmp_path):
    """An 11 MB ds_config of 5.5 million numbers took 29 s to diagnose (a Python hook on every number,
    five readings over), and an 11 MB argument list of 1.5 million words 53 s: both are bounded
    (the YAML files' 250,000 nodes; the bash reader's 200,000 words), and refused at once."""
    (tmp_path / "ds.json").write_text(json.dumps({"train_batch_size": 8, "_comment": [0] * 300_000}))
    (tmp_path / "args.txt").write_text("--tensor-model-parallel-size 8 --data-path "
                                       + " ".join(f"/d{i}" for i in range(250_000)) + "\n")
    case = str(Path(__file__).resolve().parent.parent / "examples" / "llama3-70b-h100.yaml")
    for option, name, says in (("--config", "ds.json", "holds more than 250,000 numbers and objects"),
                               ("--megatron-args", "args.txt", "holds more than 200,000 words")):
        done = run_cli("diagnose", case, option, str(tmp_path / name))
        assert done.returncode == 2 and f"{tmp_path / name}: {says}" in done.stderr, done.stderr


def test_a_slow_runner_up_past_the_step_bound_leaves_the_answer_under_it():
    """A kernel overhead of an hour (within its bound) gives llama3-8b's layouts steps of 1.8e6 s, and
    some runner-up 1.45e7 s, past the solver's bound: `plan --engine torchtitan` refused the case
    (exit 2), though its best steps in 7.2e6 s, and the default plan dropped two engines on it. The
    layouts past the bound are set aside; the answer stands."""
    case = {"model": {"preset": "llama3-8b"},
            "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8, "performance": {"kernel_overhead_s": 3600}},
            "training": {"global_batch_size": 32, "seq_len": 4096}}
    from planner.limits import MAX_STEP_TIME_S

    best = planner.plan(case, engine="torchtitan", top_k=20).best
    assert best.step_time_s < MAX_STEP_TIME_S
    engines = planner.plan(case, top_k=20).engines
    # Each engine is given, or found slower than the margin of the quickest: none is refused.
    assert len(engines) == 3 and all(plan is not None and plan.best is not None or why.startswith("no layout whose step is within")
                                     for _, plan, why in engines)


def test_validate_without_a_layout_names_validate_too(tmp_path):
    """`validate` on a case with no layout said "`estimate` needs a layout", naming another command."""
    from calibration.host import cpu_model

    case = write(tmp_path / "case.yaml", yaml.safe_dump({k: v for k, v in CASE.items() if k != "layout"}))
    # The development profile, as if measured on this machine's CPU: validate refuses a profile of
    # another CPU first, and which CPU runs the suite is not this test's question.
    profile = yaml.safe_load(PROFILE.read_text())
    profile["machine"]["cpu"] = cpu_model()
    here = write(tmp_path / "profile.yaml", yaml.safe_dump(profile))
    line = one_line_error(cli("validate", str(case), "--profile", str(here)), "layout: missing")
    assert "`validate`" in line


def test_plot_and_out_at_one_path_are_refused_as_such(tmp_path):
    """--plot and --out on one path said "--plot: is a folder" where nothing existed: the two collide."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({k: v for k, v in CASE.items() if k != "layout"}))
    both = str(tmp_path / "z.png")
    one_line_error(cli("plan", str(case), "--emit", "megatron", "--out", both, "--plot", both), "--plot",
                   "--out's folder")
    assert not os.path.exists(both)


def test_out_dash_is_refused_not_a_folder_named_dash(tmp_path):
    """`--out -` made a folder named "-" in the working directory, where "-" means a stream to most tools."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({k: v for k, v in CASE.items() if k != "layout"}))
    one_line_error(cli("plan", str(case), "--emit", "megatron", "--out", "-"), "--out", "folder's path")
    assert not os.path.exists("-")


@pytest.mark.parametrize("profile", [None, {}, "abc"])
def test_rendering_no_profile_is_refused(profile):
    """learn.render(None) wrote "null" under the header: a profile file every case then refused."""
    with pytest.raises(CaseError, match="render: profile: expected the profile"):
        planner.learn.render(profile)


# --- silently accepted nonsense and misleading messages (second hostile report) ------------------

MEGATRON_16 = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
               "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron"}}


@pytest.mark.parametrize("section, key", [("layout", "layout.recompute_num_layers"),
                                          ("search", "search.recompute_num_layers")])
def test_full_recomputation_of_no_layers_is_refused(tmp_path, section, key):
    """recompute: full with recompute_num_layers: 0 was priced exactly as recompute: none (exit 0), while
    the answer still said full; megatron-core takes 1 to a stage's layers."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump(
        {**MEGATRON_16, section: {"recompute": "full", "recompute_num_layers": 0}}))
    one_line_error(cli("estimate" if section == "layout" else "plan", str(case)),
                   f"case.yaml: {key}: expected at least 1", "got 0")


def test_megatron_full_recomputation_of_no_layers_is_refused(tmp_path):
    """--recompute-num-layers 0: block checkpoints no layer, uniform's loop never advances."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump(MEGATRON_16))
    for method in ("block", "uniform"):
        args = write(tmp_path / "args.txt", "--tensor-model-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
                     f"--bf16 --use-distributed-optimizer --recompute-granularity full --recompute-method {method} "
                     "--recompute-num-layers 0\n")
        one_line_error(cli("diagnose", str(case), "--megatron-args", str(args)),
                       "args.txt: --recompute-num-layers: expected at least 1")


DEEPSPEED_16 = {**MEGATRON_16, "training": {**MEGATRON_16["training"], "engine": "deepspeed"}}
# What `plan --emit deepspeed` writes for DEEPSPEED_16 (ds_ok.json of the report).
PLANNED_DS_CONFIG = {
    "_comment": ["Generated by layout-planner from ds.yaml", "Llama 3 8B on 16 x h100-sxm-80gb, global batch 64 x 4096 tokens",
                 "planned layout: pp=1 recompute=none (train.py builds it: see launch.sh; no ds_config key says so)"],
    "train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
    "optimizer": {"type": "Adam"}, "zero_optimization": {"stage": 2, "overlap_comm": True}, "bf16": {"enabled": True}}


def _ds_config(tmp_path, planned_line=None, **keys):
    config = copy.deepcopy(PLANNED_DS_CONFIG)
    if planned_line is not None:
        config["_comment"][-1] = planned_line
    config.update(keys)
    case = write(tmp_path / "ds.yaml", yaml.safe_dump(DEEPSPEED_16))
    return case, write(tmp_path / "ds_config.json", json.dumps(config))


@pytest.mark.parametrize("line, where", [("planned layout: (pp=2)", "before its '('"),
                                         ("planned layout:", "after it")])
def test_a_planned_layout_line_that_states_nothing_is_refused(tmp_path, line, where):
    """"planned layout: (pp=2)": everything from the "(" was dropped as the emitter's aside, so the line read
    as saying nothing (exit 0, pp 1), where every other edit the reader cannot parse is refused. A line with
    no "(" is not said to state nothing before one."""
    case, config = _ds_config(tmp_path, line)
    one_line_error(cli("diagnose", str(case), "--config", str(config)), "ds_config.json: _comment: ",
                   f"states no layout {where}")


def test_an_option_the_engine_cannot_run_is_blamed_on_the_option_not_the_files_header(tmp_path):
    """--recompute selective on the planner's own ds_config was refused as "ds_config.json: _comment:
    deepspeed cannot run it", blaming the header, which says recompute=none."""
    case, config = _ds_config(tmp_path)
    line = one_line_error(cli("diagnose", str(case), "--config", str(config), "--recompute", "selective"),
                          "error: --recompute: deepspeed cannot run it")
    assert "_comment" not in line
    with pytest.raises(CaseError) as refused:
        planner.diagnose(case, "deepspeed", config, recompute="selective")
    assert refused.value.key == "recompute" and "_comment" not in str(refused.value)


def test_a_data_parallel_size_the_header_sets_is_said_in_the_batch_refusal(tmp_path):
    """The header's "planned layout: pp=2" made dp 8, and the refusal read as the file's own arithmetic:
    "train_batch_size: 64 is not micro 1 × accumulation 4 × data-parallel 8 = 32"."""
    case, config = _ds_config(tmp_path, "planned layout: pp=2 recompute=none")
    one_line_error(cli("diagnose", str(case), "--config", str(config)), "ds_config.json: train_batch_size: ",
                   "data-parallel 8 = 16 GPUs / (tp 1 × pp 2); pp 2 from ds_config.json's _comment (planned layout: pp=2)")
    case, config = _ds_config(tmp_path)
    one_line_error(cli("diagnose", str(case), "--config", str(config), "--pp", "2"),
                   "ds_config.json: train_batch_size: ", "pp 2 from --pp")


HF_TRAINER_DS = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                 "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"},
                 "zero_optimization": {"stage": 2, "overlap_comm": True}, "optimizer": {"type": "AdamW"}}


@pytest.mark.parametrize("key", ["train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"])
def test_an_auto_the_trainer_does_not_fill_is_refused_as_such(tmp_path, key):
    """"AUTO" was taken for a micro-batch: "--micro-batch-size: 1 differs from ...'s
    train_micro_batch_size_per_gpu 'AUTO'", or "micro-batch AUTO x dp 16"."""
    case = write(tmp_path / "ds.yaml", yaml.safe_dump(DEEPSPEED_16))
    config = write(tmp_path / "ds_config.json", json.dumps({**HF_TRAINER_DS, key: "AUTO"}))
    for options in ((), ("--micro-batch-size", "1")):
        one_line_error(cli("diagnose", str(case), "--config", str(config), *options),
                       f"ds_config.json: {key}: expected an integer or \"auto\", got 'AUTO'")


def test_a_train_batch_beside_an_auto_accumulation_is_set_against_the_cases_batch(tmp_path):
    """train_batch_size 128 with the accumulation "auto" (filled from the case's 64) was refused as
    "128 is not micro 1 × accumulation 4 × data-parallel 16 = 64", the 4 being derived from 64."""
    case = write(tmp_path / "ds.yaml", yaml.safe_dump(DEEPSPEED_16))
    config = write(tmp_path / "ds_config.json", json.dumps({**HF_TRAINER_DS, "train_batch_size": 128}))
    line = one_line_error(cli("diagnose", str(case), "--config", str(config), "--micro-batch-size", "1"),
                          "ds_config.json: train_batch_size: 128 differs from the case's global batch 64")
    assert "is not micro" not in line


def test_a_key_merged_twice_into_a_list_item_is_named_with_its_index(tmp_path):
    """The duplicate-key walker dropped list indices: "cluster.options.gpu_hour_cost: given twice"."""
    case = write(tmp_path / "case.yaml", """\
model: {preset: llama3-8b}
cluster:
  options:
    - &h100 {gpu: h100-sxm-80gb, max_gpus: 64, gpu_hour_cost: 2.5}
    - &cheap {gpu_hour_cost: 1.0}
    - <<: [*h100, *cheap]
      gpu: b200
training: {global_batch_size: 512, seq_len: 4096, engine: megatron}
""")
    one_line_error(cli("plan", str(case)), "case.yaml: cluster.options[2].gpu_hour_cost: given twice")


@pytest.mark.parametrize("text, key", [
    ("model: {preset: llama3-8b, name: <<}\n", "model.name"),
    ("model: {preset: llama3-8b}\nlayout: {recompute_modules: [<<]}\n", "layout.recompute_modules[0]"),
])
def test_a_bare_merge_key_as_a_value_says_to_quote_it(tmp_path, text, key):
    """`name: <<` said "expected valid YAML: could not determine a constructor for the tag
    'tag:yaml.org,2002:merge'", naming neither the key nor the fix."""
    case = write(tmp_path / "case.yaml", text + "cluster: {gpu: h100-sxm-80gb, num_gpus: 8}\n"
                                                "training: {global_batch_size: 64, seq_len: 4096}\n")
    line = one_line_error(cli("estimate", str(case)), f"case.yaml: {key}: << is YAML's merge key", 'quote it ("<<")')
    assert "constructor" not in line


def test_experts_over_a_dense_preset_name_the_missing_top_k(tmp_path):
    """model: {preset: llama3-8b, num_experts: 8} said "model.moe_top_k: expected a positive integer, got 0",
    a 0 the case never gave."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({**CASE, "model": {"preset": "llama3-8b", "num_experts": 8}}))
    line = one_line_error(cli("estimate", str(case)), "case.yaml: model.moe_top_k: missing; required with num_experts 8",
                          "the preset is dense")
    assert "got 0" not in line


@pytest.mark.parametrize("none", [0, None])
def test_no_experts_over_a_moe_preset_makes_it_dense(tmp_path, none):
    """model: {preset: mixtral-8x7b, num_experts: 0} (or null, as an optional count reads) was refused as
    "model.moe_top_k: applies only to a mixture of experts", a key the case never wrote and no value of which
    it could write: the preset's expert keys go with its experts. One the case writes itself is still refused."""
    dense = write(tmp_path / "case.yaml", yaml.safe_dump({**CASE, "model": {"preset": "mixtral-8x7b",
                                                                            "num_experts": none}}))
    done = cli("estimate", str(dense), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"]["parameters"] == pytest.approx(7.24e9, rel=0.01)  # Mistral 7B
    written = write(tmp_path / "case.yaml", yaml.safe_dump(
        {**CASE, "model": {"preset": "mixtral-8x7b", "num_experts": 0, "moe_top_k": 2}}))
    one_line_error(cli("estimate", str(written)), "case.yaml: model.moe_top_k: applies only to a mixture of experts")


def test_any_mapping_is_a_mapping_to_the_api():
    """A layout given as types.MappingProxyType was refused, "expected a mapping, got mappingproxy": it is a
    collections.abc.Mapping, as a dict is."""
    import types

    case = copy.deepcopy(CASE)
    as_dict = planner.estimate(case)
    proxied = planner.estimate(types.MappingProxyType({**case, "layout": types.MappingProxyType(case["layout"])}))
    assert proxied.step_time_s == as_dict.step_time_s and proxied.job.layout == as_dict.job.layout


def test_a_null_engine_is_an_unset_one(tmp_path):
    """training.engine: ~ (or None in an API dict) was refused, "expected a string, got nothing": YAML users
    write null for unset. It is: search.target's engine, else any."""
    case = copy.deepcopy(CASE)
    case["training"]["engine"] = None
    assert planner.estimate(case).job.training.engine.name == "any"
    targeted = {**copy.deepcopy(case), "search": {"target": "megatron"}}
    assert planner.estimate(targeted).job.training.engine.name == "megatron"
    path = write(tmp_path / "case.yaml", yaml.safe_dump(case).replace("engine: null", "engine: ~"))
    assert "engine: ~" in path.read_text()
    done = cli("estimate", str(path))
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("flags, counted", [({"account_for_embedding_in_pipeline_split": True}, "embedding"),
                                            ({"account_for_loss_in_pipeline_split": True}, "loss")])
def test_a_pipeline_split_refusal_names_only_what_is_counted(tmp_path, flags, counted):
    """account_for_embedding_in_pipeline_split alone was refused as "num_layers 32 with the embedding and loss
    counted (33)": only the embedding is."""
    case = write(tmp_path / "case.yaml", yaml.safe_dump({**MEGATRON_16, "layout": {"pp": 2, **flags}}))
    one_line_error(cli("estimate", str(case)), f"case.yaml: layout.pp: num_layers 32 with the {counted} counted (33)")
    args = write(tmp_path / "args.txt", "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 "
                 "--micro-batch-size 1 --global-batch-size 64 --bf16 --use-distributed-optimizer "
                 f"--{next(iter(flags)).replace('_', '-')}\n")
    one_line_error(cli("diagnose", str(case), "--megatron-args", str(args)),
                   f"num_layers 32 with the {counted} counted (33)")


@pytest.mark.parametrize("text", ["", "# nothing yet\n"])
def test_an_empty_torchtitan_toml_is_no_job_file(tmp_path, text):
    """An empty .toml was read as an override list with no words, on torchtitan's defaults: "training.seq_len:
    absent ... differs from the case's", where a TOML holding only [model] is "not a torchtitan job file"."""
    case = write(tmp_path / "tt.yaml", yaml.safe_dump(
        {**MEGATRON_16, "training": {**MEGATRON_16["training"], "engine": "torchtitan"}}))
    job = write(tmp_path / "job.toml", text)
    line = one_line_error(cli("diagnose", str(case), "--torchtitan", str(job)), "job.toml: ",
                          "not a torchtitan job file")
    assert "seq_len" not in line


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "\n  \n"])
def test_an_empty_torchtitan_overrides_file_is_refused(tmp_path, text):
    """An empty overrides.txt was diagnosed on torchtitan's defaults, as an empty .toml was: for a case
    at those defaults' sequence (2,048) and batch it passed as a job of that layout (exit 0)."""
    case = write(tmp_path / "tt.yaml", yaml.safe_dump({
        "model": {"preset": "llama2-7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        "training": {"global_batch_size": 64, "seq_len": 2048, "engine": "torchtitan"}}))
    overrides = write(tmp_path / "overrides.txt", text)
    one_line_error(cli("diagnose", str(case), "--torchtitan", str(overrides)), "overrides.txt: ",
                   "holds no words (it is empty or only comments)")


def test_an_unknown_option_after_the_checkpoint_subcommand_is_named_as_unknown(tmp_path):
    """activation_checkpoint:selective then --activation_checkpoint.selective_ac_option 0 (0.2's option) said
    "the subcommand goes last"; moved before it, the option was refused again for another reason."""
    case = write(tmp_path / "tt.yaml", yaml.safe_dump(
        {**MEGATRON_16, "training": {**MEGATRON_16["training"], "engine": "torchtitan"}}))
    overrides = write(tmp_path / "overrides.txt", "--parallelism.data_parallel_shard_degree 16\n"
                      "--training.global_batch_size 64\n--training.seq_len 4096\n--training.local_batch_size 2\n"
                      "activation_checkpoint:selective\n--activation_checkpoint.selective_ac_option 0\n")
    line = one_line_error(cli("diagnose", str(case), "--torchtitan", str(overrides)),
                          "overrides.txt: --activation_checkpoint.selective_ac_option: activation_checkpoint:selective "
                          "in torchtitan 0.3.0 has no such option")
    assert "goes last" not in line


def test_anchors_live_under_x_keys_which_are_ignored(tmp_path):
    """A top-level anchor holder (defaults: &d {...}) was "defaults: unknown key", with nowhere documented to keep
    anchors: x- keys are ignored, as docker-compose's are; any other unknown top-level key says so."""
    text = ("{key}: &d {{global_batch_size: 64, seq_len: 4096}}\nmodel: {{preset: llama3-8b}}\n"
            "cluster: {{gpu: h100-sxm-80gb, num_gpus: 8}}\ntraining: {{<<: *d}}\nlayout: {{tp: 2, zero_stage: 1}}\n")
    done = cli("estimate", str(write(tmp_path / "case.yaml", text.format(key="x-defaults"))))
    assert done.returncode == 0, done.stderr
    one_line_error(cli("estimate", str(write(tmp_path / "case.yaml", text.format(key="defaults")))),
                   "case.yaml: defaults: unknown key", "a key starting with x-")
    sizing = yaml.safe_load(text.format(key="x-defaults"))
    assert planner.estimate(sizing).job.training.global_batch_size == 64  # the API's dict too
