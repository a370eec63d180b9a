"""The search's shortcuts skip only what could not reach the solver's table: the step bounds lie under
every layout's floor, the floor priced a stage at a time prunes what the whole pipeline would, and
skipping ZeRO stages whose model states overflow the GPU changes no candidate (nor, asked for in
full, the closest miss)."""

from __future__ import annotations

import copy
import random
import dataclasses
import math

import pytest

from cost_models.dp_time import zero3_exposed_floor
from cost_models.memory import peak_stage_memory
from cost_models.pipeline_time import pipeline
from cost_models.partition import default_partition
from cost_models.specs import Job, Layout, SpecError
from cost_models.step_time import step_time
from planner.bands import indistinguishable_gap
from planner.case import load_case
from planner.engines.base import DEGREE_KEYS
from planner.errors import CaseError
from planner.plan import _table, layout_table, robust_choice
from planner.search import _Search, search
from planner.search_bounds import StepBounds, floor, offload_floor, states_cannot_fit, states_fit
from planner.search_memory import fit_limit, fits
from planner.search_recompute import (fewest_recomputed, least_full_recompute, least_recompute, offload_options,
                                     recompute_ladder, selective_bundles)
from planner.search_space import divisors, groups

CASES = {
    "dense": {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
              "training": {"global_batch_size": 128, "seq_len": 4096, "precision": "bf16"},
              "search": {"target": "megatron"}},
    "moe": {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16"},
            "search": {"target": "megatron"}},
    # Twice the GPUs: more expert grids the model prices alike, which the robust search need not score.
    "moe 32": {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
               "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16"},
               "search": {"target": "megatron"}},
    # Each MoE layer's dispatch and combine run beside another micro-batch's compute (megatron-core's
    # overlap of the all-to-all): the bound may count only what no compute can hide of them.
    "moe overlap": {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
                    "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16",
                                 "moe_comm_overlap": True},
                    "search": {"target": "megatron"}},
    # An engine that balances its stages by compute does so without interleaving only: with virtual
    # stages its split is even (cost_models.partition.default_partition), and the bound must count that.
    "balanced, interleaved": {"model": {"preset": "gpt-oss-120b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
                              "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16",
                                           "engine": "any"}},
    # FSDP2 over a mixture of experts (torchtitan): ZeRO-3 over the dense and the expert groups.
    "fsdp experts": {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
                     "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16",
                                  "engine": "torchtitan"}},
    "nothing fits": {"model": {"preset": "llama3.1-405b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8},
                     "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16"},
                     "search": {"target": "megatron"}},
    # Megatron runs context parallelism beside sliding-window layers as an all-to-all over the key-value
    # groups: cp must divide them, a rule of the layout's degrees.
    "sliding window": {"model": {"preset": "gpt-oss-20b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
                       "training": {"global_batch_size": 8, "seq_len": 131072, "precision": "bf16"},
                       "search": {"target": "megatron"}},
    "deepspeed": {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8},
                  "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16", "engine": "deepspeed"}},
}


def loaded(name: str, **training):
    data = copy.deepcopy(CASES[name])
    data["training"].update(training)
    return load_case(data, ignore_layout=True)


def rows(result) -> list[tuple]:
    return [(c.layout, c.step_time_s, c.peak_bytes) for c in result.candidates]


@pytest.mark.parametrize("name", ["dense", "moe", "deepspeed"])
def test_skipping_zero_stages_whose_states_overflow_changes_no_candidate(name):
    # The search that reads the model states first skips the ZeRO stages they overflow, and where they
    # fit only under offload, adds the offload's floor to the bound: it may keep fewer of the layouts
    # slower than the table's slack, but the table (every layout within the slack of the fastest, and
    # the top_k + 1 fastest) is the same.
    case = loaded(name)
    skipped = search(case, case.search, keep_within=0.05)
    full = _Search(case, case.search, False, 0.05, math.inf, skip_unfit=False).run()
    table = [(c.layout, c.step_time_s, c.peak_bytes) for c in _table(skipped.candidates, 0.05, case.search.top_k)]
    assert table == [(c.layout, c.step_time_s, c.peak_bytes)
                     for c in _table(full.candidates, 0.05, case.search.top_k)] and table
    assert set(rows(skipped)) <= set(rows(full))
    assert skipped.scored <= full.scored


def test_where_nothing_fits_the_closest_miss_in_full_is_the_unskipped_searchs():
    case = loaded("nothing fits")
    skipped = search(case, case.search, keep_within=0.05)
    full = _Search(case, case.search, False, 0.05, math.inf, skip_unfit=False).run()
    assert not skipped.candidates and not full.candidates
    assert skipped.rescore is not None and full.tightest is not None
    again = skipped.in_full()
    assert again.tightest.layout == full.tightest.layout
    assert (again.scored, again.pruned) == (full.scored, full.pruned)


@pytest.mark.parametrize("name", ["dense", "moe", "moe overlap", "balanced, interleaved", "deepspeed"])
def test_the_step_bounds_lie_under_every_layouts_floor(name):
    case = loaded(name)
    bounds = StepBounds(case)
    checked = 0
    for group in list(groups(case, case.search))[::3]:
        for mbs, bound in bounds.of(group).items():
            try:
                job = Job(case.model, case.cluster, case.training, group.layout(mbs, group.zeros[0]), case.overheads)
            except SpecError:
                continue
            assert bound <= pipeline(job).least_step(job) * (1 + 1e-12)
            checked += 1
    assert checked > 10


@pytest.mark.parametrize("name", ["deepspeed", "fsdp experts"])
def test_zero3_traffic_lies_under_every_zero3_layouts_step(name):
    """A ZeRO-3 layout's gathers and reduce-scatters, at the least any compute leaves of them
    (``dp_time.zero3_exposed_floor``), added to the group's step bound, stay under its whole step."""
    case = loaded(name)
    bounds = StepBounds(case)
    checked = 0
    for group in list(groups(case, case.search))[::2]:
        if 3 not in group.zeros:
            continue
        for mbs, bound in bounds.of(group).items():
            try:
                job = Job(case.model, case.cluster, case.training, group.layout(mbs, 3), case.overheads)
            except SpecError:
                continue
            traffic = job.num_microbatches * zero3_exposed_floor(job)
            time = step_time(job)
            assert bound + traffic <= time.total * (1 + 1e-12)
            # Under the data-parallel part itself: the floor leaves that part out of a figure that passes
            # its threshold (step_time.step_time_under), and the search adds this traffic to such a figure.
            assert traffic <= time.dp_comm_s * (1 + 1e-12)
            checked += traffic > 0  # nothing to shard over: nothing to gather
    assert checked > 10


@pytest.mark.parametrize("name, training", [("moe", {}), ("moe overlap", {}), ("fsdp experts", {}),
                                            ("moe", {"precision": "fp8", "fp8_recipe": "blockwise"}),
                                            ("balanced, interleaved", {})])
def test_the_cheap_bound_lies_under_each_groups_bounds(name, training):
    """The search queues an MoE group at a bound that leaves ep out (``StepBounds.least``) and bounds
    it in full only when that comes up: it must lie under every bound of the group."""
    case = loaded(name, **training)
    bounds = StepBounds(case)
    checked = 0
    for group in list(groups(case, case.search))[::2]:
        assert bounds.least(group) <= min(bounds.of(group).values()) * (1 + 1e-12)
        checked += 1
    assert checked > 10


def test_where_states_fit_only_under_offload_every_fitting_layout_offloads_and_pays_its_floor():
    """GPT-OSS-120B on 16 A100s: on grids whose model states fit only with the optimizer offloaded
    (``states_fit`` "offload"), no layout without that offload fits (the search scores none), and
    every layout that offloads takes at least ``offload_floor`` of offload in its step."""
    case = loaded("balanced, interleaved")
    spec = case.search
    checked = 0
    for group in list(groups(case, spec))[::7]:
        for zero in group.zeros:
            base = group.layout(group.micro_batches[0], zero)
            if states_fit(case, spec, base) != "offload":
                continue
            hit, _ = least_recompute(case, spec, base, 1, lambda job, peak: None)
            assert hit is None
            least = offload_floor(case, spec, base)
            assert least > 0
            for options in offload_options(spec, zero):
                try:
                    job = Job(case.model, case.cluster, case.training, base.with_changes(**options), case.overheads)
                except SpecError:
                    continue
                assert step_time(job).offload_s >= least * (1 - 1e-12)
                checked += 1
    assert checked > 10


@pytest.mark.parametrize("name", ["dense", "moe", "fsdp experts"])
def test_the_floor_prunes_what_the_whole_pipeline_would(name):
    """Priced one stage at a time, and the step but its data-parallel traffic before that, the floor
    passes a threshold exactly where the whole step does."""
    case = loaded(name)
    checked = 0
    for group in list(groups(case, case.search))[::5]:
        mbs, zero = group.micro_batches[0], group.zeros[0]
        try:
            job = Job(case.model, case.cluster, case.training, group.layout(mbs, zero), case.overheads)
        except SpecError:
            continue
        whole = step_time(job).total
        least = pipeline(job).least_step(job)
        but_dp = whole - step_time(job).dp_comm_s
        for threshold in (least * 0.9, (least + but_dp) / 2, (but_dp + whole) / 2, whole * 1.1):
            figure, time = floor(case, group.layout(mbs, zero), threshold)
            assert (figure > threshold) == (whole > threshold)
            if time is None:  # a figure without the data-parallel traffic, which the search adds to
                assert figure <= whole - step_time(job).dp_comm_s + 1e-12 * whole
            if time is not None:
                assert time.total == whole
        checked += 1
    assert checked > 3


def test_states_that_overflow_leave_no_layout_of_the_zero_stage_that_fits():
    case = loaded("moe")
    overflowing = [(group, zero) for group in list(groups(case, case.search))[::3] for zero in group.zeros
                   if states_cannot_fit(case, case.search, group.layout(group.micro_batches[0], zero))]
    assert overflowing
    fitting = {(c.layout.tp, c.layout.cp, c.layout.pp, c.layout.dp, c.layout.vpp, c.layout.ep, c.layout.etp,
                c.layout.sequence_parallel, c.layout.zero_stage, c.layout.stage_layers)
               for c in search(case, case.search).candidates}
    for group, zero in overflowing:
        assert (group.tp, group.cp, group.pp, group.dp, group.vpp, group.ep, group.etp, group.sequence_parallel, zero,
                group.partition) not in fitting


@pytest.mark.parametrize("name, top_k", [("dense", None), ("moe", None), ("moe 32", None), ("deepspeed", None),
                                         ("moe", 0), ("moe overlap", 0)])
def test_the_robust_search_keeps_the_robust_pick_and_the_fastest(name, top_k):
    # `plan`'s default pick is the simplest of the layouts within the gap the model cannot tell apart
    # from the fastest; its search skips the layouts a simpler, no slower one already rules out, and,
    # once a simpler one must lie within the gap, every layout but the top_k + 1 fastest. The pick,
    # and the top_k + 1 fastest the alternatives come from, must be those of the whole table. With
    # top_k 0 nothing but the fastest is kept for its speed, so the pick rests on these rules alone.
    case = loaded(name)
    if top_k is not None:
        case = dataclasses.replace(case, search=dataclasses.replace(case.search, top_k=top_k))
    margin = indistinguishable_gap()

    def picks(robust: bool):
        # The whole table holds the safer layouts the robust pick draws from too (search's ``safer``).
        result, table = layout_table(case, case.search, margin, robust=margin if robust else None, safer=margin)
        by_time = sorted(table, key=lambda c: c.step_time_s)
        fastest = table.index(by_time[0])
        pick = table[robust_choice(table, fastest, margin, case)]
        runners = [c for c in by_time if not c.safer]  # a safer twin is never a runner-up
        return (pick.layout, [c.layout for c in runners[:case.search.top_k + 1]]), result

    (robust, robust_result), (whole, whole_result) = picks(True), picks(False)
    assert robust == whole
    assert len(robust_result.candidates) <= len(whole_result.candidates)
    if name == "moe 32":  # many near-equal expert grids: the rule must skip some of them (849 of 1,720 scored)
        assert robust_result.scored < whole_result.scored


ENGINES = ("megatron", "deepspeed", "torchtitan", "any", "nanotron")
GENERATED_SEED, GENERATED = 21, 12


def generated_case(rng: random.Random) -> dict:
    """A small case of a preset model on 8 or 16 GPUs, any engine, with or without the all-to-all's overlap."""
    training = {"global_batch_size": rng.choice((16, 32, 64)), "seq_len": rng.choice((2048, 4096)),
                "precision": "bf16", "engine": rng.choice(ENGINES)}
    if rng.random() < 0.3:
        training["moe_comm_overlap"] = True
    return {"model": {"preset": rng.choice(("mixtral-8x7b", "llama3-8b", "qwen3-30b-a3b", "gpt-oss-20b",
                                            "deepseek-v2-lite", "llama2-7b"))},
            "cluster": {"gpu": rng.choice(("h100-sxm-80gb", "b200", "a100-sxm-80gb", "gb200")),
                        "num_gpus": rng.choice((8, 16))},
            "training": training}


def test_the_searchs_skips_leave_the_robust_pick_and_the_fastest_of_generated_cases():
    """Every skip of the search together (bounds, floors, model states, offload, the robust pick's
    rules), on generated cases over the engines: the robust pick, the fastest and the top_k + 1 are
    those of the table of the search that skips nothing on time."""
    rng = random.Random(GENERATED_SEED)
    margin = indistinguishable_gap()
    checked = 0
    while checked < GENERATED:
        try:
            case = load_case(generated_case(rng), ignore_layout=True)
        except CaseError:  # a setting this engine refuses (the all-to-all's overlap beside FSDP)
            continue
        whole = search(case, case.search, safer=margin)  # no threshold: every layout the dominance rules leave
        if not whole.candidates:
            continue

        def picks(table):
            by_time = sorted(table, key=lambda c: c.step_time_s)
            pick = table[robust_choice(table, table.index(by_time[0]), margin, case)]
            runners = [c for c in by_time if not c.safer]  # a safer twin is never a runner-up
            return pick.layout, [(c.layout, c.step_time_s) for c in runners[:case.search.top_k + 1]]

        _, table = layout_table(case, case.search, margin, robust=margin)
        assert picks(table) == picks(_table(whole.candidates, margin, case.search.top_k)), case.source
        checked += 1


@pytest.mark.parametrize("engine", ["megatron", "deepspeed", "torchtitan"])
def test_micro_batches_left_out_for_the_lm_head_overflow_under_full_recomputation_and_offload(engine):
    # Llama 3 8B's 128,256-token vocabulary at 8k tokens on 40 GB GPUs: the logits the loss keeps
    # and their gradients take 4.2 GB and more a sequence on one GPU. The micro-batches the search
    # leaves out for them (past the smallest) overflow the GPU however the rest is laid out:
    # recomputing every layer in full, with the optimizer and the parameters offloaded to the host.
    case = load_case({"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 8},
                      "training": {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16",
                                   "engine": engine}}, ignore_layout=True)
    spec, training = case.search, case.training
    left_out = 0
    for group in groups(case, spec):
        every = [m for m in divisors(training.global_batch_size // group.dp) if m > min(group.micro_batches)
                 and not (group.vpp > 1 and (training.global_batch_size // (m * group.dp)) % group.pp)]
        for mbs in sorted(set(every) - set(group.micro_batches))[:2]:  # the two smallest left out
            for zero in group.zeros:
                least = dataclasses.replace(group.layout(mbs, zero), recompute="full", recompute_num_layers=None)
                for offload in [{}] + offload_options(spec, zero):
                    try:
                        job = Job(case.model, case.cluster, training, least.with_changes(**offload), case.overheads)
                    except SpecError:
                        continue
                    assert peak_stage_memory(job).total > fit_limit(job, spec.headroom)
                    left_out += 1
    assert left_out > 20


@pytest.mark.parametrize("name", ["dense", "moe", "balanced, interleaved", "fsdp experts", "deepspeed"])
def test_full_recomputation_of_every_layer_holds_the_least_of_any_recomputation(name):
    """Recomputing every layer keeps only each layer's input (Korthikanti et al. 2022, §4): no
    lighter rung of the ladder (none, selective by each module set, full of fewer layers) peaks
    lower. The search relies on it: where it does not fit, no rung between is tried."""
    case = loaded(name)
    spec = case.search
    bundles = selective_bundles(case.model, case.training, spec.engine)
    checked = 0
    for group in list(groups(case, spec))[::5]:
        for zero in group.zeros:
            base = group.layout(group.micro_batches[0], zero)
            peaks = {}
            for rung in recompute_ladder(spec, base, bundles):
                layers = max(base.stage_layers or default_partition(case.model, case.training, base))
                counts = [None] + ([1, layers // 2] if rung.recompute == "full" and spec.engine.partial_recompute
                                   else [])
                for count in counts:
                    try:
                        job = Job(case.model, case.cluster, case.training,
                                  rung.with_changes(recompute_num_layers=count), case.overheads)
                    except SpecError:
                        continue
                    peaks[(rung.recompute, rung.recompute_modules, count)] = peak_stage_memory(job).total
            heaviest = peaks.get(("full", None, None))
            if heaviest is None:
                continue
            assert heaviest <= min(peaks.values()) * (1 + 1e-12), (base, peaks)
            checked += 1
    assert checked > 5


def test_where_full_recomputation_does_not_fit_no_lighter_rung_is_tried():
    """Mixtral 8x22B on 8 A100s of 40 GB fits no layout: each was scored at every rung of the ladder
    (none, three selective module sets, full) where the two lightest and the heaviest say it all;
    the closest miss noted is the heaviest's, as before."""
    case = load_case({"model": {"preset": "mixtral-8x22b"}, "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 8},
                      "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16"},
                      "search": {"target": "megatron"}}, ignore_layout=True)
    spec = case.search
    group = next(iter(groups(case, spec)))
    base = group.layout(group.micro_batches[0], group.zeros[0])
    ladder = [r.recompute for r in recompute_ladder(spec, base, selective_bundles(case.model, case.training,
                                                                                  spec.engine))]
    assert ladder == ["none", "selective", "selective", "selective", "full"]
    tried, missed = [], []

    def fit(job, headroom):
        tried.append(job.layout.recompute)
        return fits(job, headroom)

    hit, _ = least_recompute(case, spec, base, 1, lambda job, peak: missed.append(job.layout.recompute), fit)
    assert hit is None and tried == missed == ["none", "selective", "full"]


def test_a_layout_the_engine_refuses_is_not_scored_at_any_recompute_count():
    """GPT-OSS 20B's sliding-window layers run context parallelism as an all-to-all, which splits its 8
    key-value groups over cp: Megatron refuses cp 16 at any recomputation. The bisection over full
    recomputation's layer counts was scored first and refused after (23,381 times for one plan)."""
    case = load_case({"model": {"preset": "gpt-oss-20b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
                      "training": {"global_batch_size": 8, "seq_len": 524288, "precision": "bf16"},
                      "search": {"target": "megatron"}}, ignore_layout=True)
    spec = case.search
    layout = Layout(dp=1, tp=1, pp=1, cp=16, micro_batch_size=1, zero_stage=1, recompute="full")
    job = Job(case.model, case.cluster, case.training, layout, case.overheads)
    assert any(key == "layout.cp" for key, _ in spec.runner.problems(job))
    scored = []
    assert least_full_recompute(case, spec, layout, 1, lambda job, peak: None,
                                fit=lambda job, headroom: scored.append(job) or fits(job, headroom)) is None
    assert scored == []


@pytest.mark.parametrize("name", ["dense", "moe", "moe overlap", "balanced, interleaved", "fsdp experts", "deepspeed",
                                  "sliding window"])
def test_what_an_engine_refuses_of_a_layouts_degrees_it_refuses_at_any_recomputation_and_offload(name):
    """The search skips a ZeRO stage of a group whose degrees the engine refuses (a problem keyed on
    ``DEGREE_KEYS``) before any of its layouts is scored: every engine's rules must refuse such a
    layout at every micro-batch, recomputation and offload alike."""
    case = loaded(name)
    spec = case.search
    bundles = selective_bundles(case.model, case.training, spec.engine)
    refused = 0
    for group in list(groups(case, spec))[::3]:
        for zero in group.zeros:
            for mbs in group.micro_batches:
                base = group.layout(mbs, zero)
                variants = [rung.with_changes(**offload) for rung in recompute_ladder(spec, base, bundles)
                            for offload in offload_options(spec, zero)]
                keys = set()
                for layout in [base] + variants:
                    try:
                        job = Job(case.model, case.cluster, case.training, layout, case.overheads)
                    except SpecError:
                        continue
                    keys.add(frozenset(k for k, _ in spec.runner.problems(job) if k in DEGREE_KEYS))
                assert len(keys) <= 1, (base, keys)
                refused += bool(keys and next(iter(keys)))
    # Where the engine's rules refuse degrees (the all-to-all's overlap, FSDP2's expert grid, DeepSpeed-MoE's
    # ZeRO 3, the sliding window's context parallelism), some layouts were seen refused.
    assert refused > 0 or name in ("dense", "moe", "balanced, interleaved")


def test_a_zero_stage_whose_degrees_the_engine_refuses_is_not_scored(monkeypatch):
    """GPT-OSS 20B at 2^19 tokens on 16 H100s under Megatron: cp 16 splits its 8 key-value groups, which
    Megatron refuses at any recomputation and offload; each such layout was scored rung by rung and
    offload by offload to be refused (Megatron alone at 2^20 tokens on 1,024 H100s: 20 s of 23)."""
    import planner.search as search_module

    case = load_case({"model": {"preset": "gpt-oss-20b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
                      "training": {"global_batch_size": 8, "seq_len": 524288, "precision": "bf16"},
                      "search": {"target": "megatron"}}, ignore_layout=True)
    scored = []
    least = search_module.least_recompute
    monkeypatch.setattr(search_module, "least_recompute",
                        lambda case, spec, base, *args, **kw: scored.append(base) or least(case, spec, base, *args, **kw))
    search(case, case.search, first_only=True)
    assert scored and not [b for b in scored if b.cp == 16 and b.tp == 1]


@pytest.mark.parametrize("name", ["dense", "moe", "balanced, interleaved"])
def test_the_fewest_layers_recomputed_in_full_are_the_fewest_that_fit(name):
    """least_full_recompute's bisection assumes memory falls as more layers are recomputed: its count is
    the fewest of every count it may take (whole steps of vpp) that fits, whatever the memory's limit
    (headrooms from none to most of the GPU put it at each end and between)."""
    case = loaded(name)
    tried = 0
    for group in list(groups(case, case.search))[::5]:
        base = group.layout(group.micro_batches[0], group.zeros[0]).with_changes(recompute="full")
        try:
            stage_max = max(case_job_layers(case, base))
        except SpecError:
            continue
        for headroom in (0.0, 0.3, 0.5, 0.6, 0.7, 0.8):
            spec = dataclasses.replace(case.search, headroom=headroom)
            counts = range(fewest_recomputed(stage_max, 1, base.vpp), stage_max + 1, base.vpp) \
                if spec.engine.partial_recompute else [stage_max]
            fitting = [n for n in counts if fits(_recomputing(case, base, n, stage_max), headroom)[0]]
            hit = least_full_recompute(case, spec, base, 1, lambda job, peak: None)
            if spec.runner.problems(_recomputing(case, base, stage_max, stage_max)):
                continue
            tried += 1
            assert (hit[0].layout.recompute_num_layers or stage_max if hit else None) == \
                (fitting[0] if fitting else None)
    assert tried > 10


def case_job_layers(case, layout: Layout) -> tuple[int, ...]:
    return Job(case.model, case.cluster, case.training, layout, case.overheads).stage_layers


def _recomputing(case, layout: Layout, layers: int, stage_max: int) -> Job:
    return Job(case.model, case.cluster, case.training,
               layout.with_changes(recompute_num_layers=None if layers >= stage_max else layers), case.overheads)


def test_a_groups_layout_at_a_micro_batch_is_the_layout_built_with_every_check():
    """Group.layout builds from the group's degrees, checked once, with the micro-batch and ZeRO stage
    checked alone (Layout.at_micro_batch): the same layout as one built whole, the same refusals."""
    case = loaded("moe")
    for group in list(groups(case, case.search))[::7]:
        for zero in group.zeros:
            for mbs in group.micro_batches:
                whole = Layout(dp=group.dp, tp=group.tp, pp=group.pp, cp=group.cp, vpp=group.vpp,
                               micro_batch_size=mbs, zero_stage=zero, sequence_parallel=group.sequence_parallel,
                               stage_layers=group.partition, ep=group.ep, etp=group.etp)
                built = group.layout(mbs, zero)
                assert built == whole and hash(built) == hash(whole) and vars(built) == vars(whole)
    base = Layout(dp=2, tp=2, sequence_parallel=True)
    for bad in ({"micro_batch_size": 0, "zero_stage": 1}, {"micro_batch_size": True, "zero_stage": 1},
                {"micro_batch_size": 1, "zero_stage": 4}, {"micro_batch_size": 1, "zero_stage": True}):
        with pytest.raises(SpecError) as built:
            base.at_micro_batch(**bad)
        with pytest.raises(SpecError) as whole:
            base.with_changes(**bad)
        assert str(built.value) == str(whole.value)
    offloading = Layout(dp=2, zero_stage=3, offload_params=True)
    with pytest.raises(SpecError, match="offload_params"):
        offloading.at_micro_batch(1, 2)


def test_a_layout_with_its_recomputation_changed_alone_is_the_layout_built_with_every_check():
    """Layout.with_changes of the recomputation fields and offload_activations alone checks those alone:
    the same layout as one built whole, the same refusals, from every kind of valid layout."""
    bases = [Layout(dp=2, tp=2, sequence_parallel=True), Layout(pp=4, vpp=2, chunk_layers=(2, 1, 1, 1, 1, 1, 1, 0)),
             Layout(pp=2, stage_layers=(3, 5), zero_stage=3, offload_params=True, offload_optimizer=0.5),
             Layout(pp=2, account_for_loss_in_pipeline_split=True, recompute="full", recompute_num_layers=2),
             Layout(tp=2, ep=4, etp=1, recompute="selective", recompute_modules=("mlp",), offload_activations=1)]
    changes = [{"recompute": "none", "recompute_num_layers": None, "recompute_modules": None},
               {"recompute": "full", "recompute_num_layers": None, "recompute_modules": None},
               {"recompute": "full", "recompute_num_layers": 3, "recompute_modules": None},
               {"recompute": "selective", "recompute_modules": ("core_attn", "layernorm"), "recompute_num_layers": None},
               {"recompute_num_layers": 1}, {"recompute_modules": ("mlp",)}, {"offload_activations": 2},
               {"recompute": "full", "recompute_num_layers": 0}, {"recompute": "full", "recompute_num_layers": True},
               {"recompute": "partial"}, {"recompute": "selective", "recompute_modules": ()},
               {"recompute": "selective", "recompute_modules": ("mlp", "mlp")},
               {"recompute": "selective", "recompute_modules": ("attention",), "recompute_num_layers": None},
               {"offload_activations": -1}, {"offload_activations": 1.5}, {"recompute": "x", "offload_activations": -1}]
    for base in bases:
        for change in changes:
            try:
                whole = Layout(**{**vars(base), **change})
            except SpecError as refused:
                with pytest.raises(SpecError) as built:
                    base.with_changes(**change)
                assert str(built.value) == str(refused)
                continue
            built = base.with_changes(**change)
            assert built == whole and hash(built) == hash(whole) and vars(built) == vars(whole)


def test_a_job_at_another_recomputation_is_the_job_built_with_every_check():
    """Job.at_activations (search_memory.case_job's jobs at each rung of a layout's recomputation and
    activation offload) checks those fields alone: the same Job as one built whole, the same refusals."""
    for name, precision in (("dense", "bf16"), ("moe", "bf16"), ("dense", "fp8")):
        case = loaded(name, precision=precision)
        for base in (Layout(dp=4, tp=2, pp=2, sequence_parallel=True, zero_stage=1),
                     Layout(dp=2, tp=2, pp=4, vpp=2, micro_batch_size=2, offload_optimizer=1.0, zero_stage=1)):
            sibling = Job(case.model, case.cluster, case.training, base, case.overheads)
            stage_max = max(sibling.stage_layers)
            for change in ({"recompute": "full"}, {"recompute": "full", "recompute_num_layers": 1},
                           {"recompute": "full", "recompute_num_layers": stage_max},
                           {"recompute": "full", "recompute_num_layers": stage_max + 1},
                           {"recompute": "selective"}, {"offload_activations": 1},
                           {"offload_activations": stage_max + 1}, {"recompute": "none", "offload_activations": 0}):
                layout = base.with_changes(**change)
                try:
                    whole = Job(case.model, case.cluster, case.training, layout, case.overheads)
                except SpecError as refused:
                    with pytest.raises(SpecError) as built:
                        sibling.at_activations(layout)
                    assert str(built.value) == str(refused)
                    continue
                built = sibling.at_activations(layout)
                for job in (built, whole):
                    job.stage_layers, job.chunk_layers, job.stage_moe_layers, job.high_precision_layers
                assert built == whole and hash(built) == hash(whole) and vars(built) == vars(whole)
