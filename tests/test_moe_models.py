"""Mixture-of-experts and MLA models: parameter counts, FLOPs and the case-file and config readers.

Every preset's total and active parameter count is held to the figure its publisher gives.
Published figures are rounded: each is met to half a unit of its last digit, with 0.5 % more
for what the presets leave out (GPT-OSS's biases and attention sinks, Qwen3's query/key
norms, routers' expert-bias terms). Publishers differ on one thing, said where it matters:
DeepSeek and OpenAI leave the input embedding (a lookup, no arithmetic) out of the active
count, Mistral, Qwen and Meta count it.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cost_models.flops import model_flops_per_token
from cost_models.parameters import active_parameters, embedding_parameters, mtp_parameters, total_parameters
from cost_models.specs import ModelSpec, SpecError
import planner
from planner import CaseError, estimate
from planner.case import load_case
from planner.hf_config import read_hf_config
from planner.presets import model_presets

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
B = 1e9

# preset: (total, active, whether the publisher's active count includes the input embedding, source)
PUBLISHED = {
    "mixtral-8x7b": (46.7, 12.9, True, "Mistral AI, 'Mixtral of experts' (2023-12-11)"),
    "mixtral-8x22b": (141, 39, True, "Mistral AI, 'Cheaper, Better, Faster, Stronger' (2024-04-17)"),
    "deepseek-v3": (671, 37, False, "DeepSeek-V3 technical report, arXiv:2412.19437, abstract and §4.2"),
    "deepseek-v2-lite": (15.7, 2.4, False, "DeepSeek-V2 report, arXiv:2405.04434, Appendix B"),
    "qwen3-30b-a3b": (30.5, 3.3, True, "Qwen/Qwen3-30B-A3B model card"),
    "qwen3-235b-a22b": (235, 22, True, "Qwen/Qwen3-235B-A22B model card"),
    "llama4-scout": (109, 17, True, "Meta, Llama 4 model card (Scout: 17B active, 109B total)"),
    "llama4-maverick": (400, 17, True, "Meta, Llama 4 model card (Maverick: 17B active, 400B total)"),
    "gpt-oss-20b": (20.91, 3.61, False, "OpenAI, gpt-oss-120b & gpt-oss-20b model card, Table 1"),
    "gpt-oss-120b": (116.83, 5.13, False, "OpenAI, gpt-oss-120b & gpt-oss-20b model card, Table 1"),
}
FIXTURE_OF = {"mixtral-8x7b": "Mixtral-8x7B-v0.1", "mixtral-8x22b": "Mixtral-8x22B-v0.1",
              "deepseek-v3": "DeepSeek-V3", "deepseek-v2-lite": "DeepSeek-V2-Lite",
              "qwen3-30b-a3b": "Qwen3-30B-A3B", "qwen3-235b-a22b": "Qwen3-235B-A22B",
              "llama4-scout": "Llama-4-Scout-17B-16E", "llama4-maverick": "Llama-4-Maverick-17B-128E",
              "gpt-oss-20b": "gpt-oss-20b", "gpt-oss-120b": "gpt-oss-120b"}


def preset(name: str) -> ModelSpec:
    return load_case({"model": {"preset": name}, "cluster": {"gpu": "h100", "num_gpus": 8},
                      "training": {"global_batch_size": 8, "seq_len": 4096}}).model


def tolerance(figure: float) -> float:
    """Half a unit of the figure's last published digit, plus 0.5 % of it."""
    text = f"{figure:g}"
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10 ** -decimals + 0.005 * figure


def vision_encoder_parameters(path: Path) -> float:
    """Llama 4's vision encoder, which Meta's totals include and the text preset leaves out: its
    transformer layers (4·d² attention + 2·d·f MLP each), from the fixture's vision_config."""
    vision = json.loads(path.read_text())["vision_config"]
    d, f, n = vision["hidden_size"], vision["intermediate_size"], vision["num_hidden_layers"]
    return n * (4 * d * d + 2 * d * f)


def main_model(name: str) -> ModelSpec:
    """The preset without its multi-token prediction modules: DeepSeek's 671B and 37B count the
    main model only, and the MTP module apart (:func:`test_deepseek_v3_mtp_module_is_the_model_cards_14b`)."""
    return replace(preset(name), mtp_layers=0)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_parameters_match_the_published_figure(name):
    total, _, _, source = PUBLISHED[name]
    counted = total_parameters(main_model(name))
    if name.startswith("llama4"):
        counted += vision_encoder_parameters(FIXTURES / FIXTURE_OF[name] / "config.json")
    assert abs(counted / B - total) <= tolerance(total), source


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_active_parameters_match_the_published_figure(name):
    _, active, with_input_embedding, source = PUBLISHED[name]
    model = main_model(name)
    counted = active_parameters(model) + (embedding_parameters(model) if with_input_embedding else 0)
    assert abs(counted / B - active) <= tolerance(active), source


def test_a_dense_model_activates_every_parameter_but_its_input_embedding():
    """Llama 3 8B by hand: 32 layers of attention 2·4096² + 2·4096·1024 (GQA, 8 KV heads), SwiGLU
    3·4096·14336 and two norms (218,112,000 each), untied 128,256-token embedding and head, final
    norm: 8,030,261,248, the count of Meta's checkpoint; all active but the 525,336,576 of the
    input embedding, a lookup. Tied to the head, the embedding multiplies every token: active."""
    model = preset("llama3-8b")
    assert total_parameters(model) == 8_030_261_248
    assert active_parameters(model) == 8_030_261_248 - 128_256 * 4096
    tied = replace(model, tied_embeddings=True)
    assert active_parameters(tied) == total_parameters(tied) == 8_030_261_248 - 128_256 * 4096


def test_deepseek_v3_counts_term_by_term():
    """DeepSeek-V3's 671B: 58 MoE layers of 256 experts (3·7168·2048 each) carry 653.9B; the
    rest is MLA attention (61 × 187.1M), 3 dense MLPs, shared experts, routers and embeddings."""
    model = main_model("deepseek-v3")
    assert model.num_moe_layers == 58
    experts = 58 * 256 * 3 * 7168 * 2048
    attention = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168 + 1536 + 512
    rest = 61 * attention + 3 * 3 * 7168 * 18432 + 58 * (3 * 7168 * 2048 + 7168 * 256) + 2 * 129280 * 7168
    norms = (2 * 61 + 1) * 7168
    assert total_parameters(model) == experts + rest + norms


def test_deepseek_v3_mtp_module_is_the_model_cards_14b():
    """The model card: "685B ... includes 671B of the Main Model weights and 14B of the
    Multi-Token Prediction (MTP) Module weights". The module is one MoE layer (its attention,
    256 experts, the shared expert and the router), the 2h → h projection and three norms,
    and in the checkpoint its own copies of the embedding and the LM head, which training
    shares with the main model (so the preset's total counts them once)."""
    model = preset("deepseek-v3")
    h, v = 7168, 129280
    attention = h * 1536 + 1536 * 128 * 192 + h * 576 + 512 * 128 * 256 + 128 * 128 * h + 1536 + 512
    layer = attention + 256 * 3 * h * 2048 + 3 * h * 2048 + h * 256 + 2 * h
    module = layer + 2 * h * h + 3 * h
    assert model.mtp_layers == 1
    assert mtp_parameters(model) == module
    assert total_parameters(model) == total_parameters(main_model("deepseek-v3")) + module
    checkpoint_copies = 2 * v * h
    assert abs((total_parameters(model) + checkpoint_copies) / B - 685) <= tolerance(685)
    # Each token meets one module's 8 of its 256 experts, as in every main-model MoE layer.
    assert active_parameters(model) - active_parameters(main_model("deepseek-v3")) == module - 248 * 3 * h * 2048


def test_maverick_interleaves_dense_and_moe_layers():
    model = preset("llama4-maverick")
    assert model.num_moe_layers == 24
    assert [model.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    deepseek = preset("deepseek-v3")
    assert [deepseek.is_moe_layer(i) for i in (0, 2, 3, 60)] == [False, False, True, True]


@pytest.mark.parametrize("name", sorted(FIXTURE_OF))
def test_hugging_face_config_reads_as_the_preset(name):
    fields = read_hf_config(FIXTURES / FIXTURE_OF[name] / "config.json")
    fields.pop("name")
    model = ModelSpec(name=name, **fields)
    assert model == replace(preset(name), name=name)


def test_flops_per_token_match_megatron_bridge_and_nemo():
    """Model FLOPs per token against what the published columns imply (model TFLOP/s per GPU
    over tokens/s per GPU, both as printed: three or four digits each, so to 1 %):

    - Qwen3-30B-A3B at 4096 tokens: 241 TFLOP/s at 10,494 tokens/s (Megatron-Bridge 25.09,
      H100), 22.97 GFLOP per token, causal attention counted at half;
    - Mixtral 8x7B at 4096: 1,598 at 19,275 (NeMo 25.04, GB200), 82.9 GFLOP, which NeMo counts
      with the full s² attention: ours plus the causal half it leaves out;
    - DeepSeek-V3 at 4096: 216 at 865 (NeMo AutoModel, H100), 249.7 GFLOP (no MTP module);
      with its MTP module, as Megatron-Bridge trains and counts it (``num_floating_point_operations``):
      1,635 at 6,288 (Megatron-Bridge 26.08, GB300), 260.0 GFLOP.
    """
    qwen = model_flops_per_token(preset("qwen3-30b-a3b"), 4096)
    assert abs(qwen / (241e12 / 10494) - 1) < 0.01
    mixtral = preset("mixtral-8x7b")
    causal_half = 3 * mixtral.num_layers * 2 * 4096 * mixtral.hidden_size  # 3 × L × (4·s·h)/2 per token
    assert abs((model_flops_per_token(mixtral, 4096) + causal_half) / (1598e12 / 19275) - 1) < 0.01
    deepseek = model_flops_per_token(main_model("deepseek-v3"), 4096)
    assert abs(deepseek / (216e12 / 865) - 1) < 0.01
    with_mtp = model_flops_per_token(preset("deepseek-v3"), 4096)
    assert abs(with_mtp / (1635e12 / 6288) - 1) < 0.01


def test_estimate_reports_parameters_and_active_parameters():
    case = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100", "num_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "bf16", "engine": "megatron"},
            "layout": {"tp": 1, "pp": 1, "ep": 8, "micro_batch_size": 1, "zero_stage": 1}}
    out = estimate(case).to_dict()
    # Mixtral by hand: 32 layers of attention 41,943,040, router 4096·8, two norms and 8 experts of
    # 3·4096·14336 (2 of them active), untied 32,000-token embedding and head, final norm.
    # Active: the 12.9B Mistral counts, less the input embedding's 32,000·4096.
    assert out["model"] == {"parameters": 46_702_792_704, "active_parameters": 12_879_925_248 - 32_000 * 4096}
    dense = {**case, "model": {"preset": "llama3-8b"}, "layout": {"tp": 1, "pp": 1, "micro_batch_size": 1}}
    out = estimate(dense).to_dict()
    assert out["model"] == {"parameters": 8_030_261_248, "active_parameters": 8_030_261_248 - 128_256 * 4096}


@pytest.mark.parametrize("fields,key", [
    ({"num_experts": 8}, "moe_top_k"),
    ({"num_experts": 8, "moe_top_k": 9}, "moe_top_k"),
    ({"moe_top_k": 2}, "moe_top_k"),
    ({"num_experts": 8, "moe_top_k": 2, "moe_first_dense_layers": 32}, "moe_first_dense_layers"),
    ({"num_experts": 8, "moe_top_k": 2, "moe_router": "sinkhorn"}, "moe_router"),
    ({"num_experts": 8, "moe_top_k": 2, "moe_load_imbalance": 0.5}, "moe_load_imbalance"),
    ({"attention_type": "mla"}, "kv_lora_rank"),
    ({"kv_lora_rank": 512}, "kv_lora_rank"),
    ({"attention_type": "mha", "num_kv_heads": 8}, "attention_type"),
    ({"attention_type": "mla", "kv_lora_rank": 512, "qk_head_dim": 128, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "num_kv_heads": 8}, "num_kv_heads"),
])
def test_bad_moe_and_mla_fields_name_the_key(fields, key):
    base = {"name": "m", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000}
    with pytest.raises(SpecError) as info:
        ModelSpec(**base, **fields)
    assert (info.value.spec, info.value.field) == ("ModelSpec", key)


@pytest.mark.parametrize("layout,key", [
    ({"ep": 3}, "layout.ep"),  # 8 experts
    ({"ep": 16}, "layout.ep"),  # more than the 8 the grid holds
    ({"ep": 2, "etp": 3}, "layout.etp"),
])
def test_expert_layouts_the_model_cannot_take_are_case_errors(layout, key):
    case = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096},
            "layout": {"tp": 1, "pp": 1, "micro_batch_size": 1, **layout}}
    with pytest.raises(CaseError) as info:
        estimate(case)
    assert info.value.key == key


@pytest.mark.parametrize("pins,key,needle", [
    ({"ep": 3}, "search.ep", "must divide num_experts 8, got 3"),
    ({"ep": 16}, "search.ep", "must divide num_experts 8, got 16"),
    ({"ep": 2, "etp": 3}, "search.etp", "must divide moe_ffn_hidden_size 14336, got 3"),
    ({"ep": 8, "etp": 2}, "search.ep", "etp·ep = 2·8 must divide the cluster's 8 GPUs"),
])
def test_expert_pins_the_model_cannot_take_name_the_pin(pins, key, needle):
    """As layout.ep is refused (cost_models.job), not "search: no layout ... meets the search
    section's ep", which names neither the pin's key nor what it must be."""
    case = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096}, "search": pins}
    with pytest.raises(CaseError) as info:
        planner.plan(case)
    assert info.value.key == key and needle in str(info.value)


def test_expert_parallelism_needs_experts():
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096}, "layout": {"ep": 2}}
    with pytest.raises(CaseError) as info:
        estimate(case)
    assert info.value.key == "layout.ep"


def test_every_moe_preset_loads():
    for name in PUBLISHED:
        assert name in model_presets()
        assert preset(name).is_moe


def test_junk_in_any_key_of_a_moe_config_is_a_case_error(tmp_path):
    """Garbage in any key of the MoE and MLA configs (Llama 4's text_config included) gives
    either a model the spec accepts or a CaseError naming the file, never another exception."""
    junk = [None, True, 0, -1, 1.5, "x", [], {}, [1], {"a": 1}]
    path = tmp_path / "config.json"
    for folder in FIXTURE_OF.values():
        base = json.loads((FIXTURES / folder / "config.json").read_text())
        nested = "text_config" in base
        keys = list(base["text_config"] if nested else base)
        for key in keys:
            for value in junk:
                cfg = json.loads(json.dumps(base))
                (cfg["text_config"] if nested else cfg)[key] = value
                path.write_text(json.dumps(cfg))
                try:
                    fields = read_hf_config(path)
                except CaseError as error:
                    assert error.source == str(path)
                    continue
                try:
                    ModelSpec(**fields)
                except SpecError:
                    pass  # the case reader turns it into a CaseError naming the model key


@pytest.mark.parametrize("engine, dispatch, expected", [
    ("any", "sideways", "expected one of all_to_all, deepep, got 'sideways'"),
    ("deepspeed", "deepep", "DeepSpeed-MoE dispatches with one all-to-all"),
    ("torchtitan", "deepep", "keeps the model registry's all-to-all token dispatcher"),
])
def test_an_expert_dispatch_the_engine_does_not_run_is_a_case_error(engine, dispatch, expected):
    case = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 256, "seq_len": 4096, "engine": engine, "expert_dispatch": dispatch},
            "layout": {"tp": 1, "dp": 16, "ep": 8, "micro_batch_size": 1,
                       "zero_stage": {"any": 0, "deepspeed": 1, "torchtitan": 3}[engine], "recompute": "full"}}
    with pytest.raises(CaseError) as error:
        estimate(case)
    assert error.value.key == "training.expert_dispatch" and expected in str(error.value)
    case["training"]["expert_dispatch"] = "all_to_all"
    assert estimate(case).step_time_s > 0


def test_a_padded_capacity_dispatches_by_the_plain_all_to_all():
    """DeepEP pads no expert to a capacity (megatron-core's flex dispatcher refuses
    moe_pad_expert_input_to_capacity): a capacity factor's dispatch across nodes is the plain
    all-to-all, every copy crossing, as Megatron-Bridge's token-drop runs dispatch; asked for
    DeepEP, the case is refused."""
    from cost_models.experts import dispatch_combine_time

    def case(**model):
        return {"model": {"preset": "qwen3-30b-a3b", **model}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
                "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"},
                "layout": {"tp": 1, "dp": 32, "ep": 32, "micro_batch_size": 1, "zero_stage": 1}}

    def pair(data):
        job = estimate(data).job
        return dispatch_combine_time(job.model, job.training, job.cluster, 1, 1, 1, 32, 1)

    dropless, padded = case(), case(moe_capacity_factor=1.0)
    plain = {**dropless, "training": {**dropless["training"], "expert_dispatch": "all_to_all"}}
    # Capacity 1.0 under balanced routing moves the same copies: exactly the plain all-to-all's time.
    assert pair(padded) == pytest.approx(pair(plain)) and pair(padded) > pair(dropless)
    asked = {**padded, "training": {**padded["training"], "expert_dispatch": "deepep"}}
    with pytest.raises(CaseError) as error:
        estimate(asked)
    assert error.value.key == "training.expert_dispatch" and "pads no expert to a capacity" in str(error.value)


def test_on_amd_gpus_megatron_dispatches_by_its_all_to_all_and_writes_it(tmp_path):
    """DeepEP needs NVSHMEM and NVIDIA GPUs (no ROCm port: ROCm/aiter#421). gpt-oss-120b on 64
    MI355X was priced with DeepEP's dispatch across nodes and its files asked for
    --moe-flex-dispatcher-backend deepep, which no ROCm launch runs."""
    from cost_models.experts import dispatch_combine_time
    from planner import emit, plan

    def case(gpu, **training):
        return {"model": {"preset": "gpt-oss-120b"}, "cluster": {"gpu": gpu, "num_gpus": 64},
                "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron", **training},
                "layout": {"tp": 1, "dp": 64, "ep": 16, "micro_batch_size": 1, "zero_stage": 1}}

    def pair(data):
        job = estimate(data).job
        return dispatch_combine_time(job.model, job.training, job.cluster, 1, 1, 1, 16, 1)

    # ep 16 over two nodes: the same dispatch as the plain all-to-all's on AMD, DeepEP's on NVIDIA
    assert pair(case("mi355x")) == pytest.approx(pair(case("mi355x", expert_dispatch="all_to_all")))
    assert pair(case("b200")) < pair(case("b200", expert_dispatch="all_to_all"))
    with pytest.raises(CaseError) as error:
        estimate(case("mi355x", expert_dispatch="deepep"))
    assert error.value.key == "training.expert_dispatch" and "NVIDIA GPUs only" in str(error.value)
    planned = {k: v for k, v in case("mi355x").items() if k != "layout"}
    written = emit(plan(planned, top_k=0), "megatron", tmp_path / "out")
    arguments = (tmp_path / "out" / "megatron_args.txt").read_text()
    assert "deepep" not in arguments and "--moe-token-dispatcher-type alltoall" in arguments, written
    # Arguments that ask for DeepEP on these GPUs are refused naming the flag, not the case's key.
    from planner.diagnose import diagnose

    flex = tmp_path / "flex_args.txt"
    flex.write_text(arguments.replace("--moe-token-dispatcher-type alltoall",
                                      "--moe-token-dispatcher-type flex\n--moe-flex-dispatcher-backend deepep"))
    with pytest.raises(CaseError) as error:
        diagnose(planned, megatron_args=flex)
    assert error.value.key == "--moe-flex-dispatcher-backend" and "NVIDIA GPUs only" in str(error.value)


def test_an_overlap_no_layout_can_take_is_refused_before_the_search():
    """--overlap-moe-expert-parallel-comm takes one multi-token prediction layer at most: every
    layout broke it, and `plan` searched for 35 s and answered that memory overflowed (88.8 GB for
    a 16B model on 64 H100s), sending the user to more GPUs."""
    case = {"model": {"preset": "deepseek-v2-lite", "mtp_layers": 2}, "cluster": {"gpu": "h100", "num_gpus": 64},
            "training": {"global_batch_size": 512, "seq_len": 4096, "engine": "megatron", "moe_comm_overlap": True}}
    started = time.perf_counter()
    with pytest.raises(CaseError) as refused:
        planner.plan(case)
    assert refused.value.key == "model.mtp_layers" and "one multi-token prediction layer" in refused.value.expected
    assert time.perf_counter() - started < 5


def test_the_closest_miss_is_a_layout_the_engine_runs():
    """Pinned to ep 1, the overlap (which needs ep > 1) leaves no layout: the advice named the
    closest miss of full recomputation, which the overlap refuses too (117.5 GB of parameters)."""
    case = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "h100", "num_gpus": 64},
            "training": {"global_batch_size": 512, "seq_len": 4096, "engine": "megatron", "moe_comm_overlap": True},
            "search": {"ep": 1}}
    with pytest.raises(CaseError) as refused:
        planner.plan(case)
    assert refused.value.key == "search" and "meets the search section's ep" in refused.value.expected


def test_a_pinned_expert_tensor_parallel_degree_the_engine_runs_is_searched():
    """Megatron-LM takes any --expert-tensor-parallel-size; the search tries 1 and tp by itself, and a
    search section pinning etp 2 at tp 4 said no layout met it, though estimate priced it as fitting."""
    case = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"},
            "search": {"tp": 4, "etp": 2, "ep": 4, "pp": 2}}
    best = planner.plan(case, top_k=0).best
    assert (best.job.layout.tp, best.job.layout.expert_tp, best.job.layout.ep) == (4, 2, 4)


def _qwen3_overlap_case(global_batch: int, overlap: bool, layout: dict | None = None) -> dict:
    return {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": global_batch, "seq_len": 4096, "engine": "megatron",
                         "moe_comm_overlap": overlap},
            "layout": layout or {"dp": 16, "tp": 1, "pp": 1, "ep": 16, "micro_batch_size": 1, "zero_stage": 1}}


def test_one_micro_batch_overlaps_no_expert_dispatch():
    """megatron-core's combined 1F1B schedule without a pipeline runs the first micro-batch's forward
    and the last one's backward alone (combined_1f1b.py: "executed alone, no a2a overlapping"): with
    one micro-batch per step nothing overlaps. The overlap was credited 60 % hidden there (Qwen3-30B-A3B
    on 16 H100s at ep 16: 0.031 s of dispatch for 0.077 s) and `plan` picked that layout."""
    alone = estimate(_qwen3_overlap_case(16, False)).time.ep_comm_s
    assert estimate(_qwen3_overlap_case(16, True)).time.ep_comm_s == pytest.approx(alone, rel=1e-12)
    # Eight micro-batches: the first forward and the last backward, one micro-batch's worth, stay exposed.
    eight = estimate(_qwen3_overlap_case(128, True)).time.ep_comm_s
    assert estimate(_qwen3_overlap_case(128, False)).time.ep_comm_s / 8 < eight < estimate(
        _qwen3_overlap_case(128, False)).time.ep_comm_s


@pytest.mark.parametrize("pp, vpp, microbatches", [(2, 2, 2), (2, 2, 8), (4, 2, 4), (4, 3, 16), (8, 2, 8)])
def test_the_passes_run_alone_are_megatron_cores_warm_up(monkeypatch, pp, vpp, microbatches):
    """The share of a pipeline rank's chunk passes the overlap cannot pair is megatron-core's own
    warm-up count under --overlap-moe-expert-parallel-comm (schedules.get_pp_rank_microbatches), rank
    by rank."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import schedules
    from cost_models.stage_time import unpaired_pass_share

    layers = 48 // (pp * vpp) * pp * vpp
    case = {"model": {"preset": "qwen3-30b-a3b", "num_layers": layers},
            "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8 * pp},
            "training": {"global_batch_size": microbatches * 8, "seq_len": 4096, "engine": "megatron",
                         "moe_comm_overlap": True},
            "layout": {"dp": 8, "tp": 1, "pp": pp, "vpp": vpp, "ep": 8, "micro_batch_size": 1, "zero_stage": 1}}
    job = load_case(case).job()
    monkeypatch.setattr(parallel_state, "get_pipeline_model_parallel_world_size", lambda: pp)
    monkeypatch.setattr(parallel_state, "get_virtual_pipeline_model_parallel_world_size", lambda: vpp)
    for rank in range(pp):
        monkeypatch.setattr(parallel_state, "get_pipeline_model_parallel_rank", lambda: rank)
        total, _, warmup, _ = schedules.get_pp_rank_microbatches(microbatches, vpp, pp, forward_only=False,
                                                                 overlap_moe_expert_parallel_comm=True)
        assert unpaired_pass_share(job, rank) == warmup / total


def test_deepep_needs_an_expert_group_of_more_than_one_rank(tmp_path):
    """Megatron-LM's flex dispatcher asserts etp × ep > 1 (token_dispatcher.py: "Flex token dispatcher
    requires TPxEP > 1"); the files wrote it at tp 4, ep 1, etp 1, and every rank stopped building the
    model. Such a layout is refused; a plan of the case dispatches by DeepEP only across ranks."""
    case = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron", "expert_dispatch": "deepep"},
            "layout": {"dp": 16, "tp": 4, "pp": 1, "ep": 1, "etp": 1, "micro_batch_size": 1, "zero_stage": 1,
                       "sequence_parallel": True, "recompute": "full"}}
    with pytest.raises(CaseError) as refused:
        estimate(case)
    assert refused.value.key == "layout.ep" and "etp × ep above 1" in str(refused.value)
    del case["layout"]
    best = planner.plan(case, top_k=0).best.job.layout
    assert best.expert_tp * best.ep > 1


QWEN3_235B_ON_512 = {"model": {"preset": "qwen3-235b-a22b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 512},
                     "training": {"global_batch_size": 1024, "seq_len": 4096, "engine": "megatron"}}


@pytest.mark.parametrize("ep, etp, deepep", [(128, 2, False), (64, 2, True), (128, 1, True)])
def test_deepep_runs_only_the_expert_groups_it_has_a_config_for(ep, etp, deepep):
    """megatron-core's flex dispatcher builds DeepEP's Buffer over the etp × ep group (core_v0.16.1
    transformer/moe/fused_a2a.py, get_buffer: Buffer.get_dispatch_config(group.size())), and DeepEP has a
    config for 2, 4, 8, 16, 24, 32, 64, 128, 144 and 160 ranks only, asserting "Unsupported number of EP
    ranks" otherwise (deep_ep/buffer.py, get_dispatch_config and get_combine_config, at eb9cee7, the commit
    core_v0.16.1's docker/Dockerfile.ci.dev installs; csrc/deep_ep.cpp asserts at most 8 × 20 = 160 ranks
    in its normal kernels). Qwen3-235B at tp 2, etp 2, ep 128 across 32 nodes was priced and written as
    DeepEP over 256 ranks, which stops at the first MoE layer: it runs, and is priced as, the all-to-all,
    and a case that asks for DeepEP there is refused; 128 ranks still dispatch by DeepEP."""
    from planner.engines.megatron.emit import arguments

    layout = {"tp": 2, "pp": 2, "ep": ep, "etp": etp, "sequence_parallel": True, "micro_batch_size": 1,
              "zero_stage": 1, "recompute": "full"}
    left = estimate({**QWEN3_235B_ON_512, "layout": layout})
    assert left.to_dict()["nvlink_domains_spanned"]["ep"] > 1
    dispatcher = dict(arguments(left.job))["--moe-token-dispatcher-type"]
    assert dispatcher == ("flex" if deepep else "alltoall")
    told = {**QWEN3_235B_ON_512["training"], "expert_dispatch": "all_to_all"}
    all_to_all = estimate({**QWEN3_235B_ON_512, "training": told, "layout": layout})
    assert (left.step_time_s == all_to_all.step_time_s) == (not deepep)
    asked = {**QWEN3_235B_ON_512["training"], "expert_dispatch": "deepep"}
    if deepep:
        assert estimate({**QWEN3_235B_ON_512, "training": asked, "layout": layout}).step_time_s == left.step_time_s
    else:
        with pytest.raises(CaseError) as refused:
            estimate({**QWEN3_235B_ON_512, "training": asked, "layout": layout})
        assert refused.value.key == "layout.ep" and f"{etp * ep} ranks" in str(refused.value)


def test_a_plan_says_when_it_priced_balanced_routing_the_case_did_not_state():
    """The default moe_load_imbalance 1 is forced balancing, which the emitted files leave off (it
    changes what is trained): the plan said nothing, and a trained router's busiest rank is slower."""
    case = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"}}
    assert any("model.moe_load_imbalance is unstated" in note for note in planner.plan(case, top_k=0).notes)
    case["model"]["moe_load_imbalance"] = 1.2
    assert not any("moe_load_imbalance" in note for note in planner.plan(case, top_k=0).notes)


def test_a_router_padded_to_a_capacity_is_not_asked_for_its_imbalance():
    """With a capacity factor every expert is padded to that multiple of the mean (megatron-core's
    moe_pad_expert_input_to_capacity, tokens past it dropped), so the busiest rank's share is the factor
    whatever the router's imbalance (ModelSpec.routed_factor): the note asking for the imbalance was untrue."""
    case = {"model": {"preset": "mixtral-8x7b", "moe_capacity_factor": 1.25},
            "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"}}
    assert not any("moe_load_imbalance" in note for note in planner.plan(case, top_k=0).notes)


QWEN3_EP8 = {"model": {"preset": "qwen3-30b-a3b", "num_layers": 4, "moe_load_imbalance": 1},
             "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
             "training": {"global_batch_size": 8, "seq_len": 4096, "precision": "bf16"},
             "layout": {"dp": 8, "ep": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"}}


@pytest.mark.parametrize("engine, routed_outputs, router_input", [
    ("megatron", 0, 2),  # scores applied inside the activation; RouterGatingLinearFunction keeps its bf16 input
    ("torchtitan", 2, 2),  # token_dispatcher: routed_output * top_scores keeps the experts' outputs
    ("deepspeed", 2, 4),  # sharded_moe._sparse_decode: routed * gates; TopKGate keeps input.float()
])
def test_an_moe_layer_keeps_what_its_engine_applies_the_scores_to(engine, routed_outputs, router_input):
    """Qwen3-30B-A3B's MoE layer on one rank of 8 (ep 8, balanced): T = 4,096 tokens, h = 2,048, k = 8
    of E = 128 experts of width 768, R = T·k copies. Megatron applies the router's scores inside the
    experts' activation and keeps no expert output; torchtitan's combine and DeepSpeed-MoE's decode multiply
    the experts' outputs by them, so autograd keeps those (R·h in bf16: 134 MB a layer, unpriced), and
    DeepSpeed's gate keeps an fp32 copy of its input where Megatron's router keeps the bf16 one."""
    from cost_models.activations import layer_activations

    case = {**QWEN3_EP8, "training": {**QWEN3_EP8["training"], "engine": engine}}
    if engine == "torchtitan":
        case["layout"] = {**case["layout"], "zero_stage": 3}
    job = planner.estimate(case).job
    saved = layer_activations(job.model, job.training, job.layout, moe=True)
    T, h, E, k, f = 4096, 2048, 128, 8, 768
    R = T * k
    router = 2 * 4 * T * E  # the router's fp32 logits and scores
    experts = R * (2 * h + (2 * 2 + 2) * f)  # each copy's input, the fused SwiGLU's 2f input and the f one
    assert saved.mlp_hidden == router + experts + routed_outputs * R * h
    assert saved.mlp_input == router_input * T * h


def test_torchtitans_selective_checkpointing_keeps_the_all_to_alls_outputs_not_the_grouped_gemms():
    """torchtitan's op-level policy saves _c10d_functional.all_to_all_single's outputs and recomputes the
    grouped GEMMs (aten._grouped_mm is in neither its save list nor its every-other-matmul rule,
    distributed/activation_checkpoint.py): an MoE layer's expert part keeps the dispatched tokens and the
    experts' outputs coming back, 2·R·h in bf16 at ep 8, and nothing of them with the experts local (ep 1).
    Its grouped GEMMs' tensors were counted as kept: 308 MB a DeepSeek-V2-Lite layer where 201 MB are."""
    from cost_models.experts import exchanged_token_bytes
    from torchtitan.distributed.activation_checkpoint import _get_default_save_ops

    saved = {str(op) for op in _get_default_save_ops()}
    assert "_c10d_functional.all_to_all_single.default" in saved and not any("grouped_mm" in op for op in saved)
    case = {"model": {"preset": "deepseek-v2-lite", "num_layers": 4, "mtp_layers": 0, "moe_first_dense_layers": 0,
                      "moe_load_imbalance": 1},
            "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 8, "seq_len": 4096, "precision": "bf16", "engine": "torchtitan"},
            "layout": {"dp": 8, "ep": 8, "micro_batch_size": 1, "zero_stage": 3, "recompute": "selective"}}
    T, h, k, shared = 4096, 2048, 6, 2816
    job = planner.estimate(case).job
    exchanged = 2 * 2 * T * k * h
    assert exchanged == 201_326_592
    # the shared experts' matmuls take their turns: the first's output and the last's are kept
    assert exchanged_token_bytes(job.model, job.training, job.layout) == exchanged + 2 * T * (shared + h)
    local = planner.estimate({**case, "layout": {**case["layout"], "ep": 1}}).job
    assert exchanged_token_bytes(local.model, local.training, local.layout) == 2 * T * (shared + h)


def test_deepep_on_an_nvl72_rack_reaches_only_its_8_nvlink_peers_over_nvlink():
    """DeepEP joins at most 8 consecutive ranks of its group over NVLink (NUM_MAX_NVL_PEERS; csrc/deep_ep.cpp,
    num_rdma_ranks = max(1, num_ranks / NUM_MAX_NVL_PEERS), at eb9cee7) and the rest through NVSHMEM with
    multi-node NVLink disabled (deep_ep/buffer.py: NVSHMEM_DISABLE_MNNVL=1 unless allow_mnnvl, which
    megatron-core's get_buffer does not pass). An expert group of 16 inside one GB200 NVL72 rack was priced
    as staying on NVLink under DeepEP: it runs as DeepEP does between two 8-GPU nodes with the same NICs,
    while NCCL's all-to-all keeps all 16 on NVLink, as in one domain holding the whole cluster. Left to
    Megatron the plan dispatches by the cheaper, the all-to-all, and writes it; told deepep, it writes flex."""
    from cost_models.experts import dispatch_combine_time
    from planner.engines.megatron.emit import arguments

    def job(**training):
        return estimate({"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "gb200", "num_gpus": 144},
                         "training": {"global_batch_size": 288, "seq_len": 4096, "engine": "megatron", **training},
                         "layout": {"tp": 1, "dp": 144, "ep": 16, "micro_batch_size": 1, "zero_stage": 1}}).job

    def pair(j, nvlink_domain=None):
        cluster = j.cluster if nvlink_domain is None else \
            replace(j.cluster, gpu=replace(j.cluster.gpu, nvlink_domain=nvlink_domain))
        assert cluster.gpu.gpus_per_node == 4 and cluster.gpu.inter_node_bandwidth == j.cluster.gpu.inter_node_bandwidth
        return dispatch_combine_time(j.model, j.training, cluster, 1, 1, 1, 16, 1)

    deepep, all_to_all, left = job(expert_dispatch="deepep"), job(expert_dispatch="all_to_all"), job()
    assert pair(deepep) == pytest.approx(pair(deepep, nvlink_domain=8), rel=1e-12)
    assert pair(all_to_all) == pytest.approx(pair(all_to_all, nvlink_domain=144), rel=1e-12)
    assert pair(all_to_all) < pair(all_to_all, nvlink_domain=8)  # the all-to-all does use the rack's NVLink
    assert pair(deepep) > pair(all_to_all)
    assert pair(left) == pytest.approx(pair(all_to_all), rel=1e-12)
    assert dict(arguments(left))["--moe-token-dispatcher-type"] == "alltoall"
    assert dict(arguments(deepep))["--moe-token-dispatcher-type"] == "flex"
