"""The expert (MoE) part of a mixture-of-experts layer on one GPU: tokens, GEMMs, traffic, bytes.

The layer runs as megatron-core's ``MoELayer`` with the all-to-all token dispatcher
(``megatron/core/transformer/moe/token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher``):

1. the router scores each of the rank's tokens against the E experts (an h × E GEMM, then
   softmax or sigmoid and top-k);
2. permutation: each token is copied once per chosen expert and sorted by expert;
3. dispatch: an all-to-all over the expert-parallel group sends each copy to the rank holding
   its expert, then, with expert tensor parallelism, an all-gather over the etp group;
4. the local experts run as grouped GEMMs (``TEGroupedMLP``), each on the copies it received;
5. combine: the reverse (reduce-scatter over etp, all-to-all over ep), and unpermutation sums
   each token's expert outputs weighted by the router's probabilities;
6. shared experts, if any, run on every token as a dense MLP, tensor-parallel like the
   attention's.

Under tensor parallelism the layer's input is sequence-parallel (megatron-core refuses MoE
with tp > 1 and no sequence parallelism in training), so each rank routes b·s/(cp·tp) tokens
and, balanced, receives as many copies times k as it sends; with expert tensor parallelism
the etp group's copies are gathered, so an expert rank runs b·s/(cp·tp)·k·etp copies on
1/etp of each expert's width. The busiest rank decides the layer's time: a capacity factor
pads every expert to that multiple of the mean, a dropless router's imbalance gives its
busiest rank that multiple (``ModelSpec.routed_factor``; 1 for the force-balanced routing of
published benchmarks).
"""

from __future__ import annotations

from functools import lru_cache
from math import comb
from typing import Optional

from .collectives import all_to_all_time, collective_time
from .flops import Gemm, mlp_gemms
from .quantization import activation_bytes
from .kernels import activation_passes, elementwise_time, linear_time, linear_time_floor, transcendental_time
from .hardware import ClusterSpec, GPUSpec
from .layout_spec import Layout
from .model_spec import ModelSpec
from .training_spec import TrainingSpec
from .topology import GroupLinks, expert_group_links

# Bytes per element of the router's scores: megatron-core computes the logits and the
# softmax or sigmoid in fp32 (``moe_router_dtype: fp32`` in the Megatron-Bridge MoE recipes).
ROUTER_BYTES = 4


def moe_tokens(training: TrainingSpec, tp: int, cp: int, micro_batch_size: int) -> float:
    """Tokens one rank routes per micro-batch: b·s/(cp·tp) (the sequence-parallel input)."""
    return micro_batch_size * training.seq_len / (cp * tp)


def routed_tokens(model: ModelSpec, training: TrainingSpec, tp: int, cp: int, micro_batch_size: int,
                  etp: int) -> float:
    """Token copies the busiest expert rank runs per micro-batch: b·s/(cp·tp)·k·etp, times the
    capacity factor or the router's imbalance."""
    return moe_tokens(training, tp, cp, micro_batch_size) * model.moe_top_k * etp * model.routed_factor


def expert_gemms(model: ModelSpec, routed: float, ep: int, etp: int) -> tuple[Gemm, Gemm, int]:
    """(up projection of one local expert, its down projection, local experts): each of the
    E/ep local experts takes an equal share of the ``routed`` copies, on 1/etp of its width."""
    local = model.num_experts // ep
    fc1, fc2 = mlp_gemms(model, routed / local, model.moe_ffn_hidden_size, etp, prefix="expert_fc")
    return fc1, fc2, local


def moe_elementwise_bytes(model: ModelSpec, training: TrainingSpec, tp: int, cp: int, micro_batch_size: int,
                          etp: int, fused: bool) -> float:
    """HBM traffic of the expert part's forward element-wise kernels on one GPU, the activation
    function's apart (:func:`moe_activation_bytes`).

    - router: softmax (or sigmoid) and top-k over T·E fp32 scores: write, read, read (12 bytes each);
    - four permutations of the routed copies (before and after the all-to-all, both ways), each
      reading and writing R·h elements;
    - eager SwiGLU's multiply (read 2, write 1) on the experts' and shared experts' widths.
    """
    p = activation_bytes(training.precision)
    tokens = moe_tokens(training, tp, cp, micro_batch_size)
    routed = routed_tokens(model, training, tp, cp, micro_batch_size, etp)
    router = 3 * ROUTER_BYTES * tokens * model.num_experts
    permute = 4 * 2 * p * routed * model.hidden_size
    multiply = 3 if model.activation == "swiglu" and not fused else 0
    return router + permute + p * multiply * _expert_widths(model, tokens, routed, etp)


def moe_activation_bytes(model: ModelSpec, training: TrainingSpec, tp: int, cp: int, micro_batch_size: int,
                         etp: int, fused: bool) -> float:
    """HBM traffic of the experts' forward activation function on one GPU: its passes
    (``kernels.activation_passes``) over R routed copies of width f_e/etp, and over the
    tensor-parallel group's tokens at the shared experts' width."""
    tokens = moe_tokens(training, tp, cp, micro_batch_size)
    routed = routed_tokens(model, training, tp, cp, micro_batch_size, etp)
    return activation_bytes(training.precision) * activation_passes(model.activation, fused) \
        * _expert_widths(model, tokens, routed, etp)


def _expert_widths(model: ModelSpec, tokens: float, routed: float, etp: int) -> float:
    """Elements of one MLP-width tensor over the routed experts and the shared ones:
    R·f_e/etp + (b·s/cp)·f_s/tp (``tokens`` are already over tp)."""
    return routed * model.moe_ffn_hidden_size / etp + tokens * model.moe_shared_expert_ffn_hidden_size


@lru_cache(maxsize=4096)
def _token_linear_times(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, tp: int, cp: int,
                        micro_batch_size: int, weight_share: float) -> tuple[tuple[float, float], ...]:
    """(forward, backward) of the router's linear, then of each shared-expert linear: they run on
    the rank's own tokens, whatever the expert grid, so a search shares them over its ep and etp."""
    tokens = moe_tokens(training, tp, cp, micro_batch_size)
    # The router stays in 16 bits under every recipe (Transformer Engine quantizes the experts'
    # linear layers only; megatron-core's router is a plain GEMM).
    times = [linear_time(Gemm("router", tokens, model.num_experts, model.hidden_size), gpu, training,
                         quantized=False)]
    if model.moe_shared_expert_ffn_hidden_size:
        # The shared experts run on the tensor-parallel group's tokens, their width split over tp.
        gathered = micro_batch_size * training.seq_len / cp
        times += [linear_time(g, gpu, training, True, weight_share)
                  for g in mlp_gemms(model, gathered, model.moe_shared_expert_ffn_hidden_size, tp, "shared_fc")]
    return tuple(times)


def moe_mlp_time(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, tp: int, cp: int,
                 micro_batch_size: int, ep: int, etp: int, weight_share: float = 1.0) -> tuple[float, float]:
    """(forward, backward) of an MoE layer's expert part on one GPU, communication excluded: the
    router GEMM, the grouped expert GEMMs at the copies the busiest rank receives, the shared
    experts (each a linear layer's, :func:`kernels.linear_time`) and the element-wise kernels
    (:func:`moe_elementwise_bytes`, :func:`moe_activation_bytes`, twice their traffic in backward).
    Not cached: its one caller, ``layer_time.moe_layer_time_for``, is."""
    routed = routed_tokens(model, training, tp, cp, micro_batch_size, etp)
    fc1, fc2, local = expert_gemms(model, routed, ep, etp)
    experts = [linear_time(g, gpu, training, True, weight_share, groups=local) for g in (fc1, fc2)]
    forward, backward = _token_part_time(model, training, gpu, tp, cp, micro_batch_size, etp, weight_share)
    return forward + sum(f for f, _ in experts), backward + sum(b for _, b in experts)


@lru_cache(maxsize=4096)
def _token_part_time(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, tp: int, cp: int,
                     micro_batch_size: int, etp: int, weight_share: float) -> tuple[float, float]:
    """(forward, backward) of what :func:`moe_mlp_time` runs beside the routed experts' GEMMs, the
    same whatever the expert-parallel size: the router, the shared experts and the element-wise
    kernels (twice their traffic in backward). Cached: a search prices it at many ep."""
    router, *shared = _token_linear_times(model, training, gpu, tp, cp, micro_batch_size, weight_share)
    args = (model, training, tp, cp, micro_batch_size, etp, training.engine.fused_elementwise)
    memory = elementwise_time(moe_elementwise_bytes(*args), gpu) \
        + transcendental_time(moe_activation_bytes(*args), gpu)
    times = [router, *shared]
    return sum(f for f, _ in times) + memory, sum(b for _, b in times) + 2 * memory


def moe_mlp_time_floor(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, tp: int, cp: int,
                       micro_batch_size: int, etp: int, weight_share: float = 1.0) -> float:
    """The least forward + backward :func:`moe_mlp_time` takes at any expert-parallel size: what
    runs beside the experts' GEMMs (:func:`_token_part_time`), and those GEMMs as one linear of all
    the routed copies (the one expert per rank of ep = E), at no less than its FLOPs' floor
    (``kernels.linear_time_floor``), which no split into local experts goes under."""
    forward, backward = _token_part_time(model, training, gpu, tp, cp, micro_batch_size, etp, weight_share)
    routed = routed_tokens(model, training, tp, cp, micro_batch_size, etp)
    fc1, fc2, _ = expert_gemms(model, routed, model.num_experts, etp)
    return forward + backward + sum(linear_time_floor(g, gpu, training) for g in (fc1, fc2))


def moe_recompute_time(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, tp: int, cp: int,
                       micro_batch_size: int, sequence_parallel: bool, ep: int, etp: int, weight_share: float,
                       modules: tuple[str, ...]) -> float:
    """What one MoE layer's expert part runs again in backward under selective recomputation by
    module (``activations.selective_modules``), its dispatch and combine apart:

    - ``moe``: the whole expert part's forward (:func:`moe_mlp_time`);
    - ``moe_act``: the experts' activation function, one read of its 2f-wide input and one write;
    - ``shared_experts``: the shared experts' linears' forward;
    - ``layernorm``: the pre-MLP norm (it stands apart from the linears in an MoE layer), one
      read and one write of the sequence-parallel hidden states.
    """
    time = 0.0
    if "moe" in modules:
        time += moe_mlp_time(model, training, gpu, tp, cp, micro_batch_size, ep, etp, weight_share)[0]
    else:
        if "moe_act" in modules:
            routed = routed_tokens(model, training, tp, cp, micro_batch_size, etp)
            time += transcendental_time(activation_bytes(training.precision) * 3 * routed
                                        * model.moe_ffn_hidden_size / etp, gpu)
        if "shared_experts" in modules:
            time += sum(f for f, _ in _token_linear_times(model, training, gpu, tp, cp, micro_batch_size,
                                                          weight_share)[1:])
    if "layernorm" in modules:
        time += norm_forward_time(model, training, micro_batch_size * training.seq_len / cp,
                                  tp if sequence_parallel else 1, gpu)
    return time


def norm_forward_time(model: ModelSpec, training: TrainingSpec, tokens: float, sp: int, gpu: GPUSpec) -> float:
    """One norm's forward, run again under ``layernorm`` recomputation: one read and one write of
    the hidden states of ``tokens`` (split ``sp`` ways under sequence parallelism)."""
    return elementwise_time(2 * activation_bytes(training.precision) * tokens * model.hidden_size / sp, gpu)


def dispatch_bytes(model: ModelSpec, training: TrainingSpec, tp: int, cp: int, micro_batch_size: int) -> float:
    """Bytes one rank sends (and, at the busiest rank, receives) in one dispatch or combine
    all-to-all: its token copies, b·s/(cp·tp)·k·h in 16 bits (megatron-core dispatches the
    activations unquantized), times the capacity factor or imbalance at the busiest rank."""
    p = activation_bytes(training.precision)
    return p * moe_tokens(training, tp, cp, micro_batch_size) * model.moe_top_k * model.hidden_size \
        * model.routed_factor


@lru_cache(maxsize=1024)
def remote_domains_per_token(model: ModelSpec, domains: int) -> float:
    """NVLink domains other than its own that one token's k copies reach, on average, when the
    E experts lie in contiguous blocks over ``domains`` domains of the expert-parallel group
    (megatron-core gives expert-parallel rank r the experts r·E/ep onwards, and the group's ranks
    fill one domain before the next).

    Each domain d is missed by all k copies with probability (1 − n_d/N)^k, where n_d of the N
    experts a token may choose lie in d (the copies drawn as with replacement). Without
    group-limited routing N = E and n_d = E/D: (D − 1)·(1 − (1 − 1/D)^k).

    Group-limited routing (``ModelSpec.moe_router_num_groups`` G, ``moe_router_group_topk`` g;
    megatron-core ``group_limited_topk``, DeepSeek-V2 §2.1.3 device-limited and DeepSeek-V3
    §2.1.2 node-limited routing) first picks g of the G groups of E/G contiguous experts, then the
    k experts among those N = g·E/G: n_d is what the picked groups hold of d. Force-balanced
    (random) routing picks every g-set of groups alike, wherever the token is, so P(d reached)
    averages over the g-sets, and the token's own domain is any of the D alike:
    remote = (D − 1)/D · Σ_d P(d reached). DeepSeek-V3's 8 groups, 4 picked, over 8 domains reach
    3.15 remote domains a token, against 4.59 ungrouped."""
    if domains <= 1:
        return 0.0
    experts, groups, picked = model.num_experts, model.moe_router_num_groups, model.moe_router_group_topk
    width = experts / groups
    eligible = picked * width
    reached = 0.0
    for d in range(domains):
        low, high = d * experts / domains, (d + 1) * experts / domains
        overlaps = [o for o in (min(high, (c + 1) * width) - max(low, c * width) for c in range(groups)) if o > 0]
        # Ways to pick c of the groups that overlap d holding t of its experts: {(c, t): ways}.
        ways: dict[tuple[int, float], int] = {(0, 0.0): 1}
        for o in overlaps:
            for (c, t), w in list(ways.items()):
                key = (c + 1, round(t + o, 9))
                ways[key] = ways.get(key, 0) + w
        others = groups - len(overlaps)
        missed = sum(w * comb(others, picked - c) * (1 - t / eligible) ** model.moe_top_k
                     for (c, t), w in ways.items() if picked - c >= 0) / comb(groups, picked)
        reached += 1 - missed
    return (domains - 1) / domains * reached


# The expert groups DeepEP's normal (training) kernels run: its Buffer has a dispatch and a combine config
# for these rank counts only and asserts "Unsupported number of EP ranks" for any other
# (deep_ep/buffer.py, Buffer.get_dispatch_config and get_combine_config, at eb9cee7, the commit
# megatron-core 0.16.1's docker/Dockerfile.ci.dev installs; the same in v1.2.1), and at most 8 NVLink
# peers × 20 RDMA peers = 160 ranks outside its low-latency mode (csrc/deep_ep.cpp, Buffer's constructor).
# megatron-core (transformer/moe/fused_a2a.py, get_buffer) and NeMo AutoModel build it over the expert
# tensor- and expert-parallel group, etp·ep ranks.
DEEPEP_GROUP_SIZES = (2, 4, 8, 16, 24, 32, 64, 128, 144, 160)


def deepep_group_refusal(etp: int, ep: int) -> Optional[str]:
    """Why DeepEP cannot dispatch over an expert group of etp·ep ranks (:data:`DEEPEP_GROUP_SIZES`), None
    where it can. A group of one rank dispatches nothing, and no engine runs DeepEP over it."""
    ranks = etp * ep
    if ranks == 1 or ranks in DEEPEP_GROUP_SIZES:
        return None
    return (f"DeepEP dispatches over expert groups (etp × ep) of {', '.join(map(str, DEEPEP_GROUP_SIZES))} ranks "
            f"only (deep_ep/buffer.py, get_dispatch_config: \"Unsupported number of EP ranks\"), not "
            f"{etp} × {ep} = {ranks} ranks")


def hierarchical_dispatch(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, etp: int, ep: int) -> bool:
    """Whether the dispatch sends a token once per NVLink domain (DeepEP: ``TrainingSpec.hierarchical_dispatch``).
    Not with a capacity factor: DeepEP pads no expert to a capacity (megatron-core's flex dispatcher
    refuses ``moe_pad_expert_input_to_capacity``, ``TransformerConfig.__post_init__``), so a padded
    router dispatches by the plain all-to-all, as Megatron-Bridge's token-drop runs do. Nor on a GPU
    DeepEP does not run on (``GPUSpec.vendor``), nor over an expert group of etp·ep ranks it has no config
    for (:func:`deepep_group_refusal`): an engine that would run it dispatches by its all-to-all."""
    return training.hierarchical_dispatch and model.moe_capacity_factor is None and gpu.deepep_refusal is None \
        and deepep_group_refusal(etp, ep) is None


def dispatch_links(cluster: ClusterSpec, training: TrainingSpec, etp: int, ep: int, hierarchical: bool) -> GroupLinks:
    """The links the expert-parallel dispatch runs over (``topology.expert_group_links``: stride etp, ep ranks).

    The plain all-to-all (NCCL) reaches every rank of the cluster's NVLink domain over NVLink: on a
    GB200/GB300 NVL72 rack, all 72. DeepEP does not: its Buffer joins at most NUM_MAX_NVL_PEERS
    consecutive ranks of its etp·ep group over NVLink and the rest as RDMA ranks
    (csrc/deep_ep.cpp:160 at eb9cee7, ``num_rdma_ranks = max(1, num_ranks / NUM_MAX_NVL_PEERS)``),
    which it joins through NVSHMEM with multi-node NVLink disabled unless its Buffer is built with
    ``allow_mnnvl`` (deep_ep/buffer.py:121-123), and megatron-core builds it without
    (transformer/moe/fused_a2a.py, get_buffer). So the hierarchical dispatch's NVLink domains are
    blocks of min(domain, ``EngineBehaviour.hierarchical_dispatch_nvlink_peers``) GPUs, and what
    leaves them goes through each GPU's NIC at the fabric's all-to-all figure, as between 8-GPU nodes."""
    peers = training.engine.hierarchical_dispatch_nvlink_peers if hierarchical else None
    return expert_group_links(cluster, "ep", etp, ep, peers)


def _pair_time(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, tp: int, cp: int,
               micro_batch_size: int, ep: int, etp: int, hierarchical: bool) -> float:
    # One dispatch and one combine over the ep group (dispatch_combine_time, without etp's collectives).
    size = dispatch_bytes(model, training, tp, cp, micro_batch_size)
    links = dispatch_links(cluster, training, etp, ep, hierarchical)
    crossing = None
    if hierarchical and links.domains > 1:
        crossing = size / model.moe_top_k * remote_domains_per_token(model, links.domains)
    return 2 * all_to_all_time(size, links, cluster.gpu.performance, crossing)


@lru_cache(maxsize=4096)
def dispatches_hierarchically(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, tp: int, cp: int,
                              micro_batch_size: int, ep: int, etp: int) -> bool:
    """Whether the job's dispatch runs hierarchically (DeepEP): where the case says ``deepep`` and DeepEP
    can (:func:`hierarchical_dispatch`); left to an engine that runs it, only where its group spans
    more than one block of its NVLink peers (:func:`dispatch_links`) and it is no slower than the plain
    all-to-all, which is what the planner then emits (Megatron: ``flex`` with the deepep backend, else
    ``alltoall``). Over an NVL72 rack an expert group of 16 to 72 ranks stays on NVLink under the
    all-to-all, where DeepEP sends its crossing tokens through the NICs."""
    if not hierarchical_dispatch(model, training, cluster.gpu, etp, ep):
        return False
    if training.expert_dispatch == "deepep":
        return True
    if dispatch_links(cluster, training, etp, ep, True).domains <= 1:
        return False  # inside its NVLink peers it prices as the all-to-all, which needs no library
    return _pair_time(model, training, cluster, tp, cp, micro_batch_size, ep, etp, True) \
        <= _pair_time(model, training, cluster, tp, cp, micro_batch_size, ep, etp, False)


@lru_cache(maxsize=4096)
def dispatch_combine_time(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, tp: int, cp: int,
                          micro_batch_size: int, ep: int, etp: int) -> float:
    """One dispatch and one combine (a forward pass; the backward runs the same pair reversed)
    over the links the expert-parallel group spans (:func:`dispatch_links`), with etp's all-gather
    and reduce-scatter of the routed copies.

    A plain all-to-all sends every copy to its expert's rank: (ep − per-domain)/ep of them
    leave the domain. A hierarchical dispatch (:func:`dispatches_hierarchically`) sends each
    token once to each other block of its NVLink peers that holds one of its experts
    (:func:`remote_domains_per_token`) and forwards it there over NVLink; the combine reduces
    in the block before sending back (``TrainingSpec.hierarchical_dispatch``)."""
    perf = cluster.gpu.performance
    hierarchical = dispatches_hierarchically(model, training, cluster, tp, cp, micro_batch_size, ep, etp)
    time = _pair_time(model, training, cluster, tp, cp, micro_batch_size, ep, etp, hierarchical)
    if etp > 1:
        gathered = dispatch_bytes(model, training, tp, cp, micro_batch_size) * etp
        links = expert_group_links(cluster, "etp", etp, ep)
        time += collective_time("all_gather", gathered, links, perf) + \
            collective_time("reduce_scatter", gathered, links, perf)
    return time


def moe_mlp_activation_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout,
                             fused: bool, saved_input: float) -> float:
    """Bytes the expert part saves for backward per micro-batch on one GPU, in place of a dense
    MLP's hidden activations:

    - the router's fp32 logits and scores, 2·4·T·E;
    - each expert's input (the dispatched copies), R·h, at ``saved_input`` bytes per element
      (``quantization.saved_input_bytes``: the quantized copy where Transformer Engine keeps it);
    - the experts' hidden activations, as a dense MLP's (SwiGLU fused: its 2f input and the f
      input of the down projection), on R copies of width f_e/etp;
    - the experts' outputs, where the router's scores multiply them after the experts
      (:func:`routed_output_bytes`; Megatron applies them inside the activation and keeps none);
    - the shared experts' hidden activations on the group's tokens, width f_s/tp.
    """
    g = saved_input
    lay = layout
    tokens = moe_tokens(training, lay.tp, lay.cp, lay.micro_batch_size)
    routed = routed_tokens(model, training, lay.tp, lay.cp, lay.micro_batch_size, lay.expert_tp)
    router = 2 * ROUTER_BYTES * tokens * model.num_experts
    hidden = _hidden_bytes_per_width(model, training, fused, g) * model.moe_ffn_hidden_size / lay.expert_tp
    experts = routed * (g * model.hidden_size + hidden)
    return router + experts + routed_output_bytes(model, training, layout) \
        + shared_expert_activation_bytes(model, training, layout, g, fused)


def routed_output_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout) -> float:
    """The experts' outputs that the router's scores multiply after them, kept for the scores'
    gradient where the engine applies them there (``EngineBehaviour.moe_scores_after_experts``):
    R copies of width h, in the activations' dtype; 0 where the scores are applied inside the
    activation."""
    if not training.engine.moe_scores_after_experts:
        return 0.0
    return _routed_hidden_bytes(model, training, layout)


def _routed_hidden_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout) -> float:
    """The token copies a rank's experts return, at the hidden width, in the activations' dtype."""
    lay = layout
    routed = routed_tokens(model, training, lay.tp, lay.cp, lay.micro_batch_size, lay.expert_tp) / lay.expert_tp
    return activation_bytes(training.precision) * routed * model.hidden_size


def exchanged_token_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout,
                          exchanges: Optional[bool] = None) -> float:
    """What PyTorch's op-level selective checkpointing, as torchtitan configures it
    (distributed/activation_checkpoint.py: ``_c10d_functional.all_to_all_single`` among the ops it
    saves, the grouped GEMMs and the permutations not), keeps of a layer's expert part: the
    all-to-all's outputs, the dispatched tokens and the experts' outputs coming back, R copies of
    width h each, where expert parallelism exchanges them (``exchanges``; by default ep > 1); nothing
    where the experts are local. The shared experts' matmuls take their turn in its every-other-matmul rule: the first's
    output (f_s/tp) and the last's (h) are kept."""
    lay = layout
    p = activation_bytes(training.precision)
    exchanged = 2 * _routed_hidden_bytes(model, training, lay) if (lay.ep > 1 if exchanges is None else exchanges) \
        else 0.0
    sp = lay.tp if lay.sequence_parallel else 1
    tokens = lay.micro_batch_size * training.seq_len / lay.cp
    shared = p * tokens * (model.moe_shared_expert_ffn_hidden_size / lay.tp + model.hidden_size / sp) \
        if model.moe_shared_expert_ffn_hidden_size else 0.0
    return exchanged + shared


def _hidden_bytes_per_width(model: ModelSpec, training: TrainingSpec, fused: bool, saved_input: float) -> float:
    """Bytes an MLP saves per element of its width: a dense MLP's (SwiGLU fused: its 2f input and
    the f input of the down projection, which a quantized linear keeps at ``saved_input``)."""
    widths = (3 if fused else 4) if model.activation == "swiglu" else 2
    return (widths - 1) * activation_bytes(training.precision) + saved_input


def shared_expert_activation_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout, saved_input: float,
                                   fused: Optional[bool] = None) -> float:
    """The shared experts' hidden activations on the group's tokens, width f_s/tp, as a dense
    MLP keeps them (:func:`moe_mlp_activation_bytes`): what recomputing them frees."""
    fused = training.engine.fused_elementwise if fused is None else fused
    tokens = moe_tokens(training, layout.tp, layout.cp, layout.micro_batch_size)
    return _hidden_bytes_per_width(model, training, fused, saved_input) * tokens \
        * model.moe_shared_expert_ffn_hidden_size


def moe_act_output_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout, saved_input: float) -> float:
    """The experts' activation output (the down projection's input, R·f_e/etp) that recomputing
    the activation function (megatron-core's ``moe_act``) leaves unsaved."""
    g = saved_input
    lay = layout
    routed = routed_tokens(model, training, lay.tp, lay.cp, lay.micro_batch_size, lay.expert_tp)
    return g * routed * model.moe_ffn_hidden_size / lay.expert_tp


def alltoall_buffer_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout) -> float:
    """The dispatch's send and receive buffers of the one MoE layer running (the permuted copies
    before and after the all-to-all): transient, so counted once per GPU."""
    lay = layout
    return 2 * dispatch_bytes(model, training, lay.tp, lay.cp, lay.micro_batch_size) * lay.expert_tp
