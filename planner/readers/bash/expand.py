"""Word expansion as bash does it: quoting, parameter expansion (defaults, lengths, trims,
replacements, case, substrings, arrays), command and process substitution (never run), and the splitting of
unquoted expansions into fields."""

from __future__ import annotations

import re
from typing import Optional

from ...errors import one_line
from ...limits import MAX_EXPANDED_CHARS
from .arith import _Arithmetic, _ExpansionError
from .errors import ScriptSyntax
from .lexer import _NAME, _skip_ansi, _skip_backtick, _skip_double, _skip_nested, _skip_single
from .patterns import _glob_tokens, _replace, _trim
from .state import NOCASEMATCH_UNFOLLOWED, _DEFAULTED, _NOT_RUN, _PROCESS, _READ_EMPTY, _Ctx, _joined

_SIMPLE_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]|[@*#?$!\-]")
_PARAM_OP = re.compile(r":?[-=+?]|##?|%%?|/#|/%|//?|\^\^?|,,?|:")


_ANSI_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f",
                 "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}
# An escape of a $'...' quote: hexadecimal (\xHH), Unicode (\uHHHH, \UHHHHHHHH), octal (\NNN), or a letter.
_ANSI_ESCAPE = re.compile(r"\\(?:x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{1,4})|U([0-9a-fA-F]{1,8})|([0-7]{1,3})|(.))", re.S)


def _ansi(text: str) -> str:
    """A ``$'...'`` quote's text with its escapes decoded as bash decodes them."""

    def decode(m: re.Match) -> str:
        hexadecimal = m.group(1) or m.group(2) or m.group(3)
        if hexadecimal:
            value = int(hexadecimal, 16)
            return chr(value) if value < 0x110000 else m.group(0)
        if m.group(4):
            return chr(int(m.group(4), 8) & 0xFF)
        return _ANSI_ESCAPES.get(m.group(5), m.group(0))

    return _ANSI_ESCAPE.sub(decode, text)


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


class _Expander(_Arithmetic):
    """A shell's expansions: a word's pieces (``scan``), then its fields, its string or its pattern."""

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
            if not quoted and c in "<>" and raw[i + 1:i + 2] == "(":
                j = _skip_nested(raw, i + 1)
                flush()
                put(self.process_substitution(raw[i:j], ctx))
                i = j
                continue
            buf.append(c)
            i += 1
        flush()
        return pieces

    def dollar(self, raw: str, i: int, ctx: _Ctx, key: str, quoted: bool):
        kind = "qexp" if quoted else "exp"
        if raw.startswith("$((", i):
            j = _skip_nested(raw, i + 1)
            if raw[j - 2:j] == "))":
                value = self.arith_expansion(raw[i + 3:j - 2], ctx, key)
                return (kind, value), j
        nxt = raw[i + 1:i + 2]
        if nxt == "(":
            j = _skip_nested(raw, i + 1)
            return self.substitute(raw[i + 2:j - 1], ctx, quoted, key), j
        if nxt == "{":
            j = _skip_nested(raw, i + 1)
            return self.parameter(raw[i + 2:j - 1], ctx, key, quoted), j
        m = _SIMPLE_PARAM.match(raw, i + 1)
        if not m:
            return None, i + 1
        return self.parameter(m.group(0), ctx, key, quoted), m.end()

    def substitute(self, command: str, ctx: _Ctx, quoted: bool, key: str):
        """``$(command)``: never run; a caller may know its output (``command_output``)."""
        output = self.command_output(command) if self.command_output is not None else None
        if output is None:
            # Unquoted, its output would split into words (flags, say); quoted, it is one word.
            ctx.deps.setdefault(f"$({one_line(' '.join(command.split()), 60)})",
                                "not run: read as empty (one word)" if quoted else _NOT_RUN)
            output = ""
        output = output.rstrip("\n")
        if len(output) > MAX_EXPANDED_CHARS:
            raise self.too_long(key)
        return ("qexp" if quoted else "exp", output)

    @staticmethod
    def process_substitution(text: str, ctx: _Ctx):
        """``<(command)`` or ``>(command)``: never run; the word is the file name bash gives the pipe
        to it (/dev/fd/63 for the first), one word whatever it holds (bash splits no file name)."""
        ctx.deps.setdefault(one_line(text[:2] + " ".join(text[2:-1].split()) + ")", 60), _PROCESS)
        return ("qexp", "/dev/fd/63")

    def parameter(self, inner: str, ctx: _Ctx, key: str, quoted: bool):
        kind_s, kind_l = ("qexp", "qat") if quoted else ("exp", "at")
        if inner.startswith("#") and len(inner) > 1 and inner not in ("##",):
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*])(?:\[([^\]]*)\])?", inner[1:])
            if m:
                value, _ = self.lookup(m.group(1), m.group(2), ctx)
                if value is None:
                    if m.group(1) not in ("@", "*"):  # ${#X}, ${#A[@]} of an unset one: bash's set -u fails it
                        self.unbound(m.group(1), m.group(1) if not m.group(1).isdigit() else f"${m.group(1)}")
                    return (kind_s, "0")
                return (kind_s, str(len(value)))
        if inner.startswith("!") and inner != "!":  # $! and ${!} are the last background job's process id
            return self.indirect(inner[1:], ctx, key, quoted)
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
            # "$@" and "${A[@]}" of none expand to nothing under set -u too (bash 4.4 on); ${X:?word} and
            # ${X?word} end the script with their own message, "X: word", set -u or not (below, required)
            if not splat and op[-1:] != "?":
                self.unbound(name, label)
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
                        ctx.deps.setdefault(label, f"{_DEFAULTED} {default!r}"
                                            if default else _READ_EMPTY)
                    return ("pieces", pieces)
                if null:
                    default = self.string(word, ctx, key)
                    if not is_set:
                        ctx.deps.setdefault(label, f"{_DEFAULTED} {default!r}"
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
                if not splat:  # ${X:?msg}: bash ends the script where X is null, set -u or not
                    self.required(name, label, op, word, is_set)
                ctx.deps.setdefault(label, _READ_EMPTY)
                value = "" if not splat else []
        elif op in ("#", "##", "%", "%%"):
            pattern = self.pattern(rest[len(op):], ctx, key)
            value = self.each(value, lambda v: _trim(v, pattern, op, name))
        elif op.startswith("/"):
            if self.nocasematch:  # bash (5.1 on) replaces without regard to case then: not followed here
                ctx.deps.setdefault(f"${{{label}/…}}", NOCASEMATCH_UNFOLLOWED)
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
            offset = self.expanded_arith(parts[0], ctx, key)
            length = self.expanded_arith(parts[1], ctx, key) if len(parts) > 1 else None
            if splat:
                items = value if isinstance(value, list) else [value]
                if name in ("@", "*"):  # ${@:2} counts from $0, as bash does: $2 on
                    items = [self.argv0] + items
                # A negative offset past the start gives nothing, as in bash (not everything).
                start = offset if offset >= 0 else len(items) + offset
                value = [] if start < 0 else items[start:] if length is None else items[start:start + max(length, 0)]
            else:
                text = _joined(value)
                start = offset if offset >= 0 else len(text) + offset
                if start < 0:
                    value = ""
                elif length is None:
                    value = text[start:]
                else:
                    end = start + length if length >= 0 else len(text) + length
                    value = text[start:end]
        if isinstance(value, list):
            if star and quoted:  # "$*" and "${A[*]}" join with IFS's first character (none where IFS is empty)
                ifs = self.vars.get("IFS")
                separator = " " if ifs is None or isinstance(ifs.value, list) else ifs.value[:1]
                return (kind_s, separator.join(value))
            if splat:
                return (kind_l, value)
            value = " ".join(value)
        return (kind_s, value)

    def indirect(self, rest: str, ctx: _Ctx, key: str, quoted: bool):
        """``${!...}``: ``${!name}`` and ``${!name:-word}`` (the parameter whose name ``name`` holds, an
        element ``A[1]`` or ``A[@]`` included), ``${!A[@]}`` (an array's indices) and ``${!prefix*}``
        (the names set with that prefix), as bash expands them; what else reads as empty, said where
        a launch uses it."""
        kind_s, kind_l = ("qexp", "qat") if quoted else ("exp", "at")
        keys = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[([@*])\]", rest)
        if keys:
            var = self.vars.get(keys.group(1))
            count = 0 if var is None else len(var.value) if isinstance(var.value, list) else 1
            return (kind_l, [str(i) for i in range(count)])
        prefix = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)([@*])", rest)
        if prefix:
            return (kind_l, sorted(n for n in self.vars if n.startswith(prefix.group(1))))
        named = re.match(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(.*)$", rest, re.S)
        if named:
            pointer, is_set = self.lookup(named.group(1), None, ctx)
            if is_set and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?|[0-9]+|[@*]", pointer or ""):
                return self.parameter(pointer + named.group(2), ctx, key, quoted)
            var = self.vars.get(named.group(1))
            if (var is not None and not var.deps) if is_set else self.provably_unset(named.group(1)):
                # bash refuses it and abandons the line, status 1: "X: invalid indirect expansion" for an
                # unset X, "...: invalid variable name" for a value that names none; a caller's X, said
                raise _ExpansionError(f"${{!{one_line(rest, 40)}}} names no variable ({named.group(1)} is "
                                      + (f"{one_line(pointer, 30)!r})" if is_set else "unset)") + ", which bash refuses")
            if not is_set:
                self.note(f"${{!{one_line(rest, 40)}}}: {named.group(1)} is not set by the script: bash refuses it "
                          f"(invalid indirect expansion) and abandons the line unless the caller sets "
                          f"{named.group(1)} to a variable's name; read as empty, going on", None)
        ctx.deps.setdefault("${!" + one_line(rest, 40) + "}", _NOT_RUN)
        return (kind_s, "")

    def each(self, value, function):
        return [function(v) for v in value] if isinstance(value, list) else function(value)

    def fields(self, raw: str, ctx: _Ctx, key: str) -> list[str]:
        """The words ``raw`` expands to, split as bash splits unquoted expansions: on the script's IFS
        (space, tab and newline where it sets none; none at all where it sets it empty), a run of
        separators one boundary (so no empty field, which two of a non-blank IFS character in a row
        would give bash)."""
        ifs = self.vars.get("IFS")
        separators = " \t\n" if ifs is None or isinstance(ifs.value, list) else ifs.value
        boundary = re.compile(f"[{re.escape(separators)}]+") if separators else None
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
            if boundary is None:  # IFS=''
                add(text)
                return
            if text[0] in separators:
                push()
            for k, part in enumerate(p for p in boundary.split(text) if p):
                if k:
                    push()
                add(part)
            if text[-1] in separators:
                push()

        for kind, value in self.scan(raw, ctx, key):
            self.expanded(len(value) if isinstance(value, str) else sum(len(v) + 1 for v in value))
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
            self.expanded(len(text))
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
