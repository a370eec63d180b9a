"""Published collective benchmarks (nccl-tests) against the cost model's collective times.

``planner/published/nccl_tests_p5_efa.yaml`` holds nccl-tests' all-reduce and all-gather bus
bandwidth on AWS p5 nodes (EFA) by message size and node count. :func:`log_errors` times each
point with ``cost_models.collectives.collective_time`` over the links the model gives a
data-parallel group of that many nodes on that fabric, and returns log(model time ÷ measured
time) per point: what ``bench/fit_fabric_latency.py`` fits the fabric's α to and
``tests/test_fabric_latency.py`` bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Optional

from cost_models.collectives import collective_time, volume_per_gpu
from cost_models.specs import ClusterSpec, Layout
from cost_models.topology import group_links

from .case import load_case
from .inputs import load_yaml

DATA = Path(__file__).resolve().parent / "published" / "nccl_tests_p5_efa.yaml"
MIB = 2**20


@dataclass(frozen=True)
class Point:
    kind: str  # "all_reduce" or "all_gather"
    nodes: int
    size_bytes: float  # the full buffer
    measured_s: float  # from nccl-tests' bus bandwidth and the volume its convention counts


@lru_cache(maxsize=None)
def load_points(path: Path = DATA) -> tuple[dict, tuple[Point, ...]]:
    """The file's header (source, GPU, fabric) and one point per (kind, nodes, size)."""
    data = load_yaml(path.read_text(encoding="utf-8"), str(path))
    per_node = data["gpus_per_node"]
    points = []
    for kind in ("all_reduce", "all_gather"):
        for nodes, series in data[kind].items():
            for size_mib, busbw_gb_s in series:
                size = size_mib * MIB
                # nccl-tests' bus bandwidth is the ring volume per GPU over the time
                # (doc/PERFORMANCE.md), the same volume collectives.volume_per_gpu counts.
                seconds = volume_per_gpu(kind, int(nodes) * per_node, size) / (busbw_gb_s * 1e9)
                points.append(Point(kind, int(nodes), size, seconds))
    return data, tuple(points)


@lru_cache(maxsize=None)
def _cluster(nodes: int) -> ClusterSpec:
    data, _ = load_points()
    gpus = nodes * data["gpus_per_node"]
    # A case resolves the GPU and fabric presets as a user's would; its model is only a placeholder.
    case = {"model": {"preset": "llama3-8b"},
            "cluster": {"gpu": data["gpu"], "num_gpus": gpus, "fabric": data["fabric"]},
            "training": {"global_batch_size": gpus, "seq_len": 4096}, "layout": {"dp": gpus, "micro_batch_size": 1}}
    return load_case(case).job().cluster


def cluster_for(nodes: int, fabric_changes: Optional[dict] = None) -> ClusterSpec:
    """The benchmark's cluster: ``nodes`` nodes of the file's GPU on its fabric preset, with any
    fabric fields replaced (the fit's trial values)."""
    cluster = _cluster(nodes)
    return replace(cluster, fabric=replace(cluster.fabric, **fabric_changes)) if fabric_changes else cluster


def log_errors(kind: str, fabric_changes: Optional[dict] = None) -> list[float]:
    """log(model ÷ measured) of every point of ``kind``, the whole cluster one collective group."""
    _, points = load_points()
    out = []
    for point in points:
        if point.kind != kind:
            continue
        cluster = cluster_for(point.nodes, fabric_changes)
        links = group_links(cluster, Layout(dp=cluster.num_gpus), "dp")
        modelled = collective_time(kind, point.size_bytes, links, cluster.gpu.performance)
        out.append(math.log(modelled / point.measured_s))
    return out


def rms(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values))
