"""No engine in particular ("any"): every layout choice, timed as plain PyTorch runs it
(``cost_models.behaviour.GENERIC``: DDP buckets of 25 MB, FSDP units per layer, eager
kernels, op-level selective checkpointing, stages balanced by compute). It has no launch
config of its own."""

from __future__ import annotations

from cost_models.behaviour import GENERIC, QUANTIZED_GATHER_ZERO_STAGES
from cost_models.specs import Job

from .base import Engine, EngineSupport

SUPPORT = EngineSupport(
    zero_stages=(0, 1, 2, 3), max_zero_with_pp=3, interleaving=True, context_parallel=True,
    sequence_parallel=(False, True), recompute=("none", "selective", "full"), partial_recompute=True,
    optimizer_offload="fraction", optimizer_offload_zero=(0, 1, 2, 3), param_offload=True, activation_offload=True,
)

def rules(job: Job) -> list[tuple[str, str]]:
    out = []
    if job.requested_training.fp8_param_gather and job.layout.zero_stage not in QUANTIZED_GATHER_ZERO_STAGES:
        # Replicated (ZeRO 0) and ZeRO-2 weights are never gathered: a quantized gather has nothing
        # to move, and the estimate would echo a setting that changes nothing.
        out.append(("training.fp8_param_gather", f"quantizes the weights' gather, and ZeRO stage "
                                                 f"{job.layout.zero_stage} gathers none (stages "
                                                 f"{', '.join(map(str, QUANTIZED_GATHER_ZERO_STAGES))} do)"))
    return out


ENGINE = Engine("any", SUPPORT, GENERIC, rules, title="plain PyTorch")
