"""Bytes of model states per parameter, and how ZeRO shards them.

Rajbhandari et al. 2020 (ZeRO, §3 and §5): mixed-precision Adam keeps 2 bytes of
fp16/bf16 weights, 2 bytes of gradients and K = 12 bytes of optimizer state (fp32
master weights, momentum and variance) per parameter: (2 + 2 + K)·Ψ = 16Ψ.
ZeRO-1 shards the optimizer state over the Nd data-parallel ranks, ZeRO-2 the
gradients too, ZeRO-3 the weights too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from .behaviour import EngineBehaviour
from .quantization import HIGH_PRECISION_BYTES
from .job import Job
from .training_spec import TrainingSpec


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter held for weights, gradients and optimizer state, unsharded."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer




def fp32_gradients(training: TrainingSpec) -> bool:
    """Whether gradients are held and reduced in fp32: the case's choice, else the engine's default.
    Without master weights they are the bf16 weights' dtype (autograd's, and FSDP's cast back)."""
    if training.precision == "fp32":
        return True
    if not training.master_weights:
        return False
    if training.fp32_grads is not None:
        return training.fp32_grads
    return training.precision != "fp16" and training.engine.fp32_grads_for_bf16


def zero_shards(job: Job) -> int:
    """Ranks that hold the same weights and so share the ZeRO shards: dp·cp.

    Megatron reduces gradients and shards its distributed optimizer over the
    data-parallel group with context parallelism folded in
    (``parallel_state.get_data_parallel_group(with_context_parallel=True)``).
    """
    return job.layout.dp * job.layout.cp


def weights_are_master(training: TrainingSpec, zero_stage: int, shards: int) -> bool:
    """Whether the weights a rank holds are the optimizer's master copy itself: in fp32 training,
    without master weights (``TrainingSpec.master_weights``: the bf16 weights are stepped), and in
    16-bit training under a ZeRO-3 that shards the fp32 parameters
    (``EngineBehaviour.sharded_master_weights``) over more than one rank, or at any degree where
    the engine applies it at every one (``EngineBehaviour.fsdp_always``: torchtitan 0.3.0)."""
    engine = training.engine
    return training.precision == "fp32" or (not training.master_weights and not engine.bf16_master_partition) \
        or (engine.sharded_master_weights and (zero_stage == 3 and shards > 1 or engine.fsdp_always))


@lru_cache(maxsize=256)  # read for every stage of every layout a search scores
def state_bytes(training: TrainingSpec, zero_stage: int = 0, shards: int = 1) -> StateBytes:
    """Per-parameter model-state bytes for the training precision and optimizer.

    - fp32: 4-byte weights and gradients; Adam's two 4-byte moments, SGD's one momentum.
    - fp16/bf16 (mixed precision, Micikevicius et al. 2018): 2-byte weights and
      gradients, plus a 4-byte fp32 master copy kept with the optimizer state
      (ZeRO's K = 12 for Adam; 8 for SGD with momentum). Gradients kept in fp32
      (:func:`fp32_gradients`) take 4 bytes: Megatron's bf16 default, 18 bytes in all.
    - fp8, mxfp8, nvfp4: weights are kept in bf16 and quantized per GEMM, so the states are
      those of bf16; where the weights are gathered quantized and the engine keeps them so
      (Megatron's --fp8-param-gather: Transformer Engine's quantized parameters, the fp32
      master copy in the distributed optimizer), a weight takes the recipe's bytes
      (``quantization.Recipe.quantized_bytes``: 1 for fp8).
    - Where the held weights are the fp32 master (:func:`weights_are_master`: PyTorch FSDP at
      ``zero_stage`` 3 over ``shards`` > 1 ranks), a weight takes 4 bytes, its gradient shard 4
      (FSDP casts the reduced gradient to the parameter's dtype, whatever dtype it reduced in)
      and the optimizer only its moments: 16 bytes for Adam. The 16-bit weights exist only
      gathered (``memory.zero3_gather_bytes``), which :func:`gathered_weight_bytes` prices.
    - Without master weights (``TrainingSpec.master_weights`` false, "pure bf16"): the bf16
      weights are the master, their gradients bf16, and the moments take their dtype
      (torch.optim.Adam's ``zeros_like(param)``): 2 + 2 + 4 = 8 bytes for Adam; 10 where the
      engine keeps a bf16 master partition of its own (``EngineBehaviour.bf16_master_partition``).
    - Adam's moments in bf16 beside the fp32 master (``TrainingSpec.optimizer_moments`` "bf16"):
      2 bytes each, so the optimizer keeps 4 + 2 + 2 = 8 bytes (4 where the weights are the fp32
      master): torchtitan's "fused_opt_states_bf16" (components/optimizer/optimizer.py,
      _register_bf16_optimizer_state_hook: exp_avg and exp_avg_sq ``zeros_like(p,
      dtype=torch.bfloat16)`` beside the fp32 parameter, stepped by torch's fused mixed-precision
      Adam kernel).
    - The fp32 master kept as remainders (``TrainingSpec.master_remainders``): 2 bytes, the 16 low
      bits of each fp32 master weight its bf16 weight lacks, beside the moments: 2 + 2 + 2 = 6 bytes
      of optimizer state with bf16 moments. Transformer Engine's FusedAdam under megatron-core 0.16's
      precision-aware optimizer (optimizer/__init__.py: ``master_weights``, ``store_param_remainders``;
      FusedAdam ``_initialize_state``: ``torch.zeros_like(param, dtype=torch.int16)``), which holds the
      master of the distributed optimizer's bf16 shards: megatron-core then keeps no fp32 shard of its own
      (distrib_optimizer.py, ``shard_main_param = None``: "main params are held by FusedAdam").
    """
    moments = 1 if training.optimizer == "sgd" else 2
    moment_bytes = 2 if training.optimizer_moments == "bf16" else 4
    if not training.master_weights:
        master = 2 if training.engine.bf16_master_partition else 0
        return StateBytes(weights=2, gradients=2, optimizer=master + 2 * moments)
    if weights_are_master(training, zero_stage, shards):
        return StateBytes(weights=4, gradients=4, optimizer=moment_bytes * moments)
    weights = 2.0
    if keeps_weights_quantized(training):  # the linear layers' weights; memory.stage_state_bytes the rest
        weights = training.recipe.quantized_bytes
    master = 2 if training.master_remainders else 4
    return StateBytes(weights=weights, gradients=4 if fp32_gradients(training) else 2,
                      optimizer=master + moment_bytes * moments)


def folds_gradients_into_fp32(job: Job) -> bool:
    """Whether the engine keeps fp32 gradients beside the 16-bit ones autograd writes and folds
    these into them in a pass of its own (``EngineBehaviour.fp32_accumulation_bytes``): at ZeRO 0-1,
    where each rank holds all of its gradients, under mixed precision with fp32 gradients (an fp32
    model's backward writes fp32 gradients itself), with the optimizer on the GPU. DeepSpeed's
    BF16_Optimizer (``bf16_optimizer.py``); with the optimizer offloaded DeepSpeed runs its ZeRO
    optimizer instead (``runtime/engine.py``, ``_do_optimizer_sanity_check``: BFLOAT16 only
    ``not self.zero_cpu_offload()``)."""
    training = job.training
    return bool(training.engine.fp32_accumulation_bytes) and job.layout.zero_stage <= 1 \
        and training.precision != "fp32" and fp32_gradients(training) and not job.layout.offload_optimizer


def folds_gradients_into_flat_buffer(job: Job) -> bool:
    """Whether the engine folds the 16-bit gradients autograd writes into a flat buffer of the same
    dtype beside them, at ZeRO 0-1 (``EngineBehaviour.flat_gradient_accumulator``): DeepSpeed's
    BF16_Optimizer accumulating in bf16 (``runtime/bf16_optimizer.py``), which runs no ZeRO
    reduction buckets."""
    return job.training.engine.flat_gradient_accumulator and job.layout.zero_stage <= 1


@lru_cache(maxsize=256)
def working_bytes(training: TrainingSpec) -> StateBytes:
    """Bytes per parameter of the weights as a replica runs them and of the gradients as its
    backward writes and reduces them: :func:`state_bytes` without ZeRO and without FSDP's sharded
    master, whatever the engine holds (``EngineBehaviour.fsdp_always``): what a gather moves and a
    reduction carries."""
    if training.engine.fsdp_always:
        training = replace(training, engine=replace(training.engine, fsdp_always=False))
    return state_bytes(training)


def reduced_gradient_bytes(training: TrainingSpec) -> float:
    """Bytes a gradient takes on the data-parallel reduction's wire: the engine's own cast where it
    makes one (``EngineBehaviour.gradient_wire_bytes``: DeepSpeed's ``allreduce_bucket`` and ZeRO's
    ``gradient_reduction_w_predivide`` cast each bucket to ``communication_data_type``, runtime/engine.py
    and runtime/zero/stage_1_and_2.py), else the gradients' dtype (:func:`working_bytes`). The
    gradients are held and accumulated in their own dtype whatever the wire carries."""
    return training.engine.gradient_wire_bytes or working_bytes(training).gradients


def keeps_weights_quantized(training: TrainingSpec) -> bool:
    """Whether the held weights of the linear layers are the recipe's quantized data (Megatron's
    --fp8-param-gather: Transformer Engine's quantized parameters); the embedding, the LM head, the
    norms and the router are no Transformer Engine linears and stay in 16 bits."""
    return bool(training.fp8_param_gather and training.recipe is not None and training.engine.fused_quantize)


def quantizes_weights_once_a_step(job: Job) -> bool:
    """Whether each linear's weight is quantized once a step, not once a micro-batch: where the
    engine keeps the quantized copy for the step (``EngineBehaviour.fp8_weight_cache``) and the
    weights stay whole (below ZeRO-3; Megatron-FSDP drops the quantized copies after each
    module's forward unless ``keep_fp8_transpose_cache``), or where the weights are themselves
    kept quantized (``TrainingSpec.fp8_param_gather``: the optimizer writes them so)."""
    training = job.training
    # bool(): fp8_param_gather is None on a training not yet resolved (resolution.resolve_training)
    return training.engine.fp8_weight_cache and training.recipe is not None \
        and (job.layout.zero_stage < 3 or bool(training.fp8_param_gather))


def bucket_copy_bytes(training: TrainingSpec, zero_stage: int, shards: int) -> float:
    """Bytes per parameter of PyTorch DDP's all-reduce buckets, held beside the gradients where
    the engine copies them in (``EngineBehaviour.gradient_bucket_copy``): the parameters' dtype
    (DDP buckets what autograd writes to ``param.grad``), wherever DDP runs, ZeRO 0 and 1 over
    ``shards`` > 1 replicas (PyTorch's ZeroRedundancyOptimizer runs under DDP). A bf16 model with
    2-byte gradients then holds 2 + 2 + 2 bytes beside its 12 of optimizer state. nanotron's ZeRO-1
    with fp32 gradients runs without DDP (``EngineBehaviour.zero1_fp32_reduce_after_backward``), but
    the Playbook's peaks hold about as much all the same (its 80B rows: 6.3 % off with these bytes,
    10.2 % without), so they stay counted there."""
    if not training.engine.gradient_bucket_copy or training.engine.fsdp_always or zero_stage >= 2 or shards <= 1:
        return 0.0
    return working_bytes(training).weights


def gathers_quantized_shards(training: TrainingSpec) -> bool:
    """Whether a ZeRO weight gather moves weights quantized on their shard (Megatron's
    --fp8-param-gather, MLPerf's FP8_PARAM_GATHER; torchao's FSDP float8 all-gather): where the
    recipe's one quantized layout serves both GEMMs (``Recipe.weight_layouts_from_one``). MXFP8's
    column-wise blocks do not follow from its row-wise ones, so Megatron gathers those weights in
    16 bits into the gradient buffer and quantizes both layouts after the gather
    (``--reuse-grad-buf-for-mxfp8-param-ag``: ``fp8_utils.copy_tensors_to_quantized_params``)."""
    recipe = training.recipe
    # bool(): fp8_param_gather is None on a training not yet resolved (resolution.resolve_training)
    return bool(training.fp8_param_gather) and recipe is not None and recipe.weight_layouts_from_one


def gathered_weight_bytes(training: TrainingSpec) -> float:
    """Bytes per parameter a ZeRO weight gather moves and materialises: the held weights, the
    quantized ones where the gather moves quantized shards (:func:`gathers_quantized_shards`), or
    16-bit ones where the weights are kept quantized in layouts a gather cannot carry."""
    if gathers_quantized_shards(training):
        return training.recipe.quantized_bytes
    if training.fp8_param_gather and training.recipe is not None:
        return HIGH_PRECISION_BYTES
    return working_bytes(training).weights


# An fp32 element; the fp32 master weight a separate copy kernel reads again to write the 16-bit weights.
FP32_BYTES = 4.0
MASTER_BYTES = FP32_BYTES


def adam_step_bytes(per_param: StateBytes, master_weights: bool = False) -> float:
    """Bytes the optimizer's own fused kernel (Adam, or SGD) streams per parameter: it reads the
    gradient, reads and writes the optimizer's states (master weights and moments), and writes the
    new weights; where the weights are the master (``master_weights``: :func:`weights_are_master`, or
    the bf16 weights that with their remainders make it, :func:`steps_master_in_kernel`), it reads
    them too (Transformer Engine's ``multi_tensor_adam_param_remainder`` rebuilds each fp32 master
    from the bf16 weight and its int16 remainder, and writes both back)."""
    return per_param.gradients + 2 * per_param.optimizer + per_param.weights * (2 if master_weights else 1)


def steps_master_in_kernel(training: TrainingSpec) -> bool:
    """Whether the optimizer's kernel holds the master as remainders of the bf16 weights
    (``TrainingSpec.master_remainders``) and so reads the weights and writes them itself: no separate
    kernel copies a master into them, and no fp32 copy of the gradients is made for it. megatron-core
    0.16 (optimizer/distrib_optimizer.py): ``_copy_main_params_to_model_params`` returns at once under
    ``use_precision_aware_optimizer_no_fp8_or_ds_fp8`` ("main params are held by self.optimizer. It will
    also do the work of copying"), and ``_copy_model_grads_to_main_grads`` hands FusedAdam a view of the
    gradient buffer (``shard_main_param.decoupled_grad = shard_model_grad``) where it otherwise makes
    ``shard_model_grad.float()``."""
    return bool(training.master_remainders) and training.master_weights


def optimizer_step_bytes(per_param: StateBytes, master_weights: bool, engine: EngineBehaviour,
                         master_in_kernel: bool = False) -> float:
    """Bytes a whole optimizer step streams per parameter: the optimizer's kernel
    (:func:`adam_step_bytes`) and around it

    - the gradient clipping every engine runs as emitted (Megatron's ``clip_grad`` 1.0,
      torchtitan's ``max_norm`` 1.0, the DeepSpeed config's ``gradient_clipping`` 1.0): the norm
      reads the gradients (``multi_tensor_l2norm``, ``torch._foreach_norm``), the scale reads and
      writes them (megatron-core ``clip_grads.py`` with Transformer Engine and torch's
      ``_clip_grads_with_norm_`` scale every step, by a coefficient clamped to 1);
    - ``engine``'s own passes: the fp32 master read again by a separate copy into the 16-bit
      weights (``EngineBehaviour.master_copy_kernel``), unless the optimizer's kernel writes them from
      the master it holds as their remainders (``master_in_kernel``, :func:`steps_master_in_kernel`,
      whose kernel reads the weights as part of the master), the gradient buffer zeroed
      (``zeroes_gradient_buffer``).

    Megatron-LM in bf16 with fp32 gradients thus streams 50 bytes a parameter where Adam alone
    moves 30; torchtitan's FSDP2, whose fp32 shard is the master, 40 where Adam moves 28."""
    clipping = 3 * per_param.gradients
    own = (MASTER_BYTES if engine.master_copy_kernel and not (master_weights or master_in_kernel) else 0.0) \
        + (per_param.gradients if engine.zeroes_gradient_buffer else 0.0)
    return adam_step_bytes(per_param, master_weights or master_in_kernel) + clipping + own


@lru_cache(maxsize=4096)
def sharded_state_bytes(per_param: StateBytes, zero_stage: int, shards: int) -> StateBytes:
    """Per-parameter bytes on one rank after ZeRO stage ``zero_stage`` over ``shards`` ranks.

    ZeRO paper §5.1–5.3: stage 1 divides the optimizer state by Nd, stage 2 also
    the gradients, stage 3 also the weights.
    """
    return StateBytes(
        weights=per_param.weights / shards if zero_stage >= 3 else per_param.weights,
        gradients=per_param.gradients / shards if zero_stage >= 2 else per_param.gradients,
        optimizer=per_param.optimizer / shards if zero_stage >= 1 else per_param.optimizer,
    )
