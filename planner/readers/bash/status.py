"""What a command leaves: its status where it can be known, the outcome read where it cannot; and
the exits, returns and loop controls that unwind the interpreter."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class _Status:
    known: Optional[bool]  # None: cannot be decided without running something
    assumed: bool  # the outcome read where it cannot be decided
    deps: dict = field(default_factory=dict)
    reason: str = ""
    test: bool = False  # a test ([, [[, ((), not a command's exit status
    # The exit status bash leaves where it failed decidedly (known False), which $? expands to: `false`'s 1,
    # `exit 3`'s 3, env's 127 for a command not found; None where it failed with a status the reading does not
    # follow (a `[` bash may refuse with 2), read as 1 and said.
    code: Optional[int] = None


_TRUE = _Status(True, True)
_FALSE = _Status(False, False, code=1)


def _failed(code: int, deps: Optional[dict] = None, test: bool = False) -> _Status:
    """A decided failure with the status ``code`` bash leaves."""
    return _Status(False, False, dict(deps or {}), test=test, code=code)


def _stated(args: list[str], last: _Status, decided: bool) -> Optional[_Status]:
    """The status ``exit [N]`` or ``return [N]`` leaves (Bash Reference Manual, 4.1 Bourne Shell Builtins):
    N mod 256 (``exit -1``: 255), 2 for a word that is no number ("numeric argument required"), the last
    command's where N is left out; None where N is what the script does not set (``exit $RC``)."""
    if not decided:
        return None
    if not args:
        return last
    word = args[0].strip()
    if not re.fullmatch(r"[-+]?[0-9]+", word):
        return _failed(2)
    code = int(word) % 256
    return _TRUE if code == 0 else _failed(code)


class _Exit(Exception):
    """``exit [N]``: the status it leaves (:func:`_stated`); None where the script does not decide it
    (``exit $RC``)."""

    def __init__(self, status: Optional[_Status] = None):
        super().__init__()
        self.status = status


class _Return(Exception):
    def __init__(self, status: _Status):
        super().__init__()
        self.status = status


class _LoopControl(Exception):
    def __init__(self, kind: str, levels: int):
        super().__init__(kind)
        self.kind, self.levels = kind, levels


def _k3_and(a: Optional[bool], b: Optional[bool]) -> Optional[bool]:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _k3_or(a: Optional[bool], b: Optional[bool]) -> Optional[bool]:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False
