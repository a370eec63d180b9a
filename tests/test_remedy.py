"""`estimate`'s cheapest next change for a layout that does not fit: of the single changes that keep
the global batch and fit, the one whose step is the shortest (docs/commands.md). It was the first of
a fixed order (micro-batch, recomputation, ZeRO, TP, PP, offload), selective recomputation before
full of a few layers: on Llama 3 70B at 16k tokens it advised recomputing every layer's MLP, 23 %
slower, where ZeRO-2 fits as well for 5 %."""

from __future__ import annotations

import planner
from planner.case import layout_to_mapping

LLAMA3_70B_16K = {
    "model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
    "training": {"global_batch_size": 64, "seq_len": 16384, "precision": "bf16", "engine": "megatron"},
    "layout": {"dp": 8, "tp": 8, "pp": 1, "micro_batch_size": 1, "zero_stage": 1, "sequence_parallel": True,
               "recompute": "none"}}


def _changed(case: dict, **changes) -> planner.Estimate:
    return planner.estimate({**case, "layout": {**case["layout"], **changes}})


def test_the_cheapest_change_is_the_fitting_one_with_the_shortest_step():
    est = planner.estimate(LLAMA3_70B_16K)
    assert not est.fits
    remedy = est.remedy()
    again = planner.estimate({**LLAMA3_70B_16K, "layout": layout_to_mapping(remedy.layout)})
    assert again.fits and again.step_time_s == remedy.step_time_s
    # Single changes a user would try, each re-estimated: none that fits steps faster.
    others = [_changed(LLAMA3_70B_16K, recompute="selective", recompute_modules=["mlp"]),
              _changed(LLAMA3_70B_16K, recompute="selective"),
              _changed(LLAMA3_70B_16K, recompute="full"),
              _changed(LLAMA3_70B_16K, recompute="full", recompute_num_layers=40),
              _changed(LLAMA3_70B_16K, zero_stage=2),
              _changed(LLAMA3_70B_16K, zero_stage=3)]
    fitting = [o for o in others if o.fits]
    assert len(fitting) >= 3
    assert remedy.step_time_s <= min(o.step_time_s for o in fitting) + 1e-9


def test_full_recomputation_of_the_fewest_layers_is_tried():
    """Meta's Llama 3.1 405B layout without its recomputation: a few whole layers of each stage
    recomputed fit, and that count is the fewest that does (one step of vpp fewer does not)."""
    import yaml
    from pathlib import Path

    case = yaml.safe_load((Path(__file__).resolve().parent.parent / "examples"
                           / "llama3.1-405b-meta-layout.yaml").read_text())
    case["layout"]["recompute"] = "none"
    from planner.estimate import remedies

    est = planner.estimate(case)
    assert not est.fits
    partial = [r for r in remedies(est.job, est.headroom) if r.layout.recompute_num_layers]
    assert len(partial) == 1 and partial[0].fits
    layers = partial[0].layout.recompute_num_layers
    assert layers % 2 == 0 and 0 < layers < 8  # per stage, in steps of vpp 2, short of all 8
    assert _changed(case, recompute="full", recompute_num_layers=layers).fits
    assert layers == 2 or not _changed(case, recompute="full", recompute_num_layers=layers - 2).fits
    assert est.remedy().step_time_s <= partial[0].step_time_s


def test_torchtitans_offload_is_advised_as_it_runs_it_with_the_parameters():
    """torchtitan offloads the optimizer only with the parameters (training.enable_cpu_offload, FSDP2's
    CPUOffloadPolicy): the advice tried the optimizer alone, which torchtitan refuses, and said no
    single change fits Llama 3 70B on 8 H100s, where the offload fits. Applied, the change is what the
    advice said."""
    case = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 32, "seq_len": 4096, "precision": "bf16", "engine": "torchtitan"},
            "layout": {"tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 3, "recompute": "full"}}
    est = planner.estimate(case)
    assert not est.fits
    remedy = est.remedy()
    assert remedy is not None and remedy.fits
    assert (remedy.layout.offload_optimizer, remedy.layout.offload_params) == (1.0, True)
    again = planner.estimate({**case, "layout": layout_to_mapping(remedy.layout)})
    assert again.fits and again.step_time_s == remedy.step_time_s and again.peak.total == remedy.peak_bytes


def test_changes_made_together_are_counted_as_changes_not_as_fields():
    """Mixtral 8x7B on 64 H100s at micro-batch 4, ZeRO-0, no recomputation: no single change fits, and
    the fewest that do are two, selective recomputation of the layer norms and the experts with ZeRO-3
    (each one re-estimated here fits, and neither alone does). Selective recomputation with a module set
    writes two fields, `recompute` and `recompute_modules`: the remedy was said as "the fewest that fit
    together (3)", three changes where the search had stopped at two."""
    import io

    from rich.console import Console

    from planner.report import print_estimate

    case = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "bf16", "optimizer": "adamw",
                         "engine": "megatron"},
            "layout": {"tp": 1, "pp": 1, "micro_batch_size": 4, "zero_stage": 0, "recompute": "none"}}
    est = planner.estimate(case)
    remedy = est.remedy()
    assert not est.fits and remedy is not None and remedy.fits
    modules = list(remedy.layout.recompute_modules)
    assert (remedy.layout.recompute, remedy.layout.zero_stage) == ("selective", 3) and "moe" in modules
    together = _changed(case, recompute="selective", recompute_modules=modules, zero_stage=3)
    assert together.fits and together.step_time_s == remedy.step_time_s
    assert not _changed(case, recompute="selective", recompute_modules=modules).fits
    assert not _changed(case, zero_stage=3).fits
    assert remedy.together == (f"recompute none→selective, recompute_modules default→{','.join(modules)}",
                               "zero_stage 0→3")
    out = io.StringIO()
    print_estimate(est, Console(file=out, width=10_000))
    assert "no single change fits; the fewest that fit together (2): recompute none→selective" in out.getvalue()


def test_estimate_json_carries_the_change_the_text_advises(tmp_path):
    """`estimate --json` of a layout that does not fit said nothing of what to change, where the text
    names its cheapest next change: the JSON carries that change, whose layout, estimated, gives the
    peak and step it states; a layout that fits has none."""
    import json

    import yaml
    from cli_in_process import run_cli

    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(LLAMA3_70B_16K))
    text, done = run_cli("estimate", str(path)), run_cli("estimate", str(path), "--json")
    assert done.returncode == text.returncode == 3
    change = json.loads(done.stdout)["cheapest_change"]
    assert f"cheapest next change: {change['change']} →" in " ".join(text.stdout.split())
    again = planner.estimate({**LLAMA3_70B_16K, "layout": change["layout"]})
    assert change["fits"] and again.fits and change["memory_verdict"] == again.memory_verdict
    assert (change["peak_bytes"], change["step_time_s"]) == (round(again.peak.total), again.step_time_s)
    assert again.to_dict()["cheapest_change"] is None
