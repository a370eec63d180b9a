"""The bounds of the reading, and the errors that stop it."""

from __future__ import annotations

# Bounds of the reading itself, far above any launch script: the script's length (as a variable's,
# MAX_EXPANDED_CHARS) and its words, the commands followed (loop iterations and function calls
# included), nesting of function calls and arithmetic look-ups, and the work of one pattern match
# (``${X%pattern}``, ``case``): value length squared times pattern length.
MAX_WORDS = 200_000
MAX_STEPS = 10_000
MAX_DEPTH = 100
MAX_PATTERN_WORK = 4_000_000
# Characters the whole reading may expand, every expansion counted: each stays under
# MAX_EXPANDED_CHARS, but a loop that splits a long variable on every turn did 10,000 of them
# (``while :; do B=($A); done`` over 500,000 characters: a hundred minutes).
MAX_EXPANSION_WORK = 5_000_000
MAX_NOTES = 20  # notes kept; the rest are counted


class ScriptError(Exception):
    """What stops the reading: ``key`` names the variable or the line."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


class ScriptSyntax(ScriptError):
    """A script bash could not parse (or a construct this reader does not parse)."""


class ScriptLimit(ScriptError):
    """A script that expands, loops or recurses past the bounds."""


class ScriptUnfollowed(ScriptError):
    """A construct bash runs that this reader does not follow, where reading past it would give the launch
    other words or another environment than bash gives it: refused, naming the line and the construct."""
