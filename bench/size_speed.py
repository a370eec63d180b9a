"""Time of `planner.size` in-process, median of runs each in a fresh process.

    python bench/size_speed.py [RUNS] [WORD ...]   (only the cases whose name has a WORD, e.g. front)

Each run starts a new Python process, imports the planner and OR-tools (not timed: they are
the same for every command), then times one `planner.size(...)` call with cold caches, as a
user's first sizing in a session has them. The cases: Llama 3 70B at the case's 4M-token
batch on up to 16,384 H100s (2,048 node counts), for 15T tokens by a 60-day deadline (the
least GPU-hours that meets it), within the 16,384 GPUs (the shortest time), and the
repo's two-type example (H100 or B200, the least cost); and with neither a deadline nor a
budget (the front of days against spend and its knee), Llama 3.1 405B on up to 16,384 H100s
for 15.6T tokens, and the two 70B cases. Each run also says where its time
went: plan's search on the cluster sizes it visited, the CP-SAT solves, and the rest (the
work bound, the estimates of the answers). Timings on a shared machine are noisy: report
medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEVENTY_B = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16384},
             "training": {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16", "optimizer": "adamw"},
             "search": {"target": "megatron"}}
CASES = {
    "70B on up to 16,384 H100, 15T tokens by 60 days": (SEVENTY_B, {"tokens": "15T", "deadline": "60d"}),
    "70B on up to 16,384 H100, 15T tokens, fastest": (SEVENTY_B, {"tokens": "15T", "max_gpus": 16384}),
    "70B, H100 or B200 (examples/llama3-70b-15t-size.yaml), by 60 days":
        (str(ROOT / "examples" / "llama3-70b-15t-size.yaml"), {"tokens": "15T", "deadline": "60d"}),
    "405B on up to 16,384 H100 (examples/llama3.1-405b-16384-h100-plan.yaml), 15.6T tokens, the front":
        (str(ROOT / "examples" / "llama3.1-405b-16384-h100-plan.yaml"), {"tokens": "15.6T"}),
    "70B on up to 16,384 H100, 15T tokens, the front": (SEVENTY_B, {"tokens": "15T"}),
    "70B, H100 or B200 (examples/llama3-70b-15t-size.yaml), the front":
        (str(ROOT / "examples" / "llama3-70b-15t-size.yaml"), {"tokens": "15T"}),
}


def one(name: str) -> dict:
    """One timed sizing in this process, with its parts."""
    import importlib

    sizing = importlib.import_module("planner.size")  # the module: `planner.size` is the function
    solver = importlib.import_module("planner.size_solver")  # OR-tools loads here, untimed

    spent = {"search": 0.0, "solver": 0.0}

    def timed(part, function):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - start
        return wrapper

    sizing.layout_table = timed("search", sizing.layout_table)
    solver.SizeModel.solve = timed("solver", solver.SizeModel.solve)
    case, args = CASES[name]
    start = time.perf_counter()
    result = sizing.size(case, **args)
    total = time.perf_counter() - start
    return {"total": total, **spent, "gpus": result.best.gpus, "gpu": result.best.option.gpu.name,
            "days": result.best.days, "sizes": result.sizes, "searched": result.sizes_searched,
            "front": [f"{c.gpus} {c.option.gpu.name}" for c in result.front]}


def main() -> None:
    # argparse: "--help" was int()'s traceback
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("words", nargs="*", metavar="[RUNS] WORD",
                        help="runs of each case, each in a fresh process (a first number; default 7), then "
                             "words: only the cases whose name has one")
    parser.add_argument("--one", metavar="CASE", help=argparse.SUPPRESS)  # one timed run, in the child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    words = list(args.words)
    runs = int(words.pop(0)) if words and words[0].isdigit() else 7
    chosen = [name for name in CASES if not words or any(word in name for word in words)]
    for name in chosen:
        results = []
        for _ in range(runs):
            done = subprocess.run([sys.executable, __file__, "--one", name], cwd=ROOT, check=True,
                                  capture_output=True, text=True)
            results.append(json.loads(done.stdout))
        totals = [r["total"] for r in results]
        middle = sorted(results, key=lambda r: r["total"])[len(results) // 2]
        front = f" (the knee; front: {', '.join(middle['front'])})" if middle["front"] else ""
        print(f"{name}: median {statistics.median(totals):.2f} s (min {min(totals):.2f}, max {max(totals):.2f}, "
              f"{runs} runs) -> {middle['gpus']} {middle['gpu']}, {middle['days']:.1f} days{front}; "
              f"{middle['searched']} of {middle['sizes']} sizes searched; the median run: search "
              f"{middle['search']:.2f} s, solver {middle['solver']:.3f} s, rest "
              f"{middle['total'] - middle['search'] - middle['solver']:.2f} s")


if __name__ == "__main__":
    main()
