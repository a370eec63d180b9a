"""Fit a GPU type's achieved figures to every published run on that GPU type at once.

    python bench/fit_performance.py h100 [--rounds 2] [--only NAME,NAME]

The fit is ``planner.refit`` (its docstring says what moves and what is minimised); this prints
each step and the figures it ends at, for ``planner/presets/performance.yaml``.
"""

from __future__ import annotations

import argparse

from planner import refit
from planner.errors import CaseError
from planner.published_runs import gpu_preset, load_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpu", choices=sorted(refit.TYPES))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--weight", type=float, default=0.5)
    parser.add_argument("--only", default="", help="comma-separated figures to fit, the rest held")
    args = parser.parse_args()
    rows = [r for r in load_rows() if gpu_preset(r["gpu"]) in refit.TYPES[args.gpu]]
    grid = refit.grid_for(args.gpu)
    if args.only:
        unknown = set(args.only.split(",")) - set(grid)
        if unknown:
            parser.error(f"--only: not in the {args.gpu} grid: {', '.join(sorted(unknown))}")
        grid = {name: values for name, values in grid.items() if name in args.only.split(",")}
    try:
        fitted = refit.fit(args.gpu, rows, grid, args.rounds, args.weight, progress=lambda line: print(line, flush=True))
    except CaseError as error:  # runs with no tokens/s to fit to: one line and exit 2, as the CLI refuses them
        parser.exit(2, f"error: {error}\n")
    print("fitted:", {k: v for k, v in fitted.items() if v is not None})


if __name__ == "__main__":
    main()
