"""Per-rank progress files: how the supervisor watches the ranks and names the one that failed.

Every rank (a calibration worker or a training worker) writes ``rank<R>.json`` in the
run's work folder at each step (its step count, stage, whether it is waiting in a
collective, and any error); the light supervisor that torchrun starts for the rank
(``calibration.run``) writes ``rank<R>.exit.json`` with how the rank's worker ended.
Files are replaced atomically, so a reader never sees half of one. No torch here: the
launcher reads these files without importing it.

A fault can be injected for tests: ``LAYOUT_PLANNER_CALIBRATE_FAULT=RANK:STAGE:ACTION``
makes rank RANK ``exit`` (code 3), ``hang`` or ``raise`` at the first step of STAGE
(one of :data:`STAGES`), in `calibrate` and `validate` alike.
"""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

FAULT_ENV = "LAYOUT_PLANNER_CALIBRATE_FAULT"
FAULT_EXIT_CODE = 3
PEER_FAILURE_EXIT = 75  # a rank whose collective failed because of another rank (EX_TEMPFAIL)
STAGES = {
    "start": "start-up",
    "init": "process-group set-up",
    "gemm": "the GEMM benchmarks",
    "attention": "the attention benchmarks",
    "memory": "the memory-bandwidth benchmarks",
    "alone": "the single-rank benchmarks",
    "collectives": "the collective benchmarks",
    "overlap": "the overlap benchmark",
    "write": "writing the profile",
    # validate's training run (calibration.train)
    "build": "building the model",
    "warmup": "the warm-up steps",
    "train": "the timed steps",
    "activations": "measuring activations",
    "result": "writing the measurement",
}
# Stages of set-up, before a rank's first measured step: importing torch, the process group's
# rendezvous and building the model take seconds on a loaded host and minutes at scale, while a
# measured step takes a fraction of that; the watchdog allows them a start-up allowance of their own.
SETUP_STAGES = frozenset({"start", "init", "build"})


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def progress_path(workdir: Path, rank: int) -> Path:
    return Path(workdir) / f"rank{rank}.json"


def exit_path(workdir: Path, rank: int) -> Path:
    return Path(workdir) / f"rank{rank}.exit.json"


def write_exit(workdir: Path, rank: int, code: int, terminated: bool) -> None:
    """Written by the rank's supervisor: the worker's exit code, and whether the launcher stopped it."""
    _write_json(exit_path(workdir, rank), {"rank": rank, "code": code, "terminated": terminated,
                                           "time": time.time()})


class RankProgress:
    """The progress file of one rank, written by that rank."""

    def __init__(self, workdir: Path, rank: int, local_rank: int):
        self.workdir = Path(workdir)  # the run's folder: where rank 0 leaves its result
        self.path = progress_path(workdir, rank)
        self.rank = rank
        self.state: dict[str, Any] = {"rank": rank, "local_rank": local_rank, "pid": os.getpid(),
                                      "ppid": os.getppid(), "step": 0,
                                      "total": 0, "stage": "start", "label": "", "in_comm": False,
                                      "status": "running", "error": None, "time": time.time()}
        self._fault = self._parse_fault(os.environ.get(FAULT_ENV, ""))
        self._comm_failed = False
        self._write()

    def _parse_fault(self, text: str) -> Optional[tuple[str, str]]:
        parts = text.split(":")
        if len(parts) != 3 or not parts[0].isdigit() or int(parts[0]) != self.rank:
            return None
        return parts[1], parts[2]

    def _write(self) -> None:
        self.state["time"] = time.time()
        _write_json(self.path, self.state)

    def set_total(self, total: int) -> None:
        self.state["total"] = total
        self._write()

    def step(self, stage: str, label: str = "") -> None:
        """Start one measurement (or phase) of ``stage``."""
        if self._fault and self._fault[0] == stage:
            action, self._fault = self._fault[1], None
            self.state.update(stage=stage, label=label)  # where it happened; the step is not counted
            self._write()
            if action == "exit":
                os._exit(FAULT_EXIT_CODE)
            if action == "hang":
                while True:
                    time.sleep(3600)
            if action == "raise":
                raise RuntimeError(f"injected fault at {stage}")
        self.state.update(step=self.state["step"] + 1, stage=stage, label=label)
        self._write()

    @contextmanager
    def comm(self):
        """Marks a collective: an error inside one is another rank's doing, a wait inside one is not a hang."""
        self.state["in_comm"] = True
        self._write()
        try:
            yield
        except BaseException:
            self._comm_failed = True
            raise
        finally:  # written, so that a rank stuck in its own work afterwards is not taken for a waiting one
            self.state["in_comm"] = False
            self._write()

    def failed(self, error: BaseException) -> bool:
        """Record ``error``; True when it was raised inside a collective (a peer's failure)."""
        message = f"{type(error).__name__}: {error}".strip().splitlines()
        self.state.update(status="error", error=message[0][:300] if message else type(error).__name__,
                          comm_error=self._comm_failed)
        self._write()
        return self._comm_failed

    def done(self) -> None:
        self.state.update(status="done", in_comm=False)
        self._write()


def read_ranks(workdir: Path) -> dict[int, dict]:
    """Every rank's progress, with its ``exit`` record where its supervisor wrote one."""
    ranks: dict[int, dict] = {}
    for path in Path(workdir).glob("rank*.json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        rank = data.get("rank")
        if not isinstance(rank, int):
            continue
        entry = ranks.setdefault(rank, {})
        if path.name.endswith(".exit.json"):
            entry["exit"] = data
        else:
            entry.update(data)
    return ranks


def _where(info: dict) -> str:
    stage = STAGES.get(info.get("stage", ""), info.get("stage", "?"))
    label = info.get("label")
    return f"during {stage}" + (f" ({label})" if label else "")


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _cause(ranks: dict[int, dict]) -> Optional[str]:
    """The rank whose worker ended on its own (not stopped by the launcher) other than by a
    peer's failure; the earliest if several.

    Earliest by the worker's own last record, not by its exit record: a rank's supervisor
    notices its worker's end up to half a second late, so a peer whose socket broke when
    the first rank died, outside a collective the progress file marks, can have its exit
    recorded first. Its worker's record (the error it hit) still comes after the dead rank's
    last one.

    A worker that recorded an error of its own (outside a collective) is a cause even where its
    end was recorded as stopped, or not at all: it writes the error before it exits, and the
    launcher's teardown, set off by a peer that failed on the broken connection, can reach its
    supervisor in the moment between."""
    causes = []
    for rank, info in ranks.items():
        end = info.get("exit") or {}
        # RankProgress.failed writes comm_error beside every error: False is the worker's own.
        own_error = info.get("status") == "error" and info.get("error") and info.get("comm_error") is False \
            and end.get("code") != PEER_FAILURE_EXIT
        if not own_error and (not end or end.get("terminated") or end.get("code") in (0, PEER_FAILURE_EXIT)):
            continue
        causes.append((info.get("time", end.get("time", 0.0)), rank, info, end.get("code", 1)))
    if not causes:
        return None
    _, rank, info, code = min(causes)
    if info.get("status") == "error" and info.get("error"):
        return f"rank {rank} failed {_where(info)}: {info['error']}"
    how = f"was killed by {_signal_name(code)}" if code < 0 else f"exited with code {code}"
    return f"rank {rank} {how} {_where(info)}"


def _missing(ranks: dict[int, dict], expected: list[int]) -> list[int]:
    return [r for r in expected if r not in ranks or "step" not in ranks[r]]


def _running(ranks: dict[int, dict], expected: list[int]) -> dict[int, dict]:
    return {r: ranks[r] for r in expected if ranks[r].get("status") != "done"}


def _furthest_behind(running: dict[int, dict]) -> tuple[int, dict]:
    """The rank with the fewest steps, preferring one not waiting in a collective (the others wait for it)."""
    behind = min(info["step"] for info in running.values())
    return min(running.items(), key=lambda kv: (kv[1]["step"] != behind, bool(kv[1].get("in_comm")), kv[0]))


def diagnose(ranks: dict[int, dict], expected: list[int], stalled_s: Optional[float] = None) -> Optional[str]:
    """One line naming the rank that caused the failure, or None when the files name none.

    Root causes first: a rank whose worker ended on its own (not stopped by the
    launcher) other than by a peer's failure; the earliest if several. Otherwise a
    hang: the rank furthest behind, preferring one not waiting in a collective.
    ``stalled_s`` is set when the launcher's watchdog saw no progress for that long.
    """
    cause = _cause(ranks)
    if cause:
        return cause
    missing = _missing(ranks, expected)
    if missing:
        return f"rank {missing[0]} did not start" + (f" within {stalled_s:.0f} s" if stalled_s else "")
    running = _running(ranks, expected)
    if not running:
        return None
    rank, info = _furthest_behind(running)
    if all(i["step"] == info["step"] and i.get("in_comm") for i in running.values()) and len(running) > 1:
        names = ", ".join(str(r) for r in sorted(running))
        return f"ranks {names} hung in a collective {_where(info)}"
    if not stalled_s and len(expected) == 1:
        # One rank, ended unseen by the watchdog: no others timed out waiting for it, and its records name
        # no cause (a full disk stops them being written), so the launcher's own error is the one to give.
        return None
    waited = f"no progress for {stalled_s:.0f} s" if stalled_s else "the others timed out waiting for it"
    return f"rank {rank} hung {_where(info)}: {waited}"


def overdue(ranks: dict[int, dict], expected: list[int]) -> str:
    """One line for a run stopped at its deadline: the rank that failed if one did, else where
    the rank furthest behind was and how long since it last moved (a hang, or only a slow run:
    the reader can tell)."""
    cause = _cause(ranks)
    if cause:
        return cause
    missing = _missing(ranks, expected)
    if missing:
        return f"rank {missing[0]} had not started"
    running = _running(ranks, expected)
    if not running:
        return "every rank had finished"
    rank, info = _furthest_behind(running)
    idle = max(0.0, time.time() - info.get("time", time.time()))
    return f"rank {rank} was furthest behind, {_where(info)}, with no progress for {idle:.0f} s"
