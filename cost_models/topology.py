"""The cluster as a graph, and which links each parallel group's collectives run over.

Nodes are GPUs, one NVSwitch per NVLink domain, one NIC per GPU, the leaf switches of a
rail-optimised fabric (one per rail, i.e. per local GPU index, and per group of
``FabricSpec.leaf_nodes`` nodes, as in a DGX SuperPOD scalable unit) and the spine above
them. Edge attribute ``bandwidth`` is bytes/s per GPU in one direction; a leaf's uplink
to the spine carries 1/oversubscription of what its NICs bring in. Ranks are placed in
Megatron's order, tensor-parallel fastest, then context, data and pipeline parallel
(``megatron/core/parallel_state.py``, ``RankGenerator`` with order "tp-cp-ep-dp-pp"),
rank r on GPU r.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Iterable, Optional

from .hardware import ClusterSpec, FabricSpec
from .layout_spec import Layout

if TYPE_CHECKING:  # networkx takes ~0.1 s to import: only the whole-cluster view for inspection loads it
    import networkx as nx


@dataclass(frozen=True)
class GroupLinks:
    """Where one parallel group's ranks sit, and what the links between them carry."""

    size: int  # ranks in the group
    per_domain: int  # ranks of the group inside one NVLink domain
    domains: int  # NVLink domains the group spans
    intra_bandwidth: float  # nominal bytes/s per GPU between members of one domain
    # Achieved bytes/s of one NIC between the group's domains: the line rate, times the
    # fabric's efficiency at the group's span, over any spine oversubscription it crosses.
    inter_bandwidth: float
    inter_latency: float = 0.0  # α of an algorithm step that crosses the fabric
    inter_tree_latency: Optional[float] = None  # α of a tree level across it (None: inter_latency)
    rails: Optional[float] = None  # NICs per domain one collective drives (None: per_domain)
    # Achieved bytes/s of one GPU's own NIC for all-to-all traffic that leaves its domain: the
    # line rate (over any spine oversubscription) times FabricSpec.alltoall_efficiency.
    alltoall_bandwidth: float = 0.0

    @property
    def tree_latency(self) -> float:
        """α of a tree level across the fabric (``FabricSpec.tree_latency_s``), else a ring step's."""
        return self.inter_latency if self.inter_tree_latency is None else self.inter_tree_latency

    @property
    def nics(self) -> float:
        """NICs of each domain that carry the group's cross-domain traffic."""
        return self.per_domain if self.rails is None else min(self.per_domain, self.rails)


@dataclass(frozen=True)
class _Shape:
    """What the graph needs of a cluster: hashable, so group links can be cached."""

    num_gpus: int
    domain: int
    gpus_per_node: int
    intra: float
    nic: float
    leaf_nodes: Optional[int]
    oversubscription: float


@lru_cache(maxsize=256)
def _shape(cluster: ClusterSpec) -> _Shape:
    gpu, fabric = cluster.gpu, cluster.fabric
    return _Shape(cluster.num_gpus, gpu.nvlink_domain, gpu.gpus_per_node, gpu.intra_node_bandwidth,
                  gpu.inter_node_bandwidth, fabric.leaf_nodes, fabric.oversubscription)


Node = tuple  # ("gpu", i), ("nvswitch", d), ("nic", i), ("leaf", rail, unit), or ("spine",)
Edges = list[tuple[Node, Node, float, str]]


def _edges(gpus: Iterable[int], shape: _Shape) -> Edges:
    """The links around ``gpus`` (GPU indices): (end, end, bytes/s per GPU one way, kind), GPU to
    its NVSwitch and its NIC, NIC to its rail's leaf, leaf to the spine."""
    uplink = shape.nic / shape.oversubscription
    out: Edges = []
    for gpu in gpus:
        node = gpu // shape.gpus_per_node
        rail = gpu % shape.gpus_per_node
        unit = node // shape.leaf_nodes if shape.leaf_nodes else 0
        leaf = ("leaf", rail, unit)
        out += [(("gpu", gpu), ("nvswitch", gpu // shape.domain), shape.intra, "nvlink"),
                (("gpu", gpu), ("nic", gpu), shape.nic, "network"),
                (("nic", gpu), leaf, shape.nic, "network"),
                (leaf, ("spine",), uplink, "network")]
    return out


def build_topology(cluster: ClusterSpec) -> "nx.Graph":
    """The whole cluster as a networkx graph (for inspection; the cost models use small subgraphs)."""
    import networkx as nx

    shape = _shape(cluster)
    graph = nx.Graph()
    for gpu in range(cluster.num_gpus):
        graph.add_node(("gpu", gpu), kind="gpu", domain=gpu // shape.domain)
    for a, b, bandwidth, link in _edges(range(cluster.num_gpus), shape):
        graph.add_edge(a, b, bandwidth=bandwidth, link=link)
    return graph


def _path_bandwidth(edges: Edges, shape: _Shape, a: int, b: int) -> float:
    """Bottleneck bandwidth from GPU a to GPU b: over NVLink inside a domain; across domains, the
    widest of the shortest routes (breadth first, keeping the best bottleneck among equally short
    ones). Where a peer in a's domain sits on b's rail, the route through it over NVLink ties with
    the one over the spine and is the wider when the spine is oversubscribed: NCCL's PXN route."""
    if a // shape.domain == b // shape.domain:
        return shape.intra
    neighbours: dict[Node, list[tuple[Node, float]]] = {}
    for u, v, bandwidth, _ in edges:
        neighbours.setdefault(u, []).append((v, bandwidth))
        neighbours.setdefault(v, []).append((u, bandwidth))
    source, target = ("gpu", a), ("gpu", b)
    hops, widest = {source: 0}, {source: float("inf")}
    queue = deque([source])
    while queue:
        u = queue.popleft()
        for v, bandwidth in neighbours[u]:
            through_u = min(widest[u], bandwidth)
            if v not in hops:
                hops[v], widest[v] = hops[u] + 1, through_u
                queue.append(v)
            elif hops[v] == hops[u] + 1:
                widest[v] = max(widest[v], through_u)
    return widest[target]


ORDER = ("tp", "cp", "dp", "pp")


def group_shape(layout: Layout, dim: str) -> tuple[int, int]:
    """(stride, size) of a parallel group: tp, cp, dp, pp, or dp_cp (the gradient group,
    data parallel with context parallel folded in, which is contiguous in cp then dp).

    The expert layers' groups lie on their own grid over the same ranks, expert tensor
    parallel fastest, then expert parallel and expert data parallel, pipeline outermost
    (megatron-core ``RankGenerator`` for the expert grid, order "tp-ep-dp-pp"): etp, ep, edp."""
    if dim in ("etp", "ep", "edp"):
        return expert_group_shape(dim, layout.expert_tp, layout.ep, layout.edp)
    dims = dim.split("_")
    stride = 1
    for d in ORDER[:ORDER.index(min(dims, key=ORDER.index))]:
        stride *= getattr(layout, d)
    size = 1
    for d in dims:
        size *= getattr(layout, d)
    return stride, size


def expert_group_shape(dim: str, etp: int, ep: int, edp: int = 1) -> tuple[int, int]:
    """(stride, size) of an expert group (:func:`group_shape`): etp fastest, then ep, then edp."""
    if dim == "etp":
        return 1, etp
    if dim == "ep":
        return etp, ep
    return etp * ep, edp


@lru_cache(maxsize=4096)
def cp_group_links(cluster: ClusterSpec, tp: int, cp: int) -> GroupLinks:
    """The links of a context-parallel group (:func:`group_links`), which depend on tp and cp alone."""
    return group_links(cluster, Layout(tp=tp, cp=cp, dp=cluster.num_gpus // (tp * cp)), "cp")


def expert_group_links(cluster: ClusterSpec, dim: str, etp: int, ep: int,
                       nvlink_peers: Optional[int] = None) -> GroupLinks:
    """The links of an etp or ep group (:func:`group_links` without a whole layout). ``nvlink_peers``:
    the ranks the group's collective treats as one NVLink domain, where it reaches fewer than the
    cluster's (``experts.dispatch_links``): blocks of min(domain, nvlink_peers) consecutive GPUs, the
    rest of the group through the NICs."""
    return _cluster_group_links(cluster, *expert_group_shape(dim, etp, ep), nvlink_peers)


@lru_cache(maxsize=4096)
def _group_links(shape: _Shape, fabric: FabricSpec, stride: int, size: int) -> GroupLinks:
    # The group of rank 0 stands for all groups (they are alike under Megatron's order).
    # Its members i·stride fall into NVLink domains arithmetically; the links come from the
    # graph over rank 0, its nearest neighbour inside its domain, its nearest outside, and
    # its farthest member (whose path shows whether the group leaves its leaf switches).
    domain = shape.domain
    per_domain = max(1, min(size, -(-domain // stride))) if stride < domain else 1
    domains = -(-size // per_domain)
    same = stride if per_domain > 1 else None
    other = per_domain * stride if domains > 1 else None
    farthest = (size - 1) * stride if domains > 1 else None
    edges = _edges([0] + [r for r in {same, other, farthest} if r is not None], shape)
    intra_bw = _path_bandwidth(edges, shape, 0, same) if same is not None else shape.intra
    if other is None or farthest is None:  # both or neither: one NVLink domain holds the group
        return GroupLinks(size, per_domain, domains, intra_bw, shape.nic * fabric.efficiency_for(1),
                          fabric.latency_s, fabric.tree_latency_s, fabric.rails, shape.nic * fabric.alltoall_efficiency)
    line = min(_path_bandwidth(edges, shape, 0, other), _path_bandwidth(edges, shape, 0, farthest))
    return GroupLinks(size, per_domain, domains, intra_bw, line * fabric.efficiency_for(domains),
                      fabric.latency_s, fabric.tree_latency_s, fabric.rails, line * fabric.alltoall_efficiency)


def group_links(cluster: ClusterSpec, layout: Layout, dim: str) -> GroupLinks:
    return _cluster_group_links(cluster, *group_shape(layout, dim))


@lru_cache(maxsize=4096)
def _cluster_group_links(cluster: ClusterSpec, stride: int, size: int,
                         nvlink_peers: Optional[int] = None) -> GroupLinks:
    shape = _shape(cluster)
    if nvlink_peers is not None and nvlink_peers < shape.domain:
        shape = replace(shape, domain=nvlink_peers)
    return _group_links(shape, cluster.fabric, stride, size)


def domains_spanned(cluster: ClusterSpec, layout: Layout) -> dict[str, int]:
    """NVLink domains each parallel group of the layout spans (racks, on NVL72 systems): a group
    spanning more than one leaves its domain and runs its collectives over the scale-out fabric.
    Domains, not nodes: on an NVL72 rack a tensor-parallel group of 8 spans two 4-GPU trays and
    stays on NVLink. The expert groups (ep, and etp where it differs from tp) are listed for
    models with experts (``layout.ep`` > 1)."""
    dims = ["tp", "cp", "dp", "pp"] + (["ep"] if layout.ep > 1 else []) + \
        (["etp"] if layout.ep > 1 and layout.expert_tp != layout.tp else [])
    return {dim: group_links(cluster, layout, dim).domains for dim in dims}
