"""Collective and point-to-point times: an α-β model per algorithm over a group's links.

Per GPU, ring algorithms move (Thakur et al. 2005; NCCL's "bus bandwidth" in
nccl-tests ``doc/PERFORMANCE.md``):
- all-reduce: 2(n−1)/n of the buffer;
- all-gather and reduce-scatter: (n−1)/n of the (full) buffer.

A group spanning several NVLink domains runs hierarchically: every member of a
domain drives its own NIC (one NIC per GPU, rail-optimised), so the inter-domain
bus bandwidth is per_domain × the achieved NIC bandwidth (``topology.GroupLinks``:
the fabric's efficiency at the group's span, spine oversubscription), and the
collective is bounded by the slower of that and the NVLink bus bandwidth.
``FabricSpec.rails`` caps how many of a domain's NICs one collective drives (NCCL
``doc/PERFORMANCE.md``: the inter-node bus bandwidth is the NICs' line rate times the
NICs a ring's channels use). Latency: all-reduce runs as a tree at scale (2·log2 n
steps, NCCL's tree algorithm); all-gather and reduce-scatter have only the ring in
NCCL before 2.23 (n − 1 steps). As in NCCL's own tuning model (``src/graph/tuning.cc``,
``ncclTopoTuneModel``: ``(nsteps − nInterSteps)·intraLat + nInterSteps·interLat``), a ring
pays the fabric's α only at the steps that cross it, one per domain it leaves; the rest run
at NVLink's.
"""

from __future__ import annotations

import math
from typing import Optional

from .hardware import Performance
from .topology import GroupLinks

VOLUME = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}


def bus_bandwidth(links: GroupLinks, perf: Performance) -> float:
    """Achieved bytes/s per GPU for a collective over ``links``."""
    intra = links.intra_bandwidth * perf.intra_node_efficiency
    if links.domains == 1:
        return intra
    inter = links.nics * links.inter_bandwidth
    return min(intra, inter) if links.per_domain > 1 else inter


def algorithm_steps(kind: str, group_size: int) -> int:
    """Latency steps of one collective among ``group_size`` ranks: 2⌈log₂ n⌉ for the all-reduce
    (a tree, up and down: NCCL's small-message algorithm), n − 1 for the ring all-gather and
    reduce-scatter."""
    if group_size <= 1:
        return 0
    return 2 * math.ceil(math.log2(group_size)) if kind == "all_reduce" else group_size - 1


def volume_per_gpu(kind: str, group_size: int, size_bytes: float) -> float:
    """Bytes each rank moves in one ring collective of the full buffer ``size_bytes``:
    2(n − 1)/n · S for the all-reduce, (n − 1)/n · S for the all-gather and reduce-scatter
    (Patarasuk and Yuan 2009; NCCL's bus-bandwidth convention, nccl-tests PERFORMANCE.md)."""
    return VOLUME[kind] * (group_size - 1) / group_size * size_bytes


def latency(kind: str, links: GroupLinks, perf: Performance) -> float:
    """The α part of one collective: its algorithm steps, each at its link's latency. The tree
    all-reduce climbs within the domains, then across them, each fabric level at the fabric's
    tree step (``FabricSpec.tree_latency_s``); the ring's n − 1 steps include D − 1 across the
    fabric for the D domains it visits (NCCL ``tuning.cc``: nInterSteps).

    nccl-tests' all-gather of 32 MiB on p5 (EFA) takes 0.24 ms on 2 nodes and 2.70 ms on 32
    (crazyguitar/aws-gpu-communication-benchmark ``data/nccl_all_gather.csv``): about 80 µs
    per node, one fabric step and seven NVLink steps, not 255 fabric steps."""
    if kind == "all_reduce":
        return algorithm_steps(kind, links.per_domain) * perf.link_latency_s \
            + algorithm_steps(kind, links.domains) * links.tree_latency
    crossing = links.domains - 1
    return (algorithm_steps(kind, links.size) - crossing) * perf.link_latency_s + crossing * links.inter_latency


def collective_time(kind: str, size_bytes: float, links: GroupLinks, perf: Performance) -> float:
    """Seconds for one collective of ``size_bytes`` (the full buffer) over the group.

    All-gather and reduce-scatter run at their own share of the all-reduce's bus
    bandwidth (``Performance.all_gather_efficiency``, ``reduce_scatter_efficiency``): about
    1 on NCCL, well under on gloo, whose reduce-scatter is not a native ring.
    """
    n = links.size
    if n == 1 or size_bytes <= 0:
        return 0.0
    volume = volume_per_gpu(kind, n, size_bytes)
    share = {"all_gather": perf.all_gather_efficiency, "reduce_scatter": perf.reduce_scatter_efficiency}.get(kind, 1.0)
    return latency(kind, links, perf) + volume / (share * bus_bandwidth(links, perf))


def all_to_all_time(size_bytes: float, links: GroupLinks, perf: Performance,
                    crossing_bytes: Optional[float] = None) -> float:
    """Seconds for one all-to-all in which every rank sends ``size_bytes`` in all, an equal share
    to each of the n ranks of the group (its own share stays).

    Each rank's share for the peers of its own NVLink domain goes over NVLink, the share for the
    other domains through its own NIC, both at once; the slower decides. nccl-tests' all-to-all
    on 2 p5 nodes (16 H100, EFA) moves 84.5 GB/s per GPU (algbw), half of it across: 42 GB/s
    through each 50 GB/s NIC, which is what ``FabricSpec.alltoall_efficiency`` holds
    (``shared/hardware/achieved.yaml``). The ranks exchange with all peers at once, so the
    latency is one step's. ``crossing_bytes``, where given, is what leaves the domain instead
    of the even share (a dispatch that sends each token once per domain)."""
    n = links.size
    if n == 1 or size_bytes <= 0:
        return 0.0
    inside = size_bytes * (links.per_domain - 1) / n
    outside = size_bytes * (n - links.per_domain) / n if crossing_bytes is None else crossing_bytes
    t_inside = inside / (links.intra_bandwidth * perf.intra_node_efficiency)
    if outside <= 0:
        return perf.link_latency_s + t_inside
    return links.inter_latency + max(t_inside, outside / links.alltoall_bandwidth)


def exposed(comm_s: float, compute_s: float, perf: Performance) -> float:
    """The part of ``comm_s`` of communication that ``compute_s`` of compute running beside it
    does not hide: c − ov·min(c, C). ``Performance.comm_overlap`` (ov) is the share of the
    overlapped time that runs side by side, as calibration measures it: (t_comm + t_compute −
    t_both) / min(t_comm, t_compute). Near 1 on GPUs (NCCL kernels beside the compute
    kernels, though they take SMs and HBM bandwidth from them); near 0 where collectives take
    the cores compute runs on (gloo on a CPU)."""
    return comm_s - perf.comm_overlap * min(comm_s, compute_s)


def p2p_time(size_bytes: float, crosses_domain: bool, links: GroupLinks, perf: Performance) -> float:
    """One send from a pipeline stage to the next."""
    if crosses_domain:
        return links.inter_latency + size_bytes / links.inter_bandwidth
    return perf.link_latency_s + size_bytes / (links.intra_bandwidth * perf.intra_node_efficiency)
