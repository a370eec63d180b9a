"""A published run's statements of one fact agree: tokens/s in all and per GPU, and the batch its
gradient accumulation makes (planner/published_runs.py: tokens_problem, batch_problem).

A row whose tokens_per_sec_total and tokens_per_sec_per_gpu were 32x apart was scored on the total
without a word, and one whose grad_accum contradicted global batch = micro-batch x accumulation x dp
was read as it stood.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from planner.fidelity import evaluate
from planner.published_runs import DEFAULT_FILES, batch_problem, case_of, load_rows, stated_problem, tokens_problem


@pytest.fixture(scope="module")
def rows():
    return load_rows()


def narayanan(rows, **changes) -> dict:
    row = copy.deepcopy(next(r for r in rows if r["id"] == "narayanan21_t1_1.7B"))
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        row[section][key] = value
    return row


def test_tokens_in_all_and_per_gpu_that_say_two_speeds_are_refused_naming_the_key(rows):
    row = narayanan(rows, measured__tokens_per_sec_total=100000, measured__tokens_per_sec_per_gpu=99999)
    case, _ = case_of(row)
    key, expected = stated_problem(row, case)
    assert key == "measured.tokens_per_sec_per_gpu"
    assert "99,999 on 32 GPUs gives 3,199,968 tokens/s, but tokens_per_sec_total says 100,000" in expected


def test_tokens_rounded_as_tables_print_them_agree(rows):
    # The Playbook's 80B row: 7 tokens/s per GPU (whole tokens) beside 3,779 on 512 GPUs, 5 % apart.
    assert tokens_problem({"num_gpus": 512, "measured": {"tokens_per_sec_total": 3779, "tokens_per_sec_per_gpu": 7}}) is None
    # Three figures of a total (0.5 %) and whole tokens per GPU: within 1 % and half a token per GPU.
    assert tokens_problem({"num_gpus": 8, "measured": {"tokens_per_sec_total": 61_300, "tokens_per_sec_per_gpu": 7_712}}) \
        is None
    assert tokens_problem({"num_gpus": 8, "measured": {"tokens_per_sec_total": 61_300, "tokens_per_sec_per_gpu": 7_800}})[0] \
        == "measured.tokens_per_sec_per_gpu"


def test_a_grad_accum_the_batch_does_not_make_is_refused_naming_the_key(rows):
    row = narayanan(rows, batch__grad_accum=3)
    case, _ = case_of(row)
    assert stated_problem(row, case) == ("batch.grad_accum", "3, but global_batch_size 512 over micro_batch_size 16 · "
                                                             "dp 32 leaves 1: give the counts of one run")
    assert batch_problem(narayanan(rows, batch__grad_accum=1), case) is None
    off = narayanan(rows, batch__tokens_per_batch=12345)
    assert stated_problem(off, case) == ("batch.tokens_per_batch", "12345, but global batch 512 × sequence 2048 is "
                                                                   "1048576")


def test_validate_published_names_the_file_the_row_and_the_key(rows, tmp_path):
    path = tmp_path / "runs.yaml"
    tokens = narayanan(rows, measured__tokens_per_sec_total=100000, measured__tokens_per_sec_per_gpu=99999)
    tokens["id"] = "tokens-off"
    path.write_text(yaml.safe_dump([narayanan(rows, batch__grad_accum=3), tokens]))
    result = evaluate(load_rows([path]), estimate=lambda case: pytest.fail("a refused row was scored"),
                      plan=lambda case: pytest.fail("planned"))
    assert [(name, why.split(":")[0]) for name, why in result.malformed] == [
        (f"narayanan21_t1_1.7B ({path}[0])", "batch.grad_accum"),
        (f"tokens-off ({path}[1])", "measured.tokens_per_sec_per_gpu")]


def test_no_published_row_trips_the_checks(rows):
    # AutoModel's rows count the local batch (8 per rank) over the micro-batch (1); the Playbook's rows whose
    # dp · mbs · accumulation is not 256 are marked trust: low (the validation README) and kept.
    tripped = []
    for row in rows:
        try:
            case, _ = case_of(row)
        except Exception:  # noqa: BLE001 - rows the scorer skips as malformed are no concern here
            continue
        if case and (tokens_problem(row) or batch_problem(row, case)):
            tripped.append(row["id"])
    assert tripped == []
    assert DEFAULT_FILES
