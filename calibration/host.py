"""What a profile must say about the machine it was measured on, for a later run to compare.

No torch here: `validate` reads these before it starts any rank.
"""

from __future__ import annotations

import os
import platform
from typing import Any, Optional

# A load average (1 min) past this share of the cores means other work shares them, and
# timings taken now describe a slower machine than the one profiled.
BUSY_SHARE = 0.5


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


def load_average() -> Optional[float]:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def machine_warnings(profiled: dict[str, Any], cpu: str, load: Optional[float], ncores: int,
                     device: str = "cpu") -> list[str]:
    """Why a measurement taken now may not describe the profiled machine, one line each."""
    warnings = []
    measured_on = profiled.get("cpu")
    if device == "cpu" and isinstance(measured_on, str) and measured_on != cpu:
        warnings.append(f"the profile was measured on another CPU ({measured_on}); this machine has {cpu}: "
                        "compare predicted and measured with care, or calibrate here")
    if device == "cpu" and load is not None and load > BUSY_SHARE * ncores:
        warnings.append(f"this machine is busy (load average {load:.2f} on {ncores} cores): other work shares "
                        "the cores and the measured steps will be slower than the profile predicts")
    return warnings
