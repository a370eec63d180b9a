"""Conditions: ``[[ ... ]]``, and ``[ ... ]``/``test`` on their expanded words; what cannot be decided
without running something (a file test, a regular expression re reads otherwise than POSIX) is unknown,
with the outcome read."""

from __future__ import annotations

import re
from typing import Optional

from ...errors import one_line
from .arith import _ExpansionError
from .errors import ScriptSyntax
from .expand import _Expander
from .lexer import _Tok
from .patterns import _match_bounded
from .regex import REFUSED, ere_search
from .state import REMATCH_UNKNOWN, _Ctx
from .status import _k3_and, _k3_or

_UNARY_TESTS = {"-n", "-z", "-v", "-a", "-b", "-c", "-d", "-e", "-f", "-g", "-h", "-k", "-p", "-r", "-s", "-t",
                "-u", "-w", "-x", "-G", "-L", "-N", "-O", "-S", "-o", "-R"}
_BINARY_TESTS = {"=", "==", "!=", "<", ">", "-eq", "-ne", "-lt", "-le", "-gt", "-ge", "=~", "-nt", "-ot", "-ef"}
_FILE_TESTS = _UNARY_TESTS - {"-n", "-z", "-v", "-o", "-R", "-t"}


class _TestFailed(Exception):
    pass


class _CondParser:
    """``[[ ... ]]``: operands expanded without splitting; == and != match patterns."""

    def __init__(self, shell: _Expander, tokens: list[_Tok], ctx: _Ctx):
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
                if self.shell.nocasematch:  # the pattern matched without regard to case: not followed
                    self.reasons.append("a pattern match under shopt -s nocasematch")
                    return None, False
                tokens = self.shell.pattern(right_tok.text, self.ctx, "[[")
                hit = _match_bounded(tokens, left, "[[")
                result = hit if op != "!=" else not hit
                return result, result
            if op == "=~":
                return self.regex_match(left)
            right = self.word()
            return self.binary(left, op, right, arithmetic=True)
        return left != "", left != ""

    def regex_match(self, left: str):
        """``=~``: its right operand is one word as bash reads it there, parentheses, ``|`` and the
        blanks inside parentheses its own; quoted characters in it match themselves."""
        first = self.tokens[self.k]
        end, depth = first.start, 0
        while True:
            tok = self.peek()
            if tok is None or (tok.start != end and depth <= 0) or \
                    (depth <= 0 and tok.kind == "op" and tok.text in ("&&", "||", ")")):
                break  # a ) the word has not opened closes a group of the test's (or is bash's syntax error)
            if tok.kind == "op" and tok.text in ("(", ")"):
                depth += 1 if tok.text == "(" else -1
            end = tok.end
            self.k += 1
        if depth > 0:  # bash reads on past ]] for the ), and stops at the end of the script
            raise ScriptSyntax(f"line {self.shell.line}", "an unmatched ( in the regular expression of [[ =~ ]] "
                                                          "(bash reads no further: a syntax error)")
        raw = self.shell.text[first.start:end]
        chars: list[tuple[str, bool]] = []
        for kind, value in self.shell.scan(raw, self.ctx, "[["):
            text = " ".join(value) if isinstance(value, list) else value
            chars += [(c, kind.startswith("q")) for c in text]
        hit, groups = ere_search(chars, left, icase=self.shell.nocasematch)
        # BASH_REMATCH: the match and its groups, emptied where nothing matches; a pattern regcomp
        # refuses leaves it as it was. Where that is not known, it is read as empty, and said where used.
        if groups == REFUSED:
            return False, False
        if groups is not None:
            self.shell.set_var("BASH_REMATCH", groups, self.ctx.deps)
        else:
            self.shell.set_var("BASH_REMATCH", [], {**self.ctx.deps, f"BASH_REMATCH (line {self.shell.line})":
                                                    REMATCH_UNKNOWN})
        if hit is None:
            self.reasons.append("a regular expression match" + (" under shopt -s nocasematch"
                                                                 if self.shell.nocasematch else ""))
            return None, False
        return hit, hit

    def unary(self, op: str, operand: str):
        return _unary(op, operand, self.shell, self.ctx, self.reasons)

    def binary(self, left: str, op: str, right: str, arithmetic: bool):
        return _binary_test(left, op, right, self.shell, self.ctx, self.reasons, arithmetic)


def _unary(op: str, operand: str, shell: _Expander, ctx: _Ctx, reasons: list[str]):
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


def _binary_test(left: str, op: str, right: str, shell: _Expander, ctx: _Ctx, reasons: list[str], arithmetic: bool):
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
                raise _TestRefused()  # [: integer expression expected
        result = {"-eq": a == b, "-ne": a != b, "-lt": a < b, "-le": a <= b, "-gt": a > b, "-ge": a >= b}[op]
        return result, result
    reasons.append(f"a file comparison, {op}" if op in ("-nt", "-ot", "-ef") else f"the test {op}")
    return None, False


class _TestRefused(Exception):
    """What ``[`` refuses (an integer expected, an operator missing, too many arguments): bash's test fails
    with status 2 (test.c, test_syntax_error), where a false test leaves 1."""


def _test_words(args: list[str], shell: _Expander, ctx: _Ctx):
    """``[ ... ]`` / ``test ...`` on expanded words, by bash's rules on their count: (known, assumed, what
    cannot be decided, the status it leaves where it fails)."""
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
            raise _TestRefused()  # [: unary operator expected
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
            raise _TestRefused()  # [: binary operator expected
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
        raise _TestRefused()  # [: too many arguments

    try:
        known, assumed = one(args)
    except _TestRefused:  # the whole test fails, with 2
        return False, False, ", ".join(dict.fromkeys(reasons)), 2
    return known, assumed, ", ".join(dict.fromkeys(reasons)), 1
