"""read_hf_config: published config.json files map to the case file's model fields.

The fixtures under tests/fixtures/hf/ are the real files (tests/fixtures/hf/SOURCES.md
says where each came from); the expected numbers are the published ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.errors import CaseError
from planner.hf_config import read_hf_config

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
MODEL_KEYS = {"name", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
              "ffn_hidden_size", "activation", "vocab_size", "tied_embeddings", "dropout"}
# Stated where the config states them (planner/hf_config.py, _architecture).
ARCHITECTURE_KEYS = {"normalization", "position_embedding", "rope_base", "linear_bias", "qk_norm", "qkv_bias",
                     "sliding_window", "sliding_window_full_every"}


def fixture(name: str) -> Path:
    return FIXTURES / name / "config.json"


def published(name: str) -> dict:
    return json.loads(fixture(name).read_text())


def write(tmp_path: Path, cfg: object, folder: str = "some-model") -> Path:
    d = tmp_path / folder
    d.mkdir(exist_ok=True)
    p = d / "config.json"
    p.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return p


# --------------------------------------------------------------------------- published models

EXPECTED = {
    "Llama-2-7b-hf": dict(name="meta-llama/Llama-2-7b-hf", num_layers=32, hidden_size=4096,
                          num_attention_heads=32, num_kv_heads=32, ffn_hidden_size=11008,
                          activation="swiglu", vocab_size=32000, tied_embeddings=False, dropout=0.0,
        normalization="rmsnorm", linear_bias=False),
    "Meta-Llama-3-8B": dict(name="Meta-Llama-3-8B (LlamaForCausalLM)", num_layers=32, hidden_size=4096,
                            num_attention_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
                            activation="swiglu", vocab_size=128256, tied_embeddings=False, dropout=0.0,
        normalization="rmsnorm", position_embedding="rope", rope_base=500000.0, linear_bias=False),
    "Mistral-7B-v0.1": dict(name="Mistral-7B-v0.1 (MistralForCausalLM)", num_layers=32, hidden_size=4096,
                            num_attention_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
                            activation="swiglu", vocab_size=32000, tied_embeddings=False, dropout=0.0,
        normalization="rmsnorm", position_embedding="rope", rope_base=10000.0, linear_bias=False,
        sliding_window=4096),
    "Qwen2.5-72B": dict(name="Qwen2.5-72B (Qwen2ForCausalLM)", num_layers=80, hidden_size=8192,
                        num_attention_heads=64, num_kv_heads=8, ffn_hidden_size=29568,
                        activation="swiglu", vocab_size=152064, tied_embeddings=False, dropout=0.0,
        normalization="rmsnorm", position_embedding="rope", rope_base=1000000.0, linear_bias=False, qkv_bias=True),
    "gpt-neox-20b": dict(name="gpt-neox-20b (GPTNeoXForCausalLM)", num_layers=44, hidden_size=6144,
                         num_attention_heads=64, num_kv_heads=64, ffn_hidden_size=24576,
                         activation="gelu", vocab_size=50432, tied_embeddings=False, dropout=0.0,
        normalization="layernorm", linear_bias=True),
    "gpt2": dict(name="gpt2 (GPT2LMHeadModel)", num_layers=12, hidden_size=768,
                 num_attention_heads=12, num_kv_heads=12, ffn_hidden_size=3072,
                 activation="gelu", vocab_size=50257, tied_embeddings=True, dropout=0.1,
        normalization="layernorm", position_embedding="learned", linear_bias=True),
}


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_published_config_maps_to_published_numbers(model):
    fields = read_hf_config(fixture(model))
    assert fields == EXPECTED[model]
    assert set(fields) - ARCHITECTURE_KEYS == MODEL_KEYS
    assert type(fields["dropout"]) is float
    assert type(fields["tied_embeddings"]) is bool
    for key in MODEL_KEYS - {"name", "activation", "tied_embeddings", "dropout"}:
        assert type(fields[key]) is int, key


def test_accepts_str_and_pathlike():
    assert read_hf_config(str(fixture("gpt2"))) == read_hf_config(fixture("gpt2"))


def test_fields_build_a_valid_model_spec():
    """The dict is the case file's model section: ModelSpec accepts every published one."""
    specs = pytest.importorskip("cost_models.specs")
    for model in EXPECTED:
        spec = specs.ModelSpec(**read_hf_config(fixture(model)))
        assert spec.num_layers == EXPECTED[model]["num_layers"]
    llama3 = specs.ModelSpec(**read_hf_config(fixture("Meta-Llama-3-8B")))
    assert llama3.head_dim == 128 and llama3.kv_size == 1024  # GQA: 8 kv heads x 128


def test_published_params_match_model_cards():
    """Rough parameter counts from the mapped fields land on the published sizes."""
    def params(f):
        h, v, L, ffn = f["hidden_size"], f["vocab_size"], f["num_layers"], f["ffn_hidden_size"]
        kv = f["num_kv_heads"] * (h // f["num_attention_heads"])
        attn = h * h * 2 + 2 * h * kv
        mlp = (3 if f["activation"] == "swiglu" else 2) * h * ffn
        emb = v * h * (1 if f["tied_embeddings"] else 2)
        return L * (attn + mlp) + emb

    assert params(read_hf_config(fixture("Llama-2-7b-hf"))) == pytest.approx(6.74e9, rel=0.01)
    assert params(read_hf_config(fixture("Meta-Llama-3-8B"))) == pytest.approx(8.03e9, rel=0.01)
    assert params(read_hf_config(fixture("Mistral-7B-v0.1"))) == pytest.approx(7.24e9, rel=0.01)
    assert params(read_hf_config(fixture("Qwen2.5-72B"))) == pytest.approx(72.7e9, rel=0.01)
    assert params(read_hf_config(fixture("gpt-neox-20b"))) == pytest.approx(20.55e9, rel=0.01)
    assert params(read_hf_config(fixture("gpt2"))) == pytest.approx(124.4e6, rel=0.02)


def test_does_not_import_transformers_or_open_sockets(monkeypatch):
    import socket
    import sys

    def no_network(*args, **kwargs):
        raise AssertionError("read_hf_config touched the network")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    before = "transformers" in sys.modules
    for model in EXPECTED:
        read_hf_config(fixture(model))
    assert ("transformers" in sys.modules) == before


# --------------------------------------------------------------------------- defaults and fallbacks


def test_name_falls_back_to_parent_folder(tmp_path):
    cfg = published("Llama-2-7b-hf")
    del cfg["_name_or_path"]
    assert read_hf_config(write(tmp_path, cfg, folder="my-llama"))["name"] == "my-llama (LlamaForCausalLM)"
    cfg["_name_or_path"] = ""
    assert read_hf_config(write(tmp_path, cfg, folder="hf"))["name"] == "hf (LlamaForCausalLM)"
    del cfg["architectures"]
    assert read_hf_config(write(tmp_path, cfg, folder="my-llama"))["name"] == "my-llama"


def test_relative_path_uses_its_folder_name(tmp_path, monkeypatch):
    write(tmp_path, published("gpt2"), folder="gpt2-copy")
    monkeypatch.chdir(tmp_path / "gpt2-copy")
    assert read_hf_config("config.json")["name"] == "gpt2-copy (GPT2LMHeadModel)"


def test_family_from_architectures_when_model_type_missing(tmp_path):
    for model in EXPECTED:
        cfg = published(model)
        del cfg["model_type"]
        fields = read_hf_config(write(tmp_path, cfg, folder=model))
        assert fields == EXPECTED[model], model


def test_kimi_k2_is_read_as_the_deepseek_v3_model_it_is(tmp_path):
    """Kimi K2's config.json is DeepSeek-V3's (DeepseekV3ForCausalLM, a DeepseekV3Config) under model_type
    kimi_k2, which Moonshot sets only for inference engines to tell it apart: it was refused as an
    unsupported model type. Its shape (61 layers of 7,168, 384 experts of 2,048, 8 a token, one shared,
    the first layer dense, 64 MLA heads, vocabulary 163,840) on DeepSeek-V3's file."""
    kimi = {**published("DeepSeek-V3"), "n_routed_experts": 384, "num_attention_heads": 64, "num_key_value_heads": 64,
            "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "num_nextn_predict_layers": 0,
            "vocab_size": 163840, "rope_theta": 50000.0}
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    as_deepseek = read_hf_config(write(tmp_path / "a", kimi, folder="Kimi-K2"))
    as_kimi = read_hf_config(write(tmp_path / "b", {**kimi, "model_type": "kimi_k2"}, folder="Kimi-K2"))
    assert as_kimi == as_deepseek
    assert (as_kimi["num_experts"], as_kimi["moe_top_k"], as_kimi["moe_first_dense_layers"]) == (384, 8, 1)


def test_glm_4_5_air_is_read_to_its_model_cards_counts():
    """GLM-4.5 (model_type glm4_moe) was refused as an unsupported model type: grouped-query attention
    (96 heads of 128 over a 4,096-wide stream, 8 KV heads) and DeepSeek-V3's mixture (128 experts of
    1,408, 8 a token, one shared, the first layer dense, a sigmoid router, one MTP layer). zai-org's
    model card: 106B total parameters, 12B active (both without the MTP layer, which the card's
    figures leave out as DeepSeek-V3's do)."""
    from dataclasses import replace

    from cost_models.parameters import active_parameters, total_parameters
    from cost_models.specs import ModelSpec

    fields = read_hf_config(fixture("GLM-4.5-Air"))
    assert (fields["num_experts"], fields["moe_top_k"], fields["moe_first_dense_layers"], fields["mtp_layers"],
            fields["head_dim"], fields["num_kv_heads"], fields["moe_router"]) == (128, 8, 1, 1, 128, 8, "sigmoid")
    model = replace(ModelSpec(**fields), mtp_layers=0)
    assert 106e9 <= total_parameters(model) < 107e9
    assert 12e9 <= active_parameters(model) < 13e9


def test_llama_defaults(tmp_path):
    cfg = published("Llama-2-7b-hf")
    for key in ("num_key_value_heads", "tie_word_embeddings", "hidden_act"):
        del cfg[key]
    cfg["num_attention_heads"] = 16
    fields = read_hf_config(write(tmp_path, cfg))
    assert fields["num_kv_heads"] == 16  # defaults to the attention heads
    assert fields["tied_embeddings"] is False
    assert fields["activation"] == "swiglu"
    assert fields["dropout"] == 0.0


def test_null_kv_heads_means_default(tmp_path):
    cfg = published("Mistral-7B-v0.1")
    cfg["num_key_value_heads"] = None
    assert read_hf_config(write(tmp_path, cfg))["num_kv_heads"] == 32


def test_qwen_tied_and_attention_dropout(tmp_path):
    cfg = published("Qwen2.5-72B")
    cfg["tie_word_embeddings"] = True
    cfg["attention_dropout"] = 0.05
    fields = read_hf_config(write(tmp_path, cfg))
    assert fields["tied_embeddings"] is True
    assert fields["dropout"] == 0.05


def test_gpt_neox_defaults_and_dropout(tmp_path):
    cfg = published("gpt-neox-20b")
    del cfg["intermediate_size"]
    cfg["attention_dropout"] = 0.02
    cfg["hidden_dropout"] = 0.1
    fields = read_hf_config(write(tmp_path, cfg))
    assert fields["ffn_hidden_size"] == 4 * 6144
    assert fields["dropout"] == 0.1
    for act in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        cfg["hidden_act"] = act
        assert read_hf_config(write(tmp_path, cfg))["activation"] == "gelu"


def test_gpt2_defaults(tmp_path):
    cfg = published("gpt2")
    cfg["n_inner"] = None
    cfg["n_embd"] = 1024
    cfg["n_head"] = 16
    for key in ("resid_pdrop", "attn_pdrop", "embd_pdrop", "activation_function"):
        del cfg[key]
    fields = read_hf_config(write(tmp_path, cfg))
    assert fields["ffn_hidden_size"] == 4096
    assert fields["dropout"] == 0.1
    assert fields["activation"] == "gelu"
    assert fields["tied_embeddings"] is True


def test_gpt2_explicit_values(tmp_path):
    cfg = published("gpt2")
    cfg.update(n_inner=2048, resid_pdrop=0.0, attn_pdrop=0.0, embd_pdrop=0.2, tie_word_embeddings=False)
    fields = read_hf_config(write(tmp_path, cfg))
    assert fields["ffn_hidden_size"] == 2048
    assert fields["dropout"] == 0.2
    assert fields["tied_embeddings"] is False


# --------------------------------------------------------------------------- errors


def raises(path: Path | str, key: str) -> CaseError:
    with pytest.raises(CaseError) as info:
        read_hf_config(path)
    err = info.value
    message = str(err)
    assert str(path) in message
    assert err.source == str(path)
    assert err.key == key
    if key:
        assert f": {key}: " in message
    return err


def test_missing_file(tmp_path):
    err = raises(tmp_path / "nope" / "config.json", "")
    assert "file not found" in str(err)


def test_directory_instead_of_file(tmp_path):
    err = raises(tmp_path, "")
    assert "directory" in str(err)


def test_invalid_json(tmp_path):
    err = raises(write(tmp_path, '{"model_type": "llama",\n  "hidden_size": }'), "")
    assert "expected valid JSON" in str(err)
    assert "line 2" in str(err)


def test_not_utf8(tmp_path):
    p = tmp_path / "config.json"
    p.write_bytes(b'{"model_type": "\xff\xfe"}')
    assert "expected valid JSON" in str(raises(p, ""))


def test_empty_file(tmp_path):
    assert "expected valid JSON" in str(raises(write(tmp_path, ""), ""))


@pytest.mark.parametrize("top", ["[1, 2]", '"llama"', "3", "null", "true"])
def test_top_level_not_object(tmp_path, top):
    err = raises(write(tmp_path, top), "")
    assert "expected a JSON object" in str(err)


def test_unsupported_model_type_lists_supported(tmp_path):
    cfg = published("Llama-2-7b-hf")
    cfg["model_type"] = "bert"
    message = str(raises(write(tmp_path, cfg), "model_type"))
    assert "'bert'" in message
    for family in ("llama", "mistral", "qwen2", "gpt_neox", "gpt2"):
        assert family in message


def test_model_type_wrong_type(tmp_path):
    cfg = published("Llama-2-7b-hf")
    cfg["model_type"] = 7
    raises(write(tmp_path, cfg), "model_type")


def test_no_model_type_and_no_architectures(tmp_path):
    cfg = published("Llama-2-7b-hf")
    del cfg["model_type"], cfg["architectures"]
    assert "missing" in str(raises(write(tmp_path, cfg), "model_type"))


@pytest.mark.parametrize("archs", [["BertForMaskedLM"], ["Llama"], [], "LlamaForCausalLM", [3]])
def test_unsupported_architectures(tmp_path, archs):
    cfg = published("Llama-2-7b-hf")
    del cfg["model_type"]
    cfg["architectures"] = archs
    raises(write(tmp_path, cfg), "architectures")


@pytest.mark.parametrize("model,key", [
    ("Llama-2-7b-hf", "num_hidden_layers"), ("Llama-2-7b-hf", "hidden_size"),
    ("Llama-2-7b-hf", "num_attention_heads"), ("Llama-2-7b-hf", "intermediate_size"),
    ("Llama-2-7b-hf", "vocab_size"), ("Qwen2.5-72B", "intermediate_size"),
    ("gpt-neox-20b", "num_hidden_layers"), ("gpt-neox-20b", "vocab_size"),
    ("gpt2", "n_layer"), ("gpt2", "n_embd"), ("gpt2", "n_head"), ("gpt2", "vocab_size"),
])
def test_required_key_missing(tmp_path, model, key):
    cfg = published(model)
    del cfg[key]
    err = raises(write(tmp_path, cfg), key)
    assert err.expected == "missing; expected an integer"


@pytest.mark.parametrize("model,key,value", [
    ("Llama-2-7b-hf", "num_hidden_layers", True),   # a bool is not an integer
    ("Llama-2-7b-hf", "hidden_size", "4096"),
    ("Llama-2-7b-hf", "intermediate_size", 11008.5),
    ("Llama-2-7b-hf", "num_key_value_heads", False),
    ("Llama-2-7b-hf", "vocab_size", [32000]),
    ("Meta-Llama-3-8B", "hidden_size", None),
    ("gpt2", "n_inner", True),
    ("gpt2", "n_embd", 768.0),
    ("gpt-neox-20b", "intermediate_size", "24576"),
])
def test_wrong_integer_types(tmp_path, model, key, value):
    cfg = published(model)
    cfg[key] = value
    raises(write(tmp_path, cfg), key)


@pytest.mark.parametrize("model,key,value", [
    ("Llama-2-7b-hf", "num_hidden_layers", 0), ("Llama-2-7b-hf", "hidden_size", -4096),
    ("Mistral-7B-v0.1", "num_key_value_heads", 0), ("gpt2", "n_layer", -1), ("gpt2", "n_inner", 0),
    ("gpt-neox-20b", "vocab_size", 0),
])
def test_non_positive_integers(tmp_path, model, key, value):
    cfg = published(model)
    cfg[key] = value
    assert "positive" in str(raises(write(tmp_path, cfg), key))


@pytest.mark.parametrize("changes, key, expected", [
    ({"n_group": 7}, "n_group", "must divide n_routed_experts 256, got 7"),
    ({"topk_group": 9}, "topk_group", "at most n_group 8, got 9"),
    ({"n_group": 64, "topk_group": 1}, "topk_group", "leaves 4 experts in the picked groups, fewer than "
                                                     "num_experts_per_tok 8"),
])
def test_group_limited_routing_that_cannot_route_names_the_configs_key(tmp_path, changes, key, expected):
    """DeepSeek-V3's 256 experts in 8 groups, 4 picked, 8 per token: groups that do not divide the
    experts, more picked than there are, or too few experts left for a token's 8 (megatron-core's
    TransformerConfig checks) are the config's n_group and topk_group, not the planner's
    moe_router_num_groups, which the case file never wrote."""
    cfg = published("DeepSeek-V3")
    cfg.update(changes)
    assert expected in str(raises(write(tmp_path, cfg), key))


@pytest.mark.parametrize("model, key, value", [
    # 0 and "false" turned Qwen2.5's sliding window on (transformers reads 0 as off)
    ("Qwen2.5-72B", "use_sliding_window", 0), ("Qwen2.5-72B", "use_sliding_window", "false"),
    # "true" and 1 were read as no bias, and Megatron-LM's arguments then said --disable-bias-linear
    ("Llama-2-7b-hf", "attention_bias", "true"), ("Llama-2-7b-hf", "mlp_bias", 1),
    # a misspelt greedy turned group-limited routing on
    ("DeepSeek-V2-Lite", "topk_method", "greedyy"),
])
def test_a_switch_or_choice_of_the_wrong_kind_is_refused(tmp_path, model, key, value):
    cfg = published(model)
    cfg[key] = value
    if key == "use_sliding_window":
        cfg["sliding_window"] = 1024
    raises(write(tmp_path, cfg), key)


@pytest.mark.parametrize("value", ["abc", float("nan"), -10000.0, 0, True, [500000]])
def test_a_rope_base_that_is_no_number_is_refused(tmp_path, value):
    """rope_theta "abc" or NaN was dropped without a word: the launch files then left out
    --rotary-base and --position-embedding-type."""
    cfg = published("Llama-2-7b-hf")
    cfg["rope_theta"] = value
    assert "expected RoPE's base" in str(raises(write(tmp_path, cfg), "rope_theta"))


@pytest.mark.parametrize("model,key,value", [
    ("Llama-2-7b-hf", "tie_word_embeddings", "false"),
    ("Llama-2-7b-hf", "tie_word_embeddings", 0),
    ("gpt2", "tie_word_embeddings", 1),
    ("Llama-2-7b-hf", "attention_dropout", True),
    ("Llama-2-7b-hf", "attention_dropout", "0.1"),
    ("Llama-2-7b-hf", "attention_dropout", 1.0),
    ("Llama-2-7b-hf", "attention_dropout", -0.1),
    ("gpt2", "resid_pdrop", "NaN"),
    ("gpt-neox-20b", "hidden_dropout", 2),
    ("Llama-2-7b-hf", "hidden_act", 3),
    ("Llama-2-7b-hf", "_name_or_path", 42),
])
def test_wrong_other_types(tmp_path, model, key, value):
    cfg = published(model)
    cfg[key] = value
    raises(write(tmp_path, cfg), key)


def test_nan_dropout_rejected(tmp_path):
    text = fixture("gpt2").read_text().replace('"attn_pdrop": 0.1', '"attn_pdrop": NaN')
    assert "NaN" in text
    raises(write(tmp_path, text), "attn_pdrop")


@pytest.mark.parametrize("model,key,act", [
    ("Llama-2-7b-hf", "hidden_act", "gelu"), ("Mistral-7B-v0.1", "hidden_act", "relu"),
    ("Qwen2.5-72B", "hidden_act", "swiglu"), ("gpt-neox-20b", "hidden_act", "relu"),
    ("gpt2", "activation_function", "silu"),
])
def test_unsupported_activation(tmp_path, model, key, act):
    cfg = published(model)
    cfg[key] = act
    assert repr(act) in str(raises(write(tmp_path, cfg), key))


def test_shape_rules_name_the_config_key(tmp_path):
    cfg = published("Meta-Llama-3-8B")
    cfg["num_key_value_heads"] = 5  # does not divide 32
    raises(write(tmp_path, cfg), "num_key_value_heads")
    cfg = published("gpt2")
    cfg["n_head"] = 7  # does not divide 768
    raises(write(tmp_path, cfg), "n_head")
    cfg = published("Mistral-7B-v0.1")
    cfg["head_dim"] = 96  # not 4096 / 32: a head width of its own (as Qwen3 and GPT-OSS have)
    assert read_hf_config(write(tmp_path, cfg))["head_dim"] == 96
    cfg["head_dim"] = 128  # hidden / heads: nothing to say
    fields = read_hf_config(write(tmp_path, cfg))
    assert fields["hidden_size"] == 4096 and "head_dim" not in fields
    cfg["head_dim"] = 0
    raises(write(tmp_path, cfg), "head_dim")


def test_only_case_errors_escape(tmp_path):
    """Garbage in any supported key gives a CaseError, never another exception."""
    junk = [None, True, False, 0, -1, 1.5, "x", "", [], {}, [1], {"a": 1}, float("inf")]
    for model in EXPECTED:
        base = published(model)
        for key in list(base):
            for value in junk:
                cfg = dict(base)
                cfg[key] = value
                try:
                    read_hf_config(write(tmp_path, json.dumps(cfg)))
                except CaseError:
                    pass


def test_arbitrary_json_gives_fields_or_case_error(tmp_path):
    """Property: whatever JSON the file holds, the result is the model dict or a CaseError."""
    hypothesis = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")

    scalars = st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=True) | st.text(max_size=8)
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
    keys = st.sampled_from(sorted({k for m in EXPECTED for k in published(m)} | {"head_dim"}))
    bases = st.sampled_from(sorted(EXPECTED)).map(published)
    path = write(tmp_path, "{}")

    @hypothesis.settings()  # the loaded profile (tests/conftest.py)
    @hypothesis.given(bases, st.dictionaries(keys, values, max_size=4), st.sets(keys, max_size=3))
    def check(base, changes, removed):
        cfg = {k: v for k, v in {**base, **changes}.items() if k not in removed}
        path.write_text(json.dumps(cfg))
        try:
            fields = read_hf_config(path)
        except CaseError as err:
            assert err.source == str(path)
            return
        assert set(fields) - {"head_dim"} - ARCHITECTURE_KEYS == MODEL_KEYS
        assert fields["activation"] in ("gelu", "swiglu")
        assert 0.0 <= fields["dropout"] < 1.0
        for key in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size",
                    "vocab_size"):
            assert type(fields[key]) is int and fields[key] > 0, key
        assert "head_dim" in fields or fields["hidden_size"] % fields["num_attention_heads"] == 0
        assert fields["num_attention_heads"] % fields["num_kv_heads"] == 0

    check()


# --------------------------------------------------------------------------- sliding windows

def test_gpt_oss_windows_every_other_layer_from_the_first_as_its_config_class_does(tmp_path):
    """GptOssConfig without layer_types: sliding, full, sliding, ... (megatron-core's window_attn_skip_freq 2:
    layer numbers from 1, full where they divide by 2). Qwen2.5's window is switched off."""
    fields = read_hf_config(fixture("gpt-oss-120b"))
    assert (fields["sliding_window"], fields["sliding_window_full_every"]) == (128, 2)
    assert "sliding_window" not in read_hf_config(fixture("Qwen2.5-72B"))
    cfg = published("gpt-oss-20b")
    cfg["layer_types"] = ["sliding_attention", "sliding_attention", "full_attention"] * 8
    assert read_hf_config(write(tmp_path, cfg))["sliding_window_full_every"] == 3


def test_a_layer_pattern_megatron_cannot_express_is_refused_naming_the_key(tmp_path):
    cfg = published("gpt-oss-20b")
    cfg["layer_types"] = ["full_attention"] + ["sliding_attention"] * 23
    with pytest.raises(CaseError, match=r"layer_types.*one full-attention layer every N layers.*\[1\]"):
        read_hf_config(write(tmp_path, cfg))


def _params(fields: dict) -> tuple[float, float]:
    from cost_models.parameters import active_parameters, total_parameters
    from cost_models.specs import ModelSpec

    spec = ModelSpec(**{k: v for k, v in fields.items() if k not in ("rope_base", "normalization", "position_embedding",
                                                                     "linear_bias", "qk_norm")})
    return total_parameters(spec), active_parameters(spec)


@pytest.mark.parametrize("name, absent", [
    # DeepseekV3Config: q_lora_rank 1536, n_shared_experts 1, first_k_dense_replace 3 (the fixture's
    # own values): left out, they were read as no query compression, no shared expert and every layer
    # MoE, 720.6B parameters for 682.6B
    ("DeepSeek-V3", ("q_lora_rank", "n_shared_experts", "first_k_dense_replace")),
    ("gpt-oss-120b", ("head_dim",)),  # GptOssConfig: 64 (it was 2,880 / 64 = 45)
])
def test_a_key_the_file_leaves_out_takes_its_config_classs_default(tmp_path, name, absent):
    cfg = published(name)
    assert all(k in cfg for k in absent)
    fields = read_hf_config(fixture(name))
    bare = read_hf_config(write(tmp_path, {k: v for k, v in cfg.items() if k not in absent}))
    assert _params(bare) == _params(fields)


def test_a_null_key_is_unset_as_the_config_class_reads_it(tmp_path):
    # q_lora_rank null: DeepSeek's modeling code projects the query with no low-rank step (V2-Lite ships it)
    fields = read_hf_config(write(tmp_path, {**published("DeepSeek-V3"), "q_lora_rank": None}))
    assert "q_lora_rank" not in fields


def test_moe_layers_are_placed_as_each_familys_modeling_code_places_them(tmp_path):
    """DeepSeek: experts where i >= first_k_dense_replace and i % moe_layer_freq == 0 (2, 4, …, 60 of
    61 for 2 and 2: 30 MoE layers; they were placed at 3, 5, …, 59). Qwen3-MoE: where (i + 1) %
    decoder_sparse_step == 0 and i is not in mlp_only_layers. A Llama 4 moe_layers list no dense-prefix,
    every-n-th pattern holds is refused."""
    from cost_models.specs import ModelSpec

    def spec(cfg):
        fields = read_hf_config(write(tmp_path, cfg))
        return ModelSpec(**{k: v for k, v in fields.items() if k in ModelSpec.__dataclass_fields__})

    deepseek = spec({**published("DeepSeek-V3"), "first_k_dense_replace": 2, "moe_layer_freq": 2})
    assert [i for i in range(61) if deepseek.is_moe_layer(i)] == list(range(2, 61, 2))
    qwen = spec({**published("Qwen3-30B-A3B"), "mlp_only_layers": [0], "decoder_sparse_step": 2})
    assert [i for i in range(48) if qwen.is_moe_layer(i)] == list(range(1, 48, 2))
    maverick = published("Llama-4-Maverick-17B-128E")
    with pytest.raises(CaseError, match=r"text_config\.moe_layers: places MoE layers at \[0, 1, 2\]"):
        read_hf_config(write(tmp_path, {**maverick, "text_config": {**maverick["text_config"], "moe_layers": [0, 1, 2]}}))
    listed = spec({**maverick, "text_config": {**maverick["text_config"], "moe_layers": list(range(1, 48, 2))}})
    assert listed.num_moe_layers == 24


def test_a_text_only_llama4_config_without_model_type_is_read_as_the_text_decoder(tmp_path):
    """architectures Llama4ForCausalLM with the text config's keys at the top (no model_type) was
    sent to the multimodal reader: "text_config: expected an object, got nothing"."""
    text = {k: v for k, v in published("Llama-4-Maverick-17B-128E")["text_config"].items() if k != "model_type"}
    fields = read_hf_config(write(tmp_path, {**text, "architectures": ["Llama4ForCausalLM"]}))
    assert fields == read_hf_config(write(tmp_path, {**text, "model_type": "llama4_text"}, "typed")) | \
        {"name": fields["name"]}


@pytest.mark.parametrize("key, value, bound", [("num_hidden_layers", 2000, 1024), ("vocab_size", 2**24 + 1, 2**24),
                                               ("hidden_size", 2**40, 2**20), ("n_routed_experts", 2**21, 2**20)])
def test_a_count_past_its_bound_is_named_at_the_configs_key(tmp_path, key, value, bound):
    """2,000 layers were refused as the case's model.num_layers, a key the case does not hold."""
    path = write(tmp_path, {**published("DeepSeek-V3"), key: value})
    with pytest.raises(CaseError, match=rf"config.json: {key}: expected an integer at most {bound}, got"):
        read_hf_config(path)


@pytest.mark.parametrize("max_window_layers, expected", [
    (80, {}),            # Qwen2.5-72B's own: layers i >= 80 slide, none of its 80
    (None, {}),          # absent: Qwen2Config's 28 ... of 80 is refused below; absent with 28 layers, none
    (0, {"sliding_window": 4096}),  # every layer windowed
])
def test_qwen_windows_only_the_layers_from_max_window_layers_on(tmp_path, max_window_layers, expected):
    """transformers' Qwen2Config (and Qwen3's, Qwen3-MoE's): layer i is "sliding_attention" only where
    i >= max_window_layers; Qwen2.5-7B with use_sliding_window true and max_window_layers 28 of 28 layers
    runs full attention everywhere, and was read as windowed in every layer (24 % of its FLOPs at 32k)."""
    cfg = published("Qwen2.5-72B")
    cfg.update(use_sliding_window=True, sliding_window=4096)
    if max_window_layers is None:
        del cfg["max_window_layers"]
        cfg["num_hidden_layers"] = 28
    else:
        cfg["max_window_layers"] = max_window_layers
    fields = read_hf_config(write(tmp_path, cfg))
    assert {k: fields[k] for k in ("sliding_window", "sliding_window_full_every") if k in fields} == expected


def test_qwen_windows_after_a_leading_run_of_full_layers_are_refused(tmp_path):
    """max_window_layers 21 of 28: the last 7 layers slide (transformers), which no one-full-every-N
    pattern holds: refused naming the key, not read as every layer windowed."""
    cfg = published("Qwen2.5-72B")
    cfg.update(use_sliding_window=True, sliding_window=4096, num_hidden_layers=28, max_window_layers=21)
    assert "21 of 28 layers" in str(raises(write(tmp_path, cfg), "max_window_layers"))
    del cfg["max_window_layers"]  # Qwen2Config's default, 28, of 80 layers
    cfg["num_hidden_layers"] = 80
    assert "28 of 80 layers" in str(raises(write(tmp_path, cfg), "max_window_layers"))


def test_qwen_windows_need_use_sliding_window(tmp_path):
    """Qwen2Config: sliding_window only where use_sliding_window, whose default is false."""
    cfg = published("Qwen2.5-72B")
    del cfg["use_sliding_window"]
    cfg.update(sliding_window=4096, max_window_layers=0)
    assert "sliding_window" not in read_hf_config(write(tmp_path, cfg))


def test_qwen3_moe_has_no_shared_expert_whatever_the_file_carries(tmp_path):
    """Qwen3MoeConfig takes no shared_expert_intermediate_size (Qwen2-MoE's key) and
    Qwen3MoeSparseMoeBlock builds no shared expert: a file carrying 6144 was read as 32.3B parameters
    for Qwen3-30B-A3B's 30.5B."""
    cfg = published("Qwen3-30B-A3B")
    cfg["shared_expert_intermediate_size"] = 6144
    assert "moe_shared_expert_ffn_hidden_size" not in read_hf_config(write(tmp_path, cfg))


@pytest.mark.parametrize("model", ["DeepSeek-V3", "Meta-Llama-3-8B"])
def test_transformers_5_rope_parameters_give_the_base(tmp_path, model):
    """transformers 5 writes the RoPE base inside rope_parameters; Kimi K2's file so written (base 50,000)
    was read at DeepSeek's default 10,000 and Megatron-LM's arguments said --rotary-base 10000."""
    cfg = published(model)
    cfg.pop("rope_theta", None)
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 50000.0}
    assert read_hf_config(write(tmp_path, cfg))["rope_base"] == 50000.0
    cfg["rope_parameters"]["rope_theta"] = "abc"
    assert "expected RoPE's base" in str(raises(write(tmp_path, cfg), "rope_parameters.rope_theta"))


def test_llama4_chunked_attention_is_read_and_a_longer_sequence_refused(tmp_path):
    """Llama4TextConfig's attention_chunk_size (8192 where the file is silent, none where null): its RoPE
    layers attend within 8,192-token chunks, which megatron-core builds no mask for. At 32k tokens Scout
    was priced (and its launch files written) as full attention without a word: 23 % more FLOPs per
    token than the model the user named."""
    from planner.case import build_case
    from planner.errors import CaseError as Refusal

    cfg = published("Llama-4-Scout-17B-16E")
    assert read_hf_config(write(tmp_path, cfg))["attention_chunk_size"] == 8192
    del cfg["text_config"]["attention_chunk_size"]
    assert read_hf_config(write(tmp_path, cfg))["attention_chunk_size"] == 8192
    cfg["text_config"]["attention_chunk_size"] = None
    assert "attention_chunk_size" not in read_hf_config(write(tmp_path, cfg))

    def case(seq_len):
        return {"model": {"preset": "llama4-scout"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
                "training": {"global_batch_size": 64, "seq_len": seq_len}}
    assert build_case(case(8192), "c.yaml", tmp_path).model.attention_chunk_size == 8192
    with pytest.raises(Refusal) as info:
        build_case(case(32768), "c.yaml", tmp_path)
    assert info.value.key == "training.seq_len" and "at most 8192" in str(info.value)


def test_what_the_launch_builds_beyond_the_costs_is_read_rope_on_half_a_head_and_the_routers_scale():
    """GLM-4.5 rotates half of each head (partial_rotary_factor 0.5) and DeepSeek-V3 scales its router's top-k
    weights by 2.5 (routed_scaling_factor): both were dropped, and Megatron-LM's files built full rotary
    and unscaled weights, another model than the one published (transformers' Glm4MoeConfig,
    DeepseekV3Config; megatron-core's rotary_percent and moe_router_topk_scaling_factor)."""
    glm, v3, lite = (read_hf_config(fixture(name)) for name in ("GLM-4.5-Air", "DeepSeek-V3", "DeepSeek-V2-Lite"))
    assert glm["rotary_percent"] == 0.5 and "moe_router_topk_scaling" not in glm  # Air's is 1.0
    assert v3["moe_router_topk_scaling"] == 2.5 and "rotary_percent" not in v3
    assert "moe_router_topk_scaling" not in lite  # 1.0
    from planner.presets import model_presets

    assert model_presets()["deepseek-v3"]["moe_router_topk_scaling"] == v3["moe_router_topk_scaling"]


@pytest.mark.parametrize("model, key, says", [
    ({"preset": "deepseek-v3", "rotary_percent": 1.5}, "model.rotary_percent", "at most 1"),
    ({"preset": "llama3-8b", "moe_router_topk_scaling": 2.5}, "moe_router_topk_scaling",
     "applies only to a mixture of experts"),
    ({"preset": "deepseek-v3", "moe_router_topk_scaling": 1e6}, "model.moe_router_topk_scaling", "at most 1000"),
])
def test_the_rope_share_and_router_scale_are_bounded_where_read(model, key, says):
    from planner.case import load_case

    with pytest.raises(CaseError) as refused:
        load_case({"model": model, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
                   "training": {"global_batch_size": 8, "seq_len": 4096}})
    assert key in f"{refused.value.key}" and says in str(refused.value)


def test_the_routers_scale_from_an_hf_config_is_held_to_the_case_keys_bounds(tmp_path):
    """routed_scaling_factor 1e-300 was taken from an HF config where the case's own key refuses under 1e-6."""
    cfg = published("DeepSeek-V3")
    cfg["routed_scaling_factor"] = 1e-300
    with pytest.raises(CaseError, match="routed_scaling_factor: expected a number from 1e-06 to 1000"):
        read_hf_config(write(tmp_path, cfg))


# --------------------------------------------------------------------------- Phi-3, Granite, Qwen2-MoE
# The configs below are the published config.json files' values (the Hugging Face Hub repositories named),
# written out here rather than kept as fixtures; keys that do not bear on the model's shape are left out.

PHI3_MINI = {  # microsoft/Phi-3-mini-4k-instruct
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "attention_dropout": 0.0, "embd_pdrop": 0.0,
    "resid_pdrop": 0.0, "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 8192,
    "max_position_embeddings": 4096, "original_max_position_embeddings": 4096, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False, "vocab_size": 32064}
PHI3_MEDIUM = {  # microsoft/Phi-3-medium-4k-instruct
    **PHI3_MINI, "hidden_size": 5120, "intermediate_size": 17920, "num_attention_heads": 40,
    "num_hidden_layers": 40, "num_key_value_heads": 10}
GRANITE_3_8B = {  # ibm-granite/granite-3.0-8b-base
    "architectures": ["GraniteForCausalLM"], "model_type": "granite", "attention_bias": False,
    "attention_dropout": 0.1, "attention_multiplier": 0.0078125, "embedding_multiplier": 12.0,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12800, "logits_scaling": 16.0,
    "max_position_embeddings": 4096, "mlp_bias": False, "num_attention_heads": 32, "num_hidden_layers": 40,
    "num_key_value_heads": 8, "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 10000.0, "tie_word_embeddings": True, "vocab_size": 49155}


@pytest.mark.parametrize("cfg, card", [(PHI3_MINI, 3.82e9), (PHI3_MEDIUM, 14.0e9), (GRANITE_3_8B, 8.17e9)],
                         ids=["Phi-3-mini-4k", "Phi-3-medium-4k", "granite-3.0-8b"])
def test_phi3_and_granite_are_read_to_their_model_cards_counts(tmp_path, cfg, card):
    """phi3 and granite were refused as unsupported model types. Phi-3's fused qkv_proj and gate_up_proj
    hold Llama's matrices; Granite's multipliers scale activations, not weights."""
    assert _params(read_hf_config(write(tmp_path, cfg)))[0] == pytest.approx(card, rel=0.01)


def test_phi3_windows_every_layer_and_rotates_the_share_of_each_head_its_config_gives(tmp_path):
    """Phi3Model masks every layer to sliding_window where the config sets one (Phi-3-mini-4k: 2,047);
    Phi-4-mini (model_type phi3) rotates 0.75 of each head (partial_rotary_factor)."""
    fields = read_hf_config(write(tmp_path, PHI3_MINI))
    assert (fields["sliding_window"], "sliding_window_full_every" in fields) == (2047, False)
    assert read_hf_config(write(tmp_path, {**PHI3_MINI, "partial_rotary_factor": 0.75}))["rotary_percent"] == 0.75


QWEN1_5_MOE = {  # Qwen/Qwen1.5-MoE-A2.7B
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "attention_dropout": 0.0,
    "decoder_sparse_step": 1, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632,
    "max_position_embeddings": 8192, "max_window_layers": 21, "moe_intermediate_size": 1408,
    "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
    "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "shared_expert_intermediate_size": 5632, "sliding_window": 32768, "tie_word_embeddings": False,
    "use_sliding_window": False, "vocab_size": 151936}
QWEN2_57B = {  # Qwen/Qwen2-57B-A14B
    **QWEN1_5_MOE, "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 131072,
    "max_window_layers": 28, "moe_intermediate_size": 2560, "num_attention_heads": 28, "num_experts": 64,
    "num_experts_per_tok": 8, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "shared_expert_intermediate_size": 20480, "sliding_window": 131072}


@pytest.mark.parametrize("cfg, card_total, card_active", [(QWEN1_5_MOE, 14.3e9, 2.7e9), (QWEN2_57B, 57.4e9, 14.2e9)],
                         ids=["Qwen1.5-MoE-A2.7B", "Qwen2-57B-A14B"])
def test_qwen2_moe_is_read_to_its_model_cards_counts(tmp_path, cfg, card_total, card_active):
    """qwen2_moe was refused as an unsupported model type. Its shared expert (5,632 wide in Qwen1.5-MoE,
    20,480 in Qwen2-57B) is a third of the active parameters. Qwen's active count takes the input
    embedding in (cost_models.parameters.active_parameters leaves it out)."""
    fields = read_hf_config(write(tmp_path, cfg))
    total, active = _params(fields)
    embedding = fields["vocab_size"] * fields["hidden_size"]
    assert total == pytest.approx(card_total, rel=0.01)
    assert active + embedding == pytest.approx(card_active, rel=0.01)
    # Qwen2MoeConfig's shared_expert_intermediate_size where the file is silent: Qwen1.5-MoE's own 5,632
    bare = {k: v for k, v in QWEN1_5_MOE.items() if k != "shared_expert_intermediate_size"}
    assert _params(read_hf_config(write(tmp_path, bare, "bare")))[0] == pytest.approx(14.3e9, rel=0.01)


def test_qwen2_moe_windows_as_its_config_class_does_or_is_refused_naming_the_key(tmp_path):
    """Qwen2MoeConfig (transformers 5) slides the even layers below max_window_layers: Qwen1.5-MoE's
    21 of 24, switched on, leaves layers 21 to 24 full, which no one-full-every-N pattern holds."""
    assert "sliding_window" not in read_hf_config(write(tmp_path, QWEN1_5_MOE))
    on = {**QWEN1_5_MOE, "use_sliding_window": True}
    with pytest.raises(CaseError, match=r"max_window_layers: expected one full-attention layer every N"):
        read_hf_config(write(tmp_path, on))
    fields = read_hf_config(write(tmp_path, {**on, "max_window_layers": 24}))
    assert (fields["sliding_window"], fields["sliding_window_full_every"]) == (32768, 2)



def test_qwen2_moe_max_window_layers_0_windows_no_layer(tmp_path):
    """Qwen2MoeConfig slides layer i only where i < max_window_layers: 0 windows none, every layer attends
    to every key. It was refused, "max_window_layers: expected a positive integer, got 0"; -1 is no count."""
    from cli_in_process import run_cli

    on = {**QWEN1_5_MOE, "use_sliding_window": True, "max_window_layers": 0}
    fields = read_hf_config(write(tmp_path, on))
    assert "sliding_window" not in fields and "sliding_window_full_every" not in fields
    case = tmp_path / "case.yaml"
    case.write_text(f"model: {{hf_config: {write(tmp_path, on)}}}\ncluster: {{gpu: h100-sxm-80gb, num_gpus: 8}}\n"
                    "training: {global_batch_size: 64, seq_len: 4096}\nlayout: {tp: 2, zero_stage: 1}\n")
    done = run_cli("estimate", str(case))
    assert done.returncode == 0, done.stderr
    assert "max_window_layers: expected an integer >= 0" in str(
        raises(write(tmp_path, {**on, "max_window_layers": -1}, "negative"), "max_window_layers"))


def test_an_overlong_name_or_path_is_refused_naming_the_config_key(tmp_path):
    """A 100,000-character _name_or_path was refused as "case.yaml: model.name: expected a string of at
    most 4,096 characters": a key the case never wrote, in a file that does not hold it."""
    from cli_in_process import run_cli

    config = write(tmp_path, {**QWEN1_5_MOE, "_name_or_path": "A" * 100_000})
    case = tmp_path / "case.yaml"
    case.write_text(f"model: {{hf_config: {config}}}\ncluster: {{gpu: h100-sxm-80gb, num_gpus: 8}}\n"
                    "training: {global_batch_size: 64, seq_len: 4096}\nlayout: {tp: 2, zero_stage: 1}\n")
    done = run_cli("estimate", str(case))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: {config}: _name_or_path: expected a string of at most 4,096 characters, got one of 100,000"]

# Refused families, with the published config.json values (the Hub repositories named).
GEMMA2_9B = {  # google/gemma-2-9b
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "attention_bias": False,
    "attention_dropout": 0.0, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "num_attention_heads": 16, "num_hidden_layers": 42,
    "num_key_value_heads": 8, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4096, "vocab_size": 256000}
GEMMA3_27B = {  # google/gemma-3-27b-pt (its text_config; the vision tower's keys left out)
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
                    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
                    "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024}}
GEMMA3_1B = {  # google/gemma-3-1b-pt
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "intermediate_size": 6912,
    "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_theta": 1000000, "sliding_window": 512,
    "sliding_window_pattern": 6, "vocab_size": 262144}
OLMO2_7B = {  # allenai/OLMo-2-1124-7B
    "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "attention_bias": False, "attention_dropout": 0.0,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 500000, "tie_word_embeddings": False, "vocab_size": 100352}


@pytest.mark.parametrize("cfg, says", [
    (GEMMA2_9B, r"'gemma2' is not read: its MLP is GeGLU .*attn_logit_softcapping, final_logit_softcapping"),
    (GEMMA3_27B, r"'gemma3' is not read: its MLP is GeGLU .*rope_local_base_freq"),
    (GEMMA3_1B, r"'gemma3_text' is not read: its MLP is GeGLU .*post_feedforward_layernorm"),
    (OLMO2_7B, r"'olmo2' is not read: its q and k norms .* span all heads together.*per head"),
], ids=["gemma-2-9b", "gemma-3-27b", "gemma-3-1b", "OLMo-2-1124-7B"])
def test_a_family_the_model_spec_cannot_hold_is_refused_saying_what_it_lacks(tmp_path, cfg, says):
    """Gemma 2 and 3 and OLMo 2 were refused as unsupported model types, which said nothing of why. Gemma's
    GeGLU MLP has SwiGLU's parameters (gemma-2-9b 9.24B) but read as "swiglu" the launch files would build a
    SiLU gate; OLMo 2's q/k norms span every head, not each head as the spec's qk_norm does."""
    with pytest.raises(CaseError, match=rf"config.json: model_type: {says}") as refused:
        read_hf_config(write(tmp_path, cfg))
    assert "\n" not in str(refused.value)
    untyped = {k: v for k, v in cfg.items() if k != "model_type"}
    with pytest.raises(CaseError, match=rf"architectures: '{cfg['architectures'][0]}' is not read: "):
        read_hf_config(write(tmp_path, untyped))


@pytest.mark.parametrize("name, left_out, expected", [
    # MixtralConfig: num_key_value_heads 8 (None alone means the heads); Qwen2Config: 32
    ("Mixtral-8x7B-v0.1", ("num_key_value_heads",), {"num_kv_heads": 8}),
    ("Qwen2.5-72B", ("num_key_value_heads",), {"num_kv_heads": 32}),
    # Glm4MoeConfig (modular_glm4_moe.py): 8 kv heads, n_shared_experts 1, first_k_dense_replace 1
    ("GLM-4.5-Air", ("num_key_value_heads", "n_shared_experts", "first_k_dense_replace"),
     {"num_kv_heads": 8, "moe_shared_expert_ffn_hidden_size": 1408, "moe_first_dense_layers": 1}),
])
def test_a_key_left_out_takes_its_config_class_default(tmp_path, name, left_out, expected):
    """A key the file leaves out is the transformers config class's default, not what a null means: a
    Mixtral file without num_key_value_heads was read as 32 kv heads (MixtralConfig builds 8), a GLM-4.5
    file without n_shared_experts and first_k_dense_replace as no shared expert and no dense layer."""
    cfg = published(name)
    for key in left_out:
        del cfg[key]
    fields = read_hf_config(write(tmp_path, cfg))
    assert {key: fields.get(key) for key in expected} == expected


@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_a_sequence_past_the_configs_positions_is_said(tmp_path, command):
    """An hf_config's max_position_embeddings (GPT-2's n_positions) was not read: a case training
    Llama 2 7B (4,096 positions) at 8,192 tokens got no word. A note on stderr now, not a refusal (a
    RoPE model can be trained past it), and none at or below the limit."""
    import yaml
    from cli_in_process import run_cli

    rope = "a RoPE model can be trained past it, with rope_scaling or a larger rope_theta, but check it is meant"
    learned = "its learned position table has no row past it, so the run fails unless the table is grown"
    # each count named by the config's own key: GPT-2's config.json states n_positions, not max_position_embeddings
    for model, limit, how, key in (("Llama-2-7b-hf", 4096, rope, "max_position_embeddings"),
                                   ("gpt2", 1024, learned, "n_positions")):
        for seq_len, said in ((limit, False), (2 * limit, True)):
            case = tmp_path / "case.yaml"
            case.write_text(yaml.safe_dump({
                "model": {"hf_config": str(fixture(model))}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
                "training": {"global_batch_size": 8, "seq_len": seq_len, "engine": "megatron"},
                "layout": {"tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 1}}))
            out = run_cli(command, str(case), "--json")
            assert out.returncode in (0, 3), out.stderr
            line = (f"note: {case}: training.seq_len {2 * limit:,} is past the {limit:,} positions of "
                    f"{fixture(model)} ({key}), the longest sequence the model was built for: "
                    f"priced as given ({how})")
            assert (line in out.stderr.splitlines()) is said, (model, seq_len, out.stderr)
            if command == "plan":
                assert any(f"({key})" in n for n in json.loads(out.stdout)["notes"]) is said


@pytest.mark.parametrize("command", ["estimate", "plan", "size"])
@pytest.mark.parametrize("limit, shown", [(-1, "-1"), (0, "0"), ("big", '"big"'), (8192.5, "8192.5"), (True, "true"),
                                          (float("nan"), "NaN"), (2 ** 63, str(2 ** 63))])
def test_a_position_count_that_is_no_positive_integer_is_refused_naming_the_file_and_key(tmp_path, command, limit,
                                                                                        shown):
    """max_position_embeddings -1, 0, "big", 8192.5, true or NaN was taken as no limit, without a word: a case
    training past it got no note, and the config's malformed count passed unseen. Refused (exit 2) naming
    the file, the key and what was expected, as the config's other counts are; null is a config stating none."""
    import yaml
    from cli_in_process import run_cli

    config = json.loads(fixture("Meta-Llama-3-8B").read_text())
    config["max_position_embeddings"] = limit
    (tmp_path / "config.json").write_text(json.dumps(config))
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump({
        "model": {"hf_config": "config.json"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        "training": {"global_batch_size": 8, "seq_len": 4096, "engine": "megatron"},
        "layout": {"tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 1}}))
    extra = ["--tokens", "1T"] if command == "size" else []
    out = run_cli(command, str(case), *extra)
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines()[-1].startswith(f"error: {tmp_path / 'config.json'}: max_position_embeddings: "
                                                  "expected a positive integer"), out.stderr
    assert out.stderr.splitlines()[-1].endswith(f"got {shown}"), out.stderr
    assert "Traceback" not in out.stderr
    config["max_position_embeddings"] = None  # null: no limit stated, nothing said
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert run_cli(command, str(case), *extra).returncode in (0, 3)
