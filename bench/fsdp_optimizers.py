"""Does the optimizer change FSDP2's micro-batches? SGD and Adam alternating in the same processes.

    python bench/fsdp_optimizers.py [--steps 12] [--pairs 2]

``bench/validate_loop.py``'s FSDP2 + SGD layout measured slower than its prediction more often
than FSDP2 + Adam (0.81–0.88 against 0.86–0.95). The cost model gives the two the same
micro-batches and different optimizer steps. Two separate runs minutes apart cannot tell an
optimizer's effect from this shared machine's drift, so this runs the loop's GPT (4 layers,
hidden 512, micro-batch 2, two micro-batches a step, fp32) under FSDP2 on two gloo ranks, with
SGD (momentum, foreach: fused SGD has no DTensor rule) and Adam (fused) over the same weights,
stepping them in turn. It prints, per optimizer, the median time of the two micro-batches that
follow its steps and of its step, for ``--pairs`` fresh pairs of processes. A difference between
the two within a pair beyond the min–max spread would be the optimizer's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rank_main(steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    sys.path.insert(0, str(ROOT))
    from calibration.gpt import GPT
    from calibration.gpt_config import GPTConfig

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    config = GPTConfig(num_layers=4, hidden_size=512, num_attention_heads=8, num_kv_heads=8, ffn_hidden_size=2048,
                       activation="gelu", vocab_size=8192, attention="sdpa", max_seq_len=256)
    gpt = GPT(config).train()
    for layer in gpt.layers:
        fully_shard(layer)
    fully_shard(gpt)
    optimizers = {"sgd": torch.optim.SGD(gpt.parameters(), lr=1e-3, momentum=0.9, foreach=True),
                  "adam": torch.optim.Adam(gpt.parameters(), lr=1e-4, fused=True)}
    ids = torch.randint(config.vocab_size, (2, 2, 256), generator=torch.Generator().manual_seed(dist.get_rank()))
    targets = ids.roll(-1, dims=-1).contiguous()
    microbatches: dict[str, list[float]] = {name: [] for name in optimizers}
    stepped: dict[str, list[float]] = {name: [] for name in optimizers}
    for k in range(steps):
        name = "sgd" if k % 2 == 0 else "adam"
        dist.barrier()
        start = time.perf_counter()
        for i in range(2):
            (gpt(ids[i], targets[i]) / 2).backward()
        middle = time.perf_counter()
        optimizers[name].step()
        optimizers[name].zero_grad(set_to_none=True)
        dist.barrier()
        if k >= 2:  # two warm-up steps, one of each
            microbatches["adam" if name == "sgd" else "sgd"].append(middle - start)  # after the other's step
            stepped[name].append(time.perf_counter() - middle)
    if dist.get_rank() == 0:
        for name in optimizers:
            print(f"{name:5s} two micro-batches {statistics.median(microbatches[name]):.3f} s "
                  f"(min {min(microbatches[name]):.3f}, max {max(microbatches[name]):.3f}); "
                  f"step {statistics.median(stepped[name]):.4f} s", flush=True)
    dist.destroy_process_group()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # one rank, under torchrun
    args = parser.parse_args(argv)
    if args.rank:
        rank_main(args.steps)
        return 0
    for pair in range(args.pairs):
        print(f"pair {pair + 1} of {args.pairs}:", flush=True)
        run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                              "--standalone", __file__, "--rank", "--steps", str(args.steps)],
                             cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if run.returncode:
            return run.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
