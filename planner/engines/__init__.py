"""The training engines the planner targets, one module each: what the engine can run (the
search's constraints), how it runs it (the cost models' data), and the rules its own code
enforces, with the reason each gives. Emitters and config readers refuse what these say.

Adding or updating an engine touches its module alone, and its emitter and reader where it has
them (``Engine.emitter``, ``Engine.reader``: one registry, this one).
"""

from __future__ import annotations

from . import deepspeed, generic, megatron, nanotron, torchtitan
from .base import Engine, EngineSupport

ENGINES: dict[str, Engine] = {e.name: e for e in (megatron.ENGINE, deepspeed.ENGINE, torchtitan.ENGINE,
                                                   nanotron.ENGINE, generic.ENGINE)}
NAMES = tuple(ENGINES)
# The engines the planner writes launch files for, and those whose configs it reads back.
EMITTING = tuple(sorted(name for name, engine in ENGINES.items() if engine.emitter))
READING = tuple(sorted(name for name, engine in ENGINES.items() if engine.reader))


def behaviour_of(name: str):
    """The cost models' view of the engine ``name``."""
    return ENGINES[name].behaviour


__all__ = ["EMITTING", "ENGINES", "NAMES", "READING", "Engine", "EngineSupport", "behaviour_of"]
