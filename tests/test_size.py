"""`size` against an independent sweep of `plan` over every cluster size, its arithmetic,
the constraints its solver holds, the cluster-options schema and the command line."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

import pytest
import yaml

import planner
from cli_in_process import run_cli
from cost_models.specs import Layout
from planner.presets import gpu_presets
from planner.search import Candidate, divisors
from planner.size import SECONDS_PER_DAY, engine_variants, load_sizing_case, work_lower_bound
from planner.size_solver import SizeModel, SizeRow, within_deadline
from planner.units import parse_tokens

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "llama3-70b-15t-size.yaml"
SEED = 1515
NUM_CASES = 40
COUNT_KEYS = ("max_gpus", "max_nodes", "gpu_hour_cost", "num_gpus", "nodes")


cli = run_cli  # the real process is tested below: an interrupted sizing


# --- the independent sweep -------------------------------------------------------------

@dataclass(frozen=True)
class Swept:
    """Plan's best layout on one GPU type and cluster size, and what the run takes there."""

    option: int
    gpus: int
    step_time_s: float
    layout: dict
    days: float
    spend: float  # GPU-hours, or cost where every type has a price
    paid: int  # GPUs taken: whole racks where the run uses part of each
    part: bool = False  # on part of each rack (docs/sizing.md)


def one_type_case(case: dict, option: dict, gpus: int) -> dict:
    """The case on ``gpus`` GPUs of one option, as `plan` reads it."""
    cluster = {k: v for k, v in option.items() if k not in COUNT_KEYS}
    return {**case, "cluster": {**cluster, "num_gpus": gpus}}


def option_entries(case: dict) -> list[dict]:
    return case["cluster"]["options"] if "options" in case["cluster"] else [case["cluster"]]


def part_of_rack(per_node: int, rack: int) -> Optional[int]:
    """docs/sizing.md: where a GPU's NVLink domain spans several nodes, `size` also runs on part of
    each rack, the most GPUs of each that are a node times a power of two (64 of an NVL72's 72)."""
    if rack <= per_node:
        return None
    used = max(per_node * 2**k for k in range(12) if per_node * 2**k <= rack)
    return used if used < rack else None


def sweep(case: dict, tokens: float, units: list[int], limits: list[int], prices: list[Optional[float]],
          per_node: Optional[list[int]] = None) -> list[Swept]:
    """Every whole-node (or rack) cluster size of every type within its limit, planned one by one,
    and where a rack spans several nodes, part of each rack (``cluster.nvlink_domain``), paid whole."""
    priced = all(p is not None for p in prices)
    tokens_per_step = case["training"]["global_batch_size"] * case["training"]["seq_len"]
    out = []
    for i, option in enumerate(option_entries(case)):
        used = part_of_rack(per_node[i], units[i]) if per_node else None
        for unit, part in [(units[i], False)] + ([(used, True)] if used else []):
            for racks in range(1, limits[i] // units[i] + 1) if part else range(1, limits[i] // unit + 1):
                gpus = racks * unit
                planned = one_type_case(case, option, gpus)
                if part:
                    planned["cluster"]["nvlink_domain"] = unit
                best = plan_best(json.dumps(planned, sort_keys=True))
                if best is None:
                    continue
                step_time_s, layout = best
                days = tokens / (tokens_per_step / step_time_s) / SECONDS_PER_DAY
                paid = racks * units[i]
                gpu_hours = days * 24 * paid
                out.append(Swept(i, gpus, step_time_s, layout, days, gpu_hours * prices[i] if priced else gpu_hours,
                                 paid, part))
    return out


def engine_of(case: dict) -> Optional[str]:
    """The engine `size` plans a case for: the one it names, else (None) each engine `plan` decides
    between, as `plan` does with no engine named."""
    named = case["training"].get("engine") or (case.get("search") or {}).get("target")
    return None if named in (None, "any") else named


@lru_cache(maxsize=None)  # several tests size one case
def plan_best(case_json: str) -> Optional[tuple[float, dict]]:
    case = json.loads(case_json)  # size picks the fastest layout, for the case's engine
    best = planner.plan(case, fastest=True, engine=engine_of(case)).best
    return None if best is None else (best.step_time_s, best.to_dict()["layout"])


def ranked(swept: list[Swept], objective: str, deadline_days: Optional[float], step_deadline: Optional[float]) \
        -> list[Swept]:
    """The sizes in the order docs/sizing.md states: the objective, then the other measure."""
    if deadline_days is not None:
        swept = [s for s in swept if within_deadline(s.step_time_s, step_deadline)]
    key = (lambda s: (s.days, s.spend)) if objective == "time" else (lambda s: (s.spend, s.days))
    return sorted(swept, key=key)


def random_option(rng: random.Random) -> dict:
    """A GPU type of a preset's figures in nodes of 1, 2 or 4 (so that a few nodes give many
    sizes), or now and then the preset itself (8 per node) or a GB200 NVL72 rack of 72."""
    name = rng.choice(("a100-sxm-80gb", "h100-sxm-80gb", "b200"))
    kind = rng.choice(("small",) * 6 + ("preset", "rack"))
    if kind == "rack":
        option: dict = {"gpu": "gb200", "max_gpus": rng.choice((72, 144))}
    elif kind == "preset":
        option = {"gpu": name, "max_nodes": rng.randint(1, 3)}
    else:
        per_node = rng.choice((1, 2, 4))
        option = {"gpu": {**gpu_presets()[name], "gpus_per_node": per_node, "nvlink_domain": per_node}}
        if rng.random() < 0.5:
            option["max_gpus"] = rng.randint(4, 16)
        else:
            option["max_nodes"] = rng.randint(4 // per_node + 1, 16 // per_node)
    if rng.random() < 0.5:
        option["memory"] = rng.choice(("4 GiB", "8 GiB", "16 GiB"))  # small GPUs: memory binds at small sizes
    if rng.random() < 0.7:
        option["gpu_hour_cost"] = rng.choice((1.0, 2.5, 4.0))
    return option


def random_sizing(rng: random.Random) -> tuple[dict, dict]:
    """A small case with one or two GPU types, and the `size` arguments for it."""
    heads = rng.choice((4, 8, 16))
    hidden = rng.choice([h for h in range(256, 1537, 128) if h % heads == 0])
    options = [random_option(rng) for _ in range(rng.choice((1, 1, 2)))]
    single = len(options) == 1 and rng.random() < 0.5  # one type as a plain cluster section, its count the limit
    cluster = {{"max_gpus": "num_gpus", "max_nodes": "nodes"}.get(k, k): v for k, v in options[0].items()} \
        if single else {"options": options}
    case = {
        "model": {"name": "sized", "num_layers": rng.randint(2, 12), "hidden_size": hidden,
                  "num_attention_heads": heads, "num_kv_heads": rng.choice(divisors(heads)),
                  "vocab_size": rng.randint(1000, 50000), "activation": rng.choice(("gelu", "swiglu"))},
        "cluster": cluster,
        "training": {"global_batch_size": rng.choice((8, 16, 24, 32, 64)), "seq_len": rng.choice((512, 1024, 2048))},
        "search": {"target": rng.choice(("any", "megatron", "deepspeed", "torchtitan"))},
    }
    args: dict = {"tokens": rng.choice((3e9, "20B", "1.5e11"))}
    mode = rng.choice(("deadline", "deadline", "budget", "neither"))
    if mode == "budget" or rng.random() < 0.15:
        args["max_gpus"] = rng.randint(4, 16)
    if mode == "deadline":
        args["deadline_at"] = rng.randrange(1000)  # the days of one swept size, so that it binds
    if rng.random() < 0.3:
        args["gpu_hour_cost"] = 3.0
    return case, args


def generated() -> list[tuple[dict, dict]]:
    rng = random.Random(SEED)
    return [random_sizing(rng) for _ in range(NUM_CASES)]


def check_against_sweep(label: str, case: dict, args: dict) -> list[str]:
    """Problems with `size` against the sweep. ``args`` are size's, but a deadline may be given
    as ``deadline_at``: k, the days of the (k mod sizes)-th fastest size, a hair more."""
    loaded, options = load_sizing_case(case)
    tokens = parse_tokens(args["tokens"])
    budget = {"max_gpus": args.get("max_gpus"),
              "max_nodes": args.get("max_nodes")}
    # A budget given with the call is the budget, above or below the case's; else the case's.
    limits = [budget["max_gpus"] if budget["max_gpus"] is not None else
              budget["max_nodes"] * o.gpu.gpus_per_node if budget["max_nodes"] is not None else o.max_gpus
              for o in options]
    prices = [args.get("gpu_hour_cost", o.gpu_hour_cost) for o in options]
    swept = sweep(case, tokens, [o.unit for o in options], limits, prices, [o.gpu.gpus_per_node for o in options])
    problems = []
    spec = loaded.search
    for s in swept:  # the bound `size` skips sizes with holds on every size
        gpu = options[s.option].gpu
        bound = min(work_lower_bound(c, v, gpu) for c, v in engine_variants(loaded, spec, gpu)) / s.gpus
        if not bound <= s.step_time_s * (1 + 1e-12):
            problems.append(f"{label}: work bound {bound} s above plan's {s.step_time_s} s on {s.gpus} GPUs")
    if "deadline_at" in args:
        days = sorted(s.days for s in swept) or [1000.0]
        args = {**{k: v for k, v in args.items() if k != "deadline_at"},
                "deadline": f"{days[args['deadline_at'] % len(days)] * 24 * 1.0001:.6f}h"}
    result = planner.size(case, **args)
    deadline_s = None if "deadline" not in args else float(args["deadline"][:-1]) * 3600
    budget = "max_gpus" in args or "max_nodes" in args
    objective = "front" if deadline_s is None and not budget else "time" if deadline_s is None else \
        "cost" if all(p is not None for p in prices) else "gpu_hours"
    if objective == "front":
        if result.objective != objective:
            return problems + [f"{label}: objective {result.objective}, expected the front"]
        return problems + check_front(label, result, swept, [o.unit for o in options], limits,
                                      case["training"]["global_batch_size"])
    tokens_per_step = case["training"]["global_batch_size"] * case["training"]["seq_len"]
    step_deadline = None if deadline_s is None else deadline_s * tokens_per_step / tokens
    order = ranked(swept, objective, deadline_s, step_deadline)
    if result.objective != objective:
        problems.append(f"{label}: objective {result.objective}, expected {objective}")
    if not order:
        if result.best is not None:
            problems.append(f"{label}: the sweep finds nothing, size chose {result.best.gpus} GPUs")
        return problems
    if result.best is None:
        return problems + [f"{label}: size found nothing; the sweep {order[0]}"]
    picks = [result.best, *result.alternatives]
    # The sweep's first four of the sizes no other of their GPU type beats on GPUs, days and spend at
    # once (the answer first): the first four and then the beaten dropped left none where the first
    # were larger, slower clusters of the answer's type (the shortest time's).
    def beaten(s) -> bool:
        return any(o is not s and o.option == s.option and o.paid <= s.paid and o.days <= s.days
                   and o.spend <= s.spend and (o.paid < s.paid or o.days < s.days) for o in order)
    expected = (order[:1] + [s for s in order[1:] if not beaten(s)])[:1 + 3]
    if len(picks) != len(expected):
        problems.append(f"{label}: {len(picks)} answers, the sweep has {len(order)} sizes")
    for rank, (pick, want) in enumerate(zip(picks, expected)):
        measure = (pick.days if objective == "time" else (pick.cost if objective == "cost" else pick.gpu_hours))
        target = want.days if objective == "time" else want.spend
        if measure != pytest.approx(target, rel=1e-9):
            problems.append(f"{label} #{rank}: size {pick.gpus} × {pick.option.gpu.name} at {measure}, "
                            f"sweep {want.gpus} × option {want.option} at {target}")
            continue
        # On its size, `size` takes plan's own layout (ties in whole microseconds aside).
        same = next(s for s in swept if (s.option, s.gpus, s.part) == (options_index(result, pick), pick.gpus,
                                                                         pick.option.rack is not None))
        if pick.estimate.to_dict()["layout"] != same.layout:
            problems.append(f"{label} #{rank}: on {pick.gpus} GPUs size chose {pick.estimate.to_dict()['layout']}, "
                            f"plan {same.layout}")
    return problems


def considered(units: int, limit_units: int, unit: int = 8, batch: Optional[int] = None) -> bool:
    """docs/sizing.md: the front considers 1, 2, 3, 4, 6, 8, 12, ... whole units (powers of two
    and 1.5 times them) and the limit itself; and between each two of those, the most units whose
    GPUs the global batch fills (data parallel a divisor of it, times a power of two up to 64)."""
    def on_ladder(u: int) -> bool:
        power = u & -u  # the largest power of two dividing it
        return u in (limit_units, power, 3 * power) and u <= limit_units

    def fills(u: int) -> bool:
        gpus = u * unit
        return any(gpus % 2**j == 0 and batch % (gpus // 2**j) == 0 for j in range(7))

    if on_ladder(units):
        return True
    if batch is None or not fills(units):
        return False
    above = next(u for u in range(units + 1, limit_units + 1) if on_ladder(u)) if units < limit_units else None
    return above is not None and not any(fills(u) for u in range(units + 1, above))


def check_front(label: str, result, swept: list[Swept], units: list[int], limits: list[int], batch: int) -> list[str]:
    """`size` with neither a deadline nor a budget against the sweep: the front over the sizes
    docs/sizing.md says it considers (those within 8× the knee's days), the knee the least days
    × spend on it, and on each size plan's layout."""
    def unit(s: Swept) -> int:  # GPUs a rack (or node) on part of each rack: the part
        return s.gpus * units[s.option] // s.paid

    pool = [s for s in swept if considered(s.gpus // unit(s), limits[s.option] // units[s.option], unit(s), batch)]
    pool = pool or swept  # no considered size fits: every size is considered
    if not pool:
        return [] if result.best is None and result.status != "ok" else [f"{label}: the sweep finds nothing"]
    knee = min(pool, key=lambda s: (s.days * s.spend, s.spend, s.days))
    within = [s for s in pool if s.days <= 8 * knee.days * (1 + 1e-12)]
    front = [s for s in within if not any(o.days <= s.days and o.spend <= s.spend
                                          and (o.days, o.spend) != (s.days, s.spend) for o in within)]
    front.sort(key=lambda s: s.spend)
    got = [(options_index(result, c), c.gpus, c.option.rack is not None) for c in result.front]
    want = [(s.option, s.gpus, s.part) for s in front]
    if got != want:
        return [f"{label}: front {got}, the sweep's {want}"]
    problems = []
    for pick, s in zip(result.front, front):
        if (pick.days, result.spent(pick)) != pytest.approx((s.days, s.spend), rel=1e-9):
            problems.append(f"{label}: {pick.gpus} GPUs at {pick.days} days, {result.spent(pick)}; sweep {s}")
        if pick.estimate.to_dict()["layout"] != s.layout:
            problems.append(f"{label}: on {pick.gpus} GPUs size chose {pick.estimate.to_dict()['layout']}, "
                            f"plan {s.layout}")
    chosen = result.knee
    if chosen is not result.best or (options_index(result, chosen), chosen.gpus, chosen.option.rack is not None) \
            != (knee.option, knee.gpus, knee.part):
        problems.append(f"{label}: knee {result.knee and result.knee.gpus}, the sweep's {knee}")
    return problems


def options_index(result, choice) -> int:
    """The index of a choice's GPU type among the case's options (``cluster.options[i]``, or 0)."""
    key = choice.option.key
    return int(key[len("cluster.options["):-1]) if key.startswith("cluster.options[") else 0


@pytest.mark.slow  # plans generated cases at every cluster size: its module goes first
def test_size_matches_a_sweep_of_plan_over_cluster_sizes_on_generated_cases():
    failures = []
    for i, (case, args) in enumerate(generated()):
        failures += check_against_sweep(f"case {i}", case, args)
    assert not failures, "\n".join(failures)


# Llama 3 8B on up to 32 nodes of H100 or 16 of A100: sizes enough that the ceilings and the
# work bound skip many of them, and the answers depend on it.
MID = {"model": {"preset": "llama3-8b"},
       "cluster": {"options": [{"gpu": "h100-sxm-80gb", "max_gpus": 256, "gpu_hour_cost": 2.5},
                               {"gpu": "a100-sxm-80gb", "max_nodes": 16, "gpu_hour_cost": 1.2}]},
       "training": {"global_batch_size": 64, "seq_len": 4096}, "search": {"target": "megatron"}}


# A small mixture of experts and a small dense model on GB200 NVL72 racks (whole, or on 64 of each
# 72) beside nodes of 2 or 4: global batches of 48, 40, 60 and 18 sequences, which 72 GPUs a rack and
# most node counts do not divide; deadlines, --max-nodes across types of 4 and 8 GPUs a node, a price
# given with the call, a front of 100T tokens.
SMALL_MOE = {"name": "moe-s", "num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 32000,
             "activation": "swiglu", "ffn_hidden_size": 1024, "num_experts": 8, "moe_top_k": 2,
             "moe_load_imbalance": 1.0}
SMALL_DENSE = {"name": "dense-s", "num_layers": 6, "hidden_size": 768, "num_attention_heads": 12, "num_kv_heads": 4,
               "vocab_size": 32000, "activation": "swiglu"}


def small_nodes(name: str, per_node: int, **terms) -> dict:
    return {"gpu": {**gpu_presets()[name], "gpus_per_node": per_node, "nvlink_domain": per_node}, **terms}


@pytest.mark.parametrize("model, options, batch, args", [
    pytest.param(SMALL_MOE, [{"gpu": "gb200", "max_gpus": 216, "gpu_hour_cost": 6.0},
                             small_nodes("h100-sxm-80gb", 4, max_gpus=16, gpu_hour_cost=2.5)], 40,
                 {"tokens": "1T", "max_nodes": 40}, id="moe-racks-max-nodes"),
    pytest.param(SMALL_MOE, [{"gpu": "gb200", "max_gpus": 144, "gpu_hour_cost": 6.0}], 48,
                 {"tokens": "1T", "deadline_at": 2}, id="moe-racks-deadline"),
    pytest.param(SMALL_MOE, [small_nodes("h100-sxm-80gb", 2, max_gpus=12, gpu_hour_cost=2.5),
                             small_nodes("b200", 2, max_gpus=8)], 20,
                 {"tokens": "3e9", "deadline_at": 7, "gpu_hour_cost": 3.0}, id="moe-price-given"),
    pytest.param(SMALL_DENSE, [{"gpu": "gb200", "max_gpus": 144, "gpu_hour_cost": 6},
                               small_nodes("h100-sxm-80gb", 2, max_gpus=16, gpu_hour_cost=2.5)], 60,
                 {"tokens": "20B", "deadline_at": 1}, id="dense-racks-deadline"),
    pytest.param(SMALL_DENSE, [small_nodes("h100-sxm-80gb", 2, max_gpus=14),
                               small_nodes("a100-sxm-80gb", 1, max_gpus=9, gpu_hour_cost=1.0)], 18,
                 {"tokens": "100T"}, id="dense-front-100t"),
])
def test_size_matches_a_sweep_of_plan_on_racks_mixtures_and_uneven_batches(model, options, batch, args):
    case = {"model": model, "cluster": {"options": options}, "training": {"global_batch_size": batch, "seq_len": 1024},
            "search": {"target": "megatron"}}
    problems = check_against_sweep(model["name"], case, args)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("cluster, args", [
    pytest.param(None, {"tokens": "1T", "deadline_at": 0}, id="deadline-fastest"),
    pytest.param(None, {"tokens": "1T", "deadline_at": 12}, id="deadline-middle"),
    pytest.param(None, {"tokens": "1T", "max_gpus": 200}, id="budget"),
    pytest.param(None, {"tokens": "1T"}, id="front"),
    # a batch of 1,000: the front's ladder alone (1, 2, 3, 4, 6, 8, 12, ... nodes) missed 1,000 and
    # 2,000 GPUs, which beat every size it tried on both days and GPU-hours
    pytest.param({"gpu": "h100-sxm-80gb", "nodes": 32}, {"tokens": "1T"}, id="front-batch-1000"),
    pytest.param({"gpu": "h100-sxm-80gb", "nodes": 32}, {"tokens": "1T", "deadline_at": 20}, id="one-type-gpu-hours"),
    pytest.param({"gpu": "h100-sxm-80gb", "nodes": 32}, {"tokens": "1T", "max_nodes": 24}, id="one-type-budget"),
])
def test_size_matches_a_sweep_of_plan_on_a_mid_size_case(request, cluster, args):
    case = MID if cluster is None else {**MID, "cluster": cluster}
    if request.node.callspec.id == "front-batch-1000":
        case = {**case, "training": {**case["training"], "global_batch_size": 1000}}
    problems = check_against_sweep("llama3-8b", case, args)
    assert not problems, "\n".join(problems)


# --- what a run takes ----------------------------------------------------------------------

def test_days_gpu_hours_and_cost_follow_from_tokens_per_second():
    result = planner.size(MID, "1T", deadline="20d")
    gbs, seq = MID["training"]["global_batch_size"], MID["training"]["seq_len"]
    for choice in (result.best, *result.alternatives):
        price = {"h100-sxm-80gb": 2.5, "a100-sxm-80gb": 1.2}[choice.option.gpu.name]
        assert choice.tokens_per_s == pytest.approx(gbs * seq / choice.step_time_s, rel=1e-12)
        assert choice.days == pytest.approx(1e12 / choice.tokens_per_s / 86400, rel=1e-12)
        assert choice.gpu_hours == pytest.approx(choice.days * 24 * choice.gpus, rel=1e-12)
        assert choice.cost == pytest.approx(choice.gpu_hours * price, rel=1e-12)
        assert choice.days <= 20
        ratio = result.best.trade(choice)
        assert ratio["gpus"] == choice.gpus / result.best.gpus
        assert ratio["days"] == pytest.approx(choice.days / result.best.days, rel=1e-12)
    # the objective is cost: each answer costs no less than the one before
    costs = [c.cost for c in (result.best, *result.alternatives)]
    assert costs == sorted(costs)


def test_size_and_plan_agree_on_the_chosen_cluster_of_the_example():
    result = planner.size(EXAMPLE, "15T", deadline="60d")
    best = result.best
    assert best.days <= 60
    data = yaml.safe_load(EXAMPLE.read_text())
    option = next(o for o in data["cluster"]["options"] if o["gpu"] == best.option.gpu.name)
    one = {**data, "cluster": {"gpu": option["gpu"], "num_gpus": best.gpus}}
    planned = planner.plan(one, fastest=True, engine=engine_of(one)).best
    assert planned.to_dict()["layout"] == best.estimate.to_dict()["layout"]
    assert planned.step_time_s == best.step_time_s
    # What estimate says of that layout is what size reports.
    assert planner.estimate({**one, "layout": planned.to_dict()["layout"]}).step_time_s == best.step_time_s


def test_the_tokens_per_s_band_carries_to_days_gpu_hours_and_cost_as_estimate_gives_it(tmp_path):
    """docs/robust-plans.md: a prediction's 80 % band of tokens/s. A run of T tokens at the band's
    ends takes T ÷ tokens/s ÷ 86,400 days at each (the slow end at the low tokens/s), for GPU-hours
    of the GPUs paid for those days and the cost at the type's price; the band is what `estimate`
    gives of that layout on that cluster. A deadline the prediction meets but the slow end misses is
    said to be at risk, and one the slow end meets is not."""
    result = planner.size(MID, "1T", deadline="20d")
    price = {"h100-sxm-80gb": 2.5, "a100-sxm-80gb": 1.2}
    for choice in (result.best, *result.alternatives):
        one = {**MID, "cluster": {"gpu": choice.option.gpu.name, "num_gpus": choice.gpus},
               "layout": choice.estimate.to_dict()["layout"], "training": {**MID["training"], "engine": "megatron"}}
        one.pop("search")
        low, high = planner.estimate(one).to_dict()["tokens_per_s_band"]
        days = (1e12 / high / 86400, 1e12 / low / 86400)
        hours = tuple(d * 24 * choice.gpus for d in days)
        printed = choice.to_dict()
        assert printed["tokens_per_s_band"] == pytest.approx([low, high], rel=1e-12)
        assert printed["days_band"] == pytest.approx(list(days), rel=1e-12)
        assert printed["gpu_hours_band"] == pytest.approx(list(hours), rel=1e-12)
        assert printed["cost_band"] == pytest.approx([h * price[choice.option.gpu.name] for h in hours], rel=1e-12)
        assert days[0] < choice.days < days[1]
    best = result.best
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(MID))
    for hours, at_risk in ((math.ceil(best.days * 24) + 1, True), (math.ceil(best.days_band[1] * 24) + 1, False)):
        assert best.days * 24 < hours < best.days_band[1] * 24 or not at_risk
        done = cli("size", str(path), "--tokens", "1T", "--deadline", f"{hours}h")
        assert done.returncode == 0, done.stderr
        text = " ".join(done.stdout.split())
        assert "80% band " in text
        assert ("deadline at risk: at its band's slow end this run takes" in text) == at_risk, text


# --- the solver's constraints ---------------------------------------------------------------

TWO_TYPES = {"model": {"preset": "gpt-1.7b"},
             "cluster": {"options": [{"gpu": "h100-sxm-80gb", "max_gpus": 16, "memory": "40 GiB"},
                                     {"gpu": "a100-sxm-80gb", "max_gpus": 8}]},
             "training": {"global_batch_size": 32, "seq_len": 2048}}


def solve_all(model: SizeModel) -> list[int]:
    """Every answer in order, each excluding the type and size of those before."""
    out = []
    while (index := model.solve().index) is not None:
        out.append(index)
        model.exclude_size(index)
    return out


def row(option: int, gpus: int, step_s: float, peak_gb: float = 10.0, **layout) -> SizeRow:
    fields = {"dp": gpus, **layout}
    fields["dp"] = gpus // (fields.get("tp", 1) * fields.get("pp", 1) * fields.get("cp", 1))
    return SizeRow(option, gpus, Candidate(Layout(**fields), step_s, peak_gb * 1e9))


def model_for(rows: list[SizeRow], objective: str = "gpu_hours", deadline: Optional[float] = None,
              pins: Optional[dict] = None, limits: tuple[int, int] = (16, 8)) -> SizeModel:
    loaded, options = load_sizing_case(TWO_TYPES)
    spec = loaded.search
    if pins:
        from dataclasses import replace

        spec = replace(spec, pins=pins)
    return SizeModel(rows, options, list(limits), [1.0, 1.0], spec, 32, objective, deadline)


def test_the_solver_holds_the_deadline_and_spends_least():
    rows = [row(0, 8, 10.0), row(0, 16, 5.5), row(1, 8, 6.2)]  # GPU-seconds per step: 80, 88, 49.6
    assert solve_all(model_for(rows)) == [2, 0, 1]
    # 6 s a step: the 10 s row is out, and so is 6.2 s; then only the 16-GPU row meets it.
    assert solve_all(model_for(rows, deadline=6.0)) == [1]
    assert solve_all(model_for(rows, deadline=5.4)) == []
    # A step equal to the deadline's share meets it (the days an answer reports, given back as its
    # deadline, keep that answer); a tenth of a microsecond over does not.
    assert solve_all(model_for([row(0, 16, 5.5000004)], deadline=5.5000004)) == [0]
    assert solve_all(model_for([row(0, 16, 5.5000004)], deadline=5.5000003)) == []


def test_the_solver_holds_each_types_memory_and_limit():
    rows = [row(0, 8, 1.0, peak_gb=39.0), row(0, 16, 0.4, peak_gb=42.0), row(1, 8, 1.2, peak_gb=70.0)]
    # The H100s here have 40 GiB less 3 % headroom (41.7 GB): the 42 GB row is out however fast.
    assert solve_all(model_for(rows, objective="time")) == [0, 2]
    # A limit of 8 H100s leaves out a 16-GPU row, fitting or not.
    rows = [row(0, 8, 1.0), row(0, 16, 0.4), row(1, 8, 1.2)]
    assert solve_all(model_for(rows, objective="time", limits=(8, 8))) == [0, 2]


def test_the_solver_holds_world_size_batch_pins_and_breaks_ties_to_the_simpler_layout():
    rows = [row(0, 8, 1.0, pp=2), row(0, 8, 1.0), row(0, 8, 0.9, tp=2), row(0, 16, 0.5, micro_batch_size=4)]
    # 16 GPUs as dp 16 with micro-batch 4 is 64 sequences a step, not the case's 32: never chosen.
    assert solve_all(model_for(rows, objective="time"))[0] == 2
    assert [r for r in solve_all(model_for(rows, objective="time", pins={"tp": 1}))] == [1]
    # Same size and time: the layout without pipelining first.
    assert solve_all(model_for(rows[:2], objective="time")) == [1]
    # A row whose degrees do not make its GPUs is refused too.
    bad = SizeRow(0, 16, Candidate(Layout(dp=4), 0.1, 1e9))
    assert solve_all(model_for([bad, row(0, 8, 1.0)], objective="time")) == [1]


# --- cluster options, racks and what size says when nothing meets the target ---------------

TINY = {"model": {"name": "tiny", "num_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
                  "vocab_size": 8000},
        "training": {"global_batch_size": 16, "seq_len": 1024}}


def test_nvl72_racks_are_the_unit_of_size():
    case = {**TINY, "cluster": {"gpu": "gb200", "max_gpus": 300},
            "training": {**TINY["training"], "global_batch_size": 144}}
    result = planner.size(case, "1B", max_gpus=300, top_k=10)  # within 300 GPUs, the fastest and the rest
    chosen = [result.best, *result.alternatives]
    # Whole racks of 72, or 64 of each (paid whole): 4 racks within 300 GPUs, each way
    assert {(c.gpus, c.gpus_paid) for c in chosen} <= {(72 * r, 72 * r) for r in range(1, 5)} | \
        {(64 * r, 72 * r) for r in range(1, 5)} and len(chosen) >= 2
    assert all(c.nodes == c.gpus // 4 for c in chosen)
    assert result.sizes == 8
    front = planner.size(case, "1B").front  # with no bound, the front: racks too
    assert {c.gpus_paid for c in front} <= {72, 144, 216, 288} and len(front) >= 2


GB200_70B = {"model": {"preset": "llama3-70b"},
             "cluster": {"options": [{"gpu": "gb200", "max_gpus": 1152, "gpu_hour_cost": 6.0}]},
             "training": {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16", "optimizer": "adamw"},
             "search": {"target": "megatron"}}


def test_size_runs_on_64_gpus_of_each_nvl72_rack_where_that_is_faster_and_pays_for_whole_racks():
    # 16 racks: on all 1,152 GPUs Llama 3 70B's 80 layers and 512 sequences leave a factor of 9
    # (pp 9, uneven stages); on 64 of each rack, as MLPerf Training v5.0's 2,496 GB200s ran (39 racks)
    result = planner.size(GB200_70B, "15T", deadline="100d")
    best = result.best
    assert (best.gpus, best.gpus_paid, best.nodes) == (1024, 1152, 256)
    assert best.gpu_hours == pytest.approx(best.days * 24 * 1152, rel=1e-12)  # the racks are paid whole
    assert best.cost == pytest.approx(best.gpu_hours * 6.0, rel=1e-12)
    whole = planner.plan({**GB200_70B, "cluster": {"gpu": "gb200", "num_gpus": 1152}}, fastest=True).best
    assert best.step_time_s < whole.step_time_s  # faster on fewer GPUs of the same racks
    assert best.to_dict()["gpus_paid"] == 1152 and best.to_dict()["nvlink_domain"] == 64
    # plan on that cluster, told the GPUs of each rack it uses, gives size's layout and time
    part = planner.plan({**GB200_70B, "cluster": {"gpu": "gb200", "num_gpus": 1024, "nvlink_domain": 64}},
                        fastest=True).best
    assert part.step_time_s == pytest.approx(best.step_time_s, rel=1e-12)
    assert part.to_dict()["layout"] == best.estimate.to_dict()["layout"]


def test_the_report_says_how_to_plan_a_run_on_part_of_each_rack(tmp_path):
    path = tmp_path / "gb200.yaml"
    path.write_text(yaml.safe_dump(GB200_70B))
    done = cli("size", str(path), "--tokens", "15T", "--deadline", "100d")
    assert done.returncode == 0, done.stderr
    assert "1,024 × gb200 (16 racks, 64 GPUs of each 72: plan it with cluster.nvlink_domain 64)" in \
        " ".join(done.stdout.split())


@pytest.mark.parametrize("domain, expected", [
    (80, "at most the GPU's NVLink domain of 72, got 80"),
    (6, "expected whole nodes of 4 GPUs"),
    (0, "expected an integer >= 1"),
    (True, "expected an integer, got bool"),
])
def test_a_cluster_nvlink_domain_is_whole_nodes_within_the_gpus(tmp_path, domain, expected):
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump({**GB200_70B, "cluster": {"gpu": "gb200", "num_gpus": 512,
                                                             "nvlink_domain": domain}}))
    done = cli("plan", str(path))
    assert done.returncode == 2 and "cluster.nvlink_domain" in done.stderr and expected in done.stderr, done.stderr


def test_tensor_parallelism_stays_inside_the_nvlink_domain_a_cluster_gives():
    # Two NVLink islands of 4 in an 8-GPU node: tp 8 would cross them, so it is not planned
    case = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
            "training": {"global_batch_size": 64, "seq_len": 4096}, "search": {"target": "megatron", "min_tp": 8}}
    assert planner.plan(case, fastest=True).best.job.layout.tp == 8
    with pytest.raises(planner.CaseError, match="search: no megatron layout .* meets the search section's tp"):
        planner.plan({**case, "cluster": {**case["cluster"], "nvlink_domain": 4}}, fastest=True)


def test_a_missed_deadline_exits_3_and_says_what_would_meet_it(tmp_path):
    case = {**TINY, "cluster": {"gpu": "h100-sxm-80gb", "nodes": 1},
            "training": {**TINY["training"], "global_batch_size": 64}}
    fastest = planner.size(case, "50B", max_gpus=8).best
    deadline_days = fastest.days / 2
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case))
    done = cli("size", str(path), "--tokens", "50B", "--deadline", f"{deadline_days * 24:.6f}h", "--json")
    assert done.returncode == 3, done.stderr
    printed = json.loads(done.stdout)
    assert printed["gpus"] is None and printed["alternatives"] == []
    no_fit = printed["no_fit"]
    assert no_fit["fastest"]["gpus"] == 8 and no_fit["fastest"]["days"] == pytest.approx(fastest.days)
    would = no_fit["would_meet"]
    assert would["gpus"] > 8 and would["gpus"] % 8 == 0 and would["days"] <= deadline_days
    assert f"{would['gpus']:,} h100-sxm-80gb GPUs would take" in no_fit["reason"]
    # What would meet it is what `size` answers when the limit allows it.
    allowed = planner.size({**case, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": would["gpus"]}}, "50B",
                           deadline=f"{deadline_days * 24:.6f}h")
    assert allowed.best.days <= deadline_days and allowed.best.gpus <= would["gpus"]


def test_nothing_that_fits_exits_3_with_plans_advice():
    case = {**TINY, "cluster": {"gpu": "h100-sxm-80gb", "nodes": 1, "memory": "64 MiB"},
            "overheads": {"cuda_context": "1 MiB"}}  # a context past the memory is the case's error
    result = planner.size(case, "1B")
    assert result.best is None and result.status == "nothing fits" and result.solver_status == "INFEASIBLE"
    assert result.no_fit.startswith("no layout fits: ")
    assert result.no_fit.endswith("(the largest cluster within the limits: 8 h100-sxm-80gb GPUs)")
    assert result.fastest is None and result.would_meet is None
    result = planner.size({**TINY, "cluster": {"gpu": "gb200", "max_gpus": 4}}, "1B")
    assert result.best is None and "no whole node or rack" in result.no_fit


@pytest.mark.parametrize("cluster, key, expected", [
    ({"options": [{"gpu": "h100", "max_gpus": 8, "num_gpus": 8}]}, "cluster.options[0].num_gpus", "unknown key"),
    ({"options": [{"gpu": "h100", "max_gpus": 8}, {"gpu": "b2000", "max_gpus": 8}]}, "cluster.options[1].gpu",
     "unknown GPU preset"),
    ({"options": [{"gpu": "h100", "max_gpus": 8, "max_nodes": 1}]}, "cluster.options[0].max_nodes",
     "give either max_gpus or max_nodes"),
    ({"options": [{"gpu": "h100", "max_gpus": 8, "gpu_hour_cost": "2.5$"}]}, "cluster.options[0].gpu_hour_cost",
     "expected a price per GPU-hour"),
    ({"options": [{"gpu": "h100", "max_gpus": 8, "gpu_hour_cost": 0}]}, "cluster.options[0].gpu_hour_cost",
     "from 1e-06 to 1e+06"),
    ({"options": [{"gpu": "h100", "max_gpus": 2 ** 21}]}, "cluster.options[0].max_gpus", "at most"),
    ({"options": []}, "cluster.options", "expected a list of GPU types, at least one, got an empty list"),
    ({"options": [{"gpu": "h100", "max_gpus": 8}], "gpu": "b200"}, "cluster.gpu", "inside its cluster.options"),
    ({"gpu": "h100"}, "cluster.num_gpus", "size needs the most GPUs"),
    ({"options": [{"gpu": "h100"}]}, "cluster.options[0].max_gpus", "size needs the most GPUs"),
])
def test_bad_cluster_sections_name_the_key(cluster, key, expected):
    with pytest.raises(planner.CaseError) as error:
        planner.size({**TINY, "cluster": cluster}, "1T")
    assert f"<case>: {key}: " in str(error.value) and expected in str(error.value)


def test_plan_and_estimate_need_one_gpu_type_and_ignore_sizing_keys():
    with pytest.raises(planner.CaseError, match=r"cluster\.options: lists GPU types for `size`"):
        planner.plan({**TINY, "cluster": {"options": [{"gpu": "h100", "max_gpus": 8}]}})
    with pytest.raises(planner.CaseError, match=r"cluster\.gpu_hour_cost: expected a price"):
        planner.plan({**TINY, "cluster": {"gpu": "h100", "num_gpus": 8, "gpu_hour_cost": -2}})
    priced = planner.plan({**TINY, "cluster": {"gpu": "h100", "num_gpus": 8, "gpu_hour_cost": 2, "max_gpus": 64}})
    plain = planner.plan({**TINY, "cluster": {"gpu": "h100", "num_gpus": 8}})
    # the same plan; the sizing keys it does not read are said (plan's notes)
    assert {**priced.to_dict(), "notes": []} == plain.to_dict()
    assert [note.split(": ", 1)[1] for note in priced.notes] == [
        "plan runs on cluster.num_gpus (or nodes) and does not read cluster.max_gpus, cluster.gpu_hour_cost: `size` does"]
    # --max-gpus stands in for a count the case lacks; the case's own count is size's limit.
    assert planner.size({**TINY, "cluster": {"gpu": "h100"}}, "1B", max_nodes=2).best.gpus <= 16


@pytest.mark.parametrize("args, key, expected", [
    ({"tokens": "15X"}, "tokens", "expected a token count like 15T"),
    ({"tokens": 0}, "tokens", "above zero"),
    ({"tokens": "1e30"}, "tokens", "at most 1e+25"),
    ({"tokens": "1T", "deadline": 60}, "deadline", "expected a duration like 60d or 36h"),
    ({"tokens": "1T", "deadline": "-3d"}, "deadline", "expected a duration"),
    ({"tokens": "1T", "max_gpus": 0}, "max_gpus", "from 1 to"),
    ({"tokens": "1T", "max_gpus": 8, "max_nodes": 1}, "max_nodes", "not both"),
    ({"tokens": "1T", "gpu_hour_cost": float("nan")}, "gpu_hour_cost", "from 1e-06 to 1e+06"),
    ({"tokens": "1T", "top_k": 101}, "top_k", "from 0 to 100"),
])
def test_bad_size_options_name_the_option(args, key, expected):
    with pytest.raises(planner.CaseError) as error:
        planner.size({**TINY, "cluster": {"gpu": "h100", "num_gpus": 8}}, **args)
    assert str(error.value).startswith(f"size: {key}: ") and expected in str(error.value)


def test_the_command_prints_the_api_json_and_one_line_errors(tmp_path):
    path = tmp_path / "case.yaml"
    case = {**TINY, "cluster": {"options": [{"gpu": "h100", "max_nodes": 4, "gpu_hour_cost": 3},
                                            {"gpu": "a100-80gb", "max_nodes": 4, "gpu_hour_cost": 1.5}]}}
    path.write_text(yaml.safe_dump(case))
    done = cli("size", str(path), "--tokens", "30B", "--deadline", "36h", "--json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert {"gpu", "gpus", "layout", "tokens_per_s", "days", "gpu_hours", "cost", "alternatives"} <= set(printed)
    assert printed == json.loads(json.dumps(planner.size(path, "30B", deadline="36h").to_dict()))
    assert printed["days"] <= 1.5 and printed["objective"] == "cost"
    for alt in printed["alternatives"]:
        assert alt["cost"] >= printed["cost"] and set(alt["trade"]) == {"gpus", "days", "gpu_hours", "cost"}
    text = cli("size", str(path), "--tokens", "30B", "--deadline", "36h")
    assert text.returncode == 0 and f"{printed['gpus']} × {printed['gpu']}" in text.stdout
    for args, option in ((["--tokens", "lots"], "--tokens"), (["--tokens", "1T", "--max-gpus", "8", "--max-nodes", "1"],
                                                              "--max-nodes")):
        done = cli("size", str(path), *args)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: {option}: "), done.stderr
    done = cli("plan", str(path))
    assert done.returncode == 2 and done.stderr.startswith(f"error: {path}: cluster.options: ")


def test_an_interrupted_sizing_exits_130_on_ctrl_c():
    import os
    import signal
    import time

    process = subprocess.Popen([sys.executable, "-m", "planner", "size", str(EXAMPLE), "--tokens", "15T",
                                "--deadline", "60d"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=REPO)
    deadline = time.monotonic() + 60
    while True:  # until main() has installed its handlers: SIGTERM's (Python itself catches SIGINT from the start)
        status = Path(f"/proc/{process.pid}/status").read_text()
        caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
        if caught & (1 << (signal.SIGTERM - 1)):
            break
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.5)  # inside the sizing: imports, searches, solves
    os.kill(process.pid, signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130 and stderr.strip() == "error: interrupted" and stdout == ""


def test_a_budget_given_with_the_call_is_the_budget_above_the_cases_gpus():
    """A case for `plan` names 8 GPUs; `size --max-gpus 64` may use 64 (the flag raises the limit
    as well as lowering it), in the CLI and in the API."""
    case = {**TINY, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {**TINY["training"], "global_batch_size": 64}}
    assert planner.size(case, "50B").best.gpus <= 8
    assert planner.size(case, "50B", max_gpus=64).best.gpus > 8


def test_with_no_engine_named_size_sizes_for_the_engine_plan_chooses():
    """With no engine named `plan` decides between the engines; `size` planned plain PyTorch alone,
    and said no layout fit 8 H100s where `plan` found torchtitan's (a 128-sequence micro-batch)."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 128, "seq_len": 4096}, "search": {"min_micro_batch_size": 128}}
    planned = planner.plan(case, fastest=True).best
    sized = planner.size(case, "1T", max_gpus=8).best
    assert planned is not None and sized is not None
    assert sized.engine == planned.job.training.engine.name == "torchtitan"
    assert sized.estimate.to_dict()["layout"] == planned.to_dict()["layout"]
    assert sized.step_time_s == pytest.approx(planned.step_time_s, rel=1e-9)
    assert sized.to_dict()["engine"] == "torchtitan"


def test_a_limit_of_a_thousand_gpus_still_finds_the_cluster_that_would_meet_the_deadline():
    """Doubling 1,000 GPUs gave 2,000, 4,000 ... 64,000: sizes over which no layout splits a batch
    of 512 (a factor of 125 no degree divides), so size said no cluster up to 64 times the limit
    would meet the deadline, where 4,096 GPUs meet it in 55 days."""
    case = {"model": {"preset": "llama3-70b"}, "cluster": {"options": [{"gpu": "h100-sxm-80gb", "max_gpus": 1000}]},
            "training": {"global_batch_size": 512, "seq_len": 8192, "engine": "megatron"}}
    result = planner.size(case, "15T", deadline="60d")
    assert result.best is None and result.would_meet is not None
    assert result.would_meet.gpus % 1000 and result.would_meet.days <= 60


def test_a_price_for_some_gpu_types_only_is_said_to_go_unused():
    """The H100's price had no effect (GPU-hours weighed, cost shown as '-') and nothing said so."""
    case = {"model": {"preset": "llama3-8b"}, "training": {"global_batch_size": 64, "seq_len": 4096},
            "cluster": {"options": [{"gpu": "h100-sxm-80gb", "max_gpus": 64, "gpu_hour_cost": 2.5},
                                    {"gpu": "b200", "max_gpus": 64}]}}
    result = planner.size(case, "100B", deadline="30d")
    assert result.spend == "gpu_hours"
    assert result.notes == ("cluster.options[0].gpu_hour_cost given, none for cluster.options[1]: with a price for "
                            "some GPU types only, size weighs GPU-hours, not cost; give each type a price (or "
                            "--gpu-hour-cost)",)
    assert planner.size(case, "100B", deadline="30d", gpu_hour_cost=3.0).notes == ()


def test_the_cheapest_cluster_of_another_gpu_type_that_meets_the_deadline_is_an_alternative():
    """4,096 H100s meet 60 days for 13.5M, cheaper than the listed 4,096 B200s, and were dropped as
    'beaten' by 2,048 B200s: GPUs of two types are no one count, and a team may have only H100s."""
    result = planner.size(EXAMPLE, "15T", deadline="60d", top_k=5)
    h100 = [c for c in result.alternatives if c.option.gpu.name == "h100-sxm-80gb"]
    assert h100 and h100[0].days <= 60
    assert h100[0].cost <= min(c.cost for c in result.alternatives if c.option.gpu.name == "b200")


def test_small_figures_are_printed_not_rounded_away():
    """`--tokens 0.5` was refused as "got 0"; a billion tokens at a GPU-hour price of 0.0001 printed
    every day and cost as 0.0 and 0, and "no size spends less than 0 in cost" (the JSON had 0.014)."""
    from cli_in_process import run_cli

    example = str(Path(__file__).resolve().parent.parent / "examples" / "llama3-70b-15t-size.yaml")
    done = run_cli("size", example, "--tokens", "0.5", "--deadline", "60d")
    assert done.returncode == 2 and done.stderr.rstrip().endswith("got 0.5"), done.stderr
    done = run_cli("size", example, "--tokens", "1B", "--gpu-hour-cost", "0.0001", "--json")
    data = json.loads(done.stdout)
    knee = data["front"][data["knee"]]
    assert 0 < knee["cost"] < 0.05 and 0 < knee["days"] < 0.05
    text = run_cli("size", example, "--tokens", "1B", "--gpu-hour-cost", "0.0001").stdout
    line = " ".join(text.split())
    assert f"{knee['days']:.2g} days" in line and f"cost {knee['cost']:.2g}" in line
    assert "spends less than 0 " not in line and " 0.0 " not in line


@pytest.mark.parametrize("index", [0, 1])
def test_a_gpu_type_that_leaves_no_memory_is_named_where_the_case_gives_it(tmp_path, index):
    """A `size` option's memory too small for the CUDA context was refused as cluster.memory (the first)
    or not checked before the sweep (the others)."""
    from cli_in_process import run_cli

    options = [{"gpu": "h100-sxm-80gb", "max_gpus": 64}, {"gpu": "b200", "max_gpus": 64}]
    options[index]["memory"] = "1 GB"
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump({"model": {"preset": "llama3-8b"}, "cluster": {"options": options},
                                    "training": {"global_batch_size": 64, "seq_len": 4096}}))
    done = run_cli("size", str(path), "--tokens", "1T")
    assert done.returncode == 2 and f": cluster.options[{index}].memory: leaves the allocator no memory" in done.stderr


def test_a_progress_that_cannot_be_called_is_refused_by_name():
    # It raised a bare TypeError ('int' object is not callable) at the first cluster size searched.
    with pytest.raises(planner.CaseError, match=r"^size: progress: expected a function"):
        planner.size(TINY, "1T", max_gpus=8, progress=3)


def test_what_would_meet_the_deadline_spends_no_more_than_a_size_it_tried():
    """Past the limits, the advice was the fewest GPUs of each type that meet the deadline, the
    cheapest of those, where 8,192 B200s (a size the search tried) meet it for less (at a 30.3-day
    deadline 17.5M, against 23.2M for the fewest B200s that meet it, 7,168). The deadline's answer
    spends least; so does its advice."""
    case = {"model": {"preset": "llama3-70b"},
            "cluster": {"options": [{"gpu": "h100-sxm-80gb", "max_gpus": 8192, "gpu_hour_cost": 2.5},
                                    {"gpu": "b200", "max_gpus": 4096, "gpu_hour_cost": 4.5}]},
            "training": {"global_batch_size": 512, "seq_len": 8192}, "search": {"target": "megatron"}}
    result = planner.size(case, "15T", deadline="600h")  # the limits' fastest, 4,096 B200s, take 728 h
    assert result.status == "deadline not met"
    would = result.would_meet
    b200 = planner.plan({**case, "cluster": {"gpu": "b200", "num_gpus": 8192}}, fastest=True).best
    days = 15e12 / b200.tokens_per_s / 86400
    assert days * 24 <= 600  # 8,192 B200s meet the deadline
    assert would.cost <= days * 24 * 8192 * 4.5 * (1 + 1e-9)


def test_progress_none_is_no_progress_as_documented():
    """docs/commands.md gives size(..., progress=None); it was refused as not a function."""
    assert planner.size(MID, "1T", max_gpus=64, progress=None).best is not None


def test_past_the_limits_the_sizes_tried_hold_the_pinned_degrees():
    """pp 7 pinned: the search past the limits tried powers of two of nodes, none a multiple of 7,
    and said no cluster up to 64 times the limits would meet 30 days, where 14,336 B200s (1,792
    nodes) meet it in 22.5."""
    case = {"model": {"preset": "llama3-70b"},
            "cluster": {"options": [{"gpu": "h100-sxm-80gb", "max_gpus": 2048, "gpu_hour_cost": 2.5},
                                    {"gpu": "b200", "max_gpus": 1024, "gpu_hour_cost": 4.5}]},
            "training": {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16", "optimizer": "adamw"},
            "search": {"target": "megatron", "pp": 7}}
    result = planner.size(case, "15T", deadline="30d")
    assert result.best is None and result.would_meet is not None
    assert result.would_meet.gpus % 7 == 0 and result.would_meet.days <= 30


def test_an_unknown_precision_is_the_trainings_key_not_the_clusters():
    """It was "cluster: h100-sxm-80gb cannot train in banana … drop the type", where plan and
    estimate name training.precision and its choices."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "banana"}}
    with pytest.raises(planner.CaseError) as refused:
        planner.size(case, 1e12)
    assert refused.value.key == "training.precision" and "expected one of" in refused.value.expected


@pytest.mark.parametrize("engine", ["megatron", "deepspeed", "torchtitan"])
def test_the_batch_script_says_how_to_place_nodes_in_racks(tmp_path, engine):
    # Priced with 16 trays of each NVL72 rack filled before the next: Slurm's block topology does so
    # in segments of 16 nodes; on one node's NVLink (H100) there is nothing to place
    case = {**GB200_70B, "cluster": {"gpu": "gb200", "num_gpus": 1024, "nvlink_domain": 64},
            "search": {"target": engine}}
    planner.emit(planner.plan(case), engine, tmp_path / "gb200")
    assert "sbatch --segment=16 sbatch.sh" in (tmp_path / "gb200" / "sbatch.sh").read_text()
    h100 = {**case, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 1024}}
    planner.emit(planner.plan(h100), engine, tmp_path / "h100")
    assert "--segment" not in (tmp_path / "h100" / "sbatch.sh").read_text()


GB200_RACKS = {"model": {"preset": "llama3-70b"},
               "cluster": {"options": [{"gpu": "gb200", "max_gpus": 1152, "gpu_hour_cost": 6.0}]},
               "training": {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16", "optimizer": "adamw"},
               "search": {"target": "megatron"}}


@pytest.mark.parametrize("limits", [{"deadline": "170d"}, {"max_gpus": 1000}])
def test_the_runners_up_on_racks_fill_the_list_with_undominated_sizes(limits):
    """Llama 3 70B on GB200 racks: whole and partial racks are sized apart and then merged, and the sizes
    one beat of the other were dropped after the count was fixed: two runners-up where three were asked
    for and `plan` at every rack count finds more (640 GPUs on 10 racks within 170 days; 512 on 8, the
    cheapest, within 1,000 GPUs)."""
    sized = planner.size(GB200_RACKS, "15T", **limits)
    picks = [sized.best, *sized.alternatives]
    assert len(sized.alternatives) == 3
    for p in picks:  # none beaten by another on GPUs paid, days and cost at once
        assert not any(q is not p and q.gpus_paid <= p.gpus_paid and q.days <= p.days and q.cost <= p.cost
                       for q in picks)
    assert (640 if "deadline" in limits else 512) in [p.gpus for p in picks]


def test_the_next_best_tables_caption_names_the_cost_only_where_there_is_one(tmp_path):
    """Without a price the cost column is "-" in every row, and the caption still explained it as
    GPU-hours × gpu_hour_cost."""
    unpriced = {**MID, "cluster": {"options": [{k: v for k, v in option.items() if k != "gpu_hour_cost"}
                                               for option in MID["cluster"]["options"]]}}
    for case, said in ((unpriced, False), (MID, True)):
        path = tmp_path / "case.yaml"
        path.write_text(yaml.safe_dump(case))
        done = cli("size", str(path), "--tokens", "1T", "--deadline", "60d")
        assert done.returncode == 0 and "Next best" in done.stdout, done.stderr
        assert ("gpu_hour_cost, in its currency" in " ".join(done.stdout.split())) == said


def test_over_budget_with_a_deadline_none_past_the_limits_meets_says_the_gpus_that_fit_once():
    """405B within 8 H100s by 60 days: "…; 24 GPUs would fit (the largest cluster within the limits: 8
    …); past the limits, 24 h100-sxm-80gb GPUs would fit, but none … would meet the deadline": the
    GPUs that fit said twice, the first time without their type."""
    result = planner.size("examples/llama3.1-405b-16384-h100-plan.yaml", "15.6T", deadline="60d", max_gpus=8)
    assert result.status == "over budget"
    reason = result.no_fit
    assert reason.count("would fit") == 1 and "past the limits, 24 h100-sxm-80gb GPUs would fit, but none" in reason


def test_a_limit_of_part_of_a_node_is_said_where_size_leaves_those_gpus_unused():
    # 12 H100s at 8 a node: size considers whole nodes, so 4 GPUs the case gives go unused
    case = {**TINY, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 12}}
    result = planner.size(case, "1B")
    assert max(c.gpus for c in result.front) == 8
    assert any("cluster.num_gpus gives 12" in n and "up to 8" in n for n in result.notes)
    # a budget given with the call is the budget, and its name is the one said
    assert any(n.startswith("--max-gpus gives 20") and "up to 16" in n
               for n in planner.size(case, "1B", max_gpus=20).notes)
    assert not any("whole nodes" in n for n in planner.size(case, "1B", max_gpus=16).notes)


def test_the_part_node_note_names_the_key_the_limit_was_written_by():
    # 20 GB200 nodes of 4 are 80 GPUs, past one NVL72 rack of 72: the note names what the case wrote
    racks = {**TINY, "training": {**TINY["training"], "global_batch_size": 144}}
    nodes = planner.size({**racks, "cluster": {"gpu": "gb200", "nodes": 20}}, "1B").notes
    assert any(n.startswith("cluster.nodes gives 80 gb200 GPUs") and "up to 72" in n for n in nodes), nodes
    options = {**racks, "cluster": {"options": [{"gpu": "gb200", "max_nodes": 20}]}}
    assert any(n.startswith("cluster.options[0].max_nodes gives 80") for n in planner.size(options, "1B").notes)
    assert any(n.startswith("--max-nodes gives 80")
               for n in planner.size(options, "1B", max_nodes=20).notes)


def test_top_0_does_not_say_that_no_other_size_meets_the_deadline(tmp_path):
    """`size … --deadline 60d --top 0` (no runners-up asked for) printed "No other size within the
    limits meets 60 days." on a case where 4,096, 8,192 and 16,384 H100s all meet it: the sentence
    is for a deadline that only the answer meets, not for alternatives left unlisted."""
    case = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "max_gpus": 16384},
            "training": {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16", "optimizer": "adamw"},
            "search": {"target": "megatron"}}
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case))
    listed = run_cli("size", str(path), "--tokens", "15T", "--deadline", "60d")
    assert listed.returncode == 0 and "Next best" in listed.stdout
    none = run_cli("size", str(path), "--tokens", "15T", "--deadline", "60d", "--top", "0")
    assert none.returncode == 0 and "Next best" not in none.stdout
    assert "No other size" not in none.stdout, none.stdout


def test_the_work_bound_holds_for_a_case_that_names_its_context_parallelism():
    """A search section bounding cp (min_cp = max_cp = 8 on 4,096 tokens) lifts plan's floor of 1,024
    tokens a rank, so plan runs cp 8; the work bound size stops its walk on still skipped cp 8 by the
    floor (a test of "max_cp" where the bounds are held under "cp"), found no shape at all and bounded
    every size's step at infinity: no bound of a step plan takes. It is a lower bound on it again."""
    from planner.case import load_case
    from planner.size import work_lower_bound

    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 32, "seq_len": 4096, "engine": "megatron"},
            "search": {"min_cp": 8, "max_cp": 8}}
    best = planner.plan(case, top_k=0).best
    assert best.job.layout.cp == 8
    loaded = load_case(case)
    bound = work_lower_bound(loaded, loaded.search, loaded.cluster.gpu) / 16
    assert 0 < bound <= best.step_time_s


def test_a_type_whose_limit_is_less_than_one_rack_is_said_to_be_left_out():
    """--max-nodes 10 gives 40 GB200s at 4 a tray, short of one NVL72 rack of 72 (the unit `size`
    takes them in), beside 80 H100s: the answer was an H100 cluster and nothing said that the GB200s
    were never weighed, as if they had lost on the merits."""
    case = {**TINY, "cluster": {"options": [{"gpu": "gb200", "max_nodes": 20, "gpu_hour_cost": 6.0},
                                            {"gpu": "h100-sxm-80gb", "max_nodes": 4, "gpu_hour_cost": 2.5}]}}
    result = planner.size(case, "1B", max_nodes=10)
    assert result.status == "ok" and result.best.option.gpu.name == "h100-sxm-80gb"
    assert any(n.startswith("--max-nodes gives 40 gb200 GPUs, less than one rack of 72") and "out" in n
               for n in result.notes), result.notes
    # with no type left, the reason says so once, not a note per type
    alone = planner.size(case, "1B", max_gpus=4)
    assert alone.status == "over budget" and "no whole node or rack" in alone.no_fit
    assert not any("less than one" in n for n in alone.notes)


def test_sizes_left_out_as_beaten_are_not_said_not_to_meet_the_deadline(tmp_path):
    """A small mixture of experts on up to two GB200 NVL72 racks, 1T tokens by 10 days: one rack on
    64 of its GPUs is the cheapest, and `plan` runs every other size (one rack or two whole, two on
    64 of each) slower on more GPUs, well within 10 days. They are rightly not listed as trades, but
    the report said "No other size within the limits meets 10 days", which a user would act on."""
    from test_size_front import SMALL_MOE_ON_TWO_RACKS

    case = SMALL_MOE_ON_TWO_RACKS
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case))
    result = planner.size(path, "1T", deadline="10d")
    best = result.best
    assert result.status == "ok" and best.gpus == 64 and not result.alternatives
    step_deadline = 10 * SECONDS_PER_DAY * 48 * 1024 / 1e12
    meeting = 0
    for cluster in ({"num_gpus": 72}, {"num_gpus": 144}, {"num_gpus": 128, "nvlink_domain": 64}):
        other = planner.plan({**case, "cluster": {"gpu": "gb200", **cluster}}, fastest=True, engine="megatron").best
        assert other.step_time_s >= best.step_time_s  # slower, on more GPUs: beaten, not a trade
        meeting += other.step_time_s <= step_deadline
    done = run_cli("size", str(path), "--tokens", "1T", "--deadline", "10d")
    text = " ".join(done.stdout.split())
    assert done.returncode == 0 and meeting == 3
    assert "No other size" not in text
    assert f"{meeting} other sizes within the limits meet 10 days, each beaten by one of its GPU type" in text


def test_size_json_counts_the_sizes_that_meet_the_deadline_though_beaten(tmp_path):
    """By a deadline `size` lists no size another of its type beats on GPUs, days and spend at once, and
    the report says how many such meet it ("3 other sizes within the limits meet 10 days"); `size
    --json` gave none and no count, which a script reads as "no other size meets it". The small mixture
    of experts on up to two GB200 NVL72 racks: one rack run on 64 GPUs is the answer, and the other
    three sizes (one rack or two whole, two on 64 of each) all meet 10 days, slower on more GPUs
    (test_sizes_left_out_as_beaten_are_not_said_not_to_meet_the_deadline times each with `plan`)."""
    from test_size_front import SMALL_MOE_ON_TWO_RACKS

    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(SMALL_MOE_ON_TWO_RACKS))
    done = run_cli("size", str(path), "--tokens", "1T", "--deadline", "10d", "--json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["gpus"] == 64 and printed["alternatives"] == [] and printed["beaten_meeting"] == 3


def test_size_top_zero_counts_the_sizes_that_meet_the_deadline_as_any_top_does(tmp_path):
    """`--top` limits what is listed, not what is counted (docs/sizing.md): the small mixture of experts
    on up to two GB200 NVL72 racks has three sizes besides the answer that meet 10 days, each slower on
    more GPUs (timed with `plan` in test_sizes_left_out_as_beaten_are_not_said_not_to_meet_the_deadline).
    Under `--top 0` the sweep's cut held the answer alone and skipped the dearer sizes: it counted 1."""
    from test_size_front import SMALL_MOE_ON_TWO_RACKS

    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(SMALL_MOE_ON_TWO_RACKS))
    done = run_cli("size", str(path), "--tokens", "1T", "--deadline", "10d", "--top", "0", "--json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["gpus"] == 64 and printed["alternatives"] == [] and printed["beaten_meeting"] == 3
