"""The loss on whole logits as plain PyTorch and torchtitan run it eager (``F.cross_entropy`` on
bf16 logits upcast to fp32: torchtitan components/loss.py, ``cross_entropy_loss``), run on real
PyTorch on CPU: the most bytes alive at once in tensors of the logits' shape, from the LM head's
output to the end of its backward, against what the memory model prices for the loss
(``activations.head_activation_bytes``' saved logits, ``activations.loss_gradient_bytes``).

Live tensors are counted by their storages, as each op makes them and until each is freed: no
allocator (and no caching allocator's reuse) is involved, so the figure is the one a GPU's
``max_memory_allocated`` adds for these tensors."""

from __future__ import annotations

import pytest

from cost_models.activations import loss_gradient_bytes, saved_logit_bytes
from planner.case import load_case

torch = pytest.importorskip("torch")
F = torch.nn.functional
from live_bytes import SizedBytes  # noqa: E402

# Tokens, hidden width, vocabulary: the head's weight (V·H) is sized apart from the logits (T·V).
T, H, V = 64, 48, 4096



def measured_bytes_per_logit() -> tuple[float, float]:
    """The loss's peak bytes a logit in its forward and over forward and backward together."""
    torch.manual_seed(0)
    head = torch.nn.Linear(H, V, bias=False).to(torch.bfloat16)
    hidden = torch.randn(T, H, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(V, (T,))
    tally = SizedBytes(T * V)
    with tally:
        logits = head(hidden)
        loss = F.cross_entropy(logits.float(), labels, reduction="sum")
        del logits  # the training step drops the model's output before backward (torchtitan: ``del pred``)
        forward = tally.peak
        loss.backward()
    assert head.weight.grad is not None and hidden.grad is not None
    return forward / (T * V), tally.peak / (T * V)


def plain_pytorch_job():
    return load_case({"model": {"num_layers": 2, "hidden_size": H, "num_attention_heads": 4, "vocab_size": V},
                      "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 1},
                      "training": {"global_batch_size": 1, "seq_len": T, "engine": "any", "compiled_loss": False},
                      "layout": {"dp": 1, "micro_batch_size": 1, "recompute": "none"}}).job()


def test_eager_cross_entropy_on_upcast_logits_peaks_at_what_the_loss_is_priced():
    forward, peak = measured_bytes_per_logit()
    # Forward: the bf16 logits, their fp32 cast and the fp32 log-softmax it keeps. Backward: the saved
    # log-softmax, nll_loss_backward's fp32 gradient of it and _log_softmax_backward_data's fp32 gradient
    # of the logits, three fp32 tensors at once (the bf16 cast comes after the first two are freed).
    assert forward == 2 + 4 + 4
    assert peak == 4 + 4 + 4
    job = plain_pytorch_job()
    logits = T * V
    priced = saved_logit_bytes(job.training) * logits + loss_gradient_bytes(job.model, job.layout, job.training)
    assert priced == peak * logits
