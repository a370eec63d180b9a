"""`layout-planner calibrate`: the profile measured by ranks under the run supervisor.

Checks the arguments, then runs ``calibration.worker`` on ``--nproc`` ranks through
:func:`calibration.supervisor.run_ranks` (its watchdog: a rank that makes no progress for
``timeout`` seconds ends the run; its diagnosis names the rank that failed), with a fresh
temporary folder for the run. Meanwhile it draws a progress bar from rank 0's progress. On
success it checks that the profile rank 0 left in the folder loads
(``planner.case_cluster.gpu_from_profile``) and only then writes it to ``out``, atomically
(``planner.files.write_all``); on failure or an interrupt it writes nothing.
Before the ranks start it measures what else uses the machine (other processes' CPU share;
on GPUs, their utilisation), and on CPUs it times the reference GEMM before and after them
(:mod:`calibration.speed`); the profile's ``machine`` section keeps all of it.
"""

from __future__ import annotations

import glob
import importlib.util
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from planner.errors import CaseError, interrupts_deferred, one_line, safe_repr

from .host import cores
from .profile import render
from .progress import STAGES
from .speed import moved_reason, reference_gemm_tflops
from .supervisor import RunFailed, run_folder, run_ranks
from .train import threads_per_rank



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
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise CaseError("--nproc", "", f"expected ranks from 1 to {most} (one per CPU core or GPU of this machine), "
                                       f"got {nproc!r}")
    if nproc > most:
        # The GPUs the drivers show (NVIDIA's /dev/nvidia0, 1, ...; ROCm's render nodes), an upper
        # bound on what torch counts: importing torch to count them took 1.8 s.
        most = max(most, len(glob.glob("/dev/nvidia[0-9]*")), len(glob.glob("/dev/dri/renderD*")))
    if nproc > most:
        raise CaseError("--nproc", "", f"expected at most {most} ranks (one per CPU core or GPU of this machine), "
                                       f"got {nproc}")


# The longest host name DNS resolves (RFC 1035, 2.3.4: 255 octets on the wire, 253 characters written).
MAX_HOST_NAME = 253


def check_endpoint(endpoint: str) -> None:
    """``--rdzv-endpoint`` as torchrun takes it: HOST:PORT, the port from 1 to 65535 (torchrun
    itself says so only after its ranks start)."""
    host, _, port = endpoint.strip().rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise CaseError("--rdzv-endpoint", "", f"expected HOST:PORT with a port from 1 to 65535, got "
                                               f"{one_line(safe_repr(endpoint), 80)}")
    # torch's parse_rendezvous_endpoint (distributed/elastic/rendezvous/utils.py), which its ranks run
    # after they start: a name of letters, digits, dots, colons and dashes, an IPv6 address in brackets.
    bare = host[1:-1] if len(host) > 1 and host[0] == "[" and host[-1] == "]" else host
    if not re.fullmatch(r"[\w.:-]+", bare):
        raise CaseError("--rdzv-endpoint", "", f"expected a host name of letters, digits, dots and dashes, an IPv4 "
                                               f"address or an IPv6 one in brackets, got "
                                               f"{one_line(safe_repr(host), 80)}")
    if len(host.strip("[]")) > MAX_HOST_NAME:  # a name past DNS's limit reaches no rendezvous: the ranks wait it out
        raise CaseError("--rdzv-endpoint", "", f"expected a host name of at most {MAX_HOST_NAME} characters (DNS's "
                                               f"limit), got one of {len(host):,}")


def worker_args(timeout: float, case: Optional[Path], quick: bool, gpu_preset: Optional[str],
                other_cpu_share: Optional[float]) -> list[str]:
    """What every rank runs: ``calibration.worker`` and its arguments."""
    args = ["calibration.worker", "--timeout", str(timeout)]
    if case is not None:
        args += ["--case", str(case.resolve())]
    if quick:
        args += ["--quick"]
    if gpu_preset:
        args += ["--gpu-preset", gpu_preset]
    if other_cpu_share is not None:
        args += ["--other-cpu-share", f"{other_cpu_share:.4f}"]
    return args


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
              warn=lambda line: print(f"warning: {line}", file=sys.stderr), last: bool = False) -> Outcome:
    """Run the calibration and write the profile to ``out``; :class:`RunFailed` if it fails.

    ``last`` (the CLI's: the profile is the command's last act) ignores interrupts from the moment the
    profile is in place (``planner.files.write_all``): a signal in what is left (the run folder's
    removal) said "calibration interrupted; no profile written", exit 130, with the profile written.

    Bad arguments raise :class:`planner.errors.CaseError` before anything runs, and so does a
    machine that other processes keep busy (:func:`host.busy_reason`, on GPUs
    :func:`host.gpu_busy_reason`) unless ``allow_busy`` (then ``warn`` is told); what was measured
    goes into the profile's ``machine`` section, with the reference GEMM's speed before and after
    the ranks ran on CPUs (``warn`` is told when it moved: :func:`speed.moved_reason`).
    """
    from .host import busy_reason, gpu_busy_reason, gpu_use, measuring_anyway, other_cpu_share

    from planner.fields import check_option
    from planner.files import Output, check_writable, write_all
    from planner.limits import MAX_TIMEOUT_S

    check_writable([Output(out, "")], force)  # an existing or unwritable --out fails now, not after the run
    if case is not None:
        from planner.case import load_case

        load_case(case)  # a bad case fails here, in one line, before any rank starts
    if gpu_preset is not None:
        from planner.presets import resolve_gpu_preset

        gpu_preset = resolve_gpu_preset("--gpu-preset", "", gpu_preset)
    check_option("--timeout", timeout, 1, MAX_TIMEOUT_S, "seconds")
    if nnodes > 1 and not rdzv_endpoint:
        raise CaseError("--nnodes", str(nnodes), "several nodes need --rdzv-endpoint HOST:PORT")
    if rdzv_endpoint is not None:
        check_endpoint(rdzv_endpoint)
        if nnodes == 1:  # one node meets on its own: the endpoint would go unused, unsaid
            raise CaseError("--rdzv-endpoint", "", "is where the nodes of a run over several meet: give --nnodes "
                                                   "N (more than 1) with it, or leave it out on one node")
    if quick and case is not None:  # --quick times tiny shapes, not the case's: the profile would name it all the same
        raise CaseError("--case", "", "times the case's own shapes, which --quick replaces with tiny ones: give one "
                                      "or the other")
    if importlib.util.find_spec("torch") is None:
        raise CaseError("calibrate", "torch", "not installed; pip install 'layout-planner[calibrate]'")
    if nproc is not None:
        check_nproc(nproc)
    nproc = nproc or default_nproc()
    if nproc < 1:
        raise CaseError("--nproc", str(nproc), "no GPUs found; pass --nproc")
    others = other_cpu_share()
    import torch  # the device decides which checks apply; the ranks import it anyway

    cuda = torch.cuda.is_available()
    if gpu_preset is not None and not cuda:
        # Its datasheet peaks would scale this machine's CPU timings: a profile that names a GPU it never
        # measured (a B200's 2,250 TFLOP/s at an efficiency of 6e-5).
        raise CaseError("--gpu-preset", gpu_preset, "names a GPU, but torch sees none on this machine: its "
                                                    "datasheet peaks would only rescale CPU timings; leave it "
                                                    "out to calibrate the CPUs")
    used = gpu_use(nproc) if cuda else None
    for busy in (busy_reason(others), gpu_busy_reason(used)):
        if busy and not allow_busy:
            raise CaseError("calibrate", "host", busy)
        if busy:
            warn(measuring_anyway(busy))
    threads = threads_per_rank(nproc, cores())  # as each rank sets (calibration.worker)
    before = None if cuda else reference_gemm_tflops(threads)

    start = time.monotonic()
    with run_folder("layout-planner-calibrate-") as workdir:
        bar = _ProgressBar(show_progress)
        try:
            try:
                run_ranks(worker_args(timeout, case, quick, gpu_preset, others), nproc, workdir, name="calibration",
                          stall_s=timeout, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, on_progress=bar.update)
            except RunFailed as error:
                raise RunFailed(f"{error}; no profile written", error.output) from None
            profile = workdir / "profile.yaml"
            if not profile.exists():
                if nnodes > 1:
                    return Outcome(None, time.monotonic() - start, nproc * nnodes)
                raise RunFailed("calibration failed: rank 0 wrote no profile; no profile written")
            from planner.case_cluster import gpu_from_profile

            try:
                gpu_from_profile(profile)
            except CaseError as error:
                raise RunFailed(f"calibration failed: the profile does not load ({error}); "
                                "no profile written") from None
            text = profile.read_text(encoding="utf-8")
            if before is not None or used is not None:
                data = yaml.safe_load(text)
                if before is not None:
                    after = reference_gemm_tflops(threads)
                    data["machine"]["reference_gemm_tflops"] = {"before": round(before, 4), "after": round(after, 4)}
                    moved = moved_reason(before, after)
                    if moved:
                        warn(moved)
                if used is not None:
                    data["machine"]["other_gpu_use"] = used
                text = render(data)
            write_all([Output(Path(out), text)], force, last=last)
            return Outcome(out, time.monotonic() - start, nproc * nnodes, yaml.safe_load(text))
        finally:
            with interrupts_deferred():  # a second Ctrl-C does not leave the bar's thread drawing
                bar.close()
