"""What an engine leaves to the layout, resolved for it: a training's unset choices take the
engine's default at this layout (``EngineBehaviour``): whether the fp32 master is kept as remainders of
the bf16 weights (``TrainingSpec.master_remainders``) and whether the weights are gathered quantized
(``TrainingSpec.fp8_param_gather``), which depend on the ZeRO stage and offload."""

from __future__ import annotations

from dataclasses import fields
from functools import lru_cache

from .layout_spec import Layout
from .training_spec import TrainingSpec


def resolve_training(training: TrainingSpec, layout: Layout) -> TrainingSpec:
    """``training`` with its engine's defaults at ``layout``: the same object where nothing is left
    to resolve.

    - master_remainders unset: the engine keeps the remainders where its optimizer does for the job's
      moments, recipe, ZeRO stage and offload (``EngineBehaviour.keeps_master_remainders``), of bf16
      weights (precision bf16, fp8, mxfp8, nvfp4) under Adam, unless the case keeps the weights
      quantized (fp8_param_gather true), which leaves no bf16 weight for a remainder to complete;
    - fp8_param_gather unset: the engine gathers its quantized weights where its recipe, ZeRO stage
      and offload let it (``EngineBehaviour.gathers_quantized_weights``), and the remainders leave
      them in bf16."""
    remainders, gather = training.master_remainders, training.fp8_param_gather
    recipe = training.recipe
    offloaded = layout.offload_optimizer > 0
    if remainders is None:
        remainders = training.master_weights and training.optimizer != "sgd" and not gather \
            and training.precision not in ("fp32", "fp16") and training.engine.keeps_master_remainders(
                training.optimizer_moments, recipe.name if recipe else None, layout.zero_stage, offloaded)
    if gather is None:
        gather = recipe is not None and not remainders \
            and training.engine.gathers_quantized_weights(recipe.name, layout.zero_stage, offloaded)
    if (remainders, gather) == (training.master_remainders, training.fp8_param_gather):
        return training
    return _resolved(training, remainders, gather)


@lru_cache(maxsize=256)  # a search builds a Job for every layout it scores
def _resolved(training: TrainingSpec, remainders: bool, gather: bool) -> TrainingSpec:
    return TrainingSpec(**{**{f.name: getattr(training, f.name) for f in fields(TrainingSpec)},
                           "master_remainders": remainders, "fp8_param_gather": gather})
