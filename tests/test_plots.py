"""`--plot`: the Pareto front, and the PNG written whole or not at all."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

import planner
from planner.errors import CaseError
from planner.plots import DPI, FIGSIZE, pareto_front, write_plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CASE = {
    "model": {"preset": "llama2-7b"},
    "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8},
    "training": {"global_batch_size": 64, "seq_len": 2048},
}


def brute_front(points):
    def dominated(i):
        ti, mi = points[i]
        return any(tj <= ti and mj <= mi and (tj < ti or mj < mi) for tj, mj in points)

    return sorted((i for i in range(len(points)) if not dominated(i)), key=lambda i: (points[i], i))


def test_pareto_front_hand_example():
    points = [(3.0, 10.0), (1.0, 50.0), (2.0, 30.0), (2.5, 30.0), (4.0, 10.0), (5.0, 5.0), (1.0, 60.0)]
    # (2.5, 30) is dominated by (2, 30); (4, 10) by (3, 10); (1, 60) by (1, 50).
    assert pareto_front(points) == [1, 2, 0, 5]


def test_pareto_front_edge_cases():
    assert pareto_front([]) == []
    assert pareto_front([(1.0, 1.0)]) == [0]
    # Equal points do not dominate each other: both stay.
    assert pareto_front([(2.0, 3.0), (1.0, 5.0), (2.0, 3.0)]) == [1, 0, 2]


@pytest.mark.parametrize("seed", range(20))
def test_pareto_front_matches_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 40)
    # Small integer grids make ties in time, in memory and in both common.
    grid = rng.choice([4, 10, 1000])
    points = [(float(rng.randint(0, grid)), float(rng.randint(0, grid))) for _ in range(n)]
    front = pareto_front(points)
    assert sorted(front) == sorted(brute_front(points))
    times = [points[i][0] for i in front]
    assert times == sorted(times)


@pytest.fixture(scope="module")
def small_plan():
    pytest.importorskip("matplotlib")
    result = planner.plan(CASE)
    assert result.best is not None and result.alternatives
    return result


def test_write_plots_writes_png_of_figure_size(small_plan, tmp_path):
    image = pytest.importorskip("matplotlib.image")
    target = tmp_path / "plan.png"
    target.write_bytes(b"stale")  # an existing file is overwritten
    write_plots(small_plan, target)
    data = target.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    height, width = image.imread(target).shape[:2]
    assert (width, height) == (round(FIGSIZE[0] * DPI), round(FIGSIZE[1] * DPI))
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]


def test_failed_render_leaves_no_file(small_plan, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    def boom(self, *args, **kwargs):
        raise RuntimeError("render failed")

    monkeypatch.setattr(Figure, "savefig", boom)
    target = tmp_path / "plan.png"
    with pytest.raises(RuntimeError, match="render failed"):
        write_plots(small_plan, target)
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_existing_file(small_plan, tmp_path, monkeypatch):
    real_replace = os.replace

    def full_disk(src, dst):
        if Path(src).name == Path(dst).name == "plan.png":  # the new plot, not the old one moved back
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", full_disk)
    target = tmp_path / "plan.png"
    target.write_bytes(b"previous plot")
    with pytest.raises(CaseError, match="--plot: cannot write .No space left on device.; nothing written"):
        write_plots(small_plan, target)
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]
    assert target.read_bytes() == b"previous plot"


def test_a_missing_folder_is_made(small_plan, tmp_path):
    write_plots(small_plan, tmp_path / "missing" / "plan.png")
    assert (tmp_path / "missing" / "plan.png").read_bytes()[:8] == PNG_SIGNATURE


def test_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    # A None entry in sys.modules makes `import matplotlib...` raise ImportError.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    target = tmp_path / "plan.png"
    with pytest.raises(CaseError) as info:
        write_plots(object(), target)  # fails before the plan is looked at
    assert info.value.key == "--plot"
    assert info.value.source == str(target)
    assert "pip install 'layout-planner[plot]'" in info.value.expected
    assert list(tmp_path.iterdir()) == []


def test_planner_does_not_import_matplotlib():
    import subprocess

    code = ("import sys, planner, planner.cli, planner.plots; "
            "planner.plan(%r); print(any(m.split('.')[0] == 'matplotlib' for m in sys.modules))" % (CASE,))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_plot_draws_the_headroom_line_and_alternatives_over_the_star(small_plan, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from planner.plots import render_plots

    figures = []
    real_savefig = Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return real_savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    render_plots(small_plan, "plan.png")
    memory, pareto = figures[0].axes
    best = small_plan.best
    usable = (best.capacity_bytes * (1 - small_plan.headroom) - best.job.overheads.cuda_context) / 1e9
    for ax in (memory, pareto):
        labels = {line.get_label(): line.get_ydata()[0] for line in ax.get_lines()}
        assert any(label.startswith("usable") and y == pytest.approx(usable) for label, y in labels.items())
    layers = {c.get_label(): c.get_zorder() for c in pareto.collections}
    assert layers["best"] < next(z for label, z in layers.items() if label.startswith("alternatives"))


def test_the_chosen_layouts_title_stays_inside_the_figure(monkeypatch, tmp_path):
    """A long layout label (Llama 3 70B on 8 H100s: dp1 tp4 pp2 vpp40 … recompute) ran past its panel,
    and tight_layout cut the title's start off the figure ("osen layout: dp1 tp4 …"). Every title's
    drawn extent lies inside the figure's."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from planner.plots import render_plots

    drawn = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (drawn.append(self), savefig(self, *a, **k))[1])
    case = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 16, "seq_len": 8192}}
    plan = planner.plan(case)
    render_plots(plan, tmp_path / "plan.png")
    (fig,) = drawn
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        box = ax.title.get_window_extent(renderer)
        assert ax.title.get_text() and 0 <= box.x0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1, \
            (ax.title.get_text(), box, fig.bbox)
