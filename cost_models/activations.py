"""Activation memory: bytes saved for backward per transformer layer and per stage.

The per-layer terms are those of Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", §4.1–4.2 (Megatron-LM's layer), with
hidden size h, heads a, sequence s, micro-batch b, tensor parallel t:

- no parallelism:            sbh·(34 + 5as/h)
- TP:                        sbh·(10 + 24/t + 5as/(ht))
- TP + sequence parallelism: sbh·(34/t + 5as/(ht))
- TP + SP + selective:       34·sbh/t
- full recompute:            2·sbh (layer input only; /t with SP)

generalised, term by term, to grouped-query attention (K and V of width kv),
any FFN width f, SwiGLU (Megatron's fused ``bias_swiglu`` saves its 2f-wide input,
``megatron/core/fusions/fused_bias_swiglu.py``), flash attention (no s×s tensor is
saved: Dao et al. 2022 §3.1), no dropout (no masks), fp32 activations (4 bytes)
and context parallelism (each rank holds s/cp of the sequence).

Small per-token statistics (norm mean/rstd, flash-attention log-sum-exp: under
0.5 % for head dims of 64 and more) are not counted, as in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

from .experts import (exchanged_token_bytes, moe_act_output_bytes, moe_mlp_activation_bytes,
                      shared_expert_activation_bytes)
from .behaviour import LOSS_GRADIENT_BYTES, EngineBehaviour
from .model_states import FP32_BYTES
from .parameters import built_vocab
from .quantization import activation_bytes, saved_input_bytes
from .layout_spec import Layout
from .model_spec import ModelSpec
from .training_spec import TrainingSpec


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one GPU saves for the backward pass of one layer and one micro-batch."""

    norm_inputs: float  # inputs of the two norms
    qkv_input: float  # output of the first norm, input of the QKV GEMM
    qkv: float  # Q, K and V, inputs of the attention core
    attention_core: float  # softmax output, dropout mask and output (s×s per head); 0 with flash
    projection_input: float  # attention context, input of the output projection
    mlp_input: float  # output of the second norm, input of the first MLP GEMM
    mlp_hidden: float  # GeLU input and output, or SwiGLU input (and silu's output, unfused) and down-projection input
    dropout_masks: float  # one byte per element after attention and after the MLP

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))


def residual_bytes(training: TrainingSpec) -> int:
    """Bytes per element of the residual stream, which the norms keep as their inputs and a
    fully recomputed layer as its input: the activations' (:func:`activation_bytes`), or 4
    where autocast keeps the stream in fp32 (``EngineBehaviour.fp32_residual``)."""
    return 4 if training.engine.fp32_residual else activation_bytes(training.precision)


def layer_activations(model: ModelSpec, training: TrainingSpec, layout: Layout, moe: bool = False,
                      quantized: bool = True) -> LayerActivations:
    """Saved-for-backward bytes of one layer with no recomputation (Korthikanti §4.1, generalised).

    In an MoE layer the MLP's hidden activations are those of the experts
    (:func:`experts.moe_mlp_activation_bytes`). Queries, keys and values are kept at their own
    widths (a·d, kv·d, kv·d_v); multi-head latent attention also keeps the two latents, the
    inputs of the up-projections. ``quantized``: its linears run the training's low-precision
    recipe, if it has one."""
    p = activation_bytes(training.precision)
    t = layout.tp
    s = training.seq_len / layout.cp
    b = layout.micro_batch_size
    h, a, f = model.hidden_size, model.num_attention_heads, model.ffn_hidden_size
    # With tp above the kv-head count Megatron replicates kv heads: each rank keeps one.
    # Without flash attention Megatron repeats K and V to all heads before the batched
    # GEMMs (``DotProductAttention``), and those full-width copies are what is saved.
    kv_heads = max(model.num_kv_heads // t, 1) if training.flash_attention else a / t
    q_k_v = model.q_size / t + kv_heads * (model.head_dim + model.value_head_dim)
    latents = model.q_lora_rank + model.kv_lora_rank if model.attention_type == "mla" else 0
    # Sequence parallelism splits the tensors outside the tensor-parallel regions.
    sp = t if layout.sequence_parallel else 1
    mask = 1 if model.dropout > 0 else 0

    if training.flash_attention:
        core = 0.0
    else:
        # softmax output (p bytes), dropout mask (1 byte) and dropout output (p bytes) per score;
        # without dropout the softmax output feeds the value GEMM directly.
        per_score = p + mask * (1 + p)
        core = per_score * (a / t) * s * s * b

    engine = training.engine
    # SwiGLU: a fused kernel (Megatron's ``bias_swiglu``, torch.compile) keeps its 2f input and
    # the down projection its f input; eager silu-then-multiply also keeps silu's f output.
    mlp_widths = (3 if engine.fused_elementwise else 4) if model.activation == "swiglu" else 2
    # Transformer Engine's quantized linears keep their input as the copy their wgrad GEMM reads
    # (1 byte in fp8, with its scales for MX and NVFP4), not the bf16 tensor: the QKV, projection,
    # first-MLP and down-projection inputs (``quantization.saved_input_bytes``).
    g = saved_input_bytes(training.recipe if quantized else None, engine.fused_quantize, p)
    beside = copy_beside_saved_bytes(training, g, p)
    if moe:
        mlp_hidden = moe_mlp_activation_bytes(model, training, layout, engine.fused_elementwise, g)
        # The router keeps the pre-MLP norm's output itself (RouterGatingLinearFunction saves its
        # 16-bit input, moe/moe_utils.py; DeepSpeed's TopKGate an fp32 copy of it), and the shared
        # experts' first linear, where there are any, a copy beside it.
        mlp_input = (router_input_bytes(training) + (beside if model.moe_shared_expert_ffn_hidden_size else 0.0)) \
            * s * b * h / sp
    else:
        mlp_hidden = ((mlp_widths - 1) * p + g) * s * b * f / t
        mlp_input = g * s * b * h / sp  # the norm fused into the first linear, which keeps its input
    # A fused (flash) attention keeps its own output for backward (Dao et al. 2022, Algorithm 2), and the
    # output projection a copy beside it; the unfused core's output is the projection's input alone.
    projection = p + beside if training.flash_attention else g
    return LayerActivations(
        norm_inputs=2 * residual_bytes(training) * s * b * h / sp,
        qkv_input=input_norm_output_bytes(model, layout, g, p) * s * b + g * s * b * latents,
        qkv=p * s * b * q_k_v,
        attention_core=core,
        projection_input=projection * s * b * model.context_size / t,
        mlp_input=mlp_input,
        mlp_hidden=mlp_hidden,
        dropout_masks=2 * mask * s * b * h / sp,
    )


def router_input_bytes(training: TrainingSpec) -> float:
    """Bytes per element the MoE router keeps of the pre-MLP norm's output: the 16-bit tensor
    (megatron-core's RouterGatingLinearFunction), or the fp32 copy it casts it to
    (``EngineBehaviour.router_input_fp32``: DeepSpeed-MoE's TopKGate)."""
    return FP32_BYTES if training.engine.router_input_fp32 else activation_bytes(training.precision)


def copy_beside_saved_bytes(training: TrainingSpec, saved_input: float, high_precision: float) -> float:
    """Bytes per element a linear adds for an input another op already keeps in 16 bits (the
    attention's output, the router's input): its own quantized copy (``saved_input``, where
    Transformer Engine keeps one: ``quantization.saved_input_bytes``), or nothing where the linear
    keeps the original tensor (torchao's, or the engine's ``saves_original_input_recipes``)."""
    recipe = training.recipe
    if saved_input == high_precision or recipe is None or recipe.name in training.engine.saves_original_input_recipes:
        return 0.0
    return saved_input


def input_norm_output_bytes(model: ModelSpec, layout: Layout, saved_input: float, high_precision: float) -> float:
    """Bytes per token one layer keeps of its input norm's output. Fused into the QKV linear, the
    copy that linear keeps; under MLA the norm stands apart and feeds two linears (the query's and
    the key-value down-projections, or the query's projection: megatron-core's
    multi_latent_attention.py), each keeping its own quantized copy where one is kept, else the one
    16-bit tensor they share."""
    sp = layout.tp if layout.sequence_parallel else 1
    copies = 2 if model.attention_type == "mla" and saved_input != high_precision else 1
    return copies * saved_input * model.hidden_size / sp


def selective_modules(model: ModelSpec, training: TrainingSpec, layout: Layout) -> tuple[str, ...]:
    """What the "attention" policy of ``recompute: selective`` recomputes, in megatron-core's
    ``--recompute-modules`` names: the layout's ``recompute_modules`` where it names them, else
    the modules whose recomputation frees memory for this model and training:

    - the attention core where it keeps s×s tensors, i.e. without flash attention (Korthikanti
      §5). A fused (flash) attention keeps only its inputs, output and log-sum-exp, so
      recomputing it frees nothing: megatron-core warns that "for fused attention, you have no
      need to set 'core_attn' to recompute" (``TransformerConfig.__post_init__``);
    - MLA's up-projections (the per-head queries, keys and values, rebuilt from the latents:
      DeepSeek-V3 report §3.2.3);
    - the experts' activation function (``moe_act``, which megatron-core's ``TransformerConfig``
      refuses under fp8's delayed scaling).
    """
    if layout.recompute_modules is not None:
        return layout.recompute_modules
    modules = [] if training.flash_attention else ["core_attn"]
    if model.attention_type == "mla":
        modules.append("mla_up_proj")
    if model.is_moe and not training.delayed_scaling:
        modules.append("moe_act")
    return tuple(modules)


# What ``recompute: selective`` keeps, by engine (``EngineBehaviour.selective``):
# "attention": Megatron's --recompute-granularity selective recomputes the core attention;
# "matmuls": PyTorch selective activation checkpointing as torchtitan configures it
# (``torchtitan/distributed/activation_checkpoint.py``, op SAC): the outputs of attention and
# of every other matmul are saved, everything else is recomputed.
SELECTIVE_POLICIES = ("attention", "matmuls")


def matmul_policy_saved_elements(model: ModelSpec, layout: Layout, mlp: bool = True,
                                 fused_qkv: bool = False) -> float:
    """Elements per token one layer keeps under the "matmuls" policy.

    torchtitan's policy counts the matmuls of a block and saves the odd-numbered ones'
    outputs. A Llama block (SwiGLU) runs wq, wk, wv, wo, w1, w3, w2: q, v, w1's and w2's
    outputs are kept; with Q, K and V from one linear (``EngineBehaviour.fused_qkv``) it runs wqkv,
    wo, w1, w3, w2: q, k and v, w1's and w2's; a GPT block (GeLU) runs qkv, proj, fc1, fc2:
    qkv's and fc1's. Both keep the block's input (the checkpoint's) and the attention output.
    """
    h, t = model.hidden_size, layout.tp
    f = model.ffn_hidden_size if mlp else 0
    kv = max(model.num_kv_heads // t, 1) * model.value_head_dim
    keys = max(model.num_kv_heads // t, 1) * model.head_dim if fused_qkv else 0
    q, context = model.q_size / t, model.context_size / t
    sp = t if layout.sequence_parallel else 1
    if model.activation == "swiglu":
        return h / sp + q + keys + kv + f / t + h / sp + context
    return h / sp + (q + 2 * kv) + f / t + context


def layer_activation_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout,
                           recomputed: bool = False, selective: str = "attention", moe: bool = False,
                           quantized: bool = True, exchanges: Optional[bool] = None) -> float:
    """Bytes one layer keeps per micro-batch under the layout's recomputation.

    - ``none``: everything in :func:`layer_activations`.
    - ``selective``: with the "attention" policy, all but what the recomputed modules free
      (:func:`selective_freed_bytes`); with "matmuls", what :func:`matmul_policy_saved_elements`
      counts.
    - ``full`` (for a layer that is recomputed): only the layer's input,
      2·sbh (divided by t under sequence parallelism).
    """
    full = layer_activations(model, training, layout, moe, quantized)
    p = activation_bytes(training.precision)
    tokens = (training.seq_len / layout.cp) * layout.micro_batch_size
    if layout.recompute == "full" and recomputed:
        sp = layout.tp if layout.sequence_parallel else 1
        return residual_bytes(training) * tokens * model.hidden_size / sp
    if layout.recompute == "selective":
        if selective == "matmuls":
            # An MoE layer's expert part keeps what the policy saves of it: the all-to-all's outputs,
            # and the shared experts' (experts.exchanged_token_bytes); its grouped GEMMs are recomputed.
            kept = p * tokens * matmul_policy_saved_elements(model, layout, mlp=not moe,
                                                             fused_qkv=training.engine.fused_qkv)
            return kept + (exchanged_token_bytes(model, training, layout, exchanges) if moe else 0.0)
        return full.total - selective_freed_bytes(model, training, layout, full, moe, quantized)
    return full.total


def selective_freed_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout, full: LayerActivations,
                          moe: bool, quantized: bool) -> float:
    """What one layer's recomputed modules (:func:`selective_modules`) leave unsaved, of the
    tensors :func:`layer_activations` counts (``full``):

    - ``core_attn``: the attention core's s×s tensors (0 with flash attention);
    - ``mla_up_proj``: the queries, keys and values the up-projections rebuild;
    - ``layernorm``: the outputs of the norms that stand apart from the linear they feed. In
      megatron-core's Transformer Engine layer spec (``gpt_layer_specs.py``) the input norm
      stands apart under MLA (it feeds the two down-projections) and is fused into the QKV
      linear otherwise; the pre-MLP norm stands apart in MoE layers (it feeds the router and
      the dispatch) and is fused into the first MLP linear otherwise. A fused norm is an
      ``IdentityOp``, which the module skips. Under a low-precision recipe the consumers keep
      the 16-bit output instead of their quantized copy and the checkpoint discards it
      (``set_save_original_input``): what is freed is what those linears kept;
    - ``mlp`` (dense layers; megatron-core skips it in MoE layers): the MLP's input and hidden
      activations. The checkpoint keeps its input, which under Transformer Engine's fused
      norm-and-linear is the residual the norm already keeps;
    - ``moe`` (MoE layers): all the expert part keeps, but its input, the pre-MLP norm's output
      (itself recomputed under ``layernorm``);
    - ``moe_act``: the experts' activation output (:func:`experts.moe_act_output_bytes`);
    - ``shared_experts``: the shared experts' hidden activations.
    ``moe`` covers ``moe_act`` and ``shared_experts``, and a norm output is freed once.
    """

    modules = selective_modules(model, training, layout)
    g = saved_input_bytes(training.recipe if quantized else None, training.engine.fused_quantize,
                          activation_bytes(training.precision))
    sp = layout.tp if layout.sequence_parallel else 1
    tokens = (training.seq_len / layout.cp) * layout.micro_batch_size
    freed = 0.0
    if "core_attn" in modules:
        freed += full.attention_core
    if "mla_up_proj" in modules:
        freed += full.qkv
    if "layernorm" in modules and model.attention_type == "mla":
        # the input norm's output, the down-projections' input: each linear keeps the original
        # (set_for_recompute_input_layernorm), which the checkpoint discards
        freed += input_norm_output_bytes(model, layout, g, activation_bytes(training.precision)) * tokens
    if not moe:
        return freed + (full.mlp_input + full.mlp_hidden if "mlp" in modules else 0.0)
    if "moe" in modules:
        kept_input = 0.0 if "layernorm" in modules else router_input_bytes(training) * tokens * model.hidden_size / sp
        return freed + full.mlp_input + full.mlp_hidden - kept_input
    if "layernorm" in modules:
        freed += full.mlp_input
    elif "shared_experts" in modules:  # the shared experts' copy of the norm's output, inside their checkpoint
        freed += full.mlp_input - router_input_bytes(training) * tokens * model.hidden_size / sp
    if "moe_act" in modules:
        freed += moe_act_output_bytes(model, training, layout, g)
    if "shared_experts" in modules:
        freed += shared_expert_activation_bytes(model, training, layout, g)
    return freed


def embedding_activation_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout) -> float:
    """First stage: the dropout mask after the input embedding (Korthikanti §4.3); 0 without dropout."""
    if model.dropout == 0:
        return 0.0
    sp = layout.tp if layout.sequence_parallel else 1
    return (training.seq_len / layout.cp) * layout.micro_batch_size * model.hidden_size / sp


def saved_logit_bytes(training: TrainingSpec) -> float:
    """Bytes per logit the loss keeps for backward.

    Eager PyTorch (``F.cross_entropy`` on upcast logits) and Megatron's
    ``vocab_parallel_cross_entropy`` keep the fp32 log-softmax (softmax): 4. Compiled
    (``TrainingSpec.loss_compiled``), inductor's partition keeps the logits themselves, at
    the activations' width, and recomputes the softmax in backward from two fp32 numbers a row:
    on CPU (torch 2.13), a compiled ``cross_entropy(logits.float())`` of bf16 logits saves one
    bf16 tensor of the logits' shape, and its forward and backward kernels allocate nothing else
    of that size but the bf16 gradient (``tests/test_compiled_loss.py``).
    """
    return activation_bytes(training.precision) if training.loss_compiled else 4.0


def loss_chunks(model: ModelSpec, training: TrainingSpec) -> int:
    """The sequence chunks the LM head and the loss run in, one after another (torchtitan's
    ``ChunkedLossWrapper``: ``TrainingSpec.loss_chunk_count``); 1 where the model has multi-token
    prediction layers, whose loss torchtitan 0.3.0 runs on whole logits (``MTPLoss``,
    models/deepseek_v3/mtp.py: "TODO: Add ChunkedLoss support")."""
    return 1 if model.mtp_layers else training.loss_chunk_count


def chunked_loss(model: ModelSpec, training: TrainingSpec) -> bool:
    """Whether the LM head and the loss run inside torchtitan's ``ChunkedLossWrapper``
    (components/loss.py, ``ChunkedLossWrapper.__call__``), in :func:`loss_chunks` chunks, rather
    than on whole logits that the loss keeps for backward (``TrainingSpec.loss_in_chunks``).

    One chunk is the wrapper's state, not the whole logits': ``--loss.num_chunks 1`` still detaches
    the final norm's output, runs the LM head and the loss forward and backward on it inside the
    model's forward, writes the input gradient into its fp32 ``GradAccumulator`` and keeps no logits
    afterwards, with FSDP2 holding the head gathered (reshard off) through it. Measured on CPU with
    torchtitan 0.3.0 (``tests/test_chunked_loss_torch.py``): after the loss, one bf16 tensor of the
    hidden states' shape is saved, where torchtitan's ``CrossEntropyLoss`` on whole logits keeps the
    fp32 log-softmax, 4 bytes a logit. MTP's loss runs on whole logits (:func:`loss_chunks`)."""
    return not model.mtp_layers and training.loss_in_chunks


def logit_shards(layout: Layout, engine: EngineBehaviour) -> int:
    """The ranks one position's logits are split over: the tensor-parallel ones (the LM head is
    column-parallel over the vocabulary), or none where the engine gathers the head's output
    (``EngineBehaviour.gathers_logits_without_pipeline``: DeepSpeed's AutoTP), so that every rank
    holds the whole logits and runs the loss on all of them."""
    return 1 if engine.gathers_logits_without_pipeline and layout.pp == 1 else layout.tp


def _per_logit_gradient_bytes(training: TrainingSpec, tp: int) -> float:
    """The logits' gradients beside what the loss saved, per logit, at their peak: eager PyTorch's
    fp32 gradients of the log-softmax (``nll_loss_backward``) and of the logits
    (``_log_softmax_backward_data``), alive together, 4 + 4 (``EngineBehaviour.loss_gradient_bytes``);
    Megatron's in-place vocab-parallel cross-entropy, 2; a compiled loss, one write at the
    logits' width. At ``tp`` > 1, an engine's own vocab-parallel loss where it states one
    (``EngineBehaviour.tp_loss_gradient_bytes``): torchtitan's ``_LossParallelCrossEntropy.backward``
    (components/loss.py), ``zeros_like(log_probs)``, ``exp(log_probs)``, their sum and its product
    with the loss's gradient, three fp32 tensors at once, 12. Where the case names the loss
    (``training.loss``: ``behaviour.LOSS_GRADIENT_BYTES``), that one's."""
    if training.loss_compiled:
        return activation_bytes(training.precision)
    engine = training.engine
    if training.loss is not None:  # the case names the loss its script runs (training.loss)
        return LOSS_GRADIENT_BYTES[training.loss]
    if tp > 1 and engine.tp_loss_gradient_bytes is not None:
        return engine.tp_loss_gradient_bytes
    return engine.loss_gradient_bytes


def loss_gradient_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec) -> float:
    """Last stage, while the loss runs backward: what exists beside what the head keeps
    (:func:`head_activation_bytes`), not saved for backward but part of the stage's peak.

    Whole logits: their gradients, :func:`_per_logit_gradient_bytes` a logit (eager PyTorch's
    ``nll_loss_backward`` allocates the fp32 gradient of the log-softmax, and
    ``_log_softmax_backward_data`` the fp32 gradient of the logits beside it, before the bf16 cast
    the LM head's backward takes; Megatron's ``vocab_parallel_cross_entropy`` writes it into the
    saved softmax in place and hands back one bf16 copy; a compiled loss writes it once).

    In chunks (:func:`chunked_loss`, one included: torchtitan's ``ChunkedLossWrapper.__call__``,
    components/loss.py), during the forward: one chunk's logits (s/N of them), as the LM head wrote
    them, which the loop's ``logits`` still names through ``chunk_loss.backward()``, what the loss
    saves of them and their gradient (eager: 2 + 4 + 8, measured in ``tests/test_chunked_loss_torch.py``;
    2 + 4 + 12 in torchtitan's vocab-parallel loss at tp > 1, ``tests/test_loss_parallel_torch.py``;
    a compiled loss saves those very logits, so nothing beside them); and the
    ``GradAccumulator`` the chunks' input gradients are written into, an fp32 buffer of the
    hidden states' local shape (the whole local sequence: the final norm's output is replicated
    over the TP ranks), whose cast to the activations' width the head keeps. The LM head's
    fp32 gradient, which FSDP2 holds unsharded across the chunks, its reduce-scatter's input and
    its gathered weight are a weight's (``memory.chunked_loss_head_bytes``).
    """
    s = training.seq_len / layout.cp
    b = layout.micro_batch_size
    chunks = loss_chunks(model, training)
    shards = logit_shards(layout, training.engine)
    logits = s * b * built_vocab(model, layout.tp, training.engine) / shards
    if not chunked_loss(model, training):
        return _per_logit_gradient_bytes(training, shards) * logits
    p = activation_bytes(training.precision)
    accumulator = FP32_BYTES * s * b * model.hidden_size if p != FP32_BYTES else 0.0  # .to(fp32) is no copy
    # The head's output, alive through the chunk's backward; eager cross-entropy saves an fp32 copy
    # of it, a compiled loss saves it (saved_logit_bytes), already counted here.
    head_output = 0.0 if training.loss_compiled else p
    per_logit = head_output + saved_logit_bytes(training) + _per_logit_gradient_bytes(training, shards)
    return per_logit * logits / chunks + accumulator


def mtp_projection_activation_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout) -> float:
    """One multi-token prediction module beside its transformer layer, saved for backward: the
    inputs of its two norms (the hidden state and the next tokens' embedding) and of its 2h → h
    projection (the two normed halves joined): (2·residual + 2·p)·s·b·h/sp (megatron-core
    ``MultiTokenPredictionLayer``: ``enorm``, ``hnorm``, ``eh_proj``). Its layer and its head
    are counted as the decoder's (:func:`layer_activation_bytes`, :func:`head_activation_bytes`)."""
    s = training.seq_len / layout.cp
    sp = layout.tp if layout.sequence_parallel else 1
    return 2 * (residual_bytes(training) + activation_bytes(training.precision)) * s \
        * layout.micro_batch_size * model.hidden_size / sp


def head_activation_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout) -> float:
    """Last stage, kept for the backward: the final norm's input and what follows it.

    Whole logits: the LM head's input and the logits the loss keeps (Korthikanti §4.3 and
    Megatron's ``vocab_parallel_cross_entropy``, which casts the vocab-parallel logits to fp32 and
    keeps their softmax for backward: 4·s·b·V/t, V the engine's vocabulary, ``parameters.built_vocab``:
    Megatron-LM's padded; :func:`saved_logit_bytes`: less where the loss
    is compiled).

    In chunks (:func:`chunked_loss`, one included; torchtitan's ``ChunkedLossWrapper``), no logits outlive the
    loss: the LM head and the loss run forward and backward chunk by chunk inside it. What it
    leaves is the final norm's output, replicated over the TP ranks and held as the model's output
    until the backward, and the gradient it hands the decoder, saved by
    ``_DecoderOutputGradientBackProp``: p·s·b·h each, the whole local sequence.
    """
    p = activation_bytes(training.precision)
    s = training.seq_len / layout.cp
    b = layout.micro_batch_size
    sp = layout.tp if layout.sequence_parallel else 1
    norm_input = residual_bytes(training) * s * b * model.hidden_size / sp
    if chunked_loss(model, training):
        return norm_input + 2 * p * s * b * model.hidden_size
    return norm_input + p * s * b * model.hidden_size / sp \
        + saved_logit_bytes(training) * s * b * built_vocab(model, layout.tp, training.engine) \
        / logit_shards(layout, training.engine)
