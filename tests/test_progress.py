"""Long work shows progress on a terminal and nothing off one (planner/progress.py)."""

from __future__ import annotations

import io

from planner.errors import CaseError
from planner.fidelity import TUNED, evaluate
from planner.progress import terminal_progress
from planner.published_runs import load_rows


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_is_drawn_on_a_terminal_and_nothing_on_a_pipe():
    tty, pipe = Terminal(), io.StringIO()
    with terminal_progress("planning", tty) as progress:
        for done in range(4):
            progress(done, 3)
    with terminal_progress("planning", pipe) as progress:
        progress(1, 3)
    assert "planning" in tty.getvalue() and "3/3" in tty.getvalue()
    assert pipe.getvalue() == ""


def test_validate_published_reports_each_tuned_recipe_planned():
    """Every tuned recipe counts, whether its plan succeeds or is refused; the last call says all are done."""
    rows = [r for r in load_rows() if str(r.get("source", "")).startswith(TUNED)][:3]
    calls = []

    def refuse(case):
        raise CaseError("case", "", "not planned in this test")

    evaluate(rows, experts=True, plan=refuse, progress=lambda done, total: calls.append((done, total)))
    assert calls[0] == (0, 3) and calls[-1] == (3, 3) and len(calls) == 4


def test_size_reports_each_cluster_size_it_considers():
    """`size` over thousands of cluster sizes showed no bar: it never told one (planner/progress.py's
    docstring said it did). The CLI draws planner.size's progress(done, total) on a terminal."""
    from pathlib import Path

    import planner

    example = Path(__file__).resolve().parent.parent / "examples" / "llama3-70b-15t-size.yaml"
    calls = []
    planner.size(example, "15T", deadline="60d", progress=lambda done, total: calls.append((done, total)))
    assert calls and all(1 <= done <= total for done, total in calls)
    assert calls[-1][0] == calls[-1][1] > 100  # the last pass reaches its end: every size considered
    front = []
    planner.size(example, "15T", progress=lambda done, total: front.append((done, total)))
    assert front and all(1 <= done <= total for done, total in front)
