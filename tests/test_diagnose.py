"""`diagnose`: emitted configs read back to their layout; an existing config is compared with the best."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("megatron.core")

import planner  # noqa: E402
from planner.case import layout_to_mapping  # noqa: E402
from planner.configs import render  # noqa: E402
from planner.diagnose import diagnose  # noqa: E402
from planner.files import Output, write_all  # noqa: E402

PRESETS = ["llama2-7b", "gpt-1.7b", "gpt-3.6b", "llama3-8b", "mistral-7b"]


def cases(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        yield {
            "model": {"preset": rng.choice(PRESETS)},
            "cluster": {"gpu": rng.choice(["a100-sxm-80gb", "h100-sxm-80gb"]), "num_gpus": rng.choice([8, 16, 32, 64])},
            "training": {"global_batch_size": rng.choice([64, 128, 256]), "seq_len": rng.choice([2048, 4096])},
        }


@pytest.mark.parametrize("engine, option", [("deepspeed", "config"), ("megatron", "megatron_args")])
def test_every_emitted_config_round_trips_through_diagnose(tmp_path, engine, option):
    checked = 0
    for i, case in enumerate(cases(7 if engine == "deepspeed" else 11, 12)):
        best = planner.plan(case, target=engine, top_k=0).best
        if best is None:
            continue
        folder = tmp_path / f"{engine}{i}"
        files, _ = render(best, engine, "<generated>")
        written = write_all([Output(folder / name, text) for name, text in files.items()], force=False)
        # Megatron: the argument list, and the launch script that reads it from beside itself.
        names = ("ds_config.json",) if engine == "deepspeed" else ("megatron_args.txt", "launch.sh")
        for config in (p for p in written if p.name in names):
            kwargs = {option: config}
            if engine == "deepspeed":
                kwargs["pp"] = best.job.layout.pp
            result = diagnose(case, **kwargs)
            assert layout_to_mapping(result.estimate.job.layout) == best.to_dict()["layout"]
            # Diagnosing the planner's own best finds nothing faster.
            assert result.speedup == pytest.approx(1.0, abs=1e-9)
        checked += 1
    assert checked >= 10


def test_diagnose_names_the_speedup_of_the_best_layout(tmp_path):
    case = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 128, "seq_len": 4096}}
    (tmp_path / "case.yaml").write_text(json.dumps(case))
    # A typical hand-written config: ZeRO-1, micro-batch 1, full recomputation.
    (tmp_path / "ds_config.json").write_text(json.dumps({
        "train_batch_size": 128, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
        "zero_optimization": {"stage": 1}, "bf16": {"enabled": True},
        "activation_checkpointing": {"partition_activations": False}}))
    out = subprocess.run([sys.executable, "-m", "planner", "diagnose", str(tmp_path / "case.yaml"),
                          "--config", str(tmp_path / "ds_config.json"), "--recompute", "full", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["config"]["layout"]["recompute"] == "full" and data["config"]["grad_accum"] == 8
    expected = data["config"]["step_time_s"] / data["best"]["step_time_s"]
    assert data["speedup"] == pytest.approx(expected) and data["speedup"] > 1.0


def test_a_contradictory_config_is_one_line(tmp_path):
    case = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 128, "seq_len": 4096}}
    (tmp_path / "case.yaml").write_text(json.dumps(case))
    bad = tmp_path / "ds_config.json"
    bad.write_text(json.dumps({"train_batch_size": 512, "train_micro_batch_size_per_gpu": 4,
                               "gradient_accumulation_steps": 8}))
    out = subprocess.run([sys.executable, "-m", "planner", "diagnose", str(tmp_path / "case.yaml"),
                          "--config", str(bad)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "train_batch_size" in lines[0]
