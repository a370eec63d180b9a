"""Model fields for a case file, read from a local Hugging Face ``config.json``.

Only the file on disk is read (``planner.inputs.read_json``: bounded); nothing is imported from
``transformers`` and nothing touches the network. Supported families, chosen by
``model_type`` (or, when that key is absent, by ``architectures[0]``):

* ``llama``, ``mistral``, ``qwen2``: gated SiLU MLP ("swiglu"), GQA through
  ``num_key_value_heads``, embeddings untied unless the file says otherwise.
* ``gpt_neox``: GELU MLP, ``intermediate_size`` defaulting to 4 x hidden, untied.
* ``gpt2``: GELU MLP, ``n_inner`` defaulting to 4 x ``n_embd``, tied unless
  ``tie_word_embeddings`` is explicitly false.

Defaults are the ones the ``transformers`` config classes use when a key is
absent or ``null``. Every problem raises :class:`planner.errors.CaseError`, which
names the file and the key.
"""

from __future__ import annotations

import json
import os
from typing import Callable

from planner.errors import CaseError
from planner.inputs import read_json
from planner.limits import MAX_INT

LLAMA_LIKE = ("llama", "mistral", "qwen2")
SUPPORTED = LLAMA_LIKE + ("gpt_neox", "gpt2")

# architectures[0] with its head suffix removed, lower-cased, mapped to model_type.
_ARCH_TO_TYPE = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "gptneox": "gpt_neox", "gpt2": "gpt2"}
_ARCH_SUFFIXES = ("ForCausalLM", "LMHeadModel", "Model")

_MISSING = object()


def read_hf_config(path: str | os.PathLike) -> dict:
    """Model fields (case-file schema) from a local Hugging Face config.json. Never touches the network."""
    source = os.fspath(path)
    if isinstance(source, bytes):
        source = os.fsdecode(source)
    cfg = _load(source)
    reader = _Reader(source, cfg)
    family = _family(reader)
    if family in LLAMA_LIKE:
        fields = _llama_like(reader)
    elif family == "gpt_neox":
        fields = _gpt_neox(reader)
    else:
        fields = _gpt2(reader)
    _check_shapes(reader, family, fields)
    return {"name": _name(reader), **fields}


# --------------------------------------------------------------------------- loading


def _load(source: str) -> dict:
    cfg = read_json(source)
    if not isinstance(cfg, dict):
        raise CaseError(source, "", f"expected a JSON object at the top level, got {_json_kind(cfg)}")
    return cfg


class _Reader:
    """Typed access to the config's keys; every failure is a CaseError naming the key."""

    def __init__(self, source: str, cfg: dict):
        self.source = source
        self.cfg = cfg

    def fail(self, key: str, expected: str) -> CaseError:
        return CaseError(self.source, key, expected)

    def get(self, key: str) -> object:
        """The value, or _MISSING when the key is absent or null (transformers treats both as unset)."""
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
        if value > MAX_INT:
            raise self.fail(key, f"expected an integer at most {MAX_INT}, got {_show(value)}")
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
    if family is None or stem == arch:
        raise r.fail("architectures", f"unsupported architecture {arch!r} (and no model_type); "
                                      f"expected a model of type {supported}")
    return family


def _llama_like(r: _Reader) -> dict:
    heads = r.int("num_attention_heads")
    act = r.string("hidden_act", "silu")
    if act != "silu":
        raise r.fail("hidden_act", f"expected \"silu\" (a SwiGLU MLP), got {act!r}")
    return {
        "num_layers": r.int("num_hidden_layers"),
        "hidden_size": r.int("hidden_size"),
        "num_attention_heads": heads,
        "num_kv_heads": r.int("num_key_value_heads", heads),
        "ffn_hidden_size": r.int("intermediate_size"),
        "activation": "swiglu",
        "vocab_size": r.int("vocab_size"),
        "tied_embeddings": r.bool("tie_word_embeddings", False),
        "dropout": r.probability("attention_dropout", 0.0),
    }


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
    hidden, heads, kv = fields["hidden_size"], fields["num_attention_heads"], fields["num_kv_heads"]
    if hidden % heads:
        raise r.fail(heads_key, f"must divide {hidden_key} {hidden}, got {heads}")
    if heads % kv:
        raise r.fail("num_key_value_heads", f"must divide num_attention_heads {heads}, got {kv}")
    head_dim = r.get("head_dim")
    if head_dim is not _MISSING and head_dim != hidden // heads:
        raise r.fail("head_dim", f"expected {hidden_key} / {heads_key} = {hidden // heads} "
                                 f"(the planner derives the head size), got {_show(head_dim)}")


def _name(r: _Reader) -> str:
    name = r.get("_name_or_path")
    if name is not _MISSING and not isinstance(name, str):
        raise r.fail("_name_or_path", f"expected a string, got {_show(name)}")
    if isinstance(name, str) and name.strip():
        return name
    folder = os.path.basename(os.path.dirname(os.path.abspath(r.source)))
    return folder or os.path.splitext(os.path.basename(r.source))[0]


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
