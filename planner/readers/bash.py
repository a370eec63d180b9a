"""A bash launch script read as bash would expand it, without running anything.

:func:`read_script` follows the script from top to bottom the way bash would, for the variables
it sets itself, and returns the words of every command it would start (``torchrun``,
``python``, ``srun``...), expanded: nothing is executed, no file but the script is opened (a
caller may answer a command substitution it recognises, see ``command_output``).

Modelled: scalar assignments (``X=1``, ``export X=...``, ``declare``/``local``/``readonly``,
``X+=...``), arrays (``A=(...)``, ``A+=(...)``, ``A[i]=...``), parameter expansion
(``$X``, ``${X}``, ``${X:-default}``, ``${X-default}``, ``${X:=default}``, ``${X:+alt}``,
``${#X}``, ``${A[@]}``, ``${A[*]}``, ``${A[i]}``, ``${#A[@]}``, ``${X#pat}``, ``${X%pat}`` and
their doubles, ``${X/pat/rep}``, ``${X:off:len}``, ``${X^^}``, ``${X,,}``), arithmetic
(``$((...))``, ``((...))``, ``let``), quoting (single, double, ``$'...'``, backslashes) and
word splitting as bash does it (a quoted ``"${A[@]}"`` keeps each element one word, an
unquoted ``${A[@]}`` splits them), comments, line continuations, here-documents (skipped),
``if``/``elif``/``else``, ``&&``/``||``, ``case``, ``for``, ``while``/``until``, functions,
``{ ...; }`` and subshells, ``exit``, ``set --``, ``shift``, ``unset``, and ``bash -c STRING``
(read as a script of its own, with the exported variables).

Conditions: ``[ ... ]``, ``test`` and ``[[ ... ]]`` with ``=``, ``==``, ``!=`` (patterns in
``[[ ]]``), ``<``, ``>``, ``-n``, ``-z``, ``-v``, the integer comparisons, ``!``, ``-a``/``-o``,
``&&``/``||`` and parentheses. A variable the script does not set (it comes from the
environment or the command line) reads as bash reads it unset: empty, or the default that
``${X:-default}`` gives. What cannot be decided without running something (a file test, a
regular expression, a command's exit status) is read as the outcome that does not ``exit``;
failing that, a test as false and a command as succeeding. Each branch decided by something
the script does not set is said in a note.

A ``$((...))`` bash fails on abandons the rest of its line, as bash does (said in a note);
``((...))``, ``let`` and ``[[ ... -eq ... ]]`` fail with status 1.

Not modelled: command substitution (``$(...)`` and backquotes read as empty, but for what
``command_output`` answers), globbing (``*`` stays as written, as under ``set -f``), brace and
tilde expansion, sparse and associative arrays (``A[5]=x`` pads with empty elements),
``source``/``eval`` (said in a note), ``read`` (it fails, as with no input), ``=~``, process
substitution, the scoping of ``local``, and variables bash sets itself (``PWD``, ``HOME``: unset).
A script bash could not parse raises :class:`ScriptSyntax`; one that expands, loops or recurses
without end, or is longer than MAX_EXPANDED_CHARS, raises :class:`ScriptLimit`.
"""

from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from ..errors import one_line
from ..limits import MAX_EXPANDED_CHARS

# Bounds of the reading itself, far above any launch script: the script's length (as a variable's,
# MAX_EXPANDED_CHARS) and its words, the commands followed (loop iterations and function calls
# included), nesting of function calls and arithmetic look-ups, and the work of one pattern match
# (``${X%pattern}``, ``case``): value length squared times pattern length.
MAX_WORDS = 200_000
MAX_STEPS = 10_000
MAX_DEPTH = 100
MAX_PATTERN_WORK = 4_000_000
MAX_NOTES = 20  # notes kept; the rest are counted


class ScriptError(Exception):
    """What stops the reading: ``key`` names the variable or the line."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


class ScriptSyntax(ScriptError):
    """A script bash could not parse (or a construct this reader does not parse)."""


class ScriptLimit(ScriptError):
    """A script that expands, loops or recurses past the bounds."""


@dataclass(frozen=True)
class Command:
    """A command the script would start, its words as the program receives them."""
    fields: tuple[str, ...]
    line: int
    unset: tuple[str, ...] = ()  # variables its words read that nothing set (read as empty)


@dataclass(frozen=True)
class Note:
    text: str
    flags: Optional[tuple[str, ...]] = ()  # the --flags in the branches it decides between (None: any)


@dataclass
class Script:
    commands: list[Command]
    notes: list[Note]


# --- lexing ----------------------------------------------------------------------------------

_OPERATORS = sorted(["&&", "||", ";;&", ";;", ";&", "|&", "<<<", "<<-", "<<", ">>", "<&", ">&", "<>", "&>>", "&>",
                     ">|", ";", "&", "|", "<", ">", "(", ")"], key=len, reverse=True)
_REDIRECTS = {"<", ">", ">>", "<<", "<<-", "<<<", "<&", ">&", "<>", "&>", "&>>", ">|"}
_META = set(" \t\r\n;&|<>()")
_PLAIN = re.compile(r"""[^\s;&|<>()'"\\$`]+""")
_BLANKS = re.compile(r"[ \t\r]+")
_OPERATOR = re.compile("|".join(re.escape(o) for o in _OPERATORS))
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[([^\]]*)\])?(\+?)=")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SIMPLE_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]|[@*#?$!\-]")
_PARAM_OP = re.compile(r":?[-=+?]|##?|%%?|/#|/%|//?|\^\^?|,,?|:")


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


def _skip_ansi(t: str, i: int) -> int:  # t[i:i+2] == "$'"
    j = i + 2
    while j < len(t):
        if t[j] == "\\":
            j += 2
        elif t[j] == "'":
            return j + 1
        else:
            j += 1
    raise _Unterminated("$' quote", i)


def _skip_double(t: str, i: int) -> int:  # t[i] == '"'
    j = i + 1
    while j < len(t):
        c = t[j]
        if c == "\\":
            j += 2
        elif c == '"':
            return j + 1
        elif c == "$" and t[j + 1:j + 2] == "(":
            j = _skip_paren(t, j + 1)
        elif c == "$" and t[j + 1:j + 2] == "{":
            j = _skip_brace(t, j + 1)
        elif c == "`":
            j = _skip_backtick(t, j)
        else:
            j += 1
    raise _Unterminated('" quote', i)


def _skip_backtick(t: str, i: int) -> int:
    j = i + 1
    while j < len(t):
        if t[j] == "\\":
            j += 2
        elif t[j] == "`":
            return j + 1
        else:
            j += 1
    raise _Unterminated("` quote", i)


def _skip_paren(t: str, i: int) -> int:  # t[i] == "(": after the matching ")"
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
        if c == "$" and t[j + 1:j + 2] == "{":
            j = _skip_brace(t, j + 1)
            continue
        if c == "$" and t[j + 1:j + 2] in ("#", "("):
            j += 1  # $# is no comment; $( nests below
            continue
        if c == "#" and j > i and t[j - 1] in " \t\n;":  # a comment inside $( )
            end = t.find("\n", j)
            j = len(t) if end < 0 else end
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise _Unterminated("$( substitution", i)


def _skip_brace(t: str, i: int) -> int:  # t[i] == "{" after "$": after the matching "}"
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
        if c == "$" and t[j + 1:j + 2] == "(":
            j = _skip_paren(t, j + 1)
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise _Unterminated("${ expansion", i)


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
        elif c == "$" and t[j + 1:j + 2] == "(":
            j = _skip_paren(t, j + 1)
        elif c == "$" and t[j + 1:j + 2] == "{":
            j = _skip_brace(t, j + 1)
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
    heredocs: list[tuple[str, bool]] = []
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
                for delimiter, tabs in heredocs:
                    i = _skip_heredoc(text, i, delimiter, tabs)
                heredocs = []
                continue
            match = _OPERATOR.match(text, i)
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
                heredocs.append((re.sub(r"[\"'\\]", "", word), wants_delimiter == "<<-"))
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


def _skip_heredoc(text: str, i: int, delimiter: str, tabs: bool) -> int:
    while i < len(text):
        end = text.find("\n", i)
        line = text[i:] if end < 0 else text[i:end]
        i = len(text) if end < 0 else end + 1
        if (line.lstrip("\t") if tabs else line) == delimiter:
            break
    return i


# --- parsing ---------------------------------------------------------------------------------

@dataclass
class _List:
    items: list
    start: int = 0
    end: int = 0


@dataclass
class _Simple:
    words: list[_Tok]
    start: int


@dataclass
class _If:
    clauses: list[tuple[_List, _List]]
    orelse: Optional[_List]
    start: int
    end: int = 0


@dataclass
class _For:
    name: str
    items: Optional[list[_Tok]]
    body: _List
    start: int


@dataclass
class _ArithFor:
    init: str
    cond: str
    step: str
    body: _List
    start: int


@dataclass
class _While:
    cond: _List
    body: _List
    until: bool
    start: int


@dataclass
class _Case:
    word: _Tok
    items: list[tuple[list[_Tok], _List, str]]
    start: int
    end: int = 0


@dataclass
class _Group:
    body: _List
    subshell: bool


@dataclass
class _FuncDef:
    name: str
    body: object


@dataclass
class _Test:  # [[ ... ]]
    tokens: list[_Tok]
    start: int


@dataclass
class _Arith:  # (( ... ))
    text: str
    start: int


@dataclass
class _Pipeline:
    commands: list
    negate: bool
    start: int
    end: int


@dataclass
class _AndOr:
    first: _Pipeline
    rest: list[tuple[str, _Pipeline]]


_RESERVED = {"then", "elif", "else", "fi", "do", "done", "esac", "}", "in"}


class _Parser:
    def __init__(self, tokens: list[_Tok], text: str, line_of: Callable[[int], int]):
        self.tokens, self.text, self.line_of, self.k = tokens, text, line_of, 0

    def peek(self, ahead: int = 0) -> Optional[_Tok]:
        k = self.k + ahead
        return self.tokens[k] if k < len(self.tokens) else None

    def error(self, tok: Optional[_Tok], message: str) -> ScriptSyntax:
        where = f"line {self.line_of(tok.start)}" if tok is not None else f"line {self.line_of(len(self.text))}"
        return ScriptSyntax(where, message)

    @staticmethod
    def word(tok: Optional[_Tok], *texts: str) -> bool:
        return tok is not None and tok.kind == "word" and (not texts or tok.text in texts)

    @staticmethod
    def op(tok: Optional[_Tok], *ops: str) -> bool:
        return tok is not None and tok.kind == "op" and (not ops or tok.text in ops)

    def expect_word(self, text: str) -> _Tok:
        tok = self.peek()
        if not self.word(tok, text):
            raise self.error(tok, f"expected {text!r}, found {one_line(tok.text, 40)!r}" if tok else
                             f"expected {text!r} before the end of the script")
        self.k += 1
        return tok

    def expect_op(self, op: str) -> _Tok:
        tok = self.peek()
        if not self.op(tok, op):
            raise self.error(tok, f"expected {op!r}" + (f", found {one_line(tok.text, 40)!r}" if tok else
                                                        " before the end of the script"))
        self.k += 1
        return tok

    def skip_newlines(self) -> None:
        while self.op(self.peek(), "\n"):
            self.k += 1

    def parse_list(self, stop_words: tuple = (), stop_ops: tuple = ()) -> _List:
        items: list = []
        start = end = None
        while True:
            while self.op(self.peek(), "\n", ";", "&"):
                self.k += 1
            tok = self.peek()
            if tok is None or (tok.kind == "word" and tok.text in stop_words) or \
                    (tok.kind == "op" and tok.text in stop_ops):
                break
            item = self.parse_and_or()
            items.append(item)
            start = item.first.start if start is None else start
            end = (item.rest[-1][1] if item.rest else item.first).end
            tok = self.peek()
            if tok is None or self.op(tok, "\n", ";", "&") or (tok.kind == "word" and tok.text in stop_words) \
                    or (tok.kind == "op" and tok.text in stop_ops):
                continue
            raise self.error(tok, f"unexpected {one_line(tok.text, 40)!r}")
        return _List(items, start or 0, end or 0)

    def parse_and_or(self) -> _AndOr:
        first, rest = self.parse_pipeline(), []
        while self.op(self.peek(), "&&", "||"):
            op = self.peek().text
            self.k += 1
            self.skip_newlines()
            rest.append((op, self.parse_pipeline()))
        return _AndOr(first, rest)

    def parse_pipeline(self) -> _Pipeline:
        negate = False
        start_tok = self.peek()
        while self.word(self.peek(), "!"):
            negate = not negate
            self.k += 1
        commands = [self.parse_command()]
        while self.op(self.peek(), "|", "|&"):
            self.k += 1
            self.skip_newlines()
            commands.append(self.parse_command())
        last = self.tokens[self.k - 1]
        return _Pipeline(commands, negate, start_tok.start if start_tok else 0, last.end)

    def parse_command(self):
        tok = self.peek()
        if tok is None:
            raise self.error(None, "a command is missing before the end of the script")
        node = None
        if tok.kind == "word":
            keyword = tok.text
            if keyword == "if":
                node = self.parse_if()
            elif keyword == "for":
                node = self.parse_for()
            elif keyword in ("while", "until"):
                node = self.parse_while()
            elif keyword == "case":
                node = self.parse_case()
            elif keyword == "{":
                self.k += 1
                body = self.parse_list(stop_words=("}",))
                self.expect_word("}")
                node = _Group(body, subshell=False)
            elif keyword == "[[":
                node = self.parse_test()
            elif keyword == "function":
                self.k += 1
                name = self.peek()
                if not self.word(name) or not _NAME.fullmatch(name.text.rstrip("()")):
                    raise self.error(name, "expected a function name")
                self.k += 1
                if self.op(self.peek(), "(") and self.op(self.peek(1), ")"):
                    self.k += 2
                self.skip_newlines()
                node = _FuncDef(name.text.rstrip("()"), self.parse_command())
            elif keyword in _RESERVED:
                raise self.error(tok, f"unexpected {keyword!r}")
            elif _NAME.fullmatch(keyword) and self.op(self.peek(1), "(") and self.op(self.peek(2), ")"):
                self.k += 3
                self.skip_newlines()
                node = _FuncDef(keyword, self.parse_command())
        elif self.op(tok, "("):
            after = self.peek(1)
            if self.op(after, "(") and after.start == tok.end:
                node = _Arith(self.parse_double_paren(), tok.start)
            else:
                self.k += 1
                body = self.parse_list(stop_ops=(")",))
                self.expect_op(")")
                node = _Group(body, subshell=True)
        if node is None:
            return self.parse_simple()
        while self.op(self.peek(), *_REDIRECTS):  # fi > log, done < file
            self.k += 1
            if not self.word(self.peek()):
                raise self.error(self.peek(), "a redirection without its file")
            self.k += 1
        return node

    def parse_double_paren(self) -> str:
        """The text of ``(( ... ))`` from its first ``(``."""
        open_tok = self.tokens[self.k + 1]
        self.k += 2
        depth, previous = 2, None
        while True:
            tok = self.peek()
            if tok is None:
                raise self.error(open_tok, "an unterminated ((")
            self.k += 1
            if self.op(tok, "("):
                depth += 1
            elif self.op(tok, ")"):
                depth -= 1
                if depth == 0:
                    return self.text[open_tok.end:previous.start]
                previous = tok

    def parse_simple(self) -> _Simple:
        words: list[_Tok] = []
        start = self.peek().start
        redirected = False
        while True:
            tok = self.peek()
            if tok is None:
                break
            if tok.kind in ("word", "array"):
                words.append(tok)
                self.k += 1
            elif tok.kind == "op" and tok.text in _REDIRECTS:
                self.k += 1
                if not self.word(self.peek()):
                    raise self.error(self.peek(), "a redirection without its file")
                self.k += 1
                redirected = True
            else:
                break
        if not words and not redirected:
            raise self.error(self.peek(), f"unexpected {one_line(self.peek().text, 40)!r}")
        return _Simple(words, start)

    def parse_if(self) -> _If:
        start = self.expect_word("if").start
        clauses = []
        cond = self.parse_list(stop_words=("then",))
        self.expect_word("then")
        clauses.append((cond, self.parse_list(stop_words=("elif", "else", "fi"))))
        orelse = None
        while self.word(self.peek(), "elif"):
            self.k += 1
            cond = self.parse_list(stop_words=("then",))
            self.expect_word("then")
            clauses.append((cond, self.parse_list(stop_words=("elif", "else", "fi"))))
        if self.word(self.peek(), "else"):
            self.k += 1
            orelse = self.parse_list(stop_words=("fi",))
        end = self.expect_word("fi").end
        return _If(clauses, orelse, start, end)

    def parse_for(self):
        start = self.expect_word("for").start
        if self.op(self.peek(), "(") and self.op(self.peek(1), "("):
            text = self.parse_double_paren()
            parts = text.split(";")
            if len(parts) != 3:
                raise self.error(self.peek(), "expected for (( init; condition; step ))")
            while self.op(self.peek(), "\n", ";"):
                self.k += 1
            self.expect_word("do")
            body = self.parse_list(stop_words=("done",))
            self.expect_word("done")
            return _ArithFor(parts[0], parts[1], parts[2], body, start)
        name = self.peek()
        if not self.word(name) or not _NAME.fullmatch(name.text):
            raise self.error(name, "expected a loop variable after for")
        self.k += 1
        self.skip_newlines()
        items = None
        if self.word(self.peek(), "in"):
            self.k += 1
            items = []
            while self.word(self.peek()):
                items.append(self.peek())
                self.k += 1
        while self.op(self.peek(), "\n", ";"):
            self.k += 1
        self.expect_word("do")
        body = self.parse_list(stop_words=("done",))
        self.expect_word("done")
        return _For(name.text, items, body, start)

    def parse_while(self) -> _While:
        tok = self.peek()
        self.k += 1
        cond = self.parse_list(stop_words=("do",))
        self.expect_word("do")
        body = self.parse_list(stop_words=("done",))
        self.expect_word("done")
        return _While(cond, body, tok.text == "until", tok.start)

    def parse_case(self) -> _Case:
        start = self.expect_word("case").start
        word = self.peek()
        if not self.word(word):
            raise self.error(word, "expected a word after case")
        self.k += 1
        self.skip_newlines()
        self.expect_word("in")
        items = []
        while True:
            self.skip_newlines()
            if self.word(self.peek(), "esac"):
                end = self.peek().end
                self.k += 1
                break
            if self.op(self.peek(), "("):
                self.k += 1
            patterns = []
            while True:
                tok = self.peek()
                if not self.word(tok):
                    raise self.error(tok, "expected a case pattern")
                patterns.append(tok)
                self.k += 1
                if self.op(self.peek(), "|"):
                    self.k += 1
                    continue
                break
            self.expect_op(")")
            body = self.parse_list(stop_words=("esac",), stop_ops=(";;", ";&", ";;&"))
            terminator = ";;"
            if self.op(self.peek(), ";;", ";&", ";;&"):
                terminator = self.peek().text
                self.k += 1
            items.append((patterns, body, terminator))
        return _Case(word, items, start, end)

    def parse_test(self) -> _Test:
        start = self.expect_word("[[").start
        tokens = []
        while True:
            tok = self.peek()
            if tok is None:
                raise self.error(None, "an unterminated [[")
            self.k += 1
            if self.word(tok, "]]"):
                return _Test(tokens, start)
            if not self.op(tok, "\n"):
                tokens.append(tok)


# --- glob patterns (case, [[ == ]], ${X#pattern}) --------------------------------------------

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


# --- arithmetic ------------------------------------------------------------------------------

class _ArithError(Exception):
    pass


class _ExpansionError(Exception):
    """An expansion bash fails on (``$((a b))``): it abandons the rest of the line."""


_ARITH_TOKEN = re.compile(r"\s*(?:(0[xX][0-9a-fA-F]+|[0-9]+#[0-9a-zA-Z@_]+|[0-9]+)|([A-Za-z_][A-Za-z0-9_]*)"
                          r"|(\*\*=|<<=|>>=|&&|\|\||\+\+|--|\*\*|<<|>>|<=|>=|==|!=|[-+*/%&^|]=|[-+*/%<>=!~&^|?:(),]))")
_BINARY = [("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", ">", "<=", ">="), ("<<", ">>"),
           ("+", "-"), ("*", "/", "%")]
_ASSIGN_OPS = {"=", "+=", "-=", "*=", "/=", "%=", "<<=", ">>=", "&=", "^=", "|=", "**="}


def _wrap(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _number(text: str) -> int:
    try:
        if text[:2] in ("0x", "0X"):
            return _wrap(int(text[2:], 16))
        if "#" in text:
            base, digits = text.split("#", 1)
            base = int(base)
            if not 2 <= base <= 64:
                raise _ArithError(f"invalid base {base}")
            value = 0
            alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ@_"
            for c in digits:
                d = alphabet.index(c) if base > 36 else alphabet.index(c.lower()) if c.isalpha() else int(c)
                if d >= base:
                    raise _ArithError(f"digit {c!r} too great for base {base}")
                value = _wrap(value * base + d)
            return value
        if len(text) > 1 and text.startswith("0"):
            return _wrap(int(text, 8))
        return _wrap(int(text))
    except ValueError:
        raise _ArithError(f"bad number {one_line(text, 30)!r}") from None


class _ArithParser:
    def __init__(self, text: str):
        self.tokens: list[tuple[str, str]] = []
        i = 0
        text = text.rstrip()
        while i < len(text):
            m = _ARITH_TOKEN.match(text, i)
            if not m or m.end() == i:
                raise _ArithError(f"unexpected {one_line(text[i:i + 10], 20)!r}")
            kind = "num" if m.group(1) else "name" if m.group(2) else "op"
            self.tokens.append((kind, m.group(m.lastindex)))
            i = m.end()
        self.k = 0

    def peek(self) -> Optional[tuple[str, str]]:
        return self.tokens[self.k] if self.k < len(self.tokens) else None

    def take_op(self, *ops: str) -> Optional[str]:
        tok = self.peek()
        if tok and tok[0] == "op" and tok[1] in ops:
            self.k += 1
            return tok[1]
        return None

    def parse(self):
        if not self.tokens:
            return ("num", 0)
        node = self.comma()
        if self.peek() is not None:
            raise _ArithError(f"unexpected {self.peek()[1]!r}")
        return node

    def comma(self):
        node = self.assignment()
        while self.take_op(","):
            node = ("comma", node, self.assignment())
        return node

    def assignment(self):
        tok, after = self.peek(), self.tokens[self.k + 1] if self.k + 1 < len(self.tokens) else None
        if tok and tok[0] == "name" and after and after[0] == "op" and after[1] in _ASSIGN_OPS:
            self.k += 2
            return ("assign", after[1], tok[1], self.assignment())
        return self.ternary()

    def ternary(self):
        node = self.binary(0)
        if self.take_op("?"):
            yes = self.assignment()
            if not self.take_op(":"):
                raise _ArithError("expected ':'")
            return ("cond", node, yes, self.assignment())
        return node

    def binary(self, level: int):
        if level == len(_BINARY):
            return self.power()
        node = self.binary(level + 1)
        while True:
            op = self.take_op(*_BINARY[level])
            if op is None:
                return node
            node = ("bin", op, node, self.binary(level + 1))

    def power(self):
        node = self.unary()
        if self.take_op("**"):
            return ("bin", "**", node, self.power())
        return node

    def unary(self):
        op = self.take_op("!", "~", "+", "-", "++", "--")
        if op in ("++", "--"):
            tok = self.peek()
            if not tok or tok[0] != "name":
                raise _ArithError(f"{op} needs a variable")
            self.k += 1
            return ("pre", op, tok[1])
        if op:
            return ("un", op, self.unary())
        return self.postfix()

    def postfix(self):
        tok = self.peek()
        if tok is None:
            raise _ArithError("an operand is missing")
        self.k += 1
        if tok[0] == "num":
            return ("num", _number(tok[1]))
        if tok[0] == "name":
            op = self.take_op("++", "--")
            return ("post", op, tok[1]) if op else ("var", tok[1])
        if tok[1] == "(":
            node = self.comma()
            if not self.take_op(")"):
                raise _ArithError("expected ')'")
            return node
        raise _ArithError(f"unexpected {tok[1]!r}")


# --- the interpreter ---------------------------------------------------------------------------

@dataclass
class _Var:
    value: Union[str, list]
    deps: tuple = ()  # ((name, how it was read), ...): what the value owes to what the script does not set
    exported: bool = False
    size: int = 0  # characters, an array's separators counted
    generation: int = 0  # the (sub)shell that may extend its array in place


_GENERATIONS = itertools.count(1)


_READ_EMPTY = "is not set by the script: read as empty"


class _Ctx:
    """What one expansion read that the script does not set."""

    def __init__(self):
        self.deps: dict[str, str] = {}

    def merge(self, deps) -> None:
        for name, how in deps:
            self.deps.setdefault(name, how)


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
    pass


class _Return(Exception):
    def __init__(self, status: _Status):
        super().__init__()
        self.status = status


class _LoopControl(Exception):
    def __init__(self, kind: str, levels: int):
        super().__init__(kind)
        self.kind, self.levels = kind, levels


_UNARY_TESTS = {"-n", "-z", "-v", "-a", "-b", "-c", "-d", "-e", "-f", "-g", "-h", "-k", "-p", "-r", "-s", "-t",
                "-u", "-w", "-x", "-G", "-L", "-N", "-O", "-S", "-o", "-R"}
_BINARY_TESTS = {"=", "==", "!=", "<", ">", "-eq", "-ne", "-lt", "-le", "-gt", "-ge", "=~", "-nt", "-ot", "-ef"}
_FILE_TESTS = _UNARY_TESTS - {"-n", "-z", "-v", "-o", "-R", "-t"}
_DECLARATIONS = {"export", "declare", "typeset", "local", "readonly"}


def _joined(value) -> str:
    return " ".join(value) if isinstance(value, list) else value


def _k3_and(a: Optional[bool], b: Optional[bool]) -> Optional[bool]:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _k3_or(a: Optional[bool], b: Optional[bool]) -> Optional[bool]:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def _first_word(node) -> Optional[str]:
    return node.words[0].text if isinstance(node, _Simple) and node.words and node.words[0].kind == "word" else None


def _list_exits(body: Optional[_List]) -> bool:
    """Whether ``body`` leaves the script at its top level (``...; exit 1``)."""
    return body is not None and any(_pipeline_exits(item.first) for item in body.items)


def _pipeline_exits(pipeline: _Pipeline) -> bool:
    if len(pipeline.commands) != 1:
        return False
    command = pipeline.commands[0]
    if isinstance(command, _Group):
        return _list_exits(command.body)
    return _first_word(command) in ("exit", "return")


class _Shell:
    def __init__(self, text: str, name: str, command_output: Optional[Callable[[str], Optional[str]]],
                 line_of: Callable[[int], int], variables: Optional[dict] = None,
                 positional: Optional[list] = None, steps: Optional[list] = None, depth: int = 0,
                 argv0: Optional[str] = None):
        self.text, self.name, self.command_output, self.line_of = text, name, command_output, line_of
        self.argv0 = name if argv0 is None else argv0
        self.vars: dict[str, _Var] = dict(variables or {})
        self.vars.setdefault("BASH_SOURCE", _Var([name]))
        self.funcs: dict[str, object] = {}
        self.positional: list[str] = list(positional or [])
        self.positional_known = positional is not None
        self.commands: list[Command] = []
        self.notes: list[Note] = []
        self.noted: set[Note] = set()
        self.more_notes = 0
        self.steps = steps if steps is not None else [0]
        self.depth = depth
        self.in_condition = 0
        self.line = 1
        self.generation = next(_GENERATIONS)

    # --- bookkeeping

    def step(self, at: int) -> None:
        self.line = self.line_of(at)
        self.steps[0] += 1
        if self.steps[0] > MAX_STEPS:
            raise ScriptLimit(f"line {self.line}", f"runs past {MAX_STEPS:,} commands (a loop without end?); "
                                                   "expected a launch script")

    def too_long(self, key: str) -> ScriptLimit:
        return ScriptLimit(key, f"expands past {MAX_EXPANDED_CHARS:,} characters")

    def source(self, start: int, end: int, limit: int = 120) -> str:
        text = re.sub(r"\s*\\\n\s*|\s+", " ", self.text[start:end]).strip().rstrip(";").strip()
        return one_line(text, limit)

    def note_as_is(self, note: Note) -> None:
        if note not in self.noted:
            self.noted.add(note)
            if len(self.notes) < MAX_NOTES:
                self.notes.append(note)
            else:
                self.more_notes += 1

    def flags_in(self, start: int, end: int) -> tuple[str, ...]:
        return tuple(dict.fromkeys(re.findall(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_-]*", self.text[start:end])))

    def note(self, text: str, flags: tuple[str, ...] = ()) -> None:
        note = Note(f"{self.name}: line {self.line}: {text}", flags)
        if note in self.noted:
            return
        self.noted.add(note)
        if len(self.notes) < MAX_NOTES:
            self.notes.append(note)
        else:
            self.more_notes += 1

    # --- variables

    def lookup(self, name: str, index: Optional[str], ctx: _Ctx):
        """(value, set): a list for [@]/[*] and $@/$*, else a string."""
        if name in ("@", "*"):
            if not self.positional_known:
                ctx.deps.setdefault("$@", "the script's arguments: read as none")
            return list(self.positional), True
        if name == "#":
            if not self.positional_known:
                ctx.deps.setdefault("$#", "the script's arguments: read as none")
            return str(len(self.positional)), True
        if name.isdigit():
            n = int(name)
            if n == 0:
                return self.argv0, True
            if n <= len(self.positional):
                return self.positional[n - 1], True
            return None, False
        if name in ("?", "-"):
            return "0" if name == "?" else "", True
        if name in ("$", "!"):
            ctx.deps.setdefault(f"${name}", "a process id: read as empty")
            return "", True
        var = self.vars.get(name)
        if var is None:
            return None, False
        ctx.merge(var.deps)
        value = var.value
        if index is None:
            return (value[0] if value else "") if isinstance(value, list) else value, True
        if index in ("@", "*"):
            return list(value) if isinstance(value, list) else [value], True
        position = self.arith(index, ctx, name)
        items = value if isinstance(value, list) else [value]
        if position < 0:
            position += len(items)
        return (items[position], True) if 0 <= position < len(items) else (None, False)

    def set_var(self, name: str, value: Union[str, list], deps: dict, append: bool = False,
                index: Optional[str] = None, exported: Optional[bool] = None) -> None:
        old = self.vars.get(name)
        deps = dict(deps)
        if old is not None and (append or index is not None or
                                (isinstance(old.value, list) and not isinstance(value, list))):
            deps = {**dict(old.deps), **deps}
        if index is not None and index not in ("@", "*"):
            items = list(old.value) if old is not None and isinstance(old.value, list) else \
                ([old.value] if old is not None else [])
            position = self.arith(index, _Ctx(), name) or 0
            if position < 0 or position >= MAX_EXPANDED_CHARS:
                raise self.too_long(name)
            while len(items) <= position:
                items.append("")
            items[position] = (items[position] + value) if append else value
            value = items
            size = sum(len(v) + 1 for v in value)
        elif isinstance(value, list):
            size = sum(len(v) + 1 for v in value)
            if append and old is not None:
                if isinstance(old.value, list):  # appended in place where this shell owns it: A+=(x) in a loop
                    items = old.value if old.generation == self.generation else list(old.value)
                    items.extend(value)
                    size += old.size
                else:
                    items = [old.value] + value
                    size += len(old.value) + 1
                value = items
        elif old is not None and isinstance(old.value, list):  # A=x on an array sets A[0]
            items = list(old.value) or [""]
            items[0] = (items[0] + value) if append else value
            value = items
            size = sum(len(v) + 1 for v in value)
        else:
            if append and old is not None:
                if len(old.value) + len(value) > MAX_EXPANDED_CHARS:
                    raise self.too_long(name)
                value = old.value + value
            size = len(value)
        if size > MAX_EXPANDED_CHARS:
            raise self.too_long(name)
        self.vars[name] = _Var(value, tuple(deps.items()),
                               old.exported if exported is None and old is not None else bool(exported),
                               size, self.generation)

    def assign(self, tok: _Tok, exported: Optional[bool] = None) -> None:
        match = _ASSIGNMENT.match(tok.text)
        name, index, append = match.group(1), match.group(2), match.group(3) == "+"
        ctx = _Ctx()
        if tok.kind == "array":
            elements: list[str] = []
            size = 0
            for raw in tok.elements:
                if re.match(r"\[[^\]]*\]=", raw):  # [i]=value: the value, in order (sparse arrays are not modelled)
                    raw = raw.split("=", 1)[1]
                for word in self.fields(raw, ctx, name):
                    size += len(word) + 1
                    if size > MAX_EXPANDED_CHARS:
                        raise self.too_long(name)
                    elements.append(word)
            self.set_var(name, elements, ctx.deps, append=append, exported=exported)
        else:
            value = self.string(tok.text[match.end():], ctx, name)
            self.set_var(name, value, ctx.deps, append=append, index=index, exported=exported)

    # --- expansion

    def scan(self, raw: str, ctx: _Ctx, key: str, quoted: bool = False) -> list:
        """Pieces of a word: (kind, value), kind lit/qlit (text), exp/qexp (expanded text),
        at/qat (an expanded list, each element its own word)."""
        pieces: list = []
        buf: list[str] = []
        size = 0

        def put(piece) -> None:
            nonlocal size
            value = piece[1]
            size += sum(len(v) + 1 for v in value) if isinstance(value, list) else len(value)
            if size > MAX_EXPANDED_CHARS:
                raise self.too_long(key)
            pieces.append(piece)

        def flush() -> None:
            if buf:
                put(("qlit" if quoted else "lit", "".join(buf)))
                buf.clear()

        i, n = 0, len(raw)
        while i < n:
            c = raw[i]
            if c == "\\":
                nxt = raw[i + 1:i + 2]
                if nxt == "\n":
                    i += 2
                elif quoted:
                    if nxt in ('$', '`', '"', "\\"):
                        buf.append(nxt)
                        i += 2
                    else:
                        buf.append(c)
                        i += 1
                else:
                    flush()
                    put(("qlit", nxt))
                    i += 2
                continue
            if not quoted and c == "'":
                j = _skip_single(raw, i)
                flush()
                put(("qlit", raw[i + 1:j - 1]))
                i = j
                continue
            if not quoted and c == '"':
                j = _skip_double(raw, i)
                flush()
                for piece in self.scan(raw[i + 1:j - 1], ctx, key, quoted=True) or [("qlit", "")]:
                    put(piece)
                i = j
                continue
            if c == "$":
                nxt = raw[i + 1:i + 2]
                if not quoted and nxt == "'":
                    j = _skip_ansi(raw, i)
                    flush()
                    put(("qlit", _ansi(raw[i + 2:j - 1])))
                    i = j
                    continue
                if not quoted and nxt == '"':
                    i += 1  # $"..." (a translated string) is "..."
                    continue
                piece, j = self.dollar(raw, i, ctx, key, quoted)
                if piece is None:
                    buf.append("$")
                    i += 1
                    continue
                flush()
                # A default's word: its unquoted text splits as the expansion it is, its quoted text stays
                for part in ([("exp", v) if k == "lit" else (k, v) for k, v in piece[1]] if piece[0] == "pieces"
                             else [piece]):
                    put(part)
                i = j
                continue
            if c == "`":
                j = _skip_backtick(raw, i)
                flush()
                pieces.append(self.substitute(raw[i + 1:j - 1], ctx, quoted, key))
                i = j
                continue
            buf.append(c)
            i += 1
        flush()
        return pieces

    def dollar(self, raw: str, i: int, ctx: _Ctx, key: str, quoted: bool):
        kind = "qexp" if quoted else "exp"
        if raw.startswith("$((", i):
            j = _skip_paren(raw, i + 1)
            if raw[j - 2:j] == "))":
                value = self.arith_expansion(raw[i + 3:j - 2], ctx, key)
                return (kind, value), j
        nxt = raw[i + 1:i + 2]
        if nxt == "(":
            j = _skip_paren(raw, i + 1)
            return self.substitute(raw[i + 2:j - 1], ctx, quoted, key), j
        if nxt == "{":
            j = _skip_brace(raw, i + 1)
            return self.parameter(raw[i + 2:j - 1], ctx, key, quoted), j
        m = _SIMPLE_PARAM.match(raw, i + 1)
        if not m:
            return None, i + 1
        return self.parameter(m.group(0), ctx, key, quoted), m.end()

    def substitute(self, command: str, ctx: _Ctx, quoted: bool, key: str):
        """``$(command)``: never run; a caller may know its output (``command_output``)."""
        output = self.command_output(command) if self.command_output is not None else None
        if output is None:
            ctx.deps.setdefault(f"$({one_line(' '.join(command.split()), 60)})", "not run: read as empty")
            output = ""
        output = output.rstrip("\n")
        if len(output) > MAX_EXPANDED_CHARS:
            raise self.too_long(key)
        return ("qexp" if quoted else "exp", output)

    def parameter(self, inner: str, ctx: _Ctx, key: str, quoted: bool):
        kind_s, kind_l = ("qexp", "qat") if quoted else ("exp", "at")
        if inner.startswith("#") and len(inner) > 1 and inner not in ("##",):
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*])(?:\[([^\]]*)\])?", inner[1:])
            if m:
                value, _ = self.lookup(m.group(1), m.group(2), ctx)
                if value is None:
                    return (kind_s, "0")
                return (kind_s, str(len(value)))
        if inner.startswith("!"):
            ctx.deps.setdefault("${" + one_line(inner, 40) + "}", "an indirect expansion: read as empty")
            return (kind_s, "")
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!\-])(?:\[([^\]]*)\])?", inner)
        if not m:
            raise ScriptSyntax(f"line {self.line}", f"a bad substitution ${{{one_line(inner, 40)}}}")
        name, index = m.group(1), m.group(2)
        rest = inner[m.end():]
        value, is_set = self.lookup(name, index, ctx)
        splat = index in ("@", "*") or name in ("@", "*")
        star = index == "*" or name == "*"
        label = name if not name.isdigit() else f"${name}"
        op_match = _PARAM_OP.match(rest)
        op = op_match.group(0) if op_match else ""
        if rest and not op:
            raise ScriptSyntax(f"line {self.line}", f"a bad substitution ${{{one_line(inner, 40)}}}")
        if not is_set and op[-1:] not in ("-", "=", "+"):
            ctx.deps.setdefault(label, _READ_EMPTY)
            value = [] if splat else ""
        if op in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
            word = rest[len(op):]
            null = not is_set or (op.startswith(":") and _joined(value) == "")
            if op[-1] in "-=":
                if null and not quoted and op[-1] == "-":  # unquoted: the word's own quoting holds
                    pieces = self.scan(word, ctx, key)
                    default = "".join(_joined(v) for _, v in pieces)
                    if not is_set:
                        ctx.deps.setdefault(label, f"is not set by the script: read as its default {default!r}"
                                            if default else _READ_EMPTY)
                    return ("pieces", pieces)
                if null:
                    default = self.string(word, ctx, key)
                    if not is_set:
                        ctx.deps.setdefault(label, f"is not set by the script: read as its default {default!r}"
                                            if default else _READ_EMPTY)
                    if op[-1] == "=" and _NAME.fullmatch(name):
                        self.set_var(name, default, ctx.deps)
                    value = default
            elif op[-1] == "+":
                if not is_set:
                    ctx.deps.setdefault(label, _READ_EMPTY)
                if not null and not quoted:
                    return ("pieces", self.scan(word, ctx, key))
                value = "" if null else self.string(word, ctx, key)
            elif null:
                ctx.deps.setdefault(label, _READ_EMPTY)
                value = "" if not splat else []
        elif op in ("#", "##", "%", "%%"):
            pattern = self.pattern(rest[len(op):], ctx, key)
            value = self.each(value, lambda v: _trim(v, pattern, op, name))
        elif op.startswith("/"):
            body = rest[len(op):]
            pat_raw, _, replacement = _split_replacement(body)
            pattern = self.pattern(pat_raw, ctx, key)
            replacement = self.string(replacement, ctx, key)
            value = self.each(value, lambda v: _replace(v, pattern, replacement, op, name))
        elif op in ("^^", "^", ",,", ","):
            upper = op.startswith("^")
            whole = len(op) == 2
            value = self.each(value, lambda v: (v.upper() if upper else v.lower()) if whole else
                              ((v[:1].upper() if upper else v[:1].lower()) + v[1:]))
        elif op == ":":
            parts = rest[1:].split(":", 1)
            offset = self.arith(parts[0], ctx, key)
            length = self.arith(parts[1], ctx, key) if len(parts) > 1 else None
            if splat:
                items = value if isinstance(value, list) else [value]
                start = offset if offset >= 0 else max(0, len(items) + offset)
                value = items[start:] if length is None else items[start:start + max(length, 0)]
            else:
                text = _joined(value)
                start = offset if offset >= 0 else max(0, len(text) + offset)
                if length is None:
                    value = text[start:]
                else:
                    end = start + length if length >= 0 else len(text) + length
                    value = text[start:end]
        if isinstance(value, list):
            if star and quoted:
                return (kind_s, " ".join(value))
            if splat:
                return (kind_l, value)
            value = " ".join(value)
        return (kind_s, value)

    def each(self, value, function):
        return [function(v) for v in value] if isinstance(value, list) else function(value)

    def fields(self, raw: str, ctx: _Ctx, key: str) -> list[str]:
        """The words ``raw`` expands to, split as bash splits unquoted expansions (IFS unset)."""
        fields: list[str] = []
        current: Optional[str] = None
        size = 0

        def push() -> None:
            nonlocal current
            if current is not None:
                fields.append(current)
                current = None

        def add(text: str) -> None:
            nonlocal current, size
            size += len(text)
            if size > MAX_EXPANDED_CHARS:
                raise self.too_long(key)
            current = (current or "") + text

        def split(text: str) -> None:
            if not text:
                return
            if text[0] in " \t\n":
                push()
            for k, part in enumerate(p for p in re.split(r"[ \t\n]+", text) if p):
                if k:
                    push()
                add(part)
            if text[-1] in " \t\n":
                push()

        for kind, value in self.scan(raw, ctx, key):
            if kind in ("lit", "qlit", "qexp"):
                add(value)
            elif kind == "exp":
                split(value)
            else:  # at, qat: each element a word of its own
                for k, element in enumerate(value):
                    if k:
                        push()
                    if kind == "qat":
                        add(element)
                    else:
                        split(element)
            if len(fields) > MAX_EXPANDED_CHARS:
                raise self.too_long(key)
        push()
        return fields

    def string(self, raw: str, ctx: _Ctx, key: str) -> str:
        """``raw`` expanded without splitting (an assignment's value, a default, a [[ ]] operand)."""
        out, size = [], 0
        for _, value in self.scan(raw, ctx, key):
            text = _joined(value)
            size += len(text)
            if size > MAX_EXPANDED_CHARS:
                raise self.too_long(key)
            out.append(text)
        return "".join(out)

    def pattern(self, raw: str, ctx: _Ctx, key: str) -> list:
        """``raw`` as a glob: what is quoted matches itself."""
        parts = []
        for kind, value in self.scan(raw, ctx, key):
            parts.append((_joined(value), kind in ("lit", "exp", "at")))
        return _glob_tokens(parts)

    # --- arithmetic

    def arith_expansion(self, expression: str, ctx: _Ctx, key: str) -> str:
        return str(self.arith(self.string(expression, ctx, key) if "$" in expression or "`" in expression
                              else expression, ctx, key))

    def arith(self, expression: str, ctx: _Ctx, key: str) -> int:
        """The value of an arithmetic expression; _ExpansionError where bash fails on it."""
        try:
            return self.evaluate(_ArithParser(expression).parse(), ctx, 0)
        except _ArithError as error:
            raise _ExpansionError(f"$(({one_line(expression.strip(), 40)})) fails in bash ({error})") from None

    def evaluate(self, node, ctx: _Ctx, depth: int) -> int:
        kind = node[0]
        if kind == "num":
            return node[1]
        if kind == "var":
            return self.variable_value(node[1], ctx, depth)
        if kind == "un":
            value = self.evaluate(node[2], ctx, depth)
            return {"!": int(not value), "~": _wrap(~value), "+": value, "-": _wrap(-value)}[node[1]]
        if kind in ("pre", "post"):
            old = self.variable_value(node[2], ctx, depth)
            new = _wrap(old + (1 if node[1] == "++" else -1))
            self.set_var(node[2], str(new), ctx.deps)
            return new if kind == "pre" else old
        if kind == "assign":
            value = self.evaluate(node[3], ctx, depth)
            if node[1] != "=":
                value = _binary(node[1][:-1], self.variable_value(node[2], ctx, depth), value)
            self.set_var(node[2], str(value), ctx.deps)
            return value
        if kind == "comma":
            self.evaluate(node[1], ctx, depth)
            return self.evaluate(node[2], ctx, depth)
        if kind == "cond":
            return self.evaluate(node[2] if self.evaluate(node[1], ctx, depth) else node[3], ctx, depth)
        op, left = node[1], self.evaluate(node[2], ctx, depth)
        if op == "&&":
            return int(bool(left) and bool(self.evaluate(node[3], ctx, depth)))
        if op == "||":
            return int(bool(left) or bool(self.evaluate(node[3], ctx, depth)))
        return _binary(op, left, self.evaluate(node[3], ctx, depth))

    def variable_value(self, name: str, ctx: _Ctx, depth: int) -> int:
        value, is_set = self.lookup(name, None, ctx)
        if not is_set:
            ctx.deps.setdefault(name, "is not set by the script: read as 0")
            return 0
        text = _joined(value).strip()
        if not text:
            return 0
        if re.fullmatch(r"[0-9]+", text):
            return _number(text)
        if depth >= MAX_DEPTH:
            raise _ArithError(f"{name} refers to itself past {MAX_DEPTH} levels")
        return self.evaluate(_ArithParser(text).parse(), ctx, depth + 1)

    # --- running

    def run_program(self, program: _List) -> None:
        """The script's commands; an expansion bash fails on abandons the rest of its line."""
        abandoned = None  # where the line that failed ends so far
        for item in program.items:
            end = (item.rest[-1][1] if item.rest else item.first).end
            if abandoned is not None and not re.search(r"(?<!\\)\n", self.text[abandoned:item.first.start]):
                abandoned = end
                continue
            abandoned = None
            try:
                self.run_and_or(item)
            except _ExpansionError as error:
                self.note(f"{error}, so bash abandons the rest of the line", None)
                abandoned = end

    def run_list(self, body: _List) -> _Status:
        status = _TRUE
        for item in body.items:
            status = self.run_and_or(item)
        return status

    def run_and_or(self, node: _AndOr) -> _Status:
        status = self.run_pipeline(node.first)
        left_end = node.first.end
        for op, pipeline in node.rest:
            wanted = op == "&&"
            decided = status.known is not None
            if decided:
                run = status.known == wanted
            elif _pipeline_exits(pipeline):
                run = False
            else:
                run = status.assumed == wanted
            right_text = self.text[pipeline.start:pipeline.end]
            matters = "=" in right_text or "--" in right_text or _pipeline_exits(pipeline)  # not: || mkdir -p
            if not self.in_condition and matters and (status.deps or (not decided and status.test)):
                left = self.source(node.first.start, left_end)
                outcome = run == wanted
                self.line = self.line_of(node.first.start)
                self.note(f"{left} {self.why(status, outcome)}, so the script "
                          f"{'runs' if run else 'skips'} {self.source(pipeline.start, pipeline.end)}",
                          self.flags_in(pipeline.start, pipeline.end))
            if run:
                right = self.run_pipeline(pipeline)
                if decided:
                    status = right
                else:
                    known = _k3_and(None, right.known) if wanted else _k3_or(None, right.known)
                    status = _Status(known, right.assumed, {**status.deps, **right.deps},
                                     status.reason or right.reason, status.test and right.test)
            left_end = pipeline.end
        return status

    def why(self, status: _Status, outcome: bool) -> str:
        """'is true (X is not set by the script: read as empty)'."""
        said = "true" if outcome else "false"
        if status.known is None:
            return (f"cannot be decided without running anything ({status.reason or 'a command'}): "
                    f"read as {said}")
        return f"is {said} ({self.reasons(status.deps)})"

    @staticmethod
    def reasons(deps: dict) -> str:
        return "; ".join(f"{name} {how}" if how.startswith("is ") else f"{name}: {how}"
                         for name, how in list(deps.items())[:4])

    def run_pipeline(self, node: _Pipeline) -> _Status:
        if len(node.commands) == 1:
            status = self.run_command(node.commands[0])
        else:  # each part of a pipeline runs in a subshell
            for command in node.commands:
                status = self.subshell(lambda c=command: self.run_command(c))
        if node.negate:
            status = _Status(None if status.known is None else not status.known, not status.assumed,
                             status.deps, status.reason, status.test)
        return status

    def subshell(self, run: Callable[[], _Status]) -> _Status:
        saved = (dict(self.vars), dict(self.funcs), list(self.positional), self.generation)
        self.generation = next(_GENERATIONS)  # what the subshell changes, it copies first
        try:
            return run()
        except _Exit:
            return _Status(None, True, reason="a subshell that exits")
        finally:
            self.vars, self.funcs, self.positional, self.generation = saved

    def run_command(self, node) -> _Status:
        if isinstance(node, _Simple):
            return self.run_simple(node)
        if isinstance(node, _If):
            return self.run_if(node)
        if isinstance(node, _Group):
            return self.subshell(lambda: self.run_list(node.body)) if node.subshell else self.run_list(node.body)
        if isinstance(node, _Test):
            self.step(node.start)
            ctx = _Ctx()
            known, assumed, reason = _CondParser(self, node.tokens, ctx).parse()
            return _Status(known, assumed, ctx.deps, reason, test=True)
        if isinstance(node, _Arith):
            self.step(node.start)
            ctx = _Ctx()
            try:
                value = self.arith(self.string(node.text, ctx, "((") if "$" in node.text else node.text, ctx, "((")
            except _ExpansionError:  # (( a b )): status 1
                return _Status(False, False, ctx.deps, test=True)
            return _Status(value != 0, value != 0, ctx.deps, test=True)
        if isinstance(node, _For):
            return self.run_for(node)
        if isinstance(node, _ArithFor):
            return self.run_arith_for(node)
        if isinstance(node, _While):
            return self.run_while(node)
        if isinstance(node, _Case):
            return self.run_case(node)
        if isinstance(node, _FuncDef):
            self.funcs[node.name] = node.body
            return _TRUE
        raise AssertionError(node)

    def condition(self, body: _List) -> _Status:
        self.in_condition += 1
        try:
            return self.run_list(body)
        finally:
            self.in_condition -= 1

    def run_if(self, node: _If) -> _Status:
        flags = self.flags_in(node.start, node.end)
        for k, (cond, body) in enumerate(node.clauses):
            status = self.condition(cond)
            last = k == len(node.clauses) - 1
            if status.known is not None:
                take = status.known
            elif _list_exits(body) and not (last and _list_exits(node.orelse)):
                take = False
            elif last and _list_exits(node.orelse) and not _list_exits(body):
                take = True
            else:
                take = status.assumed
            if status.deps or status.known is None:
                branch = "then" if k == 0 else "elif"
                if take:
                    went = f"takes its {branch} branch"
                elif not last:
                    went = f"goes on to the elif at line {self.line_of(node.clauses[k + 1][0].start)}"
                elif node.orelse is not None:
                    went = "takes its else branch"
                else:
                    went = f"skips its {branch} branch (no branch of this if runs)"
                self.line = self.line_of(cond.start)
                self.note(f"{'if' if k == 0 else 'elif'} {self.source(cond.start, cond.end)} "
                          f"{self.why(status, take)}, so the script {went}", flags)
            if take:
                return self.run_list(body)
        return self.run_list(node.orelse) if node.orelse is not None else _TRUE

    def loop_body(self, body: _List) -> Optional[str]:
        """Runs one iteration: 'break' or None."""
        try:
            self.run_list(body)
        except _LoopControl as control:
            if control.levels > 1:
                control.levels -= 1
                raise
            return "break" if control.kind == "break" else None
        return None

    def run_for(self, node: _For) -> _Status:
        self.step(node.start)
        if node.items is None:
            items = list(self.positional)
        else:
            ctx = _Ctx()
            items = []
            for tok in node.items:
                items += self.fields(tok.text, ctx, node.name)
                if sum(len(w) + 1 for w in items) > MAX_EXPANDED_CHARS:
                    raise self.too_long(node.name)
        for item in items:
            self.step(node.start)
            self.set_var(node.name, item, {})
            if self.loop_body(node.body) == "break":
                break
        return _TRUE

    def run_arith_for(self, node: _ArithFor) -> _Status:
        ctx = _Ctx()
        self.step(node.start)
        if node.init.strip():
            self.arith(node.init, ctx, "for")
        while True:
            self.step(node.start)
            value = self.arith(node.cond, ctx, "for") if node.cond.strip() else 1
            if not value or self.loop_body(node.body) == "break":
                break
            if node.step.strip():
                self.arith(node.step, ctx, "for")
        return _TRUE

    def run_while(self, node: _While) -> _Status:
        first = True
        while True:
            self.step(node.start)
            status = self.condition(node.cond)
            if status.known is None:
                run = False if first or status.test else status.assumed
            else:
                run = status.known != node.until
            if first and (status.deps or status.known is None):
                self.line = self.line_of(node.cond.start)
                outcome = run != node.until
                self.note(f"{'until' if node.until else 'while'} {self.source(node.cond.start, node.cond.end)} "
                          f"{self.why(status, outcome)}, so the loop "
                          f"{'runs' if run else 'does not run'}")
            first = False
            if not run or self.loop_body(node.body) == "break":
                return _TRUE

    def run_case(self, node: _Case) -> _Status:
        self.step(node.start)
        ctx = _Ctx()
        word = self.string(node.word.text, ctx, "case")
        matching = False
        for patterns, body, terminator in node.items:
            if not matching:
                for pattern in patterns:
                    tokens = self.pattern(pattern.text, ctx, "case")
                    if _match_bounded(tokens, word, "case"):
                        matching = True
                        if ctx.deps:
                            self.line = self.line_of(node.start)
                            self.note(f"case {one_line(node.word.text, 60)} ({self.reasons(ctx.deps)}): the "
                                      f"script takes the branch {one_line(pattern.text, 40)})",
                                      self.flags_in(node.start, node.end))
                        break
            if matching:
                self.run_list(body)
                if terminator == ";;":
                    return _TRUE
                if terminator == ";;&":
                    matching = False
        if not matching and ctx.deps:
            self.line = self.line_of(node.start)
            self.note(f"case {one_line(node.word.text, 60)} ({self.reasons(ctx.deps)}): no branch of it runs",
                      self.flags_in(node.start, node.end))
        return _TRUE

    def run_simple(self, node: _Simple) -> _Status:
        self.step(node.start)
        words = node.words
        k = 0
        while k < len(words) and (words[k].kind == "array" or _is_assignment(words[k].text)):
            k += 1
        assignments, rest = words[:k], words[k:]
        if not rest:
            for tok in assignments:
                self.assign(tok)
            return _TRUE
        if rest[0].kind == "word" and rest[0].text in _DECLARATIONS:
            return self.declare(rest)
        ctx = _Ctx()
        key = rest[0].text if rest[0].kind == "word" else "array"
        fields: list[str] = []
        size = 0
        for tok in rest:
            words = self.fields(tok.text, ctx, one_line(key, 60)) if tok.kind == "word" else [tok.text]
            size += sum(len(w) + 1 for w in words)
            if size > MAX_EXPANDED_CHARS:
                raise self.too_long(one_line(key, 60))
            fields += words
        if not fields:  # $EMPTY alone: the assignments stay
            for tok in assignments:
                self.assign(tok)
            return _TRUE
        return self.builtin(fields, ctx, node)

    def declare(self, rest: list[_Tok]) -> _Status:
        command = rest[0].text
        exported = True if command == "export" else None
        for tok in rest[1:]:
            if tok.kind == "array" or _is_assignment(tok.text):
                self.assign(tok, exported=exported)
            elif tok.text.startswith(("-", "+")):
                if "x" in tok.text and tok.text.startswith("-"):
                    exported = True
            else:
                for name in self.fields(tok.text, _Ctx(), command):
                    var = self.vars.get(name)
                    if var is not None and exported:
                        var.exported = True
        return _TRUE

    def builtin(self, fields: list[str], ctx: _Ctx, node: _Simple) -> _Status:
        name, args = fields[0], fields[1:]
        if name == "exit":
            raise _Exit()
        if name == "return":
            raise _Return(_TRUE if not args or args[0] == "0" else _FALSE)
        if name in ("break", "continue"):
            levels = int(args[0]) if args and args[0].isdigit() and int(args[0]) > 0 else 1
            raise _LoopControl(name, levels)
        if name in (":", "true"):
            return _TRUE
        if name == "false":
            return _FALSE
        if name in ("[", "test"):
            if name == "[":
                if not args or args[-1] != "]":
                    return _Status(False, False, ctx.deps, test=True)
                args = args[:-1]
            known, assumed, reason = _test_words(args, self, ctx)
            return _Status(known, assumed, ctx.deps, reason, test=True)
        if name == "set":
            if args[:1] == ["--"]:
                self.positional, self.positional_known = args[1:], True
            return _TRUE
        if name == "shift":
            count = int(args[0]) if args and args[0].isdigit() else 1
            if count > len(self.positional):
                return _FALSE
            self.positional = self.positional[count:]
            return _TRUE
        if name == "unset":
            functions = "-f" in args
            for arg in args:
                if not arg.startswith("-"):
                    (self.funcs if functions else self.vars).pop(arg, None)
            return _TRUE
        if name == "let":
            value = 0
            try:
                for arg in args:
                    value = self.arith(arg, ctx, "let")
            except _ExpansionError:  # let: status 1
                return _Status(False, False, ctx.deps, test=True)
            return _Status(value != 0, value != 0, ctx.deps, test=True)
        if name in ("read", "getopts"):
            return _FALSE  # no input, no options: bash's answer with none
        if name in ("source", ".", "eval"):
            what = "followed" if name != "eval" else "evaluated"
            self.note(f"{one_line(' '.join(fields), 80)} is not {what}: what it would set reads as unset")
            return _Status(None, True, reason=f"{name} is not {what}")
        if name in self.funcs:
            return self.call(self.funcs[name], args)
        shell = _inline_script(fields)
        if shell is not None:
            self.run_inline(shell, node)
        unset = tuple(name for name, how in ctx.deps.items() if how == _READ_EMPTY)
        self.commands.append(Command(tuple(fields), self.line_of(node.start), unset))
        return _Status(None, True, reason=f"{one_line(name, 40)} is not run")

    def call(self, body, args: list[str]) -> _Status:
        if self.depth >= MAX_DEPTH:
            raise ScriptLimit(f"line {self.line}", f"calls functions past {MAX_DEPTH} levels deep")
        saved = (self.positional, self.positional_known)
        self.positional, self.positional_known = list(args), True
        self.depth += 1
        try:
            return self.run_command(body)
        except _Return as returned:
            return returned.status
        finally:
            self.depth -= 1
            self.positional, self.positional_known = saved

    def run_inline(self, inline: tuple[str, list[str]], node: _Simple) -> None:
        """``bash -c 'script' name args``: read as a script of its own, with the exported variables."""
        text, positional = inline
        if self.depth >= MAX_DEPTH:
            raise ScriptLimit(f"line {self.line}", f"nests bash -c past {MAX_DEPTH} levels")
        exported = {name: var for name, var in self.vars.items() if var.exported}
        inner = read_script(text, f"{self.name} (bash -c at line {self.line_of(node.start)})", self.command_output,
                            variables=exported, positional=positional[1:], _steps=self.steps,
                            _depth=self.depth + 1, _argv0=positional[0] if positional else "bash")
        self.commands += inner.commands
        for note in inner.notes:
            self.note_as_is(note)


def _inline_script(fields: list[str]) -> Optional[tuple[str, list[str]]]:
    for k, word in enumerate(fields[:-2]):
        if word.rsplit("/", 1)[-1] in ("bash", "sh") and fields[k + 1] == "-c":
            return fields[k + 2], fields[k + 3:]
    return None


def _is_assignment(text: str) -> bool:
    match = _ASSIGNMENT.match(text)
    return match is not None


def _binary(op: str, a: int, b: int) -> int:
    if op in ("/", "%"):
        if b == 0:
            raise _ArithError("division by 0")
        quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)  # C truncation
        return _wrap(quotient if op == "/" else a - b * quotient)
    if op == "**":
        if b < 0:
            raise _ArithError("exponent less than 0")
        return _wrap(pow(a, b, 1 << 64))
    if op in ("<<", ">>"):
        return _wrap(a << (b & 63)) if op == "<<" else a >> (b & 63)
    return _wrap({"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "&": lambda: a & b,
                  "|": lambda: a | b, "^": lambda: a ^ b, "==": lambda: int(a == b), "!=": lambda: int(a != b),
                  "<": lambda: int(a < b), ">": lambda: int(a > b), "<=": lambda: int(a <= b),
                  ">=": lambda: int(a >= b)}[op]())


def _ansi(text: str) -> str:
    escapes = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f",
               "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}
    return re.sub(r"\\(.)", lambda m: escapes.get(m.group(1), m.group(0)), text)


def _split_replacement(body: str) -> tuple[str, str, str]:
    i = 0
    while i < len(body):
        if body[i] == "\\":
            i += 2
            continue
        if body[i] == "/":
            return body[:i], "/", body[i + 1:]
        i += 1
    return body, "", ""


def _match_bounded(tokens: list, text: str, name: str) -> bool:
    if len(text) * (len(tokens) + 1) > MAX_PATTERN_WORK:
        raise ScriptLimit(name, f"matches a pattern against {len(text):,} characters, past the bound")
    return _glob_match(tokens, text)


def _check_work(text: str, tokens: list, name: str) -> None:
    if len(text) ** 2 * (len(tokens) + 1) > MAX_PATTERN_WORK:
        raise ScriptLimit(name, f"trims a pattern from {len(text):,} characters, past the bound")


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


class _TestFailed(Exception):
    pass


class _CondParser:
    """``[[ ... ]]``: operands expanded without splitting; == and != match patterns."""

    def __init__(self, shell: _Shell, tokens: list[_Tok], ctx: _Ctx):
        self.shell, self.tokens, self.ctx, self.k = shell, tokens, ctx, 0
        self.reasons: list[str] = []

    def peek(self, ahead: int = 0) -> Optional[_Tok]:
        k = self.k + ahead
        return self.tokens[k] if k < len(self.tokens) else None

    def parse(self):
        try:
            known, assumed = self.or_()
            if self.peek() is not None:
                raise ScriptSyntax(f"line {self.shell.line}", f"unexpected {one_line(self.peek().text, 30)!r} in [[ ]]")
        except _TestFailed:
            return False, False, ""
        except IndexError:
            raise ScriptSyntax(f"line {self.shell.line}", "an incomplete [[ ]]") from None
        return known, assumed, ", ".join(dict.fromkeys(self.reasons))

    def is_op(self, text: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == "op" and tok.text == text

    def or_(self):
        known, assumed = self.and_()
        while self.is_op("||"):
            self.k += 1
            k2, a2 = self.and_()
            known, assumed = _k3_or(known, k2), assumed or a2
        return known, assumed

    def and_(self):
        known, assumed = self.not_()
        while self.is_op("&&"):
            self.k += 1
            k2, a2 = self.not_()
            known, assumed = _k3_and(known, k2), assumed and a2
        return known, assumed

    def not_(self):
        tok = self.peek()
        if tok is not None and tok.kind == "word" and tok.text == "!":
            self.k += 1
            known, assumed = self.not_()
            return (None if known is None else not known), not assumed
        return self.primary()

    def word(self) -> str:
        tok = self.tokens[self.k]
        self.k += 1
        return self.shell.string(tok.text, self.ctx, "[[") if tok.kind == "word" else tok.text

    def primary(self):
        tok = self.peek()
        if tok is None:
            raise IndexError
        if tok.kind == "op" and tok.text == "(":
            self.k += 1
            result = self.or_()
            if not self.is_op(")"):
                raise IndexError
            self.k += 1
            return result
        nxt = self.peek(1)
        binary = nxt is not None and ((nxt.kind == "word" and nxt.text in _BINARY_TESTS) or
                                      (nxt.kind == "op" and nxt.text in ("<", ">")))
        if tok.kind == "word" and tok.text in _UNARY_TESTS and not binary and nxt is not None and \
                not (nxt.kind == "op" and nxt.text in ("&&", "||", ")")):
            self.k += 1
            return self.unary(tok.text, self.word())
        left = self.word()
        if binary:
            op = self.tokens[self.k].text
            self.k += 1
            right_tok = self.tokens[self.k]
            if op in ("==", "=", "!=") and right_tok.kind == "word":
                self.k += 1
                tokens = self.shell.pattern(right_tok.text, self.ctx, "[[")
                hit = _match_bounded(tokens, left, "[[")
                result = hit if op != "!=" else not hit
                return result, result
            if op == "=~":
                while self.peek() is not None and not (self.peek().kind == "op" and self.peek().text in ("&&", "||")):
                    self.k += 1  # a regular expression: not modelled
                self.reasons.append("a regular expression match")
                return None, False
            right = self.word()
            return self.binary(left, op, right, arithmetic=True)
        return left != "", left != ""

    def unary(self, op: str, operand: str):
        return _unary(op, operand, self.shell, self.ctx, self.reasons)

    def binary(self, left: str, op: str, right: str, arithmetic: bool):
        return _binary_test(left, op, right, self.shell, self.ctx, self.reasons, arithmetic)


def _unary(op: str, operand: str, shell: _Shell, ctx: _Ctx, reasons: list[str]):
    if op == "-n":
        return operand != "", operand != ""
    if op == "-z":
        return operand == "", operand == ""
    if op == "-v":
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[([^\]]*)\])?", operand)
        if not m:
            return False, False
        _, is_set = shell.lookup(m.group(1), m.group(2), ctx)
        if not is_set:
            ctx.deps.setdefault(m.group(1), "is not set by the script")
        return is_set, is_set
    reasons.append(f"a file test, {op}" if op in _FILE_TESTS else f"the test {op}")
    return None, False


def _binary_test(left: str, op: str, right: str, shell: _Shell, ctx: _Ctx, reasons: list[str], arithmetic: bool):
    if op in ("=", "=="):
        return left == right, left == right
    if op == "!=":
        return left != right, left != right
    if op in ("<", ">"):
        result = left < right if op == "<" else left > right
        return result, result
    if op in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge"):
        if arithmetic:
            try:
                a, b = shell.arith(left, ctx, "[["), shell.arith(right, ctx, "[[")
            except _ExpansionError:  # [[ a b -eq 1 ]]: the whole test is status 1
                raise _TestFailed() from None
        else:
            a = int(left) if re.fullmatch(r"\s*[-+]?[0-9]+\s*", left) else None
            b = int(right) if re.fullmatch(r"\s*[-+]?[0-9]+\s*", right) else None
            if a is None or b is None:
                return False, False  # [: integer expression expected (status 2)
        result = {"-eq": a == b, "-ne": a != b, "-lt": a < b, "-le": a <= b, "-gt": a > b, "-ge": a >= b}[op]
        return result, result
    reasons.append(f"a file comparison, {op}" if op in ("-nt", "-ot", "-ef") else f"the test {op}")
    return None, False


def _test_words(args: list[str], shell: _Shell, ctx: _Ctx):
    """``[ ... ]`` / ``test ...`` on expanded words, by bash's rules on their count."""
    reasons: list[str] = []

    def one(a: list[str]):
        n = len(a)
        if n == 0:
            return False, False
        if n == 1:
            return a[0] != "", a[0] != ""
        if n == 2:
            if a[0] == "!":
                k, s = one(a[1:])
                return (None if k is None else not k), not s
            if a[0] in _UNARY_TESTS:
                return _unary(a[0], a[1], shell, ctx, reasons)
            return False, False
        if n == 3:
            if a[1] in ("-a", "-o"):
                k1, s1 = one(a[:1])
                k2, s2 = one(a[2:])
                return (_k3_and(k1, k2), s1 and s2) if a[1] == "-a" else (_k3_or(k1, k2), s1 or s2)
            if a[1] in _BINARY_TESTS and a[1] != "=~":
                return _binary_test(a[0], a[1], a[2], shell, ctx, reasons, arithmetic=False)
            if a[0] == "!":
                k, s = one(a[1:])
                return (None if k is None else not k), not s
            if a[0] == "(" and a[2] == ")":
                return one(a[1:2])
            return False, False
        if n == 4 and a[0] == "!":
            k, s = one(a[1:])
            return (None if k is None else not k), not s
        # -o binds looser than -a
        for joiner in ("-o", "-a"):
            for i in range(len(a) - 1, 0, -1):
                if a[i] == joiner and i < len(a) - 1:
                    k1, s1 = one(a[:i])
                    k2, s2 = one(a[i + 1:])
                    return (_k3_or(k1, k2), s1 or s2) if joiner == "-o" else (_k3_and(k1, k2), s1 and s2)
        if a[0] == "(" and a[-1] == ")":
            return one(a[1:-1])
        return False, False

    known, assumed = one(args)
    return known, assumed, ", ".join(dict.fromkeys(reasons))


def read_script(text: str, name: str, command_output: Optional[Callable[[str], Optional[str]]] = None, *,
                variables: Optional[dict] = None, positional: Optional[list] = None,
                _steps: Optional[list] = None, _depth: int = 0, _argv0: Optional[str] = None) -> Script:
    """The commands the bash script ``text`` would start, and notes on the branches it took on
    what it does not set. ``command_output(command)`` may give the output of a ``$(command)``
    (None: not known, read as empty); ``name`` is the script's name ($0, ${BASH_SOURCE[0]})."""
    if len(text) > MAX_EXPANDED_CHARS:
        raise ScriptLimit("", f"holds {len(text):,} characters, past the {MAX_EXPANDED_CHARS:,} a launch script "
                              "is read to")
    newlines = [m.start() for m in re.finditer("\n", text)]

    def line_of(offset: int) -> int:
        return bisect.bisect_left(newlines, offset) + 1

    try:
        tokens = _lex(text, line_of)
        parser = _Parser(tokens, text, line_of)
        program = parser.parse_list()
        if parser.peek() is not None:
            raise parser.error(parser.peek(), f"unexpected {one_line(parser.peek().text, 40)!r}")
        shell = _Shell(text, name, command_output, line_of, variables, positional, _steps, _depth, _argv0)
        try:
            shell.run_program(program)
        except _Exit:
            pass
        except _Return:
            pass
        except _LoopControl:
            pass
    except RecursionError:
        raise ScriptLimit("", "nests too deeply to read") from None
    except _Unterminated as error:  # inside text the lexer kept whole, such as (( ... ))
        raise ScriptSyntax(f"line {shell.line}", f"an unterminated {error.what}") from None
    notes = shell.notes
    if shell.more_notes:
        notes = notes + [Note(f"{name}: {shell.more_notes} more branches decided on what the script does not set",
                              None)]
    return Script(shell.commands, notes)
