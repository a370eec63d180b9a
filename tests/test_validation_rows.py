"""Published rows → case dicts, and measured throughput recovered with each source's FLOP count.

Rows are copied (trimmed) from /work/shared/validation/published_runs.yaml so the tests stand
alone. Nothing here runs the step-time model: replay is exercised with a stand-in estimator.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from planner.case import load_case
from planner.validation import (NEMO_GPT3_VOCAB, engine_of, korthikanti_model_flops_per_iteration, measured_tokens_per_s,
                                mpt_model_flops_per_token, narayanan_flops_per_iteration, nemo_model_flops_per_token,
                                replay, report_to_dict, row_to_case, source_name)

NARAYANAN = "Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM'"
KORTHIKANTI = "Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large Transformer Models'"
NEMO = "NVIDIA/NeMo docs/source/performance/performance_summary.md (NeMo 24.07 container, DGX-H100, FP8)"
MPT = "mosaicml/llm-foundry scripts/train/benchmarking/README.md (last changed in commit 495218376, 2024-04-22)"
BLOOM = "bigscience-workshop/bigscience train/tr11-176B-ml/README.md and tr11-176B-ml.slurm"


def _row(id, source, gpu, num_gpus, model, parallel, batch, measured, recompute="full", precision="bf16",
         record_type="measured_throughput", notes="", framework="Megatron-LM (2021)"):
    par = {"dp": None, "tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": 1, "sp": False,
           "distributed_optimizer": False, "zero_stage": 0, "fsdp": None}
    par.update(parallel)
    meas = {"tflops_per_gpu": None, "mfu": None, "hfu": None, "tokens_per_sec_per_gpu": None,
            "tokens_per_sec_total": None, "iteration_time_s": None}
    meas.update(measured)
    return {"id": id, "source": source, "record_type": record_type, "gpu": gpu, "num_gpus": num_gpus,
            "framework": framework,
            "model": model, "parallel": par, "batch": batch, "recompute": recompute, "precision": precision,
            "measured": meas, "notes": notes}


def _gpt(name, layers, hidden, heads, vocab=51200, seq=2048, act="gelu", kv=None, ffn=None):
    return {"name": name, "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv or heads,
            "ffn_hidden": ffn or 4 * hidden, "ffn_act": act, "vocab": vocab, "seq_len": seq}


NARAYANAN_1_7B = _row(
    "narayanan21_t1_1.7B", NARAYANAN, "A100-SXM4-80GB (Selene DGX A100)", 32, _gpt("GPT 1.7B", 24, 2304, 24),
    {"dp": 32}, {"global_batch_size": 512, "micro_batch_size": 16, "grad_accum": 1},
    {"tflops_per_gpu": 137, "hfu": 0.44}, precision="fp16 mixed")

KORTHIKANTI_530B_FULL = _row(
    "korthikanti22_530B_dp8_full_recompute", KORTHIKANTI, "A100-SXM4-80GB (Selene)", 2240,
    _gpt("GPT 530B", 105, 20480, 128), {"dp": 8, "tp": 8, "pp": 35, "vpp": 3},
    {"global_batch_size": 2240, "micro_batch_size": 1, "grad_accum": 280}, {"mfu": 0.421},
    precision="mixed (not stated)")

KORTHIKANTI_22B_SEL = _row(
    "korthikanti22_t5_22B_sp_selective", KORTHIKANTI, "A100-SXM4-80GB (Selene)", 8, _gpt("GPT 22B", 48, 6144, 64),
    {"dp": 1, "tp": 8, "sp": True}, {"global_batch_size": 4, "micro_batch_size": 4, "grad_accum": 1},
    {"tflops_per_gpu": 129.5, "mfu": 0.415, "iteration_time_s": 1.1, "tokens_per_sec_total": 7447.3},
    recompute="selective", precision="mixed (fp16/bf16 not stated)")

NEMO_LLAMA2_7B = _row(
    "nemo2407_h100_fp8_LLAMA2-7B_8gpu", NEMO, "H100-SXM-80GB (DGX-H100)", 8,
    _gpt("Llama-2-7B", 32, 4096, 32, vocab=32000, seq=4096, act="swiglu", ffn=11008),
    {"dp": 8, "sp": None, "distributed_optimizer": None, "zero_stage": None},
    {"global_batch_size": 128, "micro_batch_size": 1, "grad_accum": 16},
    {"tflops_per_gpu": 780, "tokens_per_sec_per_gpu": 16934}, recompute=None, precision="fp8")

NEMO_GPT3_175B = _row(
    "nemo2407_h100_fp8_GPT3-175B_128gpu", NEMO, "H100-SXM-80GB (DGX-H100)", 128,
    _gpt("GPT3-175B (NeMo)", 96, 12288, 96, vocab=None),
    {"dp": 4, "tp": 4, "pp": 8, "vpp": 6, "sp": None, "distributed_optimizer": None, "zero_stage": None},
    {"global_batch_size": 256, "micro_batch_size": 1, "grad_accum": 64},
    {"tflops_per_gpu": 771, "tokens_per_sec_per_gpu": 716}, recompute=None, precision="fp8")

NEMO_NEMOTRON_8B = _row(
    "nemo2407_h100_fp8_Nemotron-8B_64gpu", NEMO, "H100-SXM-80GB (DGX-H100)", 64,
    _gpt("Nemotron-3 8B", 32, 4096, 32, vocab=256000, seq=4096, act="squared_relu"),
    {"dp": 32, "tp": 2, "sp": None, "distributed_optimizer": None, "zero_stage": None},
    {"global_batch_size": 256, "micro_batch_size": 4, "grad_accum": 2},
    {"tflops_per_gpu": 643, "tokens_per_sec_per_gpu": 12507}, recompute=None, precision="fp8")

NEMO_LONGSEQ_4K = _row(
    "nemo_longseq_h100_llama2_7b_4k", NEMO.replace("performance_summary", "performance_long_sequence"),
    "H100-SXM-80GB (DGX-H100)", 4, _gpt("Llama-2-7B", 32, 4096, 32, vocab=32000, seq=4096, act="swiglu", ffn=11008),
    {"dp": 4, "vpp": None, "sp": None, "distributed_optimizer": None, "zero_stage": None},
    {"global_batch_size": 1024, "micro_batch_size": None, "grad_accum": None}, {"tflops_per_gpu": 768},
    recompute=None, precision="fp8")

MPT_7B = _row(
    "mpt_a100_40gb_7b_s2048_g8_bf16_mb12_ga4", MPT, "A100-40GB (1600 Gbps RoCE)", 8,
    dict(_gpt("MPT-7b", 32, 4096, 32, vocab=50368), num_params_exact=6658859008),
    {"dp": 8, "distributed_optimizer": None, "zero_stage": 3, "fsdp": "FULL_SHARD"},
    {"global_batch_size": 384, "micro_batch_size": 12, "grad_accum": 4},
    {"tokens_per_sec_total": 29436, "tokens_per_sec_per_gpu": 3679, "mfu": 0.5092, "tflops_per_gpu": 158.0},
    recompute="full", precision="bf16 (mixed-precision mode PURE)")

BLOOM_MAIN = _row(
    "bloom176b_main_iter85376", BLOOM, "A100-SXM4-80GB (Jean Zay, Omni-Path)", 384,
    _gpt("BLOOM-176B", 70, 14336, 112, vocab=250880), {"dp": 8, "tp": 4, "pp": 12, "zero_stage": 1},
    {"global_batch_size": 2048, "micro_batch_size": 2, "grad_accum": 128},
    {"tflops_per_gpu": 149.77, "iteration_time_s": 104.7, "tokens_per_sec_total": 40061.0},
    notes="tied embeddings, --pp-partition-method 'type:transformer|embedding' (first/last stage hold 5 blocks)")

BLOOM_GBS192 = _row(
    "bloom176b_rampup_gbs192", BLOOM, "A100-SXM4-80GB", 384, _gpt("BLOOM-176B", 70, 14336, 112, vocab=250880),
    {"dp": 8, "tp": 4, "pp": 12, "distributed_optimizer": None, "zero_stage": 1},
    {"global_batch_size": 192, "micro_batch_size": 1, "grad_accum": 24}, {"tflops_per_gpu": 73})

ALL = [NARAYANAN_1_7B, KORTHIKANTI_530B_FULL, KORTHIKANTI_22B_SEL, NEMO_LLAMA2_7B, NEMO_GPT3_175B, NEMO_NEMOTRON_8B,
       MPT_7B, BLOOM_MAIN, BLOOM_GBS192]


# --- FLOP conventions ----------------------------------------------------------------------

def test_narayanan_tflops_inverted_with_eq3():
    # F = 96·B·s·l·h²·(1 + s/6h + V/16lh), B = 512, s = 2048, l = 24, h = 2304, V = 51200
    #   96·512·2048·24·2304² = 12,824,703,626,379,264
    #   1 + 2048/13824 + 51200/884736 = 1 + 0.148148 + 0.057870 = 1.2060185
    #   F = 1.54668e16 FLOP per iteration
    # 137 TFLOP/s is per GPU: time = F / (137e12 · 32) = 1.54668e16 / 4.384e15 = 3.52802 s
    # tokens/s = 512 · 2048 / 3.52802 = 1,048,576 / 3.52802 = 297,214
    assert narayanan_flops_per_iteration(512, 2048, 24, 2304, 51200) == pytest.approx(1.54668e16, rel=1e-5)
    assert measured_tokens_per_s(NARAYANAN_1_7B) == pytest.approx(297_214, rel=1e-5)


def test_bloom_uses_the_same_convention_and_reproduces_its_printed_iteration_time():
    # 96·2048·2048·70·14336²·(1 + 2048/86016 + 250880/(16·70·14336)) = 6.02119e18 FLOP
    # / (149.77e12 · 384) = 104.695 s: the log line prints 104.70 s.
    f = narayanan_flops_per_iteration(2048, 2048, 70, 14336, 250880)
    assert f / (149.77e12 * 384) == pytest.approx(104.70, abs=0.01)
    # gbs 192 prints only 73 TFLOP/s: 192·2048 tokens per (F(192) / (73e12·384)) s
    #   F(192) = 6.02119e18 · 192/2048 = 5.64487e17; time = 5.64487e17 / 2.8032e16 = 20.137 s
    #   tokens/s = 393,216 / 20.137 = 19,527
    assert measured_tokens_per_s(BLOOM_GBS192) == pytest.approx(19_527, rel=1e-4)


def test_korthikanti_mfu_inverted_with_model_flops():
    # Only MFU 42.1 % is published. Model FLOPs 72·B·s·l·h²·(1 + s/6h + V/12lh):
    #   per token 72·105·20480²·(1 + 2048/122880 + 51200/25804800) = 3.17094e12 · 1.0186508 = 3.23003e12
    #   achieved model FLOP/s = 0.421 · 312e12 · 2240 = 2.94227e17
    #   tokens/s = 2.94227e17 / 3.23003e12 = 91,091 (iteration 2240·2048 / 91,091 = 50.36 s)
    per_token = korthikanti_model_flops_per_iteration(2240, 2048, 105, 20480, 51200) / (2240 * 2048)
    assert per_token == pytest.approx(3.23003e12, rel=1e-5)
    assert measured_tokens_per_s(KORTHIKANTI_530B_FULL) == pytest.approx(91_091, rel=1e-4)


def test_korthikanti_tflops_are_model_flops_and_agree_with_the_printed_iteration_time():
    # 129.5 TFLOP/s · 8 GPUs over 72·4·2048·48·6144²·(1 + 2048/36864 + 51200/3538944) → 1.104 s; printed 1.1 s.
    f = korthikanti_model_flops_per_iteration(4, 2048, 48, 6144, 51200)
    assert f / (129.5e12 * 8) == pytest.approx(1.1, rel=0.01)
    assert measured_tokens_per_s(KORTHIKANTI_22B_SEL) == 7447.3  # the printed total wins


def test_nemo_model_flops_match_its_table():
    # Llama-2-7B, s = 4096: per layer 2h² + 2h·h + 3·h·11008 = 202,375,168 weights;
    # 6·(32·202,375,168 + 32000·4096) + 12·32·4096·4096 = 46.0849e9 FLOP per token;
    # 780 TFLOP/s ÷ 16,934 tokens/s per GPU = 46.061e9: within 0.1 %.
    per_token = nemo_model_flops_per_token(32, 4096, 32, 32, 11008, True, 32000, 4096)
    assert per_token == pytest.approx(46.0849e9, rel=1e-5)
    assert 780e12 / 16934 == pytest.approx(per_token, rel=1e-3)
    assert measured_tokens_per_s(NEMO_LLAMA2_7B) == 16934 * 8


def test_mpt_mfu_convention():
    # (6·N + 12·L·d·s) per token: 6·6,658,859,008 + 12·32·4096·2048 = 39.953e9 + 3.221e9 = 43.174e9;
    # × 29,436 / 8 tokens/s per GPU = 158.86 TFLOP/s; / 312 = 0.5092, the published MFU.
    per_token = mpt_model_flops_per_token(6658859008, 32, 4096, 2048)
    assert per_token == pytest.approx(43.174e9, rel=1e-4)
    assert per_token * 29436 / 8 / 312e12 == pytest.approx(0.5092, abs=1e-4)
    assert measured_tokens_per_s(MPT_7B) == 29436


def test_per_gpu_and_iteration_time_fallbacks():
    row = copy.deepcopy(KORTHIKANTI_22B_SEL)
    row["measured"]["tokens_per_sec_total"] = None
    row["measured"]["iteration_time_s"] = 1.1
    assert measured_tokens_per_s(row) == pytest.approx(4 * 2048 / 1.1)  # 7447.3
    row["measured"]["tokens_per_sec_per_gpu"] = 930.91
    assert measured_tokens_per_s(row) == pytest.approx(930.91 * 8)
    bare = copy.deepcopy(row)
    bare["measured"] = {}
    assert measured_tokens_per_s(bare) is None


# --- conversion -------------------------------------------------------------------------------

def test_narayanan_row_converts_field_by_field():
    case, why = row_to_case(NARAYANAN_1_7B)
    assert why == ""
    assert case["model"] == {"name": "GPT 1.7B", "num_layers": 24, "hidden_size": 2304, "num_attention_heads": 24,
                             "num_kv_heads": 24, "ffn_hidden_size": 9216, "activation": "gelu", "vocab_size": 51200,
                             "tied_embeddings": True, "dropout": 0.1}
    assert case["cluster"] == {"gpu": "a100-sxm-80gb", "num_gpus": 32}
    assert case["training"] == {"global_batch_size": 512, "seq_len": 2048, "precision": "fp16", "optimizer": "adam",
                                "flash_attention": False, "engine": "megatron", "tp_comm_overlap": False}
    assert case["layout"] == {"dp": 32, "tp": 1, "pp": 1, "cp": 1, "vpp": 1, "micro_batch_size": 16, "zero_stage": 0,
                              "sequence_parallel": False, "recompute": "full"}


def test_source_names():
    assert [source_name(r) for r in (NARAYANAN_1_7B, KORTHIKANTI_22B_SEL, NEMO_LLAMA2_7B, NEMO_LONGSEQ_4K, MPT_7B,
                                     BLOOM_MAIN)] == ["narayanan2021", "korthikanti2022", "nemo", "nemo", "mpt", "bloom"]


def test_mpt_row_nic_from_gpu_string_and_fsdp_full_shard():
    case, _ = row_to_case(MPT_7B)
    # "1600 Gbps RoCE" is per node (llm-foundry: node-node interconnect) → 1600 / 8 GPUs
    assert case["cluster"] == {"gpu": "a100-sxm-40gb", "num_gpus": 8, "inter_node_bandwidth": "200 Gbit/s"}
    assert case["layout"]["zero_stage"] == 3 and case["layout"]["recompute"] == "full"
    assert case["training"]["precision"] == "bf16" and case["training"]["flash_attention"] is True
    assert case["model"]["tied_embeddings"] is True and case["model"]["dropout"] == 0.0


def test_bloom_partition_fabric_and_zero1():
    case, _ = row_to_case(BLOOM_MAIN)
    # 70 blocks + 2 embedding units = 72 over 12 stages → 6 each, 5 blocks on the first and last
    assert case["layout"]["stage_layers"] == [5] + [6] * 10 + [5]
    assert case["cluster"]["inter_node_bandwidth"] == "50 Gbit/s"  # 4 × 100 Gbit/s Omni-Path per 8 GPUs
    assert case["layout"]["zero_stage"] == 1 and case["model"]["dropout"] == 0.0
    # the ramp-up rows ran on the same machine and launch script
    ramp, why = row_to_case(BLOOM_GBS192)
    assert why == "" and ramp["layout"]["stage_layers"] == case["layout"]["stage_layers"]
    assert ramp["cluster"]["inter_node_bandwidth"] == "50 Gbit/s"


def test_nemo_recipe_defaults_fill_what_the_table_omits():
    llama, _ = row_to_case(NEMO_LLAMA2_7B)
    assert llama["model"]["tied_embeddings"] is False and llama["model"]["activation"] == "swiglu"
    assert llama["layout"]["zero_stage"] == 1 and llama["layout"]["sequence_parallel"] is False  # tp = 1
    assert llama["layout"]["recompute"] == "none" and llama["training"]["precision"] == "fp8"
    gpt3, _ = row_to_case(NEMO_GPT3_175B)
    assert gpt3["model"]["vocab_size"] == NEMO_GPT3_VOCAB == 51200
    assert gpt3["layout"]["sequence_parallel"] is True and gpt3["layout"]["vpp"] == 6
    nemotron, _ = row_to_case(NEMO_NEMOTRON_8B)
    assert nemotron["model"]["activation"] == "gelu"  # squared-ReLU: a 2-matrix MLP like GeLU


def test_not_stated_precision_is_bf16():
    case, _ = row_to_case(KORTHIKANTI_22B_SEL)
    assert case["training"]["precision"] == "bf16"
    assert case["layout"]["recompute"] == "selective" and case["layout"]["sequence_parallel"] is True


def test_rows_that_cannot_be_replayed():
    assert row_to_case(NEMO_LONGSEQ_4K)[0] is None
    assert "micro_batch_size" in row_to_case(NEMO_LONGSEQ_4K)[1]
    per_layer = dict(copy.deepcopy(KORTHIKANTI_22B_SEL), record_type="measured_per_layer_time")
    assert "record_type" in row_to_case(per_layer)[1]
    ragged = copy.deepcopy(MPT_7B)
    ragged["batch"].update(global_batch_size=380, grad_accum=None)  # 380 % (12·8) ≠ 0
    case, why = row_to_case(ragged)
    assert case is None and "not divisible" in why
    no_throughput = copy.deepcopy(NARAYANAN_1_7B)
    no_throughput["measured"] = {}
    assert "no measured" in row_to_case(no_throughput)[1]


def test_micro_batch_derived_from_grad_accum():
    row = copy.deepcopy(NARAYANAN_1_7B)
    row["batch"]["micro_batch_size"] = None  # 512 / (grad_accum 1 · dp 32) = 16
    assert row_to_case(row)[0]["layout"]["micro_batch_size"] == 16


@pytest.mark.parametrize("row", ALL, ids=lambda r: r["id"])
def test_every_converted_row_is_a_valid_case(row):
    case, why = row_to_case(row)
    assert why == ""
    loaded = load_case(case)  # schema and cross-checks, memory model only
    assert loaded.job().layout.world_size == row["num_gpus"]


# --- replay with a stand-in estimator -----------------------------------------------------

class _Fake:
    def __init__(self, tokens):
        self.tokens = tokens

    def to_dict(self):
        return {"fits": True, "tokens_per_s": self.tokens}


def test_replay_collects_errors_and_stats(tmp_path):
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump([NARAYANAN_1_7B, MPT_7B, NEMO_LONGSEQ_4K]))
    factor = {"narayanan2021": 1.10, "mpt": 0.80}

    def fake(case):
        if case["cluster"]["gpu"] == "a100-sxm-80gb":
            return _Fake(factor["narayanan2021"] * 297_213.919)
        return _Fake(factor["mpt"] * 29436)

    report = replay(path, estimate_fn=fake)
    assert [r.id for r in report.rows] == ["narayanan21_t1_1.7B", "mpt_a100_40gb_7b_s2048_g8_bf16_mb12_ga4"]
    assert [r.error for r in report.rows] == pytest.approx([0.10, -0.20], abs=1e-6)
    assert report.skipped[0][0] == "nemo_longseq_h100_llama2_7b_4k"
    assert report.overall.count == 2
    assert report.overall.mean_abs_error == pytest.approx(0.15, abs=1e-6)
    assert report.overall.max_abs_error == pytest.approx(0.20, abs=1e-6)
    assert report.overall.bias == pytest.approx(-0.05, abs=1e-6)
    assert report.by_source["mpt"].bias == pytest.approx(-0.20, abs=1e-6)
    as_dict = report_to_dict(report)
    assert as_dict["overall"]["count"] == 2 and as_dict["skipped"][0]["reason"]


def test_replay_skips_layouts_the_model_rejects(tmp_path):
    from planner.errors import CaseError

    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump([NARAYANAN_1_7B]))

    def reject(case):
        raise CaseError("<case>", "layout.tp", "must divide num_attention_heads")

    report = replay(path, estimate_fn=reject)
    assert report.rows == () and report.overall is None
    assert report.skipped == (("narayanan21_t1_1.7B", "rejected by the model: layout.tp: must divide num_attention_heads"),)


@pytest.mark.parametrize("framework, engine", [
    # The framework strings of ../shared/validation/published_runs.yaml.
    ("Megatron-LM + DeepSpeed ZeRO-3 (no model parallelism)", "deepspeed"),
    ("Megatron-DeepSpeed (bigscience fork) + DeepSpeed BF16_Optimizer", "deepspeed"),
    ("Megatron-LM PTD-P (2021)", "megatron"),
    ("NeMo 24.07 (Megatron-Core)", "megatron"),
    ("MosaicML Composer + PyTorch FSDP (llm-foundry)", "any"),
])
def test_each_framework_runs_as_its_engine(framework, engine):
    assert engine_of(framework) == engine
