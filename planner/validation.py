"""Replay published training runs through the planner and compare throughput.

``/work/shared/validation/published_runs.yaml`` (README beside it) lists measured runs with
their layouts. :func:`row_to_case` turns one row into a case dict in the case-file schema,
:func:`measured_tokens_per_s` recovers the run's measured tokens per second (inverting a
TFLOP/s figure with the *source's own* FLOP convention where that is all the row gives), and
:func:`replay` runs every convertible row through :func:`planner.estimate.estimate` and
reports predicted/measured − 1 per row, per source and overall.

Defaults that a row does not carry come from the source's published recipe and are kept in
one place each (``_SOURCE_RECIPES``, ``NEMO_GPT3_VOCAB``, ``_FABRICS``); nothing is fitted
to a measurement.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional


from .errors import CaseError, one_line

SOURCES = ("narayanan2021", "korthikanti2022", "nemo", "mpt", "bloom")

# Row `gpu` strings start with one of these; the preset is the part number as deployed.
_GPU_PRESETS = (
    ("A100-SXM4-80GB", "a100-sxm-80gb"),
    ("A100-40GB", "a100-sxm-40gb"),
    ("H100", "h100-sxm-80gb"),
    ("V100", "v100-sxm-32gb"),
)

# Dense bf16/fp16 peaks (TFLOP/s) the *sources* divide by when they quote MFU/HFU
# (README: Narayanan/Korthikanti/BLOOM 312 on A100, MPT 312 on A100 and 989 on H100).
_SOURCE_PEAK_TFLOPS = {"a100-sxm-80gb": 312.0, "a100-sxm-40gb": 312.0, "h100-sxm-80gb": 989.0}

# Named fabrics whose per-node NIC bandwidth the gpu string implies without printing it:
# Jean Zay's A100 nodes (BLOOM) have 4 × 100 Gbit/s Omni-Path links per 8-GPU node.
_FABRICS = {"omni-path": 4 * 100.0}  # Gbit/s per node

# What each source's recipe sets when the row leaves it out.
#   tied:    input/output embeddings shared (Megatron GPT, BLOOM, MPT, NeMo GPT3: yes;
#            NeMo Llama/Nemotron: share_embeddings_and_output_weights false).
#   dropout: Megatron-LM defaults 0.1 (Narayanan/Korthikanti scripts keep them);
#            NeMo recipes hidden/attention/ffn dropout 0.0; MPT 0; BLOOM 0.
#   flash:   no flash attention in 2021–22 Megatron (Narayanan, Korthikanti, BLOOM);
#            NeMo (use_flash_attention / TE fused attention) and MPT (triton flash) use it.
#   zero / sp when null: NeMo launcher recipes (conf/training/*/*.yaml) use
#            optim.name distributed_fused_adam (≈ ZeRO-1) and sequence_parallel true with tp>1.
#   fabric:  when the gpu string names none. BLOOM's tr11 runs all ran on Jean Zay (the
#            ramp-up rows' gpu string omits "Jean Zay, Omni-Path" but notes the production setup).
#   pp_partition: tr11-176B-ml.slurm sets --pp-partition-method 'type:transformer|embedding'.
#   tp_overlap: NeMo's performance recipes pipeline TP collectives with their GEMMs
#            (NeMo-Framework-Launcher conf/training/gpt3/175b_fp8_performance.yaml:
#            ub_tp_comm_overlap: True); the 2021–22 Megatron papers, MPT and BLOOM had no such thing.
#   fp32_grads: gradients accumulated and reduced in fp32. NeMo's recipes reduce in bf16
#            (optim.grad_sync_dtype: bf16, same file); BLOOM's BF16_Optimizer (bigscience
#            fork of 2022) kept fp32 gradient buffers and all-reduced them; MPT's FSDP
#            mixed precision PURE reduces in bf16. None: the engine's default.
_SOURCE_RECIPES: dict[str, dict[str, Any]] = {
    "narayanan2021": {"tied": True, "dropout": 0.1, "flash": False, "zero": 0, "sp_if_tp": False},
    "korthikanti2022": {"tied": True, "dropout": 0.1, "flash": False, "zero": 0, "sp_if_tp": False},
    "nemo": {"tied": False, "dropout": 0.0, "flash": True, "zero": 1, "sp_if_tp": True, "tp_overlap": True,
             "fp32_grads": False},
    "mpt": {"tied": True, "dropout": 0.0, "flash": True, "zero": 0, "sp_if_tp": False, "fp32_grads": False},
    "bloom": {"tied": True, "dropout": 0.0, "flash": False, "zero": 0, "sp_if_tp": False,
              "fabric": "omni-path", "pp_partition": "transformer|embedding", "fp32_grads": True},
}

# NeMo's GPT3 rows leave the vocabulary null (GPT-2 BPE, ~50k padded). NeMo's own FLOP
# formula uses LLM_VOCAB_SIZE_MAP["gpt3"] = 51200, and the rows' TFLOP/s ÷ tokens/s agree
# with it (5B: 52.0k ± 0.9k implied). Its weight in step time is V/(12·l·h) ≈ 4 % for 5B,
# so the padding question moves predictions by < 0.1 %.
NEMO_GPT3_VOCAB = 51200

# Not dense GeLU/SwiGLU but shaped like one: squared-ReLU (Nemotron) is a 2-matrix MLP.
_ACTIVATIONS = {"gelu": "gelu", "swiglu": "swiglu", "squared_relu": "gelu"}


# --- FLOP conventions of the sources (each in one place) ---------------------------------

def narayanan_flops_per_iteration(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021 eq. (3), also BLOOM's logs: F = 96·B·s·l·h²·(1 + s/6h + V/16lh).

    Counts GEMMs, full (non-causal) attention and the recompute forward pass: hardware FLOPs
    of one iteration with full activation recomputation.
    """
    b, s, l, h, v = batch, seq, layers, hidden, vocab
    return 96.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def korthikanti_model_flops_per_iteration(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Korthikanti et al. 2022 model FLOPs (their MFU basis): 72·B·s·l·h²·(1 + s/6h + V/12lh)."""
    b, s, l, h, v = batch, seq, layers, hidden, vocab
    return 72.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))


def nemo_model_flops_per_token(layers: int, hidden: int, heads: int, kv_heads: int, ffn_hidden: int,
                               gated: bool, vocab: int, seq: int) -> float:
    """NeMo 24.x 'Model TFLOP/s': 6 × (matmul weights incl. the output layer) + 12·l·s·h.

    Per layer: Q and O projections h², K and V h·kv_size each, MLP 2 (GeLU/squared-ReLU) or
    3 (SwiGLU) matrices h·f; attention scores and values 2·2·s·h forward, ×3 with backward,
    over the full s² square (no causal discount in the 2024 formulas); no recompute.
    Reproduces the 24.07 table's TFLOP/s ÷ tokens/s to 0.1 % on every Llama/Nemotron row.
    """
    l, h, f, s = layers, hidden, ffn_hidden, seq
    kv_size = kv_heads * (h // heads)
    per_layer = 2 * h * h + 2 * h * kv_size + (3 if gated else 2) * h * f
    return 6.0 * (l * per_layer + vocab * h) + 12.0 * l * s * h


def mpt_model_flops_per_token(num_params: int, layers: int, hidden: int, seq: int) -> float:
    """llm-foundry's MFU basis: 6·N + 12·L·d·s per token, N = all parameters with embeddings."""
    return 6.0 * num_params + 12.0 * layers * hidden * seq


# --- small helpers -----------------------------------------------------------------------

def source_name(row: dict) -> str:
    """Short source name from the row's ``source`` string."""
    text = str(row.get("source") or "")
    low = text.lower()
    for key, name in (("narayanan", "narayanan2021"), ("korthikanti", "korthikanti2022"),
                      ("nemo", "nemo"), ("mosaicml", "mpt"), ("llm-foundry", "mpt"),
                      ("bigscience", "bloom"), ("rajbhandari", "zero2020")):
        if key in low:
            return name
    return (re.split(r"\W+", low.strip()) or ["unknown"])[0] or "unknown"


def gpu_preset(gpu: str) -> Optional[str]:
    for prefix, preset in _GPU_PRESETS:
        if str(gpu).upper().startswith(prefix.upper()):
            return preset
    return None


def inter_node_bandwidth(gpu: str, gpus_per_node: int = 8) -> Optional[str]:
    """Per-GPU NIC bandwidth the row's gpu string states, as a case-file quantity, or None.

    ``"A100-40GB (1600 Gbps RoCE)"``: 1600 Gbit/s per node (llm-foundry's table title says
    node-to-node) over 8 GPUs → ``"200 Gbit/s"``. A named fabric in ``_FABRICS`` is used
    when no number is printed.
    """
    text = str(gpu)
    match = re.search(r"(\d+(?:\.\d+)?)\s*(Gbps|Gbit/s|Gb/s)", text, re.IGNORECASE)
    per_node = float(match.group(1)) if match else None
    if per_node is None:
        for name, gbits in _FABRICS.items():
            if name in text.lower():
                per_node = gbits
    if per_node is None:
        return None
    return f"{per_node / gpus_per_node:g} Gbit/s"


def _precision(text: Any) -> str:
    p = str(text or "").strip().lower()
    if "fp8" in p:
        return "fp8"
    if p.startswith("fp16"):
        return "fp16"
    return "bf16"  # "bf16 …", and "mixed (fp16/bf16 not stated)": same peak on A100/H100


def _recompute(value: Any) -> Optional[str]:
    if value is None:
        return "none"
    v = str(value).strip().lower()
    for name in ("full", "selective", "none"):
        if v.startswith(name):
            return name
    return None


def _embedding_partition(layers: int, pp: int) -> Optional[list[int]]:
    """Megatron-DeepSpeed ``--pp-partition-method type:transformer|embedding``.

    The two embedding layers count as one unit each on the first and last stage, so with
    l + 2 units split evenly those stages hold one block fewer (BLOOM: 70 + 2 = 72 over 12
    stages → 5, 6 × 10, 5).
    """
    units = layers + 2
    if pp < 2 or units % pp:
        return None
    per = units // pp
    return [per - 1] + [per] * (pp - 2) + [per - 1]


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


# --- measured throughput -----------------------------------------------------------------

def measured_tokens_per_s(row: dict) -> Optional[float]:
    """The run's measured tokens per second over all GPUs, or None if the row cannot give it.

    In order: ``tokens_per_sec_total``; ``tokens_per_sec_per_gpu`` × GPUs; global batch ×
    seq_len ÷ ``iteration_time_s``; ``tflops_per_gpu`` (then ``mfu`` × the source's peak)
    turned back into time with the source's own FLOP count.
    """
    measured = row.get("measured") or {}
    model = row.get("model") or {}
    batch = row.get("batch") or {}
    gpus = _num(row.get("num_gpus"))
    gbs, seq = _num(batch.get("global_batch_size")), _num(model.get("seq_len"))
    if _num(measured.get("tokens_per_sec_total")):
        return float(measured["tokens_per_sec_total"])
    if _num(measured.get("tokens_per_sec_per_gpu")) and gpus:
        return float(measured["tokens_per_sec_per_gpu"]) * gpus
    if _num(measured.get("iteration_time_s")) and gbs and seq:
        return gbs * seq / float(measured["iteration_time_s"])
    if not gpus:
        return None
    achieved = _num(measured.get("tflops_per_gpu"))
    if achieved is None and _num(measured.get("mfu")):
        peak = _SOURCE_PEAK_TFLOPS.get(gpu_preset(row.get("gpu", "")) or "")
        achieved = float(measured["mfu"]) * peak if peak else None
    if achieved is None:
        return None
    flops_per_token = source_flops_per_token(row)
    if flops_per_token is None:
        return None
    # achieved is per GPU: the job runs achieved·1e12·GPUs FLOP/s in the source's count.
    return achieved * 1e12 * gpus / flops_per_token


def source_flops_per_token(row: dict) -> Optional[float]:
    """FLOPs per trained token in the convention of the row's source, or None if unknown."""
    m, b = row.get("model") or {}, row.get("batch") or {}
    name = source_name(row)
    try:
        l, h, s = int(m["layers"]), int(m["hidden"]), int(m["seq_len"])
    except (KeyError, TypeError, ValueError):
        return None
    vocab = m.get("vocab")
    gbs = b.get("global_batch_size")
    if name in ("narayanan2021", "bloom", "korthikanti2022"):
        if not vocab or not gbs:
            return None
        count = narayanan_flops_per_iteration if name != "korthikanti2022" else korthikanti_model_flops_per_iteration
        return count(int(gbs), s, l, h, int(vocab)) / (int(gbs) * s)
    if name == "nemo":
        if not vocab and "gpt3" in str(m.get("name", "")).lower():
            vocab = NEMO_GPT3_VOCAB
        if not vocab or not m.get("heads") or not m.get("ffn_hidden"):
            return None
        return nemo_model_flops_per_token(l, h, int(m["heads"]), int(m.get("kv_heads") or m["heads"]),
                                          int(m["ffn_hidden"]), m.get("ffn_act") == "swiglu", int(vocab), s)
    if name == "mpt":
        if not m.get("num_params_exact"):
            return None
        return mpt_model_flops_per_token(int(m["num_params_exact"]), l, h, s)
    return None


def engine_of(framework: str) -> str:
    """The engine whose run-time behaviour a row's framework shows: anything with DeepSpeed
    (its ZeRO, pipeline engine or BF16 optimizer) runs as DeepSpeed; Megatron-LM and NeMo
    (Megatron-core) as Megatron; PyTorch FSDP (MPT's Composer) as "any", which the step-time
    model treats as FSDP."""
    text = framework.lower()
    if "deepspeed" in text:
        return "deepspeed"
    if "megatron" in text or "nemo" in text:
        return "megatron"
    return "any"


# --- row → case ----------------------------------------------------------------------------

def row_to_case(row: dict) -> tuple[Optional[dict], str]:
    """A case dict (case-file schema) for one published row, or (None, why it cannot be replayed).

    The second element is "" on success.
    """
    rid = row.get("id", "?")
    if row.get("record_type") != "measured_throughput":
        return None, f"record_type {row.get('record_type')!r} is not measured_throughput"
    source = source_name(row)
    recipe = _SOURCE_RECIPES.get(source)
    if recipe is None:
        return None, f"unknown source {source!r}"
    m, p, b = row.get("model") or {}, row.get("parallel") or {}, row.get("batch") or {}

    if measured_tokens_per_s(row) is None:
        return None, "no measured tokens/s, iteration time or invertible TFLOP/s"

    # model
    vocab = m.get("vocab")
    if vocab is None and source == "nemo" and "gpt3" in str(m.get("name", "")).lower():
        vocab = NEMO_GPT3_VOCAB
    for key, value in (("layers", m.get("layers")), ("hidden", m.get("hidden")), ("heads", m.get("heads")),
                       ("vocab", vocab), ("seq_len", m.get("seq_len"))):
        if value is None:
            return None, f"model.{key} not published"
    activation = _ACTIVATIONS.get(str(m.get("ffn_act") or "gelu"))
    if activation is None:
        return None, f"model.ffn_act {m.get('ffn_act')!r} has no counterpart"
    model = {
        "name": str(m.get("name") or rid),
        "num_layers": int(m["layers"]),
        "hidden_size": int(m["hidden"]),
        "num_attention_heads": int(m["heads"]),
        "num_kv_heads": int(m.get("kv_heads") or m["heads"]),
        "ffn_hidden_size": int(m.get("ffn_hidden") or 4 * int(m["hidden"])),
        "activation": activation,
        "vocab_size": int(vocab),
        "tied_embeddings": bool(recipe["tied"]),
        "dropout": float(recipe["dropout"]),
    }

    # cluster
    preset = gpu_preset(row.get("gpu", ""))
    if preset is None:
        return None, f"gpu {row.get('gpu')!r} has no preset"
    num_gpus = row.get("num_gpus")
    if not isinstance(num_gpus, int) or num_gpus < 1:
        return None, "num_gpus not published"
    cluster: dict[str, Any] = {"gpu": preset, "num_gpus": num_gpus}
    nic = inter_node_bandwidth(row.get("gpu", "")) or \
        (inter_node_bandwidth(recipe["fabric"]) if recipe.get("fabric") else None)
    if nic is not None:
        cluster["inter_node_bandwidth"] = nic

    # training
    gbs = b.get("global_batch_size")
    if not isinstance(gbs, int) or gbs < 1:
        return None, "batch.global_batch_size not published"
    training = {
        "global_batch_size": gbs,
        "seq_len": int(m["seq_len"]),
        "precision": _precision(row.get("precision")),
        "optimizer": "adam",
        "flash_attention": bool(recipe["flash"]),
        "engine": engine_of(str(row.get("framework") or "")),
        "tp_comm_overlap": bool(recipe.get("tp_overlap", False)),
    }
    if recipe.get("fp32_grads") is not None:
        training["fp32_grads"] = bool(recipe["fp32_grads"])

    # layout
    tp, pp, cp = (int(p.get(k) or 1) for k in ("tp", "pp", "cp"))
    if (p.get("ep") or 1) != 1:
        return None, f"expert parallelism ep={p.get('ep')} is not modelled"
    if num_gpus % (tp * pp * cp):
        return None, f"tp·pp·cp = {tp * pp * cp} does not divide {num_gpus} GPUs"
    dp = num_gpus // (tp * pp * cp)
    if p.get("dp") is not None and p["dp"] != dp:
        return None, f"parallel.dp {p['dp']} ≠ GPUs/(tp·pp·cp) = {dp}"
    mbs = b.get("micro_batch_size")
    if mbs is None:
        ga = b.get("grad_accum")
        if ga and gbs % (ga * dp) == 0:
            mbs = gbs // (ga * dp)
        else:
            return None, "batch.micro_batch_size not published (and not derivable from grad_accum)"
    if gbs % (mbs * dp):
        return None, f"global batch {gbs} not divisible by micro_batch_size·dp = {mbs}·{dp}"
    ga = gbs // (mbs * dp)
    if b.get("grad_accum") is not None and b["grad_accum"] != ga:
        return None, f"batch.grad_accum {b['grad_accum']} ≠ gbs/(mbs·dp) = {ga}"

    fsdp = str(p.get("fsdp") or "").upper()
    if p.get("distributed_optimizer") is True:
        zero = 1
    elif fsdp == "FULL_SHARD":
        zero = 3
    elif fsdp == "SHARD_GRAD_OP":
        zero = 2
    elif p.get("zero_stage") is not None:
        zero = int(p["zero_stage"])
    elif p.get("distributed_optimizer") is None:
        zero = int(recipe["zero"])
    else:
        zero = 0

    sp = p.get("sp")
    if sp is None:
        sp = bool(recipe["sp_if_tp"]) and tp > 1
    recompute = _recompute(row.get("recompute"))
    if recompute is None:
        return None, f"recompute {row.get('recompute')!r} not understood"
    layout: dict[str, Any] = {
        "dp": dp, "tp": tp, "pp": pp, "cp": cp,
        "vpp": int(p.get("vpp") or 1),  # null: no virtual stages (Narayanan Table 2 scripts set none)
        "micro_batch_size": int(mbs),
        "zero_stage": zero,
        "sequence_parallel": bool(sp),
        "recompute": recompute,
    }
    if model["num_layers"] % (pp * layout["vpp"]):
        stages = _embedding_partition(model["num_layers"], pp) \
            if layout["vpp"] == 1 and ("transformer|embedding" in str(row.get("notes") or "")
                                       or recipe.get("pp_partition") == "transformer|embedding") else None
        if stages is None:
            return None, f"{model['num_layers']} layers do not split over pp·vpp = {pp * layout['vpp']}"
        layout["stage_layers"] = stages

    return {"model": model, "cluster": cluster, "training": training, "layout": layout}, ""


# --- replay --------------------------------------------------------------------------------

@dataclass(frozen=True)
class RowResult:
    id: str
    source: str
    predicted_tokens_per_s: float
    measured_tokens_per_s: float
    error: float  # predicted / measured − 1
    fits: Optional[bool] = None  # the memory model's verdict on a layout that did run
    predicted_mfu: Optional[float] = None


@dataclass(frozen=True)
class Stats:
    count: int
    mean_abs_error: float
    max_abs_error: float
    bias: float  # mean signed error: > 0 predicts faster than measured

    @staticmethod
    def of(errors: Iterable[float]) -> Optional["Stats"]:
        errs = list(errors)
        if not errs:
            return None
        return Stats(len(errs), sum(abs(e) for e in errs) / len(errs), max(abs(e) for e in errs),
                     sum(errs) / len(errs))


@dataclass(frozen=True)
class Report:
    rows: tuple[RowResult, ...]
    skipped: tuple[tuple[str, str], ...]  # (id, reason)
    by_source: dict[str, Stats]
    overall: Optional[Stats]

    def worst(self, n: int = 10) -> list[RowResult]:
        return sorted(self.rows, key=lambda r: -abs(r.error))[:n]


def load_rows(path: str | Path) -> list[dict]:
    from .inputs import read_yaml

    data = read_yaml(Path(path))
    if not isinstance(data, list):
        raise CaseError(str(path), "", "expected a list of published runs")
    return data


def replay(path: str | Path, estimate_fn: Optional[Callable[[dict], Any]] = None) -> Report:
    """Estimate every convertible row of ``path``; ``estimate_fn`` defaults to planner.estimate."""
    if estimate_fn is None:
        from .estimate import estimate as estimate_fn
    results: list[RowResult] = []
    skipped: list[tuple[str, str]] = []
    for index, row in enumerate(load_rows(path)):
        if not isinstance(row, dict):
            skipped.append((f"row {index}", f"expected a mapping, got {type(row).__name__}"))
            continue
        rid = one_line(row.get("id", f"row {index}"), 80)
        try:  # a field of the wrong type (a list of layers, a string of GPUs) skips its row, with why
            case, reason = row_to_case(row)
            measured = measured_tokens_per_s(row) if case is not None else None
        except (TypeError, ValueError, AttributeError, OverflowError) as error:
            skipped.append((rid, f"a field has the wrong type ({one_line(error, 80)})"))
            continue
        if case is None:
            skipped.append((rid, reason))
            continue
        try:
            out = estimate_fn(case).to_dict()
        except CaseError as error:
            skipped.append((rid, f"rejected by the model: {error.key}: {error.expected}"))
            continue
        predicted = out.get("tokens_per_s")
        if not predicted:
            skipped.append((rid, "estimate gives no tokens_per_s (step-time model missing)"))
            continue
        results.append(RowResult(rid, source_name(row), float(predicted), float(measured),
                                 float(predicted) / float(measured) - 1, out.get("fits"), out.get("mfu")))
    by_source = {}
    for src in dict.fromkeys(r.source for r in results):
        by_source[src] = Stats.of(r.error for r in results if r.source == src)
    return Report(tuple(results), tuple(skipped), by_source, Stats.of(r.error for r in results))


# --- output ----------------------------------------------------------------------------------

def _stats_dict(stats: Optional[Stats]) -> Optional[dict]:
    if stats is None:
        return None
    return {"count": stats.count, "mean_abs_error": stats.mean_abs_error,
            "max_abs_error": stats.max_abs_error, "bias": stats.bias}


def report_to_dict(report: Report) -> dict:
    return {
        "rows": [{"id": r.id, "source": r.source, "predicted_tokens_per_s": r.predicted_tokens_per_s,
                  "measured_tokens_per_s": r.measured_tokens_per_s, "error": r.error, "fits": r.fits,
                  "predicted_mfu": r.predicted_mfu} for r in report.rows],
        "skipped": [{"id": i, "reason": why} for i, why in report.skipped],
        "by_source": {src: _stats_dict(s) for src, s in report.by_source.items()},
        "overall": _stats_dict(report.overall),
    }


def print_report(report: Report, console, worst: int = 10) -> None:
    from rich.markup import escape
    from rich.table import Table

    def pct(x: float) -> str:
        return f"{x:+.1%}"

    for src in report.by_source:
        table = Table(title=f"{escape(src)}: predicted vs measured tokens/s")
        for col in ("run", "measured", "predicted", "error", "fits"):
            table.add_column(col, justify="left" if col == "run" else "right", no_wrap=col == "run")
        for r in (r for r in report.rows if r.source == src):
            table.add_row(escape(r.id), f"{r.measured_tokens_per_s:,.0f}", f"{r.predicted_tokens_per_s:,.0f}",
                          pct(r.error), "" if r.fits is None else ("yes" if r.fits else "[red]no[/]"))
        console.print(table)

    summary = Table(title="Error of predicted tokens/s (predicted / measured − 1)")
    for col in ("source", "rows", "mean |error|", "max |error|", "bias"):
        summary.add_column(col, justify="left" if col == "source" else "right")
    for src, s in [(escape(k), v) for k, v in report.by_source.items()] + [("[bold]overall[/]", report.overall)]:
        if s is not None:
            summary.add_row(src, str(s.count), f"{s.mean_abs_error:.1%}", f"{s.max_abs_error:.1%}", pct(s.bias))
    console.print(summary)

    if report.rows:
        table = Table(title=f"Worst {min(worst, len(report.rows))} rows")
        for col in ("run", "source", "measured", "predicted", "error"):
            table.add_column(col, justify="left" if col in ("run", "source") else "right")
        for r in report.worst(worst):
            table.add_row(escape(r.id), escape(r.source), f"{r.measured_tokens_per_s:,.0f}",
                          f"{r.predicted_tokens_per_s:,.0f}",
                          pct(r.error))
        console.print(table)

    if report.skipped:
        reasons: dict[str, list[str]] = {}
        for rid, why in report.skipped:
            reasons.setdefault(why, []).append(rid)
        table = Table(title=f"Skipped rows ({len(report.skipped)})")
        table.add_column("reason", overflow="fold")
        table.add_column("rows", justify="right")
        table.add_column("e.g.")
        for why, ids in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
            table.add_row(escape(why), str(len(ids)), escape(ids[0]))
        console.print(table)
