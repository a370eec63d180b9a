"""A new user's cases for the `nanotron` engine: what it cannot run is refused in one line that
says what it runs instead, and what it runs is priced as nanotron runs it (planner/engines/nanotron.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

import planner
from cli_in_process import run_cli
from planner.errors import CaseError

# The Ultra-Scale Playbook's 3B (nanotron's scripts/scaling_benchmarks.py), on one node at pp 8.
CASE = {"model": {"name": "playbook-3B", "num_layers": 28, "hidden_size": 3072, "num_attention_heads": 32,
                  "ffn_hidden_size": 8192, "activation": "swiglu", "vocab_size": 131072, "tied_embeddings": True},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "bf16", "engine": "nanotron"},
        "layout": {"dp": 1, "tp": 1, "pp": 8, "micro_batch_size": 1, "zero_stage": 0, "recompute": "none"}}


def case(training: dict = {}, layout: dict = {}, search: dict = None) -> dict:
    out = copy.deepcopy(CASE)
    out["training"].update(training)
    out["layout"].update(layout)
    if search is not None:
        out["search"] = search
    return out


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def one_line_error(done) -> str:
    """The CLI's refusal: exit 2, one line on stderr, nothing on stdout."""
    assert done.returncode == 2 and not done.stdout, (done.returncode, done.stdout)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


@pytest.mark.parametrize("precision, gpu", [("fp8", "h100-sxm-80gb"), ("nvfp4", "b200")])
def test_a_low_precision_is_refused_saying_what_runs_it(tmp_path, precision, gpu):
    """nanotron's engine module lists no low-precision recipe (``fp8_recipes=()``: the Playbook's
    sweep ran bf16). An fp8 case that left ``training.fp8_recipe`` unset was priced all the same
    (at 2x the bf16 GEMM peak, with a recipe nanotron does not have): it is refused, naming the
    precision, bf16, and the engines that run the recipes."""
    low = case({"precision": precision})
    low["cluster"]["gpu"] = gpu  # NVFP4's block-scaled tensor cores are Blackwell's
    with pytest.raises(CaseError) as refused:
        planner.estimate(low)
    assert refused.value.key == "training.precision"
    line = one_line_error(run_cli("estimate", str(write(tmp_path, low))))
    assert "training.precision: nanotron cannot run it" in line
    assert "bf16" in line and "megatron" in line
    # and plan never prices it either
    assert "training.precision: nanotron cannot run it" in one_line_error(run_cli("plan", str(write(tmp_path, low))))


@pytest.mark.parametrize("layout, key, instead", [
    # parallelism.recompute_layer recomputes every layer or none
    ({"recompute": "selective"}, "layout.recompute", "recompute full or none"),
    # nanotron's config has no offload: its optimizer shards with optimizer.zero_stage 1 alone
    ({"offload_optimizer": 1.0}, "layout.offload_optimizer", "zero_stage 1"),
    ({"pp": 1, "dp": 8, "offload_activations": 1}, "layout.offload_activations", "recompute full"),
    # its pipeline engines, OneForwardOneBackward and AllForwardAllBackward, have no virtual stages
    ({"vpp": 2}, "layout.vpp", "vpp 1"),
    # ParallelismArgs has dp, tp, pp (and expert_parallel_size) only
    ({"cp": 2, "pp": 4}, "layout.cp", "cp 1"),
])
def test_a_refusal_says_what_nanotron_runs_instead(tmp_path, layout, key, instead):
    """Each refusal ends in the choice nanotron offers (a selective recomputation was refused with
    "recomputes whole layers or none:" and nothing after the colon; an offload with "cannot offload
    the optimizer"), so the user can change the case and rerun."""
    line = one_line_error(run_cli("estimate", str(write(tmp_path, case(layout=layout)))))
    assert f"{key}: nanotron cannot run it: " in line and instead in line
    assert not line.endswith(":")


def test_emit_and_read_config_of_nanotron_say_the_planner_writes_and_reads_none(tmp_path):
    """nanotron has no emitter and no reader (``Engine.emitter``, ``Engine.reader`` unset): `--emit
    nanotron` was answered "expected one of deepspeed, megatron, torchtitan", as if the name were a
    typo of an engine it does not know. It is told that nanotron is priced, and where its layout is."""
    path = write(tmp_path, case())
    line = one_line_error(run_cli("plan", str(path), "--emit", "nanotron", "--out", str(tmp_path / "o")))
    assert "writes no files for it" in line and "plan --engine nanotron" in line
    assert not (tmp_path / "o").exists()
    with pytest.raises(CaseError, match="writes no files for it"):
        planner.emit(planner.estimate(case()), "nanotron", tmp_path / "o")
    with pytest.raises(CaseError, match="reads no nanotron config.*`estimate`"):
        planner.read_config(case(), "nanotron", tmp_path / "config.yaml")
    # a name the planner does not know at all is answered with the list alone
    assert one_line_error(run_cli("plan", str(path), "--emit", "slurm", "--out", str(tmp_path / "o"))).endswith(
        "expected one of deepspeed, megatron, torchtitan, got 'slurm'")


def test_a_split_stated_as_chunk_layers_is_priced_as_nanotron_cuts_it_and_said():
    """``chunk_layers`` sets ``stage_layers`` (without interleaving, the same split), so a case that
    stated the Playbook 3B's even split that way escaped the rule that nanotron cuts its own stages
    (``build_model``: four layers on each of the first seven ranks, the LM head alone on the last):
    it was priced at the stated split, a third slower, and said nothing. Now it prices as the case
    with no split, and the note names the key it gave."""
    even = [3, 4, 4, 4, 4, 3, 3, 3]
    stated, own = case(layout={"chunk_layers": even}), case()
    assert planner.estimate(stated).step_time_s == planner.estimate(own).step_time_s
    notes = planner.estimate(stated).notes
    assert any(f"layout.chunk_layers {even} is not a split nanotron runs" in n and "[4, 4, 4, 4, 4, 4, 4, 0]" in n
               for n in notes), notes
    # an engine that takes a split still runs the stated one
    assert planner.estimate(case({"engine": "any"}, {"chunk_layers": even})).step_time_s \
        > 1.3 * planner.estimate(own).step_time_s


def test_the_json_layout_is_the_split_nanotron_runs(tmp_path):
    """The report says "layers per stage 4×7, 0" (nanotron's ``build_model`` split of the 3B over 8
    ranks); `estimate --json`'s layout, "the layout as a case file gives it", said nothing of it for a
    case that stated none, and the stated split nanotron does not run for one that did. It now holds
    the split priced, which a later case may give back without a note."""
    own = [4] * 7 + [0]
    for layout in ({}, {"stage_layers": [3, 4, 4, 4, 4, 3, 3, 3]}, {"chunk_layers": [3, 4, 4, 4, 4, 3, 3, 3]}):
        done = run_cli("estimate", str(write(tmp_path, case(layout=layout))), "--json")
        assert done.returncode == 0, done.stderr
        section = json.loads(done.stdout)["layout"]
        assert section["stage_layers"] == own and "chunk_layers" not in section
        again = case(layout={"stage_layers": section["stage_layers"]})
        assert not planner.estimate(again).notes


@pytest.mark.parametrize("flag", ["account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"])
def test_megatrons_split_flags_are_refused_by_name(tmp_path, flag):
    """The account-for flags are Megatron's (--account-for-embedding-in-pipeline-split); nanotron has
    none, and cuts its stages by block cost. With 28 layers at pp 8 the flag was refused as "num_layers
    28 with the embedding counted (29) must divide by pp·vpp = 8", naming pp for a flag nanotron
    never reads; where the count divided (both flags, 30, at pp 2) it was ignored without a word
    (``partition.default_partition`` cuts nanotron's split first). It is refused by its own name."""
    line = one_line_error(run_cli("estimate", str(write(tmp_path, case(layout={flag: True})))))
    assert f"layout.{flag}: nanotron has no such flag" in line and "drop it" in line


@pytest.mark.parametrize("pin, instead", [({"cp": 2}, "cp 1"), ({"vpp": 2}, "vpp 1"),
                                          ({"zero_stage": 3}, "0 or 1"), ({"recompute": "selective"}, "full or none")])
def test_a_pin_nanotron_cannot_run_is_refused_with_its_reason(tmp_path, pin, instead):
    """A search section pinning what nanotron has not (``planner/engines/nanotron.py``) was answered
    "no nanotron layout of 8 GPUs ... meets the search section's cp, though some layout runs without
    them": no word of why. As `estimate` refuses the layout, `plan` refuses the pin, with nanotron's
    reason and what it runs instead (a pinned offload already was)."""
    data = case(search=pin)
    del data["layout"]
    key = next(iter(pin))
    line = one_line_error(run_cli("plan", str(write(tmp_path, data))))
    assert f"search.{key}: nanotron cannot run it: " in line and instead in line


def test_a_mixture_of_experts_is_refused_as_the_engine_module_says(tmp_path):
    """nanotron's engine module says "the planner prices no nanotron mixture of experts" (its fitted
    runs, the Playbook's sweep, are dense), but refused only ep > 1: Mixtral 8x7B at ep 1 was
    planned and priced "as nanotron runs it". The model is refused, naming the engines that run it."""
    moe = {"model": {"preset": "mixtral-8x7b", "moe_load_imbalance": 1}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
           "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "nanotron"}}
    for command in ("plan", "estimate"):
        data = moe if command == "plan" else {**moe, "layout": {"dp": 8, "tp": 8, "zero_stage": 1, "recompute": "full"}}
        line = one_line_error(run_cli(command, str(write(tmp_path, data))))
        assert "model.num_experts: nanotron cannot run it" in line and "megatron" in line


def test_fewer_micro_batches_than_the_1f1b_warm_up_needs_are_refused_as_nanotron_asserts():
    # nanotron's OneForwardOneBackwardPipelineEngine asserts nb_microbatches >= pp - 1
    # (parallel/pipeline_parallel/engine.py): at pp 8, 7 micro-batches run and 6 do not.
    runs = case(training={"global_batch_size": 7})
    assert planner.estimate(runs).job.layout.pp == 8
    with pytest.raises(CaseError) as refused:
        planner.estimate(case(training={"global_batch_size": 6}))
    assert refused.value.key == "layout.micro_batch_size"
    assert "at least pp - 1 = 7 micro-batches" in refused.value.expected and "got 6" in refused.value.expected


def test_plan_offers_no_pipeline_deeper_than_its_micro_batches_allow():
    # 6 sequences a step on 8 GPUs held to pp 8 by the search: it would need 7 micro-batches.
    held = {k: v for k, v in case(training={"global_batch_size": 6}, search={"pp": 8}).items() if k != "layout"}
    with pytest.raises(CaseError) as refused:
        planner.plan(held)
    assert refused.value.key == "search"
    assert planner.plan({**held, "search": {"pp": 4}}).best.job.layout.pp == 4
