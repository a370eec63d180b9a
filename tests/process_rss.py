"""A fresh CPU rank's resident set, measured: what `Overheads.cpu_process` and a CPU profile's
``gpu.cpu_process`` stand for (tests/test_cpu_process_memory.py, tests/test_calibration.py)."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

# A fresh rank as calibration/train.py starts one: torch imported, a gloo group of one, no model tensor yet.
RSS = """
import os, torch, torch.distributed as dist
# A file store, not a port: the suite's other workers start groups of their own beside this one.
dist.init_process_group("gloo", init_method="file://" + os.environ["STORE"], rank=0, world_size=1)
dist.barrier()
print(next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS")))
dist.destroy_process_group()
"""


def measured_rss(folder: Path) -> float:
    """Median resident set (bytes) of three fresh processes."""
    runs = []
    for run in range(3):
        out = subprocess.run([sys.executable, "-c", RSS], env={**os.environ,
                                                                 "STORE": str(folder / f"store{run}")},
                             capture_output=True, text=True, timeout=120, check=True)
        runs.append(float(out.stdout.split()[-1]))
    return statistics.median(runs)
