"""torchtitan emitter, read back against torchtitan's own registry: the emitted ``torchtitan_config.py``
(and its ``overrides.txt``) is loaded by torchtitan 0.3.0's ``ConfigManager`` on the base config the
file names (``BASE_MODULE``/``BASE_CONFIG``: ``torchtitan.models.llama3.config_registry.llama3_8b``,
``...qwen3.config_registry.qwen3_30b_a3b``, ...), as ``torchtitan.train`` would load it, and each
resolved field is compared with the layout ``plan --json`` prints (``Estimate.to_dict()``).

test_emit_torchtitan.py checks the emitter's arithmetic on a stand-in base; this module checks that
the real base configs, which set their own parallelism, batch, checkpointing and compile sections,
end up with the plan's values once the emitted ``apply_layout`` has run.

Only what cannot be imported on a CPU machine without torchtitan's training dependencies (CI installs
torchtitan ``--no-deps``, requirements-engines.txt) is stubbed, in ``sys.modules`` of a child process,
so the stubs never reach the other test modules of a pytest-xdist worker:

- ``torchtitan.overrides.fused_mla``, ``torchtitan.overrides.fused_swiglu`` and
  ``torchtitan.distributed.minimal_async_ep.kernels``: they import triton at their top (no triton on
  CPU; stubbing triton itself would make torch believe it is installed and break torch's imports);
- ``tokenizers``, ``torchdata``, ``datasets``, ``torch.utils.tensorboard``, ``wandb``: the data loader,
  tokenizer and metric loggers ``torchtitan.trainer`` imports, not installed in CI;
- ``torchao``: the low-precision converters (``Float8LinearConverter``...) import it only when a model
  is converted, not when their ``Config`` is built, so nothing here needs it.

Nothing the layout is read from (``torchtitan.config``, ``torchtitan.trainer.Trainer.Config``, the
models' ``config_registry``) is stubbed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torchtitan")
pytest.importorskip("tyro")

import planner  # noqa: E402
from planner.configs import render  # noqa: E402
from planner.engines.torchtitan import emit  # noqa: E402

H100 = "h100-sxm-80gb"
# Varied layouts on the real bases: dense (llama3), a mixture of experts (qwen3, deepseek_v3), context
# parallelism, pipelines with 1F1B and interleaving (vpp 2), fp8 (Float8 converters), FSDP2 CPU offload.
CASES = {
    "dense_planned": {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": H100, "num_gpus": 16},
                      "training": {"global_batch_size": 128, "seq_len": 8192}, "search": {"target": "torchtitan"}},
    "moe_planned": {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": H100, "num_gpus": 16},
                    "training": {"global_batch_size": 256, "seq_len": 4096}, "search": {"target": "torchtitan"}},
    "moe_deepseek_ep8": {"model": {"preset": "deepseek-v2-lite"}, "cluster": {"gpu": H100, "num_gpus": 16},
                         "training": {"global_batch_size": 128, "seq_len": 4096, "engine": "torchtitan"},
                         "layout": {"ep": 8, "etp": 1, "zero_stage": 3, "recompute": "full"}},
    "cp2_tp2": {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 32},
                "training": {"global_batch_size": 64, "seq_len": 16384, "engine": "torchtitan"},
                "layout": {"tp": 2, "sequence_parallel": True, "cp": 2, "zero_stage": 3, "recompute": "selective"}},
    "pp4_1f1b": {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": H100, "num_gpus": 32},
                 "training": {"global_batch_size": 128, "seq_len": 4096, "engine": "torchtitan"},
                 "layout": {"pp": 4, "stage_layers": [7, 9, 8, 8], "zero_stage": 3, "micro_batch_size": 2}},
    "pp2_vpp2": {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": H100, "num_gpus": 16},
                 "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "torchtitan"},
                 "layout": {"pp": 2, "vpp": 2, "tp": 2, "sequence_parallel": True, "zero_stage": 0,
                            "micro_batch_size": 1, "recompute": "selective"}},
    "fp8_tp4": {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": H100, "num_gpus": 16},
                "training": {"global_batch_size": 64, "seq_len": 8192, "precision": "fp8", "engine": "torchtitan"},
                "layout": {"tp": 4, "sequence_parallel": True, "zero_stage": 3, "recompute": "full"}},
    "moe_fp8": {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": H100, "num_gpus": 16},
                "training": {"global_batch_size": 128, "seq_len": 4096, "precision": "fp8", "engine": "torchtitan"},
                "layout": {"ep": 8, "etp": 1, "zero_stage": 3, "recompute": "full"}},
    "cpu_offload": {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": H100, "num_gpus": 8},
                    "training": {"global_batch_size": 32, "seq_len": 4096, "engine": "torchtitan"},
                    "layout": {"zero_stage": 3, "offload_optimizer": 1.0, "offload_params": True, "recompute": "full"}},
    # The LM head and loss in other chunks than the bases' 8, and on whole logits (training.loss_chunks).
    "loss_chunks_4": {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": H100, "num_gpus": 16},
                      "training": {"global_batch_size": 64, "seq_len": 8192, "engine": "torchtitan", "loss_chunks": 4},
                      "layout": {"zero_stage": 3, "recompute": "full"}},
    "whole_logits": {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": H100, "num_gpus": 16},
                     "training": {"global_batch_size": 64, "seq_len": 8192, "engine": "torchtitan", "loss_chunks": 1},
                     "layout": {"zero_stage": 3, "recompute": "full"}},
}

# Run in a child process: the stubs go into its sys.modules, nowhere else. It loads every folder it is
# given through ConfigManager, the module path (--module torchtitan_config --config layout_planner)
# and the overrides path (--module <base> --config <base> plus overrides.txt), and prints what they
# resolved to.
LOADER = textwrap.dedent('''
    import importlib.abc, importlib.machinery, json, re, sys, types

    STUBBED = ("torchtitan.overrides.fused_mla", "torchtitan.overrides.fused_swiglu",
               "torchtitan.distributed.minimal_async_ep.kernels",
               "tokenizers", "torchdata", "datasets", "torch.utils.tensorboard", "wandb")


    class Stub(types.ModuleType):
        """A module whose every name exists: classes for capitalised names (they are subclassed),
        callables otherwise (decorators hand back what they decorate)."""

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            value = type(name, (), {}) if name[:1].isupper() else Stub(f"{self.__name__}.{name}")
            setattr(self, name, value)
            return value

        def __call__(self, *args, **kwargs):
            return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else Stub("result")


    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if any(name == s or name.startswith(s + ".") for s in STUBBED):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)

        def create_module(self, spec):
            module = Stub(spec.name)
            module.__path__ = []
            return module

        def exec_module(self, module):
            pass


    sys.meta_path.insert(0, Finder())
    from torchtitan.config import ConfigManager
    from torchtitan.components import quantization

    # A converter converts the model config when the model spec is built (model_registry), which needs
    # torchao and an SM89+ GPU (Float8LinearConverter.__init__): the converters built are recorded,
    # with their Config fields, and the model config is left as it is.
    BUILT = []
    for _name in dir(quantization):
        _cls = getattr(quantization, _name)
        if isinstance(_cls, type) and _name.endswith("Converter") and hasattr(_cls, "Config"):
            _cls.__init__ = lambda self, config: BUILT.append(config)
            _cls.convert = lambda self, model_config, *a, **k: model_config


    def resolved(argv):
        BUILT.clear()
        config = ConfigManager().parse_args(argv)
        p, t = config.parallelism, config.training
        spec = getattr(config, "model_spec", None)
        return {
            "dp_replicate": p.data_parallel_replicate_degree, "dp_shard": p.data_parallel_shard_degree,
            "tp": p.tensor_parallel_degree, "cp": p.context_parallel_degree, "pp": p.pipeline_parallel_degree,
            "ep": p.expert_parallel_degree, "sp": p.enable_sequence_parallel,
            "reshard": p.fsdp_reshard_after_forward, "schedule": p.pipeline_parallel_schedule,
            "pp_microbatch": p.pipeline_parallel_microbatch_size, "parts": p.module_fqns_per_model_part,
            "local_batch": t.local_batch_size, "global_batch": t.global_batch_size, "seq_len": t.seq_len,
            "cpu_offload": t.enable_cpu_offload, "param_dtype": t.mixed_precision_param,
            "compile": config.compile.enable, "compile_components": sorted(config.compile.components),
            "async_tp": config.compile.enable_async_tensor_parallel,
            "ac": type(config.activation_checkpoint).__qualname__,
            "converters": [[type(c).__qualname__, {k: getattr(c, k) for k in ("recipe_name", "filter_fqns", "fqns")
                                                   if hasattr(c, k)}] for c in BUILT],
            "flavor": getattr(spec, "flavor", None),
            "loss": [type(config.loss).__qualname__, getattr(config.loss, "num_chunks", None)],
            "base_class": type(config).__module__ + "." + type(config).__qualname__,
        }


    out = {}
    for folder in sys.argv[1:]:
        sys.path.insert(0, folder)
        sys.modules.pop("torchtitan_config", None)
        overrides = open(folder + "/overrides.txt").read()
        base = re.search(r"--module (\\S+) --config (\\S+)", overrides)
        words = [w for line in overrides.splitlines() if line and not line.startswith("#") for w in line.split()]
        import torchtitan_config
        out[folder] = {
            "names": [torchtitan_config.BASE_MODULE, torchtitan_config.BASE_CONFIG],
            "module": resolved(["--module", "torchtitan_config", "--config", "layout_planner"]),
            "overrides": resolved(["--module", base[1], "--config", base[2], *words]),
            "overrides_base": [base[1], base[2]],
        }
        sys.path.remove(folder)
    print(json.dumps(out))
''')


def planned(label: str):
    case = CASES[label]
    if "layout" in case:
        return planner.estimate(case)
    best = planner.plan(case, top_k=0).best
    assert best is not None, label
    return best


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Every case planned and emitted as `plan --emit torchtitan` writes it, then loaded in one child."""
    root = tmp_path_factory.mktemp("tt_registry")
    plans, folders = {}, {}
    for label in CASES:
        estimate = planned(label)
        files, _ = render(estimate, "torchtitan", "case.yaml")
        folder = root / label
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text)
        plans[label], folders[label] = estimate, str(folder)
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", LOADER, *folders.values()],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {label: (plans[label], out[folders[label]]) for label in CASES}


def test_the_cases_reach_every_branch(loaded):
    layouts = {label: estimate.job.layout for label, (estimate, _) in loaded.items()}
    assert any(lay.ep > 1 for lay in layouts.values()) and any(lay.cp > 1 for lay in layouts.values())
    assert any(lay.pp > 1 and lay.vpp == 1 for lay in layouts.values())
    assert any(lay.vpp > 1 for lay in layouts.values())
    assert any(lay.offload_params for lay in layouts.values())
    assert {lay.zero_stage for lay in layouts.values()} == {0, 3}
    assert {lay.recompute for lay in layouts.values()} == {"none", "selective", "full"}


@pytest.mark.parametrize("label", CASES)
def test_the_real_base_config_resolves_to_the_plan(label, loaded):
    estimate, got = loaded[label]
    job = estimate.job
    layout = estimate.to_dict()["layout"]  # what plan --json prints
    (module, function, flavor), _ = emit._base(job.model)
    # The file names a real registry config, and that config is what ConfigManager built on.
    assert got["names"] == [f"torchtitan.models.{module}.config_registry", function]
    assert got["overrides_base"] == [module, function]  # ConfigManager's short form of the same module
    assert got["module"]["base_class"] == "torchtitan.trainer.Trainer.Config"
    # Both ways of loading the folder resolve to the same thing, but for the converters, which are no
    # command-line option (overrides.txt says so): that way the model is the base config's own.
    r = got["module"]
    # (The loss: test_the_overrides_run_the_planned_loss.)
    assert {**got["overrides"], "converters": r["converters"], "loss": r["loss"]} == r, label
    assert got["overrides"]["converters"] == []

    zero3 = layout["zero_stage"] == 3
    assert (r["tp"], r["cp"], r["pp"]) == (layout["tp"], layout["cp"], layout["pp"])
    assert r["dp_replicate"] * r["dp_shard"] == layout["dp"]
    assert (r["dp_shard"], r["dp_replicate"]) == ((layout["dp"], 1) if zero3 else (1, layout["dp"]))
    if zero3:
        assert r["reshard"] == "always"
    assert r["ep"] == layout.get("ep", 1)
    assert r["sp"] == (layout["sequence_parallel"] or layout["tp"] == 1)
    assert r["cpu_offload"] == layout.get("offload_params", False)
    assert (r["global_batch"], r["seq_len"]) == (CASES[label]["training"]["global_batch_size"],
                                                 CASES[label]["training"]["seq_len"])
    if layout["pp"] > 1:
        # One local batch a step, split in micro-batches of the plan's size by the pipeline schedule.
        assert r["pp_microbatch"] == layout["micro_batch_size"]
        assert r["local_batch"] == layout["micro_batch_size"] * job.num_microbatches
        assert r["global_batch"] == r["local_batch"] * layout["dp"]
        assert r["schedule"] == ("Interleaved1F1B" if layout["vpp"] > 1 else "1F1B")
        assert len(r["parts"]) == layout["pp"] * layout["vpp"]
        layers = [sum(1 for m in part if m.startswith("layers.")) for part in r["parts"]]
        if "stage_layers" in layout:  # rank r holds parts r, r + pp, ...: its layers are the plan's
            assert [sum(layers[s::layout["pp"]]) for s in range(layout["pp"])] == layout["stage_layers"]
        assert sum(layers) == job.model.num_layers
    else:
        # torchtitan accumulates global / (local · dp) steps of the local batch.
        assert r["local_batch"] == layout["micro_batch_size"]
        assert r["global_batch"] // (r["local_batch"] * layout["dp"]) == estimate.to_dict()["grad_accum"]
        assert r["parts"] is None
    assert r["ac"] == {"none": "NoneType", "selective": "SelectiveAC.Config", "full": "FullAC.Config"}[layout["recompute"]]
    # The plan priced compiled kernels and async TP where it overlapped TP's collectives.
    assert r["compile"] and "model" in r["compile_components"]
    assert r["async_tp"] == bool(job.training.tp_comm_overlap and layout["tp"] > 1)
    assert r["param_dtype"] == "bfloat16"
    # The model rebuilt at the plan's flavour, with the converters that price fp8: none otherwise (a
    # base's own Float8 converters would train in another precision).
    assert r["flavor"] == flavor
    assert r["converters"] == [[f"{name}.Config", fields] for name, fields in emit.converters(job)]
    if job.training.precision == "fp8":  # the priced recipe, the LM head (and a router's gate) left in bf16
        linear = r["converters"][0]
        assert linear[0] == "Float8LinearConverter.Config" and linear[1]["recipe_name"] == job.training.recipe.name
        assert linear[1]["filter_fqns"] == (["lm_head", "router.gate"] if job.model.is_moe else ["lm_head"])
        assert [c[0] for c in r["converters"][1:]] == (["Float8GroupedExpertsConverter.Config"] if job.model.is_moe
                                                        else [])
    else:
        assert r["converters"] == []


@pytest.mark.parametrize("label", CASES)
def test_the_overrides_run_the_planned_loss(label, loaded, tmp_path):
    """The loss as the plan priced it (training.loss_chunks, else torchtitan's 8): ChunkedLossWrapper in
    that many chunks, or, for 1, torchtitan's cross-entropy on whole logits. overrides.txt carries the
    chunks (tyro takes --loss.num_chunks); whole logits it cannot select, and then must not say it is
    equivalent to torchtitan_config.py but name what it leaves out."""
    estimate, got = loaded[label]
    if estimate.job.model.mtp_layers:  # MTPLoss: the model rebuilt, said in overrides.txt (another test)
        return
    chunks = CASES[label]["training"].get("loss_chunks", 8)
    planned_loss = ["CrossEntropyLoss.Config", None] if chunks == 1 else ["ChunkedLossWrapper.Config", chunks]
    assert got["module"]["loss"] == planned_loss
    header = render(estimate, "torchtitan", "case.yaml")[0]["overrides.txt"]
    if chunks == 1:
        assert "equivalent to" not in header and "Not here: the loss on whole logits" in header
    else:
        assert got["overrides"]["loss"] == planned_loss
