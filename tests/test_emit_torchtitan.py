"""torchtitan emitter: torchtitan 0.3.0's own config manager loads what is emitted, its
ParallelDims accepts the degrees, and the batch, stages and checkpointing are the plan's.

torchtitan 0.3.0 loads configs through ``ConfigManager`` (``--module M --config F`` plus
tyro ``--section.key`` overrides). Its real ``Trainer.Config`` needs the whole training stack
(triton, datasets, ...), so the emitted module's base config is pointed at a stand-in holding
torchtitan's own ``TrainingConfig``, ``ParallelismConfig`` and activation-checkpoint union, with
``Trainer.Config.__post_init__``'s layout checks and ``Trainer.__init__``'s batch arithmetic
restated below (``torchtitan/trainer.py``).
"""

from __future__ import annotations

import importlib
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torchtitan")
pytest.importorskip("tyro")
pytest.importorskip("spmd_types")

from torch.distributed.pipelining.schedules import (
    PipelineScheduleSingle,
    get_schedule_class,
)
from torchtitan.config import ConfigManager
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed.pipeline_parallel import (
    _build_pipeline_schedule,
    _get_pp_rank_to_stage_indices_mapping,
)

import planner
from cost_models.activations import chunked_loss, loss_chunks
from planner.emit import provenance
from planner.engines.torchtitan import emit
from planner.errors import CaseError

STUB = "layout_planner_tt_stub"
STUB_SOURCE = textwrap.dedent('''
    from dataclasses import dataclass, field
    from typing import Annotated

    import tyro
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.optimizer import OptimizersContainer
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, SelectiveAC


    @dataclass(kw_only=True, slots=True)
    class Config:
        """The layout part of torchtitan's Trainer.Config, with its field types."""

        hf_assets_path: str = "."
        training: TrainingConfig = field(default_factory=TrainingConfig)
        parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
        compile: CompileConfig = field(default_factory=CompileConfig)
        activation_checkpoint: ActivationCheckpointingConfig = field(default_factory=SelectiveAC.Config)
        # As Trainer.Config (trainer.py): the files pin its implementation.
        optimizer: OptimizersContainer.Config = field(default_factory=OptimizersContainer.Config)
        # As Trainer.Config: not command-line options.
        model_spec: Annotated[object, tyro.conf.Suppress] = None
        # As every torchtitan model's config_registry sets it.
        loss: Annotated[object, tyro.conf.Suppress] = field(
            default_factory=lambda: ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config()))

        def __post_init__(self):  # Trainer.Config.__post_init__'s layout checks
            mbs = self.parallelism.pipeline_parallel_microbatch_size
            if mbs <= 0:
                raise ValueError("pipeline_parallel_microbatch_size must be > 0")
            if self.parallelism.pipeline_parallel_degree > 1:
                if self.training.local_batch_size % mbs:
                    raise ValueError("local_batch_size must divide by pipeline_parallel_microbatch_size")
                if not self.training.disable_cuda_graphs:
                    raise ValueError("CUDA graphs do not support pipeline parallelism")
            # Trainer.Config._validate_cuda_graphs: the all-to-all token dispatcher syncs with the host.
            if self.parallelism.expert_parallel_degree > 1 and not self.training.disable_cuda_graphs:
                raise ValueError("CUDA graphs support only expert parallel token dispatcher configurations "
                                 "without CPU synchronization")


    def base():
        return Config()


    def base_like_405b():
        """As torchtitan's llama3_405b: a Float8 model, async TP (models/llama3/config_registry.py);
        and as its DeepSeek-V3 configs, the loss compiled alone."""
        config = Config(model_spec="Float8 model")
        config.compile = CompileConfig(enable=True, enable_async_tensor_parallel=True)
        config.compile.components = ["loss"]  # DeepSeek-V3's (its configs run no async TP)
        return config


    def model_registry(flavor, converters=None, **extra):
        """Stands in for torchtitan.models.llama3.model_registry, whose converters probe the GPU
        (has_cuda_capability) and import torchao when built: what it was asked to build."""
        return {"flavor": flavor, "converters": converters, **extra}
''')

PRESETS = ("llama2-7b", "llama3-8b", "mistral-7b", "gpt-1.7b")
GPUS = ("a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb")
# Pins steer some searches to pipelines, interleaving, TP, CP, replication and checkpointing.
PINS = ({}, {}, {}, {"tp": 2}, {"tp": 4, "pp": 2}, {"pp": 2, "vpp": 1}, {"pp": 4, "vpp": 2}, {"pp": 2, "vpp": 2},
        {"cp": 2}, {"zero_stage": 0}, {"recompute": "full"}, {"recompute": "selective"}, {"tp": 2, "cp": 2})
N_CASES = 44


def generated_cases() -> list[dict]:
    rng = random.Random(1234)
    cases = []
    for _ in range(N_CASES):
        num_gpus = rng.choice((8, 16, 32, 64, 128, 256))
        preset = rng.choice(PRESETS)
        cases.append({
            # GPT-3's recipe drops out 0.1, which torchtitan's models do not: run without it.
            "model": {"preset": preset, **({"dropout": 0.0} if preset.startswith("gpt") else {})},
            "cluster": {"gpu": rng.choice(GPUS), "num_gpus": num_gpus},
            "training": {"global_batch_size": num_gpus * rng.choice((2, 4, 8)),
                         "seq_len": rng.choice((2048, 4096, 8192))},
            "search": {"target": "torchtitan", **rng.choice(PINS)},
        })
    return cases


CASES = generated_cases()
_plans: dict[int, object] = {}


def best_of(index: int):
    if index not in _plans:
        _plans[index] = planner.plan(CASES[index], top_k=0).best
    return _plans[index]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("torchtitan")
    (path / f"{STUB}.py").write_text(STUB_SOURCE)
    sys.path.insert(0, str(path))
    yield path
    sys.path.remove(str(path))


def parse(*args: str):
    return ConfigManager().parse_args(list(args))


def override_tokens(text: str) -> list[str]:
    return [token for line in text.splitlines() if line and not line.startswith("#") for token in line.split()]


def load_emitted(files: dict[str, str], workdir: Path, name: str):
    """The emitted config module, through ConfigManager, with its base swapped for the stub."""
    (workdir / f"{name}.py").write_text(files[emit.CONFIG_FILE])
    module = importlib.import_module(name)
    module.BASE_MODULE, module.BASE_CONFIG, module.MODEL_REGISTRY = STUB, "base", STUB
    # torchtitan.components.quantization imports its MoE kernels, which need triton (not installed
    # here): the converter configs are checked against its source instead (check_converters).
    module.converters = lambda: [(name, {"model_compile_enabled": module.COMPILE.get("enable", False), **fields})
                                 for name, fields in module.CONVERTERS]
    # So does the deepseek_v3 package that holds MTPLoss (check_loss reads its source instead).
    module.mtp_loss = lambda: ("MTPLoss", {"global_vocab_size": module.VOCAB_SIZE})
    return parse("--module", name, "--config", emit.CONFIG_FUNCTION)


def test_enough_generated_plans_fit():
    fitting = [i for i in range(len(CASES)) if best_of(i) is not None]
    assert len(fitting) >= 30
    layouts = [best_of(i).job.layout for i in fitting]
    assert any(lay.pp > 1 and lay.vpp == 1 for lay in layouts) and any(lay.vpp > 1 for lay in layouts)
    assert any(lay.tp > 1 for lay in layouts) and any(lay.cp > 1 for lay in layouts)
    assert {lay.zero_stage for lay in layouts} == {0, 3}
    assert {lay.recompute for lay in layouts} >= {"none", "selective", "full"}


@pytest.mark.parametrize("index", range(N_CASES))
def test_torchtitan_loads_and_accepts_the_plan(index, workdir):
    best = best_of(index)
    if best is None:
        pytest.skip("nothing fits this generated case")
    check_emitted(best, CASES[index]["training"]["global_batch_size"], workdir, f"tt_emitted_{index}")


EXPLICIT = {
    "uneven_1f1b": {"pp": 4, "stage_layers": [7, 9, 8, 8], "zero_stage": 3, "micro_batch_size": 2},
    "uneven_interleaved": {"pp": 2, "vpp": 2, "stage_layers": [12, 20], "zero_stage": 0, "recompute": "selective"},
    "tp_cp_vpp4": {"tp": 2, "sequence_parallel": True, "cp": 2, "pp": 2, "vpp": 4, "zero_stage": 3},
    "sharded_cp": {"cp": 4, "zero_stage": 3, "recompute": "full"},
    "async_tp": {"tp": 4, "sequence_parallel": True, "zero_stage": 3},
    # parallelism.no_enable_sequence_parallel (config/configs.py; the models' parallelize take enable_sp)
    "tp_without_sp": {"tp": 2, "sequence_parallel": False, "zero_stage": 3},
    "cpu_offload": {"zero_stage": 3, "offload_optimizer": 1.0, "offload_params": True, "recompute": "full"},
    # torch's ScheduleInterleaved1F1B runs micro-batches pp does not divide: 10 in 2 rounds of 5, and 3
    # (fewer than the stages) in one round.
    "interleaved_rounds": {"pp": 4, "vpp": 2, "micro_batch_size": 1, "zero_stage": 3},
    "interleaved_one_round": {"pp": 4, "vpp": 2, "micro_batch_size": 1, "zero_stage": 3},
}
EXPLICIT_TRAINING = {"async_tp": {"tp_comm_overlap": True},
                     "interleaved_rounds": {"global_batch_size": 40, "engine": "torchtitan"},
                     "interleaved_one_round": {"global_batch_size": 12, "engine": "torchtitan"}}
# Mixtures of experts: planned (the search picks ep; etp is 1) and given.
MOE_CASES = {
    "qwen3_30b_a3b_planned": ({"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
                               "training": {"global_batch_size": 256, "seq_len": 4096},
                               "search": {"target": "torchtitan"}}, None),
    "deepseek_v2_lite_ep8": ({"model": {"preset": "deepseek-v2-lite"},
                              "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
                              "training": {"global_batch_size": 128, "seq_len": 4096, "engine": "torchtitan"}},
                             {"ep": 8, "etp": 1, "zero_stage": 3, "recompute": "full"}),
}


def test_multi_token_prediction_rebuilds_deepseeks_model_with_its_loss(workdir):
    """DeepSeek-V2-Lite's shape (torchtitan's deepseek_v3 16B flavour) with one MTP layer; the
    plan keeps to what torchtitan's MTP runs: no pipeline, no context parallelism."""
    case, _ = MOE_CASES["deepseek_v2_lite_ep8"]
    case = {**case, "model": {**case["model"], "mtp_layers": 1}}
    best = planner.plan(case, top_k=0).best
    assert best is not None and best.job.layout.pp == best.job.layout.cp == 1
    check_emitted(best, case["training"]["global_batch_size"], workdir, "tt_moe_mtp")


@pytest.mark.parametrize("model, layout, needle", [
    ({"preset": "deepseek-v2-lite", "mtp_layers": 1},
     {"ep": 8, "etp": 1, "zero_stage": 3, "pp": 2, "stage_layers": [13, 14]},
     "layout.pp: torchtitan cannot run it: torchtitan's multi-token prediction does not support pipeline"),
    ({"preset": "deepseek-v2-lite", "mtp_layers": 1}, {"ep": 8, "etp": 1, "zero_stage": 3, "cp": 2},
     "layout.cp: torchtitan cannot run it: torchtitan's multi-token prediction does not support context"),
    ({"preset": "qwen3-30b-a3b", "mtp_layers": 1}, {"ep": 8, "etp": 1, "zero_stage": 3},
     "model.mtp_layers: torchtitan cannot run it: torchtitan builds multi-token prediction modules for its "
     "DeepSeek-V3"),
])
def test_torchtitan_refuses_multi_token_prediction_where_it_has_none(model, layout, needle):
    case = {"model": model, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 128, "seq_len": 4096, "engine": "torchtitan"}}
    with pytest.raises(CaseError, match=needle):
        planner.estimate({**case, "layout": layout})


@pytest.mark.parametrize("label", MOE_CASES)
def test_moe_layouts(label, workdir):
    """The expert-parallel degree reaches torchtitan's ParallelDims, and the base config is the
    model's own where torchtitan ships it."""
    case, layout = MOE_CASES[label]
    best = planner.plan(case, top_k=0).best if layout is None else planner.estimate({**case, "layout": layout})
    assert best is not None and best.job.model.is_moe
    assert emit.base_config(best.job.model)[1]  # deepseek_v3_16b, qwen3_30b_a3b
    check_emitted(best, case["training"]["global_batch_size"], workdir, f"tt_moe_{label}")


def test_torchtitan_refuses_expert_tensor_parallelism_and_replicated_expert_parallelism():
    case = {**MOE_CASES["deepseek_v2_lite_ep8"][0]}
    with pytest.raises(CaseError, match="layout.etp"):
        planner.estimate({**case, "layout": {"tp": 2, "ep": 4, "etp": 2, "zero_stage": 3,
                                             "sequence_parallel": True}})
    with pytest.raises(CaseError, match="borrows ranks from FSDP and TP only"):
        planner.estimate({**case, "layout": {"ep": 8, "etp": 1, "zero_stage": 0}})


@pytest.mark.parametrize("label", EXPLICIT)
def test_explicit_layouts(label, workdir):
    """Uneven stages, 1F1B, interleaving and replication, given rather than searched."""
    case = {**BASE_CASE, "layout": EXPLICIT[label],
            "training": {**BASE_CASE["training"], **EXPLICIT_TRAINING.get(label, {})}}
    check_emitted(planner.estimate(case), case["training"]["global_batch_size"], workdir, f"tt_explicit_{label}")


def check_emitted(best, case_global_batch: int, workdir: Path, module_name: str) -> None:
    job, lay = best.job, best.job.layout
    header = provenance(best, "case.yaml")
    files = emit.render(best, header)
    assert set(files) == {emit.CONFIG_FILE, emit.OVERRIDES_FILE, emit.LAUNCH_FILE, "sbatch.sh"}
    for name, text in files.items():
        body = text.removeprefix("#!/usr/bin/env bash\n")
        assert body.startswith("".join(f"# {line}\n" for line in header)), name

    cfg = load_emitted(files, workdir, module_name)
    p, t = cfg.parallelism, cfg.training

    # The overrides say the same thing as the config module.
    via_cli = parse("--module", STUB, "--config", "base", *override_tokens(files[emit.OVERRIDES_FILE]))
    assert via_cli.parallelism == p and via_cli.training == t and via_cli.compile == cfg.compile
    # The plan priced the model and the loss compiled (fused element-wise kernels, the compiled
    # loss's memory), so every config compiles both; TP collectives overlapped in the plan are
    # async TP here.
    overlap = job.training.tp_comm_overlap and lay.tp > 1
    assert cfg.compile.enable_async_tensor_parallel == overlap
    assert cfg.compile.enable and set(cfg.compile.components) == ({"model"} if job.training.compiled_loss is False
                                                                   else {"model", "loss"})
    assert type(via_cli.activation_checkpoint) is type(cfg.activation_checkpoint)

    # torchtitan's ParallelDims accepts the degrees (no mesh, no process group).
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                       cp=p.context_parallel_degree, tp=p.tensor_parallel_degree,
                       pp=p.pipeline_parallel_degree, ep=p.expert_parallel_degree, world_size=job.cluster.num_gpus)
    assert p.expert_parallel_degree == lay.ep
    if job.model.is_moe:  # the sparse mesh efsdp × ep covers the dense one's dp_shard·cp·tp ranks
        efsdp = dims.dp_shard * dims.cp * dims.tp // dims.ep
        assert efsdp * dims.ep == dims.dp_shard * dims.cp * dims.tp and efsdp * dims.dp_replicate == lay.edp
        assert lay.expert_tp == 1
    assert ParallelDims.from_config(p, job.cluster.num_gpus).dp_shard == dims.dp_shard
    assert (dims.dp_replicate * dims.dp_shard, dims.tp, dims.pp, dims.cp) == (lay.dp, lay.tp, lay.pp, lay.cp)
    assert dims.fsdp_enabled == (lay.zero_stage == 3 and lay.dp > 1 or lay.cp > 1)
    if lay.zero_stage == 3:
        assert dims.dp_replicate == 1 and p.fsdp_reshard_after_forward == "always"
    else:
        assert dims.dp_shard == 1
    assert p.enable_sequence_parallel == (lay.sequence_parallel or lay.tp == 1)
    # FSDP2's CPUOffloadPolicy: parameters, gradients and the optimizer step on the host together.
    assert t.enable_cpu_offload == lay.offload_params == (lay.offload_optimizer == 1)

    # Trainer.__init__: sequence divisibility, then the batch arithmetic.
    assert t.seq_len == job.training.seq_len
    assert t.seq_len % (dims.tp * (2 * dims.cp if dims.cp > 1 else 1)) == 0
    batch_degree = dims.dp_replicate * dims.dp_shard
    assert t.global_batch_size == job.training.global_batch_size == case_global_batch
    assert t.global_batch_size % (t.local_batch_size * batch_degree) == 0
    grad_accum = t.global_batch_size // (t.local_batch_size * batch_degree)
    if dims.pp_enabled:
        assert p.pipeline_parallel_microbatch_size == lay.micro_batch_size
        pipeline_microbatches = t.local_batch_size // p.pipeline_parallel_microbatch_size
        assert (grad_accum, pipeline_microbatches) == (1, job.grad_accum)
    else:
        assert (t.local_batch_size, grad_accum) == (lay.micro_batch_size, job.grad_accum)
    assert t.mixed_precision_param == ("float32" if job.training.precision == "fp32" else "bfloat16")

    # Pipeline: schedule, stage placement and layers per rank as torchtitan builds them.
    if dims.pp_enabled:
        schedule = get_schedule_class(p.pipeline_parallel_schedule)
        parts = p.module_fqns_per_model_part
        assert len(parts) == lay.pp * lay.vpp
        assert issubclass(schedule, PipelineScheduleSingle) == (lay.vpp == 1)
        flat = [m for part in parts for m in part]
        assert flat == ["tok_embeddings", *(f"layers.{i}" for i in range(job.model.num_layers)), "norm", "lm_head"]
        for rank in range(lay.pp):
            stages = _get_pp_rank_to_stage_indices_mapping(rank, lay.pp, p.pipeline_parallel_schedule, len(parts))
            assert len(stages) == lay.vpp
            layers = sum(1 for s in stages for m in parts[s] if m.startswith("layers."))
            assert layers == job.stage_layers[rank]
        # torchtitan's own schedule builder takes the config and the local batch (its checks, then torch's
        # Schedule1F1B or ScheduleInterleaved1F1B, whose rounds must divide the micro-batches), on
        # stand-in stages that carry only their place: the schedule it builds runs the plan's micro-batches.
        stages = [SimpleNamespace(group_size=lay.pp, group_rank=0, num_stages=lay.pp * lay.vpp,
                                  stage_index=lay.pp * v, is_first=v == 0, is_last=lay.pp * v == lay.pp * lay.vpp - 1)
                  for v in range(lay.vpp)]
        built = _build_pipeline_schedule(parallelism=p, local_batch_size=t.local_batch_size, stages=stages,
                                         loss_fn=lambda *args: (None, None))
        assert type(built) is schedule and built._n_microbatches == pipeline_microbatches == job.num_microbatches
    else:
        assert p.module_fqns_per_model_part is None

    ac = cfg.activation_checkpoint
    expected = {"none": type(None), "selective": SelectiveAC.Config, "full": FullAC.Config}[lay.recompute]
    assert type(ac) is expected
    check_converters(job, cfg)

    # launch.sh: a valid script starting torchtitan's entry point on every GPU.
    launch = files[emit.LAUNCH_FILE]
    nnodes, nproc = emit.launch_shape(best)
    assert nnodes * nproc == job.cluster.num_gpus and nproc <= job.cluster.gpu.gpus_per_node
    assert f"torchrun --nnodes {nnodes} --nproc_per_node {nproc}" in launch
    assert f"-m torchtitan.train --module {emit.CONFIG_MODULE} --config {emit.CONFIG_FUNCTION}" in launch
    script = workdir / f"launch_{module_name}.sh"
    script.write_text(launch)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0


def test_base_configs_name_real_torchtitan_functions():
    import torchtitan

    root = Path(torchtitan.__file__).parent / "models"
    for module, function, flavor in list(emit.BASE_CONFIGS.values()) + [emit.DEFAULT_BASE] \
            + list(emit.MOE_BASE_CONFIGS.values()) + [emit.DEFAULT_MOE_BASE]:
        assert f"def {function}(" in (root / module / "config_registry.py").read_text()
        assert f'"{flavor}":' in (root / module / "__init__.py").read_text(), (module, flavor)  # model_registry's


def test_every_base_config_runs_its_loss_in_the_chunks_the_engine_prices():
    """torchtitan 0.3.0's configs (models/*/config_registry.py) set loss=ChunkedLossWrapper.Config(...)
    without num_chunks, whose default (components/loss.py) is what the torchtitan engine prices."""
    import ast

    import torchtitan
    from torchtitan.components.loss import ChunkedLossWrapper

    assert ChunkedLossWrapper.Config().num_chunks == emit.BASE_LOSS_CHUNKS == 8
    root = Path(torchtitan.__file__).parent / "models"
    for module, function, _ in list(emit.BASE_CONFIGS.values()) + list(emit.MOE_BASE_CONFIGS.values()):
        tree = ast.parse((root / module / "config_registry.py").read_text())
        body = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function)
        losses = [kw.value for node in ast.walk(body) if isinstance(node, ast.Call)
                  for kw in node.keywords if kw.arg == "loss"]
        assert len(losses) == 1, function
        call = losses[0]
        assert ast.unparse(call.func) == "ChunkedLossWrapper.Config", function
        assert "num_chunks" not in [kw.arg for kw in call.keywords], function


def test_qwen3_235b_is_built_as_itself_not_as_the_30b_whose_training_config_it_takes():
    """torchtitan 0.3.0 ships Qwen3-235B-A22B as a flavour (models/qwen3/__init__.py, 94 layers, 128
    experts of 1,536, top-8) with no training config of its own: the files rebuilt Qwen3-30B-A3B's
    model (48 layers, 30.5B parameters) under a 94-layer pipeline split priced as the 235B."""
    import re

    import torchtitan

    case = {"model": {"preset": "qwen3-235b-a22b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 256},
            "training": {"global_batch_size": 2048, "seq_len": 4096, "engine": "torchtitan"}}
    best = planner.plan(case, top_k=0).best
    files = emit.render(best, ["x"])
    text = files[emit.CONFIG_FILE]
    assert "MODEL_FLAVOR = '235B-A22B'" in text and "stand-in" not in text
    # overrides.txt cannot rebuild it (model_spec is no command-line option): on qwen3_30b_a3b it trains the
    # 30B-A3B, whose 48 layers a 94-layer split leaves stages without; it says so.
    assert "Not here: the model: qwen3_30b_a3b builds torchtitan's 30B-A3B model" in files[emit.OVERRIDES_FILE]
    llama = emit.render(planner.plan({**case, "model": {"preset": "llama3-8b"}, "cluster": {
        "gpu": "h100-sxm-80gb", "num_gpus": 8}, "training": {**case["training"], "global_batch_size": 64}},
        top_k=0).best, ["x"])
    assert "Not here: the model" not in llama[emit.OVERRIDES_FILE]
    # Only there is overrides.txt what torchtitan_config.py is: on qwen3_30b_a3b it was called "equivalent"
    # above the lines saying what it leaves out (and diagnose refuses it, as it trains another model).
    assert f"equivalent to {emit.CONFIG_FILE}" in llama[emit.OVERRIDES_FILE]
    assert "equivalent" not in files[emit.OVERRIDES_FILE] and \
        f"the settings of {emit.CONFIG_FILE} on qwen3_30b_a3b, not the job it plans" in files[emit.OVERRIDES_FILE]
    source = (Path(torchtitan.__file__).parent / "models" / "qwen3" / "__init__.py").read_text()
    built = source[source.index("def _235b_a22b("):]
    built = built[:built.index("\ndef ")]
    model = best.job.model
    assert f"n_layers = {model.num_layers}" in built and f"dim = {model.hidden_size}" in built
    for field, value in (("num_experts", model.num_experts), ("top_k", model.moe_top_k),
                         ("moe_hidden_dim", model.moe_ffn_hidden_size), ("n_kv_heads", model.num_kv_heads)):
        assert re.search(rf"{field}={value}\b", built), field


def test_llama3_8b_uses_its_own_torchtitan_config():
    best = best_of(next(i for i in range(N_CASES) if CASES[i]["model"]["preset"] == "llama3-8b"
                        and best_of(i) is not None))
    text = emit.render(best, ["x"])[emit.CONFIG_FILE]
    assert "BASE_CONFIG = 'llama3_8b'" in text and "stand-in" not in text
    gpt = next(i for i in range(N_CASES) if CASES[i]["model"]["preset"] == "gpt-1.7b" and best_of(i) is not None)
    text = emit.render(best_of(gpt), ["x"])[emit.CONFIG_FILE]
    # The model is rebuilt from MODEL_REGISTRY and MODEL_FLAVOR (apply_layout): BASE_CONFIG alone, as the
    # warning said, still trained the stand-in's model.
    assert "stand-in" in text and "MODEL_REGISTRY and MODEL_FLAVOR" in text


BASE_CASE = {
    "model": {"preset": "llama2-7b"},
    "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
    "training": {"global_batch_size": 64, "seq_len": 4096},
}


@pytest.mark.parametrize("layout, training, needle", [
    ({"zero_stage": 1}, {}, "layout.zero_stage is 1"),
    ({"zero_stage": 2}, {}, "layout.zero_stage is 2"),
    ({"pp": 2, "recompute": "full", "recompute_num_layers": 4}, {}, "layout.recompute_num_layers is 4"),
    ({"zero_stage": 3}, {"precision": "fp16"}, "fp16"),
    ({"zero_stage": 3}, {"fp32_grads": False}, "float32 only"),
])
def test_refuses_what_torchtitan_cannot_express(layout, training, needle):
    case = {**BASE_CASE, "layout": layout, "training": {**BASE_CASE["training"], **training}}
    estimate = planner.estimate(case)
    with pytest.raises(CaseError) as error:
        emit.render(estimate, ["x"])
    assert error.value.source == "--emit" and error.value.key == "torchtitan"
    assert needle in str(error.value)


def test_a_loss_left_uncompiled_is_left_out_of_compile_components(workdir):
    """training.compiled_loss false: the plan priced eager PyTorch's cross-entropy (the fp32
    log-softmax kept, 6 bytes a logit of gradients), so torchtitan compiles the model alone."""
    training = {**BASE_CASE["training"], "engine": "torchtitan"}
    case = {**BASE_CASE, "training": {**training, "compiled_loss": False}, "layout": {"zero_stage": 3}}
    compiled = planner.estimate({**case, "training": training})
    eager = planner.estimate(case)
    assert compiled.job.training.loss_compiled and not eager.job.training.loss_compiled
    files = emit.render(eager, ["x"])
    cfg = load_emitted(files, workdir, "tt_emitted_eager_loss")
    assert cfg.compile.enable and list(cfg.compile.components) == ["model"]
    via_cli = parse("--module", STUB, "--config", "base", *override_tokens(files[emit.OVERRIDES_FILE]))
    assert via_cli.compile == cfg.compile
    assert eager.peak.activations > compiled.peak.activations


def test_one_chunk_of_the_wrapper_is_written_as_the_plan_priced_it(workdir):
    """training.chunked_loss with one chunk: ChunkedLossWrapper's one chunk, which keeps no logits
    (tests/test_chunked_loss_torch.py), in the config module and on the command line (tyro takes
    --loss.num_chunks 1), not the cross-entropy on whole logits that ``loss_chunks: 1`` alone runs."""
    training = {**BASE_CASE["training"], "engine": "torchtitan", "loss_chunks": 1, "chunked_loss": True}
    estimate = planner.estimate({**BASE_CASE, "training": training, "layout": {"zero_stage": 3}})
    files = emit.render(estimate, ["x"])
    cfg = load_emitted(files, workdir, "tt_emitted_loss_wrapped_1")
    check_loss(estimate.job, cfg)
    assert type(cfg.loss).__name__ == "Config" and cfg.loss.num_chunks == 1
    assert "--loss.num_chunks 1\n" in files[emit.OVERRIDES_FILE]
    assert "Not here: the loss on whole logits" not in files[emit.OVERRIDES_FILE]


@pytest.mark.parametrize("chunks", [1, 4])
def test_the_loss_runs_in_the_chunks_the_case_names(chunks, workdir):
    """training.loss_chunks: the base config's ChunkedLossWrapper in that many chunks, or, for one, its
    cross-entropy on whole logits (what the plan then prices: the logits kept for backward). overrides.txt
    carries the chunks (tyro takes --loss.num_chunks); whole logits it cannot, and the files say so."""
    training = {**BASE_CASE["training"], "engine": "torchtitan", "loss_chunks": chunks}
    estimate = planner.estimate({**BASE_CASE, "training": training, "layout": {"zero_stage": 3}})
    default = planner.estimate({**BASE_CASE, "training": {**BASE_CASE["training"], "engine": "torchtitan"},
                                "layout": {"zero_stage": 3}})
    files = emit.render(estimate, ["x"])
    cfg = load_emitted(files, workdir, f"tt_emitted_loss_{chunks}")
    check_loss(estimate.job, cfg)
    if chunks == 1:
        assert "no command-line option, so overrides.txt cannot carry it" in files[emit.CONFIG_FILE]
        assert "Not here: the loss on whole logits" in files[emit.OVERRIDES_FILE]
    else:
        assert f"--loss.num_chunks {chunks}\n" in files[emit.OVERRIDES_FILE]
    # Four chunks hold twice the logits eight do, beside the same fp32 accumulator and LM-head gradient.
    if chunks == 4:
        assert estimate.peak.activations > default.peak.activations
        assert estimate.peak.gradients == default.peak.gradients


def test_loss_chunks_are_torchtitans_and_must_divide_each_ranks_sequence():
    for engine in ("megatron", "deepspeed"):
        with pytest.raises(CaseError, match="not in chunks") as error:
            planner.plan({**BASE_CASE, "training": {**BASE_CASE["training"], "engine": engine, "loss_chunks": 8}})
        assert error.value.key == "training.loss_chunks"
    # Left to the planner, the engine is the one that runs it.
    chosen = planner.plan({**BASE_CASE, "training": {**BASE_CASE["training"], "loss_chunks": 8}}, top_k=0).best
    assert chosen.job.training.engine.name == "torchtitan"
    # ChunkedLossWrapper's torch._check: each rank's sequence (seq_len / cp) in equal chunks.
    training = {**BASE_CASE["training"], "engine": "torchtitan", "loss_chunks": 3}
    with pytest.raises(CaseError, match="into 3 equal chunks") as error:
        planner.plan({**BASE_CASE, "training": training})
    assert error.value.key == "training.loss_chunks"
    with pytest.raises(CaseError) as error:
        planner.estimate({**BASE_CASE, "training": {**training, "loss_chunks": 512}, "layout": {"cp": 16, "zero_stage": 3}})
    assert error.value.key == "layout.cp" and "4096/16" in str(error.value)


def test_gpt_oss_under_context_parallelism_is_rebuilt_with_flex_attention(workdir):
    """gpt_oss's model_registry builds VarlenAttention (models/gpt_oss/__init__.py), which torchtitan refuses
    under context parallelism with its default spmd_types backend (distributed/full_dtensor.py
    validate_config: "Use FlexAttention + CP"): the files for a cp 2 plan stopped at parallelize."""
    import torchtitan

    root = Path(torchtitan.__file__).parent
    assert 'attn_backend: str = "varlen"' in (root / "models" / "gpt_oss" / "__init__.py").read_text()
    assert "Use FlexAttention + CP" in (root / "distributed" / "full_dtensor.py").read_text()
    case = {"model": {"preset": "gpt-oss-20b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 16, "seq_len": 32768, "engine": "torchtitan"}}
    for cp, backend in ((2, "flex"), (1, None)):
        layout = {"dp": 16 // cp, "cp": cp, "ep": 8, "zero_stage": 3, "micro_batch_size": 1, "recompute": "full"}
        estimate = planner.estimate({**case, "layout": layout})
        files = emit.render(estimate, ["x"])
        cfg = load_emitted(files, workdir, f"tt_gpt_oss_cp{cp}")
        assert cfg.model_spec.get("attn_backend") == backend
        # overrides.txt, on gpt_oss's own model spec, keeps VarlenAttention: it says so, as it says of the
        # converters (it called itself equivalent, and its command stopped at startup).
        assert ("Not here: the attention backend" in files[emit.OVERRIDES_FILE]) == (backend == "flex")


def test_mxfp8_experts_pad_to_the_rows_their_kernel_needs(workdir):
    """Qwen3-30B-A3B in MXFP8 on B200: MXFP8GroupedExpertsConverter with its default pad_multiple 32,
    where the SM100 kernel needs 128 (and torchtitan's own MXFP8 config sets it)."""
    import torchtitan

    source = (Path(torchtitan.__file__).parent / "components" / "quantization" / "mx.py").read_text()
    assert "pad_multiple: int = 32" in source and "requires multiples of 128" in source
    case = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "b200", "num_gpus": 16},
            "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "mxfp8"}}
    best = planner.plan(case, engine="torchtitan", top_k=0).best
    cfg = load_emitted(emit.render(best, ["x"]), workdir, "tt_qwen3_mxfp8")
    assert [fields["pad_multiple"] for name, fields in cfg.model_spec["converters"]
            if name == "MXFP8GroupedExpertsConverter"] == [128]


def test_full_recompute_of_every_layer_counts_as_full(workdir):
    case = {**BASE_CASE, "layout": {"pp": 2, "recompute": "full", "recompute_num_layers": 16, "zero_stage": 3}}
    files = emit.render(planner.estimate(case), ["x"])
    cfg = load_emitted(files, workdir, "tt_emitted_full16")
    assert type(cfg.activation_checkpoint) is FullAC.Config
    assert cfg.parallelism.pipeline_parallel_schedule == "1F1B"


def converter_fields(name: str) -> dict[str, tuple]:
    """The fields of torchtitan's ``<name>.Config`` (with QuantizationConverter.Config's), read
    from torchtitan's source: field name -> the values its Literal type admits (() if any)."""
    import ast

    import torchtitan

    root = Path(torchtitan.__file__).parent / "components" / "quantization"
    fields: dict[str, tuple] = {}
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name in (name, "QuantizationConverter"):
                config = next(c for c in node.body if isinstance(c, ast.ClassDef) and c.name == "Config")
                for item in config.body:
                    if isinstance(item, ast.AnnAssign):
                        hint = item.annotation
                        literal = isinstance(hint, ast.Subscript) and getattr(hint.value, "id", "") == "Literal"
                        values = hint.slice.elts if literal and isinstance(hint.slice, ast.Tuple) else \
                            [hint.slice] if literal else []
                        fields[item.target.id] = tuple(v.value for v in values)
    return fields


def check_loss(job, cfg) -> None:
    """The loss as priced: without multi-token prediction, torchtitan's ChunkedLossWrapper in the
    chunks the plan priced (``activations.loss_chunks``), which divide each rank's sequence (its
    ``torch._check``), or its cross-entropy on whole logits for one chunk. Multi-token prediction:
    the DeepSeek-V3 model spec rebuilt with the layers (``model_registry(flavor, num_mtp_layers=N)``)
    and torchtitan's MTPLoss over the model's vocabulary, as its ``deepseek_v3_debugmodel_mtp``
    config does."""
    import ast

    import torchtitan
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss

    if not job.model.mtp_layers:
        assert cfg.model_spec is None or "num_mtp_layers" not in cfg.model_spec
        chunks = loss_chunks(job.model, job.training)
        if not chunked_loss(job.model, job.training):
            assert type(cfg.loss) is CrossEntropyLoss.Config
        else:
            assert type(cfg.loss) is ChunkedLossWrapper.Config and cfg.loss.num_chunks == chunks
            assert (job.training.seq_len // job.layout.cp) % chunks == 0
        return
    assert cfg.model_spec["flavor"] == emit.model_flavor(job.model)
    assert cfg.model_spec["num_mtp_layers"] == job.model.mtp_layers
    kind, fields = cfg.loss
    assert (kind, fields) == ("MTPLoss", {"global_vocab_size": job.model.vocab_size})
    # torchtitan's source declares both: model_registry's num_mtp_layers, MTPLoss.Config's field.
    package = Path(torchtitan.__file__).parent / "models" / "deepseek_v3"
    registry = next(node for node in ast.walk(ast.parse((package / "__init__.py").read_text()))
                    if isinstance(node, ast.FunctionDef) and node.name == "model_registry")
    assert "num_mtp_layers" in [a.arg for a in registry.args.args + registry.args.kwonlyargs]
    loss = next(node for node in ast.walk(ast.parse((package / "mtp.py").read_text()))
                if isinstance(node, ast.ClassDef) and node.name == kind)
    config = next(c for c in loss.body if isinstance(c, ast.ClassDef) and c.name == "Config")
    assert set(fields) <= {item.target.id for item in config.body if isinstance(item, ast.AnnAssign)}


def check_converters(job, cfg) -> None:
    """The model is rebuilt with torchtitan's converter configs for the recipe: classes of
    torchtitan.components.quantization, fields its Configs declare, values its Literal types
    admit, compiled; none in 16 or 32 bits."""
    recipe = job.training.recipe
    check_loss(job, cfg)
    if recipe is None:
        assert cfg.model_spec is None or cfg.model_spec["converters"] == []
        return
    spec = cfg.model_spec
    assert spec["flavor"] == emit.model_flavor(job.model)
    ((kind, fields),) = spec["converters"]
    declared = converter_fields(kind)
    assert "model_compile_enabled" in declared and fields["model_compile_enabled"] and cfg.compile.enable
    for name, value in fields.items():
        assert name in declared, (kind, name)
        assert not declared[name] or value in declared[name], (kind, name, value)
    if job.training.precision == "fp8":
        assert kind == "Float8LinearConverter" and fields["recipe_name"] == recipe.name
        assert fields["filter_fqns"] == ["lm_head"]
    else:
        assert kind == {"mxfp8": "MXFP8LinearConverter", "nvfp4": "NVFP4LinearConverter"}[job.training.precision]
        # Decoder layers only, matched as torchtitan's convert() does (substring of the fqn): the
        # LM head stays bf16, and NVFP4 keeps the last 15 % of the layers too.
        converted = [i for i in range(job.model.num_layers)
                     if any(f in f"layers.{i}.feed_forward.w1" for f in fields["fqns"])]
        assert converted == list(range(job.model.num_layers - sum(job.high_precision_layers)))
        assert not any(f in "lm_head" for f in fields["fqns"])


RECIPES = {
    "fp8_default_rowwise": ("h100-sxm-80gb", {"precision": "fp8"}),
    "fp8_rowwise_with_gw_hp": ("h100-sxm-80gb", {"precision": "fp8", "fp8_recipe": "rowwise_with_gw_hp"}),
    "mxfp8": ("b200", {"precision": "mxfp8"}),
    "nvfp4": ("gb200", {"precision": "nvfp4"}),
}


@pytest.mark.parametrize("label", RECIPES)
def test_recipes_become_torchtitans_converters(label, workdir):
    gpu, training = RECIPES[label]
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": gpu, "num_gpus": 8},
            "training": {"global_batch_size": 32, "seq_len": 8192, **training}, "search": {"target": "torchtitan"}}
    best = planner.plan(case, top_k=0).best
    check_emitted(best, 32, workdir, f"tt_recipe_{label}")


@pytest.mark.parametrize("gpu, training, needle", [
    ("h100-sxm-80gb", {"precision": "fp8", "fp8_recipe": "tensorwise"}, "recipe_name rowwise, rowwise_with_gw_hp, not"),
    ("h100-sxm-80gb", {"precision": "fp8", "fp8_param_gather": True}, "no float8 all-gather"),
    ("mi355x", {"precision": "mxfp8"}, "needs an NVIDIA Blackwell GPU"),
])
def test_torchtitan_refuses_recipes_it_has_no_converter_for(gpu, training, needle):
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": gpu, "num_gpus": 8},
            "training": {"global_batch_size": 32, "seq_len": 8192, "engine": "torchtitan", **training}}
    with pytest.raises(CaseError, match=needle):  # estimate refuses, with the key
        planner.estimate({**case, "layout": {"zero_stage": 3}})
    with pytest.raises(CaseError, match=needle):  # plan refuses it up front, before any layout
        planner.plan(case, top_k=0)


def test_a_capacity_factor_torchtitan_cannot_run_is_refused_before_the_search():
    """torchtitan's token dispatch is dropless (models/common/token_dispatcher.py): a case with
    model.moe_capacity_factor was planned and priced with the padding, and its files dropped the
    factor without a word. No engine named, torchtitan is left out and says why."""
    case = {"model": {"preset": "qwen3-30b-a3b", "moe_capacity_factor": 1.25},
            "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
            "training": {"global_batch_size": 256, "seq_len": 4096}}
    with pytest.raises(CaseError, match="model.moe_capacity_factor: torchtitan cannot run it: torchtitan's expert "
                                        "dispatch is dropless"):
        planner.plan(case, engine="torchtitan")
    decided = planner.plan(case).to_dict()
    assert "dropless" in decided["engines"]["torchtitan"]["why_not"] and decided["engine"] != "torchtitan"


@pytest.mark.parametrize("layout, key", [
    ({"dp": 4, "tp": 1, "pp": 4, "vpp": 3}, "layout.vpp"),  # 32 layers split evenly: 8 a stage, not in 3 chunks
    ({"dp": 4, "tp": 1, "pp": 4, "vpp": 2, "stage_layers": [9, 7, 8, 8]}, "layout.stage_layers"),
])
def test_unequal_chunks_are_written_as_priced(layout, key, workdir):
    """torchtitan takes any contiguous model parts (module_fqns_per_model_part), and its own default
    interleaved split leaves the first and last a layer short: stages whose layers do not divide by vpp
    were refused as chunks torchtitan could not run. The parts written are the chunks priced."""
    case = {**BASE_CASE, "training": {**BASE_CASE["training"], "engine": "torchtitan"},
            "layout": {"micro_batch_size": 1, "zero_stage": 3, **layout}}
    est = planner.estimate(case)
    chunks = list(est.job.model_chunk_layers)
    assert len(set(chunks)) > 1
    parts = emit.stage_modules(est)
    assert [sum(m.startswith("layers.") for m in part) for part in parts] == list(chunks)
    check_emitted(est, case["training"]["global_batch_size"], workdir, f"tt_unequal_{key.split('.')[1]}")


def test_what_a_base_config_sets_beside_the_layout_is_set_as_planned(workdir):
    """torchtitan's llama3_405b builds its model with Float8LinearConverter and runs async TP, its
    DeepSeek-V3 configs compile the loss alone: a bf16 plan without TP overlap, emitted on such a base,
    trained in fp8 with async TP (or its model eager), since only what differed from the default was set."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16"},
            "search": {"target": "torchtitan", "tp": 2}}
    best = planner.plan(case, top_k=0).best
    assert not best.job.training.tp_comm_overlap and best.job.training.recipe is None
    files = emit.render(best, provenance(best, "case.yaml"))
    (workdir / "tt_on_405b.py").write_text(files[emit.CONFIG_FILE])
    module = importlib.import_module("tt_on_405b")
    module.BASE_MODULE, module.BASE_CONFIG, module.MODEL_REGISTRY = STUB, "base_like_405b", STUB
    module.converters = lambda: []
    config = getattr(module, emit.CONFIG_FUNCTION)()
    assert config.model_spec == {"flavor": module.MODEL_FLAVOR, "converters": []}  # rebuilt: no Float8
    assert config.compile.enable and set(config.compile.components) == {"model", "loss"}
    assert config.compile.enable_async_tensor_parallel is False


def test_expert_parallelism_without_a_pipeline_runs_without_cuda_graphs(workdir):
    """Qwen3-30B-A3B at ep 8, pp 1: torchtitan refused the files (CUDA graphs with the all-to-all
    dispatcher), which set disable_cuda_graphs only with a pipeline."""
    case = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16"},
            "search": {"target": "torchtitan", "pp": 1, "ep": 8}}
    best = planner.plan(case, top_k=0).best
    assert best.job.layout.ep == 8 and best.job.layout.pp == 1
    check_emitted(best, 64, workdir, "tt_ep_no_pp")


def test_overrides_on_a_base_that_builds_its_own_float8_model_say_so():
    """`--config llama3_405b` with the overrides keeps torchtitan's Float8 model (no option removes a
    converter): a bf16 plan's overrides.txt says to run the config module instead."""
    case = {"model": {"preset": "llama3.1-405b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 128},
            "training": {"global_batch_size": 128, "seq_len": 8192, "precision": "bf16"},
            "search": {"target": "torchtitan"}}
    best = planner.plan(case, top_k=0).best
    assert emit.base_config(best.job.model) == (("llama3", "llama3_405b"), True)
    text = emit.render(best, provenance(best, "case.yaml"))[emit.OVERRIDES_FILE]
    assert "llama3_405b builds its model with Float8LinearConverter" in " ".join(text.split())


def test_what_torchtitans_model_code_refuses_is_not_planned_or_written():
    """Qwen3-30B-A3B's 4 key-value heads at tp 8 (models/common/decoder.py: tensor_parallel_degree must
    divide n_kv_heads), and DeepSeek-V2-Lite at 32k tokens, past its RoPE's 16k (max_seq_len), were
    planned and written, and torchtitan refused both."""
    qwen = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 8192, "engine": "torchtitan"}}
    p = planner.plan(qwen, top_k=5)
    assert all(4 % e.job.layout.tp == 0 for e in (p.best, *p.alternatives))
    with pytest.raises(CaseError) as refused:
        planner.estimate({**qwen, "layout": {"tp": 8, "dp": 2, "ep": 1, "zero_stage": 3, "micro_batch_size": 1,
                                             "sequence_parallel": True}})
    assert refused.value.key == "layout.tp" and "key-value heads" in refused.value.expected
    lite = {"model": {"preset": "deepseek-v2-lite"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 32, "seq_len": 32768, "engine": "torchtitan"}}
    with pytest.raises(CaseError, match="RoPE"):
        emit.render(planner.plan(lite, top_k=0).best, ["header"])


def test_a_mixture_of_experts_in_fp8_converts_its_experts_and_keeps_its_router():
    """Float8LinearConverter walks Linear configs only: the experts' grouped GEMMs, priced in fp8, stayed
    bf16, and the router's gate, priced in bf16, was quantized (torchtitan's deepseek_v3_671b_float8
    adds Float8GroupedExpertsConverter and filters router.gate)."""
    case = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "h200-sxm-141gb", "num_gpus": 64},
            "training": {"global_batch_size": 512, "seq_len": 8192, "precision": "fp8", "engine": "torchtitan"}}
    best = planner.plan(case, top_k=0).best
    kinds = dict(emit.converters(best.job))
    assert set(kinds) == {"Float8LinearConverter", "Float8GroupedExpertsConverter"}
    assert "router.gate" in kinds["Float8LinearConverter"]["filter_fqns"]
    for kind, fields in kinds.items():  # torchtitan's classes, with fields their Configs declare
        declared = converter_fields(kind)
        assert "model_compile_enabled" in declared and set(fields) <= set(declared), kind


def test_rowwise_with_bf16_weight_gradients_is_refused_for_experts_torchtitan_runs_in_fp8():
    """Qwen3-30B-A3B in fp8 rowwise_with_gw_hp was planned (and emitted) for torchtitan with the experts'
    weight-gradient GEMMs priced in bf16, where Float8GroupedExpertsConverter takes no recipe and runs
    them row-wise in fp8 (components/quantization/float8.py): another recipe than priced, and another
    best layout (ep 8, selective recomputation) than rowwise's (ep 4, tp 2)."""
    import torchtitan

    source = (Path(torchtitan.__file__).parent / "components" / "quantization" / "float8.py").read_text()
    experts = source[source.index("class Float8GroupedExpertsConverter"):]
    config = experts[experts.index("class Config"):]
    assert config.split("\n")[1].strip() == "pass"  # no field: no recipe to give it
    case = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "h100-sxm-80gb", "nodes": 4},
            "training": {"global_batch_size": 256, "seq_len": 8192, "precision": "fp8",
                         "fp8_recipe": "rowwise_with_gw_hp"}}
    with pytest.raises(CaseError, match=r"training.fp8_recipe: torchtitan cannot run it: torchtitan's fp8 converter "
                                        r"for the experts' grouped GEMMs takes no recipe"):
        planner.plan(case, engine="torchtitan")
    dense = {**case, "model": {"preset": "llama3-8b"}}
    assert planner.plan(dense, engine="torchtitan", top_k=0).best is not None


def test_nvfp4_experts_torchtitan_cannot_quantize_are_refused_before_the_plan():
    """A mixture of experts in NVFP4 was planned for torchtitan and weighed against the other engines
    (552,069 tokens/s beside Megatron-LM's), though torchtitan has no NVFP4 converter for grouped
    experts (they would train in bf16) and --emit then refused the files: refused before the search,
    with the engine decision saying why."""
    import torchtitan

    root = Path(torchtitan.__file__).parent / "components" / "quantization"
    sources = "".join(path.read_text() for path in root.glob("*.py"))
    assert "class MXFP8GroupedExpertsConverter" in sources and "NVFP4GroupedExperts" not in sources
    case = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "b200", "num_gpus": 32},
            "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "nvfp4"}}
    with pytest.raises(CaseError, match=r"training.precision: torchtitan cannot run it: torchtitan has no NVFP4 "
                                        r"converter for the experts' grouped GEMMs"):
        planner.plan(case, engine="torchtitan")
    decided = planner.plan(case, top_k=0)
    assert decided.best.job.training.engine.name != "torchtitan"


def test_a_1f1b_pipeline_with_fewer_micro_batches_than_stages_is_refused():
    """torch's Schedule1F1B raises ValueError for fewer micro-batches than stages when torchtitan's
    trainer builds it; a plan pinned to pp 8 at dp 8 with 16 sequences a step (2 micro-batches) was
    written as 1F1B and stopped at startup."""
    case = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 16, "seq_len": 4096, "engine": "torchtitan"},
            "layout": {"dp": 8, "tp": 1, "pp": 8, "micro_batch_size": 1, "zero_stage": 3, "recompute": "full"}}
    with pytest.raises(CaseError) as refused:
        planner.estimate(case)
    assert refused.value.key == "layout.micro_batch_size" and "got 2 for pp 8" in str(refused.value)
    case["training"]["global_batch_size"] = 64  # 8 micro-batches for 8 stages
    assert planner.estimate(case).job.num_microbatches == 8


def test_replicated_experts_that_torchtitan_would_shard_are_refused():
    """At zero_stage 0, torchtitan still FSDP-shards the routed experts over efsdp = cp·tp / ep
    (ParallelDims.build_mesh, apply_fsdp_to_decoder's edp_mesh): DeepSeek-V2-Lite at tp 8, ep 4 had
    its experts priced whole (15.2 GB of parameters where torchtitan keeps half)."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    dims = ParallelDims(dp_replicate=2, dp_shard=1, cp=1, tp=8, pp=1, ep=4, world_size=16)
    assert dims.dp_shard * dims.cp * dims.tp // dims.ep == 2  # the efsdp build_mesh makes
    case = {"model": {"preset": "deepseek-v2-lite", "mtp_layers": 0}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "torchtitan"},
            "layout": {"dp": 2, "tp": 8, "ep": 4, "etp": 1, "zero_stage": 0, "micro_batch_size": 1,
                       "recompute": "full"}}
    with pytest.raises(CaseError) as refused:
        planner.estimate(case)
    assert refused.value.key == "layout.ep" and "ep must be cp·tp = 8" in str(refused.value)
    case["layout"]["ep"] = 8
    assert planner.estimate(case).job.layout.ep == 8


@pytest.mark.parametrize("preset, limit", [("qwen3-30b-a3b", 40960), ("deepseek-v2-lite", 16384)])
def test_plan_refuses_a_sequence_past_the_base_configs_rope_before_the_search(preset, limit):
    """torchtitan 0.3.0's models hold RoPE for max_seq_len tokens (models/qwen3/__init__.py 40960,
    models/deepseek_v3/__init__.py 16384; models/common/decoder.py refuses a longer sequence). plan
    picked a layout at seq_len 131072 that --emit then refused: the refusal comes before the search."""
    case = {"model": {"preset": preset}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 16, "seq_len": 131072}}
    with pytest.raises(CaseError, match=f"past the {limit} tokens"):
        planner.plan(case, engine="torchtitan", top_k=0)
