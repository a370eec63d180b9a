"""The one exception users of the CLI and the Python API see for bad input."""

from __future__ import annotations

import reprlib

from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from .limits import MAX_MESSAGE_PART


def one_line(text: object, limit: int = MAX_MESSAGE_PART) -> str:
    """``text`` on one line of at most ``limit`` characters: line breaks and other
    unprintable characters (a key or a file name may hold them) shown escaped."""
    text = str(text)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_SHORT = reprlib.Repr()  # Python 3.11's takes no limits as arguments
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 3, 60, 60, 60
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = _SHORT.maxfrozenset = 6


def as_typed(text: str, head: int = 40) -> str:
    """A value as a user typed it, quoted, on one short line: past 60 characters (a 5,000-digit
    number) its first ``head`` and its length, so that a refusal says what was given, not what
    float() made of it (inf) nor the whole of it."""
    return repr(text) if len(text) <= 60 else f"'{text[:head]}…' ({len(text):,} characters)"


def safe_repr(value: object) -> str:
    """``repr(value)``, or what it is where Python cannot show it: a list of a list ... a thousand deep,
    built in Python, raised a RecursionError from the message that would name it, and an integer of
    5,000 digits a ValueError (Python's limit on integer-string conversion)."""
    if isinstance(value, int) and value.bit_length() > 200:  # past Python's digit limit its repr raises ValueError
        return f"<an integer of {value.bit_length()} bits>"
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        # A container's repr may grow past any bound (one list shared by another forty times over is
        # 2^40 elements to show): a message quotes its first few, a few levels deep (reprlib).
        return _SHORT.repr(value)
    try:
        return repr(value)
    except RecursionError:
        return f"<{type(value).__name__} nested too deeply to show>"
    except ValueError:  # an integer nested in a container, past the digit limit
        return f"<{type(value).__name__} holding an integer too long to show>"


class CaseError(Exception):
    """Bad input: one line naming the file, the key and what was expected.

    The CLI prints ``str(error)`` and exits with code 2; the Python API raises it
    as is, so both say the same thing.
    """

    def __init__(self, source: str, key: str, expected: str):
        self.source = one_line(source)
        self.key = one_line(key)
        self.expected = one_line(expected, 2 * MAX_MESSAGE_PART)
        where = f"{self.source}: {self.key}" if self.key else self.source
        super().__init__(f"{where}: {self.expected}")

    def __reduce__(self):
        # Rebuilt from its three parts (an Exception pickles its args, here the joined message, and
        # CaseError takes three): a process pool hands a worker's refusal back to its caller.
        return type(self), (self.source, self.key, self.expected)


# How an error names an option its caller gave: the CLI's flag, or the API's argument, as
# (source, key): ("--stage-layers", "") or ("read_config", "stage_layers").
Argument = Callable[[str], tuple[str, str]]


def cli_flag(option: str) -> tuple[str, str]:
    """The CLI's name of an option in an error: its flag (``--stage-layers``), no key."""
    return f"--{option.replace('_', '-')}", ""


def api_argument(call: str, spelled: Optional[dict[str, str]] = None) -> Argument:
    """The Python API's name of an option in an error: (the call, its argument), the argument
    spelled as the call spells it where ``spelled`` says (``from_logs`` → ``logs``)."""
    return lambda option: (call, (spelled or {}).get(option, option))


def named(argument: Argument, option: str) -> str:
    """An option as a message says it: the CLI's flag, or the API's argument."""
    src, key = argument(option)
    return key or src


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the CLI: it exits 130 or 143, having written nothing.

    A BaseException other than KeyboardInterrupt, so that no ``except Exception`` swallows
    it and typer, which turns a KeyboardInterrupt into a bare exit code, lets it through
    to the CLI's entry point. Clean-up code (``finally``, ``except BaseException``) runs
    on the way out as for any exception.
    """


# The interrupts the CLI's handler raised (``interrupt``). Python drops an exception raised where
# it cannot propagate, such as a weakref callback that runs inside an import, and prints "Exception
# ignored": the command would go on and write its files. So each one is also kept here, and checked
# before any file is written and before the CLI reports success.
_RECEIVED: list[str] = []
# The signals the CLI answers as interrupts: Ctrl-C, `kill`, and the terminal closing (SIGHUP, whose
# default death would leave a calibration's run folder behind). Each ends a command with 128 + its
# number, "interrupted", nothing written and no process left. Named in the entry point, which sets
# its handlers before this module loads.
from .entry import INTERRUPTS  # noqa: E402
_DEFERRING = [0]  # depth of interrupts_deferred blocks now running


def interrupt(name: str) -> None:
    """Record the interrupt ``name`` (SIGINT, SIGTERM, SIGHUP) and raise it, unless a clean-up that
    must run to its end is running (:func:`interrupts_deferred`), or an interrupt is being answered
    already: a second Ctrl-C landing in an ``except`` or ``finally`` that handles the first (the CLI's
    own, saying "interrupted") raised out of it, a traceback of two interrupts and exit 1. The first
    decides the exit code."""
    import sys

    _RECEIVED.append(name)
    if not _DEFERRING[0] and not isinstance(sys.exc_info()[1], (Interrupted, KeyboardInterrupt)):
        raise Interrupted(name)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """A clean-up that must run to its end: a process tree frozen and then killed (cut short between
    the two, it stays frozen for good), a run folder removed. An interrupt arriving meanwhile (a
    second Ctrl-C ten milliseconds after the first, whose clean-up this is) is recorded, not raised;
    where none was recorded before the block, it is raised once the block is done."""
    before = len(_RECEIVED)
    _DEFERRING[0] += 1
    try:
        yield
    finally:
        _DEFERRING[0] -= 1
    if not before and _RECEIVED and not _DEFERRING[0]:  # reached only where the block raised nothing
        raise Interrupted(_RECEIVED[0])


def raise_if_interrupted() -> None:
    """Raise an interrupt recorded by :func:`interrupt` that something swallowed."""
    if _RECEIVED:
        raise Interrupted(_RECEIVED[0])


def interrupt_received() -> bool:
    """Whether :func:`interrupt` recorded a signal in this command."""
    return bool(_RECEIVED)


def interrupted_exit_code() -> int:
    """The exit code of a command ended by a signal, as a shell reports one: 128 + its number, 130
    for Ctrl-C (SIGINT, also where Python raised KeyboardInterrupt itself), 143 for SIGTERM, 129 for
    SIGHUP."""
    import signal

    return 128 + int(getattr(signal, _RECEIVED[0], signal.SIGINT)) if _RECEIVED else 130


def forget_interrupts() -> None:
    """A new command starts with none recorded."""
    _RECEIVED.clear()


def ignore_interrupts() -> None:
    """From here on the process ignores Ctrl-C, SIGTERM and SIGHUP (the CLI's main thread only): its files
    are written, so a signal can no longer leave "nothing written" and exit 130 with them in place
    would say it had; or it is exiting, where Python's shutdown puts its own handlers back to the
    default, under which a late signal killed it by the signal with no word."""
    import signal

    for name in INTERRUPTS:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
