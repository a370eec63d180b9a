"""The training engines the planner targets, one module each: what the engine can run (the
search's constraints), how it runs it (the cost models' data), and the rules its own code
enforces, with the reason each gives. Emitters and config readers refuse what these say.

Adding or updating an engine touches its module alone.
"""

from __future__ import annotations

from . import deepspeed, generic, megatron, nanotron, torchtitan
from .base import Engine, EngineSupport

ENGINES: dict[str, Engine] = {e.name: e for e in (megatron.ENGINE, deepspeed.ENGINE, torchtitan.ENGINE,
                                                   nanotron.ENGINE, generic.ENGINE)}
NAMES = tuple(ENGINES)


def behaviour_of(name: str):
    """The cost models' view of the engine ``name``."""
    return ENGINES[name].behaviour


__all__ = ["ENGINES", "NAMES", "Engine", "EngineSupport", "behaviour_of"]
