"""A shell's state: its variables, functions and positional parameters, the commands and notes it
gathers, the steps it takes; and what reads and sets its variables."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

from ...errors import one_line
from ...limits import MAX_EXPANDED_CHARS
from .errors import MAX_EXPANSION_WORK, MAX_NOTES, MAX_STEPS, ScriptLimit, ScriptUnfollowed
from .lexer import _ASSIGNMENT, _Tok
from .results import Command, Note
from .status import _FALSE, _TRUE, _Exit, _Status


# Variables bash (or the login that starts it) sets in every script, which the reader leaves empty:
# bash's manual, "Shell Variables".
BASH_SETS = frozenset(("PWD", "OLDPWD", "HOME", "HOSTNAME", "USER", "UID", "EUID", "PPID", "SHELL", "BASH",
                       "BASH_VERSION", "BASH_SOURCE", "LINENO", "RANDOM", "SECONDS", "PATH", "SHLVL", "IFS"))


@dataclass
class _Var:
    value: Union[str, list]
    deps: tuple = ()  # ((name, how it was read), ...): what the value owes to what the script does not set
    exported: bool = False
    size: int = 0  # characters, an array's separators counted
    generation: int = 0  # the (sub)shell that may extend its array in place
    # Exported only if the caller's environment holds the name: the script set it without deciding its export
    # attribute (X=32, readonly X=32, declare -i X=32, local X=32 of such a name), and bash exports a variable
    # it inherited from the environment (Bash Reference Manual, 3.7.4 Environment). Meaningless once exported.
    inherited: bool = False


_GENERATIONS = itertools.count(1)


class _Frame(dict):
    """One function call's variables made local: each name's value before the call (None: unset), put back
    when it returns. ``temporary``: the names the call's own ``NAME=value`` prefixes set (``X=9 f``), which
    bash puts in the function's scope, exported (Bash Reference Manual, 3.7.4 Environment); ``propagated``:
    those of them ``export`` or ``readonly`` took in the call, whose value bash keeps past its return;
    ``exported``: the call's locals that hold the export attribute while unset (``local X`` of an exported
    X, ``local -x X``), which the value a later ``X=32`` gives them keeps (bash's variables.c,
    make_local_variable: a new local takes the export attribute of the variable it hides); ``readonly``: the
    call's locals made readonly (``local -r X``, ``declare -r X``, ``readonly X`` of a local), which bash
    refuses to set or unset until the call returns and they go with it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.temporary: set[str] = set()
        self.propagated: set[str] = set()
        self.exported: set[str] = set()
        self.readonly: set[str] = set()

    def copy(self) -> "_Frame":
        frame = _Frame(self)
        frame.temporary, frame.propagated = set(self.temporary), set(self.propagated)
        frame.exported, frame.readonly = set(self.exported), set(self.readonly)
        return frame


_READ_EMPTY = "is not set by the script: read as empty"
# What shopt -s nocasematch changes that the reader does not follow (a case's patterns, ${X/pattern/...}):
# matched with regard to case, said where it reaches the launch.
NOCASEMATCH_UNFOLLOWED = "is under shopt -s nocasematch, which is not followed here: matched with regard to case"
_DEFAULTED = "is not set by the script: read as its default"  # ${X:-default}'s, followed by the default
_NOT_RUN = "not run: read as empty"  # a command substitution's output
# A process substitution's word: the file name of a pipe to a command never run.
_PROCESS = "not run: read as the file name bash gives it, /dev/fd/63, whose content is not known"
# BASH_REMATCH after a [[ =~ ]] whose match (or its groups' spans) is not worked out.
REMATCH_UNKNOWN = "not known (the [[ =~ ]] that sets it is not decided here): read as empty"


class _Ctx:
    """What one expansion read that the script does not set."""

    def __init__(self):
        self.deps: dict[str, str] = {}

    def merge(self, deps) -> None:
        for name, how in deps:
            self.deps.setdefault(name, how)


def _joined(value) -> str:
    return " ".join(value) if isinstance(value, list) else value


class _State:
    """What a shell holds, and what reads and sets it. The arithmetic, the expansions and the commands
    build on it (arith.py, expand.py, commands.py; interpreter.py's _Shell is the whole shell), and it
    reaches up to them where bash's expansions call each other: ``lookup`` and ``set_var`` evaluate an
    array index with ``arith``, ``assign`` expands with ``fields`` and ``string``."""

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
        self.steps = steps if steps is not None else [0, 0]  # commands followed, characters expanded
        self.depth = depth
        # Each function call's variables made local (``local``, ``declare`` in a function, the call's own
        # NAME=value prefixes): their values before the call, None where unset, put back when it returns.
        self.frames: list[_Frame] = []
        # Names the script `unset`, or took the export attribute off (`export -n`, `declare +x`): whatever
        # the caller's environment held for them is gone from what the script starts, so a started command's
        # environment decidedly lacks them unless the script exports them again.
        self.cleared: set[str] = set()
        # Names `export X` (declare -x X) exported while unset, outside any call's locals: the value a later
        # X=32 gives them is exported (bash keeps the attribute on the unset variable), whatever the caller had.
        self.exported_unset: set[str] = set()
        # Names the script `unset` (outside any call's locals) and has not set since: decidedly unset, whatever
        # the caller's environment held (`cleared` holds those `export -n` took out too, which keep a value).
        self.unset_names: set[str] = set()
        # readonly X, declare -r X of a variable no call made local: bash refuses to set or unset them (a
        # function's readonly locals are its frame's: _Frame.readonly)
        self.readonly: set[str] = set()
        self.integers: set[str] = set()  # declare -i: an assignment's value is evaluated as arithmetic
        self.letter_cases: dict[str, str] = {}  # declare -u / -l: "u" or "l", the case its values are stored in
        self.in_condition = 0
        self.jobs_started = False  # a command run in the background (`cmd &`), which sets $!
        self.nocasematch = False  # shopt -s nocasematch: [[ =~ ]] and [[ == ]] without regard to case
        self.allexport = False  # set -a: every variable set is exported
        self.lastpipe = False  # shopt -s lastpipe: a pipeline's last command runs in this shell
        self.keyword = False  # set -k: NAME=value words after the command name are its environment too
        self.errexit = False  # set -e: a command that fails ends the script (Bash Reference Manual, 4.3.1)
        self.pipefail = False  # set -o pipefail: a pipeline fails where any of its commands does
        self.nounset = False  # set -u: expanding an unset variable ends the script (Bash Reference Manual, 4.3.1)
        self.last_status: _Status = _TRUE  # the last pipeline's, which $? expands to (0 as bash starts)
        # Above 0 where bash ignores set -e: an if's or while's condition, a command before an and-or list's
        # last && or ||, a pipeline negated by ! (and what functions and subshells run from there)
        self.errexit_ignored = 0
        self.caller_emptied = False  # a bash -c under env -i: the caller's environment holds nothing
        self.line = 1
        self.generation = next(_GENERATIONS)

    # --- bookkeeping

    def step(self, at: int) -> None:
        self.line = self.line_of(at)
        self.steps[0] += 1
        if self.steps[0] > MAX_STEPS:
            raise ScriptLimit(f"line {self.line}", f"runs past {MAX_STEPS:,} commands (a loop without end?); "
                                                   "expected a launch script")

    def expanded(self, characters: int) -> None:
        """Count ``characters`` expanded against the reading's whole budget (MAX_EXPANSION_WORK)."""
        self.steps[1] += characters
        if self.steps[1] > MAX_EXPANSION_WORK:
            raise ScriptLimit(f"line {self.line}", f"expands past {MAX_EXPANSION_WORK:,} characters in all (a loop "
                                                   "over a long variable?)")

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
        self.note_as_is(Note(f"{self.name}: line {self.line}: {text}", flags))

    # --- variables

    def unbound(self, name: str, label: str) -> None:
        """Under ``set -u``, an expansion of the unset ``name`` (``label`` as bash names it: ``$1``) ends the
        script, a subshell alone where in one (Bash Reference Manual, 4.3.1 The Set Builtin: -u; bash 5.2 exits
        "X: unbound variable"). Where the script alone decides it is unset (it unset it, a function's local
        never given a value, an element past an array's end, a positional parameter past those ``set --``
        gave, env -i), bash stops here, and so does the reading. Where the caller's environment or arguments
        may set it, the reading cannot know: said, and read as set, empty, the way that goes on (as a
        guard the caller decides is read). What bash sets itself (PWD, HOME) is set."""
        if not self.nounset or name in BASH_SETS:
            return
        self.ends_unless_set(name, label, "set -u", f"{label.lstrip('$')}: unbound variable")

    def ends_unless_set(self, name: str, label: str, what: str, says: str) -> None:
        """``what`` (set -u, ``${X:?}``) ends the script where ``name`` is unset (``says``: bash's message): here
        where the script alone decides it (:meth:`provably_unset`), read as set, empty, and said where the
        caller may set it, as :meth:`unbound` explains."""
        if self.provably_unset(name):
            self.note(f"{label} is unset (the script leaves it so), so {what} ends the script here (bash: "
                      f"\"{says}\"): nothing after it runs", None)
            raise _Exit(_FALSE)
        if name.startswith("SLURM_") and re.search(r"^#SBATCH", self.text, re.M):
            return  # a batch script: Slurm sets SLURM_* in its job's environment (sbatch(1), OUTPUT ENVIRONMENT)
        self.note(f"{label} is not set by the script: under {what} bash ends the script here unless the caller "
                  "sets it; read as set, empty", None)

    def required(self, name: str, label: str, op: str, word: str, is_set: bool) -> None:
        """``${X:?word}`` where X is unset or empty (``${X?word}``: unset): bash prints ``X: word`` and ends the
        script, a subshell alone where in one, whatever set -u says (Bash Reference Manual, 3.5.3 Shell Parameter
        Expansion: "if the shell is not interactive, it exits"). Set but empty, it ends here where the script
        decided the value; where the caller decides it, read as going on, said."""
        if name in BASH_SETS:
            return
        what = f"${{{label.lstrip('$')}{op}{one_line(word, 30)}}}"
        says = f"{label.lstrip('$')}: " + (word or ("parameter null or not set" if op == ":?" else "parameter not set"))
        if not is_set:
            self.ends_unless_set(name, label, what, says)
            return
        var = self.vars.get(name)
        if var is not None and not var.deps:
            self.note(f"{label} is empty (the script sets it so), so {what} ends the script here (bash: \"{says}\"): "
                      "nothing after it runs", None)
            raise _Exit(_FALSE)
        self.note(f"{label} is empty only as read ({self.reasons(dict(var.deps)) if var else 'what the caller gives'}): "
                  f"under {what} bash ends the script here unless the caller gives it a value; read as going on", None)

    def provably_unset(self, name: str) -> bool:
        """Whether ``name``, unset as read, is unset whatever the caller gives: see :meth:`unbound`."""
        if name.isdigit():
            return self.positional_known
        if name == "!":  # read as unset only where no job was started in the background
            return True
        return (self.caller_emptied or name in self.unset_names or name in self.vars
                or any(name in frame for frame in self.frames))

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
        if name == "?":
            return self.status_word(ctx), True
        if name == "-":
            return "", True
        if name == "!" and not self.jobs_started:  # no job started in the background: bash leaves $! unset
            return (None, False) if self.nounset else ("", True)
        if name in ("$", "!"):
            ctx.deps.setdefault(f"${name}", "a process id: read as empty")
            return "", True
        var = self.vars.get(name)
        if var is None:
            return None, False
        ctx.merge(var.deps)
        value = var.value
        if index is None:  # an array's element 0, unset in an empty one (A=(); ${A-unset} is "unset" to bash)
            if isinstance(value, list):
                return (value[0], True) if value else (None, False)
            return value, True
        if index in ("@", "*"):
            return list(value) if isinstance(value, list) else [value], True
        position = self.expanded_arith(index, ctx, name)
        items = value if isinstance(value, list) else [value]
        if position < 0:
            position += len(items)
        return (items[position], True) if 0 <= position < len(items) else (None, False)

    def status_word(self, ctx: _Ctx) -> str:
        """``$?``: the last pipeline's status where it is known, what decided it carried with it: 0, or the
        failed one's own (``false``'s 1, ``(exit 3)``'s 3: a ``[ $? -eq 3 ]`` turns on it). Where it cannot be
        known (a command the reader does not run: torchrun, grep), read as 0, said: a ``[ $? -ne 0 ]`` guard
        turns on it; a failure whose status is not followed (a ``[`` bash may refuse with 2), as 1, said."""
        status = self.last_status
        ctx.merge(status.deps.items())
        if status.known is None:
            ctx.deps.setdefault("$?", f"the status of a command not run ({status.reason or 'a command'}): read as 0")
            return "0"
        if status.known:
            return "0"
        if status.code is None:
            ctx.deps.setdefault("$?", "a failure whose status is not followed: read as 1")
            return "1"
        return str(status.code)

    def set_var(self, name: str, value: Union[str, list], deps: dict, append: bool = False,
                index: Optional[str] = None, exported: Optional[bool] = None, global_: bool = False) -> None:
        """``global_``: the script's own variable set past the calls' locals (declare -g)."""
        if (name in self.readonly) if global_ else self.meets_readonly(name):
            from .arith import _ExpansionError

            # bash refuses it, the value left as it was, and abandons the rest of the line as for an expansion
            # it fails on (a command's X=2 prefix too, though the command runs: see script_environment)
            raise _ExpansionError(f"{name} is readonly: assigning it fails in bash")
        old = self.vars.get(name)
        deps = dict(deps)
        if old is not None and (append or index is not None or
                                (isinstance(old.value, list) and not isinstance(value, list))):
            deps = {**dict(old.deps), **deps}
        if index is not None and index not in ("@", "*"):
            items = list(old.value) if old is not None and isinstance(old.value, list) else \
                ([old.value] if old is not None else [])
            position = self.expanded_arith(index, _Ctx(), name) or 0
            if position < 0:  # from the end, as bash counts A[-1]; before the start, bash fails
                position += len(items)
                if position < 0:
                    from .arith import _ExpansionError

                    raise _ExpansionError(f"{name}[{one_line(index, 20)}]= fails in bash (a bad array subscript)")
            if position >= MAX_EXPANDED_CHARS:
                raise self.too_long(name)
            if position > len(items):
                # bash leaves the indices between unset: a sparse array, whose ${!A[@]}, ${#A[@]} and "${A[@]}" the
                # reading does not follow (empty elements in their stead gave the launch words bash does not)
                raise ScriptUnfollowed(f"line {self.line}", f"{name}[{one_line(index, 20)}]= sets an index past the "
                                                            f"end of {name} (a sparse array), which is not followed "
                                                            "here; expected the elements set in order")
            if position == len(items):
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
        self.unset_names.discard(name)
        if exported is None and old is None and not global_:  # an unset local: the export attribute it was made with
            exported = self.unset_local_exported(name) or None
        self.vars[name] = _Var(value, tuple(deps.items()),
                               self.allexport or (old.exported if exported is None and old is not None
                                                  else bool(exported)),
                               size, self.generation, self.inherits_export(name, old, exported))

    def meets_readonly(self, name: str, scoped: bool = False, frames: Optional[list] = None) -> bool:
        """Whether setting ``name`` here (a local of it in the current call where ``scoped``) meets a readonly
        variable, which bash refuses: the one the innermost of ``frames`` (the calls' scopes, all of them by
        default) that made it local holds, else the global. A new local of it may hide a calling function's
        readonly local (bash allows it), not a readonly global, nor its own call's (variables.c,
        make_local_variable)."""
        frames = self.frames if frames is None else frames
        scope = next((frame for frame in reversed(frames) if name in frame), None)
        if scope is None:
            return name in self.readonly
        return name in scope.readonly and (not scoped or scope is frames[-1])

    def mark_readonly(self, name: str, global_: bool = False) -> None:
        """``readonly NAME`` (``declare -r``, ``local -r``): the variable the name now reads, a call's local
        (gone with the call) or the global (``global_``: declare -g's, past any local)."""
        scope = None if global_ else next((frame for frame in reversed(self.frames) if name in frame), None)
        (self.readonly if scope is None else scope.readonly).add(name)

    def unset_local_exported(self, name: str) -> bool:
        """Whether ``name``, unset, holds the export attribute, which an assignment now keeps: a function's local
        (``local X`` without a value) the innermost call that made it local has exported, or a global ``export
        X`` exported before it had a value (``export X; X=32`` passes 32)."""
        scope = next((frame for frame in reversed(self.frames) if name in frame), None)
        return name in (self.exported_unset if scope is None else scope.exported)

    def inherits_export(self, name: str, old: Optional[_Var], exported: Optional[bool]) -> bool:
        """Whether ``name``, set now without ``export`` or ``+x`` (``exported`` None), is exported exactly where
        the caller's environment holds it: a name the script has not yet given a value, unset, or taken
        the export attribute from (Bash Reference Manual, 3.7.4 Environment: bash marks what it inherits
        for export), or one that already was so."""
        if exported is not None:
            return False
        if old is not None:
            return old.inherited and not old.exported
        return name not in self.cleared and not self.caller_emptied

    def compound_elements(self, name: str, raws: Sequence[str], append: bool, ctx: _Ctx) -> list[str]:
        """The elements ``NAME=(...)`` (``NAME+=(...)``) gives, in the order of their indices, as bash sets them: a
        word ``[i]=value`` sets index i to the value (expanded as an assignment's: not split), the next word goes
        to i+1, a plain word's fields to the next indices, the last of an index given twice winning
        (``A=([1]=64 [0]=--flag)`` is ``--flag 64``). Indices that do not fill the array from its start (or from
        its end, appended to) make a sparse array, not followed: refused. A subscript that is no literal index
        (``[$i]=``, an associative array's ``[tp]=``, not modelled) leaves the elements in the written order."""
        literal = all(re.match(r"\[\d{1,9}\]=", raw) for raw in raws if raw.startswith("["))
        old = self.vars.get(name) if append else None
        first = (len(old.value) if isinstance(old.value, list) else 1) if old is not None else 0
        slots: dict[int, str] = {}
        at, size = first, 0
        for raw in raws:
            subscript = re.match(r"\[([^\]]*)\]=", raw)
            if subscript:
                at = int(subscript.group(1)) if literal else at
                words = [self.string(raw[subscript.end():], ctx, name)]
            else:
                words = self.fields(raw, ctx, name)
            for word in words:
                size += len(word) + 1
                if size > MAX_EXPANDED_CHARS:
                    raise self.too_long(name)
                slots[at] = word
                at += 1
        if sorted(slots) != list(range(first, first + len(slots))):
            raise ScriptUnfollowed(f"line {self.line}", f"{name}{'+=' if append else '='}(...) sets the indices {', '.join(map(str, sorted(slots)[:6]))}"
                                                        f", which leave holes in {name} (a sparse array), not followed "
                                                        "here; expected the elements set in order")
        return [slots[k] for k in sorted(slots)]

    def assign(self, tok: _Tok, exported: Optional[bool] = None, global_: bool = False) -> None:
        match = _ASSIGNMENT.match(tok.text)
        name, index, append = match.group(1), match.group(2), match.group(3) == "+"
        ctx = _Ctx()
        if tok.kind == "array":
            elements = self.compound_elements(name, tok.elements, append, ctx)
            self.set_var(name, elements, ctx.deps, append=append, exported=exported, global_=global_)
        else:
            value = self.string(tok.text[match.end():], ctx, name)
            if name in self.integers:
                number = self.arith(value or "0", ctx, name)
                if append:  # declare -i X; X+=2 adds, where a string would be appended to
                    old, _ = self.lookup(name, index, ctx)
                    number += self.arith(_joined(old) or "0", ctx, name) if old is not None else 0
                value, append = str(number), False
            case = self.letter_cases.get(name)
            if case is not None:  # declare -u / -l: the value is stored upper- or lower-cased
                value = value.upper() if case == "u" else value.lower()
            self.set_var(name, value, ctx.deps, append=append, index=index, exported=exported, global_=global_)
