"""Tensor-parallel communication per layer: the collectives of one pass, what the layer's compute
hides of them (Megatron's TP overlap), and the floors a TP group across NVLink domains pays."""

from __future__ import annotations

from functools import lru_cache

from .collectives import collective_time
from .flops import Gemm, layer_gemms
from .kernels import gemm_time
from .quantization import activation_bytes
from .hardware import ClusterSpec
from .job import Job
from .layout_spec import Layout
from .model_spec import ModelSpec
from .training_spec import TrainingSpec
from .topology import group_links


@lru_cache(maxsize=4096)
def tp_collective_time(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, tp: int, cp: int,
                       micro_batch_size: int, sequence_parallel: bool = False) -> float:
    """One of a layer's two tensor-parallel reductions per pass, of a micro-batch's
    activations (b·(s/cp)·h elements): an all-reduce, or with sequence parallelism the
    all-gather and reduce-scatter that move the same bytes as rings (n − 1 steps each: a
    group that spans nodes waits for the fabric at every step)."""
    if tp == 1:
        return 0.0
    p = activation_bytes(training.precision)
    size = p * micro_batch_size * training.seq_len / cp * model.hidden_size
    links = group_links(cluster, Layout(tp=tp, dp=cluster.num_gpus // tp), "tp")
    perf = cluster.gpu.performance
    if sequence_parallel:
        return collective_time("all_gather", size, links, perf) + collective_time("reduce_scatter", size, links, perf)
    return collective_time("all_reduce", size, links, perf)


def moe_layer_tp_share(model: ModelSpec) -> float:
    """An MoE layer's tensor-parallel collectives, as a share of a dense layer's: its routed experts
    need none (each rank routes its own sequence-parallel tokens), so half (the attention's pair),
    and all where its shared experts need the dense MLP's pair."""
    return 1.0 if model.moe_shared_expert_ffn_hidden_size else 0.5


def tp_collectives_per_pass(sequence_parallel: bool) -> int:
    """Tensor-parallel collectives of one layer's forward (or backward): two all-reduces, or with
    sequence parallelism two all-gathers and two reduce-scatters."""
    return 4 if sequence_parallel else 2


def column_linear_input_widths(model: ModelSpec, moe_layer: bool = False) -> tuple[int, ...]:
    """The input widths of one layer's column-parallel linears as DeepSpeed 0.19.8's AutoTP replaces
    them, one ``LinearLayer`` each (``module_inject/auto_tp.py``, ``_replace``; ``module_inject/layers.py``,
    ``LinearLayer``), for a model named as Hugging Face's Llama-style models are: attention's q_proj,
    k_proj and v_proj, and the MLP's gate_proj and up_proj (one up projection without a gated
    activation). Each runs its input through ``ColumnParallel``, whose backward all-reduces that
    input's gradient over the tensor-parallel group, so a layer's backward reduces one gradient per
    linear, as wide as the linear's input (h for k and v under GQA too: only their outputs are
    narrower). The row-parallel o_proj and down_proj (``LinearAllreduce``) reduce in forward only.
    Multi-head latent attention: AutoTP leaves q_a_proj and kv_a_proj_with_mqa whole, so its column
    linears are q_b_proj (q_proj without a query LoRA) and kv_b_proj, of the LoRA ranks' widths. An
    MoE layer's routed experts need no tensor-parallel collective (:func:`moe_layer_tp_share`); its
    shared experts are an MLP. A model whose own code fuses q, k and v (or gate and up) into one
    linear runs fewer (``fused_LinearLayer``, ``GateUpPack_LinearLayer``): not priced."""
    if model.attention_type == "mla":
        attention: tuple[int, ...] = (model.q_lora_rank or model.hidden_size, model.kv_lora_rank)
    else:
        attention = (model.hidden_size,) * 3
    mlp = (model.hidden_size,) * (2 if model.activation == "swiglu" else 1)
    if moe_layer and not model.moe_shared_expert_ffn_hidden_size:
        mlp = ()
    return attention + mlp


@lru_cache(maxsize=4096)
def column_linear_backward_time(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, tp: int, cp: int,
                                micro_batch_size: int, moe_layer: bool = False) -> float:
    """One layer's tensor-parallel time in backward where the engine replaces each column-parallel
    linear on its own (``EngineBehaviour.reduces_each_column_linear_input``: DeepSpeed's AutoTP):
    one all-reduce of b·(s/cp)·w elements per linear of :func:`column_linear_input_widths` (five of
    b·s·h for Llama's layer, where Megatron's fused layer runs one per sub-layer), each issued from
    eager Python (``EngineBehaviour.collective_launch_s``), nothing hiding them."""
    if tp == 1:
        return 0.0
    tokens = micro_batch_size * training.seq_len / cp
    links = group_links(cluster, Layout(tp=tp, dp=cluster.num_gpus // tp), "tp")
    p, perf = activation_bytes(training.precision), cluster.gpu.performance
    return sum(collective_time("all_reduce", p * tokens * width, links, perf) + training.engine.collective_launch_s
               for width in column_linear_input_widths(model, moe_layer))


def cross_domain_pipeline_floor(job: Job, collectives: float) -> float:
    """The least time one micro-batch takes through a stage whose pipeline neighbours are in
    another NVLink domain, for the engines that show one: each of its ``collectives``
    tensor-parallel collectives costs at least f₀ + f₁·(tp − 1)
    (``EngineBehaviour.pipeline_collective_floor_s``, ``pipeline_collective_floor_rank_s``), and
    the stage's GPU work runs beneath that, not after it (the Playbook's nanotron sweep: the 1B's
    stages at tp 8 and pp 2 take about 26 ms a layer at micro-batches of 1, 2 and 4). Per collective,
    so per layer, not once per stage and micro-batch as nanotron's one blocking receive would be
    (``P2P._recv_meta``): the sweep's excess over the GPU's time grows with the stage's layers, from
    nearly nought (bench/pipeline_floor.py, third table). 0 without tensor parallelism, without a
    pipeline, within one domain, or for an engine that shows none."""
    lay, engine = job.layout, job.training.engine
    per_collective = engine.pipeline_collective_floor_s + engine.pipeline_collective_floor_rank_s * (lay.tp - 1)
    if lay.pp == 1 or lay.tp == 1 or not per_collective or group_links(job.cluster, lay, "pp").domains == 1:
        return 0.0
    return collectives * per_collective


def cross_domain_tp_floor(job: Job, collectives: float) -> float:
    """The least time one micro-batch takes through a stage whose tensor-parallel group itself spans
    NVLink domains, for the engines that show one: each of its ``collectives`` tensor-parallel
    collectives costs at least c·(tp − 1) (``EngineBehaviour.cross_domain_tp_rank_s``), the stage's GPU
    work running beneath it. Measured, not derived: in the Playbook's nanotron sweep (8-GPU EFA nodes,
    no pipeline) a layer and micro-batch takes a median 9.8 ms at tp 16 for the 1B and the 3B alike and
    16-20 ms at tp 32, at micro-batches of 1-4, where NCCL's own all-gather of those sizes between 2
    and 4 p5 nodes takes 0.2-0.4 ms (nccl-tests) and the GPU work 4-5 ms (bench/pipeline_floor.py,
    second table). 0 within one domain, or for an engine that shows none."""
    lay, rank_s = job.layout, job.training.engine.cross_domain_tp_rank_s
    if lay.tp == 1 or not rank_s or group_links(job.cluster, lay, "tp").domains == 1:
        return 0.0
    return collectives * rank_s * (lay.tp - 1)


@lru_cache(maxsize=4096)
def tp_exposed_per_layer(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, tp: int, cp: int,
                         micro_batch_size: int, sequence_parallel: bool = False) -> tuple[float, float]:
    """Tensor-parallel time one layer cannot hide, (forward, backward), for one micro-batch.

    Megatron TP runs two collectives in forward and two in backward per layer (all-reduces,
    or the same bytes as all-gather + reduce-scatter with sequence parallelism), not
    overlapped by default. With ``training.tp_comm_overlap`` (Megatron's
    ``--tp-comm-overlap``: Transformer Engine userbuffers; torchtitan's async TP) each of
    the four all-gathers or reduce-scatters is cut into tp chunks pipelined with the GEMM
    it feeds or follows (Wang et al., "Overlap communication with dependent computation via
    decomposition", ASPLOS 2023). That is not free: the first chunk's transfer waits in the
    open (the pipeline fills), what the GEMM cannot cover shows, and the GEMM runs as tp
    GEMMs of 1/tp of the tokens, each with its own launch and a less full last wave.
    Backward pairs each collective with twice the GEMM work (input and weight gradients).
    The chunks move by the copy engines (Transformer Engine userbuffers' ring exchange;
    symmetric-memory async TP), not by SM kernels, so they do not slow the GEMMs beside them
    as NCCL collectives do (``Performance.comm_overlap`` does not apply).

    Without overlap, each collective is also issued from the host on the critical path:
    engines that issue them from eager Python pay ``EngineBehaviour.collective_launch_s``
    per call (two all-reduces per pass, or four all-gathers and reduce-scatters with
    sequence parallelism).
    """
    one = tp_collective_time(model, training, cluster, tp, cp, micro_batch_size, sequence_parallel)
    if not training.tp_comm_overlap:
        launch = tp_collectives_per_pass(sequence_parallel) * training.engine.collective_launch_s if tp > 1 else 0.0
        return 2 * one + launch, 2 * one + launch
    tokens = micro_batch_size * training.seq_len / cp
    gpu, precision, recipe = cluster.gpu, training.precision, training.recipe
    chunk = one / 2 / tp  # one of the four collectives, cut in tp pieces
    forward = backward = 0.0
    for gemm in layer_gemms(model, tokens, tp):
        whole = gemm_time(gemm, gpu, precision, recipe)
        chunked = tp * gemm_time(Gemm(gemm.name, gemm.m / tp, gemm.n, gemm.k), gpu, precision, recipe)
        forward += chunk + max(0.0, chunk * (tp - 1) - chunked) + (chunked - whole)
        backward += chunk + max(0.0, chunk * (tp - 1) - 2 * chunked) + 2 * (chunked - whole)
    return forward, backward
