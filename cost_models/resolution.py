"""What an engine leaves to the layout, resolved for it: a training's unset choices take the
engine's default at this layout (``EngineBehaviour``). Today one: whether the weights are gathered
quantized (``TrainingSpec.fp8_param_gather``), which depends on the ZeRO stage and offload."""

from __future__ import annotations

from dataclasses import fields
from functools import lru_cache

from .layout_spec import Layout
from .training_spec import TrainingSpec


def resolve_training(training: TrainingSpec, layout: Layout) -> TrainingSpec:
    """``training`` with its engine's defaults at ``layout``: the same object where nothing is left
    to resolve. fp8_param_gather unset: the engine gathers its quantized weights where its recipe,
    ZeRO stage and offload let it (``EngineBehaviour.gathers_quantized_weights``)."""
    if training.fp8_param_gather is not None:
        return training
    recipe = training.recipe
    keep = recipe is not None and training.engine.gathers_quantized_weights(recipe.name, layout.zero_stage,
                                                                            layout.offload_optimizer > 0)
    return _with_param_gather(training, keep)


@lru_cache(maxsize=256)  # a search builds a Job for every layout it scores
def _with_param_gather(training: TrainingSpec, keep: bool) -> TrainingSpec:
    return TrainingSpec(**{**{f.name: getattr(training, f.name) for f in fields(TrainingSpec)},
                           "fp8_param_gather": keep})
