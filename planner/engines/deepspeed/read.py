"""Reads an existing DeepSpeed ds_config.json into a layout, for `diagnose` (the counterpart of
:mod:`planner.engines.deepspeed.emit`): contradictions are a :class:`planner.errors.CaseError` naming
the file and the key."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Optional, Union

from cost_models.memory import job_stage_parameters
from cost_models.model_states import folds_gradients_into_fp32, fp32_gradients
from cost_models.quantization import activation_bytes
from cost_models.specs import Layout

from planner.fields import read_int as integer
from planner.errors import Argument, CaseError, cli_flag, named, one_line, safe_repr
from planner.inputs import load_json, read_text
from planner.limits import MAX_INT


# ds_config's top-level keys (DeepSpeed's configuration JSON docs; deepspeed/runtime/config.py reads
# each with dict.get): DeepSpeed ignores any other, so one a letter or two from these is a typo the
# run would silently go without.
DEEPSPEED_KEYS = (
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "scheduler",
    "fp16", "bf16", "bfloat16", "amp", "torch_autocast", "zero_optimization", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "activation_checkpointing", "gradient_clipping", "prescale_gradients",
    "gradient_predivide_factor", "sparse_gradients", "communication_data_type", "seq_parallel_communication_data_type",
    "data_types", "steps_per_print", "wall_clock_breakdown", "memory_breakdown", "dump_state", "flops_profiler",
    "tensorboard", "wandb", "csv_monitor", "comet", "autotuning", "elasticity", "pipeline", "aio", "checkpoint",
    "data_efficiency", "curriculum_learning", "compression_training", "tensor_parallel", "sparse_attention",
    "progressive_layer_drop", "eigenvalue", "quantize_training", "hybrid_engine", "weight_quantization", "nebula",
    "dataloader_drop_last", "disable_allgather", "use_node_local_storage", "load_universal_checkpoint", "compile",
    "timers", "graph_harvesting", "mics_shard_size", "mics_hierarchical_params_gather", "zero_quantized_weights",
    "zero_quantized_gradients", "sequence_parallel_size", "fp16_master_weights_and_grads",
    "bf16_master_weights_and_grads", "disable_python_gc", "expert_parallel")


# zero_optimization's keys (DeepSpeedZeroConfig's fields and aliases, DeepSpeed 0.19): a pydantic model
# that forbids others, so DeepSpeed refuses a misspelled one and the launch does not start.
ZERO_KEYS = (
    "allgather_bucket_size", "allgather_partitions", "allgather_sequential", "compute_grad_norm",
    "contiguous_gradients", "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory", "elastic_checkpoint",
    "enable_sanity_checks", "gather_16bit_weights_on_model_save", "ignore_unused_parameters", "leaf_module",
    "legacy_stage1", "load_from_fp32_weights", "log_trace_cache_warnings", "max_live_parameters", "max_reuse_distance",
    "memory_efficient_linear", "model_persistence_threshold", "module_granularity_threshold", "offload_optimizer",
    "offload_param", "overlap_comm", "override_module_apply", "param_persistence_threshold", "parameter_alignment",
    "pipeline_loading_checkpoint", "prefetch_bucket_size", "reduce_bucket_size", "reduce_scatter",
    "round_robin_gradients", "save_muon_momentum_buffer_in_memory", "stage", "stage3_allgather_sequential",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_model_persistence_threshold",
    "stage3_module_granularity_threshold", "stage3_param_persistence_threshold", "stage3_prefetch_bucket_size",
    "stage3_use_all_reduce_for_fetch_params", "sub_group_size", "use_all_reduce_for_fetch_params",
    "use_multi_rank_bucket_allreduce", "zenflow", "zero_hpz_partition_size", "zero_quantized_gradients",
    "zero_quantized_nontrainable_weights", "zero_quantized_weights")


# What the Hugging Face Trainer fills where zero_optimization says "auto" (transformers,
# integrations/deepspeed.py, trainer_config_finalize): resolve_auto sizes them; DeepSpeed drops any
# other "auto" in the section and runs its default.
TRAINER_FILLED_ZERO_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")


# Two keys of zero_optimization that set one field (DeepSpeedZeroConfig, DeepSpeed 0.19): a field and its
# alias, of which pydantic refuses the second as an extra input, and a deprecated key and the one that
# replaces it, which DeepSpeedConfigModel refuses together. The second of each is the one named.
ZERO_KEY_PAIRS = tuple(
    [(alias, name, "its alias (one field of DeepSpeedZeroConfig)") for name, alias in (
        ("prefetch_bucket_size", "stage3_prefetch_bucket_size"),
        ("param_persistence_threshold", "stage3_param_persistence_threshold"),
        ("model_persistence_threshold", "stage3_model_persistence_threshold"),
        ("max_live_parameters", "stage3_max_live_parameters"), ("max_reuse_distance", "stage3_max_reuse_distance"),
        ("gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"),
        ("module_granularity_threshold", "stage3_module_granularity_threshold"),
        ("use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params"),
        ("allgather_sequential", "stage3_allgather_sequential"))]
    + [(new, old, "the key that replaces it (a deprecated key and its replacement together)") for old, new in (
        ("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param"),
        ("stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save"),
        ("stage3_gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"))])


# The compile section's keys (compile/config.py, CompileConfig, DeepSpeed 0.19): a DeepSpeedConfigModel that
# forbids others. It has no "enabled": torch.compile runs where the model code calls engine.compile().
COMPILE_KEYS = ("deepcompile", "autoep_non_moe", "free_activation", "free_activation_threshold",
                "offload_activation", "offload_activation_pin_memory", "offload_opt_states", "double_buffer",
                "symmetric_memory", "debug_log", "offload_parameters", "sync_before_reduce", "sync_after_reduce",
                "sync_before_allgather", "sync_after_allgather", "keep_int_input_tensors", "keep_all_input_tensors",
                "passes")

# The offload sections' keys (runtime/zero/offload_config.py: DeepSpeedZeroOffloadOptimizerConfig and
# DeepSpeedZeroOffloadParamConfig, DeepSpeed 0.19): pydantic models that forbid others, as zero_optimization.
OFFLOAD_KEYS = {
    "offload_optimizer": ("buffer_count", "cpuadam_cores_perc", "device", "fast_init", "nvme_path", "pin_memory",
                          "pipeline_read", "pipeline_write", "ratio", "super_offload"),
    "offload_param": ("buffer_count", "buffer_size", "device", "max_in_cpu", "nvme_path", "pin_memory"),
}


# The top-level sections DeepSpeed builds into a pydantic model that forbids keys it does not know
# (DeepSpeedConfigModel, runtime/config_utils.py: extra="forbid"), DeepSpeed 0.19: fp16 and bf16
# (runtime/precision_config.py, DeepSpeedFP16Config and DeepSpeedBF16Config, each built from its section
# as written: get_float16_config, get_bfloat16_config) and tensor_parallel (runtime/tensor_parallel/config.py,
# TPTrainingConfig: get_tensor_parallel_config). Their fields and aliases: a misspelled one (bf16's
# "enable", fp16's "loss_scal") stops the launch, and was read as absent.
SECTION_KEYS = {
    "fp16": ("auto_cast", "consecutive_hysteresis", "enabled", "fp16_master_weights_and_grads", "hysteresis",
             "initial_scale_power", "loss_scale", "loss_scale_window", "min_loss_scale"),
    "bf16": ("bf16_master_weights_and_grads", "bf16_optimizer_states", "check_grad_overflow", "enabled",
             "immediate_grad_update"),
    "tensor_parallel": ("autotp_size", "dtype", "injection_policy_tuple", "keep_module_on_host", "kernel_inject",
                        "partition_config", "preset_model", "replace_with_kernel_inject", "tensor_parallel", "tp",
                        "tp_overlap_comm", "vocab_parallel_ce_backend", "vocab_parallel_lm_head"),
}


# What DeepSpeed 0.19 took out and refuses in a config (runtime/config.py, _REMOVED_TOP_LEVEL_CONFIG_KEYS and
# _REMOVED_ZERO_CONFIG_KEYS): at the top level, features an older release ran (apex AMP, elasticity, ...);
# in zero_optimization, MiCS and LoCo, which no release this reads priced.
REMOVED_KEYS = ("nebula", "compression_training", "amp", "quantize_training", "sparse_gradients", "eigenvalue",
                "sparse_attention", "elasticity", "graph_harvesting", "curriculum_learning", "progressive_layer_drop")
REMOVED_ZERO_KEYS = ("mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param")


def dropped_as_auto(key: Any, value: Any) -> bool:
    """Whether DeepSpeed drops ``key: value`` from a section before pydantic reads it, known key or not:
    DeepSpeedConfigModel.__init__ keeps only ``v != "auto" or k == "replace_method"`` (DeepSpeed 0.19,
    runtime/config_utils.py), in every section built from one (zero_optimization and its offload sections,
    fp16, bf16, tensor_parallel, compile). So ``"foo": "auto"`` starts, and ``"replace_method": "auto"``,
    kept, is refused where the section has no such field (extra="forbid")."""
    return isinstance(value, str) and value == "auto" and key != "replace_method"


# Where a ds_config states each layout field a refusal may name (the Megatron emitter's FLAG_OF_FIELD's twin).
KEY_OF_FIELD = {"zero_stage": "zero_optimization.stage", "micro_batch_size": "train_micro_batch_size_per_gpu",
                "offload_optimizer": "zero_optimization.offload_optimizer",
                "offload_params": "zero_optimization.offload_param"}


# The unknown top-level keys checked for a misspelling, each against every DeepSpeed key (100,000 made-up
# keys kept diagnose busy past 30 s).
MAX_KEYS_CHECKED = 1000


def misspelled_keys(path: Union[str, Path]) -> list[str]:
    """Notes on the top-level keys of a ds_config a letter or two from DeepSpeed's own, which DeepSpeed
    (and so this reading) ignores: ``trian_micro_batch_size_per_gpu`` leaves the micro-batch derived.
    One in ``zero_optimization`` DeepSpeed refuses: so is it here (``offload_optimiser``)."""
    import difflib

    path = Path(path)
    config, notes = load_config(path), []
    unknown = [key for key in config if key not in DEEPSPEED_KEYS]
    for key in unknown[:MAX_KEYS_CHECKED]:
        close = difflib.get_close_matches(str(key), DEEPSPEED_KEYS, n=1, cutoff=0.85)
        if close:
            notes.append(f"{path.name}: {one_line(key, 60)} is no DeepSpeed key (did you mean {close[0]}?): "
                         "DeepSpeed ignores it, and so does this reading")
    if len(unknown) > MAX_KEYS_CHECKED:
        notes.append(f"{path.name}: {len(unknown):,} top-level keys are no DeepSpeed key, which DeepSpeed ignores; "
                     f"the first {MAX_KEYS_CHECKED:,} were checked for misspellings, not the rest")
    for key in config:
        if key in REMOVED_KEYS:
            notes.append(f"{path.name}: {key}: removed from DeepSpeed (0.19 refuses the config: runtime/config.py, "
                         f"_REMOVED_TOP_LEVEL_CONFIG_KEYS); an older DeepSpeed runs it, unpriced")
    for name, known in SECTION_KEYS.items():
        # bf16's section is the one DeepSpeed reads where both spellings are given (get_bfloat16_config).
        section = config.get(name) if name != "bf16" or config.get("bf16") is not None else config.get("bfloat16")
        written = "bfloat16" if name == "bf16" and config.get("bf16") is None else name
        for inner in section if isinstance(section, dict) else {}:
            _refuse_unknown(path, written, inner, section[inner], known, "runtime/config_utils.py")
    zero = config.get("zero_optimization")
    for key in zero if isinstance(zero, dict) else {}:
        if key in REMOVED_ZERO_KEYS:
            raise CaseError(str(path), f"zero_optimization.{key}", "removed from DeepSpeed (0.19 refuses the config: "
                                                                 "runtime/config.py, _REMOVED_ZERO_CONFIG_KEYS), "
                                                                 "and not priced")
        section = zero[key]
        if key in OFFLOAD_KEYS and isinstance(section, dict):
            for inner in section:
                _refuse_unknown(path, f"zero_optimization.{key}", inner, section[inner], OFFLOAD_KEYS[key],
                                "runtime/zero/offload_config.py")
        _refuse_unknown(path, "zero_optimization", key, section, ZERO_KEYS, "runtime/zero/config.py", cutoff=0.85)
    return notes


def _refuse_unknown(path: Path, section: str, key: Any, value: Any, known, model_file: str,
                    cutoff: float = 0.8) -> None:
    """Refuse ``key`` of a section DeepSpeed builds into a pydantic model that forbids extra fields (defined in
    ``model_file``), where it is none of ``known`` and DeepSpeed does not drop it first (:func:`dropped_as_auto`):
    the launch would not start. A near miss is named."""
    import difflib

    if key in known or dropped_as_auto(key, value):
        return
    close = difflib.get_close_matches(str(key), known, n=1, cutoff=cutoff)
    meant = f" (did you mean {close[0]}?)" if close else ""
    raise CaseError(str(path), f"{section}.{one_line(str(key), 60)}",
                    f"unknown key{meant}: DeepSpeed's {section.rsplit('.', 1)[-1]} takes no other (a pydantic model "
                    f"that forbids extra fields, {model_file}), and the launch would not start")


# How DeepSpeed's config models (DeepSpeedConfigModel, runtime/config_utils.py: pydantic BaseModels in lax
# mode) take a bool, int or float field: pydantic 2's conversion table (docs.pydantic.dev, "Conversion
# Table"; pydantic-core's input_python.rs), as the venv's pydantic 2.14 reads each (tests/test_diagnose.py
# runs it): a bool from true/false, 0/1 (int or float) or these words in any case but unstripped (" true "
# is refused); an int from a bool, a whole float, or a string of ASCII digits, stripped, with a sign,
# single underscores between digits and a fraction of zeros ("3.0"; not "3." nor "1e9"); a float from a
# number, or a string float() reads. What each reader refuses, DeepSpeed's config refuses.
_TRUE_WORDS, _FALSE_WORDS = ("1", "on", "t", "true", "y", "yes"), ("0", "off", "f", "false", "n", "no")
_LAX_INT_TEXT = re.compile(r"[+-]?[0-9](?:_?[0-9])*(?:\.0+)?")


def _lax_bool(src: str, key: str, value: Any) -> bool:
    """A bool as pydantic's lax mode reads it, else refused as it is."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE_WORDS + _FALSE_WORDS:
        return value.lower() in _TRUE_WORDS
    raise CaseError(src, key, f"expected true or false (DeepSpeed's config refuses it), got {one_line(safe_repr(value), 40)}")



def _zero12_flag(src: str, zero: dict, key: str) -> bool:
    """A ZeRO-1/2 switch of DeepSpeedZeroConfig that defaults to true (reduce_scatter,
    use_multi_rank_bucket_allreduce: runtime/zero/config.py), as DeepSpeed reads it ("auto" dropped: the
    default)."""
    said = zero.get(key, True)
    return True if said == "auto" else _lax_bool(src, f"zero_optimization.{key}", said)


def _reduces_to_owners(src: str, zero: dict) -> bool:
    """Whether ZeRO-1/2 reduces each bucket's slices to their owners, one dist.reduce per destination rank,
    rather than all-reducing the bucket whole (zero/stage_1_and_2.py, average_tensor): only with
    use_multi_rank_bucket_allreduce false and reduce_scatter true (false takes gradient_reduction_w_predivide,
    an all-reduce)."""
    return not _zero12_flag(src, zero, "use_multi_rank_bucket_allreduce") and _zero12_flag(src, zero, "reduce_scatter")

def _lax_int(src: str, key: str, value: Any, least: int) -> int:
    """A whole number of at least ``least`` as pydantic's lax mode reads it (5e8, "500000000" and
    true are whole), else refused as it is (DeepSpeed's bucket sizes are int, ge=0; its ZeRO stage an int
    enum of 0 to 3)."""
    number = value
    if isinstance(value, str) and len(value) <= 100 and _LAX_INT_TEXT.fullmatch(value.strip()):
        number = int(value.strip().split(".")[0])
    if isinstance(number, float) and math.isfinite(number) and number.is_integer():
        number = int(number)
    if isinstance(number, int) and number > MAX_INT and not isinstance(number, bool):
        # DeepSpeed takes any int (2^63 too); past the planner's bound it is this reading that refuses it.
        raise CaseError(src, key, f"expected a whole number of at most {MAX_INT:,} (the planner's bound), got "
                                  f"{one_line(safe_repr(value), 40)}")
    if not isinstance(number, int) or not least <= number <= MAX_INT:
        raise CaseError(src, key, f"expected a whole number of at least {least} (DeepSpeed's config refuses it), got "
                                  f"{one_line(safe_repr(value), 40)}")
    return int(number)


def _lax_float(src: str, key: str, value: Any) -> float:
    """A number as pydantic's lax mode reads a float field ("1.0" is 1.0), else refused as it is."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and len(value) <= 100 and value.isascii():  # float("٣") is 3.0; pydantic refuses it
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise CaseError(src, key, f"expected a number (DeepSpeed's config refuses it), got {one_line(safe_repr(value), 40)}")


def unpriced_notes(path: Union[str, Path], job) -> list[str]:
    """What the config runs that the estimate of its layout does not price (the emitter writes none of
    it, or writes it as priced), one line each: DeepSpeed's data-parallel traffic left in the open
    (``overlap_comm``: off below stage 3 unless set, ``runtime/zero/config.py`` overlap_comm_valid),
    buckets and a reduction dtype other than those priced, and ZeRO++, MiCS, activation partitioning or
    CPU checkpointing and torch.compile, which the cost models do not hold."""
    path = Path(path)
    src = str(path)
    config, _ = as_deepspeed_reads(src, load_config(path))
    zero = dict(config.get("zero_optimization")) if isinstance(config.get("zero_optimization"), dict) else {}
    # As DeepSpeed's pydantic models take them (lax: "false" is False, 5e8 is 500000000), else refused as
    # they refuse them: a value of another kind was read as absent, and its note lost.
    # ("auto" is the Hugging Face Trainer's to fill in: read as absent here.)
    for key in ("overlap_comm", "zero_quantized_weights", "zero_quantized_gradients",
                "zero_quantized_nontrainable_weights", "reduce_scatter", "use_multi_rank_bucket_allreduce",
                "round_robin_gradients",
                "stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params"):
        if zero.get(key) == "auto":
            del zero[key]
        elif key in zero:
            zero[key] = _lax_bool(src, f"zero_optimization.{key}", zero[key])
    # (DeepSpeedZeroConfig's stage3 sizes: Field(ge=0), as its allgather bucket's and zero_hpz_partition_size's;
    # its reduce bucket gt=0)
    for key, least in (("reduce_bucket_size", 1), ("allgather_bucket_size", 0), ("zero_hpz_partition_size", 0),
                       ("stage3_prefetch_bucket_size", 0), ("stage3_max_live_parameters", 0),
                       ("stage3_param_persistence_threshold", 0), ("param_persistence_threshold", 0),
                       ("stage3_max_reuse_distance", 0), ("max_reuse_distance", 0),
                       ("stage3_model_persistence_threshold", 0), ("sub_group_size", 0)):
        if zero.get(key) == "auto":
            del zero[key]
        elif key in zero:
            zero[key] = _lax_int(src, f"zero_optimization.{key}", zero[key], least)
    for key in ("communication_data_type", "seq_parallel_communication_data_type"):
        said_dtype(src, config, key)
    compiled = config.get("compile")
    if compiled is not None and not isinstance(compiled, dict):
        raise CaseError(src, "compile", f"expected a mapping (DeepSpeed's CompileConfig), got "
                                        f"{one_line(safe_repr(compiled), 40)}")
    compiled = {k: v for k, v in (compiled or {}).items() if not dropped_as_auto(k, v)}
    for key in compiled:
        if key not in COMPILE_KEYS:
            import difflib

            close = difflib.get_close_matches(str(key), COMPILE_KEYS, n=1, cutoff=0.8)
            raise CaseError(src, f"compile.{one_line(str(key), 60)}",
                            f"unknown key{f' (did you mean {close[0]}?)' if close else ''}: DeepSpeed 0.19's "
                            "CompileConfig takes no other (a pydantic model that forbids extra fields, "
                            "compile/config.py; torch.compile is the model code's engine.compile()), and the launch "
                            "would not start")
    enabled = _lax_bool(src, "compile.deepcompile", compiled.get("deepcompile", False))
    lay, training = job.layout, job.training
    stage = lay.zero_stage
    if "compute_grad_norm" in zero and not _lax_bool(src, "zero_optimization.compute_grad_norm",
                                                     zero["compute_grad_norm"]):
        stated = zero.get("stage", 0)
        if stated not in (1, 2):  # DeepSpeedZeroConfig.compute_grad_norm_valid (zero/config.py)
            raise CaseError(src, "zero_optimization.compute_grad_norm", f"false: DeepSpeed takes it at ZeRO stage 1 or "
                                                                        f"2 only, not stage {stated} (zero/config.py)")
        if folds_gradients_into_fp32(job):  # engine.py, _do_optimizer_sanity_check
            raise CaseError(src, "zero_optimization.compute_grad_norm", "false: DeepSpeed refuses it for ZeRO stage 1 "
                                                                        "with bf16 parameters and fp32 gradient "
                                                                        "accumulation (runtime/engine.py)")
        # DeepSpeedZeroOptimizer.__init__ (zero/stage_1_and_2.py) refuses it beside a clip above 0 (1.0 where
        # the file states none, runtime/config.py) and beside an offloaded optimizer, as the engine builds it.
        clip = config.get("gradient_clipping", 1.0)
        if isinstance(clip, (int, float)) and clip > 0:
            raise CaseError(src, "zero_optimization.compute_grad_norm",
                            f"false: DeepSpeed's ZeRO optimizer refuses it beside gradient_clipping {clip}"
                            f"{' (its default, where the file states none)' if 'gradient_clipping' not in config else ''}"
                            ": it requires gradient_clipping 0 (runtime/zero/stage_1_and_2.py)")
        if lay.offload_optimizer:
            raise CaseError(src, "zero_optimization.compute_grad_norm",
                            "false: DeepSpeed's ZeRO optimizer refuses it with the optimizer offloaded "
                            "(runtime/zero/stage_1_and_2.py)")
    notes = [] if (clipping := clipping_note(path, config)) is None else [clipping]
    if config.get("gradient_clipping") == "auto" and "compute_grad_norm" in zero \
            and not _lax_bool(src, "zero_optimization.compute_grad_norm", zero["compute_grad_norm"]):
        # The Hugging Face Trainer fills "auto" with TrainingArguments.max_grad_norm (1.0 unless given:
        # transformers' integrations/deepspeed.py, trainer_config_process), which the refusal above names.
        notes.append(f"{path.name}: gradient_clipping \"auto\" beside zero_optimization.compute_grad_norm false: the "
                     "Hugging Face Trainer fills it with --max_grad_norm, 1.0 unless given, and DeepSpeed's ZeRO "
                     "optimizer refuses any clip above 0 without the gradient norm (runtime/zero/stage_1_and_2.py): "
                     "pass --max_grad_norm 0")
    # (Not under a pipeline, whose engine turns overlap_comm off and reduces after the schedule drains,
    # engine.py; nor for the BF16_Optimizer, which takes no overlap_comm: the estimate prices neither
    # overlapped, dp_time.)
    if lay.dp * lay.cp > 1 and stage in (1, 2) and not zero.get("overlap_comm", False) and lay.pp == 1 \
            and not folds_gradients_into_fp32(job):
        said = "false" if "overlap_comm" in zero else "absent (DeepSpeed's default below stage 3: off)"
        notes.append(f"zero_optimization.overlap_comm {said}: DeepSpeed reduces the gradients after the backward, not "
                     "behind it; priced with the overlap, so the run may step slower")
    if lay.dp * lay.cp > 1 and stage == 3 and zero.get("overlap_comm") is False:
        # ZeRO-3 turns it on unless the file says false (zero/config.py, overlap_comm_valid); off, its weight
        # gathers and gradient reduce-scatters run on the compute stream (zero/parameter_offload.py and
        # zero/stage3.py: default_stream() where overlap_comm is off), where the estimate prefetches them
        # behind the compute (dp_time.dp_comm_exposed).
        notes.append("zero_optimization.overlap_comm false: DeepSpeed's ZeRO-3 gathers the weights and "
                     "reduce-scatters the gradients on the compute stream, not behind the compute; priced with the "
                     "overlap, so the run may step slower")
    # (one of the field and its alias: ZERO_KEY_PAIRS refuses the two together)
    persist_key = next((k for k in ("stage3_param_persistence_threshold", "param_persistence_threshold")
                        if isinstance(zero.get(k), int)), None)
    persist = zero.get(persist_key) if persist_key else None
    if stage == 3 and persist is not None and persist > max(100_000, 10 * job.model.hidden_size):
        # Every parameter of at most this many elements stays gathered on every rank, up to
        # model_persistence_threshold in all (zero/parameter_offload.py, mark_persistent_parameters). The
        # estimate keeps the norms' and biases' whole, as DeepSpeed's default (1e5) and the Trainer's 10 x hidden
        # do; larger, whole weight matrices stay unsharded.
        notes.append(f"zero_optimization.{persist_key} {persist:,}: DeepSpeed keeps every "
                     "parameter of at most that many elements gathered on every GPU, weight matrices among them "
                     "(runtime/zero/parameter_offload.py, mark_persistent_parameters); priced as sharded, so the "
                     "run holds more memory and gathers less")
    # (The reduce bucket is priced as the config sizes it: reduction_as_configured.)
    bucket = zero.get("allgather_bucket_size")
    if stage in (1, 2) and isinstance(bucket, int) and bucket % 2 and not folds_gradients_into_fp32(job):
        # stage_1_and_2.py: "allgather_bucket_size must be a multiple of nccl_start_alignment_factor" (2)
        raise CaseError(src, "zero_optimization.allgather_bucket_size", f"{bucket}: DeepSpeed's ZeRO-{stage} optimizer "
                                                                        "asserts a multiple of 2 (its 4-byte NCCL "
                                                                        "alignment, runtime/zero/stage_1_and_2.py)")
    if stage in (1, 2) and isinstance(bucket, (int, float)) and not isinstance(bucket, bool) \
            and bucket != training.engine.bucket_params and not folds_gradients_into_fp32(job):
        # DeepSpeed 0.19's ZeRO-1/2 gathers the updated weights after the step with all_gather_dp_groups
        # (runtime/utils.py), which takes the bucket size only where torch has no all_gather_into_tensor
        # (before 1.13): otherwise one all_gather_into_tensor of each parameter group's flat buffer, as
        # priced (dp_time.after_step_gather).
        engine = training.engine
        gathers = "one all-gather" if engine.zero_gather_param_groups == 1 else \
            f"{engine.zero_gather_param_groups} all-gathers"
        experts = (f", and the experts' in groups of at most {engine.zero_gather_expert_group_params:,.0f} elements"
                   if job.model.is_moe and engine.zero_gather_expert_group_params else "")
        notes.append(f"zero_optimization.allgather_bucket_size {bucket:,}: DeepSpeed does not use it at ZeRO-{stage} "
                     "(on a torch with all_gather_into_tensor, any since 1.13, it gathers each parameter group's "
                     "updated weights after the step in one collective: runtime/utils.py, all_gather_dp_groups); "
                     f"the estimate prices that gather so, {gathers} of the weights, whatever the bucket sizes: "
                     f"one per parameter group of the optimizer the ds_config's section builds over "
                     f"model.parameters(){experts}")
    unpriced = [f"zero_optimization.{key}" for key in ("zero_quantized_weights", "zero_quantized_gradients",
                                                       "zero_quantized_nontrainable_weights")
                if zero.get(key) is True]
    if zero.get("zero_hpz_partition_size", 1) > 1 and stage == 3:  # ZeRO++'s secondary shards: stage 3's only
        unpriced.append("zero_optimization.zero_hpz_partition_size")
    checkpointing = config.get("activation_checkpointing")
    if isinstance(checkpointing, dict):
        # Read raw (activation_checkpointing/config.py, get_scalar_param) and tested for their truth
        # (checkpointing.py: `if PARTITION_ACTIVATIONS:`, `elif CPU_CHECKPOINT`): "false" as a string turns it on.
        unpriced += [f"activation_checkpointing.{key}" for key in ("partition_activations", "cpu_checkpointing")
                     if checkpointing.get(key)]
    if enabled:
        unpriced.append("compile.deepcompile")
    bf16 = config.get("bf16") if isinstance(config.get("bf16"), dict) else {}
    if folds_gradients_into_fp32(job) and not _lax_bool(src, "bf16.immediate_grad_update",
                                                         bf16.get("immediate_grad_update", False)):
        # BF16_Optimizer (runtime/bf16_optimizer.py) keeps each bf16 gradient until the step unless it
        # folds it into the fp32 buffer from autograd's hook and frees it (accumulate_hp_grads_and_remove_lp).
        params = max(job_stage_parameters(job, s).total for s in range(lay.pp))
        said = "false" if "immediate_grad_update" in bf16 else "absent (DeepSpeed's default: false)"
        notes.append(f"bf16.immediate_grad_update {said}: the BF16_Optimizer keeps every parameter's bf16 gradient "
                     f"beside its fp32 one until the step, {2 * params / 1e9:.1f} GB a GPU more than priced (the "
                     "planner's files set it true)")
    if autoep_size(src, config) is not None and job.model.is_moe:
        notes.append("expert_parallel: AutoEP's expert layers priced as DeepSpeed-MoE's (their all-to-all dispatch, "
                     "one GEMM per local expert)")
    for section in ("offload_optimizer", "offload_param"):
        offload = zero.get(section)
        if isinstance(offload, dict) and offload.get("device") == "cpu" and \
                not _lax_bool(src, f"zero_optimization.{section}.pin_memory", offload.get("pin_memory", True)):
            # offload_config.py: pin_memory defaults to true; off, the host buffers are pageable
            # (stage_1_and_2.py, stage3.py: pin_memory only where it is set)
            notes.append(f"zero_optimization.{section}.pin_memory false: the copies to and from the host run "
                         "through pageable memory, priced at a pinned copy's bandwidth, so the run may step slower")
    if lay.dp * lay.cp > 1 and stage in (1, 2) and not _zero12_flag(src, zero, "reduce_scatter"):
        # Said, though priced as it runs, because the key reads as a change and is none at the default:
        # DeepSpeed 0.19 all-reduces each bucket whole either way (zero/stage_1_and_2.py, average_tensor):
        # false, through gradient_reduction_w_predivide; true, with use_multi_rank_bucket_allreduce at its
        # default (true, zero/config.py), by putting every rank's slices under one ("allreduce", group) key,
        # allreduce_and_scatter → allreduce_bucket → dist.all_reduce. dp_time prices an all-reduce for both
        # (EngineBehaviour.zero12_bucket_all_reduce).
        notes.append("zero_optimization.reduce_scatter false: DeepSpeed all-reduces each gradient bucket whole and "
                     "keeps its own slice (runtime/zero/stage_1_and_2.py, average_tensor), as it also does with "
                     "reduce_scatter true while use_multi_rank_bucket_allreduce is true (its default): the same "
                     "traffic either way, and the all-reduce the estimate prices")
    if lay.dp * lay.cp > 1 and stage in (1, 2) and _reduces_to_owners(src, zero):
        # Each slice reduced to its owner, one dist.reduce per destination rank of a bucket (average_tensor's
        # ("reduce", dst, group) keys → allreduce_no_retain with rank=dst): a reduce-scatter's bytes, priced as
        # one reduce-scatter (reduction_as_configured), whose single latency stands for those calls'.
        notes.append("zero_optimization.use_multi_rank_bucket_allreduce false: DeepSpeed reduces each gradient "
                     "bucket's slices to their owners, one reduce call per destination rank "
                     "(runtime/zero/stage_1_and_2.py, average_tensor), priced as one reduce-scatter of the same "
                     "bytes; the latency of the further calls is not priced, so the run may step slower")
    if lay.dp * lay.cp > 1 and stage in (1, 2) and zero.get("round_robin_gradients") is True:
        # Reorders each group's parameters so consecutive gradients belong to different ranks
        # (stage_1_and_2.py, _round_robin_reorder), for offload's parallel copies to the host.
        notes.append("zero_optimization.round_robin_gradients true: DeepSpeed reorders the parameters so that "
                     "consecutive gradients belong to different ranks (runtime/zero/stage_1_and_2.py, "
                     "_round_robin_reorder); not priced")
    fetch_key = next((k for k in ("stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params")
                      if zero.get(k) is True), None)
    if lay.dp * lay.cp > 1 and stage == 3 and fetch_key:
        # _all_gather_coalesced (zero/partition_parameters.py): each rank copies its shard into a zeroed buffer
        # of the whole weights and all-reduces it (without ZeRO++'s quantized or secondary-tensor gathers), but
        # all_gather_coalesced takes that path only for a call of several parameters: a call of one goes to
        # _all_gather_sequential, an all-gather. Which calls hold one depends on the trace: a module's own fetch
        # holds its parameters, a prefetch those popped from the trace's queue until stage3_prefetch_bucket_size
        # is reached (zero/partitioned_param_coordinator.py, _fetch_sub_module_impl), so a weight matrix larger
        # than the bucket often goes alone. dp_time's ZeRO-3 collectives are uniform per layer and follow no
        # trace, so it cannot say which share of the bytes is all-reduced: between none and all of it.
        notes.append(f"zero_optimization.{fetch_key} true: DeepSpeed fetches ZeRO-3's weights with an all-reduce "
                     "of a zero-filled buffer of the whole weights where one fetch or prefetch holds several "
                     "parameters, and with an all-gather where it holds one (runtime/zero/partition_parameters.py, "
                     "all_gather_coalesced); which do depends on the module trace and the prefetch bucket, which "
                     "the estimate does not follow, so it prices all-gathers: up to twice that traffic runs, and "
                     "the run may step slower")
    # DeepSpeed 0.19 reads these only inside zero_optimization (DeepSpeedZeroConfig; runtime/config.py reads no
    # top-level one, and refuses only zero_optimization's removed MiCS keys), so where they stand they do nothing.
    for key in ("mics_shard_size", "mics_hierarchical_params_gather", "zero_quantized_weights",
                "zero_quantized_gradients"):
        if key in config:
            notes.append(f"{path.name}: {key} at the top level: DeepSpeed 0.19 ignores it there (it reads "
                         f"{'only zero_optimization.' + key + ', which it refuses as removed' if key.startswith('mics') else 'zero_optimization.' + key}), "
                         "and so does this reading")
    if config.get("wall_clock_breakdown"):
        # Read raw and tested for its truth (runtime/config.py, get_wall_clock_breakdown). The engine then
        # logs its micro timers after every engine.step() (runtime/engine.py), and reading a timer waits on
        # its CUDA end event (utils/timer.py, CudaEventTimer.get_elapsed_msec: end_event.synchronize()).
        notes.append("wall_clock_breakdown on: DeepSpeed reads its timers after every micro-batch's step(), the host "
                     "waiting for the GPU at each (utils/timer.py, CudaEventTimer: end_event.synchronize()), so it "
                     "cannot queue the next micro-batch's kernels ahead; a measured step includes those waits, "
                     "which the estimate does not price")
    if unpriced:
        notes.append(f"{', '.join(unpriced)}: not priced (the estimate is of plain ZeRO-{stage}, eager kernels and "
                     "the case's recomputation), so the run's memory and step time may differ")
    return notes


def clipping_note(path: Path, config: dict) -> Optional[str]:
    """A line where the config's gradient_clipping clips nothing though it is not 0, else None; a value
    DeepSpeed cannot compare refused. DeepSpeed 0.19 reads it raw (runtime/config.py, get_gradient_clipping:
    dict.get, default 1.0) and clips only where ``clip_grad > 0.`` (runtime/engine.py, _take_model_step; the
    ZeRO, bf16 and fp16 optimizers alike): below 0 it clips nothing, as 0 does, and NaN, which compares as
    neither, too; no error, no log line. A run whose file says -1 or NaN trains unclipped, which its author
    seldom meant (0 is how DeepSpeed's docs turn clipping off). "auto" is the Hugging Face Trainer's to fill
    (its max_grad_norm)."""
    clip = config.get("gradient_clipping", "auto")
    if clip == "auto":
        return None
    if not isinstance(clip, (int, float)):  # bools compare as 0 and 1, as DeepSpeed compares them
        # `"1.0" > 0.` and `None > 0.` raise TypeError at the first step (engine.py, _take_model_step).
        raise CaseError(str(path), "gradient_clipping", f"expected a number (DeepSpeed compares it with 0 at every "
                                                        f"step, and a {type(clip).__name__} raises TypeError there), "
                                                        f"got {one_line(safe_repr(clip), 40)}")
    if clip >= 0:
        return None
    return (f"{path.name}: gradient_clipping {clip}: DeepSpeed clips only where it is above 0 (runtime/engine.py and "
            "its optimizers: clip_grad > 0.), so the run trains with no gradient clipping and says nothing; write 0 "
            "to mean that, or the norm to clip at (1.0 is DeepSpeed's default)")


def _positive(src: str, key: str, value: Any, minimum: int = 1) -> int:
    if value == "auto":
        raise CaseError(src, key, "expected an integer, got str 'auto' (\"auto\" is filled in by the Hugging Face "
                                  "Trainer, not DeepSpeed)")
    return integer(src, key, value, minimum)


def _enabled(src: str, config: dict, key: str) -> bool:
    section = config.get(key)
    if section is None:
        return False
    if not isinstance(section, dict):
        raise CaseError(src, key, f"expected a mapping, got {type(section).__name__} {section!r}")
    # As DeepSpeed's precision models take it (pydantic's lax bool: "true" is True, precision_config.py).
    return _lax_bool(src, f"{key}.enabled", section.get("enabled", False))


def _hjson_number(digits: str) -> Union[int, float]:
    """A number with a fraction or an exponent as hjson reads it: a float, an int where whole and below 1e10
    (hjson/decoder.py, scanValue: ``if int(res) == res and abs(res)<1e10: res = int(res)``), so that
    DeepSpeed takes ``"train_micro_batch_size_per_gpu": 4.0`` as 4."""
    number = float(digits)
    return int(number) if math.isfinite(number) and number.is_integer() and abs(number) < 1e10 else number


def load_config(path: Path) -> dict:
    """A ds_config.json as DeepSpeed reads its config file: with hjson (runtime/config.py, DeepSpeedConfig:
    ``hjson.load``), which reads JSON, whole numbers written as floats (4.0) as ints, and comments, trailing
    commas and unquoted keys; a mapping, or a CaseError naming it. Where hjson is not installed (a
    DeepSpeed dependency, not the planner's), a file that is not JSON is refused saying so."""
    text = read_text(path, "valid JSON")
    try:
        data = load_json(text, str(path), parse_float=_hjson_number)
    except CaseError as error:
        if not error.expected.startswith("expected valid JSON:") or "nested too deeply" in error.expected:
            raise
        try:
            import hjson
        except ImportError:
            raise CaseError(str(path), "", f"{error.expected}; DeepSpeed reads its config with hjson (comments, "
                                           "trailing commas, unquoted keys: runtime/config.py), which is not "
                                           "installed here: install hjson (DeepSpeed's dependency) to read it as "
                                           "DeepSpeed does") from None
        data = load_json(text, str(path), loads=hjson.loads, syntax="Hjson, as DeepSpeed reads its config")
    if not isinstance(data, dict):
        raise CaseError(str(path), "", f"expected a JSON object, got {type(data).__name__}")
    return data


# The flags that hand a training its ds_config: DeepSpeed's own (deepspeed/__init__.py,
# _add_core_arguments: --deepspeed_config PATH, and --deepscale_config, its deprecated name; its --deepspeed
# is a switch), Hugging Face Accelerate's launcher's (accelerate/commands/launch.py, launch_command_parser:
# `accelerate launch --use_deepspeed --deepspeed_config_file PATH train.py`, the file handed to DeepSpeed as
# it is) and the Hugging Face Trainer's (TrainingArguments.deepspeed: --deepspeed PATH).
CONFIG_FLAGS = ("--deepspeed_config", "--deepscale_config", "--deepspeed_config_file")
TRAINER_CONFIG_FLAG = "--deepspeed"

# The programs a launch script starts a DeepSpeed training with (or a .py script), which tell a launch
# script from a config that bash would read as commands too.
LAUNCHERS = ("deepspeed", "torchrun", "accelerate", "python", "python3")

# The directory a launch script finds itself in (the planner's own: HERE="$(cd "$(dirname
# "${BASH_SOURCE[0]}")" && pwd)"), which the bash reader does not run: answered with the script's directory.
_OWN_DIRECTORY = re.compile(r"""\s*cd\s+(["']?)\$\(\s*dirname\s+(["']?)\$(?:\{BASH_SOURCE(?:\[0\])?\}|\{0\}|0)\2\s*\)\1"""
                            r"""\s*&&\s*pwd\s*""")
# The planner's sbatch.sh's CONFIG="$(realpath -e "$HERE/ds_config.json")": FILE beside the script, from any
# directory variable ($HERE, ${SCRIPT_DIR}...), as Megatron's reader takes its arguments file.
_REALPATH = re.compile(r"""\s*realpath\s+(?:-e\s+)?"?\$\{?[A-Za-z_][A-Za-z0-9_]*\}?/([A-Za-z0-9_.-]+)"?\s*""")


def launched_config(path: Union[str, Path]) -> tuple[Path, Optional[str]]:
    """The ds_config diagnose reads for ``path``, and a note where it followed a launch script to it.
    A ds_config (JSON or Hjson) is itself. A launch script (``#!``, or commands that start deepspeed,
    torchrun, accelerate or Python) is read as bash would expand it (planner.readers.bash, as Megatron's
    reader reads one) for the ds_config its command passes: ``--deepspeed_config PATH`` (or ``=PATH``),
    Accelerate's ``--deepspeed_config_file PATH``, or the Hugging Face Trainer's ``--deepspeed PATH``; a
    relative PATH resolved against the script's directory, and ``$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)`` read as that directory, as the planner's own
    launch.sh finds the ds_config beside it. A script that passes none is refused, naming it."""
    from planner.readers import bash

    path = Path(path)
    text = read_text(path, "valid JSON")
    if text.lstrip().startswith("{"):  # a JSON object, or Hjson's: a config
        return path, None
    shebang = text.startswith("#!")
    src = str(path)
    here, answered = str(path.parent.resolve()), []

    def own_directory(command: str) -> Optional[str]:
        beside = _REALPATH.fullmatch(command)
        answered.append(beside is not None or _OWN_DIRECTORY.fullmatch(command) is not None)
        if beside is not None:
            return str(Path(here) / beside.group(1))
        return here if answered[-1] else None

    try:
        script = bash.read_script(text, src, own_directory)
    except bash.ScriptError as error:
        if not shebang:  # no script bash reads: a config (Hjson without braces), refused as one where it is not
            return path, None
        raise CaseError(src, error.key, f"{error.message}; expected a launch script that passes a ds_config "
                                        "(--deepspeed_config PATH), or the ds_config.json itself") from None
    for command in script.commands:
        found = _config_word(command.fields)
        if found is None:
            continue
        flag, value = found
        # What the reading could not know, which may have made the path: variables the script leaves
        # unset, and command substitutions it does not run, read as empty as bash reads them.
        empty = [f"the script leaves {', '.join(command.unset[:3])} unset"] if command.unset else []
        empty += [f"{one_line(c, 60)} is not run" for c in command.not_run[:2]]
        why = f" ({'; '.join(empty)}: read as empty)" if empty else ""
        if not value:
            raise CaseError(src, flag, f"line {command.line}: takes the ds_config's path, and none follows it{why}: "
                                       "give diagnose --config the ds_config.json the script passes")
        config = Path(value) if Path(value).is_absolute() else path.parent / value
        if not config.is_file():
            raise CaseError(src, flag, f"line {command.line}: {one_line(value, 120)}: no such file, resolved against "
                                       f"the script's directory ({path.parent}){why}: give diagnose --config the "
                                       "ds_config.json the script passes")
        how = [f"resolved against the script's directory: {config}"] if not Path(value).is_absolute() else []
        if any(answered):
            how.append("the script's own directory read as where it lies, as the planner's launch.sh finds it")
        return config, (f"{src}: a launch script: read the ds_config its line {command.line} passes ({flag} "
                        f"{one_line(value, 120)}{''.join('; ' + h for h in how)})")
    launches = any(Path(c.fields[0]).name in LAUNCHERS or any(f.endswith(".py") for f in c.fields)
                   for c in script.commands if c.fields)
    if shebang or launches:
        raise CaseError(src, "", "is a launch script whose commands pass no ds_config (--deepspeed_config PATH, "
                                 "accelerate's --deepspeed_config_file PATH or the Hugging Face Trainer's "
                                 "--deepspeed PATH): give diagnose --config the "
                                 "ds_config.json it passes")
    return path, None


def _config_word(words: tuple[str, ...]) -> Optional[tuple[str, str]]:
    """(flag, path) of the first ds_config a command's words pass, as argparse reads them (the value after
    ``=`` or the next word); the Trainer's ``--deepspeed`` only where a value follows it (DeepSpeed's own
    --deepspeed is a switch, followed by the next flag). None where they pass none."""
    for i, word in enumerate(words):
        name, eq, inline = word.partition("=")
        following = words[i + 1] if i + 1 < len(words) else ""
        if name in CONFIG_FLAGS:
            return name, inline if eq else ("" if following.startswith("-") else following)
        if name == TRAINER_CONFIG_FLAG and (eq or following and not following.startswith("-")):
            return name, inline if eq else following
    return None


def resolve_auto(src: str, config: dict, case, dp: int, micro_batch_size: Optional[int],
                 argument: Argument = cli_flag) -> tuple[dict, list[str]]:
    """``config`` with each ``"auto"`` the Hugging Face Trainer fills in resolved as it does
    (``transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig.trainer_config_process``) from
    the case, and a line for each: the micro-batch from ``micro_batch_size`` (the Trainer's
    per_device_train_batch_size: ``argument("micro_batch_size")``) or the case's layout, the
    accumulation from the case's global batch, the global batch as the Trainer computes it
    (world size ÷ model parallelism × micro-batch × accumulation), bf16/fp16 from its precision.
    The ZeRO buckets the Trainer sizes by the model (``trainer_config_finalize``): the reduce bucket
    at hidden² elements, and at stage 3 the prefetch bucket at 0.9·hidden² and the persistence
    threshold at 10·hidden. What it fills that the cost model does not read (learning rate) is left.
    DeepSpeed's own rewrites come first (:func:`as_deepspeed_reads`)."""
    config, resolved = as_deepspeed_reads(src, config)
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        value = config.get(key)
        if isinstance(value, str) and value != "auto":
            # The Trainer fills only the exact "auto" (HfDeepSpeedConfig.fill_match), and DeepSpeed takes an
            # integer: "AUTO" was taken as a micro-batch and named in refusals as one.
            raise CaseError(src, key, f"expected an integer or \"auto\", got {one_line(safe_repr(value), 40)}"
                                      + (" (the Trainer fills only the lower-case \"auto\")"
                                         if value.strip().lower() == "auto" else ""))
    gbs = case.training.global_batch_size
    micro = micro_batch_size or (case.layout.micro_batch_size if case.layout is not None else None)
    stated = config.get("train_micro_batch_size_per_gpu")
    if micro_batch_size is not None and stated not in (None, "auto") and stated != micro_batch_size:
        raise CaseError(*argument("micro_batch_size"), f"{micro_batch_size} differs from {src}'s "
                                                        f"train_micro_batch_size_per_gpu {stated!r}, which the run takes")
    if config.get("train_micro_batch_size_per_gpu") == "auto":
        if micro is None:
            raise CaseError(src, "train_micro_batch_size_per_gpu", "is \"auto\" (the Trainer's "
                                 f"per_device_train_batch_size): give {named(argument, 'micro_batch_size')}, or "
                                 "layout.micro_batch_size in the case")
        config["train_micro_batch_size_per_gpu"] = micro
        resolved.append(f"train_micro_batch_size_per_gpu: auto -> {micro}")
    elif stated is None and micro_batch_size is not None:
        batch, accumulation = config.get("train_batch_size"), config.get("gradient_accumulation_steps")
        if isinstance(batch, int) and not isinstance(batch, bool) and accumulation is None \
                and micro_batch_size * dp != batch:
            # DeepSpeed derives both from train_batch_size alone: one accumulation step of batch ÷ dp
            # (runtime/config.py, _set_batch_related_parameters); the option was taken, and the
            # accumulation derived from it, where the run takes none of it.
            raise CaseError(*argument("micro_batch_size"), f"{micro_batch_size} differs from the micro-batch "
                                                            f"DeepSpeed derives from {src}'s train_batch_size {batch} "
                                                            f"alone: {batch} / dp {dp}, one accumulation step")
        # The micro-batch the run is given, where the config derives its own (train_batch_size ÷
        # accumulation ÷ dp): one that disagrees is refused below, as DeepSpeed checks the three; it
        # was ignored, the derived one diagnosed.
        config["train_micro_batch_size_per_gpu"] = micro_batch_size
        resolved.append(f"train_micro_batch_size_per_gpu: not given -> {micro_batch_size} "
                        f"({named(argument, 'micro_batch_size')})")
    micro = config.get("train_micro_batch_size_per_gpu") if config.get("train_micro_batch_size_per_gpu") != "auto" \
        else micro
    if config.get("gradient_accumulation_steps") == "auto":
        if isinstance(micro, int) and not isinstance(micro, bool):
            micro = _positive(src, "train_micro_batch_size_per_gpu", micro)
        if not isinstance(micro, int) or gbs % (micro * dp):
            raise CaseError(src, "gradient_accumulation_steps", f"is \"auto\", but the case's global batch {gbs} is "
                                                                f"not a multiple of micro-batch {micro} x dp {dp}")
        stated_batch = config.get("train_batch_size")
        if isinstance(stated_batch, int) and not isinstance(stated_batch, bool) and stated_batch != gbs:
            # The Trainer fills the accumulation from its own batch (the case's global batch here) and then
            # refuses a train_batch_size that mismatches it; the accumulation derived from the case was
            # named as the file's own arithmetic ("128 is not micro 1 × accumulation 4 × data-parallel 16").
            raise CaseError(src, "train_batch_size", f"{stated_batch} differs from the case's global batch {gbs} "
                                                     f"({case.source} training.global_batch_size), from which "
                                                     f"gradient_accumulation_steps \"auto\" is filled: {gbs} / "
                                                     f"micro-batch {micro} / dp {dp} = {gbs // (micro * dp)}")
        config["gradient_accumulation_steps"] = gbs // (micro * dp)
        resolved.append(f"gradient_accumulation_steps: auto -> {gbs // (micro * dp)} (global batch {gbs} / "
                        f"micro-batch {micro} / dp {dp})")
    if config.get("train_batch_size") == "auto":
        accumulation = config.get("gradient_accumulation_steps")
        if isinstance(micro, int) and isinstance(accumulation, int) and not isinstance(accumulation, bool):
            # The Trainer's: world size ÷ model parallelism × per-device batch × accumulation. The case's
            # global batch was written here, and a disagreement then blamed the config's own arithmetic.
            filled = micro * accumulation * dp
            config["train_batch_size"] = filled
            resolved.append(f"train_batch_size: auto -> {filled} (micro-batch {micro} × accumulation "
                            f"{accumulation} × dp {dp}, as the Trainer fills it)")
        else:
            config["train_batch_size"] = gbs
            resolved.append(f"train_batch_size: auto -> {gbs} (the case's global batch)")
    zero = config.get("zero_optimization")
    if isinstance(zero, dict):
        hidden = case.model.hidden_size
        for key, (value, how) in trainer_sized_buckets(hidden, zero.get("stage") == 3).items():
            if zero.get(key) == "auto":
                zero = {**zero, key: value}
                resolved.append(f"zero_optimization.{key}: auto -> {value} ({how}, {hidden}, as the Trainer fills it)")
        config["zero_optimization"] = zero
    precision = case.training.precision
    for key, wanted in (("bf16", precision in ("bf16", "fp8")), ("fp16", precision == "fp16")):
        section = config.get(key)
        if isinstance(section, dict) and section.get("enabled") == "auto":
            config[key] = {**section, "enabled": wanted}
            resolved.append(f"{key}.enabled: auto -> {str(wanted).lower()} (training.precision "
                            f"{case.training.precision})")
    return config, resolved


def as_deepspeed_reads(src: str, config: dict) -> tuple[dict, list[str]]:
    """``config`` as DeepSpeed reads it, and a line for each rewrite: its deprecated spellings
    (``bfloat16`` for ``bf16``: ``precision_config.get_bfloat16_config``; ``zero_optimization``'s
    ``cpu_offload`` and ``cpu_offload_param`` for ``offload_optimizer`` and ``offload_param`` on the
    CPU: ``zero/config.py``'s ``new_param_fn``), and ``offload_param`` below stage 3, which only the
    stage-3 optimizer takes (``runtime/engine.py``): dropped, as DeepSpeed runs it. A deprecated key
    read as nothing priced the optimizer on the GPU, or the run in fp32."""
    config, notes = dict(config), []
    if config.get("bf16") is None and isinstance(config.get("bfloat16"), dict):  # bf16: null reads bfloat16 too
        config["bf16"] = config.pop("bfloat16")
        notes.append("bfloat16: read as bf16 (DeepSpeed's deprecated spelling)")
    zero = config.get("zero_optimization")
    if isinstance(zero, bool):
        # zero/config.py, read_zero_config_deprecated: true is stage 1 (its allgather bucket
        # allgather_size), false stage 0 (it was refused as no mapping).
        zero = {"stage": 1 if zero else 0}
        if config.get("allgather_size") is not None:
            zero["allgather_bucket_size"] = config["allgather_size"]
        notes.append(f"zero_optimization: {str(config['zero_optimization']).lower()} read as stage {zero['stage']} "
                     "(DeepSpeed's deprecated form)")
    if isinstance(zero, dict):
        zero = dict(zero)
        # DeepSpeedConfigModel drops a field's "auto" before reading it (runtime/config_utils.py), in
        # zero_optimization and in its offload sections alike: the default is what runs. (The Trainer fills
        # its three ZeRO sizes first, resolve_auto; the stage's is said below.) "contiguous_gradients":
        # "auto" was refused as a value "DeepSpeed's config refuses", which it runs as true.
        for key in [k for k, v in zero.items() if dropped_as_auto(k, v) and k not in TRAINER_FILLED_ZERO_KEYS + ("stage",)]:
            del zero[key]
        for section in OFFLOAD_KEYS:
            if isinstance(zero.get(section), dict):
                zero[section] = {k: v for k, v in zero[section].items() if not dropped_as_auto(k, v)}
        for name, other, why in ZERO_KEY_PAIRS:
            # Both spellings of one field: pydantic takes one as the field and refuses the other as an
            # extra input; a deprecated key beside its replacement fails DeepSpeed's assertion
            # (config_utils.py, _process_deprecated_field). The run does not start; it was priced.
            if name in zero and other in zero:
                raise CaseError(src, f"zero_optimization.{other}", f"given beside zero_optimization.{name}, {why}: "
                                                                   "DeepSpeed refuses the config (runtime/zero/config.py), "
                                                                   "and the launch would not start; expected one of the two")
        if zero.get("stage") == "auto":
            # DeepSpeedConfigModel drops a field's "auto" before reading it (runtime/config_utils.py), and the
            # Trainer fills no stage: DeepSpeed's default, 0.
            del zero["stage"]
            notes.append("zero_optimization.stage: \"auto\" read as absent, stage 0 (DeepSpeed's config drops "
                         "\"auto\", runtime/config_utils.py, and the Trainer fills no stage)")
        elif "stage" in zero:
            # DeepSpeedZeroConfig.stage, an int enum (ZeroStageEnum): "3", 3.0 and true (1) are stages to it.
            zero["stage"] = _lax_int(src, "zero_optimization.stage", zero["stage"], 0)  # (0 to 3: read() says so)
        for old, new in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")):
            if old in zero:
                # Optional[bool] fields of DeepSpeedZeroConfig, made their sections once read ("true" is true)
                flag = zero.pop(old)
                flag = flag is not None and _lax_bool(src, f"zero_optimization.{old}", flag)
                if flag and new not in zero:
                    zero[new] = {"device": "cpu"}
                    notes.append(f"zero_optimization.{old}: true read as {new} on the cpu (DeepSpeed's deprecated "
                                 f"spelling)")
        stage = zero.get("stage", 0)
        if zero.get("offload_param") is not None and isinstance(stage, int) and stage < 3:
            zero.pop("offload_param")
            notes.append(f"zero_optimization.offload_param: ignored at stage {stage}, as DeepSpeed does (only its "
                         f"stage-3 optimizer offloads parameters)")
        config["zero_optimization"] = zero
    return config, notes


def trainer_sized_buckets(hidden: int, stage3: bool) -> dict[str, tuple[int, str]]:
    """The ZeRO sizes the Hugging Face Trainer gives an "auto" by the model's hidden size, and how
    (transformers, integrations/deepspeed.py, ``trainer_config_finalize``: the reduce bucket at every
    stage, the prefetch bucket and the persistence threshold at stage 3)."""
    sized = {"reduce_bucket_size": (hidden * hidden, "the hidden size squared")}
    if stage3:
        sized["stage3_prefetch_bucket_size"] = (int(0.9 * hidden * hidden), "0.9 × the hidden size squared")
        sized["stage3_param_persistence_threshold"] = (10 * hidden, "10 × the hidden size")
    return sized


def autoep_size(src: str, config: dict) -> Optional[int]:
    """The expert parallelism of DeepSpeed's AutoEP where the config turns it on (``expert_parallel``:
    ``enabled``, ``autoep_size``, default 1; module_inject/auto_ep_config.py, parse_autoep_config),
    which swaps the model's MoE blocks for its own expert-parallel layers (runtime/engine.py,
    ``_configure_expert_parallel``); None where it is off. It was read as no expert parallelism:
    Mixtral at autoep_size 8 on 8 GPUs was called 213.6 GB and not fitting."""
    section = config.get("expert_parallel")
    if section is None:
        return None
    if not isinstance(section, dict):
        raise CaseError(src, "expert_parallel", f"expected a mapping, got {one_line(safe_repr(section), 40)}")
    if not _lax_bool(src, "expert_parallel.enabled", section.get("enabled", False)):
        return None
    return _positive(src, "expert_parallel.autoep_size", section.get("autoep_size", 1))


def reduction_as_configured(path: Union[str, Path], case, engine, pp: int = 1):
    """``engine`` (DeepSpeed's behaviour) with the ZeRO-1/2 gradient reduction the config runs: buckets
    of its ``reduce_bucket_size`` elements (5e8 unless set; "auto" the Trainer's hidden²:
    :func:`resolve_auto`), staged through one buffer with contiguous_gradients (DeepSpeed's default,
    and any optimizer offload) and a second with overlap_comm (off below stage 3 unless set)
    (runtime/zero/stage_1_and_2.py, ``setup_buckets``: "double buffers to avoid data access conflict
    when overlap_comm is enabled"). The estimate priced the two buffers of 5e8 its own files write:
    1.9 GB more than a Trainer's ZeRO-2 config with "auto" holds for an 8B model."""
    from dataclasses import replace

    src = str(path)
    config, _ = as_deepspeed_reads(src, load_config(Path(path)))
    zero = config.get("zero_optimization") if isinstance(config.get("zero_optimization"), dict) else {}
    bucket = zero.get("reduce_bucket_size", engine.bucket_params)
    bucket = trainer_sized_buckets(case.model.hidden_size, False)["reduce_bucket_size"][0] if bucket == "auto" \
        else _lax_int(src, "zero_optimization.reduce_bucket_size", bucket, 1)
    contiguous = _offload_device(src, zero, "offload_optimizer") or \
        _lax_bool(src, "zero_optimization.contiguous_gradients", zero.get("contiguous_gradients", True))
    overlap = zero.get("overlap_comm", False)
    overlap = False if overlap == "auto" else _lax_bool(src, "zero_optimization.overlap_comm", overlap)
    # ZeRO-3's gathered weights and its step's fp32 gradient copy, as the config sizes them: DeepSpeedZeroConfig's
    # max_live_parameters (alias stage3_max_live_parameters) and sub_group_size, 1e9 each unless set ("auto", which
    # DeepSpeedConfigModel drops, the same; runtime/zero/config.py). Both were priced at 1e9 whatever the file said:
    # stage3_max_live_parameters 1e11, which keeps an 8B model's every weight gathered, read as 1e9.
    # And how far ahead it looks before releasing a module's gathered weights (max_reuse_distance, alias
    # stage3_max_reuse_distance, 1e9 unless set): under full recomputation, what lies further is gathered again
    # for the backward (dp_time.regathered_parameters).
    def size(keys: tuple[str, ...], default):
        for key in keys:
            if zero.get(key, "auto") != "auto":
                return float(_lax_int(src, f"zero_optimization.{key}", zero[key], 0))
        return default

    # How ZeRO-1/2 reduces each bucket (zero/stage_1_and_2.py, average_tensor): all-reduced whole unless
    # use_multi_rank_bucket_allreduce is false (true by default, zero/config.py) and reduce_scatter is not; then
    # each slice goes to its owner alone, one dist.reduce per destination rank (allreduce_no_retain with
    # rank=dst), which moves a reduce-scatter's bytes and is priced as one: the latency of those dp·cp calls
    # per bucket, against the one collective priced, is not.
    per_owner = _reduces_to_owners(src, zero)
    engine = replace(engine, gradient_wire_bytes=communication_bytes(src, config, case.training.precision),
                     zero12_bucket_all_reduce=engine.zero12_bucket_all_reduce and not per_owner,
                     zero3_max_live_parameters=size(("stage3_max_live_parameters", "max_live_parameters"),
                                                    engine.zero3_max_live_parameters),
                     zero3_step_sub_group_params=size(("sub_group_size",), engine.zero3_step_sub_group_params),
                     zero3_max_reuse_distance=size(("stage3_max_reuse_distance", "max_reuse_distance"),
                                                   engine.zero3_max_reuse_distance))
    if runs_bf16_optimizer_with_bf16_gradients(src, config, pp):
        # Read as ZeRO-1 (its states are sharded so), but no ZeRO optimizer's buckets: the BF16_Optimizer's
        # flat bf16 accumulator instead (EngineBehaviour.flat_gradient_accumulator).
        return replace(engine, reduce_bucket_buffers=0, flat_gradient_accumulator=True)
    return replace(engine, bucket_params=float(bucket), reduce_bucket_buffers=int(contiguous) * (1 + int(overlap)))


# Bytes an element of each dtype communication_data_type names (runtime/config.py, get_communication_data_type).
COMM_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0}


def said_dtype(src: str, config: dict, key: str) -> Optional[str]:
    """The dtype ``key`` sets, in lower case (DeepSpeed reads it so), or None where unset; any value but
    fp32, fp16 or bf16 refused, as DeepSpeed refuses it at start-up, whether or not it is used
    (runtime/config.py, ``get_communication_data_type``: ValueError)."""
    said = config.get(key)
    if said is not None and (not isinstance(said, str) or said.lower() not in COMM_BYTES):
        raise CaseError(src, key, f"expected fp32, fp16 or bf16 (runtime/config.py, get_communication_data_type), "
                                  f"got {one_line(safe_repr(said), 40)}")
    return None if said is None else said.lower()


def communication_bytes(src: str, config: dict, precision: str) -> float:
    """Bytes a gradient takes on DeepSpeed 0.19's data-parallel reduction: ``communication_data_type``
    where the ds_config sets it, else the model's dtype: fp16 under fp16, bf16 under bf16, fp32 otherwise
    (runtime/engine.py, ``DeepSpeedEngine.communication_data_type``), whatever dtype the gradients are
    accumulated in (``precision``: the case's, which the config trains in). ``allreduce_bucket`` (stage 0,
    the BF16_Optimizer's fp32 buffers, the pipeline's reduction), ZeRO-1/2's ``gradient_reduction_w_predivide``/``average_tensor`` and ZeRO-3's reduce-scatter
    cast each bucket to it; measured in tests/test_emit_deepspeed.py (the BF16_Optimizer's fp32 gradients
    all-reduced in bf16 unless the config says fp32)."""
    said = said_dtype(src, config, "communication_data_type")
    if said is not None:
        return COMM_BYTES[said]
    # The case's precision, which the config's bf16/fp16 sections must train in (read_layout checks
    # it; "auto" is the Trainer's, from the same precision): the model's dtype, 16-bit unless fp32.
    return float(activation_bytes(precision))


def runs_bf16_optimizer_with_bf16_gradients(src: str, config: dict, pp: int) -> bool:
    """Whether DeepSpeed runs its BF16_Optimizer accumulating in bf16: a pipeline's bf16 at ZeRO 0 with
    the gradients in the model's dtype (``runtime/engine.py``, ``_do_optimizer_sanity_check``: BFLOAT16
    where ``model_dtype == grad_accum_dtype`` under pipeline parallelism; Megatron-DeepSpeed's llama
    configs), which keeps a flat bf16 buffer of every gradient (``runtime/bf16_optimizer.py``)."""
    zero = config.get("zero_optimization") if isinstance(config.get("zero_optimization"), dict) else {}
    bf16 = config.get("bf16") if isinstance(config.get("bf16"), dict) else {}
    stage = _lax_int(src, "zero_optimization.stage", zero.get("stage", 0), 0)
    return pp > 1 and stage == 0 and _lax_bool(src, "bf16.enabled", bf16.get("enabled", False)) \
        and not _accumulates_fp32(src, config)


def pipeline_checkpointing(src: str, config: dict, pp: int) -> Optional[int]:
    """``pipeline.activation_checkpoint_interval``, where DeepSpeed's pipeline engine (pp > 1) takes
    it: above 0 its ``PipelineModule`` checkpoints every layer, that many at a time
    (``runtime/pipe/engine.py``); None where it does not apply."""
    section = config.get("pipeline")
    if pp == 1 or section is None:
        return None
    if not isinstance(section, dict):
        raise CaseError(src, "pipeline", f"expected a mapping, got {section!r}")
    interval = _positive(src, "pipeline.activation_checkpoint_interval",
                         section.get("activation_checkpoint_interval", 0), minimum=0)
    return interval or None


def auto_resolved(path: Union[str, Path], case, pp: Optional[int] = None, tp: Optional[int] = None,
                  micro_batch_size: Optional[int] = None, argument: Argument = cli_flag) -> list[str]:
    """What :func:`read` resolved of the config (its ``"auto"`` values, DeepSpeed's rewrites, the
    pipeline engine's checkpointing), one line each."""
    config = load_config(Path(path))
    said = _degrees_said(str(path), planned_layout(str(path), config), pp, tp, argument)
    pp, tp = _degrees(str(path), config, case, pp, tp)
    lines = resolve_auto(str(path), config, case, _dp(str(path), config, case, pp, tp, said), micro_batch_size,
                         argument)[1]
    interval = pipeline_checkpointing(str(path), config, pp)
    if interval is not None:
        lines.append(f"pipeline.activation_checkpoint_interval: {interval} -> recompute full (DeepSpeed's pipeline "
                     f"engine checkpoints every layer, {interval} at a time)")
    return lines


def _pipeline_tp(case, pp: int, tp: Optional[int]) -> Optional[int]:
    """A pipeline's tensor parallelism (Megatron-DeepSpeed's model splits its own layers): the
    caller's, else the case's layout's, which ds_config does not state."""
    if tp is None and pp > 1 and case.layout is not None and case.layout.tp > 1:
        return case.layout.tp
    return tp


def _dp(src: str, config: dict, case, pp: int, tp: Optional[int], said: Optional[tuple[str, str]] = None) -> int:
    """The data-parallel size the degrees leave, for filling "auto" batch values: refused where tp x pp
    does not divide the GPUs, before a value is filled from it (--pp 3 on 16 GPUs was told its global
    batch is no multiple of dp 5)."""
    tp_section = config.get("tensor_parallel", {})
    autotp = tp_section.get("autotp_size", 0) if isinstance(tp_section, dict) else 0
    tp = tp or (autotp if isinstance(autotp, int) and not isinstance(autotp, bool) and autotp > 0 else 0) or 1
    _check_degrees_divide(src, case, tp, pp, said)
    return case.cluster.num_gpus // (tp * pp)


def _check_gathered_lm_head(src: str, tp_section: dict) -> None:
    """AutoTP's LM head as priced: gathered, whole logits on every rank (``EngineBehaviour.
    gathers_logits_without_pipeline``). ``vocab_parallel_lm_head: true`` keeps them vocabulary-sharded and
    runs DeepSpeed's own distributed loss (``deepspeed/sequence/cross_entropy.py``), which is not priced;
    DeepSpeed's config takes a bool or null (``runtime/tensor_parallel/config.py``). Null (absent) is the
    gathered head unless a Hugging Face tp plan asks ``embedding_rowwise`` of a tied embedding, where
    DeepSpeed turns the vocabulary-parallel head on by itself (``runtime/engine.py``,
    ``auto_vocab_parallel_lm_head``): the emitted files say false; a config cannot say which model it runs."""
    key = "tensor_parallel.vocab_parallel_lm_head"
    value = tp_section.get("vocab_parallel_lm_head")
    if value is not None and _lax_bool(src, key, value):
        raise CaseError(src, key, "true: AutoTP's vocabulary-parallel LM head and DeepSpeed's distributed loss are "
                                  "not priced (the gathered head's whole logits are); expected false or absent")


def _check_degrees_divide(src: str, case, tp: int, pp: int, said: Optional[tuple[str, str]]) -> None:
    """tp x pp divides the cluster's GPUs (DeepSpeed's world is their product times dp), said by who set them."""
    gpus = case.cluster.num_gpus
    if gpus % (tp * pp):
        raise CaseError(*(said or (src, "tensor_parallel.autotp_size")),
                        f"tp {tp} x pp {pp} = {tp * pp} must divide the cluster's {gpus} GPUs")


# The line of layout-planner's header (``_comment``) that gives the recomputation its files were planned
# with: no ds_config key says that the model checkpoints (activation_checkpointing configures what the
# model's code calls), so its own files were read back as recomputing nothing and as not fitting.
PLANNED_RECOMPUTE = "recompute: full"


# The line of its header that gives the layout its files were planned with where ds_config has no key for
# it, the model code's (``PipelineModule``'s stages, DeepSpeed-MoE's ep_size): without it the planner's own
# Mixtral files were read back as ep 1 and not fitting, its pipelines as no pipeline (emit.planned_layout_line).
PLANNED_LAYOUT = "planned layout:"
PLANNED_KEYS = ("pp", "tp", "stage_layers", "ep", "recompute")


def _written_by_planner(config: dict) -> list[str]:
    """The ``_comment`` lines of a config layout-planner wrote (its header's first line), else none: what a
    ds_config cannot say is not guessed from anyone else's."""
    from planner.emit import GENERATED

    lines = config.get("_comment")
    if not isinstance(lines, list) or not lines or not str(lines[0]).startswith(GENERATED):
        return []
    return [str(line) for line in lines]


def planned_layout(src: str, config: dict) -> dict[str, Any]:
    """What the header's ``planned layout:`` line says (``pp``, ``tp``, ``stage_layers``, ``ep``,
    ``recompute``), in a config layout-planner wrote; empty where there is none. One edited past reading
    is refused, naming the file and ``_comment``: read as nothing, the plan's own files were misread."""
    said = [line for line in _written_by_planner(config) if line.startswith(PLANNED_LAYOUT)]
    if not said:
        return {}
    if len(said) > 1:
        raise CaseError(src, "_comment", f"{len(said)} '{PLANNED_LAYOUT}' lines; expected one")
    planned: dict[str, Any] = {}
    expected = f"expected key=value words of {', '.join(PLANNED_KEYS)}, each once"
    # The words, then the emitter's own aside in parentheses (planned_layout_line), which says nothing read.
    words = said[0][len(PLANNED_LAYOUT):].split("(", 1)[0].split()
    if not words:
        # "planned layout: (pp=2)" read as stating nothing: the case's layout, or 1, stood in for its pp.
        where = "before its '('" if "(" in said[0] else "after it"
        raise CaseError(src, "_comment", f"'{one_line(said[0], 60)}' states no layout {where}: {expected}, "
                                         "before any parenthesised aside")
    for word in words:
        key, equals, value = word.partition("=")
        if not equals or key not in PLANNED_KEYS or key in planned:
            raise CaseError(src, "_comment", f"'{PLANNED_LAYOUT}' {one_line(word, 40)}: {expected}")
        if key == "recompute":
            if value not in ("none", "full"):
                raise CaseError(src, "_comment", f"'{PLANNED_LAYOUT}' recompute={one_line(value, 40)}: expected "
                                                 "none or full")
            planned[key] = value
            continue
        numbers = value.split(",") if key == "stage_layers" else [value]
        # (ASCII digits, few enough for int(): "²" is a digit to str.isdigit, and int() refuses 5,000 of them)
        if not all(n.isascii() and n.isdigit() and len(n) <= 18 and 0 < int(n) <= MAX_INT for n in numbers):
            raise CaseError(src, "_comment", f"'{PLANNED_LAYOUT}' {key}={one_line(value, 40)}: expected "
                                             + ("whole numbers of at least 1, comma-separated"
                                                if key == "stage_layers" else "a whole number of at least 1"))
        planned[key] = tuple(map(int, numbers)) if key == "stage_layers" else int(value)
    return planned


def planned_recompute(config: dict) -> Optional[str]:
    """"full" where the config is one layout-planner wrote (its header's first line) for a layout that
    recomputes every layer, as its ``recompute: full`` line said before the ``planned layout:`` line
    (:func:`planned_layout`) said it; else None."""
    return "full" if any(line.startswith(PLANNED_RECOMPUTE) for line in _written_by_planner(config)) else None


def _degrees_said(src: str, planned: dict, pp: Optional[int], tp: Optional[int],
                  argument: Argument) -> Optional[tuple[str, str]]:
    """Who set the degrees, for a refusal of their product: an option the caller gave, else the header."""
    return argument("pp") if pp is not None else argument("tp") if tp is not None else \
        (src, "_comment") if "pp" in planned else None


def _degrees(src: str, config: dict, case, pp: Optional[int], tp: Optional[int]) -> tuple[int, Optional[int]]:
    """The pipeline depth and a pipeline's tensor parallelism as the reading takes them (the pp option,
    else the header's planned layout, else the case's layout, else 1; tp likewise, the header's for its
    own pipeline only)."""
    planned = planned_layout(src, config)
    if pp is None:
        pp = planned.get("pp", case.layout.pp if case.layout is not None else 1)
    if tp is None and pp > 1 and planned.get("pp") == pp and "tp" in planned:
        tp = planned["tp"]
    return pp, _pipeline_tp(case, pp, tp)


def read(path: Union[str, Path], case, pp: Optional[int] = None, tp: Optional[int] = None,
         micro_batch_size: Optional[int] = None, recompute: Optional[str] = None,
         ep: Optional[int] = None, stage_layers: Optional[tuple[int, ...]] = None,
         argument: Argument = cli_flag) -> Layout:
    """The layout of an existing ds_config.json on ``case``'s cluster, with ``pp`` pipeline stages
    and, for a pipeline whose model splits its own layers (Megatron-DeepSpeed's 3D grid), ``tp``;
    without a pipeline tp is AutoTP's ``tensor_parallel.autotp_size``. What the model's code
    decides and ds_config does not state comes from the case's layout where it has one: the
    pipeline stages and their layers (``PipelineModule``'s partition; ``pp`` by default), the
    experts' parallelism (DeepSpeed-MoE's ``ep_size``: ``ep`` where given), the recomputation.

    Batch sizes follow DeepSpeed's rules: any one or two of train_batch_size,
    train_micro_batch_size_per_gpu and gradient_accumulation_steps, the rest derived as
    ``DeepSpeedConfig._set_batch_related_parameters`` does, then checked as
    ``_batch_assertion`` does, with the data-parallel size num_gpus / (tp·pp).
    """
    path = Path(path)
    src = str(path)
    config = load_config(path)
    stated = case.layout
    # What the planner's own header says the model's code builds: read before the case's layout, which
    # may be another engine's (a Megatron layout beside `plan --engine deepspeed`'s files) or none.
    planned = planned_layout(src, config)
    # Neither the pp option, the header nor the case's layout says it.
    pipeline_unstated = pp is None and stated is None and "pp" not in planned
    degrees_said = _degrees_said(src, planned, pp, tp, argument)
    if pp is not None:
        pp = _positive(*argument("pp"), pp)
    # Who says tp, for a refusal: the tp option, the header, or the case's layout where a pipeline takes it.
    tp_said = named(argument, "tp") if tp is not None else f"{path.name}'s _comment tp" \
        if pp in (None, planned.get("pp")) and "tp" in planned else "the case's layout.tp"
    # Who says pp, for a refusal of the data-parallel size it leaves.
    pp_said = named(argument, "pp") if pp is not None else f"{path.name}'s _comment (planned layout: " \
        f"pp={planned['pp']})" if "pp" in planned else "the case's layout.pp" if stated is not None else None
    pp, tp = _degrees(src, config, case, pp, tp)
    # The header's pipeline split and its tensor parallelism are those of its own pipeline depth.
    own_pipeline = planned.get("pp") == pp
    batch_was_auto = config.get("train_batch_size") == "auto"
    config = resolve_auto(src, config, case, _dp(src, config, case, pp, tp, degrees_said), micro_batch_size,
                          argument)[0]
    _check_optimizer(src, config, case)
    ulysses = config.get("sequence_parallel_size", 1)
    if ulysses != 1:
        # runtime/config.py: the batch's data-parallel size is the world over sequence_parallel_size.
        raise CaseError(src, "sequence_parallel_size", f"{one_line(safe_repr(ulysses), 40)}: DeepSpeed-Ulysses sequence "
                                                       "parallelism is not priced (the planner's context parallelism "
                                                       "is Megatron-LM's and torchtitan's); expected 1 or absent")

    tp_section = config.get("tensor_parallel", {})
    if not isinstance(tp_section, dict):
        raise CaseError(src, "tensor_parallel", f"expected a mapping, got {tp_section!r}")
    autotp = _positive(src, "tensor_parallel.autotp_size", tp_section.get("autotp_size", 0), minimum=0)
    if tp is not None:
        tp = _positive(*argument("tp"), tp)
        if autotp and autotp != tp:
            raise CaseError(src, "tensor_parallel.autotp_size", f"{autotp} differs from {tp_said} {tp}")
    tp = tp or autotp or 1
    if pp == 1 and tp > 1:
        _check_gathered_lm_head(src, tp_section)
    _check_degrees_divide(src, case, tp, pp, degrees_said)
    gpus = case.cluster.num_gpus
    dp = gpus // (tp * pp)

    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    given = {k: _positive(src, k, config[k]) for k in keys if config.get(k) is not None}
    batch, micro, accum = (given.get(k) for k in keys)
    if batch is not None and micro is not None and accum is None:
        accum = batch // micro // dp
        if accum < 1:
            raise CaseError(src, "train_batch_size", f"{batch} is less than micro {micro} x data-parallel {dp} "
                                                     f"= {micro * dp}")
    elif batch is not None and accum is not None and micro is None:
        micro = batch // dp // accum
        if micro < 1:
            raise CaseError(src, "train_batch_size", f"{batch} is less than accumulation {accum} x "
                                                     f"data-parallel {dp} = {accum * dp}")
    elif micro is not None and accum is not None and batch is None:
        batch = micro * accum * dp
    elif batch is not None and micro is None and accum is None:
        accum, micro = 1, batch // dp
        if micro < 1:
            raise CaseError(src, "train_batch_size", f"{batch} is less than the data-parallel size {dp}")
    elif micro is not None and batch is None and accum is None:
        batch, accum = micro * dp, 1
    elif batch is None and micro is None:
        raise CaseError(src, "train_batch_size", "missing; give train_batch_size or train_micro_batch_size_per_gpu")
    if batch != micro * accum * dp:
        # Where the data-parallel size came from, where the file's batch keys do not say it: the pipeline (and
        # its tp) of an option, the header's planned layout or the case's layout (ds_pp2.json's "pp=2" made
        # dp 8, and the refusal read as the file's own arithmetic being wrong).
        said = {"pp": pp_said, "tp": tp_said if tp > 1 and not autotp else None}
        dp_from = "".join(f"; {k} {v} from {said[k]}" for k, v in (("pp", pp), ("tp", tp)) if v > 1 and said[k])
        if dp_from:
            dp_from = f" (data-parallel {dp} = {gpus} GPUs / (tp {tp} × pp {pp}){dp_from})"
        hint = ""
        if pipeline_unstated and batch % (micro * accum) == 0 and gpus % (batch // (micro * accum)) == 0:
            # The file is likely right and the data-parallel size wrong: a ds_config.json does not state
            # the pipeline (its PipelineModule does), which --pp gives (the planner's own pipeline files).
            hint = (f"; ds_config.json does not state the pipeline, taken as pp {pp} and tp {tp}: for data-parallel "
                    f"{batch // (micro * accum)}, give pp · tp = {gpus // (batch // (micro * accum))} "
                    f"({named(argument, 'pp')}, {named(argument, 'tp')})")
        raise CaseError(src, "train_batch_size", f"{batch} is not micro {micro} × accumulation {accum} × "
                                                 f"data-parallel {dp} = {micro * accum * dp}{dp_from}{hint}")
    global_batch = case.training.global_batch_size
    if batch != global_batch:
        said = f"\"auto\", as the Trainer fills it (micro {micro} × accumulation {accum} × data-parallel {dp})," \
            if batch_was_auto else "train_batch_size" if "train_batch_size" in given else \
            f"train_batch_size (micro {micro} × accumulation {accum} × data-parallel {dp})"
        raise CaseError(src, "train_batch_size", f"{said} is {batch}, but the case {case.source} has "
                                                 f"training.global_batch_size {global_batch}")

    zero_section = config.get("zero_optimization", {})
    if not isinstance(zero_section, dict):
        raise CaseError(src, "zero_optimization", f"expected a mapping, got {zero_section!r}")
    zero = _positive(src, "zero_optimization.stage", zero_section.get("stage", 0), minimum=0)
    if zero > 3:
        raise CaseError(src, "zero_optimization.stage", f"expected 0, 1, 2 or 3, got {zero}")
    if pp > 1 and zero > 1:
        raise CaseError(src, "zero_optimization.stage", f"DeepSpeed's pipeline engine refuses ZeRO stage {zero} "
                                                        f"(pp {pp}); expected 0 or 1")

    bf16, fp16 = _enabled(src, config, "bf16"), _enabled(src, config, "fp16")
    if bf16 and fp16:
        raise CaseError(src, "fp16.enabled", "bf16 and fp16 cannot both be enabled")
    autocast = config.get("torch_autocast")
    # DeepSpeed takes the key as written and tests its truth (runtime/config.py get_torch_autocast_enabled,
    # get_scalar_param; engine.py: `if self.torch_autocast_enabled()`): "false" as a string turns it on.
    if isinstance(autocast, dict) and autocast.get("enabled", False):
        raise CaseError(src, "torch_autocast.enabled", "DeepSpeed runs the model's forward and backward under "
                                                       "torch.autocast (runtime/torch_autocast.py): low-precision "
                                                       "GEMMs beside weights kept in their own dtype, which no "
                                                       "training.precision prices; expected it off (bf16.enabled or "
                                                       "fp16.enabled for mixed precision)")
    written = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    wanted = {"fp8": "bf16"}.get(case.training.precision, case.training.precision)
    if written != wanted:
        key = "bf16.enabled" if bf16 else "fp16.enabled" if fp16 else "bf16"
        # get_bfloat16_config reads bf16 where it is given, whatever the deprecated bfloat16 beside it says.
        ignored = " (bfloat16 beside bf16 is ignored: DeepSpeed reads bf16)" if "bfloat16" in config else ""
        raise CaseError(src, key, f"the config trains in {written}{ignored}, but the case {case.source} has "
                                  f"training.precision {case.training.precision}")

    fp16_section = config.get("fp16") if isinstance(config.get("fp16"), dict) else {}
    fp16_master = fp16_section.get("fp16_master_weights_and_grads", False)  # "auto": dropped, DeepSpeedConfigModel
    if fp16_master != "auto" and _lax_bool(src, "fp16.fp16_master_weights_and_grads", fp16_master):
        # DeepSpeedFP16Config.fp16_master_weights_and_grads (runtime/precision_config.py), which the engine hands
        # to its ZeRO optimizer whether or not fp16 is enabled (runtime/engine.py, _configure_zero_optimizer): the
        # optimizer's master partition and its gradients in fp16 (runtime/base_optimizer.py,
        # _configure_master_weights). It was read as fp32 master weights, as priced.
        raise CaseError(src, "fp16.fp16_master_weights_and_grads", "true: DeepSpeed keeps the optimizer's master "
                                                                   "weights and gradients in fp16, which no case "
                                                                   "prices (fp32 master weights, or bf16's own "
                                                                   "without: training.master_weights); expected "
                                                                   "false or absent")
    master_said = config["bf16"].get("bf16_master_weights_and_grads", False) if bf16 else False
    master_bf16 = master_said != "auto" and _lax_bool(src, "bf16.bf16_master_weights_and_grads", master_said)
    if master_bf16 == case.training.master_weights:
        raise CaseError(src, "bf16.bf16_master_weights_and_grads",
                        f"the config keeps {'bf16' if master_bf16 else 'fp32'} master weights, but the case "
                        f"{case.source} has training.master_weights {str(case.training.master_weights).lower()}")
    states_bf16 = bf16 and _lax_bool(src, "bf16.bf16_optimizer_states", config["bf16"].get("bf16_optimizer_states",
                                                                                          False))
    if states_bf16 and not master_bf16:  # runtime/config.py asserts it
        raise CaseError(src, "bf16.bf16_optimizer_states", "needs bf16_master_weights_and_grads true (DeepSpeed's "
                                                           "config refuses it without)")
    zero_settings = config.get("zero_optimization") if isinstance(config.get("zero_optimization"), dict) else {}
    if master_bf16 and not states_bf16 and not _offload_device(src, zero_settings, "offload_optimizer"):
        # Its fp32 moments cannot stay on the GPU beside bf16 master weights: the ZeRO optimizer asserts
        # ZeRO-Offload with DeepSpeedCPUAdam (runtime/zero/stage_1_and_2.py, _enforce_cpu_offload).
        raise CaseError(src, "bf16.bf16_master_weights_and_grads", "keeps fp32 optimizer states without "
                                                                   "bf16_optimizer_states, which DeepSpeed runs only "
                                                                   "offloaded to DeepSpeedCPUAdam: set "
                                                                   "bf16_optimizer_states true, or offload_optimizer "
                                                                   "to the cpu")

    if bf16:
        zero = _bf16_optimizer_stage(src, config, zero, pp, case)

    checkpointing = config.get("activation_checkpointing")
    if checkpointing is not None and not isinstance(checkpointing, dict):
        raise CaseError(src, "activation_checkpointing", f"expected a mapping, got {checkpointing!r}")
    # DeepSpeed's section configures the checkpointing the model's code calls (partitioned, on the
    # CPU): it does not say that the model checkpoints. That is the case's (layout.recompute), the
    # caller's (diagnose --recompute, the Trainer's gradient_checkpointing), else none; but the
    # pipeline engine's own interval checkpoints every layer (read as none, it was priced without).
    interval = pipeline_checkpointing(src, config, pp)
    if interval is not None:
        if recompute not in (None, "full"):
            raise CaseError(*argument("recompute"), f"{recompute}: {src}'s pipeline.activation_checkpoint_interval "
                                                    f"{interval} checkpoints every layer: full")
        recompute = "full"
    recompute = recompute or planned.get("recompute") or planned_recompute(config) \
        or (case.layout.recompute if case.layout is not None else None) or "none"

    offload = {name: _offload_device(src, zero_section, name) for name in ("offload_optimizer", "offload_param")}
    # The experts' parallelism: AutoEP's, where the config turns it on; else the model's code (DeepSpeed-MoE's
    # ep_size), as the caller or the case's layout says. PipelineModule's partition, likewise.
    auto_ep = autoep_size(src, config)
    if auto_ep is not None and ep is not None and ep != auto_ep:
        raise CaseError(*argument("ep"), f"{ep} differs from {src}'s expert_parallel.autoep_size {auto_ep}, which "
                                         "the run takes")
    ep = auto_ep or (ep if ep is not None else planned["ep"] if "ep" in planned
                     else stated.ep if stated is not None else 1)
    split_said = argument("stage_layers")
    if stage_layers is None and own_pipeline and "stage_layers" in planned:
        stage_layers, split_said = planned["stage_layers"], (src, "_comment")
    if stage_layers is None:
        stage_layers = stated.stage_layers if stated is not None and stated.pp == pp else None
    elif len(stage_layers) != pp or sum(stage_layers) != case.model.num_layers:
        raise CaseError(*split_said, f"{len(stage_layers)} stages of {sum(stage_layers)} layers; "
                                     f"expected pp = {pp} stages holding the model's {case.model.num_layers} layers")
    # DeepSpeed-MoE splits the experts over the tensor-parallel ranks (the engine's expert_tp "tp"), as
    # the search writes it: etp = tp for a model with experts, as the case's layout states it, and in the
    # planner's own files (whose header states ep) whatever another engine's layout in the case says.
    etp = stated.etp if stated is not None and (stated.etp in (None, tp) or "ep" not in planned) \
        else (tp if case.model.is_moe else None)
    return Layout(dp=dp, tp=tp, pp=pp, micro_batch_size=micro, zero_stage=zero, recompute=recompute,
                  offload_optimizer=1.0 if offload["offload_optimizer"] else 0.0,
                  offload_params=offload["offload_param"], ep=ep, etp=etp, stage_layers=stage_layers)


# DeepSpeed's optimizer types (runtime/config.py: ADAM_OPTIMIZER ... and torch.optim's names it
# falls back to) by the states the cost model prices: two fp32 moments (Adam's family, LAMB's), or none.
_TWO_MOMENTS = ("adam", "adamw", "cpuadam", "fusedadam", "onebitadam", "zerooneadam", "lamb", "onebitlamb")


def _check_optimizer(src: str, config: dict, case) -> None:
    """The optimizer the config builds (``optimizer.type``) holds the states the case's does."""
    section = config.get("optimizer")
    if section is None:
        return  # the model code's own optimizer, passed to deepspeed.initialize
    if not isinstance(section, dict):
        raise CaseError(src, "optimizer", f"expected a mapping, got {section!r}")
    kind = section.get("type")
    if not isinstance(kind, str):
        raise CaseError(src, "optimizer.type", f"expected an optimizer's name, got {kind!r}")
    name = kind.lower()
    wanted = case.training.optimizer
    if name == "sgd" and wanted == "sgd" or name in _TWO_MOMENTS and wanted != "sgd":
        return
    held = "no moments (SGD)" if name == "sgd" else "two moments" if name in _TWO_MOMENTS else "states not priced"
    raise CaseError(src, "optimizer.type", f"is {kind} ({held}), but the case's optimizer is {wanted} "
                                           "(training.optimizer: the optimizer states are priced by it)")


# DeepSpeed's names for fp32 (runtime/config_utils.py DtypeEnum).
_FP32_NAMES = ("fp32", "float32", "float", "torch.float32")


def _bf16_optimizer_stage(src: str, config: dict, zero: int, pp: int, case) -> int:
    """The ZeRO stage a bf16 config runs, checked against the case's gradients, as DeepSpeed picks its
    optimizer (``runtime/engine.py``, ``_do_optimizer_sanity_check``): the gradients accumulate in
    ``data_types.grad_accum_dtype``, the model's dtype unless set (``get_data_types``); without ZeRO,
    fp32 gradients are refused ("unsupported mix"), and a pipeline's bf16 runs the BF16_Optimizer,
    which shards the optimizer states as ZeRO-1 does (``runtime/bf16_optimizer.py``): stage 0 reads as
    1 there. Stage 1 with fp32 gradients runs the BF16_Optimizer too."""
    fp32 = _accumulates_fp32(src, config)
    if zero == 0 and fp32:
        raise CaseError(src, "data_types.grad_accum_dtype", "fp32 with bf16 and ZeRO stage 0: DeepSpeed refuses the "
                                                            "mix (runtime/engine.py, _do_optimizer_sanity_check: "
                                                            "NotImplementedError); expected zero_optimization.stage 1")
    if fp32 != fp32_gradients(case.training):
        raise CaseError(src, "data_types.grad_accum_dtype",
                        f"the config accumulates {'fp32' if fp32 else 'bf16'} gradients, but the case "
                        f"{case.source} has training.fp32_grads {str(not fp32).lower()}")
    return 1 if zero == 0 and pp > 1 else zero


def _accumulates_fp32(src: str, config: dict) -> bool:
    """Whether ``data_types.grad_accum_dtype`` is fp32 (the model's dtype unless set: ``get_data_types``)."""
    data_types = config.get("data_types", {})
    if not isinstance(data_types, dict):
        raise CaseError(src, "data_types", f"expected a mapping, got {data_types!r}")
    accumulated = data_types.get("grad_accum_dtype")
    return accumulated is not None and str(accumulated).lower() in _FP32_NAMES


def _offload_device(src: str, zero_section: dict, name: str) -> bool:
    """Whether ``zero_optimization.<name>`` sends its states to host memory (device cpu)."""
    section = zero_section.get(name)
    if section is None:
        return False
    if not isinstance(section, dict):
        raise CaseError(src, f"zero_optimization.{name}", f"expected a mapping, got {section!r}")
    device = section.get("device", "none")
    if device == "nvme":
        raise CaseError(src, f"zero_optimization.{name}.device", "nvme offload is not modelled; expected cpu or none")
    if device not in ("cpu", "none"):
        raise CaseError(src, f"zero_optimization.{name}.device", f"expected cpu or none, got {device!r}")
    # DeepSpeedZeroOffloadOptimizerConfig.ratio: a float, ge=0.0, le=1.0 (runtime/zero/offload_config.py), read
    # in pydantic's lax mode ("1.0" is 1.0, all); "auto" dropped, as DeepSpeedConfigModel drops it.
    said = section.get("ratio", "auto")
    ratio = 1.0 if said == "auto" else _lax_float(src, f"zero_optimization.{name}.ratio", said)
    if not 0.0 <= ratio <= 1.0:
        raise CaseError(src, f"zero_optimization.{name}.ratio", f"expected a number from 0.0 to 1.0 (DeepSpeed's "
                                                                 f"config refuses it), got {one_line(safe_repr(said), 40)}")
    if device == "cpu" and ratio != 1.0:
        # ZeRO-3's partial optimizer offload (DeepSpeedZeroOffloadOptimizerConfig.ratio): the
        # planner prices DeepSpeed's offload as all or none (engines/deepspeed/engine.py).
        raise CaseError(src, f"zero_optimization.{name}.ratio", f"is {ratio!r}: a partial offload is not "
                                                                 "modelled for DeepSpeed; expected 1.0 (all)")
    return device == "cpu"


def change_takes(field: str, value, layout) -> Optional[str]:
    """What changing a layout ``field`` to ``value`` takes under DeepSpeed where no ds_config key sets it
    (the model's code does), else None: `diagnose`'s change line and its cheapest next change say it
    beside the change (``ep 1→8`` for a Hugging Face Trainer's Mixtral read as a key to flip)."""
    if field == "ep" and (value or 1) > 1:
        return (f"no ds_config key: the model's MoE blocks rebuilt as DeepSpeed-MoE's "
                f"deepspeed.moe.layer.MoE(ep_size={value}); a Hugging Face model's own MoE blocks do not shard "
                f"experts")
    if field == "etp" and (value or 1) > 1:
        return ("no ds_config key: deepspeed.moe.layer.MoE(enable_expert_tensor_parallelism=True), the experts split "
                "over the tensor-parallel ranks")
    if field == "pp" and value > 1:
        return (f"no ds_config key: the model built as a deepspeed.pipe.PipelineModule(num_stages={value}) and trained "
                "with engine.train_batch(), which the Hugging Face Trainer does not run")
    if field == "pp":
        return "no ds_config key: the model built without deepspeed.pipe.PipelineModule"
    if field == "stage_layers" and value is not None:
        return "no ds_config key: PipelineModule's partition of the layers (partition_method)"
    if field == "tp" and value > 1 and layout.pp > 1:
        return ("no ds_config key: the model's own Megatron-style tensor-parallel layers on the pipeline's grid "
                "(Megatron-DeepSpeed's --tensor-model-parallel-size), not AutoTP")
    if field == "recompute" and value == "full":
        return ("no ds_config key: activation checkpointing in the model's code (the Trainer's "
                "--gradient_checkpointing, or deepspeed.checkpointing.checkpoint around each layer)")
    if field == "recompute" and value == "none":
        return "no ds_config key: activation checkpointing turned off in the model's code (no --gradient_checkpointing)"
    return None
