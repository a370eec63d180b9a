"""The `layout-planner` command.

Exit codes: 0 success; 2 bad input (one line naming the file, the key and what was
expected); 3 the layout (or every layout) does not fit in GPU memory, or no cluster within
`size`'s limits meets its deadline; 4 a calibration or
validation run failed (one line naming the rank); 130 interrupted (143 by SIGTERM, 129 by SIGHUP).
"""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import sys
from pathlib import Path
from typing import Callable, Iterable, Optional, Union, overload

import typer
try:  # typer ≥ 0.20 ships its own click; earlier ones use click itself (as main's UsageError)
    from typer._click.types import FloatParamType, IntParamType, IntRange
except ImportError:  # pragma: no cover
    # typer < 0.20's click, absent where typer ships its own: the same names, which mypy reads twice
    from click.types import FloatParamType, IntParamType, IntRange  # type: ignore[import-not-found, no-redef]

from .errors import (INTERRUPTS, CaseError, as_typed, Interrupted, forget_interrupts, ignore_interrupts, interrupt,
                     interrupt_received, interrupted_exit_code, one_line, raise_if_interrupted)
from .estimate import estimate
from .limits import MAX_FEW_SHOT, MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS, MAX_SIMPLEST_WITHIN_PCT, MAX_TOP_K
from .units import is_typed_number

EXIT_BAD_INPUT = 2
EXIT_DOES_NOT_FIT = 3

class _Typed(float):
    """A number option's value where float() loses what was typed: a 5,000-digit --gpu-hour-cost or
    1e999 is inf to it, and the refusal said "got inf". It shows itself as typed (:func:`as_typed`);
    every command refuses it (each takes finite numbers only), so no figure is ever drawn from it."""

    given: str

    def __new__(cls, number: float, given: str) -> "_Typed":
        typed = super().__new__(cls, number)
        typed.given = given
        return typed

    def __repr__(self) -> str:  # within the 60 characters the commands' refusals quote of a value
        return as_typed(self.given, head=30)


class _TypedRule:
    """A number option's text read by the rule --tokens reads its count by (units.is_typed_number),
    before click's float() or int(): those took "1_0" and Arabic-Indic "١٠" as 10."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not is_typed_number(value):
            self.fail(f"{as_typed(value)} is not a number in ASCII digits (like 2, 2.5 or 1e3)", param, ctx)
        return super().convert(value, param, ctx)


class _NumberAsTyped(_TypedRule, FloatParamType):
    """typer's float type for the number options, keeping what was typed where it is no finite
    number (inf, nan, 1e999, a 5,000-digit one): the commands' own range refusals then show it."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        return number if math.isfinite(number) or not isinstance(value, str) else _Typed(number, value)


class _Whole(_TypedRule, IntParamType):
    """typer's int type, read by the same rule."""


class _WholeRange(_TypedRule, IntRange):
    """typer's int type with a range (its ``min=`` and ``max=``), read by the same rule."""


NUMBER = _NumberAsTyped()
WHOLE = _Whole()

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Plan the fastest training layout that fits, at a fixed global batch.")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"layout-planner {version('layout-planner')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            print("layout-planner (not installed)")
        raise typer.Exit(0)


@app.callback()
def _root(show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                            help="Print the version and exit.")) -> None:
    """layout-planner: memory and step-time models of LLM training layouts."""


def _fail(error: Exception) -> None:
    # An interrupt swallowed on the way to this error (matplotlib's extension interrupted while it
    # loads raises ImportError: "--plot needs matplotlib", exit 2) is what ended the command.
    raise_if_interrupted()
    print(f"error: {error}", file=sys.stderr)
    raise typer.Exit(EXIT_BAD_INPUT)


@overload
def _file_option(option: str, value: str) -> Path: ...
@overload
def _file_option(option: str, value: None) -> None: ...
@overload
def _file_option(option: str, value: Optional[str]) -> Optional[Path]: ...
def _file_option(option: str, value: Optional[str]) -> Optional[Path]:
    """A file the command writes, as given: typer's Path drops a trailing '/', and `--out dir/` wrote a
    file named dir. A path ending in '/' names a folder."""
    if value is None:
        return None
    if not value.strip():
        raise CaseError(option, "", f"expected a file's path, got {value!r}")
    if value.endswith(("/", os.sep)):
        raise CaseError(option, "", f"{value!r} ends in '/', which names a folder; expected a file's path")
    return Path(value)


@app.command("estimate")
def estimate_command(
    case: Path = typer.Argument(..., help="Case file (YAML) with model, cluster, training and layout."),
    as_json: bool = typer.Option(False, "--json", help="Print the estimate as JSON."),
) -> None:
    """Memory per GPU of the case's layout, by term, and whether it fits."""
    try:
        est = estimate(case)
    except CaseError as error:
        _fail(error)
    _say(_lines("warning", est.warnings) + _lines("note", est.notes))  # the API's Estimate.warnings and notes
    if as_json:
        # The notes said on stderr, under `notes` as plan --json and size --json carry theirs: a tool
        # reading the JSON alone lost them (nanotron's own stage split, unstated MoE routing). Beside
        # Estimate.to_dict, which the API keeps without them (an estimate inside a plan has none).
        print(json.dumps({**est.to_dict(), "notes": list(est.notes), "warnings": list(est.warnings)}, indent=2))
    else:
        from .report import print_estimate

        print_estimate(est, _console())
    if not est.fits:
        raise typer.Exit(EXIT_DOES_NOT_FIT)


def _lines(kind: str, texts: Iterable[str]) -> list[str]:
    """The stderr lines of ``texts``, each one line after its kind: ``warning: …``, ``note: …``."""
    return [f"{kind}: {one_line(text, 1000)}" for text in texts]


def _say(lines: list[str]) -> None:
    for line in lines:
        print(line, file=sys.stderr)


@app.command("plan")
def plan_command(
    case: Path = typer.Argument(..., help="Case file (YAML) with model, cluster, training and optional search."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    top: Optional[int] = typer.Option(None, "--top", click_type=WHOLE,
                                      help=f"Alternatives to list, 0 to {MAX_TOP_K} (default search.top_k, else 5)."),
    simplest_within: Optional[float] = typer.Option(
        None, "--simplest-within", click_type=NUMBER,
        help="Make the robust pick within PCT percent of the fastest (the surest to fit, then the least complex) "
             f"instead of within the gap the model cannot tell apart (0 to {MAX_SIMPLEST_WITHIN_PCT:g}; default: "
             "that gap, learned from published GPU sweeps, planner/published/bands.yaml; on CPUs none: the fastest)."),
    fastest: bool = typer.Option(False, "--fastest", help="Return the raw optimum of the model, not the robust pick "
                                                          "(the simplest layout the model cannot tell from it)."),
    plot: Optional[str] = typer.Option(None, "--plot", metavar="FILE", help="Write the memory and Pareto plots to this PNG (needs matplotlib: the `plot` extra)."),
    emit: Optional[str] = typer.Option(None, "--emit", help="Write launch configs: deepspeed, megatron or torchtitan."),
    engine: Optional[str] = typer.Option(
        None, "--engine", help="Plan for this engine (megatron, deepspeed, torchtitan, nanotron or any), "
                               "overriding the case's training.engine and search.target (default: theirs, else any: "
                               "plan for each engine that can run the case and pick among them)."),
    # A string, not a Path: Path("") is ".", and `--out ''` wrote the files into the current folder.
    out: Optional[str] = typer.Option(None, "--out", help="Folder for --emit's files."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="Tokens to train on, as size takes them (15.6T, "
                                                                 "300B, 2.5e12): say the days the pick takes."),
) -> None:
    """The fastest layout that fits, at the case's global batch, and its runners-up."""
    from .case import CASE_ENGINES
    from .configs import EMITTERS as ENGINES, removed_notes, render, unwritten_engine
    from .fields import canonical_choice
    from .files import Output, check_writable, write_all
    from .plan import plan, plan_options

    written: list[Path] = []
    notes: list[str] = []
    # --emit Megatron and --engine Megatron name megatron, as training.engine does: the files, the
    # report and the notes say megatron.
    emit, engine = canonical_choice(emit, CASE_ENGINES), canonical_choice(engine, CASE_ENGINES)
    try:
        plot_file = _file_option("--plot", plot)
        if emit is not None and emit not in ENGINES:
            raise CaseError("--emit", "", unwritten_engine(emit, ENGINES))
        if emit is not None and out is None:
            raise CaseError("--out", "", "--emit needs --out DIR")
        if out is not None and not out.strip():
            raise CaseError("--out", "", f"expected a folder's path, got {out!r}")
        if out == "-":  # stdout to many tools; a folder named "-" to the file system
            raise CaseError("--out", "-", "expected a folder's path: the launch files are several, not one stream "
                                          "(write ./- for a folder of that name)")
        if plot_file is not None and out is not None and os.path.abspath(plot_file) == os.path.abspath(out):
            raise CaseError("--plot", str(plot_file), "is --out's folder too; expected a file of its own")
        if emit is not None and engine not in (None, emit):
            raise CaseError("--engine", engine, f"differs from --emit {emit}; give the same engine to both")
        plan_options(top, simplest_within, None, names={"top_k": "--top", "simplest_within": "--simplest-within",
                                                        "engine": "--engine", "tokens": "--tokens"}, engine=engine,
                     tokens=tokens)
        if fastest and simplest_within is not None:
            raise CaseError("--fastest", "", "give either --fastest or --simplest-within, not both")
        if out is not None and emit is None:  # nothing would be written there
            raise CaseError("--out", "", "is the folder for --emit's launch files: give --emit ENGINE with it")
        if force and emit is None and plot_file is None:
            raise CaseError("--force", "", "overwrites --emit's or --plot's files: give one of them with it")
        if plot_file is not None:
            if plot_file.suffix.lower() != ".png":  # the plot is a PNG whatever the name says
                raise CaseError("--plot", "", f"expected a .png path (the plots are one PNG), got "
                                              f"{one_line(str(plot_file), 200)!r}")
            check_writable([Output(plot_file, b"", "--plot")], force)
        if emit is not None and out is not None:
            from .emit import EVERY_ENGINE_WRITES

            # Before the plan, as --plot: a folder that is a file, cannot be written or holds the files.
            check_writable([Output(Path(out) / name, "", "--out") for name in EVERY_ENGINE_WRITES], force)
        result = plan(case, simplest_within=simplest_within, top_k=top, target=emit, engine=engine, fastest=fastest,
                      tokens=tokens)
        notes += result.notes  # what the case gives that plan does not read
        outputs: list[Output] = []
        removed: list[Path] = []
        files: dict[str, str] = {}
        if emit is not None and out is not None and result.best is not None:  # --emit needs --out: checked above
            files, emitted = render(result.best, emit, str(case))
            notes += emitted  # after the ignored layout's note, which this once replaced
            outputs += [Output(Path(out) / name, text) for name, text in files.items()]
        elif emit is not None and out is not None:
            notes.append(f"--emit: nothing fits, so no launch files were written to {out} (no layout to run)")
        if plot_file is not None and result.best is not None:
            from .plots import render_plots

            outputs.append(Output(plot_file, render_plots(result, plot_file), "--plot"))
        elif plot_file is not None:
            notes.append(f"--plot: nothing fits, so {plot_file} was not written (no layout to draw)")
        stale: Union[tuple, Callable[[], list[Path]]] = ()
        if force and files and out is not None:  # files are --emit's, which --out takes
            from .emit import earlier_emission_finder

            stale = earlier_emission_finder(out, files, removed, keep=[o.path for o in outputs])
        # All or none: the emitted configs, the plot, and an earlier emission's other files taken out.
        written = write_all(outputs, force, last=True, removes=stale)
        notes += removed_notes(removed)
    except CaseError as error:
        if error.source == "plan" and error.key == "tokens":  # the API's argument is this command's option
            error = CaseError("--tokens", "", error.expected)
        _fail(error)
    # A quick, poorly fitted or disturbed hardware profile is said, never used silently (the API's
    # Plan.warnings, in --json too): said once the command has read its case whole, so that a case
    # refused later is one line, the refusal.
    _say(_lines("warning", result.warnings) + _lines("note", notes))
    if as_json:
        # Every note said above, not the plan's alone: --plot's and --emit's (nothing drawn, files
        # written or taken out) were said on stderr only, and a tool reading the JSON was told nothing.
        print(json.dumps({**result.to_dict(), "notes": notes}, indent=2))
    else:
        from .report import print_plan

        print_plan(result, _console())
        if written:
            _console().print(f"wrote {', '.join(str(p) for p in written)}", markup=False)
    if result.best is None:
        raise typer.Exit(EXIT_DOES_NOT_FIT)


# `emit` is what the planner calls its engines' writers, and the command users guess: the launch files
# come from plan --emit, and typer's "No such command 'emit'" did not say so. Hidden from --help; every
# argument (--help too) taken, so that what follows it is answered with the same line.
@app.command("emit", hidden=True, add_help_option=False,
             context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def emit_command() -> None:
    from .engines import EMITTING

    _fail(CaseError("layout-planner emit", "", "no such command: the launch files come from `layout-planner plan "
                                               f"CASE --emit ENGINE --out DIR` (ENGINE: {', '.join(EMITTING)})"))


@app.command("size")
def size_command(
    case: Path = typer.Argument(..., help="Case file (YAML) with model, cluster (one GPU type, or cluster.options) "
                                          "and training."),
    tokens: str = typer.Option(..., "--tokens", help="Tokens to train on: 15T, 300B, 2.5e12 (K, M, B, T)."),
    deadline: Optional[str] = typer.Option(None, "--deadline", help="Finish within this (60d, 36h): the least "
                                                                    "GPU-hours, or cost, that meets it. Without it "
                                                                    "or a budget: the front of days against "
                                                                    "GPU-hours (cost) and its knee."),
    max_gpus: Optional[int] = typer.Option(None, "--max-gpus", click_type=WHOLE, help="Use at most this many GPUs (of any one type), "
                                                                    "replacing the case's max_gpus or num_gpus, above or "
                                                                    "below; without --deadline, the shortest time within it."),
    max_nodes: Optional[int] = typer.Option(None, "--max-nodes", click_type=WHOLE, help="Use at most this many nodes, as --max-gpus."),
    gpu_hour_cost: Optional[float] = typer.Option(None, "--gpu-hour-cost", click_type=NUMBER,
                                                  help="Price of a GPU-hour (any currency), for every GPU type of the "
                                                       "case, replacing the case's gpu_hour_cost."),
    top: Optional[int] = typer.Option(None, "--top", click_type=WHOLE, help="Alternatives to list (default 3)."),
    as_json: bool = typer.Option(False, "--json", help="Print the sizing as JSON."),
) -> None:
    """How many GPUs of which type, in which layout, for a run of so many tokens: days, GPU-hours, cost.

    With neither --deadline nor a budget: the front of days against GPU-hours (cost), its knee marked."""
    from .size import size, size_target

    options = {"tokens": "--tokens", "deadline": "--deadline", "max_gpus": "--max-gpus", "max_nodes": "--max-nodes",
               "gpu_hour_cost": "--gpu-hour-cost", "top_k": "--top"}
    try:
        size_target(tokens, deadline, max_gpus, max_nodes, gpu_hour_cost, top, names=options)
        from .progress import terminal_progress

        with terminal_progress("sizing: cluster sizes searched") as progress:
            result = size(case, tokens, deadline=deadline, max_gpus=max_gpus, max_nodes=max_nodes,
                          gpu_hour_cost=gpu_hour_cost, top_k=top, progress=progress)
    except CaseError as error:
        if error.source == "size" and error.key in options:  # the API's argument is this command's option
            error = CaseError(options[error.key], "", error.expected)
        _fail(error)
    _say(_lines("warning", result.warnings) + _lines("note", result.notes))  # the ignored layout section's among them
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        from .size_report import print_sizing

        console = _console()
        if not console.is_terminal and "COLUMNS" not in os.environ:
            # Piped into a file or a log, rich draws 80 columns: the front's eight cut their figures.
            console.width = PIPED_TABLE_WIDTH
        print_sizing(result, console, top)
    if result.best is None:
        raise typer.Exit(EXIT_DOES_NOT_FIT)


@app.command("diagnose")
def diagnose_command(
    case: Path = typer.Argument(..., help="Case file (YAML) with model, cluster and training."),
    config: Optional[Path] = typer.Option(None, "--config", help="A DeepSpeed ds_config.json, or a launch script that passes one (--deepspeed_config PATH)."),
    pp: Optional[int] = typer.Option(None, "--pp", click_type=_WholeRange(1, MAX_GPUS),
                                     help="Pipeline stages of the DeepSpeed run (ds_config has none; "
                                          "default: a ds_config plan --emit wrote: its planned layout; else the case's layout; else 1)."),
    tp: Optional[int] = typer.Option(None, "--tp", click_type=_WholeRange(1, MAX_GPUS),
                                     help="Tensor parallelism of a DeepSpeed pipeline whose model splits its own "
                                          "layers (Megatron-DeepSpeed); without a pipeline, ds_config's autotp_size (with a pipeline, "
                                          "default: a ds_config plan --emit wrote: its planned layout; else the case's layout; else autotp_size, else 1)."),
    ep: Optional[int] = typer.Option(None, "--ep", click_type=_WholeRange(1, MAX_GPUS),
                                     help="Expert parallelism of a DeepSpeed-MoE run (the model code's ep_size, "
                                          "which ds_config does not state; AutoEP's autoep_size where the config turns it on; "
                                          "default: a ds_config plan --emit wrote: its planned layout; else the case's layout; else 1)."),
    stage_layers: Optional[str] = typer.Option(None, "--stage-layers",
                                               help="Layers of each pipeline stage of a DeepSpeed run, comma-separated "
                                                    "(its PipelineModule's split, which ds_config does not state; "
                                                    "default: a ds_config plan --emit wrote: its planned layout; else the case's layout; else the estimate's own split)."),
    megatron_args: Optional[Path] = typer.Option(None, "--megatron-args",
                                                 help="A Megatron-LM argument list or launch script."),
    torchtitan: Optional[Path] = typer.Option(None, "--torchtitan",
                                              help="torchtitan command-line overrides (overrides.txt), a launch "
                                                   "script's words after -m torchtitan.train, the planner's torchtitan_config.py, "
                                                   "or a 0.2 TOML job file."),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size", click_type=_WholeRange(1, MAX_GLOBAL_BATCH),
                                                   help="The Hugging Face Trainer's per_device_train_batch_size, "
                                                        "for a ds_config whose micro-batch is \"auto\"."),
    recompute: Optional[str] = typer.Option(None, "--recompute",
                                            help="none, selective or full: the model's activation checkpointing "
                                                 "(the Trainer's gradient_checkpointing), which ds_config does not say; "
                                                 "default: a ds_config plan --emit wrote: its planned layout; else the case's layout; else none; full under a pipeline's "
                                                 "activation_checkpoint_interval)."),
    as_json: bool = typer.Option(False, "--json", help="Print the diagnosis as JSON."),
) -> None:
    """Estimate an existing config's layout and compare it with the planner's best."""
    from .diagnose import diagnose

    try:
        if sum(given is not None for given in (config, megatron_args, torchtitan)) != 1:
            raise CaseError("diagnose", "--config", "give exactly one of --config, --megatron-args or --torchtitan")
        result = diagnose(case, config=config, megatron_args=megatron_args, torchtitan=torchtitan, pp=pp, tp=tp,
                          micro_batch_size=micro_batch_size, recompute=recompute, ep=ep,
                          stage_layers=None if stage_layers is None else _stage_layers(stage_layers))
    except CaseError as error:
        _fail(error)
    _say(_lines("warning", result.warnings))  # the case's profile, as estimate, plan and size say it
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        from .report import print_diagnosis

        print_diagnosis(result, _console())
    if not result.estimate.fits:
        raise typer.Exit(EXIT_DOES_NOT_FIT)


def _stage_layers(text: str) -> tuple[int, ...]:
    """``--stage-layers 4,4,4,1`` as layer counts."""
    words = [w.strip() for w in text.split(",")]
    # Each count no more than a model's layers: a 5,000-digit one was int()'s traceback.
    # ASCII digits, as every number typed (units.is_typed_number): str.isdigit() took "²", int()'s traceback.
    if not words or not all(w.isascii() and w.isdigit() and len(w) <= len(str(MAX_LAYERS)) and int(w) <= MAX_LAYERS for w in words) \
            or len(words) > 10_000:
        raise CaseError("--stage-layers", "", f"expected layer counts from 0 to {MAX_LAYERS} separated by commas "
                                              f"(4,4,4,1), got {one_line(text, 60)!r}")
    return tuple(int(w) for w in words)


@app.command("validate-published")
def validate_published_command(
    runs: Optional[list[Path]] = typer.Argument(None, help="Published-run files (YAML); default: the repo's own "
                                                           "copies (planner/published/)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    experts: bool = typer.Option(True, "--experts/--no-experts",
                                 help="Also plan each tuned recipe's job (about 20 s) and report the gain claimed."),
    write_bands: Optional[str] = typer.Option(None, "--write-bands", metavar="FILE",
                                               help="Write the error bands and the indistinguishable gap these runs "
                                                    "give (planner/published/bands.yaml is the repo's)."),
    few_shot: Optional[int] = typer.Option(None, "--few-shot", click_type=_WholeRange(0, MAX_FEW_SHOT),
                                           help="Also fit a profile to K runs of each source's GPU type and score "
                                                "its other runs, for K = 0, 1, 3, 5 up to K (about a minute)."),
    leave_family_out: bool = typer.Option(False, "--leave-family-out",
                                          help="Also refit the figures fitted to published runs without each MoE "
                                               "family's runs and score the family (minutes: about five of CPU)."),
    force: bool = typer.Option(False, "--force", help="Overwrite the --write-bands file if it exists."),
) -> None:
    """Score the cost model on published runs: throughput and memory per source, layout-sweep
    regret and rank correlation, the gain plan claims over tuned recipes, and what a few of a
    team's own runs teach it (--few-shot)."""
    from . import bands
    from . import few_shot as shots
    from .case import load_case
    from .fidelity import evaluate, print_report, to_dict
    from .files import Output, check_writable, write_all
    from .progress import terminal_progress
    from .published_runs import load_rows

    try:
        bands_file = _file_option("--write-bands", write_bands)
        if force and bands_file is None:  # as plan refuses --force with nothing to overwrite
            raise CaseError("--force", "", "overwrites --write-bands's file: give it with it")
        if bands_file is not None:  # before the work: a folder it cannot write is said at once
            check_writable([Output(bands_file, "", "--write-bands")], force)
        where = ", ".join(str(r) for r in runs) if runs else "planner/published"  # the runs' files, as errors name them
        with terminal_progress("planning the tuned recipes") as progress:
            result = evaluate(load_rows(runs) if runs else None, experts=experts, progress=progress)
        if not result.rows:  # nothing readable: an empty table would look like a pass
            unread = [f"{rid}: {reason}" for rid, reason in result.malformed + result.failed]
            why = unread[:10] + ([f"and {len(unread) - 10} more"] if len(unread) > 10 else []) \
                + [f"{n} {reason}" + (f", {result.skipped_first[reason]} the first" if reason in result.skipped_first
                                      else "") for reason, n in result.skipped.items()]
            raise CaseError(where, "",
                            "no published run could be scored" + (f" ({'; '.join(why)})" if why else
                                                                  ": the files hold no runs"))
        jobs = [load_case(r.case).job() for r in result.rows]
        covered = bands.coverage(result.rows, jobs)
        covered_by_class = bands.coverage_by_class(result.rows, jobs)
        shot = shots.evaluate(result.rows, shots.ladder(few_shot)) if few_shot is not None else None
        families = None
        if leave_family_out:
            from . import leave_family_out as lfo
            families = lfo.evaluate_families(load_rows(runs) if runs else load_rows(),
                                             progress=lambda line: print(line, file=sys.stderr, flush=True),
                                             source=where)
        if bands_file is not None:  # last: once it is written, interrupts are ignored (files.write_all)
            document = bands.compute(result.rows, jobs)
            too_few = bands.enough_runs(document)
            if too_few:
                raise CaseError("--write-bands", "", too_few)
            drawn_from = ", ".join(str(r) for r in runs) if runs else "the repo's published runs (planner/published/*.yaml)"
            write_all([Output(bands_file, bands.render(document, drawn_from), "--write-bands")], force, last=True)
    except CaseError as error:
        _fail(error)
    if as_json:
        print(json.dumps({**to_dict(result), "band_coverage": [vars(c) for c in covered],
                          "band_coverage_by_class": [{"class": c.source, "runs": c.runs, "inside": c.inside,
                                                      "inside_held_out": c.inside_held_out}
                                                     for c in covered_by_class],
                          **({"few_shot": shots.to_dict(shot)} if shot else {}),
                          **({"leave_family_out": lfo.to_dict(families)} if families is not None else {})}, indent=2))
    else:
        console = _console(width=160)
        print_report(result, console, experts=experts)
        bands.print_coverage(covered, console)
        bands.print_coverage(covered_by_class, console, by="class")
        if shot is not None:
            shots.print_report(shot, console)
        if families is not None:
            lfo.print_report(families, console)


@app.command("validate")
def validate_command(
    case: Path = typer.Argument(..., help="Case file (YAML): a small model in fp32 and a data-parallel layout."),
    profile: Optional[Path] = typer.Option(None, "--profile",
                                           help="Hardware profile (from `calibrate`) to predict with; "
                                                "replaces the case's cluster.gpu or cluster.profile."),
    steps: int = typer.Option(5, "--steps", click_type=WHOLE, help="Timed steps; the median is reported."),
    warmup: int = typer.Option(2, "--warmup", click_type=WHOLE, help="Untimed steps before them."),
    timeout: float = typer.Option(600.0, "--timeout", click_type=NUMBER, help="Seconds before the run is stopped."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    allow_quick: bool = typer.Option(False, "--allow-quick", help="Predict with a `calibrate --quick` profile anyway."),
    allow_busy: bool = typer.Option(False, "--allow-busy", help="Measure even while other processes keep the "
                                                                "machine busy (warned about, and recorded)."),
) -> None:
    """Train the case's layout for real on this machine (its CPUs with torchrun and gloo, or its GPUs with NCCL)
    and compare with the prediction."""
    import importlib.util

    from calibration.supervisor import EXIT_RUN_FAILED, RunFailed
    from calibration.validate import DoesNotFit, print_validation, validate

    try:
        if importlib.util.find_spec("torch") is None:
            raise CaseError("validate", "", "needs torch: pip install 'layout-planner[calibrate]'")
        result = validate(case, profile, steps=steps, warmup=warmup, timeout_s=timeout, allow_quick=allow_quick,
                          allow_busy=allow_busy,
                          warn=lambda warning: print(f"warning: {one_line(warning, 1000)}", file=sys.stderr),
                          progress=(lambda line: None) if as_json else (lambda line: print(line, flush=True)))
    except CaseError as error:
        _fail(error)
    except DoesNotFit as error:
        print(f"error: {one_line(error, 1000)}", file=sys.stderr)
        raise typer.Exit(EXIT_DOES_NOT_FIT)
    except RunFailed as error:
        print(f"error: {one_line(error, 1000)}", file=sys.stderr)
        raise typer.Exit(EXIT_RUN_FAILED)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_validation(result, _console())


def ranks(n: int) -> str:
    """"1 rank", "2 ranks": `calibrate --nproc 1` printed "1 ranks"."""
    return f"{n} rank" if n == 1 else f"{n} ranks"


def wrote_line(path: Union[str, Path], world_size: int, seconds: float) -> str:
    """`calibrate`'s line once the profile is written."""
    return f"wrote {path} ({ranks(world_size)}, {seconds:.0f} s)"


def how_to_use_profile(path: Union[str, Path]) -> str:
    """The line after `wrote PROFILE`: what a user does with the file next (the case key that reads it).
    The path absolute: a case reads a relative profile path from its own folder, not from where
    calibrate ran (`--out my.yaml` printed as ``profile: my.yaml`` was not found from a case elsewhere);
    JSON-quoted, a YAML string whatever the path holds (a space, a colon, a brace)."""
    import json

    where = json.dumps(str(Path(path).resolve()))
    return (f"use it in a case as cluster: {{profile: {where}}}, in place of cluster.gpu (a relative path there is "
            "read from the case file's folder)")


@app.command("calibrate")
def calibrate_command(
    files: Optional[list[Path]] = typer.Argument(None, help="With --from-runs: published-runs files (YAML); with "
                                                            "--from-logs: training logs."),
    out_given: str = typer.Option(..., "--out", metavar="FILE", help="Where to write the hardware profile (YAML)."),
    from_runs: bool = typer.Option(False, "--from-runs", help="Fit the profile to a team's own runs (the files, in "
                                                              "the published-runs schema) instead of timing kernels."),
    from_logs: bool = typer.Option(False, "--from-logs", help="Fit the profile to training logs (the files: "
                                                              "Megatron-LM, torchtitan or DeepSpeed), with --case."),
    case: Optional[list[Path]] = typer.Option(None, "--case",
                                              help="Time the GEMM and attention shapes of this case's model; with "
                                                   "--from-logs, the case the logs ran (once, or once per log: --case A.yaml --case B.yaml)."),
    nproc: Optional[int] = typer.Option(None, "--nproc", click_type=WHOLE,
                                        help="Ranks on this node (default: the GPUs, or 2 on a CPU-only machine)."),
    quick: bool = typer.Option(False, "--quick", help="Tiny shapes and few repeats: a smoke test, not a profile."),
    timeout: Optional[float] = typer.Option(None, "--timeout", click_type=NUMBER,
                                            help="Seconds a rank may make no progress before the run is stopped "
                                                 "(its start-up: at least two minutes; default 300)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing profile."),
    gpu_preset: Optional[str] = typer.Option(
        None, "--gpu-preset", help="Take peak_tflops from this GPU preset (datasheet) instead of the best measured; with "
             "--from-runs or --from-logs, the GPU preset the runs ran on, their priors (another is refused)."),
    nnodes: Optional[int] = typer.Option(None, "--nnodes", click_type=_WholeRange(1, MAX_GPUS),
                                         help="Nodes (run the same command on each; default 1)."),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint",
                                                help="HOST:PORT of the rendezvous (nnodes > 1)."),
    allow_busy: bool = typer.Option(False, "--allow-busy", help="Measure even while other processes keep the "
                                                                "machine busy (warned about, and recorded)."),
) -> None:
    """Measure this machine under torchrun (GEMMs, attention, memory, collectives) and write a hardware profile;
    or, with --from-runs or --from-logs, fit one to a team's own runs."""
    try:
        out = _file_option("--out", out_given)
    except CaseError as error:
        _fail(error)
    if from_runs or from_logs or files:
        timed = {"--nproc": nproc, "--quick": quick or None, "--timeout": timeout, "--nnodes": nnodes,
                 "--rdzv-endpoint": rdzv_endpoint, "--allow-busy": allow_busy or None}
        given = [option for option, value in timed.items() if value is not None]
        if given:  # they shape the microbenchmarks, which a fit to runs does not run
            _fail(CaseError(given[0], "", "applies to timing this machine's kernels, not to --from-runs or "
                                          "--from-logs"))
        _calibrate_from_runs(files or [], out, from_runs, from_logs, case or [], gpu_preset, force)
        return
    from calibration.launch import calibrate
    from calibration.supervisor import EXIT_RUN_FAILED, RunFailed

    try:
        if case is not None and len(case) > 1:
            raise CaseError("--case", str(case[1]), "give one case to time its shapes")
        outcome = calibrate(out, case=case[0] if case else None, nproc=nproc, quick=quick,
                            timeout=300.0 if timeout is None else timeout, force=force,
                            gpu_preset=gpu_preset, nnodes=1 if nnodes is None else nnodes, rdzv_endpoint=rdzv_endpoint,
                            show_progress=True, allow_busy=allow_busy, last=True)
        ignore_interrupts()  # the profile is written (and from then on, interrupts ignored: last=True)
    except CaseError as error:
        _fail(error)
    except RunFailed as error:
        print(f"error: {error}", file=sys.stderr)
        raise typer.Exit(EXIT_RUN_FAILED)
    except (KeyboardInterrupt, Interrupted):  # Ctrl-C or SIGTERM: every rank is stopped, nothing is written
        print("error: calibration interrupted; no profile written", file=sys.stderr)
        raise typer.Exit(interrupted_exit_code())
    if outcome.path is None or outcome.profile is None:  # both or neither: the profile written, where
        print(f"calibrated {ranks(outcome.world_size)} in {outcome.seconds:.0f} s; rank 0's node wrote the profile")
        return
    perf = outcome.profile["performance"]
    gpu = outcome.profile["gpu"]
    print(wrote_line(outcome.path, outcome.world_size, outcome.seconds))
    print(how_to_use_profile(outcome.path))
    print("  peak_tflops " + ", ".join(f"{k} {v}" for k, v in gpu["peak_tflops"].items())
          + f"; hbm {gpu['hbm_bandwidth']}; intra-node {gpu['intra_node_bandwidth']}")
    print("  " + ", ".join(f"{k} {v}" for k, v in perf.items()))
    alone = outcome.profile.get("alone")
    if alone:  # what a case of one rank is priced with
        print("  one rank alone: peak_tflops " + ", ".join(f"{k} {v}" for k, v in alone["peak_tflops"].items())
              + f"; hbm {alone['hbm_bandwidth']}; "
              + ", ".join(f"{k} {v}" for k, v in alone["performance"].items()
                          if k in ("gemm_efficiency", "kernel_overhead_s", "attention_efficiency", "hbm_efficiency",
                                   "in_place_efficiency", "transcendental_efficiency")))
    timed = outcome.profile["machine"].get("reference_gemm_tflops")
    if timed:  # what `validate` compares this machine's speed with later (calibration/speed.py)
        print(f"  reference GEMM {timed['before']} TFLOP/s before the ranks, {timed['after']} after")
    # Said now, as every estimate on the profile will say it: a --quick smoke test, fits with a large error
    # (a busy or moving machine was said as it was measured).
    from .case import warnings_of_profile

    for warning in warnings_of_profile(str(outcome.path), outcome.profile, disturbed=False):
        print(f"warning: {one_line(warning, 1000)}", file=sys.stderr)


def _calibrate_from_runs(files: list[Path], out: Path, from_runs: bool, from_logs: bool, cases: list[Path],
                         gpu_preset: Optional[str], force: bool) -> None:
    """`calibrate --from-runs` / `--from-logs`: fit, write the profile atomically, print the fit."""
    from .files import Output, check_writable, write_all
    from .learn import check_explained, fit, print_fit, profile_of, render
    from .team_runs import load_runs, runs_from_logs

    try:
        if from_runs == from_logs:
            raise CaseError("calibrate", "--from-runs", "give the files after exactly one of --from-runs (runs "
                                                        "files) or --from-logs (training logs)")
        if from_runs and cases:
            raise CaseError("--case", str(cases[0]), "goes with --from-logs; a runs file holds each run's case")
        if from_logs and not cases:
            raise CaseError("--case", "", "--from-logs needs the case the logs ran: --case CASE.yaml")
        read = [os.path.realpath(f) for f in [*files, *cases]]
        if os.path.realpath(out) in read:  # with --force the profile replaced the runs it was fitted to
            raise CaseError("--out", str(out), "is a file the fit reads: give the profile another path")
        # Before the fit, as calibrate's ranks and validate-published's work: an --out that exists or cannot
        # be written was said only once 500 runs (half a minute) had been read and fitted.
        check_writable([Output(out, "")], force)
        runs = load_runs(files) if from_runs else runs_from_logs(files, cases)
        result = fit(runs, str(files[0]) if files else "runs", gpu_preset)
        check_explained(result, str(files[0]) if files else "runs")
        profile = profile_of(result, ", ".join(str(f) for f in files))
        written = write_all([Output(out, render(profile))], force, last=True)
    except CaseError as error:
        _fail(error)
    console = _console()
    print_fit(result, console)
    for line in result.warnings():
        print(f"warning: {line}", file=sys.stderr)
    for line in result.notes:  # what a run left out and was guessed (Run.guessed)
        print(f"note: {line}", file=sys.stderr)
    # The runs the figures were fitted to, not every run given: one set aside informed none of them.
    console.print(f"wrote {', '.join(str(p) for p in written)} ({result.summary()})", markup=False)
    console.print(how_to_use_profile(written[0]), markup=False)


# A report narrower than this is unreadable: a terminal (or COLUMNS) that says less, 0 or 1 from a
# broken environment, gets the width of a classic terminal (rich printed nothing at COLUMNS=0).
MIN_REPORT_WIDTH, DEFAULT_REPORT_WIDTH = 40, 80
# The widest a report or --help is drawn: rich fills every line to the width, and COLUMNS=100000000
# gave `plan --help` 500 MB of spaces (past 2^63, an OverflowError traceback).
MAX_REPORT_WIDTH = 1000
# The width a table of many figures is drawn at off a terminal (size's front: eight columns).
PIPED_TABLE_WIDTH = 120


def _sane_columns() -> None:
    """COLUMNS as rich reads it for the reports and for typer's --help: a width from 40 to 1,000
    columns, 80 where it is narrower or no number (at COLUMNS=10 --help drew its options' boxes empty)."""
    given = os.environ.get("COLUMNS")
    if given is None:
        return
    width = int(given) if given.strip().isdigit() and len(given.strip()) <= 6 else None
    if width is None or width < MIN_REPORT_WIDTH:
        os.environ["COLUMNS"] = str(DEFAULT_REPORT_WIDTH)
    elif width > MAX_REPORT_WIDTH:
        os.environ["COLUMNS"] = str(MAX_REPORT_WIDTH)


def _console(**options):
    """rich's Console, loaded only when a command prints a report (never for --json): 20 ms of imports."""
    from rich.console import Console

    console = Console(**options)
    if console.width < MIN_REPORT_WIDTH:
        console.width = DEFAULT_REPORT_WIDTH
    return console


def _interrupted(signum, frame) -> None:
    interrupt(signal.Signals(signum).name)


def _caused_by_interrupt(error: Optional[BaseException]) -> bool:
    """An interrupt, or an error it caused (an extension module interrupted while loading
    raises ImportError from the interrupt)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, (Interrupted, KeyboardInterrupt)):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def main() -> None:
    """Entry point: a usage error (unknown option, bad value) is one line and exit code 2 too."""
    try:  # typer ≥ 0.20 ships its own click; earlier ones use click itself
        from typer._click.exceptions import UsageError
    except ImportError:  # pragma: no cover
        from click.exceptions import UsageError  # type: ignore[import-not-found, no-redef]  # as at the top

    forget_interrupts()
    # What runs before the command's own ``try`` runs before its handlers are set, under the entry point's
    # (one line, exit 128 + the signal): a signal in the import of planner.files or in the stream checks,
    # after the CLI's handlers and outside the try, raised out of main(), a traceback and exit 1.
    from .files import WritesRefused, refuse_writes

    closed = _guard_streams()
    if closed:  # no file is written where the answer cannot be: files beside an exit 1 left the caller unsure
        refuse_writes("stdout: closed; the answer could not be written, so no file was written")
    _sane_columns()
    code = _run(UsageError, WritesRefused)
    if closed and code in (0, EXIT_DOES_NOT_FIT):  # an answer was due, and went nowhere
        print("error: stdout: closed; the answer could not be written", file=sys.stderr)
        code = EXIT_OUTPUT_FAILED
    if code == interrupted_exit_code() and interrupt_received():
        # Ended by a signal, its clean-up done on the way out: no interpreter shutdown, which an
        # extension module interrupted while it loaded (matplotlib's ft2font) aborts with "Fatal
        # Python error: PyThreadState_Get" and exit -6.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)


def _argument_problem(argv: list[str]) -> Optional[CaseError]:
    """What the option parser takes silently and a user did not mean: an empty argument (typer's
    Path reads "" as ".", the working directory, and said ". expected a regular file, got a
    directory"), or an option given twice with different values (the last one won: `--emit megatron
    --emit deepspeed` wrote DeepSpeed's files; `--experts --no-experts`). None where neither is."""
    words = [w.split("=", 1)[0] for w in argv if w.startswith("--")]
    negated = {"--" + w[len("--no-"):] for w in words if w.startswith("--no-")}
    if all(w.strip() and not (w.startswith("--") and w.endswith("=")) for w in argv) and \
            len(set(words)) == len(words) and not negated & set(words):
        return None  # the common case, without building the parser's view of the command
    import typer.main
    from typer import core

    group = typer.main.get_command(app)
    name = next((w for w in argv if not w.startswith("-")), None)
    command = getattr(group, "commands", {}).get(name) if name else None
    if name is None or command is None:
        return None  # the parser says what is wrong
    options = [p for p in command.params if isinstance(p, core.TyperOption)]
    positionals = [p for p in command.params if isinstance(p, core.TyperArgument)]
    said: dict[str, list[tuple[str, object]]] = {}
    i = argv.index(name) + 1
    while i < len(argv):
        word = argv[i]
        flag, _, inline = word.partition("=")
        option = next((p for p in options if flag in p.opts or flag in p.secondary_opts), None)
        if option is None:
            if not word.strip():
                what = positionals[0].name.upper() if len(positionals) == 1 else "an argument"
                return CaseError(f"layout-planner {name}", what, "expected a file's path or a value, got an empty "
                                                                 "argument")
            i += 1
            continue
        if option.is_flag:
            value: object = flag in option.opts
        elif inline or "=" in word:
            value = inline
        else:
            value = argv[i + 1] if i + 1 < len(argv) else None
            i += 1
        if isinstance(value, str) and not value.strip():
            return CaseError(flag, "", "expected a value, got an empty one")
        said.setdefault(option.name, []).append((flag, value))
        i += 1
    for option in options:
        given = said.get(option.name, [])
        if not option.multiple and len({value for _, value in given}) > 1:
            (first, a), (second, b) = given[0], next(g for g in given if g[1] != given[0][1])
            shown = (lambda f, v: f) if option.is_flag else (lambda f, v: f"{f} {one_line(v, 40)}")
            return CaseError(first, "", f"given twice, as {shown(first, a)} and {shown(second, b)}; expected it once")
    return None


def _guard_streams() -> bool:
    """Streams the CLI can always write to: a closed stdout (``>&-``, which Python gives as None) or
    stderr becomes the null device, and one that cannot encode the report's characters (a non-UTF-8
    locale: ×, –, box drawing) replaces them rather than failing. True where stdout was closed."""
    closed = sys.stdout is None
    if closed:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")
    for stream in (sys.stdout, sys.stderr):
        if "utf" not in (getattr(stream, "encoding", None) or "").lower() and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    sys.stderr = _Unfailing(sys.stderr)
    return closed


class _Unfailing:
    """stderr whose writes cannot fail the command: a note that cannot be written (2>/dev/full) made
    `plan --json` exit 1 with nothing on stdout, its answer lost for a line of commentary."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


# Where stdout cannot take the answer (a reader that closed the pipe, a full disk): the command's
# own writes and the interpreter's last flush raise these, with no file name.
_OUTPUT_ERRORS = (errno.EPIPE, errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG, errno.EBADF)
EXIT_OUTPUT_FAILED = 1


def _run(usage_error: type, writes_refused: type) -> int:
    """The command's exit code, its answer flushed to stdout; where stdout cannot take it, one line
    on stderr (none for a closed pipe: its reader has gone) and exit 1, not a traceback."""
    try:
        code = _run_command(usage_error)
        sys.stdout.flush()
        return code
    except writes_refused as refused:
        print(f"error: {refused}", file=sys.stderr)
        return _exiting(EXIT_OUTPUT_FAILED)
    except OSError as error:
        if error.filename is not None or error.errno not in _OUTPUT_ERRORS:
            raise
        # What is still buffered goes nowhere, so that the interpreter's last flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        if error.errno != errno.EPIPE:
            print(f"error: stdout: the answer could not be written ({error.strerror})", file=sys.stderr)
        return _exiting(EXIT_OUTPUT_FAILED)


def _run_command(usage_error: type) -> int:
    """The command's exit code, with every message printed; interrupts ignored once it is decided."""
    try:
        for signum in (getattr(signal, name) for name in INTERRUPTS):  # Ctrl-C, `kill`, a closed terminal alike:
            if signal.getsignal(signum) is not signal.SIG_IGN:  # exit 128 + its number, nothing written (nohup
                # and background jobs ignore them); set inside the try that answers them
                signal.signal(signum, _interrupted)
        refused = _argument_problem(sys.argv[1:])  # inside: an interrupt while it looks is answered as any
        if refused is not None:
            print(f"error: {refused}", file=sys.stderr)
            return _exiting(EXIT_BAD_INPUT)
        result = app(prog_name="layout-planner", standalone_mode=False)
        if not result:  # a command about to report success, past an interrupt Python dropped
            raise_if_interrupted()
    except usage_error as error:
        if not error.format_message() and error.ctx is not None:  # bare command: show its help
            print(error.ctx.get_help())
            return _exiting(0)
        command = error.ctx.command_path if error.ctx else "layout-planner"
        print(f"error: {command}: {_shortened(error.format_message())}", file=sys.stderr)
        return _exiting(EXIT_BAD_INPUT)
    except typer.Exit as done:
        return _exiting(done.exit_code)
    except BaseException as error:
        if not _caused_by_interrupt(error):
            raise
        print("error: interrupted", file=sys.stderr)
        return _exiting(interrupted_exit_code())
    return _exiting(result if isinstance(result, int) else 0)


def _shortened(message: str) -> str:
    """An option parser's message on one short line: a long value it quotes (a 5,000-digit
    --top) cut to its first 40 characters and its length."""
    import re

    return one_line(re.sub(r"'([^']{61,})'", lambda match: as_typed(match.group(1)), message), 1000)


def _exiting(code: int) -> int:
    ignore_interrupts()  # what was decided is what the process says
    return code
