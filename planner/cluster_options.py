"""The GPU types `size` may choose from: the case's cluster section, or each of its ``options``.

A cluster section describes one GPU type (``gpu`` or ``profile`` with its overrides) and, for
`size`, how many of them it may use (``max_gpus`` or ``max_nodes``; else ``num_gpus`` or
``nodes``) and the price of a GPU-hour (``gpu_hour_cost``). ``cluster.options`` lists several
such entries instead; one job runs on one of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from cost_models.specs import ClusterSpec, FabricSpec, GPUSpec

from .case_cluster import CLUSTER_KEYS, HARDWARE_KEYS, SIZING_KEYS, cluster_hardware, gpu_count, sizing_terms
from .errors import CaseError
from .fields import describe, read_mapping

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

    @property
    def unit(self) -> int:
        """GPUs a job takes at a time: whole nodes, or whole NVLink domains where one spans
        several nodes (an NVL72 rack), whose NVLink a job would otherwise share."""
        return math.lcm(self.gpu.gpus_per_node, max(self.gpu.nvlink_domain, 1))

    @property
    def unit_name(self) -> str:
        return "rack" if self.unit > self.gpu.gpus_per_node else "node"

    def cluster(self, num_gpus: int) -> ClusterSpec:
        return ClusterSpec(self.gpu, num_gpus, self.fabric)


def read_cluster_options(src: str, section: Any, base: Path) -> tuple[ClusterOption, ...]:
    """The GPU types of a cluster section, each checked as a cluster section is."""
    section = read_mapping(src, "cluster", section, CLUSTER_KEYS)
    if "options" not in section:
        gpu, fabric = cluster_hardware(src, section, base)
        most, price = sizing_terms(src, section, "cluster", gpu.gpus_per_node)
        if most is None:  # the GPUs `plan` would use are the most `size` may
            most = gpu_count(src, section, "cluster", gpu.gpus_per_node, ("num_gpus", "nodes"))
        return (ClusterOption("cluster", gpu, fabric, most, price),)
    beside = [k for k in section if k != "options"]
    if beside:
        raise CaseError(src, f"cluster.{beside[0]}", "give each GPU type's keys inside its cluster.options entry")
    entries = section["options"]
    if not isinstance(entries, list) or not entries:
        raise CaseError(src, "cluster.options", f"expected a list of GPU types, got {describe(entries)}")
    if len(entries) > MAX_OPTIONS:
        raise CaseError(src, "cluster.options", f"expected at most {MAX_OPTIONS} GPU types, got {len(entries)}")
    options = []
    for i, entry in enumerate(entries):
        key = f"cluster.options[{i}]"
        entry = read_mapping(src, key, entry, HARDWARE_KEYS + SIZING_KEYS)
        gpu, fabric = cluster_hardware(src, entry, base, key)
        most, price = sizing_terms(src, entry, key, gpu.gpus_per_node)
        option = ClusterOption(key, gpu, fabric, most, price)
        same = next((o.key for o in options if (o.gpu, o.fabric, o.gpu_hour_cost) == (gpu, fabric, price)), None)
        if same is not None:  # sized twice, it would be its own runner-up (a larger limit only adds sizes)
            raise CaseError(src, key, f"is the same GPU type, fabric and price as {same}: give each once, with "
                                      f"the larger limit")
        options.append(option)
    return tuple(options)
