"""torchtitan: what it runs and how.

- Choices (``torchtitan/distributed/parallel_dims.py``, ``config``): FSDP2 sharding (ZeRO-3)
  or replication (ZeRO-0), TP with sequence parallelism on the norms or without it
  (``parallelism.enable_sequence_parallel``, on by default), PP with
  interleaved schedules of any contiguous model chunks (module_fqns_per_model_part; its own
  default split leaves the first and last one layer short) and any micro-batch count that torch's
  ScheduleInterleaved1F1B's max(1, m // pp) rounds divide, CP (whose ranks always join the FSDP shard
  mesh), expert parallelism (``parallelism.expert_parallel_degree``) over whole experts (without
  it, the experts split over the TP ranks as the attention is),
  selective (op-level) and full activation checkpointing of every layer; bfloat16 or
  float32 parameters (fp8, MXFP8 and NVFP4 GEMMs through torchao's converters; fp8 row-wise by
  default), gradients reduced in float32; CPU offload of
  parameters, gradients and the optimizer step together (``training.enable_cpu_offload``).
- Behaviour: each block and the loss compiled (fused element-wise kernels; compile.components
  defaults to ["model", "loss"], and the emitted config enables compile), attention through SDPA,
  op-level selective checkpointing, float32 gradient reduction (``mixed_precision_reduce``),
  torchao's quantizers (each use cast from bf16, bf16 inputs saved), even layer splits.
"""

from __future__ import annotations

from cost_models.activations import loss_chunks
from cost_models.behaviour import EngineBehaviour
from cost_models.specs import GPUSpec, Job, ModelSpec, TrainingSpec

from planner.engines.base import Engine, EngineSupport

SUPPORT = EngineSupport(
    zero_stages=(0, 3), max_zero_with_pp=3, interleaving=True, context_parallel=True,
    sequence_parallel=(True, False), recompute=("none", "selective", "full"), partial_recompute=False,
    cp_shards_states=True, expert_tp="tp_without_ep", optimizer_offload="all", optimizer_offload_zero=(3,),
    param_offload=True, offload_together=True,
    # torchtitan 0.3.0's Float8LinearConverter.Config.recipe_name: Literal["rowwise",
    # "rowwise_with_gw_hp"] = "rowwise" (components/quantization/float8.py).
    fp8_recipes=("rowwise", "rowwise_with_gw_hp"), fp8_param_gather=False, expert_dispatches=("all_to_all",),
    pure_bf16=False, chunked_loss=True,
    fused_attention=(False,),
    why=(("fused_attention", "torchtitan's attention is PyTorch's scaled_dot_product_attention (or flex "
                             "attention), priced as a FlashAttention-2-class kernel; no config key selects cuDNN's"),
         ("pure_bf16", "torchtitan builds its models in float32, which FSDP2 keeps as the sharded master "
                       "(training.mixed_precision_param is the dtype the GEMMs read)"),
         ("fp8_recipe", "torchtitan's Float8LinearConverter takes recipe_name"),
         ("expert_dispatch", "the torchtitan config written here keeps the model registry's all-to-all token "
                             "dispatcher (DeepEPTokenDispatcher is a model_spec choice it does not write): its "
                             "dispatch is"),
         ("fp8_param_gather", "torchtitan's float8 converter has no float8 all-gather (row-wise scaling "
                              "gathers bf16 weights)"),
         ("expert_tp", "torchtitan splits the routed experts over the TP ranks where expert parallelism is off "
                       "(etp = tp: models/common/moe_sharding.py, expert_param_placement_dense) and runs them whole "
                       "where it is on (etp 1), FSDP-sharded over the ranks it leaves (ParallelDims: efsdp = "
                       "dp_shard·cp·tp / ep)"),
         ("zero_stages", "torchtitan shards with FSDP2 (zero_stage 3) or replicates (zero_stage 0: FSDP2 over a "
                         "shard group of one, models/llama3/parallelize.py)"),
         ("partial_recompute", "torchtitan's full activation checkpointing wraps every layer"),
         ("cp_shards_states", "torchtitan folds context-parallel ranks into its FSDP mesh: cp > 1 needs "
                              "zero_stage 3"),
         ("offload_together", "torchtitan's training.enable_cpu_offload (FSDP2 CPUOffloadPolicy) moves the "
                              "parameters, gradients and the optimizer step to the CPU together"),
         ("activation_offload", "torchtitan has no activation offload")),
)

BEHAVIOUR = EngineBehaviour(
    name="torchtitan", fp32_grads_for_bf16=True, fused_elementwise=True, compiled_loss=True, zero3_root_unit=False,
    # models/*/config_registry.py: loss=ChunkedLossWrapper.Config(...), num_chunks 8 (components/loss.py).
    loss_chunks=8,
    # At tp > 1 the loss is _LossParallelCrossEntropy (components/loss.py), whose backward holds three
    # fp32 tensors of the local logits beside the saved log-probs (``activations._per_logit_gradient_bytes``).
    tp_loss_gradient_bytes=12.0,
    fsdp_always=True, pp_unsharded_accumulation=True, gradient_bucket_copy=False,
    collective_launch_s=0.0,
    balance_stages=False, fp8_recipe="rowwise", quantizer="torchao", fused_qkv=True, moe_scores_after_experts=True,
    # distributed/pipeline_parallel.py builds torch's ScheduleInterleaved1F1B with local_batch_size //
    # pipeline_parallel_microbatch_size micro-batches, checking only that the micro-batch divides the batch.
    interleaving_rounds=True,
    # Context parallelism gathers K and V whole before the attention and reduce-scatters their gradients
    # after it (``stage_time.cp_torch_collectives``): torchtitan 0.3.0's registries build FlexAttention
    # (models/*/__init__.py model_registry, attn_backend "flex"; the emitter pins it with cp) and its
    # default spmd_types backend takes K/V Replicate on cp (models/common/decoder_sharding.py), as
    # partial_dtensor's apply_cp_to_forward does through torch's flex_cp_allgather. torch's ring
    # attention (rotate methods) runs only for SDPA: a 0.2 job file's (``TrainingSpec.cp_exchange``).
    cp_exchange="kv_gather",
)

PARAM_PRECISIONS = ("bf16", "fp32", "fp8", "mxfp8", "nvfp4")
# Its MXFP8 and NVFP4 converters need SM100 (has_cuda_capability(10, 0)): CUDA Blackwell, not ROCm.


def training_rules(training: TrainingSpec, gpu: GPUSpec) -> list[tuple[str, str]]:
    if training.precision not in PARAM_PRECISIONS:
        return [("training.precision", f"torchtitan's mixed precision takes bfloat16 or float32 parameters, "
                                       f"not {training.precision}")]
    if training.precision != "fp32" and training.fp32_grads is False:
        return [("training.fp32_grads", "torchtitan reduces gradients in float32 only "
                                        "(training.mixed_precision_reduce)")]
    out = []
    if training.optimizer not in ("adam", "adamw"):
        # OptimizersContainer._resolve_optimizer_factory (components/optimizer/optimizer.py): Adam, AdamW and
        # DistMuon; the files written here keep the base config's AdamW, whose states the plan would not price.
        out.append(("training.optimizer", f"torchtitan builds Adam, AdamW or DistMuon "
                                          f"(components/optimizer/optimizer.py), not {training.optimizer}"))
    if not training.flash_attention:
        # ScaledDotProductAttention tries cuDNN's and FlashAttention's kernels before the math one
        # (models/common/attention.py): the scores are not kept, which flash_attention false prices.
        out.append(("training.flash_attention", "torchtitan's attention is PyTorch's scaled_dot_product_attention, "
                                                "which runs cuDNN's or FlashAttention's kernel (models/common/"
                                                "attention.py): no config key keeps the scores"))
    if training.precision in ("mxfp8", "nvfp4") and "nvfp4" not in gpu.block_scaling:
        # MXFP8LinearConverter / NVFP4LinearConverter check has_cuda_capability(10, 0): NVIDIA
        # Blackwell, whose tensor cores are the ones that scale NVFP4 blocks (CDNA4 scales MX only).
        out.append(("training.precision", f"torchtitan's {training.precision} converter needs an NVIDIA "
                                          f"Blackwell GPU (SM100), not {gpu.name}"))
    return out


def model_rules(model: ModelSpec) -> list[tuple[str, str]]:
    out = []
    if model.dropout:
        # Its decoder layers have no dropout (models/llama3, models/common): the masks are not saved.
        out.append(("model.dropout", f"torchtitan's models train without dropout, not {model.dropout:g}: "
                                     "set model.dropout 0"))
    if model.mtp_layers and model.attention_type != "mla":
        # torchtitan 0.3.0 builds multi-token prediction for its DeepSeek-V3 models only
        # (models/deepseek_v3/mtp.py ``MTPDecoder``).
        out.append(("model.mtp_layers", "torchtitan builds multi-token prediction modules for its DeepSeek-V3 "
                                        "models only (models/deepseek_v3/mtp.py)"))
    if model.moe_capacity_factor is not None:
        # Its token dispatch is dropless (models/common/token_dispatcher.py); the only capacity it
        # knows is HybridEP's non-blocking buffer fraction, no per-expert capacity factor.
        out.append(("model.moe_capacity_factor", "torchtitan's expert dispatch is dropless: it pads and drops no "
                                                 "tokens to a capacity factor; drop model.moe_capacity_factor"))
    return out


def rules(job: Job) -> list[tuple[str, str]]:
    lay, training = job.layout, job.training
    out = []
    if job.model.num_kv_heads % lay.tp:
        # models/common/decoder.py: "tensor_parallel_degree must divide n_kv_heads" (no KV-head replication
        # across TP ranks, which Megatron's grouped-query attention does)
        out.append(("layout.tp", f"torchtitan's tensor parallelism must divide the {job.model.num_kv_heads} key-value "
                                 f"heads (models/common/decoder.py), got tp {lay.tp}"))
    shard = lay.dp if lay.zero_stage == 3 else 1
    if lay.ep > 1 and (shard * lay.cp * lay.tp) % lay.ep:
        out.append(("layout.ep", f"torchtitan's expert parallelism borrows ranks from FSDP and TP only: ep must "
                                 f"divide dp_shard·cp·tp = {shard}·{lay.cp}·{lay.tp} (ParallelDims: efsdp = "
                                 "dp_shard·cp·tp / ep); replicated (zero_stage 0) data parallelism lends none"))
    elif lay.ep > 1 and lay.zero_stage == 0 and lay.ep != lay.cp * lay.tp:
        # ParallelDims.build_mesh: efsdp = dp_shard·cp·tp / ep, and apply_fsdp_to_decoder shards the experts
        # over it (models/*/parallelize.py edp_mesh) even where the rest is replicated: HSDP for the experts.
        out.append(("layout.ep", f"torchtitan shards the experts over efsdp = cp·tp / ep = {lay.cp * lay.tp // lay.ep} "
                                 "ranks even where it replicates the rest (zero_stage 0: ParallelDims, "
                                 "apply_fsdp_to_decoder), which the cost model does not price: at zero_stage 0 "
                                 f"ep must be cp·tp = {lay.cp * lay.tp}"))
    if job.model.mtp_layers:
        # torchtitan 0.3.0's Config refuses multi-token prediction with PP or CP.
        if lay.pp > 1:
            out.append(("layout.pp", "torchtitan's multi-token prediction does not support pipeline parallelism "
                                     "(MTPDecoder.Config: NotImplementedError)"))
        if lay.cp > 1:
            out.append(("layout.cp", "torchtitan's multi-token prediction does not support context parallelism "
                                     "(MTPDecoder.Config: NotImplementedError)"))
    if lay.pp > 1:
        out += _schedule_rules(job.num_microbatches, lay.pp, lay.vpp)
    # trainer.py: the sequence divides by tp (with sequence parallelism) times 2·cp (with context parallelism).
    sp = lay.tp if lay.sequence_parallel else 1
    divisor = sp * (2 * lay.cp if lay.cp > 1 else 1)
    if training.seq_len % divisor:
        out.append(("training.seq_len", f"torchtitan needs seq_len divisible by "
                                        f"{'tp·' if sp > 1 else ''}2·cp = {divisor} (trainer.py)"
                    if lay.cp > 1 else f"torchtitan needs seq_len divisible by tp = {divisor} (trainer.py)"))
    chunks = loss_chunks(job.model, training)
    if chunks > 1 and training.seq_len % (lay.cp * chunks):
        # ChunkedLossWrapper.__call__: torch._check(seq_len % num_chunks == 0) on each rank's sequence.
        key = "layout.cp" if training.seq_len % chunks == 0 else \
            "training.loss_chunks" if training.loss_chunks else "training.seq_len"
        out.append((key, f"torchtitan's chunked loss splits each rank's sequence (seq_len / cp = "
                    f"{training.seq_len}/{lay.cp}) into {chunks} equal chunks (components/loss.py, "
                    f"ChunkedLossWrapper): it must divide"))
    return out


def _schedule_rules(microbatches: int, pp: int, vpp: int) -> list[tuple[str, str]]:
    """What torch's pipeline schedules (torch.distributed.pipelining.schedules, which torchtitan's
    build_pipeline_schedule builds with the step's micro-batches) refuse when the trainer starts:
    Schedule1F1B fewer micro-batches than stages. (ScheduleInterleaved1F1B, its "flex_pp", runs
    the micro-batches in max(1, m // pp) rounds and refuses an m they do not divide: ``Job``, by
    ``EngineBehaviour.interleaving_rounds``, cost_models.pipeline.interleaving_refusal; torchtitan's
    build_pipeline_schedule only warns of fewer micro-batches than virtual stages.)"""
    if vpp == 1 and microbatches < pp:
        return [("layout.micro_batch_size", f"torchtitan's 1F1B schedule needs at least as many micro-batches per "
                                            f"step as pipeline stages (torch's Schedule1F1B: ValueError), got "
                                            f"{microbatches} for pp {pp}: a smaller micro-batch makes more")]
    return []


# Its reader (read.py) takes no options: a torchtitan job states every degree, the micro-batch and the
# checkpointing, or leaves them to torchtitan's defaults.
def case_rules(training: TrainingSpec, model: ModelSpec) -> list[tuple[str, str]]:
    """What no layout meets: a recipe the experts' converter does not run."""
    out = []
    # The base config the emitted files build the model on (emit.base_config) holds RoPE tables for at
    # most max_seq_len tokens (models/{llama3,qwen3,deepseek_v3,gpt_oss}/__init__.py; models/common/
    # decoder.py refuses a longer sequence): refused here, before the search, as --emit refuses it, so
    # that plan never picks a layout whose files it would then not write.
    from .emit import ROPE_MAX_SEQ_LEN, base_config
    (module, function), _ = base_config(model)
    limit = ROPE_MAX_SEQ_LEN.get(module)
    if limit is not None and training.seq_len > limit:
        out.append(("training.seq_len", f"{training.seq_len} is past the {limit} tokens torchtitan's {module} "
                                        f"models' RoPE holds (max_seq_len; models/common/decoder.py refuses a "
                                        f"longer training sequence): the base config {function} would not start"))
    if model.mtp_layers and ((training.loss_chunks or 1) > 1 or training.chunked_loss):
        out.append(("training.loss_chunks" if (training.loss_chunks or 1) > 1 else "training.chunked_loss",
                    "torchtitan trains multi-token prediction with MTPLoss, which runs on whole logits "
                    "(models/deepseek_v3/mtp.py): no chunks"))
    chunks = loss_chunks(model, training)
    if training.seq_len % chunks:
        out.append(("training.loss_chunks" if training.loss_chunks else "training.seq_len",
                    f"torchtitan's chunked loss splits the sequence ({training.seq_len}) into {chunks} equal chunks "
                    f"(components/loss.py, ChunkedLossWrapper): it must divide"
                    + ("" if training.loss_chunks else "; or set training.loss_chunks")))
    if model.is_moe and training.precision == "nvfp4":
        # components/quantization: MXFP8 has a grouped-experts converter, NVFP4 none: the experts would train
        # in bf16. Refused before the search (it was planned, and compared with the other engines, then
        # refused by --emit).
        out.append(("training.precision", "torchtitan has no NVFP4 converter for the experts' grouped GEMMs "
                                          "(components/quantization): they would train in bf16, priced in NVFP4"))
    if model.is_moe and training.precision == "fp8" and training.fp8_recipe == "rowwise_with_gw_hp":
        # components/quantization/float8.py: Float8GroupedExpertsConverter.Config has no field, and quantizes
        # the grouped experts with Float8TrainingOpConfig() ("dynamic float8 rowwise"): their weight gradients
        # run in fp8, which this recipe prices in bf16 (kernels: wgrad_low false).
        out.append(("training.fp8_recipe", "torchtitan's fp8 converter for the experts' grouped GEMMs takes no "
                                           "recipe and runs them row-wise, weight gradients in fp8 "
                                           "(components/quantization/float8.py): rowwise_with_gw_hp would be "
                                           "priced with them in bf16; give rowwise"))
    return out


ENGINE = Engine("torchtitan", SUPPORT, BEHAVIOUR, rules, emitter="planner.engines.torchtitan.emit",
                training_rules=training_rules, model_rules=model_rules, case_rules=case_rules,
                reader="planner.engines.torchtitan.read", title="torchtitan")
