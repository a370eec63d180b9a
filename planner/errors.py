"""The one exception users of the CLI and the Python API see for bad input."""

from __future__ import annotations


class CaseError(Exception):
    """Bad input: one line naming the file, the key and what was expected.

    The CLI prints ``str(error)`` and exits with code 2; the Python API raises it
    as is, so both say the same thing.
    """

    def __init__(self, source: str, key: str, expected: str):
        self.source = source
        self.key = key
        self.expected = expected
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {expected}")
