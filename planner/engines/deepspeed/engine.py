"""DeepSpeed (Megatron-DeepSpeed and plain DeepSpeed): what it runs and how.

- Choices (``deepspeed/runtime``): ZeRO 0-3; its pipeline engine refuses ZeRO stages 2 and
  3 (``pipe/engine.py``: ``assert self.zero_optimization_stage() < 2``) and has no
  interleaving; tensor parallelism without sequence parallelism, with ZeRO up to 2: through
  AutoTP without a pipeline, and with one through the model's own Megatron-style layers on
  the pipeline's 3D grid (``PipeModelDataParallelTopology``: Megatron-DeepSpeed, as BLOOM
  ran), since AutoTP builds its groups over all ranks and ignores the pipeline
  (``engine._configure_tensor_parallel_states``); no context parallelism of Megatron's kind;
  whole-layer activation checkpointing of every layer or none; ZeRO-Offload of the whole
  optimizer (``zero_optimization.offload_optimizer``, stages 1-3) and ZeRO-Infinity's parameter
  offload (``offload_param``, stage 3); mixtures of experts through
  ``deepspeed.moe.layer.MoE(ep_size=…)``, its expert-parallel groups inside each pipeline
  stage's data-parallel ranks (``utils/groups.py``), experts split over tensor-parallel ranks
  when there are any.
- Behaviour: ZeRO-3 gathers each submodule's weights on its own and again for the recompute
  (``zero/parameter_offload.py``); its pipeline reduces gradients after the last
  micro-batch (``pipe/schedule.py``: ReduceTiedGrads, ReduceGrads, OptimizerStep);
  reduce buckets of 5e8 elements; ZeRO-1/2 weights gathered before the step returns, one
  all-gather per optimizer parameter group (``runtime/utils.py``, ``all_gather_dp_groups``); the local
  experts run one after another (``moe/experts.py``: ``Experts.forward`` loops over them);
  Megatron's vocab-parallel cross-entropy and fused element-wise kernels (Megatron-DeepSpeed).
"""

from __future__ import annotations

from cost_models.behaviour import LOSS_GRADIENT_BYTES, LOSSES, EngineBehaviour
from cost_models.model_states import fp32_gradients
from cost_models.specs import GPUSpec, Job, TrainingSpec

from planner.engines.base import Engine, EngineSupport

# Each loss in the user's words: what it is, where a train.py gets it, and what it holds a logit at its
# peak beside the 16-bit logits (the saved fp32 softmax and behaviour.LOSS_GRADIENT_BYTES).
LOSS_WORDS = {"megatron": ("Megatron's vocab-parallel cross-entropy", "as Megatron-DeepSpeed runs it",
                           "keeps the fp32 softmax and writes the gradient into it, 4 + 2 bytes a logit"),
              "eager": ("eager PyTorch cross-entropy on fp32 logits",
                        "a Hugging Face model's own loss (ForCausalLMLoss) or F.cross_entropy(logits.float(), labels)",
                        "keeps the fp32 log-softmax, and its backward two fp32 gradients, 4 + 4 + 4 bytes a logit")}


SUPPORT = EngineSupport(
    zero_stages=(0, 1, 2, 3), max_zero_with_pp=1, interleaving=False, context_parallel=False,
    sequence_parallel=(False,), recompute=("none", "full"), partial_recompute=False,
    tp_comm_overlap=False, max_zero_with_tp=2, expert_tp="tp", optimizer_offload="all", param_offload=True,
    # DeepSpeed has no low-precision GEMMs of its own (ds_config knows fp16 and bf16): its fp8 is
    # Transformer Engine's fp8_autocast around the model (Megatron-DeepSpeed's TE layers), with
    # TE's per-tensor and block recipes; its ZeRO gathers the bf16 weights.
    fp8_recipes=("delayed", "tensorwise", "blockwise"), fp8_param_gather=False, expert_dispatches=("all_to_all",),
    compiled_loss=False, losses=LOSSES, optimizer_moments=("fp32",),
    why=(("optimizer_moments", "DeepSpeed keeps bf16 moments only beside bf16 master weights (runtime/config.py: "
                               "'bf16_optimizer_states requires bf16_master_weights_and_grads'; that is "
                               "training.master_weights false), and its Adam's moments beside an fp32 master take "
                               "the master's dtype (DeepSpeedCPUAdam's fp32_optimizer_states false: p.dtype): it "
                               "keeps them in"),
         ("compiled_loss", "Megatron-DeepSpeed computes its loss in Megatron's vocab-parallel cross-entropy, "
                           "not a compiled one"),
         ("fp8_recipe", "DeepSpeed's fp8 is Transformer Engine's, whose recipes are"),
         ("expert_dispatch", "DeepSpeed-MoE dispatches with one all-to-all (deepspeed.moe.sharded_moe, _AllToAll): "
                             "its dispatch is"),
         ("fp8_param_gather", "DeepSpeed's ZeRO gathers the bf16 weights (no fp8 parameter all-gather)"),
         ("expert_tp", "DeepSpeed-MoE splits experts over the tensor-parallel ranks "
                       "(deepspeed.moe.layer.MoE, enable_expert_tensor_parallelism) or runs them whole without "
                       "tensor parallelism: etp = tp"),
         ("max_zero_with_pp", "DeepSpeed's pipeline engine refuses ZeRO stages 2 and 3"),
         ("interleaving", "DeepSpeed's pipeline engine has no interleaved schedule"),
         ("context_parallel", "DeepSpeed has no context parallelism of Megatron's kind, and its Ulysses sequence "
                              "parallelism (sequence_parallel_size) is not priced: megatron and torchtitan run cp"),
         ("sequence_parallel", "DeepSpeed's AutoTP has no sequence parallelism"),
         ("recompute", "DeepSpeed checkpoints whole layers only (recompute none or full)"),
         ("partial_recompute", "DeepSpeed recomputes every layer or none"),
         ("tp_comm_overlap", "DeepSpeed's AutoTP does not overlap its collectives with the GEMMs"),
         ("max_zero_with_tp", "DeepSpeed's AutoTP training supports ZeRO stages up to 2"),
         ("optimizer_offload", "DeepSpeed's offload_optimizer moves all of the optimizer (1) or none (0)"),
         ("activation_offload", "DeepSpeed offloads only checkpointed activations (cpu_checkpointing), not "
                                "modelled")),
)

BEHAVIOUR = EngineBehaviour(
    name="deepspeed", gradient_bucket_copy=False,
    sharded_master_weights=False, zero3_unit_copies=False, zero3_root_unit=False,
    zero3_collectives_per_layer=6,
    # The sizes the Hugging Face integration fills in for "auto" (transformers
    # integrations/deepspeed.py), which the emitter writes: a prefetch bucket of 0.9·h², and
    # DeepSpeed's default of 1e9 live parameters.
    zero3_max_live_parameters=1e9, zero3_prefetch_bucket_h2=0.9,
    # DeepSpeedZeroConfig's default max_reuse_distance (runtime/zero/config.py), which the emitter writes.
    zero3_max_reuse_distance=1e9,
    # Without fp32 master weights: bf16.bf16_master_weights_and_grads and bf16_optimizer_states.
    bf16_master_partition=True,
    reduce_after_pipeline=True, zero0_reduce_after_backward=True, fp32_accumulation_bytes=20.0,
    p2p_serial=True,
    # ZeRO-1/2 buckets all-reduced whole: use_multi_rank_bucket_allreduce's default (runtime/zero/config.py),
    # which the emitter leaves unset (stage_1_and_2.py, average_tensor; the reader turns it off where a
    # ds_config turns it off: read.reduction_as_configured).
    zero12_bucket_all_reduce=True,
    step_gradient_copy_bytes=8.0, zero_step_gradient_copy_bytes=6.0, step_frees_unpartitioned_gradients=True,
    zero_step_gradient_copy_stages=(1, 2, 3), zero3_step_sub_group_params=1e9,
    moe_scores_after_experts=True, router_input_fp32=True,
    offload_accumulates_on_host=True, offload_staging_buffers=True,
    bucket_params=5e8, bucket_bytes=0.0, reduce_bucket_buffers=2, overlap_param_gather=False,
    # Priced by default as Megatron-DeepSpeed runs the loss (Megatron's vocab-parallel cross-entropy, as
    # BLOOM and the published ZeRO-3 runs trained); the files run the user's train.py, whose loss the
    # case names with training.loss, and launch.sh says which was priced.
    loss="megatron", loss_gradient_bytes=LOSS_GRADIENT_BYTES["megatron"],
    # AutoTP (tensor parallelism without a pipeline) gathers the LM head's output: whole logits on
    # every rank (tests/test_autotp_logits_torch.py); Megatron-DeepSpeed's, with one, keeps them sharded.
    gathers_logits_without_pipeline=True,
    # ... and keeps the input embedding whole on every rank, with a head tied to it; an untied head's
    # weight priced split, as a Hugging Face tp plan splits it (tests/test_autotp_logits_torch.py).
    whole_embedding_without_pipeline=True,
    # ... and all-reduces each column-parallel linear's input gradient in backward: five a Llama layer
    # (tests/test_autotp_logits_torch.py).
    reduces_each_column_linear_input=True,
    # The updated weights gathered after the step one parameter group at a time (runtime/utils.py,
    # all_gather_dp_groups): the one group of the optimizer its ds_config section builds over
    # model.parameters(), as the emitted train.py hands it, the experts in groups of at most 178,956,971
    # elements (moe/utils.py, split_params_into_different_moe_groups_for_optimizer).
    zero_gather_param_groups=1, zero_gather_expert_group_params=178_956_971,
    selective="attention", fused_elementwise=True, fp8_recipe="delayed", quantizer="transformer_engine",
    collective_launch_s=0.0, grouped_gemm_streams=1,
    balance_stages=False, offload_moves_gradients=True, master_copy_kernel=True,
)


def training_rules(training: TrainingSpec, gpu: GPUSpec) -> list[tuple[str, str]]:
    out = []
    if training.precision == "fp16" and fp32_gradients(training):
        out.append(("training.fp32_grads", "DeepSpeed accumulates fp16 gradients in fp16 "
                                           "(data_types.grad_accum_dtype)"))
    if training.precision in ("mxfp8", "nvfp4"):
        out.append(("training.precision", f"DeepSpeed has no {training.precision} of its own (ds_config: fp16, "
                                          "bf16); its fp8 is Transformer Engine's fp8_autocast in the model, "
                                          f"with the recipes {', '.join(SUPPORT.fp8_recipes)}"))
    return out


def rules(job: Job) -> list[tuple[str, str]]:
    lay, training = job.layout, job.training
    if lay.zero_stage == 0 and training.precision in ("bf16", "fp8"):  # fp8: Transformer Engine under bf16
        # Without ZeRO, DeepSpeed picks the optimizer by the model's dtype and the gradients'
        # (runtime/engine.py, _do_optimizer_sanity_check; data_types.grad_accum_dtype defaults to the
        # model's, get_data_types): bf16 gradients run its DDP_BFLOAT16 wrapper, unsharded states as
        # priced; fp32 gradients raise NotImplementedError ("unsupported mix"); and under a pipeline
        # bf16 runs its BF16_Optimizer, which shards the states over the data-parallel ranks as stage 1.
        if fp32_gradients(training):
            return [("layout.zero_stage", "DeepSpeed refuses bf16 weights with fp32 gradients without ZeRO "
                                          "(runtime/engine.py, _do_optimizer_sanity_check: 'unsupported mix'); "
                                          "use zero_stage 1, its BF16_Optimizer")]
        if lay.pp > 1:
            return [("layout.zero_stage", "DeepSpeed's pipeline engine runs bf16 without ZeRO through its "
                                          "BF16_Optimizer, which shards the optimizer states as stage 1 does "
                                          "(runtime/engine.py, _do_optimizer_sanity_check); use zero_stage 1")]
        if not training.master_weights:
            return [("layout.zero_stage", "DeepSpeed keeps bf16 master weights only with ZeRO (runtime/config.py: "
                                          "'Bf16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, "
                                          "or 3'); use zero_stage 1")]
    if job.model.is_moe and job.layout.zero_stage == 3:
        # Priced and written as DeepSpeed-MoE layers, which its engine refuses at stage 3. A model whose
        # own MoE modules ZeRO-3 shards as dense ones, or AutoEP's layers, which it takes there, are
        # another dispatch and another sharding, not priced.
        return [("layout.zero_stage", "DeepSpeed-MoE's layers, as priced and written here, are refused under ZeRO "
                                      "stage 3 (runtime/engine.py: 'Native DeepSpeed MoE is not supported with ZeRO "
                                      "Stage 3. Use AutoEP or choose ZeRO stage 1/2.'); use 1 or 2 (a model's own MoE "
                                      "modules, or AutoEP's, under ZeRO-3 are not priced)")]
    # Without master weights, offloaded: the bf16_optimizer_states the files write make DeepSpeed build its
    # DeepSpeedCPUAdam with bf16 moments itself (runtime/engine.py, _configure_basic_optimizer: "overriding
    # fp32_optimizer_states to False"), as ZeRO-Offload needs for bf16 master weights (stage_1_and_2.py).
    return []


ENGINE = Engine("deepspeed", SUPPORT, BEHAVIOUR, rules, emitter="planner.engines.deepspeed.emit", training_rules=training_rules,
                reader="planner.engines.deepspeed.read", reader_options=("pp", "tp", "micro_batch_size", "recompute", "ep",
                                                                      "stage_layers"), title="DeepSpeed")
