"""A progress bar for long work, on a terminal only: `size` over many cluster sizes,
`validate-published` planning every tuned recipe. Off a terminal (a pipe, a log, CI) nothing is
printed, so that output stays what the command answers."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator, Optional, TextIO


@contextlib.contextmanager
def terminal_progress(description: str, stream: Optional[TextIO] = None) -> Iterator[Callable[[int, int], None]]:
    """A callback ``progress(done, total)`` that draws rich's bar on ``stream`` (stderr) while it
    is a terminal, and does nothing otherwise. The bar is gone when the block ends."""
    stream = stream or sys.stderr
    if not stream.isatty():
        yield lambda done, total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(file=stream), transient=True) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
