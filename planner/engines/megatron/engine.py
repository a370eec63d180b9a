"""Megatron-LM / Megatron-core (NeMo, Megatron-Bridge): what it runs and how.

- Choices (``megatron/training/arguments.py``, ``megatron/core``): TP with or without
  sequence parallelism, PP with virtual stages, CP, the distributed optimizer (ZeRO-1) and
  Megatron-FSDP (``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads`` or
  ``optim_grads_params``: ZeRO-2/3, offered to the search without pipelining), selective
  (core attention) and full recomputation, uniform or of the first N layers per chunk; for
  mixtures of experts, expert parallelism with any expert tensor-parallel degree on its own
  grid (MoE parallel folding, ``--expert-tensor-parallel-size``), sequence parallelism required
  with tensor parallelism (``MoELayer.forward``).
- Behaviour: Transformer Engine's fused kernels (cuDNN attention, fused norm/SwiGLU/rotary,
  low-precision recipes with cached weights and quantized saved inputs; its default fp8 recipe
  is delayed scaling, ``TransformerConfig.fp8_recipe``), its in-place vocab-parallel cross-entropy,
  buckets of max(40 M, 1 M·dp) parameters (``megatron/core/distributed``), parameters
  gathered behind the next forward (--overlap-param-gather) and interleaved sends posted
  ahead (``overlap_p2p_comm``); gradients reduced in the parameters' dtype
  (``DistributedDataParallelConfig.grad_reduce_in_fp32 = False``), even layer splits; the
  flex token dispatcher (``--moe-token-dispatcher-type flex``, DeepEP or HybridEP as NeMo's and
  Megatron-Bridge's MoE recipes run it), which sends a token once per destination NVLink domain;
  the local experts' GEMMs one per expert on Transformer Engine's four compute streams
  (``TEGroupedMLP`` → ``GroupedLinear``).
- Offload: any share of the distributed optimizer (HybridDeviceOptimizer: --optimizer-cpu-offload
  --optimizer-offload-fraction) and the activations of the first N layers (cpu_offloading, without
  pipelining or recomputation: ``TransformerConfig.__post_init__``).
"""

from __future__ import annotations

from cost_models.behaviour import LOSS_GRADIENT_BYTES, QUANTIZED_GATHER_ZERO_STAGES, EngineBehaviour
from cost_models.quantization import RECIPES
from cost_models.stage_time import cp_runs_all_to_all
from cost_models.specs import Job, ModelSpec, TrainingSpec

from planner.engines.base import Engine, EngineSupport

ACTIVATION_OFFLOAD_PIPELINE = ("Megatron's CPU offloading has no support for pipeline parallelism "
                               "(TransformerConfig)")
ACTIVATION_OFFLOAD_RECOMPUTE = ("Megatron's CPU offloading does not work with activation recomputation "
                                "(TransformerConfig)")


SUPPORT = EngineSupport(
    zero_stages=(0, 1, 2, 3), max_zero_with_pp=1, interleaving=True, context_parallel=True,
    sequence_parallel=(False, True), recompute=("none", "selective", "full"), partial_recompute=True,
    recompute_modules=True, optimizer_offload="fraction", optimizer_offload_zero=(1,), activation_offload=True,
    activation_offload_with_recompute=False, activation_offload_with_pipeline=False,
    moe_comm_overlap=True,
    # Transformer Engine's fp8 recipes as megatron-core 0.16 names them (TransformerConfig.fp8_recipe:
    # tensorwise, delayed, mxfp8, blockwise); torchao's row-wise scaling has no TE counterpart.
    fp8_recipes=("delayed", "tensorwise", "blockwise"),
    pure_bf16=False, compiled_loss=False, losses=("megatron",), fused_attention=(True,),
    # bf16 moments and the master's remainders: --use-precision-aware-optimizer, Transformer Engine's FusedAdam
    # (megatron/core/optimizer/__init__.py; rules below for where megatron-core runs them).
    optimizer_moments=("fp32", "bf16"), master_remainders=True,
    why=(         ("activation_offload_with_recompute", ACTIVATION_OFFLOAD_RECOMPUTE),
         ("activation_offload_with_pipeline", ACTIVATION_OFFLOAD_PIPELINE),
         ("compiled_loss", "Megatron computes its loss in its own fused vocab-parallel cross-entropy "
                           "(tensor_parallel.vocab_parallel_cross_entropy), not a compiled one"),
         ("loss", "Megatron computes its loss in its own vocab-parallel cross-entropy"),
         ("fused_attention", "Megatron's attention is Transformer Engine's DotProductAttention, whose fused "
                             "(cuDNN) kernel the emitted arguments leave it to run (--attention-backend auto)"),
         ("pure_bf16", "Megatron's optimizer keeps main parameters in fp32 or fp16 beside the bf16 weights "
                       "(--main-params-dtype: fp32, fp16; --use-precision-aware-optimizer puts only the moments "
                       "in bf16)"),
         ("fp8_recipe", "Transformer Engine's fp8 recipes in Megatron (--fp8-recipe) are"),
         ("zero_stages", "offers ZeRO 0, the distributed optimizer (1) and Megatron-FSDP (2, 3)"),
         ("max_zero_with_pp", "pipelines with the distributed optimizer (ZeRO ≤ 1) here, not Megatron-FSDP"),
         ("optimizer_offload_zero", "offloads the distributed optimizer (--optimizer-cpu-offload needs "
                                    "--use-precision-aware-optimizer, which needs zero_stage 1)"),
         ("param_offload", "keeps parameters on the GPU (TransformerConfig.cpu_offloading_weights, which no "
                           "argument sets, is not modelled)")),
)

BEHAVIOUR = EngineBehaviour(
    name="megatron", gradient_bucket_copy=False, vocab_padding_multiple=128,
    sharded_master_weights=False, zero3_unit_copies=False, zero3_root_unit=False,
    p2p_overlap_interleaved=True, bucket_params=40e6, bucket_params_per_dp_rank=1e6, bucket_bytes=0.0,
    overlap_param_gather=True, loss="megatron", loss_gradient_bytes=LOSS_GRADIENT_BYTES["megatron"], selective="attention", fused_attention=True,
    fused_elementwise=True, fp8_recipe="delayed", quantizer="transformer_engine", fp8_weight_cache=True,
    grouped_gemm_streams=4,
    collective_launch_s=0.0, balance_stages=False, hierarchical_dispatch=True,
    master_copy_kernel=True, zeroes_gradient_buffer=True, cp_all_to_all_for_windows=True,
    offload_fp32_gradient_copies=True,
    quantized_param_gather=("delayed", "tensorwise", "mxfp8", "nvfp4"), quantized_param_gather_offloaded=("delayed",),
    saves_original_input_recipes=tuple(name for name in RECIPES if name != "delayed"),
    # optimizer.py and distrib_optimizer.py: main_grad.float() for each fp32 master (its shard under the
    # distributed optimizer); Megatron-FSDP (ZeRO 2, 3) the same of each shard's bf16 gradient
    # (param_and_grad_buffer.py, update_main_grads: optimizer_grad.to(param.dtype))
    step_gradient_copy_bytes=4.0, zero_step_gradient_copy_bytes=4.0, zero_step_gradient_copy_stages=(1, 2, 3),
    # bf16 moments run under --use-precision-aware-optimizer, whose FusedAdam keeps the master as remainders
    # where use_precision_aware_optimizer_no_fp8_or_ds_fp8 holds (optimizer_config.py: --fp8-recipe delayed,
    # TransformerConfig's default, which a bf16 run keeps too): on the distributed optimizer (ZeRO 1).
    bf16_moments_remainder_recipes=("", "delayed"), bf16_moments_remainder_zero_stages=(1,),
    zero3_prefetch_params=5e8, zero3_edges_gathered=True, unfused_weight_gradients_from_zero=2,
)


def rules(job: Job) -> list[tuple[str, str]]:
    lay, training = job.layout, job.training
    out = []
    if training.tp_comm_overlap and lay.tp > 1 and not lay.sequence_parallel:
        out.append(("training.tp_comm_overlap", "--tp-comm-overlap needs --sequence-parallel (validate_args): "
                                                "set layout.sequence_parallel: true"))
    if lay.offload_optimizer and training.optimizer == "sgd":
        # validate_args asks --use-precision-aware-optimizer of an offload, and OptimizerConfig's
        # __post_init__ takes that only with adam (megatron/core/optimizer/optimizer_config.py; the
        # emitted --optimizer adam is Adam and AdamW alike, by its weight decay).
        out.append(("layout.offload_optimizer", "Megatron-LM offloads only Adam: --optimizer-cpu-offload needs "
                                                "--use-precision-aware-optimizer, which OptimizerConfig takes only "
                                                "with --optimizer adam, not sgd"))
    out += precision_aware_rules(job)
    if lay.offload_activations:  # TransformerConfig.__post_init__ (cpu_offloading)
        if lay.pp > 1 and not SUPPORT.activation_offload_with_pipeline:
            out.append(("layout.offload_activations", ACTIVATION_OFFLOAD_PIPELINE))
        if lay.recompute != "none" and not SUPPORT.activation_offload_with_recompute:
            out.append(("layout.offload_activations", ACTIVATION_OFFLOAD_RECOMPUTE))
        if lay.offload_activations >= job.model.num_layers:
            out.append(("layout.offload_activations", f"Megatron offloads fewer layers than the model's "
                                                      f"{job.model.num_layers} (TransformerConfig)"))
    if job.model.is_moe and lay.tp > 1 and not lay.sequence_parallel:
        out.append(("layout.sequence_parallel", "megatron-core's MoELayer refuses to train with tensor parallelism "
                                                "and no sequence parallelism: set layout.sequence_parallel: true"))
    if job.model.is_moe and training.expert_dispatch == "deepep" and lay.expert_tp * lay.ep == 1:
        # MoEFlexTokenDispatcher asserts its expert tensor- and expert-parallel group spans ranks
        # (megatron-core transformer/moe/token_dispatcher.py: "Flex token dispatcher requires TPxEP > 1").
        out.append(("layout.ep", "training.expert_dispatch deepep runs --moe-token-dispatcher-type flex, which "
                                 "needs etp × ep above 1: with both 1 every rank stops building the model"))
    if training.moe_comm_overlap:  # TransformerConfig.__post_init__ on overlap_moe_expert_parallel_comm
        if lay.ep == 1:
            out.append(("training.moe_comm_overlap", "--overlap-moe-expert-parallel-comm needs expert "
                                                     "parallelism (layout.ep > 1)"))
        if lay.pp > 1 and lay.vpp == 1:
            out.append(("layout.vpp", "--overlap-moe-expert-parallel-comm pairs micro-batches of the interleaved "
                                      "schedule: with pp > 1 it needs vpp > 1"))
        if lay.recompute == "full":
            out.append(("layout.recompute", "--overlap-moe-expert-parallel-comm refuses full recomputation"))
        if job.model.mtp_layers and lay.pp == 1:
            out.append(("layout.pp", "--overlap-moe-expert-parallel-comm with a multi-token prediction layer "
                                     "needs pipeline parallelism (pp > 1)"))
    if training.fp8_param_gather and lay.zero_stage not in QUANTIZED_GATHER_ZERO_STAGES:
        out.append(("training.fp8_param_gather", "--fp8-param-gather quantizes the distributed optimizer's "
                                                 "(or Megatron-FSDP's) weight gather: it needs zero_stage 1 or 3"))
    if training.fp8_param_gather and lay.offload_optimizer \
            and training.recipe.name not in BEHAVIOUR.quantized_param_gather_offloaded:
        out.append(("training.fp8_param_gather", "--fp8-param-gather with --optimizer-cpu-offload needs "
                                                 "--fp8-recipe delayed (Megatron-LM's arguments.py): set it false"))
    if lay.cp > 1 and cp_runs_all_to_all(job.model, training):
        heads, groups = job.model.num_attention_heads // lay.tp, max(job.model.num_kv_heads // lay.tp, 1)
        if heads % lay.cp or groups % lay.cp:
            # Transformer Engine's a2a context parallelism splits the heads over the cp ranks.
            out.append(("layout.cp", f"context parallelism with sliding-window attention runs as all-to-all "
                                     f"(--cp-comm-type a2a), which splits the {heads} heads and {groups} key-value "
                                     f"groups of a tensor-parallel rank over cp {lay.cp}: they must divide by it"))
    if lay.cp > 1 and not training.flash_attention:
        # --attention-backend unfused (emit.py) sets NVTE_UNFUSED_ATTN=1 alone (megatron-core
        # language_module.py), and Transformer Engine drops its unfused backend under context parallelism
        # ("does not support context parallelism", dot_product_attention/utils.py): no backend is left.
        out.append(("layout.cp", "context parallelism runs in Transformer Engine's flash or fused attention, "
                                 "which training.flash_attention false (--attention-backend unfused) turns off: "
                                 "no attention backend is left for it"))
    if lay.stage_layers is not None and 0 in lay.stage_layers[1:-1]:
        # Its pipeline layout holds a transformer layer in every model chunk but the edges' (read.py
        # refuses the same layout written as --pipeline-model-parallel-layout).
        out.append(("layout.stage_layers", f"Megatron-LM gives every pipeline stage but the first and last a "
                                           f"transformer layer, got {list(lay.stage_layers)}"))
    out += _recompute_module_rules(job)
    if lay.recompute_num_layers is not None and lay.recompute_num_layers % lay.vpp:
        out.append(("layout.recompute_num_layers", f"--recompute-num-layers counts layers per model chunk: "
                                                   f"{lay.recompute_num_layers} must divide by vpp {lay.vpp}"))
    return out


# Megatron's precision-aware optimizer (--use-precision-aware-optimizer) as megatron-core 0.16 runs it.
PRECISION_AWARE_ZERO = ("--use-precision-aware-optimizer needs the distributed optimizer (OptimizerConfig."
                        "__post_init__: 'only supported with distributed optimizer'): zero_stage 1")
PRECISION_AWARE_OFFLOAD = ("with --optimizer-cpu-offload the HybridDeviceOptimizer steps fp32 copies of the shards "
                           "with fp32 moments and no remainders (megatron/core/optimizer/__init__.py passes it "
                           "neither exp_avg_dtype nor store_param_remainders)")


def precision_aware_rules(job: Job) -> list[tuple[str, str]]:
    """Where megatron-core 0.16 runs Adam's moments in bf16 and the master as remainders
    (``TrainingSpec.optimizer_moments``, ``master_remainders``): both only under
    --use-precision-aware-optimizer (the moments' dtypes are asserted fp32 without it:
    OptimizerConfig.__post_init__), on the distributed optimizer, with the optimizer on the GPU; the
    remainders wherever ``use_precision_aware_optimizer_no_fp8_or_ds_fp8`` holds under --bf16 (no fp8
    recipe or delayed), and only there (optimizer_config.py; optimizer/__init__.py hands FusedAdam
    ``master_weights`` there alone, ``store_param_remainders`` True with no argument to turn it off)."""
    lay, training = job.layout, job.training
    moments, remainders = training.optimizer_moments == "bf16", bool(training.master_remainders)
    if not (moments or remainders):
        return []
    key = "training.master_remainders" if remainders and not moments else "training.optimizer_moments"
    what = f"{key.split('.')[1]} {'bf16' if key.endswith('moments') else 'true'}"
    if lay.zero_stage != 1:
        return [(key, f"{what}: {PRECISION_AWARE_ZERO}, not {lay.zero_stage}")]
    if lay.offload_optimizer:
        return [("layout.offload_optimizer", f"training.{what}: {PRECISION_AWARE_OFFLOAD}")]
    if training.precision in ("fp32", "fp16"):
        # FusedAdam then keeps an fp32 master_param of every parameter beside the fp32 or fp16 weights
        # (transformer_engine/pytorch/optimizers/fused_adam.py, initialize_state), which no term prices.
        return [(key, f"{what}: megatron-core's precision-aware optimizer under {training.precision} weights "
                      f"keeps a whole fp32 master in Transformer Engine's FusedAdam, not priced; it is priced "
                      f"under bf16 weights (precision bf16, fp8, mxfp8)")]
    recipe = training.recipe.name if training.recipe else ""
    if recipe == "nvfp4":
        return [(key, f"{what}: under NVFP4 Megatron-LM's --fp8-recipe stays delayed, and FusedAdam's master beside "
                      "NVFP4 weights is not priced")]
    keeps = recipe in BEHAVIOUR.bf16_moments_remainder_recipes
    if keeps and training.fp8_param_gather:
        # FusedAdam is handed the quantized (Float8Tensor) shards and steps them in its fp8 kernel
        # (multi_tensor_adam_fp8) with a master of its own: not the bf16 weights and remainders priced.
        return [("training.fp8_param_gather", f"true with training.{what} under {recipe}: Transformer Engine's "
                                              "FusedAdam then holds the master of fp8 weights, not priced; set "
                                              "fp8_param_gather false")]
    if remainders and not keeps:
        return [("training.master_remainders", f"true: under the {recipe} recipe megatron-core keeps its own fp32 "
                                               "master (distrib_optimizer.py: use_precision_aware_optimizer_no_fp8_"
                                               "or_ds_fp8 is false) and Transformer Engine's FusedAdam the moments "
                                               "alone; expected false")]
    if training.master_remainders is False and keeps:
        return [("training.master_remainders", "false: megatron-core's precision-aware optimizer keeps the fp32 master "
                                               "as remainders of the bf16 weights here (OptimizerConfig."
                                               "store_param_remainders, True, no argument turns it off); expected "
                                               "true, or leave it unset")]
    return []


def _recompute_module_rules(job: Job) -> list[tuple[str, str]]:
    return [("layout.recompute_modules", why)
            for why in recompute_module_refusals(job.model, job.training, job.layout.recompute_modules or ())]


def recompute_module_refusals(model: ModelSpec, training: TrainingSpec, modules: tuple[str, ...]) -> list[str]:
    """megatron-core's refusals of the modules a layout (or a search) names
    (``TransformerConfig.__post_init__``), and the modules the model has nothing for (megatron-core
    would skip them silently)."""
    out = []
    if "mla_up_proj" in modules and model.attention_type != "mla":
        out.append("mla_up_proj is only supported with multi-latent attention (TransformerConfig)")
    for name in ("moe_act", "moe", "shared_experts"):
        if name in modules and not model.is_moe:
            out.append(f"{name} recomputes part of an MoE layer, and the model has no experts")
    if "shared_experts" in modules and model.is_moe and not model.moe_shared_expert_ffn_hidden_size:
        out.append("shared_experts: the model has no shared experts")
    if training.delayed_scaling:
        for name in ("moe_act", "layernorm"):
            if name in modules:
                out.append(f"{name}: delayed scaling does not support moe_act and layernorm recompute for fp8 "
                           f"(TransformerConfig)")
    if "moe" in modules and training.moe_comm_overlap:
        out.append("disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm "
                   "(TransformerConfig)")
    return out

def case_rules(training: TrainingSpec, model: ModelSpec) -> list[tuple[str, str]]:
    """What no layout meets (TransformerConfig.__post_init__ on overlap_moe_expert_parallel_comm):
    checked before the search, which otherwise found nothing and said memory overflowed, after 35 s."""
    out = []
    if training.moe_comm_overlap and not model.is_moe:
        out.append(("training.moe_comm_overlap", "--overlap-moe-expert-parallel-comm overlaps expert-parallel "
                                                 "dispatch: it needs a mixture of experts"))
    if training.moe_comm_overlap and training.precision == "fp32":
        out.append(("training.moe_comm_overlap", "--overlap-moe-expert-parallel-comm runs bf16 or fp16 models only "
                                                 "(TransformerConfig: 'only supported with bf16 or fp16 model'), "
                                                 "not fp32"))
    if training.moe_comm_overlap and model.mtp_layers > 1:
        out.append(("model.mtp_layers", "--overlap-moe-expert-parallel-comm takes one multi-token prediction "
                                        "layer at most"))
    return out


ENGINE = Engine("megatron", SUPPORT, BEHAVIOUR, rules, emitter="planner.engines.megatron.emit",
                reader="planner.engines.megatron.read", case_rules=case_rules, title="Megatron-LM")
