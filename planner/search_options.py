"""The case file's ``search`` section, read once (by :func:`planner.case.build_case`) into a
:class:`SearchSpec`: the engine searched for, the memory headroom, and pins or bounds on any
variable of the layout. Also the one place where ``search.target`` and ``training.engine`` are
reconciled: a layout is timed as the engine that will run it runs it, for every command."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

from cost_models.job import context_parallel_sequence_refusal
from cost_models.layout_spec import ZERO_STAGES
from cost_models.specs import RECOMPUTE, RECOMPUTE_MODULES, Layout, ModelSpec, SpecError, TrainingSpec

from .engines import EMITTING, ENGINES, Engine, EngineSupport
from .engines.megatron import recompute_module_refusals
from .errors import CaseError
from .fields import (canonical_choice, describe, read_bool, read_choice, read_int, read_mapping, read_number,
                     read_recompute_layers, read_str)
from .limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_HEADROOM, MAX_TOP_K

PINNABLE = ("dp", "tp", "pp", "cp", "vpp", "micro_batch_size", "zero_stage", "sequence_parallel", "recompute",
            "recompute_num_layers", "recompute_modules", "offload_optimizer", "offload_params", "offload_activations",
            "ep", "etp")
BOUNDED = ("dp", "tp", "pp", "cp", "vpp", "micro_batch_size", "zero_stage", "ep", "etp")
SEARCH_KEYS = ("target", "headroom", "top_k", "tp_across_nodes") + PINNABLE \
    + tuple(f"{side}_{name}" for name in BOUNDED for side in ("min", "max"))


@dataclass(frozen=True)
class SearchSpec:
    """The case file's ``search`` section: engine, headroom, and pins or bounds on any variable."""

    target: str = "any"
    # Share of GPU memory every layout leaves free beyond what the memory model counts. By default
    # the driver's own reserve alone, under 1 % (an H100 reports 79.65 of its 80 GiB, a B200 179.1 of
    # 180: tests/test_memory_published.py): how far a peak strays from the model's is the memory
    # band's to say (planner/bands.py), and a layout whose band straddles the usable memory is
    # reported at risk rather than refused. `estimate` and `diagnose` hold layouts to it too.
    headroom: float = 0.01
    top_k: int = 5
    tp_across_nodes: bool = False
    pins: dict = field(default_factory=dict)
    bounds: dict = field(default_factory=dict)  # name -> (min, max)
    # The case-file key that named the target, for errors that contradict it.
    target_key: str = "training.engine"

    @property
    def engine(self) -> EngineSupport:
        return ENGINES[self.target].support

    @property
    def runner(self) -> Engine:
        return ENGINES[self.target]

    def admits(self, name: str, value: Any) -> bool:
        if name in self.pins and self.pins[name] != value:
            return False
        low, high = self.bounds.get(name, (None, None))
        return (low is None or value >= low) and (high is None or value <= high)


def training_for_target(src: str, search: Any, training: TrainingSpec) -> TrainingSpec:
    """``training`` with the engine the search is for: a named ``search.target`` becomes
    training.engine where that is ``any``, and contradicting it is an error."""
    if not isinstance(search, dict) or "target" not in search:
        return training
    target = read_choice(src, "search.target", search["target"], tuple(ENGINES))
    if training.engine.name == "any":
        return replace(training, engine=ENGINES[target].behaviour)
    if target != training.engine.name:  # "any" too: it decides between engines, and one is named
        raise CaseError(src, "search.target", f"is {target!r} but training.engine is "
                                              f"{training.engine.name!r}; drop one of them")
    return training


def retarget(src: str, spec: SearchSpec, training: TrainingSpec, target: Optional[str]) \
        -> tuple[SearchSpec, TrainingSpec]:
    """The search and training for configs of ``target`` (`plan --emit`, ``plan(..., target=)``):
    a case for ``any`` engine is searched as ``target`` runs it; a case for another engine is an
    error. Every layout is timed as the engine chosen runs it."""
    if target is not None and target != spec.target:
        if spec.target != "any":
            # --emit names only the engines that write launch files (nanotron writes none).
            emit = f"--emit {target}, or " if target in EMITTING else ""
            raise CaseError(src, spec.target_key, f"is {spec.target!r} but {target!r} was asked for ({emit}"
                                                  f"target={target!r}); pass --engine {target} "
                                                  f"(plan(..., engine={target!r})) to plan for it instead")
        spec = replace(spec, target=target)
    if training.engine.name != spec.target:
        training = replace(training, engine=ENGINES[spec.target].behaviour)
    check_training_for_engine(src, spec, training)
    check_pins_for_engine(src, spec)
    return spec, training


def check_pins_for_engine(src: str, spec: SearchSpec) -> None:
    """A pinned choice the engine does not run (a cp, vpp, ZeRO stage, recomputation or offload) is
    the case's error with the engine's reason, as `estimate` refuses the layout: the search would
    otherwise find no layout that holds the pin and say only that none meets it."""
    if spec.target == "any":
        return
    pins, support = spec.pins, ENGINES[spec.target].support
    # Unpinned degrees at what every engine runs with any pin (one GPU's worth, its first sequence-
    # parallel and recompute choices, its largest ZeRO stage: the one that shards cp's states), so a
    # refusal of a pinned key is the pin's alone, or two pins' together.
    degrees = {"tp": pins.get("tp", 1), "pp": pins.get("pp", 1), "cp": pins.get("cp", 1), "vpp": pins.get("vpp", 1),
               "zero_stage": pins.get("zero_stage", max(support.zero_stages)),
               "sequence_parallel": pins.get("sequence_parallel", support.sequence_parallel[0]),
               "recompute": pins.get("recompute", support.recompute[0])}
    for key, why in support.refusals(**degrees):
        if key in pins:
            raise CaseError(src, f"search.{key}", f"{spec.target} cannot run it: {why}")
    # An unpinned ZeRO stage is the search's to choose: any the engine offloads the optimizer with.
    zero = pins.get("zero_stage", 3 if pins.get("offload_params") or not support.optimizer_offload_zero
                    else max(support.optimizer_offload_zero))
    refusals = support.offload_refusals(pins.get("offload_optimizer", 0.0), pins.get("offload_params", False),
                                        pins.get("offload_activations", 0), zero)
    for key, why in refusals:
        if key in pins:
            raise CaseError(src, f"search.{key}", f"{spec.target} cannot run it: {why}")
    if pins.get("offload_activations"):  # beside what the engine's activation offload refuses
        beside = [(name, field) for name, field, allowed in (
            ("recompute", "activation_offload_with_recompute",
             support.activation_offload_with_recompute or pins.get("recompute", "none") == "none"),
            ("pp", "activation_offload_with_pipeline",
             support.activation_offload_with_pipeline or pins.get("pp", 1) == 1)) if not allowed]
        if beside:
            name, field = beside[0]
            raise CaseError(src, "search.offload_activations", f"{spec.target} cannot run it beside search.{name} "
                                                               f"{pins[name]}: {support.reason(field, '')}")


def check_training_for_engine(src: str, spec: SearchSpec, training: TrainingSpec) -> None:
    """What the training section and the search's pins ask of the engine searched for, which it
    does not run: the case's error before any search."""
    support = ENGINES[spec.target].support
    if training.moe_comm_overlap and not support.moe_comm_overlap:
        raise CaseError(src, "training.moe_comm_overlap", f"{spec.target} cannot overlap expert-parallel "
                                                          "dispatch and combine with compute; set it false")
    if training.tp_comm_overlap and not support.tp_comm_overlap:
        raise CaseError(src, "training.tp_comm_overlap", f"{spec.target} cannot overlap tensor-parallel "
                                                         "collectives with GEMMs; set it false")
    if "recompute_modules" in spec.pins and not support.recompute_modules:
        raise CaseError(src, "search.recompute_modules", f"{spec.target} {support.modules_refusal('a search')}")


def read_search(src: str, data: Any, training: TrainingSpec, model: Optional[ModelSpec] = None,
                num_gpus: Optional[int] = None) -> SearchSpec:
    """The ``search`` section, for a case whose ``training`` has already taken the target
    (:func:`training_for_target`) and whose ``model`` a pinned module set (and whose cluster's
    ``num_gpus`` a pinned expert grid) is checked against."""
    data = read_mapping(src, "search", data if data is not None else {}, SEARCH_KEYS)
    target = training.engine.name
    values: dict[str, Any] = {"target": target,
                              "target_key": "search.target" if "target" in data else "training.engine"}
    if "headroom" in data:
        headroom = read_number(src, "search.headroom", data["headroom"])
        # Above 0.9 a layout would have less than a tenth of the GPU, past 1 minus what lives outside
        # the allocator nothing: 0.999999 gave "fits up to -1.1 GB".
        if not 0 <= headroom <= MAX_HEADROOM:
            raise CaseError(src, "search.headroom", f"expected a fraction from 0 to {MAX_HEADROOM:g}, got {headroom:g}")
        values["headroom"] = headroom
    if "top_k" in data:
        values["top_k"] = read_int(src, "search.top_k", data["top_k"], minimum=0, maximum=MAX_TOP_K)
    if "tp_across_nodes" in data:
        values["tp_across_nodes"] = read_bool(src, "search.tp_across_nodes", data["tp_across_nodes"])
    pins, bounds = _pins(src, data), _bounds(src, data)
    _check_pins_agree(src, pins, bounds)
    if model is not None and not model.is_moe:
        for name in ("ep", "etp"):
            if pins.get(name, 1) > 1 or (bounds.get(name, (None, None))[0] or 1) > 1:
                raise CaseError(src, f"search.{name}" if name in pins else f"search.min_{name}",
                                "expert parallelism needs a mixture of experts (model.num_experts)")
    if model is not None and model.is_moe:
        _check_expert_pins(src, pins, model, num_gpus)
    _check_context_pins(src, pins, training, num_gpus)
    spec = SearchSpec(pins=pins, bounds=bounds, **values)
    if target != "any":  # a case that names no engine is checked for each engine plan decides between (retarget)
        check_training_for_engine(src, spec, training)
    if "recompute_modules" in pins and ENGINES[target].support.recompute_modules:
        refusals = recompute_module_refusals(model, training, pins["recompute_modules"]) if model else []
        if refusals:
            raise CaseError(src, "search.recompute_modules", f"{target} cannot run it: {refusals[0]}")
    return spec


def _check_expert_pins(src: str, pins: dict[str, Any], model: ModelSpec, num_gpus: Optional[int]) -> None:
    """A pinned ep or etp no layout of the model can take is the case's error, named as
    ``layout.ep`` is (cost_models.job's checks: ep divides the experts, etp the expert width, the
    grid etp·ep folds over tp·cp·dp and so divides the GPUs), not the search's "no layout meets
    the search section's ep"."""
    ep = pins.get("ep")
    if ep is not None and model.num_experts % ep:
        raise CaseError(src, "search.ep", f"must divide num_experts {model.num_experts}, got {ep}")
    etp = pins.get("etp")
    if etp is not None and model.moe_ffn_hidden_size % etp:
        raise CaseError(src, "search.etp", f"must divide moe_ffn_hidden_size {model.moe_ffn_hidden_size}, got {etp}")
    if num_gpus is not None and (ep or etp) and num_gpus % ((ep or 1) * (etp or 1)):
        raise CaseError(src, "search.ep" if ep else "search.etp",
                        f"etp·ep = {etp or 1}·{ep or 1} must divide the cluster's {num_gpus} GPUs (the expert "
                        "grid folds over the same GPUs as tp·cp·dp)")


def _check_context_pins(src: str, pins: dict[str, Any], training: TrainingSpec, num_gpus: Optional[int]) -> None:
    """A pinned cp no layout can take is the case's error, named as ``layout.cp`` is (the layout
    section's tp·pp·cp dividing the GPUs, cost_models.job's sequence split), not the search's "no
    layout meets the search section's cp", which names neither. ``num_gpus`` None (`size`, which
    tries several counts) holds no pin to a count."""
    cp = pins.get("cp")
    if cp is None:
        return
    tp, pp = pins.get("tp", 1), pins.get("pp", 1)
    if num_gpus is not None and num_gpus % (tp * pp * cp):
        raise CaseError(src, "search.cp", f"tp·pp·cp = {tp}·{pp}·{cp} = {tp * pp * cp} must divide the cluster's "
                                          f"{num_gpus} GPUs")
    refusal = context_parallel_sequence_refusal(training.seq_len, cp)
    if refusal:
        raise CaseError(src, "search.cp", refusal)


def _check_pins_agree(src: str, pins: dict[str, Any], bounds: dict[str, tuple]) -> None:
    """Pins and bounds no layout can hold together are the case's error (exit 2), not a search that
    finds nothing and answers that nothing fits (exit 3, its advice about memory)."""
    def most(name: str) -> Optional[int]:  # the largest value the section allows, where it says
        return pins.get(name, bounds.get(name, (None, None))[1])

    for name, (low, high) in bounds.items():
        if name in pins and not ((low is None or low <= pins[name]) and (high is None or pins[name] <= high)):
            side = "min" if low is not None and pins[name] < low else "max"
            raise CaseError(src, f"search.{name}", f"pins {pins[name]}, outside search.{side}_{name} "
                                                   f"({low if side == 'min' else high})")
    if pins.get("vpp", 1) > 1 and most("pp") == 1:
        raise CaseError(src, "search.vpp", f"pins {pins['vpp']} model chunks per stage, but interleaving needs pp > 1 "
                                           "and the search section allows pp 1 only")
    if pins.get("sequence_parallel") and most("tp") == 1:
        raise CaseError(src, "search.sequence_parallel", "needs tp > 1, and the search section allows tp 1 only")
    if pins.get("offload_params") and (most("zero_stage") is not None and most("zero_stage") < 3
                                       or pins.get("zero_stage", 3) != 3):
        raise CaseError(src, "search.offload_params", "needs zero_stage 3 (only sharded parameters live off the "
                                                      "GPU), which the search section rules out")


def _pins(src: str, data: dict) -> dict[str, Any]:
    pins: dict[str, Any] = {}
    for name in PINNABLE:
        if name not in data:
            continue
        key = f"search.{name}"
        if name in ("sequence_parallel", "offload_params"):
            pins[name] = read_bool(src, key, data[name])
        elif name == "offload_optimizer":
            pins[name] = read_number(src, key, data[name])
            if not 0 <= pins[name] <= 1:
                raise CaseError(src, key, f"expected a fraction in [0, 1], got {pins[name]}")
        elif name == "recompute":
            pins[name] = canonical_choice(read_str(src, key, data[name]), RECOMPUTE)
            if pins[name] not in RECOMPUTE:
                raise CaseError(src, key, f"expected none, selective or full, got {pins[name]!r}")
        elif name == "recompute_modules":
            pins[name] = _modules(src, key, data[name])
        elif name == "recompute_num_layers":
            pins[name] = read_recompute_layers(src, key, data[name])
        else:
            pins[name] = read_int(src, key, data[name],
                                  minimum=0 if name in ("zero_stage", "offload_activations")
                                  else 1)
    if "recompute_modules" in pins:  # modules are selective recomputation's
        if pins.setdefault("recompute", "selective") != "selective":
            raise CaseError(src, "search.recompute_modules", f"applies only with recompute: selective, but "
                                                             f"search.recompute is {pins['recompute']}")
    if "zero_stage" in pins and pins["zero_stage"] not in ZERO_STAGES:
        raise CaseError(src, "search.zero_stage", f"expected 0, 1, 2 or 3, got {pins['zero_stage']}")
    if "recompute_num_layers" in pins:  # layers recomputed in full: full recomputation's
        if pins.setdefault("recompute", "full") != "full":
            raise CaseError(src, "search.recompute_num_layers", f"applies only with recompute: full, but "
                                                                f"search.recompute is {pins['recompute']}")
    return pins


def read_module_names(src: str, key: str, value: Any) -> tuple[str, ...]:
    """A list of megatron-core module names (``layout.recompute_modules``, ``search.recompute_modules``)
    as a tuple of strings, each in megatron-core's spelling where it names one in any letter case
    (as the case's other choices read); ``Layout`` refuses the others."""
    if not isinstance(value, list):
        raise CaseError(src, key, f"expected a list of module names ({', '.join(RECOMPUTE_MODULES)}), "
                                  f"got {describe(value)}")
    return tuple(canonical_choice(read_str(src, key, m), RECOMPUTE_MODULES) for m in value)


def _modules(src: str, key: str, value: Any) -> tuple[str, ...]:
    """A pinned module set, checked as ``Layout.recompute_modules`` checks one."""
    modules = read_module_names(src, key, value)
    try:
        Layout(recompute="selective", recompute_modules=modules)
    except SpecError as error:
        raise CaseError(src, key, error.message) from None
    return modules


def _bounds(src: str, data: dict) -> dict[str, tuple]:
    bounds: dict[str, tuple] = {}
    for name in BOUNDED:
        least = 0 if name == "zero_stage" else 1  # every other degree is a count of at least one
        # ZeRO's stages, as the pin's; a degree is at most the GPUs a case may have, a micro-batch the
        # global batch (min_pp 2^62 was refused as no layout meeting "the search section's pp")
        most = max(ZERO_STAGES) if name == "zero_stage" else MAX_GLOBAL_BATCH if name == "micro_batch_size" \
            else MAX_GPUS
        low = read_int(src, f"search.min_{name}", data[f"min_{name}"], minimum=least, maximum=most) \
            if f"min_{name}" in data else None
        high = read_int(src, f"search.max_{name}", data[f"max_{name}"], minimum=least, maximum=most) \
            if f"max_{name}" in data else None
        if low is not None and high is not None and low > high:
            raise CaseError(src, f"search.min_{name}", f"must not exceed max_{name} ({high}), got {low}")
        if low is not None or high is not None:
            bounds[name] = (low, high)
    return bounds
