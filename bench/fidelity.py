"""The fidelity table of docs/fidelity.md: the four measures on the repo's published runs.

    python bench/fidelity.py

Prints Markdown: throughput and peak memory per source, the layout sweeps' median regret,
worst finite regret and median rank correlation, and the gain plan claims over tuned recipes.
Equivalent to `layout-planner validate-published`, in docs/fidelity.md's form.
"""

from __future__ import annotations

from planner.fidelity import evaluate


def main() -> None:
    f = evaluate()
    for title, table in (("Throughput (predicted / measured tokens/s − 1)", f.throughput),
                         ("Peak memory per GPU (predicted / published − 1)", f.memory)):
        print(f"\n{title}\n\n| source | rows | mean abs error | median | max | bias |\n| --- | ---: | ---: | ---: | ---: | ---: |")
        for source, s in table.items():
            print(f"| {source} | {s.count} | {s.mean_abs:.1%} | {s.median_abs:.1%} | {s.max_abs:.1%} | {s.bias:+.1%} |")
        headline = sum(s.mean_abs for s in table.values()) / len(table)
        print(f"| mean over sources | | {headline:.1%} | | | |")
    print(f"\nLayout sweeps ({len(f.sweeps)}): median regret {f.median_regret:.1%}, worst finite "
          f"{f.max_regret:.1%}, median rank correlation {f.median_rho:+.2f}")
    print(f"Tuned recipes ({f.experts_scored}): median claimed gain {f.median_gain:+.1%}, "
          f"max {max(g for _, g in f.expert_gains):+.1%}; {len(f.expert_misfits)} predicted not to fit")
    print(f"Rows scored {len(f.rows)}, failed {len(f.failed)}")


if __name__ == "__main__":
    main()
