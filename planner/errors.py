"""The one exception users of the CLI and the Python API see for bad input."""

from __future__ import annotations

from .limits import MAX_MESSAGE_PART


def one_line(text: object, limit: int = MAX_MESSAGE_PART) -> str:
    """``text`` on one line of at most ``limit`` characters: line breaks and other
    unprintable characters (a key or a file name may hold them) shown escaped."""
    text = str(text)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the CLI: it exits 130, having written nothing.

    A BaseException other than KeyboardInterrupt, so that no ``except Exception`` swallows
    it and typer, which turns a KeyboardInterrupt into a bare exit code, lets it through
    to the CLI's entry point. Clean-up code (``finally``, ``except BaseException``) runs
    on the way out as for any exception.
    """
