"""Wall-clock time of `layout-planner plan`, process start included, median of repeated runs.

    python bench/plan_speed.py [RUNS]

Runs each example plan case as a fresh process (the way a user runs it) and prints the
median and spread. Timings on a shared machine are noisy: report medians.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ["examples/llama3-70b-1024-h100-plan.yaml", "examples/llama3.1-405b-16384-h100-plan.yaml",
         "examples/mixtral-8x7b-64-h100-plan.yaml", "examples/deepseek-v3-2048-h800.yaml"]


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    for case in CASES:
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "planner", "plan", case, "--json"], cwd=ROOT, check=True,
                           stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
        print(f"{case}: median {statistics.median(times):.2f} s (min {min(times):.2f}, max {max(times):.2f}, "
              f"{runs} runs)")


if __name__ == "__main__":
    main()
