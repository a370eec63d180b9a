"""Preset lookup: GPUs and models are YAML data files beside this module, not code."""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path

import yaml

from .files import SAFE_LOADER

PRESET_DIR = Path(__file__).parent / "presets"


@lru_cache(maxsize=None)
def _load(kind: str) -> dict:
    with open(PRESET_DIR / f"{kind}.yaml", encoding="utf-8") as f:
        return yaml.load(f, Loader=SAFE_LOADER)


def gpu_presets() -> dict[str, dict]:
    return _load("gpus")


def model_presets() -> dict[str, dict]:
    return _load("models")


def performance_presets() -> dict[str, dict]:
    return _load("performance")


def fabric_presets() -> dict[str, dict]:
    return _load("fabrics")


def closest(name: str, choices) -> str:
    """' (did you mean X?)' for the nearest valid name, or '' when nothing is near."""
    match = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""
