"""``[[ WORD =~ REGEX ]]``: a POSIX extended regular expression (regcomp(3) without REG_NEWLINE, as bash
compiles it; REG_ICASE under nocasematch) in the common subset Python's ``re`` reads alike, translated;
None for what ``re`` would
read otherwise (a back-reference, GNU's ``\\w``/``\\<`` escapes, collating elements, a ``(?``), which
then cannot be decided without running bash."""

from __future__ import annotations

import re

# POSIX character classes, in the C locale (glibc's regcomp knows these). Any other name, such as [[:word:]],
# which the C locale refuses (the test false, status 2), is left undecided: other locales define more.
_CLASSES = {"alpha": "a-zA-Z", "digit": "0-9", "alnum": "a-zA-Z0-9", "upper": "A-Z", "lower": "a-z",
            "space": " \\t\\n\\r\\f\\v", "blank": " \\t", "xdigit": "0-9A-Fa-f",
            "punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"), "cntrl": "\\x00-\\x1f\\x7f",
            "print": "\\x20-\\x7e", "graph": "\\x21-\\x7e"}
# What glibc's regcomp refuses in any locale (REG_ERANGE): bash's test is then false, status 2, and
# BASH_REMATCH is left as it was.
REFUSED = "refused"
_INTERVAL = re.compile(r"\{(\d+)(,(\d*))?\}")


def _bracket(chars: list[tuple[str, bool]], i: int):
    """The Python class of the bracket expression opening at ``i``, and the index after it; None
    where re would read it otherwise, REFUSED where regcomp refuses it."""
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
            if j + 1 < n and chars[j][0] == "-" and chars[j + 1][0] != "]":
                return REFUSED  # [[:digit:]-z]: a range from a class, which regcomp refuses
            continue
        if j + 2 < n and chars[j + 1][0] == "-" and chars[j + 2][0] != "]":
            low, high = c, chars[j + 2][0]
            if high == "[" or ord(low) > ord(high):
                return None
            out.append(re.escape(low) + "-" + re.escape(high))
            j += 3
            if j + 1 < n and chars[j][0] == "-" and chars[j + 1][0] != "]":
                return REFUSED  # [a-c-e]: a range's end starting another, which regcomp refuses
            continue
        out.append(re.escape(c))  # a backslash is a character of its own in a bracket expression
        j += 1
    return None  # unterminated: regcomp refuses it


def ere_to_python(chars: list[tuple[str, bool]], end: str = r"\Z"):
    """The Python pattern of the ERE whose characters are ``chars`` ((character, quoted): a quoted
    one, from a quote or a backslash in the script, matches itself), and whether its groups are plain
    (no alternation, no repeated group: re's first match of a given span is then the one POSIX's
    leftmost-longest rule picks, each quantifier repeating one character, the earlier ones taking the
    most); None where ``re`` would read it otherwise than regcomp, REFUSED where regcomp refuses it.
    ``end`` stands for an unquoted ``$``."""
    out: list[str] = []
    i, n = 0, len(chars)
    quantified = False  # the last thing written was a quantifier
    closed = False  # the last thing written was a group's )
    plain = True
    while i < n:
        c, quoted = chars[i]
        if quoted:
            out.append(re.escape(c))
            i += 1
            quantified = closed = False
            continue
        if c == "\\":
            if i + 1 >= n or chars[i + 1][0].isalnum():
                return None  # \1 (a back-reference), \w, \< ...: GNU's, read otherwise by re
            out.append(re.escape(chars[i + 1][0]))
            i += 2
            quantified = closed = False
            continue
        if c == "[":
            found = _bracket(chars, i)
            if found is None or found == REFUSED:
                return found
            out.append(found[0])
            i = found[1]
            quantified = closed = False
            continue
        if c in "*+?" or c == "{":
            if quantified:
                return None  # a*? is lazy in re, a repeated repetition in POSIX
            if closed:
                plain = False
            if c == "{":
                interval = _INTERVAL.match("".join(ch for ch, _ in chars[i:i + 24]))
                if interval is None:
                    return None
                out.append(interval.group(0))
                i += len(interval.group(0))
            else:
                out.append(c)
                i += 1
            quantified, closed = True, False
            continue
        if c == "(" and i + 1 < n and chars[i + 1] == ("?", False):
            return None
        if c == "|":
            plain = False
        out.append(end if c == "$" else c)  # $ is the end alone: re's $ also matches before a last newline
        i += 1
        quantified, closed = False, c == ")"
    return "".join(out), plain


# The longest text whose BASH_REMATCH is worked out (one fixed-span match per end tried).
MAX_REMATCH_TEXT = 4096


def ere_search(chars: list[tuple[str, bool]], text: str, icase: bool = False):
    """(whether the ERE matches somewhere in ``text``, as bash's ``=~``; BASH_REMATCH after it).
    The first is None where it cannot be said without bash (see :func:`ere_to_python`; a pattern
    regcomp would refuse makes the test fail with status 2 in bash, and is left undecided here
    too). BASH_REMATCH is the leftmost-longest match and its groups ("" for a group that took no
    part), [] where nothing matches (bash empties it), REFUSED where regcomp refuses the pattern
    (the test is false and BASH_REMATCH left as it was), None where not known: an undecided test,
    or groups whose POSIX span re may pick otherwise (see ``plain``). ``icase``: shopt -s
    nocasematch (regcomp's REG_ICASE), followed for ASCII only."""
    found = ere_to_python(chars)
    if found == REFUSED:
        return False, REFUSED
    if found is None or (icase and not (text.isascii() and all(c.isascii() for c, _ in chars))):
        return None, None
    pattern, plain = found
    flags = re.DOTALL | (re.IGNORECASE | re.ASCII if icase else 0)
    try:
        compiled = re.compile(pattern, flags)
    except re.error:
        return None, None
    first = compiled.search(text)
    if first is None:
        return False, []
    if not plain or len(text) > MAX_REMATCH_TEXT:
        return True, None
    # POSIX: the leftmost match, the longest there. re's first one starts leftmost but may end short of
    # the longest (a?ab on "aab"). A span that ends early cannot meet a $ (re would take endpos for the end).
    inside = re.compile(ere_to_python(chars, end="(?!)")[0], flags)
    start = first.start()
    for stop in range(len(text), start - 1, -1):
        whole = (compiled if stop == len(text) else inside).fullmatch(text, start, stop)
        if whole is not None:
            return True, [whole.group(0)] + [g or "" for g in whole.groups()]
    return True, None
