"""The Playbook's tensor-parallel stages with pipeline neighbours in another node, measured and modelled.

    python bench/pipeline_floor.py

Per layer and micro-batch (a stage's step time over the micro-batches' slots, m + pp − 1 under
1F1B, and over the stage's layers), the median of the sweep's rows that are not marked low-trust,
at micro-batches of 1–4 and tensor parallelism within a node, by tp and by where the pipeline's
neighbours are: on another node (nanotron's rank order, tp then dp then pp, puts a stage's
neighbours tp·dp ranks away), on the same node, or no pipeline on several nodes. "model" is the
estimate as it stands; "GPU" is the same estimate without the generic engine's floor
(``EngineBehaviour.pipeline_collective_floor_s`` and ``_rank_s`` at 0), what the stage's work takes.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict

import planner.engines as engines
from cost_models.topology import group_links
from planner.case import load_case
from planner.fidelity import evaluate
from planner.published_runs import load_rows


def per_layer_ms(rows) -> dict:
    """{(where, tp): [(measured, predicted) ms per layer and micro-batch]} for the Playbook's rows."""
    out = defaultdict(list)
    for r in rows:
        lay, training = r.case["layout"], r.case["training"]
        if r.row.get("trust") == "low" or lay["micro_batch_size"] > 4 or lay["tp"] > 8:
            continue
        job = load_case(r.case).job()
        if lay["pp"] > 1:
            across = group_links(job.cluster, job.layout, "pp").domains > 1
            where = "pipeline neighbours on another node" if across else "pipeline neighbours on the node"
        elif r.row["num_gpus"] > job.cluster.gpu.nvlink_domain:
            where = "no pipeline, several nodes"
        else:
            continue
        tokens = training["global_batch_size"] * training["seq_len"]
        microbatches = training["global_batch_size"] // (lay["dp"] * lay["micro_batch_size"])
        per = (microbatches + lay["pp"] - 1) * r.case["model"]["num_layers"] / lay["pp"]
        out[(where, lay["tp"])].append((tokens / r.measured / per * 1e3, tokens / r.predicted / per * 1e3))
    return out


def main() -> None:
    rows = [r for r in load_rows() if "Playbook" in r["source"]]
    model = per_layer_ms(evaluate(rows, experts=False).rows)
    generic = engines.ENGINES["any"]
    engines.ENGINES["any"] = dataclasses.replace(generic, behaviour=dataclasses.replace(
        generic.behaviour, pipeline_collective_floor_s=0.0, pipeline_collective_floor_rank_s=0.0))
    gpu = per_layer_ms(evaluate(rows, experts=False).rows)
    engines.ENGINES["any"] = generic
    print("| where | tp | rows | measured ms | model ms | GPU ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for key in sorted(model):
        measured = statistics.median(m for m, _ in model[key])
        print(f"| {key[0]} | {key[1]} | {len(model[key])} | {measured:.1f} | "
              f"{statistics.median(p for _, p in model[key]):.1f} | {statistics.median(p for _, p in gpu[key]):.1f} |")


if __name__ == "__main__":
    main()
