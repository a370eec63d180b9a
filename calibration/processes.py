"""Process-tree helpers for the run supervisors: is a process alive, what runs below one, stop them all.

Linux ``/proc`` where there is one. No torch here: the launcher and every rank's light
supervisor import it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from planner.errors import interrupts_deferred

# SIGKILL is delivered at once, but a process takes a moment to end (its memory freed: tens of
# milliseconds for a rank holding torch, on a loaded machine); kill_all waits this long at most.
GONE_S = 10.0


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie (ended, not yet reaped by its parent) has ended."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # someone else's process: it exists
            return True
        return True


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _send(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_all(process: subprocess.Popen) -> None:
    """SIGKILL ``process`` (the leader of its own session), its group and every process below it.

    torchrun starts each rank in a session of its own, which a signal to torchrun's group
    misses, so the tree is walked. Everything found is frozen (SIGSTOP) first, until a walk
    finds nothing new: a process that is still running could start a child after the walk,
    and that child would outlive the run. Killing before the parents die matters too: an
    orphan is re-parented away from the tree and no walk finds it again. It returns when every
    process it killed has ended. An interrupt meanwhile waits for it (``interrupts_deferred``): cut
    short between the freeze and the kill, the tree would stay frozen for good.
    """
    with interrupts_deferred():
        _freeze_and_kill(process)


def _freeze_and_kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        pass
    frozen: set[int] = set()
    while True:
        new = descendants(process.pid) - frozen  # a frozen parent keeps its children in the tree
        if not new:
            break
        _send(new, signal.SIGSTOP)
        frozen |= new
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _send(frozen, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + GONE_S  # so that no rank still runs when the caller says the run stopped
    while any(alive(pid) for pid in frozen) and time.monotonic() < deadline:
        time.sleep(0.01)
