"""Interleaved pipelines over chunks of unequal size: the split the planner makes where the
layers do not divide by the virtual stages, and what each rank holds under Megatron's schedule."""

from __future__ import annotations

import planner
from cost_models.partition import rank_chunks, virtual_partition, virtual_stage_layers
from cost_models.pipeline import in_flight_chunks, in_flight_peak


def test_spare_layers_spread_over_the_ranks_and_off_the_first_chunk():
    """DeepSeek-V3's 61 layers over 8 ranks of 4 chunks: 32 virtual stages of 1 layer and 29
    spare ones, 3 a rank and one more on each of the five middle ranks. Rank 0's go to its later
    chunks: its first (the embedding, the most micro-batches in flight) keeps one layer, as in
    Megatron-Bridge's own layout ("Et|(tt|)*30mL"), and so does the model's last virtual stage."""
    virtual = virtual_stage_layers(61, 8, 4)
    assert sum(virtual) == 61 and virtual[0] == virtual[-1] == 1
    assert virtual_partition(61, 8, 4) == (7, 8, 8, 8, 8, 8, 7, 7)
    assert rank_chunks(virtual, 8)[0] == (1, 2, 2, 2) and rank_chunks(virtual, 8)[7] == (2, 2, 2, 1)
    # Two ranks: one spare layer each; rank 0's in its second chunk, rank 1's in its first.
    assert virtual_stage_layers(10, 2, 4) == (1, 2, 2, 1, 1, 1, 1, 1)
    assert virtual_partition(10, 2, 4) == (5, 5)


def test_chunks_of_one_size_hold_what_the_warm_up_leaves_in_flight():
    """Korthikanti et al. 2022 §4.2.3 (Megatron's warm-up): rank i of p with v chunks holds
    (p − i − 1)·2 + (v − 1)·p + 1 chunk micro-batches at its peak."""
    for stage in range(8):
        assert in_flight_peak(8, 4, 64, stage, [3.0] * 4) == 3.0 * in_flight_chunks(8, 4, 64, stage)
    assert in_flight_chunks(8, 4, 64, 0) == 39


def test_the_first_chunk_runs_ahead_so_lightening_it_lowers_the_peak():
    """Rank 0's forwards of its first chunk run ahead of their backwards (the schedule issues
    chunk 0's forwards first and its backwards last): a light first chunk lowers the peak, a
    light last chunk does not, and neither is above all chunks at the larger size."""
    light_first = in_flight_peak(8, 4, 64, 0, [1, 2, 2, 2])
    light_last = in_flight_peak(8, 4, 64, 0, [2, 2, 2, 1])
    assert light_first < light_last <= 2 * 39
    # The warm-up alone leaves 15 of rank 0's 39 in its first chunk: at least 15·1 + 24·2.
    assert light_first >= 15 + 24 * 2


def test_the_planners_uneven_split_is_what_megatron_builds_and_fits_deepseek_v3():
    """DeepSeek-V3 in fp8 on 1,024 H100s at tp 2, pp 8, vpp 4, ep 64, micro-batch 1: Megatron-Bridge's
    25.09 performance table ran it (1,328,128 tokens/s), with MLA's up-projections and the dense MLPs
    recomputed (its perf script's, planner/published_runs.py BRIDGE_2509_SETTINGS). With the spare
    layers on rank 0's first chunk the model had it, without that recomputation, at 78.1 GiB, over an
    H100's 77.6 usable; with them in the middle, rank 0 holds 7 layers, and it fits. (Without the
    recomputation it is now 83.0 GiB: the attention's bf16 output beside its fp8 copy, which the
    non-delayed recipes' linear_proj does not keep.)"""
    case = {"model": {"preset": "deepseek-v3"}, "cluster": {"gpu": "h100", "num_gpus": 1024},
            "training": {"global_batch_size": 8192, "seq_len": 4096, "precision": "fp8", "engine": "megatron",
                         "tp_comm_overlap": True},
            "layout": {"tp": 2, "pp": 8, "vpp": 4, "dp": 64, "ep": 64, "micro_batch_size": 1, "zero_stage": 1,
                       "sequence_parallel": True, "recompute": "selective",
                       "recompute_modules": ["mla_up_proj", "mlp"]}}
    estimate = planner.estimate(case)
    assert estimate.job.stage_layers == (7, 8, 8, 8, 8, 8, 7, 7)
    assert estimate.job.rank_chunk_layers(0) == (1, 2, 2, 2)
    assert estimate.fits, estimate.peak.total / 2**30


def test_the_cost_balanced_split_has_the_least_largest_stage_of_every_split():
    """Brute force over every contiguous split of up to 10 layers (a layer at least per stage):
    no split's slowest stage, the LM head's cost on the last, is less than the one found."""
    import itertools
    import random

    from cost_models.partition import cost_balanced_partition

    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(2, 10)
        stages = rng.randint(2, n)
        costs = tuple(rng.choice((1.0, 1.0, 2.5, 3.7)) * rng.uniform(0.5, 1.5) for _ in range(n))
        head = rng.uniform(0, 5)

        def largest(counts):
            bounds = list(itertools.accumulate(counts))
            sums = [sum(costs[a:b]) for a, b in zip([0] + bounds[:-1], bounds)]
            return max(sums[:-1] + [sums[-1] + head])

        found = cost_balanced_partition(costs, stages, head)
        assert sum(found) == n and len(found) == stages and min(found) >= 1
        best = min(largest(tuple(b - a for a, b in zip((0,) + cut, cut + (n,))))
                   for cut in itertools.combinations(range(1, n), stages - 1))
        assert largest(found) <= best * (1 + 1e-9)


def test_nvfp4_on_a_pipeline_is_planned_on_a_split_by_each_layers_time():
    """Llama 3 8B on 72 GB200s in NVFP4, its last 5 layers kept in bf16: the splits that count
    layers alike ran at the bf16 step (1.29 s); the planner's own estimate priced a split that
    lightens the stages holding the bf16 tail (4, 4, 4, 4, 4, 4, 4, 2, 2) at 1.05 s, which the
    fastest plan must match at least, as it must every split its own estimate prices."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "gb200", "num_gpus": 72},
            "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "nvfp4", "engine": "megatron"}}
    fastest = planner.plan(case, fastest=True).best.step_time_s
    # and the min-max split evened over the first stages (it left them a layer each: 1, 1, 1, 3, 8, ...)
    for layout in ({"dp": 8, "tp": 1, "stage_layers": [4, 4, 4, 4, 4, 4, 4, 2, 2]},
                   {"dp": 8, "tp": 1, "stage_layers": [1, 5, 5, 5, 5, 5, 3, 2, 1]},
                   {"dp": 4, "tp": 2, "sequence_parallel": True, "stage_layers": [1, 5, 5, 5, 5, 5, 3, 2, 1]}):
        other = planner.estimate({**case, "layout": {"pp": 9, "micro_batch_size": 1, "zero_stage": 0, **layout}})
        assert other.fits and fastest <= other.step_time_s, layout


# A Llama-3-8B-shaped model on 4 H100 nodes at tp 2, pp 4, vpp 2, 8,192 tokens a sequence: per micro-batch
# a layer's checkpoint (its input, sequence-parallel) is 32 MiB, a layer whole 17·s·h/2 bytes (544 MiB), the
# LM head's input and logits 2,068 MiB (2 + 2 bytes of its hidden input and 4 a logit over 128,256 / 2),
# the loss's gradients 1,002 MiB.
LLAMA_VPP = {"model": {"name": "llama-ish", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                       "num_kv_heads": 8, "ffn_hidden_size": 14336, "activation": "swiglu", "vocab_size": 128256},
             "cluster": {"gpu": "h100-sxm-80gb", "nodes": 4},
             "training": {"global_batch_size": 64, "seq_len": 8192, "precision": "bf16", "optimizer": "adamw",
                          "engine": "megatron"},
             "layout": {"tp": 2, "pp": 4, "vpp": 2, "micro_batch_size": 1, "zero_stage": 1, "sequence_parallel": True}}


def test_the_last_stage_holds_its_lm_head_only_after_a_forward_of_its_last_chunk():
    """megatron-core's interleaved schedule runs each steady step's forward and then the backward of the same
    last-chunk micro-batch on the last rank (schedules.py: get_schedule_table, the backward of chunk
    v - 1 - ⌊j/p⌋ mod v): the head's logits and the loss's gradients are freed before a layer is recomputed,
    and are live only after a forward of the last chunk. At vpp > 1 they were added on top of both.

    Full recomputation: 5 chunk micro-batches in flight × 4 layers × 32 MiB = 640 MiB, then either the head
    (2,068 + 1,002) or one recomputed layer (544): 3,710 MiB (it was 4,254). No recomputation, 30 layers, the
    embedding and the loss each counted as a layer (rank 3's chunks of 4 and 3): right after a last-chunk
    forward the rank holds 19 layers and the head, 19 × 544 + 3,070 = 13,406 MiB; its 20 layers at a
    first-chunk forward hold no head (it was 13,950)."""
    full = {**LLAMA_VPP, "layout": {**LLAMA_VPP["layout"], "recompute": "full"}}
    assert planner.estimate(full).stages[-1].activations == 3710 * 2**20
    uneven = {**LLAMA_VPP, "model": {**LLAMA_VPP["model"], "num_layers": 30},
              "layout": {**LLAMA_VPP["layout"], "account_for_embedding_in_pipeline_split": True,
                         "account_for_loss_in_pipeline_split": True}}
    estimate = planner.estimate(uneven)
    assert estimate.job.rank_chunk_layers(3) == (4, 3)
    assert estimate.stages[-1].activations == (19 * 544 + 2068 + 1002) * 2**20


def test_the_embedding_is_held_for_the_first_chunks_micro_batches_alone():
    """The first stage's embedding (its dropout mask) lies in its first model chunk: its saved tensors are
    held for that chunk's micro-batches in flight, not for every chunk's (39 were charged at pp 8, vpp 4,
    m 64). Counted on megatron-core's own schedule table (schedules.get_schedule_table; rank 0's warm-up of
    (v − 1)·p + 2(p − 1) forwards, then one forward and one backward a step, backwards in reverse chunk order)."""
    from megatron.core.pipeline_parallel.schedules import get_schedule_table

    from cost_models.pipeline import first_chunk_in_flight

    def megatron(pp: int, vpp: int, m: int) -> int:
        table = get_schedule_table(m, vpp, pp)
        total, warmup = m * vpp, min((pp - 1) * 2 + (vpp - 1) * pp, m * vpp)
        held = peak = forwards = backwards = 0

        def forward():
            nonlocal held, peak, forwards
            held += table[forwards][1] == 0
            peak, forwards = max(peak, held), forwards + 1

        def backward():
            nonlocal held, backwards
            held -= vpp - 1 - table[backwards][1] == 0
            backwards += 1
        for _ in range(warmup):
            forward()
        while forwards < total:
            forward()
            backward()
        return peak

    for pp, vpp, m in ((8, 4, 64), (8, 5, 32), (4, 2, 8), (4, 2, 12), (2, 4, 16), (8, 1, 32)):
        assert first_chunk_in_flight(pp, vpp, m) == (megatron(pp, vpp, m) if vpp > 1 else min(pp, m))
    assert (first_chunk_in_flight(8, 4, 64), in_flight_chunks(8, 4, 64, 0)) == (16, 39)

