"""`plan` against a brute-force oracle over the full layout space, without dominance rules.

`planner.search` keeps its table small with dominance rules (sequence parallelism when
offered, the least recomputation that fits, no larger micro-batch once nothing fits, a
single ZeRO stage with nothing to shard over). The oracle here enumerates every layout
the engine can express — each (tp, cp, pp, dp), vpp, micro-batch, ZeRO stage, both
sequence-parallel settings, every recomputation level and every count of fully recomputed
layers, with and without each offload — scores each with the cost models, and takes the
fastest that fits. `plan` must reach the same step time on generated small cases. What this
checks is the pruning and the solver, not the space: the oracle draws the pipeline splits
from the search's own candidates (``planner.search.partitions``: the even split and the
edge-light ones; every composition of the layers into stages would be combinatorial), and
the divisors, expert-parallel choices and engine rules from the same helpers.

The oracle keeps only the space's stated bounds: tp within one NVLink domain (unless
``search.tp_across_nodes``), the pins and bounds of the case, and, unless the case pins or
bounds cp (``search.cp``, ``min_cp``, ``max_cp``), at least MIN_TOKENS_PER_CP_RANK tokens on each rank of a context-parallel
group (cp > 1; cp = 1 is always in the space).
"""

from __future__ import annotations

import itertools
import os
import random
from dataclasses import dataclass
from typing import Optional

import pytest

import planner
from cost_models.memory import peak_stage_memory
from cost_models.partition import default_partition, virtual_partition
from cost_models.specs import Job, Layout, SpecError
from cost_models.step_time import step_time
from planner.case import load_case
from planner.bands import fit_limit
from planner.estimate import host_fits
from planner.search import MIN_TOKENS_PER_CP_RANK, UNEVEN_VPP, divisors, partitions, selective_bundles

SEED = 1234
# The scheduled run (HYPOTHESIS_PROFILE=thorough, tests/conftest.py) checks 100 generated cases;
# every run checks the first 40 of them (14 with memory binding).
THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
NUM_CASES = 100 if THOROUGH else 40
MIN_MEMORY_BOUND = 10
# The solver compares step times in whole microseconds.
ABS_TOL_S = 2e-6
REL_TOL = 1e-6


@dataclass(frozen=True)
class Scored:
    layout: Layout
    step_time_s: float
    peak_bytes: float


@dataclass(frozen=True)
class OracleResult:
    best: Optional[Scored]  # fastest layout that fits
    fastest: Optional[Scored]  # a valid layout faster than the best that does not fit, else the best
    valid: int  # layouts the cost models accept
    fitting: int


def _structures(case, spec):
    """Every (tp, cp, pp, dp) with tp·cp·pp·dp = GPUs, tp within an NVLink domain (unless the
    case allows otherwise) and cp under the default token bound, as the search states them."""
    n = case.cluster.num_gpus
    for tp in divisors(n):
        if tp > case.cluster.gpu.nvlink_domain and not spec.tp_across_nodes:
            continue
        for cp in divisors(n // tp):
            # The bound is on context-parallel ranks' chunks: cp = 1 (no context parallelism) is
            # always a choice, whatever the sequence length; a search section naming cp (its pin
            # or bounds, all under "cp") lifts it.
            if (cp > 1 and "cp" not in spec.pins and "cp" not in spec.bounds
                    and case.training.seq_len < cp * MIN_TOKENS_PER_CP_RANK):
                continue
            for pp in divisors(n // (tp * cp)):
                yield tp, cp, pp, n // (tp * cp * pp)


def _admits(spec, layout: Layout) -> bool:
    if not spec.pins and not spec.bounds:  # most generated cases: nothing to hold a layout to
        return True
    values = {name: getattr(layout, name) for name in
              ("dp", "tp", "pp", "cp", "vpp", "micro_batch_size", "zero_stage", "sequence_parallel", "recompute",
               "ep")}
    values["etp"] = layout.expert_tp
    values["recompute_num_layers"] = layout.recompute_num_layers
    values["recompute_modules"] = layout.recompute_modules
    for name in ("offload_optimizer", "offload_params", "offload_activations"):
        values[name] = getattr(layout, name)
    for name, value in values.items():
        if name in spec.pins and spec.pins[name] != value:
            return False
        low, high = spec.bounds.get(name, (None, None))
        if (low is not None and value < low) or (high is not None and value > high):
            return False
    return True


# Offload as the search offers it: the whole optimizer, alone or with ZeRO-3's parameters
# (engines that take fractions are searched at all or nothing); activations of any count of
# leading layers, without recomputation.
OFFLOADS = ({"offload_optimizer": 1.0, "offload_params": False}, {"offload_optimizer": 1.0, "offload_params": True})


def _experts(case, spec, tp, cp, dp):
    """(ep, etp) of the space: every ep dividing the experts, etp 1 or tp as the engine runs them
    (within an NVLink domain unless tp_across_nodes); the grid must fold (Job refuses the rest)."""
    model = case.model
    if not model.is_moe:
        return [(1, None)]
    out = []
    for etp in spec.engine.expert_tp_choices(tp):
        if etp > case.cluster.gpu.nvlink_domain and not spec.tp_across_nodes:
            continue
        out += [(ep, etp) for ep in divisors(model.num_experts)]
    return out


def _splits(case, spec, pp):
    """(partition, stage layers, vpp): the search's partitions with every vpp that divides them,
    and, where the layers do not divide by pp, interleaving over the engine's uneven split."""
    model, training = case.model, case.training
    engine = spec.engine
    balances = training.engine.balance_stages and pp > 1
    options = partitions(model.num_layers, pp)
    if balances and None not in options:
        options = [None] + options  # the engine's own split, balanced by compute
    out = []
    for partition in options:
        stage_layers = partition or default_partition(model, training, Layout(pp=pp))
        vpps = [v for v in divisors(min(stage_layers)) if all(n % v == 0 for n in stage_layers)] \
            if engine.interleaving and pp > 1 and min(stage_layers) > 0 else [1]
        out += [(partition, stage_layers, vpp) for vpp in vpps]
    if engine.interleaving and pp > 1 and not balances and model.num_layers % pp:
        out += [(None, virtual_partition(model.num_layers, pp, vpp), vpp) for vpp in UNEVEN_VPP
                if model.num_layers >= pp * vpp]
    return out


def all_layouts(case, spec):
    """The full product space, unpruned; invalid combinations are left to Job to refuse."""
    training = case.training
    engine = spec.engine
    for tp, cp, pp, dp in _structures(case, spec):
        for partition, stage_layers, vpp in _splits(case, spec, pp):
            for ep, etp in _experts(case, spec, tp, cp, dp):
                for mbs in divisors(training.global_batch_size // dp) if training.global_batch_size % dp == 0 \
                        else []:
                    for zero in (0, 1, 2, 3):
                        for sp in ((False,) if tp == 1 else (False, True)):
                            # Selective with every module set the engine offers (None: its own policy).
                            bundles = (spec.pins["recompute_modules"],) if "recompute_modules" in spec.pins \
                                else selective_bundles(case.model, case.training, engine)
                            recomputes = [("none", None, None)] + [("selective", None, m) for m in bundles] \
                                + [("full", None, None)]
                            if engine.partial_recompute:
                                recomputes += [("full", n, None) for n in range(1, max(stage_layers) + 1)]
                            if "recompute_num_layers" in spec.pins:  # whatever value the case pins
                                recomputes.append(("full", spec.pins["recompute_num_layers"], None))
                            for recompute, rnl, modules in recomputes:
                                if not engine.allows(tp, pp, cp, vpp, zero, sp, recompute):
                                    continue
                                base = Layout(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, micro_batch_size=mbs,
                                              zero_stage=zero, sequence_parallel=sp, recompute=recompute,
                                              recompute_num_layers=rnl, recompute_modules=modules,
                                              stage_layers=partition, ep=ep, etp=etp)
                                yield base
                                for offload in OFFLOADS:
                                    if not offload["offload_params"] or zero == 3:
                                        yield base.with_changes(**offload)
                                if recompute == "none":
                                    for n in range(1, max(stage_layers) + 1):
                                        yield base.with_changes(offload_activations=n)


def oracle(case, layouts: Optional[list[Layout]] = None) -> OracleResult:
    """The fastest layout that fits, over ``layouts`` (the case's :func:`all_layouts`, already
    enumerated) or over every layout."""
    spec = case.search
    # the peak is the allocator's: the CUDA context and NCCL's buffers come off the capacity
    limit = fit_limit(case.cluster.gpu.memory_bytes * (1 - spec.headroom) - case.overheads.cuda_context,
                      case.model, case.cluster, case.training)
    best = None
    valid = fitting = 0
    too_big: list[tuple[Layout, Job, float]] = []
    for layout in all_layouts(case, spec) if layouts is None else layouts:
        if not _admits(spec, layout):
            continue
        try:
            job = Job(case.model, case.cluster, case.training, layout, case.overheads)
        except SpecError:
            continue
        if spec.runner.problems(job):  # a rule of the engine's own code
            continue
        valid += 1
        peak = peak_stage_memory(job).total
        if peak <= limit and host_fits(job, spec.headroom):
            fitting += 1
            scored = Scored(layout, step_time(job).total, peak)
            if best is None or scored.step_time_s < best.step_time_s:
                best = scored
        else:
            too_big.append((layout, job, peak))
    # The fastest layout of all, fitting or not, matters only as whether memory binds: the best,
    # unless a layout that does not fit beats it (the first found says so).
    fastest = best
    if best is not None:
        for layout, job, peak in too_big:
            seconds = step_time(job).total
            if seconds < best.step_time_s:
                fastest = Scored(layout, seconds, peak)
                break
    return OracleResult(best, fastest, valid, fitting)


# --- generated cases ----------------------------------------------------------------------

def random_case(rng: random.Random) -> dict:
    heads = rng.choice((4, 8, 16))
    kv_heads = rng.choice(divisors(heads))
    # Half the models in the upper part of the range, so that memory binds in many cases.
    low = rng.choice((256, 1024))
    hidden = rng.choice([h for h in range(low, 2049, 128) if h % heads == 0])
    cluster = {"gpu": rng.choice(("a100-sxm-80gb", "h100-sxm-80gb")),
               # Few GPUs weigh double: with many, sharding leaves memory to spare.
               "num_gpus": rng.choice((1, 1, 2, 2, 3, 4, 4, 6, 8, 12, 16))}
    memory = rng.choice((None, "8 GiB", "8 GiB", "8 GiB", "16 GiB"))  # small GPUs, so that memory binds
    if memory:
        cluster["memory"] = memory
    case = {
        "model": {"name": "oracle", "num_layers": rng.randint(2, 12), "hidden_size": hidden,
                  "num_attention_heads": heads, "num_kv_heads": kv_heads,
                  "vocab_size": rng.randint(1000, 50000), "activation": rng.choice(("gelu", "swiglu"))},
        "cluster": cluster,
        # Larger batches and sequences weigh double: activations are what memory binds on.
        "training": {"global_batch_size": rng.choice((8, 16, 32, 64, 64)),
                     "seq_len": rng.choice((256, 512, 1024, 2048, 2048))},
        "search": {"target": rng.choice(("any", "megatron", "deepspeed", "torchtitan"))},
    }
    return case


def generated_cases() -> list[dict]:
    rng = random.Random(SEED)
    return [random_case(rng) for _ in range(NUM_CASES)]


def _describe(layout: Layout) -> str:
    return ", ".join(f"{k}={v}" for k, v in vars(layout).items())


def check_against_oracle(label: str, case_dict: dict,
                         layouts: Optional[list[Layout]] = None) -> tuple[list[str], Optional[bool]]:
    """Problems with `plan` on one case, and whether memory binds there (None: nothing fits);
    ``layouts``: the case's space, where already enumerated."""
    case = load_case(case_dict)
    spec = case.search
    # the peak is the allocator's: the CUDA context and NCCL's buffers come off the capacity
    limit = fit_limit(case.cluster.gpu.memory_bytes * (1 - spec.headroom) - case.overheads.cuda_context,
                      case.model, case.cluster, case.training)
    expected = oracle(case, layouts)
    bound = None if expected.best is None else expected.fastest.peak_bytes > limit
    try:
        p = planner.plan(case_dict, fastest=True, engine=case.training.engine.name)
    except Exception as error:  # one case's crash should not hide the others' results
        return [f"{label} {case_dict}: plan raised {type(error).__name__}: {error}"], bound
    if expected.best is None:
        if p.best is not None:
            return [(f"{label} {case_dict}: oracle finds no fitting layout, plan chose "
                     f"{_describe(p.best.job.layout)}")], bound
        return [], bound
    if p.best is None:
        return [(f"{label} {case_dict}: plan found nothing; oracle {expected.best.step_time_s:.9f} s with "
                 f"{_describe(expected.best.layout)}")], bound
    problems = []
    if p.best.step_time_s != pytest.approx(expected.best.step_time_s, rel=REL_TOL, abs=ABS_TOL_S):
        problems.append(f"{label} {case_dict}:\n  plan   {p.best.step_time_s:.9f} s  "
                        f"{_describe(p.best.job.layout)}\n  oracle {expected.best.step_time_s:.9f} s  "
                        f"{_describe(expected.best.layout)}")
    if not p.best.peak.total <= limit:
        problems.append(f"{label} {case_dict}: the chosen layout needs {p.best.peak.total:.0f} B of "
                        f"{limit:.0f} B usable")
    best = p.best.to_dict()
    lay = best["layout"]
    if lay["micro_batch_size"] * best["grad_accum"] * lay["dp"] != case.training.global_batch_size:
        problems.append(f"{label} {case_dict}: micro_batch_size {lay['micro_batch_size']} · grad_accum "
                        f"{best['grad_accum']} · dp {lay['dp']} != global batch {case.training.global_batch_size}")
    # `estimate` of the chosen layout returns exactly the plan's figures.
    replay = planner.estimate({**case_dict, "layout": lay}).to_dict()
    if replay != best:
        problems.append(f"{label} {case_dict}: estimate of the chosen layout differs from the plan")
    return problems, bound


@pytest.mark.slow  # tens of thousands of layouts timed one by one
def test_plan_matches_brute_force_oracle_on_generated_cases():
    cases = generated_cases()
    failures: list[str] = []
    memory_bound = 0
    for i, case_dict in enumerate(cases):
        problems, bound = check_against_oracle(f"case {i}", case_dict)
        failures += problems
        memory_bound += bool(bound)
    assert not failures, f"plan differs from the brute-force oracle in {len(failures)} of {len(cases)} cases:\n" \
        + "\n".join(failures)
    # Meaningful only if the memory limit often excludes the unconstrained fastest layout.
    assert memory_bound >= MIN_MEMORY_BOUND, \
        f"only {memory_bound} of {len(cases)} cases have memory binding; the test would not exercise the limit"


# Mixtures of experts: the search adds ep and etp (Megatron's folded expert grid) and, for
# layer counts pp does not divide, interleaving over unequal model chunks.
MOE_SEED = 4321
MOE_CASES = 12
# Every run leaves out the cases whose space passes this many layouts (2 of the 12, which take
# two thirds of the time); the scheduled thorough run checks them all.
QUICK_MOE_SPACE = 50_000


def random_moe_case(rng: random.Random) -> dict:
    case = random_case(rng)
    model = case["model"]
    experts = rng.choice((4, 8, 16))
    model.update(num_layers=rng.randint(3, 9), num_experts=experts, moe_top_k=rng.choice((1, 2)),
                 moe_ffn_hidden_size=rng.choice((256, 512, 768)),
                 moe_first_dense_layers=rng.choice((0, 0, 1)),
                 moe_shared_expert_ffn_hidden_size=rng.choice((0, 0, 512)))
    case["cluster"]["num_gpus"] = rng.choice((2, 4, 8, 8, 16))
    return case


@pytest.mark.slow  # tens of thousands of layouts timed one by one
def test_plan_matches_brute_force_oracle_on_generated_moe_cases():
    rng = random.Random(MOE_SEED)
    cases = [random_moe_case(rng) for _ in range(MOE_CASES)]
    failures: list[str] = []
    with_experts = checked = 0
    for case_dict in cases:
        case = load_case(case_dict)
        # Each space enumerated once, for the quick run's cut (no further than past it) and the oracle both.
        space = None if THOROUGH else list(itertools.islice(all_layouts(case, case.search), QUICK_MOE_SPACE + 1))
        if space is not None and len(space) > QUICK_MOE_SPACE:
            continue
        problems, bound = check_against_oracle(f"moe case {checked}", case_dict, space)
        checked += 1
        failures += problems
        if bound is not None:
            best = planner.plan(case_dict, top_k=0, fastest=True, engine=case.training.engine.name).best
            with_experts += best.job.layout.ep > 1
    assert not failures, f"plan differs from the brute-force oracle in {len(failures)} of {checked} cases:\n" \
        + "\n".join(failures)
    # Meaningful only if expert parallelism is often the answer.
    assert with_experts >= 3, f"only {with_experts} plans use expert parallelism"


# --- hand-made cases --------------------------------------------------------------------
# ZeRO-3 on 16 GPUs (two nodes) with a short sequence: the per-layer weight gathers and the
# gradient reduce-scatter are exposed, and the step-time model lets backward compute hide
# both, so extra backward work (recomputation, or compute left unsharded without sequence
# parallelism) can shorten the step. The dominance rules of `planner.search` must hold there
# too, or `plan` misses the fastest layout. Pins make such a layout the answer.
EXPOSED_ZERO3 = {
    "model": {"name": "exposed-zero3", "num_layers": 4, "hidden_size": 2048, "num_attention_heads": 16,
              "num_kv_heads": 16, "vocab_size": 32000, "activation": "swiglu"},
    "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
    "training": {"global_batch_size": 8, "seq_len": 256},
}


@pytest.mark.parametrize("search, cluster", [
    pytest.param({"target": "any", "pp": 1, "tp": 2, "zero_stage": 3}, {}, id="any-zero3"),
    pytest.param({"target": "torchtitan", "pp": 1, "tp": 2}, {}, id="torchtitan-tp2"),
    pytest.param({"target": "any", "pp": 1, "tp": 2, "zero_stage": 3, "recompute": "full",
                  "micro_batch_size": 1}, {"memory": "4 GiB"}, id="any-zero3-full-recompute"),
    # A sequence shorter than MIN_TOKENS_PER_CP_RANK bounds context parallelism, not cp = 1.
    pytest.param({"target": "any"}, {"num_gpus": 1, "memory": "16 GiB"}, id="short-sequence-one-gpu"),
])
def test_plan_matches_brute_force_oracle_on_hand_made_cases(search, cluster):
    case_dict = {**EXPOSED_ZERO3, "cluster": {**EXPOSED_ZERO3["cluster"], **cluster}, "search": search}
    problems, _ = check_against_oracle("hand-made case", case_dict)
    assert not problems, "\n".join(problems)


# Megatron recomputes by module: on a small MLA mixture of experts at 11.5 GiB the answer is
# selective recomputation of the up-projections, the norms, the dense MLP and the expert part
# (planner.search.selective_bundles), which the oracle must find among every bundle too.
MLA_MOE = {
    "model": {"name": "mla-moe", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 32000,
              "activation": "swiglu", "attention_type": "mla", "q_lora_rank": 256, "kv_lora_rank": 128,
              "qk_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "num_experts": 8, "moe_top_k": 2,
              "moe_ffn_hidden_size": 768, "moe_first_dense_layers": 1, "moe_shared_expert_ffn_hidden_size": 512,
              "ffn_hidden_size": 4096},
    "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 4, "memory": "11.5 GiB"},
    "training": {"global_batch_size": 4, "seq_len": 32768},
    "search": {"target": "megatron", "max_tp": 1, "max_cp": 1},
}


def test_plan_matches_brute_force_oracle_where_the_heaviest_module_set_is_the_answer():
    problems, _ = check_against_oracle("mla-moe case", MLA_MOE)
    assert not problems, "\n".join(problems)
    best = planner.plan(MLA_MOE, top_k=0, fastest=True).best
    assert (best.job.layout.recompute, best.job.layout.recompute_modules) == \
        ("selective", ("mla_up_proj", "layernorm", "mlp", "moe"))


def test_plan_matches_brute_force_oracle_with_the_modules_pinned():
    """A pinned module set (search.recompute_modules) is the only recomputation scored: here one
    that frees too little at pp 1, so the answer pipelines instead."""
    case = {**MLA_MOE, "search": {**MLA_MOE["search"], "recompute_modules": ["mla_up_proj"]}}
    problems, _ = check_against_oracle("mla-moe case, modules pinned", case)
    assert not problems, "\n".join(problems)
    best = planner.plan(case, top_k=0, fastest=True, engine=load_case(case).training.engine.name).best
    assert (best.job.layout.recompute, best.job.layout.recompute_modules) == ("selective", ("mla_up_proj",))
