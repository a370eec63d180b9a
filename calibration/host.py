"""What a profile must say about the machine it was measured on, for a later run to compare.

No torch here: `validate` reads these before it starts any rank.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from typing import Any, Optional

# Other processes keeping more than this share of the cores busy, measured just before a run:
# calibrate and validate refuse to measure (or, asked to, warn). A quarter of a 2-core machine is
# half a core: enough to move a compute-bound benchmark by tens of percent.
OTHERS_BUSY_SHARE = 0.25
# A GPU that others drive before any rank starts: a kernel running in more than this share of
# nvidia-smi's samples, or more than this much of its memory already taken. The memory allows for
# this process's own CUDA context (a few hundred MiB with lazy module loading): validate asks
# torch for the GPU's name first.
OTHERS_GPU_UTILISATION = 0.10
OTHERS_GPU_MEMORY_MIB = 1024


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module says."""
    fallback = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), fallback)
    except OSError:
        return fallback


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def device_mismatch(profiled: dict[str, Any], cpu: str, device: str, gpu: Optional[str]) -> Optional[str]:
    """Why this machine is not the kind the profile was measured on (another CPU model for a CPU
    profile; no CUDA, or another GPU model, for a GPU one), or None when it is."""
    if device == "cuda":
        measured_on = profiled.get("gpu")
        if gpu is None:
            return f"was measured on GPUs ({measured_on or 'NCCL'}), and this machine has no CUDA device"
        if isinstance(measured_on, str) and measured_on != gpu:
            return f"was measured on {measured_on}; this machine has {gpu}: calibrate here"
        return None
    measured_on = profiled.get("cpu")
    if isinstance(measured_on, str) and measured_on != cpu:
        return f"was measured on another CPU ({measured_on}); this machine has {cpu}: calibrate here"
    return None


def local_gpu() -> Optional[str]:
    """The first CUDA device's name, or None without one (or without torch)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def local_gpu_count() -> int:
    """CUDA devices this process sees (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resident_bytes() -> Optional[float]:
    """This process's resident set in bytes (``VmRSS`` in /proc/self/status, which the kernel gives in kB),
    or None where there is none (not Linux). What a CPU rank holds outside its tensors is this, taken after
    its process group is up and before its first tensor (``Overheads.cpu_process``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cpu_times() -> Optional[tuple[float, float]]:
    """(busy, total) jiffies of all CPUs since boot (/proc/stat), or None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    total = sum(fields[:8])  # user … steal; guest time is inside user already
    return total - idle, total


def _own_jiffies() -> float:
    """CPU time this process has used, in jiffies (its children run only after the sample)."""
    t = os.times()
    return (t.user + t.system) * os.sysconf("SC_CLK_TCK")


def other_cpu_share(interval_s: float = 0.5) -> Optional[float]:
    """Share of the machine's CPU time other processes used over ``interval_s`` (0 idle, 1 every
    core busy): the busy time of all CPUs less this process's own, over the time that passed."""
    import time

    before, own_before = _cpu_times(), _own_jiffies()
    if before is None:
        return None
    time.sleep(interval_s)
    after, own_after = _cpu_times(), _own_jiffies()
    if after is None or after[1] <= before[1]:
        return None
    busy = (after[0] - before[0]) - (own_after - own_before)
    return min(1.0, max(0.0, busy / (after[1] - before[1])))


def busy_reason(share: Optional[float]) -> Optional[str]:
    """Why measuring now would describe a slower machine, or None when the others leave it alone."""
    if share is None or share <= OTHERS_BUSY_SHARE:
        return None
    return (f"other processes use {share:.0%} of this machine's CPU time (more than {OTHERS_BUSY_SHARE:.0%}): "
            "timings taken now describe a slower machine; stop them, or pass --allow-busy to measure anyway")


def measuring_anyway(reason: str) -> str:
    """A refusal's reason (:func:`busy_reason`, :func:`gpu_busy_reason`) as the warning given under
    --allow-busy: its last clause, the advice to pass --allow-busy, replaced by what is done."""
    return reason.rsplit("; ", 1)[0] + "; measuring anyway (--allow-busy)"


def visible_gpus(count: int) -> list[str]:
    """nvidia-smi's ids of the first ``count`` GPUs this process's ranks use: CUDA_VISIBLE_DEVICES
    renumbers them (indices or UUIDs, in order), and nvidia-smi takes either."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in visible.split(",") if x.strip()] if visible is not None else \
        [str(i) for i in range(count)]
    return ids[:count]


def gpu_use(count: int, samples: int = 5, interval_s: float = 0.1, smi: str = "nvidia-smi") \
        -> Optional[dict[str, float]]:
    """The most any of the first ``count`` GPUs was used over ``samples`` nvidia-smi readings,
    ``interval_s`` apart, before any rank starts (so all of it is other processes'): utilisation
    (the share of the sample period a kernel ran) and memory in use, in MiB. None where
    nvidia-smi is missing or fails: then nothing can be said."""
    ids = visible_gpus(count)
    if not ids:
        return None
    command = [smi, "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", "-i", ",".join(ids)]
    utilisation = memory = 0.0
    for i in range(samples):
        if i:
            time.sleep(interval_s)
        try:
            run = subprocess.run(command, capture_output=True, text=True, timeout=10)
            readings = [[float(x) for x in line.split(",")] for line in run.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return None
        if run.returncode != 0 or not readings or any(len(r) != 2 for r in readings):
            return None
        utilisation = max(utilisation, *(r[0] / 100 for r in readings))
        memory = max(memory, *(r[1] for r in readings))
    return {"utilisation": utilisation, "memory_used_mib": memory}


def gpu_busy_reason(use: Optional[dict[str, float]]) -> Optional[str]:
    """Why the GPUs are not free for a measurement (:func:`gpu_use`), or None when they are."""
    if use is None:
        return None
    if use["utilisation"] <= OTHERS_GPU_UTILISATION and use["memory_used_mib"] <= OTHERS_GPU_MEMORY_MIB:
        return None
    return (f"other processes use these GPUs (utilisation up to {use['utilisation']:.0%}, {use['memory_used_mib']:.0f} "
            f"MiB of memory in use; more than {OTHERS_GPU_UTILISATION:.0%} or {OTHERS_GPU_MEMORY_MIB} MiB): timings "
            "taken now describe slower GPUs; stop them, or pass --allow-busy to measure anyway")
