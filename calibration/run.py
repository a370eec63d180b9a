"""What torchrun starts on every rank: ``python -m calibration.run --workdir DIR [--launcher-pid PID] MODULE ARG...``.

Each rank is two processes, for `calibrate` (MODULE ``calibration.worker``) and
`validate` (``calibration.train``) alike. This module's ``main`` is a light supervisor
(no torch) that runs the rank's work in a child (``--worker``), and records how the
child ended in the work folder: its exit code, and whether it was stopped (torchrun
tearing the job down) or ended on its own. That record is what lets the launcher name
the rank that failed rather than the ones torn down after it. The supervisor also
stops the child if the launcher (``--launcher-pid``) dies.

The child opens the rank's progress file (:class:`calibration.progress.RankProgress`),
calls ``MODULE.work(ARGS, progress)``, and records any exception in that file before it
exits: code 75 when the error came out of a collective (another rank's failure), else 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .processes import alive
from .progress import PEER_FAILURE_EXIT, RankProgress, write_exit


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m calibration.run")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--launcher-pid", type=int, default=None)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("module")  # its work(args, progress) is the rank's work
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


@dataclass
class _Stopping:
    """What the supervisor's signal handler saw: the signal, and whether it stopped the worker."""

    by: Optional[int] = None
    stopped_child: bool = False


def supervise(argv: list[str]) -> int:
    """Run the worker, record its end, exit with its code."""
    args = _arguments(argv)
    rank = int(os.environ.get("RANK", "0"))
    child = subprocess.Popen([sys.executable, "-m", "calibration.run", "--worker", *argv])
    stopping = _Stopping()

    def stop(signum, frame):  # torchrun tears the job down with SIGTERM
        stopping.by = signum
        # A child that already ended was not stopped: on a loaded host the teardown a peer's failure
        # sets off can arrive before this loop has noticed the child's own exit (a fault of its own).
        if child.poll() is None:
            stopping.stopped_child = True
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
        if stopping.by is None and args.launcher_pid and not alive(args.launcher_pid):
            stop(signal.SIGTERM, None)
        if stopping.by is not None:
            deadline = deadline or time.monotonic() + 3.0
            if time.monotonic() > deadline:
                child.kill()
    write_exit(args.workdir, rank, code, terminated=stopping.stopped_child)
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _arguments(argv)
    if not args.worker:
        return supervise(argv)
    progress = RankProgress(args.workdir, int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0")))
    try:
        importlib.import_module(args.module).work(args.args, progress)
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
