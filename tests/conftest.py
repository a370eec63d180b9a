"""Suite-wide settings.

Hypothesis profiles: `quick` on every run (the README's test command), `thorough` for a scheduled one
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A readers-writer lock over the workers of one run, held from a test's set-up (its module's
    fixtures included: one computes for a minute) to its tear-down. An exclusive test first takes
    the turnstile, so that tests starting after it wait rather than keep the machine busy for
    ever. The files live in the run's temporary folder, which every worker's sits in."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    alone = item.get_closest_marker("exclusive") is not None
    shared = item.config._tmp_path_factory.getbasetemp().parent
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


def pytest_collection_modifyitems(config, items):
    """Modules in the order the workers take them (xdist runs with --no-loadscope-reorder):
    those with a slow test first, so that the run does not end on a minute-long module while the
    other worker waits; the module with a test that runs alone last, when the other workers are on
    their last, short modules and it waits for little."""
    alone = {item.path for item in items if item.get_closest_marker("exclusive") is not None}
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: (item.path in alone, item.path not in slow))  # stable: the rest keep their order
