"""A bash launch script read as bash would expand it, without running anything.

:func:`read_script` follows the script from top to bottom the way bash would, for the variables
it sets itself, and returns the words of every command it would start (``torchrun``,
``python``, ``srun``...), expanded: nothing is executed, no file but the script is opened (a
caller may answer a command substitution it recognises, see ``command_output``).

Modelled: scalar assignments (``X=1``, ``export X=...``, ``declare``/``local``/``readonly``, also named by a
quoted or expanded word (``'export' X=1``, ``$D X=1``: its words expanded as any command's),
``X+=...``), arrays (``A=(...)``, ``A+=(...)``, ``A[i]=...``), parameter expansion
(``$X``, ``${X}``, ``${X:-default}``, ``${X-default}``, ``${X:=default}``, ``${X:+alt}``,
``${#X}``, ``${A[@]}``, ``${A[*]}``, ``${A[i]}``, ``${#A[@]}``, ``${X#pat}``, ``${X%pat}`` and
their doubles, ``${X/pat/rep}``, ``${X:off:len}``, ``${X^^}``, ``${X,,}``), arithmetic
(``$((...))``, ``((...))``, ``let``), quoting (single, double, ``$'...'``, backslashes) and
word splitting as bash does it (a quoted ``"${A[@]}"`` keeps each element one word, an
unquoted ``${A[@]}`` splits them), comments, line continuations, here-documents (the script of
``sbatch``, ``bash`` or ``sh`` they feed, expanded as bash expands one; others skipped),
``if``/``elif``/``else``, ``&&``/``||``, ``case``, ``for``, ``while``/``until``, ``select`` (its choice, read from
the input, read as at the input's end: no body run, said), functions,
``{ ...; }`` and subshells, ``exit``, ``set -e`` (``-o errexit``, with ``-o pipefail``: a command that fails ends the
script where bash does not ignore it; one whose failure the caller decides, or no command run decides, read as
going on, the first said), ``set --`` (and ``set a b``), ``shift``, ``unset``, ``local`` (and ``declare``
in a function) scoped to the call, ``declare -i``, ``printf -v NAME`` with ``%s``/``%d``/``%i``
(hexadecimal, octal and character arguments as bash reads them), ``${!name}``, word splitting on the
script's ``IFS`` (a run of separators one boundary: no empty fields), and
``bash -c STRING`` (read as a script of its own, with the exported variables, under the options of its
invocation: ``bash -euo pipefail -c``, ``sh -u -c``, ``bash -e <<EOF``, shopt's ``bash -O nocasematch -c``;
its status, which ``$?`` reads after it, is its script's where the script alone decides it).

The environment each command starts with (``Command.environment``): what the script exports
(``export``, ``declare -x``, ``local -x``, ``set -a``/``set -o allexport``; a declaration bash rejects,
``readonly -x``, ``export -f X=3``, sets nothing; ``export -n``, ``declare +x``
and ``unset`` take a variable out, a caller's exported one too, a function's locals scoped as bash scopes them), the command's own
``NAME=value`` prefixes (an array's: a string, its element 0 that ``A+=c`` appends to, the array left as it was; under ``set -k``, its ``NAME=value`` words after the name too; on a function call, its commands' for the call, scoped as bash scopes them), and what ``env`` changes (``-u NAME``, ``-uNAME``, ``--unset``, ``-i``, ``-S`` (its string split as env splits it: quotes, escapes, comments, its words the command's own, so the program it names is the one started, ``Command.fields`` holding them in its stead; one with ``${NAME}``, refused), ``-0`` with a command (env refuses it: nothing started); none after its first ``NAME=VALUE``, where a word is the command it runs: ``env X=2 -u X torchrun`` runs one named ``-u``, which fails, said, and starts nothing),
read through the commands that start another (``exec``, whose ``-c`` empties it, ``command``, ``time``,
``nohup``, ``nice``, ``stdbuf``, ``timeout``, ``srun``, ``numactl``, ``taskset``); a variable the script
leaves alone is the caller's, and one it sets without ``export`` (``X=32``, ``readonly``, ``declare -i``, ``local``, ``printf -v``, ``let``, ``for``) is there only where the caller exported the name, as bash exports what it inherits (Bash Reference Manual, 3.7.4 Environment; an array, never: ``Command.environment``'s conditional) (the reserved word ``time [-p]`` is no command: ``time X=3 torchrun`` passes X=3).
A ``readonly`` variable (``readonly X``, ``declare -r X``; a function's ``local -r X`` until the call returns) keeps
its value: an assignment to it fails as in bash, the rest of its line abandoned (the line that called the function,
where it fails in one); a declaration's word for it (``local X=32``, ``declare X=32``, ``readonly X=1 X=32``'s
second; a new local of a calling function's readonly local hides it, as bash allows) and a function call's ``X=32 f``
prefix fail alone, the declaration's other words assigned and the function run.
``sudo`` starts its command in an environment of its own: emptied by default (sudoers' env_reset), the caller's
with ``-E``/``--preserve-env`` (its names alone with ``--preserve-env=A,B``), plus its NAME=VALUE words; said.

Conditions: ``[ ... ]``, ``test`` and ``[[ ... ]]`` with ``=``, ``==``, ``!=`` (patterns in
``[[ ]]``), ``<``, ``>``, ``=~`` (a POSIX extended regular expression, in the subset Python's ``re`` reads alike:
planner/readers/bash/regex.py; it sets ``BASH_REMATCH`` as bash does where the match and its groups' spans
are worked out, else leaves it empty, said where a launch uses it; ``shopt -s nocasematch`` is followed for
``=~`` on ASCII text, while ``==`` under it is not decided, and a ``case`` or ``${X/pattern/...}`` under it is
read with regard to case, said where it reaches the launch), ``-n``, ``-z``, ``-v``, the integer comparisons, ``!``, ``-a``/``-o``,
``&&``/``||`` and parentheses. A variable the script does not set (it comes from the
environment or the command line) reads as bash reads it unset: empty, or the default that
``${X:-default}`` gives. What cannot be decided without running something (a file test, a
regular expression ``re`` reads otherwise, such as a back-reference, a command's exit status) is read as the outcome that does not ``exit``;
failing that, a test as false and a command as succeeding. Each branch decided by something
the script does not set is said in a note.

A ``$((...))`` bash fails on abandons the rest of its line, as bash does (said in a note), and so does a
``${!X}`` whose X is unset or names no variable (said, read as empty, where the caller may set X); ``${X:?msg}``
of an unset (or, the script deciding it, empty) X ends the script, a subshell alone, set -u or not, as bash
does (said, read as going on, where the caller may set X);
``((...))``, ``let`` and ``[[ ... -eq ... ]]`` fail with status 1. ``$?`` is bash's value where the status is
decided (``exit N``/``return N``: N mod 256, alone the last command's; a ``[`` bash refuses: 2; env's command
not found: 127); a failure whose value is not followed is read as 1, said.

Not modelled: command substitution (``$(...)`` and backquotes read as empty, but for what
``command_output`` answers) and process substitution (``<(...)``, ``>(...)``: parsed as bash parses
them, a word or a redirection's file, never run; the word is the file name bash gives the pipe,
/dev/fd/63, said where a launch's words hold it), globbing (``*`` stays as written, as under ``set -f``), brace and
tilde expansion, sparse and associative arrays (``A[5]=x`` past the end, or ``unset 'A[0]'`` before the last element, makes one:
refused, :class:`ScriptUnfollowed`, as is ``A=([0]=a [2]=c)``; ``unset 'A[i]'`` of the last element and
``unset 'A[@]'`` are followed; an ``A=([1]=b [0]=a)`` whose literal
subscripts fill 0 to n-1 is ordered by them, as bash does),
``source``, ``eval`` of a string the script does not decide and ``trap`` actions (said in a note, which names the variables their text assigns: their values could not be read; an ``eval`` of a decided string is run), ``read`` (but of a here-string the script decides, ``read X <<< 32``, with -r, -a, -d, -n, -N, -p, -s, -e, -t and
an ``IFS=...`` prefix, split as bash's read splits it, its status too), ``mapfile`` and ``readarray`` (they fail, as with no
input; the names they would set read as empty, said in a note and where a launch uses them),
``declare -n`` name references (said, a ``-x`` with it too; ``X=32 local -n X``'s prefix is no value of X, whose reference bash refuses), and variables bash sets itself (``PWD``, ``HOME``: unset).
A script bash could not parse raises :class:`ScriptSyntax`; one whose launch depends on what is not followed
(``env -S`` with ``${NAME}``), :class:`ScriptUnfollowed`; one that expands, loops or recurses
without end, or is longer than MAX_EXPANDED_CHARS, raises :class:`ScriptLimit`.
"""

from __future__ import annotations

from typing import Callable, Optional

from .errors import (MAX_DEPTH, MAX_NOTES, MAX_PATTERN_WORK, MAX_STEPS, MAX_WORDS, ScriptError, ScriptLimit, ScriptSyntax,
                     ScriptUnfollowed)
from .interpreter import run_script
from .results import EMPTIED, Command, Note, Script
from .state import BASH_SETS

__all__ = ["BASH_SETS", "EMPTIED", "MAX_DEPTH", "MAX_NOTES", "MAX_PATTERN_WORK", "MAX_STEPS", "MAX_WORDS", "Command", "Note", "Script",
           "ScriptError", "ScriptLimit", "ScriptSyntax", "ScriptUnfollowed", "read_script"]


def read_script(text: str, name: str, command_output: Optional[Callable[[str], Optional[str]]] = None, *,
                variables: Optional[dict] = None, positional: Optional[list] = None) -> Script:
    """The commands the bash script ``text`` would start, and notes on the branches it took on
    what it does not set. ``command_output(command)`` may give the output of a ``$(command)``
    (None: not known, read as empty); ``name`` is the script's name ($0, ${BASH_SOURCE[0]})."""
    return run_script(text, name, command_output, variables, positional)
