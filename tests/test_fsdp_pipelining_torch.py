"""FSDP2 as torchtitan 0.3.0 runs it, measured on CPU with gloo: what the torchtitan engine prices.

- Under a pipeline (torch.distributed.pipelining's PipelineStage and Schedule1F1B, 2 stages of 2
  FSDP ranks each, bf16 parameters, fp32 reduction, 4 micro-batches) every rank holds its whole
  stage's gradients unsharded in fp32 and every unit gathered until the schedule's REDUCE_GRAD:
  the stage turns gradient sync and resharding after backward off for every backward.
- At zero_stage 0 torchtitan still applies fully_shard, over (dp_replicate, dp_shard = 1): each
  micro-batch's backward all-reduces every gradient in fp32 (its train step never turns sync off).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

import planner  # noqa: E402
from cost_models.memory import job_stage_parameters  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

PIPELINE = textwrap.dedent("""
    import json, os, torch, torch.nn as nn, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import Schedule1F1B

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    pp_rank, H = mesh["pp"].get_local_rank(), 128

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))

    model = nn.Sequential(*[Block() for _ in range(2)])
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model:
        fully_shard(block, mesh=mesh["dp"], mp_policy=policy, reshard_after_forward=True)
    fully_shard(model, mesh=mesh["dp"], mp_policy=policy, reshard_after_forward=True)
    stage = PipelineStage(model, pp_rank, 2, torch.device("cpu"), group=mesh["pp"].get_group())
    seen = {}

    def held():
        params = [p for block in model for p in block._get_fsdp_state()._fsdp_param_group.fsdp_params]
        grads = [p.unsharded_accumulated_grad for p in params if p.unsharded_accumulated_grad is not None]
        return {"grad_bytes": sum(g.numel() * g.element_size() for g in grads),
                "unsharded_params": sum(p.sharded_state.name == "UNSHARDED" for p in params),
                "params": len(params)}

    reduce_grad = PipelineStage.perform_reduce_grad

    def watched(self, *args):
        seen["before"] = held()
        out = reduce_grad(self, *args)
        seen["after"] = held()
        return out

    PipelineStage.perform_reduce_grad = watched
    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=lambda out, target: out.float().pow(2).mean(),
                            scale_grads=False)
    if pp_rank == 0:
        schedule.step(torch.randn(8, 4, H))
    else:
        schedule.step(target=torch.zeros(8, 4, H), losses=[])
    seen["stage_params"] = sum(p.numel() for p in model.parameters())  # DTensors: the unsharded size
    if dist.get_rank() == 0:
        print(json.dumps(seen), flush=True)
    dist.barrier()
    os._exit(0)  # measured: no teardown, which aborted now and then under FSDP2 (see torchrun below)
""")

REPLICATED = textwrap.dedent("""
    import json, os, torch, torch.nn as nn, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp_replicate", "dp_shard"))
    model = nn.Sequential(*[nn.Linear(128, 128) for _ in range(4)])
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    reduced, all_reduce = [], dist.all_reduce

    def counted(tensor, *args, **kwargs):
        reduced[-1] += tensor.numel() * tensor.element_size()
        return all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counted
    for _ in range(4):  # four micro-batches, as Trainer.train_step accumulates them
        reduced.append(0)
        model(torch.randn(8, 128)).float().pow(2).mean().backward()
    held = next(model.parameters())
    if dist.get_rank() == 0:
        print(json.dumps({"reduced_bytes": reduced, "params": sum(p.numel() for p in model.parameters()),
                          "held_dtype": str(held.dtype)}), flush=True)
    dist.barrier()
    os._exit(0)  # measured: no teardown, which aborted now and then under FSDP2 (see torchrun below)
""")


def torchrun(script: str, ranks: int, tmp_path: Path) -> dict:
    """The JSON rank 0 prints, run under torchrun on ``ranks`` CPU ranks. The workers end with
    os._exit once measured: torch 2.13's gloo teardown after FSDP2 aborted one run in 8-15 under load
    ("terminate called without an active exception", the measurement printed before it), and
    failed the suite from a fresh clone."""
    path = tmp_path / "worker.py"
    path.write_text(script)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                          str(ranks), str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(next(line for line in run.stdout.splitlines() if line.startswith("{")))


def torchtitan_case(pp: int, zero_stage: int, global_batch: int = 8) -> dict:
    return {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 2 * pp},
            "training": {"global_batch_size": global_batch, "seq_len": 4096, "engine": "torchtitan"},
            "layout": {"dp": 2, "pp": pp, "zero_stage": zero_stage, "micro_batch_size": 1, "recompute": "full"}}


@pytest.mark.slow  # two torchrun jobs of 4 and 2 CPU ranks
def test_fsdp2_under_a_pipeline_holds_the_stages_gradients_whole_in_fp32_until_reduce_grad(tmp_path):
    seen = torchrun(PIPELINE, 4, tmp_path)
    whole_fp32 = 4 * seen["stage_params"]  # what a shard of 2 would hold: half
    assert seen["before"] == {"grad_bytes": whole_fp32, "unsharded_params": seen["before"]["params"],
                              "params": 8}
    assert seen["after"]["grad_bytes"] == 0 and seen["after"]["unsharded_params"] == 0
    # What torchtitan's estimate holds: the whole stage's gradients in fp32 with a pipeline, a
    # 1/dp share of them without
    for pp, share in ((2, 1.0), (1, 0.5)):
        estimate = planner.estimate(torchtitan_case(pp, 3))
        stage = job_stage_parameters(estimate.job, estimate.peak.stage).total
        assert estimate.peak.gradients == pytest.approx(4 * stage * share, rel=1e-12)


@pytest.mark.slow
def test_fsdp2_over_a_shard_group_of_one_all_reduces_every_micro_batch_in_fp32(tmp_path):
    seen = torchrun(REPLICATED, 2, tmp_path)
    assert seen["reduced_bytes"] == [4 * seen["params"]] * 4  # every micro-batch, every gradient, fp32
    assert seen["held_dtype"] == "torch.float32"  # the parameters held are the fp32 master
    # torchtitan's zero_stage 0 prices its all-reduces so: four micro-batches, four times one's
    one, four = (planner.estimate(torchtitan_case(1, 0, batch)).to_dict()["time"]["dp_comm_s"] for batch in (2, 8))
    assert four == pytest.approx(4 * one, rel=1e-9)
    memory = planner.estimate(torchtitan_case(1, 0)).peak
    params = job_stage_parameters(planner.estimate(torchtitan_case(1, 0)).job, 0).total
    assert (memory.parameters, memory.gradients, memory.optimizer_states) == \
        pytest.approx((4 * params, 4 * params, 8 * params), rel=1e-12)
