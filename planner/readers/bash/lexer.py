"""The script's words and operators: quotes, substitutions and arrays kept whole, comments and
here-documents skipped."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Optional

from .errors import MAX_WORDS, ScriptLimit, ScriptSyntax

_OPERATORS = sorted(["&&", "||", ";;&", ";;", ";&", "|&", "<<<", "<<-", "<<", ">>", "<&", ">&", "<>", "&>>", "&>",
                     ">|", ";", "&", "|", "<", ">", "(", ")"], key=len, reverse=True)
_REDIRECTS = {"<", ">", ">>", "<<", "<<-", "<<<", "<&", ">&", "<>", "&>", "&>>", ">|"}
_META = set(" \t\r\n;&|<>()")
_PLAIN = re.compile(r"""[^\s;&|<>()'"\\$`]+""")
_BLANKS = re.compile(r"[ \t\r]+")
_OPERATOR = re.compile("|".join(re.escape(o) for o in _OPERATORS))
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[([^\]]*)\])?(\+?)=")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Unterminated(Exception):
    def __init__(self, what: str, at: int):
        super().__init__(what)
        self.what = what
        self.at = at


def _skip_single(t: str, i: int) -> int:
    j = t.find("'", i + 1)
    if j < 0:
        raise _Unterminated("' quote", i)
    return j + 1


def _skip_escaped(t: str, i: int, start: int, end: str, what: str) -> int:
    """After the ``end`` that closes the quote at ``i``, its text starting at ``start``."""
    j = start
    while j < len(t):
        if t[j] == "\\":
            j += 2
        elif t[j] == end:
            return j + 1
        else:
            j += 1
    raise _Unterminated(what, i)


def _skip_ansi(t: str, i: int) -> int:  # t[i:i+2] == "$'"
    return _skip_escaped(t, i, i + 2, "'", "$' quote")


def _skip_double(t: str, i: int) -> int:  # t[i] == '"'
    j = i + 1
    while j < len(t):
        c = t[j]
        if c == "\\":
            j += 2
        elif c == '"':
            return j + 1
        elif c == "$" and t[j + 1:j + 2] in ("(", "{"):
            j = _skip_nested(t, j + 1)
        elif c == "`":
            j = _skip_backtick(t, j)
        else:
            j += 1
    raise _Unterminated('" quote', i)


def _skip_backtick(t: str, i: int) -> int:
    return _skip_escaped(t, i, i + 1, "`", "` quote")


_NESTED = {"(": (")", "$( substitution"), "{": ("}", "${ expansion")}


def _skip_nested(t: str, i: int, what: Optional[str] = None) -> int:
    """After the ``)`` or ``}`` matching the ``(`` of ``$(`` (or of a process substitution's ``<(``,
    ``>(``) or the ``{`` of ``${`` at ``i``: quotes and the other kind of substitution inside are kept
    whole; a comment counts inside ``( )`` only."""
    opener = t[i]
    closer, said = _NESTED[opener]
    what = what or said
    depth, j = 0, i
    while j < len(t):
        c = t[j]
        if c == "\\":
            j += 2
            continue
        if c == "'":
            j = _skip_single(t, j)
            continue
        if c == '"':
            j = _skip_double(t, j)
            continue
        if c == "`":
            j = _skip_backtick(t, j)
            continue
        if c == "$" and t[j + 1:j + 2] in _NESTED and t[j + 1] != opener:
            j = _skip_nested(t, j + 1)
            continue
        if opener == "(" and c == "#" and j > i and t[j - 1] in " \t\n;":  # a comment inside $( ) ($# is none)
            end = t.find("\n", j)
            j = len(t) if end < 0 else end
            continue
        if c == opener:
            depth += 1
        elif c == closer:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise _Unterminated(what, i)


def _read_word(t: str, i: int) -> int:
    """The end of the word starting at ``i`` (quotes and substitutions kept whole)."""
    j = i
    while j < len(t):
        plain = _PLAIN.match(t, j)
        if plain:
            j = plain.end()
            if j >= len(t):
                break
        c = t[j]
        if c in "<>" and t[j + 1:j + 2] == "(":  # a process substitution, <(...) or >(...): part of the word
            j = _skip_nested(t, j + 1, "<( substitution" if c == "<" else ">( substitution")
            continue
        if c in _META:
            break
        if c == "\\":
            j += 2
        elif c == "'":
            j = _skip_single(t, j)
        elif c == '"':
            j = _skip_double(t, j)
        elif c == "`":
            j = _skip_backtick(t, j)
        elif c == "$" and t[j + 1:j + 2] in ("(", "{"):
            j = _skip_nested(t, j + 1)
        elif c == "$" and t[j + 1:j + 2] == "'":
            j = _skip_ansi(t, j)
        else:
            j += 1
    return min(j, len(t))


@dataclass
class _Tok:
    kind: str  # "word", "array" (NAME=( ... ), its elements apart) or "op"
    text: str
    start: int
    end: int
    elements: tuple[str, ...] = ()


def _lex(text: str, line_of: Callable[[int], int]) -> list[_Tok]:
    tokens: list[_Tok] = []
    # Each pending here-document: (delimiter, whether <<- strips tabs, its delimiter token's index,
    # whether the delimiter was quoted: then the body is taken as written, else expanded).
    heredocs: list[tuple[str, bool, int, bool]] = []
    wants_delimiter: Optional[str] = None
    i, n = 0, len(text)
    try:
        while i < n:
            c = text[i]
            if c in " \t\r":
                i = _BLANKS.match(text, i).end()
                continue
            if len(tokens) > MAX_WORDS:
                raise ScriptLimit(f"line {line_of(i)}", f"holds past {MAX_WORDS:,} words; expected a launch script")
            if c == "\\" and text[i + 1:i + 2] == "\n":
                i += 2
                continue
            if c == "#":
                end = text.find("\n", i)
                i = n if end < 0 else end
                continue
            if c == "\n":
                tokens.append(_Tok("op", "\n", i, i + 1))
                i += 1
                for delimiter, tabs, index, quoted in heredocs:
                    body_start = i
                    i, body_end = _skip_heredoc(text, i, delimiter, tabs)
                    # The body rides on its delimiter's token, for a command that reads it as a script.
                    tokens[index] = replace(tokens[index], elements=(text[body_start:body_end],
                                                                     "quoted" if quoted else ""))
                heredocs = []
                continue
            # <(...) and >(...) open a word (a process substitution), where < and > would be operators.
            match = None if c in "<>" and text[i + 1:i + 2] == "(" else _OPERATOR.match(text, i)
            op = match.group(0) if match else None
            if op is not None:
                tokens.append(_Tok("op", op, i, i + len(op)))
                i += len(op)
                if op in ("<<", "<<-"):
                    wants_delimiter = op
                continue
            j = _read_word(text, i)
            word = text[i:j]
            if wants_delimiter is not None:
                heredocs.append((re.sub(r"[\"'\\]", "", word), wants_delimiter == "<<-", len(tokens),
                                 bool(re.search(r"[\"'\\]", word))))
                wants_delimiter = None
            match = _ASSIGNMENT.match(word)
            if match and match.end() == len(word) and text[j:j + 1] == "(":
                elements, j = _read_array(text, j, line_of)
                tokens.append(_Tok("array", word, i, j, tuple(elements)))
            elif word.isdigit() and text[j:j + 1] in ("<", ">"):
                pass  # a file descriptor written against its redirection (2>&1)
            else:
                tokens.append(_Tok("word", word, i, j))
            i = j
    except _Unterminated as error:
        raise ScriptSyntax(f"line {line_of(error.at)}", f"an unterminated {error.what}") from None
    return tokens


def _read_array(text: str, j: int, line_of: Callable[[int], int]) -> tuple[list[str], int]:
    """The raw elements of ``NAME=( ... )`` from the ``(`` at ``j``, and the index after ``)``."""
    k, n, elements = j + 1, len(text), []
    while True:
        if k >= n:
            raise _Unterminated("array (", j)
        c = text[k]
        if c in " \t\r\n":
            k += 1
        elif c == "\\" and text[k + 1:k + 2] == "\n":
            k += 2
        elif c == "#":
            end = text.find("\n", k)
            k = n if end < 0 else end
        elif c == ")":
            return elements, k + 1
        else:
            end = _read_word(text, k)
            if end == k:
                raise ScriptSyntax(f"line {line_of(k)}", f"unexpected {text[k]!r} inside an array")
            elements.append(text[k:end])
            k = end


def _skip_heredoc(text: str, i: int, delimiter: str, tabs: bool) -> tuple[int, int]:
    """(where the script goes on past the here-document at ``i``, where its body ends: the start of
    its delimiter's line, or the text's end where none closes it)."""
    while i < len(text):
        end = text.find("\n", i)
        line = text[i:] if end < 0 else text[i:end]
        line_start, i = i, len(text) if end < 0 else end + 1
        if (line.lstrip("\t") if tabs else line) == delimiter:
            return i, line_start
    return i, i
