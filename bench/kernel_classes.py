"""Where one rank's step goes, by kernel class: the cost model against torch.profiler.

    python bench/kernel_classes.py [--profile PROFILE.yaml] [--layout one-mbs2-ga4] [--repeats 5]

The validation loop measures whole steps; this splits one into the classes the cost model
prices at different rates, so a rate that is wrong shows where it is wrong. It runs one of
``bench/validate_loop.py``'s one-rank layouts in this process (the loop's GPT, its optimizer,
its thread count), times ``--repeats`` micro-batches, each followed by an optimizer step,
under ``torch.profiler``, and sums each operator's self time into:

- GEMMs (``mm``, ``addmm``, ``bmm``): the layers' linear GEMMs and the LM head;
- attention (scaled dot-product attention, forward and backward);
- the activation function (GeLU or SiLU, forward and backward):
  ``kernels.transcendental_time``, ``Performance.transcendental_efficiency``;
- the optimizer step (the fused kernel): ``kernels.in_place_time``, ``Performance.in_place_efficiency``;
- the loss (``log_softmax`` and its backward, ``nll_loss``): ``layer_time.cross_entropy_time``;
- everything else: the model's other element-wise kernels (norms, residual adds:
  ``layer_time.elementwise_bytes``). On a CPU this class also holds what the model leaves out
  because a GPU does it in microseconds: zero-filling freshly allocated gradients (the
  embedding's, the logits'), which a CPU without a caching allocator pays in page faults, and
  the bias gradients' reductions.

The model's figure for each is printed beside the median measured one. The host's profile is
the validation loop's (``bench/out/profile-<host>.yaml``); run that script first to make one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from validate_loop import HOST_PROFILE, LAYOUTS, case_for  # noqa: E402

CLASSES = ("gemm", "attention", "activation function", "optimizer", "loss", "other element-wise")


def operator_class(name: str) -> str:
    """The cost model's class of a profiled ATen operator."""
    if name in ("aten::mm", "aten::addmm", "aten::bmm"):
        return "gemm"
    if "attention" in name or "flash" in name:
        return "attention"
    if "gelu" in name or "silu" in name:
        return "activation function"
    if "_fused_adam" in name or "_fused_sgd" in name or "_foreach_" in name:
        return "optimizer"
    if "log_softmax" in name or "nll_loss" in name:
        return "loss"
    return "other element-wise"


def predicted(job) -> dict[str, float]:
    """The cost model's time per micro-batch and optimizer step for each class but GEMMs and
    attention (whose rates calibration fits to their own benchmarks)."""
    from cost_models.kernels import elementwise_time, transcendental_time
    from cost_models.layer_time import activation_function_bytes, cross_entropy_time, elementwise_bytes
    from cost_models.optimizer_time import optimizer_time

    model, training, lay, gpu = job.model, job.training, job.layout, job.cluster.gpu
    tokens = lay.micro_batch_size * training.seq_len
    passes = model.num_layers * 3  # forward, and backward at twice its traffic
    return {
        "activation function": passes * transcendental_time(
            activation_function_bytes(model, training, lay, tokens), gpu),
        "optimizer": optimizer_time(job, 0),
        "loss": cross_entropy_time(tokens * model.vocab_size, training, gpu),
        "other element-wise": passes * elementwise_time(elementwise_bytes(model, training, lay, tokens), gpu),
    }


def measured(job, repeats: int, threads: int) -> dict[str, float]:
    """Median self time per class of ``repeats`` micro-batches, each with its optimizer step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from calibration.gpt import GPT, GPTConfig
    from calibration.train import _optimizer, run_spec

    spec = run_spec(job, steps=1, warmup=0, threads=threads)
    torch.set_num_threads(spec.threads)
    torch.manual_seed(0)
    model = GPT(GPTConfig(**spec.config)).train()
    optimizer = _optimizer(spec.optimizer, model.parameters())
    ids = torch.randint(job.model.vocab_size, (spec.micro_batch_size, spec.seq_len))
    targets = ids.roll(-1, -1)

    def one() -> None:
        model(ids, targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):  # warm-up: the allocator, the optimizer's states
        one()
    samples: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            one()
        totals: dict[str, float] = defaultdict(float)
        for event in prof.key_averages():
            totals[operator_class(event.key)] += event.self_cpu_time_total / 1e6
        for name in CLASSES:
            samples[name].append(totals[name])
    return {name: statistics.median(samples[name]) for name in CLASSES}


def main(argv=None) -> int:
    from calibration.validate import _threads, load_with_profile, profiled_machine
    from planner.errors import CaseError

    one_rank = [name for name, (_, gpus, *_) in LAYOUTS.items() if gpus == 1]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", type=Path, default=HOST_PROFILE)
    parser.add_argument("--layout", choices=one_rank, default=one_rank[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if not args.profile.exists():
        print(f"error: profile {args.profile} not found (run bench/validate_loop.py or `layout-planner "
              f"calibrate` first)", file=sys.stderr)
        return 2
    case = case_for(args.layout, args.profile.resolve())
    try:
        job = load_with_profile(case, args.profile).job()
    except CaseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    model_s = predicted(job)
    threads = _threads(profiled_machine(case, args.profile)) or 1
    measured_s = measured(job, args.repeats, threads)
    print(f"{args.layout}: one micro-batch and optimizer step, median of {args.repeats} (profile {args.profile})")
    print(f"{'class':22} {'model s':>9} {'measured s':>11} {'ratio':>7}")
    for name in CLASSES:
        model = model_s.get(name)
        ratio = f"{model / measured_s[name]:7.2f}" if model is not None and measured_s[name] else ""
        shown = f"{model:9.4f}" if model is not None else f"{'':>9}"
        print(f"{name:22} {shown} {measured_s[name]:11.4f} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
