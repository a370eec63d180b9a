"""What each fact the repo writes into its published cases, beyond `score.py`'s, does to the scores.

    python bench/case_facts.py [--experts]

`planner/published_runs.py` writes each published row as its users ran it, with facts the rows
publish that `../shared/validation/score.py` leaves out (docs/fidelity.md, "Fidelity against published
runs"). This scores the same model on the repo's rows written four ways: with every fact, with
none (as `score.py` writes them), with none but one, and with all but one. It prints Markdown:
the Playbook's, Megatron-Bridge's and NeMo AutoModel's throughput error, the mean over sources,
the sweeps' median regret and rank correlation, and with --experts the median gain plan claims
over tuned recipes (a few minutes more).
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack, contextmanager
from unittest import mock

from planner import published_runs as pr
from planner.fidelity import evaluate


def _zero_stage_without_fsdp_ranks(row: dict) -> int:
    fsdp = row["parallel"].get("fsdp")
    if isinstance(fsdp, int) and not isinstance(fsdp, bool):
        row = {**row, "parallel": {**row["parallel"], "fsdp": None}}
    return ZERO_STAGE(row)


ZERO_STAGE = pr.zero_stage
# Each fact, and what `score.py` writes in its place.
FACTS = {
    "nanotron's tied embeddings": ("tied_embeddings", lambda row: row["source"].startswith(pr.TIED)
                                   and "Llama" not in str(row["model"].get("name"))),
    "the Playbook's EFA": ("efa_fabric", lambda row, gpu: None),
    "BLOOM's Omni-Path": ("SOURCE_FABRICS", {}),
    "BLOOM's dropout": ("DROPOUT", tuple(s for s in pr.DROPOUT if s != "bigscience")),
    "nanotron's fp32 gradients": ("FP32_GRADIENT_FRAMEWORKS", ()),
    "BLOOM's fp32 gradients": ("BF16_OPTIMIZER_SOURCES", ()),
    "Qwen3's head width": ("head_dim", lambda md: None),
    "AutoModel's FSDP2 (ZeRO-3)": ("zero_stage", _zero_stage_without_fsdp_ranks),
    "AutoModel's DeepEP": ("runs_deepep", lambda row: False),
    "AutoModel's pure bf16": ("master_weights", lambda row: None),
    "AutoModel's Qwen3 checkpointing": ("AUTOMODEL_CHECKPOINTED", ()),
    "AutoModel's TE attention": ("fused_attention", lambda row: None),
    "torchtitan's compiled loss": ("TORCHTITAN_COMPILES_LOSS", {}),
    "torchao's power-limited B200s": ("POWER_LIMITED_CLOCK", {}),
    "Megatron-Bridge's recipe settings": ("recipe_settings", lambda row: {}),
    "Megatron-Bridge's recompute modules": ("recompute_modules", lambda row: None),
    "Megatron-Bridge's quantized weights": ("bridge_param_gather", lambda row, prec: None),
    "DeepSeek-V3's MTP module": ("mtp_layers", lambda row, model: 0),
    "DeepSeek-V3's node-limited routing": ("router_groups", lambda md: {}),
    "Megatron-Bridge's token drop": ("token_drop_capacity", lambda row: None),
}


@contextmanager
def without(facts):
    with ExitStack() as stack:
        for name in facts:
            attribute, replacement = FACTS[name]
            stack.enter_context(mock.patch.object(pr, attribute, replacement))
        yield


def scores(experts: bool) -> list[str]:
    f = evaluate(experts=experts)
    t = f.throughput
    cells = [t["The Ultra-Scale Playbook: Training LLM"].mean_abs, t["Megatron-Bridge performance summary"].mean_abs,
             t["NeMo AutoModel performance summary"].mean_abs, sum(s.mean_abs for s in t.values()) / len(t),
             f.median_regret]
    out = [f"{c:.1%}" for c in cells] + [f"{f.median_rho:+.2f}"]
    return out + ([f"{f.median_gain:+.1%}"] if experts else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", action="store_true", help="also plan the tuned recipes (slower)")
    experts = parser.parse_args().experts
    head = ["cases", "Playbook", "Megatron-Bridge", "AutoModel", "mean over sources", "median regret", "median rho"]
    head += ["median claimed gain"] if experts else []
    print("| " + " | ".join(head) + " |\n|" + " --- |" + " ---: |" * (len(head) - 1))
    rows = [("every fact", ()), ("no fact (as score.py writes them)", tuple(FACTS))]
    rows += [(f"only {name}", tuple(n for n in FACTS if n != name)) for name in FACTS]
    rows += [(f"all but {name}", (name,)) for name in FACTS]
    for label, removed in rows:
        with without(removed):
            print(f"| {label} | " + " | ".join(scores(experts)) + " |", flush=True)


if __name__ == "__main__":
    main()
