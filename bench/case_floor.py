"""The least throughput error any model could have on the published runs, given only their cases.

    python bench/case_floor.py [--score-py]

Some published runs share one case: the same model, cluster, training and layout, measured in
several software releases (Megatron-Bridge's containers 25.09 to 26.08) or twice on one page. A
model reads the case alone, so it gives them one prediction, and their measured spread is error
no model can remove. For each group of runs with one case the best single prediction p minimises
the mean of |p/m − 1| over their measurements m (the minimum lies at one of the m: the sum is
piecewise linear in p, with its breaks there). The floor of a source is the mean of those
least errors over its runs; a run alone in its case has a floor of 0.

The runs are those `layout-planner validate-published` scores (`planner.fidelity.evaluate`:
measured within half the best of their job), written as the repo writes them
(`planner/published_runs.py`), or with ``--score-py`` as `../shared/validation/score.py` writes
them, which states fewer facts and so puts more runs into one case. It prints Markdown: per source,
the runs, the cases holding more than one, the floor and the model's own mean |error| beside it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from collections import defaultdict
from pathlib import Path

from planner.fidelity import evaluate
from planner.published_runs import job_key

SCORE_PY = Path(__file__).resolve().parent.parent.parent / "shared" / "validation" / "score.py"


def least_error(measured: list[float]) -> list[float]:
    """|p/m − 1| for each m at the p that minimises their sum."""
    best = min(measured, key=lambda p: sum(abs(p / m - 1) for m in measured))
    return [abs(best / m - 1) for m in measured]


def score_py_case_of():
    """`score.py`'s own mapping of a row to a case."""
    spec = importlib.util.spec_from_file_location("score", SCORE_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.case_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--score-py", action="store_true", help="group runs by score.py's cases")
    args = parser.parse_args()
    fidelity = evaluate(experts=False)
    best: dict[tuple, float] = defaultdict(float)
    for r in fidelity.rows:
        if r.measured:
            best[r.job] = max(best[r.job], r.measured)
    scored = [r for r in fidelity.rows if r.measured and r.measured * 2 >= best[r.job]]
    case_of = score_py_case_of() if args.score_py else None
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for r in scored:
        case = case_of(r.row)[0] if case_of else r.case
        key = json.dumps(case, sort_keys=True, default=str) if case_of else job_key(case)
        groups[(r.source, key)].append(r)
    floors: dict[str, list[float]] = defaultdict(list)
    shared: dict[str, int] = defaultdict(int)
    for (source, _), runs in groups.items():
        floors[source] += least_error([r.measured for r in runs])
        shared[source] += len(runs) > 1
    print("| source | runs | cases of several runs | floor, mean abs error | validate-published |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for source, errors in sorted(floors.items()):
        model = fidelity.throughput[source].mean_abs
        print(f"| {source} | {len(errors)} | {shared[source]} | {100 * sum(errors) / len(errors):.1f} % "
              f"| {100 * model:.1f} % |")


if __name__ == "__main__":
    main()
