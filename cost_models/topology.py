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


@lru_cache(maxsize=8)
def _graph(num_gpus: int, domain: int, intra: float, inter: float) -> nx.Graph:
    graph = nx.Graph()
    graph.add_node("fabric", kind="switch")
    for gpu in range(num_gpus):
        switch = ("nvswitch", gpu // domain)
        graph.add_node(("gpu", gpu), kind="gpu", domain=gpu // domain)
        graph.add_edge(("gpu", gpu), switch, bandwidth=intra, link="nvlink")
        graph.add_edge(("gpu", gpu), ("nic", gpu), bandwidth=inter, link="network")
        graph.add_edge(("nic", gpu), "fabric", bandwidth=inter, link="network")
    return graph


def build_topology(cluster: ClusterSpec) -> nx.Graph:
    gpu = cluster.gpu
    return _graph(cluster.num_gpus, gpu.nvlink_domain, gpu.intra_node_bandwidth, gpu.inter_node_bandwidth)


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
    graph = _graph(num_gpus, domain, intra, inter)
    members = [i * stride for i in range(size)]  # the group of rank 0; all groups are alike
    domains = {graph.nodes[("gpu", r)]["domain"] for r in members}
    per_domain = size // len(domains)
    first = members[0]
    same = [r for r in members[1:] if graph.nodes[("gpu", r)]["domain"] == graph.nodes[("gpu", first)]["domain"]]
    other = [r for r in members[1:] if r not in same]
    intra_bw = _path_bandwidth(graph, first, same[0]) if same else intra
    inter_bw = _path_bandwidth(graph, first, other[0]) if other else inter
    return GroupLinks(size, per_domain, len(domains), intra_bw, inter_bw)


def group_links(cluster: ClusterSpec, layout: Layout, dim: str) -> GroupLinks:
    gpu = cluster.gpu
    return _group_links(cluster.num_gpus, gpu.nvlink_domain, gpu.intra_node_bandwidth,
                        gpu.inter_node_bandwidth, *group_shape(layout, dim))
