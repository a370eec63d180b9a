"""A team's runs as the fit takes them (:class:`Run`): from files in the published-runs schema, or
from training logs beside the case each ran (`calibrate --from-runs`, `--from-logs`), each checked
before any figure moves."""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from cost_models.flops import model_flops_per_token, recomputed_flops_per_token
from cost_models.memory import stage_memories
from cost_models.parameters import padded_vocab, total_parameters
from cost_models.specs import Job

from .case import build_case, load_case, read_case, read_sections, spec_errors
from .errors import Argument, CaseError, cli_flag, one_line, safe_repr
from .inputs import check_each_file_once, read_yaml
from .limits import MAX_FIT_RUNS, MAX_GPUS, MAX_STRING_CHARS, MIN_FIGURE
from .presets import fabric_presets, gpu_presets
from .published_runs import (MEASURES_AGREE, ROW_MEASURES, accumulation_problem, case_of, copied_run, engine as row_engine, family_preset, gpu_expected, gpu_preset, job_key, unsupported,
                             measure_in_bounds,
                             measured_tokens_per_s, measures_problem, RECOMPUTE_WORDS, grid_problem, named_precision,
                             published_memory_stage, row_key, row_problem,
                             tokens_per_batch_problem)
from .training_logs import TITAN_ZERO, is_case_file, read_log


@dataclass(frozen=True)
class Run:
    """One measured run: its case (layout included) and what it measured."""

    id: str
    case: dict  # the case-file schema, with a layout
    tokens_per_s: Optional[float] = None  # over all GPUs
    peak_gib: Optional[float] = None  # the allocator's peak per GPU (GiB), as logs and tables print it
    memory_stage: Optional[int] = None  # the pipeline stage whose peak was published, where not the heaviest
    # Which of the allocator's peaks ``peak_gib`` is (PEAK_SCOPES): what the runs' peaks have meant so far,
    # the reserved one, unless the run says (its runs file's measured.memory_scope, its log's figure).
    peak_scope: str = "reserved"
    # The runs file it was read from: what an error about this run names, where runs of several
    # files are fitted together (the first file was named for a run of the second). None: given as a Run,
    # or read from a log, whose id is the log's name.
    source: Optional[str] = field(default=None, compare=False)
    # What the run left out and the reading guessed (guessed_settings), one line each, said in the fit's
    # notes: a wrong guess moves the fitted figures (tying, the parameters and states; TP overlap, the
    # exposed TP traffic).
    guessed: tuple[str, ...] = field(default=(), compare=False)


# --- runs from the published-runs schema ----------------------------------------------------

def runs_from_rows(rows: Any, source: str) -> list[Run]:
    """The runs of ``rows`` (the published-runs schema, ``planner/published/README.md``), each
    turned into a case as ``validate-published`` does; a CaseError naming the file and the run for
    one that is no run (not a mapping, no layout, nothing measured, faster than the GPU can be)."""
    if not isinstance(rows, list):
        raise CaseError(source, "", "expected a list of runs in the published-runs schema")
    _check_run_count(len(rows), source)
    runs = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise CaseError(source, f"[{index}]", "expected a run (a mapping in the published-runs schema)")
        name = one_line(row.get("id") or f"{source}[{index}]", 200)  # the file's place where it has no id
        row = _team_fields(source, name, row)
        _check_team_shape(source, name, row)
        _check_section_keys(source, name, row)
        problem = row_problem(row) or _missing(row)
        if problem:
            raise CaseError(source, f"{name}.{problem[0]}", problem[1])
        row = _engine_defaults(row)
        try:
            case, why = case_of(row)
            tokens = measured_tokens_per_s(row) if case else None
            peak = (row.get("measured") or {}).get("memory_gb_per_gpu") if case else None
            stage = published_memory_stage(row) if case else None
            scope = peak_scope(source, name, (row.get("measured") or {}).get("memory_scope"))
        except (TypeError, ValueError, AttributeError, KeyError, OverflowError, ZeroDivisionError) as error:
            raise CaseError(source, name, f"a field has the wrong type or is missing ({one_line(error, 80)})") from None
        if case is not None:
            case["cluster"].update(row.get("cluster") or {})  # checked by _check_team_shape
            if "torchtitan" in row["framework"].lower():
                # A team's torchtitan run is priced as torchtitan runs, as its log is (runs_from_logs): a
                # profile fitted under the generic engine's kernels would plan torchtitan's layouts on
                # figures that absorbed the difference. (The published tables' torchtitan rows stay the
                # generic engine's: their releases ran recipes torchtitan 0.3.0 refuses, tensorwise fp8.)
                case["training"]["engine"] = "torchtitan"
            case["training"]["precision"] = _stated_precision(source, name, row.get("precision"))
            overlap = row["parallel"].get("tp_comm_overlap")  # checked by _check_team_shape
            if overlap is not None:  # as case_of reads it: no TP traffic to overlap at tp 1
                case["training"]["tp_comm_overlap"] = overlap and case["layout"]["tp"] > 1
            _check_recompute(source, name, row.get("recompute"))
            _check_measures_agree(source, name, row, tokens)
        if case is None:
            if why == "layout not published":
                why = "a run with no layout: give parallel.tp, parallel.pp and batch.micro_batch_size"
            if why == "mixture of experts without its expert fields":  # case_of's words, naming no key
                ep = (row.get("parallel") or {}).get("ep")
                key = "model.moe.num_experts" if (row["model"].get("moe") or not isinstance(ep, int)) \
                    else "parallel.ep"
                said = "missing" if key == "model.moe.num_experts" else f"{ep} on a model that states no experts"
                raise CaseError(source, f"{name}.{key}", f"{said}: expected the experts' count, "
                                "model.moe.num_experts, for a run with experts or expert parallelism")
            if why == "not a supported row":
                key, expected = unsupported(row)
                raise CaseError(source, f"{name}.{key}", expected)
            raise CaseError(source, name, why)
        unread = next((k for k in UNREAD_THROUGHPUTS if (row.get("measured") or {}).get(k)), None) \
            if not tokens else None
        if unread is not None:  # the run's speed would go unread: a peak alone was fitted, or "nothing measured"
            raise CaseError(source, f"{name}.measured.{unread}",
                            "is not read as a throughput (a FLOP count is its tool's: with or without the "
                            "recomputation, the attention and the LM head; a sample's tokens are its length): give "
                            "iteration_time_s, tokens_per_sec_total or tokens_per_sec_per_gpu")
        if not tokens and not peak:
            raise CaseError(source, f"{name}.measured", "expected a step time, tokens/s or a peak memory")
        run = Run(name, case, tokens, float(peak) if peak else None, stage, scope, source=source,
                  guessed=guessed_settings(row, case))
        _check_grid(source, name, row, case)  # before check_run builds its job: a grid off its GPUs named as such
        problem = _unstated_setting(row)  # after the grid: a tp the GPUs cannot hold is named as such first
        if problem:
            raise CaseError(source, f"{name}.{problem[0]}", problem[1])
        check_run(run, source, throughput_key=_throughput_key(row))
        _check_team_row(source, name, row, case)
        runs.append(run)
    return runs


# The allocator's peaks a measured peak may be (PyTorch's torch.cuda.max_memory_reserved, what the cost
# model prices, and max_memory_allocated, its tensors alone: cost_models.memory.StageMemory.allocated).
PEAK_SCOPES = ("reserved", "allocated")
# How a runs file's measured.memory_scope names each, as the engines print them (spaces, "_" and "-" alike):
# torch's max_memory_allocated, Megatron-LM's "max allocated", DeepSpeed's MaxMemAllocated; torch's
# max_memory_reserved, Megatron-LM's "max reserved", torchtitan's memory (max reserved), nvidia-smi's used
# memory (the reserved blocks, and the CUDA context beside them).
SCOPE_WORDS = {"allocated": re.compile(r"\b(?:max|peak)\s*(?:mem(?:ory)?\s*)?allocated\b"),
               "reserved": re.compile(r"\b(?:max|peak)\s*(?:mem(?:ory)?\s*)?reserved\b|\bnvidia\s*smi\b")}


def peak_scope(source: str, name: str, stated: Any) -> str:
    """The peak (PEAK_SCOPES) a run's ``measured.memory_scope`` names: "reserved" where it says none;
    a CaseError naming the file, run and key where it names neither peak, or both ("model states only",
    an analytical figure, was accepted and fitted as the allocator's peak)."""
    if stated is None:
        return "reserved"
    words = re.sub(r"[\s_\-]+", " ", stated.lower()) if isinstance(stated, str) else ""
    named = [scope for scope, pattern in SCOPE_WORDS.items() if pattern.search(words)]
    if len(named) != 1:
        raise CaseError(source, f"{name}.measured.memory_scope",
                        "expected the allocator's peak that memory_gb_per_gpu is: max reserved "
                        "(torch.cuda.max_memory_reserved, nvidia-smi) or max allocated "
                        "(torch.cuda.max_memory_allocated, DeepSpeed's MaxMemAllocated), "
                        f"got {one_line(safe_repr(stated), 60)}")
    return named[0]


def _throughput_key(row: dict) -> str:
    """The measured figure a row's throughput is read from (``published_runs.measured_tokens_per_s``'s
    order), for a refusal to name: a tokens_per_sec_total of 1.5 was refused under "measured"."""
    measured = row.get("measured") or {}
    for key in ("iteration_time_s", "tokens_per_sec_total", "tokens_per_sec_per_gpu", "tflops_per_gpu"):
        if measured.get(key):
            return f"measured.{key}"
    return "measured"


def _check_run_count(count: int, source: str) -> None:
    """At most MAX_FIT_RUNS runs to one fit: checked before any is priced."""
    if count > MAX_FIT_RUNS:
        raise CaseError(source, "", f"{count:,} runs: a fit takes at most {MAX_FIT_RUNS} (each is priced many times; "
                                    "a few dozen runs inform the profile's figures): give a sample of them")


def _team_fields(source: str, name: str, row: dict) -> dict:
    """A team's run's top-level fields of the types the reading takes (a framework of 3 was 'a field has
    the wrong type' with no key; no num_gpus, a TypeError): the count of GPUs, the names as text. Its
    ``source``, which only published tables need, defaults to its file."""
    for key in ("id", "source", "framework", "gpu", "precision", "record_type") + TEXT_KEYS:
        if key not in TEXT_KEYS and row.get(key) is not None and not isinstance(row[key], str):
            raise CaseError(source, f"{name}.{key}", f"expected text, got {one_line(safe_repr(row[key]), 60)}")
        # As a case's text is bounded (planner.limits): an id of 10,000 characters went into the profile.
        if isinstance(row.get(key), str) and len(row[key]) > MAX_STRING_CHARS:
            raise CaseError(source, f"{name}.{key}", f"expected text of at most {MAX_STRING_CHARS:,} characters, "
                                                     f"got {len(row[key]):,}")
    gpus = row.get("num_gpus")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise CaseError(source, f"{name}.num_gpus", f"expected the run's number of GPUs: a whole number from 1, "
                                                    f"got {one_line(safe_repr(gpus), 60)}")
    if gpus > MAX_GPUS:  # as a case's cluster is bounded, before its grid is checked against it
        raise CaseError(source, f"{name}.num_gpus", f"expected an integer <= {MAX_GPUS}, got {one_line(safe_repr(gpus), 60)}")
    return row if row.get("source") else {**row, "source": source}


# What a team's run must state for its case to be built: a published table may leave some out (the
# row is then skipped as not fully published), a team's own run has them all. Without them the
# refusal named no key ("unsupported operand type(s) for *: 'NoneType' and 'int'").
REQUIRED = {"model": ("layers", "hidden", "heads", "vocab", "seq_len"), "batch": ("global_batch_size",)}


# The engines a framework's words name (published_runs.engine, ENGINE_DEFAULTS): a word a letter or two off
# one of them and no engine's name elsewhere is a typo, not another PyTorch stack.
ENGINE_WORDS = ("deepspeed", "megatron", "torchtitan", "nanotron")


def _engine_name_misspelt(framework: str) -> Optional[str]:
    """The engine name a framework's word misspells ("deepspeeed"), where no word of it names one; else None."""
    words = re.findall(r"[a-z0-9]+", framework.lower())
    if any(name in word for word in words for name in ENGINE_WORDS + ("nemo", "megascale", "neox")):
        return None
    for word in words:
        close = difflib.get_close_matches(word, ENGINE_WORDS, n=1, cutoff=0.85)  # DeepSeek is 0.82 off deepspeed
        if close:
            return close[0]
    return None


def _missing(row: dict) -> Optional[tuple[str, str]]:
    """(the dotted key, what was expected) of the first field a team's run must state and does not."""
    if not isinstance(row.get("framework"), str) or not row["framework"].strip():
        return "framework", "expected the framework that ran it (Megatron-Core, DeepSpeed, torchtitan, nanotron, " \
                            f"PyTorch FSDP …), got {one_line(safe_repr(row.get('framework')), 60)}"
    typo = _engine_name_misspelt(row["framework"])
    if typo:
        return "framework", (f"{one_line(row['framework'], 60)!r} names no engine the planner prices, and is a "
                             f"letter off one (did you mean {typo}?): it would be priced as plain PyTorch")
    for section, keys in REQUIRED.items():
        for key in keys:
            if row[section].get(key) is None:
                return f"{section}.{key}", "expected a whole number from 1, got None"
    # What a published row may leave to a guess (heads for kv_heads, 4 × hidden for the MLP, a GeLU MLP) and a
    # team's run must not: a Llama run without them was priced as multi-head attention and a 16,384-wide
    # GeLU MLP, +20 % before the fit, with no word.
    model = row["model"]
    mla = str((model.get("attention") or {}).get("type")).lower() == "mla"
    if model.get("kv_heads") is None and not mla:
        return "model.kv_heads", "expected the key-value heads (heads again for multi-head attention), got None"
    moe = model.get("moe") if isinstance(model.get("moe"), dict) else {}
    # A frequency of 1 (Megatron-LM's --moe-layer-freq 1, the published rows' Qwen3-30B-A3B) makes every layer
    # a mixture of experts: no dense MLP for the width to be in, and its run was refused for want of one.
    dense_layers = not moe or moe.get("first_dense_layers") or moe.get("moe_layer_freq") not in (None, 1, "1")
    if model.get("ffn_hidden") is None and dense_layers:  # a MoE model's dense layers run it too
        return "model.ffn_hidden", "expected the MLP's width (of the dense layers), got None"
    if model.get("ffn_act") is None:
        return "model.ffn_act", ("expected the MLP's activation: swiglu or geglu (a gated MLP, three matrices), gelu, "
                                 "relu or squared_relu (two), got None")
    return None


# What a team's run sets that changes its priced step or peak, and where the engine its framework names
# fixes a default in its code, that default (the run's parallel key: its value). The published reader's
# guesses (published_runs.case_of: sequence parallelism and the distributed optimizer for Megatron-Core,
# as its performance recipes run them) are the tables' conventions, not a team's run's: where no engine
# default fixes a setting, a run that leaves it out is refused (_unstated_setting).
#  - torchtitan: ParallelismConfig.enable_sequence_parallel = True, data_parallel_shard_degree = -1 (the
#    data-parallel and context-parallel GPUs all shard with FSDP2: zero_stage 3) and
#    data_parallel_replicate_degree = 1 (torchtitan/config/configs.py);
#  - DeepSpeed: no sequence parallelism of Megatron's kind (its engine allows none) and
#    DeepSpeedZeroConfig.stage = 0 (deepspeed/runtime/zero/config.py);
#  - nanotron: ParallelismArgs.tp_mode ALL_REDUCE where none is given, no sequence parallelism
#    (config/parallelism_config.py, __post_init__); its OptimizerArgs.zero_stage has no default.
# Megatron-LM's own defaults (no --sequence-parallel, no --use-distributed-optimizer) are not its
# recipes' (NeMo's and Megatron-Bridge's turn both on), which one framework name covers: none is taken.
ENGINE_DEFAULTS = {"torchtitan": {"sp": True, "zero_stage": 3}, "deepspeed": {"sp": False, "zero_stage": 0},
                   "nanotron": {"sp": False}}
# The keys that state a run's sharding (published_runs.zero_stage reads them).
SHARDING_KEYS = ("zero_stage", "distributed_optimizer", "fsdp")


def _run_engine(row: dict) -> str:
    """The engine whose defaults a run's framework takes (ENGINE_DEFAULTS), as runs_from_rows prices it."""
    return "torchtitan" if "torchtitan" in row["framework"].lower() else row_engine(row)


def _unstated_setting(row: dict) -> Optional[tuple[str, str]]:
    """(the dotted key, what was expected) of the first setting a team's run leaves out that changes its
    priced step or peak and that no default of its engine fixes (ENGINE_DEFAULTS): its recomputation,
    always (a forgotten ``recompute: full`` was priced as none, and the forward it ran again, a third more
    compute, was fitted into the GEMM efficiency); its sequence parallelism at tp > 1; its sharding where
    more than one GPU holds each replica's states (dp·cp > 1)."""
    if row.get("recompute") is None:
        return "recompute", ("missing: expected none, selective or full, the recomputation the run ran (left out, "
                             "a run that recomputed was fitted as one that did not: its extra forward pass went "
                             "into the GEMM efficiency)")
    par = row["parallel"]
    defaults = ENGINE_DEFAULTS.get(_run_engine(row), {})
    framework = one_line(row["framework"], 40)
    tp = par.get("tp")
    if isinstance(tp, int) and tp > 1 and par.get("sp") is None and "sp" not in defaults:
        return "parallel.sp", (f"missing: expected true or false, whether the run's tensor parallelism (tp {tp}) ran "
                               f"sequence parallelism ({framework} fixes no default: Megatron-LM's is off, NeMo's "
                               "and Megatron-Bridge's recipes turn it on)")
    if _shards_over_gpus(row) and all(par.get(k) is None for k in SHARDING_KEYS) and "zero_stage" not in defaults:
        return "parallel.zero_stage", (f"missing: expected 0, 1, 2 or 3, how the run's data-parallel GPUs shard its "
                                       f"states (or parallel.distributed_optimizer or parallel.fsdp; {framework} "
                                       "fixes no default: Megatron-LM runs without the distributed optimizer, "
                                       "NeMo's and Megatron-Bridge's recipes with it)")
    return None


# The engines whose code fixes whether tensor-parallel communication overlaps the GEMMs, so a run of them
# that does not say is no guess: DeepSpeed's AutoTP cannot (engines/deepspeed/engine.py), torchtitan's
# async TP is off unless asked (its config's compile.enable_async_tensor_parallel defaults to False).
TP_OVERLAP_FIXED = ("deepspeed", "torchtitan")


def guessed_settings(row: dict, case: dict) -> tuple[str, ...]:
    """One line for each setting that moves a team's run's fitted figures, that the run does not state and
    that was guessed for it (published_runs.case_of's reading of the tables' conventions): whether its
    input embedding and LM head are tied (model.extra.tied_embeddings: tying takes vocab × hidden
    parameters, their states and their optimizer step off), and at tp > 1 whether its TP communication
    overlaps the GEMMs (parallel.tp_comm_overlap: the exposed TP traffic), where its engine fixes none."""
    lines = []
    if not isinstance((row["model"].get("extra") or {}).get("tied_embeddings"), bool):
        tied = case["model"]["tied_embeddings"]
        lines.append(f"guessed {'tied' if tied else 'untied'} embeddings (model.extra.tied_embeddings not stated: "
                     f"{'tied' if tied else 'untied'} moves the parameter count by vocab × hidden); state it")
    if case["layout"]["tp"] > 1 and row["parallel"].get("tp_comm_overlap") is None \
            and _run_engine(row) not in TP_OVERLAP_FIXED:
        on = case["training"]["tp_comm_overlap"]
        lines.append(f"guessed TP communication overlap {'on' if on else 'off'} at tp {case['layout']['tp']} "
                     f"(parallel.tp_comm_overlap not stated; taken {'on' if on else 'off'} from the framework's "
                     "name, NeMo and Megatron-Bridge recipes running it): state it")
    return tuple(lines)


def _shards_over_gpus(row: dict) -> bool:
    """Whether more than one GPU holds each model replica's states (dp·cp > 1: num_gpus over tp·pp), where
    its sharding changes the priced peak and step."""
    par = row["parallel"]
    tp, pp = par.get("tp"), par.get("pp")
    return isinstance(tp, int) and isinstance(pp, int) and row["num_gpus"] // (tp * pp) > 1


def _engine_defaults(row: dict) -> dict:
    """``row`` with the settings it leaves out that its engine's code fixes (ENGINE_DEFAULTS) stated, so
    the published reader's guesses for tables never price a team's run."""
    defaults = ENGINE_DEFAULTS.get(_run_engine(row), {})
    par = dict(row["parallel"])
    tp = par.get("tp")
    # Sequence parallelism splits what tensor parallelism splits: none at tp 1 (torchtitan's reader:
    # d.tp > 1 and enable_sequence_parallel).
    if "sp" in defaults and par.get("sp") is None and isinstance(tp, int) and tp > 1:
        par["sp"] = defaults["sp"]
    if "zero_stage" in defaults and all(par.get(k) is None for k in SHARDING_KEYS):
        # One GPU a replica (dp·cp 1) shards nothing: left to the reader, which prices it as none.
        if _shards_over_gpus(row):
            par["zero_stage"] = defaults["zero_stage"]
    return {**row, "parallel": par}


def _check_recompute(source: str, name: str, stated: Any) -> None:
    """A run's recomputation as the schema writes it: none, selective or full, a description after."""
    if stated is None or str(stated).lower().startswith(RECOMPUTE_WORDS):
        return
    raise CaseError(source, f"{name}.recompute", f"expected none, selective or full (a description may follow), "
                                                 f"got {one_line(safe_repr(stated), 60)}")


def _check_measures_agree(source: str, name: str, row: dict, tokens: Optional[float]) -> None:
    """A run that states its step time and its tokens/s: the fit reads the step time, so the two
    must say the same speed (published_runs.measures_problem)."""
    problem = measures_problem(row, tokens)
    if problem:
        raise CaseError(source, f"{name}.{problem[0]}", problem[1])


# Throughputs of the schema a team's run is not fitted on (published_runs.measured_tokens_per_s reads
# TFLOP/s only for the papers whose FLOP formula it knows): a run that gives one of them and no tokens/s
# or step time is refused, naming it.
UNREAD_THROUGHPUTS = ("tflops_per_gpu", "mfu", "hfu", "aggregate_pflops", "samples_per_sec_total")


# A team's run names its MLP's activation as the schema does: a gated MLP (three matrices) is swiglu
# (or geglu), a plain one (two) gelu, relu or squared_relu. Hugging Face's "silu" is the gate's
# function, not the MLP's shape: it was read as a plain GeLU MLP.
GATED_ACTIVATIONS, PLAIN_ACTIVATIONS = ("swiglu", "geglu"), ("gelu", "relu", "squared_relu")
# The keys of each section of a run the planner reads (planner/published/README.md): one a letter or
# two from them is a typo the run would otherwise go without.
RUN_KEYS = {"parallel": ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "sp", "distributed_optimizer", "zero_stage",
                         "fsdp", "tp_comm_overlap"),
            "batch": ("global_batch_size", "micro_batch_size", "grad_accum", "tokens_per_batch", "local_batch_size",
                      "batch_schedule"),
            "measured": ("tokens_per_sec_per_gpu", "tokens_per_sec_total", "iteration_time_s", "mfu", "hfu",
                         "tflops_per_gpu", "tflops_basis", "memory_gb_per_gpu", "memory_published", "memory_scope",
                         "samples_per_sec_total", "aggregate_pflops", "previous_revisions"),
            "model": ("name", "params_b", "active_params_b", "num_params_exact", "layers", "hidden", "heads",
                      "kv_heads", "ffn_hidden", "ffn_act", "vocab", "seq_len", "moe", "attention", "extra",
                      "arch_source")}
# Sections whose every key is read: another is a layout or a measurement the run would go without. (A
# model may carry fields the cost does not depend on, rope_theta or norm_eps: those pass.)
STRICT_SECTIONS = ("parallel", "batch", "measured")
# The published-runs schema's other figures (planner/published/*.yaml), which the fit does not read: a
# run copied from those files passes with them (it was refused, activation_cpu_offload naming the first
# of 78 llm-foundry rows); one the fit would misread is refused below (activation_cpu_offload true).
UNREAD_MEASURES = ("activation_cpu_offload", "layer_forward_ms", "layer_backward_ms", "layer_fwd_plus_bwd_ms",
                   "overhead_pct_vs_baseline", "tflops_per_gpu_best_config_without_cp",
                   "max_model_size_b_baseline_measured", "max_model_size_b_zero_os_measured",
                   "max_model_size_b_baseline_theory", "max_model_size_b_zero_os_theory",
                   "gpu_hours_per_trillion_tokens")


def _near_miss(key: str, keys: tuple[str, ...]) -> Optional[str]:
    """The key of ``keys`` that ``key``, not one of them, is likely a typo of: a letter or two off, or
    its start (``zero`` for ``zero_stage``)."""
    if key in keys:
        return None
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.8) or \
        [k for k in keys if len(key) >= 3 and k.startswith(key)][:1]
    return close[0] if close else None


def _check_team_row(source: str, name: str, row: dict, case: dict) -> None:
    """What a team's run states that the reading of published rows lets pass: an activation it would
    price as another MLP, a key a letter from one it reads, and statements of one run that disagree
    (its tokens/s in total and per GPU, its GPUs and its parallel degrees, its accumulation and its
    batch)."""
    act = (row.get("model") or {}).get("ffn_act")
    if act is not None and str(act).lower() not in GATED_ACTIVATIONS + PLAIN_ACTIVATIONS:
        raise CaseError(source, f"{name}.model.ffn_act", f"expected {', '.join(GATED_ACTIVATIONS)} (a gated MLP, three "
                                                         f"matrices) or {', '.join(PLAIN_ACTIVATIONS)} (two), got "
                                                         f"{one_line(safe_repr(act), 40)}")
    measured = row.get("measured") or {}
    if measured.get("activation_cpu_offload") not in (None, False):
        # llm-foundry's activation offload to the host: the fit would price the run's activations on the GPU
        raise CaseError(source, f"{name}.measured.activation_cpu_offload",
                        f"{one_line(safe_repr(measured['activation_cpu_offload']), 20)}: a run that offloads its activations "
                        "to the host is not fitted (its activations would be priced on the GPU); give false or leave it out")
    total, per_gpu = measured.get("tokens_per_sec_total"), measured.get("tokens_per_sec_per_gpu")
    if total and per_gpu and abs(per_gpu * row["num_gpus"] / total - 1) > MEASURES_AGREE:
        raise CaseError(source, f"{name}.measured.tokens_per_sec_per_gpu",
                        f"{per_gpu:,.0f} a GPU on {row['num_gpus']} GPUs is {per_gpu * row['num_gpus']:,.0f} in all, "
                        f"but tokens_per_sec_total says {total:,.0f}: give the two of one run, or one of them")
    # The published rows' rule (global batch = batch per rank × accumulation × dp, the batch per rank its
    # local_batch_size where given), named by the fields the run gave: a run giving local_batch_size 2 and
    # grad_accum 8 on dp 8 (128) was refused as "global batch 128 over micro-batch 1 · dp 8 is 16". Held
    # whatever the run's trust, which leaves a published table's low-trust rows as they are.
    problem = accumulation_problem(row, case) or tokens_per_batch_problem(row, case)
    if problem is not None:
        raise CaseError(source, f"{name}.{problem[0]}", problem[1])


def _check_section_keys(source: str, name: str, row: dict) -> None:
    """Each key of a run's model, parallel, batch and measured is one the reading takes (RUN_KEYS), before
    anything is read from them: a key it drops was refused as what its absence left (measured.tokens_per_second
    as "expected a step time, tokens/s or a peak memory", batch.gbs as "batch.global_batch_size: … got None",
    parallel.tensor_parallel as "a run with no layout"), naming a key the team never wrote."""
    for section, keys in RUN_KEYS.items():
        mapping = row.get(section)
        for key in mapping if isinstance(mapping, dict) else ():
            close = _near_miss(str(key), keys)
            if close:
                raise CaseError(source, f"{name}.{section}.{one_line(key, 40)}", f"unknown key (did you mean {close}?)")
            if key not in keys and section in STRICT_SECTIONS and not (section == "measured"
                                                                       and key in UNREAD_MEASURES):
                # parallel.context_parallel: 2 was fitted as cp 1, measured.step_time_ms went unread
                raise CaseError(source, f"{name}.{section}.{one_line(key, 40)}",
                                f"unknown key; a run's {section} takes {', '.join(keys)}")


def _check_grid(source: str, name: str, row: dict, case: dict) -> None:
    """The run's degrees hold its GPUs: tp·pp·cp divides them, and a stated dp is what they leave (a
    tp of 16 on 8 GPUs was refused as 'parallel.dp: expected an integer >= 1, got 0', 12 GPUs at a
    stated dp 8 as a global batch that does not divide)."""
    problem = grid_problem(row, case)
    if problem:
        raise CaseError(source, f"{name}.{problem[0]}", problem[1])


# A team's run's own keys (the published-runs schema, planner/published/README.md): one a letter or two
# from them (recompte: full) was read as no key, and the run fitted without it.
TOP_KEYS = ("id", "source", "framework", "gpu", "num_gpus", "record_type", "precision", "recompute", "model",
            "parallel", "batch", "measured", "trust", "notes", "date", "url", "hardware", "software", "cluster",
            "source_ref", "inferred", "moe_runtime", "recipe")
# What a run says of itself in words only: a mapping there was taken for settings and went unread.
TEXT_KEYS = ("hardware", "software", "notes", "date", "url", "source_ref", "trust")
# A team's run's cluster beyond its GPUs (the published schema has none): the scale-out fabric (a
# fabric preset: the profile is of one GPU type on one fabric) and the GPUs a node holds.
CLUSTER_KEYS = ("fabric", "gpus_per_node")
# The case file's spellings of a run's model keys: under a run's model they went unread (a run with
# num_layers: 80 beside layers: 32 was fitted as the 32-layer model).
CASE_SPELLINGS = {"num_layers": "layers", "hidden_size": "hidden", "num_attention_heads": "heads",
                  "num_kv_heads": "kv_heads", "num_query_groups": "kv_heads", "ffn_hidden_size": "ffn_hidden",
                  "vocab_size": "vocab", "activation": "ffn_act", "seq_length": "seq_len",
                  "num_experts": "moe.num_experts", "moe_top_k": "moe.top_k", "moe_ffn_hidden_size": "moe.expert_ffn_hidden",
                  "head_dim": "extra.head_dim", "tied_embeddings": "extra.tied_embeddings",
                  "tie_word_embeddings": "extra.tied_embeddings", "mtp_layers": "extra.mtp_layers"}
# What a run's parallel.fsdp may say: PyTorch FSDP's sharding strategies, or its sharding degree.
FSDP_STRATEGIES = ("FULL_SHARD", "HYBRID_SHARD", "HYBRID", "SHARD_GRAD_OP", "NO_SHARD")


def _check_team_cluster(source: str, name: str, section: Any) -> None:
    """A run's cluster section: its keys (CLUSTER_KEYS), a fabric preset's name, a whole number of GPUs."""
    if section is None:
        return
    if not isinstance(section, dict):
        raise CaseError(source, f"{name}.cluster", f"expected a mapping of {', '.join(CLUSTER_KEYS)}, got "
                                                   f"{one_line(safe_repr(section), 40)}")
    for key, value in section.items():
        if key not in CLUSTER_KEYS:
            raise CaseError(source, f"{name}.cluster.{one_line(key, 40)}",
                            f"unknown key; a run's cluster takes {', '.join(CLUSTER_KEYS)}")
    fabric = section.get("fabric")
    if "fabric" in section and (not isinstance(fabric, str) or fabric not in fabric_presets()):
        raise CaseError(source, f"{name}.cluster.fabric", f"expected a fabric preset ({', '.join(fabric_presets())}), "
                                                          f"got {one_line(safe_repr(fabric), 40)}")
    per_node = section.get("gpus_per_node")
    if "gpus_per_node" in section and (isinstance(per_node, bool) or not isinstance(per_node, int)
                                       or not 1 <= per_node <= MAX_GPUS):
        raise CaseError(source, f"{name}.cluster.gpus_per_node", f"expected a whole number from 1 to {MAX_GPUS}, got "
                                                                 f"{one_line(safe_repr(per_node), 40)}")


def _check_team_shape(source: str, name: str, row: dict) -> None:
    """The run's fields of the kinds the reading takes, named where they are not: the fields its case
    is built from (a missing gpu was "a field has the wrong type or is missing ('gpu')"; model.moe "yes",
    "'str' object has no attribute 'get'"), a key a letter from one of the run's own, an FSDP it would
    read as none (fsdp: true was fitted as plain DDP), a GPU the planner's preset is not."""
    for key, expected in (("gpu", "the GPU it ran on (H100-SXM5-80GB, B200 …)"),
                          ("precision", "its training precision (bf16, fp8 …)"),
                          ("record_type", "measured_throughput")):
        if row.get(key) is None:
            raise CaseError(source, f"{name}.{key}", f"missing: expected {expected}")
    for key in row:
        close = _near_miss(str(key), TOP_KEYS)
        if close and str(key) != close:
            raise CaseError(source, f"{name}.{one_line(key, 40)}", f"unknown key (did you mean {close}?)")
        if key not in TOP_KEYS:  # cluster: was read as nothing, fabric and all
            raise CaseError(source, f"{name}.{one_line(key, 40)}", f"unknown key; a run takes {', '.join(TOP_KEYS)}")
        if key in TEXT_KEYS and row[key] is not None and not isinstance(row[key], (str, int, float)):
            raise CaseError(source, f"{name}.{key}", f"expected words (the fit does not read it), got "
                                                     f"{one_line(safe_repr(row[key]), 40)}: a run's settings go in its "
                                                     "model, parallel, batch and cluster")
    _check_team_cluster(source, name, row.get("cluster"))
    model = row.get("model")
    for key in model if isinstance(model, dict) else ():
        if key in CASE_SPELLINGS:
            raise CaseError(source, f"{name}.model.{key}", f"is the case file's spelling: a run's model states it as "
                                                           f"model.{CASE_SPELLINGS[key]}")
    model = row.get("model")
    for section in ("moe", "attention", "extra"):
        value = model.get(section) if isinstance(model, dict) else None
        if value is not None and not isinstance(value, dict):
            raise CaseError(source, f"{name}.model.{section}", f"expected a mapping, got {one_line(safe_repr(value), 40)}")
    _check_extra(source, name, model.get("extra") if isinstance(model, dict) else None)
    if isinstance(model, dict):
        _check_moe(source, name, model)
    parallel = row.get("parallel")
    if isinstance(parallel, dict):
        fsdp = parallel.get("fsdp")
        if fsdp is not None and fsdp is not False and not (isinstance(fsdp, int) and not isinstance(fsdp, bool)) \
                and str(fsdp).upper() not in FSDP_STRATEGIES:
            raise CaseError(source, f"{name}.parallel.fsdp", f"expected a sharding strategy ({', '.join(FSDP_STRATEGIES)}) "
                                                             f"or the sharding degree, got {one_line(safe_repr(fsdp), 40)}")
        gpus = row.get("num_gpus")
        if isinstance(fsdp, int) and not isinstance(fsdp, bool) and isinstance(gpus, int) \
                and not (1 <= fsdp <= gpus and gpus % fsdp == 0):
            # a degree of -1 or 1,000 on 8 GPUs was fitted (as ZeRO-3 above 1)
            raise CaseError(source, f"{name}.parallel.fsdp", f"expected the sharding degree, a divisor of the run's "
                                                             f"{gpus} GPUs, got {one_line(safe_repr(fsdp), 40)}")
        _check_sharding_agrees(source, name, parallel)
        for key in ("distributed_optimizer", "tp_comm_overlap"):
            value = parallel.get(key)
            if value is not None and not isinstance(value, bool):  # 'no' was read as true
                raise CaseError(source, f"{name}.parallel.{key}",
                                f"expected true or false, got {one_line(safe_repr(value), 40)}")
    measured = row.get("measured")
    if isinstance(measured, dict) and measured.get("mfu") is not None:
        mfu = measured["mfu"]
        if isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not 0 < mfu <= 1:
            raise CaseError(source, f"{name}.measured.mfu", f"expected a share of the peak from 0 to 1, got "
                                                            f"{one_line(safe_repr(mfu), 40)}")
    _check_gpu_name(source, name, row["gpu"])


def _check_sharding_agrees(source: str, name: str, parallel: dict) -> None:
    """A run's FSDP sharding and its stated ZeRO stage say one thing: FSDP over more than one rank (a
    degree above 1, FULL_SHARD or HYBRID) is ZeRO-3, SHARD_GRAD_OP ZeRO-2 (published_runs.zero_stage);
    a run that says fsdp 8 and zero_stage 1 was fitted as ZeRO-3 without a word."""
    fsdp, stated = parallel.get("fsdp"), parallel.get("zero_stage")
    if stated is None or fsdp in (None, False):
        return
    text = str(fsdp).upper()
    sharded = 3 if (isinstance(fsdp, int) and not isinstance(fsdp, bool) and fsdp > 1) \
        or "FULL_SHARD" in text or "HYBRID" in text else 2 if "SHARD_GRAD_OP" in text else None
    if sharded is not None and stated != sharded:
        raise CaseError(source, f"{name}.parallel.zero_stage", f"{one_line(safe_repr(stated), 20)}, but parallel.fsdp "
                                                               f"{one_line(safe_repr(fsdp), 20)} shards as ZeRO {sharded}: "
                                                               "give the one the run ran")


# The keys of a run's model.moe (the published-runs schema): one a letter off (topk) was read as no key,
# and the run fitted with another routing; and the least whole number each may be (None: words, which
# the fit does not read: moe_layer_freq's '[0]*3+[1]*58').
MOE_KEYS = {"num_experts": 1, "top_k": 1, "expert_ffn_hidden": 1, "shared_experts": 0, "shared_expert_ffn_hidden": 1,
            "first_dense_layers": 0, "moe_layer_freq": None}


def _check_moe(source: str, name: str, model: dict) -> None:
    """A run's experts where the fit reads them: model.moe's keys (MOE_KEYS), whole numbers at their
    least (shared_experts true was read as 1, 1.5 refused by a key the run does not have); the
    experts' keys at the model's top level (fitted as a dense model) belong under model.moe."""
    for key in model:
        if key in MOE_KEYS or key in ("experts", "moe_top_k", "moe_num_experts", "num_shared_experts"):
            raise CaseError(source, f"{name}.model.{key}", "a mixture of experts' key: give it under model.moe "
                                                          f"({', '.join(MOE_KEYS)})")
    moe = model.get("moe") or {}
    for key, value in moe.items():
        if key not in MOE_KEYS:
            close = _near_miss(str(key), tuple(MOE_KEYS))
            meant = f" (did you mean {close}?)" if close else ""
            raise CaseError(source, f"{name}.model.moe.{one_line(key, 40)}",
                            f"unknown key{meant}; a run's model.moe takes {', '.join(MOE_KEYS)}")
        if value is None or MOE_KEYS[key] is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < MOE_KEYS[key]:
            raise CaseError(source, f"{name}.model.moe.{key}", f"expected a whole number >= {MOE_KEYS[key]}, got "
                                                              f"{one_line(safe_repr(value), 40)}")


# What the fit reads of a run's model.extra (published_runs: tied_embeddings, head_dim, mtp_layers), and
# what each must be: a value of another kind was read as not stated (tied_embeddings 'yes' fitted the
# run as untied), a key a letter from one (tied_embedding) not read at all.
EXTRA_KEYS = {"tied_embeddings": "true or false", "head_dim": "a positive integer",
              "mtp_layers": "a non-negative integer"}


def _check_extra(source: str, name: str, extra: Optional[dict]) -> None:
    for key, value in (extra or {}).items():
        kind = EXTRA_KEYS.get(key)
        if kind is None:
            close = difflib.get_close_matches(str(key), EXTRA_KEYS, n=1, cutoff=0.85)
            if close:
                raise CaseError(source, f"{name}.model.extra.{one_line(str(key), 40)}",
                                f"is not read (did you mean {close[0]}?)")
            continue
        whole = isinstance(value, int) and not isinstance(value, bool)
        if (key == "tied_embeddings" and not isinstance(value, bool)) or (key == "head_dim" and not (
                whole and value > 0)) or (key == "mtp_layers" and not (whole and value >= 0)):
            raise CaseError(source, f"{name}.model.extra.{key}", f"expected {kind}, got {one_line(safe_repr(value), 40)}")


def _check_gpu_name(source: str, name: str, gpu: str) -> None:
    """The run's GPU is the preset its name reads as (published_runs.family_preset, by prefix), not a
    PCIe or NVL part of the family, another memory size, or another number that shares the prefix
    (H100 PCIe, H100-SXM5-94GB and H1000 were read as the H100 SXM preset, and mixed with it)."""
    preset = family_preset(gpu)
    if preset is None:
        return  # refused with the presets it could be (published_runs.unsupported)
    # published_runs.gpu_preset decides it for published rows and team runs alike (a memory its part has
    # not, published_runs.other_memory, among it); said here with the family's SXM part.
    if gpu_preset(gpu) is None:
        raise CaseError(source, f"{name}.gpu", f"{one_line(gpu, 60)} is no GPU the planner has a preset for (its "
                                                f"{preset} is the SXM part with {gpu_presets()[preset]['memory']}); "
                                                f"{gpu_expected(gpu)}; or calibrate that GPU")


def _stated_precision(source: str, name: str, text: Any) -> str:
    """The precision a team's run names (``published_runs.named_precision``): the published reader
    takes what it does not know for bf16, which a table's "mixed (not stated)" is, but a team's own
    run states its own."""
    named = named_precision(text)
    if named is None:
        raise CaseError(source, f"{name}.precision", f"expected the run's training precision (bf16, fp16, fp8, "
                                                     f"mxfp8, nvfp4 or fp32), got {one_line(safe_repr(text), 60)}")
    return named


# A team's run's keys for its case's beyond the published rows' (row_key): what only a team's run states.
TEAM_ROW_KEYS = {"training.tp_comm_overlap": "parallel.tp_comm_overlap"}


def check_run(run: Run, source: str, case_file: Optional[str] = None, throughput_key: str = "measured") -> None:
    """A run that could not have run: faster than its GPU's dense peak at its own model FLOPs, or
    a peak above the GPU's memory. What its case refuses is named as the runs file's run and key
    (``row_key``), or, for a log's run, as its ``case_file``'s own key; a throughput as the figure it
    was read from (``throughput_key``)."""

    def named(error: CaseError) -> CaseError:
        if case_file is not None:
            return CaseError(case_file, error.key, error.expected)
        key = TEAM_ROW_KEYS.get(error.key) or row_key(error.key)
        return CaseError(source, f"{run.id}.{key}" if error.key else run.id, error.expected)

    try:
        case = load_case(run.case)
        job = case.job()
        with spec_errors(case.source):  # a precision the GPU has no peak for (fp8 on an A100)
            job.cluster.gpu.peak(job.training.precision)
    except CaseError as error:  # the case made from the run: named as the run's file and key
        raise named(error) from None
    if run.tokens_per_s is not None and not (math.isfinite(run.tokens_per_s) and run.tokens_per_s > 0):
        raise CaseError(source, f"{run.id}.{throughput_key}", f"expected a positive throughput, got {run.tokens_per_s!r}")
    try:
        # What the fit will price, once here: the engine's refusals and the step's bounds, named as the run's
        # (a pp of 64 for 32 layers, a global batch of 2^40, were "<case>: layout.stage_layers" in the fit).
        from .estimate import estimate

        estimate(run.case)
    except CaseError as error:
        raise named(error) from None
    problem = impossible_measurement(job, run.tokens_per_s, run.peak_gib, run.memory_stage)
    if problem:
        key = throughput_key if problem[0] == "measured" else problem[0]
        raise CaseError(source, f"{run.id}.{key}", problem[1])


# The least share of the dense peak a training run's model FLOPs reach: the published runs' least is the
# Playbook sweep's 1B at tp 32 across 8 nodes, 0.04 % on purpose; a run of 1 token/s a GPU (an 8B
# model's 36-hour step, 0.005 %) was fitted, its error of +900,400 % discarded by the fit without a word.
MIN_PLAUSIBLE_SHARE = 0.0001


def impossible_measurement(job: Job, tokens_per_s: Optional[float], peak_gib: Optional[float],
                           stage: Optional[int] = None) -> Optional[tuple[str, str]]:
    """(the key, why) of a measurement no run of ``job`` could have made, else None: faster than the
    GPU's dense peak at the model's own FLOPs; a peak above the GPU's memory, or under half of what the
    weights alone take on a GPU of the layout (of ``stage``, else of the stage holding the fewest:
    a 1 MB peak for an 8B model was fitted, moving the fragmentation)."""
    if tokens_per_s is not None:
        per_gpu = model_flops_per_token(job.model, job.training.seq_len) * tokens_per_s / job.cluster.num_gpus
        peak = job.cluster.gpu.peak(job.training.precision)
        lay = job.layout
        share = 1.0 if lay.recompute_num_layers is None else min(lay.recompute_num_layers / max(job.stage_layers), 1.0)
        # What the GPUs ran: the forward that recomputation runs again too (a run recomputing in full at
        # 0.9 of the peak in model FLOPs ran 1.2x the peak, and was fitted).
        hardware = per_gpu + recomputed_flops_per_token(job.model, job.training.seq_len, lay.recompute, share) \
            * tokens_per_s / job.cluster.num_gpus
        if hardware > peak:
            ran = f"{per_gpu / 1e12:,.0f} model TFLOP/s per GPU" + ("" if hardware == per_gpu else
                                                                   f" ({hardware / 1e12:,.0f} with its recomputation)")
            return "measured", (f"{ran} is above the {job.cluster.gpu.name}'s {job.training.precision} peak of "
                                f"{peak / 1e12:,.0f}: the measurement or the run's layout is wrong")
        if per_gpu < MIN_PLAUSIBLE_SHARE * peak:
            return "measured", (f"{per_gpu / 1e12:.3g} model TFLOP/s per GPU is {per_gpu / peak * 100:.2g} % of the "
                                f"{job.cluster.gpu.name}'s {job.training.precision} peak, below any training run's "
                                f"({MIN_PLAUSIBLE_SHARE * 100:g} %): the measurement (its unit) or the run's layout is wrong")
    if peak_gib is None:
        return None
    if peak_gib * 2**30 > job.cluster.gpu.memory_bytes:
        return "measured.memory_gb_per_gpu", \
            f"{peak_gib:g} GiB is above the GPU's {job.cluster.gpu.memory_bytes / 2**30:g} GiB"
    states = stage_memories(job, activations=False)
    weights = (states[stage] if stage is not None and stage < len(states)
               else min(states, key=lambda s: s.parameters)).parameters / 2**30
    if peak_gib < weights / 2:
        return "measured.memory_gb_per_gpu", (f"{peak_gib:g} GiB is under half the {weights:.3g} GiB the weights "
                                              "alone take on a GPU of this layout: the measurement or the run's "
                                              "layout is wrong")
    return None


# --- runs from training logs ------------------------------------------------------------------

# What a log states (calibration.logs) and where the case holds it.
STATED_IN_CASE = {"num_layers": ("model", "num_layers"), "hidden_size": ("model", "hidden_size"),
                  "num_attention_heads": ("model", "num_attention_heads"), "seq_length": ("training", "seq_len"),
                  "global_batch_size": ("training", "global_batch_size"),
                  "train_batch_size": ("training", "global_batch_size"),
                  "micro_batch_size": ("layout", "micro_batch_size"),
                  "train_micro_batch_size_per_gpu": ("layout", "micro_batch_size"),
                  "zero_optimization_stage": ("layout", "zero_stage"),
                  "tensor_model_parallel_size": ("layout", "tp"), "pipeline_model_parallel_size": ("layout", "pp"),
                  "num_query_groups": ("model", "num_kv_heads"), "ffn_hidden_size": ("model", "ffn_hidden_size"),
                  "num_experts": ("model", "num_experts"), "moe_router_topk": ("model", "moe_top_k"),
                  "context_parallel_size": ("layout", "cp"), "expert_model_parallel_size": ("layout", "ep"),
                  "data_parallel_size": ("layout", "dp"), "world_size": ("cluster", "num_gpus"),
                  # torchtitan's mesh line (training_logs._titan_mesh), in its own names
                  "pp": ("layout", "pp"), "dp_replicate·dp_shard": ("layout", "dp"), "cp": ("layout", "cp"),
                  "tp": ("layout", "tp"), "ep": ("layout", "ep"), "world": ("cluster", "num_gpus"),
                  TITAN_ZERO: ("layout", "zero_stage")}


def _check_log_settings(log: str, src: str, job, settings: dict[str, str]) -> None:
    """What a Megatron-LM log's argument dump says the run trained with (its precision, the
    optimizer's sharding, its recomputation) is its case's: a run fitted as another would teach
    the profile that other run's speed."""
    def true(key: str) -> bool:
        return settings.get(key, "False") == "True"

    if any(k in settings for k in ("bf16", "fp16", "fp8")):
        fp8 = settings.get("fp8", "None") not in ("None", "False", "")
        precision = "fp8" if fp8 else "fp16" if true("fp16") else "bf16" if true("bf16") else "fp32"
        ran = job.training.precision
        if (precision == "fp8") != (ran in ("fp8", "mxfp8", "nvfp4")) or (precision != "fp8" and precision != ran):
            raise CaseError(log, "precision", f"the log's arguments train in {precision}, the case {src}'s "
                                              f"training.precision is {ran}: a log of another run than the case")
    if "use_distributed_optimizer" in settings:
        from .engines.megatron.read import sharding_stage  # the launch reader's reading of the same settings

        megatron_fsdp = true("use_megatron_fsdp") or true("use_custom_fsdp")
        strategy = settings.get("data_parallel_sharding_strategy")
        stage = sharding_stage(true("use_distributed_optimizer"), true("use_torch_fsdp2"), megatron_fsdp, strategy)
        zero = job.layout.zero_stage
        # A dump without the strategy (or with one this reading does not know) says only that it sharded.
        differs = zero == 0 if stage is None else stage != zero
        if differs:
            if true("use_torch_fsdp2"):
                key, said = "use_torch_fsdp2", "True (torch FSDP2: ZeRO 3)"
            elif megatron_fsdp:
                key, said = "data_parallel_sharding_strategy", \
                    f"{strategy} (Megatron-FSDP: {'sharded' if stage is None else f'ZeRO {stage}'})"
            else:
                key, said = "use_distributed_optimizer", settings["use_distributed_optimizer"] + \
                    (" (the distributed optimizer without FSDP: ZeRO 1)" if stage else "")
            raise CaseError(log, key, f"the log's {said}, the case {src}'s layout.zero_stage {zero}: a log of another "
                                      "run than the case")
    # The layout's own settings the dump prints after validate_args (which turns sequence parallelism off
    # at tp 1, as a case refuses it there): a log without sequence parallelism fitted as the case's run
    # with it was priced with a tp-th of its norms' and dropouts' activations, moving the fragmentation.
    if "sequence_parallel" in settings and true("sequence_parallel") != job.layout.sequence_parallel:
        raise CaseError(log, "sequence_parallel", f"the log's {settings['sequence_parallel']}, the case {src}'s "
                                                  f"layout.sequence_parallel {job.layout.sequence_parallel}: a log of "
                                                  "another run than the case")
    vpp = settings.get("virtual_pipeline_model_parallel_size")
    # None: one model chunk per pipeline rank (the interleaved schedule off), the case's vpp 1.
    if vpp is not None and ("1" if vpp == "None" else vpp) != str(job.layout.vpp):
        raise CaseError(log, "virtual_pipeline_model_parallel_size", f"the log's {vpp}, the case {src}'s layout.vpp "
                                                                     f"{job.layout.vpp}: a log of another run than "
                                                                     "the case")
    # Tying and TP overlap as the run ran them, not as its case says (--untie-embeddings-and-output-weights,
    # off by default: Megatron-LM ties; --tp-comm-overlap): a log of an untied model fitted as its tied case
    # was priced without the LM head's vocab × hidden parameters and their step.
    if "untie_embeddings_and_output_weights" in settings and \
            (not true("untie_embeddings_and_output_weights")) != job.model.tied_embeddings:
        raise CaseError(log, "untie_embeddings_and_output_weights",
                        f"the log's {settings['untie_embeddings_and_output_weights']}, the case {src}'s "
                        f"model.tied_embeddings {job.model.tied_embeddings}: a log of another model than the case")
    if "tp_comm_overlap" in settings and job.layout.tp > 1 and true("tp_comm_overlap") != job.training.tp_comm_overlap:
        raise CaseError(log, "tp_comm_overlap", f"the log's {settings['tp_comm_overlap']}, the case {src}'s "
                                                f"training.tp_comm_overlap {job.training.tp_comm_overlap}: a log of "
                                                "another run than the case")
    if "recompute_granularity" in settings:
        granularity = settings["recompute_granularity"].lower()
        recompute = "none" if granularity in ("none", "") else granularity
        if recompute != job.layout.recompute:
            raise CaseError(log, "recompute_granularity", f"the log's {settings['recompute_granularity']}, the case "
                                                          f"{src}'s layout.recompute {job.layout.recompute}: a log of "
                                                          "another run than the case")


def runs_from_logs(logs: Sequence[Any], cases: Sequence[Any], argument: Argument = cli_flag) -> list[Run]:
    """One run per training log, each with its case (one case for every log, or one per log in
    order; a path or a dict); a CaseError where a log states another model or batch than its case,
    holds no step time, or where the case has no layout. ``argument`` names the logs and the cases
    in an error (the CLI's --from-logs and --case, the API's arguments)."""
    logs_named, cases_named = argument("from_logs"), argument("case")
    if not logs:
        raise CaseError(*logs_named, "expected at least one training log")
    for log in logs:
        if is_case_file(log):  # first: the counts of logs and cases below are off by the cases taken as logs
            flag = cases_named[1] or cases_named[0]
            how = (f"repeat {flag} for each case ({flag} A.yaml {flag} B.yaml): {flag} takes one file, and the "
                   "files after it are read as logs") if flag.startswith("--") else f"give it in {flag}, not among the logs"
            raise CaseError(str(log), "", f"is a case file (a mapping with model, cluster or training), given where a "
                                          f"training log is expected: {how}")
    _check_run_count(len(logs), logs_named[0])
    check_each_file_once(logs, "runs")
    if len(cases) not in (1, len(logs)):
        raise CaseError(*cases_named, f"expected one case for every log or one per log; got {len(cases)} cases for "
                                      f"{len(logs)} logs")
    runs = []
    # Each run is named by its log's file name, or its path where two logs share one (run/0/train.log).
    names = [Path(str(log)).name for log in logs]
    for i, log in enumerate(logs):
        case_path = cases[0] if len(cases) == 1 else cases[i]
        data, src, base = read_case(case_path)
        # A case that is no mapping, or a key that is no section, is refused as build_case refuses it: a
        # list of a case was "layout: missing".
        data = read_sections(src, data)
        if data.get("layout") is None:
            raise CaseError(src, "layout", "missing: a run's case gives the layout it ran")
        data = absolute_paths(data, base)
        reading = read_log(log)
        training = data.get("training")
        # A training section of the wrong type (or none) is left for build_case to name, as `estimate` names
        # it: `training: [1, 2]` raised dict()'s TypeError, and `training:` with nothing was read as one
        # that lacks global_batch_size.
        if isinstance(training, dict):
            training = dict(training)
            if training.get("engine") in (None, "any"):
                # Priced as the engine that ran it: under the case's "any" (plain PyTorch) a torchtitan log was
                # fitted as another engine's run, and torchtitan's plans said they lay outside the fitted runs.
                training["engine"] = reading.engine
            elif training["engine"] != reading.engine:
                raise CaseError(str(log), "", f"is a {reading.engine} log; the case {src} says training.engine "
                                              f"{training['engine']}")
            data = {**data, "training": training}
        case = build_case(data, src, base)  # its refusals name the case file, not "<case>"
        job = case.job()
        for what, value in reading.stated:
            if what == "parameters":
                mine = total_parameters(job.model)
                if abs(value / mine - 1) > 0.02:
                    raise CaseError(str(log), "parameters", f"the log's model has {value:,.0f} parameters, the "
                                                            f"case {src}'s {mine:,.0f}: a log of another model "
                                                            "than the case")
                continue
            if what == "padded_vocab_size":
                # A case may give the vocabulary padded or as the tokenizer has it.
                if value not in (job.model.vocab_size, padded_vocab(job.model.vocab_size, job.layout.tp)):
                    raise CaseError(str(log), what, f"the log's padded vocabulary {value:g} is not the case {src}'s "
                                                    f"model.vocab_size {job.model.vocab_size} padded: a log of another "
                                                    "model than the case")
                continue
            section, key = STATED_IN_CASE[what]
            if what == "moe_router_topk" and not job.model.is_moe or \
                    what == "ffn_hidden_size" and job.model.num_moe_layers == job.model.num_layers:
                continue  # printed at its default for a dense model; no dense MLP for it to be in a MoE's
            spec = {"layout": job.layout, "model": job.model, "training": job.training, "cluster": job.cluster}[section]
            mine = getattr(spec, key)
            if float(mine) != value:
                raise CaseError(str(log), what, f"the log states {what} {value:g}, the case {src} {section}.{key} "
                                                f"{mine}: a log of another model or batch than the case")
        _check_log_settings(str(log), src, job, dict(reading.settings))
        tokens_per_step = job.training.global_batch_size * job.training.seq_len
        if reading.step_time_s:
            tokens = tokens_per_step / reading.step_time_s
        elif reading.tokens_per_s_per_gpu:
            tokens = reading.tokens_per_s_per_gpu * job.cluster.num_gpus
        else:
            tokens = reading.samples_per_s * job.training.seq_len
        # Held to the bounds a runs file's measurements are (published_runs.ROW_MEASURES): a step
        # of 1e300 ms was fitted, and one of 1e999 ms said "got 0.0 tokens/s".
        step = tokens_per_step / tokens if tokens > 0 else math.inf
        if not measure_in_bounds("iteration_time_s", step):
            raise CaseError(str(log), "", f"its step time is {step:.4g} s; expected one from {MIN_FIGURE:g} to "
                                          f"{ROW_MEASURES['iteration_time_s']:g} s")
        if reading.peak_gib is not None and not measure_in_bounds("memory_gb_per_gpu", reading.peak_gib):
            raise CaseError(str(log), "", f"its peak memory is {reading.peak_gib:.4g} GiB; expected one from "
                                          f"{MIN_FIGURE:g} to {ROW_MEASURES['memory_gb_per_gpu']:g} GiB")
        stage = 0 if reading.peak_of_rank_0_only and job.layout.pp > 1 else None
        name = Path(str(log)).name if names.count(Path(str(log)).name) == 1 else str(log)
        run = Run(name, data, tokens, reading.peak_gib, stage, reading.peak_scope)  # its id names the log itself
        try:
            check_run(run, str(log), case_file=src)
        except CaseError as error:  # a figure the log printed: named as the log's, not a runs file's key
            what = {f"{run.id}.measured.memory_gb_per_gpu": "its peak memory",
                    f"{run.id}.measured": "its throughput"}.get(error.key)
            if what is None:
                raise
            raise CaseError(str(log), "", f"{what}: {error.expected}") from None
        runs.append(run)
    # As a runs file's are (load_runs): a log given twice under two names, or two logs of one job that
    # ran 2x apart, were fitted between the two, describing neither.
    check_each_run_once(runs, "--from-logs")
    return runs


def absolute_paths(data: dict, base: Any) -> dict:
    """A case's relative paths (an HF config) made absolute, so the case reads the same from anywhere."""
    model = data.get("model")
    relative = isinstance(model, dict) and isinstance(model.get("hf_config"), str) \
        and not Path(model["hf_config"]).is_absolute()
    if relative:
        data = {**data, "model": {**model, "hf_config": str(Path(base) / model["hf_config"])}}
    return data


def load_runs(paths: Sequence[Any]) -> list[Run]:
    """The runs of published-runs files (a CaseError naming the file and run where one is no run)."""
    if not paths:
        raise CaseError("--from-runs", "", "expected at least one runs file")
    check_each_file_once(paths, "runs")  # runs without ids, given twice, were fitted twice
    documents = [(read_yaml(Path(path)), str(path)) for path in paths]
    _check_run_count(sum(len(rows) if isinstance(rows, list) else 1 for rows, _ in documents), str(paths[0]))
    runs: list[Run] = []
    for rows, path in documents:
        runs += runs_from_rows(rows, path)
    check_each_run_once(runs, str(paths[0]))
    return runs


# Two runs of one job on one cluster further apart than this are two software stacks (or a slowed
# node), not run-to-run noise (a few %): one profile cannot describe both.
SAME_JOB_APART = 1.5


def check_each_run_once(runs: Sequence[Run], source: str) -> None:
    """A run given twice (one file twice, or two files that share a run) would weigh double in the fit;
    two runs of one job that ran or peaked far apart (same model, cluster, training and layout) would be
    fitted between the two, describing neither (12 s and 36 s: the profile predicted a step faster than
    both)."""
    seen: set[str] = set()
    jobs: dict[tuple[str, str], Run] = {}
    measurements: dict[tuple, Run] = {}
    for r in runs:
        source_of = r.source or source  # the file that holds the run refused, not the first file given
        if r.id in seen:
            raise CaseError(source_of, r.id, "the same run id appears twice: each run once")
        seen.add(r.id)
        key = job_key(r.case)
        copy = measurements.setdefault((key, r.tokens_per_s, r.peak_gib), r)
        if copy is not r:  # two measurements of one job never agree to the last digit: one run, copied
            raise CaseError(source_of, r.id, copied_run(copy.id, "weigh as another run in the fit"))
        # The speed, and the peak memory (the allocator's, which runs of one job repeat within a few %):
        # 63.6 and 40.0 GiB for one job were fitted between the two.
        for measure, what in (("tokens_per_s", "ran"), ("peak_gib", "peaked")):
            mine = getattr(r, measure)
            if not mine:
                continue
            # A peak beside the job's peaks of its own scope: an allocated peak is short of the reserved one
            # by the allocator's cached blocks, which is no second software stack.
            other = jobs.setdefault((key, measure, r.peak_scope if measure == "peak_gib" else ""), r)
            theirs = getattr(other, measure)
            if other is not r and max(mine, theirs) > SAME_JOB_APART * min(mine, theirs):
                raise CaseError(source_of, r.id, f"the same job as {other.id} (model, cluster, training and layout) "
                                              f"{what} {max(mine, theirs) / min(mine, theirs):.1f}x apart: one "
                                              "profile cannot describe both; give the runs of the software the "
                                              "plans are for")


# --- the hardware the runs share ----------------------------------------------------------
