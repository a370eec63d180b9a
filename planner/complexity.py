"""How complex a layout is to run: the tie-break of the solver and what --simplest-within minimises."""

from __future__ import annotations

from cost_models.specs import Layout

from .search_rows import Candidate

RECOMPUTE_LEVEL = {"none": 0, "selective": 1, "full": 2}


# The order complexity() ranks by, least complex first, as users read it.
COMPLEXITY_ORDER = "accumulation < recomputation < offload < ZeRO < EP < TP < CP < PP (with VPP)"


def complexity(candidate: Candidate, global_batch: int) -> tuple:
    """Complexity in the order users climb it (COMPLEXITY_ORDER): pipeline stages with their
    virtual stages first, then CP, TP, EP (expert tensor then expert parallel), ZeRO, offload,
    recomputation and accumulation."""
    return layout_complexity(candidate.layout, global_batch)


def layout_complexity(lay: Layout, global_batch: int) -> tuple:
    """:func:`complexity` of a layout. Of a layout with neither recomputation nor offload, the least
    complexity any layout built on it by recomputing or offloading has: those come last in the order."""
    accumulation = global_batch // (lay.micro_batch_size * lay.dp)
    offload = (lay.offload_params, lay.offload_optimizer, lay.offload_activations)
    return (lay.pp * lay.vpp, lay.cp, lay.tp, lay.expert_tp, lay.ep, lay.zero_stage, offload, RECOMPUTE_LEVEL[lay.recompute],
            lay.recompute_num_layers or 0, accumulation)
