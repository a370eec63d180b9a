"""The activation-memory model against what PyTorch autograd really saves for backward.

Each test runs a forward pass of ``calibration.gpt`` inside
``torch.autograd.graph.saved_tensors_hooks`` and adds up the bytes of the tensors
saved for backward, each storage once (views of one storage, such as q, k and v
sliced from the fused QKV output, share it). Parameters and buffers are model
state, not activations, and are left out; so are the token ids and targets, which
are the batch itself. The layer's input is counted: the model counts it as the
first norm's input.

What the model leaves out on purpose, and we therefore tolerate (2 %): the norms'
per-token mean and 1/rms and flash attention's per-head log-sum-exp (the model is
0.1-0.3 % under the measured bytes in every case here).

A non-reentrant checkpoint installs its own saved-tensor hooks for the region it
recomputes; the innermost hooks win, so the recorder sees only what the
checkpoint itself keeps (its inputs), which is what the model's recompute terms count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from calibration.gpt import (  # noqa: E402
    GPT,
    GPTConfig,
    RMSNorm,
    TransformerLayer,
    rms_norm,
    swiglu,
    swiglu_reference,
)
from cost_models.activations import (  # noqa: E402
    embedding_activation_bytes,
    head_activation_bytes,
    layer_activation_bytes,
    layer_activations,
)
from cost_models.specs import Layout, ModelSpec, TrainingSpec  # noqa: E402
from calibration.validate import REFERENCE  # noqa: E402

REL_TOL = 0.02
VOCAB = 1000
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


# --------------------------------------------------------------------------- counting


class SavedForBackward:
    """Records the tensors autograd saves for backward inside a ``with`` block.

    ``nbytes`` counts each storage once, and leaves out the storages of
    ``exclude``: modules (their parameters and buffers) and tensors.
    """

    def __init__(self, *exclude):
        self._exclude = exclude
        self.saved: list[torch.Tensor] = []

    def __enter__(self) -> "SavedForBackward":
        excluded = set()
        for item in self._exclude:
            tensors = [item] if isinstance(item, torch.Tensor) else \
                [*item.parameters(), *item.buffers()]
            excluded.update(t.untyped_storage().data_ptr() for t in tensors)
        self._excluded = excluded

        def pack(t: torch.Tensor) -> torch.Tensor:
            self.saved.append(t)  # kept alive, so no storage address is reused meanwhile
            return t

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    def storages(self) -> dict[int, torch.Tensor]:
        """Storage address → first saved tensor on it, for the storages counted."""
        found: dict[int, torch.Tensor] = {}
        for t in self.saved:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in self._excluded and ptr not in found:
                found[ptr] = t
        return found

    def holds(self, tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() in self.storages()

    @property
    def nbytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in self.storages().values())

    def describe(self) -> str:
        return "\n".join(f"  {tuple(t.shape)} {t.dtype}: {t.untyped_storage().nbytes()} B"
                         for t in self.storages().values())


def assert_close(measured: float, modelled: float, what: str, recorder: SavedForBackward) -> None:
    ratio = modelled / measured
    assert abs(ratio - 1) <= REL_TOL, (
        f"{what}: model {modelled:.0f} B, torch {measured:.0f} B (model/torch {ratio:.4f})\n"
        f"saved storages:\n{recorder.describe()}")


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    attention: str  # "megatron" (unfused, s×s kept) or "sdpa" (flash)
    activation: str
    dropout: float
    kv_divisor: int = 1  # num_kv_heads = heads / kv_divisor

    def __str__(self) -> str:
        gqa = f"-gqa{self.kv_divisor}" if self.kv_divisor > 1 else ""
        return f"{self.attention}-{self.activation}{gqa}-dropout{self.dropout}"

    def model(self, h: int, a: int, num_layers: int = 1) -> ModelSpec:
        f = 4 * h if self.activation == "gelu" else 64 * math.ceil(8 * h / 3 / 64)
        return ModelSpec("calibration", num_layers=num_layers, hidden_size=h, num_attention_heads=a,
                         vocab_size=VOCAB, num_kv_heads=a // self.kv_divisor, ffn_hidden_size=f,
                         activation=self.activation, dropout=self.dropout)

    def training(self, b: int, s: int, precision: str) -> TrainingSpec:
        # The repo's GPT is the "reference" trainer: fused SwiGLU, Megatron-style selective recompute.
        return TrainingSpec(global_batch_size=b, seq_len=s, precision=precision,
                            flash_attention=self.attention == "sdpa", engine=REFERENCE)


# (b, s, h, a); head dims 64, 64, 64, 128.
SHAPES = [(1, 128, 256, 4), (2, 256, 512, 8), (4, 64, 384, 6), (1, 512, 256, 2)]
CASES = [
    Case("megatron", "gelu", 0.1),  # Korthikanti et al.'s setting: sbh(34 + 5as/h) in bf16
    Case("megatron", "gelu", 0.0),
    Case("sdpa", "gelu", 0.0),
    Case("sdpa", "swiglu", 0.0),
    Case("sdpa", "swiglu", 0.0, kv_divisor=2),
]


def build_layer(case: Case, h: int, a: int, dtype: torch.dtype, recompute: str = "none") -> TransformerLayer:
    torch.manual_seed(0)
    config = GPTConfig.from_model_spec(case.model(h, a), attention=case.attention, recompute=recompute)
    return TransformerLayer(config).to(dtype).train()


def measure_layer(layer: TransformerLayer, x: torch.Tensor, *, full_checkpoint: bool = False) -> SavedForBackward:
    with SavedForBackward(layer) as recorder:
        if full_checkpoint:
            out = checkpoint(layer, x, use_reentrant=False)
        else:
            out = layer(x)
    assert out.requires_grad
    return recorder


def layer_input(b: int, s: int, h: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(b, s, h, dtype=dtype, requires_grad=True)


# --------------------------------------------------------------------------- fused ops


def test_swiglu_gradient_matches_autograd_of_unfused_form():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 2 * 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(swiglu, (x,))
    grad = torch.randn(3, 5, 7, dtype=torch.float64)
    (fused,) = torch.autograd.grad(swiglu(x), x, grad)
    (reference,) = torch.autograd.grad(swiglu_reference(x), x, grad)
    torch.testing.assert_close(fused, reference)
    torch.testing.assert_close(swiglu(x), swiglu_reference(x))


def test_swiglu_keeps_only_its_input():
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16, requires_grad=True)
    with SavedForBackward() as recorder:
        swiglu(x)
    assert recorder.nbytes == x.untyped_storage().nbytes() and recorder.holds(x)


def test_rmsnorm_gradient_and_forward():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.empty(6, dtype=torch.float64).uniform_(0.5, 1.5).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, w, 1e-5), (x, weight))
    torch.testing.assert_close(rms_norm(x, weight, 1e-5), F.rms_norm(x, (6,), weight, 1e-5))


def test_rmsnorm_keeps_its_input_and_per_token_statistics():
    norm = RMSNorm(64).to(torch.bfloat16)
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16, requires_grad=True)
    with SavedForBackward(norm) as recorder:
        norm(x)
    # x (bf16) and 1/rms (fp32, one a token)
    assert recorder.holds(x)
    assert recorder.nbytes == x.untyped_storage().nbytes() + 4 * 2 * 16


def test_attention_cores_agree():
    """The unfused (Megatron) core and SDPA compute the same attention, MHA and GQA."""
    x = torch.randn(2, 32, 128, dtype=torch.float64)
    for case in (Case("megatron", "gelu", 0.0), Case("megatron", "swiglu", 0.0, kv_divisor=2)):
        megatron = build_layer(case, 128, 4, torch.float64)
        sdpa = build_layer(Case("sdpa", case.activation, 0.0, case.kv_divisor), 128, 4, torch.float64)
        sdpa.load_state_dict(megatron.state_dict())
        torch.testing.assert_close(megatron(x), sdpa(x))


# --------------------------------------------------------------------------- one layer


@pytest.mark.parametrize("precision", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: "b{}-s{}-h{}-a{}".format(*shape))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_layer_saved_bytes_match_model(case, shape, precision):
    b, s, h, a = shape
    dtype = DTYPES[precision]
    recorder = measure_layer(build_layer(case, h, a, dtype), layer_input(b, s, h, dtype))
    modelled = layer_activations(case.model(h, a), case.training(b, s, precision), Layout(micro_batch_size=b))
    assert_close(recorder.nbytes, modelled.total, f"{case} {shape} {precision}", recorder)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: "b{}-s{}-h{}-a{}".format(*shape))
def test_korthikanti_no_parallelism(shape):
    """Korthikanti et al. 2022, §4.1: sbh·(34 + 5as/h) bytes in 16-bit with dropout."""
    b, s, h, a = shape
    recorder = measure_layer(build_layer(Case("megatron", "gelu", 0.1), h, a, torch.bfloat16),
                             layer_input(b, s, h, torch.bfloat16))
    assert_close(recorder.nbytes, s * b * h * (34 + 5 * a * s / h), f"sbh(34 + 5as/h) {shape}", recorder)


@pytest.mark.parametrize("precision", DTYPES)
def test_unfused_gqa_keeps_full_width_k_and_v(precision):
    """Without flash attention, GQA keeps K and V at full width.

    Megatron's ``DotProductAttention`` (and our copy of it) repeats the kv heads
    before the score and value GEMMs (``repeat_interleave``), and the GEMMs keep the
    repeated K and V: p·sb·3h for Q, K and V, not p·sb·(h + 2kv).
    """
    case = Case("megatron", "swiglu", 0.0, kv_divisor=2)
    b, s, h, a = 2, 128, 256, 4
    dtype = DTYPES[precision]
    recorder = measure_layer(build_layer(case, h, a, dtype), layer_input(b, s, h, dtype))
    acts = layer_activations(case.model(h, a), case.training(b, s, precision), Layout(micro_batch_size=b))
    p = 4 if precision == "fp32" else 2
    assert acts.qkv == 3 * p * s * b * h
    assert_close(recorder.nbytes, acts.total, f"{case} unfused GQA", recorder)


# --------------------------------------------------------------------------- recomputation


@pytest.mark.parametrize("precision", DTYPES)
@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda shape: "b{}-s{}-h{}-a{}".format(*shape))
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[4]], ids=str)
def test_selective_recompute_keeps_no_attention_core(case, shape, precision):
    """Checkpointing the core attention keeps q, k, v (its inputs) and the context, no s×s tensor."""
    b, s, h, a = shape
    dtype = DTYPES[precision]
    recorder = measure_layer(build_layer(case, h, a, dtype, recompute="selective"), layer_input(b, s, h, dtype))
    modelled = layer_activation_bytes(case.model(h, a), case.training(b, s, precision),
                                      Layout(micro_batch_size=b, recompute="selective"))
    assert_close(recorder.nbytes, modelled, f"selective {case} {shape} {precision}", recorder)
    assert not [t for t in recorder.storages().values() if tuple(t.shape[-2:]) == (s, s)]


@pytest.mark.parametrize("precision", DTYPES)
@pytest.mark.parametrize("case", [CASES[0], CASES[4]], ids=str)
def test_full_recompute_keeps_only_the_layer_input(case, precision):
    """A checkpointed layer keeps its input, p·sbh, and nothing else."""
    b, s, h, a = SHAPES[1]
    dtype = DTYPES[precision]
    layer = build_layer(case, h, a, dtype)
    x = layer_input(b, s, h, dtype)
    recorder = measure_layer(layer, x, full_checkpoint=True)
    modelled = layer_activation_bytes(case.model(h, a), case.training(b, s, precision),
                                      Layout(micro_batch_size=b, recompute="full"), recomputed=True)
    assert recorder.holds(x)  # the checkpoint's input is seen by the outer hooks...
    assert_close(recorder.nbytes, modelled, f"full {case} {precision}", recorder)
    # ...and the layer's own saved tensors are not: without the checkpoint they are.
    plain = measure_layer(layer, x)
    assert plain.nbytes > 10 * recorder.nbytes


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recomputation_gives_the_same_gradients(recompute):
    """Checkpointing recomputes the same dropout masks: loss and gradients do not change."""
    case = Case("megatron", "gelu", 0.1)
    spec = case.model(64, 2, num_layers=2)
    ids = torch.randint(VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))
    grads = []
    for mode in ("none", recompute):
        torch.manual_seed(0)
        gpt = GPT(GPTConfig.from_model_spec(spec, recompute=mode, max_seq_len=32)).train()
        torch.manual_seed(1)
        loss = gpt(ids, ids.roll(-1, dims=1))
        loss.backward()
        grads.append([loss.detach()] + [p.grad for p in gpt.parameters()])
    for plain, recomputed in zip(*grads):
        torch.testing.assert_close(recomputed, plain)


# --------------------------------------------------------------------------- embedding, head, model


def small_gpt(case: Case, h: int, a: int, num_layers: int, seq_len: int, dtype: torch.dtype,
              recompute: str = "none") -> GPT:
    torch.manual_seed(0)
    config = GPTConfig.from_model_spec(case.model(h, a, num_layers), attention=case.attention,
                                       recompute=recompute, max_seq_len=seq_len)
    return GPT(config).to(dtype).train()


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_embedding_keeps_only_the_dropout_mask(dropout):
    case = Case("megatron", "gelu", dropout)
    b, s, h, a = 2, 64, 128, 2
    gpt = small_gpt(case, h, a, 1, s, torch.bfloat16)
    ids = torch.randint(VOCAB, (b, s))
    with SavedForBackward(gpt, ids) as recorder:
        gpt.embed(ids)
    modelled = embedding_activation_bytes(case.model(h, a), case.training(b, s, "bf16"), Layout(micro_batch_size=b))
    assert recorder.nbytes == modelled, recorder.describe()


@pytest.mark.parametrize("precision", DTYPES)
@pytest.mark.parametrize("case", [CASES[0], CASES[4]], ids=str)
def test_head_keeps_norm_input_head_input_and_fp32_log_softmax(case, precision):
    """Final norm → LM head → cross-entropy on fp32 logits: p·sbh twice and 4·sbV.

    Besides these, cross-entropy keeps the int64 targets (8·sb, the batch: left out
    here) and a 4-byte total weight; the norm its per-token statistics.
    """
    b, s, h, a = 2, 64, 256, 4
    dtype = DTYPES[precision]
    gpt = small_gpt(case, h, a, 1, s, dtype)
    hidden = layer_input(b, s, h, dtype)
    targets = torch.randint(VOCAB, (b, s))
    with SavedForBackward(gpt, targets) as recorder:
        gpt.head(hidden, targets)
    modelled = head_activation_bytes(case.model(h, a), case.training(b, s, precision), Layout(micro_batch_size=b))
    assert_close(recorder.nbytes, modelled, f"head {case} {precision}", recorder)
    # The 4·sbV term is cross-entropy's fp32 log-softmax; the (bf16) logits are not kept.
    vocab_sized = [t for t in recorder.storages().values() if t.numel() == b * s * VOCAB]
    assert [t.dtype for t in vocab_sized] == [torch.float32]


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("case", [CASES[0], CASES[4]], ids=str)
def test_whole_model_matches_embedding_layers_and_head(case, recompute):
    b, s, h, a, num_layers = 2, 128, 256, 4, 2
    gpt = small_gpt(case, h, a, num_layers, s, torch.bfloat16, recompute)
    ids = torch.randint(VOCAB, (b, s))
    targets = ids.roll(-1, dims=1)
    with SavedForBackward(gpt, ids, targets) as recorder:
        loss = gpt(ids, targets)
    spec, training = case.model(h, a, num_layers), case.training(b, s, "bf16")
    layout = Layout(micro_batch_size=b, recompute=recompute)
    modelled = (embedding_activation_bytes(spec, training, layout)
                + num_layers * layer_activation_bytes(spec, training, layout, recomputed=True)
                + head_activation_bytes(spec, training, layout))
    assert_close(recorder.nbytes, modelled, f"model {case} {recompute}", recorder)
    loss.backward()
    assert all(p.grad is not None for p in gpt.parameters())
