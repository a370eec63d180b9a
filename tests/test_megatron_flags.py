"""A misspelt Megatron-LM flag is refused, as Megatron-LM's parser refuses it
(``argparse.ArgumentParser(allow_abbrev=False)`` in ``megatron/training/arguments.py``), not
read as absent: `diagnose` read `--tensor-model-paralel-size 4` as tensor parallelism 1, and
said the layout did not fit. No flag megatron-core defines is taken for a misspelling."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from cli_in_process import run_cli
from planner.engines.megatron.launch import flags_of, split_words
from planner.errors import CaseError

ARGS = ("--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --micro-batch-size 1 "
        "--global-batch-size 128 --seq-length 4096 --bf16 --use-distributed-optimizer\n")
CASE = ("model: {preset: llama2-7b}\ncluster: {gpu: a100-sxm-80gb, num_gpus: 16}\n"
        "training: {global_batch_size: 128, seq_len: 4096}\n")
# The Llama 3 70B case the argument lists below are read against.
LLAMA_70B_ON_64 = ("model: {preset: llama3-70b}\ncluster: {gpu: h100-sxm-80gb, num_gpus: 64}\n"
                   "training: {global_batch_size: 64, seq_len: 4096}\n")


def diagnosed(tmp_path, args_text: str, case: str = LLAMA_70B_ON_64):
    """diagnose of the argument list ``args_text`` (as args.txt) against ``case``."""
    from planner.diagnose import diagnose

    (tmp_path / "case.yaml").write_text(case)
    (tmp_path / "args.txt").write_text(args_text)
    return diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "args.txt")


@pytest.mark.parametrize("typo, meant", [("--tensor-model-paralel-size", "--tensor-model-parallel-size"),
                                         ("--pipline-model-parallel-size", "--pipeline-model-parallel-size"),
                                         ("--micro-batch-szie", "--micro-batch-size"),
                                         # an abbreviation, which the parser refuses (allow_abbrev=False):
                                         # read as no flag, the run was diagnosed at tp 1
                                         ("--tensor-model-parallel", "--tensor-model-parallel-size")])

def test_a_misspelt_flag_is_refused_naming_the_one_meant(tmp_path, typo, meant):
    (tmp_path / "case.yaml").write_text(CASE)
    args = tmp_path / "args.txt"
    args.write_text(ARGS.replace(meant, typo))
    done = run_cli("diagnose", str(tmp_path / "case.yaml"), "--megatron-args", str(args))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"args.txt: {typo}: is no Megatron-LM argument (did you mean {meant}?)" in done.stderr


def test_a_launchers_flags_before_the_script_are_not_megatrons():
    # srun's --nodes is one letter from torchrun's --nnodes: before pretrain_gpt.py it is srun's.
    words = ["srun", "--nodes", "2", "torchrun", "--nnodes", "2", "--nproc-per-node", "8", "pretrain_gpt.py",
             "--tensor-model-parallel-size", "2"]
    assert flags_of(words, "launch.sh", shell=True)["--tensor-model-parallel-size"] == "2"


def test_no_flag_megatron_core_defines_is_taken_for_a_misspelling():
    """Megatron-LM makes most of its arguments from megatron-core's config dataclasses (a field
    ``num_moe_experts`` is ``--num-moe-experts``): none its parser defines is refused."""
    from planner.engines.megatron.launch import PARSER_FLAGS
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    flags = {"--" + f.name.replace("_", "-") for config in (TransformerConfig, MLATransformerConfig,
                                                            ModelParallelConfig, DistributedDataParallelConfig,
                                                            OptimizerConfig)
             for f in dataclasses.fields(config)}
    flags &= PARSER_FLAGS  # those it makes flags of (the others Megatron-LM's parser refuses)
    assert len(flags) > 200
    refused = []
    for flag in sorted(flags):
        try:
            flags_of([flag], "args.txt")
        except CaseError as error:
            if "is no Megatron-LM argument" in error.expected:  # a value's own checks are tested below
                refused.append(str(error))
    assert not refused


# Each value Megatron-LM's parser refuses, in the 70B case's argument list: diagnose read each as
# its default (or as Adam) and went on, for a run that would not start.
@pytest.mark.parametrize("change, flag, said", [
    (("--bf16", "--bf16 --optimizer bogus"), "--optimizer", "expected one of adam, sgd, muon"),
    (("--bf16", "--bf16 --optimizer Adam"), "--optimizer", "got 'Adam'"),  # argparse's choices are case-sensitive
    (("--bf16", "--bf16 --normalization Bogus"), "--normalization", "expected one of LayerNorm, RMSNorm"),
    (("--bf16", "--bf16 --position-embedding-type ropey"), "--position-embedding-type", "got 'ropey'"),
    (("--bf16", "--bf16 --moe-token-dispatcher-type bogus"), "--moe-token-dispatcher-type", "allgather, alltoall, flex"),
    (("--bf16", "--bf16 --main-grads-dtype fp64"), "--main-grads-dtype", "expected one of fp32, bf16"),
    # argparse converts every occurrence: a later valid one does not save the run
    (("--bf16", "--bf16 --attention-dropout abc --attention-dropout 0"), "--attention-dropout",
     "expected a number, got 'abc'"),
    (("--bf16", "--bf16 stray"), "--bf16", "takes no value, but 'stray' follows it"),
    (("--tensor-model-parallel-size 4", "--tensor-model-parallel-size 4 8"), "--tensor-model-parallel-size",
     "takes one value, but '8' follows it"),
    # argparse reads a negative number as a positional argument, not an option: "unrecognized arguments: -1"
    # (Python's argparse, _negative_number_matcher); it was let through as if it were a flag
    (("--bf16", "--bf16 -1"), "--bf16", "takes no value, but '-1' follows it"),
    (("--tensor-model-parallel-size 4", "--tensor-model-parallel-size 4 -.5"), "--tensor-model-parallel-size",
     "takes one value, but '-.5' follows it"),
    # validate_args asserts max_position_embeddings >= seq_length (arguments.py, core_v0.16.1 to core_v0.19.0)
    (("--bf16", "--bf16 --max-position-embeddings 2048"), "--max-position-embeddings",
     "2048 is below the sequence length 4096"),
    # a flag with no value, or an empty one: argparse's "expected one argument" and "invalid choice: ''"
    (("--bf16", "--normalization --bf16"), "--normalization", "takes a value, and none follows it"),
    (("--bf16", "--bf16 --optimizer="), "--optimizer", "got ''"),
    (("--bf16", "--bf16 --optimizer"), "--optimizer", "takes a value, and none follows it"),
    # argparse strips nothing: " adam" is no choice (it was read as adam and refused as not adam)
    (("--bf16", "--bf16 '--optimizer= adam'"), "--optimizer", "got ' adam'"),
    # core_v0.16.1 arguments.py: --tokenizer-type's choices
    (("--bf16", "--bf16 --tokenizer-type FooTokenizer"), "--tokenizer-type", "got 'FooTokenizer'"),
])
def test_a_value_megatrons_parser_refuses_is_refused(tmp_path, change, flag, said):
    args = ("--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --micro-batch-size 1 "
            "--global-batch-size 64 --seq-length 4096 --bf16 --use-distributed-optimizer\n")
    with pytest.raises(CaseError) as error:
        diagnosed(tmp_path, args.replace(*change))
    assert error.value.key == flag and said in error.value.expected, str(error.value)


def test_a_word_after_the_arguments_that_is_no_argument_passes():
    # An unexpanded variable, an array's close, a redirection: no argument of Megatron-LM's.
    for tail in (["$EXTRA_ARGS"], [")"], ["2>&1"], ["|", "tee", "log"], ["OTHER=(--seq-length", "4096)"]):
        assert flags_of(["--bf16", *tail], "args.txt")["--bf16"] is None
    # A flag's negative value is its value (argparse takes -3 for --tp's one argument), and a positions
    # table as long as the sequence is what validate_args asks.
    assert flags_of(["--tensor-model-parallel-size", "-3", "--bf16"], "args.txt")["--tensor-model-parallel-size"] == "-3"


def test_a_positions_table_as_long_as_the_sequence_is_taken(tmp_path):
    args = ("--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --micro-batch-size 1 "
            "--global-batch-size 64 --seq-length 4096 --max-position-embeddings 4096 --bf16 --use-distributed-optimizer\n")
    assert diagnosed(tmp_path, args).estimate.job.layout.tp == 4


def test_muon_is_not_priced_as_adam(tmp_path):
    """Megatron-LM runs Muon (one momentum, orthogonalized updates): not the states a case prices."""
    args = ("--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --micro-batch-size 1 "
            "--global-batch-size 64 --seq-length 4096 --bf16 --use-distributed-optimizer --optimizer muon\n")
    with pytest.raises(CaseError, match="prices Megatron-LM's adam and sgd only"):
        diagnosed(tmp_path, args)


def test_the_choices_take_what_the_installed_megatron_core_takes():
    """The choices Megatron-LM makes from TransformerConfig's Literal fields: every value the installed
    megatron-core's config takes is taken (the table may know a newer release's, not refuse an older's)."""
    import typing

    from megatron.core.transformer.transformer_config import TransformerConfig
    from planner.engines.megatron.launch import ARGPARSE_CHOICES

    hints = typing.get_type_hints(TransformerConfig)
    fields = {"--normalization": "normalization", "--moe-token-dispatcher-type": "moe_token_dispatcher_type",
              "--moe-flex-dispatcher-backend": "moe_flex_dispatcher_backend", "--fp8-format": "fp8",
              "--fp8-recipe": "fp8_recipe", "--fp4-format": "fp4", "--fp4-recipe": "fp4_recipe",
              "--recompute-granularity": "recompute_granularity", "--recompute-method": "recompute_method"}
    for flag, field in fields.items():
        kind = hints[field]
        if typing.get_origin(kind) is typing.Union:  # Optional[Literal[...]]
            kind = typing.get_args(kind)[0]
        assert typing.get_origin(kind) is typing.Literal, (flag, kind)
        assert set(typing.get_args(kind)) <= set(ARGPARSE_CHOICES[flag]), flag


def test_an_fp8_plan_for_megatron_reads_back_where_the_case_names_no_engine(tmp_path):
    """`plan --engine megatron --emit megatron` on an fp8 case that names no engine, then
    `diagnose` of its arguments: refused, the case read with the generic engine's recipe
    (tensorwise) against Megatron-LM's delayed scaling the files say."""
    case = tmp_path / "case.yaml"
    case.write_text("model: {preset: llama3-8b}\ncluster: {gpu: h100-sxm-80gb, num_gpus: 16}\n"
                    "training: {global_batch_size: 64, seq_len: 4096, precision: fp8}\n")
    planned = run_cli("plan", str(case), "--engine", "megatron", "--emit", "megatron", "--out", str(tmp_path / "run"),
                      "--json")
    assert planned.returncode == 0, planned.stderr
    done = run_cli("diagnose", str(case), "--megatron-args", str(tmp_path / "run" / "megatron_args.txt"), "--json")
    assert done.returncode == 0, done.stderr
    import json
    best, read = json.loads(planned.stdout)["best"], json.loads(done.stdout)["config"]
    assert read["layout"] == best["layout"] and read["step_time_s"] == best["step_time_s"]


def test_switches_a_list_leaves_out_that_build_another_model_are_said(tmp_path):
    """An argument list without --swiglu, --group-query-attention and --untie-embeddings-and-output-
    weights builds another model in Megatron-LM (GeLU: 51.8B parameters; 64 KV heads: 79.9B; tied)
    than the Llama 3 70B case, and diagnose said nothing."""
    from planner.diagnose import diagnose

    (tmp_path / "case.yaml").write_text(LLAMA_70B_ON_64)
    args = tmp_path / "args.txt"
    args.write_text("--tensor-model-parallel-size 8 --pipeline-model-parallel-size 2 --micro-batch-size 1 "
                    "--global-batch-size 64 --seq-length 4096 --num-layers 80 --hidden-size 8192 "
                    "--num-attention-heads 64 --ffn-hidden-size 28672 --bf16 --use-distributed-optimizer\n")
    notes = diagnose(tmp_path / "case.yaml", megatron_args=args).notes
    for flag in ("--swiglu", "--group-query-attention", "--untie-embeddings-and-output-weights"):
        assert any(n.startswith(f"args.txt leaves out {flag}: Megatron-LM would build") for n in notes), flag
    args.write_text(args.read_text().strip() + " --swiglu --group-query-attention --num-query-groups 8 "
                                               "--untie-embeddings-and-output-weights\n")
    assert not [n for n in diagnose(tmp_path / "case.yaml", megatron_args=args).notes if "Megatron-LM would build" in n]
    # --quick-geglu gates the MLP as --swiglu does (GPT-OSS's examples/gptoss/02_train.sh): it was said to
    # build GeLU, and a user who then wrote activation: gelu was priced at 239M parameters for its 289M.
    args.write_text(args.read_text().replace("--swiglu", "--quick-geglu"))
    assert not [n for n in diagnose(tmp_path / "case.yaml", megatron_args=args).notes if "Megatron-LM would build" in n]


def test_a_list_without_bf16_or_fp16_is_said_to_train_fp32_and_another_optimizer_is_refused(tmp_path):
    """Megatron-LM trains in fp32 where neither --bf16 nor --fp16 is given, and steps SGD with
    --optimizer sgd (no moments): the list was priced as the case's bf16 Adam without a word."""
    from planner.errors import CaseError

    adamw = LLAMA_70B_ON_64.replace("seq_len: 4096", "seq_len: 4096, optimizer: adamw")
    base = "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 64"
    assert "args.txt gives neither --bf16 nor --fp16: Megatron-LM would train in fp32 (its default), the case in " \
           "bf16; priced as the case's" in diagnosed(tmp_path, base + "\n", adamw).notes
    assert not [n for n in diagnosed(tmp_path, base + " --bf16 --optimizer adam\n", adamw).notes if "fp32" in n]
    with pytest.raises(CaseError, match=r"args.txt: --optimizer: --optimizer sgd, but the case's optimizer is adamw"):
        diagnosed(tmp_path, base + " --bf16 --optimizer sgd\n", adamw)


def test_attention_and_experts_a_list_builds_otherwise_are_said_or_refused(tmp_path):
    """--window-size, --multi-latent-attention and --expert-model-parallel-size on a dense Llama
    case read as the case's model with nothing said; megatron-core refuses the last outright."""
    from planner.errors import CaseError

    base = "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 2 --micro-batch-size 1 " \
           "--global-batch-size 64 --bf16"
    notes = diagnosed(tmp_path, base + " --window-size 128,0 --multi-latent-attention\n").notes
    assert any(n.startswith("args.txt gives --window-size: Megatron-LM would build sliding-window attention (128,0)")
               for n in notes)
    assert any(n.startswith("args.txt gives --multi-latent-attention: Megatron-LM would build MLA") for n in notes)
    with pytest.raises(CaseError, match="--expert-model-parallel-size: needs a mixture of experts"):
        diagnosed(tmp_path, base + " --expert-model-parallel-size 2\n")


def test_a_switch_given_a_value_is_refused_as_argparse_refuses_it(tmp_path):
    """--sequence-parallel=True was read as the switch; Megatron-LM's parser stops on it."""
    from planner.errors import CaseError

    with pytest.raises(CaseError, match="--sequence-parallel: is a switch and takes no value"):
        diagnosed(tmp_path, "--tensor-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 64 --bf16 "
                            "--sequence-parallel=True\n")


def test_a_list_without_the_data_parallel_overlap_the_estimate_credits_is_said(tmp_path):
    """Removing --overlap-grad-reduce or --overlap-param-gather from the planner's own files changed
    nothing and said nothing: Megatron-LM runs that traffic in the step without them."""
    base = "--tensor-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 64 --bf16 " \
           "--use-distributed-optimizer --sequence-parallel"
    notes = diagnosed(tmp_path, base + "\n").notes
    assert any(n.startswith("args.txt leaves out --overlap-grad-reduce and --overlap-param-gather: Megatron-LM would "
                            "run that data-parallel traffic in the step") for n in notes)
    assert not [n for n in diagnosed(tmp_path, base + " --overlap-grad-reduce --overlap-param-gather\n").notes
                if "overlap" in n]


@pytest.mark.parametrize("flags", ["--overlap-grad-reduce --overlap-param-gather",  # no distributed optimizer
                                   "--use-distributed-optimizer --overlap-param-gather"])  # no grad-reduce overlap
def test_a_param_gather_overlap_megatron_lm_refuses_is_refused(tmp_path, flags):
    """validate_args (megatron/training/arguments.py): --overlap-param-gather only with the distributed
    optimizer or Megatron-FSDP, and only beside --overlap-grad-reduce. Taking either out of the
    planner's files (which carry --overlap-param-gather) was read as ZeRO 0, or as an overlap the step
    pays, where the launch stops before its first step."""
    base = "--tensor-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 64 --bf16 --sequence-parallel "
    with pytest.raises(CaseError) as refused:
        diagnosed(tmp_path, base + flags + "\n")
    assert refused.value.key == "--overlap-param-gather" and "would not start" in refused.value.expected


def test_uniform_recomputation_of_chunks_is_refused_not_priced_as_single_layers(tmp_path):
    """Megatron's uniform method checkpoints chunks of --recompute-num-layers layers and holds a chunk's
    activations in its backward (TransformerBlock._checkpointed_forward): every N was priced as chunks
    of one (4.3 GB of activations where N = 32 holds about 21)."""
    base = ("--tensor-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 64 --bf16 --sequence-parallel "
            "--use-distributed-optimizer --recompute-granularity full --recompute-method uniform ")
    assert diagnosed(tmp_path, base + "--recompute-num-layers 1\n").estimate.job.layout.recompute == "full"
    with pytest.raises(CaseError) as refused:
        diagnosed(tmp_path, base + "--recompute-num-layers 4\n")
    assert refused.value.key == "--recompute-num-layers" and "chunks of 4 layers" in refused.value.expected


@pytest.mark.parametrize("flag, says", [
    ("--checkpoint-activations", "no longer valid in Megatron-LM, which stops on it"),
    ("--model-parallel-size 2", "no longer valid in Megatron-LM, which stops on it"),
    ("--deepspeed", "a Megatron-DeepSpeed argument, which Megatron-LM's parser refuses"),
    ("--moe-expert-parallel-size 8", "a Megatron-DeepSpeed argument"),
    ("--num-key-value-heads 8", "a Megatron-DeepSpeed argument"),
    # Megatron-LM's own examples/academic_paper_scripts/sc21 (core_v0.16.1) pass both; its parser no
    # longer defines either ("unrecognized arguments"), and the first was read as no recomputation.
    ("--activations-checkpoint-method uniform", "no longer defined in Megatron-LM, whose parser stops on it"),
    ("--DDP-impl local", "no longer defined in Megatron-LM"),
    # examples/mamba/train.sh: a hybrid Mamba model, priced as 32 transformer layers
    ("--hybrid-attention-ratio 0.08", "builds a hybrid Mamba model (pretrain_mamba.py)"),
])
def test_an_argument_megatron_lm_stops_on_or_megatron_deepspeeds_is_refused(tmp_path, flag, says):
    """Read as Megatron-LM's, --checkpoint-activations was no recomputation and --model-parallel-size 2
    tp 1 (Megatron-LM's validate_args stops on both: "no longer valid"), and Megatron-DeepSpeed's
    --moe-expert-parallel-size 64 went unread (a 6.14x speedup claimed on its own script)."""
    with pytest.raises(CaseError) as error:
        diagnosed(tmp_path, ARGS.replace("\n", f" {flag}\n"), CASE)
    assert error.value.key == flag.split()[0] and says in error.value.expected


def test_a_megatron_deepspeed_launch_is_named_before_the_arguments_its_fork_reads_otherwise(tmp_path):
    """Megatron-DeepSpeed's examples_deepspeed/pretrain_llama2_distributed.sh passes --normalization rmsnorm
    (its parser's choices are lower-case, megatron/arguments.py) before --deepspeed: the launch was refused
    as one that "would not start", which it does, on its own engine."""
    with pytest.raises(CaseError) as error:
        diagnosed(tmp_path, ARGS.replace("\n", " --normalization rmsnorm --deepspeed --deepspeed_config=ds.json\n"),
                  CASE)
    assert error.value.key == "--deepspeed" and "diagnose a Megatron-DeepSpeed run by its ds_config" \
        in error.value.expected


def test_a_batch_ramp_up_is_said(tmp_path):
    """Megatron-LM's GPT-3 175B example ramps its batch up (--rampup-batch-size 16 16 5859375): diagnosed at
    the global batch it reaches, with nothing said of the smaller steps before it."""
    result = diagnosed(tmp_path, ARGS.replace("\n", " --rampup-batch-size 16 16 5859375\n"), CASE)
    assert "args.txt ramps the global batch up (--rampup-batch-size 16 16 5859375): diagnosed at the batch it " \
           "reaches, 128" in " ".join(result.notes)


def test_a_batch_ramp_up_with_iteration_based_training_is_refused(tmp_path):
    """Megatron-LM's GPT-3 175B example on the 16 nodes its comment asks for gives --rampup-batch-size
    with --train-iters, which validate_args refuses (megatron/training/arguments.py: "expected no
    batch-size rampup for iteration-based training"): it was estimated and advised on."""
    with pytest.raises(CaseError) as error:
        diagnosed(tmp_path, ARGS.replace("\n", " --rampup-batch-size 16 16 5859375 --train-iters=500000\n"), CASE)
    assert error.value.key == "--rampup-batch-size" and "--train-iters" in error.value.expected


@pytest.mark.parametrize("program, builds", [("pretrain_mamba.py", "a hybrid Mamba model"),
                                             ("pretrain_t5.py", "an encoder-decoder T5 model"),
                                             ("pretrain_bert.py", "a BERT encoder")])
def test_a_launch_of_another_model_than_a_gpt_is_refused(tmp_path, program, builds):
    """Megatron-LM's examples/t5/train_t5_220m_distributed.sh and examples/mamba/train.sh were priced as
    decoder-only transformers of --num-layers layers (T5's decoder and cross-attention, Mamba's
    layers unpriced), with nothing said."""
    from planner.diagnose import diagnose

    (tmp_path / "case.yaml").write_text(CASE)
    (tmp_path / "train.sh").write_text(f"#!/bin/bash\nARGS=({ARGS.strip()})\n"
                                       f"torchrun --nproc-per-node 8 --nnodes 2 {program} ${{ARGS[@]}}\n")
    with pytest.raises(CaseError) as error:
        diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "train.sh")
    assert error.value.key == program and f"line 3: trains {builds}, which diagnose does not price" \
        in error.value.expected


@pytest.mark.parametrize("program", ["pretrain_mamba.py", "pretrain_hybrid.py"])
def test_a_hybrid_launch_is_refused_for_its_program_not_its_flags(tmp_path, program):
    """Megatron-LM's examples/mamba/train.sh (pretrain_hybrid.py from core_v0.18.0 on, with
    --hybrid-layer-pattern, core_v0.17.0 on) was blamed on --hybrid-layer-pattern as "no Megatron-LM
    argument ... the run would not start"; the run starts, and trains a model diagnose does not price."""
    from planner.diagnose import diagnose

    (tmp_path / "case.yaml").write_text(CASE)
    (tmp_path / "train.sh").write_text(f"#!/bin/bash\nARGS=({ARGS.strip()} --hybrid-layer-pattern M-M*-)\n"
                                       f"torchrun --nproc-per-node 8 --nnodes 2 {program} ${{ARGS[@]}}\n")
    with pytest.raises(CaseError) as error:
        diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "train.sh")
    assert error.value.key == program and "line 3: trains a hybrid Mamba model, which diagnose does not price" \
        in error.value.expected


def test_megatron_lms_mamba_example_is_refused_for_its_program(tmp_path):
    """The mirror's examples/mamba/train.sh (newest release) is refused by its program's name."""
    import subprocess
    from pathlib import Path

    from planner.diagnose import diagnose

    mirror = Path("/work/.mirror/NVIDIA+Megatron-LM/repo")
    shown = subprocess.run(["git", "--git-dir", str(mirror), "show", "core_v0.19.0:examples/mamba/train.sh"],
                           capture_output=True, text=True) if mirror.is_dir() else None
    if shown is None or shown.returncode:
        pytest.skip("no Megatron-LM clone with core_v0.19.0")
    (tmp_path / "case.yaml").write_text(CASE)
    (tmp_path / "train.sh").write_text(shown.stdout)
    with pytest.raises(CaseError) as error:
        diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "train.sh")
    assert error.value.key == "pretrain_hybrid.py" and "trains a hybrid Mamba model" in error.value.expected, \
        str(error.value)


def test_another_programs_own_flags_are_not_refused_as_megatron_lms(tmp_path):
    """examples/multimodal/train.py adds flags of its own to Megatron-LM's parser (--use-tiling); a
    launch of it was refused as "no Megatron-LM argument ... the run would not start", which is false:
    its parser is not known here, so an unknown flag is let through, and the reading says so."""
    from planner.engines.megatron.launch import launch_notes

    (tmp_path / "case.yaml").write_text(CASE)
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\nARGS=({ARGS.strip()} --use-tiling --max-num-tiles 12)\n"
                      "torchrun --nproc-per-node 8 --nnodes 2 examples/multimodal/train.py ${ARGS[@]}\n")
    done = run_cli("diagnose", str(tmp_path / "case.yaml"), "--megatron-args", str(script))
    assert done.returncode == 0, done.stderr
    assert any("examples/multimodal/train.py is not Megatron-LM's pretrain_gpt.py: its parser is not known here"
               in note for note in launch_notes(script))
    script.write_text(script.read_text().replace("examples/multimodal/train.py", "pretrain_gpt.py"))
    done = run_cli("diagnose", str(tmp_path / "case.yaml"), "--megatron-args", str(script))
    assert done.returncode == 2 and "--use-tiling: is no Megatron-LM argument" in done.stderr, done.stderr


def test_a_script_that_starts_nothing_says_what_it_did_not_follow(tmp_path):
    """Megatron-LM's examples/academic_paper_scripts/sc21/run_figure_11.sh sources its arguments and its
    srun (`. CONFIG.sh`, `. SBATCH.sh`): the refusal said the script starts no command, not why."""
    from planner.diagnose import diagnose

    (tmp_path / "case.yaml").write_text(CASE)
    (tmp_path / "run.sh").write_text("#!/bin/bash\nTP=8\n. `pwd`/CONFIG.sh\n")
    with pytest.raises(CaseError) as error:
        diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "run.sh")
    assert "the script starts no command" in error.value.expected
    assert "line 3: . /CONFIG.sh is not followed" in error.value.expected


MIXTRAL_ON_64 = ("model: {preset: mixtral-8x7b}\ncluster: {gpu: h100-sxm-80gb, num_gpus: 64}\n"
                 "training: {global_batch_size: 256, seq_len: 4096, precision: bf16, engine: megatron}\n")
MIXTRAL_ARGS = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
                "--group-query-attention --num-query-groups 8 --swiglu --untie-embeddings-and-output-weights "
                "--seq-length 4096 --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm --micro-batch-size 1 "
                "--global-batch-size 256 --bf16 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 "
                "--expert-model-parallel-size 8 --use-distributed-optimizer ")


def test_moe_layer_recompute_is_selective_recomputation_of_the_experts(tmp_path):
    """megatron-core turns --moe-layer-recompute into selective recomputation with "moe" added to the
    modules (TransformerConfig.__post_init__); it was read as no recomputation (31.7 GB of
    activations priced where the run keeps 7.8)."""
    legacy = diagnosed(tmp_path, MIXTRAL_ARGS + "--moe-token-dispatcher-type alltoall --moe-layer-recompute",
                       MIXTRAL_ON_64).estimate.job.layout
    assert (legacy.recompute, legacy.recompute_modules) == ("selective", ("core_attn", "moe"))
    with pytest.raises(CaseError, match="--moe-layer-recompute: megatron-core refuses it with full"):
        diagnosed(tmp_path, MIXTRAL_ARGS + "--moe-layer-recompute --recompute-granularity full "
                  "--recompute-method uniform --recompute-num-layers 1", MIXTRAL_ON_64)


def test_the_flex_dispatcher_runs_deepep_unless_told_otherwise(tmp_path):
    """megatron-core's moe_flex_dispatcher_backend defaults to deepep: flex with no backend was read
    as the all-to-all, and a case saying deepep refused."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    assert {f.name: f.default for f in dataclasses.fields(TransformerConfig)}["moe_flex_dispatcher_backend"] == "deepep"
    flex = diagnosed(tmp_path, MIXTRAL_ARGS + "--moe-token-dispatcher-type flex",
                     MIXTRAL_ON_64.replace("engine: megatron", "engine: megatron, expert_dispatch: deepep"))
    assert flex.estimate.job.training.expert_dispatch == "deepep"


def test_megatron_fsdp_keeps_its_gradients_in_the_dtype_its_flag_names(tmp_path):
    """--megatron-fsdp-main-grads-dtype bf16 (Megatron-LM's DeepSeek-V3 Megatron-FSDP example sets it)
    was ignored: fp32 gradients were priced, and a case saying fp32_grads: false was refused."""
    case = ("model: {preset: llama3-8b}\ncluster: {gpu: h100-sxm-80gb, num_gpus: 8}\n"
            "training: {global_batch_size: 128, seq_len: 8192, precision: bf16, engine: megatron, fp32_grads: false}\n")
    args = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
            "--group-query-attention --num-query-groups 8 --swiglu --untie-embeddings-and-output-weights "
            "--seq-length 8192 --micro-batch-size 1 --global-batch-size 128 --bf16 --use-megatron-fsdp "
            "--data-parallel-sharding-strategy optim_grads_params --use-distributed-optimizer "
            "--megatron-fsdp-main-grads-dtype bf16")
    assert diagnosed(tmp_path, args, case).estimate.job.training.fp32_grads is False


def test_a_step_batch_size_schedule_is_read_at_the_batch_it_reaches(tmp_path):
    """Megatron-LM's GPT-3 175B example ramps its batch with --step-batch-size-schedule "0:16 ...
    12B:1536" (the calculator's global batch is the last entry's): alone it was refused as a missing
    --global-batch-size; beside one, which validate_args refuses, it was accepted."""
    schedule = '--step-batch-size-schedule "0:16 2.4B:64 4.8B:128"'
    args = ARGS.replace("--global-batch-size 128", schedule)
    result = diagnosed(tmp_path, args, CASE)
    assert result.estimate.job.training.global_batch_size == 128
    assert any("ramps the global batch up (--step-batch-size-schedule" in n for n in result.notes)
    with pytest.raises(CaseError, match="--step-batch-size-schedule: cannot be given with --global-batch-size"):
        diagnosed(tmp_path, ARGS.replace("--global-batch-size 128", "--global-batch-size 128 " + schedule), CASE)


def test_a_setting_its_own_arguments_cannot_take_is_named_at_their_flag(tmp_path):
    """--tp-comm-overlap without --sequence-parallel was refused as the case's training.tp_comm_overlap,
    a key the case does not set; it is the arguments' flag."""
    args = ARGS.replace("--tensor-model-parallel-size 4", "--tensor-model-parallel-size 4 --tp-comm-overlap")
    with pytest.raises(CaseError) as error:
        diagnosed(tmp_path, args, CASE)
    assert error.value.source.endswith("args.txt") and error.value.key == "--tp-comm-overlap"
    assert "needs --sequence-parallel" in error.value.expected


def test_moe_overlap_with_the_allgather_dispatcher_is_refused_as_megatron_core_refuses_it(tmp_path):
    """megatron-core asserts --overlap-moe-expert-parallel-comm runs the alltoall or flex dispatcher;
    with the default allgather the list was accepted."""
    with pytest.raises(CaseError, match="--overlap-moe-expert-parallel-comm: needs --moe-token-dispatcher-type "
                                        "alltoall or flex, got allgather"):
        diagnosed(tmp_path, MIXTRAL_ARGS + "--overlap-moe-expert-parallel-comm", MIXTRAL_ON_64)


def test_torch_distributed_launch_is_read_as_torchrun(tmp_path):
    """python -m torch.distributed.launch --nproc_per_node 8 on a 16-GPU case was not checked, as
    torchrun's is (it runs the same launcher, one node unless --nnodes says)."""
    (tmp_path / "case.yaml").write_text(CASE)
    (tmp_path / "launch.sh").write_text("python -m torch.distributed.launch --nproc_per_node 8 pretrain_gpt.py "
                                        + ARGS)
    from planner.diagnose import diagnose

    with pytest.raises(CaseError, match="--nnodes: absent, so torchrun starts one node of 8 processes"):
        diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "launch.sh")


DEEPSEEK_V3_ON_256 = ("model: {preset: deepseek-v3}\ncluster: {gpu: h100-sxm-80gb, num_gpus: 256}\n"
                      "training: {global_batch_size: 2048, seq_len: 4096, precision: bf16, engine: megatron}\n")
DEEPSEEK_V3_ARGS = ("--num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 "
                    "--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 "
                    "--qk-pos-emb-head-dim 64 --v-head-dim 128 --swiglu --untie-embeddings-and-output-weights "
                    "--num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048 "
                    "--moe-shared-expert-intermediate-size 2048 --moe-router-num-groups 8 --moe-router-group-topk 4 "
                    "--moe-token-dispatcher-type alltoall --mtp-num-layers 1 --seq-length 4096 --micro-batch-size 1 "
                    "--global-batch-size 2048 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
                    "--expert-model-parallel-size 8 --use-distributed-optimizer --bf16 ")


def test_the_layers_given_experts_are_the_cases(tmp_path):
    """DeepSeek-V3 with --moe-layer-freq 1 (or none: Megatron-LM's default) builds 61 MoE layers; it was
    priced as the case's 58 (three dense first) without a word. Megatron-LM's own list, ([0]*3+[1]*58),
    reads as the case's, inside an array's parentheses too."""
    assert diagnosed(tmp_path, DEEPSEEK_V3_ARGS + "--moe-layer-freq ([0]*3+[1]*58)", DEEPSEEK_V3_ON_256).estimate
    assert diagnosed(tmp_path, "ARGS=(" + DEEPSEEK_V3_ARGS + "--moe-layer-freq ([0]*3+[1]*58))", DEEPSEEK_V3_ON_256)
    for given, said in (("--moe-layer-freq 1", "1 gives 61 of the 61 layers experts (layers 0, 1, 2, 3, …)"),
                        ("", "absent (Megatron-LM's default 1: experts in every layer) gives 61 of the 61")):
        with pytest.raises(CaseError, match=re.escape(f"--moe-layer-freq: {said}") + ".*the case's model 58 of the "
                                            "61 layers experts \\(layers 3, 4, 5, 6, …\\)"):
            diagnosed(tmp_path, DEEPSEEK_V3_ARGS + given, DEEPSEEK_V3_ON_256)
    with pytest.raises(CaseError, match=r"--moe-layer-freq: lists 60 layers; megatron-core expects one entry per "
                                        r"layer, 61"):
        diagnosed(tmp_path, DEEPSEEK_V3_ARGS + "--moe-layer-freq ([0]*2+[1]*58)", DEEPSEEK_V3_ON_256)
    with pytest.raises(CaseError, match="--moe-layer-freq: expected an integer or a list expression"):
        diagnosed(tmp_path, DEEPSEEK_V3_ARGS + "--moe-layer-freq __import__('os')", DEEPSEEK_V3_ON_256)
    # a list of lists is no layer pattern (Megatron-LM: "Invalid layer pattern"); it was said to give
    # 61 of the 61 layers experts, the case's model 61 of 61
    with pytest.raises(CaseError, match="--moe-layer-freq: expected an integer or a list expression"):
        diagnosed(tmp_path, DEEPSEEK_V3_ARGS + "--moe-layer-freq [[1]]*61", DEEPSEEK_V3_ON_256)


MISTRAL_ON_8 = ("model: {preset: mistral-7b}\ncluster: {gpu: h100-sxm-80gb, num_gpus: 8}\n"
                "training: {global_batch_size: 64, seq_len: 8192, engine: megatron}\n")
MISTRAL_ARGS = ("--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --micro-batch-size 1 "
                "--global-batch-size 64 --seq-length 8192 --bf16 --num-layers 32 --hidden-size 4096 "
                "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 ")


@pytest.mark.parametrize("given, flag, said", [
    ("--window-size 128,0", "--window-size", "128,0 differs from the case's window of 4096 keys to the left"),
    ("--window-size abc", "--window-size", "Megatron-LM's parser refuses it (tuple_type)"),
    ("--window-size nan,inf", "--window-size", "got 'nan,inf'"),
    ("--window-size 4096,0 --window-attn-skip-freq 2", "--window-attn-skip-freq", "2 differs from the case's none"),
    ("--window-size 4096,0 --window-attn-skip-freq xyz", "--window-attn-skip-freq", "expected an integer"),
])
def test_a_window_megatron_would_build_otherwise_or_refuse_is_refused(tmp_path, given, flag, said):
    """Mistral 7B's window of 4096 in every layer: any --window-size was read back as the case's, and
    values Megatron-LM's tuple_type refuses passed, exit 0."""
    assert diagnosed(tmp_path, MISTRAL_ARGS + "--window-size 4096,0", MISTRAL_ON_8).estimate
    with pytest.raises(CaseError) as error:
        diagnosed(tmp_path, MISTRAL_ARGS + given, MISTRAL_ON_8)
    assert error.value.key == flag and said in error.value.expected, str(error.value)


def test_a_mock_data_vocabulary_is_the_cases_or_pads_to_it(tmp_path):
    """--vocab-size 32000 (the NullTokenizer's, mock data) was priced as the case's 128,256 without a
    word; Megatron-LM pads a vocabulary up to a multiple of 128 × tp (_vocab_size_with_padding)."""
    base = ARGS + "--num-layers 32 --hidden-size 4096 --tokenizer-type NullTokenizer "
    assert diagnosed(tmp_path, base + "--vocab-size 32000", CASE).estimate  # Llama 2: 32,000
    with pytest.raises(CaseError, match=r"--vocab-size: 32001 \(padded to 32256\) differs from the case's 32000"):
        diagnosed(tmp_path, base + "--vocab-size 32001", CASE)
    # A real tokenizer brings its own vocabulary: --vocab-size is not Megatron-LM's then.
    assert diagnosed(tmp_path, ARGS + "--tokenizer-type HuggingFaceTokenizer --vocab-size 5", CASE).estimate


def test_layers_per_virtual_stage_count_the_embedding_and_loss_where_accounted(tmp_path):
    """Llama 3.1 405B: (126 + 2) / pp 8 = 16 a stage, 2 a chunk: vpp 8, as Megatron-LM's arguments.py
    counts them; it was refused as 2 not dividing 15."""
    case = ("model: {preset: llama3.1-405b}\ncluster: {gpu: h100-sxm-80gb, num_gpus: 1024}\n"
            "training: {global_batch_size: 2048, seq_len: 8192, precision: bf16, engine: megatron}\n")
    args = ("--tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 --context-parallel-size 2 "
            "--sequence-parallel --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
            "--micro-batch-size 1 --global-batch-size 2048 --seq-length 8192 --bf16 --use-distributed-optimizer ")
    per_chunk = diagnosed(tmp_path, args + "--num-layers-per-virtual-pipeline-stage 2", case).estimate.job.layout
    chunks = diagnosed(tmp_path, args + "--num-virtual-stages-per-pipeline-rank 8", case).estimate.job.layout
    assert per_chunk.vpp == chunks.vpp == 8 and per_chunk == chunks


def test_a_count_a_scripts_default_decided_names_the_default(tmp_path):
    """Megatron-LM's Mixtral example sets NNODES=${SLURM_NNODES:-"1"}: refused against a 64-GPU case,
    the message named only $1 (the checkpoint path), not the default that made the 8 GPUs."""
    script = ("#!/bin/bash\nGPUS_PER_NODE=8\nNNODES=${SLURM_NNODES:-\"1\"}\nCHECKPOINT_PATH=$1\n"
              "torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py " + MIXTRAL_ARGS
              + "--save $CHECKPOINT_PATH\n")
    with pytest.raises(CaseError, match=r"--nnodes x --nproc-per-node = 8 GPUs, but the case has 64 \(the script "
                                        r"leaves unset SLURM_NNODES: read as its default '1'"):
        diagnosed(tmp_path, script, MIXTRAL_ON_64)


@pytest.mark.parametrize("typo", ["--tensor-model-parallel-sizee", "--num-layerss", "--context-parallel-size2"])
def test_letters_run_on_to_a_flag_are_a_misspelling(typo):
    """A known flag's extension by a word is another flag (--tp-comm-overlap-ag); letters run on to
    one are a typo Megatron-LM's parser refuses: --tensor-model-parallel-sizee 8 was read as tp 1."""
    with pytest.raises(CaseError) as refused:
        flags_of([typo, "8", "--bf16"], "args.txt")
    assert refused.value.key == typo and "did you mean" in refused.value.expected


@pytest.mark.parametrize("written", ["--tensor-model-parallel-size\u00a08", "--tensor-model-parallel-size\v8",
                                     "--tensor-model-parallel-size\u20038"])
def test_a_space_bash_does_not_split_at_keeps_the_flag_and_its_value_one_word(written):
    """bash splits a launch's words at spaces, tabs and newlines only: a no-break space, a vertical tab
    or an em space holds the flag and its value in one word, which Megatron-LM's parser refuses. Read
    at every Unicode space, it was tp 8, and the launch would not have started."""
    with pytest.raises(CaseError) as refused:
        flags_of(split_words(f"{written} --bf16"), "args.txt")
    assert "did you mean --tensor-model-parallel-size?" in refused.value.expected


@pytest.mark.parametrize("typo, says", [("-tensor-model-parallel-size", "one dash"),
                                        ("--tensor_model_parallel_size", "no underscores")])
def test_one_dash_or_underscores_are_no_flag_of_megatron_lm(typo, says):
    """argparse matches option strings as written: a one-dash or underscored --tensor-model-parallel-size
    is refused by Megatron-LM's parser, and was read as no flag (tp 1)."""
    with pytest.raises(CaseError) as refused:
        flags_of(["pretrain_gpt.py", typo, "8", "--bf16"], "args.txt")
    assert refused.value.key == typo and says in refused.value.expected


def taken(flag: str) -> list[str]:
    """Words Megatron-LM's parser takes after ``flag``, by its line of megatron_lm_flags.txt: none after a
    switch, its first choice, or as many words as its nargs asks of "1" (an int, a float, a str)."""
    from planner.engines.megatron.launch import PARSER_VALUES

    if flag not in PARSER_VALUES:
        return []
    value = PARSER_VALUES[flag]
    word = value.choices[0] if value.choices else "1"
    return [word] * (int(value.nargs) if (value.nargs or "").isdigit() else 1)


def test_an_argument_list_of_more_flags_than_megatron_lm_defines_is_refused_quickly():
    """Each flag the reading does not read is checked for a misspelling: 100,000 made-up flags kept
    diagnose busy past 30 s. Megatron-LM's parsers for pretrain_gpt.py (core_v0.16.1 to core_v0.19.0)
    define 899 option strings between them."""
    import time

    from planner.engines.megatron.launch import MEGATRON_LM_FLAGS, PARSER_FLAGS

    assert MEGATRON_LM_FLAGS == 899
    words = [w for i in range(5000) for w in (f"--made-up-flag-{i}", "1")]
    started = time.perf_counter()
    with pytest.raises(CaseError) as refused:  # the first: Megatron-LM's parser defines none of them
        flags_of(words, "args.txt")
    assert refused.value.key == "--made-up-flag-0" and "is no Megatron-LM argument" in refused.value.expected
    assert time.perf_counter() - started < 5
    # Megatron-LM's many flags the layout needs not: none refused, none read
    from planner.engines.megatron.emit import ALIASES, BOOL_FLAGS, INT_FLAGS, LIST_FLAGS, STR_FLAGS
    from planner.engines.megatron.launch import HYBRID_MODEL, MEGATRON_DEEPSPEED, NO_LONGER_DEFINED, NO_LONGER_VALID

    # (those it defines only to stop on, or that build another model, are refused by name)
    read = {*INT_FLAGS, *STR_FLAGS, *BOOL_FLAGS, *LIST_FLAGS, *ALIASES, *NO_LONGER_VALID, *MEGATRON_DEEPSPEED,
            *HYBRID_MODEL, *NO_LONGER_DEFINED}
    unread = [w for flag in sorted(PARSER_FLAGS - read) if flag.startswith("--") for w in (flag, *taken(flag))]
    assert len(unread) > 2 * 400 and flags_of(unread, "args.txt") == {}


def test_a_long_word_is_split_in_linear_time():
    """shlex builds a word a character at a time: one word of 900,000 characters took 44 s (under
    the 16 MiB input bound). The split is bash's (as shlex's but for a # inside a word)."""
    import shlex
    import time

    for line in ["--a 1 --b 'x y' \"q\\\"z\" # comment", "a\\ b c", "'' \"\" a", "--f=\"a b\"c'd e'", "  x  "]:
        assert split_words(line) == shlex.split(line, comments=True)
    assert split_words("x#y z") == ["x#y", "z"] and split_words("'open") is None
    started = time.perf_counter()
    assert split_words("--foo " + "x" * 900_000) == ["--foo", "x" * 900_000]
    assert time.perf_counter() - started < 1.0


def test_an_argument_list_a_word_a_line_is_read_as_one(tmp_path):
    """A list written a word a line (a flag, then its value on the next): its pipeline layout's '|' was
    read as bash's pipe and the list refused for words Megatron-LM's parser would take."""
    words = ["--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "2", "--micro-batch-size", "1",
             "--global-batch-size", "64", "--seq-length", "4096", "--bf16", "--use-distributed-optimizer",
             "--num-layers", "80", "--pipeline-model-parallel-layout", "Et*38|t*42L"]
    one_line = diagnosed(tmp_path, " ".join(words) + "\n")
    a_line_each = diagnosed(tmp_path, "\n".join(words) + "\n")
    assert a_line_each.estimate.job.layout == one_line.estimate.job.layout
    assert a_line_each.estimate.job.layout.stage_layers == (38, 42)


def test_megatron_fsdp_defaults_that_moved_after_core_0_16_are_said_where_left_out(tmp_path):
    """Megatron-LM's own Megatron-FSDP scripts (examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh)
    leave the sharding strategy and the gradients' dtype to Megatron-LM's defaults, which core 0.17
    changed (optim_grads_params, arguments.py since 26.04; 'auto' gradients, the model's dtype): read as
    core 0.16's (no_shard, fp32), unsaid, where the run on a newer release shards everything in bf16."""
    from planner.diagnose import diagnose

    (tmp_path / "case.yaml").write_text(LLAMA_70B_ON_64)
    args = tmp_path / "args.txt"
    base = ("--tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --micro-batch-size 1 "
            "--global-batch-size 64 --seq-length 4096 --bf16 --use-distributed-optimizer --use-megatron-fsdp")
    args.write_text(base + "\n")
    notes = diagnose(tmp_path / "case.yaml", megatron_args=args).notes
    assert any("leaves out --data-parallel-sharding-strategy: read as megatron-core 0.16's default no_shard" in n
               for n in notes)
    assert any("leaves out --megatron-fsdp-main-grads-dtype: gradients read in fp32" in n for n in notes)
    args.write_text(base + " --data-parallel-sharding-strategy optim_grads_params --megatron-fsdp-main-grads-dtype bf16\n")
    notes = diagnose(tmp_path / "case.yaml", megatron_args=args).notes
    assert not [n for n in notes if "moved" in n or "megatron-core 0.16" in n]


@pytest.mark.parametrize("base, refused", [("0", True), ("-5", True), ("10000000000000", True), ("500000", False)])
def test_the_rotary_base_is_bounded_where_read(tmp_path, base, refused):
    """--rotary-base 0, -5 and 10^13 were diagnosed without a word: RoPE's base is a whole number above 0
    (arguments.py: type=int) and at most 10^12, as the Hugging Face reader bounds rope_theta."""
    args = ARGS.replace("--global-batch-size 128", "--global-batch-size 64") + f"--rotary-base {base}\n"
    if refused:
        with pytest.raises(CaseError) as error:
            diagnosed(tmp_path, args)
        assert error.value.key == "--rotary-base"
    else:
        assert diagnosed(tmp_path, args).estimate is not None


def test_an_integer_argparse_cannot_convert_is_refused_on_every_integer_flag(tmp_path):
    """--max-position-embeddings of 5,000 digits was taken (the reader bounds only the flags it uses);
    argparse's type=int refuses it (Python's 4,300-digit limit: "invalid int value")."""
    with pytest.raises(CaseError) as error:
        diagnosed(tmp_path, ARGS.replace("\n", " --max-position-embeddings " + "9" * 5000 + "\n"), CASE)
    assert error.value.key == "--max-position-embeddings" and "5,000 digits" in error.value.expected


@pytest.mark.parametrize("flag, closest", [("--tensor-parallel-size", "--tensor-model-parallel-size"),
                                           ("--tp", "--tensor-model-parallel-size"),
                                           ("--tp-size", "--tensor-model-parallel-size"),
                                           ("--tensor-model-parallel-degree", "--tensor-model-parallel-size"),
                                           ("--pp", "--pipeline-model-parallel-size"),
                                           ("--this-is-not-a-flag", None), ("-tp", "--tensor-model-parallel-size")])
def test_a_flag_megatron_lms_parser_does_not_define_is_refused(tmp_path, flag, closest):
    """Megatron-LM's parser (allow_abbrev=False, parse_args with no ignore_unknown_args) stops on any flag
    it does not define: `--tensor-parallel-size 2` (vLLM's and NeMo's spelling) or `--tp 2` was read
    as absent and priced as tp 1, exit 0, with nothing said."""
    (tmp_path / "case.yaml").write_text(CASE)
    args = tmp_path / "args.txt"
    args.write_text(ARGS.replace("--tensor-model-parallel-size 4", f"{flag} 4"))
    done = run_cli("diagnose", str(tmp_path / "case.yaml"), "--megatron-args", str(args))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    said = f"args.txt: {flag}: is no Megatron-LM argument (core_v0.16.1 to core_v0.19.0 define none such" + \
        (f"; the closest: {closest})" if closest else "):")
    assert said in done.stderr and "pretrain_gpt.py's parser refuses" in done.stderr, done.stderr


def test_a_deprecated_flag_megatron_lms_parser_still_defines_reads_as_the_list_without_it(tmp_path):
    """--no-async-tensor-model-parallel-allreduce was refused as no longer defined, but core_v0.16.1 still
    makes it from ModelParallelConfig.async_tensor_model_parallel_allreduce ("NOTE: Deprecated. This flag
    is ignored.", megatron/core/model_parallel_config.py): the run starts, as without it."""
    (tmp_path / "case.yaml").write_text(CASE)
    args = tmp_path / "args.txt"
    args.write_text(ARGS)
    (tmp_path / "with.txt").write_text(ARGS + "\n--no-async-tensor-model-parallel-allreduce\n")
    without = run_cli("diagnose", str(tmp_path / "case.yaml"), "--megatron-args", str(args), "--json")
    given = run_cli("diagnose", str(tmp_path / "case.yaml"), "--megatron-args", str(tmp_path / "with.txt"), "--json")
    assert given.returncode == without.returncode == 0, given.stderr
    assert json.loads(given.stdout)["config"] == json.loads(without.stdout)["config"]


def test_the_shipped_flags_are_megatron_lms_parsers():
    """megatron_lm_flags.txt holds the option strings of Megatron-LM's parsers for pretrain_gpt.py,
    core_v0.16.1 to core_v0.19.0 (add_megatron_arguments and pretrain_gpt.py's add_modelopt_args): a
    few known to be there and to be not; against the parsers themselves where a Megatron-LM clone with
    those releases is at hand (bench/megatron_lm_flags.py builds them from the clone)."""
    import subprocess
    import sys
    from pathlib import Path

    from planner.engines.megatron.launch import PARSER_FLAGS, PARSER_RELEASES

    assert PARSER_RELEASES == ("core_v0.16.1", "core_v0.17.0", "core_v0.17.1", "core_v0.18.0", "core_v0.18.2",
                               "core_v0.19.0")
    assert {"--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
            "--micro-batch-size", "--global-batch-size", "--seq-length", "--bf16", "--use-distributed-optimizer",
            "--recompute-granularity", "--num-experts", "--tp-comm-overlap", "--help", "-h",
            "--export-te-mcore-model", "--export-force-local-attention",  # add_modelopt_args (pretrain_gpt.py)
            "--megatron-fsdp-grad-comm-dtype", "--hybrid-layer-pattern",  # core_v0.17.0 on
            "--step-batch-size-schedule"} <= PARSER_FLAGS  # core_v0.18.0 on
    assert not {"--tensor-parallel-size", "--tp", "--nnodes", "--nproc-per-node", "--deepspeed",
                "--activations-checkpoint-method"} & PARSER_FLAGS
    mirror = Path("/work/.mirror/NVIDIA+Megatron-LM/repo")
    if not mirror.is_dir() or any(subprocess.run(["git", "--git-dir", str(mirror), "rev-parse", "-q", "--verify",
                                                  ref], capture_output=True).returncode for ref in PARSER_RELEASES):
        pytest.skip("no Megatron-LM clone with core_v0.16.1 to core_v0.19.0 to build the parsers from")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "bench" / "megatron_lm_flags.py"), str(mirror), "--check"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("line", ["--export-te-mcore-model", "--export-force-local-attention",
                                  "--megatron-fsdp-grad-comm-dtype bf16", "--export-kd-teacher-load /ckpt"])
def test_a_flag_some_release_or_pretrain_gpts_modelopt_args_define_reads_as_without_it(tmp_path, line):
    """pretrain_gpt.py adds add_modelopt_args's flags (--export-te-mcore-model) wherever nvidia-modelopt
    is installed, and later releases define flags core_v0.16.1 lacks (--megatron-fsdp-grad-comm-dtype,
    core_v0.17.0): both were refused as "no Megatron-LM argument ... the run would not start"."""
    (tmp_path / "case.yaml").write_text(CASE)
    (tmp_path / "with.txt").write_text(ARGS + line + "\n")
    (tmp_path / "without.txt").write_text(ARGS)
    given = run_cli("diagnose", str(tmp_path / "case.yaml"), "--megatron-args", str(tmp_path / "with.txt"), "--json")
    without = run_cli("diagnose", str(tmp_path / "case.yaml"), "--megatron-args", str(tmp_path / "without.txt"),
                      "--json")
    assert given.returncode == without.returncode == 0, given.stderr
    assert json.loads(given.stdout)["config"] == json.loads(without.stdout)["config"]


@pytest.mark.parametrize("line, said", [
    # The union of the releases' flags refuses what none defines, naming the releases.
    ("--frobnicate-layout-knob 3",
     "--frobnicate-layout-knob: is no Megatron-LM argument (core_v0.16.1 to core_v0.19.0 define none such)"),
    # A flag the reading does not read, with a value its parser refuses (the rows above, through the CLI).
    ("--lr-decay-style banana",
     "args.txt: --lr-decay-style: expected one of constant, linear, cosine, inverse-square-root, WSD, got 'banana'"),
])
def test_what_megatrons_parser_refuses_is_one_line_exit_2(tmp_path, line, said):
    (tmp_path / "case.yaml").write_text(CASE)
    (tmp_path / "args.txt").write_text(ARGS + line + "\n")
    done = run_cli("diagnose", str(tmp_path / "case.yaml"), "--megatron-args", str(tmp_path / "args.txt"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert said in done.stderr, done.stderr


def test_an_odd_context_parallelism_is_named_at_its_own_flag(tmp_path):
    """--context-parallel-size 3 on 16 GPUs was blamed on --tensor-model-parallel-size (given as 1)."""
    with pytest.raises(CaseError) as error:
        diagnosed(tmp_path, ARGS + "--context-parallel-size 3\n", CASE)
    assert error.value.key == "--context-parallel-size", str(error.value)
    assert "(--tensor-model-parallel-size 4, --pipeline-model-parallel-size 2, --context-parallel-size 3)" \
        in error.value.expected


def test_a_json_file_given_as_megatron_arguments_is_named_json(tmp_path):
    """A DeepSpeed ds_config given as Megatron-LM's arguments was refused as "--micro-batch-size: missing"."""
    (tmp_path / "case.yaml").write_text(CASE)
    (tmp_path / "ds.json").write_text('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}}\n')
    done = run_cli("diagnose", str(tmp_path / "case.yaml"), "--megatron-args", str(tmp_path / "ds.json"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "ds.json: not a Megatron-LM argument list (it is JSON: a DeepSpeed ds_config? give it to diagnose as " \
           "--config FILE)" in done.stderr


def test_a_launch_script_with_windows_line_endings_says_so(tmp_path):
    """A CRLF script whose continuations end in \\ and CR: bash continues no line there, and the refusal
    named "--micro-batch-size: missing", hiding the cause."""
    (tmp_path / "case.yaml").write_text(CASE)
    script = tmp_path / "train.sh"
    script.write_bytes(("#!/bin/bash\ntorchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py \\\n  "
                        + ARGS.strip() + "\n").replace("\n", "\r\n").encode())
    done = run_cli("diagnose", str(tmp_path / "case.yaml"), "--megatron-args", str(script))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "train.sh: line 1: has Windows (CRLF) line endings" in done.stderr


def test_fine_grained_activation_offloading_is_refused_not_priced_on_the_gpu(tmp_path):
    """--fine-grained-activation-offloading --offload-modules core_attn ... was read as no offload (exit 0,
    nothing said): megatron-core sends the inputs of those modules to the host in every layer
    (TransformerConfig.fine_grained_activation_offloading and offload_modules,
    megatron/core/transformer/transformer_config.py:889-894 at core_v0.16.1; validate_args checks it,
    megatron/training/arguments.py:1222), which the estimate does not price."""
    args = ARGS.replace("--global-batch-size 128", "--global-batch-size 64")
    assert diagnosed(tmp_path, args).estimate.job.layout.offload_activations == 0
    with pytest.raises(CaseError) as error:
        diagnosed(tmp_path, args.replace("\n", " --fine-grained-activation-offloading --offload-modules core_attn\n"))
    assert error.value.key == "--fine-grained-activation-offloading"


# Values of flags the reading does not read that Megatron-LM's parser converts and checks (their type,
# nargs and choices, megatron_lm_flags.txt, from its argparse actions): each refused where the parser
# refuses it, in one line naming the flag and what argparse expects (None: the parser takes it).
PARSER_VALUE_ROWS = [
    ("--lr abc", "--lr", "expected a number, got 'abc'"),  # type=float
    ("--weight-decay x", "--weight-decay", "expected a number, got 'x'"),
    ("--train-iters 1.5", "--train-iters", "expected an integer, got '1.5'"),  # int() refuses "1.5"
    ("--train-iters=1e3", "--train-iters", "expected an integer, got '1e3'"),
    ("--lr-decay-style banana", "--lr-decay-style", "expected one of constant, linear, cosine"),
    ("--lr-decay-style Cosine", "--lr-decay-style", "got 'Cosine'"),  # choices are case-sensitive
    ("--empty-unused-memory-level 3", "--empty-unused-memory-level", "expected one of 0, 1, 2, got '3'"),
    ("--lr --bf16", "--lr", "takes one argument, and none follows it"),
    ("--bf16 --lr", "--lr", "takes one argument, and none follows it"),
    ("--iterations-to-skip --bf16", "--iterations-to-skip", "takes at least one argument"),  # nargs='+'
    ("--iterations-to-skip 10 x", "--iterations-to-skip", "expected an integer, got 'x'"),
    # the flags the reading reads and prices take their words as argparse counts them too
    ("--recompute-modules --bf16", "--recompute-modules", "takes at least one argument, and none"),  # nargs='+'
    ("--rampup-batch-size 16 16 --bf16", "--rampup-batch-size", "takes 3 arguments, and 2 follow it"),  # nargs=3
    ("--moe-aux-loss-coeff 1e-2 abc", "--moe-aux-loss-coeff", "expected a number, got 'abc'"),
    ("--hidden-dropout -1e-1 --bf16", "--hidden-dropout", "(expected one argument)"),  # -1e-1: an option
    # argparse gives a flag as many words as its nargs takes, and refuses a word no flag takes after them
    ("--rampup-batch-size 16 16 1000 4", "--rampup-batch-size", "takes 3 values, but '4' follows"),  # nargs=3
    ("--step-batch-size-schedule 0:16 100:32", "--step-batch-size-schedule", "one value, but '100:32'"),
    ("--weight-decay 0.1 stray", "--weight-decay", "takes one value, but 'stray' follows"),
    # an option-looking word no flag defines (-1e-2 is no negative number to argparse): unrecognized
    ("--lr 1e-3 -1e-2", "--lr", "'-1e-2' follows it, which argparse takes for an option"),
    ("--iterations-to-skip 10 -1e-2", "--iterations-to-skip", "'-1e-2' follows it"),  # ends the nargs='+'
    ("--moe-aux-loss-coeff 1e-2 -1e-2", "--moe-aux-loss-coeff", "'-1e-2' follows it"),  # a read list
    ("--bf16 -1e-2", "--bf16", "takes no value, but '-1e-2' follows it"),
    # what the parser takes
    ("--lr 1e-4 --weight-decay 0.1 --train-iters 1_000", None, None),  # int() and float() take these
    # argparse's negative numbers (_negative_number_matcher) are -3 and -.5, not -3e-4: that is an option
    ("--lr -3e-4 --bf16", "--lr", "takes one argument, and none follows it"),
    ("--lr -0.5 --bf16", None, None),  # a negative number is a value, not an option, to argparse
    ("--lr-decay-style=cosine --empty-unused-memory-level 2", None, None),
    ("--iterations-to-skip 10 -20 --data-path 0.5 a 0.5 b", None, None),
    ("--data-path --bf16", None, None),  # nargs='*'
    ("--hidden-dropout -.1 --recompute-modules core_attn mlp --rampup-batch-size 16 16 1000", None, None),
    ("--moe-aux-loss-coeff 1e-2 -1 --weight-decay 0.1", None, None),  # -1: a negative number, a value
]


@pytest.mark.parametrize("words, flag, said", PARSER_VALUE_ROWS)
def test_a_value_megatrons_parser_converts_and_refuses_is_refused(words, flag, said):
    """--lr abc, --train-iters 1.5, --lr-decay-style banana passed: only the flags the reading reads had
    their values checked. Megatron-LM's parser converts every flag's words (type=int, type=float, choices,
    nargs) and stops on one it cannot, so the run would not start."""
    argv = ARGS.split() + words.split()
    if flag is None:
        assert flags_of(argv, "args.txt")["--tensor-model-parallel-size"] == "4"
        return
    with pytest.raises(CaseError) as refused:
        flags_of(argv, "args.txt")
    assert refused.value.key == flag and said in refused.value.expected, str(refused.value)


# Builds each release's parser (bench/megatron_lm_flags.py's extraction) and parses the words: "refused"
# where argparse exits (SystemExit 2), else "taken".
_REAL_PARSE = """
import argparse, contextlib, io, json, sys, typing
typing.override = getattr(typing, 'override', lambda f: f)
import torch  # noqa: imported before megatron, as pretrain_gpt.py does
tmp, extra, module, rows = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
sys.path.insert(0, tmp)
from megatron.training.arguments import add_megatron_arguments
parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
if extra != '-':
    parser = getattr(__import__(module, fromlist=[extra]), extra)(parser)
said = []
for words in rows:
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parser.parse_args(words)
        said.append('taken')
    except SystemExit:
        said.append('refused')
print(json.dumps(said))
"""


@pytest.mark.slow
@pytest.mark.parametrize("release", ["core_v0.16.1", "core_v0.19.0"])
def test_megatron_lms_own_parser_refuses_what_the_reading_refuses(tmp_path, release):
    """Each row above given to the release's real parser (megatron/training/arguments.py's
    add_megatron_arguments, and add_modelopt_args pretrain_gpt.py adds): refused where the reading
    refuses, taken where it takes. The first and the last release the flag list follows."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "bench"))
    import megatron_lm_flags

    mirror = megatron_lm_flags.MIRROR
    if not Path(mirror).is_dir() or subprocess.run(["git", "--git-dir", mirror, "rev-parse", "-q", "--verify", release],
                                                   capture_output=True).returncode:
        pytest.skip(f"no Megatron-LM clone with {release} at {mirror}")
    extra = megatron_lm_flags.extract(mirror, release, tmp_path)
    rows = [ARGS.split() + words.split() for words, _, _ in PARSER_VALUE_ROWS]
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", _REAL_PARSE, str(tmp_path), extra or "-",
                           megatron_lm_flags.EXTRA[extra] if extra else "-", json.dumps(rows)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    real = json.loads(done.stdout.splitlines()[-1])
    expected = ["taken" if flag is None else "refused" for _, flag, _ in PARSER_VALUE_ROWS]
    assert real == expected, [(row[0], r) for row, r in zip(PARSER_VALUE_ROWS, real)]
