"""A Megatron-LM launch: the words of an argument list, or of the commands a launch script runs as
bash would expand them (:mod:`planner.readers.bash`), as flags; the notes of what the reading assumed."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Optional, Sequence
from planner.engines.megatron.emit import ALIASES, BOOL_FLAGS, INT_FLAGS, LIST_FLAGS, STR_FLAGS
from planner.engines.megatron.functional_test import functional_test_launch
from planner.errors import CaseError, one_line
from planner.inputs import read_text
from planner.limits import MAX_EXPANDED_CHARS, MAX_INT
from planner.readers import bash


_ASSIGNMENT = re.compile(r"^\s*(?:export\s+|local\s+|readonly\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _tokens(text: str, src: str) -> list[str]:
    """Shell words of a script or argument list: comments dropped, continuations joined, quotes
    removed, and ``$VAR`` / ``${VAR:-default}`` resolved from plain assignments in the same text
    (a value past MAX_EXPANDED_CHARS is refused: variables that double on every line would
    otherwise fill the memory)."""
    if len(text.split()) > bash.MAX_WORDS:
        # Counted before the words are read (in C): a --data-path of 1.5 million words took 53 s, read
        # four times over; the bash reader holds a script's expansions to the same bound.
        raise CaseError(src, "", f"holds more than {bash.MAX_WORDS:,} words; expected a launch's arguments (a data "
                                 "blend of that many paths belongs in a --data-args-path file)")
    text = re.sub(r"\\\r?\n", " ", text)
    variables: dict[str, str] = {}
    words: list[str] = []
    # Lines and words as bash takes them: a line ends at a newline alone, and words part at its
    # blanks (a no-break space or a form feed is a word's character: the parser refuses the word).
    for number, line in enumerate(text.split("\n"), 1):
        line_words = split_words(line)
        if line_words is None:  # an unbalanced quote: fall back to blanks
            line_words = [w for w in _BLANKS.split(line.split("#", 1)[0]) if w]
        match = _ASSIGNMENT.match(line)
        if match and len(line_words) == 1:
            name = match.group(1)
            value = line_words[0].split("=", 1)[1]
            variables[name] = _substitute(value, variables, src, name)
            continue
        for word in line_words:
            resolved = _substitute(word, variables, src, f"line {number}")
            # An expanded variable splits into words, as unquoted in the shell.
            words += [w for w in _BLANKS.split(resolved) if w] if resolved != word else [word]
    return words


# bash's blanks (IFS's space, tab and newline, and the carriage return its reader takes as one:
# planner.readers.bash.lexer), not every Unicode space.
_BLANKS = re.compile(r"[ \t\r\n]+")


_WORD_PART = re.compile(r"""'([^']*)'|"((?:[^"\\]|\\.)*)"|\\(.)|([^ \t\r\n'"\\]+)|([ \t\r\n]+)""", re.DOTALL)
_DOUBLE_QUOTED_ESCAPE = re.compile(r'\\([\\"])')


def split_words(line: str) -> Optional[list[str]]:
    """The shell words of one line as bash splits them (quotes removed, a backslash escaping the next
    character, ``#`` at a word's start opening a comment), or None at an unbalanced quote: what
    ``shlex.split(line, comments=True)`` gives, but for a ``#`` inside a word, which shlex takes for a
    comment and bash does not. In linear time: shlex builds a word a character at a time
    (quadratic: one word of 900,000 characters took 44 s)."""
    words: list[str] = []
    parts: list[str] = []
    started = False
    at = 0
    while at < len(line):
        if not started and line[at] == "#":
            break
        match = _WORD_PART.match(line, at)
        if match is None:
            return None  # a quote with no end
        single, double, escaped, plain, space = match.groups()
        if space is not None:
            if started:
                words.append("".join(parts))
                parts, started = [], False
        else:
            started = True
            parts.append(single if single is not None else
                         _DOUBLE_QUOTED_ESCAPE.sub(r"\1", double) if double is not None else
                         escaped if escaped is not None else plain)
        at = match.end()
    if started:
        words.append("".join(parts))
    return words


def _substitute(word: str, variables: dict[str, str], src: str, key: str) -> str:
    def one(match: re.Match) -> str:
        name = match.group(1) or match.group(3)
        if name in variables:
            return variables[name]
        if match.group(2) is not None:
            return match.group(2)
        return match.group(0)

    length = len(word) + sum(len(variables.get(m.group(1) or m.group(3), "")) for m in _REFERENCE.finditer(word))
    if length > MAX_EXPANDED_CHARS:
        raise CaseError(src, key, f"expands past {MAX_EXPANDED_CHARS:,} characters; expected a launch script "
                                  "whose variables hold arguments")
    return _REFERENCE.sub(one, word)


# Arguments Megatron-LM stops on (megatron/training/arguments.py, validate_args: "no longer valid"),
# with what replaced them; and Megatron-DeepSpeed's own, which its parser does not know.
NO_LONGER_VALID = {"--batch-size": "--micro-batch-size", "--warmup": "--lr-warmup-fraction",
                   "--model-parallel-size": "--tensor-model-parallel-size",
                   "--checkpoint-activations": "--recompute-activations, or --recompute-granularity"}
# Arguments Megatron-LM's parser no longer defines (renamed or removed since older releases, whose
# scripts still carry them: Megatron-LM's own examples/academic_paper_scripts/sc21): argparse stops on
# them ("unrecognized arguments"), with what replaced them where something did.
NO_LONGER_DEFINED = {"--activations-checkpoint-method": "--recompute-method (with --recompute-granularity full)",
                     "--activations-checkpoint-num-layers": "--recompute-num-layers",
                     "--checkpoint-num-layers": "--recompute-num-layers",
                     "--distribute-checkpointed-activations": "--distribute-saved-activations",
                     "--DDP-impl": "nothing: Megatron-LM runs its own DistributedDataParallel (--use-torch-fsdp2 "
                                   "or --use-megatron-fsdp for the others)",
                     "--use-contiguous-buffers-in-local-ddp": "nothing: the local DDP it set up is gone"}
# Arguments that build a hybrid Mamba model (megatron/core/ssm/mamba_hybrid_layer_allocation.py), which
# pretrain_mamba.py trains: not the transformer the case describes and this reader prices
# (--hybrid-layer-pattern is --hybrid-override-pattern's name from core_v0.17.0 on).
HYBRID_MODEL = ("--hybrid-attention-ratio", "--hybrid-mlp-ratio", "--hybrid-override-pattern",
                "--hybrid-layer-pattern")
# Megatron-LM's training programs that build another model than pretrain_gpt.py's decoder-only
# transformer (Megatron-LM core_v0.16.1 to core_v0.19.0, the repository's top level; pretrain_hybrid.py,
# core_v0.18.0 on, is what pretrain_mamba.py became), and what they build.
OTHER_MODELS = {"pretrain_mamba.py": "a hybrid Mamba model", "pretrain_hybrid.py": "a hybrid Mamba model",
                "pretrain_t5.py": "an encoder-decoder T5 model",
                "pretrain_bert.py": "a BERT encoder", "pretrain_ict.py": "a retrieval (ICT) BERT model",
                "pretrain_vlm.py": "a vision-language model", "pretrain_vision_classify.py": "a vision model",
                "pretrain_vision_dino.py": "a vision model", "pretrain_vision_inpaint.py": "a vision model"}
MEGATRON_DEEPSPEED = ("--deepspeed", "--deepspeed_config", "--deepspeed-config", "--zero-stage",
                      "--num-key-value-heads", "--moe-expert-parallel-size", "--deepspeed-activation-checkpointing",
                      "--no-pipeline-parallel", "--ds-sequence-parallel-size", "--checkpoint-in-cpu")


def _refuse_what_megatron_lm_refuses(src: str, flag: str) -> None:
    """An argument Megatron-LM stops on, or one of Megatron-DeepSpeed's (a read as Megatron-LM's took
    --checkpoint-activations for no recomputation, --model-parallel-size 2 for tp 1, and left
    --moe-expert-parallel-size 64 unread), or one that builds another model than the case's (a
    hybrid Mamba model priced as 48 transformer layers), named: the launch would not start as read."""
    if flag in NO_LONGER_VALID:
        raise CaseError(src, flag, f"no longer valid in Megatron-LM, which stops on it "
                                   f"(megatron/training/arguments.py): use {NO_LONGER_VALID[flag]}")
    if flag in NO_LONGER_DEFINED:
        raise CaseError(src, flag, f"no longer defined in Megatron-LM, whose parser stops on it (unrecognized "
                                   f"arguments: the run would not start): use {NO_LONGER_DEFINED[flag]}")
    if flag in HYBRID_MODEL:
        raise CaseError(src, flag, "builds a hybrid Mamba model (pretrain_mamba.py), which diagnose does not price: "
                                   "it reads launches of pretrain_gpt.py's transformers")
    if flag in MEGATRON_DEEPSPEED:
        raise CaseError(src, flag, "a Megatron-DeepSpeed argument, which Megatron-LM's parser refuses: this "
                                   "reads Megatron-LM's launches; diagnose a Megatron-DeepSpeed run by its "
                                   "ds_config (--config, with --pp and --tp)")


def flags_of(words: Sequence[str], src: str = "", shell: bool = False) -> dict[str, Optional[str]]:
    """The last value of every flag read() knows (argparse keeps the last). ``shell``: the words
    are those bash passes (:mod:`planner.readers.bash`), so no array parentheses are left in them,
    and a word that holds a flag and its value together is the one argument argparse refuses."""
    return dict(_flags_of(tuple(words), src, shell))


@lru_cache(maxsize=4)
def _flags_of(words: tuple[str, ...], src: str, shell: bool) -> dict[str, Optional[str]]:
    known = set(INT_FLAGS) | set(STR_FLAGS) | set(BOOL_FLAGS) | set(LIST_FLAGS) | set(ALIASES)
    # Megatron-LM's own arguments: an argument list's every word, a launch's those after the
    # Python script it starts (before it, torchrun's and srun's: srun --nodes is no --nnodes).
    script_at = next((i for i, w in enumerate(words) if w.endswith(".py")), -1)
    # Whose parser takes them: an argument list's are pretrain_gpt.py's; another program (a multimodal
    # train.py) adds flags of its own, which no list here holds, so none is refused as undefined.
    gpt = script_at < 0 or Path(words[script_at]).name == GPT_PROGRAM

    def name(word: str) -> str:
        flag = word.partition("=")[0]
        flag = flag.replace("_", "-") if flag.startswith("--nproc_") else flag
        return ALIASES.get(flag, flag)

    # An argument list's words may still carry an array's parentheses: NAME=(--flag value ...).
    closes = (lambda w: False) if shell else (lambda w: w.endswith(")"))
    strip = (lambda w: w) if shell else (lambda w: w.rstrip(")"))
    # A Megatron-DeepSpeed launch is named before anything else is read: its fork's parser takes what
    # Megatron-LM's refuses (--normalization rmsnorm), so the first word read as Megatron-LM's would
    # refuse the run for a reason its own engine never gives.
    fork = next((name(w.partition("=")[0]) for w in words[script_at + 1:]
                 if name(w.partition("=")[0]) in MEGATRON_DEEPSPEED), None)
    if fork is not None:
        _refuse_what_megatron_lm_refuses(src, fork)
    found: dict[str, Optional[str]] = {}
    checked: set[str] = set()  # the other flags, each checked once
    i = 0
    while i < len(words):
        word = words[i]
        if not shell:
            if "=(" in word:  # the first element of a one-line array: NAME=(--flag value ...)
                word = word.split("=(", 1)[1]
            word = word.lstrip("(").rstrip(")")
        elif word.startswith("--") and len(word.split()) > 1 and name(word.split()[0]) in known:
            raise CaseError(src, name(word.split()[0]),
                            f"reaches the launch as the one argument {one_line(word, 60)!r}, which argparse "
                            "refuses (a quoted expansion, \"${A[@]}\" or \"$ARGS\", keeps each element one word): "
                            "expand it unquoted, ${A[@]}, as Megatron-LM's examples do")
        flag, _, inline = word.partition("=")
        flag = name(flag)
        if flag.startswith("--") and flag not in known and i > script_at and flag not in checked:
            checked.add(flag)
            if len(checked) > MAX_OTHER_FLAGS:
                raise CaseError(src, flag, f"makes more than {MAX_OTHER_FLAGS:,} different flags this reading does "
                                           f"not read: expected at most {MAX_OTHER_FLAGS:,} (Megatron-LM's parser, "
                                           f"{RELEASES}, defines {MEGATRON_LM_FLAGS} and refuses any other)")
            _refuse_what_megatron_lm_refuses(src, flag)
            _check_not_a_misspelling(src, flag, known - TORCHRUN_FLAGS)
            if gpt:
                _check_defined(src, flag)
        elif i > script_at and _ONE_DASH.fullmatch(flag) and "-" + flag in known:
            # argparse takes a one-dash word for a short option it does not define: it refuses it.
            raise CaseError(src, flag, f"is no Megatron-LM argument (one dash: did you mean -{flag}?): Megatron-LM's "
                                       "parser refuses it, and the run would not start")
        elif i > script_at and _ONE_DASH.fullmatch(flag) and gpt:
            _check_defined(src, flag)
        # In the words bash passes (not a file read word by word, whose arrays may come before the script),
        # torchrun's flags are those before the script, Megatron-LM's those after it.
        if shell and i > script_at >= 0 and flag in TORCHRUN_FLAGS:
            raise CaseError(src, flag, f"comes after {words[script_at]}, so it is that script's, not torchrun's (torchrun "
                                       "takes its flags before the script): Megatron-LM's parser does not define it "
                                       "and refuses it, and the run would not start")
        if shell and i < script_at and flag not in TORCHRUN_FLAGS:
            pass  # a launcher's (torchrun's, srun's): not Megatron-LM's
        elif flag in known:
            if flag in BOOL_FLAGS:
                if inline and i > script_at:  # argparse's store_true: "ignored explicit argument"
                    raise CaseError(src, flag, f"is a switch and takes no value, got {one_line(word, 60)!r}: "
                                               "Megatron-LM's parser refuses it, and the run would not start")
                found[flag] = None
            elif flag in LIST_FLAGS:  # its values, space-separated: the words argparse gives it
                last = len(words)  # another program's parser: up to the next option
                if i > script_at and gpt and flag in PARSER_VALUES:
                    # argparse's count (nargs '+', 3, one for --step-batch-size-schedule) and conversion of the
                    # words it gives the flag: a bare --recompute-modules stops the parser ("expected at least
                    # one argument"); past its count, or past a word the parser takes for an option, the
                    # reading reads no further (--rampup-batch-size 16 16 1000 4 gives it three).
                    end, counted = _check_parser_words(src, flag, words, i, inline if "=" in word else None,
                                                       closes, shell)
                    last = end if counted else last
                values = [inline] if inline else []
                while i + 1 < len(words) and i < last and not _is_option(strip(words[i + 1])) and not closes(words[i]):
                    values.append(strip(words[i + 1]))
                    i += 1
                found[flag] = " ".join(values)
            elif "=" in word:  # --flag=value, its value that alone (--flag= : an empty one)
                found[flag] = inline
            elif i + 1 < len(words) and not _is_option(strip(words[i + 1])):
                # argparse ends a flag's words at any option-looking word: -1e-1 is one (no negative number
                # to its _negative_number_matcher), so "--hidden-dropout -1e-1" has no value.
                found[flag] = strip(words[i + 1])
                i += 1
            elif shell and i < script_at:
                raise CaseError(src, flag, "takes a value, and none follows it: torchrun's parser refuses it "
                                           "(expected one argument), and the run would not start")
            else:
                raise CaseError(src, flag, "takes a value, and none follows it: Megatron-LM's parser refuses it "
                                           "(expected one argument), and the run would not start")
            # argparse converts and checks every occurrence, not only the last it keeps.
            _check_value(src, flag, found[flag])
            if i > script_at and not closes(words[i]) and i + 1 < len(words) and \
                    (flag not in LIST_FLAGS or (gpt and flag in PARSER_VALUES and last == i)):
                _check_not_stray(src, flag, words[i + 1], "no value" if flag in BOOL_FLAGS else _takes(flag))
        elif i > script_at and gpt and flag in PARSER_VALUES:
            # a flag the reading does not read: its words are checked as the parser converts them, and
            # what follows them is a flag or a word the parser refuses ("--weight-decay 0.1 stray")
            i, counted = _check_parser_words(src, flag, words, i, inline if "=" in word else None, closes, shell)
            if counted and not closes(words[i]) and i + 1 < len(words):
                _check_not_stray(src, flag, words[i + 1], _takes(flag))
        i += 1
    # torchrun, or its module (torch.distributed.launch, deprecated, runs the same launcher)
    if any(Path(w).name == "torchrun" or w in ("torch.distributed.run", "torch.distributed.launch")
           for w in words[:max(script_at, 0)]):
        found[TORCHRUN] = None
    return found


# What may follow a flag's value in a launch's words without being an argument of Megatron-LM's:
# a variable left unexpanded, an array's parentheses or assignment, a shell operator or redirection.
_NOT_AN_ARGUMENT = re.compile(r"^(?:[$()|&;<>\\]|\d*[<>]|[A-Za-z_][A-Za-z0-9_]*=\()")


# What argparse reads as a negative number, not an option, where the parser defines no option that looks
# like one (Megatron-LM's defines none): argparse.ArgumentParser._negative_number_matcher, Python 3.10-3.12.
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
# An option-looking word that no parser here defines (no option string starts with a digit or a dot):
# -1e-2, which argparse takes for an option, not a negative number, and refuses (unrecognized arguments).
_NUMBER_LIKE = re.compile(r"^-[\d.]")


def _takes(flag: str) -> str:
    """The words the flag takes, as its argparse nargs counts them (a flag not in PARSER_VALUES: one)."""
    nargs = PARSER_VALUES[flag].nargs if flag in PARSER_VALUES else None
    return {None: "one value", "?": "at most one value", "*": "values up to the next option",
            "+": "values up to the next option"}.get(nargs, f"{nargs} values")


def _check_not_stray(src: str, flag: str, word: str, takes: str) -> None:
    """A word after a switch, or after the words argparse gives a flag (``takes``: "no value", "one
    value", "3 values"), that is no flag: argparse takes it for a positional argument Megatron-LM's parser
    does not define ("unrecognized arguments"), so the run would not start (``--swiglu stray``,
    ``--tensor-model-parallel-size 4 8``, ``--rampup-batch-size 16 16 1000 4``, ``--swiglu -1``: a
    negative number is a positional argument to argparse, not an option); or an option no parser defines
    (``--lr 1e-3 -1e-2``: -1e-2 is no negative number to argparse's _negative_number_matcher). Another
    option is the flag the reading reads next, and checked there."""
    # A word of two dashes is an option even with a space in it ('--optimizer= adam': argparse matches
    # its flag before it looks for spaces); an option is read, and checked, as the flag it names.
    if not word or (word.startswith("-") and not _NEGATIVE_NUMBER.match(word) and not _NUMBER_LIKE.match(word)) \
            or _NOT_AN_ARGUMENT.match(word):
        return
    why = ", which argparse takes for an option (no negative number to it) that no parser defines" \
        if _is_option(word) else ""
    raise CaseError(src, flag, f"takes {takes}, but {one_line(word, 60)!r} follows it{why}: Megatron-LM's parser "
                               "refuses a word it does not take (unrecognized arguments), and the run would not start")


def _is_option(word: str) -> bool:
    """A word argparse takes for an option, which ends the words a flag takes (argparse's
    _parse_optional): it starts with '-', is more than '-', is no negative number (the parser defines
    no option that looks like one) and holds no space."""
    return word.startswith("-") and word != "-" and not _NEGATIVE_NUMBER.match(word) and " " not in word


def _check_parser_words(src: str, flag: str, words: Sequence[str], at: int, inline: Optional[str],
                        closes: Callable[[str], bool], shell: bool) -> tuple[int, bool]:
    """The words argparse gives the flag at ``words[at]`` (its inline ``--flag=value``, or those that
    follow up to the next option, as many as its nargs takes), each checked as the parser converts it;
    too few refused ("expected one argument", "expected 3 arguments"). A variable left unexpanded, a
    shell operator or an array's close ends them without a refusal (what it stands for is not known); so
    do too few words in a launch's words as bash expands them, where an unset variable ($1, the checkpoint
    path Megatron-LM's example scripts take as an argument) leaves no word. Returns the index of the last
    word taken, and whether argparse's count ends there (False where a word not known here ended them:
    what follows it may still be the flag's)."""
    spec = PARSER_VALUES[flag]
    most = {None: 1, "?": 1, "*": len(words), "+": len(words)}.get(spec.nargs)
    most = int(spec.nargs) if most is None else most
    least = {None: 1, "?": 0, "*": 0, "+": 1}.get(spec.nargs, most)
    values, ended = ([inline], True) if inline is not None else ([], False)
    i = at
    while not ended and len(values) < most and i + 1 < len(words) and not closes(words[i]):
        word = words[i + 1].rstrip(")") if closes(words[i + 1]) else words[i + 1]
        if _is_option(word):
            break
        if _NOT_AN_ARGUMENT.match(word) or "$" in word:
            return i + 1, False  # what follows is not known: nothing refused
        values.append(word)
        i += 1
    if len(values) < least and not shell and not (i + 1 < len(words) and (_NOT_AN_ARGUMENT.match(words[i + 1]) or closes(words[i]))):
        expected = "one argument" if spec.nargs is None else \
            "at least one argument" if spec.nargs == "+" else f"{spec.nargs} arguments"
        raise CaseError(src, flag, f"takes {expected}, and {len(values) or 'none'} follow{'s' if len(values) < 2 else ''} "
                                   f"it: Megatron-LM's parser refuses it (expected {expected}), and the run would not "
                                   "start")
    for value in values:
        _check_parser_value(src, flag, value)
    return i, True


def _check_value(src: str, flag: str, value: Optional[str]) -> None:
    """A value Megatron-LM's parser refuses, refused: the run would not start."""
    if value is None:
        return
    # argparse's type=int: "1e+06" or "8.0" stops Megatron-LM's parser (digits past any bound are
    # the reader's to refuse, with the bound, where it reads them).
    if flag in INT_FLAGS and not _INTEGER.fullmatch(value) and not _torchrun_word(flag, value):
        raise CaseError(src, flag, f"expected an integer, got {one_line(value, 60)!r}")
    if flag in INT_FLAGS and len(value.strip().lstrip("+-")) > 4300:
        # argparse's type=int is int(), which refuses past Python's 4,300-digit limit ("invalid int value"):
        # a flag the reader does not bound itself (--max-position-embeddings) passed with 5,000 digits.
        raise CaseError(src, flag, f"expected an integer <= {MAX_INT}, got one of {len(value.strip().lstrip('+-')):,} "
                                   "digits: Megatron-LM's parser refuses it (invalid int value), and the run would "
                                   "not start")
    if flag in PARSER_VALUES and PARSER_VALUES[flag].nargs is None:
        _check_parser_value(src, flag, value)


def _check_parser_value(src: str, flag: str, value: str) -> None:
    """A word Megatron-LM's parser refuses as the flag's value (megatron_lm_flags.txt, from its argparse
    action): int() or float() refuses it ("1.5" for an int, "abc" for a float), or it is none of the
    choices (compared after the type; argparse strips nothing and its choices are case-sensitive). A word
    that still holds a variable ($LR) is not known here, and passes."""
    spec = PARSER_VALUES[flag]
    if "$" in value or "`" in value:
        return
    convert = {"int": int, "float": float, "str": str}.get(spec.kind)
    if convert is None:
        return
    try:
        converted = convert(value)
    except ValueError:  # int() past Python's 4,300 digits too: argparse's "invalid int value"
        expected = "an integer" if spec.kind == "int" else "a number"
        raise CaseError(src, flag, f"expected {expected}, got {one_line(value, 60)!r}: Megatron-LM's parser "
                                   f"refuses it (type={spec.kind}), and the run would not start") from None
    if spec.choices and converted not in [convert(c) for c in spec.choices]:
        why = "its choices are case-sensitive" if spec.kind == "str" else f"type={spec.kind}, then its choices"
        raise CaseError(src, flag, f"expected one of {', '.join(spec.choices)}, got {one_line(value, 60)!r}: "
                                   f"Megatron-LM's parser refuses it ({why}), and the run would not start")


# What torchrun takes beside a count: --nnodes MIN:MAX (an elastic range), --nproc-per-node gpu or
# auto (a process for each GPU of the node; torch.distributed.run's determine_local_world_size).
_ELASTIC = re.compile(r"\s*\d+\s*:\s*\d+\s*")
NPROC_WORDS = ("gpu", "auto")


def torchrun_world(nnodes: Optional[str], nproc: Optional[str], gpus_per_node: int) -> Optional[int]:
    """The ranks torchrun starts: --nnodes (one node where absent) × --nproc-per-node (gpu or auto: a
    process for each of the node's GPUs); None where --nproc-per-node is absent or not a count, or
    --nnodes is an elastic range MIN:MAX (the job runs on whatever it gets)."""
    nodes, per_node = (nnodes or "1").strip(), (nproc or "").strip()
    if per_node in NPROC_WORDS:
        per_node = str(gpus_per_node)
    if not (_INTEGER.fullmatch(nodes) and _INTEGER.fullmatch(per_node)):
        return None
    return int(nodes) * int(per_node)


def _torchrun_word(flag: str, value: str) -> bool:
    return (flag == "--nnodes" and bool(_ELASTIC.fullmatch(value))) or \
        (flag == "--nproc-per-node" and value.strip() in NPROC_WORDS)


_INTEGER = re.compile(r"\s*[+-]?\d+(_\d+)*\s*")


# The option strings Megatron-LM's parser defines for pretrain_gpt.py in some release the list names
# (each release's add_megatron_arguments and the add_modelopt_args pretrain_gpt.py adds, listed from
# their ArgumentParsers' actions by bench/megatron_lm_flags.py into megatron_lm_flags.txt), those
# releases, and the most other flags an argument list may give (a list of 100,000 made-up flags kept
# diagnose busy past 30 s).
_FLAGS_FILE = Path(__file__).with_name("megatron_lm_flags.txt").read_text(encoding="utf-8").splitlines()
PARSER_FLAGS = frozenset(line.split()[0] for line in _FLAGS_FILE if line and not line.startswith("#"))


@dataclass(frozen=True)
class ParserValue:
    """What Megatron-LM's parser checks of a flag's value (a line of megatron_lm_flags.txt, from the
    argparse action itself): ``kind`` int, float or str (argparse calls int() or float() on each word)
    or value (a function of Megatron-LM's, not checked here); ``nargs`` None (one word), "?", "*", "+"
    or a count; ``choices`` where the parser holds it to some (after the type, case-sensitive)."""
    kind: str
    nargs: Optional[str]
    choices: tuple[str, ...]


def _parser_value(words: list[str]) -> ParserValue:
    nargs = next((w[len("nargs:"):] for w in words if w.startswith("nargs:")), None)
    choices = next((tuple(w[len("choice:"):].split(",")) for w in words if w.startswith("choice:")), ())
    return ParserValue(words[0], nargs, choices)


# The flags that take a value, with what the parser checks of it; a switch (nargs 0) is not here, nor a
# flag whose type or nargs differs between the releases ("any": the release run is not known).
PARSER_VALUES = {line.split()[0]: _parser_value(line.split()[1:]) for line in _FLAGS_FILE
                 if line and not line.startswith("#") and len(line.split()) > 1 and line.split()[1] != "any"}
# The choices of those the parser holds to some (the union over the releases: what any of them takes).
ARGPARSE_CHOICES = {flag: value.choices for flag, value in PARSER_VALUES.items() if value.choices}
PARSER_RELEASES = tuple(next(line.split(":", 1)[1].split() for line in _FLAGS_FILE if line.startswith("# Releases:")))
RELEASES = f"{PARSER_RELEASES[0]} to {PARSER_RELEASES[-1]}"
MEGATRON_LM_FLAGS = len(PARSER_FLAGS)
# The program whose parser PARSER_FLAGS is: another adds flags of its own (examples/multimodal/train.py).
GPT_PROGRAM = "pretrain_gpt.py"
MAX_OTHER_FLAGS = 1000
_ONE_DASH = re.compile(r"-[A-Za-z][A-Za-z0-9-]+")

# torchrun's flags that read() takes (the world size): they come before the Python script.
TORCHRUN_FLAGS = frozenset({"--nnodes", "--nproc-per-node", "--nproc_per_node"})
# Set among the flags where torchrun starts the script (its --nnodes then defaults to one node).
TORCHRUN = "torchrun"


def _check_not_a_misspelling(src: str, flag: str, known: set[str]) -> None:
    """Refuse a flag one or two letters from one read() reads: Megatron-LM's parser (argparse with
    ``allow_abbrev=False``, ``megatron/training/arguments.py``) refuses a flag it does not define, so
    the run would not start, and read without it the layout would be another (a missing tensor
    parallelism read as 1). Other unknown flags are Megatron-LM's many that do not shape the layout.
    A known flag's extension by a word is no misspelling (``--tp-comm-overlap-ag`` beside
    ``--tp-comm-overlap``), but its abbreviation is (``--tensor-model-parallel``), and so are letters
    run on to it (``--tensor-model-parallel-sizee``):
    none of the 396 flags ``arguments.py`` defines (Megatron-LM d98e8a64dd) is refused, nor any of
    megatron-core's config fields, from which it makes the rest (tests/test_megatron_flags.py), nor any
    flag a release's parser defines (PARSER_FLAGS: --megatron-fsdp-main-params-dtype, core_v0.17.0,
    beside --megatron-fsdp-main-grads-dtype)."""
    if flag in PARSER_FLAGS:
        return
    if flag.replace("_", "-") in known:  # argparse matches option strings as written
        raise CaseError(src, flag, f"is no Megatron-LM argument (did you mean {flag.replace('_', '-')}?): Megatron-LM's "
                                   "parser takes no underscores in its flags, and the run would not start")
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.9)
    # An extension adds a word (``-ag``); letters run on (--tensor-model-parallel-sizee,
    # --context-parallel-size2) are a typo the parser refuses as well.
    if close and not (flag.startswith(close[0]) and flag[len(close[0]):].startswith("-")):
        # An abbreviation too (--tensor-model-parallel for --tensor-model-parallel-size): the parser
        # takes none, and read as no flag the layout was another (tp 1).
        raise CaseError(src, flag, f"is no Megatron-LM argument (did you mean {close[0]}?): Megatron-LM's parser "
                                   "refuses it (it takes no abbreviation), and the run would not start")


# Other launchers' names for the flags that shape a layout (vLLM's, NeMo's, DeepSpeed's, torchtitan's
# shorthands; a -size or -degree ending dropped), and Megatron-LM's for them.
SHORT_NAMES = {"tp": "--tensor-model-parallel-size", "tensor-parallel": "--tensor-model-parallel-size",
               "pp": "--pipeline-model-parallel-size", "pipeline-parallel": "--pipeline-model-parallel-size",
               "cp": "--context-parallel-size", "ep": "--expert-model-parallel-size",
               "expert-parallel": "--expert-model-parallel-size", "etp": "--expert-tensor-parallel-size",
               "vpp": "--num-layers-per-virtual-pipeline-stage", "sp": "--sequence-parallel",
               "mbs": "--micro-batch-size", "micro-batch": "--micro-batch-size", "gbs": "--global-batch-size",
               "global-batch": "--global-batch-size", "seq-len": "--seq-length", "zero-stage": "--use-distributed-optimizer"}


def _check_defined(src: str, flag: str) -> None:
    """Refuse a flag Megatron-LM's parser for pretrain_gpt.py defines in none of the releases
    PARSER_FLAGS lists, naming the closest one does: argparse, with ``allow_abbrev=False`` and no
    ``ignore_unknown_args`` (parse_args in megatron/training/arguments.py), stops on it ("unrecognized
    arguments"), so the run would not start; read as absent, ``--tensor-parallel-size 2`` (vLLM's and
    NeMo's spelling) or ``--tp 2`` was priced as tp 1. A flag one release defines and another lacks
    is taken (the release run is not known); so are the flags pretrain_gpt.py adds with nvidia-modelopt
    installed (add_modelopt_args). Only pretrain_gpt.py's launches (and argument lists) are checked:
    another program adds its own flags."""
    if flag in PARSER_FLAGS:
        return
    short = re.sub(r"-(size|degree)$", "", flag.lstrip("-").lower().replace("_", "-"))
    close = [SHORT_NAMES[short]] if short in SHORT_NAMES else \
        difflib.get_close_matches(flag, PARSER_FLAGS, n=1, cutoff=0.7)
    hint = f"; the closest: {close[0]}" if close else ""
    raise CaseError(src, flag, f"is no Megatron-LM argument ({RELEASES} define none such{hint}): pretrain_gpt.py's "
                               "parser refuses a flag it does not define (unrecognized arguments), and the run would "
                               "not start; expected one of its flags")


# How launch.sh (ours, and scripts written like it) takes its arguments from a file beside it.
_INCLUDED_ARGS = re.compile(r"""\$\(\s*grep\s+-v\s+(['"])\^#\1\s+"?\$\{?HERE\}?/([A-Za-z0-9_.-]+)"?\s*\)""")


def with_included_args(text: str, path: Path) -> str:
    """``text`` with each ``$(grep -v '^#' "$HERE/FILE")`` replaced by FILE's lines (FILE beside ``path``)."""
    included = []
    for match in _INCLUDED_ARGS.finditer(text):
        included.append(read_text(path.parent / match.group(2)))
    if not included:
        return text
    return "\n".join([_INCLUDED_ARGS.sub(" ", text), *included])


# The same command, inside the $( ) the bash reader hands over: FILE beside the script, from any
# directory variable ($HERE, ${SCRIPT_DIR}...).
_INCLUDED_COMMAND = re.compile(r"""\s*grep\s+-v\s+(['"])\^#\1\s+"?\$\{?[A-Za-z_][A-Za-z0-9_]*\}?/"""
                               r"""([A-Za-z0-9_.-]+)"?\s*""")


def _included(command: str, path: Path) -> Optional[str]:
    """The output of ``grep -v '^#' "$HERE/FILE"`` (FILE beside ``path``), read, not run; None for
    any other command."""
    match = _INCLUDED_COMMAND.fullmatch(command)
    if match is None:
        return None
    lines = read_text(path.parent / match.group(2)).splitlines()
    return "\n".join(line for line in lines if not line.startswith("#"))


def is_argument_list(text: str, also: Callable[[str], bool] = lambda line: False) -> bool:
    """An argument list (every line, comments aside, a flag or flags, or the one word of a value after
    a line that ends in a flag: a list written a word a line; or a line ``also`` takes, torchtitan's
    checkpointing subcommand), not a script: read word by word as launch.sh passes it (a layout's
    unquoted ``|`` is no pipe there)."""
    after_flag = False
    for line in (raw.strip() for raw in text.splitlines()):
        if not line or line.startswith("#"):
            continue
        if not line.startswith("-") and not also(line) and not (after_flag and len(line.split()) == 1):
            return False
        after_flag = line.startswith("-") and line.split()[-1].startswith("--")
    return True


@dataclass(frozen=True)
class _Launch:
    """What a file gives pretrain_gpt.py: its words, and what reading them assumed."""
    src: str
    words: list
    shell: bool = False  # the words bash passes (planner.readers.bash), not an argument list's
    notes: tuple = ()  # bash.Note: the branches taken on what the script does not set
    unset: tuple = ()  # variables the launch's words read that nothing set
    started: bool = True  # the script starts a command at all
    defaulted: tuple = ()  # (NAME, default): unset variables read as their ${X:-default}
    # (NAME, value, decided, conditional): what the script puts in the training launch's environment; value None: a name
    # it unsets (unset NAME, env -u NAME), decidedly not in it; NAME EMPTIED: env -i, nothing before it
    # reaches the launch (read with :func:`environment_value`)
    environment: tuple = ()

    def explain(self, error: CaseError) -> CaseError:
        """``error`` with what the reading assumed that bears on it (the branches between
        arguments this reader reads, the variables read as empty)."""
        read = set(INT_FLAGS) | set(STR_FLAGS) | set(BOOL_FLAGS) | set(LIST_FLAGS) | set(ALIASES)
        said = []
        # The defaults the refused flag's value may have come from (NNODES=${SLURM_NNODES:-1}, then --nnodes
        # $NNODES): those whose value it is.
        value = self.value_of(error.key)
        taken = [f"{name}: read as its default {default!r}" for name, default in self.defaulted if default == value]
        if taken:
            said.append(f"the script leaves unset {'; '.join(taken[:3])}")
        # bash sets these itself as it starts (PWD, HOME, ...): read as empty all the same (the reader
        # runs nothing), but not "as bash does"
        own = [name for name in self.unset if name in BASH_SETS]
        unset = [name for name in self.unset if name not in BASH_SETS]
        if unset:
            said.append(f"the script leaves {', '.join(unset[:5])} unset: read as empty, as bash does")
        if own:
            said.append(f"{', '.join(own[:5])}, which bash sets as it runs, read as empty (nothing is run)")
        if not self.started:
            said.append("the script starts no command, so nothing reaches pretrain_gpt.py")
        # Where nothing was started, what the reading did not follow (a sourced file, an eval) may hold
        # the launch: every note bears on it.
        said += [note.text[len(self.src) + 2:] if note.text.startswith(self.src + ": ") else note.text
                 for note in self.notes if note.flags is None or read & set(note.flags) or not self.started]
        if not said:
            return error
        return CaseError(error.source, error.key, f"{error.expected} ({'; '.join(said)})")

    def value_of(self, flag: str) -> Optional[str]:
        """The last value the launch's words give ``flag`` (``--flag value`` or ``--flag=value``)."""
        found = None
        for i, word in enumerate(self.words):
            name, eq, inline = word.partition("=")
            if name.replace("_", "-") == flag:
                found = inline if eq else (self.words[i + 1] if i + 1 < len(self.words) else None)
        return found


def launch_of(path: Path, text: str) -> _Launch:
    """The words a Megatron-LM argument list or launch script gives pretrain_gpt.py: an argument
    list word by word; a script as bash would expand it (planner.readers.bash), its launch being
    the commands that start a Python script (torchrun ... pretrain_gpt.py), else every command.
    Read once for the several readings of one diagnose (195,000 words took 8 s, read four times)."""
    return _launch_of(Path(path), text)


@lru_cache(maxsize=4)
def _launch_of(path: Path, text: str) -> _Launch:
    src = str(path)
    if is_argument_list(text):
        return _Launch(src, _tokens(text, src))
    # A functional test's model_config.yaml: read line by line, its `--flag: value` lines would be
    # no flag argparse takes, and the run's --micro-batch-size and layout would be lost.
    test = functional_test_launch(text, src)
    if test is not None:
        words, environment, notes = test
        return _Launch(src, words, shell=True, environment=environment,
                       notes=tuple(bash.Note(note, None) for note in notes))
    if "\r\n" in text:
        line = text[:text.index("\r\n")].count("\n") + 1
        raise CaseError(src, f"line {line}", "has Windows (CRLF) line endings: bash reads each line's carriage return "
                                             "as part of its last word, and a \\ before one continues no line (the "
                                             "flags on the lines after it run as commands of their own), so the launch "
                                             "would not run as written; expected Unix (LF) line endings (dos2unix)")
    try:
        script = bash.read_script(text, src, lambda command: _included(command, path))
    except (bash.ScriptLimit, bash.ScriptUnfollowed) as error:
        suffix = "; expected a launch script whose variables hold arguments" if "expands past" in error.message else ""
        raise CaseError(src, error.key, error.message + suffix) from None
    except bash.ScriptSyntax as error:  # what bash (or this reader) cannot parse: word by word, as before
        note = bash.Note(f"{src}: {error.key}: {error.message}: read word by word, not as bash would", None)
        return _Launch(src, _tokens(with_included_args(text, path), src), notes=(note,))
    programs = [c for c in script.commands if _program(c) is not None]
    if script.commands and not programs and "<<" in text:
        # A here-document another command than sbatch, bash or sh takes (cat <<EOF > job.sh) is not
        # followed: the commands the script does start would be read as the launch, their words as flags.
        raise CaseError(src, "", "starts no Python program (" + ", ".join(
            dict.fromkeys(c.fields[0] for c in script.commands[:4])) + "), and a here-document fed to another "
                                 "command than sbatch, bash or sh (cat <<EOF > job.sh, say) is not followed: give "
                                 "the script it writes, or the arguments it passes to pretrain_gpt.py")
    # The training launch: the first program named like Megatron-LM's (pretrain_gpt.py and kin),
    # else the first Python program; a script may also run an evaluation or a conversion after it,
    # whose flags argparse in the training never sees.
    training = next((c for c in programs if Path(_program(c)).name.startswith("pretrain")), None) \
        or (programs[0] if programs else None)
    if training is not None and Path(_program(training)).name in OTHER_MODELS:
        name = Path(_program(training)).name
        raise CaseError(src, name, f"line {training.line}: trains {OTHER_MODELS[name]}, which diagnose does not "
                                   "price: it reads launches of pretrain_gpt.py's decoder-only transformers")
    launches = [training] if training is not None else script.commands
    notes = list(script.notes)
    if training is not None and Path(_program(training)).name != GPT_PROGRAM:
        notes.append(bash.Note(f"{src}: line {training.line}: {_program(training)} is not Megatron-LM's "
                               f"{GPT_PROGRAM}: its parser is not known here, so a flag Megatron-LM's does not "
                               "define is not refused (it may be that program's own)", None))
    others = [c for c in programs if c is not training]
    if others:
        notes.append(bash.Note(f"{src}: line {training.line}: the training launch read is {_program(training)}'s; "
                               f"the script also runs " + ", ".join(f"{_program(c)} (line {c.line})" for c in others[:3])
                               + ", whose flags are not the training's", None))
    for c in launches:
        for substitution in c.not_run:
            if substitution.startswith("BASH_REMATCH"):
                notes.append(bash.Note(f"{src}: line {c.line}: {substitution}: the [[ =~ ]] that sets it is not "
                                       "decided without running bash, so BASH_REMATCH is read as empty", None))
                continue
            notes.append(bash.Note(f"{src}: line {c.line}: {substitution} is not run: " + (
                "read as the file name bash gives it (/dev/fd/63), whose content is not known"
                if substitution.startswith(("<(", ">(")) else
                "its output is read as empty, so the flags it would give are not read"), None))
    unset = tuple(dict.fromkeys(name for c in launches for name in c.unset))
    defaulted = tuple(dict.fromkeys(what for c in launches for what in c.defaulted))
    return _Launch(src, [w for c in launches for w in c.fields], True, tuple(notes), unset,
                   bool(script.commands), defaulted, _environment(training) if training is not None else ())


# The name of the environment entry env -i leaves: every variable before it is out of the launch's
# environment, the caller's too (no name can be listed for those).
EMPTIED = bash.EMPTIED


def environment_value(environment: tuple, name: str) -> Optional[tuple[Optional[str], bool, bool]]:
    """(value, decided, conditional) of ``name`` in a launch's environment as the script leaves it (value None:
    decidedly not there: unset, env -u, env -i, an array; conditional: the script set it without export, so
    it holds the value where the caller's environment exported the name and is absent where not), None where
    the script says nothing of it (the caller's decides)."""
    return next(((value, decided, conditional) for held, value, decided, conditional in reversed(environment)
                 if held in (name, EMPTIED)), None)


def _environment(command) -> tuple:
    """(NAME, value, decided) of what a started command's environment holds from the script: what bash
    passes it (the exported variables, its NAME=value prefixes) as env(1) changes it on the way, through
    the commands that start another (``exec env -u CUDA_DEVICE_MAX_CONNECTIONS torchrun ...``): the bash
    reader's (planner/readers/bash/commands.py, started_environment)."""
    return tuple(command.environment)


def _program(command) -> Optional[str]:
    """The Python program a command starts (``torchrun ... pretrain_gpt.py``), or None."""
    return next((f for f in command.fields if f.endswith(".py")), None)


# Variables bash (or the login that starts it) sets in every script, which the reader leaves empty.
BASH_SETS = bash.BASH_SETS


def launch_notes(path: Path) -> list[str]:
    """What reading the launch script at ``path`` assumed: each branch it took on a variable the
    script does not set (from the environment or the command line), or on what it cannot decide
    without running anything (a file test). Empty for an argument list."""
    path = Path(path)
    return [note.text for note in launch_of(path, read_text(path)).notes]


# A NeMo (Hydra) config: its top-level sections, which no argument list or launch script has.
NEMO_SECTIONS = re.compile(r"^(trainer|exp_manager)\s*:", re.MULTILINE)
