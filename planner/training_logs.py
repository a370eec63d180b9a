"""A run's step time and peak memory, read from its training log as the engine prints it.

- Megatron-LM (``megatron/training/training.py``, ``training_log``): per logged interval
  ``iteration N/ M | … | elapsed time per iteration (ms): T | throughput per GPU (TFLOP/s/GPU): F |
  … | global batch size: B |``; once, after the first iterations, ``report_memory``'s
  ``[Rank r] (after N iterations) memory (MB) | allocated: … | max allocated: … | reserved: … |
  max reserved: X`` (``megatron/training/utils/common_utils.py``; MB = 2^20 bytes; its max reserved
  read, the peak the cost model prices), printed by every data-parallel rank 0; and at start the
  argument dump (``  num_layers ........ 32``).
- torchtitan (``torchtitan/components/metrics.py``, ``MetricsProcessor.log``): ``step: N  loss: …
  memory: X GiB(P%)  tps: T  tflops: F  mfu: M%`` (``tps`` is tokens per second per GPU;
  ``memory`` the allocator's max reserved), and at start ``Model … size: 8,030,261,248 total
  parameters`` and its mesh (``distributed/parallel_dims.py``: ``Building device mesh with parallelism:
  pp=1, dp_replicate=1, dp_shard=32, cp=1, tp=2, ep=1``). Its validation lines (``log_validation``: ``validate step: N … tps: …``, at step 1
  and every ``validation.freq`` steps) time forward passes alone and are not read. Every rank logs
  its steps: behind torchrun's or Slurm's labels (``[rank3]:``, ``[default3]:``, ``srun -l``'s
  ``3: ``) the lowest label's lines are read; where several ranks' lines carry one label or none
  (one ``[rank0]:`` per node under ``--local-ranks-filter 0``, a bare ``torchrun``), each step's
  figures are the ranks' (median tps, largest memory).
- DeepSpeed (``deepspeed/utils/timer.py``, ``ThroughputTimer``): ``epoch=0/micro_step=N/
  global_step=G, RunningAvgSamplesPerSec=…, CurrSamplesPerSec=S, MemAllocated=…GB,
  MaxMemAllocated=XGB`` (samples of the global batch per second; GB = 2^30 bytes; its only peak the
  allocated one, so read as such: ``LogReading.peak_scope``; logged at level info); the pipeline
  engine's ``steps: N loss: … iter time (s): T samples/sec: S``
  (``runtime/pipe/engine.py``, ``train_batch``: printed by rank 0 whatever the log level); without
  either, the engine's ``wall_clock_breakdown`` timers per optimizer step, ``time (ms) | fwd: … |
  bwd: … | bwd_inner: … | bwd_allreduce: … | step: …`` (``EngineTimers.global_timers``; ``bwd``
  holds ``bwd_inner`` and ``bwd_allreduce``, so the step is fwd + bwd + step); and its config dump
  (``  train_batch_size ...... 64``, ``  zero_optimization_stage ...... 3``).

Warm-up is dropped: the first logged interval (the first iterations' compilation, allocator
growth and NCCL set-up) and every interval ending at one of the first WARMUP_STEPS steps. Where
the first logged interval is iteration 1 alone, Megatron-LM's next one holds it too: its
``training_log`` resets neither the interval timer nor the iteration count after the first
iteration (``should_reset = not is_first_iteration``), so that interval is warm-up as well. The
step time is the median of the rest; under Megatron-LM's batch ramp-up, of the intervals at the
final global batch. Steps must rise from line to line: a log whose steps go back holds more than
one run. A figure's commas are thousands' separators in groups of three, and a step line's step a
whole number: a line holding the marker and either misprinted is refused, naming it.
"""

from __future__ import annotations

import math
import re
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

WARMUP_STEPS = 3

# A figure as a log prints it, found loosely (any commas among its digits, one after it: DeepSpeed's
# "CurrSamplesPerSec=12, …") and read strictly (STRICT_NUMBER): "tps: 6,,0,0" was read as 600.
NUMBER = r"([0-9][0-9,]*(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)"
# Thousands separated by commas in groups of three (torchtitan's "tps: 7,012", "8,030,261,248 total
# parameters"), or none.
# A grouped figure's first group starts with no 0: "0,667" is a decimal comma (a locale's 0.667), which
# was read as 667 samples/s, 1,000x the run's.
STRICT_NUMBER = re.compile(r"(?:[1-9][0-9]{0,2}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
MEGATRON_BATCH = re.compile(r"global batch size:\s*(\d+)")
# The facts of Megatron-LM's argument dump a run's case must state alike (team_runs.STATED_IN_CASE).
MEGATRON_STATED = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
                   "padded_vocab_size", "num_experts", "moe_router_topk", "seq_length", "global_batch_size",
                   "micro_batch_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                   "world_size", "context_parallel_size", "expert_model_parallel_size", "data_parallel_size")
# The settings of Megatron-LM's argument dump a run's case must agree with (team_runs.runs_from_logs).
MEGATRON_SETTINGS = ("bf16", "fp16", "fp8", "use_distributed_optimizer", "use_torch_fsdp2", "use_megatron_fsdp",
                     "use_custom_fsdp", "data_parallel_sharding_strategy",
                     "recompute_granularity", "sequence_parallel", "virtual_pipeline_model_parallel_size",
                     "tp_comm_overlap", "untie_embeddings_and_output_weights")
# An argument dump's line, Megatron-LM's and DeepSpeed's alike: "  {name} {dots} {value}", the dots
# filling the name to a width (none past it: two spaces), behind any logger or rank prefixes
# ("[INFO] [config.py:1000:print]", torchrun's "[rank0]:", srun -l's "0:").
MEGATRON_ARG = re.compile(r"^(?:[ \t]*(?:\[[^\]\n]*\]:?|\d{1,9}:))*[ \t]*([a-z_0-9]+) \.* [ \t]*(\S+)[ \t]*$",
                          re.MULTILINE)
TITAN_PARAMETERS = re.compile(r"size:\s*" + NUMBER + r"\s*total parameters")
# torchtitan's mesh, printed at start by every rank (distributed/parallel_dims.py, ParallelDims.build_mesh):
# "Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=32, cp=1, tp=2, ep=1".
# The ZeRO stage the mesh's data-parallel degrees make (_titan_mesh), as a statement names it.
TITAN_ZERO = "dp_shard·cp's zero_stage"
TITAN_MESH = re.compile(r"Building device mesh with parallelism: pp=(\d+), dp_replicate=(\d+), dp_shard=(\d+), "
                        r"cp=(\d+), tp=(\d+), ep=(\d+)")
# DeepSpeed's wall-clock breakdown: "time (ms)" and each timer's "| name: figure". Any figure after a
# timer's name: one that is no number ("nan", "N/A", a negative) is refused naming its line, not
# skipped (a skipped line also moved which lines counted as warm-up).
DS_TIMERS = re.compile(r"time \(ms\)((?: \| [a-z_]+: [^\s|]*)+)")
DS_TIMER = re.compile(r" \| ([a-z_]+): ([^\s|]*)")
# The timers whose sum is the step: the forward, the backward (its inner part and its all-reduce
# inside it) and the optimizer step (``deepspeed/utils/timer.py``: fwd, bwd, step).
DS_STEP_TIMERS = ("fwd", "bwd", "step")


@dataclass(frozen=True)
class Entry:
    """A figure a log line prints after ``marker``, and the step (or rank) the nearest ``key``
    before it on the line names: read from the marker back, so a line of many keys and no
    marker costs one pass, where a pattern ``key.*?marker`` tried from every key (quadratic: a
    400 KB line took 40 s)."""

    key: re.Pattern
    marker: str
    unit: str = ""  # what must follow the figure (GiB, GB)
    also: str = ""  # what the line must hold besides
    # The runs file's measurement the figure is (published_runs.ROW_MEASURES), and how many of the
    # figure's unit make one of it (ms a second: 1000): each line held to its bounds, from MIN_FIGURE,
    # not only the median (a step of 1e300 ms among others was fitted).
    measure: str = ""
    per: float = 1.0
    # The key as a line may misprint it, its count no whole number ("step: -20", "iteration 1.5/"): a line
    # holding the marker and this, not the key, before it is refused naming the line (it was skipped, and the
    # run fitted on the other lines); ``named`` is how the refusal names the key.
    loose: Optional[re.Pattern] = None
    named: str = ""

    def points(self, text: str, src: str = "log") -> list[tuple[int, float]]:
        """(step or rank, figure) of every line that holds the key and the marker; a CaseError naming
        the line where the marker is followed by no positive figure (a step time of nan, -15000 or 0
        was skipped, or counted, and the run fitted on the others)."""
        return self.points_of(_Lines(text), src)

    def points_of(self, lines: "_Lines", src: str = "log") -> list[tuple[int, float]]:
        """``points`` of a log already split (``_Lines``): a 200 MB log was split, and its every line
        scanned, once per entry (25 s of its 30); only the lines holding the marker are read here."""
        from .errors import CaseError
        from .limits import MIN_FIGURE
        from .published_runs import ROW_MEASURES

        marker, also, unit, after = self.marker, self.also, self.unit, len(self.marker)
        # A figure within [least, most] is positive and finite (a bound of its own, or the least and most floats).
        least, most = (MIN_FIGURE * self.per, ROW_MEASURES[self.measure] * self.per) if self.measure \
            else (5e-324, sys.float_info.max)
        digits = MAX_COUNT_DIGITS
        key_at, figure_at = self.key.search, _FIGURE.match
        found: list[tuple[int, float]] = []
        if marker not in lines.text:
            return found
        append = found.append
        for number, line in enumerate(lines.lines, 1):
            # Inline, each line's work a few calls (a 1.45M-line log's read in 2 s, not 25); a figure out of
            # its bounds, or a count too long to read, is refused as by _figure, _count and the bounds below.
            at = line.rfind(marker)
            if at < 0 or also and also not in line:
                continue
            # The last key before the marker: as finditer's last, each search from the one before's end.
            last = key_at(line, 0, at)
            if last is None:
                if self.loose is not None:
                    _no_misprinted_key(self, self.loose, line, at, src, number)
                continue
            while (later := key_at(line, last.end(), at)) is not None:
                last = later
            value = figure_at(line, at + after)
            if value is None or unit and not line.startswith(unit, value.end()):
                written = line[at + after:].strip().split(" ", 1)[0]
                raise CaseError(src, f"line {number}", f"'{marker}' {_clipped(written) or 'with nothing'}: "
                                                       f"expected a positive figure{' in ' + unit if unit else ''}")
            written = value.group(1)
            figure = float(written) if "," not in written else _grouped(written, src, number, marker)
            if not least <= figure <= most:
                figure = _figure(written, src, number, marker)
                if figure <= 0:
                    raise CaseError(src, f"line {number}", f"'{marker}' {_clipped(written.rstrip(','))}: expected a "
                                                           "positive figure")
                if self.measure and not least <= figure <= most:
                    raise CaseError(src, f"line {number}", f"'{marker}' {_clipped(written.rstrip(','))}: "
                                                           f"expected a figure from {least:g} to {most:g}")
            step = last.group(1)
            append((int(step) if len(step) <= digits else _count(step, src, number), figure))
        return found


# Where ``str.splitlines`` ends a line: the one rule by which the reader splits a log and numbers its lines
# (a form feed, a vertical tab, the separators \x1c-\x1e, NEL and the Unicode line and paragraph separators
# as well as "\n" and "\r"). Counting "\n" alone named the wrong line of a log whose lines end in form
# feeds, and cut all of its lines after the last "\n" as one unfinished line.
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


class _Lines:
    """A log's text split into lines once (``str.splitlines``, as every reading of it numbers them),
    and, for each marker asked for, the lines holding it: a marker the text lacks costs one scan of
    the text, not one of its lines."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.splitlines()
        self._holding: dict[str, list[tuple[int, str]]] = {}

    def holding(self, marker: str) -> list[tuple[int, str]]:
        """(line number from 1, line) of every line holding ``marker``."""
        if marker not in self._holding:
            self._holding[marker] = [(number, line) for number, line in enumerate(self.lines, 1) if marker in line] \
                if marker in self.text else []
        return self._holding[marker]


def _megatron_batches(lines: _Lines, megatron: list[tuple[int, float]],
                      src: str) -> tuple[Optional[dict[int, int]], Optional[int]]:
    """(each logged interval's global batch, from its own line, by iteration; the batch the run ends at:
    its last interval's that states one) of a Megatron-LM log: under a batch ramp-up
    (--rampup-batch-size) the early intervals ran smaller batches in less time, and were priced at the
    full batch; a log cut off mid-line, the last interval's batch lost, excluded every interval that
    stated its own. None for the first where every line states one batch (any interval's is then the
    final one): two searches of the text, where reading each of a 200 MB log's lines took 2 s."""
    step_at, batch_at = MEGATRON_STEP.key.search, MEGATRON_BATCH.search
    text = lines.text
    first = batch_at(text)
    # Every batch the text states is the first's, and no count is too long to read (each line's reading
    # below would refuse it): any line's batch is the first's.
    if first is None or len(first.group(1)) <= MAX_COUNT_DIGITS and \
            not re.search(r"global batch size:\s*(?!" + first.group(1) + r"(?!\d))\d", text) and \
            not re.search(r"iteration\s+\d{" + str(MAX_COUNT_DIGITS + 1) + r"}", text):
        if first is None:
            return None, None
        steps = {step for step, _ in megatron}
        for line in reversed(lines.lines):  # the last line stating an interval's batch, most often the last line
            if "global batch size:" in line and (m := step_at(line)) and batch_at(line) and int(m.group(1)) in steps:
                return None, int(first.group(1))
        return None, None
    batch_of = {}
    for number, line in lines.holding("global batch size:"):
        if (m := step_at(line)) and (b := batch_at(line)):
            step, batch = m.group(1), b.group(1)
            if len(step) > MAX_COUNT_DIGITS or len(batch) > MAX_COUNT_DIGITS:
                step, batch = _count(step, src, number), _count(batch, src, number)
            batch_of[int(step)] = int(batch)
    return batch_of, next((batch_of[step] for step, _ in reversed(megatron) if step in batch_of), None)


def _arguments(lines: _Lines) -> dict[str, str]:
    """An argument dump's ``{name: value}`` (``MEGATRON_ARG``), the last line of a name counting, matched
    line by line (a pass of the pattern over a 200 MB log's text, tried at each of its characters, took
    5 s): the lines as every reading splits them, so a dump whose lines end in form feeds is read (over
    the text, "$" matched before "\\n" alone, and the dump went unchecked against the case)."""
    match = MEGATRON_ARG.match
    return {m.group(1): m.group(2) for m in filter(None, map(match, lines.lines))}


_FIGURE = re.compile(r"\s*" + NUMBER + r"\s*")
MEGATRON_STEP = Entry(re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|"), "elapsed time per iteration (ms):",
                      measure="iteration_time_s", per=1000.0,
                      loose=re.compile(r"iteration\s+([^\s/|]*)\s*/\s*[^\s/|]*\s*\|"), named="iteration")
# Its max reserved, the line's last peak: what the cost model prices (cost_models.memory.stage_memories).
# Its max allocated, read before, was fitted against the reserved prediction and pulled the fragmentation to 0.
MEGATRON_MEMORY = Entry(re.compile(r"\[Rank (\d+)\]"), "max reserved:", also="memory (MB)",
                        measure="memory_gb_per_gpu", per=1024.0)
# A training step's line, not a validation's ("validate step: N").
# A step is a whole count: "step: 5.5" and "global_step=4.5" were read as steps 5 and 4 (the rest of
# the figure after "\b"), the one refused as "step 5: comes after step 20" naming no line, the other
# fitted; not followed by more of a figure, they are left to the loose key, which names the line.
WHOLE_STEP = r"(\d+)(?![\d.,]*\d)"
TITAN_STEP_KEY = re.compile(r"(?<!validate )step:\s*" + WHOLE_STEP)  # after a colour code: no \b before
TITAN_STEP_LOOSE = re.compile(r"(?<!validate )step:\s*(\S*)")
TITAN_STEP = Entry(TITAN_STEP_KEY, "tps:", measure="tokens_per_sec_per_gpu", loose=TITAN_STEP_LOOSE, named="step:")
TITAN_MEMORY = Entry(TITAN_STEP_KEY, "memory:", "GiB", measure="memory_gb_per_gpu", loose=TITAN_STEP_LOOSE,
                     named="step:")
DS_STEP_LOOSE = re.compile(r"global_step=([^\s,]*)")
DS_THROUGHPUT = Entry(re.compile(r"global_step=" + WHOLE_STEP), "CurrSamplesPerSec=", loose=DS_STEP_LOOSE, named="global_step=")
DS_MEMORY = Entry(re.compile(r"global_step=" + WHOLE_STEP), "MaxMemAllocated=", "GB", measure="memory_gb_per_gpu",
                  loose=DS_STEP_LOOSE, named="global_step=")
DS_PIPE_STEP = Entry(re.compile(r"\bsteps: (\d+) "), "iter time (s):", measure="iteration_time_s",
                     loose=re.compile(r"\bsteps: (\S*) "), named="steps:")


@dataclass(frozen=True)
class LogReading:
    """What a log says of its run: the engine, the median step time after warm-up, the steps
    behind it, the peak (GiB, the allocator's), whose rank it is, and the facts it states of the
    model and batch (to hold against the case)."""

    engine: str
    step_time_s: Optional[float] = None  # Megatron-LM, DeepSpeed's timers
    tokens_per_s_per_gpu: Optional[float] = None  # torchtitan
    samples_per_s: Optional[float] = None  # DeepSpeed
    steps: int = 0
    peak_gib: Optional[float] = None
    peak_of_rank_0_only: bool = False
    # Which of the allocator's peaks peak_gib is (team_runs.PEAK_SCOPES): Megatron-LM's max reserved and
    # torchtitan's memory are the reserved one, DeepSpeed's MaxMemAllocated the allocated one.
    peak_scope: str = "reserved"
    stated: tuple[tuple[str, float], ...] = ()  # (what, value): layers, hidden, parameters, global batch…
    # Megatron-LM's settings as its argument dump prints them (bf16 True, recompute_granularity full…).
    settings: tuple[tuple[str, str], ...] = ()


# The labels a launcher puts before each rank's lines: srun -l's task ("3: ", right-aligned to the
# widest task's digits: " 3: " beside "12: "), then torchrun's role and rank ("[rank3]:" under
# torchtitan's --role rank, "[default3]:" under --tee's default role). A clock's "09:58:00" is no
# label: srun's is followed by no digit.
RANK_LABEL = re.compile(r"^(?: *(\d{1,9}):(?!\d) ?)?(?:\[[A-Za-z_]*?(\d{1,9})\]:)?")


def _lowest_rank_lines(text: str, lines: Optional[list[str]] = None) -> str:
    """A torchtitan log of every rank's lines, each behind a launcher's label (``RANK_LABEL``), as its
    lowest label's: torchtitan logs its steps on every rank, and the ranks' steps one after another
    were refused as "more than one run". ``text`` itself where its lines carry one label or none."""
    def label(line: str) -> Optional[tuple[int, int]]:
        m = RANK_LABEL.match(line)  # its parts optional: it matches every line, empty where there is no label
        return None if m is None or not m.group(0) else (int(m.group(1) or 0), int(m.group(2) or 0))
    lines = text.splitlines() if lines is None else lines  # ``lines``: ``text``'s, split once by the reader
    each = [label(line) for line in lines]
    labels = {each_label for each_label in each if each_label is not None}
    if len(labels) < 2:
        return text
    lowest = min(labels)
    # The other ranks' lines left empty, not out: a line refused in the lowest rank's is named by its number
    # in the file (a torchtitan "memory: nan" on the log's line 11 was named as line 6).
    return "\n".join(line if mine in (None, lowest) else "" for line, mine in zip(lines, each))


def _per_step(points: list[tuple[int, float]], combine) -> list[tuple[int, float]]:
    """Each step's figures combined (``combine``: the median of the ranks' tps, the largest memory),
    where several ranks log every step under one label or none (a node's "[rank0]:" each under
    --local-ranks-filter 0, a bare torchrun): every step logged alike often, the last possibly fewer
    (a log cut off). ``points`` as they are otherwise: a restart's steps, logged twice over a stretch
    alone, stay refused as more than one run."""
    counts: dict[int, list[float]] = {}
    for step, figure in points:
        counts.setdefault(step, []).append(figure)
    times = [len(v) for v in counts.values()]
    # Ranks whose lines interleave step by step keep the steps in order, whichever rank missed a line or
    # began later (DeepSpeed's every-rank lines); ranks' runs one after the other log every step alike often.
    interleaved = all(a <= b for (a, _), (b, _) in zip(points, points[1:]))
    if len(counts) < 2 or max(times) < 2 or \
            not interleaved and (len(set(times[:-1])) != 1 or times[-1] > times[0]):
        return points
    return sorted((step, combine(figures)) for step, figures in counts.items())


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _strict(text: str) -> bool:
    """Whether ``text`` (a match of NUMBER) is a figure as an engine prints one: its commas thousands'
    separators in groups of three, one after it at most (DeepSpeed's "=12, …")."""
    return STRICT_NUMBER.fullmatch(text[:-1] if text.endswith(",") else text) is not None


def _grouped(text: str, src: str, line: int, what: str) -> float:
    """A figure with commas the log prints after ``what`` at ``line``, or a CaseError naming the line
    where they are no thousands' separators ("6,,0,0" was read as 600, "7,0" as 70)."""
    if not _strict(text):
        from .errors import CaseError

        raise CaseError(src, f"line {line}", f"'{what}' {_clipped(text)}: expected a figure whose commas separate "
                                             "thousands, in groups of three (7,012)")
    return _num(text)


def _no_misprinted_key(entry: "Entry", loose: re.Pattern, line: str, at: int, src: str, number: int) -> None:
    """A CaseError naming ``line`` where it holds the entry's key misprinted (``Entry.loose``) before the
    marker at ``at``: a step line whose step is no whole number ("step: -20")."""
    from .errors import CaseError

    bad = None
    for bad in loose.finditer(line, 0, at):
        pass
    # A whole step is no misprinted step: Megatron-LM's "iteration 20/ -1 |" misprints its total, not its
    # step, and is passed over as before (it was refused as "'iteration' 20 …: expected a whole step count").
    if bad is not None and not _WHOLE.fullmatch(bad.group(1)):
        raise CaseError(src, f"line {number}", f"'{entry.named}' {_clipped(bad.group(1)) or 'with nothing'} before "
                                               f"'{entry.marker}': expected a whole step count")


def _timer_total(match: re.Match) -> Optional[float]:
    """The sum of a DeepSpeed timer line's fwd, bwd and step figures (``DS_STEP_TIMERS``); NaN where
    one is no non-negative number (refused by the reader, naming the line); None where the line
    lacks one of them (the micro-step timers' ``fwd_microstep`` line, another list of timers)."""
    timers = dict(DS_TIMER.findall(match.group(1)))
    if not all(name in timers for name in DS_STEP_TIMERS):
        return None
    figures = []
    for name in DS_STEP_TIMERS:
        # Read as any figure after a marker is (_strict): one comma after it is punctuation, as after
        # DeepSpeed's "CurrSamplesPerSec=12,"; "458.2,," or "2,00" is no figure.
        if not _strict(timers[name]):
            return math.nan
        figures.append(_num(timers[name]))
    return sum(figures)


# The most digits a step, rank or batch count a log prints may have: Python refuses to read an
# integer of more than 4,300 (a traceback), and no run counts past 10^18.
MAX_COUNT_DIGITS = 18


def _count(text: str, src: str, line: int) -> int:
    """A step, rank or batch count the log prints at ``line``, or a CaseError naming the line."""
    if len(text) > MAX_COUNT_DIGITS:
        from .errors import CaseError  # here: an import a line took a fifth of a 200 MB log's reading

        raise CaseError(src, f"line {line}", f"a count of {len(text)} digits ({_clipped(text)}): expected at most "
                                             f"{MAX_COUNT_DIGITS}")
    return int(text)


def _clipped(text: str, most: int = 12) -> str:
    return text if len(text) <= most else text[:most] + "…"


def _figure(text: str, src: str, line: int, what: str) -> float:
    """A figure the log prints after ``what`` at ``line``: finite, or a CaseError naming the line
    (a 5,000-digit time was read as infinity and fitted)."""
    value = _grouped(text, src, line, what) if "," in text else _num(text)
    if not math.isfinite(value):
        from .errors import CaseError

        raise CaseError(src, f"line {line}", f"'{what}' {_clipped(text)}: expected a finite figure")
    return value


def _after_warmup(points: list[tuple[int, float]]) -> list[float]:
    """The values of logged intervals after the first and past the first WARMUP_STEPS steps."""
    return [v for i, (step, v) in enumerate(points) if i > 0 and step > WARMUP_STEPS]


def _megatron_starts(points: list[tuple[int, float]], log_interval: Optional[str]) -> tuple[set[int], set[int]]:
    """(the iterations a ``train()`` call logged alone after the log's first, the intervals after each
    of them, its own first included): Megatron-LM logs the first iteration of every ``train()`` call,
    a resumed run's (1001) as a fresh one's (1), and resets neither the interval's timer nor its count
    then (training.py: ``should_reset = not is_first_iteration``), so the next interval averages it
    back in. A later start, in a requeued job's log whose iterations rise past the restart, is an
    iteration off the log interval (the argument dump's ``log_interval``, else the commonest gap)."""
    steps = [step for step, _ in points]
    if len(steps) < 2:
        return set(), set()
    # The first gap is short by the iteration logged alone (1 → 10): the commonest of the rest, the longest of
    # those as common.
    gaps = [b - a for a, b in zip(steps, steps[1:])][1:] or [steps[1] - steps[0]]
    interval = int(log_interval) if log_interval is not None and log_interval.isdigit() and int(log_interval) > 0 \
        else max(counts := Counter(gaps), key=lambda gap: (counts[gap], gap))
    later = [i for i in range(1, len(steps)) if interval > 1 and steps[i] % interval]
    starts = {steps[i] for i in later}
    carried = {steps[i + 1] for i in [0] + later if i + 1 < len(steps)}
    return starts, carried


def _in_order(points: list[tuple[int, float]], src: str, what: str) -> list[tuple[int, float]]:
    """``points`` whose steps rise from line to line, or a CaseError naming the step that does not:
    a log of two runs (a restart from a checkpoint, two logs run together) was fitted as one, its
    median taken over both."""
    from .errors import CaseError

    steps = [step for step, _ in points]
    if all(map(int.__lt__, steps, steps[1:])):  # at C speed: a 1.45M-step log's took a fifth of a second
        return points
    for (before, _), (step, _) in zip(points, points[1:]):
        if step <= before:
            raise CaseError(src, f"{what} {step}", f"comes after {what} {before}: the log holds more than one run "
                                                   "(a restart, or logs run together); give each run's log on its own")
    return points


# A case file is small; a file larger than this is read as the log it was given as.
CASE_FILE_BYTES = 2**20


def is_case_file(path: Path) -> bool:
    """Whether ``path``, given as a training log, is a case file: a YAML (or JSON) mapping holding a case's
    model, cluster or training section, where a log is lines of an engine's output that parse as no such
    mapping. `calibrate --from-logs L --case A B` binds B as a log (--case takes one file; the command's
    positional files are the logs), and B was then read as one: "holds no step time", or "the log states
    global_batch_size …" against A. Judged by content, not by the extension (a log named run.yaml is a log)."""
    import yaml

    from .errors import CaseError
    from .inputs import read_bytes

    try:
        data = yaml.safe_load(read_bytes(path, CASE_FILE_BYTES).decode("utf-8-sig"))
    except (CaseError, UnicodeDecodeError, yaml.YAMLError, RecursionError, ValueError):
        return False  # unreadable, too large, or no YAML: read_log says what it is
    return isinstance(data, dict) and any(section in data for section in ("model", "cluster", "training"))


def read_log(path: Path) -> LogReading:
    """The facts of a training log (module docstring); a CaseError naming the file and what was
    looked for where it holds no step time past warm-up."""
    from .errors import CaseError

    from .inputs import read_bytes
    from .limits import MAX_LOG_BYTES

    src = str(path)
    # A regular file only (a FIFO waited for ever, /dev/zero was read to the bound), of at most the bound.
    data = read_bytes(path, MAX_LOG_BYTES, "a training log (give the lines of the steps to fit)")
    text = data.decode("utf-8", errors="replace")  # logs carry progress bars and colour codes
    # Windows' line ends, and a progress bar's carriage returns, end lines as a newline does (an
    # argument dump's value read with its "\r" was no number, and its check against the case skipped).
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    last_break = max(map(text.rfind, LINE_BREAKS))
    if 0 <= last_break < len(text) - 1:
        # A last line with no end is one the run was killed writing: a figure in it may be cut short
        # (torchtitan's "tps: 7,0" read as 70, "memory: 62" refused the whole log). Left out.
        text = text[:last_break + 1]
    lines = _Lines(text)  # split once: each entry reads the lines holding its marker
    megatron = MEGATRON_STEP.points_of(lines, src)
    titan = TITAN_STEP.points_of(lines, src)
    deepspeed = DS_THROUGHPUT.points_of(lines, src)
    pipe = DS_PIPE_STEP.points_of(lines, src)
    timed = [(number, total) for number, line in lines.holding("time (ms)") for m in DS_TIMERS.finditer(line)
             if (total := _timer_total(m)) is not None]
    for number, total in timed:
        if not math.isfinite(total) or total <= 0:
            raise CaseError(src, f"line {number}",
                            "a 'time (ms) | fwd: … | bwd: … | step: …' timer line: expected milliseconds, none negative, whose sum "
                            "is positive")
    timers = [(i + 1, total) for i, (_, total) in enumerate(timed)]  # each line a step
    if titan and (megatron or deepspeed or pipe or timers):
        # Megatron-DeepSpeed prints Megatron-LM's lines and DeepSpeed's together; torchtitan beside
        # either is two runs' logs in one file, and the steps of one would be fitted as the other's.
        other = "Megatron-LM's 'elapsed time per iteration'" if megatron else "DeepSpeed's step lines"
        raise CaseError(src, "", f"holds torchtitan's 'tps:' step lines and {other}: give each run's log "
                                 f"on its own")
    if megatron:
        megatron = _in_order(megatron, src, "iteration")
        # Each interval's global batch, from its own line: under a batch ramp-up (--rampup-batch-size)
        # the early intervals ran smaller batches in less time, and were priced at the full batch.
        batch_of, final = _megatron_batches(lines, megatron, src)
        args = _arguments(lines)
        starts, carried = _megatron_starts(megatron, args.get("log_interval"))
        times = _after_warmup([(step, v) for step, v in megatron
                               if (batch_of is None or batch_of.get(step, final) == final) and step not in carried
                               and step not in starts])
        memory = MEGATRON_MEMORY.points_of(lines, src)
        stated = _stated(args, MEGATRON_STATED, src)
        if args.get("group_query_attention") == "False" and "num_attention_heads" in args:
            # Without grouped-query attention Megatron-LM ignores num_query_groups: every head has its own.
            stated = [(k, v) for k, v in stated if k != "num_query_groups"]
            stated.append(("num_query_groups", float(args["num_attention_heads"])))
        if final is not None and not any(k == "global_batch_size" for k, _ in stated):
            stated.append(("global_batch_size", float(final)))
        said = dict(stated).get("global_batch_size")
        if final is not None and said is not None and final != said:
            # The intervals' own batch is what they ran: 64-sequence steps were priced as the case's 128.
            raise CaseError(src, "global batch size", f"the last interval ran {final}, where the log's arguments say "
                                                      f"global_batch_size {said:g}: no interval ran the batch the run "
                                                      "trains at (a ramp-up not finished, or another run's lines), "
                                                      "so none can be timed as it")
        settings = tuple((k, args[k]) for k in MEGATRON_SETTINGS if k in args)
        reading = LogReading("megatron", step_time_s=_median(times, src, "'elapsed time per iteration (ms)'") / 1e3,
                             steps=len(times), stated=tuple(stated), settings=settings,
                             peak_gib=max(v for _, v in memory) / 1024 if memory else None,
                             peak_of_rank_0_only=bool(memory) and {r for r, _ in memory} == {0})
    elif titan:
        ranked = _lowest_rank_lines(text, lines.lines)
        ranked_lines = lines if ranked is text else _Lines(ranked)
        if ranked is not text:
            titan = TITAN_STEP.points_of(ranked_lines, src)
        times = _after_warmup(_in_order(_per_step(titan, statistics.median), src, "step"))
        peaks = _after_warmup(_per_step(TITAN_MEMORY.points_of(ranked_lines, src), max))
        params = [_grouped(m.group(1), src, number, "total parameters")
                  for number, line in lines.holding("total parameters") for m in TITAN_PARAMETERS.finditer(line)]
        statements = ((("parameters", params[0]),) if params else ()) + _titan_mesh(lines, src)
        reading = LogReading("torchtitan", tokens_per_s_per_gpu=_median(times, src, "'tps:'"), steps=len(times),
                             peak_gib=max(peaks) if peaks else None, peak_of_rank_0_only=bool(peaks),
                             stated=statements)
    elif deepspeed or pipe or timers:
        # DeepSpeed's ThroughputTimer logs on every rank (utils/timer.py, no rank filter): as torchtitan's.
        ranked = _lowest_rank_lines(text, lines.lines)
        ranked_lines = lines if ranked is text else _Lines(ranked)
        if ranked is not text:
            deepspeed = DS_THROUGHPUT.points_of(ranked_lines, src)
        peaks = _after_warmup(_per_step(DS_MEMORY.points_of(ranked_lines, src), max))
        args = _arguments(lines)
        # Its ZeRO stage too (DeepSpeedConfig.print: "zero_optimization_stage ...... 3"): a ZeRO-3 log was
        # fitted as its case's ZeRO-1 run, its all-gathers and sharded states priced as another layout's.
        statements = tuple(_stated(args, ("train_batch_size", "train_micro_batch_size_per_gpu",
                                          "zero_optimization_stage"), src))
        if deepspeed:
            rates = _after_warmup(_in_order(_per_step(deepspeed, statistics.median), src, "global_step"))
            reading = LogReading("deepspeed", samples_per_s=_median(rates, src, "'CurrSamplesPerSec='"),
                                 steps=len(rates), stated=statements)
        elif pipe:
            # Each line's time is the mean over the steps since the last (steps_per_print of them).
            steps = _after_warmup(_in_order(pipe, src, "steps"))
            reading = LogReading("deepspeed", step_time_s=_median(steps, src, "'iter time (s):'"), steps=len(steps),
                                 stated=statements)
        else:
            steps = _after_warmup(timers)
            step = _median(steps, src, "'time (ms) | fwd: … | bwd: … | step: …'") / 1e3
            reading = LogReading("deepspeed", step_time_s=step, steps=len(steps), stated=statements)
        # ThroughputTimer prints no reserved peak: its MaxMemAllocated is held to the allocated prediction.
        reading = replace(reading, peak_gib=max(peaks) if peaks else None, peak_scope="allocated")
    else:
        raise CaseError(src, "", "holds no step time: looked for Megatron-LM's 'elapsed time per iteration (ms)', "
                                 "torchtitan's 'tps:' and DeepSpeed's 'CurrSamplesPerSec=', its pipeline engine's "
                                 "'iter time (s):' or its 'time (ms) | fwd: … | bwd: … | step: …' timers")
    return reading


def _titan_mesh(lines: _Lines, src: str) -> tuple[tuple[str, float], ...]:
    """The degrees torchtitan's first mesh line states, as the case holds them (team_runs.STATED_IN_CASE):
    its data parallelism is dp_replicate·dp_shard (ParallelDims: batch = dp_replicate·dp_shard), its world
    the product of every degree but ep, which borrows its GPUs from the others; and its ZeRO stage where the
    mesh says it, as torchtitan's launch reader reads the same degrees (engines/torchtitan/read.py,
    ``degrees_zero_stage``): FSDP2 sharding over dp_shard·cp (cp folds into the FSDP mesh) is zero_stage 3,
    replication alone 0 (a mesh of one data-parallel GPU says neither). None where it printed none. A
    CaseError where it replicates and shards at once (HSDP), which the launch reader refuses as unpriced
    (``hsdp_refusal``): it states no stage, and passed against a case of any."""
    from .engines.torchtitan.read import degrees_zero_stage, hsdp_refusal
    from .errors import CaseError

    for _, line in lines.holding("Building device mesh"):
        found = TITAN_MESH.search(line)
        if found:
            pp, replicate, shard, cp, tp, ep = (int(g) for g in found.groups())
            refusal = hsdp_refusal(replicate, shard, cp)
            if refusal:
                raise CaseError(src, "dp_replicate", refusal)
            stage = degrees_zero_stage(replicate, shard, cp)
            sharding = () if stage is None else ((TITAN_ZERO, stage),)
            return (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep), ("dp_replicate·dp_shard", replicate * shard),
                    ("world", pp * replicate * shard * cp * tp)) + sharding
    return ()


def _median(values: list[float], src: str, what: str) -> float:
    from .errors import CaseError

    values = [v for v in values if v > 0]
    if not values:
        raise CaseError(src, "", f"holds no step time past warm-up: {what} appears only in the first logged "
                                 f"interval or the first {WARMUP_STEPS} steps")
    return statistics.median(values)


def _stated(args: dict[str, str], keys: tuple[str, ...], src: str) -> list[tuple[str, float]]:
    """The counts an argument dump states, of ``keys``: each an integer as the engine prints it, or
    None (Megatron-LM's unset optional counts). Any other value is refused naming the key: a hidden
    size of nan, 0x10 or 5,000 digits was passed over, and the log fitted as the case's model."""
    from .errors import CaseError, one_line, safe_repr

    stated = []
    for key in keys:
        value = args.get(key)
        if value is None or value == "None":
            continue
        if not _COUNT.fullmatch(value):
            raise CaseError(src, key, f"the argument dump gives {one_line(safe_repr(value), 40)}: expected an "
                                      f"integer of at most {MAX_COUNT_DIGITS} digits, as the engine prints it (or None)")
        stated.append((key, float(value)))
    return stated


_COUNT = re.compile(rf"\d{{1,{MAX_COUNT_DIGITS}}}")
_WHOLE = re.compile(r"\d+")
