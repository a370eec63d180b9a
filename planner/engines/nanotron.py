"""nanotron (Hugging Face): what it runs and how, as its own code shows and the Ultra-Scale
Playbook's sweep (1,265 layouts on 1-64 nodes of 8 H100s over EFA) measured it.

- Choices (``src/nanotron/config/parallelism_config.py``): dp, tp (``tp_mode`` ALL_REDUCE, or
  REDUCE_SCATTER: sequence parallelism), pp with its one-forward-one-backward or all-forward-
  all-backward engines (no interleaving), ZeRO stage 0 or 1 (``optimizer.zero_stage``), full
  recomputation of every layer (``recompute_layer``); no context or expert parallelism, no
  offload, bf16 with fp32 gradient accumulation (``OptimizerArgs.accumulate_grad_in_fp32``, which its
  scaling-benchmark script, ``scripts/scaling_benchmarks.py``, and its examples set).
- Behaviour: ZeRO-1 as ``ZeroDistributedOptimizer`` runs it: with fp32 gradients no DDP wrapper,
  one all-reduce of the whole fp32 gradient buffer after the last backward, in the open
  (``trainer.py``: ``sync_gradients_across_dp``); the updated shards gathered in one coalesced
  all-gather before ``step`` returns, then copied out parameter by parameter
  (``distributed.all_gather_coalesced``). Its pipeline reads the shape of every tensor it receives on
  the host (``P2P._recv_meta``), and its tensor-parallel collectives across nodes run far slower
  than NCCL's: floors measured on the Playbook's sweep (``cost_models.behaviour``'s fields,
  fitted by bench/fit_performance.py h100; bench/pipeline_floor.py). Its stages are cut by
  block cost (``models/base.py``, ``build_model``), and no split can be given it.
"""

from __future__ import annotations

from cost_models.behaviour import EngineBehaviour
from cost_models.job import Job
from cost_models.specs import ModelSpec

from .base import Engine, EngineSupport

SUPPORT = EngineSupport(
    zero_stages=(0, 1), max_zero_with_pp=1, interleaving=False, context_parallel=False,
    sequence_parallel=(False, True), recompute=("none", "full"), partial_recompute=False,
    expert_parallel=False, fp8_recipes=(), fp8_param_gather=False, pure_bf16=False, compiled_loss=False,
    optimizer_moments=("fp32",),
    fused_attention=(False,),
    why=(("zero_stages", "nanotron's optimizer.zero_stage is 0 or 1"),
         ("max_zero_with_pp", "nanotron's optimizer.zero_stage is 0 or 1"),
         ("interleaving", "nanotron's pipeline engines are 1F1B and AFAB, without interleaving: vpp 1"),
         ("context_parallel", "nanotron has no context parallelism: cp 1, with tp and sequence_parallel (its "
                              "tp_mode REDUCE_SCATTER) or recompute full to hold a long sequence's activations; "
                              "megatron and torchtitan run cp"),
         ("recompute", "nanotron recomputes whole layers (parallelism.recompute_layer) or none: recompute "
                       "full or none"),
         ("partial_recompute", "nanotron's recompute_layer recomputes every layer"),
         ("expert_parallel", "the planner prices no nanotron mixture of experts"),
         # nanotron keeps everything on the GPU: what frees memory there instead.
         ("optimizer_offload", "nanotron keeps the optimizer on the GPU (no offload): shard its states with "
                               "zero_stage 1, or free activations with recompute full"),
         ("param_offload", "nanotron keeps the parameters on the GPU (no offload): split them with tp or pp"),
         ("activation_offload", "nanotron keeps the activations on the GPU (no offload): recompute full frees "
                                "them"),
         ("fp8_recipe", "the planner prices nanotron in bf16 only, as the Playbook's sweep ran it: set "
                        "training.precision bf16, or give the low-precision run to an engine that has its "
                        "recipes (training.engine megatron or torchtitan)"),
         ("fp8_param_gather", "nanotron gathers bf16 weights"),
         ("pure_bf16", "nanotron keeps fp32 master weights"),
         # nanotron's optimizer/ builds torch.optim.Adam(W) over its fp32 master copy: states of its dtype.
         ("optimizer_moments", "nanotron's Adam keeps its moments in the fp32 master's dtype (torch.optim.AdamW "
                               "over the fp32 master copy): it keeps them in"),
         ("compiled_loss", "nanotron's loss is its own sharded cross-entropy, not compiled"),
         ("fused_attention", "nanotron's attention is flash-attn 2")),
)

BEHAVIOUR = EngineBehaviour(
    name="nanotron", fp32_grads_for_bf16=True, vocab_padding_multiple=1,
    zero1_gather_in_step=True, zero1_gather_copies=True, zero1_fp32_reduce_after_backward=True,
    splits_by_block_cost=True,
    pipeline_collective_floor_s=0.75e-3, pipeline_collective_floor_rank_s=0.31e-3, cross_domain_tp_rank_s=0.06e-3,
    # nanotron's own cross-entropy (parallel/tensor_parallel/functional.py, ``sharded_cross_entropy``) is
    # not eager PyTorch's: its backward writes the gradient into the saved softmax (``grad_input =
    # softmax``, ``mul_``), 4 + 2 with the bf16 cast. Its peak is in the forward: the bf16 logits, their
    # fp32 cast (``.to(dtype)``) and ``sharded_logits - logits_max``, which becomes the saved softmax in
    # place: 2 + 4 beside the saved 4.
    loss_gradient_bytes=6.0,
)



def model_rules(model: ModelSpec) -> list[tuple[str, str]]:
    """A mixture of experts: SUPPORT says the planner prices none under nanotron, yet only ep > 1 was
    refused, so a Mixtral case planned at ep 1 was priced "as nanotron runs it"."""
    if model.is_moe:
        return [("model.num_experts", f"{SUPPORT.reason('expert_parallel', '')} (the runs it is fitted on, "
                                      "the Playbook's sweep, are dense): plan a mixture of experts for megatron, "
                                      "torchtitan or deepspeed (training.engine)")]
    return []


def rules(job: Job) -> list[tuple[str, str]]:
    """nanotron's one-forward-one-backward engine, the schedule priced here, asserts at least pp − 1
    micro-batches a step (``parallel/pipeline_parallel/engine.py``,
    ``OneForwardOneBackwardPipelineEngine.train_batch_iter``: "Number of microbatches ... must be at
    least PP_SIZE-1"): the first rank's warm-up alone runs pp − 1 forwards. None of the Playbook's 1,265
    layouts ran fewer. Its all-forward-all-backward engine has no such bound, but holds every
    micro-batch's activations at once, which the planner does not price."""
    lay = job.layout
    if lay.pp > 1 and job.num_microbatches < lay.pp - 1:
        return [("layout.micro_batch_size",
                 f"nanotron's 1F1B pipeline engine needs at least pp - 1 = {lay.pp - 1} micro-batches a step "
                 f"(pipeline_parallel/engine.py asserts it), got {job.num_microbatches}: a smaller micro-batch "
                 "or fewer pipeline stages")]
    return []


ENGINE = Engine("nanotron", SUPPORT, BEHAVIOUR, rules=rules, title="nanotron", model_rules=model_rules)
