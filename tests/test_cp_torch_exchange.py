"""Context parallelism as torch runs it, measured on CPU with gloo (4 ranks): the collectives torch
2.13's own code issues per layer, forward and backward, against ``stage_time.cp_torch_collectives``.

- "kv_gather": torch's ``flex_cp_allgather`` (torchtitan 0.3.0's FlexAttention with cp): all_gather_single
  of K, then V; backward reduce_scatter_single of their gradients.
- "allgather" / "alltoall": torch's ring attention (``_templated_ring_attention`` and its backward) under
  each ``set_rotate_method``: one all-gather of the K/V shards, or cp − 1 permutes, in forward and again in
  backward, plus cp permutes of the K/V gradients in fp32.

Then what the planner does with it: the emitted torchtitan files pin FlexAttention (the exchange priced),
and diagnose prices a torchtitan 0.2 job file by the rotate method it names.
"""

from __future__ import annotations

import json
from dataclasses import replace
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from cost_models.specs import ModelSpec, TrainingSpec  # noqa: E402
from cost_models.step_time import step_time  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CP, BATCH, KV_HEADS, HEADS, HEAD_DIM, LOCAL_SEQ = 4, 2, 2, 4, 16, 8

MEASURE = textwrap.dedent(f"""
    import json, os, torch, torch.distributed as dist
    import torch.distributed._functional_collectives as ft_c
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention
    from torch.distributed.tensor.experimental._context_parallel import _cp_custom_ops  # registers cplib ops

    dist.init_process_group("gloo")
    group, world = dist.group.WORLD, dist.get_world_size()
    seen = []
    real_gather, real_scatter, real_permute = ft_c.all_gather_single, ft_c.reduce_scatter_single, ft_c.permute_tensor

    def gather(t, *a, **k):
        seen.append(["all_gather", t.numel() * t.element_size() * world])
        return real_gather(t, *a, **k)

    def scatter(t, *a, **k):
        seen.append(["reduce_scatter", t.numel() * t.element_size()])
        return real_scatter(t, *a, **k)

    def permute(t, *a, **k):
        seen.append(["permute", t.numel() * t.element_size()])
        return real_permute(t, *a, **k)

    ft_c.all_gather_single, ft_c.reduce_scatter_single, ft_c.permute_tensor = gather, scatter, permute
    torch.manual_seed(dist.get_rank())
    B, KV, H, D, S = {BATCH}, {KV_HEADS}, {HEADS}, {HEAD_DIM}, {LOCAL_SEQ}
    out = {{}}

    # FlexAttention's K/V gather (B, S, heads, D: torchtitan gathers along dim 1).
    k = torch.randn(B, S, KV, D, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, S, KV, D, dtype=torch.bfloat16, requires_grad=True)
    seen.clear()
    gk, gv = torch.ops.cplib.flex_cp_allgather(k, v, 1, dist._get_process_group_name(group))
    forward = list(seen)
    (gk.float().sum() + gv.float().sum()).backward()
    out["kv_gather"] = {{"forward": forward, "backward": seen[len(forward):]}}

    # The same gather and the attention that keeps its output, inside torch's checkpoint (what
    # torchtitan's full activation checkpoint wraps each block in): the backward runs the forward
    # again to rebuild what the attention saved, and the gathers with it.
    from torch.utils.checkpoint import checkpoint
    q = torch.randn(B, H, S, D, dtype=torch.bfloat16, requires_grad=True)

    def attention(q, k, v):
        gk, gv = torch.ops.cplib.flex_cp_allgather(k, v, 1, dist._get_process_group_name(group))
        return torch.nn.functional.scaled_dot_product_attention(q, gk.transpose(1, 2), gv.transpose(1, 2),
                                                                enable_gqa=True)

    seen.clear()
    o = checkpoint(attention, q, k, v, use_reentrant=False)
    forward = list(seen)
    o.float().sum().backward()
    out["kv_gather_recomputed"] = {{"forward": forward, "backward": seen[len(forward):]}}

    # torch's ring attention (B, heads, S, D; seq_dim 2), causal and load-balanced, on CPU's flash kernels.
    fwd_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    bwd_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    for method in ("allgather", "alltoall"):
        cp_attention.set_rotate_method(method)
        q = torch.randn(B, KV, S, D, dtype=torch.bfloat16)
        k = torch.randn(B, KV, S, D, dtype=torch.bfloat16)
        v = torch.randn(B, KV, S, D, dtype=torch.bfloat16)
        seen.clear()
        o, lse, *_ = cp_attention._templated_ring_attention(group, 2, fwd_op, q, k, v, is_causal=True)
        forward = list(seen)
        seen.clear()
        cp_attention._templated_ring_attention_backward(group, 2, bwd_op, torch.ones_like(o), "grad_out", q, k, v,
                                                        o, lse, is_causal=True, dropout_p=0.0)
        out[method] = {{"forward": forward, "backward": list(seen)}}
    if dist.get_rank() == 0:
        print(json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # The measurement is done; a rank's interpreter teardown can still abort in a C++ destructor ("terminate
    # called without an active exception", SIGABRT: 2 runs in 6 beside another job), failing the launch: leave
    # without it.
    os._exit(0)
""")


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    script = tmp_path_factory.mktemp("cp") / "measure.py"
    script.write_text(MEASURE)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={CP}",
                          str(script)], capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def planned(exchange: str) -> dict:
    """What the model says each rank issues for the measured shape: GQA K and V of KV_HEADS heads."""
    from cost_models.stage_time import cp_torch_collectives

    model = ModelSpec("cp", num_layers=1, hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                      num_kv_heads=KV_HEADS, vocab_size=1)
    training = TrainingSpec(global_batch_size=BATCH, seq_len=CP * LOCAL_SEQ, precision="bf16")
    passes = cp_torch_collectives(model, training, 1, CP, BATCH, exchange)
    return {name: [[kind, size] for kind, size in ops] for name, ops in passes.items()}


@pytest.mark.parametrize("exchange", ["kv_gather", "allgather", "alltoall"])
def test_the_collectives_torch_issues_per_layer_are_the_ones_priced(measured, exchange):
    """Kinds, order and bytes (full buffer for the collectives, one rank's send for a permute) of what
    torch's code issues at cp 4: e.g. the ring's backward rotates the K/V gradients cp times in fp32,
    4 bytes each where K and V are bf16, which the p2p ring priced before as cp − 1 bf16 passes."""
    assert measured[exchange] == planned(exchange)


def test_a_recomputed_forward_runs_the_exchange_again(measured):
    """Under torch's checkpoint the backward re-runs the forward's K/V gathers before the gradients'
    reduce-scatters: measured, forward then backward, against the collectives priced."""
    plan = planned("kv_gather")
    assert measured["kv_gather_recomputed"] == {"forward": plan["forward"],
                                                "backward": plan["forward"] + plan["backward"]}


def _cp8_job(tmp_path):
    """llama3-8b at cp 8 on 64 H100s, seq 65536, as diagnose reads a torchtitan 0.2 job file."""
    from planner.diagnose import diagnose
    from tests.test_diagnose_torchtitan import LLAMA3_8B_TOML, case_of

    path = tmp_path / "cp.toml"
    path.write_text(LLAMA3_8B_TOML.replace("context_parallel_degree = 1", "context_parallel_degree = 8")
                    .replace("seq_len = 8192", "seq_len = 65536"))
    return diagnose(case_of("llama3-8b", 64, 8, 65536), torchtitan=path).estimate.job


def _cp_comm(job, **layout) -> float:
    from cost_models.stage_time import stage_time

    return stage_time(replace(job, layout=replace(job.layout, **layout)), 0).cp_comm


def test_full_recomputation_gathers_k_and_v_once_more(tmp_path):
    """torchtitan 0.3's FlexAttention gather under full activation checkpointing: each recomputed layer
    waits for its K and V all-gathers again (measured above), nothing hiding them, so the stage's cp time
    grows by layers × the two all-gathers' time. It was priced the same with and without recomputation."""
    from cost_models.collectives import collective_time
    from cost_models.stage_time import cp_torch_collectives
    from cost_models.topology import cp_group_links

    job = _cp8_job(tmp_path)
    job = replace(job, training=replace(job.training, cp_exchange="kv_gather"))
    lay = job.layout
    links = cp_group_links(job.cluster, lay.tp, lay.cp)
    gathers = cp_torch_collectives(job.model, job.training, lay.tp, lay.cp, lay.micro_batch_size, "kv_gather")
    forward = sum(collective_time(kind, size, links, job.cluster.gpu.performance) for kind, size in gathers["forward"])
    grown = _cp_comm(job, recompute="full", recompute_num_layers=None) - _cp_comm(job, recompute="none",
                                                                                  recompute_num_layers=None)
    assert forward > 0
    assert grown == pytest.approx(job.stage_layers[0] * forward, rel=1e-9)


@pytest.mark.parametrize("exchange", ["allgather", "alltoall", "p2p"])
def test_a_recomputed_attention_runs_its_forward_exchange_again(exchange, tmp_path):
    """Full recomputation re-runs each layer's forward, and Megatron's selective ``core_attn`` re-runs
    the core attention (``_checkpointed_attention_forward`` wraps ``core_attention``, Transformer
    Engine's DotProductAttention, which runs the cp ring): both add layers × the forward's exposed
    exchange to the stage's cp time, and nothing more."""
    from cost_models.layer_time import layer_time
    from cost_models.stage_time import cp_exposed_passes
    from planner.engines.megatron.engine import BEHAVIOUR as MEGATRON

    job = _cp8_job(tmp_path)
    job = replace(job, training=replace(job.training, cp_exchange=exchange))
    lay = job.layout
    forward, _ = cp_exposed_passes(job.model, job.training, job.cluster, lay.tp, lay.cp, lay.micro_batch_size,
                                   layer_time(job).core)
    none = _cp_comm(job, recompute="none", recompute_num_layers=None)
    assert forward > 0
    assert _cp_comm(job, recompute="full", recompute_num_layers=None) - none == pytest.approx(
        job.stage_layers[0] * forward, rel=1e-9)
    megatron = replace(job, training=replace(job.training, engine=MEGATRON))
    forward, _ = cp_exposed_passes(job.model, megatron.training, job.cluster, lay.tp, lay.cp, lay.micro_batch_size,
                                   layer_time(megatron).core)
    attention = _cp_comm(megatron, recompute="selective", recompute_modules=("core_attn",), recompute_num_layers=None)
    assert attention - _cp_comm(megatron, recompute="none", recompute_num_layers=None) == pytest.approx(
        job.stage_layers[0] * forward, rel=1e-9)


CASE = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
        "training": {"global_batch_size": 32, "seq_len": 32768},
        "search": {"target": "torchtitan", "cp": 2}}


def test_the_emitted_files_pin_the_attention_whose_exchange_was_priced(tmp_path):
    """torchtitan 0.3.0 runs cp as FlexAttention's K/V gather, llama3's registry default: the emitted
    config names flex with cp (ATTN_BACKEND was None, so a registry whose default moved to SDPA's ring
    or varlen would have run another exchange), and diagnose reads the files back to the plan's price."""
    import planner
    from planner.configs import render
    from planner.diagnose import diagnose
    from planner.engines.torchtitan import emit
    from planner.files import Output, write_all

    best = planner.plan(CASE, top_k=0).best
    assert best.job.layout.cp == 2
    files, _ = render(best, "torchtitan", "<generated>")
    assert "ATTN_BACKEND = 'flex'" in files[emit.CONFIG_FILE]
    write_all([Output(tmp_path / name, text) for name, text in files.items()], force=False)
    for name in (emit.CONFIG_FILE, emit.OVERRIDES_FILE):
        read = diagnose({k: v for k, v in CASE.items() if k != "search"}, torchtitan=tmp_path / name).estimate
        assert read.step_time_s == best.step_time_s, name


def test_a_0_2_job_file_is_priced_by_the_rotate_method_it_names(tmp_path):
    """torchtitan 0.2 runs SDPA, so its cp is torch's ring attention under the file's rotate method: the
    default allgather hides its one gather behind the first ring step only, alltoall each permute behind
    its own step. Both were priced as Megatron's p2p ring, one price for two runs."""
    from planner.diagnose import diagnose
    from tests.test_diagnose_torchtitan import LLAMA3_8B_TOML, case_of

    # cp 8 (at cp 2 one gather and one permute are the same shard), local batch 1 over dp 8, a sequence
    # long enough that seven shards take longer than the first of the eight ring steps.
    case = case_of("llama3-8b", 64, 8, 65536)
    priced = {}
    for method in ("allgather", "alltoall", None):
        path = tmp_path / f"{method}.toml"
        said = f'\ncontext_parallel_rotate_method = "{method}"' if method else ""
        path.write_text(LLAMA3_8B_TOML.replace("context_parallel_degree = 1", "context_parallel_degree = 8" + said)
                        .replace("seq_len = 8192", "seq_len = 65536"))
        estimate = diagnose(case, torchtitan=path).estimate
        assert estimate.job.layout.cp == 8 and estimate.job.training.cp_exchange == (method or "allgather")
        priced[method] = estimate.time.cp_comm_s
        # Megatron's ring, as it was priced: K/V gradients in the activations' dtype, cp − 1 passes, all
        # hidden but the latency, where torch's rotate them in fp32 cp times, the last one unhidden.
        ring = replace(estimate.job, training=replace(estimate.job.training, cp_exchange="p2p"))
        assert priced[method] > step_time(ring).cp_comm_s
    # The one gather hides behind the first step only, the permutes each behind its own: never less
    # exposed (here the same: 8k tokens a step hide both on NVLink).
    assert priced[None] == priced["allgather"] >= priced["alltoall"] * (1 - 1e-12)
