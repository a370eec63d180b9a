"""`diagnose --megatron-args SCRIPT` reads a launch script as bash would expand it, without running
anything (planner/readers/bash/): arrays built up in conditionals, ``${X:-default}``, quoting and
word splitting. A branch taken on what the script does not set (the environment, ``$1``) is said in
a note; real bash, run here on small scripts, is the oracle for the words."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

import pytest
import yaml

from cli_in_process import run_cli
from planner.diagnose import diagnose
from planner.engines.megatron.launch import environment_value
from planner.errors import CaseError
from planner.readers.bash import ScriptSyntax, read_script

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="no bash to compare with")

CASE = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        "training": {"global_batch_size": 128, "seq_len": 4096}}
FP8 = {**CASE, "training": {**CASE["training"], "precision": "fp8", "fp8_recipe": "delayed"}}
BF16 = {**CASE, "training": {**CASE["training"], "precision": "bf16"}}

# The issue's script, with the arrays it leaves out. Megatron-LM's own examples (e.g.
# examples/llama/train_llama3_8b_h100_fp8.sh) write "--fp8-format hybrid" as one element and expand
# the array unquoted, ${DTYPE_ARGS[@]}, so that bash splits it into the flag and its value.
SCRIPT = """#!/bin/bash
DTYPE=${DTYPE:-fp8}
DTYPE_ARGS=("--bf16")
if [[ "$DTYPE" == "fp8" ]]; then
    DTYPE_ARGS+=("--fp8-format hybrid" "--fp8-amax-history-len 1024")
fi
DISTRIBUTED_ARGS=(
    --nproc_per_node 8   # one node
    --nnodes 1
)
MODEL_ARGS=(
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \\
    --ffn-hidden-size 14336 --swiglu --group-query-attention --num-query-groups 8 \\
    --untie-embeddings-and-output-weights --seq-length 4096 --attention-dropout 0.0 --hidden-dropout 0.0
)
DDP_ARGS=(--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 128)
TRAINING_ARGS+=("${DDP_ARGS[@]}")
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${MODEL_ARGS[@]} "${TRAINING_ARGS[@]}" ${DTYPE_ARGS[@]}
"""
# The same flags written one word each, which a quoted "${DTYPE_ARGS[@]}" passes as they are.
ONE_WORD_EACH = SCRIPT.replace('DTYPE_ARGS+=("--fp8-format hybrid" "--fp8-amax-history-len 1024")',
                               "DTYPE_ARGS+=(--fp8-format hybrid --fp8-amax-history-len 1024)") \
    .replace("${DTYPE_ARGS[@]}\n", '"${DTYPE_ARGS[@]}"\n')
# As Megatron-LM's example has it: --bf16 among the training arguments, the fp8 ones added to it
# (Transformer Engine runs the GEMMs in fp8 within bf16 training). Read word by word, this was bf16.
EXAMPLE = SCRIPT.replace('DTYPE_ARGS=("--bf16")', "DTYPE_ARGS=()") \
    .replace("TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 128)",
             "TRAINING_ARGS=(\n    --micro-batch-size 1\n    --global-batch-size 128\n    --bf16\n)")
VARIANTS = pytest.mark.parametrize("script", [SCRIPT, ONE_WORD_EACH, EXAMPLE],
                                   ids=["issue", "one-word-each", "megatron-example"])


def files(tmp_path: Path, script: str, case: dict) -> tuple[Path, Path]:
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    (tmp_path / "train.sh").write_text(script)
    return tmp_path / "case.yaml", tmp_path / "train.sh"


def launched(script: str) -> list[str]:
    """The words the reader gives torchrun."""
    return [w for c in read_script(script, "train.sh").commands if c.fields[0] == "torchrun" for w in c.fields[1:]]


def bash_words(tmp_path: Path, script: str) -> list[list[str]]:
    """What real bash passes each torchrun of ``script`` (a stand-in function that prints its
    arguments on fd 3, the script's own output going to stderr), with an environment that sets
    none of the script's variables and no arguments."""
    path = tmp_path / "oracle.sh"
    path.write_text(script)
    run = subprocess.run(["env", "-i", f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}", BASH, "-c",
                          'torchrun() { { printf "%s\\0" "$#" "$@"; printf "\\1"; } >&3; }; export -f torchrun; '
                          'exec bash "$0" 3>&1 1>&2',
                          str(path)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    calls = [call.split("\0")[:-1] for call in run.stdout.split("\1")[:-1]]
    assert all(int(call[0]) == len(call) - 1 for call in calls), calls
    return [call[1:] for call in calls]


@VARIANTS
def test_flags_appended_in_a_conditional_are_read(tmp_path, script):
    """The fp8 flags appended inside ``if [[ "$DTYPE" == "fp8" ]]``, and the DDP flags appended
    from another array, reach pretrain_gpt.py: the script trains in fp8 and is not refused
    against an fp8 case (read word by word, Megatron-LM's example read as bf16, and was)."""
    words = launched(script)
    assert words[words.index("--fp8-format") + 1] == "hybrid"
    assert words[words.index("--fp8-amax-history-len") + 1] == "1024"
    assert "--overlap-grad-reduce" in words and "--use-distributed-optimizer" in words
    case, args = files(tmp_path, script, FP8)
    result = diagnose(case, megatron_args=args)
    assert result.estimate.job.training.precision == "fp8"
    layout = result.estimate.job.layout
    assert (layout.dp, layout.tp, layout.micro_batch_size, layout.zero_stage) == (8, 1, 1, 1)
    # DTYPE comes from the environment, read with its default: the note says which branch ran.
    assert any('if [[ "$DTYPE" == "fp8" ]] is true' in note and "DTYPE is not set by the script" in note
               and "takes its then branch" in note for note in result.notes), result.notes


@needs_bash
@VARIANTS
def test_the_issue_script_reads_as_bash_runs_it(tmp_path, script):
    assert [launched(script)] == bash_words(tmp_path, script)


def test_a_quoted_array_passes_flag_and_value_as_one_argument_which_argparse_refuses(tmp_path):
    """Quoted, "${DTYPE_ARGS[@]}" keeps the element "--fp8-format hybrid" one word: argparse takes a
    word with a space for a positional and Megatron-LM stops on it, so the launch is refused
    naming the flag rather than read as bf16."""
    case, args = files(tmp_path, SCRIPT.replace("${DTYPE_ARGS[@]}\n", '"${DTYPE_ARGS[@]}"\n'), FP8)
    assert "--fp8-format hybrid" in launched(args.read_text())
    with pytest.raises(CaseError, match=r"train.sh: --fp8-format: reaches the launch as the one argument "
                                        r"'--fp8-format hybrid', which argparse refuses"):
        diagnose(case, megatron_args=args)


def test_a_default_that_skips_the_branch_is_said(tmp_path):
    """``DTYPE=${DTYPE:-bf16}``: the fp8 branch does not run, the launch trains in bf16, and the note
    names the condition and the branch taken; against an fp8 case the refusal says why."""
    script = SCRIPT.replace("DTYPE=${DTYPE:-fp8}", "DTYPE=${DTYPE:-bf16}")
    words = launched(script)
    assert "--fp8-format" not in words and "--bf16" in words
    case, args = files(tmp_path, script, BF16)
    result = diagnose(case, megatron_args=args)
    assert result.estimate.job.training.precision == "bf16"
    assert result.notes == (f"{args}: line 4: if [[ \"$DTYPE\" == \"fp8\" ]] is false (DTYPE is not set by the "
                            "script: read as its default 'bf16'), so the script skips its then branch (no branch "
                            "of this if runs)",)
    assert json.loads(json.dumps(result.to_dict()))["notes"] == list(result.notes)
    case, args = files(tmp_path, script, FP8)
    with pytest.raises(CaseError) as error:
        diagnose(case, megatron_args=args)
    message = str(error.value)
    assert message.startswith(f"{args}: --bf16: trains in bf16, but the case's precision is fp8 (line 4: if [[")
    assert "DTYPE is not set by the script: read as its default 'bf16'" in message


def test_a_condition_on_an_unset_variable_takes_the_unset_branch(tmp_path):
    """``[ -n "$USE_FP8" ]`` with USE_FP8 from the environment: bash with it unset takes the else
    branch, and so does the reader, saying so."""
    script = SCRIPT.replace('if [[ "$DTYPE" == "fp8" ]]; then', 'if [ -n "$USE_FP8" ]; then') \
        .replace('DTYPE_ARGS=("--bf16")', "DTYPE_ARGS=()") \
        .replace("\nfi\n", "\nelse\n    DTYPE_ARGS+=(--bf16)\nfi\n", 1)
    words = launched(script)
    assert "--bf16" in words and "--fp8-format" not in words
    case, args = files(tmp_path, script, BF16)
    result = diagnose(case, megatron_args=args)
    assert result.notes == (f'{args}: line 4: if [ -n "$USE_FP8" ] is false (USE_FP8 is not set by the script: '
                            "read as empty), so the script takes its else branch",)


@needs_bash
def test_quoted_array_elements_stay_whole_and_unquoted_ones_split_as_in_bash(tmp_path):
    script = ('A=("--fp8-format hybrid" --bf16 "")\n'
              'torchrun "${A[@]}"\n'
              "torchrun ${A[@]}\n"
              'torchrun "${A[*]}" x"${A[@]}"y\n')
    words = [list(c.fields[1:]) for c in read_script(script, "a.sh").commands]
    assert words[0] == ["--fp8-format hybrid", "--bf16", ""]
    assert words[1] == ["--fp8-format", "hybrid", "--bf16"]
    assert words == bash_words(tmp_path, script)


# Small scripts whose torchrun words the reader must give as bash does.
AS_BASH = [
    'E=(); torchrun "${E[@]}" "" "$U" $U "${U:-d e}" ${U:-d e} ${U:-"d e"} "${#E[@]}"',
    'X=1; X+=2; A=(1); A+=(2 3); torchrun $X "${A[@]}" ${#A[@]} ${A[1]} ${A[-1]} ${A}',
    'S=" a  b "; torchrun x${S}y "x${S}y" $S',
    'P=/a/b/c.tar.gz; torchrun ${P##*/} ${P#*/} ${P%.*} ${P%%.*} ${P/a/Z} ${P//[ab]/-} ${P:1:3} ${P: -3} ${P^^} ${#P}',
    'N=3; M=$((N*4+1)); ((N++)); let "K = N << 2"; torchrun $M $N $K $((10/3)) $((-7%3)) $((2**10)) $((N>2?1:0))',
    'V=fp8\nif [[ $V == fp* ]]; then torchrun glob; fi\nif [ "$V" = "fp*" ]; then torchrun no; else torchrun lit; fi',
    'case ${M:-7b} in\n  7b|8b) T=1;;\n  70b) T=8;;\n  *) T=0;;\nesac\ntorchrun $T',
    'f() { torchrun "$@" $# "$1"; }\nf "a b" c',
    'for x in 1 "2 3"; do torchrun $x; done; i=0; while [ $i -lt 2 ]; do torchrun w$i; i=$((i+1)); done',
    'X=${Y:=def}; torchrun $X $Y ${Z:+alt} ${X:+alt} ${Z-dash} "${Z-}"',
    "A=$'a\\tb'; torchrun \"$A\" 'sq $X' \"dq \\$X \\\\ \\\"\" a\\ b",
    'export FOO=bar\nbash -c "torchrun \\$FOO \\$0 \\$1" zero one',
    'cat <<EOF > /dev/null\ntorchrun inside a here-document\nEOF\ntorchrun after',
    '[[ -z "$X" ]] && torchrun empty || torchrun full\n[ -n $X ] && torchrun unquoted-n-is-true',
    'A=(x\n # a comment\n  y # another\n  "z w")\ntorchrun "${A[@]}"',
    'X=a; { X=b; }; (X=c); torchrun $X; set -- p q r; shift; torchrun "$@" $#',
    'if false; then torchrun 1; elif true; then torchrun 2; else torchrun 3; fi',
    'cd / || exit 1; echo "fine"; M=${MODEL:-llama}; [[ "$M" == "llama" ]] || { echo bad; exit 1; }; '
    'torchrun good',
    'if [[ -n "${SLURM_JOB_ID:-}" ]]; then N=$SLURM_NNODES; else N=1; fi; torchrun --nnodes $N',
    'X=b\ncase $X in\n a) torchrun a;;\n b) torchrun b;&\n c) torchrun c;;\nesac',
    'torchrun --a=1 \\\n  --b 2 \\\n  x; echo done; exit 0; torchrun never',
    'N="a b"\nX=$((N+1)); torchrun abandoned-with-its-line\ntorchrun next-line',
    'N="a b"\n(( N > 1 )) || torchrun status-1; let "M = N" || torchrun let-1; [[ $N -eq 1 ]] || torchrun test-1',
    # a function's local (and declare) hid the global only inside the call: read as tp 4 after it
    'TP=8; f() { local TP=4; torchrun in$TP; }; f; torchrun out$TP',
    'f() { declare D=1; local U; U=x; G=2; }; U=u; f; torchrun "${D-unset}" $G $U',
    # printf -v set nothing ("expected an integer, got ''"); ${!name} read as empty
    "printf -v TP '%d' 8; printf -v S 'a%sb%%' x y; torchrun $TP $S",
    'TP8=8; which=TP8; torchrun ${!which} "${!which}"',
    # read otherwise than bash: the script's IFS, printf's %d of hex, octal and a character, declare -i
    'S="2,4"; IFS=,; set -- $S; torchrun $1 x$2\nIFS=; S="a b"; torchrun $S',
    "printf -v TP '%d' 0x2; printf -v Q '%d' \"'2\"; printf -v R '%d' 010; torchrun $TP $Q $R",
    'declare -i TP; TP=1+1; declare -i N=2*4; torchrun $TP $N',
    # ${!...} beyond ${!name}: read as empty with nothing said
    'P=Q; A=(--sp); R="A[@]"; B=(4 2); S="B[1]"; torchrun ${!P:-"--dflt"} ${!R} ${!S}',
    'A=(a b); TP_A=1; TP_B=2; set -- x y; P=1; torchrun ${!A[@]} ${!TP_*} ${!P}',
    # declare -g under a local, local outside a function, printf's other forms
    'TP=8; f() { local TP=4; declare -g TP=2; torchrun in$TP; }; f; torchrun out$TP\nQ=2; local Q=4; torchrun $Q',
    "printf -v A '%d' 0x10; printf -v B '%d' 08; printf -v C '%d' 8abc; printf -v D -- %d 8; "
    "printf -v E 'a\\\\b'; Z=(1 2); printf -v 'Z[1]' %d 9; torchrun $A $B $C $D \"$E\" ${Z[1]}",
    # a subscript or a substring's offset that holds $ (refused as "fails in bash"); an element in arithmetic
    'A=(1 2 4 8); I=2; X=1248; O=2; torchrun ${A[$I]} ${A[${I}]} ${A[$((I+1))]} ${X:$O:1} $(( A[1] * 2 ))\n'
    'A[$I]=9; (( A[0] += 5 )); torchrun "${A[@]}"',
    # a subshell's stated exit status; declare -u, -l, and -i's +=; "$*" joined by IFS; ${@:N}; $'\xHH'
    '(exit 1) || torchrun sub-1; (exit 0) && torchrun sub-0; (exit 256) && torchrun sub-256',
    'declare -u U=h100; declare -l L=H100; declare -i N=2; N+=2; U+=x; torchrun $U $L $N',
    'set -- 4 2; IFS=-; X="$*"; IFS=; Y="$*"; unset IFS; torchrun $X $Y ${@:2} "${@:1:1}"',
    "torchrun $'\\x34' $'\\101' $'a\\qb'",
    # exit -1 and exit with a word fail (255, 2); offsets before the start give nothing; A[-1] from the end;
    # declare -ul applies neither case
    'TP=2; (exit -1) || TP=4; (exit abc) || Q=5; torchrun $TP $Q',
    'set -- x y z; torchrun "${@: -9}" c; A=(a b c); torchrun "${A[@]: -4}" d; X=abc; torchrun "[${X: -10}]"',
    'TP=(1 2); (( TP[-1]++ )); torchrun ${TP[-1]}; TP[-1]=9; TP[-5]=7; torchrun "${TP[@]}"',
    'declare -ul U=AbC; declare -lu V=AbC; torchrun $U $V',
    # process substitution: a word (the pipe's file name), not a redirection without its file; the if after
    # it was read word by word, its else branch's TP=8 winning
    'exec > >(cat) 2>&1\nif [ "${SMALL:-1}" = 1 ]; then\n  TP=2\nelse\n  TP=8\nfi\ntorchrun --tp $TP',
    'mapfile -t L < <(echo 8); TP=2; torchrun $TP\ncat <(echo hi) > >(cat); torchrun after',
    'torchrun a<(true)b; torchrun 2>(true) "<(q)" \'>(q)\'; A=(<(true) x); torchrun "${A[@]}"',
    # [[ =~ ]] on what the script sets: the POSIX regular expression, where it was "cannot be decided"
    # and read as false (tp 8 where bash runs tp 2)
    'M=llama; if [[ $M =~ ^lla ]]; then TP=2; else TP=8; fi; torchrun $TP',
    're="^(a|b) c$"; [[ "a c" =~ $re ]] && torchrun 1; [[ "a c" =~ ^(a|b)\\ c$ ]] && torchrun 2\n'
    '[[ x.y =~ x"."y ]] && torchrun 3; [[ xzy =~ x"."y ]] || torchrun 4; [[ xzy =~ x.y ]] && torchrun 5',
    '[[ ab =~ ( a|b ) ]] || torchrun 6; [[ h100 =~ ^[[:alpha:]][[:digit:]]+$ ]] && torchrun 7\n'
    '[[ "a\\b" =~ [\\] ]] && torchrun 8; [[ $\'a\\n\' =~ a$ ]] || torchrun 9; [[ $\'a\\nb\' =~ a.b ]] && torchrun 10',
    '[[ 70b =~ ^([0-9]+)b$ && x =~ y ]] || torchrun 11; [[ ab =~ a{2} ]] || torchrun 12; [[ aab =~ a{2}b ]] && torchrun 13\n'
    '[[ a-b =~ ^[a-c-]+$ ]] && torchrun 14; [[ "]" =~ []] ]] && torchrun 15; [[ ab =~ ^[^b]b ]] && torchrun 16\n'
    'P="l+a"; [[ "llama" =~ $P ]] && torchrun 17; [[ "l+a" =~ "$P" ]] && torchrun 18; [[ lla =~ "$P" ]] || torchrun 19',
    '[[ a1 =~ ^(a)\\1$ ]] && torchrun 20; [[ a.b =~ a\\.b ]] && torchrun 21; [[ axb =~ a\\.b ]] || torchrun 22',
    # what regcomp refuses (not re): the test is false, status 2, and BASH_REMATCH kept; [[:word:]] is no class
    'RUN=llama_run; [[ $RUN =~ [[:word:]]+ ]] && torchrun 1; [[ $RUN =~ [[:word:]]+ ]] || torchrun 2\n'
    '[[ x70 =~ ([0-9]+) ]]; [[ - =~ [[:digit:]-z] ]] || torchrun 3 "${BASH_REMATCH[@]}"\n'
    '[[ b =~ [a-c-e] ]] || torchrun 4 "${BASH_REMATCH[@]}"; [[ a-b =~ ^[a-c-]+$ ]] && torchrun 5',
    # BASH_REMATCH: the match and its groups (an empty one ""), emptied where nothing matches
    'MODEL=llama3-70b; [[ $MODEL =~ -([0-9]+)b$ ]]; SIZE=${BASH_REMATCH[1]}\n'
    'torchrun $(( SIZE >= 65 ? 8 : 4 )) "${BASH_REMATCH[@]}" ${#BASH_REMATCH[@]}\n'
    '[[ xyz =~ ([0-9]) ]]; torchrun "${#BASH_REMATCH[@]}" "[${BASH_REMATCH[0]}]"\n'
    '[[ xaab =~ a(x*)(a?)ab ]]; torchrun "${BASH_REMATCH[@]}"; [[ aab =~ a?ab ]]; torchrun "${BASH_REMATCH[@]}"\n'
    '[[ abc =~ ^((a)(b))c$ ]] && torchrun "${BASH_REMATCH[@]}"; [[ $\'a\\nb\' =~ (.)$ ]] && torchrun "${BASH_REMATCH[@]}"\n'
    '[[ ab1 =~ [0-9] ]]; BASH_REMATCH=(q); torchrun "${BASH_REMATCH[@]}"',
    # shopt -s nocasematch: =~ without regard to case (in this shell only); a ) the regex did not open closes the test's
    'shopt -s nocasematch; M=llama-70b; [[ $M =~ ^LLAMA ]] && torchrun 1; [[ $M =~ ^(LL)AMA-[0-9]+([[:upper:]]+) ]]\n'
    'torchrun "${BASH_REMATCH[@]}"; (shopt -u nocasematch; [[ $M =~ ^LLAMA ]] || torchrun 2); [[ A =~ a ]] && torchrun 3\n'
    'shopt -u nocasematch; [[ $M =~ ^LLAMA ]] || torchrun 4; (shopt -s nocasematch); [[ A =~ a ]] || torchrun 5',
    # its options in one word or several (shopt -qs was missed: =~ read with regard to case)
    'shopt -qs nocasematch; [[ LLAMA =~ ^llama$ ]] && torchrun 1; shopt -q -u nocasematch; [[ A =~ a ]] || torchrun 2',
    '[[ ( x =~ a) ]] || torchrun 1; [[ ( xa =~ a) ]] && torchrun 2; [[ ( xa =~ (a)) && b =~ b ]] && torchrun 3',
]


@needs_bash
@pytest.mark.parametrize("script", AS_BASH, ids=range(len(AS_BASH)))
def test_words_are_those_bash_passes(tmp_path, script):
    script += "\n"
    got = [list(c.fields[1:]) for c in read_script(script, str(tmp_path / "oracle.sh")).commands
           if c.fields[0] == "torchrun"]
    assert got == bash_words(tmp_path, script)


def test_what_cannot_be_decided_is_read_as_the_branch_that_does_not_exit(tmp_path):
    """Megatron-LM's examples stop when pretrain_gpt.py is missing: a file test the reader cannot
    make; it reads the launch that follows, and says so."""
    script = SCRIPT.replace("torchrun", 'P=pretrain_gpt.py\nif [ ! -f "$P" ]; then\n    echo "missing"\n'
                                        "    exit 1\nfi\ntorchrun", 1)
    case, args = files(tmp_path, script, FP8)
    result = diagnose(case, megatron_args=args)
    assert result.estimate.job.training.precision == "fp8"
    assert any('if [ ! -f "$P" ] cannot be decided without running anything (a file test, -f): read as false, '
               "so the script skips its then branch" in note for note in result.notes), result.notes


def test_a_variable_left_unset_is_empty_and_the_refusal_says_so(tmp_path):
    script = SCRIPT.replace("--micro-batch-size 1", "--micro-batch-size $MBS")
    case, args = files(tmp_path, script, FP8)
    with pytest.raises(CaseError) as error:
        diagnose(case, megatron_args=args)
    # Unquoted and empty, $MBS is no word at all: argparse finds the flag without its value.
    assert str(error.value).startswith(f"{args}: --micro-batch-size: takes a value, and none follows it")
    assert "the script leaves MBS unset: read as empty, as bash does" in str(error.value)


def test_a_variable_bash_sets_itself_is_not_said_to_be_unset_as_bash_reads_it(tmp_path):
    """Megatron-LM's own scripts build paths on $PWD: every refusal said "the script leaves PWD unset:
    read as empty, as bash does", where bash always sets it."""
    script = SCRIPT.replace("--micro-batch-size 1", "--micro-batch-size $MBS --data-cache-path $PWD/cache")
    case, args = files(tmp_path, script, FP8)
    with pytest.raises(CaseError) as error:
        diagnose(case, megatron_args=args)
    assert "the script leaves MBS unset: read as empty, as bash does" in str(error.value)
    assert "PWD unset" not in str(error.value) and "PWD, which bash sets as it runs, read as empty" in str(error.value)


def test_the_notes_are_printed_in_the_report_and_in_the_json(tmp_path, monkeypatch):
    """The report ends with a line for each note, after the planner's best; stderr stays empty."""
    case, args = files(tmp_path, SCRIPT.replace("DTYPE=${DTYPE:-fp8}", "DTYPE=${DTYPE:-bf16}"), BF16)
    monkeypatch.setenv("COLUMNS", "1000")  # rich wraps a line at 80 columns off a terminal
    text = run_cli("diagnose", str(case), "--megatron-args", str(args))
    assert text.returncode == 0, text.stderr
    assert text.stderr == ""
    lines = text.stdout.strip().splitlines()
    assert lines[-1] == (f'note: {args}: line 4: if [[ "$DTYPE" == "fp8" ]] is false (DTYPE is not set by the '
                         "script: read as its default 'bf16'), so the script skips its then branch (no branch "
                         "of this if runs)")
    assert lines[-2].startswith(("predicted step ", "change: ", "planned, as the arguments train")), lines[-3:]
    as_json = run_cli("diagnose", str(case), "--megatron-args", str(args), "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["notes"][0].startswith(f"{args}: line 4: if [[")


def test_an_emitted_sbatch_script_reads_back_to_the_plan(tmp_path):
    """sbatch.sh takes its arguments from megatron_args.txt inside ${SLURM_SUBMIT_DIR:-$(...)}."""
    from planner.configs import render
    from planner.plan import plan
    from planner.engines.megatron import launch, read as megatron

    best = plan(CASE, target="megatron", top_k=0).best
    for name, text in render(best, "megatron", "<generated>")[0].items():
        (tmp_path / name).write_text(text)
    for name in ("megatron_args.txt", "launch.sh", "sbatch.sh"):
        assert megatron.read(tmp_path / name, best.case) == megatron.read(tmp_path / "megatron_args.txt", best.case)
        assert launch.launch_notes(tmp_path / name) == []


@pytest.mark.parametrize("script, key, needle", [
    ("while true; do :; done\n", "line 1", "runs past 10,000 commands"),
    ("f() { f; }\nf\n", "line 1", "calls functions past 100 levels deep"),
    ("A=(x)\nwhile true; do A=(\"${A[@]}\" \"${A[@]}\"); done\n", "A", "expands past 1,000,000 characters"),
    ("X=" + "x" * 900_000 + "\ntorchrun pretrain_gpt.py" + " ${X^^}" * 50 + "\n", "torchrun", "expands past"),
    ("Y=" + "a" * 100_000 + "\nZ=${Y%%*a*a*a*b}\n", "Y", "past the bound of 4,000,000 steps"),
    (":\n" * 600_000, "", "past the 1,000,000 a launch script is read to"),
    ("X=$((" + "(" * 5000 + "1" + ")" * 5000 + "))\n", "", "nests too deeply"),
    # each split under the bound, 10,000 of them: a hundred minutes (0.6 s a turn)
    ('A="x "; for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18; do A="$A$A"; done\nwhile :; do B=($A); done\n'
     "pretrain_gpt.py --micro-batch-size 1\n", "line 2", "expands past 5,000,000 characters in all"),
])
def test_scripts_that_would_run_without_end_are_refused_quickly(tmp_path, script, key, needle):
    case, args = files(tmp_path, script, CASE)
    start = time.monotonic()
    result = run_cli("diagnose", str(case), "--megatron-args", str(args))
    assert time.monotonic() - start < 20
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {args}: {key + ': ' if key else ''}"), lines
    assert needle in lines[0]


@pytest.mark.parametrize("opening", ["${A:-", '"${A:-'])
def test_parameter_expansions_nested_past_the_bound_are_refused_before_they_are_read(tmp_path, opening):
    """100,000 nested ${A:-...} (600 KB) took a minute to refuse, a millisecond a level: counted first."""
    levels = 100_000
    closing = "}" + ('"' if opening.startswith('"') else "")
    case, args = files(tmp_path, "X=" + opening * levels + "x" + closing * levels + "\ntorchrun pretrain_gpt.py\n", CASE)
    start = time.monotonic()
    result = run_cli("diagnose", str(case), "--megatron-args", str(args))
    assert time.monotonic() - start < 5
    assert result.returncode == 2 and "nests parameter expansions" in result.stderr and "past 100 levels" in result.stderr


def test_a_script_bash_could_not_parse_is_read_word_by_word(tmp_path):
    """An unterminated quote: as before, word by word, with a note that says so."""
    case, args = files(tmp_path, ONE_WORD_EACH + 'echo "unterminated\n', FP8)
    result = diagnose(case, megatron_args=args)
    assert result.estimate.job.training.precision == "fp8"
    line = len(ONE_WORD_EACH.splitlines()) + 1
    assert result.notes == (f"{args}: line {line}: an unterminated \" quote: read word by word, not as bash would",)


TRAIN = ("torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py --tensor-model-parallel-size 2 "
         "--pipeline-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 128 --bf16")


def test_a_script_that_also_evaluates_is_read_as_its_training_launch(tmp_path):
    """Every Python program's flags were merged, the last winning: an evaluation after the training
    (tasks/main.py at tp 1) was read as the launch's layout, with no note."""
    script = f"#!/bin/bash\n{TRAIN}\npython tasks/main.py --task LAMBADA --tensor-model-parallel-size 1 " \
             "--pipeline-model-parallel-size 1 --micro-batch-size 1 --global-batch-size 128 --bf16\n"
    case, args = files(tmp_path, script, BF16)
    result = diagnose(case, megatron_args=args)
    assert (result.estimate.job.layout.tp, result.estimate.job.layout.pp) == (2, 2)
    assert any("the training launch read is pretrain_gpt.py's; the script also runs tasks/main.py (line 3)" in n
               for n in result.notes)


@pytest.mark.parametrize("guard", ['if [ $# -lt 2 ]; then echo "usage: $0 CKPT DATA"; exit 1; fi',
                                   'DATA=$2\n[ -z "$DATA" ] && { echo "no data"; exit 1; }'])
def test_a_usage_guard_on_the_callers_arguments_is_not_taken(tmp_path, guard):
    """Read as none, the arguments made the guard exit, and nothing after it was read: the refusal
    said --micro-batch-size was missing. What the caller decides is read as the way that goes on."""
    case, args = files(tmp_path, f"#!/bin/bash\n{guard}\n{TRAIN}\n", BF16)
    result = diagnose(case, megatron_args=args)
    assert result.estimate.job.layout.tp == 2
    assert any("which the caller decides: read as false, the way that does not exit" in n for n in result.notes)


def test_a_guard_on_a_file_that_ends_the_script_is_read_as_passing_with_nothing_said(tmp_path):
    """[ -f "${MEGATRON_LM:-.}/pretrain_gpt.py" ] || { echo ...; exit 1; } (the emitted sbatch.sh's):
    the test cannot be decided without the file system, and its failure launches nothing, so the one
    reading that prices a launch is the guard passing; a note on it said nothing a user could act on."""
    guard = '[ -f "${MEGATRON_LM:-.}/pretrain_gpt.py" ] || { echo "no checkout: export MEGATRON_LM=..." >&2; exit 1; }'
    case, args = files(tmp_path, f"#!/bin/bash\n{guard}\n{TRAIN}\n", BF16)
    result = diagnose(case, megatron_args=args)
    assert result.estimate.job.layout.tp == 2
    assert not any("a file test, -f" in n for n in result.notes), result.notes


def test_a_substitution_left_unrun_and_a_torchrun_of_one_node_are_said(tmp_path):
    script = "#!/bin/bash\n" + TRAIN.replace("--tensor-model-parallel-size 2", "$(cat tp.txt)") + "\n"
    case, args = files(tmp_path, script, BF16)
    notes = diagnose(case, megatron_args=args).notes
    assert any("$(cat tp.txt) is not run: its output is read as empty, so the flags it would give are not read"
               in n for n in notes)
    case, args = files(tmp_path, "#!/bin/bash\n" + TRAIN.replace("--nnodes 1 ", ""),
                       {**BF16, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16}})
    with pytest.raises(CaseError, match="--nnodes: absent, so torchrun starts one node of 8 processes"):
        diagnose(case, megatron_args=args)


def test_what_read_would_set_is_said_not_silently_empty():
    """`read -ra PAR < par.txt` (or from a here-document) read PAR as empty with nothing said, so its
    flags went missing unannounced: the input of read is not modelled, and the launch says so (a here-string
    the script decides is read: test_read_of_a_here_string_splits_as_bash_splits_it)."""
    script = 'read -ra PAR < par.txt\ntorchrun pretrain_gpt.py ${PAR[@]}\n'
    launch = read_script(script, "r.sh").commands[0]
    assert launch.fields == ("torchrun", "pretrain_gpt.py") and launch.not_run == ("read PAR (line 1)",)


def test_a_launch_inside_a_here_document_fed_to_sbatch_is_read(tmp_path):
    """Megatron-LM's examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh launches from `sbatch <<EOF`:
    the reader merged `mkdir -p logs` and `sbatch` into the launch and refused the script for a flag
    it does set ("--mtp-num-layers: absent", or "--micro-batch-size: missing"). The here-document is
    sbatch's script, expanded as bash expands it (its quotes kept); one fed to cat is not followed."""
    launch = ("python pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
              "--micro-batch-size 1 --global-batch-size 128 --seq-length 4096 --bf16 --use-distributed-optimizer")
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump({"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
                                    "training": {"global_batch_size": 128, "seq_len": 4096, "engine": "megatron"}}))
    script = tmp_path / "sbatch.sh"
    script.write_text(f'CMD="{launch}"\nmkdir -p logs\nsbatch <<EOF\n#!/bin/bash\nsrun bash -c "${{CMD}}"\nEOF\n')
    layout = diagnose(case, megatron_args=script).estimate.job.layout
    assert (layout.tp, layout.pp, layout.micro_batch_size) == (2, 2, 1)
    quoted = tmp_path / "quoted.sh"  # a quoted delimiter: the body as written, expanded by the job's shell
    quoted.write_text(f'export CMD="{launch}"\nsbatch <<\'EOF\'\nsrun bash -c "$CMD"\nEOF\n')
    assert diagnose(case, megatron_args=quoted).estimate.job.layout.tp == 2
    # bash with options before -c, as the example runs it (srun ... bash -x -c "${TRAINING_CMD}"): it
    # was refused as a here-document fed to another command
    for shell in ("bash -x -c", "bash -lc", "bash -e -o pipefail -c", "/bin/sh -xc"):
        traced = tmp_path / "traced.sh"
        traced.write_text(f'CMD="{launch}"\nsbatch <<EOF\n#!/bin/bash\nsrun {shell} "${{CMD}}"\nEOF\n')
        assert diagnose(case, megatron_args=traced).estimate.job.layout.tp == 2, shell
    written = tmp_path / "written.sh"
    written.write_text(f'mkdir -p logs\ncat <<EOF > job.sh\n{launch}\nEOF\n')
    with pytest.raises(CaseError) as error:
        diagnose(case, megatron_args=written)
    assert error.value.key == "" and "starts no Python program (mkdir, cat)" in str(error.value)


def test_a_process_substitution_is_a_word_and_the_script_is_read_as_bash_runs_it(tmp_path):
    """`exec > >(tee -a train.log) 2>&1`, one of the commonest first lines of a launch script, made the
    reader give up ("a redirection without its file") and read the script word by word: both branches'
    TP=, the last (tp 8) winning, where bash takes tp 2, with exit 0. A process substitution in the
    launch's words is the file name bash gives its pipe, its content not known: said."""
    script = ('#!/bin/bash\nexec > >(tee -a train.log) 2>&1\nif [ "${SMALL:-1}" = 1 ]; then\n  TP=2\nelse\n  TP=8\nfi\n'
              + TRAIN.replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size $TP") + "\n")
    case, args = files(tmp_path, script, BF16)
    result = diagnose(case, megatron_args=args)
    assert result.estimate.job.layout.tp == 2
    assert not any("word by word" in note for note in result.notes), result.notes
    assert any('if [ "${SMALL:-1}" = 1 ] is true' in note for note in result.notes), result.notes
    launch = read_script("torchrun pretrain_gpt.py --data-args-path <(cat blend.txt)\n", "t.sh").commands[0]
    assert launch.fields[-1] == "/dev/fd/63" and launch.not_run == ("<(cat blend.txt)",)
    case, args = files(tmp_path, "#!/bin/bash\n" + TRAIN + " --data-args-path <(cat blend.txt)\n", BF16)
    assert any("<(cat blend.txt) is not run: read as the file name bash gives it (/dev/fd/63)" in note
               for note in diagnose(case, megatron_args=args).notes)


def test_a_regular_expression_re_would_read_otherwise_is_still_not_decided(tmp_path):
    """A back-reference (GNU's, in no POSIX ERE) or GNU's \\w are read otherwise by Python's re: such a
    test stays "cannot be decided", said, where one re reads as regcomp does is decided (bash is the
    oracle for those: test_words_are_those_bash_passes)."""
    for regex in ("^(a)\\1$", "^\\w+$", "^[[.a.]]", "^[[:word:]]+$"):  # from a variable: a backslash written in [[ ]] quotes
        script = (f"M=aa\nRE='{regex}'\nif [[ $M =~ $RE ]]; then\n  TP=8\nelse\n  TP=2\nfi\n"
                  + TRAIN.replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size $TP") + "\n")
        case, args = files(tmp_path, script, BF16)
        result = diagnose(case, megatron_args=args)
        assert any("cannot be decided without running anything (a regular expression match)" in note
                   for note in result.notes), (regex, result.notes)
    script = "M=llama\nif [[ $M =~ ^l+a ]]; then\n  TP=2\nelse\n  TP=8\nfi\n" + \
        TRAIN.replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size $TP") + "\n"
    case, args = files(tmp_path, script, BF16)
    result = diagnose(case, megatron_args=args)
    assert result.estimate.job.layout.tp == 2 and not any("regular expression" in n for n in result.notes)


def test_bash_rematch_where_the_match_is_not_worked_out_is_said_where_it_is_used(tmp_path):
    """BASH_REMATCH was never set: ``[[ $MODEL =~ -([0-9]+)b$ ]]; SIZE=${BASH_REMATCH[1]}`` priced tp 4 where
    bash runs tp 8, with nothing said (decided matches: test_words_are_those_bash_passes). Where the
    groups' spans are not worked out (an alternation: POSIX takes the longest, re the first) or the
    match is not decided, BASH_REMATCH reads as empty and the launch that uses it says so."""
    tp = "--tensor-model-parallel-size $TP"
    for test in ("[[ $MODEL =~ -(7|70)(b)$ ]]", "RE='-([0-9]+)\\w$'; [[ $MODEL =~ $RE ]]"):
        script = (f"MODEL=llama3-70b\n{test}\nSIZE=${{BASH_REMATCH[1]}}\nTP=$(( SIZE >= 65 ? 2 : 4 ))\n"
                  + TRAIN.replace("--tensor-model-parallel-size 2", tp) + "\n")
        case, args = files(tmp_path, script, BF16)
        result = diagnose(case, megatron_args=args)
        assert any("BASH_REMATCH (line 2): the [[ =~ ]] that sets it is not decided without running bash, so "
                   "BASH_REMATCH is read as empty" in note for note in result.notes), (test, result.notes)
    script = ("MODEL=llama3-70b\n[[ $MODEL =~ -([0-9]+)b$ ]]\nSIZE=${BASH_REMATCH[1]}\nTP=$(( SIZE >= 65 ? 2 : 4 ))\n"
              + TRAIN.replace("--tensor-model-parallel-size 2", tp) + "\n")
    case, args = files(tmp_path, script, BF16)
    result = diagnose(case, megatron_args=args)
    assert result.estimate.job.layout.tp == 2 and not any("BASH_REMATCH" in n for n in result.notes), result.notes


def test_a_pattern_match_under_nocasematch_is_not_decided_and_a_stray_parenthesis_is_a_syntax_error(tmp_path):
    """``shopt -s nocasematch`` makes [[ == ]] match without regard to case: read as bash without it,
    [[ A == a ]] was false with nothing said (=~ follows it: test_words_are_those_bash_passes). A ) the
    regular expression did not open, or a ( it does not close, is bash's syntax error: it was read as a
    false test."""
    script = ("shopt -s nocasematch\nM=LLAMA\nif [[ $M == llama ]]; then\n  TP=2\nelse\n  TP=4\nfi\n"
              + TRAIN.replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size $TP") + "\n")
    case, args = files(tmp_path, script, BF16)
    assert any("cannot be decided without running anything (a pattern match under shopt -s nocasematch)" in note
               for note in diagnose(case, megatron_args=args).notes)
    for test, said in (("[[ $M =~ a) ]]", "line 2: unexpected ')' in [[ ]]"),
                       ("[[ $M =~ (a ]]", "line 2: an unmatched ( in the regular expression of [[ =~ ]]")):
        case, args = files(tmp_path, f"M=a\n{test} && echo yes\n{TRAIN}\n", BF16)
        notes = diagnose(case, megatron_args=args).notes
        assert any(f"{args}: {said}" in note and "read word by word, not as bash would" in note for note in notes), notes


@pytest.mark.parametrize("choice, said", [
    ("case $M in llama) TP=2;; *) TP=4;; esac", "case $M is under shopt -s nocasematch"),
    ('N=${M/llama/x}; if [ "$N" = x ]; then TP=2; else TP=4; fi', "${M/…} is under shopt -s nocasematch")])
def test_what_nocasematch_changes_beyond_tests_is_said_where_it_reaches_the_launch(tmp_path, choice, said):
    """Under ``shopt -s nocasematch`` bash matches a case's patterns and ${X/pattern/...} without regard to
    case (tp 2 here, the reader's tp 4 or LLAMA), which the reader does not follow: it read them with
    regard to case and said nothing."""
    script = (f"shopt -s nocasematch\nM=LLAMA\n{choice}\n"
              + TRAIN.replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size $TP") + "\n")
    case, args = files(tmp_path, script, BF16)
    notes = diagnose(case, megatron_args=args).notes
    assert any(f"{said}, which is not followed here: matched with regard to case" in note for note in notes), notes


def test_input_read_by_read_or_mapfile_and_name_references_are_said():
    """`while read -r x; do TP=$x; done < tp.txt` kept TP at 1 with nothing said (the loop's body never
    runs where read has no input), `mapfile -t L < tp.txt` left L empty unannounced, and `declare -n`
    read its name as a variable of its own, silently."""
    script = ("TP=1\nwhile read -r x; do TP=$x; done < tp.txt\nmapfile -t L < tp.txt\ndeclare -n R=TP\n"
              "torchrun pretrain_gpt.py --tensor-model-parallel-size $TP ${L[@]}\n")
    result = read_script(script, "t.sh")
    notes = [n.text for n in result.notes]
    assert "t.sh: line 2: read reads input, which is not followed: x read as empty (a while-read loop's body " \
           "is not run)" in notes
    assert "t.sh: line 3: mapfile reads input, which is not followed: L read as empty" in notes
    assert "t.sh: line 4: declare -n (a name reference) is not followed: its name reads as a variable of its " \
           "own (R, not as TP)" in notes
    assert result.commands[0].not_run == ("mapfile L (line 3)",)


@pytest.mark.parametrize("torchrun", ["torchrun --nnodes 1:2 --nproc-per-node 8", "torchrun --nproc-per-node=gpu",
                                      "torchrun --nproc-per-node auto --nnodes 1"])
def test_torchruns_elastic_nodes_and_a_process_per_gpu_are_read(tmp_path, torchrun):
    """--nnodes 1:2 (an elastic range) and --nproc-per-node gpu or auto (a process for each of the
    node's GPUs) are torchrun's, and were refused as "expected an integer"."""
    script = "#!/bin/bash\n" + TRAIN.replace("torchrun --nproc_per_node 8 --nnodes 1", torchrun) + "\n"
    assert torchrun in script
    case, args = files(tmp_path, script, BF16)
    assert diagnose(case, megatron_args=args).estimate.job.layout.tp == 2


def test_a_for_list_whose_command_substitution_is_not_run_is_said():
    """`for i in $(seq 1 4); do TP=$i; done` ran no iteration (the substitution read as empty) and left TP as
    it was, with nothing said: a tensor parallelism bash never launches, silently."""
    read = read_script("TP=2\nfor i in $(seq 1 4); do TP=$i; done\ntorchrun --tp $TP\n", "train.sh")
    assert any("line 2: for i in …: the list's command substitution is not run" in note.text for note in read.notes)


@pytest.mark.parametrize("torchrun, key, said", [
    # 16 processes on the case's 8-GPU nodes: exit 0, priced as 16 GPUs
    ("torchrun --nnodes 1 --nproc-per-node 16 pretrain_gpt.py", "--nproc-per-node",
     "torchrun starts 16 processes on each node, but the case's nodes have 8 GPUs (cluster.gpus_per_node)"),
    ("torchrun --nnodes 1 --nproc_per_node=16 pretrain_gpt.py", "--nproc-per-node", "16 processes on each node"),
    # after the script, --nnodes is pretrain_gpt.py's (refused as torchrun's world: 5 x 8 = 40 GPUs)
    ("torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py --nnodes 5", "--nnodes",
     "comes after pretrain_gpt.py, so it is that script's, not torchrun's"),
    # 4 processes on each of 4 nodes: priced on the case's 2 full 8-GPU nodes, tp 2 groups and all
    ("torchrun --nnodes 4 --nproc-per-node 4 pretrain_gpt.py", "--nproc-per-node",
     "torchrun starts 4 processes on each of 4 nodes, but the case packs its 16 GPUs 8 to a node "
     "(cluster.gpus_per_node): give cluster.gpus_per_node: 4"),
    # torchrun's parser refuses it, not Megatron-LM's
    ("torchrun --nnodes $NNODES --nproc-per-node 8 pretrain_gpt.py", "--nnodes",
     "takes a value, and none follows it: torchrun's parser refuses it"),
])
def test_torchruns_flags_are_its_own_before_the_script_and_checked_against_the_nodes(tmp_path, torchrun, key, said):
    script = "#!/bin/bash\n" + TRAIN.replace("torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py", torchrun) + "\n"
    case, args = files(tmp_path, script, {**BF16, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16}})
    with pytest.raises(CaseError) as error:
        diagnose(case, megatron_args=args)
    assert error.value.key == key and said in error.value.expected, str(error.value)
    assert "Megatron-LM's parser refuses" not in error.value.expected or "after" in said


def test_a_launch_on_nodes_of_fewer_gpus_reads_when_the_case_says_so(tmp_path):
    """4 processes on each of 4 nodes is what a case of 4-GPU nodes launches: read as written."""
    script = "#!/bin/bash\n" + TRAIN.replace("torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py",
                                             "torchrun --nnodes 4 --nproc-per-node 4 pretrain_gpt.py") + "\n"
    case, args = files(tmp_path, script, {**BF16, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16,
                                                              "gpus_per_node": 4}})
    assert diagnose(case, megatron_args=args).estimate.job.layout.tp == 2


FSDP_TRAIN = TRAIN.replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size 1") \
    .replace("--pipeline-model-parallel-size 2", "--pipeline-model-parallel-size 1") \
    + " --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --ckpt-format fsdp_dtensor"


@pytest.mark.parametrize("setting, refused", [
    ("export CUDA_DEVICE_MAX_CONNECTIONS=1\n", True),
    ("export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}\n", True),  # examples/llama's line 4
    ("CUDA_DEVICE_MAX_CONNECTIONS=1 ", True),  # the launch's own prefix: in torchrun's environment alone
    ("export CUDA_DEVICE_MAX_CONNECTIONS=1\nunset CUDA_DEVICE_MAX_CONNECTIONS\n", False),  # examples/megatron_fsdp
    ("export CUDA_DEVICE_MAX_CONNECTIONS=32\n", False),
    ("CUDA_DEVICE_MAX_CONNECTIONS=1\n", False),  # not exported: torchrun does not see it
    ("env CUDA_DEVICE_MAX_CONNECTIONS=1 ", True),  # env(1) puts it in torchrun's environment
    ("export CUDA_DEVICE_MAX_CONNECTIONS=1\nenv -u CUDA_DEVICE_MAX_CONNECTIONS ", False),  # env(1) takes it out
    # bash takes it out of the environment, still set (help export: "-n remove the export property")
    ("export CUDA_DEVICE_MAX_CONNECTIONS=1\nenv -uCUDA_DEVICE_MAX_CONNECTIONS ", False),
    ("export CUDA_DEVICE_MAX_CONNECTIONS=1\nenv -i PATH=/usr/bin ", False),
    ("export CUDA_DEVICE_MAX_CONNECTIONS=1\nexport -n CUDA_DEVICE_MAX_CONNECTIONS\n", False),
    ("export CUDA_DEVICE_MAX_CONNECTIONS=1\ndeclare +x CUDA_DEVICE_MAX_CONNECTIONS\n", False),
    ("CUDA_DEVICE_MAX_CONNECTIONS=1\n( export CUDA_DEVICE_MAX_CONNECTIONS )\n", False),  # the subshell's export alone
])
def test_megatron_fsdp_under_one_cuda_connection_is_refused(tmp_path, setting, refused):
    """A launch that exports CUDA_DEVICE_MAX_CONNECTIONS=1 (as most of Megatron-LM's examples do) with
    --use-megatron-fsdp was priced as ZeRO 3 and exit 0, where Megatron-LM stops before its first step:
    validate_args asserts os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') != "1" under Megatron-FSDP
    (megatron/training/arguments.py:687-688 at core_v0.16.1, 1143 at core_v0.19.0; :622 under
    --use-torch-fsdp2), and examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh unsets it for that."""
    case, args = files(tmp_path, "#!/bin/bash\n" + setting + FSDP_TRAIN + "\n", BF16)
    if refused:
        with pytest.raises(CaseError) as error:
            diagnose(case, megatron_args=args)
        assert error.value.key == "CUDA_DEVICE_MAX_CONNECTIONS" and "--use-megatron-fsdp" in error.value.expected
    else:
        assert diagnose(case, megatron_args=args).estimate.job.layout.zero_stage == 3


@pytest.mark.parametrize("setting, backend, refused", [
    ("export NVTE_FUSED_ATTN=0\n", "", "NVTE_FUSED_ATTN"),  # auto expects 1, 1, 1
    ("export NVTE_FLASH_ATTN=1 NVTE_FUSED_ATTN=0\n", "", "NVTE_FUSED_ATTN"),
    ("NVTE_FLASH_ATTN=0 ", "", "NVTE_FLASH_ATTN"),  # the launch's own prefix
    ("export NVTE_FLASH_ATTN=1 NVTE_FUSED_ATTN=0\n", " --attention-backend flash", None),
    ("export NVTE_FLASH_ATTN=1\n", " --attention-backend fused", "NVTE_FLASH_ATTN"),
    ("export NVTE_FUSED_ATTN=1\n", "", None),
    ("NVTE_FUSED_ATTN=0\n", "", None),  # not exported: the training does not see it
])
def test_an_nvte_attention_switch_the_backend_does_not_set_is_refused(tmp_path, setting, backend, refused):
    """`export NVTE_FUSED_ATTN=0` (older scripts' way to pick flash attention) beside the default
    --attention-backend auto was priced and exit 0, where megatron-core stops as it builds the model:
    LanguageModule._set_attention_backend asserts each of NVTE_FLASH_ATTN, NVTE_FUSED_ATTN and
    NVTE_UNFUSED_ATTN is unset or the backend's value (1, 1, 1 for auto; 1, 0, 0 for flash; 0, 1, 0 for
    fused), megatron/core/models/common/language_module/language_module.py:98-126 at core_v0.16.1."""
    script = "#!/bin/bash\n" + setting + TRAIN.replace("pretrain_gpt.py", "pretrain_gpt.py" + backend) + "\n"
    case, args = files(tmp_path, script, {**BF16, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8}})
    if refused:
        with pytest.raises(CaseError) as error:
            diagnose(case, megatron_args=args)
        assert error.value.key == refused
    else:
        assert diagnose(case, megatron_args=args).estimate.job.layout.tp == 2


@pytest.mark.parametrize("gpu, setting, train, refused", [
    ("h100-sxm-80gb", "export CUDA_DEVICE_MAX_CONNECTIONS=32\n", TRAIN, "'32'"),
    ("h100-sxm-80gb", "unset CUDA_DEVICE_MAX_CONNECTIONS\n", TRAIN, "unset"),
    ("h100-sxm-80gb", "export CUDA_DEVICE_MAX_CONNECTIONS=1\nunset CUDA_DEVICE_MAX_CONNECTIONS\n", TRAIN, "unset"),
    ("h100-sxm-80gb", "export CUDA_DEVICE_MAX_CONNECTIONS=1\nenv -u CUDA_DEVICE_MAX_CONNECTIONS ", TRAIN, "unset"),
    # env(1)'s other spellings (coreutils env --help): -uNAME, --unset=NAME; -i starts from an empty
    # environment, the caller's export gone too
    ("h100-sxm-80gb", "export CUDA_DEVICE_MAX_CONNECTIONS=1\nenv -uCUDA_DEVICE_MAX_CONNECTIONS ", TRAIN, "unset"),
    ("h100-sxm-80gb", "export CUDA_DEVICE_MAX_CONNECTIONS=1\nenv --unset=CUDA_DEVICE_MAX_CONNECTIONS ", TRAIN, "unset"),
    ("h100-sxm-80gb", "export CUDA_DEVICE_MAX_CONNECTIONS=1\nenv -i PATH=/usr/bin ", TRAIN, "unset"),
    ("h100-sxm-80gb", "env -i CUDA_DEVICE_MAX_CONNECTIONS=1 ", TRAIN, None),
    ("h100-sxm-80gb", "CUDA_DEVICE_MAX_CONNECTIONS=8 ", TRAIN, "'8'"),  # the launch's own prefix
    ("a100-sxm-80gb", "export CUDA_DEVICE_MAX_CONNECTIONS=32\n", TRAIN, "'32'"),
    ("h100-sxm-80gb", "export CUDA_DEVICE_MAX_CONNECTIONS=1\n", TRAIN, None),
    ("h100-sxm-80gb", "unset CUDA_DEVICE_MAX_CONNECTIONS\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n", TRAIN, None),
    ("b200", "export CUDA_DEVICE_MAX_CONNECTIONS=32\n", TRAIN, None),  # Blackwell: no such assertion
    ("b300", "unset CUDA_DEVICE_MAX_CONNECTIONS\n", TRAIN, None),  # Blackwell Ultra, sm_103: major 10
    # ROCm: torch's device major is the ISA's (gfx942: 9), below 10 as Megatron-LM reads it
    ("mi300x", "export CUDA_DEVICE_MAX_CONNECTIONS=32\n", TRAIN, "'32'"),
    ("h100-sxm-80gb", "export CUDA_DEVICE_MAX_CONNECTIONS=32\n",
     TRAIN.replace("--pipeline-model-parallel-size 2", "--pipeline-model-parallel-size 1")
     + " --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --ckpt-format fsdp_dtensor",
     None),  # FSDP: validate_args only warns
    ("h100-sxm-80gb", "export CUDA_DEVICE_MAX_CONNECTIONS=32\n", FSDP_TRAIN.replace(
        "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --ckpt-format fsdp_dtensor", ""),
     None),  # tp 1, pp 1, cp 1: nothing asserted
])
def test_tensor_parallelism_without_one_cuda_connection_before_blackwell_is_refused(tmp_path, gpu, setting, train,
                                                                                   refused):
    """A launch script with tp 2 on H100 that exports CUDA_DEVICE_MAX_CONNECTIONS=32 (or unsets it) was
    priced, exit 0, where Megatron-LM stops before its first step: validate_args asserts
    os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') == "1" for tp or cp > 1 where get_device_arch_version()
    (the compute capability's major) is below 10, unless FSDP or --overlap-moe-expert-parallel-comm is on
    (megatron/training/arguments.py:927-953 at core_v0.16.1, 1413-1439 at core_v0.19.0)."""
    script = "#!/bin/bash\n" + setting + train + "\n"
    case, args = files(tmp_path, script, {**BF16, "cluster": {"gpu": gpu, "num_gpus": 8}})
    if refused:
        with pytest.raises(CaseError) as error:
            diagnose(case, megatron_args=args)
        assert error.value.key == "CUDA_DEVICE_MAX_CONNECTIONS", str(error.value)
        assert refused in error.value.expected and "validate_args" in error.value.expected, str(error.value)
        assert "tp 2" in error.value.expected
    else:
        result = diagnose(case, megatron_args=args)
        assert not any("CUDA_DEVICE_MAX_CONNECTIONS" in note for note in result.notes), result.notes


@needs_bash
@pytest.mark.parametrize("gpu, expected", [
    ("h100-sxm-80gb", "1"),  # Hopper: validate_args asserts 1
    ("b200", "32"),  # Blackwell: Megatron-Bridge's PerfEnvPlugin, streams in parallel
    ({"memory": "80 GiB", "peak_tflops": {"bf16": 900}, "hbm_bandwidth": "3 TB/s", "intra_node_bandwidth": "400 GB/s",
      "inter_node_bandwidth": "50 GB/s", "gpus_per_node": 8, "nvlink_domain": 8},
     "1"),  # capability not known: what passes validate_args whatever it is
])
def test_the_emitted_launch_gives_the_training_the_connections_the_engine_sets(tmp_path, gpu, expected):
    """The emitted launch.sh exported CUDA_DEVICE_MAX_CONNECTIONS=1 on Blackwell too, where validate_args no
    longer asks for it and NVIDIA's own performance launches set 32 for tp or cp > 1 (Megatron-Bridge,
    src/megatron/bridge/recipes/run_plugins.py, PerfEnvPlugin.setup): one connection serializes the
    streams the data-parallel and pipeline traffic overlap on. Run by real bash, its torchrun a
    stand-in; read back by diagnose with no note or refusal on the variable."""
    from planner.engines.megatron import emit as megatron
    from planner.estimate import estimate

    case = {**BF16, "cluster": {"gpu": gpu, "num_gpus": 8},
            "layout": {"tp": 2, "pp": 2, "sequence_parallel": True, "micro_batch_size": 1, "recompute": "full"}}
    rendered = megatron.render(estimate(case), ["header"])
    (tmp_path / megatron.ARGS_FILE).write_text(rendered[megatron.ARGS_FILE])
    assert bash_connections(tmp_path, rendered[megatron.LAUNCH_FILE]) == expected
    launch, case_path = tmp_path / megatron.LAUNCH_FILE, tmp_path / "case.yaml"
    launch.write_text(rendered[megatron.LAUNCH_FILE])
    case_path.write_text(yaml.safe_dump(case))
    result = diagnose(case_path, megatron_args=launch)
    assert result.estimate.job.layout.tp == 2
    assert not any(CONNECTIONS in note for note in result.notes), result.notes


@needs_bash
@pytest.mark.parametrize("dispatch, expected", [("all_to_all", "8"), ("deepep", "32")])
def test_the_emitted_launch_keeps_the_expert_overlap_in_parallel_streams(tmp_path, dispatch, expected):
    """training.moe_comm_overlap is credited by the estimate (the experts' dispatch and combine beside
    another micro-batch's compute), but with tp > 1 on Hopper the launch exported
    CUDA_DEVICE_MAX_CONNECTIONS=1, of which validate_args warns that it serializes that overlap
    (megatron/training/arguments.py at core_v0.16.1: "overlap_moe_expert_parallel_comm requires setting a
    larger CUDA_DEVICE_MAX_CONNECTIONS"); Megatron-Bridge's PerfEnvPlugin sets 8 there, 32 with DeepEP
    (run_plugins.py, _set_num_cuda_device_max_connections: a2a_overlap, deepep_enabled). Run by real bash,
    read back by diagnose with no refusal on the variable."""
    from planner.engines.megatron import emit as megatron
    from planner.estimate import estimate

    case = {"model": {"preset": "deepseek-v2-lite"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 32, "seq_len": 4096, "engine": "megatron", "moe_comm_overlap": True,
                         "expert_dispatch": dispatch},
            "layout": {"tp": 2, "sequence_parallel": True, "pp": 2, "vpp": 2, "ep": 4, "etp": 1, "zero_stage": 1}}
    rendered = megatron.render(estimate(case), ["header"])
    (tmp_path / megatron.ARGS_FILE).write_text(rendered[megatron.ARGS_FILE])
    assert bash_connections(tmp_path, rendered[megatron.LAUNCH_FILE]) == expected
    assert f"export CUDA_DEVICE_MAX_CONNECTIONS={expected} " in rendered[megatron.SBATCH_FILE]
    launch, case_path = tmp_path / megatron.LAUNCH_FILE, tmp_path / "case.yaml"
    launch.write_text(rendered[megatron.LAUNCH_FILE])
    case_path.write_text(yaml.safe_dump(case))
    result = diagnose(case_path, megatron_args=launch)
    assert result.estimate.job.training.moe_comm_overlap and result.estimate.job.layout.tp == 2
    assert not any(CONNECTIONS in note for note in result.notes), result.notes


def bash_connections(tmp_path: Path, script: str, caller: Optional[str] = None) -> Optional[str]:
    """CUDA_DEVICE_MAX_CONNECTIONS as real bash passes it to the script's torchrun (an executable stand-in,
    so that exec, env and nohup reach it too), None where torchrun's environment lacks it; ``caller``: the
    value the environment that runs the script exports, if any."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    (stubs / "torchrun").write_text('#!/bin/sh\nprintf "%s\\n" "${CUDA_DEVICE_MAX_CONNECTIONS-<unset>}" >&3\n')
    (stubs / "torchrun").chmod(0o755)
    for launcher in ("srun", "numactl"):  # their options (given as --name=value here) dropped, the rest started
        (stubs / launcher).write_text('#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n')
        (stubs / launcher).chmod(0o755)
    (tmp_path / "oracle.sh").write_text(script)
    caller_env = [f"CUDA_DEVICE_MAX_CONNECTIONS={caller}"] if caller is not None else []
    run = subprocess.run(["env", "-i", f"PATH={stubs}:{os.environ.get('PATH', '/usr/bin:/bin')}", *caller_env,
                          BASH, "-c", 'exec bash "$0" 3>&1 1>&2', str(tmp_path / "oracle.sh")],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    seen = run.stdout.splitlines()
    assert len(seen) == 1, (run.stdout, run.stderr)
    return None if seen[0] == "<unset>" else seen[0]


CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"


def read_as_bash_does(tmp_path: Path, script: str, refused: Optional[str], oracle: bool = True):
    """The tp 2 launch ``script`` on 8 H100s: refused naming CUDA_DEVICE_MAX_CONNECTIONS (``refused`` in
    its message) exactly where real bash, its caller exporting 1, gives the training another value (where
    ``oracle``), else read at tp 2 (its diagnosis returned)."""
    if oracle:
        assert (bash_connections(tmp_path, script, caller="1") != "1") == (refused is not None)
    case, args = files(tmp_path, script, {**BF16, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8}})
    if refused:
        with pytest.raises(CaseError) as error:
            diagnose(case, megatron_args=args)
        assert error.value.key == CONNECTIONS and refused in error.value.expected, str(error.value)
        return None
    result = diagnose(case, megatron_args=args)
    assert result.estimate.job.layout.tp == 2
    return result


@needs_bash
@pytest.mark.parametrize("script, refused", [
    # unset on a local removes the local alone: the caller's variable is back when the function returns
    (f"f() {{ local {CONNECTIONS}=32; unset {CONNECTIONS}; }}\nf\n{TRAIN}\n", None),
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}=32; unset {CONNECTIONS}; }}\nf\n{TRAIN}\n", None),
    # ... and, inside the function, the exported global shows through the unset (or valueless) local
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}=32; unset {CONNECTIONS}; {TRAIN}; }}\nf\n", None),
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}; {TRAIN}; }}\nf\n", None),
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}=32; export -n {CONNECTIONS}; {TRAIN}; }}\nf\n", None),
    # unset of a calling function's local removes it: the global it hid is back
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}=32; g; }}\ng() {{ unset {CONNECTIONS}; {TRAIN}; }}\nf\n",
     None),
    # what bash does refuse: a local inherits the export, and an unset outside any local unsets the global
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}=32; {TRAIN}; }}\nf\n", "'32'"),
    (f"export {CONNECTIONS}=1\nf() {{ unset {CONNECTIONS}; }}\nf\n{TRAIN}\n", "unset"),
    (f"export {CONNECTIONS}=1\nf() {{ local -x {CONNECTIONS}=32; g; }}\ng() {{ local {CONNECTIONS}; {TRAIN}; }}\nf\n",
     "'32'"),
])
def test_a_functions_local_connections_are_scoped_as_bash_scopes_them(tmp_path, script, refused):
    """`f() { local CUDA_DEVICE_MAX_CONNECTIONS=32; unset CUDA_DEVICE_MAX_CONNECTIONS; }; f` before a tp 2
    launch on H100 was refused as unsetting it, where bash's unset takes the local away alone and the
    variable it hid (the caller's, or an exported 1) is the training's again (Bash Reference Manual, 4.2
    Bash Builtins: local, unset); and inside the function an exported global shows through a local that
    is not exported, which hides it from $X but not from the environment bash builds from every scope's
    exported variables (3.7.4 Environment). Real bash is the oracle: what is refused is what no caller
    exporting 1 rescues."""
    script = "#!/bin/bash\n" + script
    read_as_bash_does(tmp_path, script, refused)


@needs_bash
@pytest.mark.parametrize("script, refused", [
    # a local of an exported name is exported: the value it is given later is the training's
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}; {CONNECTIONS}=32; {TRAIN}; }}\nf\n", "'32'"),
    (f"export {CONNECTIONS}=1\nf() {{ declare {CONNECTIONS}; {CONNECTIONS}=32; {TRAIN}; }}\nf\n", "'32'"),
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}=5; {TRAIN}; }}\nf\n", "'5'"),
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}; g; }}\n"
     f"g() {{ local {CONNECTIONS}; {CONNECTIONS}=32; {TRAIN}; }}\nf\n", "'32'"),
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}; g; }}\ng() {{ {CONNECTIONS}=32; {TRAIN}; }}\nf\n", "'32'"),
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}; declare -x {CONNECTIONS}; {CONNECTIONS}=32; "
     f"{TRAIN}; }}\nf\n", "'32'"),
    # unset, while unset, or without the attribute: the exported global's 1 shows through
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}; {TRAIN}; }}\nf\n", None),
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}; unset {CONNECTIONS}; {CONNECTIONS}=32; {TRAIN}; }}\nf\n",
     None),
    (f"export {CONNECTIONS}=1\nf() {{ local +x {CONNECTIONS}; {CONNECTIONS}=32; {TRAIN}; }}\nf\n", None),
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}; export -n {CONNECTIONS}; {CONNECTIONS}=32; {TRAIN}; }}\nf\n",
     None),
    # and the global is the training's again once the function returns
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}; {CONNECTIONS}=32; }}\nf\n{TRAIN}\n", None),
])
def test_a_valueless_local_of_an_exported_name_is_exported(tmp_path, script, refused):
    """`export CUDA_DEVICE_MAX_CONNECTIONS=1; f() { local CUDA_DEVICE_MAX_CONNECTIONS;
    CUDA_DEVICE_MAX_CONNECTIONS=32; torchrun ...; }` at tp 2 on H100 was read as passing 1, where bash
    passes 32: a new local takes the export attribute of the variable it hides (bash's variables.c,
    make_local_variable: "new_var->attributes = exported_p (old_var) ? att_exported : 0"), kept while it is
    unset and given to the value assigned later; unset drops it (makunbound), as do local +x and export -n.
    Real bash is the oracle: what is refused is what no caller exporting 1 rescues."""
    read_as_bash_does(tmp_path, "#!/bin/bash\n" + script, refused)


@needs_bash
def test_a_valueless_local_of_a_global_the_script_does_not_export_is_not_exported(tmp_path):
    """`CUDA_DEVICE_MAX_CONNECTIONS=1; f() { local CUDA_DEVICE_MAX_CONNECTIONS; CUDA_DEVICE_MAX_CONNECTIONS=32;
    torchrun ...; }`: exported only where the caller's environment held the name (then the global was
    exported too, and the local took the attribute from it); bash passes none otherwise."""
    script = f"#!/bin/bash\n{CONNECTIONS}=1\nf() {{ local {CONNECTIONS}; {CONNECTIONS}=32; {TRAIN}; }}\nf\n"
    assert bash_connections(tmp_path, script) is None
    read_as_bash_does(tmp_path, script, "'32'")


@pytest.mark.parametrize("script, refused", [
    # the call's prefix is in its commands' environment, for the call alone
    (f"f() {{ {TRAIN}; }}\n{CONNECTIONS}=32 f\n", "'32'"),
    (f"export {CONNECTIONS}=1\nf() {{ {TRAIN}; }}\n{CONNECTIONS}=32 f\n", "'32'"),
    (f"g() {{ {TRAIN}; }}\nf() {{ {CONNECTIONS}=32 g; }}\nf\n", "'32'"),  # nested: g's commands have it
    (f"f() {{ :; }}\nexport {CONNECTIONS}=1\n{CONNECTIONS}=32 f\n{TRAIN}\n", None),  # gone when f returns
    (f"f() {{ local {CONNECTIONS}; {TRAIN}; }}\n{CONNECTIONS}=32 f\n", "'32'"),  # local keeps the prefix's value
    # unset takes the prefix's variable away: the caller's exported 1 shows again
    (f"export {CONNECTIONS}=1\nf() {{ unset {CONNECTIONS}; {TRAIN}; }}\n{CONNECTIONS}=32 f\n", None),
    # export (or readonly) of the prefix's variable keeps it past the call
    (f"f() {{ export {CONNECTIONS}; }}\n{CONNECTIONS}=32 f\n{TRAIN}\n", "'32'"),
    (f"f() {{ readonly {CONNECTIONS}; }}\n{CONNECTIONS}=32 f\n{TRAIN}\n", "'32'"),
    (f"f() {{ {CONNECTIONS}=8; }}\nexport {CONNECTIONS}=1\n{CONNECTIONS}=32 f\n{TRAIN}\n", None),
])
def test_a_function_calls_prefix_assignments_are_its_commands_environment(tmp_path, script, refused):
    """`CUDA_DEVICE_MAX_CONNECTIONS=32 f`, where f runs a tp 2 launch on H100, was priced, exit 0: the
    reader dropped a function call's NAME=value prefixes, where bash gives them to the function's commands
    for the call's duration, exported (Bash Reference Manual, 3.7.4 Environment: "...for a function call,
    they affect the function's execution environment"; bash 5.2 in POSIX mode drops them on return too).
    Bash puts them in the function's scope: local keeps one's value, unset shows the caller's variable,
    export and readonly keep it past the return (variables.c, push_func_var). Real bash, where there is
    one, is the oracle: what is refused is what no caller exporting 1 rescues."""
    script = "#!/bin/bash\n" + script
    read_as_bash_does(tmp_path, script, refused, oracle=BASH is not None)


@pytest.mark.parametrize("setting, refused", [
    (f"time {CONNECTIONS}=32 ", "'32'"),
    (f"time -p {CONNECTIONS}=32 ", "'32'"),
    (f"time -p -- {CONNECTIONS}=32 ", "'32'"),
    (f"time ! {CONNECTIONS}=32 ", "'32'"),
    (f"f() {{ \"$@\"; }}\ntime {CONNECTIONS}=32 f ", "'32'"),  # time f calls the function
    (f"export {CONNECTIONS}=32\ntime {CONNECTIONS}=1 ", None),
])
def test_a_prefix_after_the_reserved_word_time_is_the_launchs_environment(tmp_path, setting, refused):
    """`time CUDA_DEVICE_MAX_CONNECTIONS=32 torchrun ...` (tp 2 on H100) was priced, exit 0: the reserved
    word time was read as the command's first word, so the assignment after it was taken for an argument,
    where bash times the pipeline after `time [-p]` and passes it its NAME=value prefixes (Bash Reference
    Manual, 3.2.3 Pipelines; 3.7.4 Environment). Real bash, where there is one, is the oracle: what is
    refused is what no caller exporting 1 rescues."""
    script = "#!/bin/bash\n" + setting + TRAIN + "\n"
    read_as_bash_does(tmp_path, script, refused, oracle=BASH is not None)


@pytest.mark.parametrize("setting, refused", [
    (f"export {CONNECTIONS}=1\nexport -n {CONNECTIONS}=5\n", "unset"),
    (f"export {CONNECTIONS}=1\nexport -n {CONNECTIONS}\n", "unset"),
    (f"export -n {CONNECTIONS}\n", "unset"),  # the caller's exported 1 is the script's variable: taken off too
    (f"declare +x {CONNECTIONS}\n", "unset"),
    (f"export {CONNECTIONS}=1\nexport -n {CONNECTIONS}\n{CONNECTIONS}=1\n", "unset"),  # set, still not exported
    (f"export {CONNECTIONS}=1\nf() {{ export -n {CONNECTIONS}; }}\nf\n", "unset"),  # no local: the global's
    (f"export {CONNECTIONS}=1\nf() {{ local {CONNECTIONS}=1; export -n {CONNECTIONS}; }}\nf\n", None),
    (f"export {CONNECTIONS}=1\n(export -n {CONNECTIONS})\n", None),  # the subshell's alone
    (f"export {CONNECTIONS}=1\nexport -n {CONNECTIONS}\nexport {CONNECTIONS}\n", None),  # exported again
])
def test_export_n_takes_the_variable_out_of_the_launchs_environment_decidedly(tmp_path, setting, refused):
    """`export CUDA_DEVICE_MAX_CONNECTIONS=1; export -n CUDA_DEVICE_MAX_CONNECTIONS=5` before a tp 2 launch on
    H100 was read as leaving the variable to the caller, where bash passes none: export -n takes the export
    attribute off the script's variable, which is the one a caller's exported value became when bash started
    (Bash Reference Manual, 4.1 Bourne Shell Builtins: export; 3.7.4 Environment), so no caller rescues it.
    Real bash, where there is one, is the oracle: what is refused is what no caller exporting 1 rescues."""
    result = read_as_bash_does(tmp_path, "#!/bin/bash\n" + setting + TRAIN + "\n", refused, oracle=BASH is not None)
    if result is not None:  # decided, not left to the caller: no note on it
        assert not any(CONNECTIONS in note for note in result.notes), result.notes


@pytest.mark.parametrize("setting, refused", [
    (f"readonly -x {CONNECTIONS}=32\n", None),  # readonly takes no -x: "invalid option", nothing set
    (f"export -f {CONNECTIONS}=32\n", None),  # -f names functions: "not a function", nothing set
    (f"declare -fx {CONNECTIONS}=32\n", None),  # "cannot use `-f' to make functions"
    (f"export -f {CONNECTIONS}=32 && export {CONNECTIONS}=32\n", None),  # it fails: && goes no further
    (f"readonly -x {CONNECTIONS}=32 || export {CONNECTIONS}=32\n", "'32'"),
    (f"readonly -a A=(1)\nexport {CONNECTIONS}=32\n", "'32'"),  # what readonly takes is still read
])
def test_a_declaration_bash_rejects_sets_nothing(tmp_path, setting, refused):
    """`readonly -x CUDA_DEVICE_MAX_CONNECTIONS=32` (or `export -f CUDA_DEVICE_MAX_CONNECTIONS=32`) before a tp 2
    launch on H100 was refused as exporting 32, where bash rejects it and sets nothing: readonly takes -a, -A,
    -f and -p alone ("invalid option", status 2), and -f names functions ("not a function", status 1) (Bash
    Reference Manual, 4.1 Bourne Shell Builtins: export, readonly; 4.2 Bash Builtins: declare). Real bash,
    where there is one, is the oracle: what is refused is what no caller exporting 1 rescues."""
    script = "#!/bin/bash\n" + setting + TRAIN + "\n"
    read_as_bash_does(tmp_path, script, refused, oracle=BASH is not None)


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"export {CONNECTIONS}=1\nexec env -u {CONNECTIONS} ", "unset"),
    (f"export {CONNECTIONS}=1\ncommand env -u {CONNECTIONS} ", "unset"),
    (f"export {CONNECTIONS}=1\nnohup env -u {CONNECTIONS} ", "unset"),
    (f"export {CONNECTIONS}=1\ntime -p env -u {CONNECTIONS} ", "unset"),
    (f"export {CONNECTIONS}=1\nnice -n 5 env -u {CONNECTIONS} ", "unset"),
    (f"export {CONNECTIONS}=1\nstdbuf -oL env -u {CONNECTIONS} ", "unset"),
    (f"export {CONNECTIONS}=1\ntimeout --signal=TERM 3600 env -u {CONNECTIONS} ", "unset"),
    (f"export {CONNECTIONS}=1\nsrun --nodes=1 --ntasks-per-node=1 env -u {CONNECTIONS} ", "unset"),
    (f"export {CONNECTIONS}=1\nnumactl --cpunodebind=0 --membind=0 env -u {CONNECTIONS} ", "unset"),
    (f"export {CONNECTIONS}=1\nexec -c env PATH=\"$PATH\" ", "unset"),  # exec -c: an empty environment
    (f"export {CONNECTIONS}=1\nenv -S '-u {CONNECTIONS}' ", "unset"),
    (f"export {CONNECTIONS}=1\nenv -iu {CONNECTIONS} PATH=\"$PATH\" ", "unset"),
    (f"nohup env {CONNECTIONS}=8 ", "'8'"),
    (f"env {CONNECTIONS}=1 env -u {CONNECTIONS} ", "unset"),  # the env it starts takes it out again
    (f"export {CONNECTIONS}=32\nexec env {CONNECTIONS}=1 ", None),
    (f"export {CONNECTIONS}=1\nenv -u {CONNECTIONS} env {CONNECTIONS}=1 ", None),
    (f"export {CONNECTIONS}=1\nexec -a trainer ", None),
])
def test_env_reached_through_the_commands_that_start_it_is_read(tmp_path, setting, refused):
    """`export CUDA_DEVICE_MAX_CONNECTIONS=1` then `exec env -u CUDA_DEVICE_MAX_CONNECTIONS torchrun ...` (tp 2
    on H100) was priced, exit 0: env(1)'s options were read only where env was the command's first word, so
    after exec (or nohup, nice, srun, ...) the -u was missed, where bash's exec and command start env in the
    environment they were given (Bash Reference Manual, 4.1 Bourne Shell Builtins: exec; 4.2 Bash Builtins:
    command; exec -c: "with an empty environment"), as coreutils' nohup, nice, stdbuf and timeout do, and env
    takes the variable out. Real bash is the oracle: what is refused is what no caller exporting 1 rescues."""
    script = "#!/bin/bash\n" + setting + TRAIN + "\n"
    read_as_bash_does(tmp_path, script, refused)


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"export {CONNECTIONS}=1\nenv -u {CONNECTIONS} bash -c '{TRAIN}'\n", "unset"),
    (f"{CONNECTIONS}=32 bash -c '{TRAIN}'\n", "'32'"),  # the prefix is in the inner shell's environment
    (f"export {CONNECTIONS}=32\nenv {CONNECTIONS}=1 bash -c '{TRAIN}'\n", None),
])
def test_the_environment_a_bash_c_launch_is_given_is_its_own(tmp_path, setting, refused):
    """A `bash -c` launch read the exported variables alone: its NAME=value prefixes and what env(1) changes
    on the way were lost to the inner script (Bash Reference Manual, 3.7.4 Environment)."""
    script = "#!/bin/bash\n" + setting
    read_as_bash_does(tmp_path, script, refused)


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"set -a\n{CONNECTIONS}=32\n", "'32'"),
    (f"set -o allexport\n{CONNECTIONS}=32\nset +a\n", "'32'"),  # exported as it was set
    (f"set -ea\nf() {{ local {CONNECTIONS}=8; {TRAIN}; }}\nf\n", "'8'"),
    (f"(set -a; {CONNECTIONS}=32)\n", None),  # the subshell's alone: the caller's 1 stays
    (f"set -a\nset +o allexport\nexport {CONNECTIONS}=1\n", None),
])
def test_allexport_puts_what_the_script_sets_in_the_trainings_environment(tmp_path, setting, refused):
    """`set -a` then CUDA_DEVICE_MAX_CONNECTIONS=32 before a tp 2 launch on H100 was priced, exit 0: set's
    -a (-o allexport) was not read, where bash exports every variable set after it (Bash Reference Manual,
    4.3.1 The Set Builtin). Real bash is the oracle: what is refused is what no caller exporting 1 rescues."""
    script = "#!/bin/bash\n" + setting + (TRAIN + "\n" if TRAIN not in setting else "")
    read_as_bash_does(tmp_path, script, refused)


def test_moe_expert_overlap_lifts_the_one_connection_assertion(tmp_path):
    """--overlap-moe-expert-parallel-comm turns validate_args' assertion into a warning: the reader
    does not refuse CUDA_DEVICE_MAX_CONNECTIONS=32 beside it (emit.one_connection_asserted)."""
    from planner.engines.megatron.emit import one_connection_asserted
    assert one_connection_asserted(2, 1, fsdp=False, moe_overlap=False, arch_major=9)
    assert one_connection_asserted(1, 2, fsdp=False, moe_overlap=False, arch_major=8)
    assert not one_connection_asserted(2, 1, fsdp=False, moe_overlap=True, arch_major=9)
    assert not one_connection_asserted(2, 1, fsdp=True, moe_overlap=False, arch_major=9)
    assert not one_connection_asserted(2, 1, fsdp=False, moe_overlap=False, arch_major=10)
    assert not one_connection_asserted(2, 1, fsdp=False, moe_overlap=False, arch_major=None)
    assert not one_connection_asserted(1, 1, fsdp=False, moe_overlap=False, arch_major=9)


@pytest.mark.parametrize("setting, said", [
    ("", "does not set CUDA_DEVICE_MAX_CONNECTIONS"),
    ("export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}\n",
     "takes CUDA_DEVICE_MAX_CONNECTIONS from the caller's environment (read as '32')"),
])
def test_tensor_parallelism_with_connections_left_to_the_caller_is_noted(tmp_path, setting, said):
    """A script that does not decide CUDA_DEVICE_MAX_CONNECTIONS leaves it to the caller's environment,
    which may export 1: not refused, but the note says Megatron-LM needs it for tp 2 on H100."""
    case, args = files(tmp_path, "#!/bin/bash\n" + setting + TRAIN + "\n", BF16)
    result = diagnose(case, megatron_args=args)
    assert result.estimate.job.layout.tp == 2
    notes = [note for note in result.notes if "CUDA_DEVICE_MAX_CONNECTIONS" in note]
    assert len(notes) == 1 and said in notes[0], result.notes
    assert "needs CUDA_DEVICE_MAX_CONNECTIONS=1 in the training's environment for tp 2 on h100-sxm-80gb" in notes[0]
    # an argument list carries no environment: no note (the planner's launch.sh exports it)
    (tmp_path / "args.txt").write_text(TRAIN.split("pretrain_gpt.py ", 1)[1] + "\n")
    listed = diagnose(case, megatron_args=tmp_path / "args.txt")
    assert not any("CUDA_DEVICE_MAX_CONNECTIONS" in note for note in listed.notes), listed.notes


def test_a_profile_without_a_compute_capability_is_read_and_not_checked(tmp_path):
    """compute_capability_major stays optional in an inline GPU (or a calibrated profile): without it
    nothing keys on it, and a value out of range is refused naming the key."""
    from planner.presets import gpu_presets
    h100 = dict(gpu_presets()["h100-sxm-80gb"])
    h100.pop("compute_capability_major")
    case, args = files(tmp_path, "#!/bin/bash\nexport CUDA_DEVICE_MAX_CONNECTIONS=32\n" + TRAIN + "\n",
                       {**BF16, "cluster": {"gpu": h100, "num_gpus": 8}})
    assert diagnose(case, megatron_args=args).estimate.job.layout.tp == 2
    (tmp_path / "case.yaml").write_text(yaml.safe_dump({**BF16, "cluster": {
        "gpu": {**h100, "compute_capability_major": 0}, "num_gpus": 8}}))
    with pytest.raises(CaseError) as error:
        diagnose(case, megatron_args=args)
    assert error.value.key.endswith("compute_capability_major"), str(error.value)


def test_a_return_guard_on_what_cannot_be_decided_is_said_as_the_launch_depends_on_it(tmp_path):
    """`[ -f x ] || return` leaves the function, not the script: the launch runs either way, and here with
    another --tensor-model-parallel-size (bash itself, the file missing: 2; present: 4). A guard that exits
    was read as passing with nothing said, as it should be for exit (the one way the script launches
    anything), and so was this one, whose other way launches too: tp 4 with no note."""
    script = ("TP=2\nsetup() {\n    [ -f ready ] || return 0\n    TP=4\n}\nsetup\n"
              "torchrun pretrain_gpt.py --tensor-model-parallel-size $TP\n")
    assert bash_words(tmp_path, script) == [["pretrain_gpt.py", "--tensor-model-parallel-size", "2"]]
    (tmp_path / "ready").write_text("")
    assert bash_words(tmp_path, script) == [["pretrain_gpt.py", "--tensor-model-parallel-size", "4"]]
    read = read_script(script, "train.sh")
    assert launched(script) == ["pretrain_gpt.py", "--tensor-model-parallel-size", "4"]
    assert [n.text for n in read.notes] == [
        "train.sh: line 3: [ -f ready ] cannot be decided without running anything (a file test, -f): read as "
        "true, so the script skips return 0"]
    # exit stops the script: the one way it launches, nothing to say.
    assert read_script(script.replace("return 0", "exit 1"), "train.sh").notes == []


@needs_bash
@pytest.mark.parametrize("script, refused", [
    (f"export {CONNECTIONS}=32 &\nwait\n{TRAIN}\n", None),
    (f"f() {{ export {CONNECTIONS}=32; }}\nf &\nwait\n{TRAIN}\n", None),
    (f"export {CONNECTIONS}=32 && true &\n{TRAIN}\n", None),
    (f"export {CONNECTIONS}=32\n{TRAIN} &\nwait\n", "'32'"),
])
def test_what_a_background_command_exports_stays_in_its_subshell(tmp_path, script, refused):
    """`export CUDA_DEVICE_MAX_CONNECTIONS=32 &` before a tp 2 launch on H100 was refused as the training's
    32, where bash runs an asynchronous list in a subshell (Bash Reference Manual, 3.2.4 Lists) and the
    training keeps the caller's 1; a launch sent to the background is still the launch."""
    read_as_bash_does(tmp_path, "#!/bin/bash\n" + script, refused)


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"{CONNECTIONS}=32\n", "absent where the caller does not"),
    (f"readonly {CONNECTIONS}=32\n", "absent where the caller does not"),
    (f"declare -i {CONNECTIONS}=16*2\n", "'32'"),
    (f"declare -l {CONNECTIONS}=32\n", "'32'"),
    (f"f() {{ declare -g {CONNECTIONS}=32; }}\nf\n", "'32'"),
    (f"f() {{ {CONNECTIONS}=32; }}\nf\n", "'32'"),
    (f"printf -v {CONNECTIONS} %s 32\n", "'32'"),
    (f"let {CONNECTIONS}=32\n", "'32'"),
    (f"(( {CONNECTIONS} = 32 ))\n", "'32'"),
    (f"for {CONNECTIONS} in 32; do :; done\n", "'32'"),
    (f"{CONNECTIONS}=1\n", None),  # 1 where the caller exports it: said, read as exported
    (f"unset {CONNECTIONS}\n{CONNECTIONS}=1\n", "unset"),  # not exported after unset: decidedly absent
    (f"export -n {CONNECTIONS}\n{CONNECTIONS}=1\n", "unset"),
])
def test_a_value_set_without_export_reaches_the_training_where_the_caller_exports_it(tmp_path, setting, refused):
    """`CUDA_DEVICE_MAX_CONNECTIONS=32` without export before a tp 2 launch on H100 was priced, exit 0: bash
    exports a variable it inherited from the environment (Bash Reference Manual, 3.7.4 Environment), so
    the training gets 32 where the caller exports the name and nothing where not; neither is 1, so
    validate_args stops it either way. Real bash is the oracle, with the caller exporting 1 and with no
    caller's value: both cases are what the refusal says."""
    script = "#!/bin/bash\n" + setting + TRAIN + "\n"
    if refused is not None and refused != "unset":
        assert bash_connections(tmp_path, script) is None  # no caller's value: nothing reaches the training
    result = read_as_bash_does(tmp_path, script, refused)
    if refused is None:
        notes = [note for note in result.notes if CONNECTIONS in note]
        assert len(notes) == 1 and "without export" in notes[0] and "read as the caller exporting it" in notes[0], notes
        assert bash_connections(tmp_path, script) is None  # the case the note warns of


@needs_bash
@pytest.mark.parametrize("script, refused", [
    (f"f() {{ local {CONNECTIONS}=32; {TRAIN}; }}\nf\n", "'32'"),  # a local inherits the caller's export
    (f"f() {{ local {CONNECTIONS}=32; }}\nf\n{TRAIN}\n", None),  # gone when f returns: the caller's own
])
def test_a_local_of_a_name_the_caller_may_export_is_exported_with_it(tmp_path, script, refused):
    """`f() { local CUDA_DEVICE_MAX_CONNECTIONS=32; torchrun ...; }` was priced: bash's local of a variable
    inherited from the environment is exported too, with the local value (3.7.4 Environment)."""
    read_as_bash_does(tmp_path, "#!/bin/bash\n" + script, refused)


def test_a_one_set_without_export_under_fsdp_or_an_nvte_switch_is_said_not_refused(tmp_path):
    """Under FSDP, CUDA_DEVICE_MAX_CONNECTIONS=1 without export breaks validate_args only where the caller
    exports the name; an NVTE_FUSED_ATTN=0 without export beside --attention-backend auto likewise: said,
    read as the caller not exporting it, not refused."""
    case, args = files(tmp_path, f"#!/bin/bash\n{CONNECTIONS}=1\nNVTE_FUSED_ATTN=0\n{FSDP_TRAIN}\n", BF16)
    notes = diagnose(case, megatron_args=args).notes
    assert any(CONNECTIONS in note and "--use-megatron-fsdp refuses" in note for note in notes), notes
    assert any("NVTE_FUSED_ATTN=0 without export" in note for note in notes), notes


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"command export {CONNECTIONS}=32\n", "'32'"),
    (f"builtin export {CONNECTIONS}=32\n", "'32'"),
    (f"{CONNECTIONS}=32 export {CONNECTIONS}\n", "'32'"),  # the export carries the prefix past the command
    (f"{CONNECTIONS}=32 readonly {CONNECTIONS}\n", "'32'"),
    (f"export {CONNECTIONS}=1\n{CONNECTIONS}=32 export OTHER\n", None),  # a prefix it does not name: its own
    (f"declare -a {CONNECTIONS}=32\n", "array"),  # bash exports no array
    (f"declare -A {CONNECTIONS}=32\n", "array"),
    (f"export {CONNECTIONS}=1\n{CONNECTIONS}=(1)\n", "array"),
    (f"mapfile {CONNECTIONS} <<< 1\n", "array"),
])
def test_declarations_reached_through_command_builtin_a_prefix_or_as_arrays_are_read(tmp_path, setting, refused):
    """`command export CUDA_DEVICE_MAX_CONNECTIONS=32` (or builtin export) was read as a command started,
    `CUDA_DEVICE_MAX_CONNECTIONS=32 export CUDA_DEVICE_MAX_CONNECTIONS` as exporting nothing, and
    `declare -a CUDA_DEVICE_MAX_CONNECTIONS=32` as a scalar: bash runs the declaration (4.2 Bash Builtins),
    keeps the prefix the export names (3.7.4 Environment), and exports no array, so a tp 2 launch on H100
    was priced where validate_args stops it."""
    read_as_bash_does(tmp_path, "#!/bin/bash\n" + setting + TRAIN + "\n", refused)


@needs_bash
@pytest.mark.parametrize("declaration", ["readonly", "declare -r", "export"])
def test_a_prefix_a_readonly_names_is_exported_whatever_the_caller_exports(tmp_path, declaration):
    """`CUDA_DEVICE_MAX_CONNECTIONS=32 readonly CUDA_DEVICE_MAX_CONNECTIONS` before a tp 2 launch on H100 was
    refused as 32 "where the caller exports it, and absent where the caller does not": bash passes 32 either
    way (the temporary environment's variable is exported, and readonly's attribute carries it past the
    command with its export), as real bash with no caller's value shows."""
    script = f"#!/bin/bash\n{CONNECTIONS}=32 {declaration} {CONNECTIONS}\n{TRAIN}\n"
    assert bash_connections(tmp_path, script) == "32"
    case, args = files(tmp_path, script, BF16)
    with pytest.raises(CaseError) as error:
        diagnose(case, megatron_args=args)
    assert "'32' in the training's environment (the script sets it so)" in error.value.expected, str(error.value)


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f'eval "export {CONNECTIONS}=32"\n', "'32'"),
    (f"eval {CONNECTIONS}=32\n", "'32'"),  # set without export: the caller's export carries it
    (f'X=32\neval "{CONNECTIONS}=$X"\n', "'32'"),
    (f"eval 'f() {{ export {CONNECTIONS}=32; }}'\nf\n", "'32'"),
    (f"eval 'export {CONNECTIONS}=32' &\nwait\n", None),  # in its subshell
    (f"eval 'export {CONNECTIONS}=32; exit 0'\n", "exit"),  # exits the script: nothing launched
])
def test_an_eval_of_a_string_the_script_decides_is_run_as_bash_runs_it(tmp_path, setting, refused):
    """`eval "export CUDA_DEVICE_MAX_CONNECTIONS=32"` before a tp 2 launch on H100 was priced, exit 0, with a
    note that the eval is not evaluated: a string the script decides is read and run in the shell as bash
    runs it (Bash Reference Manual, 4.1 Bourne Shell Builtins: eval)."""
    script = "#!/bin/bash\n" + setting + TRAIN + "\n"
    if refused == "exit":
        case, args = files(tmp_path, script, BF16)
        with pytest.raises(CaseError, match="starts no command"):
            diagnose(case, megatron_args=args)
        return
    read_as_bash_does(tmp_path, script, refused)


@needs_bash
@pytest.mark.parametrize("setting", [
    f"source <(echo {CONNECTIONS}=32)\n",
    f". <(echo export {CONNECTIONS}=32)\n",
    f"trap '{CONNECTIONS}=32' DEBUG\n",
    f'eval "$(echo {CONNECTIONS}=32)"\n',
])
def test_what_may_set_the_variable_and_is_not_followed_is_said_naming_it(tmp_path, setting):
    """`source <(echo CUDA_DEVICE_MAX_CONNECTIONS=32)`, a DEBUG trap that sets it, an eval of a command's
    output: bash gives the tp 2 training 32, which the reader cannot follow without running anything; it
    was priced with no word of the variable (a trap, not even a note). Now a note names the variable and
    the line: its value could not be read."""
    script = "#!/bin/bash\n" + setting + TRAIN + "\n"
    assert bash_connections(tmp_path, script, caller="1") == "32"
    case, args = files(tmp_path, script, BF16)
    notes = diagnose(case, megatron_args=args).notes
    assert any("line 2: " in note and f"may set {CONNECTIONS}: its value could not be read" in note
               for note in notes), notes


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"read {CONNECTIONS} <<< 32\n", "'32'"),  # set without export: 32 where the caller exports it, else none
    (f"read -r {CONNECTIONS} REST <<< '32  8 9'\n", "'32'"),
    (f"read -r REST {CONNECTIONS} <<< '8 32'\n", "'32'"),
    (f"read {CONNECTIONS} <<< 1\n", None),
    (f"read -r {CONNECTIONS} REST <<< '1\u00a02 3'\n", "'1\\\\xa02'"),  # a no-break space is no IFS whitespace
])
def test_read_of_a_here_string_gives_the_training_what_bash_gives(tmp_path, setting, refused):
    """`read CUDA_DEVICE_MAX_CONNECTIONS <<< 32` before a tp 2 launch on H100 was read as empty (its input
    not followed) and priced, exit 0: bash reads the here-string's word (Bash Reference Manual, 3.6.7 Here
    Strings; 4.2 Bash Builtins: read), so the training gets 32 where the caller exports the name, else none."""
    read_as_bash_does(tmp_path, "#!/bin/bash\n" + setting + TRAIN + "\n", refused)


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"shopt -s lastpipe\ntrue | export {CONNECTIONS}=32\n", "'32'"),  # the pipeline's last part: this shell
    (f"shopt -s lastpipe\ntrue | {CONNECTIONS}=32\n", "'32'"),
    (f"shopt -s lastpipe\nshopt -u lastpipe\ntrue | export {CONNECTIONS}=32\n", None),
    (f"true | export {CONNECTIONS}=32\n", None),
    (f"shopt -s lastpipe\n(true | export {CONNECTIONS}=32)\n", None),
])
def test_under_lastpipe_a_pipelines_last_command_runs_in_the_shell(tmp_path, setting, refused):
    """`shopt -s lastpipe; true | export CUDA_DEVICE_MAX_CONNECTIONS=32` was read as an export in a subshell,
    so a tp 2 launch on H100 was priced: bash runs a pipeline's last command in the shell under lastpipe
    where job control is off, as in a script (Bash Reference Manual, 3.2.3 Pipelines)."""
    read_as_bash_does(tmp_path, "#!/bin/bash\n" + setting + TRAIN + "\n", refused)


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"set -k\n{TRAIN} {CONNECTIONS}=32\n", "'32'"),  # -k: the word is the launch's environment
    (f"set -o keyword\nexport {CONNECTIONS}=1\n{TRAIN} {CONNECTIONS}=32\n", "'32'"),
    (f"set -ek\n{TRAIN} {CONNECTIONS}=1\n", None),
    # a declaration's NAME=value words too: the export's own environment, gone after it
    (f"set -k\nexport {CONNECTIONS}=32\n{TRAIN}\n", None),
    (f"set -k\nreadonly {CONNECTIONS}=32\n{TRAIN}\n", None),
    (f"set -k\nexport {CONNECTIONS} {CONNECTIONS}=32\n{TRAIN}\n", "'32'"),  # ... but kept where it exports the name
])
def test_under_set_k_an_assignment_after_the_command_name_is_its_environment(tmp_path, setting, refused):
    """`set -k` then `torchrun ... CUDA_DEVICE_MAX_CONNECTIONS=32` was read with the assignment as an argument,
    refused naming --bf16 (a stray word after it) rather than the variable: bash puts every NAME=value word
    in the command's environment under -k (Bash Reference Manual, 4.3.1 The Set Builtin)."""
    read_as_bash_does(tmp_path, "#!/bin/bash\n" + setting, refused)


@needs_bash
def test_a_value_read_from_a_pipe_without_export_is_said_as_not_read_not_as_the_callers(tmp_path):
    """`shopt -s lastpipe; echo 32 | read CUDA_DEVICE_MAX_CONNECTIONS` gives the tp 2 training 32 where the
    caller exports the name (bash), a value the reader cannot read without running echo: the note said
    the script "takes CUDA_DEVICE_MAX_CONNECTIONS from the caller's environment (read as '')", which it
    does not; now it says the value set without export could not be decided, beside the read's note naming
    the line."""
    script = f"#!/bin/bash\nshopt -s lastpipe\necho 32 | read {CONNECTIONS}\n{TRAIN}\n"
    assert bash_connections(tmp_path, script, caller="1") == "32" and bash_connections(tmp_path, script) is None
    case, args = files(tmp_path, script, BF16)
    notes = [note for note in diagnose(case, megatron_args=args).notes if CONNECTIONS in note]
    assert any("line 3: read reads input, which is not followed" in note for note in notes), notes
    assert any("without export to a value the reading could not decide" in note for note in notes), notes
    assert not any("from the caller's environment" in note for note in notes), notes


def _hostile_lines(marker: Path) -> list[str]:
    """Every way a script's text could reach a command run for real: eval of a decided string and of an
    undecided one, a command and a process substitution, backquotes, a trap, source, bash -c, a here-document
    fed to bash, a function, a pipeline under lastpipe and a background job."""
    m = str(marker)
    return [f'eval "touch {m}.eval"', f"X='touch {m}.evalvar'\neval \"$X\"", f'eval "$(touch {m}.evalsub)"',
            f"Y=$(touch {m}.sub)", f"Z=`touch {m}.backquote`", f"trap 'touch {m}.trap' EXIT DEBUG ERR",
            f"source <(touch {m}.source)", f". /dev/stdin <<< 'touch {m}.dot'", f"bash -c 'touch {m}.bashc'",
            f"bash <<EOF\ntouch {m}.heredoc\nEOF", f"f() {{ touch {m}.function; }}\nf",
            f"shopt -s lastpipe\necho | touch {m}.pipe", f"touch {m}.background &",
            f"read CMD <<< 'touch {m}.read'\n$CMD", f"set -k\ntouch {m}.keyword X=1"]


def test_no_command_of_the_users_script_is_ever_run(tmp_path, monkeypatch):
    """diagnose reads a launch script; it never runs one of its commands. eval of a string the script decides
    is run only by the reader's own interpreter: each way a command could reach a real process (eval, $(...),
    backquotes, trap, source, bash -c, functions, pipelines, &) is read, and no file is created and no process
    started (subprocess, os.system, os.posix_spawn and fork refuse while it reads)."""
    started = []

    def refuse(*args, **kwargs):
        started.append(args)
        raise AssertionError(f"the reader started a process: {args!r}")

    for module, name in [(subprocess, "Popen"), (os, "system"), (os, "popen"), (os, "fork"), (os, "posix_spawn"),
                         (os, "posix_spawnp"), (os, "execv"), (os, "execve"), (os, "execvp")]:
        if hasattr(module, name):
            monkeypatch.setattr(module, name, refuse)
    marker = tmp_path / "ran"
    lines = _hostile_lines(marker)
    for line in lines:
        script = read_script(f"#!/bin/bash\n{line}\ntorchrun --nproc_per_node 8 pretrain_gpt.py --tp 1\n", "t.sh")
        assert any(c.fields[0] == "torchrun" for c in script.commands), line
    case, args = files(tmp_path, "#!/bin/bash\n" + "\n".join(lines) + "\n" + TRAIN + "\n", BF16)
    diagnose(case, megatron_args=args)
    monkeypatch.undo()
    assert not started and not list(tmp_path.glob("ran*"))


@needs_bash
@pytest.mark.parametrize("declaration", ["export -n", "declare +x", "typeset +x"])
@pytest.mark.parametrize("caller_exports", [True, False])
def test_a_prefix_an_unexporting_declaration_names_leaves_the_variable_as_it_was(tmp_path, declaration,
                                                                                  caller_exports):
    """`CUDA_DEVICE_MAX_CONNECTIONS=32 export -n CUDA_DEVICE_MAX_CONNECTIONS` (or `declare +x`) before a tp 2
    launch on H100 was refused as unset (8694d2a: as '32', exported): the declaration takes the export from the
    temporary variable alone, which goes with the command, so bash 5.2 passes the caller's 1 (real bash, its
    caller exporting 1, shows it), or the script's own exported 1."""
    before = "" if caller_exports else f"export {CONNECTIONS}=1\n"
    script = f"#!/bin/bash\n{before}{CONNECTIONS}=32 {declaration} {CONNECTIONS}\n{TRAIN}\n"
    assert bash_connections(tmp_path, script, caller="1" if caller_exports else None) == "1"
    read_as_bash_does(tmp_path, script, None)


@needs_bash
@pytest.mark.parametrize("script", [
    f"{CONNECTIONS}=32\nf() {{ local {CONNECTIONS}; {TRAIN}; }}\nf\n",
    f"f() {{ local -x {CONNECTIONS}; declare -g {CONNECTIONS}=32; {TRAIN}; }}\nf\n",
    f"{CONNECTIONS}=32\nf() {{ local {CONNECTIONS}; g; }}\ng() {{ local {CONNECTIONS}; {TRAIN}; }}\nf\n",
    f"{CONNECTIONS}=32\nf() {{ local +x {CONNECTIONS}=5; {TRAIN}; }}\nf\n",
])
def test_a_global_set_without_export_shows_through_a_functions_local_where_the_caller_exports_it(tmp_path, script):
    """`CUDA_DEVICE_MAX_CONNECTIONS=32; f() { local CUDA_DEVICE_MAX_CONNECTIONS; torchrun ...; }` at tp 2 on
    H100, the caller exporting 1, was read as passing 1, where bash passes 32: the global, set without export,
    is exported as the variable bash inherited from the caller, and bash builds a started command's
    environment from the exported variables of every scope, skipping a local that is unset (invisible) or
    not exported (variables.c: visible_and_exported); the reader looked for such a global among the current
    variables alone, not among those a function's locals hide. Without the caller's value bash passes none."""
    script = "#!/bin/bash\n" + script
    assert bash_connections(tmp_path, script) is None
    read_as_bash_does(tmp_path, script, "'32'")


@needs_bash
@pytest.mark.parametrize("before, refused", [
    ("", "'32'"),  # exported where the caller exports the name, as the script's own X=32 is
    (f"{CONNECTIONS}=5\n", "'32'"),
    (f"export {CONNECTIONS}=1\n", "'32'"),  # the global's export attribute is kept
    (f"declare +x {CONNECTIONS}\n", "unset"),  # ... and its lack of one
])
@pytest.mark.parametrize("declaration", ["declare -r +x", "typeset -r +x", "declare +x -r", "declare +x -rx",
                                         "declare -gr +x"])
def test_a_prefix_a_readonly_unexporting_declaration_names_is_the_variables_value_its_export_as_it_was(
        tmp_path, before, refused, declaration):
    """`CUDA_DEVICE_MAX_CONNECTIONS=32 declare -r +x CUDA_DEVICE_MAX_CONNECTIONS` before a tp 2 launch on H100
    was read as unset, where bash 5.2 passes 32 wherever the variable was exported (by the caller too): the
    declaration works on the temporary variable, whose readonly attribute carries its value past the command
    into the global (variables.c, push_temp_var: bind_variable, then the temporary's attributes added), and
    +x took the export from the temporary alone, so the global keeps its own export attribute. Real bash is
    the oracle, with the caller's 1 and without. +x wins over a -x; declare -g works on the global itself,
    which +x unexports, and leaves the temporary 32 to go with the command: none passed."""
    script = f"#!/bin/bash\n{before}{CONNECTIONS}=32 {declaration} {CONNECTIONS}\n{TRAIN}\n"
    if "g" in declaration:
        refused = "unset"
    assert bash_connections(tmp_path, script) == ("32" if before.startswith("export") and refused != "unset"
                                                  else None)
    read_as_bash_does(tmp_path, script, refused)


@needs_bash
@pytest.mark.parametrize("declaration", ["declare +x -x", "declare -x +x", "typeset +x -x", "declare +x -rx"])
def test_declare_plus_x_unexports_whatever_the_order_of_its_options(tmp_path, declaration):
    """`export CUDA_DEVICE_MAX_CONNECTIONS=32; declare +x -x CUDA_DEVICE_MAX_CONNECTIONS` before a tp 2 launch on
    H100 was read as passing 32 (the last option won), where bash 5.2 takes the export attribute off whatever
    the order (declare.c sets the -x attributes on, then takes the +x ones off): the training gets nothing."""
    script = f"#!/bin/bash\nexport {CONNECTIONS}=32\n{declaration} {CONNECTIONS}\n{TRAIN}\n"
    assert bash_connections(tmp_path, script, caller="1") is None
    read_as_bash_does(tmp_path, script, "unset")


@needs_bash
@pytest.mark.parametrize("unexport", ["export -n", "declare +x", "typeset +x"])
def test_unexporting_a_value_set_without_export_takes_the_callers_export_away_too(tmp_path, unexport):
    """`CUDA_DEVICE_MAX_CONNECTIONS=32; export -n CUDA_DEVICE_MAX_CONNECTIONS` before a tp 2 launch on H100 was
    read as passing 32 where the caller exports the name (the value set without export kept its "exported
    where the caller exported it"), where bash takes the export attribute the variable inherited away: the
    training gets nothing, whatever the caller exported."""
    script = f"#!/bin/bash\n{CONNECTIONS}=32\n{unexport} {CONNECTIONS}\n{TRAIN}\n"
    assert bash_connections(tmp_path, script, caller="1") is None
    read_as_bash_does(tmp_path, script, "unset")


def read_as_bash_gives(tmp_path: Path, script: str):
    """:func:`read_as_bash_does`, refused exactly as real bash (its caller exporting 1) gives the training
    another value: naming the value it gives, or "unset"."""
    given = bash_connections(tmp_path, script, caller="1")
    read_as_bash_does(tmp_path, script, None if given == "1" else "unset" if given is None else repr(given))


@needs_bash
@pytest.mark.parametrize("before", ["", f"export {CONNECTIONS}=1\n", f"{CONNECTIONS}=5\n"])
@pytest.mark.parametrize("declaration", ["declare -r +x", "declare +x", "local -r +x", "local +x -x", "declare -r",
                                         "local", "declare -x", "local -a", "declare -gr +x", "declare -gx"])
@pytest.mark.parametrize("where", ["in", "after"])
def test_a_prefix_a_functions_declaration_names_is_the_local_it_makes(tmp_path, before, declaration, where):
    """Inside a function, `CUDA_DEVICE_MAX_CONNECTIONS=32 declare -r +x CUDA_DEVICE_MAX_CONNECTIONS` before a tp 2
    launch on H100 was refused as passing 32, where bash passes the exported global's 1: the declaration makes
    a local of the temporary variable (value 32, exported but for +x, an empty array under -a), the global
    left as it was; under -g it works on the global, and the temporary goes with the command. Real bash is the
    oracle, in the function and after it returns."""
    call = f"f() {{ {CONNECTIONS}=32 {declaration} {CONNECTIONS}; {TRAIN if where == 'in' else ':'}; }}\nf\n"
    read_as_bash_gives(tmp_path, f"#!/bin/bash\n{before}{call}{TRAIN if where == 'after' else ''}\n")


@needs_bash
@pytest.mark.parametrize("declaration", ["declare -gx", "declare -g +x", "declare -gr"])
def test_a_prefix_of_a_global_declaration_goes_with_the_command(tmp_path, declaration):
    """`export CUDA_DEVICE_MAX_CONNECTIONS=1; CUDA_DEVICE_MAX_CONNECTIONS=32 declare -gx CUDA_DEVICE_MAX_CONNECTIONS`
    was read as passing 32, where declare -g works on the global itself (bash 5.2): it passes 1 (and +x takes
    the global's export off)."""
    read_as_bash_gives(tmp_path, f"#!/bin/bash\nexport {CONNECTIONS}=1\n{CONNECTIONS}=32 {declaration} {CONNECTIONS}\n"
                                 f"{TRAIN}\n")


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f'V="7  8"\n{CONNECTIONS}=(a "b  c" $V) {TRAIN}\n', "'(a b  c 7  8)'"),  # the string of the words, as bash has it
    (f"f() {{ {TRAIN}; }}\n{CONNECTIONS}=(4 5) f\n", "'(4 5)'"),  # a function call's prefix too
    (f"{CONNECTIONS}=(4 5) export {CONNECTIONS}\n{TRAIN}\n", "'(4 5)'"),  # ... and one an export carries past it
])
def test_an_array_prefix_of_a_command_is_the_string_of_its_words(tmp_path, setting, refused):
    """`CUDA_DEVICE_MAX_CONNECTIONS=(4 5) torchrun ...` was read as passing nothing of the prefix (the caller's 1
    kept: no refusal), where bash puts the string "(4 5)" in the command's environment (parse.y joins the
    compound assignment's words, which the temporary environment takes as a string)."""
    read_as_bash_does(tmp_path, "#!/bin/bash\n" + setting, refused)


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"set -k\nexport {CONNECTIONS}=(4 5)\n{TRAIN}\n", None),  # the export's own environment, gone after it
    (f"set -k\nexport {CONNECTIONS}=32 B=(4 5)\n{TRAIN}\n", None),
    (f"set -k\nexport {CONNECTIONS} {CONNECTIONS}=(4 5)\n{TRAIN}\n", "'(4 5)'"),  # kept where it exports the name
    (f"set -k\ndeclare -a {CONNECTIONS}=(4 5)\n{TRAIN}\n", None),
])
def test_under_set_k_a_declarations_array_words_are_its_environment(tmp_path, setting, refused):
    """`set -k; export CUDA_DEVICE_MAX_CONNECTIONS=(4 5)` was read as making the name an array (refused as unset
    in the training's environment), where under -k bash takes every assignment word out of the command's
    arguments, an array's too, into the declaration's own temporary environment: nothing is set after it."""
    read_as_bash_does(tmp_path, "#!/bin/bash\n" + setting, refused)


@needs_bash
@pytest.mark.parametrize("setting, exported", [
    (f"export {CONNECTIONS}\n{CONNECTIONS}=32\n", True),  # exported before it had a value
    (f"declare -x {CONNECTIONS}\n{CONNECTIONS}=32\n", True),
    (f"f() {{ export {CONNECTIONS}; }}\nf\n{CONNECTIONS}=32\n", True),
    (f"export {CONNECTIONS}\nunset {CONNECTIONS}\n{CONNECTIONS}=32\n", False),  # the unset takes the attribute too
    (f"( export {CONNECTIONS} )\n{CONNECTIONS}=32\n", False),  # a subshell's export is its own
])
def test_a_name_exported_before_it_is_set_passes_the_value_it_is_given(tmp_path, setting, exported):
    """`export CUDA_DEVICE_MAX_CONNECTIONS` then `CUDA_DEVICE_MAX_CONNECTIONS=32`, the caller exporting nothing,
    was read as passing 32 only where the caller exports the name, where bash keeps the export attribute on the
    unset variable, so the training gets 32 whatever the caller did. Real bash is the oracle."""
    script = f"#!/bin/bash\n{setting}{TRAIN}\n"
    assert bash_connections(tmp_path, script) == ("32" if exported else None)
    read_as_bash_gives(tmp_path, script)
    launch = [c for c in read_script(script, "train.sh").commands if c.fields[0] == "torchrun"][0]
    assert environment_value(launch.environment, CONNECTIONS) == (
        ("32", True, False) if exported else (None, True, False) if "unset" in setting else ("32", True, True))


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f'setenv() {{ export "$1=$2"; }}\nsetenv {CONNECTIONS} 32\n', "'32'"),
    (f'ENVS=({CONNECTIONS}=32 TORCH_NCCL_AVOID_RECORD_STREAMS=1)\nexport "${{ENVS[@]}}"\n', "'32'"),
    (f'S="{CONNECTIONS}=1"\nexport $S\n', None),
    (f'f() {{ declare -gx "{CONNECTIONS}=$1"; }}\nf 32\n', "'32'"),
])
def test_a_declarations_expanded_assignment_words_assign(tmp_path, setting, refused):
    """`setenv() { export "$1=$2"; }; setenv CUDA_DEVICE_MAX_CONNECTIONS 32` (or `export "${ENVS[@]}"`) was read
    as leaving the variable to the caller, where bash expands the builtin's words first and assigns each that
    reads NAME=value: the training gets 32."""
    read_as_bash_does(tmp_path, "#!/bin/bash\n" + setting + TRAIN + "\n", refused)


def test_a_declarations_expanded_value_is_not_expanded_twice_and_keeps_what_it_read():
    """The value an expanded word gives is the value (a $ in it stays), and one that read a variable the
    script does not set is not decided."""
    script = ("#!/bin/bash\nV='$HOME'\nexport \"X=$V\"\nexport \"Y=$UNSET\"\n"
              "torchrun --nproc_per_node 8 pretrain_gpt.py\n")
    launch = read_script(script, "t.sh").commands[0]
    assert environment_value(launch.environment, "X") == ("$HOME", True, False)
    assert environment_value(launch.environment, "Y") == ("", False, False)


@needs_bash
def test_read_of_a_here_string_into_one_name_takes_the_whole_line(tmp_path):
    """`read -r EXTRA <<< "  --lr 1e-4  --bf16  "` was read as EXTRA=--lr (re.split's maxsplit 0 is no limit),
    where bash gives the one name the line, its leading and trailing blanks stripped: "--lr 1e-4  --bf16"."""
    script = '#!/bin/bash\nread -r EXTRA <<< "  --lr 1e-4  --bf16  "\ntorchrun pretrain_gpt.py "$EXTRA"\n'
    assert bash_words(tmp_path, script) == [["pretrain_gpt.py", "--lr 1e-4  --bf16"]]
    assert launched(script) == ["pretrain_gpt.py", "--lr 1e-4  --bf16"]


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"{CONNECTIONS}=32 eval '{TRAIN}'\n", "'32'"),  # the eval's prefix is its commands' environment
    (f"{CONNECTIONS}=32 eval 'true'\n{TRAIN}\n", None),  # ... for the eval alone
    (f"{CONNECTIONS}=32 eval 'export {CONNECTIONS}'\n{TRAIN}\n", None),
])
def test_an_evals_prefix_is_the_environment_of_what_it_runs(tmp_path, setting, refused):
    """`CUDA_DEVICE_MAX_CONNECTIONS=32 eval 'torchrun ...'` was read as passing the caller's 1, the prefix dropped,
    where bash puts it in the temporary environment the eval's commands run in (and drops it after)."""
    read_as_bash_does(tmp_path, "#!/bin/bash\n" + setting, refused)


@needs_bash
@pytest.mark.parametrize("body, refused", [
    (f"local -x {CONNECTIONS}=32; local {CONNECTIONS}; {TRAIN}", "'32'"),  # the second local keeps the first's 32
    (f"local {CONNECTIONS}=32; local {CONNECTIONS}; {CONNECTIONS}+=0; {TRAIN}", "'320'"),
])
def test_a_second_local_of_a_name_keeps_the_value_the_call_gave_it(tmp_path, body, refused):
    """`f() { local -x CUDA_DEVICE_MAX_CONNECTIONS=32; local CUDA_DEVICE_MAX_CONNECTIONS; torchrun ...; }` was read
    as passing the exported global's 1 (the second local unset the first), where bash's local of a name the
    call already made local changes nothing of its value: the training gets 32."""
    read_as_bash_does(tmp_path, f"#!/bin/bash\nexport {CONNECTIONS}=1\nf() {{ {body}; }}\nf\n", refused)


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"{CONNECTIONS}=1 V=32\nexport {CONNECTIONS}=$V V=${CONNECTIONS}\n", "'32'"),
    (f"V=32\nexport V=1 {CONNECTIONS}=$V\n", "'32'"),  # the V it reads is the one before the export's
    (f"V=1\nf() {{ local V=32 {CONNECTIONS}=$V; export {CONNECTIONS}; {TRAIN}; }}\nf\n", None),
])
def test_a_declarations_words_are_all_expanded_before_it_assigns(tmp_path, setting, refused):
    """`V=32; export V=1 CUDA_DEVICE_MAX_CONNECTIONS=$V` was read as passing 1 (each word expanded after the one
    before it was assigned), where bash expands all the builtin's words first: the training gets 32."""
    script = f"#!/bin/bash\n{setting}" + ("" if "f()" in setting else f"{TRAIN}\n")
    read_as_bash_does(tmp_path, script, refused)


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"declare -i {CONNECTIONS}\ndeclare +i {CONNECTIONS}\n{CONNECTIONS}=0+1\n", "'0+1'"),  # a string again
    (f"declare -i {CONNECTIONS}\n{CONNECTIONS}=0+1\n", None),
    (f"declare -l V\ndeclare +l V\nV=ON\n{CONNECTIONS}=$V\n", "'ON'"),
])
def test_declare_plus_i_and_plus_l_take_the_attribute_off(tmp_path, setting, refused):
    """`declare -i CUDA_DEVICE_MAX_CONNECTIONS; declare +i CUDA_DEVICE_MAX_CONNECTIONS; CUDA_DEVICE_MAX_CONNECTIONS=0+1`
    was read as 1 (still evaluated as arithmetic), where bash's +i takes the integer attribute off: the value is
    the string "0+1" (and +l, +u, the case it is stored in)."""
    read_as_bash_does(tmp_path, f"#!/bin/bash\nexport {CONNECTIONS}\n{setting}{TRAIN}\n", refused)


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"{CONNECTIONS}=32 {TRAIN}\n", None),  # the prefix fails; the command runs with the readonly 1
    (f"export {CONNECTIONS}=32\n{TRAIN}\n", None),
    (f"{CONNECTIONS}=32\n{TRAIN}\n", None),  # the line is abandoned, the script goes on
    (f"unset {CONNECTIONS}\n{TRAIN}\n", None),
    (f"f() {{ {CONNECTIONS}=32; }}\nf\n{TRAIN}\n", None),
])
def test_a_readonly_variable_keeps_its_value(tmp_path, setting, refused):
    """`readonly CUDA_DEVICE_MAX_CONNECTIONS=1` then `CUDA_DEVICE_MAX_CONNECTIONS=32 torchrun ...` (or an export,
    an assignment, an unset of it) was read as passing 32, where bash refuses to assign or unset a readonly
    variable: the training gets 1."""
    read_as_bash_does(tmp_path, f"#!/bin/bash\nexport {CONNECTIONS}=1\nreadonly {CONNECTIONS}\n{setting}", refused)


@needs_bash
@pytest.mark.parametrize("line", ["torchrun pretrain_gpt.py A=(1 2) --bf16", "command export A=(1 2)",
                                  "env A=(1 2) torchrun pretrain_gpt.py"])
def test_an_array_word_after_a_commands_name_is_a_syntax_error_as_in_bash(tmp_path, line):
    """`torchrun pretrain_gpt.py A=(1 2) --bf16` was read as a launch with the word "A=", where bash refuses to
    parse a NAME=(...) word but among a command's prefixes or a declaration's words (export A=(1 2))."""
    (tmp_path / "s.sh").write_text(f"#!/bin/bash\n{line}\n")
    run = subprocess.run([BASH, "-n", str(tmp_path / "s.sh")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "syntax error" in run.stderr
    with pytest.raises(ScriptSyntax):
        read_script(f"#!/bin/bash\n{line}\n", "s.sh")
    assert [c.fields for c in read_script("#!/bin/bash\nX=1 export A=(1 2)\ntorchrun \"${A[@]}\"\n", "s.sh").commands] \
        == [("torchrun", "1", "2")]


@needs_bash
@pytest.mark.parametrize("setting", [
    f"f() {{ local {CONNECTIONS}=32; export {CONNECTIONS}; {TRAIN}; }}\nf\n",  # local of a readonly global fails
    f"f() {{ local {CONNECTIONS}; {CONNECTIONS}=32 {TRAIN}; }}\nf\n",
    f"readonly {CONNECTIONS}=1 {CONNECTIONS}=32\n{TRAIN}\n",  # readonly from its own first word on
    f"declare {CONNECTIONS}=32 OTHER=1\n{TRAIN}\n",
    f"f() {{ {TRAIN}; }}\n{CONNECTIONS}=32 f\n",  # a function's prefix fails; the function runs
])
def test_a_readonly_variable_keeps_its_value_in_a_call_and_a_declaration(tmp_path, setting):
    """Past `readonly CUDA_DEVICE_MAX_CONNECTIONS=1`, a function's `local CUDA_DEVICE_MAX_CONNECTIONS=32`, a
    function call's `CUDA_DEVICE_MAX_CONNECTIONS=32 f` prefix and a `readonly X=1 X=32` were read as passing 32
    (refused), where bash refuses each of them ("readonly variable") and the training gets 1."""
    read_as_bash_does(tmp_path, f"#!/bin/bash\nexport {CONNECTIONS}=1\nreadonly {CONNECTIONS}\n{setting}", None)


@needs_bash
@pytest.mark.parametrize("script, refused", [
    # the prefix fails; the command runs with the readonly local's value
    (f"f() {{ local -x {CONNECTIONS}=1; declare -r {CONNECTIONS}; {CONNECTIONS}=32 {TRAIN}; }}\nf\n", None),
    (f"f() {{ local -x {CONNECTIONS}=1; readonly {CONNECTIONS}; {CONNECTIONS}=32 {TRAIN}; }}\nf\n", None),
    # the assignment fails: bash abandons the line that called f, and the script goes on
    (f"f() {{ local -x {CONNECTIONS}=1; declare -r {CONNECTIONS}; {CONNECTIONS}=32; {TRAIN}; }}\nf\n{TRAIN}\n",
     None),
    (f"export {CONNECTIONS}=1\nf() {{ local -r {CONNECTIONS}=1; g; }}\ng() {{ {CONNECTIONS}=32; {TRAIN}; }}\nf\n{TRAIN}\n",
     None),
    # unset fails, and a second local of it in its own call; a callee's new local hides it, as bash allows
    (f"f() {{ local -rx {CONNECTIONS}=32; unset {CONNECTIONS}; {TRAIN}; }}\nf\n", "'32'"),
    (f"f() {{ local -rx {CONNECTIONS}=32; local {CONNECTIONS}=1; {TRAIN}; }}\nf\n", "'32'"),
    (f"f() {{ local -rx {CONNECTIONS}=32; g; }}\ng() {{ local {CONNECTIONS}=1; {TRAIN}; }}\nf\n", None),
    # gone with its call: the global it hid is assigned after the return
    (f"f() {{ local -r {CONNECTIONS}=32; }}\nf\nexport {CONNECTIONS}=1\n{TRAIN}\n", None),
    # ... but readonly of a call's X=32 prefix, which bash keeps past the return, keeps it readonly too
    (f"f() {{ readonly {CONNECTIONS}; }}\n{CONNECTIONS}=32 f\n{CONNECTIONS}=1\n{TRAIN}\n", "'32'"),
])
def test_a_functions_readonly_local_keeps_its_value_in_its_call(tmp_path, script, refused):
    """`f() { local -x CUDA_DEVICE_MAX_CONNECTIONS=1; declare -r CUDA_DEVICE_MAX_CONNECTIONS;
    CUDA_DEVICE_MAX_CONNECTIONS=32; torchrun ...; }` was read as launching with 32, where bash refuses to assign
    the function's readonly local ("readonly variable") and abandons the line that called f, the launch in it
    never run; only readonly globals were followed (Bash Reference Manual, 4.2 Bash Builtins: declare, local)."""
    read_as_bash_does(tmp_path, f"#!/bin/bash\n{script}", refused)


@needs_bash
@pytest.mark.parametrize("script, refused", [
    (f"{CONNECTIONS}=()\n{CONNECTIONS}+=1 {TRAIN}\n", None),
    (f"{CONNECTIONS}=(3 2)\n{CONNECTIONS}+=2 {TRAIN}\n", "'32'"),
    (f"{CONNECTIONS}=(3 2)\n{CONNECTIONS}=1 {TRAIN}\n", None),
    (f"{CONNECTIONS}=(3)\n{CONNECTIONS}+=(2) {TRAIN}\n", "'3(2)'"),
    # the array itself is as it was after the command
    (f"{CONNECTIONS}=(3 2)\n{CONNECTIONS}+=1 true\n{CONNECTIONS}+=2 {TRAIN}\n", "'32'"),
    # a function call's prefix is the same string, the caller's array as it was after the call
    (f"f() {{ {TRAIN}; }}\n{CONNECTIONS}=(3 2)\n{CONNECTIONS}+=2 f\n", "'32'"),
    (f"f() {{ :; }}\n{CONNECTIONS}=(1 2)\n{CONNECTIONS}+=2 f\n{CONNECTIONS}+=3 {TRAIN}\n", "'13'"),
])
def test_an_arrays_prefix_passes_the_string_it_makes_of_element_zero(tmp_path, script, refused):
    """`CUDA_DEVICE_MAX_CONNECTIONS=(3 2); CUDA_DEVICE_MAX_CONNECTIONS+=2 torchrun ...` was read as passing no
    CUDA_DEVICE_MAX_CONNECTIONS (an array, which bash exports not), where bash's temporary environment holds a
    string: the array's element 0 appended to (or the prefix's value alone, for `=`), "32" here, exported to the
    command; the array is left as it was (bash's variables.c, assign_in_env)."""
    read_as_bash_does(tmp_path, f"#!/bin/bash\n{script}", refused)


@needs_bash
@pytest.mark.parametrize("env, word", [(f"env {CONNECTIONS}=32 -u {CONNECTIONS}", "-u"),
                                       (f"env {CONNECTIONS}=32 -- env", "--"),
                                       (f"env -i {CONNECTIONS}=32 --unset={CONNECTIONS}", f"--unset={CONNECTIONS}")])
def test_an_env_option_after_its_settings_is_the_command_it_runs(tmp_path, env, word):
    """`env CUDA_DEVICE_MAX_CONNECTIONS=32 -u CUDA_DEVICE_MAX_CONNECTIONS torchrun ...` was read as a launch
    without CUDA_DEVICE_MAX_CONNECTIONS, where GNU env reads no option after its first NAME=VALUE: it runs a
    command named -u, which fails (127), and no torchrun starts. Said in a note naming the line, the command
    not taken as a launch; a `|| torchrun ...` after it runs, as in bash."""
    assert bash_connections(tmp_path, f"{env} {TRAIN} || {TRAIN}\n", caller="1") == "1"
    read_as_bash_does(tmp_path, f"#!/bin/bash\n{env} {TRAIN} || {TRAIN}\n", None)
    result = read_script(f"#!/bin/bash\n{env} {TRAIN}\n", "t.sh")
    assert result.commands == []
    assert any(n.text.startswith("t.sh: line 2: ") and f"runs a command named {word}" in n.text
               for n in result.notes), result.notes


@needs_bash
@pytest.mark.parametrize("script", [
    f"f() {{ {CONNECTIONS}=32 local -n {CONNECTIONS}; {TRAIN}; }}\nf\n",
    f"export {CONNECTIONS}=1\nf() {{ {CONNECTIONS}=32 local -n {CONNECTIONS}; {TRAIN}; }}\nf\n",
    f"export {CONNECTIONS}=1\nf() {{ {CONNECTIONS}=32 declare -n -x {CONNECTIONS}; {TRAIN}; }}\nf\n",
    f"export {CONNECTIONS}=1\nf() {{ local -n -x {CONNECTIONS}; {TRAIN}; }}\nf\n",
])
def test_a_name_reference_is_said_where_a_prefix_or_an_export_comes_with_it(tmp_path, script):
    """`f() { CUDA_DEVICE_MAX_CONNECTIONS=32 local -n CUDA_DEVICE_MAX_CONNECTIONS; torchrun ...; }` was read as
    launching with 32 (the prefix taken as the local's value, exported) and `local -n -x X` said nothing of the
    name reference, where bash takes the prefix's 32 as the name the reference refers to, which is none
    ("invalid variable name for name reference"), so the local fails and the training gets the caller's 1. Name
    references are not followed: the prefix stays the command's, and the note says so."""
    read_as_bash_does(tmp_path, f"#!/bin/bash\n{script}", None)
    notes = [n.text for n in read_script(f"#!/bin/bash\n{script}", "t.sh").notes]
    assert any("-n (a name reference) is not followed" in n for n in notes), notes


@needs_bash
@pytest.mark.parametrize("script, refused", [
    (f"f() {{ local -rx {CONNECTIONS}=1; ( {CONNECTIONS}=32 ); {TRAIN}; }}\nf\n", None),
    (f"readonly {CONNECTIONS}=1\n( {CONNECTIONS}=32 ); export {CONNECTIONS}; {TRAIN}\n", None),
    (f"f() {{ local -rx {CONNECTIONS}=1; ( {CONNECTIONS}=32 ) || true; {TRAIN}; }}\nf\n", None),
    (f"export {CONNECTIONS}=1\n( x=$((a b)) ); {TRAIN}\n", None),
    # the subshell's own commands after the failure are not run
    (f"f() {{ local -rx {CONNECTIONS}=1; ( {CONNECTIONS}=32; {TRAIN} ); {TRAIN}; }}\nf\n", None),
    (f"export {CONNECTIONS}=1\n( {CONNECTIONS}=32; x=$((a b)); {TRAIN} ); {TRAIN}\n", None),
    (f"export {CONNECTIONS}=1\n( x=$((a b)) ); export {CONNECTIONS}=32; {TRAIN}\n", "'32'"),
])
def test_what_bash_fails_on_in_a_subshell_ends_the_subshell_alone(tmp_path, script, refused):
    """`f() { local -rx CUDA_DEVICE_MAX_CONNECTIONS=1; ( CUDA_DEVICE_MAX_CONNECTIONS=32 ); torchrun ...; }` was
    refused as starting no command ("bash abandons the rest of the line"), where bash's readonly-variable error
    (or a $((...)) it fails on) exits the subshell alone, status 1, and the torchrun after it starts with 1."""
    read_as_bash_does(tmp_path, f"#!/bin/bash\n{script}", refused)
    assert read_script(f"#!/bin/bash\n{script}", "t.sh").commands


@needs_bash
@pytest.mark.parametrize("script, refused", [
    (f"f() {{ local -rx {CONNECTIONS}=1; declare -g {CONNECTIONS}=32; }}\nf\nexport {CONNECTIONS}\n{TRAIN}\n", "'32'"),
    (f"f() {{ local -rx {CONNECTIONS}=1; declare -gx {CONNECTIONS}=32; }}\nf\n{TRAIN}\n", "'32'"),
    (f"f() {{ local -rx {CONNECTIONS}=1; g; }}\ng() {{ declare -gx {CONNECTIONS}=32; }}\nf\n{TRAIN}\n", "'32'"),
    # inside the call, the readonly local is still what the name reads
    (f"f() {{ local -rx {CONNECTIONS}=1; declare -gx {CONNECTIONS}=32; {TRAIN}; }}\nf\n", None),
    # a readonly global is refused to declare -g as to anything
    (f"readonly {CONNECTIONS}=1\nexport {CONNECTIONS}\nf() {{ declare -gx {CONNECTIONS}=32; }}\nf\n{TRAIN}\n", None),
])
def test_declare_g_sets_the_global_past_a_functions_readonly_local(tmp_path, script, refused):
    """`f() { local -rx CUDA_DEVICE_MAX_CONNECTIONS=1; declare -gx CUDA_DEVICE_MAX_CONNECTIONS=32; }; f; torchrun ...`
    was read as the declaration failing ("a readonly variable"), the launch after the call passing the caller's 1,
    where bash's declare -g sets the global, past the call's readonly local, and torchrun gets 32."""
    read_as_bash_does(tmp_path, f"#!/bin/bash\n{script}", refused)


@needs_bash
@pytest.mark.parametrize("script", [
    'A=([1]=64 [0]=--make-vocab-size-divisible-by); torchrun "${A[@]}"',
    'declare -a A=([2]=c [0]=a [1]=b); torchrun "${A[@]}" ${A[0]}',
    'A=([1]=y [0]=x [1]=z); torchrun "${A[@]}" ${#A[@]}',  # the last of an index given twice wins
    'A=([0]=x [1]=y); A+=(z); torchrun "${A[@]}"',
])
def test_an_arrays_literal_subscripts_order_its_elements_as_bash_does(tmp_path, script):
    """declare -a V=([1]=64 [0]=--make-vocab-size-divisible-by) is `--make-vocab-size-divisible-by 64` to bash: the
    reader took the words in the written order, `64 --make-vocab-size-divisible-by`, and diagnose refused the
    list ("--overlap-param-gather: takes no value, but '64' follows it") that bash runs. Dense literal
    subscripts now order the elements by index."""
    script += "\n"
    got = [list(c.fields[1:]) for c in read_script(script, str(tmp_path / "oracle.sh")).commands
           if c.fields[0] == "torchrun"]
    assert got == bash_words(tmp_path, script)


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"'export' {CONNECTIONS}=32\n", "'32'"),
    (f"\\export {CONNECTIONS}=32\n", "'32'"),
    (f'"declare" -x {CONNECTIONS}=32\n', "'32'"),
    (f"D=export; $D {CONNECTIONS}=32\n", "'32'"),
    (f"S='{CONNECTIONS}=32 OTHER=1'; 'export' $S\n", "'32'"),  # split, as any command's words
    (f"export {CONNECTIONS}=32; 'export' -n {CONNECTIONS}\n", "unset"),
    (f"'export' {CONNECTIONS}=1\n", None),
    (f"'readonly' X=1; export {CONNECTIONS}=$X\n", None),
])
def test_a_declaration_named_by_a_quoted_or_expanded_word_declares(tmp_path, setting, refused):
    """`'export' CUDA_DEVICE_MAX_CONNECTIONS=32` (or `\\export`, or `$D` holding export) was read as a command
    started, setting nothing, and a tp 2 launch on H100 was priced with no word, where bash's export builtin
    runs all the same (its words expanded as any command's) and validate_args stops the run."""
    read_as_bash_does(tmp_path, "#!/bin/bash\n" + setting + TRAIN + "\n", refused)


def reader_calls(tmp_path: Path, script: str) -> list[list[str]]:
    """The words the reader gives each torchrun of ``script``, as :func:`bash_words` gives bash's."""
    return [list(c.fields[1:]) for c in read_script(script, str(tmp_path / "oracle.sh")).commands
            if c.fields[0] == "torchrun"]


@needs_bash
@pytest.mark.parametrize("script", [
    "set -e\nfalse\ntorchrun a\n",
    "set -euo pipefail\nX=1\n[ -n \"$X\" ] && false\ntorchrun a\n",
    "set -o errexit\nX=0\n(( X++ ))\ntorchrun a\n",  # ((...)) of 0 fails, a classic of set -e
    "set -e\nf() { return 1; }\nf\ntorchrun a\n",
    "set -e\n( false )\ntorchrun a\n",
    "set -e\ntrue && { false; torchrun a; }\ntorchrun b\n",
    "set -eo pipefail\nfalse | true\ntorchrun a\n",
    # where bash ignores it: before the last && or ||, in a condition, under !, a compound command's status
    "set -e\nfalse || true\nfalse && true\n! true\ntorchrun a\n",
    "set -e\nf() { false; torchrun a; }\nf || true\nif f; then torchrun b; fi\n",
    "set -e\n{ false && true; }\nfor i in 1; do false && true; done\ntorchrun a\n",
    "set -e\nfalse | true\ntorchrun a\n",  # without pipefail: the last command's status
    "set -e\nset +e\nfalse\ntorchrun a\n",
    "set -e\n( set +e; false; torchrun a )\nfalse || torchrun b\n",
    "(set -e; false; torchrun a)\nfalse\ntorchrun b\n",  # set -e in a subshell stays there
    "set -e\nfalse &\ntorchrun a\n",  # a background command's status is 0
])
def test_set_e_ends_the_script_where_bash_ends_it(tmp_path, script):
    """`set -e` (`set -euo pipefail`, the head of most launch scripts) was not followed: a command that fails
    ends the script in bash (Bash Reference Manual, 4.3.1 The Set Builtin: -e, and where it is ignored), and
    the reader went on to read the launch after it, which bash never starts."""
    assert reader_calls(tmp_path, script) == bash_words(tmp_path, script)


def test_under_set_e_what_the_caller_decides_or_no_command_run_decides_is_read_as_going_on():
    """A failure that owes to what the caller sets (an argument, an exported variable, read as empty) or to a
    command not run (a file read, grep) is read the way that does not exit, as a guard is: `set -e;
    [ -n "$DATA" ]` ends the script only where the caller leaves DATA unset, which is said."""
    script = read_script("set -e\n[ -n \"$DATA\" ]\ngrep -q x log\nread -r A < conf\nshift\ntorchrun a\n", "t.sh")
    assert [c.fields for c in script.commands if c.fields[0] == "torchrun"] == [("torchrun", "a")]
    assert any("line 2" in n.text and "DATA" in n.text and "set -e" in n.text for n in script.notes), script.notes


@pytest.mark.parametrize("launch, refused", [
    # sudoers(5): env_reset is on by default, the command gets a minimal environment of sudo's own
    (f"sudo {TRAIN}", CONNECTIONS),
    (f"sudo -u trainer -H {TRAIN}", CONNECTIONS),
    (f"sudo -uE {TRAIN}", CONNECTIONS),  # -u takes the rest of its word: a user named E
    (f"sudo -iE {TRAIN}", CONNECTIONS),  # a login shell resets it whatever -E asks
    # sudo(8): -E, --preserve-env keep the caller's environment; NAME=VALUE words are set in the command's
    (f"sudo -E {TRAIN}", None),
    (f"sudo --preserve-env -u trainer {TRAIN}", None),
    (f"sudo --preserve-env={CONNECTIONS},PATH {TRAIN}", None),
    (f"sudo {CONNECTIONS}=1 {TRAIN}", None),
    (f"sudo -u trainer -- env {CONNECTIONS}=1 {TRAIN}", None),
    (f"srun -N 1 sudo -E {TRAIN}", None),
])
def test_sudo_starts_the_launch_in_the_environment_sudo_gives_it(tmp_path, launch, refused):
    """`export CUDA_DEVICE_MAX_CONNECTIONS=1; sudo torchrun ...` (tp 2, H100) was read as passing the export
    through sudo, which starts the command in a reset environment by default (sudoers(5): env_reset), so the
    training runs without the setting Megatron-LM asserts: now refused naming it, as sudo -E (sudo(8): "preserve
    their existing environment variables") and sudo's own NAME=VALUE words are read as passing it."""
    script = f"#!/bin/bash\nexport {CONNECTIONS}=1\n{launch}\n"
    case, args = files(tmp_path, script, BF16)
    if refused:
        with pytest.raises(CaseError) as error:
            diagnose(case, megatron_args=args)
        assert error.value.key == CONNECTIONS, str(error.value)
        assert any("env_reset" in n.text for n in read_script(script, "train.sh").notes)
    else:
        assert diagnose(case, megatron_args=args).estimate.job.layout.tp == 2


def _read_cases(count: int) -> str:
    """A script of ``count`` reads of here-strings, each torchrun then given what the read set: random lines of
    fields, blanks, IFS characters and backslashes, under several IFS, options and numbers of names."""
    import random

    rng = random.Random(44)
    lines = []
    for k in range(count):
        word = "".join(rng.choice(["a", "b7", " ", "  ", ",", ":", "\t", "\\", "\n", "x y"])
                       for _ in range(rng.randint(0, 9)))
        ifs = rng.choice(["", "IFS=, ", "IFS=', ' ", "IFS=: ", "IFS= ", "IFS=$'\\t' "])
        options = rng.choice(["-r", "", "-r -d :", "-rd ''", "-n 3 -r", "-N 4", "-r -p x -t 5"])
        if k % 5 == 0:
            lines.append(f"unset A; {ifs}read {options} -a A <<< '{word}' && S=0 || S=1; torchrun \"$S\" \"${{#A[@]}}\" \"${{A[@]}}\"")
        else:
            names = " ".join(["V1", "V2", "V3"][:rng.randint(0, 3)])
            shown = " ".join(f'"${{{n}-unset}}"' for n in (names.split() or ["REPLY"]))
            lines.append(f"unset V1 V2 V3 REPLY; {ifs}read {options} {names} <<< '{word}' && S=0 || S=1; torchrun \"$S\" {shown}")
    return "\n".join(lines) + "\n"


@needs_bash
def test_read_of_a_here_string_splits_as_bash_splits_it(tmp_path):
    """`read -ra ARR <<< "$LIST"`, `IFS=, read -r A B <<< "$PAIR"` and `read -d ''` were not followed (or, for
    an IFS prefix, split on blanks, silently): each read of a here-string the script decides now sets what bash
    sets, with the status bash leaves, on 300 random lines checked against bash itself."""
    script = _read_cases(300)
    assert reader_calls(tmp_path, script) == bash_words(tmp_path, script)


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"env -S 'OTHER=\"a b\" {CONNECTIONS}=32' {TRAIN}\n", "'32'"),  # env's own quotes keep "a b" one word
    (f"env -S \"OTHER='a b' {CONNECTIONS}=32\" {TRAIN}\n", "'32'"),
    (f"env -S 'OTHER=a\\_{CONNECTIONS}=32' {TRAIN}\n", "'32'"),  # \_ outside quotes: a separator
    (f"env -S 'OTHER=\"a\\_b\" {CONNECTIONS}=1 # a comment' {TRAIN}\n", None),
    (f"env -vS '{CONNECTIONS}=32' {TRAIN}\n", "'32'"),
])
def test_env_s_splits_its_string_as_env_splits_it(tmp_path, setting, refused):
    """`env -S 'OTHER="a b" CUDA_DEVICE_MAX_CONNECTIONS=32' torchrun ...` was split on blanks alone, so `b"` was
    read as the command env starts and the 32 never reached the tp 2 training, priced: coreutils' env splits -S's
    string with quotes and escapes of its own (env --help; env.c's split_string), passing 32."""
    read_as_bash_does(tmp_path, "#!/bin/bash\n" + setting, refused)


@needs_bash
def test_env_0_with_a_command_starts_nothing(tmp_path):
    """`env -0 X=1 torchrun ...` was read as starting torchrun: coreutils' env refuses a command with -0 ("cannot
    specify --null (-0) with command", status 125), so bash starts only the launch after it."""
    script = "env -0 X=1 torchrun a\nenv --null torchrun b\nenv -0 torchrun c || torchrun d\n"
    assert reader_calls(tmp_path, script) == bash_words(tmp_path, script) == [["d"]]


@needs_bash
@pytest.mark.parametrize("script", [
    "env -S 'torchrun a --b 1'\n",
    "env -S 'torchrun --nproc_per_node 4' a\nenv -vS'torchrun b' c\nenv --split-string='X=1 torchrun' d\n",
    "nohup env --split-string 'torchrun -u' e 2>/dev/null\n",
])
def test_env_s_starts_the_program_its_string_names(tmp_path, script):
    """`env -S 'torchrun ...' pretrain_gpt.py` kept the string one word, so the program env starts from it (and
    torchrun's flags in it) were not among the launch's words: coreutils' env reads -S's words as its own, the
    first that is no option or NAME=VALUE the program it runs. The oracle: bash running the script, env starting
    a torchrun on PATH that writes its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text("#!/bin/sh\nprintf '%s\\0' \"$@\" >> \"$CALLS\"; printf '\\1' >> \"$CALLS\"\n")
    (bin_dir / "torchrun").chmod(0o755)
    (tmp_path / "t.sh").write_text(script)
    calls = tmp_path / "calls"
    calls.write_text("")
    subprocess.run([BASH, str(tmp_path / "t.sh")], cwd=tmp_path, timeout=60, capture_output=True,
                   env={"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "CALLS": str(calls)})
    ran = [call.split("\0")[:-1] for call in calls.read_text().split("\1")[:-1]]
    read = [list(c.fields[c.fields.index("torchrun") + 1:]) for c in read_script(script, "t.sh").commands]
    assert read == ran


@pytest.mark.parametrize("launch, nproc_refused", [
    (f"env -S '{TRAIN}'", False),
    (f"env -S '{TRAIN.split(' pretrain_gpt.py')[0]}' pretrain_gpt.py{TRAIN.split('pretrain_gpt.py')[1]}", False),
    (f"env -S '{TRAIN.split(' pretrain_gpt.py')[0].replace('8', '4')}' pretrain_gpt.py{TRAIN.split('pretrain_gpt.py')[1]}", True),
])
def test_env_s_launch_is_read_as_the_program_it_starts(tmp_path, launch, nproc_refused):
    """The whole launch in `env -S '...'` found no pretrain_gpt.py and was refused for a --micro-batch-size it
    sets; torchrun's `--nproc_per_node 4` inside the string went unseen and 4 processes were priced as 8. Read as
    env starts it (env -S 'A B' C is env A B C), the tp 2 launch is read, and the 4 processes refused as torchrun
    launched without -S is: exit 2, one line naming the file and --nnodes."""
    case, args = files(tmp_path, "#!/bin/bash\n" + launch + "\n", BF16)
    if not nproc_refused:
        assert diagnose(case, megatron_args=args).estimate.job.layout.tp == 2
        return
    result = run_cli("diagnose", str(case), "--megatron-args", str(args))
    assert result.returncode == 2 and result.stdout == "", result
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert str(args) in result.stderr and "--nnodes" in result.stderr and "4 GPUs" in result.stderr, result.stderr


def test_env_s_whose_string_env_expands_is_refused_naming_the_line(tmp_path):
    """env -S expands ${NAME} from env's own environment, which the reading does not follow: the launch's words
    and environment would be guessed, so the script is refused, exit 2, one line naming the file, the line and
    the construct."""
    case, args = files(tmp_path, f"#!/bin/bash\nexport {CONNECTIONS}=1\nenv -S 'X=${{HOME}}' {TRAIN}\n", BF16)
    result = run_cli("diagnose", str(case), "--megatron-args", str(args))
    assert result.returncode == 2 and result.stdout == "", result
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert str(args) in result.stderr and "line 3" in result.stderr and "env -S" in result.stderr, result.stderr


@needs_bash
@pytest.mark.parametrize("setting", [f"{CONNECTIONS}[0]=32 ", f"export {CONNECTIONS}=1\n{CONNECTIONS}[0]=32 ",
                                     f"set -k\nexport {CONNECTIONS}=1\n{TRAIN} {CONNECTIONS}[0]=32\n#"])
def test_an_indexed_prefix_is_refused_by_bash_and_the_command_runs_without_it(tmp_path, setting):
    """`CUDA_DEVICE_MAX_CONNECTIONS[0]=32 torchrun ...` was read as taking the variable out of the tp 2 launch's
    environment (refused, 'unset'): bash refuses an indexed prefix ("not a valid identifier") and runs the
    command with the environment as it was, the caller's exported 1 passed."""
    read_as_bash_does(tmp_path, "#!/bin/bash\n" + setting + TRAIN + "\n", None)


@needs_bash
def test_an_indexed_prefix_of_a_function_call_or_eval_sets_nothing(tmp_path):
    """`A[1]=x f` was read as setting A[1] for the call: bash refuses the prefix and calls f with A as it was."""
    script = "A=(1 2)\nf() { torchrun \"${A[@]}\"; }\nA[1]=x f\nA[0]=y eval 'torchrun \"${A[@]}\"'\nA[0]=z :\n" \
             "torchrun \"${A[@]}\"\n"
    assert reader_calls(tmp_path, script) == bash_words(tmp_path, script) == [["1", "2"]] * 3


@needs_bash
@pytest.mark.parametrize("setting, refused", [
    (f"select C in a b; do break; done </dev/null; export {CONNECTIONS}=32\n", "'32'"),
    (f"select C in a b\ndo export {CONNECTIONS}=32; done </dev/null\n", None),  # no choice read: no body run
])
def test_a_select_loop_is_parsed_and_what_follows_it_on_its_line_is_read(tmp_path, setting, refused):
    """`select C in a b; do break; done; export CUDA_DEVICE_MAX_CONNECTIONS=32` was no command the reader parsed:
    the script was read word by word and the export lost, so a tp 2 launch on H100 was priced. select is parsed
    as bash's compound command; its choice, read from the input, is read as at the input's end, as bash runs it
    without any (no body run), said."""
    read_as_bash_does(tmp_path, "#!/bin/bash\n" + setting + TRAIN + "\n", refused)
    assert any("select C reads its choice" in note.text for note in read_script(setting, "t.sh").notes)


@needs_bash
def test_unset_of_an_arrays_last_element_or_whole_array_reads_as_bash(tmp_path):
    """`unset 'A[2]'` was read as unsetting a variable named A[2], none, the element kept: bash takes the element
    off (the last one leaves the array dense, its indices 0..n-2); `unset 'A[@]'` unsets the array, and X[0] of a
    scalar X unsets X."""
    script = ("A=(--bf16 --fp8-format hybrid)\nunset 'A[2]'\nunset 'A[7]'\ntorchrun \"${A[@]}\" \"${#A[@]}\" "
              "\"${!A[@]}\"\nunset A[-1]\ntorchrun \"${A[@]}\" \"${!A[@]}\"\nunset 'A[@]'\ntorchrun \"${#A[@]}\"\n"
              "X=1\nunset 'X[0]'\ntorchrun \"${X-unset}\"\nE=()\ntorchrun \"${E-unset}\"\n")
    assert reader_calls(tmp_path, script) == bash_words(tmp_path, script)


@pytest.mark.parametrize("making, construct", [("unset 'A[0]'", "unset A[0]"), ("A[5]=64", "A[5]="),
                                               ("A=([0]=--bf16 [2]=64)", "A=(...) sets the indices 0, 2"),
                                               ("A+=([3]=64)", "A+=(...) sets the indices 3")])
def test_a_sparse_array_is_refused_naming_the_line(tmp_path, making, construct):
    """`unset 'A[0]'` (or `A[5]=64` past the end) makes a sparse array, whose "${A[@]}" and ${!A[@]} the reading
    does not follow (it kept the element, or padded with empty words bash never passes): refused, exit 2, one
    line naming the file, the line and the construct, rather than a launch read with other words."""
    script = f"#!/bin/bash\nA=(--bf16 --use-distributed-optimizer)\n{making}\n{TRAIN} \"${{A[@]}}\"\n"
    case, args = files(tmp_path, script, BF16)
    result = run_cli("diagnose", str(case), "--megatron-args", str(args))
    assert result.returncode == 2 and result.stdout == "", result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {args}: line 3: {construct}"), lines


@needs_bash
def test_an_arrays_subscripted_words_set_the_indices_bash_sets(tmp_path):
    """`A=([0]=$X [1]=c)` split X's value into two elements, where bash assigns `[i]=value` as one (no word
    splitting, as any assignment's), and a plain word after `[1]=f` goes to index 2, an appended one after the end."""
    script = ('X="a b"\nA=([0]=$X [1]=c)\ntorchrun "${A[@]}"\nD=(a [1]=f g)\nD+=([3]=h i)\nD+=(j)\n'
              'torchrun "${D[@]}" "${!D[@]}"\nE=([1]=x [1]=y [0]=z)\ntorchrun "${E[@]}"\n')
    assert reader_calls(tmp_path, script) == bash_words(tmp_path, script)


@needs_bash
@pytest.mark.parametrize("script", [
    "set -u\nX=1\nunset X\ntorchrun a $X\ntorchrun b\n",
    "set -o nounset\nf() { local X; torchrun a $X; }\nf\ntorchrun b\n",
    "set -euo pipefail\nset -- one\ntorchrun a $2\ntorchrun b\n",
    "set -u\nunset X\ntorchrun a ${#X}\n",
    "set -u\nunset B\ntorchrun a ${#B[@]}\n",
    "set -u\nunset X\ntorchrun a $((X + 1))\n",
    "set -u\nunset X\n(( X )) || true\ntorchrun a\n",
    "set -u\nunset X\nif [ \"$X\" ]; then :; fi\ntorchrun a\n",
    "set -u\nunset X\ntorchrun a ${X#a}\n",
    "set -u\nA=(1)\ntorchrun a ${A[3]}\n",
    "set -u\nunset Z\nY=Z\ntorchrun a ${!Y}\n",
    "set -u\nunset X\n( echo $X )\ntorchrun a\n",  # a subshell ends alone
    "set -u\nunset X\necho $X || true\ntorchrun a\n",  # not even || catches it
    # what set -u lets through: defaults, "$@" and ${A[@]} of none, $#, $?, set variables, set +u
    "set -u\nunset X\ntorchrun a ${X:-d} ${X-e} ${X+w} ${X:+v} ${X:=f} \"$@\" \"$*\" ${B[@]} $# $?\n",
    "set -u\nunset X\n[[ -v X ]] || torchrun a\nset +u\ntorchrun b $X\n",
    "unset X\ntorchrun a $X\n",
])
def test_set_u_ends_the_script_where_bash_ends_it(tmp_path, script):
    """`set -u` (`set -euo pipefail`): bash ends the script at an expansion of a variable that is unset
    (Bash Reference Manual, 4.3.1 The Set Builtin: -u), ${#X}, $((X)) and ${!Y} included, "$@" and the
    defaults not; the reader read it as empty and went on to a launch bash never starts. Here the script
    itself leaves it unset, so the reading stops where bash does."""
    assert reader_calls(tmp_path, script) == bash_words(tmp_path, script)


@pytest.mark.parametrize("script, name", [
    ("set -euo pipefail\ntorchrun --nnodes $SLURM_NNODES a\n", "SLURM_NNODES"),
    ("set -u\ntorchrun a $1\n", "$1"),
    ("set -u\ntorchrun a $((NODE_RANK + 0))\n", "NODE_RANK"),
])
def test_set_u_on_what_the_caller_may_set_is_said(script, name):
    """An unset variable the caller's environment (or arguments) may set ends a `set -u` script only where
    the caller leaves it unset, which the reader cannot know: read as set, as a guard the caller decides
    is read, and said in a note, not silently read as empty."""
    read = read_script(script, "t.sh")
    assert [c.fields[0] for c in read.commands] == ["torchrun"]
    assert any(f"{name} is not set by the script" in n.text and "set -u" in n.text and "line 2" in n.text
               for n in read.notes), read.notes
    assert not any("set -u" in n.text for n in read_script(script.replace("-euo", "-eo").replace("-u", "-e"), "t.sh").notes)
    # Slurm sets its variables in every batch job: an #SBATCH script's are the caller's, decidedly
    if name.startswith("SLURM_"):
        assert not any("set -u" in n.text for n in read_script("#SBATCH --nodes=1\n" + script, "t.sh").notes)


@needs_bash
@pytest.mark.parametrize("script", [
    "false\nif [ $? -ne 0 ]; then exit 1; fi\ntorchrun a\n",
    "true\nif [ $? -ne 0 ]; then exit 1; fi\ntorchrun a\n",
    "[ 1 -gt 2 ]\n[ $? -eq 0 ] || exit 1\ntorchrun a\n",
    "! true\nif [ \"$?\" != 0 ]; then exit 1; fi\ntorchrun a\n",
    "( exit 0 )\n(( $? == 0 )) && torchrun a\nfalse || true\ntorchrun b $?\n",
    "false\ntorchrun a $?\nX=$?\ntorchrun b $X\n",
    "set -- a\nshift 2\n[ $? -ne 0 ] && exit 1\ntorchrun a\n",
])
def test_status_variable_follows_the_last_command(tmp_path, script):
    """`$?` was read as 0 whatever ran before it: `false; if [ $? -ne 0 ]; then exit 1; fi` went on to a
    launch bash never starts. Where the reader knows the last status (false, true, a test, a subshell's
    exit), `$?` is bash's."""
    assert reader_calls(tmp_path, script) == bash_words(tmp_path, script)


@needs_bash
@pytest.mark.parametrize("script", [
    "(exit 3)\nif [ $? -eq 3 ]; then TP=8; else TP=1; fi\ntorchrun a $TP\n",
    "f() { return 4; }\nf\ntorchrun a $?\n",
    "f() { false; return; }\nf\ntorchrun a $?\n",  # return alone: the last command's status
    "(false; exit)\ntorchrun a $?\n",
    "(exit 300)\ntorchrun a $?\n(exit -1)\ntorchrun b $?\n(exit x)\ntorchrun c $?\n",  # mod 256; no number: 2
    "true && (exit 5)\ntorchrun a $?\n(exit 6) || (exit 7)\ntorchrun b $?\n",
    "set -o pipefail\n(exit 4) | true\ntorchrun a $?\n",
    "[ 1 -eq 1\ntorchrun a $?\neval 'if'\ntorchrun b $?\nenv X=1 -u X true\ntorchrun c $?\n",
    "[ a -eq 1 ]\ntorchrun a $?\n[ a b ]\ntorchrun b $?\n[ 1 -eq 2 -o a -eq 1 ]\ntorchrun c $?\n[ ]\ntorchrun d $?\n",
    "env -0 true\ntorchrun a $?\n",
])
def test_status_variable_is_the_failed_commands_own_status(tmp_path, script):
    """Every decided failure read `$?` as 1, so `(exit 3); if [ $? -eq 3 ]; then TP=8; fi` took the else branch
    bash does not take: `exit N` and `return N` leave N mod 256 (2 for a word that is no number), alone the last
    command's; a `[` bash refuses (without `]`, an integer expected, an operator missing) and an eval bash cannot
    parse leave 2, env's command not found 127, env -0's refusal 125 (Bash Reference Manual, 4.1 Bourne Shell
    Builtins; bash's test.c; coreutils' env). Real bash is the oracle."""
    assert reader_calls(tmp_path, script) == bash_words(tmp_path, script)


@needs_bash
@pytest.mark.parametrize("script", [
    "bash -u -c 'unset TP; torchrun a $TP'\ntorchrun b\n",
    "sh -u -c 'unset TP; torchrun a $TP'\ntorchrun b\n",
    "bash -e -c 'false; torchrun a'\ntorchrun b\n",
    "bash -euo pipefail -c 'false | true; torchrun a'\ntorchrun b\n",
    "bash -o errexit -c 'false; torchrun a'\nbash -e +e -c 'false; torchrun b'\n",  # the last word wins
    "bash -e <<'EOF'\nfalse\ntorchrun a\nEOF\ntorchrun b\n",
    "bash -x -c 'torchrun a'\nbash --norc -c -- 'torchrun b'\n",  # options the reading has no use for
])
def test_options_given_to_an_inner_shell_reach_its_script(tmp_path, script):
    """`bash -u -c '...'` (and -e, -o pipefail, sh -u, bash -e <<EOF) read the inner script without the
    options, so a launch bash never starts past an unset variable or a failure was read, and `bash -euo pipefail
    -c` was not read as running its script at all: bash starts the script it runs under the set options of its
    invocation (bash(1), OPTIONS). Real bash is the oracle."""
    assert reader_calls(tmp_path, script) == bash_words(tmp_path, script)


@needs_bash
@pytest.mark.parametrize("script", [
    "bash -c 'exit 3'\ntorchrun a $?\nbash -c 'false'\ntorchrun b $?\nbash -c 'exit 300'\ntorchrun c $?\n",
    "bash -c '(exit 4); exit'\nif [ $? -eq 4 ]; then TP=8; else TP=1; fi\ntorchrun a $TP\n",  # exit alone: the last's
    "env X=1 bash -c 'exit 5'\ntorchrun a $?\nbash <<'EOF'\nexit 6\nEOF\ntorchrun b $?\n",
    "bash -c 'torchrun a; true'\ntorchrun b $?\nbash -c '[ 1 -gt 2 ]' || torchrun c\n",
    "set -e\nbash -c 'exit 2'\ntorchrun a\n",  # a failing inner script ends a set -e caller
])
def test_status_variable_after_bash_c_is_its_scripts_status(tmp_path, script):
    """After `bash -c 'exit 3'`, `$?` was read as 0 (a command not run, said), so a guard on it took the branch
    bash does not: bash -c leaves its script's status (bash(1), EXIT STATUS: a script's is its last command's or
    its exit's), which the reader knows where the script alone decides it. Real bash is the oracle."""
    assert reader_calls(tmp_path, script) == bash_words(tmp_path, script)


@needs_bash
@pytest.mark.parametrize("script", [
    "bash -O nocasematch -c '[[ LLAMA =~ ^llama$ ]] && torchrun a'\n",
    "bash -O nocasematch +O nocasematch -c '[[ LLAMA =~ ^llama$ ]] || torchrun a'\n",  # the last word wins
    "bash -O extglob -c 'torchrun a'\nbash -eO extglob -c 'false; torchrun b'\ntorchrun c\n",
])
def test_shopt_options_given_to_an_inner_shell_reach_its_script(tmp_path, script):
    """`bash -O nocasematch -c` read its script with regard to case: bash starts it under the shopt options of
    its invocation (bash(1), OPTIONS: -O shopt_option, +O unsets), and a -O's name is no script."""
    assert reader_calls(tmp_path, script) == bash_words(tmp_path, script)


@needs_bash
@pytest.mark.parametrize("script", [
    "unset T\ntorchrun a \"${T:?set T}\"\ntorchrun b\n",  # bash: "T: set T", the script ends
    "T=\ntorchrun a \"${T:?}\"\ntorchrun b\n",  # set, empty: :? ends it, ? does not
    "T=\ntorchrun a \"${T?}\"\nunset T\n(torchrun b \"${T?}\")\ntorchrun c $?\n",  # a subshell alone, status 1
    "f() { local T; torchrun a \"${T:?}\"; }\nf\ntorchrun b\n",
    "unset Y\ntorchrun a \"${!Y}\"; torchrun b\ntorchrun c $?\n",  # invalid indirect expansion: the line
    "X=\ntorchrun a \"${!X:-d}\"\nX='a b'\ntorchrun b \"${!X}\"\nX=T\ntorchrun c \"${!X:-d}\"\n",
    "torchrun a \"$!\" \"${!}\"\nset -u\ntorchrun b \"$!\"\ntorchrun c\n",  # no job in the background
])
def test_expansions_bash_fails_on_stop_the_reading_as_in_bash(tmp_path, script):
    """`${T:?msg}` of an unset T was read as empty and the script went on, where bash ends it whatever set -u says
    (Bash Reference Manual, 3.5.3: "if the shell is not interactive, it exits"); `${!Y}` of an unset Y, or of a
    value that names no variable, was read as empty, where bash refuses it and abandons the line (status 1); `$!`
    was read as an indirect expansion, so set -u did not end the script where no job ran in the background.
    Real bash is the oracle."""
    assert reader_calls(tmp_path, script) == bash_words(tmp_path, script)


def test_required_expansion_of_what_the_caller_sets_is_said():
    """`${TP:?set TP}` of a TP the script leaves to the caller ends the script only where the caller does not set
    it: read as set, going on (the launch the script is for), and said, as set -u's is."""
    read = read_script("torchrun a --tp \"${TP:?set TP}\"\n", "t.sh")
    assert [c.fields for c in read.commands] == [("torchrun", "a", "--tp", "")]
    assert any("line 1" in n.text and "${TP:?set TP}" in n.text and "unless the caller sets it" in n.text
               for n in read.notes), read.notes


@needs_bash
@pytest.mark.parametrize("op", [":?", "?"])
def test_required_expansion_under_set_u_is_said_once_as_bash_says_it(tmp_path, op):
    """Under `set -u`, `${T:?word}` (and `${T?word}`) of an unset T ends the script with the expansion's own
    message, "T: word", not set -u's "unbound variable": bash tests the operator, not nounset (Bash Reference
    Manual, 3.5.3). The reader said both: every emitted launch.sh (`set -euo pipefail` and
    `"${MASTER_ADDR:?set MASTER_ADDR ...}"`) got two notes on its line that MASTER_ADDR may end it, one naming
    set -u; and where the script unsets T, it quoted bash as saying "T: unbound variable"."""
    unset = f"set -u\nunset T\ntorchrun a \"${{T{op}set T}}\"\ntorchrun b\n"
    (tmp_path / "t.sh").write_text(unset)
    said = subprocess.run([BASH, str(tmp_path / "t.sh")], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"]}).stderr
    assert "T: set T" in said and "unbound variable" not in said
    notes = [n.text for n in read_script(unset, "t.sh").notes]
    assert any('(bash: "T: set T")' in n for n in notes) and not any("unbound variable" in n for n in notes), notes
    left = read_script(f"set -euo pipefail\ntorchrun a \"${{MASTER_ADDR{op}set MASTER_ADDR}}\"\n", "t.sh")
    assert [c.fields for c in left.commands] == [("torchrun", "a", "")]
    about = [n.text for n in left.notes if "MASTER_ADDR" in n.text]
    assert len(about) == 1 and f"${{MASTER_ADDR{op}set MASTER_ADDR}}" in about[0] and "set -u" not in about[0], about


def test_status_variable_of_a_command_not_run_is_said():
    """After a command the reader does not run (the launch itself), its status is not known: read as 0,
    the way that goes on, and said, where it was silently 0."""
    read = read_script("torchrun a\nif [ $? -ne 0 ]; then echo failed; exit 1; fi\ntorchrun b\n", "t.sh")
    assert [c.fields for c in read.commands] == [("torchrun", "a"), ("torchrun", "b")]
    assert any("line 2" in n.text and "$?" in n.text and "torchrun is not run" in n.text for n in read.notes), \
        read.notes


MIXTRAL_ON_64 = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
                 "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "bf16", "engine": "megatron"}}
MIXTRAL_TRAIN = ("torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
                 "--ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
                 "--swiglu --untie-embeddings-and-output-weights --seq-length 4096 --num-experts 8 "
                 "--moe-router-topk 2 --moe-grouped-gemm --micro-batch-size 1 --global-batch-size 256 --bf16 "
                 "--tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 8 "
                 "--use-distributed-optimizer --moe-token-dispatcher-type alltoall "
                 "--overlap-moe-expert-parallel-comm --tp-comm-overlap")


@pytest.mark.parametrize("setting, said", [
    ("export CUDA_DEVICE_MAX_CONNECTIONS=1\n", True),
    ("CUDA_DEVICE_MAX_CONNECTIONS=1 ", True),  # the launch's own prefix
    ("export CUDA_DEVICE_MAX_CONNECTIONS=8\n", False),  # Megatron-Bridge's PerfEnvPlugin: both overlaps run
    ("export CUDA_DEVICE_MAX_CONNECTIONS=32\n", False),
])
def test_the_experts_overlap_under_one_connection_is_said(tmp_path, setting, said):
    """A launch that turns on --overlap-moe-expert-parallel-comm and gives the training
    CUDA_DEVICE_MAX_CONNECTIONS=1 was read without a word, the estimate hiding the experts' dispatch and
    combine behind the other micro-batch's compute, which megatron-core's MoE README says needs more than one
    connection ("Requirements for EP A2A Overlap: expert_model_parallel_size > 1, CUDA_DEVICE_MAX_CONNECTIONS
    > 1"). validate_args only warns there (tp 2 with the overlap), so the run starts: said in a note. With 8
    or 32 no note: the experts' overlap has its queues, and --tp-comm-overlap (Transformer Engine's
    userbuffers) orders its own launches on Hopper (comm_gemm_overlap.cpp)."""
    case, args = files(tmp_path, "#!/bin/bash\n" + setting + MIXTRAL_TRAIN + "\n", MIXTRAL_ON_64)
    result = diagnose(case, megatron_args=args)
    assert result.estimate.job.training.moe_comm_overlap and result.estimate.job.layout.ep == 8
    notes = [note for note in result.notes if "--overlap-moe-expert-parallel-comm" in note]
    assert len(notes) == int(said), result.notes
    assert not said or "CUDA_DEVICE_MAX_CONNECTIONS > 1" in notes[0]


LLAMA_ON_A100 = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
                 "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "bf16", "engine": "megatron"}}
LLAMA_TRAIN = ("torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
               "--ffn-hidden-size 11008 --num-attention-heads 32 --swiglu --untie-embeddings-and-output-weights "
               "--seq-length 4096 --micro-batch-size 1 --global-batch-size 256 --bf16 "
               "--tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer --tp-comm-overlap")


@pytest.mark.parametrize("gpu, setting, outcome", [
    ("a100-sxm-80gb", "", "note"),  # left to the caller
    ("a100-sxm-80gb", "UB_SKIPMC=${UB_SKIPMC:-1}\n", "note"),  # set without export: the caller's export decides
    ("a100-sxm-80gb", "export UB_SKIPMC=1\n", None),
    ("a100-sxm-80gb", "UB_SKIPMC=1 ", None),  # the launch's own prefix
    ("a100-sxm-80gb", "export UB_SKIPMC=0\n", "refused"),
    ("a100-sxm-80gb", "export UB_SKIPMC=yes\n", "refused"),  # int("yes") raises in TE too
    ("h100-sxm-80gb", "", None),  # multicast: initialize_ub takes it without UB_SKIPMC
])
def test_tp_comm_overlap_without_ub_skipmc_before_hopper_is_said(tmp_path, gpu, setting, outcome):
    """A launch with --tp-comm-overlap on A100s that does not give the training UB_SKIPMC was read without a
    word, its estimate crediting the overlap: Transformer Engine's initialize_ub, which Megatron-LM calls for
    the flag, raises on a device without CUDA multicast unless ``bool(int(os.getenv("UB_SKIPMC", "0")))``
    ("Launch app with UB_SKIPMC=1 to try CUDA IPC instead", transformer_engine/pytorch/module/base.py:183-187
    at v2.9), and multicast needs compute capability 9 (TE's comm_gemm_overlap README: "Devices older than
    compute capability 9.0 require UB_SKIPMC=1"). A script that decides another value is refused (the run
    would not start); one that leaves it to the caller is said in a note."""
    case_data = {**LLAMA_ON_A100, "cluster": {**LLAMA_ON_A100["cluster"], "gpu": gpu}}
    case, args = files(tmp_path, "#!/bin/bash\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n" + setting + LLAMA_TRAIN + "\n",
                       case_data)
    if outcome == "refused":
        with pytest.raises(CaseError, match=r"train.sh: UB_SKIPMC: is .*initialize_ub raise.*export UB_SKIPMC=1"):
            diagnose(case, megatron_args=args)
        done = run_cli("diagnose", str(case), "--megatron-args", str(args))
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        return
    result = diagnose(case, megatron_args=args)
    assert result.estimate.job.training.tp_comm_overlap and result.estimate.job.layout.tp == 2
    notes = [note for note in result.notes if "UB_SKIPMC" in note]
    assert len(notes) == int(outcome == "note"), result.notes


# DeepEP at the commit megatron-core 0.16.1 installs (docker/Dockerfile.ci.dev: eb9cee7), where a mirror of it
# is at hand; else the lines quoted from it.
DEEPEP_MIRROR = Path("/work/.mirror/deepseek-ai+DeepEP/repo")
DEEPEP_COMMIT = "eb9cee7"
# deep_ep/buffer.py:104-123 at eb9cee7, in Buffer.__init__, under
# "if self.runtime.get_num_rdma_ranks() > 1 or low_latency_mode or self.disable_nvlink_for_normal_mode:".
DEEPEP_SETS_ITSELF = {"NVSHMEM_DISABLE_P2P", "NVSHMEM_IB_ENABLE_IBGDA", "NVSHMEM_IBGDA_NUM_RC_PER_PE",
                      "NVSHMEM_QP_DEPTH", "NVSHMEM_MAX_TEAMS", "NVSHMEM_DISABLE_NVLS", "NVSHMEM_CUMEM_GRANULARITY",
                      "NVSHMEM_DISABLE_MNNVL"}
# third-party/README.md:43 at eb9cee7, "2.1 Configure NVIDIA driver" (modify /etc/modprobe.d/nvidia.conf).
DEEPEP_DRIVER_OPTIONS = 'NVreg_EnableStreamMemOPs=1 NVreg_RegistryDwords="PeerMappingOverride=1;"'


def deepep_source(path: str) -> Optional[str]:
    """``path`` in DeepEP at :data:`DEEPEP_COMMIT`, None without the mirror (or git)."""
    if not DEEPEP_MIRROR.is_dir() or shutil.which("git") is None:
        return None
    run = subprocess.run(["git", "-C", str(DEEPEP_MIRROR), "show", f"{DEEPEP_COMMIT}:{path}"],
                         capture_output=True, text=True, timeout=30)
    return run.stdout if run.returncode == 0 else None


def test_the_quoted_deepep_lines_are_deepeps():
    """What the test below holds the files to is DeepEP's own: the NVSHMEM variables its Buffer exports in
    the training process once it has more than one RDMA rank, and the driver options its NVSHMEM guide
    gives for IBGDA (read from its source where a mirror is at hand)."""
    import re

    buffer, guide = deepep_source("deep_ep/buffer.py"), deepep_source("third-party/README.md")
    if buffer is None or guide is None:
        pytest.skip("no DeepEP mirror to read the quoted lines from")
    branch = buffer.split("if self.runtime.get_num_rdma_ranks() > 1", 1)[1].split("# Synchronize using the root ID")[0]
    assert set(re.findall(r"os\.environ\['(\w+)'\]\s*=", branch)) == DEEPEP_SETS_ITSELF
    assert f"options nvidia {DEEPEP_DRIVER_OPTIONS}" in guide


def exported_by(tmp_path: Path, script: str) -> dict[str, str]:
    """The environment real bash gives the script's torchrun (a stand-in that prints it), started with an
    empty one: what the script itself sets, srun and numactl passed through."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    (stubs / "torchrun").write_text("#!/bin/sh\nenv >&3\n")
    (stubs / "torchrun").chmod(0o755)
    for launcher in ("srun", "numactl", "scontrol"):
        (stubs / launcher).write_text('#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\n'
                                      '[ "$0" = "${0%scontrol}" ] && exec "$@"; echo node0\n')
        (stubs / launcher).chmod(0o755)
    (tmp_path / "oracle.sh").write_text(script)
    (tmp_path / "pretrain_gpt.py").touch()  # sbatch.sh looks for it before it starts the nodes
    run = subprocess.run(["env", "-i", f"PATH={stubs}:/usr/bin:/bin", "MASTER_ADDR=node0", "MEGATRON_LM=.",
                          "SLURM_JOB_ID=1", "SLURM_JOB_NODELIST=node0", "SLURM_CPUS_ON_NODE=1",
                          f"SLURM_SUBMIT_DIR={tmp_path}", BASH, "-c", 'exec bash "$0" 3>&1 1>&2',
                          str(tmp_path / "oracle.sh")], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.stdout, run.stderr
    return dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)


@needs_bash
@pytest.mark.parametrize("dispatch, ep, across", [("deepep", 16, True), ("deepep", 8, False),
                                                  ("all_to_all", 16, False)])
def test_deepep_across_nodes_is_launched_as_deepep_runs_it_and_the_cluster_told_its_part(tmp_path, dispatch, ep,
                                                                                        across):
    """The plan priced DeepEP's dispatch across nodes, and nothing in its launch files said what DeepEP's
    internode kernels need. DeepEP exports its NVSHMEM settings itself, in-process, once its group holds
    more than its 8 NVLink peers (deep_ep/buffer.py, Buffer.__init__), overwriting any a script sets: the
    scripts set none of them, and say once in each file what the cluster must provide (NVSHMEM, IBGDA's
    driver options or GDRCopy). A group of 8 (DeepEP's NVLink peers) or the plain all-to-all says nothing.
    diagnose reads the launch back at the plan's layout."""
    from planner.engines.megatron import emit as megatron
    from planner.estimate import estimate

    case = {"model": {"preset": "deepseek-v2-lite"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron", "expert_dispatch": dispatch},
            "layout": {"tp": 1, "pp": 1, "ep": ep, "etp": 1, "zero_stage": 1, "recompute": "full"}}
    planned = estimate(case)
    rendered = megatron.render(planned, ["header"])
    (tmp_path / megatron.ARGS_FILE).write_text(rendered[megatron.ARGS_FILE])
    for name in (megatron.LAUNCH_FILE, "sbatch.sh"):
        exported = exported_by(tmp_path, rendered[name])
        assert not {key for key in exported if key.startswith("NVSHMEM_")}, (name, exported)
        assert not DEEPEP_SETS_ITSELF & set(exported), name
    for name, text in rendered.items():
        told = [line for line in text.splitlines() if line.startswith("#") and DEEPEP_DRIVER_OPTIONS in line]
        assert len(told) == (1 if across else 0), (name, told)
        if across:
            assert "NVSHMEM" in told[0] and "GDRCopy" in told[0] and "files set none" in told[0], told
    launch, case_path = tmp_path / megatron.LAUNCH_FILE, tmp_path / "case.yaml"
    launch.write_text(rendered[megatron.LAUNCH_FILE])
    case_path.write_text(yaml.safe_dump(case))
    read = diagnose(case_path, megatron_args=launch).estimate.job
    assert (read.layout.ep, read.layout.expert_tp, read.layout.dp) == (planned.job.layout.ep, 1,
                                                                        planned.job.layout.dp)
    assert read.training.expert_dispatch == planned.job.training.expert_dispatch
