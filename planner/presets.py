"""Preset lookup: GPUs and models are YAML data files beside this module, not code."""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path

from .errors import CaseError
from .inputs import load_yaml

PRESET_DIR = Path(__file__).parent / "presets"

# The names people write for a GPU, lower-cased, to its preset. A name that fits several
# presets (a100: 40 GB or 80 GB) maps to all of them, and is answered with the choice.
GPU_ALIASES: dict[str, tuple[str, ...]] = {
    "v100": ("v100-sxm-32gb",), "v100-32gb": ("v100-sxm-32gb",), "v100-sxm": ("v100-sxm-32gb",),
    "a100": ("a100-sxm-80gb", "a100-sxm-40gb"), "a100-sxm": ("a100-sxm-80gb", "a100-sxm-40gb"),
    "a100-80gb": ("a100-sxm-80gb",), "a100-40gb": ("a100-sxm-40gb",),
    "h100": ("h100-sxm-80gb",), "h100-sxm": ("h100-sxm-80gb",), "h100-80gb": ("h100-sxm-80gb",),
    "h200": ("h200-sxm-141gb",), "h200-sxm": ("h200-sxm-141gb",), "h200-141gb": ("h200-sxm-141gb",),
    "b200-sxm": ("b200",), "gb200-nvl72": ("gb200",), "gb300-nvl72": ("gb300",),
    "mi300": ("mi300x",), "mi300x-oam": ("mi300x",),
    "h800-sxm": ("h800",), "h800-80gb": ("h800",), "b300-sxm": ("b300",), "hgx-b300": ("b300",),
    "mi325": ("mi325x",), "mi355": ("mi355x",),
}

# Mixture-of-experts keys (case files, Hugging Face and Megatron spellings): the cost
# models are for dense transformers, and a near miss like num_layers would mislead.
MOE_KEYS = ("num_experts", "num_local_experts", "num_experts_per_tok", "n_routed_experts", "n_shared_experts",
            "experts_per_token", "expert_parallel", "expert_model_parallel_size", "ep", "top_k_experts")


@lru_cache(maxsize=None)
def _load(kind: str) -> dict:
    path = PRESET_DIR / f"{kind}.yaml"
    return load_yaml(path.read_text(encoding="utf-8"), str(path))


def gpu_presets() -> dict[str, dict]:
    return _load("gpus")


def model_presets() -> dict[str, dict]:
    return _load("models")


def performance_presets() -> dict[str, dict]:
    return _load("performance")


def fabric_presets() -> dict[str, dict]:
    return _load("fabrics")


def gpu_preset_name(name: str) -> tuple[str, ...]:
    """The presets ``name`` may mean: itself, or what its alias (any case) stands for; () if none."""
    presets = gpu_presets()
    if name in presets:
        return (name,)
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    if key in presets:
        return (key,)
    return GPU_ALIASES.get(key, ())


def resolve_gpu_preset(source: str, key: str, name: str) -> str:
    """The GPU preset ``name`` stands for, or a CaseError that names the choices."""
    found = gpu_preset_name(name)
    if len(found) == 1:
        return found[0]
    presets = gpu_presets()
    hint = f" (did you mean {' or '.join(repr(p) for p in found)}?)" if found else closest(name, presets)
    raise CaseError(source, key, f"unknown GPU preset {name!r}{hint}; expected one of {', '.join(presets)}")


def closest(name: str, choices) -> str:
    """' (did you mean X?)' for a close valid name, or '' when nothing is close."""
    if is_moe_key(name):
        return " (mixture-of-experts models are not supported yet: the planner models dense transformers)"
    match = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.75)
    return f" (did you mean {match[0]!r}?)" if match else ""


def is_moe_key(name: object) -> bool:
    text = str(name).lower()
    return text in MOE_KEYS or text.startswith("moe_") or "expert" in text
