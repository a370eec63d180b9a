"""Multi-token prediction (DeepSeek-V3 report §2.2; megatron-core ``MultiTokenPredictionBlock``):
what one module adds to the last pipeline stage, term by term, against the formulas the cost
model states, and what the search does with it.

Each module is one layer of the decoder's last kind, a 2h → h projection with three norms, and
the shared LM head and loss run again, all on the last stage; with an untied head that stage also
keeps a copy of the input embedding, whose gradients are all-reduced with the first stage's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import planner
from cost_models.activations import head_activation_bytes, mtp_projection_activation_bytes
from cost_models.flops import head_gemm, mtp_forward_flops, mtp_projection_gemm
from cost_models.kernels import gemm_time
from cost_models.memory import per_microbatch, stage_activation_bytes
from cost_models.parameters import (attention_parameters, embedding_parameters, mtp_parameters, norm_parameters,
                                     stage_parameters)
from cost_models.dp_time import tied_embedding_reduce
from cost_models.layer_time import cross_entropy_time, moe_layer_time
from cost_models.stage_time import stage_time
from planner.case import layout_to_mapping, load_case
from planner.hf_config import read_hf_config

# DeepSeek-V2-Lite's shape (27 layers, 64 experts, the last an MoE layer), untied, on 4 stages.
CASE = {"model": {"preset": "deepseek-v2-lite", "mtp_layers": 1},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
        "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"},
        "layout": {"pp": 4, "stage_layers": [6, 7, 7, 7], "ep": 8, "etp": 1, "zero_stage": 1,
                   "micro_batch_size": 1}}


def jobs(**layout):
    """The job with one MTP module and the same without it."""
    case = {**CASE, "layout": {**CASE["layout"], **layout}}
    with_mtp = load_case(case).job()
    without = load_case({**case, "model": {**case["model"], "mtp_layers": 0}}).job()
    return with_mtp, without


def test_the_last_stage_holds_the_module_and_a_copy_of_the_embedding():
    """Dense weights split over tp: the layer's attention and shared expert, the projection, the
    embedding copy; held whole: five norms (the layer's two, the module's three) and the router;
    the experts E/ep. Stages other than the last hold nothing more."""
    job, base = jobs()
    model, last = job.model, job.layout.pp - 1
    assert model.mtp_layers_are_moe
    args = (job.stage_layers[last], False, True, 1, job.stage_moe_layers[last], 8, 1)
    extra = stage_parameters(model, *args)
    plain = stage_parameters(base.model, *args)
    h = model.hidden_size
    dense = attention_parameters(model) + 3 * h * model.moe_shared_expert_ffn_hidden_size + 2 * h * h \
        + embedding_parameters(model) + 5 * norm_parameters(model) + h * model.num_experts
    assert extra.dense - plain.dense == dense
    assert extra.expert - plain.expert == (model.num_experts // 8) * 3 * h * model.moe_ffn_hidden_size
    first = (job.stage_layers[0], True, False, 1, job.stage_moe_layers[0], 8, 1)
    assert stage_parameters(model, *first) == stage_parameters(base.model, *first)
    # On one stage the embedding is already there: no copy.
    alone = stage_parameters(model, 27, True, True, 1, 26, 8, 1).dense - \
        stage_parameters(base.model, 27, True, True, 1, 26, 8, 1).dense
    assert alone == dense - embedding_parameters(model)


def test_the_embedding_copy_is_all_reduced_between_the_edge_stages():
    job, base = jobs()
    assert tied_embedding_reduce(base, 0) == tied_embedding_reduce(base, 3) == 0.0
    assert tied_embedding_reduce(job, 0) == tied_embedding_reduce(job, 3) > 0.0
    assert tied_embedding_reduce(job, 1) == 0.0


def test_the_last_stage_runs_a_layer_the_projection_and_the_head_again():
    """Compute: one MoE layer's forward and backward, three times the projection's and the LM
    head's forward GEMM (bf16 beside the recipe, like the head) and the loss once more; its
    dispatch and combine too. The other stages are as before."""
    job, base = jobs()
    last, gpu = job.layout.pp - 1, job.cluster.gpu
    tokens = job.layout.micro_batch_size * job.training.seq_len
    head = 3 * gemm_time(head_gemm(job.model, tokens, 1), gpu, "bf16") \
        + cross_entropy_time(tokens * job.model.vocab_size, job.training, gpu)
    projection = 3 * gemm_time(mtp_projection_gemm(job.model, tokens, 1), gpu, "bf16")
    added = stage_time(job, last).compute - stage_time(base, last).compute
    assert added == pytest.approx(moe_layer_time(job).total + head + projection, rel=1e-12)
    layers = job.stage_moe_layers[last]
    assert stage_time(job, last).ep_comm == pytest.approx(stage_time(base, last).ep_comm * (layers + 1) / layers)
    assert stage_time(job, 1) == stage_time(base, 1)


@pytest.mark.parametrize("recompute, recomputed", [
    ({"recompute": "full"}, True),  # Megatron's uniform method: the module's layer too
    ({"recompute": "full", "recompute_num_layers": 7}, False),  # block: "Skipping recompute" for MTP
])
def test_full_recomputation_takes_the_module_in_only_with_the_uniform_method(recompute, recomputed):
    job, base = jobs(**recompute)
    last = job.layout.pp - 1
    added = stage_time(job, last).recompute - stage_time(base, last).recompute
    assert (added == pytest.approx(moe_layer_time(job).forward, rel=1e-12)) if recomputed else added == 0.0


def test_the_last_stage_keeps_the_modules_activations_for_one_micro_batch():
    """The module's MoE layer, its norm and projection inputs, and its logits: once, as the last
    model chunk's backward follows its forward."""
    job, base = jobs()
    last = job.layout.pp - 1
    shared = per_microbatch(job)
    lay = job.layout
    expected = shared.kept_moe + mtp_projection_activation_bytes(job.model, job.training, lay) \
        + head_activation_bytes(job.model, job.training, lay)
    assert stage_activation_bytes(job, last) - stage_activation_bytes(base, last) == pytest.approx(expected)
    assert stage_activation_bytes(job, 0) == stage_activation_bytes(base, 0)


def test_the_search_lightens_the_last_stage_for_the_module():
    """Without a layout, Megatron's plan for DeepSeek-V3 with MTP leaves its last pipeline rank
    fewer layers than the others (as Megatron-Bridge's DeepSeek-V3 layouts do); without MTP the
    even split stands."""
    case = {"model": {"preset": "deepseek-v3"}, "cluster": {"gpu": "h800", "num_gpus": 2048},
            "training": {"global_batch_size": 15360, "seq_len": 4096, "precision": "fp8",
                         "fp8_recipe": "blockwise", "engine": "megatron"}}
    best = planner.plan(case, top_k=0).best
    stages = best.job.stage_layers
    assert best.job.layout.pp > 1 and stages[-1] < min(stages[:-1])
    plain = planner.plan({**case, "model": {"preset": "deepseek-v3", "mtp_layers": 0}}, top_k=0).best
    assert plain.step_time_s < best.step_time_s


def test_hugging_face_configs_say_how_many_modules(tmp_path):
    """``num_nextn_predict_layers``: 1 in DeepSeek-V3's config, 0 or absent for none."""
    source = Path(__file__).parent / "fixtures" / "hf" / "DeepSeek-V3" / "config.json"
    assert read_hf_config(source)["mtp_layers"] == 1
    for value in ("0", "null"):
        path = tmp_path / f"config_{value}.json"
        text = source.read_text().replace('"num_nextn_predict_layers": 1', f'"num_nextn_predict_layers": {value}')
        path.write_text(text)
        assert "mtp_layers" not in read_hf_config(path)


def test_a_negative_count_is_refused_by_key():
    with pytest.raises(planner.CaseError, match="model.mtp_layers"):
        load_case({**CASE, "model": {**CASE["model"], "mtp_layers": -1}})


def test_estimate_counts_the_module_in_the_parameters_and_the_model_flops():
    """The estimate's parameter count grows by the module's (:func:`parameters.mtp_parameters`)
    and its model FLOPs per step by three times the module's forward FLOPs for every token."""
    job, base = jobs()
    with_mtp = planner.estimate({**CASE}).to_dict()
    without = planner.estimate({**CASE, "model": {**CASE["model"], "mtp_layers": 0}}).to_dict()
    assert with_mtp["model"]["parameters"] - without["model"]["parameters"] == mtp_parameters(job.model)
    tokens = job.training.global_batch_size * job.training.seq_len
    gpus = job.cluster.num_gpus
    flops = (with_mtp["model_tflops_per_gpu"] * with_mtp["step_time_s"]
             - without["model_tflops_per_gpu"] * without["step_time_s"]) * 1e12 * gpus
    assert flops == pytest.approx(tokens * 3 * mtp_forward_flops(job.model, job.training.seq_len), rel=1e-9)


def test_the_report_names_the_modules_beside_the_parameter_count():
    from io import StringIO

    from rich.console import Console

    from planner.report import print_estimate

    def first_line(case) -> str:
        out = StringIO()
        print_estimate(planner.estimate(case), Console(file=out, width=400))
        return out.getvalue().splitlines()[0]

    assert "with 1 multi-token prediction layer)" in first_line(CASE)
    assert "multi-token" not in first_line({**CASE, "model": {**CASE["model"], "mtp_layers": 0}})


def test_deepspeeds_launch_notes_say_where_the_modules_go():
    """DeepSpeed runs the user's model: the pipeline notes of launch.sh place the modules where the
    plan priced them, and say nothing of them for a model without."""
    from planner.emit import provenance
    from planner.engines.deepspeed import emit as deepspeed

    def notes(mtp: int) -> str:
        case = {**CASE, "model": {**CASE["model"], "mtp_layers": mtp},
                "training": {**CASE["training"], "engine": "deepspeed"}}
        est = planner.estimate(case)
        return "\n".join(deepspeed.render(est, provenance(est, "case.yaml")).values())

    assert "1 multi-token prediction module(s) go on the last stage" in notes(1)
    assert "multi-token" not in notes(0)


@pytest.mark.parametrize("mtp, layout, needle", [
    (2, {"pp": 4, "vpp": 2, "stage_layers": [6, 8, 8, 5]},
     "model.mtp_layers: megatron cannot run it: --overlap-moe-expert-parallel-comm takes one"),
    (1, {"pp": 1, "stage_layers": None},
     "layout.pp: megatron cannot run it: --overlap-moe-expert-parallel-comm with a multi-token prediction layer"),
])
def test_megatron_overlaps_the_dispatch_with_one_module_and_a_pipeline_only(mtp, layout, needle):
    """megatron-core 0.16's TransformerConfig: overlap_moe_expert_parallel_comm takes MTP layers
    ≤ 1, and with one, pipeline parallelism."""
    lay = {k: v for k, v in {**CASE["layout"], **layout}.items() if v is not None}
    case = {**CASE, "model": {**CASE["model"], "mtp_layers": mtp},
            "training": {**CASE["training"], "moe_comm_overlap": True}, "layout": lay}
    with pytest.raises(planner.CaseError, match=needle):
        planner.estimate(case)
    planner.estimate({**case, "model": {**case["model"], "mtp_layers": 0}})  # the same layout without


def test_diagnose_reads_megatron_bridges_deepseek_v3_layouts_with_mtp(tmp_path):
    """Megatron-Bridge's DeepSeek-V3 layouts with MTP (recipes/deepseek/h100/deepseek_v3.py,
    perf_recipes/deepseek/gb200/deepseek_v3.py): "Et*4|(t*4|)*14tmL", 16 model chunks of 4 layers
    but the last, of one, beside the MTP layer and the loss. At pp 4 (vpp 4) the last rank's chunks
    are 4, 4, 4 and 1; at pp 8 (vpp 2), 4 and 1. Both read as the layout's own chunks, which the
    estimate prices (its largest chunk sets the rank's activations) and the emitter writes back."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    from planner.engines.megatron import emit
    from planner.engines.megatron import read as reader

    data = {"model": {"preset": "deepseek-v3"}, "cluster": {"gpu": "gb200", "num_gpus": 256},
            "training": {"global_batch_size": 4096, "seq_len": 4096, "precision": "mxfp8", "engine": "megatron",
                         "fp8_param_gather": False}}
    case = load_case(data)
    args = tmp_path / "args.txt"
    mb_layout = "Et*4|(t*4|)*14tmL"
    for pp, ep, stages in ((4, 64, (16, 16, 16, 13)), (8, 32, (8,) * 7 + (5,))):
        args.write_text(f"--tensor-model-parallel-size 1 --expert-model-parallel-size {ep} "
                        "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 4096 "
                        f"--use-distributed-optimizer --mtp-num-layers 1 --pipeline-model-parallel-size {pp} "
                        f"--pipeline-model-parallel-layout '{mb_layout}'\n")
        layout = reader.read(args, case)
        assert (layout.pp, layout.vpp, layout.stage_layers) == (pp, 16 // pp, stages)
        assert layout.chunk_layers == (4,) * 15 + (1,)
        est = planner.estimate({**data, "layout": layout_to_mapping(layout)})
        assert est.job.largest_chunk(pp - 1) == 4
        text = emit.render(est, ["header"])["megatron_args.txt"]
        written = text.split("--pipeline-model-parallel-layout")[1].split()[0].strip("'\"")
        assert written.endswith("|tmL")
        assert reader.parse_layout_string(written, pp, 1) == [4] * 15 + [1]
        # megatron-core takes it: the MTP layer on the last rank's last chunk, that rank's chunks as read.
        megatron_layout = PipelineParallelLayerLayout(written, pp)
        assert megatron_layout.validate_layer_layout(num_layers=61, mtp_num_layers=1) is False  # not standalone
        assert [chunk.count(LayerType.decoder) for chunk in megatron_layout.layout[-1]] == \
            [4] * (16 // pp - 1) + [1]


def test_diagnose_reads_megatron_bridges_h100_layout_whose_last_chunk_is_the_mtp_module(tmp_path):
    """Megatron-Bridge's 25.09 perf script runs DeepSeek-V3 on H100 in its own layout,
    "Et|(tt|)*30mL" (scripts/performance/run_script.py, v0.1.0rc4): 32 model chunks of 2 layers but
    the first, of one, and the last, which holds the MTP layer and the loss alone. At pp 8 the last
    rank's chunks are 2, 2, 2 and 0: 6 layers, where the others hold 8 (the first 7). It reads as the
    layout's own chunks, the estimate prices the last rank's 6 layers, and the emitter writes it back
    as megatron-core reads it."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    from planner.engines.megatron import emit
    from planner.engines.megatron import read as reader

    data = {"model": {"preset": "deepseek-v3"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 1024},
            "training": {"global_batch_size": 8192, "seq_len": 4096, "precision": "fp8", "engine": "megatron",
                         "fp8_param_gather": False}}
    args = tmp_path / "args.txt"
    args.write_text("--tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 64 "
                    "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 8192 "
                    "--use-distributed-optimizer --mtp-num-layers 1 --pipeline-model-parallel-size 8 "
                    "--pipeline-model-parallel-layout 'Et|(tt|)*30mL'\n")
    layout = reader.read(args, load_case(data))
    assert layout.chunk_layers == (1,) + (2,) * 30 + (0,)
    assert (layout.vpp, layout.stage_layers) == (4, (7, 8, 8, 8, 8, 8, 8, 6))
    est = planner.estimate({**data, "layout": layout_to_mapping(layout)})
    assert est.job.rank_chunk_layers(7) == (2, 2, 2, 0) and est.job.stage_layers[7] == 6
    text = emit.render(est, ["header"])["megatron_args.txt"]
    written = text.split("--pipeline-model-parallel-layout")[1].split()[0].strip("'\"")
    assert written.endswith("|tt|mL")
    assert reader.parse_layout_string(written, 8, 1) == [1] + [2] * 30 + [0]
    megatron_layout = PipelineParallelLayerLayout(written, 8)
    megatron_layout.validate_layer_layout(num_layers=61, mtp_num_layers=1)
    assert [chunk.count(LayerType.decoder) for chunk in megatron_layout.layout[-1]] == [2, 2, 2, 0]
    assert [chunk.count(LayerType.mtp) for chunk in megatron_layout.layout[-1]] == [0, 0, 0, 1]


def test_only_the_last_chunk_may_hold_no_layer_and_only_beside_the_mtp_layers():
    layout = {k: v for k, v in CASE["layout"].items() if k != "stage_layers"}
    ends_in_mtp = {**CASE, "layout": {**layout, "vpp": 2, "chunk_layers": [3, 4, 4, 4, 4, 4, 4, 0]}}
    assert load_case(ends_in_mtp).job().stage_layers == (7, 8, 8, 4)
    with pytest.raises(planner.CaseError, match=r"layout.chunk_layers: expected an integer >= 1, got int 0"):
        load_case({**CASE, "layout": {**layout, "vpp": 2, "chunk_layers": [3, 4, 4, 0, 4, 4, 4, 4]}})
    with pytest.raises(planner.CaseError, match="layout.chunk_layers: the last model chunk holds no decoder layer"):
        load_case({**ends_in_mtp, "model": {**CASE["model"], "mtp_layers": 0}})


def test_a_layouts_chunks_must_hold_its_stages():
    with pytest.raises(planner.CaseError, match="layout.chunk_layers: expected pp·vpp = 8 entries"):
        load_case({**CASE, "layout": {**CASE["layout"], "vpp": 2, "chunk_layers": [6, 7, 7]}})
    with pytest.raises(planner.CaseError, match=r"layout.chunk_layers: hold \[7, 7, 7, 6\] layers per stage, but"):
        load_case({**CASE, "layout": {**CASE["layout"], "vpp": 2, "chunk_layers": [4, 4, 4, 4, 3, 3, 3, 2]}})


def test_a_ranks_chunks_are_priced_by_their_micro_batches_in_flight():
    """Llama 3 8B over 2 ranks of 2 chunks, 12 and 4 layers on the first rank instead of 8 and 8:
    the same layers a rank, so the same step. Megatron's schedule table runs rank 0's forwards
    as chunks 0, 0, 1, 1, 0, 0, 1, 1, … and its backwards as 1, 1, 0, 0, …, warming up with
    (p − 1)·2 + (v − 1)·p = 4 forwards: after the second steady-state forward it holds micro-batches
    0-3 of chunk 0 and 1 of chunk 1, 4·12 + 1·4 = 52 layers' activations, where the even split
    holds 5·8 = 40 at every point."""
    from cost_models.memory import per_microbatch
    from cost_models.pipeline import in_flight_chunks

    base = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron"},
            "layout": {"pp": 2, "vpp": 2, "tp": 2, "sequence_parallel": True, "zero_stage": 1}}
    even = load_case(base).job()
    own = load_case({**base, "layout": {**base["layout"], "chunk_layers": [12, 8, 4, 8]}}).job()
    assert own.stage_layers == even.stage_layers == (16, 16)
    assert (own.rank_chunk_layers(0), even.rank_chunk_layers(0)) == ((12, 4), (8, 8))
    assert own.num_microbatches >= 4 and in_flight_chunks(2, 2, own.num_microbatches, 0) == 5
    assert stage_activation_bytes(own, 0) - stage_activation_bytes(even, 0) \
        == pytest.approx((52 - 40) * per_microbatch(own).kept)
    assert stage_activation_bytes(own, 1) == stage_activation_bytes(even, 1)
    assert stage_time(own, 0) == stage_time(even, 0)


def test_torchtitan_runs_unequal_chunks_of_a_rank_as_written():
    """torchtitan takes any contiguous model parts (module_fqns_per_model_part; its own default split is
    uneven): a layout whose chunks differ on a rank is priced, and written with the chunks priced."""
    from planner.engines.torchtitan import emit

    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "torchtitan"},
            "layout": {"pp": 2, "vpp": 2, "zero_stage": 3, "chunk_layers": [12, 8, 4, 8]}}
    est = planner.estimate(case)
    assert [sum(m.startswith("layers.") for m in part) for part in emit.stage_modules(est)] == [12, 8, 4, 8]
