"""`size` with neither a deadline nor a budget: the front of days against spend and its knee
(docs/sizing.md). The front against an independent sweep of `plan` is in tests/test_size.py
(``check_front``: the generated cases and the Llama 3 8B case)."""

from __future__ import annotations

import json
import math
from itertools import permutations
from pathlib import Path
from types import SimpleNamespace as Point

import pytest
import yaml

import planner
from cli_in_process import run_cli
from planner.size_front import DOUBLING_SAVES, FRONT_SPAN, knee_index, ladder, pareto_front

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_405B = REPO / "examples" / "llama3.1-405b-16384-h100-plan.yaml"
TINY = {"model": {"name": "tiny", "num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 8000},
        "training": {"global_batch_size": 64, "seq_len": 1024}}


def spend(result, choice) -> float:
    return choice.cost if result.spend == "cost" else choice.gpu_hours


def assert_a_front_with_its_knee(result) -> None:
    """What docs/sizing.md says of any front, recomputed from the result's own points."""
    front = result.front
    assert result.status == "ok" and result.objective == "front" and front
    # Pareto: no listed size is both no slower and no dearer than another.
    for a, b in permutations(front, 2):
        assert not (a.days <= b.days and spend(result, a) <= spend(result, b)), (a.gpus, b.gpus)
    # The cheapest first: spend rises and days fall down the list.
    assert [spend(result, c) for c in front] == sorted(spend(result, c) for c in front)
    assert [c.days for c in front] == sorted((c.days for c in front), reverse=True)
    # The knee: the least days × spend, and the answer.
    least = min(front, key=lambda c: c.days * spend(result, c))
    assert result.knee is least and result.best is least and result.alternatives == ()
    assert result.knee_index == front.index(least)
    # Within the span, and no point spends less than the work bound says any size could.
    assert all(c.days <= FRONT_SPAN * least.days * (1 + 1e-12) for c in front)
    assert all(spend(result, c) >= result.spend_bound for c in front)


# --- the definitions, by hand ------------------------------------------------------------

def test_the_sizes_considered_are_powers_of_two_and_one_and_a_half_times_them_and_the_limit():
    assert ladder(16) == [16, 12, 8, 6, 4, 3, 2, 1]
    assert ladder(10) == [10, 8, 6, 4, 3, 2, 1]
    assert ladder(1) == [1] and ladder(0) == []
    assert len(ladder(2048)) == 22  # 16,384 H100s: 22 node counts of 2,048


def test_the_front_and_its_knee_by_hand():
    a, b, c, d, e = (Point(days=100.0, spend=10.0), Point(days=50.0, spend=11.0), Point(days=60.0, spend=12.0),
                     Point(days=25.0, spend=15.0), Point(days=20.0, spend=30.0))
    twin = Point(days=25.0, spend=15.0)

    def days(p):
        return p.days

    def spent(p):
        return p.spend
    front = pareto_front([e, c, twin, d, b, a], days, spent)
    # c (60 days for 12) is beaten by b (50 days for 11); of d and its twin the first given stays.
    assert front == [a, b, twin, e]
    # days × spend: a 1000, b 550, d 375, e 600.
    assert knee_index(front, days, spent) == 2
    assert knee_index([], days, spent) is None
    # A tie in days × spend goes to the less spend: 40 days for 10 against 20 days for 20.
    assert knee_index([Point(days=40.0, spend=10.0), Point(days=20.0, spend=20.0)], days, spent) == 0


def test_doubling_one_type_pays_by_the_knee_exactly_when_it_cuts_the_days_by_more_than_29_percent():
    assert DOUBLING_SAVES == pytest.approx(1 - 1 / math.sqrt(2)) and DOUBLING_SAVES == pytest.approx(0.2929, abs=1e-4)

    def product(gpus, days):  # days × GPU-hours
        return days * days * 24 * gpus
    # 10 days on 64 GPUs against 128 GPUs at a 30 % cut (7 days) and a 28 % cut (7.2 days).
    assert product(128, 7.0) < product(64, 10.0) < product(128, 7.2)


# --- the example of the issue: Llama 3.1 405B on up to 16,384 H100s, 15.6T tokens --------

@pytest.fixture(scope="module")
def llama_405b():
    return planner.size(EXAMPLE_405B, "15.6T")


def test_the_405b_example_answers_the_front_not_the_least_gpu_hours(llama_405b):
    result = llama_405b
    assert_a_front_with_its_knee(result)
    assert result.spend == "gpu_hours" and len(result.front) >= 3
    assert all(c.gpus % 8 == 0 and c.gpus <= 16384 for c in result.front)
    # The knee is where days × GPU-hours stops falling: the step onto it cuts the days by a larger
    # share than it adds to the GPU-hours, the step past it (if any) by a smaller.
    knee = result.knee_index
    for i in range(1, len(result.front)):
        before, after = result.front[i - 1], result.front[i]
        pays = (after.days / before.days) * (after.gpu_hours / before.gpu_hours) < 1
        if i in (knee, knee + 1):
            assert pays == (i == knee), (before.gpus, after.gpus)
    # The cheap end of the front is not the answer any more: the knee is at least 4× as fast as the
    # slowest size listed, and the slowest listed takes at most 8× the knee's days.
    assert result.best.days * 4 <= result.front[0].days <= FRONT_SPAN * result.best.days
    # The least GPU-hours any size could take (work bound): below every listed size's.
    assert result.spend_bound < result.front[0].gpu_hours


def test_plan_chooses_the_knees_layout_on_the_knees_cluster(llama_405b):
    knee = llama_405b.knee
    case = yaml.safe_load(EXAMPLE_405B.read_text())
    one = {**case, "cluster": {**case["cluster"], "num_gpus": knee.gpus}}
    planned = planner.plan(one, fastest=True, engine="megatron").best
    assert planned.to_dict()["layout"] == knee.estimate.to_dict()["layout"]
    assert planned.step_time_s == knee.step_time_s


def test_the_405b_json_holds_the_front_and_the_knee(llama_405b):
    printed = json.loads(json.dumps(llama_405b.to_dict()))
    assert printed["status"] == "ok" and printed["objective"] == "front" and printed["no_fit"] is None
    front = printed["front"]
    assert [p["gpus"] for p in front] == [c.gpus for c in llama_405b.front]
    assert [p["knee"] for p in front].count(True) == 1 and front[printed["knee"]]["knee"] is True
    assert printed["gpus"] == front[printed["knee"]]["gpus"]  # the top-level answer is the knee
    assert front[0]["trade"] is None
    for before, after in zip(front, front[1:]):
        assert after["trade"]["days"] == pytest.approx(after["days"] / before["days"], rel=1e-12)
        assert after["trade"]["gpu_hours"] == pytest.approx(after["gpu_hours"] / before["gpu_hours"], rel=1e-12)


# --- a small case, on the command line ---------------------------------------------------

def test_the_command_prints_the_front_with_the_knee_marked_and_the_json_is_the_apis(tmp_path):
    case = {**TINY, "cluster": {"options": [{"gpu": "h100", "max_nodes": 4, "gpu_hour_cost": 3},
                                            {"gpu": "a100-80gb", "max_nodes": 4, "gpu_hour_cost": 1.5}]}}
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case))
    result = planner.size(path, "30B")
    assert_a_front_with_its_knee(result)
    assert result.spend == "cost"
    done = run_cli("size", str(path), "--tokens", "30B", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads(json.dumps(result.to_dict()))
    text = run_cli("size", str(path), "--tokens", "30B")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    knee_rows = [line for line in lines if line.strip().startswith("knee ")]
    knee = result.knee
    assert len(knee_rows) == 1 and f"{knee.gpus:,}" in knee_rows[0] and f"{knee.days:,.1f}" in knee_rows[0]
    for point in result.front:  # every point is a row: its GPUs, days and cost
        assert any(f"{point.gpus:,}" in line and f"{point.days:,.1f}" in line and f"{point.cost:,.0f}" in line
                   for line in lines), point.gpus
    assert f"knee: {result.knee.gpus:,} × {result.knee.option.gpu.name}" in text.stdout
    assert "least days × cost" in text.stdout


def test_top_is_refused_where_the_answer_is_the_front():
    """`size --tokens 15T --top 0` and `--top 50` printed the same front (exit 0): the option went unread."""
    from planner.errors import CaseError

    done = run_cli("size", "examples/llama3-70b-15t-size.yaml", "--tokens", "15T", "--top", "0")
    assert done.returncode == 2 and done.stderr.startswith("error: --top: applies with --deadline or a budget")
    with pytest.raises(CaseError, match="top_k: applies with deadline or a budget"):
        planner.size("examples/llama3-70b-15t-size.yaml", "15T", top_k=3)


# A small mixture of experts on up to two GB200 NVL72 racks, whose best size is one rack run on 64 of its
# 72 GPUs (its batch of 48 leaves a whole rack no better layout).
SMALL_MOE_ON_TWO_RACKS = {
    "model": {"name": "moe-s", "num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 32000,
              "activation": "swiglu", "ffn_hidden_size": 1024, "num_experts": 8, "moe_top_k": 2,
              "moe_load_imbalance": 1.0},
    "cluster": {"gpu": "gb200", "max_gpus": 144, "gpu_hour_cost": 6.0},
    "training": {"global_batch_size": 48, "seq_len": 1024}, "search": {"target": "megatron"}}


def test_a_knee_short_of_the_limit_is_not_said_to_be_held_by_it(tmp_path):
    """A small mixture of experts on up to two GB200 NVL72 racks: its front's fastest size, one rack
    run on 64 of its GPUs, is short of the limit, and `plan` on the larger sizes `size` considers
    within it (two racks whole, or on 64 of each) runs no faster. The report said "the limit binds,
    and more GPUs may still pay", sending the user to raise a limit that holds nothing back."""
    case = SMALL_MOE_ON_TWO_RACKS
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case))
    result = planner.size(path, "1T")
    knee = result.knee
    assert knee is result.front[-1] and knee.gpus == 64 and knee.option.rack == 72
    for cluster in ({"gpu": "gb200", "num_gpus": 144}, {"gpu": "gb200", "num_gpus": 128, "nvlink_domain": 64}):
        larger = planner.plan({**case, "cluster": cluster}, fastest=True, engine="megatron").best
        assert larger is None or larger.step_time_s >= knee.step_time_s, cluster
    done = run_cli("size", str(path), "--tokens", "1T")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "the limit binds" not in text
    assert "short of the limit of 144 gb200 GPUs: the limit does not bind" in text


def test_size_json_says_where_the_limit_stands_beside_the_knee(tmp_path):
    """The report says whether the knee is held by the limit ("short of the limit of 144 gb200 GPUs"),
    where `size --json` gave no limit to compare the knee with: a script could not tell a binding
    limit, worth raising, from one that holds nothing back. Up to two NVL72 racks (the case's max_gpus,
    144) are the limit; the knee, one rack run on 64 of its GPUs, pays for the rack's 72."""
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(SMALL_MOE_ON_TWO_RACKS))
    done = run_cli("size", str(path), "--tokens", "1T", "--json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    knee = printed["front"][printed["knee"]]
    assert printed["knee_limit"] == SMALL_MOE_ON_TWO_RACKS["cluster"]["max_gpus"] == 144
    assert (knee["gpus"], knee["gpus_paid"]) == (64, 72) and knee is printed["front"][-1]
