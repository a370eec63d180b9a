"""``[[ WORD =~ REGEX ]]``: a POSIX extended regular expression (regcomp(3) without REG_NEWLINE, as bash
compiles it) in the common subset Python's ``re`` reads alike, translated; None for what ``re`` would
read otherwise (a back-reference, GNU's ``\\w``/``\\<`` escapes, collating elements, a ``(?``), which
then cannot be decided without running bash."""

from __future__ import annotations

import re
from typing import Optional

# POSIX character classes, in the C locale.
_CLASSES = {"alpha": "a-zA-Z", "digit": "0-9", "alnum": "a-zA-Z0-9", "upper": "A-Z", "lower": "a-z",
            "space": " \\t\\n\\r\\f\\v", "blank": " \\t", "xdigit": "0-9A-Fa-f", "word": "a-zA-Z0-9_",
            "punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"), "cntrl": "\\x00-\\x1f\\x7f",
            "print": "\\x20-\\x7e", "graph": "\\x21-\\x7e"}
_INTERVAL = re.compile(r"\{(\d+)(,(\d*))?\}")


def _bracket(chars: list[tuple[str, bool]], i: int) -> Optional[tuple[str, int]]:
    """The Python class of the bracket expression opening at ``i``, and the index after it."""
    j, n = i + 1, len(chars)
    out = ["["]
    if j < n and chars[j][0] == "^":
        out.append("^")
        j += 1
    first = True
    while j < n:
        c = chars[j][0]
        if c == "]" and not first:
            out.append("]")
            return "".join(out), j + 1
        first = False
        if c == "[" and j + 1 < n and chars[j + 1][0] in ":.=":
            kind = chars[j + 1][0]
            text = "".join(ch for ch, _ in chars[j + 2:])
            end = text.find(kind + "]")
            if kind != ":" or end < 0 or text[:end] not in _CLASSES:
                return None  # a collating element or an equivalence class: locale-bound
            out.append(_CLASSES[text[:end]])
            j += 2 + end + 2
            continue
        if j + 2 < n and chars[j + 1][0] == "-" and chars[j + 2][0] != "]":
            low, high = c, chars[j + 2][0]
            if high == "[" or ord(low) > ord(high):
                return None
            out.append(re.escape(low) + "-" + re.escape(high))
            j += 3
            continue
        out.append(re.escape(c))  # a backslash is a character of its own in a bracket expression
        j += 1
    return None  # unterminated: regcomp refuses it


def ere_to_python(chars: list[tuple[str, bool]]) -> Optional[str]:
    """The Python pattern of the ERE whose characters are ``chars`` ((character, quoted): a quoted
    one, from a quote or a backslash in the script, matches itself), or None where ``re`` would
    read it otherwise than regcomp."""
    out: list[str] = []
    i, n = 0, len(chars)
    quantified = False  # the last thing written was a quantifier
    while i < n:
        c, quoted = chars[i]
        if quoted:
            out.append(re.escape(c))
            i += 1
            quantified = False
            continue
        if c == "\\":
            if i + 1 >= n or chars[i + 1][0].isalnum():
                return None  # \1 (a back-reference), \w, \< ...: GNU's, read otherwise by re
            out.append(re.escape(chars[i + 1][0]))
            i += 2
            quantified = False
            continue
        if c == "[":
            found = _bracket(chars, i)
            if found is None:
                return None
            out.append(found[0])
            i = found[1]
            quantified = False
            continue
        if c in "*+?" or c == "{":
            if quantified:
                return None  # a*? is lazy in re, a repeated repetition in POSIX
            if c == "{":
                interval = _INTERVAL.match("".join(ch for ch, _ in chars[i:i + 24]))
                if interval is None:
                    return None
                out.append(interval.group(0))
                i += len(interval.group(0))
            else:
                out.append(c)
                i += 1
            quantified = True
            continue
        if c == "(" and i + 1 < n and chars[i + 1] == ("?", False):
            return None
        out.append(r"\Z" if c == "$" else c)  # $ is the end alone: re's $ also matches before a last newline
        i += 1
        quantified = False
    return "".join(out)


def ere_search(chars: list[tuple[str, bool]], text: str) -> Optional[bool]:
    """Whether the ERE matches somewhere in ``text``, as bash's ``=~``; None where it cannot be
    said without bash (see :func:`ere_to_python`; a pattern regcomp would refuse makes the test
    fail with status 2 in bash, and is left undecided here too)."""
    pattern = ere_to_python(chars)
    if pattern is None:
        return None
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except re.error:
        return None
    return compiled.search(text) is not None
