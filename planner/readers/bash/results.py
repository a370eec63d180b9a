"""What reading a script gives back: the commands it would start, and notes on how it was read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


# The name of the environment entry ``env -i`` (or ``exec -c``) leaves in a Command's environment: every
# variable before it is out of the started command's environment, the caller's too.
EMPTIED = ""


@dataclass(frozen=True)
class Command:
    """A command the script would start, its words as the program receives them."""
    fields: tuple[str, ...]
    line: int
    unset: tuple[str, ...] = ()  # variables its words read that nothing set (read as empty)
    not_run: tuple[str, ...] = ()  # command substitutions in its words, never run (read as empty)
    defaulted: tuple[tuple[str, str], ...] = ()  # (NAME, default): unset variables whose ${X:-default} it took
    # (NAME, value, decided, conditional): the scalar variables its environment holds from the script (those exported,
    # and its own NAME=value prefixes); decided where the value owes nothing to what the script does not set;
    # value None: a name the script unset (and did not export again), or env -u took out, decidedly not in
    # it; NAME EMPTIED: env -i or exec -c, nothing before it reaches the command. What env(1) sets or takes
    # out is read through the commands that start another (exec, nohup, nice, srun ... env -u X torchrun);
    # conditional: a value the script set without export, there only if the caller's environment exported the
    # name (bash exports what it inherits: Bash Reference Manual, 3.7.4 Environment), else absent; an array:
    # value None, decidedly (bash exports none)
    environment: tuple[tuple[str, Optional[str], bool, bool], ...] = ()


@dataclass(frozen=True)
class Note:
    text: str
    flags: Optional[tuple[str, ...]] = ()  # the --flags in the branches it decides between (None: any)


@dataclass
class Script:
    commands: list[Command]
    notes: list[Note]
