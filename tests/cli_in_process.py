"""The command line run inside the test's own process.

`run_cli("plan", "case.yaml")` goes through the same entry point as ``python -m planner``
(``planner.cli.main``: argument parsing, one-line errors, exit codes) and returns what a
subprocess would: the exit code, stdout and stderr apart. It saves starting an interpreter and
importing the planner for every call, about half a second each on a 2-core machine, which the
hostile-input tests pay some sixty times. A crash is not turned into an exit code: its traceback
fails the test where it happened.

What only a real process shows stays a subprocess: signals and interrupts, the interpreter's
start-up and imports, torchrun, the environment (tests/test_plan.py, test_interrupts.py,
test_spec_errors.py, test_diagnose.py and others run the installed command).
"""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import sys

from planner.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    argv, handlers = sys.argv, {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    try:
        sys.argv = ["layout-planner", *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as done:
                code = done.code
    finally:
        sys.argv = argv
        for signum, handler in handlers.items():  # main() takes Ctrl-C and kill for the command
            signal.signal(signum, handler)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): Python prints it and exits with 1
        err.write(f"{code}\n")
        code = 1
    return subprocess.CompletedProcess(["layout-planner", *args], code, out.getvalue(), err.getvalue())
