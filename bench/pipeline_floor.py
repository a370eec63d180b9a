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

A third table asks what the floor scales with. Per micro-batch slot (the step over m + pp − 1), for
the stages whose pipeline neighbours are on another node at tp 2-8 and micro-batches of 1-4, it
sets the measured slot beside the GPU's (the estimate without the floors, its whole step over the
same slots), by tp and by the layers of the pipeline's fullest stage (``Job.stage_layers``, as
nanotron's own split cuts them); "scored" counts the rows not below half their job's best
(``planner.fidelity``'s throughput rows). It then fits the excess (measured − GPU) per tp two
ways, by medians: a cost per stage and micro-batch (what a blocking receive would add:
``P2P._recv_meta`` reads each received tensor's metadata back on the host, once per stage and
micro-batch), and a cost per layer (what ``tp_time.cross_domain_pipeline_floor`` prices); and prints
each one's median |error| on the slot.
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


def per_stage_slot_ms(measured_rows, bare_rows) -> dict:
    """{(tp, layers of the fullest stage): [(measured, GPU ms per slot, scored)]} for the Playbook's
    trusted rows whose pipeline neighbours are on another node, at tp 2-8 and micro-batches of 1-4
    (``measured_rows`` and ``bare_rows``: the same rows evaluated with and without the floors)."""
    best: dict[tuple, float] = defaultdict(float)
    for r in measured_rows:
        best[r.job] = max(best[r.job], r.measured or 0.0)
    gpu = {r.row["id"]: r.predicted for r in bare_rows}
    out = defaultdict(list)
    for r in measured_rows:
        lay, training = r.case["layout"], r.case["training"]
        if (r.row.get("trust") == "low" or not r.measured or lay["pp"] == 1 or not 1 < lay["tp"] <= 8
                or lay["micro_batch_size"] > 4):
            continue
        job = load_case(r.case).job()
        if group_links(job.cluster, job.layout, "pp").domains == 1:
            continue
        tokens = training["global_batch_size"] * training["seq_len"]
        slots = job.num_microbatches + lay["pp"] - 1
        out[(lay["tp"], max(job.stage_layers))].append(
            (tokens / r.measured / slots * 1e3, tokens / gpu[r.row["id"]] / slots * 1e3, r.measured * 2 >= best[r.job]))
    return out


def fit_errors(triples_by_layers: list[tuple[int, float, float]]) -> tuple[float, float, float, float]:
    """The two structures fitted to (layers, measured, GPU ms per slot) rows by medians (the sweep
    holds runs of one layout up to 5x apart, which a least-squares fit would chase): a cost per stage
    and micro-batch (the median excess), and a cost per layer (the median excess per layer); each
    constant and the median |error| of the slot it predicts (GPU + the cost) against the measured."""
    per_stage = statistics.median(m - g for _, m, g in triples_by_layers)
    per_layer = statistics.median((m - g) / layers for layers, m, g in triples_by_layers)
    error = lambda cost: statistics.median(abs(g + cost(layers) - m) / m  # noqa: E731
                                           for layers, m, g in triples_by_layers)
    return per_stage, error(lambda layers: per_stage), per_layer, error(lambda layers: per_layer * layers)


def stage_table(slots: dict) -> None:
    """The third table (the module's docstring) and, per tp, the two structures' fits and errors."""
    print("| tp | layers in the fullest stage | rows | scored | measured ms | GPU ms | excess ms "
          "| excess per layer ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (tp, layers), triples in sorted(slots.items()):
        measured = statistics.median(m for m, _, _ in triples)
        gpu = statistics.median(g for _, g, _ in triples)
        excess = statistics.median(m - g for m, g, _ in triples)
        print(f"| {tp} | {layers} | {len(triples)} | {sum(s for _, _, s in triples)} | {measured:.1f} | {gpu:.1f} | "
              f"{excess:.1f} | {excess / layers:.1f} |")
    print("\n| tp | rows | per stage and micro-batch | its median abs. error | per layer | its median abs. error |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for tp in sorted({tp for tp, _ in slots}):
        rows = [(layers, m, g) for (t, layers), triples in slots.items() if t == tp for m, g, _ in triples]
        stage, stage_error, layer, layer_error = fit_errors(rows)
        print(f"| {tp} | {len(rows)} | {stage:.1f} ms | {stage_error:.0%} | {layer:.1f} ms | {layer_error:.0%} |")


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
    slots = per_stage_slot_ms(evaluated, bare)
    engines.ENGINES["nanotron"] = generic
    table("| where | tp | rows | measured ms | model ms | GPU ms |", "| --- | ---: | ---: | ---: | ---: | ---: |",
          model, gpu)
    print("\nTensor parallelism across nodes\n")
    table("| model | tp | pipeline | micro-batch | rows | measured ms | model ms | GPU ms |",
          "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: |", model_across, gpu_across)
    print("\nPer micro-batch slot, by layers per stage (pipeline neighbours on another node)\n")
    stage_table(slots)


if __name__ == "__main__":
    main()
