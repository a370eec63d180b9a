"""Simple commands: assignments, declarations, the builtins that matter to a launch script, function
calls; and the commands the script would start, gathered, not run."""

from __future__ import annotations

import ast
import re
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Optional, Sequence

from ...errors import one_line
from ...limits import MAX_EXPANDED_CHARS
from .arith import _ExpansionError
from .conditions import _test_words
from .errors import MAX_DEPTH, ScriptLimit, ScriptSyntax, ScriptUnfollowed
from .expand import _Expander
from .lexer import _ASSIGNMENT, _NAME, _lex, _Tok, _Unterminated
from .parser import _DECLARATIONS, _Parser, _Simple
from .results import EMPTIED, Command
from .state import _DEFAULTED, _NOT_RUN, _PROCESS, _READ_EMPTY, REMATCH_UNKNOWN, _Ctx, _Frame, _Var
from .status import _FALSE, _TRUE, _Exit, _failed, _LoopControl, _Return, _stated, _Status

# The option letters each takes (bash 5.2's builtins; `help export` and so on), -p included.
_DECLARATION_OPTIONS = {"export": "fnp", "readonly": "aAfp", "declare": "aAfFgiIlnprtux",
                        "typeset": "aAfFgiIlnprtux", "local": "aAfFgiIlnprtux"}


class _Commands(_Expander):
    """A shell's simple commands; a ``bash -c`` string is read by ``run_inline`` (interpreter.py)."""

    def run_simple(self, node: _Simple) -> _Status:
        self.step(node.start)
        words = node.words
        k = 0
        while k < len(words) and (words[k].kind == "array" or _is_assignment(words[k].text)):
            k += 1
        assignments, rest = words[:k], words[k:]
        if self.keyword and rest:
            # a declaration's NAME=value words too: `set -k; export X=32` exports nothing (bash's
            # separate_out_assignments takes them before it looks at the command's name)
            assignments, rest = _keyword_assignments(assignments, rest)
        if rest:
            assignments = self.valid_prefixes([_prefix_string(tok) for tok in assignments])
        if not rest:
            for tok in assignments:
                self.assign(tok)
            return _TRUE
        rest = _without_builtin_prefix(rest)
        if rest[0].kind == "word" and rest[0].text in _DECLARATIONS:
            return self.declare(self.keep_declared_prefixes(assignments, rest))
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
        if fields[0] in _DECLARATIONS and rest[0].kind == "word":
            # A declaration named by a quoted or expanded word ('export', \export, $DECLARE): bash's parser
            # does not take it for one, so its words are expanded as any command's (split, no NAME=value
            # parsing), but the builtin it runs declares them all the same. It was read as a command
            # started: `'export' CUDA_DEVICE_MAX_CONNECTIONS=32` exported nothing.
            return self.declare(self.keep_declared_prefixes(
                assignments, [_Tok("word", _as_word(field), rest[0].start, rest[-1].end) for field in fields]))
        return self.builtin(fields, ctx, node, assignments)

    def valid_prefixes(self, assignments: list[_Tok]) -> list[_Tok]:
        """A command's ``NAME=value`` prefixes less the indexed ones (``A[1]=x torchrun``): bash refuses each ("`A[1]':
        not a valid identifier") and runs the command without it, the array as it was, a caller's exported A
        passed as before; it was read as setting A[1] for a function call, and as taking A out of the launch's
        environment."""
        kept = []
        for tok in assignments:
            if tok.kind != "array" and _ASSIGNMENT.match(tok.text).group(2) is not None:
                self.note(f"{one_line(tok.text, 60)} before a command fails in bash (`{_ASSIGNMENT.match(tok.text).group(1)}"
                          f"[...]': not a valid identifier): the command runs without it", None)
                continue
            kept.append(tok)
        return kept

    def keep_declared_prefixes(self, assignments: Sequence[_Tok], rest: list[_Tok]) -> list[_Tok]:
        """``X=32 export X`` (or ``readonly X``, ``declare -x X``): bash puts the prefix in a temporary
        environment that the declaration's export or readonly attribute carries past the command (Bash
        Reference Manual, 3.7.4 Environment; bash's variables.c, att_propagate), so X is 32, exported, after
        it, readonly's too (the temporary environment's variables are exported, and the attribute
        propagates with them); a prefix the declaration does not name stays the command's alone. ``X=32
        export -n X`` (or ``declare +x X``) takes the export from the temporary X alone, which goes with the
        command: X is as before it, the caller's exported 1 still passed (bash 5.2). ``declare -g`` works on
        the global itself, the temporary X left to go with the command (``X=32 declare -gx X`` exports the
        X there was). In a function, a local the declaration makes takes the prefix's value (see
        :meth:`declare_prefixed_locals`). The declaration's words, less the names it so leaves alone."""
        options = _declaration_options(rest)
        unexporting = "".join(t.text[1:] for t in rest[1:] if t.kind == "word" and t.text.startswith("+")) \
            if rest[0].text in ("declare", "typeset") else ""
        prefixed = {_ASSIGNMENT.match(t.text).group(1) for t in assignments if t.kind != "array"}
        if rest[0].text in ("declare", "typeset", "local") and "n" in options:
            # X=32 local -n X: bash takes the prefix's value as the name the reference refers to (32 is none:
            # the declaration fails, the caller's X shows through). Name references are not followed (declared
            # says so): the prefix stays the command's, not read as the variable's value.
            return rest
        if rest[0].text in ("declare", "typeset") and "g" in options:
            return rest
        if self.frames and rest[0].text in ("declare", "typeset", "local"):
            return self.declare_prefixed_locals(assignments, rest, prefixed)
        if "r" not in options and ((rest[0].text == "export" and "n" in options) or "x" in unexporting):
            return [rest[0], *(t for t in rest[1:] if not (t.kind == "word" and t.text in prefixed))]
        if "x" in unexporting:
            # X=32 declare -r +x X: the readonly temporary's value carries into the global past the command,
            # its export attribute dropped by +x (which wins over a -x: declare sets the attributes on, then
            # takes those off), the temporary's attributes added to the global's (variables.c,
            # push_temp_var), so the global is 32 with the export it had: exported where it was, or where
            # the caller exported the name if the script left that undecided (bash 5.2).
            for tok in assignments:
                if tok.kind != "array" and _ASSIGNMENT.match(tok.text).group(1) in {
                        t.text for t in rest[1:] if t.kind == "word"}:
                    self.assign(tok)
            return [rest[0], *(t for t in rest[1:] if not (t.kind == "word" and t.text in prefixed))]
        if rest[0].text not in ("export", "readonly") and not set("xr") & set(options):
            return rest
        named = {t.text for t in rest[1:] if t.kind == "word" and _NAME.fullmatch(t.text)}
        for tok in assignments:
            if tok.kind != "array" and _ASSIGNMENT.match(tok.text).group(1) in named:
                self.assign(tok, exported=True)
        return rest

    def declare_prefixed_locals(self, assignments: Sequence[_Tok], rest: list[_Tok], prefixed: set) -> list[_Tok]:
        """``X=32 local X`` (``declare X`` in a function, with any options but -g): the local bash makes is the
        temporary X itself, its value 32 and exported, unless +x takes that off (variables.c,
        make_local_variable finds the temporary variable), and the global is left as it was: ``export X=1;
        f() { X=32 declare -r +x X; torchrun; }`` passes 1. Such names are declared here, with the prefix's
        value where the declaration gives none, as by ``local -x``; the declaration's other words returned."""
        named = [t for t in rest[1:] if t.kind == "word" and (_NAME.fullmatch(t.text) or _is_assignment(t.text))
                 and _declared_name(t) in prefixed]
        if not named:
            return rest
        options = [t for t in rest[1:] if t.kind == "word" and t.text.startswith(("-", "+")) and t.text != "--"]
        # local -a X of the temporary X: an empty array (bash 5.2), which no started command gets
        arrays = any(set("aA") & set(t.text) for t in options if t.text.startswith("-"))
        values = {_declared_name(t): _Tok("array", f"{_declared_name(t)}=()", t.start, t.end) if arrays else t
                  for t in assignments if t.kind != "array"}
        exporting = _Tok("word", "-x", rest[0].start, rest[0].end)  # +x, where given, wins over it
        self.declare([rest[0], *options, exporting, *(values[t.text] if _NAME.fullmatch(t.text) else t for t in named)])
        return [t for t in rest if all(t is not n for n in named)]

    def environment(self, assignments: list[_Tok], fields: Sequence[str] = ()) -> tuple[tuple[str, Optional[str], bool], ...]:
        """The scalar variables a started command's environment holds from the script: the exported
        ones, and its own ``NAME=value`` prefixes (bash passes those to that command alone); and, with
        the value None, those the script ``unset`` and did not export again: decidedly absent, whatever
        the caller's environment held. Then what the command's ``fields`` change of it on the way to
        the program they start: env(1)'s settings and options, through the commands that start another
        (:func:`started_environment`)."""
        return started_environment(fields, self.script_environment(assignments))

    def script_environment(self, assignments: list[_Tok]) -> tuple[tuple[str, Optional[str], bool, bool], ...]:
        """:meth:`environment` as bash hands it to the command's first word."""
        held = {}
        for name in dict.fromkeys([*self.vars, *(name for frame in self.frames for name in frame)]):
            var = self.exported_var(name) or self.inherited_var(name)
            if var is not None:
                held[name] = var
        with self.prefixes_set(assignments, lambda name: held.__setitem__(name, self.vars[name])):
            pass
        return tuple(_setting(name, var) for name, var in held.items()) + tuple(
            (name, None, True, False) for name in sorted(self.cleared) if name not in held)

    @contextmanager
    def prefixes_set(self, assignments: Sequence[_Tok], each: Callable[[str], None] = lambda name: None):
        """A command's ``NAME=value`` prefixes set, exported, while it runs (bash's temporary environment; ``each``
        told each name as it is set, one bash cannot expand ending them), what they hid put back after: ``X=2
        eval 'torchrun ...'`` passes X=2, and X is as before it after."""
        names = [_ASSIGNMENT.match(tok.text).group(1) for tok in assignments if tok.kind != "array"]
        saved = {name: self.vars.get(name) for name in names}
        try:
            try:
                for tok in assignments:
                    if tok.kind != "array":
                        self.prefix_string(_ASSIGNMENT.match(tok.text).group(1))
                        self.assign(tok, exported=True)
                        each(_ASSIGNMENT.match(tok.text).group(1))
            except _ExpansionError:
                pass
            yield
        finally:
            for name, var in saved.items():
                if var is None:
                    self.vars.pop(name, None)
                else:
                    self.vars[name] = var

    def prefix_string(self, name: str) -> None:
        """Before a command's (or a call's) ``NAME=value`` prefix of an array: the array's element 0 in its stead,
        a string, which ``X+=c`` appends to and ``X=c`` replaces, as bash's temporary environment holds strings
        alone (variables.c, assign_in_env): ``A=(3 2); A+=2 torchrun`` passes A=32. The caller puts the array
        back after the command."""
        var = self.vars.get(name)
        if var is not None and isinstance(var.value, list):
            first = var.value[0] if var.value else ""
            self.vars[name] = replace(var, value=first, size=len(first))

    def inherited_var(self, name: str) -> Optional[_Var]:
        """The script's ``name`` where no exported one is passed but the caller's environment may have
        exported the name, so that bash passes the script's value where the caller did (Bash Reference
        Manual, 3.7.4 Environment): set without ``export`` (``X=32``, ``readonly``, ``declare -i``, ``local``
        in a function, ``printf -v``, ``let``, ``for X in``...); or an array there, which bash does not
        export at all. The innermost such variable of every scope, as :meth:`exported_var` takes it: a
        function's local that is unset (``local X`` without a value) or not exported (``local +x X=5``) is
        skipped where bash builds the environment (variables.c, visible_and_exported), so ``X=32; f() { local
        X; torchrun; }`` passes the global's 32 where the caller exported X."""
        chain = [self.vars.get(name)] + [frame[name] for frame in reversed(self.frames) if name in frame]
        return next((var for var in chain if var is not None and (var.inherited or var.exported)), None)

    def exported_var(self, name: str) -> Optional[_Var]:
        """The variable bash passes a started command as ``name``: the innermost exported one, a function's
        locals first. A local that is not exported (``local X`` without a value, one ``unset`` in its own
        function, one ``export -n`` took the attribute off) hides a caller's X from the script's words, not
        from the environment: bash builds it from the exported variables of every scope (Bash Reference
        Manual, 3.7.4 Environment; ``export X=1; f() { local X; env; }`` passes X=1)."""
        chain = [self.vars.get(name)] + [frame[name] for frame in reversed(self.frames) if name in frame]
        return next((var for var in chain if var is not None and var.exported), None)

    def unset_var(self, name: str) -> None:
        """``unset NAME`` as bash's builtin does it in a function (Bash Reference Manual, 4.2 Bash Builtins:
        local, unset; shopt localvar_unset off): a local of this call stays local, unset until the call
        returns, when the variable it hid is back; a local of a calling function is removed, the variable it
        hid showing again; only a variable no call made local is gone from the script, and from the
        environment of what it starts, whatever the caller's held."""
        scope = next((frame for frame in reversed(self.frames) if name in frame), None)
        if self.meets_readonly(name):
            self.note(f"unset {name} fails in bash (a readonly variable): it keeps its value")
        elif scope is None:
            self.vars.pop(name, None)
            self.cleared.add(name)
            self.unset_names.add(name)
            self.exported_unset.discard(name)  # its attributes go with it
        elif scope is self.frames[-1] and name not in scope.temporary:
            self.vars.pop(name, None)
            scope.exported.discard(name)  # bash's makunbound: the unset local keeps att_local alone
        else:  # a calling function's local, or a NAME=value prefix of this call (X=9 f; bash's tempvar)
            hidden = scope.pop(name)
            scope.temporary.discard(name)
            scope.exported.discard(name)
            scope.propagated.discard(name)
            if hidden is None:
                self.vars.pop(name, None)
            else:
                self.vars[name] = hidden

    def unset_element(self, word: str) -> None:
        """``unset 'A[i]'``: ``A[@]`` and ``A[*]`` unset the whole array (as bash 5.2 does); the last element (or one
        past the end, which bash leaves alone) taken off, the array as bash leaves it. Another leaves a hole, a
        sparse array, whose indices (``${!A[@]}``) and elements (``${A[i]}``) the reading does not follow: refused,
        as reading on would give the launch other words than bash gives it."""
        name, index = word[:word.index("[")], word[word.index("[") + 1:-1]
        if index in ("@", "*"):
            self.unset_var(name)
            return
        var = self.vars.get(name)
        if var is None:
            return
        items = var.value if isinstance(var.value, list) else [var.value]
        position = self.expanded_arith(index, _Ctx(), name)
        if position < 0:
            position += len(items)
        if position == len(items) - 1 and not isinstance(var.value, list):  # X[0] of a scalar: X itself
            self.unset_var(name)
        elif position == len(items) - 1 and not self.meets_readonly(name):
            self.vars[name] = replace(var, value=items[:-1], size=sum(len(v) + 1 for v in items[:-1]))
        elif 0 <= position < len(items):
            raise ScriptUnfollowed(f"line {self.line}", f"unset {one_line(word, 40)} leaves a hole in the array "
                                                        f"{name} (a sparse array), which is not followed here: its "
                                                        "elements and indices would be read otherwise than bash "
                                                        "reads them; expected the array built without it")

    def declare(self, rest: list[_Tok]) -> _Status:
        rest, read = self.expanded_declaration(rest)
        status = self.declared(rest)
        for name, deps in read.items():  # what the values owe to what the script does not set
            var = self.vars.get(name)
            if var is not None:
                self.vars[name] = replace(var, deps=tuple({**dict(var.deps), **deps}.items()))
        return status

    def expanded_declaration(self, rest: list[_Tok]) -> tuple[list[_Tok], dict]:
        """The declaration's words expanded first, every one before any is assigned, as bash does before the
        builtin reads them: ``export X=$Y Y=$X`` swaps, ``export "$1=$2"`` and ``export "${ENVS[@]}"`` assign
        (an expanded NAME=value word is quoted, so that it is not expanded twice; one that is no name, which
        bash refuses, dropped); and the variables each value read that the script does not set."""
        words, read = [rest[0]], {}
        for tok in rest[1:]:
            if tok.kind != "word" or tok.text.startswith(("-", "+")) or _NAME.fullmatch(tok.text):
                words.append(tok)
                continue
            ctx = _Ctx()
            match = _ASSIGNMENT.match(tok.text)
            if match:  # NAME=value as written: its value expanded as an assignment's is
                assigned = [(tok.text[:match.end()], self.string(tok.text[match.end():], ctx, match.group(1)))]
            else:
                assigned = [(field[:field.index("=") + 1], field[field.index("=") + 1:]) if _is_assignment(field)
                            else (field, None) for field in self.fields(tok.text, ctx, rest[0].text)]
            for head, value in assigned:
                if value is not None:
                    words.append(_Tok("word", head + "'" + value.replace("'", "'\\''") + "'", tok.start, tok.end))
                    if ctx.deps:
                        read[_ASSIGNMENT.match(head).group(1)] = ctx.deps
                elif _NAME.fullmatch(head):
                    words.append(_Tok("word", head, tok.start, tok.end))
        return words, read

    def declared(self, rest: list[_Tok]) -> _Status:
        command = rest[0].text
        exported = True if command == "export" else None
        if command == "local" and not self.frames:  # bash: "can only be used in a function", nothing set
            self.note("local outside a function fails in bash and sets nothing")
            return _FALSE
        # What bash's builtin rejects sets nothing (Bash Reference Manual, 4.1 Bourne Shell Builtins: export,
        # readonly; 4.2 Bash Builtins: declare): an option it does not take (readonly -x: "invalid option",
        # status 2), and -f, which names functions alone (export -f X=3: "not a function"; declare -f X=3:
        # "cannot use `-f' to make functions", status 1).
        signs = ("-", "+") if command in ("declare", "typeset", "local") else "-"  # export +n: a name, not valid
        letters = "".join(t.text[1:] for t in rest[1:] if t.kind == "word" and t.text.startswith(signs)
                          and t.text != "--")
        invalid = next((c for c in letters if c not in _DECLARATION_OPTIONS[command]), None)
        if invalid is not None:
            self.note(f"{command} -{invalid} fails in bash (an invalid option) and sets nothing")
            return _failed(2)
        if "f" in letters:
            names = [t.text for t in rest[1:] if not t.text.startswith(("-", "+"))]
            if any(t.kind == "array" or _is_assignment(t.text) for t in rest[1:]):
                self.note(f"{command} -f NAME=value fails in bash (-f names functions alone) and sets nothing")
            return _TRUE if names and all(name in self.funcs for name in names) else _FALSE
        # In a function, local (and declare, typeset without -g) scope the names to the call.
        global_ = command in ("declare", "typeset") and any(
            t.kind == "word" and t.text.startswith("-") and "g" in t.text for t in rest[1:])
        scoped = self.frames and (command == "local" or (command in ("declare", "typeset") and not global_))
        if command == "export" and any(t.kind == "word" and t.text.startswith("-") and "n" in t.text
                                       for t in rest[1:]):
            exported = False  # export -n: the names leave the environment (bash's help export), they stay set
        elif any(t.kind == "word" and t.text.startswith("+") and "x" in t.text for t in rest[1:]):
            # declare +x takes the export attribute off whatever the order: bash sets the -x attributes on,
            # then takes the +x ones off (declare.c), so `declare +x -x X` leaves X unexported
            exported = False
        elif any(t.kind == "word" and t.text.startswith("-") and "x" in t.text for t in rest[1:]):
            exported = True  # declare -x, before any name it exports
        if command in ("declare", "typeset", "local") and "n" in _declaration_options(rest):
            # Each reference named with what bash would read and write through it: `declare -n
            # R=CUDA_DEVICE_MAX_CONNECTIONS; R=16` exports 16 to the training, which the note must lead to.
            refs = [f"{_declared_name(t)}, not as {_expanded_value(t.text)}" if _is_assignment(t.text)
                    and t.kind != "array" else _declared_name(t)
                    for t in rest[1:] if not t.text.startswith(("-", "+"))]
            self.note(f"{command} -n (a name reference) is not followed: its name reads as a variable of its own"
                      + (f" ({'; '.join(refs)})" if refs else ""))
        declared = [_declared_name(t) for t in rest[1:] if not t.text.startswith(("-", "+"))]
        options = _declaration_options(rest)
        if "i" in options:
            self.integers.update(declared)
        removed = "".join(t.text[1:] for t in rest[1:] if t.kind == "word" and t.text.startswith("+"))
        if "i" in removed:  # declare +i X: X=2*4 is the string again
            self.integers.difference_update(declared)
        for name in declared if set("ul") & set(removed) else ():  # declare +u X, +l X: stored as given
            self.letter_cases.pop(name, None)
        if ("u" in options) != ("l" in options):  # bash applies neither where both are given
            self.letter_cases.update(dict.fromkeys(declared, "u" if "u" in options else "l"))
        touched: list[str] = []  # the names it sets or changes
        makes_readonly = command == "readonly" or "r" in options
        for tok in rest[1:]:
            if (tok.kind == "array" or _is_assignment(tok.text) or (scoped and _NAME.fullmatch(tok.text))) \
                    and ((_declared_name(tok) in self.readonly) if global_
                         else self.meets_readonly(_declared_name(tok), bool(scoped))):
                # bash refuses this name alone ("readonly variable": a local of it too, `local X=32`, `local X`)
                # and goes on with the declaration's other words: the readonly variable keeps its value
                # (declare -g sets the global past a call's readonly local, which bash allows)
                self.note(f"{command} {_declared_name(tok)} fails in bash (a readonly variable): it keeps its value")
                continue
            if scoped and (tok.kind == "array" or _is_assignment(tok.text) or _NAME.fullmatch(tok.text)):
                name = _declared_name(tok)
                new = name not in self.frames[-1]  # not yet this call's (X=9 f's X is: kept, as bash keeps it)
                if new:
                    # A new local takes the export attribute of the variable it hides, the caller's unset
                    # local's too, unless local -x or +x decides it (bash's variables.c, make_local_variable:
                    # "new_var->attributes = exported_p (old_var) ? att_exported : 0"): `export X=1;
                    # f() { local X; X=32; torchrun; }` passes X=32.
                    hidden = self.vars.get(name)
                    if exported if exported is not None else (
                            hidden.exported if hidden is not None else self.unset_local_exported(name)):
                        self.frames[-1].exported.add(name)
                self.frames[-1].setdefault(name, self.vars.get(name))
                if new and not (tok.kind == "array" or _is_assignment(tok.text)):
                    self.vars.pop(name, None)  # `local X`: unset inside the call; a second `local X` keeps its value
            if tok.kind == "array" or _is_assignment(tok.text):
                name = _ASSIGNMENT.match(tok.text).group(1)
                hidden = next((frame for frame in self.frames if name in frame), None) if global_ else None
                if hidden is not None:  # declare -g under a local of the name: the global, which the call hides
                    local = self.vars.get(name)
                    if hidden[name] is not None:
                        self.vars[name] = hidden[name]
                    else:
                        self.vars.pop(name, None)
                    self.assign(tok, exported=exported, global_=True)
                    hidden[name] = self.vars.get(name)
                    if local is not None:
                        self.vars[name] = local
                    else:
                        self.vars.pop(name, None)
                else:
                    self.assign(tok, exported=exported)
                if set("aA") & set(options):
                    self.make_array(name)
                touched.append(name)
                if makes_readonly:
                    self.mark_readonly(name, global_)  # at once: `readonly X=1 X=32` fails at its second word
            elif tok.text.startswith(("-", "+")):
                pass  # the options, read above
            else:
                for name in self.fields(tok.text, _Ctx(), command):
                    touched.append(name)
                    var = self.vars.get(name)
                    scope = next((frame for frame in reversed(self.frames) if name in frame), None)
                    if var is None and exported is not None:
                        # `export X`, `export -n X` of an unset local (or global): the attribute a later X=32 keeps
                        held = self.exported_unset if scope is None else scope.exported
                        (held.add if exported else held.discard)(name)
                    if var is not None and exported is not None and (var.exported != exported or var.inherited):
                        # A new _Var, not the shared one changed in place: a subshell's copy of the
                        # variables shares them, and `( export X )` must not export the parent's X. One
                        # exported only where the caller exported it (X=5) is decided either way now:
                        # `X=5; export -n X` passes nothing, whatever the caller exported.
                        self.vars[name] = replace(var, exported=exported, inherited=False)
        for name in touched if makes_readonly else ():
            self.mark_readonly(name, global_)
        if exported is False:
            # export -n X, declare +x X: the script's X, the one a caller's exported X became as bash started,
            # leaves the environment, decidedly, until exported again (a function's local alone: the global
            # keeps its attribute, and shows through).
            self.cleared.update(name for name in touched if not any(name in frame for frame in self.frames))
        elif command in ("export", "readonly"):
            for name in touched:  # X=9 f; f exports X: bash keeps X past the call (see call)
                scope = next((frame for frame in reversed(self.frames) if name in frame), None)
                if scope is not None and name in scope.temporary:
                    scope.propagated.add(name)
        return _TRUE

    def make_array(self, name: str) -> None:
        """``declare -a X=32`` (or ``-A``): X is an array, its value X[0] (Bash Reference Manual, 6.7 Arrays),
        which bash passes no started command, whatever the caller exported."""
        var = self.vars.get(name)
        if var is not None and not isinstance(var.value, list):
            self.vars[name] = replace(var, value=[var.value])

    def apply_options(self, options: Sequence[tuple[str, bool]]) -> None:
        """``set``'s options (or those ``bash -u -c`` starts its script with), by long name, in order: the last
        word wins (Bash Reference Manual, 4.3.1 The Set Builtin)."""
        for option, on in options:
            # -a / -o allexport: every variable set after it is exported; -k / -o keyword: NAME=value words
            # after a command's name are its environment; -e / -o errexit: a failing command ends the script;
            # -o pipefail; -u / -o nounset: expanding an unset variable ends the script
            if option in ("allexport", "keyword", "errexit", "pipefail", "nounset"):
                setattr(self, option, on)
            # bash -O NAME / +O NAME: shopt's options, kept apart from set's (set -o lastpipe is no option)
            elif option.startswith(SHOPT_PREFIX) and option[len(SHOPT_PREFIX):] in SHOPT_FOLLOWED:
                setattr(self, option[len(SHOPT_PREFIX):], on)

    def builtin(self, fields: list[str], ctx: _Ctx, node: _Simple, assignments: tuple = ()) -> _Status:
        name, args = fields[0], fields[1:]
        if name == "exit":
            raise _Exit(_stated(args, self.last_status, not ctx.deps))
        if name == "return":  # `return $RC`, what the caller decides: not known, as a command not run
            raise _Return(_stated(args, self.last_status, not ctx.deps)
                          or _Status(None, True, ctx.deps, reason="a return of what the script does not set"))
        if name in ("break", "continue"):
            levels = int(args[0]) if args and args[0].isdigit() and int(args[0]) > 0 else 1
            raise _LoopControl(name, levels)
        if name in (":", "true"):
            return _TRUE
        if name == "false":
            return _FALSE
        if name in ("[", "test"):
            if name == "[":
                if not args or args[-1] != "]":  # bash: "[: missing `]'", status 2
                    return _failed(2, ctx.deps, test=True)
                args = args[:-1]
            known, assumed, reason, code = _test_words(args, self, ctx)
            return _Status(known, assumed, ctx.deps, reason, test=True, code=code)
        if name == "set":
            options, operands = _set_options(args)
            if operands is not None:
                self.positional, self.positional_known = operands, True
            self.apply_options(options)
            return _TRUE
        if name == "shift":
            count = int(args[0]) if args and args[0].isdigit() else 1
            if count > len(self.positional) and not self.positional_known:
                # past the arguments read as none: the caller's arguments decide it (set -e ends the script
                # where it fails), read as succeeding
                self.positional = []
                return _Status(None, True, reason="shift of the script's arguments, which the caller gives")
            if count > len(self.positional):
                return _FALSE
            self.positional = self.positional[count:]
            return _TRUE
        if name == "unset":
            functions = "-f" in args
            for arg in args:
                if not arg.startswith("-"):
                    if functions:
                        self.funcs.pop(arg, None)
                    elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\[.*\]", arg, re.S):
                        self.unset_element(arg)
                    else:
                        self.unset_var(arg)
            return _TRUE
        if name == "let":
            value = 0
            try:
                for arg in args:
                    value = self.arith(arg, ctx, "let")
            except _ExpansionError:  # let: status 1
                return _failed(1, ctx.deps, test=True)
            return _Status(value != 0, value != 0, ctx.deps, test=True, code=1)
        if name == "read" and node.herestring is not None:
            status = self.read_herestring(args, node.herestring, assignments)
            if status is not None:
                return status
        if name in ("read", "mapfile", "readarray"):
            self.read_builtin(name, args)
            # its input is not read: whether it succeeds is not known (set -e ends the script where it fails),
            # read as failing, bash's answer with no input (a while-read loop's body does not run)
            return _Status(None, False, reason=f"{name}'s input is not followed")
        if name == "getopts":
            return _FALSE  # no options
        if name == "printf" and args[:1] == ["-v"] and len(args) >= 3 \
                and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?", args[1]):
            rest = args[3:] if args[2] == "--" else args[2:]  # printf -v X -- FORMAT ...
            if rest:
                return self.printf_to(args[1], rest[0], rest[1:], ctx)
        if name == "shopt":
            for option in SHOPT_FOLLOWED:
                if option in args:
                    # -s sets and -u unsets, in any word of options before the names (shopt -qs, -q -s); the last wins
                    letters = "".join(a[1:] for a in args[:args.index(option)] if a.startswith("-"))
                    if "s" in letters or "u" in letters:
                        setattr(self, option, letters.rfind("s") > letters.rfind("u"))
        if name == "eval" and not ctx.deps:
            with self.prefixes_set(assignments):
                return self.eval_string(" ".join(args))
        if name in ("source", ".", "eval", "trap"):
            return self.not_followed(name, fields, node)
        if name in self.funcs:
            return self.call(self.funcs[name], args, assignments)
        try:
            program = started_program(fields)
        except _WrapperFails as failing:
            self.note(f"{one_line(' '.join(fields), 80)}: {failing}")
            return _failed(125)  # coreutils' env: "cannot specify --null (-0) with command", 125
        except _Unfollowed as what:
            raise ScriptUnfollowed(f"line {self.line}", f"{what}: not followed here, so the words and environment "
                                                        "of what it starts cannot be read; expected them written "
                                                        "out") from None
        if program is not None and program.startswith("-"):
            # env X=2 -u X torchrun: GNU env takes the words after its first NAME=VALUE as the command, so it
            # runs one named -u, not found (127): nothing the command names starts
            self.note(f"{one_line(' '.join(fields), 80)}: env reads no option after its first NAME=VALUE, so it "
                      f"runs a command named {one_line(program, 40)}, which fails: what follows is not started")
            return _failed(127)  # env: "No such file or directory"
        # env -S's string read as the words env makes of it: the program it names, a bash -c among them
        words = list(started_words(fields))
        shell = _inline_script(words)
        inner: Optional[_Status] = None
        if shell is not None:
            inner = self.run_inline(shell, node, self.environment(list(assignments), fields))
        elif node.heredoc is not None and name.rsplit("/", 1)[-1] in HEREDOC_SHELLS:
            # `sbatch <<EOF ... EOF`, `bash <<EOF`: the here-document is the script they run, expanded as
            # bash expands an unquoted one (as inside double quotes, its own quotes kept), or as written.
            body, quoted = node.heredoc
            text = body if quoted else self.string('"' + body.replace('"', '\\"') + '"', ctx, "here-document")
            # `bash -e <<EOF`: the shell's options reach the script it reads (sbatch's are its own)
            options = shell_options(fields, 1)[0] if name.rsplit("/", 1)[-1] in ("bash", "sh") else []
            inner = self.run_inline((text, [], options), node, self.environment(list(assignments), fields))
        unset = tuple(name for name, how in ctx.deps.items() if how == _READ_EMPTY)
        not_run = tuple(name for name, how in ctx.deps.items() if how in (_NOT_RUN, _PROCESS, REMATCH_UNKNOWN))
        defaulted = tuple((name, ast.literal_eval(how[len(_DEFAULTED) + 1:])) for name, how in ctx.deps.items()
                          if how.startswith(_DEFAULTED))
        for said in started_notes(fields):
            self.note(said, None)
        self.commands.append(Command(tuple(words), self.line_of(node.start), unset, not_run, defaulted,
                                     self.environment(list(assignments), fields)))
        program = started_program(words)
        if inner is not None and program is not None and program.rsplit("/", 1)[-1] in ("bash", "sh"):
            # bash -c started itself (through env, nice, sudo...: each execs it) leaves its script's status
            # (bash(1), EXIT STATUS); started by another (srun, echo), the status is that command's own.
            return inner
        return _Status(None, True, reason=f"{one_line(name, 40)} is not run")

    def eval_string(self, text: str) -> _Status:
        """``eval STRING`` whose words the script decides (no unset variable, no command substitution): the
        string read and run as commands in this shell (Bash Reference Manual, 4.1 Bourne Shell Builtins:
        eval), each at the eval's line; one bash cannot parse fails with status 2, said."""
        line = self.line
        try:
            program = _parse(text, lambda offset: line)
        except (ScriptSyntax, _Unterminated):
            self.note(f"eval {one_line(text, 60)}: bash cannot parse its string, so the eval fails and sets nothing")
            return _failed(2)
        saved = (self.text, self.line_of)
        self.text, self.line_of = text, (lambda offset: line)
        try:
            return self.run_list(program)
        finally:
            self.text, self.line_of = saved
            self.line = line

    def not_followed(self, name: str, fields: list[str], node: _Simple) -> _Status:
        """``source FILE``, ``eval`` of a string the script does not decide (``eval "$(cmd)"``) and ``trap
        ACTION SIGNAL`` (whose action runs as the signal, or each command under DEBUG, comes: Bash Reference
        Manual, 4.1 Bourne Shell Builtins): not followed, said in a note, which names each variable the
        command's text visibly assigns or exports (``source <(echo X=32)``, ``trap 'X=32' DEBUG``): its value
        in the training's environment could not be read."""
        what = {"eval": "evaluated", "trap": "run (a trap's action is not followed)"}.get(name, "followed")
        written = " ".join([*(tok.text for tok in node.words), *fields[1:]])  # as written, and expanded
        names = list(dict.fromkeys(re.findall(r"(?<![\w$-])([A-Za-z_][A-Za-z0-9_]*)\+?=", written)))
        names = names[:4]
        if names:
            self.note(f"{one_line(' '.join(fields), 80)} is not {what}, and may set {', '.join(names)}: "
                      f"{'their values' if len(names) > 1 else 'its value'} could not be read (read as the script "
                      "leaves it before this line)", None)
        elif name != "trap":
            self.note(f"{one_line(' '.join(fields), 80)} is not {what}: what it would set reads as unset")
        return _Status(None, True, reason=f"{name} is not {what}") if name != "trap" else _TRUE

    def read_herestring(self, args: list[str], word: _Tok, assignments: Sequence[_Tok]) -> Optional[_Status]:
        """``read [-r] [-a ARRAY] [-d DELIM] [-n|-N COUNT] [-p PROMPT] [-t TIMEOUT] [-s] [-e] NAME... <<< WORD``
        whose word (and IFS, the command's ``IFS=...`` prefix too) the script decides: the word and the newline
        bash adds, read to the delimiter, split on IFS as bash's read splits it (Bash Reference Manual, 3.6.7
        Here Strings; 4.2 Bash Builtins: read); its status: 1 where the input ends before the delimiter (``-d
        ''``) or before -N's count. None, nothing set, where that is not how it reads (-u FD, which reads
        another file; a word or IFS the script does not decide; a name that is no variable's)."""
        options = _read_options(args)
        if options is None:
            return None
        names, array, delim, count, exact, raw, timeout = options
        ctx = _Ctx()
        text = self.string(word.text, ctx, "<<<") + "\n"
        with self.prefixes_set(assignments):
            ifs_var = self.vars.get("IFS")
        if ctx.deps or (ifs_var is not None and (ifs_var.deps or isinstance(ifs_var.value, list))) \
                or not all(_NAME.fullmatch(n) for n in [*names, *([array] if array else [])]):
            return None
        if timeout:  # -t 0: bash says whether input is there, and reads none of it
            return _TRUE
        ifs = " \t\n" if ifs_var is None else ifs_var.value
        chars, complete = _read_line(text, delim, count, exact, raw)
        if exact:  # -N: what it read, unsplit, to the first name (bash 5.2)
            ifs = ""
        if array is not None:
            self.set_var(array, _read_fields(chars, ifs, None), {})
        elif not names:  # REPLY: the line as it is, unsplit
            self.set_var("REPLY", "".join(c for c, _ in chars), {})
        else:
            for target, value in zip(names, _read_fields(chars, ifs, len(names))):
                self.set_var(target, value, {})
        return _TRUE if complete else _FALSE

    def read_builtin(self, command: str, args: list[str]) -> None:
        """``read [-r] [-a ARRAY] [-d DELIM] ... NAME...`` and ``mapfile``/``readarray [-t] ... ARRAY``:
        their input (a file, a here-document, a here-string, a pipe) is not read, so each name they set
        reads as empty, said in a note (a ``while read`` loop's body never runs) and where a launch uses it."""
        names, array, k = [], None, 0
        takes_word = "adpntuiN" if command == "read" else "dnOsuC"
        while k < len(args):
            arg = args[k]
            if arg.startswith("-") and len(arg) > 1:
                takes = next((c for c in arg[1:] if c in takes_word), None)
                if takes is not None and arg.endswith(takes):  # -ra ARR, -d '', -p PROMPT: the option's word
                    if takes == "a" and k + 1 < len(args):
                        array = args[k + 1]
                    k += 2
                    continue
            else:
                names.append(arg)
            k += 1
        if command != "read":  # mapfile/readarray: one array, MAPFILE by default
            array, names = (names[-1] if names else "MAPFILE"), []
        targets = [t for t in ([array] if array else []) + (names or ([] if array else ["REPLY"]))
                   if _NAME.fullmatch(t or "")]
        for target in targets:
            self.set_var(target, [] if target == array else "", {f"{command} {target} (line {self.line})": _NOT_RUN})
        loop = " (a while-read loop's body is not run)" if command == "read" else ""
        self.note(f"{command} reads input, which is not followed: {', '.join(targets) or 'nothing'} read as "
                  f"empty{loop}")

    def printf_to(self, name: str, form: str, values: list[str], ctx: _Ctx) -> _Status:
        """``printf -v NAME FORMAT ARGS``: the format's %s, %d and %i filled as bash does, the format
        repeated while arguments remain; another directive reads the variable as empty, said."""
        pieces = re.split(r"(%[%sdi])", form)
        if any(p.startswith("%") and p not in ("%%", "%s", "%d", "%i") for p in pieces) or re.search(r"%[^%sdi]", form):
            self.set_var(name, "", {**ctx.deps, f"printf -v {name} (line {self.line})": _NOT_RUN})
            return _TRUE
        out, rest = [], list(values)
        while True:
            for piece in pieces:
                if piece == "%%":
                    out.append("%")
                elif piece in ("%s", "%d", "%i"):
                    value = rest.pop(0) if rest else ""
                    out.append(value if piece == "%s" else str(_printf_integer(value)))
                else:  # the format's own escapes, as printf reads them
                    out.append(re.sub(r"\\([\\nt])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], piece))
            if not rest or not any(p in ("%s", "%d", "%i") for p in pieces):
                break
        text = "".join(out)
        if len(text) > MAX_EXPANDED_CHARS:
            raise self.too_long(name)
        element = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[([^\]]*)\]", name)  # printf -v 'A[1]'
        if element:
            self.set_var(element.group(1), text, ctx.deps, index=element.group(2))
        else:
            self.set_var(name, text, ctx.deps)
        return _TRUE

    def call(self, body, args: list[str], assignments: Sequence[_Tok] = ()) -> _Status:
        """A function call. Its ``NAME=value`` prefixes (``X=9 f``) are the function's for the call, exported
        (Bash Reference Manual, 3.7.4 Environment: "...for a function call, they affect the function's
        execution environment"; bash 5.2 drops them on return in POSIX mode too): bash puts them in the
        function's own scope, so a ``local`` of one keeps its value, an ``unset`` of one shows the caller's
        variable again, and one ``export`` or ``readonly`` took keeps its value past the return, in every
        scope out to the script's (bash's variables.c, push_func_var: att_propagate)."""
        if self.depth >= MAX_DEPTH:
            raise ScriptLimit(f"line {self.line}", f"calls functions past {MAX_DEPTH} levels deep")
        saved = (self.positional, self.positional_known)
        self.depth += 1
        frame = _Frame()
        self.frames.append(frame)
        try:
            for tok in assignments:  # in order, each seeing those before it; an array's is not passed
                if tok.kind != "array":
                    name = _ASSIGNMENT.match(tok.text).group(1)
                    if self.meets_readonly(name, frames=self.frames[:-1]):
                        # bash refuses the prefix ("readonly variable") and runs the function, the value as it was
                        self.note(f"{name}=... before a function fails in bash (a readonly variable): it keeps its value")
                        continue
                    frame.setdefault(name, self.vars.get(name))
                    frame.temporary.add(name)
                    self.prefix_string(name)
                    self.assign(tok, exported=True)
            self.positional, self.positional_known = list(args), True
            return self.run_command(body)
        except _Return as returned:
            return returned.status
        finally:
            self.frames.pop()
            for name, before in frame.items():  # the call's locals give way to what they hid
                if name in frame.propagated:  # bash keeps it, through the callers' scopes too
                    for outer in self.frames:
                        if name in outer:
                            outer.propagated.add(name)
                    if name in frame.readonly:  # X=9 f; f's readonly X: readonly past the call too
                        self.mark_readonly(name)
                elif before is None:
                    self.vars.pop(name, None)
                else:
                    self.vars[name] = before
            self.depth -= 1
            self.positional, self.positional_known = saved


# Commands that run the here-document fed to them as a script (a batch script, a shell's input).
HEREDOC_SHELLS = ("sbatch", "bash", "sh")


def _read_options(args: Sequence[str]) -> Optional[tuple]:
    """read's words as bash's getopts reads them ("a:d:ei:n:N:p:rst:u:"): (names, -a's array, the delimiter,
    -n or -N's count, whether -N, -r, whether -t asks only whether input is there: -t 0); None where an option
    is not followed here (-u FD, another file than the here-string) or not valid."""
    values = {"a": None, "d": "\n", "n": None, "N": None, "t": None}
    flags = ""
    k = 0
    while k < len(args) and args[k].startswith("-") and args[k] != "-":
        word = args[k]
        k += 1
        if word == "--":
            break
        for j, letter in enumerate(word[1:], 1):
            if letter in "adinNptu":  # takes a value: the rest of the word, or the next word
                value = word[j + 1:] if j + 1 < len(word) else (args[k] if k < len(args) else None)
                k += j + 1 == len(word)
                if value is None or letter == "u":
                    return None
                values[letter] = value
                break
            if letter not in "ers":
                return None
            flags += letter
    names = list(args[k:])
    count = values["N"] if values["N"] is not None else values["n"]
    if count is not None and not count.isdigit():
        return None
    timeout = values["t"]
    if timeout is not None and not re.fullmatch(r"[0-9]*\.?[0-9]*", timeout):
        return None
    return (names, values["a"], values["d"][:1] or "\0", None if count is None else int(count),
            values["N"] is not None, "r" in flags, timeout is not None and not timeout.strip("0."))


def _read_line(text: str, delim: str, count: Optional[int], exact: bool, raw: bool) -> tuple[list, bool]:
    """The characters read reads of ``text``, each with whether a backslash escaped it (without -r a backslash
    escapes the next character, which no IFS character splits then, and one before a newline continues the
    line); whether the input held the whole line (its delimiter, or -N's count)."""
    chars: list[tuple[str, bool]] = []
    k = 0
    while k < len(text) and (count is None or len(chars) < count):
        c = text[k]
        if c == "\\" and not raw and k + 1 < len(text):
            if text[k + 1] != "\n":
                chars.append((text[k + 1], True))
            k += 2
            continue
        if c == delim and not exact:
            return chars, True
        chars.append((c, False))
        k += 1
    return chars, count is not None and len(chars) == count


def _read_fields(chars: list, ifs: str, names: Optional[int]) -> list[str]:
    """read's split of the line ``chars`` (from :func:`_read_line`) on ``ifs``, as bash's read.def does it:
    IFS whitespace at the ends dropped, each field then its delimiter (IFS whitespace, at most one other IFS
    character, IFS whitespace) taken; for ``names`` variables, the last gets the rest of the line, its IFS
    whitespace at the end dropped (an escaped one too), or the one field it holds where that field and its delimiter end it
    (``IFS=, read a b <<< 1,2,``: b is 2). ``names`` None: every field (-a)."""
    def separator(k: int, blank: bool) -> bool:
        return k < len(chars) and not chars[k][1] and chars[k][0] in ifs and (chars[k][0] in " \t\n") == blank

    def skip_blanks(k: int) -> int:
        while separator(k, True):
            k += 1
        return k

    def word(k: int) -> tuple[str, int]:
        """The field at ``k`` and where the next starts."""
        start = k
        while k < len(chars) and not (separator(k, True) or separator(k, False)):
            k += 1
        field = "".join(c for c, _ in chars[start:k])
        k = skip_blanks(k)
        if separator(k, False):
            k = skip_blanks(k + 1)
        return field, k

    k = skip_blanks(0)
    fields: list[str] = []
    while k < len(chars) and (names is None or len(fields) < names - 1):
        field, k = word(k)
        fields.append(field)
    if names is None:
        return fields
    if k < len(chars):
        field, end = word(k)
        if end < len(chars):
            # bash's strip_trailing_ifs_whitespace: IFS's blanks, escaped ones too, the first character kept
            end = len(chars)
            while end > k + 1 and chars[end - 1][0] in " \t\n" and chars[end - 1][0] in ifs:
                end -= 1
            field = "".join(c for c, _ in chars[k:end])
        fields.append(field)
    return fields + [""] * (names - len(fields))


def _printf_integer(text: str) -> int:
    """What printf's %d makes of an argument, as bash's does: decimal, 0x hexadecimal, 0 octal, a
    quote and a character (its code); 0 for what is none of them (bash says so and prints 0)."""
    text = text.strip()
    if text[:1] in ("'", '"'):
        return ord(text[1]) if len(text) > 1 else 0
    sign, digits = (-1 if text.startswith("-") else 1), text.lstrip("+-")
    # The number its leading characters make (bash says the rest is invalid, and prints that much).
    for pattern, base in ((r"0[xX]([0-9a-fA-F]+)", 16), (r"0([0-7]*)", 8), (r"([1-9][0-9]*)", 10)):
        match = re.match(pattern, digits)
        if match:
            value = sign * int(match.group(1) or "0", base)
            return max(-2**63, min(2**63 - 1, value))  # bash's intmax_t
    return 0


def _inline_script(fields: list[str]) -> Optional[tuple[str, list[str], list[tuple[str, bool]]]]:
    """(the script, its arguments, the shell's options) of ``bash -c SCRIPT ...`` among ``fields``, options
    before -c included: ``bash -x -c``, ``bash -lc``, ``bash -euo pipefail -c`` (Megatron-LM's Megatron-FSDP
    DeepSeek-V3 example runs ``srun ... bash -x -c "${TRAINING_CMD}"``)."""
    for k, word in enumerate(fields):
        if word.rsplit("/", 1)[-1] not in ("bash", "sh"):
            continue
        options, command, i = shell_options(fields, k + 1)
        if command:
            return (fields[i], fields[i + 1:], options) if i < len(fields) else None
    return None


def shell_options(fields: Sequence[str], i: int) -> tuple[list[tuple[str, bool]], bool, int]:
    """The options of a ``bash`` (or ``sh``) whose first word after its name is ``fields[i]``, as bash reads
    its invocation (bash(1), OPTIONS: the set builtin's letters and ``-o NAME``, which the script it runs starts
    with, ``-c``, ``-O NAME``, long ``--norc``-like ones): (the set options by long name, as :func:`_set_options`
    gives them: ``-u`` is nounset, ``-O NAME`` SHOPT_PREFIX + NAME; whether ``-c`` is among them; the index of
    the word after them, past a ``--`` or ``-`` that ends them)."""
    options: list[tuple[str, bool]] = []
    command = False
    while i < len(fields) and fields[i].startswith(("-", "+")) and fields[i] not in ("-", "--"):
        word = fields[i]
        i += 1
        if word.startswith("--"):  # --norc, --login, --posix: none that the reading follows
            continue
        for letter in word[1:]:
            if letter == "c":
                command = True
            elif letter in "oO":  # -o NAME, -O NAME (shopt's, marked as such): the name is the next word
                if i < len(fields):
                    options.append(((SHOPT_PREFIX if letter == "O" else "") + fields[i], word[0] == "-"))
                i += 1
            else:
                options.append((_SET_LETTERS.get(letter, letter), word[0] == "-"))
    if i < len(fields) and fields[i] in ("-", "--"):
        i += 1
    return options, command, i


_ENV_SETTING = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# Commands that start the rest of their words as a command, in the environment they were given (bash's
# exec, command and builtin, Bash Reference Manual 4.1 and 4.2; GNU time, where it is no reserved word:
# `command time`, `"time"`, /usr/bin/time (the parser takes bash's `time [-p]` off a pipeline); coreutils'
# nohup, nice, stdbuf, timeout): name -> (its short options that take the next word, its long ones, the operands
# before the command: timeout's duration).
_WRAPPERS = {
    "exec": ("a", (), 0), "command": ("", (), 0), "builtin": ("", (), 0), "time": ("fo", ("format", "output"), 0),
    "nohup": ("", (), 0), "nice": ("n", ("adjustment",), 0), "stdbuf": ("ioe", ("input", "output", "error"), 0),
    "timeout": ("sk", ("signal", "kill-after"), 1),
}
# Launchers whose many options are not read here (srun's, numactl's, taskset's): the command they start is
# taken as the first later word that names env(1) or one of _WRAPPERS, before any program.
_LAUNCHERS = ("srun", "numactl", "taskset")


def _env_option(letter: str, value: str, held: list, words: list[str], at: int) -> list:
    """env(1)'s -u NAME (--unset): NAME decidedly absent from what it passes; -S STRING (--split-string):
    STRING's words read as env's own from ``at`` on (``words`` changed in place). Other options: nothing."""
    if letter == "u":
        return [setting for setting in held if setting[0] != value] + [(value, None, True, False)]
    if letter == "S":
        words[at:at] = _split_string(value)
    return held


class _Unfollowed(Exception):
    """What a wrapper does that the reading does not follow, whose words or environment would differ."""


class _WrapperFails(Exception):
    """A wrapper that fails before it starts the command it names (env -0 with a command)."""


# env -S's escapes (coreutils' env.c, "escape sequences"): \_ is a space inside double quotes, a separator outside
_SPLIT_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "#": "#", "$": "$", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
                  "v": "\v"}


def _split_string(text: str) -> list[str]:
    """env -S STRING's words as coreutils' env splits them: on blanks, within '...' (where \\\\ and \\' alone
    are escapes) and "..." (and outside quotes, the escapes of _SPLIT_ESCAPES, \\_, and \\c ending the string), a
    word begun by # a comment to the end. Raises _Unfollowed on ${NAME}, which env expands from its own
    environment, and on what env refuses (an unknown escape, a quote left open)."""
    words: list[str] = []
    word: Optional[list[str]] = None
    quote = ""
    k = 0
    while k < len(text):
        c = text[k]
        k += 1
        if not quote and c in " \t\n\v\f\r":
            if word is not None:
                words.append("".join(word))
            word = None
            continue
        if word is None:
            if c == "#" and not quote:
                break
            word = []
        if c == quote:
            quote = ""
        elif c in "'\"" and not quote:
            quote = c
        elif c == "$" and quote != "'":
            raise _Unfollowed(f"env -S {one_line(text, 60)}: its ${{NAME}} is expanded from env's own environment")
        elif c == "\\" and (quote != "'" or text[k:k + 1] in ("\\", "'")):
            escape = text[k:k + 1]
            k += 1
            if escape == "c" and not quote:
                break
            if escape == "_":
                if quote:
                    word.append(" ")
                else:
                    words.append("".join(word))
                    word = None
                continue
            if escape not in _SPLIT_ESCAPES:
                raise _Unfollowed(f"env -S {one_line(text, 60)}: env refuses its \\{escape or ' at the end'}")
            word.append(_SPLIT_ESCAPES[escape])
        else:
            word.append(c)
    if quote:
        raise _Unfollowed(f"env -S {one_line(text, 60)}: env refuses its {quote} left open")
    if word is not None:
        words.append("".join(word))
    return words


def started_environment(fields: Sequence[str], held) -> tuple[tuple[str, Optional[str], bool], ...]:
    """``held`` (what bash passes the command ``fields`` start with) as the program at the end of the
    command's wrappers gets it: ``exec``, ``command``, ``nohup``, ``time``, ``nice``, ``stdbuf``,
    ``timeout`` and ``srun``/``numactl`` pass it on as they are given it; ``exec -c`` empties it (Bash
    Reference Manual, 4.1 Bourne Shell Builtins: exec); env(1) (coreutils' env --help) adds its NAME=VALUE
    words (NAME= : set, empty), takes out ``-u NAME`` (``-uNAME``, ``--unset[=]NAME``), empties it with
    ``-i``/``-``/``--ignore-environment``, and runs ``-S STRING``'s words as its own; an ``env`` it
    starts (env -u X env X=4 torchrun) changes it again."""
    return _started(fields, held)[0]


def started_program(fields: Sequence[str]) -> Optional[str]:
    """The word naming the program at the end of the command's wrappers (see :func:`started_environment`),
    None where they start none: ``env X=2 -u X torchrun``'s is ``-u``, as GNU env reads no option after its
    first NAME=VALUE."""
    words, at = _started(fields, ())[1:3]
    return words[at] if at < len(words) else None


def started_words(fields: Sequence[str]) -> tuple[str, ...]:
    """The command's words with each ``env -S STRING`` (``-SSTRING``, ``--split-string[=]STRING``) replaced by
    the words env splits STRING into, which env reads as its own (coreutils' env: ``env -S 'A B' C`` runs as
    ``env A B C``): ``env -S 'python3 -u' pretrain_gpt.py`` starts pretrain_gpt.py, one word of its own."""
    words, spans = _started(fields, ())[1], _started_spans(fields)
    kept: list[str] = []
    for k, word in enumerate(words):
        if k in spans:
            if spans[k]:
                kept.append(spans[k])
            continue
        kept.append(word)
    return tuple(kept)


def _started_spans(fields: Sequence[str]) -> dict[int, str]:
    """The words of an ``env -S`` option among ``fields`` as :func:`_started` lays them out, by index: what
    each becomes where the string's words stand in for it (its option letters but S: ``-vS`` is ``-v``; empty,
    dropped)."""
    spans: dict[int, str] = {}
    _started(fields, (), spans)
    return spans


def started_notes(fields: Sequence[str]) -> list[str]:
    """What reading the command's wrappers assumed (a sudo that resets the environment: SUDO_RESETS)."""
    return _started(fields, ())[3]


def _started(fields: Sequence[str], held, spans: Optional[dict] = None) -> tuple[tuple, list[str], int, list[str]]:
    """(:func:`started_environment`'s environment, the command's words as its wrappers read them, env -S's
    string split among them, the index of the program they start: the words' length where none, and
    :func:`started_notes`); ``spans`` gets the words of each -S option, as :func:`_started_spans` gives them."""
    spans = {} if spans is None else spans
    held = list(held)
    words = list(fields)
    said: list[str] = []
    i = 0
    while i < len(words):
        name = words[i].rsplit("/", 1)[-1]
        i += 1
        if name == "env":
            null = False
            while i < len(words):
                word = words[i]
                i += 1
                if word == "--":
                    break
                if word in ("-", "--ignore-environment"):
                    held = [(EMPTIED, None, True, False)]
                elif word.startswith("--"):
                    option, eq, value = word[2:].partition("=")
                    null = null or option == "null"
                    if option == "split-string":
                        spans.update({i - 1: ""} if eq else {i - 1: "", i: ""})
                    if option in ("unset", "chdir", "split-string") and not eq:
                        value = words[i] if i < len(words) else ""
                        i += 1
                    held = _env_option({"unset": "u", "split-string": "S"}.get(option, ""), value, held, words, i)
                elif word.startswith("-") and len(word) > 1:
                    k = 1
                    while k < len(word):  # a cluster of short options: -iu NAME, -uNAME, -C DIR, -S STRING
                        letter = word[k]
                        k += 1
                        if letter == "i":
                            held = [(EMPTIED, None, True, False)]
                        elif letter == "0":
                            null = True
                        elif letter in "uCS":
                            value = word[k:]
                            if letter == "S":  # -vS STRING: -v stays, -S gives way to STRING's words
                                spans[i - 1] = word[:k - 1] if k > 2 else ""
                                if not value:
                                    spans[i] = ""
                            if not value:
                                value = words[i] if i < len(words) else ""
                                i += 1
                            held = _env_option(letter, value, held, words, i)
                            break
                else:
                    i -= 1
                    break
            i = _settings(words, i, held)
            if null and i < len(words):  # coreutils: "cannot specify --null (-0) with command", status 125
                raise _WrapperFails(f"env -0 (--null) refuses to start a command, so {one_line(words[i], 40)} "
                                    "is not started")
        elif name == "sudo":
            held, i, reset = _sudo(words, i, held)
            said += [SUDO_RESETS] if reset else []
        elif name in _WRAPPERS:
            takes, long_takes, operands = _WRAPPERS[name]
            while i < len(words) and words[i].startswith("-") and words[i] != "-":
                word = words[i]
                i += 1
                if word == "--":
                    break
                if word.startswith("--"):
                    if "=" not in word and word[2:] in long_takes:
                        i += 1
                elif name == "exec" and "c" in word[1:]:  # exec -c: "with an empty environment"
                    held = [(EMPTIED, None, True, False)]
                elif word[-1] in takes:  # -n 5, -a NAME (the value its own word)
                    i += 1
            i += operands
        elif name in _LAUNCHERS:
            i = next((j for j in range(i, len(words))
                      if words[j].rsplit("/", 1)[-1] in ("env", "sudo", *_WRAPPERS, *_LAUNCHERS)
                      or words[j].endswith(".py") or words[j].rsplit("/", 1)[-1].startswith(("torchrun", "python"))),
                     len(words))
        else:
            i -= 1
            break
    return tuple(held), words, i, said


def _settings(words: list[str], i: int, held: list) -> int:
    """env's (or sudo's) NAME=VALUE words from ``i`` on, each put in ``held`` (NAME= : set, empty); the index
    of the word after them."""
    while i < len(words) and _ENV_SETTING.match(words[i]):
        setting, _, value = words[i].partition("=")
        held.append((setting, value, True, False))
        i += 1
    return i


# sudo(8)'s short options that take the next word (-u USER, -g GROUP, -C FD, -D DIR, -p PROMPT, -r ROLE, -t TYPE,
# -T TIMEOUT, -U USER, -c CLASS; -h takes a host only joined to it, -hHOST), and its long ones
_SUDO_TAKES = "ugCDprtTUc"
_SUDO_LONG_TAKES = ("user", "group", "close-from", "chdir", "prompt", "role", "type", "command-timeout",
                    "other-user", "login-class")
SUDO_RESETS = ("sudo starts the command in a new environment (sudoers' env_reset, on by default): read as passing "
               "none of the script's variables but the NAME=VALUE words after sudo's options; sudo -E (or a "
               "sudoers env_keep) would pass them")


def _sudo(words: list[str], i: int, held: list) -> tuple[list, int, bool]:
    """sudo's options and NAME=VALUE words from ``i`` on, as sudo(8) reads them: (the environment of the
    command it starts, the index of that command, whether it reset the environment). sudo starts it in a
    minimal environment of its own (sudoers(5): env_reset, on by default, keeps TERM, PATH, HOME and the like,
    none a launch reads here), unless -E (--preserve-env) keeps the caller's; --preserve-env=A,B keeps those
    names alone; -i (a login shell) resets it whatever else is given. Its NAME=VALUE words are set in it."""
    preserve: Optional[set] = set()  # the names kept; None: all
    login = False
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        word = words[i]
        i += 1
        if word == "--":
            break
        if word.startswith("--"):
            option, eq, value = word[2:].partition("=")
            if option == "preserve-env":
                preserve = (preserve | set(value.split(","))) if eq and preserve is not None else None
            elif option == "login":
                login = True
            elif option in _SUDO_LONG_TAKES and not eq:
                i += 1
            continue
        for k, letter in enumerate(word[1:], 1):
            if letter in _SUDO_TAKES:  # -u USER, -uUSER: the rest of the word, or the next, is its value
                i += k == len(word) - 1
                break
            if letter == "h":  # -hHOST, or -h alone (help)
                break
            if letter == "E":
                preserve = None
            elif letter == "i":
                login = True
    reset = preserve is not None or login
    if reset:
        held = [(EMPTIED, None, True, False), *(s for s in held if s[0] in (preserve or ()) and not login)]
    at = _settings(words, i, held)
    return held, at, reset


def _parse(text: str, line_of):
    """The commands of ``text`` (an eval's string), as bash parses them."""
    parser = _Parser(_lex(text, line_of), text, line_of)
    program = parser.parse_list()
    if parser.peek() is not None:
        raise parser.error(parser.peek(), f"unexpected {one_line(parser.peek().text, 40)!r}")
    return program


# set's one-letter options that the reading follows, by the long name ``set -o`` gives them
_SET_LETTERS = {"a": "allexport", "k": "keyword", "e": "errexit", "u": "nounset"}
# shopt's options the reading follows (each an attribute of the shell of that name); a bash invocation's
# -O NAME is given to apply_options as SHOPT_PREFIX + NAME, apart from set's -o NAME.
SHOPT_FOLLOWED = ("lastpipe", "nocasematch")
SHOPT_PREFIX = "shopt "


def _set_options(args: Sequence[str]) -> tuple[list[tuple[str, bool]], Optional[list[str]]]:
    """``set``'s options, in order, by their long names ((name, on): ``-euo pipefail`` is errexit,
    nounset, pipefail, each on; ``+e`` takes errexit off), and its operands, the positional parameters
    it sets (None where it sets none: no ``--`` and no word after the options)."""
    options: list[tuple[str, bool]] = []
    k = 0
    while k < len(args):
        arg = args[k]
        if arg == "--":
            return options, list(args[k + 1:])
        if arg in ("-", "+") or arg[:1] not in ("-", "+"):  # `set - a b`: the words after it are operands
            return options, list(args[k + (arg in ("-", "+")):]) or None
        k += 1
        for letter in arg[1:]:
            if letter == "o":  # -o NAME (alone, it prints the options)
                if k < len(args):
                    options.append((args[k], arg[0] == "-"))
                    k += 1
            else:
                options.append((_SET_LETTERS.get(letter, letter), arg[0] == "-"))
    return options, None


def _keyword_assignments(assignments: Sequence[_Tok], rest: list[_Tok]) -> tuple[list[_Tok], list[_Tok]]:
    """Under ``set -k`` (``-o keyword``) every word after the command name in the form of an assignment is
    one of the command's ``NAME=value`` prefixes, taken out of its arguments (Bash Reference Manual, 4.3.1
    The Set Builtin: -k), a declaration's ``NAME=(...)`` too (``set -k; export A=(1 2)`` sets nothing)."""
    moved = [tok for tok in rest[1:] if tok.kind == "array" or (tok.kind == "word" and _is_assignment(tok.text))]
    return [*assignments, *moved], [rest[0], *(tok for tok in rest[1:] if all(tok is not m for m in moved))]


def _prefix_string(tok: _Tok) -> _Tok:
    """A command's ``NAME=(a "b c")`` prefix as bash reads it: no array, the string of its words joined by a
    space, in parentheses, expanded as an assignment's value is (``(a b c)``: parse.y's
    parse_compound_assignment joins the words, the temporary environment takes the string); another as it is."""
    if tok.kind != "array":
        return tok
    head = tok.text[:tok.text.index("=") + 1]
    return _Tok("word", f"{head}({' '.join(tok.elements)})", tok.start, tok.end)


def _expanded_value(word: str) -> str:
    """The value of a NAME=value word as :meth:`expanded_declaration` leaves it: single-quoted, each ' as '\\''."""
    value = word.partition("=")[2]
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("'\\''", "'")
    return value


def _as_word(field: str) -> str:
    """A word that expands to ``field`` alone: as it is where it holds nothing bash expands, splits or
    quotes (an option, NAME=value), else single-quoted."""
    if field and re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", field):
        return field
    return "'" + field.replace("'", "'\\''") + "'"


def _without_builtin_prefix(rest: list[_Tok]) -> list[_Tok]:
    """``command export X=32``, ``builtin export X=32``: the declaration itself, which bash runs as
    written (Bash Reference Manual, 4.2 Bash Builtins: builtin, command; ``command -p`` and the like
    are left as commands)."""
    while len(rest) > 1 and rest[0].kind == "word" and rest[0].text in ("command", "builtin") \
            and rest[1].kind == "word" and rest[1].text in _DECLARATIONS:
        rest = rest[1:]
    return rest


def _setting(name: str, var: _Var) -> tuple[str, Optional[str], bool, bool]:
    """(NAME, value, decided, conditional) of ``var`` in a started command's environment: an array is
    decidedly not there (bash exports no array: 3.7.4 Environment, "Array variables may not (yet) be
    exported"); conditional: there only if the caller's environment exported the name (``inherited``)."""
    if isinstance(var.value, list):
        return name, None, True, False
    return name, var.value, not var.deps, var.inherited and not var.exported


def _declaration_options(rest: Sequence[_Tok]) -> str:
    """The option letters a declaration's ``-`` words give (``declare -r -x X``: "rx")."""
    return "".join(t.text[1:] for t in rest[1:] if t.kind == "word" and t.text.startswith("-"))


def _declared_name(tok: _Tok) -> str:
    """The name a declaration's word declares: NAME of NAME=value (or NAME=(...)), else the word."""
    return _ASSIGNMENT.match(tok.text).group(1) if tok.kind == "array" or _is_assignment(tok.text) else tok.text


def _is_assignment(text: str) -> bool:
    match = _ASSIGNMENT.match(text)
    return match is not None
