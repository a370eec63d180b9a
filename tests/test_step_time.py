"""The step-time model: exact FLOP counts, collective volumes, rank placement and schedule formulas."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from cost_models.collectives import bus_bandwidth, collective_time, exposed
from cost_models.flops import layer_gemms, model_flops_per_token
from cost_models.pipeline_time import pipeline
from cost_models.memory import job_stage_parameters
from cost_models.model_states import StateBytes, state_bytes, working_bytes
from cost_models.flops import Gemm
from cost_models.kernels import gemm_time, wave_efficiency
from cost_models.specs import (ClusterSpec, FabricSpec, GPUSpec, Job, Layout, ModelSpec, Performance, SpecError,
                               TrainingSpec)
from cost_models.dp_time import dp_comm_exposed, gradient_chunks
from cost_models.layer_time import cross_entropy_bytes, cross_entropy_time, layer_forward_time
from cost_models.stage_time import stage_time
from cost_models.step_time import step_time
from cost_models.tp_time import cross_domain_tp_floor, tp_exposed_per_layer
from cost_models.topology import GroupLinks, group_links
from planner.engines import behaviour_of

NO_LATENCY = Performance(intra_node_efficiency=1.0, link_latency_s=0.0)
# A fabric that delivers the NIC's line rate with no latency: collective times are bytes over bandwidth.
IDEAL_FABRIC = FabricSpec(efficiency=1.0, latency_s=0.0)


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


def one_f_one_b_makespan(forward: list[float], backward: list[float], m: int) -> float:
    """The step of a non-interleaved 1F1B schedule, simulated op by op: stage i runs p − i − 1
    warm-up forwards, then one forward and one backward in turn, then the cool-down backwards
    (Narayanan et al. 2021, §2.2.1; Megatron-LM's forward_backward_pipelining_without_interleaving);
    a forward waits for the previous stage's, a backward for the next stage's."""
    p = len(forward)
    orders = []
    for i in range(p):
        warmup = min(p - i - 1, m)
        order = [("F", j) for j in range(warmup)]
        for j in range(m - warmup):
            order += [("F", warmup + j), ("B", j)]
        order += [("B", j) for j in range(m - warmup, m)]
        orders.append(order)
    done: dict[tuple, float] = {}
    clock, position = [0.0] * p, [0] * p
    while any(position[i] < len(orders[i]) for i in range(p)):
        for i in range(p):
            while position[i] < len(orders[i]):
                kind, j = orders[i][position[i]]
                after = (("F", i - 1, j) if kind == "F" and i > 0 else
                         ("B", i + 1, j) if kind == "B" and i < p - 1 else None)
                if after is not None and after not in done:
                    break
                start = max(clock[i], done.get(after, 0.0))
                clock[i] = done[(kind, i, j)] = start + (forward[i] if kind == "F" else backward[i])
                position[i] += 1
    return max(clock)


@pytest.mark.parametrize("pp, m", [(2, 8), (4, 8), (4, 16)])
def test_a_pipeline_step_is_its_1f1b_schedule(pp, m):
    """The micro-batches at the slowest stage's pace and the bubble (``Pipeline.least_step``) take
    what a 1F1B schedule of the job's own stage times takes where the slowest stage is the last
    (it also runs the LM head and the loss): the others idle in the fill and drain for their own
    time, not for its, (m − 1)·T_last + Σ T_i, below the (m + p − 1)·T_last of equal stages.
    Where a stage before the slowest is heavier, the schedule hides more still (its warm-up
    forwards run in the bubble): the model lies between that and equal stages'."""
    def job_of(stage_layers):
        layout = Layout(dp=64 // pp, pp=pp, micro_batch_size=1, stage_layers=stage_layers)
        training = TrainingSpec(global_batch_size=m * layout.dp, seq_len=2048, precision="bf16", flash_attention=True)
        return Job(_gpt(layers=24), ClusterSpec(gpu=_gpu(), num_gpus=64), training, layout)

    job = job_of((24 // pp,) * pp)
    times = [stage_time(job, i).total for i in range(pp)]
    assert times[-1] == max(times) > min(times)  # the head makes the last stage the slowest
    simulated = one_f_one_b_makespan([t / 3 for t in times], [2 * t / 3 for t in times], m)
    assert pipeline(job).least_step(job) == pytest.approx(simulated, rel=1e-9)
    assert simulated < (m + pp - 1) * times[-1]
    # A first stage with two more layers than the others: the slowest, at the front.
    heavy = job_of((24 // pp + 2,) + (24 // pp,) * (pp - 2) + (24 // pp - 2,))
    times = [stage_time(heavy, i).total for i in range(pp)]
    assert times[0] == max(times)
    simulated = one_f_one_b_makespan([t / 3 for t in times], [2 * t / 3 for t in times], m)
    assert simulated <= pipeline(heavy).least_step(heavy) < (m + pp - 1) * times[0]


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
    cluster = ClusterSpec(gpu=_gpu(), num_gpus=64, fabric=IDEAL_FABRIC)
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
    job = _job(pp=2, micro_batch_size=2, recompute="full")
    plain = stage_time(_job(pp=2, micro_batch_size=2), 0)
    full = stage_time(job, 0)
    assert full.compute == pytest.approx(plain.compute)
    assert full.recompute == pytest.approx(job.stage_layers[0] * layer_forward_time(job)[0])
    # Backward is at least twice the forward: the recompute is at most a third of the rest.
    assert full.recompute <= plain.compute / 3


def test_the_bubble_is_every_stage_but_the_slowest_and_every_link_is_paid():
    """Each stage's fill and drain at its own pace (the 1F1B schedule simulated above): with a last
    stage slower than the others, less than the p − 1 slowest stages of equal stages."""
    job = _job(tp=2, pp=4, micro_batch_size=1)
    t = step_time(job)
    times = [stage_time(job, i).total for i in range(4)]
    assert t.bubble_s == pytest.approx(sum(times) - max(times))
    assert t.bubble_s < 3 * max(times)
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


def test_a_group_across_an_oversubscribed_spine_takes_the_widest_shortest_route_of_the_whole_graph():
    """On a 2:1 oversubscribed fabric, a rank's route to a peer on another rail of its scalable
    unit (rail leaves, a spine above them) ties in hops with the route over NVLink to the GPU of
    its domain on the peer's rail (NCCL's PXN): the group's links carry the NIC's line rate, as
    the widest shortest path of networkx's whole-cluster graph says, not the spine's half."""
    import networkx as nx
    from cost_models.topology import build_topology

    fabric = FabricSpec(efficiency=1.0, latency_s=0.0, oversubscription=2.0, leaf_nodes=32)
    cluster = ClusterSpec(gpu=_gpu(), num_gpus=64, fabric=fabric)
    graph = build_topology(cluster)

    def widest_shortest(a, b):
        return max(min(graph.edges[u, v]["bandwidth"] for u, v in zip(path, path[1:]))
                   for path in nx.all_shortest_paths(graph, ("gpu", a), ("gpu", b)))

    links = group_links(cluster, Layout(dp=4, tp=16), "tp")  # ranks 0-15: two 8-GPU domains
    assert links.domains == 2
    line = cluster.gpu.inter_node_bandwidth
    assert widest_shortest(0, 15) == line  # rail 7 of the next node, through GPU 7's NIC
    assert links.inter_bandwidth == pytest.approx(min(widest_shortest(0, 8), widest_shortest(0, 15)))


def test_rails_cap_the_nics_a_cross_node_collective_drives():
    """FabricSpec.rails: at most that many of a domain's NICs carry one collective."""
    def four(rails):
        return GroupLinks(size=16, per_domain=4, domains=4, intra_bandwidth=100e9, inter_bandwidth=10e9, rails=rails)
    perf = Performance(intra_node_efficiency=1.0)
    assert bus_bandwidth(four(1), perf) == 10e9
    assert bus_bandwidth(four(2), perf) == 20e9
    # A cap above the group's members on a node changes nothing.
    assert bus_bandwidth(four(8), perf) == 40e9
    with pytest.raises(SpecError, match="rails"):
        FabricSpec(rails=0.5)


def test_fabric_efficiency_falls_with_the_nodes_a_collective_spans():
    """p5 EFA all-reduce bus bandwidth: 357 GB/s at 4 nodes, 355 at 8, 356 at 16, 321 at 32
    (8 × 50 GB/s NICs): interpolated in log2(nodes), held beyond the last point."""
    efa = FabricSpec(efficiency=0.89, efficiency_at=((8, 0.888), (16, 0.89), (32, 0.80)))
    assert efa.efficiency_for(2) == 0.89
    assert efa.efficiency_for(32) == pytest.approx(0.80)
    assert efa.efficiency_for(64) == pytest.approx(0.80)
    assert efa.efficiency_for(23) == pytest.approx(0.89 + (0.80 - 0.89) * (math.log2(23) - 4))


def test_a_ring_pays_the_fabric_latency_once_per_node_it_leaves():
    """nccl-tests all_gather_perf, 32 MiB, on p5.48xlarge nodes (8 H100, EFA; NCCL 2.28, ring):
    0.24 ms on 2 nodes and 2.70 ms on 32 (algbw 140.06 and 12.43 GB/s;
    crazyguitar/aws-gpu-communication-benchmark data/nccl_all_gather.csv). The time grows by
    about 80 µs a node: one step across the fabric and seven over NVLink (NCCL tuning.cc's
    nInterSteps), where 255 steps at the fabric's α would take 13 ms. With the ring step the
    whole all-gather series fits (50 µs, ``bench/fit_fabric_latency.py``) the predictions fall
    19 % and 6 % short; their growth from 2 to 32 nodes, 11.3× measured and 13.1× predicted, is
    the ring's latency alone."""
    from planner.case import load_case

    size = 32 * 2**20
    times = {}
    for nodes, measured in ((2, size / 140.06e9), (32, size / 12.43e9)):
        case = load_case({"model": {"preset": "llama3-8b"},
                          "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8 * nodes, "fabric": "aws-efa-p5"},
                          "training": {"global_batch_size": 8 * nodes, "seq_len": 4096}})
        cluster = case.cluster
        links = group_links(cluster, Layout(dp=8 * nodes), "dp")
        assert links.domains == nodes
        predicted = collective_time("all_gather", size, links, cluster.gpu.performance)
        assert predicted == pytest.approx(measured, rel=0.2), (nodes, predicted, measured)
        times[nodes] = predicted
    assert times[32] / times[2] == pytest.approx(140.06 / 12.43, rel=0.2)


def test_groups_that_leave_their_leaf_cross_an_oversubscribed_spine():
    """A data-parallel group spanning more nodes than a leaf holds runs at 1/oversubscription of
    the NIC rate; one that stays under its leaves keeps the full rate."""
    fabric = FabricSpec(efficiency=1.0, latency_s=0.0, leaf_nodes=4, oversubscription=2.0)
    cluster = ClusterSpec(gpu=_gpu(), num_gpus=64, fabric=fabric)
    within = group_links(cluster, Layout(dp=4, tp=8, pp=2), "dp")  # 4 nodes: one leaf group
    across = group_links(cluster, Layout(dp=8, tp=8), "dp")  # 8 nodes: two leaf groups
    assert within.inter_bandwidth == 25e9
    assert across.inter_bandwidth == 12.5e9


def test_a_small_gemm_fills_only_some_sms():
    """H100 (132 SMs) fp8 GEMMs of n³ reach 14 %, 51 % and 61 % of the fp8 peak at n = 1024,
    2048 and 4096, 70 % at 16384 (cuBLASLt, Azure ND H100 v5, achieved.yaml). With the large-GEMM
    efficiency 0.70 and a 5 µs fixed cost per kernel, 1024³ fills 32 of 132 SMs."""
    h100 = GPUSpec(name="h100", memory_bytes=80e9, peak_flops={"fp8": 1979e12}, hbm_bandwidth=3.35e12,
                   intra_node_bandwidth=450e9, inter_node_bandwidth=50e9, gpus_per_node=8, nvlink_domain=8,
                   sm_count=132, performance=Performance(gemm_efficiency=0.70, kernel_overhead_s=5e-6))
    assert wave_efficiency(1024, 1024, h100) == pytest.approx(32 / 132)

    def share(n: int) -> float:
        gemm = Gemm("square", n, n, n)
        return gemm.flops / gemm_time(gemm, h100, "fp8") / 1979e12  # the kernel alone: casts are priced apart
    assert share(1024) == pytest.approx(0.14, abs=0.05)
    assert share(2048) == pytest.approx(0.51, abs=0.05)
    assert share(4096) == pytest.approx(0.61, abs=0.06)
    assert share(16384) == pytest.approx(0.70, abs=0.01)


def _zero3_job(engine: str, recompute: str = "full", dp: int = 64) -> Job:
    # Two tokens per GPU and no latency: compute is negligible, the gathers are all exposed.
    gpu = GPUSpec(name="a100", memory_bytes=80e9, peak_flops={"bf16": 312e12}, hbm_bandwidth=2.0e12,
                  intra_node_bandwidth=300e9, inter_node_bandwidth=25e9, gpus_per_node=8, nvlink_domain=8,
                  performance=NO_LATENCY)
    return Job(_gpt(layers=24), ClusterSpec(gpu=gpu, num_gpus=dp, fabric=IDEAL_FABRIC),
               TrainingSpec(global_batch_size=dp, seq_len=2, precision="bf16", engine=behaviour_of(engine)),
               Layout(dp=dp, micro_batch_size=1, zero_stage=3, recompute=recompute))


def test_zero3_waits_in_the_open_for_the_embeddings_unit_not_an_average_one():
    """The first stage's forward cannot start before the input embedding's unit is gathered, and
    its backward ends with that unit's reduce-scatter (its gradients come last). With compute
    long enough to hide everything else (4,096 tokens, overlap 1), DeepSpeed's exposed traffic
    is that unit's share of each pass: V·h of the 1.765 B parameters, not 1/144 (24 layers of 6
    module gathers). A plain FSDP root unit holds the head and the final norm too; torchtitan
    wraps the embedding alone; stages after the first open with a layer."""
    from cost_models.dp_time import first_unit_parameters

    job = _zero3_job("deepspeed", recompute="none")
    job = Job(job.model, job.cluster, TrainingSpec(global_batch_size=64, seq_len=4096, precision="bf16",
                                                   engine=behaviour_of("deepspeed")), job.layout)
    params = 1_764_979_200
    embedding = 51200 * 2304
    assert first_unit_parameters(job, 0) == embedding
    assert first_unit_parameters(replace(job, training=replace(job.training, engine=behaviour_of("any"))), 0) \
        == 2 * embedding + 2 * 2304  # embedding, LM head and the final LayerNorm's weight and bias
    assert first_unit_parameters(replace(job, training=replace(job.training, engine=behaviour_of("torchtitan"))),
                                 0) == embedding
    assert first_unit_parameters(replace(job, layout=replace(job.layout, pp=2, dp=32)), 1) == 0
    bus = 8 * 25e9
    gather = reduce = 63 / 64 * 2 * params / bus  # bf16 weights and gradients, on the node's eight NICs
    stage = stage_time(job, 0)
    assert stage.compute / 3 > gather and 2 * stage.compute / 3 > gather + reduce  # all but the opening hidden
    opening = embedding / params
    assert step_time(job).dp_comm_s == pytest.approx(opening * gather + opening * (gather + reduce), rel=1e-9)


def test_fsdp_pays_page_faults_on_the_buffers_it_allocates_per_collective_where_the_device_has_them():
    """A device whose allocator maps fresh memory for each buffer (a CPU: ``Performance.page_fault_s``
    per 4 KiB page) pays it on every byte FSDP2 writes afresh: per gather the all-gather output and
    the unsharded parameters (the unit twice), per reduce-scatter its input and the reduced shard.
    In this communication-bound job everything is exposed, so one micro-batch's forward gather,
    backward gather and reduce-scatter add exactly that. DeepSpeed gathers into the parameters'
    own storage and is priced as before; so is every device with a caching allocator (0)."""
    fault = 1.5e-6
    params = 1_764_979_200
    weights, grads = 2 * params, 4 * params  # bf16 gathered, fp32 reduced (torchtitan)
    added = 2 * (2 * weights / 4096 * fault) + grads * (1 + 1 / 64) / 4096 * fault

    def with_faults(job: Job) -> Job:
        gpu = replace(job.cluster.gpu, performance=replace(NO_LATENCY, page_fault_s=fault))
        return replace(job, cluster=replace(job.cluster, gpu=gpu))

    fsdp, deepspeed = _zero3_job("torchtitan"), _zero3_job("deepspeed")
    assert step_time(with_faults(fsdp)).dp_comm_s - step_time(fsdp).dp_comm_s == pytest.approx(added, rel=1e-9)
    assert step_time(with_faults(deepspeed)).dp_comm_s == pytest.approx(step_time(deepspeed).dp_comm_s, rel=1e-12)


def test_zero2_reduces_every_microbatch_zero1_once_a_step():
    """ZeRO-2 keeps only its gradient shard, so every micro-batch's gradients are reduce-scattered
    (DeepSpeed stage_1_and_2 partition_gradients); ZeRO-1 reduces at the accumulation boundary.
    With m micro-batches: d(2, m) − d(1, m) = (m − 1) · R, R the reduce-scatter of one."""
    def exposed(zero: int, microbatches: int) -> float:
        job = _zero3_job("deepspeed", recompute="none", dp=16)
        job = Job(job.model, job.cluster, TrainingSpec(global_batch_size=16 * microbatches, seq_len=2,
                                                       precision="bf16", engine=behaviour_of("deepspeed")),
                  job.layout.with_changes(zero_stage=zero))
        return dp_comm_exposed(job, 0, stage_time(job, 0))

    one_reduce = exposed(2, 2) - exposed(1, 2)
    assert one_reduce > 0
    assert exposed(2, 1) == pytest.approx(exposed(1, 1))
    assert exposed(2, 4) - exposed(1, 4) == pytest.approx(3 * one_reduce)


def test_plain_pytorch_zero1_gathers_its_updated_weights_before_the_step_returns():
    """PyTorch's ZeroRedundancyOptimizer (``_sync_params`` at the end of step()) and nanotron's
    ZeroDistributedOptimizer (``step`` → ``_all_gather_params``) send the updated shards to every
    rank before the next forward can start; Megatron's --overlap-param-gather hides all but the
    first bucket's behind that forward. With compute long enough to hide the rest (4,096 tokens),
    the generic engine's ZeRO-1 pays the whole gather, 63/64 of the bf16 weights over the node's
    eight NICs, where the same engine with the gather overlapped pays the first bucket's share:
    the input embedding's, V·h of the parameters. nanotron gathers in one coalesced collective."""
    job = _zero3_job("any", recompute="none")
    # Without the copies out of the gather's buffer, which the next test prices.
    engine = replace(behaviour_of("any"), zero1_gather_copies=False)
    job = Job(job.model, job.cluster, TrainingSpec(global_batch_size=64, seq_len=4096, precision="bf16",
                                                   engine=engine), job.layout.with_changes(zero_stage=1))
    overlapped = replace(job, training=replace(job.training,
                                               engine=replace(job.training.engine, zero1_gather_in_step=False)))
    params = 1_764_979_200
    gather = 63 / 64 * 2 * params / (8 * 25e9)
    assert stage_time(job, 0).compute / 3 > gather  # the forward could hide it
    assert dp_comm_exposed(job, 0, stage_time(job, 0)) - dp_comm_exposed(overlapped, 0, stage_time(overlapped, 0)) \
        == pytest.approx(gather * (1 - 51200 * 2304 / params), rel=1e-9)
    # One coalesced all-gather (nanotron's all_gather_coalesced) pays the collective's latency once,
    # where an engine that gathers bucket by bucket in the open pays it per bucket.
    from cost_models.collectives import latency

    slow = replace(job.cluster.gpu, performance=replace(NO_LATENCY, link_latency_s=20e-6))
    coalesced = replace(job, cluster=replace(job.cluster, gpu=slow))
    by_bucket = replace(coalesced, training=replace(coalesced.training, engine=replace(
        coalesced.training.engine, zero1_gather_in_step=False, overlap_param_gather=False)))
    links = group_links(coalesced.cluster, coalesced.layout, "dp_cp")
    chunks = gradient_chunks(coalesced, params, 2)
    assert chunks > 100 and latency("all_gather", links, slow.performance) > 0
    assert dp_comm_exposed(by_bucket, 0, stage_time(by_bucket, 0)) \
        - dp_comm_exposed(coalesced, 0, stage_time(coalesced, 0)) \
        == pytest.approx((chunks - 1) * latency("all_gather", links, slow.performance), rel=1e-9)
    # Its ZeRO-2 is FSDP's SHARD_GRAD_OP, whose next forward prefetches the gathers.
    zero2, zero2_overlapped = (replace(j, layout=j.layout.with_changes(zero_stage=2)) for j in (job, overlapped))
    assert dp_comm_exposed(zero2, 0, stage_time(zero2, 0)) \
        == pytest.approx(dp_comm_exposed(zero2_overlapped, 0, stage_time(zero2_overlapped, 0)), rel=1e-12)


def test_deepspeed_gathers_its_updated_weights_once_per_parameter_group_whatever_the_buckets():
    """DeepSpeed's ZeRO-1/2 optimizer gathers the updated bf16 weights after the step with
    ``all_gather_dp_groups`` (runtime/utils.py): where torch has all_gather_into_tensor (any since 1.13) it
    issues one all_gather_into_tensor of each parameter group's flat buffer (``bit16_groups_flat``),
    reading neither reduce_bucket_size nor allgather_bucket_size; the gradients go bucket by bucket,
    each bucket all-reduced whole (stage_1_and_2.py ``average_tensor``, ``use_multi_rank_bucket_allreduce``
    on by default). So a reduce bucket of 16 M elements (the Hugging Face Trainer's "auto", h², at
    h = 4096) in place of 5e8 adds the buckets' latencies, not the gather's: 106 buckets of the 1.765 B
    parameters instead of 4, 102 all-reduce latencies more. The BF16_Optimizer's gather
    (``update_lp_params``, the same function) likewise, after its bucketed all-reduce, and the
    optimizer the emitted train.py builds (ds_config's, over model.parameters()) has one group."""
    from cost_models.collectives import latency

    gpu = replace(_zero3_job("deepspeed").cluster.gpu, performance=replace(NO_LATENCY, link_latency_s=20e-6))

    def exposed_dp(bucket: float, fp32_grads: bool = False) -> tuple[float, Job]:
        job = _zero3_job("deepspeed", recompute="none")
        engine = replace(behaviour_of("deepspeed"), bucket_params=bucket)
        job = Job(job.model, replace(job.cluster, gpu=gpu),
                  TrainingSpec(global_batch_size=64, seq_len=2, precision="bf16", engine=engine,
                               fp32_grads=fp32_grads), job.layout.with_changes(zero_stage=1))
        return dp_comm_exposed(job, 0, stage_time(job, 0)), job

    small, job = exposed_dp(16_777_216)
    large, big_buckets = exposed_dp(5e8)
    params = 1_764_979_200
    assert job_stage_parameters(job, 0).dense == params
    assert (gradient_chunks(job, params, 2), gradient_chunks(big_buckets, params, 2)) == (106, 4)
    links = group_links(job.cluster, job.layout, "dp_cp")
    assert latency("all_gather", links, gpu.performance) > 0
    assert small - large == pytest.approx(102 * latency("all_reduce", links, gpu.performance), rel=1e-9)
    # BF16_Optimizer (fp32 gradients at ZeRO-1): all-reduce buckets, one gather.
    small, _ = exposed_dp(16_777_216, fp32_grads=True)
    large, _ = exposed_dp(5e8, fp32_grads=True)
    assert small - large == pytest.approx(102 * latency("all_reduce", links, gpu.performance), rel=1e-9)


@pytest.mark.parametrize("tensors, numel, largest_group", [(16, 100, 178), (16, 50, 178), (7, 178, 178),
                                                           (5, 30, 100), (9, 60, 178)])
def test_deepspeeds_expert_parameter_groups_are_counted_as_its_split_makes_them(tensors, numel, largest_group):
    """DeepSpeed packs the expert parameters of one group, in order and whole, into optimizer parameter
    groups of at most max_group_size elements (moe/utils.py, split_params_into_different_moe_groups_for_
    optimizer; 178,956,971 by default), and gathers each group after the step: the count priced is the
    count that function makes, run here on tensors of a scaled-down size."""
    torch = pytest.importorskip("torch")
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    from cost_models.dp_time import after_step_gathers

    params = []
    for _ in range(tensors):
        param = torch.nn.Parameter(torch.zeros(numel))
        param.allreduce, param.group_name = False, "ep_size_8"
        params.append(param)
    groups = split_params_into_different_moe_groups_for_optimizer({"name": "experts", "params": params},
                                                                   max_group_size=largest_group)
    split = sum(1 for group in groups if group.get("moe"))
    engine = replace(behaviour_of("deepspeed"), zero_gather_expert_group_params=largest_group)
    assert after_step_gathers(engine, 99, tensors * numel, tensors, expert=True) == split


def test_nanotron_zero1_reduces_fp32_gradients_after_the_backward_and_copies_its_gather_out():
    """nanotron accumulating in fp32 under ZeRO builds no DDP wrapper (``trainer.py``, ``make_ddp``):
    its trainer all-reduces the accumulator's whole fp32 buffer once the backward is done
    (``sync_gradients_across_dp``), its optimizer gathers the updated bf16 shards in one collective and
    then copies every rank's chunk of every parameter out of the flat buffer, one ``copy_`` each
    (``all_gather_coalesced``). nanotron's ZeRO-1 with fp32 gradients exposes exactly that,
    whatever compute could have hidden (4,096 tokens): one all-reduce of 4 bytes a parameter, one
    all-gather of 2, and 64 ranks × 147 tensors (24 layers of six, the embedding, the final norm and
    the head) kernel launches. With 16-bit gradients (DDP) the reduction is the overlapped buckets'."""
    from cost_models.dp_time import gather_copies_time, parameter_tensors

    job = _zero3_job("any", recompute="none")
    job = Job(job.model, job.cluster, TrainingSpec(global_batch_size=64, seq_len=4096, precision="bf16",
                                                   engine=behaviour_of("nanotron"), fp32_grads=True),
              job.layout.with_changes(zero_stage=1))
    params, perf = 1_764_979_200, job.cluster.gpu.performance
    links = group_links(job.cluster, job.layout, "dp_cp")
    assert job_stage_parameters(job, 0).total == params and parameter_tensors(job, 0) == (147, 0)
    assert gather_copies_time(job, 64, 147) == pytest.approx(64 * 147 * 8e-6)
    assert dp_comm_exposed(job, 0, stage_time(job, 0)) == pytest.approx(
        collective_time("all_reduce", 4 * params, links, perf) + collective_time("all_gather", 2 * params, links, perf)
        + 64 * 147 * 8e-6, rel=1e-9)
    ddp = replace(job, training=replace(job.training, fp32_grads=False))
    assert dp_comm_exposed(ddp, 0, stage_time(ddp, 0)) < collective_time("all_reduce", 2 * params, links, perf) \
        + collective_time("all_gather", 2 * params, links, perf) + 64 * 147 * 8e-6
    # Megatron neither reduces in the open nor copies the gather out, nor does plain PyTorch.
    plain = replace(job, training=replace(job.training, engine=behaviour_of("any")))
    assert gather_copies_time(plain, 64, 147) == 0.0
    megatron = replace(job, training=replace(job.training, engine=behaviour_of("megatron")))
    assert gather_copies_time(megatron, 64, 147) == 0.0
    assert dp_comm_exposed(megatron, 0, stage_time(megatron, 0)) \
        < collective_time("all_reduce", 4 * params, links, perf)


def test_ddp_buckets_hold_the_16_bit_gradients_when_reduced_in_fp32():
    """PyTorch DDP fills its 25 MiB buckets with what autograd writes, gradients in the
    parameters' dtype; an engine that reduces them in fp32 (nanotron's accumulation hook) reduces
    each bucket's fp32 buffers in one collective. So fp32 doubles the bytes, not the collectives:
    on links with no bandwidth limit each step pays ⌈P ÷ (25 MiB ÷ 2 B)⌉ all-reduces' latency,
    in bf16 and in fp32 alike."""
    from cost_models.collectives import latency

    gpu = GPUSpec(name="a100", memory_bytes=80e9, peak_flops={"bf16": 312e12}, hbm_bandwidth=2.0e12,
                  intra_node_bandwidth=1e21, inter_node_bandwidth=1e21, gpus_per_node=8, nvlink_domain=8,
                  performance=Performance(link_latency_s=4e-6, comm_overlap=0.0))
    cluster = ClusterSpec(gpu=gpu, num_gpus=16, fabric=FabricSpec(efficiency=1.0, latency_s=50e-6))
    layout = Layout(dp=16, micro_batch_size=1, zero_stage=0)
    jobs = [Job(_gpt(), cluster, TrainingSpec(global_batch_size=16, seq_len=2, precision="bf16",
                                              engine=behaviour_of("any"), fp32_grads=fp32), layout)
            for fp32 in (False, True)]
    params = job_stage_parameters(jobs[0], 0).total
    buckets = math.ceil(params / (25 * 2**20 / 2))
    assert state_bytes(jobs[1].training).gradients == 4
    one = latency("all_reduce", group_links(cluster, layout, "dp_cp"), gpu.performance)
    for job in jobs:
        assert gradient_chunks(job, params, state_bytes(job.training).weights) == buckets
        assert dp_comm_exposed(job, 0, stage_time(job, 0)) == pytest.approx(buckets * one, rel=1e-6)


def test_the_embeddings_gradient_bucket_reduces_in_the_open():
    """The input embedding's gradient is the last one backward produces, and a parameter larger
    than DDP's 25 MB buckets gets one of its own: its all-reduce starts once nothing is left to
    compute. With compute long enough to hide the rest (4,096 tokens, overlap 1), ZeRO-0 pays
    that bucket's share of the all-reduce, 2·63/64 of V·h bf16 gradients over the node's eight
    NICs, where a stage without the embedding pays one 25 MB bucket's share."""
    from cost_models.dp_time import gradient_chunks, last_bucket_parameters

    job = _zero3_job("any", recompute="none")
    job = Job(job.model, job.cluster, TrainingSpec(global_batch_size=64, seq_len=4096, precision="bf16",
                                                   engine=behaviour_of("any")), job.layout.with_changes(zero_stage=0))
    params, embedding = 1_764_979_200, 51200 * 2304
    all_reduce = 2 * 63 / 64 * 2 * params / (8 * 25e9)
    assert 2 * stage_time(job, 0).compute / 3 > all_reduce  # the backward could hide it all
    assert last_bucket_parameters(job, 0) == embedding
    assert dp_comm_exposed(job, 0, stage_time(job, 0)) == pytest.approx(all_reduce * embedding / params, rel=1e-9)
    # The stages after the first end their backward with a layer: one bucket's share waits.
    two_stages = replace(job, layout=job.layout.with_changes(pp=2, dp=32))
    assert last_bucket_parameters(two_stages, 1) == 0
    stage1 = job_stage_parameters(two_stages, 1).total
    chunks = gradient_chunks(two_stages, stage1, 2)
    assert dp_comm_exposed(two_stages, 1, stage_time(two_stages, 1)) \
        == pytest.approx(2 * 31 / 32 * 2 * stage1 / (8 * 25e9) / chunks, rel=1e-9)


def test_zero3_gathers_once_for_the_recompute_and_the_backward():
    """Per micro-batch: a forward gather, a backward gather and a gradient reduce-scatter. FSDP
    recomputes inside the unit its backward hook has already gathered, and copies each unit
    through its flat buffers: the shard in and the unit out around a gather, the gradients in and
    the reduced shard out around a reduce-scatter. DeepSpeed's forward pre-hook gathers for the
    recompute, and keeps the module gathered for the backward that uses it next, within
    max_reuse_distance (partitioned_param_coordinator.py, __params_to_release): it was priced a
    third gather."""
    fsdp, deepspeed = _zero3_job("torchtitan"), _zero3_job("deepspeed")
    # 24 layers of 12h² + 4h, an untied embedding and head of V·h each, a final norm (2h):
    # h = 2304, V = 51,200.
    params = 24 * (12 * 2304 ** 2 + 4 * 2304) + 2 * 51200 * 2304 + 2 * 2304
    assert job_stage_parameters(fsdp, 0).total == params == 1_764_979_200
    # 64 ranks over 8 nodes: the ring runs on the eight NICs of a node (8 · 25 GB/s, under NVLink's
    # 300); each rank moves 63/64 of the gathered bf16 weights, and of the reduced gradients.
    bus = 8 * 25e9
    gather = 63 / 64 * 2 * params / bus
    reduce_fsdp = 63 / 64 * 4 * params / bus  # torchtitan reduces in fp32
    reduce_ds = 63 / 64 * 2 * params / bus
    # What the (weight-reading) compute of the one micro-batch hides: the forward gather
    # behind the forward, the rest behind the backward and the recompute.
    stage = stage_time(fsdp, 0)
    forward, backward = stage.compute / 3, 2 * stage.compute / 3 + stage.recompute
    assert gather > forward and gather > backward  # communication-bound by construction
    # FSDP2's copies read and write the unit and its 1/64 shard at the element-wise kernels'
    # bandwidth (the default 0.8 of 2 TB/s): bf16 weights around a gather, fp32 gradients
    # around a reduce-scatter.
    per_byte = 2 * (1 + 1 / 64) / (0.8 * 2.0e12)
    gather_fsdp = gather + per_byte * 2 * params
    reduce_fsdp += per_byte * 4 * params
    assert step_time(fsdp).dp_comm_s == pytest.approx(
        gather_fsdp - forward + gather_fsdp + reduce_fsdp - backward, rel=1e-6)
    # DeepSpeed's compute differs (an eager loss): its own forward and backward hide its traffic.
    stage = stage_time(deepspeed, 0)
    forward, backward = stage.compute / 3, 2 * stage.compute / 3 + stage.recompute
    assert step_time(deepspeed).dp_comm_s == pytest.approx(
        gather - forward + gather + reduce_ds - backward, rel=1e-6)


@pytest.mark.parametrize("h, heads, pays", [(12288, 96, True), (2304, 24, False)])
def test_tp_comm_overlap_hides_collectives_of_large_gemms_not_small_ones(h, heads, pays):
    """Without overlap a layer pays its four collectives in each pass. With chunked overlap the
    first of tp chunks of each still waits in the open (the pipeline fills), and each GEMM runs
    as tp smaller ones: for GPT-3's width that is far cheaper than the collectives; for a
    2304-wide model cut 8 ways the extra kernel launches cost more than the overlap saves."""
    model = ModelSpec(name="gpt", num_layers=4, hidden_size=h, num_attention_heads=heads, vocab_size=51200)

    def job(overlap: bool) -> Job:
        return Job(model, ClusterSpec(gpu=_gpu(), num_gpus=64),
                   TrainingSpec(global_batch_size=512, seq_len=2048, precision="bf16", tp_comm_overlap=overlap,
                                engine=behaviour_of("megatron")),
                   Layout(dp=8, tp=8, micro_batch_size=1, sequence_parallel=True))
    plain, overlapped = job(False), job(True)
    # Sequence parallel: an all-gather or reduce-scatter of the b·s·h bf16 activations, a ring of
    # 7 steps of 10 µs moving 7/8 of them at NVLink's 300 · 0.75 GB/s. Each layer gathers before
    # and reduce-scatters after its attention and its MLP in forward, and the same in backward:
    # 8 collectives in each of the 4 layers.
    one = 7 * 10e-6 + 7 / 8 * (2048 * h * 2) / (300e9 * 0.75)
    assert stage_time(plain, 0).tp_comm == pytest.approx(4 * 8 * one)
    fill = 4 * 8 * one / 8  # the first of tp = 8 chunks of each
    assert stage_time(overlapped, 0).tp_comm > fill
    assert (stage_time(overlapped, 0).tp_comm < stage_time(plain, 0).tp_comm / 2) == pays


def test_tied_embedding_gradients_cross_the_pipeline_once_per_step():
    """First and last stage sum their tied-embedding gradients after the pipeline drains:
    V·h/t gradients, one send each way's worth over the link between them."""
    tied = ModelSpec(name="gpt", num_layers=24, hidden_size=2304, num_attention_heads=24, vocab_size=51200,
                     tied_embeddings=True)
    job = Job(tied, ClusterSpec(gpu=_gpu(link_latency_s=0.0), num_gpus=16, fabric=IDEAL_FABRIC),
              TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16"),
              Layout(dp=1, tp=8, pp=2, micro_batch_size=1))
    expected = 51200 * 2304 / 8 * 2 / 25e9  # fp16 gradients over one 25 GB/s NIC
    assert dp_comm_exposed(job, 0, stage_time(job, 0)) == pytest.approx(expected)
    assert dp_comm_exposed(job, 1, stage_time(job, 1)) == pytest.approx(expected)


def test_deepspeed_pipelines_reduce_gradients_after_the_last_microbatch():
    def job(engine: str) -> Job:
        return Job(_gpt(layers=24), ClusterSpec(gpu=_gpu(), num_gpus=64),
                   TrainingSpec(global_batch_size=512, seq_len=2048, precision="bf16", engine=behaviour_of(engine),
                                fp32_grads=False),
                   Layout(dp=16, pp=4, micro_batch_size=1, zero_stage=0))
    ds, mg = job("deepspeed"), job("megatron")
    # A middle stage holds 6 layers of 12h² + 4h (h = 2304) and no embedding; the whole bucketed
    # all-reduce is exposed for DeepSpeed. Its bucket is 5e8 elements: one bucket here
    # (Megatron's: max(40 M, 1 M · dp) parameters).
    params = 6 * (12 * 2304 ** 2 + 4 * 2304)
    assert job_stage_parameters(ds, 1).total == params == 382_261_248
    assert gradient_chunks(ds, params, 2) == 1
    # dp 16 spans two nodes: a tree of 2·log₂8 steps inside and 2·log₂2 across, 10 µs each; the
    # ring moves 2·15/16 of the bf16 gradients at min(NVLink 300 · 0.75, eight NICs 8 · 25 · 0.8).
    whole = (2 * 3 + 2 * 1) * 10e-6 + 2 * 15 / 16 * 2 * params / min(300e9 * 0.75, 8 * 25e9 * 0.8)
    assert dp_comm_exposed(ds, 1, stage_time(ds, 1)) == pytest.approx(whole)
    assert dp_comm_exposed(mg, 1, stage_time(mg, 1)) < whole


def test_deepspeeds_bf16_optimizer_folds_every_microbatchs_gradients_into_fp32():
    """DeepSpeed's BF16_Optimizer (bf16 with fp32 gradients at ZeRO 0-1) zeroes the bf16 gradients
    before each backward and adds their fp32 cast to its fp32 buffers after it: 2 + (2 + 4) + (8 + 4)
    = 20 bytes a parameter, each micro-batch, at the in-place kernels' bandwidth. Megatron folds
    them inside its wgrad GEMMs; DeepSpeed's ZeRO-2 holds gradient shards."""
    def stage(engine: str, fp32_grads: bool, zero: int = 1) -> float:
        job = Job(_gpt(layers=24), ClusterSpec(gpu=_gpu(in_place_efficiency=0.8), num_gpus=64),
                  TrainingSpec(global_batch_size=512, seq_len=2048, precision="bf16", engine=behaviour_of(engine),
                               fp32_grads=fp32_grads),
                  Layout(dp=16, pp=4, micro_batch_size=1, zero_stage=zero))
        return stage_time(job, 1).compute
    params = 6 * (12 * 2304 ** 2 + 4 * 2304)  # a middle stage's 6 layers
    assert stage("deepspeed", True) - stage("deepspeed", False) == pytest.approx(20 * params / (0.8 * 2.0e12))
    assert stage("deepspeed", True, zero=2) == stage("deepspeed", False, zero=2)
    assert stage("megatron", True) == stage("megatron", False)


def test_deepspeeds_bf16_optimizer_reduces_after_the_backward_without_a_pipeline_too():
    """Without a pipeline the BF16_Optimizer has no reduce_gradients of its own: DeepSpeed all-reduces
    its fp32 gradients once the last backward is done (engine.allreduce_gradients →
    buffered_allreduce_fallback) and gathers the updated bf16 weights after the step: nothing overlaps."""
    job = Job(_gpt(layers=24), ClusterSpec(gpu=_gpu(), num_gpus=64),
              TrainingSpec(global_batch_size=512, seq_len=2048, precision="bf16", engine=behaviour_of("deepspeed"),
                           fp32_grads=True),
              Layout(dp=64, micro_batch_size=1, zero_stage=1))
    params = job_stage_parameters(job, 0).dense
    links, perf = group_links(job.cluster, job.layout, "dp_cp"), job.cluster.gpu.performance
    chunks = gradient_chunks(job, params, 2)
    # The fp32 all-reduce in 5e8-element buckets; the bf16 gather one all_gather_into_tensor of the
    # optimizer's one parameter group (update_lp_params → all_gather_dp_groups, runtime/utils.py).
    whole = chunks * collective_time("all_reduce", 4 * params / chunks, links, perf) \
        + collective_time("all_gather", 2 * params, links, perf)
    assert chunks > 1
    assert dp_comm_exposed(job, 0, stage_time(job, 0)) == pytest.approx(whole)


def test_deepspeed_without_zero_reduces_after_the_backward():
    """At stage 0 DeepSpeed's engine all-reduces the gradients at the accumulation boundary, after
    ``loss.backward()`` returns (``engine.allreduce_gradients`` → ``buffered_allreduce_fallback``), in
    fp16 as in fp32: nothing hides it, whatever the last backward's length. It was priced as DDP's
    buckets behind that backward (a micro-batch of 4 hid more than one of 1), as Megatron's are."""
    def job(engine: str, micro_batch_size: int) -> Job:
        return Job(_gpt(layers=24), ClusterSpec(gpu=_gpu(), num_gpus=64),
                   TrainingSpec(global_batch_size=512, seq_len=2048, precision="fp16", engine=behaviour_of(engine)),
                   Layout(dp=64, micro_batch_size=micro_batch_size, zero_stage=0))

    def exposed_dp(engine: str, micro_batch_size: int) -> float:
        return dp_comm_exposed(job(engine, micro_batch_size), 0, stage_time(job(engine, micro_batch_size), 0))

    ds = job("deepspeed", 1)
    params = job_stage_parameters(ds, 0).dense
    links, perf = group_links(ds.cluster, ds.layout, "dp_cp"), ds.cluster.gpu.performance
    chunks = gradient_chunks(ds, params, 2)
    whole = chunks * collective_time("all_reduce", 2 * params / chunks, links, perf)  # fp16 gradients, every bucket
    for micro_batch_size in (1, 4):
        assert exposed_dp("deepspeed", micro_batch_size) == pytest.approx(whole)
    # Megatron's buckets hide behind the backward but for the last.
    assert exposed_dp("megatron", 1) < whole / 4


def test_a_stage_whose_pipeline_neighbours_are_across_nodes_runs_no_faster_than_its_collectives_floor():
    """nanotron (its Playbook sweep): with its pipeline neighbours in another node, a
    stage takes at least f0 + f1·(tp − 1) per tensor-parallel collective for a micro-batch, the GPU's
    work beneath it: its layers × 2 passes × 4 collectives (sequence parallelism) × (f0 + 7·f1) at tp 8.
    The same stage within one node, and Megatron's (fixed shapes, no host read per receive), run at
    their GPU time."""
    generic = behaviour_of("nanotron")
    f0, f1 = generic.pipeline_collective_floor_s, generic.pipeline_collective_floor_rank_s
    assert f0 > 0 and f1 > 0

    def job(engine: str, num_gpus: int, micro_batch_size: int = 1) -> Job:
        return Job(_gpt(layers=24), ClusterSpec(gpu=_gpu(), num_gpus=num_gpus),
                   TrainingSpec(global_batch_size=512, seq_len=2048, precision="bf16", flash_attention=True,
                                engine=behaviour_of(engine)),
                   Layout(tp=8, pp=4, dp=num_gpus // 32, micro_batch_size=micro_batch_size, sequence_parallel=True))

    layers = job("nanotron", 32).stage_layers[1]  # the engine balances the stages: the middle ones hold 7
    across = stage_time(job("nanotron", 32), 1)  # 4 stages of 8: each stage a node of its own
    assert across.total == pytest.approx(layers * 2 * 4 * (f0 + 7 * f1))
    # Beneath the floor the micro-batch does not matter; above it, the GPU's time stands.
    assert stage_time(job("nanotron", 32, micro_batch_size=2), 1).total == pytest.approx(across.total)
    big = job("nanotron", 32, micro_batch_size=64)
    fwd, bwd = tp_exposed_per_layer(big.model, big.training, big.cluster, 8, 1, 64, True)
    assert stage_time(big, 1).tp_comm == pytest.approx(layers * (fwd + bwd))
    # Where one NVLink domain holds the whole pipeline (64 GPUs a node), no stage has a neighbour across.
    inside = replace(job("nanotron", 32), cluster=ClusterSpec(gpu=replace(_gpu(), gpus_per_node=64, nvlink_domain=64),
                                                          num_gpus=32))
    assert stage_time(inside, 1).total < across.total / 2
    assert stage_time(job("megatron", 32), 1).total < across.total / 2


def test_a_tensor_parallel_group_across_nodes_runs_no_faster_than_its_collectives_floor():
    """nanotron (its tp 16 and 32 in the Playbook's sweep): a tensor-parallel group
    that spans NVLink domains takes at least c·(tp − 1) per collective, the GPU's work beneath it: without
    a pipeline, 24 layers × 2 passes × 4 collectives × 15·c at tp 16 on 8-GPU nodes. The group inside a
    node (tp 8), and Megatron's, pay none; with a pipeline across nodes the larger floor stands."""
    c = behaviour_of("nanotron").cross_domain_tp_rank_s
    assert c > 0

    def job(engine: str, tp: int, pp: int = 1) -> Job:
        return Job(_gpt(layers=24, h=2048, a=32), ClusterSpec(gpu=_gpu(), num_gpus=64),
                   TrainingSpec(global_batch_size=512, seq_len=2048, precision="bf16", flash_attention=True,
                                engine=behaviour_of(engine)),
                   Layout(tp=tp, pp=pp, dp=64 // (tp * pp), micro_batch_size=1, sequence_parallel=True))

    spans = stage_time(job("nanotron", 16), 0)
    assert spans.total == pytest.approx(24 * 2 * 4 * 15 * c)
    assert cross_domain_tp_floor(job("nanotron", 8), 8) == 0.0
    assert cross_domain_tp_floor(job("megatron", 16), 8) == 0.0
    assert cross_domain_tp_floor(job("any", 16), 8) == 0.0  # plain PyTorch: NCCL's own time
    assert stage_time(job("megatron", 16), 0).total < spans.total / 2
    # With a pipeline whose neighbours are across nodes, the pipeline's floor is the larger: it alone stands.
    piped = job("nanotron", 16, pp=2)
    generic = behaviour_of("nanotron")
    per = generic.pipeline_collective_floor_s + 15 * generic.pipeline_collective_floor_rank_s
    assert stage_time(piped, 1).total == pytest.approx(piped.stage_layers[1] * 2 * 4 * per)


def test_bf16_gradients_stay_bf16_unless_the_engine_or_case_says_fp32():
    """Megatron-core reduces gradients in the parameters' dtype (DistributedDataParallelConfig
    grad_reduce_in_fp32 = False): the ZeRO paper's 16 bytes. torchtitan's FSDP2 reduces in
    fp32, and a case may ask for it (Megatron-LM's pretrain script): 18 bytes with Adam. torchtitan
    0.3.0 runs FSDP2 at every ZeRO stage (models/llama3/parallelize.py: "Always run
    apply_fsdp_to_decoder"), holding the fp32 parameters it builds as the master: 4 + 4 + 8."""
    def training(**kw) -> TrainingSpec:
        return TrainingSpec(global_batch_size=8, seq_len=2048, precision="bf16", **kw)
    assert state_bytes(training(engine=behaviour_of("megatron"))).total == 16
    assert state_bytes(training(engine=behaviour_of("megatron"), fp32_grads=True)).total == 18
    assert working_bytes(training(engine=behaviour_of("torchtitan"))).gradients == 4
    assert state_bytes(training(engine=behaviour_of("torchtitan"))) == StateBytes(weights=4, gradients=4, optimizer=8)
    assert state_bytes(training(engine=behaviour_of("any"))).total == 16
    assert state_bytes(training(engine=behaviour_of("deepspeed"), fp32_grads=True)).total == 18
    assert state_bytes(TrainingSpec(global_batch_size=8, seq_len=2048, precision="fp16",
                                    engine=behaviour_of("megatron"))).total == 16


def test_cross_entropy_traffic_per_logit():
    """fp32 softmax cross-entropy: forward (p+4) + 4 + 8, backward 8 + (4+p) bytes per logit."""
    assert cross_entropy_bytes(1000, TrainingSpec(global_batch_size=1, seq_len=8, precision="bf16")) == 1000 * 32
    assert cross_entropy_bytes(1000, TrainingSpec(global_batch_size=1, seq_len=8, precision="fp32")) == 1000 * 36


def test_the_loss_evaluates_its_exponents_at_the_transcendental_rate():
    """bf16, 1000 logits: 32 bytes each, of which the exp-and-sum (8) and the backward's softmax (8)
    run at the transcendental share (0.2 here) of the bandwidth, the other 16 at hbm_efficiency (0.7)."""
    gpu = _gpu(hbm_efficiency=0.7, transcendental_efficiency=0.2)
    training = TrainingSpec(global_batch_size=1, seq_len=8, precision="bf16")
    assert cross_entropy_time(1000, training, gpu) == pytest.approx(
        16_000 / (0.7 * gpu.hbm_bandwidth) + 16_000 / (0.2 * gpu.hbm_bandwidth))


def test_comm_overlap_scales_what_compute_hides():
    """exposed = comm − overlap · min(comm, compute), calibration's own definition of overlap
    (t_both = t_comm + t_compute − overlap · min): everything at 0, the excess alone at 1."""
    assert exposed(3.0, 2.0, Performance(comm_overlap=0.0)) == 3.0
    assert exposed(3.0, 2.0, Performance(comm_overlap=1.0)) == 1.0
    assert exposed(3.0, 2.0, Performance(comm_overlap=0.5)) == 2.0
    assert exposed(1.0, 2.0, Performance(comm_overlap=1.0)) == 0.0
    # Communication that compute could hide entirely still costs its unhidden share.
    assert exposed(1.0, 2.0, Performance(comm_overlap=0.6)) == pytest.approx(0.4)
    with pytest.raises(SpecError, match="comm_overlap"):
        Performance(comm_overlap=1.5)


def test_gather_and_scatter_run_at_their_share_of_the_bus_bandwidth():
    links = GroupLinks(size=8, per_domain=8, domains=1, intra_bandwidth=100e9, inter_bandwidth=10e9)
    perf = Performance(intra_node_efficiency=1.0, link_latency_s=0.0, all_gather_efficiency=0.5,
                       reduce_scatter_efficiency=0.25)
    S = 1e9
    assert collective_time("all_gather", S, links, perf) == pytest.approx(7 / 8 * S / 50e9)
    assert collective_time("reduce_scatter", S, links, perf) == pytest.approx(7 / 8 * S / 25e9)
    assert collective_time("all_reduce", S, links, perf) == pytest.approx(2 * 7 / 8 * S / 100e9)


def test_one_compute_die_is_priced_alike_up_to_its_measured_clock_headroom():
    """MI300X and MI325X share the CDNA3 compute die and its peak; in one benchmark (AMD ROCm blog
    'Measuring Max-Achievable FLOPs - Part 2', hipBLASLt, same shapes) the MI325X's best bf16 GEMM ran
    843 TFLOP/s to the MI300X's 708 (its 1000 W holds higher clocks): its training compute is at most
    that much faster. It was priced 1.38x faster, from another rule than the MI300X's figure."""
    import planner

    def compute(gpu: str) -> float:
        return planner.estimate({"model": {"preset": "llama3-8b"}, "cluster": {"gpu": gpu, "num_gpus": 8},
                                 "training": {"global_batch_size": 64, "seq_len": 8192, "precision": "bf16",
                                              "engine": "megatron"},
                                 "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": 1}}).time.by_part()["compute_s"]

    assert 1.0 < compute("mi300x") / compute("mi325x") <= 843 / 708


def test_h200_is_never_slower_than_h100_on_the_same_layout():
    """The same GH100 die at the same clocks, with more and faster HBM: its fused attention was set from
    an in-step figure (0.50) where H100's is a kernel benchmark's (0.55), and at 128k tokens H200 was
    priced 5 % slower than H100, so `size` bought the smaller card."""
    import planner

    for seq, cp in ((8192, 1), (32768, 2), (131072, 4)):
        def step(gpu: str) -> float:
            return planner.estimate({"model": {"preset": "llama3-8b"}, "cluster": {"gpu": gpu, "num_gpus": 64},
                                     "training": {"global_batch_size": 32, "seq_len": seq, "precision": "bf16",
                                                  "engine": "megatron"},
                                     "layout": {"dp": 64 // (4 * cp), "tp": 4, "cp": cp, "micro_batch_size": 1,
                                                "zero_stage": 1, "sequence_parallel": True,
                                                "recompute": "full"}}).step_time_s
        assert step("h200-sxm-141gb") <= step("h100-sxm-80gb") * (1 + 1e-9), seq


def test_megatrons_gradient_bucket_grows_with_the_context_parallel_ranks_too_and_deepspeeds_not_at_all():
    """Megatron-LM's bucket is max(40 M, 1 M · dp·cp) parameters (training.py, get_model:
    get_data_parallel_world_size(with_context_parallel=True)); it was grown by dp alone. DeepSpeed's
    reduce_bucket_size stays 5e8 elements at any dp; it grew as Megatron's did."""
    params = 4e9
    for engine, dp, cp, per_bucket in (("megatron", 64, 4, 256e6), ("megatron", 16, 1, 40e6),
                                       ("deepspeed", 1024, 1, 5e8)):
        job = Job(_gpt(), ClusterSpec(gpu=_gpu(), num_gpus=dp * cp),
                  TrainingSpec(global_batch_size=dp * cp, seq_len=2048, precision="bf16", engine=behaviour_of(engine)),
                  Layout(dp=dp, cp=cp, micro_batch_size=1, zero_stage=1))
        assert gradient_chunks(job, params, 2) == math.ceil(params / per_bucket)
