"""The Hugging Face Trainer's DeepSpeed configs, every value it fills in set to "auto"
(transformers' DeepSpeed integration docs, ZeRO-2 and ZeRO-3), read as the Trainer runs them:
each "auto" resolved from the case and the options, and listed (issue 52)."""

from __future__ import annotations

import json

import pytest
import yaml

from cli_in_process import run_cli
from planner.diagnose import diagnose
from planner.errors import CaseError

# The ZeRO-2 config of the Trainer's DeepSpeed documentation, as published.
ZERO2 = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "allgather_partitions": True, "allgather_bucket_size": 2e8, "overlap_comm": True,
                          "reduce_scatter": True, "reduce_bucket_size": 2e8, "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False,
}
ZERO3 = {**ZERO2, "zero_optimization": {
    "stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
    "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True, "contiguous_gradients": True,
    "sub_group_size": 1e9, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": True},
    "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": False}}
CASE = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16", "engine": "deepspeed"}}


def files(tmp_path, config: dict, case: dict = CASE):
    (tmp_path / "ds.json").write_text(json.dumps(config))
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    return tmp_path / "case.yaml", tmp_path / "ds.json"


@pytest.mark.parametrize("config, zero", [(ZERO2, 2), (ZERO3, 3)])
def test_the_trainers_configs_are_read_with_each_auto_resolved(tmp_path, config, zero):
    case, ds = files(tmp_path, config)
    result = diagnose(case, config=ds, micro_batch_size=2)
    lay = result.estimate.job.layout
    assert (lay.dp, lay.micro_batch_size, lay.zero_stage, lay.recompute) == (8, 2, zero, "none")
    assert result.estimate.job.grad_accum == 4  # 64 / (2 x 8)
    # transformers' trainer_config_finalize sizes the ZeRO buckets by the model's hidden size (4,096)
    sized = () if zero == 2 else (
        "zero_optimization.reduce_bucket_size: auto -> 16777216 (the hidden size squared, 4096, as the Trainer "
        "fills it)",
        "zero_optimization.stage3_prefetch_bucket_size: auto -> 15099494 (0.9 × the hidden size squared, 4096, as "
        "the Trainer fills it)",
        "zero_optimization.stage3_param_persistence_threshold: auto -> 40960 (10 × the hidden size, 4096, as the "
        "Trainer fills it)")
    assert result.resolved == ("train_micro_batch_size_per_gpu: auto -> 2",
                               "gradient_accumulation_steps: auto -> 4 (global batch 64 / micro-batch 2 / dp 8)",
                               "train_batch_size: auto -> 64 (micro-batch 2 × accumulation 4 × dp 8, as the "
                               "Trainer fills it)", *sized,
                               "bf16.enabled: auto -> true (training.precision bf16)",
                               "fp16.enabled: auto -> false (training.precision bf16)")


def test_activation_checkpointing_is_the_models_choice_not_the_sections(tmp_path):
    case, ds = files(tmp_path, ZERO3)
    assert diagnose(case, config=ds, micro_batch_size=1, recompute="full").estimate.job.layout.recompute == "full"
    done = run_cli("diagnose", str(case), "--config", str(ds), "--micro-batch-size", "1", "--json")
    data = json.loads(done.stdout)
    assert data["config"]["layout"]["recompute"] == "none" and len(data["resolved"]) == 8  # 5, and 3 ZeRO-3 buckets


def test_an_auto_micro_batch_with_nothing_to_resolve_it_names_the_option(tmp_path):
    case, ds = files(tmp_path, ZERO2)
    with pytest.raises(CaseError, match=r"ds.json: train_micro_batch_size_per_gpu: is \"auto\" .*give "
                                        r"--micro-batch-size"):
        diagnose(case, config=ds)


def test_a_nemo_config_given_as_megatron_arguments_is_named(tmp_path):
    (tmp_path / "nemo.yaml").write_text("name: megatron_gpt\ntrainer:\n  devices: 8\nmodel:\n  micro_batch_size: 1\n")
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(CASE))
    done = run_cli("diagnose", str(tmp_path / "case.yaml"), "--megatron-args", str(tmp_path / "nemo.yaml"))
    assert done.returncode == 2 and "this is a NeMo config" in done.stderr


def test_a_micro_batch_option_that_differs_from_the_configs_is_refused(tmp_path):
    """--micro-batch-size 2 beside a ds_config that states 1 was dropped without a word (exit 0)."""
    case, ds = files(tmp_path, {**ZERO2, "train_micro_batch_size_per_gpu": 1})
    with pytest.raises(CaseError, match=r"--micro-batch-size: 2 differs from .*ds.json's train_micro_batch_size_per_gpu 1"):
        diagnose(case, config=ds, micro_batch_size=2)
    assert diagnose(case, config=ds, micro_batch_size=1).estimate.job.layout.micro_batch_size == 1


def test_a_micro_batch_option_is_checked_against_the_one_the_config_derives(tmp_path):
    """A ds_config with train_batch_size 64 and accumulation 4 on 8 GPUs runs micro-batch 2 (64 ÷ 4 ÷
    8): --micro-batch-size 4 beside it was dropped without a word, the derived 2 diagnosed."""
    config = {"train_batch_size": 64, "gradient_accumulation_steps": 4, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 2}}
    case, ds = files(tmp_path, config)
    with pytest.raises(CaseError, match=r"train_batch_size: 64 is not micro 4 × accumulation 4 × data-parallel 8"):
        diagnose(case, config=ds, micro_batch_size=4)
    assert diagnose(case, config=ds, micro_batch_size=2).estimate.job.layout.micro_batch_size == 2


@pytest.mark.parametrize("option, value, stated", [("--pp", "2", "4"), ("--tp", "8", "2"),
                                                   ("--micro-batch-size", "4", "1"), ("--recompute", "full", "none")])
def test_options_for_a_ds_config_that_megatron_arguments_contradict_are_refused(tmp_path, option, value, stated):
    """A Megatron argument list states its layout: --pp 2 beside one of 4 was dropped (exit 0, the
    report still at pp 4)."""
    (tmp_path / "args.txt").write_text("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
                                       "--micro-batch-size 1 --global-batch-size 64 --seq-length 4096 --bf16\n")
    (tmp_path / "case.yaml").write_text(yaml.safe_dump({**CASE, "training": {**CASE["training"], "engine": "megatron"}}))
    done = run_cli("diagnose", str(tmp_path / "case.yaml"), "--megatron-args", str(tmp_path / "args.txt"), option, value)
    assert done.returncode == 2 and done.stderr.startswith(f"error: {option}: {value} differs from the {stated} "
                                                           f"args.txt states"), done.stderr
    assert done.stderr.count("\n") == 1
    agreeing = run_cli("diagnose", str(tmp_path / "case.yaml"), "--megatron-args", str(tmp_path / "args.txt"),
                       option, stated)
    assert agreeing.returncode in (0, 3), agreeing.stderr


def test_what_a_ds_config_cannot_say_and_the_case_does_not_is_noted(tmp_path):
    """A DeepSpeed-MoE plan's ds_config read back at ep 1 with nothing said (the plan: ep 4), and
    diagnose then advised 'ep 1 -> 4'."""
    case = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "deepspeed"}}
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    (tmp_path / "ds.json").write_text(json.dumps({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 1,
                                                  "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}))
    result = diagnose(tmp_path / "case.yaml", config=tmp_path / "ds.json", pp=2)
    assert any("does not state DeepSpeed-MoE's ep_size" in n for n in result.notes)
    assert any("does not state PipelineModule's split" in n for n in result.notes)


def test_a_micro_batch_of_zero_beside_an_auto_accumulation_is_refused_naming_it(tmp_path):
    """A ZeroDivisionError's traceback before: the accumulation was worked out of the micro-batch first."""
    case, ds = files(tmp_path, {**ZERO2, "train_micro_batch_size_per_gpu": 0})
    with pytest.raises(CaseError, match=r"ds.json: train_micro_batch_size_per_gpu: expected an integer >= 1, got int 0"):
        diagnose(case, config=ds)


def test_an_optimizer_or_a_partial_offload_the_case_does_not_price_is_refused(tmp_path):
    """SGD in the config against the case's AdamW was priced with Adam's moments (123 GB on the
    host); an offload ratio of 0.3 was read as the whole optimizer offloaded."""
    case, ds = files(tmp_path, {**ZERO2, "optimizer": {"type": "SGD", "params": {"lr": "auto"}}})
    with pytest.raises(CaseError, match=r"ds.json: optimizer.type: is SGD \(no moments \(SGD\)\), but the case's "
                                        r"optimizer is adam"):
        diagnose(case, config=ds, micro_batch_size=2)
    case, ds = files(tmp_path, {**ZERO3, "zero_optimization": {**ZERO3["zero_optimization"],
                                                                "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})
    with pytest.raises(CaseError, match=r"zero_optimization.offload_optimizer.ratio: is 0.3: a partial offload"):
        diagnose(case, config=ds, micro_batch_size=2)


@pytest.mark.parametrize("zero, buffers, elements", [
    # accelerate's zero_stage2 template: "auto" (the Trainer's hidden², 4096²), overlap_comm on: two buffers
    ({"stage": 2, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": "auto"}, 2, 4096 ** 2),
    # DeepSpeed's defaults below stage 3: contiguous gradients, overlap_comm off, 5e8 elements: one buffer
    ({"stage": 2}, 1, 5e8),
    ({"stage": 1, "reduce_bucket_size": 2e8, "overlap_comm": "true"}, 2, 2e8),
    # no contiguous gradients and nothing offloaded: setup_buckets allocates none
    ({"stage": 2, "contiguous_gradients": False, "overlap_comm": True}, 0, 5e8),
])
def test_the_reduction_buffers_are_priced_as_the_config_sizes_them(tmp_path, zero, buffers, elements):
    """Priced at the two 5e8-element buffers the planner's own files ask for: a Trainer's ZeRO-2 config
    with "auto" holds two of 4096² (runtime/zero/stage_1_and_2.py, setup_buckets: one with
    contiguous_gradients, a second with overlap_comm), 1.9 GB less on an 8B model in fp16."""
    from cost_models.memory import reduce_bucket_bytes
    from cost_models.model_states import working_bytes

    config = {**ZERO2, "zero_optimization": zero}
    case, ds = files(tmp_path, config)
    job = diagnose(case, config=ds, micro_batch_size=2).estimate.job
    assert reduce_bucket_bytes(job) == buffers * elements * working_bytes(job.training).gradients
    assert not [note for note in diagnose(case, config=ds, micro_batch_size=2).notes if "reduce_bucket_size" in note]


MIXTRAL = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
           "training": {"global_batch_size": 32, "seq_len": 4096, "precision": "bf16", "engine": "deepspeed"}}
AUTOEP = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 2, "overlap_comm": True},
          "expert_parallel": {"enabled": True, "autoep_size": 8}}


def test_autoeps_expert_parallelism_is_read(tmp_path):
    """DeepSpeed 0.19's AutoEP (``expert_parallel``: runtime/engine.py, _configure_expert_parallel) was read as
    no expert parallelism, with a note that the config states none: Mixtral on 8 GPUs at autoep_size 8 was
    priced at 213.6 GB, not fitting."""
    case, ds = files(tmp_path, AUTOEP, MIXTRAL)
    result = diagnose(case, config=ds)
    assert result.estimate.job.layout.ep == 8
    assert not [n for n in result.notes if "ep_size" in n] and any("AutoEP" in n for n in result.notes)
    with pytest.raises(CaseError) as error:
        diagnose(case, config=ds, ep=4)
    assert error.value.source == "--ep" and "expert_parallel.autoep_size 8" in error.value.expected


@pytest.mark.parametrize("zero, says", [
    ({"zero_hpz_partition_size": 0}, None),  # zero/config.py: Field(1, ge=0)
    ({"allgather_bucket_size": 200000001}, "asserts a multiple of 2"),  # stage_1_and_2.py
    ({"offload_optimizer": {"device": "cpu", "pin_memory": False}}, "pin_memory false: the copies"),
    ({"zero_hpz_partition_size": 8}, None),  # ZeRO++'s secondary shards: stage 3's only, nothing unpriced at 2
])
def test_zero_settings_as_deepspeed_takes_them(tmp_path, zero, says):
    config = {**ZERO2, "zero_optimization": {"stage": 2, **zero}}
    case, ds = files(tmp_path, config)
    if says == "asserts a multiple of 2":
        with pytest.raises(CaseError, match="zero_optimization.allgather_bucket_size.*asserts a multiple of 2"):
            diagnose(case, config=ds, micro_batch_size=2)
        return
    notes = diagnose(case, config=ds, micro_batch_size=2).notes
    assert not [n for n in notes if "hpz" in n]
    assert (says is None) or any(says in n for n in notes)


PURE_BF16 = {**CASE, "training": {**CASE["training"], "master_weights": False}}


@pytest.mark.parametrize("bf16, offload, refused", [
    # bf16 master weights with fp32 moments on the GPU: the ZeRO optimizer asserts ZeRO-Offload with DeepSpeedCPUAdam
    ({"bf16_master_weights_and_grads": True}, False, "bf16.bf16_master_weights_and_grads"),
    ({"bf16_optimizer_states": True}, False, "bf16.bf16_optimizer_states"),  # runtime/config.py asserts it
    # offloaded with bf16 moments: DeepSpeed builds its DeepSpeedCPUAdam with bf16 states itself (engine.py)
    ({"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}, True, None),
    ({"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}, False, None),
])
def test_bf16_master_weights_are_read_as_deepspeed_runs_them(tmp_path, bf16, offload, refused):
    """Master weights in bf16 without bf16_optimizer_states and without offload were estimated (DeepSpeed
    asserts at the optimizer's start); with both and the optimizer offloaded, refused (DeepSpeed 0.19 runs it)."""
    zero = {"stage": 2, **({"offload_optimizer": {"device": "cpu"}} if offload else {})}
    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True, **bf16},
              "zero_optimization": zero}
    case, ds = files(tmp_path, config, PURE_BF16 if bf16.get("bf16_master_weights_and_grads") else CASE)
    if refused:
        with pytest.raises(CaseError) as error:
            diagnose(case, config=ds)
        assert error.value.key == refused
    else:
        assert diagnose(case, config=ds).estimate.job.layout.offload_optimizer == (1.0 if offload else 0.0)


def test_a_recomputation_no_one_stated_is_said_to_be_read_as_none(tmp_path):
    """A ds_config cannot state the recomputation (the model code turns it on): read as none, the planner's
    own files, planned with full recomputation, were diagnosed as not fitting with no word of why."""
    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 1}}
    case, ds = files(tmp_path, config)
    said = [n for n in diagnose(case, config=ds).notes if "does not state the recomputation" in n]
    assert said and "give --recompute" in said[0]
    # The notes begin with the case's path, whose test folder is named for recomputation too.
    assert not [n for n in diagnose(case, config=ds, recompute="full").notes
                if "does not state the recomputation" in n]
