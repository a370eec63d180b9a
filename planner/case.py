"""Case files: the one input of the CLI and the Python API.

A case is YAML (read by :mod:`planner.inputs`: safe, bounded) or an equivalent dict with the sections
``model``, ``cluster``, ``training``, ``layout`` (optional: the planner chooses
it when absent) and ``overheads`` (optional). docs/case-reference.md
documents every key. Every problem becomes a :class:`CaseError` naming the file,
the key and what was expected.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from cost_models.behaviour import LOSSES
from cost_models.specs import (ACTIVATIONS, ATTENTION_TYPES, EXPERT_DISPATCHES, NORMALIZATIONS, OPTIMIZER_MOMENTS,
                               OPTIMIZERS,
                               POSITION_EMBEDDINGS, PRECISIONS, RECOMPUTE, ROUTERS, ClusterSpec, Job, Layout, ModelSpec,
                               Overheads, Performance, TrainingSpec)
from cost_models.memory import outside_allocator, usable_bytes
from cost_models.quantization import FP8_RECIPES

from .case_cluster import _cluster, cluster_profile, gpu_of_profile, profile_process_bytes
from .case_errors import case_message, spec_errors
from .engines import ENGINES
from .errors import CaseError, as_typed, one_line
from .fitted import check_fitted_figures_kept, read_fitted
from .fields import (canonical_choice, describe, read_bool, read_choice, read_figure, read_file_path, read_for,
                     read_int, read_mapping, read_number, read_recompute_layers, read_str, read_unit, required)
from .hf_config import read_hf_config
from .inputs import load_yaml, read_text
from .limits import (MAX_BATCH_TOKENS, MAX_CASE_YAML_NODES, MAX_EXPERTS, MAX_GLOBAL_BATCH, MAX_LAYERS,
                     MAX_MODEL_WIDTH, MAX_ROPE_BASE, MAX_SEQ_LEN, MAX_STRING_CHARS, MAX_VOCAB)
from .presets import closest, model_presets
from .search_options import SearchSpec, read_module_names, read_search, training_for_target
from .units import parse_memory

# case_message and spec_errors are the case layer's too (planner.case_errors).
__all__ = ["CASE_ENGINES", "Case", "LAYOUT_KEYS", "MODEL_KEYS", "OVERHEAD_KEYS", "SECTIONS", "TRAINING_KEYS",
           "build_case", "case_message", "layout_from_mapping", "layout_to_mapping", "load_case", "profile_warnings",
           "read_case", "read_sections", "spec_errors", "warnings_of_profile", "with_engine"]

SECTIONS = ("model", "cluster", "training", "layout", "overheads", "search")

# Engines a case can name (``planner/engines/``).
CASE_ENGINES = tuple(ENGINES)

# The training keys that name one of a few values (read in any letter case: "BF16", "AdamW").
TRAINING_CHOICES = {"precision": PRECISIONS, "optimizer": OPTIMIZERS, "engine": CASE_ENGINES,
                    "fp8_recipe": FP8_RECIPES, "expert_dispatch": EXPERT_DISPATCHES, "loss": LOSSES,
                    "optimizer_moments": OPTIMIZER_MOMENTS}

# The model keys that name one of a few values, read as the training's are.
MODEL_CHOICES = {"activation": ACTIVATIONS, "attention_type": ATTENTION_TYPES, "moe_router": ROUTERS,
                 "normalization": NORMALIZATIONS, "position_embedding": POSITION_EMBEDDINGS}

MODEL_KEYS = ("name", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
              "ffn_hidden_size", "activation", "vocab_size", "tied_embeddings", "dropout", "head_dim",
              "attention_type", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_rope_head_dim", "v_head_dim",
              "num_experts", "moe_top_k", "moe_ffn_hidden_size", "moe_shared_expert_ffn_hidden_size",
              "moe_first_dense_layers", "moe_layer_freq", "moe_router", "moe_router_num_groups",
              "moe_router_group_topk", "moe_router_topk_scaling", "moe_capacity_factor", "moe_load_imbalance",
              "mtp_layers",
              "sliding_window", "sliding_window_full_every",
              "normalization", "position_embedding", "rope_base", "rotary_percent", "linear_bias", "qk_norm",
              "nope_every",
              "qk_l2_norm", "qkv_bias", "attention_chunk_size")

# A mixture of experts' keys: num_experts: 0 over an MoE preset or hf_config drops those it set.
EXPERT_KEYS = tuple(k for k in MODEL_KEYS if k.startswith("moe_"))

# Integer model fields that may be 0 (none) or null: a model without query compression, shared
# experts, leading dense layers, multi-token prediction or a sliding window.
# The most each model count may be (planner/limits.py); a width not named here, MAX_MODEL_WIDTH.
MODEL_BOUNDS = {"num_layers": MAX_LAYERS, "vocab_size": MAX_VOCAB, "num_experts": MAX_EXPERTS,
                "moe_first_dense_layers": MAX_LAYERS, "mtp_layers": MAX_LAYERS, "moe_layer_freq": MAX_LAYERS,
                "sliding_window": MAX_SEQ_LEN, "sliding_window_full_every": MAX_LAYERS, "nope_every": MAX_LAYERS,
                "attention_chunk_size": MAX_SEQ_LEN}
OPTIONAL_COUNT_KEYS = ("q_lora_rank", "num_experts", "moe_shared_expert_ffn_hidden_size", "moe_first_dense_layers",
                       "mtp_layers", "sliding_window", "sliding_window_full_every", "nope_every",
                       "attention_chunk_size")

TRAINING_KEYS = ("global_batch_size", "seq_len", "precision", "optimizer", "flash_attention", "engine",
                 "tp_comm_overlap", "fp32_grads", "moe_comm_overlap", "fp8_recipe", "fp8_param_gather",
                 "expert_dispatch", "master_weights", "compiled_loss", "fused_attention", "loss_chunks",
                 "chunked_loss", "loss", "optimizer_moments", "master_remainders")


LAYOUT_KEYS = ("dp", "tp", "pp", "cp", "vpp", "micro_batch_size", "zero_stage", "sequence_parallel",
               "recompute", "recompute_num_layers", "recompute_modules", "stage_layers", "chunk_layers",
               "account_for_embedding_in_pipeline_split",
               "account_for_loss_in_pipeline_split", "offload_optimizer", "offload_params", "offload_activations",
               "ep", "etp")

OVERHEAD_KEYS = ("cuda_context", "cpu_process", "comm_buffers", "fragmentation")


@dataclass(frozen=True)
class Case:
    """A loaded case: specs plus where they came from (for error messages)."""

    source: str
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layout: Optional[Layout]
    overheads: Overheads = field(default_factory=Overheads)
    search: SearchSpec = field(default_factory=SearchSpec)
    # A profile fitted to a team's runs (`calibrate --from-runs`): its ``fitted`` section (each
    # figure's prior and value, the runs' coverage), so that an estimate outside it says so.
    fitted: Optional[dict] = None

    def job(self, layout: Optional[Layout] = None) -> Job:
        """The job for ``layout`` (default: the case's own), checked against model, cluster and batch."""
        layout = layout or self.layout
        if layout is None:
            raise CaseError(self.source, "layout", "missing; `estimate` and `validate` score a given layout "
                                                   "(`plan` chooses one)")
        with spec_errors(self.source):
            return Job(self.model, self.cluster, self.training, layout, self.overheads)


def entry_of(cluster: Any) -> Any:
    """A cluster section's first GPU type (``size``'s ``options``), else the one cluster."""
    return cluster["options"][0] if isinstance(cluster, dict) and "options" in cluster else cluster


def load_case(case: Any, engine: Optional[str] = None, ignore_layout: bool = False) -> Case:
    """Load a case from a path or a dict in the case-file schema.

    ``engine`` (`plan --engine`) replaces training.engine, and search.target where the
    case has one, so the two never contradict each other. ``ignore_layout``: the commands that
    choose the layout (`plan`, `size`) say they ignore a ``layout`` section, so it is not read."""
    data, src, base = read_case(case)
    if ignore_layout and isinstance(data, dict):
        data = {key: value for key, value in data.items() if key != "layout"}
    if engine is not None:
        data = with_engine(src, data, engine)
    return build_case(data, src, base)


def read_case(case: Any) -> tuple[Any, str, Path]:
    """The parsed data of a case path or dict, its name for errors, and the folder relative paths start from;
    top-level ``x-`` keys left out (:func:`without_extensions`)."""
    if isinstance(case, dict):
        # relative paths from the working directory, not asked for (it may be gone)
        return without_extensions(case), "<case>", Path(".")
    if isinstance(case, (str, os.PathLike)):
        if not os.fspath(case).strip():  # Path("") is the working directory: "'.' is a directory"
            raise CaseError("<case>", "", "expected a case file's path, got an empty one")
        if isinstance(case, str) and _looks_like_text(case):
            # What was given, cut: a path with a ": " in it that names no file reads as text too, and a
            # refusal that did not show it left its author looking for YAML they never wrote.
            raise CaseError("<case>", "", f"expected a case file's path or a dict in the case-file schema, got "
                                          f"{one_line(as_typed(case), 200)}, which names no file (a case's YAML or "
                                          "JSON text? parse it first: yaml.safe_load(text))")
        # ~ is the user's home, as the shell makes it of a path typed unquoted: planner.plan("~/case.yaml")
        # and `layout-planner plan '~/case.yaml'` read the file the user meant
        path = Path(os.path.expanduser(case))
        return without_extensions(_parsed(path)), str(path), path.parent
    raise CaseError("<case>", "", f"expected a case-file path or a mapping, got {type(case).__name__}")


def _looks_like_text(case: str) -> bool:
    """Whether a string handed to the API as a case is a case's YAML or JSON text rather than a path: it
    names no file, and holds a line break, opens a mapping or a list, or holds a key's ": ". Such a string
    was taken for a path and refused as "<the whole text>: file not found" (past 255 bytes, "File name too
    long"), naming nothing the API takes."""
    if _too_long_for_a_name(case):  # no file system holds it: text, whatever it holds
        return True
    if not ("\n" in case or case.lstrip()[:1] in ("{", "[") or ": " in case):
        return False
    try:
        return not os.path.lexists(case)
    except (OSError, ValueError):  # a NUL byte: the path's own refusal says so
        return False


# The longest name of one file or folder: NAME_MAX of Linux's and macOS's file systems, and NTFS's limit
NAME_MAX_BYTES = 255


def _too_long_for_a_name(case: str) -> bool:
    """Whether a string cannot be a path at all: one of its parts is over a file name's 255 bytes. It was
    refused as "cannot be read (File name too long)", naming nothing of what the API takes."""
    return any(len(os.fsencode(part)) > NAME_MAX_BYTES for part in Path(case).parts)


# Top-level keys a case may hold and the planner ignores, as docker-compose ignores its "x-" keys: where
# YAML anchors live (x-defaults: &d {...}, merged with <<: *d). A `defaults:` key was "unknown key", and
# no section could hold a mapping that is only there to be merged elsewhere.
EXTENSION_PREFIX = "x-"


def read_sections(src: str, data: Any) -> dict:
    """A case's top-level mapping of SECTIONS; an unknown key is refused saying where anchors may live."""
    data = data if data is not None else {}
    if isinstance(data, dict):
        for k in data:
            if k not in SECTIONS:
                raise CaseError(src, str(k), f"unknown key{closest(k, SECTIONS)}; expected one of {', '.join(SECTIONS)}, "
                                             f"or a key starting with {EXTENSION_PREFIX}, which the planner ignores (a "
                                             f"place for YAML anchors: {EXTENSION_PREFIX}defaults: &d {{...}})")
    return read_mapping(src, "", data, SECTIONS)


def without_extensions(data: Any) -> Any:
    """``data`` without its top-level ``x-`` keys (a case's anchors), where it is a mapping."""
    if isinstance(data, dict) and any(isinstance(k, str) and k.startswith(EXTENSION_PREFIX) for k in data):
        return {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith(EXTENSION_PREFIX))}
    return data


# The last case files parsed, by their contents: `plan` reads its case up to four times (the layout
# section it ignores, the sizing keys it does not read, the case), and a parse of a case at its
# bound of nodes (limits.MAX_CASE_YAML_NODES) takes a quarter of a second. The text is read each
# time (a file rewritten between calls is read as it is now);
# each caller gets its own copy of what it parses to.
_PARSED: dict[tuple[str, str], Any] = {}


def _parsed(path: Path) -> Any:
    text, source = read_text(path, "YAML"), os.fsdecode(path)
    key = (source, text)
    if key not in _PARSED:
        data = load_yaml(text, source, MAX_CASE_YAML_NODES)
        if len(_PARSED) >= 4:
            _PARSED.clear()
        _PARSED[key] = data
    return copy.deepcopy(_PARSED[key])


def with_engine(src: str, data: Any, engine: Any) -> Any:
    """``data`` with training.engine (and search.target, if given) set to ``engine``."""
    if not isinstance(engine, str) or engine not in CASE_ENGINES:
        raise CaseError("--engine", "", f"expected one of {', '.join(CASE_ENGINES)}, got {engine!r}")
    if not isinstance(data, dict) or not isinstance(data.get("training"), dict):
        return data  # build_case reports what is wrong with it
    data = {**data, "training": {**data["training"], "engine": engine}}
    if isinstance(data.get("search"), dict) and "target" in data["search"]:
        data["search"] = {**data["search"], "target": engine}
    return data


# --- small readers that name the key on failure -------------------------------------------

# --- sections ----------------------------------------------------------------------------


def build_case(data: Any, src: str, base: Path, cluster: Optional[ClusterSpec] = None,
               cluster_key: str = "cluster") -> Case:
    """A case from already-parsed data; ``src`` names it in errors, ``base`` anchors relative paths.

    ``cluster`` replaces what the cluster section says (`size` reads that section itself)."""
    data = read_sections(src, data)
    for section in ("model", "cluster", "training"):
        if section not in data:
            raise CaseError(src, section, "missing section")
    model = _model(src, data["model"], base)
    # `size` passes one unit of a GPU type, not the cluster it sizes: no pin is held to its count.
    sized = cluster is not None
    cluster = cluster or _cluster(src, data["cluster"], base)
    training = _training(src, data["training"])
    if not model.is_moe:  # the experts' settings, on a model with none, would go unread
        for key in ("expert_dispatch", "moe_comm_overlap"):
            if getattr(training, key) not in (None, False):
                raise CaseError(src, f"training.{key}", "applies only to a mixture of experts (model.num_experts)")
    if model.attention_chunk_size and training.seq_len > model.attention_chunk_size:
        raise CaseError(src, "training.seq_len", f"{training.seq_len} is longer than the model's attention chunk of "
                                                 f"{model.attention_chunk_size} tokens (model.attention_chunk_size: "
                                                 "Llama 4's chunked local attention), which no engine the planner "
                                                 "writes for builds: they would train full attention; expected at "
                                                 f"most {model.attention_chunk_size}")
    if training.expert_dispatch == "deepep" and cluster.gpu.deepep_refusal:  # every layout would refuse it
        raise CaseError(src, "training.expert_dispatch", f"{cluster.gpu.deepep_refusal}: dispatch all_to_all")
    # The engine searched for is the engine trained with: estimate and plan time it alike.
    training = training_for_target(src, data.get("search"), training)
    profile = cluster_profile(src, data["cluster"], base)
    overheads = _overheads(src, data.get("overheads", {}), profile_overheads(*profile) if profile else Overheads())
    layout = layout_from_mapping(src, data["layout"], cluster.num_gpus) if data.get("layout") is not None else None
    search = read_search(src, data.get("search"), training, model,
                         None if sized else cluster.num_gpus)  # a bad search key fails `estimate` as `plan`
    fitted = read_fitted(profile[0], profile[1].get("fitted")) if profile else None
    check_fitted_figures_kept(src, cluster_key, entry_of(data["cluster"]), fitted)
    entry = entry_of(data["cluster"])
    check_usable_memory(src, cluster, overheads, search, outside_key(cluster.gpu) in (data.get("overheads") or {}),
                        cluster_key, entry)
    case = Case(src, model, cluster, training, layout, overheads, search, fitted)
    if layout is not None:
        case.job()  # cross-checks now, so a bad layout is reported at load time
    return case


def outside_key(gpu) -> str:
    """The overheads key of what lives outside the allocator on ``gpu`` (``memory.outside_allocator``)."""
    return "cpu_process" if gpu.on_cpu else "cuda_context"


def check_usable_memory(src: str, cluster, overheads: Overheads, search: SearchSpec, context_stated: bool,
                        cluster_key: str = "cluster", section: Any = None) -> None:
    """What the caching allocator may use (``memory.usable_bytes``) is some memory: a CUDA context
    as large as the GPU left a negative usable memory, printed as "fits up to -23.1 GB". Named
    where the case gives the GPU (``cluster_key``: cluster.options[i] for one of `size`'s types)
    and its memory (``section``, that cluster entry: its ``memory``, else its profile's or its GPU's)."""
    memory = cluster.gpu.memory_bytes
    if usable_bytes(cluster.gpu, overheads, search.headroom) > 0:
        return
    below = memory * (1 - search.headroom) / 2**30
    given = section if isinstance(section, dict) else {}
    name, outside = outside_allocator(cluster.gpu, overheads)
    key = f"overheads.{outside_key(cluster.gpu)}" if context_stated else f"{cluster_key}.memory" if "memory" in given \
        else f"{cluster_key}.profile" if "profile" in given \
        else f"{cluster_key}.gpu.memory" if isinstance(given.get("gpu"), dict) else f"{cluster_key}.memory"
    raise CaseError(src, key, f"leaves the allocator no memory: {outside / 2**30:g} GiB outside it of "
                              f"{memory / 2**30:g} GiB less {search.headroom:.0%} headroom; expected "
                              f"{name.replace('the ', 'a ', 1)} below {below:.4g} GiB")


def _model(src: str, section: Any, base: Path) -> ModelSpec:
    section = read_mapping(src, "model", section, ("preset", "hf_config") + MODEL_KEYS)
    fields: dict[str, Any] = {}
    if "preset" in section and "hf_config" in section:
        raise CaseError(src, "model.hf_config", "give either preset or hf_config, not both")
    if "preset" in section:
        name = read_str(src, "model.preset", section["preset"])
        presets = model_presets()
        # Case-insensitive, as GPU names are: "Llama3-8B" is llama3-8b.
        name = canonical_choice(name, presets)
        if name not in presets:
            raise CaseError(src, "model.preset", f"unknown model preset {name!r}{closest(name, presets)}; "
                                                 f"expected one of {', '.join(presets)}")
        fields = {"name": name, **presets[name]}
    elif "hf_config" in section:
        path = read_file_path(src, "model.hf_config", section["hf_config"], base, "config.json")
        with read_for(src, "model.hf_config", path):
            fields = read_hf_config(path)
    overrides = {k: v for k, v in section.items() if k not in ("preset", "hf_config")}
    base = "the preset" if "preset" in section else "the hf_config" if "hf_config" in section else None
    if base and "num_experts" in overrides and (overrides["num_experts"] is None or
                                                 (type(overrides["num_experts"]) is int and overrides["num_experts"] == 0)):
        # num_experts: 0 (or null, as an optional count reads) over a mixture of experts makes it dense: the
        # expert keys the preset (or config) set go with its experts. Kept, they were refused as
        # "model.moe_top_k: applies only to a mixture of experts", a key the case never wrote, and no value
        # of it the case could write made it dense.
        fields = {k: v for k, v in fields.items() if k not in EXPERT_KEYS or k in overrides}
    fields.update(overrides)
    experts = fields.get("num_experts")
    if experts is not None:  # its own refusal first (2^62 experts: past the bound, not a missing top-k)
        experts = read_int(src, "model.num_experts", experts, minimum=0,
                           maximum=MODEL_BOUNDS.get("num_experts", MAX_MODEL_WIDTH))
    if experts and "moe_top_k" not in fields:
        # It was "model.moe_top_k: expected a positive integer, got 0": a 0 the case never gave.
        dense = f"; {base} is dense and sets none" if base and "num_experts" in overrides else ""
        raise CaseError(src, "model.moe_top_k", f"missing; required with num_experts {experts} (the experts each "
                                                f"token is routed to{dense})")
    for key in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
        required(src, "model", fields, key)
    # Shown in every report and file header: control characters (an ANSI escape, a line break) are
    # kept as their escapes, so that a shared case cannot recolour or fake the report's lines.
    values: dict[str, Any] = {"name": one_line(read_str(src, "model.name", fields.get("name", "model")),
                                                MAX_STRING_CHARS * 4)}
    for key in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
        values[key] = read_int(src, f"model.{key}", fields[key], maximum=MODEL_BOUNDS.get(key, MAX_MODEL_WIDTH))
    for key in ("num_kv_heads", "ffn_hidden_size", "head_dim", "kv_lora_rank", "qk_head_dim", "qk_rope_head_dim",
                "v_head_dim", "moe_top_k", "moe_ffn_hidden_size", "moe_layer_freq", "moe_router_num_groups",
                "moe_router_group_topk"):
        if key in fields:
            values[key] = read_int(src, f"model.{key}", fields[key], maximum=MODEL_BOUNDS.get(key, MAX_MODEL_WIDTH))
    for key in OPTIONAL_COUNT_KEYS:
        if fields.get(key) is not None:
            values[key] = read_int(src, f"model.{key}", fields[key], minimum=0,
                                   maximum=MODEL_BOUNDS.get(key, MAX_MODEL_WIDTH))
    for key in ("activation", "attention_type", "moe_router"):
        if key in fields:
            values[key] = read_choice(src, f"model.{key}", fields[key], MODEL_CHOICES[key])
    if fields.get("moe_capacity_factor") is not None:
        values["moe_capacity_factor"] = read_figure(src, "model.moe_capacity_factor", fields["moe_capacity_factor"])
    # The router's weights scaled by up to 1,000 (DeepSeek-V2: 16); RoPE on at most the whole head.
    for key, most in (("moe_load_imbalance", math.inf), ("moe_router_topk_scaling", 1000.0), ("rotary_percent", 1.0)):
        if key in fields:
            values[key] = read_figure(src, f"model.{key}", fields[key], maximum=most)
    if "tied_embeddings" in fields:
        values["tied_embeddings"] = read_bool(src, "model.tied_embeddings", fields["tied_embeddings"])
    for key in ("normalization", "position_embedding"):
        if fields.get(key) is not None:
            values[key] = read_choice(src, f"model.{key}", fields[key], MODEL_CHOICES[key])
    if fields.get("rope_base") is not None:
        values["rope_base"] = read_number(src, "model.rope_base", fields["rope_base"], MAX_ROPE_BASE)
    for key in ("linear_bias", "qk_norm", "qk_l2_norm", "qkv_bias"):
        if fields.get(key) is not None:
            values[key] = read_bool(src, f"model.{key}", fields[key])
    if "dropout" in fields:
        values["dropout"] = read_number(src, "model.dropout", fields["dropout"])
    with spec_errors(src):
        return ModelSpec(**values)


def check_batch_tokens(src: str, global_batch_size: int, seq_len: int) -> None:
    """Tokens a step within what any command prices (limits.MAX_BATCH_TOKENS): past it `estimate`
    blamed the GPU's figures for the step time, and `plan` searched for minutes."""
    tokens = global_batch_size * seq_len
    if tokens > MAX_BATCH_TOKENS:
        raise CaseError(src, "training.global_batch_size",
                        f"global_batch_size × seq_len = {tokens:,} tokens a step; at most {MAX_BATCH_TOKENS:,} can be "
                        f"planned")


def _training(src: str, section: Any) -> TrainingSpec:
    if isinstance(section, dict):
        for key in ("micro_batch_size", "tp", "pp", "dp", "zero_stage", "recompute"):
            if key in section:  # a layout key one section up: say where it belongs
                raise CaseError(src, f"training.{key}", f"belongs under layout (layout.{key}), not training")
    section = read_mapping(src, "training", section, TRAINING_KEYS)
    values: dict[str, Any] = {
        "global_batch_size": read_int(src, "training.global_batch_size",
                                      required(src, "training", section, "global_batch_size"),
                                      maximum=MAX_GLOBAL_BATCH),
        "seq_len": read_int(src, "training.seq_len", required(src, "training", section, "seq_len"),
                            maximum=MAX_SEQ_LEN),
    }
    check_batch_tokens(src, values["global_batch_size"], values["seq_len"])
    if "loss_chunks" in section:
        values["loss_chunks"] = read_int(src, "training.loss_chunks", section["loss_chunks"], maximum=MAX_SEQ_LEN)
    for key, choices in TRAINING_CHOICES.items():
        # engine: null (YAML's ~, the API's None) is unset, as YAML users mean it: search.target, else any
        if key in section and not (key == "engine" and section[key] is None):
            values[key] = read_choice(src, f"training.{key}", section[key], choices)
    if "engine" in values:
        values["engine"] = ENGINES[values["engine"]].behaviour
    for key in ("flash_attention", "tp_comm_overlap", "fp32_grads", "moe_comm_overlap", "fp8_param_gather",
                "master_weights", "compiled_loss", "fused_attention", "chunked_loss", "master_remainders"):
        if key in section:
            values[key] = read_bool(src, f"training.{key}", section[key])
    with spec_errors(src):
        return TrainingSpec(**values)


def profile_overheads(src: str, profile: dict) -> Overheads:
    """The overheads a hardware profile gives a case: its ``overheads`` section (fitted to a team's runs)
    over the process a CPU rank is as `calibrate` measured it (``gpu.cpu_process``), over the defaults."""
    process = profile_process_bytes(src, profile)
    base = Overheads() if process is None else replace(Overheads(), cpu_process=process)
    return _overheads(src, profile.get("overheads"), base)


def _overheads(src: str, section: Any, base: Overheads = Overheads()) -> Overheads:
    """The case's overheads over ``base`` (a fitted profile's, else the documented defaults)."""
    section = read_mapping(src, "overheads", {} if section is None else section, OVERHEAD_KEYS)  # 0, [], "": not one
    values: dict[str, float] = {}
    for key in ("cuda_context", "cpu_process", "comm_buffers"):
        if key in section:
            values[key] = read_unit(src, f"overheads.{key}", section[key], parse_memory)
    if "fragmentation" in section:
        values["fragmentation"] = read_number(src, "overheads.fragmentation", section["fragmentation"])
    with spec_errors(src):
        return replace(base, **values)


def layout_from_mapping(src: str, section: Any, num_gpus: int, key: str = "layout") -> Layout:
    """A Layout from the case-file ``layout`` schema; ``dp`` defaults to what the GPUs leave."""
    section = read_mapping(src, key, section, LAYOUT_KEYS)
    values: dict[str, Any] = {}
    for k in ("tp", "pp", "cp", "vpp", "micro_batch_size", "ep"):
        if k in section:
            values[k] = read_int(src, f"{key}.{k}", section[k])
    if section.get("etp") is not None:
        values["etp"] = read_int(src, f"{key}.etp", section["etp"])
    if "zero_stage" in section:
        values["zero_stage"] = read_int(src, f"{key}.zero_stage", section["zero_stage"], minimum=0)
    for flag in ("sequence_parallel", "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        if flag in section:
            values[flag] = read_bool(src, f"{key}.{flag}", section[flag])
    if "recompute" in section:
        values["recompute"] = read_choice(src, f"{key}.recompute", section["recompute"], RECOMPUTE)
    if section.get("recompute_num_layers") is not None:
        values["recompute_num_layers"] = read_recompute_layers(src, f"{key}.recompute_num_layers",
                                                           section["recompute_num_layers"])
    if section.get("recompute_modules") is not None:
        values["recompute_modules"] = read_module_names(src, f"{key}.recompute_modules", section["recompute_modules"])
    if "offload_optimizer" in section:
        values["offload_optimizer"] = read_number(src, f"{key}.offload_optimizer", section["offload_optimizer"])
    if "offload_params" in section:
        values["offload_params"] = read_bool(src, f"{key}.offload_params", section["offload_params"])
    if "offload_activations" in section:
        values["offload_activations"] = read_int(src, f"{key}.offload_activations", section["offload_activations"],
                                             minimum=0)
    if section.get("stage_layers") is not None:
        layers = section["stage_layers"]
        if not isinstance(layers, list):
            raise CaseError(src, f"{key}.stage_layers", f"expected a list of layer counts, got {describe(layers)}")
        values["stage_layers"] = tuple(read_int(src, f"{key}.stage_layers", n, minimum=0) for n in layers)
    if section.get("chunk_layers") is not None:
        layers = section["chunk_layers"]
        if not isinstance(layers, list):
            raise CaseError(src, f"{key}.chunk_layers", f"expected a list of layer counts, got {describe(layers)}")
        # The last chunk may hold none, where it holds the MTP layers (Layout and Job say when it may).
        values["chunk_layers"] = tuple(read_int(src, f"{key}.chunk_layers", n, minimum=int(i < len(layers) - 1))
                                       for i, n in enumerate(layers))
    model_parallel = values.get("tp", 1) * values.get("pp", 1) * values.get("cp", 1)
    if "dp" in section:
        values["dp"] = read_int(src, f"{key}.dp", section["dp"])
    else:
        if num_gpus % model_parallel:
            # Named by the first degree that does not divide the GPUs, else the product's first factor.
            culprit = next((k for k in ("cp", "pp", "tp") if num_gpus % values.get(k, 1)),
                           next((k for k in ("tp", "pp", "cp") if k in section), "tp"))
            raise CaseError(src, f"{key}.{culprit}", f"tp·pp·cp = {values.get('tp', 1)}·{values.get('pp', 1)}·"
                                                     f"{values.get('cp', 1)} = {model_parallel} must divide the "
                                                     f"cluster's {num_gpus} GPUs")
        values["dp"] = num_gpus // model_parallel
    with spec_errors(src):
        return Layout(**values)


# What a layout field's None means, as a person reads it (the report's tables, the remedies' changes).
LAYOUT_UNSET_TEXT = {"stage_layers": "even", "recompute_num_layers": "all", "offload_optimizer": "0",
                     "offload_params": "off", "offload_activations": "0", "recompute_modules": "default", "ep": "1",
                     "etp": "1"}


def layout_to_mapping(layout: Layout) -> dict[str, Any]:
    """The case-file ``layout`` section for ``layout``: what `plan` hands to `estimate`."""
    return layout.to_dict()


# A fit whose relative rms error passes this gives a figure the user should not lean on silently.
FIT_ERROR_WARNING = 0.15
# Fits in a profile's measurements that give it no figure: point-to-point sends are timed for the record,
# but the cost model sends them at the all-reduce's bus bandwidth (cost_models.collectives.p2p_time), so a
# poor p2p fit leaves every figure as it is (its warning said "the figure it gives is uncertain").
NO_FIGURE_FITS = ("p2p",)


def profile_warnings(case: Any) -> list[str]:
    """What `estimate`, `plan` and `size` say on stderr of the hardware profile a case names: a
    `calibrate --quick` profile (a smoke test, not a measurement), and each fit in it whose relative
    rms error passes FIT_ERROR_WARNING, and a profile of one rank under a case of several
    (:func:`links_not_measured`). For `size`, each GPU type's of ``cluster.options`` too (a
    profile there was priced without a word of either)."""
    try:
        data, src, base = read_case(case)
        cluster = data.get("cluster") if isinstance(data, dict) else None
        options = cluster.get("options") if isinstance(cluster, dict) else None
        sections = [("cluster", cluster)] + [(f"cluster.options[{i}]", section)
                                            for i, section in enumerate(options if isinstance(options, list) else [])]
        found = [f for f in (cluster_profile(src, section, base, key) for key, section in sections) if f is not None]
    except CaseError:
        return []  # the command itself reports a case it cannot read
    out: list[str] = []
    for path in dict.fromkeys(path for path, _ in found):
        out += warnings_of_profile(path, next(profile for p, profile in found if p == path))
    for key, section in sections:
        out += links_not_measured(src, section, base, key)
    return out


def collectives_not_timed(profile: dict) -> bool:
    """Whether `calibrate` measured ``profile`` with one rank, timing no collective ({} in its
    measurements); False for a profile fitted to runs, which has no measurements."""
    measured = profile.get("measurements")
    return isinstance(measured, dict) and measured.get("collectives") == {}


def links_not_measured(src: str, section: Any, base: Path, key: str = "cluster") -> list[str]:
    """A warning for a cluster section of more than one GPU (or one of `size`'s options, which size up)
    on a profile `calibrate` measured with one rank, which timed no collective: its link bandwidths are
    placeholders, the device's own copy bandwidth (calibration/profile.py), so every collective between
    its GPUs was priced at memory speed (39 GB/s for two gloo ranks on this project's 2-core machine,
    which measures 1.3 GB/s between two), with no word. None where the section gives its own."""
    found = cluster_profile(src, section, base, key)
    if found is None or section.get("num_gpus") == 1 or "intra_node_bandwidth" in section:
        return []
    path, profile = found
    if not collectives_not_timed(profile):
        return []
    try:
        gpu, _ = gpu_of_profile(path, profile)
    except CaseError:
        return []  # the command's one line says what is wrong with it, with no warning before it
    return [f"{path} was measured with one rank, which times no collective: its gpu.intra_node_bandwidth and "
            f"inter_node_bandwidth ({gpu.intra_node_bandwidth / 1e9:.3g} GB/s) are the device's copy bandwidth, "
            "a placeholder; calibrate with --nproc 2 or more, or set cluster.intra_node_bandwidth and "
            "inter_node_bandwidth, before trusting the communication of a case of several GPUs"]


def measured_while_disturbed(path: str, machine: dict) -> list[str]:
    """What a profile's machine section records of a calibration that other work disturbed: a busy
    machine (measured under --allow-busy) or one whose speed moved between the reference GEMMs timed
    before and after the ranks. `calibrate` warned of each once, as it wrote the profile; every estimate on
    it then took its figures with no word (a calibration whose reference GEMM ran 0.057 then 0.173 TFLOP/s
    on this project's 2-core machine priced plans as any other)."""
    from calibration.host import OTHERS_BUSY_SHARE
    from calibration.speed import moved_reason

    out = []
    share = machine.get("other_cpu_share")
    if isinstance(share, (int, float)) and share > OTHERS_BUSY_SHARE:
        out.append(f"{path} was measured while other processes used {share:.0%} of its machine's CPU time (more than "
                   f"{OTHERS_BUSY_SHARE:.0%}; machine.other_cpu_share): its figures describe a slower machine; "
                   "calibrate again when it is quiet")
    timed = machine.get("reference_gemm_tflops")
    before, after = (timed.get("before"), timed.get("after")) if isinstance(timed, dict) else (None, None)
    if all(isinstance(v, (int, float)) and v > 0 for v in (before, after)):
        moved = moved_reason(before, after)
        if moved:
            out.append(f"{path}: {moved} (machine.reference_gemm_tflops)")
    return out


def warnings_of_profile(path: str, profile: dict, disturbed: bool = True) -> list[str]:
    """:func:`profile_warnings` of one profile (what `calibrate` says of the profile it writes, with
    ``disturbed`` False: it said those as it measured); ``path`` is what errors name it by, a profile
    given inline the case's key (:func:`case_cluster.inline_profile`)."""
    try:
        gpu, _ = gpu_of_profile(path, profile)
    except CaseError:
        return []  # nor one whose profile it refuses: its one line, not warnings before it
    out = []
    stated = profile.get("overheads")
    if gpu.on_cpu and profile_process_bytes(path, profile) is None \
            and not (isinstance(stated, dict) and "cpu_process" in stated):
        # Written before `calibrate` measured it: another machine's or torch build's process is priced as
        # the development machine's.
        out.append(f"{path} has no gpu.cpu_process (written before `calibrate` measured it): a rank's process "
                   f"is taken as {Overheads().cpu_process / 1e6:.0f} MB, the development machine's; calibrate "
                   "again to measure this machine's")
    if "performance" not in profile:
        # A hand-edited profile without it was priced on the dataclass's generic figures (GEMMs at 0.75 of the
        # peak where the H100 preset says 0.50), 35 % faster than its GPU's preset, with no word.
        out.append(f"{path} has no performance section: its achieved figures are generic defaults (GEMMs at "
                   f"{Performance().gemm_efficiency:g} of the peak, collectives fully overlapped), no GPU's "
                   "measurements; calibrate writes them, and planner/presets/performance.yaml holds each preset's")
    machine = profile.get("machine") if isinstance(profile.get("machine"), dict) else {}
    if machine.get("quick"):
        out.append(f"{path} was written by `calibrate --quick`: a smoke test of tiny shapes, not this machine's "
                   "figures; calibrate without --quick before trusting an estimate on it")
    if disturbed:
        out += measured_while_disturbed(path, machine)

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            error = node.get("rms_relative_error")
            if isinstance(error, (int, float)) and not isinstance(error, bool) and error > FIT_ERROR_WARNING:
                out.append(f"{path}: {where} fits its timings with a {error:.0%} rms error (above "
                           f"{FIT_ERROR_WARNING:.0%}): the figure it gives is uncertain")
            for key, value in node.items():
                if key != "points" and key not in NO_FIGURE_FITS:
                    walk(value, f"{where}.{key}" if where else str(key))

    walk(profile.get("measurements"), "measurements")
    return out
