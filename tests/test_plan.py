"""`plan`: fixed global batch, pins and engines respected, estimate agrees, and answers when nothing fits."""

from __future__ import annotations

import copy
import dataclasses
import re
import json
import subprocess
import sys

import pytest

import planner
from planner.engines import ENGINES
from planner.search import partitions

BASE = {
    "model": {"preset": "llama2-7b"},
    "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
    "training": {"global_batch_size": 128, "seq_len": 4096, "precision": "bf16", "optimizer": "adam"},
}


def case(**sections) -> dict:
    out = copy.deepcopy(BASE)
    for name, values in sections.items():
        out.setdefault(name, {}).update(values)
    return out


def layout_of(estimate) -> dict:
    return estimate.to_dict()["layout"]


def test_plan_keeps_the_global_batch_and_fits():
    p = planner.plan(case(), fastest=True)
    assert p.status == "OPTIMAL"
    for est in (p.best,) + p.alternatives:
        lay = est.to_dict()
        assert lay["layout"]["micro_batch_size"] * lay["grad_accum"] * lay["layout"]["dp"] == 128
        # the default headroom (the driver's 1 %), over the low end of the memory band
        assert est.peak.total * est.memory_band.low <= est.capacity_bytes * 0.99 - 2**30
        assert est.fits
    times = [p.best.step_time_s] + [a.step_time_s for a in p.alternatives]
    assert times == sorted(times)


def test_estimate_and_plan_hold_a_layout_to_the_same_headroom():
    """A layout fits with a little less headroom than it leaves free and not with a little more,
    in `estimate` as in `plan` (which then finds nothing with every variable pinned)."""
    layout = {"dp": 16, "micro_batch_size": 1, "zero_stage": 3, "recompute": "full"}
    probe = planner.estimate(case(layout=layout))
    context = probe.job.overheads.cuda_context  # outside the allocator's peak, off the capacity
    share = (probe.peak.total + context) / probe.capacity_bytes
    assert 0.0 < share < 0.97
    low, high = round(1 - share - 0.02, 3), round(1 - share + 0.02, 3)
    pins = {"dp": 16, "tp": 1, "pp": 1, "cp": 1, "micro_batch_size": 1, "zero_stage": 3, "recompute": "full",
            "offload_optimizer": 0, "offload_params": False, "offload_activations": 0}
    for headroom, fits in ((low, True), (high, False)):
        est = planner.estimate(case(layout=layout, search={"headroom": headroom}))
        assert est.fits is fits
        memory = est.to_dict()["memory"]
        assert memory["usable_bytes"] == round(est.capacity_bytes * (1 - headroom) - context)
        assert memory["outside_allocator_bytes"] == round(context) == 2**30  # the documented default
        assert (planner.plan(case(search={**pins, "headroom": headroom})).best is not None) is fits


@pytest.mark.parametrize("search", [{}, {"target": "megatron"}, {"target": "deepspeed"}])
def test_estimate_of_the_best_layout_returns_the_plans_figures(search):
    """Also when the engine (searched for, and so trained with) changes the timing."""
    p = planner.plan(case(search=search))
    planned = case(search=search)
    # With no engine named the plan picks one (its JSON's "engine"): the replay runs on it.
    planned["training"] = {**planned["training"], "engine": p.to_dict()["engine"]}
    replay = planner.estimate({**planned, "layout": layout_of(p.best)}).to_dict()
    assert replay == p.best.to_dict()


def test_an_engine_without_tp_overlap_refuses_it():
    with pytest.raises(planner.CaseError, match="training.tp_comm_overlap: deepspeed cannot overlap"):
        planner.plan(case(training={"tp_comm_overlap": True}, search={"target": "deepspeed"}))


def test_pins_and_bounds_are_obeyed():
    p = planner.plan(case(search={"tp": 2, "max_pp": 2, "zero_stage": 1}))
    for est in (p.best,) + p.alternatives:
        lay = layout_of(est)
        assert lay["tp"] == 2 and lay["pp"] <= 2 and lay["zero_stage"] == 1


@pytest.mark.parametrize("target", ["megatron", "deepspeed", "torchtitan"])
def test_engine_restrictions(target):
    """Each answer is expressible by its engine (e.g. DeepSpeed's pipeline takes ZeRO ≤ 1)."""
    p = planner.plan(case(cluster={"num_gpus": 64}, model={"preset": "llama2-70b"}, search={"target": target}))
    engine = ENGINES[target].support
    for est in (p.best,) + p.alternatives:
        assert ENGINES[target].problems(est.job) == []
        lay = layout_of(est)
        assert engine.allows(lay["tp"], lay["pp"], lay["cp"], lay["vpp"], lay["zero_stage"],
                             lay["sequence_parallel"], lay["recompute"])
        if not engine.partial_recompute:
            assert "recompute_num_layers" not in lay


def test_tp_stays_inside_the_nvlink_domain_unless_lifted():
    with pytest.raises(planner.CaseError, match="search: no megatron, deepspeed or torchtitan layout of 32 GPUs .* meets the "
                                        "search section's tp"):
        planner.plan(case(cluster={"num_gpus": 32}, search={"min_tp": 16}))  # 16 > an A100 NVLink domain's 8
    lifted = planner.plan(case(cluster={"num_gpus": 32}, search={"min_tp": 16, "tp_across_nodes": True}))
    assert layout_of(lifted.best)["tp"] == 16


def test_a_search_section_naming_cp_is_not_held_to_the_default_tokens_per_rank():
    """By default each context-parallel rank keeps 1,024 tokens (4,096 tokens: cp at most 4);
    a section that pins or bounds cp asks for the degrees it names (docs/case-reference.md: "unless
    max_cp is given"). cp 8 on 4,096 tokens is 512 a rank, and the sequence divides by 2·cp = 16,
    as Megatron's load-balanced ring splits it: it has a layout on 16 GPUs (dp 2)."""
    base = case(model={"preset": "llama3-8b"}, cluster={"gpu": "h100-sxm-80gb"},
                training={"global_batch_size": 32, "engine": "megatron"})
    free = planner.plan(base, top_k=20)
    assert all(layout_of(e)["cp"] * 1024 <= 4096 for e in (free.best,) + free.alternatives)
    for search in ({"max_cp": 8, "min_cp": 8}, {"cp": 8}):
        assert layout_of(planner.plan({**base, "search": search}, top_k=0).best)["cp"] == 8


def test_differences_never_give_a_recompute_modes_key_to_a_layout_of_another_mode():
    """Llama 3 70B on 8 H100s at 16 × 8,192 tokens: the pick recomputes 2 layers of a stage in full;
    the fastest, at vpp 40, recomputes nothing. A layout without full recomputation recomputes no
    layer (Megatron reads --recompute-num-layers only with --recompute-granularity full), so its
    difference is "recompute full→none", not also "recompute_num_layers 2→all"."""
    p = planner.plan({"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
                      "training": {"global_batch_size": 16, "seq_len": 8192, "engine": "megatron"}})
    others = p.alternatives + ((p.fastest,) if p.fastest is not None else ())
    mode_changes = 0
    for other in others:
        diff = p.differences(other)
        modes = {layout_of(p.best)["recompute"], layout_of(other)["recompute"]}
        if modes != {"full"}:
            assert "recompute_num_layers" not in diff, diff
        if modes != {"selective"}:
            assert "recompute_modules" not in diff, diff
        mode_changes += "recompute" in diff
    assert mode_changes, "the case no longer sets a pick against a layout of another recomputation mode"


def test_a_fastest_of_another_engine_is_said_to_be_that_engines():
    """MPT-1B on 8 A100s, no engine named: the pick is torchtitan's dp 8 at ZeRO 0, the fastest
    Megatron-LM's at ZeRO 1. torchtitan runs ZeRO 0 or 3 only (FSDP2: docs/case-reference.md,
    search.target), so "the fastest (zero_stage 0→1)" named a layout the pick's engine cannot run:
    what differs leads with the engine, in the report and in --json."""
    p = planner.plan({"model": {"preset": "mpt-1b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8},
                      "training": {"global_batch_size": 32, "seq_len": 4096}})
    ours, theirs = p.best.job.training.engine.name, p.fastest.job.training.engine.name
    assert ours != theirs, "the case no longer sets a fastest of another engine against the pick"
    diff = p.to_dict()["pick"]["fastest"]["differs_from_best"]
    assert list(diff)[0] == "engine" and diff["engine"] == [ours, theirs]
    # Within one engine nothing changes: the alternatives are the pick's engine's own.
    assert all("engine" not in alt["differs_from_best"] for alt in p.to_dict()["alternatives"])


def test_a_runner_up_set_below_by_speed_is_not_called_the_more_complex():
    """Llama 3 8B on 8 H100s, 64 × 2,048 tokens, --fastest: the pick runs ZeRO 2, the runner-up ZeRO 1
    (simpler: docs/robust-plans.md's order puts ZeRO above accumulation) 1.5 ms slower a step,
    within the 0.1 % the report calls a tie. --fastest ranks by step time: the runner-up lost on
    speed, and "ranks lower as the more complex layout" said the opposite of what it is."""
    p = planner.plan({"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
                      "training": {"global_batch_size": 64, "seq_len": 2048, "engine": "megatron"}}, fastest=True)
    runner = p.alternatives[0]
    assert runner.job.layout.zero_stage < p.best.job.layout.zero_stage, "the case no longer has a simpler runner-up"
    assert 0 < runner.step_time_s - p.best.step_time_s <= 1e-3 * p.best.step_time_s
    why = p.why_runner_up_lost()
    assert "more complex" not in why and "slower" in why, why


def test_a_tied_runner_up_set_below_by_its_memory_band_is_said_to_fit_less_surely():
    """Llama 2 7B on 16 H100s held to 48 GB, DeepSpeed, 16 × 2,048 tokens: the ZeRO-1 runner-up
    steps exactly as fast as the ZeRO-2 pick, and is simpler (docs/robust-plans.md's order), but its
    memory band's upper end (44.5 GB predicted) overflows the usable memory where the pick's
    (31.9 GB) does not: the robust pick takes the surer to fit first. The report called it "the
    more complex layout". ZeRO-3 is held out (search.max_zero_stage 2): its reduce-scatters run ahead of
    the whole-bucket all-reduces DeepSpeed's ZeRO-1/2 optimizer issues, and it would be the runner-up."""
    p = planner.plan({"model": {"preset": "llama2-7b"},
                      "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16, "memory": "48 GB"},
                      "training": {"global_batch_size": 16, "seq_len": 2048, "engine": "deepspeed"},
                      "search": {"max_zero_stage": 2}})
    runner = p.alternatives[0]
    assert runner.job.layout.zero_stage < p.best.job.layout.zero_stage, "the case no longer has a simpler runner-up"
    assert (p.best.memory_verdict, runner.memory_verdict) == ("fits", "at risk")
    why = p.why_runner_up_lost()
    assert why.startswith("ties") and "less sure to fit" in why and "more complex" not in why, why


def test_full_recomputation_of_a_few_layers_is_weighed_against_selective_of_all():
    """Llama 2 7B on 8 A100 80GB at 4,096 tokens without flash attention, pinned to dp 8, ZeRO 2
    and micro-batch 1: nothing fits without recomputation, and Megatron's selective recomputation
    (every layer's attention core, quadratic here) costs more than recomputing 2 whole layers of
    32, which fits. The plan takes the faster, though selective is the lesser recomputation.
    The case keeps 7 % of the memory free (search.headroom) to make memory bind."""
    pins = {"tp": 1, "pp": 1, "cp": 1, "micro_batch_size": 1, "zero_stage": 2, "offload_optimizer": 0,
            "offload_params": False, "offload_activations": 0, "headroom": 0.07}
    job = case(model={"preset": "llama2-7b"}, cluster={"num_gpus": 8},
               training={"global_batch_size": 16, "engine": "megatron", "flash_attention": False},
               search={"headroom": 0.07})
    layout = {**{k: v for k, v in pins.items() if k != "headroom"}, "dp": 8, "sequence_parallel": False}
    full = planner.estimate({**job, "layout": {**layout, "recompute": "full", "recompute_num_layers": 2}})
    selective = planner.estimate({**job, "layout": {**layout, "recompute": "selective"}})
    assert full.fits and selective.fits and full.step_time_s < selective.step_time_s
    assert not planner.estimate({**job, "layout": {**layout, "recompute": "full", "recompute_num_layers": 1}}).fits
    best = planner.plan({**job, "search": pins}, fastest=True).best
    assert layout_of(best)["recompute"] == "full" and best.step_time_s == pytest.approx(full.step_time_s)
    # The robust pick takes the selective one: within the margin, and surer to fit (full on 2 layers
    # fits only at its memory band's low end).
    from planner.search_memory import fit_tier

    robust = planner.plan({**job, "search": pins})
    tier = lambda e: fit_tier(e.job, e.peak.total, 0.07)  # noqa: E731
    assert layout_of(robust.best)["recompute"] == "selective" and tier(robust.best) < tier(full)
    assert robust.best.step_time_s <= full.step_time_s * (1 + robust.margin)


@pytest.mark.slow  # 70B on 64 GPUs, twice, with a wide simplest-within table: its module goes first
def test_simplest_within_trades_speed_for_fewer_moving_parts():
    fastest = planner.plan(case(cluster={"num_gpus": 64}, model={"preset": "llama2-70b"}))
    simple = planner.plan(case(cluster={"num_gpus": 64}, model={"preset": "llama2-70b"}), simplest_within=10)
    assert simple.best.step_time_s <= fastest.best.step_time_s * 1.10 + 1e-6
    a, b = layout_of(fastest.best), layout_of(simple.best)
    # Pipeline stages are the costliest complexity: the simple answer never has more.
    assert b["pp"] * b["vpp"] <= a["pp"] * a["vpp"]


def test_nothing_fits_is_an_answer_with_the_overflowing_term_and_what_would_fit():
    huge = case(model={"preset": "llama3.1-405b"}, cluster={"num_gpus": 8})
    p = planner.plan(huge)
    assert p.best is None and p.status == "INFEASIBLE"
    advice = p.no_fit
    assert advice.term in ("parameters", "gradients", "optimizer_states", "activations")
    assert advice.gpus_that_fit is not None and advice.gpus_that_fit > 8
    # The limit is a predicted peak (above the usable memory: its band's low end is within it), said
    # so: "a layout fits up to 87.0 GB, the usable memory over its memory band's low end" read as a
    # usable memory of 87 GB on GPUs of 80.
    assert f"a predicted peak up to {advice.limit_bytes / 1e9:.1f} GB fits, its memory band's low end within " \
           "the usable memory" in advice.describe()
    # The advised GPU count does fit, and one node fewer does not.
    assert planner.plan(case(model={"preset": "llama3.1-405b"}, cluster={"num_gpus": advice.gpus_that_fit})).best
    assert not planner.plan(case(model={"preset": "llama3.1-405b"},
                                 cluster={"num_gpus": advice.gpus_that_fit - 8})).best


def test_where_nothing_fits_the_json_names_no_pick():
    """Llama 3.1 405B on 16 A100s of 40 GB within pp 2: 810 GB of bf16 weights over tp 8 × pp 2 is
    over 50 GB a GPU, so no layout fits and nothing is picked. `pick` said made_on "speed" within a
    margin of 0.0 set by the model, whose margin is the published sweeps' gap (7.9 %): it is null,
    as `best` and `engine` are."""
    p = planner.plan({"model": {"preset": "llama3.1-405b"}, "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 16},
                      "training": {"global_batch_size": 16, "seq_len": 8192, "engine": "megatron"},
                      "search": {"max_pp": 2}}, top_k=0)
    printed = p.to_dict()
    assert printed["best"] is None and printed["engine"] is None
    assert printed["pick"] is None


def test_what_would_fit_counts_gpus_within_the_first_node():
    # Llama 2 70B's 16 bytes a parameter need more than one H100's 80 GB even offloaded: the advice
    # is the fewest GPUs that fit, here within the node (it said 16, two whole nodes, skipping one).
    lone = planner.plan(case(model={"preset": "llama2-70b"}, cluster={"num_gpus": 1}))
    fewest = lone.no_fit.gpus_that_fit
    assert fewest is not None and 1 < fewest <= 8
    assert planner.plan(case(model={"preset": "llama2-70b"}, cluster={"num_gpus": fewest})).best
    assert not planner.plan(case(model={"preset": "llama2-70b"}, cluster={"num_gpus": fewest - 1})).best


def test_where_these_gpus_have_no_layout_the_advice_is_the_fastest_size_below_not_the_most_gpus():
    """Llama 3 8B on 1,000 H100s at a batch of 1,024: no layout of 1,000 GPUs at all (dp divides the
    batch, and the factor of 125 left no tp, pp or cp fills). The most GPUs below that have one, 992,
    run dp 4, tp 2, pp 31, cp 4; the advice said "992 GPUs", where 768 run twice the tokens/s. It names
    the size below whose fastest layout runs the most tokens/s, each size timed by the planner's own
    plan there, and what the most GPUs below would run beside it."""
    eight = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 1000},
             "training": {"global_batch_size": 1024, "seq_len": 8192}}
    advice = planner.plan(eight).no_fit

    def fastest_at(gpus: int):  # the plan's fastest there, of the engine whose advice it is
        return planner.plan({**eight, "cluster": {**eight["cluster"], "num_gpus": gpus}}, target=advice.engine,
                            fastest=True).best

    most = fastest_at(992)  # the most GPUs below with a layout: a 31-stage pipeline
    assert most.job.layout.pp == 31
    advised = fastest_at(advice.fewer_gpus_that_fit)
    assert advised.tokens_per_s >= most.tokens_per_s
    assert advice.fewer_gpus_that_fit < 992 and advised.job.layout.pp != 31
    # Sizes a user might take instead (as many nodes as a power of two allows, a pipeline of 7, of 15)
    # run no faster.
    for gpus in (512, 896, 960):
        assert fastest_at(gpus).tokens_per_s <= advised.tokens_per_s
    # The figures given are the plan's at each size, the most GPUs' said beside the advised.
    assert advice.fewer_gpus_tokens_per_s == pytest.approx(advised.tokens_per_s, rel=1e-9)
    assert advice.fewer_gpus_layout == advised.job.layout
    assert (advice.most_fewer_gpus_that_fit, advice.most_fewer_gpus_tokens_per_s) == (992, pytest.approx(
        most.tokens_per_s, rel=1e-9))
    said = advice.describe()
    assert f"{advice.fewer_gpus_that_fit} GPUs would have a layout that fits" in said
    # The figures are the fastest layout's, which `plan` there gives with --fastest (by default the robust
    # pick, up to the gap the model cannot tell apart slower): said so, not left to be read as plan's.
    assert f"its fastest layout (`plan --fastest`) runs {advised.tokens_per_s:,.0f} tokens/s" in said
    assert f"the most GPUs below that have one, 992, would run {most.tokens_per_s:,.0f} tokens/s" in said
    # Of the engines planned, the advice is the one whose size below runs fastest.
    assert advice.engine in ("megatron", "deepspeed", "torchtitan")
    for engine in ("megatron", "deepspeed", "torchtitan"):
        own = planner.plan(eight, target=engine).no_fit
        assert own.fewer_gpus_tokens_per_s <= advice.fewer_gpus_tokens_per_s


def test_cli_plan_json_and_exit_codes(tmp_path):
    import yaml
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(case()))
    out = subprocess.run([sys.executable, "-m", "planner", "plan", str(good), "--json", "--top", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data == json.loads(json.dumps(planner.plan(good, top_k=2).to_dict()))
    assert len(data["alternatives"]) == 2 and data["runner_up_lost_because"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(case(model={"preset": "llama3.1-405b"}, cluster={"num_gpus": 8})))
    out = subprocess.run([sys.executable, "-m", "planner", "plan", str(bad)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 3 and "no layout fits" in out.stdout
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump(case(search={"max_ppp": 4})))
    out = subprocess.run([sys.executable, "-m", "planner", "plan", str(typo)], capture_output=True, text=True)
    assert out.returncode == 2 and "search.max_ppp" in out.stderr and "did you mean 'max_pp'" in out.stderr


@pytest.mark.parametrize("layers, pp, expected", [
    (32, 4, [None, (7, 9, 9, 7)]),  # even, and edges lightened by one layer each
    (126, 16, [(7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7)]),  # Llama 3.1 405B: 126 = 7 + 14·8 + 7
    (4, 8, []),
])
def test_pipeline_partitions(layers, pp, expected):
    assert partitions(layers, pp) == expected


@pytest.mark.parametrize("within, sections", [
    (2, {"model": {"preset": "llama2-13b"}, "training": {"engine": "megatron"}}),  # the simplest row is slower
    (25, {}),  # a table of hundreds of rows
])
def test_simplest_within_is_the_simplest_row_of_the_table_within_its_bound(monkeypatch, within, sections):
    """The pick, checked by brute force over the table it was given: of the rows within ``within`` %
    of the fastest, the surest to fit (search_memory.fit_tier), then the one of least complexity
    (planner.complexity), as the default pick at its own margin (it took the least complex whatever
    its fit: a layout predicted over memory where the default took one that fits at its band's top)."""
    from planner.complexity import complexity
    from planner.search_memory import fit_tier

    plan_module = sys.modules["planner.plan"]
    tables = []
    table_of = plan_module._table
    monkeypatch.setattr(plan_module, "_table", lambda *a: tables.append(table_of(*a)) or tables[-1])
    p = planner.plan(case(**sections), simplest_within=within, engine=(sections.get("training") or {}).get("engine", "any"))
    (table,) = tables
    fastest_us = min(round(c.step_time_s * 1e6) for c in table)
    bound = int(fastest_us * (1 + within / 100))
    rows = [i for i, c in enumerate(table) if round(c.step_time_s * 1e6) <= bound]
    assert len(rows) > 1  # a choice to make
    headroom = p.best.case.search.headroom
    tier = {i: fit_tier(table[i].job, table[i].peak_bytes, headroom) for i in rows}
    surest = min(tier.values())
    simplest = min((i for i in rows if tier[i] == surest), key=lambda i: (complexity(table[i], 128),
                                                                          table[i].step_time_s))
    assert p.best.job.layout == table[simplest].layout


@pytest.mark.slow  # 70B on 64 GPUs with a wide simplest-within table
def test_a_faster_runner_up_of_simplest_within_is_not_called_a_tie():
    p = planner.plan(case(cluster={"num_gpus": 64}, model={"preset": "llama2-70b"}), simplest_within=10)
    runner = p.alternatives[0]
    assert runner.step_time_s < p.best.step_time_s * (1 - 1e-3)  # the simplest choice left a faster one
    why = p.why_runner_up_lost()
    assert "tie" not in why and "faster" in why
    assert "TP < CP < PP (with VPP)" in why


def test_pins_no_layout_can_meet_are_the_cases_error(tmp_path):
    """Exit 3 ("no layout fits") said the pins were a memory problem, and looked for a cluster where
    one would fit at every size up to 64 times this one: seconds."""
    import yaml

    path = tmp_path / "case.yaml"
    for search, says in (({"tp": 3}, "search: no megatron layout of 8 GPUs for this model and global batch meets the "
                                     "search section's tp, though some layout runs without them"),
                         ({"offload_activations": 1, "recompute": "full"},  # refused before the search (7 s on MoE)
                          "search.offload_activations: megatron cannot run it beside search.recompute full: "
                          "Megatron's CPU offloading does not work with activation recomputation")):
        path.write_text(yaml.safe_dump(case(model={"preset": "llama2-70b"}, cluster={"num_gpus": 8}, search=search,
                                            training={"engine": "megatron"})))
        out = subprocess.run([sys.executable, "-m", "planner", "plan", str(path)], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert says in out.stderr, out.stderr


@pytest.mark.parametrize("search, says", [
    # only full recomputation left, no offload
    ({"tp": 1, "pp": 1, "recompute": "full", "offload_optimizer": 0, "offload_params": False}, "closest layout needs"),
])
def test_nothing_fits_never_says_inf_gb(tmp_path, search, says):
    import yaml

    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case(model={"preset": "llama2-70b"}, cluster={"num_gpus": 8}, search=search)))
    out = subprocess.run([sys.executable, "-m", "planner", "plan", str(path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 3, out.stderr
    text = " ".join(out.stdout.split())
    assert "inf GB" not in text and says in text
    data = json.loads(json.dumps(planner.plan(path).to_dict()))["no_fit"]
    assert data["peak_bytes"] is None or data["peak_bytes"] > 0


def test_engine_on_the_command_line_overrides_the_cases_engine(tmp_path):
    import yaml

    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case(training={"engine": "megatron"}, search={"target": "megatron"})))
    out = tmp_path / "out"
    refused = subprocess.run([sys.executable, "-m", "planner", "plan", str(path), "--emit", "deepspeed",
                              "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "pass --engine deepspeed" in refused.stderr and not out.exists()
    done = subprocess.run([sys.executable, "-m", "planner", "plan", str(path), "--emit", "deepspeed",
                           "--engine", "deepspeed", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["ds_config.json", "launch.sh", "sbatch.sh"]
    assert planner.plan(path, engine="deepspeed").best.job.training.engine.name == "deepspeed"
    clash = subprocess.run([sys.executable, "-m", "planner", "plan", str(path), "--emit", "deepspeed",
                            "--engine", "megatron", "--out", str(tmp_path / "x")], capture_output=True, text=True)
    assert clash.returncode == 2 and "--engine" in clash.stderr


def test_the_alternatives_table_folds_stage_lists_and_never_prints_none(tmp_path):
    import yaml

    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case(model={"preset": "llama3.1-405b"}, cluster={"num_gpus": 1024},
                                        training={"global_batch_size": 1024}, search={"min_pp": 16})))
    out = subprocess.run([sys.executable, "-m", "planner", "plan", str(path), "--top", "8", "--engine", "any"],
                         capture_output=True,
                         text=True, timeout=300, env={**__import__("os").environ, "COLUMNS": "300"})
    assert out.returncode == 0, out.stderr
    table = out.stdout[out.stdout.index("Alternatives"):]
    assert "None" not in table
    assert "[" not in table  # no Python list
    assert "×" in table  # repeated stage sizes folded, e.g. 7, 8×14, 7


def test_plan_does_not_read_the_layout_it_ignores():
    """A case whose layout section is meant for `estimate` (here one that cannot exist on 8 GPUs)
    plans exactly as the same case without it."""
    base = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100", "num_gpus": 8},
            "training": {"global_batch_size": 32, "seq_len": 4096}}
    with_layout = planner.plan({**base, "layout": {"tp": 3}}, top_k=0)
    assert with_layout.best.job.layout == planner.plan(base, top_k=0).best.job.layout


def test_the_api_loads_what_it_is_asked_for_and_its_names_stay_the_functions():
    """`import planner` loads neither the plan, the sizing nor the fit until one is asked for; once
    their modules load (as `plan` and `size` load theirs), planner.plan, planner.size and
    planner.emit are still the functions, not the modules of the same names."""
    code = """
import sys
import planner
assert not {"planner.plan", "planner.size", "planner.learn", "planner.configs"} & set(sys.modules), sorted(sys.modules)
import planner.plan, planner.size, planner.engines.megatron.emit
from planner import Plan, Sizing, calibrate_from_runs, emit, plan, read_config, size
assert planner.plan is plan and callable(plan) and planner.size is size and callable(size)
assert planner.emit is emit and callable(emit) and Plan.__name__ == "Plan"
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_a_pinned_activation_offload_beside_selective_recomputation_is_searched():
    """The search offloaded activations only without recomputation: pinned beside selective
    recomputation it scored nothing and answered "no layout fits" (after 12.7 s of looking for a
    cluster where one would), where `estimate` of the same layout says it fits."""
    pins = {"tp": 8, "pp": 1, "cp": 1, "micro_batch_size": 1, "zero_stage": 1, "sequence_parallel": True,
            "recompute": "selective", "offload_activations": 3, "offload_optimizer": 0}
    job = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 128},
           "training": {"global_batch_size": 512, "seq_len": 8192, "engine": "any"}}
    layout = {k: v for k, v in pins.items()}
    alone = planner.estimate({**job, "layout": layout})
    assert alone.fits
    best = planner.plan({**job, "search": pins}, engine="any").best
    assert best is not None and best.job.layout == alone.job.layout
    assert best.step_time_s == pytest.approx(alone.step_time_s)


@pytest.mark.parametrize("search, key, needle", [
    ({"pp": 4, "max_pp": 2}, "search.pp", "pins 4, outside search.max_pp (2)"),
    ({"tp": 4, "min_tp": 8}, "search.tp", "pins 4, outside search.min_tp (8)"),
    ({"zero_stage": 3, "max_zero_stage": 1}, "search.zero_stage", "pins 3, outside search.max_zero_stage (1)"),
    ({"vpp": 2, "pp": 1}, "search.vpp", "interleaving needs pp > 1"),
    ({"sequence_parallel": True, "max_tp": 1}, "search.sequence_parallel", "needs tp > 1"),
    ({"offload_params": True, "zero_stage": 1}, "search.offload_params", "needs zero_stage 3"),
])
def test_pins_and_bounds_that_contradict_each_other_are_refused_as_the_case_is_read(search, key, needle):
    """Each answered "no layout fits" (exit 3) after a search."""
    with pytest.raises(planner.CaseError, match=rf"{re.escape(key)}: .*{re.escape(needle)}"):
        planner.plan(case(search=search))


def test_a_setting_one_engine_runs_is_planned_for_it_where_the_case_names_no_engine(tmp_path):
    """A case naming no engine with search.recompute_modules (Megatron-LM's) or moe_comm_overlap
    was refused as if the user had named 'any': "any recomputes by its own selective policy"."""
    modules = case(model={"preset": "llama3-8b"}, cluster={"num_gpus": 16}, search={"recompute_modules": ["core_attn"]})
    decided = planner.plan(modules).to_dict()
    assert decided["engine"] == "megatron"
    # DeepSpeed has no selective recomputation at all (it checkpoints whole layers): it said it had its own.
    assert "deepspeed has no selective recomputation" in decided["engines"]["deepspeed"]["why_not"]
    assert "recomputes by its own selective policy" in decided["engines"]["torchtitan"]["why_not"]
    with pytest.raises(planner.CaseError, match="search.recompute_modules: any recomputes by its own"):
        planner.plan(modules, engine="any")  # named, plain PyTorch's selective recomputation is its own


def test_the_apis_target_takes_any_as_search_target_does():
    """planner.plan(case, target="any") was refused ("expected one of deepspeed, megatron,
    torchtitan") though search.target takes any: it decides between the engines, as search.target: any
    does; plain PyTorch alone is engine="any" (`plan --engine any`)."""
    job = case(model={"preset": "llama3-8b"}, cluster={"num_gpus": 16})
    decided = planner.plan(job, target="any", top_k=0)
    assert [name for name, _, _ in decided.engines] == ["megatron", "deepspeed", "torchtitan"]
    generic = planner.plan(job, engine="any", top_k=0)
    assert generic.best.job.training.engine.name == "any" and not generic.engines


def test_a_pinned_share_of_the_optimizer_offloaded_is_searched():
    """search.offload_optimizer: 0.5 for Megatron-LM (--optimizer-offload-fraction) was refused as
    meeting no layout: the search offloaded the whole optimizer or none of it."""
    pinned = planner.plan(case(model={"preset": "llama3-8b"}, cluster={"gpu": "h100-sxm-80gb", "num_gpus": 16},
                               training={"global_batch_size": 64, "engine": "megatron"},
                               search={"offload_optimizer": 0.5}), fastest=True)
    assert pinned.best.job.layout.offload_optimizer == 0.5


def test_a_pinned_vpp_that_splits_the_stages_unequally_is_planned_as_estimate_runs_it():
    """80 layers on 5 stages at vpp 3: no even split interleaves, and the pins were refused as
    meeting no layout, though Megatron-LM runs the unequal chunks and estimate fits them."""
    pins = {"tp": 8, "pp": 5, "vpp": 3, "micro_batch_size": 1, "zero_stage": 1}
    job = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 40},
           "training": {"global_batch_size": 80, "seq_len": 8192, "engine": "megatron"}}
    best = planner.plan({**job, "search": pins}, fastest=True).best
    assert (best.job.layout.pp, best.job.layout.vpp) == (5, 3)
    alone = planner.estimate({**job, "layout": {**pins, "sequence_parallel": best.job.layout.sequence_parallel,
                                                "recompute": best.job.layout.recompute}})
    assert best.step_time_s == pytest.approx(alone.step_time_s)


def test_the_best_carries_the_engine_the_plan_picked_so_estimate_gives_the_plans_figures():
    """A case naming no engine: the plan decides between engines, and its best's `training` named no
    engine, so `estimate` of that layout with that training priced plain PyTorch (9.42 s against the
    plan's 7.73 s under Megatron-LM for Llama 3 8B on 8 H100s)."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 8192}}
    result = planner.plan(case)
    best = result.best.to_dict()
    assert best["training"]["engine"] == result.to_dict()["engine"] != "any"
    replay = planner.estimate({**case, "layout": best["layout"],
                               "training": {**case["training"], **best["training"]}}).to_dict()
    assert replay["step_time_s"] == best["step_time_s"]
    assert replay["memory"]["peak_bytes"] == best["memory"]["peak_bytes"]


def test_the_runner_up_line_under_simplest_within_says_the_rule_that_picked():
    """Llama 3 70B on 1,024 H100s with --simplest-within 1: a layout within the margin is simpler than
    the pick (fewer pipeline stages) but fits less surely; the line said the best was "the simplest
    layout within the --simplest-within margin", which it is not. The rule is the robust pick's."""
    from pathlib import Path

    from planner.complexity import layout_complexity
    from planner.search_memory import fit_tier

    example = Path(__file__).resolve().parent.parent / "examples" / "llama3-70b-1024-h100-plan.yaml"
    p = planner.plan(example, simplest_within=1)
    gbs = p.best.job.training.global_batch_size

    def simpler_but_less_sure(alt) -> bool:
        return (alt.step_time_s <= p.best.step_time_s * 1.01 + 1e-9
                and layout_complexity(alt.job.layout, gbs) < layout_complexity(p.best.job.layout, gbs)
                and fit_tier(alt.job, alt.peak.total, p.headroom) > fit_tier(p.best.job, p.best.peak.total, p.headroom))

    assert any(simpler_but_less_sure(alt) for alt in p.alternatives)
    why = p.why_runner_up_lost()
    assert "the simplest layout within" not in why and "the surest to fit" in why and "--simplest-within" in why


def test_an_unknown_engine_is_named_as_the_api_argument_and_as_the_cli_flag(tmp_path):
    """planner.plan(case, engine="bogus") raised CaseError("--engine", ""): the CLI's flag, no key, where
    plan(case, target=5) names (plan, target). The CLI still names --engine."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096}}
    with pytest.raises(planner.CaseError) as error:
        planner.plan(case, engine="bogus")
    assert (error.value.source, error.value.key) == ("plan", "engine")
    assert "expected one of megatron, deepspeed, torchtitan" in error.value.expected
    path = tmp_path / "case.yaml"
    path.write_text(json.dumps(case))
    done = subprocess.run([sys.executable, "-m", "planner", "plan", str(path), "--engine", "bogus"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: --engine: expected one of megatron")


def test_pins_that_leave_nothing_fitting_say_so_where_a_layout_fits_without_them(tmp_path):
    """Pins every layout of which overflows, on GPUs where an unpinned layout fits: the advice names
    the search section's keys (it named the overflowing term alone, and its searches at more GPUs and
    shorter sequences, under the same pins, found nothing: the pins were never said to be the cause)."""
    import yaml

    pins = {"tp": 1, "pp": 1, "zero_stage": 0, "offload_optimizer": 0}
    pinned = case(model={"preset": "llama2-70b"}, training={"engine": "megatron"}, search=pins)
    assert planner.plan({k: v for k, v in pinned.items() if k != "search"}).best is not None
    p = planner.plan(pinned)
    assert p.best is None and p.no_fit.closest_layout is not None
    assert p.to_dict()["no_fit"]["fits_without"] == sorted(pins)
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(pinned))
    out = subprocess.run([sys.executable, "-m", "planner", "plan", str(path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 3, out.stderr
    assert "the search section's offload_optimizer, pp, tp, zero_stage leave none that fits" \
           in " ".join(out.stdout.split())
    # Nothing pinned, nothing said.
    assert planner.plan(case(model={"preset": "llama3.1-405b"}, cluster={"num_gpus": 8})).no_fit.fits_without is None
    # One key is said in the singular: "the search section's tp leaves none that fits".
    one = dataclasses.replace(p.no_fit, fits_without=("tp",)).describe()
    assert "the search section's tp leaves none that fits" in one, one


def test_plan_says_the_days_its_pick_takes_for_a_token_count(tmp_path):
    """`size` gave the days a run of so many tokens takes, `plan` none: with --tokens (read as size reads
    it) it says them for its pick, by size's formula (docs/sizing.md: days = T ÷ tokens/s ÷ 86,400)."""
    from cli_in_process import run_cli

    path = tmp_path / "case.yaml"
    path.write_text(json.dumps(BASE))
    result = planner.plan(path, top_k=0, tokens="2T")
    # The API's NaN is neither above zero nor past the bound: it read "at most 1e+25, got nan".
    with pytest.raises(planner.CaseError, match=r"expected a token count like 15T \(K, M, B, T\), a number, got nan$"):
        planner.plan(path, top_k=0, tokens=float("nan"))
    assert result.tokens == 2e12
    assert result.days == pytest.approx(2e12 / result.best.tokens_per_s / 86400, rel=1e-12)
    printed = json.loads(run_cli("plan", str(path), "--top", "0", "--tokens", "2T", "--json").stdout)
    assert (printed["tokens"], printed["days"]) == (2e12, result.days)
    out = run_cli("plan", str(path), "--top", "0", "--tokens", "2T")
    assert f"2T tokens: {result.days:,.1f} days (80% band " in out.stdout, out.stdout
    assert json.loads(run_cli("plan", str(path), "--top", "0", "--json").stdout)["days"] is None
    for tokens, said in (("2X", "error: --tokens: expected a token count like 15T (K, M, B, T), got '2X'"),
                         ("1K", "error: --tokens: expected at least one global batch of")):
        refused = run_cli("plan", str(path), "--tokens", tokens)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and refused.stderr.startswith(said), \
            refused.stderr


def test_plan_carries_the_tokens_per_s_band_to_the_days_as_size_does(tmp_path):
    """`plan --tokens` gave the days as a point ("2T tokens: 9.8 days at ...") under a tokens/s line
    showing its 80 % band. docs/robust-plans.md: the band is the prediction times the 10th and 90th
    percentiles of measured / predicted over the published runs of its class, as `estimate` gives it
    for the picked layout on these GPUs; a run of T tokens at each end takes T ÷ tokens/s ÷ 86,400 days,
    the slow end at the low tokens/s and listed last, as `size`'s days_band lists it."""
    from cli_in_process import run_cli

    path = tmp_path / "case.yaml"
    path.write_text(json.dumps(BASE))
    result = planner.plan(path, top_k=0, tokens="2T")
    picked = result.best.to_dict()
    low, high = planner.estimate({**BASE, "layout": picked["layout"],
                                  "training": {**BASE["training"], **picked["training"]}}
                                 ).to_dict()["tokens_per_s_band"]
    assert low < result.best.tokens_per_s < high
    days = [2e12 / high / 86400, 2e12 / low / 86400]
    assert list(result.days_band) == pytest.approx(days, rel=1e-12)
    printed = json.loads(run_cli("plan", str(path), "--top", "0", "--tokens", "2T", "--json").stdout)
    assert printed["days_band"] == pytest.approx(days, rel=1e-12)
    out = " ".join(run_cli("plan", str(path), "--top", "0", "--tokens", "2T").stdout.split())
    assert (f"2T tokens: {result.days:,.1f} days (80% band {days[0]:,.1f}–{days[1]:,.1f}) at "
            f"{result.best.tokens_per_s:,.0f} tokens/s") in out, out
    assert json.loads(run_cli("plan", str(path), "--top", "0", "--json").stdout)["days_band"] is None


def test_the_runner_up_on_a_step_of_milliseconds_is_said_by_its_gap_not_rounded_to_zero():
    """On a 10 ms step the runner-up's gap was "0.000 s faster per step (-6.2%)": three decimals of a
    second round a gap of 0.6 ms away. The gap said is the step times' difference, to two figures."""
    import re

    case = {"model": {"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "ffn_hidden_size": 2048,
                      "vocab_size": 32000},
            "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 1024, "engine": "megatron"}}
    for fastest in (False, True):
        p = planner.plan(case, top_k=3, fastest=fastest)
        gap = abs(p.alternatives[0].step_time_s - p.best.step_time_s)
        assert p.best.step_time_s < 0.1 and gap > 1e-4
        said = re.match(r"([0-9.e-]+) s (faster|slower) per step", p.why_runner_up_lost())
        assert said and float(said.group(1)) == pytest.approx(gap, rel=0.05), p.why_runner_up_lost()


@pytest.mark.parametrize("pin, key, expected", [
    # 32 GPUs hold no context-parallel group of 3 (nor tp 4 · cp 5 = 20): the layout section's own refusal.
    ({"cp": 3}, "search.cp", "tp·pp·cp = 1·1·3 = 3 must divide the cluster's 32 GPUs"),
    ({"tp": 4, "cp": 5}, "search.cp", "tp·pp·cp = 4·1·5 = 20 must divide the cluster's 32 GPUs"),
    # 131,076 tokens split into 2·cp = 8 load-balanced chunks leave 16,384.5 a chunk (cost_models.job's rule).
    ({"cp": 4, "seq_len": 131076}, "search.cp", "seq_len 131076 must divide by 2·cp = 8"),
])
def test_a_pinned_context_parallel_degree_no_layout_can_take_is_refused_by_its_key(pin, key, expected):
    """A long-context case pinning search.cp 3 on 32 GPUs was answered "no megatron layout of 32 GPUs
    ... meets the search section's cp, though some layout runs without them", naming neither what cp
    must divide nor why; `estimate` refuses the same cp in `layout` by what it must divide. The pin is
    refused alike, before the search."""
    pin = dict(pin)
    seq_len = pin.pop("seq_len", 131072)
    data = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
            "training": {"global_batch_size": 64, "seq_len": seq_len, "precision": "bf16", "engine": "megatron"},
            "search": pin}
    with pytest.raises(planner.CaseError) as refused:
        planner.plan(data, top_k=0)
    assert refused.value.key == key and expected in refused.value.expected
