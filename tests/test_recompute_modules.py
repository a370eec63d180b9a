"""Selective recomputation by module (``layout.recompute_modules``, megatron-core's
``--recompute-modules``): what each module frees and what it runs again, term by term, and the
modules the case gets where it names none."""

from __future__ import annotations

import pytest

from cost_models.activations import layer_activation_bytes, layer_activations, selective_modules
from cost_models.experts import dispatch_combine_time, moe_mlp_time
from cost_models.flops import mlp_gemms
from cost_models.kernels import NORM_OR_ACTIVATION_INPUTS, linear_time, transcendental_time
from cost_models.memory import per_microbatch, stage_activation_bytes
from cost_models.layer_time import activation_function_bytes, layer_time_for
from cost_models.stage_time import stage_time
from cost_models.tp_time import tp_exposed_per_layer
from cost_models.specs import Layout
from planner import CaseError, estimate
from planner.case import load_case
from planner.estimate import remedies
from planner.report import describe_layout

# DeepSeek-V2-Lite: MLA, one dense layer then 26 MoE layers with two shared experts.
LITE = {"tp": 2, "pp": 1, "ep": 8, "etp": 1, "micro_batch_size": 2, "zero_stage": 1, "sequence_parallel": True}
LLAMA = {"tp": 2, "pp": 1, "micro_batch_size": 1, "zero_stage": 1, "sequence_parallel": True}


def job(layout: dict, model: str = "deepseek-v2-lite", engine: str = "megatron", **training):
    case = {"model": {"preset": model}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": engine, **training},
            "layout": layout}
    return load_case(case).job()


def modules(*names: str) -> dict:
    return {"recompute": "selective", "recompute_modules": list(names)}


# --- what the case gets where it names no module ---

@pytest.mark.parametrize("model, training, expected", [
    ("deepseek-v2-lite", {}, ("mla_up_proj", "moe_act")),
    # Without flash attention the core keeps s×s tensors, which recomputing it frees (Korthikanti §5).
    ("deepseek-v2-lite", {"flash_attention": False}, ("core_attn", "mla_up_proj", "moe_act")),
    # megatron-core refuses moe_act under fp8's delayed scaling.
    ("deepseek-v2-lite", {"precision": "fp8", "fp8_recipe": "delayed"}, ("mla_up_proj",)),
    # Fused attention frees nothing when recomputed: a dense GQA model has nothing to recompute.
    ("llama3-8b", {}, ()),
])
def test_the_modules_that_free_memory_are_the_default(model, training, expected):
    j = job({**(LITE if model != "llama3-8b" else LLAMA), "recompute": "selective"}, model, **training)
    assert selective_modules(j.model, j.training, j.layout) == expected


def test_with_nothing_to_recompute_selective_costs_and_saves_nothing():
    none, selective = (estimate({"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
                                 "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron"},
                                 "layout": {**LLAMA, "recompute": r}}) for r in ("none", "selective"))
    assert selective.time.total == none.time.total and selective.peak.total == none.peak.total


# --- what each module frees (per layer and micro-batch) ---

def kept(j, moe: bool) -> float:
    return layer_activation_bytes(j.model, j.training, j.layout, selective="attention", moe=moe)


def test_each_module_frees_the_tensors_it_rebuilds():
    base = job(LITE)
    dense, moe = layer_activations(base.model, base.training, base.layout), \
        layer_activations(base.model, base.training, base.layout, moe=True)
    m, lay = base.model, base.layout
    tokens = 4096 * lay.micro_batch_size
    norm_output = 2 * tokens * m.hidden_size / lay.tp  # bf16, sequence-parallel

    # Flash attention: the core keeps no s×s tensor, so recomputing it frees nothing.
    assert kept(job({**LITE, **modules("core_attn")}), False) == dense.total
    j = job({**LITE, **modules("mla_up_proj")})
    assert kept(j, False) == dense.total - dense.qkv and kept(j, True) == moe.total - moe.qkv
    # MLA's input norm stands apart (it feeds the two down-projections); an MoE layer's pre-MLP
    # norm too (it feeds the router and the dispatch).
    j = job({**LITE, **modules("layernorm")})
    assert kept(j, False) == pytest.approx(dense.total - norm_output)
    assert kept(j, True) == pytest.approx(moe.total - norm_output - moe.mlp_input)
    # The dense MLP: megatron-core skips it in MoE layers.
    j = job({**LITE, **modules("mlp")})
    assert kept(j, False) == pytest.approx(dense.total - dense.mlp_input - dense.mlp_hidden)
    assert kept(j, True) == moe.total
    # The whole expert part: its input (the pre-MLP norm's output) is what the checkpoint keeps.
    j = job({**LITE, **modules("moe")})
    assert kept(j, True) == pytest.approx(moe.total - moe.mlp_input - moe.mlp_hidden + norm_output)
    # With the norms recomputed the checkpoint's input is discarded too, as is MLA's input norm output.
    assert kept(job({**LITE, **modules("moe", "layernorm")}), True) == \
        pytest.approx(moe.total - moe.mlp_input - moe.mlp_hidden - norm_output)
    # The experts' activation output: R·f_e/etp at 2 bytes, R = b·s/tp·k·etp copies.
    routed = tokens / lay.tp * m.moe_top_k * lay.expert_tp * m.routed_factor
    j = job({**LITE, **modules("moe_act")})
    assert kept(j, True) == pytest.approx(moe.total - 2 * routed * m.moe_ffn_hidden_size / lay.expert_tp)
    # The shared experts' hidden tensors: fused SwiGLU keeps its 2f input and the f input of the
    # down projection, 6 bytes a width element, on the group's tokens at f_s/tp.
    j = job({**LITE, **modules("shared_experts")})
    assert kept(j, True) == pytest.approx(moe.total - 6 * tokens / lay.tp * m.moe_shared_expert_ffn_hidden_size)


def test_a_recomputed_layer_holds_its_modules_again_in_its_backward():
    """The stage's peak holds every in-flight layer's kept tensors and, while one layer runs its
    backward, what its recomputed modules rebuilt (the most of a dense and an MoE layer). On the
    last stage that layer's backward comes after the head's, which has freed the logits and the
    loss's gradients: the peak holds the larger of the two, not both."""
    none, up = job(LITE), job({**LITE, **modules("mla_up_proj")})
    dense, moe = (layer_activations(none.model, none.training, none.layout, moe=k) for k in (False, True))
    rebuilt = max(dense.qkv, moe.qkv)
    shared = per_microbatch(none)
    ends = shared.head + shared.loss_gradients
    layers = none.model.num_layers
    assert none.layout.pp == 1
    assert stage_activation_bytes(none, 0) - stage_activation_bytes(up, 0) == \
        pytest.approx((layers - 1) * moe.qkv + dense.qkv + ends - max(rebuilt, ends))


# --- what each module runs again (per stage, one micro-batch) ---

def added(j, field: str) -> float:
    """What the job's recomputation adds to one micro-batch's ``field`` over none."""
    none = Layout(**{**j.layout.__dict__, "recompute": "none", "recompute_modules": None})
    plain = type(j)(j.model, j.cluster, j.training, none, j.overheads)
    return getattr(stage_time(j, 0), field) - getattr(stage_time(plain, 0), field)


def test_the_attention_core_runs_its_forward_again():
    j = job({**LLAMA, **modules("core_attn")}, "llama3-8b")
    lay = j.layout
    core = layer_time_for(j.model, j.training, j.cluster.gpu, lay.tp, lay.cp, lay.micro_batch_size,
                          lay.sequence_parallel).core
    assert added(j, "recompute") == pytest.approx(j.model.num_layers * core)


def test_a_dense_mlp_runs_its_linears_activation_and_second_collective_again():
    j = job({**LLAMA, **modules("mlp")}, "llama3-8b")
    m, lay, gpu = j.model, j.layout, j.cluster.gpu
    tokens = 4096 * lay.micro_batch_size
    forward = sum(linear_time(g, gpu, j.training, True, 1.0, g.name in NORM_OR_ACTIVATION_INPUTS)[0]
                  for g in mlp_gemms(m, tokens, m.ffn_hidden_size, lay.tp)) \
        + transcendental_time(activation_function_bytes(m, j.training, lay, tokens), gpu)
    assert added(j, "recompute") == pytest.approx(m.num_layers * forward)
    tp_forward = tp_exposed_per_layer(m, j.training, j.cluster, lay.tp, lay.cp, lay.micro_batch_size, True)[0]
    assert added(j, "tp_comm") == pytest.approx(m.num_layers * tp_forward / 2)


def test_a_recomputed_expert_part_runs_its_forward_and_its_dispatch_again():
    j = job({**LITE, **modules("moe")})
    m, lay, gpu = j.model, j.layout, j.cluster.gpu
    moe_layers = m.num_moe_layers
    forward = moe_mlp_time(m, j.training, gpu, lay.tp, lay.cp, lay.micro_batch_size, lay.ep, lay.expert_tp)[0]
    assert added(j, "recompute") == pytest.approx(moe_layers * forward)
    pair = dispatch_combine_time(m, j.training, j.cluster, lay.tp, lay.cp, lay.micro_batch_size, lay.ep,
                                 lay.expert_tp)
    assert added(j, "ep_comm") == pytest.approx(moe_layers * pair)
    # The shared experts' second collective, as in forward.
    tp_forward = tp_exposed_per_layer(m, j.training, j.cluster, lay.tp, lay.cp, lay.micro_batch_size, True)[0]
    assert added(j, "tp_comm") == pytest.approx(moe_layers * tp_forward / 2)


def test_recomputing_more_modules_costs_more_and_keeps_less():
    lighter, heavier = job({**LITE, **modules("mla_up_proj")}), job({**LITE, **modules("mla_up_proj", "moe")})
    assert added(heavier, "recompute") > added(lighter, "recompute") > 0
    assert stage_activation_bytes(heavier, 0) < stage_activation_bytes(lighter, 0)


# --- what the case and the engine refuse ---

@pytest.mark.parametrize("layout, expected", [
    ({**LITE, **modules("attention")}, "expected one of core_attn, mla_up_proj, layernorm, mlp, moe_act, moe, "
                                       "shared_experts, got 'attention'"),
    ({**LITE, "recompute": "selective", "recompute_modules": []}, "expected at least one module"),
    ({**LITE, "recompute": "full", "recompute_modules": ["mlp"]}, "applies only with recompute: selective"),
    ({**LITE, **modules("mlp", "mlp")}, "names a module twice"),
    ({**LITE, "recompute": "selective", "recompute_modules": "mlp"}, "expected a list of module names"),
])
def test_a_bad_module_list_names_the_key(layout, expected):
    with pytest.raises(CaseError) as error:
        job(layout)
    assert "layout.recompute_modules" in str(error.value) and expected in str(error.value)


@pytest.mark.parametrize("model, layout, training, expected", [
    ("llama3-8b", {**LLAMA, **modules("mla_up_proj")}, {}, "only supported with multi-latent attention"),
    ("llama3-8b", {**LLAMA, **modules("moe")}, {}, "the model has no experts"),
    ("mixtral-8x7b", {**LITE, **modules("shared_experts")}, {}, "the model has no shared experts"),
    ("deepseek-v2-lite", {**LITE, **modules("layernorm")}, {"precision": "fp8", "fp8_recipe": "delayed"},
     "delayed scaling does not support"),
    ("deepseek-v2-lite", {**LITE, "zero_stage": 3, **modules("mla_up_proj")}, {"engine": "torchtitan"},
     "recomputes by its own selective policy"),
])
def test_modules_the_engine_or_model_cannot_run_are_refused(model, layout, training, expected):
    case = {"model": {"preset": model}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron", **training},
            "layout": layout}
    with pytest.raises(CaseError) as error:
        estimate(case)
    assert "layout.recompute_modules" in str(error.value) and expected in str(error.value)


def test_the_report_names_what_selective_recomputes():
    case = {"model": {"preset": "deepseek-v2-lite"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron"},
            "layout": {**LITE, "recompute": "selective"}}
    assert "recompute selective (mla_up_proj, moe_act)" in describe_layout(estimate(case))
    dense = {**case, "model": {"preset": "llama3-8b"}, "layout": {**LLAMA, "recompute": "selective"}}
    assert "recompute selective (nothing that frees memory)" in describe_layout(estimate(dense))


def test_a_layout_that_does_not_fit_is_offered_the_module_sets_the_search_scores():
    """Llama 3 70B on 8 H100s a node at tp 8 and micro-batch 2 does not fit; with flash attention
    only the dense MLPs free memory by module, and recomputing them is the rung before full."""
    case = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 128, "seq_len": 8192, "engine": "megatron"},
            "layout": {"tp": 8, "pp": 1, "micro_batch_size": 2, "zero_stage": 1, "sequence_parallel": True}}
    e = estimate(case)
    assert not e.fits
    rungs = [r for r in remedies(e.job, e.headroom) if r.description.startswith("recompute")]
    assert rungs[0].description == "recompute selective (recompute_modules: [mlp])"
    assert (rungs[0].layout.recompute, rungs[0].layout.recompute_modules, rungs[0].fits) == \
        ("selective", ("mlp",), True)
    # What the rung frees is the MLP's input and hidden tensors of every layer but the one whose
    # backward holds them again, once the head's backward has freed the logits and the loss's gradients.
    j = e.job
    dense = layer_activations(j.model, j.training, j.layout)
    shared = per_microbatch(j)
    ends = shared.head + shared.loss_gradients
    rebuilt = dense.mlp_input + dense.mlp_hidden
    freed = stage_activation_bytes(j, 0) - stage_activation_bytes(
        type(j)(j.model, j.cluster, j.training, rungs[0].layout, j.overheads), 0)
    assert freed == pytest.approx(j.model.num_layers * rebuilt + ends - max(rebuilt, ends))


@pytest.mark.parametrize("search, expected", [
    ({"recompute_modules": ["mla_up_proj"]}, "megatron cannot run it: mla_up_proj is only supported with "
                                             "multi-latent attention"),
    ({"recompute_modules": ["mlp"], "recompute": "full"}, "applies only with recompute: selective"),
    ({"recompute_modules": ["mlp"], "target": "torchtitan"}, "torchtitan recomputes by its own selective policy"),
    ({"recompute_modules": []}, "expected at least one module"),
])
def test_a_pinned_module_set_the_engine_or_model_cannot_run_is_refused_before_the_search(search, expected):
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096},
            "search": {"target": "megatron", **search}}
    with pytest.raises(CaseError) as error:
        load_case(case)
    assert "search.recompute_modules" in str(error.value) and expected in str(error.value)


def test_the_json_layout_names_the_modules_it_was_timed_with():
    """`estimate --json` and `plan --json` name what selective runs, so the layout goes back into
    a case (or a launcher) as is and is timed the same."""
    case = {"model": {"preset": "deepseek-v2-lite"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron"},
            "layout": {**LITE, "recompute": "selective"}}
    e = estimate(case)
    layout = e.to_dict()["layout"]
    assert layout["recompute_modules"] == ["mla_up_proj", "moe_act"]
    assert estimate({**case, "layout": layout}).step_time_s == e.step_time_s
    dense = {**case, "model": {"preset": "llama3-8b"}, "layout": {**LLAMA, "recompute": "selective"}}
    assert "recompute_modules" not in estimate(dense).to_dict()["layout"]  # none frees memory


def test_recomputing_what_a_model_does_not_have_holds_no_more():
    """Mixtral has no dense MLP: recomputing `mlp` beside `layernorm` changes nothing it runs, yet
    its peak rose (79.29 -> 79.50 GB with [mlp] alone) as if a dense layer's activations were held
    again: a stage now takes what one layer holds again of the kinds of layer it has."""
    import planner

    case = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"},
            "layout": {"dp": 8, "tp": 2, "sequence_parallel": True, "ep": 8, "etp": 1, "micro_batch_size": 1,
                       "zero_stage": 1, "recompute": "selective"}}

    def peak(modules):
        return planner.estimate({**case, "layout": {**case["layout"], "recompute_modules": modules}}).peak.total

    assert peak(["layernorm", "mlp"]) == peak(["layernorm"])


def test_full_recomputation_of_one_layer_without_a_pipeline_holds_less_than_none():
    """One micro-batch in flight (pp 1): the recomputed first layer runs its backward once every
    layer kept whole has freed its activations, so its working set never adds to them. Recomputing
    1 of Llama 3 8B's 32 layers rose the peak (68.32 -> 68.36 GB); it saves that layer's activations
    less its checkpoint."""
    import planner
    from cost_models.memory import per_microbatch

    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron"},
            "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"}}
    none = planner.estimate(case)
    one = planner.estimate({**case, "layout": {**case["layout"], "recompute": "full", "recompute_num_layers": 1}})
    shared = per_microbatch(one.job)
    saved = (1 + one.job.overheads.fragmentation) * (shared.kept - shared.checkpointed)
    assert none.peak.total - one.peak.total == pytest.approx(saved, rel=1e-9)


@pytest.mark.parametrize("pp", [1, 4])
def test_recomputing_more_layers_never_holds_more(pp):
    """Full recomputation of every layer held one layer more than of all but one: the last stage added
    the recomputed layer's activations to the logits and the loss's gradients, which its head's backward
    frees before any layer is recomputed (Llama 3 8B at 8k, micro-batch 1: 9.73 GB for 32 layers
    recomputed, 9.66 GB for 31)."""
    peaks = []
    for n in range(0, 32 // pp + 1):
        layout = {"dp": 8 // pp, "pp": pp, "micro_batch_size": 1, "zero_stage": 1,
                  **({"recompute": "full", "recompute_num_layers": n} if n else {})}
        case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
                "training": {"global_batch_size": 64, "seq_len": 8192, "engine": "megatron"}, "layout": layout}
        e = estimate(case)
        peaks.append(stage_activation_bytes(e.job, pp - 1))
    assert all(a >= b for a, b in zip(peaks, peaks[1:])), peaks
