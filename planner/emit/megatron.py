"""Megatron-LM: the argument list of ``pretrain_gpt.py`` and a torchrun launch script, and a reader
for the arguments (or launch script) a team already has.

Flag names and the rules they must obey are those of Megatron-LM's
``megatron/training/arguments.py`` (``validate_args``) and of megatron-core's
``TransformerConfig.__post_init__``:

- ``dp = world / (tp·pp·cp)``; the global batch must divide by ``micro·dp``.
- An uneven pipeline is given as ``--decoder-first-pipeline-num-layers`` /
  ``--decoder-last-pipeline-num-layers``; the stages between them split the remaining
  layers evenly. A partition whose middle stages differ (32 layers on 5 stages:
  6, 7, 7, 6, 6) is given as ``--pipeline-model-parallel-layout`` instead, one ``|``-separated
  entry per (virtual) stage, ``E`` the embedding, ``L`` the loss, ``t`` a transformer layer
  (``PipelineParallelLayerLayout``); with it no other partition or interleaving flag is allowed.
- Interleaving: ``--num-layers-per-virtual-pipeline-stage`` (layers per model chunk) on an
  even split; with an uneven one ``validate_args`` demands ``--num-virtual-stages-per-pipeline-rank``.
- ``--recompute-method block --recompute-num-layers N`` recomputes the first N layers of every
  model chunk (``TransformerBlock._checkpointed_forward``), so with interleaving N is the
  planner's layers per stage divided by vpp; ``uniform`` with 1 recomputes every layer.
- The distributed optimizer is ZeRO stage 1; ZeRO 2 and 3 are Megatron-FSDP
  (``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads`` or
  ``optim_grads_params``, with ``--use-distributed-optimizer``, ``--no-gradient-accumulation-fusion``
  and ``--ckpt-format fsdp_dtensor``, which validate_args demands; Megatron-Core's Megatron-FSDP guide).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Optional

from cost_models.activations import selective_modules
from cost_models.model_states import fp32_gradients
from cost_models.partition import chunk_layers, virtual_partition
from cost_models.specs import Job, Layout, SpecError

from ..engines import ENGINES
from ..errors import CaseError, one_line
from ..inputs import read_text
from ..limits import MAX_EXPANDED_CHARS, MAX_INT
from . import header_lines as _lines
from .quoting import argument_word, comment, shell_word

ARGS_FILE = "megatron_args.txt"
LAUNCH_FILE = "launch.sh"

# Flags whose value is an integer, and what read() does with them.
INT_FLAGS = (
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--micro-batch-size", "--global-batch-size", "--recompute-num-layers",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--cpu-offloading-num-layers",
    "--num-layers", "--hidden-size", "--num-attention-heads", "--num-query-groups", "--ffn-hidden-size",
    "--seq-length", "--max-position-embeddings", "--num-experts", "--expert-model-parallel-size",
    "--expert-tensor-parallel-size", "--moe-router-topk",
    # torchrun
    "--nnodes", "--nproc-per-node",
)
STR_FLAGS = ("--pipeline-model-parallel-layout", "--recompute-granularity", "--recompute-method", "--fp8-format",
             "--fp8-recipe", "--fp4-format", "--fp4-recipe", "--data-parallel-sharding-strategy",
             "--optimizer-offload-fraction", "--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16")
BOOL_FLAGS = (
    "--disable-bias-linear", "--sequence-parallel", "--use-distributed-optimizer", "--recompute-activations", "--bf16", "--fp16",
    "--swiglu", "--group-query-attention", "--untie-embeddings-and-output-weights",
    "--no-overlap-p2p-communication", "--use-torch-fsdp2", "--use-megatron-fsdp", "--use-custom-fsdp",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
    "--optimizer-cpu-offload", "--cpu-offloading", "--fp8-param-gather", "--fp4-param-gather",
    "--first-last-layers-bf16",
)
ACCOUNT_FLAGS = {"account_for_embedding_in_pipeline_split": "--account-for-embedding-in-pipeline-split",
                 "account_for_loss_in_pipeline_split": "--account-for-loss-in-pipeline-split"}
# Spellings torchrun also accepts.
ALIASES = {"--nproc_per_node": "--nproc-per-node"}

# A SpecError's field, as the flag that set it (for read()'s final cross-check).
FLAG_OF_FIELD = {
    "dp": "--tensor-model-parallel-size", "tp": "--tensor-model-parallel-size",
    "pp": "--pipeline-model-parallel-size", "cp": "--context-parallel-size",
    "vpp": "--num-layers-per-virtual-pipeline-stage", "micro_batch_size": "--micro-batch-size",
    "zero_stage": "--use-distributed-optimizer", "sequence_parallel": "--sequence-parallel",
    "recompute": "--recompute-granularity", "recompute_num_layers": "--recompute-num-layers",
    "stage_layers": "--decoder-first-pipeline-num-layers", "global_batch_size": "--global-batch-size",
    "ep": "--expert-model-parallel-size", "etp": "--expert-tensor-parallel-size",
}


# Megatron-FSDP's --data-parallel-sharding-strategy for each ZeRO stage it stands for.
FSDP_STRATEGIES = {0: "no_shard", 1: "optim", 2: "optim_grads", 3: "optim_grads_params"}


def _refuse(expected: str) -> CaseError:
    return CaseError("--emit", "megatron", expected)


def refuse_what_megatron_cannot_run(job: Job) -> None:
    """Raise a CaseError for the first thing in ``job`` Megatron-LM refuses (planner/engines/megatron.py)."""
    refusal = ENGINES["megatron"].refusal(job)
    if refusal:
        raise _refuse(f"{refusal}; plan with --engine megatron")


def uneven_stages(layout: Layout) -> Optional[tuple[int, int]]:
    """(first, last) layer counts for ``--decoder-first/last-pipeline-num-layers``, or None for an
    even split or a partition those flags cannot express (middle stages that differ)."""
    stages = layout.stage_layers
    if stages is None or len(set(stages)) == 1 or len(set(stages[1:-1])) > 1 \
            or any(n % layout.vpp for n in stages):
        return None
    if any(n % layout.vpp for n in stages):  # unequal model chunks: only a layout string says them
        return None
    return stages[0], stages[-1]


def layout_string(layout: Layout) -> Optional[str]:
    """``--pipeline-model-parallel-layout`` for a partition whose middle stages differ, or whose
    stages do not split into equal model chunks, else None.

    Virtual stage ``v`` of pipeline rank ``r`` is entry ``v·pp + r``; a rank's chunks are equal, or
    differ by one layer, the spare ones first (``cost_models.partition.chunk_layers``), as for
    layers the pp·vpp virtual stages do not divide."""
    stages = layout.stage_layers
    if stages is None or uneven_stages(layout) is not None:
        return None
    if len(set(stages)) == 1 and stages[0] % layout.vpp == 0:
        return None
    chunks = [chunk_layers(n, layout.vpp) for n in stages]
    entries = []
    for v in range(layout.vpp):
        for r, n in enumerate(stages):
            chunk = chunks[r][v]
            entry = "t" * chunk if chunk <= 2 else f"t*{chunk}"
            if v == 0 and r == 0:
                entry = "E" + entry
            if v == layout.vpp - 1 and r == layout.pp - 1:
                entry = entry + "L" if chunk <= 2 else f"{entry},L"
            entries.append(entry)
    return "|".join(entries)


def _repeat(pattern: str, text: str) -> str:
    """``text`` with every ``X*n`` of ``pattern`` written out, refused past MAX_EXPANDED_CHARS."""
    length = len(text)
    for match in re.finditer(pattern, text):
        count = match.group(2)
        if len(count) > len(str(MAX_EXPANDED_CHARS)):
            raise ValueError(f"repeat count {one_line(count, 20)} is past the bound of {MAX_EXPANDED_CHARS:,}")
        length += len(match.group(1)) * int(count) - len(match.group(0))
        if length > MAX_EXPANDED_CHARS:
            raise ValueError(f"expands past {MAX_EXPANDED_CHARS:,} characters")
    return re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)


def parse_layout_string(text: str, pp: int) -> list[int]:
    """Transformer layers per virtual stage of a ``--pipeline-model-parallel-layout`` (Megatron's
    ``PipelineParallelLayerLayout.parse_str_to_list``); raises ValueError on what it cannot read."""
    text = text.replace(",", "")
    text = _repeat(r"\(([^)]+)\)\*(\d+)", text)
    text = _repeat(r"(.)\*(\d+)", text)
    entries = text.split("|")
    if len(entries) % pp:
        raise ValueError(f"{len(entries)} stages do not divide by --pipeline-model-parallel-size {pp}")
    for entry in entries:
        bad = set(entry) - set("ELt")
        if bad:
            raise ValueError(f"unsupported layer character(s) {''.join(sorted(bad))!r} "
                             "(only E, L and t are modelled)")
    flat = "".join(entries)
    if flat.count("E") != 1 or flat.count("L") != 1 or not flat.startswith("E") or not flat.endswith("L"):
        raise ValueError("expected one E at the start and one L at the end")
    return [entry.count("t") for entry in entries]


def arguments(job: Job) -> list[tuple[str, Optional[str]]]:
    """``pretrain_gpt.py`` arguments for ``job`` as (flag, value or None for a switch)."""
    m, t, lay = job.model, job.training, job.layout
    refuse_what_megatron_cannot_run(job)
    args: list[tuple[str, Optional[str]]] = [
        ("--tensor-model-parallel-size", str(lay.tp)),
        ("--pipeline-model-parallel-size", str(lay.pp)),
    ]
    if lay.stage_layers is None and lay.vpp > 1 and m.num_layers % (lay.pp * lay.vpp):
        # Interleaving over layers the virtual stages do not divide: the layout string says how.
        lay = lay.with_changes(stage_layers=job.stage_layers)
    uneven = uneven_stages(lay)
    custom = layout_string(lay)
    accounted = [flag for field, flag in ACCOUNT_FLAGS.items() if getattr(lay, field)]
    args += [(flag, None) for flag in accounted]
    if uneven is not None:
        first, last = uneven
        args += [("--decoder-first-pipeline-num-layers", str(first)),
                 ("--decoder-last-pipeline-num-layers", str(last))]
    if custom is not None:  # it sets the chunks per rank too
        args.append(("--pipeline-model-parallel-layout", custom))
    elif lay.vpp > 1:
        if uneven is not None or accounted:  # validate_args: uneven pipelines give the chunk count instead
            args.append(("--num-virtual-stages-per-pipeline-rank", str(lay.vpp)))
        else:
            args.append(("--num-layers-per-virtual-pipeline-stage", str(m.num_layers // (lay.pp * lay.vpp))))
    args.append(("--context-parallel-size", str(lay.cp)))
    if lay.sequence_parallel:
        args.append(("--sequence-parallel", None))
    if lay.zero_stage >= 1:
        args.append(("--use-distributed-optimizer", None))
    if lay.zero_stage >= 2:  # Megatron-FSDP (the user guide's flags; validate_args wants its checkpoints)
        args += [("--use-megatron-fsdp", None),
                 ("--data-parallel-sharding-strategy", FSDP_STRATEGIES[lay.zero_stage]),
                 ("--no-gradient-accumulation-fusion", None), ("--ckpt-format", "fsdp_dtensor")]
    args += [("--micro-batch-size", str(lay.micro_batch_size)),
             ("--global-batch-size", str(t.global_batch_size))]
    if lay.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
        modules = selective_modules(m, t)
        if modules != ("core_attn",):  # what the estimate recomputed beyond Megatron's default
            args.append(("--recompute-modules", " ".join(modules)))
    elif lay.recompute == "full":
        if lay.recompute_num_layers is None:
            args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                     ("--recompute-num-layers", "1")]
        else:
            if lay.recompute_num_layers % lay.vpp:
                raise _refuse(f"recompute_num_layers {lay.recompute_num_layers} per stage cannot be expressed "
                              f"with {lay.vpp} model chunks per stage: --recompute-num-layers counts layers "
                              "per chunk, so it must divide by vpp")
            args += [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                     ("--recompute-num-layers", str(lay.recompute_num_layers // lay.vpp))]
    if t.precision == "bf16":
        args.append(("--bf16", None))
    elif t.precision == "fp16":
        args.append(("--fp16", None))
    elif t.recipe is not None:
        args += precision_args(job)
    args += [("--num-layers", str(m.num_layers)), ("--hidden-size", str(m.hidden_size)),
             ("--num-attention-heads", str(m.num_attention_heads))]
    if m.num_kv_heads < m.num_attention_heads:
        args += [("--group-query-attention", None), ("--num-query-groups", str(m.num_kv_heads))]
    args.append(("--ffn-hidden-size", str(m.ffn_hidden_size)))
    if m.activation == "swiglu":
        args.append(("--swiglu", None))
    if m.attention_type == "mla":
        args.append(("--multi-latent-attention", None))
        if m.q_lora_rank:
            args.append(("--q-lora-rank", str(m.q_lora_rank)))
        args += [("--kv-lora-rank", str(m.kv_lora_rank)), ("--qk-head-dim", str(m.qk_head_dim)),
                 ("--qk-pos-emb-head-dim", str(m.qk_rope_head_dim)), ("--v-head-dim", str(m.v_head_dim))]
    elif m.head_dim * m.num_attention_heads != m.hidden_size:
        args.append(("--kv-channels", str(m.head_dim)))
    if m.is_moe:
        args += moe_arguments(job)
    args += [("--seq-length", str(t.seq_len)), ("--max-position-embeddings", str(t.seq_len))]
    if not m.tied_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    args.append(("--optimizer", "sgd" if t.optimizer == "sgd" else "adam"))
    # Gradient precision as the estimate timed it: Megatron keeps bf16 gradients in fp32 by
    # default, fp16 ones in fp16 (megatron/training/arguments.py).
    if t.precision not in ("fp16", "fp32") and not fp32_gradients(t):
        args.append(("--grad-reduce-in-bf16", None))
    elif t.precision == "fp16" and fp32_gradients(t):
        args.append(("--accumulate-allreduce-grads-in-fp32", None))
    if t.tp_comm_overlap and lay.tp > 1:
        args.append(("--tp-comm-overlap", None))  # Transformer Engine userbuffers
    if lay.offload_optimizer:
        # HybridDeviceOptimizer: validate_args wants the precision-aware optimizer with it.
        args += [("--optimizer-cpu-offload", None), ("--optimizer-offload-fraction", f"{lay.offload_optimizer:g}"),
                 ("--use-precision-aware-optimizer", None), ("--overlap-cpu-optimizer-d2h-h2d", None)]
    if lay.offload_activations:
        args += [("--cpu-offloading", None), ("--cpu-offloading-num-layers", str(lay.offload_activations))]
    if t.moe_comm_overlap:
        args.append(("--overlap-moe-expert-parallel-comm", None))  # dispatch and combine beside another micro-batch
    return args


def moe_layer_pattern(model) -> str:
    """``--moe-layer-freq`` as the Python list expression Megatron-LM evaluates, one entry per
    layer (1: experts), e.g. ``([0]*3+[1]*58)`` for DeepSeek-V3, ``([0,1]*24)`` for Llama 4
    Maverick; a plain 1 when every layer has experts. The layers follow
    ``ModelSpec.is_moe_layer``: the leading dense ones, then blocks of freq − 1 dense layers and
    one MoE layer, then any dense layers left."""
    dense, freq = model.moe_first_dense_layers, model.moe_layer_freq
    blocks = model.num_moe_layers
    tail = model.num_layers - dense - blocks * freq
    if dense == 0 and freq == 1 and tail == 0:
        return "1"
    terms = [f"[0]*{dense}"] if dense else []
    terms.append(f"[{','.join(['0'] * (freq - 1) + ['1'])}]*{blocks}")
    if tail:
        terms.append(f"[0]*{tail}")
    return "(" + "+".join(terms) + ")"


def moe_arguments(job: Job) -> list[tuple[str, Optional[str]]]:
    """The mixture-of-experts arguments (Megatron-LM's MoE guide, ``megatron/core/transformer/moe``):
    the experts and their widths, the router, the expert grid (MoE parallel folding), grouped
    GEMMs and the token dispatcher the estimate timed: flex (DeepEP) where tokens cross ranks,
    which megatron-core's flex dispatcher needs tp·ep > 1 for; all-to-all with a capacity
    factor, whose padding the DeepEP backend refuses (``TransformerConfig.__post_init__``)."""
    m, lay = job.model, job.layout
    args: list[tuple[str, Optional[str]]] = [
        # No linear biases, as the parameter count has none; megatron-core also allows MoE biases
        # only with etp 1 (TransformerConfig).
        ("--disable-bias-linear", None),
        ("--num-experts", str(m.num_experts)), ("--moe-router-topk", str(m.moe_top_k)),
        ("--moe-ffn-hidden-size", str(m.moe_ffn_hidden_size))]
    if m.moe_shared_expert_ffn_hidden_size:
        args.append(("--moe-shared-expert-intermediate-size", str(m.moe_shared_expert_ffn_hidden_size)))
    pattern = moe_layer_pattern(m)
    if pattern != "1":
        args.append(("--moe-layer-freq", pattern))
    args += [("--moe-router-score-function", m.moe_router), ("--moe-router-dtype", "fp32")]
    if m.moe_top_k == 1 and m.moe_router == "softmax":
        args.append(("--moe-router-pre-softmax", None))  # TransformerConfig: softmax over one expert has no gradient
    args += [("--expert-model-parallel-size", str(lay.ep)), ("--expert-tensor-parallel-size", str(lay.expert_tp)),
             ("--moe-grouped-gemm", None)]
    if m.moe_capacity_factor is not None:
        args += [("--moe-token-dispatcher-type", "alltoall"),
                 ("--moe-expert-capacity-factor", f"{m.moe_capacity_factor:g}"),
                 ("--moe-pad-expert-input-to-capacity", None)]
    elif lay.tp * lay.ep > 1:
        args += [("--moe-token-dispatcher-type", "flex"), ("--moe-flex-dispatcher-backend", "deepep")]
    else:
        args.append(("--moe-token-dispatcher-type", "alltoall"))
    return args


def precision_args(job: Job) -> list[tuple[str, Optional[str]]]:
    """A low-precision recipe as megatron-core 0.16's TransformerConfig spells it: fp8 recipes by
    --fp8-format and --fp8-recipe (tensorwise, delayed, blockwise and mxfp8; E4M3 forward with E5M2
    gradients, "hybrid", for the per-tensor recipes, E4M3 throughout for the block-scaled ones, as
    Transformer Engine's Float8BlockScaling and MXFP8BlockScaling default to), NVFP4 by --fp4-format
    e2m1 --fp4-recipe nvfp4 with the recipe's last layers kept in bf16 (--first-last-layers-bf16,
    which fp4_utils.get_fp4_context counts over the whole model), weights gathered quantized by
    --fp8-param-gather (--fp4-param-gather). The rest of the model trains in bf16."""
    t = job.training
    recipe = t.recipe
    args: list[tuple[str, Optional[str]]] = [("--bf16", None)]
    if recipe.peak == "fp4":
        args += [("--fp4-format", "e2m1"), ("--fp4-recipe", recipe.name)]
        tail = sum(job.high_precision_layers)
        if tail:
            args += [("--first-last-layers-bf16", None), ("--num-layers-at-start-in-bf16", "0"),
                     ("--num-layers-at-end-in-bf16", str(tail))]
        if t.fp8_param_gather:
            args.append(("--fp4-param-gather", None))
        return args
    per_tensor = recipe.name in ("delayed", "tensorwise")
    args += [("--fp8-format", "hybrid" if per_tensor else "e4m3"), ("--fp8-recipe", recipe.name)]
    if t.fp8_param_gather:
        args.append(("--fp8-param-gather", None))
    return args


def read_precision(flags: dict) -> Optional[tuple[str, Optional[str]]]:
    """(training.precision, fp8_recipe) a Megatron argument list trains in; None where it says nothing."""
    if flags.get("--fp4-format"):
        return "nvfp4", None
    if flags.get("--fp8-format"):
        recipe = flags.get("--fp8-recipe") or "delayed"  # TransformerConfig.fp8_recipe's default
        return ("mxfp8", None) if recipe == "mxfp8" else ("fp8", recipe)
    if "--fp16" in flags:
        return "fp16", None
    if "--bf16" in flags:
        return "bf16", None
    return None


def nodes_and_gpus(job: Job) -> tuple[int, int]:
    """(nodes, processes per node) for torchrun, which starts as many on every node."""
    n, per_node = job.cluster.num_gpus, job.cluster.gpu.gpus_per_node
    if n <= per_node:
        return 1, n
    if n % per_node:
        raise _refuse(f"{n} GPUs do not fill whole {per_node}-GPU nodes; torchrun starts the same "
                      "number of processes on every node")
    return n // per_node, per_node


def connections_line(lay: Layout) -> str:
    """CUDA_DEVICE_MAX_CONNECTIONS as validate_args wants it: 1 for tp or cp > 1 (on Hopper and
    older, so that the communication kernels launch before the GEMMs they overlap), anything but
    1 under Megatron-FSDP."""
    if lay.zero_stage >= 2:
        return "unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP refuses 1\n"
    if lay.tp > 1 or lay.cp > 1:
        return "export CUDA_DEVICE_MAX_CONNECTIONS=1  # validate_args: tp or cp > 1 needs it before Blackwell\n"
    return ""


def render(estimate, header_lines) -> dict[str, str]:
    job = estimate.job
    args = arguments(job)
    nodes, per_node = nodes_and_gpus(job)
    header = comment(_lines(header_lines))
    # A value of several words (--recompute-modules) is several arguments.
    body = "".join(" ".join(argument_word("megatron", word) for word in [flag, *(value or "").split()]) + "\n"
                   for flag, value in args)
    lay = job.layout
    summary = (f"Megatron-LM pretrain_gpt.py arguments: layout dp={lay.dp} tp={lay.tp} pp={lay.pp} cp={lay.cp} "
               f"vpp={lay.vpp}" + (f" ep={lay.ep} etp={lay.expert_tp}" if job.model.is_moe else "")
               + f", {job.grad_accum} micro-batches per step")
    args_text = (header + comment([
        summary,
        "Add data, tokenizer, learning-rate and architecture details the planner does not model",
        "(--position-embedding-type, --normalization, --disable-bias-linear, ...) on the command line.",
    ]) + body)
    launch = (
        "#!/usr/bin/env bash\n" + header + comment([
            f"Megatron-LM on {nodes} node(s) x {per_node} GPUs; run once per node with NODE_RANK set.",
            "MEGATRON_LM: a Megatron-LM checkout; extra arguments (data, tokenizer, schedule) pass through.",
        ]) +
        "set -euo pipefail\n"
        "set -f  # no globbing of the arguments (a pipeline layout holds '*')\n"
        + connections_line(lay) +
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
        f"torchrun --nnodes {shell_word(nodes)} --nproc-per-node {shell_word(per_node)} \\\n"
        '    --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" '
        '--master-port "${MASTER_PORT:-6000}" \\\n'
        '    "${MEGATRON_LM:-.}/pretrain_gpt.py" $(grep -v \'^#\' "$HERE/' + ARGS_FILE + '") "$@"\n'
    )
    return {ARGS_FILE: args_text, LAUNCH_FILE: launch}


# --- reading ---------------------------------------------------------------------------------

_ASSIGNMENT = re.compile(r"^\s*(?:export\s+|local\s+|readonly\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _tokens(text: str, src: str) -> list[str]:
    """Shell words of a script or argument list: comments dropped, continuations joined, quotes
    removed, and ``$VAR`` / ``${VAR:-default}`` resolved from plain assignments in the same text
    (a value past MAX_EXPANDED_CHARS is refused: variables that double on every line would
    otherwise fill the memory)."""
    text = re.sub(r"\\\r?\n", " ", text)
    variables: dict[str, str] = {}
    words: list[str] = []
    for line in text.splitlines():
        try:
            line_words = shlex.split(line, comments=True)
        except ValueError:  # an unbalanced quote: fall back to whitespace
            line_words = line.split("#", 1)[0].split()
        match = _ASSIGNMENT.match(line)
        if match and len(line_words) == 1:
            name = match.group(1)
            value = line_words[0].split("=", 1)[1]
            variables[name] = _substitute(value, variables, src, name)
            continue
        for word in line_words:
            resolved = _substitute(word, variables, src, word)
            # An expanded variable splits into words, as unquoted in the shell.
            words += resolved.split() if resolved != word else [word]
    return words


def _substitute(word: str, variables: dict[str, str], src: str, key: str) -> str:
    def one(match: re.Match) -> str:
        name = match.group(1) or match.group(3)
        if name in variables:
            return variables[name]
        if match.group(2) is not None:
            return match.group(2)
        return match.group(0)

    length = len(word) + sum(len(variables.get(m.group(1) or m.group(3), "")) for m in _REFERENCE.finditer(word))
    if length > MAX_EXPANDED_CHARS:
        raise CaseError(src, key, f"expands past {MAX_EXPANDED_CHARS:,} characters; expected a launch script "
                                  "whose variables hold arguments")
    return _REFERENCE.sub(one, word)


def _flags(words: list[str]) -> dict[str, Optional[str]]:
    """The last value of every flag read() knows (argparse keeps the last)."""
    known = set(INT_FLAGS) | set(STR_FLAGS) | set(BOOL_FLAGS) | set(ALIASES)
    found: dict[str, Optional[str]] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if "=(" in word:  # the first element of a one-line array: NAME=(--flag value ...)
            word = word.split("=(", 1)[1]
        word = word.lstrip("(").rstrip(")")
        flag, _, inline = word.partition("=")
        flag = flag.replace("_", "-") if flag.startswith("--nproc_") else flag
        flag = ALIASES.get(flag, flag)
        if flag in known:
            if flag in BOOL_FLAGS:
                found[flag] = None
            elif inline:
                found[flag] = inline
            elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                found[flag] = words[i + 1].rstrip(")")
                i += 1
            else:
                found[flag] = ""
        i += 1
    return found


# How launch.sh (ours, and scripts written like it) takes its arguments from a file beside it.
_INCLUDED_ARGS = re.compile(r"""\$\(\s*grep\s+-v\s+(['"])\^#\1\s+"?\$\{?HERE\}?/([A-Za-z0-9_.-]+)"?\s*\)""")


def _with_included_args(text: str, path: Path) -> str:
    """``text`` with each ``$(grep -v '^#' "$HERE/FILE")`` replaced by FILE's lines (FILE beside ``path``)."""
    included = []
    for match in _INCLUDED_ARGS.finditer(text):
        included.append(read_text(path.parent / match.group(2)))
    if not included:
        return text
    return "\n".join([_INCLUDED_ARGS.sub(" ", text), *included])


def read(path: Path, case) -> Layout:
    """The layout of a Megatron-LM argument list or launch script, checked against ``case``."""
    path = Path(path)
    src = str(path)
    text = _with_included_args(read_text(path), path)
    flags = _flags(_tokens(text, src))

    def integer(flag: str, default: Optional[int] = None) -> Optional[int]:
        if flag not in flags:
            return default
        value = flags[flag]
        digits = (value or "").strip()
        if not re.fullmatch(r"[+-]?\d+", digits):
            raise CaseError(src, flag, f"expected an integer, got {value!r}")
        if len(digits.lstrip("+-")) > len(str(MAX_INT)) or int(digits) > MAX_INT:
            raise CaseError(src, flag, f"expected an integer <= {MAX_INT}, got {digits}")
        number = int(digits)
        if number < (0 if flag == "--recompute-num-layers" else 1):
            raise CaseError(src, flag, f"expected a positive integer, got {number}")
        return number

    model, training = case.model, case.training
    num_gpus = case.cluster.num_gpus

    # torchrun's world, where the script says it.
    if "--nnodes" in flags and "--nproc-per-node" in flags and ":" not in (flags["--nnodes"] or ""):
        world = integer("--nnodes") * integer("--nproc-per-node")
        if world != num_gpus:
            raise CaseError(src, "--nnodes", f"--nnodes x --nproc-per-node = {world} GPUs, "
                                             f"but the case has {num_gpus}")

    # The model, where given, must be the case's.
    for flag, expected in (("--num-layers", model.num_layers), ("--hidden-size", model.hidden_size),
                           ("--num-attention-heads", model.num_attention_heads),
                           ("--ffn-hidden-size", model.ffn_hidden_size), ("--seq-length", training.seq_len)):
        value = integer(flag)
        if value is not None and value != expected:
            raise CaseError(src, flag, f"{value} differs from the case's {expected}")
    for flag, expected in (("--num-experts", model.num_experts), ("--moe-router-topk", model.moe_top_k)):
        value = integer(flag)
        if value is not None and value != expected:
            raise CaseError(src, flag, f"{value} differs from the case's {expected or 'dense model (no experts)'}")
    groups = integer("--num-query-groups")
    if groups is not None and "--group-query-attention" in flags and groups != model.num_kv_heads:
        raise CaseError(src, "--num-query-groups", f"{groups} differs from the case's {model.num_kv_heads} KV heads")

    read = read_precision(flags)
    if read is not None:
        precision, recipe = read
        if precision != training.precision:
            flag = {"fp8": "--fp8-format", "mxfp8": "--fp8-recipe", "nvfp4": "--fp4-format", "fp16": "--fp16",
                    "bf16": "--bf16"}[precision]
            raise CaseError(src, flag, f"trains in {precision}, but the case's precision is {training.precision}")
        if precision == "fp8" and recipe != training.recipe.name:
            raise CaseError(src, "--fp8-recipe", f"scales fp8 {recipe}, but the case's recipe is "
                                                 f"{training.recipe.name} (training.fp8_recipe)")

    tp = integer("--tensor-model-parallel-size", 1)
    pp = integer("--pipeline-model-parallel-size", 1)
    cp = integer("--context-parallel-size", 1)
    if num_gpus % (tp * pp * cp):
        raise CaseError(src, "--tensor-model-parallel-size",
                        f"tp·pp·cp = {tp}·{pp}·{cp} = {tp * pp * cp} must divide the case's {num_gpus} GPUs")
    dp = num_gpus // (tp * pp * cp)
    if model.num_attention_heads % tp:
        raise CaseError(src, "--tensor-model-parallel-size",
                        f"{tp} must divide num_attention_heads {model.num_attention_heads}")

    if "--micro-batch-size" not in flags:
        raise CaseError(src, "--micro-batch-size", "missing (Megatron-LM requires it)")
    micro = integer("--micro-batch-size")
    global_batch = integer("--global-batch-size")
    if global_batch is None:
        global_batch = micro * dp  # validate_args' default
        if global_batch != training.global_batch_size:
            raise CaseError(src, "--global-batch-size",
                            f"missing, so Megatron-LM uses micro-batch x dp = {micro}·{dp} = {global_batch}, "
                            f"but the case's global batch is {training.global_batch_size}")
    if global_batch != training.global_batch_size:
        raise CaseError(src, "--global-batch-size",
                        f"{global_batch} differs from the case's global batch {training.global_batch_size}")
    if global_batch % (micro * dp):
        raise CaseError(src, "--global-batch-size",
                        f"{global_batch} must divide by micro-batch x dp = {micro}·{dp} = {micro * dp}")

    # Pipeline partition and interleaving.
    layers = model.num_layers
    first = integer("--decoder-first-pipeline-num-layers")
    last = integer("--decoder-last-pipeline-num-layers")
    stage_layers: Optional[tuple[int, ...]] = None
    custom = flags.get("--pipeline-model-parallel-layout")
    accounted = {field: flag in flags for field, flag in ACCOUNT_FLAGS.items()}
    units = layers + sum(accounted.values())
    if any(accounted.values()):
        flag = next(f for field, f in ACCOUNT_FLAGS.items() if accounted[field])
        for other in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                      "--pipeline-model-parallel-layout"):
            if other in flags:
                raise CaseError(src, flag, f"cannot be combined with {other} (TransformerConfig)")
        if pp == 1:
            raise CaseError(src, flag, "needs --pipeline-model-parallel-size > 1")
        if units % pp:
            raise CaseError(src, flag, f"num_layers {layers} with the embedding and loss counted ({units}) "
                                       f"must divide by --pipeline-model-parallel-size {pp}")
    if custom is None and (first is not None or last is not None):
        if pp == 1:
            raise CaseError(src, "--decoder-first-pipeline-num-layers", "needs --pipeline-model-parallel-size > 1")
        rest, middle_stages = layers - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
        if rest < 0 or bool(rest) != bool(middle_stages) or (middle_stages and rest % middle_stages):
            raise CaseError(src, "--decoder-first-pipeline-num-layers",
                            f"the {rest} layers left after the first/last stages must split evenly over "
                            f"the {middle_stages} other stages")
        middle = rest // middle_stages if middle_stages else 0
        stages = ([first] if first is not None else []) + [middle] * middle_stages \
            + ([last] if last is not None else [])
        stage_layers = tuple(stages) if len(set(stages)) > 1 else None
    elif custom is None and pp > 1 and units % pp:
        raise CaseError(src, "--pipeline-model-parallel-size",
                        f"num_layers {layers} must divide by {pp} (or give --decoder-first/last-pipeline-num-layers)")
    per_chunk = integer("--num-layers-per-virtual-pipeline-stage")
    chunks = integer("--num-virtual-stages-per-pipeline-rank")
    vpp = 1
    if custom is not None:
        flag = "--pipeline-model-parallel-layout"
        for other in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                      "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"):
            if other in flags:
                raise CaseError(src, flag, f"cannot be combined with {other}")
        try:
            counts = parse_layout_string(custom, pp)
        except ValueError as error:
            raise CaseError(src, flag, f"{error} in {custom!r}") from None
        if sum(counts) != layers:
            raise CaseError(src, flag, f"holds {sum(counts)} transformer layers, the case's model {layers}")
        vpp = len(counts) // pp
        per_rank = [[counts[v * pp + r] for v in range(vpp)] for r in range(pp)]
        if any(tuple(chunks_of_rank) != chunk_layers(sum(chunks_of_rank), vpp) or 0 in chunks_of_rank
               for chunks_of_rank in per_rank):
            raise CaseError(src, flag, "model chunks of one pipeline rank must hold equal, non-zero layer counts, "
                                       "or differ by one with the larger first (the planner models no other split)")
        stages = [sum(chunks_of_rank) for chunks_of_rank in per_rank]
        stage_layers = tuple(stages) if len(set(stages)) > 1 else None
        if layers % (pp * vpp) and stage_layers == virtual_partition(layers, pp, vpp):
            stage_layers = None  # the split the planner makes by itself (cost_models.partition)
    elif per_chunk is not None and chunks is not None:
        raise CaseError(src, "--num-layers-per-virtual-pipeline-stage",
                        "give either it or --num-virtual-stages-per-pipeline-rank, not both")
    if per_chunk is not None:
        if first is not None or last is not None:
            raise CaseError(src, "--num-layers-per-virtual-pipeline-stage",
                            "with an uneven pipeline Megatron-LM needs --num-virtual-stages-per-pipeline-rank")
        if (layers // pp) % per_chunk:
            raise CaseError(src, "--num-layers-per-virtual-pipeline-stage",
                            f"{per_chunk} must divide the {layers // pp} layers per pipeline stage")
        vpp = layers // pp // per_chunk
    elif chunks is not None:
        vpp = chunks
    if vpp > 1:
        if pp == 1:
            raise CaseError(src, "--num-layers-per-virtual-pipeline-stage", "interleaving needs pipeline parallelism")
        if pp <= 2 and "--no-overlap-p2p-communication" in flags:
            raise CaseError(src, "--no-overlap-p2p-communication",
                            "interleaving without p2p overlap needs --pipeline-model-parallel-size > 2")
        for n in (() if custom is not None else stage_layers or (units // pp,)):
            if n % vpp:
                raise CaseError(src, "--num-virtual-stages-per-pipeline-rank",
                                f"{vpp} model chunks must divide every stage's layers, got a stage of {n}; "
                                "give --pipeline-model-parallel-layout for unequal chunks")
        microbatches = global_batch // (micro * dp)
        if microbatches % pp:
            raise CaseError(src, "--global-batch-size",
                            f"interleaving needs the {microbatches} micro-batches per step to divide by pp {pp}")

    # Optimizer sharding.
    zero = 1 if "--use-distributed-optimizer" in flags else 0
    if "--use-torch-fsdp2" in flags:
        zero = 3
    elif "--use-megatron-fsdp" in flags or "--use-custom-fsdp" in flags:
        strategy = flags.get("--data-parallel-sharding-strategy") or "no_shard"
        stages_of = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
        if strategy not in stages_of:
            raise CaseError(src, "--data-parallel-sharding-strategy",
                            f"expected one of {', '.join(stages_of)}, got {strategy!r}")
        zero = max(zero, stages_of[strategy])

    # Sequence parallelism: validate_args turns it off when tp is 1.
    sequence_parallel = "--sequence-parallel" in flags and tp > 1

    # Recomputation.
    granularity = flags.get("--recompute-granularity")
    if granularity is None and "--recompute-activations" in flags:
        granularity = "selective"
    recompute, recompute_layers = "none", None
    method = flags.get("--recompute-method")
    if granularity == "selective":
        recompute = "selective"
        if method is not None:
            raise CaseError(src, "--recompute-method", "does not apply to --recompute-granularity selective")
    elif granularity == "full":
        recompute = "full"
        if method not in ("uniform", "block"):
            raise CaseError(src, "--recompute-method", f"expected uniform or block with full recomputation, "
                                                       f"got {method!r}")
        count = integer("--recompute-num-layers")
        if count is None:
            raise CaseError(src, "--recompute-num-layers", "missing (full recomputation requires it)")
        if method == "block":
            per_stage = count * vpp  # block counts layers per model chunk
            if per_stage < max(stage_layers or (layers // pp,)):
                recompute_layers = per_stage
    elif granularity is not None:
        raise CaseError(src, "--recompute-granularity", f"expected selective or full, got {granularity!r}")

    # Offload: the distributed optimizer's share on the CPU, the first layers' activations.
    offload_optimizer = 0.0
    if "--optimizer-cpu-offload" in flags:
        text = flags.get("--optimizer-offload-fraction") or "1.0"
        try:
            offload_optimizer = float(text)
        except ValueError:
            raise CaseError(src, "--optimizer-offload-fraction", f"expected a fraction, got {text!r}") from None
        if not 0 <= offload_optimizer <= 1:
            raise CaseError(src, "--optimizer-offload-fraction", f"expected a fraction in [0, 1], got {text}")
    offload_activations = integer("--cpu-offloading-num-layers", 0) if "--cpu-offloading" in flags else 0

    try:
        experts = {}
        if model.is_moe:  # megatron-core's default expert tensor parallel size is tp
            experts = {"ep": integer("--expert-model-parallel-size", 1),
                       "etp": integer("--expert-tensor-parallel-size", tp)}
        layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, micro_batch_size=micro, zero_stage=zero,
                        sequence_parallel=sequence_parallel, recompute=recompute,
                        recompute_num_layers=recompute_layers, stage_layers=stage_layers,
                        offload_optimizer=offload_optimizer, offload_activations=offload_activations, **accounted,
                        **experts)
        Job(case.model, case.cluster, case.training, layout, case.overheads)
    except SpecError as error:
        raise CaseError(src, FLAG_OF_FIELD.get(error.key, error.key), error.message) from None
    return layout
