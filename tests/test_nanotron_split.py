"""nanotron cuts its pipeline stages itself (``nanotron/models/base.py``, ``build_model``): the planner
prices that split, and says so where a case states another."""

from __future__ import annotations

import pytest

import planner
from cost_models.partition import block_cost_partition, block_costs
from planner.case import load_case
from planner.plan import case_notes
from planner.search_space import _engine_splits
from planner.engines import ENGINES

PLAYBOOK_3B = {"name": "playbook-3B", "num_layers": 28, "hidden_size": 3072, "num_attention_heads": 32,
               "ffn_hidden_size": 8192, "activation": "swiglu", "vocab_size": 131072, "tied_embeddings": True}


def costs(layers: int, hidden: int, ffn: int, heads: int) -> tuple[int, int]:
    case = {"model": {"num_layers": layers, "hidden_size": hidden, "ffn_hidden_size": ffn,
                      "num_attention_heads": heads, "vocab_size": 131072, "activation": "swiglu"},
            "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 8, "seq_len": 4096, "precision": "bf16", "engine": "nanotron"}}
    return block_costs(load_case(case).model)


def test_nanotron_gives_its_ranks_blocks_by_their_running_cost():
    """nanotron's build_model: a layer costs 4h² + 3fh, the LM head Vh. The 3B's layer is 113.2 M
    and its head 402.7 M (3.6 layers): over 2 ranks the first takes 16 layers (1,812 M reaches half
    of 3,574 M; 15 do not); over 8, each of the first seven takes 4 (453 M passes the 446.7 M share)
    and the last the head alone; over 16 ranks two each (226.5 M reaches 223.3 M), and the head
    closes rank 14, which leaves the last two without a layer. The 80B's head (1.07 G) is 1.1 of its
    layers (973 M): 11 on the first of 8 ranks. The 1B's costs are powers of two that land on the
    thresholds exactly: 10 of its 16 layers (2^26 each, head 2^28) are half the total."""
    b1, b3, b80 = costs(16, 2048, 8192, 32), costs(28, 3072, 8192, 32), costs(80, 8192, 28672, 64)
    assert b3 == (4 * 3072**2 + 3 * 8192 * 3072, 131072 * 3072)
    assert block_cost_partition(28, 2, *b3) == (16, 12)
    assert block_cost_partition(28, 8, *b3) == (4,) * 7 + (0,)
    assert block_cost_partition(28, 16, *b3) == (2,) * 14 + (0, 0)
    assert block_cost_partition(80, 8, *b80) == (11, 10, 10, 10, 10, 10, 10, 9)
    assert block_cost_partition(16, 2, *b1) == (10, 6)
    assert block_cost_partition(16, 4, *b1) == (5, 5, 5, 1)


def case(stage_layers=None, engine="nanotron") -> dict:
    layout = {"dp": 1, "tp": 1, "pp": 8, "micro_batch_size": 1, "zero_stage": 0, "recompute": "none"}
    if stage_layers is not None:
        layout["stage_layers"] = stage_layers
    return {"model": dict(PLAYBOOK_3B), "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "bf16", "engine": engine},
            "layout": layout}


def test_a_stated_split_is_priced_as_nanotron_cuts_it():
    """The Ultra-Scale Playbook's 3B on one node at pp 8 (micro-batch 1, 256 a step) ran at 118,665
    tokens/s. nanotron put four layers on each of the first seven ranks and the LM head alone on the
    last; a case stating the even split [3, 4, 4, 4, 4, 3, 3, 3] describes no run nanotron makes (it
    would leave the last rank three layers and the head, 6.6 layers' work, and was priced at 79,000
    tokens/s). It is priced as nanotron's own split, within 10 % of the published figure."""
    stated = planner.estimate(case([3, 4, 4, 4, 4, 3, 3, 3]))
    own = planner.estimate(case())
    assert stated.step_time_s == own.step_time_s
    assert 256 * 4096 / stated.step_time_s == pytest.approx(118_665, rel=0.10)
    other = planner.estimate(case([3, 4, 4, 4, 4, 3, 3, 3], engine="any"))  # an engine that takes the split
    assert other.step_time_s > 1.3 * own.step_time_s


def test_the_note_names_the_split_nanotron_runs():
    stated = case([3, 4, 4, 4, 4, 3, 3, 3])
    notes = case_notes(stated, load_case(stated))
    assert any("layout.stage_layers [3, 4, 4, 4, 4, 3, 3, 3] is not a split nanotron runs" in n
               and "[4, 4, 4, 4, 4, 4, 4, 0]" in n for n in notes)
    own = case([4, 4, 4, 4, 4, 4, 4, 0])
    assert not any("stage_layers" in n for n in case_notes(own, load_case(own)))
    other = case([3, 4, 4, 4, 4, 3, 3, 3], engine="any")
    assert not any("stage_layers" in n for n in case_notes(other, load_case(other)))


def test_the_search_scores_nanotrons_split_alone():
    loaded = load_case(case())
    splits = _engine_splits(loaded.model, loaded.training, ENGINES["nanotron"].support, 8, loaded.cluster.gpu)
    assert [layers for _, layers, _ in splits] == [(4,) * 7 + (0,)]


def test_a_stated_split_is_still_checked_against_the_model():
    """A split nanotron does not run is priced as nanotron's, but one that does not add up to the
    model's 28 layers is a mistake in the case, refused as for any engine."""
    with pytest.raises(planner.CaseError, match="stage_layers: must sum to num_layers 28, got 32"):
        planner.estimate(case([4] * 8))


def test_the_search_offers_nanotron_more_stages_than_layers():
    """nanotron runs more pipeline ranks than layers (``build_model`` moves on a rank at most once a
    block, and never past the last: the ranks past the blocks hold none), and the Playbook measured
    it: its 3B's 28 layers at tp 4 on 128 GPUs, dp 1, so pp 32. Each layer's 113.2 M passes its
    1/32 share of 3,574 M (111.7 M), so the first 28 ranks take one each and the last 4 none. The
    search skipped every pp above the layers, which left no layout at those pins; Megatron, which
    splits the layers evenly, still has none at pp 32."""
    pinned = {**case(), "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 128},
              "search": {"tp": 4, "dp": 1, "micro_batch_size": 1}}
    del pinned["layout"]
    best = planner.plan(pinned).best
    layout = best.job.layout
    assert (layout.pp, best.job.stage_layers) == (32, (1,) * 28 + (0,) * 4)
    # Priced as estimate prices the layout it names, empty ranks and all.
    again = planner.estimate({**pinned, "layout": {"dp": 1, "tp": 4, "pp": 32, "micro_batch_size": 1,
                                                   "zero_stage": layout.zero_stage,
                                                   "sequence_parallel": layout.sequence_parallel,
                                                   "recompute": layout.recompute}})
    assert again.step_time_s == best.step_time_s
    with pytest.raises(planner.CaseError, match="no megatron layout of 128 GPUs"):
        planner.plan({**pinned, "training": {**pinned["training"], "engine": "megatron"},
                      "search": {**pinned["search"], "cp": 1}})  # cp 1 as nanotron runs: cp 2 fills the ranks
