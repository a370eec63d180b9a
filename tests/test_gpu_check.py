"""bench/gpu_check.sh, the prepared script for a session lent a GPU, runs its whole path on
this CPU (gloo, fp32, a quick profile): calibrate, then validate a recomputation mode, results
written, within its 6-minute limit. The activations it measures are real PyTorch's, so they are
held to the model (within 2 %); step times on a shared CPU are only checked to exist. One mode
here (each validation is a torchrun of its own, 5-7 s on the 2-core machine): the three modes'
activations are held to the model by tests/test_validate_loop.py."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


def test_gpu_check_runs_end_to_end_on_cpu(tmp_path):
    pytest.importorskip("torch")
    out, profiles = tmp_path / "out", tmp_path / "profiles"
    import sys

    run = subprocess.run(["bash", "bench/gpu_check.sh", "--quick", "--out", str(out), "--profiles", str(profiles),
                          "--recompute", "selective"],
                         cwd=REPO, capture_output=True, text=True, timeout=420, env={"PYTHON": sys.executable,
                                                                                     "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert [p.name for p in profiles.iterdir()] == ["cpu-quick.yaml"]
    results = json.loads((out / "results.json").read_text())
    assert [r["recompute"] for r in results] == ["selective"]
    for r in results:
        assert math.isfinite(r["step_time_s"]["ratio"]) and r["step_time_s"]["measured"] > 0
        assert r["activation_bytes"]["ratio"] == pytest.approx(1.0, abs=0.02)
    assert (out / "results.txt").read_text().count("activations ratio") == 1
