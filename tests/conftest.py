"""Suite-wide settings.

Hypothesis profiles: `quick` on every run (the README's suite), `thorough` for a scheduled one
(HYPOTHESIS_PROFILE=thorough pytest tests/test_invariants.py tests/test_plan_oracle.py, which also
checks 100 generated cases against the brute-force oracle rather than 40). Both fixed-seed.

The suite runs in parallel (pytest-xdist, ``addopts`` in pyproject.toml). A test that measures
how busy the machine is (``@pytest.mark.exclusive``) must not share it with the other workers'
tests: it takes a lock that every other test holds shared, so it runs alone.
"""

from __future__ import annotations

import fcntl
import os

import pytest
from hypothesis import HealthCheck, settings

_COMMON = dict(derandomize=True, deadline=None,
               suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
settings.register_profile("quick", max_examples=150, **_COMMON)
settings.register_profile("thorough", max_examples=1500, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))


@pytest.fixture(autouse=True)
def _machine_shared_or_alone(request, tmp_path_factory):
    """A readers-writer lock over the workers of one run (files in the run's shared temporary
    folder). An exclusive test first takes the turnstile, so that tests starting after it wait
    rather than keep the machine busy for ever."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    alone = request.node.get_closest_marker("exclusive") is not None
    shared = tmp_path_factory.getbasetemp().parent  # each worker's base folder sits in the run's one
    with open(shared / "machine.turnstile", "a") as turnstile, open(shared / "machine.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

