"""What the report prints is what it means: values that look like markup are printed as they are,
counts keep their unit, and every parallel degree the layout has is named (issue 52)."""

from __future__ import annotations

import yaml

from cli_in_process import run_cli
from planner.report import _changes, count

SIXTEEN_K = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
             "training": {"global_batch_size": 128, "seq_len": 16384, "precision": "fp8", "engine": "megatron"},
             "layout": {"dp": 8, "tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"}}


def test_the_cheapest_change_names_its_modules(tmp_path):
    import planner
    from planner.estimate import remedies

    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(SIXTEEN_K))
    done = run_cli("estimate", str(path))
    assert done.returncode == 3
    est = planner.estimate(SIXTEEN_K)
    # A selective rung is named by its modules; the report gives the cheapest of the changes that fit.
    tried = {r.description: r for r in remedies(est.job, est.headroom)}
    assert tried["recompute selective (recompute_modules: [mlp])"].fits
    cheapest = est.remedy()
    assert f"cheapest next change: {cheapest.description} →" in " ".join(done.stdout.split())


def test_a_small_model_counts_in_millions(tmp_path):
    assert (count(162_200_000), count(8.03e9), count(1.2e12)) == ("162.2M", "8.0B", "1.2T")
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump({"model": {"num_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
                                              "vocab_size": 50257},
                                    "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
                                    "training": {"global_batch_size": 64, "seq_len": 1024},
                                    "layout": {"dp": 8, "micro_batch_size": 8}}))
    assert "(162.2M parameters)" in run_cli("estimate", str(path)).stdout


def test_a_change_to_an_unset_field_says_what_unset_means():
    assert _changes({"offload_optimizer": [1.0, None], "ep": [8, None]}) == "offload_optimizer 1.0→0, ep 8→1"


def test_the_plot_title_names_expert_parallelism():
    import planner
    from planner.plots import _layout_label

    est = planner.estimate({"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
                            "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"},
                            "layout": {"dp": 16, "tp": 2, "pp": 2, "ep": 8, "etp": 1, "micro_batch_size": 1,
                                       "zero_stage": 1, "sequence_parallel": True, "recompute": "full"}})
    assert "ep8" in _layout_label(est)


def test_deepep_is_emitted_only_where_the_expert_group_leaves_its_domain_and_then_said(tmp_path):
    """Mixtral 8x7B with ep 8 inside one 8-GPU node: DeepEP's dispatch saves nothing the model prices,
    so the all-to-all is written. DeepSeek-V3 with ep 32 over four nodes: the flex dispatcher is, and
    the files and the notes say it needs DeepEP."""
    import planner
    from planner.engines.megatron.emit import arguments

    inside = planner.estimate({"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
                               "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"},
                               "layout": {"dp": 8, "tp": 1, "pp": 4, "ep": 8, "etp": 1, "micro_batch_size": 1,
                                          "zero_stage": 1, "recompute": "full"}})
    assert inside.to_dict()["nvlink_domains_spanned"]["ep"] == 1
    assert dict(arguments(inside.job))["--moe-token-dispatcher-type"] == "alltoall"
    across = planner.estimate({"model": {"preset": "deepseek-v3"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 256},
                               "training": {"global_batch_size": 1024, "seq_len": 4096, "precision": "fp8",
                                            "engine": "megatron"},
                               "layout": {"dp": 32, "tp": 1, "pp": 8, "ep": 32, "etp": 1, "micro_batch_size": 1,
                                          "stage_layers": [7, 8, 8, 8, 8, 8, 8, 6],
                                          "zero_stage": 1, "recompute": "full"}})
    assert across.to_dict()["nvlink_domains_spanned"]["ep"] == 4
    assert dict(arguments(across.job))["--moe-token-dispatcher-type"] == "flex"
    emitted = planner.emit(across, "megatron", tmp_path, force_unfit=not across.fits)
    assert any("needs DeepEP" in note for note in emitted.notes)
    assert "needs DeepEP" in (tmp_path / "megatron_args.txt").read_text()


def test_the_host_row_names_its_unit(monkeypatch):
    """It read "45% of 275 used": 275 what? (GB of host memory a GPU has, cluster.host)."""
    from pathlib import Path

    monkeypatch.setenv("COLUMNS", "200")
    example = Path(__file__).resolve().parent.parent / "examples" / "llama3-70b-8-h100-deepspeed.yaml"
    done = run_cli("plan", str(example))
    assert "% of 275 GB a GPU used" in done.stdout, done.stdout


def test_the_step_copies_that_set_the_peak_are_said_and_a_host_overflow_named_in_the_advice(tmp_path):
    """Megatron's fp32 copy of its bf16 main grads (4 bytes a parameter of the stage at ZeRO 0) sets the
    peak of Llama 3 8B at tp 2 with full recomputation, in `other`: halving the micro-batch halved the
    activations and moved the peak not at all, with nothing said. And the advice for a layout whose
    offload overflows the host gave a GPU peak that fits with "still does not fit", not saying why."""
    import planner
    from cost_models.memory import job_stage_parameters

    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 8192, "precision": "bf16", "engine": "megatron"},
            "layout": {"tp": 2, "dp": 4, "micro_batch_size": 1, "zero_stage": 0, "recompute": "full",
                       "sequence_parallel": True}}
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case))
    est = planner.estimate(case)
    copies = 4 * job_stage_parameters(est.job, 0).total - 1.1 * est.peak.activations
    said = " ".join(run_cli("estimate", str(path)).stdout.split())
    assert f"note: other holds {copies / 1e9:.2f} GB of the optimizer step's gradient copies" in said

    offloaded = {"model": {"preset": "llama3-70b"},
                 "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8,
                             "host": {"memory": "150GB", "link_bandwidth": "50GB/s", "memory_bandwidth": "40GB/s"}},
                 "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16", "engine": "deepspeed"},
                 "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": 2, "offload_optimizer": 1.0,
                            "recompute": "full"}}
    path.write_text(yaml.safe_dump(offloaded))
    done = run_cli("estimate", str(path))
    assert done.returncode == 3
    assert "still does not fit: its offload overflows the host's memory" in " ".join(done.stdout.split())


def test_the_report_names_its_engine_its_pick_and_the_memory_its_verdict_holds_the_peak_to(tmp_path):
    """A newcomer read "best" over a faster runner-up, a capacity of 85.90 GB for an 80 GB H100 and a verdict
    against 84.0 GB usable that no row showed, and no engine named: the report says which engine's layout it
    is, calls the robust pick the pick, and gives the capacity in the GiB a GPU is sold in beside the memory
    the peak may use: the H100's 80 GiB less its 1 % headroom and the 1 GiB outside the allocator
    (case-reference.md: `search.headroom`, `overheads.cuda_context`), 83.97 GB."""
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump({**SIXTEEN_K, "training": {**SIXTEEN_K["training"], "seq_len": 4096}}))
    text = " ".join(run_cli("estimate", str(path)).stdout.split())
    assert "global batch 128 × 4096 tokens, as Megatron-LM runs it" in text
    assert "capacity (80 GiB) │ 85.90 │" in text and "usable by the peak │ 83.97 │" in text
    # A GPU of 3 GB holds 2.79 GiB, not "3 GiB".
    small = {**SIXTEEN_K, "model": {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000},
             "cluster": {"gpu": {"memory": "3 GB", "peak_tflops": {"bf16": 100, "fp32": 50}, "hbm_bandwidth": "1 TB/s",
                                 "intra_node_bandwidth": "100 GB/s", "inter_node_bandwidth": "10 GB/s",
                                 "gpus_per_node": 8, "nvlink_domain": 8}, "num_gpus": 8},
             "training": {**SIXTEEN_K["training"], "seq_len": 512, "precision": "bf16"}}
    path.write_text(yaml.safe_dump(small))
    assert "capacity (2.79 GiB) │ 3.00 │" in " ".join(run_cli("estimate", str(path)).stdout.split())
    case = {k: v for k, v in SIXTEEN_K.items() if k != "layout"}
    case["training"] = {**case["training"], "seq_len": 4096}
    path.write_text(yaml.safe_dump(case))
    planned = " ".join(run_cli("plan", str(path), "--engine", "any").stdout.split())
    assert "as plain PyTorch runs it" in planned and "│ pick │" in planned and "differs from the pick" in planned


def test_a_layout_no_change_can_be_made_to_says_where_to_go_on(tmp_path):
    """Llama 3.1 405B on eight A100s under DeepSpeed at micro-batch 1, full recomputation and ZeRO-3 with
    the optimizer and parameters offloaded: each change the advice tries is at its limit or one DeepSpeed
    refuses (AutoTP takes ZeRO ≤ 2, its pipeline ZeRO ≤ 1), and the report stopped at "does not fit".
    It says so and points at `plan`, which does say how many GPUs would fit."""
    import planner

    case = {"model": {"preset": "llama3.1-405b"}, "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 8},
            "training": {"global_batch_size": 8, "seq_len": 8192, "precision": "bf16", "engine": "deepspeed"},
            "layout": {"zero_stage": 3, "offload_optimizer": 1.0, "offload_params": True, "recompute": "full"}}
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case))
    done = run_cli("estimate", str(path))
    assert done.returncode == 3 and planner.estimate(case).remedy() is None
    text = " ".join(done.stdout.split())
    assert "does not fit" in text and "can be made to this layout as DeepSpeed runs it; `plan` searches" in text
    assert planner.plan(case).no_fit.gpus_that_fit is not None
