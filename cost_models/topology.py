"""The cluster as a graph, and which links each parallel group's collectives run over.

Nodes are GPUs, one NVSwitch per NVLink domain, one NIC per GPU and the
scale-out fabric (a non-blocking fat tree, as in DGX SuperPOD rail-optimised
designs, is one switch node here). Edge attribute ``bandwidth`` is bytes/s in one
direction. Ranks are placed in Megatron's order, tensor-parallel fastest, then
context, data and pipeline parallel (``megatron/core/parallel_state.py``,
``RankGenerator`` with order "tp-cp-ep-dp-pp"), rank r on GPU r.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

import networkx as nx

from .specs import ClusterSpec, Layout


@dataclass(frozen=True)
class GroupLinks:
    """Where one parallel group's ranks sit, and the bandwidth of the links between them."""

    size: int  # ranks in the group
    per_domain: int  # ranks of the group inside one NVLink domain
    domains: int  # NVLink domains the group spans
    intra_bandwidth: float  # bytes/s per GPU between members of one domain
    inter_bandwidth: float  # bytes/s per GPU between domains (the NIC)


def _graph(gpus: Iterable[int], domain: int, intra: float, inter: float) -> nx.Graph:
    """The graph over ``gpus`` (GPU indices), their NVSwitches and NICs, and the fabric."""
    graph = nx.Graph()
    graph.add_node("fabric", kind="switch")
    for gpu in gpus:
        switch = ("nvswitch", gpu // domain)
        graph.add_node(("gpu", gpu), kind="gpu", domain=gpu // domain)
        graph.add_edge(("gpu", gpu), switch, bandwidth=intra, link="nvlink")
        graph.add_edge(("gpu", gpu), ("nic", gpu), bandwidth=inter, link="network")
        graph.add_edge(("nic", gpu), "fabric", bandwidth=inter, link="network")
    return graph


def build_topology(cluster: ClusterSpec) -> nx.Graph:
    """The whole cluster as a graph (for inspection; the cost models use small subgraphs)."""
    gpu = cluster.gpu
    return _graph(range(cluster.num_gpus), gpu.nvlink_domain, gpu.intra_node_bandwidth, gpu.inter_node_bandwidth)


def _path_bandwidth(graph: nx.Graph, a: int, b: int) -> float:
    """Bottleneck bandwidth of the shortest path from GPU a to GPU b, NVLink preferred."""
    if graph.nodes[("gpu", a)]["domain"] == graph.nodes[("gpu", b)]["domain"]:
        path = [("gpu", a), ("nvswitch", graph.nodes[("gpu", a)]["domain"]), ("gpu", b)]
    else:
        path = nx.shortest_path(graph, ("gpu", a), ("gpu", b))
    return min(graph.edges[u, v]["bandwidth"] for u, v in zip(path, path[1:]))


ORDER = ("tp", "cp", "dp", "pp")


def group_shape(layout: Layout, dim: str) -> tuple[int, int]:
    """(stride, size) of a parallel group: tp, cp, dp, pp, or dp_cp (the gradient group,
    data parallel with context parallel folded in, which is contiguous in cp then dp)."""
    dims = dim.split("_")
    stride = 1
    for d in ORDER[:ORDER.index(min(dims, key=ORDER.index))]:
        stride *= getattr(layout, d)
    size = 1
    for d in dims:
        size *= getattr(layout, d)
    return stride, size


@lru_cache(maxsize=4096)
def _group_links(num_gpus: int, domain: int, intra: float, inter: float,
                 stride: int, size: int) -> GroupLinks:
    # The group of rank 0 stands for all groups (they are alike under Megatron's order).
    # Its members i·stride fall into NVLink domains arithmetically; the links come from the
    # graph over rank 0, its nearest neighbour inside its domain and its nearest outside.
    per_domain = max(1, min(size, -(-domain // stride))) if stride < domain else 1
    domains = -(-size // per_domain)
    same = stride if per_domain > 1 else None
    other = per_domain * stride if domains > 1 else None
    graph = _graph([0] + [r for r in (same, other) if r is not None], domain, intra, inter)
    intra_bw = _path_bandwidth(graph, 0, same) if same is not None else intra
    inter_bw = _path_bandwidth(graph, 0, other) if other is not None else inter
    return GroupLinks(size, per_domain, domains, intra_bw, inter_bw)


def group_links(cluster: ClusterSpec, layout: Layout, dim: str) -> GroupLinks:
    gpu = cluster.gpu
    return _group_links(cluster.num_gpus, gpu.nvlink_domain, gpu.intra_node_bandwidth,
                        gpu.inter_node_bandwidth, *group_shape(layout, dim))
