"""Every value that reaches a generated file, written so that it stays what it is.

A name from a case file or a Hugging Face config (``model.name``, ``_name_or_path``), a
file name, a profile's device string: none of it may become a line of shell or Python.
One helper per output language:

- comments (``#`` in shell, Python and the argument files): :func:`comment_text` keeps a
  line on its line, showing line breaks and other control characters escaped;
- shell words: :func:`shell_word` (``shlex.quote``);
- Python literals: :func:`python_literal` (``repr`` of plain data only);
- JSON: ``json.dumps`` escapes every string, so ds_config.json needs nothing more;
- the argument files that launch.sh splits into words unquoted (``megatron_args.txt``,
  ``overrides.txt``): :func:`argument_word` refuses anything but a plain token.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from ..errors import CaseError

# Plain tokens: flags, numbers, module paths, a pipeline layout (``Et*3|t*4,L``), an MoE layer
# pattern (``([0]*3+[1]*58)``). launch.sh reads these files with globbing off (set -f), so '*'
# and brackets stay literal.
_PLAIN = re.compile(r"[A-Za-z0-9_.,:|*()+=/@%\[\]-]+")


def comment_text(line: str) -> str:
    """``line`` as the text of one comment line: nothing in it can end the comment."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(line))


def comment(lines: list[str], marker: str = "#") -> str:
    """Comment lines, ``marker`` first, a bare marker for an empty line."""
    return "".join(f"{marker} {comment_text(line)}".rstrip() + "\n" for line in lines)


def shell_word(value: Any) -> str:
    """One shell word that expands to exactly ``value``."""
    return shlex.quote(str(value))


def python_literal(value: Any) -> str:
    """A Python literal of plain data (str, int, float, bool, None, lists, tuples, dicts of them)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(python_literal(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{python_literal(k)}: {python_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"not plain data: {type(value).__name__}")


def argument_word(engine: str, value: Any) -> str:
    """``value`` as one word of an argument file, or a CaseError if the shell would split or expand it."""
    text = str(value)
    if not _PLAIN.fullmatch(text):
        raise CaseError("--emit", engine, f"the argument {text!r} would not reach the launcher as one word; "
                                          "expected letters, digits and .,:|*()+=/@%[]-")
    return text
