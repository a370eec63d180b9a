"""The step-time model: exact FLOP counts, collective volumes, rank placement and schedule formulas."""

from __future__ import annotations

import pytest

from cost_models.collectives import bus_bandwidth, collective_time
from cost_models.flops import layer_gemms, model_flops_per_token
from cost_models.pipeline import bubble_fraction
from cost_models.specs import ClusterSpec, GPUSpec, Job, Layout, ModelSpec, Performance, TrainingSpec
from cost_models.step_time import gemm_time, stage_time, step_time
from cost_models.topology import GroupLinks, group_links

NO_LATENCY = Performance(intra_node_efficiency=1.0, inter_node_efficiency=1.0, link_latency_s=0.0)


def _gpu(**perf) -> GPUSpec:
    return GPUSpec(name="a100", memory_bytes=80e9, peak_flops={"bf16": 312e12, "fp16": 312e12},
                   hbm_bandwidth=2.0e12, intra_node_bandwidth=300e9, inter_node_bandwidth=25e9,
                   gpus_per_node=8, nvlink_domain=8, performance=Performance(**perf))


def _gpt(layers=24, h=2304, a=24, vocab=51200) -> ModelSpec:
    return ModelSpec(name="gpt", num_layers=layers, hidden_size=h, num_attention_heads=a, vocab_size=vocab)


def test_model_flops_match_narayanan_formula_with_causal_attention():
    """Narayanan et al. 2021 eq. (3) without recompute is 72·l·h²·(1 + s/6h + V/12lh) per token for
    full attention; with causal attention the s/6h term halves."""
    l, h, s, V = 40, 6144, 2048, 51200
    model = _gpt(layers=l, h=h, a=48, vocab=V)
    assert model_flops_per_token(model, s) == pytest.approx(72 * l * h * h * (1 + s / (12 * h) + V / (12 * l * h)))


def test_gqa_swiglu_layer_gemms():
    """Llama-3-8B layer: QKV 4096×(4096+2·1024), proj 4096², three 4096×14336 MLP matrices."""
    model = ModelSpec(name="llama3-8b", num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
                      ffn_hidden_size=14336, activation="swiglu", vocab_size=128256)
    flops = sum(g.flops for g in layer_gemms(model, 1, 1))
    assert flops == 2 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336)
    # TP splits every GEMM's FLOPs evenly while the kv heads divide by tp.
    assert sum(g.flops for g in layer_gemms(model, 1, 8)) == pytest.approx(flops / 8)


@pytest.mark.parametrize("p, v, m, expected", [(8, 1, 64, 7 / 64), (4, 2, 16, 3 / 32), (1, 1, 8, 0.0)])
def test_bubble_fractions(p, v, m, expected):
    """(p − 1)/m for 1F1B and (p − 1)/(v·m) interleaved (Narayanan et al. 2021, §2.2)."""
    assert bubble_fraction(p, v, m) == pytest.approx(expected)


def test_ring_collective_volumes():
    links = GroupLinks(size=8, per_domain=8, domains=1, intra_bandwidth=100e9, inter_bandwidth=10e9)
    S = 1e9
    assert collective_time("all_reduce", S, links, NO_LATENCY) == pytest.approx(2 * 7 / 8 * S / 100e9)
    assert collective_time("all_gather", S, links, NO_LATENCY) == pytest.approx(7 / 8 * S / 100e9)
    assert collective_time("reduce_scatter", S, links, NO_LATENCY) == pytest.approx(7 / 8 * S / 100e9)


def test_collective_spanning_nodes_runs_on_the_nics():
    # One member per node: every byte crosses that member's NIC.
    one = GroupLinks(size=16, per_domain=1, domains=16, intra_bandwidth=100e9, inter_bandwidth=10e9)
    assert bus_bandwidth(one, NO_LATENCY) == 10e9
    # Four members per node drive four NICs, still below NVLink.
    four = GroupLinks(size=16, per_domain=4, domains=4, intra_bandwidth=100e9, inter_bandwidth=10e9)
    assert bus_bandwidth(four, NO_LATENCY) == 40e9
    # Sixteen NICs would outrun NVLink: NVLink bounds it.
    many = GroupLinks(size=64, per_domain=16, domains=4, intra_bandwidth=100e9, inter_bandwidth=10e9)
    assert bus_bandwidth(many, NO_LATENCY) == 100e9


def test_megatron_rank_order_places_tp_inside_a_node():
    cluster = ClusterSpec(gpu=_gpu(), num_gpus=64)
    layout = Layout(dp=4, tp=8, pp=2)
    tp = group_links(cluster, layout, "tp")
    dp = group_links(cluster, layout, "dp")
    pp = group_links(cluster, layout, "pp")
    assert (tp.size, tp.domains, tp.intra_bandwidth) == (8, 1, 300e9)
    assert (dp.size, dp.per_domain, dp.domains, dp.inter_bandwidth) == (4, 1, 4, 25e9)
    assert (pp.size, pp.domains) == (2, 2)
    narrow = group_links(cluster, Layout(dp=16, tp=2, pp=2), "dp")
    assert (narrow.per_domain, narrow.domains) == (4, 4)


def test_tensor_parallel_gemms_are_less_efficient():
    """Splitting a GEMM t ways costs more than 1/t of its time: the fixed per-kernel cost stays."""
    gpu = _gpu()
    model = _gpt(h=2304, a=24)
    whole = sum(gemm_time(g, gpu, "bf16") for g in layer_gemms(model, 2048, 1))
    split = sum(gemm_time(g, gpu, "bf16") for g in layer_gemms(model, 2048, 8))
    assert split > whole / 8
    efficiency = (whole / 8) / split
    assert 0.3 < efficiency < 1.0


def _job(**layout) -> Job:
    layout.setdefault("dp", 64 // (layout.get("tp", 1) * layout.get("pp", 1)))
    return Job(_gpt(layers=24), ClusterSpec(gpu=_gpu(), num_gpus=64),
               TrainingSpec(global_batch_size=512, seq_len=2048, precision="bf16", flash_attention=True),
               Layout(**layout))


def test_full_recompute_repeats_exactly_one_forward():
    # Stage 0 of two holds only layers (and the embedding lookup): no LM head to leave out.
    plain = stage_time(_job(pp=2, micro_batch_size=2), 0)
    full = stage_time(_job(pp=2, micro_batch_size=2, recompute="full"), 0)
    assert full.compute == pytest.approx(plain.compute)
    assert full.recompute == pytest.approx(plain.compute / 3, rel=1e-3)


def test_step_time_is_the_sum_of_its_parts_and_sets_throughput():
    job = _job(tp=2, pp=4, micro_batch_size=1)
    t = step_time(job)
    assert t.total == pytest.approx(sum(t.by_part().values()))
    m = job.num_microbatches
    slowest = max(stage_time(job, i).total for i in range(4))
    assert t.bubble_s == pytest.approx(3 / m * m * slowest)
    assert t.compute_s > 0 and t.tp_comm_s > 0 and t.pp_comm_s > 0 and t.dp_comm_s >= 0


def test_group_placement_matches_counting_on_the_whole_cluster_graph():
    """The arithmetic placement of a group's ranks agrees with the full networkx graph."""
    from cost_models.topology import build_topology

    cluster = ClusterSpec(gpu=_gpu(), num_gpus=128)
    graph = build_topology(cluster)
    for tp, cp, dp, pp in [(1, 1, 128, 1), (2, 1, 64, 1), (8, 1, 8, 2), (4, 2, 4, 4), (2, 4, 2, 8), (8, 2, 8, 1)]:
        layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp)
        for dim in ("tp", "cp", "dp", "pp", "dp_cp"):
            links = group_links(cluster, layout, dim)
            stride = {"tp": 1, "cp": tp, "dp": tp * cp, "pp": tp * cp * dp, "dp_cp": tp}[dim]
            members = [i * stride for i in range(links.size)]
            domains = {}
            for rank in members:
                domains.setdefault(graph.nodes[("gpu", rank)]["domain"], []).append(rank)
            assert links.domains == len(domains), (dim, layout)
            assert links.per_domain == len(domains[0]), (dim, layout)
