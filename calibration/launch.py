"""The launcher behind `layout-planner calibrate`: torchrun as a watched subprocess.

Runs ``python -m torch.distributed.run --nproc-per-node N -m calibration.run ...`` in
its own session, with a work folder (a fresh temporary directory) for the ranks'
progress files and rank 0's profile. While it runs, the launcher

- draws a progress bar from rank 0's progress;
- is the watchdog: a local rank that makes no progress for ``timeout`` seconds (or
  never starts) ends the run;
- on failure stops the whole job and names the rank that caused it, in one line
  (:func:`calibration.progress.diagnose`), and writes nothing;
- on success checks that the profile loads (``planner.case.gpu_from_profile``) and
  only then writes it to ``out``, atomically (``planner.files.write_atomically``).

An interrupt (Ctrl-C, SIGTERM) stops the job and writes nothing. No torch is
imported here unless the GPU count is needed for the default ``--nproc``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from planner.errors import CaseError

from .host import cores
from .progress import STAGES, diagnose, read_ranks

POLL_S = 0.2


EXIT_CALIBRATION_FAILED = 4  # the CLI's exit code when a calibration run fails


class CalibrationError(Exception):
    """The calibration run failed: one line naming the rank and what happened. Nothing was written."""


@dataclass(frozen=True)
class Outcome:
    path: Optional[Path]  # None: rank 0 ran on another node, which wrote the profile
    seconds: float
    world_size: int
    profile: Optional[dict] = None  # the profile written


def default_nproc() -> int:
    """GPUs on this node when CUDA is available, else 2 CPU ranks."""
    import torch  # only here: the GPU count needs it

    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def check_nproc(nproc: int) -> None:
    """Refuse more ranks than this machine has cores or GPUs: each rank needs one of its own,
    and hundreds of processes on a few cores only thrash."""
    from planner.limits import MAX_RANKS_PER_CORE

    most = cores() * MAX_RANKS_PER_CORE
    if nproc > most:
        import torch  # only now: most runs never need the GPU count

        most = max(most, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if nproc > most:
        raise CaseError("--nproc", "", f"expected at most {most} ranks (one per CPU core or GPU of this machine), "
                                       f"got {nproc}")


def torchrun_command(workdir: Path, nproc: int, *, timeout: float, case: Optional[Path], quick: bool,
                     gpu_preset: Optional[str], nnodes: int, rdzv_endpoint: Optional[str],
                     other_cpu_share: Optional[float] = None) -> list[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--max-restarts", "0", "--log-dir", str(workdir / "torchrun")]  # its files go with the work folder
    if nnodes == 1:
        command += ["--standalone"]
    else:
        command += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", str(rdzv_endpoint),
                    "--rdzv-id", "layout-planner-calibrate"]
    command += ["-m", "calibration.run", "--workdir", str(workdir), "--timeout", str(timeout),
                "--launcher-pid", str(os.getpid())]
    if case is not None:
        command += ["--case", str(case.resolve())]
    if quick:
        command += ["--quick"]
    if gpu_preset:
        command += ["--gpu-preset", gpu_preset]
    if other_cpu_share is not None:
        command += ["--other-cpu-share", f"{other_cpu_share:.4f}"]
    return command


def _environment(nproc: int, workdir: Path) -> dict[str, str]:
    # torchrun's torchelastic_* folders go in the work folder, removed with it even when
    # the run is killed.
    scratch = workdir / "tmp"
    scratch.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(scratch)}
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores() // max(nproc, 1))))
    # NCCL: a timed-out collective aborts the communicator and raises in the rank (CleanUpOnly)
    # rather than tearing the process down, which would look like that rank's own failure.
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    root = str(Path(__file__).resolve().parent.parent)  # calibration importable even when not installed
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _stop(process: subprocess.Popen, workdir: Path) -> None:
    """Stop torchrun and every rank (supervisors and workers), gently then for good."""
    pids = set()  # each rank's worker and its supervisor (torchrun starts those in their own sessions)
    for info in read_ranks(workdir).values():
        if "exit" not in info:
            pids.update(p for p in (info.get("pid"), info.get("ppid")) if isinstance(p, int) and p != os.getpid())
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if process.poll() is not None and not any(_alive(p) for p in pids):
            return
        for target in (lambda: os.killpg(process.pid, sig), *[(lambda p=p: os.kill(p, sig)) for p in pids]):
            try:
                target()
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and (process.poll() is None or any(_alive(p) for p in pids)):
            time.sleep(0.05)
    process.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True


def _last_line(log: Path) -> str:
    """torchrun's last error line (or last line) in its log."""
    try:
        lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()
                 if line.strip()]
    except OSError:
        lines = []
    errors = [line for line in lines if re.search(r"error|exception", line, re.IGNORECASE)]
    return (errors or lines or ["no output"])[-1][:300]


def _torchrun_failure(log: Path, code: int) -> str:
    """When no rank left a record: what torchrun itself said."""
    return f"torchrun exited with code {code} before any rank reported: {_last_line(log)}"


class _ProgressBar:
    """Rank 0's progress: a bar with the time left where stderr is a terminal; elsewhere (a log,
    CI) one line per stage on stdout, with the step, the time so far and the time left, so a long
    run is never silent and stderr keeps only the one-line error."""

    def __init__(self, show: bool, stream=None):
        self.bar = None
        self.lines = show and (stream is not None or not sys.stderr.isatty())
        self.stream = stream if stream is not None else sys.stdout
        self.stage: Optional[str] = None
        self.started = time.monotonic()
        if show and not self.lines:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
                                transient=True)
            self.task = self.bar.add_task("calibrate: starting", total=None)
            self.bar.start()

    def update(self, info: Optional[dict]) -> None:
        if not info or (self.bar is None and not self.lines):
            return
        stage = STAGES.get(info.get("stage", ""), info.get("stage", ""))
        label = info.get("label") or ""
        total = info.get("total") or None
        step = info.get("step", 0)
        step = min(step, total) if total else step  # a stage may count past the planned total
        if self.bar is not None:
            self.bar.update(self.task, completed=step, total=total,
                            description=f"calibrate: {stage}" + (f" · {label}" if label else ""))
            return
        if stage != self.stage:
            self.stage = stage
            elapsed = time.monotonic() - self.started
            left = f", about {elapsed / step * (total - step):.0f} s left" if total and step else ""
            of = f" {step}/{total}" if total else ""
            print(f"calibrate: {stage}{of} ({elapsed:.0f} s{left})", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def calibrate(out: Path, *, case: Optional[Path] = None, nproc: Optional[int] = None, quick: bool = False,
              timeout: float = 300.0, force: bool = False, gpu_preset: Optional[str] = None, nnodes: int = 1,
              rdzv_endpoint: Optional[str] = None, show_progress: bool = True, allow_busy: bool = False,
              warn=lambda line: print(f"warning: {line}", file=sys.stderr)) -> Outcome:
    """Run the calibration and write the profile to ``out``; :class:`CalibrationError` if it fails.

    Bad arguments raise :class:`planner.errors.CaseError` before anything runs, and so does a
    machine that other processes keep busy (:func:`host.busy_reason`) unless ``allow_busy``
    (then ``warn`` is told); the share measured goes into the profile's ``machine`` section.
    """
    from .host import busy_reason, other_cpu_share

    from planner.files import Output, check_writable, write_atomically

    check_writable([Output(out, "")], force)  # an existing or unwritable --out fails now, not after the run
    if case is not None:
        from planner.case import load_case

        load_case(case)  # a bad case fails here, in one line, before any rank starts
    if gpu_preset is not None:
        from planner.presets import resolve_gpu_preset

        gpu_preset = resolve_gpu_preset("--gpu-preset", "", gpu_preset)
    if timeout <= 0:
        raise CaseError("--timeout", str(timeout), "expected a positive number of seconds")
    if nnodes > 1 and not rdzv_endpoint:
        raise CaseError("--nnodes", str(nnodes), "several nodes need --rdzv-endpoint HOST:PORT")
    if importlib.util.find_spec("torch") is None:
        raise CaseError("calibrate", "torch", "not installed; pip install 'layout-planner[calibrate]'")
    if nproc is not None:
        check_nproc(nproc)
    nproc = nproc or default_nproc()
    if nproc < 1:
        raise CaseError("--nproc", str(nproc), "no GPUs found; pass --nproc")
    others = other_cpu_share()
    busy = busy_reason(others)
    if busy and not allow_busy:
        raise CaseError("calibrate", "host", busy)
    if busy:
        warn(busy)

    workdir = Path(tempfile.mkdtemp(prefix="layout-planner-calibrate-"))
    start = time.monotonic()
    bar = _ProgressBar(show_progress)
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    process: Optional[subprocess.Popen] = None
    try:
        signal.signal(signal.SIGTERM, on_term)
        log = workdir / "torchrun.log"
        with open(log, "wb") as log_file:
            process = subprocess.Popen(
                torchrun_command(workdir, nproc, timeout=timeout, case=case, quick=quick, gpu_preset=gpu_preset,
                                 nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, other_cpu_share=others),
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                env=_environment(nproc, workdir))
        expected = list(range(nproc))  # this node's ranks, by local index
        seen: dict[int, tuple] = {}
        changed: dict[int, float] = {}
        stalled: Optional[float] = None
        while process.poll() is None:
            time.sleep(POLL_S)
            now = time.monotonic()
            ranks = {info.get("local_rank", r): info for r, info in read_ranks(workdir).items()}
            for local in expected:
                info = ranks.get(local, {})
                mark = (info.get("step"), info.get("status"), info.get("in_comm"))
                if seen.get(local) != mark:
                    seen[local], changed[local] = mark, now
            bar.update(ranks.get(0))
            waiting = [now - changed.get(local, start) for local in expected
                       if ranks.get(local, {}).get("status") != "done"]
            if waiting and max(waiting) > timeout:
                stalled = max(waiting)
                break
        code = process.poll()
        if stalled is not None or code != 0:
            if stalled is not None:
                _stop(process, workdir)
            ranks = read_ranks(workdir)
            reason = None
            if ranks or stalled is not None:  # no rank ever started: torchrun itself failed
                reason = diagnose(ranks, expected if nnodes == 1 else sorted(ranks), stalled)
            if reason is None and stalled is not None:
                reason = f"no rank started within {stalled:.0f} s (torchrun: {_last_line(log)})"
            if reason is None:
                reason = _torchrun_failure(log, code if code is not None else -1)
            raise CalibrationError(f"calibration failed: {reason}; no profile written")
        profile = workdir / "profile.yaml"
        if not profile.exists():
            if nnodes > 1:
                return Outcome(None, time.monotonic() - start, nproc * nnodes)
            raise CalibrationError("calibration failed: rank 0 wrote no profile; no profile written")
        from planner.case import gpu_from_profile

        try:
            gpu_from_profile(profile)
        except CaseError as error:
            raise CalibrationError(f"calibration failed: the profile does not load ({error}); "
                                   "no profile written") from None
        text = profile.read_text(encoding="utf-8")
        write_atomically(out, text, force=force)
        return Outcome(out, time.monotonic() - start, nproc * nnodes, yaml.safe_load(text))
    finally:
        bar.close()
        if process is not None and process.poll() is None:
            _stop(process, workdir)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(workdir, ignore_errors=True)
