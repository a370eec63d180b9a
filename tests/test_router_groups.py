"""Group-limited routing (``ModelSpec.moe_router_num_groups`` / ``moe_router_group_topk``): a token
picks g of G groups of contiguous experts before its k experts, so a DeepEP-style dispatch, which
sends a token once to each other domain holding one of its experts, crosses the fabric less
(DeepSeek-V3 report, arXiv:2412.19437, §2.1.2 node-limited routing; megatron-core
``group_limited_topk``)."""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import combinations
from math import comb
from pathlib import Path

import pytest

from cost_models.experts import dispatch_combine_time, remote_domains_per_token
from planner.case import load_case
from planner.errors import CaseError
from planner.hf_config import read_hf_config
from planner.published_runs import case_of, load_rows

FIXTURES = Path(__file__).parent / "fixtures" / "hf"


def deepseek_v3(**model):
    return load_case({"model": {"preset": "deepseek-v3", **model}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 512},
                      "training": {"global_batch_size": 512, "seq_len": 4096, "precision": "bf16"},
                      "search": {"target": "megatron"},
                      "layout": {"tp": 1, "pp": 1, "dp": 512, "ep": 64, "micro_batch_size": 1, "zero_stage": 1}}).job()


@pytest.mark.parametrize("domains, expected", [
    # 8 groups of 32 experts, one a domain: a domain is reached when its group is among the 4
    # picked (1/2) and one of the 8 copies lands in it (1 − (3/4)^8); 7 other domains.
    (8, 7 * 0.5 * (1 - 0.75 ** 8)),
    # 4 domains of two groups: j of a domain's groups picked with probability
    # C(2, j)·C(6, 4 − j)/C(8, 4) = 15/70, 40/70, 15/70, holding j/4 of the picked experts.
    (4, 3 * (40 / 70 * (1 - 0.75 ** 8) + 15 / 70 * (1 - 0.5 ** 8))),
    # 16 domains, two to a group: the group picked (1/2), then 16 of the 128 picked experts are the domain's.
    (16, 15 * 0.5 * (1 - (7 / 8) ** 8)),
    (1, 0.0),
])
def test_deepseek_v3s_groups_reach_fewer_domains(domains, expected):
    model = deepseek_v3().model
    assert remote_domains_per_token(model, domains) == pytest.approx(expected)
    # 3.15 of 8 against 4.59 ungrouped: the report's "at most 4 nodes".
    ungrouped = replace(model, moe_router_num_groups=1, moe_router_group_topk=1)
    assert remote_domains_per_token(ungrouped, domains) == pytest.approx((domains - 1) * (1 - (1 - 1 / domains) ** 8))


def test_groups_that_straddle_domains_are_counted_by_the_experts_they_hold_there():
    """6 groups of 8 experts over 4 domains of 12 (48 experts, 2 groups picked, top-3): every
    pair of groups alike, a domain missed by all 3 copies with probability (1 − n/16)³ where n of
    the 16 picked experts are its own; enumerated pair by pair."""
    model = replace(deepseek_v3().model, num_experts=48, moe_top_k=3, moe_router_num_groups=6,
                    moe_router_group_topk=2)
    reached = 0.0
    for d in range(4):
        mine = set(range(12 * d, 12 * d + 12))
        for pair in combinations(range(6), 2):
            picked = {e for g in pair for e in range(8 * g, 8 * g + 8)}
            reached += (1 - (1 - len(mine & picked) / 16) ** 3) / comb(6, 2)
    assert remote_domains_per_token(model, 4) == pytest.approx(3 / 4 * reached)


def test_the_dispatch_across_nodes_shrinks_with_the_groups_and_not_inside_one():
    grouped = deepseek_v3()
    plain = replace(grouped.model, moe_router_num_groups=1, moe_router_group_topk=1)
    training, cluster = grouped.training, grouped.cluster

    def pair(model, ep):
        return dispatch_combine_time(model, training, cluster, 1, 1, 1, ep, 1)

    # ep 64 over 8 nodes: the crossing traffic falls with 3.15 / 4.59 remote nodes a token.
    assert pair(grouped.model, 64) < 0.8 * pair(plain, 64)
    # ep 8 in one node: nothing crosses, the groups change nothing.
    assert pair(grouped.model, 8) == pytest.approx(pair(plain, 8))


@pytest.mark.parametrize("model, key, words", [
    ({"moe_router_num_groups": 7}, "model.moe_router_num_groups", "must divide num_experts 256"),
    ({"moe_router_group_topk": 9}, "model.moe_router_group_topk", "at most moe_router_num_groups 8"),
    ({"moe_router_num_groups": 64, "moe_router_group_topk": 1}, "model.moe_router_group_topk",
     "leaves 4 experts in the picked groups, fewer than moe_top_k 8"),
    ({"moe_router_num_groups": 0}, "model.moe_router_num_groups", "an integer >= 1"),
])
def test_groups_that_cannot_route_are_refused_by_key(model, key, words):
    with pytest.raises(CaseError) as info:
        deepseek_v3(**model)
    assert info.value.key == key and words in info.value.expected


def test_a_dense_model_has_no_router_groups():
    with pytest.raises(CaseError) as info:
        load_case({"model": {"preset": "llama2-7b", "moe_router_num_groups": 8},
                   "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
                   "training": {"global_batch_size": 8, "seq_len": 4096}}).job()
    assert info.value.key == "model.moe_router_num_groups"
    assert "applies only to a mixture of experts" in info.value.expected


def test_hugging_face_configs_give_their_groups(tmp_path):
    """DeepSeek-V3's config.json: n_group 8, topk_group 4 under noaux_tc; DeepSeek-V2-Lite's
    greedy top-k ignores its n_group 1; DeepSeek-V2's group_limited_greedy picks 3 of 8."""
    v3 = read_hf_config(FIXTURES / "DeepSeek-V3" / "config.json")
    assert (v3["moe_router_num_groups"], v3["moe_router_group_topk"]) == (8, 4)
    assert "moe_router_num_groups" not in read_hf_config(FIXTURES / "DeepSeek-V2-Lite" / "config.json")
    v2 = json.loads((FIXTURES / "DeepSeek-V2-Lite" / "config.json").read_text())
    v2.update(n_routed_experts=160, n_group=8, topk_group=3, topk_method="group_limited_greedy")
    path = tmp_path / "DeepSeek-V2" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(v2))
    fields = read_hf_config(path)
    assert (fields["moe_router_num_groups"], fields["moe_router_group_topk"]) == (8, 3)
    del v2["topk_group"]
    path.write_text(json.dumps(v2))
    with pytest.raises(CaseError) as info:
        read_hf_config(path)
    assert info.value.key == "topk_group"
    # Kimi-K2's config is DeepSeek-V3's architecture with one group (n_group 1, topk_group 1): no groups.
    k2 = {**json.loads((FIXTURES / "DeepSeek-V3" / "config.json").read_text()), "n_group": 1, "topk_group": 1}
    path.write_text(json.dumps(k2))
    assert "moe_router_num_groups" not in read_hf_config(path)


def test_published_deepseek_v3_runs_carry_the_groups_they_state():
    """Each row whose router says "group-limited (8 groups, top-4 groups)" is a case with them, but
    where the benchmark replaced the router: NeMo AutoModel's FakeBalancedGate gives each token 8
    contiguous experts of the 256 (tests/test_fake_gate_routing.py), 32 groups of which it picks one."""
    stated = [r for r in load_rows() if "group-limited" in str((r["model"].get("extra") or {}).get("router"))]
    cases = [(row["id"], case_of(row)[0]) for row in stated]
    cases = [(rid, case) for rid, case in cases if case is not None]
    assert len(cases) >= 30  # Megatron-Bridge's and AutoModel's DeepSeek-V3 runs
    for rid, case in cases:
        groups = (32, 1) if rid.startswith("automodel_") else (8, 4)
        assert (case["model"]["moe_router_num_groups"], case["model"]["moe_router_group_topk"]) == groups, rid


def test_torchtitan_takes_its_671b_flavour_only_with_its_routing():
    """torchtitan's DeepSeek-V3 671B flavour routes over 8 groups, 4 picked
    (models/deepseek_v3/__init__.py): the same shape without them is not that model."""
    from planner.engines.torchtitan import emit

    model = deepseek_v3().model
    assert emit.base_config(model) == (("deepseek_v3", "deepseek_v3_671b"), True)
    assert emit.base_config(replace(model, moe_router_num_groups=1, moe_router_group_topk=1))[1] is False


def test_a_megatron_script_that_routes_otherwise_is_refused(tmp_path):
    """diagnose reads a script's --moe-router-num-groups where it gives one: a script that routes
    over other groups than the case's model runs another dispatch than the one priced."""
    from planner.engines.megatron import read as reader

    case = load_case({"model": {"preset": "deepseek-v3"}, "cluster": {"gpu": "gb200", "num_gpus": 256},
                      "training": {"global_batch_size": 4096, "seq_len": 4096, "engine": "megatron"}})
    common = ("--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --expert-model-parallel-size 64 "
              "--micro-batch-size 1 --global-batch-size 4096 --mtp-num-layers 1 ")
    same, other = tmp_path / "same.txt", tmp_path / "other.txt"
    same.write_text(common + "--moe-router-num-groups 8 --moe-router-group-topk 4\n")
    assert reader.read(same, case).ep == 64
    other.write_text(common + "--moe-router-num-groups 8 --moe-router-group-topk 2\n")
    with pytest.raises(CaseError) as info:
        reader.read(other, case)
    assert info.value.key == "--moe-router-group-topk" and "2 differs from the case's 4" in info.value.expected
