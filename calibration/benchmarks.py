"""Microbenchmarks on one rank: GEMMs, attention, memory bandwidth and collectives.

Each benchmark runs the kernel the model runs (the ``nn.Linear`` GEMM and element-wise
kernels into preallocated outputs, SDPA forward and backward, ``torch.distributed``
collectives), warms it up, then takes ``samples`` timings. A timing runs the
operation ``inner`` times back to back and divides, so that microsecond kernels are
timed as they run in training (queued one after another), not with a host
synchronisation each; ``inner`` is chosen so a sample lasts about ``target_s``.
A sample is timed by :class:`Clock`: CUDA events on a GPU, the host clock on a CPU.
Results are per-call seconds, one per sample.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .shapes import AttentionShape, GemmShape

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Budget:
    warmup: int = 2
    samples: int = 7
    target_s: float = 0.02  # length of one timing sample
    max_inner: int = 1000


class Clock:
    """Time on ``device``: CUDA events recorded on the current stream on a GPU (the kernels'
    time, launch gaps included only where the stream waits for the host), the host clock
    otherwise. ``mark()`` as work is queued, then ``intervals()`` between the marks."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals(self) -> list[float]:
        """Seconds between consecutive marks; the marks are cleared."""
        marks, self.marks = self.marks, []
        if self.cuda:
            self.sync()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:])]
        return [b - a for a, b in zip(marks, marks[1:])]

    def time(self, block: Callable[[], object]) -> float:
        """Seconds ``block`` takes, from an idle device."""
        self.sync()
        self.mark()
        block()
        self.mark()
        return self.intervals()[0]


def inner_count(fn: Callable[[], object], clock: Clock, budget: Budget) -> int:
    """Calls per sample so one sample lasts about ``budget.target_s``."""
    one = clock.time(fn)
    return max(1, min(budget.max_inner, int(budget.target_s / max(one, 1e-7))))


def time_calls(fn: Callable[[], object], clock: Clock, budget: Budget,
               inner: Optional[int] = None, before_sample: Optional[Callable[[], None]] = None) -> list[float]:
    """Per-call seconds of ``fn``, one per sample, after ``budget.warmup`` calls."""
    for _ in range(budget.warmup):
        fn()
    if inner is None:
        inner = inner_count(fn, clock, budget)

    def calls() -> None:
        for _ in range(inner):
            fn()

    times = []
    for _ in range(budget.samples):
        if before_sample is not None:
            before_sample()
        times.append(clock.time(calls) / inner)
    return times


# Bytes of operands a GEMM benchmark rotates through, so that each call finds its operands
# out of cache as a training step does (each layer's weights and activations were last
# touched a whole layer stack ago): 256 MB, the buffer triton.testing.do_bench writes to
# flush the L2 between timings; past a CPU's per-core L2 and a GPU's L2 (50 MB on H100).
COLD_BYTES = 256 * 2**20
MAX_COPIES = 64


def operand_copies(set_bytes: int) -> int:
    """Operand sets to cycle through so that together they span ``COLD_BYTES``."""
    return max(1, min(MAX_COPIES, -(-COLD_BYTES // max(set_bytes, 1))))


def gemm(shape: GemmShape, precision: str, device: torch.device, budget: Budget) -> list[float]:
    """m tokens by an n×k weight, ``x @ w.T``: the BLAS call of ``nn.Linear``'s forward.

    The output is preallocated: the GEMM kernel is what ``gemm_efficiency`` describes.
    On GPUs the caching allocator makes the model's fresh outputs free anyway; on CPUs
    glibc returns large blocks to the OS, and first-touch page faults on each fresh
    output would add up to a third to wide, shallow GEMMs (k = 256), a cost of the
    allocator and not of the GEMM (see docs/calibration.md). Calls cycle
    through :func:`operand_copies` sets of operands, cold as in training, still queued
    back to back.
    """
    dtype = DTYPES[precision]
    element = torch.tensor([], dtype=dtype).element_size()
    copies = operand_copies(element * (shape.m * shape.k + shape.n * shape.k + shape.m * shape.n))
    sets = []
    for _ in range(copies):
        x = torch.empty(shape.m, shape.k, device=device, dtype=dtype).uniform_(-1, 1)
        w = torch.empty(shape.n, shape.k, device=device, dtype=dtype).uniform_(-1, 1)
        sets.append((x, w.t(), torch.empty(shape.m, shape.n, device=device, dtype=dtype)))
    turn = iter(range(1 << 62))

    def call() -> None:
        x, wt, out = sets[next(turn) % copies]
        torch.mm(x, wt, out=out)

    return time_calls(call, Clock(device), budget)


def attention(shape: AttentionShape, precision: str, device: torch.device, budget: Budget) -> list[float]:
    """Causal SDPA forward and backward (flash where the device has it), grouped-query as the model."""
    dtype = DTYPES[precision]
    q = torch.randn(shape.batch, shape.heads, shape.seq_len, shape.head_dim, device=device, dtype=dtype,
                    requires_grad=True)
    k = torch.randn(shape.batch, shape.kv_heads, shape.seq_len, shape.head_dim, device=device, dtype=dtype,
                    requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    grad = torch.randn(shape.batch, shape.heads, shape.seq_len, shape.head_dim, device=device, dtype=dtype)
    gqa = shape.kv_heads != shape.heads

    def step() -> None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        torch.autograd.grad(out, (q, k, v), grad)

    return time_calls(step, Clock(device), budget)


# A copy and an add write fresh tensors, as norms and residual adds do; the in-place add updates
# its operand, as the optimizer step does (on a CPU it skips the read of each destination line
# before the write, write-allocate); the tanh GeLU is the activation function. The two fills
# write a buffer written before and one allocated for the call: their difference is what a
# buffer allocated anew costs (page faults on a CPU, nothing under CUDA's caching allocator).
MEMORY_OPS = ("copy", "add", "add_in_place", "gelu", "fill", "fill_fresh")
# Tensors read + written per element.
MEMORY_TRAFFIC = {"copy": 2, "add": 3, "add_in_place": 3, "gelu": 2, "fill": 1, "fill_fresh": 1}


def memory(op: str, nbytes: int, precision: str, device: torch.device, budget: Budget) -> tuple[list[float], int]:
    """A copy or an element-wise op (:data:`MEMORY_OPS`) over ``nbytes`` tensors; returns times and
    bytes moved per call."""
    dtype = DTYPES[precision]
    numel = nbytes // torch.tensor([], dtype=dtype).element_size()
    a = torch.empty(numel, device=device, dtype=dtype).uniform_(-1, 1)
    out = torch.empty_like(a)  # touched by the warm-up: no page faults in the timed calls
    if op == "copy":
        fn = lambda: out.copy_(a)  # noqa: E731
    elif op == "add":
        b = torch.empty_like(a).uniform_(-1, 1)
        fn = lambda: torch.add(a, b, out=out)  # noqa: E731
    elif op == "add_in_place":
        b = torch.empty_like(a).uniform_(-1e-6, 1e-6)  # small: the values stay bounded over many calls
        fn = lambda: a.add_(b)  # noqa: E731
    elif op == "gelu":
        # The tanh form, as the model runs it (Megatron's bias_gelu; calibration/gpt.py): on a
        # CPU it is compute-bound, 4-5x slower than the erf form, whose figure would not apply.
        fn = lambda: torch.ops.aten.gelu.out(a, approximate="tanh", out=out)  # noqa: E731
    elif op == "fill":
        fn = lambda: out.fill_(1.0)  # noqa: E731
    elif op == "fill_fresh":
        fn = lambda: torch.empty(numel, device=device, dtype=dtype).fill_(1.0)  # noqa: E731
    else:
        raise ValueError(f"unknown memory benchmark {op!r}")
    times = time_calls(fn, Clock(device), budget)
    return times, MEMORY_TRAFFIC[op] * numel * a.element_size()


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "p2p")

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def collective(kind: str, group: Optional[dist.ProcessGroup], members: list[int], size_bytes: int,
               precision: str, device: torch.device, budget: Budget) -> tuple[list[float], int]:
    """One collective over ``group`` (``members`` are its global ranks), full buffer ``size_bytes``.

    Returns this rank's per-call times and the buffer size actually used (a multiple of
    the group size in elements). ``p2p`` sends from members 2i to 2i+1 at once. Every
    member must call this with the same arguments: the calls per sample are agreed on
    (the largest any member wants), and every sample starts at a barrier.
    """
    dtype = DTYPES[precision]
    n = len(members)
    element = torch.tensor([], dtype=dtype).element_size()
    numel = max(n, size_bytes // element // n * n)
    rank = dist.get_rank()
    index = members.index(rank)
    full = torch.ones(numel, device=device, dtype=dtype)
    shard = torch.ones(numel // n, device=device, dtype=dtype)
    if kind == "all_reduce":
        fn = lambda: dist.all_reduce(full, group=group)  # noqa: E731
    elif kind == "all_gather":
        fn = lambda: _all_gather(full, shard, group=group)  # noqa: E731
    elif kind == "reduce_scatter":
        fn = lambda: _reduce_scatter(shard, full, group=group)  # noqa: E731
    elif kind == "p2p":
        if index % 2 == 0 and index + 1 < n:
            peer = members[index + 1]
            fn = lambda: dist.send(full, dst=peer, group=group)  # noqa: E731
        elif index % 2 == 1:
            peer = members[index - 1]
            fn = lambda: dist.recv(full, src=peer, group=group)  # noqa: E731
        else:
            fn = lambda: None  # noqa: E731  (odd member out)
    else:
        raise ValueError(f"unknown collective {kind!r}")
    clock = Clock(device)
    for _ in range(budget.warmup):
        fn()
    wanted = torch.tensor([inner_count(fn, clock, budget)], device=device, dtype=torch.int64)
    dist.all_reduce(wanted, op=dist.ReduceOp.MAX, group=group)
    times = time_calls(fn, clock, Budget(0, budget.samples, budget.target_s, budget.max_inner), inner=int(wanted.item()),
                       before_sample=lambda: dist.barrier(group=group))
    return times, numel * element


def overlap(group: Optional[dist.ProcessGroup], size_bytes: int, shape: GemmShape, precision: str,
            device: torch.device, budget: Budget) -> list[float]:
    """Share of compute time a collective can run under, one value per sample.

    Times an all-reduce of ``size_bytes`` alone (t_c), a run of GEMMs lasting about as
    long alone (t_g), and the all-reduce launched asynchronously beside the same GEMMs
    (t_b); the overlap is (t_c + t_g − t_b) / min(t_c, t_g), clamped to [0, 1]: 1 when the
    two run side by side (NCCL on a GPU), 0 when they take turns on the same cores (gloo
    on a CPU). ``Performance.comm_overlap`` is its mean. Every member of ``group``
    calls this with the same arguments.
    """
    dtype = DTYPES[precision]
    element = torch.tensor([], dtype=dtype).element_size()
    buffer = torch.ones(max(1, size_bytes // element), device=device, dtype=dtype)
    x = torch.empty(shape.m, shape.k, device=device, dtype=dtype).uniform_(-1, 1)
    wt = torch.empty(shape.n, shape.k, device=device, dtype=dtype).uniform_(-1, 1).t()
    out = torch.empty(shape.m, shape.n, device=device, dtype=dtype)
    clock = Clock(device)

    def timed(fn: Callable[[], object]) -> float:
        dist.barrier(group=group)
        return clock.time(fn)

    def comm() -> None:
        dist.all_reduce(buffer, group=group)

    for _ in range(budget.warmup):
        comm()
        torch.mm(x, wt, out=out)
    t_comm = sorted(timed(comm) for _ in range(3))[1]
    t_one = sorted(timed(lambda: torch.mm(x, wt, out=out)) for _ in range(3))[1]
    calls = max(1, round(t_comm / max(t_one, 1e-7)))

    def gemms() -> None:
        for _ in range(calls):
            torch.mm(x, wt, out=out)

    def both() -> None:
        work = dist.all_reduce(buffer, group=group, async_op=True)
        gemms()
        work.wait()

    shares = []
    for _ in range(budget.samples):
        t_c, t_g, t_b = timed(comm), timed(gemms), timed(both)
        shares.append(min(1.0, max(0.0, (t_c + t_g - t_b) / min(t_c, t_g))))
    return shares
