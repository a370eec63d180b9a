"""Glob patterns (``case``, ``[[ == ]]``, ``${X#pattern}``), matched without backtracking blow-up,
and the trims and replacements of parameter expansion, each bounded in its work."""

from __future__ import annotations

from .errors import MAX_PATTERN_WORK, ScriptLimit


_CLASSES = {"alpha": str.isalpha, "digit": str.isdigit, "alnum": str.isalnum, "upper": str.isupper,
            "lower": str.islower, "space": str.isspace, "punct": lambda c: c.isprintable() and not c.isalnum()
            and not c.isspace(), "xdigit": lambda c: c in "0123456789abcdefABCDEF"}


def _glob_tokens(parts: list[tuple[str, bool]]) -> list:
    """Pattern tokens of (text, active) parts: quoted text matches itself."""
    out: list = []
    for text, active in parts:
        i = 0
        while i < len(text):
            c = text[i]
            if not active:
                out.append(("char", c))
            elif c == "*":
                if not out or out[-1] != ("star",):
                    out.append(("star",))
            elif c == "?":
                out.append(("any",))
            elif c == "[":
                parsed = _bracket(text, i)
                if parsed is None:
                    out.append(("char", c))
                else:
                    token, i = parsed
                    out.append(token)
                    continue
            else:
                out.append(("char", c))
            i += 1
    return out


def _bracket(text: str, i: int):
    j = i + 1
    negate = j < len(text) and text[j] in "!^"
    j += negate
    items: list = []
    first = True
    while j < len(text):
        c = text[j]
        if c == "]" and not first:
            return ("class", negate, tuple(items)), j + 1
        first = False
        if text.startswith("[:", j):
            end = text.find(":]", j + 2)
            if end > 0 and text[j + 2:end] in _CLASSES:
                items.append(("named", text[j + 2:end]))
                j = end + 2
                continue
        if j + 2 < len(text) and text[j + 1] == "-" and text[j + 2] != "]":
            items.append(("range", c, text[j + 2]))
            j += 3
            continue
        items.append(("char", c))
        j += 1
    return None


def _one(token, c: str) -> bool:
    kind = token[0]
    if kind == "char":
        return token[1] == c
    if kind == "any":
        return True
    _, negate, items = token
    hit = False
    for item in items:
        if (item[0] == "char" and item[1] == c) or (item[0] == "range" and item[1] <= c <= item[2]) or \
                (item[0] == "named" and _CLASSES[item[1]](c)):
            hit = True
            break
    return hit != negate


def _glob_match(tokens: list, s: str) -> bool:
    """Whether ``s`` matches the whole pattern: O(len(s)·len(pattern)), no backtracking blow-up."""
    i = j = 0
    star, mark = -1, 0
    while j < len(s):
        if i < len(tokens) and tokens[i] != ("star",) and _one(tokens[i], s[j]):
            i += 1
            j += 1
        elif i < len(tokens) and tokens[i] == ("star",):
            star, mark = i, j
            i += 1
        elif star >= 0:
            i = star + 1
            mark += 1
            j = mark
        else:
            return False
    while i < len(tokens) and tokens[i] == ("star",):
        i += 1
    return i == len(tokens)


def _match_bounded(tokens: list, text: str, name: str) -> bool:
    if len(text) * (len(tokens) + 1) > MAX_PATTERN_WORK:
        raise ScriptLimit(name, f"matches a pattern of {len(tokens)} parts against {len(text):,} characters, past "
                                f"the bound of {MAX_PATTERN_WORK:,} steps (characters × parts)")
    return _glob_match(tokens, text)


def _check_work(text: str, tokens: list, name: str) -> None:
    if len(text) ** 2 * (len(tokens) + 1) > MAX_PATTERN_WORK:
        raise ScriptLimit(name, f"trims a pattern of {len(tokens)} parts from {len(text):,} characters, past the "
                                f"bound of {MAX_PATTERN_WORK:,} steps (characters² × parts)")


def _trim(value: str, tokens: list, op: str, name: str) -> str:
    _check_work(value, tokens, name)
    cuts = range(len(value) + 1)
    if op in ("#", "##"):
        for cut in (reversed(cuts) if op == "##" else cuts):
            if _glob_match(tokens, value[:cut]):
                return value[cut:]
    else:
        for cut in (cuts if op == "%%" else reversed(cuts)):
            if _glob_match(tokens, value[cut:]):
                return value[:cut]
    return value


def _replace(value: str, tokens: list, replacement: str, op: str, name: str) -> str:
    _check_work(value, tokens, name)
    if op == "/#":
        for cut in reversed(range(len(value) + 1)):
            if _glob_match(tokens, value[:cut]):
                return replacement + value[cut:]
        return value
    if op == "/%":
        for cut in range(len(value) + 1):
            if _glob_match(tokens, value[cut:]):
                return value[:cut] + replacement
        return value
    out, i = [], 0
    while i <= len(value):
        for end in range(len(value), i - 1, -1):  # the longest match at i
            if end > i and _glob_match(tokens, value[i:end]):
                out.append(replacement)
                i = end
                break
        else:
            if i < len(value):
                out.append(value[i])
            i += 1
            continue
        if op == "/":
            out.append(value[i:])
            break
    return "".join(out)
