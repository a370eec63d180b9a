"""Reads an existing torchtitan job into a layout, for `diagnose` (the counterpart of
:mod:`planner.engines.torchtitan.emit`): contradictions are a :class:`planner.errors.CaseError`
naming the file and the key (``parallelism.tensor_parallel_degree``, as torchtitan names it).

Two forms are read, neither by running anything:

- torchtitan 0.3.0's command-line overrides (``torchtitan/config/manager.py`` ``ConfigManager``:
  ``--section.key value`` words parsed by tyro): the ``overrides.txt`` the emitter writes, or a launch
  script's words after ``-m torchtitan.train``. ``--module M --config F`` names the base config the
  overrides apply to, which is not loaded (it is Python): what the overrides leave out is read as
  torchtitan's own defaults, those of ``config/configs.py`` (``TrainingConfig``, ``ParallelismConfig``,
  ``CompileConfig``) and ``trainer.py`` (``Trainer.Config``: selective activation checkpointing), and
  a note says the base config may set others. The ``activation_checkpoint:<mode>`` subcommand
  (``distributed/activation_checkpoint.py`` ``ActivationCheckpointingConfig``) sets the checkpointing.
- a TOML job file of torchtitan <= 0.2 (``[parallelism]``, ``[training]``, ``[activation_checkpoint]``
  with ``mode`` and ``selective_ac_option``, ``[compile]``, ``[model] converters``, ``[float8]``), with
  0.2's defaults (``config/job_config.py``: selective checkpointing of every 2nd layer).

The layout is the emitter's mapping inverted: dp = data_parallel_replicate_degree ×
data_parallel_shard_degree (-1: the rest of the GPUs, as ``distributed/parallel_dims.py``
``ParallelDims._validate`` fills it), ZeRO 3 where FSDP shards and ZeRO 0 where it replicates;
the pipeline's stages from ``module_fqns_per_model_part`` (else torchtitan's own split,
``distributed/pipeline_parallel.py`` ``_generate_llm_fqn_per_model_part``); the micro-batch
``local_batch_size`` without a pipeline and ``pipeline_parallel_microbatch_size`` with one.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Union

from cost_models.layout_spec import rank_chunks
from cost_models.specs import Job, Layout, SpecError

from planner.case import case_message
from planner.errors import CaseError, one_line, safe_repr
from planner.inputs import read_text
from planner.limits import MAX_INT

from .base_config import WHOLE_LOGITS, NotLiteral, read_base
from .emit import (BASE_CONFIGS, BASE_CONVERTERS, CONFIG_FILE, CONFIG_FUNCTION, CONFIG_MODULE, MOE_BASE_CONFIGS,
                   base_config, base_flavor, model_flavor)

# The fields of torchtitan 0.3.0's ParallelismConfig, TrainingConfig and CompileConfig
# (config/configs.py): tyro refuses any other option in these sections, so the launch would not start.
KNOWN_KEYS = {
    "parallelism": ("data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "enable_fsdp_symm_mem", "tensor_parallel_degree", "enable_sequence_parallel", "spmd_backend",
                    "pipeline_parallel_degree", "module_fqns_per_model_part",
                    "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size", "context_parallel_degree",
                    "context_parallel_load_balancer", "context_parallel_ptrr_mask_key", "expert_parallel_degree"),
    "training": ("local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps", "enable_cpu_offload",
                 "disable_cuda_graphs", "dtype", "mixed_precision_param", "mixed_precision_reduce", "gc_freq",
                 "gc_debug"),
    "compile": ("enable", "enable_async_tensor_parallel", "components", "backend"),
}
# The fields of torchtitan 0.1's and 0.2's job-file tables (torchtitan/config_manager.py at v0.1.0,
# torchtitan/config/job_config.py at v0.2.0 and v0.2.2): ConfigManager refuses any other.
TOML_KEYS = {
    "parallelism": ("context_parallel_degree", "context_parallel_load_balancer", "context_parallel_rotate_method",
                    "data_parallel_replicate_degree", "data_parallel_shard_degree", "disable_loss_parallel",
                    "enable_async_tensor_parallel", "enable_compiled_autograd", "expert_parallel_comm_backend",
                    "expert_parallel_degree", "expert_tensor_parallel_degree", "fsdp_reshard_after_forward",
                    "module_fqns_per_model_part", "pipeline_parallel_degree",
                    "pipeline_parallel_expert_parallel_overlap", "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage",
                    "pipeline_parallel_microbatch_size", "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv",
                    "pipeline_parallel_split_points", "tensor_parallel_degree"),
    "training": ("compile", "dataloader", "dataset", "dataset_path", "debug_moe_force_load_balance", "deterministic",
                 "dtype", "enable_cpu_offload", "gc_debug", "gc_freq", "global_batch_size", "local_batch_size",
                 "max_norm", "mixed_precision_param", "mixed_precision_reduce", "seed", "seq_len", "steps"),
    "activation_checkpoint": ("debug", "determinism_check", "early_stop", "memory_budget", "mode",
                              "per_op_sac_force_recompute_mm_shapes_by_fqns", "preserve_rng_state",
                              "selective_ac_option", "visualize_memory_budget_pareto"),
    "compile": ("backend", "components", "enable"),
    "model": ("converters", "flavor", "hf_assets_path", "name", "print_after_conversion", "tokenizer_path"),
    "float8": ("emulate", "enable_fsdp_float8_all_gather", "filter_fqns", "force_recompute_fp8_weight_in_bwd",
               "precompute_float8_dynamic_scale_for_fsdp", "recipe_name"),
    "mx": ("filter_fqns", "recipe_name", "use_fp8_dim1_cast_triton_kernel"),
}
# The sections of torchtitan 0.1's and 0.2's JobConfig (config_manager.py at v0.1.0, config/job_config.py at
# v0.2.0 and v0.2.2): a job file's top level holds these tables only.
JOB_SECTIONS = ("job", "profiling", "metrics", "model", "optimizer", "lr_scheduler", "training", "parallelism",
                "checkpoint", "activation_checkpoint", "compile", "float8", "mx", "quantize", "comm",
                "memory_estimation", "fault_tolerance", "experimental", "validation", "debug")
# Trainer.Config's sections (trainer.py): an option in another is one tyro refuses. activation_checkpoint
# is a subcommand (activation_checkpoint:<mode>), not a section of options.
SECTIONS = ("hf_assets_path", "dump_folder", "profiler", "metrics", "tokenizer", "dataloader", "optimizer",
            "lr_scheduler", "training", "parallelism", "checkpoint", "compile", "comm", "validator", "debug",
            "override", "loss")
# The boolean fields among them: tyro makes each a switch (--s.k / --s.no_k) that takes no value.
SWITCHES = ("parallelism.enable_fsdp_symm_mem", "parallelism.enable_sequence_parallel", "training.enable_cpu_offload",
            "training.disable_cuda_graphs", "training.gc_debug", "compile.enable",
            "compile.enable_async_tensor_parallel", "parallelism.enable_async_tensor_parallel",
            "debug.moe_force_load_balance", "debug.deterministic", "debug.detect_anomaly", "debug.batch_invariant")
# The debugging switch that routes every MoE layer's tokens round-robin (:func:`forced_routing`): DebugConfig's
# in 0.3.0 (config/configs.py) and 0.2.2's [debug] (config/job_config.py, Debug), TrainingConfig's in 0.2.0.
FORCED_ROUTING_KEYS = ("debug.moe_force_load_balance", "training.debug_moe_force_load_balance")
# DebugConfig's switches (config/configs.py) that change how fast the run steps, not priced: what each does
# (distributed/utils.py set_determinism), said in a note where the command line or its base config sets it.
SLOWER_DEBUG = {"debug.deterministic": "torch.use_deterministic_algorithms(True) and deterministic cuBLAS and "
                                       "cuDNN kernels (\"may be slower\", config/configs.py)",
                "debug.detect_anomaly": "torch.autograd.set_detect_anomaly (\"incurs significant overhead\", "
                                        "config/configs.py)"}
# OptimizersContainer.Config.implementation's choices (components/optimizer/optimizer.py, a Literal that tyro
# refuses any other word for) and its default; the estimate prices the default: fused Adam(W) with fp32 moments
# (model_states.state_bytes), stepped in one pass over the states (optimizer_time.optimizer_time).
OPTIMIZER_IMPLEMENTATION = "optimizer.implementation"
OPTIMIZER_IMPLEMENTATIONS = ("for-loop", "foreach", "fused", "fused_opt_states_bf16")
OPTIMIZER_IMPLEMENTATION_DEFAULT = "fused"
# torchtitan 0.1's and 0.2's choices (config_manager.py at v0.1.0, config/job_config.py at v0.2.0 and v0.2.2:
# Optimizer.implementation, a Literal; build_optimizers asserts the same list, components/optimizer.py), for a
# job file's [optimizer] implementation: no fused_opt_states_bf16, which 0.3 added. The same default, "fused".
TOML_OPTIMIZER_IMPLEMENTATIONS = ("for-loop", "foreach", "fused")
# The choice that keeps Adam's moments in bfloat16 (OptimizersContainer._register_bf16_optimizer_state_hook
# creates exp_avg and exp_avg_sq so for the fused kernel's mixed-precision path): read as
# training.optimizer_moments bf16 and priced so (model_states.state_bytes).
BF16_MOMENTS_IMPLEMENTATION = "fused_opt_states_bf16"
# What each other choice runs that the estimate does not price (OptimizersContainer: _build_impl_kwargs gives
# torch.optim.Adam(W) fused= / foreach=).
UNPRICED_IMPLEMENTATIONS = {
    "foreach": "steps with torch's foreach Adam(W) (multi-tensor kernels that write their intermediates), not the "
               "fused kernel priced, so the optimizer step runs slower",
    "for-loop": "steps with torch's single-tensor Adam(W) (a chain of kernels a parameter), not the fused kernel "
                "priced, so the optimizer step runs slower",
}

# torch.distributed.pipelining.schedules.get_schedule_class's names (case-insensitive), by the stages
# a rank holds: one (PipelineScheduleSingle) or several (PipelineScheduleMulti). The cost model times
# 1F1B and its interleaved form only (cost_models.pipeline).
SINGLE_STAGE_SCHEDULES = ("1F1B", "GPipe", "PipelineScheduleSingle")
MULTI_STAGE_SCHEDULES = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "PipelineScheduleMulti",
                         "ZBVZeroBubble", "DualPipeV")
PRICED_SCHEDULES = ("1F1B", "Interleaved1F1B")

# Activation checkpointing: the tyro subcommands of torchtitan 0.3.0 (ActivationCheckpointingConfig)
# and the modes of 0.2's [activation_checkpoint] mode, as the layout's recompute.
AC_MODES = {"none": "none", "selective": "selective", "full": "full"}
UNPRICED_AC_MODES = ("memory-budget", "memory_budget")
# The options each subcommand takes after it (ActivationCheckpointing.Config and SelectiveAC.Config,
# distributed/activation_checkpoint.py), none of which the cost model prices; the switches among them.
AC_OPTIONS = {"full": ("preserve_rng_state", "determinism_check", "debug"),
              "selective": ("preserve_rng_state", "determinism_check", "debug", "force_recompute_mm_shapes_by_fqns"),
              # MemoryBudgetAC.Config: taken here so that the mode itself is what is refused, as unpriced
              **{mode: ("preserve_rng_state", "determinism_check", "debug", "memory_budget",
                        "visualize_memory_budget_pareto") for mode in UNPRICED_AC_MODES}}
AC_SWITCHES = ("preserve_rng_state", "debug", "visualize_memory_budget_pareto")
# Trainer.Config's own fields (trainer.py), one value each: --hf_assets_path, --dump_folder.
TOP_LEVEL = ("hf_assets_path", "dump_folder")

# training.mixed_precision_param for each precision the case may train in (emit.PARAM_DTYPES's inverse).
PARAM_DTYPES = {"bfloat16": ("bf16", "fp8", "mxfp8", "nvfp4"), "float32": ("fp32",)}
# [model] converters of torchtitan 0.2 (components/quantization): the precision each runs.
# The names 0.1 registered ("float8", "mx": components/quantization/float8.py, mx.py) and 0.2's
# ("quantize.linear.float8", "quantize.grouped_mm.float8", "quantize.linear.mx", "quantize.grouped_mm.mx").
CONVERTER_PRECISIONS = {"float8": "fp8", "mx": "mxfp8", "quantize.linear.float8": "fp8",
                        "quantize.grouped_mm.float8": "fp8", "quantize.linear.mx": "mxfp8",
                        "quantize.grouped_mm.mx": "mxfp8"}
# torchtitan 0.3.0's converter classes (components/quantization/__init__.py), as the planner's config module
# names them in CONVERTERS: the precision each runs, and whether it converts the experts' grouped GEMMs
# (Float8LinearConverter walks Linear configs only) or the linears.
CONVERTER_CLASSES = {"Float8LinearConverter": ("fp8", False), "Float8GroupedExpertsConverter": ("fp8", True),
                     "MXFP8LinearConverter": ("mxfp8", False), "MXFP8GroupedExpertsConverter": ("mxfp8", True),
                     "NVFP4LinearConverter": ("nvfp4", False)}
# The fields each converter's Config takes besides model_compile_enabled, which the file's converters() passes
# itself (components/quantization/float8.py, mx.py, nvfp4.py: kw_only slots dataclasses, so Config(**fields)
# raises TypeError at startup on any other: 0.2's enable_fsdp_float8_all_gather and
# precompute_float8_dynamic_scale_for_fsdp among them, which 0.3.0's rowwise recipes dropped).
CONVERTER_FIELDS = {"Float8LinearConverter": ("recipe_name", "filter_fqns", "emulate"),
                    "Float8GroupedExpertsConverter": (),
                    "MXFP8LinearConverter": ("fqns",), "MXFP8GroupedExpertsConverter": ("recipe_name", "pad_multiple"),
                    "NVFP4LinearConverter": ("fqns",)}
# The linears the estimate prices in bf16 whatever the recipe (cost_models.kernels.high_precision_precision: the
# LM head, the MoE router's gate), by their FQN in torchtitan 0.3.0's model config (models/common/decoder.py
# lm_head; models/common/moe.py Router.Config gate under layers.N.moe.router), with (in, out) features.
BF16_PRICED_LINEARS = {"lm_head": ("LM head", lambda m: (m.hidden_size, m.vocab_size)),
                       "layers.0.moe.router.gate": ("MoE router's gate", lambda m: (m.hidden_size, m.num_experts))}
# The FQN a 0.1 or 0.2 job file's model gives a BF16_PRICED_LINEARS linear where it differs from 0.3.0's: the LM
# head is Transformer.output (models/llama3/model/model.py at v0.1.0 and v0.2.2); the router's gate is the same.
TOML_FQNS = {"lm_head": "output"}
# Float8LinearConverter's filter_fqns word that swaps module_filter_fn for torchao's size heuristic.
AUTO_FILTER = "auto_filter_small_kn"
# Where a 0.1 or 0.2 job file lists the linears its linear converter leaves in bf16 (module_filter_fn's
# filter_fqns, components/quantization/utils.py at v0.2.2), by the converter [model] converters names.
TOML_FILTER_KEYS = {"float8": ("float8.filter_fqns",), "quantize.linear.float8": ("quantize.linear.float8.filter_fqns",),
                    "mx": ("mx.filter_fqns",), "quantize.linear.mx": ("quantize.linear.mx.filter_fqns",)}
# Their value where the file leaves them out (config_manager.py at v0.1.0, config/job_config.py at v0.2.2): float8's
# an empty list, mx's ["output"] ("By default we always skip the output layer").
TOML_FILTER_DEFAULTS = {"mx.filter_fqns": ["output"], "quantize.linear.mx.filter_fqns": ["output"]}
# Float8LinearConverter.Config.recipe_name's default (components/quantization/float8.py).
FLOAT8_RECIPE_DEFAULT = "rowwise"
# Where each release keeps the float8 recipe: 0.1's [float8], 0.2's [quantize.linear.float8].
FLOAT8_RECIPE_KEYS = ("quantize.linear.float8.recipe_name", "float8.recipe_name")

# The load balancers torchtitan's context-parallel sharding builds (distributed/context_parallel/api.py
# ``cp_shard``, 0.2.2's distributed/context_parallel.py alike): "headtail" for SDPA, "ptrr" for FlexAttention, or
# None (tyro's word for ``str | None``), which shards the sequence in order; any other value is cp_shard's
# ValueError at the first step, and "" ParallelismConfig.__post_init__'s at parse.
CP_BALANCER_KEY = "parallelism.context_parallel_load_balancer"
CP_BALANCERS = ("headtail", "ptrr")

# Where a torchtitan job states each layout field a refusal may name (the DeepSpeed reader's KEY_OF_FIELD's twin).
KEY_OF_FIELD = {
    "dp": "parallelism.data_parallel_shard_degree", "zero_stage": "parallelism.data_parallel_shard_degree",
    "tp": "parallelism.tensor_parallel_degree", "sequence_parallel": "parallelism.enable_sequence_parallel",
    "pp": "parallelism.pipeline_parallel_degree", "vpp": "parallelism.pipeline_parallel_schedule",
    "cp": "parallelism.context_parallel_degree", "stage_layers": "parallelism.module_fqns_per_model_part",
    "chunk_layers": "parallelism.module_fqns_per_model_part", "ep": "parallelism.expert_parallel_degree",
    "etp": "parallelism.expert_tensor_parallel_degree", "micro_batch_size": "training.local_batch_size",
    "recompute": "activation_checkpoint", "offload_params": "training.enable_cpu_offload",
    "offload_optimizer": "training.enable_cpu_offload",
}
# Where it states the training settings read_training reads.
SETTING_KEYS = {"compiled_loss": "compile.components", "tp_comm_overlap": "compile.enable_async_tensor_parallel",
                "loss_chunks": "loss.num_chunks", "chunked_loss": "loss.num_chunks",
                "optimizer_moments": "optimizer.implementation",
                "cp_exchange": "parallelism.context_parallel_rotate_method"}


@dataclass(frozen=True)
class _Settings:
    """A torchtitan job as read: {"section.key": value} and the activation checkpointing.

    Command-line values are the option's words (a switch: True or False); TOML values are TOML's.
    ``base`` is ``--module M --config F`` where the overrides name it."""

    src: str
    values: dict
    cli: bool
    base: Optional[str] = None
    base_source: Optional[str] = None  # the file the base config's own settings were read from
    ac_mode: Optional[str] = None
    ac_option: Optional[str] = None  # torchtitan 0.2's selective_ac_option
    # A launch script's torchrun --nnodes and --nproc-per-node (None for each it does not give); None
    # without torchrun (overrides, a TOML file).
    torchrun: Optional[tuple[Optional[str], Optional[str]]] = None
    # What reading a launch script assumed (the branches taken on what it does not set, the programs it
    # starts beside the training), as the Megatron reader says it.
    script_notes: tuple[str, ...] = ()
    # The planner's own config module's model names (base_config.MODEL_NAMES) where the job runs it; None
    # on torchtitan's own base configs, whose model spec _check_base_model reads.
    own_model: Optional[dict[str, Any]] = None
    job_file: Optional[str] = None  # the TOML job file a torchtitan 0.2 launch names (--job.config_file)

    def name(self, key: str) -> str:
        """How the file states ``key``: the option's words or the TOML key."""
        return f"--{key}" if self.cli else key

    def absent(self, key: str, default: Any) -> str:
        """What an absent key reads as, for a refusal."""
        shown = str(default).lower() if isinstance(default, bool) else default
        where = "config/configs.py" if self.cli else "torchtitan 0.2's config/job_config.py"
        hint = f"; the base config {self.base} may set another: give {self.name(key)}" if self.base else ""
        return f"absent (torchtitan's default {shown}, {where}{hint})"

    def _word(self, key: str) -> str:
        value = self.values[key]
        if not isinstance(value, list) or len(value) != 1:
            got = "no value" if value in (True, False, []) else f"{len(value)} words"
            raise CaseError(self.src, key, f"expected one value after {self.name(key)}, got {got}")
        return value[0]

    def integer(self, key: str, default: Optional[int], minimum: int = 1) -> Optional[int]:
        if key not in self.values:
            return default
        value = self.values[key]
        if self.cli:
            word = self._word(key).strip()
            if not re.fullmatch(r"[+-]?\d+", word):
                raise CaseError(self.src, key, f"expected an integer, got {one_line(word, 40)!r}")
            digits = len(word.lstrip("+-"))
            if digits > len(str(MAX_INT)):  # not converted: past Python's int() digit limit it raises
                raise CaseError(self.src, key, f"expected an integer >= {minimum} and <= {MAX_INT}, got one of "
                                               f"{digits:,} digits")
            value = int(word)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise CaseError(self.src, key, f"expected an integer, got {one_line(safe_repr(value), 40)}")
        if value < minimum or value > MAX_INT:
            # Both bounds: a number past the top was said to be below "expected an integer >= 1".
            shown = f"one of {len(str(abs(value))):,} digits" if len(str(abs(value))) > 40 else str(value)
            raise CaseError(self.src, key, f"expected an integer >= {minimum} and <= {MAX_INT}, got {shown}")
        return value

    def string(self, key: str, default: Optional[str]) -> Optional[str]:
        if key not in self.values:
            return default
        value = self._word(key) if self.cli else self.values[key]
        if not isinstance(value, str):
            raise CaseError(self.src, key, f"expected a string, got {one_line(safe_repr(value), 40)}")
        return value

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.string(key, default)
        if value not in choices:
            raise CaseError(self.src, key, f"expected one of {', '.join(choices)}, got {one_line(value, 40)!r}")
        return value

    def switch(self, key: str, default: bool) -> bool:
        if key not in self.values:
            return default
        value = self.values[key]
        if isinstance(value, bool):
            return value
        said = f"given {' '.join(value)!r}" if self.cli else f"got {one_line(safe_repr(value), 40)}"
        field = key.split(".", 1)[1]
        expected = f"a switch (--{key} or --{key.split('.')[0]}.no_{field}, no value: tyro's flag)" if self.cli \
            else "true or false"
        raise CaseError(self.src, key, f"expected {expected}, {one_line(said, 60)}")

    def names(self, key: str, default: list[str]) -> list[str]:
        """A list[str] option: comma-separated words (ConfigManager's list_str_rule), or a TOML list."""
        if key not in self.values:
            return default
        value = self.values[key]
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise CaseError(self.src, key, f"expected a list of names, got {one_line(safe_repr(value), 60)}")
        if self.cli and len(value) > 1:
            # ConfigManager's list_str_rule: one comma-separated word (tyro refuses a second)
            raise CaseError(self.src, key, f"expected one comma-separated word ({','.join(value)}), got "
                                           f"{len(value)} words: tyro refuses the launch")
        return [name.strip() for word in value for name in word.split(",") if name.strip()]

    def parts(self, key: str) -> Optional[list[list[str]]]:
        """``module_fqns_per_model_part``: None, or each part's module names (a comma-joined word each)."""
        if key not in self.values:
            return None
        value = self.values[key]
        if self.cli:
            if value == ["None"]:
                return None
            if not isinstance(value, list) or not value:
                raise CaseError(self.src, key, "expected a comma-separated word of module names per model part, "
                                               "or None")
            return [[name for name in word.split(",") if name] for word in value]
        if not isinstance(value, list) or not all(isinstance(p, list) and all(isinstance(n, str) for n in p)
                                                  for p in value):
            raise CaseError(self.src, key, f"expected a list of lists of module names, got "
                                           f"{one_line(safe_repr(value), 60)}")
        return value


# --- reading the file -------------------------------------------------------------------------

# Brackets nested deeper than any job file's (tomllib recurses a level a bracket: 500 raised
# RecursionError): refused before parsing, as the YAML and JSON readers refuse theirs.
MAX_TOML_NESTING = 100


def _load(path: Path) -> _Settings:
    """The file's settings, as TOML (a ``.toml`` file, or text TOML reads) or as command-line words.
    Read once a file (diagnose asks for the layout, the training settings and the notes), and again
    where a file the settings came from besides it has changed: the config module beside a launch
    script, a base config, a job file (an edit to torchtitan_config.py's MODEL_FLAVOR between two
    diagnoses of one launch.sh was read as the first)."""
    text = read_text(path)
    key = (str(path), text)
    found = _LOADED.get(key)
    if found is None or found[1] != _texts(found[0]):
        _LOADED.clear()
        settings = _parse(path, text)
        _LOADED[key] = found = (settings, _texts(settings))
    return found[0]


def _texts(s: _Settings) -> tuple[Optional[bytes], ...]:
    """The bytes of the other files ``s`` was read from, as they are now (None: gone or unreadable)."""
    out = []
    for other in (s.base_source, s.job_file):
        try:
            out.append(Path(other).read_bytes() if other else None)
        except OSError:
            out.append(None)
    return tuple(out)


_LOADED: dict[tuple[str, str], tuple[_Settings, tuple[Optional[bytes], ...]]] = {}


def _given_twice(text: str, error: str) -> tuple[str, str] | None:
    """The key (with its table) and what was expected where tomllib refused a key or a table given
    twice: its message ("Cannot overwrite a value (at line 49, column 27)", "Cannot declare
    ('training',) twice") names the line alone (Python 3.11's TOMLDecodeError has no line
    attribute), where a case, a ds_config or a HF config given a key twice is refused naming it."""
    found = re.search(r"\(at line (\d+), column \d+\)", error)
    if not found or not ("Cannot overwrite" in error or "twice" in error):
        return None
    number = int(found.group(1))
    table = ""
    lines = text.splitlines()
    for line in lines[:number - 1]:
        header = re.match(r"\s*\[\[?\s*([^\]]+?)\s*\]", line)
        if header:
            table = header.group(1)
    here = lines[number - 1] if 0 < number <= len(lines) else ""
    header = re.match(r"\s*\[\[?\s*([^\]]+?)\s*\]", here)
    if header:
        key = header.group(1)
    else:
        name = here.partition("=")[0].strip()
        if not name:
            return None
        key = f"{table}.{name}" if table else name
    return one_line(key.replace('"', "").replace(" ", ""), 80), f"given twice (line {number}); expected each key once"


def _parse(path: Path, text: str) -> _Settings:
    import tomllib

    src = str(path)
    depth = deepest = 0
    for bracket in re.finditer(r"[\[\]{}]", text):
        if bracket.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth = max(0, depth - 1)
    if deepest > MAX_TOML_NESTING:
        raise CaseError(src, "", f"nests brackets past {MAX_TOML_NESTING} levels: nested too deeply to read")
    if path.suffix.lower() == ".py":
        return _config_module(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        if path.suffix.lower() == ".toml":
            twice = _given_twice(text, str(error))
            if twice:
                raise CaseError(src, *twice) from None
            raise CaseError(src, "", f"is not TOML: {error}") from None
        data = None
    except ValueError:  # an integer past the digits Python converts (sys.get_int_max_str_digits)
        section, key = "", "a value"
        for line in text.splitlines():
            if re.match(r"\s*\[", line):
                section = line.strip().strip("[]").strip() + "."
            elif re.search(r"\d{4000}", line):
                key = section + line.partition("=")[0].strip()
                break
        raise CaseError(src, one_line(key, 60), "expected a number of at most 19 digits, got one of thousands") from None
    if data:
        return _from_toml(src, data)
    if data is not None and path.suffix.lower() == ".toml":
        # An empty or comment-only .toml reads as TOML's {}: taken for an override list with no words, it was
        # diagnosed on torchtitan's defaults ("training.seq_len: absent ... differs from the case's").
        raise CaseError(src, "", "holds no [parallelism], [training], [compile] or [activation_checkpoint] table "
                                 "(it is empty or only comments): not a torchtitan job file")
    words, torchrun, notes, defaulted = _words(src, text)
    job_file = _job_file(src, words, defaulted)
    if job_file is not None:
        return _with_job_file(src, words, torchrun, notes, *job_file, defaulted)
    header = _HEADER_BASE.search(text)
    if header is not None and not {"--module", "--config"} & {w.partition("=")[0] for w in words}:
        # The planner's overrides.txt is run on the base config its header's command names (it names none
        # itself): read on Trainer.Config's defaults, an overrides file without its last line (the
        # activation-checkpoint subcommand) read as selective where llama3_70b's FullAC runs.
        words = ["--module", header.group(1), "--config", header.group(2), *words]
        notes = (*notes, f"{Path(src).name} names no base config: read on the one its header's command names "
                         f"(--module {header.group(1)} --config {header.group(2)})")
    return replace(_from_words(src, words), script_notes=notes, torchrun=torchrun)


def _config_module(path: Path) -> _Settings:
    """A Python file: a torchtitan 0.3.0 config registry, which no command line runs by itself: ConfigManager
    imports it by the ``--module M --config F`` its launch names (config/manager.py ``_load_config``). The
    planner's own ``torchtitan_config.py`` is read as its ``launch.sh`` starts it (``--module torchtitan_config
    --config layout_planner``, no overrides); any other is refused, naming what to give instead (read as
    shell words, its first quote with no end on one line was the refusal)."""
    src = str(path)
    if path.name != CONFIG_FILE:
        raise CaseError(src, "", "is a Python file: a torchtitan config registry runs only as a command names it "
                                 "(--module M --config F, config/manager.py): give the launch script, or the "
                                 "overrides with --module and --config, that start it")
    words = ["--module", CONFIG_MODULE, "--config", CONFIG_FUNCTION]
    note = f"{path.name} read as its launch.sh starts it: -m torchtitan.train {' '.join(words)}, no other overrides"
    return replace(_from_words(src, words), script_notes=(note,))


# The command the planner's overrides.txt gives in its header (emit.render): the base config it runs on.
_HEADER_BASE = re.compile(r"^#[^\n]*torchtitan\.train --module (\S+) --config (\S+)", re.MULTILINE)


def _meant(word: str, choices, cutoff: float, prefix: str = "") -> str:
    """" (did you mean X?)" for the closest of ``choices`` to a word torchtitan would refuse, or ""."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def _from_toml(src: str, data: dict) -> _Settings:
    """A torchtitan 0.2 job file: its sections flattened to "section.key"."""
    values = {}
    sections = ("parallelism", "training", "compile", "activation_checkpoint", "model", "float8", "mx")
    for name in data:
        if name not in JOB_SECTIONS:  # ConfigManager._dict_to_dataclass: "Invalid field names"
            meant = _meant(str(name), JOB_SECTIONS, 0.75)
            raise CaseError(src, one_line(str(name), 60), f"unknown section{meant}: torchtitan 0.1-0.2's JobConfig "
                                                          "(config/job_config.py) has no such field, and refuses "
                                                          "the file")
    if not any(section in data for section in sections[:4]):
        raise CaseError(src, "", "holds no [parallelism], [training], [compile] or [activation_checkpoint] table: "
                                 "not a torchtitan job file")
    for section in sections:
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise CaseError(src, section, f"expected a table [{section}], got {one_line(safe_repr(table), 40)}")
        for key in table:
            if key not in TOML_KEYS[section]:  # ConfigManager._dict_to_dataclass: "Invalid field names"
                meant = _meant(str(key), TOML_KEYS[section], 0.8, f"{section}.")
                raise CaseError(src, f"{section}.{one_line(str(key), 60)}",
                                f"unknown key{meant}: torchtitan 0.1-0.2's {section} (config/job_config.py) has no "
                                "such field, and refuses the file")
        values.update({f"{section}.{key}": value for key, value in table.items()})
    # 0.2's [quantize.linear.float8] and [quantize.linear.mx] (TOML nests them as quantize → linear → float8)
    linear = data.get("quantize", {}).get("linear", {}) if isinstance(data.get("quantize"), dict) else {}
    for name, table in (linear.items() if isinstance(linear, dict) else ()):
        if isinstance(table, dict):
            values.update({f"quantize.linear.{name}.{key}": value for key, value in table.items()})
    optimizer = data.get("optimizer")
    if isinstance(optimizer, dict) and "implementation" in optimizer:
        # [optimizer] read for its implementation alone (_optimizer_implementation), which decides the
        # optimizer step's kernels; its learning rate and betas price nothing
        values[OPTIMIZER_IMPLEMENTATION] = optimizer["implementation"]
    debug = data.get("debug")
    if isinstance(debug, dict) and "moe_force_load_balance" in debug:
        # 0.2.2's [debug] table, read for this switch alone (forced_routing): nothing else in it is priced
        values["debug.moe_force_load_balance"] = debug["moe_force_load_balance"]
    if values.get("parallelism.pipeline_parallel_split_points"):
        # torchtitan 0.2's older way to cut the stages, at the named modules: not read here.
        raise CaseError(src, "parallelism.pipeline_parallel_split_points", "is not read: give the stages as "
                                                                           "module_fqns_per_model_part")
    # torchtitan 0.2's ActivationCheckpoint (config/job_config.py): mode "selective",
    # selective_ac_option "2" (every 2nd layer) where the file says nothing.
    settings = _Settings(src, values, cli=False)
    mode = settings.string("activation_checkpoint.mode", "selective")
    option = settings.string("activation_checkpoint.selective_ac_option", "2")
    return replace(settings, ac_mode=mode, ac_option=option)


def _starts_training(words, i: int) -> bool:
    word = words[i]
    return word == "torchtitan.train" and i > 0 and words[i - 1] == "-m" or word.endswith("torchtitan/train.py")


def _words(src: str, text: str) -> tuple[list[str], Optional[tuple[Optional[str], Optional[str]]],
                                         tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The words of an overrides file (as a shell splits them, comments dropped), or of the command a
    launch script starts torchtitan with, as bash would run it (planner.readers.bash: its variables
    expanded, the branches it takes taken, the commands after it apart): the words after
    ``-m torchtitan.train``; torchrun's flags, the reading's notes, and (NAME, default) of the unset
    variables whose ``${X:-default}`` the command took."""
    from planner.engines.megatron.launch import is_argument_list, split_words  # a launch's words, as Megatron's

    if not is_argument_list(text, also=_is_subcommand):
        from planner.readers import bash

        try:
            script = bash.read_script(text, src)
        except (bash.ScriptLimit, bash.ScriptUnfollowed) as error:
            raise CaseError(src, error.key, error.message) from None
        except bash.ScriptSyntax:
            script = None  # what this reader cannot parse: word by word, as below
        if script is not None:
            for command in script.commands:
                fields = list(command.fields)
                start = next((i for i in range(len(fields)) if _starts_training(fields, i)), None)
                if start is not None:
                    notes = [note.text for note in script.notes]
                    others = [c for c in script.commands if c is not command
                              and (any(f.endswith(".py") for f in c.fields) or "-m" in c.fields)]
                    if others:
                        notes.append(f"{src}: line {command.line}: the training read is torchtitan's; the script "
                                     "also runs " + ", ".join(f"{' '.join(c.fields[:3])} (line {c.line})"
                                                             for c in others[:3]) + ", whose options are not its")
                    if command.unset:
                        notes.append(f"{src}: line {command.line}: the script leaves {', '.join(command.unset[:5])} "
                                     "unset: read as empty, as bash does")
                    return fields[start + 1:], _torchrun_flags(fields[:start]), tuple(notes), command.defaulted
            raise CaseError(src, "", "starts no torchtitan training (-m torchtitan.train or torchtitan/train.py) "
                                     "in the commands bash would run: give the overrides it passes")
    words = []  # bash's split in linear time (shlex's is not)
    for number, line in enumerate(text.replace("\\\n", " ").splitlines(), 1):
        got = split_words(line)
        if got is None:
            raise CaseError(src, f"line {number}", "cannot be split into words as a shell does: a quote with no end")
        words += got
    if not words:
        # An empty or comment-only overrides file was diagnosed on torchtitan's defaults, as a .toml one was.
        raise CaseError(src, "", "holds no words (it is empty or only comments): expected torchtitan's "
                                 "command-line overrides, a launch script or a TOML job file")
    start = next((i for i in range(len(words)) if _starts_training(words, i)), None)
    return (words, None, (), ()) if start is None else (words[start + 1:], _torchrun_flags(words[:start]), (), ())


# torchtitan 0.2's job file on the command line (config/manager.py ConfigManager._maybe_load_toml at v0.2.2:
# the first of these, --job.config_file PATH or --job.config_file=PATH).
JOB_FILE_FLAGS = ("--job.config_file", "--job.config-file")
# The list fields of 0.2's tables the reader reads: one comma-separated word on the command line
# (ConfigManager's list_str_rule), a list in TOML; module_fqns_per_model_part: a word per model part.
_TOML_LISTS = ("model.converters", "compile.components", "float8.filter_fqns", "mx.filter_fqns",
               "quantize.linear.float8.filter_fqns", "quantize.linear.mx.filter_fqns")


def _job_file(src: str, words: list[str], defaulted) -> Optional[tuple[Path, str, int]]:
    """(the job file, its path as the launch gives it, the index of its flag) where the words give
    ``--job.config_file``, as torchtitan 0.2's ConfigManager finds it: the first, its value after ``=`` or
    the next word. A relative path is resolved against the launch file's directory: the script is read as
    run from where it lives (``./run_train.sh`` beside ``./torchtitan/...``, as torchtitan's own is run);
    torchrun's processes open it from their working directory. None where the words give none."""
    for i, word in enumerate(words):
        name, eq, inline = word.partition("=")
        if name not in JOB_FILE_FLAGS or (not eq and word != name):
            continue
        value = inline if eq else (words[i + 1] if i + 1 < len(words) else "")
        if not value or (not eq and value.startswith("--")):
            unset = [f"{n} (read as its default {d!r})" for n, d in defaulted]
            raise CaseError(src, name, "takes the job file's path, and none follows it: torchtitan 0.2's "
                                       "ConfigManager would fail to open it (a variable the script does not set "
                                       "reads as empty" + (f"; the script leaves unset {', '.join(unset[:3])}"
                                                           if unset else "") + ")")
        path = Path(value)
        if not path.is_absolute():
            path = Path(src).parent / path
        if not path.is_file():
            taken = [n for n, d in defaulted if d == value]
            why = f" ({', '.join(taken)} is not set by the script: read as its default {value!r}; another " \
                  "value the caller exports reads another file)" if taken else ""
            raise CaseError(src, name, f"{one_line(value, 120)}: no such file, resolved against the script's directory "
                                       f"({Path(src).parent}, as the script is read run from there){why}: give the "
                                       "job file itself to diagnose --torchtitan, or run the script's directory's "
                                       "layout")
        return path, value, i
    return None


def _with_job_file(src: str, words: list[str], torchrun, notes: tuple[str, ...], path: Path, given: str,
                   at: int, defaulted=()) -> _Settings:
    """A torchtitan 0.2 launch, ``--job.config_file PATH`` and overrides (run_train.sh's ``-m torchtitan.train
    --job.config_file ${CONFIG_FILE} "$@"``): the job file read as a job file is, the command line's
    ``--section.key`` overrides over it, as ConfigManager.parse_args merges them (config/manager.py at v0.2.2:
    "CLI args > TOML file > JobConfig defaults"; tyro.cli with the TOML's dataclass as its default)."""
    job = _parse(path, read_text(path))
    if job.cli:
        raise CaseError(src, words[at].partition("=")[0], f"{one_line(given, 120)} ({path}) is not a TOML job file: "
                                                          "torchtitan 0.2's ConfigManager reads it with tomllib")
    rest = words[:at] + words[at + (1 if "=" in words[at] else 2):]
    values = dict(job.values)
    values.update(_job_overrides(src, rest))
    settings = _Settings(src, values, cli=False)
    mode = settings.string("activation_checkpoint.mode", "selective")
    option = settings.string("activation_checkpoint.selective_ac_option", "2")
    said = [f"{src}: reads the job file {given} ({path}, --job.config_file, resolved against the script's "
            "directory) with the command line's overrides over it, as torchtitan 0.2's ConfigManager merges them"]
    taken = [name for name, default in defaulted if default == given]
    if taken:
        said.append(f"{src}: the job file's path is {', '.join(taken)}'s default ({given}): the script does not set "
                    f"{'it' if len(taken) == 1 else 'them'}, so a caller that exports another reads another file")
    return _Settings(src, values, cli=False, ac_mode=mode, ac_option=option, torchrun=torchrun,
                     script_notes=(*notes, *said), job_file=str(path))


def _job_overrides(src: str, words: list[str]) -> dict[str, Any]:
    """torchtitan 0.2's command-line overrides (``--section.key value``, a bool field's ``--section.key`` or
    ``--section.no_key``), flattened as _from_toml flattens a table and typed as TOML would type them;
    refused where 0.2's JobConfig has no such section or (in the tables read) no such field."""
    values: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word in ("$@", "$*"):
            continue
        if not word.startswith("--"):
            raise CaseError(src, one_line(word, 60), "expected a --section.key option (torchtitan 0.2's ConfigManager "
                                                     "hands the words to tyro, which refuses a stray word)")
        name, eq, inline = word[2:].partition("=")
        args = [inline] if eq else []
        while not eq and i < len(words) and not words[i].startswith("--") and words[i] not in ("$@", "$*"):
            args.append(words[i])
            i += 1
        section, dot, key = name.replace("-", "_").partition(".")
        if not dot or not key:
            raise CaseError(src, f"--{one_line(name, 60)}", "expected --section.key (torchtitan 0.2's options are "
                                                            "grouped by section: --parallelism.tensor_parallel_degree 2)")
        if section not in JOB_SECTIONS:
            meant = _meant(section, JOB_SECTIONS, 0.75)
            raise CaseError(src, f"--{one_line(name, 60)}", f"unknown section {one_line(section, 40)!r}{meant}: "
                                                            "torchtitan 0.2's JobConfig (config/job_config.py) has no "
                                                            "such section, and tyro refuses the launch")
        value: Any = True
        if not args and key.startswith("no_") and key[3:] in TOML_KEYS.get(section, ()):
            key, value = key[3:], False
        if section in TOML_KEYS and key not in TOML_KEYS[section]:
            meant = _meant(key, TOML_KEYS[section], 0.8, f"{section}.")
            raise CaseError(src, f"{section}.{one_line(key, 60)}", f"unknown key{meant}: torchtitan 0.2's {section} "
                                                                    "(config/job_config.py) has no such field, and tyro "
                                                                    "refuses the launch")
        full = f"{section}.{key}"
        if full == "parallelism.module_fqns_per_model_part" and args:
            value = [[n for n in arg.split(",") if n] for arg in args]
        elif full in _TOML_LISTS and args:
            value = [n.strip() for arg in args for n in arg.split(",") if n.strip()]
        elif len(args) == 1:
            value = _typed(args[0])
        elif args:
            value = args
        values[full] = value
    return values


def _typed(word: str) -> Any:
    """A command-line value as TOML would hold it: an integer, a number, else the word."""
    if re.fullmatch(r"[+-]?\d{1,19}", word):
        return int(word)
    try:
        number = float(word)
    except ValueError:
        return word
    return number if math.isfinite(number) else word


def _torchrun_flags(words: list[str]) -> Optional[tuple[Optional[str], Optional[str]]]:
    """torchrun's --nnodes and --nproc-per-node from its words before the module, None without torchrun."""
    if not any(Path(w).name == "torchrun" or w in ("torch.distributed.run", "torch.distributed.launch")
               for w in words):
        return None
    said: dict[str, str] = {}
    for i, word in enumerate(words):
        name, eq, inline = word.partition("=")
        name = name.replace("_", "-")
        if name in ("--nnodes", "--nproc-per-node"):
            said[name] = inline if eq else (words[i + 1] if i + 1 < len(words) else "")
    return said.get("--nnodes"), said.get("--nproc-per-node")


def _is_subcommand(word: str) -> bool:
    return word.startswith(("activation_checkpoint:", "activation-checkpoint:"))


def _from_words(src: str, words: list[str]) -> _Settings:
    """torchtitan 0.3.0's command line (ConfigManager, then tyro): ``--section.key words...``,
    switches, ``--module``/``--config`` and the activation-checkpoint subcommand."""
    values: dict[str, Any] = {}
    base: dict[str, str] = {}
    ac_mode = None
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word in ("$@", "$*"):  # a launch script passes its own arguments on: none here
            continue
        if _is_subcommand(word):
            if ac_mode is not None:
                raise CaseError(src, word, f"a second activation-checkpoint subcommand (after "
                                           f"activation_checkpoint:{ac_mode}): tyro takes one")
            ac_mode = word.split(":", 1)[1]
            continue
        field = word[2:].partition("=")[0].replace("-", "_").removeprefix("activation_checkpoint.")
        if ac_mode is not None and word[2:].replace("-", "_").startswith("activation_checkpoint.") \
                and field.removeprefix("no_") in AC_OPTIONS.get(ac_mode, ()):
            # the subcommand's own options (distributed/activation_checkpoint.py): none priced
            if not word.partition("=")[1] and field not in AC_SWITCHES and not field.startswith("no_") \
                    and i < len(words) and not words[i].startswith("--"):
                i += 1
            continue
        if word.partition("=")[0] in ("--module", "--config"):
            # ConfigManager._load_config takes these two out wherever they stand, before tyro parses the rest.
            key, eq, inline = word[2:].partition("=")
            if not eq and (i >= len(words) or words[i].startswith("--")):
                raise CaseError(src, f"--{key}", "expected one value (ConfigManager._load_config)")
            base[key] = inline if eq else words[i]
            i += 0 if eq else 1
            continue
        if ac_mode is not None and word[2:].replace("-", "_").startswith("activation_checkpoint."):
            # An activation_checkpoint option after the subcommand that the subcommand does not take: it is in
            # the right place, but no such option exists in 0.3 (0.2's selective_ac_option). "The subcommand
            # goes last" sent the user to move it before the subcommand, where it is refused again.
            raise CaseError(src, f"--activation_checkpoint.{one_line(field, 60)}",
                            f"activation_checkpoint:{ac_mode} in torchtitan 0.3.0 has no such option (it takes "
                            f"{', '.join(AC_OPTIONS.get(ac_mode, ())) or 'none'}); tyro refuses it")
        if ac_mode is not None and word.startswith("--"):
            # tyro reads what follows a subcommand as that subcommand's options
            raise CaseError(src, one_line(word, 60), f"follows activation_checkpoint:{ac_mode}, whose options tyro "
                                                     "takes it for: the subcommand goes last")
        if not word.startswith("--"):
            raise CaseError(src, one_line(word, 60), "expected a --section.key option or the "
                                                     "activation_checkpoint:<mode> subcommand (tyro refuses a stray "
                                                     "word)")
        name, eq, inline = word[2:].partition("=")
        args = [inline] if eq else []
        while not eq and i < len(words) and not words[i].startswith("--") and not _is_subcommand(words[i]) \
                and words[i] not in ("$@", "$*"):
            args.append(words[i])
            i += 1
        name = name.replace("-", "_")  # tyro takes --a.b-c for --a.b_c
        if name in TOP_LEVEL:
            if len(args) != 1:
                raise CaseError(src, f"--{name}", "expected one value (Trainer.Config's field, trainer.py)")
            continue
        section, dot, key = name.partition(".")
        if not dot or not key:
            raise CaseError(src, one_line(word, 60), "expected --section.key (torchtitan's options are grouped "
                                                     "by section: --parallelism.tensor_parallel_degree 2)")
        if section == "activation_checkpoint":  # torchtitan 0.2's --activation_checkpoint.mode full
            raise CaseError(src, f"--{one_line(name, 60)}", "torchtitan 0.3.0 takes activation checkpointing as the "
                                                            "subcommand activation_checkpoint:<none|selective|full>, "
                                                            "last on the line; tyro refuses this option")
        if section not in SECTIONS:
            meant = _meant(section, SECTIONS, 0.75)
            raise CaseError(src, f"--{one_line(name, 60)}", f"unknown section {one_line(section, 40)!r}{meant}: "
                                                            "torchtitan 0.3.0's Trainer.Config (trainer.py) has no such "
                                                            "section, and tyro refuses the launch")
        if key.startswith("no_") and not args and f"{section}.{key[3:]}" in SWITCHES:
            key, value = key[3:], False
        else:
            value = args if args else True
        if section in KNOWN_KEYS and key not in KNOWN_KEYS[section]:
            meant = _meant(key, KNOWN_KEYS[section], 0.8, f"{section}.")
            raise CaseError(src, f"{section}.{one_line(key, 60)}", f"unknown key{meant}: torchtitan 0.3.0's "
                                                                    f"{section} section (config/configs.py) has no "
                                                                    "such field, and tyro refuses the launch")
        values[f"{section}.{key}"] = value
    named = " ".join(f"--{k} {v}" for k, v in base.items()) or None
    source = None
    own_model = None
    if "module" in base and "config" in base:
        # What the base config sets, under the overrides (ConfigManager: F() first, then tyro).
        found = read_base(base["module"], base["config"], Path(src).parent)
        if found is not None:
            source = found.source
            for key, value in found.values.items():
                values.setdefault(key, _as_words(value))
            ac_mode = ac_mode if ac_mode is not None else found.ac_mode
            own_model = found.model
    return _Settings(src, values, cli=True, base=named, ac_mode=ac_mode, base_source=source, own_model=own_model)


def _as_words(value: Any) -> Any:
    """A base config's value as the command line would give it: a switch's bool, else its words."""
    if isinstance(value, bool):
        return value
    if value is None:
        return ["None"]
    if isinstance(value, list) and all(isinstance(v, list) for v in value):
        return [",".join(map(str, part)) for part in value]
    if isinstance(value, list):
        return [",".join(map(str, value))]
    return [str(value)]


# --- the layout ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Degrees:
    replicate: int
    shard: int
    tp: int
    cp: int
    pp: int
    ep: int

    @property
    def dp(self) -> int:
        return self.replicate * self.shard


def _degrees(s: _Settings, num_gpus: int) -> _Degrees:
    """The degrees over the case's GPUs, data_parallel_shard_degree -1 filled as ParallelDims._validate
    fills it (distributed/parallel_dims.py): the world over replicate·cp·tp·pp."""
    p = "parallelism."
    replicate = s.integer(p + "data_parallel_replicate_degree", 1)
    tp = s.integer(p + "tensor_parallel_degree", 1)
    cp = s.integer(p + "context_parallel_degree", 1)
    pp = s.integer(p + "pipeline_parallel_degree", 1)
    ep = s.integer(p + "expert_parallel_degree", 1)
    shard_key = p + "data_parallel_shard_degree"
    shard = s.integer(shard_key, -1, minimum=-1)
    if shard == 0:
        raise CaseError(s.src, shard_key, "expected -1 (the rest of the GPUs) or an integer >= 1, got 0 "
                                          "(ParallelDims: dp_shard must -1 or >=1)")
    rest = replicate * cp * tp * pp
    if shard == -1:
        if num_gpus % rest:
            raise CaseError(s.src, shard_key, f"-1 (the rest of the GPUs), but replicate·cp·tp·pp = "
                                              f"{replicate}·{cp}·{tp}·{pp} = {rest} does not divide the case's "
                                              f"{num_gpus} GPUs (ParallelDims)")
        shard = num_gpus // rest
    if rest * shard != num_gpus:
        raise CaseError(s.src, shard_key, f"replicate·shard·cp·tp·pp = {replicate}·{shard}·{cp}·{tp}·{pp} = "
                                          f"{rest * shard}, but the case has {num_gpus} GPUs (ParallelDims: "
                                          "their product must be the world size)")
    return _Degrees(replicate, shard, tp, cp, pp, ep)


def hsdp_refusal(replicate: int, shard: int, cp: int) -> Optional[str]:
    """Why data-parallel degrees that replicate over dp_replicate and shard over dp_shard·cp (HSDP:
    torchtitan folds cp into its FSDP mesh, ParallelDims.build_mesh: fsdp = dp_shard·cp) are refused,
    else None: HSDP has no ZeRO stage the cost model prices. The launch reader's rule (:func:`_zero_stage`),
    and a training log's mesh line's (training_logs._titan_mesh)."""
    if replicate > 1 and shard * cp > 1:
        over = f"data_parallel_shard_degree {shard}" if shard > 1 else f"context_parallel_degree {cp}"
        return (f"{replicate} with {over} is HSDP (replicated over one group, sharded over the other), which the "
                "cost model does not price: shard over all the data-parallel GPUs (replicate 1) or replicate over "
                "them (shard 1, no cp)")
    return None


def degrees_zero_stage(replicate: int, shard: int, cp: int) -> Optional[int]:
    """The ZeRO stage torchtitan's data-parallel degrees make, where they make one: FSDP2 sharding over
    dp_shard·cp is ZeRO 3, replication alone ZeRO 0; None on one data-parallel GPU, where the config's other
    settings decide (:func:`_zero_stage`). HSDP is refused first (:func:`hsdp_refusal`)."""
    if shard * cp > 1:
        return 3
    return 0 if replicate > 1 else None


def _zero_stage(s: _Settings, d: _Degrees) -> int:
    """FSDP2 sharding is ZeRO 3, replication ZeRO 0; sharding and replication together (HSDP) has no
    ZeRO stage the cost model prices (:func:`degrees_zero_stage`, :func:`hsdp_refusal`). With nothing
    to shard over, FSDP2 still wraps the model (models/llama3/parallelize.py: apply_fsdp_to_decoder at
    shard degree 1); the emitter marks ZeRO 3 there by fsdp_reshard_after_forward "always" (and CPU
    offload needs FSDP)."""
    # ParallelismConfig's Literal: refused by tyro whatever the degrees
    reshard = s.choice("parallelism.fsdp_reshard_after_forward", "default", ("default", "always", "never"))
    refusal = hsdp_refusal(d.replicate, d.shard, d.cp)
    if refusal:
        raise CaseError(s.src, "parallelism.data_parallel_replicate_degree", refusal)
    stage = degrees_zero_stage(d.replicate, d.shard, d.cp)
    if stage is not None:
        return stage
    return 3 if reshard == "always" or s.switch("training.enable_cpu_offload", False) else 0


def _cp_balanced(s: _Settings, cp: int) -> bool:
    """Whether the job's context parallelism balances causal attention over its ranks (headtail or ptrr), False
    where ``context_parallel_load_balancer`` is None (the command line's word ``None``); refused where torchtitan
    refuses the value (:data:`CP_BALANCERS`)."""
    value = s.string(CP_BALANCER_KEY, "headtail")
    if value == "":
        raise CaseError(s.src, CP_BALANCER_KEY, "expected headtail, ptrr or None, got an empty string "
                                                "(ParallelismConfig.__post_init__ refuses it, config/configs.py)")
    unbalanced = s.cli and value == "None"
    if cp > 1 and not unbalanced and value not in CP_BALANCERS:
        hint = " (None, capitalised, is tyro's word for no balancer)" if value.lower() == "none" else ""
        raise CaseError(s.src, CP_BALANCER_KEY, f"expected headtail, ptrr or None, got {one_line(value, 40)!r}"
                                                f"{hint}: torchtitan's cp_shard raises at the first step with "
                                                "context parallelism (distributed/context_parallel/api.py)")
    return not unbalanced


# The K/V exchanges torch's set_rotate_method takes (torch/distributed/tensor/experimental/_attention.py);
# it raises NotImplementedError on any other. torchtitan 0.2 passes [parallelism]
# context_parallel_rotate_method (default "allgather") to it; 0.3.0 has no such field.
CP_ROTATE_METHODS = ("allgather", "alltoall")
CP_ROTATE_KEY = "parallelism.context_parallel_rotate_method"


def _cp_rotate_method(s: _Settings, cp: int) -> str:
    """A 0.2 job file's rotate method, refused where torch would raise at the first step with context
    parallelism; the estimate prices the one that runs (``stage_time.cp_torch_collectives``)."""
    key = CP_ROTATE_KEY
    value = s.string(key, "allgather")
    if cp > 1 and value not in CP_ROTATE_METHODS:
        raise CaseError(s.src, key, f"expected allgather or alltoall, got {one_line(value, 40)!r}: torch's "
                                    "set_rotate_method raises on another (NotImplementedError) at the first step "
                                    "with context parallelism")
    return value


def _schedule(s: _Settings, pp: int) -> tuple[str, bool]:
    """(the schedule's name, whether a rank holds several stages), refused where not priced."""
    key = "parallelism.pipeline_parallel_schedule"
    name = s.string(key, "1F1B")
    known = {n.lower(): n for n in SINGLE_STAGE_SCHEDULES + MULTI_STAGE_SCHEDULES}
    if name.lower() not in known:
        raise CaseError(s.src, key, f"unknown schedule {one_line(name, 40)!r}: torch's get_schedule_class takes "
                                    f"{', '.join(known.values())}")
    name = known[name.lower()]
    if pp > 1 and name not in PRICED_SCHEDULES:
        raise CaseError(s.src, key, f"{name} is not priced: the cost model times 1F1B and Interleaved1F1B "
                                    "pipelines only")
    return name, name in MULTI_STAGE_SCHEDULES


def generated_counts(stages: int, layers: int, first_less: int, last_less: int) -> list[int]:
    """Transformer layers of each model part where torchtitan splits the model itself
    (distributed/pipeline_parallel.py ``_generate_llm_fqn_per_model_part``): the layers and the
    embedding (``first_less`` layers' worth) and output (``last_less``) spread evenly over the stages,
    the spare ones first. Raises ValueError where torchtitan does."""
    if stages == 1:
        return [layers]
    effective = layers + first_less + last_less
    if stages > effective:
        raise ValueError(f"{stages} stages are more than the {effective} effective layers")
    per, extra = divmod(effective, stages)
    if per == 0 or first_less > per or last_less > per:
        raise ValueError(f"{stages} stages of {effective} effective layers leave the embedding or output weight "
                         f"({first_less}, {last_less}) more than the {per} layers a stage")
    counts, placed = [], 0
    for stage in range(stages):
        share = per + (stage < extra) - (first_less if stage == 0 else last_less if stage == stages - 1 else 0)
        take = max(0, min(share, layers - placed))
        counts.append(take)
        placed += take
    return counts


_LAYER = re.compile(r"layers\.(\d+)")
# The modules around the decoder layers (models/llama3, models/common; "output" in torchtitan 0.2).
_EDGE_MODULES = {"tok_embeddings": "first", "norm": "last", "lm_head": "last", "output": "last"}


def part_counts(src: str, key: str, parts: list[list[str]], layers: int) -> list[int]:
    """Transformer layers of each model part of ``module_fqns_per_model_part``, checked to hold every
    layer once, in order, the embedding in the first part and the norm and head in the last."""
    seen: list[int] = []
    counts = []
    for index, part in enumerate(parts):
        count = 0
        for name in part:
            match = _LAYER.fullmatch(name)
            if match:
                seen.append(int(match.group(1)))
                count += 1
                continue
            edge = _EDGE_MODULES.get(name)
            if edge is None:
                raise CaseError(src, key, f"module {one_line(name, 40)!r} is not read (expected tok_embeddings, "
                                          "layers.N, norm and lm_head)")
            if index != (0 if edge == "first" else len(parts) - 1):
                raise CaseError(src, key, f"{name} is in model part {index}; the cost model holds it in the {edge} "
                                          f"part (of {len(parts)})")
        counts.append(count)
    if seen != list(range(layers)):
        raise CaseError(src, key, f"the parts hold layers {_ranges(seen)}; expected each of the case's model's "
                                  f"{layers} layers once, in order (layers.0 to layers.{layers - 1})")
    # torchtitan builds only the modules named (pipeline_parallel.py): a model without its embedding, final
    # norm or head is another model
    named = {name for part in parts for name in part}
    for needed in ("tok_embeddings", "norm"):
        if needed not in named:
            raise CaseError(src, key, f"names no {needed}: torchtitan builds only the modules the parts name, and "
                                      "the cost model prices the whole model")
    if not named & {"lm_head", "output"}:
        raise CaseError(src, key, "names no lm_head (output): torchtitan builds only the modules the parts name, "
                                  "and the cost model prices the whole model")
    return counts


def _ranges(indices: list[int]) -> str:
    shown = ", ".join(map(str, indices[:6]))
    return f"{shown}{', …' if len(indices) > 6 else ''} ({len(indices)} entries)"


@dataclass(frozen=True)
class _Pipeline:
    vpp: int
    stage_layers: Optional[tuple[int, ...]]
    chunk_layers: Optional[tuple[int, ...]]


def _pipeline(s: _Settings, pp: int, layers: int) -> _Pipeline:
    """The pipeline's model parts as torchtitan builds them (pipeline_parallel.py ``pipeline_llm``):
    ``module_fqns_per_model_part`` where given, else its own split into one part a rank for a
    single-stage schedule, two for a looped one, or as many as ``pipeline_parallel_layers_per_stage``
    makes (``_get_pipeline_metadata``); part v on rank v mod pp (the "loop" placement)."""
    name, multi = _schedule(s, pp)
    if pp == 1:
        return _Pipeline(1, None, None)
    p = "parallelism."
    key = p + "module_fqns_per_model_part"
    parts = s.parts(key)
    if parts is None:
        key = p + "pipeline_parallel_layers_per_stage"
        per_stage = s.integer(key, None)
        first_less = s.integer(p + "pipeline_parallel_first_stage_less_layers", 1, minimum=0)
        last_less = s.integer(p + "pipeline_parallel_last_stage_less_layers", 1, minimum=0)
        stages = math.ceil((layers + first_less + last_less) / per_stage) if per_stage else pp * (2 if multi else 1)
        try:
            counts = generated_counts(stages, layers, first_less, last_less)
        except ValueError as error:
            raise CaseError(s.src, key, f"torchtitan cannot split the model: {error}") from None
    else:
        counts = part_counts(s.src, key, parts, layers)
    if len(counts) % pp:
        raise CaseError(s.src, key, f"{len(counts)} model parts do not divide over pipeline_parallel_degree {pp}")
    vpp = len(counts) // pp
    if multi != (vpp > 1):
        raise CaseError(s.src, p + "pipeline_parallel_schedule",
                        f"{name} runs {'two or more stages' if multi else 'one stage'} a rank, but the "
                        f"{len(counts)} model parts over pp {pp} give {vpp} (pipeline_parallel.py)")
    chunks = rank_chunks(counts, pp)
    stage_layers = tuple(sum(c) for c in chunks)
    # Each rank's parts equal: the layout's stages (split into vpp chunks as the planner does); else
    # the parts themselves, which torchtitan's rule in engine.py names.
    chunk_layers = None if all(len(set(c)) == 1 for c in chunks) else tuple(counts)
    return _Pipeline(vpp, stage_layers, chunk_layers)


def _recompute(s: _Settings) -> str:
    """The layout's recompute for the activation checkpointing the job sets: torchtitan 0.3.0's
    subcommand (SelectiveAC, op-level, where none is given: trainer.py ``Trainer.Config``), or 0.2's mode
    with its selective_ac_option: "op" is op-level selective, an integer N checkpoints every N-th
    layer whole (1: every layer, recompute full)."""
    mode = s.ac_mode if s.ac_mode is not None else "selective"
    key = "activation_checkpoint" if s.cli else "activation_checkpoint.mode"
    if mode in UNPRICED_AC_MODES:
        raise CaseError(s.src, key, f"{mode}: memory-budget checkpointing (MemoryBudgetAC) is not priced; "
                                    "expected none, selective or full")
    if mode not in AC_MODES:
        raise CaseError(s.src, key, f"unknown mode {one_line(mode, 40)!r}: expected none, selective or full")
    if mode == "selective" and not s.cli:
        option = s.ac_option
        key = "activation_checkpoint.selective_ac_option"
        said = f"{one_line(option, 20)!r}" if key in s.values else "absent (torchtitan 0.2's default '2')"
        if option == "op":
            return "selective"
        # torchtitan 0.1 and 0.2 (_apply_ac_to_transformer_block: models/llama3/infra/parallelize.py at 0.1,
        # distributed/activation_checkpoint.py at 0.2) take "op" or str.isdigit() words, int() of which
        # checkpoints layer i where "not ac_freq or i % ac_freq == 0"; anything else raises ValueError
        # ("Invalid selective AC option") at startup, so "-1" is no layer frequency to price.
        try:
            every = int(option) if option.isdigit() else None
        except ValueError:  # a digit str.isdigit() takes and int() does not ("²"): torchtitan's int() raises too
            every = None
        if every is None:
            raise CaseError(s.src, key, f"{said}: torchtitan 0.2 refuses it at startup (Invalid selective AC "
                                        "option); expected 'op' (op-level selective) or a positive integer N "
                                        "(every N-th layer checkpointed whole)")
        if every <= 1:  # 1, and 0 ("not ac_freq"): every layer checkpointed whole
            return "full"
        raise CaseError(s.src, key, f"{said}: selective checkpointing of every N-th layer (N > 1) is not priced "
                                    "(torchtitan's full checkpointing wraps every layer or none); expected 'op' "
                                    "(op-level selective) or '1'")
    return AC_MODES[mode]


def _batch(s: _Settings, case, dp: int, pp: int) -> int:
    """The micro-batch, the global batch checked against the case as Trainer.__init__ (trainer.py)
    checks it: global_batch_size (-1: local_batch_size × dp, one accumulation step) a multiple of
    local_batch_size × dp. With a pipeline the micro-batch is pipeline_parallel_microbatch_size, which
    must divide local_batch_size (Trainer.Config.__post_init__)."""
    t, p = "training.", "parallelism."
    key = t + "global_batch_size"
    local = s.integer(t + "local_batch_size", 8)
    global_batch = s.integer(key, -1, minimum=-1)
    if global_batch == 0:
        raise CaseError(s.src, key, "expected -1 (local_batch_size × dp) or a positive integer, got 0")
    said = str(global_batch)
    if global_batch == -1:
        global_batch = local * dp
        said = f"{'-1' if key in s.values else s.absent(key, -1)}, so local_batch_size × dp = {local}·{dp} = " \
               f"{global_batch}"
    wanted = case.training.global_batch_size
    if global_batch != wanted:
        raise CaseError(s.src, key, f"{said}: the case {case.source} has training.global_batch_size {wanted}")
    if global_batch % (local * dp):
        raise CaseError(s.src, key, f"{global_batch} is not a multiple of local_batch_size × dp = {local}·{dp} = "
                                    f"{local * dp} (Trainer.__init__)")
    if pp == 1:
        return local
    micro = s.integer(p + "pipeline_parallel_microbatch_size", 1)
    if local % micro:
        raise CaseError(s.src, p + "pipeline_parallel_microbatch_size",
                        f"{micro} must divide training.local_batch_size {local} (Trainer.Config)")
    return micro


def _check_training(s: _Settings, case, d: _Degrees) -> None:
    """What torchtitan's own checks refuse, and the training settings the case prices: the
    sequence, the parameters' dtype, the reduction's, the converters (a TOML file's)."""
    t = "training."
    training = case.training
    seq_len = s.integer(t + "seq_len", 2048)
    if seq_len != training.seq_len:
        said = seq_len if t + "seq_len" in s.values else s.absent(t + "seq_len", 2048)
        raise CaseError(s.src, t + "seq_len", f"{said} differs from the case's training.seq_len {training.seq_len}")
    param = s.choice(t + "mixed_precision_param", "bfloat16", tuple(PARAM_DTYPES))
    if training.precision not in PARAM_DTYPES[param]:
        raise CaseError(s.src, t + "mixed_precision_param", f"{param}, but the case {case.source} trains in "
                                                            f"{training.precision} (training.precision)")
    s.choice(t + "mixed_precision_reduce", "float32", ("float32",))
    if s.choice(t + "dtype", "float32", ("float32", "bfloat16")) == "bfloat16":
        raise CaseError(s.src, t + "dtype", "bfloat16 trains without float32 master weights, which torchtitan's "
                                            "plan does not price (engines/torchtitan/engine.py: pure_bf16)")
    if d.pp > 1 and s.cli and not s.switch(t + "disable_cuda_graphs", False):
        raise CaseError(s.src, t + "disable_cuda_graphs", "absent with pipeline parallelism: torchtitan refuses the "
                                                          "config (Trainer.Config: CUDA graphs do not support "
                                                          "pipeline parallelism yet); give --training."
                                                          "disable_cuda_graphs")
    if d.ep > 1 and case.model.is_moe and s.cli and not s.switch(t + "disable_cuda_graphs", False) \
            and _dispatch_syncs(s):
        said = "false" if t + "disable_cuda_graphs" in s.values else "absent"
        raise CaseError(s.src, t + "disable_cuda_graphs", f"{said} with expert parallelism: torchtitan refuses the "
                                                          "config (Trainer.Config._validate_cuda_graphs: the "
                                                          "all-to-all token dispatcher synchronizes with the "
                                                          "host); give --training.disable_cuda_graphs")
    if not s.cli:
        _check_converters(s, case)


def _dispatch_syncs(s: _Settings) -> bool:
    """Whether the job's expert dispatch synchronizes with the host, which CUDA graphs refuse
    (Trainer.Config._validate_cuda_graphs): the all-to-all of a model built without a base config's
    own dispatch; not MinimalAsyncEP, nor HybridEP with a non-blocking capacity, where the base config
    read builds them (model_registry's moe_comm_backend); unknown where a base is named but not read."""
    if s.base and not s.base_source:
        return False
    backend = s.values.get("model_spec.moe_comm_backend")  # the base's words (_as_words)
    capacity = s.values.get("model_spec.non_blocking_capacity_factor")
    return not (backend == ["minimal_async_ep"] or backend == ["hybridep"] and capacity not in (None, ["None"]))


def _check_linears_converted(src: str, key: str, grouped: list[bool], case) -> None:
    """Converters (``grouped``: whether each converts the experts' grouped GEMMs, not the linears) that
    leave a low-precision case's linears in 16 bits are refused: the experts' converter walks the
    GroupedExperts modules alone (components/quantization), so with no linear converter beside it every
    other GEMM runs in bf16, priced in the case's precision; on a model without experts it converts
    nothing at all."""
    if not grouped or not all(grouped):
        return
    precision = case.training.precision
    if not case.model.is_moe:
        raise CaseError(src, key, f"converts grouped experts only, but the case's model has none: nothing "
                                  f"would train in {precision}; expected a linear converter")
    raise CaseError(src, key, f"converts the experts only, but the case {case.source} trains its linears in "
                              f"{precision} (training.precision): expected a linear converter too")


def decoder_linears(model, release: str) -> list[tuple[str, int, int]]:
    """The linears of each decoder layer torchtitan builds for ``model``, as (FQN under ``layers.N.``, in
    features, out features), for ``release`` "0.2" (nn.Linear modules: models/{llama3,qwen3}/model/model.py
    Attention's wq, wk, wv, wo; models/deepseek_v3/model/model.py's MLA wq or wq_a and wq_b, wkv_a, wkv_b, wo;
    FeedForward's w1, w2, w3; models/moe/moe.py's router.gate and shared_experts) or "0.3" (Linear.Config:
    models/common/config_utils.py, whose GQA configs fuse wq, wk and wv into qkv_linear.wqkv, fuse_qkv True in
    every llama3, qwen3 and gpt_oss flavour; models/deepseek_v3/__init__.py's MLA as 0.2's). The MoE layer's
    router gate is listed (priced bf16, BF16_PRICED_LINEARS); the routed experts are grouped GEMMs, no
    linears. A dense layer lists feed_forward, an MoE layer moe.*; the caller picks by ``is_moe_layer``."""
    h = model.hidden_size
    if model.attention_type == "mla":
        heads, rope = model.num_attention_heads, model.qk_rope_head_dim
        q = heads * (model.qk_head_dim + rope)
        attention = ([("attention.wq", h, q)] if not model.q_lora_rank else
                     [("attention.wq_a", h, model.q_lora_rank), ("attention.wq_b", model.q_lora_rank, q)])
        attention += [("attention.wkv_a", h, model.kv_lora_rank + rope),
                      ("attention.wkv_b", model.kv_lora_rank, heads * (model.qk_head_dim + model.v_head_dim))]
    elif release == "0.2":
        attention = [("attention.wq", h, model.q_size), ("attention.wk", h, model.kv_size),
                     ("attention.wv", h, model.v_size)]
    else:
        attention = [("attention.qkv_linear.wqkv", h, model.q_size + model.kv_size + model.v_size)]
    attention.append(("attention.wo", model.context_size, h))
    ffn, shared = model.ffn_hidden_size, model.moe_shared_expert_ffn_hidden_size
    dense = [("feed_forward.w1", h, ffn), ("feed_forward.w2", ffn, h), ("feed_forward.w3", h, ffn)]
    moe = [("moe.router.gate", h, model.num_experts)] if model.is_moe else []
    if model.is_moe and shared:
        moe += [("moe.shared_experts.w1", h, shared), ("moe.shared_experts.w2", shared, h),
                ("moe.shared_experts.w3", h, shared)]
    return attention + dense + moe


def _rowwise_auto_filter_converts(in_features: int, out_features: int) -> bool:
    """torchao's ``_auto_filter_for_rowwise`` (torchao/float8/float8_linear_utils.py, torchao 0.18.0), on an
    nn.Linear of this shape: ``N, K = mod.weight.shape`` (out, in features), both divisible by 16, and above its
    H100 thresholds: not N <= 2048, not K <= 1024, not (N <= 4096 and K <= 2048)."""
    n, k = out_features, in_features
    if k % 16 or n % 16:
        return False
    return not (n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048))


def _low_precision_linears(case, release: str):
    """(FQN, in, out) of every decoder linear the estimate prices in the case's low precision: all but the
    MoE router's gate (BF16_PRICED_LINEARS) and the layers of the recipe's bf16 tail
    (placement.high_precision_tail, NVFP4's last 15%)."""
    from cost_models.placement import high_precision_tail

    model = case.model
    last = model.num_layers - high_precision_tail(model, case.training)
    per_layer = decoder_linears(model, release)
    for index in range(last):
        moe = model.is_moe_layer(index)
        for name, fan_in, fan_out in per_layer:
            if name.startswith("moe.") != moe or name == "moe.router.gate":
                continue
            yield f"layers.{index}.{name}", fan_in, fan_out


def _bf16_linear_refusal(case, release: str, converts) -> Optional[str]:
    """Why a linear converter is refused, or None: the first decoder linear the estimate prices in the case's
    low precision that ``converts(fqn, in, out)`` leaves in bf16. The cost model prices a layer's linears in one
    precision (kernels.high_precision_precision keeps only the LM head and the router's gate bf16), so a run
    with some of a layer's projections in bf16 is not one it can price."""
    for fqn, fan_in, fan_out in _low_precision_linears(case, release):
        if not converts(fqn, fan_in, fan_out):
            return (f"leaves the decoder linear {fqn} ({fan_in} → {fan_out}) in bf16, which the estimate prices in "
                    f"{case.training.precision} (the cost model prices a decoder layer's projections in one "
                    "precision): filter the LM head or the router's gate only")
    return None


def _check_toml_filters(s: _Settings, case, names: list[str]) -> None:
    """A 0.1 or 0.2 job file's linear converter's filter_fqns, as its module_filter_fn applies them to each
    nn.Linear (components/quantization/utils.py at v0.2.2: both dimensions divisible by 16 and no entry a
    substring of the FQN), and float8's ``auto_filter_small_kn`` as torchao's rowwise heuristic
    (components/quantization/float8.py at v0.2.2 ``_init_filter_fn``; tensorwise is refused before this, and
    rowwise_with_gw_hp raises NotImplementedError in torchao's _auto_filter_for_recipe): a decoder linear left
    in bf16 is refused (:func:`_bf16_linear_refusal`)."""
    for name, key, filters, auto, converts in _toml_linear_converters(s, names):
        if auto:
            recipe = next((s.string(k, None) for k in FLOAT8_RECIPE_KEYS if s.string(k, None)), "tensorwise")
            if recipe == "rowwise_with_gw_hp":
                raise CaseError(s.src, key, f"{AUTO_FILTER} with recipe rowwise_with_gw_hp: torchao's "
                                            "_auto_filter_for_recipe raises NotImplementedError (Unsupported "
                                            "recipe), so torchtitan 0.2 fails at startup")
        why = _bf16_linear_refusal(case, "0.2", converts)
        if why:
            said = f"{filters!r}" + (" (torchao's size thresholds, _auto_filter_for_rowwise)" if auto else "")
            raise CaseError(s.src, key, f"{one_line(said, 120)} {why}")


def _toml_linear_converters(s: _Settings, names: list[str]):
    """(converter, filter key, filters, auto, converts) for each linear converter a 0.1 or 0.2 job file's
    [model] converters names: ``converts(fqn, in, out)`` whether it converts that nn.Linear, by its
    module_filter_fn (components/quantization/utils.py at v0.2.2: both dimensions divisible by 16 and no
    filter_fqns entry a substring of the FQN), where float8's filters hold ``auto_filter_small_kn`` (``auto``)
    by torchao's rowwise size heuristic besides (:func:`_rowwise_auto_filter_converts`)."""
    for name in names:
        for key in TOML_FILTER_KEYS.get(name, ()):
            filters = s.names(key, TOML_FILTER_DEFAULTS.get(key, []))
            auto = AUTO_FILTER in filters and "float8" in name
            words = [w for w in filters if not (auto and w == AUTO_FILTER)]

            def converts(fqn, fan_in, fan_out, words=words, auto=auto):
                if any(word in fqn for word in words) or fan_in % 16 or fan_out % 16:
                    return False
                return _rowwise_auto_filter_converts(fan_in, fan_out) if auto else True

            yield name, key, filters, auto, converts


def _check_converters(s: _Settings, case) -> None:
    """torchtitan 0.2's [model] converters run the case's precision: float8 fp8 (its [float8]
    recipe_name the case's recipe; None, 0.2's default, is tensorwise scaling), mx MXFP8."""
    key = "model.converters"
    names = s.names(key, [])
    unknown = [n for n in names if n not in CONVERTER_PRECISIONS]
    if unknown:
        raise CaseError(s.src, key, f"{one_line(unknown[0], 40)!r} is not read: expected one of "
                                    f"{', '.join(CONVERTER_PRECISIONS)}")
    precision = case.training.precision
    runs = {CONVERTER_PRECISIONS[n] for n in names}
    if len(runs) > 1:
        raise CaseError(s.src, key, "float8 and mx together: expected one of them")
    wanted = precision if precision in CONVERTER_PRECISIONS.values() else None
    if (next(iter(runs)) if runs else None) != wanted:
        said = f"{names}" if names else "absent (no converter: 16-bit GEMMs)"
        raise CaseError(s.src, key, f"{said}, but the case {case.source} trains in {precision} "
                                    "(training.precision)")
    _check_linears_converted(s.src, key, [n.startswith("quantize.grouped_mm.") for n in names], case)
    if precision == "fp8":
        where = next((k for k in FLOAT8_RECIPE_KEYS if s.string(k, None) is not None), FLOAT8_RECIPE_KEYS[0])
        recipe = s.string(where, None) or "tensorwise"
        if recipe == "tensorwise":
            # 0.1 and 0.2 scale per tensor unless told otherwise; 0.3.0, the torchtitan priced here, takes
            # rowwise recipes only (Float8LinearConverter.Config.recipe_name).
            raise CaseError(s.src, where, "absent or tensorwise: torchtitan 0.2 scales fp8 per tensor, which "
                                          "0.3.0 (the torchtitan this plans for) no longer runs; its rowwise "
                                          "recipes are priced (estimate the run's layout with training.engine "
                                          "any for tensorwise)")
        if recipe != case.training.recipe.name:
            raise CaseError(s.src, where, f"scales fp8 {recipe}, but the case's recipe is "
                                          f"{case.training.recipe.name} (training.fp8_recipe)")
    _check_toml_filters(s, case, names)


def _experts(s: _Settings, model, d: _Degrees) -> dict:
    """ep and etp for a mixture of experts: without expert parallelism torchtitan splits the experts over
    the TP ranks (models/common/moe_sharding.py: expert_param_placement_dense; 0.2's
    models/*/infra/parallelize.py apply_moe_ep_tp, whose expert_tensor_parallel_degree has "no effect"
    there); with it, whole experts (0.3.0 has no expert tensor parallelism; 0.2's degree, 1 by default,
    is the engine's to refuse above 1)."""
    key = "parallelism.expert_parallel_degree"
    if not model.is_moe:
        if d.ep > 1:
            raise CaseError(s.src, key, f"{d.ep}, but the case's model is dense (no experts to split)")
        return {}
    if d.ep == 1:
        return {"ep": 1, "etp": d.tp}
    return {"ep": d.ep, "etp": s.integer("parallelism.expert_tensor_parallel_degree", 1)}


def _default_split(case, layout: Layout) -> bool:
    """Whether ``layout``'s stages (and chunks) are the split the planner makes by itself (its
    stage_layers and chunk_layers None): then the layout is read without them, as the plan holds it."""
    try:
        own = Job(case.model, case.cluster, case.training, layout, case.overheads)
        default = Job(case.model, case.cluster, case.training,
                      replace(layout, stage_layers=None, chunk_layers=None), case.overheads)
        return default.stage_layers == own.stage_layers and default.model_chunk_layers == own.model_chunk_layers
    except SpecError:
        return False


def _shape(model) -> str:
    """The shape emit's tables match a model by (emit._base), in words."""
    words = f"{model.num_layers} layers, hidden {model.hidden_size}"
    if model.is_moe:
        return words + f", {model.num_experts} experts, top-{model.moe_top_k}, {model.moe_ffn_hidden_size} wide"
    return words + f", {model.num_attention_heads} heads, ffn {model.ffn_hidden_size}"


def _check_base_model(s: _Settings, case) -> None:
    """What a base config's model spec builds, which no command-line override changes: torchtitan's
    model flavour (``model_registry(flavor)`` in its config function: qwen3_30b_a3b builds the 48-layer
    30B-A3B whatever the case's model), and llama3_405b's Float8LinearConverter (``emit.BASE_CONVERTERS``).
    A job on another model or precision than the case's is another run: refused, as Megatron-LM's
    reader refuses a --num-layers the case does not have. The planner's own config module rebuilds the
    model the plan priced."""
    words = (s.base or "").split()
    base = dict(zip(words[::2], words[1::2]))
    function = base.get("--config")
    if function is None or (base.get("--module"), function) == (CONFIG_MODULE, CONFIG_FUNCTION):
        return
    built, planned = base_flavor(function), model_flavor(case.model)
    if built is not None and not base_config(case.model)[1]:
        # The planner's files name this base as a stand-in for a model torchtitan ships no config for
        # (emit.DEFAULT_MOE_BASE, DEFAULT_BASE): its flavour is the stand-in's, so the job trains the
        # stand-in's model, which the comparison below took for the case's (Mixtral on qwen3_30b_a3b).
        raise CaseError(s.src, "--config", f"{one_line(function, 60)} builds torchtitan's {built} model (its model "
                                           "spec, which no override changes), not the case's "
                                           f"{one_line(case.model.name, 60)} ({_shape(case.model)}), which no "
                                           "torchtitan config builds: the job trains another model; point --module "
                                           "and --config at a config registry function that builds the case's")
    if built is not None and built != planned:
        raise CaseError(s.src, "--config", f"{one_line(function, 60)} builds torchtitan's {built} model (its model "
                                           "spec, which no override changes), not the case's "
                                           f"{one_line(case.model.name, 60)} ({planned}): the job trains another "
                                           f"model; run the planner's {CONFIG_FILE}, which rebuilds it")
    if built is not None and case.model.mtp_layers:
        # Every flavour above is model_registry's with num_mtp_layers at its default, 0 (models/deepseek_v3/
        # __init__.py; only deepseek_v3_debugmodel_mtp builds one): the job trains without the case's MTP
        # layers, and MTPDecoder.Config's refusal of pp and cp never fires. Refused by the case's key, as
        # a 0.2 job file and Megatron-LM's reader (no --mtp-num-layers) refuse the same mismatch.
        raise CaseError(case.source, "model.mtp_layers", f"{case.model.mtp_layers}, but {one_line(function, 60)} "
                                                         f"builds torchtitan's {built} model with no multi-token "
                                                         "prediction layers (model_registry's num_mtp_layers 0): "
                                                         "set model.mtp_layers: 0 to diagnose the job it runs")
    if function in BASE_CONVERTERS and case.training.precision != "fp8":
        raise CaseError(s.src, "--config", f"{function} builds its model with {BASE_CONVERTERS[function]} (fp8 "
                                           "linears, which no override removes), but the case "
                                           f"{case.source} trains in {case.training.precision} "
                                           "(training.precision)")


def _check_own_flavor(src: str, names: dict[str, Any], case) -> None:
    """MODEL_REGISTRY and MODEL_FLAVOR, from which apply_layout rebuilds the model: where they name one
    of torchtitan's own flavours (emit's tables), it must be the case's model, as a base config's is
    (:func:`_check_base_model`); the stand-in the emitter writes for a model torchtitan ships no config
    for (Qwen3-30B-A3B for Mixtral) trains that flavour until the user points them at the model. A
    registry or flavour of the user's own is theirs to match, as before."""
    registry, flavor = names.get("MODEL_REGISTRY"), names.get("MODEL_FLAVOR")
    table = list(BASE_CONFIGS.values()) + list(MOE_BASE_CONFIGS.values())
    if not any(registry == f"torchtitan.models.{module}" and flavor == built for module, _, built in table):
        return
    (module, _), exact = base_config(case.model)
    planned = model_flavor(case.model)
    if exact and (registry, flavor) == (f"torchtitan.models.{module}", planned):
        return
    whose = (f"the case's {one_line(case.model.name, 60)} ({_shape(case.model)}), which no torchtitan flavour "
             "builds" if not exact else f"the case's {one_line(case.model.name, 60)} ({planned})")
    raise CaseError(src, "MODEL_FLAVOR", f"{one_line(flavor, 40)!r}: apply_layout rebuilds {registry}'s {flavor} "
                                         f"model, not {whose}: the job trains another model; point MODEL_REGISTRY "
                                         "and MODEL_FLAVOR at the case's")


def _check_own_model(s: _Settings, case) -> None:
    """What the planner's own config module rebuilds the model spec with (apply_layout:
    ``model_registry(MODEL_FLAVOR, converters=converters(), num_mtp_layers=MTP_LAYERS)``), checked against
    the case as the other forms check the same things: MTP_LAYERS as Megatron-LM's reader checks
    --mtp-num-layers (another count is another model), CONVERTERS as a 0.2 job file's [model] converters
    (another precision is another run). Both are plain literals the emitter writes; an edit to either
    was read as the case's model and precision."""
    if s.own_model is None or s.base_source is None:
        return
    src, model, training = s.base_source, case.model, case.training
    _check_own_flavor(src, s.own_model, case)
    mtp = s.own_model.get("MTP_LAYERS")
    if isinstance(mtp, bool) or not isinstance(mtp, int) or not 0 <= mtp <= MAX_INT:
        said = (f"not a literal ({one_line(mtp.text, 40)})" if isinstance(mtp, NotLiteral) else
                "absent" if "MTP_LAYERS" not in s.own_model else one_line(safe_repr(mtp), 40))
        raise CaseError(src, "MTP_LAYERS", f"expected an integer >= 0 and <= {MAX_INT} (written as a literal: the "
                                           f"file is read, not run), got {said}")
    if mtp != model.mtp_layers:
        builds = "no multi-token prediction layers" if mtp == 0 else f"{mtp} multi-token prediction layer(s)"
        raise CaseError(src, "MTP_LAYERS", f"{mtp}: apply_layout rebuilds the model with {builds}, but the case "
                                           f"{case.source} has {model.mtp_layers} (model.mtp_layers)")
    key = "CONVERTERS"
    entries = s.own_model.get(key)
    expected = "a list of [converter class, {Config fields}] pairs"
    if not isinstance(entries, (list, tuple)) or not all(
            isinstance(e, (list, tuple)) and len(e) == 2 and isinstance(e[0], str) and isinstance(e[1], dict)
            for e in entries):
        said = (f"not a literal ({one_line(entries.text, 40)})" if isinstance(entries, NotLiteral) else
                "absent" if key not in s.own_model else one_line(safe_repr(entries), 60))
        raise CaseError(src, key, f"expected {expected} (written as a literal: the file is read, not run), got {said}")
    unknown = [name for name, _ in entries if name not in CONVERTER_CLASSES]
    if unknown:
        raise CaseError(src, key, f"{one_line(unknown[0], 40)!r} is not read: expected one of "
                                  f"{', '.join(CONVERTER_CLASSES)} (torchtitan.components.quantization)")
    for name, fields in entries:
        other = [field for field in fields if field not in CONVERTER_FIELDS[name]]
        if other:
            takes = ", ".join(CONVERTER_FIELDS[name]) or "none"
            raise CaseError(src, key, f"{name} has no field {one_line(str(other[0]), 60)!r} in torchtitan 0.3.0 (its "
                                      f"Config takes {takes}, components/quantization): converters() raises "
                                      "TypeError at startup")
    runs = {CONVERTER_CLASSES[name][0] for name, _ in entries}
    if len(runs) > 1:
        raise CaseError(src, key, f"converts to {' and '.join(sorted(runs))} together: expected one precision")
    precision = training.precision
    wanted = precision if precision in ("fp8", "mxfp8", "nvfp4") else None
    if (next(iter(runs)) if runs else None) != wanted:
        said = ", ".join(name for name, _ in entries) if entries else "[] (no converter: 16-bit GEMMs)"
        raise CaseError(src, key, f"{one_line(said, 80)}, but the case {case.source} trains in {precision} "
                                  "(training.precision)")
    if wanted is None:
        return
    experts = [name for name, _ in entries if CONVERTER_CLASSES[name][1]]
    _check_linears_converted(src, key, [CONVERTER_CLASSES[name][1] for name, _ in entries], case)
    _check_own_filters(src, key, entries, case)
    if model.is_moe and not experts:
        # The experts' weights are most of a mixture's GEMMs: left in bf16 they run slower than priced.
        raise CaseError(src, key, f"converts the linears only, but the case {case.source} trains its experts in "
                                  f"{precision} (training.precision): expected a grouped-experts converter too "
                                  f"({'Float8' if precision == 'fp8' else 'MXFP8'}GroupedExpertsConverter)")
    if precision == "fp8":
        for name, fields in entries:
            if name == "Float8LinearConverter":
                recipe = fields.get("recipe_name", FLOAT8_RECIPE_DEFAULT)
                if recipe != training.recipe.name:
                    raise CaseError(src, key, f"Float8LinearConverter scales fp8 {one_line(safe_repr(recipe), 40)}, "
                                              f"but the case's recipe is {training.recipe.name} (training.fp8_recipe)")


def read(path: Union[str, Path], case) -> Layout:
    """The layout of a torchtitan job (overrides, a launch script or a 0.2 TOML file) on ``case``'s
    cluster, checked against the case."""
    path = Path(path)
    s = _load(path)
    model = case.model
    from planner.engines.megatron.launch import torchrun_world

    world = torchrun_world(*s.torchrun, case.cluster.gpu.gpus_per_node) if s.torchrun else None
    if world is not None and world != case.cluster.num_gpus:  # another world is another run
        nodes, per_node = s.torchrun
        raise CaseError(s.src, "--nproc-per-node", f"--nnodes {nodes or '1'} --nproc-per-node {per_node}: torchrun "
                                                   f"starts {world} ranks, but the case "
                                                   f"{case.source} has {case.cluster.num_gpus} GPUs (cluster.num_gpus)")
    if model.mtp_layers and not s.cli:  # as Megatron-LM's reader refuses --mtp-num-layers absent
        raise CaseError(case.source, "model.mtp_layers", f"{model.mtp_layers}, but {path.name} is a torchtitan 0.2 job "
                                                         "file, and torchtitan 0.2 builds no multi-token prediction "
                                                         "layers: set model.mtp_layers: 0 to diagnose the job it runs")
    _check_base_model(s, case)
    _check_own_model(s, case)
    d = _degrees(s, case.cluster.num_gpus)
    zero = _zero_stage(s, d)
    _cp_balanced(s, d.cp)
    _cp_rotate_method(s, d.cp)
    if s.cli and s.switch("debug.batch_invariant", False):
        raise CaseError(s.src, "debug.batch_invariant", "true (given or set by the base config): torchtitan refuses "
                                                        "the config (Trainer.Config.__post_init__, trainer.py: "
                                                        "batch-invariant mode is not supported in pre-training)")
    _optimizer_implementation(s)
    _check_training(s, case, d)
    pipeline = _pipeline(s, d.pp, model.num_layers)
    micro = _batch(s, case, d.dp, d.pp)
    offload = s.switch("training.enable_cpu_offload", False)
    sequence_parallel = d.tp > 1 and s.switch("parallelism.enable_sequence_parallel", True)
    try:
        layout = Layout(dp=d.dp, tp=d.tp, pp=d.pp, cp=d.cp, vpp=pipeline.vpp, micro_batch_size=micro,
                        zero_stage=zero, sequence_parallel=sequence_parallel, recompute=_recompute(s),
                        stage_layers=None if pipeline.chunk_layers is not None else pipeline.stage_layers,
                        chunk_layers=pipeline.chunk_layers, offload_optimizer=1.0 if offload else 0.0,
                        offload_params=offload, **_experts(s, model, d))
    except SpecError as error:
        raise CaseError(s.src, KEY_OF_FIELD.get(error.field, error.field), case_message(error.message)) from None
    if layout.stage_layers is not None and _default_split(case, layout):
        layout = replace(layout, stage_layers=None, chunk_layers=None)
    return layout


def _fqns_key(name: str) -> str:
    """The field of a linear converter's Config that names the linears it converts (filter_fqns: those it
    leaves; fqns: those it takes)."""
    return "filter_fqns" if name == "Float8LinearConverter" else "fqns"


def _linear_converted(name: str, fields: dict, fqn: str, features: tuple[int, int]) -> Optional[bool]:
    """Whether a linear converter of CONVERTERS converts the linear ``fqn`` of ``features`` (in, out), as
    torchtitan 0.3.0 decides: Float8LinearConverter by module_filter_fn (components/quantization/utils.py: both
    dimensions divisible by 16, no filter_fqns entry a substring of the FQN); MXFP8LinearConverter and
    NVFP4LinearConverter by their fqns (mx.py, nvfp4.py convert: all where empty, else those an entry is a
    substring of). None where it cannot say: torchao's auto filter (``auto_filter_small_kn``) or fields not
    lists of strings (refused or said elsewhere)."""
    words = fields.get(_fqns_key(name), [])
    if not isinstance(words, (list, tuple)) or not all(isinstance(w, str) for w in words):
        return None
    if name == "Float8LinearConverter":
        if AUTO_FILTER in words:
            return None
        return all(f % 16 == 0 for f in features) and not any(word in fqn for word in words)
    if name in ("MXFP8LinearConverter", "NVFP4LinearConverter"):
        return not words or any(word in fqn for word in words)
    return False


def _check_own_filters(src: str, key: str, entries, case) -> None:
    """The linear converters' filters of the planner's CONVERTERS, as torchtitan 0.3.0 applies them to each
    Linear.Config of the model (:func:`_linear_converted`; a decoder linear left in bf16 is refused,
    :func:`_bf16_linear_refusal`). ``auto_filter_small_kn`` is refused whole: Float8LinearConverter hands
    torchao's _auto_filter_for_recipe each Linear.Config (components/quantization/float8.py,
    ``convert``: ``self.filter_fn(linear_config, fqn)`` over ``model_config.traverse(Linear.Config)``), which
    its ``if not isinstance(mod, nn.Linear): return False`` turns down, so no linear converts at all (with
    rowwise_with_gw_hp it raises NotImplementedError at startup)."""
    linears = [(name, fields) for name, fields in entries if not CONVERTER_CLASSES[name][1]]
    for name, fields in linears:
        words = fields.get(_fqns_key(name), [])
        if name == "Float8LinearConverter" and isinstance(words, (list, tuple)) and AUTO_FILTER in words:
            raise CaseError(src, key, f"Float8LinearConverter filter_fqns {one_line(safe_repr(words), 80)}: "
                                      f"torchtitan 0.3.0 hands torchao's _auto_filter_for_recipe each Linear.Config "
                                      "(float8.py convert), which it turns down as no nn.Linear, so no linear "
                                      f"converts and the model trains in bf16, priced in {case.training.precision}")

    def converts(fqn, fan_in, fan_out):
        return any(_linear_converted(name, fields, fqn, (fan_in, fan_out)) for name, fields in linears)

    why = _bf16_linear_refusal(case, "0.3", converts)
    if why:
        said = "; ".join(f"{name} {_fqns_key(name)} {fields.get(_fqns_key(name), [])!r}" for name, fields in linears)
        raise CaseError(src, key, f"{one_line(said, 120)} {why}")


def _converted_beyond_scope(model, release: str, converters) -> list[str]:
    """A note for each linear the estimate prices in bf16 (BF16_PRICED_LINEARS) that a converter the job runs
    converts all the same: the cost model keeps the LM head and the router in high precision
    (kernels.high_precision_precision), so a job that converts them runs them in low precision, priced bf16.
    ``converters``: (what the note quotes of it, the precision it converts to, the rule it converts by,
    ``converts(fqn, in, out)``) for each, by the FQNs of ``release`` ("0.2": TOML_FQNS, or "0.3")."""
    notes = []
    for said, to, rule, converts in converters:
        for fqn, (what, features) in BF16_PRICED_LINEARS.items():
            if "router" in fqn and not model.is_moe:
                continue
            fqn = TOML_FQNS.get(fqn, fqn) if release == "0.2" else fqn
            if converts(fqn, *features(model)):
                where = fqn.replace("layers.0.", "layers.N.")
                notes.append(f"{said} converts the {what} ({where}) to {to} too (torchtitan's {rule}): priced in "
                             f"bf16, as the cost model keeps it, so the run's {what} GEMMs step faster than estimated")
    return notes


def _own_converters(entries: Any) -> list:
    """The planner's config module's CONVERTERS as :func:`_converted_beyond_scope` takes them, each converter
    by torchtitan 0.3.0's rule (:func:`_linear_converted`)."""
    if not isinstance(entries, (list, tuple)):
        return []
    out = []
    for entry in entries:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[1], dict)):
            continue
        name, fields = entry
        key = _fqns_key(name)
        rule = "module_filter_fn" if key == "filter_fqns" else "fqns substring match"
        out.append((f"CONVERTERS: {name} {key} {fields.get(key, [])!r}", CONVERTER_CLASSES.get(name, ("",))[0], rule,
                    lambda fqn, fan_in, fan_out, name=name, fields=fields:
                    _linear_converted(name, fields, fqn, (fan_in, fan_out))))
    return out


def _toml_converters(s: _Settings) -> list:
    """A 0.1 or 0.2 job file's linear converters as :func:`_converted_beyond_scope` takes them, each by its
    module_filter_fn (:func:`_toml_linear_converters`), torchao's size heuristic with ``auto_filter_small_kn``."""
    return [(f"{key} {filters!r}", CONVERTER_PRECISIONS[name],
             "module_filter_fn with torchao's _auto_filter_for_rowwise" if auto else "module_filter_fn", converts)
            for name, key, filters, auto, converts in _toml_linear_converters(s, s.names("model.converters", []))]


def _optimizer_implementation(s: _Settings) -> str:
    """``optimizer.implementation`` as the job sets it, one rule for both forms: on 0.3.0's command line or
    its base config, a word outside OptimizersContainer.Config's Literal is refused, as tyro refuses it at
    parse (or the base config's ``assert config.implementation in [...]``, _build_impl_kwargs, when it builds
    the optimizers); in a 0.1 or 0.2 job file's [optimizer] table (or its launch's --optimizer.implementation),
    one outside 0.2's Optimizer.implementation Literal, which build_optimizers asserts
    (components/optimizer.py at v0.2.2): fused_opt_states_bf16 among them, which 0.2 does not have."""
    value = s.string(OPTIMIZER_IMPLEMENTATION, OPTIMIZER_IMPLEMENTATION_DEFAULT)
    choices, where = (OPTIMIZER_IMPLEMENTATIONS, "OptimizersContainer.Config, components/optimizer/optimizer.py") \
        if s.cli else (TOML_OPTIMIZER_IMPLEMENTATIONS, "torchtitan 0.2's Optimizer.implementation, "
                                                       "config/job_config.py; build_optimizers asserts it")
    if value not in choices:
        raise CaseError(s.src, OPTIMIZER_IMPLEMENTATION, f"expected one of {', '.join(choices)} ({where}), got "
                                                         f"{one_line(value, 40)!r}: torchtitan refuses it")
    return value


# --- the training settings, and what the reading could not see ----------------------------------

def read_training(path: Union[str, Path], case) -> dict:
    """The training settings the job runs, in TrainingSpec's fields, with torchtitan's defaults
    (config/configs.py ``CompileConfig``: compile off, components ["model", "loss"]; the base config's
    ChunkedLossWrapper):

    - ``compiled_loss``: the loss compiled (``compile.enable`` with "loss" in ``compile.components``);
    - ``tp_comm_overlap`` (with tensor parallelism only): async TP,
      ``compile.enable_async_tensor_parallel`` (``parallelism.`` in torchtitan 0.2), which needs the
      model compiled (CompileConfig refuses it otherwise);
    - ``loss_chunks``: ``loss.num_chunks`` where the command line sets it; 1 for a 0.1 or 0.2 job file;
    - ``chunked_loss`` (where ``loss_chunks`` is 1): whether that 1 is ChunkedLossWrapper's
      (``--loss.num_chunks 1``), which runs its one chunk as it runs eight (``activations.chunked_loss``),
      or a loss on whole logits (a job file, a base config's CrossEntropyLoss);
    - ``optimizer_moments``: bf16 where ``optimizer.implementation`` is "fused_opt_states_bf16" (on the
      command line or in its base config), fp32 otherwise;
    - ``cp_exchange`` (a 0.1 or 0.2 job file with context parallelism): torch's ring attention under
      ``parallelism.context_parallel_rotate_method`` ("allgather" by default), which its SDPA runs."""
    path = Path(path)
    s = _load(path)
    enabled = s.switch("compile.enable", False) or (not s.cli and s.switch("training.compile", False))
    components = s.names("compile.components", ["model", "loss"])
    async_key = "compile.enable_async_tensor_parallel"
    if not s.cli and "parallelism.enable_async_tensor_parallel" in s.values:
        async_key = "parallelism.enable_async_tensor_parallel"
    async_tp = s.switch(async_key, False)
    if async_tp and not (enabled and "model" in components):
        raise CaseError(s.src, async_key, "needs the model compiled (compile.enable, with \"model\" in "
                                          "compile.components): torchtitan refuses async TP otherwise")
    settings: dict = {"compiled_loss": enabled and "loss" in components}
    implementation = _optimizer_implementation(s)
    settings["optimizer_moments"] = "bf16" if implementation == BF16_MOMENTS_IMPLEMENTATION else "fp32"
    if s.integer("parallelism.tensor_parallel_degree", 1) > 1:
        settings["tp_comm_overlap"] = async_tp
    if not s.cli:
        # A job file is torchtitan 0.1's or 0.2's, whose loss ran on whole logits (components/loss.py at
        # v0.2.2 has no ChunkedLossWrapper).
        settings.update(loss_chunks=1, chunked_loss=False)
        if s.integer("parallelism.context_parallel_degree", 1) > 1:
            # 0.2 runs its attention through SDPA, whose context parallelism is torch's ring attention
            # under the rotate method the file names (train.py: set_rotate_method).
            settings["cp_exchange"] = _cp_rotate_method(s, 2)
    elif (chunks := s.integer("loss.num_chunks", None)) is not None:
        settings["loss_chunks"] = chunks
        if chunks == 1:
            # torchtitan 0.3.0's ChunkedLossWrapper with num_chunks 1 (components/loss.py) is still the
            # wrapper, whose one chunk keeps no logits past the loss; a base config's other loss is not.
            settings["chunked_loss"] = not s.switch(WHOLE_LOGITS, False)
    return settings


def _left_open(training, key: str, value: bool) -> bool:
    """Whether the case leaves ``key`` to the engine and the job's ``value`` is not the engine's own
    default (``EngineBehaviour.compiled_loss``, ``loss_chunks``; no TP overlap): a setting the planner
    then plans with."""
    said = getattr(training, key)
    if key == "tp_comm_overlap":  # a bool whose false is the default: the job's async TP stands
        return said is False and value is True
    if key == "chunked_loss":  # read only as true (one chunk in the wrapper), which no engine defaults to
        return said is None and value is True
    if key == "optimizer_moments":  # fp32 is the default, as tp_comm_overlap's false: the job's bf16 stands
        return said == "fp32" and value == "bf16"
    return said is None and value != getattr(training.engine, key)  # the engine's field of the same name


def with_training(case, path: Union[str, Path], settings: dict):
    """``case`` trained as the job at ``path`` runs (``settings``, :func:`read_training`): what the case
    leaves to the engine takes the job's setting where it is not the engine's default; a case that says
    otherwise is refused, naming the key."""
    requested = case.training
    changes = {}
    for key, value in settings.items():
        said = getattr(requested, key)
        if _left_open(requested, key, value):
            changes[key] = value
        elif said is not None and said != value:
            runs = {"compiled_loss": "compiles the loss" if value else "runs the loss eagerly",
                    "tp_comm_overlap": "runs async TP" if value else "runs TP without async TP",
                    "loss_chunks": f"runs its LM head and loss in {value} sequence chunk(s)",
                    "chunked_loss": "runs its LM head and loss in ChunkedLossWrapper (one chunk)" if value
                    else "runs its loss on whole logits",
                    "optimizer_moments": "keeps Adam's moments in bf16 (fused_opt_states_bf16)" if value == "bf16"
                    else "keeps Adam's moments in fp32 (an implementation other than fused_opt_states_bf16)",
                    "cp_exchange": f"runs torch's ring attention rotating K and V by {value}"}[key]
            raise CaseError(str(path), SETTING_KEYS[key], f"the job {runs}, but the case {case.source} says "
                                                          f"training.{key}: {str(said).lower()}")
    return replace(case, training=replace(requested, **changes)) if changes else case


def taken_from_job(case, settings: dict, path: Union[str, Path]) -> Optional[str]:
    """The settings, as one line, the job decided where the case leaves them to the engine and the
    engine's default would have run otherwise: the planner's best is planned with them too."""
    def where(key: str) -> str:
        if key == "loss_chunks" and not _load(Path(path)).cli:
            return "a torchtitan 0.1 or 0.2 job file: no chunked loss"
        return SETTING_KEYS[key]

    taken = [f"training.{key} {str(value).lower()} ({where(key)})" for key, value in settings.items()
             if _left_open(case.training, key, value)]
    return "; ".join(taken) or None


def forced_routing(path: Union[str, Path]) -> Optional[str]:
    """How the job at ``path`` forces its routing balanced, as `diagnose`'s note says it; None where it
    leaves the router its own. ``debug.moe_force_load_balance`` (0.2.0's
    ``training.debug_moe_force_load_balance``), "for debugging usage only" (config/configs.py):
    ``TokenChoiceTopKRouter._debug_force_load_balance_routing`` (models/common/moe.py) gives the
    micro-batch's token-slots the experts round-robin, ``arange(B·L·K) % E``, whatever the scores: every
    expert the same tokens to within one, as ``model.moe_load_imbalance`` 1 prices."""
    s = _load(Path(path))
    key = next((k for k in FORCED_ROUTING_KEYS if s.switch(k, False)), None)
    if key is None:
        return None
    return f"{key}: torchtitan gives the experts the tokens round-robin, models/common/moe.py, every expert alike"


def reading_notes(path: Union[str, Path], case, job: Job) -> list[str]:
    """What the estimate of the job's layout does not see as the job runs it, one line each: a base
    config whose own settings were not read, the model run eagerly (priced compiled), parameters kept
    gathered between micro-batches (priced resharded), several pipeline flushes a step (priced as one),
    and the converters a command line cannot carry."""
    path = Path(path)
    s = _load(path)
    lay = job.layout
    notes = list(s.script_notes)
    if s.base and s.base_source:
        notes.append(f"{path.name} applies to the base config {s.base}: read with the settings it sets "
                     f"({s.base_source}), the overrides over them")
    elif s.base:
        notes.append(f"{path.name} applies to the base config {s.base}, which is not loaded (torchtitan is not "
                     "installed here, or the function is not one Trainer.Config(...) of literal fields): what the "
                     "overrides leave out is read as torchtitan's defaults (config/configs.py), where the base "
                     "config may set others")
    backend = s.values.get("model_spec.moe_comm_backend")
    if backend and job.model.is_moe:
        notes.append(f"the base config {s.base} builds its experts' dispatch as {' '.join(backend)} "
                     "(model_registry's moe_comm_backend): priced as the all-to-all, which the planner's files run")
    compiled = s.switch("compile.enable", False) or (not s.cli and s.switch("training.compile", False))
    if not compiled or "model" not in s.names("compile.components", ["model", "loss"]):
        why = "compile.enable, torchtitan's default off" if not compiled else \
            "compile.components leaves out \"model\""
        notes.append(f"{path.name} does not compile the model ({why}): priced "
                     "compiled (fused element-wise kernels), as the planner's files run it, so the run may step "
                     "slower and hold more memory")
    reshard = s.string("parallelism.fsdp_reshard_after_forward", "default")
    if lay.zero_stage == 3 and lay.dp * lay.cp > 1 and (reshard == "never" or reshard == "default" and lay.pp > 1):
        notes.append(f"parallelism.fsdp_reshard_after_forward {reshard}: FSDP keeps the parameters gathered "
                     "between micro-batches; priced resharded after each forward (\"always\"), so the run holds more "
                     "memory and gathers less")
    if lay.cp > 1 and not _cp_balanced(s, lay.cp):
        # torch's _context_parallel_shard turns load balancing off without a balancer, and its ring attention
        # then skips the key blocks wholly in the future (_is_causal_behavior's SKIP): CP rank r runs r full
        # blocks and one causal half, the last rank cp − ½ against the mean's cp/2.
        ratio = (2 * lay.cp - 1) / lay.cp
        notes.append(f"{CP_BALANCER_KEY} None: torchtitan shards the sequence in order (context_parallel/api.py "
                     f"cp_shard), so under the causal mask the last of the {lay.cp} CP ranks attends "
                     f"{ratio:.2f}× the mean rank's query-key pairs; priced balanced (headtail), so each layer's "
                     "attention waits on that rank and the run steps slower")
    for key, what in SLOWER_DEBUG.items():
        if s.cli and s.switch(key, False):
            notes.append(f"{key} on: torchtitan runs {what}; priced with the default kernels, so the run steps "
                         "slower")
    implementation = _optimizer_implementation(s)
    if implementation in UNPRICED_IMPLEMENTATIONS:
        notes.append(f"{OPTIMIZER_IMPLEMENTATION} {implementation}: torchtitan "
                     f"{UNPRICED_IMPLEMENTATIONS[implementation]}")
    if lay.pp > 1:
        local = s.integer("training.local_batch_size", 8)
        flushes = case.training.global_batch_size // (local * lay.dp)
        if flushes > 1:
            notes.append(f"torchtitan runs {flushes} pipeline flushes of {local // lay.micro_batch_size} "
                         f"micro-batches a step (global_batch_size / (local_batch_size × dp)); priced as one flush "
                         f"of {job.grad_accum}, so the run idles in more pipeline bubbles")
    if s.cli and job.model.mtp_layers and s.base != f"--module {CONFIG_MODULE} --config {CONFIG_FUNCTION}":
        # torchtitan 0.3.0 builds them where the model config asks: its DeepSeek-V3 flavors build none
        # (num_mtp_layers 0) but deepseek_v3_debugmodel_mtp; the planner's own config module sets MTP_LAYERS.
        notes.append(f"the case's model has {job.model.mtp_layers} multi-token prediction layer(s), priced; torchtitan "
                     f"builds them only where the base config's model asks (its DeepSeek-V3 flavors build none), so "
                     f"the job may run without them (set model.mtp_layers: 0 to price it so)")
    entries = (s.own_model or {}).get("CONVERTERS")
    if isinstance(entries, (list, tuple)) and any(isinstance(e, (list, tuple)) and len(e) == 2 and isinstance(e[1], dict)
                                                  and e[0] == "Float8LinearConverter" and e[1].get("emulate") is True
                                                  for e in entries):
        # Float8LinearConverter.Config.emulate (components/quantization/float8.py): torchao's emulated float8,
        # "for test purpose only", its GEMMs not the hardware's fp8 ones the estimate prices.
        notes.append("CONVERTERS: Float8LinearConverter emulate True runs float8 emulated (torchao's "
                     "Float8LinearConfig(emulate=True), \"for test purpose only\"), not on fp8 tensor cores: priced "
                     f"in the case's {job.training.precision}, so the run steps slower")
    notes += _converted_beyond_scope(job.model, "0.3", _own_converters(entries)) if s.cli else \
        _converted_beyond_scope(job.model, "0.2", _toml_converters(s))
    if s.cli and job.training.recipe is not None and s.own_model is None:
        # The planner's own config module carries them (CONVERTERS), read and checked by _check_own_model.
        notes.append(f"{path.name}: torchtitan's quantization converters are no command-line option (the model "
                     f"spec is not): priced in the case's {job.training.precision}")
    return notes
