"""The script's syntax: the commands, lists, pipelines and compound commands bash parses from
the lexer's tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ...errors import one_line
from .errors import ScriptSyntax
from .lexer import _ASSIGNMENT, _NAME, _REDIRECTS, _Tok

# The builtins whose NAME=value words are assignments, NAME=(...) ones included (bash's parse.y: W_ASSIGNARG).
_DECLARATIONS = {"export", "declare", "typeset", "local", "readonly"}


@dataclass
class _List:
    items: list
    start: int = 0
    end: int = 0


@dataclass
class _Simple:
    words: list[_Tok]
    start: int
    # A here-document fed to the command (<<EOF ... EOF): its body, and whether its delimiter was
    # quoted (then taken as written; else expanded as bash expands it).
    heredoc: Optional[tuple[str, bool]] = None
    herestring: Optional[_Tok] = None  # <<< WORD: the word, unexpanded


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
    select: bool = False  # select NAME in ...: a menu whose choice is read from the input


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
    background: bool = False  # ended by &: bash runs it in a subshell, asynchronously


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
            item.background = self.op(tok, "&")
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
        while True:
            if self.word(self.peek(), "!"):
                negate = not negate
                self.k += 1
            elif self.word(self.peek(), "time") and self.command_at(self.after_time(self.k + 1)):
                # The reserved word time (Bash Reference Manual, 3.2.3 Pipelines: time [-p] [!] pipeline; bash's
                # parser takes a -- after it too) times the pipeline: what follows is the command, so that
                # `time X=3 torchrun` passes X=3 and `time f` calls the function f.
                self.k = self.after_time(self.k + 1)
            else:
                break
        commands = [self.parse_command()]
        while self.op(self.peek(), "|", "|&"):
            self.k += 1
            self.skip_newlines()
            commands.append(self.parse_command())
        last = self.tokens[self.k - 1]
        return _Pipeline(commands, negate, start_tok.start if start_tok else 0, last.end)

    def after_time(self, k: int) -> int:
        """The token after the reserved word time's options, ``-p`` and ``--``, from the k-th."""
        for option in ("-p", "--"):
            if k < len(self.tokens) and self.word(self.tokens[k], option):
                k += 1
        return k

    def command_at(self, k: int) -> bool:
        """Whether the k-th token can start a command (a time with none after it is a command named time)."""
        return k < len(self.tokens) and (self.tokens[k].kind != "op" or self.tokens[k].text == "(")

    def parse_command(self):
        tok = self.peek()
        if tok is None:
            raise self.error(None, "a command is missing before the end of the script")
        node = None
        if tok.kind == "word":
            keyword = tok.text
            if keyword == "if":
                node = self.parse_if()
            elif keyword in ("for", "select"):
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
        heredoc = herestring = None
        while True:
            tok = self.peek()
            if tok is None:
                break
            if tok.kind in ("word", "array"):
                if tok.kind == "array" and not _takes_array(words):
                    raise self.error(tok, "unexpected '(' (a NAME=(...) word after a command's name)")
                words.append(tok)
                self.k += 1
            elif tok.kind == "op" and tok.text in _REDIRECTS:
                self.k += 1
                target = self.peek()
                if not self.word(target):
                    raise self.error(target, "a redirection without its file")
                if tok.text in ("<<", "<<-") and target.elements:
                    heredoc = (target.elements[0], target.elements[1] == "quoted")
                if tok.text == "<<<":
                    herestring = target
                self.k += 1
                redirected = True
            else:
                break
        if not words and not redirected:
            raise self.error(self.peek(), f"unexpected {one_line(self.peek().text, 40)!r}")
        return _Simple(words, start, heredoc, herestring)

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
        select = self.word(self.peek(), "select")
        start = self.expect_word("select" if select else "for").start
        if not select and self.op(self.peek(), "(") and self.op(self.peek(1), "("):
            text = self.parse_double_paren()
            parts = text.split(";")
            if len(parts) != 3:
                raise self.error(self.peek(), "expected for (( init; condition; step ))")
            return _ArithFor(parts[0], parts[1], parts[2], self.parse_do_group(), start)
        name = self.peek()
        if not self.word(name) or not _NAME.fullmatch(name.text):
            raise self.error(name, f"expected a loop variable after {'select' if select else 'for'}")
        self.k += 1
        self.skip_newlines()
        items = None
        if self.word(self.peek(), "in"):
            self.k += 1
            items = []
            while self.word(self.peek()):
                items.append(self.peek())
                self.k += 1
        return _For(name.text, items, self.parse_do_group(), start, select)

    def parse_do_group(self) -> _List:
        """A loop's ``do ... done``, after the separators before it."""
        while self.op(self.peek(), "\n", ";"):
            self.k += 1
        self.expect_word("do")
        body = self.parse_list(stop_words=("done",))
        self.expect_word("done")
        return body

    def parse_while(self) -> _While:
        tok = self.peek()
        self.k += 1
        cond = self.parse_list(stop_words=("do",))
        return _While(cond, self.parse_do_group(), tok.text == "until", tok.start)

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


def _takes_array(words: list[_Tok]) -> bool:
    """Whether bash parses a NAME=(...) word after ``words``: among the command's own NAME=value prefixes, or
    among a declaration's words (``export A=(1 2)``); after another command's name (``torchrun a.py A=(1 2)``,
    ``command export A=(1 2)``) it is a syntax error."""
    name = next((tok for tok in words if not (tok.kind == "array" or _ASSIGNMENT.match(tok.text))), None)
    return name is None or name.text in _DECLARATIONS
