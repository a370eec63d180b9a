"""The loss as torchtitan runs it, compiled: what it keeps for backward and what its gradient
costs (``activations.saved_logit_bytes``, ``activations.loss_gradient_bytes``), measured on
real PyTorch (inductor on this CPU) and priced exactly."""

from __future__ import annotations

import pytest

from cost_models.activations import head_activation_bytes, loss_gradient_bytes, saved_logit_bytes
from planner.case import load_case

torch = pytest.importorskip("torch")
F = torch.nn.functional

T, V = 256, 2048  # tokens and vocabulary: big enough that the logits dwarf the per-row statistics


def job(engine: str, precision: str = "bf16", **training):
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 8, "seq_len": 8192, "precision": precision, **training},
            "search": {"target": engine},
            "layout": {"dp": 8, "tp": 1, "pp": 1, "zero_stage": 3, "micro_batch_size": 1}}
    return load_case(case).job()


def saved_by(loss_fn) -> list[torch.Tensor]:
    """The tensors autograd keeps for the loss's backward, one entry per distinct storage."""
    saved, seen = [], set()

    def pack(t):
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            saved.append(t)
        return t

    logits = torch.randn(1, T, V, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(V, (1, T))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(logits, labels)
    loss.backward()
    assert logits.grad.dtype == torch.bfloat16  # the gradient the LM head's backward takes, either way
    return saved


def torchtitan_loss(pred, labels):  # torchtitan components/loss.py: cross_entropy_loss, one rank
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum")


@pytest.mark.slow  # inductor compiles C++ for the CPU: seconds to a minute, once
def test_the_compiled_loss_keeps_the_16_bit_logits_where_eager_keeps_the_fp32_log_softmax():
    def logit_bytes(saved):
        return sum(t.numel() * t.element_size() for t in saved if t.numel() >= T * V) / (T * V)

    eager, compiled = saved_by(torchtitan_loss), saved_by(torch.compile(torchtitan_loss))
    assert logit_bytes(eager) == saved_logit_bytes(job("any").training) == 4
    assert logit_bytes(compiled) == saved_logit_bytes(job("torchtitan").training) == 2
    # Beside them, only per-row numbers (fp32 statistics, the labels).
    assert all(t.numel() <= T for t in compiled if t.numel() < T * V)


def whole_logits(engine: str) -> dict:
    """torchtitan's loss on whole logits (its 0.2 releases; ``loss_chunks: 1`` in 0.3.0), which the
    others always run: test_chunked_loss_torch.py measures its chunks."""
    return {"loss_chunks": 1} if engine == "torchtitan" else {}


def test_a_compiled_loss_holds_four_bytes_a_logit_in_16_bits_where_eager_holds_twelve():
    """Eager: the saved fp32 log-softmax and its backward's two fp32 gradients (measured in
    tests/test_eager_loss_torch.py)."""
    logits = 8192 * 1 * 128256  # s·b·V of llama3-8b at 8k tokens, one sequence, tp 1
    for engine, saved, gradient in (("any", 4, 8), ("torchtitan", 2, 2), ("megatron", 4, 2)):
        j = job(engine, **whole_logits(engine))
        head = head_activation_bytes(j.model, j.training, j.layout)
        inputs = head - saved * logits  # the final norm's and the LM head's inputs
        assert inputs == 2 * 2 * 8192 * 4096, engine
        assert loss_gradient_bytes(j.model, j.layout, j.training) == gradient * logits, engine
    fp32 = job("torchtitan", precision="fp32", loss_chunks=1)
    assert saved_logit_bytes(fp32.training) == 4
    assert loss_gradient_bytes(fp32.model, fp32.layout, fp32.training) == 4 * logits


def test_a_compiled_loss_reads_the_logits_twice_forward_and_once_backward_writing_its_gradient():
    from cost_models.layer_time import cross_entropy_bytes, cross_entropy_exponent_bytes, cross_entropy_time

    eager, compiled = job("any"), job("torchtitan")
    gpu = compiled.cluster.gpu
    assert cross_entropy_bytes(1000, eager.training) == 1000 * 32  # (2 + 4) + 4 + 8 + 8 + (4 + 2)
    assert cross_entropy_bytes(1000, compiled.training) == 1000 * 8  # 2 + 2 forward, 2 + 2 backward
    assert cross_entropy_exponent_bytes(1000, compiled.training) == 1000 * 6
    # A GPU preset leaves the exponent's own share unset: the memory's rate (kernels._share_of_hbm).
    assert gpu.performance.transcendental_efficiency is None
    assert cross_entropy_time(1000, compiled.training, gpu) == pytest.approx(
        1000 * 8 / (gpu.hbm_bandwidth * gpu.performance.hbm_efficiency))


def test_a_case_says_whether_its_loss_is_compiled_whatever_the_engine_default():
    """training.compiled_loss: a plain PyTorch script that compiles its loss holds what torchtitan's
    does, and a torchtitan run that leaves it out of compile.components holds what eager does;
    Megatron's loss is its own vocab-parallel kernel, and a compiled one is refused by key."""
    from planner.errors import CaseError

    logits = 8192 * 1 * 128256
    for engine, compiled, saved, gradient in (("any", True, 2, 2), ("torchtitan", False, 4, 8)):
        j = job(engine, compiled_loss=compiled, **whole_logits(engine))
        assert j.training.loss_compiled is compiled
        assert saved_logit_bytes(j.training) == saved
        assert loss_gradient_bytes(j.model, j.layout, j.training) == gradient * logits
    from planner.estimate import estimate
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 8, "seq_len": 8192, "engine": "megatron", "compiled_loss": True},
            "layout": {"dp": 8, "micro_batch_size": 1}}
    with pytest.raises(CaseError) as error:
        estimate(case)
    assert error.value.key == "training.compiled_loss" and "vocab-parallel" in error.value.expected
