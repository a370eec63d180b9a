"""What `size` says when nothing within the limits meets the target: ``Sizing.status`` (ok,
deadline not met, over budget, nothing fits), the fastest cluster within the limits and the
fewest GPUs past them that would do, the same in the API, the JSON and the exit-3 message."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

import planner
from planner import bands
from cli_in_process import run_cli

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_405B = REPO / "examples" / "llama3.1-405b-16384-h100-plan.yaml"
TINY = {"model": {"name": "tiny", "num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 8000},
        "training": {"global_batch_size": 64, "seq_len": 1024}}


def no_fit_json(result) -> dict:
    return json.loads(json.dumps(result.to_dict()))["no_fit"]


def test_the_issues_budget_of_8192_gpus_says_the_deadline_is_not_met_and_what_would_meet_it():
    """405B for 15.6T tokens by 60 days within 8,192 H100s: the fastest within them takes longer."""
    result = planner.size(EXAMPLE_405B, "15.6T", deadline="60d", max_gpus=8192)
    assert result.status == "deadline not met" and result.best is None and result.solver_status == "INFEASIBLE"
    fastest, would = result.fastest, result.would_meet
    assert fastest.gpus <= 8192 and fastest.days > 60
    assert would.gpus > 8192 and would.gpus % 8 == 0 and would.days <= 60
    assert result.reason == result.no_fit and f"{would.gpus:,} h100-sxm-80gb GPUs would take" in result.reason
    # The fastest's layouts were scored: the counters said no size was searched and no layout scored.
    assert result.sizes_searched >= 1 and result.layouts_scored > 0
    printed = json.loads(json.dumps(result.to_dict()))
    assert printed["status"] == "deadline not met" and printed["gpus"] is None
    assert printed["no_fit"]["fastest"]["gpus"] == fastest.gpus
    assert printed["no_fit"]["fastest"]["days"] == pytest.approx(fastest.days, rel=1e-12)
    assert printed["no_fit"]["would_meet"]["gpus"] == would.gpus


def test_a_missed_deadline_names_the_fewest_gpus_that_meet_it_in_whole_nodes(tmp_path):
    case = {**TINY, "cluster": {"gpu": "h100-sxm-80gb", "nodes": 1}}
    fastest = planner.size(case, "50B", max_gpus=8).best
    deadline = f"{fastest.days / 2 * 24:.6f}h"
    result = planner.size(case, "50B", deadline=deadline)
    assert result.status == "deadline not met"
    assert result.fastest.gpus == fastest.gpus and result.fastest.days == pytest.approx(fastest.days)
    would = result.would_meet
    # One node fewer does not meet it; the size named does, and within it `size` answers ok.
    fewer = planner.size(case, "50B", deadline=deadline, max_gpus=would.gpus - 8)
    assert fewer.status == "deadline not met" and fewer.best is None
    enough = planner.size(case, "50B", deadline=deadline, max_gpus=would.gpus)
    assert enough.status == "ok" and enough.best.days <= fastest.days / 2 and enough.best.gpus <= would.gpus
    # The exit-3 message says the same fields as the JSON.
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case))
    done = run_cli("size", str(path), "--tokens", "50B", "--deadline", deadline)
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("deadline not met: no cluster within the limits meets the deadline")
    assert f"fastest within the limits: {result.fastest.gpus:,} × h100-sxm-80gb" in done.stdout
    assert f"would meet the deadline: {would.gpus:,} × h100-sxm-80gb" in done.stdout
    # Its days as printed (two significant figures below a day, not rounded away to 0.0).
    after = done.stdout.split("would meet the deadline:")[1]
    printed_days = float(re.search(r"([\d.,]+) days", after).group(1).replace(",", ""))
    assert printed_days == pytest.approx(would.days, rel=0.05)
    printed = json.loads(run_cli("size", str(path), "--tokens", "50B", "--deadline", deadline, "--json").stdout)
    assert printed["status"] == "deadline not met" and printed["no_fit"] == no_fit_json(result)


@pytest.mark.parametrize("args", [pytest.param({"max_gpus": 8}, id="budget"), pytest.param({}, id="front")])
def test_too_few_gpus_for_any_layout_is_over_budget_with_the_fewest_that_fit(args):
    """405B on one node of H100s fits no layout; 24 GPUs (3 nodes) is the fewest that fits."""
    case = yaml.safe_load(EXAMPLE_405B.read_text())
    case["cluster"] = {"gpu": "h100-sxm-80gb", "num_gpus": 8}
    result = planner.size(case, "15.6T", **args)
    assert result.status == "over budget" and result.best is None and result.fastest is None
    assert result.would_meet.gpus == 24
    assert "past the limits, 24 h100-sxm-80gb GPUs would fit" in result.reason
    # Said once, with its type ("24 GPUs would fit" came first from the plan's advice, then again), and in
    # words that agree ("parameters overflows").
    assert result.reason.count("24 ") == 1 and "the parameters term overflows" in result.reason
    assert no_fit_json(result)["would_meet"]["gpus"] == 24 and no_fit_json(result)["fastest"] is None
    if args:  # the fewest by the definition: 16 GPUs fit nothing, 24 do
        assert planner.size(case, "15.6T", max_gpus=16).status == "over budget"
        assert planner.size(case, "15.6T", max_gpus=24).best.gpus == 24


def test_nothing_fits_anywhere_says_so_and_exits_3(tmp_path):
    case = {**TINY, "cluster": {"gpu": "h100-sxm-80gb", "nodes": 1, "memory": "64 MiB"},
            "overheads": {"cuda_context": "1 MiB"}}  # a context past the memory is the case's error (exit 2)
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case))
    done = run_cli("size", str(path), "--tokens", "1B", "--json")
    assert done.returncode == 3
    printed = json.loads(done.stdout)
    assert printed["status"] == "nothing fits" and printed["gpus"] is None
    assert printed["no_fit"]["would_meet"] is None and printed["no_fit"]["fastest"] is None
    assert printed["front"] == [] and printed["knee"] is None
    done = run_cli("size", str(path), "--tokens", "1B")
    assert done.returncode == 3 and done.stdout.startswith("nothing fits: no layout fits: ")
    assert " ".join(done.stdout.split()) == f"nothing fits: {printed['no_fit']['reason']}"


def test_an_answer_says_ok():
    case = {**TINY, "cluster": {"gpu": "h100-sxm-80gb", "nodes": 2}}
    for args in ({"deadline": "30d"}, {"max_gpus": 16}, {}):
        result = planner.size(case, "1B", **args)
        assert result.status == "ok" and result.solver_status == "OPTIMAL" and result.best is not None
        assert result.to_dict()["no_fit"] is None and result.reason is None


def test_a_size_whose_fastest_layout_is_at_risk_says_so(tmp_path):
    """Llama 3 70B within 16 A100s of 40 GB: `size` timed the cluster by a layout whose predicted peak
    (42.5 GB) is over the 41.4 GB usable, and said nothing of it, where `plan` on the same cluster
    picks one surer to fit, 6 % slower: two answers and no word why."""
    case = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "a100-sxm-40gb", "max_gpus": 16},
            "training": {"global_batch_size": 8, "seq_len": 8192, "precision": "bf16"},
            "search": {"target": "megatron"}}
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case))
    answer = json.loads(run_cli("size", str(path), "--tokens", "1B", "--deadline", "100d", "--json").stdout)
    assert answer["gpus"] == 16 and answer["memory_verdict"] == "at risk" and answer["peak_bytes"] > 41.4e9
    done = run_cli("size", str(path), "--tokens", "1B", "--deadline", "100d")
    text = " ".join(done.stdout.split())
    assert done.returncode == 0 and f"at risk: this layout's predicted peak, {answer['peak_bytes'] / 1e9:.1f} GB, is " \
        "over the" in text and "`plan` on this cluster may pick a layout surer to fit" in text, done.stdout
    # Whose peaks the band is: every published peak's (no Megatron run publishes one), said as the days' band says its runs.
    memory = yaml.safe_load(bands.BANDS_FILE.read_text())["memory"][-1]
    assert memory["class"] == {} and (f"its memory band's upper end over it (all {memory['runs']:,} published peaks; fewer "
                                      "than 20 of them share its engine (megatron): engine, generation, precision, "
                                      "experts dropped); `plan` on this cluster") in text, done.stdout


def test_the_progress_of_a_missed_deadline_never_goes_back():
    """The search for the fastest within the limits ran the same sizes again and told the bar from 1:
    898/2048, then 413/2048."""
    told = []
    planner.size(EXAMPLE_405B, "15.6T", deadline="60d", max_gpus=8192, progress=lambda done, total: told.append(
        (done, total)))
    assert told and all(b >= a for a, b in zip(told, told[1:])) and len({total for _, total in told}) == 1


def test_pins_that_need_more_gpus_than_the_limit_are_over_budget_with_the_fewest_that_hold_them(tmp_path):
    """A search section pinning tp 8 and pp 8 (64 GPUs) within 32: exit 2 with plan's refusal at the
    largest size ("no megatron layout of 32 GPUs ... meets the search section's pp, tp"), where the pins
    are valid and 64 GPUs run them: over budget (exit 3), naming them."""
    case = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "max_gpus": 32},
            "training": {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16", "optimizer": "adamw"},
            "search": {"target": "megatron", "tp": 8, "pp": 8}}
    result = planner.size(case, "15T")
    assert result.status == "over budget" and result.would_meet.gpus == 64
    assert "meets the search section's pp, tp" in result.reason and "64 h100-sxm-80gb GPUs would fit" in result.reason
    path = tmp_path / "pins.yaml"
    path.write_text(yaml.safe_dump(case))
    done = run_cli("size", str(path), "--tokens", "15T")
    assert done.returncode == 3 and "64 h100-sxm-80gb GPUs would fit" in " ".join((done.stderr + done.stdout).split())


def test_a_missed_target_prints_every_key_an_answer_does_null():
    """`size --json` of a missed deadline left out memory_verdict and peak_bytes, which an answer
    prints at the top level (docs/sizing.md: "the top-level fields are null")."""
    answered = planner.size(EXAMPLE_405B, "15.6T", deadline="200d").to_dict()
    missed = planner.size(EXAMPLE_405B, "15.6T", deadline="60d", max_gpus=8192).to_dict()
    assert answered["status"] == "ok" and missed["status"] == "deadline not met"
    assert set(missed) == set(answered)
    assert all(missed[key] is None for key in ("memory_verdict", "peak_bytes", "gpus", "days"))


def test_a_deadline_set_to_the_days_an_answer_takes_keeps_that_answer():
    """The example answers 2,048 B200s at 51.16044019155041 days by 60; by a deadline of exactly those
    days it answered 4,096 B200s at 1.2x the cost: whole microseconds, the step rounded up and the
    deadline's share rounded down, refused the answer's own step by 2 µs."""
    example = REPO / "examples" / "llama3-70b-15t-size.yaml"
    first = planner.size(example, "15T", deadline="60d")
    again = planner.size(example, "15T", deadline=f"{first.best.days!r}d")
    assert again.status == "ok" and (again.best.gpus, again.best.option.key) == (first.best.gpus, first.best.option.key)


def test_a_deadline_under_a_day_is_said_in_hours_and_counts_have_separators(tmp_path):
    """A missed deadline of 1h read "the deadline of 0.04167 days" and a fastest of "16384 h100-sxm-80gb
    GPUs" where the rest of the report writes 16,384."""
    result = planner.size(EXAMPLE_405B, "15.6T", deadline="1h")
    assert result.status == "deadline not met"
    assert "the deadline of 1 hour:" in result.reason and f"{result.fastest.gpus:,} h100-sxm-80gb GPUs" in result.reason
    assert result.fastest.gpus >= 1000  # a count that takes a separator
    done = run_cli("size", str(EXAMPLE_405B), "--tokens", "15.6T", "--deadline", "12h")
    assert done.returncode == 3 and "the deadline of 12 hours" in " ".join((done.stdout + done.stderr).split())


@pytest.mark.parametrize("tokens", ["-5T", "-1e12"])
def test_a_negative_token_count_is_refused_as_not_above_zero(tokens):
    with pytest.raises(planner.CaseError, match="above zero"):
        planner.size(EXAMPLE_405B, tokens)


def test_a_runner_up_on_part_of_each_rack_says_its_ratio_is_of_the_gpus_paid():
    """1,024 GB200s on 64 of each 72-GPU rack beside 4,096 H100s: the row said "0.28× the GPUs", the
    ratio of the 1,152 paid, not of the 1,024 it showed."""
    case = {"model": {"preset": "llama3-70b"},
            "cluster": {"options": [{"gpu": "gb200", "max_gpus": 1152, "gpu_hour_cost": 6},
                                    {"gpu": "h100-sxm-80gb", "max_gpus": 4096, "gpu_hour_cost": 2.5}]},
            "training": {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16", "optimizer": "adamw"},
            "search": {"target": "megatron"}}
    result = planner.size(case, "15T", deadline="90d")
    part = [alt for alt in result.alternatives if alt.gpus_paid != alt.gpus]
    assert part and result.best.gpus_paid == result.best.gpus
    for alt in part:
        text = result.best.trade_text(alt)
        assert f"{alt.gpus_paid / result.best.gpus_paid:.2f}× the GPUs paid for" in text


def test_a_same_type_runner_up_on_whole_racks_is_not_named_as_another_gpu():
    """GB200 alone: the runner-up on whole racks (864 of 12 racks of 72) read "gb200: 0.75× the GPUs
    paid…", the prefix every other row keeps for another GPU type, though the answer was gb200 too."""
    case = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "gb200", "max_gpus": 1152, "gpu_hour_cost": 6.0},
            "training": {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16", "optimizer": "adamw"},
            "search": {"target": "megatron"}}
    result = planner.size(case, "15T", max_gpus=1152)
    assert result.alternatives and all(alt.option.gpu.name == "gb200" for alt in result.alternatives)
    for alt in result.alternatives:
        assert not result.best.trade_text(alt).startswith("gb200"), result.best.trade_text(alt)


def test_one_gpu_type_at_two_prices_is_told_apart_by_its_entry_and_the_cheaper_is_the_answer():
    """Reserved and on-demand H100s, two cluster.options entries at two prices (docs/sizing.md): the
    answer's own cluster at the on-demand price was runner-up #1, its trade "h100-sxm-80gb: 1.00× the
    GPUs for 1.00× the days (2.00× the cost)", naming a type that does not differ. It names the entry
    as the case names it, with its price. Identical hardware at twice the price costs exactly twice as
    much a size (cost = GPU-hours × price): the cheaper is the answer where the objective is the least
    cost (a deadline both meet) and where a budget's least days tie, whichever entry the case lists first."""
    reserved = {"gpu": "h100-sxm-80gb", "max_gpus": 1024, "gpu_hour_cost": 2.0}
    on_demand = {**reserved, "gpu_hour_cost": 4.0}
    for order in ([reserved, on_demand], [on_demand, reserved]):
        case = {"model": {"preset": "llama3-8b"}, "cluster": {"options": order},
                "training": {"global_batch_size": 512, "seq_len": 8192, "engine": "megatron"}}
        cheap, dear = (f"cluster.options[{order.index(o)}]" for o in (reserved, on_demand))
        for bound in ({"deadline": "2d"}, {"deadline": "10d"}, {"max_gpus": 256}):
            result = planner.size(case, "1T", **bound)
            assert result.best.option.key == cheap, (order, bound)
            for alt in result.alternatives:
                text = result.best.trade_text(alt)
                assert text.startswith(f"{dear} at 4.00 per GPU-hour: " if alt.option.key == dear else
                                       f"{alt.gpus / result.best.gpus:.2f}× the GPUs"), text
            if "max_gpus" not in bound and bound["deadline"] == "2d":  # 1,024 GPUs alone meet it, on either entry
                twin = result.alternatives[0]
                assert (twin.option.key, twin.gpus) == (dear, result.best.gpus)
                assert result.to_dict()["alternatives"][0]["trades"] == \
                    f"{dear} at 4.00 per GPU-hour: 1.00× the GPUs for 1.00× the days (2.00× the cost)"


def test_the_answer_piped_keeps_every_figure_whole_and_its_days_one_way(tmp_path):
    """Piped (rich draws 80 columns off a terminal), the next-best table cut its cells ("1,045,957,9…",
    "h100-sxm-80g…"); the status line gave 1.053e+04 days for the 10,527.2 its detail lines did; a token
    count past the suffixes read "1e+13T"; `--top` without a deadline named GPU-hours where the front is cost."""
    example = REPO / "examples" / "llama3-70b-15t-size.yaml"
    text = run_cli("size", str(example), "--tokens", "1e25", "--max-gpus", "64").stdout
    result = planner.size(example, "1e25", max_gpus=64)
    from planner.units import figure_text

    for alt in result.alternatives:
        assert all(figure_text(x) in text for x in (alt.days, alt.gpu_hours, alt.cost))
        assert figure_text(alt.days) == f"{alt.days:.4g}"  # past 10^15, in four figures
    assert "…" not in text and "on 1e+25 tokens" in text
    missed = run_cli("size", str(example), "--tokens", "15T", "--max-gpus", "8", "--deadline", "60d")
    fastest = planner.size(example, "15T", max_gpus=8, deadline="60d").fastest
    assert missed.returncode == 3 and f"takes {fastest.days:,.1f} days" in " ".join(missed.stdout.split())
    refused = run_cli("size", str(example), "--tokens", "15T", "--top", "3")
    assert refused.returncode == 2 and "front of days against spend (cost where every type has a price" in \
        refused.stderr


def test_the_front_piped_keeps_its_eight_columns_whole(tmp_path, monkeypatch):
    """Piped (rich draws 80 columns off a terminal), the front's header read "× cos" and its ratios "1.0" for
    1.06, at a price of 380 and 680 an hour: off a terminal its tables are drawn 120 wide."""
    case = yaml.safe_load((REPO / "examples" / "llama3-70b-15t-size.yaml").read_text())
    for option, price in zip(case["cluster"]["options"], (380, 680)):
        option["gpu_hour_cost"] = price
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    monkeypatch.delenv("COLUMNS", raising=False)  # a width the user sets is theirs
    text = run_cli("size", str(tmp_path / "case.yaml"), "--tokens", "100T").stdout
    result = planner.size(tmp_path / "case.yaml", "100T")
    assert "× days  × cost" in text and "…" not in text
    for before, point in zip(result.front, result.front[1:]):
        assert f"{before.trade(point)['cost']:.2f}" in text and f"{point.cost:,.0f}" in text


@pytest.mark.parametrize("changes", [
    {"search": {"tp": 3}},  # tp divides the attention heads, 8 here (Megatron-LM's validate_args asserts it)
    {"search": {"min_pp": 8}},  # a pipeline stage holds at least one of the 4 layers
    # torchtitan's models have no dropout (docs/case-reference.md, model.dropout)
    {"model": {**TINY["model"], "dropout": 0.1}, "training": {**TINY["training"], "engine": "torchtitan"}},
])
def test_a_case_plan_refuses_size_refuses_with_plans_line(tmp_path, changes):
    """Pins no layout of any size meets, or an engine that cannot run the case, are bad input (exit 2,
    docs/commands.md, Exit codes): `plan` refused them in one line, `size` answered "nothing fits" (exit 3),
    the code for layouts that exist and overflow memory, after searching every size up to 64× its limit."""
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump({**TINY, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8}, **changes}))
    planned = run_cli("plan", str(path))
    assert planned.returncode == 2 and len(planned.stderr.splitlines()) == 1 and str(path) in planned.stderr
    sized = run_cli("size", str(path), "--tokens", "1B")
    assert (sized.returncode, sized.stdout, sized.stderr) == (2, "", planned.stderr)


@pytest.mark.parametrize("count, limit", [({"num_gpus": 8}, {"max_gpus": 16}), ({"nodes": 2}, {"max_nodes": 1})])
def test_a_limit_beside_the_count_plan_runs_on_is_said(tmp_path, count, limit):
    """`size` reads max_gpus (max_nodes) and not num_gpus (nodes) where a case gives both
    (docs/case-reference.md, cluster), above or below them, and said nothing: `plan` says the converse
    of the same case. One note on stderr and in --json's notes; none where --max-gpus replaces both."""
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump({**TINY, "cluster": {"gpu": "h100-sxm-80gb", **count, **limit}}))
    (key, value), (limit_key, _) = next(iter(count.items())), next(iter(limit.items()))
    most = 16 if "max_gpus" in limit else 8  # the limit, in GPUs of 8 a node
    result = planner.size(path, "1B")
    assert result.sizes == most // 8  # the whole nodes up to the limit, not up to num_gpus or nodes
    said = [n for n in result.notes if f"cluster.{key}" in n]
    assert said == [f"{path}: size may use up to cluster.{limit_key} ({most} GPUs) and does not read "
                    f"cluster.{key} ({value}), the {'GPUs' if key == 'num_gpus' else 'nodes'} `plan` runs on"]
    done = run_cli("size", str(path), "--tokens", "1B", "--json")
    assert done.returncode == 0 and f"note: {said[0]}" in done.stderr.splitlines()
    assert json.loads(done.stdout)["notes"].count(said[0]) == 1
    assert not [n for n in planner.size(path, "1B", max_gpus=8).notes if f"cluster.{key}" in n]
    assert not [n for n in planner.size({**TINY, "cluster": {"gpu": "h100-sxm-80gb", **count}}, "1B").notes
                if f"cluster.{key}" in n]
