"""The cost models' newer formulas, each against its exact expression or a limit it must meet:
linear layers under a recipe, grouped expert GEMMs, the expert part of an MoE layer (tokens,
GEMMs, dispatch, memory), the search's lower bound, the optimizer's local parameters and the
offload copies."""

from __future__ import annotations

import math

import pytest

from cost_models.experts import (alltoall_buffer_bytes, dispatch_bytes, dispatch_combine_time, expert_gemms,
                                 moe_mlp_activation_bytes, moe_mlp_time, moe_tokens, remote_domains_per_token,
                                 routed_tokens)
from cost_models.flops import Gemm
from cost_models.kernels import gemm_time, grouped_gemm_time, k_loop_efficiency, linear_time
from cost_models.model_states import (adam_step_bytes, optimizer_step_bytes, state_bytes, weights_are_master,
                                     zero_shards)
from cost_models.offload import activation_offload_time, optimizer_offload_time, param_offload_time
from cost_models.quantization import RECIPES
from cost_models.specs import Layout
from cost_models.layer_time import layer_time, layer_time_bound, layer_time_for, moe_layer_time_for
from cost_models.memory import optimizer_local_parameters
from cost_models.optimizer_time import optimizer_time
from cost_models.topology import group_links
from planner.case import load_case
from planner.engines import behaviour_of


def _job(model="mixtral-8x7b", gpu="h100-sxm-80gb", num_gpus=64, precision="bf16", layout=None, engine="megatron",
         **training):
    case = {"model": {"preset": model}, "cluster": {"gpu": gpu, "num_gpus": num_gpus},
            "training": {"global_batch_size": 256, "seq_len": 4096, "precision": precision, **training},
            "search": {"target": engine},
            "layout": layout or {"tp": 2, "pp": 1, "dp": num_gpus // 2, "ep": 8, "zero_stage": 1,
                                 "sequence_parallel": True, "micro_batch_size": 1}}
    return load_case(case).job()


# --- linear layers and grouped GEMMs (cost_models/kernels.py) ---

def test_a_16_bit_linear_runs_its_input_and_weight_gradients_at_their_own_shapes_in_backward():
    """Y = X·Wᵀ, X m×k, W n×k: dX = dY·W is m×k over K = n, dW = dYᵀ·X is n×k over K = m."""
    job = _job()
    gpu = job.cluster.gpu
    g = Gemm("fc1", 4096, 14336, 4096)
    forward, backward = linear_time(g, gpu, job.training)
    assert forward == gemm_time(g, gpu, "bf16")
    assert backward == gemm_time(Gemm("dgrad", 4096, 4096, 14336), gpu, "bf16") \
        + gemm_time(Gemm("wgrad", 4096, 14336, 4096), gpu, "bf16")


def test_a_short_k_gemm_runs_as_deepgemm_measured_on_hopper():
    """DeepGEMM's fp8 GEMMs on H800 (deepseek-ai/DeepGEMM README, 2025-03-25; M 4096): 751 TFLOP/s
    at K 512 (N 32768) against 1426 at K 16384 (N 7168), 0.527 as fast; and 1125 at K 1536 (N 24576),
    0.789 as fast. Both shapes fill H100's SMs many times over, so only the K loop's share differs."""
    gpu = _job(precision="fp8").cluster.gpu
    assert k_loop_efficiency(512, gpu, "fp8") / k_loop_efficiency(16384, gpu, "fp8") == pytest.approx(751 / 1426, rel=0.02)
    assert k_loop_efficiency(1536, gpu, "fp8") / k_loop_efficiency(16384, gpu, "fp8") == pytest.approx(1125 / 1426, rel=0.02)
    # At the K the efficiencies were fitted at, the shape term is 1.
    assert k_loop_efficiency(gpu.performance.gemm_reference_k, gpu, "bf16") == pytest.approx(1.0)


# Quantize bytes counted by hand for torchao (each use cast from the bf16 tensor, 2 bytes read per
# pass, 1 byte written per fp8 layout), X = m·k = 2²⁵, W = n·k = 2²⁴ at half its share, dY = m·n = 2²⁵.
# tensorwise reads each tensor twice (amax, then cast) and quantizes X, W and dY for two GEMMs each:
#   forward: X once (2·2 + 1 = 5 B) and W once (5 B · ½) = 5·2²⁵ + 2.5·2²⁴
#   backward: X's second layout, W's second layout, dY twice (10 B) = 5·2²⁵ + 2.5·2²⁴ + 10·2²⁵
# rowwise_with_gw_hp has no amax pass and runs wgrad in bf16, so X and dY are cast once (3 B):
#   forward: X (3 B) and W (3 B · ½) = 3·2²⁵ + 1.5·2²⁴;  backward: W (1.5 B) and dY (3 B).
@pytest.mark.parametrize("recipe, forward_bytes, backward_bytes", [
    ("tensorwise", 12.5 * 2 ** 24, 32.5 * 2 ** 24),
    ("rowwise_with_gw_hp", 7.5 * 2 ** 24, 7.5 * 2 ** 24)])
def test_a_quantized_linear_adds_its_quantize_traffic_and_keeps_wgrad_where_the_recipe_says(
        recipe, forward_bytes, backward_bytes):
    job = _job(model="llama3-8b", precision="fp8", fp8_recipe=recipe, engine="torchtitan",
               layout={"tp": 1, "dp": 64, "micro_batch_size": 1})
    gpu = job.cluster.gpu
    g = Gemm("wo", 8192, 4096, 4096)
    bandwidth = gpu.performance.hbm_efficiency * gpu.hbm_bandwidth
    low = gemm_time(g, gpu, "fp8", RECIPES[recipe])
    dgrad = gemm_time(Gemm("dgrad", 8192, 4096, 4096), gpu, "fp8", RECIPES[recipe])
    shape = Gemm("wgrad", 4096, 4096, 8192)
    wgrad = gemm_time(shape, gpu, "bf16") if recipe == "rowwise_with_gw_hp" else gemm_time(shape, gpu, "fp8", RECIPES[recipe])
    forward, backward = linear_time(g, gpu, job.training, weight_share=0.5)
    assert forward == pytest.approx(low + forward_bytes / bandwidth)
    assert backward == pytest.approx(dgrad + wgrad + backward_bytes / bandwidth)
    assert (wgrad > dgrad) == (recipe == "rowwise_with_gw_hp")  # the bf16 wgrad is the slower GEMM


def test_compute_bound_experts_run_as_one_gemm_of_all_their_rows():
    """G experts of m rows each (m a whole number of tiles) in one grouped kernel: the tiles of all
    groups share the SMs, so where compute bounds it the kernel takes what one GEMM of G·m rows
    takes; a group of one is exactly :func:`gemm_time`."""
    gpu = _job().cluster.gpu
    g = Gemm("expert_fc1", 1024, 2 * 14336, 4096)
    assert grouped_gemm_time(g, 1, gpu, "bf16") == gemm_time(g, gpu, "bf16")
    assert grouped_gemm_time(g, 4, gpu, "bf16") == pytest.approx(gemm_time(Gemm("all", 4096, g.n, g.k), gpu, "bf16"))


def test_experts_on_four_streams_share_the_sms_four_at_a_time_and_pay_each_kernel():
    """Transformer Engine's GroupedLinear: one GEMM per expert, round-robin on 4 streams. 128
    experts of 256 rows (Qwen3-30B-A3B's fc1, 2·768 wide, 2048 deep, at EP 1): four GEMMs' tiles
    at a time (4·2·6 = 48 of H100's 132 SMs; K = 2048 splits in two, 96 busy) and 32 fixed costs
    per stream; 16 experts of 2,048 rows (EP 8) fill the SMs and pay 4."""
    gpu = _job().cluster.gpu
    perf = gpu.performance
    t0 = perf.kernel_overhead_s
    one_gemm = Gemm("expert_fc1", 256, 2 * 768, 2048)
    flops = 128 * 2 * 256 * 2 * 768 * 2048
    rate = perf.gemm_efficiency_for("bf16") * gpu.peak("bf16") * perf.sustained_clock \
        * k_loop_efficiency(2048, gpu, "bf16")
    four_at_a_time = flops / (rate * 96 / 132)
    assert grouped_gemm_time(one_gemm, 128, gpu, "bf16", streams=4) == pytest.approx(four_at_a_time + 32 * t0)
    large = Gemm("expert_fc1", 2048, 2 * 768, 2048)
    assert grouped_gemm_time(large, 16, gpu, "bf16", streams=4) == pytest.approx(flops / rate + 4 * t0)
    assert grouped_gemm_time(large, 16, gpu, "bf16") == pytest.approx(flops / rate + t0)  # one grouped kernel


# --- the expert part of an MoE layer (cost_models/experts.py) ---

def test_each_rank_routes_its_sequence_parallel_tokens_to_k_experts():
    """Mixtral (top-2), s 4096, b 2, tp 2, cp 2: 2·4096/4 = 2048 tokens; with etp 2 the busiest
    rank runs 2048·2·2 copies; the all-to-all moves 2048·2·4096 bf16 elements."""
    job = _job()
    model, training = job.model, job.training
    assert moe_tokens(training, tp=2, cp=2, micro_batch_size=2) == 2048
    assert routed_tokens(model, training, 2, 2, 2, etp=2) == 2048 * 2 * 2 * model.routed_factor
    assert dispatch_bytes(model, training, 2, 2, 2) == 2 * 2048 * 2 * 4096 * model.routed_factor


def test_local_experts_share_the_routed_copies_on_their_width_share():
    """8 experts over ep 4: 2 local experts, each on half the copies, SwiGLU's gate and up fused
    (2·f/etp wide), down projection f/etp deep."""
    model = _job().model
    fc1, fc2, local = expert_gemms(model, routed=8192, ep=4, etp=2)
    assert local == 2
    assert (fc1.m, fc1.n, fc1.k) == (4096, 2 * 14336 / 2, 4096)
    assert (fc2.m, fc2.n, fc2.k) == (4096, 4096, 14336 / 2)


@pytest.mark.parametrize("domains, k, expected", [(1, 8, 0.0), (2, 1, 0.5), (4, 8, 3 * (1 - 0.75 ** 8))])
def test_a_token_reaches_the_domains_its_experts_are_in(domains, k, expected):
    from dataclasses import replace

    model = replace(_job().model, moe_top_k=k)
    assert remote_domains_per_token(model, domains) == pytest.approx(expected)


def test_dispatch_inside_one_node_is_two_all_to_alls_of_the_routed_copies():
    """ep 8 in one node: each rank sends its 4096 tokens' 2 copies of h = 4096 bf16 elements,
    67,108,864 bytes, 7/8 of them to its peers over NVLink, all peers at once (one latency);
    the dispatch and the combine each move that much."""
    job = _job(layout={"tp": 1, "dp": 64, "ep": 8, "micro_batch_size": 1})
    model, training, cluster = job.model, job.training, job.cluster
    assert group_links(cluster, Layout(tp=1, dp=64, ep=8), "ep").domains == 1
    gpu, perf = cluster.gpu, cluster.gpu.performance
    one = perf.link_latency_s + 67_108_864 * 7 / 8 / (gpu.intra_node_bandwidth * perf.intra_node_efficiency)
    assert dispatch_combine_time(model, training, cluster, 1, 1, 1, 8, 1) == pytest.approx(2 * one)


def test_a_deepep_dispatch_sends_a_token_once_to_each_domain_its_experts_are_in():
    """Qwen3-30B-A3B (top-8) with ep 16 over two nodes: a plain all-to-all sends 8/16 of each
    rank's copies across the fabric; DeepEP sends each of its 4096 tokens once to the other node
    where one of its eight experts lives there (1 − (1/2)⁸ of them) and forwards it over NVLink.
    Megatron's flex dispatcher runs DeepEP by default; any engine's dispatch is as the case says."""
    from dataclasses import replace

    from cost_models.collectives import all_to_all_time

    job = _job("qwen3-30b-a3b", layout={"tp": 1, "dp": 64, "ep": 16, "micro_batch_size": 1})
    model, cluster = job.model, job.cluster
    links = group_links(cluster, Layout(tp=1, dp=64, ep=16), "ep")
    assert links.domains == 2
    size = dispatch_bytes(model, job.training, 1, 1, 1)
    plain = 2 * all_to_all_time(size, links, cluster.gpu.performance)
    deepep = 2 * all_to_all_time(size, links, cluster.gpu.performance, crossing_bytes=size / 8 * (1 - 0.5 ** 8))
    assert deepep < plain

    def dispatch(engine, expert_dispatch=None):
        training = replace(job.training, engine=behaviour_of(engine), expert_dispatch=expert_dispatch)
        return dispatch_combine_time(model, training, cluster, 1, 1, 1, 16, 1)

    assert dispatch("megatron") == pytest.approx(deepep)
    assert dispatch("megatron", "all_to_all") == pytest.approx(plain)
    assert dispatch("any") == pytest.approx(plain)
    assert dispatch("any", "deepep") == pytest.approx(deepep)


def test_the_experts_backward_is_about_twice_their_forward_in_16_bits():
    """Each linear's backward runs two GEMMs of its forward's FLOPs; Mixtral's experts (h 4096, f 14336,
    2,048 rows an expert at EP 8) have K of thousands in all three, so only their shapes set them apart."""
    job = _job()
    gpu, lay = job.cluster.gpu, job.layout
    forward, backward = moe_mlp_time(job.model, job.training, gpu, lay.tp, lay.cp, 1, lay.ep, lay.expert_tp)
    assert forward > 0 and backward == pytest.approx(2 * forward, rel=0.03)


def test_one_expert_of_the_dense_width_is_the_dense_layer_plus_its_routing():
    """An MoE layer of one expert as wide as the dense MLP, top-1, on one rank, runs the dense
    layer's GEMMs and element-wise kernels, plus the router GEMM (T × 1 × h) and the routing's
    traffic: softmax and top-1 over T fp32 scores (write, read, read: 12 bytes each) and four
    permutations that read and write T·h bf16 elements (16 bytes each); twice both in backward."""
    from dataclasses import replace

    job = _job(layout={"tp": 1, "dp": 64, "ep": 1, "micro_batch_size": 1})
    gpu, training = job.cluster.gpu, job.training
    one = replace(job.model, num_experts=1, moe_top_k=1)
    assert one.moe_ffn_hidden_size == one.ffn_hidden_size == 14336 and one.routed_factor == 1
    T, h = 4096, 4096
    routing = (12 * T + 16 * T * h) / (gpu.performance.hbm_efficiency * gpu.hbm_bandwidth)
    router = gemm_time(Gemm("router", T, 1, h), gpu, "bf16")
    # The router's input gradient (T × h over K = 1) and weight gradient (h × 1 over K = T).
    router_backward = gemm_time(Gemm("dgrad", T, h, 1), gpu, "bf16") + gemm_time(Gemm("wgrad", h, 1, T), gpu, "bf16")
    moe = moe_layer_time_for(one, training, gpu, 1, 1, 1, False, 1, 1)
    dense = layer_time_for(one, training, gpu, 1, 1, 1, False)
    assert moe.forward - dense.forward == pytest.approx(router + routing)
    assert moe.backward - dense.backward == pytest.approx(router_backward + 2 * routing)
    assert moe.core == dense.core


def test_the_experts_save_router_scores_inputs_and_hidden_activations():
    """Fused SwiGLU (Megatron), bf16, tp 2 and etp 2 (the expert tensor-parallel degree defaults
    to tp): router 2·4·T·E, experts R·(2·h + (2·2 + 2)·f/etp), no shared experts; T = b·s/tp
    tokens, R = T·k·etp copies."""
    job = _job()
    model, training, lay = job.model, job.training, job.layout
    assert lay.expert_tp == 2 and model.routed_factor == 1
    T = 4096 / 2
    R = T * 2 * 2
    expected = 2 * 4 * T * 8 + R * (2 * 4096 + 6 * 14336 / 2)
    assert moe_mlp_activation_bytes(model, training, lay, fused=True, saved_input=2) == pytest.approx(expected)
    # The send and receive buffers of the T·k copies of h bf16 elements (33,554,432 bytes each),
    # gathered over the etp group of 2.
    assert alltoall_buffer_bytes(model, training, lay) == 2 * (T * 2 * 4096 * 2) * 2 == 134_217_728


# --- the search's lower bound (cost_models/step_time.py) ---

@pytest.mark.parametrize("precision, recipe", [("bf16", None), ("fp8", "tensorwise"), ("fp8", "delayed")])
def test_the_bound_never_exceeds_a_layers_time(precision, recipe):
    training = {"fp8_recipe": recipe} if recipe else {}
    for engine in ("megatron", "torchtitan"):
        job = _job(model="llama3-8b", precision=precision, engine=engine,
                   layout={"tp": 2, "dp": 32, "sequence_parallel": True, "micro_batch_size": 2}, **training)
        lay = job.layout
        bound = layer_time_bound(job.model, job.training, job.cluster.gpu, lay.tp, lay.cp, 2, True)
        if recipe is None:
            assert bound == layer_time(job).total
        else:
            assert bound < layer_time(job).total


# --- optimizer shards and offload (cost_models/step_time.py, cost_models/offload.py) ---

def test_the_optimizer_shards_dense_parameters_over_dp_cp_and_experts_over_edp():
    """Mixtral on tp 2, dp 32, ep 8 (edp = 32·1/8 = 4), counted by hand per rank:
    dense 32·(attention 41,943,040/2 + router 4096·8 + two norms 2·4096) + embedding and head
    2·32,000·4096/2 + final norm 4096 = 803,475,456; experts: 32 layers of one local expert of
    3·4096·14336/etp 2 = 2,818,572,288. Dense over 32 shards, experts over 4."""
    job = _job()
    assert job.layout.edp == 4 and zero_shards(job) == 32
    assert optimizer_local_parameters(job, 0) == 803_475_456 / 32 + 2_818_572_288 / 4 == 729_751_680
    unsharded = _job(layout={"tp": 2, "dp": 32, "ep": 8, "zero_stage": 0, "sequence_parallel": True,
                             "micro_batch_size": 1})
    assert optimizer_local_parameters(unsharded, 0) == 803_475_456 + 2_818_572_288


@pytest.mark.parametrize("precision, optimizer, zero_stage, engine, step_bytes", [
    # fp32 (torch's fused Adam): reads p, g, m, v and writes p, m, v, 7 tensors of 4 bytes; SGD
    # with momentum reads p, g, buf and writes p, buf: 5 of 4.
    ("fp32", "adam", 0, "any", 28), ("fp32", "sgd", 0, "any", 20),
    # Megatron bf16 Adam: reads the bf16 gradient (2), reads and writes the fp32 master and both
    # moments (2 · 12), writes the bf16 weight (2).
    ("bf16", "adam", 1, "megatron", 28),
    # FSDP2 bf16 Adam: the fp32 sharded parameter is the master, read and written (8), with its
    # fp32 gradient (4) and both moments (16).
    ("bf16", "adam", 3, "torchtitan", 28)])
def test_an_optimizer_step_streams_its_states_once_each_way(precision, optimizer, zero_stage, engine, step_bytes):
    job = _job(model="llama3-8b", num_gpus=8, precision=precision, engine=engine, optimizer=optimizer,
               layout={"tp": 1, "dp": 8, "zero_stage": zero_stage, "micro_batch_size": 1})
    shards = zero_shards(job)
    per_param = state_bytes(job.training, zero_stage, shards)
    assert adam_step_bytes(per_param, weights_are_master(job.training, zero_stage, shards)) == step_bytes


@pytest.mark.parametrize("engine, zero_stage, fp32_grads, step_bytes", [
    # Megatron-LM, bf16 with fp32 gradients (its pretrain script's default): Adam 30 (fp32 gradient 4,
    # master and moments 2 · 12, bf16 weight 2); the norm reads the gradients (4) and the clip scales
    # them (8); _copy_main_params_to_model_params reads the master again (4); zero_grad_buffer writes
    # the gradients (4): megatron/optimizer/optimizer.py, clip_grads.py, distributed.py (2022).
    ("megatron", 1, True, 50),
    # torchtitan's FSDP2: the fp32 shard is the master, read and written with its fp32 gradient and
    # both moments (28); clip_grad_norm_ reads the gradients and scales them (12); no copy (the
    # all-gather casts), gradients set to None.
    ("torchtitan", 3, False, 40)])
def test_a_whole_optimizer_step_adds_the_clipping_and_the_engines_own_passes(engine, zero_stage, fp32_grads,
                                                                             step_bytes):
    job = _job(model="llama3-8b", num_gpus=8, precision="bf16", engine=engine, fp32_grads=fp32_grads,
               layout={"tp": 1, "dp": 8, "zero_stage": zero_stage, "micro_batch_size": 1})
    shards = zero_shards(job)
    per_param = state_bytes(job.training, zero_stage, shards)
    master = weights_are_master(job.training, zero_stage, shards)
    assert optimizer_step_bytes(per_param, master, job.training.engine) == step_bytes


def test_the_optimizer_step_streams_at_the_in_place_rate():
    """The step updates its states in place: on a CPU profile whose in-place kernels reach 0.9 of
    the memory's rate and whose out-of-place ones 0.6, it takes 0.6/0.9 of what the element-wise
    rate would give."""
    def step(**performance):
        case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8,
                                                              "performance": {"hbm_efficiency": 0.6, **performance}},
                "training": {"global_batch_size": 8, "seq_len": 4096, "precision": "fp32"},
                "layout": {"tp": 1, "dp": 8, "micro_batch_size": 1}}
        return optimizer_time(load_case(case).job(), 0)

    assert step(in_place_efficiency=0.9) == pytest.approx(step() * 0.6 / 0.9)


@pytest.mark.parametrize("engine, passes", [("megatron", 3), ("any", 2)])
def test_the_activation_function_runs_at_the_transcendental_rate(engine, passes):
    """Llama 3 8B, tp 2, b 2·4096 tokens: the SwiGLU activation's traffic is passes · 2 bytes ·
    (14336/2) · 8192 (fused, as Megatron runs it: reads gate and up, writes one; eager PyTorch:
    SiLU reads and writes one, the multiply is a plain element-wise kernel). Where it runs at 0.2 of the bandwidth rather than
    the element-wise 0.7, the forward grows by that traffic's time difference, the backward by twice it."""
    def layer(**performance):
        case = {"model": {"preset": "llama3-8b"},
                "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8,
                            "performance": {"hbm_efficiency": 0.7, **performance}},
                "training": {"global_batch_size": 8, "seq_len": 4096},
                "search": {"target": engine}, "layout": {"tp": 2, "dp": 4, "micro_batch_size": 2}}
        job = load_case(case).job()
        return layer_time_for(job.model, job.training, job.cluster.gpu, 2, 1, 2, False), job.cluster.gpu

    (plain, gpu), (slow, _) = layer(), layer(transcendental_efficiency=0.2)
    traffic = passes * 2 * 14336 / 2 * 8192
    extra = traffic / (0.2 * gpu.hbm_bandwidth) - traffic / (0.7 * gpu.hbm_bandwidth)
    assert slow.forward - plain.forward == pytest.approx(extra)
    assert slow.backward - plain.backward == pytest.approx(2 * extra)


def _offload_job(**layout):
    return _job(model="llama3-8b", num_gpus=8, engine="deepspeed",
                layout={"tp": 1, "dp": 8, "micro_batch_size": 1, **layout})


def test_optimizer_offload_sends_gradients_out_steps_on_the_cpu_and_weights_back():
    """Out: gradients over PCIe behind the backward; the step streams its bytes over host memory;
    back: the bf16 weights, in the open. DeepSpeed's ZeRO-2 offload moves each of the 32
    micro-batches' gradients behind its own backward: the first's bf16 out (2 bytes a parameter),
    each later one's accumulator in and the sum out (4), the last's also out in fp32 (4)."""
    job = _offload_job(zero_stage=2, offload_optimizer=1)
    assert job.num_microbatches == 32
    gpu = job.cluster.gpu
    perf, host = gpu.performance, gpu.host
    local, backward = 1e9, 0.5
    link = host.link_bandwidth * perf.host_link_efficiency
    # The gradients (2 + 30 · 4 + 8 bytes a parameter) and bf16 weights back (2); the CPU's step reads the
    # fp32 gradient (4), reads and writes the fp32 master weight and both moments (2 · 12), and around it
    # the clip reads and writes the gradient (8) and the copy into the bf16 weights reads the master (4).
    # Each micro-batch's copy (at most 160 ms) is shorter than its backward, which hides comm_overlap of it.
    assert local * 8 / link < backward
    expected = (1 - perf.comm_overlap) * local * (2 + 30 * 4 + 8) / link \
        + local * (4 + 24 + 8 + 4) / (host.memory_bandwidth * perf.host_memory_efficiency) \
        + local * 2 / link
    assert optimizer_offload_time(job, local, backward) == pytest.approx(expected)
    assert optimizer_offload_time(_offload_job(zero_stage=2), local, backward) == 0.0


def test_parameter_offload_copies_each_gathers_shard_in_and_the_gradient_shard_out():
    """The bf16 weight shard in for each gather (2 bytes a parameter). DeepSpeed's ZeRO-3 moves its
    gradients with the offloaded optimizer's (offload.gradient_copies), into the partitions on the
    optimizer's device (stage3.py), not after each reduce-scatter with the parameters': a bf16
    gradient shard out (2) was priced here too."""
    job = _offload_job(zero_stage=3, offload_params=True, offload_optimizer=1)
    gpu = job.cluster.gpu
    shard, microbatch, gathers = 1e9, 0.2, 2
    copy = shard * gathers * 2 / (gpu.host.link_bandwidth * gpu.performance.host_link_efficiency)
    assert copy < microbatch  # so the micro-batch's compute hides comm_overlap of it
    assert param_offload_time(job, shard, microbatch, gathers) == \
        pytest.approx(job.num_microbatches * (1 - gpu.performance.comm_overlap) * copy)


def test_activation_offload_copies_each_layer_out_in_forward_and_in_for_backward():
    job = _job(model="llama3-8b", num_gpus=8, engine="megatron",
               layout={"tp": 1, "dp": 8, "micro_batch_size": 1, "offload_activations": 4})
    gpu = job.cluster.gpu
    copy = 4 * 1e8 / (gpu.host.link_bandwidth * gpu.performance.host_link_efficiency)
    perf = gpu.performance
    # Each copy (8 ms) is shorter than the pass beside it, which hides
    # comm_overlap of it; with no compute to hide behind it is all exposed.
    assert copy < 0.01
    assert activation_offload_time(job, 0, 1e8, 0.01, 0.02) == \
        pytest.approx(job.num_microbatches * 2 * (1 - perf.comm_overlap) * copy)
    assert activation_offload_time(job, 0, 1e8, 0.0, 0.0) == pytest.approx(job.num_microbatches * 2 * copy)
    assert math.isclose(activation_offload_time(_offload_job(), 0, 1e8, 0.01, 0.02), 0.0)


# --- sliding-window attention (cost_models/flops.py) ---

def test_a_sliding_window_keeps_the_query_key_pairs_it_covers():
    """Counted by hand: over s = 4096 tokens a window of 128 keeps 128 keys for each query past the
    128th, 128·4096 − 128²/2 = 516,096 pairs of the causal 4096²/2 = 8,388,608; a window of 4096 over
    8192 tokens keeps 4096·8192 − 4096²/2 of 8192²/2, three quarters; one as long as the sequence keeps all."""
    from cost_models.flops import window_share

    assert window_share(4096, 128) == pytest.approx(516_096 / 8_388_608)
    assert window_share(8192, 4096) == pytest.approx(0.75)
    assert window_share(4096, 4096) == window_share(4096, 0) == 1.0


def test_mistral_7b_windows_only_beyond_its_window():
    """Mistral 7B v0.1 windows every layer at 4096 keys: at 4096 tokens its model FLOPs are a causal
    model's; at 32k its attention does 2·4096/32768 − (4096/32768)² = 0.234 of the causal pairs."""
    from dataclasses import replace

    from cost_models.flops import attention_flops, model_flops_per_token

    mistral = load_case({"model": {"preset": "mistral-7b"}, "cluster": {"gpu": "h100", "num_gpus": 8},
                         "training": {"global_batch_size": 8, "seq_len": 4096}}).model
    causal = replace(mistral, sliding_window=0)
    assert model_flops_per_token(mistral, 4096) == model_flops_per_token(causal, 4096)
    saved = model_flops_per_token(causal, 32768) - model_flops_per_token(mistral, 32768)
    per_layer = attention_flops(causal, 1, 1, 32768, 1)
    assert saved == pytest.approx(3 * 32 * per_layer * (1 - 0.234375))


def test_selective_recompute_without_flash_attention_runs_the_softmax_again_as_korthikanti_measured():
    """Korthikanti et al. 2022, Table 4 (22B, 8 A100s, tp 8, micro-batch 4, 2,048 tokens, no flash
    attention): selective recomputation adds 1.3 ms to a layer's 11.9 ms backward. What it runs
    again is the attention core: QKᵀ, the softmax, its dropout and the product with V (§4.2). The
    two GEMMs alone take a fifth of that; the softmax and dropout over the scores take the rest."""
    from cost_models.layer_time import selective_recompute_time

    case = {"model": {"name": "22B", "num_layers": 48, "hidden_size": 6144, "num_attention_heads": 64,
                      "ffn_hidden_size": 4 * 6144, "activation": "gelu", "vocab_size": 51200, "dropout": 0.1},
            "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 4, "seq_len": 2048, "precision": "bf16", "engine": "megatron",
                         "flash_attention": False},
            "layout": {"tp": 8, "micro_batch_size": 4, "recompute": "selective"}}
    job = load_case(case).job()
    again = selective_recompute_time(job.model, job.training, job.cluster.gpu, 8, 1, 4, False,
                                     modules=("core_attn",))
    assert again == pytest.approx(1.3e-3, rel=0.35)


@pytest.mark.parametrize("zero_stage, fp32_grads, per_parameter", [
    (0, False, 4.0),  # Float16OptimizerWithFloat16Params: main_param.grad = model_param.main_grad.float()
    (1, False, 4.0),  # the distributed optimizer: shard_main_param.grad = shard_model_grad.float(), its shard
    (1, True, 0.0),  # an fp32 main_grad's .float() is itself: no copy
])
def test_megatrons_step_holds_an_fp32_copy_of_its_bf16_main_grads(zero_stage, fp32_grads, per_parameter):
    """megatron-core 0.16 (optimizer/optimizer.py _copy_model_grads_to_main_grads; optimizer/distrib_optimizer.py)
    gives every fp32 master (or master shard) an fp32 copy of its bf16 main_grad, freed by the next step's
    zero_grad: 20 bytes a parameter at ZeRO 0 where 16 were priced (a Llama-3-8B shape at tp 8 on one node
    with full recomputation: 20.6 GB, priced 16.9, and less than with fp32 main_grads)."""
    from cost_models.memory import step_gradient_copy_bytes

    case = load_case({"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
                      "training": {"global_batch_size": 8, "seq_len": 2048, "precision": "bf16", "engine": "megatron",
                                   "fp32_grads": fp32_grads},
                      "layout": {"tp": 8 // (1 + zero_stage), "micro_batch_size": 1, "zero_stage": zero_stage,
                                 "sequence_parallel": True, "recompute": "full"}})
    job = case.job()
    assert step_gradient_copy_bytes(job, 0) == pytest.approx(per_parameter * optimizer_local_parameters(job, 0))


# --- the allocator's two peaks (cost_models/memory.py) ---

def test_the_allocated_peak_is_the_reserved_one_less_the_cached_blocks():
    """What ``torch.cuda.max_memory_allocated`` reports (the tensors) is the priced peak, the reserved
    one, less the fragmentation's cached blocks: at fragmentation 0 the two are one figure, and at the
    preset's, the gap is its share of the activations (the step's copies here fit in what the activations freed)."""
    from dataclasses import replace

    from cost_models.memory import stage_memories

    job = _job(model="llama3-8b", num_gpus=8, layout={"tp": 1, "pp": 1, "dp": 8, "zero_stage": 1,
                                                      "micro_batch_size": 1})
    stage = stage_memories(job)[0]
    assert job.overheads.fragmentation > 0
    assert stage.allocated == pytest.approx(stage.total - job.overheads.fragmentation * stage.activations)
    none = stage_memories(replace(job, overheads=replace(job.overheads, fragmentation=0.0)))[0]
    assert none.allocated == pytest.approx(none.total) and none.allocated == pytest.approx(stage.allocated)
