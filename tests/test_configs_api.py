"""The library's config API (planner.emit, planner.read_config): what the CLI's `plan --emit` and
`diagnose` run, reachable from Python. A written config reads back as the layout it was
written for; what cannot be written is refused with the key, and nothing is left behind."""

from __future__ import annotations

import pytest

import planner
from planner.errors import CaseError

CASE = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
        "training": {"global_batch_size": 128, "seq_len": 4096}}


@pytest.mark.parametrize("engine, name, layout", [
    ("megatron", "megatron_args.txt", {"tp": 2, "pp": 2, "dp": 4, "micro_batch_size": 2, "zero_stage": 1,
                                       "sequence_parallel": True, "recompute": "selective",
                                       "recompute_modules": ["mlp"]}),
    ("deepspeed", "ds_config.json", {"tp": 1, "pp": 1, "dp": 16, "micro_batch_size": 2, "zero_stage": 2}),
])
def test_an_emitted_config_reads_back_as_its_layout(tmp_path, engine, name, layout):
    est = planner.estimate({**CASE, "training": {**CASE["training"], "engine": engine}, "layout": layout})
    written = planner.emit(est, engine, tmp_path)
    assert tmp_path / name in written.paths and all(p.exists() for p in written.paths)
    assert planner.read_config(CASE, engine, tmp_path / name, pp=est.job.layout.pp) == est.job.layout


def test_a_read_layout_is_a_case_files_layout_section(tmp_path):
    """read_config returned a bare Layout, with no way back to the case schema but field by field: its
    to_dict() is the section a case takes, estimated as the config it was read from, and plain JSON."""
    import json

    layout = {"tp": 2, "pp": 2, "dp": 4, "micro_batch_size": 2, "zero_stage": 1, "sequence_parallel": True,
              "recompute": "selective", "recompute_modules": ["mlp"]}
    training = {**CASE["training"], "engine": "megatron"}
    est = planner.estimate({**CASE, "training": training, "layout": layout})
    planner.emit(est, "megatron", tmp_path)
    section = json.loads(json.dumps(planner.read_config(CASE, "megatron", tmp_path / "megatron_args.txt").to_dict()))
    assert {k: section[k] for k in layout} == layout
    again = planner.estimate({**CASE, "training": training, "layout": section})
    assert again.step_time_s == est.step_time_s and again.peak.total == est.peak.total


def test_a_plans_best_layout_is_what_emit_writes(tmp_path):
    result = planner.plan({**CASE, "search": {"target": "megatron"}}, top_k=0)
    planner.emit(result, "megatron", tmp_path)
    assert planner.read_config(CASE, "megatron", tmp_path / "megatron_args.txt") == result.best.job.layout


def test_a_plans_best_layout_object_goes_back_into_a_case_to_estimate_a_variant():
    """A Plan's best carries its Layout (best.job.layout); put back into a case dict, as a caller
    estimating a variant of it would, it was refused ("layout: expected a mapping, got Layout"). It is
    its case-file section (to_dict()): the plan's own figures, as estimate of the best layout gives them
    (Llama 3 70B on 64 H100s, pp 4 with 20 virtual stages), and a variant's those of its section."""
    from dataclasses import replace

    case = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"}}
    best = planner.plan(case, top_k=0).best
    given = {**case, "layout": best.job.layout}
    again = planner.estimate(given)
    assert (again.step_time_s, again.peak.total, again.to_dict()) == \
        (best.step_time_s, best.peak.total, best.to_dict())
    assert given["layout"] is best.job.layout  # the caller's dict is not changed
    variant = replace(best.job.layout, micro_batch_size=2)
    by_section = planner.estimate({**case, "layout": {**best.to_dict()["layout"], "micro_batch_size": 2}})
    assert planner.estimate({**case, "layout": variant}).to_dict() == by_section.to_dict()
    # Read as any section is: a layout of 64 GPUs on 8 is the case's one-line error.
    with pytest.raises(CaseError, match=r"^<case>: layout"):
        planner.estimate({**case, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8}, "layout": best.job.layout})


def test_a_plans_best_gives_its_layout_as_a_remedy_does():
    """An Estimate had no .layout, where a Remedy has one: a caller reading a plan's best layout wrote
    plan.best.job.layout. plan.best.layout is that Layout, and put back into the case it estimates to the
    plan's own figures (Llama 2 7B on 16 H100s, Megatron-LM), as every estimate of the best layout does."""
    case = {**CASE, "training": {**CASE["training"], "engine": "megatron"}}
    best = planner.plan(case, top_k=0).best
    assert best.layout is best.job.layout
    again = planner.estimate({**case, "layout": best.layout})
    assert again.layout == best.layout
    assert (again.step_time_s, again.peak.total, again.to_dict()) == \
        (best.step_time_s, best.peak.total, best.to_dict())


def test_a_layout_that_leaves_etp_to_tp_goes_round_a_case_unchanged_and_its_json_states_etp():
    """A Layout of ep 8 leaving etp to its default went into a case with etp 2 stated and came back
    unequal to itself. It comes back equal, priced the same; the estimate's JSON still states the etp the
    experts run at, tp (megatron-core's arguments.py: expert_tensor_parallel_size None is
    tensor_model_parallel_size), as the launch files state it."""
    case = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"},
            "layout": {"tp": 2, "pp": 4, "ep": 8, "zero_stage": 1, "sequence_parallel": True, "recompute": "full"}}
    est = planner.estimate(case)
    assert est.layout.etp is None and est.to_dict()["layout"]["etp"] == 2
    again = planner.estimate({**case, "layout": est.layout})
    assert again.layout == est.layout
    assert again.to_dict() == est.to_dict()


def test_a_layout_timed_for_one_engine_is_not_written_for_another(tmp_path):
    est = planner.estimate({**CASE, "training": {**CASE["training"], "engine": "deepspeed"},
                            "layout": {"dp": 16, "micro_batch_size": 2, "zero_stage": 1}})
    with pytest.raises(CaseError, match="emit: engine: is megatron, but the layout was timed as deepspeed"):
        planner.emit(est, "megatron", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_layout_timed_as_plain_pytorch_is_written_with_the_engines_own_figures(tmp_path):
    """The example's selective recomputation, priced as plain PyTorch's (engine any), is no module
    Megatron-LM recomputes: the files carried no recompute flag under the plain figures (49.9 s,
    33.9 GB) and ran otherwise. Their header now quotes the layout as Megatron-LM runs it, the
    figures `diagnose` reads back from them."""
    plain = planner.estimate("examples/llama3-70b-h100.yaml")
    assert plain.job.training.engine.name == "any"
    planner.emit(plain, "megatron", tmp_path)
    import yaml
    case = yaml.safe_load(open("examples/llama3-70b-h100.yaml"))
    case["training"]["engine"] = "megatron"
    megatron = planner.estimate(case)
    assert abs(megatron.step_time_s / plain.step_time_s - 1) > 0.1  # the two engines' figures differ
    header = (tmp_path / "megatron_args.txt").read_text()
    assert f"predicted step time {megatron.step_time_s:.3f} s" in header
    assert f"predicted peak memory {megatron.peak.total / 1e9:.1f} GB" in header


def test_existing_files_are_kept_unless_forced(tmp_path):
    est = planner.estimate({**CASE, "layout": {"dp": 16, "micro_batch_size": 2}})
    (tmp_path / "megatron_args.txt").write_text("mine\n")
    with pytest.raises(CaseError, match="exists"):
        planner.emit(est, "megatron", tmp_path, force_unfit=True)
    assert (tmp_path / "megatron_args.txt").read_text() == "mine\n"
    planner.emit(est, "megatron", tmp_path, force=True, force_unfit=True)
    assert (tmp_path / "megatron_args.txt").read_text() != "mine\n"


def test_an_emission_gives_itself_as_json_with_its_engine_files_and_notes(tmp_path):
    """Emitted was the one result with no to_dict(): a job logging what it launched took its paths apart by
    hand, and was not told whose files they were. Its dict names the engine as the case file does (given
    "DeepSpeed"), each file emit wrote (those in the folder, no other) and the notes: DeepSpeed runs the
    caller's own train.py, and the earlier emission's Megatron-LM files that force took out."""
    import json

    est = planner.estimate({**CASE, "layout": {"dp": 16, "micro_batch_size": 2, "zero_stage": 1}})  # plain PyTorch
    megatron = planner.emit(est, "megatron", tmp_path)
    assert megatron.to_dict()["engine"] == "megatron"
    written = planner.emit(est, "DeepSpeed", tmp_path, force=True)
    report = json.loads(json.dumps(written.to_dict()))
    assert report["engine"] == "deepspeed" and list(report) == ["engine", "paths", "notes"]
    assert sorted(report["paths"]) == sorted(str(p) for p in tmp_path.iterdir()) == \
        sorted(str(tmp_path / name) for name in ("ds_config.json", "launch.sh", "sbatch.sh"))
    assert report["notes"] == list(written.notes)
    assert any("train.py" in note for note in report["notes"])
    assert any(note.startswith(f"removed {tmp_path / 'megatron_args.txt'}") for note in report["notes"])


def test_a_layout_that_does_not_fit_is_not_written_unless_asked_and_then_says_so(tmp_path):
    """169 GB a GPU on 80 GB H100s as plain PyTorch runs it, 148 GB as Megatron-LM does (the figure its
    files are written with): an orchestration tool would launch a job that dies at its first step."""
    est = planner.estimate({**CASE, "layout": {"dp": 16, "micro_batch_size": 2}})
    assert not est.fits
    with pytest.raises(CaseError, match=r"emit: result: the layout does not fit: its peak is 148.2 GB of 84.0 GB "
                                        r"usable, optimizer_states the largest term .*force_unfit=True"):
        planner.emit(est, "megatron", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    written = planner.emit(est, "megatron", tmp_path / "out", force_unfit=True)
    for path in written.paths:
        assert "predicted NOT TO FIT" in path.read_text()


@pytest.mark.parametrize("call, match", [
    (lambda p: planner.emit(planner.estimate({**CASE, "layout": {"dp": 16, "micro_batch_size": 2}}), "nemo", p),
     "emit: engine: expected one of deepspeed, megatron, torchtitan"),
    (lambda p: planner.read_config(CASE, "nanotron", p / "x.py"),
     "read_config: engine: expected one of deepspeed, megatron, torchtitan"),
])
def test_unknown_engines_name_the_choices(tmp_path, call, match):
    with pytest.raises(CaseError, match=match):
        call(tmp_path)


@pytest.mark.parametrize("case, layout", [
    # DeepSpeed-MoE's ep_size is the model code's (deepspeed.moe.layer.MoE): read back as 1, the
    # experts' weights priced unsharded (94 GB against the 43-86 GB planned)
    ({"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
      "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "deepspeed"}},
     {"dp": 64, "ep": 8, "micro_batch_size": 1, "zero_stage": 1}),
    # PipelineModule's partition is the model code's: 126 layers on 16 stages were refused
    # ("must divide by pp"), the case's own stage_layers unread
    ({"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 24},
      "training": {"global_batch_size": 48, "seq_len": 4096, "engine": "deepspeed"}},
     {"dp": 8, "pp": 3, "stage_layers": [11, 11, 10], "micro_batch_size": 1, "zero_stage": 1}),
])
def test_what_a_ds_config_leaves_to_the_model_code_is_read_from_the_cases_layout(tmp_path, case, layout):
    est = planner.estimate({**case, "layout": layout})
    planner.emit(est, "deepspeed", tmp_path)
    read = planner.read_config({**case, "layout": layout}, "deepspeed", tmp_path / "ds_config.json")
    assert read == est.job.layout


def test_emit_into_a_folder_with_its_files_names_the_apis_own_arguments(tmp_path):
    """planner.emit into a folder holding its files said "--out: exists; pass --force to overwrite":
    the CLI's spellings, where the caller gave out_dir and force."""
    est = planner.estimate({**CASE, "training": {**CASE["training"], "engine": "megatron"},
                            "layout": {"dp": 16, "micro_batch_size": 2, "zero_stage": 1}})
    planner.emit(est, "megatron", tmp_path)
    before = (tmp_path / "megatron_args.txt").read_text()
    with pytest.raises(CaseError) as error:
        planner.emit(est, "megatron", tmp_path)
    assert error.value.key == "out_dir" and error.value.expected == "exists; pass force=True to overwrite"
    assert (tmp_path / "megatron_args.txt").read_text() == before


def test_read_config_reads_the_config_as_its_engine_and_names_the_argument_it_contradicts(tmp_path):
    """read_config(case, "megatron", args, stage_layers=(20, 12)) on arguments that state no split:
    the case (naming no engine) was read as the generic engine, whose split balances compute, so the
    arguments were said to state 17,15 where Megatron-LM splits 32 layers 16,16 (as `diagnose` says);
    and the refusal named the CLI's --stage-layers, no key, where the caller gave an argument."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096}}
    args = tmp_path / "megatron_args.txt"
    args.write_text("--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 --micro-batch-size 1 "
                    "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
                    "--global-batch-size 64 --bf16\n")
    with pytest.raises(CaseError) as error:
        planner.read_config(case, "megatron", args, stage_layers=(20, 12))
    assert (error.value.source, error.value.key) == ("read_config", "stage_layers")
    assert error.value.expected.startswith("20,12 differs from the 16,16 megatron_args.txt states")
    assert planner.read_config(case, "megatron", args, stage_layers=(16, 16)).pp == 2


@pytest.mark.parametrize("engine", ["megatron", "deepspeed", "torchtitan"])
def test_every_engine_writes_the_files_plan_checks_before_it_plans(engine):
    """`plan --emit --out` checks EVERY_ENGINE_WRITES in the folder before the plan: each engine's files hold them."""
    from planner.configs import render
    from planner.emit import EVERY_ENGINE_WRITES

    result = planner.plan({**CASE, "search": {"target": engine}}, top_k=0)
    files, _ = render(result.best, engine, "case.yaml")
    assert set(EVERY_ENGINE_WRITES) <= set(files)


def ds_config(tmp_path, **zero):
    import json

    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"train_batch_size": 128, "train_micro_batch_size_per_gpu": 1,
                                "gradient_accumulation_steps": 8, "bf16": {"enabled": True},
                                "zero_optimization": {"stage": 2, **zero}}))
    return path


@pytest.mark.parametrize("zero, options, match", [
    ({"bogus_key": 1}, {}, r"zero_optimization.bogus_key: unknown key"),
    ({"reduce_bucket_size": -1}, {}, r"reduce_bucket_size"),
    ({}, {"ep": 2}, r"read_config: ep: expert parallelism needs a mixture of experts"),
])
def test_read_config_refuses_what_diagnose_refuses(tmp_path, zero, options, match):
    """read_config read what `diagnose` reads but none of its refusals: a key DeepSpeed does not take,
    a bucket of -1 bytes, expert parallelism on a dense model (named as the call's argument) each
    gave a layout where the CLI exits 2."""
    from planner.cli import app
    from typer.testing import CliRunner

    path = ds_config(tmp_path, **zero)
    with pytest.raises(CaseError, match=match):
        planner.read_config(CASE, "deepspeed", path, **options)
    case = tmp_path / "case.yaml"
    import yaml
    case.write_text(yaml.safe_dump(CASE))
    flags = [word for key, value in options.items() for word in (f"--{key}", str(value))]
    result = CliRunner().invoke(app, ["diagnose", str(case), "--config", str(path), *flags])
    assert result.exit_code == 2


@pytest.mark.parametrize("options, match", [
    ({"pp": 0}, r"read_config: pp: expected an integer >= 1, got int 0"),
    ({"pp": "2"}, r"read_config: pp: expected an integer, got str '2'"),
    ({"micro_batch_size": 2}, r"read_config: micro_batch_size: 2 differs from .*ds_config.json's "
                              r"train_micro_batch_size_per_gpu 1"),
    ({"pp": 3}, r"read_config: pp: tp 1 x pp 3 = 3 must divide the cluster's 16 GPUs"),
    ({"pp": 2, "stage_layers": (10, 10)}, r"read_config: stage_layers: 2 stages of 20 layers; expected pp = 2 "
                                          r"stages holding the model's 32 layers"),
])
def test_read_configs_errors_name_its_own_arguments(tmp_path, options, match):
    """A pp of 0 divided by zero, a pp of "2" compared a str with an int (raw exceptions), and the
    DeepSpeed reader named the CLI's --micro-batch-size, --stage-layers, and for a pp that does not
    divide the GPUs the file's tensor_parallel.autotp_size, which it does not hold."""
    path = ds_config(tmp_path)
    if "stage_layers" in options:  # a pipeline's data-parallel size: 16 / 2, the batch 128 = 1 × 16 × 8
        import json
        config = json.loads(path.read_text())
        path.write_text(json.dumps({**config, "gradient_accumulation_steps": 16, "zero_optimization": {"stage": 1}}))
    with pytest.raises(CaseError, match=match):
        planner.read_config(CASE, "deepspeed", path, **options)


def test_a_pipeline_that_does_not_divide_the_gpus_is_refused_before_auto_batch_values_are_filled(tmp_path):
    """With the batch values "auto" (the HF Trainer's), pp 3 on 16 GPUs was told "gradient_accumulation_steps:
    is "auto", but the case's global batch 128 is not a multiple of micro-batch 2 x dp 5": the accumulation
    was filled from a data-parallel size that 3 stages leave no whole one of. The degrees are refused first,
    naming the option that set them, by diagnose and read_config alike."""
    import json

    import yaml
    from planner.cli import app
    from typer.testing import CliRunner

    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                                "gradient_accumulation_steps": "auto", "bf16": {"enabled": True},
                                "zero_optimization": {"stage": 1}}))
    with pytest.raises(CaseError, match=r"read_config: pp: tp 1 x pp 3 = 3 must divide the cluster's 16 GPUs"):
        planner.read_config(CASE, "deepspeed", path, pp=3, micro_batch_size=2)
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump(CASE))
    result = CliRunner().invoke(app, ["diagnose", str(case), "--config", str(path), "--pp", "3",
                                      "--micro-batch-size", "2"])
    assert result.exit_code == 2 and "--pp: tp 1 x pp 3 = 3 must divide the cluster's 16 GPUs" in result.output


def test_emit_refuses_a_nul_in_its_folder_and_a_sizing_by_name(tmp_path):
    """A NUL byte in out_dir raised the OS's ValueError from inside the writer; a Sizing (which has a
    best) was said to be a plan where nothing fits."""
    result = planner.plan({**CASE, "search": {"target": "megatron"}}, top_k=0)
    with pytest.raises(CaseError, match="emit: out_dir: expected a path, got one holding a NUL byte"):
        planner.emit(result, "megatron", str(tmp_path / "a\0b"))
    sizing = planner.size({**CASE, "search": {"target": "megatron"}}, "1B")
    assert sizing.best is not None
    with pytest.raises(CaseError, match=r"emit: result: expected a Plan or an Estimate, got Sizing \(its "
                                        r"best.estimate is one\)"):
        planner.emit(sizing, "megatron", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_numpy_scalars_and_paths_are_taken_as_the_values_they_hold(tmp_path):
    """An orchestration job's sweep gives numpy integers (pandas' iterrows) and pathlib paths: np.int64(2)
    as a tp was refused ("expected an integer, got int64"), as were a Path hf_config and a top_k, tokens
    or pp of numpy's, where np.float64 passed (it subclasses float). The caller's dict is left as it was."""
    import json
    from pathlib import Path

    np = pytest.importorskip("numpy")
    plain = {**CASE, "layout": {"tp": 2, "pp": 2, "dp": 4, "micro_batch_size": 2, "sequence_parallel": True}}
    hf = Path(__file__).parent / "fixtures" / "hf" / "Llama-2-7b-hf"
    numpy_case = {"model": {"hf_config": hf},
                  "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": np.int64(16)},
                  "training": {"global_batch_size": np.int32(128), "seq_len": np.int64(4096),
                               "flash_attention": np.bool_(True)},
                  "layout": {"tp": np.int64(2), "pp": np.int64(2), "dp": np.int64(4),
                             "micro_batch_size": np.int64(2), "sequence_parallel": np.bool_(True)}}
    before = repr(numpy_case)
    assert planner.estimate(numpy_case).step_time_s == planner.estimate(
        {**plain, "model": {"hf_config": str(hf)}, "training": {**CASE["training"], "flash_attention": True}}).step_time_s
    assert repr(numpy_case) == before
    assert len(planner.plan(CASE, top_k=np.int64(2)).alternatives) <= 2
    assert planner.size(CASE, np.int64(10**11), deadline="30d").best is not None
    est = planner.estimate({**CASE, "training": {**CASE["training"], "engine": "megatron"}, "layout": plain["layout"]})
    planner.emit(est, "megatron", tmp_path, source=Path("sweep.yaml"))
    assert planner.read_config(CASE, "megatron", tmp_path / "megatron_args.txt", pp=np.int64(2)) == est.job.layout
    json.dumps(planner.estimate(numpy_case).to_dict(), allow_nan=False)


def _json_types(value) -> set[str]:
    """The type names in ``value``, as json.loads gives a document's: dict, list, str, int, float, bool, None."""
    if type(value) is dict:
        return {"dict"}.union(*(_json_types(k) | _json_types(v) for k, v in value.items()))
    if type(value) is list:
        return {"list"}.union(*(_json_types(v) for v in value))
    return {type(value).__name__}


def test_a_subclass_of_int_or_str_in_a_dict_case_is_the_plain_value_it_holds():
    """A sweep's string column as a numpy array gives numpy's str_, and a scheduler's own IntEnum is an int:
    both passed the readers' isinstance checks and came back in to_dict()'s layout as given (numpy.str_,
    the IntEnum), where the docs promise plain JSON types, the CLI's --json as json.loads reads it."""
    import enum
    import json

    np = pytest.importorskip("numpy")

    class ZeroStage(enum.IntEnum):
        OPTIMIZER = 1

    recompute = np.array(["selective", "full"])[0]
    assert type(recompute) is np.str_ and isinstance(recompute, str)
    layout = {"tp": 2, "pp": 2, "dp": 4, "micro_batch_size": 2, "zero_stage": ZeroStage.OPTIMIZER,
              "recompute": recompute}
    case = {**CASE, "training": {**CASE["training"], "engine": "megatron"}, "layout": layout}
    given = planner.estimate(case).to_dict()
    assert given["layout"]["zero_stage"] == 1 and given["layout"]["recompute"] == "selective"
    assert _json_types(given) <= {"dict", "list", "str", "int", "float", "bool", "NoneType"}
    assert given == json.loads(json.dumps(given, allow_nan=False))
    assert type(layout["zero_stage"]) is ZeroStage and type(layout["recompute"]) is np.str_  # the caller's, as given


def test_the_python_api_diagnoses_a_config_with_the_notes_diagnose_prints(tmp_path):
    """read_config gave a DeepSpeed file's layout bare, recomputation read as none where the plan recomputed,
    with nothing to say so; planner.diagnose gives what `diagnose --json` prints, its notes included."""
    import json

    case = {**CASE, "model": {"preset": "llama2-13b"}, "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 8}}
    est = planner.estimate({**case, "training": {**case["training"], "engine": "deepspeed"},
                            "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": 3, "recompute": "full"}})
    planner.emit(est, "deepspeed", tmp_path)
    diagnosed = planner.diagnose(case, "deepspeed", tmp_path / "ds_config.json", recompute="full")
    assert diagnosed.estimate.job.layout == est.job.layout
    # Its own header says it was planned recomputing every layer (no ds_config key can); without the
    # header, nothing says so: read as none, and noted.
    own = planner.diagnose(case, "deepspeed", tmp_path / "ds_config.json")
    assert own.estimate.job.layout == est.job.layout and any("written by layout-planner" in n for n in own.notes)
    config = json.loads((tmp_path / "ds_config.json").read_text())
    del config["_comment"]
    (tmp_path / "ds_config.json").write_text(json.dumps(config))
    unsaid = planner.diagnose(case, "deepspeed", tmp_path / "ds_config.json")
    assert unsaid.estimate.job.layout.recompute == "none"
    assert any("does not state the recomputation" in note for note in unsaid.notes)
    json.dumps(unsaid.to_dict(), allow_nan=False)
    with pytest.raises(CaseError) as refused:
        planner.diagnose(case, "deepspeed", tmp_path / "ds_config.json", pp=0)
    assert (refused.value.source, refused.value.key) == ("diagnose", "pp")


def test_a_submodule_is_reached_from_the_package_as_the_docs_write_it():
    """docs/calibration.md writes planner.learn.render(profile): after `import planner` alone it raised
    AttributeError (module 'planner' has no attribute 'learn')."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import planner; print(planner.learn.render.__name__); "
                          "print(hasattr(planner, 'no_such_module'))"], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["render", "False"]


def test_values_that_hold_no_number_or_path_are_refused_by_name(tmp_path):
    """What api_values leaves for the readers is refused by name: a path whose __fspath__ raises (it escaped
    as its RuntimeError), an array or a dict where a choice is asked for (unhashable, or "truth value
    ambiguous", from deep inside), a one-element array taken as the recomputation itself, and numpy's
    dates and durations, whose item() in nanoseconds is an int: taken as a tp of 2 or 10^12 tokens."""
    import os

    np = pytest.importorskip("numpy")

    class Broken(os.PathLike):
        def __fspath__(self):
            raise RuntimeError("boom")

    est = planner.estimate({**CASE, "training": {**CASE["training"], "engine": "deepspeed"},
                            "layout": {"dp": 16, "micro_batch_size": 2, "zero_stage": 2}})
    planner.emit(est, "deepspeed", tmp_path)
    config = tmp_path / "ds_config.json"
    refused = [
        (lambda: planner.read_config(CASE, "deepspeed", Broken()), ("read_config", "path")),
        (lambda: planner.read_config(CASE, np.array(["deepspeed", "megatron"]), config), ("read_config", "engine")),
        (lambda: planner.diagnose(CASE, np.array(["deepspeed"]), config), ("diagnose", "engine")),
        (lambda: planner.read_config(CASE, "deepspeed", config, recompute=np.array(["full"])),
         ("read_config", "recompute")),
        (lambda: planner.emit(est, np.array(["deepspeed"]), tmp_path / "x"), ("emit", "engine")),
        (lambda: planner.plan(CASE, target=np.array(["megatron"])), ("plan", "target")),
        (lambda: planner.estimate({**CASE, "layout": {"tp": np.datetime64(2, "ns")}}), ("<case>", "layout.tp")),
        (lambda: planner.size(CASE, np.timedelta64(10**12, "ns")), ("size", "tokens")),
    ]
    for call, (source, key) in refused:
        with pytest.raises(CaseError) as error:
            call()
        assert (error.value.source, error.value.key) == (source, key), str(error.value)


def test_a_deepspeed_moe_plan_without_expert_parallelism_reads_back_as_planned(tmp_path):
    """DeepSpeed-MoE splits its experts over the tensor-parallel ranks (etp = tp, as the search writes it):
    its ds_config read back with etp unsaid, so diagnose of the plan's own files advised "change: ep 1→1,
    etp 1→4" where nothing differed."""
    case = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096}, "search": {"ep": 1}}
    best = planner.plan(case, engine="deepspeed", top_k=0).best
    assert best.job.layout.ep == 1 and best.job.layout.etp == best.job.layout.tp
    planner.emit(best, "deepspeed", tmp_path)
    lay = best.job.layout
    diagnosed = planner.diagnose(case, "deepspeed", tmp_path / "ds_config.json", pp=lay.pp, tp=lay.tp,
                                 recompute=lay.recompute, stage_layers=lay.stage_layers)
    assert diagnosed.estimate.job.layout.expert_tp == lay.expert_tp
    assert diagnosed.plan.differences(diagnosed.estimate) == {}
