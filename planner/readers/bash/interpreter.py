"""The interpreter: a script's lists, pipelines and compound commands followed as bash would, with a
note for each branch decided on what the script does not set."""

from __future__ import annotations

import bisect
import re
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Optional, Sequence

from ...errors import one_line
from ...limits import MAX_EXPANDED_CHARS
from .arith import _ExpansionError
from .commands import _Commands
from .conditions import _CondParser
from .errors import MAX_DEPTH, ScriptLimit, ScriptSyntax
from .lexer import _lex, _Unterminated
from .parser import (_AndOr, _Arith, _ArithFor, _Case, _For, _FuncDef, _Group, _If, _List, _Parser, _Pipeline,
                     _Simple, _Test, _While)
from .patterns import _match_bounded
from .results import EMPTIED, Note, Script
from .state import _GENERATIONS, _NOT_RUN, NOCASEMATCH_UNFOLLOWED, _Ctx, _Var
from .status import _TRUE, _Exit, _failed, _LoopControl, _Return, _Status, _k3_and, _k3_or


def _first_word(node) -> Optional[str]:
    return node.words[0].text if isinstance(node, _Simple) and node.words and node.words[0].kind == "word" else None


def _list_exits(body: Optional[_List], words: tuple[str, ...] = ("exit", "return")) -> bool:
    """Whether ``body`` leaves the script or function at its top level (``...; exit 1``); ``words``: the
    builtins that count (``("exit",)``: the script itself)."""
    return body is not None and any(_pipeline_exits(item.first, words) for item in body.items)


def _pipeline_exits(pipeline: _Pipeline, words: tuple[str, ...] = ("exit", "return")) -> bool:
    if len(pipeline.commands) != 1:
        return False
    command = pipeline.commands[0]
    if isinstance(command, _Group):
        return _list_exits(command.body, words)
    return _first_word(command) in words


def _errexit_checked(command) -> bool:
    """Whether ``set -e`` looks at ``command``'s own status: a simple command, a test, ``((...))`` or a
    subshell; a compound command fails only where its last command did."""
    return isinstance(command, (_Simple, _Test, _Arith)) or (isinstance(command, _Group) and command.subshell)


class _Shell(_Commands):
    """A shell reading one script (or one ``bash -c`` string): what it runs, it follows."""

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
                self.last_status = _failed(1)  # what the next line's $? reads, as in bash

    def run_list(self, body: _List) -> _Status:
        status = _TRUE
        for item in body.items:
            status = self.run_and_or(item)
        return status

    def run_and_or(self, node: _AndOr, background: bool = True) -> _Status:
        if node.background and background:
            # `cmd &` runs in a subshell (Bash Reference Manual, 3.2.4 Lists): what it exports, sets or
            # unsets stays there, and the script goes on with status 0. `export X=32 &` was read as
            # exporting X to the commands after it.
            self.subshell(lambda: self.run_and_or(node, background=False))
            self.jobs_started = True
            return _TRUE
        with self.errexit_ignored_if(bool(node.rest)):  # set -e: only the command after the last && or || ends it
            status = self.run_pipeline(node.first)
        left_end = node.first.end
        for k, (op, pipeline) in enumerate(node.rest):
            wanted = op == "&&"
            # Known only by reading what the caller sets as empty: a guard that exits is not taken.
            decided = status.known is not None and not (status.deps and _pipeline_exits(pipeline))
            if decided:
                run = status.known == wanted
            elif _pipeline_exits(pipeline):
                run = False
            else:
                run = status.assumed == wanted
            right_text = self.text[pipeline.start:pipeline.end]
            matters = "=" in right_text or "--" in right_text or _pipeline_exits(pipeline)  # not: || mkdir -p
            # A guard on what cannot be decided without running anything ([ -f "$X/y" ] || exit 1): read as
            # passing, the one way the script launches anything, which leaves nothing to say. One on what
            # the caller sets is said: the caller decides it.
            # Only exit stops the script: a function's `|| return` skips the rest of the function and the
            # script launches either way, so which way it went is said (`[ -f x ] || return; TP=4`).
            guard = _pipeline_exits(pipeline, ("exit",)) and status.known is None
            if not self.in_condition and matters and not guard and (status.deps or (not decided and status.test)):
                left = self.source(node.first.start, left_end)
                outcome = run == wanted
                self.line = self.line_of(node.first.start)
                self.note(f"{left} {self.why(status, outcome)}, so the script "
                          f"{'runs' if run else 'skips'} {self.source(pipeline.start, pipeline.end)}",
                          self.flags_in(pipeline.start, pipeline.end))
            if run:
                with self.errexit_ignored_if(k < len(node.rest) - 1):
                    right = self.run_pipeline(pipeline)
                if decided:
                    status = right
                else:
                    known = _k3_and(None, right.known) if wanted else _k3_or(None, right.known)
                    status = _Status(known, right.assumed, {**status.deps, **right.deps},
                                     status.reason or right.reason, status.test and right.test, right.code)
            left_end = pipeline.end
        return status

    def why(self, status: _Status, outcome: bool) -> str:
        """'is true (X is not set by the script: read as empty)'."""
        said = "true" if outcome else "false"
        if status.known is None:
            return (f"cannot be decided without running anything ({status.reason or 'a command'}): "
                    f"read as {said}")
        if status.known != outcome:  # what the caller gives decides it: read as the branch that goes on
            return (f"is {'true' if status.known else 'false'} only as read ({self.reasons(status.deps)}), "
                    f"which the caller decides: read as {said}, the way that does not exit")
        return f"is {said} ({self.reasons(status.deps)})"

    @staticmethod
    def reasons(deps: dict) -> str:
        return "; ".join(f"{name} {how}" if how.startswith("is ") else f"{name}: {how}"
                         for name, how in list(deps.items())[:4])

    @contextmanager
    def errexit_ignored_if(self, ignored: bool):
        """Where ``ignored``, what runs inside is out of ``set -e``'s reach, as bash ignores it there."""
        self.errexit_ignored += ignored
        try:
            yield
        finally:
            self.errexit_ignored -= ignored

    def run_pipeline(self, node: _Pipeline) -> _Status:
        with self.errexit_ignored_if(node.negate):
            if len(node.commands) == 1:
                status = self.run_command(node.commands[0])
            else:
                status = self.run_piped(node.commands)
        if node.negate:
            # `! true` leaves 1 (Bash Reference Manual, 3.2.3 Pipelines: the logical negation)
            status = _Status(None if status.known is None else not status.known, not status.assumed,
                             status.deps, status.reason, status.test, code=1)
        else:
            self.check_errexit(node, status)
        self.last_status = status  # $?
        return status

    def check_errexit(self, node: _Pipeline, status: _Status) -> None:
        """Under ``set -e``, a pipeline that fails ends the script, where bash does not ignore it (Bash
        Reference Manual, 4.3.1 The Set Builtin: -e). A compound command other than a subshell is left alone:
        it fails only where its last command failed, which ended the script already unless ignored. A failure
        decided by what the caller sets is read as going on, said, as a guard that exits is; one that cannot be
        decided (a command not run) is read as succeeding."""
        if not self.errexit or self.errexit_ignored or status.known is not False:
            return
        if len(node.commands) == 1 and not _errexit_checked(node.commands[0]):
            return
        self.line = self.line_of(node.start)
        if status.deps:
            self.note(f"{self.source(node.start, node.end)} fails only as read ({self.reasons(status.deps)}), "
                      "which the caller decides: under set -e bash would end the script there; read as going on",
                      None)
            return
        self.note(f"{self.source(node.start, node.end)} fails, so set -e ends the script here: nothing after it "
                  "runs", None)
        raise _Exit(status)

    def run_piped(self, commands: list) -> _Status:
        """A pipeline's commands, each in a subshell; under ``shopt -s lastpipe`` the last in this shell, as
        bash runs it where job control is off, as in a script (Bash Reference Manual, 3.2.3 Pipelines):
        ``echo 32 | read X`` sets X. Its status is the last command's, or under ``set -o pipefail`` the last
        that failed: a failure of any, decidedly, fails it."""
        statuses = [self.subshell(lambda c=command: self.run_command(c)) for command in commands[:-1]]
        last = self.run_command(commands[-1]) if self.lastpipe else self.subshell(lambda: self.run_command(commands[-1]))
        if not self.pipefail:
            return last
        return next((status for status in reversed(statuses) if status.known is False), last)

    def subshell(self, run: Callable[[], _Status]) -> _Status:
        saved = (dict(self.vars), dict(self.funcs), list(self.positional), self.generation, self.nocasematch,
                 set(self.cleared), set(self.exported_unset), set(self.readonly), [frame.copy() for frame in self.frames],
                 self.allexport, self.lastpipe, self.keyword, self.errexit, self.pipefail, self.nounset,
                 set(self.unset_names), self.jobs_started)
        self.generation = next(_GENERATIONS)  # what the subshell changes, it copies first
        try:
            return run()
        except _Exit as leaving:  # `(exit 1) || TP=4`: a status the script states is known
            return leaving.status or _Status(None, True, reason="a subshell that exits")
        except _ExpansionError as error:
            # what bash fails on in a subshell (a readonly variable's assignment, $((a b))) ends the subshell
            # alone, status 1: `( X=32 ); torchrun ...` starts torchrun, where the rest of the line was abandoned
            self.note(f"{error}, so the subshell it is in exits with status 1", None)
            return _failed(1)
        finally:
            (self.vars, self.funcs, self.positional, self.generation, self.nocasematch, self.cleared, self.exported_unset,
             self.readonly, frames, self.allexport, self.lastpipe, self.keyword, self.errexit, self.pipefail,
             self.nounset, self.unset_names, self.jobs_started) = saved
            self.frames[:] = frames  # the list itself: a call the subshell is in pops its own frame off it

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
            return _Status(known, assumed, ctx.deps, reason, test=True, code=1)  # [[ ]] false: 1
        if isinstance(node, _Arith):
            self.step(node.start)
            ctx = _Ctx()
            try:
                value = self.arith(self.string(node.text, ctx, "((") if "$" in node.text else node.text, ctx, "((")
            except _ExpansionError:  # (( a b )): status 1
                return _failed(1, ctx.deps, test=True)
            return _Status(value != 0, value != 0, ctx.deps, test=True, code=1)
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
            with self.errexit_ignored_if(True):  # set -e ignores an if's or while's condition
                return self.run_list(body)
        finally:
            self.in_condition -= 1

    def run_if(self, node: _If) -> _Status:
        flags = self.flags_in(node.start, node.end)
        for k, (cond, body) in enumerate(node.clauses):
            status = self.condition(cond)
            last = k == len(node.clauses) - 1
            exits = _list_exits(body) or (last and _list_exits(node.orelse))
            if status.known is not None and not (status.deps and exits):
                take = status.known
            elif _list_exits(body) and not (last and _list_exits(node.orelse)):
                take = False
            elif last and _list_exits(node.orelse) and not _list_exits(body):
                take = True
            else:
                take = status.known if status.known is not None else status.assumed
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
        if node.select:
            return self.run_select(node)
        if node.items is None:
            items = list(self.positional)
        else:
            ctx = _Ctx()
            items = []
            for tok in node.items:
                items += self.fields(tok.text, ctx, node.name)
                if sum(len(w) + 1 for w in items) > MAX_EXPANDED_CHARS:
                    raise self.too_long(node.name)
        if node.items is not None and any(how.startswith(_NOT_RUN) for how in ctx.deps.values()):
            self.note(f"for {node.name} in …: the list's command substitution is not run (read as empty), so the "
                      f"loop runs over {len(items)} word{'s' * (len(items) != 1)} where bash runs over its output")
        for item in items:
            self.step(node.start)
            self.set_var(node.name, item, {})
            if self.loop_body(node.body) == "break":
                break
        return _TRUE

    def run_select(self, node: _For) -> _Status:
        """``select NAME in WORDS; do ...; done``: bash prints the menu and reads the choice from its input, which
        is not followed: read as at the input's end, where bash sets REPLY empty, leaves NAME as it was and runs
        no body (status 1), said. It was no command the reader parsed: the script was read word by word, and
        what followed it on its line (``done; export X=1``) lost."""
        self.set_var("REPLY", "", {f"select {node.name} (line {self.line})": _NOT_RUN})
        self.note(f"select {node.name} reads its choice from input, which is not followed: read as at the input's "
                  f"end, its body not run and {node.name} as it was")
        return _Status(None, False, reason="select's input is not followed")

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
        if self.nocasematch:  # bash matches the patterns without regard to case then: not followed here
            ctx.deps.setdefault(f"case {one_line(node.word.text, 40)}", NOCASEMATCH_UNFOLLOWED)
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

    def run_inline(self, inline: tuple[str, list[str], list], node: _Simple,
                   environment: tuple = ()) -> Optional[_Status]:
        """``bash -c 'script' name args`` (or a here-document fed to sbatch, bash or sh): read as a script
        of its own, whose variables are the environment the command gives it (:meth:`environment`: the
        exported variables, its NAME=value prefixes, env -u's and env -i's changes), started with the
        shell's options (``bash -u -c``: set -u). Its status where the script alone decides it
        (:func:`_inline_status`), else None."""
        text, positional, options = inline
        if self.depth >= MAX_DEPTH:
            raise ScriptLimit(f"line {self.line}", f"nests bash -c past {MAX_DEPTH} levels")
        exported: dict = {}
        cleared = set(self.cleared)
        emptied = False
        for name, value, _, conditional in environment:
            if name == EMPTIED:  # env -i: nothing before it, the caller's environment gone too (not listed)
                exported, cleared, emptied = {}, set(cleared) | set(self.vars), True
            elif value is None:
                exported.pop(name, None)
                cleared.add(name)
            else:
                var = self.exported_var(name) or self.inherited_var(name)
                if var is None or var.value != value:
                    var = _Var(value, size=len(value))
                # a value there only where the caller exported its name stays so in the inner script
                exported[name] = replace(var, exported=not conditional, inherited=conditional)
        inner, status = _run_script(text, f"{self.name} (bash -c at line {self.line_of(node.start)})",
                                    self.command_output, exported, positional[1:], self.steps, self.depth + 1,
                                    positional[0] if positional else "bash", cleared - set(exported), emptied,
                                    options)
        self.commands += inner.commands
        for note in inner.notes:
            self.note_as_is(note)
        return status


# Parameter expansions nested in one another (${A:-${B:-...}}): no launch script nests a handful, and
# the reader's recursion over each level took about a millisecond (100,000 levels, a minute).
MAX_EXPANSION_NESTING = 100


def _check_expansion_nesting(text: str) -> None:
    """Refuse parameter expansions nested past MAX_EXPANSION_NESTING before reading any: a linear
    count of ``${`` opened and ``}`` closed (any brace closes, so the count never exceeds the true
    nesting)."""
    depth = 0
    for match in re.finditer(r"\$\{|\}", text):
        if match.group() == "}":
            depth = max(0, depth - 1)
            continue
        depth += 1
        if depth > MAX_EXPANSION_NESTING:
            raise ScriptLimit("", f"nests parameter expansions (${{...${{...}}...}}) past {MAX_EXPANSION_NESTING} "
                                  "levels: nests too deeply to read")


def run_script(text: str, name: str, command_output: Optional[Callable[[str], Optional[str]]] = None,
               variables: Optional[dict] = None, positional: Optional[list] = None,
               steps: Optional[list] = None, depth: int = 0, argv0: Optional[str] = None,
               cleared: Optional[set] = None, emptied: bool = False, options: Sequence = ()) -> Script:
    """``read_script``'s reading, and that of a ``bash -c`` string inside it: ``steps`` (a one-item
    list) counts the commands followed across both, ``depth`` their nesting, ``argv0`` is ``$0``."""
    return _run_script(text, name, command_output, variables, positional, steps, depth, argv0, cleared, emptied,
                       options)[0]


def _run_script(text: str, name: str, command_output: Optional[Callable[[str], Optional[str]]] = None,
                variables: Optional[dict] = None, positional: Optional[list] = None,
                steps: Optional[list] = None, depth: int = 0, argv0: Optional[str] = None,
                cleared: Optional[set] = None, emptied: bool = False,
                options: Sequence = ()) -> tuple[Script, Optional[_Status]]:
    """:func:`run_script`'s reading and the status the script leaves, where :func:`_inline_status` knows it."""
    if len(text) > MAX_EXPANDED_CHARS:
        raise ScriptLimit("", f"holds {len(text):,} characters, past the {MAX_EXPANDED_CHARS:,} a launch script "
                              "is read to")
    _check_expansion_nesting(text)
    newlines = [m.start() for m in re.finditer("\n", text)]

    def line_of(offset: int) -> int:
        return bisect.bisect_left(newlines, offset) + 1

    try:
        tokens = _lex(text, line_of)
        parser = _Parser(tokens, text, line_of)
        program = parser.parse_list()
        if parser.peek() is not None:
            raise parser.error(parser.peek(), f"unexpected {one_line(parser.peek().text, 40)!r}")
        shell = _Shell(text, name, command_output, line_of, variables, positional, steps, depth, argv0)
        shell.cleared = set(cleared or ())  # what the outer script unset, out of the inner one's environment too
        shell.caller_emptied = emptied  # env -i bash -c: no name comes from a caller's environment
        shell.apply_options(options)  # bash -u -c, bash -e <<EOF: the inner script starts under them
        status: Optional[_Status] = None
        try:
            shell.run_program(program)
            status = shell.last_status
        except _Exit as exited:
            status = exited.status
        except _Return:  # bash: "can only `return' from a function", its status not followed here
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
    return Script(shell.commands, notes), _inline_status(status)


def _inline_status(status: Optional[_Status]) -> Optional[_Status]:
    """The status a script leaves as its caller's ``$?`` reads it: where the script alone decides it (an
    ``exit 3``, a ``false``, a ``[ ]`` the reader decides); None where it cannot be known (a command not run
    last, ``exit $RC``) or turns on what the caller's environment sets, whose names the caller's notes would
    not show as the inner script read them: the caller reads it as a command not run, said."""
    if status is None or status.known is None or status.deps:
        return None
    return status
