"""Wall-clock time of `layout-planner plan`, process start included, median of repeated runs.

    python bench/plan_speed.py [RUNS] [--no-engine] [CASE ...]

Runs each example plan case (or each CASE given) as a fresh process, the way a user runs it, and
prints the median and spread of its wall clock, with the median CPU time the process took (user
+ system, which other work on a shared machine disturbs less than the wall clock). With
``--no-engine``, each case also runs with no engine named (its training.engine and search.target
taken out), which plans every engine `plan` decides between and picks among them. Two floors
come first: the CLI's imports (``python -c 'import planner.cli'``) and a plan whose search scores
one layout (one GPU, one sequence: what every plan pays before its search). Each command runs
once untimed first, with bytecode writing on whatever PYTHONDONTWRITEBYTECODE says, so that the
timed runs load compiled modules, as an installed package does. Timings on a shared machine are
noisy: report medians.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CASES = ["examples/llama3-70b-1024-h100-plan.yaml", "examples/llama3.1-405b-16384-h100-plan.yaml",
         "examples/mixtral-8x7b-64-h100-plan.yaml", "examples/deepseek-v3-2048-h800.yaml"]
# A plan whose search scores one layout: the fixed cost of a plan run.
ONE_LAYOUT = """model: {preset: llama3-8b}
cluster: {gpu: h100-sxm-80gb, num_gpus: 1}
training: {global_batch_size: 1, seq_len: 1024, precision: bf16}
search: {target: megatron}
"""


# The timed processes write and read compiled bytecode (__pycache__), as an installed package's do.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(command: list[str], runs: int) -> tuple[list[float], list[float]]:
    """Wall clock and CPU time (user + system) of ``runs`` runs of ``command``, each a fresh process,
    after one untimed run."""
    walls, cpus = [], []
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return walls, cpus


def report(name: str, walls: list[float], cpus: list[float]) -> None:
    print(f"{name}: median {statistics.median(walls):.2f} s (min {min(walls):.2f}, max {max(walls):.2f}, "
          f"{len(walls)} runs), CPU {statistics.median(cpus):.2f} s")


def without_engine(case: str, folder: str) -> str:
    """A copy of the case with no engine named, in ``folder``."""
    data = yaml.safe_load((ROOT / case).read_text())
    data.get("training", {}).pop("engine", None)
    data.get("search", {}).pop("target", None)
    path = os.path.join(folder, f"{Path(case).stem}-no-engine.yaml")
    Path(path).write_text(yaml.safe_dump(data))
    return path


def main() -> None:
    # argparse: "--help" was timed as a case
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("words", nargs="*", metavar="[RUNS] CASE",
                        help="timed runs of each command (a first number; default 7), then case files "
                             "(default: the example plans)")
    parser.add_argument("--no-engine", action="store_true", help="each case also with no engine named")
    args = parser.parse_intermixed_args()
    words = list(args.words)
    runs = int(words.pop(0)) if words and words[0].isdigit() else 7
    no_engine, cases = args.no_engine, words or CASES
    report("import planner.cli", *timed([sys.executable, "-c", "import planner.cli"], runs))
    with tempfile.TemporaryDirectory() as folder:
        one = os.path.join(folder, "one-layout.yaml")
        Path(one).write_text(ONE_LAYOUT)
        report("plan, one layout", *timed([sys.executable, "-m", "planner", "plan", one, "--json"], runs))
        for case in cases:
            report(case, *timed([sys.executable, "-m", "planner", "plan", case, "--json"], runs))
            if no_engine:
                plain = without_engine(case, folder)
                report(f"{case}, no engine named",
                       *timed([sys.executable, "-m", "planner", "plan", plain, "--json"], runs))


if __name__ == "__main__":
    main()
