"""Hypothesis profiles: `quick` on every run (the README's suite), `thorough` for a scheduled one
(HYPOTHESIS_PROFILE=thorough pytest tests/test_invariants.py). Both fixed-seed."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(derandomize=True, deadline=None,
               suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
settings.register_profile("quick", max_examples=150, **_COMMON)
settings.register_profile("thorough", max_examples=1500, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))
