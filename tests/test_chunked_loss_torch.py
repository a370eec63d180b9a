"""torchtitan 0.3.0's chunked loss (``ChunkedLossWrapper``, every model's config_registry loss), run on
real PyTorch: FSDP2 over a gloo group of one on CPU, bf16 parameters reduced in fp32 as torchtitan
runs them. What it holds is what the torchtitan engine prices (``activations.head_activation_bytes``,
``activations.loss_gradient_bytes``, ``memory.chunked_loss_head_bytes``):

- each chunk's logits are s/N of the sequence's, in bf16: no logits outlive the loss;
- the chunks' input gradients gather in an fp32 buffer of the hidden states' shape;
- the LM head's gradient stays whole between the chunks, in fp32 (FSDP2's unsharded accumulated
  gradient, with gradient sync off for all but the last chunk), and at the last chunk its
  reduce-scatter's fp32 input is allocated beside it, with the head's weight gathered in bf16
  throughout: 10 bytes a weight of the head at once (``memory.chunked_loss_head_bytes``);
- after the loss, what autograd keeps for the decoder's backward is one bf16 tensor of the hidden
  states' shape: the gradient the loss hands back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from cost_models.activations import head_activation_bytes, loss_gradient_bytes, residual_bytes  # noqa: E402
from cost_models.memory import chunked_loss_head_bytes, zero3_gather_bytes  # noqa: E402
from gloo_one_rank import PRELUDE  # noqa: E402
from planner.case import load_case  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# The script's micro-batch, sequence, hidden size, vocabulary, chunks: the head's tensors (V·H weights in 2
# or 4 bytes) are sized apart from every other, so that their bytes can be told from the chunks' logits.
B, S, H, V, N = 1, 64, 32, 4096, 8

SCRIPT = PRELUDE + textwrap.dedent('''
import gc, json, weakref
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
import torchtitan.components.loss as L

# Each shape in turn in the one process (its start-up, torch's and torchtitan's imports, is most of the
# run): every measure below is of the tensors this call makes, its own wrapper, head, tallies and spies.
init = L.GradAccumulator.__init__
made = []
def record(self, *a, **k):
    init(self, *a, **k)
    made.append([list(self._buffer.shape), str(self._buffer.dtype)])
L.GradAccumulator.__init__ = record

def run(B, S, H, V, N):
    gc.collect()
    made.clear()
    torch.manual_seed(0)
    lm_head = torch.nn.Linear(H, V, bias=False)
    fully_shard(lm_head, mesh=init_device_mesh("cpu", (1,)),
                mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    wrapper = L.ChunkedLossWrapper(L.ChunkedLossWrapper.Config(num_chunks=N,
                                                              loss_fn=L.CrossEntropyLoss.Config(global_vocab_size=V)))
    wrapper.set_lm_head(lm_head)
    param = lm_head._get_fsdp_state()._fsdp_param_group.fsdp_params[0]
    seen = {"logits": [], "head_grad": []}
    inner = wrapper.loss_fn
    def spy(logits, labels, *args, **kwargs):
        g = param.unsharded_accumulated_grad
        seen["logits"].append([list(logits.shape), str(logits.dtype)])
        seen["head_grad"].append(None if g is None else [g.numel(), str(g.dtype)])
        return inner(logits, labels, *args, **kwargs)
    wrapper.loss_fn = spy
    from tests.live_bytes import SizedBytes as Bytes

    decoder = torch.randn(B, S, H, requires_grad=True)
    hidden = decoder.to(torch.bfloat16) * 1.0
    labels = torch.randint(V, (B, S))
    kept = []
    def pack(t):
        kept.append(weakref.ref(t)); return t
    head_bytes, logit_bytes = Bytes(V * H), Bytes(B * (S // N) * V)  # the head's tensors, one chunk's logits'
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), head_bytes, logit_bytes:
        loss, _ = wrapper(hidden, labels)
    seen["head_peak_bytes"] = head_bytes.peak
    seen["logit_peak_bytes"] = logit_bytes.peak
    gc.collect()
    alive = {}
    for r in kept:
        t = r()
        if t is not None:
            alive[t.untyped_storage().data_ptr()] = [list(t.shape), str(t.dtype)]
    seen["saved_after"] = list(alive.values())
    loss.backward()
    seen["grad_ok"] = decoder.grad is not None and lm_head.weight.grad is not None
    seen["accumulator"] = list(made)
    return seen

print(json.dumps([run(*shape) for shape in SHAPES]))
dist.destroy_process_group()
''')


# The shapes the tests measure: N chunks over width H, and one chunk over a width of 48, which keeps the
# whole sequence's bf16 logits (2·S·V bytes) off the head's sizes.
ONE_CHUNK_H = 48
SHAPES = ((B, S, H, V, N), (B, S, ONE_CHUNK_H, V, 1))


@pytest.fixture(scope="module")
def measured() -> dict[tuple[int, int], dict]:
    """What the wrapper of N chunks held over hidden states of width H, by (H, N): one subprocess for
    every shape (a start-up each was 7 s of the module's 16)."""
    script = SCRIPT.replace("SHAPES", repr(SHAPES))
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return {(shape[2], shape[4]): seen for shape, seen in zip(SHAPES, json.loads(run.stdout.strip().splitlines()[-1]))}


def torchtitan_job(hidden: int, **training):
    """The same shapes as a torchtitan job: one GPU, the loss left eager as the script runs it."""
    return load_case({"model": {"num_layers": 2, "hidden_size": hidden, "num_attention_heads": 4, "vocab_size": V},
                      "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 1},
                      "training": {"global_batch_size": B, "seq_len": S, "engine": "torchtitan",
                                   "compiled_loss": False, **training},
                      "layout": {"dp": 1, "zero_stage": 3, "micro_batch_size": B, "recompute": "none"}}).job()


def test_torchtitans_chunked_loss_holds_what_the_torchtitan_engine_prices(measured):
    seen = measured[H, N]
    assert seen["grad_ok"]
    job = torchtitan_job(H)
    model, lay, training = job.model, job.layout, job.training
    assert training.loss_chunk_count == N

    # N chunks of s/N positions' bf16 logits; at a chunk's peak, inside its backward, the loop's ``logits``
    # still names them (2), eager cross-entropy keeps its fp32 log-softmax (4) and its backward's two
    # fp32 gradients are alive at once, 4 + 4 (tests/test_eager_loss_torch.py): 14 bytes a chunk's logit.
    assert seen["logits"] == [[[B, S // N, V], "torch.bfloat16"]] * N
    chunk_logits = B * (S // N) * V
    assert seen["logit_peak_bytes"] == (2 + 4 + 4 + 4) * chunk_logits
    (shape, dtype), = seen["accumulator"]
    assert dtype == "torch.float32" and shape == [B, S, H]
    assert loss_gradient_bytes(model, lay, training) == seen["logit_peak_bytes"] + 4 * B * S * H

    # The LM head's gradient, whole in fp32, from the second chunk on; at the last chunk its reduce-scatter's
    # fp32 input beside it, and the weight gathered in bf16 throughout: 2 + 4 + 4 bytes a weight at once.
    assert seen["head_grad"][0] is None and seen["head_grad"][1:] == [[V * H, "torch.float32"]] * (N - 1)
    assert seen["head_peak_bytes"] == (2 + 4 + 4) * V * H
    # Priced beside the decoder layers' units ZeRO-3 holds in flight, of which the gathered head takes the
    # place while the loss runs (these two layers' are smaller than the head).
    assert zero3_gather_bytes(job) < 2 * V * H
    assert chunked_loss_head_bytes(job) + zero3_gather_bytes(job) == (2 + 4 + 4) * V * H

    # Kept for the decoder's backward: the gradient handed back (bf16, the hidden states' shape); the
    # trainer holds the final norm's output of that shape as the model's output, and the norm its input.
    assert seen["saved_after"] == [[[B, S, H], "torch.bfloat16"]]
    norm_input = residual_bytes(training) * B * S * H
    assert head_activation_bytes(model, training, lay) == norm_input + 2 * (2 * B * S * H)


def test_one_chunk_of_torchtitans_wrapper_keeps_no_logits_where_the_loss_on_whole_logits_keeps_them(measured):
    """``--loss.num_chunks 1`` (what ``diagnose`` reads as ``chunked_loss: true``) is still
    ChunkedLossWrapper: one chunk of the whole sequence, run forward and backward inside the forward.
    A hidden width of 48 keeps the whole sequence's bf16 logits (2·S·V bytes) off the head's sizes."""
    hidden = ONE_CHUNK_H
    assert 2 * S * V not in (2 * V * hidden, 4 * V * hidden)
    seen = measured[hidden, 1]
    assert seen["grad_ok"]
    job = torchtitan_job(hidden, loss_chunks=1, chunked_loss=True)
    model, lay, training = job.model, job.layout, job.training

    # One chunk: the whole sequence's bf16 logits, their loss and gradient while it runs, and the fp32
    # accumulator of the hidden states' shape, as in N chunks at N = 1.
    assert seen["logits"] == [[[B, S, V], "torch.bfloat16"]]
    assert seen["accumulator"] == [[[B, S, hidden], "torch.float32"]]
    assert seen["logit_peak_bytes"] == (2 + 4 + 4 + 4) * B * S * V
    assert loss_gradient_bytes(model, lay, training) == seen["logit_peak_bytes"] + 4 * B * S * hidden

    # After it, no logits: the gradient handed back, bf16 of the hidden states' shape, as for N chunks; the
    # loss on whole logits would keep its fp32 log-softmax, 4 bytes a logit, until the backward.
    assert seen["saved_after"] == [[[B, S, hidden], "torch.bfloat16"]]
    norm_input = residual_bytes(training) * B * S * hidden
    assert head_activation_bytes(model, training, lay) == norm_input + 2 * (2 * B * S * hidden)
    whole = torchtitan_job(hidden, loss_chunks=1)
    assert head_activation_bytes(whole.model, whole.training, whole.layout) \
        == norm_input + 2 * B * S * hidden + 4 * B * S * V

    # The head's weight gathered in bf16 through the loss and its gradient reduced in fp32: 10 bytes a weight
    # at the peak, as the engine prices the wrapper's head; one chunk never accumulates it between chunks.
    assert seen["head_grad"] == [None]
    assert seen["head_peak_bytes"] == (2 + 4 + 4) * V * hidden
    assert chunked_loss_head_bytes(job) + zero3_gather_bytes(job) == (2 + 4 + 4) * V * hidden
