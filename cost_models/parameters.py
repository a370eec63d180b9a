"""Parameter counts of a decoder-only transformer, dense or a mixture of experts, whole and per GPU.

Counts follow the weight shapes of Megatron-LM's GPT model and Hugging Face's Llama
(``modeling_llama.py``): Q, K, V and output projections (K and V narrowed by grouped-query
attention), two MLP matrices for GeLU or three for SwiGLU, one norm before attention and
one before the MLP, a final norm, input embeddings and an LM head that may share the
embedding matrix. Linear biases are not counted (Llama has none; for GPT-style models they
are under 0.1 % of the total).

Multi-head latent attention (DeepSeek-V2 report, arXiv:2405.04434, §2.1; megatron-core
``MLASelfAttention``): W_DQ (h × q_lora) and W_UQ (q_lora × a·(d_qk + d_rope)), or W_Q
(h × a·(d_qk + d_rope)) without query compression; W_DKV (h × (kv_lora + d_rope)), the latent
and the one shared rotary key; W_UKV (kv_lora × a·(d_qk + d_v)); W_O (a·d_v × h); and norms of
the two latents.

A mixture-of-experts layer (Shazeer et al. 2017; Fedus et al. 2022, Switch Transformer §2;
megatron-core ``MoELayer``) holds a router (h × E), E experts each an MLP of width f_e, and
shared experts of total width f_s that every token passes through. A token uses top-k
experts: the active parameters count only those.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from .behaviour import EngineBehaviour
from .model_spec import ModelSpec


def norm_parameters(model: ModelSpec) -> int:
    """One norm: LayerNorm has weight and bias (GPT family), RMSNorm only a weight (Llama family)."""
    return 2 * model.hidden_size if model.activation == "gelu" else model.hidden_size


def attention_matrices(model: ModelSpec) -> tuple[int, int]:
    """(weights split over tensor-parallel ranks, weights every tensor-parallel rank holds whole).

    Standard attention: W_Q (h × a·d), W_K and W_V (h × kv·d each, GQA) and W_O (a·d_v × h), all
    split. MLA: the up-projections and W_O are split; the down-projections to the latents and
    the latents' norms are replicated on every tensor-parallel rank (megatron-core builds them
    ``duplicated``)."""
    h, a = model.hidden_size, model.num_attention_heads
    if model.attention_type != "mla":
        return h * (model.q_size + model.kv_size + model.v_size) + model.context_size * h, 0
    q_width = a * model.head_dim  # head_dim = qk_head_dim + qk_rope_head_dim
    split = a * (model.qk_head_dim + model.v_head_dim) * model.kv_lora_rank + model.context_size * h
    whole = h * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank
    if model.q_lora_rank:
        split += model.q_lora_rank * q_width
        whole += h * model.q_lora_rank + model.q_lora_rank
    else:
        split += h * q_width
    return split, whole


def attention_parameters(model: ModelSpec) -> int:
    split, whole = attention_matrices(model)
    return split + whole


def mlp_matrices(model: ModelSpec) -> int:
    """Matrices of one MLP: GeLU up and down (2), SwiGLU gate, up and down (3)."""
    return 3 if model.activation == "swiglu" else 2


def mlp_parameters(model: ModelSpec, width: int = 0) -> int:
    """One MLP of ``width`` (default: the dense ffn_hidden_size): matrices × h × width."""
    return mlp_matrices(model) * model.hidden_size * (width or model.ffn_hidden_size)


def expert_parameters(model: ModelSpec) -> int:
    """One routed expert: an MLP of moe_ffn_hidden_size."""
    return mlp_parameters(model, model.moe_ffn_hidden_size)


def router_parameters(model: ModelSpec) -> int:
    return model.hidden_size * model.num_experts


def shared_expert_parameters(model: ModelSpec) -> int:
    width = model.moe_shared_expert_ffn_hidden_size
    return mlp_parameters(model, width) if width else 0


def dense_layer_parameters(model: ModelSpec) -> int:
    """A layer with a dense MLP."""
    return attention_parameters(model) + mlp_parameters(model) + 2 * norm_parameters(model)


def moe_layer_parameters(model: ModelSpec, experts: int = 0) -> int:
    """A layer with experts: all of them, or ``experts`` of them (a token's top-k)."""
    experts = experts or model.num_experts
    return (attention_parameters(model) + router_parameters(model) + experts * expert_parameters(model)
            + shared_expert_parameters(model) + 2 * norm_parameters(model))


def layer_parameters(model: ModelSpec) -> int:
    """A dense model's layer (kept for the dense formulas: Narayanan et al. 2021 eq. 2)."""
    return dense_layer_parameters(model)


def padded_vocab(vocab: int, tp: int, divisible_by: int = 128) -> int:
    """The vocabulary Megatron-LM builds its embedding, LM head and logits for
    (``_vocab_size_with_padding``, megatron/training/tokenizer/tokenizer.py): ``vocab`` up to a
    multiple of --make-vocab-size-divisible-by × tp (nanotron's ``_vocab_size_with_padding`` the same)."""
    step = divisible_by * tp
    return -(-vocab // step) * step


def built_vocab(model: ModelSpec, tp: int, engine: EngineBehaviour) -> int:
    """The vocabulary ``engine`` builds the model's embedding, LM head and logits for at tensor
    parallelism ``tp``: padded where it pads (``EngineBehaviour.vocab_padding_multiple``), else the
    model's. What the engine holds, computes and stores; the model's own counts and its model FLOPs
    (:func:`total_parameters`, ``flops.model_flops_per_token``) keep the model card's vocabulary."""
    multiple = engine.vocab_padding_multiple
    return model.vocab_size if multiple is None else padded_vocab(model.vocab_size, tp, multiple)


def embedding_shards(tp: int, pp: int, engine: EngineBehaviour) -> int:
    """The tensor-parallel ranks the input embedding (and a head tied to it) is split over: tp (Megatron's
    vocab-parallel embedding), or none where the engine leaves it whole on every rank
    (``EngineBehaviour.whole_embedding_without_pipeline``: DeepSpeed's AutoTP, ``pp`` 1)."""
    return 1 if engine.whole_embedding_without_pipeline and pp == 1 else tp


def head_shards(model: ModelSpec, tp: int, pp: int, engine: EngineBehaviour) -> int:
    """The tensor-parallel ranks the LM head's weight, and so its GEMM's vocabulary columns, is split
    over. A head tied to the input embedding is that matrix, split as it is (:func:`embedding_shards`):
    DeepSpeed 0.19.8's AutoTP leaves a gathered-output head tied to an embedding replicated, with the
    embedding (``module_inject/auto_tp.py``, ``_configure_gathered_column_tie_fallbacks``), so its GEMM
    runs over all V on every rank. An untied head is column-parallel over tp (megatron-core's
    ``ColumnParallelLinear``, torchtitan's colwise ``lm_head``, AutoTP's ``colwise_gather_output`` plan)."""
    return embedding_shards(tp, pp, engine) if model.tied_embeddings else tp


def embedding_parameters(model: ModelSpec, vocab: Optional[int] = None) -> int:
    """The input embedding's (or an untied LM head's) V × h, of ``vocab`` rows where given (the
    engine's, :func:`built_vocab`), else the model's."""
    return (model.vocab_size if vocab is None else vocab) * model.hidden_size


def mtp_projection_matrices(model: ModelSpec) -> tuple[int, int]:
    """One multi-token prediction module's own weights beside its transformer layer, as (split over
    tensor-parallel ranks, held whole): the column-parallel 2h → h projection of the joined
    hidden state and embedding (``eh_proj``), and its three norms (of the embedding, of the hidden
    state, and the final one; megatron-core ``MultiTokenPredictionLayer``)."""
    return 2 * model.hidden_size * model.hidden_size, 3 * norm_parameters(model)


def mtp_parameters(model: ModelSpec) -> int:
    """The multi-token prediction modules: each a layer of the decoder's last kind and its
    projection. They share the model's embedding and LM head, which are not counted again
    (Hugging Face's checkpoint keeps copies of both: DeepSeek-V3's 685B = 671B + 14B of MTP)."""
    layer = moe_layer_parameters(model) if model.mtp_layers_are_moe else dense_layer_parameters(model)
    return model.mtp_layers * (layer + sum(mtp_projection_matrices(model)))


def total_parameters(model: ModelSpec) -> int:
    """All distinct parameters: layers, input embedding, final norm, (untied) LM head and the
    multi-token prediction modules."""
    head = 0 if model.tied_embeddings else embedding_parameters(model)
    moe = model.num_moe_layers
    layers = (model.num_layers - moe) * dense_layer_parameters(model) + moe * moe_layer_parameters(model)
    return layers + embedding_parameters(model) + norm_parameters(model) + head + mtp_parameters(model)


def active_parameters(model: ModelSpec) -> int:
    """Parameters one token's forward pass computes with: every parameter but the routed experts
    it is not sent to (top-k of E in each MoE layer) and the input embedding, a lookup of one row
    (unless tied to the LM head, which multiplies by all of it). So OpenAI counts GPT-OSS (120b:
    5.13B active of 116.83B) and DeepSeek its V2 and V3 (37B of 671B); Mistral, Qwen and Meta count
    the embedding in (Mixtral 8x7B's 12.9B, Qwen3-30B-A3B's 3.3B, Llama 4's 17B are this plus it)."""
    moe = model.num_moe_layers + model.mtp_moe_layers
    unused = moe * (model.num_experts - model.moe_top_k) * expert_parameters(model) if model.is_moe else 0
    lookup = 0 if model.tied_embeddings else embedding_parameters(model)
    return total_parameters(model) - unused - lookup


@dataclass(frozen=True)
class StageParameters:
    """Parameters one GPU of a pipeline stage holds, before any ZeRO sharding: those every
    data-parallel (and context-parallel) rank replicates, and the experts, which the expert
    grid shards over ep and etp and replicates over the expert data-parallel ranks."""

    dense: float
    expert: float

    @property
    def total(self) -> float:
        return self.dense + self.expert


@lru_cache(maxsize=4096)
def largest_parameter(model: ModelSpec, first: bool, last: bool, tp: int, vocab: Optional[int] = None,
                      embedding_tp: Optional[int] = None) -> float:
    """Elements of the largest parameter tensor a GPU of a pipeline stage holds: the embedding (the
    first stage) or the LM head (the last), of ``vocab`` rows where given (:func:`built_vocab`), else a
    layer's largest matrix (an MLP's h × f, an expert's, W_Q's h × a·d), each split over tp, the input
    embedding (and a head tied to it on its stage) over ``embedding_tp`` where given
    (:func:`embedding_shards`)."""
    largest = model.hidden_size * max(model.ffn_hidden_size, model.moe_ffn_hidden_size, model.q_size) / tp
    embedding = embedding_parameters(model, vocab)
    lookup_tp = tp if embedding_tp is None else embedding_tp
    if first:
        largest = max(largest, embedding / lookup_tp)
    if last:
        largest = max(largest, embedding / (lookup_tp if first and model.tied_embeddings else tp))
    return largest


@lru_cache(maxsize=8192)
def stage_parameters(model: ModelSpec, layers: int, first: bool, last: bool, tp: int, moe_layers: int = 0,
                     ep: int = 1, etp: int = 1, vocab: Optional[int] = None,
                     embedding_tp: Optional[int] = None) -> StageParameters:
    """Parameters one GPU of a pipeline stage of ``layers`` layers (``moe_layers`` of them with
    experts) holds, before any ZeRO sharding, its embeddings of ``vocab`` rows where given (the
    engine's, :func:`built_vocab`), else of the model's, the input embedding (with a head tied to it)
    split over ``embedding_tp`` where given (:func:`embedding_shards`), else over tp.

    Matrices split over tp (Megatron column/row-parallel layers and the vocab-parallel
    embedding); norms, the router and MLA's down-projections are replicated. Each GPU holds
    E/ep of a layer's experts, each split over etp. The first stage holds the embedding, the
    last the final norm and LM head. With tied embeddings and more than one stage, the last
    stage keeps its own copy of the embedding matrix for the head and the two are all-reduced
    (Megatron ``LanguageModule.setup_embeddings_and_output_layer``).
    """
    norms = norm_parameters(model)
    split, whole = _layer_linears(model, layers, moe_layers)
    replicated: float = whole + layers * 2 * norms + moe_layers * router_parameters(model)
    experts = _local_experts(model, moe_layers, ep, etp)
    if first:
        if embedding_tp is None or embedding_tp == tp:  # vocab-parallel, summed with the rest as before
            split += embedding_parameters(model, vocab)
        else:
            replicated += embedding_parameters(model, vocab) / embedding_tp
    if last:
        replicated += norms
        if not model.tied_embeddings or not first:
            split += embedding_parameters(model, vocab)
        if model.mtp_layers:
            # The prediction modules (megatron-core builds them on the last stage), and, with an
            # untied head after the first stage, a copy of the input embedding for the tokens they
            # look ahead to (``GPTModel``: ``self.embedding`` where ``mtp_process``), all-reduced
            # with the first stage's like a tied one.
            mtp = model.mtp_layers
            mtp_moe = model.mtp_moe_layers
            mtp_split, mtp_whole = _layer_linears(model, mtp, mtp_moe)
            projection, projection_norms = mtp_projection_matrices(model)
            split += mtp_split + mtp * projection
            replicated += mtp_whole + mtp * (2 * norms + projection_norms) + mtp_moe * router_parameters(model)
            experts += _local_experts(model, mtp_moe, ep, etp)
            if not first and not model.tied_embeddings:
                split += embedding_parameters(model, vocab)
    return StageParameters(dense=split / tp + replicated, expert=experts)


def _layer_linears(model: ModelSpec, layers: int, moe_layers: int) -> tuple[int, int]:
    """(linear weights split over tensor-parallel ranks, those replicated on each) of ``layers``
    layers, ``moe_layers`` of them with experts, the routed experts apart: attention, the dense
    MLPs and the shared experts (:func:`attention_matrices`)."""
    split, whole = attention_matrices(model)
    dense = layers - moe_layers
    return (layers * split + dense * mlp_parameters(model) + moe_layers * shared_expert_parameters(model),
            layers * whole)


def _local_experts(model: ModelSpec, moe_layers: int, ep: int, etp: int) -> float:
    """Routed-expert weights one GPU holds: E/ep experts of each MoE layer, each split over etp."""
    return moe_layers * (model.num_experts // ep) * expert_parameters(model) / etp if moe_layers else 0.0


@lru_cache(maxsize=4096)
def stage_linear_parameters(model: ModelSpec, layers: int, tp: int, moe_layers: int = 0, ep: int = 1,
                            etp: int = 1) -> float:
    """Weights of the layers' linear GEMMs one GPU of a pipeline stage holds: what a low-precision
    recipe quantizes (``cost_models.quantization``: not the embedding, the LM head, the norms or
    the router, which stay in bf16)."""
    return stage_dense_linear_parameters(model, layers, tp, moe_layers) + _local_experts(model, moe_layers, ep, etp)


def stage_dense_linear_parameters(model: ModelSpec, layers: int, tp: int, moe_layers: int = 0) -> float:
    """:func:`stage_linear_parameters` less the routed experts: the linears every data-parallel rank
    holds (attention, dense MLPs, shared experts)."""
    split, whole = _layer_linears(model, layers, moe_layers)
    return split / tp + whole
