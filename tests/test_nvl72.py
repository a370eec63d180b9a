"""NVL72 racks: 72 GPUs in one NVLink domain, 4 to a node. Tensor- and context-parallel groups
may span trays inside a rack and stay on NVLink; the topology says which groups leave the rack."""

from __future__ import annotations

import planner
from cost_models.specs import Layout
from cost_models.topology import domains_spanned, group_links
from planner.case import load_case
from planner.search import structures


def _case(gpu: str, num_gpus: int) -> dict:
    return {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": gpu, "num_gpus": num_gpus},
            "training": {"global_batch_size": 144, "seq_len": 8192, "precision": "fp8"}, "search": {"target": "megatron"}}


def test_a_gb200_node_is_four_gpus_and_its_nvlink_domain_the_rack():
    gpu = load_case(_case("gb200", 144)).cluster.gpu
    assert (gpu.gpus_per_node, gpu.nvlink_domain) == (4, 72)


def test_tensor_parallelism_spans_trays_inside_the_rack():
    """tp 8 and 16 exceed a 4-GPU tray but not the 72-GPU rack: the search offers them on GB200
    (tp 64 too: it divides the 64 heads and fits a rack), and on a B200 node caps tp at 8."""
    case = load_case(_case("gb200", 144))
    tps = {tp for tp, _, _, _ in structures(case, case.search)}
    assert {8, 16} <= tps and max(tps) <= 72
    b200 = load_case(_case("b200", 144))
    assert max(tp for tp, _, _, _ in structures(b200, b200.search)) == 8


def test_the_topology_says_which_groups_leave_the_rack():
    """144 GPUs = 2 racks. tp 8 x cp 2 = 16 consecutive ranks: 4 trays of one rack, on NVLink;
    dp 9 strides by 16 over both racks; pp 1."""
    cluster = load_case(_case("gb200", 144)).cluster
    layout = Layout(tp=8, cp=2, dp=9)
    assert domains_spanned(cluster, layout) == {"tp": 1, "cp": 1, "dp": 2, "pp": 1}
    tp = group_links(cluster, layout, "tp")
    assert tp.per_domain == 8 and tp.intra_bandwidth == 900e9  # NVLink5, one direction


def test_a_tensor_parallel_group_across_trays_costs_nvlink_not_the_nic():
    """The same tp 8 layout on GB200 (one rack) and on 4-GPU nodes that are their own NVLink
    domain: the latter's TP collectives cross the 400 Gbit/s NICs."""
    case = _case("gb200", 144) | {"layout": {"tp": 8, "cp": 1, "pp": 2, "dp": 9, "zero_stage": 1,
                                             "sequence_parallel": True, "micro_batch_size": 1}}
    from planner.presets import gpu_presets, performance_presets

    rack = planner.estimate(case)
    trays = planner.estimate(case | {"cluster": {**case["cluster"], "gpu": {**gpu_presets()["gb200"], "nvlink_domain": 4},
                                                 "performance": performance_presets()["gb200"]}})
    assert rack.time.compute_s == trays.time.compute_s
    assert domains_spanned(trays.job.cluster, trays.job.layout)["tp"] == 2
    assert rack.time.tp_comm_s < trays.time.tp_comm_s / 2
