"""DeepSpeed's pipeline sends and receives one tensor at a time, each a blocking call of its own
(``runtime/pipe/p2p.py``: ``send``/``recv`` → ``dist.send``/``dist.recv``), in the order its
``TrainSchedule`` lists them: the transfers a stage pays per micro-batch are counted here from that
schedule itself, not restated."""

from __future__ import annotations

import pytest

from cost_models.collectives import p2p_time
from cost_models.pipeline_time import pipeline_comm
from cost_models.specs import ClusterSpec, GPUSpec, Job, Layout, ModelSpec, Performance, TrainingSpec
from cost_models.topology import group_links
from planner.engines import behaviour_of

schedule = pytest.importorskip("deepspeed.runtime.pipe.schedule")
TRANSFERS = (schedule.SendActivation, schedule.RecvActivation, schedule.SendGrad, schedule.RecvGrad)


def _job(engine: str, m: int, pp: int) -> Job:
    gpu = GPUSpec(name="a100", memory_bytes=80e9, peak_flops={"bf16": 312e12}, hbm_bandwidth=2.0e12,
                  intra_node_bandwidth=300e9, inter_node_bandwidth=25e9, gpus_per_node=8, nvlink_domain=8,
                  performance=Performance())
    model = ModelSpec(name="gpt", num_layers=24, hidden_size=2304, num_attention_heads=24, vocab_size=51200)
    # 8 replicas of tp 2 × pp 4: every stage boundary leaves its node.
    return Job(model, ClusterSpec(gpu=gpu, num_gpus=64),
               TrainingSpec(global_batch_size=8 * m, seq_len=2048, precision="bf16", engine=behaviour_of(engine)),
               Layout(dp=8, tp=2, pp=pp, micro_batch_size=1))


def _transfers_per_microbatch(m: int, pp: int) -> float:
    """Blocking transfers DeepSpeed's TrainSchedule issues on a middle stage, per micro-batch."""
    steps = list(schedule.TrainSchedule(micro_batches=m, stages=pp, stage_id=1).steps())
    return sum(isinstance(cmd, TRANSFERS) for step in steps for cmd in step) / m


def test_deepspeed_pays_each_of_its_schedules_blocking_transfers():
    m, pp = 16, 4
    per_microbatch = _transfers_per_microbatch(m, pp)
    assert per_microbatch == 4  # activation in and out, gradient in and out
    job = _job("deepspeed", m, pp)
    size = 2 * 1 * 2048 * 2304 / 2  # bf16 activation of one micro-batch, each tp rank its half
    links = group_links(job.cluster, job.layout, "pp")
    send = p2p_time(size, links.domains > 1, links, job.cluster.gpu.performance)
    # Every pass on the critical path (m + p − 1 of them) pays its transfers one after another.
    assert pipeline_comm(job) == pytest.approx(per_microbatch * send * (m + pp - 1))


def test_megatron_posts_a_steps_send_and_receive_together():
    # Megatron's 1F1B sends the activation while it receives the gradient (send_forward_recv_backward,
    # one batch_isend_irecv): half DeepSpeed's serial transfers on the same pipeline.
    assert pipeline_comm(_job("megatron", 16, 4)) == pytest.approx(pipeline_comm(_job("deepspeed", 16, 4)) / 2)
