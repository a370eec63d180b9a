"""`diagnose`: emitted configs read back to their layout; an existing config is compared with the best."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("megatron.core")

import planner  # noqa: E402
from planner.case import layout_to_mapping  # noqa: E402
from planner.configs import render  # noqa: E402
from planner.diagnose import diagnose  # noqa: E402
from planner.errors import CaseError  # noqa: E402
from planner.files import Output, write_all  # noqa: E402

PRESETS = ["llama2-7b", "gpt-1.7b", "gpt-3.6b", "llama3-8b", "mistral-7b"]


def cases(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        yield {
            "model": {"preset": rng.choice(PRESETS)},
            "cluster": {"gpu": rng.choice(["a100-sxm-80gb", "h100-sxm-80gb"]), "num_gpus": rng.choice([8, 16, 32, 64])},
            "training": {"global_batch_size": rng.choice([64, 128, 256]), "seq_len": rng.choice([2048, 4096])},
        }


@pytest.mark.parametrize("engine, option", [("deepspeed", "config"), ("megatron", "megatron_args")])
def test_every_emitted_config_round_trips_through_diagnose(tmp_path, engine, option):
    checked = 0
    for i, case in enumerate(cases(7 if engine == "deepspeed" else 11, 12)):
        best = planner.plan(case, target=engine, top_k=0).best
        if best is None:
            continue
        folder = tmp_path / f"{engine}{i}"
        files, _ = render(best, engine, "<generated>")
        written = write_all([Output(folder / name, text) for name, text in files.items()], force=False)
        # Megatron: the argument list, and the launch script that reads it from beside itself.
        names = ("ds_config.json",) if engine == "deepspeed" else ("megatron_args.txt", "launch.sh")
        for config in (p for p in written if p.name in names):
            kwargs = {option: config}
            if engine == "deepspeed":
                kwargs["pp"] = best.job.layout.pp
            result = diagnose(case, **kwargs)
            assert layout_to_mapping(result.estimate.job.layout) == best.to_dict()["layout"]
            # Diagnosing the planner's own best finds nothing faster, and says no change is worth it.
            assert result.speedup == pytest.approx(1.0, abs=1e-9)
            assert "no change is worth making" in result.verdict
        checked += 1
    assert checked >= 10


def test_the_planners_zero_3_file_is_weighed_against_layouts_as_their_own_files_run(tmp_path):
    """The ZeRO-3 ds_config `plan` writes reduces in buckets of hidden² elements; diagnose searched every
    other layout with those, so ZeRO-2 ones held 1.9 GB less than their own files (5e8-element buckets,
    DeepSpeed's stage_1_and_2.py setup_buckets): Llama 3 8B at 64k tokens on 16 H100s was told to change
    to dp 8, tp 2, ZeRO 2 as fitting, where `plan` prices that layout at risk."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 16, "seq_len": 65536, "precision": "fp8"}}
    best = planner.plan(case, target="deepspeed", top_k=0).best
    assert best.job.layout.zero_stage == 3
    files, _ = render(best, "deepspeed", "<generated>")
    written = write_all([Output(tmp_path / name, text) for name, text in files.items()], force=False)
    config = next(p for p in written if p.name == "ds_config.json")
    assert json.loads(config.read_text())["zero_optimization"]["reduce_bucket_size"] == 4096 ** 2
    result = diagnose(case, config=config, pp=1, tp=1)
    assert layout_to_mapping(result.estimate.job.layout) == best.to_dict()["layout"]
    assert result.speedup == pytest.approx(1.0, abs=1e-9) and "no change is worth making" in result.verdict


def test_diagnose_names_the_speedup_of_the_best_layout(tmp_path):
    case = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 128, "seq_len": 4096}}
    (tmp_path / "case.yaml").write_text(json.dumps(case))
    # A typical hand-written config: ZeRO-1, micro-batch 1, full recomputation.
    (tmp_path / "ds_config.json").write_text(json.dumps({
        "train_batch_size": 128, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
        "zero_optimization": {"stage": 1}, "bf16": {"enabled": True},
        "activation_checkpointing": {"partition_activations": False}}))
    out = subprocess.run([sys.executable, "-m", "planner", "diagnose", str(tmp_path / "case.yaml"),
                          "--config", str(tmp_path / "ds_config.json"), "--recompute", "full", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["config"]["layout"]["recompute"] == "full" and data["config"]["grad_accum"] == 8
    expected = data["config"]["step_time_s"] / data["best"]["step_time_s"]
    assert data["speedup"] == pytest.approx(expected) and data["speedup"] > 1.0
    # Full recomputation costs a third more compute where nothing needs it: far beyond the model's noise.
    assert data["speedup"] > 1.2 and data["verdict"].endswith("worth the change")


def test_a_best_slower_than_the_config_says_it_is_the_price_of_fitting(tmp_path):
    """NVIDIA's Llama 3 8B fp8 recipe for 8 H100s (Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh:
    sequences of 8,192, micro-batch 1, no recomputation, the distributed optimizer) is predicted at risk
    of not fitting, its predicted peak over the usable memory: the planner's best (the robust pick, surer
    to fit) is slower, and diagnose says why rather than calling a slowdown a speedup ("within the gap
    the model cannot tell apart: no change is worth making", where the best fits as predicted but not
    at its band's upper end)."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 128, "seq_len": 8192, "precision": "fp8", "engine": "megatron"}}
    args = tmp_path / "megatron_args.txt"
    args.write_text("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
                    "--group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192 "
                    "--swiglu --untie-embeddings-and-output-weights --disable-bias-linear "
                    "--attention-dropout 0.0 --hidden-dropout 0.0 --micro-batch-size 1 --global-batch-size 128 "
                    "--bf16 --grad-reduce-in-bf16 --fp8-format hybrid --fp8-param-gather --tensor-model-parallel-size 1 "
                    "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather\n")
    result = diagnose(case, megatron_args=args)
    usable = result.estimate.usable_bytes
    # The config's predicted peak is over the usable memory, the best's under it (surer to fit).
    assert result.estimate.memory_verdict == "at risk" and result.estimate.peak.total > usable
    assert result.plan.best.peak.total <= usable
    assert result.speedup < 1.0
    assert result.verdict.startswith("the config is at risk of not fitting") and "slower" in result.verdict


def test_a_contradictory_config_is_one_line(tmp_path):
    case = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 128, "seq_len": 4096}}
    (tmp_path / "case.yaml").write_text(json.dumps(case))
    bad = tmp_path / "ds_config.json"
    bad.write_text(json.dumps({"train_batch_size": 512, "train_micro_batch_size_per_gpu": 4,
                               "gradient_accumulation_steps": 8}))
    out = subprocess.run([sys.executable, "-m", "planner", "diagnose", str(tmp_path / "case.yaml"),
                          "--config", str(bad)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "train_batch_size" in lines[0]


def _written(tmp_path, case, engine):
    best = planner.plan(case, target=engine).best
    files, _ = render(best, engine, "<generated>")
    return write_all([Output(tmp_path / name, text) for name, text in files.items()], force=False)


def test_stage_layers_that_agree_with_the_arguments_are_taken(tmp_path):
    """Llama 3 8B's arguments at pp 1 hold its 32 layers in one stage: --stage-layers 32 agrees, and was
    refused as differing from "the None megatron_args.txt states"; one that differs says the file's split."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096}, "search": {"pp": 1}}
    args = next(p for p in _written(tmp_path, case, "megatron") if p.name == "megatron_args.txt")
    assert diagnose(case, megatron_args=args, stage_layers=(32,)).estimate.job.stage_layers == (32,)
    with pytest.raises(CaseError, match=r"--stage-layers: 16,16 differs from the 32 megatron_args.txt states"):
        diagnose(case, megatron_args=args, stage_layers=(16, 16))


def test_a_pipeline_ds_config_without_pp_says_to_give_it(tmp_path):
    """A ds_config.json does not state the pipeline: one at pp 2 read without --pp was refused as a file
    whose train_batch_size contradicts itself; the line now says the pipeline it took and the pp · tp
    that would make the file's batch, and with --pp 2 it reads back. (The planner's own files say their
    pipeline in their header, and read back without --pp.)"""
    import json

    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096}, "search": {"pp": 2, "tp": 1}}
    config = next(p for p in _written(tmp_path, case, "deepspeed") if p.name == "ds_config.json")
    assert diagnose(case, config=config).estimate.job.layout.pp == 2
    theirs = {k: v for k, v in json.loads(config.read_text()).items() if k != "_comment"}
    config.write_text(json.dumps(theirs))
    with pytest.raises(CaseError, match=r"taken as pp 1 and tp 1: for data-parallel 8, give pp · tp = 2 \(--pp"):
        diagnose(case, config=config)
    assert diagnose(case, config=config, pp=2).estimate.job.layout.pp == 2


def test_diagnose_on_the_planners_own_moe_files_finds_their_layout_best(tmp_path):
    """The planner writes --moe-token-dispatcher-type alltoall where the experts stay inside one NVLink
    domain (DeepEP saves nothing there); diagnose read that as the case's dispatch for its own plan, which
    then priced every layout across nodes without DeepEP and picked another (Qwen3-30B-A3B on 32 H100s:
    ep 4, "0.97x speedup", against the files' own plan at ep 8)."""
    case = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
            "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "bf16", "moe_comm_overlap": True},
            "search": {"pp": 2}}
    best = planner.plan(case, target="megatron").best
    files, _ = render(best, "megatron", "<generated>")
    written = write_all([Output(tmp_path / name, text) for name, text in files.items()], force=False)
    args = next(p for p in written if p.name == "megatron_args.txt")
    assert "--moe-token-dispatcher-type alltoall" in args.read_text()
    result = diagnose(case, megatron_args=args)
    assert layout_to_mapping(result.estimate.job.layout) == best.to_dict()["layout"]
    assert result.speedup == pytest.approx(1.0) and result.plan.differences(result.estimate) == {}


def test_a_ds_config_key_a_letter_from_deepspeeds_own_is_said(tmp_path):
    """DeepSpeed reads ds_config's keys with dict.get and ignores any other: a misspelled
    train_micro_batch_size_per_gpu or zero_optimization went by without a word, the run as DeepSpeed
    would start it (micro-batch derived, ZeRO from the other key) read as if intended."""
    case = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 128, "seq_len": 4096}}
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"train_batch_size": 128, "gradient_accumulation_steps": 8,
                                  "zero_optimization": {"stage": 1}, "bf16": {"enabled": True},
                                  "trian_micro_batch_size_per_gpu": 4, "zero_optimisation": {"stage": 3},
                                  "wandb": {"enabled": False}}))
    result = diagnose(case, config=config, recompute="full")
    said = [n for n in result.notes if "is no DeepSpeed key" in n]
    assert said == ["ds_config.json: trian_micro_batch_size_per_gpu is no DeepSpeed key (did you mean "
                    "train_micro_batch_size_per_gpu?): DeepSpeed ignores it, and so does this reading",
                    "ds_config.json: zero_optimisation is no DeepSpeed key (did you mean zero_optimization?): "
                    "DeepSpeed ignores it, and so does this reading"]
    assert result.estimate.job.layout.micro_batch_size == 1 and result.estimate.job.layout.zero_stage == 1


def test_a_config_of_another_engine_than_the_case_names_is_read_as_its_engine_runs_it(tmp_path):
    """`plan --engine deepspeed --emit deepspeed` on a case naming Megatron-LM wrote files that diagnose
    refused with "pass --engine deepspeed", an option diagnose does not have: the config's engine is
    the one it runs, as `plan --engine` takes it."""
    case = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 128, "seq_len": 4096, "engine": "megatron"}}
    best = planner.plan(case, engine="deepspeed").best
    files, _ = render(best, "deepspeed", "<generated>")
    written = write_all([Output(tmp_path / name, text) for name, text in files.items()], force=False)
    config = next(p for p in written if p.name == "ds_config.json")
    result = diagnose(case, config=config, pp=best.job.layout.pp)
    assert result.engine == "deepspeed" and result.speedup == pytest.approx(1.0)


def test_a_layout_the_engine_refuses_is_named_in_the_config_not_the_case(tmp_path):
    """Megatron-LM's activation offload beside a pipeline, read from an argument list, was refused as
    the case's layout.offload_activations, a section the case did not have."""
    case = tmp_path / "case.yaml"
    case.write_text(json.dumps({"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
                                "training": {"global_batch_size": 128, "seq_len": 4096, "engine": "megatron"}}))
    args = tmp_path / "args.txt"
    args.write_text("--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 --micro-batch-size 1 "
                    "--global-batch-size 128 --seq-length 4096 --bf16 --use-distributed-optimizer "
                    "--cpu-offloading-num-layers 4\n")
    with pytest.raises(CaseError) as error:
        diagnose(case, megatron_args=args)
    assert (error.value.source, error.value.key) == (str(args), "--cpu-offloading-num-layers")
    assert "megatron cannot run it" in error.value.expected


def test_a_misspelled_zero_key_is_refused_as_deepspeed_refuses_it_and_a_refusal_says_the_near_miss(tmp_path):
    """DeepSpeed's zero_optimization forbids keys it does not know (a pydantic model): offload_optimiser
    went by with exit 0, though the launch would not start. And a refusal that a top-level near-miss
    explains (zero_optimisation left ZeRO 0) named a key the file did not have, the note lost."""
    case = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 128, "seq_len": 4096}}
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"train_batch_size": 128, "train_micro_batch_size_per_gpu": 1,
                                  "zero_optimization": {"stage": 2, "offload_optimiser": {"device": "cpu"}},
                                  "bf16": {"enabled": True}}))
    with pytest.raises(CaseError) as error:
        diagnose(case, config=config, recompute="full")
    assert error.value.key == "zero_optimization.offload_optimiser"
    assert "did you mean offload_optimizer?" in error.value.expected
    config.write_text(json.dumps({"train_batch_size": 128, "train_micro_batch_size_per_gpu": 1,
                                  "zero_optimisation": {"stage": 3}, "bf16": {"enabled": True}}))
    case["training"]["fp32_grads"] = True  # refused at the ZeRO 0 the misspelling leaves: bf16 gradients there
    with pytest.raises(CaseError) as error:
        diagnose(case, config=config, recompute="full")
    assert "zero_optimisation is no DeepSpeed key (did you mean zero_optimization?)" in error.value.expected


LLAMA8 = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
          "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16", "engine": "deepspeed"}}


@pytest.mark.parametrize("config, zero, offload_optimizer, offload_params", [
    # DeepSpeed's deprecated spellings (zero/config.py's new_param_fn, precision_config.py's BFLOAT16_OLD):
    # cpu_offload was read as nothing (the optimizer priced on the GPU), bfloat16 as an fp32 run (refused).
    ({"zero_optimization": {"stage": 2, "cpu_offload": True}, "bf16": {"enabled": True}}, 2, 1.0, False),
    ({"zero_optimization": {"stage": 3, "cpu_offload_param": True}, "bf16": {"enabled": True}}, 3, 0.0, True),
    ({"zero_optimization": {"stage": 2}, "bfloat16": {"enabled": True}}, 2, 0.0, False),
    # bf16: null is no bf16 to precision_config.get_bfloat16_config, which then reads bfloat16 (it was
    # refused as an fp32 run)
    ({"zero_optimization": {"stage": 2}, "bf16": None, "bfloat16": {"enabled": True}}, 2, 0.0, False),
    # offload_param below stage 3: only DeepSpeed's stage-3 optimizer takes it (runtime/engine.py); refused
    ({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}},
      "bf16": {"enabled": True}}, 2, 1.0, False),
])
def test_a_ds_config_is_read_as_deepspeed_reads_it(tmp_path, config, zero, offload_optimizer, offload_params):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, **config}))
    layout = diagnose(LLAMA8, config=path).estimate.job.layout
    assert (layout.zero_stage, layout.offload_optimizer, layout.offload_params) == (zero, offload_optimizer,
                                                                                  offload_params)
    assert layout.micro_batch_size == 2


def test_bfloat16_beside_bf16_is_said_to_be_ignored_where_it_would_have_run_bf16(tmp_path):
    """DeepSpeed reads bf16 where it is given and ignores the deprecated bfloat16 beside it: an fp32 run
    by a disabled bf16 is refused as fp32, and the refusal says why the enabled bfloat16 did not count."""
    from deepspeed.runtime.precision_config import get_bfloat16_config

    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
              "bf16": {"enabled": False}, "bfloat16": {"enabled": True}}
    assert not get_bfloat16_config(config).enabled  # DeepSpeed's own reading: fp32
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(CaseError, match="trains in fp32 \\(bfloat16 beside bf16 is ignored: DeepSpeed reads bf16\\)"):
        diagnose(LLAMA8, config=path)


def test_deepspeeds_pipeline_checkpoint_interval_recomputes_every_layer(tmp_path):
    """pipeline.activation_checkpoint_interval 1 (a DS-3D Llama-2 launch script's) makes DeepSpeed's
    pipeline engine checkpoint every layer (runtime/pipe/engine.py); it was read as no recomputation."""
    case = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 32},
            "training": {"global_batch_size": 8, "seq_len": 4096, "precision": "fp16", "engine": "deepspeed"}}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
                                "zero_optimization": {"stage": 1}, "fp16": {"enabled": True},
                                "pipeline": {"activation_checkpoint_interval": 1}}))
    result = diagnose(case, config=path, pp=4, tp=8)
    assert result.estimate.job.layout.recompute == "full" and result.estimate.time.recompute_s > 0
    with pytest.raises(CaseError, match="--recompute: none: .*activation_checkpoint_interval 1 checkpoints every"):
        diagnose(case, config=path, pp=4, tp=8, recompute="none")


def test_an_auto_global_batch_is_filled_as_the_trainer_fills_it(tmp_path):
    """train_batch_size "auto" took the case's global batch (64), and the config's micro-batch 1 ×
    accumulation 4 × dp 8 = 32 was then blamed on the file, which never says 64."""
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2},
                                "gradient_accumulation_steps": 4, "train_batch_size": "auto",
                                "train_micro_batch_size_per_gpu": "auto"}))
    with pytest.raises(CaseError, match=r'train_batch_size: "auto", as the Trainer fills it \(micro 1 × '
                                        r"accumulation 4 × data-parallel 8\), is 32, but the case"):
        diagnose(LLAMA8, config=path, micro_batch_size=1)


DS_CASE = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
           "training": {"global_batch_size": 128, "seq_len": 4096, "engine": "deepspeed"}}


def _ds_config(tmp_path, **changes):
    """The config `plan --emit deepspeed` writes for DS_CASE, with ``changes`` (dotted keys) made."""
    best = planner.plan(DS_CASE, target="deepspeed", top_k=0).best
    files, _ = render(best, "deepspeed", "<generated>")
    config = json.loads(files["ds_config.json"])
    for dotted, value in changes.items():
        section, *rest = dotted.split(".")
        if rest:
            config.setdefault(section, {})[rest[0]] = value
        else:
            config[section] = value
    (tmp_path / "ds_config.json").write_text(json.dumps(config))
    return tmp_path / "ds_config.json", best


def test_what_the_emitted_deepspeed_config_runs_is_priced_and_what_a_users_adds_is_said(tmp_path):
    """A ds_config's settings the estimate does not price were read as if absent, with the same step time
    and no word: the overlap DeepSpeed leaves off below stage 3 unless set, ZeRO++, fp32 reductions,
    torch.compile. The emitted config, read back, gets no such note."""
    config, best = _ds_config(tmp_path)
    emitted = diagnose(DS_CASE, config=config)
    assert emitted.estimate.step_time_s == pytest.approx(best.step_time_s)
    # (the case's unstated loss is the case's note, not the config's: train.py runs the loss)
    assert not [n for n in emitted.notes if "priced" in n and "training.loss is unstated" not in n], emitted.notes
    assert best.job.layout.zero_stage in (1, 2) and best.job.layout.dp > 1  # where overlap_comm matters
    for changes, said in [({"zero_optimization.overlap_comm": False}, "zero_optimization.overlap_comm false"),
                          ({"zero_optimization.zero_quantized_gradients": True},
                           "zero_optimization.zero_quantized_gradients: not priced"),
                          ({"compile": {"deepcompile": True}}, "compile.deepcompile: not priced"),
                          ({"zero_optimization.reduce_bucket_size": 200_000_000},  # priced; the gather's not
                           "allgather_bucket_size 500,000,000: DeepSpeed does not use it at ZeRO-"),
                          ({"zero_optimization.reduce_bucket_size": 200_000_000},  # what it does, what is priced
                           "it gathers each parameter group's updated weights after the step in one collective: "
                           "runtime/utils.py, all_gather_dp_groups); the estimate prices that gather so, one "
                           "all-gather of the weights, whatever the bucket sizes: one per parameter group of the "
                           "optimizer the ds_config's section builds over model.parameters()"),
                          ({"amp": {"enabled": True}}, "amp: removed from DeepSpeed")]:
        config, _ = _ds_config(tmp_path, **changes)
        notes = diagnose(DS_CASE, config=config).notes
        assert any(said in n for n in notes), (changes, notes)
    # communication_data_type is priced, not only said: the bf16 gradients cast to fp32 for the reduction
    # (runtime/engine.py, allreduce_bucket) carry twice the bytes (tests/test_emit_deepspeed.py measures it).
    from cost_models.dp_time import dp_comm_exposed
    from cost_models.stage_time import stage_time

    config, _ = _ds_config(tmp_path, communication_data_type="fp32")
    wide = diagnose(DS_CASE, config=config)
    assert not [n for n in wide.notes if "communication_data_type" in n], wide.notes
    comm = [dp_comm_exposed(d.estimate.job, 0, stage_time(d.estimate.job, 0)) for d in (emitted, wide)]
    assert comm[1] > comm[0] > 0, comm
    config, _ = _ds_config(tmp_path)
    # Without overlap_comm DeepSpeed's default below stage 3 is off (runtime/zero/config.py).
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    plain = json.loads(config.read_text())["zero_optimization"]
    plain.pop("overlap_comm")
    assert DeepSpeedZeroConfig(**plain).overlap_comm is False
    config, _ = _ds_config(tmp_path, zero_optimization=plain)
    assert any("overlap_comm absent" in n for n in diagnose(DS_CASE, config=config).notes)


def test_a_zero_key_deepspeed_refuses_and_ulysses_are_refused(tmp_path):
    """Any key DeepSpeed's zero_optimization does not define stops the launch (not only one a letter from
    a key it does), as do MiCS's, which DeepSpeed 0.19 removed; DeepSpeed-Ulysses' sequence parallelism
    divides the data-parallel ranks and was read as none."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    for key in ("bogus_key", "mics_shard_size"):
        with pytest.raises(Exception):  # pydantic's extra_forbidden, or DeepSpeed's removed key
            DeepSpeedZeroConfig(stage=2, **{key: 1})
        config, _ = _ds_config(tmp_path, **{f"zero_optimization.{key}": 1})
        with pytest.raises(CaseError) as error:
            diagnose(DS_CASE, config=config)
        assert error.value.key == f"zero_optimization.{key}", str(error.value)
    config, _ = _ds_config(tmp_path, sequence_parallel_size=2)
    with pytest.raises(CaseError) as error:
        diagnose(DS_CASE, config=config)
    assert error.value.key == "sequence_parallel_size" and "Ulysses" in error.value.expected


@pytest.mark.parametrize("changes, key, said", [
    ({"zero_optimization.reduce_bucket_size": -5}, "zero_optimization.reduce_bucket_size", "at least 1"),
    ({"zero_optimization.reduce_bucket_size": 1e999}, "zero_optimization.reduce_bucket_size", "at least 1"),
    # DeepSpeedZeroConfig: Field(ge=0) for the stage-3 sizes too (-5 and Infinity went by, exit 0)
    ({"zero_optimization.stage3_prefetch_bucket_size": -5}, "zero_optimization.stage3_prefetch_bucket_size",
     "at least 0"),
    ({"zero_optimization.stage3_max_live_parameters": 1e999}, "zero_optimization.stage3_max_live_parameters",
     "at least 0"),
    ({"zero_optimization.overlap_comm": [1]}, "zero_optimization.overlap_comm", "expected true or false"),
    ({"communication_data_type": "fp17"}, "communication_data_type", "expected fp32, fp16 or bf16"),
    # DeepSpeed parses it at start-up whether or not Ulysses runs (runtime/config.py: ValueError)
    ({"seq_parallel_communication_data_type": "int8"}, "seq_parallel_communication_data_type",
     "expected fp32, fp16 or bf16"),
    ({"compile": True}, "compile", "expected a mapping"),
    # `"1.0" > 0.` raises TypeError at DeepSpeed's first step (engine.py, _take_model_step)
    ({"gradient_clipping": "1.0"}, "gradient_clipping", "expected a number"),
    ({"gradient_clipping": None}, "gradient_clipping", "expected a number"),
    ({"zero_optimization.offload_optimizer": {"device": "cpu", "buffr_count": 4}},
     "zero_optimization.offload_optimizer.buffr_count", "did you mean buffer_count?"),
])
def test_what_deepspeed_refuses_in_the_keys_the_notes_read_is_refused(tmp_path, changes, key, said):
    """Values DeepSpeed's config refuses (int ge=0 buckets, a bool, its three reduction dtypes, a
    CompileConfig, the offload models' fields) went by with exit 0, some with a note of 'inf' buckets."""
    config, _ = _ds_config(tmp_path, **changes)
    with pytest.raises(CaseError) as error:
        diagnose(DS_CASE, config=config)
    assert error.value.key == key and said in error.value.expected, str(error.value)


def test_a_gradient_clipping_that_clips_nothing_is_said(tmp_path):
    """DeepSpeed clips only where gradient_clipping is above 0: -1 and NaN (which compares as neither)
    train unclipped with no word from DeepSpeed, and went by here too. 0 (its way to turn clipping off),
    a positive norm and the Trainer's "auto" get no note."""
    import inspect

    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.engine import DeepSpeedEngine

    assert "if self.gradient_clipping() > 0.0:" in inspect.getsource(DeepSpeedEngine._take_model_step)
    assert "if self.clip_grad > 0.:" in inspect.getsource(BF16_Optimizer)
    for clip, shown in ((-1.0, "-1"), (float("nan"), "nan")):  # -1.0 read as -1, as hjson reads it
        config, _ = _ds_config(tmp_path, gradient_clipping=clip)
        notes = diagnose(DS_CASE, config=config).notes
        assert f"ds_config.json: gradient_clipping {shown}: DeepSpeed clips only where it is above 0 (runtime/engine.py " \
               "and its optimizers: clip_grad > 0.), so the run trains with no gradient clipping and says nothing; " \
               "write 0 to mean that, or the norm to clip at (1.0 is DeepSpeed's default)" in notes, notes
    for clip in (0, 1.0, "auto", True):
        config, _ = _ds_config(tmp_path, gradient_clipping=clip)
        assert not [n for n in diagnose(DS_CASE, config=config).notes if "gradient_clipping" in n]


CASE_8 = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
          "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16", "engine": "deepspeed"}}


FP32_GRADS_8 = {**CASE_8, "training": {**CASE_8["training"], "fp32_grads": True}}


def _write_config(tmp_path, config: dict):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    return path


def test_deepspeed_reads_as_deepspeed_does_what_it_takes_and_refuses_what_it_refuses(tmp_path):
    """Checked against DeepSpeed 0.19.8's own config models: reduce_bucket_size 0 (gt=0) and
    compute_grad_norm false at stage 3 were diagnosed, exit 0; bf16.enabled "true" (pydantic's lax
    bool) and zero_optimization: true (the deprecated form, stage 1) were refused as malformed."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig, get_zero_config

    base = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}}
    for zero, key in (({"stage": 2, "reduce_bucket_size": 0}, "zero_optimization.reduce_bucket_size"),
                      ({"stage": 3, "compute_grad_norm": False}, "zero_optimization.compute_grad_norm")):
        with pytest.raises(Exception):
            DeepSpeedZeroConfig(**zero)
        with pytest.raises(CaseError) as error:
            diagnose(CASE_8, config=_write_config(tmp_path, {**base, "zero_optimization": zero}))
        assert error.value.key == key
    # Stage 1, bf16 parameters, fp32 gradient accumulation: the BF16_Optimizer, which refuses it
    # (runtime/engine.py, _do_optimizer_sanity_check).
    with pytest.raises(CaseError, match="stage 1 with bf16 parameters and fp32 gradient accumulation"):
        diagnose(FP32_GRADS_8, config=_write_config(tmp_path, {**base, "zero_optimization": {"stage": 1,
                 "compute_grad_norm": False}, "data_types": {"grad_accum_dtype": "fp32"}}))
    assert get_zero_config({"zero_optimization": True}).stage == 1
    result = diagnose(CASE_8, config=_write_config(tmp_path, {**base, "zero_optimization": True}))
    assert result.estimate.job.layout.zero_stage == 1
    assert any("deprecated form" in line for line in result.resolved + result.notes)
    result = diagnose(CASE_8, config=_write_config(tmp_path, {**base, "bf16": {"enabled": "true"},
                                                             "zero_optimization": {"stage": 2}}))
    assert result.estimate.job.training.precision == "bf16"


@pytest.mark.parametrize("extra, refused", [
    ({}, "gradient_clipping 1.0 (its default, where the file states none)"),
    ({"gradient_clipping": 0.5}, "gradient_clipping 0.5: it requires gradient_clipping 0"),
    ({"gradient_clipping": 0, "zero_optimization": {"stage": 2, "compute_grad_norm": False,
                                                    "offload_optimizer": {"device": "cpu"}}},
     "with the optimizer offloaded"),
    ({"gradient_clipping": 0}, None),
    ({"gradient_clipping": "auto"}, None),  # the Trainer's to fill: said in a note (below)
])
def test_compute_grad_norm_false_is_held_to_what_the_zero_optimizer_takes(tmp_path, extra, refused):
    """zero_optimization.compute_grad_norm false at stage 2 with gradient_clipping left at DeepSpeed's
    default 1.0 (or any clip above 0), or with the optimizer offloaded, was diagnosed, exit 0, where
    DeepSpeedZeroOptimizer.__init__ raises before the first step (deepspeed 0.19.8,
    runtime/zero/stage_1_and_2.py: "compute_grad_norm=false requires gradient_clipping=0", "does not
    support optimizer offload"); with clipping at 0 it runs."""
    import inspect

    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    source = inspect.getsource(DeepSpeedZeroOptimizer.__init__)
    assert "if not compute_grad_norm and clip_grad > 0.0:" in source
    assert "compute_grad_norm=false does not support optimizer offload" in source
    base = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
            "zero_optimization": {"stage": 2, "compute_grad_norm": False}}
    path = _write_config(tmp_path, {**base, **extra})
    if refused is None:
        result = diagnose(CASE_8, config=path)
        assert result.estimate.job.layout.zero_stage == 2
        # "auto" is the Hugging Face Trainer's --max_grad_norm, 1.0 by default (TrainingArguments): a note.
        said = [note for note in result.notes if "--max_grad_norm 0" in note]
        assert len(said) == (extra.get("gradient_clipping") == "auto"), result.notes
        return
    with pytest.raises(CaseError) as error:
        diagnose(CASE_8, config=path)
    assert error.value.key == "zero_optimization.compute_grad_norm" and refused in error.value.expected, str(error.value)


def test_a_micro_batch_option_is_held_to_the_one_deepspeed_derives_from_the_global_batch_alone(tmp_path,
                                                                                               monkeypatch):
    """train_batch_size alone: DeepSpeed runs one accumulation step of 64 / 8 = 8 a GPU
    (runtime/config.py, _set_batch_related_parameters); --micro-batch-size 2 was read as 2 x 4."""
    from deepspeed import comm as ds_comm
    from deepspeed.runtime.config import DeepSpeedConfig

    config = {"train_batch_size": 64, "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
    monkeypatch.setattr(ds_comm, "get_world_size", lambda group=None: 8)  # the 8 GPUs' data parallelism
    monkeypatch.setattr(ds_comm, "get_rank", lambda group=None: 0)
    parsed = DeepSpeedConfig(dict(config), mpu=None)
    assert (parsed.train_micro_batch_size_per_gpu, parsed.gradient_accumulation_steps) == (8, 1)
    path = _write_config(tmp_path, config)
    with pytest.raises(CaseError, match="differs from the micro-batch DeepSpeed derives"):
        diagnose(CASE_8, config=path, micro_batch_size=2)
    assert diagnose(CASE_8, config=path, micro_batch_size=8).estimate.job.layout.micro_batch_size == 8


def test_the_overlap_note_is_only_where_deepspeed_could_overlap(tmp_path):
    """A pipeline's engine turns overlap_comm off (engine.py) and reduces after the schedule; the
    BF16_Optimizer takes no overlap_comm: the estimate prices neither overlapped, and the note said the
    run "may step slower" than priced, the same step either way."""
    base = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}}
    bf16_optimizer = {**base, "zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "fp32"}}
    notes = diagnose(FP32_GRADS_8, config=_write_config(tmp_path, bf16_optimizer)).notes
    assert not [n for n in notes if "overlap_comm" in n]
    zero2 = {**base, "zero_optimization": {"stage": 2}}
    assert [n for n in diagnose(CASE_8, config=_write_config(tmp_path, zero2)).notes if "overlap_comm" in n]


def test_values_deepspeed_coerces_get_their_notes(tmp_path):
    """pydantic's lax mode takes "false" for False and 8.0 for 8: read so, their notes were lost."""
    for changes, said in [({"zero_optimization.overlap_comm": "false"}, "overlap_comm false"),
                          ({"zero_optimization.zero_quantized_weights": "yes"}, "zero_quantized_weights: not priced"),
                          ({"compile": {"deepcompile": "true"}}, "compile.deepcompile: not priced")]:
        config, _ = _ds_config(tmp_path, **changes)
        assert any(said in n for n in diagnose(DS_CASE, config=config).notes), changes


def test_the_offload_keys_are_deepspeeds():
    from deepspeed.runtime.zero.offload_config import (DeepSpeedZeroOffloadOptimizerConfig,
                                                       DeepSpeedZeroOffloadParamConfig)
    from planner.engines.deepspeed.read import OFFLOAD_KEYS

    for name, model in (("offload_optimizer", DeepSpeedZeroOffloadOptimizerConfig),
                        ("offload_param", DeepSpeedZeroOffloadParamConfig)):
        fields = {n for n in model.model_fields} | {f.alias for f in model.model_fields.values() if f.alias}
        assert set(OFFLOAD_KEYS[name]) == fields


def test_an_autotp_size_against_the_cases_pipeline_tp_names_the_case_not_an_option(tmp_path):
    """A ds_config with AutoTP 4 read for a case whose layout says tp 2 on 2 pipeline stages:
    "autotp_size: 4 differs from --tp 2", an option the user never gave."""
    case = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "deepspeed"},
            "layout": {"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 1, "zero_stage": 1}}
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
                                  "tensor_parallel": {"autotp_size": 4}, "bf16": {"enabled": True}}))
    with pytest.raises(CaseError, match=r"tensor_parallel.autotp_size: 4 differs from the case's layout.tp 2"):
        diagnose(case, config=config)
    with pytest.raises(CaseError, match=r"tensor_parallel.autotp_size: 4 differs from --tp 2"):
        diagnose(case, config=config, tp=2)


def test_a_config_of_many_unknown_keys_is_read_quickly_and_said_so(tmp_path):
    """Each unknown top-level key was checked for a misspelling against every DeepSpeed key: a config
    of 100,000 made-up keys kept diagnose busy past 30 s. The first thousand are checked, the rest said."""
    import time

    from planner.engines.deepspeed.read import MAX_KEYS_CHECKED, misspelled_keys

    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"trian_batch_size": 8, **{f"made_up_key_{i}": "x" for i in range(5_000)}}))
    started = time.perf_counter()
    notes = misspelled_keys(path)
    assert time.perf_counter() - started < 5
    assert any("trian_batch_size is no DeepSpeed key (did you mean train_batch_size?)" in n for n in notes)
    assert any("5,001 top-level keys are no DeepSpeed key" in n and f"first {MAX_KEYS_CHECKED:,}" in n for n in notes)


def test_the_bf16_optimizer_of_a_pipeline_at_zero_0_holds_its_flat_bf16_accumulator(tmp_path, monkeypatch):
    """A pipeline's bf16 at ZeRO 0 (Megatron-DeepSpeed's llama configs) runs DeepSpeed's BF16_Optimizer
    (runtime/engine.py), read as ZeRO-1 for its sharded states but priced with ZeRO's 1 GB reduction
    bucket, which it does not have, and without the flat bf16 buffer of every gradient it keeps
    (built here by DeepSpeed's own BF16_Optimizer: bf16, the stage's every parameter): 5.5 GB under
    for a 13B model at tp 2, pp 2."""
    import types

    import torch
    import deepspeed.comm as ds_comm
    import deepspeed.runtime.bf16_optimizer as bf16_optimizer

    monkeypatch.setattr(ds_comm, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_comm, "get_world_size", lambda *a, **k: 1)
    weight = torch.nn.Parameter(torch.zeros(1000, dtype=torch.bfloat16))
    built = bf16_optimizer.BF16_Optimizer(torch.optim.Adam([weight]), param_names={weight: "w"},
                                          bfloat16_config=types.SimpleNamespace(enabled=True,
                                                                                immediate_grad_update=False),
                                          grad_acc_dtype=torch.bfloat16)
    flat, = built.fp32_groups_gradients_flat
    assert flat.dtype == torch.bfloat16 and flat.numel() == weight.numel()  # 2 bytes, whole on the rank

    from cost_models.memory import job_stage_parameters, reduce_bucket_bytes

    case = {"model": {"preset": "llama2-13b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
            "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "deepspeed"}}
    def config(stage: int):
        path = tmp_path / f"ds_config_{stage}.json"
        path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16,
                                    "zero_optimization": {"stage": stage}, "bf16": {"enabled": True}}))
        return path
    pipeline = diagnose(case, config=config(0), pp=2, tp=2).estimate
    zero1 = diagnose(case, config=config(1), pp=2, tp=2).estimate  # DeepSpeed's ZeRO-1 optimizer
    assert pipeline.job.layout.zero_stage == zero1.job.layout.zero_stage == 1
    assert reduce_bucket_bytes(pipeline.job) == 0 and reduce_bucket_bytes(zero1.job) == pytest.approx(5e8 * 2)
    for stage in range(2):
        params = job_stage_parameters(pipeline.job, stage).total
        # autograd's bf16 gradients and the flat bf16 buffer beside them; ZeRO-1's the first alone
        assert pipeline.stages[stage].gradients == pytest.approx(2 * params + 2 * params)
        assert zero1.stages[stage].gradients == pytest.approx(2 * params)
    assert pipeline.peak.total - zero1.peak.total > 5e9


def test_a_reduce_bucket_that_alone_makes_the_config_slower_is_the_change_named(tmp_path):
    """A Hugging Face Trainer's ZeRO-1 config with "auto" reduce_bucket_size (hidden², 4M elements for
    Qwen3-30B-A3B) in the planner's best layout was 1.12× slower than the best, priced with the 5e8 its
    own files write: the report said "worth the change" and no change, `differs_from_best` empty.
    (On 64 GPUs that was with the after-step gather priced per reduce bucket too; DeepSpeed gathers
    per parameter group, runtime/utils.py all_gather_dp_groups, and the reduce-scatters' latency alone
    makes it 1.04×, inside the plan's margin. On 128, two micro-batches a step: 1.15×, and 1.07× once
    ZeRO-1's buckets were priced as the all-reduces DeepSpeed runs, whose bytes weigh more beside the
    buckets' latency. On 256 GPUs, two micro-batches a step: 1.087×, beyond the 7.9 % margin.)"""
    case = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 256},
            "training": {"global_batch_size": 512, "seq_len": 4096, "engine": "deepspeed"}}
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                                  "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"},
                                  "zero_optimization": {"stage": 1, "overlap_comm": True,
                                                        "contiguous_gradients": True,
                                                        "reduce_bucket_size": "auto"}}))
    result = planner.diagnose(case, "deepspeed", config, micro_batch_size=1, ep=8)
    assert result.plan.differences(result.estimate) == {}  # the layout is the best's
    assert result.speedup > 1 + result.plan.margin
    assert result.differences() == {"reduce_bucket_size": [500_000_000, 2048 * 2048]}
    assert result.to_dict()["differs_from_best"] == {"reduce_bucket_size": [500_000_000, 2048 * 2048]}
    (tmp_path / "case.yaml").write_text(json.dumps(case))
    done = subprocess.run([sys.executable, "-m", "planner", "diagnose", str(tmp_path / "case.yaml"), "--config",
                           str(config), "--micro-batch-size", "1", "--ep", "8"], capture_output=True, text=True,
                          timeout=300)
    assert "change: reduce_bucket_size 4194304→500000000" in done.stdout.replace("\n", " "), done.stdout


# A Hugging Face Trainer's ZeRO-2 ds_config with the optimizer offloaded, for Mixtral 8x7B on 64 H100s.
TRAINER_Z2 = {"bf16": {"enabled": "auto"}, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
              "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                    "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": "auto",
                                    "allgather_bucket_size": 5e8},
              "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
              "train_micro_batch_size_per_gpu": "auto"}
MIXTRAL_CASE = {"model": {"preset": "mixtral-8x7b"},
                "cluster": {"gpu": "h100", "num_gpus": 64, "fabric": "infiniband-ndr"},
                "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "bf16", "optimizer": "adamw",
                             "engine": "deepspeed"}}


@pytest.mark.parametrize("recompute, together", [("full", False), (None, True)])
def test_the_cheapest_next_change_of_a_config_that_does_not_fit_fits(tmp_path, recompute, together):
    """A ZeRO-2 Mixtral with its optimizer offloaded holds 93 GB of parameters a GPU: no micro-batch,
    recomputation or ZeRO stage DeepSpeed-MoE runs (ZeRO-3 refuses it) shards them, and the advice was
    "cheapest next change: micro_batch_size 1 → peak 96.8 GB, still does not fit". Expert parallelism
    does; where no single change fits, the fewest that fit together are said as such. Estimated as
    advised, the config fits."""
    import io

    from rich.console import Console

    from planner.estimate import estimate_job
    from planner.report import print_diagnosis

    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(TRAINER_Z2))
    found = diagnose(MIXTRAL_CASE, config=config, micro_batch_size=2, recompute=recompute)
    est = found.estimate
    assert est.memory_verdict == "does not fit"
    remedy = est.remedy()
    assert remedy is not None and remedy.fits and remedy.layout.ep > 1
    assert bool(remedy.together) is together
    advised = estimate_job(est.case, est.job.with_layout(remedy.layout))
    assert advised.fits and advised.peak.total == pytest.approx(remedy.peak_bytes)
    out = io.StringIO()
    print_diagnosis(found, Console(file=out, width=10_000))
    said = out.getvalue()
    head = "no single change fits; the fewest that fit together (2): " if together else "cheapest next change: ep 2"
    assert head in said and "still does not fit" not in said, said


def test_a_deepspeed_change_no_ds_config_key_makes_says_what_it_takes(tmp_path):
    """`ep 1→8` for a Trainer's Mixtral config read as a key to flip: DeepSpeed's expert parallelism is
    the model's MoE blocks rebuilt as deepspeed.moe.layer.MoE (ep_size), which no ds_config key sets."""
    import io

    from rich.console import Console

    from planner.report import print_diagnosis

    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(TRAINER_Z2))
    found = diagnose(MIXTRAL_CASE, config=config, micro_batch_size=2)
    assert found.differences()["ep"] == [8, 1]
    out = io.StringIO()
    print_diagnosis(found, Console(file=out, width=10_000))
    change = next(line for line in out.getvalue().splitlines() if line.startswith("change: "))
    assert ("ep 1→8 (no ds_config key: the model's MoE blocks rebuilt as DeepSpeed-MoE's "
            "deepspeed.moe.layer.MoE(ep_size=8); a Hugging Face model's own MoE blocks do not shard experts)") \
        in change, change
    assert "zero_stage 2→1," in change  # a key's change is said as is


def test_diagnose_json_says_what_a_change_no_ds_config_key_makes_takes(tmp_path):
    """The report says beside `ep 1→8` that no ds_config key makes it (DeepSpeed's expert parallelism is
    the model's MoE blocks rebuilt as deepspeed.moe.layer.MoE(ep_size=8)), in the change line and in the
    config's cheapest next change; `diagnose --json` and `estimate --json` gave the change alone, which a
    script would apply as a key to flip. A Trainer's ZeRO-2 Mixtral at micro-batch 2 does not fit, and
    only expert parallelism shards the 93 GB of parameters it holds a GPU."""
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(TRAINER_Z2))
    printed = json.loads(json.dumps(diagnose(MIXTRAL_CASE, config=config, micro_batch_size=2).to_dict()))
    assert printed["differs_from_best"]["ep"] == [8, 1]
    assert printed["takes"]["ep"].startswith("no ds_config key: the model's MoE blocks rebuilt as DeepSpeed-MoE's "
                                             "deepspeed.moe.layer.MoE(ep_size=8)")
    assert "zero_stage" in printed["differs_from_best"] and "zero_stage" not in printed["takes"]  # a key of it
    change = printed["config"]["cheapest_change"]
    assert change["fits"] and change["layout"]["ep"] > 1
    assert f"deepspeed.moe.layer.MoE(ep_size={change['layout']['ep']})" in change["takes"]["ep"]


def test_zero3_live_parameters_and_sub_group_are_priced_as_the_config_sets_them(tmp_path):
    """DeepSpeedZeroConfig's max_live_parameters (alias stage3_max_live_parameters) caps the weights ZeRO-3
    keeps gathered, and sub_group_size the partition its step copies to fp32 at once (runtime/zero/config.py:
    1e9 each by default). Both were priced at 1e9 whatever the config said: 1e11 live parameters, which keep
    an 8B model's every weight gathered (16 GB a GPU in bf16), read the same as 1e9 (3 GB)."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16", "engine": "deepspeed"}}

    def estimate(**zero):
        config = tmp_path / "ds_config.json"
        config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
                                      "bf16": {"enabled": True},
                                      "zero_optimization": {"stage": 3, "overlap_comm": True, **zero}}))
        return planner.diagnose(case, "deepspeed", config).estimate

    def peak(**zero):
        return estimate(**zero).peak.total

    default = peak()
    assert peak(stage3_max_live_parameters=1e9, sub_group_size="auto") == pytest.approx(default)
    assert peak(stage3_max_live_parameters=1e11) - default == pytest.approx(2 * (8.03e9 - 1e9 - 0.525e9), rel=0.01)
    assert peak(max_live_parameters=1e11) == pytest.approx(peak(stage3_max_live_parameters=1e11))
    assert estimate(sub_group_size=1e8).job.training.engine.zero3_step_sub_group_params == 1e8
    assert estimate().job.training.engine.zero3_step_sub_group_params == 1e9
    # The step's fp32 gradient copy, 6 bytes a parameter of one sub-group (stage3.py): a sub-group closes
    # once its partitions reach sub_group_size (_create_fp16_sub_groups), so it holds up to one parameter's
    # partition past it, on the first stage the embedding's (128,256 × 4,096 over 8 ranks); at 0, that alone.
    from cost_models.memory import step_gradient_copy_bytes
    embedding = 128_256 * 4096 / 8
    for size, copied in ((0, embedding), (1e8, 1e8 + embedding)):
        job = estimate(sub_group_size=size).job
        assert step_gradient_copy_bytes(job, 0) == pytest.approx(6 * copied, rel=1e-9)
    with pytest.raises(CaseError, match="zero_optimization.stage3_max_live_parameters"):
        peak(stage3_max_live_parameters=-1)


@pytest.mark.parametrize("fp16", [{"enabled": True, "fp16_master_weights_and_grads": True},
                                  {"enabled": True, "fp16_master_weights_and_grads": "true"}])
def test_fp16_master_weights_and_grads_is_refused_naming_it(tmp_path, fp16):
    """DeepSpeedFP16Config.fp16_master_weights_and_grads (runtime/precision_config.py) keeps the ZeRO
    optimizer's master partition and gradients in fp16 (runtime/base_optimizer.py,
    _configure_master_weights): read as the fp32 master weights a case prices, it went unsaid."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "fp16", "engine": "deepspeed"}}
    config = tmp_path / "ds_config.json"
    zero = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
                                  "optimizer": {"type": "AdamW"}, "fp16": fp16, "zero_optimization": zero}))
    with pytest.raises(CaseError, match="fp16.fp16_master_weights_and_grads"):
        planner.diagnose(case, "deepspeed", config)
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
                                  "optimizer": {"type": "AdamW"}, "zero_optimization": zero,
                                  "fp16": {**fp16, "fp16_master_weights_and_grads": "auto"}}))
    planner.diagnose(case, "deepspeed", config)  # "auto": DeepSpeed's default, false


@pytest.mark.parametrize("enabled", [True, "false"])  # DeepSpeed tests the value's truth: the string turns it on
def test_torch_autocast_is_refused_naming_it_where_it_was_priced_as_fp32(tmp_path, enabled):
    """DeepSpeed's torch_autocast section runs forward and backward under torch.autocast
    (runtime/engine.py: init_autocast_params where torch_autocast_enabled(); runtime/torch_autocast.py):
    fp32 weights beside low-precision GEMMs. Against an fp32 case the config read as fp32 throughout,
    its GEMMs priced at fp32's rate, nothing said."""
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "fp32", "engine": "deepspeed"}}
    config = tmp_path / "ds_config.json"
    body = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8, "optimizer": {"type": "AdamW"},
            "zero_optimization": {"stage": 3}}
    config.write_text(json.dumps({**body, "torch_autocast": {"enabled": enabled, "dtype": "bfloat16"}}))
    with pytest.raises(CaseError, match="torch_autocast.enabled"):
        planner.diagnose(case, "deepspeed", config)
    config.write_text(json.dumps({**body, "torch_autocast": {"enabled": False}}))
    planner.diagnose(case, "deepspeed", config)


def test_the_lax_readers_take_what_pydantic_takes_and_refuse_what_it_refuses():
    """DeepSpeed's config models read their bool, int and float fields in pydantic's lax mode (runtime/
    config_utils.py, DeepSpeedConfigModel): each reader is held to pydantic itself, value by value."""
    from pydantic import TypeAdapter, ValidationError

    from planner.engines.deepspeed.read import _lax_bool, _lax_float, _lax_int

    values = [True, False, 0, 1, 2, -3, 0.0, 1.0, 3.0, 3.5, 1e18, 1e20, float("nan"), float("inf"), "1", "0", "2",
              "true", "TRUE", "False", " true ", "yes", "no", "on", "off", "t", "f", "y", "n", "", "3", " 3 ", "+3",
              "-0", "03", "3.0", "3.00", "3.", "3.5", "1e9", "1_000", "_1", "1__0", "0x3", "٣", "1.0", " 1.5 ",
              "inf", "nan", None, [1], {}]
    readers = ((bool, lambda v: _lax_bool("f", "k", v)), (int, lambda v: _lax_int("f", "k", v, -2**63)),
               (float, lambda v: _lax_float("f", "k", v)))
    differ = []
    for kind, reader in readers:
        for value in values:
            try:
                wanted = TypeAdapter(kind).validate_python(value)
            except ValidationError:
                wanted = "refused"
            try:
                got = reader(value)
            except CaseError:
                got = "refused"
            if repr(got) != repr(wanted) or type(got) is not type(wanted):
                differ.append((kind.__name__, value, got, wanted))
    assert not differ


_BATCH = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}}


@pytest.mark.parametrize("stage, zero", [("3", 3), (3.0, 3), (True, 1), (" 2 ", 2), ("1.0", 1), ("auto", 0)])
def test_a_zero_stage_deepspeed_coerces_is_read_as_the_stage_it_runs(tmp_path, stage, zero):
    """zero_optimization.stage is an int enum to DeepSpeed (ZeroStageEnum, runtime/zero/config.py), read in
    pydantic's lax mode: "3" is stage 3, true stage 1. They were refused as "expected an integer"."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    assert DeepSpeedZeroConfig(stage=stage).stage == zero
    config = _write_config(tmp_path, {**_BATCH, "zero_optimization": {"stage": stage}})
    assert diagnose(CASE_8, config=config).estimate.job.layout.zero_stage == zero


@pytest.mark.parametrize("stage", [2.5, "3.5", 4, -1, "1e0", None])
def test_a_zero_stage_deepspeed_refuses_is_refused_naming_it(tmp_path, stage):
    from pydantic import ValidationError
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    with pytest.raises(ValidationError):
        DeepSpeedZeroConfig(stage=stage)
    with pytest.raises(CaseError) as error:
        diagnose(CASE_8, config=_write_config(tmp_path, {**_BATCH, "zero_optimization": {"stage": stage}}))
    assert error.value.key == "zero_optimization.stage"


def test_string_booleans_deepspeeds_bool_fields_take_are_read_as_it_reads_them(tmp_path):
    """cpu_offload (DeepSpeedZeroConfig, Optional[bool]) and bf16_master_weights_and_grads
    (DeepSpeedBF16Config, bool) in pydantic's lax mode: "true" is true. Both were refused as not a bool."""
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    assert DeepSpeedZeroConfig(stage=2, cpu_offload="true").offload_optimizer.device == "cpu"
    assert DeepSpeedZeroConfig(stage=2, cpu_offload="false").offload_optimizer is None
    for said, offload in (("true", 1.0), ("false", 0.0)):
        config = _write_config(tmp_path, {**_BATCH, "zero_optimization": {"stage": 2, "cpu_offload": said}})
        assert diagnose(CASE_8, config=config).estimate.job.layout.offload_optimizer == offload
    assert DeepSpeedBF16Config(enabled=True, bf16_master_weights_and_grads="true").bf16_master_weights_and_grads
    bf16_master = {**CASE_8, "training": {**CASE_8["training"], "master_weights": False}}
    config = _write_config(tmp_path, {**_BATCH, "zero_optimization": {"stage": 2}, "bf16": {
        "enabled": True, "bf16_master_weights_and_grads": "true", "bf16_optimizer_states": "true"}})
    assert diagnose(bf16_master, config=config).estimate.job.training.master_weights is False
    with pytest.raises(CaseError) as error:
        diagnose(bf16_master, config=_write_config(tmp_path, {**_BATCH, "bf16": {
            "enabled": True, "bf16_master_weights_and_grads": "maybe"}}))
    assert error.value.key == "bf16.bf16_master_weights_and_grads"


@pytest.mark.parametrize("ratio, refused", [("1.0", None), (1, None), ("auto", None), (0.5, "partial offload"),
                                            ("1.5", "from 0.0 to 1.0"), ("all", "expected a number")])
def test_an_offload_ratio_is_read_as_deepspeeds_float_field(tmp_path, ratio, refused):
    """offload_optimizer.ratio "1.0" is a full offload to DeepSpeed (a float field, pydantic's lax mode,
    runtime/zero/offload_config.py); it was refused as a partial one."""
    from pydantic import ValidationError
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig

    zero = {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": ratio}}
    config = _write_config(tmp_path, {**_BATCH, "zero_optimization": zero})
    if refused is None or refused == "partial offload":
        assert DeepSpeedZeroOffloadOptimizerConfig(device="cpu", ratio=ratio).ratio == (0.5 if refused else 1.0)
    else:
        with pytest.raises(ValidationError):
            DeepSpeedZeroOffloadOptimizerConfig(device="cpu", ratio=ratio)
    if refused is None:
        assert diagnose(CASE_8, config=config).estimate.job.layout.offload_optimizer == 1.0
    else:
        with pytest.raises(CaseError) as error:
            diagnose(CASE_8, config=config)
        assert error.value.key == "zero_optimization.offload_optimizer.ratio" and refused in error.value.expected


@pytest.mark.parametrize("said", [True, "false", 1, "no"])
def test_activation_checkpointing_keys_deepspeed_tests_for_truth_are_said_when_true_to_it(tmp_path, said):
    """activation_checkpointing's keys are read raw (get_scalar_param) and tested for their truth
    (activation_checkpointing/checkpointing.py): "false" partitions the activations; it had no note."""
    from deepspeed.runtime.activation_checkpointing.config import DeepSpeedActivationCheckpointingConfig

    assert DeepSpeedActivationCheckpointingConfig({"activation_checkpointing": {
        "partition_activations": said}}).partition_activations
    config = _write_config(tmp_path, {**_BATCH, "zero_optimization": {"stage": 2},
                                      "activation_checkpointing": {"partition_activations": said}})
    notes = diagnose(CASE_8, config=config).notes
    assert any("activation_checkpointing.partition_activations" in n and "not priced" in n for n in notes)


def test_a_ds_config_file_is_read_as_deepspeeds_hjson_reads_it(tmp_path, monkeypatch):
    """DeepSpeed reads its config file with hjson (runtime/config.py, DeepSpeedConfig), which reads 4.0 as 4
    (hjson/decoder.py) and takes comments, trailing commas and unquoted keys: such files were refused as
    "expected an integer" and "expected valid JSON"."""
    import hjson

    text = ('{\n  // the Llama 3 8B run\n  train_batch_size: 64,\n  "train_micro_batch_size_per_gpu": 2.0,\n'
            '  "bf16": {"enabled": true},\n  "zero_optimization": {"stage": 2,},\n}\n')
    assert hjson.loads(text)["train_micro_batch_size_per_gpu"] == 2
    assert hjson.loads('{"a": 8.0}')["a"] == 8 and type(hjson.loads('{"a": 8.0}')["a"]) is int
    path = tmp_path / "ds_config.hjson.json"
    path.write_text(text)
    layout = diagnose(CASE_8, config=path).estimate.job.layout
    assert (layout.micro_batch_size, layout.zero_stage) == (2, 2)
    floats = _write_config(tmp_path, {**_BATCH, "train_micro_batch_size_per_gpu": 2.0,
                                      "gradient_accumulation_steps": 4.0, "zero_optimization": {"stage": 2}})
    assert diagnose(CASE_8, config=floats).estimate.job.grad_accum == 4
    monkeypatch.setitem(sys.modules, "hjson", None)  # where hjson is not installed
    with pytest.raises(CaseError, match="install hjson") as error:
        diagnose(CASE_8, config=path)
    assert "line 2" in error.value.expected


_BASE_8 = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}}


@pytest.mark.parametrize("zero, key", [
    ({"stage": 3, "stage3_max_live_parameters": 5, "max_live_parameters": 10**10}, "max_live_parameters"),
    ({"stage": 3, "prefetch_bucket_size": 7, "stage3_prefetch_bucket_size": 5}, "prefetch_bucket_size"),
    ({"stage": 2, "cpu_offload": False, "offload_optimizer": {"device": "cpu"}}, "cpu_offload"),
    ({"stage": 2, "cpu_offload": True, "offload_optimizer": None}, "cpu_offload"),
    ({"stage": 3, "cpu_offload_param": True, "offload_param": {"device": "none"}}, "cpu_offload_param"),
])
def test_one_zero_field_given_by_both_its_keys_is_refused_as_deepspeed_refuses_it(tmp_path, zero, key):
    """A field and its alias (pydantic: the second an extra input), or a deprecated key beside its
    replacement (DeepSpeedConfigModel's assertion): DeepSpeed does not start; the file was priced
    with one of the two (max_live_parameters 1e10 where stage3_max_live_parameters said 5)."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    with pytest.raises(Exception):
        DeepSpeedZeroConfig(**zero)
    with pytest.raises(CaseError) as error:
        diagnose(CASE_8, config=_write_config(tmp_path, {**_BASE_8, "zero_optimization": zero}))
    assert error.value.key == f"zero_optimization.{key}", str(error.value)
    # One of the two "auto": DeepSpeed drops it and takes the other.
    live = {"stage": 3, "max_live_parameters": 7, "stage3_max_live_parameters": "auto"}
    assert DeepSpeedZeroConfig(**live).max_live_parameters == 7
    result = diagnose(CASE_8, config=_write_config(tmp_path, {**_BASE_8, "zero_optimization": live}))
    assert result.estimate.job.training.engine.zero3_max_live_parameters == 7


def test_an_auto_deepspeed_drops_runs_its_default(tmp_path):
    """DeepSpeedConfigModel drops a field's "auto" (runtime/config_utils.py), in zero_optimization and its
    offload sections alike: contiguous_gradients, pin_memory and cpu_offload "auto" run their
    defaults, and were refused as values "DeepSpeed's config refuses"."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    zero = {"stage": 2, "contiguous_gradients": "auto", "cpu_offload": "auto",
            "offload_optimizer": {"device": "cpu", "pin_memory": "auto"}}
    parsed = DeepSpeedZeroConfig(**zero)
    assert parsed.contiguous_gradients and parsed.offload_optimizer.pin_memory
    result = diagnose(CASE_8, config=_write_config(tmp_path, {**_BASE_8, "zero_optimization": zero}))
    assert result.estimate.job.layout.offload_optimizer == 1.0
    assert not [n for n in result.notes if "pin_memory" in n]


def test_the_compile_section_is_deepspeeds_compile_config(tmp_path):
    """DeepSpeed 0.19's CompileConfig has no "enabled" and forbids keys it does not define: a
    "compile": {"enabled": true} does not start (it was priced with a note, exit 0); deepcompile is the
    key that compiles, "auto" is dropped."""
    from deepspeed.compile.config import CompileConfig

    from planner.engines.deepspeed.read import COMPILE_KEYS

    assert set(COMPILE_KEYS) == set(CompileConfig.model_fields)
    with pytest.raises(Exception):
        CompileConfig(enabled=True)
    with pytest.raises(CaseError) as error:
        diagnose(CASE_8, config=_write_config(tmp_path, {**_BASE_8, "compile": {"enabled": True}}))
    assert error.value.key == "compile.enabled" and "CompileConfig" in error.value.expected
    assert not CompileConfig(deepcompile="auto").deepcompile
    notes = diagnose(CASE_8, config=_write_config(tmp_path, {**_BASE_8, "compile": {"deepcompile": "auto"}})).notes
    assert not [n for n in notes if "compile" in n]


def test_a_zero_size_past_the_planners_bound_is_refused_as_the_planners(tmp_path):
    """stage3_max_live_parameters 2^63, which DeepSpeed's int field takes, was refused as a value
    "DeepSpeed's config refuses"; it is the planner's bound that refuses it, and it says so."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from planner.limits import MAX_INT

    zero = {"stage": 3, "stage3_max_live_parameters": 2**63}
    assert DeepSpeedZeroConfig(**zero).max_live_parameters == 2**63 > MAX_INT
    with pytest.raises(CaseError) as error:
        diagnose(CASE_8, config=_write_config(tmp_path, {**_BASE_8, "zero_optimization": zero}))
    assert error.value.key == "zero_optimization.stage3_max_live_parameters"
    assert "the planner's bound" in error.value.expected and "DeepSpeed's config refuses" not in error.value.expected


QWEN3_ON_32 = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32},
               "training": {"global_batch_size": 256, "seq_len": 4096, "precision": "bf16"},
               "search": {"pp": 2}}


def _emitted_megatron_launch(case: dict, folder) -> tuple[list, Path]:
    """The files plan --emit megatron writes for ``case``'s best into ``folder``, and its argument list."""
    best = planner.plan(case, target="megatron").best
    files, _ = render(best, "megatron", "<generated>")
    written = write_all([Output(folder / name, text) for name, text in files.items()], force=False)
    return written, next(p for p in written if p.name == "megatron_args.txt")


def test_diagnose_says_what_estimate_and_plan_say_of_the_case(tmp_path):
    """An MoE case that leaves its routing unstated is priced with balanced routing: `estimate` and
    `plan` said so on stderr, `diagnose`, which prices the same case twice, said nothing."""
    case = QWEN3_ON_32
    written, args = _emitted_megatron_launch(case, tmp_path)
    notes = diagnose(case, megatron_args=args).notes
    assert any("model.moe_load_imbalance is unstated: priced with balanced routing" in note for note in notes)
    stated = {**case, "model": {**case["model"], "moe_load_imbalance": 1.0}}
    assert not any("moe_load_imbalance" in note for note in diagnose(stated, megatron_args=args).notes)


def test_a_launch_that_forces_balanced_routing_is_priced_so_and_not_asked_for_its_imbalance(tmp_path):
    """--moe-router-force-load-balancing replaces the router's logits by random ones (megatron-core 0.16
    router.py, TopKRouter.forward: ``apply_random_logits``; moe_utils.RandomSTE draws them ``normal_()``):
    every expert alike, the routing model.moe_load_imbalance 1 prices. diagnose told such a launch its
    imbalance was unstated and to state what its runs measure; a case that stated 1.3 was priced at 1.3,
    where the launch runs balanced."""
    case = QWEN3_ON_32
    written, args = _emitted_megatron_launch(case, tmp_path)
    # The planner plans real training: its files leave the benchmarking switch off.
    assert not any("force-load-balancing" in p.read_text() for p in written)
    plain = diagnose(case, megatron_args=args).notes
    assert any("model.moe_load_imbalance is unstated" in note for note in plain)
    assert not any("forces balanced routing" in note for note in plain)
    forced = tmp_path / "forced_args.txt"
    forced.write_text(args.read_text() + "--moe-router-force-load-balancing\n")
    notes = diagnose(case, megatron_args=forced).notes
    assert not any("moe_load_imbalance is unstated" in note for note in notes), notes
    said = [note for note in notes if "forces balanced routing" in note]
    assert len(said) == 1 and "--moe-router-force-load-balancing" in said[0] and "benchmark" in said[0]
    assert "model.moe_load_imbalance 1" in said[0] and "disagree" not in said[0]
    # A case that states a trained router's imbalance disagrees with the launch: priced as the launch runs
    # (balanced: the estimate of the case stated at 1), and said.
    skewed = {**case, "model": {**case["model"], "moe_load_imbalance": 1.3}}
    balanced = {**case, "model": {**case["model"], "moe_load_imbalance": 1.0}}
    run = diagnose(skewed, megatron_args=forced)
    assert run.estimate.step_time_s == diagnose(balanced, megatron_args=args).estimate.step_time_s
    assert run.estimate.step_time_s < diagnose(skewed, megatron_args=args).estimate.step_time_s
    said = [note for note in run.notes if "forces balanced routing" in note]
    assert len(said) == 1 and "model.moe_load_imbalance 1.3" in said[0] and "disagree" in said[0]


def test_differences_no_gain_asks_for_are_not_said_as_a_change(tmp_path):
    """Megatron-LM's files of `plan --fastest` for Mixtral 8x7B on 96 H200s (a global batch of 333, 3²·37):
    the robust pick is another layout, slower by less than the gap the model cannot tell apart. diagnose
    said "no change is worth making for speed", then "change: tp 2→8, ..." toward the slower layout. What
    differs is listed as that, and --json says no change is advised (a config that does not fit is still
    told "change:": test_a_deepspeed_change_no_ds_config_key_makes_says_what_it_takes)."""
    import io

    from rich.console import Console

    from planner.report import print_diagnosis

    case = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h200-sxm-141gb", "num_gpus": 96},
            "training": {"global_batch_size": 333, "seq_len": 8192, "precision": "bf16", "engine": "megatron"}}
    fastest = planner.plan(case, fastest=True)
    planner.emit(fastest, "megatron", tmp_path / "fastest")
    found = planner.diagnose(case, "megatron", tmp_path / "fastest" / "megatron_args.txt")
    assert found.differences() and 1 - found.plan.margin <= found.speedup < 1  # faster, within the gap
    assert "no change is worth making" in found.verdict and not found.to_dict()["change_advised"]
    out = io.StringIO()
    print_diagnosis(found, Console(file=out, width=10_000))
    lines = out.getvalue().splitlines()
    assert not any(line.startswith("change: ") for line in lines)
    assert any(line.startswith("differs from the planner's best: tp ") for line in lines)


def test_json_says_what_would_fit_where_the_planner_finds_nothing(tmp_path):
    """Llama 3.1 405B on eight A100s of 40 GB under DeepSpeed, all offloaded: the report says in the best's
    place that no layout fits and how many GPUs would; diagnose --json said only "best": null. It carries
    plan --json's no_fit."""
    case = {"model": {"preset": "llama3.1-405b"}, "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 8},
            "training": {"global_batch_size": 8, "seq_len": 8192, "precision": "bf16", "engine": "deepspeed"}}
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                                  "bf16": {"enabled": True},
                                  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                                        "offload_param": {"device": "cpu"}}}))
    found = planner.diagnose(case, "deepspeed", config, recompute="full").to_dict()
    planned = planner.plan(case).to_dict()
    assert found["best"] is None and planned["best"] is None
    assert found["no_fit"] == planned["no_fit"] and found["no_fit"]["gpus_that_fit"] > 8


@pytest.mark.parametrize("section, written, meant", [("bf16", {"enabled": True, "enable": True}, "enabled"),
                                                     ("fp16", {"enabled": False, "loss_scal": 0}, "loss_scale"),
                                                     ("tensor_parallel", {"autotp_sise": 1}, "autotp_size")])
def test_a_misspelled_key_in_a_section_deepspeed_validates_is_refused_as_deepspeed_refuses_it(tmp_path, section,
                                                                                               written, meant):
    """bf16, fp16 and tensor_parallel are pydantic models that forbid extra fields (runtime/config_utils.py,
    DeepSpeedConfigModel; runtime/precision_config.py, runtime/tensor_parallel/config.py): DeepSpeed refuses
    bf16's "enable" and the launch does not start, where diagnose priced the config with exit 0. An "auto"
    DeepSpeedConfigModel drops before reading, so both take it."""
    from pydantic import ValidationError

    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig

    model = {"bf16": DeepSpeedBF16Config, "fp16": DeepSpeedFP16Config, "tensor_parallel": TPTrainingConfig}[section]
    typo = next(k for k in written if k not in ("enabled",) or section == "tensor_parallel")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        model(**written)
    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
              "bf16": {"enabled": True}}
    with pytest.raises(CaseError) as error:
        diagnose(CASE_8, config=_write_config(tmp_path, {**config, section: {**config.get(section, {}), **written}}),
                 recompute="full")
    assert error.value.key == f"{section}.{typo}" and f"did you mean {meant}?" in error.value.expected
    model(**{typo: "auto"})
    diagnose(CASE_8, config=_write_config(tmp_path, {**config, section: {**config.get(section, {}), typo: "auto"}}),
             recompute="full")


def test_the_section_keys_are_deepspeeds():
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig
    from planner.engines.deepspeed.read import SECTION_KEYS

    for name, model in (("fp16", DeepSpeedFP16Config), ("bf16", DeepSpeedBF16Config),
                        ("tensor_parallel", TPTrainingConfig)):
        fields = {n for n in model.model_fields} | {f.alias for f in model.model_fields.values() if f.alias}
        assert set(SECTION_KEYS[name]) == fields


def test_zero3_with_overlap_comm_off_is_said_to_gather_and_reduce_on_the_compute_stream(tmp_path):
    """ZeRO-3 overlaps unless the file says false (zero/config.py, overlap_comm_valid); off, DeepSpeed
    gathers the weights and reduce-scatters the gradients on the default stream (zero/parameter_offload.py,
    the allgather stream; zero/stage3.py, reduce_and_partition_stream), where the estimate prices them
    prefetched behind the compute: a ZeRO-3 file with overlap_comm false was priced as overlapped, and
    said nothing."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    assert DeepSpeedZeroConfig(stage=3).overlap_comm is True
    assert DeepSpeedZeroConfig(stage=3, overlap_comm=False).overlap_comm is False
    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 3}}
    said = "overlap_comm false: DeepSpeed's ZeRO-3 gathers the weights and reduce-scatters the gradients on the " \
           "compute stream"
    assert not [n for n in diagnose(CASE_8, config=_write_config(tmp_path, config), recompute="full").notes
                if "overlap_comm" in n]
    config["zero_optimization"]["overlap_comm"] = False
    assert [n for n in diagnose(CASE_8, config=_write_config(tmp_path, config), recompute="full").notes if said in n]


@pytest.mark.parametrize("key", ["stage3_param_persistence_threshold", "param_persistence_threshold"])
def test_a_persistence_threshold_that_keeps_weight_matrices_gathered_is_said(tmp_path, key):
    """DeepSpeed keeps every parameter of at most stage3_param_persistence_threshold elements gathered on
    every rank (zero/parameter_offload.py, mark_persistent_parameters): at 1e9 every weight of Llama 3 8B
    (the largest, the 128256 x 4096 embedding, is 525M elements), 16 GB a GPU unsharded, which the estimate
    priced sharded, saying nothing. DeepSpeed's default (1e5) and the Trainer's 10 x hidden keep norms only."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    assert DeepSpeedZeroConfig(stage=3, **{key: 10**9}).param_persistence_threshold == 10**9
    assert DeepSpeedZeroConfig(stage=3).param_persistence_threshold == 100_000
    assert 128256 * 4096 < 10**9
    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 3, key: 10 * 4096}}
    assert not [n for n in diagnose(CASE_8, config=_write_config(tmp_path, config), recompute="full").notes
                if "persistence" in n]
    config["zero_optimization"][key] = 10**9
    notes = diagnose(CASE_8, config=_write_config(tmp_path, config), recompute="full").notes
    assert [n for n in notes if n.startswith(f"zero_optimization.{key} 1,000,000,000: DeepSpeed keeps every parameter")]


@pytest.mark.parametrize("where, key", [("zero_optimization", "not_a_key"), ("zero_optimization", "replace_method"),
                                        ("offload_optimizer", "not_a_key"), ("offload_param", "not_a_key"),
                                        ("offload_optimizer", "replace_method"), ("bf16", "replace_method"),
                                        ("fp16", "replace_method"), ("tensor_parallel", "replace_method"),
                                        ("compile", "not_a_key"), ("compile", "replace_method")])
def test_an_unknown_key_set_to_auto_is_refused_exactly_where_deepspeed_refuses_it(tmp_path, where, key):
    """DeepSpeedConfigModel.__init__ drops every "auto", known key or not, except replace_method's
    (runtime/config_utils.py), before its pydantic model forbids extra fields: DeepSpeed starts with
    zero_optimization's "not_a_key": "auto" (and the Trainer, whose fill_match fills only known keys,
    leaves it), which diagnose refused; "replace_method": "auto" it keeps and refuses, which diagnose took
    in bf16, fp16 and tensor_parallel. diagnose's verdict is DeepSpeed 0.19's own, by its config classes."""
    from pydantic import ValidationError

    from deepspeed.runtime.config import CompileConfig
    from deepspeed.runtime.precision_config import get_bfloat16_config, get_float16_config
    from deepspeed.runtime.tensor_parallel.config import get_tensor_parallel_config
    from deepspeed.runtime.zero.config import get_zero_config

    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                    "offload_param": {"device": "cpu"}}}
    if where.startswith("offload"):
        config["zero_optimization"][where][key] = "auto"
    else:
        config[where] = {**config.get(where, {}), key: "auto"}
    try:
        get_zero_config(config), get_bfloat16_config(config), get_float16_config(config)
        get_tensor_parallel_config(config), CompileConfig(**config.get("compile", {}))
        deepspeed_starts = True
    except ValidationError:
        deepspeed_starts = False
    assert deepspeed_starts is (key != "replace_method")
    try:
        diagnose(CASE_8, config=_write_config(tmp_path, config), recompute="full")
        diagnose_takes = True
    except CaseError as error:
        assert error.key.endswith(f"{where}.{key}") and "unknown key" in error.expected
        diagnose_takes = False
    assert diagnose_takes is deepspeed_starts


@pytest.mark.parametrize("key", ["stage3_max_reuse_distance", "max_reuse_distance"])
def test_a_reuse_distance_that_regathers_recomputed_layers_for_their_backward_is_priced(tmp_path, key):
    """DeepSpeed releases a submodule's gathered weights unless the modules traced before their next use
    hold fewer than max_reuse_distance elements (zero/partitioned_param_coordinator.py, __params_to_release):
    under full recomputation a layer's recompute forward and backward lie up to twice its weights apart, so
    at 0 the backward gathers every weight of Llama 3 8B's 32 layers a second time (4096 x (2 x 4096 + 2 x 1024)
    + 3 x 4096 x 14336 each, its norms kept whole), and at DeepSpeed's default, 1e9, none: its first
    projection, W_Q, has 2 x 201,326,592 after it, under 1e9. The file's distance was read as 1e9 whatever it said."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from cost_models.dp_time import regathered_parameters

    assert DeepSpeedZeroConfig(stage=3).max_reuse_distance == 10**9
    assert DeepSpeedZeroConfig(stage=3, **{key: 0}).max_reuse_distance == 0
    layer = 4096 * (2 * 4096 + 2 * 1024) + 3 * 4096 * 14336
    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 3}}

    def diagnosed(distance, recompute="full"):
        if distance is not None:
            config["zero_optimization"][key] = distance
        return diagnose(CASE_8, config=_write_config(tmp_path, config), recompute=recompute).estimate

    default, zero = diagnosed(None), diagnosed(0)
    assert regathered_parameters(default.job, 0) == 0
    assert regathered_parameters(zero.job, 0) == 32 * layer
    assert zero.time.dp_comm_s > default.time.dp_comm_s
    assert regathered_parameters(diagnosed(0, recompute="none").job, 0) == 0


def test_deepspeeds_default_reuse_distance_regathers_a_70b_layers_attention():
    """At DeepSpeed's default max_reuse_distance, 1e9, Llama 3 70B's layer (8192 hidden, 28672 FFN, 64 heads and
    8 KV heads of 128) keeps its MLP gathered from its recompute to its backward (W_gate has 2 x 2 x 8192 x 28672
    = 939,524,096 after it, under 1e9) and gathers its attention again (W_O has 2 x 3 x 8192 x 28672 after it):
    8192 x (8192 + 1024 + 1024) + 8192 x 8192 a layer. FSDP keeps its unit gathered: none."""
    from cost_models.dp_time import regathered_parameters

    case = {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16", "optimizer": "adam",
                         "engine": "deepspeed"},
            "layout": {"dp": 64, "tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 3, "recompute": "full"}}
    assert regathered_parameters(planner.estimate(case).job, 0) == 80 * 8192 * (8192 + 1024 + 1024 + 8192)
    case["training"]["engine"] = "torchtitan"
    assert regathered_parameters(planner.estimate(case).job, 0) == 0


@pytest.mark.parametrize("stage, where, value, said", [
    (2, "zero_optimization.reduce_scatter", False, "reduce_scatter true while use_multi_rank_bucket_allreduce is "
                                                   "true (its default): the same traffic either way"),
    (1, "zero_optimization.reduce_scatter", False, "zero_optimization.reduce_scatter false: DeepSpeed all-reduces"),
    (2, "zero_optimization.use_multi_rank_bucket_allreduce", False, "zero_optimization.use_multi_rank_bucket_allreduce "
                                                                    "false: DeepSpeed reduces each gradient bucket's "
                                                                    "slices to their owners, one reduce call per"),
    (2, "zero_optimization.round_robin_gradients", True, "zero_optimization.round_robin_gradients true: DeepSpeed "
                                                         "reorders"),
    (3, "zero_optimization.stage3_use_all_reduce_for_fetch_params", True,
     "zero_optimization.stage3_use_all_reduce_for_fetch_params true: DeepSpeed fetches ZeRO-3's weights with an "
     "all-reduce"),
    (3, "zero_optimization.use_all_reduce_for_fetch_params", True,
     "and with an all-gather where it holds one (runtime/zero/partition_parameters.py"),
    (3, "mics_shard_size", 2, "mics_shard_size at the top level: DeepSpeed 0.19 ignores it there"),
    (3, "zero_quantized_weights", True, "zero_quantized_weights at the top level: DeepSpeed 0.19 ignores it there"),
    (2, "wall_clock_breakdown", True, "wall_clock_breakdown on: DeepSpeed reads its timers after every micro-batch")])
def test_what_a_ds_config_changes_and_the_estimate_does_not_price_is_said(tmp_path, stage, where, value, said):
    """Each of these changes the run and was read silently: DeepSpeed all-reduces each ZeRO-1/2 bucket
    where reduce_scatter is false (zero/stage_1_and_2.py, average_tensor), reorders the gradients with
    round_robin_gradients (_round_robin_reorder), fetches ZeRO-3's weights with an all-reduce
    (zero/partition_parameters.py, _all_gather_coalesced), reads MiCS and ZeRO++ keys only inside
    zero_optimization (DeepSpeedZeroConfig), and with wall_clock_breakdown the host waits on each timer's
    CUDA event after every step() (utils/timer.py). The same config without the key gets no such note."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
              "zero_optimization": {"stage": stage}}
    section, _, key = where.rpartition(".")
    if section:
        # DeepSpeed takes the value where the file gives it, and defaults to the other
        assert getattr(DeepSpeedZeroConfig(stage=stage, **{key: value}), key.replace("stage3_", "")) == value
        assert getattr(DeepSpeedZeroConfig(stage=stage), key.replace("stage3_", "")) != value
        if key == "reduce_scatter":
            # The default that makes reduce_scatter true all-reduce each bucket too (stage_1_and_2.py,
            # average_tensor: the ("allreduce", group) key → allreduce_and_scatter), so the note says so.
            assert DeepSpeedZeroConfig(stage=stage).use_multi_rank_bucket_allreduce is True
    elif key != "wall_clock_breakdown":
        # at the top level DeepSpeed starts, and its ZeRO config is the one without the key
        read = DeepSpeedConfig({**config, key: value, "train_batch_size": 8}, mpu=None)
        assert getattr(read.zero_config, key, None) in (None, False) and read.zero_config.stage == stage
    first = diagnose(CASE_8, config=_write_config(tmp_path, config), recompute="full").notes
    assert not [n for n in first if said in n]
    if section:
        config[section][key] = value
    else:
        config[key] = value
    notes = diagnose(CASE_8, config=_write_config(tmp_path, config), recompute="full").notes
    assert len([n for n in notes if said in n]) == 1, notes


@pytest.mark.slow
def test_a_ds_config_that_reduces_each_slice_to_its_owner_is_priced_as_a_reduce_scatter(tmp_path):
    """DeepSpeed 0.19 all-reduces each ZeRO-1/2 bucket whole unless use_multi_rank_bucket_allreduce is false
    and reduce_scatter is not (zero/stage_1_and_2.py, average_tensor: the ("allreduce", group) key, or
    reduce_scatter false's gradient_reduction_w_predivide); with both, each slice is reduced to its owner, a
    reduce-scatter's bytes. Read from the file: only that config prices the reduce-scatter, and the rest the
    all-reduce, whose ring moves 2(n−1)/n of each bucket against (n−1)/n: twice the traffic, so that one config
    steps faster than the others while its memory is the same."""
    def read(**keys):
        config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                  "zero_optimization": {"stage": 2, **keys}}
        return diagnose(CASE_8, config=_write_config(tmp_path, config), recompute="full").estimate

    default, said_true = read(), read(use_multi_rank_bucket_allreduce=True)
    per_owner = read(use_multi_rank_bucket_allreduce="false", reduce_scatter=True)
    whole = read(use_multi_rank_bucket_allreduce=False, reduce_scatter=False)
    assert default.job.training.engine.zero12_bucket_all_reduce and whole.job.training.engine.zero12_bucket_all_reduce
    assert not per_owner.job.training.engine.zero12_bucket_all_reduce
    assert default.time.dp_comm_s == said_true.time.dp_comm_s == whole.time.dp_comm_s > per_owner.time.dp_comm_s
    assert per_owner.peak.total == default.peak.total
