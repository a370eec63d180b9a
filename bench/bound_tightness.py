"""How tight the search's step bound is: the bound of a layout over its floor (docs/speed.md).

    python bench/bound_tightness.py [CASE [ENGINE]]

`plan`'s search orders its groups of layouts by a lower bound on their step time
(``planner.search_bounds.StepBounds``) and skips what cannot beat the layouts found; the closer the
bound lies under the floor (the layout's step with neither recomputation nor offload,
``planner.search_bounds.floor``, which the search prices before scoring memory), the fewer layouts
are priced in full. For a sample of 150 groups of the case's search space (fixed seed), each at its
two smallest micro-batches and every ZeRO stage it scores, this prints the median and the 10th
percentile of bound / floor, per ZeRO stage, and the median share of each term of the floor's step.
A ratio above 1 would be a bound that is not one. Default case: examples/deepseek-v3-2048-h800.yaml;
ENGINE replaces the case's (megatron, deepspeed, torchtitan, any, nanotron).
"""

from __future__ import annotations

import math
import random
import statistics
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import yaml

from planner.case import load_case
from planner.search_bounds import StepBounds, floor
from planner.search_options import retarget
from planner.search_space import groups

ROOT = Path(__file__).resolve().parent.parent
SAMPLE, SEED = 150, 1


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "examples/deepseek-v3-2048-h800.yaml")
    engine = sys.argv[2] if len(sys.argv) > 2 else None
    data = yaml.safe_load(Path(path).read_text())
    if engine is not None:
        data.get("training", {}).pop("engine", None)
        data.get("search", {}).pop("target", None)
    case = load_case(data, ignore_layout=True)
    spec, training = retarget(case.source, case.search, case.training, engine)
    case = replace(case, training=training, search=spec)
    bounds = StepBounds(case)
    every = list(groups(case, spec))
    ratios: dict[int, list[float]] = defaultdict(list)
    shares: dict[str, list[float]] = defaultdict(list)
    for group in random.Random(SEED).sample(every, min(SAMPLE, len(every))):
        bound = bounds.of(group)
        for mbs in group.micro_batches[:2]:
            for zero in group.zeros:
                _, time = floor(case, group.layout(mbs, zero), math.inf)
                if time is None:
                    continue
                ratios[zero].append(bound[mbs] / time.total)
                for term, seconds in vars(time).items():
                    if isinstance(seconds, float):
                        shares[term].append(seconds / time.total)
    everything = sorted(r for values in ratios.values() for r in values)
    print(f"{Path(path).name}, engine {training.engine.name}: {len(every)} groups, {len(everything)} layouts sampled")
    print(f"bound / floor: median {statistics.median(everything):.3f}, "
          f"10th percentile {everything[len(everything) // 10]:.3f}, max {everything[-1]:.3f}")
    for zero, values in sorted(ratios.items()):
        print(f"  ZeRO {zero}: median {statistics.median(values):.3f} ({len(values)} layouts)")
    print("floor's step, median share of each term: "
          + ", ".join(f"{term} {statistics.median(v):.3f}" for term, v in shares.items() if statistics.median(v) > 0))


if __name__ == "__main__":
    main()
