"""Launch configs as a library: an engine's files for a plan or an estimate, written all or
none, and a team's existing config read back into a layout. `plan --emit` and `diagnose` call
these; so can an orchestration tool.

    result = planner.plan("case.yaml", engine="megatron")
    written = planner.emit(result, "megatron", "out/")
    layout = planner.read_config("case.yaml", "megatron", "out/megatron_args.txt")
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Union

from cost_models.placement import stage_layers as stage_layers_of
from cost_models.specs import RECOMPUTE, Layout

# planner.emit is imported here, before planner/__init__ binds planner.emit to the function below:
# imported later, the package would take the name.
from .emit import ENGINES as EMITTERS
from .api_values import BoolArg, CaseArg, IntArg, PathArg, StageLayersArg
from .engines import ENGINES
from .engines import READING as READERS
from .errors import CaseError, api_argument, cli_flag
from .fields import canonical_choice, read_bool, read_int, read_path, read_str
from .case import Case, spec_errors
from .diagnose import Diagnosis
from .estimate import Estimate, estimate_job
from .plan import Plan  # loaded already, by .diagnose: named here for emit's hint
from .search_options import retarget


@dataclass(frozen=True)
class Emitted:
    """The files an emitter wrote, and what the user must know about them."""

    # Compared by value, never hashed, as every result the API returns (docs/commands.md, Python API): most
    # hold dicts, which may change after hashing; hash() names the type rather than failing on a dict inside.
    __hash__ = None  # type: ignore[assignment]

    paths: tuple[Path, ...]
    notes: tuple[str, ...]
    engine: str  # whose files they are, as the case file names it ("megatron" for "Megatron")

    def to_dict(self) -> dict[str, Any]:
        """The emission as plain JSON types, as every other result gives itself (`plan --emit --json` prints
        the plan, not the files: its notes carry these ``notes``): the engine, each file written (its path
        as ``out_dir`` was given, joined with the file's name) and what the user must know of them."""
        return {"engine": self.engine, "paths": [str(path) for path in self.paths], "notes": list(self.notes)}


def unwritten_engine(engine: Any, kinds: tuple[str, ...], reading: bool = False) -> str:
    """What an engine name outside ``kinds`` (those the planner writes files for, or reads configs
    of, with ``reading``) was expected to be. An engine the planner prices but writes no files for
    (nanotron, plain PyTorch) was answered with the list alone, as if its name were a typo: it is
    told what the planner does for it instead."""
    text = f"expected one of {', '.join(kinds)}, got {engine!r}"
    if not isinstance(engine, str) or engine not in ENGINES:
        return text
    title = ENGINES[engine].title or engine
    if reading:
        return (f"{text}: the planner reads no {title} config; state the layout it runs in the case's layout "
                f"section (training.engine {engine}) and run `estimate` on it")
    return (f"{text}: the planner prices {title} but writes no files for it; `plan --engine {engine}` "
            f"(the API's engine={engine!r}) prints the layout to set in {title}'s config by hand")


def _estimate_of(result: Any) -> Estimate:
    """The layout to write: an Estimate as it is, a Plan's best (a plan where nothing fits has none)."""
    if isinstance(result, Estimate):
        return result
    best = getattr(result, "best", None)
    if isinstance(best, Estimate):
        return best
    from .plan import Plan

    if isinstance(result, Plan):
        raise CaseError("emit", "result", f"a Plan whose status is {result.status}: nothing fits, so there is no "
                                          "layout to write (its no_fit says why)")
    # A Sizing's best (a SizeChoice) holds the layout's estimate, but which of its choices to write is the caller's.
    hint = (" (its best.estimate is one)" if isinstance(getattr(getattr(result, "best", None), "estimate", None), Estimate)
            else " (its estimate is one)" if isinstance(getattr(result, "estimate", None), Estimate) else "")
    raise CaseError("emit", "result", f"expected a Plan or an Estimate, got {type(result).__name__}{hint}")


def render(result: Any, engine: str, source: Optional[str] = None,
           force_unfit: bool = False) -> tuple[dict[str, str], list[str]]:
    """The engine's files for the result's layout ({name relative to the folder: text}) and the
    notes that go with them; ``source`` names the case in every file's provenance header (by default
    the case file the result was planned from, else "the Python API" for a case given as a dict). A layout
    predicted not to fit is refused, naming the term that overflows, unless ``force_unfit``: then
    every file's header says so."""
    from .emit import provenance

    engine = canonical_choice(engine, tuple(ENGINES))  # "Megatron" is megatron, as a case's training.engine
    if not isinstance(engine, str) or engine not in EMITTERS:
        raise CaseError("emit", "engine", unwritten_engine(engine, EMITTERS))
    estimate = _estimate_of(result)
    planned_for = estimate.job.training.engine.name
    if planned_for not in ("any", engine):
        raise CaseError("emit", "engine", f"is {engine}, but the layout was timed as {planned_for} runs it; "
                                          f"plan with engine={engine!r} to write {engine}'s configs")
    if planned_for != engine:
        estimate = as_engine_runs_it(estimate, engine)
    if not estimate.fits and not force_unfit:
        term = estimate.largest_term
        raise CaseError("emit", "result", f"the layout does not fit: its peak is {estimate.peak.total / 1e9:.1f} GB "
                                          f"of {estimate.usable_bytes / 1e9:.1f} GB usable, {term} the largest term "
                                          f"({estimate.peak.by_term()[term] / 1e9:.1f} GB); pass force_unfit=True to "
                                          "write it anyway")
    module = ENGINES[engine].emit_module()
    if source is None:
        case_source = getattr(getattr(estimate, "case", None), "source", "<case>")
        source = case_source if case_source != "<case>" else "the Python API"
    files = module.render(estimate, provenance(estimate, source))
    notes = module.warnings(estimate) if hasattr(module, "warnings") else []
    return files, notes


def as_engine_runs_it(estimate: Estimate, engine: str) -> Estimate:
    """A layout timed as plain PyTorch (engine ``any``) timed again as ``engine`` runs it, for that
    engine's files: their header quotes what the files will run at, as `diagnose` reads them back
    (Llama 3 70B's selective recomputation, priced as plain PyTorch's, is no module Megatron-LM
    recomputes: its files carried no recompute flag under the plain figures, 49.9 s and 33.9 GB,
    and run at 39.1 s and 44.9 GB). A layout the engine cannot run is the case's error."""
    case = estimate.case
    search, training = retarget(case.source, case.search, case.training, engine)
    retimed = replace(case, training=training, search=search)
    with spec_errors(case.source):
        job = replace(estimate.job, training=training)
    return estimate_job(retimed, job)


def emit(result: Union[Plan, Estimate], engine: str, out_dir: PathArg, *, source: Optional[str] = None,
         force: BoolArg = False, force_unfit: BoolArg = False) -> Emitted:
    """Write the engine's launch files for ``result`` (a Plan's best layout, or an Estimate) into
    ``out_dir``, all or none (:func:`planner.files.write_all`); existing files only with ``force``;
    a layout predicted not to fit only with ``force_unfit``, said in every file's header."""
    from .emit import earlier_emission_finder
    from .files import Output, write_all

    force = read_bool("emit", "force", force)  # "no" is truthy: it overwrote the user's files
    force_unfit = read_bool("emit", "force_unfit", force_unfit)
    if source is not None:  # written into every file's header: a 5 there named no case
        read_str("emit", "source", source)
    out = read_path("emit", "out_dir", out_dir)
    engine = canonical_choice(engine, tuple(ENGINES))  # named as render names it: "Megatron" is megatron
    try:
        files, notes = render(result, engine, source, force_unfit)
    except CaseError as error:
        raise _as_the_apis(error) from None
    removed: list[Path] = []
    committed = [False]
    outputs = [Output(out / name, text, "out_dir", "force=True") for name, text in files.items()]
    paths = [output.path for output in outputs]
    try:
        written = write_all(outputs, force, removes=earlier_emission_finder(out, files, removed) if force else (),
                            committed=committed)
        emitted = Emitted(tuple(written), tuple(notes) + tuple(removed_notes(removed)), engine)
    except BaseException as error:
        # An interrupt before the files were in place leaves none of them (write_all puts back what it moved).
        # One after (in write_all's clean-up, or here) cannot undo them, and the CLI's way, ignoring it, is no
        # library's: it is raised saying what is written, which the caller was never handed as an Emitted.
        if committed[0]:
            error.add_note(interrupted_after(paths, removed))
        raise
    return emitted  # bound inside the try: an interrupt as Emitted(...) returns is still told of the files


def _as_the_apis(error: CaseError) -> CaseError:
    """An emitter's refusal as the API says it: the emitters name the CLI's flag (``--emit: megatron: 12
    GPUs do not fill whole 8-GPU nodes …``, ``plan with --engine megatron``), which an API caller never
    gave; here the call and its argument (``emit: engine: megatron: …``, ``engine='megatron'``), as every
    other refusal of emit names them. Any other error is the case's or the argument's already."""
    if error.source != "--emit":
        return error
    engine = error.key
    expected = error.expected.replace(f"plan with --engine {engine}", f"plan with engine={engine!r}")
    return CaseError("emit", "engine", f"{engine}: {expected}")


def interrupted_after(paths: list[Path], removed: list[Path]) -> str:
    """What an interrupt raised after emit's files were in place says of them."""
    took = f"; removed {', '.join(str(p) for p in removed)}" if removed else ""
    return f"planner.emit had written all its files when interrupted: {', '.join(str(p) for p in paths)}{took}"


def removed_notes(removed: list[Path]) -> list[str]:
    """What --force took out of the folder besides the files it overwrote."""
    return [f"removed {path}: an earlier emission's file (its header says layout-planner wrote it), which "
            "this plan's files replace" for path in removed]


def read_config(case: CaseArg, engine: str, path: PathArg, pp: Optional[IntArg] = None, tp: Optional[IntArg] = None,
                micro_batch_size: Optional[IntArg] = None, recompute: Optional[str] = None,
                ep: Optional[IntArg] = None, stage_layers: Optional[StageLayersArg] = None) -> Layout:
    """The layout of an existing config: a DeepSpeed ds_config.json (``pp`` and ``tp`` say what it
    does not: the pipeline stages, and tensor parallelism in a Megatron-DeepSpeed pipeline) or a
    Megatron-LM argument list or launch script. Contradictions with the case are a CaseError
    naming the file and key; an argument the config contradicts, a CaseError naming it
    (``read_config``, the argument)."""
    from .diagnose import read_job

    engine = canonical_choice(engine, tuple(ENGINES))  # "DeepSpeed" is deepspeed, as a case's training.engine
    if not isinstance(engine, str) or engine not in READERS:
        raise CaseError("read_config", "engine", unwritten_engine(engine, READERS, reading=True))
    path = read_path("read_config", "path", path)
    # As `diagnose` reads it, every refusal of it included (its misspelled keys, values DeepSpeed refuses,
    # a layout the case's model cannot run): a config the CLI refused was read here.
    return read_job(case, engine, path, pp, tp, micro_batch_size, recompute, ep, stage_layers,
                    argument=api_argument("read_config")).layout


def diagnose(case: CaseArg, engine: str, path: PathArg, pp: Optional[IntArg] = None, tp: Optional[IntArg] = None,
             micro_batch_size: Optional[IntArg] = None, recompute: Optional[str] = None, ep: Optional[IntArg] = None,
             stage_layers: Optional[StageLayersArg] = None) -> Diagnosis:
    """An existing config read as :func:`read_config` reads it, estimated and set against the planner's
    best: the Diagnosis `layout-planner diagnose --json` prints (``to_dict()``), with the notes that
    say what the config leaves unsaid (a ds_config states no recomputation) and how it was read."""
    from .diagnose import diagnose as diagnosed

    engine = canonical_choice(engine, tuple(ENGINES))  # "DeepSpeed" is deepspeed, as a case's training.engine
    if not isinstance(engine, str) or engine not in READERS:
        raise CaseError("diagnose", "engine", unwritten_engine(engine, READERS, reading=True))
    key = {"deepspeed": "config", "megatron": "megatron_args", "torchtitan": "torchtitan"}[engine]
    return diagnosed(case, pp=pp, tp=tp, micro_batch_size=micro_batch_size, recompute=recompute, ep=ep,
                     stage_layers=stage_layers, argument=api_argument("diagnose"),
                     **{key: read_path("diagnose", "path", path)})


def checked_options(pp: Any = None, tp: Any = None, micro_batch_size: Any = None, recompute: Any = None,
                    ep: Any = None, stage_layers: Any = None, argument: Callable[[str], tuple[str, str]] = cli_flag) \
        -> dict[str, Any]:
    """A reader's options as the caller gave them (None: not given), each checked before any is used
    (a pp of 0 divided by zero), named as ``argument`` names it."""
    for key, value in (("pp", pp), ("tp", tp), ("micro_batch_size", micro_batch_size), ("ep", ep)):
        if value is not None:
            read_int(*argument(key), value)
    if stage_layers is not None:
        if not isinstance(stage_layers, (list, tuple)) or not stage_layers:
            raise CaseError(*argument("stage_layers"), f"expected a list of layer counts, got {stage_layers!r}")
        stage_layers = tuple(read_int(*argument("stage_layers"), n, minimum=0) for n in stage_layers)
    recompute = canonical_choice(recompute, RECOMPUTE)  # "Full" is full, as the case's layout.recompute
    if recompute is not None and (not isinstance(recompute, str) or recompute not in RECOMPUTE):
        raise CaseError(*argument("recompute"), f"expected none, selective or full, got {recompute!r}")
    return {"pp": pp, "tp": tp, "micro_batch_size": micro_batch_size, "recompute": recompute, "ep": ep,
            "stage_layers": stage_layers}


def read_layout(loaded: Case, engine: str, path: Path, pp: Optional[int] = None, tp: Optional[int] = None,
                micro_batch_size: Optional[int] = None, recompute: Optional[str] = None, ep: Optional[int] = None,
                stage_layers: Optional[tuple[int, ...]] = None,
                argument: Callable[[str], tuple[str, str]] = cli_flag) -> Layout:
    """The layout ``engine``'s reader reads at ``path`` on ``loaded`` (a case read as that engine runs
    it: its own split of the pipeline stages, say, not the generic engine's), with the options
    (:func:`checked_options`) its reader takes; an option the config contradicts named as
    ``argument`` names it (the API's argument, or the CLI's flag). :func:`diagnose.read_job`'s
    first step."""
    given = {k: v for k, v in {"pp": pp, "tp": tp, "micro_batch_size": micro_batch_size,
                                "recompute": recompute, "ep": ep, "stage_layers": stage_layers}.items()
             if v is not None}
    reader = ENGINES[engine]
    # The options the reader takes, and the argument namer where it takes any: a reader's own keywords.
    options: dict[str, object] = {k: v for k, v in given.items() if k in reader.reader_options}
    if reader.reader_options:  # a reader that takes options names them as the caller spells them
        options["argument"] = argument
    layout = reader.reader_module().read(path, loaded, **options)
    for option, value in given.items():
        # The config states it (a Megatron argument list its pipeline, say): an option that says
        # otherwise would go unread. Stages it leaves to the engine are the engine's own split.
        stated = getattr(layout, option) if option != "stage_layers" else \
            stage_layers_of(loaded.model, loaded.training, layout)
        if option not in reader.reader_options and value != stated:
            shown = (lambda v: ",".join(map(str, v))) if option == "stage_layers" else str
            raise CaseError(*argument(option), f"{shown(value)} differs from the {shown(stated)} "
                                               f"{path.name} states, which the run takes")
    return layout
