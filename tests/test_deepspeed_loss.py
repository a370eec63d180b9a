"""The loss a DeepSpeed job's train.py runs (``training.loss``): Megatron's vocab-parallel cross-entropy,
in place, as Megatron-DeepSpeed runs it (the engine's default), or eager PyTorch's ``F.cross_entropy`` on
fp32 logits, as a Hugging Face model's ``ForCausalLMLoss`` or a plain script runs it. Both priced by
the one memory function (``activations.loss_gradient_bytes``), each with its own bytes a logit."""

from __future__ import annotations

import json

import pytest

import planner
from cli_in_process import run_cli
from cost_models.activations import head_activation_bytes, loss_gradient_bytes, saved_logit_bytes
from cost_models.memory import peak_stage_memory
from planner.case import load_case
from planner.errors import CaseError

# Llama 3 8B (vocabulary 128,256) at seq 4096, micro-batch 1, tp 1: the case the loss's bytes matter in.
VOCAB, SEQ = 128_256, 4096


def case(**training) -> dict:
    return {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": SEQ, "engine": "deepspeed", **training},
            "layout": {"dp": 8, "micro_batch_size": 1, "zero_stage": 3, "recompute": "full"}}


def loss_peak_bytes(job) -> float:
    """What the loss holds of the logits' shape at its peak: the saved softmax and the gradients beside it."""
    logits = SEQ * VOCAB
    return saved_logit_bytes(job.training) * logits + loss_gradient_bytes(job.model, job.layout, job.training)


def test_eager_loss_holds_the_bytes_measured_for_eager_pytorch():
    from test_eager_loss_torch import measured_bytes_per_logit

    _, measured = measured_bytes_per_logit()  # eager F.cross_entropy on fp32 logits: 12 a logit at its peak
    megatron = load_case(case()).job()
    eager = load_case(case(loss="Eager")).job()  # any letter case, as the other choices
    assert loss_peak_bytes(eager) == measured * SEQ * VOCAB
    # Megatron's vocab_parallel_cross_entropy keeps the fp32 softmax and writes the gradient into it,
    # handing back one bf16 copy: 4 + 2 a logit, the default's, as Megatron-DeepSpeed runs it.
    assert loss_peak_bytes(megatron) == (4 + 2) * SEQ * VOCAB
    assert load_case(case(loss="megatron")).job().training.loss_name == megatron.training.loss_name == "megatron"
    # The head's saved tensors are the same; the eager loss's peak is ~3.2 GB more for this case.
    assert head_activation_bytes(eager.model, eager.training, eager.layout) \
        == head_activation_bytes(megatron.model, megatron.training, megatron.layout)
    assert peak_stage_memory(eager).total > peak_stage_memory(megatron).total


def test_only_deepspeed_takes_either_loss():
    # Megatron-LM's loss is its own vocab-parallel one: named, it is what runs; eager is refused, as it
    # is by the engines whose loss training.compiled_loss and loss_chunks describe.
    assert planner.estimate({**case(), "training": {**case()["training"], "engine": "megatron", "loss": "megatron"}})
    for engine in ("megatron", "torchtitan", "any"):
        with pytest.raises(CaseError, match="training.loss"):
            planner.estimate({**case(), "training": {**case()["training"], "engine": engine, "loss": "eager"}})


def test_an_unknown_loss_is_one_line_naming_the_key(tmp_path):
    path = tmp_path / "case.yaml"
    path.write_text("model: {preset: llama3-8b}\ncluster: {gpu: h100-sxm-80gb, num_gpus: 8}\n"
                    "training: {global_batch_size: 64, seq_len: 4096, engine: deepspeed, loss: fused}\n"
                    "layout: {dp: 8, micro_batch_size: 1, zero_stage: 3}\n")
    done = run_cli("estimate", str(path))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert str(path) in done.stderr and "training.loss" in done.stderr and "megatron, eager" in done.stderr


def launch_sh(estimate) -> str:
    from planner.engines.deepspeed.emit import launch_text
    return " ".join(launch_text(estimate).replace("#", " ").split())  # the header's prose, unwrapped


def at_stake_gb(stated: dict, other: dict) -> str:
    """What the other loss adds to the peak: the two estimates' difference, as `estimate` prices each."""
    return f"{(planner.estimate(other).peak.total - planner.estimate(stated).peak.total) / 1e9:.2f} GB"


def test_launch_header_says_which_loss_was_priced_and_how_train_py_runs_it():
    default = planner.estimate(case())
    text = launch_sh(default)
    assert "Loss: priced as Megatron's vocab-parallel cross-entropy (training.loss unset: the engine's, megatron)" in text
    # vocab_parallel_cross_entropy asserts Megatron's tensor-parallel group is initialized (megatron-core 0.16,
    # parallel_state.get_tensor_model_parallel_group): at tp 1, a group of one rank.
    assert "parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)" in text
    assert "vocab_parallel_cross_entropy(logits, labels.clamp(min=0))" in text
    assert "(training.loss eager: a Hugging Face model's own loss (ForCausalLMLoss)" in text
    assert f"it adds {at_stake_gb(case(), case(loss='eager'))} to this plan's peak" in text
    eager = launch_sh(planner.estimate(case(loss="eager")))
    assert "Loss: priced as eager PyTorch cross-entropy on fp32 logits (training.loss eager)" in eager
    assert "initialize_model_parallel" not in eager
    assert f"it takes {at_stake_gb(case(), case(loss='eager'))} off this plan's peak" in eager


def test_inside_a_pipeline_the_loss_runs_over_the_grids_tensor_parallel_ranks():
    # The LM head's Megatron-style layer shards the vocabulary over the grid's model-parallel ranks,
    # consecutive ranks as Megatron's tensor-parallel groups are.
    piped = {**case(), "layout": {"dp": 2, "tp": 2, "pp": 2, "micro_batch_size": 1, "zero_stage": 1,
                                  "recompute": "full"}}
    assert "initialize_model_parallel(tensor_model_parallel_size=2)" in launch_sh(planner.estimate(piped))


def test_estimate_notes_the_unstated_loss_and_the_gigabytes_at_stake(tmp_path):
    import yaml

    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(case()))
    done = run_cli("estimate", str(path))
    assert done.returncode == 0
    note = next(line for line in done.stderr.splitlines() if "training.loss" in line)
    assert note.startswith(f"note: {path}: training.loss is unstated: priced as deepspeed's default, megatron")
    assert f"adds {at_stake_gb(case(), case(loss='eager'))} to the peak" in note
    path.write_text(yaml.safe_dump(case(loss="eager")))
    assert "training.loss" not in run_cli("estimate", str(path)).stderr


@pytest.mark.parametrize("said", [True, "yes"])  # pydantic's lax bool, as DeepSpeed's config reads it
def test_autotps_vocabulary_parallel_head_is_refused_in_one_line(tmp_path, said):
    # DeepSpeed 0.19.8's tensor_parallel.vocab_parallel_lm_head keeps AutoTP's logits vocabulary-sharded and
    # runs its own distributed loss (runtime/engine.py, configure_vocab_parallel_loss): not the gathered
    # head's whole logits the engine prices (tests/test_autotp_logits_torch.py); false is that head.
    path = tmp_path / "case.yaml"
    path.write_text("model: {preset: llama3-8b}\ncluster: {gpu: h100-sxm-80gb, num_gpus: 8}\n"
                    "training: {global_batch_size: 4, seq_len: 4096, engine: deepspeed}\n")
    config = tmp_path / "ds_config.json"
    for value, refused in ((said, True), (False, False)):
        config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                      "zero_optimization": {"stage": 1},
                                      "tensor_parallel": {"autotp_size": 2, "vocab_parallel_lm_head": value}}))
        done = run_cli("diagnose", str(path), "--config", str(config))
        key = "tensor_parallel.vocab_parallel_lm_head"
        assert (done.returncode, key in done.stderr) == ((2, True) if refused else (0, False)), done.stderr
        if refused:
            assert done.stderr.strip().count("\n") == 0 and str(config) in done.stderr and "false or absent" in done.stderr


def test_the_emitted_autotp_config_keeps_the_gathered_head_it_priced():
    # Left unset, DeepSpeed 0.19.8 turns the vocabulary-parallel head and its distributed loss on by itself
    # for a tied embedding under a Hugging Face tp plan asking "embedding_rowwise" (runtime/engine.py:
    # auto_vocab_parallel_lm_head is "vocab_parallel_lm_head is None and has_tied_vocab_head"); the plan
    # prices the gathered head's whole logits, so the files must say false, and DeepSpeed's own config
    # model must read it so.
    from deepspeed.runtime.tensor_parallel.config import get_tensor_parallel_config

    import planner
    from planner.engines.deepspeed.emit import config_dict

    est = planner.estimate({"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
                            "training": {"global_batch_size": 4, "seq_len": 4096, "engine": "deepspeed"},
                            "layout": {"dp": 4, "tp": 2, "pp": 1, "micro_batch_size": 1, "zero_stage": 1,
                                       "recompute": "full"}})
    config = config_dict(est)
    assert get_tensor_parallel_config(config).vocab_parallel_lm_head is False


def test_size_says_the_unstated_loss_of_its_answer_as_plan_says_it_of_its_best():
    # size picks a layout as plan does, and its answer's peak holds the same loss: the note a user of
    # plan reads (the loss priced, the other's gigabytes) belongs to size's answer too, and goes with a
    # stated loss.
    sized = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
             "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16", "engine": "deepspeed"}}
    answer = planner.size(sized, tokens="10B", deadline="30d")
    said = [n for n in answer.notes if "training.loss is unstated" in n]
    assert len(said) == 1 and "priced as deepspeed's default, megatron" in said[0]
    stated = {**sized, "training": {**sized["training"], "loss": "megatron"}}
    assert not [n for n in planner.size(stated, tokens="10B", deadline="30d").notes if "training.loss" in n]
