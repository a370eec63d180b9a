"""The memory model on the Ultra-Scale Playbook's sweep (docs/fidelity.md).

    python bench/playbook_memory.py

Each row is scored on the stage whose memory it publishes (``published_runs.published_memory_stage``:
nanotron's first stage), in the split nanotron makes (``partition.block_cost_partition``). Three tables:

- per model: rows, mean |predicted / published − 1|, its bias, and the median of what the published
  peak holds above the prediction per parameter a GPU holds (bytes), with data parallelism (DDP) and
  without;
- per pipeline depth, and tensor parallelism 1 against more: rows, mean |error|, bias;
- without a pipeline, per model and tp: the median of the published activations (the peak less the
  model's states and buffers) over the model's;
- with a pipeline, by the published peak: rows, how many ran below half the predicted throughput,
  and the median of measured over predicted (rows not marked low-trust).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import planner
from planner.published_runs import case_of, load_rows, measured_tokens_per_s, published_memory_stage

GIB = 2**30


def scored_rows() -> list[tuple[dict, dict, object, float, float]]:
    """(row, case, the stage memory the row publishes, the published GiB, measured / predicted
    tokens/s) for the Playbook's rows."""
    out = []
    for row in load_rows():
        published = (row.get("measured") or {}).get("memory_gb_per_gpu")
        if "Playbook" not in row["source"] or not published:
            continue
        case, _ = case_of(row)
        if case is None:
            continue
        estimate = planner.estimate(case)
        stage = published_memory_stage(row)
        out.append((row, case, estimate.peak if stage is None else estimate.stages[stage], published,
                    (measured_tokens_per_s(row) or 0.0) / estimate.tokens_per_s))
    return out


def table(title: str, groups: dict, columns: str, line) -> None:
    print(f"\n{title}\n\n{columns}\n|" + " --- |" * (columns.count("|") - 1))
    for key, values in sorted(groups.items()):
        print(line(key, values))


def main() -> None:
    by_model, by_depth = defaultdict(list), defaultdict(list)
    activations, pressure = defaultdict(list), defaultdict(list)
    for row, case, memory, published, speed in scored_rows():
        lay, model = case["layout"], case["model"]["name"].split(" ")[0]
        error = memory.total / GIB / published - 1
        # The weights' term is 2 bytes per parameter at ZeRO 0-1 (bf16): the parameters a GPU holds.
        above = (published * GIB - memory.total) / (memory.parameters / 2)
        by_model[model].append((error, above, lay["dp"] > 1))
        by_depth[(lay["pp"], "tp 1" if lay["tp"] == 1 else "tp > 1")].append(error)
        if lay["pp"] == 1 and memory.activations > 2 * GIB:
            activations[(model, lay["tp"])].append((published * GIB - (memory.total - memory.activations))
                                                   / memory.activations)
        if lay["pp"] > 1 and speed and row.get("trust") != "low":
            pressure["68 GiB or more" if published >= 68 else "below 68 GiB"].append(speed)

    def per_model(model, rows):
        errors = [e for e, _, _ in rows]
        ddp, alone = [x for _, x, d in rows if d], [x for _, x, d in rows if not d]
        return (f"| {model} | {len(rows)} | {statistics.mean(map(abs, errors)):.1%} | {statistics.mean(errors):+.1%} "
                f"| {statistics.median(ddp):.1f} B | {statistics.median(alone):.1f} B |")

    table("Per model", by_model,
          "| model | rows | mean abs error | bias | above the model per parameter, with DDP | without |", per_model)
    table("Per pipeline depth", by_depth, "| pp | tp | rows | mean abs error | bias |",
          lambda key, e: f"| {key[0]} | {key[1]} | {len(e)} | {statistics.mean(map(abs, e)):.1%} "
                         f"| {statistics.mean(e):+.1%} |")
    table("Without a pipeline: published activations over the model's", activations,
          "| model | tp | rows | median ratio |",
          lambda key, r: f"| {key[0]} | {key[1]} | {len(r)} | {statistics.median(r):.2f} |")
    table("With a pipeline, by the published peak: measured over predicted throughput", pressure,
          "| published peak | rows | below half | median |",
          lambda key, r: f"| {key} | {len(r)} | {sum(x < 0.5 for x in r)} | {statistics.median(r):.2f} |")


if __name__ == "__main__":
    main()
