"""Low-precision recipes: the quantize traffic, peaks, kept-high layers, saved bytes and weight
gathers, each against the exact formula or the figure it comes from."""

from __future__ import annotations

import pytest

import planner
from cost_models.activations import layer_activations
from cost_models.model_states import gathered_weight_bytes, state_bytes
from cost_models.partition import model_chunks, tail_layers_per_stage
from cost_models.quantization import RECIPES, linear_quantize_bytes, tensor_quantize_bytes
from cost_models.specs import Layout, ModelSpec, SpecError, TrainingSpec
from planner.case import load_case
from planner.engines import behaviour_of
from planner.errors import CaseError


def test_one_pass_reads_the_bf16_tensor_once_and_writes_each_layout():
    """Transformer Engine's cast_transpose (delayed scaling): read 2 bytes, write fp8 and its
    transpose: 4 bytes an element. Current per-tensor scaling reads once more for the amax: 6."""
    assert tensor_quantize_bytes(RECIPES["delayed"], 1000, 2, fused_layouts=True) == 4000
    assert tensor_quantize_bytes(RECIPES["tensorwise"], 1000, 2, fused_layouts=True) == 6000


def test_torchao_casts_each_use_from_bf16():
    """torchao casts each of the two uses on its own: 2 × (amax 2 + read 2 + write 1) = 10 bytes
    an element with per-tensor scaling, 2 × (2 + 1) = 6 row-wise."""
    assert tensor_quantize_bytes(RECIPES["tensorwise"], 1000, 2, fused_layouts=False) == 10000
    assert tensor_quantize_bytes(RECIPES["rowwise"], 1000, 2, fused_layouts=False) == 6000


def test_block_scales_are_written_with_the_data():
    """MXFP8: one E8M0 byte per 32 elements; NVFP4: half-byte elements, one E4M3 byte per 16 and a
    per-tensor amax pass: (2 + 2) + 2 × (0.5 + 1/16) bytes an element from one fused pass."""
    assert tensor_quantize_bytes(RECIPES["mxfp8"], 3200, 1, fused_layouts=True) == 3200 * 2 + 3200 + 100
    assert tensor_quantize_bytes(RECIPES["nvfp4"], 1600, 2, fused_layouts=True) == pytest.approx(
        1600 * 4 + 2 * (800 + 100))


def test_a_quantize_in_the_norm_kernel_reads_nothing_more():
    """LayerNormLinear writes X quantized from the norm: only the two layouts' writes remain."""
    assert tensor_quantize_bytes(RECIPES["delayed"], 1000, 2, fused_layouts=True, in_producer=True) == 2000


def test_linear_quantize_splits_forward_and_backward():
    """X and W in forward (both layouts where the library writes them together), dY in backward;
    the weight at the share each micro-batch pays."""
    r = RECIPES["delayed"]
    q = linear_quantize_bytes(r, m=10, n=30, k=20, fused_layouts=True, weight_share=0.25)
    assert q.forward == 4 * 10 * 20 + 4 * 30 * 20 * 0.25 and q.backward == 4 * 10 * 30
    # torchao: the wgrad copy of X and the dgrad copy of W are cast in backward.
    q = linear_quantize_bytes(RECIPES["rowwise"], m=10, n=30, k=20, fused_layouts=False)
    assert q.forward == 3 * 10 * 20 + 3 * 30 * 20 and q.backward == 3 * 10 * 20 + 3 * 30 * 20 + 6 * 10 * 30


def test_rowwise_with_high_precision_wgrad_quantizes_for_one_gemm():
    q = linear_quantize_bytes(RECIPES["rowwise_with_gw_hp"], m=10, n=30, k=20, fused_layouts=False)
    assert q.forward == 3 * 10 * 20 + 3 * 30 * 20 and q.backward == 3 * 30 * 20 + 3 * 10 * 30


def _case(gpu: str, precision: str, engine: str = "megatron", **training) -> dict:
    return {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": gpu, "num_gpus": 8},
            "training": {"global_batch_size": 32, "seq_len": 4096, "precision": precision, "engine": engine,
                         **training},
            "layout": {"zero_stage": 1, "micro_batch_size": 1}}


def test_block_scaled_precisions_run_at_their_elements_peak():
    """MXFP8 at the fp8 peak, NVFP4 at the fp4 peak: B200 9,000 TFLOP/s (HGX B200 datasheet, 18 PF
    sparse halved), twice fp8; GB300 15,000, three times fp8 (GB300 NVL72: 1,080 PF dense / 72)."""
    b200 = load_case(_case("b200", "nvfp4")).cluster.gpu
    assert b200.peak("mxfp8") == b200.peak("fp8") == 4500e12 and b200.peak("nvfp4") == 9000e12
    gb300 = load_case(_case("gb300", "nvfp4")).cluster.gpu
    assert gb300.peak("nvfp4") == 3 * gb300.peak("fp8")


@pytest.mark.parametrize("gpu, precision", [("h100", "mxfp8"), ("h200", "nvfp4"), ("mi300x", "mxfp8"),
                                            ("mi355x", "nvfp4"), ("a100-80gb", "fp8"), ("h800", "nvfp4")])
def test_a_gpu_without_the_format_is_refused_with_the_key(gpu, precision):
    with pytest.raises(CaseError) as error:
        planner.estimate(_case(gpu, precision))
    assert error.value.key == "training.precision"


def test_mi355x_runs_mx_formats_at_its_fp8_peak():
    """CDNA4 takes OCP MX blocks in its scaled matrix instructions at the FP8 rate: 5,033.2 TFLOP/s
    dense (MI355X datasheet), twice bf16's 2,516.6."""
    mi355x = load_case(_case("mi355x", "mxfp8")).cluster.gpu
    assert mi355x.peak("mxfp8") == mi355x.peak("fp8") == 5033.2e12 == 2 * mi355x.peak("bf16")
    mx, bf16 = (planner.estimate(_case("mi355x", p)).step_time_s for p in ("mxfp8", "bf16"))
    assert mx < bf16


def test_nvfp4_keeps_the_last_fifteen_percent_of_layers_in_bf16():
    """⌈0.15 · 32⌉ = 5 layers, all on the last of 4 stages; with 8 stages of 4, 4 on the last and
    1 on the one before (torchtitan's nvfp4_bf16_tail_fqns rounds up likewise)."""
    job = load_case({**_case("b200", "nvfp4"), "layout": {"pp": 4, "micro_batch_size": 1}}).job()
    assert job.high_precision_layers == (0, 0, 0, 5)
    job = load_case({**_case("b200", "nvfp4"), "layout": {"pp": 8, "micro_batch_size": 1}}).job()
    assert job.high_precision_layers == (0,) * 6 + (1, 4)
    assert load_case(_case("b200", "mxfp8")).job().high_precision_layers == (0,)


def test_interleaved_chunks_hold_the_tail_on_every_rank():
    """vpp 2 on 2 ranks of 8 layers: chunks 4, 4, 4, 4 in model order r0, r1, r0, r1; the last 5
    layers are chunk 3 (rank 1) and one of chunk 2 (rank 0)."""
    assert model_chunks((8, 8), 2) == [(0, 4), (1, 4), (0, 4), (1, 4)]
    assert tail_layers_per_stage((8, 8), 2, 5) == (1, 4)


def test_kept_high_layers_cost_what_bf16_layers_cost():
    """A stage of bf16-kept layers runs at the bf16 rate: NVFP4's last stage is slower per layer."""
    from cost_models.layer_time import layer_time

    job = load_case({**_case("b200", "nvfp4"), "layout": {"pp": 4, "micro_batch_size": 1}}).job()
    assert layer_time(job, quantized=False).total > layer_time(job).total


def test_transformer_engine_keeps_quantized_inputs_torchao_bf16():
    """The linear inputs saved for wgrad: 1 byte in fp8 under Transformer Engine, 0.5 + 1/16 under
    NVFP4; torchao keeps them bf16 (2 bytes). The flash attention keeps its own bf16 output beside the
    output projection's input: a quantized copy beside it under delayed scaling, none under NVFP4,
    where megatron-core has linear_proj keep the original (attention.py, set_save_original_input)."""
    model = ModelSpec("m", num_layers=1, hidden_size=1024, num_attention_heads=8, vocab_size=1000,
                      activation="swiglu", ffn_hidden_size=4096)
    lay = Layout(micro_batch_size=1)

    def inputs(precision, engine):
        a = layer_activations(model, TrainingSpec(8, 1024, precision=precision, engine=behaviour_of(engine)), lay)
        return a.qkv_input + a.projection_input + a.mlp_input

    s, h = 1024, 1024
    assert inputs("fp8", "megatron") == (1 + (2 + 1) + 1) * s * h
    assert inputs("nvfp4", "megatron") == pytest.approx((2 * (0.5 + 1 / 16) + 2) * s * h)
    assert inputs("fp8", "any") == inputs("bf16", "any") == 3 * 2 * s * h


@pytest.mark.parametrize("preset, recipe, projection, norm_output, qkv_input", [
    # Qwen3-30B-A3B (32 heads of 128, hidden 2048, no shared expert) under delayed scaling: the attention
    # keeps its bf16 output and linear_proj its fp8 copy, 3 bytes; the router its bf16 input, 2 bytes.
    ("qwen3-30b-a3b", "delayed", 3 * 4096 * 4096, 2 * 4096 * 2048, 1 * 4096 * 2048),
    # DeepSeek-V3 (128 heads of 128, hidden 7168) blockwise: linear_proj keeps the original (2 bytes);
    # the router the norm's output and the shared experts' linear_fc1 the original beside it; MLA's
    # norm output feeds two down-projections, each keeping its own copy, and its two latents one each.
    ("deepseek-v3", "blockwise", 2 * 4096 * 16384, 2 * 4096 * 7168,
     (2 * 7168 + 1536 + 512) * 4096 * (1 + 4 / 128)),
])
def test_megatron_fp8_keeps_the_16_bit_tensors_other_ops_save_beside_the_quantized_copies(
        preset, recipe, projection, norm_output, qkv_input):
    """megatron-core 0.16: the fused attention saves its output itself (attention.py: "the output of the
    fused core_attn is saved by itself"), and the MoE router its 16-bit input (moe_utils.py,
    RouterGatingLinearFunction.save_for_backward(inp, ...)); only the quantized copy was counted, 2.0 GB
    (13.7 %) short of Qwen3-30B-A3B's first stage at pp 4 under delayed scaling."""
    case = load_case({"model": {"preset": preset}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
                      "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "fp8", "fp8_recipe": recipe,
                                   "engine": "megatron"}, "layout": {"micro_batch_size": 1}})
    job = case.job()
    saved = layer_activations(job.model, job.training, job.layout, moe=True)
    assert (saved.projection_input, saved.mlp_input) == (projection, norm_output)
    assert saved.qkv_input == pytest.approx(qkv_input)


def test_fp8_parameter_gather_halves_the_gathered_bytes():
    """--fp8-param-gather: the distributed optimizer's gather moves 1 byte a weight, not 2, and
    Megatron keeps the weights quantized (1 byte); torchao's FSDP float8 all-gather keeps bf16 shards."""
    te = TrainingSpec(8, 1024, precision="fp8", engine=behaviour_of("megatron"), fp8_param_gather=True)
    ao = TrainingSpec(8, 1024, precision="fp8", engine=behaviour_of("any"), fp8_param_gather=True)
    plain = TrainingSpec(8, 1024, precision="fp8", engine=behaviour_of("megatron"))
    assert gathered_weight_bytes(te) == gathered_weight_bytes(ao) == 1 and gathered_weight_bytes(plain) == 2
    assert state_bytes(te).weights == 1 and state_bytes(ao).weights == 2


def test_fp8_param_gather_shortens_the_gathers():
    slow = planner.estimate(_case("h100", "fp8", fp8_param_gather=False))
    fast = planner.estimate(_case("h100", "fp8", fp8_param_gather=True))
    assert fast.time.dp_comm_s < slow.time.dp_comm_s


@pytest.mark.parametrize("training, key", [
    ({"precision": "bf16", "fp8_recipe": "delayed"}, "training.fp8_recipe"),
    ({"precision": "mxfp8", "fp8_recipe": "delayed"}, "training.fp8_recipe"),
    ({"precision": "fp8", "fp8_recipe": "per-block"}, "training.fp8_recipe"),
    ({"precision": "bf16", "fp8_param_gather": True}, "training.fp8_param_gather"),
])
def test_bad_recipe_keys_name_the_key(training, key):
    with pytest.raises(CaseError) as error:
        load_case(_case("h100", **training))
    assert error.value.key == key


def test_engines_default_recipes():
    """Megatron: TransformerConfig.fp8_recipe = "delayed"; torchtitan 0.3.0's Float8LinearConverter:
    recipe_name = "rowwise"; plain PyTorch with torchao: Float8LinearConfig() scales per tensor."""
    names = {engine: TrainingSpec(8, 1024, precision="fp8", engine=behaviour_of(engine)).recipe.name
             for engine in ("megatron", "deepspeed", "torchtitan", "any")}
    assert names == {"megatron": "delayed", "deepspeed": "delayed", "torchtitan": "rowwise", "any": "tensorwise"}


def test_a_low_precision_recipe_on_fp32_is_refused():
    with pytest.raises(SpecError):
        TrainingSpec(8, 1024, precision="fp32", fp8_param_gather=True)


def test_the_power_cap_slows_tensor_cores_only():
    """A cluster's power cap (``cluster.performance.sustained_clock``) scales GEMM and attention
    rates by the clock; an HBM-bound kernel is unchanged. The B200 preset is a B200 at full power."""
    from cost_models.flops import Gemm
    from cost_models.kernels import elementwise_time, gemm_time

    full = load_case(_case("b200", "bf16")).cluster.gpu
    capped_case = _case("b200", "bf16")
    capped_case["cluster"]["performance"] = {"sustained_clock": 0.635}
    capped = load_case(capped_case).cluster.gpu
    gemm = Gemm("g", 8192, 8192, 8192)
    overhead = full.performance.kernel_overhead_s
    ratio = (gemm_time(gemm, capped, "bf16") - overhead) / (gemm_time(gemm, full, "bf16") - overhead)
    assert ratio == pytest.approx(1 / 0.635)
    assert elementwise_time(1e9, capped) == elementwise_time(1e9, full)
    assert full.performance.sustained_clock == 1.0


@pytest.mark.parametrize("engine, recipe, runs", [
    ("any", "tensorwise", True), ("any", "rowwise", True), ("any", "blockwise", True),
    ("megatron", "blockwise", True), ("megatron", "rowwise", False),
    ("torchtitan", "rowwise_with_gw_hp", True), ("torchtitan", "tensorwise", False),
    ("deepspeed", "delayed", True), ("deepspeed", "rowwise", False)])
def test_each_engine_takes_the_fp8_recipes_its_library_has(engine, recipe, runs):
    """Transformer Engine (Megatron, DeepSpeed): delayed, tensorwise, blockwise; torchao
    (torchtitan): the row-wise ones; no engine in particular: every recipe."""
    from planner.engines import ENGINES

    training = TrainingSpec(8, 1024, precision="fp8", fp8_recipe=recipe)
    assert (ENGINES[engine].support.recipe_refusals(training) == []) == runs


def _weight_memory(gpu: str, precision: str, zero_stage: int = 1, **training) -> tuple[float, float]:
    """(parameters term of the estimate, the stage's linear weights) of llama3-8b on 8 GPUs."""
    from cost_models.parameters import stage_linear_parameters
    case = _case(gpu, precision, **training)
    case["layout"]["zero_stage"] = zero_stage
    job = load_case(case)
    linear = stage_linear_parameters(job.model, job.model.num_layers, 1)
    return planner.estimate(case).to_dict()["memory"]["by_term"]["parameters"], linear


@pytest.mark.parametrize("gpu, precision, recipe, copy", [
    ("h100", "fp8", "delayed", 2.0),  # fp8 data and its transpose (Hopper's fp8 GEMMs are TN only)
    ("b200", "fp8", "tensorwise", 1.0),  # Blackwell's take either layout: the data alone
    ("b200", "mxfp8", None, 2 * (1 + 1 / 32)),  # row- and column-wise blocks, each with its E8M0 scales
    ("b200", "fp8", "blockwise", 2 * (1 + 4 / 128)),  # scaled along k: two layouts at the recipe's bytes
])
def test_megatron_keeps_a_quantized_copy_of_every_linear_weight(gpu, precision, recipe, copy):
    """Transformer Engine's weight workspace (``_fp8_workspaces``, kept across micro-batches and steps
    where Megatron passes is_first_microbatch) holds each linear weight quantized beside the bf16 one:
    the estimate's weights grow by exactly that many bytes per linear weight over bf16 training."""
    extra = {"fp8_recipe": recipe} if recipe else {}
    quantized, linear = _weight_memory(gpu, precision, fp8_param_gather=False, **extra)
    bf16, _ = _weight_memory(gpu, "bf16")
    assert quantized - bf16 == pytest.approx(copy * linear, rel=1e-12)


def test_quantized_parameters_add_only_their_other_layout():
    """--fp8-param-gather: the linears' weights are Transformer Engine's quantized parameters (1 byte
    each: ``state_bytes``; Megatron-FSDP's README: "number of parameter × 1 Byte"), the embedding, LM
    head and norms, no TE linears, stay bf16; on Hopper, the transpose dgrad reads beside the linears'."""
    from cost_models.parameters import total_parameters
    quantized, linear = _weight_memory("h100", "fp8", fp8_param_gather=True)
    job = load_case(_case("h100", "fp8"))
    assert quantized == pytest.approx(1.0 * linear + 2.0 * (total_parameters(job.model) - linear) + 1.0 * linear,
                                      rel=1e-12)


def test_no_copy_is_kept_where_the_weights_are_sharded_or_torchao_casts_them():
    """ZeRO-3 (Megatron-FSDP drops the quantized copies after each module's forward) and torchao
    (which casts each use) keep no quantized weights: the weights are bf16 training's."""
    assert _weight_memory("h100", "fp8", zero_stage=3, fp8_param_gather=False)[0] \
        == _weight_memory("h100", "bf16", zero_stage=3)[0]
    assert _weight_memory("h100", "fp8", engine="any")[0] == _weight_memory("h100", "bf16", engine="any")[0]


def test_the_linear_weights_are_all_but_the_embeddings_norms_and_router():
    """What a recipe quantizes: every parameter of the layers but their norms (and a MoE layer's
    router), the experts E/ep per GPU; the embedding, final norm and LM head stay bf16."""
    from cost_models.parameters import (embedding_parameters, norm_parameters, router_parameters,
                                        stage_linear_parameters, stage_parameters, total_parameters)
    dense = load_case(_case("h100", "bf16")).model
    layers = dense.num_layers
    assert stage_linear_parameters(dense, layers, 1) == total_parameters(dense) - 2 * embedding_parameters(dense) \
        - (2 * layers + 1) * norm_parameters(dense)
    moe = ModelSpec(name="tiny-moe", num_layers=4, hidden_size=256, num_attention_heads=4, ffn_hidden_size=1024, vocab_size=1000,
                    activation="swiglu", num_experts=8, moe_top_k=2, moe_ffn_hidden_size=128)
    held = stage_parameters(moe, 4, False, False, 1, 4, 2, 1)
    assert stage_linear_parameters(moe, 4, 1, 4, 2, 1) == held.total - 4 * (2 * norm_parameters(moe)
                                                                            + router_parameters(moe))


def test_keeping_the_weights_quantized_is_the_first_remedy_where_it_drops_a_copy():
    """Llama 3 70B on 64 H100s at tp 8: Megatron's fp8 copy of each linear weight beside the bf16
    one does not fit; the weights kept quantized (--fp8-param-gather) fit, at no cost in time,
    so that is the cheapest change named, with the peak the estimate of that case gives."""
    case = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100", "num_gpus": 64},
            "training": {"global_batch_size": 64, "seq_len": 8192, "precision": "fp8", "engine": "megatron",
                         "fp8_param_gather": False},
            "layout": {"tp": 8, "dp": 8, "micro_batch_size": 1, "zero_stage": 1, "sequence_parallel": True,
                       "recompute": "selective"}}
    copy = planner.estimate(case)
    remedy = copy.remedy()
    case["training"]["fp8_param_gather"] = True
    quantized = planner.estimate(case)
    assert not copy.fits and quantized.fits
    assert remedy.description.startswith("training.fp8_param_gather: true") and remedy.fits
    assert remedy.peak_bytes == quantized.peak.total
    # At ZeRO-2 Megatron cannot gather quantized weights (its rule): not offered there.
    from planner.estimate import remedies
    case["training"]["fp8_param_gather"] = False
    case["layout"]["zero_stage"] = 2
    assert not any(r.description.startswith("training.") for r in remedies(load_case(case).job()))


def test_mx_weights_kept_quantized_are_gathered_in_16_bits():
    """MXFP8's column-wise blocks do not follow from its row-wise ones, so Megatron gathers MXFP8
    weights in bf16 into the gradient buffer and quantizes both layouts after the gather
    (--reuse-grad-buf-for-mxfp8-param-ag): 2 bytes a weight gathered, and each weight quantized
    whole once a step, not on its shard. Per-tensor fp8 and 128×128 blocks gather the quantized
    shard (1 byte and its block scales)."""
    from cost_models.layer_time import weight_quantize_share
    mx = TrainingSpec(8, 1024, precision="mxfp8", engine=behaviour_of("megatron"), fp8_param_gather=True)
    block = TrainingSpec(8, 1024, precision="fp8", fp8_recipe="blockwise", engine=behaviour_of("megatron"),
                         fp8_param_gather=True)
    assert gathered_weight_bytes(mx) == 2 and gathered_weight_bytes(block) == 1 + 4 / 128
    case = _case("b200", "mxfp8", fp8_param_gather=True)
    case["layout"]["micro_batch_size"] = 1
    job = load_case(case).job()  # 8 GPUs, dp 8, 32 sequences: 4 micro-batches
    assert weight_quantize_share(job) == 1 / job.num_microbatches
    block_job = load_case(_case("h100", "fp8", fp8_recipe="blockwise", fp8_param_gather=True)).job()
    assert weight_quantize_share(block_job) == 1 / (block_job.num_microbatches * 8)


@pytest.mark.parametrize("gpu, precision, extra, zero_stage, engine, kept", [
    ("h100", "fp8", {}, 1, "megatron", True),  # bf16_with_fp8_delayed_scaling_mixed
    ("h100", "fp8", {"fp8_recipe": "tensorwise"}, 3, "megatron", True),  # bf16_with_fp8_current_scaling_mixed
    ("b200", "mxfp8", {}, 1, "megatron", True),  # bf16_with_mxfp8_mixed
    ("b200", "nvfp4", {}, 1, "megatron", True),  # bf16_with_nvfp4_mixed: fp4_param_gather
    ("h100", "fp8", {"fp8_recipe": "blockwise"}, 1, "megatron", False),  # the sub-channel config
    ("h100", "fp8", {}, 0, "megatron", False),  # --fp8-param-gather needs the distributed optimizer
    ("h100", "fp8", {}, 1, "any", False),
    ("h100", "fp8", {}, 3, "torchtitan", False),
])
def test_the_engines_default_keeps_weights_quantized_where_its_recipes_do(gpu, precision, extra, zero_stage,
                                                                          engine, kept):
    """A case that does not say takes the engine's default at its layout: Megatron keeps the weights
    quantized as Megatron-Bridge's precision configs do (``training/mixed_precision.py``), at ZeRO 1
    and 3; the estimate is then exactly the one of a case that says so."""
    case = _case(gpu, precision, engine=engine, **extra)
    case["layout"]["zero_stage"] = zero_stage
    if engine == "torchtitan":
        case["training"]["fp8_recipe"] = "rowwise"
    job = load_case(case).job()
    assert job.training.fp8_param_gather is kept and job.requested_training.fp8_param_gather is None
    said = {**case, "training": {**case["training"], "fp8_param_gather": kept}}
    assert planner.estimate(case).peak.total == planner.estimate(said).peak.total


def test_the_same_job_at_another_zero_stage_resolves_the_default_afresh():
    """A remedy that changes the ZeRO stage prices the weights as the engine holds them there."""
    job = load_case(_case("h100", "fp8")).job()
    assert job.training.fp8_param_gather
    at_zero_2 = job.with_layout(job.layout.with_changes(zero_stage=2))
    assert not at_zero_2.training.fp8_param_gather
    assert job.with_layout(job.layout.with_changes(zero_stage=3)).training.fp8_param_gather


def test_the_report_and_the_json_say_where_the_weights_are_kept_quantized():
    from planner.report import describe_layout
    kept = describe_layout(planner.estimate(_case("h100", "fp8")))
    copied = describe_layout(planner.estimate(_case("h100", "fp8", fp8_param_gather=False)))
    assert kept.endswith(", weights kept in fp8") and "weights kept" not in copied
    assert planner.estimate(_case("h100", "fp8")).to_dict()["training"]["fp8_param_gather"] is True
    at_zero_0 = _case("h100", "fp8")
    at_zero_0["layout"]["zero_stage"] = 0
    assert planner.estimate(at_zero_0).to_dict()["training"]["fp8_param_gather"] is False


def test_with_the_optimizer_offloaded_only_delayed_scaling_keeps_weights_quantized():
    """Megatron-LM's arguments.py: --optimizer-cpu-offload with --fp8-param-gather needs --fp8-recipe
    delayed. The default follows it, and a case that asks for the pair otherwise is refused by key."""
    def job(recipe: str, **training):
        case = _case("h100", "fp8", fp8_recipe=recipe, **training)
        case["layout"]["offload_optimizer"] = 1.0
        return load_case(case).job()

    assert job("delayed").training.fp8_param_gather and not job("tensorwise").training.fp8_param_gather
    case = _case("h100", "fp8", fp8_recipe="tensorwise", fp8_param_gather=True)
    case["layout"]["offload_optimizer"] = 1.0
    with pytest.raises(CaseError) as error:
        planner.estimate(case)
    assert error.value.key == "training.fp8_param_gather" and "fp8-recipe delayed" in str(error.value)


def test_the_search_bounds_the_states_at_both_ends_of_offload():
    """The search skips a ZeRO stage whose model states alone cannot fit. Offloading the optimizer
    no longer only lowers them: under tensorwise scaling Megatron then keeps the weights in 16 bits
    beside their cached fp8 copy. A 44-layer 13B on 8 H100s fits without offload (73.7 GiB of states
    and fixed buffers, 76.5 in all, of 78.2) but its states alone do not with the optimizer offloaded
    (79.7), so the stage must not be skipped."""
    from cost_models.memory import stage_memories
    from cost_models.specs import Layout
    from planner.search import _states_cannot_fit

    case = {"model": {"name": "x", "num_layers": 44, "hidden_size": 5120, "num_attention_heads": 40,
                      "ffn_hidden_size": 13824, "vocab_size": 32000, "activation": "swiglu"},
            "cluster": {"gpu": "h100", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "fp8", "fp8_recipe": "tensorwise",
                         "engine": "megatron"},
            "layout": {"dp": 8, "zero_stage": 1, "micro_batch_size": 1, "recompute": "full"}}
    loaded = load_case(case)
    job = loaded.job()
    offloaded = job.with_layout(job.layout.with_changes(offload_optimizer=1.0))
    usable = planner.estimate(case).usable_bytes
    assert planner.estimate(case).fits
    assert max(m.total for m in stage_memories(offloaded, activations=False)) > usable
    assert not _states_cannot_fit(loaded, loaded.search, Layout(dp=8, zero_stage=1, micro_batch_size=1))


def test_weights_kept_quantized_are_the_linears_only():
    """Megatron's --fp8-param-gather keeps Transformer Engine's linears' weights in fp8; the embedding,
    the LM head and the norms are no TE linears and stay in bf16. Every parameter was counted at 1
    byte: Llama 3 8B on 8 B200s at ZeRO 1 held 8.03 GB of weights, 1.05 GB short. Its linears:
    32 layers × (4096 × (4096 + 2 × 1024 + 4096) + 3 × 4096 × 14336) = 6,979,321,856 at 1 byte; the
    rest of its 8,030,261,248 (two 128,256 × 4096 embeddings and 65 norms) at 2."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "b200", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "fp8", "engine": "megatron"},
            "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": 1}}
    estimate = planner.estimate(case).to_dict()
    assert estimate["training"]["fp8_param_gather"] is True
    linears, total = 6_979_321_856, 8_030_261_248
    assert estimate["model"]["parameters"] == total
    assert estimate["memory"]["by_term"]["parameters"] == linears * 1 + (total - linears) * 2
