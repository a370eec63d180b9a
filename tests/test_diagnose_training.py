"""`diagnose --megatron-args` prices what Megatron-LM runs: the training settings an argument list
implies, with Megatron-LM's defaults where an argument is absent (planner/engines/megatron/read.py,
read_training), and a case that says otherwise is refused naming both."""

from __future__ import annotations

import pytest
import yaml

import planner
from planner.diagnose import diagnose
from planner.errors import CaseError
from cli_in_process import run_cli

CASE = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16"}}
ARGS = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096\n"
        "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1\n"
        "--micro-batch-size 1 --global-batch-size 64 --bf16 --use-distributed-optimizer\n")
LAYOUT = {"dp": 8, "tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 1}


def files(tmp_path, args: str, case: dict = CASE):
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    (tmp_path / "args.txt").write_text(args)
    return tmp_path / "case.yaml", tmp_path / "args.txt"


def peak_with(fp32: bool) -> float:
    case = {**CASE, "training": {**CASE["training"], "engine": "megatron", "fp32_grads": fp32}, "layout": LAYOUT}
    return planner.estimate(case).peak.total


def test_bf16_without_grad_reduce_in_bf16_is_priced_with_fp32_gradients(tmp_path):
    """Megatron-LM's validate_args turns on fp32 accumulation and all-reduce for --bf16 unless
    --grad-reduce-in-bf16: 4 bytes a gradient, not 2 (18 bytes a parameter with the distributed
    optimizer's fp32 master and moments sharded, not 16)."""
    case, args = files(tmp_path, ARGS)
    fp32, bf16 = peak_with(True), peak_with(False)
    assert fp32 - bf16 == pytest.approx(2 * 8_030_261_248, rel=0.01)
    assert diagnose(case, megatron_args=args).estimate.peak.total == pytest.approx(fp32)
    case, args = files(tmp_path, ARGS + "--grad-reduce-in-bf16\n")
    assert diagnose(case, megatron_args=args).estimate.peak.total == pytest.approx(bf16)


def test_the_settings_the_arguments_decide_for_the_planners_best_are_said(tmp_path):
    """The planner's best is planned as the arguments train (fp32 gradients without
    --grad-reduce-in-bf16), so it differed from `plan`'s on the case alone (a 70B's gradients
    doubled) with no word why; a case that states the setting leaves nothing to say."""
    case, args = files(tmp_path, ARGS)
    result = diagnose(case, megatron_args=args)
    assert "gradients reduced in fp32 (no --grad-reduce-in-bf16)" in result.planned_with
    assert result.to_dict()["planned_with"] == result.planned_with
    done = run_cli("diagnose", str(case), "--megatron-args", str(args))
    assert "planned, as the arguments train where the case leaves it to the engine (so `plan` on the case alone may " \
           "pick otherwise): gradients reduced in fp32" in " ".join(done.stdout.split()), done.stdout
    case, args = files(tmp_path, ARGS, {**CASE, "training": {**CASE["training"], "fp32_grads": True,
                                                             "tp_comm_overlap": False}})
    assert "gradients reduced" not in (diagnose(case, megatron_args=args).planned_with or "")


def test_an_fp16_runs_16_bit_reduction_is_not_said_to_be_bf16s_flag(tmp_path):
    """Megatron-LM's gpt3 example trains --fp16 without --grad-reduce-in-bf16: its gradients are reduced in
    fp16 (validate_args accumulates in fp32 only for bf16); the line named bf16 and a flag it lacks."""
    fp16 = {**CASE, "training": {**CASE["training"], "precision": "fp16"}}
    case, args = files(tmp_path, ARGS.replace("--bf16", "--fp16"), fp16)
    said = diagnose(case, megatron_args=args).planned_with or ""
    assert "gradients reduced in fp16 (--fp16)" in said and "bf16" not in said
    case, args = files(tmp_path, ARGS + "--grad-reduce-in-bf16\n")
    assert "gradients reduced in bf16 (--grad-reduce-in-bf16" in diagnose(case, megatron_args=args).planned_with
    # fp32 (neither --bf16 nor --fp16): the line named bf16 and --grad-reduce-in-bf16 too.
    fp32 = {**CASE, "training": {**CASE["training"], "precision": "fp32"}}
    case, args = files(tmp_path, ARGS.replace(" --bf16", ""), fp32)
    said = diagnose(case, megatron_args=args).planned_with or ""
    assert "gradients reduced in fp32 (an fp32 run" in said and "bf16 (" not in said


@pytest.mark.parametrize("extra, expected", [
    # One moment in bf16, the other fp32 (the default): training.optimizer_moments keeps both in one dtype.
    ("--use-precision-aware-optimizer --exp-avg-dtype bf16", "--exp-avg-sq-dtype: fp32 beside --exp-avg-dtype bf16"),
    ("--use-precision-aware-optimizer --exp-avg-sq-dtype bf16", "--exp-avg-sq-dtype: bf16 beside --exp-avg-dtype fp32"),
    # fp16 and fp8 moments, which FusedAdam scales per tensor (fused_adam.py, _apply_scale).
    ("--use-precision-aware-optimizer --exp-avg-dtype fp16 --exp-avg-sq-dtype fp16", "--exp-avg-dtype: fp16: Adam's "
                                                                                     "moments in fp16"),
    ("--use-precision-aware-optimizer --exp-avg-dtype fp8 --exp-avg-sq-dtype fp8", "--exp-avg-dtype: fp8: Adam's "
                                                                                   "moments in fp8"),
    # The HybridDeviceOptimizer is handed no moment dtype (megatron/core/optimizer/__init__.py ~306-334).
    ("--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 --optimizer-cpu-offload",
     "--exp-avg-dtype: bf16 with --optimizer-cpu-offload"),
    # Without it OptimizerConfig.__post_init__ asserts fp32.
    ("--exp-avg-sq-dtype bf16", "--exp-avg-sq-dtype: bf16 needs --use-precision-aware-optimizer"),
])
def test_adams_moments_in_another_dtype_are_refused_not_priced_as_fp32(tmp_path, extra, expected):
    """--exp-avg-dtype and --exp-avg-sq-dtype were not read: a launch keeping Adam's moments in bf16 was
    priced with fp32 moments (and 4-byte master weights) without a word. Both in bf16 are read as
    training.optimizer_moments bf16 (tests/test_precision_aware_optimizer.py); what it cannot say is refused."""
    case, args = files(tmp_path, ARGS + extra + "\n")
    with pytest.raises(CaseError, match="^.*" + expected.replace("(", r"\(").replace(")", r"\)")):
        diagnose(case, megatron_args=args)
    # With the optimizer offload it is emitted with (without it the master's 16-bit remainders are read:
    # tests/test_precision_aware_optimizer.py).
    case, args = files(tmp_path, ARGS + "--use-precision-aware-optimizer --exp-avg-dtype fp32 --optimizer-cpu-offload\n")
    assert diagnose(case, megatron_args=args).estimate.job.training.optimizer_moments == "fp32"


def test_a_case_that_contradicts_the_arguments_is_refused_naming_both(tmp_path):
    case, args = files(tmp_path, ARGS, {**CASE, "training": {**CASE["training"], "fp32_grads": False}})
    with pytest.raises(CaseError, match=r"args.txt: --grad-reduce-in-bf16: the arguments' Megatron-LM reduces "
                                        r"gradients in fp32, but the case .*case.yaml says training.fp32_grads: false"):
        diagnose(case, megatron_args=args)


def test_tp_overlap_and_the_dispatcher_are_read(tmp_path):
    case, args = files(tmp_path, ARGS.replace("--tensor-model-parallel-size 1", "--tensor-model-parallel-size 2")
                       + "--sequence-parallel --tp-comm-overlap\n")
    assert diagnose(case, megatron_args=args).estimate.job.training.tp_comm_overlap
    from planner.engines.megatron.read import read_training
    from planner.case import load_case

    moe = load_case({"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
                     "training": {"global_batch_size": 256, "seq_len": 4096}})
    for extra, dispatch in (("", "all_to_all"), ("--moe-token-dispatcher-type alltoall\n", "all_to_all"),
                            ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep\n", "deepep"),
                            ("--moe-token-dispatcher-type flex --moe-enable-deepep\n", "deepep")):
        (tmp_path / "moe.txt").write_text(ARGS + "--expert-model-parallel-size 8\n" + extra)
        assert read_training(tmp_path / "moe.txt", moe)["expert_dispatch"] == dispatch


def test_tp_overlap_at_tp_1_is_no_contradiction_and_without_sequence_parallelism_is_refused(tmp_path):
    """A case asking for tp_comm_overlap whose plan took tp 1: the emitted arguments leave the flag out
    (validate_args turns sequence parallelism off at tp 1 and then asserts it under --tp-comm-overlap), and
    diagnose refused the planner's own files as contradicting the case."""
    overlap = {**CASE, "training": {**CASE["training"], "tp_comm_overlap": True}}
    case, args = files(tmp_path, ARGS, overlap)
    assert diagnose(case, megatron_args=args).estimate.job.layout.tp == 1
    case, args = files(tmp_path, ARGS + "--tp-comm-overlap\n", overlap)
    with pytest.raises(CaseError) as refused:
        diagnose(case, megatron_args=args)
    assert refused.value.key == "--tp-comm-overlap" and "needs --sequence-parallel with tp > 1" in str(refused.value)


@pytest.mark.parametrize("extra, flag, needle", [
    # TransformerConfig.__post_init__: "DeepEP backend is only supported with flex token dispatcher."
    ("--expert-model-parallel-size 8 --moe-token-dispatcher-type alltoall --moe-enable-deepep",
     "--moe-enable-deepep", "needs --moe-token-dispatcher-type flex"),
    # MoEFlexTokenDispatcher: "Flex token dispatcher requires TPxEP > 1".
    ("--moe-token-dispatcher-type flex", "--moe-token-dispatcher-type", "tp·ep > 1"),
])
def test_expert_dispatch_megatron_core_refuses_is_refused_naming_the_flag(tmp_path, extra, flag, needle):
    from planner.engines.megatron.read import read_training
    from planner.case import load_case

    moe = load_case({"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
                     "training": {"global_batch_size": 256, "seq_len": 4096}})
    (tmp_path / "moe.txt").write_text(ARGS + extra + "\n")
    with pytest.raises(CaseError, match=needle) as error:
        read_training(tmp_path / "moe.txt", moe)
    assert error.value.key == flag


def test_experts_run_otherwise_than_priced_are_said_and_the_plans_own_files_say_nothing(tmp_path):
    """Without --moe-grouped-gemm megatron-core runs SequentialMLP (one GEMM per local expert), its default
    allgather dispatcher gathers every token over tp·ep, and a capacity factor without padding drops
    tokens and pads nothing: each was priced as the plan's files run it, with nothing said."""
    case = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096}}
    best = planner.plan(case, engine="megatron", top_k=0).best
    written = planner.emit(best, "megatron", tmp_path / "out")
    args = next(p for p in written.paths if p.name == "megatron_args.txt")
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    own = diagnose(tmp_path / "case.yaml", megatron_args=args)
    # Of the files nothing is said; of the case, what `plan` says (its routing, unstated).
    assert [n for n in own.notes if "moe" in n.lower() or "dispatcher" in n] == list(
        planner.plan(tmp_path / "case.yaml", engine="megatron", top_k=0).notes)
    text = args.read_text()
    assert "--moe-grouped-gemm" in text and "--moe-token-dispatcher-type" in text
    bare = tmp_path / "bare.txt"
    bare.write_text(text.replace("--moe-grouped-gemm", "").replace("--moe-token-dispatcher-type alltoall", ""))
    notes = diagnose(tmp_path / "case.yaml", megatron_args=bare).notes
    assert any("leaves out --moe-grouped-gemm" in n and "SequentialMLP" in n for n in notes)
    assert any("allgather token dispatcher" in n for n in notes)
    assert not [n for n in notes if "load balancing" in n]
    # The emitted router trains balanced (--moe-aux-loss-coeff 1e-2); without a coefficient it does not.
    assert "--moe-aux-loss-coeff 1e-2" in text
    unbalanced = tmp_path / "unbalanced.txt"
    unbalanced.write_text(text.replace("--moe-aux-loss-coeff 1e-2", ""))
    notes = diagnose(tmp_path / "case.yaml", megatron_args=unbalanced).notes
    assert any("without load balancing" in n and "absent: 0.0" in n for n in notes)
    capped = {**case, "model": {**case["model"], "moe_capacity_factor": 1.25}}
    (tmp_path / "capped.yaml").write_text(yaml.safe_dump(capped))
    padded = planner.emit(planner.plan(capped, engine="megatron", top_k=0).best, "megatron", tmp_path / "capped")
    capped_args = next(p for p in padded.paths if p.name == "megatron_args.txt")
    assert not [n for n in diagnose(tmp_path / "capped.yaml", megatron_args=capped_args).notes if "capacity" in n]
    capped_args.write_text(capped_args.read_text().replace("--moe-pad-expert-input-to-capacity", ""))
    notes = diagnose(tmp_path / "capped.yaml", megatron_args=capped_args).notes
    assert any("without --moe-pad-expert-input-to-capacity" in n for n in notes)


def test_deepep_with_a_capacity_factor_is_refused_before_the_search():
    """plan said no layout fits (memory, the search's words) where estimate named the dispatch."""
    case = {"model": {"preset": "mixtral-8x7b", "moe_capacity_factor": 1.25},
            "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096, "expert_dispatch": "deepep"}}
    with pytest.raises(CaseError, match="deepep pads no expert to a capacity") as error:
        planner.plan(case, engine="megatron")
    assert error.value.key == "training.expert_dispatch"


def test_unfused_attention_is_written_and_read_as_megatron_runs_it(tmp_path):
    """training.flash_attention false was priced as attention that keeps its scores, and the files
    left Megatron-LM its default backend (auto: Transformer Engine's fused kernel), which keeps
    none; the reader took any --attention-backend for the case's."""
    unfused = {**CASE, "training": {**CASE["training"], "engine": "megatron", "flash_attention": False}}
    best = planner.plan(unfused, top_k=0).best
    written = planner.emit(best, "megatron", tmp_path / "out")
    args = next(p for p in written.paths if p.name == "megatron_args.txt")
    assert "--attention-backend unfused" in args.read_text()
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(unfused))
    read = diagnose(tmp_path / "case.yaml", megatron_args=args)
    assert read.estimate.step_time_s == pytest.approx(best.step_time_s)
    fused = args.read_text().replace("--attention-backend unfused", "--attention-backend auto")
    (tmp_path / "fused.txt").write_text(fused)
    with pytest.raises(CaseError, match=r"fused.txt: --attention-backend: --attention-backend auto, but the case says "
                                        r"training.flash_attention: false"):
        diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "fused.txt")


def test_megatron_runs_no_context_parallelism_without_a_fused_attention_kernel(tmp_path):
    """Llama 3 8B on 8 A100s of 40 GB without flash attention: the plan picked tp 2, cp 2 and wrote
    --attention-backend unfused beside --context-parallel-size 2, which Transformer Engine cannot run
    (it drops its unfused backend under context parallelism: no backend is left at the first forward)."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16", "engine": "megatron",
                         "flash_attention": False}}
    p = planner.plan(case)
    assert all(e.job.layout.cp == 1 for e in (p.best, *p.alternatives))
    with pytest.raises(CaseError) as refused:
        planner.estimate({**case, "layout": {"tp": 2, "cp": 2, "dp": 2, "micro_batch_size": 1, "zero_stage": 1,
                                             "sequence_parallel": True}})
    assert refused.value.key == "layout.cp" and "no attention backend is left" in refused.value.expected
    # With flash attention the same layout runs.
    flash = {**case, "training": {**case["training"], "flash_attention": True}}
    planner.estimate({**flash, "layout": {"tp": 2, "cp": 2, "dp": 2, "micro_batch_size": 1, "zero_stage": 1,
                                          "sequence_parallel": True}})


@pytest.mark.parametrize("changes, key", [
    ({"training": {"optimizer": "sgd"}}, "training.optimizer"),  # the files ran the base config's AdamW
    ({"training": {"flash_attention": False}}, "training.flash_attention"),  # SDPA keeps no scores
    ({"model": {"dropout": 0.1}}, "model.dropout"),  # torchtitan's models have no dropout
])
def test_torchtitan_refuses_what_its_files_would_not_run(changes, key):
    """An SGD plan for torchtitan was priced with one momentum state (58.4 GB, fits) and written
    without an optimizer, so torchtitan ran its base config's AdamW (62.4 GB, at risk)."""
    case = {"model": {"preset": "llama3-8b", **changes.get("model", {})}, "cluster": CASE["cluster"],
            "training": {**CASE["training"], "engine": "torchtitan", **changes.get("training", {})}}
    with pytest.raises(CaseError) as refused:
        planner.plan(case, top_k=0)
    assert refused.value.key == key and "torchtitan cannot run it" in refused.value.expected


def test_the_plans_own_megatron_files_diagnose_as_its_best(tmp_path):
    """At ZeRO 0 the plan's files leave out --fp8-param-gather (it needs the distributed optimizer):
    diagnose took that as the case's fp8_param_gather false for every layout of its best, named a
    slower best (ZeRO 1, ep 4: 2.686 s against 2.647 s) and printed a change to it. (ZeRO 0 is pinned:
    with the attention's bf16 output priced beside its fp8 copy, ZeRO 1 is the fastest here.)"""
    case = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "b200", "num_gpus": 8},
            "training": {"global_batch_size": 128, "seq_len": 4096, "precision": "fp8"}, "search": {"zero_stage": 0}}
    best = planner.plan(case, engine="megatron").best
    assert best.job.layout.zero_stage == 0
    written = planner.emit(best, "megatron", tmp_path / "out")
    args = next(p for p in written.paths if p.name == "megatron_args.txt")
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    found = diagnose(tmp_path / "case.yaml", megatron_args=args)
    assert found.plan.best.job.layout == best.job.layout
    assert found.plan.best.step_time_s == pytest.approx(best.step_time_s)
    assert "fp8_param_gather" not in (found.planned_with or "")


def test_the_nvfp4_weight_gather_is_named_by_its_own_flag(tmp_path):
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "b200", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "nvfp4", "engine": "megatron"}}
    best = planner.plan(case, top_k=0, fastest=True).best
    written = planner.emit(best, "megatron", tmp_path / "out")
    args = next(p for p in written.paths if p.name == "megatron_args.txt")
    assert best.job.layout.zero_stage in (1, 3) and "--fp4-param-gather" in args.read_text()
    # Without the flag the arguments keep 16-bit weights where the engine would gather NVFP4 ones: the
    # line says so, naming the flag NVFP4 takes (it named --fp8-param-gather).
    args.write_text(args.read_text().replace("--fp4-param-gather", ""))
    (tmp_path / "case.yaml").write_text(yaml.safe_dump({**case, "training": {
        k: v for k, v in case["training"].items() if k != "engine"}}))
    line = diagnose(tmp_path / "case.yaml", megatron_args=args).planned_with or ""
    assert "training.fp8_param_gather false (no --fp4-param-gather)" in line and "--fp8-param-gather" not in line
