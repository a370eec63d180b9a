"""Reads an existing Megatron-LM argument list or launch script into a layout, for `diagnose`
(the counterpart of :mod:`planner.engines.megatron.emit`): contradictions are a
:class:`planner.errors.CaseError` naming the file and the flag."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from cost_models.quantization import FP8_RECIPES
from cost_models.parameters import padded_vocab
from cost_models.partition import chunk_layers, rank_chunks, virtual_stage_layers
from cost_models.specs import Job, Layout, SpecError
from cost_models.stage_time import cp_runs_all_to_all

from planner.case import case_message
from planner.engines.megatron.engine import BEHAVIOUR
from planner.engines.megatron.emit import (ACCOUNT_FLAGS, FLAG_OF_FIELD, FSDP_STRATEGIES, lacks_multicast,
                                          one_connection_asserted)
from planner.engines.megatron.launch import (NEMO_SECTIONS, NPROC_WORDS, TORCHRUN, environment_value, flags_of,
                                           launch_of, torchrun_world, with_included_args)
from planner.errors import CaseError, one_line
from planner.inputs import read_text
from planner.limits import MAX_EXPANDED_CHARS, MAX_INT, MAX_LAYERS, MAX_ROPE_BASE, MAX_VOCAB


def _repeat(pattern: str, text: str) -> str:
    """``text`` with every ``X*n`` of ``pattern`` written out, refused past MAX_EXPANDED_CHARS."""
    length = len(text)
    for match in re.finditer(pattern, text):
        count = match.group(2)
        if len(count) > len(str(MAX_EXPANDED_CHARS)):
            raise ValueError(f"repeat count {one_line(count, 20)} is past the bound of {MAX_EXPANDED_CHARS:,}")
        length += len(match.group(1)) * int(count) - len(match.group(0))
        if length > MAX_EXPANDED_CHARS:
            raise ValueError(f"expands past {MAX_EXPANDED_CHARS:,} characters")
    return re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)


def parse_layout_string(text: str, pp: int, mtp: int = 0) -> list[int]:
    """Transformer layers per virtual stage of a ``--pipeline-model-parallel-layout`` (Megatron's
    ``PipelineParallelLayerLayout.parse_str_to_list``), whose last stage holds the ``mtp``
    multi-token prediction layers (``m``) where the model has them: the cost model runs them on
    the last pipeline stage, Megatron's placement without a layout. Raises ValueError on what it
    cannot read."""
    text = text.replace(",", "")
    text = _repeat(r"\(([^)]+)\)\*(\d+)", text)
    text = _repeat(r"(.)\*(\d+)", text)
    entries = text.split("|")
    if len(entries) % pp:
        raise ValueError(f"{len(entries)} stages do not divide by --pipeline-model-parallel-size {pp}")
    for entry in entries:
        bad = set(entry) - set("ELtm")
        if bad:
            raise ValueError(f"unsupported layer character(s) {''.join(sorted(bad))!r} "
                             "(only E, L, t and m are modelled)")
    flat = "".join(entries)
    if flat.count("E") != 1 or flat.count("L") != 1 or not flat.startswith("E") or not flat.endswith("L"):
        raise ValueError("expected one E at the start and one L at the end")
    if flat.count("m") != mtp:
        raise ValueError(f"holds {flat.count('m')} multi-token prediction layers (m), the case's model "
                         f"{mtp} (model.mtp_layers)")
    if mtp and entries[-1].count("m") != mtp:
        raise ValueError("multi-token prediction layers (m) are modelled on the last stage only, with the loss (L)")
    return [entry.count("t") for entry in entries]


# TransformerConfig's attention_dropout and hidden_dropout where the arguments give none.
MEGATRON_DROPOUT = 0.1


def read_precision(flags: dict) -> Optional[tuple[str, Optional[str]]]:
    """(training.precision, fp8_recipe) a Megatron argument list trains in; None where it says nothing."""
    if flags.get("--fp4-format"):
        return "nvfp4", None
    if flags.get("--fp8-format"):
        recipe = flags.get("--fp8-recipe") or "delayed"  # TransformerConfig.fp8_recipe's default
        return ("mxfp8", None) if recipe == "mxfp8" else ("fp8", recipe)
    if "--fp16" in flags:
        return "fp16", None
    if "--bf16" in flags:
        return "bf16", None
    return None


def read(path: Path, case) -> Layout:
    """The layout of a Megatron-LM argument list or launch script, checked against ``case``."""
    path = Path(path)
    src = str(path)
    text = read_text(path)
    included = with_included_args(text, path)
    if NEMO_SECTIONS.search(included) and "--" not in included:
        raise CaseError(src, "", "this is a NeMo config (YAML with trainer and model sections), not a Megatron-LM "
                                 "argument list: give the arguments its launch passes to pretrain_gpt.py")
    if text.lstrip("\ufeff \t\r\n").startswith(("{", "[")):
        try:
            json.loads(text.lstrip("\ufeff"))
        except ValueError:
            pass
        else:
            raise CaseError(src, "", "not a Megatron-LM argument list (it is JSON: a DeepSpeed ds_config? give it to "
                                     "diagnose as --config FILE); expected the arguments its launch passes to "
                                     "pretrain_gpt.py, or the launch script")
    launch = launch_of(path, text)
    try:
        flags = flags_of(launch.words, src, launch.shell)
        _check_ramp(src, launch.words, flags)
        _check_overlaps(src, flags)
        _check_one_precision(src, flags)
        _check_connections(src, flags, launch.environment)
        _check_attention_environment(src, flags, launch.environment)
        layout = _layout(src, flags, case)
        _check_connections_for_parallelism(src, flags, launch.environment, layout.tp, layout.cp, case.cluster.gpu)
        _check_multicast_skip(src, flags, launch.environment, case.cluster.gpu)
        return layout
    except CaseError as error:
        raise launch.explain(error) from None


def _check_ramp(src: str, words: list[str], flags: dict) -> None:
    """A batch ramp-up with iteration-based training, refused as validate_args refuses it
    (megatron/training/arguments.py: "expected no batch-size rampup for iteration-based training";
    the ramp counts samples): the launch would stop before its first step."""
    if "--rampup-batch-size" in flags and any(w.partition("=")[0].replace("_", "-") == "--train-iters"
                                              for w in words):
        raise CaseError(src, "--rampup-batch-size", "ramps the batch up by samples, and --train-iters trains by "
                                                    "iterations: Megatron-LM refuses the two together (validate_args: "
                                                    "expected no batch-size rampup for iteration-based training); "
                                                    "give --train-samples with the ramp-up, or no ramp-up")


def _check_connections(src: str, flags: dict, environment: tuple) -> None:
    """CUDA_DEVICE_MAX_CONNECTIONS=1 in the environment a launch script gives the training, under
    Megatron-FSDP or torch FSDP2, refused as validate_args refuses it (megatron/training/arguments.py
    at core_v0.16.1, 622-623 under --use-torch-fsdp2 and 687-688 under --use-megatron-fsdp: "FSDP
    always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one"; core_v0.19.0 1014 and 1143):
    the run would not start. Megatron-LM's own FSDP scripts unset it; the others export it as 1. A 1 the
    script sets without export reaches the training only where the caller exports the name: the other
    case passes, so it is said in a note (:func:`connection_notes`), not refused."""
    fsdp = next((flag for flag in _FSDP_FLAGS if flag in flags), None)
    value = _connections_setting(environment)
    if fsdp is None or value is None or value[0] != "1" or value[2]:
        return  # set without export (value[2]): 1 only where the caller exports it, said in connection_notes
    how = "" if value[1] else (" (as the script sets it where the caller's environment leaves it unset, its "
                               "${CUDA_DEVICE_MAX_CONNECTIONS:-1} default)")
    raise CaseError(src, "CUDA_DEVICE_MAX_CONNECTIONS",
                    f"is 1 in the training's environment{how}, and {fsdp} refuses it: Megatron-LM's validate_args "
                    "asserts that FSDP runs with more than one connection, so the run would not start; unset it for "
                    "FSDP, as Megatron-LM's examples/megatron_fsdp scripts do")


_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
_FSDP_FLAGS = ("--use-megatron-fsdp", "--use-torch-fsdp2")
_MOE_OVERLAP = "--overlap-moe-expert-parallel-comm"


def _connections_setting(environment: tuple) -> Optional[tuple[Optional[str], bool, bool]]:
    """(value, decided, conditional) of CUDA_DEVICE_MAX_CONNECTIONS in the training's environment as the
    script leaves it (value None: the script unsets it; conditional: set without export, the value where the
    caller exports the name, absent where not), None where the script does not mention it."""
    return environment_value(environment, _CONNECTIONS)


def _asserts_one_connection(flags: dict, tp: int, cp: int, gpu) -> bool:
    """Whether validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS == "1" for this launch on ``gpu``
    (emit.one_connection_asserted, which the emitter's connections_line follows too)."""
    return one_connection_asserted(tp, cp, fsdp=any(flag in flags for flag in _FSDP_FLAGS),
                                   moe_overlap=_MOE_OVERLAP in flags,
                                   arch_major=getattr(gpu, "compute_capability_major", None))


def _check_connections_for_parallelism(src: str, flags: dict, environment: tuple, tp: int, cp: int, gpu) -> None:
    """CUDA_DEVICE_MAX_CONNECTIONS set to another value than 1 (or unset) by a launch script whose tp or
    cp is past 1, on a GPU before Blackwell (compute capability major below 10), without FSDP or
    --overlap-moe-expert-parallel-comm: validate_args asserts it is "1" (megatron/training/arguments.py:
    927-953 at core_v0.16.1, 1413-1439 at core_v0.19.0), so the run would not start. Only what the script
    decides is refused; a value it takes from the caller's environment (${X:-32}, $X) is said in a note
    (:func:`connection_notes`), as is a script that does not mention the variable. A value other than 1 set
    without export is refused too: the training gets it where the caller exports the name, and nothing
    where not, and neither is 1."""
    setting = _connections_setting(environment)
    if setting is None or not setting[1] or setting[0] == "1" or not _asserts_one_connection(flags, tp, cp, gpu):
        return
    value, _, conditional = setting
    said = ("unset in the training's environment (the script unsets it, or makes it an array, which bash "
            "does not export)") if value is None else \
        f"{one_line(value, 20)!r} in the training's environment (the script sets it so)"
    if conditional:  # neither case is 1: both break the assertion
        said = (f"{one_line(value, 20)!r} in the training's environment where the caller exports it, and absent "
                "where the caller does not (the script sets it without export, and bash passes a variable on only "
                "where it is exported: Bash Reference Manual, 3.7.4 Environment) — not 1 either way")
    degrees = " and ".join(f"{name} {degree}" for name, degree in (("tp", tp), ("cp", cp)) if degree > 1)
    raise CaseError(src, _CONNECTIONS,
                    f"is {said}, and with {degrees} on {gpu.name} (device major "
                    f"{gpu.compute_capability_major}, below Blackwell's 10) Megatron-LM's validate_args asserts "
                    "it is 1 (megatron/training/arguments.py: \"Using tensor model parallelism or context parallelism "
                    "require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1\"), so the run would "
                    "not start; export CUDA_DEVICE_MAX_CONNECTIONS=1 (only --use-megatron-fsdp, --use-torch-fsdp2 or "
                    "--overlap-moe-expert-parallel-comm lift the assertion to a warning)")


def connection_notes(path: Path, case) -> list[str]:
    """A launch script with tp or cp > 1 on a GPU before Blackwell, where validate_args asserts
    CUDA_DEVICE_MAX_CONNECTIONS=1, that does not decide the variable (does not mention it, or takes it
    from the caller's environment): the caller must set it, said in a note. Not for an argument list,
    whose environment is the launcher's (the planner's launch.sh exports it)."""
    path = Path(path)
    launch = launch_of(path, read_text(path))
    if not launch.shell:
        return []
    try:
        flags = flags_of(launch.words, launch.src, launch.shell)
        args = _Args(launch.src, flags)
        tp, cp = args.integer("--tensor-model-parallel-size", 1), args.integer("--context-parallel-size", 1)
    except CaseError:
        return []  # refused as the layout is read
    return (_parallelism_connection_notes(path, flags, launch.environment, tp, cp, case.cluster.gpu)
            + _expert_overlap_connection_notes(path, flags, launch.environment, case.cluster.gpu)
            + _multicast_skip_notes(path, flags, launch.environment, case.cluster.gpu)
            + _unexported_setting_notes(path, flags, launch.environment))


def _expert_overlap_connection_notes(path: Path, flags: dict, environment: tuple, gpu) -> list[str]:
    """--overlap-moe-expert-parallel-comm in a launch whose script gives the training
    CUDA_DEVICE_MAX_CONNECTIONS=1 (exported, decided): the experts' dispatch and combine the estimate
    hides behind the other micro-batch's compute (training.moe_comm_overlap) do not run beside it, as
    megatron-core's MoE README requires more than one connection for that overlap ("Requirements for EP
    A2A Overlap: expert_model_parallel_size > 1, CUDA_DEVICE_MAX_CONNECTIONS > 1") and validate_args warns
    that one connection gives the priority to tensor and context parallelism. Said, not refused: the run
    starts. Only on NVIDIA GPUs, whose CUDA runtime reads the variable (ROCm's HIP does not)."""
    setting = _connections_setting(environment)
    if _MOE_OVERLAP not in flags or getattr(gpu, "vendor", "nvidia") != "nvidia" \
            or setting is None or setting != ("1", True, False):
        return []
    return [f"{path.name} gives the training {_CONNECTIONS}=1 with {_MOE_OVERLAP}: the experts' dispatch and combine it "
            "overlaps with the other micro-batch's compute, which the estimate hides, share one hardware queue with "
            f"that compute and do not run beside it (megatron-core's MoE README requires {_CONNECTIONS} > 1 for "
            "the overlap; validate_args warns that 1 gives tensor and context parallelism the priority); export "
            "8, or 32 with DeepEP, as Megatron-Bridge's PerfEnvPlugin does (--tp-comm-overlap still runs there)"]


_SKIP_MULTICAST = "UB_SKIPMC"


def _skips_multicast(value: Optional[str]) -> bool:
    """Whether Transformer Engine's initialize_ub takes ``value`` of UB_SKIPMC as leaving CUDA multicast
    off: ``bool(int(os.getenv("UB_SKIPMC", "0")))`` (transformer_engine/pytorch/module/base.py), so a
    non-zero integer; a word int() refuses stops the run there too (ValueError)."""
    try:
        return value is not None and int(value) != 0
    except ValueError:
        return False


def _multicast_skip_asked(flags: dict, gpu) -> bool:
    """--tp-comm-overlap on a GPU known to have no CUDA multicast (emit.lacks_multicast), where
    Transformer Engine's initialize_ub raises unless UB_SKIPMC is a non-zero integer."""
    return "--tp-comm-overlap" in flags and lacks_multicast(gpu) is True


def _multicast_rule(gpu) -> str:
    """Why UB_SKIPMC must be a non-zero integer for --tp-comm-overlap on ``gpu``, in the words of a message."""
    return (f"--tp-comm-overlap on {gpu.name} (compute capability {gpu.compute_capability_major}, without the CUDA "
            "multicast of Hopper's 9 on) makes Transformer Engine's initialize_ub raise unless UB_SKIPMC is a "
            "non-zero integer (transformer_engine/pytorch/module/base.py: 'Launch app with UB_SKIPMC=1 to try CUDA "
            "IPC instead')")


def _check_multicast_skip(src: str, flags: dict, environment: tuple, gpu) -> None:
    """UB_SKIPMC that the launch script decides to anything but a non-zero integer (unset, 0, a word), with
    --tp-comm-overlap on a GPU without CUDA multicast: Transformer Engine's initialize_ub raises, so the run
    would not start. Set without export, a value that is not one fails either way (the caller's export
    gives it, no export gives nothing). What the script leaves to the caller is said in a note
    (:func:`_multicast_skip_notes`)."""
    setting = environment_value(environment, _SKIP_MULTICAST)
    if setting is None or not setting[1] or _skips_multicast(setting[0]) or not _multicast_skip_asked(flags, gpu):
        return
    value, _, conditional = setting
    said = "unset in the training's environment (the script unsets it)" if value is None else \
        f"{one_line(value, 20)!r} in the training's environment" + (
            " where the caller exports it, and absent where not (the script sets it without export)"
            if conditional else " (the script sets it so)")
    raise CaseError(src, _SKIP_MULTICAST, f"is {said}, and {_multicast_rule(gpu)}, so the run would not start; "
                                          "export UB_SKIPMC=1")


def _multicast_skip_notes(path: Path, flags: dict, environment: tuple, gpu) -> list[str]:
    """The note for a launch script with --tp-comm-overlap on a GPU without CUDA multicast that leaves
    UB_SKIPMC to the caller (does not set it, takes it from the caller's environment, or sets a non-zero
    integer without export): the run starts only where the caller exports it."""
    setting = environment_value(environment, _SKIP_MULTICAST)
    left = setting is None or not setting[1] or (setting[2] and _skips_multicast(setting[0]))
    if not left or not _multicast_skip_asked(flags, gpu):
        return []
    how = "does not set UB_SKIPMC" if setting is None else \
        "sets UB_SKIPMC without export" if setting[1] else "takes UB_SKIPMC from the caller's environment"
    return [f"{path.name} {how}: {_multicast_rule(gpu)}, so the run starts only where the caller exports "
            "UB_SKIPMC=1 (the planner's launch.sh exports it)"]


def _parallelism_connection_notes(path: Path, flags: dict, environment: tuple, tp: int, cp: int, gpu) -> list[str]:
    """The note of :func:`connection_notes` for validate_args' assertion of CUDA_DEVICE_MAX_CONNECTIONS=1:
    a script that leaves the variable to the caller (does not set it, takes it from the caller's
    environment, or sets 1 without export, which reaches the training only where the caller exports it)."""
    setting = _connections_setting(environment)
    left = setting is None or not setting[1] or (setting[2] and setting[0] == "1")
    if not left or not _asserts_one_connection(flags, tp, cp, gpu):
        return []
    degrees = " and ".join(f"{name} {degree}" for name, degree in (("tp", tp), ("cp", cp)) if degree > 1)
    if setting is None:
        how = "does not set CUDA_DEVICE_MAX_CONNECTIONS"
    elif setting[1]:
        how = ("sets CUDA_DEVICE_MAX_CONNECTIONS=1 without export, which the training gets only where the caller's "
               "environment exports the name, and otherwise nothing (Bash Reference Manual, 3.7.4 Environment); "
               "read as the caller exporting it")
    elif setting[2]:  # set without export, to what the script does not decide (read X from a pipe, X=${Y:-32})
        how = ("sets CUDA_DEVICE_MAX_CONNECTIONS without export to a value the reading could not decide (read as "
               f"{one_line(setting[0] or '', 20)!r}; see the note of the line that sets it), which the training gets "
               "only where the caller's environment exports the name")
    else:
        how = f"takes CUDA_DEVICE_MAX_CONNECTIONS from the caller's environment (read as {one_line(setting[0] or '', 20)!r})"
    return [f"{path.name} {how}: Megatron-LM needs CUDA_DEVICE_MAX_CONNECTIONS=1 in the training's environment for "
            f"{degrees} on {gpu.name} (device major {gpu.compute_capability_major}, below Blackwell's 10; "
            "validate_args asserts it), so the run starts only where the caller exports it"]


def _unexported_setting_notes(path: Path, flags: dict, environment: tuple) -> list[str]:
    """A value set without export that breaks a rule only where the caller exports its name (the training
    gets nothing otherwise, which passes): CUDA_DEVICE_MAX_CONNECTIONS=1 under FSDP, an NVTE_* attention
    switch its --attention-backend does not set. Said, read as the caller not exporting it."""
    said = []
    fsdp = next((flag for flag in _FSDP_FLAGS if flag in flags), None)
    setting = _connections_setting(environment)
    if fsdp is not None and setting is not None and setting[2] and setting[0] == "1":
        said.append(f"{path.name} sets {_CONNECTIONS}=1 without export: where the caller's environment exports the "
                    f"name the training gets 1, which {fsdp} refuses (validate_args), and otherwise nothing, which it "
                    "takes (Bash Reference Manual, 3.7.4 Environment); read as the caller not exporting it")
    backend = (flags.get("--attention-backend") or "auto").lower()
    for name, expected in zip(ATTENTION_SWITCHES, _SWITCHES_OF_BACKEND.get(backend, ())):
        value = environment_value(environment, name)
        if value is not None and value[2] and value[0] is not None and value[0] != expected:
            said.append(f"{path.name} sets {name}={one_line(value[0], 20)} without export: where the caller's "
                        f"environment exports the name the training gets it, which megatron-core refuses with "
                        f"--attention-backend {backend} (it expects it unset or {expected}), and otherwise nothing, "
                        "which it takes (Bash Reference Manual, 3.7.4 Environment); read as the caller not exporting it")
    return said


# The Transformer Engine attention switches megatron-core sets for each --attention-backend, asserting
# that the environment holds none of them otherwise (LanguageModule._set_attention_backend,
# megatron/core/models/common/language_module/language_module.py:92-126 at core_v0.16.1, 108-142 at
# core_v0.19.0): (NVTE_FLASH_ATTN, NVTE_FUSED_ATTN, NVTE_UNFUSED_ATTN).
ATTENTION_SWITCHES = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")
_SWITCHES_OF_BACKEND = {"local": ("0", "0", "0"), "flash": ("1", "0", "0"), "fused": ("0", "1", "0"),
                        "unfused": ("0", "0", "1"), "auto": ("1", "1", "1")}


def _check_attention_environment(src: str, flags: dict, environment: tuple) -> None:
    """An NVTE_FLASH_ATTN, NVTE_FUSED_ATTN or NVTE_UNFUSED_ATTN the launch script puts in the training's
    environment at another value than its --attention-backend sets (older scripts' export NVTE_FUSED_ATTN=0
    beside the default auto), refused: megatron-core asserts it as it builds the model, so the run would
    not start."""
    backend = (flags.get("--attention-backend") or "auto").lower()
    if backend not in _SWITCHES_OF_BACKEND:
        return  # refused where the model is checked, naming the flag
    held = {name: (value, decided) for name, value, decided, conditional in environment if not conditional}
    for name, expected in zip(ATTENTION_SWITCHES, _SWITCHES_OF_BACKEND[backend]):
        # one set without export (conditional) is absent where the caller does not export it: said, not refused
        if name in held and held[name][0] is not None and held[name][0] != expected:
            value, decided = held[name]
            said = f"--attention-backend {backend}" if "--attention-backend" in flags else \
                "--attention-backend absent (Megatron-LM's default, auto)"
            how = "" if decided else " (a default the script gives where the caller's environment leaves it unset)"
            raise CaseError(src, name, f"is {one_line(value, 20)!r} in the training's environment{how}, and with "
                                       f"{said} megatron-core expects it unset or {expected}: it asserts so as it "
                                       "builds the model (LanguageModule._set_attention_backend), so the run would not "
                                       "start; choose the kernel with --attention-backend, not NVTE_* variables")


def _check_one_precision(src: str, flags: dict) -> None:
    """--fp16 and --bf16 together, refused as validate_args refuses them (megatron/training/arguments.py:702-703
    and 711-712 at core_v0.16.1: assert not args.bf16 under args.fp16): the run would not start, and
    read_precision took --fp16 for it."""
    if "--fp16" in flags and "--bf16" in flags:
        raise CaseError(src, "--fp16", "given with --bf16: Megatron-LM refuses both together (validate_args asserts "
                                       "not both), and the run would not start; expected one of them")


def _check_overlaps(src: str, flags: dict) -> None:
    """--overlap-param-gather as validate_args takes it (megatron/training/arguments.py): only with the
    distributed optimizer or Megatron-FSDP, and only beside --overlap-grad-reduce. A user who takes
    --use-distributed-optimizer or --overlap-grad-reduce out of the planner's files leaves it behind,
    and the launch stops before its first step."""
    if "--overlap-param-gather" not in flags:
        return
    if not {"--use-distributed-optimizer", "--use-megatron-fsdp", "--use-custom-fsdp"} & set(flags):
        raise CaseError(src, "--overlap-param-gather", "needs --use-distributed-optimizer or --use-megatron-fsdp: "
                                                       "Megatron-LM refuses it without (validate_args), and the run "
                                                       "would not start")
    if "--overlap-grad-reduce" not in flags:
        raise CaseError(src, "--overlap-param-gather", "needs --overlap-grad-reduce beside it: Megatron-LM refuses it "
                                                       "alone (validate_args: \"Must use --overlap-param-gather with "
                                                       "--overlap-grad-reduce\"), and the run would not start")


_SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def scheduled_batch(src: str, schedule: str) -> int:
    """The global batch a --step-batch-size-schedule reaches: the batch of its last threshold
    ("THRESHOLD:BATCH ...", K/M/B/T suffixes; megatron/core/num_microbatches_calculator.py,
    StepBatchsizeNumMicroBatchesCalculator: its global_batch_size is the last entry's)."""
    def number(text: str) -> float:
        text = text.strip().upper()
        scale = _SUFFIXES.get(text[-1:], 1)
        value = float(text[:-1] if scale > 1 else text)
        if not math.isfinite(value) or value < 0:
            raise ValueError(text)
        return value * scale

    steps = []
    for entry in schedule.replace(",", " ").split():
        try:
            threshold, batch = entry.split(":", 1)
            steps.append((number(threshold), int(number(batch))))
        except ValueError:
            raise CaseError(src, "--step-batch-size-schedule", f"expected THRESHOLD:BATCH entries, got "
                                                               f"{one_line(entry, 40)!r}") from None
    if not steps or max(steps)[1] < 1:
        raise CaseError(src, "--step-batch-size-schedule", f"expected THRESHOLD:BATCH entries, got "
                                                           f"{one_line(schedule, 60)!r}")
    return max(steps)[1]


@dataclass(frozen=True)
class _Args:
    """A Megatron-LM argument list as read ({flag: value, or None for a switch}), for one file."""

    src: str
    flags: dict

    def integer(self, flag: str, default: Optional[int] = None) -> Optional[int]:
        if flag not in self.flags:
            return default
        value = self.flags[flag]
        digits = (value or "").strip()
        # What argparse's type=int takes: int() reads a sign, digits and single underscores between them
        # (PEP 515: `1_024` is 1024 to Megatron-LM), not a float or hex.
        if not re.fullmatch(r"[+-]?\d+(?:_\d+)*", digits):
            raise CaseError(self.src, flag, f"expected an integer, got {value!r}")
        if len(digits.lstrip("+-").replace("_", "")) > len(str(MAX_INT)) or int(digits) > MAX_INT:
            raise CaseError(self.src, flag, f"expected an integer <= {MAX_INT}, got {digits}")
        number = int(digits)
        if number < (0 if flag in ("--recompute-num-layers", "--cpu-offloading-num-layers") else 1):
            raise CaseError(self.src, flag, f"expected a positive integer, got {number}")
        return number

    def number(self, flag: str) -> Optional[float]:
        """A flag's finite number (argparse's type=float), None where absent."""
        value = self.flags.get(flag)
        if value is None:
            return None
        try:
            number = float(value)
        except ValueError:
            raise CaseError(self.src, flag, f"expected a number, got {value!r}") from None
        if not math.isfinite(number):
            raise CaseError(self.src, flag, f"expected a finite number, got {value!r}")
        return number


def _layout(src: str, flags: dict, case) -> Layout:
    """The layout the arguments run, checked against ``case`` as Megatron-LM's validate_args and
    TransformerConfig check them: the world, the model, the degrees, the batch, the pipeline, the
    optimizer's sharding, recomputation and offload."""
    args = _Args(src, flags)
    model, training, num_gpus = case.model, case.training, case.cluster.num_gpus
    _check_world(args, num_gpus, case.cluster.gpu.gpus_per_node)
    _check_model(args, model, training)
    tp, pp, cp, dp = _degrees(args, model, num_gpus)
    micro, global_batch = _batch(args, training, dp)
    pipeline = _pipeline(args, model, pp, micro, dp, global_batch)
    vpp, stage_layers = pipeline.vpp, pipeline.stage_layers
    zero = _zero_stage(args)
    # Sequence parallelism: validate_args turns it off when tp is 1.
    sequence_parallel = "--sequence-parallel" in flags and tp > 1
    recompute, modules, recompute_layers = _recompute(args, vpp, stage_layers or (model.num_layers // pp,))
    offload_optimizer, offload_activations = _offload(args)
    try:
        experts = {}
        if not model.is_moe and args.integer("--expert-model-parallel-size", 1) > 1:
            raise CaseError(args.src, "--expert-model-parallel-size",
                            "needs a mixture of experts, and the case's model is dense (megatron-core: "
                            "num_moe_experts must be non None to use expert-parallel)")
        if model.is_moe:  # megatron-core's default expert tensor parallel size is tp
            experts = {"ep": args.integer("--expert-model-parallel-size", 1),
                       "etp": args.integer("--expert-tensor-parallel-size", tp)}
        layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, micro_batch_size=micro, zero_stage=zero,
                        sequence_parallel=sequence_parallel, recompute=recompute, recompute_modules=modules,
                        recompute_num_layers=recompute_layers, stage_layers=stage_layers, chunk_layers=pipeline.chunk_split,
                        offload_optimizer=offload_optimizer, offload_activations=offload_activations, **pipeline.accounted,
                        **experts)
        job = Job(case.model, case.cluster, case.training, layout, case.overheads)
    except SpecError as error:
        raise CaseError(args.src, FLAG_OF_FIELD.get(error.field, error.field), case_message(error.message)) from None
    _check_quantized_weights(src, flags, job)
    return layout




def _check_world(args: _Args, num_gpus: int, gpus_per_node: int) -> None:
    """torchrun's world, where the script says it: --nproc-per-node gpu or auto is a process for each
    of the node's GPUs; an elastic --nnodes MIN:MAX is not checked (the job runs on whatever it gets)."""
    nodes_given = "--nnodes" in args.flags
    if "--nproc-per-node" not in args.flags or not (nodes_given or TORCHRUN in args.flags):
        return
    if (args.flags["--nproc-per-node"] or "").strip() not in NPROC_WORDS:
        args.integer("--nproc-per-node")  # a count within its bound
    if nodes_given and ":" not in (args.flags["--nnodes"] or ""):
        args.integer("--nnodes")
    per_node = (args.flags["--nproc-per-node"] or "").strip()
    if per_node not in NPROC_WORDS and int(per_node) > gpus_per_node:
        raise CaseError(args.src, "--nproc-per-node", f"torchrun starts {int(per_node)} processes on each node, but the "
                                                      f"case's nodes have {gpus_per_node} GPUs (cluster.gpus_per_node): "
                                                      f"expected at most {gpus_per_node}")
    world = torchrun_world(args.flags.get("--nnodes"), args.flags["--nproc-per-node"], gpus_per_node)
    if world == num_gpus and per_node not in NPROC_WORDS and int(per_node) < gpus_per_node and world > int(per_node):
        # The GPUs the case prices fill its nodes (launch_nodes); spread over more nodes, a tensor-parallel
        # group of the planned size would cross them, over links the estimate did not price.
        raise CaseError(args.src, "--nproc-per-node", f"torchrun starts {int(per_node)} processes on each of "
                                                      f"{world // int(per_node)} nodes, but the case packs its "
                                                      f"{num_gpus} GPUs {gpus_per_node} to a node "
                                                      f"(cluster.gpus_per_node): give cluster.gpus_per_node: "
                                                      f"{int(per_node)} to price the launch as written")
    if world is None or world == num_gpus:
        return
    if not nodes_given:  # torchrun's --nnodes defaults to 1
        raise CaseError(args.src, "--nnodes", f"absent, so torchrun starts one node of {world} processes "
                                              f"(--nproc-per-node), but the case has {num_gpus} GPUs")
    raise CaseError(args.src, "--nnodes", f"--nnodes x --nproc-per-node = {world} GPUs, but the case has {num_gpus}")


def _check_model(args: _Args, model, training) -> None:
    """The model and precision, where the arguments give them, must be the case's."""
    # The model, where given, must be the case's.
    for flag, expected in (("--num-layers", model.num_layers), ("--hidden-size", model.hidden_size),
                           ("--num-attention-heads", model.num_attention_heads),
                           ("--ffn-hidden-size", model.ffn_hidden_size), ("--seq-length", training.seq_len)):
        value = args.integer(flag)
        if value is not None and value != expected:
            raise CaseError(args.src, flag, f"{value} differs from the case's {expected}")
    positions = args.integer("--max-position-embeddings")
    if positions is not None and positions < training.seq_len:
        # validate_args asserts max_position_embeddings >= seq_length whatever the position embedding
        # (megatron/training/arguments.py, core_v0.16.1 to core_v0.19.0): the run would not start.
        raise CaseError(args.src, "--max-position-embeddings", f"{positions} is below the sequence length "
                                                               f"{training.seq_len}: Megatron-LM's validate_args "
                                                               "asserts max_position_embeddings >= seq_length, and "
                                                               "the run would not start")
    # Widths the estimate prices by, where the list gives them. Multi-latent attention takes its
    # heads' widths from --qk-head-dim, --qk-pos-emb-head-dim and --v-head-dim and never reads
    # --kv-channels (megatron-core's multi_latent_attention.py): Megatron-LM's DeepSeek scripts pass one.
    widths = [("--moe-ffn-hidden-size", model.moe_ffn_hidden_size, "moe_ffn_hidden_size"),
              ("--moe-shared-expert-intermediate-size", model.moe_shared_expert_ffn_hidden_size,
               "moe_shared_expert_ffn_hidden_size"),
              ("--kv-lora-rank", model.kv_lora_rank, "kv_lora_rank")]
    if model.attention_type != "mla":
        widths.append(("--kv-channels", model.head_dim, "head_dim"))
    for flag, expected, key in widths:
        value = args.integer(flag)
        if value is not None and value != expected:
            raise CaseError(args.src, flag, f"{value} differs from the case's {expected} (model.{key})")
    _check_capacity_and_dropout(args, model)
    for flag, expected in (("--num-experts", model.num_experts), ("--moe-router-topk", model.moe_top_k)):
        value = args.integer(flag)
        if value is not None and value != expected:
            raise CaseError(args.src, flag, f"{value} differs from the case's {expected or 'dense model (no experts)'}")
    for flag, expected in (("--moe-router-num-groups", model.moe_router_num_groups),
                           ("--moe-router-group-topk", model.moe_router_group_topk)):
        value = args.integer(flag)
        if value is not None and value != expected:
            raise CaseError(args.src, flag, f"{value} differs from the case's {expected} "
                                       f"(model.{flag[2:].replace('-', '_')}: the expert dispatch is priced by it)")
    _check_moe_defaults(args, model)
    if "--num-experts" in args.flags:
        _check_moe_layers(args, model)
    _check_window(args, model)
    _check_vocab(args, model)
    _check_vocab_padding(args, model)  # a positive integer whose rows a case could hold; otherwise, vocab_padding_note
    base = args.integer("--rotary-base")  # an integer to Megatron-LM (arguments.py: type=int), above 0
    if base is not None and base > MAX_ROPE_BASE:
        raise CaseError(args.src, "--rotary-base", f"expected RoPE's base, at most {MAX_ROPE_BASE:g}, got {base}")
    mtp = args.integer("--mtp-num-layers", 0)
    if mtp != model.mtp_layers:
        said = f"{mtp}" if "--mtp-num-layers" in args.flags else "absent (no multi-token prediction)"
        raise CaseError(args.src, "--mtp-num-layers", f"{said}, but the case's model has {model.mtp_layers} "
                                                 "multi-token prediction layers (model.mtp_layers)")
    groups = args.integer("--num-query-groups")
    if groups is not None and "--group-query-attention" in args.flags and groups != model.num_kv_heads:
        raise CaseError(args.src, "--num-query-groups", f"{groups} differs from the case's {model.num_kv_heads} KV heads")

    # Megatron-LM's --optimizer: adam (decoupled weight decay, as AdamW) by default, or sgd.
    optimizer = args.flags.get("--optimizer") or "adam"
    if optimizer not in ("adam", "sgd"):
        # Muon, Lion, SOAP keep other states than Adam's two moments: not what any case prices.
        raise CaseError(args.src, "--optimizer", f"--optimizer {optimizer}: the planner prices Megatron-LM's adam "
                                                 "and sgd only (training.optimizer), not its states")
    if (optimizer == "sgd") != (training.optimizer == "sgd"):
        said = f"--optimizer {optimizer}" if "--optimizer" in args.flags else "absent (Megatron-LM's default, adam)"
        raise CaseError(args.src, "--optimizer", f"{said}, but the case's optimizer is {training.optimizer} "
                                                 "(training.optimizer: the optimizer states are priced by it)")
    # megatron-core's AttnBackend: unfused (and local, its own) keep the scores; flash, fused and auto
    # (the default) run a kernel that does not, which training.flash_attention prices.
    backend = (args.flags.get("--attention-backend") or "auto").lower()
    if backend not in ATTENTION_BACKENDS:
        raise CaseError(args.src, "--attention-backend", f"expected one of {', '.join(ATTENTION_BACKENDS)}, got "
                                                         f"{backend!r}")
    if (backend not in ("unfused", "local")) != training.flash_attention:
        said = f"--attention-backend {backend}" if "--attention-backend" in args.flags else \
            "absent (Megatron-LM's default, auto: a fused kernel)"
        raise CaseError(args.src, "--attention-backend", f"{said}, but the case says training.flash_attention: "
                                                         f"{str(training.flash_attention).lower()}")
    # One type for every layer, or one a layer (Megatron-LM's --cp-comm-type is nargs='+';
    # TransformerConfig.__post_init__ asserts a list as long as num_layers, and TransformerLayer gives
    # layer i the i-th): the estimate prices one context-parallel exchange for every layer.
    cp_types = (args.flags.get("--cp-comm-type") or "p2p").lower().split() or ["p2p"]
    cp = args.integer("--context-parallel-size", 1)
    if cp > 1 and len(cp_types) not in (1, model.num_layers):
        raise CaseError(args.src, "--cp-comm-type", f"gives {len(cp_types)} types: expected one, or one a layer "
                                                    f"({model.num_layers}): megatron-core's TransformerConfig "
                                                    "refuses another count")
    if cp > 1 and len(set(cp_types)) > 1:
        raise CaseError(args.src, "--cp-comm-type", f"gives the layers different types ({', '.join(sorted(set(cp_types)))}"
                                                    "): Megatron-LM runs them, but the planner prices one "
                                                    "context-parallel exchange for every layer: give one type")
    cp_comm = cp_types[0]
    if cp > 1 and cp_comm not in CP_COMM_TYPES:
        priced = "a2a" if cp_runs_all_to_all(model, training) else "p2p"
        raise CaseError(args.src, "--cp-comm-type", f"{one_line(cp_comm, 40)!r} is none of megatron-core's "
                                                    f"{', '.join(CP_COMM_TYPES)} (TransformerConfig.cp_comm_type; "
                                                    f"Transformer Engine raises on another): expected {priced}, "
                                                    "as priced")
    if cp > 1 and cp_runs_all_to_all(model, training) and cp_comm != "a2a":
        said = f"--cp-comm-type {cp_comm}" if "--cp-comm-type" in args.flags else "absent (Megatron-LM's default, p2p)"
        raise CaseError(args.src, "--cp-comm-type", f"{said}: Transformer Engine runs the model's sliding-window "
                                                    "attention under context parallelism only as a2a (the estimate "
                                                    "prices it so)")
    if cp > 1 and not cp_runs_all_to_all(model, training) and cp_comm != "p2p":
        # The estimate prices the ring (cost_models.stage_time.cp_exposed_per_layer); all_gather waits
        # for the whole K and V, a2a and a2a+p2p trade heads for the sequence: other traffic, other
        # overlap. Read as the ring, they were priced as a launch that does not run them.
        raise CaseError(args.src, "--cp-comm-type", f"{cp_comm}: the estimate prices context parallelism of a "
                                                    "model without a sliding window as megatron-core's p2p ring "
                                                    "(Megatron-LM's default), not this exchange; expected p2p or "
                                                    "absent")
    read = read_precision(args.flags)
    if read is not None:
        precision, recipe = read
        if precision != training.precision:
            flag = {"fp8": "--fp8-format", "mxfp8": "--fp8-recipe", "nvfp4": "--fp4-format", "fp16": "--fp16",
                    "bf16": "--bf16"}[precision]
            raise CaseError(args.src, flag, f"trains in {precision}, but the case's precision is {training.precision}")
        if precision == "fp8" and recipe != training.recipe.name:
            raise CaseError(args.src, "--fp8-recipe", f"scales fp8 {recipe}, but the case's recipe is "
                                                 f"{training.recipe.name} (training.fp8_recipe)")


# megatron-core's context-parallel exchanges (TransformerConfig.cp_comm_type at core_v0.16.1), which
# Transformer Engine's attn_forward_func_with_cp takes; it raises on any other.
CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")


def _check_moe_defaults(args: _Args, model) -> None:
    """The expert flags a list that builds the model (it gives --num-layers, as
    :func:`architecture_notes` reads it) leaves out, read as Megatron-LM's defaults at core_v0.16.1
    and checked as the same value written out is by :func:`_check_model`: refused where it differs
    from the case's model. DeepSeek-V3's list without --moe-ffn-hidden-size builds experts of
    18,432 (9x the case's 2,048) and was priced as the case's without a word. A list without
    --num-experts builds a dense model, and with --expert-model-parallel-size > 1 does not start."""
    if not model.is_moe:
        return
    if "--num-layers" not in args.flags:
        # The layout's flags alone, read for the case's model (as the widths above are read where given):
        # Megatron-LM would refuse such a fragment anyway (arguments.py:796-799, --num-layers required).
        return
    if "--num-experts" not in args.flags and args.integer("--expert-model-parallel-size", 1) > 1:
        # megatron/training/arguments.py:1025-1026 (validate_args)
        raise CaseError(args.src, "--num-experts", "absent, and Megatron-LM refuses --expert-model-parallel-size > 1 "
                                                   "without it (validate_args: \"num_experts must be non None to use "
                                                   "expert model parallelism\"): expected --num-experts "
                                                   f"{model.num_experts} (model.num_experts)")
    if "--num-experts" not in args.flags:
        raise CaseError(args.src, "--num-experts", f"absent (Megatron-LM's default: no experts, a dense model) "
                                                   f"differs from the case's {model.num_experts} (model.num_experts)")
    ffn = args.integer("--ffn-hidden-size")
    if ffn is None:  # megatron/training/arguments.py:802-811: 4h, or 2/3 of it in multiples of 64 with --swiglu
        hidden = args.integer("--hidden-size", model.hidden_size)
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if "--swiglu" in args.flags else 4 * hidden
    defaults = (
        # arguments.py:1016-1017: the experts take --ffn-hidden-size where no width of their own is given
        ("--moe-ffn-hidden-size", ffn, f"--ffn-hidden-size, {ffn}", model.moe_ffn_hidden_size,
         "moe_ffn_hidden_size"),
        # transformer_config.py:578: moe_router_topk = 2
        ("--moe-router-topk", 2, "2", model.moe_top_k, "moe_top_k"),
        # transformer_config.py:534: moe_shared_expert_intermediate_size = None, no shared experts
        ("--moe-shared-expert-intermediate-size", 0, "none, no shared experts",
         model.moe_shared_expert_ffn_hidden_size, "moe_shared_expert_ffn_hidden_size"),
        # transformer_config.py:598 and 614: None, routing over all experts, not group-limited
        ("--moe-router-num-groups", 1, "none, routing not group-limited", model.moe_router_num_groups,
         "moe_router_num_groups"),
        ("--moe-router-group-topk", 1, "none, routing not group-limited", model.moe_router_group_topk,
         "moe_router_group_topk"))
    for flag, default, said, expected, key in defaults:
        if flag not in args.flags and default != expected:
            raise CaseError(args.src, flag, f"absent (Megatron-LM's default: {said}) differs from the case's "
                                            f"{expected or 'none'} (model.{key}: the experts are priced by it)")


ATTENTION_BACKENDS = ("flash", "fused", "unfused", "local", "auto")


def moe_layer_flags(args: _Args, layers: int) -> list[int]:
    """The layers ``--moe-layer-freq`` gives experts (1) or a dense MLP (0), as megatron-core places
    them (``gpt_layer_specs.get_gpt_decoder_block_spec``): an integer k, every layer i with i % k == 0
    (1, Megatron-LM's default: every layer); a Python list expression (``([0]*3+[1]*58)``, which
    Megatron-LM's ``moe_freq_type`` evaluates), its entries. Only lists, integers, + and * are read."""
    import ast

    text = args.flags.get("--moe-layer-freq") or "1"
    expected = f"an integer or a list expression of 0s and 1s such as ([0]*3+[1]*58), got {text[:60]!r}"
    if text.strip().isdigit():
        every = args.integer("--moe-layer-freq", 1)
        return [1 if i % every == 0 else 0 for i in range(layers)]

    def entry(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value in (0, 1):
            return node.value
        raise CaseError(args.src, "--moe-layer-freq", f"expected {expected}")

    def value(node: ast.AST):
        if isinstance(node, (ast.List, ast.Tuple)):  # a list of 0s and 1s, not of lists
            return [entry(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = value(node.left), value(node.right)
            if isinstance(left, list) and isinstance(right, list) and len(left) + len(right) <= MAX_LAYERS:
                return left + right
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            left, right = value(node.left), node.right
            if isinstance(left, list) and isinstance(right, ast.Constant) and type(right.value) is int \
                    and 0 <= right.value and len(left) * right.value <= MAX_LAYERS:
                return left * right.value
        raise CaseError(args.src, "--moe-layer-freq", f"expected {expected}")

    # An argument list's words lose an array's closing parenthesis (NAME=(... --moe-layer-freq ([0]*3+[1]*58)):
    # the expression's own are balanced again.
    text = text.strip()
    text = text + ")" * (text.count("(") - text.count(")")) if text.count("(") > text.count(")") else text
    try:
        pattern = value(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        raise CaseError(args.src, "--moe-layer-freq", f"expected {expected}") from None
    if not isinstance(pattern, list) or len(pattern) != layers:
        raise CaseError(args.src, "--moe-layer-freq", f"lists {len(pattern) if isinstance(pattern, list) else 1} "
                                                      f"layers; megatron-core expects one entry per layer, {layers}")
    return pattern


def _check_window(args: _Args, model) -> None:
    """``--window-size`` as Megatron-LM's parser reads it (``tuple_type``: integers, "4096,0") and
    ``--window-attn-skip-freq`` (an integer N: every N-th layer full), each the case's where both
    have a window (``model.sliding_window``, ``sliding_window_full_every``): a window of 128 read
    back as the case's 4096 was priced as 4096 without a word. (Where only one of them has a window,
    a note says so.)"""
    text = args.flags.get("--window-size")
    window = None
    if text is not None:
        try:
            window = tuple(int(part) for part in text.strip().strip("()").split(","))
        except ValueError:
            raise CaseError(args.src, "--window-size", f"expected integers such as 4096,0 (keys to the left, to the "
                                                       f"right), got {one_line(text, 60)!r}: Megatron-LM's parser "
                                                       "refuses it (tuple_type), and the run would not start") from None
    skip = (args.flags.get("--window-attn-skip-freq") or "").strip()
    if skip.startswith(("[", "(")):
        raise CaseError(args.src, "--window-attn-skip-freq", f"{one_line(skip, 60)}: a layer pattern, which this "
                                                             "reader does not read; give the integer N (every N-th "
                                                             "layer full), as the case's model.sliding_window_full_every")
    every = args.integer("--window-attn-skip-freq")
    if window is None or not model.sliding_window:
        return
    if window != (model.sliding_window, 0):
        raise CaseError(args.src, "--window-size", f"{text} differs from the case's window of {model.sliding_window} "
                                                   "keys to the left and none to the right (model.sliding_window: "
                                                   "the attention is priced by it)")
    if (every or 0) != model.sliding_window_full_every:
        said = every if every is not None else "absent (every layer windowed)"
        raise CaseError(args.src, "--window-attn-skip-freq",
                        f"{said} differs from the case's {model.sliding_window_full_every or 'none'} "
                        "(model.sliding_window_full_every: every N-th layer attends to every key)")


def _check_moe_layers(args: _Args, model) -> None:
    """The layers with experts, as the list places them (:func:`moe_layer_flags`), are the case's
    (``ModelSpec.is_moe_layer``): DeepSeek-V3 without its ``([0]*3+[1]*58)`` builds 61 MoE layers,
    and was priced as the case's 58 without a word."""
    layers = model.num_layers
    listed = moe_layer_flags(args, layers)
    wanted = [1 if model.is_moe_layer(i) else 0 for i in range(layers)]
    if listed != wanted:
        said = f"{args.flags['--moe-layer-freq']}" if "--moe-layer-freq" in args.flags else \
            "absent (Megatron-LM's default 1: experts in every layer)"
        def where(flags: list[int]) -> str:
            indices = [i for i, f in enumerate(flags) if f]
            return f"{len(indices)} of the {layers} layers experts (layers {', '.join(map(str, indices[:4]))}" \
                   f"{', …' if len(indices) > 4 else ''})"
        raise CaseError(args.src, "--moe-layer-freq", f"{said} gives {where(listed)}, the case's model {where(wanted)} "
                                                      f"(model.moe_first_dense_layers {model.moe_first_dense_layers}, "
                                                      f"model.moe_layer_freq {model.moe_layer_freq})")


def _check_vocab(args: _Args, model) -> None:
    """``--vocab-size``, where the run's tokenizer takes it (megatron/training/tokenizer: the
    NullTokenizer of mock-data runs; a real tokenizer brings its own), is the case's vocabulary, or
    pads to it (``_vocab_size_with_padding``: up to a multiple of --make-vocab-size-divisible-by × tp).
    A 32,000 was priced as the case's 128,256 without a word."""
    vocab = args.integer("--vocab-size")
    if vocab is None or (args.flags.get("--tokenizer-type") or "NullTokenizer") != "NullTokenizer":
        return
    padded = padded_vocab(vocab, args.integer("--tensor-model-parallel-size", 1),
                          args.integer("--make-vocab-size-divisible-by", 128))
    if model.vocab_size not in (vocab, padded):
        raise CaseError(args.src, "--vocab-size", f"{vocab} (padded to {padded}) differs from the case's "
                                                  f"{model.vocab_size} (model.vocab_size)")


def _check_vocab_padding(args: _Args, model) -> None:
    """--make-vocab-size-divisible-by is a positive integer, and the vocabulary it pads to (times tp) at most
    the largest a case takes (MAX_VOCAB rows): 2**40 padded 128,256 rows to 4.4 trillion, which no GPU holds,
    and the estimate, priced at the default's rows, said the list fits, with only a note of the rows."""
    given = args.integer("--make-vocab-size-divisible-by")
    if given is None:
        return
    tp = args.integer("--tensor-model-parallel-size", 1)
    built = padded_vocab(model.vocab_size, tp, given)
    if built > MAX_VOCAB:
        raise CaseError(args.src, "--make-vocab-size-divisible-by",
                        f"expected a multiple that pads the vocabulary {model.vocab_size:,} to at most {MAX_VOCAB:,} "
                        f"rows at tp {tp} (the largest vocabulary a case takes), got {given}, which pads it to "
                        f"{built:,}")


def vocab_padding_note(name: str, flags: dict, model) -> Optional[str]:
    """A line where the list's ``--make-vocab-size-divisible-by`` pads the case's vocabulary otherwise
    than the estimate (``EngineBehaviour.vocab_padding_multiple``, Megatron-LM's default 128, times tp:
    ``_vocab_size_with_padding``): the embedding, LM head and logits run with the list's rows, priced
    with the default's, a fraction of a percent of most steps. A value that is no positive integer
    read() refuses."""
    args = _Args(name, flags)
    try:  # read as read() reads them (`+64` is 64, as argparse's int takes it); what it refuses, it says
        given, tp = args.integer("--make-vocab-size-divisible-by"), args.integer("--tensor-model-parallel-size", 1)
    except CaseError:
        return None
    if given is None:
        return None
    priced = BEHAVIOUR.vocab_padding_multiple
    built, estimated = padded_vocab(model.vocab_size, tp, given), padded_vocab(model.vocab_size, tp, priced)
    if built == estimated:
        return None
    return (f"{name} gives --make-vocab-size-divisible-by {given}: Megatron-LM pads the vocabulary "
            f"{model.vocab_size:,} to {built:,} rows at tp {tp}, priced at its default {priced}'s {estimated:,} "
            "(the embedding, LM head and logits); drop the flag to run what was priced")


def _check_capacity_and_dropout(args: _Args, model) -> None:
    """The experts' capacity factor (dropless without one) and the dropout the list runs, where it
    gives them, are the case's: each changes what the estimate prices (padded expert GEMMs, the
    saved masks)."""
    factor = args.number("--moe-expert-capacity-factor")
    if model.is_moe and factor != model.moe_capacity_factor:
        said = f"{factor:g}" if factor is not None else "absent (dropless)"
        case_has = f"{model.moe_capacity_factor:g}" if model.moe_capacity_factor is not None else "none (dropless)"
        raise CaseError(args.src, "--moe-expert-capacity-factor", f"{said}, but the case's model.moe_capacity_factor "
                                                                  f"is {case_has}")
    for flag in ("--attention-dropout", "--hidden-dropout"):
        value = args.number(flag)
        if value is not None and value != model.dropout:
            raise CaseError(args.src, flag, f"{value:g} differs from the case's {model.dropout:g} (model.dropout)")


def _one_expert_rank(flags: dict) -> bool:
    """Whether the list's token dispatcher spans one rank: tp·ep = 1 (their flags, Megatron-LM's default
    1 where absent; a value that is no number is the layout reader's to refuse, and counts as more)."""
    degrees = [flags.get(flag) or "1" for flag in ("--tensor-model-parallel-size", "--expert-model-parallel-size")]
    return all(d.isdigit() for d in degrees) and int(degrees[0]) * int(degrees[1]) == 1


def _positive(word: str) -> bool:
    try:
        return float(word) > 0
    except ValueError:
        return False


def _expert_notes(name: str, flags: dict, model) -> list[str]:
    """How a list runs the experts otherwise than the estimate prices them (megatron-core 0.16.1), one
    line each: one GEMM per local expert without --moe-grouped-gemm (``SequentialMLP``, moe/experts.py,
    where TEGroupedMLP is priced); the default ``allgather`` dispatcher, which gathers every token over
    the tp·ep ranks and reduce-scatters them back (token_dispatcher.py ``MoEAllGatherTokenDispatcher``),
    priced as the all-to-all; a router trained without load balancing (router.py adds the auxiliary
    loss only with --moe-aux-loss-coeff above 0); a capacity factor without
    --moe-pad-expert-input-to-capacity, which drops the tokens over capacity but pads no expert (priced
    padded)."""
    notes = []
    if "--moe-grouped-gemm" not in flags:
        notes.append(f"{name} leaves out --moe-grouped-gemm: megatron-core runs one GEMM per local expert in turn "
                     "(SequentialMLP), priced as grouped GEMMs, so the run may step slower")
    dispatcher = flags.get("--moe-token-dispatcher-type") or "allgather"
    if dispatcher == "allgather" and not _one_expert_rank(flags):
        said = "gives" if "--moe-token-dispatcher-type" in flags else "leaves to its default"
        notes.append(f"{name} {said} the allgather token dispatcher: megatron-core gathers every token over the "
                     "tp·ep ranks and reduce-scatters them back, priced as the all-to-all (which sends each token to "
                     "its experts alone), so the run may move more and step slower; --moe-token-dispatcher-type "
                     "alltoall runs what is priced")
    coefficients = (flags.get("--moe-aux-loss-coeff") or "0").split()
    balancing = (flags.get("--moe-router-load-balancing-type") or "aux_loss").split()
    balanced = "--moe-router-enable-expert-bias" in flags or "sinkhorn" in balancing or (
        any(_positive(c) for c in coefficients) and set(balancing) != {"none"})
    if not balanced and FORCED_ROUTING_FLAG not in flags:  # forced: diagnose's note on forced_routing
        # router.py adds the auxiliary loss only with a coefficient above 0 (arguments.py: default 0.0)
        notes.append(f"{name} trains the router without load balancing (--moe-aux-loss-coeff "
                     f"{flags.get('--moe-aux-loss-coeff') or 'absent: 0.0'}, no expert bias): the experts may "
                     f"take tokens far from evenly; priced at model.moe_load_imbalance {model.moe_load_imbalance:g}")
    if model.moe_capacity_factor is not None and "--moe-pad-expert-input-to-capacity" not in flags:
        notes.append(f"{name} gives --moe-expert-capacity-factor without --moe-pad-expert-input-to-capacity: "
                     "megatron-core drops the tokens over capacity and pads no expert, priced padded to capacity "
                     "(model.moe_capacity_factor), so the run may compute less than priced")
    return notes


FORCED_ROUTING_FLAG = "--moe-router-force-load-balancing"


def forced_routing(path: Path) -> Optional[str]:
    """How the argument list at ``path`` forces the routing balanced, as `diagnose`'s note says it; None
    where it leaves the router its own. ``--moe-router-force-load-balancing`` (TransformerConfig's
    ``moe_router_force_load_balancing``, a benchmarking switch): ``TopKRouter.forward``
    (megatron/core/transformer/moe/router.py) replaces the gate's logits by random ones
    (moe_utils.py ``apply_random_logits``: ``RandomSTE`` draws them ``normal_()``), so every expert is as
    likely as the next whatever the token: the same tokens a rank in expectation, as
    ``model.moe_load_imbalance`` 1 prices."""
    path = Path(path)
    launch = launch_of(path, read_text(path))
    if FORCED_ROUTING_FLAG not in flags_of(launch.words, launch.src, launch.shell):
        return None
    return (f"{FORCED_ROUTING_FLAG}: megatron-core routes on random logits, router.py's apply_random_logits, "
            "every expert alike")


def architecture_notes(path: Path, case) -> list[str]:
    """What an argument list leaves out where megatron/training/arguments.py's default trains
    otherwise than the case: fp32 without --bf16 or --fp16; and where it builds the model (it gives
    --num-layers), another model than the case's: GeLU without
    --swiglu, a KV head per head without --group-query-attention, the output layer tied to the
    embedding without --untie-embeddings-and-output-weights. `diagnose` prices the case's model
    and says so (a hand-written list often leaves them out; a launch would build the other)."""
    path = Path(path)
    launch = launch_of(path, read_text(path))
    flags = flags_of(launch.words, launch.src, launch.shell)
    model = case.model
    notes = []
    for ramp in ("--rampup-batch-size", "--step-batch-size-schedule"):  # megatron/core/num_microbatches_calculator.py
        if ramp in flags:
            notes.append(f"{path.name} ramps the global batch up ({ramp} {flags[ramp]}): diagnosed at the batch it "
                         f"reaches, {case.training.global_batch_size} (the steps before it run smaller ones)")
    absent = [flag for flag in ("--attention-dropout", "--hidden-dropout") if flag not in flags]
    if absent and model.dropout != MEGATRON_DROPOUT:
        notes.append(f"{path.name} leaves out {' and '.join(absent)}: Megatron-LM would drop out {MEGATRON_DROPOUT:g} "
                     f"(its default), the case's model {model.dropout:g} (model.dropout); priced as the case's")
    if read_precision(flags) is None and case.training.precision != "fp32":
        notes.append(f"{path.name} gives neither --bf16 nor --fp16: Megatron-LM would train in fp32 (its default), "
                     f"the case in {case.training.precision}; priced as the case's")
    # Attention the launch builds otherwise than the case, whether or not the list gives the layers.
    mla = "--multi-latent-attention" in flags
    if (model.attention_type == "mla") != mla:
        notes.append(f"{path.name} {'gives' if mla else 'leaves out'} --multi-latent-attention: Megatron-LM would "
                     f"build {'MLA' if mla else 'its default attention'}, the case's model has "
                     f"{model.attention_type} attention (model.attention_type); priced as the case's")
    if bool(model.sliding_window) != ("--window-size" in flags):
        built = f"sliding-window attention ({flags['--window-size']})" if "--window-size" in flags \
            else "full attention in every layer"
        notes.append(f"{path.name} {'gives' if '--window-size' in flags else 'leaves out'} --window-size: "
                     f"Megatron-LM would build {built}, the case's model has "
                     f"{f'a window of {model.sliding_window}' if model.sliding_window else 'none'} "
                     "(model.sliding_window); priced as the case's")
    if "--use-megatron-fsdp" in flags:
        # Defaults that moved after megatron-core 0.16 (the release this reader follows): Megatron-LM's
        # own Megatron-FSDP scripts leave both to the newer ones.
        if "--data-parallel-sharding-strategy" not in flags:
            notes.append(f"{path.name} leaves out --data-parallel-sharding-strategy: read as megatron-core 0.16's "
                         "default no_shard (ZeRO 0, or 1 with --use-distributed-optimizer); from core 0.17 "
                         "(Megatron-LM 26.04) it is optim_grads_params (ZeRO 3): give it to diagnose the run as "
                         "your release runs it")
        if "--megatron-fsdp-main-grads-dtype" not in flags and _training(flags, case, launch.src)["fp32_grads"]:
            notes.append(f"{path.name} leaves out --megatron-fsdp-main-grads-dtype: gradients read in fp32, as "
                         "megatron-core 0.16 keeps a --bf16 run's; from core 0.17 Megatron-FSDP keeps them in the "
                         "model's dtype (auto: bf16 here): give it to diagnose the run as your release runs it")
    if model.is_moe:
        notes += _expert_notes(path.name, flags, model)
    if (padding := vocab_padding_note(path.name, flags, model)) is not None:
        notes.append(padding)
    if "--num-layers" not in flags:
        return notes

    def note(flag: str, default: str, case_has: str) -> None:
        said = "gives" if flag in flags else "leaves out"
        notes.append(f"{path.name} {said} {flag}: Megatron-LM would build {default}, the case's model has "
                     f"{case_has}; priced as the case's")
    # --quick-geglu gates the MLP as --swiglu does (megatron/training/arguments.py: gated_linear_unit),
    # three matrices of the same shapes: priced alike.
    gated = next((flag for flag in ("--swiglu", "--quick-geglu") if flag in flags), None)
    if (model.activation == "swiglu") != (gated is not None):
        note(gated or "--swiglu", {"--swiglu": "SwiGLU", "--quick-geglu": "a gated MLP (quick GeGLU)",
                                   None: "GeLU (its default)"}[gated], f"{model.activation} (model.activation)")
    if model.attention_type != "mla" and \
            (model.num_kv_heads < model.num_attention_heads) != ("--group-query-attention" in flags):
        note("--group-query-attention", "grouped KV heads" if "--group-query-attention" in flags
             else "a KV head per head (its default)", f"{model.num_kv_heads} KV heads for "
             f"{model.num_attention_heads} heads (model.num_kv_heads)")
    if model.qkv_bias is not None and model.linear_bias is False and "--disable-bias-linear" in flags \
            and model.qkv_bias != ("--add-qkv-bias" in flags):
        note("--add-qkv-bias", "biases on the query, key and value projections" if "--add-qkv-bias" in flags
             else "no biases at all", f"{'q/k/v biases' if model.qkv_bias else 'none'} (model.qkv_bias)")
    if model.qk_l2_norm is not None and model.qk_l2_norm != ("--qk-l2-norm" in flags):
        note("--qk-l2-norm", "queries and keys L2-normed" if "--qk-l2-norm" in flags else "no L2 norm of queries "
             "and keys (its default)", f"{'an' if model.qk_l2_norm else 'no'} L2 norm of them (model.qk_l2_norm)")
    # Shares and scales that change the model a launch trains and nothing the estimate prices.
    for flag, figure, key, what in (("--rotary-percent", model.rotary_percent, "rotary_percent",
                                     "RoPE on {:g} of each head"),
                                    ("--moe-router-topk-scaling-factor", model.moe_router_topk_scaling,
                                     "moe_router_topk_scaling", "the router's top-k weights scaled by {:g}")):
        given = _Args(launch.src, flags).number(flag)
        if given is not None and given <= 0:
            raise CaseError(launch.src, flag, f"expected a positive number, got {flags[flag]!r}")
        if (key != "moe_router_topk_scaling" or model.is_moe) and (given or 1.0) != figure:
            note(flag, what.format(given or 1.0) + ("" if flag in flags else " (its default)"),
                 f"{what.format(figure)} (model.{key})")
    # The router's score function: transformer_config.py:626 at core_v0.16.1, softmax where the list
    # gives none. It changes the routing the run trains and nothing the estimate prices (the experts'
    # widths, top k and groups are checked by _check_model and _check_moe_defaults).
    score = (flags.get("--moe-router-score-function") or "softmax").lower()
    if model.is_moe and score != model.moe_router:
        note("--moe-router-score-function", f"a {score} router" + ("" if "--moe-router-score-function" in flags
                                                                   else " (its default)"),
             f"a {model.moe_router} one (model.moe_router)")
    untie = "--untie-embeddings-and-output-weights"
    if model.tied_embeddings == (untie in flags):
        built = "an untied output layer" if untie in flags else "an output layer tied to the embedding (its default)"
        note(untie, built, f"{'a tied' if model.tied_embeddings else 'an untied'} one (model.tied_embeddings)")
    return notes


def overlap_notes(path: Path, job: Job) -> list[str]:
    """The data-parallel overlap the estimate credits (the emitter writes it: the bucketed reduction
    behind the backward, the distributed optimizer's weight gathers behind the next forward) that the
    list leaves out: Megatron-LM then runs the traffic after the backward, in the step."""
    lay = job.layout
    if lay.dp * lay.cp == 1:
        return []
    path = Path(path)
    launch = launch_of(path, read_text(path))
    flags = flags_of(launch.words, launch.src, launch.shell)
    missing = ["--overlap-grad-reduce"] if "--overlap-grad-reduce" not in flags else []
    if lay.zero_stage >= 1 and job.training.engine.overlap_param_gather and "--overlap-param-gather" not in flags:
        missing.append("--overlap-param-gather")
    return [f"{path.name} leaves out {' and '.join(missing)}: Megatron-LM would run that data-parallel traffic in the "
            "step, not behind compute; priced with the overlap, so the launch may step slower"] if missing else []


def _degrees(args: _Args, model, num_gpus: int) -> tuple[int, int, int, int]:
    """(tp, pp, cp, dp) over the case's GPUs."""
    tp = args.integer("--tensor-model-parallel-size", 1)
    pp = args.integer("--pipeline-model-parallel-size", 1)
    cp = args.integer("--context-parallel-size", 1)
    if num_gpus % (tp * pp * cp):
        # The flag most likely changed: one whose own value does not divide the GPUs, else the last of
        # cp, pp, tp given past 1 (cp and pp are the rarer, so the likelier to have been added).
        given = [("--context-parallel-size", cp), ("--pipeline-model-parallel-size", pp),
                 ("--tensor-model-parallel-size", tp)]
        key = next((flag for flag, value in given if num_gpus % value), None) or \
            next((flag for flag, value in given if value > 1 and flag in args.flags), "--tensor-model-parallel-size")
        raise CaseError(args.src, key, f"tp·pp·cp = {tp}·{pp}·{cp} = {tp * pp * cp} must divide the case's {num_gpus} "
                                       f"GPUs (--tensor-model-parallel-size {tp}, --pipeline-model-parallel-size {pp}, "
                                       f"--context-parallel-size {cp})")
    dp = num_gpus // (tp * pp * cp)
    if model.num_attention_heads % tp:
        raise CaseError(args.src, "--tensor-model-parallel-size",
                        f"{tp} must divide num_attention_heads {model.num_attention_heads}")
    return tp, pp, cp, dp


def _batch(args: _Args, training, dp: int) -> tuple[int, int]:
    """(micro-batch, global batch), the global batch the case's."""
    if "--micro-batch-size" not in args.flags:
        raise CaseError(args.src, "--micro-batch-size", "missing (Megatron-LM requires it)")
    micro = args.integer("--micro-batch-size")
    global_batch = args.integer("--global-batch-size")
    schedule = args.flags.get("--step-batch-size-schedule")
    if schedule is not None:
        if global_batch is not None:  # validate_args
            raise CaseError(args.src, "--step-batch-size-schedule", "cannot be given with --global-batch-size "
                                                                    "(Megatron-LM refuses both)")
        global_batch = scheduled_batch(args.src, schedule)
    if global_batch is None:
        global_batch = micro * dp  # validate_args' default
        if global_batch != training.global_batch_size:
            raise CaseError(args.src, "--global-batch-size",
                            f"missing, so Megatron-LM uses micro-batch x dp = {micro}·{dp} = {global_batch}, "
                            f"but the case's global batch is {training.global_batch_size}")
    if global_batch != training.global_batch_size:
        raise CaseError(args.src, "--global-batch-size",
                        f"{global_batch} differs from the case's global batch {training.global_batch_size}")
    if global_batch % (micro * dp):
        raise CaseError(args.src, "--global-batch-size",
                        f"{global_batch} must divide by micro-batch x dp = {micro}·{dp} = {micro * dp}")
    return micro, global_batch


@dataclass(frozen=True)
class _Pipeline:
    vpp: int
    stage_layers: Optional[tuple[int, ...]]
    chunk_split: Optional[tuple[int, ...]]
    accounted: dict


def _counted(accounted: dict[str, bool]) -> str:
    """What the split counts as layers: "embedding", "loss" or "embedding and loss" (only what is set:
    "the embedding and loss counted" was said of the embedding flag alone)."""
    return " and ".join(name for name, field in (("embedding", "account_for_embedding_in_pipeline_split"),
                                                 ("loss", "account_for_loss_in_pipeline_split")) if accounted[field])


def _pipeline(args: _Args, model, pp: int, micro: int, dp: int, global_batch: int) -> _Pipeline:
    """The pipeline's partition and interleaving."""
    layers = model.num_layers
    first = args.integer("--decoder-first-pipeline-num-layers")
    last = args.integer("--decoder-last-pipeline-num-layers")
    stage_layers: Optional[tuple[int, ...]] = None
    chunk_split: Optional[tuple[int, ...]] = None
    custom = args.flags.get("--pipeline-model-parallel-layout")
    accounted = {field: flag in args.flags for field, flag in ACCOUNT_FLAGS.items()}
    units = layers + sum(accounted.values())
    if any(accounted.values()):
        flag = next(f for field, f in ACCOUNT_FLAGS.items() if accounted[field])
        for other in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                      "--pipeline-model-parallel-layout"):
            if other in args.flags:
                raise CaseError(args.src, flag, f"cannot be combined with {other} (TransformerConfig)")
        if pp == 1:
            raise CaseError(args.src, flag, "needs --pipeline-model-parallel-size > 1")
        if units % pp:
            raise CaseError(args.src, flag, f"num_layers {layers} with the {_counted(accounted)} counted ({units}) "
                                       f"must divide by --pipeline-model-parallel-size {pp}")
    if custom is None and (first is not None or last is not None):
        if pp == 1:
            raise CaseError(args.src, "--decoder-first-pipeline-num-layers", "needs --pipeline-model-parallel-size > 1")
        rest, middle_stages = layers - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
        if rest < 0 or bool(rest) != bool(middle_stages) or (middle_stages and rest % middle_stages):
            raise CaseError(args.src, "--decoder-first-pipeline-num-layers",
                            f"the {rest} layers left after the first/last stages must split evenly over "
                            f"the {middle_stages} other stages")
        middle = rest // middle_stages if middle_stages else 0
        stages = ([first] if first is not None else []) + [middle] * middle_stages \
            + ([last] if last is not None else [])
        stage_layers = tuple(stages) if len(set(stages)) > 1 else None
    elif custom is None and pp > 1 and units % pp:
        raise CaseError(args.src, "--pipeline-model-parallel-size",
                        f"num_layers {layers} must divide by {pp} (or give --decoder-first/last-pipeline-num-layers)")
    per_chunk = args.integer("--num-layers-per-virtual-pipeline-stage")
    chunks = args.integer("--num-virtual-stages-per-pipeline-rank")
    vpp = 1
    if custom is not None:
        flag = "--pipeline-model-parallel-layout"
        for other in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                      "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"):
            if other in args.flags:
                raise CaseError(args.src, flag, f"cannot be combined with {other}")
        try:
            counts = parse_layout_string(custom, pp, model.mtp_layers)
        except ValueError as error:
            raise CaseError(args.src, flag, f"{error} in {custom!r}") from None
        if sum(counts) != layers:
            raise CaseError(args.src, flag, f"holds {sum(counts)} transformer layers, the case's model {layers}")
        vpp = len(counts) // pp
        if 0 in counts[:-1] or (counts[-1] == 0 and not model.mtp_layers):
            raise CaseError(args.src, flag, "every model chunk must hold a transformer layer, but the last where it holds "
                                       "the MTP layers (the planner models no other chunk without one)")
        per_rank = rank_chunks(counts, pp)
        stages = [sum(chunks_of_rank) for chunks_of_rank in per_rank]
        stage_layers = tuple(stages) if len(set(stages)) > 1 else None
        if vpp > 1 and layers % (pp * vpp) and tuple(counts) == virtual_stage_layers(layers, pp, vpp):
            stage_layers = None  # the split the planner makes by itself (cost_models.partition)
        elif any(tuple(c) != chunk_layers(sum(c), vpp) for c in per_rank):
            # Chunks of its own (Megatron-Bridge's DeepSeek-V3 layouts with MTP, "Et*4|(t*4|)*14tmL":
            # a last rank of 4, 4, 4 and 1): the layout keeps them.
            chunk_split = tuple(counts)
    elif per_chunk is not None and chunks is not None:
        raise CaseError(args.src, "--num-layers-per-virtual-pipeline-stage",
                        "give either it or --num-virtual-stages-per-pipeline-rank, not both")
    if per_chunk is not None:
        if first is not None or last is not None:
            raise CaseError(args.src, "--num-layers-per-virtual-pipeline-stage",
                            "with an uneven pipeline Megatron-LM needs --num-virtual-stages-per-pipeline-rank")
        # Counted as Megatron-LM's arguments.py counts them: the embedding and the loss as a layer each
        # where accounted for in the split (405B's 126 + 2 over pp 8: 16 a stage, 2 a chunk is vpp 8).
        if (units // pp) % per_chunk:
            raise CaseError(args.src, "--num-layers-per-virtual-pipeline-stage",
                            f"{per_chunk} must divide the {units // pp} layers per pipeline stage"
                            + (f" (the {_counted(accounted)} counted as layers)" if units != layers else ""))
        vpp = units // pp // per_chunk
    elif chunks is not None:
        vpp = chunks
    if vpp > 1:
        if pp == 1:
            raise CaseError(args.src, "--num-layers-per-virtual-pipeline-stage", "interleaving needs pipeline parallelism")
        if pp <= 2 and "--no-overlap-p2p-communication" in args.flags:
            raise CaseError(args.src, "--no-overlap-p2p-communication",
                            "interleaving without p2p overlap needs --pipeline-model-parallel-size > 2")
        for n in (() if custom is not None else stage_layers or (units // pp,)):
            if n % vpp:
                raise CaseError(args.src, "--num-virtual-stages-per-pipeline-rank",
                                f"{vpp} model chunks must divide every stage's layers, got a stage of {n}; "
                                "give --pipeline-model-parallel-layout for unequal chunks")
        microbatches = global_batch // (micro * dp)
        if microbatches % pp:
            raise CaseError(args.src, "--global-batch-size",
                            f"interleaving needs the {microbatches} micro-batches per step to divide by pp {pp}")
    return _Pipeline(vpp, stage_layers, chunk_split, accounted)


# Megatron-FSDP's --data-parallel-sharding-strategy as a ZeRO stage: the emitter's FSDP_STRATEGIES read back.
FSDP_STAGES = {strategy: stage for stage, strategy in FSDP_STRATEGIES.items()}


def sharding_stage(distributed_optimizer: bool, torch_fsdp2: bool, megatron_fsdp: bool,
                   strategy: Optional[str]) -> Optional[int]:
    """The ZeRO stage of Megatron-LM's optimizer sharding, as a launch's flags or a log's argument dump
    state it: torch FSDP2 shards everything (3); Megatron-FSDP (``--use-megatron-fsdp``, earlier
    ``--use-custom-fsdp``) what its sharding strategy names (FSDP_STAGES), at least the distributed
    optimizer's 1 beside it; else the distributed optimizer (1) or nothing (0). None where Megatron-FSDP's
    strategy is not one of FSDP_STAGES (the caller refuses it, naming its source)."""
    if torch_fsdp2:
        return 3
    zero = 1 if distributed_optimizer else 0
    if megatron_fsdp:
        if strategy not in FSDP_STAGES:
            return None
        zero = max(zero, FSDP_STAGES[strategy])
    return zero


def _zero_stage(args: _Args) -> int:
    """The optimizer's sharding as a ZeRO stage."""
    megatron_fsdp = "--use-megatron-fsdp" in args.flags or "--use-custom-fsdp" in args.flags
    strategy = args.flags.get("--data-parallel-sharding-strategy") or "no_shard"
    zero = sharding_stage("--use-distributed-optimizer" in args.flags, "--use-torch-fsdp2" in args.flags,
                          megatron_fsdp, strategy)
    if zero is None:
        raise CaseError(args.src, "--data-parallel-sharding-strategy",
                        f"expected one of {', '.join(FSDP_STAGES)}, got {strategy!r}")
    return zero


def _recompute(args: _Args, vpp: int, stages: tuple[int, ...]) -> tuple[str, Optional[tuple[str, ...]], Optional[int]]:
    """(recompute, modules, layers recomputed per stage where not all)."""
    granularity = args.flags.get("--recompute-granularity")
    if granularity is None and "--recompute-activations" in args.flags:
        granularity = "selective"
    # --moe-layer-recompute (deprecated, still in Megatron's MoE scripts) is selective recomputation
    # with "moe" added to the modules (TransformerConfig.__post_init__), refused beside full.
    moe_layer = "--moe-layer-recompute" in args.flags
    if moe_layer:
        if granularity == "full":
            raise CaseError(args.src, "--moe-layer-recompute", "megatron-core refuses it with full recompute "
                                                               "granularity (TransformerConfig.__post_init__)")
        granularity = "selective"
    recompute, recompute_layers = "none", None
    method = args.flags.get("--recompute-method")
    modules = None
    if granularity == "selective":
        recompute = "selective"
        if method is not None:
            raise CaseError(args.src, "--recompute-method", "does not apply to --recompute-granularity selective")
        # megatron-core recomputes the core attention where the modules are not named
        # (TransformerConfig.recompute_modules); an empty list recomputes nothing.
        modules = tuple((args.flags.get("--recompute-modules") or "").split()) if "--recompute-modules" in args.flags \
            else ("core_attn",)
        if moe_layer and "moe" not in modules:
            modules += ("moe",)
        if "moe_act" in modules and "--moe-grouped-gemm" not in args.flags:
            # megatron/core/transformer/transformer_config.py:1213-1216 at core_v0.16.1 (__post_init__)
            raise CaseError(args.src, "--recompute-modules", "moe_act needs --moe-grouped-gemm beside it: megatron-core "
                                                             "refuses it without (TransformerConfig: \"moe_act in "
                                                             "recompute_modules is only supported with "
                                                             "moe_grouped_gemm\"), and the run would not start")
        if not modules:
            recompute, modules = "none", None
    elif granularity == "full":
        recompute = "full"
        if method is None:
            # megatron/core/transformer/transformer_config.py:1165-1169 at core_v0.16.1 (__post_init__)
            raise CaseError(args.src, "--recompute-method", "absent, and --recompute-granularity full needs it: "
                                                            "expected --recompute-method uniform or block (megatron-core "
                                                            "refuses full recomputation without one, and the run would "
                                                            "not start)")
        if method not in ("uniform", "block"):
            raise CaseError(args.src, "--recompute-method", f"expected uniform or block with full recomputation, "
                                                       f"got {method!r}")
        count = args.integer("--recompute-num-layers")
        if count is None:
            raise CaseError(args.src, "--recompute-num-layers", "missing (full recomputation requires it)")
        if count < 1:
            # megatron-core's TransformerConfig: "between 1 and num_layers_per_pipeline_rank"; block with
            # 0 checkpoints no layer, and uniform's loop (layer_idx += recompute_num_layers) never advances.
            raise CaseError(args.src, "--recompute-num-layers", f"expected at least 1 with --recompute-granularity "
                                                                f"full, got {count} (0 recomputes nothing: drop "
                                                                "--recompute-granularity for none)")
        if method == "block":
            per_stage = count * vpp  # block counts layers per model chunk
            if per_stage < max(stages):
                recompute_layers = per_stage
        elif count > 1:
            # TransformerBlock._checkpointed_forward (uniform): chunks of N layers, each recomputed whole
            # in its backward, which holds the chunk's N layers' activations at once (at N ≥ a stage's
            # layers, about what no recomputation holds); priced as chunks of one, it read 4.3 GB for 21.
            raise CaseError(args.src, "--recompute-num-layers", f"{count} with --recompute-method uniform: "
                                                                f"Megatron-LM checkpoints chunks of {count} layers and "
                                                                "holds a chunk's activations at once in its backward, "
                                                                "which the estimate does not price (it prices uniform "
                                                                "1 and block N); expected 1, or --recompute-method "
                                                                "block")
    elif granularity is not None:
        raise CaseError(args.src, "--recompute-granularity", f"expected selective or full, got {granularity!r}")
    return recompute, modules, recompute_layers


def _offload(args: _Args) -> tuple[float, int]:
    """The distributed optimizer's share on the CPU, and the first layers' activations."""
    offload_optimizer = 0.0
    if "--optimizer-cpu-offload" in args.flags:
        fraction = args.number("--optimizer-offload-fraction")
        offload_optimizer = 1.0 if fraction is None else fraction
        if not 0 <= offload_optimizer <= 1:
            raise CaseError(args.src, "--optimizer-offload-fraction", f"expected a fraction in [0, 1], "
                                                                      f"got {offload_optimizer:g}")
    if "--cpu-offloading" in args.flags:
        raise CaseError(args.src, "--cpu-offloading", "Megatron-LM has no such argument, so its parser refuses the "
                                                      "launch: --cpu-offloading-num-layers N alone offloads N layers' "
                                                      "activations (validate_args turns cpu_offloading on)")
    if "--fine-grained-activation-offloading" in args.flags:
        # TransformerConfig.fine_grained_activation_offloading (megatron/core/transformer/transformer_config.py:889-894
        # at core_v0.16.1): the inputs of the --offload-modules it names (core_attn, expert_fc1, ...) go to the host
        # in every layer, which neither the layers' activations offloaded whole (--cpu-offloading-num-layers) nor
        # any other term of the estimate prices: read as no offload, the activations were priced on the GPU.
        raise CaseError(args.src, "--fine-grained-activation-offloading",
                        "offloads the inputs of the modules --offload-modules names to the host in every layer, "
                        "which the estimate does not price (it prices whole layers' activations offloaded, "
                        "--cpu-offloading-num-layers N): diagnose the launch without it, or with "
                        "--cpu-offloading-num-layers")
    return offload_optimizer, args.integer("--cpu-offloading-num-layers", 0)


def read_precision_aware(src: str, flags: dict) -> tuple[str, bool]:
    """(training.optimizer_moments, training.master_remainders) an argument list's optimizer runs, or a
    CaseError naming the flag where it runs what the estimate does not price.

    megatron-core 0.16 (``megatron/core/optimizer``): --exp-avg-dtype and --exp-avg-sq-dtype other than
    fp32 need --use-precision-aware-optimizer (optimizer_config.py ``__post_init__`` asserts fp32 without
    it). Without --optimizer-cpu-offload the flag hands the moments to Transformer Engine's FusedAdam
    (__init__.py ~365: ``exp_avg_dtype``, ``exp_avg_sq_dtype``), and the master weights too wherever
    ``use_precision_aware_optimizer_no_fp8_or_ds_fp8`` holds (--main-params-dtype other than fp32, or an fp8
    recipe that is delayed, TransformerConfig.fp8_recipe's default, which a bf16 run keeps too), with
    ``store_param_remainders`` (__init__.py ~387; True by default, optimizer_config.py ~192, no argument
    sets it, False only under Transformer Engine before 2.1): under --bf16 the master is the 16 bits of
    each fp32 weight that its bf16 weight lacks (distrib_optimizer.py ~801: ``master_param`` int16), and
    megatron-core keeps no fp32 shard of its own (``shard_main_param = None``). Under tensorwise, blockwise
    and mxfp8 megatron-core keeps its fp32 master shard and FusedAdam the moments alone. With
    --optimizer-cpu-offload the HybridDeviceOptimizer steps instead, built without store_param_remainders
    or the moments' dtypes (__init__.py ~306-334, ``param_update_in_fp32=True``): fp32 copies of the bf16
    shards and moments of their dtype, the 4 + 8 bytes priced."""
    aware = "--use-precision-aware-optimizer" in flags
    dtypes = {flag: (flags.get(flag) or "fp32").lower() for flag in ("--exp-avg-dtype", "--exp-avg-sq-dtype")}
    for flag, dtype in dtypes.items():
        if dtype != "fp32" and not aware:
            raise CaseError(src, flag, f"{dtype} needs --use-precision-aware-optimizer (OptimizerConfig.__post_init__ "
                                       "asserts fp32 without it): the run would not start")
    if not aware:
        return "fp32", False
    offloaded = "--optimizer-cpu-offload" in flags
    for flag, dtype in dtypes.items():
        if dtype not in ("fp32", "bf16"):
            # FusedAdam keeps fp16 and fp8 moments scaled by an fp32 factor of each tensor (fused_adam.py,
            # _apply_scale), which training.optimizer_moments (fp32, bf16) does not price.
            raise CaseError(src, flag, f"{dtype}: Adam's moments in {dtype}, scaled by Transformer Engine's FusedAdam, "
                                       "are not priced (training.optimizer_moments: fp32 or bf16); expected fp32 or "
                                       "bf16")
        if dtype == "bf16" and offloaded:
            raise CaseError(src, flag, "bf16 with --optimizer-cpu-offload: the HybridDeviceOptimizer is handed no "
                                       "moment dtype (megatron/core/optimizer/__init__.py) and keeps them in fp32; "
                                       "expected fp32")
    if dtypes["--exp-avg-dtype"] != dtypes["--exp-avg-sq-dtype"]:
        raise CaseError(src, "--exp-avg-sq-dtype", f"{dtypes['--exp-avg-sq-dtype']} beside --exp-avg-dtype "
                                                   f"{dtypes['--exp-avg-dtype']}: one moment in each dtype is not "
                                                   "priced (training.optimizer_moments keeps both in one); expected "
                                                   f"{dtypes['--exp-avg-dtype']}")
    moments = dtypes["--exp-avg-dtype"]
    if offloaded:
        return moments, False
    main_params = (flags.get("--main-params-dtype") or "fp32").lower()
    if main_params != "fp32":
        raise CaseError(src, "--use-precision-aware-optimizer",
                        f"with --main-params-dtype {main_params} and no --optimizer-cpu-offload, Transformer Engine's "
                        f"FusedAdam keeps the master weights in {main_params} (2 bytes a parameter, scaled), which the "
                        "estimate does not price (it prices an fp32 master, whole or as bf16 remainders); expected "
                        "--main-params-dtype fp32")
    if "--use-megatron-fsdp" in flags:
        raise CaseError(src, "--use-precision-aware-optimizer", "under --use-megatron-fsdp: Megatron-FSDP's own main "
                                                                "weights beside FusedAdam are not priced (the "
                                                                "precision-aware optimizer is priced on the distributed "
                                                                "optimizer, zero_stage 1)")
    precision = read_precision(flags)
    name = precision[0] if precision else "fp32"
    if name in ("fp32", "fp16", "nvfp4"):
        raise CaseError(src, "--use-precision-aware-optimizer",
                        f"under {name} Transformer Engine's FusedAdam keeps a master of its own beside the "
                        f"{name} weights, which the estimate does not price (it prices the precision-aware "
                        "optimizer under --bf16 and the fp8 recipes run with it)")
    recipe = flags.get("--fp8-recipe") or "delayed"  # TransformerConfig.fp8_recipe's default, a bf16 run's too
    remainders = recipe == "delayed"  # use_precision_aware_optimizer_no_fp8_or_ds_fp8 at --main-params-dtype fp32
    if remainders and "--fp8-param-gather" in flags:
        raise CaseError(src, "--fp8-param-gather", "with --use-precision-aware-optimizer under the delayed recipe: "
                                                   "Transformer Engine's FusedAdam then holds the master of fp8 "
                                                   "weights (multi_tensor_adam_fp8), which the estimate does not price; "
                                                   "diagnose the launch without one of them")
    return moments, remainders


def read_training(path: Path, case) -> dict:
    """The training settings a Megatron-LM argument list runs, in TrainingSpec's fields, with
    Megatron-LM's defaults where an argument is absent:

    - ``fp32_grads``: ``validate_args`` (megatron/training/arguments.py) accumulates and all-reduces
      the gradients of a ``--bf16`` run in fp32 unless ``--grad-reduce-in-bf16`` (or
      ``--main-grads-dtype bf16``); ``--accumulate-allreduce-grads-in-fp32`` asks for it outright.
    - ``tp_comm_overlap``: ``--tp-comm-overlap`` (off by default), where tp > 1 (it needs sequence
      parallelism, which validate_args turns off at tp 1).
    - ``moe_comm_overlap``: ``--overlap-moe-expert-parallel-comm`` (off by default).
    - ``fp8_param_gather`` (a low-precision recipe): ``--fp8-param-gather`` (``--fp4-param-gather``
      under NVFP4), off by default: the weights are kept in 16 bits and quantized each step.
    - ``fp8_recipe`` (fp8, where the case names none and the list's differs from the engine's):
      ``--fp8-recipe``, delayed by default (TransformerConfig.fp8_recipe).
    - ``expert_dispatch`` (mixtures of experts): ``--moe-token-dispatcher-type`` ``flex`` with the DeepEP
      or HybridEP backend (``--moe-flex-dispatcher-backend``, DeepEP unless it says otherwise) sends a token once
      per NVLink domain (``deepep``); ``allgather`` (the default) and ``alltoall`` once per expert."""
    path = Path(path)
    launch = launch_of(path, read_text(path))
    try:
        return _training(flags_of(launch.words, launch.src, launch.shell), case, launch.src)
    except CaseError as error:
        raise launch.explain(error) from None


def _training(flags: dict, case, src: str) -> dict:
    _check_one_precision(src, flags)  # before the gradients' dtype is read from --bf16
    main_grads = (flags.get("--main-grads-dtype") or "fp32").lower()
    fp32_grads = "--accumulate-allreduce-grads-in-fp32" in flags or (
        "--bf16" in flags and "--grad-reduce-in-bf16" not in flags and main_grads in ("fp32", "float32"))
    fsdp_grads = flags.get("--megatron-fsdp-main-grads-dtype")
    if fsdp_grads and "--use-megatron-fsdp" in flags:
        # Megatron-FSDP keeps its gradients in the dtype this flag names (Megatron-LM's
        # mcore_fsdp_adapter), whatever --grad-reduce-in-bf16 says
        fp32_grads = fsdp_grads.lower() in ("fp32", "float32")
    moments, remainders = read_precision_aware(src, flags)
    tp = int(flags.get("--tensor-model-parallel-size") or 1)
    if "--tp-comm-overlap" in flags and (tp == 1 or "--sequence-parallel" not in flags):
        # validate_args turns sequence parallelism off at tp 1, then asserts it under --tp-comm-overlap
        raise CaseError(src, "--tp-comm-overlap", "needs --sequence-parallel with tp > 1 (validate_args asserts "
                                                  "it, and turns sequence parallelism off at tp 1): the run would "
                                                  "not start")
    settings = {
        "fp32_grads": fp32_grads,
        "moe_comm_overlap": "--overlap-moe-expert-parallel-comm" in flags,
        "optimizer_moments": moments,
        "master_remainders": remainders,
    }
    if tp > 1:  # at tp 1 there is no tensor-parallel communication to overlap: the case's word stands
        settings["tp_comm_overlap"] = "--tp-comm-overlap" in flags
    if case.training.recipe is not None:  # the weights kept quantized: off unless the flag is given
        settings["fp8_param_gather"] = ("--fp4-param-gather" if case.training.precision == "nvfp4"
                                        else "--fp8-param-gather") in flags
    precision = read_precision(flags)
    if precision is not None and precision[0] == "fp8" == case.training.precision \
            and case.training.fp8_recipe is None and precision[1] != case.training.recipe.name:
        # A case that names no training.fp8_recipe leaves it to the engine: the list's recipe (or
        # TransformerConfig's default, delayed: transformer_config.py:436-437 at core_v0.16.1) is the
        # one the run scales by, taken as the other settings left to the engine are. A case that names
        # one is held to it by _check_model.
        if precision[1] not in FP8_RECIPES:  # Megatron's "custom" (a recipe module of the user's own)
            raise CaseError(src, "--fp8-recipe", f"{precision[1]}: a recipe the planner cannot price; expected one of "
                                                 f"{', '.join(FP8_RECIPES)}")
        settings["fp8_recipe"] = precision[1]
    if case.model.is_moe:
        dispatcher = flags.get("--moe-token-dispatcher-type") or "allgather"
        if "--overlap-moe-expert-parallel-comm" in flags and dispatcher not in ("alltoall", "flex"):
            # TransformerConfig.__post_init__ asserts it
            raise CaseError(src, "--overlap-moe-expert-parallel-comm",
                            f"needs --moe-token-dispatcher-type alltoall or flex, got {dispatcher} "
                            "(megatron-core refuses it)")
        if "--moe-enable-deepep" in flags and dispatcher != "flex":
            # TransformerConfig.__post_init__: "DeepEP backend is only supported with flex token dispatcher."
            raise CaseError(src, "--moe-enable-deepep", f"needs --moe-token-dispatcher-type flex, got {dispatcher} "
                                                        "(megatron-core refuses it)")
        if dispatcher == "flex" and _one_expert_rank(flags):
            # MoEFlexTokenDispatcher.__init__ (token_dispatcher.py): "Flex token dispatcher requires TPxEP > 1".
            raise CaseError(src, "--moe-token-dispatcher-type", "flex needs tensor or expert parallelism (tp·ep > 1; "
                                                                "megatron-core's flex dispatcher refuses one rank)")
        # megatron-core's flex dispatcher runs DeepEP unless told otherwise (TransformerConfig
        # moe_flex_dispatcher_backend = "deepep"); --moe-enable-deepep says the same.
        backend = (flags.get("--moe-flex-dispatcher-backend") or "deepep").lower()
        settings["expert_dispatch"] = "deepep" if dispatcher == "flex" and backend in ("deepep", "hybridep") \
            else "all_to_all"
    return settings


# Why each setting matters, for the refusal that names a case contradicting its arguments.
SETTING_FLAGS = {"fp32_grads": "--grad-reduce-in-bf16", "tp_comm_overlap": "--tp-comm-overlap",
                 "fp8_param_gather": "--fp8-param-gather",
                 "moe_comm_overlap": "--overlap-moe-expert-parallel-comm",
                 "expert_dispatch": "--moe-token-dispatcher-type", "fp8_recipe": "--fp8-recipe",
                 "optimizer_moments": "--exp-avg-dtype", "master_remainders": "--use-precision-aware-optimizer"}


def _check_quantized_weights(src: str, flags: dict, job: Job) -> None:
    """The launch and the case keep the weights alike: quantized (--fp8-param-gather, or
    --fp4-param-gather under NVFP4) or in 16 bits, as the case says or its engine's default at
    this layout does (``TrainingSpec.fp8_param_gather``); else the estimate would price weights
    the launch does not hold."""
    if job.training.recipe is None:
        return
    flag = "--fp4-param-gather" if job.training.precision == "nvfp4" else "--fp8-param-gather"
    launched = flag in flags
    if launched != job.training.fp8_param_gather:
        said = "defaults to" if job.requested_training.fp8_param_gather is None else "says"
        raise CaseError(src, flag, f"{'given' if launched else 'absent'}, but the case {said} "
                                   f"training.fp8_param_gather: {str(job.training.fp8_param_gather).lower()} "
                                   f"at this layout: set it to {str(launched).lower()}")
