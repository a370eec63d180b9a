"""What was priced is what runs: Megatron-LM builds its embedding, LM head and logits for the
vocabulary padded up to a multiple of --make-vocab-size-divisible-by (128) × tp
(``_vocab_size_with_padding``, megatron/training/tokenizer/tokenizer.py at core_v0.16.1:
``math.ceil(vocab / (128 · tp)) · 128 · tp``); torchtitan and DeepSpeed build the model's own.

Llama 3 8B's 128,256 at tp 8: a multiple of 1,024, ceil(125.25) = 126 of them, 129,024 rows.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cost_models.activations import head_activation_bytes, loss_gradient_bytes, saved_logit_bytes
from cost_models.flops import Gemm, model_flops_per_token
from cost_models.job import Job
from cost_models.kernels import gemm_time, high_precision_precision
from cost_models.layer_time import cross_entropy_time
from cost_models.memory import job_embedding_shards, job_stage_parameters, per_parameter_states, stage_state_bytes
from cost_models.parameters import built_vocab, padded_vocab, stage_parameters, total_parameters
from cost_models.stage_time import head_time
from planner.case import load_case
from planner.errors import CaseError

VOCAB, HIDDEN, TP = 128_256, 4_096, 8
PADDED = 129_024  # 126 · 128 · 8, by Megatron-LM's formula above
EXTRA_ROWS = PADDED - VOCAB  # 768


def job(engine: str, tp: int = TP, zero_stage: int = 0) -> Job:
    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 8, "seq_len": 4096, "precision": "bf16"},
            "search": {"target": engine},
            "layout": {"dp": 8 // tp, "tp": tp, "pp": 1, "zero_stage": zero_stage, "micro_batch_size": 1}}
    return load_case(case).job()


def unpadded(j: Job) -> Job:
    """The same job, its engine building the model's own vocabulary."""
    engine = replace(j.training.engine, vocab_padding_multiple=None)
    return Job(j.model, j.cluster, replace(j.training, engine=engine), j.layout)


def test_padded_vocab_is_megatron_lms_formula():
    assert padded_vocab(VOCAB, TP) == PADDED
    assert padded_vocab(VOCAB, 1) == 128_256  # already a multiple of 128
    assert padded_vocab(50_257, 1) == 50_304  # GPT-2's, as Megatron-LM logs it
    assert padded_vocab(PADDED, TP) == PADDED  # a case that gives it padded stays so


def test_megatron_builds_the_padded_vocabulary_and_the_others_the_models():
    assert job("megatron").model.vocab_size == VOCAB
    assert built_vocab(job("megatron").model, TP, job("megatron").training.engine) == PADDED
    for engine in ("torchtitan", "deepspeed"):
        j = job(engine, zero_stage=1)
        assert built_vocab(j.model, TP, j.training.engine) == VOCAB


def test_megatrons_embedding_and_head_hold_the_padded_rows():
    j = job("megatron")
    unpadded_stage = stage_parameters(j.model, j.model.num_layers, True, True, TP)
    # the input embedding and the untied LM head, each 129,024 × 4,096 split over 8 ranks
    assert job_stage_parameters(j, 0).dense - unpadded_stage.dense == 2 * EXTRA_ROWS * HIDDEN / TP


@pytest.mark.parametrize("engine", ["torchtitan", "deepspeed"])
def test_other_engines_hold_the_models_vocabulary(engine):
    # The model's rows, split as the engine splits them (DeepSpeed's AutoTP keeps the embedding whole).
    j = job(engine, zero_stage=1)
    assert job_stage_parameters(j, 0) == stage_parameters(j.model, j.model.num_layers, True, True, TP,
                                                          embedding_tp=job_embedding_shards(j))


def test_megatrons_lm_head_gemm_and_loss_run_over_the_padded_vocabulary():
    j = job("megatron")
    tokens = 4096.0
    gpu, training = j.cluster.gpu, j.training
    head = Gemm("lm_head", tokens, PADDED / TP, HIDDEN)  # N = 16,128
    expected = 3 * gemm_time(head, gpu, high_precision_precision(training)) \
        + cross_entropy_time(tokens * PADDED / TP, training, gpu)
    assert head_time(j.model, training, gpu, TP, tokens) == pytest.approx(expected, rel=1e-12)
    assert head_time(j.model, training, gpu, TP, tokens) > head_time(j.model, unpadded(j).training, gpu, TP, tokens)


def test_megatrons_model_states_grow_by_the_padded_rows_exactly():
    j = job("megatron")
    per_param = per_parameter_states(j)[0].total
    extra = stage_state_bytes(j, 0).total - stage_state_bytes(unpadded(j), 0).total
    assert extra == pytest.approx(per_param * 2 * EXTRA_ROWS * HIDDEN / TP, rel=1e-12)


def test_megatrons_logits_are_of_the_padded_vocabulary():
    j = job("megatron")
    lay, training = j.layout, j.training
    logits = training.seq_len * lay.micro_batch_size * EXTRA_ROWS / TP
    kept = head_activation_bytes(j.model, training, lay) - head_activation_bytes(j.model, unpadded(j).training, lay)
    assert kept == pytest.approx(saved_logit_bytes(training) * logits, rel=1e-12)
    gradients = loss_gradient_bytes(j.model, lay, training) - loss_gradient_bytes(j.model, lay, unpadded(j).training)
    assert gradients == pytest.approx(training.engine.loss_gradient_bytes * logits, rel=1e-12)


def test_the_models_parameters_and_model_flops_keep_the_model_cards_vocabulary():
    """8.03B as Meta counts Llama 3 8B; MFU's model FLOPs count its 128,256 (flops.model_flops_per_token)."""
    j = job("megatron")
    assert total_parameters(j.model) == total_parameters(unpadded(j).model) == 8_030_261_248
    assert model_flops_per_token(j.model, 4096) == model_flops_per_token(unpadded(j).model, 4096)


@pytest.mark.parametrize("divisible_by, rows", [(128, PADDED), (256, PADDED), (64, 128_512), (1, VOCAB)])
def test_a_megatron_list_that_pads_otherwise_is_said(divisible_by, rows):
    """--make-vocab-size-divisible-by 256 at tp 8 pads to 129,024 as well (63 · 2,048); 64 to 128,512
    (251 · 512) and 1 not at all: neither is what was priced, which a note says with both row counts."""
    from planner.engines.megatron.read import vocab_padding_note

    assert padded_vocab(VOCAB, TP, divisible_by) == rows
    flags = {"--tensor-model-parallel-size": str(TP), "--make-vocab-size-divisible-by": str(divisible_by)}
    note = vocab_padding_note("megatron_args.txt", flags, job("megatron").model)
    if rows == PADDED:
        assert note is None
    else:
        assert note == (f"megatron_args.txt gives --make-vocab-size-divisible-by {divisible_by}: Megatron-LM pads the "
                        f"vocabulary 128,256 to {rows:,} rows at tp 8, priced at its default 128's 129,024 (the "
                        "embedding, LM head and logits); drop the flag to run what was priced")


def test_diagnose_says_a_list_that_pads_otherwise_and_refuses_one_that_is_no_positive_integer(tmp_path):
    """Through diagnose: the emitted list with --make-vocab-size-divisible-by 64 is diagnosed with the
    note; with 0 (Megatron-LM divides by it) it is refused naming the flag."""
    from planner.diagnose import diagnose
    from planner.engines.megatron import emit as megatron
    from planner.estimate import estimate

    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16", "engine": "megatron"},
            "layout": {"tp": 8, "sequence_parallel": True, "micro_batch_size": 1, "recompute": "full"}}
    text = megatron.render(estimate(case), ["header"])[megatron.ARGS_FILE]
    for given, refused in (("64", False), ("0", True)):
        path = tmp_path / f"args_{given}.txt"
        path.write_text(text + f"--make-vocab-size-divisible-by {given}\n")
        if refused:
            with pytest.raises(CaseError) as error:
                diagnose(case, megatron_args=path)
            assert error.value.key == "--make-vocab-size-divisible-by"
        else:
            notes = diagnose(case, megatron_args=path).notes
            assert any("pads the vocabulary 128,256 to 128,512 rows at tp 8" in note for note in notes), notes


@pytest.mark.parametrize("divisible_by, tp", [("+64", "8"), ("64", "+8"), (" +64 ", " 8"), ("6_4", "8")])
def test_a_signed_multiple_megatron_reads_as_its_number_is_said(divisible_by, tp):
    """--make-vocab-size-divisible-by +64 was taken by diagnose (an integer, as argparse's int reads it, 64) with
    no note, where Megatron-LM pads 128,256 to 128,512 rows, not the 129,024 priced: the note read only unsigned
    digits, so a sign (on tp too) silently dropped it."""
    from planner.engines.megatron.read import vocab_padding_note

    flags = {"--tensor-model-parallel-size": tp, "--make-vocab-size-divisible-by": divisible_by}
    note = vocab_padding_note("megatron_args.txt", flags, job("megatron").model)
    assert note is not None and "--make-vocab-size-divisible-by 64:" in note and "to 128,512 rows at tp 8" in note, note


@pytest.mark.parametrize("divisible_by", ["1099511627776", "9223372036854775807", "16777216"])
def test_a_multiple_that_pads_past_the_largest_vocabulary_is_refused_with_the_bound(tmp_path, divisible_by):
    """--make-vocab-size-divisible-by 1099511627776 (2**40) was diagnosed as fitting with a note that Megatron-LM
    pads 128,256 to 4,398,046,511,104 rows at tp 4: an embedding no GPU holds, priced at the default's 128,512.
    A multiple that pads the vocabulary past the largest a case takes (2**24 rows) is refused naming the flag,
    the bound and the rows; 16,777,216 at tp 8 pads to 2**27."""
    from planner.diagnose import diagnose
    from planner.engines.megatron import emit as megatron
    from planner.estimate import estimate
    from planner.limits import MAX_VOCAB

    case = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            "training": {"global_batch_size": 64, "seq_len": 4096, "precision": "bf16", "engine": "megatron"},
            "layout": {"tp": 8, "sequence_parallel": True, "micro_batch_size": 1, "recompute": "full"}}
    path = tmp_path / "args.txt"
    path.write_text(megatron.render(estimate(case), ["header"])[megatron.ARGS_FILE]
                    + f"--make-vocab-size-divisible-by {divisible_by}\n")
    with pytest.raises(CaseError) as error:
        diagnose(case, megatron_args=path)
    assert error.value.key == "--make-vocab-size-divisible-by"
    assert f"at most {MAX_VOCAB:,} rows at tp 8" in error.value.expected and divisible_by in error.value.expected
