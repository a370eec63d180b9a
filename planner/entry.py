"""The `layout-planner` command's entry point: its interrupt handlers first, then the CLI.

Loading the CLI (typer, rich, the cost models) takes a quarter of a second. A Ctrl-C or a
``kill`` in that time ends the command as one arriving later does (:func:`planner.cli.main`):
"interrupted" on stderr, exit 130 (143 by SIGTERM, 129 by SIGHUP), nothing written (nothing has
been yet), rather than Python's traceback or a bare death by the signal. This module imports nothing of the planner but the
package itself, whose names (CaseError's module too) load on first use: the handlers are set before
any of the planner's own modules runs.
"""

from __future__ import annotations

import gc
import os
import signal
import sys


def _interrupted_while_loading(signum, frame) -> None:
    # Inside an import nothing may be unwound safely and nothing is open: leave at once.
    sys.stderr.write("error: interrupted\n")
    sys.stderr.flush()
    os._exit(128 + signum)  # 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP, as a shell reports a death by each


# The signals a command answers as an interrupt (planner.errors reads them from here).
INTERRUPTS = ("SIGINT", "SIGTERM", "SIGHUP")


def main() -> None:
    for signum in (getattr(signal, name) for name in INTERRUPTS):
        if signal.getsignal(signum) is not signal.SIG_IGN:  # nohup and background jobs ignore them
            signal.signal(signum, _interrupted_while_loading)
    # The imports build some 40,000 objects that live as long as the process and hold no garbage: the
    # collector does not look for any while they load, and afterwards leaves them out of its passes
    # (each pass over the oldest generation walked them all again).
    gc.disable()
    try:
        from .cli import main as cli_main  # installs the handlers a running command answers to
    finally:
        gc.freeze()
        gc.enable()
    cli_main()
