"""What torchrun starts on every rank: ``python -m calibration.run --workdir DIR [...]``.

Each rank is two processes. This module's ``main`` is a light supervisor (no torch)
that runs the rank's benchmarks in a child (``--worker``), and records how the
child ended in the work folder: its exit code, and whether the launcher stopped it
(torchrun tearing the job down) or it ended on its own. That record is what lets
the launcher name the rank that failed rather than the ones torn down after it.
The supervisor also stops the child if the launcher (``--launcher-pid``) dies.

The worker: sets up the process group (NCCL on GPUs, gloo on CPUs), runs every
benchmark in lockstep (a barrier before each, so ranks share the machine as in
training), gathers all timings on rank 0, which fits them and writes
``DIR/profile.yaml``. The launcher moves that file into place only when every
rank succeeded.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .progress import PEER_FAILURE_EXIT, RankProgress, write_exit


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m calibration.run")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--case", type=Path, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gpu-preset", default=None)
    parser.add_argument("--launcher-pid", type=int, default=None)
    parser.add_argument("--other-cpu-share", type=float, default=None)  # measured by the launcher before the run
    parser.add_argument("--worker", action="store_true")
    return parser.parse_args(argv)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def supervise(argv: list[str]) -> int:
    """Run the worker, record its end, exit with its code."""
    args = _arguments(argv)
    rank = int(os.environ.get("RANK", "0"))
    child = subprocess.Popen([sys.executable, "-m", "calibration.run", "--worker", *argv])
    stopping = {"by": None}

    def stop(signum, frame):  # torchrun tears the job down with SIGTERM
        stopping["by"] = signum
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    deadline = None
    while True:
        try:
            code = child.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            pass
        if stopping["by"] is None and args.launcher_pid and not _alive(args.launcher_pid):
            stop(signal.SIGTERM, None)
        if stopping["by"] is not None:
            deadline = deadline or time.monotonic() + 3.0
            if time.monotonic() > deadline:
                child.kill()
    write_exit(args.workdir, rank, code, terminated=stopping["by"] is not None)
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--worker" not in argv:
        return supervise(argv)
    args = _arguments(argv)
    rank = int(os.environ.get("RANK", "0"))
    progress = RankProgress(args.workdir, rank, int(os.environ.get("LOCAL_RANK", "0")))
    try:
        from .worker import work

        work(args, progress)
    except BaseException as error:  # noqa: BLE001 - every failure is recorded for the launcher
        import traceback

        by_peer = progress.failed(error)
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(PEER_FAILURE_EXIT if by_peer else 1)
    progress.done()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: the process group is already destroyed


if __name__ == "__main__":
    sys.exit(main())
