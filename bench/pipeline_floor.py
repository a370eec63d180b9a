"""The Playbook's tensor-parallel stages with pipeline neighbours in another node, measured and modelled.

    python bench/pipeline_floor.py

Per layer and micro-batch (a stage's step time over the micro-batches' slots, m + pp − 1 under
1F1B, and over the stage's layers), the median of the sweep's rows that are not marked low-trust,
at micro-batches of 1–4 and tensor parallelism within a node, by tp and by where the pipeline's
neighbours are: on another node (nanotron's rank order, tp then dp then pp, puts a stage's
neighbours tp·dp ranks away), on the same node, or no pipeline on several nodes. "model" is the
estimate as it stands; "GPU" is the same estimate without the generic engine's floors
(``EngineBehaviour.pipeline_collective_floor_s``, ``_rank_s`` and ``cross_domain_tp_rank_s`` at 0),
what the stage's work takes. A second table does the same for tensor parallelism across nodes (tp 16
and 32 on 8-GPU nodes), by model, by whether there is a pipeline and by micro-batch (1-4, 8 or more).
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


def per_layer_ms(rows, across: bool = False) -> dict:
    """{(where, tp): [(measured, predicted) ms per layer and micro-batch]} for the Playbook's rows;
    with ``across``, {(model, tp, pipeline or not, micro-batch): ...} for those whose tensor parallelism
    spans nodes."""
    out = defaultdict(list)
    for r in rows:
        lay, training = r.case["layout"], r.case["training"]
        if r.row.get("trust") == "low" or (lay["micro_batch_size"] > 4 and not across) or (lay["tp"] > 8) != across:
            continue
        job = load_case(r.case).job()
        if across:
            where = (r.case["model"]["name"].split(" ")[0], "pipeline" if lay["pp"] > 1 else "no pipeline",
                     "1-4" if lay["micro_batch_size"] <= 4 else "8 or more")
        elif lay["pp"] > 1:
            elsewhere = group_links(job.cluster, job.layout, "pp").domains > 1
            where = "pipeline neighbours on another node" if elsewhere else "pipeline neighbours on the node"
        elif r.row["num_gpus"] > job.cluster.gpu.nvlink_domain:
            where = "no pipeline, several nodes"
        else:
            continue
        tokens = training["global_batch_size"] * training["seq_len"]
        microbatches = training["global_batch_size"] // (lay["dp"] * lay["micro_batch_size"])
        per = (microbatches + lay["pp"] - 1) * r.case["model"]["num_layers"] / lay["pp"]
        key = (where[0], lay["tp"], *where[1:]) if across else (where, lay["tp"])
        out[key].append((tokens / r.measured / per * 1e3, tokens / r.predicted / per * 1e3))
    return out


def medians(pairs) -> tuple[float, float]:
    return statistics.median(m for m, _ in pairs), statistics.median(p for _, p in pairs)


def table(header: str, rule: str, model: dict, gpu: dict) -> None:
    """One row per key (its parts, then rows, measured, model and GPU ms)."""
    print(header)
    print(rule)
    for key in sorted(model):
        measured, predicted = medians(model[key])
        print(f"| {' | '.join(str(part) for part in key)} | {len(model[key])} | {measured:.1f} | {predicted:.1f} | "
              f"{medians(gpu[key])[1]:.1f} |")


def main() -> None:
    rows = [r for r in load_rows() if "Playbook" in r["source"]]
    evaluated = evaluate(rows, experts=False).rows
    model, model_across = per_layer_ms(evaluated), per_layer_ms(evaluated, across=True)
    generic = engines.ENGINES["nanotron"]
    engines.ENGINES["nanotron"] = dataclasses.replace(generic, behaviour=dataclasses.replace(
        generic.behaviour, pipeline_collective_floor_s=0.0, pipeline_collective_floor_rank_s=0.0,
        cross_domain_tp_rank_s=0.0))
    bare = evaluate(rows, experts=False).rows
    gpu, gpu_across = per_layer_ms(bare), per_layer_ms(bare, across=True)
    engines.ENGINES["nanotron"] = generic
    table("| where | tp | rows | measured ms | model ms | GPU ms |", "| --- | ---: | ---: | ---: | ---: | ---: |",
          model, gpu)
    print("\nTensor parallelism across nodes\n")
    table("| model | tp | pipeline | micro-batch | rows | measured ms | model ms | GPU ms |",
          "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: |", model_across, gpu_across)


if __name__ == "__main__":
    main()
