"""Model fields for a case file, read from a local Hugging Face ``config.json``.

Only the file on disk is read (``planner.inputs.read_json``: bounded); nothing is imported from
``transformers`` and nothing touches the network. Supported families, chosen by
``model_type`` (or, when that key is absent, by ``architectures[0]``):

* ``llama``, ``mistral``, ``qwen2``: gated SiLU MLP ("swiglu"), GQA through
  ``num_key_value_heads``, embeddings untied unless the file says otherwise.
* ``granite`` (transformers' GraniteConfig, modeling_granite): Llama's layer, biases where
  ``attention_bias``/``mlp_bias`` say. Its ``embedding_multiplier``, ``residual_multiplier``,
  ``attention_multiplier`` and ``logits_scaling`` scale activations, scores and logits, no weight and no
  FLOP: the model spec holds none of them, so a launch built from the case leaves them at 1 (and the
  scores at 1/sqrt(head_dim)).
* ``phi3`` (Phi3Config, modeling_phi3): Llama's layer with q, k, v fused in ``qkv_proj`` and gate and up
  in ``gate_up_proj`` (the same matrices), no biases, every layer windowed to ``sliding_window`` where
  set (Phi-3-mini-4k: 2,047), RoPE on ``partial_rotary_factor`` of each head; its ``rope_scaling``
  (longrope), like Llama 3.1's, is not read.
* ``gpt_neox``: GELU MLP, ``intermediate_size`` defaulting to 4 x hidden, untied.
* ``gpt2``: GELU MLP, ``n_inner`` defaulting to 4 x ``n_embd``, tied unless
  ``tie_word_embeddings`` is explicitly false.

Mixtures of experts and multi-head latent attention:

* ``mixtral``: Mistral's layer with ``num_local_experts`` experts of ``intermediate_size`` in
  every layer, ``num_experts_per_tok`` per token.
* ``qwen3`` (dense, with its own ``head_dim``) and ``qwen3_moe``: ``num_experts`` of
  ``moe_intermediate_size``, MoE every ``decoder_sparse_step`` layers, ``mlp_only_layers``
  dense (a leading run only).
* ``qwen2_moe`` (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen3-MoE's experts and placement, no own
  ``head_dim``, q/k/v biases (``qkv_bias``), and a shared expert of ``shared_expert_intermediate_size``
  whose sigmoid gate (``shared_expert_gate``, hidden_size weights) the model spec does not hold: a
  launch leaves it ungated. Windowed only under ``use_sliding_window``, on the even layers below
  ``max_window_layers`` (Qwen2MoeConfig).
* ``deepseek_v2`` and ``deepseek_v3``: MLA (``q_lora_rank`` (null: none), ``kv_lora_rank``,
  ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``), ``n_routed_experts`` of
  ``moe_intermediate_size``, ``n_shared_experts`` of the same width, the first
  ``first_k_dense_replace`` layers dense of ``intermediate_size``, router ``scoring_func``,
  group-limited routing (``n_group``, ``topk_group``) unless ``topk_method`` is greedy,
  ``num_nextn_predict_layers`` multi-token prediction modules.
* ``llama4`` (its ``text_config``) and ``llama4_text``: ``num_local_experts`` of
  ``intermediate_size`` and one shared expert of the same width in every
  ``interleave_moe_layer_step``-th layer, the others dense of ``intermediate_size_mlp``;
  sigmoid router.
* ``glm4_moe`` (GLM-4.5): grouped-query attention with its own ``head_dim``, and DeepSeek-V3's
  mixture (``n_routed_experts``, ``n_shared_experts``, ``first_k_dense_replace``, a sigmoid router
  over ``n_group`` groups, ``num_nextn_predict_layers``).
* ``gpt_oss``: ``num_local_experts`` of ``intermediate_size`` in every layer; its clamped
  SwiGLU counts as SwiGLU.

Refused, saying what the model spec lacks (``REFUSED``): ``gemma2``, ``gemma3`` and ``gemma3_text``
(a GeGLU MLP, which the spec's activations, gelu and SiLU-gated swiglu, do not name; Gemma 2's
soft-capping; norms after each sublayer; Gemma 3's second RoPE base) and ``olmo2`` (q/k norms over all
heads together; norms after each sublayer instead of before).

A key the file leaves out takes its ``transformers`` config class's default where that differs
from what ``null`` means (``ABSENT_DEFAULTS``, each from its configuration file); a ``null`` key is
unset, as the classes treat it (kv heads = heads, no query compression). MoE layers are placed as
each family's modeling code places them, and refused where the planner's pattern (a dense prefix,
then every n-th layer) cannot hold them (:func:`_moe_pattern`). Every problem raises
:class:`planner.errors.CaseError`, which names the file and the key.
"""

from __future__ import annotations

import json
import os
import re
from typing import Callable

from cost_models.model_spec import router_group_problem
from planner.errors import CaseError
from planner.inputs import read_json
from planner.limits import (MAX_EXPERTS, MAX_INT, MAX_LAYERS, MAX_MODEL_WIDTH, MAX_ROPE_BASE, MAX_SEQ_LEN, MAX_STRING_CHARS,
                            MAX_VOCAB, MIN_FIGURE)

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "granite")
MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "llama4", "llama4_text", "gpt_oss", "glm4_moe")
SUPPORTED = LLAMA_LIKE + ("phi3", "gpt_neox", "gpt2") + MOE

# Families the model spec cannot hold faithfully, refused with what it lacks (each from transformers'
# modeling_<family>.py). Gemma's gated MLP has SwiGLU's three matrices, so its parameters and FLOPs would
# come out right as "swiglu" (gemma-2-9b: 9.24B), but activation "swiglu" is also what the launch files build
# (--swiglu, a SiLU gate): another model than the one named, and the spec has no GeGLU.
_GEGLU = ("its MLP is GeGLU (hidden_activation gelu_pytorch_tanh gating up_proj), and the model spec's "
          "activation is gelu (ungated) or swiglu (SiLU-gated, which the launch files build)")
_SANDWICH = "a norm on each sublayer's output as well as its input (post_attention_layernorm, post_feedforward_layernorm)"
REFUSED = {
    "gemma2": f"{_GEGLU}; nor does it hold Gemma 2's tanh soft-capping of attention scores and logits "
              f"(attn_logit_softcapping, final_logit_softcapping) or {_SANDWICH}",
    "gemma3_text": f"{_GEGLU}; nor does it hold {_SANDWICH} or the sliding layers' own RoPE base "
                   "(rope_local_base_freq beside rope_theta: one rope_base)",
    "olmo2": "its q and k norms (Olmo2Attention's q_norm, k_norm) span all heads together, where the model "
             "spec's qk_norm is per head (megatron-core's qk_layernorm) and needs no reduction across the "
             "tensor-parallel ranks that split the heads; and it normalizes each sublayer's output "
             "(post_attention_layernorm, post_feedforward_layernorm) instead of its input, which the spec cannot say",
}
REFUSED["gemma3"] = REFUSED["gemma3_text"]  # its text_config is a Gemma3TextConfig

# Model types that are another family's model under their own name, read as that family: Kimi K2
# "reuses the DeepseekV3CausalLM architecture" and sets model_type kimi_k2 only so that inference engines
# tell it apart (Moonshot's deployment guide, docs/deploy_guidance.md: change it to deepseek_v3 where a
# framework does not know it); its config.json is a DeepseekV3Config.
SAME_AS = {"kimi_k2": "deepseek_v3"}

# architectures[0] with its head suffix removed, lower-cased, mapped to model_type.
_ARCH_TO_TYPE = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gptneox": "gpt_neox",
                 "gpt2": "gpt2", "phi3": "phi3", "granite": "granite", "mixtral": "mixtral", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "deepseekv2": "deepseek_v2",
                 "deepseekv3": "deepseek_v3", "llama4": "llama4", "gptoss": "gpt_oss", "glm4moe": "glm4_moe",
                 "gemma2": "gemma2", "gemma3": "gemma3", "olmo2": "olmo2"}
_ARCH_SUFFIXES = ("ForConditionalGeneration", "ForCausalLM", "LMHeadModel", "Model")

_MISSING = object()

# The most each count may be, as a case's own keys are bounded (planner/limits.py), said of the
# config's key: 2,000 layers were refused as the case's model.num_layers. Widths, heads and the rest,
# MAX_MODEL_WIDTH.
HF_BOUNDS = {**dict.fromkeys(("num_hidden_layers", "n_layer", "first_k_dense_replace", "num_nextn_predict_layers",
                              "moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step"), MAX_LAYERS),
             "vocab_size": MAX_VOCAB, "n_routed_experts": MAX_EXPERTS, "num_local_experts": MAX_EXPERTS,
             "num_experts": MAX_EXPERTS, "sliding_window": MAX_SEQ_LEN}

# What a family's transformers config class takes for a key the file leaves out, where that is not
# what the same key given as null means (transformers' configuration_<family>.py, main as of 2026:
# Qwen3Config, Qwen3MoeConfig, MistralConfig, DeepseekV3Config, Llama4TextConfig, GptOssConfig).
# A DeepSeek-V3 file without q_lora_rank, n_shared_experts and first_k_dense_replace was read as no
# query compression, no shared expert and every layer MoE: 720.6B parameters for 682.6B.
# Qwen2Config's, Qwen3Config's and Qwen3MoeConfig's max_window_layers, 28 (a null one is no count: refused);
# Llama4TextConfig's attention_chunk_size, 8192 (a null one: no chunking).
QWEN_WINDOW_DEFAULTS = {"max_window_layers": 28}
ABSENT_DEFAULTS = {
    # Qwen2Config's num_key_value_heads is 32, MixtralConfig's 8, whatever the heads (None alone means the
    # heads): Mixtral-8x7B's file without it was read as 32 kv heads, not 8. Glm4MoeConfig (modular_glm4_moe.py):
    # 8 kv heads, one shared expert and one leading dense layer, read as kv = heads, none and none.
    "qwen2": {"num_key_value_heads": 32, **QWEN_WINDOW_DEFAULTS},
    "mixtral": {"num_key_value_heads": 8},
    "glm4_moe": {"num_key_value_heads": 8, "n_shared_experts": 1, "first_k_dense_replace": 1},
    "qwen3": {"num_key_value_heads": 32, "head_dim": 128, **QWEN_WINDOW_DEFAULTS},
    "qwen3_moe": {"num_key_value_heads": 4, **QWEN_WINDOW_DEFAULTS},
    # Qwen2MoeConfig: a file without shared_expert_intermediate_size has Qwen1.5-MoE's 5,632-wide shared
    # expert, not none; its window (4096) applies only under use_sliding_window.
    "qwen2_moe": {"num_key_value_heads": 16, "shared_expert_intermediate_size": 5632, "sliding_window": 4096,
                  **QWEN_WINDOW_DEFAULTS},
    "mistral": {"num_key_value_heads": 8},
    "deepseek_v3": {"q_lora_rank": 1536, "n_shared_experts": 1, "first_k_dense_replace": 3},
    # the text config's
    **dict.fromkeys(("llama4", "llama4_text"), {"num_key_value_heads": 8, "head_dim": 128,
                                                "attention_chunk_size": 8192}),
    "gpt_oss": {"num_key_value_heads": 8, "head_dim": 64, "num_experts_per_tok": 4},
}


def read_hf_config(path: str | os.PathLike) -> dict:
    """Model fields (case-file schema) from a local Hugging Face config.json. Never touches the network."""
    source = os.fspath(path)
    if isinstance(source, bytes):
        source = os.fsdecode(source)
    cfg = _load(source)
    reader = _Reader(source, cfg)
    family = _family(reader)
    reader.defaults = ABSENT_DEFAULTS.get(family, {})
    name = _name(reader)
    if family == "llama4":  # a vision-language model: the text decoder is under text_config
        reader = reader.nested("text_config")
    fields = _READERS[family](reader)
    _check_shapes(reader, family, fields)
    return {"name": name, **fields, **_sliding_window(reader, family), **_architecture(reader, family)}


def position_limit(path: str | os.PathLike) -> tuple[int, str] | None:
    """The longest sequence the config's model was built for and the key that states it, or None where
    it states none: its ``max_position_embeddings`` (GPT-2's ``n_positions``, which transformers'
    GPT2Config maps it to; Llama 4's in its ``text_config``). Not a model field: a RoPE model trains
    past it (with ``rope_scaling`` or a larger base), so it is only ever said, never refused."""
    source = os.fspath(path)
    cfg, prefix = _load(source), ""
    if isinstance(cfg.get("text_config"), dict) and "max_position_embeddings" not in cfg:
        cfg, prefix = cfg["text_config"], "text_config."
    key = "max_position_embeddings" if "max_position_embeddings" in cfg else "n_positions"
    limit = cfg.get(key)
    if limit is None:  # absent or null: the config states none
        return None
    # A count read is a count bounded: -1, "big", 8192.5, NaN and true were taken as no limit, without a word.
    if type(limit) is not int or not 0 < limit <= MAX_INT:
        raise CaseError(source, prefix + key, f"expected a positive integer of at most {MAX_INT} (the longest "
                                              f"sequence the model was built for), got {_show(limit)}")
    return limit, prefix + key


# Where a config lists no layer_types, the layers its family windows (transformers' config classes):
# GPT-OSS alternates sliding and full attention, sliding first (GptOssConfig), Mistral windows every layer.
FULL_EVERY_BY_FAMILY = {"gpt_oss": 2}
# Families whose configs window only the layers from max_window_layers on, and only with use_sliding_window.
QWEN_WINDOWS = ("qwen2", "qwen3", "qwen3_moe")
# Families that window only with use_sliding_window, false where the file is silent.
USE_SLIDING_WINDOW = QWEN_WINDOWS + ("qwen2_moe",)


def _sliding_window(r: "_Reader", family: str) -> dict:
    """``sliding_window`` and ``sliding_window_full_every`` (``ModelSpec``): the window where the config
    sets one and does not switch it off (Qwen2's ``use_sliding_window: false``), and which layers run
    full attention, from ``layer_types`` (one full layer every N, as megatron-core's
    ``window_attn_skip_freq`` N expresses) or the family's default."""
    window = r.zero_or_int("sliding_window")
    # Qwen's classes window only where use_sliding_window says so, false where the file is silent.
    if not window or not r.bool("use_sliding_window", family not in USE_SLIDING_WINDOW):  # "false" is no bool: refused
        return {}
    types = r.get("layer_types")
    if types is _MISSING and family in QWEN_WINDOWS:
        # Qwen2Config, Qwen3Config, Qwen3MoeConfig: layer i slides where i >= max_window_layers (28 where
        # the file is silent), so the first layers attend to every key: Qwen2.5-7B's 28 of 28 layers.
        layers = r.int("num_hidden_layers")
        if r.get("max_window_layers") is _MISSING:
            raise r.fail("max_window_layers", "expected the number of leading layers with full attention, got null")
        first_windowed = r.zero_or_int("max_window_layers")
        if first_windowed >= layers:
            return {}
        if first_windowed:
            raise r.fail("max_window_layers", f"{first_windowed} of {layers} layers with full attention, the rest "
                                              "windowed: expected 0 (every layer windowed) or at least "
                                              f"num_hidden_layers ({layers}, none windowed); megatron-core's "
                                              "window_attn_skip_freq holds one full layer every N, not a leading run")
        every = 0
    elif types is _MISSING and family == "qwen2_moe":
        # Qwen2MoeConfig.__post_init__ (transformers 5): layer i slides where i is even and i < max_window_layers
        # (28 where the file is silent), the others attend to every key; not Qwen2's rule.
        # (0 windows no layer, as i < 0 never holds: every layer attends to every key)
        value = r.get("max_window_layers")
        if type(value) is int and value < 0:
            raise r.fail("max_window_layers", f"expected an integer >= 0 (layers i < it may slide), got {value}")
        first_full = 0 if type(value) is int and value == 0 else r.int("max_window_layers")
        every = _full_every(r, "max_window_layers", [i % 2 == 0 and i < first_full
                                                     for i in range(r.int("num_hidden_layers"))])
    elif types is _MISSING:
        every = FULL_EVERY_BY_FAMILY.get(family, 0)
    else:
        if not isinstance(types, list) or any(t not in ("sliding_attention", "full_attention") for t in types):
            raise r.fail("layer_types", f"expected a list of 'sliding_attention' and 'full_attention', got {_show(types)}")
        every = _full_every(r, "layer_types", [t == "sliding_attention" for t in types])
    if every == 1:
        return {}
    return {"sliding_window": window, **({"sliding_window_full_every": every} if every else {})}


def _full_every(r: "_Reader", key: str, sliding: list[bool]) -> int:
    """N where every N-th layer (numbered from 1) runs full attention and the others slide, as
    megatron-core's ``window_attn_skip_freq`` N expresses (0: none full); another pattern is refused,
    naming ``key``, the config's key that set it."""
    full = [i + 1 for i, windowed in enumerate(sliding) if not windowed]
    every = full[0] if full else 0
    if full and full != list(range(every, len(sliding) + 1, every)):
        raise r.fail(key, "expected one full-attention layer every N layers (megatron-core's "
                          f"window_attn_skip_freq), got full attention at layers {_short(str(full))}")
    return every


# Families whose linear layers have biases exactly when the config's attention_bias/mlp_bias say
# (transformers' modeling files: q/k/v/o and the MLP's gate/up/down), absent meaning none. Qwen2
# keeps q/k/v biases whatever it says (Qwen2Attention: bias=True on q, k and v, none on o), GLM-4.5
# on q, k and v where attention_bias says (Glm4MoeAttention): ``qkv_bias`` and no other.
BIAS_BY_FLAGS = ("llama", "mistral", "granite", "mixtral", "qwen3", "qwen3_moe", "llama4", "deepseek_v2", "deepseek_v3")
BIASED = ("gpt2", "gpt_neox")


def _architecture(r: "_Reader", family: str) -> dict:
    """The architecture a launcher builds, where the config states it (``ModelSpec.normalization``…):
    the norm by its epsilon key, RoPE by rope_theta (GPT-NeoX rotates part of each head: left
    unstated), GPT-2's learned positions, biases, Qwen3's q/k norms. DeepSeek's MLA rotates its
    qk_rope_head_dim at rope_theta (10000 where the config leaves it out: transformers'
    DeepseekV3Config), unscaled as it pre-trained (its config's YaRN came with the context extension
    after). Llama 4 leaves the last layer of every no_rope_layer_interval (4 by default: transformers'
    Llama4TextConfig) without positions (NoPE, ``nope_every``); a no_rope_layers list of another
    pattern leaves its positions unstated."""
    out: dict = {}
    if r.get("rms_norm_eps") is not _MISSING:
        out["normalization"] = "rmsnorm"
    elif any(r.get(k) is not _MISSING for k in ("layer_norm_eps", "layer_norm_epsilon", "layernorm_epsilon")):
        out["normalization"] = "layernorm"
    base, key = r.get("rope_theta"), "rope_theta"
    parameters = r.get("rope_parameters")
    if base is _MISSING and isinstance(parameters, dict) and "rope_theta" in parameters:
        # transformers 5's configs keep the base in rope_parameters (convert_rope_params_to_dict): a
        # DeepSeek-V3 file so written was read at 10,000 and its launch files said --rotary-base 10000.
        base, key = parameters["rope_theta"], "rope_parameters.rope_theta"
    if base is not _MISSING and (isinstance(base, bool) or not isinstance(base, (int, float))
                                 or not 0 < base <= MAX_ROPE_BASE):  # false for NaN
        raise r.fail(key, f"expected RoPE's base, a number above 0 and at most {MAX_ROPE_BASE:g}, "
                          f"got {_show(base)}")
    if family == "gpt2":
        out["position_embedding"] = "learned"
    elif family in ("deepseek_v2", "deepseek_v3"):
        out["position_embedding"], out["rope_base"] = "rope", float(10000 if base is _MISSING else base)
    elif family == "llama4" and base is not _MISSING:
        interval, layers = r.get("no_rope_layer_interval"), r.get("no_rope_layers")
        interval = 4 if interval is _MISSING else interval
        count = r.get("num_hidden_layers")
        if isinstance(interval, int) and not isinstance(interval, bool) and isinstance(count, int) \
                and 0 < interval <= count and count % interval == 0:
            pattern = [int((i + 1) % interval != 0) for i in range(count)]  # 1: RoPE, 0: NoPE (transformers)
            if layers is _MISSING or not layers or layers == pattern:
                out["position_embedding"], out["rope_base"], out["nope_every"] = "rope", float(base), interval
    elif base is not _MISSING and family != "gpt_neox":
        out["position_embedding"], out["rope_base"] = "rope", float(base)
        if family == "glm4_moe":  # Glm4MoeConfig: RoPE on partial_rotary_factor of each head (0.5)
            share = r.figure("partial_rotary_factor", 0.5, 1.0)
            if share != 1.0:
                out["rotary_percent"] = share
    if family == "phi3":
        # Phi3Attention's qkv_proj and o_proj, Phi3MLP's gate_up_proj and down_proj: bias=False whatever the
        # file says (Phi3Config takes no attention_bias). RoPE on partial_rotary_factor of each head (1.0 where
        # left out: Phi3Config.convert_rope_params_to_dict), top-level or, as transformers 5 writes it, in
        # rope_parameters: Phi-4-mini's 0.75.
        out["linear_bias"] = False
        key = "partial_rotary_factor"
        if r.get(key) is _MISSING and isinstance(parameters, dict) and key in parameters:
            share = r.nested("rope_parameters").figure(key, 1.0, 1.0)
        else:
            share = r.figure(key, 1.0, 1.0)
        if share != 1.0:
            out["rotary_percent"] = share
    if family == "qwen2":
        out["linear_bias"], out["qkv_bias"] = False, True
    elif family == "qwen2_moe":  # Qwen2MoeAttention: biases on q, k and v where qkv_bias (true by default)
        out["linear_bias"], out["qkv_bias"] = False, r.bool("qkv_bias", True)
    elif family == "glm4_moe":
        out["linear_bias"], out["qkv_bias"] = False, r.bool("attention_bias", False)
    elif family in BIASED:
        out["linear_bias"] = True
    elif family in BIAS_BY_FLAGS:
        out["linear_bias"] = any(r.bool(k, False) for k in ("attention_bias", "mlp_bias"))
    if family in ("qwen3", "qwen3_moe"):
        out["qk_norm"] = True
    if family == "glm4_moe":
        # Glm4MoeAttention: a weighted RMSNorm of q and k where use_qk_norm (GLM-4.5's is off).
        out["qk_norm"] = r.bool("use_qk_norm", False)
    if family in ("llama4", "llama4_text"):
        # transformers' Llama4TextAttention: a weightless L2 norm of q and k where use_qk_norm (and RoPE).
        out["qk_l2_norm"] = r.bool("use_qk_norm", False)
    return out


# --------------------------------------------------------------------------- loading


def _load(source: str) -> dict:
    cfg = read_json(source)
    if not isinstance(cfg, dict):
        raise CaseError(source, "", f"expected a JSON object at the top level, got {_json_kind(cfg)}")
    return cfg


class _Reader:
    """Typed access to the config's keys; every failure is a CaseError naming the key."""

    def __init__(self, source: str, cfg: dict, defaults: dict | None = None):
        self.source = source
        self.cfg = cfg
        self.defaults = defaults or {}  # the config class's value of a key the file leaves out

    prefix = ""

    def fail(self, key: str, expected: str) -> CaseError:
        return CaseError(self.source, self.prefix + key, expected)

    def nested(self, key: str) -> "_Reader":
        """A reader of the object under ``key``, whose errors name ``key.inner``."""
        value = self.get(key)
        if not isinstance(value, dict):
            raise self.fail(key, f"expected an object (the text model's config), got "
                                 f"{'nothing' if value is _MISSING else _show(value)}")
        inner = _Reader(self.source, value, self.defaults)
        inner.prefix = f"{self.prefix}{key}."
        return inner

    def zero_or_int(self, key: str) -> int:
        """An integer that may be 0, absent or null, each meaning none."""
        value = self.get(key)
        return 0 if value is _MISSING or (value == 0 and type(value) is int) else self.int(key)

    def int_list(self, key: str) -> list[int]:
        value = self.get(key)
        if value is _MISSING:
            return []
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0
                                              for v in value):
            raise self.fail(key, f"expected a list of layer indices, got {_show(value)}")
        return value

    def get(self, key: str) -> object:
        """The value; a key the file leaves out, the config class's default where ABSENT_DEFAULTS
        has one (transformers builds the class from the file: an absent key takes the constructor's
        default), else _MISSING; a null, _MISSING (unset: the class's fallback, such as kv heads = heads)."""
        if key not in self.cfg and key in self.defaults:
            return self.defaults[key]
        value = self.cfg.get(key, None)
        return _MISSING if value is None else value

    def int(self, key: str, default: int | Callable[[], int] | None = None) -> int:
        value = self.get(key)
        if value is _MISSING:
            if default is None:
                if key in self.cfg:
                    raise self.fail(key, "expected a positive integer, got null")
                raise self.fail(key, "missing; expected an integer")
            return default() if callable(default) else default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {_show(value)}")
        if value < 1:
            raise self.fail(key, f"expected a positive integer, got {value}")
        most = HF_BOUNDS.get(key, MAX_MODEL_WIDTH)
        if value > most:
            raise self.fail(key, f"expected an integer at most {most}, got {_show(value)}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.get(key)
        if value is _MISSING:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {_show(value)}")
        return value

    def probability(self, key: str, default: float) -> float:
        value = self.get(key)
        if value is _MISSING:
            return float(default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"expected a dropout probability in [0, 1), got {_show(value)}")
        if not 0.0 <= value < 1.0:  # false for NaN and infinities; no float() of a huge integer
            raise self.fail(key, f"expected a dropout probability in [0, 1), got {_show(value)}")
        return float(value)

    def figure(self, key: str, default: float, most: float) -> float:
        """A positive number of at most ``most``, ``default`` where the file leaves it out."""
        value = self.get(key)
        if value is _MISSING:
            return float(default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not MIN_FIGURE <= value <= most:
            raise self.fail(key, f"expected a number from {MIN_FIGURE:g} to {most:g}, got {_show(value)}")
        return float(value)

    def string(self, key: str, default: str) -> str:
        value = self.get(key)
        if value is _MISSING:
            return default
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {_show(value)}")
        return value


# --------------------------------------------------------------------------- families


def _family(r: _Reader) -> str:
    supported = ", ".join(sorted(SUPPORTED))
    model_type = r.get("model_type")
    if model_type is not _MISSING:
        if not isinstance(model_type, str):
            raise r.fail("model_type", f"expected a string, one of {supported}; got {_show(model_type)}")
        model_type = SAME_AS.get(model_type, model_type)
        if model_type in REFUSED:
            raise r.fail("model_type", f"{model_type!r} is not read: {REFUSED[model_type]}")
        if model_type not in SUPPORTED:
            raise r.fail("model_type", f"unsupported model type {model_type!r}; expected one of {supported}")
        return model_type
    archs = r.get("architectures")
    if archs is _MISSING:
        raise r.fail("model_type", f"missing (and no 'architectures' list); expected one of {supported}")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise r.fail("architectures", f"expected a non-empty list of class names, got {_show(archs)}")
    arch = archs[0]
    stem = arch
    for suffix in _ARCH_SUFFIXES:
        if stem.endswith(suffix) and len(stem) > len(suffix):
            stem = stem[: -len(suffix)]
            break
    family = _ARCH_TO_TYPE.get(stem.lower())
    if family in REFUSED and stem != arch:
        raise r.fail("architectures", f"{arch!r} is not read: {REFUSED[family]}")
    if family is None or stem == arch:
        raise r.fail("architectures", f"unsupported architecture {arch!r} (and no model_type); "
                                      f"expected a model of type {supported}")
    if family == "llama4" and arch.endswith("ForCausalLM"):
        return "llama4_text"  # Llama4ForCausalLM is the text decoder alone: its keys are at the top
    return family


def _llama_like(r: _Reader) -> dict:
    _swiglu(r)
    return _head_dim(r, _decoder(r, "intermediate_size"))


def _head_dim(r: _Reader, fields: dict) -> dict:
    """``head_dim`` where the config gives one that is not hidden / heads (Qwen3, GPT-OSS, Llama 4)."""
    head_dim = r.get("head_dim")
    if head_dim is not _MISSING:
        value = r.int("head_dim")
        if value * fields["num_attention_heads"] != fields["hidden_size"]:
            fields["head_dim"] = value
    return fields


def _swiglu(r: _Reader, allowed: tuple[str, ...] = ("silu",)) -> None:
    act = r.string("hidden_act", "silu")
    if act not in allowed:
        raise r.fail("hidden_act", f"expected \"silu\" (a SwiGLU MLP), got {act!r}")


def _decoder(r: _Reader, ffn_key: str) -> dict:
    """Fields every gated-SiLU decoder of these families shares."""
    heads = r.int("num_attention_heads")
    return {
        "num_layers": r.int("num_hidden_layers"),
        "hidden_size": r.int("hidden_size"),
        "num_attention_heads": heads,
        "num_kv_heads": r.int("num_key_value_heads", heads),
        "ffn_hidden_size": r.int(ffn_key),
        "activation": "swiglu",
        "vocab_size": r.int("vocab_size"),
        "tied_embeddings": r.bool("tie_word_embeddings", False),
        "dropout": r.probability("attention_dropout", 0.0),
    }


def _moe_pattern(r: _Reader, key: str, layers: int, moe: list[int]) -> dict:
    """The planner's MoE layers for the family's own (``moe``, layer indices): a dense prefix of n
    layers, then every f-th layer, the last of each f (``ModelSpec.is_moe_layer``); a set no such
    pattern holds is refused, naming ``key``. DeepSeek's "i >= 2 and i % 2 == 0" is 2, 4, …: the prefix
    1, every 2nd after it (it was placed at 3, 5, …, one MoE layer short)."""
    if not moe or moe[-1] >= layers:
        raise r.fail(key, f"leaves no MoE layer among the {layers} layers" if not moe else
                          f"names layer {moe[-1]}, past the {layers} layers")
    freq = moe[1] - moe[0] if len(moe) > 1 else max(1, layers - moe[0])
    first = moe[0] - freq + 1
    if first < 0 or moe != list(range(first + freq - 1, layers, freq)):
        raise r.fail(key, f"places MoE layers at {_show(moe[:8])}{' …' if len(moe) > 8 else ''}, which the planner "
                          "cannot hold: it models a run of dense layers, then an MoE layer every n-th layer")
    out = {"moe_layer_freq": freq}
    if first:
        out["moe_first_dense_layers"] = first
    return out


def _mixtral(r: _Reader) -> dict:
    _swiglu(r)
    fields = _decoder(r, "intermediate_size")
    fields.update(num_experts=r.int("num_local_experts"), moe_top_k=r.int("num_experts_per_tok"))
    return _head_dim(r, fields)


def _qwen3_moe(r: _Reader) -> dict:
    _swiglu(r)
    fields = _decoder(r, "intermediate_size")
    fields.update(num_experts=r.int("num_experts"), moe_top_k=r.int("num_experts_per_tok"),
                  moe_ffn_hidden_size=r.int("moe_intermediate_size"))
    # Qwen3MoeDecoderLayer: experts where the layer is not in mlp_only_layers and (i + 1) % step == 0
    step, dense = r.int("decoder_sparse_step", 1), set(r.int_list("mlp_only_layers"))
    layers = fields["num_layers"]
    fields.update(_moe_pattern(r, "decoder_sparse_step" if not dense else "mlp_only_layers", layers,
                               [i for i in range(layers) if i not in dense and (i + 1) % step == 0]))
    # No shared expert: Qwen3MoeSparseMoeBlock has none, and Qwen3MoeConfig takes no
    # shared_expert_intermediate_size (Qwen2-MoE's key), which a file may still carry.
    return _head_dim(r, fields)


def _qwen2_moe(r: _Reader) -> dict:
    """Qwen2-MoE (transformers' Qwen2MoeConfig, modeling_qwen2_moe): Qwen3-MoE's experts and their
    placement (Qwen2MoeDecoderLayer: where the layer is not in mlp_only_layers and (i + 1) %
    decoder_sparse_step == 0), plus Qwen2MoeSparseMoeBlock's shared expert, an MLP of
    shared_expert_intermediate_size every token passes through. Its output is scaled by a sigmoid gate
    (shared_expert_gate: hidden_size weights, one per layer) the model spec does not hold: its
    hidden_size weights and FLOPs per token are under 0.001 % of the model's, and a launch built from the
    case leaves the shared expert ungated."""
    fields = _qwen3_moe(r)
    shared = r.zero_or_int("shared_expert_intermediate_size")
    if shared:
        fields["moe_shared_expert_ffn_hidden_size"] = shared
    return fields


def _deepseek_v2(r: _Reader) -> dict:
    return _deepseek(r, _router_groups(r, "greedy", None))


def _deepseek_v3(r: _Reader) -> dict:
    return _deepseek(r, _router_groups(r, "noaux_tc", (8, 4)))


# DeepSeek's routers (transformers' DeepseekV2/V3 modeling code): all experts, or the groups first.
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


def _router_groups(r: _Reader, method: str, groups: tuple[int, int] | None) -> dict:
    """Group-limited routing: DeepSeek's modeling code picks ``topk_group`` of ``n_group`` expert
    groups first under ``topk_method`` group_limited_greedy (V2) and noaux_tc (V3), not under
    greedy. ``method`` and ``groups``: the config class's defaults (DeepseekV3Config: noaux_tc,
    8 groups, 4 picked; DeepseekV2Config: greedy, none)."""
    chosen = r.string("topk_method", method)
    if chosen not in TOPK_METHODS:  # a misspelt greedy would turn group-limited routing on
        raise r.fail("topk_method", f"expected one of {', '.join(TOPK_METHODS)}, got {_show(chosen)}")
    if chosen == "greedy":
        return {}
    fields = {"moe_router_num_groups": r.int("n_group", groups and groups[0]),
              "moe_router_group_topk": r.int("topk_group", groups and groups[1])}
    return {} if fields["moe_router_num_groups"] == 1 else fields


def _topk_scaling(r: _Reader) -> dict:
    """What the router's top-k weights are multiplied by (``routed_scaling_factor``: DeepSeek-V3's 2.5;
    1.0 where left out, transformers' DeepseekV3Config and Glm4MoeConfig), where it is not 1."""
    scaling = r.figure("routed_scaling_factor", 1.0, 1000.0)
    return {} if scaling == 1.0 else {"moe_router_topk_scaling": scaling}


def _deepseek(r: _Reader, groups: dict) -> dict:
    _swiglu(r)
    fields = _decoder(r, "intermediate_size")
    del fields["num_kv_heads"]  # MLA: every head has its own keys and values
    width = r.int("moe_intermediate_size")
    shared = r.zero_or_int("n_shared_experts")
    router = r.string("scoring_func", "softmax")
    if router not in ("softmax", "sigmoid"):
        raise r.fail("scoring_func", f"expected softmax or sigmoid, got {router!r}")
    fields.update(attention_type="mla", q_lora_rank=r.zero_or_int("q_lora_rank"),
                  kv_lora_rank=r.int("kv_lora_rank"), qk_head_dim=r.int("qk_nope_head_dim"),
                  qk_rope_head_dim=r.int("qk_rope_head_dim"), v_head_dim=r.int("v_head_dim"),
                  num_experts=r.int("n_routed_experts"), moe_top_k=r.int("num_experts_per_tok"),
                  moe_ffn_hidden_size=width, moe_router=router, **groups, **_topk_scaling(r))
    # DeepSeek's modeling code: experts where i >= first_k_dense_replace and i % moe_layer_freq == 0
    first, freq, layers = r.zero_or_int("first_k_dense_replace"), r.int("moe_layer_freq", 1), fields["num_layers"]
    fields.update(_moe_pattern(r, "moe_layer_freq" if freq > 1 else "first_k_dense_replace", layers,
                               [i for i in range(layers) if i >= first and i % freq == 0]))
    mtp = r.zero_or_int("num_nextn_predict_layers")  # DeepSeek's configuration_deepseek.py; V3 ships 1
    if mtp:
        fields["mtp_layers"] = mtp
    if shared:
        fields["moe_shared_expert_ffn_hidden_size"] = shared * width
    if not fields["q_lora_rank"]:
        del fields["q_lora_rank"]
    return fields


def _glm4_moe(r: _Reader) -> dict:
    """GLM-4.5 (transformers' Glm4MoeConfig and modeling_glm4_moe): grouped-query attention with its own
    head_dim, then DeepSeek-V3's mixture: n_routed_experts of moe_intermediate_size, n_shared_experts of
    the same width, the first first_k_dense_replace layers dense of intermediate_size, a sigmoid router
    (Glm4MoeTopkRouter) over n_group groups picking topk_group (its config has no topk_method: always
    grouped), num_nextn_predict_layers multi-token prediction modules."""
    _swiglu(r)
    fields = _decoder(r, "intermediate_size")
    width = r.int("moe_intermediate_size")
    shared = r.zero_or_int("n_shared_experts")
    fields.update(num_experts=r.int("n_routed_experts"), moe_top_k=r.int("num_experts_per_tok"),
                  moe_ffn_hidden_size=width, moe_router="sigmoid", **_router_groups(r, "noaux_tc", (1, 1)),
                  **_topk_scaling(r))
    first, layers = r.zero_or_int("first_k_dense_replace"), fields["num_layers"]
    fields.update(_moe_pattern(r, "first_k_dense_replace", layers, [i for i in range(layers) if i >= first]))
    mtp = r.zero_or_int("num_nextn_predict_layers")
    if mtp:
        fields["mtp_layers"] = mtp
    if shared:
        fields["moe_shared_expert_ffn_hidden_size"] = shared * width
    return _head_dim(r, fields)


def _llama4(r: _Reader) -> dict:
    _swiglu(r)
    fields = _decoder(r, "intermediate_size_mlp")
    width = r.int("intermediate_size")
    fields.update(num_experts=r.int("num_local_experts"), moe_top_k=r.int("num_experts_per_tok"),
                  moe_ffn_hidden_size=width, moe_shared_expert_ffn_hidden_size=width, moe_router="sigmoid")
    # Llama4TextConfig: moe_layers where given, else every interleave_moe_layer_step-th layer, the last of each
    layers, step = fields["num_layers"], r.int("interleave_moe_layer_step", 1)
    listed = r.get("moe_layers") is not _MISSING
    moe = sorted(set(r.int_list("moe_layers"))) if listed else list(range(step - 1, layers, step))
    fields.update(_moe_pattern(r, "moe_layers" if listed else "interleave_moe_layer_step", layers, moe))
    # Llama4TextConfig: the RoPE layers attend within chunks of attention_chunk_size (ABSENT_DEFAULTS where
    # the file is silent, none where null), which the case refuses past (ModelSpec.attention_chunk_size).
    if r.get("attention_chunk_size") is not _MISSING:
        fields["attention_chunk_size"] = r.int("attention_chunk_size")
    return _head_dim(r, fields)


def _gpt_oss(r: _Reader) -> dict:
    _swiglu(r)  # a clamped SwiGLU: three matrices as SwiGLU
    fields = _decoder(r, "intermediate_size")
    top_k = r.int("num_experts_per_tok", lambda: r.int("experts_per_token"))
    fields.update(num_experts=r.int("num_local_experts"), moe_top_k=top_k)
    return _head_dim(r, fields)


def _phi3(r: _Reader) -> dict:
    """Phi-3 (transformers' Phi3Config, modeling_phi3): Llama's layer with q, k and v in one qkv_proj and
    gate and up in one gate_up_proj, the same weights and FLOPs as the separate matrices; SiLU-gated
    (Phi3MLP: up_states * act(gate)). Dropout on the attention scores (attention_dropout), on each
    sublayer's output before the residual add (resid_pdrop) and on the embeddings (embd_pdrop): the
    largest of them, as GPT-2's three are read."""
    _swiglu(r)
    fields = _head_dim(r, _decoder(r, "intermediate_size"))
    fields["dropout"] = max(r.probability(k, 0.0) for k in ("attention_dropout", "resid_pdrop", "embd_pdrop"))
    return fields


def _gpt_neox(r: _Reader) -> dict:
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    _gelu(r, "hidden_act", "gelu")
    return {
        "num_layers": r.int("num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": heads,
        "ffn_hidden_size": r.int("intermediate_size", lambda: 4 * hidden),
        "activation": "gelu",
        "vocab_size": r.int("vocab_size"),
        "tied_embeddings": r.bool("tie_word_embeddings", False),
        "dropout": max(r.probability("attention_dropout", 0.0), r.probability("hidden_dropout", 0.0)),
    }


def _gpt2(r: _Reader) -> dict:
    hidden = r.int("n_embd")
    heads = r.int("n_head")
    _gelu(r, "activation_function", "gelu_new")
    return {
        "num_layers": r.int("n_layer"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": heads,
        "ffn_hidden_size": r.int("n_inner", lambda: 4 * hidden),
        "activation": "gelu",
        "vocab_size": r.int("vocab_size"),
        "tied_embeddings": r.bool("tie_word_embeddings", True),
        "dropout": max(r.probability(k, 0.1) for k in ("resid_pdrop", "attn_pdrop", "embd_pdrop")),
    }


def _gelu(r: _Reader, key: str, default: str) -> None:
    act = r.string(key, default)
    if not act.startswith("gelu"):
        raise r.fail(key, f"expected a GELU variant (gelu, gelu_new, gelu_fast, ...), got {act!r}")


def _check_shapes(r: _Reader, family: str, fields: dict) -> None:
    """Shape rules the planner relies on, reported against the config's own keys."""
    gpt2 = family == "gpt2"
    hidden_key, heads_key = ("n_embd", "n_head") if gpt2 else ("hidden_size", "num_attention_heads")
    hidden, heads = fields["hidden_size"], fields["num_attention_heads"]
    kv = fields.get("num_kv_heads", heads)
    if hidden % heads and "head_dim" not in fields and fields.get("attention_type") != "mla":
        raise r.fail(heads_key, f"must divide {hidden_key} {hidden}, got {heads}")
    if heads % kv:
        raise r.fail("num_key_value_heads", f"must divide num_attention_heads {heads}, got {kv}")
    if fields.get("num_experts"):
        experts, top_k = fields["num_experts"], fields["moe_top_k"]
        if top_k > experts:
            raise r.fail("num_experts_per_tok", f"at most the {experts} experts, got {top_k}")
        if "moe_router_num_groups" in fields:  # DeepSeek's group-limited routing
            problem = router_group_problem(experts, fields["moe_router_num_groups"],
                                           fields["moe_router_group_topk"], top_k)
            if problem is not None:
                field, expected = problem
                names = {"moe_router_num_groups": "n_group", "moe_router_group_topk": "topk_group",
                         "num_experts": "n_routed_experts", "moe_top_k": "num_experts_per_tok"}
                raise r.fail(names[field], re.sub(r"\b(" + "|".join(names) + r")\b", lambda m: names[m[1]], expected))
        if fields.get("moe_first_dense_layers", 0) >= fields["num_layers"]:
            raise r.fail("first_k_dense_replace" if family.startswith("deepseek") else "mlp_only_layers",
                         f"leaves no MoE layer among the {fields['num_layers']} layers")


def _name(r: _Reader) -> str:
    name = r.get("_name_or_path")
    if name is not _MISSING and not isinstance(name, str):
        raise r.fail("_name_or_path", f"expected a string, got {_show(name)}")
    if isinstance(name, str) and len(name) > MAX_STRING_CHARS:
        # Checked here, where the file says it: the case's model.name bound named a key the case never wrote.
        raise r.fail("_name_or_path", f"expected a string of at most {MAX_STRING_CHARS:,} characters, got one of "
                                      f"{len(name):,}")
    if isinstance(name, str) and name.strip():
        return name
    # No name in the config: its folder (a download's local-dir, or just "hf") with the architecture
    # transformers builds from it, so that a generic folder still says what the model is.
    folder = os.path.basename(os.path.dirname(os.path.abspath(r.source))) \
        or os.path.splitext(os.path.basename(r.source))[0]
    architectures = r.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str) \
            and architectures[0].strip():
        return f"{folder} ({architectures[0]})"
    return folder


_READERS = {**{family: _llama_like for family in LLAMA_LIKE}, "phi3": _phi3, "gpt_neox": _gpt_neox, "gpt2": _gpt2,
            "mixtral": _mixtral, "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe, "deepseek_v2": _deepseek_v2, "deepseek_v3": _deepseek_v3,
            "llama4": _llama4, "llama4_text": _llama4, "gpt_oss": _gpt_oss, "glm4_moe": _glm4_moe}


# --------------------------------------------------------------------------- helpers


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if value is None:
        return "null"
    return type(value).__name__


def _show(value: object) -> str:
    """A value as JSON spells it, kept short."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return _short(text)


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
