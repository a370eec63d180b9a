"""`diagnose`: what an existing DeepSpeed, Megatron or torchtitan config costs, against the planner's best."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from .api_values import IntArg, StageLayersArg
from .case import Case, load_case, profile_warnings
from cost_models.specs import Job, Layout

from .errors import Argument, CaseError, cli_flag, named
from .fields import read_path
from .estimate import Estimate, change_takes, estimate_job
from .plan import Plan, case_notes, plan_case, unstated_loss
from .search_options import retarget


@dataclass(frozen=True)
class Diagnosis:
    # Compared by value, never hashed, as every result the API returns (docs/commands.md, Python API): most
    # hold dicts, which may change after hashing; hash() names the type rather than failing on a dict inside.
    __hash__ = None  # type: ignore[assignment]

    engine: str
    estimate: Estimate  # the config's own layout
    plan: Plan  # the planner's best for the same model, cluster, global batch and engine
    resolved: tuple[str, ...] = ()  # the config's "auto" values, as the Hugging Face Trainer fills them
    notes: tuple[str, ...] = ()  # how a Megatron launch script was read: the branches taken on what it does not set
    # The training settings the Megatron arguments decided where the case leaves them to the engine: the
    # planner's best is planned with them too (:func:`taken_from_arguments`).
    planned_with: Optional[str] = None
    # What makes the case's hardware profile doubtful (``case.profile_warnings``), as estimate, plan and size
    # say it: the config's figures and the planner's best rest on that profile alike.
    warnings: tuple[str, ...] = ()

    @property
    def speedup(self) -> Optional[float]:
        """Predicted step time of the config over that of the planner's best."""
        if self.plan.best is None:
            return None
        return self.estimate.step_time_s / self.plan.best.step_time_s

    @property
    def verdict(self) -> Optional[str]:
        """What the speedup means, given the model's error: a gain within the gap it cannot tell apart
        (``Plan.margin``, learned from published sweeps) is no reason to change a config, and a best
        slower than the config is the price of fitting at the memory band's upper end."""
        judged = self._judged()
        return judged[0] if judged else None

    @property
    def change_advised(self) -> bool:
        """Whether the verdict advises moving to the planner's best (to fit, to fit surely, or for a gain
        beyond the gap): where it says no change is worth making, or that the config is faster, the
        report lists the differences as such, not as "change:" (a config 7 % faster than the robust
        pick was told "no change is worth making for speed", then "change: tp 2→8, ...")."""
        judged = self._judged()
        return bool(judged and judged[1])

    def _judged(self) -> Optional[tuple[str, bool]]:
        """The verdict and whether it advises the change."""
        from .search_memory import fit_tier

        best, config, speedup, margin = self.plan.best, self.estimate, self.speedup, self.plan.margin
        if best is None or speedup is None:  # both or neither: no best to set the config against
            return None
        if config.memory_verdict == "does not fit":
            return f"the config does not fit as predicted; the planner's best does ({best.memory_verdict})", True
        tiers = [fit_tier(e.job, e.peak.total, self.plan.headroom) for e in (best, config)]
        if config.memory_verdict == "at risk" and tiers[0] < tiers[1] and speedup <= 1 + margin:
            # The best is surer to fit (the robust pick's order): slower, it is what fitting surely costs.
            where = ("fits at its band's upper end" if tiers[0] == 0 else
                     "fits as predicted, where the config's predicted peak is over the usable memory")
            return ("the config is at risk of not fitting (its memory band straddles the usable memory); the "
                    f"planner's best {where}" + (f", {1 / speedup - 1:.1%} slower" if speedup < 1 else "")), True
        if speedup > 1 + margin:
            return f"faster beyond the {margin:.1%} the model cannot tell apart: worth the change", True
        if speedup >= 1 - margin:
            return (f"within the {margin:.1%} the model cannot tell apart (published sweeps): no change is worth "
                    f"making for speed"), False
        return (f"the config is {1 / speedup - 1:.1%} faster than the planner's best, beyond the {margin:.1%} the "
                f"model cannot tell apart: its layout is one the search does not try"), False

    def takes(self) -> dict[str, str]:
        """What each field of :meth:`differences` takes to change to the best's, where no key of the config
        sets it (``estimate.change_takes``); empty where each is a key of the config."""
        differs = self.differences()
        return {key: text for key, text in change_takes(self.estimate.job, self.plan.picked("Diagnosis.takes").job.layout).items()
                if key in differs}

    def differences(self) -> dict[str, list]:
        """What the config runs otherwise than the planner's best, {key: [best, config]}: the layout's
        fields (:meth:`Plan.differences`) and, for a DeepSpeed config at ZeRO 1 or 2 against a best at
        ZeRO 1 or 2, its ``reduce_bucket_size`` where it differs from the 5e8 elements the best is priced
        with, as its emitted ds_config writes it (a Trainer's ``"auto"``, hidden², is many more
        reductions a step: a ZeRO-1 config in the best's own layout was 1.12× slower, and the report
        said "worth the change" with no change to make)."""
        out = self.plan.differences(self.estimate)
        best, config = self.plan.picked("Diagnosis.differences"), self.estimate
        if self.engine == "deepspeed" and all(0 < e.job.layout.zero_stage < 3 for e in (best, config)):
            ours, theirs = (e.job.training.engine for e in (best, config))
            if not (ours.flat_gradient_accumulator or theirs.flat_gradient_accumulator) \
                    and ours.bucket_params != theirs.bucket_params:
                out["reduce_bucket_size"] = [int(ours.bucket_params), int(theirs.bucket_params)]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "config": self.estimate.to_dict(), "resolved": list(self.resolved),
                "notes": list(self.notes), "warnings": list(self.warnings), "planned_with": self.planned_with,
                "best": self.plan.best.to_dict() if self.plan.best else None,
                "speedup": self.speedup, "verdict": self.verdict, "change_advised": self.change_advised,
                "differs_from_best": self.differences() if self.plan.best else None,
                # What each of those changes takes where the engine's config has no key for it (DeepSpeed's
                # ep: the model's MoE blocks rebuilt), as the report's change line says it beside the change.
                "takes": self.takes() if self.plan.best else None,
                # Where the planner finds no layout that fits, why and what would (plan --json's no_fit), as
                # the report says it in the best's place.
                "no_fit": self.plan.no_fit.to_dict() if self.plan.no_fit else None}


def with_megatron_training(case: Case, path: Path, settings: dict) -> Case:
    """``case`` trained as the Megatron-LM arguments at ``path`` run (``settings``, their
    ``engines.megatron.read.read_training``):
    what the case leaves to the engine takes the arguments' setting; a case that says otherwise is
    refused, naming the argument and the case's key. (A boolean the case leaves false is its
    default: the arguments' true stands.)"""
    from .engines.megatron.read import SETTING_FLAGS

    if settings.get("expert_dispatch") == "deepep" and case.cluster.gpu.deepep_refusal:
        raise CaseError(str(path), "--moe-flex-dispatcher-backend", f"the flex dispatcher runs DeepEP (or HybridEP): "
                                                                    f"{case.cluster.gpu.deepep_refusal}; "
                                                                    "--moe-token-dispatcher-type alltoall runs there")
    requested = case.training
    changes = {}
    for key, value in settings.items():
        said = getattr(requested, key)
        if said is None or (said is False and value is True and key.endswith("overlap")) \
                or (key == "optimizer_moments" and said == "fp32"):
            # fp32 moments are the case's default, as an overlap's false: the arguments' bf16 stands
            changes[key] = value
        elif said != value:
            flag = SETTING_FLAGS[key]
            runs = {"fp32_grads": "reduces gradients in fp32" if value else "reduces gradients in bf16",
                    "expert_dispatch": f"dispatches experts by {value}"}.get(key, f"runs {key} {value}")
            raise CaseError(str(path), flag, f"the arguments' Megatron-LM {runs}, but the case "
                                             f"{case.source} says training.{key}: {str(said).lower()}")
    return replace(case, training=replace(requested, **changes)) if changes else case


def taken_from_arguments(case: Case, settings: dict) -> Optional[str]:
    """The training settings, as one line, the arguments decided where the case leaves them to the
    engine (:func:`with_megatron_training`): the planner's best is planned with them too, so it may
    differ from `plan CASE`'s, which takes the engine's own (fp32 gradients from an argument list
    without --grad-reduce-in-bf16 doubled a 70B's gradient memory, and the best moved, unexplained)."""
    from .engines.megatron.read import SETTING_FLAGS

    taken = []
    for key, value in settings.items():
        if key == "optimizer_moments" and value != case.training.optimizer_moments:
            taken.append(f"Adam's moments in {value} (--exp-avg-dtype, --exp-avg-sq-dtype)")
        if getattr(case.training, key) is not None:
            continue
        flag = "--fp4-param-gather" if key == "fp8_param_gather" and case.training.precision == "nvfp4" \
            else SETTING_FLAGS[key]
        if key == "fp32_grads":
            if value:
                taken.append(f"gradients reduced in fp32 (no {flag})")
            elif case.training.precision == "fp32":  # neither --bf16 nor --fp16: every tensor in fp32
                taken.append("gradients reduced in fp32 (an fp32 run: neither --bf16 nor --fp16)")
            elif case.training.precision == "fp16":  # --fp16 never reduces in fp32 (arguments.py)
                taken.append("gradients reduced in fp16 (--fp16)")
            else:  # --grad-reduce-in-bf16, or Megatron-FSDP's or the optimizer's main-grads dtype bf16
                taken.append(f"gradients reduced in bf16 ({flag} or a bf16 main-grads dtype)")
        elif isinstance(value, bool):
            taken.append(f"training.{key} {str(value).lower()} ({'' if value else 'no '}{flag})")
        else:
            taken.append(f"training.{key} {value} ({flag})")
    if not taken:
        return None
    return "; ".join(taken)


def _model_code_notes(case: Case, layout: Layout, config: Path, options: dict[str, Any],
                      case_keys: tuple[str, ...], argument: Argument = cli_flag) -> tuple[str, ...]:
    """What a ds_config leaves to the model's code, and where the reading took it from: its header's
    planned layout where layout-planner wrote it (an option that says otherwise taken over it, said so),
    else the case's layout or the options, else DeepSpeed's default, said so (read as none, the
    recomputation was said of nothing: the planner's own files, planned with full recomputation, were
    diagnosed as not fitting without a word why); and each key of the case's layout section
    (``case_keys``) the config runs otherwise, named: a layout the reading dropped without a word
    priced another job than the case's author wrote, unsaid."""
    from .engines.deepspeed.read import autoep_size, load_config, planned_layout, planned_recompute

    read = load_config(config)
    planned = planned_layout(str(config), read)
    stated = case.layout
    ep, stage_layers, recompute = options["ep"], options["stage_layers"], options["recompute"]
    notes = []
    if case.model.is_moe and stated is None and ep is None and "ep" not in planned \
            and autoep_size(str(config), read) is None:
        notes.append(f"{config.name} does not state DeepSpeed-MoE's ep_size (the model code's): read as ep 1; "
                     "give --ep (or layout.ep in the case) for another")
    if stated is None and recompute is None and layout.recompute == "none" and "recompute" not in planned:
        # (a pipeline's interval says it)
        notes.append(f"{config.name} does not state the recomputation (the model code's: gradient checkpointing, "
                     "deepspeed.checkpointing): read as none; give --recompute (or layout.recompute in the case) "
                     "for another")
    if recompute is None and layout.pp == 1 and not planned and planned_recompute(read):
        notes.append(f"{config.name} was written by layout-planner for a layout that recomputes every layer (its "
                     "header says so; no ds_config key does): read as recompute full, which train.py must run "
                     "(launch.sh says how); give --recompute for another")
    # (the header of a pipeline planned on the engine's own split states none)
    if layout.pp > 1 and stated is None and stage_layers is None and planned.get("pp") != layout.pp:
        notes.append(f"{config.name} does not state PipelineModule's split of the layers: read as the even split; "
                     "give --stage-layers (or layout.stage_layers in the case) for another")
    # The header's values of its own pipeline (tp and the split are those of its pp).
    own = {k: v for k, v in planned.items() if k not in ("tp", "stage_layers") or planned.get("pp") == layout.pp}
    overridden = [f"{named(argument, k)} {_shown(options[k])} is taken over its {k} {_shown(v)}"
                  for k, v in own.items() if options.get(k) is not None and options[k] != v]
    if overridden:
        notes.append(f"{config.name}'s _comment records the layout layout-planner planned, and "
                     f"{'; '.join(overridden)}: the option says what train.py builds")
    defaults = {"pp": 1, "tp": 1, "ep": 1, "recompute": "none"}
    taken = [f"{k} {_shown(v)}" for k, v in own.items() if options.get(k) is None and defaults.get(k) != v]
    if taken:
        said = [named(argument, k) for k in PLANNED_OPTIONS]
        notes.append(f"{config.name} was written by layout-planner for {', '.join(taken)} (its _comment says so; no "
                     f"ds_config key does): read so, which train.py must build (launch.sh says how); give "
                     f"{', '.join(said[:-1])} or {said[-1]} for another")
    unread = []
    for key in case_keys:
        if options.get(key) is not None or stated is None:
            continue  # an option the caller gave decides it, not the file
        attribute = "expert_tp" if key == "etp" else key
        wanted, runs = getattr(stated, attribute, None), getattr(layout, attribute, None)
        if wanted != runs:
            unread.append(f"layout.{key} {_shown(wanted)} (runs {_shown(runs)})")
    if unread:
        notes.append(f"{config.name} runs another layout than the case's layout section ({case.source}) says, and "
                     f"is diagnosed as it runs: {', '.join(unread)}")
    return tuple(notes)


# The options that say what the header's planned layout says.
PLANNED_OPTIONS = ("pp", "tp", "stage_layers", "ep", "recompute")


def _shown(value: Any) -> str:
    """A layout value as a note writes it: stages and module lists comma-joined, an unset one as none."""
    if value is None:
        return "none"
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _layout_keys(case: Any) -> tuple[str, ...]:
    """The keys the case's ``layout`` section states (those it leaves out are defaults, said by nobody)."""
    from .case import read_case

    data = read_case(case)[0]
    section = data.get("layout") if isinstance(data, dict) else None
    return tuple(str(key) for key in section) if isinstance(section, dict) else ()


@dataclass(frozen=True)
class ConfigReading:
    """What a config runs, read as `diagnose` reads it: the case trained as the config trains it (what
    the case leaves to the engine taken from the config) and run by the config's engine, the layout,
    the job it makes, and what the reading resolved and noted."""
    engine: str
    case: Case
    layout: Layout
    job: Job
    resolved: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    planned_with: Optional[str] = None
    # The case the planner's best is searched on, where it differs from ``case``: every layout as the
    # engine's own files run it (a ds_config's reduce_bucket_size prices its own layout, not the rest).
    planning: Optional[Case] = None
    # The file read (a DeepSpeed launch script given: the ds_config it passes); None: the one given.
    path: Optional[Path] = None
    # The config's own word on the routing (a switch that forces it balanced: :func:`forced_routing`),
    # said in place of the case's unstated routing (``plan.unstated_routing``); None: the case's stands.
    routing: Optional[str] = None


def read_job(case: Any, engine: str, path: Path, pp: Optional[IntArg] = None, tp: Optional[IntArg] = None,
             micro_batch_size: Optional[IntArg] = None, recompute: Optional[str] = None, ep: Optional[IntArg] = None,
             stage_layers: Optional[StageLayersArg] = None, argument: Argument = cli_flag) -> ConfigReading:
    """The config at ``path`` for ``engine`` (deepspeed: a ds_config.json, or a launch script that passes
    one; megatron: an argument list or launch script; torchtitan: overrides, a launch script or a 0.2 TOML
    file) on ``case``: every
    refusal `diagnose` makes of it, options the config contradicts named as ``argument`` names them
    (the CLI's flag, the API's argument); the options are the caller's (``checked_options`` reads them).
    ``micro_batch_size`` and ``recompute`` say what a Hugging
    Face Trainer's DeepSpeed config leaves to the Trainer (its per_device_train_batch_size, its
    gradient_checkpointing); ``ep`` what DeepSpeed-MoE's model code sets (its ep_size),
    ``stage_layers`` its PipelineModule's split."""
    from .configs import checked_options, read_layout  # configs names Diagnosis as its API's result

    # The options as checked (ints, the split a tuple), read from here on, never the caller's values
    options = checked_options(pp, tp, micro_batch_size, recompute, ep, stage_layers, argument)
    if engine == "torchtitan":
        return _read_torchtitan(case, path, options, argument)
    # The case is read as the config's engine runs it, whatever engine it names (a Megatron case
    # beside the DeepSpeed files `plan --engine deepspeed` wrote for it): its defaults (fp8's recipe,
    # the quantized weight gather) are that engine's, as `plan --engine` takes them.
    loaded = load_case(case, engine=engine)
    resolved: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    misspelled: tuple[str, ...] = ()
    routing = None  # DeepSpeed-MoE's gates have no switch that forces the routing
    if engine == "megatron":
        from .engines.megatron.launch import launch_notes
        from .engines.megatron.read import architecture_notes, connection_notes, read_training
        from .engines.megatron.read import forced_routing as megatron_forced_routing

        said_dispatch = loaded.training.expert_dispatch
        settings = read_training(path, loaded)  # read once, for the case and the note
        as_given = loaded
        loaded = with_megatron_training(loaded, path, settings)
        loaded, routing = forced_routing(loaded, path, megatron_forced_routing(path))
        notes = tuple(launch_notes(path)) + tuple(architecture_notes(path, loaded)) + tuple(connection_notes(path, loaded))
    else:
        from .engines.deepspeed.read import auto_resolved, launched_config, misspelled_keys

        path, followed = launched_config(path)  # a launch script: the ds_config it passes
        notes = (followed,) if followed else ()
        resolved = tuple(auto_resolved(path, loaded, options["pp"], options["tp"], options["micro_batch_size"],
                                        argument))
        misspelled = tuple(misspelled_keys(path))
    try:
        layout = read_layout(loaded, engine, path, **options, argument=argument)
    except CaseError as error:  # a refusal a misspelled key may explain (zero_optimisation: ZeRO 0)
        if not misspelled:
            raise
        raise CaseError(error.source, error.key, f"{error.expected} ({'; '.join(misspelled)})") from None
    taken = None
    if engine == "deepspeed":
        notes += misspelled + _model_code_notes(loaded, layout, path, options, _layout_keys(case), argument)
    else:
        if said_dispatch is None:
            loaded = _dispatch_left_open(loaded, layout)
            if loaded.training.expert_dispatch is None:  # left to the engine: not planned as the arguments'
                settings = {k: v for k, v in settings.items() if k != "expert_dispatch"}
        loaded, settings = _param_gather_left_open(loaded, as_given, layout, settings)
        taken = taken_from_arguments(as_given, settings)
    spec, training = retarget(loaded.source, loaded.search, loaded.training, engine)  # the config's engine runs it
    planning = None
    if engine == "deepspeed":
        from .engines.deepspeed.read import reduction_as_configured

        # The ZeRO-3 files `plan` writes reduce in buckets of hidden² elements: the ZeRO-1/2 layouts its
        # search weighs against them were priced with those, where their own files hold 5e8 (1.9 GB more).
        planning = replace(loaded, training=training, search=spec)
        training = replace(training, engine=reduction_as_configured(path, loaded, training.engine, layout.pp))
    loaded = replace(loaded, training=training, search=spec)
    job = _job(loaded, layout, path, engine, options, argument)
    if engine == "megatron":
        from .engines.megatron.read import overlap_notes

        notes += tuple(overlap_notes(path, job))
    else:
        from .engines.deepspeed.read import unpriced_notes

        notes += tuple(unpriced_notes(path, job))
    return ConfigReading(engine, loaded, layout, job, resolved, notes, taken, planning, path, routing)


def _read_torchtitan(case: Any, path: Path, options: dict, argument: Argument) -> ConfigReading:
    """A torchtitan job (``engines.torchtitan.read``): the case trained as the job runs it where the
    case leaves it to the engine (the compiled loss, async TP), the layout it runs, and notes on what
    the estimate does not see as the job runs it. ``options`` are the DeepSpeed reader's, refused
    where they differ from what the job states (``read_layout``)."""
    from .configs import read_layout
    from .engines.torchtitan.read import forced_routing as torchtitan_forced_routing
    from .engines.torchtitan.read import read_training, reading_notes, taken_from_job, with_training

    engine = "torchtitan"
    loaded = load_case(case, engine=engine)
    settings = read_training(path, loaded)
    as_given = loaded
    loaded = with_training(loaded, path, settings)
    loaded, routing = forced_routing(loaded, path, torchtitan_forced_routing(path))
    layout = read_layout(loaded, engine, path, **{k: v for k, v in options.items() if v is not None},
                         argument=argument)
    spec, training = retarget(loaded.source, loaded.search, loaded.training, engine)
    loaded = replace(loaded, training=training, search=spec)
    job = _job(loaded, layout, path, engine, options, argument)
    return ConfigReading(engine, loaded, layout, job, (), tuple(reading_notes(path, loaded, job)),
                         taken_from_job(as_given, settings, path), routing=routing)


def forced_routing(case: Case, path: Path, how: Optional[str]) -> tuple[Case, Optional[str]]:
    """``case`` routed as a config that forces the routing balanced runs it (``how``: the engine reader's
    ``forced_routing``, the switch and what the engine does; None where the config leaves the router its
    own), and the one note that says so in place of ``plan.unstated_routing``'s, which told such a launch
    to state the imbalance its runs measure. A forced router's busiest rank takes the mean, the routing
    ``model.moe_load_imbalance`` 1 prices; diagnose estimates the launch, so a case that states a trained
    router's imbalance is priced as the launch runs, and the note says the two disagree. The planner's
    best is searched on the same case, so the two are set side by side on the same routing."""
    if how is None or not case.model.is_moe:  # a dense model has no router: the switch does nothing
        return case, None
    stated = case.model.moe_load_imbalance
    note = (f"{Path(path).name} forces balanced routing ({how}): a benchmarking switch, the routing no longer "
            "depends on the model, so the loss is not that of real training; priced as such, every "
            "expert-parallel rank given the same tokens (model.moe_load_imbalance 1), the planner's best too")
    if stated != 1:
        note += (f"; the case's model.moe_load_imbalance {stated:g} (a trained router's) and the launch disagree: "
                 "priced as the launch runs, balanced (without the switch it would be priced at "
                 f"{stated:g})")
        case = replace(case, model=replace(case.model, moe_load_imbalance=1.0))
    return case, note


def _job(case: Case, layout: Layout, path: Path, engine: str, options: dict, argument: Argument) -> Job:
    """The job the config runs; a refusal of it named where the config states it (``_in_the_config``),
    or as the caller's option where the caller gave it (``ep`` for a dense model)."""
    try:
        return case.job(layout)
    except CaseError as error:
        raise _blamed(error, case.source, path, engine, layout, options, argument) from None


def _blamed(error: CaseError, case_source: str, path: Path, engine: str, layout, options: dict,
            argument: Argument) -> CaseError:
    """A refusal of the layout the config runs, named as the caller's option where the caller gave that
    value (``--recompute selective`` on a ds_config: not the file's ``_comment``, which said none), else
    where the config states it (``_in_the_config``)."""
    field = error.key.partition(".")[2] if error.source == case_source and error.key.startswith("layout.") else ""
    if options.get(field) is not None:
        return CaseError(*argument(field), error.expected)
    return _in_the_config(error, case_source, path, engine, layout)


def diagnose(case: Any, config: Optional[Path] = None, megatron_args: Optional[Path] = None,
             pp: Optional[IntArg] = None, tp: Optional[IntArg] = None, micro_batch_size: Optional[IntArg] = None,
             recompute: Optional[str] = None, ep: Optional[IntArg] = None,
             stage_layers: Optional[StageLayersArg] = None, torchtitan: Optional[Path] = None,
             argument: Argument = cli_flag) -> Diagnosis:
    """The config (a ds_config ``config``, ``megatron_args`` or ``torchtitan`` command-line overrides,
    a launch script or a 0.2 TOML job file) read as :func:`read_job` reads it, estimated, and set
    against the planner's best for the same model, cluster, global batch and engine; options the
    config contradicts named as ``argument`` names them."""
    if sum(given is not None for given in (config, megatron_args, torchtitan)) != 1:
        raise CaseError("diagnose", "config", "give exactly one of config (a ds_config), megatron_args or torchtitan")
    engine, key, given = next((e, k, p) for e, k, p in (("deepspeed", "config", config),
                                                         ("megatron", "megatron_args", megatron_args),
                                                         ("torchtitan", "torchtitan", torchtitan)) if p is not None)
    path = read_path("diagnose", key, given)
    reading = read_job(case, engine, path, pp, tp, micro_batch_size, recompute, ep, stage_layers, argument)
    path = reading.path or path  # the ds_config a launch script passes: where a refusal names its keys
    loaded, layout, job = reading.case, reading.layout, reading.job
    try:
        estimate = estimate_job(loaded, job)
    except CaseError as error:  # the layout the config runs: named as the option or in the config, not the case
        options = {"pp": pp, "tp": tp, "micro_batch_size": micro_batch_size, "recompute": recompute, "ep": ep,
                   "stage_layers": stage_layers}
        raise _blamed(error, loaded.source, path, engine, layout, options, argument) from None
    best = plan_case(reading.planning or loaded, target=engine)
    # What `estimate` and `plan` say of the case (routing it leaves unstated, a sequence past its
    # hf_config's positions), of the training as the config runs it, first.
    notes = case_notes(case, loaded, routing=reading.routing) + reading.notes
    # A DeepSpeed loss the case leaves unstated, said of the layout the config runs.
    notes += tuple(note for note in (unstated_loss(loaded.source, job),) if note)
    if engine == "megatron" and best.best is not None:
        from .engines.megatron.emit import needs_deepep

        if needs_deepep(best.best.job) and not needs_deepep(job):
            notes += ("the planner's best sends tokens across NVLink domains with DeepEP (--moe-token-dispatcher-type "
                      "flex --moe-flex-dispatcher-backend deepep, which its emitted files set), where these "
                      "arguments run Megatron-LM's all-to-all",)
    return Diagnosis(engine, estimate, best, reading.resolved, notes, reading.planned_with,
                     tuple(profile_warnings(case)))


def _in_the_config(error: CaseError, case_source: str, config: Path, engine: str, layout) -> CaseError:
    """A refusal of the layout a config runs (``layout.offload_activations: megatron cannot run it``)
    named where the config states it, the flag or key, not the case's layout section the case may not have;
    for a ds_config, a value no key of it states and the case's layout gave is the case's to name."""
    if error.source != case_source:
        return error
    if engine == "torchtitan":  # parallelism.tensor_parallel_degree, compile.enable_async_tensor_parallel
        from .engines.torchtitan.read import KEY_OF_FIELD as TORCHTITAN_KEYS
        from .engines.torchtitan.read import SETTING_KEYS

        section, _, field = error.key.partition(".")
        key = {"layout": TORCHTITAN_KEYS, "training": SETTING_KEYS}.get(section, {}).get(field)
        return CaseError(str(config), key, error.expected) if key else error
    if error.key.startswith("training.") and engine == "megatron":
        # A setting the arguments switch on that their own layout cannot take (--fp8-param-gather
        # without the distributed optimizer, --tp-comm-overlap without --sequence-parallel): the
        # arguments' flag, not a training key the case may not set.
        from .engines.megatron.read import SETTING_FLAGS

        flag = SETTING_FLAGS.get(error.key.split(".", 1)[1])
        return CaseError(str(config), flag, error.expected) if flag else error
    if not error.key.startswith("layout."):
        return error
    field = error.key.split(".", 1)[1]
    if engine == "megatron":
        from .engines.megatron.emit import FLAG_OF_FIELD

        key = {**FLAG_OF_FIELD,
               # ZeRO 2 and 3 are Megatron-FSDP's, not the distributed optimizer's
               **({"zero_stage": "--use-megatron-fsdp"} if layout.zero_stage >= 2 else {})}.get(field, error.key)
    else:
        from .engines.deepspeed.read import KEY_OF_FIELD, autoep_size, load_config, planned_layout, planned_recompute

        read = load_config(config)
        if field in KEY_OF_FIELD:
            key = KEY_OF_FIELD[field]
        elif field in planned_layout(str(config), read) or field == "recompute" and planned_recompute(read):
            key = "_comment"  # the planner's header says it
        elif field == "tp" and layout.pp == 1:
            key = "tensor_parallel.autotp_size"
        elif field == "ep" and autoep_size(str(config), read) is not None:
            key = "expert_parallel.autoep_size"
        elif field in ("", "dp"):
            key = error.key  # the degrees and the batch the file states together
        else:
            # What no ds_config key states, taken from the case's layout section (its layout.recompute:
            # selective, a Megatron case's): the case's key, in the case file, not the config.
            return error
    return CaseError(str(config), key, error.expected)


def _param_gather_left_open(case: Case, as_given: Case, layout, settings: dict) -> tuple[Case, dict]:
    """``case`` (and the arguments' ``settings``) with the weight gather left to the engine where the
    arguments run the engine's own at their layout: no --fp8-param-gather at ZeRO 0, where the flag
    cannot be given (the planner's own files leave it out there). Taken as the case's, it held every
    layout of the planner's best to 16-bit weight gathers, and diagnose named a slower best than
    `plan`'s and a change to it for the plan's own files."""
    from cost_models.resolution import resolve_training

    if as_given.training.fp8_param_gather is not None or "fp8_param_gather" not in settings:
        return case, settings
    open_training = replace(case.training, fp8_param_gather=None)
    if resolve_training(open_training, layout).fp8_param_gather != settings["fp8_param_gather"]:
        return case, settings
    return replace(case, training=open_training), {k: v for k, v in settings.items() if k != "fp8_param_gather"}


def _dispatch_left_open(case: Case, layout) -> Case:
    """``case`` with the expert dispatch left to the engine where the arguments' all-to-all runs inside
    one NVLink domain: there an engine left to choose runs the all-to-all too (DeepEP only where it
    saves something: ``experts.dispatches_hierarchically``), and Megatron's files say alltoall whatever
    the engine would run across domains, so the arguments do not decide the dispatch for the planner's
    best."""
    from cost_models.topology import domains_spanned

    if case.training.expert_dispatch != "all_to_all" or domains_spanned(case.cluster, layout).get("ep", 1) > 1:
        return case
    return replace(case, training=replace(case.training, expert_dispatch=None))
