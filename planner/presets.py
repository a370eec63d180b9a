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
    "h800-sxm": ("h800",), "h800-80gb": ("h800",),
    "h200": ("h200-sxm-141gb",), "h200-sxm": ("h200-sxm-141gb",), "h200-141gb": ("h200-sxm-141gb",),
    "b200-sxm": ("b200",), "gb200-nvl72": ("gb200",), "gb300-nvl72": ("gb300",),
    "mi300": ("mi300x",), "mi300x-oam": ("mi300x",),
    "h800-sxm": ("h800",), "h800-80gb": ("h800",), "b300-sxm": ("b300",), "hgx-b300": ("b300",),
    "mi325": ("mi325x",), "mi355": ("mi355x",),
}

# Mixture-of-experts keys as Hugging Face and Megatron spell them, to the case file's own.
MOE_SPELLINGS = {"num_local_experts": "num_experts", "n_routed_experts": "num_experts",
                 "num_moe_experts": "num_experts", "num_experts_per_tok": "moe_top_k",
                 "experts_per_token": "moe_top_k", "moe_router_topk": "moe_top_k", "top_k": "moe_top_k",
                 "moe_intermediate_size": "moe_ffn_hidden_size", "n_shared_experts": "moe_shared_expert_ffn_hidden_size",
                 "shared_expert_intermediate_size": "moe_shared_expert_ffn_hidden_size",
                 "moe_shared_expert_intermediate_size": "moe_shared_expert_ffn_hidden_size",
                 "first_k_dense_replace": "moe_first_dense_layers", "expert_model_parallel_size": "ep",
                 "expert_parallel": "ep", "expert_tensor_parallel_size": "etp", "qk_nope_head_dim": "qk_head_dim",
                 "capacity_factor": "moe_capacity_factor", "moe_expert_capacity_factor": "moe_capacity_factor",
                 "n_group": "moe_router_num_groups", "topk_group": "moe_router_group_topk",
                 "routed_scaling_factor": "moe_router_topk_scaling",
                 "moe_router_topk_scaling_factor": "moe_router_topk_scaling"}


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
    spelled = MOE_SPELLINGS.get(str(name).lower())
    if spelled is not None and spelled in choices:
        return f" (the case file spells it {spelled!r})"
    # Compared in lower case: the keys are all lower case, and a key typed in another case ('EP',
    # 'eTp') is otherwise nearer a shorter key it merely shares letters with ('ep' for 'eTp'), or none.
    by_lower = {str(choice).lower(): choice for choice in reversed(list(choices))}
    match = difflib.get_close_matches(str(name).lower(), list(by_lower), n=1, cutoff=0.75)
    return f" (did you mean {by_lower[match[0]]!r}?)" if match else ""
