"""`diagnose --megatron-args` reads a flag a full argument list leaves out as megatron-core 0.16's
default (docs/commands.md), and treats that default as the same value written out would be: refused
where it differs from the case's model and the estimate prices it, said in a note where it does not.
Each was priced as the case's with no word: DeepSeek-V3's list without --moe-ffn-hidden-size builds
experts 9x the case's (Megatron-LM's arguments.py:1016-1017 at core_v0.16.1)."""

from __future__ import annotations

import re

import pytest

from cli_in_process import run_cli

DEEPSEEK_V3_ON_256 = ("model: {preset: deepseek-v3}\ncluster: {gpu: h100-sxm-80gb, num_gpus: 256}\n"
                      "training: {global_batch_size: 2048, seq_len: 4096, precision: bf16, engine: megatron}\n")
# Every expert flag on a line of its own, so that a test can take one out.
DEEPSEEK_V3_ARGS = """--num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128
--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128
--qk-pos-emb-head-dim 64 --v-head-dim 128 --swiglu --untie-embeddings-and-output-weights
--num-experts 256
--moe-router-topk 8
--moe-ffn-hidden-size 2048
--moe-shared-expert-intermediate-size 2048
--moe-router-num-groups 8
--moe-router-group-topk 4
--moe-router-score-function sigmoid
--moe-layer-freq ([0]*3+[1]*58)
--moe-grouped-gemm --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 1e-4 --moe-router-enable-expert-bias
--mtp-num-layers 1 --seq-length 4096 --micro-batch-size 1 --global-batch-size 2048
--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1
--expert-model-parallel-size 8
--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --bf16
"""


def diagnose_cli(tmp_path, args_text: str):
    (tmp_path / "case.yaml").write_text(DEEPSEEK_V3_ON_256)
    (tmp_path / "args.txt").write_text(args_text)
    return run_cli("diagnose", str(tmp_path / "case.yaml"), "--megatron-args", str(tmp_path / "args.txt"))


def without(line_start: str) -> str:
    lines = [line for line in DEEPSEEK_V3_ARGS.splitlines() if not line.startswith(line_start)]
    assert len(lines) == len(DEEPSEEK_V3_ARGS.splitlines()) - 1
    return "\n".join(lines) + "\n"


def test_the_full_list_reads_without_a_word_about_the_experts(tmp_path):
    done = diagnose_cli(tmp_path, DEEPSEEK_V3_ARGS)
    assert done.returncode != 2 and not done.stderr, done.stderr  # 3: the planner's best steps faster
    assert "--moe-router-score-function" not in done.stdout + done.stderr


@pytest.mark.parametrize("flag, said", [
    ("--moe-ffn-hidden-size", "absent (Megatron-LM's default: --ffn-hidden-size, 18432) differs from the case's "
                              "2048 (model.moe_ffn_hidden_size"),
    ("--moe-router-topk", "absent (Megatron-LM's default: 2) differs from the case's 8 (model.moe_top_k"),
    ("--moe-shared-expert-intermediate-size", "absent (Megatron-LM's default: none, no shared experts) differs "
                                              "from the case's 2048 (model.moe_shared_expert_ffn_hidden_size"),
    ("--moe-router-num-groups", "absent (Megatron-LM's default: none, routing not group-limited) differs from the "
                                "case's 8 (model.moe_router_num_groups"),
    ("--moe-router-group-topk", "absent (Megatron-LM's default: none, routing not group-limited) differs from the "
                                "case's 4 (model.moe_router_group_topk"),
    ("--num-experts", "absent, and Megatron-LM refuses --expert-model-parallel-size > 1 without it (validate_args: "
                      "\"num_experts must be non None to use expert model parallelism\"): expected --num-experts 256"),
])
def test_an_expert_flag_left_out_is_megatrons_default_and_refused_where_it_is_not_the_cases(tmp_path, flag, said):
    done = diagnose_cli(tmp_path, without(flag + " ") if flag != "--num-experts" else without("--num-experts"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert re.search(rf"args\.txt: {flag}: ", done.stderr) and said in done.stderr, done.stderr


def test_no_experts_at_expert_parallelism_1_is_a_dense_model_and_refused(tmp_path):
    text = without("--num-experts").replace("--expert-model-parallel-size 8", "--expert-model-parallel-size 1")
    done = diagnose_cli(tmp_path, text)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "args.txt: --num-experts: absent (Megatron-LM's default: no experts, a dense model) differs from the " \
           "case's 256 (model.num_experts)" in done.stderr


@pytest.mark.parametrize("text, said", [
    (without("--moe-router-score-function"), "leaves out --moe-router-score-function: Megatron-LM would build a "
                                             "softmax router (its default), the case's model has a sigmoid one"),
    (DEEPSEEK_V3_ARGS.replace("score-function sigmoid", "score-function softmax"),
     "gives --moe-router-score-function: Megatron-LM would build a softmax router, the case's model has a sigmoid "
     "one"),
])
def test_a_router_scored_otherwise_than_the_case_is_said(tmp_path, text, said):
    """The score function changes the routing a launch trains and nothing the estimate prices: a note,
    whether the list writes softmax or leaves it to Megatron's default (transformer_config.py:626)."""
    from planner.diagnose import diagnose

    (tmp_path / "case.yaml").write_text(DEEPSEEK_V3_ON_256)
    (tmp_path / "args.txt").write_text(text)
    notes = " ".join(diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "args.txt").notes)
    assert f"args.txt {said}" in notes and "(model.moe_router); priced as the case's" in notes


def test_moe_act_recomputed_without_grouped_gemm_is_refused(tmp_path):
    """megatron-core refuses moe_act in --recompute-modules without --moe-grouped-gemm
    (transformer_config.py:1213-1216 at core_v0.16.1); it was priced, as if the run started."""
    text = DEEPSEEK_V3_ARGS + "--recompute-granularity selective --recompute-modules mla_up_proj moe_act\n"
    assert diagnose_cli(tmp_path, text).returncode != 2
    done = diagnose_cli(tmp_path, text.replace("--moe-grouped-gemm ", ""))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "args.txt: --recompute-modules: moe_act needs --moe-grouped-gemm beside it: megatron-core refuses it " \
           "without" in done.stderr


def test_fp16_and_bf16_together_are_refused_saying_both_were_given(tmp_path):
    """validate_args asserts not (fp16 and bf16) (arguments.py:702-703 at core_v0.16.1); the list was read
    as fp16 and, against a bf16 case, refused as training in fp16."""
    done = diagnose_cli(tmp_path, DEEPSEEK_V3_ARGS + "--fp16\n")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "args.txt: --fp16: given with --bf16: Megatron-LM refuses both together" in done.stderr
    assert "trains in fp16" not in done.stderr


def test_full_recomputation_without_a_method_says_what_is_expected(tmp_path):
    """megatron-core refuses --recompute-granularity full without --recompute-method
    (transformer_config.py:1165-1169 at core_v0.16.1); the refusal ended "got None"."""
    done = diagnose_cli(tmp_path, DEEPSEEK_V3_ARGS + "--recompute-granularity full --recompute-num-layers 1\n")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "args.txt: --recompute-method: absent, and --recompute-granularity full needs it: expected " \
           "--recompute-method uniform or block" in done.stderr and "None" not in done.stderr
