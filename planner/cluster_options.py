"""The GPU types `size` may choose from: the case's cluster section, or each of its ``options``.

A cluster section describes one GPU type (``gpu`` or ``profile`` with its overrides) and, for
`size`, how many of them it may use (``max_gpus`` or ``max_nodes``; else ``num_gpus`` or
``nodes``) and the price of a GPU-hour (``gpu_hour_cost``). ``cluster.options`` lists several
such entries instead; one job runs on one of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from cost_models.specs import ClusterSpec, FabricSpec, GPUSpec

from .case_cluster import (CLUSTER_KEYS, HARDWARE_KEYS, SIZING_KEYS, cluster_hardware, cluster_profile, gpu_count,
                           sizing_terms)
from .errors import CaseError
from .fields import describe, read_mapping
from .fitted import check_fitted_figures_kept, read_fitted

# More types than any real procurement weighs; each is sized separately.
MAX_OPTIONS = 16


@dataclass(frozen=True)
class ClusterOption:
    """One GPU type a job may run on, how many of it there are, and what a GPU-hour costs."""

    key: str  # where the case gives it: "cluster" or "cluster.options[i]"
    gpu: GPUSpec
    fabric: FabricSpec
    max_gpus: Optional[int]  # None: the case sets no limit (then --max-gpus or --max-nodes must)
    gpu_hour_cost: Optional[float]
    # GPUs paid for per unit where the job uses fewer of each NVLink domain than it holds (72 where
    # it runs on 64 of each NVL72 rack: :func:`part_rack`); None: the unit, every GPU used.
    rack: Optional[int] = None
    # The ``fitted`` section of the profile it is given by, where a team's runs fitted it (what they
    # covered: an answer on this type outside it says so, as `plan` and `estimate` on the profile do).
    fitted: Optional[dict] = field(default=None, compare=False)
    # The key the case gives max_gpus by (cluster.nodes, cluster.options[1].max_nodes, ...): what a
    # note on the limit names. None where the case gives none (--max-gpus or --max-nodes must).
    limit_key: Optional[str] = field(default=None, compare=False)

    @property
    def unit(self) -> int:
        """GPUs a job uses at a time: whole nodes, or whole NVLink domains where one spans
        several nodes (an NVL72 rack), whose NVLink a job would otherwise share."""
        return math.lcm(self.gpu.gpus_per_node, max(self.gpu.nvlink_domain, 1))

    @property
    def paid_unit(self) -> int:
        """GPUs paid for per unit used: the whole rack, where the job uses part of each."""
        return self.rack or self.unit

    def paid_gpus(self, gpus: int) -> int:
        """The GPUs a job of ``gpus`` (whole units) takes from the cluster: what GPU-hours count."""
        return gpus // self.unit * self.paid_unit

    @property
    def unit_name(self) -> str:
        return "rack" if self.unit > self.gpu.gpus_per_node or self.rack else "node"

    @property
    def per_unit_text(self) -> str:
        """"" where the job uses every GPU of its units, else "64 GPUs of each 72"."""
        return f"{self.unit} GPUs of each {self.rack}" if self.rack else ""

    def cluster(self, num_gpus: int) -> ClusterSpec:
        return ClusterSpec(self.gpu, num_gpus, self.fabric)


def part_rack(option: ClusterOption) -> Optional[ClusterOption]:
    """The type run on part of each rack, where its NVLink domain spans several nodes: the most
    GPUs of each that are a node times a power of two (64 of an NVL72 rack's 72, 16 of its 18
    trays), paid for as whole racks. Model dimensions and batches split in powers of two, which
    72 GPUs a rack (2³·3²) leave a factor of 9 of: Llama 3 70B's 80 layers and 512 sequences on
    whole racks ran pp 9 with uneven stages. MLPerf Training v5.0's largest GB200 submission ran
    so: 2,496 GPUs on "39x NVIDIA GB200 NVL72", 624 trays of 4, 16 of each rack's 18
    (`../shared/validation/published_runs_2.yaml`, its Llama 3.1 405B row on Carina).
    None for a type whose unit is a node, or whose domain is a node times a power of two."""
    per_node, unit = option.gpu.gpus_per_node, option.unit
    if option.rack or unit <= per_node:
        return None
    used = per_node
    while used * 2 <= unit:
        used *= 2
    if used == unit:
        return None
    return replace(option, gpu=replace(option.gpu, nvlink_domain=used), rack=unit, fitted=None)


def with_part_racks(options: tuple[ClusterOption, ...]) -> tuple[ClusterOption, ...]:
    """Each type, followed by the same run on part of each rack where that can be better."""
    out: list[ClusterOption] = []
    for option in options:
        out += [option] + [p for p in (part_rack(option),) if p is not None]
    return tuple(out)


def read_cluster_options(src: str, section: Any, base: Path) -> tuple[ClusterOption, ...]:
    """The GPU types of a cluster section, each checked as a cluster section is."""
    section = read_mapping(src, "cluster", section, CLUSTER_KEYS)
    if "options" not in section:
        gpu, fabric = cluster_hardware(src, section, base)
        most, price = sizing_terms(src, section, "cluster", gpu.gpus_per_node)
        if most is None:  # the GPUs `plan` would use are the most `size` may
            most = gpu_count(src, section, "cluster", gpu.gpus_per_node, ("num_gpus", "nodes"))
        return (ClusterOption("cluster", gpu, fabric, most, price, fitted=_fitted(src, "cluster", section, base),
                              limit_key=_limit_key("cluster", section)),)
    beside = [k for k in section if k != "options"]
    if beside:
        raise CaseError(src, f"cluster.{beside[0]}", "give each GPU type's keys inside its cluster.options entry")
    entries = section["options"]
    if not isinstance(entries, list) or not entries:
        raise CaseError(src, "cluster.options", "expected a list of GPU types, at least one, got "
                                                + ("an empty list" if entries == [] else describe(entries)))
    if len(entries) > MAX_OPTIONS:
        raise CaseError(src, "cluster.options", f"expected at most {MAX_OPTIONS} GPU types, got {len(entries)}")
    options = []
    for i, entry in enumerate(entries):
        key = f"cluster.options[{i}]"
        entry = read_mapping(src, key, entry, HARDWARE_KEYS + SIZING_KEYS)
        gpu, fabric = cluster_hardware(src, entry, base, key)
        most, price = sizing_terms(src, entry, key, gpu.gpus_per_node)
        option = ClusterOption(key, gpu, fabric, most, price, fitted=_fitted(src, key, entry, base),
                               limit_key=_limit_key(key, entry))
        same = next((o.key for o in options if (o.gpu, o.fabric, o.gpu_hour_cost) == (gpu, fabric, price)), None)
        if same is not None:  # sized twice, it would be its own runner-up (a larger limit only adds sizes)
            raise CaseError(src, key, f"is the same GPU type, fabric and price as {same}: give each once, with "
                                      f"the larger limit")
        options.append(option)
    return tuple(options)


def _limit_key(key: str, section: dict) -> Optional[str]:
    """The key a GPU type's limit is read from, in the order sizing_terms and gpu_count take them."""
    return next((f"{key}.{name}" for name in ("max_gpus", "max_nodes", "num_gpus", "nodes") if name in section), None)


def _fitted(src: str, key: str, entry: dict, base: Path) -> Optional[dict]:
    """The ``fitted`` section of the profile a GPU type is given by (None: no profile, or one not fitted
    to runs), its fabric kept."""
    profile = cluster_profile(src, entry, base, key)
    fitted = read_fitted(profile[0], profile[1].get("fitted")) if profile else None
    check_fitted_figures_kept(src, key, entry, fitted)
    return fitted
