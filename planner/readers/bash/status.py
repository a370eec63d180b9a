"""What a command leaves: its status where it can be known, the outcome read where it cannot; and
the exits, returns and loop controls that unwind the interpreter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class _Status:
    known: Optional[bool]  # None: cannot be decided without running something
    assumed: bool  # the outcome read where it cannot be decided
    deps: dict = field(default_factory=dict)
    reason: str = ""
    test: bool = False  # a test ([, [[, ((), not a command's exit status


_TRUE = _Status(True, True)
_FALSE = _Status(False, False)


class _Exit(Exception):
    """``exit [N]``: the status it leaves, where the script says it (``exit 1``); else None (``exit`` alone
    leaves the last command's, ``exit $RC`` what the script does not set)."""

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
