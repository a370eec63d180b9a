"""How a training engine runs a layout: the facts the cost models read, as data.

The step-time and memory models never test an engine's name: a job's
``TrainingSpec.engine`` is an :class:`EngineBehaviour`, and the models read its fields.
Each engine's own behaviour is declared with what it can express, its emitter and its
reader, in one module of ``planner/engines/``; the defaults here are those of no engine in
particular (plain PyTorch), :data:`GENERIC`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .frozen import cached_hash, state_without_hash

QUANTIZERS = ("transformer_engine", "torchao")
# The ZeRO stages whose weights come out of a sharded optimizer or a sharded gather, the only ones
# that can gather quantized weights (Megatron's --fp8-param-gather needs the distributed optimizer
# or Megatron-FSDP: megatron/training/arguments.py).
QUANTIZED_GATHER_ZERO_STAGES = (1, 3)

# The cross-entropies a case can name (``training.loss``) on whole logits, uncompiled, and the bytes
# each holds per logit beside its saved fp32 softmax at its peak (``activations.loss_gradient_bytes``):
# Megatron's ``vocab_parallel_cross_entropy`` (megatron.core.tensor_parallel) writes the gradient into
# the saved softmax and hands back a 16-bit copy, 2; eager PyTorch's ``F.cross_entropy`` on fp32
# logits (Hugging Face's ``ForCausalLMLoss`` upcasts them) holds the fp32 gradients of the
# log-softmax and of the logits at once, 4 + 4 (measured: tests/test_eager_loss_torch.py).
LOSS_GRADIENT_BYTES = {"megatron": 2.0, "eager": 8.0}
LOSSES = tuple(LOSS_GRADIENT_BYTES)

# The context-parallel K/V exchanges ``EngineBehaviour.cp_exchange`` and ``TrainingSpec.cp_exchange`` name.
CP_EXCHANGES = ("p2p", "kv_gather", "allgather", "alltoall")


# DeepEP's NVLink peers: its Buffer joins at most this many consecutive ranks of its group over NVLink and
# the rest as RDMA ranks (csrc/kernels/configs.cuh:3, NUM_MAX_NVL_PEERS 8; csrc/deep_ep.cpp:160,
# num_rdma_ranks = max(1, num_ranks / NUM_MAX_NVL_PEERS), at eb9cee7, the commit megatron-core 0.16.1's
# docker/Dockerfile.ci.dev installs).
DEEPEP_NVL_PEERS = 8


@dataclass(frozen=True)
class EngineBehaviour:
    __hash__ = cached_hash
    __getstate__ = state_without_hash

    name: str = "any"
    # The vocabulary the engine builds its embedding, LM head and logits for: the model's padded up
    # to a multiple of this × tp (:func:`cost_models.parameters.padded_vocab`), or as it is (None).
    # Megatron-LM pads to --make-vocab-size-divisible-by (128) × tp (``_vocab_size_with_padding``,
    # megatron/training/tokenizer/tokenizer.py), nanotron to its make_vocab_size_divisible_by (1) × tp
    # (``trainer.py``, ``init_model``); torchtitan, DeepSpeed's Hugging Face models and plain PyTorch
    # build what the model's config says.
    vocab_padding_multiple: Optional[int] = None
    # ZeRO-3 gathers the weights once more for the recompute forward inside backward.
    # ZeRO-3 collectives per layer and pass: FSDP gathers a wrapped transformer block at once;
    # DeepSpeed gathers each submodule's parameters on its own (QKV, projection, two MLP
    # matrices and two norms in a GPT layer: ``all_gather_coalesced`` per module).
    zero3_collectives_per_layer: int = 1
    # ZeRO-3 units copied through flat buffers around each collective, PyTorch FSDP2's way
    # (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``): the shards into the
    # all-gather's input and the gathered unit out to its parameters (``foreach_all_gather``,
    # ``split_with_sizes_copy``), the unit's gradients into the reduce-scatter's input
    # (``chunk_cat``) and the reduced shard into the sharded gradient. DeepSpeed and Megatron
    # gather into buffers their parameters are views of.
    zero3_unit_copies: bool = True
    # The ZeRO-3 unit a pass starts and ends with (:func:`dp_time.first_unit_parameters`): a
    # plain FSDP model's root unit holds everything outside its wrapped blocks, the input
    # embedding, the final norm and the LM head together; torchtitan wraps the embedding on its
    # own (``distributed/fsdp.py``: ``fully_shard(model.tok_embeddings)``, then ``[norm, lm_head]``;
    # tied, all three in one unit), and DeepSpeed gathers the embedding module on its own.
    zero3_root_unit: bool = True
    # Gathered ZeRO-3 weights resident at once. None: whole units, the one running and the one
    # prefetched (FSDP). DeepSpeed gathers each submodule on its own, prefetching while fewer than
    # ``stage3_max_live_parameters`` are gathered and fetching a module's own whatever is live
    # (``zero/partitioned_param_coordinator.py``): the cap overshot by the largest module
    # (``memory.zero3_gather_bytes``); its prefetch bucket (in units of h²) is what the emitter writes.
    zero3_max_live_parameters: Optional[float] = None
    zero3_prefetch_bucket_h2: float = 0.0
    # How many parameters DeepSpeed looks ahead in its trace before it releases a submodule's gathered
    # weights (``stage3_max_reuse_distance``, DeepSpeedZeroConfig's default 1e9;
    # ``zero/partitioned_param_coordinator.py``, ``__params_to_release``): under full recomputation a
    # weight whose backward use lies further than this from its recompute is gathered again
    # (:func:`dp_time.regathered_parameters`). None: a unit stays gathered from its recompute through its
    # backward (FSDP recomputes inside the unit its pre-backward hook gathered).
    zero3_max_reuse_distance: Optional[float] = None
    # Megatron-FSDP prefetches whole units until this many of their parameters (a rank's) are in
    # flight beyond the running one, or one unit where a unit holds more (``megatron_fsdp.py``:
    # suggested_AG_prefetch_size = max(1e9, 2 units) // 2; ``param_and_grad_buffer.py``, the
    # all-gather pipeline's prefetch loop); None: one unit (FSDP2's). And it gathers the modules
    # outside its units (the embedding, the final norm and the LM head) in their pre-forward and
    # releases them only when the backward's gradient sync is done (only units are resharded after
    # their forward: ``megatron_fsdp.py``, ``_post_forward``, ``finish_grad_sync``).
    zero3_prefetch_params: Optional[float] = None
    zero3_edges_gathered: bool = False
    # From this ZeRO stage on, weight gradients are not fused into the gradient buffer: each weight's
    # 16-bit gradient is written on its own and copied in (Megatron-FSDP, which the emitted files run
    # with --no-gradient-accumulation-fusion: ``tensor_parallel/layers.py``, ``megatron_fsdp.py``
    # ``_grad_acc``), the LM head's while the loss's gradients are live (``memory.stage_memories``).
    unfused_weight_gradients_from_zero: Optional[int] = None
    # Interleaved pipelines post the next chunk's send/receive before computing the current
    # one (Megatron-core ``overlap_p2p_comm``, on unless --no-overlap-p2p-communication;
    # ``pipeline_parallel/schedules.py``).
    p2p_overlap_interleaved: bool = False
    # Each send and each receive of a pipeline step is a blocking call of its own, one after the
    # other, so a micro-batch's activation and gradient never cross a boundary at the same time:
    # DeepSpeed's ``TrainSchedule.steps`` (``runtime/pipe/schedule.py``) puts two transfers in each
    # step (SendGrad and RecvActivation in a forward step, RecvGrad and SendActivation in a backward
    # one) and ``p2p.send``/``p2p.recv`` issue each as a blocking ``dist.send``/``dist.recv``, as in
    # 2022 (then RecvActivation before SendGrad). Megatron and torch's pipelining post a step's send
    # and receive together (``batch_isend_irecv``).
    p2p_serial: bool = False
    # The interleaved schedule is torch's ScheduleInterleaved1F1B (``torch/distributed/pipelining/
    # schedules.py``, "flex_pp"): it runs the micro-batches in max(1, m // pp) rounds, any m those
    # divide (pipeline.interleaving_refusal, pipeline.microbatches_per_round); else groups of pp,
    # which pp must divide (megatron-core's default microbatch_group_size_per_vp_stage).
    interleaving_rounds: bool = False
    # The pipeline reduces data-parallel gradients only after the last micro-batch, with
    # nothing to overlap: DeepSpeed's ``TrainSchedule`` ends every step with ReduceTiedGrads,
    # ReduceGrads, OptimizerStep (``deepspeed/runtime/pipe/schedule.py``).
    reduce_after_pipeline: bool = False
    # Without ZeRO, the gradients are all-reduced once the last backward is done, nothing left to hide
    # them behind: DeepSpeed's engine at stage 0 (``runtime/engine.py``: ``allreduce_gradients`` →
    # ``buffered_allreduce_fallback`` at the accumulation boundary, after ``loss.backward()``).
    zero0_reduce_after_backward: bool = False
    # At ZeRO 1 and 2, each gradient bucket all-reduced whole and each rank keeping its own slice, not
    # reduce-scattered: DeepSpeed 0.19's ``average_tensor`` (``runtime/zero/stage_1_and_2.py``) puts every
    # slice of a bucket under one ("allreduce", process_group) key while ``use_multi_rank_bucket_allreduce``
    # is true (its default, ``runtime/zero/config.py``), and ``allreduce_and_scatter`` → ``allreduce_bucket``
    # all-reduces them together; ``reduce_scatter: false`` takes ``gradient_reduction_w_predivide``, an
    # all-reduce too. The experts' buckets likewise, over their expert_dp_process_group. Twice the bytes
    # of a reduce-scatter on a ring (2(n−1)/n of the bucket against (n−1)/n); the bucket's memory is the same.
    zero12_bucket_all_reduce: bool = False
    # Bytes a gradient takes on the data-parallel reduction's wire where the engine casts each bucket
    # to a dtype of its own before reducing it (:func:`model_states.reduced_gradient_bytes`); 0: the
    # gradients' own dtype. DeepSpeed's communication_data_type, which the ds_config reader sets
    # (planner/engines/deepspeed/read.py, ``communication_bytes``); the emitter writes it as priced.
    gradient_wire_bytes: float = 0.0
    # Gradients of bf16 training accumulated and reduced in fp32 unless told otherwise:
    # torchtitan's FSDP2 reduces in float32 (``torchtitan/config/configs.py``,
    # mixed_precision_reduce). Megatron-core's DistributedDataParallelConfig reduces in the
    # parameters' dtype (grad_reduce_in_fp32 = False), as NeMo's and Megatron-Bridge's
    # performance recipes and MLPerf's run; Megatron-LM's own pretrain script turns fp32 on
    # for bf16 unless --grad-reduce-in-bf16 (a case says fp32_grads: true for it).
    fp32_grads_for_bf16: bool = False
    # Without fp32 master weights (``TrainingSpec.master_weights`` false) the optimizer still keeps
    # a master partition of its own, in bf16, beside the bf16 weights: DeepSpeed's
    # bf16_master_weights_and_grads with bf16_optimizer_states (``runtime/zero/stage_1_and_2.py``:
    # its master partition in ``master_weights_and_grads_dtype``). Else the weights are the master.
    bf16_master_partition: bool = False
    # PyTorch DDP copies each gradient into its flat all-reduce buckets and keeps both unless
    # ``gradient_as_bucket_view=True`` (off by default; torch.nn.parallel.DistributedDataParallel:
    # "the saved memory size will be equal to the total gradients size"): one more copy of the
    # gradients in the parameters' dtype wherever DDP runs, ZeRO 0 and 1 (ZeroRedundancyOptimizer,
    # nanotron's ZeRO-1) over more than one replica (``model_states.bucket_copy_bytes``).
    # Megatron's and DeepSpeed's gradients live in the buffers they reduce.
    gradient_bucket_copy: bool = True
    # ZeRO-3 that shards the fp32 parameters themselves: PyTorch's FSDP2 keeps each sharded
    # parameter in the dtype the model was built in (``FSDPParam.orig_dtype``: fp32 in
    # torchtitan) and casts to the mixed-precision policy's param_dtype only for the all-gather;
    # the reduce-scattered gradient is cast back to that dtype (``_fully_shard/_fsdp_param.py``,
    # ``_fsdp_collectives.py``); FSDP1 likewise keeps the fp32 flat shard and casts a 16-bit
    # copy for each gather. The fp32 shard is the master the optimizer steps, and no 16-bit copy
    # is held between gathers (``model_states.state_bytes``). DeepSpeed's ZeRO-3 and Megatron's
    # distributed optimizer hold 16-bit weight shards beside an fp32 master.
    sharded_master_weights: bool = True
    # FSDP2 whatever the data-parallel degrees: torchtitan 0.3.0 applies fully_shard at every one
    # (models/llama3/parallelize.py: "Always run apply_fsdp_to_decoder -- with shard_degree=1 it is a
    # no-op for the all-gather but still installs the MixedPrecisionPolicy"; ParallelDims._mesh_exist
    # keeps the fsdp mesh at degree 1), replicated data parallelism (zero_stage 0) being HSDP over a
    # shard group of one: the states are FSDP2's at any ZeRO stage (the fp32 master held, 16-bit
    # weights only gathered unit by unit, no DDP buckets), and the gradients are reduced after every
    # micro-batch's backward, its train step never turning their sync off (trainer.py).
    fsdp_always: bool = False
    # Under pipeline parallelism FSDP2 accumulates the micro-batches' gradients unsharded, in the
    # reduce dtype, and keeps each unit gathered after its backward: torch.distributed.pipelining's
    # stage sets requires_gradient_sync and reshard_after_backward False for every backward and
    # reduces once, after the last (torch 2.13 distributed/pipelining/stage.py:
    # backward_maybe_with_nosync, perform_reduce_grad; _fully_shard/_fsdp_param.py:
    # to_accumulated_grad_if_needed).
    pp_unsharded_accumulation: bool = False
    # HBM traffic per parameter, each micro-batch, with which the engine folds the backward's 16-bit
    # gradients into its fp32 gradients at ZeRO 0-1, outside the weight-gradient GEMMs
    # (``stage_time.gradient_accumulation_time``). DeepSpeed's BF16_Optimizer: ``clear_lp_grads``
    # zeroes the bf16 gradients (2 bytes written), ``update_hp_grads`` casts each to a fresh fp32
    # tensor (2 read, 4 written) and adds it to the fp32 buffer (8 read, 4 written): 20, as the
    # configs `diagnose` reads run it (BLOOM's among them). With ``bf16.immediate_grad_update``,
    # which the emitted configs set for its memory (``accumulate_hp_grads_and_remove_lp`` frees each
    # bf16 gradient once folded), the zeroing goes: 18, 2 bytes a parameter under the 20 priced.
    # Megatron accumulates into main_grad inside the wgrad GEMM (gradient_accumulation_fusion): 0.
    fp32_accumulation_bytes: float = 0.0
    # Bytes per parameter the optimizer step holds beside the model states at ZeRO 0 with 16-bit
    # gradients (``memory.step_gradient_copy_bytes``): DeepSpeed's FP16_Optimizer (fp16, or bf16 with
    # no pipeline: ``runtime/engine.py`` ``_do_optimizer_sanity_check``, FP16 and DDP_BFLOAT16) casts
    # every gradient of a group to fp32 and flattens the copies into one fp32 buffer before it frees
    # the 16-bit ones (``runtime/fp16/fused_optimizer.py``, ``step``): 4 + 4. Megatron's
    # Float16OptimizerWithFloat16Params gives every fp32 master an fp32 copy of its bf16 main_grad
    # (``optimizer/optimizer.py``, ``_copy_model_grads_to_main_grads``: ``main_grad.float()``), freed by
    # the next step's zero_grad: 4.
    step_gradient_copy_bytes: float = 0.0
    # Bytes per parameter of a rank's optimizer partition that the sharded step (at the ZeRO stages of
    # ``zero_step_gradient_copy_stages``) copies its 16-bit gradient partition into before the optimizer
    # runs (``memory.step_gradient_copy_bytes``): DeepSpeed's DeepSpeedZeroOptimizer flattens it (2)
    # and casts the flat copy to fp32 (4), group by group (``runtime/zero/stage_1_and_2.py``, ``step``),
    # having freed a rank's gradients outside its partition (``step_frees_unpartitioned_gradients``);
    # Megatron's distributed optimizer gives each fp32 shard an fp32 copy of its bf16 main_grad (4,
    # ``optimizer/distrib_optimizer.py``: ``shard_main_param.grad = shard_model_grad.float()``), its
    # gradient buffer kept whole. With fp32 accumulation the partition is fp32 already, and an
    # offloaded optimizer steps on the host: no copy.
    zero_step_gradient_copy_bytes: float = 0.0
    zero_step_gradient_copy_stages: tuple[int, ...] = (1, 2)
    step_frees_unpartitioned_gradients: bool = False
    # At ZeRO 3 the copy is made sub-group by sub-group, each of at most this many of the partition's
    # parameters (DeepSpeed's ``zero_optimization.sub_group_size``, 1e9 by default: ``zero/config.py``;
    # ``runtime/zero/stage3.py``, ``_prepare_fp32_grad_for_sub_group``); None: the whole partition.
    zero3_step_sub_group_params: Optional[float] = None
    # A flat buffer of every parameter's gradient, in the gradients' dtype, beside the ones autograd
    # writes, at ZeRO 0-1 (``memory.stage_memories``), folded into after each micro-batch's backward
    # (``stage_time.gradient_accumulation_time``: read 2 + 2, write 2, and autograd's zeroed, 2):
    # DeepSpeed's BF16_Optimizer with bf16 accumulation, which a pipeline's bf16 at ZeRO 0 runs
    # (``runtime/bf16_optimizer.py``: fp32_groups_gradients_flat in grad_acc_dtype, whole on every
    # rank; no ZeRO reduction buckets). Set by the reading of such a config (`diagnose`).
    flat_gradient_accumulator: bool = False
    # The optimizer step's passes beyond Adam's own (``model_states.optimizer_step_bytes``): a
    # separate kernel copies the fp32 master into the 16-bit weights, reading it once more
    # (Megatron's ``_copy_main_params_to_model_params``, megatron/core/optimizer/optimizer.py;
    # DeepSpeed's ZeRO-1/2 and BF16_Optimizer copy their fp32 partitions back); FSDP2 casts the
    # fp32 shard in its all-gather instead. And the gradient buffer zeroed each step (Megatron's
    # ``zero_grad_buffer``: a memset of the contiguous buffer), where others set gradients to None.
    master_copy_kernel: bool = False
    zeroes_gradient_buffer: bool = False
    # Gradient bucket of ZeRO 0–2 data parallelism, in parameters (at least), or in bytes, and the
    # parameters it grows by per data-parallel rank (context parallel ranks included). Megatron:
    # max(40 M, 1 M · dp·cp) parameters (``megatron/training/training.py``, get_model's
    # DistributedDataParallelConfig: ``get_data_parallel_world_size(with_context_parallel=True)``);
    # DeepSpeed: reduce_bucket_size 5e8 elements, whatever the dp; PyTorch DDP: bucket_cap_mb = 25 MB.
    bucket_params: float = 0.0
    bucket_params_per_dp_rank: float = 0.0
    bucket_bytes: float = 25 * 2**20
    # Buffers of bucket_params elements each, in the reduction's dtype, that the ZeRO-1/2 optimizer
    # stages its gradient reductions through for the whole step (:func:`memory.reduce_bucket_bytes`):
    # DeepSpeed's stage_1_and_2.py ``setup_buckets`` allocates one per dtype with contiguous_gradients
    # and a second with overlap_comm ("double buffers to avoid data access conflict"); its emitted
    # configs set both, but under a pipeline, whose engine turns overlap_comm off (one buffer there).
    reduce_bucket_buffers: int = 0
    # ZeRO-1/2 weight shards gathered after the optimizer step behind the next forward
    # (Megatron --overlap-param-gather, which NeMo's recipes set; FSDP-style prefetch), not
    # in the open (DeepSpeed's ZeRO-1/2 gathers them before the step returns).
    overlap_param_gather: bool = True
    # ZeRO-1/2 weights gathered after the optimizer step in one all-gather per optimizer parameter group,
    # whatever the bucket sizes (``dp_time.after_step_gather``); 0: one per gradient bucket. DeepSpeed's
    # ZeRO-1/2 optimizer and BF16_Optimizer call ``all_gather_dp_groups`` (``runtime/utils.py``), which on
    # any torch with all_gather_into_tensor (1.13 on) gathers each group's flat 16-bit buffer in one
    # collective and never reads allgather_bucket_size. How many groups is the training script's choice:
    # 1 where the optimizer is DeepSpeed's own, built from the ds_config's ``optimizer`` section over the
    # model_parameters it is handed, which the emitted files' train.py passes as model.parameters() (one
    # list: one group; engine.py ``_configure_basic_optimizer``), as the Hugging Face Trainer does with such
    # a section (integrations/deepspeed.py: ``deepspeed_init`` hands DummyOptim a flat list of the
    # trainable parameters). Without one the Trainer's ``create_optimizer`` makes 2 (trainer.py: weight
    # decay and none, for biases and norms: ``get_decay_parameter_names``), as Megatron-DeepSpeed's
    # ``get_param_groups`` does (megatron/optimizer/__init__.py: wd_no_scale_lr, no_wd_no_scale_lr; the two
    # lr-scaled groups only for a fine-tuning's scale_lr_cond), and the BigScience fork BLOOM ran 3 (its
    # ``_get_params_for_weight_decay_optimization`` halves the decay group, an apex FusedAdam workaround):
    # a collective's latency more or less each, not priced.
    zero_gather_param_groups: int = 0
    # The experts' parameters gathered in groups of their own, whole tensors packed in order up to this
    # many elements a group: DeepSpeed's ``split_params_into_different_moe_groups_for_optimizer``
    # (``moe/utils.py``, max_group_size 178,956,971), which its engine applies to the groups of any model
    # with MoE layers (engine.py ``configure_moe_param_groups``), and the emitted train.py calls itself.
    # 0: the experts' parameters are in the groups above.
    zero_gather_expert_group_params: float = 0.0
    # ZeRO-1 that sends the updated shards to every rank before step() returns, whatever the
    # engine does at ZeRO-2: PyTorch's ZeroRedundancyOptimizer (``_sync_params`` at the end of
    # step(), overlap_with_ddp off by default) and nanotron's ZeroDistributedOptimizer (``step``
    # → ``_all_gather_params``). Plain PyTorch's ZeRO-2 is FSDP's SHARD_GRAD_OP, whose next
    # forward prefetches the gathers. nanotron gathers every updated shard in one coalesced
    # all-gather (``nanotron.distributed.all_gather_coalesced``: one flat buffer, one
    # collective), so it pays the collective's latency once, not once per gradient bucket;
    # ZeroRedundancyOptimizer's per-rank broadcasts move the same bytes in more launches.
    zero1_gather_in_step: bool = False
    # That gather then copies each rank's chunk of every parameter back out of its flat buffer, one
    # copy_ a chunk in a Python loop (nanotron's ``distributed.all_gather_coalesced``,
    # ``update_output``): data-parallel size × parameter tensors copies, each a kernel launch
    # (``Performance.kernel_overhead_s``), before the step returns (``dp_time.gather_copies_time``).
    zero1_gather_copies: bool = False
    # With fp32 gradients at ZeRO-1, one all-reduce of the whole fp32 gradient buffer after the last
    # backward, in the open: nanotron builds no DDP wrapper when it accumulates in fp32 under ZeRO
    # (``trainer.py``, ``make_ddp``), and its trainer all-reduces the accumulator's contiguous buffer
    # (``sync_gradients_across_dp`` with ``reduce_scatter=False``) before the optimizer steps.
    zero1_fp32_reduce_after_backward: bool = False
    # Bytes per logit alive beside the saved log-softmax at the loss's peak
    # (``activations.loss_gradient_bytes``). Eager PyTorch's ``F.cross_entropy`` on upcast logits, 4 + 4:
    # its backward's ``nll_loss_backward`` writes the fp32 gradient of the log-softmax (a dense tensor
    # of the logits' shape), and ``_log_softmax_backward_data`` (aten/src/ATen/native/SoftMax.cpp) writes
    # the fp32 gradient of the logits while that one is still its input; the bf16 cast comes after the
    # first is freed (measured on CPU: tests/test_eager_loss_torch.py). 2 for Megatron's vocab-parallel
    # cross-entropy, which writes the gradient into the saved softmax and hands back a bf16 copy
    # (``LOSS_GRADIENT_BYTES``).
    loss_gradient_bytes: float = LOSS_GRADIENT_BYTES["eager"]
    # The loss of ``LOSSES`` that ``loss_gradient_bytes`` prices, where a case may name the other
    # (``training.loss``: DeepSpeed runs the user's train.py, which runs either); None: the engine's loss
    # is its own and the case names none.
    loss: Optional[str] = None
    # The same bytes where tp > 1 and the engine runs the loss vocab-parallel on its own terms: None, as
    # ``loss_gradient_bytes``. torchtitan 0.3.0 at tp > 1 (any ``parallelism.spmd_backend``: its LM head's
    # logits are vocab-sharded) runs ``_LossParallelCrossEntropy`` (components/loss.py, which replaces
    # torch's ``loss_parallel()``), whose ``backward`` keeps the saved fp32 log-probs and allocates
    # ``zeros_like(log_probs)``, ``exp(log_probs)``, their sum and the product with the loss's gradient,
    # three fp32 tensors of the local logits' shape beside the saved one at its peak: 12 (measured on CPU
    # over gloo groups of two: tests/test_loss_parallel_torch.py). A compiled loss is priced as compiled.
    tp_loss_gradient_bytes: Optional[float] = None
    # Without a pipeline, tensor parallelism gathers the LM head's output: every tensor-parallel rank
    # holds the whole logits and runs the loss on them (``activations.logit_shards``). DeepSpeed 0.19.8's
    # AutoTP training (``runtime/engine.py``, ``_apply_autotp_partitioning``) leaves a model's lm_head
    # whole unless the model's Hugging Face tp plan shards it, and then as ``colwise_rep`` /
    # ``colwise_gather_output``: ``LinearLayer(gather_output=True)``, whose forward all-gathers the
    # vocabulary shards (``module_inject/layers.py``); only ``vocab_parallel_lm_head``, which the files
    # do not write, keeps them sharded. With a pipeline the tensor parallelism is the model's own
    # Megatron-style layers (Megatron-DeepSpeed), whose logits stay vocab-parallel. Measured on CPU over
    # a gloo group of two: tests/test_autotp_logits_torch.py. The gather's time is the last stage's
    # tensor-parallel time (``stage_time.logit_gather_time``): one all-gather of the logits per head and
    # micro-batch in forward, none in backward.
    gathers_logits_without_pipeline: bool = False
    # Without a pipeline, tensor parallelism leaves the input embedding whole on every tensor-parallel
    # rank (``parameters.embedding_shards``), and a head tied to it with it. DeepSpeed 0.19.8's AutoTP
    # training replaces the transformer layers' linears (the heuristic path) or what the model's Hugging
    # Face tp plan names, and Llama-style plans name no embedding: ``embed_tokens`` keeps its V rows
    # (``module_inject/auto_tp.py``), and a head tied to it is left replicated to keep the tie
    # (``_configure_gathered_column_tie_fallbacks``). An untied head is still priced split over tp, as a
    # plan's ``colwise_gather_output`` splits its weight (``LinearLayer``); a model without a plan keeps
    # it whole, which the emitted header says. With a pipeline the tp is Megatron-DeepSpeed's own
    # vocab-parallel layers. Measured on CPU over a gloo group of two: tests/test_autotp_logits_torch.py.
    whole_embedding_without_pipeline: bool = False
    # Without a pipeline, tensor parallelism replaces each column-parallel linear of a layer on its own,
    # and each all-reduces its input's gradient in backward: DeepSpeed 0.19.8's AutoTP training
    # (``module_inject/layers.py``: ``LinearLayer.forward`` wraps its input in ``ColumnParallel``, whose
    # ``backward`` all-reduces it; ``LinearAllreduce``, row-parallel, all-reduces its output in forward
    # and nothing in backward). A Llama layer's backward runs five all-reduces of b·s·h (q, k, v, gate,
    # up), not Megatron's two (``tp_time.column_linear_backward_time``); its forward runs the same two.
    # Measured on CPU over a gloo group of two: tests/test_autotp_logits_torch.py. With a pipeline the
    # tp is Megatron-DeepSpeed's own layers, which reduce once per sub-layer.
    reduces_each_column_linear_input: bool = False
    # The loss compiled by torch.compile (torchtitan's compile.components default ["model",
    # "loss"]): inductor fuses the upcast, log-softmax and NLL, saves the logits at their own
    # width and two fp32 numbers a row, and writes their gradient at that width in one kernel
    # (``activations.saved_logit_bytes``, ``loss_gradient_bytes``).
    compiled_loss: bool = False
    # The sequence chunks the LM head and the loss run in, one after another, during the forward
    # (``activations.chunked_loss``): torchtitan 0.3.0's ChunkedLossWrapper (components/loss.py;
    # every LLM config_registry's loss, ``num_chunks`` 8), which never holds more than a chunk's
    # logits. 1: the LM head runs on the whole sequence and the loss keeps its logits for backward.
    loss_chunks: int = 1
    # What ``recompute: selective`` means (``activations.SELECTIVE_POLICIES``): Megatron's
    # core-attention recomputation, or PyTorch op-level selective checkpointing that keeps
    # attention and every other matmul (torchtitan's default selective mode).
    selective: str = "matmuls"
    # Q, K and V from one linear: torchtitan 0.3.0 builds every llama3, qwen3 and gpt_oss flavour with
    # fuse_qkv=True (models/*/__init__.py), so the "matmuls" policy, which keeps every other matmul's
    # output (distributed/activation_checkpoint.py), keeps K too and recomputes no K projection.
    fused_qkv: bool = False
    # The router's scores multiply the experts' outputs after them, so autograd keeps those outputs for
    # the scores' gradient (``experts.routed_output_bytes``): torchtitan's token dispatcher
    # (models/common/token_dispatcher.py, ``routed_output * top_scores``) and DeepSpeed-MoE
    # (moe/sharded_moe.py ``_sparse_decode``, ``routed * gates``); Megatron applies them inside the
    # activation (``TEGroupedMLP.activation_func_with_probs``) and keeps none.
    moe_scores_after_experts: bool = False
    # The router keeps an fp32 copy of its input for its linear (DeepSpeed-MoE's TopKGate:
    # ``input.float()``), not the 16-bit one (megatron-core's RouterGatingLinearFunction).
    router_input_fp32: bool = False
    # Fused kernels: the vendor's fused attention (Transformer Engine → cuDNN) and fused
    # element-wise kernels (SwiGLU, rotary embeddings: Megatron's fusions, or torch.compile),
    # which also keep fewer tensors for backward (``activations.layer_activations``).
    fused_attention: bool = False
    fused_elementwise: bool = False
    # Mixed precision by ``torch.autocast`` over fp32 weights (PyTorch's AMP recipe; the repo's
    # validation loop under DDP): the residual stream stays fp32 and the norms run in fp32
    # (autocast's fp32 op list), so a norm keeps its input, and a fully recomputed layer its
    # input, in 4 bytes; the linears keep the 16-bit casts of their inputs. Engines that hold
    # 16-bit weights (Megatron, DeepSpeed, FSDP2's mixed precision) keep all of them in 16 bits.
    fp32_residual: bool = False
    # Host time per tensor-parallel collective on the critical path, beyond NCCL's own latency:
    # issuing it from eager Python (autograd functions around torch.distributed calls, stream
    # waits). Fitted to the published runs of the engines that show it (plain PyTorch stacks:
    # the Playbook's nanotron sweep, bench/fit_performance.py h100).
    collective_launch_s: float = 200e-6
    # The least time of a tensor-parallel collective in a pipeline stage whose neighbours are in
    # another NVLink domain: f0 + f1 * (tp - 1) each (``tp_time.cross_domain_pipeline_floor``),
    # with the GPU's work running beneath it. Measured, not derived: in the Playbook's nanotron
    # sweep on 8-GPU EFA nodes, such a stage takes a median 15, 18 and 30 ms a layer and
    # micro-batch at tp 2, 4 and 8 (micro-batches of 1-4; the 1B, 3B and 80B alike), where its GPU
    # work takes 9, 7.5 and 6 ms; with the neighbours on the node, and tensor parallelism without a
    # pipeline on several nodes, it runs at its GPU time (bench/pipeline_floor.py). nanotron's
    # pipeline reads the shape of every tensor it receives on the host (``P2P._recv_meta``:
    # blocking receives, then the metadata read back from the GPU), so a stage cannot issue ahead
    # of its last receive; yet the sweep's excess grows with the stage's layers, linearly and
    # from nearly nought, as a cost per receive would not (bench/pipeline_floor.py, third table),
    # and why it grows with the ranks of each collective is not established. Fitted to that
    # sweep (bench/fit_performance.py h100: 0.75 ms and 0.31 ms, with the host cost above from
    # 300 to 200 us); 0 for the engines that send fixed shapes.
    pipeline_collective_floor_s: float = 0.0
    pipeline_collective_floor_rank_s: float = 0.0
    # The least time of a tensor-parallel collective whose group spans NVLink domains, per rank of
    # the group beyond the first (``tp_time.cross_domain_tp_floor``), with the GPU's work beneath
    # it. Measured, not derived: nanotron's tp 16 and 32 on 8-GPU EFA nodes in the Playbook's sweep
    # run a layer 2-4x slower than NCCL's collectives and the GPU's work account for (fitted by
    # bench/fit_performance.py h100); 0 for the engines without such runs.
    cross_domain_tp_rank_s: float = 0.0
    # The fp8 recipe a job runs when it names none (``cost_models.quantization.FP8_RECIPES``):
    # torchao's Float8LinearConfig() scales per tensor, dynamically.
    fp8_recipe: str = "tensorwise"
    # The library that quantizes the GEMM operands: Transformer Engine writes both layouts of a
    # tensor from one read and keeps its linears' inputs for backward as the quantized copy wgrad
    # reads; torchao casts each use from the bf16 tensor and keeps the bf16 input
    # (``cost_models.quantization``).
    quantizer: str = "torchao"
    # The recipes under which the engine has a quantized linear whose input another op already keeps
    # for backward keep that 16-bit tensor, not a quantized copy of its own: megatron-core's
    # set_save_original_input on the attention's linear_proj (the fused attention keeps its output)
    # and on the shared experts' linear_fc1 (the router keeps the pre-MLP norm's output), for every
    # recipe but delayed scaling (transformer/attention.py, moe/shared_experts.py).
    saves_original_input_recipes: tuple[str, ...] = ()
    # Quantized weights cast once per step and reused by every micro-batch (Transformer Engine's
    # ``is_first_microbatch``, which Megatron passes).
    fp8_weight_cache: bool = False
    # How the local experts' GEMMs run (``kernels.grouped_gemm_time``): 0, one grouped kernel for
    # all of them (torchtitan's ``torch._grouped_mm``); n, one GEMM per expert round-robin on n CUDA
    # streams (Transformer Engine's GroupedLinear: 4; DeepSpeed-MoE's loop over its experts: 1).
    grouped_gemm_streams: int = 0
    # Split pipeline stages by compute where the layout does not say (else evenly), as nanotron
    # does (``cost_models.partition``).
    balance_stages: bool = True
    # The engine takes no split: it cuts the layers by their running cost as nanotron's build_model
    # does (``partition.block_cost_partition``), whatever a layout says (``placement.stage_layers``;
    # ``planner.plan.own_split_note`` says so).
    splits_by_block_cost: bool = False
    # With the whole optimizer offloaded and gradients sharded (ZeRO ≥ 2), the reduced gradient
    # shards go straight to host buffers (DeepSpeed ``stage_1_and_2.py`` with cpu_offload), so
    # the GPU keeps none (``cost_models.offload.gradients_on_host``).
    offload_moves_gradients: bool = False
    # With the optimizer offloaded at ZeRO 1-2 and 16-bit gradient accumulation, the micro-batches'
    # gradients accumulate on the host: each goes out, and from the second on comes back to be added
    # to, through pinned 16-bit host buffers beside the optimizer's fp32 gradient partition
    # (DeepSpeed ``stage_1_and_2.py``: ``offload.gradient_copies``, ``offload.host_gradient_bytes``).
    offload_accumulates_on_host: bool = False
    # With the optimizer offloaded at ZeRO 1-2, its staging buffers: a pinned 16-bit copy of the rank's
    # partition on the host, through which the updated weights return to the GPU
    # (``param_buffer_of_bit16_for_cpu_offload_groups``), and one of the largest parameter's size in
    # 16 bits on the host and another on the GPU for the gradients' copies
    # (``temp_grad_buffer_for_cpu_offload``, ``temp_grad_buffer_for_gpu_offload``): DeepSpeed
    # ``stage_1_and_2.py``, ``__init__`` (:func:`memory.offload_staging_bytes`).
    offload_staging_buffers: bool = False
    # Optimizer offload that keeps fp32 gradient copies for its step: a pinned fp32 host buffer for
    # each offloaded parameter's gradient, and for a partial offload an fp32 copy of each GPU-kept
    # parameter's 16-bit gradient on the GPU, never freed (megatron-core
    # ``optimizer/cpu_offloading/hybrid_optimizer.py``, ``_set_sub_optimizer_grads``:
    # ``cpu_copy_map_grad``, ``fp32_param.grad = grad.to(fp32)``; ``DistributedOptimizer.zero_grad``
    # clears neither) (:func:`memory.offload_gradient_copies`).
    offload_fp32_gradient_copies: bool = False

    # Expert-parallel dispatch that sends a token once to each NVLink domain holding one of its
    # experts and forwards it inside the domain over NVLink (DeepEP's and HybridEP's kernels, the
    # flex token dispatcher of megatron-core), rather than once per expert
    # (``experts.dispatch_combine_time``).
    hierarchical_dispatch: bool = False
    # The ranks that dispatch treats as NVLink peers, wherever it runs (``training.expert_dispatch: deepep``
    # too); the rest of its group it reaches through the NICs, whatever NVLink joins
    # (``experts.dispatch_links``). DeepEP's, as megatron-core (transformer/moe/fused_a2a.py, get_buffer:
    # ``Buffer(group, num_nvl_bytes, num_rdma_bytes)``) and NeMo AutoModel (components/moe/megatron/fused_a2a.py)
    # build its Buffer: :data:`DEEPEP_NVL_PEERS`, with ``allow_mnnvl`` left False, which exports
    # NVSHMEM_DISABLE_MNNVL=1 (deep_ep/buffer.py:121-123 at eb9cee7), so its RDMA ranks talk over the NICs
    # even inside a GB200/GB300 NVL72 rack. None: the cluster's whole NVLink domain.
    hierarchical_dispatch_nvlink_peers: Optional[int] = DEEPEP_NVL_PEERS
    # Context parallelism of a model with sliding-window layers runs as all-to-all (DeepSpeed-Ulysses'
    # exchange of heads for sequence, Jacobs et al. 2023): Transformer Engine's attention with CP asserts
    # cp_comm_type a2a for a window (``attn_forward_func_with_cp``), its ring (p2p) taking full
    # causal attention only (``stage_time.cp_exposed_per_layer``).
    cp_all_to_all_for_windows: bool = False
    # How context parallelism exchanges K and V (``CP_EXCHANGES``, priced by
    # ``stage_time.cp_exposed_per_layer``): "p2p", Megatron-core's ring of K/V chunks overlapped with the
    # attention (``AttnFuncWithCPAndKVP2P``); "kv_gather", K and V all-gathered before the attention and
    # their gradients reduce-scattered after it, nothing overlapped (torchtitan 0.3.0); "allgather" and
    # "alltoall", torch's ring attention under each of its rotate methods (torch 2.13,
    # ``torch/distributed/tensor/experimental/_context_parallel/_attention.py``, ``set_rotate_method``).
    cp_exchange: str = "p2p"
    # The low-precision recipes whose weights the engine keeps quantized, and gathers so, where a
    # job does not say (``TrainingSpec.fp8_param_gather`` None), at QUANTIZED_GATHER_ZERO_STAGES.
    # Megatron-Bridge's precision configs (``training/mixed_precision.py``) set it for delayed and
    # per-tensor current scaling and for MXFP8 (``fp8_param_gather = True``) and NVFP4
    # (``fp4_param_gather = True``), not for the 1×128 / 128×128 blockwise recipe.
    quantized_param_gather: tuple[str, ...] = ()
    # Of those, the recipes whose quantized weights the engine still gathers with the optimizer on
    # the host: Megatron-LM's arguments.py asserts that --optimizer-cpu-offload with
    # --fp8-param-gather runs --fp8-recipe delayed.
    quantized_param_gather_offloaded: tuple[str, ...] = ()
    # Where Adam's moments are kept in bf16 (``TrainingSpec.optimizer_moments``), the engine's optimizer
    # keeps the fp32 master as the 16-bit remainders of the bf16 weights (``TrainingSpec.master_remainders``)
    # at these ZeRO stages, with the optimizer on the GPU, under these recipes ("" for none: bf16), where a
    # job does not say (``keeps_master_remainders``). megatron-core 0.16: bf16 moments run under
    # --use-precision-aware-optimizer, which needs the distributed optimizer (OptimizerConfig.__post_init__),
    # and hands the master to Transformer Engine's FusedAdam, ``store_param_remainders`` on, wherever
    # ``use_precision_aware_optimizer_no_fp8_or_ds_fp8`` holds: no fp8 recipe or delayed (optimizer_config.py);
    # under the other recipes MCore keeps its own fp32 master (distrib_optimizer.py,
    # ``shard_main_param = shard_model_param.clone().float()``) and FusedAdam only the moments. With
    # --optimizer-cpu-offload the HybridDeviceOptimizer steps fp32 copies instead (optimizer/__init__.py).
    bf16_moments_remainder_recipes: tuple[str, ...] = ()
    bf16_moments_remainder_zero_stages: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.selective not in ("attention", "matmuls"):
            raise ValueError(f"EngineBehaviour.selective: expected attention or matmuls, got {self.selective!r}")
        if self.vocab_padding_multiple is not None and self.vocab_padding_multiple < 1:
            raise ValueError(f"EngineBehaviour.vocab_padding_multiple: expected None or 1 or more, "
                             f"got {self.vocab_padding_multiple}")
        if self.grouped_gemm_streams < 0:
            raise ValueError(f"EngineBehaviour.grouped_gemm_streams: expected 0 or more, "
                             f"got {self.grouped_gemm_streams}")
        if self.quantizer not in QUANTIZERS:
            raise ValueError(f"EngineBehaviour.quantizer: expected one of {QUANTIZERS}, got {self.quantizer!r}")
        if self.cp_exchange not in CP_EXCHANGES:
            raise ValueError(f"EngineBehaviour.cp_exchange: expected one of {CP_EXCHANGES}, got {self.cp_exchange!r}")

    @property
    def costs_per_collective(self) -> bool:
        """Whether each tensor-parallel collective call costs the engine time beyond its bytes: a host
        cost (``collective_launch_s``) or a floor in pipelines across nodes
        (``pipeline_collective_floor_s``, ``_rank_s``) or in tensor-parallel groups across nodes
        (``cross_domain_tp_rank_s``). Sequence parallelism makes twice the calls."""
        return bool(self.collective_launch_s or self.pipeline_collective_floor_s
                    or self.pipeline_collective_floor_rank_s or self.cross_domain_tp_rank_s)

    def gathers_quantized_weights(self, recipe: Optional[str], zero_stage: int, optimizer_offloaded: bool) -> bool:
        """Whether the engine keeps the weights quantized under ``recipe`` at ``zero_stage`` where a
        job does not say (``quantized_param_gather``, ``quantized_param_gather_offloaded``)."""
        recipes = self.quantized_param_gather_offloaded if optimizer_offloaded else self.quantized_param_gather
        return recipe in recipes and zero_stage in QUANTIZED_GATHER_ZERO_STAGES

    def keeps_master_remainders(self, moments: str, recipe: Optional[str], zero_stage: int,
                                optimizer_offloaded: bool) -> bool:
        """Whether the engine keeps the fp32 master as remainders of the bf16 weights where a job does not
        say (``bf16_moments_remainder_recipes``, ``bf16_moments_remainder_zero_stages``), for Adam's moments
        in ``moments`` under ``recipe`` (None: none) at ``zero_stage``."""
        return moments == "bf16" and not optimizer_offloaded and (recipe or "") in self.bf16_moments_remainder_recipes \
            and zero_stage in self.bf16_moments_remainder_zero_stages

    @property
    def fused_quantize(self) -> bool:
        """Both layouts of a tensor from one read, and the quantized input kept for backward."""
        return self.quantizer == "transformer_engine"


# No engine in particular: plain PyTorch, as its own classes run a layout: DDP's 25 MB buckets
# overlapped with the backward, FSDP units per layer, eager kernels, ZeroRedundancyOptimizer's
# ZeRO-1 (its shards sent to every rank before step() returns: ``_sync_params``). nanotron's
# measured behaviour is its own engine (planner/engines/nanotron.py).
GENERIC = EngineBehaviour(zero1_gather_in_step=True)
