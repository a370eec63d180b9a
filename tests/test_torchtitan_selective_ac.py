"""torchtitan's selective activation checkpointing ("matmuls" policy) against what it really keeps.

A block built in torchtitan's op order (its llama3 and qwen3 flavours fuse Q, K and V into one linear,
models/*/__init__.py: fuse_qkv=True) runs under torchtitan 0.3.0's own SelectiveAC wrapper on the CPU
in bf16; every storage the forward creates and that is still alive after it is what the block keeps for
backward (its output, the next block's input, counted as the model counts a layer's input). The CPU's
flash-attention op stands in for the CUDA one in torchtitan's save list."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

import torch.nn.functional as F  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

import torchtitan.distributed.activation_checkpoint as ac  # noqa: E402

from cost_models.activations import layer_activation_bytes  # noqa: E402
from cost_models.specs import Layout, ModelSpec, TrainingSpec  # noqa: E402
from planner.engines import behaviour_of  # noqa: E402

H, HEADS, KV_HEADS, FFN, TOKENS = 512, 8, 2, 1024, 512


class Block(torch.nn.Module):
    """A Llama block as torchtitan's runs its matmuls: wqkv, the attention, wo, w1, w3, w2."""

    def __init__(self) -> None:
        super().__init__()
        d = H // HEADS
        self.wqkv = torch.nn.Linear(H, (HEADS + 2 * KV_HEADS) * d, bias=False)
        self.wo = torch.nn.Linear(H, H, bias=False)
        self.w1 = torch.nn.Linear(H, FFN, bias=False)
        self.w3 = torch.nn.Linear(H, FFN, bias=False)
        self.w2 = torch.nn.Linear(FFN, H, bias=False)

    def forward(self, x):
        d = H // HEADS
        q, k, v = self.wqkv(F.rms_norm(x, (H,))).split([HEADS * d, KV_HEADS * d, KV_HEADS * d], dim=-1)
        q, k, v = (t.view(1, TOKENS, -1, d).transpose(1, 2) for t in (q, k, v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(attention.transpose(1, 2).reshape(1, TOKENS, H))
        y = F.rms_norm(x, (H,))
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_torchtitans_flavours_fuse_q_k_and_v(family):
    import torchtitan  # its model packages import triton, which a CPU machine lacks: their source is read

    source = (Path(torchtitan.__file__).parent / "models" / family / "__init__.py").read_text()
    # but the debug model kept to cover the separate wq, wk, wv (qwen3's _debugmodel_non_fused_qkv)
    source = re.sub(r"def _debugmodel_non_fused_qkv.*?\n\n\n", "", source, flags=re.DOTALL)
    assert set(re.findall(r"fuse_qkv: bool = (\w+)", source)) == {"True"}
    assert len(re.findall(r"fuse_qkv=True", source)) >= 6 and "fuse_qkv=False" not in source
    assert behaviour_of("torchtitan").fused_qkv


def test_selective_ac_keeps_q_k_and_v_of_the_fused_linear(monkeypatch):
    """The policy keeps every other matmul's output: wqkv's (Q, K and V), w1's and w2's. Priced as
    separate wq, wk, wv, the kept K was missing: 12.5 % of a layer with as many key-value heads as heads."""
    save = ac._get_default_save_ops()
    monkeypatch.setattr(ac, "_get_default_save_ops",
                        lambda: save | {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default})
    torch.manual_seed(0)
    block = ac.SelectiveAC.Config().build()._wrap_block(Block().to(torch.bfloat16))
    x = torch.randn(1, TOKENS, H, dtype=torch.bfloat16, requires_grad=True)
    # The weights' storages (a transposed weight is a view of one) are model state, not activations.
    created: dict[int, tuple] = {p.untyped_storage()._cdata: (StorageWeakRef(p.untyped_storage()), 0)
                                 for p in block.parameters()}

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    created.setdefault(storage._cdata, (StorageWeakRef(storage), storage.nbytes()))
            return out

    with Track():
        out = block(x)
    kept = sum(n for ref, n in created.values() if not ref.expired())
    out.float().sum().backward()  # what was kept serves the backward

    model = ModelSpec("block", num_layers=1, hidden_size=H, num_attention_heads=HEADS, num_kv_heads=KV_HEADS,
                      vocab_size=1000, activation="swiglu", ffn_hidden_size=FFN)
    training = TrainingSpec(1, TOKENS, precision="bf16", engine=behaviour_of("torchtitan"))
    priced = layer_activation_bytes(model, training, Layout(recompute="selective"), selective="matmuls")
    lse = HEADS * TOKENS * 4  # flash attention's per-head log-sum-exp, which the model leaves out
    assert priced == pytest.approx(kept - lse, rel=1e-6)
