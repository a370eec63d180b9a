"""How the layers of a model are cut into pipeline stages when a layout does not say.

Engines differ, and the difference is a large share of a pipeline's step time: the last
stage also runs the LM head, which for a small model with a large vocabulary costs as
much as several layers (Llama-style 1B, h = 2048, V = 131,072: the head's 2·h·V FLOPs per
token are four layers' worth).

- Megatron-LM splits the decoder layers evenly (``--pipeline-model-parallel-size`` needs
  them to divide), unless told to count the embedding or the loss as layers
  (:func:`embedding_and_loss_partition`).
- An engine-neutral plan (``engine: any``) balances stage compute as PipeDream-style
  partitioners do: the contiguous split whose slowest stage is fastest, the spare layers off
  the first stage (it holds the most micro-batches in flight). The edge stages may hold no
  decoder layer at all.
- nanotron takes no split: it fills ranks in order until each reaches its share of the running
  cost, the LM head weighted V·h against a layer's 4h² + 3hf (:func:`block_cost_partition`,
  ``EngineBehaviour.splits_by_block_cost``). The first stages come out fuller, and the LM head
  may close a rank before the last.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

from .flops import head_gemm, layer_forward_flops, mtp_forward_flops
from .layout_spec import Layout, rank_chunks
from .model_spec import ModelSpec
from .training_spec import TrainingSpec


def layer_and_head_cost(model: ModelSpec, seq_len: int) -> tuple[float, float]:
    """Forward FLOPs per token of one layer (GEMMs and causal attention; a mixture of experts'
    mean over its dense and MoE layers) and of what follows the decoder on the last stage: the
    LM head and any multi-token prediction modules."""
    moe = model.num_moe_layers
    layer = ((model.num_layers - moe) * layer_forward_flops(model, seq_len, False)
             + moe * layer_forward_flops(model, seq_len, True)) / model.num_layers
    return layer, head_gemm(model, 1, 1).flops + mtp_forward_flops(model, seq_len)


@lru_cache(maxsize=4096)
def balanced_partition(layers: int, stages: int, layer_cost: float, head_cost: float) -> tuple[int, ...]:
    """Contiguous layer counts per stage that minimise the largest stage cost, the LM head
    on the last stage (which may then hold no decoder layer).

    The last stage takes k layers and the others share the rest as evenly as possible, the
    spare layers on the middle stages first (the first stage holds the most micro-batches
    in flight under 1F1B); k is the count whose largest stage cost is least, the larger k
    on a tie.
    """
    if stages == 1:
        return (layers,)
    others = stages - 1

    def largest(k: int) -> float:
        return max(k * layer_cost + head_cost, -(-(layers - k) // others) * layer_cost)

    feasible = [k for k in range(layers + 1) if layers - k >= others - 1]
    if not feasible:  # fewer layers than middle stages: no split (Job refuses the layout)
        return (layers // stages,) * stages
    last = min(feasible, key=lambda k: (largest(k), -k))
    base, spare = divmod(layers - last, others)
    order = list(range(1, others)) + [0]  # middle stages first, then the first
    counts = [base] * others
    for i in order[:spare]:
        counts[i] += 1
    return tuple(counts) + (last,)


def block_costs(model: ModelSpec) -> tuple[int, int]:
    """nanotron's cost of a decoder layer and of the LM head (``models/llama.py``,
    ``get_block_compute_costs``): 4·heads·(h/heads)·h + 3·f·h, and V·h; its other blocks cost nothing."""
    h, heads = model.hidden_size, model.num_attention_heads
    return 4 * heads * (h // heads) * h + 3 * model.ffn_hidden_size * h, model.vocab_size * h


@lru_cache(maxsize=4096)
def block_cost_partition(layers: int, pp: int, layer_cost: int, head_cost: int) -> tuple[int, ...]:
    """Decoder layers per pipeline rank as nanotron builds them (``nanotron/models/base.py``,
    ``build_model``): its blocks in model order (embedding, layers, final norm, LM head, loss) go to
    the ranks by cumulative cost (:func:`block_costs`), each rank taking blocks until the running cost
    passes (r + 1)/pp of the total. The first ranks fill first, and the LM head can close a rank
    before the last, so the ranks after it hold no layer (the model then runs the head on the last
    stage, alone, as nanotron's loss rank would wait for it).

    nanotron's test is `>`: a block whose running cost lands exactly on a threshold stays. The
    Playbook's 1B's power-of-two costs land there at pp 2 and 4, and its sweep measures the next
    rank taking that block: the first stage holds 10 and 5 layers, not 11 and 6 (rank 0's published
    memory, tp 1: +5 % and -2 % with the move, +14 % both without; the step times, -7 % and -16 %
    without). So a rank here moves on once the running cost reaches its threshold."""
    costs = [0] + [layer_cost] * layers + [0, head_cost]  # embedding, layers, final norm, LM head
    total = sum(costs)
    counts, rank, running = [0] * pp, 0, 0
    for block, cost in enumerate(costs):
        running += cost
        if 1 <= block <= layers:
            counts[rank] += 1
        if rank < pp - 1 and running * pp >= total * (rank + 1):
            rank += 1
    return tuple(counts)


@lru_cache(maxsize=1024)
def cost_balanced_partition(costs: tuple[float, ...], stages: int, head_cost: float) -> tuple[int, ...]:
    """Contiguous layer counts per stage, a layer at least on each, that minimise the largest stage
    cost where the layers cost unlike amounts (``costs`` in model order: an NVFP4 recipe's bf16 tail
    beside its FP4 layers), the LM head (``head_cost``) on the last stage: the linear-partition
    problem, by bisection on the largest cost, each bound met or not by the split that fills every
    stage from the last as far as the bound and the stages still to fill allow (the spare room goes
    to the first stages, which hold the most micro-batches in flight under 1F1B)."""
    n = len(costs)
    if stages <= 1 or n < stages:
        return (n,) if stages <= 1 else (n // stages,) * stages  # no split (Job refuses the layout)

    def split(bound: float) -> Optional[tuple[int, ...]]:
        counts, end = [], n
        for stage in range(stages - 1, 0, -1):  # the last stage first
            start, total = end, head_cost if stage == stages - 1 else 0.0
            while start > stage and (start == end or total + costs[start - 1] <= bound):
                start -= 1
                total += costs[start]
            if total > bound:
                return None
            counts.append(end - start)
            end = start
        first = sum(costs[:end])
        return (end,) + tuple(reversed(counts)) if first <= bound else None

    low, high = max(costs), sum(costs) + head_cost
    best = split(high)
    # Every layer's cost with the head's bounds any stage, so the first bound always splits.
    assert best is not None
    for _ in range(60):  # to a relative 1e-18 of the range: the split no longer moves
        middle = (low + high) / 2
        found = split(middle)
        if found is None:
            low = middle
        else:
            high, best = middle, found
    return _evened(list(best), costs, head_cost)


def _evened(counts: list[int], costs: tuple[float, ...], head_cost: float) -> tuple[int, ...]:
    """``counts`` with each boundary between two stages moved a layer at a time while that lowers the
    larger of the two: the filling from the last stage leaves the largest stage cost least but the
    first stages a layer each where the bound is set at the end (the head and the bf16 tail: 1, 1, 1,
    3, 8, 8, 6, 3, 1 for Llama 3 8B on 9 GB200 stages); evened, their work spreads over them. No move
    raises the largest stage cost, and each lowers the sum of squares: it ends."""
    def cost(i: int, start: int) -> float:
        return sum(costs[start:start + counts[i]]) + (head_cost if i == len(counts) - 1 else 0.0)

    moved = True
    while moved:
        moved = False
        start = 0
        for i in range(len(counts) - 1):
            a, b = cost(i, start), cost(i + 1, start + counts[i])
            edge = start + counts[i]  # the first layer of stage i + 1
            if a > b and counts[i] > 1 and max(a - costs[edge - 1], b + costs[edge - 1]) < max(a, b):
                counts[i] -= 1
                counts[i + 1] += 1
                moved = True
            elif b > a and counts[i + 1] > 1 and max(a + costs[edge], b - costs[edge]) < max(a, b):
                counts[i] += 1
                counts[i + 1] -= 1
                moved = True
            start += counts[i]
    return tuple(counts)


def embedding_and_loss_partition(layers: int, pp: int, vpp: int, embedding: bool, loss: bool) -> tuple[int, ...]:
    """Megatron's --account-for-embedding/loss-in-pipeline-split: the embedding and the loss
    count as a layer each of the first and the last virtual stage, and the pp·vpp virtual
    stages split the units evenly (``megatron/core/transformer/transformer_block.py``,
    ``get_num_layers_to_build``). Rank i holds virtual stages i, pp + i, …; the returned
    counts are per rank, of :func:`embedding_and_loss_chunks`."""
    return tuple(map(sum, rank_chunks(embedding_and_loss_chunks(layers, pp, vpp, embedding, loss), pp)))


def embedding_and_loss_chunks(layers: int, pp: int, vpp: int, embedding: bool, loss: bool) -> tuple[int, ...]:
    """The layers of the pp·vpp virtual stages in model order under the account flags: the units
    (layers, the embedding, the loss) split evenly, the first virtual stage one layer short for the
    embedding and the last for the loss (``get_num_layers_to_build``: 7 and 8 on the first rank of
    126 + 2 units over 8 ranks of 2 chunks)."""
    stages = pp * vpp
    counts = [(layers + embedding + loss) // stages] * stages
    counts[0] -= embedding
    counts[-1] -= loss
    return tuple(counts)


@lru_cache(maxsize=4096)  # read for every stage of every layout a search scores
def chunk_layers(layers: int, vpp: int) -> tuple[int, ...]:
    """The layers of one pipeline rank's vpp model chunks: as equal as possible, the spare ones
    in the earlier chunks."""
    base, spare = divmod(layers, vpp)
    return tuple(base + (i < spare) for i in range(vpp))


@lru_cache(maxsize=4096)
def virtual_stage_layers(layers: int, pp: int, vpp: int) -> tuple[int, ...]:
    """Layers of each of the pp·vpp virtual stages, in model order, when they cannot hold equal
    shares: ⌊L/(pp·vpp)⌋ each, and the L mod (pp·vpp) spare ones spread over the ranks as evenly
    as they go, the middle ranks' share first, then the first rank's, then the last's (as
    :func:`balanced_partition` spares the edges). Within a rank they go to its chunks in order,
    the model's first and last virtual stage last of all. The first virtual stage runs the
    embedding and holds the most micro-batches in flight (:func:`pipeline.in_flight_peak`: rank
    0's first chunk runs ahead), the last rank runs the LM head. Megatron-Bridge lightens both
    ends of DeepSeek-V3's 61 layers on 8 ranks of 4 chunks likewise (``"Et|(tt|)*30mL"``, its H100
    performance recipe: 7 layers on the first rank, one in its first chunk). Megatron builds no
    uneven interleaved split by itself: the plan says it as a ``--pipeline-model-parallel-layout``."""
    stages = pp * vpp
    base, spare = divmod(layers, stages)
    counts = [base] * stages
    each, extra = divmod(spare, pp)
    ranks = list(range(1, pp - 1)) + [0, pp - 1] if pp > 2 else list(range(pp))
    one_more = set(ranks[:extra])  # a set: with pp in the hundreds, a list's lookup per rank took seconds
    for rank in range(pp):
        chunks = [rank + pp * c for c in range(vpp)]
        chunks = [v for v in chunks if v not in (0, stages - 1)] + [v for v in chunks if v in (0, stages - 1)]
        for v in chunks[:each + (rank in one_more)]:
            counts[v] += 1
    return tuple(counts)


def virtual_partition(layers: int, pp: int, vpp: int) -> tuple[int, ...]:
    """Layers per pipeline rank of :func:`virtual_stage_layers`, rank r holding virtual stages
    r, pp + r, … (:func:`rank_chunks`)."""
    return tuple(map(sum, rank_chunks(virtual_stage_layers(layers, pp, vpp), pp)))


def default_chunk_layers(model: ModelSpec, layout: Layout) -> Optional[tuple[int, ...]]:
    """Layers of each model chunk (model order) where the engine's own split is uneven over the
    virtual stages (:func:`virtual_stage_layers`, the chunks of :func:`default_partition`'s
    interleaved split, or with the embedding and the loss split as layers the first and the last
    virtual stage one layer short: :func:`embedding_and_loss_partition`); None where each rank's
    chunks are :func:`chunk_layers` of its layers."""
    if layout.stage_layers is not None or layout.chunk_layers is not None or layout.vpp == 1:
        return None
    embedding, loss = layout.account_for_embedding_in_pipeline_split, layout.account_for_loss_in_pipeline_split
    if embedding or loss:
        return embedding_and_loss_chunks(model.num_layers, layout.pp, layout.vpp, embedding, loss)
    if model.num_layers % (layout.pp * layout.vpp) == 0:
        return None
    return virtual_stage_layers(model.num_layers, layout.pp, layout.vpp)


def default_partition(model: ModelSpec, training: TrainingSpec, layout: Layout) -> tuple[int, ...]:
    """The split an engine makes by itself: nanotron's by block cost, Megatron's embedding- and
    loss-aware split where the layout asks for it, balanced by compute for engines that balance (without interleaving),
    even, or with interleaving over layers the virtual stages do not divide
    :func:`default_chunk_layers`."""
    pp, vpp = layout.pp, layout.vpp
    if training.engine.splits_by_block_cost and pp > 1:
        return block_cost_partition(model.num_layers, pp, *block_costs(model))
    if layout.account_for_embedding_in_pipeline_split or layout.account_for_loss_in_pipeline_split:
        return embedding_and_loss_partition(model.num_layers, pp, vpp, layout.account_for_embedding_in_pipeline_split,
                                            layout.account_for_loss_in_pipeline_split)
    if training.engine.balance_stages and vpp == 1 and pp > 1:
        return balanced_partition(model.num_layers, pp, *layer_and_head_cost(model, training.seq_len))
    chunks = default_chunk_layers(model, layout)
    if chunks is not None:
        return tuple(map(sum, rank_chunks(chunks, pp)))
    return (model.num_layers // pp,) * pp


def model_chunks(stage_layers: tuple[int, ...], vpp: int,
                 chunks: Optional[tuple[int, ...]] = None) -> list[tuple[int, int]]:
    """(rank, layers) of every model chunk in model order: chunk v·pp + r is rank r's v-th
    (Megatron's interleaved order), each rank's chunks as ``chunks`` gives them
    (``Layout.chunk_layers``), else as :func:`chunk_layers` splits them."""
    pp = len(stage_layers)
    if chunks is not None:
        return [(i % pp, n) for i, n in enumerate(chunks)]
    sizes = [chunk_layers(n, vpp) for n in stage_layers]
    return [(r, sizes[r][v]) for v in range(vpp) for r in range(pp)]


def tail_layers_per_stage(stage_layers: tuple[int, ...], vpp: int, tail: int,
                          chunks: Optional[tuple[int, ...]] = None) -> tuple[int, ...]:
    """How many of the model's last ``tail`` decoder layers each pipeline rank holds."""
    held = [0] * len(stage_layers)
    remaining = tail
    for rank, layers in reversed(model_chunks(stage_layers, vpp, chunks)):
        take = min(layers, remaining)
        held[rank] += take
        remaining -= take
    return tuple(held)
