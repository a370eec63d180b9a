"""Simple commands: assignments, declarations, the builtins that matter to a launch script, function
calls; and the commands the script would start, gathered, not run."""

from __future__ import annotations

from typing import Optional

from ...errors import one_line
from ...limits import MAX_EXPANDED_CHARS
from .arith import _ExpansionError
from .conditions import _test_words
from .errors import MAX_DEPTH, ScriptLimit
from .expand import _Expander
from .lexer import _ASSIGNMENT, _Tok
from .parser import _Simple
from .results import Command
from .state import _NOT_RUN, _READ_EMPTY, _Ctx
from .status import _FALSE, _TRUE, _Exit, _LoopControl, _Return, _Status

_DECLARATIONS = {"export", "declare", "typeset", "local", "readonly"}


class _Commands(_Expander):
    """A shell's simple commands; a ``bash -c`` string is read by ``run_inline`` (interpreter.py)."""

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
        not_run = tuple(name for name, how in ctx.deps.items() if how == _NOT_RUN)
        self.commands.append(Command(tuple(fields), self.line_of(node.start), unset, not_run))
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


def _inline_script(fields: list[str]) -> Optional[tuple[str, list[str]]]:
    for k, word in enumerate(fields[:-2]):
        if word.rsplit("/", 1)[-1] in ("bash", "sh") and fields[k + 1] == "-c":
            return fields[k + 2], fields[k + 3:]
    return None


def _is_assignment(text: str) -> bool:
    match = _ASSIGNMENT.match(text)
    return match is not None
