"""How planner/training_logs.py reads a log: once, the lines holding each entry's marker alone.

A 200 MB Megatron-LM log (1.45M step lines, under the reader's bound) took 30 s to read: every entry
split and scanned the whole text, the batch of each interval was read line by line, and the argument
dump's pattern was tried at every character. These tests hold the shortcuts to what the plain
reading gives (no timing: the work done, and the results, alike).
"""

from __future__ import annotations

import re

import pytest

from planner import training_logs as tl
from planner.errors import CaseError
from planner.training_logs import read_log

HEAD = """------------------------ arguments ------------------------
  global_batch_size ............................... 128
  log_interval .................................... 1
  num_layers ...................................... 32
-------------------- end of arguments ---------------------
"""


def step_line(i: int, ms: float, batch=128, extra: str = "") -> str:
    stated = f" global batch size: {batch:5d} |" if batch is not None else ""
    return (f" [2026-11-30 10:01:29] iteration {i:8d}/ 1000 | consumed samples: {i} | elapsed time per iteration "
            f"(ms): {ms} |{stated}{extra}\n")


class NoLines(list):
    """Lines a reading must not go through."""

    def __iter__(self):
        raise AssertionError("went through every line of a text that lacks the marker")


def test_an_entry_whose_marker_the_log_lacks_reads_none_of_its_lines():
    text = HEAD + "".join(step_line(i, 12000.0) for i in range(1, 50))
    lines = tl._Lines(text)
    lines.lines = NoLines(lines.lines)
    for entry in (tl.TITAN_STEP, tl.TITAN_MEMORY, tl.DS_THROUGHPUT, tl.DS_MEMORY, tl.DS_PIPE_STEP, tl.MEGATRON_MEMORY):
        assert entry.points_of(lines, "log") == []


def plain_batches(text: str, megatron, src="log"):
    """The reading of each interval's batch line by line, as it was before its shortcut."""
    batch_of = {tl._count(m.group(1), src, n): tl._count(b.group(1), src, n)
                for n, line in enumerate(text.splitlines(), 1)
                for m in [tl.MEGATRON_STEP.key.search(line)] for b in [tl.MEGATRON_BATCH.search(line)] if m and b}
    return batch_of, next((batch_of[s] for s, _ in reversed(megatron) if s in batch_of), None)


BATCH_LOGS = {
    "one batch": "".join(step_line(i, 12000.0) for i in range(1, 20)),
    "ramp-up": "".join(step_line(i, 12000.0, 64 if i < 8 else 128) for i in range(1, 20)),
    "ramp-down": "".join(step_line(i, 12000.0, 128 if i < 8 else 64) for i in range(1, 20)),
    "last lines state none": "".join(step_line(i, 12000.0, 128 if i < 15 else None) for i in range(1, 20)),
    "none stated": "".join(step_line(i, 12000.0, None) for i in range(1, 20)),
    "a batch on no step's line": "".join(step_line(i, 12000.0) for i in range(1, 20)) + " global batch size: 64 |\n",
    "a batch across a line end": "".join(step_line(i, 12000.0) for i in range(1, 20)) + " iteration 30/ 99 | "
                                 "global batch size:\n64 |\n",
    "a step across a line end": "".join(step_line(i, 12000.0) for i in range(1, 20)) + " iteration\n31/ 99 | "
                                "global batch size: 64 |\n",
    "a step no interval logged": "".join(step_line(i, 12000.0, None) for i in range(1, 20)) + " iteration 50/ 99 | "
                                 "global batch size: 128 |\n",
}


@pytest.mark.parametrize("name", sorted(BATCH_LOGS))
def test_each_intervals_batch_reads_as_line_by_line(name):
    text = HEAD + BATCH_LOGS[name]
    lines = tl._Lines(text)
    megatron = tl.MEGATRON_STEP.points_of(lines, "log")
    batch_of, final = tl._megatron_batches(lines, megatron, "log")
    plain_of, plain_final = plain_batches(text, megatron)
    assert final == plain_final
    # None where every line states the final batch: each interval's lookup is then that batch.
    assert all((plain_of.get(step, final) == final) == (batch_of is None or batch_of.get(step, final) == final)
               for step, _ in megatron)


@pytest.mark.parametrize("line", [" iteration 1234567890123456789012/ 99 | global batch size: 128 |\n",
                                  " iteration 30/ 99 | global batch size: 12345678901234567890123 |\n"])
def test_a_count_too_long_on_a_batch_line_is_refused_as_before(line, tmp_path):
    path = tmp_path / "train.log"
    path.write_text(HEAD + "".join(step_line(i, 12000.0) for i in range(1, 20)) + line)
    with pytest.raises(CaseError, match=r"line 25: a count of \d+ digits"):
        read_log(path)


def as_newlines(text: str) -> str:
    """``text`` with each line ended by "\\n", wherever str.splitlines ends one."""
    return "".join(line + "\n" for line in text.splitlines())


@pytest.mark.parametrize("text", [
    HEAD,
    HEAD.replace("  log_interval", "\x0c  log_interval"),  # a form feed: a line end, as splitlines has it
    HEAD + "  num_layers ... 40\x0b  x\n",
    HEAD.replace("\n", "\x0c"),
    "[rank0]: [INFO] [config.py:1000:print]   train_batch_size ...... 64\n0:  hidden_size  4096\n  x  y  z\n",
])
def test_the_argument_dump_reads_as_the_pattern_over_the_text_of_its_lines(text):
    # Every line break splitlines knows ends an argument's line as "\n" does: the pattern over the text
    # matched "$" before "\n" alone, and a dump whose lines end in form feeds went unread.
    whole = {m.group(1): m.group(2) for m in tl.MEGATRON_ARG.finditer(as_newlines(text))}
    assert tl._arguments(tl._Lines(text)) == whole


def test_the_last_key_before_the_marker_is_the_one_read():
    # Two iterations on a line: the step is the one nearest the marker, as finditer's last.
    text = HEAD + "".join(step_line(i, 12000.0, extra="") .replace(" [2026", f" iteration {i + 5}/ 9 | [2026")
                          for i in range(1, 20))
    points = tl.MEGATRON_STEP.points(text, "log")
    assert [s for s, _ in points] == list(range(1, 20))
    assert re.search(r"iteration 6/ 9", text)


TITAN = ("[rank0]:[titan] 2026-11-30 10:00:00,000 - root - INFO - Model llama3 8B size: 8,030,261,248 total parameters\n"
         + "".join(f"[rank0]:[titan] 2026-11-30 10:00:{i:02d},000 - root - INFO - step: {{s{i}}}  loss:  8.1  "
                   f"grad_norm:  1.2  memory: 66.40GiB(83.9%)  tps: {{t{i}}}  tflops: 347.8  mfu: 35.2%\n"
                   for i in range(1, 9)))


def titan_log(tmp_path, **changed):
    figures = {f"s{i}": f"{i * 10:2d}" for i in range(1, 9)} | {f"t{i}": "6,000" for i in range(1, 9)}
    path = tmp_path / "titan.log"
    path.write_text(TITAN.format(**(figures | changed)))
    return path


def test_a_figure_with_thousands_separators_in_threes_is_read(tmp_path):
    assert read_log(titan_log(tmp_path, **{f"t{i}": "6,100" for i in range(4, 9)})).tokens_per_s_per_gpu == 6100.0
    assert read_log(titan_log(tmp_path, t5="12,345.5")).steps == 7


@pytest.mark.parametrize("tps", ["6,,0,0", "6,1", "60,00", "6,0000", "6,000,,"])
def test_a_figure_whose_commas_are_no_thousands_separators_is_refused_naming_its_line(tps, tmp_path):
    # "6,,0,0" was read as 600, "6,1" as 61.
    with pytest.raises(CaseError, match=rf"line 5: 'tps:' {re.escape(tps)}: expected a figure whose commas separate "
                                        r"thousands, in groups of three"):
        read_log(titan_log(tmp_path, t4=tps))


@pytest.mark.parametrize("step", ["-20", "x20", "-"])
def test_a_step_line_whose_step_is_no_whole_number_is_refused_naming_its_line(step, tmp_path):
    # "step: -20" was skipped without a word, and the run fitted on the other lines.
    with pytest.raises(CaseError, match=rf"line 4: 'step:' {re.escape(step)} before 'tps:': expected a whole step count"):
        read_log(titan_log(tmp_path, s3=step))


def test_a_megatron_iteration_misprinted_is_refused_and_deepspeeds_figure_with_a_comma_after_read(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(HEAD + "".join(step_line(i, 12000.0) for i in range(1, 9)).replace("iteration        5/",
                                                                                       "iteration -5/"))
    with pytest.raises(CaseError, match=r"line 10: 'iteration' -5 before 'elapsed time per iteration \(ms\):'"):
        read_log(path)
    # DeepSpeed's "CurrSamplesPerSec=12, MemAllocated=…": one comma after a figure is no separator.
    assert tl.DS_THROUGHPUT.points("epoch=0/micro_step=8/global_step=8, RunningAvgSamplesPerSec=11.9, "
                                   "CurrSamplesPerSec=12, MemAllocated=3.1GB, MaxMemAllocated=9.5GB\n") == [(8, 12.0)]


def test_deepspeeds_timers_and_torchtitans_parameters_read_commas_strictly(tmp_path):
    path = titan_log(tmp_path)
    path.write_text(path.read_text().replace("8,030,261,248", "8,03,261,248"))
    with pytest.raises(CaseError, match=r"line 1: 'total parameters' 8,03,261,248: expected a figure whose commas"):
        read_log(path)
    timers = "".join(f"[Rank 0] time (ms) | fwd: 100.0 | bwd: {'2,00' if i == 5 else '200.0'} | bwd_inner: 150.0 | "
                     f"bwd_allreduce: 50.0 | step: 10.0\n" for i in range(1, 9))
    path = tmp_path / "ds.log"
    path.write_text(timers)
    with pytest.raises(CaseError, match=r"line 5: a 'time \(ms\) \| fwd: … \| bwd: … \| step: …' timer line"):
        read_log(path)


def test_a_megatron_line_whose_iteration_is_whole_and_total_misprinted_is_read_as_before(tmp_path):
    # "iteration 20/ -1 |": the step is a whole number, only the total misprinted. The reader before the
    # refusal of misprinted steps passed the line over (no key), and so does this one; it was refused as
    # "'iteration' 20 …: expected a whole step count", naming a whole step as no whole step.
    path = tmp_path / "train.log"
    path.write_text(HEAD + "".join(step_line(i, 12000.0 if i != 5 else 99000.0) for i in range(1, 9))
                    .replace("iteration        5/ 1000", "iteration        5/ -1"))
    reading = read_log(path)
    assert reading.step_time_s == 12.0 and reading.steps == 4
    path.write_text(path.read_text().replace("iteration        5/ -1", "iteration      5.5/ -1"))
    with pytest.raises(CaseError, match=r"line 10: 'iteration' 5\.5 before 'elapsed time per iteration \(ms\):'"):
        read_log(path)


@pytest.mark.parametrize("end", ["\n", "\x0c", "\x1c", "\x85", "\u2028"])
def test_a_one_line_log_ending_at_any_line_break_reads_its_arguments_as_at_a_newline(end, tmp_path):
    # Its one line is "line\x0c": the argument line ending at "\n" is read and its "nan" refused, and so it
    # is at a form feed (it was passed over, the log refused as holding no step time past warm-up instead).
    path = tmp_path / "one.log"
    path.write_text("[iteration 5/ 10 | elapsed time per iteration (ms): 100] hidden_size .. nan" + end,
                    encoding="utf-8")
    with pytest.raises(CaseError, match="hidden_size: the argument dump gives 'nan'"):
        read_log(path)
    lines = tl._Lines("  hidden_size .... 4096" + end)
    assert tl._arguments(lines) == {"hidden_size": "4096"}


@pytest.mark.parametrize("step", ["5.5", "3,5", "1,001"])
def test_a_step_with_more_figure_after_its_digits_is_refused_naming_its_line(step, tmp_path):
    # "step: 5.5" was read as step 5 and refused as "step 5: comes after step 20", naming no line.
    with pytest.raises(CaseError, match=rf"line 4: 'step:' {re.escape(step)} before 'tps:': expected a whole step count"):
        read_log(titan_log(tmp_path, s3=step))


def test_a_deepspeed_global_step_that_is_no_whole_number_is_refused_naming_its_line(tmp_path):
    # "global_step=4.5" was read as step 4, and the run fitted.
    line = ("epoch=0/micro_step={i}/global_step={g}, RunningAvgSamplesPerSec=11.9, CurrSamplesPerSec=12, "
            "MemAllocated=3.1GB, MaxMemAllocated=9.5GB\n")
    path = tmp_path / "ds.log"
    path.write_text("".join(line.format(i=i, g="4.5" if i == 4 else i) for i in range(1, 9)))
    with pytest.raises(CaseError, match=r"line 4: 'global_step=' 4.5 before 'CurrSamplesPerSec=': expected a whole step"):
        read_log(path)
    path.write_text("".join(line.format(i=i, g=i) for i in range(1, 9)))
    assert read_log(path).steps == 5


@pytest.mark.parametrize("tps", ["0,667", "012,345"])
def test_a_grouped_figure_whose_first_group_starts_with_zero_is_refused(tps, tmp_path):
    # "0,667" (a decimal comma) was read as 667.
    with pytest.raises(CaseError, match=rf"line 5: 'tps:' {re.escape(tps)}: expected a figure whose commas separate"):
        read_log(titan_log(tmp_path, t4=tps))


def ds_timer_log(tmp_path, bwd: str):
    """Eight optimizer steps of DeepSpeed's wall-clock breakdown, the fifth's bwd printed as ``bwd``."""
    timers = "".join(f"[Rank 0] time (ms) | fwd: 100.0 | bwd: {bwd if i == 5 else '458.2'} | bwd_inner: 400.0 | "
                     f"bwd_allreduce: 58.2 | step: 10.0\n" for i in range(1, 9))
    path = tmp_path / "ds.log"
    path.write_text(timers)
    return path


@pytest.mark.parametrize("bwd", ["458.2,", "458,"])
def test_a_deepspeed_timer_with_one_comma_after_its_figure_is_read_as_currsamplespersecs_is(bwd, tmp_path):
    # "CurrSamplesPerSec=12," reads as 12; "bwd: 458.2," refused the whole log. The step is fwd + bwd + step
    # (bwd holds bwd_inner and bwd_allreduce): 100 + 458.2 + 10 ms on every step past warm-up but the fifth,
    # whose figure is the median's all the same (4 of 5 intervals at 568.2 ms).
    reading = read_log(ds_timer_log(tmp_path, bwd))
    assert reading.steps == 5 and reading.step_time_s == pytest.approx((100.0 + 458.2 + 10.0) / 1e3)


@pytest.mark.parametrize("bwd", ["458.2,,", "458,,", ",", "4,58.2,"])
def test_a_deepspeed_timer_with_more_than_one_comma_after_its_figure_is_refused_naming_its_line(bwd, tmp_path):
    with pytest.raises(CaseError, match=r"line 5: a 'time \(ms\) \| fwd: … \| bwd: … \| step: …' timer line"):
        read_log(ds_timer_log(tmp_path, bwd))


@pytest.mark.parametrize("end", ["\x0c", "\x0b", "\x1e", "\x85", "\u2028", "\u2029"])
@pytest.mark.parametrize("where", ["every line", "the step lines"])
def test_a_megatron_log_whose_lines_end_at_any_line_break_reads_as_at_newlines(end, where, tmp_path):
    # A log whose lines end in form feeds was refused as holding no step time where its header's lines ended
    # in "\n" (all after the last "\n" cut as one unfinished line), and its argument dump went unread (its
    # model unchecked against the case) where none did; CR and CRLF read. The same log at "\n": 8 intervals
    # past warm-up at 12,000 ms, 32 layers, a batch of 128.
    steps = "".join(step_line(i, 12000.0) for i in range(1, 12))
    text = (HEAD + steps).replace("\n", end) if where == "every line" else HEAD + steps.replace("\n", end)
    path = tmp_path / "train.log"
    path.write_text(text, encoding="utf-8")
    reading = read_log(path)
    path.write_text(HEAD + steps)
    at_newlines = read_log(path)
    assert (reading.step_time_s, reading.steps, reading.stated) == (12.0, 8, at_newlines.stated)
    assert ("num_layers", 32.0) in reading.stated


def test_an_error_names_the_line_as_every_reading_numbers_lines(tmp_path):
    # Line 4 by splitlines (the first line holds two form feeds: three lines), where counting "\n" said 2.
    path = titan_log(tmp_path)
    path.write_text("a\x0cb\x0cc\n" + path.read_text().replace("8,030,261,248", "8,03,261,248"))
    with pytest.raises(CaseError, match=r"line 4: 'total parameters' 8,03,261,248: expected a figure whose commas"):
        read_log(path)
    path = ds_timer_log(tmp_path, "-5")
    path.write_text("a\x0cb\n" + path.read_text())
    with pytest.raises(CaseError, match=r"line 7: a 'time \(ms\) \| fwd: … \| bwd: … \| step: …' timer line"):
        read_log(path)


def test_a_line_of_the_lowest_ranks_is_named_by_its_line_in_the_file(tmp_path):
    # Two ranks' torchtitan lines interleaved: rank 0's sixth step is the file's line 11; it was named as line
    # 6, its number among rank 0's lines alone.
    lines = [f"[rank{rank}]:[titan] step: {i * 10}  loss:  8.1  memory: {'nan' if (rank, i) == (0, 6) else '66.40'}"
             f"GiB(83.9%)  tps: 6,000  tflops: 347.8  mfu: 35.2%\n" for i in range(1, 9) for rank in (0, 1)]
    path = tmp_path / "ranks.log"
    path.write_text("".join(lines))
    with pytest.raises(CaseError, match=r"line 11: 'memory:' nanGiB"):
        read_log(path)
