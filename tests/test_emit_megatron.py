"""The Megatron-LM emitter against megatron-core itself, and its reader against the emitter.

Over generated plans (fixed seed, ``search: {target: megatron}``) and the example cases that
leave the layout to the planner:

- the emitted ``megatron_args.txt`` builds a ``megatron.core`` ``TransformerConfig`` (whose
  ``__post_init__`` validates tensor/pipeline/virtual/context parallelism, sequence
  parallelism, recomputation, GQA and the pipeline partition), and the layers megatron-core
  builds on every pipeline rank are the plan's;
- megatron-core's micro-batch calculator accepts the batch and gives the plan's accumulation;
- megatron-core's ``RankGenerator`` accepts the degrees, with tensor-parallel groups of
  contiguous ranks;
- the ``validate_args`` rules of Megatron-LM (``megatron/training/arguments.py``, not on PyPI)
  hold, restated below;
- ``read`` of the emitted arguments gives back the plan's layout, field for field.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytest.importorskip("megatron.core")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from megatron.core import num_microbatches_calculator as microbatches  # noqa: E402
from megatron.core.parallel_state import RankGenerator  # noqa: E402
from megatron.core.transformer.enums import LayerType  # noqa: E402
from megatron.core.transformer.transformer_block import get_num_layers_to_build  # noqa: E402
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig  # noqa: E402

from cost_models.activations import selective_modules  # noqa: E402
from cost_models.model_states import state_bytes  # noqa: E402
from cost_models.specs import Layout  # noqa: E402
from cost_models.topology import domains_spanned  # noqa: E402
from planner.case import load_case  # noqa: E402
from planner.emit import provenance  # noqa: E402
from planner.engines import ENGINES  # noqa: E402
from planner.engines.megatron import emit as megatron  # noqa: E402
from planner.engines.megatron import read as megatron_reader  # noqa: E402
from planner.errors import CaseError  # noqa: E402
from planner.estimate import estimate, estimate_job  # noqa: E402
from planner.plan import plan  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PRESETS = ("llama2-7b", "gpt-1.7b", "gpt-3.6b", "llama3-8b", "mistral-7b", "llama2-13b")
GPUS = ("a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb")
WANTED = 32  # generated cases that fit (at least 30 required)


def generated_cases(seed: int = 20240611):
    rng = random.Random(seed)
    while True:
        case = {
            "model": {"preset": rng.choice(PRESETS)},
            "cluster": {"gpu": rng.choice(GPUS),
                        "num_gpus": rng.choice([8, 16, 24, 32, 40, 48, 64, 96, 128, 192, 256])},
            "training": {"global_batch_size": rng.choice([32, 64, 96, 128, 256, 512, 1024]),
                         "seq_len": rng.choice([1024, 2048, 4096, 8192, 16384]),
                         "precision": rng.choice(["bf16", "bf16", "fp16", "fp8"])},
            "search": {"target": "megatron"},
        }
        if case["training"]["precision"] == "fp8" and case["cluster"]["gpu"].startswith("a100"):
            case["training"]["precision"] = "bf16"  # no fp8 tensor cores: estimate and plan refuse it
        yield case


def parse_args(text: str) -> dict:
    """The emitted argument list as {flag: value, or True for a switch}; one flag a line."""
    args = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        flag, *value = line.split()
        assert flag.startswith("--") and (len(value) <= 1 or flag == "--recompute-modules"), line
        assert flag not in args, f"{flag} given twice"
        args[flag] = (value if flag == "--recompute-modules" else value[0]) if value else True
    return args


CASE = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
        "training": {"global_batch_size": 256, "seq_len": 4096}}
GIVEN = {
    "selective": {"tp": 4, "pp": 2, "micro_batch_size": 2, "zero_stage": 1, "sequence_parallel": True,
                  "recompute": "selective"},
    "block, interleaved": {"tp": 2, "pp": 4, "vpp": 2, "micro_batch_size": 1, "recompute": "full",
                           "recompute_num_layers": 4},
    "uniform, uneven": {"tp": 2, "pp": 4, "micro_batch_size": 1, "recompute": "full",
                        "stage_layers": [7, 9, 9, 7]},
    "uneven, interleaved": {"tp": 2, "pp": 4, "vpp": 2, "micro_batch_size": 1, "stage_layers": [6, 10, 10, 6]},
    "layout, interleaved": {"pp": 4, "vpp": 2, "micro_batch_size": 1, "stage_layers": [8, 10, 8, 6]},
    # Meta's Llama 3 405B kind: the first and last stages one layer short, chunks of unequal size.
    "unequal chunks": {"tp": 2, "pp": 4, "vpp": 2, "micro_batch_size": 1, "stage_layers": [7, 9, 9, 7]},
}


# Mixtures of experts, planned (the search picks ep and etp) and given (MLA, an interleaved pipeline
# over layers the virtual stages do not divide, expert tensor parallelism, a capacity factor).
MOE_PLANNED = [
    {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
     "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "fp8"}, "search": {"target": "megatron"}},
    {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
     "training": {"global_batch_size": 512, "seq_len": 4096}, "search": {"target": "megatron"}},
    {"model": {"preset": "deepseek-v2-lite"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
     "training": {"global_batch_size": 256, "seq_len": 4096}, "search": {"target": "megatron", "min_tp": 2}},
]
MOE_GIVEN = {
    "deepseek-v3, pp4 vpp4 ep64 (61 layers)": (
        {"model": {"preset": "deepseek-v3"}, "cluster": {"gpu": "gb200", "num_gpus": 256},
         "training": {"global_batch_size": 4096, "seq_len": 4096, "engine": "megatron"}},
        {"tp": 1, "pp": 4, "vpp": 4, "ep": 64, "etp": 1, "micro_batch_size": 1, "zero_stage": 1,
         "recompute": "full"}),
    "llama4-maverick, tp2 etp2 ep8": (
        {"model": {"preset": "llama4-maverick"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 128},
         "training": {"global_batch_size": 512, "seq_len": 8192, "engine": "megatron"}},
        {"tp": 2, "pp": 4, "ep": 8, "etp": 2, "micro_batch_size": 1, "zero_stage": 1, "sequence_parallel": True,
         "recompute": "full"}),
    "mixtral-8x7b, ep8 over the all-to-all dispatcher": (
        {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
         "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron",
                      "expert_dispatch": "all_to_all"}},
        {"tp": 1, "pp": 1, "ep": 8, "etp": 1, "micro_batch_size": 1, "zero_stage": 1, "recompute": "full"}),
    "deepseek-v2-lite, selective modules, overlapped dispatch": (
        {"model": {"preset": "deepseek-v2-lite"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
         "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron", "moe_comm_overlap": True}},
        {"tp": 1, "pp": 2, "vpp": 2, "ep": 16, "etp": 1, "micro_batch_size": 1, "zero_stage": 1,
         "recompute": "selective"}),
    "deepseek-v2-lite, modules named": (
        {"model": {"preset": "deepseek-v2-lite"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
         "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron", "precision": "fp8",
                      "fp8_recipe": "tensorwise"}},
        {"tp": 1, "pp": 2, "ep": 16, "etp": 1, "micro_batch_size": 1, "zero_stage": 1, "stage_layers": [13, 14],
         "recompute": "selective", "recompute_modules": ["mla_up_proj", "layernorm", "moe", "shared_experts"]}),
    # dp 1, the experts replicated twice (edp 2): their reduction and gathers overlap as priced
    "qwen3-30b-a3b, tp8 ep4: experts' data parallelism alone": (
        {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
         "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron"}},
        {"tp": 8, "ep": 4, "etp": 1, "micro_batch_size": 1, "zero_stage": 1, "sequence_parallel": True,
         "recompute": "full"}),
    "mixtral-8x7b, capacity factor 1.25, top-1": (
        {"model": {"preset": "mixtral-8x7b", "moe_capacity_factor": 1.25, "moe_top_k": 1},
         "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
         "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"}},
        {"tp": 1, "pp": 2, "ep": 8, "etp": 1, "micro_batch_size": 1, "zero_stage": 1}),
}


# Other models given a layout: the embedding and the loss split as layers (126 + 2 = 8 stages of 2 chunks
# of 8, where 126 layers alone do not divide: planner.emit raised a SpecError).
OTHER_GIVEN = {
    "llama3.1-405b, vpp 2 counting the embedding and the loss": (
        {"model": {"preset": "llama3.1-405b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 1024},
         "training": {"global_batch_size": 512, "seq_len": 8192, "engine": "megatron"}},
        {"tp": 8, "pp": 8, "vpp": 2, "micro_batch_size": 1, "recompute": "full", "zero_stage": 1,
         "sequence_parallel": True, "account_for_embedding_in_pipeline_split": True,
         "account_for_loss_in_pipeline_split": True}),
}
GIVEN_TRAINING = {
    "tp overlap, bf16 gradients": {"tp_comm_overlap": True, "fp32_grads": False},
    "fp16, fp32 gradients": {"precision": "fp16", "fp32_grads": True},
}


class Emitted:
    def __init__(self, name: str, case, estimate):
        self.name, self.case, self.estimate = name, case, estimate
        self.job = estimate.job
        self.files = megatron.render(estimate, provenance(estimate, name))
        self.args = parse_args(self.files["megatron_args.txt"])

    def __repr__(self) -> str:
        return f"{self.name}: {self.job.layout}"


@pytest.fixture(scope="module")
def emitted() -> list[Emitted]:
    out: list[Emitted] = []
    tried = 0
    for data in generated_cases():
        if len(out) == WANTED or tried == 80:
            break
        tried += 1
        case = load_case(data)
        result = plan(case, top_k=0)
        if result.best is not None:
            name = f"{data['model']['preset']} x{data['cluster']['num_gpus']} {data['cluster']['gpu']} " \
                   f"gb{data['training']['global_batch_size']} s{data['training']['seq_len']}"
            out.append(Emitted(name, case, result.best))
    assert len(out) >= 30, f"only {len(out)} of {tried} generated cases fit"
    for path in sorted(EXAMPLES.glob("*.yaml")):
        if "options" in yaml.safe_load(path.read_text())["cluster"]:
            continue  # a case for `size`, which picks the GPU type and count
        if yaml.safe_load(path.read_text()).get("layout") is None:
            case = load_case(path, engine="megatron")  # as `plan --emit megatron` plans it
            result = plan(case, top_k=0)
            assert result.best is not None, path
            out.append(Emitted(path.name, case, result.best))
        else:  # a layout given: emitted as is
            case = load_case(path)
            out.append(Emitted(path.name, case, estimate_job(case, case.job())))
    for name, layout in GIVEN.items():  # what the search rarely picks: selective, block recomputation
        case = load_case({**CASE, "layout": layout})
        out.append(Emitted(name, case, estimate_job(case, case.job())))
    for data in MOE_PLANNED:
        case = load_case(data)
        result = plan(case, top_k=0)
        assert result.best is not None, data
        out.append(Emitted(f"{data['model']['preset']} x{data['cluster']['num_gpus']}", case, result.best))
    for name, (data, layout) in {**MOE_GIVEN, **OTHER_GIVEN}.items():
        case = load_case({**data, "layout": layout})
        out.append(Emitted(name, case, estimate_job(case, case.job())))
    for name, training in GIVEN_TRAINING.items():  # training options with their own flags
        case = load_case({**CASE, "training": {**CASE["training"], **training}, "layout": GIVEN["selective"]})
        out.append(Emitted(name, case, estimate_job(case, case.job())))
    return out


def virtual_size(args: dict, num_layers: int, pp: int):
    """virtual_pipeline_model_parallel_size as validate_args derives it (None for 1)."""
    if "--pipeline-model-parallel-layout" in args:
        stages = args["--pipeline-model-parallel-layout"].replace(",", "").count("|") + 1
        vpp = stages // pp
    elif "--num-layers-per-virtual-pipeline-stage" in args:
        vpp = num_layers // pp // int(args["--num-layers-per-virtual-pipeline-stage"])
    else:
        vpp = int(args.get("--num-virtual-stages-per-pipeline-rank", 1))
    return vpp if vpp > 1 else None


def transformer_config(args: dict) -> TransformerConfig:
    """A TransformerConfig from the arguments, as Megatron-LM's core_transformer_config_from_args
    maps them; fused kernels (CUDA / Transformer Engine) off, as on a CPU-only machine."""

    def integer(flag, default=None):
        return int(args[flag]) if flag in args else default

    num_layers, pp = integer("--num-layers"), integer("--pipeline-model-parallel-size", 1)
    dtype = torch.bfloat16 if "--bf16" in args else torch.float16 if "--fp16" in args else torch.float32
    swiglu = "--swiglu" in args
    extra = {}
    if "--num-experts" in args:  # megatron/training/arguments.py: --moe-layer-freq is a Python expression
        freq = args.get("--moe-layer-freq", "1")
        extra.update(
            num_moe_experts=integer("--num-experts"), moe_router_topk=integer("--moe-router-topk"),
            moe_ffn_hidden_size=integer("--moe-ffn-hidden-size"),
            moe_shared_expert_intermediate_size=integer("--moe-shared-expert-intermediate-size"),
            moe_layer_freq=1 if freq == "1" else list(eval(freq)),  # noqa: S307 -- the emitter's own output
            moe_router_score_function=args["--moe-router-score-function"],
            moe_router_dtype=args.get("--moe-router-dtype"),
            moe_router_pre_softmax="--moe-router-pre-softmax" in args,
            moe_router_num_groups=integer("--moe-router-num-groups"),
            moe_router_group_topk=integer("--moe-router-group-topk"),
            moe_router_load_balancing_type=args.get("--moe-router-load-balancing-type", "aux_loss"),
            moe_aux_loss_coeff=float(args.get("--moe-aux-loss-coeff", 0.0)),
            moe_router_enable_expert_bias="--moe-router-enable-expert-bias" in args,
            moe_router_bias_update_rate=float(args.get("--moe-router-bias-update-rate", 1e-3)),
            expert_model_parallel_size=integer("--expert-model-parallel-size", 1),
            expert_tensor_parallel_size=integer("--expert-tensor-parallel-size"),
            moe_grouped_gemm="--moe-grouped-gemm" in args,
            moe_token_dispatcher_type=args["--moe-token-dispatcher-type"],
            moe_flex_dispatcher_backend=args.get("--moe-flex-dispatcher-backend", "deepep"),
            moe_expert_capacity_factor=float(args["--moe-expert-capacity-factor"])
            if "--moe-expert-capacity-factor" in args else None,
            moe_pad_expert_input_to_capacity="--moe-pad-expert-input-to-capacity" in args)
    if "--kv-channels" in args:
        extra["kv_channels"] = integer("--kv-channels")
    config_class = TransformerConfig
    if "--multi-latent-attention" in args:
        config_class = MLATransformerConfig
        extra.update(q_lora_rank=integer("--q-lora-rank"), kv_lora_rank=integer("--kv-lora-rank"),
                     qk_head_dim=integer("--qk-head-dim"), qk_pos_emb_head_dim=integer("--qk-pos-emb-head-dim"),
                     v_head_dim=integer("--v-head-dim"))
    return config_class(
        **extra,
        num_layers=num_layers,
        hidden_size=integer("--hidden-size"),
        num_attention_heads=integer("--num-attention-heads"),
        num_query_groups=integer("--num-query-groups") if "--group-query-attention" in args else None,
        ffn_hidden_size=integer("--ffn-hidden-size"),
        tensor_model_parallel_size=integer("--tensor-model-parallel-size", 1),
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=virtual_size(args, num_layers, pp),
        context_parallel_size=integer("--context-parallel-size", 1),
        sequence_parallel="--sequence-parallel" in args,
        pipeline_model_parallel_layout=args.get("--pipeline-model-parallel-layout"),
        num_layers_in_first_pipeline_stage=integer("--decoder-first-pipeline-num-layers"),
        num_layers_in_last_pipeline_stage=integer("--decoder-last-pipeline-num-layers"),
        account_for_embedding_in_pipeline_split="--account-for-embedding-in-pipeline-split" in args,
        account_for_loss_in_pipeline_split="--account-for-loss-in-pipeline-split" in args,
        recompute_granularity=args.get("--recompute-granularity"),
        recompute_modules=args.get("--recompute-modules", ["core_attn"]),
        overlap_moe_expert_parallel_comm="--overlap-moe-expert-parallel-comm" in args,
        recompute_method=args.get("--recompute-method"),
        mtp_num_layers=integer("--mtp-num-layers"),
        recompute_num_layers=integer("--recompute-num-layers"),
        bf16="--bf16" in args,
        fp16="--fp16" in args,
        # MoE with fp8 or fp4 makes TransformerConfig ask Transformer Engine for its version, which
        # a CPU-only machine does not have: that one check is left out (the flags are checked above),
        # and with it the quantized parameters, which TransformerConfig refuses without the format.
        fp8=None if "--num-experts" in args else args.get("--fp8-format"),
        fp8_recipe=args.get("--fp8-recipe", "delayed"),
        fp8_param="--fp8-param-gather" in args and "--num-experts" not in args,
        fp4=None if "--num-experts" in args else args.get("--fp4-format"),
        fp4_recipe=args.get("--fp4-recipe", "nvfp4"),
        fp4_param="--fp4-param-gather" in args and "--num-experts" not in args,
        first_last_layers_bf16="--first-last-layers-bf16" in args,
        num_layers_at_start_in_bf16=integer("--num-layers-at-start-in-bf16", 1),
        num_layers_at_end_in_bf16=integer("--num-layers-at-end-in-bf16", 1),
        params_dtype=dtype,
        pipeline_dtype=dtype,
        gated_linear_unit=swiglu,
        activation_func=F.silu if swiglu else F.gelu,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        add_bias_linear="--disable-bias-linear" not in args,
    )


def layers_built(config: TransformerConfig, pp_rank: int, vp_stage: int) -> int:
    layout = config.pipeline_model_parallel_layout
    if layout is not None:
        return layout.layout[pp_rank][vp_stage].count(LayerType.decoder)
    return get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)


def test_transformer_config_accepts_every_plan(emitted):
    for e in emitted:
        lay, model = e.job.layout, e.job.model
        try:
            config = transformer_config(e.args)
        except (ValueError, AssertionError) as error:
            pytest.fail(f"{e}: TransformerConfig refused the arguments: {error}")
        assert config.tensor_model_parallel_size == lay.tp, e
        assert config.pipeline_model_parallel_size == lay.pp, e
        assert config.context_parallel_size == lay.cp, e
        assert (config.virtual_pipeline_model_parallel_size or 1) == lay.vpp, e
        assert config.sequence_parallel == lay.sequence_parallel, e
        assert config.num_query_groups == model.num_kv_heads, e
        assert config.ffn_hidden_size == model.ffn_hidden_size, e
        assert config.gated_linear_unit == (model.activation == "swiglu"), e
        assert (config.mtp_num_layers or 0) == model.mtp_layers, e
        for rank in range(lay.pp):
            built = [layers_built(config, rank, v) for v in range(lay.vpp)]
            assert tuple(built) == e.job.rank_chunk_layers(rank), (e, rank, built)
        # Full recomputation: Megatron's block method recomputes the first N layers of each chunk.
        if lay.recompute == "full":
            per_chunk = config.recompute_num_layers
            if lay.recompute_num_layers is None:
                assert (config.recompute_method, per_chunk) == ("uniform", 1), e
            else:
                assert config.recompute_method == "block" and per_chunk * lay.vpp == lay.recompute_num_layers, e
        else:  # selective with nothing that frees memory recomputes nothing
            recomputes = lay.recompute == "selective" and selective_modules(model, e.job.training, lay)
            assert config.recompute_granularity == ("selective" if recomputes else None), e


def test_transformer_config_takes_the_experts_and_their_grid(emitted):
    """megatron-core's TransformerConfig (MLATransformerConfig for MLA) with num_moe_experts: the
    experts, their width, the MoE layers, the expert grid; its RankGenerator folds the expert
    grid (etp, ep, edp) over the same ranks as the attention's."""
    moe = [e for e in emitted if e.job.model.is_moe]
    assert len(moe) >= len(MOE_PLANNED) + len(MOE_GIVEN)  # and the MoE examples
    for e in moe:
        model, lay = e.job.model, e.job.layout
        config = transformer_config(e.args)
        assert config.num_moe_experts == model.num_experts and config.moe_router_topk == model.moe_top_k, e
        assert config.moe_ffn_hidden_size == model.moe_ffn_hidden_size, e
        # Group-limited routing, as the estimate's dispatch priced it (DeepSeek-V3: 8 groups, 4 picked).
        assert (config.moe_router_num_groups or 1, config.moe_router_group_topk or 1) == \
            (model.moe_router_num_groups, model.moe_router_group_topk), e
        assert (config.moe_shared_expert_intermediate_size or 0) == model.moe_shared_expert_ffn_hidden_size, e
        pattern = config.moe_layer_freq
        moe_layers = model.num_layers if pattern == 1 else sum(pattern)
        assert moe_layers == model.num_moe_layers, e
        if pattern != 1:
            assert pattern == [int(model.is_moe_layer(i)) for i in range(model.num_layers)], e
        assert config.expert_model_parallel_size == lay.ep, e
        assert config.expert_tensor_parallel_size == lay.expert_tp, e
        assert config.moe_grouped_gemm, e
        # The router trains balanced: megatron-core adds its auxiliary loss only with a coefficient above 0
        # (router.py), and a sigmoid router (DeepSeek-V3's) balances by its expert bias too.
        assert config.moe_aux_loss_coeff > 0 and config.moe_router_load_balancing_type != "none", e
        assert config.moe_router_enable_expert_bias == (model.moe_router == "sigmoid"), e
        assert config.multi_latent_attention == (model.attention_type == "mla"), e
        assert config.overlap_moe_expert_parallel_comm == e.job.training.moe_comm_overlap, e
        # The dispatcher the estimate timed (training.expert_dispatch, else Megatron's flex dispatcher),
        # DeepEP's only where the expert group leaves its NVLink domain (inside one it saves nothing).
        flex = e.job.training.hierarchical_dispatch and lay.tp * lay.ep > 1 and model.moe_capacity_factor is None \
            and domains_spanned(e.job.cluster, lay).get("ep", 1) > 1
        assert config.moe_token_dispatcher_type == ("flex" if flex else "alltoall"), e
        if lay.recompute == "selective":  # what the estimate recomputed (activations.selective_modules)
            modules = selective_modules(model, e.job.training, lay)
            if modules:
                assert config.recompute_granularity == "selective", e
                assert tuple(config.recompute_modules) == modules, e
            else:  # nothing frees memory, so nothing is recomputed
                assert config.recompute_granularity is None, e
        if model.attention_type == "mla":
            assert (config.kv_lora_rank, config.qk_head_dim, config.qk_pos_emb_head_dim, config.v_head_dim) == \
                (model.kv_lora_rank, model.qk_head_dim, model.qk_rope_head_dim, model.v_head_dim), e
        experts = RankGenerator(tp=lay.expert_tp, ep=lay.ep, dp=lay.edp, pp=lay.pp, cp=1, order="tp-ep-dp-pp")
        assert experts.world_size == e.job.cluster.num_gpus, e
        assert all(len(g) == lay.ep for g in experts.get_ranks("ep")), e
        # Within a pipeline stage the ep groups are strided by etp, as the cost model places them.
        first = experts.get_ranks("ep")[0]
        assert first == list(range(0, lay.ep * lay.expert_tp, lay.expert_tp)), e


def test_microbatch_calculator_gives_the_plans_accumulation(emitted):
    for e in emitted:
        gbs, mbs = int(e.args["--global-batch-size"]), int(e.args["--micro-batch-size"])
        assert gbs == e.job.training.global_batch_size, e
        calculator = microbatches.ConstantNumMicroBatchesCalculator(gbs, mbs, e.job.layout.dp, False, rank=1)
        assert calculator.get() == e.job.grad_accum, e
        microbatches.init_num_microbatches_calculator(1, None, gbs, mbs, e.job.layout.dp, False)
        try:
            assert microbatches.get_num_microbatches() == e.job.grad_accum, e
        finally:
            microbatches.destroy_num_microbatches_calculator()


def test_the_data_parallel_traffic_runs_as_priced(emitted):
    """megatron-core's DistributedDataParallelConfig as Megatron-LM builds it from the arguments
    (overlap_grad_reduce, overlap_param_gather, use_distributed_optimizer, grad_reduce_in_fp32):
    what the engine will run is what the estimate priced: the bucketed reduction hidden behind the
    backward wherever there is data parallelism, the distributed optimizer's weight gathers behind the
    next forward (EngineBehaviour.overlap_param_gather), and the gradients' dtype."""
    from megatron.core.distributed import DistributedDataParallelConfig

    from cost_models.model_states import fp32_gradients

    for e in emitted:
        lay, behaviour = e.job.layout, e.job.training.engine
        config = DistributedDataParallelConfig(
            overlap_grad_reduce="--overlap-grad-reduce" in e.args,
            overlap_param_gather="--overlap-param-gather" in e.args,
            use_distributed_optimizer="--use-distributed-optimizer" in e.args,
            grad_reduce_in_fp32=("--bf16" in e.args and "--grad-reduce-in-bf16" not in e.args)
            or "--accumulate-allreduce-grads-in-fp32" in e.args)
        # data parallelism of the dense parameters (dp·cp) or of the experts' (edp: dp·cp·tp / ep·etp)
        replicated = lay.dp * lay.cp > 1 or (e.job.model.is_moe and lay.edp > 1)
        assert config.overlap_grad_reduce == replicated, e
        assert config.overlap_param_gather == (replicated and lay.zero_stage >= 1
                                               and behaviour.overlap_param_gather), e
        assert not config.overlap_param_gather or (config.use_distributed_optimizer and config.overlap_grad_reduce), e
        if e.job.training.precision in ("bf16", "fp8", "mxfp8", "nvfp4"):
            assert config.grad_reduce_in_fp32 == fp32_gradients(e.job.training), e


def test_rank_generator_accepts_the_degrees(emitted):
    for e in emitted:
        lay = e.job.layout
        ranks = RankGenerator(tp=lay.tp, ep=1, dp=lay.dp, pp=lay.pp, cp=lay.cp, order="tp-cp-ep-dp-pp")
        assert ranks.world_size == e.job.cluster.num_gpus, e
        tp_groups = ranks.get_ranks("tp")
        assert tp_groups == [list(range(i, i + lay.tp)) for i in range(0, ranks.world_size, lay.tp)], e
        assert len(ranks.get_ranks("pp")) == ranks.world_size // lay.pp, e
        assert all(len(g) == lay.dp for g in ranks.get_ranks("dp")), e
        assert all(len(g) == lay.cp for g in ranks.get_ranks("cp")), e


def test_validate_args_rules(emitted):
    """Megatron-LM's megatron/training/arguments.py ``validate_args`` (and the interleaved
    schedule in megatron/core/pipeline_parallel/schedules.py), restated."""
    for e in emitted:
        a, world = e.args, e.job.cluster.num_gpus

        def get(flag, default=None, a=a):
            return int(a[flag]) if flag in a else default

        tp, pp, cp = get("--tensor-model-parallel-size", 1), get("--pipeline-model-parallel-size", 1), \
            get("--context-parallel-size", 1)
        layers, heads = get("--num-layers"), get("--num-attention-heads")
        # data_parallel_size = world_size // (tp * pp * cp), which must be exact.
        assert world % (tp * pp * cp) == 0, e
        dp = world // (tp * pp * cp)
        assert dp == e.job.layout.dp, e
        # global_batch_size % (micro_batch_size * data_parallel_size) == 0 (the micro-batch calculator).
        gbs, mbs = get("--global-batch-size"), get("--micro-batch-size")
        assert gbs % (mbs * dp) == 0, e
        num_microbatches = gbs // (mbs * dp)
        first, last = get("--decoder-first-pipeline-num-layers"), get("--decoder-last-pipeline-num-layers")
        layout = a.get("--pipeline-model-parallel-layout")
        per_chunk = get("--num-layers-per-virtual-pipeline-stage")
        chunks = get("--num-virtual-stages-per-pipeline-rank")
        # At most one of --num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank,
        # --pipeline-model-parallel-layout; the layout excludes --decoder-first/last too (TransformerConfig).
        assert (per_chunk is not None) + (chunks is not None) + (layout is not None) <= 1, e
        # The account flags count the embedding and the loss as layers of the split (transformer_block.py)
        accounted = sum(flag in a for flag in ("--account-for-embedding-in-pipeline-split",
                                               "--account-for-loss-in-pipeline-split"))
        if layout is not None:
            assert first is None and last is None, e
            stages = layout.count("|") + 1
            assert stages % pp == 0, e  # the layout's length divides by pipeline_model_parallel_size
        elif first is None and last is None:
            # 'Number of layers should be divisible by the pipeline-model-parallel size'
            assert (layers + accounted) % pp == 0, e
        else:
            middle = pp - (first is not None) - (last is not None)
            rest = layers - (first or 0) - (last or 0)
            assert bool(rest) == bool(middle) and (middle == 0 or rest % middle == 0), e
        if per_chunk is not None:
            # With --num-layers-per-virtual-pipeline-stage: no uneven first/last stage
            # ('please use --num-virtual-stages-per-pipeline-rank ... uneven pipeline parallelism'),
            # and it divides the layers per pipeline stage.
            assert first is None and last is None, e
            assert (layers // pp) % per_chunk == 0, e
        vpp = virtual_size(a, layers, pp) or 1
        if vpp > 1:
            # Interleaving: pp > 2 unless p2p overlap is on (the default), and
            # schedules.py's micro-batch groups of pp need num_microbatches % pp == 0.
            assert pp > 2 or "--no-overlap-p2p-communication" not in a, e
            assert num_microbatches % pp == 0 and num_microbatches >= pp, e
            # get_num_layers_to_build: each rank's layers (units) split into vpp equal chunks
            assert layout is not None or ((layers + accounted) % (pp * vpp) == 0 if accounted
                                          else all(n % vpp == 0 for n in e.job.stage_layers)), e
        # Sequence parallelism needs tensor parallelism (validate_args turns it off at tp = 1).
        assert "--sequence-parallel" not in a or tp > 1, e
        # Attention heads and query groups split over tp (TransformerConfig).
        assert heads % tp == 0, e
        groups = get("--num-query-groups", heads)
        assert groups % tp == 0 or tp % groups == 0, e
        # Context parallelism: seq-length % (2 * context-parallel-size) == 0.
        assert cp == 1 or get("--seq-length") % (2 * cp) == 0, e
        # max_position_embeddings >= seq_length.
        assert get("--max-position-embeddings") >= get("--seq-length"), e
        # Selective recomputation takes no --recompute-method.
        assert a.get("--recompute-granularity") != "selective" or "--recompute-method" not in a, e
        # Precision: not both --fp16 and --bf16.
        assert not ("--fp16" in a and "--bf16" in a), e
        # --tp-comm-overlap only with sequence parallelism; --grad-reduce-in-bf16 only with bf16,
        # and it turns fp32 accumulation off.
        assert "--tp-comm-overlap" not in a or "--sequence-parallel" in a, e
        assert "--grad-reduce-in-bf16" not in a or ("--bf16" in a
                                                    and "--accumulate-allreduce-grads-in-fp32" not in a), e
        # The gradient precision the plan timed is the one these flags give.
        fp32_grads = ("--bf16" in a and "--grad-reduce-in-bf16" not in a) or "--accumulate-allreduce-grads-in-fp32" in a
        assert (state_bytes(e.job.training).gradients == 4) == fp32_grads, e
        assert ("--tp-comm-overlap" in a) == (e.job.training.tp_comm_overlap and tp > 1), e


def test_launch_script(emitted):
    for e in emitted:
        text = e.files["launch.sh"]
        nodes, per_node = megatron.nodes_and_gpus(e.job)
        assert nodes * per_node == e.job.cluster.num_gpus, e
        assert text.startswith("#!/usr/bin/env bash\n# Generated by layout-planner"), e
        assert f"torchrun --nnodes {nodes} --nproc-per-node {per_node} " in text, e
        assert "ARGS=\"$(grep -v '^#' \"$HERE/megatron_args.txt\")\"\n" in text, e
        assert "pretrain_gpt.py\" $ARGS \"$@\"" in text, e
        assert e.files["megatron_args.txt"].startswith("# Generated by layout-planner"), e


def test_launch_script_runs_torchrun_with_the_arguments(emitted, tmp_path):
    """launch.sh under bash, with a stand-in torchrun that prints what it was given."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    (bin_dir / "torchrun").chmod(0o755)
    for e in (emitted[0], emitted[-1]):
        for name, text in e.files.items():
            (tmp_path / name).write_text(text)
        run = subprocess.run([bash, str(tmp_path / "launch.sh"), "--data-path", "/data/x y"], capture_output=True,
                             text=True, env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                                             "MEGATRON_LM": "/opt/megatron", "MASTER_ADDR": "node0"}, check=True)
        given = run.stdout.splitlines()
        nodes, per_node = megatron.nodes_and_gpus(e.job)
        assert given[:4] == ["--nnodes", str(nodes), "--nproc-per-node", str(per_node)], e
        script = given.index("/opt/megatron/pretrain_gpt.py")
        expected = [word for line in e.files["megatron_args.txt"].splitlines() if not line.startswith("#")
                    for word in line.split()]
        assert given[script + 1:] == expected + ["--data-path", "/data/x y"], e


def test_read_gives_back_the_plan(emitted, tmp_path):
    for i, e in enumerate(emitted):
        folder = tmp_path / str(i)
        folder.mkdir()
        for name, text in e.files.items():
            (folder / name).write_text(text)
        assert megatron_reader.read(folder / "megatron_args.txt", e.case) == as_launched(e.job), e


def as_launched(job):
    """The job's layout as its Megatron arguments say it: the modules selective recomputation runs
    named (activations.selective_modules), and nothing recomputed where none frees memory."""
    lay = job.layout
    if lay.recompute != "selective" or lay.recompute_modules is not None:
        return lay
    modules = selective_modules(job.model, job.training, lay)
    return lay.with_changes(recompute_modules=modules) if modules else lay.with_changes(recompute="none")


def test_the_generated_plans_cover_megatrons_features(emitted):
    flags = set().union(*(e.args for e in emitted))
    for flag in ("--sequence-parallel", "--use-distributed-optimizer", "--context-parallel-size",
                 "--decoder-first-pipeline-num-layers", "--pipeline-model-parallel-layout",
                 "--num-layers-per-virtual-pipeline-stage", "--group-query-attention", "--swiglu",
                 "--fp16", "--fp8-format"):
        assert flag in flags, flag
    assert {a.get("--recompute-method") for a in (e.args for e in emitted)} >= {"block", "uniform"}
    assert any(e.args.get("--recompute-granularity") == "selective" for e in emitted)
    assert any(e.job.layout.cp > 1 for e in emitted)
    assert any(e.job.layout.vpp > 1 and e.job.layout.stage_layers for e in emitted)


# --- the reader on configs a team wrote ----------------------------------------------------------

SCRIPT = """#!/bin/bash
# Llama 2 7B, 8 nodes
GPUS_PER_NODE=8
NNODES=${NNODES:-8}
TP=2
DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES"
GPT_ARGS=(
    --num-layers 32 --hidden-size 4096   # model
    --num-attention-heads 32
    --tensor-model-parallel-size $TP
    --pipeline-model-parallel-size=4
    --num-layers-per-virtual-pipeline-stage 2
    --sequence-parallel
    --micro-batch-size 1 --global-batch-size 256
    --recompute-granularity full --recompute-method block --recompute-num-layers 1
    --use-distributed-optimizer --bf16
)
torchrun $DISTRIBUTED_ARGS pretrain_gpt.py \\
    "${GPT_ARGS[@]}" \\
    --data-path "/data/my corpus"
"""


def test_read_a_launch_script(tmp_path):
    path = tmp_path / "train.sh"
    path.write_text(SCRIPT)
    layout = megatron_reader.read(path, load_case(CASE))
    assert layout == Layout(dp=8, tp=2, pp=4, cp=1, vpp=4, micro_batch_size=1, zero_stage=1,
                                     sequence_parallel=True, recompute="full", recompute_num_layers=4)


@pytest.mark.parametrize("recompute, modules", [
    ("--recompute-granularity selective", ("core_attn",)),  # TransformerConfig.recompute_modules' default
    ("--recompute-granularity selective --recompute-modules core_attn mlp", ("core_attn", "mlp")),
    ("--recompute-granularity=selective --recompute-modules=mlp", ("mlp",)),
    ("--recompute-granularity selective --recompute-modules", None),  # an empty list recomputes nothing
])
def test_read_the_modules_selective_recomputation_names(tmp_path, recompute, modules):
    path = tmp_path / "train.sh"
    path.write_text(SCRIPT.replace("--recompute-granularity full --recompute-method block --recompute-num-layers 1",
                                   recompute))
    layout = megatron_reader.read(path, load_case(CASE))
    assert (layout.recompute, layout.recompute_modules) == ("selective", modules) if modules else \
        (layout.recompute, layout.recompute_modules) == ("none", None)


@pytest.mark.parametrize("change, flag, expected", [
    (("--global-batch-size 256", "--global-batch-size 250"), "--global-batch-size",
     "250 differs from the case's global batch 256"),
    (("--micro-batch-size 1", "--micro-batch-size 3"), "--global-batch-size",
     "256 must divide by micro-batch x dp = 3·8 = 24"),
    (("--tensor-model-parallel-size $TP", "--tensor-model-parallel-size 3"), "--tensor-model-parallel-size",
     "tp·pp·cp = 3·4·1 = 12 must divide the case's 64 GPUs (--tensor-model-parallel-size 3, "
     "--pipeline-model-parallel-size 4, --context-parallel-size 1)"),
    (("--pipeline-model-parallel-size=4", "--pipeline-model-parallel-size=four"), "--pipeline-model-parallel-size",
     "expected an integer, got 'four'"),
    (("NNODES=${NNODES:-8}", "NNODES=4"), "--nnodes", "--nnodes x --nproc-per-node = 32 GPUs, but the case has 64"),
    (("--num-layers 32", "--num-layers 40"), "--num-layers", "40 differs from the case's 32"),
    (("--bf16", "--fp16"), "--fp16", "trains in fp16, but the case's precision is bf16"),
    (("--num-layers-per-virtual-pipeline-stage 2", "--num-layers-per-virtual-pipeline-stage 3"),
     "--num-layers-per-virtual-pipeline-stage", "3 must divide the 8 layers per pipeline stage"),
    (("--recompute-method block", "--recompute-method"), "--recompute-method",
     "takes a value, and none follows it: Megatron-LM's parser refuses it (expected one argument), and the run "
     "would not start"),
])
def test_read_names_the_file_and_flag_of_a_contradiction(tmp_path, change, flag, expected):
    path = tmp_path / "train.sh"
    old, new = change
    assert old in SCRIPT
    path.write_text(SCRIPT.replace(old, new))
    with pytest.raises(CaseError) as error:
        megatron_reader.read(path, load_case(CASE))
    assert str(error.value) == f"{path}: {flag}: {expected}"


def test_read_a_custom_pipeline_layout(tmp_path):
    path = tmp_path / "args.txt"
    path.write_text("--pipeline-model-parallel-size 5\n--pipeline-model-parallel-layout Et*6|t*7|t*7|t*6|t*6,L\n"
                    "--micro-batch-size 2\n--global-batch-size 256\n")
    case = load_case({**CASE, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 40}})
    layout = megatron_reader.read(path, case)
    assert (layout.pp, layout.dp, layout.stage_layers) == (5, 8, (6, 7, 7, 6, 6))


MTP_CASE = {"model": {"preset": "deepseek-v2-lite", "mtp_layers": 1},
            "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
            "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"}}


def test_multi_token_prediction_is_written_and_placed_before_the_loss(tmp_path):
    """DeepSeek-V2-Lite with one MTP layer over 4 uneven stages: ``--mtp-num-layers 1``, the ``m``
    in the last virtual stage with the loss, where megatron-core's layout puts it and the cost
    model prices it; TransformerConfig takes the layout, and read() gives the plan back."""
    layout = {"pp": 4, "vpp": 2, "stage_layers": [6, 8, 8, 5], "ep": 8, "etp": 1, "zero_stage": 1}
    case = load_case({**MTP_CASE, "layout": layout})
    files = megatron.render(estimate_job(case, case.job()), ["header"])
    args = parse_args(files["megatron_args.txt"])
    assert args["--mtp-num-layers"] == "1"
    entries = args["--pipeline-model-parallel-layout"].split("|")
    assert entries[-1].endswith("mL") and sum("m" in e for e in entries) == 1
    config = transformer_config(args)
    assert config.mtp_num_layers == 1
    assert config.pipeline_model_parallel_layout.layout[3][-1].count(LayerType.mtp) == 1
    path = tmp_path / "megatron_args.txt"
    path.write_text(files["megatron_args.txt"])
    assert megatron_reader.read(path, case).stage_layers == (6, 8, 8, 5)


@pytest.mark.parametrize("edit, expected", [
    (lambda text: text.replace("--mtp-num-layers 1\n", ""),
     "--mtp-num-layers: absent (no multi-token prediction), but the case's model has 1 multi-token prediction "
     "layers (model.mtp_layers)"),
    (lambda text: text.replace("mL", "L").replace("Et", "Emt", 1),
     "--pipeline-model-parallel-layout: multi-token prediction layers (m) are modelled on the last stage only"),
])
def test_read_refuses_multi_token_prediction_the_case_does_not_have(tmp_path, edit, expected):
    layout = {"pp": 4, "vpp": 2, "stage_layers": [6, 8, 8, 5], "ep": 8, "etp": 1, "zero_stage": 1}
    case = load_case({**MTP_CASE, "layout": layout})
    text = megatron.render(estimate_job(case, case.job()), ["header"])["megatron_args.txt"]
    path = tmp_path / "megatron_args.txt"
    path.write_text(edit(text))
    with pytest.raises(CaseError) as error:
        megatron_reader.read(path, case)
    assert str(error.value).startswith(f"{path}: {expected}")


def test_render_refuses_what_megatron_cannot_run():
    case = load_case({**CASE, "layout": {"tp": 1, "pp": 2, "zero_stage": 3, "micro_batch_size": 1}})
    with pytest.raises(CaseError, match="--emit: megatron: layout.zero_stage is 3: pipelines with the distributed "
                                        "optimizer"):
        megatron.render(estimate_job(case, case.job()), ["header"])


@pytest.mark.parametrize("zero, strategy", [(2, "optim_grads"), (3, "optim_grads_params")])
def test_zero_2_and_3_are_megatron_fsdp(tmp_path, zero, strategy):
    """Megatron-Core's Megatron-FSDP guide: its flags, the distributed optimizer, the dtensor checkpoints
    validate_args demands, and a launch that leaves CUDA_DEVICE_MAX_CONNECTIONS unset; read() gives the
    same ZeRO stage back."""
    case = load_case({**CASE, "layout": {"tp": 2, "sequence_parallel": True, "zero_stage": zero,
                                         "micro_batch_size": 1}})
    files = megatron.render(estimate_job(case, case.job()), ["header"])
    args = files[megatron.ARGS_FILE]
    for line in ("--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}",
                 "--use-distributed-optimizer", "--ckpt-format fsdp_dtensor"):
        assert f"\n{line}\n" in args
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in files[megatron.LAUNCH_FILE]
    (tmp_path / megatron.ARGS_FILE).write_text(args)
    assert megatron_reader.read(tmp_path / megatron.ARGS_FILE, case).zero_stage == zero


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_megatron_fsdp_holds_what_its_code_allocates(zero):
    """Megatron-FSDP (core 0.16's megatron_fsdp), read in its code (it needs CUDA to run), for Llama 3 8B on 8
    GPUs: at ZeRO 3 it prefetches whole layers until 5e8 parameters are in flight (max(1e9, two units) // 2,
    megatron_fsdp.py; the prefetch loop, param_and_grad_buffer.py): three of 218.1M beside the running one,
    and holds the embedding and LM head gathered from their forward to the gradient sync (only units are
    resharded after their forward); at ZeRO 2 and 3 the emitted --no-gradient-accumulation-fusion writes the
    head's bf16 weight gradient on its own beside the loss's gradients, and the step casts each bf16 shard's
    gradient to fp32 (update_main_grads). Priced were two layers, no edges, no head gradient, no cast."""
    from cost_models.memory import step_gradient_copy_bytes, unfused_head_gradient_bytes, zero3_gather_bytes

    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 8, "seq_len": 8192, "precision": "bf16", "engine": "megatron"},
            "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": zero, "recompute": "full"}}
    job = load_case(case).job()
    layer, head = 4096 * (2 * 4096 + 2 * 1024) + 3 * 4096 * 14336, 128_256 * 4096  # Llama 3 8B: a decoder layer's weights, the embedding's
    gathered = (1 + 3) * 2 * layer + 2 * 2 * head
    assert zero3_gather_bytes(job) == (gathered if zero == 3 else 0.0)
    assert unfused_head_gradient_bytes(job) == (2 * head if zero >= 2 else 0.0)
    assert step_gradient_copy_bytes(job, 0) == pytest.approx(4 * 8_030_261_248 / 8)


def test_metas_405b_layout_is_written_down(tmp_path):
    """Llama 3 405B as Meta ran it (Dubey et al. 2024 §3.3.2): 126 layers on 16 interleaved stages, one
    fewer on the first and last, so those stages split into unequal chunks (4 + 3). It estimates, and
    the arguments carry it as a pipeline layout that TransformerConfig builds and read() gives back."""
    result = estimate(EXAMPLES / "llama3.1-405b-meta-layout.yaml")
    lay = result.job.layout
    assert result.fits and lay.stage_layers[0] == lay.stage_layers[-1] == 7
    files = megatron.render(result, ["header"])
    args = parse_args(files[megatron.ARGS_FILE])
    assert args["--pipeline-model-parallel-layout"].startswith("Et*4|t*4|")
    config = transformer_config(args)
    built = [[layers_built(config, rank, v) for v in range(2)] for rank in range(16)]
    assert built[0] == [4, 3] and built[-1] == [4, 3] and all(b == [4, 4] for b in built[1:-1])
    (tmp_path / megatron.ARGS_FILE).write_text(files[megatron.ARGS_FILE])
    assert megatron_reader.read(tmp_path / megatron.ARGS_FILE, result.case) == lay


# --- low-precision recipes ----------------------------------------------------------------------

def _recipe_case(gpu: str, precision: str, **training) -> dict:
    return {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": gpu, "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": precision, **training},
            "search": {"target": "megatron"}}


@pytest.mark.parametrize("gpu, precision, training, flags", [
    ("h100-sxm-80gb", "fp8", {}, {"--fp8-format": "hybrid", "--fp8-recipe": "delayed"}),
    ("h100-sxm-80gb", "fp8", {"fp8_recipe": "tensorwise"}, {"--fp8-format": "hybrid", "--fp8-recipe": "tensorwise"}),
    ("h100-sxm-80gb", "fp8", {"fp8_recipe": "blockwise", "fp8_param_gather": True},
     {"--fp8-format": "e4m3", "--fp8-recipe": "blockwise", "--fp8-param-gather": True}),
    ("b200", "mxfp8", {}, {"--fp8-format": "e4m3", "--fp8-recipe": "mxfp8"}),
    # MXFP8 weights kept quantized are gathered in bf16 through the gradient buffer, as estimated.
    ("b200", "mxfp8", {"fp8_param_gather": True},
     {"--fp8-recipe": "mxfp8", "--fp8-param-gather": True, "--reuse-grad-buf-for-mxfp8-param-ag": True}),
    # NVFP4 keeps the last ceil(0.15 · 32) = 5 layers in bf16.
    ("gb200", "nvfp4", {}, {"--fp4-format": "e2m1", "--fp4-recipe": "nvfp4", "--first-last-layers-bf16": True,
                            "--num-layers-at-start-in-bf16": "0", "--num-layers-at-end-in-bf16": "5"}),
])
def test_recipes_are_written_as_transformer_config_takes_them(tmp_path, gpu, precision, training, flags):
    best = plan(_recipe_case(gpu, precision, **training), top_k=0).best
    files = megatron.render(best, provenance(best, "case.yaml"))
    args = parse_args(files["megatron_args.txt"])
    for flag, value in flags.items():
        assert args.get(flag, "absent") == value, flag
    config = transformer_config(args)  # TransformerConfig.__post_init__ accepts them
    assert config.bf16 and (config.fp4 == "e2m1") == (precision == "nvfp4")
    (tmp_path / "megatron_args.txt").write_text(files["megatron_args.txt"])
    assert megatron_reader.read(tmp_path / "megatron_args.txt", best.case) == best.job.layout


def test_read_refuses_another_fp8_recipe_than_the_cases(tmp_path):
    best = plan(_recipe_case("h100-sxm-80gb", "fp8"), top_k=0).best
    text = megatron.render(best, provenance(best, "case.yaml"))["megatron_args.txt"]
    (tmp_path / "args.txt").write_text(text.replace("--fp8-recipe delayed", "--fp8-recipe tensorwise"))
    with pytest.raises(CaseError, match="--fp8-recipe: scales fp8 tensorwise, but the case's recipe is delayed"):
        megatron_reader.read(tmp_path / "args.txt", best.case)


def test_megatron_refuses_torchaos_rowwise_scaling():
    with pytest.raises(CaseError, match="training.fp8_recipe.*tensorwise"):
        plan(_recipe_case("h100-sxm-80gb", "fp8", fp8_recipe="rowwise"), top_k=0)


def test_weights_kept_quantized_by_default_are_written_and_read_back(tmp_path):
    """Megatron-Bridge's delayed-scaling precision config sets fp8_param_gather
    (``training/mixed_precision.py``), which the engine's default follows where the distributed
    optimizer runs: the plan writes --fp8-param-gather, and a launch without it is refused against
    a case that says nothing, naming the key that would make them agree."""
    best = plan(_recipe_case("h100-sxm-80gb", "fp8"), top_k=0).best
    assert best.job.layout.zero_stage == 1 and best.job.training.fp8_param_gather
    text = megatron.render(best, provenance(best, "case.yaml"))["megatron_args.txt"]
    assert "--fp8-param-gather" in parse_args(text)
    (tmp_path / "args.txt").write_text(text.replace("--fp8-param-gather", ""))
    with pytest.raises(CaseError, match="--fp8-param-gather: absent, but the case defaults to "
                                        "training.fp8_param_gather: true at this layout: set it to false"):
        megatron_reader.read(tmp_path / "args.txt", best.case)


def test_the_architecture_the_case_knows_is_written():
    """Megatron-LM's defaults are GPT-2's (LayerNorm, learned absolute positions, biases): a Llama 3
    launched without saying otherwise is not Llama 3. The preset's RMSNorm, RoPE at rope_theta
    500,000 and no biases are written, and megatron-core's TransformerConfig takes them; a model whose
    case states none of it gets a header naming what to add."""
    from planner import estimate
    from planner.engines.megatron.emit import arguments, render

    est = estimate({"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
                            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron"},
                            "layout": {"dp": 8, "tp": 8, "micro_batch_size": 1, "zero_stage": 1,
                                       "sequence_parallel": True}})
    args = dict(arguments(est.job))
    assert (args["--normalization"], args["--position-embedding-type"], args["--rotary-base"]) == \
        ("RMSNorm", "rope", "500000")
    assert "--disable-bias-linear" in args
    config = TransformerConfig(num_layers=80, hidden_size=8192, num_attention_heads=64,
                               normalization=args["--normalization"],
                               add_bias_linear="--disable-bias-linear" not in args)
    assert config.normalization == "RMSNorm" and not config.add_bias_linear
    assert "does not state" not in render(est, ["x"])["megatron_args.txt"]
    bare = estimate({"model": {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
                                       "vocab_size": 32000},
                             "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
                             "training": {"global_batch_size": 8, "seq_len": 1024, "engine": "megatron"},
                             "layout": {"dp": 8, "micro_batch_size": 1}})
    text = render(bare, ["x"])["megatron_args.txt"]
    assert "the case does not state the model's --normalization, --position-embedding-type" in " ".join(text.split())


def test_a_sliding_window_is_written_and_megatron_core_windows_the_layers_priced():
    """GPT-OSS windows its odd layers at 128 keys: `--window-size 128,0 --window-attn-skip-freq 2`,
    which megatron-core's own is_layer_window_attention reads as 18 windowed layers of 36, the
    count the estimate priced (ModelSpec.windowed_layers)."""
    from megatron.core.transformer.utils import is_layer_window_attention

    from planner import estimate
    from planner.engines.megatron.emit import arguments

    est = estimate({"model": {"preset": "gpt-oss-120b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
                    "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron"},
                    "layout": {"dp": 64, "ep": 8, "micro_batch_size": 1, "zero_stage": 1}})
    args = dict(arguments(est.job))
    window = tuple(int(x) for x in args["--window-size"].split(","))
    every = int(args["--window-attn-skip-freq"])
    assert window == (128, 0)
    windowed = [is_layer_window_attention(window, every, n) for n in range(1, 37)]
    assert sum(windowed) == est.job.model.windowed_layers == 18 and windowed[:2] == [True, False]


def test_a_rope_base_of_a_million_is_written_as_megatrons_integer_and_read_back_as_argparse_reads_it(tmp_path):
    """Megatron-LM declares --rotary-base type=int (megatron/training/arguments.py): Mixtral's
    1,000,000 written as "1e+06" stopped its parser. A base with a fraction cannot be written;
    an argument list holding "1e+06" is refused as argparse refuses it."""
    from planner import estimate
    from planner.engines.megatron.emit import arguments, render

    case = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 8, "seq_len": 4096, "engine": "megatron"},
            "layout": {"dp": 1, "tp": 8, "micro_batch_size": 1, "ep": 1, "etp": 8, "zero_stage": 1,
                       "sequence_parallel": True, "recompute": "full"}}
    assert dict(arguments(estimate(case).job))["--rotary-base"] == "1000000"
    fractional = {**case, "model": {"preset": "mixtral-8x7b", "rope_base": 10000.5}}
    with pytest.raises(CaseError, match="rope_base is 10000.5, but Megatron-LM's --rotary-base takes a whole number"):
        render(estimate(fractional), ["header"])
    files = render(estimate(case), ["header"])
    path = tmp_path / "megatron_args.txt"
    path.write_text(files["megatron_args.txt"].replace("--rotary-base 1000000", "--rotary-base 1e+06"))
    from planner.configs import read_config
    with pytest.raises(CaseError, match="--rotary-base: expected an integer, got '1e\\+06'"):
        read_config(case, "megatron", path)


def test_a_case_that_asks_for_deepep_gets_it_in_its_files_and_reads_them_back(tmp_path):
    """training.expert_dispatch: deepep with the experts inside one NVLink domain was written as
    --moe-token-dispatcher-type alltoall, and diagnose refused the files plan had just written."""
    from cli_in_process import run_cli

    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump({"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb",
                                                                                   "num_gpus": 64},
                                    "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron",
                                                 "expert_dispatch": "deepep"}}))
    planned = run_cli("plan", str(case), "--emit", "megatron", "--out", str(tmp_path / "run"), "--json")
    assert planned.returncode == 0, planned.stderr
    args = (tmp_path / "run" / "megatron_args.txt").read_text()
    assert "--moe-token-dispatcher-type flex" in args and "--moe-flex-dispatcher-backend deepep" in args
    done = run_cli("diagnose", str(case), "--megatron-args", str(tmp_path / "run" / "megatron_args.txt"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["speedup"] == pytest.approx(1.0)


def test_the_files_set_the_cases_dropout_and_diagnose_refuses_widths_and_factors_the_case_does_not_price(tmp_path):
    """Megatron-LM drops out 0.1 unless told (TransformerConfig): the files never said, so the launch
    held masks the plan did not price (2.4 GB a GPU on Llama 3 8B). diagnose read a list with other
    expert widths, another capacity factor or another dropout as the case's, speedup 1.00."""
    from cli_in_process import run_cli

    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump({"model": {"preset": "mixtral-8x7b", "moe_capacity_factor": 1.5},
                                    "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
                                    "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"}}))
    planned = run_cli("plan", str(case), "--emit", "megatron", "--out", str(tmp_path / "run"))
    assert planned.returncode == 0, planned.stderr
    path = tmp_path / "run" / "megatron_args.txt"
    text = path.read_text()
    assert "--attention-dropout 0\n" in text and "--hidden-dropout 0\n" in text
    assert run_cli("diagnose", str(case), "--megatron-args", str(path)).returncode == 0
    for old, new, needle in (("--moe-ffn-hidden-size 14336", "--moe-ffn-hidden-size 4096",
                              "--moe-ffn-hidden-size: 4096 differs from the case's 14336"),
                             ("--moe-expert-capacity-factor 1.5", "--moe-expert-capacity-factor 3",
                              "--moe-expert-capacity-factor: 3, but the case's model.moe_capacity_factor is 1.5"),
                             ("--hidden-dropout 0", "--hidden-dropout 0.3",
                              "--hidden-dropout: 0.3 differs from the case's 0 (model.dropout)")):
        assert old in text, old
        changed = tmp_path / "changed.txt"
        changed.write_text(text.replace(old, new))
        done = run_cli("diagnose", str(case), "--megatron-args", str(changed))
        assert done.returncode == 2 and needle in done.stderr, (needle, done.stderr)


def test_an_activation_offload_is_written_as_megatron_lms_parser_takes_it_and_read_back(tmp_path):
    """Megatron-LM has no --cpu-offloading argument (megatron/training/arguments.py lists
    cpu_offloading among the TransformerConfig fields with none; validate_args turns it on where
    --cpu-offloading-num-layers > 0): the files of every plan that offloaded activations stopped the
    parser, and diagnose read a list that turns offload on as Megatron-LM does as no offload
    (Llama 3 70B at 131,072 tokens: "does not fit", 254 GB)."""
    from cli_in_process import run_cli

    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump({"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
                                    "training": {"global_batch_size": 32, "seq_len": 8192, "engine": "megatron"},
                                    "search": {"offload_activations": 8}}))
    planned = run_cli("plan", str(case), "--emit", "megatron", "--out", str(tmp_path / "run"), "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["best"]["layout"]["offload_activations"] == 8
    path = tmp_path / "run" / "megatron_args.txt"
    lines = path.read_text().splitlines()
    assert "--cpu-offloading-num-layers 8" in lines and "--cpu-offloading" not in lines
    done = run_cli("diagnose", str(case), "--megatron-args", str(path), "--json")
    assert done.returncode == 0, done.stderr
    read = json.loads(done.stdout)
    assert read["config"]["layout"]["offload_activations"] == 8 and read["speedup"] == pytest.approx(1.0)
    refused = tmp_path / "refused.txt"
    refused.write_text(path.read_text() + "--cpu-offloading\n")
    done = run_cli("diagnose", str(case), "--megatron-args", str(refused))
    assert done.returncode == 2 and "--cpu-offloading: Megatron-LM has no such argument" in done.stderr


def test_deepseeks_rope_is_written_so_megatron_lm_takes_its_multi_token_prediction():
    """DeepSeek-V3's preset stated no position embedding, so its files left Megatron-LM's default,
    learned absolute positions, which validate_args refuses beside --mtp-num-layers ("Multi-Token
    Prediction (MTP) is not supported with learned_absolute position embedding type"): the shipped
    example's files did not launch. Its config.json: decoupled RoPE, rope_theta 10000."""
    for example in ("deepseek-v3-2048-h800.yaml",):
        args = dict(megatron.arguments(estimate(load_case(EXAMPLES / example)).job))
        assert args["--mtp-num-layers"] == "1"
        assert (args["--position-embedding-type"], args["--rotary-base"]) == ("rope", "10000")


def test_multi_latent_attentions_kv_channels_are_not_its_widths(tmp_path):
    """Megatron-LM's DeepSeek scripts pass --kv-channels beside --multi-latent-attention, which never
    reads it (multi_latent_attention.py takes --qk-head-dim, --qk-pos-emb-head-dim and --v-head-dim):
    diagnose refused them as "--kv-channels: 128 differs from the case's 192 (model.head_dim)"."""
    from planner.configs import read_config

    case = load_case(EXAMPLES / "deepseek-v3-2048-h800.yaml")
    path = tmp_path / "megatron_args.txt"
    text = megatron.render(estimate(case), ["header"])["megatron_args.txt"]
    path.write_text(text + "--kv-channels 128\n")
    layout = read_config(EXAMPLES / "deepseek-v3-2048-h800.yaml", "megatron", path)
    assert layout == case.layout


def test_context_parallelism_of_a_sliding_window_runs_and_is_priced_as_all_to_all(tmp_path):
    """gpt-oss at 128k on cp 2 was written with Megatron-LM's default ring (p2p), which Transformer
    Engine's attention refuses for a sliding window (attn_forward_func_with_cp: "cannot support
    sliding window attention" unless cp_comm_type is a2a): the files failed at launch."""
    import planner
    from planner.diagnose import diagnose

    case = {"model": {"preset": "gpt-oss-20b"}, "cluster": {"gpu": "h100", "num_gpus": 64},
            "training": {"global_batch_size": 64, "seq_len": 131072, "engine": "megatron"},
            "search": {"cp": 4}}
    best = planner.plan(case, top_k=0).best
    assert best.job.layout.cp == 4 and best.time.cp_comm_s > 0
    written = planner.emit(best, "megatron", tmp_path / "out")
    args = next(p for p in written.paths if p.name == "megatron_args.txt")
    assert "--cp-comm-type a2a" in args.read_text()
    (tmp_path / "case.yaml").write_text(yaml.safe_dump({k: v for k, v in case.items() if k != "search"}))
    assert diagnose(tmp_path / "case.yaml", megatron_args=args).estimate.step_time_s == pytest.approx(best.step_time_s)
    (tmp_path / "ring.txt").write_text(args.read_text().replace("--cp-comm-type a2a", ""))
    with pytest.raises(CaseError, match=r"ring.txt: --cp-comm-type: absent .* only as a2a"):
        diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "ring.txt")
    # The flag takes a type a layer (arguments.py: nargs='+'; TransformerConfig asserts num_layers of them,
    # 24 for gpt-oss-20b): all a2a reads as a2a; was refused as "takes one value, but 'a2a' follows it".
    (tmp_path / "per_layer.txt").write_text(args.read_text().replace("--cp-comm-type a2a", "--cp-comm-type" + " a2a" * 24))
    assert diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "per_layer.txt").estimate.step_time_s \
        == pytest.approx(best.step_time_s)
    (tmp_path / "mixed.txt").write_text(args.read_text().replace("--cp-comm-type a2a", "--cp-comm-type" + " a2a p2p" * 12))
    with pytest.raises(CaseError, match=r"mixed.txt: --cp-comm-type: gives the layers different types \(a2a, p2p\)"):
        diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "mixed.txt")
    (tmp_path / "three.txt").write_text(args.read_text().replace("--cp-comm-type a2a", "--cp-comm-type a2a a2a a2a"))
    with pytest.raises(CaseError, match=r"three.txt: --cp-comm-type: gives 3 types: expected one, or one a layer \(24\)"):
        diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "three.txt")
    # Its all-to-all splits the heads over the cp ranks: 8 key-value groups over cp 16 cannot.
    with pytest.raises(CaseError, match=r"layout.cp.*must divide by it"):
        planner.estimate({**case, "layout": {"cp": 16, "dp": 4, "micro_batch_size": 1, "zero_stage": 1}})


def test_overlapped_expert_dispatch_in_fp32_is_refused_as_transformer_config_refuses_it():
    # core_v0.16.1 TransformerConfig.__post_init__: "overlap_moe_expert_parallel_comm is only supported
    # with bf16 or fp16 model"; the emitted arguments (no --bf16) failed at Megatron's start-up
    import planner

    case = {"model": {"preset": "deepseek-v2-lite"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
            "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron", "precision": "fp32",
                         "moe_comm_overlap": True}}
    with pytest.raises(planner.CaseError, match=r"training\.moe_comm_overlap: .*bf16 or fp16 models only"):
        planner.plan(case)
    assert planner.plan({**case, "training": {**case["training"], "precision": "bf16"}}).best is not None


def test_multi_latent_attention_is_built_with_its_latents_norms(tmp_path):
    """DeepSeek's attention normalises its q and kv latents, and the planner counts those norms
    (cost_models.parameters); megatron-core builds them only under --qk-layernorm (gpt_layer_specs:
    q_layernorm and kv_layernorm IdentityOp without it, the TE spec's up-projections without their
    fused norm), which the files left out: another model than priced, whose checkpoints do not load."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.identity_op import IdentityOp

    case = load_case(EXAMPLES / "deepseek-v3-2048-h800.yaml")
    args = parse_args(megatron.render(estimate(case), ["header"])["megatron_args.txt"])
    spec = get_gpt_layer_local_spec(multi_latent_attention="--multi-latent-attention" in args,
                                    qk_layernorm="--qk-layernorm" in args, normalization="RMSNorm")
    attention = spec.submodules.self_attention.submodules
    assert attention.q_layernorm is not IdentityOp and attention.kv_layernorm is not IdentityOp


def test_llama4_is_built_with_rope_and_its_nope_layers(tmp_path):
    """Llama 4's files stated no positions: Megatron-LM's default, learned absolute positions (a
    5120-wide table of 4,096 rows the planner never counted) and no rotation at all, where Llama 4
    rotates at 500,000 in every layer but the last of each 4 (transformers' Llama4TextConfig:
    no_rope_layers from no_rope_layer_interval 4). megatron-core's --no-rope-freq 4 is that pattern."""
    import json
    import sys

    from megatron.core.transformer.transformer_config import TransformerConfig

    import planner
    from planner.hf_config import read_hf_config

    case = {"model": {"preset": "llama4-maverick"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 256},
            "training": {"global_batch_size": 1024, "seq_len": 4096, "engine": "megatron"}}
    best = planner.plan(case, top_k=0).best
    args = parse_args(megatron.render(best, ["header"])["megatron_args.txt"])
    assert (args["--position-embedding-type"], args["--rotary-base"], args["--no-rope-freq"]) == ("rope", "500000", "4")
    built = TransformerConfig(num_layers=48, hidden_size=64, num_attention_heads=4,
                              no_rope_freq=int(args["--no-rope-freq"])).no_rope_freq
    transformers_no_rope_layers = [int((i + 1) % 4 != 0) for i in range(48)]  # 1: RoPE, 0: NoPE
    assert built == [1 - rope for rope in transformers_no_rope_layers]
    # The published config reads to the preset's figures.
    sys.path.insert(0, str(Path(__file__).parent))
    from test_hf_config import published

    path = tmp_path / "maverick" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(published("Llama-4-Maverick-17B-128E")))
    fields = read_hf_config(path)
    assert (fields["position_embedding"], fields["rope_base"], fields["nope_every"]) == ("rope", 500000.0, 4)
    model = best.job.model
    assert (model.position_embedding, model.rope_base, model.nope_every) == ("rope", 500000, 4)


def test_llama4_scout_is_built_with_its_query_and_key_l2_norm(tmp_path):
    """Llama 4 Scout normalises each head's queries and keys by their L2 norm, without weights
    (config.json text_config use_qk_norm: true; transformers' Llama4TextL2Norm), Maverick does not
    (use_qk_norm: false): Scout's files built attention without it, another model than Meta trained.
    megatron-core's TransformerConfig.qk_l2_norm ("llama 4-style qk L2 norm") is --qk-l2-norm."""
    import json
    import sys

    import planner
    from planner.hf_config import read_hf_config

    sys.path.insert(0, str(Path(__file__).parent))
    from test_hf_config import published

    for preset, fixture, normed in (("llama4-scout", "Llama-4-Scout-17B-16E", True),
                                    ("llama4-maverick", "Llama-4-Maverick-17B-128E", False)):
        path = tmp_path / fixture / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps(published(fixture)))
        assert read_hf_config(path)["qk_l2_norm"] is normed
        assert published(fixture)["text_config"]["use_qk_norm"] is normed
        case = {"model": {"preset": preset}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 256},
                "training": {"global_batch_size": 1024, "seq_len": 4096, "engine": "megatron"}}
        estimate_of = planner.estimate({**case, "layout": {"dp": 16, "tp": 4, "pp": 4, "ep": 16, "etp": 1, "sequence_parallel": True,
                                                           "zero_stage": 1, "recompute": "full"}})
        args = parse_args(megatron.render(estimate_of, ["header"])["megatron_args.txt"])
        assert ("--qk-l2-norm" in args) is normed
        assert TransformerConfig(num_layers=48, hidden_size=64, num_attention_heads=4,
                                 qk_l2_norm="--qk-l2-norm" in args).qk_l2_norm is normed


def test_qwen2_and_glm_are_built_with_biases_on_their_query_key_and_value_alone(tmp_path):
    """Qwen2's attention biases q, k and v and nothing else (Qwen2Attention), GLM-4.5's where attention_bias
    says (Glm4MoeAttention): read as no linear bias, so the files wrote --disable-bias-linear and built
    attention without the q/k/v biases (or, unstated, Megatron-LM's default biases on every linear).
    megatron-core's TransformerConfig.add_qkv_bias is those alone (--add-qkv-bias)."""
    import planner
    from planner.hf_config import read_hf_config

    fixtures = Path(__file__).parent / "fixtures" / "hf"
    for folder, gpus in (("Qwen2.5-72B", 64), ("GLM-4.5-Air", 64)):
        fields = read_hf_config(fixtures / folder / "config.json")
        assert (fields["linear_bias"], fields["qkv_bias"]) == (False, True), folder
        case = {"model": {"hf_config": str(fixtures / folder / "config.json")},
                "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": gpus},
                "training": {"global_batch_size": 512, "seq_len": 4096, "engine": "megatron"}}
        best = planner.plan(case, top_k=0).best
        args = parse_args(megatron.render(best, ["header"])["megatron_args.txt"])
        assert "--disable-bias-linear" in args and "--add-qkv-bias" in args, folder
        config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, add_bias_linear=False,
                                   add_qkv_bias="--add-qkv-bias" in args)
        assert (config.add_bias_linear, config.add_qkv_bias) == (False, True)


def test_the_launch_builds_the_published_models_rope_share_and_router_scale(tmp_path):
    """GLM-4.5-Air's RoPE on half of each head and DeepSeek-V3's router weights scaled by 2.5 reach
    Megatron-LM's arguments (--rotary-percent, arguments.py; --moe-router-topk-scaling-factor, from
    TransformerConfig.moe_router_topk_scaling_factor), read back without a note; a list that leaves one
    out builds another model, which diagnose says."""
    from planner.diagnose import diagnose

    fixtures = Path(__file__).parent / "fixtures" / "hf"
    for name, flag, value in (("GLM-4.5-Air", "--rotary-percent", "0.5"),
                              ("DeepSeek-V3", "--moe-router-topk-scaling-factor", "2.5")):
        case = {"model": {"hf_config": str(fixtures / name / "config.json")},
                "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 256},
                "training": {"global_batch_size": 512, "seq_len": 4096, "precision": "bf16", "engine": "megatron"}}
        best = plan(case, top_k=0).best
        files = megatron.render(best, ["header"])
        assert parse_args(files["megatron_args.txt"])[flag] == value
        path = tmp_path / f"{name}.txt"
        path.write_text(files["megatron_args.txt"])
        assert not [n for n in diagnose(case, megatron_args=path).notes if flag in n]
        path.write_text(files["megatron_args.txt"].replace(f"{flag} {value}\n", ""))
        assert any(f"leaves out {flag}" in n for n in diagnose(case, megatron_args=path).notes)
    # Written as given (":g" wrote 0.333333 for a third, and diagnose said the file built another router).
    third = {**case, "model": {"preset": "deepseek-v3", "moe_router_topk_scaling": 1 / 3}}
    files = megatron.render(plan(third, top_k=0).best, ["header"])
    assert parse_args(files["megatron_args.txt"])["--moe-router-topk-scaling-factor"] == repr(1 / 3)
    path.write_text(files["megatron_args.txt"])
    assert not [n for n in diagnose(third, megatron_args=path).notes if "scaling" in n]


def test_diagnose_takes_the_lists_fp8_recipe_where_the_case_leaves_it_to_the_engine(tmp_path):
    """A case without training.fp8_recipe leaves the recipe to the engine, as it leaves the gradients'
    dtype: the list's --fp8-recipe is the run's, taken and said as the other settings taken from the
    arguments are (it was refused: "the case's recipe is delayed (training.fp8_recipe)"). A case that
    names its recipe is still held to it."""
    from cli_in_process import run_cli

    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump(_recipe_case("h100-sxm-80gb", "fp8")))
    assert run_cli("plan", str(case), "--engine", "megatron", "--emit", "megatron", "--out",
                   str(tmp_path / "run")).returncode == 0
    text = (tmp_path / "run" / "megatron_args.txt").read_text()
    assert "--fp8-recipe delayed" in text
    (tmp_path / "args.txt").write_text(text.replace("--fp8-recipe delayed", "--fp8-recipe tensorwise"))
    done = run_cli("diagnose", str(case), "--megatron-args", str(tmp_path / "args.txt"))
    assert done.returncode != 2 and not done.stderr, done.stderr
    assert "training.fp8_recipe tensorwise (--fp8-recipe)" in " ".join(done.stdout.split())
    case.write_text(yaml.safe_dump(_recipe_case("h100-sxm-80gb", "fp8", fp8_recipe="delayed")))
    done = run_cli("diagnose", str(case), "--megatron-args", str(tmp_path / "args.txt"))
    assert done.returncode == 2 and "args.txt: --fp8-recipe: scales fp8 tensorwise, but the case's recipe is " \
                                   "delayed (training.fp8_recipe)" in done.stderr, done.stderr
    # Megatron's "custom" recipe (a module of the user's own), taken where the case leaves the recipe to the
    # engine, raised a traceback (TrainingSpec refused it outside any error handling).
    case.write_text(yaml.safe_dump(_recipe_case("h100-sxm-80gb", "fp8")))
    (tmp_path / "custom.txt").write_text(text.replace("--fp8-recipe delayed", "--fp8-recipe custom"))
    done = run_cli("diagnose", str(case), "--megatron-args", str(tmp_path / "custom.txt"))
    assert done.returncode == 2 and "custom.txt: --fp8-recipe: custom: a recipe the planner cannot price" \
        in done.stderr, done.stderr


@pytest.mark.parametrize("engine, header, addr, rank", [
    ("megatron", "# Megatron-LM on 2 node(s) x 8 GPUs; on node i run with NODE_RANK=i and MASTER_ADDR set to node 0.",
     "--master-addr", "--node-rank"),
    # torchtitan's header said to set MASTER_ADDR, yet its script defaulted it to localhost.
    ("torchtitan", "# 2 node(s) x 8 processes; on node i run with NODE_RANK=i and MASTER_ADDR set to node 0.",
     "--master_addr", "--node_rank"),
])
def test_a_multi_node_launch_script_says_to_set_master_addr_to_node_0_and_stops_without_it(tmp_path, engine, header,
                                                                                          addr, rank):
    """launch.sh defaulted torchrun's master address to localhost on every node, so that nodes 1..
    waited on themselves until the rendezvous timed out. A multi-node plan's script says to set
    MASTER_ADDR to node 0, and stops saying so where it is unset."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    best = plan({**_recipe_case("h100-sxm-80gb", "bf16"), "search": {"target": engine}}, top_k=0).best
    assert megatron.nodes_and_gpus(best.job)[0] == 2
    files = ENGINES[engine].emit_module().render(best, provenance(best, "case.yaml"))
    assert header in files["launch.sh"]
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    (bin_dir / "torchrun").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "MASTER_ADDR"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    unset = subprocess.run([bash, str(tmp_path / "launch.sh")], capture_output=True, text=True, env=env)
    assert unset.returncode != 0 and unset.stdout == ""
    assert "MASTER_ADDR: set MASTER_ADDR to node 0 (the node run with NODE_RANK=0) on every node" in unset.stderr
    given = subprocess.run([bash, str(tmp_path / "launch.sh")], capture_output=True, text=True, check=True,
                           env={**env, "MASTER_ADDR": "node0", "NODE_RANK": "1"}).stdout.splitlines()
    assert given[given.index(addr) + 1] == "node0" and given[given.index(rank) + 1] == "1"


def test_tp_comm_overlap_beside_the_experts_overlap_runs_with_more_connections():
    """Mixtral 8x7B at tp 2 (sequence parallel) and ep 8 on H100s with both overlaps on: the launch
    exports CUDA_DEVICE_MAX_CONNECTIONS past 1, as the experts' all-to-all overlap requires (megatron-core's
    MoE README: "Requirements for EP A2A Overlap: expert_model_parallel_size > 1, CUDA_DEVICE_MAX_CONNECTIONS
    > 1"), and the estimate still credits --tp-comm-overlap, which runs there: it is Transformer Engine's
    userbuffers comm-GEMM overlap, which since TE 2.0 (NVIDIA/TransformerEngine#1308) orders its
    communication kernel's launch before the GEMM with a launch-completion event where a device of compute
    capability 9 (Hopper) has more than one connection (comm_gemm_overlap.cpp, CommOverlapCore: "using Fast
    Dependent Launch when CUDA_DEVICE_MAX_CONNECTIONS>1"; TE's test_bulk_overlaps runs it at 8 connections
    on Hopper), and megatron-core 0.16 takes TE 2.9 or later. What relies on one connection (the async
    sequence-parallel collectives of megatron-core's own linear layers, layers.py, which only warn) is not
    credited: without --tp-comm-overlap the estimate prices the tensor-parallel collectives in the open."""
    import importlib.metadata
    import re

    base = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "bf16", "engine": "megatron",
                         "moe_comm_overlap": True, "tp_comm_overlap": True},
            "layout": {"tp": 2, "pp": 1, "ep": 8, "micro_batch_size": 1, "sequence_parallel": True}}
    case = load_case(base)
    result = estimate_job(case, case.job())
    files = megatron.render(result, ["header"])
    connections = re.search(r"^export CUDA_DEVICE_MAX_CONNECTIONS=(\d+)", files[megatron.LAUNCH_FILE], re.M)
    assert connections is not None and int(connections.group(1)) > 1
    for flag in ("--tp-comm-overlap", "--sequence-parallel", "--overlap-moe-expert-parallel-comm"):
        assert f"\n{flag}\n" in files[megatron.ARGS_FILE]
    assert case.cluster.gpu.compute_capability_major == 9  # where TE orders the launches itself
    te = next(r for r in importlib.metadata.requires("megatron-core") if r.startswith("transformer-engine"))
    assert int(re.search(r">=(\d+)\.", te).group(1)) >= 2
    # credited: the overlapped collectives take less of the step than the same ones in the open
    plain = load_case({**base, "training": {**base["training"], "tp_comm_overlap": False}})
    assert result.time.tp_comm_s < estimate_job(plain, plain.job()).time.tp_comm_s


@pytest.mark.parametrize("gpu, multicast", [("a100-sxm-80gb", False), ("v100-sxm-32gb", False),
                                            ("h100-sxm-80gb", True), ("b200", True)])
def test_tp_comm_overlap_starts_where_the_gpu_has_no_cuda_multicast(tmp_path, gpu, multicast):
    """--tp-comm-overlap on A100s was launched without UB_SKIPMC, and Transformer Engine's initialize_ub
    (which Megatron-LM calls for the flag, megatron/training/initialize.py) raises on a device without CUDA
    multicast unless UB_SKIPMC is a non-zero integer: ``if not tex.device_supports_multicast(): ... if not
    bool(int(os.getenv("UB_SKIPMC", "0"))): raise RuntimeError(... "Launch app with UB_SKIPMC=1 to try CUDA
    IPC instead.")`` (transformer_engine/pytorch/module/base.py:183-187 at v2.9, 220-225 at 2.20.0.dev0),
    and multicast needs compute capability 9.0 or newer (TE's examples/pytorch/comm_gemm_overlap/README.md:
    "Devices older than compute capability 9.0 require UB_SKIPMC=1"). So the estimate priced an overlap
    whose run stopped before its first step. The training started by launch.sh gets what TE asks where the
    GPU has no multicast, and the multicast path is left on from Hopper on ("For best performance")."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    case = load_case({"model": {"preset": "llama2-7b"}, "cluster": {"gpu": gpu, "num_gpus": 8},
                      "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "fp16" if gpu.startswith(
                          "v100") else "bf16", "engine": "megatron", "tp_comm_overlap": True},
                      "layout": {"tp": 2, "pp": 1, "micro_batch_size": 1, "sequence_parallel": True}})
    assert (case.cluster.gpu.compute_capability_major >= 9) == multicast
    files = megatron.render(estimate_job(case, case.job()), ["header"])
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # torchrun reporting what the training would get: TE's own reading of UB_SKIPMC, and the arguments
    (bin_dir / "torchrun").write_text('#!/bin/sh\necho "UB_SKIPMC=${UB_SKIPMC:-0}"\nfor a in "$@"; do echo "$a"; '
                                      'done\n')
    (bin_dir / "torchrun").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "UB_SKIPMC"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    given = subprocess.run([bash, str(tmp_path / "launch.sh")], capture_output=True, text=True, check=True,
                           env=env).stdout.splitlines()
    assert "--tp-comm-overlap" in given
    skip = bool(int(given[0].removeprefix("UB_SKIPMC=")))
    assert skip != multicast


@pytest.mark.parametrize("gpu", ["b200", "gb200", "b300", "gb300"])
def test_tp_comm_overlap_runs_on_blackwell_with_the_connections_it_exports(gpu):
    """On Blackwell the launch exports CUDA_DEVICE_MAX_CONNECTIONS past 1 (validate_args asks for 1 only
    below compute capability 10: "CUDA_DEVICE_MAX_CONNECTIONS requirement no longer exists since the
    Blackwell architecture", megatron/training/arguments.py), and the estimate credits --tp-comm-overlap
    there, which runs as priced: Transformer Engine's userbuffers order their communication kernel before
    the GEMM only where the device's major is 9, "needed only for Hopper, which uses persistent CTA
    execution" (transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp:118-133 at v2.9, 162-177
    at 2.20.0.dev0), and elsewhere set the GEMM's SMs apart from the communication's (initialize_ub's
    default set_sm_margin for the pipelined and bulk overlaps: _math_sms = sm_count - num_comm_sm) or copy on
    the copy engines (use_ce, the ring exchange), on streams joined by events, whatever the connections. Blackwell
    has CUDA multicast (compute capability 10 >= 9), so initialize_ub starts without UB_SKIPMC, the
    multicast path kept; and NVIDIA's Blackwell performance recipes run it at PerfEnvPlugin's 32 connections
    (the NeMo and Megatron-Bridge rows on B200, B300, GB200 and GB300 with tp past 1, which
    planner/published_runs.py prices with tp_comm_overlap)."""
    import re

    base = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": gpu, "num_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "bf16", "engine": "megatron",
                         "tp_comm_overlap": True},
            "layout": {"tp": 4, "pp": 2, "micro_batch_size": 1, "sequence_parallel": True, "zero_stage": 1}}
    case = load_case(base)
    assert case.cluster.gpu.compute_capability_major == 10
    result = estimate_job(case, case.job())
    files = megatron.render(result, ["header"])
    connections = re.search(r"^export CUDA_DEVICE_MAX_CONNECTIONS=(\d+)", files[megatron.LAUNCH_FILE], re.M)
    assert connections is not None and int(connections.group(1)) > 1
    assert "\n--tp-comm-overlap\n" in files[megatron.ARGS_FILE] and "UB_SKIPMC" not in files[megatron.LAUNCH_FILE]
    plain = load_case({**base, "training": {**base["training"], "tp_comm_overlap": False}})
    assert result.time.tp_comm_s < estimate_job(plain, plain.job()).time.tp_comm_s


@pytest.mark.parametrize("kind", ["a2a", "all_gather", "a2a+p2p", "ring"])
def test_a_context_parallel_exchange_other_than_the_one_priced_is_refused(tmp_path, kind):
    """Llama 3 8B at 32k on cp 2: the estimate prices megatron-core's p2p ring (AttnFuncWithCPAndKVP2P,
    Megatron-LM's default --cp-comm-type), and a launch saying a2a (Ulysses' head scatter), all_gather
    (not overlapped with the attention) or a2a+p2p read back to the ring's step time without a word;
    a type megatron-core does not have (TransformerConfig.cp_comm_type: p2p, all_gather, a2a, a2a+p2p)
    was read too, where Transformer Engine raises at the first attention. Written out as p2p it is
    the emitted launch, priced the same."""
    from planner.diagnose import diagnose

    data = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 8, "seq_len": 32768, "engine": "megatron"},
            "layout": {"tp": 4, "cp": 2, "micro_batch_size": 1, "zero_stage": 1, "sequence_parallel": True,
                       "recompute": "full"}}
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(data))
    priced = estimate(load_case(tmp_path / "case.yaml"))
    text = megatron.render(priced, ["header"])["megatron_args.txt"]
    assert "--context-parallel-size 2" in text and "--cp-comm-type" not in text
    (tmp_path / "p2p.txt").write_text(text + "--cp-comm-type p2p\n")
    assert diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "p2p.txt").estimate.step_time_s \
        == pytest.approx(priced.step_time_s)
    (tmp_path / "other.txt").write_text(text + f"--cp-comm-type {kind}\n")
    with pytest.raises(CaseError) as refused:
        diagnose(tmp_path / "case.yaml", megatron_args=tmp_path / "other.txt")
    assert refused.value.key == "--cp-comm-type" and "expected p2p" in refused.value.expected
