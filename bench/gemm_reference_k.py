"""The K each GPU's fitted GEMM efficiencies hold at: ``Performance.gemm_reference_k`` (16-bit) and
``gemm_reference_k_fp8``.

    python bench/gemm_reference_k.py

The efficiencies in ``planner/presets/performance.yaml`` are fitted to the dense published runs of
a GPU type (``layout-planner validate-published``'s dev rows). A GEMM's rate goes as K/(K + K½)
(``cost_models.kernels.k_loop_efficiency``), so a fitted efficiency is the rate at the runs' mean
of 1/K, weighted by the FLOPs at each K: this prints that harmonic mean over every GEMM of each
run's layers (forward, input gradient over K = n, weight gradient over K = the tokens), per GPU
type and precision family (16-bit; fp8 and fp4 under a low-precision recipe).
"""

from __future__ import annotations

from collections import defaultdict

from cost_models.flops import layer_gemms
from planner.case import load_case
from planner.fidelity import evaluate
from planner.published_runs import case_of


def main() -> None:
    flops: dict = defaultdict(float)
    per_k: dict = defaultdict(float)
    runs: dict = defaultdict(int)
    for result in evaluate(experts=False).rows:
        data, _ = case_of(result.row)
        if not data:
            continue
        case = load_case(data)
        model, training, layout = case.model, case.training, case.layout
        if model.num_experts or layout is None:
            continue
        key = (case.cluster.gpu.name, "fp8" if training.recipe is not None else "16-bit")
        tokens = layout.micro_batch_size * training.seq_len / layout.cp
        for gemm in layer_gemms(model, tokens, layout.tp):
            for k in (gemm.k, gemm.n, gemm.m):  # forward, input gradient, weight gradient
                flops[key] += gemm.flops
                per_k[key] += gemm.flops / k
        runs[key] += 1
    print(f"{'GPU':16s} {'precision':9s} {'runs':>5s} {'K (FLOP-weighted harmonic mean)':>32s}")
    for key in sorted(flops):
        print(f"{key[0]:16s} {key[1]:9s} {runs[key]:5d} {flops[key] / per_k[key]:32,.0f}")


if __name__ == "__main__":
    main()
