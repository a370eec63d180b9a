"""Every layout a JSON output prints is one a later case takes as is (docs/commands.md: the case-file
schema): fed back as the case's ``layout`` section, `estimate --json` gives the same estimate and
prints the same layout back. nanotron runs its own stage split, whatever a case states, and
Megatron's selective recomputation runs the modules the model and training call for: the estimate's
own layout said both, and the layouts beside it (its cheapest change, plan's closest layout where
nothing fits) said neither."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from cli_in_process import run_cli

# Llama 3 70B's 80 layers on one node at pp 8: 16 bytes a parameter of mixed-precision Adam without
# ZeRO is 140 GB a GPU before any activation, so no layout of nanotron's fits, the pipeline's least.
NANOTRON_70B = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
                "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16", "engine": "nanotron"},
                "layout": {"dp": 1, "tp": 1, "pp": 8, "micro_batch_size": 1, "zero_stage": 0, "recompute": "none"}}
# Without flash attention Megatron's selective recomputation recomputes the core attention (its s×s
# scores: Korthikanti §5); at 16k tokens and ZeRO-1 the layout overflows, and ZeRO-3 is the cheapest fix.
MEGATRON_SELECTIVE = {
    "model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
    "training": {"global_batch_size": 64, "seq_len": 16384, "precision": "bf16", "engine": "megatron",
                 "flash_attention": False},
    "layout": {"dp": 8, "tp": 8, "pp": 1, "micro_batch_size": 1, "zero_stage": 1, "sequence_parallel": True,
               "recompute": "selective"}}


def _json(tmp_path: Path, command: str, case: dict[str, Any], name: str) -> dict[str, Any]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(case))
    done = run_cli(command, str(path), "--json")
    assert done.returncode in (0, 3), done.stderr  # 3: it does not fit, which these cases are about
    return json.loads(done.stdout)


def _fed_back(tmp_path: Path, case: dict[str, Any], layout: dict[str, Any], name: str) -> dict[str, Any]:
    """`estimate --json` of the case with ``layout`` as its layout section, which must print it back as is."""
    again = _json(tmp_path, "estimate", {**case, "layout": layout}, name)
    assert again["layout"] == layout
    return again


def _cheapest_change_round_trips(tmp_path: Path, case: dict[str, Any]) -> None:
    est = _json(tmp_path, "estimate", case, "case")
    _fed_back(tmp_path, case, est["layout"], "own")
    change = est["cheapest_change"]
    again = _fed_back(tmp_path, case, change["layout"], "changed")
    assert (again["memory"]["peak_bytes"], again["memory_verdict"]) == (change["peak_bytes"], change["memory_verdict"])
    assert again["step_time_s"] == change["step_time_s"] or change["step_time_s"] is None


def test_nanotrons_cheapest_change_prints_the_split_it_runs(tmp_path):
    _cheapest_change_round_trips(tmp_path, NANOTRON_70B)


def test_a_selective_cheapest_change_names_the_modules_it_recomputes(tmp_path):
    _cheapest_change_round_trips(tmp_path, MEGATRON_SELECTIVE)


def test_plans_closest_layout_is_a_case_layout_as_is(tmp_path):
    # Pinned to pp 8, the closest nanotron layout has a stage split: nanotron's own.
    case = {**{k: v for k, v in NANOTRON_70B.items() if k != "layout"}, "search": {"pp": 8}}
    no_fit = _json(tmp_path, "plan", case, "plan")["no_fit"]
    again = _fed_back(tmp_path, case, no_fit["closest_layout"], "closest")
    # One layout, one peak: no_fit says the same bytes as estimate (its peak here is 196,859,546,828.8
    # bytes, which no_fit cut to ...828 where estimate rounds it to ...829).
    assert again["memory"]["peak_bytes"] == no_fit["peak_bytes"]
