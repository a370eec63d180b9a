"""calibrate's progress where no terminal shows a bar (a log file, CI): one line per stage, with
the step of the planned total, never past it, and the time left."""

from __future__ import annotations

import io

from calibration.launch import _ProgressBar


def test_one_line_per_stage_with_the_time_left():
    out = io.StringIO()  # not a terminal
    bar = _ProgressBar(True, stream=out)
    bar.started -= 10.0  # ten seconds in
    for info in ({"stage": "gemm", "step": 5, "total": 20}, {"stage": "gemm", "step": 6, "total": 20},
                 {"stage": "collectives", "step": 25, "total": 20}):
        bar.update(info)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("calibrate: the GEMM benchmarks 5/20 (10 s, about 30 s left)")
    assert lines[1].startswith("calibrate: the collective benchmarks 20/20 (10 s")  # capped at the total


def test_quiet_when_asked():
    out = io.StringIO()
    bar = _ProgressBar(False, stream=out)
    bar.update({"stage": "gemm", "step": 1, "total": 2})
    assert out.getvalue() == ""
