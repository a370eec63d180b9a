"""The one torchrun supervisor behind `calibrate` and `validate`.

:func:`run_ranks` runs ``python -m torch.distributed.run ... -m calibration.run --workdir DIR
MODULE ARGS`` in a session of its own, every rank under :mod:`calibration.run`'s light
supervisor, with the run's folder (``DIR``, the caller's) holding the ranks' progress and exit
records (:mod:`calibration.progress`), torchrun's log and its temporary files. While it runs:

- the caller sees rank 0's progress (``on_progress``);
- the watchdog: a local rank that makes no progress for ``stall_s`` seconds once it has
  reached its first measured step ends the run; before that (start-up: importing torch,
  the rendezvous, building the model; :data:`calibration.progress.SETUP_STAGES`) a rank
  may take ``STARTUP_S``, or ``stall_s`` where that is longer. The whole
  run passing ``deadline_s`` ends it too;
- on failure the whole job is stopped and :class:`RunFailed` names the rank that caused
  it and its stage, in one line (:func:`calibration.progress.diagnose`);
- an interrupt (Ctrl-C, or SIGTERM where nothing else handles it) stops the job and
  propagates.

Stopping kills torchrun and every process below it (:func:`calibration.processes.kill_all`).
No torch is imported here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from .host import cores
from .processes import kill_all
from .progress import SETUP_STAGES, diagnose, overdue, read_ranks

POLL_S = 0.2
STARTUP_S = 120.0  # torch's import and a rendezvous on a busy node; NCCL's set-up at scale
EXIT_RUN_FAILED = 4  # the CLI's exit code when a calibration or validation run fails or times out


class RunFailed(RuntimeError):
    """A torchrun job failed, hung or ran out of time: one line naming the rank and what happened;
    ``output`` holds the end of torchrun's log."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


def _waits(ranks: dict[int, dict], expected: list[int], changed: dict[int, float], start: float, now: float,
           stall_s: Optional[float]) -> Iterator[tuple[float, float]]:
    """(seconds since its last progress, seconds it is allowed) for each rank still running:
    the start-up allowance while it sets up (or has not reported yet), ``stall_s`` after."""
    if stall_s is None:
        return
    startup_s = max(stall_s, STARTUP_S)
    for local in expected:
        info = ranks.get(local, {})
        if info.get("status") == "done":
            continue
        yield now - changed.get(local, start), startup_s if info.get("stage", "start") in SETUP_STAGES else stall_s


@contextmanager
def run_folder(prefix: str) -> Iterator[Path]:
    """A fresh temporary folder for one run (its ranks' records, torchrun's files), removed on the way
    out whatever ends the run. Made with the interrupts held back, and inside the block that removes it:
    a Ctrl-C landing between mkdtemp making it and the caller's ``try`` (tempfile's own code, or a
    progress bar starting on a terminal) left a layout-planner-* folder in the temporary folder."""
    from planner.errors import interrupts_deferred
    from planner.files import signals_held

    workdir: Optional[Path] = None
    try:
        with signals_held():
            workdir = Path(tempfile.mkdtemp(prefix=prefix))
        yield workdir
    finally:
        if workdir is not None:
            with interrupts_deferred():  # a second Ctrl-C does not leave the run's folder behind
                shutil.rmtree(workdir, ignore_errors=True)


def torchrun_command(workdir: Path, nproc: int, worker: Sequence[str], *, nnodes: int = 1,
                     rdzv_endpoint: Optional[str] = None) -> list[str]:
    """torchrun starting ``nproc`` ranks of ``worker`` (a module, then its arguments) on this node."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--max-restarts", "0", "--log-dir", str(workdir / "torchrun")]  # its files go with the run's folder
    if nnodes == 1:
        command += ["--standalone"]
    else:
        command += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", str(rdzv_endpoint),
                    "--rdzv-id", "layout-planner"]
    return command + ["-m", "calibration.run", "--workdir", str(workdir), "--launcher-pid", str(os.getpid()),
                      *worker]


def environment(workdir: Path, nproc: int, threads: Optional[int] = None) -> dict[str, str]:
    """The ranks' environment: ``threads`` OpenMP threads each (default: an equal share of the cores)."""
    # torchrun's torchelastic_* folders go in the run's folder, removed with it even when the run is killed.
    scratch = workdir / "tmp"
    scratch.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(scratch)}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        env.setdefault("OMP_NUM_THREADS", str(max(1, cores() // max(nproc, 1))))
    # NCCL: a timed-out collective aborts the communicator and raises in the rank (CleanUpOnly)
    # rather than tearing the process down, which would look like that rank's own failure.
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    root = str(Path(__file__).resolve().parent.parent)  # calibration importable even when not installed
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def last_error(log: Path) -> str:
    """torchrun's log, as one line: its last error line (``XxxError: ...``), else its last line."""
    from planner.errors import one_line

    lines = [line.strip() for line in _tail(log).splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"\b\w*(Error|Exception|Killed)\b", line)]
    return one_line((errors or lines or ["no output"])[-1], 300)


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextmanager
def _sigterm_interrupts():
    """SIGTERM raises KeyboardInterrupt meanwhile, so that the job is stopped on the way out,
    unless the caller handles SIGTERM itself (the CLI raises its own interrupt)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_ranks(worker: Sequence[str], nproc: int, workdir: Path, *, name: str, stall_s: Optional[float] = None,
              deadline_s: Optional[float] = None, threads: Optional[int] = None, nnodes: int = 1,
              rdzv_endpoint: Optional[str] = None,
              on_progress: Callable[[Optional[dict]], None] = lambda info: None) -> None:
    """Run ``worker`` on ``nproc`` ranks of this node until every rank is done; :class:`RunFailed`
    (``"{name} failed: ..."`` or ``"{name} exceeded its N s timeout: ..."``) otherwise."""
    log = workdir / "torchrun.log"
    start = time.monotonic()
    process: Optional[subprocess.Popen] = None
    from planner.errors import raise_if_interrupted

    with _sigterm_interrupts():
        try:
            # An interrupt Python dropped before (one raised inside an import that swallowed it: torch's,
            # measuring the machine's speed) ends the run before it starts, or at the next poll.
            raise_if_interrupted()
            with open(log, "wb") as log_file:
                process = subprocess.Popen(
                    torchrun_command(workdir, nproc, worker, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint),
                    stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                    env=environment(workdir, nproc, threads))
            expected = list(range(nproc))  # this node's ranks, by local index
            seen: dict[int, tuple] = {}
            changed: dict[int, float] = {}
            stalled: Optional[float] = None
            overran = False
            while process.poll() is None:
                time.sleep(POLL_S)
                raise_if_interrupted()
                now = time.monotonic()
                ranks = {info.get("local_rank", r): info for r, info in read_ranks(workdir).items()}
                for local in expected:
                    info = ranks.get(local, {})
                    mark = (info.get("step"), info.get("status"), info.get("in_comm"))
                    if seen.get(local) != mark:
                        seen[local], changed[local] = mark, now
                on_progress(ranks.get(0))
                late = [waited for waited, allowed in _waits(ranks, expected, changed, start, now, stall_s)
                        if waited > allowed]
                if late:
                    stalled = max(late)
                    break
                if deadline_s is not None and now - start > deadline_s:
                    overran = True
                    break
            code = process.poll()
            if stalled is None and not overran and code == 0:
                return
            ranks = read_ranks(workdir)  # as the ranks left them, before stopping the job adds its own ends
            if code is None:
                kill_all(process)
            named = expected if nnodes == 1 else sorted(ranks)
            if overran:
                raise RunFailed(f"{name} exceeded its {deadline_s:g} s timeout: {overdue(ranks, named)}", _tail(log))
            reason = None
            if ranks or stalled is not None:  # no rank ever started: torchrun itself failed
                reason = diagnose(ranks, named, stalled)
            if reason is None and stalled is not None:
                reason = f"no rank started within {stalled:.0f} s (torchrun: {last_error(log)})"
            if reason is None:
                before = "" if ranks else " before any rank reported"
                reason = f"torchrun exited with code {code}{before}: {last_error(log)}"
            raise RunFailed(f"{name} failed: {reason}", _tail(log))
        finally:
            if process is not None and process.poll() is None:  # an interrupt, or an error of our own
                kill_all(process)
