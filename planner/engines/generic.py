"""No engine in particular ("any"): every layout choice, timed as plain PyTorch runs it
(``cost_models.behaviour.GENERIC``: DDP buckets of 25 MB, FSDP units per layer, eager
kernels, op-level selective checkpointing, stages balanced by compute). It has no launch
config of its own."""

from __future__ import annotations

from cost_models.behaviour import GENERIC

from .base import Engine, EngineSupport

SUPPORT = EngineSupport(
    zero_stages=(0, 1, 2, 3), max_zero_with_pp=3, interleaving=True, context_parallel=True,
    sequence_parallel=(False, True), recompute=("none", "selective", "full"), partial_recompute=True,
    optimizer_offload="fraction", optimizer_offload_zero=(0, 1, 2, 3), param_offload=True, activation_offload=True,
)

ENGINE = Engine("any", SUPPORT, GENERIC)
