"""Collective and point-to-point times: an α-β model per algorithm over a group's links.

Per GPU, ring algorithms move (Thakur et al. 2005; NCCL's "bus bandwidth" in
nccl-tests ``doc/PERFORMANCE.md``):
- all-reduce: 2(n−1)/n of the buffer;
- all-gather and reduce-scatter: (n−1)/n of the (full) buffer.

A group spanning several NVLink domains runs hierarchically: every member of a
domain drives its own NIC (one NIC per GPU, rail-optimised), so the inter-domain
bus bandwidth is per_domain × NIC bandwidth, and the collective is bounded by the
slower of that and the NVLink bus bandwidth. ``Performance.inter_node_rails`` caps
how many of a node's NICs one collective drives at once where a cluster's measured
runs show less than the sum (NCCL ``doc/PERFORMANCE.md``: the inter-node bus
bandwidth is the NICs' line rate times the NICs a ring's channels use). Latency: all-reduce runs as a tree
at scale (2·log2 n steps, NCCL's tree algorithm); all-gather and reduce-scatter
have only the ring in NCCL before 2.23 (n − 1 steps).
"""

from __future__ import annotations

import math

from .specs import Performance
from .topology import GroupLinks

VOLUME = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}


def bus_bandwidth(links: GroupLinks, perf: Performance) -> float:
    """Achieved bytes/s per GPU for a collective over ``links``."""
    intra = links.intra_bandwidth * perf.intra_node_efficiency
    if links.domains == 1:
        return intra
    rails = links.per_domain if perf.inter_node_rails is None else min(links.per_domain, perf.inter_node_rails)
    inter = rails * links.inter_bandwidth * perf.inter_node_efficiency
    return min(intra, inter) if links.per_domain > 1 else inter


def collective_time(kind: str, size_bytes: float, links: GroupLinks, perf: Performance) -> float:
    """Seconds for one collective of ``size_bytes`` (the full buffer) over the group.

    All-gather and reduce-scatter run at their own share of the all-reduce's bus
    bandwidth (``Performance.all_gather_efficiency``, ``reduce_scatter_efficiency``): about
    1 on NCCL, well under on gloo, whose reduce-scatter is not a native ring.
    """
    n = links.size
    if n == 1 or size_bytes <= 0:
        return 0.0
    volume = VOLUME[kind] * (n - 1) / n * size_bytes
    steps = 2 * math.ceil(math.log2(n)) if kind == "all_reduce" else n - 1
    share = {"all_gather": perf.all_gather_efficiency, "reduce_scatter": perf.reduce_scatter_efficiency}.get(kind, 1.0)
    return steps * perf.link_latency_s + volume / (share * bus_bandwidth(links, perf))


def exposed(comm_s: float, compute_s: float, perf: Performance) -> float:
    """The part of ``comm_s`` of communication that ``compute_s`` of compute running beside it
    cannot hide. ``Performance.comm_overlap`` is the share of compute time communication can
    run under: 1 on GPUs (NCCL kernels and copy engines beside the compute kernels), near 0
    where collectives take the cores compute runs on (gloo on a CPU); calibration measures it."""
    return max(0.0, comm_s - perf.comm_overlap * compute_s)


def p2p_time(size_bytes: float, crosses_domain: bool, links: GroupLinks, perf: Performance) -> float:
    """One send from a pipeline stage to the next."""
    bandwidth = (links.inter_bandwidth * perf.inter_node_efficiency if crosses_domain
                 else links.intra_bandwidth * perf.intra_node_efficiency)
    return perf.link_latency_s + size_bytes / bandwidth
