"""Real training steps of :mod:`calibration.gpt` for one layout: what `validate` measures.

One rank per data-parallel replica, each a ``torch.distributed.run`` process. On CPUs:
the gloo backend, with ``torch.set_num_threads(max(1, cpu_count // dp))``, or the profile's
``machine.threads_per_rank`` when it has one (the profiled "GPU" is a rank with that many
threads; a run with more would be faster than the device the prediction describes). On
GPUs (``device: cuda``, chosen when the profile was measured with NCCL): one GPU per rank,
NCCL, fp32 (TF32 GEMMs) or bf16 (autocast for DDP, FSDP2's mixed-precision policy for
ZeRO-3; fp32 master weights and gradients either way):

- ``zero_stage: 0``: ``DistributedDataParallel``; gradients are all-reduced once per
  optimizer step, during the backward pass of the last micro-batch (``no_sync`` for
  the others), as the step-time model assumes.
- ``zero_stage: 3``: FSDP2 (``torch.distributed.fsdp.fully_shard``), one unit per
  transformer layer and one for the rest (embeddings, final norm, LM head); weights
  are gathered for every micro-batch's forward and backward and gradients
  reduce-scattered after every micro-batch, as the model's ZeRO-3 term assumes.
- Gradient accumulation: ``global_batch_size / (micro_batch_size · dp)`` micro-batches
  per step, the loss scaled by its inverse.
- Recomputation: ``calibration.gpt``'s ``full`` (whole layers) and ``selective`` (the
  attention core), both ``torch.utils.checkpoint``.
- Optimizer: ``torch.optim.Adam`` / ``AdamW`` with ``fused=True`` (one pass over
  weights, gradients and the two fp32 moments, like Apex's and Megatron's fused
  Adam), or SGD with momentum; all state fp32.

What is measured, on rank 0:

- the wall time of each optimizer step, between two barriers (all ranks have
  finished the previous step and this one), of which the optimizer step itself: host
  clock marks on a CPU, CUDA events on the compute stream on a GPU;
- on a GPU, the peak of ``torch.cuda.max_memory_allocated`` over the timed steps;
- the bytes one micro-batch's forward saves for backward, through
  ``torch.autograd.graph.saved_tensors_hooks`` (as ``tests/test_activations_torch.py``
  does): each storage once, leaving out parameters and buffers (model state) and the
  token ids and targets (the batch). Taken after the timed steps, so it cannot
  disturb them.

Tensor, pipeline and context parallelism, ZeRO 1/2, partial recomputation, fp16, fp8,
and bf16 on a CPU are refused with :class:`Unsupported`: this loop does not implement them.

The parent side (:func:`run_spec`, :func:`launch`) imports no torch; it runs the ranks
through :func:`calibration.supervisor.run_ranks`, the supervisor `calibrate` uses too. Each
rank's :func:`work` (under :mod:`calibration.run`) imports torch and reports its stage to
:class:`calibration.progress.RankProgress` (set-up, building the model, each warm-up and timed
step, the activation measurement), so a rank that fails or hangs is named with its stage.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .supervisor import RunFailed, run_folder, run_ranks

if TYPE_CHECKING:
    from cost_models.specs import Job

    from .progress import RankProgress

OPTIMIZERS = ("adam", "adamw", "sgd")
SGD_MOMENTUM = 0.9


class Unsupported(ValueError):
    """A case this CPU loop cannot run; ``key`` names the case-file key (``layout.tp``)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@dataclass(frozen=True)
class RunSpec:
    """Everything a worker needs: the model config, the layout as run, and how long to measure."""

    config: dict  # calibration.gpt.GPTConfig fields
    dp: int
    micro_batch_size: int
    grad_accum: int
    seq_len: int
    zero_stage: int  # 0 (DDP) or 3 (FSDP2)
    optimizer: str
    threads: int  # torch threads per rank
    steps: int  # timed steps
    warmup: int  # untimed steps first
    seed: int = 0
    device: str = "cpu"  # "cpu" (gloo) or "cuda" (NCCL, one GPU per rank)
    precision: str = "fp32"  # "fp32", or "bf16" on cuda


@dataclass(frozen=True)
class Measurement:
    """What rank 0 saw: per-step wall times and the bytes one micro-batch's forward saved."""

    step_times_s: tuple[float, ...]  # timed steps only
    optimizer_times_s: tuple[float, ...]  # of which optimizer.step, zero_grad and the closing barrier
    warmup_times_s: tuple[float, ...]
    activation_bytes: int
    losses: tuple[float, ...]  # rank 0's loss per step (warm-up included), for sanity
    threads: int
    torch_version: str
    extra: dict = field(default_factory=dict)  # microbatch_times_s: forward + backward of each, per timed step
    peak_memory_bytes: Optional[int] = None  # torch.cuda.max_memory_allocated over the timed steps (GPU only)

    @property
    def step_time_s(self) -> float:
        """Median over the timed steps."""
        return statistics.median(self.step_times_s)

    @property
    def optimizer_time_s(self) -> float:
        return statistics.median(self.optimizer_times_s)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["step_time_s"] = self.step_time_s
        data["optimizer_time_s"] = self.optimizer_time_s
        return data


# --------------------------------------------------------------------------- parent side


def threads_per_rank(dp: int, cpu_count: Optional[int] = None) -> int:
    """Each rank gets an equal share of the machine's cores."""
    return max(1, (cpu_count or os.cpu_count() or 1) // dp)


DEVICES = ("cpu", "cuda")


def run_spec(job: "Job", *, steps: int = 5, warmup: int = 2, seed: int = 0,
             cpu_count: Optional[int] = None, threads: Optional[int] = None, device: str = "cpu") -> RunSpec:
    """The run of ``job``'s layout, or :class:`Unsupported` naming the key this loop cannot run.

    ``threads`` per rank defaults to an equal share of the cores. ``device`` "cuda" runs
    one rank per GPU with NCCL.
    """
    if device not in DEVICES:
        raise ValueError(f"device: expected one of {', '.join(DEVICES)}, got {device!r}")
    from .gpt_config import GPTConfig  # not .gpt: this process never needs torch

    model, training, lay = job.model, job.training, job.layout
    # The loop's GPT (calibration/gpt.py) is a dense decoder of multi-head or grouped-query
    # attention, h/a wide a head: a model it does not build would time another model.
    for key, built, what in (
            ("num_experts", not model.is_moe, "no mixture of experts"),
            ("attention_type", model.attention_type != "mla", "no multi-head latent attention"),
            ("head_dim", model.attention_type == "mla" or model.head_dim * model.num_attention_heads
             == model.hidden_size, "attention heads hidden_size / num_attention_heads wide"),
            ("mtp_layers", not model.mtp_layers, "no multi-token prediction modules"),
            # full causal attention in every layer: a window was priced, the loop ran none (0.36 against 0.61)
            ("sliding_window", not model.sliding_window, "full causal attention in every layer")):
        if not built:
            raise Unsupported(f"model.{key}", f"the validation loop builds a dense GPT with {what}, so it "
                                              f"cannot time this model; got {getattr(model, key)!r}")
    for key in ("tp", "pp", "cp"):
        if getattr(lay, key) != 1:
            raise Unsupported(f"layout.{key}", f"the CPU validation loop runs data parallelism only; "
                                               f"{key} must be 1, got {getattr(lay, key)}")
    # What the loop does not run, priced all the same, would time another job (offload's copies, a
    # loss chunked or compiled): refused, as the model features above.
    for key, runs in (("offload_optimizer", not lay.offload_optimizer), ("offload_params", not lay.offload_params),
                      ("offload_activations", not lay.offload_activations)):
        if not runs:
            raise Unsupported(f"layout.{key}", "the validation loop offloads nothing to the host; leave it out")
    if training.loss_chunk_count > 1:
        raise Unsupported("training.loss_chunks", "the validation loop computes the loss on the whole logits; "
                                                  "leave it out or give 1")
    if training.loss_compiled:
        raise Unsupported("training.compiled_loss", "the validation loop runs an eager loss; leave it out or give false")
    if lay.zero_stage not in (0, 3):
        raise Unsupported("layout.zero_stage", "the CPU validation loop runs ZeRO 0 (DDP) or 3 (FSDP2), "
                                               f"got {lay.zero_stage}")
    if lay.recompute_modules not in (None, ("core_attn",)):
        raise Unsupported("layout.recompute_modules", "the validation loop's selective recomputation checkpoints "
                                                      "the attention core; leave recompute_modules out or give "
                                                      "[core_attn]")
    if lay.recompute == "full" and lay.recompute_num_layers not in (None, model.num_layers):
        raise Unsupported("layout.recompute_num_layers", "the CPU validation loop recomputes every layer "
                                                         "under full recomputation; leave it out")
    if training.precision not in (("fp32", "bf16") if device == "cuda" else ("fp32",)):
        raise Unsupported("training.precision", "the validation loop trains in fp32" + (" or bf16" if device == "cuda"
                          else " on a CPU (CPU bf16 GEMMs are far slower than anything real)")
                          + f", got {training.precision}")
    if training.optimizer not in OPTIMIZERS:
        raise Unsupported("training.optimizer", f"expected one of {', '.join(OPTIMIZERS)}")
    if device == "cpu" and training.flash_attention and model.dropout > 0:
        raise Unsupported("model.dropout", "PyTorch's CPU flash attention has no dropout (it falls back to the "
                                           "math kernel, which keeps s×s scores); use dropout 0 or "
                                           "training.flash_attention: false")
    cpus = cpu_count or os.cpu_count() or 1
    if device == "cuda":  # one GPU per rank; torchrun's workers say so if there are too few
        cpus = max(cpus, lay.dp)
    if lay.dp > cpus:
        raise Unsupported("layout.dp", f"each rank needs a core of its own; this machine has {cpus}, got dp {lay.dp}")
    threads = threads_per_rank(lay.dp, cpus) if threads is None else threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1 or threads * lay.dp > cpus:
        raise Unsupported("layout.dp", f"{lay.dp} ranks × {threads!r} threads do not fit in this machine's "
                                       f"{cpus} cores")
    for name, value in (("steps", steps), ("warmup", warmup)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "steps" else 0):
            raise ValueError(f"{name}: expected a {'positive' if name == 'steps' else 'non-negative'} "
                             f"integer, got {value!r}")
    config = GPTConfig.from_model_spec(model, attention="sdpa" if training.flash_attention else "megatron",
                                       recompute=lay.recompute, max_seq_len=training.seq_len)
    return RunSpec(config=asdict(config), dp=lay.dp, micro_batch_size=lay.micro_batch_size,
                   grad_accum=job.grad_accum, seq_len=training.seq_len, zero_stage=lay.zero_stage,
                   optimizer=training.optimizer, threads=threads, steps=steps,
                   warmup=warmup, seed=seed, device=device, precision=training.precision)


def launch(spec: RunSpec, *, timeout_s: float = 600.0, stall_s: Optional[float] = None) -> Measurement:
    """Run ``spec`` in ``dp`` ranks and return rank 0's measurement; :class:`RunFailed`
    naming the rank and its stage when a rank fails, makes no progress for ``stall_s`` (the
    watchdog `calibrate` runs under), or when the run passes ``timeout_s``.
    An interrupt stops every rank. The run's folder (spec, result, the ranks' records,
    torchrun's files) is removed with it."""
    with run_folder("layout-planner-validate-") as workdir:
        spec_path, out_path = workdir / "spec.json", workdir / "measurement.json"
        spec_path.write_text(json.dumps(asdict(spec)))
        run_ranks(["calibration.train", str(spec_path), str(out_path)], spec.dp, workdir, name="training run",
                  stall_s=stall_s, deadline_s=timeout_s, threads=spec.threads)
        if not out_path.exists():
            raise RunFailed("training run failed: rank 0 wrote no measurement")
        data = json.loads(out_path.read_text())
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}  # JSON's values
    return Measurement(**fields)


# --------------------------------------------------------------------------- measuring


def saved_activation_bytes(module, forward, exclude: Sequence = ()) -> int:
    """Bytes of the tensors autograd saves for backward while ``forward()`` runs.

    Each storage is counted once (q, k and v are views of one QKV output). Left out:
    the storages of ``module``'s parameters and buffers as they are *when saved* (under
    FSDP2 a layer's parameters are the gathered, unsharded tensors while it runs), the
    16-bit copies autocast makes of them (:func:`_cast_of_parameter`: weights, which the
    model counts as such), and those of the tensors in ``exclude`` (token ids, targets).
    Sizes are read after the forward, with every saved tensor kept alive meanwhile so no
    address is reused.
    """
    import torch

    excluded = {_storage_ptr(t) for t in exclude}
    parameters = {id(p) for p in module.parameters()}
    saved: list = []

    def pack(t):
        state = {_storage_ptr(p) for p in (*module.parameters(), *module.buffers())}
        ptr = _storage_ptr(t)
        saved.append((t, ptr in state or ptr in excluded or _cast_of_parameter(t, parameters)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    counted: dict[Optional[int], int] = {}  # by storage address (_storage_ptr: None where it has none)
    state_ptrs = {_storage_ptr(t) for t, is_state in saved if is_state}
    for t, _ in saved:
        ptr = _storage_ptr(t)
        if ptr not in state_ptrs and ptr not in counted:
            counted[ptr] = t.untyped_storage().nbytes()
    del out
    return sum(counted.values())


def _cast_of_parameter(t, parameters: set[int], depth: int = 4) -> bool:
    """Whether ``t`` is (a view of) a dtype cast of a parameter: under autocast a GEMM saves
    the cached 16-bit copy of its weight (``ToCopyBackward0`` over the parameter's
    ``AccumulateGrad``), or a transpose of it."""
    fn = getattr(t, "grad_fn", None)
    for _ in range(depth):
        if fn is None:
            return False
        inputs = [f for f, _ in fn.next_functions if f is not None]
        if type(fn).__name__ == "ToCopyBackward0":
            return any(id(getattr(f, "variable", None)) in parameters for f in inputs)
        if len(inputs) != 1:  # not a view or cast of one tensor
            return False
        fn = inputs[0]
    return False


def _storage_ptr(t) -> Optional[int]:
    """Address of ``t``'s storage; a DTensor's local shard's; None where there is none
    (FSDP2 frees a resharded parameter's storage)."""
    local = getattr(t, "_local_tensor", None)  # DTensor
    try:
        return (t if local is None else local).untyped_storage().data_ptr()
    except RuntimeError:
        return None


def _optimizer(name: str, params, sharded: bool = False):
    import torch

    if name == "sgd":
        # Fused SGD has no DTensor sharding rule (aten._fused_sgd_), so FSDP2's sharded parameters
        # take the multi-tensor (foreach) kernels: the same one pass over each tensor list.
        kernels = {"foreach": True} if sharded else {"fused": True}
        return torch.optim.SGD(params, lr=1e-3, momentum=SGD_MOMENTUM, **kernels)
    cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    return cls(params, lr=1e-4, fused=True)


def work(argv: list[str], progress: "RankProgress") -> None:
    """One rank of the run: ``argv`` is ``[SPEC.json, OUT.json]``; rank 0 writes its measurement to OUT.json.

    Every wait on the other ranks (set-up, wrapping the model, barriers) is marked as a
    collective, so an error there is read as another rank's failure and a wait there is
    not taken for a hang; the stages say where a failing or hung rank was."""
    import contextlib

    import torch
    import torch.distributed as dist

    from .benchmarks import Clock
    from .gpt import GPT, GPTConfig

    spec_path, out_path = argv
    spec = RunSpec(**json.loads(Path(spec_path).read_text()))
    progress.step("start")
    torch.set_num_threads(spec.threads)
    cuda = spec.device == "cuda"
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 GEMMs in TF32, as the profile measured them
    else:
        device = torch.device("cpu")
    progress.step("init")
    with progress.comm():  # a rendezvous: its wait is for the other ranks
        dist.init_process_group(**({"backend": "nccl", "device_id": device} if cuda else {"backend": "gloo"}))
    rank = dist.get_rank()
    assert dist.get_world_size() == spec.dp, (dist.get_world_size(), spec.dp)
    bf16 = spec.precision == "bf16"

    progress.set_total(3 + spec.warmup + spec.steps + 2)  # start, init, build; the steps; activations, result
    progress.step("build", f"dp {spec.dp}, ZeRO {spec.zero_stage}")
    torch.manual_seed(spec.seed)  # the same initial weights on every rank
    config = GPTConfig(**spec.config)
    gpt = GPT(config).to(device).train()
    with progress.comm() if spec.dp > 1 else contextlib.nullcontext():  # DDP broadcasts the weights
        model, ddp = _wrap(gpt, spec, device)
    optimizer = _optimizer(spec.optimizer, model.parameters(), sharded=spec.zero_stage == 3)
    # DDP under bf16 autocasts its GEMMs; FSDP2's policy already computes in bf16.
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if bf16 and spec.zero_stage != 3 \
        else contextlib.nullcontext

    generator = torch.Generator().manual_seed(spec.seed + 1 + rank)  # each rank its own data
    shape = (spec.grad_accum, spec.micro_batch_size, spec.seq_len)
    ids = torch.randint(config.vocab_size, shape, generator=generator).to(device)
    targets = ids.roll(-1, dims=-1).contiguous()

    def barrier() -> None:
        with progress.comm():
            dist.barrier()

    def step() -> tuple[float, float, list[float], float]:
        barrier()
        clock = Clock(device)
        clock.mark()
        for i in range(spec.grad_accum):
            last = i == spec.grad_accum - 1
            sync = ddp.no_sync() if ddp is not None and not last else contextlib.nullcontext()
            with sync:
                with autocast():
                    loss = model(ids[i], targets[i]) / spec.grad_accum
                loss.backward()
            clock.mark()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        barrier()
        clock.mark()
        intervals = clock.intervals()
        return sum(intervals), intervals[-1], intervals[:-1], loss.item() * spec.grad_accum

    warmup, timed, optimizer_times, microbatch_times, losses = [], [], [], [], []
    peak_memory = None
    for n in range(spec.warmup + spec.steps):
        if n < spec.warmup:
            progress.step("warmup", f"step {n + 1}/{spec.warmup}")
        else:
            progress.step("train", f"step {n - spec.warmup + 1}/{spec.steps}")
        if cuda and n == spec.warmup:
            torch.cuda.reset_peak_memory_stats(device)
        total, opt, microbatches, loss = step()
        losses.append(loss)
        if n < spec.warmup:
            warmup.append(total)
        else:
            timed.append(total)
            optimizer_times.append(opt)
            microbatch_times.append(microbatches)
    if cuda:
        peak_memory = int(torch.cuda.max_memory_allocated(device))

    # One micro-batch's forward. DDP's inner module runs it without collectives (rank 0
    # alone); FSDP2 gathers weights for it, so every rank runs it.
    progress.step("activations", "one micro-batch's forward")
    activation_bytes = 0
    if spec.zero_stage == 3 or rank == 0:
        module = gpt
        with autocast():
            activation_bytes = saved_activation_bytes(module, lambda: module(ids[0], targets[0]),
                                                      exclude=(ids, targets))
    if rank == 0:
        progress.step("result")
        result = Measurement(step_times_s=tuple(timed), optimizer_times_s=tuple(optimizer_times),
                             warmup_times_s=tuple(warmup), activation_bytes=activation_bytes,
                             losses=tuple(losses), threads=torch.get_num_threads(),
                             torch_version=torch.__version__,
                             extra={"microbatch_times_s": microbatch_times}, peak_memory_bytes=peak_memory)
        Path(out_path).write_text(json.dumps(asdict(result)))
    barrier()
    dist.destroy_process_group()


def _wrap(gpt, spec: RunSpec, device):
    """The model as it trains, and its DDP wrapper (None without one): FSDP2 for ZeRO-3, DDP for dp > 1."""
    import torch

    if spec.zero_stage == 3:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # bf16: gathered weights in bf16, gradients reduced in fp32 (torchtitan's policy).
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if spec.precision == "bf16" else MixedPrecisionPolicy()
        for layer in gpt.layers:
            fully_shard(layer, mp_policy=policy)
        fully_shard(gpt, mp_policy=policy)
        return gpt, None
    if spec.dp > 1:
        from torch.nn.parallel import DistributedDataParallel

        # Gradients live in the all-reduce buckets (as Megatron's contiguous grad buffer): no copies.
        ddp = DistributedDataParallel(gpt, gradient_as_bucket_view=True,
                                      device_ids=[device.index] if device.type == "cuda" else None)
        return ddp, ddp
    return gpt, None
