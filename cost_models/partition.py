"""How the layers of a model are cut into pipeline stages when a layout does not say.

Engines differ, and the difference is a large share of a pipeline's step time: the last
stage also runs the LM head, which for a small model with a large vocabulary costs as
much as several layers (Llama-style 1B, h = 2048, V = 131,072: the head's 2·h·V FLOPs per
token are four layers' worth).

- Megatron-LM splits the decoder layers evenly (``--pipeline-model-parallel-size`` needs
  them to divide), unless told to count the embedding or the loss as layers
  (:func:`embedding_and_loss_partition`).
- An engine-neutral plan (``engine: any``) balances stage compute, as nanotron does
  (``nanotron/models/base.py``: blocks are assigned to pipeline ranks by cumulative
  ``get_block_compute_costs``, the LM head weighted V·h against a layer's 4h² + 3hf) and as
  PipeDream-style partitioners do: the contiguous split whose slowest stage is fastest.
  The edge stages may hold no decoder layer at all.
"""

from __future__ import annotations

from functools import lru_cache

from .flops import attention_flops, head_gemm, layer_gemms
from .specs import Layout, ModelSpec, TrainingSpec


def layer_and_head_cost(model: ModelSpec, seq_len: int) -> tuple[float, float]:
    """Forward FLOPs per token of one layer (GEMMs and causal attention) and of the LM head."""
    layer = sum(g.flops for g in layer_gemms(model, 1, 1)) + attention_flops(model, 1, 1, seq_len, 1)
    return layer, head_gemm(model, 1, 1).flops


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


def embedding_and_loss_partition(layers: int, pp: int, vpp: int, embedding: bool, loss: bool) -> tuple[int, ...]:
    """Megatron's --account-for-embedding/loss-in-pipeline-split: the embedding and the loss
    count as a layer each of the first and the last virtual stage, and the pp·vpp virtual
    stages split the units evenly (``megatron/core/transformer/transformer_block.py``,
    ``get_num_layers_to_build``). Rank i holds virtual stages i, pp + i, …; the returned
    counts are per rank."""
    per_virtual = (layers + embedding + loss) // (pp * vpp)
    counts = [vpp * per_virtual] * pp
    counts[0] -= embedding
    counts[-1] -= loss
    return tuple(counts)


def default_partition(model: ModelSpec, training: TrainingSpec, layout: Layout) -> tuple[int, ...]:
    """The split an engine makes by itself: Megatron's embedding- and loss-aware split where the
    layout asks for it, balanced by compute for engines that balance (without interleaving),
    else even."""
    pp, vpp = layout.pp, layout.vpp
    if layout.account_for_embedding_in_pipeline_split or layout.account_for_loss_in_pipeline_split:
        return embedding_and_loss_partition(model.num_layers, pp, vpp, layout.account_for_embedding_in_pipeline_split,
                                            layout.account_for_loss_in_pipeline_split)
    if training.engine.balance_stages and vpp == 1 and pp > 1:
        return balanced_partition(model.num_layers, pp, *layer_and_head_cost(model, training.seq_len))
    return (model.num_layers // pp,) * pp


def chunk_layers(stage_layers: tuple[int, ...], vpp: int) -> list[tuple[int, int]]:
    """(rank, layers) of every model chunk in model order: chunk v·pp + r is rank r's v-th.

    A rank's layers split as evenly as its vpp chunks allow; where they do not divide, the
    smaller chunks are the first (the embedding's, on rank 0) except on the last rank, whose
    last chunk also holds the loss (Megatron's account-for-embedding/loss split)."""
    pp = len(stage_layers)
    sizes = []
    for rank, n in enumerate(stage_layers):
        base, extra = divmod(n, vpp)
        small_first = [base] * (vpp - extra) + [base + 1] * extra
        sizes.append(small_first[::-1] if rank == pp - 1 else small_first)
    return [(r, sizes[r][v]) for v in range(vpp) for r in range(pp)]


def tail_layers_per_stage(stage_layers: tuple[int, ...], vpp: int, tail: int) -> tuple[int, ...]:
    """How many of the model's last ``tail`` decoder layers each pipeline rank holds."""
    held = [0] * len(stage_layers)
    remaining = tail
    for rank, layers in reversed(chunk_layers(stage_layers, vpp)):
        take = min(layers, remaining)
        held[rank] += take
        remaining -= take
    return tuple(held)
