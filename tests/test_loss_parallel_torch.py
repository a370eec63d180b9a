"""torchtitan 0.3.0's loss at tp > 1, run on real PyTorch on CPU: its LM head's logits are
vocab-sharded, and ``cross_entropy_loss`` (components/loss.py) hands them to
``_LossParallelCrossEntropy``, its own vocab-parallel cross-entropy in place of torch's
``loss_parallel()``. What it holds, whole logits and inside ``ChunkedLossWrapper``, is what the
torchtitan engine prices at tp > 1 (``EngineBehaviour.tp_loss_gradient_bytes``,
``activations.loss_gradient_bytes``, ``activations.head_activation_bytes``' saved logits).

The loss's backward allocates nothing that depends on the group's size (its forward's all-reduces
carry one number a row), so the script runs a gloo group of one holding the shard of V/tp logits
a rank of tp holds, with torchtitan's mesh-size check told tp = 2 so that the trainer's own loss
takes its vocab-parallel branch; a gloo group of two ranks measured the same bytes. Live tensors
are counted by their storages, as ``tests/test_eager_loss_torch.py`` counts them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from cost_models.activations import loss_gradient_bytes, saved_logit_bytes  # noqa: E402
from gloo_one_rank import PRELUDE  # noqa: E402
from planner.case import load_case  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# Sequence, hidden width, one rank's vocabulary shard, chunks, tensor-parallel width.
S, H, V, N, TP = 64, 48, 4096, 8, 2

SCRIPT = PRELUDE + textwrap.dedent('''
import json
from torch.distributed.device_mesh import init_device_mesh
import torchtitan.components.loss as L
from torchtitan.distributed import spmd_types as ST

S, H, V, N, TP = SHAPE
mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
ST.set_spmd_meshes(dense_mesh=mesh, sparse_mesh=None)
L.spmd_mesh_size = lambda axis: TP if axis == "tp" else 1  # the group of one stands for a rank of TP
taken = []
apply = L._LossParallelCrossEntropy.apply
def spy(*args):
    taken.append(list(args[0].shape)); return apply(*args)
L._LossParallelCrossEntropy.apply = spy

from tests.live_bytes import SizedBytes as Bytes

seen = {}
torch.manual_seed(0)
labels = torch.randint(V, (1, S))
with ST.set_current_spmd_mesh(mesh):
    # Whole logits, as the trainer runs the loss: ``del pred`` before the backward.
    head = torch.nn.Linear(H, V, bias=False).to(torch.bfloat16)
    hidden = torch.randn(1, S, H, dtype=torch.bfloat16, requires_grad=True)
    loss_fn = L.CrossEntropyLoss(L.CrossEntropyLoss.Config(global_vocab_size=V))
    tally = Bytes(S * V)
    with tally:
        pred = head(hidden)
        loss, _ = loss_fn(pred, labels)
        del pred
        forward = tally.peak
        loss.backward()
    seen["whole"] = [forward, tally.peak, hidden.grad is not None]
    # N chunks in torchtitan's wrapper: each chunk's backward runs inside the forward.
    wrapper = L.ChunkedLossWrapper(L.ChunkedLossWrapper.Config(
        num_chunks=N, loss_fn=L.CrossEntropyLoss.Config(global_vocab_size=V)))
    wrapper.set_lm_head(head)
    decoder = torch.randn(1, S, H, dtype=torch.bfloat16, requires_grad=True)
    tally = Bytes(S // N * V)
    with tally:
        loss, _ = wrapper(decoder * 1.0, labels)
    loss.backward()
    seen["chunk"] = [tally.peak, decoder.grad is not None]
seen["taken"] = taken
print(json.dumps(seen))
dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def seen() -> dict:
    script = SCRIPT.replace("SHAPE", repr((S, H, V, N, TP)))
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    if run.returncode != 0 and "gloo" in run.stderr.lower() and "Error" in run.stderr:
        pytest.skip("this platform cannot run a gloo group: " + run.stderr.strip().splitlines()[-1])
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def torchtitan_job(**training):
    """A torchtitan job whose rank of tp = 2 holds the script's V logits a position, its loss eager."""
    return load_case({"model": {"num_layers": 2, "hidden_size": H, "num_attention_heads": 4, "vocab_size": TP * V},
                      "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": TP},
                      "training": {"global_batch_size": 1, "seq_len": S, "engine": "torchtitan",
                                   "compiled_loss": False, **training},
                      "layout": {"dp": 1, "tp": TP, "zero_stage": 3, "micro_batch_size": 1,
                                 "recompute": "none"}}).job()


def test_torchtitans_vocab_parallel_loss_on_whole_logits_peaks_at_what_the_engine_prices_at_tp_2(seen):
    forward, peak, grad_ok = seen["whole"]
    assert grad_ok and seen["taken"][0] == [S, V]  # the trainer's loss took the vocab-parallel branch
    logits = S * V
    # Forward: the bf16 logits, their fp32 cast, the shifted logits and the log-probs. Backward: the saved
    # fp32 log-probs beside _LossParallelCrossEntropy.backward's zeros_like(log_probs), exp(log_probs) and
    # their sum (then the product), three fp32 tensors at once: 4 + 12, where eager cross-entropy peaks at 4 + 8.
    assert forward == (2 + 4 + 4 + 4) * logits
    assert peak == (4 + 12) * logits
    job = torchtitan_job(loss_chunks=1)
    assert job.layout.tp == TP and not job.training.loss_in_chunks
    priced = saved_logit_bytes(job.training) * logits + loss_gradient_bytes(job.model, job.layout, job.training)
    assert priced == peak


def test_torchtitans_vocab_parallel_loss_in_chunks_peaks_at_what_the_engine_prices_at_tp_2(seen):
    peak, grad_ok = seen["chunk"]
    assert grad_ok and seen["taken"][1:] == [[S // N, V]] * N
    chunk_logits = S // N * V
    # The chunk's bf16 logits, which the wrapper's loop still names, its fp32 log-probs and the backward's three.
    assert peak == (2 + 4 + 12) * chunk_logits
    job = torchtitan_job()
    assert job.training.loss_chunk_count == N
    accumulator = 4 * S * H  # the wrapper's fp32 GradAccumulator of the hidden states' shape
    assert loss_gradient_bytes(job.model, job.layout, job.training) == peak + accumulator
