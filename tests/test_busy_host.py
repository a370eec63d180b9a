"""A busy host: `calibrate` and `validate` count the CPU other processes use and refuse to
measure on a machine they share, unless asked (--allow-busy). The count's own test runs alone
(tests/conftest.py), this module last, so that the other processes it sees are the burner's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def busy_machine():
    """Another process keeping one core busy for the test's length (half of a 2-core machine)."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield
    burner.kill()
    burner.wait()


@pytest.mark.exclusive  # the other processes it counts must be the burner alone
def test_the_busy_share_counts_other_processes_not_this_one(busy_machine):
    from calibration.host import OTHERS_BUSY_SHARE, busy_reason, cores, other_cpu_share

    share = other_cpu_share(0.5)
    # At least the spinning core of all of them; a parallel test worker may add its own core, so the
    # share has no tighter upper bound than the machine.
    assert 1 / cores() - 0.2 <= share <= 1.0 + 1e-9
    assert (busy_reason(share) is not None) == (share > OTHERS_BUSY_SHARE)


@pytest.mark.parametrize("command", ["calibrate", "validate"])
def test_a_busy_machine_is_refused_up_front_unless_asked(tmp_path, busy_machine, command):
    import yaml

    from calibration.host import OTHERS_BUSY_SHARE, cores
    from test_validate_loop import PROFILE
    from test_validate_loop import case as small_case

    if 1 / cores() <= OTHERS_BUSY_SHARE:
        pytest.skip("one busy core is not a busy machine here")
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump(small_case()))
    args = ["calibrate", "--out", str(tmp_path / "p.yaml"), "--quick"] if command == "calibrate" else \
        ["validate", str(case), "--profile", str(profile)]
    run = subprocess.run([sys.executable, "-m", "planner", *args], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 2 and "host: other processes use" in run.stderr and "--allow-busy" in run.stderr, \
        run.stderr
    assert not (tmp_path / "p.yaml").exists()
