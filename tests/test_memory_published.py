"""The memory model against published figures and exact formulas."""

from __future__ import annotations

import pytest

from cost_models.activations import layer_activation_bytes, layer_activations
from cost_models.model_states import sharded_state_bytes, state_bytes
from cost_models.parameters import stage_parameters, total_parameters
from cost_models.pipeline import in_flight_chunks
from cost_models.specs import Layout, ModelSpec, TrainingSpec
from planner.engines import behaviour_of

GB = 1e9
BF16_ADAM = TrainingSpec(global_batch_size=1, seq_len=1, precision="bf16", optimizer="adam")


def test_mixed_precision_adam_keeps_16_bytes_per_parameter():
    per_param = state_bytes(BF16_ADAM)
    assert (per_param.weights, per_param.gradients, per_param.optimizer) == (2, 2, 12)


def test_70b_model_states_and_zero3_over_64_gpus():
    psi = 70e9
    assert state_bytes(BF16_ADAM).total * psi / GB == pytest.approx(1120)
    assert sharded_state_bytes(state_bytes(BF16_ADAM), 3, 64).total * psi / GB == pytest.approx(17.5)


@pytest.mark.parametrize("stage, published_gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_zero_paper_7_5b_over_64_ranks(stage, published_gb):
    """Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B, Nd = 64, K = 12."""
    per_rank = sharded_state_bytes(state_bytes(BF16_ADAM), stage, 64).total * 7.5e9 / GB
    assert round(per_rank, 2 if published_gb < 10 else 1) == published_gb


def test_sgd_with_momentum_keeps_one_state():
    sgd = TrainingSpec(global_batch_size=1, seq_len=1, precision="bf16", optimizer="sgd")
    assert state_bytes(sgd).total == 2 + 2 + 4 + 4
    fp32_adam = TrainingSpec(global_batch_size=1, seq_len=1, precision="fp32", optimizer="adam")
    assert state_bytes(fp32_adam).total == 16


def _gpt(h, a, dropout=0.1):
    return ModelSpec(name="gpt", num_layers=4, hidden_size=h, num_attention_heads=a, vocab_size=51200,
                     dropout=dropout)


SHAPES = [(2048, 1, 12288, 96, 8), (2048, 4, 6144, 48, 4), (4096, 2, 4096, 32, 2), (1024, 8, 2304, 24, 8)]


@pytest.mark.parametrize("s, b, h, a, t", SHAPES)
def test_korthikanti_per_layer_activations(s, b, h, a, t):
    """Korthikanti et al. 2022, §4.1–4.2 and Table 2, flash attention off, dropout on."""
    model = _gpt(h, a)
    training = TrainingSpec(global_batch_size=b, seq_len=s, flash_attention=False)

    def bytes_for(**layout):
        return layer_activation_bytes(model, training, Layout(micro_batch_size=b, **layout), recomputed=True)

    sbh = s * b * h
    assert bytes_for() == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert bytes_for(tp=t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert bytes_for(tp=t, sequence_parallel=True) == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)))
    assert bytes_for(tp=t, sequence_parallel=True, recompute="selective") == pytest.approx(34 * sbh / t)
    assert bytes_for(recompute="full") == pytest.approx(2 * sbh)


def test_flash_attention_keeps_no_scores_and_gqa_narrows_k_v():
    model = ModelSpec(name="m", num_layers=2, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
                      ffn_hidden_size=14336, activation="swiglu", vocab_size=128256)
    s, b = 8192, 1
    acts = layer_activations(model, TrainingSpec(global_batch_size=1, seq_len=s, engine=behaviour_of("megatron")),
                             Layout(micro_batch_size=b))
    assert acts.attention_core == 0 and acts.dropout_masks == 0
    # Q is h wide, K and V are 8 heads × 128 = 1024 wide each, 2 bytes per element.
    assert acts.qkv == 2 * s * b * (4096 + 2 * 1024)
    # Fused SwiGLU keeps its 2f-wide input; the down projection keeps its f-wide input.
    assert acts.mlp_hidden == 2 * s * b * 3 * 14336
    # Eager silu-then-multiply also keeps silu's output.
    eager = layer_activations(model, TrainingSpec(global_batch_size=1, seq_len=s, engine=behaviour_of("any")),
                              Layout(micro_batch_size=b))
    assert eager.mlp_hidden == 2 * s * b * 4 * 14336


@pytest.mark.parametrize("name, config, published", [
    # Hugging Face model cards / safetensors index totals.
    ("Llama-2-7b", dict(num_layers=32, hidden_size=4096, num_attention_heads=32, ffn_hidden_size=11008,
                        vocab_size=32000), 6_738_415_616),
    ("Llama-2-70b", dict(num_layers=80, hidden_size=8192, num_attention_heads=64, num_kv_heads=8,
                         ffn_hidden_size=28672, vocab_size=32000), 68_976_648_192),
    ("Meta-Llama-3-8B", dict(num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
                             ffn_hidden_size=14336, vocab_size=128256), 8_030_261_248),
])
def test_parameter_counts_match_published_llama_totals(name, config, published):
    assert total_parameters(ModelSpec(name=name, activation="swiglu", **config)) == published


def test_pipeline_stages_partition_the_parameters():
    model = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_attention_heads=16, vocab_size=50000)
    stages = [stage_parameters(model, 2, first=i == 0, last=i == 3, tp=1).total for i in range(4)]
    assert sum(stages) == total_parameters(model)
    # The first stage holds the embedding, the last the head: both heavier than a middle one.
    assert stages[0] > stages[1] == stages[2] < stages[3]


def test_tied_embeddings_are_duplicated_on_the_last_stage_only_with_pipelining():
    model = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_attention_heads=16, vocab_size=50000,
                      tied_embeddings=True)
    single = stage_parameters(model, 8, first=True, last=True, tp=1).total
    assert single == total_parameters(model)
    split = [stage_parameters(model, 4, first=i == 0, last=i == 1, tp=1).total for i in range(2)]
    assert sum(split) == total_parameters(model) + 50000 * 1024


@pytest.mark.parametrize("p, v, m", [(4, 1, 16), (8, 1, 64), (4, 2, 16), (8, 3, 24), (16, 4, 32)])
def test_first_stage_in_flight_activations(p, v, m):
    """1F1B: p micro-batches; interleaved: L·(1 + (p−1)/(p·v)) layers' worth (Korthikanti §4.2.3)."""
    layers_per_stage = 4 * v
    held = in_flight_chunks(p, v, m, stage=0) * layers_per_stage / v
    assert held == pytest.approx(p * layers_per_stage * (1 + (p - 1) / (p * v)) if v > 1 else p * layers_per_stage)


def test_fewer_micro_batches_than_stages_caps_what_is_in_flight():
    assert in_flight_chunks(8, 1, 3, stage=0) == 3
    assert [in_flight_chunks(4, 1, 16, stage=i) for i in range(4)] == [4, 3, 2, 1]


def _ddp_job(engine: str, zero_stage: int, dp: int):
    from cost_models.specs import ClusterSpec, GPUSpec, Job

    gpu = GPUSpec(name="h100", memory_bytes=80e9, peak_flops={"bf16": 989e12}, hbm_bandwidth=3.35e12,
                  intra_node_bandwidth=450e9, inter_node_bandwidth=50e9, gpus_per_node=8, nvlink_domain=8)
    model = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_attention_heads=16, vocab_size=50000)
    training = TrainingSpec(global_batch_size=dp, seq_len=1024, precision="bf16", engine=behaviour_of(engine))
    return Job(model, ClusterSpec(gpu=gpu, num_gpus=dp), training,
               Layout(dp=dp, micro_batch_size=1, zero_stage=zero_stage))


@pytest.mark.parametrize("engine, zero_stage, dp, gradient_bytes", [
    ("any", 0, 8, 2 + 2),       # param.grad and DDP's bucket beside it
    ("any", 1, 8, 2 + 2),       # ZeroRedundancyOptimizer runs under DDP
    ("any", 0, 1, 2),           # one replica: no DDP, no buckets
    ("any", 2, 8, 2 / 8),       # sharded gradients: FSDP, no DDP
    ("megatron", 1, 8, 2),      # main_grad is a view of the buffer Megatron reduces
    ("deepspeed", 0, 8, 2),
])
def test_plain_ddp_keeps_its_buckets_beside_the_gradients(engine, zero_stage, dp, gradient_bytes):
    """PyTorch DDP copies every gradient into its flat buckets and keeps both unless
    gradient_as_bucket_view=True ("the saved memory size will be equal to the total gradients
    size", torch.nn.parallel.DistributedDataParallel): one more 2-byte copy per parameter in bf16
    wherever DDP runs. The Ultra-Scale Playbook's 80B runs (nanotron) measure about 6
    bytes per parameter above 2 + 2 + 12/dp."""
    from cost_models.memory import job_stage_parameters, stage_memory

    job = _ddp_job(engine, zero_stage, dp)
    params = job_stage_parameters(job, 0).total
    assert stage_memory(job, 0).gradients == pytest.approx(params * gradient_bytes, rel=1e-12)


# The totals each GPU reports, as published in logs of real machines: nvidia-smi's "Memory-Usage" column (MiB),
# rocm-smi's "VRAM Total Memory (B)".
REPORTED_BYTES = {**{name: mib * 2**20 for name, mib in (
    ("a100-sxm-80gb", 81920), ("h100-sxm-80gb", 81559), ("h200-sxm-141gb", 143771), ("b200", 183359),
    ("gb200", 189471), ("b300", 275040), ("gb300", 284208))},
    "mi300x": 205822885888, "mi355x": 309220868096}


@pytest.mark.parametrize("name", sorted(REPORTED_BYTES))
def test_no_preset_counts_memory_its_gpu_does_not_report(name):
    """A preset may round the device's total up to its datasheet figure only by the driver's reserve (under 1%),
    which the default headroom covers; never by more, or a plan fills memory the GPU does not have."""
    from planner.presets import gpu_presets
    from planner.units import parse_memory
    from planner.search_options import SearchSpec

    preset = parse_memory(gpu_presets()[name]["memory"])
    reported = REPORTED_BYTES[name]
    assert reported <= preset <= reported * 1.01
    assert preset * (1 - SearchSpec().headroom) < reported


@pytest.mark.parametrize("model, hidden, live", [
    # GPT-3 175B: the 1e9 cap, overshot by its largest module, the LM head (V·h, V = 50,257).
    ("gpt3-175b", 12288, 1e9 + 50257 * 12288),
    # Narayanan et al.'s 529.6B (h 20,480): overshot by fc1, 4h² = 1.68 G parameters.
    ("gpt-529.6b", 20480, 1e9 + 4 * 20480 ** 2),
])
def test_deepspeed_zero3_holds_its_live_cap_and_a_module_not_two_layers(model, hidden, live):
    """DeepSpeed gathers each submodule on its own, fetching a module's own weights whatever is
    live and prefetching up to stage3_max_live_parameters (1e9), keeping modules used again within
    max_reuse_distance (partitioned_param_coordinator.py): the cap, overshot by the module fetched.
    FSDP holds the running layer and the one it prefetches, 2 · 12h² parameters. 16-bit weights,
    2 bytes each."""
    from cost_models.memory import zero3_gather_bytes
    from planner.case import load_case

    def job(engine):
        return load_case({"model": {"preset": model}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 64},
                          "training": {"global_batch_size": 64, "seq_len": 2048, "engine": engine},
                          "layout": {"dp": 64, "micro_batch_size": 1, "zero_stage": 3}}).job()

    assert zero3_gather_bytes(job("deepspeed")) == pytest.approx(2 * live)
    assert zero3_gather_bytes(job("any")) == pytest.approx(2 * 2 * (12 * hidden ** 2 + 13 * hidden), rel=1e-3)


def test_narayanan_529b_under_deepspeed_zero3_fits_as_it_ran():
    """Narayanan et al. 2021, Table 2: the 529.6B model trained with DeepSpeed ZeRO-3 on 640 A100
    80GB (micro-batch 4, full recomputation). Holding two whole layers gathered (20 GB) the model
    read 95.5 GB and "does not fit"; a submodule and its prefetch (3.4 GB) leave it at 78.7."""
    from planner.estimate import estimate
    from planner.published_runs import case_of, load_rows

    row = next(r for r in load_rows() if r["id"] == "narayanan21_t2_zero3_529.6B_640gpu")
    ran = estimate(case_of(row)[0])
    assert ran.job.training.engine.name == "deepspeed" and ran.fits
