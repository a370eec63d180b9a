"""What each option's --help says its default is, against what the command does without it."""
from __future__ import annotations

import json

import typer.main
import yaml

from cli_in_process import run_cli
from planner.cli import app


def option_help(command: str, flag: str) -> str:
    group = typer.main.get_command(app)
    for param in group.commands[command].params:
        if flag in getattr(param, "opts", ()):
            return " ".join(param.help.split())
    raise AssertionError(f"{command} has no {flag}")


def test_diagnose_pp_help_says_the_default_diagnose_takes(tmp_path):
    """`diagnose --help` said --pp's default was 1, but without --pp a ds_config is read at the pipeline
    its header's planned layout states, else the case's layout (pp 2 here), and only then 1: a user
    trusting the help diagnosed a pipeline they did not mean."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "deepspeed"},
            "layout": {"dp": 8, "tp": 1, "pp": 2, "micro_batch_size": 1, "zero_stage": 1, "recompute": "full"}}
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    (tmp_path / "ds.json").write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
                                                  "gradient_accumulation_steps": 8, "bf16": {"enabled": True},
                                                  "zero_optimization": {"stage": 1}}))
    done = run_cli("diagnose", str(tmp_path / "case.yaml"), "--config", str(tmp_path / "ds.json"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["config"]["layout"]["pp"] == 2
    for flag in ("--pp", "--tp", "--ep", "--stage-layers", "--recompute"):
        text = option_help("diagnose", flag)
        assert "default 1)" not in text, (flag, text)
        assert "planned layout" in text and "the case's layout" in text, (flag, text)


def test_calibrate_gpu_preset_help_says_what_it_does_with_from_runs():
    """With --from-runs or --from-logs, --gpu-preset takes no peak from anywhere: it is the GPU the runs
    must have run on (another is refused). The help gave only the microbenchmarks' meaning."""
    text = option_help("calibrate", "--gpu-preset")
    assert "--from-runs" in text and "refused" in text, text


def test_plan_help_names_the_bounds_plan_enforces(tmp_path):
    """`plan --help` gave --top and --simplest-within no range: the highest value each help names is
    taken and one above it is refused (exit 2), so the help tells a user the bound they will meet."""
    import re

    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 8, "seq_len": 1024, "engine": "megatron"}}
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    for flag in ("--top", "--simplest-within"):
        bound = re.search(r"0 to (\d+)", option_help("plan", flag))
        assert bound, (flag, option_help("plan", flag))
        highest = int(bound.group(1))
        taken = run_cli("plan", str(tmp_path / "case.yaml"), flag, str(highest), "--json")
        assert taken.returncode == 0, (flag, taken.stderr)
        refused = run_cli("plan", str(tmp_path / "case.yaml"), flag, str(highest + 1))
        assert refused.returncode == 2 and flag in refused.stderr, (flag, refused.stderr)


def test_size_help_says_a_budget_flag_replaces_the_case_value():
    """--max-gpus raises the case's limit as well as lowering it, and --gpu-hour-cost replaces the
    case's price (docs/case-reference.md): the help said neither."""
    for flag in ("--max-gpus", "--gpu-hour-cost"):
        assert "replacing the case's" in option_help("size", flag), flag
