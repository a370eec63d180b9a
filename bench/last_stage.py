"""The pipeline stage that holds the loss in Megatron-Bridge's DeepSeek-V3 recipes: the room their
layouts leave it, against what the model prices it at.

    python bench/last_stage.py

Each recipe whose case gives its pipeline layout (``layout.chunk_layers``: the perf scripts'
``pipeline_model_parallel_layout``, whose last chunk holds the MTP module, where there is one, and the
loss) is listed once per GPU and layout, with the containers that ran it. Stage s holds chunks s,
s + pp, ...; "layers" counts their decoder layers (``Job.stage_layers``). The recipe's room for the last stage's extra
work (the MTP layer and its projection, the LM head and the MTP's own head, the losses) is the
decoder layers a full middle stage (with two stages, the first) holds beyond the last stage's:
what a balanced split gives it.
The model's price for that work is the last stage's compute per micro-batch beyond its own layers',
over one MoE layer's (``stage_time.stage_time``, ``layer_time.moe_layer_time``: forward and
backward, recomputation apart). The last column is the last stage's compute over a middle stage's.
"""

from __future__ import annotations

from collections import defaultdict

from cost_models.layer_time import moe_layer_time
from cost_models.stage_time import stage_time
from planner.case import load_case
from planner.errors import CaseError
from planner.published_runs import case_of, load_rows


MODELS = ("DeepSeek-V3",)


def main() -> None:
    recipes: dict[tuple, list[str]] = defaultdict(list)
    jobs = {}
    for row in load_rows():
        if not row["source"].startswith("Megatron-Bridge") or row["model"].get("name") not in MODELS:
            continue
        case, _ = case_of(row)
        if case is None or not case["layout"].get("chunk_layers"):
            continue
        try:
            job = load_case(case).job()
        except CaseError:  # a published layout the GPU count cannot hold (the failed row of the fidelity table)
            continue
        lay = case["layout"]
        key = (row["model"]["name"], case["cluster"]["gpu"], case["training"]["precision"],
               "yes" if case["model"].get("mtp_layers") else "no", lay["pp"], lay.get("vpp", 1),
               lay["micro_batch_size"], tuple(lay["chunk_layers"]))
        recipes[key].append(row["id"].split("_")[1])
        jobs[key] = job
    print("| model | GPU | precision | MTP | pp × vpp, micro-batch | layers per stage (first, middle, last) "
          "| containers | recipe's room (layers) | model's price (layers) | last / middle stage |")
    print("| --- | --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |")
    for key, releases in sorted(recipes.items()):
        job = jobs[key]
        pp, layers = job.layout.pp, job.stage_layers
        middle = pp // 2 if pp > 2 else 0
        layer = moe_layer_time(job)
        per_layer = layer.forward + layer.backward
        last, mid = stage_time(job, pp - 1).compute, stage_time(job, middle).compute
        price = (last - layers[-1] * per_layer) / per_layer
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {pp} × {key[5]}, {key[6]} "
              f"| {layers[0]}, {layers[middle]}, {layers[-1]} "
              f"| {', '.join(sorted(set(releases)))} | {layers[middle] - layers[-1]} | {price:.1f} "
              f"| {last / mid:.2f} |")


if __name__ == "__main__":
    main()
