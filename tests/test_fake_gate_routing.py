"""NeMo AutoModel's benchmarks route by its ``FakeBalancedGate`` (the page's "Fake balanced gate is
enabled to simulate ideal expert routing"; the configs' ``backend.fake_balanced_gate: true``):
``indices = torch.arange(T * k).view(-1, k) % n_routed_experts`` (``nemo_automodel/components/moe/
layers.py``), each of a rank's T tokens given the k contiguous experts from t·k. Their cases carry
that routing (``published_runs.fake_gate_routing``), not the model's own router, which the gate
replaces: a DeepEP dispatch sends each token to the one node that holds its k experts."""

from __future__ import annotations

import pytest

from cost_models.experts import remote_domains_per_token
from planner.case import load_case
from planner.published_runs import case_of, load_rows


@pytest.fixture(scope="module")
def rows():
    return {r["id"]: r for r in load_rows()}


def gate_remote_nodes(experts: int, top_k: int, ep: int, gpus_per_node: int, tokens: int) -> float:
    """Nodes other than its own that a token's copies reach, averaged over every rank's tokens, with
    the gate's indices computed as it computes them; expert e on rank e // (experts / ep) (megatron-core's
    and AutoModel's contiguous placement), rank r on node r // gpus_per_node."""
    per_rank = experts // ep
    total = 0
    for rank in range(ep):
        for t in range(tokens):  # arange restarts on every rank: the gate sees only the rank's tokens
            nodes = {((t * top_k + j) % experts) // per_rank // gpus_per_node for j in range(top_k)}
            total += len(nodes - {rank // gpus_per_node})
    return total / (ep * tokens)


@pytest.mark.parametrize("row_id, nodes", [
    ("automodel_deepseekv3_h100_256g_bf16", 8),   # 256 experts, top-8, ep 64 over 8 nodes
    ("automodel_deepseekv3_h100_1024g_bf16", 8),
    ("automodel_kimik2_h100_256g_bf16", 4),       # 384 experts, top-8, ep 32 over 4 nodes
])
def test_automodel_cases_reach_the_nodes_its_fake_gate_sends_to(rows, row_id, nodes):
    case, why = case_of(rows[row_id])
    assert why == "" and case["training"]["expert_dispatch"] == "deepep"
    job = load_case(case).job()
    model, ep = job.model, case["layout"]["ep"]
    simulated = gate_remote_nodes(model.num_experts, model.moe_top_k, ep, 8, 4096)
    # Every token's k experts lie on one node, its own for 1 token in `nodes`: (D - 1)/D remote nodes.
    assert simulated == pytest.approx((nodes - 1) / nodes)
    assert remote_domains_per_token(model, nodes) == pytest.approx(simulated)


def test_megatron_bridge_forced_balancing_keeps_the_routers_groups(rows):
    """Megatron's forced balancing draws random logits (``moe_router_force_load_balancing``,
    ``moe_utils.apply_random_logits``) and keeps DeepSeek-V3's node-limited groups (8, top-4)."""
    row = next(r for r in rows.values() if r["id"].startswith("mb_") and "DeepSeek-V3" in str(r["model"].get("name"))
               and case_of(r)[0] is not None)
    model = case_of(row)[0]["model"]
    assert (model["moe_router_num_groups"], model["moe_router_group_topk"]) == (8, 4)
