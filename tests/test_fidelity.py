"""The cost model's fidelity on the published runs, pinned where it stands.

A later change to the model may improve these figures (then tighten the pins); it may not
lose fidelity silently. The pins are the figures of `python bench/fidelity.py` (README),
with a margin of half a point for the noise-free but order-sensitive sweep measures.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner.fidelity import evaluate, spearman

# Mean |error| of tokens/s per source (fractions), as measured when pinned.
THROUGHPUT = {
    "Korthikanti et al. 2022": 0.049,
    "MLPerf Training v5.0 results": 0.078,
    "NVIDIA/NeMo docs/source/performance/pe": 0.045,
    "Narayanan et al. 2021": 0.085,
    "The Ultra-Scale Playbook: Training LLM": 0.177,
    "TorchAO MX formats README: training e2": 0.702,
    "TorchAO float8 training README: e2e tr": 0.281,
    "bigscience-workshop/bigscience train/t": 0.682,
    "mosaicml/llm-foundry scripts/train/ben": 0.051,
    "torchtitan docs/performance.md": 0.030,
}
MEMORY = {
    "The Ultra-Scale Playbook: Training LLM": 0.201,
    "TorchAO MX formats README: training e2": 0.346,
    "TorchAO float8 training README: e2e tr": 0.110,
}
MEDIAN_REGRET, MEDIAN_RHO = 0.136, 0.746
MEDIAN_CLAIMED_GAIN, EXPERTS_NOT_FITTING = 0.015, 0
SLACK = 0.005


@pytest.fixture(scope="module")
def fidelity():
    return evaluate()


@pytest.mark.parametrize("source", sorted(THROUGHPUT))
def test_throughput_error_per_source_does_not_grow(fidelity, source):
    assert fidelity.throughput[source].mean_abs <= THROUGHPUT[source] + SLACK


@pytest.mark.parametrize("source", sorted(MEMORY))
def test_memory_error_per_source_does_not_grow(fidelity, source):
    assert fidelity.memory[source].mean_abs <= MEMORY[source] + SLACK


def test_sweeps_rank_no_worse(fidelity):
    assert len(fidelity.sweeps) == 19
    assert fidelity.median_regret <= MEDIAN_REGRET + SLACK
    assert fidelity.median_rho >= MEDIAN_RHO - SLACK


def test_plan_claims_no_more_over_tuned_recipes(fidelity):
    assert fidelity.experts_scored == 34
    assert fidelity.median_gain <= MEDIAN_CLAIMED_GAIN + SLACK
    assert len(fidelity.expert_misfits) <= EXPERTS_NOT_FITTING


def test_spearman_is_one_for_the_same_order_and_minus_one_reversed():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0


def test_validate_published_runs_from_a_fresh_clone_with_no_argument():
    """The data ships in the package: the CLI needs no path, and its JSON carries all four measures."""
    run = subprocess.run([sys.executable, "-m", "planner", "validate-published", "--json", "--no-experts"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert set(out) >= {"throughput", "memory", "sweeps", "experts"}
    assert out["throughput"]["by_source"]["Narayanan et al. 2021"]["count"] == 20
    assert len(out["sweeps"]["sweeps"]) == 19
