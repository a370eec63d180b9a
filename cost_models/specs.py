"""Specs: the validated, immutable inputs of every cost model, by one name.

All quantities are in base SI units: bytes, bytes per second, FLOP per second, seconds. Each
spec validates itself (:mod:`cost_models.spec_checks`); a :class:`Job` checks them against each
other. They live in modules by what they describe: the model (:mod:`~cost_models.model_spec`),
the hardware (:mod:`~cost_models.hardware`), the training (:mod:`~cost_models.training_spec`),
the layout (:mod:`~cost_models.layout_spec`) and the job (:mod:`~cost_models.job`); this module
gathers them for the callers of the cost models.
"""

from .hardware import BLOCK_SCALED_FORMATS, ClusterSpec, FabricSpec, GPUSpec, HostSpec, Performance, peak_key
from .job import Job
from .layout_spec import RECOMPUTE, RECOMPUTE_MODULES, Layout
from .model_spec import ACTIVATIONS, ATTENTION_TYPES, NORMALIZATIONS, POSITION_EMBEDDINGS, ROUTERS, ModelSpec
from .placement import moe_layers_per_stage
from .spec_checks import SpecError
from .training_spec import EXPERT_DISPATCHES, OPTIMIZER_MOMENTS, OPTIMIZERS, PRECISIONS, Overheads, TrainingSpec

__all__ = ["ACTIVATIONS", "ATTENTION_TYPES", "BLOCK_SCALED_FORMATS", "EXPERT_DISPATCHES", "NORMALIZATIONS",
           "OPTIMIZER_MOMENTS", "OPTIMIZERS", "POSITION_EMBEDDINGS", "PRECISIONS", "RECOMPUTE", "RECOMPUTE_MODULES",
           "ROUTERS",
           "ClusterSpec", "FabricSpec", "GPUSpec", "HostSpec", "Job", "Layout", "ModelSpec", "Overheads",
           "Performance", "SpecError", "TrainingSpec", "moe_layers_per_stage", "peak_key"]
