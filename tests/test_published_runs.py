"""Published rows → the cases their users would write, and measured throughput without FLOP conventions."""

from __future__ import annotations

import pytest

from planner.case import load_case
from planner.estimate import estimate as estimate_case
from planner.fidelity import evaluate
from planner.published_runs import (balanced_stages, bridge_mtp_split, case_of, gpu_preset, load_rows,
                                    measured_tokens_per_s, pipeline_split, precision,
                                    published_memory_stage, zero_stage)


@pytest.fixture(scope="module")
def rows() -> dict:
    return {r["id"]: r for r in load_rows()}


def test_narayanan_tflops_are_inverted_with_eq3(rows):
    # F = 96·B·s·l·h²·(1 + s/6h + V/16lh), B = 512, s = 2048, l = 24, h = 2304, V = 51200
    #   = 1.54668e16 FLOP per iteration; 137 TFLOP/s per GPU on 32 GPUs: 3.52802 s;
    #   512 · 2048 / 3.52802 = 297,214 tokens/s.
    assert measured_tokens_per_s(rows["narayanan21_t1_1.7B"]) == pytest.approx(297_214, rel=1e-5)


def test_bloom_prints_the_iteration_time_eq3_gives(rows):
    # 96·2048·2048·70·14336²·(1 + 2048/86016 + 250880/(16·70·14336)) = 6.02119e18 FLOP at
    # 149.77 TFLOP/s on 384 GPUs is 104.695 s: the log line prints 104.70 s.
    row = rows["bloom176b_main_iter85376"]
    assert row["measured"]["iteration_time_s"] == pytest.approx(104.70)
    assert measured_tokens_per_s(row) == pytest.approx(2048 * 2048 / 104.70)


def test_a_playbook_row_is_written_as_its_user_would(rows):
    case, why = case_of(rows["playbook_1b_1n_dp4_tp1_pp2_mbs4_ga16_z1"])
    assert why == ""
    assert case["model"] == {"name": "playbook-1B (Llama-style, MHA)", "num_layers": 16, "hidden_size": 2048,
                             "num_attention_heads": 32, "num_kv_heads": 32, "ffn_hidden_size": 8192,
                             "activation": "swiglu", "vocab_size": 131072, "tied_embeddings": True, "dropout": 0.0}
    assert case["cluster"] == {"gpu": "h100-sxm-80gb", "num_gpus": 8, "fabric": "aws-efa-p5"}
    assert case["training"]["engine"] == "nanotron" and case["training"]["flash_attention"]
    assert case["layout"] == {"tp": 1, "pp": 2, "cp": 1, "dp": 4, "vpp": 1, "micro_batch_size": 4, "zero_stage": 1,
                              "sequence_parallel": False, "recompute": "none"}  # nanotron cuts its own stages
    assert load_case(case).layout.dp == 4


def test_the_playbook_is_written_as_nanotron_built_it(rows):
    """nanotron's scaling_benchmarks.py ties the embeddings of the models with an FFN under
    10,000 wide (the 1B and 3B: the rows say "tied emb"), not the 80B's (28,672: "untied emb");
    its nodes are AWS p5 ("EFA inter-node"); it reduces fp32 gradients; and the case gives no
    split: nanotron cuts its own (cost_models.partition.block_cost_partition)."""
    def case(row_id):
        return case_of(rows[row_id])[0]

    assert "tied emb" in rows["playbook_3b_1n_dp1_tp1_pp8_mbs1_ga256_z0"]["inferred"][0]
    assert case("playbook_3b_1n_dp1_tp1_pp8_mbs1_ga256_z0")["model"]["tied_embeddings"]
    assert "untied emb" in rows["playbook_80b_4n_dp1_tp8_pp4_mbs1_ga256_z0"]["inferred"][0]
    assert not case("playbook_80b_4n_dp1_tp8_pp4_mbs1_ga256_z0")["model"]["tied_embeddings"]
    assert case("playbook_80b_4n_dp1_tp8_pp4_mbs1_ga256_z0")["cluster"]["fabric"] == "aws-efa-p5"
    # The sweep's config accumulates and reduces the gradients in fp32 (accumulate_grad_in_fp32).
    assert case("playbook_80b_4n_dp1_tp8_pp4_mbs1_ga256_z0")["training"]["fp32_grads"] is True
    # No split in the case: nanotron cuts its own. 28 layers over 32 ranks: one each on the first 28,
    # the LM head on the 29th; the last three hold nothing.
    assert "stage_layers" not in case("playbook_3b_16n_dp1_tp4_pp32_mbs1_ga256_z0")["layout"]
    assert load_case(case("playbook_3b_16n_dp1_tp4_pp32_mbs1_ga256_z0")).job().stage_layers == (1,) * 28 + (0,) * 4
    # The 3B's LM head (2·V·h = 805 MFLOP a token, against a layer's 2·(4h² + 3hf) = 226 M and its
    # attention) outweighs three layers: the last stage runs it alone.
    assert load_case(case("playbook_3b_1n_dp1_tp1_pp8_mbs1_ga256_z0")).job().stage_layers == (4, 4, 4, 4, 4, 4, 4, 0)


def test_a_head_width_other_than_hidden_over_heads_is_written(rows):
    """Qwen3-30B-A3B: 32 heads of 128 over a hidden size of 2,048 (HF config head_dim 128); NeMo
    AutoModel runs it with DeepEP (``training.expert_dispatch``)."""
    case = case_of(rows["automodel_qwen330ba3b_h100_8g_bf16"])[0]
    assert case["training"]["expert_dispatch"] == "deepep"
    model = case["model"]
    assert (model["hidden_size"], model["num_attention_heads"], model["head_dim"]) == (2048, 32, 128)
    assert "head_dim" not in case_of(rows["playbook_3b_1n_dp1_tp1_pp8_mbs1_ga256_z0"])[0]["model"]


def test_megatron_bridge_rows_run_what_their_recipes_set(rows):
    """Megatron-Bridge's recipe for DeepSeek-V3 on 256 GB200 (26.04) recomputes the dense MLPs
    (``recompute_modules: [mlp]``), on 256 B200 (26.04.01) the up-projections and the MLPs, and
    in 26.02 the up-projections alone; its 26.06 GB300 recipe recomputes nothing and overlaps the
    experts' dispatch with compute (``moe_a2a_overlap``)."""
    gb200, _ = case_of(rows["mb_2604_deepseekv3_gb200_256g_mxfp8"])
    assert gb200["layout"]["recompute"] == "selective" and "moe_comm_overlap" not in gb200["training"]
    assert gb200["layout"]["recompute_modules"] == ["mlp"]
    assert case_of(rows["mb_260401_deepseekv3_b200_256g_mxfp8"])[0]["layout"]["recompute_modules"] \
        == ["mla_up_proj", "mlp"]
    assert case_of(rows["mb_2602_deepseekv3_gb200_256g_mxfp8"])[0]["layout"]["recompute_modules"] == ["mla_up_proj"]
    gb300, _ = case_of(rows["mb_260601_deepseekv3_gb300_256g_mxfp8"])
    assert gb300["layout"]["recompute"] == "none" and gb300["training"]["moe_comm_overlap"]


def test_megatron_bridge_2608_deepseek_rows_overlap_the_dispatch_their_helper_sets(rows):
    """The 26.08 DeepSeek-V3 recipes on GB200 and GB300 set their MoE settings in a helper, not in
    explicit settings: Megatron-Bridge's perf_recipes/deepseek/common.py
    ``_enable_deepseek_full_iteration_mxfp8`` sets ``comm_overlap.overlap_moe_expert_parallel_comm =
    True`` (with HybridEP and full-iteration CUDA graphs), which the rows record as
    ``moe_runtime.a2a_overlap: true``; their cases overlap the dispatch as the 26.06 ones do."""
    for rid in ("mb_2608_deepseekv3_gb300_256g_mxfp8", "mb_2608_deepseekv3_gb200_256g_mxfp8"):
        assert rows[rid]["moe_runtime"]["a2a_overlap"] is True
        assert case_of(rows[rid])[0]["training"]["moe_comm_overlap"] is True, rid
    # A row whose runtime says no overlap, and whose recipe sets none, keeps none.
    assert "moe_comm_overlap" not in case_of(rows["mb_2604_deepseekv3_gb200_256g_mxfp8"])[0]["training"]


def test_megatron_bridges_2509_rows_run_what_its_perf_script_set(rows):
    """The 25.09 rows name no recipe; its perf script (scripts/performance/run_script.py, v0.1.0rc4) runs
    DeepSeek-V3 on H100 with the dispatch overlapped in 1F1B and MLA's up-projections and the dense MLPs
    recomputed, in its own pipeline layout, on B200 and GB200 with the up-projections recomputed and the
    token drop its table labels "(tokendrop)": capacity factor 1.0, padded (apply_moe_token_drop)."""
    h100, _ = case_of(rows["mb_2509_deepseekv3_h100_1024g_fp8"])
    assert h100["training"]["moe_comm_overlap"] and h100["layout"]["recompute_modules"] == ["mla_up_proj", "mlp"]
    # ... in its own layout on H100 (run_script.py: "Et|(tt|)*30mL"), the MTP module and loss a chunk alone.
    assert h100["layout"]["chunk_layers"] == [1] + [2] * 30 + [0] and "stage_layers" not in h100["layout"]
    assert "moe_capacity_factor" not in h100["model"]  # its row: "DeepSeekV3 (dropless)"
    for rid in ("mb_2509_deepseekv3_b200_256g_fp8", "mb_2509_deepseekv3_gb200_256g_fp8"):
        case, _ = case_of(rows[rid])
        assert case["layout"]["recompute_modules"] == ["mla_up_proj"] and "moe_comm_overlap" not in case["training"]
        assert case["model"]["moe_capacity_factor"] == 1.0
    assert case_of(rows["mb_2509_qwen330ba3b_b200_8g_fp8"])[0]["model"]["moe_capacity_factor"] == 1.0
    # A later container's row states its own recipe, or none: no 25.09 settings leak into it.
    assert "moe_capacity_factor" not in case_of(rows["mb_2511_deepseekv3_b200_256g_mxfp8"])[0]["model"]


def test_megatron_bridges_2511_rows_without_a_recipe_take_the_base_config_of_their_layout(rows):
    """The 25.11 DeepSeek-V3 bf16 run on 256 GB200s attaches no recipe (its global batch is 4,096, its
    base config's 2,048), but it runs that config's TP 1, PP 4, VP 4, EP 64 and micro-batch 1, which
    recomputes MLA's up-projections (v0.2.1 workload_base_configs.py): the run fits in a GB200's 186 GiB
    with them recomputed and would not without (151.2 and 188.1 GiB when written). Its MXFP8 sibling
    (PP 8, EP 32) matches no config and keeps none."""
    bf16, _ = case_of(rows["mb_2511_deepseekv3_gb200_256g_bf16"])
    assert bf16["layout"]["recompute"] == "selective" and bf16["layout"]["recompute_modules"] == ["mla_up_proj"]
    bare = {**bf16, "layout": {**bf16["layout"], "recompute": "none", "recompute_modules": None}}
    with_recompute, without = estimate_case(bf16), estimate_case(bare)
    assert with_recompute.peak.total <= with_recompute.usable_bytes < without.peak.total
    mx, _ = case_of(rows["mb_2511_deepseekv3_gb200_256g_mxfp8"])
    assert mx["layout"]["recompute"] == "none" and "recompute_modules" not in mx["layout"]


def test_megatron_bridge_fp8_runs_keep_their_weights_quantized(rows):
    """The perf scripts' precision configs (``scripts/performance/utils/precision.py``): MXFP8 and
    FP8 current scaling (FP8_CS, per-tensor) set fp8_param_gather; the sub-channel (blockwise)
    config does not, and the case says so (false); other sources' cases leave it to the engine's
    default."""
    mx, _ = case_of(rows["mb_2604_qwen330ba3b_gb300_8g_mxfp8"])
    cs, _ = case_of(rows["mb_2604_qwen330ba3b_h100_16g_fp8"])
    block, _ = case_of(rows["mb_2509_deepseekv3_h100_1024g_fp8_128x128_alt"])
    assert mx["training"]["fp8_param_gather"] and cs["training"]["fp8_param_gather"]
    assert cs["training"]["fp8_recipe"] == "tensorwise"
    assert block["training"]["fp8_recipe"] == "blockwise" and block["training"]["fp8_param_gather"] is False
    nemo, _ = case_of(rows["nemo2407_h100_fp8_LLAMA3-70B_64gpu"])
    assert "fp8_param_gather" not in nemo["training"]


def test_deepseek_v3_rows_train_the_mtp_module_their_flops_count(rows):
    """Megatron-Bridge's DeepSeek-V3 rows publish model TFLOP/s that count the MTP module (260
    GFLOP a token), except 25.11's GB200 and GB300 rows, labelled "w/o MTP" (249.6), as NeMo
    AutoModel's (249.7): only the former train it."""
    for row_id, mtp in (("mb_2608_deepseekv3_gb300_256g_mxfp8", 1), ("mb_2511_deepseekv3_b200_256g_mxfp8", 1),
                        ("mb_2511_deepseekv3_gb200_256g_mxfp8", None), ("automodel_deepseekv3_h100_256g_bf16", None)):
        assert case_of(rows[row_id])[0]["model"].get("mtp_layers") == mtp, row_id
    # Written in Megatron-Bridge's layout for MTP: pp 4, vpp 4, "Et*4|(t*4|)*14tmL".
    layout = case_of(rows["mb_2608_deepseekv3_gb200_256g_mxfp8"])[0]["layout"]
    assert layout["chunk_layers"] == [4] * 15 + [1] and "stage_layers" not in layout
    assert load_case(case_of(rows["mb_2608_deepseekv3_gb200_256g_mxfp8"])[0]).job().stage_layers == (16, 16, 16, 13)


def test_mtp_stages_are_megatron_bridges_deepseek_v3_layouts():
    """``_get_deepseek_v3_pipeline_layout`` (recipes/deepseek/h100/deepseek_v3.py), chunk by chunk:
    (4, 1) 16, 16, 16 and 13; (8, 1) and (4, 2) seven of 8 and one of 5; (16, 1), (8, 2) and (4, 4)
    fifteen of 4 and one of 1, as the perf recipes' "Et*4|(t*4|)*14tmL" at (2, 8); none where the
    last would be empty (61 over 32)."""
    assert bridge_mtp_split(61, 4, 1) == [16, 16, 16, 13]
    assert bridge_mtp_split(61, 8, 1) == bridge_mtp_split(61, 4, 2) == [8] * 7 + [5]
    assert bridge_mtp_split(61, 16, 1) == bridge_mtp_split(61, 8, 2) == bridge_mtp_split(61, 4, 4) \
        == bridge_mtp_split(61, 2, 8) == [4] * 15 + [1]
    assert bridge_mtp_split(61, 8, 4) is None and bridge_mtp_split(61, 1, 1) is None


def test_nemo_rows_run_megatron_with_tp_overlap_and_the_distributed_optimizer(rows):
    case, _ = case_of(rows["nemo2407_h100_fp8_GPT3-175B_128gpu"])
    assert case["model"]["vocab_size"] == 51200 and case["model"]["tied_embeddings"]
    assert case["training"] | {"precision": "fp8", "engine": "megatron", "tp_comm_overlap": True} == case["training"]
    assert case["layout"]["zero_stage"] == 1 and case["layout"]["vpp"] == 6


def test_megatron_recipes_count_embedding_and_loss_as_layers_where_the_layers_do_not_divide():
    assert pipeline_split(126, 32) == {"account_for_embedding_in_pipeline_split": True,
                                       "account_for_loss_in_pipeline_split": True}
    assert pipeline_split(96, 8) == {}
    assert pipeline_split(80, 3) is None
    assert balanced_stages(80, 3) == [27, 27, 26]  # the middle stage first, then the first
    assert balanced_stages(30, 4) == [7, 8, 8, 7]


def test_the_playbooks_memory_is_its_first_stages(rows):
    """nanotron writes its benchmark table from world rank 0, the first pipeline stage: the 1B at
    pp 2 with one micro-batch of 8 a step published 44.9 GiB, where its last stage holds the LM
    head's fp32 logits of all 8 sequences as well."""
    row = rows["playbook_1b_8n_dp32_tp1_pp2_mbs8_ga1_z1"]
    assert published_memory_stage(row) == 0
    assert published_memory_stage(rows["torchao_mx_b200_llama3_8b_8gpu_bf16"]) is None  # torchtitan's: the heaviest
    assert evaluate([row], experts=False).rows[0].peak_gib == pytest.approx(44.9, rel=0.10)
    estimate = estimate_case(case_of(row)[0])
    assert estimate.peak.total / 2**30 > 1.4 * 44.9  # the heaviest stage: the last


@pytest.mark.parametrize("text, expected", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"), ("A100-40GB (1600 Gbps RoCE)", "a100-sxm-40gb"),
    ("A100-SXM4-80GB (Selene)", "a100-sxm-80gb"), ("NVIDIA GB200", "gb200"), ("NVIDIA Blackwell Ultra", "gb300"),
    ("AMD Instinct MI300X", "mi300x"), ("TPU v5p", None)])
def test_gpu_names_map_to_presets(text, expected):
    assert gpu_preset(text) == expected


@pytest.mark.parametrize("text, expected", [("bf16", "bf16"), ("FP8 (delayed)", "fp8"), ("MXFP8", "mxfp8"),
                                            ("NVFP4", "nvfp4"), ("fp16 mixed", "fp16"), ("LoRA bf16", None),
                                            ("mixed (fp16/bf16 not stated)", "bf16")])
def test_precision_as_stated(text, expected):
    assert precision(text) == expected


def test_zero_stage_from_fsdp_the_stage_or_the_distributed_optimizer():
    def row(framework="x", **parallel):
        return {"framework": framework, "parallel": {"fsdp": None, "zero_stage": None, "distributed_optimizer": False,
                                                     **parallel}}
    assert zero_stage(row(fsdp="FULL_SHARD")) == 3
    assert zero_stage(row(fsdp="SHARD_GRAD_OP")) == 2
    assert zero_stage(row(fsdp=64)) == 3  # NeMo AutoModel: FSDP2 fully_shard over 64 ranks
    assert zero_stage(row(fsdp=1)) == zero_stage(row(fsdp=False)) == 0
    assert zero_stage(row(zero_stage=1)) == 1
    assert zero_stage(row(distributed_optimizer=True)) == 1
    assert zero_stage(row("Megatron-Core 0.9", distributed_optimizer=None)) == 1
    assert zero_stage(row()) == 0


def test_rows_without_a_layout_or_a_pretraining_precision_are_not_cases(rows):
    reasons = {case_of(r)[1] for r in rows.values()}
    assert {"", "layout not published", "not a supported row", "model not fully published"} <= reasons


def test_bloom_is_written_as_it_ran_on_jean_zay(rows):
    """BLOOM trained on Jean Zay's A100 nodes, 4 Omni-Path 100 Gbit/s links each (tr11 README:
    "4 OmniPath links"), with the bigscience fork's default dropout of 0.1 (its slurm script sets
    none; the README: "The default Megatron-LM dropout settings are inherited"). Only the main
    row's GPU string names the network; the ramp-up rows are the same run. Megatron-DeepSpeed's
    grid puts tp fastest, then dp: a node holds two of a replica's 8 data-parallel ranks, so the
    gradient all-reduce drives 2 NICs of 4 · 100 / 8 = 50 Gbit/s, at the fabric's 0.80:
    2 · 6.25 GB/s · 0.80 = 10 GB/s of bus bandwidth (against 2 · 25 · 0.96 = 48 on HDR).
    Its script runs DeepSpeed at stage 0 with bf16 ("bf16 must use z0! it implements its own zero
    stage 1 equivalent"): DeepSpeed's BF16_Optimizer, whose pipeline all-reduces fp32 gradients."""
    from cost_models.collectives import bus_bandwidth
    from cost_models.model_states import state_bytes
    from cost_models.topology import group_links

    for row_id in ("bloom176b_main_iter85376", "bloom176b_rampup_gbs16", "bloom176b_rampup_gbs192"):
        case, why = case_of(rows[row_id])
        assert why == "" and case["cluster"]["fabric"] == "omni-path-100", row_id
        assert case["model"]["dropout"] == 0.1, row_id
        assert case["training"]["fp32_grads"] is True, row_id
        assert state_bytes(load_case(case).training).gradients == 4, row_id
    assert "Omni-Path" in rows["bloom176b_main_iter85376"]["gpu"]
    assert "Omni-Path" not in rows["bloom176b_rampup_gbs16"]["gpu"]
    job = load_case(case_of(rows["bloom176b_rampup_gbs16"])[0]).job()
    links = group_links(job.cluster, job.layout, "dp_cp")
    assert (links.size, links.per_domain) == (8, 2)
    assert bus_bandwidth(links, job.cluster.gpu.performance) == pytest.approx(2 * 6.25e9 * 0.80)


def test_automodel_runs_are_written_as_its_configs_build_them(rows):
    """NeMo AutoModel builds its models in bf16 and steps them with torch.optim.Adam (no master
    copy: training.master_weights false), and its Qwen3-30B-A3B benchmark config checkpoints every
    block (parallelizer.activation_checkpointing: true), which the row leaves out. So written, the
    run on 8 H100s fits as it ran: 3.8 G parameters a GPU (16 of the 128 experts whole, the rest
    sharded over 8) at 8 bytes, where the fp32 master and moments would take 16 and no memory be left."""
    case, why = case_of(rows["automodel_qwen330ba3b_h100_8g_bf16"])
    assert why == "" and case["training"]["master_weights"] is False and case["layout"]["recompute"] == "full"
    assert rows["automodel_qwen330ba3b_h100_8g_bf16"]["recompute"] is None
    from planner.estimate import estimate
    ran = estimate(case)
    assert ran.fits
    states = ran.peak.parameters + ran.peak.gradients + ran.peak.optimizer_states
    assert states == pytest.approx(8 * 3.81e9, rel=0.01)
    assert not estimate({**case, "training": {**case["training"], "master_weights": True}}).fits
    # Rows that publish their recomputation keep it; other sources keep their master weights.
    assert case_of(rows["automodel_gptoss20b_h100_8g_bf16"])[0]["layout"]["recompute"] == "full"
    assert "master_weights" not in case_of(rows["playbook_1b_1n_dp4_tp1_pp2_mbs4_ga16_z1"])[0]["training"]


def test_torchtitan_rows_compile_the_loss_where_their_torchtitan_did(rows):
    """torchtitan compiles the loss with the model since bbb1b616e (2025-04-02): torchao's MI300X
    and B200 runs (torchtitan 2c8b594 and 6fc499f, August 2025) did, its H100 float8 runs
    (torchtitan 0.0.2) did not. Compiled, the last stage's peak holds 8 bytes a logit less (the
    16-bit logits and one gradient, 2 + 2, against the fp32 log-softmax and the two fp32 gradients
    its backward holds at once, 4 + 8: tests/test_eager_loss_torch.py), and the fragmentation the
    model adds on activations with them."""
    from planner.estimate import estimate

    def case(row_id):
        return case_of(rows[row_id])[0]

    assert case("torchao_float8_h100_llama3_8b_8gpu_bf16")["training"]["compiled_loss"] is False
    assert case("torchao_mx_b200_llama3_8b_8gpu_bf16")["training"]["compiled_loss"] is True
    mi300x = case("torchao_float8_mi300x_llama3_8b_8gpu_bf16")
    assert mi300x["training"]["compiled_loss"] is True
    compiled = estimate(mi300x)
    eager = estimate({**mi300x, "training": {**mi300x["training"], "compiled_loss": False}})
    logits = 8192 * 128256
    fragmentation = compiled.job.overheads.fragmentation
    assert eager.peak.total - compiled.peak.total == pytest.approx(8 * logits * (1 + fragmentation))
    assert "compiled_loss" not in case("torchtitan_2024_a100_llama3_8b_64gpu_bs1_ac_selective_op")["training"]


def test_torchaos_power_limited_b200s_carry_their_clock(rows):
    """torchao's MX README ran on "8x power limited B200" GPUs: their cases state that machine's
    clock (0.635 of the B200 preset's), measured from its bf16 run, which it then predicts: 8,307.5
    tokens/s a GPU. Megatron-Bridge's B200s ran at full power: their cases state no cap."""
    from planner.estimate import estimate

    capped = case_of(rows["torchao_mx_b200_llama3_8b_8gpu_bf16"])[0]
    assert capped["cluster"]["performance"] == {"sustained_clock": 0.635}
    assert estimate(capped).tokens_per_s / 8 == pytest.approx(8307.5, rel=0.03)
    assert "performance" not in case_of(rows["mb_2604_deepseekv3_b200_256g_mxfp8"])[0]["cluster"]


def test_a_row_that_names_fp32_is_scored_as_fp32_and_one_that_names_nothing_as_bf16():
    """validate-published scored a custom file's fp32 run as bf16 (5.4 % where the fp32 run is
    45 % off); a table's unstated mixed precision stays bf16."""
    from planner.published_runs import precision

    assert precision("fp32 (TF32 matmuls)") == "fp32" and precision("FP32") == "fp32"
    assert precision("mixed (not stated)") == "bf16" and precision(None) == "bf16"
    assert precision("fp16 params/grads + fp32 Adam (2+2+12 bytes/param)") == "fp16"


@pytest.mark.parametrize("name", ["H100 PCIe 80GB", "NVIDIA H100-PCIe", "H100 NVL 94GB", "A100 PCIe 80GB",
                                  "A100-PCIE-40GB"])
def test_a_pcie_card_is_no_sxm_preset(name):
    """A hand-written run on "H100 PCIe 80GB" was scored as an H100 SXM (its peak, HBM and NVLink
    switch), 99 % off with no word; a PCIe card is no preset's part, so its row is not a supported one."""
    assert gpu_preset(name) is None


@pytest.mark.parametrize("name, preset", [("H100-SXM5-80GB (DGX H100)", "h100-sxm-80gb"),
                                          ("GB200 (DGX GB200 NVL72)", "gb200"), ("A100-40GB (1600 Gbps RoCE)", "a100-sxm-40gb"),
                                          ("NVIDIA Blackwell GPU (GB200) 189471 MiB [Tyche (8x NVIDIA GB200 NVL72)]", "gb200")])
def test_the_sxm_and_nvl72_parts_keep_their_presets(name, preset):
    assert gpu_preset(name) == preset


def test_a_runs_file_is_parsed_once_while_its_text_is_unchanged_and_each_caller_gets_its_own_rows(
        tmp_path, monkeypatch):
    """The shipped runs are 4 MB of YAML, seconds to parse: `validate-published --leave-family-out`
    loaded them twice (its scores, then the families'), as does a Python session scoring them more than
    once. A file whose text has not changed is not parsed again; one that changed is; and a caller
    that edits its rows changes no other caller's."""
    from planner import inputs

    parsed: list[str] = []
    real = inputs.load_yaml

    def counting(text, source, *args, **kwargs):
        parsed.append(source)
        return real(text, source, *args, **kwargs)

    monkeypatch.setattr(inputs, "load_yaml", counting)
    first = load_rows()
    parsed.clear()
    again = load_rows()
    assert parsed == [] and again == first
    again[0]["model"]["name"] = "edited"
    again[0]["id"] = "edited"
    assert load_rows()[0] == first[0] != again[0]

    runs = tmp_path / "runs.yaml"
    runs.write_text("- {id: a, source: mine}\n")
    assert [r["id"] for r in load_rows([runs])] == ["a"]
    runs.write_text("- {id: b, source: mine}\n")
    assert [r["id"] for r in load_rows([runs])] == ["b"]
    assert parsed == [str(runs), str(runs)]
