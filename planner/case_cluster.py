"""The ``cluster`` section of a case: the GPU (a preset, a calibrated profile or figures given
inline), its host, the fabric, what each GPU achieves, how many there are, and the sizing terms."""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Optional

from cost_models.hardware import GPU_VENDORS
from cost_models.spec_checks import SpecError
from cost_models.specs import BLOCK_SCALED_FORMATS, ClusterSpec, FabricSpec, GPUSpec, HostSpec, Performance

from .case_errors import case_key, case_message, field_key, spec_errors
from .errors import CaseError
from .fields import (canonical_choice, describe, read_bool, read_choice, read_figure, read_file_path, read_for,
                     read_int, read_mapping, read_number, read_price, read_str, read_time, read_unit, required)
from .inputs import read_yaml
from .limits import (MAX_COMPUTE_CAPABILITY_MAJOR, MAX_FABRIC_EFFICIENCY, MAX_GPUS,
                     MAX_PEAK_TFLOPS, MAX_SM_COUNT, MIN_FIGURE)
from .presets import closest, fabric_presets, gpu_presets, performance_presets, resolve_gpu_preset
from .units import parse_bandwidth, parse_memory


GPU_KEYS = ("memory", "peak_tflops", "hbm_bandwidth", "intra_node_bandwidth", "inter_node_bandwidth",
            "gpus_per_node", "nvlink_domain", "sm_count", "fabric", "host", "block_scaling", "vendor",
            "compute_capability_major")

# A GPU preset may name the fabric of its reference system; the cluster's fabric overrides it.
# ``host`` (what offload reaches) is the reference system's too; ``cluster.host`` overrides it.
OPTIONAL_GPU_KEYS = ("sm_count", "fabric", "host", "block_scaling", "vendor", "compute_capability_major")

PEAK_KEYS = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4")


HOST_KEYS = ("memory", "link_bandwidth", "memory_bandwidth")

FABRIC_KEYS = tuple(f.name for f in fields(FabricSpec) if f.name != "name") + ("nic_bandwidth",)


# What one GPU type is, as a cluster section (or each of `size`'s cluster.options) gives it.
HARDWARE_KEYS = ("gpu", "profile", "gpus_per_node", "nvlink_domain", "intra_node_bandwidth", "inter_node_bandwidth",
                 "memory", "performance", "fabric", "host")

# `size` only: the most GPUs of a type it may use, and their price (planner/cluster_options.py).
SIZING_KEYS = ("max_gpus", "max_nodes", "gpu_hour_cost")

CLUSTER_KEYS = HARDWARE_KEYS + ("num_gpus", "nodes") + SIZING_KEYS + ("options",)


PERFORMANCE_KEYS = tuple(f.name for f in fields(Performance))

INTEGER_PERFORMANCE_KEYS = ("gemm_tile_m", "gemm_tile_n", "gemm_split_k")


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
    try:
        return GPUSpec(
            name=name,
            memory_bytes=read_unit(src, f"{key}.memory", data["memory"], parse_memory),
            peak_flops={p: read_figure(src, f"{key}.peak_tflops.{p}", v, MAX_PEAK_TFLOPS) * 1e12
                        for p, v in peaks.items()},
            hbm_bandwidth=read_unit(src, f"{key}.hbm_bandwidth", data["hbm_bandwidth"], parse_bandwidth),
            intra_node_bandwidth=read_unit(src, f"{key}.intra_node_bandwidth", data["intra_node_bandwidth"],
                                       parse_bandwidth),
            inter_node_bandwidth=read_unit(src, f"{key}.inter_node_bandwidth", data["inter_node_bandwidth"],
                                       parse_bandwidth),
            gpus_per_node=read_int(src, f"{key}.gpus_per_node", data["gpus_per_node"], maximum=MAX_GPUS),
            nvlink_domain=read_int(src, f"{key}.nvlink_domain", data["nvlink_domain"], maximum=MAX_GPUS),
            sm_count=read_int(src, f"{key}.sm_count", data["sm_count"], maximum=MAX_SM_COUNT) if "sm_count" in data
            else None,
            host=host_from_mapping(src, f"{key}.host", data["host"]) if "host" in data else None,
            # NVIDIA writes MXFP8, NVFP4 and nvidia-smi NVIDIA: read as the case's other choices are
            block_scaling=tuple(canonical_choice(f, BLOCK_SCALED_FORMATS) for f in formats),
            vendor=read_choice(src, f"{key}.vendor", data["vendor"], GPU_VENDORS) if "vendor" in data else "nvidia",
            compute_capability_major=read_int(src, f"{key}.compute_capability_major", data["compute_capability_major"],
                                              maximum=MAX_COMPUTE_CAPABILITY_MAJOR)
            if "compute_capability_major" in data else None,
        )
    except SpecError as error:  # named where the mapping sits: a profile's gpu, cluster.options[1].gpu, a preset
        raise CaseError(src, f"{key}.{field_key(error.spec, error.field)}", case_message(error.message)) from None


def host_from_mapping(src: str, key: str, data: Any, base: Optional[HostSpec] = None) -> HostSpec:
    """What offload reaches: host memory, the GPU↔host link and host DRAM bandwidth, per GPU. Over a
    GPU that has a host (``base``: its preset's reference system), the keys given replace its figures
    and the rest stay, as ``performance`` overrides its GPU's: a case saying only its hosts' memory was
    refused, "cluster.host.link_bandwidth: missing". A GPU without one needs every key."""
    data = read_mapping(src, key, data, HOST_KEYS)
    if base is None:
        for k in HOST_KEYS:
            required(src, key, data, k)
    values = {"memory_bytes": ("memory", parse_memory), "link_bandwidth": ("link_bandwidth", parse_bandwidth),
              "memory_bandwidth": ("memory_bandwidth", parse_bandwidth)}
    with spec_errors(src):
        return HostSpec(**{field: read_unit(src, f"{key}.{name}", data[name], parse) if name in data
                           else getattr(base, field) for field, (name, parse) in values.items()})


def fabric_from_mapping(src: str, key: str, name: str, data: Any) -> tuple[FabricSpec, Optional[float]]:
    """A FabricSpec (and the NIC line rate per GPU it sets, if any) from a preset entry or an
    inline mapping with the same fields."""
    data = read_mapping(src, key, {} if data is None else data, FABRIC_KEYS)
    values: dict[str, Any] = {"name": name}
    # The efficiencies divide the fabric's time (below MIN_FIGURE a step would be endless); the
    # oversubscription divides its rate likewise; rails counts NICs.
    for k in ("efficiency", "alltoall_efficiency"):
        if k in data:
            values[k] = read_figure(src, f"{key}.{k}", data[k], MAX_FABRIC_EFFICIENCY)
    for k in ("latency_s", "tree_latency_s"):
        if k in data:
            values[k] = read_time(src, f"{key}.{k}", data[k])
    if "oversubscription" in data:
        values["oversubscription"] = read_number(src, f"{key}.oversubscription", data["oversubscription"])
        if values["oversubscription"] > 1 / MIN_FIGURE:
            raise CaseError(src, f"{key}.oversubscription", f"expected at most {1 / MIN_FIGURE:g}, "
                                                           f"got {values['oversubscription']:g}")
    for k in ("rails", "leaf_nodes"):
        if k in data:
            values[k] = read_int(src, f"{key}.{k}", data[k])
    if "efficiency_at" in data:
        points = data["efficiency_at"]
        if not isinstance(points, list) or not all(isinstance(p, list) and len(p) == 2 for p in points):
            raise CaseError(src, f"{key}.efficiency_at", f"expected a list of [nodes, efficiency] pairs, got {describe(points)}")
        values["efficiency_at"] = tuple((read_int(src, f"{key}.efficiency_at", n),
                                         read_figure(src, f"{key}.efficiency_at", e, MAX_FABRIC_EFFICIENCY))
                                        for n, e in points)
    nic = read_unit(src, f"{key}.nic_bandwidth", data["nic_bandwidth"], parse_bandwidth) if "nic_bandwidth" in data else None
    with spec_errors(src):
        return FabricSpec(**values), nic


def _fabric(src: str, entry: Any, key: str) -> tuple[FabricSpec, Optional[float]]:
    """A fabric named by a preset, or given as a mapping."""
    if isinstance(entry, str):
        presets = fabric_presets()
        entry = canonical_choice(entry, presets)  # "InfiniBand-NDR", as GPU presets read in any letter case
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
    try:
        return replace(base, **values)
    except SpecError as error:  # named where the section sits (cluster.options[1].performance, say)
        raise CaseError(src, f"{key}.{error.field}", error.message) from None


def domain_used(src: str, key: str, value: Any, per_node: int, domain: int) -> int:
    """The GPUs of each NVLink domain a job uses (``cluster.nvlink_domain``): whole nodes of a domain that
    spans several (64 of an NVL72 rack's 72: 16 of its 18 trays, as MLPerf Training v5.0's 2,496 GB200s
    ran in 39 racks), or a part of a node's; never more than the GPU's domain.
    Ranks fill one domain's GPUs before the next (``cost_models.topology``)."""
    used = read_int(src, key, value)
    if used > domain or (used % per_node and per_node % used):
        raise CaseError(src, key, f"expected whole nodes of {per_node} GPUs (or a part of one that divides it), "
                                  f"at most the GPU's NVLink domain of {domain}, got {used}")
    return used


def _cluster_overrides(src: str, section: dict, key: str, gpu_host: Optional[HostSpec]) -> dict[str, Any]:
    """GPUSpec fields the cluster section sets over its GPU's (a different NIC, a smaller node, a host
    whose figures it gives over ``gpu_host``, the GPU's)."""
    overrides: dict[str, Any] = {}
    if "memory" in section:
        overrides["memory_bytes"] = read_unit(src, f"{key}.memory", section["memory"], parse_memory)
    for k in ("intra_node_bandwidth", "inter_node_bandwidth"):
        if k in section:
            overrides[k] = read_unit(src, f"{key}.{k}", section[k], parse_bandwidth)
    if "gpus_per_node" in section:
        overrides["gpus_per_node"] = read_int(src, f"{key}.gpus_per_node", section["gpus_per_node"], maximum=MAX_GPUS)
    if "host" in section:
        overrides["host"] = host_from_mapping(src, f"{key}.host", section["host"], gpu_host)
    return overrides


# What a profile's gpu section holds beside a GPU preset's fields: on a CPU, what a rank's process
# holds outside its tensors (`calibrate` measures it; Overheads.cpu_process).
PROCESS_KEY = "cpu_process"

PROFILE_KEYS = ("machine", "gpu", "performance", "fabric", "alone", "measurements", "overheads", "fitted")

ALONE_KEYS = ("peak_tflops", "hbm_bandwidth", "performance")


# What a profile's machine section may say, where anything reads it: how `calibrate` ran
# (calibration/profile.py, worker.py, launch.py) or, for `calibrate --from-runs`, where its figures
# came from (planner/learn.py). The backend decides whether `validate` runs on GPUs; quick, the
# CPU or GPU model and the reference GEMM's speed decide what `validate` refuses.
MACHINE_BACKENDS = ("gloo", "nccl")
MACHINE_STRINGS = ("hostname", "device", "cpu", "gpu", "torch", "nccl", "date", "case", "gpu_preset", "source",
                   "fabric")
MACHINE_COUNTS = ("world_size", "local_world_size", "nodes", "threads_per_rank")


def read_machine(src: str, value: Any) -> dict:
    """A profile's ``machine`` section with the keys it reads checked ({} where it has none): a
    ``quick: "yes"`` skipped `validate`'s refusal of a --quick profile, a ``cpu: 5`` its check of the
    CPU model, ``backend: NCCL`` ran as gloo, an infinite reference GEMM was printed as Infinity in
    ``--json``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CaseError(src, "machine", f"expected a mapping, got {describe(value)}")
    for key in MACHINE_STRINGS:
        if value.get(key) is not None:  # a CPU profile's gpu (and nccl) is null
            read_str(src, f"machine.{key}", value[key])
    if "backend" in value and value["backend"] not in MACHINE_BACKENDS:
        raise CaseError(src, "machine.backend", f"expected one of {', '.join(MACHINE_BACKENDS)}, "
                                                f"got {describe(value['backend'])}")
    if "quick" in value:
        read_bool(src, "machine.quick", value["quick"])
    for key in MACHINE_COUNTS:
        if key in value:
            read_int(src, f"machine.{key}", value[key], maximum=MAX_GPUS)
    if "other_cpu_share" in value:
        share = read_number(src, "machine.other_cpu_share", value["other_cpu_share"])
        if not 0 <= share <= 1:
            raise CaseError(src, "machine.other_cpu_share", f"expected a share from 0 to 1, got {describe(share)}")
    if "reference_gemm_tflops" in value:
        timed = read_mapping(src, "machine.reference_gemm_tflops", value["reference_gemm_tflops"], ("before", "after"))
        for key, figure in timed.items():
            read_figure(src, f"machine.reference_gemm_tflops.{key}", figure, MAX_PEAK_TFLOPS)
    return value


# `calibrate` writes each fitted figure in ``performance`` and in its fit under ``measurements`` from one
# number at 4 significant figures (calibration/profile.py, ``sig``), so the two are equal. Rounding that
# number to 4 figures moves it by at most half a unit of the fourth, 0.05 % of it (a leading 1): 0.1 % leaves
# room for a copy rewritten from the unrounded fit, and none for a figure rescaled or measured again (the
# development profile's two copies of its attention figure differed by 17 %).
FITTED_COPY_REL_TOL = 1e-3


def _fitted_copies(measurements: dict) -> dict[str, tuple[str, list[tuple[str, float]]]]:
    """Each ``performance`` key a calibrated profile's measurements fitted: where its fit is, and the figures
    it may equal, each with its fit (several for ``kernel_overhead_s``: the training precision's GEMM fit
    gives it, and the file does not name that precision; a figure that is no number is not compared: the
    cost model never reads it)."""
    def number(fit: dict, key: str, where: str) -> list[tuple[str, float]]:
        value = fit.get(key)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return [(where, float(value))] if ok else []

    wanted: dict[str, tuple[str, list[tuple[str, float]]]] = {}
    gemm = measurements.get("gemm")
    if isinstance(gemm, dict):
        fitted = [p for p, section in gemm.items() if isinstance(section, dict) and isinstance(section.get("fit"), dict)]
        sixteen_bit = next((p for p in ("bf16", "fp16") if p in fitted), None)
        for precision in fitted:
            fit, where = gemm[precision]["fit"], f"measurements.gemm.{precision}.fit"
            if "kernel_overhead_s" in fit:
                first, figures = wanted.get("kernel_overhead_s", (where, []))
                wanted["kernel_overhead_s"] = (first, figures + number(fit, "kernel_overhead_s", where))
            if "gemm_efficiency" in fit:
                if precision == "fp32" and sixteen_bit:
                    wanted["gemm_efficiency_fp32"] = (where, number(fit, "gemm_efficiency", where))
                elif precision == (sixteen_bit or precision):
                    wanted["gemm_efficiency"] = (where, number(fit, "gemm_efficiency", where))
    attention = measurements.get("attention")
    if isinstance(attention, dict) and isinstance(attention.get("fit"), dict) \
            and "attention_efficiency" in attention["fit"]:
        where = "measurements.attention.fit"
        wanted["attention_efficiency"] = (where, number(attention["fit"], "attention_efficiency", where))
    return wanted


def check_fitted_copies(src: str, performance: Any, measurements: Any, section: str = "performance",
                        required: bool = True) -> None:
    """Refuse a profile whose performance section lacks a figure its measurements section fitted, or states
    one that disagrees with that fit beyond rounding (:data:`FITTED_COPY_REL_TOL`).

    `calibrate` writes each GEMM and attention figure twice (calibration/profile.py): in ``performance``,
    which the cost model reads, and in the fit under ``measurements`` it came from. Every key of
    ``performance`` is optional (a hand-written or runs-fitted profile states what it knows), so one
    deleted from a calibrated profile was priced on Performance()'s generic default (GEMMs at 0.75 of the
    peak, no kernel overhead) with no word; and one edited (or rescaled by hand, as the development
    profile's attention figure was) priced a figure no measurement gave while the file showed the fitted one.
    The GEMM fit of a 16-bit precision gives ``gemm_efficiency`` and an fp32 one beside it
    ``gemm_efficiency_fp32``; alone, a precision's fit gives ``gemm_efficiency``. ``section`` names the
    performance section (``alone.performance`` holds rank 0's figures, fitted under
    ``measurements.alone``); without ``required``, a figure it leaves out is not refused (it falls back to
    the section above it)."""
    if not isinstance(measurements, dict) or not isinstance(performance, dict):
        return  # a malformed section is named where it is read; no measurements, nothing fitted to hold to
    for key, (where, figures) in _fitted_copies(measurements).items():
        if key not in performance:
            if required:
                raise CaseError(src, f"{section}.{key}", f"missing: expected the figure {where} gives, which "
                                                         "`calibrate` writes in both (a generic default would stand "
                                                         "in for this machine's); calibrate again")
            continue
        stated = performance[key]
        if figures and not any(math.isclose(stated, f, rel_tol=FITTED_COPY_REL_TOL) for _, f in figures):
            fitted = " or ".join(f"the {f:g} of {fit}" for fit, f in figures)
            raise CaseError(src, f"{section}.{key}", f"{stated:g} disagrees with {fitted}, which "
                                                     "`calibrate` writes as the same figure (an edited or damaged "
                                                     "file); calibrate again, or make the two agree")


def gpu_from_profile(path: Path, alone: bool = False) -> tuple[GPUSpec, Optional[FabricSpec]]:
    """The measured GPU of a hardware profile written by `layout-planner calibrate`, and its
    measured fabric where the profile has one (:func:`gpu_of_profile` of the file's contents)."""
    return gpu_of_profile(str(path), read_yaml(path), alone)


def inline_profile(src: str, key: str) -> str:
    """What an error names a profile given inline (a mapping at the case's ``key``, as
    `calibrate_from_runs` returns it) by, where it names a profile file by its path: the case and the key
    (``<case>: cluster.profile``), the profile's own key after it (``<case>: cluster.profile: gpu.memory``)."""
    return f"{src}: {key}"


def read_profile(src: str, key: str, value: Any, base: Path) -> tuple[str, Any, Optional[Path]]:
    """The hardware profile a cluster section gives at ``key`` (``cluster.profile``): (what its errors
    name it by, its contents, its file). A path is a profile file's, relative to the case (its YAML);
    a mapping is the profile itself, in the file's schema (what `calibrate_from_runs` and
    `calibrate_from_logs` return, which an API caller hands on without writing it), its file None."""
    if isinstance(value, dict):
        return inline_profile(src, key), value, None
    if not isinstance(value, str):
        raise CaseError(src, key, f"expected a profile file's path, or the profile itself (a mapping in the file's "
                                  f"schema: the first of what calibrate_from_runs returns), got {describe(value)}")
    path = read_file_path(src, key, value, base)
    with read_for(src, key, path):
        return str(path), read_yaml(path), path


def gpu_of_profile(src: str, data: Any, alone: bool = False) -> tuple[GPUSpec, Optional[FabricSpec]]:
    """The measured GPU of a hardware profile's contents (``src``: what errors name it by, its file's
    path or :func:`inline_profile`), and its measured fabric where the profile has one.

    A profile holds ``gpu`` (the fields of a GPU preset, with measured figures),
    ``performance`` and ``fabric`` (the fitted achieved figures), ``machine`` and ``measurements``,
    and ``alone``: the compute and memory figures measured with one rank running, which a case of
    one rank (``alone``) takes where the profile has them.
    """
    data = read_mapping(src, "", data, PROFILE_KEYS)
    name = read_machine(src, data.get("machine")).get("device") or "profiled"
    gpu_data = required(src, "", data, "gpu")
    if isinstance(gpu_data, dict) and PROCESS_KEY in gpu_data:
        # Checked here, whichever case reads the profile; the case's overheads take it (planner/case.py).
        profile_process_bytes(src, data)
        gpu_data = {k: v for k, v in gpu_data.items() if k != PROCESS_KEY}
    # An empty section (null) is none; false, 0 or [] is no mapping (they were taken as none). Without
    # one, Performance()'s generic figures stand in: said on stderr (case.profile_warnings).
    performance = performance_from_mapping(src, "performance", _section(data, "performance"), Performance())
    check_fitted_copies(src, _section(data, "performance"), data.get("measurements"))
    gpu = gpu_from_mapping(src, "gpu", name, gpu_data)
    if data.get("alone") is not None:
        # Checked whichever case reads the profile (a malformed section passed where no one-rank case
        # read it), its figures named as the section holds them (alone.peak_tflops.fp32, not gpu.…).
        one = read_mapping(src, "alone", data["alone"], ALONE_KEYS)
        merged = gpu_data
        if isinstance(gpu_data, dict):
            # Rank 0 timed the training precision alone: the other precisions keep their figures.
            peaks = gpu_data.get("peak_tflops")
            # Read as gpu.peak_tflops is: a figure that is no mapping (`peak_tflops: 5`) was passed over,
            # and a case of one rank priced at the peak all ranks shared, with no word.
            alone_peaks = read_mapping(src, "alone.peak_tflops", one["peak_tflops"], PEAK_KEYS) \
                if "peak_tflops" in one else {}
            if isinstance(peaks, dict):
                merged = {**gpu_data, "peak_tflops": {**peaks, **alone_peaks}}
            if "hbm_bandwidth" in one:
                merged = {**merged, "hbm_bandwidth": one["hbm_bandwidth"]}
        gpu_alone = gpu_from_mapping(src, "alone", name, merged)
        performance_alone = performance_from_mapping(src, "alone.performance", _section(one, "performance"),
                                                     performance)
        measured = data.get("measurements")
        check_fitted_copies(src, _section(one, "performance"),
                               measured.get("alone") if isinstance(measured, dict) else None, "alone.performance",
                               required=False)
        if alone:
            gpu, performance = gpu_alone, performance_alone
    fabric = fabric_from_mapping(src, "fabric", "measured", data["fabric"])[0] if data.get("fabric") is not None \
        else None
    with spec_errors(src):
        return replace(gpu, performance=performance), fabric


def profile_process_bytes(src: str, data: Any) -> Optional[float]:
    """What a rank's process holds outside its tensors as a profile's ``gpu.cpu_process`` gives it (bytes),
    None where it gives none (a profile written before `calibrate` measured it, a GPU's, one fitted to runs):
    the case then takes ``Overheads.cpu_process``, the development machine's."""
    gpu = data.get("gpu") if isinstance(data, dict) else None
    if not isinstance(gpu, dict) or PROCESS_KEY not in gpu:
        return None
    return read_unit(src, f"gpu.{PROCESS_KEY}", gpu[PROCESS_KEY], parse_memory)


def _section(data: dict, key: str) -> Any:
    """A profile section, {} where the file leaves it out or empty (null)."""
    value = data.get(key)
    return {} if value is None else value


def cluster_hardware(src: str, section: dict, base: Path, key: str = "cluster", alone: bool = False) \
        -> tuple[GPUSpec, FabricSpec]:
    """The GPU type a cluster section (``key``: where it sits in the case) describes, with the
    section's overrides, and its fabric; a profile's single-rank figures where ``alone``."""
    if "profile" in section:
        if "gpu" in section:
            raise CaseError(src, f"{key}.profile", "give either gpu or profile, not both")
        gpu_entry = None
        where, data, path = read_profile(src, f"{key}.profile", section["profile"], base)
        with read_for(src, f"{key}.profile", path) if path is not None else nullcontext():
            gpu, profile_fabric = gpu_of_profile(where, data, alone)
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
    elif "profile" not in section:  # null included: `gpu:` with nothing after it
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
    overrides.update(_cluster_overrides(src, section, key, gpu.host))
    per_node = overrides.get("gpus_per_node")
    if per_node is not None and gpu.nvlink_domain == gpu.gpus_per_node and per_node < gpu.nvlink_domain:
        # The preset's NVLink domain is its node (an HGX board): a smaller node is a smaller domain,
        # and tensor parallelism across two 4-GPU nodes is not NVLink's.
        overrides["nvlink_domain"] = per_node
    if "nvlink_domain" in section:
        overrides["nvlink_domain"] = domain_used(src, f"{key}.nvlink_domain", section["nvlink_domain"],
                                                 per_node or gpu.gpus_per_node, gpu.nvlink_domain)
    if "performance" in section:
        overrides["performance"] = performance_from_mapping(src, f"{key}.performance", section["performance"],
                                                            gpu.performance)
    try:
        return replace(gpu, **overrides), fabric
    except SpecError as error:
        if error.field == "nvlink_domain" and per_node is not None and "nvlink_domain" not in section:
            # The GPU's domain kept, the node the case gave breaks GPUSpec's rule: 12 H100s a node would
            # join GPUs 8-15 of two nodes in one NVLink domain of 8.
            raise CaseError(src, f"{key}.gpus_per_node", f"expected a multiple of the GPU's NVLink domain of "
                                                         f"{gpu.nvlink_domain} GPUs or a divisor of it, got {per_node}") from None
        raise CaseError(src, case_key(error), case_message(error.message)) from None


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
    if num_gpus > MAX_GPUS:  # 2^62 nodes were refused as the global batch's, which no dp divides
        if "nodes" in section:
            raise CaseError(src, "cluster.nodes", f"expected at most {MAX_GPUS // gpu.gpus_per_node} nodes of "
                                                  f"{gpu.gpus_per_node} GPUs ({MAX_GPUS} GPUs), got {section['nodes']}")
        raise CaseError(src, "cluster.num_gpus", f"expected at most {MAX_GPUS} GPUs, got {num_gpus}")
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
        if "max_nodes" in section:  # named as written: the nodes, not the GPUs they make
            raise CaseError(src, f"{key}.max_nodes", f"at most {MAX_GPUS // gpus_per_node} nodes of {gpus_per_node} "
                                                     f"GPUs ({MAX_GPUS} GPUs) can be sized, got {most // gpus_per_node}")
        raise CaseError(src, f"{key}.max_gpus", f"at most {MAX_GPUS} GPUs can be sized, got {most}")
    price = None
    if "gpu_hour_cost" in section:
        price = read_price(src, f"{key}.gpu_hour_cost", section["gpu_hour_cost"])
    return most, price


def cluster_profile(src: str, section: Any, base: Path, key: str = "cluster") -> Optional[tuple[str, dict]]:
    """(path, data) of the hardware profile a cluster section (at ``key``) names, None where it names
    none: its ``overheads`` (the allocator's, fitted to a team's runs) are the case's defaults. A
    profile given inline is named as its errors name it (:func:`inline_profile`)."""
    if isinstance(section, dict) and isinstance(section.get("profile"), dict):
        return inline_profile(src, f"{key}.profile"), section["profile"]
    if not isinstance(section, dict) or not isinstance(section.get("profile"), str):
        return None  # _cluster reports a malformed section
    path = Path(section["profile"])
    path = path if path.is_absolute() else base / path
    with read_for(src, f"{key}.profile", path):
        data = read_yaml(path)
    return str(path), data if isinstance(data, dict) else {}

