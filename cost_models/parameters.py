"""Parameter counts of a dense decoder-only transformer, whole and per GPU.

Counts follow the weight shapes of Megatron-LM's GPT model and Hugging Face's
Llama (``modeling_llama.py``): Q, K, V and output projections (K and V narrowed by
grouped-query attention), two MLP matrices for GeLU or three for SwiGLU, one norm
before attention and one before the MLP, a final norm, input embeddings and an
LM head that may share the embedding matrix. Linear biases are not counted (Llama
has none; for GPT-style models they are under 0.1 % of the total).
"""

from __future__ import annotations

from functools import lru_cache

from .specs import ModelSpec


def norm_parameters(model: ModelSpec) -> int:
    """One norm: LayerNorm has weight and bias (GPT family), RMSNorm only a weight (Llama family)."""
    return 2 * model.hidden_size if model.activation == "gelu" else model.hidden_size


def attention_parameters(model: ModelSpec) -> int:
    """W_Q (h×h), W_K and W_V (h×kv each, GQA) and W_O (h×h)."""
    h = model.hidden_size
    return h * (h + 2 * model.kv_size) + h * h


def mlp_parameters(model: ModelSpec) -> int:
    """GeLU: up and down (2·h·f); SwiGLU: gate, up and down (3·h·f)."""
    matrices = 3 if model.activation == "swiglu" else 2
    return matrices * model.hidden_size * model.ffn_hidden_size


def layer_parameters(model: ModelSpec) -> int:
    return attention_parameters(model) + mlp_parameters(model) + 2 * norm_parameters(model)


def embedding_parameters(model: ModelSpec) -> int:
    return model.vocab_size * model.hidden_size


def total_parameters(model: ModelSpec) -> int:
    """All distinct parameters: layers, input embedding, final norm and (untied) LM head."""
    head = 0 if model.tied_embeddings else embedding_parameters(model)
    return (model.num_layers * layer_parameters(model) + embedding_parameters(model)
            + norm_parameters(model) + head)


@lru_cache(maxsize=4096)
def stage_parameters(model: ModelSpec, layers: int, first: bool, last: bool, tp: int) -> float:
    """Parameters one GPU of a pipeline stage holds, before any ZeRO sharding.

    Matrices split over tp (Megatron column/row-parallel layers and the
    vocab-parallel embedding); norms are replicated. The first stage holds the
    embedding, the last the final norm and LM head. With tied embeddings and more
    than one stage, the last stage keeps its own copy of the embedding matrix for
    the head and the two are all-reduced (Megatron ``LanguageModule
    .setup_embeddings_and_output_layer``).
    """
    norms = norm_parameters(model)
    matrices = layers * (attention_parameters(model) + mlp_parameters(model))
    replicated = layers * 2 * norms
    if first:
        matrices += embedding_parameters(model)
    if last:
        replicated += norms
        if not model.tied_embeddings or not first:
            matrices += embedding_parameters(model)
    return matrices / tp + replicated
