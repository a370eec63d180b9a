"""The Python API inside a long-running service (an orchestration tool planning many jobs): errors
that cross process pools, a working directory that is gone, arguments checked as strictly as the
case file's, progress that finishes, and an import failure that says what failed."""

from __future__ import annotations

import os
from pathlib import Path
import pickle
import sys
import types

import pytest

import planner
from cost_models.spec_checks import SpecError

CASE = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        "training": {"global_batch_size": 64, "seq_len": 4096}}


def test_a_refusal_crosses_a_process_pool():
    """A CaseError (and a SpecError) could not be unpickled (its __init__ takes three parts, the
    pickle held one): one bad case broke every job of a ProcessPoolExecutor (BrokenProcessPool)."""
    with pytest.raises(planner.CaseError) as info:
        planner.plan({})
    again = pickle.loads(pickle.dumps(info.value))
    assert (type(again), str(again), again.source, again.key, again.expected) == \
        (planner.CaseError, str(info.value), info.value.source, info.value.key, info.value.expected)
    spec = pickle.loads(pickle.dumps(SpecError("Layout", "tp", "expected a positive integer, got 0")))
    assert (str(spec), spec.spec, spec.field) == ("Layout.tp: expected a positive integer, got 0", "Layout", "tp")


def test_a_figure_the_cost_models_refuse_in_the_advices_search_is_the_cases_error():
    """fp8 on an A100 with tp 2 pinned on one GPU: the advice's search (more GPUs) met the precision
    first and raised SpecError (a ValueError: a traceback and exit 1 from the CLI)."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 1},
            "training": {"global_batch_size": 8, "seq_len": 128, "precision": "fp8"}, "search": {"tp": 2}}
    with pytest.raises(planner.CaseError, match="training.precision: fp8 needs fp8 tensor cores"):
        planner.plan(case)


def test_a_dict_case_plans_where_the_working_directory_is_gone(tmp_path):
    """A dict case names no relative path, yet asked for the working directory: FileNotFoundError."""
    gone = tmp_path / "gone"
    gone.mkdir()
    here = os.getcwd()
    os.chdir(gone)
    try:
        gone.rmdir()
        assert planner.plan(CASE, top_k=0).best is not None
    finally:
        os.chdir(here)


@pytest.mark.parametrize("call, expected", [
    (lambda: planner.plan(CASE, fastest="no"), "plan: fastest: expected true or false, got str 'no'"),
    (lambda: planner.emit(planner.plan(CASE, engine="megatron", top_k=0), "megatron", "unused", source=5),
     "emit: source: expected a string, got int 5"),
])
def test_api_arguments_are_checked_as_the_case_files_are(call, expected):
    """fastest="no" (truthy) returned the raw optimum; a source of 5 was written in every file's header."""
    with pytest.raises(planner.CaseError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_the_api_targets_every_engine_a_case_can_name():
    """search.target and engine= took nanotron; target= refused it."""
    assert planner.plan(CASE, target="nanotron", top_k=0).best.job.training.engine.name == "nanotron"


def test_sizes_progress_reaches_its_total_on_the_front():
    """Without deadline or budget the sizes proven off the front unsearched were never reported: the
    last call said 8 of 10, and a progress bar stopped at 80 %."""
    calls = []
    planner.size({"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "max_gpus": 256},
                  "training": {"global_batch_size": 128, "seq_len": 4096}}, "1T",
                 progress=lambda done, total: calls.append((done, total)))
    assert calls[-1][0] == calls[-1][1] and all(d <= t for d, t in calls)


def test_an_api_name_whose_module_fails_to_load_says_why(monkeypatch):
    """A first call cut short by Ctrl-C can leave a dependency half-loaded; the failure then read
    "module 'planner' has no attribute 'plan'", on every later call."""
    monkeypatch.delitem(planner.__dict__, "size", raising=False)
    monkeypatch.setitem(sys.modules, "planner.size", types.ModuleType("planner.size"))
    with pytest.raises(ImportError, match="planner.size could not be loaded: module 'planner.size' has no "
                                          "attribute 'size'"):
        planner.size  # noqa: B018


def _deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("call", [
    lambda deep: planner.plan({**CASE, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": deep}}),
    lambda deep: planner.plan(CASE, top_k=deep),
    lambda deep: planner.size(CASE, deep),
    lambda deep: planner.size(CASE, "1T", deadline=deep),
    lambda deep: planner.calibrate_from_runs([{"id": "a", "num_gpus": deep}]),
])
def test_a_value_nested_past_pythons_recursion_limit_is_refused_by_name(call):
    """A list of a list ... a thousand deep, built in Python (json.loads refuses one so deep), raised a
    bare RecursionError from the repr the message quoted, where the docs promise a CaseError; and one
    list shared by another forty times over (2^40 elements to show) kept every call busy in that repr."""
    with pytest.raises(planner.CaseError, match=r"got (list )?\[\[\[\[\.\.\.\]\]\]\]"):
        call(_deep(1000))
    shared = [1]
    for _ in range(40):
        shared = [shared, shared]
    with pytest.raises(planner.CaseError, match=r"got (list )?\[\[\[\[\.\.\.\], \[\.\.\.\]\]"):
        call(shared)


def test_target_any_decides_between_the_engines_as_search_target_any_does():
    """target="any" planned plain PyTorch alone, where the case's search.target: any (and the docstring's
    "as search.target does") decides between the engines; a target beside another engine named the
    case's training.engine, which the caller never gave."""
    by_target = planner.plan(CASE, target="any", top_k=0)
    by_case = planner.plan({**CASE, "search": {"target": "any"}}, top_k=0)
    assert [name for name, _, _ in by_target.engines] == [name for name, _, _ in by_case.engines] \
        == ["megatron", "deepspeed", "torchtitan"]
    assert by_target.best.job.training.engine.name == by_case.best.job.training.engine.name
    with pytest.raises(planner.CaseError) as error:
        planner.plan(CASE, target="deepspeed", engine="megatron")
    assert (error.value.source, error.value.key) == ("plan", "target")
    with pytest.raises(planner.CaseError) as error:
        planner.plan({**CASE, "training": {**CASE["training"], "engine": "megatron"}}, target="any")
    assert error.value.key == "training.engine" and "target 'any'" in error.value.expected


@pytest.mark.parametrize("call, key", [
    (lambda big: planner.estimate({**CASE, "overheads": {"cuda_context": big},
                                   "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": 1}}),
     "overheads.cuda_context"),
    (lambda big: planner.plan({**CASE, "cluster": {**CASE["cluster"], "intra_node_bandwidth": big}}),
     "cluster.intra_node_bandwidth"),
    (lambda big: planner.plan(CASE, top_k=big), "top_k"),
    (lambda big: planner.size(CASE, big), "tokens"),
])
def test_an_integer_past_pythons_digit_limit_is_refused_by_name(call, key):
    """A 5,000-digit integer, built in Python (the YAML and JSON readers refuse one first), raised a bare
    ValueError ("Exceeds the limit (4300 digits) for integer string conversion") from the message
    that would quote it."""
    with pytest.raises(planner.CaseError) as error:
        call(10 ** 5000)
    assert error.value.key == key and "an integer of 16610 bits" in error.value.expected


def test_what_plan_does_not_read_is_said_to_the_api_as_to_the_cli():
    """The CLI says on stderr that plan ignores a layout section and does not read size's cluster keys;
    the API's Plan carried neither, so an orchestrator's user never learnt that their pins went unread."""
    case = {**CASE, "cluster": {**CASE["cluster"], "max_gpus": 64}, "layout": {"tp": 8}}
    p = planner.plan(case, top_k=0)
    assert [n.split(": ", 1)[1][:30] for n in p.notes] == ["plan chooses the layout and ig", "plan runs on cluster.num_gpus "]
    assert p.to_dict()["notes"] == list(p.notes) and planner.plan(CASE, top_k=0).notes == ()


def test_the_api_functions_run_in_a_process_pool():
    """A process pool pickles the function it maps: planner.plan was the package's wrapper under the
    submodule's name, which pickle found to be another object (PicklingError), so
    ``pool.map(planner.plan, cases)`` failed before any case ran."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    for name in ("plan", "estimate", "size", "emit", "read_config", "diagnose", "calibrate_from_runs",
                 "calibrate_from_logs"):
        function = getattr(planner, name)
        assert pickle.loads(pickle.dumps(function)) is function, name
    case = dict(CASE, search={"target": "megatron"})
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        (pooled,) = pool.map(planner.plan, [case])
    assert pooled.to_dict() == planner.plan(case).to_dict()


def test_the_types_the_api_returns_import_from_the_package():
    """The docs name Layout (read_config's), SizeChoice (Sizing.best's), Fit (the calibration's
    report) and NoFit (Plan.no_fit) as what the API hands back: an orchestration tool's isinstance
    checks and annotations import them from planner, as they do Plan and Estimate."""
    import typing

    from planner import Fit, Layout, NoFit, SizeChoice

    case = dict(CASE, layout={"tp": 2, "micro_batch_size": 1})
    assert isinstance(planner.estimate(case).job.layout, Layout)
    assert isinstance(planner.size(dict(CASE, search={"target": "megatron"}), "1e9", max_gpus=16).best, SizeChoice)
    assert planner.plan(dict(CASE, model={"preset": "llama3.1-405b"}, search={"target": "megatron"},
                             cluster={"gpu": "h100-sxm-80gb", "num_gpus": 1})).no_fit.__class__ is NoFit
    assert Fit.__module__ == "planner.learn"
    assert typing.get_type_hints(planner.diagnose)["return"] is planner.Diagnosis


def test_a_tuple_in_a_dict_case_is_the_list_the_schema_takes():
    """A case built in Python writes stage_layers=(16, 16) as readily as [16, 16]: it was refused as
    "expected a list of layer counts, got tuple"."""
    layout = {"tp": 2, "pp": 2, "micro_batch_size": 1}
    listed = planner.estimate(dict(CASE, layout=dict(layout, stage_layers=[12, 20])))
    tupled = planner.estimate(dict(CASE, layout=dict(layout, stage_layers=(12, 20))))
    assert tupled.to_dict() == listed.to_dict()


def test_an_api_caller_is_not_told_of_an_emitter_the_engine_lacks():
    """nanotron writes no launch files: its refusal named `--emit nanotron`, which the CLI refuses."""
    with pytest.raises(planner.CaseError) as info:
        planner.plan(dict(CASE, search={"target": "megatron"}), target="nanotron")
    assert "--emit" not in str(info.value) and "target='nanotron'" in str(info.value)


def test_an_infeasible_plans_differences_are_a_clear_error():
    """Plan.differences on a plan that found nothing raised a bare AssertionError."""
    infeasible = planner.plan(dict(CASE, model={"preset": "llama3.1-405b"}, search={"target": "megatron"},
                                   cluster={"gpu": "h100-sxm-80gb", "num_gpus": 1}))
    assert infeasible.best is None
    with pytest.raises(planner.CaseError, match="found no layout"):
        infeasible.differences(planner.estimate(dict(CASE, layout={"tp": 1})))


def test_a_tuple_shared_in_and_out_of_a_dict_case_is_a_list_in_it():
    """The conversion was remembered by the object alone: met outside a case first, a tuple was left a
    tuple inside one."""
    from planner.api_values import plain

    shared = (16, 16)
    assert plain((shared, {"stage_layers": shared})) == ((16, 16), {"stage_layers": [16, 16]})


def test_size_says_a_mixture_of_experts_is_sized_with_balanced_routing():
    """plan said model.moe_load_imbalance was unstated (priced as forced balancing runs); size, on the
    same case, said nothing, and its days are as optimistic."""
    case = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "h100-sxm-80gb", "max_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096}, "search": {"target": "megatron"}}
    assert any("moe_load_imbalance is unstated" in note for note in planner.size(case, "1T").notes)
    stated = {**case, "model": {"preset": "qwen3-30b-a3b", "moe_load_imbalance": 1.2}}
    assert not any("moe_load_imbalance" in note for note in planner.size(stated, "1T").notes)


def test_a_plan_pickled_in_one_process_keys_the_same_dicts_in_another(tmp_path):
    """A spec kept the hash it cached in the process that pickled it: Python salts string hashes per
    process, so in another its model spec equalled a fresh one but hashed otherwise, and every dict
    keyed by the one missed the other (a service passing plans between processes)."""
    import subprocess

    dump = tmp_path / "plan.pickle"
    made = ("import pickle, sys, planner; best = planner.plan(%r, top_k=0).best; hash(best.job.model); "
            "hash(best.job.cluster); open(sys.argv[1], 'wb').write(pickle.dumps(best))" % CASE)
    read = ("import pickle, sys; from planner.case import load_case; best = pickle.loads(open(sys.argv[1], 'rb').read()); "
            "case = load_case(%r); print(hash(best.job.model) == hash(case.model), "
            "{case.model: 1}.get(best.job.model), {case.cluster: 1}.get(best.job.cluster))" % CASE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", made, str(dump)], check=True, env={**env, "PYTHONHASHSEED": "1"})
    done = subprocess.run([sys.executable, "-c", read, str(dump)], check=True, capture_output=True, text=True,
                          env={**env, "PYTHONHASHSEED": "2"})
    assert done.stdout.split() == ["True", "1", "1"], done.stdout


def test_estimate_says_to_the_api_what_the_cli_says_on_stderr():
    """`estimate` says on stderr that a case naming no engine is priced as plain PyTorch runs it, and that a
    mixture of experts' unstated routing is priced as forced balancing; Plan and Sizing carried their
    notes, but the API's Estimate had none, so an orchestrator that estimated a plan's layout without its
    engine was never told why the figures moved."""
    layout = {"tp": 2, "micro_batch_size": 1}
    unset = planner.estimate({**CASE, "layout": layout})
    assert [n.split(": ", 1)[1][:36] for n in unset.notes] == ["training.engine is unset (or any): p"]
    named = planner.estimate({**CASE, "layout": layout, "training": {**CASE["training"], "engine": "megatron"}})
    assert named.notes == ()
    moe = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
           "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"},
           "layout": {"tp": 2, "ep": 8, "pp": 2, "micro_batch_size": 1, "sequence_parallel": True}}
    assert any("moe_load_imbalance is unstated" in n for n in planner.estimate(moe).notes)
    # the notes are beside the figures: the JSON (`estimate --json`'s) and equality are as before
    assert "notes" not in unset.to_dict()


@pytest.mark.parametrize("text", ["model: {preset: llama3-8b}", "model:\n  preset: llama3-8b\ncluster: {gpu: b200}\n" * 20,
                                  '{"model": {"preset": "llama3-8b"}}', "x" * 300])
def test_a_case_given_as_yaml_or_json_text_is_refused_as_text_not_as_a_missing_file(text):
    """A pipeline that reads its case from a config store hands over the text: it was taken for a path and
    refused as "model: {preset: llama3-8b}: file not found" (or, past 255 bytes, "cannot be read (File
    name too long)"), the whole text for the file's name and nothing of what the API takes."""
    for call in (planner.estimate, planner.plan, lambda case: planner.size(case, "1T")):
        with pytest.raises(planner.CaseError) as error:
            call(text)
        assert error.value.source == "<case>" and "yaml.safe_load" in error.value.expected
        assert "file not found" not in str(error.value) and "too long" not in str(error.value)
    with pytest.raises(planner.CaseError, match="file not found"):
        planner.estimate("no-such-case.yaml")  # a path that names no file is still that


def test_a_case_path_and_an_api_path_take_the_home_folder_as_the_shell_does(tmp_path, monkeypatch):
    """planner.estimate("~/case.yaml") was "~/case.yaml: file not found", where a shell hands the CLI
    $HOME's file: ~ is the home folder (os.path.expanduser) in a case's path, the CLI's given quoted
    and the API's other paths (emit's out_dir) alike."""
    import yaml

    from cli_in_process import run_cli

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "case.yaml").write_text(yaml.safe_dump({**CASE, "layout": {"tp": 1, "pp": 1, "micro_batch_size": 1}}))
    est = planner.estimate("~/case.yaml")
    assert est.to_dict() == planner.estimate(str(tmp_path / "case.yaml")).to_dict()
    done, direct = (run_cli("estimate", path, "--json") for path in ("~/case.yaml", str(tmp_path / "case.yaml")))
    assert (done.returncode, done.stdout) == (direct.returncode, direct.stdout) and "not found" not in done.stderr
    monkeypatch.chdir(tmp_path.parent)
    written = planner.emit(est, "megatron", "~/run", force_unfit=True).paths
    assert written and all(Path(p).parent == tmp_path / "run" for p in written)


def test_emit_of_a_size_choice_says_which_of_its_fields_to_write(tmp_path):
    """A Sizing handed to emit was told "(its best.estimate is one)"; its SizeChoice, the object a caller
    holds after picking sizing.best or an alternative, was refused with no word of its .estimate."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"options": [{"gpu": "h100-sxm-80gb", "max_gpus": 64}]},
            "training": {"global_batch_size": 64, "seq_len": 4096}, "search": {"target": "megatron"}}
    sizing = planner.size(case, "100B")
    with pytest.raises(planner.CaseError, match=r"got SizeChoice \(its estimate is one\)"):
        planner.emit(sizing.best, "megatron", tmp_path / "run")
    with pytest.raises(planner.CaseError, match=r"got Sizing \(its best.estimate is one\)"):
        planner.emit(sizing, "megatron", tmp_path / "run")
    assert planner.emit(sizing.best.estimate, "megatron", tmp_path / "run").paths


def test_the_package_says_its_version_as_the_cli_does():
    """An orchestrator records what planned its runs: `layout-planner --version` said it, but
    planner.__version__ raised AttributeError('__version__'), naming no module."""
    from importlib.metadata import version

    assert planner.__version__ == version("layout-planner")
    with pytest.raises(AttributeError, match="module 'planner' has no attribute '__nope__'"):
        planner.__nope__


def test_a_case_string_refused_as_text_shows_what_was_given():
    """A path holding ": " that names no file (a folder named for its run, "runs/lr: 3e-4/case.yaml") is
    refused as text, and the refusal named nothing of it: its author was told to parse YAML they never
    wrote, without the path that was missing."""
    for given, shown in (("runs/lr: 3e-4/case.yaml", "'runs/lr: 3e-4/case.yaml'"),
                         ("model: {preset: llama3-8b}", "'model: {preset: llama3-8b}'"),
                         ("model:\n  preset: llama3-8b\n" * 10, "'model:\\n  preset: llama3-8b\\nmodel:\\n  pres…' (270 characters)")):
        with pytest.raises(planner.CaseError) as error:
            planner.estimate(given)
        assert shown in error.value.expected and "\n" not in str(error.value), str(error.value)


def test_estimate_notes_carry_a_sequence_past_the_hf_configs_positions():
    """Estimate.notes (1fc76d7) is documented as what `estimate` says on stderr, and the note of a
    seq_len past the hf_config's max_position_embeddings (3f66b99) is one: the API's caller gets it too."""
    from pathlib import Path

    fixture = Path(__file__).parent / "fixtures" / "hf" / "Llama-2-7b-hf"
    est = planner.estimate({"model": {"hf_config": str(fixture)}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
                            "training": {"global_batch_size": 8, "seq_len": 8192, "engine": "megatron"},
                            "layout": {"tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 1}})
    assert any("max_position_embeddings" in note for note in est.notes), est.notes



class _PipelinePath(os.PathLike):
    """A pipeline's own path type: any os.PathLike is a path to the API (api_values.plain)."""

    def __fspath__(self) -> str:
        return "out"


@pytest.mark.parametrize("name, argument, value", [
    # As docs/commands.md's Python API says each is taken: a case as a path or a dict (any mapping,
    # made a dict by api_values.plain), a path as any os.PathLike, tokens as a number or "15.6T", and
    # stage_layers as a tuple or a list, as checked_options reads it.
    ("plan", "case", Path("case.yaml")), ("plan", "case", types.MappingProxyType({"model": {}})),
    ("plan", "tokens", "15.6T"), ("size", "tokens", 15e12), ("estimate", "case", Path("case.yaml")),
    ("emit", "out_dir", _PipelinePath()), ("read_config", "path", _PipelinePath()),
    ("read_config", "stage_layers", [16, 16]), ("diagnose", "stage_layers", [16, 16]),
    ("calibrate_from_logs", "logs", [Path("a.log"), "b.log"]), ("calibrate_from_logs", "cases", [{}, Path("c.yaml")]),
    ("calibrate_from_runs", "runs", [Path("runs.yaml"), {"id": "r"}]),
])
def test_the_public_functions_hints_take_what_the_functions_take(name, argument, value):
    """A hint narrower than what a function takes fails a caller's type checker on a documented call
    (out_dir: Union[str, Path] refused a pipeline's os.PathLike, stage_layers: tuple[int, ...] a list).
    Each documented value is checked against the hint as Python reads it at run time."""
    import typing

    typeguard = pytest.importorskip("typeguard")
    typeguard.check_type(value, typing.get_type_hints(getattr(planner, name))[argument])


def test_a_type_checker_sees_the_lazy_api_and_takes_numpy_numbers(tmp_path):
    """The API's names load on first use (planner/__init__.py), so mypy saw none of them: "Module has no
    attribute plan" on the documented `planner.plan(case)`, every result Any. A pandas sweep's np.int64
    is taken as the int it holds (api_values.plain), so the hints take it too. Run where mypy is
    installed (no dependency of the planner's)."""
    mypy = pytest.importorskip("mypy.api")
    script = tmp_path / "caller.py"
    script.write_text("""import os
from pathlib import Path
import numpy as np
import planner

case = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16}}
best: planner.Plan = planner.plan(Path("case.yaml"), top_k=np.int64(3), simplest_within=np.float64(5), tokens="15T")
sizing: planner.Sizing = planner.size(case, "15T", deadline="60d", max_gpus=np.int64(1024), gpu_hour_cost=2.5)
written: planner.Emitted = planner.emit(planner.estimate(case), "megatron", Path("out"), force=np.bool_(True))
layout: planner.Layout = planner.read_config(case, "megatron", "args.txt", pp=np.int64(2), stage_layers=[16, 16])
report: planner.Diagnosis = planner.diagnose(case, "megatron", Path("args.txt"), stage_layers=(16, 16))
logs: list[Path] = [Path("a.log")]
fit: planner.Fit = planner.calibrate_from_logs(logs, [case, "case.yaml"])[1]
planner.calibrate_from_runs(["runs.yaml", {"id": "r"}])
""")
    out, err, status = mypy.run(["--follow-imports=silent", "--ignore-missing-imports", "--no-incremental",
                                 "--cache-dir", str(tmp_path / "cache"), str(script)])
    assert status == 0, out + err


def test_an_emitters_refusal_names_the_apis_argument_not_the_clis_flag(tmp_path):
    """An engine's emitter refuses a layout its launcher cannot start: 12 GPUs on 8-GPU nodes start
    no torchrun that gives every node the same number of processes. The CLI says it of its flag
    (`--emit: megatron: …`); the API said the same, naming a flag its caller never gave, where every other
    refusal of emit names the argument as the call spells it (docs/commands.md, Python API)."""
    import yaml

    from cli_in_process import run_cli

    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 12},
            "training": {"global_batch_size": 48, "seq_len": 4096, "engine": "megatron"}}
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case))
    done = run_cli("plan", str(path), "--emit", "megatron", "--out", str(tmp_path / "cli"))
    said = "12 GPUs do not fill whole 8-GPU nodes: the plan was priced on 1 full node(s) and 4 GPU(s) of one more"
    assert done.returncode == 2 and done.stderr.startswith(f"error: --emit: megatron: {said}"), done.stderr
    with pytest.raises(planner.CaseError) as refused:
        planner.emit(planner.plan(path, top_k=0), "megatron", tmp_path / "api")
    assert (refused.value.source, refused.value.key) == ("emit", "engine")
    # The same words as the CLI's, after the call's own name for what was given.
    assert str(refused.value) == "emit: engine: megatron: " + done.stderr.strip()[len("error: --emit: megatron: "):]
    assert not (tmp_path / "api").exists()


def test_emit_of_a_plan_where_nothing_fits_names_its_own_argument(tmp_path):
    """Llama 3.1 405B on one 8-GPU node: no layout fits (its parameters alone overflow), so the plan has
    no best to write. emit said so as "plan: best: …", a call and an argument that were not the one
    made: its refusals name emit's own (``emit: result:``, as a layout that does not fit is)."""
    case = {"model": {"preset": "llama3.1-405b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 8, "seq_len": 4096, "engine": "megatron"}}
    nothing = planner.plan(case, top_k=0)
    assert (nothing.status, nothing.best) == ("INFEASIBLE", None)
    with pytest.raises(planner.CaseError) as refused:
        planner.emit(nothing, "megatron", tmp_path / "run")
    assert (refused.value.source, refused.value.key) == ("emit", "result")
    assert not (tmp_path / "run").exists()


def test_every_result_the_api_returns_compares_by_value_and_refuses_a_hash_by_its_name(tmp_path):
    """hash() of an Estimate raised "unhashable type: 'dict'" (the case's dicts, deep inside), while a
    plan where nothing fits hashed (its NoFit holds no dict): a set of plans worked for some cases and
    failed for others. Every result compares by value and is unhashable by its own name, Python's
    convention for values whose contents may change (a dict's, a list's); a Layout, a spec holding no
    mutable value, stays hashable."""
    import collections.abc
    import json

    case = dict(CASE, training=dict(CASE["training"], engine="megatron"), layout={"tp": 2, "micro_batch_size": 1})
    estimate = planner.estimate(case)
    assert estimate == planner.estimate(case)  # by value: another call's equal result
    nothing = planner.plan(dict(CASE, model={"preset": "llama3.1-405b"}, search={"target": "megatron"},
                                cluster={"gpu": "h100-sxm-80gb", "num_gpus": 1}), top_k=0)
    unfit = planner.estimate(dict(CASE, model={"preset": "llama3-70b"}, layout={"dp": 8, "micro_batch_size": 1}))
    from planner.team_runs import Run

    fit_report = planner.calibrate_from_runs(Run("a", case, estimate.tokens_per_s))[1]
    results = {"Estimate": estimate, "Plan": planner.plan(case, top_k=0), "NoFit": nothing.no_fit,
               "Remedy": unfit.remedy(), "Emitted": planner.emit(estimate, "megatron", tmp_path),
               "Sizing": planner.size(dict(CASE, search={"target": "megatron"}), "1e9", max_gpus=8),
               "Fit": fit_report}
    results["SizeChoice"] = results["Sizing"].best
    results["Diagnosis"] = planner.diagnose(case, "megatron", tmp_path / "megatron_args.txt")
    results["infeasible Plan"] = nothing
    for name, result in results.items():
        assert not isinstance(result, collections.abc.Hashable), name
        with pytest.raises(TypeError, match=f"unhashable type: '{name.split()[-1]}'"):
            hash(result)
        assert result == result, name
    layout = estimate.job.layout
    assert {layout: 1}[planner.estimate(case).job.layout] == 1
    # What a cache can key on instead: the result's JSON, equal for equal results.
    assert json.dumps(estimate.to_dict(), sort_keys=True) == json.dumps(planner.estimate(case).to_dict(), sort_keys=True)
