"""The case-file reference (docs/case-reference.md) lists exactly the keys the case reader accepts: one schema
(``planner.case`` and ``planner.search_options``), documented once, with nothing missing or stale."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from planner.case import LAYOUT_KEYS, MODEL_KEYS, OVERHEAD_KEYS, SECTIONS, TRAINING_KEYS
from planner.case_cluster import CLUSTER_KEYS, PERFORMANCE_KEYS
from planner.search_options import BOUNDED, SEARCH_KEYS

CASE_REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "case-reference.md"
SCHEMA = {"model": MODEL_KEYS, "cluster": CLUSTER_KEYS, "training": TRAINING_KEYS, "layout": LAYOUT_KEYS,
          "search": SEARCH_KEYS, "overheads": OVERHEAD_KEYS}
# `model` also takes a preset or a Hugging Face config.json, which the reference documents in prose.
PROSE_KEYS = {"model": {"preset", "hf_config"}}


def documented_keys(section: str) -> set[str]:
    """The keys in the first column of the reference's table for ``section``, with its
    ``min_X, max_X for X in …`` row spelled out."""
    text = CASE_REFERENCE.read_text()
    body = re.split(rf"^## `{section}`.*$", text, flags=re.M)[1]
    body = re.split(r"^##", body, flags=re.M)[0]
    keys: set[str] = set()
    for row in re.findall(r"^\| ([^|]*(?:\\\|[^|]*)*) \|", body, flags=re.M):
        names = re.findall(r"`([a-z_0-9X]+)`", row)
        if "min_X" in names:
            xs = [n for n in names if n not in ("min_X", "max_X")]
            keys |= {f"{side}_{x}" for x in xs for side in ("min", "max")}
        else:
            keys |= set(names)
    return keys


def test_every_section_has_a_reference_table():
    assert set(SCHEMA) == set(SECTIONS)


@pytest.mark.parametrize("section", sorted(SCHEMA))
def test_the_reference_table_lists_exactly_the_keys_the_reader_accepts(section):
    assert documented_keys(section) == set(SCHEMA[section]) - PROSE_KEYS.get(section, set())


def test_the_bounds_row_names_every_bounded_variable():
    assert {k[4:] for k in documented_keys("search") if k.startswith("min_")} == set(BOUNDED)


def test_the_performance_row_names_every_achieved_figure():
    row = next(line for line in CASE_REFERENCE.read_text().splitlines() if line.startswith("| `performance` |"))
    named = set(re.findall(r"`([a-z_0-9]+)`", row))
    assert set(PERFORMANCE_KEYS) <= named
