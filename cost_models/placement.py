"""Where the layers go: each pipeline stage's layers and model chunks, and what they hold (MoE
layers, layers a recipe keeps in bf16). The layout's own split where it gives one, else the
engine's (:mod:`cost_models.partition`)."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional

from . import partition
from .layout_spec import Layout
from .model_spec import ModelSpec
from .training_spec import TrainingSpec


def stage_layers(model: ModelSpec, training: TrainingSpec, layout: Layout) -> tuple[int, ...]:
    """Layers of each pipeline stage: the layout's, else the engine's own split
    (:func:`partition.default_partition`), which an engine that takes no split (nanotron) runs
    whatever the layout says (``stage_layers`` or ``chunk_layers``, which sets it; ``Job`` still
    checks a stated one, and ``planner.plan.own_split_note`` says it is not the one priced)."""
    if layout.stage_layers is not None and not training.engine.splits_by_block_cost:
        return layout.stage_layers
    return partition.default_partition(model, training, layout)


def chunk_layers(model: ModelSpec, training: TrainingSpec, layout: Layout) -> Optional[tuple[int, ...]]:
    """Layers of each model chunk in model order where they are not each rank's layers split
    evenly (:func:`partition.chunk_layers`): the layout's own, unless the engine cuts its stages
    itself (:func:`stage_layers`), else the engine's uneven interleaved split
    (:func:`partition.default_chunk_layers`); None otherwise."""
    if layout.chunk_layers is not None and not training.engine.splits_by_block_cost:
        return layout.chunk_layers
    return partition.default_chunk_layers(model, layout)


def rank_chunk_layers(stages: tuple[int, ...], chunks: Optional[tuple[int, ...]], layout: Layout,
                      stage: int) -> tuple[int, ...]:
    """Layers of each of pipeline rank ``stage``'s model chunks, in model order."""
    if chunks is not None:
        return tuple(chunks[stage::layout.pp])  # rank_chunks(chunks, pp)[stage], without every other rank's
    return partition.chunk_layers(stages[stage], layout.vpp)


def high_precision_layers(model: ModelSpec, training: TrainingSpec, layout: Layout, stages: tuple[int, ...],
                          chunks: Optional[tuple[int, ...]]) -> tuple[int, ...]:
    """Decoder layers of each stage whose linears the recipe keeps in bf16: the model's last
    ⌈share·L⌉ (``quantization.Recipe.high_precision_layers``; torchtitan's
    ``nvfp4_bf16_tail_fqns`` rounds up likewise), 0 everywhere without such a recipe."""
    tail = high_precision_tail(model, training)
    if not tail:  # most recipes keep no layer in bf16: no chunk walk for every layout scored
        return (0,) * len(stages)
    return partition.tail_layers_per_stage(stages, layout.vpp, tail, chunks)


def high_precision_tail(model: ModelSpec, training: TrainingSpec) -> int:
    """The model's last decoder layers the recipe keeps in bf16: ⌈share·L⌉, 0 for most recipes."""
    recipe = training.recipe
    return math.ceil(recipe.high_precision_layers * model.num_layers) if recipe else 0


@lru_cache(maxsize=4096)
def moe_layers_per_stage(model: ModelSpec, stage_layers: tuple[int, ...], vpp: int = 1,
                         chunks: Optional[tuple[int, ...]] = None) -> tuple[int, ...]:
    """MoE layers of each pipeline stage. With interleaving, rank r holds virtual stages
    r, pp + r, … of stage_layers[r] / vpp consecutive layers each (Megatron's order)."""
    if not model.is_moe:
        return (0,) * len(stage_layers)
    counts = [0] * len(stage_layers)
    start = 0
    for rank, layers in partition.model_chunks(stage_layers, vpp, chunks):
        counts[rank] += model.moe_layers_in(start, layers)
        start += layers
    return tuple(counts)
