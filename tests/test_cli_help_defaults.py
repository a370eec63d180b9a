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
