"""Error bands: how far the model's figures have been from measured runs like this one.

A prediction is worth its error. For each class of published run (engine, GPU generation,
precision family, dense or mixture of experts, one node or several), ``validate-published``
takes the ratio measured / predicted of every run the model scores (tokens/s; the peak memory
where a source publishes it) and ships its 10th and 90th percentiles with the class's row count
(``planner/published/bands.yaml``, written by ``validate-published --write-bands``). A job's
80 % band is its prediction times those two ratios, from the most specific class with at least
MIN_RUNS runs: a class with fewer falls back to its parent (the nodes dropped, then dense or
experts, then the precision, then the GPU generation, then the engine). A band says which of the
job's keys it dropped (:attr:`Band.dropped`): a band of another class is not the job's own. Every
published run ran on GPUs; a job on CPUs (a profile `calibrate` measured on them) gets no band at all,
for no published run says how far the model is off on a device of that kind, and falling back to all
runs would quote the GPUs' spread as if it were its own.

The same file holds the gap below which the model cannot tell two layouts apart
(:func:`indistinguishable_gap`): from the published layout sweeps, every pair of measured
layouts of one job that both ran within 2x of the job's best and were both predicted to fit,
ordered by predicted gap; the isotonic (monotone) fit of "the model ordered the pair right" on
the gap; the smallest gap at which that fit reaches RIGHT_SHARE. The sweeps are a sample of the
jobs a user may plan, and the gap they give moves with which were published (the 22 sweeps,
resampled, give 5.5-8.6 %): the shipped gap is the GAP_PERCENTILE-th percentile of that gap over
GAP_RESAMPLES resamples of the sweeps (a bootstrap, Efron & Tibshirani 1993, ch. 13, with a fixed
seed), the gap below which the model cannot tell layouts apart unless the sweeps happened to favour
it, not the point estimate of one sample.
"""

from __future__ import annotations

import functools
import math
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import yaml

from cost_models.specs import ClusterSpec, Job, ModelSpec, TrainingSpec

from .inputs import read_yaml

BANDS_FILE = Path(__file__).parent / "published" / "bands.yaml"
MIN_RUNS = 20
LOW, HIGH = 0.10, 0.90
RIGHT_SHARE = 0.80
GAP_RESAMPLES, GAP_PERCENTILE, GAP_SEED = 200, 0.90, 0
KEYS = ("engine", "generation", "precision", "experts", "nodes")
MEMORY_KEYS = KEYS[:4]  # a peak per GPU does not depend on how many nodes there are
# GPU generations by preset name (prefix), as their tensor cores and software stacks go.
GENERATIONS = (("a100", "ampere"), ("h100", "hopper"), ("h200", "hopper"), ("h800", "hopper"),
               ("gb200", "blackwell"), ("gb300", "blackwell"), ("b200", "blackwell"), ("b300", "blackwell"),
               ("mi300", "cdna3"), ("mi325", "cdna3"), ("mi355", "cdna4"), ("v100", "volta"))
PRECISION_FAMILIES = {"fp32": "16-bit or wider", "bf16": "16-bit or wider", "fp16": "16-bit or wider",
                      "fp8": "8-bit", "mxfp8": "8-bit", "nvfp4": "4-bit"}


NO_BAND = "no published run was measured on CPUs, so none says how far the model is off on them"
# Why `plan`'s robust pick weighs no margin on CPUs (``pick_margin``).
NO_GAP = ("no published layout sweep ran on CPUs, so none says which gap the model cannot tell layouts apart "
          "within on them: the pick is the fastest")


def on_cpus(cluster: ClusterSpec) -> bool:
    """Whether the job's devices are CPUs: a profile `calibrate` measured on them (its machine's device,
    the GPU spec's name, is "CPU: <model>", calibration/worker.py)."""
    return cluster.gpu.on_cpu


# The vendor words a device name starts with where torch.cuda.get_device_name gives it, as a profile
# `calibrate` measured on GPUs names them ("NVIDIA H100 80GB HBM3", "AMD Instinct MI300X").
VENDOR_WORDS = ("nvidia ", "amd instinct ", "amd ")


def generation(gpu_name: str) -> str:
    """The generation of a preset's GPU, or of a profile's device as torch names it."""
    name = gpu_name.lower()
    name = next((name[len(w):] for w in VENDOR_WORDS if name.startswith(w)), name)
    return next((g for prefix, g in GENERATIONS if name.startswith(prefix)), "other")


def class_of(job: Job) -> dict[str, str]:
    """The job's class: the facts its error depends on that every case states."""
    return class_of_parts(job.model, job.cluster, job.training)


def class_of_parts(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> dict[str, str]:
    gpu = cluster.gpu
    return {"engine": training.engine.name, "generation": generation(gpu.name),
            "precision": PRECISION_FAMILIES.get(training.precision, training.precision),
            "experts": "moe" if model.is_moe else "dense",
            "nodes": "one node" if cluster.num_gpus <= gpu.gpus_per_node else "several nodes"}


def percentile(values: Sequence[float], fraction: float) -> float:
    """Linear-interpolated percentile (numpy's default)."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _name(cls: dict[str, str], keys: Sequence[str]) -> str:
    """A class as a person reads it: "engine megatron, hopper, 8-bit, moe, several nodes"."""
    return ", ".join(f"engine {cls[k]}" if k == "engine" else cls[k] for k in keys) or "all runs"


def _tables(samples: Iterable[tuple[dict[str, str], float]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Every class at every level (its first n keys, n = len(keys) … 0) with MIN_RUNS runs or more."""
    pooled: dict[tuple, list[float]] = defaultdict(list)
    samples = list(samples)
    for level in range(len(keys), -1, -1):
        for cls, ratio in samples:
            pooled[tuple(cls[k] for k in keys[:level])].append(ratio)
    out = []
    for key, ratios in sorted(pooled.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        if len(ratios) >= MIN_RUNS or not key:
            out.append({"class": dict(zip(keys, key)), "runs": len(ratios),
                        "p10": round(percentile(ratios, LOW), 4), "p90": round(percentile(ratios, HIGH), 4)})
    return out


def compute(rows: Sequence, jobs: Sequence[Job]) -> dict[str, Any]:
    """The bands document from fidelity Rows (``planner.fidelity``) and their jobs: the bands
    (:func:`band_tables`) and the gap the model cannot order layouts across."""
    gap, pairs = indistinguishable_from(rows)
    return {**band_tables(rows, jobs),
            "indistinguishable_gap": {"value": round(gap, 4), "pairs": pairs, "right_share": RIGHT_SHARE,
                                      "percentile": GAP_PERCENTILE, "resamples": GAP_RESAMPLES}}


def band_tables(rows: Sequence, jobs: Sequence[Job]) -> dict[str, Any]:
    """The bands alone: throughput over the runs the throughput headline scores (within 2x of their
    job's best), memory over every run that publishes a peak. Coverage asks for these a dozen times
    (once per source held out) and never for the gap, whose resampled sweeps are most of compute's work."""
    best: dict[tuple, float] = defaultdict(float)
    for r in rows:
        if r.measured:
            best[r.job] = max(best[r.job], r.measured)
    throughput, memory = [], []
    for r, job in zip(rows, jobs):
        cls = class_of(job)
        if r.measured and r.measured * 2 >= best[r.job]:
            throughput.append((cls, r.measured / r.predicted))
        if r.measured_gib:
            memory.append((cls, r.measured_gib / r.peak_gib))
    return {"min_runs": MIN_RUNS, "percentiles": [LOW, HIGH],
            "throughput": _tables(throughput, KEYS), "memory": _tables(memory, MEMORY_KEYS)}


def indistinguishable_from(rows: Sequence) -> tuple[float, int]:
    """(the predicted gap below which the model orders two layouts of one sweep right less than
    RIGHT_SHARE of the time, at the GAP_PERCENTILE-th percentile over resampled sweeps; the pairs it
    was read from): module docstring."""
    sweeps = sweep_pairs(rows)
    if not sweeps:
        return 0.0, 0
    gaps = resampled_gaps(sweeps)
    return gaps[math.ceil(GAP_PERCENTILE * GAP_RESAMPLES) - 1], sum(len(sweep) for sweep in sweeps)


def sweep_pairs(rows: Sequence) -> list[list[tuple[float, bool]]]:
    """Per published sweep (a job with at least five measured layouts predicted to fit), its pairs
    of layouts that both ran within 2x of its best: (predicted gap, ordered right), :func:`ordering`."""
    groups: dict[tuple, list] = defaultdict(list)
    for r in rows:
        if r.measured and r.fits and r.row.get("trust") != "low":
            groups[r.job].append(r)
    sweeps: list[list[tuple[float, bool]]] = []
    # In an order of their own (the jobs'), not the files': the draw picks sweeps by place, and the same
    # runs listed otherwise would ship another gap.
    for job in sorted(groups, key=repr):
        group = groups[job]
        if len(group) < 5:  # a sweep, as the sweep measure counts one
            continue
        best = max(r.measured for r in group)
        group = [r for r in group if r.measured * 2 >= best]
        pairs = [ordering(a, b) for i, a in enumerate(group) for b in group[i + 1:]
                 if a.predicted != b.predicted and a.measured != b.measured]
        if pairs:  # a sweep with no pair to order says nothing of the gap (a resample of it alone, 0)
            sweeps.append(pairs)
    return sweeps


def resampled_gaps(sweeps: list[list[tuple[float, bool]]]) -> list[float]:
    """The gap (:func:`ordering_gap`) of GAP_RESAMPLES resamples of the sweeps, with replacement, sorted."""
    draw = random.Random(GAP_SEED)
    return sorted(ordering_gap([pair for _ in sweeps for pair in sweeps[draw.randrange(len(sweeps))]])
                  for _ in range(GAP_RESAMPLES))


def ordering(a: Any, b: Any) -> tuple[float, bool]:
    """A pair of measured layouts: their predicted gap (log ratio) and whether the model ordered them right."""
    # The larger over the smaller, whichever comes first: the gap of a pair is one number, to the last bit.
    gap = math.log(max(a.predicted, b.predicted) / min(a.predicted, b.predicted))
    return gap, (a.predicted > b.predicted) == (a.measured > b.measured)


def ordering_gap(pairs: list[tuple[float, bool]]) -> float:
    """The smallest predicted gap (a fraction) at which the isotonic fit of "ordered right" on the gap
    reaches RIGHT_SHARE (the largest gap where it never does)."""
    if not pairs:
        return 0.0
    pairs = sorted(pairs)
    fitted = isotonic([1.0 if right else 0.0 for _, right in pairs])
    return next((math.expm1(g) for (g, _), share in zip(pairs, fitted) if share >= RIGHT_SHARE),
                math.expm1(pairs[-1][0]))


def isotonic(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, n2 = blocks.pop()
            m1, n1 = blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    out: list[float] = []
    for mean, count in blocks:
        out += [mean] * int(count)
    return out


# --- reading the shipped bands -----------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _load(path: str = str(BANDS_FILE)) -> dict[str, Any]:
    return read_yaml(Path(path))


def _lookup(table: list[dict], cls: dict[str, str], keys: Sequence[str]) -> dict:
    by_key = {tuple(entry["class"].get(k) for k in keys[:len(entry["class"])]): entry for entry in table}
    for level in range(len(keys), -1, -1):
        entry = by_key.get(tuple(cls[k] for k in keys[:level]))
        if entry is not None and (entry["runs"] >= MIN_RUNS or level == 0):
            return entry
    raise KeyError("no root class in the bands file")


@dataclass(frozen=True)
class Band:
    """Measured / predicted at the 10th and 90th percentiles, over ``runs`` published runs of ``of``;
    ``dropped``: the job's own (key, value) pairs the band's class leaves out, in KEYS' order, because
    fewer than MIN_RUNS runs shared them (empty where the band is the job's whole class)."""

    low: float
    high: float
    runs: int
    of: str
    dropped: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "runs": self.runs, "class": self.of,
                "dropped": dict(self.dropped)}

    def text(self, what: str = "runs") -> str:
        """The runs the band is drawn from, as a report says them: the class, or the class it fell
        back to and which of the job's keys it dropped. ``what`` names the runs ("peaks" for the
        memory band: the runs that published one)."""
        if not self.dropped:
            return f"{self.runs:,} published {what} of this class: {self.of}"
        key, value = self.dropped[0]
        runs = f"all {self.runs:,} published {what}" if self.of == "all runs" else \
            f"{self.runs:,} published {what} of {self.of}"
        return (f"{runs}; fewer than {MIN_RUNS} of them share its {key} "
                f"({value}): {', '.join(k for k, _ in self.dropped)} dropped")


def _band(entry: dict, cls: dict[str, str], keys: Sequence[str]) -> Band:
    level = len(entry["class"])
    return Band(entry["p10"], entry["p90"], entry["runs"], _name(entry["class"], list(entry["class"])),
                tuple((k, cls[k]) for k in keys[level:]))


def throughput_band(job: Job) -> Optional[Band]:
    """The job's 80 % tokens/s band, None on CPUs (module docstring)."""
    if on_cpus(job.cluster):
        return None
    cls = class_of(job)
    return _band(_lookup(_load()["throughput"], cls, KEYS), cls, KEYS)


def memory_band(job: Job) -> Optional[Band]:
    return memory_band_of(job.model, job.cluster, job.training)


@functools.lru_cache(maxsize=256)
def memory_band_of(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> Optional[Band]:
    """The memory band of a job of these specs, None on CPUs (module docstring). Cached on them: every
    fit test of a search asks for it (search_memory.fit_limit, 4,000 times a three-engine plan), of a
    few specs, each deriving its class again."""
    if on_cpus(cluster):
        return None
    cls = class_of_parts(model, cluster, training)
    return _memory_band(tuple(cls[k] for k in MEMORY_KEYS))


@functools.lru_cache(maxsize=None)
def _memory_band(key: tuple) -> Band:
    cls = dict(zip(MEMORY_KEYS, key))
    return _band(_lookup(_load()["memory"], cls, MEMORY_KEYS), cls, MEMORY_KEYS)


def fit_limit(usable: float, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> float:
    """The most a layout's predicted peak may be and still be said to fit: what the allocator may
    hold (``usable``), over the memory band's low end. Above it even the low end of the band
    overflows: the layout does not fit. Between ``usable / high`` and it, the layout is at risk.
    With no band (CPUs) the prediction is all there is: it fits where the predicted peak does."""
    band = memory_band_of(model, cluster, training)
    return usable if band is None else usable / band.low


def indistinguishable_gap() -> float:
    """The predicted step-time gap (a fraction) below which two layouts are not told apart."""
    return float(_load()["indistinguishable_gap"]["value"])


def pick_margin(cluster: ClusterSpec) -> Optional[float]:
    """The gap `plan`'s robust pick weighs on this cluster when no margin is set by hand: the
    indistinguishable gap, learned from published sweeps, all on GPUs; None on CPUs, where, as no band
    is (module docstring), no gap is either: the GPU sweeps' gap is not the model's ordering error on a
    CPU, and the pick is the fastest (``NO_GAP``)."""
    return None if on_cpus(cluster) else indistinguishable_gap()


HEADER = """\
# Error bands of the cost model, written by `layout-planner validate-published --write-bands` from
# {source}; read by planner/bands.py.
# throughput, memory: per class of run (engine, GPU generation, precision family, dense or moe, one node or
#   several; memory without the nodes), the 10th and 90th percentiles of measured / predicted (tokens/s; peak
#   memory per GPU) over its runs, for every class and parent class with at least min_runs runs. A job takes
#   the most specific class that has them.
# indistinguishable_gap: the predicted step-time gap below which the model orders two layouts of one
#   published sweep right less than right_share of the time (isotonic fit over `pairs` pairs of layouts
#   that both ran within 2x of their sweep's best and were both predicted to fit), its `percentile` over
#   `resamples` resamples of the sweeps (a bootstrap: the gap moves with which sweeps were published).
"""


def render(document: dict[str, Any], source: str = "the repo's published runs (planner/published/*.yaml)") -> str:
    """The bands file's text, its header naming the runs it was drawn from."""
    return HEADER.replace("{source}", source) + yaml.safe_dump(document, sort_keys=False, default_flow_style=None,
                                                               width=120)


def enough_runs(document: dict[str, Any]) -> Optional[str]:
    """Why ``document`` draws no bands worth writing, else None: fewer than MIN_RUNS runs in all, whose
    10th and 90th percentiles say little (one run gave a band of zero width, written as if of min_runs)."""
    root = next((e for e in document["throughput"] if not e["class"]), None)
    runs = root["runs"] if root else 0
    if runs < MIN_RUNS:
        return f"{runs} scored run{'s' * (runs != 1)}: bands need at least {MIN_RUNS}"
    return None


# --- coverage -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Coverage:
    """Share of a source's runs whose measurement lies inside their 80 % band: with the bands of
    every run (in sample), and with bands computed without that source's runs (held out: the
    coverage a run the model never saw can expect)."""

    source: str
    runs: int
    inside: float
    inside_held_out: Optional[float]  # None where no other source's runs give a band


def _inside(document: dict, rows: Sequence, jobs: Sequence[Job]) -> list[bool]:
    out = []
    for r, job in zip(rows, jobs):
        entry = _lookup(document["throughput"], class_of(job), KEYS)
        out.append(entry["p10"] <= r.measured / r.predicted <= entry["p90"])
    return out


def _scored(rows: Sequence, jobs: Sequence[Job]) -> list[tuple]:
    """(row, job) of the runs the throughput bands are drawn from: within 2x of their job's best."""
    best: dict[tuple, float] = defaultdict(float)
    for r in rows:
        if r.measured:
            best[r.job] = max(best[r.job], r.measured)
    return [(r, j) for r, j in zip(rows, jobs) if r.measured and r.measured * 2 >= best[r.job]]


def _held_out_inside(rows: Sequence, jobs: Sequence[Job], scored: Sequence[tuple]) -> dict[int, Optional[bool]]:
    """Whether each scored run (by id of its row) lies inside the band computed without its source;
    None where no other source's runs give a band at all."""
    out: dict[int, Optional[bool]] = {}
    for source in sorted({r.source for r, _ in scored}):
        rest = [(r, j) for r, j in zip(rows, jobs) if r.source != source]
        without = band_tables([r for r, _ in rest], [j for _, j in rest])
        mine = [(r, j) for r, j in scored if r.source == source]
        insides = _inside(without, [r for r, _ in mine], [j for _, j in mine]) if without["throughput"] \
            else [None] * len(mine)
        for (r, _), inside in zip(mine, insides):
            out[id(r)] = inside
    return out


def _share(flags: Sequence[Optional[bool]]) -> Optional[float]:
    known = [f for f in flags if f is not None]
    return sum(known) / len(known) if known else None


def coverage(rows: Sequence, jobs: Sequence[Job], min_rows: int = MIN_RUNS) -> list[Coverage]:
    """Throughput band coverage per source with at least ``min_rows`` scored runs."""
    scored = _scored(rows, jobs)
    counts: dict[str, int] = defaultdict(int)
    for r, _ in scored:
        counts[r.source] += 1
    kept = [(r, j) for r, j in scored if counts[r.source] >= min_rows]
    inside = dict(zip((id(r) for r, _ in kept), _inside(band_tables(rows, jobs), [r for r, _ in kept],
                                                        [j for _, j in kept])))
    held = _held_out_inside(rows, jobs, kept)
    out = []
    for source in sorted({r.source for r, _ in kept}):
        mine = [id(r) for r, _ in kept if r.source == source]
        out.append(Coverage(source, len(mine), sum(inside[i] for i in mine) / len(mine),
                            _share([held[i] for i in mine])))
    return out


def coverage_by_class(rows: Sequence, jobs: Sequence[Job]) -> list[Coverage]:
    """Throughput band coverage per band class: the runs whose band comes from that class (the most
    specific with MIN_RUNS runs, :func:`throughput_band`'s lookup), the share inside it, and the
    share inside the band computed without each run's own source (``Coverage.source`` names the
    class)."""
    scored = _scored(rows, jobs)
    whole = band_tables(rows, jobs)
    held = _held_out_inside(rows, jobs, scored)
    by_class: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    for (r, j), inside in zip(scored, _inside(whole, [r for r, _ in scored], [j for _, j in scored])):
        entry = _lookup(whole["throughput"], class_of(j), KEYS)
        by_class[_name(entry["class"], list(entry["class"]))].append((inside, held[id(r)]))
    return [Coverage(name, len(members), sum(a for a, _ in members) / len(members),
                     _share([b for _, b in members]))
            for name, members in sorted(by_class.items(), key=lambda kv: -len(kv[1]))]


def print_coverage(covered: Sequence[Coverage], console: Any, by: str = "source") -> None:
    """The coverage table, per source or (``by`` "class") per band class."""
    from rich.markup import escape
    from rich.table import Table

    title = "share of each source's runs inside theirs" if by == "source" else \
        "share of the runs each class gives a band to inside it"
    table = Table(title=f"80 % throughput bands: {title}")
    for column in (by, "runs", "in sample", "source held out"):
        table.add_column(column, justify="left" if column == by else "right")
    for c in covered:
        held = "—" if c.inside_held_out is None else f"{c.inside_held_out:.0%}"
        table.add_row(escape(c.source[:60]), str(c.runs), f"{c.inside:.0%}", held)
    console.print(table)
