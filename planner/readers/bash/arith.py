"""Shell arithmetic: ``$((...))``, ``((...))``, ``let``, ``for ((...))``, array indices and
substring offsets, in bash's 64-bit integers."""

from __future__ import annotations

import re
from typing import Optional

from ...errors import one_line
from .errors import MAX_DEPTH
from .state import _Ctx, _joined, _State


class _ArithError(Exception):
    pass


def _subscripted(name: str) -> tuple[str, Optional[str]]:
    """(name, subscript) of an arithmetic operand: ``A[1]`` is A's element 1, ``X`` is X (None)."""
    if name.endswith("]") and "[" in name:
        base, index = name[:-1].split("[", 1)
        return base, index
    return name, None


class _ExpansionError(Exception):
    """An expansion bash fails on (``$((a b))``): it abandons the rest of the line."""


# A name may carry a subscript (``A[1]``, ``A[i+1]``): an array's element, as bash reads it.
_ARITH_TOKEN = re.compile(r"\s*(?:(0[xX][0-9a-fA-F]+|[0-9]+#[0-9a-zA-Z@_]+|[0-9]+)"
                          r"|([A-Za-z_][A-Za-z0-9_]*(?:\[[^\]]*\])?)"
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


class _Arithmetic(_State):
    """A shell's arithmetic; an operand that holds ``$`` is expanded first (``string``, expand.py)."""

    def arith_expansion(self, expression: str, ctx: _Ctx, key: str) -> str:
        return str(self.expanded_arith(expression, ctx, key))

    def expanded_arith(self, expression: str, ctx: _Ctx, key: str) -> int:
        """An arithmetic context's value with its ``$`` and backquote expansions done first, as bash does
        for ``$((...))``, an array's subscript (``${A[$i]}``) and a substring's offset (``${X:$o:1}``)."""
        return self.arith(self.string(expression, ctx, key) if "$" in expression or "`" in expression
                          else expression, ctx, key)

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
            self.set_arith_var(node[2], new, ctx)
            return new if kind == "pre" else old
        if kind == "assign":
            value = self.evaluate(node[3], ctx, depth)
            if node[1] != "=":
                value = _binary(node[1][:-1], self.variable_value(node[2], ctx, depth), value)
            self.set_arith_var(node[2], value, ctx)
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

    def set_arith_var(self, name: str, value: int, ctx: _Ctx) -> None:
        base, index = _subscripted(name)
        self.set_var(base, str(value), ctx.deps, index=index)

    def variable_value(self, name: str, ctx: _Ctx, depth: int) -> int:
        base, index = _subscripted(name)
        value, is_set = self.lookup(base, index, ctx)
        if not is_set:
            self.unbound(base, base)  # $((X+1)), (( X )): set -u fails an unset X there too
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
