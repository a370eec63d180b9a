"""Offload to host memory: the bytes it moves, the time it adds, the engines that run it, and
`plan` reaching for it where nothing fits without (cost_models.offload)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from deepspeed.runtime.config import DeepSpeedConfig

import planner
from cost_models.memory import per_microbatch
from cost_models.offload import optimizer_offload_time
from planner.case import load_case
from planner.engines.deepspeed import emit as ds
from planner.engines.megatron import emit as megatron
from planner.engines.deepspeed import read as ds_reader
from planner.engines.megatron import read as megatron_reader
from planner.errors import CaseError

# 70B on one 8-GPU H100 node: 16 bytes a parameter is 1.1 TB, 140 GB a GPU even fully sharded.
BIG = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
       "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16"}}
SMALL = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
         "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16"}}
# Llama 2 7B's parameters, counted in Meta's released checkpoint (meta-llama/Llama-2-7b-hf).
LLAMA2_7B_PARAMETERS = 6_738_415_616


def estimate(base, engine="any", **layout):
    case = copy.deepcopy(base)
    case["training"]["engine"] = engine
    case["layout"] = {"dp": 8, "micro_batch_size": 1, "recompute": "full", **layout}
    return planner.estimate(case)


def test_offloaded_states_leave_the_gpu_for_the_host():
    """ZeRO-Offload (Ren et al. 2021 §4): the optimizer states (12 bytes a parameter) leave the GPU;
    DeepSpeed's ZeRO-2 offload also reduces the gradient shards straight into host buffers: the
    optimizer's fp32 gradient partition, pinned for the run (stage_1_and_2.py,
    initialize_optimizer_states), and, over 8 micro-batches, the bf16 buffer they accumulate into
    (async_accumulate_grad_in_cpu_via_gpu): 12 + 4 + 2 bytes a parameter, where the bf16 shard
    alone (12 + 2) was priced; beside them its staging buffers, the partition in bf16 (2) and the
    largest parameter's size, the embedding's, in bf16 (param_buffer_of_bit16_for_cpu_offload_groups,
    temp_grad_buffer_for_cpu_offload). Megatron's --optimizer-offload-fraction moves that share of the
    distributed optimizer only."""
    plain = estimate(SMALL, "deepspeed", zero_stage=2)
    offloaded = estimate(SMALL, "deepspeed", zero_stage=2, offload_optimizer=1.0)
    params = LLAMA2_7B_PARAMETERS / 8  # one stage; ZeRO shards over the 8 GPUs
    assert plain.peak.optimizer_states == pytest.approx(12 * params)
    assert plain.peak.gradients == pytest.approx(2 * params)
    assert offloaded.job.num_microbatches == 8
    assert offloaded.peak.optimizer_states == offloaded.peak.gradients == 0
    embedding = 2 * 32000 * 4096  # Llama 2's largest parameter, in bf16
    assert offloaded.host_bytes == pytest.approx((12 + 4 + 2 + 2) * params + embedding)
    assert plain.host_bytes == 0
    one = estimate({**SMALL, "training": {**SMALL["training"], "global_batch_size": 8}}, "deepspeed", zero_stage=2,
                   offload_optimizer=1.0)
    assert one.job.num_microbatches == 1 and one.host_bytes == pytest.approx((12 + 4 + 2) * params + embedding)

    # Megatron's HybridDeviceOptimizer (hybrid_optimizer.py, _set_sub_optimizer_grads) copies each
    # offloaded parameter's gradient into a pinned fp32 host buffer, and each GPU-kept one's into an fp32
    # tensor on the GPU, both kept: + 4 bytes a parameter of each share, where neither was priced.
    half = estimate(SMALL, "megatron", zero_stage=1, offload_optimizer=0.5)
    assert half.peak.optimizer_states == pytest.approx(6 * params)
    assert half.peak.gradients == pytest.approx(2 * 8 * params + 4 * 0.5 * params)  # ZeRO-1: bf16 whole
    assert half.host_bytes == pytest.approx((6 + 4 * 0.5) * params)
    whole = estimate(SMALL, "megatron", zero_stage=1, offload_optimizer=1.0)
    assert whole.peak.gradients == pytest.approx(2 * 8 * params) and whole.host_bytes == pytest.approx(16 * params)
    with pytest.raises(CaseError, match="Megatron-LM offloads only Adam"):
        estimate({**SMALL, "training": {**SMALL["training"], "optimizer": "sgd"}}, "megatron", zero_stage=1,
                 offload_optimizer=1.0)


def test_fsdp_holds_its_fp32_shard_as_the_master_deepspeed_a_bf16_shard_beside_one():
    """ZeRO-3 over 8 GPUs, Llama 2 7B in bf16 with Adam. torchtitan's FSDP2 keeps each sharded
    parameter in fp32, the master the optimizer steps, its gradient shard in fp32 and Adam's two
    moments: 4 + 4 + 8 bytes; the bf16 weights exist only gathered. DeepSpeed's ZeRO-3 holds a
    bf16 weight shard and a bf16 gradient shard beside the fp32 master and moments: 2 + 2 + 12."""
    shard = LLAMA2_7B_PARAMETERS / 8
    fsdp = estimate(SMALL, "torchtitan", zero_stage=3).peak
    assert (fsdp.parameters, fsdp.gradients, fsdp.optimizer_states) == pytest.approx((4 * shard, 4 * shard, 8 * shard))
    ds = estimate(SMALL, "deepspeed", zero_stage=3).peak
    assert (ds.parameters, ds.gradients, ds.optimizer_states) == pytest.approx((2 * shard, 2 * shard, 12 * shard))


def test_parameter_offload_keeps_no_shard_on_the_gpu():
    """ZeRO-Infinity / FSDP2 CPU offload: weight and gradient shards on the host, the per-layer
    gathers (cost_models.memory.zero3_gather_bytes) still on the GPU."""
    plain = estimate(SMALL, "torchtitan", zero_stage=3)
    offloaded = estimate(SMALL, "torchtitan", zero_stage=3, offload_optimizer=1.0, offload_params=True)
    assert offloaded.peak.parameters == offloaded.peak.gradients == offloaded.peak.optimizer_states == 0
    moved = plain.peak.parameters + plain.peak.gradients + plain.peak.optimizer_states
    assert offloaded.host_bytes == pytest.approx(moved)
    assert offloaded.peak.other == plain.peak.other


def test_the_optimizer_step_on_the_cpu_streams_its_bytes_over_host_memory():
    """Gradients out and weights back over the link, the step's bytes over host DRAM; nothing to
    hide them behind here. DeepSpeed's ZeRO-1 reduces at the last micro-batch, and with 8 of them
    its offload path (stage_1_and_2.py, copy_grads_in_partition) brings its bf16 host accumulator
    in (2 bytes), sends the sum out (2) and the partition in fp32 to the optimizer's gradient (4):
    8 bytes out and in, where a bf16 copy out (2) was priced; with one micro-batch, the fp32 copy
    alone. On the CPU, DeepSpeedCPUAdam reads the fp32 gradient (4) and reads and writes the fp32
    master and both moments (2 · 12); unscale_and_clip_grads reads and writes the fp32 gradient
    before it (8), and the master is read again for its copy into the bf16 weights (4): 40 bytes,
    where Adam's loop fused with the clip and the bf16 write (28) was priced, a path 0.19 leaves
    commented out (stage_1_and_2.py, _optimizer_step)."""
    est = estimate(SMALL, "deepspeed", zero_stage=1, offload_optimizer=1.0)
    job = est.job
    assert job.num_microbatches == 8
    gpu = job.cluster.gpu
    local = LLAMA2_7B_PARAMETERS / 8  # the optimizer shard of one of the 8 data-parallel ranks
    link = gpu.host.link_bandwidth * gpu.performance.host_link_efficiency  # the preset's PCIe figures
    dram = gpu.host.memory_bandwidth * gpu.performance.host_memory_efficiency
    # The gradients' 8 bytes over the link, bf16 weights back (2); 40 bytes on the CPU.
    expected = local * 8 / link + local * (4 + 24 + 8 + 4) / dram + local * 2 / link
    assert optimizer_offload_time(job, local, 0.0) == pytest.approx(expected)
    # In the step the gradients go out behind the last micro-batch's backward: only that copy hides.
    out = local * 8 / link
    assert est.time.optimizer_s == 0 and expected - out <= est.time.offload_s < expected
    one = estimate({**SMALL, "training": {**SMALL["training"], "global_batch_size": 8}}, "deepspeed", zero_stage=1,
                   offload_optimizer=1.0).job
    assert optimizer_offload_time(one, local, 0.0) == pytest.approx(expected - local * 4 / link)


def test_deepspeeds_zero2_offload_moves_each_micro_batchs_gradients_to_the_host_and_back():
    """ZeRO-2 reduces every micro-batch, and under offload each rank's partition goes to the host:
    the first micro-batch's bf16 gradients out (2 bytes a parameter), every later one's accumulator
    in and the sum out (4), the last's also out in fp32 (4) (stage_1_and_2.py:
    async_accumulate_grad_in_cpu_via_gpu, async_inplace_copy_grad_to_fp32_buffer_from_gpu). Over 8
    micro-batches that is 2 + 6 · 4 + 8 = 34 bytes a parameter over the link; one bf16 copy (2) was
    priced, the same at any accumulation."""
    job = estimate(SMALL, "deepspeed", zero_stage=2, offload_optimizer=1.0).job
    assert job.num_microbatches == 8
    gpu = job.cluster.gpu
    local = LLAMA2_7B_PARAMETERS / 8
    link = gpu.host.link_bandwidth * gpu.performance.host_link_efficiency
    dram = gpu.host.memory_bandwidth * gpu.performance.host_memory_efficiency
    steps = local * (4 + 24 + 8 + 4) / dram + local * 2 / link
    assert optimizer_offload_time(job, local, 0.0) == pytest.approx(local * 34 / link + steps)
    # torchtitan's FSDP2 and Megatron-LM copy the reduced gradients out once, whatever the accumulation.
    megatron = [estimate({**SMALL, "training": {**SMALL["training"], "global_batch_size": batch}}, "megatron",
                         zero_stage=1, offload_optimizer=1.0).job for batch in (8, 64)]
    assert [job.num_microbatches for job in megatron] == [1, 8]
    # (Megatron's CPU AdamW, fused over fp32 shards: read the gradient, read and write master and moments.)
    assert optimizer_offload_time(megatron[0], local, 0.0) == optimizer_offload_time(megatron[1], local, 0.0) \
        == pytest.approx(local * 2 / link + local * (2 + 24 + 2) / dram + local * 2 / link)


def test_activation_offload_keeps_one_layer_in_transit():
    """Megatron's cpu_offloading_num_layers: N layers' saved tensors on the host, one layer's worth
    on the GPU as the copy's buffer; the copies run behind each micro-batch's compute."""
    plain = estimate(SMALL, "megatron", zero_stage=1, recompute="none")
    offloaded = estimate(SMALL, "megatron", zero_stage=1, recompute="none", offload_activations=8)
    # One layer of Llama 2 7B (h 4096, f 11008, s 4096, b 1) saves 2 bytes a token for each of:
    # two norm inputs, the QKV and FC1 inputs, Q, K and V, the attention output (8h in all) and
    # SwiGLU's gate, up and FC2 input (3f), flash attention and no dropout: s·(16h + 6f).
    layer = 4096 * (16 * 4096 + 6 * 11008)
    assert per_microbatch(plain.job).kept == layer == 538_968_064
    assert plain.peak.activations - offloaded.peak.activations == pytest.approx(7 * layer)
    assert offloaded.host_bytes == pytest.approx(8 * layer)
    assert offloaded.time.offload_s > 0 == plain.time.offload_s


@pytest.mark.parametrize("engine, layout, key", [
    ("megatron", {"pp": 2, "dp": 4, "recompute": "none", "offload_activations": 4}, "layout.offload_activations"),
    ("megatron", {"zero_stage": 3, "offload_optimizer": 1.0}, "layout.offload_optimizer"),
    ("deepspeed", {"zero_stage": 1, "offload_optimizer": 0.5}, "layout.offload_optimizer"),
    ("torchtitan", {"zero_stage": 3, "offload_optimizer": 1.0}, "layout.offload_params"),
])
def test_estimate_refuses_offload_the_engine_does_not_run(engine, layout, key):
    with pytest.raises(CaseError) as error:
        estimate(SMALL, engine, **layout)
    assert error.value.key == key


def test_offload_needs_host_figures():
    case = copy.deepcopy(SMALL)
    case["cluster"] = {"gpu": {"memory": "80 GiB", "peak_tflops": {"bf16": 989}, "hbm_bandwidth": "3.35 TB/s",
                               "intra_node_bandwidth": "450 GB/s", "inter_node_bandwidth": "400 Gbit/s",
                               "gpus_per_node": 8, "nvlink_domain": 8}, "num_gpus": 8}
    case["layout"] = {"dp": 8, "zero_stage": 1, "offload_optimizer": 1.0}
    with pytest.raises(CaseError, match="cluster.gpu.host"):
        planner.estimate(case)


def test_plan_for_deepspeed_fits_70b_on_one_node_with_the_optimizer_on_the_host():
    """Nothing fits 70B on 8 H100s without offload; with it DeepSpeed's plan fits and says what the
    offload costs in the step."""
    assert planner.plan({**BIG, "search": {"offload_optimizer": 0, "offload_params": False}},
                        engine="deepspeed").best is None
    best = planner.plan(BIG, engine="deepspeed").best
    assert best is not None and best.fits and best.job.layout.offload_optimizer == 1.0
    assert best.host_bytes <= best.job.cluster.gpu.host.memory_bytes
    assert 0 < best.time.offload_s < best.step_time_s
    assert best.to_dict()["time"]["offload_s"] == best.time.offload_s


def test_emitted_offload_is_what_the_engines_read(tmp_path, monkeypatch):
    import deepspeed.comm as ds_comm

    est = planner.plan(BIG, engine="deepspeed").best
    files = ds.render(est, ["x"])
    (tmp_path / ds.CONFIG).write_text(files[ds.CONFIG])
    monkeypatch.setattr(ds_comm, "get_world_size", lambda group=None: est.job.layout.dp)
    monkeypatch.setattr(ds_comm, "get_rank", lambda group=None: 0)
    config = DeepSpeedConfig(str(tmp_path / ds.CONFIG), mpu=None)
    assert config.zero_config.offload_optimizer.device == "cpu"
    read = ds_reader.read(tmp_path / ds.CONFIG, load_case(BIG), pp=est.job.layout.pp)
    assert read.offload_optimizer == 1.0 and read.offload_params == est.job.layout.offload_params

    case = load_case({**SMALL, "training": {**SMALL["training"], "engine": "megatron"},
                      "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": 1, "offload_optimizer": 0.5,
                                 "recompute": "none"}})
    mega = planner.estimate(case)
    args = megatron.render(mega, ["x"])[megatron.ARGS_FILE]
    for line in ("--optimizer-cpu-offload", "--optimizer-offload-fraction 0.5", "--use-precision-aware-optimizer"):
        assert f"\n{line}\n" in args
    (tmp_path / "args.txt").write_text(args)
    assert megatron_reader.read(tmp_path / "args.txt", case).offload_optimizer == 0.5
    assert json.loads(json.dumps(mega.to_dict()))["memory"]["host_bytes"] > 0


def test_an_offload_the_host_cannot_hold_is_said_to_overflow_the_host(tmp_path):
    """Llama 3.1 405B on 16 H100s with DeepSpeed's ZeRO-3 offloading everything: 20 bytes a parameter
    on the host (the bf16 weights, the fp32 master, the moments, the fp32 gradient and the bf16
    gradient partition: stage3.py), 507.3 GB a GPU of its 275 GB share of host memory, a 29.1 GB
    peak on the GPU. It was "does not fit: activations is the largest term", with a deeper
    pipeline or more TP as the advice, none of which frees host memory."""
    import yaml
    from cli_in_process import run_cli

    case = {"model": {"preset": "llama3.1-405b"}, "cluster": {"gpu": "h100", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "deepspeed"},
            "layout": {"dp": 16, "zero_stage": 3, "recompute": "full", "offload_optimizer": 1.0,
                       "offload_params": True}}
    est = planner.estimate(case)
    assert est.overflows == "host" and est.host_bytes > 275e9 and est.peak.total < est.usable_bytes
    assert est.remedy().description.startswith("offload_params off")
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    done = run_cli("estimate", str(tmp_path / "case.yaml"))
    said = " ".join(done.stdout.split())
    assert done.returncode == 3 and "does not fit: the host: the offload takes 507.3 GB a GPU of its 275 GB share" \
        in said, said[-400:]
    done = run_cli("estimate", str(tmp_path / "case.yaml"), "--json")
    assert json.loads(done.stdout)["memory"]["overflows"] == "host"
    # plan, where no layout fits: the GPU's closest miss, and that offloading more overflows the host
    torchtitan = {"model": {"preset": "mixtral-8x22b"}, "cluster": {"gpu": "h100", "num_gpus": 8},
                  "training": {"global_batch_size": 1024, "seq_len": 4096, "engine": "torchtitan"}}
    no_fit = planner.plan(torchtitan).no_fit
    assert no_fit.host_overflowed and "overflow the host's memory" in no_fit.describe()


def test_deepspeeds_zero3_offload_accumulates_on_the_host_and_keeps_gradients_with_the_optimizer():
    """DeepSpeed's ZeRO-3 puts its gradient partitions on the optimizer's device (stage3.py:
    self.device is the CPU only with offload_optimizer; grad_partitions_flat_buffer, pinned), each
    sub-group's fp32 gradient beside them (subgroup_gradient_buffer): 12 + 2 + 4 bytes a parameter on
    the host, where 12 + 2 was priced. Each micro-batch's partition goes into that buffer and back
    (the first) or comes in to be added to and goes out (the rest), 2 · 2 bytes; the last's also
    goes out in fp32 (4) (partition_grads, _offload_grad_partition_at_boundary): over 8
    micro-batches 8 · 4 + 4 = 36 bytes, where one bf16 copy out (2) was priced. With the parameters
    offloaded and the optimizer not, the gradients stay on the GPU (FSDP2 moves them with the
    parameters)."""
    from cost_models.offload import gradient_copies

    est = estimate(SMALL, "deepspeed", zero_stage=3, offload_optimizer=1.0)
    params = LLAMA2_7B_PARAMETERS / 8
    assert est.job.num_microbatches == 8
    assert est.peak.gradients == est.peak.optimizer_states == 0
    assert est.host_bytes == pytest.approx((12 + 2 + 4) * params)
    assert sum(b * n for b, n in gradient_copies(est.job)) == 36
    params_only = estimate(SMALL, "deepspeed", zero_stage=3, offload_params=True)
    assert params_only.peak.gradients == pytest.approx(2 * params) and params_only.peak.parameters == 0
    assert params_only.host_bytes == pytest.approx(2 * params)
    fsdp = estimate(SMALL, "torchtitan", zero_stage=3, offload_optimizer=1.0, offload_params=True)
    assert fsdp.peak.gradients == 0


def test_fsdp2s_cpu_offload_clips_its_gradients_on_the_host():
    """FSDP2's CPU offload keeps the sharded fp32 gradients on the host (torch _fsdp_collectives.py,
    foreach_reduce), and torchtitan's clip_grad_norm_ runs on them where they are: the norm reads
    them and the scale reads and writes them, 12 bytes a parameter on the host beside Adam's 28 (the
    fp32 gradient read, the fp32 master and both moments read and written), where Adam's alone was
    priced. The updated weights stay on the host (the gathers copy them in): nothing goes back."""
    from cost_models.offload import optimizer_offload_floor

    job = estimate(SMALL, "torchtitan", zero_stage=3, offload_optimizer=1.0, offload_params=True).job
    gpu = job.cluster.gpu
    local = LLAMA2_7B_PARAMETERS / 8
    dram = gpu.host.memory_bandwidth * gpu.performance.host_memory_efficiency
    assert optimizer_offload_floor(job, local) == pytest.approx(local * (4 + 2 * 12 + 12) / dram)


def test_deepspeeds_bf16_master_keeps_its_gradient_partition_in_bf16_on_the_host():
    """Without master weights DeepSpeed keeps a bf16 master (bf16_master_weights_and_grads), bf16 Adam
    moments (bf16_optimizer_states) and its gradient partition in the master's dtype (stage3.py's
    partition buffers; stage_1_and_2.py likewise): 2 + 4 + 2 on the host, and ZeRO-3's accumulation
    buffer in bf16, 2: 10 bytes a parameter where 12 were priced (Llama 3 70B at ZeRO-3 on a host share
    of 100 GB: "does not fit"). The last micro-batch's partition goes out in bf16 too."""
    from cost_models.offload import gradient_copies

    pure = copy.deepcopy(SMALL)
    pure["training"]["master_weights"] = False
    est = estimate(pure, "deepspeed", zero_stage=3, offload_optimizer=1.0)
    params = LLAMA2_7B_PARAMETERS / 8
    assert est.host_bytes == pytest.approx((2 + 4 + 2 + 2) * params)
    assert sum(b * n for b, n in gradient_copies(est.job)) == 8 * 4 + 2
    two = estimate(pure, "deepspeed", zero_stage=2, offload_optimizer=1.0)
    # master, moments, partition, accumulator, and the staging buffers: the partition and the embedding in bf16
    assert two.host_bytes == pytest.approx((2 + 4 + 2 + 2 + 2) * params + 2 * 32000 * 4096)


def test_a_host_section_giving_only_its_memory_keeps_the_gpus_other_host_figures(tmp_path):
    """cluster.host defaults to the GPU preset's reference system: a case giving only its hosts' memory (a
    node of 800 GB, 100 GB a GPU) was refused, "cluster.host.link_bandwidth: missing". The keys given
    replace the preset's and the rest stay, as the whole mapping with the preset's other figures prices it."""
    import yaml
    from cli_in_process import run_cli

    preset = yaml.safe_load((Path(planner.__file__).parent / "presets" / "gpus.yaml").read_text())["h100-sxm-80gb"]
    case = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8,
                                                           "host": {"memory": "100 GB"}},
            "training": {"global_batch_size": 8, "seq_len": 4096, "precision": "bf16", "engine": "deepspeed",
                         "loss": "megatron"},  # stated: no note of the loss train.py runs
            "layout": {"zero_stage": 3, "offload_optimizer": 1.0, "offload_params": True, "recompute": "full"}}
    whole = {**case, "cluster": {**case["cluster"], "host": {**preset["host"], "memory": "100 GB"}}}
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    done = run_cli("estimate", str(tmp_path / "case.yaml"), "--json")
    assert done.returncode == 3, done.stderr  # 70B's offload is past 100 GB a GPU: the host overflows
    printed = json.loads(done.stdout)
    # --json adds the notes and the profile's warnings (a preset GPU has none)
    assert printed.pop("notes") == [] and printed.pop("warnings") == [] and printed == planner.estimate(whole).to_dict()
    assert printed["memory"]["overflows"] == "host"
    assert planner.estimate(case).job.cluster.gpu.host.memory_bytes == 100e9
