"""What the run is told: precision, batch, optimizer, engine (:class:`TrainingSpec`), and the
memory that is neither model state nor activations (:class:`Overheads`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from .behaviour import CP_EXCHANGES, GENERIC, LOSSES, EngineBehaviour
from .frozen import cached_hash, cached_property, state_without_hash
from .quantization import FP8_RECIPES, Recipe, recipe_for
from .spec_checks import SpecError, _choice, _positive_int

PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4")
OPTIMIZERS = ("adam", "adamw", "sgd")
# The dtype Adam keeps its two moments in beside fp32 master weights (``TrainingSpec.optimizer_moments``).
OPTIMIZER_MOMENTS = ("fp32", "bf16")
# How expert-parallel tokens reach their experts (``TrainingSpec.expert_dispatch``): one
# all-to-all copy per chosen expert, or DeepEP-style kernels that send a token once to each
# NVLink domain holding one of its experts and forward it inside the domain.
EXPERT_DISPATCHES = ("all_to_all", "deepep")


@dataclass(frozen=True)
class TrainingSpec:
    __hash__ = cached_hash
    __getstate__ = state_without_hash

    global_batch_size: int  # sequences per optimizer step
    seq_len: int
    precision: str = "bf16"
    optimizer: str = "adam"
    # Flash attention keeps no s×s score matrix for backward (Dao et al. 2022, §3.1).
    flash_attention: bool = True
    # How the engine runs the job (``cost_models.behaviour``); the planner's engines are in
    # ``planner/engines/``.
    engine: EngineBehaviour = GENERIC
    # Tensor-parallel collectives pipelined with their GEMMs (Megatron --tp-comm-overlap,
    # torchtitan async TP).
    tp_comm_overlap: bool = False
    # Expert-parallel dispatch and combine run beside another micro-batch's compute (Megatron's
    # --overlap-moe-expert-parallel-comm, pairing one micro-batch's forward with another's
    # backward; DeepSeek-V3's DualPipe).
    moe_comm_overlap: bool = False
    # Gradients accumulated and reduced in fp32 under mixed precision; None: the engine's
    # default (``cost_models.model_states.fp32_gradients``).
    fp32_grads: Optional[bool] = None
    # How fp8 scales its tensors (``cost_models.quantization.FP8_RECIPES``); None: the engine's
    # default (``EngineBehaviour.fp8_recipe``). Only with precision fp8: mxfp8 and nvfp4 are recipes.
    fp8_recipe: Optional[str] = None
    # Weights quantized on their shard before the ZeRO gather, which then moves the low-precision
    # weights (Megatron --fp8-param-gather, MLPerf's FP8_PARAM_GATHER; torchao's FSDP float8
    # all-gather). None: the engine's default at the job's layout, which a Job resolves
    # (``EngineBehaviour.gathers_quantized_weights``).
    fp8_param_gather: Optional[bool] = None
    # The expert-parallel dispatch (``EXPERT_DISPATCHES``); None: the engine's
    # (``EngineBehaviour.hierarchical_dispatch``: Megatron's flex dispatcher runs DeepEP).
    expert_dispatch: Optional[str] = None
    # The optimizer keeps an fp32 master copy of the 16-bit weights and fp32 moments (mixed
    # precision, Micikevicius et al. 2018, §3.1). False: "pure bf16": the optimizer steps the
    # bf16 weights themselves and its moments take their dtype, as torch.optim.Adam does for a
    # model built in bf16 (NeMo AutoModel builds its models in config.torch_dtype, bf16).
    master_weights: bool = True
    # The dtype of Adam's two moments (exp_avg, exp_avg_sq) beside fp32 master weights
    # (``OPTIMIZER_MOMENTS``). "bf16": 2 bytes each, as torchtitan's optimizer.implementation
    # "fused_opt_states_bf16" keeps them (components/optimizer/optimizer.py,
    # _register_bf16_optimizer_state_hook). It changes the numerics, so the case states it: the
    # planner never picks it.
    optimizer_moments: str = "fp32"
    # The fp32 master weights kept as the 16 low bits each bf16 weight lacks (its "remainder"), so
    # that the bf16 weight and its remainder together are the fp32 master: 2 bytes a parameter, not
    # 4 (Transformer Engine's FusedAdam ``store_param_remainders``, which megatron-core 0.16's
    # precision-aware optimizer turns on: optimizer/optimizer_config.py, ``store_param_remainders``
    # True, no argument sets it). None: as the engine runs the job at its layout
    # (``EngineBehaviour.keeps_master_remainders``, ``resolution.resolve_training``).
    master_remainders: Optional[bool] = None
    # The loss compiled by torch.compile (torchtitan's compile.components "loss"; a script's
    # torch.compile(loss_fn)): inductor fuses its upcast, log-softmax and NLL
    # (``EngineBehaviour.compiled_loss``). None: the engine's default (``loss_compiled``).
    compiled_loss: Optional[bool] = None
    # The cross-entropy on whole logits (``behaviour.LOSSES``): Megatron's vocab-parallel one, in place,
    # or eager PyTorch's on fp32 logits, where the engine runs either (DeepSpeed runs the user's
    # train.py). None: the engine's (``EngineBehaviour.loss``, ``loss_gradient_bytes``).
    loss: Optional[str] = None
    # The sequence chunks the LM head and the loss run in (torchtitan's ChunkedLossWrapper
    # ``num_chunks``; ``EngineBehaviour.loss_chunks``). None: the engine's (``loss_chunk_count``).
    loss_chunks: Optional[int] = None
    # The LM head and the loss run inside torchtitan's ChunkedLossWrapper, even in one chunk
    # (``--loss.num_chunks 1``: the loss runs forward and backward inside the model's forward and no
    # logits outlive it, ``activations.chunked_loss``); False: on whole logits, the model's own LM head
    # and a cross-entropy that keeps its logits for backward. None: wherever ``loss_chunks`` is above 1.
    chunked_loss: Optional[bool] = None
    # The vendor's fused attention kernel (cuDNN through Transformer Engine's DotProductAttention)
    # rather than a FlashAttention-2-class one, timed at ``Performance.attention_efficiency_fused``
    # (``EngineBehaviour.fused_attention``). None: the engine's default (``attention_fused``).
    fused_attention: Optional[bool] = None
    # How context parallelism exchanges K and V (``behaviour.CP_EXCHANGES``): a torchtitan 0.2 job file's
    # ``context_parallel_rotate_method`` ("allgather", "alltoall"), read by diagnose; no case key sets it.
    # None: the engine's (``EngineBehaviour.cp_exchange``).
    cp_exchange: Optional[str] = None

    def __post_init__(self) -> None:
        s = TrainingSpec
        _positive_int(s, "global_batch_size", self.global_batch_size)
        _positive_int(s, "seq_len", self.seq_len)
        _choice(s, "precision", self.precision, PRECISIONS)
        _choice(s, "optimizer", self.optimizer, OPTIMIZERS)
        _choice(s, "optimizer_moments", self.optimizer_moments, OPTIMIZER_MOMENTS)
        if self.optimizer_moments == "bf16":
            if self.optimizer == "sgd":
                raise SpecError(s, "optimizer_moments", "bf16 keeps Adam's two moments in bf16: it needs optimizer "
                                                        "adam or adamw, not sgd")
            if not self.master_weights:
                # Without a master copy the moments already take the bf16 weights' dtype.
                raise SpecError(s, "optimizer_moments", "bf16 keeps the moments in bf16 beside fp32 master weights: "
                                                        "it needs master_weights true (without them the moments "
                                                        "take the weights' bf16 already)")
        if not isinstance(self.engine, EngineBehaviour):
            raise SpecError(s, "engine", f"expected an engine's behaviour, got {self.engine!r}")
        for name in ("flash_attention", "tp_comm_overlap", "fp32_grads", "moe_comm_overlap", "fp8_param_gather",
                     "master_weights", "compiled_loss", "fused_attention", "chunked_loss", "master_remainders"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name in ("fp32_grads", "fp8_param_gather", "compiled_loss",
                                                             "fused_attention", "chunked_loss",
                                                             "master_remainders") and value is None):
                raise SpecError(s, name, f"expected true or false, got {value!r}")
        if self.loss_chunks is not None:
            _positive_int(s, "loss_chunks", self.loss_chunks)
            if self.loss_chunks > self.seq_len:
                raise SpecError(s, "loss_chunks", f"splits the sequence: at most seq_len ({self.seq_len}), "
                                                  f"not {self.loss_chunks}")
        if self.chunked_loss is False and self.loss_chunk_count > 1:
            # Whole logits are one chunk: a wrapper of more is chunked by definition.
            raise SpecError(s, "chunked_loss", f"false runs the loss on whole logits: it needs loss_chunks 1, "
                                               f"not {self.loss_chunk_count}")
        if self.fused_attention and not self.flash_attention:
            # The fused kernels are flash-style: they never write the s×s scores, which
            # flash_attention false says the attention keeps.
            raise SpecError(s, "fused_attention", "true needs flash_attention true: a fused attention kernel "
                                                  "keeps no s×s scores")
        if not self.master_weights:
            # Without a master copy the weights are the bf16 ones the GEMMs read (fp8 recipes
            # quantize them per GEMM): fp16 would need a master for its loss scaling, and fp32
            # weights are their own master already.
            if self.precision in ("fp32", "fp16"):
                raise SpecError(s, "master_weights", f"false needs 16-bit weights kept in bf16 (precision bf16, fp8, "
                                                     f"mxfp8 or nvfp4), not {self.precision}")
            if self.fp32_grads:
                raise SpecError(s, "master_weights", "false keeps the gradients in bf16, the weights' dtype: "
                                                     "fp32_grads needs the fp32 master weights")
        if self.fp8_recipe is not None:
            _choice(s, "fp8_recipe", self.fp8_recipe, FP8_RECIPES)
            if self.precision != "fp8":
                raise SpecError(s, "fp8_recipe", f"applies only with precision fp8 ({self.precision} is a recipe "
                                                 f"of its own)" if self.precision in ("mxfp8", "nvfp4")
                                else f"applies only with precision fp8, not {self.precision}")
        if self.expert_dispatch is not None:
            _choice(s, "expert_dispatch", self.expert_dispatch, EXPERT_DISPATCHES)
        if self.loss is not None:
            _choice(s, "loss", self.loss, LOSSES)
        if self.cp_exchange is not None:
            _choice(s, "cp_exchange", self.cp_exchange, CP_EXCHANGES)
        if self.fp8_param_gather and self.precision not in ("fp8", "mxfp8", "nvfp4"):
            raise SpecError(s, "fp8_param_gather", f"applies only to a low precision (fp8, mxfp8, nvfp4), "
                                                   f"not {self.precision}")
        if self.master_remainders:
            # The remainder completes a bf16 weight into its fp32 master (Transformer Engine's
            # FusedAdam: "Works only when param type is BF16 and master weight type is FP32").
            if not self.master_weights:
                raise SpecError(s, "master_remainders", "true keeps the fp32 master as remainders of the bf16 "
                                                        "weights: it needs master_weights true")
            if self.precision in ("fp32", "fp16"):
                raise SpecError(s, "master_remainders", f"true completes bf16 weights into their fp32 master: it "
                                                        f"needs weights kept in bf16 (precision bf16, fp8, mxfp8 "
                                                        f"or nvfp4), not {self.precision}")
            if self.optimizer == "sgd":
                raise SpecError(s, "master_remainders", "true is an Adam kernel's (Transformer Engine's FusedAdam): "
                                                        "it needs optimizer adam or adamw, not sgd")
            if self.fp8_param_gather:
                raise SpecError(s, "master_remainders", "true completes a bf16 weight, and fp8_param_gather true "
                                                        "keeps the weights quantized: set one of them false")

    @property
    def attention_fused(self) -> bool:
        """Whether attention runs the vendor's fused kernel: as the case says, else as the engine does."""
        return self.engine.fused_attention if self.fused_attention is None else self.fused_attention

    @property
    def loss_compiled(self) -> bool:
        """Whether the loss runs compiled: as the case says, else as the engine does."""
        return self.engine.compiled_loss if self.compiled_loss is None else self.compiled_loss

    @property
    def loss_name(self) -> Optional[str]:
        """The cross-entropy of ``LOSSES`` priced: as the case says, else the engine's (None where its
        loss is its own, unnamed)."""
        return self.engine.loss if self.loss is None else self.loss

    @property
    def loss_chunk_count(self) -> int:
        """The sequence chunks the LM head and the loss run in: as the case says, else as the engine does."""
        return self.engine.loss_chunks if self.loss_chunks is None else self.loss_chunks

    @property
    def loss_in_chunks(self) -> bool:
        """Whether the LM head and the loss run inside the chunked-loss wrapper: as the case says, else
        wherever they run in more than one chunk."""
        return self.loss_chunk_count > 1 if self.chunked_loss is None else self.chunked_loss

    @property
    def hierarchical_dispatch(self) -> bool:
        """Whether the expert-parallel dispatch sends a token once per NVLink domain
        (``cost_models.experts.dispatch_combine_time``): as the case says, else as the engine does."""
        if self.expert_dispatch is None:
            return self.engine.hierarchical_dispatch
        return self.expert_dispatch == "deepep"

    @cached_property
    def recipe(self) -> Optional[Recipe]:
        """The low-precision recipe the linear GEMMs run (``cost_models.quantization``); None
        for fp32, fp16 and bf16. fp8 without a recipe runs the engine's default. Cached: the
        cost models ask for it tens of thousands of times a search."""
        return recipe_for(self.precision, self.fp8_recipe or self.engine.fp8_recipe)

    @property
    def delayed_scaling(self) -> bool:
        """fp8 under delayed scaling, with which megatron-core recomputes neither the experts'
        activation nor the norms (``TransformerConfig.__post_init__``)."""
        return self.recipe is not None and self.recipe.name == "delayed"




@dataclass(frozen=True)
class Overheads:
    """Memory that is neither model state nor activations, each a documented default.

    - ``cuda_context``: what lives outside PyTorch's caching allocator: the CUDA context
      and the NCCL communicators' own buffers, which NCCL allocates itself. PyTorch 2.x on
      Hopper shows 0.5–1 GiB before the first tensor (PyTorch "CUDA semantics" notes; NCCL
      user guide, NCCL_BUFFSIZE 4 MiB per channel and peer); we take 1 GiB. The allocator's
      counters (``max_memory_allocated``, ``max_memory_reserved``, what training logs and
      published peaks report) never hold it, so it is taken off the capacity a layout's peak
      must fit in (``memory.usable_bytes``), not added to the peak. On a GPU only.
    - ``cpu_process``: its counterpart on a CPU rank (a profile `calibrate` measured on CPUs),
      which has no CUDA context: the process itself, the Python interpreter and torch's and
      gloo's libraries and buffers, resident before the first model tensor. Measured, not
      guessed: the resident set (``VmRSS`` in /proc/self/status) of a fresh process after
      ``import torch`` and ``torch.distributed.init_process_group("gloo")`` with one rank, median
      of 5 runs 232.05 MB (226,612 kB; spread 226,420–226,696 kB), torch 2.13.0+cpu, Python of
      this repo's venv, on the 2-core dev machine of calibration/profiles/cpu-2core-dev.yaml.
      A CPU rank's tensors come from the same process memory, so it is taken off the capacity
      as ``cuda_context`` is on a GPU (``memory.outside_allocator``).
    - ``comm_buffers``: gradient-reduction buckets and all-gather staging. Megatron's
      DDP bucket holds 40 M parameters by default and DeepSpeed's reduce bucket
      5e8 elements; a 2-byte bucket of 40 M elements is 0.08 GB, 5e8 elements 1 GB.
      We take 0.5 GiB as the middle.
    - ``fragmentation``: share of the dynamic (activation) memory lost to the caching
      allocator's rounding and fragmentation; PyTorch's allocator rounds to 512 B
      blocks inside 2 MiB / 20 MiB segments, observed at 5–15 % for training.
    """

    cuda_context: float = float(2**30)
    cpu_process: float = 226_612 * 1024.0
    comm_buffers: float = float(2**29)
    fragmentation: float = 0.10

    def __post_init__(self) -> None:
        for name in ("cuda_context", "cpu_process", "comm_buffers", "fragmentation"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise SpecError(Overheads, name, f"expected a non-negative number, got {value!r}")
        if self.fragmentation >= 1:
            raise SpecError(Overheads, "fragmentation", f"expected a fraction below 1, got {self.fragmentation!r}")
