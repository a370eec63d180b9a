"""Case files: the one input of the CLI and the Python API.

A case is YAML (read by :mod:`planner.inputs`: safe, bounded) or an equivalent dict with the sections
``model``, ``cluster``, ``training``, ``layout`` (optional: the planner chooses
it when absent) and ``overheads`` (optional). docs/case-reference.md
documents every key. Every problem becomes a :class:`CaseError` naming the file,
the key and what was expected.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Optional


from cost_models.specs import (ClusterSpec, FabricSpec, GPUSpec, HostSpec, Job, Layout, ModelSpec, Overheads,
                               Performance, SpecError, TrainingSpec)

from .engines import ENGINES
from .errors import CaseError
from .fields import (describe, read_bool, read_figure, read_int, read_mapping, read_number, read_str, read_time,
                     read_unit, required)
from .hf_config import read_hf_config
from .inputs import read_yaml
from .limits import MAX_GPU_HOUR_COST, MAX_GPUS, MAX_SEQ_LEN
from .presets import closest, fabric_presets, gpu_presets, model_presets, performance_presets, resolve_gpu_preset
from .search_options import SearchSpec, read_module_names, read_search, training_for_target
from .units import parse_bandwidth, parse_memory

SECTIONS = ("model", "cluster", "training", "layout", "overheads", "search")
# Engines a case can name (``planner/engines/``).
CASE_ENGINES = tuple(ENGINES)
MODEL_KEYS = ("name", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
              "ffn_hidden_size", "activation", "vocab_size", "tied_embeddings", "dropout", "head_dim",
              "attention_type", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_rope_head_dim", "v_head_dim",
              "num_experts", "moe_top_k", "moe_ffn_hidden_size", "moe_shared_expert_ffn_hidden_size",
              "moe_first_dense_layers", "moe_layer_freq", "moe_router", "moe_router_num_groups",
              "moe_router_group_topk", "moe_capacity_factor", "moe_load_imbalance", "mtp_layers",
              "sliding_window", "sliding_window_full_every",
              "normalization", "position_embedding", "rope_base", "linear_bias", "qk_norm")
# Integer model fields that may be 0 (none) or null: a model without query compression, shared
# experts, leading dense layers, multi-token prediction or a sliding window.
OPTIONAL_COUNT_KEYS = ("q_lora_rank", "num_experts", "moe_shared_expert_ffn_hidden_size", "moe_first_dense_layers",
                       "mtp_layers", "sliding_window", "sliding_window_full_every")
GPU_KEYS = ("memory", "peak_tflops", "hbm_bandwidth", "intra_node_bandwidth", "inter_node_bandwidth",
            "gpus_per_node", "nvlink_domain", "sm_count", "fabric", "host", "block_scaling")
# A GPU preset may name the fabric of its reference system; the cluster's fabric overrides it.
# ``host`` (what offload reaches) is the reference system's too; ``cluster.host`` overrides it.
OPTIONAL_GPU_KEYS = ("sm_count", "fabric", "host", "block_scaling")
PEAK_KEYS = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4")
HOST_KEYS = ("memory", "link_bandwidth", "memory_bandwidth")
FABRIC_KEYS = tuple(f.name for f in fields(FabricSpec) if f.name != "name") + ("nic_bandwidth",)
# What one GPU type is, as a cluster section (or each of `size`'s cluster.options) gives it.
HARDWARE_KEYS = ("gpu", "profile", "gpus_per_node", "intra_node_bandwidth", "inter_node_bandwidth", "memory",
                 "performance", "fabric", "host")
# `size` only: the most GPUs of a type it may use, and their price (planner/cluster_options.py).
SIZING_KEYS = ("max_gpus", "max_nodes", "gpu_hour_cost")
CLUSTER_KEYS = HARDWARE_KEYS + ("num_gpus", "nodes") + SIZING_KEYS + ("options",)
PERFORMANCE_KEYS = tuple(f.name for f in fields(Performance))
INTEGER_PERFORMANCE_KEYS = ("gemm_tile_m", "gemm_tile_n", "gemm_split_k")
TRAINING_KEYS = ("global_batch_size", "seq_len", "precision", "optimizer", "flash_attention", "engine",
                 "tp_comm_overlap", "fp32_grads", "moe_comm_overlap", "fp8_recipe", "fp8_param_gather",
                 "expert_dispatch", "master_weights", "compiled_loss", "fused_attention")
LAYOUT_KEYS = ("dp", "tp", "pp", "cp", "vpp", "micro_batch_size", "zero_stage", "sequence_parallel",
               "recompute", "recompute_num_layers", "recompute_modules", "stage_layers", "chunk_layers",
               "account_for_embedding_in_pipeline_split",
               "account_for_loss_in_pipeline_split", "offload_optimizer", "offload_params", "offload_activations",
               "ep", "etp")
OVERHEAD_KEYS = ("cuda_context", "comm_buffers", "fragmentation")


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
            raise CaseError(self.source, "layout", "missing; `estimate` needs a layout (`plan` chooses one)")
        with spec_errors(self.source):
            return Job(self.model, self.cluster, self.training, layout, self.overheads)


# Where each cost-model spec sits in a case file: a SpecError names (spec class, field), the case
# file's user a key. GPU specs built for `size`'s cluster.options, from presets or a profile are
# named as the case's cluster.gpu, as all GPU figures are.
SPEC_SECTIONS = {spec.__name__: section for spec, section in (
    (ModelSpec, "model"), (ClusterSpec, "cluster"), (GPUSpec, "cluster.gpu"), (HostSpec, "cluster.gpu.host"),
    (FabricSpec, "cluster.fabric"), (Performance, "cluster.performance"), (TrainingSpec, "training"),
    (Layout, "layout"), (Overheads, "overheads"))}
# Spec fields the case file spells differently (it gives sizes with units, peaks in TFLOP/s).
SPEC_FIELD_KEYS = {("GPUSpec", "memory_bytes"): "memory", ("GPUSpec", "peak_flops"): "peak_tflops",
                   ("HostSpec", "memory_bytes"): "memory"}


def spec_key(spec: str, field: str) -> str:
    """The case-file key of a spec's field (``Performance.comm_overlap`` is
    ``cluster.performance.comm_overlap``); a field's sub-key (``peak_flops.bf16``) is kept."""
    name, dot, rest = field.partition(".")
    name = SPEC_FIELD_KEYS.get((spec, name), name)
    return f"{SPEC_SECTIONS.get(spec, spec)}.{name}{dot}{rest}"


def case_key(error: SpecError) -> str:
    """The case-file key of the field a :class:`SpecError` names."""
    return spec_key(error.spec, error.field)


# A message may point at another field than the one it is about ("... (GPUSpec.block_scaling)").
_SPEC_FIELD = re.compile(r"\b(" + "|".join(SPEC_SECTIONS) + r")\.([a-z_][a-z0-9_]*)")


def case_message(message: str) -> str:
    """A :class:`SpecError`'s message with every spec field it names written as its case-file key."""
    return _SPEC_FIELD.sub(lambda m: spec_key(m[1], m[2]), message)


class spec_errors:
    """Turns a cost-model :class:`SpecError` into a :class:`CaseError` for ``source``, at the
    case-file key of the field it names (:func:`case_key`)."""

    def __init__(self, source: str):
        self.source = source

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if isinstance(error, SpecError):
            raise CaseError(self.source, case_key(error), case_message(error.message)) from None
        return False


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
    """The parsed data of a case path or dict, its name for errors, and the folder relative paths start from."""
    if isinstance(case, dict):
        return case, "<case>", Path.cwd()
    if isinstance(case, (str, os.PathLike)):
        path = Path(case)
        return read_yaml(path), str(path), path.parent
    raise CaseError("<case>", "", f"expected a case-file path or a dict, got {type(case).__name__}")


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

def build_case(data: Any, src: str, base: Path, cluster: Optional[ClusterSpec] = None) -> Case:
    """A case from already-parsed data; ``src`` names it in errors, ``base`` anchors relative paths.

    ``cluster`` replaces what the cluster section says (`size` reads that section itself)."""
    data = read_mapping(src, "", data if data is not None else {}, SECTIONS)
    for section in ("model", "cluster", "training"):
        if section not in data:
            raise CaseError(src, section, "missing section")
    model = _model(src, data["model"], base)
    cluster = cluster or _cluster(src, data["cluster"], base)
    training = _training(src, data["training"])
    # The engine searched for is the engine trained with: estimate and plan time it alike.
    training = training_for_target(src, data.get("search"), training)
    profile = cluster_profile(src, data["cluster"], base)
    overheads = _overheads(src, data.get("overheads", {}), _overheads(profile[0], profile[1].get("overheads"))
                           if profile else Overheads())
    layout = layout_from_mapping(src, data["layout"], cluster.num_gpus) if data.get("layout") is not None else None
    search = read_search(src, data.get("search"), training, model)  # a bad search key fails `estimate` as `plan`
    fitted = profile[1].get("fitted") if profile and isinstance(profile[1].get("fitted"), dict) else None
    case = Case(src, model, cluster, training, layout, overheads, search, fitted)
    if layout is not None:
        case.job()  # cross-checks now, so a bad layout is reported at load time
    return case


def _model(src: str, section: Any, base: Path) -> ModelSpec:
    section = read_mapping(src, "model", section, ("preset", "hf_config") + MODEL_KEYS)
    fields: dict[str, Any] = {}
    if "preset" in section and "hf_config" in section:
        raise CaseError(src, "model.hf_config", "give either preset or hf_config, not both")
    if "preset" in section:
        name = read_str(src, "model.preset", section["preset"])
        presets = model_presets()
        # Case-insensitive, as GPU names are: "Llama3-8B" is llama3-8b.
        name = next((p for p in presets if p.lower() == name.lower()), name)
        if name not in presets:
            raise CaseError(src, "model.preset", f"unknown model preset {name!r}{closest(name, presets)}; "
                                                 f"expected one of {', '.join(presets)}")
        fields = {"name": name, **presets[name]}
    elif "hf_config" in section:
        path = Path(read_str(src, "model.hf_config", section["hf_config"]))
        fields = read_hf_config(path if path.is_absolute() else base / path)
    overrides = {k: v for k, v in section.items() if k not in ("preset", "hf_config")}
    fields.update(overrides)
    for key in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
        required(src, "model", fields, key)
    values: dict[str, Any] = {"name": read_str(src, "model.name", fields.get("name", "model"))}
    for key in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
        values[key] = read_int(src, f"model.{key}", fields[key])
    for key in ("num_kv_heads", "ffn_hidden_size", "head_dim", "kv_lora_rank", "qk_head_dim", "qk_rope_head_dim",
                "v_head_dim", "moe_top_k", "moe_ffn_hidden_size", "moe_layer_freq", "moe_router_num_groups",
                "moe_router_group_topk"):
        if key in fields:
            values[key] = read_int(src, f"model.{key}", fields[key])
    for key in OPTIONAL_COUNT_KEYS:
        if fields.get(key) is not None:
            values[key] = read_int(src, f"model.{key}", fields[key], minimum=0)
    for key in ("activation", "attention_type", "moe_router"):
        if key in fields:
            values[key] = read_str(src, f"model.{key}", fields[key])
    if fields.get("moe_capacity_factor") is not None:
        values["moe_capacity_factor"] = read_figure(src, "model.moe_capacity_factor", fields["moe_capacity_factor"])
    if "moe_load_imbalance" in fields:
        values["moe_load_imbalance"] = read_figure(src, "model.moe_load_imbalance", fields["moe_load_imbalance"])
    if "tied_embeddings" in fields:
        values["tied_embeddings"] = read_bool(src, "model.tied_embeddings", fields["tied_embeddings"])
    for key in ("normalization", "position_embedding"):
        if fields.get(key) is not None:
            values[key] = read_str(src, f"model.{key}", fields[key])
    if fields.get("rope_base") is not None:
        values["rope_base"] = read_number(src, "model.rope_base", fields["rope_base"])
    for key in ("linear_bias", "qk_norm"):
        if fields.get(key) is not None:
            values[key] = read_bool(src, f"model.{key}", fields[key])
    if "dropout" in fields:
        values["dropout"] = read_number(src, "model.dropout", fields["dropout"])
    with spec_errors(src):
        return ModelSpec(**values)


def gpu_from_mapping(src: str, key: str, name: str, data: Any) -> GPUSpec:
    """A GPUSpec from a preset entry, or an inline mapping with the same fields."""
    data = read_mapping(src, key, data, GPU_KEYS)
    for k in GPU_KEYS:
        if k not in OPTIONAL_GPU_KEYS:
            required(src, key, data, k)
    peaks = read_mapping(src, f"{key}.peak_tflops", data["peak_tflops"], PEAK_KEYS)
    formats = data.get("block_scaling", [])
    if not isinstance(formats, list) or not all(isinstance(f, str) for f in formats):
        raise CaseError(src, f"{key}.block_scaling", f"expected a list of formats, got {describe(formats)}")
    with spec_errors(src):
        return GPUSpec(
            name=name,
            memory_bytes=read_unit(src, f"{key}.memory", data["memory"], parse_memory),
            peak_flops={p: read_figure(src, f"{key}.peak_tflops.{p}", v) * 1e12 for p, v in peaks.items()},
            hbm_bandwidth=read_unit(src, f"{key}.hbm_bandwidth", data["hbm_bandwidth"], parse_bandwidth),
            intra_node_bandwidth=read_unit(src, f"{key}.intra_node_bandwidth", data["intra_node_bandwidth"],
                                       parse_bandwidth),
            inter_node_bandwidth=read_unit(src, f"{key}.inter_node_bandwidth", data["inter_node_bandwidth"],
                                       parse_bandwidth),
            gpus_per_node=read_int(src, f"{key}.gpus_per_node", data["gpus_per_node"]),
            nvlink_domain=read_int(src, f"{key}.nvlink_domain", data["nvlink_domain"]),
            sm_count=read_int(src, f"{key}.sm_count", data["sm_count"]) if "sm_count" in data else None,
            host=host_from_mapping(src, f"{key}.host", data["host"]) if "host" in data else None,
            block_scaling=tuple(formats),
        )


def host_from_mapping(src: str, key: str, data: Any) -> HostSpec:
    """What offload reaches: host memory, the GPU↔host link and host DRAM bandwidth, per GPU."""
    data = read_mapping(src, key, data, HOST_KEYS)
    for k in HOST_KEYS:
        required(src, key, data, k)
    with spec_errors(src):
        return HostSpec(memory_bytes=read_unit(src, f"{key}.memory", data["memory"], parse_memory),
                        link_bandwidth=read_unit(src, f"{key}.link_bandwidth", data["link_bandwidth"], parse_bandwidth),
                        memory_bandwidth=read_unit(src, f"{key}.memory_bandwidth", data["memory_bandwidth"],
                                               parse_bandwidth))


def fabric_from_mapping(src: str, key: str, name: str, data: Any) -> tuple[FabricSpec, Optional[float]]:
    """A FabricSpec (and the NIC line rate per GPU it sets, if any) from a preset entry or an
    inline mapping with the same fields."""
    data = read_mapping(src, key, data or {}, FABRIC_KEYS)
    values: dict[str, Any] = {"name": name}
    for k in ("efficiency", "latency_s", "tree_latency_s", "rails", "alltoall_efficiency", "oversubscription"):
        if k in data:
            values[k] = (read_time if k.endswith("_s") else read_number)(src, f"{key}.{k}", data[k])
    if "leaf_nodes" in data:
        values["leaf_nodes"] = read_int(src, f"{key}.leaf_nodes", data["leaf_nodes"])
    if "efficiency_at" in data:
        points = data["efficiency_at"]
        if not isinstance(points, list) or not all(isinstance(p, list) and len(p) == 2 for p in points):
            raise CaseError(src, f"{key}.efficiency_at", f"expected a list of [nodes, efficiency] pairs, got {describe(points)}")
        values["efficiency_at"] = tuple((read_int(src, f"{key}.efficiency_at", n), read_number(src, f"{key}.efficiency_at", e))
                                        for n, e in points)
    nic = read_unit(src, f"{key}.nic_bandwidth", data["nic_bandwidth"], parse_bandwidth) if "nic_bandwidth" in data else None
    with spec_errors(src):
        return FabricSpec(**values), nic


def _fabric(src: str, entry: Any, key: str) -> tuple[FabricSpec, Optional[float]]:
    """A fabric named by a preset, or given as a mapping."""
    if isinstance(entry, str):
        presets = fabric_presets()
        if entry not in presets:
            raise CaseError(src, key, f"unknown fabric preset {entry!r}{closest(entry, presets)}; "
                                      f"expected one of {', '.join(presets)}")
        return fabric_from_mapping("planner/presets/fabrics.yaml", entry, entry, presets[entry])
    if isinstance(entry, dict):
        return fabric_from_mapping(src, key, "custom", entry)
    raise CaseError(src, key, f"expected a fabric preset name or a mapping, got {describe(entry)}")


def performance_from_mapping(src: str, key: str, data: Any, base: Performance) -> Performance:
    """Performance figures over ``base``: every key optional, each a plain number (fractions, seconds)."""
    data = read_mapping(src, key, data, PERFORMANCE_KEYS)
    values = {k: read_int(src, f"{key}.{k}", v) if k in INTEGER_PERFORMANCE_KEYS
              else read_time(src, f"{key}.{k}", v) if k.endswith("_s")
              else (read_figure if "efficiency" in k or k == "sustained_clock" else read_number)(src, f"{key}.{k}", v)
              for k, v in data.items()}
    with spec_errors(src):
        return replace(base, **values)


def _cluster_overrides(src: str, section: dict, key: str) -> dict[str, Any]:
    """GPUSpec fields the cluster section sets over its GPU's (a different NIC, a smaller node)."""
    overrides: dict[str, Any] = {}
    if "memory" in section:
        overrides["memory_bytes"] = read_unit(src, f"{key}.memory", section["memory"], parse_memory)
    for k in ("intra_node_bandwidth", "inter_node_bandwidth"):
        if k in section:
            overrides[k] = read_unit(src, f"{key}.{k}", section[k], parse_bandwidth)
    if "gpus_per_node" in section:
        overrides["gpus_per_node"] = read_int(src, f"{key}.gpus_per_node", section["gpus_per_node"])
    if "host" in section:
        overrides["host"] = host_from_mapping(src, f"{key}.host", section["host"])
    return overrides


PROFILE_KEYS = ("machine", "gpu", "performance", "fabric", "alone", "measurements", "overheads", "fitted")
ALONE_KEYS = ("peak_tflops", "hbm_bandwidth", "performance")


def gpu_from_profile(path: Path, alone: bool = False) -> tuple[GPUSpec, Optional[FabricSpec]]:
    """The measured GPU of a hardware profile written by `layout-planner calibrate`, and its
    measured fabric where the profile has one.

    A profile holds ``gpu`` (the fields of a GPU preset, with measured figures),
    ``performance`` and ``fabric`` (the fitted achieved figures), ``machine`` and ``measurements``,
    and ``alone``: the compute and memory figures measured with one rank running, which a case of
    one rank (``alone``) takes where the profile has them.
    """
    src = str(path)
    data = read_mapping(src, "", read_yaml(path), PROFILE_KEYS)
    machine = data.get("machine") or {}
    name = str(machine.get("device", "profiled")) if isinstance(machine, dict) else "profiled"
    gpu_data = required(src, "", data, "gpu")
    performance = performance_from_mapping(src, "performance", data.get("performance") or {}, Performance())
    if alone and data.get("alone") is not None:
        one = read_mapping(src, "alone", data["alone"], ALONE_KEYS)
        if isinstance(gpu_data, dict):
            # Rank 0 timed the training precision alone: the other precisions keep their figures.
            peaks = gpu_data.get("peak_tflops")
            if isinstance(peaks, dict) and isinstance(one.get("peak_tflops"), dict):
                gpu_data = {**gpu_data, "peak_tflops": {**peaks, **one["peak_tflops"]}}
            if "hbm_bandwidth" in one:
                gpu_data = {**gpu_data, "hbm_bandwidth": one["hbm_bandwidth"]}
        performance = performance_from_mapping(src, "alone.performance", one.get("performance") or {}, performance)
    gpu = gpu_from_mapping(src, "gpu", name, gpu_data)
    fabric = fabric_from_mapping(src, "fabric", "measured", data["fabric"])[0] if data.get("fabric") else None
    with spec_errors(src):
        return replace(gpu, performance=performance), fabric


def cluster_hardware(src: str, section: dict, base: Path, key: str = "cluster", alone: bool = False) \
        -> tuple[GPUSpec, FabricSpec]:
    """The GPU type a cluster section (``key``: where it sits in the case) describes, with the
    section's overrides, and its fabric; a profile's single-rank figures where ``alone``."""
    if "profile" in section:
        if "gpu" in section:
            raise CaseError(src, f"{key}.profile", "give either gpu or profile, not both")
        profile = Path(read_str(src, f"{key}.profile", section["profile"]))
        gpu_entry = None
        gpu, profile_fabric = gpu_from_profile(profile if profile.is_absolute() else base / profile, alone)
    else:
        gpu_entry = required(src, key, section, "gpu")
    if isinstance(gpu_entry, str):
        gpu_entry = resolve_gpu_preset(src, f"{key}.gpu", gpu_entry)
        presets = gpu_presets()
        gpu = gpu_from_mapping(src, f"{key}.gpu", gpu_entry, presets[gpu_entry])
        perf = performance_presets()
        gpu = replace(gpu, performance=performance_from_mapping(
            "planner/presets/performance.yaml", gpu_entry, perf.get(gpu_entry) or {}, Performance()))
    elif isinstance(gpu_entry, dict):
        gpu = gpu_from_mapping(src, f"{key}.gpu", "custom", gpu_entry)
    elif gpu_entry is not None:
        raise CaseError(src, f"{key}.gpu", f"expected a GPU preset name or a mapping, got {describe(gpu_entry)}")
    # The fabric: the cluster's, else the one the GPU preset's reference system has.
    default_fabric = gpu_entry.get("fabric") if isinstance(gpu_entry, dict) else \
        gpu_presets()[gpu_entry].get("fabric") if isinstance(gpu_entry, str) else None
    if "fabric" in section:
        fabric, nic = _fabric(src, section["fabric"], f"{key}.fabric")
    elif "profile" in section and profile_fabric is not None:
        fabric, nic = profile_fabric, None
    elif default_fabric is not None:
        fabric, nic = _fabric(src, default_fabric, f"{key}.gpu.fabric")
    else:
        fabric, nic = FabricSpec(), None
    overrides = {"inter_node_bandwidth": nic} if nic is not None else {}
    overrides.update(_cluster_overrides(src, section, key))
    if "performance" in section:
        overrides["performance"] = performance_from_mapping(src, f"{key}.performance", section["performance"],
                                                            gpu.performance)
    with spec_errors(src):
        return replace(gpu, **overrides), fabric


def _cluster(src: str, section: Any, base: Path) -> ClusterSpec:
    section = read_mapping(src, "cluster", section, CLUSTER_KEYS)
    if "options" in section:
        raise CaseError(src, "cluster.options", "lists GPU types for `size` to choose from; plan and estimate "
                                                "run on one: give cluster.gpu with num_gpus or nodes")
    gpu, fabric = cluster_hardware(src, section, base)
    sizing_terms(src, section, "cluster", gpu.gpus_per_node)  # `size`'s keys, checked here as there
    num_gpus = gpu_count(src, section, "cluster", gpu.gpus_per_node, ("num_gpus", "nodes"))
    if num_gpus is None:
        raise CaseError(src, "cluster.num_gpus", "missing; give num_gpus, or nodes and gpus_per_node")
    if num_gpus == 1 and "profile" in section:
        # One rank has the measured machine to itself: the profile's single-rank figures.
        gpu, fabric = cluster_hardware(src, section, base, alone=True)
    with spec_errors(src):
        return ClusterSpec(gpu=gpu, num_gpus=num_gpus, fabric=fabric)


def gpu_count(src: str, section: dict, key: str, gpus_per_node: int, names: tuple[str, str]) -> Optional[int]:
    """The GPUs a section gives as ``names[0]``, or as ``names[1]`` whole nodes; None if neither."""
    gpus, nodes = names
    if gpus in section and nodes in section:
        raise CaseError(src, f"{key}.{nodes}", f"give either {gpus} or {nodes} (with gpus_per_node), not both")
    if gpus in section:
        return read_int(src, f"{key}.{gpus}", section[gpus])
    if nodes in section:
        return read_int(src, f"{key}.{nodes}", section[nodes]) * gpus_per_node
    return None


def sizing_terms(src: str, section: dict, key: str, gpus_per_node: int) -> tuple[Optional[int], Optional[float]]:
    """`size`'s terms for one GPU type: the most GPUs it may use (max_gpus, or max_nodes whole
    nodes) and the price of a GPU-hour; None where the section gives none."""
    most = gpu_count(src, section, key, gpus_per_node, ("max_gpus", "max_nodes"))
    if most is not None and most > MAX_GPUS:
        raise CaseError(src, f"{key}.max_gpus", f"at most {MAX_GPUS} GPUs can be sized, got {most}")
    price = None
    if "gpu_hour_cost" in section:
        price = read_number(src, f"{key}.gpu_hour_cost", section["gpu_hour_cost"])
        if not 0 < price <= MAX_GPU_HOUR_COST:
            raise CaseError(src, f"{key}.gpu_hour_cost", f"expected a price per GPU-hour above 0 and at most "
                                                         f"{MAX_GPU_HOUR_COST:g}, got {price:g}")
    return most, price


def _training(src: str, section: Any) -> TrainingSpec:
    if isinstance(section, dict):
        for key in ("micro_batch_size", "tp", "pp", "dp", "zero_stage", "recompute"):
            if key in section:  # a layout key one section up: say where it belongs
                raise CaseError(src, f"training.{key}", f"belongs under layout (layout.{key}), not training")
    section = read_mapping(src, "training", section, TRAINING_KEYS)
    values: dict[str, Any] = {
        "global_batch_size": read_int(src, "training.global_batch_size",
                                  required(src, "training", section, "global_batch_size")),
        "seq_len": read_int(src, "training.seq_len", required(src, "training", section, "seq_len"),
                            maximum=MAX_SEQ_LEN),
    }
    for key in ("precision", "optimizer", "engine", "fp8_recipe", "expert_dispatch"):
        if key in section:
            values[key] = read_str(src, f"training.{key}", section[key])
    if "engine" in values:
        if values["engine"] not in CASE_ENGINES:
            raise CaseError(src, "training.engine",
                            f"expected one of {', '.join(CASE_ENGINES)}, got {values['engine']!r}")
        values["engine"] = ENGINES[values["engine"]].behaviour
    for key in ("flash_attention", "tp_comm_overlap", "fp32_grads", "moe_comm_overlap", "fp8_param_gather",
                "master_weights", "compiled_loss", "fused_attention"):
        if key in section:
            values[key] = read_bool(src, f"training.{key}", section[key])
    with spec_errors(src):
        return TrainingSpec(**values)


def cluster_profile(src: str, section: Any, base: Path) -> Optional[tuple[str, dict]]:
    """(path, data) of the hardware profile a cluster section names, None where it names none:
    its ``overheads`` (the allocator's, fitted to a team's runs) are the case's defaults."""
    if not isinstance(section, dict) or not isinstance(section.get("profile"), str):
        return None  # _cluster reports a malformed section
    path = Path(section["profile"])
    path = path if path.is_absolute() else base / path
    data = read_yaml(path)
    return str(path), data if isinstance(data, dict) else {}


# A fit whose relative rms error passes this gives a figure the user should not lean on silently.
FIT_ERROR_WARNING = 0.15


def profile_warnings(case: Any) -> list[str]:
    """What `estimate`, `plan` and `size` say on stderr of the hardware profile a case names: a
    `calibrate --quick` profile (a smoke test, not a measurement), and each fit in it whose relative
    rms error passes FIT_ERROR_WARNING."""
    try:
        data, src, base = read_case(case)
        found = cluster_profile(src, data.get("cluster") if isinstance(data, dict) else None, base)
    except CaseError:
        return []  # the command itself reports a case it cannot read
    if found is None:
        return []
    path, profile = found
    out = []
    machine = profile.get("machine") if isinstance(profile.get("machine"), dict) else {}
    if machine.get("quick"):
        out.append(f"{path} was written by `calibrate --quick`: a smoke test of tiny shapes, not this machine's "
                   "figures; calibrate without --quick before trusting an estimate on it")

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            error = node.get("rms_relative_error")
            if isinstance(error, (int, float)) and not isinstance(error, bool) and error > FIT_ERROR_WARNING:
                out.append(f"{path}: {where} fits its timings with a {error:.0%} rms error (above "
                           f"{FIT_ERROR_WARNING:.0%}): the figure it gives is uncertain")
            for key, value in node.items():
                if key != "points":
                    walk(value, f"{where}.{key}" if where else str(key))

    walk(profile.get("measurements"), "measurements")
    return out


def _overheads(src: str, section: Any, base: Overheads = Overheads()) -> Overheads:
    """The case's overheads over ``base`` (a fitted profile's, else the documented defaults)."""
    section = read_mapping(src, "overheads", section or {}, OVERHEAD_KEYS)
    values: dict[str, float] = {}
    for key in ("cuda_context", "comm_buffers"):
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
        values["recompute"] = read_str(src, f"{key}.recompute", section["recompute"])
    if section.get("recompute_num_layers") is not None:
        values["recompute_num_layers"] = read_int(src, f"{key}.recompute_num_layers",
                                              section["recompute_num_layers"], minimum=0)
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
            raise CaseError(src, f"{key}.tp", f"tp·pp·cp = {model_parallel} must divide the cluster's {num_gpus} GPUs")
        values["dp"] = num_gpus // model_parallel
    with spec_errors(src):
        return Layout(**values)


def layout_to_mapping(layout: Layout) -> dict[str, Any]:
    """The case-file ``layout`` section for ``layout``: what `plan` hands to `estimate`."""
    section: dict[str, Any] = {
        "dp": layout.dp, "tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "vpp": layout.vpp,
        "micro_batch_size": layout.micro_batch_size, "zero_stage": layout.zero_stage,
        "sequence_parallel": layout.sequence_parallel, "recompute": layout.recompute,
    }
    if layout.ep > 1 or layout.etp is not None:
        section["ep"] = layout.ep
        section["etp"] = layout.expert_tp
    if layout.recompute_num_layers is not None:
        section["recompute_num_layers"] = layout.recompute_num_layers
    if layout.recompute_modules is not None:
        section["recompute_modules"] = list(layout.recompute_modules)
    if layout.stage_layers is not None:
        section["stage_layers"] = list(layout.stage_layers)
    if layout.chunk_layers is not None:
        section["chunk_layers"] = list(layout.chunk_layers)
    for flag in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        if getattr(layout, flag):
            section[flag] = True
    for name in ("offload_optimizer", "offload_params", "offload_activations"):
        if getattr(layout, name):
            section[name] = getattr(layout, name)
    return section
