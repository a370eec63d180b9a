"""`diagnose --torchtitan`: torchtitan's command-line overrides (the emitted overrides.txt, a launch
script) and torchtitan 0.2 TOML job files read back to their layout, checked against the case; the
hand-written overrides are parsed by torchtitan's own ConfigManager too, so that what is read is what
torchtitan would run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")
pytest.importorskip("tyro")
pytest.importorskip("spmd_types")

from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: E402
from torchtitan.distributed.parallel_dims import ParallelDims  # noqa: E402

import planner  # noqa: E402
from cost_models.specs import Layout  # noqa: E402
from planner.case import layout_to_mapping  # noqa: E402
from planner.configs import read_config, render  # noqa: E402
from planner.diagnose import diagnose  # noqa: E402
from planner.engines.torchtitan.read import generated_counts  # noqa: E402
from planner.errors import CaseError  # noqa: E402
from planner.files import Output, write_all  # noqa: E402

H100 = "h100-sxm-80gb"


def case_of(preset: str, gpus: int, batch: int, seq: int, **training) -> dict:
    return {"model": {"preset": preset}, "cluster": {"gpu": H100, "num_gpus": gpus},
            "training": {"global_batch_size": batch, "seq_len": seq, **training}}


# Dense Llama 3 on 1 to 256 H100s and a mixture of experts, pinned where the search would not pick
# a pipeline, interleaving, context parallelism, replication or async TP by itself.
ROUND_TRIPS = {
    "8b_4_tp": (case_of("llama3-8b", 4, 32, 8192), {}),
    "8b_1_offload": (case_of("llama3-8b", 1, 8, 4096), {}),
    "70b_64": (case_of("llama3-70b", 64, 256, 8192), {}),
    "70b_256_interleaved": (case_of("llama3-70b", 256, 512, 8192), {"pp": 4, "vpp": 2}),
    "8b_16_cp": (case_of("llama3-8b", 16, 32, 32768), {"cp": 2}),
    "8b_16_replicated": (case_of("llama3-8b", 16, 64, 4096), {"zero_stage": 0}),
    "8b_32_1f1b": (case_of("llama3-8b", 32, 128, 8192), {"pp": 4, "vpp": 1}),
    "70b_128_async_tp": (case_of("llama3-70b", 128, 256, 8192, tp_comm_overlap=True), {"tp": 4, "pp": 2}),
    "qwen3_moe": (case_of("qwen3-30b-a3b", 16, 256, 4096), {}),
    # torch's ScheduleInterleaved1F1B runs micro-batches pp does not divide: 10 in 2 rounds of 5, 3 in one.
    "8b_16_interleaved_rounds": (case_of("llama3-8b", 16, 40, 4096), {"pp": 4, "vpp": 2, "dp": 4, "micro_batch_size": 1}),
    "8b_16_interleaved_one_round": (case_of("llama3-8b", 16, 12, 4096),
                                    {"pp": 4, "vpp": 2, "dp": 4, "micro_batch_size": 1}),
}


_BEST: dict[str, object] = {}


def best_for(case: dict, pins: dict):
    """The planner's best for torchtitan of ``case`` under ``pins``, planned once a module: the round trips,
    the test of what they cover and the launch-script test planned the same cases again (an Estimate is
    frozen, and the tests only read it)."""
    asked = {**case, "search": {"target": "torchtitan", **pins}}
    key = json.dumps(asked, sort_keys=True, default=str)
    if key not in _BEST:
        _BEST[key] = planner.plan(asked, top_k=0).best
    return _BEST[key]


def emitted(case: dict, pins: dict, folder: Path):
    """The planner's best for torchtitan and its files, written as `plan --emit` writes them."""
    best = best_for(case, pins)
    assert best is not None
    files, _ = render(best, "torchtitan", "<generated>")
    write_all([Output(folder / name, text) for name, text in files.items()], force=False)
    return best, folder / "overrides.txt"


def override_words(path: Path) -> list[str]:
    return [word for line in path.read_text().splitlines() if not line.startswith("#") for word in line.split()]


@pytest.mark.parametrize("label", ROUND_TRIPS)
def test_the_emitted_overrides_read_back_to_the_plans_layout_and_step_time(tmp_path, label):
    case, pins = ROUND_TRIPS[label]
    best, overrides = emitted(case, pins, tmp_path)
    # Diagnosed on the case as planned: the pins (a search section) hold the planner's best to them.
    result = diagnose({**case, "search": pins}, torchtitan=overrides)
    assert result.engine == "torchtitan"
    assert layout_to_mapping(result.estimate.job.layout) == layout_to_mapping(best.job.layout)
    assert result.estimate.step_time_s == best.step_time_s
    assert result.estimate.peak.total == best.peak.total
    # The planner's best for the same case is the plan's: nothing to change, nothing taken from the files.
    assert result.speedup == pytest.approx(1.0, abs=1e-12) and result.plan.differences(result.estimate) == {}
    # Read on the base config its header's command names, as it is run: said, and nothing else.
    # Of the files, only what the base config gives; of the case, what `plan` says (an MoE's routing, unstated).
    case_notes = planner.plan({**case, "search": pins}, engine="torchtitan", top_k=0).notes
    assert all("base config" in note or note in case_notes for note in result.notes) and result.planned_with is None


def test_a_job_that_forces_balanced_routing_is_priced_so_and_not_asked_for_its_imbalance(tmp_path):
    """torchtitan's debugging switch debug.moe_force_load_balance (config/configs.py: "for debugging usage
    only"; 0.2.0's training.debug_moe_force_load_balance, 0.2.2's [debug] table) gives the experts the
    token-slots round-robin (models/common/moe.py, TokenChoiceTopKRouter._debug_force_load_balance_routing:
    ``arange(B·L·K) % E``): the busiest expert takes the mean, model.moe_load_imbalance 1. diagnose told such
    a job its imbalance was unstated and to state what its runs measure."""
    case, pins = ROUND_TRIPS["qwen3_moe"]
    case = {**case, "search": pins}
    _, overrides = emitted(*ROUND_TRIPS["qwen3_moe"], tmp_path)
    # The planner plans real training: its files leave the switch off.
    assert not any("force_load_balance" in p.read_text() for p in tmp_path.iterdir() if p.is_file())
    plain = diagnose(case, torchtitan=overrides).notes
    assert any("model.moe_load_imbalance is unstated" in note for note in plain)
    forced = tmp_path / "forced.txt"
    forced.write_text("--debug.moe_force_load_balance\n" + overrides.read_text())  # before the subcommand
    notes = diagnose(case, torchtitan=forced).notes
    assert not any("moe_load_imbalance is unstated" in note for note in notes), notes
    said = [note for note in notes if "forces balanced routing" in note]
    assert len(said) == 1 and "debug.moe_force_load_balance" in said[0] and "round-robin" in said[0]
    # tyro's --debug.no_moe_force_load_balance turns it off
    forced.write_text("--debug.no_moe_force_load_balance\n" + overrides.read_text())
    assert any("moe_load_imbalance is unstated" in note for note in diagnose(case, torchtitan=forced).notes)
    # torchtitan 0.2's job files: 0.2.0's [training] key and 0.2.2's [debug] table; a case that states a
    # trained router's imbalance is priced as the job runs, balanced (the estimate of the case stated at 1)
    skewed = {**case, "model": {**case["model"], "moe_load_imbalance": 1.3}}
    balanced = {**case, "model": {**case["model"], "moe_load_imbalance": 1.0}}
    job = ("[training]\nlocal_batch_size = 16\nglobal_batch_size = 256\nseq_len = 4096\n{training}"
           "[parallelism]\nexpert_parallel_degree = 8\n[activation_checkpoint]\nmode = \"full\"\n{debug}")
    toml = tmp_path / "job.toml"
    toml.write_text(job.format(training="", debug=""))
    unforced = diagnose(balanced, torchtitan=toml).estimate.step_time_s
    assert diagnose(skewed, torchtitan=toml).estimate.step_time_s > unforced
    for training, debug, key in (("debug_moe_force_load_balance = true\n", "", "training.debug_moe_force_load_balance"),
                                 ("", "[debug]\nmoe_force_load_balance = true\n", "debug.moe_force_load_balance")):
        toml.write_text(job.format(training=training, debug=debug))
        run = diagnose(skewed, torchtitan=toml)
        assert run.estimate.step_time_s == unforced
        said = [note for note in run.notes if "forces balanced routing" in note]
        assert len(said) == 1 and key in said[0] and "model.moe_load_imbalance 1.3" in said[0], run.notes
    toml.write_text(job.format(training="", debug="[debug]\nmoe_force_load_balance = \"yes\"\n"))
    with pytest.raises(CaseError) as refused:
        diagnose(case, torchtitan=toml)
    assert refused.value.key == "debug.moe_force_load_balance" and "true or false" in refused.value.expected


def test_the_round_trips_cover_the_layouts_torchtitan_runs(tmp_path):
    """The cases above reach what the reader inverts: sharding and replication, TP, CP, pipelines with
    and without interleaving, offload, async TP and experts (a pin the search ignored would leave a
    branch of the reader untested)."""
    layouts = {label: best_for(case, pins).job for label, (case, pins) in ROUND_TRIPS.items()}
    lay = {label: job.layout for label, job in layouts.items()}
    assert lay["70b_256_interleaved"].vpp > 1 and lay["8b_32_1f1b"].pp == 4 and lay["8b_32_1f1b"].vpp == 1
    assert lay["8b_16_cp"].cp == 2 and lay["8b_16_replicated"].zero_stage == 0
    assert lay["8b_1_offload"].offload_params and lay["8b_4_tp"].tp > 1
    assert layouts["70b_128_async_tp"].training.tp_comm_overlap and lay["70b_128_async_tp"].tp == 4
    assert lay["qwen3_moe"].ep > 1
    assert [(layouts[k].num_microbatches, lay[k].pp, lay[k].vpp)
            for k in ("8b_16_interleaved_rounds", "8b_16_interleaved_one_round")] == [(10, 4, 2), (3, 4, 2)]


def test_a_launch_script_is_read_from_its_words_after_torchtitan_train(tmp_path):
    case, pins = ROUND_TRIPS["70b_256_interleaved"]
    best, overrides = emitted(case, pins, tmp_path)
    script = tmp_path / "train.sh"
    script.write_text("#!/usr/bin/env bash\nset -euo pipefail\n# a comment --parallelism.tensor_parallel_degree 8\n"
                      "torchrun --nnodes 32 --nproc_per_node 8 \\\n    -m torchtitan.train --module llama3 "
                      "--config llama3_70b \\\n    " + " ".join(override_words(overrides)) + ' "$@"\n')
    result = diagnose({**case, "search": pins}, torchtitan=script)
    assert layout_to_mapping(result.estimate.job.layout) == layout_to_mapping(best.job.layout)
    assert result.estimate.step_time_s == best.step_time_s
    # The base config is read from torchtitan's source, the overrides over it: said.
    assert any("base config --module llama3 --config llama3_70b: read with the settings it sets" in note
               for note in result.notes)


def test_torchtitans_own_base_config_is_read_from_its_source(tmp_path):
    """``--module llama3 --config llama3_70b`` with three overrides was read as torchtitan's bare defaults:
    tp 1, selective checkpointing, one accumulation step, where torchtitan builds llama3_70b's tp 8 and
    full checkpointing (models/llama3/config_registry.py: ParallelismConfig(tensor_parallel_degree=8),
    FullAC.Config()) and accumulates global / (local · dp) = 32 / (1 · 4) = 8 steps."""
    path = tmp_path / "overrides.txt"
    path.write_text("--module llama3 --config llama3_70b --training.seq_len 8192 --training.global_batch_size 32 "
                    "--training.local_batch_size 1\n")
    lay = diagnose(case_of("llama3-70b", 32, 32, 8192), torchtitan=path).estimate.job.layout
    assert (lay.dp, lay.tp, lay.recompute, lay.micro_batch_size) == (4, 8, "full", 1)
    # DeepSeek-V3's 671B config: Interleaved1F1B, the loss compiled alone, CUDA graphs off (with pp).
    path.write_text("--module deepseek_v3 --config deepseek_v3_671b --training.seq_len 4096 "
                    "--training.local_batch_size 8 --training.global_batch_size 256 "
                    "--parallelism.pipeline_parallel_degree 8 --parallelism.expert_parallel_degree 32\n")
    case = case_of("deepseek-v3", 256, 256, 4096)
    case["model"]["mtp_layers"] = 0
    result = diagnose(case, torchtitan=path)
    job = result.estimate.job
    assert (job.layout.pp, job.layout.vpp, job.layout.ep, job.layout.recompute) == (8, 2, 32, "selective")
    assert job.training.loss_compiled and job.training.loss_chunk_count == 8
    from planner.engines.torchtitan.base_config import read_base
    assert read_base("llama3", "llama3_70b", tmp_path).values["parallelism.tensor_parallel_degree"] == 8
    # ConfigManager's full module paths; a config built on another one (llama3_8b_mxfp8 on llama3_8b, its
    # compile replaced); a section given as a local (llama3_405b's compile=compile_config: async TP, which
    # was read as off); a local helper's own return (sft_qwen3_8b_math's process_sample: was None).
    for module in ("torchtitan.models.llama3", "torchtitan.models.llama3.config_registry"):
        assert read_base(module, "llama3_70b", tmp_path) == read_base("llama3", "llama3_70b", tmp_path)
    mxfp8 = read_base("llama3", "llama3_8b_mxfp8", tmp_path).values
    assert (mxfp8["training.seq_len"], mxfp8["compile.enable"], mxfp8["compile.components"]) == (8192, True, ["model"])
    big = read_base("llama3", "llama3_405b", tmp_path).values
    assert (big["compile.enable"], big["compile.enable_async_tensor_parallel"]) == (True, True)
    assert read_base("qwen3", "sft_qwen3_8b_math", tmp_path).values["training.seq_len"] == 2048
    # An unknown function or module: not read (the reader says so).
    for module, function in (("llama3", "llama3_9000b"), ("llama9", "x")):
        assert read_base(module, function, tmp_path) is None


def test_the_base_is_named_anywhere_and_its_expert_dispatch_decides_the_cuda_graph_refusal(tmp_path):
    """ConfigManager takes --module/--config out wherever they stand (they were refused after the
    checkpointing subcommand); a base whose model dispatches experts without host syncs (MinimalAsyncEP,
    HybridEP with a non-blocking capacity) runs CUDA graphs with expert parallelism, which
    Trainer.Config._validate_cuda_graphs refuses only for the all-to-all (it was refused for all)."""
    path = tmp_path / "overrides.txt"
    path.write_text("--training.local_batch_size 4 --training.global_batch_size 256 activation_checkpoint:none "
                    "--module llama3 --config llama3_70b\n")
    lay = diagnose(case_of("llama3-70b", 64, 256, 8192), torchtitan=path).estimate.job.layout
    assert (lay.tp, lay.recompute, lay.micro_batch_size) == (8, "none", 4)
    case = {"model": {"preset": "deepseek-v2-lite"}, "cluster": {"gpu": H100, "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096}}
    path.write_text("--module deepseek_v3 --config deepseek_v3_16b_minimal_async_ep "
                    "--parallelism.data_parallel_shard_degree 8 --parallelism.expert_parallel_degree 8 "
                    "--training.global_batch_size 64 --training.seq_len 4096 --training.local_batch_size 4\n")
    result = diagnose(case, torchtitan=path)
    assert result.estimate.job.layout.ep == 8
    assert any("minimal_async_ep" in note and "priced as the all-to-all" in note for note in result.notes)
    # deepseek_v3_16b turns CUDA graphs off itself; turned back on, its all-to-all is refused.
    path.write_text(path.read_text().replace("deepseek_v3_16b_minimal_async_ep", "deepseek_v3_16b").strip()
                    + " --training.no_disable_cuda_graphs\n")
    with pytest.raises(CaseError, match="false with expert parallelism"):
        diagnose(case, torchtitan=path)


def test_the_plans_own_launch_script_reads_back_through_its_config_module(tmp_path):
    """launch.sh starts ``--module torchtitan_config --config layout_planner``: the module beside it holds
    the layout (it was refused: "seq_len absent")."""
    case, pins = ROUND_TRIPS["70b_64"]
    best = best_for(case, pins)
    written = planner.emit(best, "torchtitan", tmp_path / "run")
    launch = next(p for p in written.paths if p.name == "launch.sh")
    result = diagnose(case, torchtitan=launch)
    assert layout_to_mapping(result.estimate.job.layout) == layout_to_mapping(best.job.layout)
    assert result.speedup == pytest.approx(1.0, abs=1e-12) and result.planned_with is None


def test_the_plans_config_module_given_itself_reads_as_its_launch_starts_it(tmp_path):
    """torchtitan 0.3.0 runs a config registry only as a command names it (config/manager.py
    ``ConfigManager._load_config``: ``--module M --config F``); the emitted torchtitan_config.py given to
    --torchtitan is read as its launch.sh starts it, ``--module torchtitan_config --config layout_planner``.
    It was read as shell words and refused at its docstring's apostrophe ("a quote with no end")."""
    case, pins = ROUND_TRIPS["70b_64"]
    best = best_for(case, pins)
    written = planner.emit(best, "torchtitan", tmp_path / "run")
    module = next(p for p in written.paths if p.name == "torchtitan_config.py")
    launch = next(p for p in written.paths if p.name == "launch.sh")
    result = diagnose(case, torchtitan=module)
    assert layout_to_mapping(result.estimate.job.layout) == layout_to_mapping(best.job.layout)
    assert result.estimate.step_time_s == best.step_time_s and result.estimate.peak.total == best.peak.total
    assert result.estimate.step_time_s == diagnose(case, torchtitan=launch).estimate.step_time_s
    assert any("--module torchtitan_config --config layout_planner" in note for note in result.notes)

    # Another Python file is no command: refused in one line naming it and what to give instead.
    other = tmp_path / "my_registry.py"
    other.write_text(module.read_text())
    case_file = tmp_path / "case.yaml"
    case_file.write_text(json.dumps(case))
    done = run_cli("diagnose", str(case_file), "--torchtitan", str(other))
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(other) in lines[0] and "--module M --config F" in lines[0]


# --- torchtitan's own parse of hand-written overrides -------------------------------------------

STUB = "tt_read_stub"
STUB_SOURCE = textwrap.dedent('''
    from dataclasses import dataclass, field

    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, SelectiveAC


    @dataclass(kw_only=True, slots=True)
    class Config:
        """The layout part of torchtitan's Trainer.Config (trainer.py), with its defaults."""

        hf_assets_path: str = "."  # ConfigManager._validate_config reads it
        training: TrainingConfig = field(default_factory=TrainingConfig)
        parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
        compile: CompileConfig = field(default_factory=CompileConfig)
        activation_checkpoint: ActivationCheckpointingConfig = field(default_factory=SelectiveAC.Config)


    def base():
        return Config()
''')


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    path = tmp_path_factory.mktemp("tt_read")
    (path / f"{STUB}.py").write_text(STUB_SOURCE)
    sys.path.insert(0, str(path))
    yield
    sys.path.remove(str(path))


HAND_WRITTEN = {
    # FSDP over the rest (-1), TP 2 in tyro's hyphenated spelling, full checkpointing.
    "fsdp_rest_tp": (case_of("llama3-8b", 16, 64, 8192),
                     "--parallelism.tensor-parallel-degree 2 --training.local_batch_size=2 "
                     "--training.global_batch_size 64 --training.seq_len 8192 --compile.enable activation_checkpoint:full",
                     Layout(dp=8, tp=2, zero_stage=3, sequence_parallel=True, micro_batch_size=2, recompute="full")),
    # Replication, no checkpointing, accumulation from the global batch.
    "ddp": (case_of("llama3-8b", 8, 64, 4096),
            "--parallelism.data_parallel_replicate_degree 8 --parallelism.data_parallel_shard_degree 1 "
            "--training.local_batch_size 2 --training.global_batch_size 64 --training.seq_len 4096 "
            "activation_checkpoint:none",
            Layout(dp=8, zero_stage=0, micro_batch_size=2, recompute="none")),
    # A pipeline split by torchtitan itself (1F1B, one part a rank, the embedding and output weighed as
    # a layer each: 8, 9, 8, 7 layers), the default selective checkpointing.
    "torchtitan_split": (case_of("llama3-8b", 32, 128, 8192),
                         "--parallelism.pipeline_parallel_degree 4 --parallelism.pipeline_parallel_microbatch_size 2 "
                         "--training.local_batch_size 8 --training.global_batch_size 128 --training.seq_len 8192 "
                         "--training.disable_cuda_graphs --compile.enable",
                         Layout(dp=8, pp=4, zero_stage=3, micro_batch_size=2, recompute="selective",
                                stage_layers=(8, 9, 8, 7))),
    # Trainer.Config's own --hf_assets_path, and the subcommand's own option after it (both were refused).
    "top_level_and_ac_option": (case_of("llama3-8b", 8, 64, 8192),
                                "--hf_assets_path ./assets/hf/Llama-3.1-8B --training.local_batch_size 1 "
                                "--training.global_batch_size 64 --training.seq_len 8192 --compile.enable "
                                "activation_checkpoint:full --activation_checkpoint.no_preserve_rng_state",
                                Layout(dp=8, zero_stage=3, micro_batch_size=1, recompute="full")),
    # TP without sequence parallelism (parallelism.enable_sequence_parallel): refused as unrunnable.
    "tp_without_sp": (case_of("llama3-8b", 8, 64, 8192),
                      "--parallelism.tensor_parallel_degree 2 --parallelism.no_enable_sequence_parallel "
                      "--training.local_batch_size 2 --training.global_batch_size 64 --training.seq_len 8192 "
                      "--compile.enable activation_checkpoint:none",
                      Layout(dp=4, tp=2, zero_stage=3, sequence_parallel=False, micro_batch_size=2,
                             recompute="none")),
}


@pytest.mark.parametrize("label", HAND_WRITTEN)
def test_hand_written_overrides_read_as_torchtitan_parses_them(tmp_path, stub, label):
    case, text, expected = HAND_WRITTEN[label]
    path = tmp_path / "overrides.txt"
    path.write_text(text + "\n")
    layout = read_config(case, "torchtitan", path)
    assert layout == expected
    # torchtitan's own parse of the same words, and its ParallelDims over the case's GPUs.
    cfg = ConfigManager().parse_args(["--module", STUB, "--config", "base", *text.split()])
    p, t = cfg.parallelism, cfg.training
    dims = ParallelDims.from_config(p, case["cluster"]["num_gpus"])
    assert (dims.dp_replicate * dims.dp_shard, dims.tp, dims.pp, dims.cp) == (layout.dp, layout.tp, layout.pp,
                                                                             layout.cp)
    assert (dims.dp_shard > 1) == (layout.zero_stage == 3)
    assert p.enable_sequence_parallel == layout.sequence_parallel or layout.tp == 1
    micro = p.pipeline_parallel_microbatch_size if dims.pp > 1 else t.local_batch_size
    assert micro == layout.micro_batch_size and t.global_batch_size == case["training"]["global_batch_size"]
    recompute = {FullAC.Config: "full", SelectiveAC.Config: "selective", type(None): "none"}
    assert recompute[type(cfg.activation_checkpoint)] == layout.recompute


def test_torchtitans_own_pipeline_split_is_its_generator():
    """generated_counts restates pipeline_parallel.py's _generate_llm_fqn_per_model_part: counted
    against torchtitan's own names for the splits the reader infers."""
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    for stages, layers, first, last in ((4, 32, 1, 1), (2, 32, 1, 1), (8, 80, 1, 1), (16, 126, 1, 1),
                                        (6, 61, 2, 1), (4, 30, 0, 0), (1, 32, 1, 1)):
        parts = _generate_llm_fqn_per_model_part(stages, layers, first, last)
        assert generated_counts(stages, layers, first, last) == [sum(n.startswith("layers.") for n in part)
                                                                 for part in parts]


# --- torchtitan 0.2 TOML -----------------------------------------------------------------------

# torchtitan 0.2's models/llama3/train_configs/llama3_8b.toml, its batch and sequence as the case's.
LLAMA3_8B_TOML = """\
# torchtitan Config.toml
# NOTE: this toml config is a preset for 64 A100 GPUs.

[job]
dump_folder = "./outputs"
description = "Llama 3 8B training"

[profiling]
enable_profiling = true
save_traces_folder = "profile_trace"
profile_freq = 100

[metrics]
log_freq = 10
enable_tensorboard = true
save_tb_folder = "tb"

[model]
name = "llama3"
flavor = "8B"
hf_assets_path = "./assets/hf/Llama-3.1-8B"
# converters = ["float8"]

[optimizer]
name = "AdamW"
lr = 3e-4
eps = 1e-8

[lr_scheduler]
warmup_steps = 200  # lr scheduler warm up

[training]
local_batch_size = 1
seq_len = 8192
max_norm = 1.0  # grad norm clipping
steps = 1000
dataset = "c4"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 1
pipeline_parallel_degree = 1
context_parallel_degree = 1

[checkpoint]
enable = false
folder = "checkpoint"
interval = 500
last_save_model_only = true
export_dtype = "float32"
async_mode = "disabled" # ["disabled", "async", "async_with_pinned_mem"]

[compile]
enable=false
components = ["model", "loss"]

[activation_checkpoint]
mode = "selective"  # ["none", "selective", "full"]
selective_ac_option = "op"  # "int" = ac every positive int layer or 'op', ac based on ops policy

[quantize.linear.float8]
enable_fsdp_float8_all_gather = false
precompute_float8_dynamic_scale_for_fsdp = false
filter_fqns = ["output"]
"""


def test_torchtitan_0_2s_llama3_8b_toml_reads_to_its_layout(tmp_path):
    path = tmp_path / "llama3_8b.toml"
    path.write_text(LLAMA3_8B_TOML)
    case = case_of("llama3-8b", 64, 64, 8192)
    result = diagnose(case, torchtitan=path)
    assert layout_to_mapping(result.estimate.job.layout) == {
        "dp": 64, "tp": 1, "pp": 1, "cp": 1, "vpp": 1, "micro_batch_size": 1, "zero_stage": 3,
        "sequence_parallel": False, "recompute": "selective"}
    # It compiles neither model nor loss: the loss taken from the file for the planner's best too,
    # and the model said to be priced compiled. torchtitan 0.2's loss ran on whole logits.
    assert result.estimate.job.training.compiled_loss is False
    assert result.estimate.job.training.loss_chunk_count == 1
    assert result.planned_with == ("training.compiled_loss false (compile.components); training.loss_chunks 1 "
                                   "(a torchtitan 0.1 or 0.2 job file: no chunked loss)")
    assert any("does not compile the model" in note for note in result.notes)


def test_a_toml_pipeline_split_by_torchtitan_and_its_layer_checkpointing(tmp_path):
    """No module_fqns_per_model_part: torchtitan's own split (Interleaved1F1B: two parts a rank);
    selective_ac_option "1" checkpoints every layer whole (recompute full)."""
    text = LLAMA3_8B_TOML.replace("pipeline_parallel_degree = 1", 'pipeline_parallel_degree = 2\n'
                                  'pipeline_parallel_schedule = "Interleaved1F1B"\n'
                                  "pipeline_parallel_microbatch_size = 1") \
        .replace("local_batch_size = 1", "local_batch_size = 8").replace('selective_ac_option = "op"',
                                                                         'selective_ac_option = "1"')
    path = tmp_path / "pp.toml"
    path.write_text(text)
    layout = read_config(case_of("llama3-8b", 64, 256, 8192), "torchtitan", path)
    # 4 parts of 32 layers with the embedding and the output weighed as one each: 8, 9, 8, 7 in model
    # order; rank 0 holds parts 0 and 2 (16 layers), rank 1 parts 1 and 3 (16): equal chunks per rank
    # they are not, so the parts are the layout's chunks.
    assert (layout.dp, layout.pp, layout.vpp, layout.recompute) == (32, 2, 2, "full")
    assert layout.chunk_layers == (8, 9, 8, 7) and layout.stage_layers == (16, 16)


# --- refusals ----------------------------------------------------------------------------------

REFUSALS = {
    "hsdp": ("--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 4",
             "parallelism.data_parallel_replicate_degree", "HSDP"),
    "product": ("--parallelism.data_parallel_shard_degree 4 --parallelism.tensor_parallel_degree 4",
                "parallelism.data_parallel_shard_degree", "but the case has 8 GPUs"),
    "rest_does_not_divide": ("--parallelism.tensor_parallel_degree 3",
                             "parallelism.data_parallel_shard_degree", "does not divide the case's 8 GPUs"),
    "ac_mode": ("activation_checkpoint:partial", "activation_checkpoint", "unknown mode 'partial'"),
    "ac_memory_budget": ("activation_checkpoint:memory-budget", "activation_checkpoint", "not priced"),
    # with its own options (MemoryBudgetAC.Config), which tyro takes: the mode refused, not an option of it
    "ac_memory_budget_options": ("activation_checkpoint:memory-budget --activation_checkpoint.memory_budget 0.3 "
                                 "--activation_checkpoint.visualize_memory_budget_pareto", "activation_checkpoint",
                                 "memory-budget checkpointing (MemoryBudgetAC) is not priced"),
    "global_batch": ("--training.global_batch_size 128", "training.global_batch_size",
                     "training.global_batch_size 64"),
    "global_batch_default": ("--training.local_batch_size 4", "training.global_batch_size",
                             "absent (torchtitan's default -1"),
    "non_integer_degree": ("--parallelism.tensor_parallel_degree 2.5", "parallelism.tensor_parallel_degree",
                           "expected an integer, got '2.5'"),
    # Past int64 (torchtitan's int fields go to torch): the bound said, not "expected an integer, got '4096…'".
    "seq_len_digits": ("--training.seq_len 4096000000000000000000000000000000", "training.seq_len",
                       "expected an integer >= 1 and <= 9223372036854775807, got one of 34 digits"),
    "degree_past_int64": ("--parallelism.tensor_parallel_degree 9223372036854775808",
                          "parallelism.tensor_parallel_degree",
                          "expected an integer >= 1 and <= 9223372036854775807, got 9223372036854775808"),
    "misspelled": ("--parallelism.tensor_paralel_degree 2", "parallelism.tensor_paralel_degree",
                   "did you mean parallelism.tensor_parallel_degree?"),
    "seq_len": ("--training.seq_len 2048", "training.seq_len", "differs from the case's training.seq_len 4096"),
    "fp32_params": ("--training.mixed_precision_param float32", "training.mixed_precision_param",
                    "trains in bf16"),
    "schedule": ("--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule ZBVZeroBubble "
                 "--training.disable_cuda_graphs", "parallelism.pipeline_parallel_schedule", "not priced"),
    "cuda_graphs": ("--parallelism.pipeline_parallel_degree 2", "training.disable_cuda_graphs",
                    "CUDA graphs do not support pipeline parallelism"),
    "dense_ep": ("--parallelism.expert_parallel_degree 2", "parallelism.expert_parallel_degree", "dense"),
    "missing_layer": ("--parallelism.pipeline_parallel_degree 2 --training.disable_cuda_graphs "
                      "--parallelism.module_fqns_per_model_part tok_embeddings,"
                      + ",".join(f"layers.{i}" for i in range(16)) + " "
                      + ",".join(f"layers.{i}" for i in range(17, 32)) + ",norm,lm_head",
                      "parallelism.module_fqns_per_model_part", "expected each of the case's model's 32 layers"),
    "switch_with_value": ("--compile.enable true", "compile.enable", "a switch"),
    "stray_word": ("--compile.enable activation_checkpoint:full full", "full", "stray word"),
    "async_tp_eager": ("--parallelism.tensor_parallel_degree 2 --compile.enable_async_tensor_parallel",
                       "compile.enable_async_tensor_parallel", "needs the model compiled"),
}
BASE_OVERRIDES = "--training.local_batch_size 8 --training.global_batch_size 64 --training.seq_len 4096"


@pytest.mark.parametrize("label", REFUSALS)
def test_a_contradiction_is_a_case_error_naming_the_file_and_the_key(tmp_path, label):
    words, key, needle = REFUSALS[label]
    path = tmp_path / "overrides.txt"
    # The batch the case has unless the refusal is about it (8 GPUs, local 8: accumulation 1).
    base = "" if label.startswith("global_batch") else BASE_OVERRIDES
    if label == "global_batch":
        base = "--training.local_batch_size 8 --training.seq_len 4096"
    if label == "seq_len":
        base = "--training.local_batch_size 8 --training.global_batch_size 64"
    if label == "global_batch_default":
        base = "--training.seq_len 4096"
    path.write_text(f"{base} {words}\n")
    case = case_of("llama3-8b", 8, 64, 4096)
    with pytest.raises(CaseError) as error:
        diagnose(case, torchtitan=path)
    assert (error.value.source, error.value.key) == (str(path), key)
    assert needle in error.value.expected


def test_the_same_files_without_the_contradiction_are_read(tmp_path):
    """The refusals above are of their one key: the base they are added to reads (else a refusal
    could pass for the wrong reason)."""
    path = tmp_path / "overrides.txt"
    path.write_text(BASE_OVERRIDES + " --compile.enable\n")
    layout = diagnose(case_of("llama3-8b", 8, 64, 4096), torchtitan=path).estimate.job.layout
    assert (layout.dp, layout.zero_stage, layout.micro_batch_size, layout.recompute) == (8, 3, 8, "selective")


def test_a_toml_refuses_what_0_2_runs_and_the_cost_model_does_not(tmp_path):
    case = case_of("llama3-8b", 64, 64, 8192)
    path = tmp_path / "job.toml"
    # 0.2's default selective_ac_option, "2": every other layer checkpointed whole.
    path.write_text(LLAMA3_8B_TOML.replace('selective_ac_option = "op"', ""))
    with pytest.raises(CaseError) as error:
        read_config(case, "torchtitan", path)
    assert error.value.key == "activation_checkpoint.selective_ac_option" and "default '2'" in error.value.expected
    path.write_text(LLAMA3_8B_TOML.replace("tensor_parallel_degree = 1", "tensor_parallel_degree = 2.0"))
    with pytest.raises(CaseError) as error:
        read_config(case, "torchtitan", path)
    assert error.value.key == "parallelism.tensor_parallel_degree"
    path.write_text(LLAMA3_8B_TOML.replace('# converters = ["float8"]', 'converters = ["float8"]'))
    with pytest.raises(CaseError) as error:
        read_config(case, "torchtitan", path)
    assert error.value.key == "model.converters" and "trains in bf16" in error.value.expected
    path.write_text(LLAMA3_8B_TOML.replace("data_parallel_replicate_degree = 1", "data_parallel_replicate_degree = 2"))
    with pytest.raises(CaseError) as error:
        read_config(case, "torchtitan", path)
    assert error.value.key == "parallelism.data_parallel_replicate_degree"
    path.write_text(LLAMA3_8B_TOML.replace("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 2\n"
                                                                         'pipeline_parallel_split_points = ["layers.16"]'))
    with pytest.raises(CaseError) as error:
        read_config(case, "torchtitan", path)
    assert error.value.key == "parallelism.pipeline_parallel_split_points"
    path.write_text('[job]\ndescription = "no layout here"\n')
    with pytest.raises(CaseError, match="not a torchtitan job file"):
        read_config(case, "torchtitan", path)


def test_tensor_parallelism_without_sequence_parallelism_reads_as_such(tmp_path):
    """torchtitan 0.3.0 runs TP without sequence parallelism where told (config/configs.py
    enable_sequence_parallel, which every model's parallelize takes as enable_sp): it was refused as
    a layout torchtitan cannot run."""
    path = tmp_path / "overrides.txt"
    path.write_text(BASE_OVERRIDES.replace("local_batch_size 8", "local_batch_size 16")
                    + " --parallelism.tensor_parallel_degree 2 --parallelism.no_enable_sequence_parallel\n")
    lay = diagnose(case_of("llama3-8b", 8, 64, 4096), torchtitan=path).estimate.job.layout
    assert (lay.tp, lay.sequence_parallel) == (2, False)


def test_a_layout_torchtitan_cannot_run_is_named_in_the_file(tmp_path):
    """The engine's refusal names the option that set the layout, not the case's layout section: a
    chunked loss whose chunks do not divide each rank's sequence (ChunkedLossWrapper's torch._check)."""
    path = tmp_path / "overrides.txt"
    path.write_text(BASE_OVERRIDES + " --parallelism.context_parallel_degree 8 --loss.num_chunks 1024\n")
    with pytest.raises(CaseError) as error:
        diagnose(case_of("llama3-8b", 8, 64, 4096), torchtitan=path)
    assert (error.value.source, error.value.key) == (str(path), "parallelism.context_parallel_degree")


def test_the_loss_chunks_a_command_line_sets_are_read_and_a_case_that_says_otherwise_is_refused(tmp_path):
    """torchtitan 0.3.0 runs its loss in the base config's ChunkedLossWrapper chunks (8) unless
    ``--loss.num_chunks`` says otherwise: the job is priced in those chunks, and a case naming others is
    refused at that option."""
    path = tmp_path / "overrides.txt"
    path.write_text(BASE_OVERRIDES + " --compile.enable\n")
    result = diagnose(case_of("llama3-8b", 8, 64, 4096), torchtitan=path)
    assert result.estimate.job.training.loss_chunk_count == 8 and result.planned_with is None
    path.write_text(BASE_OVERRIDES + " --compile.enable --loss.num_chunks 4\n")
    result = diagnose(case_of("llama3-8b", 8, 64, 4096), torchtitan=path)
    assert result.estimate.job.training.loss_chunk_count == 4
    assert result.planned_with == "training.loss_chunks 4 (loss.num_chunks)"
    with pytest.raises(CaseError, match="runs its LM head and loss in 4 sequence chunk") as error:
        diagnose(case_of("llama3-8b", 8, 64, 4096, loss_chunks=16), torchtitan=path)
    assert (error.value.key, error.value.source) == ("loss.num_chunks", str(path))


def test_one_chunk_on_the_command_line_is_torchtitans_wrapper_not_the_loss_on_whole_logits(tmp_path):
    """``--loss.num_chunks 1`` keeps torchtitan 0.3.0's ChunkedLossWrapper (components/loss.py): one chunk of
    the whole sequence, run forward and backward inside the forward, no logits kept after it
    (tests/test_chunked_loss_torch.py measures it). Priced so: the last stage keeps the final norm's input
    and two 16-bit tensors of the hidden states' shape, not the 4-byte log-softmax of every logit that a
    case's ``loss_chunks: 1`` (the cross-entropy on whole logits) keeps; a case that says whole logits is
    refused at the option."""
    from cost_models.activations import head_activation_bytes, residual_bytes

    path = tmp_path / "overrides.txt"
    path.write_text(BASE_OVERRIDES + " --compile.enable --loss.num_chunks 1\n")
    result = diagnose(case_of("llama3-8b", 8, 64, 4096), torchtitan=path)
    job = result.estimate.job
    training, lay = job.training, job.layout
    assert training.loss_chunk_count == 1 and training.chunked_loss is True
    assert result.planned_with == "training.loss_chunks 1 (loss.num_chunks); training.chunked_loss true " \
                                  "(loss.num_chunks)"
    tokens = 4096 // lay.cp * lay.micro_batch_size
    sp = lay.tp if lay.sequence_parallel else 1
    assert head_activation_bytes(job.model, training, lay) \
        == (residual_bytes(training) / sp + 2 * 2) * tokens * job.model.hidden_size
    with pytest.raises(CaseError, match="runs its LM head and loss in ChunkedLossWrapper") as error:
        diagnose(case_of("llama3-8b", 8, 64, 4096, loss_chunks=1, chunked_loss=False), torchtitan=path)
    assert (error.value.key, error.value.source) == ("loss.num_chunks", str(path))


def test_a_case_that_contradicts_the_jobs_training_is_refused(tmp_path):
    path = tmp_path / "overrides.txt"
    path.write_text(BASE_OVERRIDES + " --compile.enable --compile.components model\n")
    with pytest.raises(CaseError) as error:
        diagnose(case_of("llama3-8b", 8, 64, 4096, compiled_loss=True), torchtitan=path)
    assert (error.value.key, error.value.source) == ("compile.components", str(path))


# --- the command line --------------------------------------------------------------------------

def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, timeout=300)


def test_the_cli_reads_the_emitted_overrides_and_refuses_a_bad_file_in_one_line(tmp_path):
    case, pins = ROUND_TRIPS["8b_4_tp"]
    best, overrides = emitted(case, pins, tmp_path / "run")
    case_file = tmp_path / "case.yaml"
    case_file.write_text(json.dumps(case))
    done = run_cli("diagnose", str(case_file), "--torchtitan", str(overrides), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["engine"] == "torchtitan" and data["config"]["layout"] == layout_to_mapping(best.job.layout)
    assert data["speedup"] == pytest.approx(1.0)

    bad = tmp_path / "bad.txt"
    bad.write_text(overrides.read_text().replace("--parallelism.tensor_parallel_degree 2",
                                                 "--parallelism.tensor_parallel_degree two"))
    done = run_cli("diagnose", str(case_file), "--torchtitan", str(bad))
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "parallelism.tensor_parallel_degree" in lines[0]

    done = run_cli("diagnose", str(case_file), "--torchtitan", str(overrides), "--megatron-args", str(bad))
    assert done.returncode == 2 and "--torchtitan" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_without_expert_parallelism_the_experts_split_over_the_tp_ranks(tmp_path):
    """torchtitan shards the routed experts on the TP axis where expert parallelism is off
    (models/common/moe_sharding.py, expert_param_placement_dense): Llama 4 Maverick's tp 8, ep 1 read
    as whole experts on every rank was 'does not fit' (92.8 GB) and a 12x speedup. The plan, too, priced
    whole experts beside TP at ep 1."""
    case = case_of("qwen3-30b-a3b", 16, 256, 4096, engine="torchtitan")
    path = tmp_path / "overrides.txt"
    path.write_text("--training.local_batch_size 1 --training.global_batch_size 256 --training.seq_len 4096 "
                    "--parallelism.tensor_parallel_degree 2 --parallelism.expert_parallel_degree 1\n")
    read = diagnose(case, torchtitan=path)
    assert (read.estimate.job.layout.ep, read.estimate.job.layout.expert_tp) == (1, 2)
    # a 0.2 TOML's expert_tensor_parallel_degree has no effect without expert parallelism
    toml = tmp_path / "job.toml"
    toml.write_text("[training]\nlocal_batch_size = 1\nglobal_batch_size = 256\nseq_len = 4096\n"
                    "[parallelism]\ntensor_parallel_degree = 2\nexpert_parallel_degree = 1\n"
                    "expert_tensor_parallel_degree = 2\n[activation_checkpoint]\nmode = \"full\"\n")
    assert diagnose(case, torchtitan=toml).estimate.job.layout.expert_tp == 2
    # the search and estimate hold torchtitan to it: whole experts at ep 1 beside TP are no torchtitan layout
    for best in (planner.plan(case, target="torchtitan", top_k=5), ):
        for est in (best.best, *best.alternatives):
            lay = est.job.layout
            assert lay.expert_tp == (lay.tp if lay.ep == 1 else 1)
    with pytest.raises(CaseError) as refused:
        planner.estimate({**case, "layout": {"tp": 2, "dp": 8, "ep": 1, "etp": 1, "zero_stage": 3,
                                             "micro_batch_size": 1, "sequence_parallel": True}})
    assert refused.value.key == "layout.etp" and "expert_param_placement_dense" in refused.value.expected


def test_torchtitan_0_2s_float8_converters_are_read_by_their_registered_names(tmp_path):
    """0.2 registers quantize.linear.float8 (components/quantization/float8.py) and keeps its recipe in
    [quantize.linear.float8]; the reader took only 0.1's float8 and [float8], so no 0.2 float8 file
    could be diagnosed. Without a recipe 0.2 scales per tensor, which 0.3.0 no longer runs: said so."""
    case = case_of("llama3-8b", 8, 64, 4096, engine="torchtitan", precision="fp8", fp8_recipe="rowwise")
    body = ("[training]\nlocal_batch_size = 8\nglobal_batch_size = 64\nseq_len = 4096\n[parallelism]\n"
            "data_parallel_shard_degree = -1\n[activation_checkpoint]\nmode = \"full\"\n"
            "[model]\nconverters = [\"quantize.linear.float8\"]\n[quantize.linear.float8]\n")
    path = tmp_path / "job.toml"
    path.write_text(body + "recipe_name = \"rowwise\"\n")
    assert diagnose(case, torchtitan=path).estimate.job.training.recipe.name == "rowwise"
    path.write_text(body)
    with pytest.raises(CaseError) as refused:
        diagnose(case, torchtitan=path)
    assert refused.value.key == "quantize.linear.float8.recipe_name" and "per tensor" in refused.value.expected
    # The experts' converter alone converts nothing of a dense model: it was priced in fp8.
    path.write_text(body.replace("quantize.linear.float8\"]", "quantize.grouped_mm.float8\"]") +
                    "recipe_name = \"rowwise\"\n")
    with pytest.raises(CaseError) as refused:
        diagnose(case, torchtitan=path)
    assert refused.value.key == "model.converters" and "grouped experts only" in refused.value.expected


def test_a_launch_script_is_read_as_bash_runs_it(tmp_path):
    """A script's variables (${TP}), the branch bash takes (torchtitan's run_train.sh starts a debug
    run under `if [ -n "$COMM_MODE" ]`, which it skips) and the commands after the launch (an echo)
    were read as plain words: the first -m torchtitan.train won, and `echo` joined the last option."""
    script = tmp_path / "train.sh"
    script.write_text('#!/bin/bash\nTP=${TP:-2}\nCOMM_MODE=${COMM_MODE:-""}\n'
                      'if [ -n "$COMM_MODE" ]; then\n'
                      '    python3 -m torchtitan.train --parallelism.tensor_parallel_degree 8 --comm.mode=$COMM_MODE\n'
                      'else\n'
                      '    torchrun --nproc_per_node=8 -m torchtitan.train --parallelism.tensor_parallel_degree ${TP} '
                      '--training.local_batch_size 4 --training.global_batch_size 64 --training.seq_len 2048 "$@"\n'
                      'fi\necho "training done"\n')
    read = diagnose(case_of("llama3-8b", 8, 64, 2048, engine="torchtitan"), torchtitan=script)
    lay = read.estimate.job.layout
    assert (lay.tp, lay.dp, lay.micro_batch_size) == (2, 4, 4)
    script.write_text("#!/bin/bash\necho nothing to train\n")
    with pytest.raises(CaseError, match="starts no torchtitan training"):
        diagnose(case_of("llama3-8b", 8, 64, 2048, engine="torchtitan"), torchtitan=script)


# What tyro, torchtitan's ConfigManager or torchrun refuse, or another run than the case's, read as
# another job with exit 0 (a hostile probe of the reader): each now one line naming the key.
HOSTILE = {
    # a misspelt section dropped: tp 1 where the file says 2
    "section": (BASE_OVERRIDES + " --paralelism.tensor_parallel_degree 2", "--paralelism.tensor_parallel_degree",
                "did you mean parallelism?"),
    # 0.2's spelling on a 0.3 command line: read as the default, selective
    "ac_option": (BASE_OVERRIDES + " --activation_checkpoint.mode full", "--activation_checkpoint.mode",
                  "the subcommand activation_checkpoint:"),
    "reshard": (BASE_OVERRIDES + " --parallelism.fsdp_reshard_after_forward sometimes",
                "parallelism.fsdp_reshard_after_forward", "expected one of default, always, never"),
    "subcommand_first": ("activation_checkpoint:full " + BASE_OVERRIDES, "--training.local_batch_size",
                         "the subcommand goes last"),
    "two_subcommands": (BASE_OVERRIDES + " activation_checkpoint:full activation_checkpoint:none",
                        "activation_checkpoint:none", "a second activation-checkpoint subcommand"),
    "world": ("#!/bin/bash\ntorchrun --nnodes 2 --nproc_per_node 8 -m torchtitan.train " + BASE_OVERRIDES,
              "--nproc-per-node", "torchrun starts 16 ranks, but the case"),
    "no_norm": (BASE_OVERRIDES + " --training.disable_cuda_graphs --parallelism.pipeline_parallel_degree 2 "
                "--parallelism.pipeline_parallel_microbatch_size 1 --parallelism.module_fqns_per_model_part "
                + ",".join(["tok_embeddings"] + [f"layers.{i}" for i in range(16)]) + " "
                + ",".join(f"layers.{i}" for i in range(16, 32)), "parallelism.module_fqns_per_model_part",
                "names no norm"),
}


def test_a_list_option_in_two_words_and_experts_on_cuda_graphs_are_refused_as_torchtitan_does(tmp_path, stub):
    """--compile.components model loss (two words) was read as both; tyro takes one comma-separated word
    (ConfigManager's list_str_rule). Expert parallelism without --training.disable_cuda_graphs was
    diagnosed; Trainer.Config refuses it (the all-to-all dispatcher synchronizes with the host)."""
    words = BASE_OVERRIDES + " --compile.enable --compile.components model loss"
    with pytest.raises(SystemExit):
        ConfigManager().parse_args(["--module", STUB, "--config", "base", *words.split()])
    path = tmp_path / "overrides.txt"
    path.write_text(words + "\n")
    with pytest.raises(CaseError, match="one comma-separated word") as error:
        diagnose(case_of("llama3-8b", 8, 64, 4096), torchtitan=path)
    assert error.value.key == "compile.components"
    path.write_text("--training.local_batch_size 16 --training.global_batch_size 256 --training.seq_len 4096 "
                    "--compile.enable --parallelism.expert_parallel_degree 8\n")
    with pytest.raises(CaseError, match="absent with expert parallelism") as error:
        diagnose(case_of("qwen3-30b-a3b", 16, 256, 4096), torchtitan=path)
    assert error.value.key == "training.disable_cuda_graphs"


@pytest.mark.parametrize("label", HOSTILE)
def test_what_torchtitan_would_refuse_or_run_otherwise_is_refused(tmp_path, label):
    text, key, said = HOSTILE[label]
    path = tmp_path / ("train.sh" if text.startswith("#!") else "overrides.txt")
    path.write_text(text + "\n")
    with pytest.raises(CaseError) as error:
        diagnose(case_of("llama3-8b", 8, 64, 4096), torchtitan=path)
    assert error.value.key == key and said in error.value.expected, str(error.value)


def test_a_toml_key_torchtitan_does_not_define_and_deep_nesting_are_refused(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(LLAMA3_8B_TOML.replace("tensor_parallel_degree", "tensor_parallel_degre"))
    with pytest.raises(CaseError) as error:  # ConfigManager._dict_to_dataclass: "Invalid field names"
        read_config(case_of("llama3-8b", 64, 64, 8192), "torchtitan", path)
    assert error.value.key == "parallelism.tensor_parallel_degre" and "did you mean" in error.value.expected
    path.write_text("[training]\nx = " + "[" * 500 + "]" * 500 + "\n")  # tomllib: RecursionError
    with pytest.raises(CaseError, match="nested too deeply"):
        read_config(case_of("llama3-8b", 64, 64, 8192), "torchtitan", path)
    # A misspelt section, a stray top-level key: JobConfig has neither, and torchtitan refuses the file
    # (they were dropped: tp read as 1).
    for text, key in (("[paralelism]\ntensor_parallel_degree = 4\n", "paralelism"), ("stray = 3\n", "stray")):
        path.write_text(text + LLAMA3_8B_TOML)
        with pytest.raises(CaseError) as error:
            read_config(case_of("llama3-8b", 64, 64, 8192), "torchtitan", path)
        assert error.value.key == key and "unknown section" in error.value.expected
    # An integer of 5,000 digits: tomllib's ValueError (Python's conversion limit) was a traceback.
    path.write_text(LLAMA3_8B_TOML.replace("tensor_parallel_degree = 1", "tensor_parallel_degree = " + "1" * 5000))
    with pytest.raises(CaseError) as error:
        read_config(case_of("llama3-8b", 64, 64, 8192), "torchtitan", path)
    assert error.value.key == "parallelism.tensor_parallel_degree"


def test_torchtitans_own_interleaved_split_is_read_and_priced(tmp_path):
    """pp 2 with Interleaved1F1B and no module_fqns_per_model_part: torchtitan splits 32 layers into parts
    of 8, 9, 8 and 7 (its first and last a layer short) and runs them; it was refused as chunks
    torchtitan could not run."""
    path = tmp_path / "overrides.txt"
    path.write_text(BASE_OVERRIDES + " --training.disable_cuda_graphs --parallelism.pipeline_parallel_degree 2 "
                    "--parallelism.pipeline_parallel_schedule Interleaved1F1B "
                    "--parallelism.pipeline_parallel_microbatch_size 1\n")
    lay = diagnose(case_of("llama3-8b", 8, 64, 4096), torchtitan=path).estimate.job.layout
    assert (lay.pp, lay.vpp, lay.chunk_layers) == (2, 2, (8, 9, 8, 7))


def test_a_launch_scripts_reading_is_said_in_notes(tmp_path):
    """The branch a script takes on what it does not set, and a program it runs beside the training, are
    notes, as the Megatron reader gives them; they were not said."""
    script = tmp_path / "train.sh"
    script.write_text('#!/bin/bash\nif [ "$BIG" = 1 ]; then TP=4; else TP=2; fi\n'
                      "torchrun --nproc_per_node 8 -m torchtitan.train --parallelism.tensor_parallel_degree $TP "
                      + BASE_OVERRIDES + "\npython eval.py --foo\n")
    notes = diagnose(case_of("llama3-8b", 8, 64, 4096), torchtitan=script).notes
    assert any("BIG is not set by the script" in n and "else branch" in n for n in notes), notes
    assert any("also runs python eval.py" in n for n in notes), notes


def test_the_plans_own_interleaved_files_suggest_no_change(tmp_path):
    """Llama 3 8B on 24 H100s, pp 3, vpp 2: the files write the planner's own uneven chunks (5, 6, 5, 6,
    5, 5), read back with them stated, and diagnose printed 'change: stage_layers 11×2, 10→even,
    chunk_layers 5, 6, 5, 6, 5×2→-' beside a 1.00× speedup."""
    case, pins = case_of("llama3-8b", 24, 96, 4096), {"pp": 3, "vpp": 2, "zero_stage": 0}
    best, overrides = emitted(case, pins, tmp_path / "run")
    read = diagnose({**case, "search": pins}, torchtitan=overrides)
    assert read.estimate.job.layout == best.job.layout
    assert read.to_dict()["differs_from_best"] == {}


def test_the_options_read_are_torchtitans():
    """The fields tyro takes in each section, and Trainer.Config's sections, as the installed torchtitan
    (0.3.0) declares them: an option the reader refuses is one tyro refuses."""
    import dataclasses

    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig

    from planner.engines.torchtitan.read import KNOWN_KEYS, SECTIONS

    for section, config in (("parallelism", ParallelismConfig), ("training", TrainingConfig),
                            ("compile", CompileConfig)):
        assert set(KNOWN_KEYS[section]) == {f.name for f in dataclasses.fields(config)}, section
        assert section in SECTIONS


def test_a_case_with_mtp_layers_against_a_0_2_toml_is_refused_and_a_compiled_loss_alone_says_its_key(tmp_path):
    """DeepSeek-V3's case (one MTP layer) against torchtitan 0.2's deepseek_v3_671b.toml was priced with
    the MTP layer torchtitan 0.2 never builds, which also kept pipelining out of the planner's best
    (torchtitan runs MTP only without pp); Megatron-LM's reader refuses the same mismatch. And a job
    compiling the loss alone was said not to compile the model for "compile.enable"."""
    path = tmp_path / "job.toml"
    path.write_text(LLAMA3_8B_TOML.replace("enable=false\ncomponents = [\"model\", \"loss\"]",
                                           "enable=true\ncomponents = [\"loss\"]"))
    case = case_of("deepseek-v3", 64, 64, 8192)
    with pytest.raises(CaseError, match=r"model.mtp_layers: 1, but job.toml is a torchtitan 0.2 job file"):
        diagnose(case, torchtitan=path)
    result = diagnose(case_of("llama3-8b", 64, 64, 8192), torchtitan=path)
    assert any("does not compile the model (compile.components leaves out \"model\")" in n for n in result.notes)


@pytest.mark.parametrize("parallel", ["", "--parallelism.pipeline_parallel_degree 8 "
                                          "--parallelism.pipeline_parallel_schedule Interleaved1F1B",
                                      "--parallelism.context_parallel_degree 2"])
def test_overrides_on_torchtitans_own_base_config_refuse_the_mtp_layers_it_does_not_build(tmp_path, parallel):
    """torchtitan 0.3.0's DeepSeek-V3 flavors build no MTP layer (model_registry's num_mtp_layers 0; only
    deepseek_v3_debugmodel_mtp does), so MTPDecoder.Config's refusal of pp and cp never fires: overrides on
    deepseek_v3_671b with pp 8 (its own schedule's) or cp 2 were refused as torchtitan refusing them, and
    without either priced the case's MTP layer the job never builds. Refused by the case's key, as a 0.2
    job file is; without the MTP layer the same job is read."""
    path = tmp_path / "overrides.txt"
    path.write_text("--module deepseek_v3 --config deepseek_v3_671b --parallelism.data_parallel_shard_degree -1 "
                    f"--parallelism.expert_parallel_degree 8 {parallel} --training.local_batch_size 8 "
                    "--training.seq_len 4096 --training.global_batch_size 2048 activation_checkpoint:full\n")
    case = case_of("deepseek-v3", 256, 2048, 4096)
    with pytest.raises(CaseError) as refused:
        diagnose(case, torchtitan=path)
    assert refused.value.key == "model.mtp_layers"
    assert "deepseek_v3_671b builds torchtitan's 671B model with no multi-token prediction layers" in str(refused.value)
    case["model"]["mtp_layers"] = 0
    lay = read_config(case, "torchtitan", path)
    assert (lay.pp, lay.cp) == ((8, 1) if "pipeline" in parallel else (1, 2) if "context" in parallel else (1, 1))


@pytest.mark.parametrize("preset, precision, words, said", [
    # qwen3_30b_a3b's model_registry("30B-A3B"): its 48 layers, whatever the case's model (the 235B's
    # stages named layers 48–93, which torchtitan's _split_module leaves empty).
    ("qwen3-235b-a22b", "bf16", "--module qwen3 --config qwen3_30b_a3b", "builds torchtitan's 30B-A3B model"),
    # llama3_405b's model spec converts every linear but lm_head to fp8 (Float8LinearConverter).
    ("llama3.1-405b", "bf16", "--module llama3 --config llama3_405b", "Float8LinearConverter"),
    # The stand-ins the planner's files name for models torchtitan ships no config for (emit.DEFAULT_MOE_BASE,
    # DEFAULT_BASE): their flavour was taken for the case's, so Mixtral's job (training Qwen3-30B-A3B) and
    # Mistral's (Llama 3 8B) were priced as the case's model.
    ("mixtral-8x7b", "bf16", "--module qwen3 --config qwen3_30b_a3b",
     "builds torchtitan's 30B-A3B model (its model spec, which no override changes), not the case's Mixtral 8x7B"),
    ("mistral-7b", "bf16", "--module llama3 --config llama3_8b", "which no torchtitan config builds"),
])
def test_a_base_config_that_builds_another_model_or_precision_is_refused(tmp_path, preset, precision, words, said):
    """The overrides' base config builds its own model spec, which no override changes: diagnose
    priced the case's 235B (or bf16) job, identical to the plan, while the launch trained torchtitan's
    30B-A3B (or fp8 linears)."""
    path = tmp_path / "overrides.txt"
    path.write_text(f"{words} --training.seq_len 4096 --training.global_batch_size 2048 "
                    "--training.local_batch_size 1 --parallelism.tensor_parallel_degree 8\n")
    case = case_of(preset, 2048, 2048, 4096)
    case["training"]["precision"] = precision
    with pytest.raises(CaseError) as refused:
        diagnose(case, torchtitan=path)
    assert refused.value.key == "--config" and said in str(refused.value)


def test_an_overrides_file_is_read_on_the_base_config_its_header_names(tmp_path):
    """The planner's overrides.txt names its base config only in its header's command (python -m
    torchtitan.train --module llama3 --config llama3_70b ...): with its last line (the checkpointing
    subcommand) taken out, what it left out was read as Trainer.Config's defaults (selective, and "does
    not fit"), where llama3_70b's FullAC.Config() runs (models/llama3/config_registry.py)."""
    case, _ = ROUND_TRIPS["70b_64"]
    pins = {"tp": 1, "pp": 1, "recompute": "full"}  # FSDP over all 64 GPUs, as llama3_70b's config runs it
    best, overrides = emitted(case, pins, tmp_path)
    assert best.job.layout.recompute == "full"
    lines = overrides.read_text().splitlines()
    assert lines[-1].startswith("activation_checkpoint:")
    edited = tmp_path / "edited.txt"
    edited.write_text("\n".join(lines[:-1]) + "\n")
    result = diagnose({**case, "search": pins}, torchtitan=edited)
    assert result.estimate.job.layout.recompute == "full"
    assert any("names no base config: read on the one its header's command names (--module llama3 --config "
               "llama3_70b)" in note for note in result.notes)


# --- the planner's own config module: the model spec it rebuilds --------------------------------

OWN_MODEL_CASES = {
    "deepseek_v3": case_of("deepseek-v3", 256, 512, 4096),
    "qwen3_moe_fp8": case_of("qwen3-30b-a3b", 16, 256, 4096, precision="fp8"),
    "llama3_8b_fp8": case_of("llama3-8b", 8, 64, 4096, precision="fp8"),
}
# An edit to the model names of the emitted torchtitan_config.py, the case it is read on, and the
# refusal's key and words.
OWN_MODEL_EDITS = {
    # The job trains DeepSeek-V3 without its MTP layer (apply_layout's num_mtp_layers 0): it was priced with it.
    "mtp_dropped": ("deepseek_v3", "MTP_LAYERS = 1", "MTP_LAYERS = 0", "MTP_LAYERS",
                    "0: apply_layout rebuilds the model with no multi-token prediction layers, but the case"),
    "mtp_not_literal": ("deepseek_v3", "MTP_LAYERS = 1", "MTP_LAYERS = int('1')", "MTP_LAYERS",
                        "expected an integer >= 0 and <= 9223372036854775807"),
    # The job trains in bf16 (no converter): it was priced in the case's fp8.
    "no_converters": ("qwen3_moe_fp8", None, "CONVERTERS = []", "CONVERTERS",
                      "[] (no converter: 16-bit GEMMs), but the case"),
    "experts_in_bf16": ("qwen3_moe_fp8", None, "CONVERTERS = [['Float8LinearConverter', {}]]", "CONVERTERS",
                        "expected a grouped-experts converter too (Float8GroupedExpertsConverter)"),
    "other_recipe": ("qwen3_moe_fp8", "'rowwise'", "'rowwise_with_gw_hp'", "CONVERTERS",
                     "scales fp8 'rowwise_with_gw_hp', but the case's recipe is rowwise"),
    "unknown_converter": ("qwen3_moe_fp8", None, "CONVERTERS = [['Float8Converter', {}]]", "CONVERTERS",
                          "'Float8Converter' is not read: expected one of Float8LinearConverter"),
    # The experts' converter alone leaves every linear in bf16; on a dense model it converts nothing: both
    # were priced in fp8.
    "experts_only": ("qwen3_moe_fp8", None, "CONVERTERS = [['Float8GroupedExpertsConverter', {}]]", "CONVERTERS",
                     "converts the experts only, but the case"),
    "experts_on_dense": ("llama3_8b_fp8", None, "CONVERTERS = [['Float8GroupedExpertsConverter', {}]]", "CONVERTERS",
                         "converts grouped experts only, but the case's model has none"),
    # 0.2's float8 options, which 0.3.0's Float8LinearConverter.Config (components/quantization/float8.py:
    # recipe_name, filter_fqns, emulate; a kw_only slots dataclass) does not take: converters() raises TypeError
    # at startup. Both were diagnosed as runnable, the FSDP fp8 all-gather priced as if it ran.
    "fp8_all_gather": ("llama3_8b_fp8", "'filter_fqns': ['lm_head']",
                       "'filter_fqns': ['lm_head'], 'enable_fsdp_float8_all_gather': True", "CONVERTERS",
                       "Float8LinearConverter has no field 'enable_fsdp_float8_all_gather' in torchtitan 0.3.0"),
    "fp8_precompute": ("llama3_8b_fp8", "'filter_fqns': ['lm_head']",
                       "'filter_fqns': ['lm_head'], 'precompute_float8_dynamic_scale_for_fsdp': True", "CONVERTERS",
                       "has no field 'precompute_float8_dynamic_scale_for_fsdp'"),
    # The job trains torchtitan's 235B-A22B (model_registry's flavour): it was priced as the case's 30B-A3B.
    "other_flavor": ("qwen3_moe_fp8", "MODEL_FLAVOR = '30B-A3B'", "MODEL_FLAVOR = '235B-A22B'", "MODEL_FLAVOR",
                     "apply_layout rebuilds torchtitan.models.qwen3's 235B-A22B model, not the case's Qwen3-30B-A3B"),
    # An annotated assignment binds the name as a plain one does: it was read as absent.
    "mtp_annotated": ("deepseek_v3", "MTP_LAYERS = 1", "MTP_LAYERS: int = 0", "MTP_LAYERS",
                      "0: apply_layout rebuilds the model with no multi-token prediction layers, but the case"),
}


@pytest.fixture(scope="module")
def own_files(tmp_path_factory):
    """The files `plan --emit torchtitan` writes for each case of OWN_MODEL_CASES, with the plan."""
    out = {}
    for label, case in OWN_MODEL_CASES.items():
        best = planner.plan({**case, "search": {"target": "torchtitan"}}, top_k=0).best
        assert best is not None
        written = planner.emit(best, "torchtitan", tmp_path_factory.mktemp(label) / "run")
        out[label] = (best, next(p for p in written.paths if p.name == "launch.sh"))
    return out


def test_the_plans_own_config_module_with_its_mtp_layers_and_converters_reads_as_planned(own_files):
    """The unedited files read to the plan, with no note that the converters are no command-line option
    (launch.sh's config module carries them: CONVERTERS)."""
    for label, (best, launch) in own_files.items():
        result = diagnose(OWN_MODEL_CASES[label], torchtitan=launch)
        assert result.estimate.step_time_s == best.step_time_s, label
        assert not any("converters are no command-line option" in note for note in result.notes), label


@pytest.mark.parametrize("label", OWN_MODEL_EDITS)
def test_an_edit_to_the_model_the_config_module_rebuilds_is_refused_naming_it(tmp_path, own_files, label):
    """diagnose read only the config module's PARALLELISM, TRAINING, COMPILE and checkpointing: MTP_LAYERS = 0
    on DeepSeek-V3 or CONVERTERS = [] on an fp8 case priced the case's MTP layer and fp8 at the unedited
    step time, where overrides on deepseek_v3_671b (no MTP layer) are refused."""
    case_label, old, new, key, needle = OWN_MODEL_EDITS[label]
    _, launch = own_files[case_label]
    copy = tmp_path / "run"
    copy.mkdir()
    for path in launch.parent.iterdir():
        text = path.read_text()
        if path.name == "torchtitan_config.py":
            if old is None:  # the whole CONVERTERS line
                old = next(line for line in text.splitlines() if line.startswith("CONVERTERS = "))
            assert old in text
            text = text.replace(old, new)
        (copy / path.name).write_text(text)
    with pytest.raises(CaseError) as refused:
        diagnose(OWN_MODEL_CASES[case_label], torchtitan=copy / "launch.sh")
    assert (refused.value.source, refused.value.key) == (str(copy / "torchtitan_config.py"), key)
    assert needle in refused.value.expected


def test_the_stand_in_model_of_a_model_torchtitan_lacks_is_refused_until_pointed_at_it(tmp_path):
    """Mixtral's files rebuild Qwen3-30B-A3B as a stand-in (emit.DEFAULT_MOE_BASE; plan says so), so the
    unedited job trains Qwen3-30B-A3B: diagnose priced it as Mixtral, identical to the plan. Pointed at
    a registry of the user's own, it reads as planned."""
    case = case_of("mixtral-8x7b", 16, 64, 4096)
    best = planner.plan({**case, "search": {"target": "torchtitan"}}, top_k=0).best
    written = planner.emit(best, "torchtitan", tmp_path / "run")
    launch = next(p for p in written.paths if p.name == "launch.sh")
    with pytest.raises(CaseError) as refused:
        diagnose(case, torchtitan=launch)
    assert refused.value.key == "MODEL_FLAVOR"
    assert ("rebuilds torchtitan.models.qwen3's 30B-A3B model, not the case's Mixtral 8x7B (32 layers, hidden 4096, "
            "8 experts, top-2, 14336 wide), which no torchtitan flavour builds") in refused.value.expected
    config = launch.parent / "torchtitan_config.py"
    config.write_text(config.read_text().replace("MODEL_REGISTRY = 'torchtitan.models.qwen3'",
                                                 "MODEL_REGISTRY = 'my_models.mixtral'")
                      .replace("MODEL_FLAVOR = '30B-A3B'", "MODEL_FLAVOR = '8x7B'"))
    assert diagnose(case, torchtitan=launch).estimate.step_time_s == best.step_time_s


def test_an_edit_to_the_config_module_between_two_diagnoses_is_read(tmp_path, own_files):
    """The reader kept one launch script's settings by the script's text alone: MTP_LAYERS = 0 written
    into torchtitan_config.py after a first diagnose of its launch.sh was not read, and the second
    diagnose (the Python API's, in one process) priced the unedited job again instead of refusing it."""
    _, launch = own_files["deepseek_v3"]
    copy = tmp_path / "run"
    copy.mkdir()
    for path in launch.parent.iterdir():
        (copy / path.name).write_text(path.read_text())
    diagnose(OWN_MODEL_CASES["deepseek_v3"], torchtitan=copy / "launch.sh")
    config = copy / "torchtitan_config.py"
    config.write_text(config.read_text().replace("MTP_LAYERS = 1", "MTP_LAYERS = 0"))
    with pytest.raises(CaseError) as refused:
        diagnose(OWN_MODEL_CASES["deepseek_v3"], torchtitan=copy / "launch.sh")
    assert refused.value.key == "MTP_LAYERS"


def test_the_cli_refuses_a_config_module_that_drops_the_mtp_layer_in_one_line(tmp_path, own_files):
    _, launch = own_files["deepseek_v3"]
    copy = tmp_path / "run"
    copy.mkdir()
    for path in launch.parent.iterdir():
        (copy / path.name).write_text(path.read_text().replace("MTP_LAYERS = 1", "MTP_LAYERS = 0"))
    case_file = tmp_path / "case.yaml"
    case_file.write_text(json.dumps(OWN_MODEL_CASES["deepseek_v3"]))
    done = run_cli("diagnose", str(case_file), "--torchtitan", str(copy / "launch.sh"))
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(copy / "torchtitan_config.py") in lines[0] and "MTP_LAYERS" in lines[0]


def test_a_toml_integer_past_int64_is_refused_with_both_bounds(tmp_path):
    """A job file's seq_len past int64 was refused as "expected an integer >= 1", which it is."""
    path = tmp_path / "job.toml"
    path.write_text(LLAMA3_8B_TOML.replace("seq_len = 8192", "seq_len = 81920000000000000000000"))
    with pytest.raises(CaseError) as refused:
        read_config(case_of("llama3-8b", 64, 64, 8192), "torchtitan", path)
    assert (refused.value.source, refused.value.key) == (str(path), "training.seq_len")
    assert refused.value.expected == "expected an integer >= 1 and <= 9223372036854775807, got 81920000000000000000000"


@pytest.mark.parametrize("option, said", [
    # torchtitan 0.2 raises "Invalid selective AC option" for these at startup: not a layer frequency.
    ("-1", "'-1': torchtitan 0.2 refuses it at startup"),
    ("every", "'every': torchtitan 0.2 refuses it at startup"),
    (" 2", "' 2': torchtitan 0.2 refuses it at startup"),
    # A layer frequency torchtitan runs and the cost model does not price.
    ("3", "'3': selective checkpointing of every N-th layer (N > 1) is not priced"),
])
def test_a_toml_selective_ac_option_torchtitan_refuses_is_said_so(tmp_path, option, said):
    """selective_ac_option "-1" was refused as "every N-th layer (N > 1) is not priced", which -1 is not:
    torchtitan 0.2 takes "op" or digits (str.isdigit) and stops at startup on anything else."""
    path = tmp_path / "job.toml"
    path.write_text(LLAMA3_8B_TOML.replace('selective_ac_option = "op"', f'selective_ac_option = "{option}"'))
    with pytest.raises(CaseError) as refused:
        read_config(case_of("llama3-8b", 64, 64, 8192), "torchtitan", path)
    assert (refused.value.source, refused.value.key) == (str(path), "activation_checkpoint.selective_ac_option")
    assert refused.value.expected.startswith(said)
    if "refuses it" in said:
        assert "expected 'op' (op-level selective) or a positive integer N" in refused.value.expected


def test_a_toml_selective_ac_option_0_checkpoints_every_layer_as_torchtitan_runs_it(tmp_path):
    """torchtitan 0.2 takes "0" (it is digits) and wraps a layer where "not ac_freq or i % ac_freq == 0"
    (distributed/activation_checkpoint.py _apply_layer_sac): every layer, as "1" does; it was refused as
    every N-th layer with N > 1."""
    path = tmp_path / "job.toml"
    path.write_text(LLAMA3_8B_TOML.replace('selective_ac_option = "op"', 'selective_ac_option = "0"'))
    assert read_config(case_of("llama3-8b", 64, 64, 8192), "torchtitan", path).recompute == "full"


# torchtitan 0.2's run_train.sh (v0.2.2), its normal branch: the job file from --job.config_file, the
# script's own arguments ("$@") and the overrides given here on top.
RUN_TRAIN_SH = """\
#!/usr/bin/bash
set -ex
NGPU=${NGPU:-"8"}
export LOG_RANK=${LOG_RANK:-0}
CONFIG_FILE=${CONFIG_FILE:-"./train_configs/llama3_8b.toml"}
TRAIN_FILE=${TRAIN_FILE:-"torchtitan.train"}
COMM_MODE=${COMM_MODE:-""}
TORCHFT_LIGHTHOUSE=${TORCHFT_LIGHTHOUSE:-"http://localhost:29510"}
if [ -n "$COMM_MODE" ]; then
    NGPU="${NGPU}" LOCAL_RANK=0 python3 -m "${TRAIN_FILE}" --job.config_file "${CONFIG_FILE}" "$@" --comm.mode=${COMM_MODE} --training.steps=1
else
    PYTORCH_ALLOC_CONF="expandable_segments:True" \\
    TORCHFT_LIGHTHOUSE=${TORCHFT_LIGHTHOUSE} \\
    torchrun --nproc_per_node=${NGPU} --rdzv_backend c10d --rdzv_endpoint="localhost:0" \\
    --local-ranks-filter ${LOG_RANK} --role rank --tee 3 \\
    -m ${TRAIN_FILE} --job.config_file ${CONFIG_FILE} "$@" --training.global_batch_size 64 OVERRIDES
fi
"""


@pytest.mark.parametrize("overrides, tp, recompute", [
    ("", 1, "selective"),
    ("--parallelism.tensor_parallel_degree 2 --activation_checkpoint.mode full", 2, "full"),
    ("--parallelism.tensor_parallel_degree=2", 2, "selective"),
])
def test_a_0_2_launch_script_reads_its_job_file_with_the_overrides_over_it(tmp_path, overrides, tp, recompute):
    """torchtitan 0.2's run_train.sh (-m torchtitan.train --job.config_file ${CONFIG_FILE} "$@") was refused:
    "--job.config_file: unknown section 'job': torchtitan 0.3.0's Trainer.Config has no such section", where the
    same TOML given alone is read. The job file is followed (relative to the script's directory), the command
    line's overrides over it, as 0.2's ConfigManager merges them ("CLI args > TOML file", config/manager.py)."""
    (tmp_path / "train_configs").mkdir()
    (tmp_path / "train_configs" / "llama3_8b.toml").write_text(LLAMA3_8B_TOML)
    script = tmp_path / "run_train.sh"
    script.write_text(RUN_TRAIN_SH.replace("OVERRIDES", overrides))
    case = case_of("llama3-8b", 8, 64, 8192)
    result = diagnose(case, torchtitan=script)
    lay = result.estimate.job.layout
    assert (lay.tp, lay.dp, lay.zero_stage, lay.recompute) == (tp, 8 // tp, 3, recompute)
    assert result.estimate.job.training.loss_chunk_count == 1  # a 0.2 job: whole logits
    assert any("reads the job file ./train_configs/llama3_8b.toml" in note for note in result.notes), result.notes
    assert any("the job file's path is CONFIG_FILE's default" in note for note in result.notes), result.notes


def test_a_0_2_launch_scripts_job_file_refusals_name_what_is_wrong(tmp_path):
    """A job file that is not there (the script's default path, which the caller's CONFIG_FILE may change),
    and an override 0.2's JobConfig does not define, are refused naming them."""
    script = tmp_path / "run_train.sh"
    script.write_text(RUN_TRAIN_SH.replace("OVERRIDES", ""))
    case = case_of("llama3-8b", 8, 64, 8192)
    with pytest.raises(CaseError) as error:
        diagnose(case, torchtitan=script)
    assert error.value.key == "--job.config_file" and "no such file" in error.value.expected
    assert "CONFIG_FILE is not set by the script" in error.value.expected, str(error.value)
    (tmp_path / "train_configs").mkdir()
    (tmp_path / "train_configs" / "llama3_8b.toml").write_text(LLAMA3_8B_TOML)
    script.write_text(RUN_TRAIN_SH.replace("OVERRIDES", "--parallelism.tensor_paralel_degree 2"))
    with pytest.raises(CaseError) as error:
        diagnose(case, torchtitan=script)
    assert error.value.key == "parallelism.tensor_paralel_degree" and "tensor_parallel_degree" in error.value.expected


@pytest.mark.parametrize("edit, key, second", [
    # a key given twice in its table: tomllib says "Cannot overwrite a value" with no key
    (("tensor_parallel_degree = 1", "tensor_parallel_degree = 1\ntensor_parallel_degree = 2"),
     "parallelism.tensor_parallel_degree", "tensor_parallel_degree = 2"),
    # a table declared twice
    (("[training]", "[training]\nseq_len = 8192\n[training]"), "training", "[training]"),
])
def test_a_key_a_toml_gives_twice_is_named(tmp_path, edit, key, second):
    """A TOML job file with a key given twice was refused as "is not TOML: Cannot overwrite a value
    (at line 49, column 27)", naming no key, where a case, a ds_config or a HF config given a key twice
    names it. It names the key (with its table) and the line of the second, as the YAML reader does."""
    text = LLAMA3_8B_TOML.replace(*edit)
    path = tmp_path / "job.toml"
    path.write_text(text)
    with pytest.raises(CaseError) as error:
        read_config(case_of("llama3-8b", 64, 64, 8192), "torchtitan", path)
    line = max(i for i, t in enumerate(text.splitlines(), 1) if t.strip() == second)
    assert error.value.key == key and f"given twice (line {line})" in error.value.expected


def _unbalanced_ring_ratio(cp: int) -> float:
    """The busiest CP rank's attention blocks over the mean's, counted by torch's own ring attention without a
    load balancer (``_context_parallel_shard`` sets ``enable_load_balance`` False when none is given): each
    ring step's block is run whole, causally (half of it) or skipped, per ``_is_causal_behavior``."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as ring

    saved = ring._cp_options.enable_load_balance
    ring._cp_options.enable_load_balance = False
    try:
        share = {ring._CausalBehavior.NOT_IS_CAUSAL: 1.0, ring._CausalBehavior.IS_CAUSAL: 0.5,
                 ring._CausalBehavior.SKIP: 0.0}
        work = [sum(share[ring._is_causal_behavior(rank, cp, step, True)] for step in range(cp)) for rank in range(cp)]
    finally:
        ring._cp_options.enable_load_balance = saved
    return max(work) / (sum(work) / cp)


def test_the_context_parallel_load_balancer_is_read_as_torchtitan_shards_with_it(tmp_path):
    """--parallelism.context_parallel_load_balancer was not read: None (the sequence sharded in order, the last
    CP rank attending most under the causal mask) was priced as headtail without a word, and a value torchtitan's
    cp_shard raises on ('none', 'zigzag') was diagnosed."""
    case, pins = ROUND_TRIPS["8b_16_cp"]
    _, overrides = emitted(case, pins, tmp_path)
    lines = overrides.read_text().splitlines()

    def with_balancer(word: str) -> Path:
        path = tmp_path / f"balancer_{len(word)}_{word.strip(chr(39))}.txt"
        path.write_text("\n".join(lines[:-1] + [f"--parallelism.context-parallel-load-balancer {word}", lines[-1]])
                        + "\n")
        return path

    balanced = diagnose({**case, "search": pins}, torchtitan=with_balancer("headtail"))
    unbalanced = diagnose({**case, "search": pins}, torchtitan=with_balancer("None"))
    assert not any("load_balancer" in note for note in balanced.notes)
    said = [note for note in unbalanced.notes if note.startswith("parallelism.context_parallel_load_balancer None")]
    assert len(said) == 1 and f"{_unbalanced_ring_ratio(2):.2f}× the mean rank's" in said[0], unbalanced.notes
    assert _unbalanced_ring_ratio(2) == 1.5  # rank 1: its causal half block and rank 0's whole one; rank 0: its half
    # cp_shard (distributed/context_parallel/api.py, which imports triton here) raises "Invalid
    # load_balancer_type" on any word but headtail, ptrr and None; ParallelismConfig refuses "".
    for word in ("none", "zigzag"):
        with pytest.raises(CaseError, match="expected headtail, ptrr or None") as error:
            diagnose({**case, "search": pins}, torchtitan=with_balancer(word))
        assert error.value.key == "parallelism.context_parallel_load_balancer"
    with pytest.raises(CaseError, match="empty string") as error:
        diagnose({**case, "search": pins}, torchtitan=with_balancer("''"))


def test_debug_fields_set_in_a_base_config_are_read_as_torchtitan_runs_them(tmp_path):
    """The base config's debug section was skipped (base_config.UNREAD): a registry function's
    ``debug=DebugConfig(moe_force_load_balance=True)``, or the line a user adds to the emitted apply_layout,
    was priced with the case's imbalance and no word, though torchtitan runs the base config's DebugConfig
    unless an override changes it (ConfigManager: F() first, then tyro). Read as --debug.<field> is:
    forced routing priced balanced with its note, deterministic and anomaly detection noted, batch_invariant
    refused as Trainer.Config.__post_init__ refuses it."""
    import ast as python_ast

    from planner.engines.torchtitan.base_config import _read_function

    source = textwrap.dedent("""
        def forced():
            return Trainer.Config(training=TrainingConfig(seq_len=4096), debug=DebugConfig(moe_force_load_balance=True))
        def replaced():
            config = forced()
            config.debug = DebugConfig(seed=3)
            return config
        def edited():
            config = replaced()
            config.debug.deterministic = True
            return config
    """)
    functions = {node.name: node for node in python_ast.parse(source).body}
    assert _read_function(functions, "forced", "f.py", 0).values["debug.moe_force_load_balance"] is True
    # replaced whole: DebugConfig's default (off) again, as Python builds it
    assert "debug.moe_force_load_balance" not in _read_function(functions, "replaced", "f.py", 0).values
    assert _read_function(functions, "edited", "f.py", 0).values["debug.deterministic"] is True

    case, pins = ROUND_TRIPS["qwen3_moe"]
    skewed = {**case, "model": {**case["model"], "moe_load_imbalance": 1.3}, "search": pins}
    balanced = {**case, "model": {**case["model"], "moe_load_imbalance": 1.0}, "search": pins}
    emitted(case, pins, tmp_path)
    module = tmp_path / "torchtitan_config.py"
    text = module.read_text()
    assert "debug" not in text.partition("def apply_layout")[2]  # the planner's files leave DebugConfig be

    def with_debug(line: str) -> Path:
        module.write_text(text.replace("    return config\n", f"    {line}\n    return config\n"))
        return module

    unforced = diagnose(balanced, torchtitan=module).estimate.step_time_s
    assert diagnose(skewed, torchtitan=module).estimate.step_time_s > unforced
    run = diagnose(skewed, torchtitan=with_debug("config.debug.moe_force_load_balance = True"))
    said = [note for note in run.notes if "forces balanced routing" in note]
    assert run.estimate.step_time_s == unforced and len(said) == 1 and "debug.moe_force_load_balance" in said[0]
    run = diagnose(balanced, torchtitan=with_debug("config.debug.deterministic = True"))
    assert run.estimate.step_time_s == unforced
    assert any(note.startswith("debug.deterministic on") for note in run.notes), run.notes
    with pytest.raises(CaseError, match="Trainer.Config.__post_init__") as error:
        diagnose(balanced, torchtitan=with_debug("config.debug.batch_invariant = True"))
    assert error.value.key == "debug.batch_invariant"


def test_an_emulated_float8_converter_is_said_not_priced_as_fp8_tensor_cores(tmp_path, own_files):
    """Float8LinearConverter.Config.emulate (components/quantization/float8.py: "for test purpose only";
    torchao's Float8LinearConfig(emulate=True)) runs no fp8 GEMM: it was read as the case's fp8 without a word."""
    best, launch = own_files["llama3_8b_fp8"]
    copy = tmp_path / "run"
    copy.mkdir()
    for path in launch.parent.iterdir():
        text = path.read_text()
        if path.name == "torchtitan_config.py":
            assert "'filter_fqns': ['lm_head']" in text
            text = text.replace("'filter_fqns': ['lm_head']", "'filter_fqns': ['lm_head'], 'emulate': True")
        (copy / path.name).write_text(text)
    result = diagnose(OWN_MODEL_CASES["llama3_8b_fp8"], torchtitan=copy / "launch.sh")
    said = [note for note in result.notes if "emulate True" in note]
    assert len(said) == 1 and "not on fp8 tensor cores" in said[0], result.notes
    assert not any("emulate" in note for note in diagnose(OWN_MODEL_CASES["llama3_8b_fp8"], torchtitan=launch).notes)


def test_the_optimizer_implementation_is_read_refused_outside_torchtitans_choices_and_its_bf16_moments_priced(tmp_path):
    """``optimizer.implementation`` was not read, from the overrides or a base config: a word torchtitan
    refuses was diagnosed as runnable, and fused_opt_states_bf16, whose Adam moments torchtitan creates in
    bfloat16 (OptimizersContainer._register_bf16_optimizer_state_hook, measured here on CPU torch), was priced
    with fp32 moments, then only noted: it is read as training.optimizer_moments bf16 and priced so. The
    choices are torchtitan's own Literal."""
    import ast as python_ast
    import typing

    import torch
    from torchtitan.components.optimizer import OptimizersContainer, default_adamw

    from cost_models.model_states import state_bytes
    from planner.engines.torchtitan.base_config import _read_function
    from planner.engines.torchtitan.read import OPTIMIZER_IMPLEMENTATIONS

    hint = typing.get_type_hints(OptimizersContainer.Config)["implementation"]
    assert typing.get_args(hint) == OPTIMIZER_IMPLEMENTATIONS

    # What fused_opt_states_bf16 holds a parameter: its step pre-hook run as the first step runs it.
    linear = torch.nn.Linear(16, 16)
    config = default_adamw()
    config.implementation = "fused_opt_states_bf16"
    optimizers = OptimizersContainer(config, model_parts=[linear])
    linear(torch.randn(2, 16)).sum().backward()
    adamw = optimizers.optimizers[0]
    for hook in adamw._optimizer_step_pre_hooks.values():
        hook(adamw, (), {})
    held = sum(t.element_size() for k, t in adamw.state[linear.weight].items() if k != "step")
    assert held == 4

    case, pins = ROUND_TRIPS["8b_4_tp"]
    _, overrides = emitted(case, pins, tmp_path)
    plain = diagnose({**case, "search": pins}, torchtitan=overrides)
    # The implementation the plan priced (fused) is pinned; the words below stand in for it.
    words = overrides.read_text()
    assert "--optimizer.implementation fused\n" in words
    words = words.replace("--optimizer.implementation fused\n", "")
    assert not any("optimizer.implementation" in note for note in plain.notes)
    job = plain.estimate.job
    assert state_bytes(job.training, job.layout.zero_stage, job.layout.dp).optimizer == 8  # fp32 moments priced

    def with_words(extra: str) -> Path:
        overrides.write_text(f"{extra}\n{words}")  # before the activation_checkpoint subcommand, which goes last
        return overrides

    run = diagnose({**case, "search": pins}, torchtitan=with_words("--optimizer.implementation fused_opt_states_bf16"))
    job = run.estimate.job
    assert job.training.optimizer_moments == "bf16" and job.layout == plain.estimate.job.layout
    assert state_bytes(job.training, job.layout.zero_stage, job.layout.dp).optimizer == held  # the moments measured
    assert run.estimate.peak.optimizer_states == pytest.approx(plain.estimate.peak.optimizer_states / 2)
    assert not any("optimizer.implementation" in note for note in run.notes), run.notes
    assert "training.optimizer_moments bf16 (optimizer.implementation)" in run.planned_with
    # fp32, the case's default, leaves the job's bf16 standing; a case that states bf16 against a job that
    # keeps fp32 moments is refused, naming the key.
    with pytest.raises(CaseError, match="keeps Adam's moments in fp32") as error:
        diagnose({**case, "training": {**case["training"], "optimizer_moments": "bf16"}, "search": pins},
                 torchtitan=with_words(""))
    assert error.value.key == "optimizer.implementation"
    run = diagnose({**case, "search": pins}, torchtitan=with_words("--optimizer.implementation for-loop"))
    assert any(note.startswith("optimizer.implementation for-loop") for note in run.notes), run.notes
    with pytest.raises(CaseError, match="OptimizersContainer.Config") as error:
        diagnose({**case, "search": pins}, torchtitan=with_words("--optimizer.implementation adam8bit"))
    assert error.value.key == "optimizer.implementation"

    # A registry function's optimizer, replaced whole or edited.
    source = textwrap.dedent("""
        def foreach():
            return Trainer.Config(optimizer=OptimizersContainer.Config(implementation="foreach"))
        def adamw():
            config = foreach()
            config.optimizer = default_adamw(lr=3e-4)
            return config
        def bf16():
            config = adamw()
            config.optimizer.implementation = "fused_opt_states_bf16"
            return config
    """)
    functions = {node.name: node for node in python_ast.parse(source).body}
    assert _read_function(functions, "foreach", "f.py", 0).values["optimizer.implementation"] == "foreach"
    assert "optimizer.implementation" not in _read_function(functions, "adamw", "f.py", 0).values
    assert _read_function(functions, "bf16", "f.py", 0).values["optimizer.implementation"] == "fused_opt_states_bf16"

    # The line a user adds to the emitted apply_layout.
    module = tmp_path / "torchtitan_config.py"
    text = module.read_text()
    assert "config.optimizer.implementation" not in text.partition("def apply_layout")[2]
    module.write_text(text.replace("    return config\n", "    config.optimizer.implementation = 'foreach'\n"
                                                          "    return config\n"))
    run = diagnose({**case, "search": pins}, torchtitan=module)
    assert any(note.startswith("optimizer.implementation foreach") for note in run.notes), run.notes


def test_a_0_2_job_files_optimizer_implementation_is_read_by_the_same_rule(tmp_path):
    """A torchtitan 0.2 job file's [optimizer] implementation was not read (only 0.3's
    optimizer.implementation was): its "foreach" and "for-loop", which build_optimizers hands torch.optim.AdamW
    as foreach= / fused=False (components/optimizer.py at v0.2.2), were priced as the fused step without a word,
    and "fused_opt_states_bf16", which 0.2's Optimizer.implementation Literal does not have and build_optimizers
    asserts against (assert implementation in ["fused", "foreach", "for-loop"]), was diagnosed as runnable.
    Read now as the command line's is, with 0.2's choices; a launch's --optimizer.implementation over the file
    likewise."""
    case = case_of("llama3-8b", 8, 64, 4096)
    body = ("[training]\nlocal_batch_size = 8\nglobal_batch_size = 64\nseq_len = 4096\n[parallelism]\n"
            "data_parallel_shard_degree = -1\n[activation_checkpoint]\nmode = \"full\"\n")
    path = tmp_path / "job.toml"
    path.write_text(body)
    plain = diagnose(case, torchtitan=path)
    assert not any("optimizer.implementation" in note for note in plain.notes), plain.notes
    for implementation, priced in (("fused", False), ("foreach", True), ("for-loop", True)):
        path.write_text(body + f"[optimizer]\nname = \"AdamW\"\nlr = 3e-4\nimplementation = \"{implementation}\"\n")
        run = diagnose(case, torchtitan=path)
        said = [note for note in run.notes if note.startswith(f"optimizer.implementation {implementation}")]
        assert len(said) == int(priced), run.notes
        assert run.estimate.job.training.optimizer_moments == "fp32"
        assert run.estimate.step_time_s == plain.estimate.step_time_s
    for value, said in (("fused_opt_states_bf16", "expected one of for-loop, foreach, fused"), (3, "a string")):
        path.write_text(body + f"[optimizer]\nimplementation = {json.dumps(value)}\n")
        with pytest.raises(CaseError, match=said) as refused:
            diagnose(case, torchtitan=path)
        assert refused.value.key == "optimizer.implementation", refused.value
    # A 0.2 launch's override over its job file, as ConfigManager merges them.
    path.write_text(body)
    launch = tmp_path / "run_train.sh"
    launch.write_text(f"torchrun --nproc-per-node 8 -m torchtitan.train --job.config_file {path} "
                      "--optimizer.implementation foreach\n")
    run = diagnose(case, torchtitan=launch)
    assert any(note.startswith("optimizer.implementation foreach") for note in run.notes), run.notes


def test_a_plan_with_bf16_moments_is_emitted_as_fused_opt_states_bf16_and_reads_back_priced_so(tmp_path):
    """training.optimizer_moments bf16 was priced (model_states.state_bytes) but the files ran torchtitan's
    default fused Adam, with fp32 moments. The overrides and the config module set
    optimizer.implementation "fused_opt_states_bf16", which torchtitan's OptimizersContainer.Config takes and
    builds fused (its _build_impl_kwargs), and both read back to the plan's estimate."""
    from torchtitan.components.optimizer import OptimizersContainer

    case, pins = ROUND_TRIPS["8b_4_tp"]
    case = {**case, "training": {**case["training"], "optimizer_moments": "bf16"}}
    best = best_for(case, pins)
    assert best.job.training.optimizer_moments == "bf16"
    written = planner.emit(best, "torchtitan", tmp_path / "run")
    by_name = {p.name: p for p in written.paths}
    words = override_words(by_name["overrides.txt"])
    value = words[words.index("--optimizer.implementation") + 1]
    config = OptimizersContainer.Config(implementation=value)
    assert OptimizersContainer._build_impl_kwargs(config) == {"fused": True, "foreach": False}
    for path in (by_name["overrides.txt"], by_name["torchtitan_config.py"]):
        result = diagnose({**case, "search": pins}, torchtitan=path)
        assert result.estimate.job.training.optimizer_moments == "bf16", path.name
        assert result.estimate.step_time_s == best.step_time_s and result.estimate.peak.total == best.peak.total
        assert result.planned_with is None, path.name


BF16_MOMENTS_BASE = "tt_bf16_moments_base"
# The module's stub base with Trainer.Config's optimizer section, its optimizer keeping bf16 moments.
_AC_FIELD = "    activation_checkpoint: ActivationCheckpointingConfig = field(default_factory=SelectiveAC.Config)\n"
assert _AC_FIELD in STUB_SOURCE
BF16_MOMENTS_SOURCE = "from torchtitan.components.optimizer import OptimizersContainer\n" + STUB_SOURCE.replace(
    _AC_FIELD, _AC_FIELD + "    optimizer: OptimizersContainer.Config = field(\n"
    "        default_factory=lambda: OptimizersContainer.Config(implementation=\"fused_opt_states_bf16\"))\n")


def test_the_emitted_files_pin_the_optimizer_implementation_the_plan_priced_over_any_base(tmp_path):
    """The files wrote optimizer.implementation only for bf16 moments, so a launch on a base config that sets
    fused_opt_states_bf16 itself ran bf16 moments (OptimizersContainer._register_bf16_optimizer_state_hook,
    components/optimizer/optimizer.py) where the plan priced fp32, and one that sets foreach ran the slower
    step. The overrides and the config module now pin "fused" (fp32 moments, the fused kernel:
    OptimizersContainer._build_impl_kwargs) or "fused_opt_states_bf16": checked by torchtitan's own
    ConfigManager over such a base, and read back by diagnose as the plan priced it."""
    from torchtitan.components.optimizer import OptimizersContainer

    case, pins = ROUND_TRIPS["8b_4_tp"]
    best = best_for(case, pins)
    assert best.job.training.optimizer_moments == "fp32"
    written = planner.emit(best, "torchtitan", tmp_path / "run")
    by_name = {p.name: p for p in written.paths}
    words = override_words(by_name["overrides.txt"])
    assert "--optimizer.implementation" in words
    (tmp_path / f"{BF16_MOMENTS_BASE}.py").write_text(BF16_MOMENTS_SOURCE)
    sys.path.insert(0, str(tmp_path))
    try:
        at = words.index("--optimizer.implementation")
        config = ConfigManager().parse_args(["--module", BF16_MOMENTS_BASE, "--config", "base", *words[at:at + 2]])
    finally:
        sys.path.remove(str(tmp_path))
    assert config.optimizer.implementation == "fused"
    assert OptimizersContainer._build_impl_kwargs(config.optimizer) == {"fused": True, "foreach": False}
    assert "'implementation': 'fused'" in by_name["torchtitan_config.py"].read_text() \
        or '"implementation": "fused"' in by_name["torchtitan_config.py"].read_text()
    for path in (by_name["overrides.txt"], by_name["torchtitan_config.py"]):
        result = diagnose({**case, "search": pins}, torchtitan=path)
        assert result.estimate.job.training.optimizer_moments == "fp32", path.name
        assert result.estimate.peak.total == best.peak.total and result.planned_with is None, path.name


def test_a_converter_that_converts_the_lm_head_the_estimate_prices_in_bf16_is_said(tmp_path):
    """CONVERTERS' filter_fqns / fqns were not compared with what the estimate prices in bf16: filter_fqns []
    converts the LM head too (torchtitan's module_filter_fn), priced in bf16 without a word. The rule is
    torchtitan's own: both dimensions divisible by 16 and no filter a substring of the FQN."""
    import ast as python_ast
    import importlib.util
    from types import SimpleNamespace

    from planner.engines.torchtitan.read import _linear_converted

    # torchtitan's module_filter_fn itself, taken from its source: its module imports the MoE dispatchers,
    # which need triton (absent on CPU); Linear is only its annotation.
    origin = Path(importlib.util.find_spec("torchtitan").origin).parent / "components/quantization/utils.py"
    tree = python_ast.parse(origin.read_text())
    found = [node for node in tree.body if isinstance(node, python_ast.FunctionDef) and node.name == "module_filter_fn"]
    space = {"Linear": SimpleNamespace(Config=object)}
    exec(compile(python_ast.Module(body=found, type_ignores=[]), str(origin), "exec"), space)
    module_filter_fn = space["module_filter_fn"]

    for features, filters in (((4096, 128256), []), ((4096, 128256), ["lm_head"]), ((4096, 128250), []),
                              ((4100, 128256), ["output"])):
        config = SimpleNamespace(in_features=features[0], out_features=features[1])
        assert _linear_converted("Float8LinearConverter", {"filter_fqns": filters}, "lm_head", features) \
            == module_filter_fn(config, "lm_head", filters)

    case = case_of("llama3-8b", 4, 32, 8192, precision="fp8")
    emitted(case, {}, tmp_path)
    module = tmp_path / "torchtitan_config.py"
    text = module.read_text()
    assert "'filter_fqns': ['lm_head']" in text or '"filter_fqns": ["lm_head"]' in text
    plain = diagnose({**case, "search": {}}, torchtitan=module)
    assert not any("LM head" in note for note in plain.notes), plain.notes
    module.write_text(text.replace("['lm_head']", "[]").replace('["lm_head"]', "[]"))
    run = diagnose({**case, "search": {}}, torchtitan=module)
    said = [note for note in run.notes if "converts the LM head" in note]
    assert len(said) == 1 and "filter_fqns" in said[0], run.notes
    assert run.estimate.step_time_s == plain.estimate.step_time_s


def test_a_0_2_job_file_whose_converter_converts_the_lm_head_is_said_so(tmp_path):
    """A torchtitan 0.2 job file whose float8 converter's filter_fqns leave out "output" (0.2's LM head,
    Transformer.output) converts the LM head to fp8 (module_filter_fn: 4096 and 128256 divide by 16), which
    the estimate prices in bf16: the 0.3 config module was told so, the job file not. Its default is float8's
    [] (converts it) and mx's ["output"] (leaves it: config/job_config.py at v0.2.2). Read as diagnose reads
    it (read_job, without the plan beside it): the same job priced either way."""
    from planner.diagnose import read_job

    body = ("[training]\nlocal_batch_size = 8\nglobal_batch_size = 64\nseq_len = 4096\n[parallelism]\n"
            "data_parallel_shard_degree = -1\n[activation_checkpoint]\nmode = \"full\"\n[model]\nconverters = ")
    float8 = body + "[\"quantize.linear.float8\"]\n[quantize.linear.float8]\nrecipe_name = \"rowwise\"\n"
    path = tmp_path / "job.toml"

    def lm_head_notes(case, text):
        path.write_text(text)
        reading = read_job(case, "torchtitan", path)
        return [note for note in reading.notes if "LM head" in note], reading.job

    case = case_of("llama3-8b", 8, 64, 4096, precision="fp8", fp8_recipe="rowwise")
    kept, job = lm_head_notes(case, float8 + "filter_fqns = [\"output\"]\n")
    assert kept == []
    for filters in ("filter_fqns = []\n", ""):
        said, converted = lm_head_notes(case, float8 + filters)
        assert said == ["quantize.linear.float8.filter_fqns [] converts the LM head (output) to fp8 too (torchtitan's "
                        "module_filter_fn): priced in bf16, as the cost model keeps it, so the run's LM head GEMMs "
                        "step faster than estimated"], filters
        assert converted == job
    mx = case_of("llama3-8b", 8, 64, 4096, precision="mxfp8")
    mx["cluster"]["gpu"] = "b200"
    mx_file = body + "[\"quantize.linear.mx\"]\n"
    assert lm_head_notes(mx, mx_file)[0] == []  # mx leaves "output" out unless told
    said = lm_head_notes(mx, mx_file + "[quantize.linear.mx]\nfilter_fqns = []\n")[0]
    assert len(said) == 1 and said[0].startswith("quantize.linear.mx.filter_fqns [] converts the LM head (output) "
                                                 "to mxfp8 too"), said


def test_a_converter_filter_that_leaves_a_decoder_linear_in_bf16_is_refused(tmp_path, own_files):
    """Float8's filter_fqns were read for the LM head and the router alone: a filter that left an attention or
    MLP projection in bf16 was priced in fp8, and ``auto_filter_small_kn`` was not followed. The cost model
    prices a decoder layer's linears in one precision, so such a filter is refused naming the linear. In
    torchtitan 0.3.0 the auto filter converts nothing: Float8LinearConverter.convert hands torchao's
    _auto_filter_for_recipe each Linear.Config (checked below in its source), which torchao's
    ``isinstance(mod, nn.Linear)`` turns down. In 0.2 it runs on nn.Linear modules, and torchao's rowwise
    thresholds (torchao 0.18.0 _auto_filter_for_rowwise: out features N <= 2048 stays bf16) keep Llama 3 8B's
    wk and wv (4096 → 8 KV heads × 128 = 1024) in bf16."""
    import ast as python_ast
    import importlib.util

    origin = Path(importlib.util.find_spec("torchtitan").origin).parent / "components/quantization/float8.py"
    tree = python_ast.parse(origin.read_text())
    convert = next(node for cls in tree.body if isinstance(cls, python_ast.ClassDef)
                   and cls.name == "Float8LinearConverter" for node in cls.body
                   if isinstance(node, python_ast.FunctionDef) and node.name == "convert")
    source = python_ast.unparse(convert)
    assert "model_config.traverse(Linear.Config)" in source and "self.filter_fn(linear_config, fqn)" in source

    case = OWN_MODEL_CASES["llama3_8b_fp8"]
    best, launch = own_files["llama3_8b_fp8"]

    def with_filters(filters: str) -> Path:
        copy = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        copy.mkdir()
        for path in launch.parent.iterdir():
            text = path.read_text()
            if path.name == "torchtitan_config.py":
                assert "'filter_fqns': ['lm_head']" in text
                text = text.replace("'filter_fqns': ['lm_head']", f"'filter_fqns': {filters}")
            (copy / path.name).write_text(text)
        return copy / "launch.sh"

    # A filter that matches no linear, beside the head's: runs as planned.
    kept = diagnose(case, torchtitan=with_filters("['lm_head', 'tok_embeddings']"))
    assert kept.estimate.step_time_s == best.step_time_s
    for filters, needle in (("['lm_head', 'auto_filter_small_kn']", "no linear converts"),
                            ("['lm_head', 'attention.wo']", "layers.0.attention.wo (4096 → 4096) in bf16"),
                            ("['lm_head', 'layers.31.feed_forward']", "layers.31.feed_forward.w1 (4096 → 14336)")):
        with pytest.raises(CaseError) as refused:
            diagnose(case, torchtitan=with_filters(filters))
        assert refused.value.key == "CONVERTERS" and needle in refused.value.expected, refused.value

    # torchtitan 0.2's job file: [quantize.linear.float8] filter_fqns, module_filter_fn's substring rule.
    toml_case = case_of("llama3-8b", 8, 64, 4096, precision="fp8", fp8_recipe="rowwise")
    body = ("[training]\nlocal_batch_size = 8\nglobal_batch_size = 64\nseq_len = 4096\n[parallelism]\n"
            "data_parallel_shard_degree = -1\n[activation_checkpoint]\nmode = \"full\"\n"
            "[model]\nconverters = [\"quantize.linear.float8\"]\n[quantize.linear.float8]\nrecipe_name = \"rowwise\"\n")
    path = tmp_path / "job.toml"
    path.write_text(body + "filter_fqns = [\"output\"]\n")
    diagnose(toml_case, torchtitan=path)
    for filters, needle in (('["output", "auto_filter_small_kn"]', "layers.0.attention.wk (4096 → 1024)"),
                            ('["output", "w2"]', "layers.0.feed_forward.w2 (14336 → 4096)")):
        path.write_text(body + f"filter_fqns = {filters}\n")
        with pytest.raises(CaseError) as refused:
            diagnose(toml_case, torchtitan=path)
        assert refused.value.key == "quantize.linear.float8.filter_fqns" and needle in refused.value.expected, \
            refused.value


@pytest.mark.parametrize("method", ["allgather", "alltoall", "ring", "p2p"])
def test_a_toml_context_parallel_rotate_method_torch_has_not_is_refused(tmp_path, method):
    """torchtitan 0.2 hands [parallelism] context_parallel_rotate_method to torch's set_rotate_method,
    which takes "allgather" (the default) or "alltoall" and raises NotImplementedError on any other
    (torch/distributed/tensor/experimental/_attention.py): a job file saying "ring" was read and
    priced as if it ran."""
    path = tmp_path / "llama3_8b.toml"
    path.write_text(LLAMA3_8B_TOML.replace("context_parallel_degree = 1", "context_parallel_degree = 2\n"
                                           f'context_parallel_rotate_method = "{method}"'))
    case = case_of("llama3-8b", 64, 32, 8192)  # local batch 1 over dp 32 (64 GPUs over cp 2)
    if method in ("allgather", "alltoall"):
        assert diagnose(case, torchtitan=path).estimate.job.layout.cp == 2
        return
    with pytest.raises(CaseError) as error:
        diagnose(case, torchtitan=path)
    assert error.value.key == "parallelism.context_parallel_rotate_method"
    assert "expected allgather or alltoall" in error.value.expected
