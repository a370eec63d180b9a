"""Nothing a case or an HF config says runs when the generated files are used.

A model name (``model.name``, an HF config's ``_name_or_path``) or a case file's name is
written into every emitted file's header. Here each holds line breaks and code: the shell
scripts must parse (``bash -n``) and run with harmless stand-ins for the launchers without
creating a marker file; the torchtitan config must import without running anything; the
argument files must hold nothing but their arguments.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import planner
from planner.configs import render
from planner.files import Output, write_all


def payload(marker: Path) -> str:
    """Text that is shell on one line and Python on another if a file lets it out of its comment."""
    return (f"x\ntouch {marker}\rtouch {marker}\u2028import pathlib; pathlib.Path({str(marker)!r}).touch()\n"
            f"\x0bimport os; os.system('touch {marker}')\n$(touch {marker}) `touch {marker}`")


CASE = {
    "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
    "training": {"global_batch_size": 64, "seq_len": 4096},
}


def emit(tmp_path: Path, engine: str, model: dict) -> Path:
    best = planner.plan({**CASE, "model": model}, target=engine, top_k=0).best
    assert best is not None
    out = tmp_path / engine
    files, _ = render(best, engine, payload(tmp_path / "pwned-by-source"))
    write_all([Output(out / name, text) for name, text in files.items()], force=False)
    return out


def stub_launchers(tmp_path: Path) -> dict[str, str]:
    """torchrun and deepspeed that do nothing, first on PATH, and node 0's address, which a
    multi-node Megatron launch.sh stops without."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("torchrun", "deepspeed"):
        stub = bin_dir / name
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "MASTER_ADDR": "node0"}


def check_inert(tmp_path: Path, out: Path, marker: Path) -> None:
    launch = out / "launch.sh"
    assert subprocess.run(["bash", "-n", str(launch)], capture_output=True).returncode == 0
    run = subprocess.run(["bash", str(launch)], capture_output=True, text=True, timeout=60,
                         env=stub_launchers(tmp_path), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    if (out / "torchtitan_config.py").exists():
        code = f"import sys; sys.path.insert(0, {str(out)!r}); import torchtitan_config"
        imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert imported.returncode == 0, imported.stderr
    for name in ("megatron_args.txt", "overrides.txt"):
        if (out / name).exists():  # launch.sh splits the non-comment lines into words
            words = [w for line in (out / name).read_text().splitlines() if not line.startswith("#")
                     for w in line.split()]
            assert not any("touch" in w or "pwned" in w for w in words)
    if (out / "ds_config.json").exists():
        assert "train_batch_size" in json.loads((out / "ds_config.json").read_text())
    assert not marker.exists()
    assert not (tmp_path / "pwned-by-source").exists()


@pytest.mark.parametrize("engine", ["megatron", "deepspeed", "torchtitan"])
def test_a_model_name_with_code_in_it_stays_a_comment(tmp_path, engine):
    marker = tmp_path / "pwned"
    out = emit(tmp_path, engine, {"preset": "llama3-8b", "name": payload(marker)})
    header = (out / "launch.sh").read_text().splitlines()
    assert all(line.startswith("#") for line in header[1:header.index("set -euo pipefail")])
    check_inert(tmp_path, out, marker)


def test_an_hf_configs_name_with_code_in_it_stays_a_comment(tmp_path):
    marker = tmp_path / "pwned"
    config = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
              "_name_or_path": payload(marker)}
    (tmp_path / "config.json").write_text(json.dumps(config))
    for engine in ("megatron", "torchtitan"):
        out = emit(tmp_path, engine, {"hf_config": str(tmp_path / "config.json")})
        check_inert(tmp_path, out, marker)


def test_the_cli_emits_inert_files_for_a_hostile_case_file(tmp_path):
    marker = tmp_path / "pwned"
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump({**CASE, "model": {"preset": "llama3-8b", "name": payload(marker)}}))
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "planner", "plan", str(case), "--emit", "torchtitan",
                          "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    check_inert(tmp_path, out, marker)
