"""Invariants of the cost models over generated models, clusters and layouts (fixed seed; 150 a property
by default, 1,500 with HYPOTHESIS_PROFILE=thorough)."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cost_models.memory import peak_stage_memory, stage_memories
from cost_models.specs import ClusterSpec, GPUSpec, HostSpec, Job, Layout, ModelSpec, SpecError, TrainingSpec
from cost_models.step_time import step_time

SETTINGS = settings()  # the loaded profile (tests/conftest.py): quick by default, thorough when scheduled
GPU = GPUSpec(name="h100", memory_bytes=80e9, peak_flops={"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12,
                                                          "tf32": 495e12},
              hbm_bandwidth=3.35e12, intra_node_bandwidth=450e9, inter_node_bandwidth=50e9,
              gpus_per_node=8, nvlink_domain=8,
              host=HostSpec(memory_bytes=250e9, link_bandwidth=55e9, memory_bandwidth=40e9))  # PCIe 5, DDR5


@st.composite
def jobs(draw):
    heads = draw(st.sampled_from([4, 8, 16, 32, 64]))
    model = ModelSpec(
        name="m", num_layers=draw(st.integers(1, 48)),
        hidden_size=heads * draw(st.sampled_from([32, 64, 128])),
        num_attention_heads=heads,
        num_kv_heads=heads // draw(st.sampled_from([1, 2, 4])),
        ffn_hidden_size=draw(st.sampled_from([0, 1024, 4096, 11008])),
        activation=draw(st.sampled_from(["gelu", "swiglu"])),
        vocab_size=draw(st.integers(1000, 150000)),
        tied_embeddings=draw(st.booleans()),
        dropout=draw(st.sampled_from([0.0, 0.1])),
    )
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([1, 1, 2]))
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    mbs = draw(st.sampled_from([1, 2, 4]))
    accumulation = draw(st.sampled_from([1, 2, 4, 8]))
    training = TrainingSpec(global_batch_size=mbs * accumulation * dp, seq_len=draw(st.sampled_from([512, 2048, 4096])),
                            precision=draw(st.sampled_from(["bf16", "fp16", "fp32", "fp8"])),
                            optimizer=draw(st.sampled_from(["adam", "sgd"])),
                            flash_attention=draw(st.booleans()))
    recompute = draw(st.sampled_from(["none", "selective", "full"]))
    try:
        layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, vpp=draw(st.sampled_from([1, 2])) if pp > 1 else 1,
                        micro_batch_size=mbs, zero_stage=draw(st.integers(0, 3)),
                        sequence_parallel=tp > 1 and draw(st.booleans()), recompute=recompute)
        job = Job(model, ClusterSpec(GPU, dp * tp * pp * cp), training, layout)
    except SpecError:
        assume(False)
    return job


def _with(job: Job, cluster_gpus: int = None, training: TrainingSpec = None, **changes) -> Job:
    layout = job.layout.with_changes(**changes)
    return Job(job.model, ClusterSpec(GPU, cluster_gpus or layout.world_size), training or job.training, layout)


def _states(job: Job) -> float:
    """Model-state bytes of the stage that holds the most of them."""
    return max(m.parameters + m.gradients + m.optimizer_states for m in stage_memories(job))


@SETTINGS
@given(jobs())
def test_memory_never_falls_as_the_micro_batch_grows(job):
    bigger = job.training.global_batch_size * 2
    try:
        larger = _with(job, training=replace(job.training, global_batch_size=bigger),
                       micro_batch_size=job.layout.micro_batch_size * 2)
    except SpecError:
        assume(False)
    assert peak_stage_memory(larger).total >= peak_stage_memory(job).total * (1 - 1e-12)


@SETTINGS
@given(jobs())
def test_memory_never_falls_as_the_sequence_grows(job):
    t = job.training
    try:
        longer = _with(job, training=replace(t, seq_len=t.seq_len * 2))
    except SpecError:
        assume(False)
    assert peak_stage_memory(longer).total >= peak_stage_memory(job).total * (1 - 1e-12)


@SETTINGS
@given(jobs())
def test_more_sharding_never_raises_model_state_memory(job):
    """A higher ZeRO stage, or (data parallelism held) a higher TP or PP degree."""
    lay = job.layout
    if lay.zero_stage < 3:
        assert _states(_with(job, zero_stage=lay.zero_stage + 1)) <= _states(job) * (1 + 1e-12)
    for change in ({"tp": lay.tp * 2}, {"pp": lay.pp * 2}):
        try:
            wider = _with(job, **change)
        except SpecError:
            continue
        # Every stage of the wider layout holds no more state than the heaviest stage before.
        assert max(m.parameters + m.gradients + m.optimizer_states for m in stage_memories(wider)) \
            <= _states(job) * (1 + 1e-12)


@SETTINGS
@given(jobs())
def test_step_time_and_every_part_of_it_are_positive_and_finite(job):
    t = step_time(job)
    assert 0 < t.total < math.inf
    assert all(v >= 0 and math.isfinite(v) for v in t.by_part().values())


@SETTINGS
@given(jobs())
def test_the_peak_is_the_heaviest_of_all_stages(job):
    """peak_stage_memory looks only at the stages that can be heaviest; that loses nothing."""
    assert peak_stage_memory(job).total == max(m.total for m in stage_memories(job))


@SETTINGS
@given(jobs(), st.data())
def test_recomputation_and_offload_never_shorten_the_step(job, data):
    """Each only adds work (a forward run again, a copy to or from the host, an optimizer step on
    the CPU): the search prunes every layout built on one whose bare step is already too slow
    (planner.search._floor)."""
    bare = _with(job, recompute="none")
    layers = max(bare.stage_layers)
    more = data.draw(st.sampled_from([
        {"recompute": "selective"}, {"recompute": "full"},
        {"recompute": "full", "recompute_num_layers": data.draw(st.integers(1, layers))},
        {"offload_optimizer": data.draw(st.sampled_from([0.5, 1.0]))},
        {"offload_activations": data.draw(st.integers(1, max(1, layers)))},
        {"offload_params": True, "offload_optimizer": 1.0}]))  # ZeRO 3 only
    try:
        heavier = _with(bare, **more)
    except SpecError:
        assume(False)
    assert step_time(heavier).total >= step_time(bare).total * (1 - 1e-12)


@st.composite
def moe_layouts(draw):
    """Layouts of a mixture of experts: expert parallelism on the attention's grid, the expert tensor
    parallel degree stated (1 or tp, what the search tries, or another) or left to its default, tp;
    with the other fields a case's section may state, so the whole section goes round."""
    tp, pp, cp, dp = (draw(st.sampled_from(options)) for options in ([1, 2, 4, 8], [1, 2, 4], [1, 2], [1, 2, 4, 8]))
    ep = draw(st.sampled_from([d for d in (1, 2, 4, 8, 16, 32) if (tp * cp * dp) % d == 0]))
    etp = draw(st.sampled_from([None, 1, tp, 2, 4]))
    recompute = draw(st.sampled_from(["none", "selective", "full"]))
    try:
        return Layout(dp=dp, tp=tp, pp=pp, cp=cp, vpp=draw(st.sampled_from([1, 2])) if pp > 1 else 1,
                      micro_batch_size=draw(st.sampled_from([1, 2, 4])), ep=ep, etp=etp,
                      zero_stage=draw(st.integers(0, 3)), sequence_parallel=tp > 1 and draw(st.booleans()),
                      recompute=recompute,
                      recompute_num_layers=draw(st.sampled_from([None, 1, 2])) if recompute == "full" else None,
                      offload_optimizer=draw(st.sampled_from([0.0, 0.5, 1.0])))
    except SpecError:
        assume(False)


@SETTINGS
@given(moe_layouts())
def test_a_layouts_case_section_reads_back_as_the_same_layout(layout):
    """Layout.to_dict() is the case-file section a dict case takes a Layout as (planner.api_values): it
    wrote etp = tp where the layout left etp to its default, so a layout of ep 4 that went into a case
    came back with etp 2 stated, unequal to the one given, though each runs the same expert grid (etp
    None resolves to tp: Layout.expert_tp). The section, through JSON as a case file holds it, reads
    back as the layout it came from."""
    import json

    from planner.case import layout_from_mapping

    section = json.loads(json.dumps(layout.to_dict()))
    again = layout_from_mapping("<case>", section, layout.dp * layout.tp * layout.pp * layout.cp)
    assert again == layout
    assert (again.ep, again.expert_tp, again.edp) == (layout.ep, layout.expert_tp, layout.edp)
