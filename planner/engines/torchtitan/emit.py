"""torchtitan 0.3.0 launch files for a planned layout.

torchtitan 0.3.0 has no TOML job file any more (no ``--job.config_file``): its
``ConfigManager`` (``torchtitan/config/manager.py``) loads a Python *config
registry* — ``--module M --config F`` imports ``M.config_registry`` or ``M`` and calls
``F()`` for a ``Trainer.Config`` — and then applies ``--section.key value`` overrides
through tyro. So the emitted files are:

- ``torchtitan_config.py``: a config-registry module whose ``layout_planner()`` takes a
  torchtitan base config (``llama3_8b`` and kin) and sets the planned parallelism, batch,
  activation checkpointing and mixed precision on it;
- ``overrides.txt``: the same settings as command-line overrides, to put after
  ``--module llama3 --config llama3_8b`` (or any other base config);
- ``launch.sh``: ``torchrun … -m torchtitan.train --module torchtitan_config --config layout_planner``.

Mapping (field names as in ``torchtitan/config/configs.py``, ``trainer.py``,
``distributed/parallel_dims.py``, ``distributed/pipeline_parallel.py``):

- ZeRO-3 is FSDP2 sharding, ``data_parallel_shard_degree = dp`` with
  ``fsdp_reshard_after_forward = "always"`` (parameters gathered per micro-batch, as the
  cost model assumes; torchtitan's default keeps them gathered between a pipeline's
  micro-batches); ZeRO-0 is replication, ``data_parallel_replicate_degree = dp``.
  ZeRO 1 and 2 have no torchtitan counterpart.
- TP runs with sequence parallelism where the plan does (``enable_sequence_parallel``, torchtitan's
  default on).
- Without PP, ``local_batch_size`` is the micro-batch and torchtitan's gradient accumulation
  (``global_batch_size / (local_batch_size · dp)``) is the plan's. With PP, torchtitan splits
  ``local_batch_size`` into pipeline micro-batches of ``pipeline_parallel_microbatch_size``
  inside one schedule run; the plan's micro-batches all go through one pipeline flush, so
  ``local_batch_size = micro_batch · grad_accum`` and torchtitan accumulates once.
- Pipeline stages are explicit ``module_fqns_per_model_part`` (``tok_embeddings``,
  ``layers.i``, ``norm``, ``lm_head``): ``pp · vpp`` model parts, part ``v`` on rank
  ``v mod pp`` (torchtitan's "loop" placement for ``Interleaved1F1B``), with the plan's
  layers per stage.
"""

from __future__ import annotations

from typing import Any, Optional

from cost_models.activations import chunked_loss, loss_chunks
from cost_models.stage_time import cp_exchange

from planner.engines import ENGINES
from planner.errors import CaseError
from planner.emit import header_lines as _header
from planner.emit.quoting import argument_word, comment, python_literal, shell_word
from planner.emit.slurm import SBATCH_FILE, launch_nodes, master_addr, sbatch

from .engine import BEHAVIOUR

CONFIG_FILE = "torchtitan_config.py"
CONFIG_MODULE = "torchtitan_config"
CONFIG_FUNCTION = "layout_planner"
OVERRIDES_FILE = "overrides.txt"
LAUNCH_FILE = "launch.sh"

# Models torchtitan ships a config for (torchtitan/models/llama3/__init__.py flavors 8B,
# 70B, 405B), by shape: (layers, hidden, heads, kv heads, ffn, vocab). Any other model
# gets the Llama 3 8B config as a stand-in whose model_spec the user replaces.
BASE_CONFIGS = {
    (32, 4096, 32, 8, 14336, 128256): ("llama3", "llama3_8b", "8B"),
    (80, 8192, 64, 8, 28672, 128256): ("llama3", "llama3_70b", "70B"),
    (126, 16384, 128, 8, 53248, 128256): ("llama3", "llama3_405b", "405B"),
}
DEFAULT_BASE = ("llama3", "llama3_8b", "8B")
# Mixtures of experts torchtitan ships (torchtitan/models/{deepseek_v3,qwen3,gpt_oss}/config_registry.py),
# by (layers, hidden, experts, top-k, expert width, router groups, groups picked: the 671B flavour routes
# over 8 groups, 4 picked, models/deepseek_v3/__init__.py); any other gets Qwen3-30B-A3B's as a stand-in,
# so that the expert-parallel degree applies to a model with experts. Each with the flavour of the
# model it builds (model_registry(flavor), models/*/__init__.py): Qwen3-235B-A22B's, which torchtitan
# ships as a flavour with no training config of its own, on Qwen3-30B-A3B's config (its 30B-A3B model
# had trained in its place, 94 layers' stages naming 48).
MOE_BASE_CONFIGS = {
    (61, 7168, 256, 8, 2048, 8, 4): ("deepseek_v3", "deepseek_v3_671b", "671B"),
    (27, 2048, 64, 6, 1408, 1, 1): ("deepseek_v3", "deepseek_v3_16b", "16B"),  # DeepSeek-V2-Lite's shape
    (48, 2048, 128, 8, 768, 1, 1): ("qwen3", "qwen3_30b_a3b", "30B-A3B"),
    (94, 4096, 128, 8, 1536, 1, 1): ("qwen3", "qwen3_30b_a3b", "235B-A22B"),
    (24, 2880, 32, 4, 2880, 1, 1): ("gpt_oss", "gpt_oss_20b", "20b"),
    (36, 2880, 128, 4, 2880, 1, 1): ("gpt_oss", "gpt_oss_120b", "120b"),
}
DEFAULT_MOE_BASE = ("qwen3", "qwen3_30b_a3b", "30B-A3B")
# The chunks every base config above runs its loss in (models/*/config_registry.py:
# loss=ChunkedLossWrapper.Config(...), num_chunks' default): the engine's.
BASE_LOSS_CHUNKS = BEHAVIOUR.loss_chunks
# The base configs that build their model with quantization converters of their own
# (models/llama3/config_registry.py: llama3_405b's Float8LinearConverter, filter_fqns ["lm_head"]).
BASE_CONVERTERS = {"llama3_405b": "Float8LinearConverter"}
# The longest training sequence each torchtitan model family's RoPE is built for (max_seq_len in
# models/{llama3,qwen3,deepseek_v3,gpt_oss}/__init__.py; models/common/decoder.py refuses a longer one).
ROPE_MAX_SEQ_LEN = {"llama3": 131072, "qwen3": 40960, "deepseek_v3": 16384, "gpt_oss": 131072}
def _base(model) -> tuple[tuple[str, str, str], bool]:
    """((torchtitan module, config function, model flavour), whether it is the model itself)."""
    if model.is_moe:
        shape = (model.num_layers, model.hidden_size, model.num_experts, model.moe_top_k, model.moe_ffn_hidden_size,
                 model.moe_router_num_groups, model.moe_router_group_topk)
        return (MOE_BASE_CONFIGS[shape], True) if shape in MOE_BASE_CONFIGS else (DEFAULT_MOE_BASE, False)
    shape = (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_kv_heads,
             model.ffn_hidden_size, model.vocab_size)
    if model.activation == "swiglu" and not model.tied_embeddings and shape in BASE_CONFIGS:
        return BASE_CONFIGS[shape], True
    return DEFAULT_BASE, False


def base_config(model) -> tuple[tuple[str, str], bool]:
    """((torchtitan module, config function), whether it is the model itself) for ``model``."""
    (module, function, _), exact = _base(model)
    return (module, function), exact


def base_flavor(function: str) -> Optional[str]:
    """The flavour a base config function builds its own model as: its first entry above (None for a
    function not among them)."""
    table = list(BASE_CONFIGS.values()) + [DEFAULT_BASE] + list(MOE_BASE_CONFIGS.values()) + [DEFAULT_MOE_BASE]
    return next((flavor for _, name, flavor in table if name == function), None)


def model_flavor(model) -> str:
    """The flavour the emitted config rebuilds its model as (``model_registry(flavor, converters=...)``,
    models/*/__init__.py; the configs call it with the registry's default backends, so rebuilding with
    converters keeps them)."""
    return _base(model)[0][2]


# training.precision → training.mixed_precision_param (a Literal["bfloat16", "float32"]).
PARAM_DTYPES = {"bf16": "bfloat16", "fp8": "bfloat16", "mxfp8": "bfloat16", "nvfp4": "bfloat16", "fp32": "float32"}


def converters(job) -> list[tuple[str, dict[str, Any]]]:
    """torchtitan's quantization converters for the recipe, as (class in
    torchtitan.components.quantization, Config fields): what the cost model prices. fp8 by
    Float8LinearConverter with the recipe's name and the LM head left in bf16 (as torchtitan's
    llama3_405b config filters "lm_head"); MXFP8 and NVFP4 by fqns that match the decoder layers
    only ("layers.N." as nvfp4_bf16_tail_fqns writes them), NVFP4's last layers left in bf16."""
    recipe = job.training.recipe
    if recipe is None:
        return []
    moe = job.model.is_moe
    if job.training.precision == "fp8":
        # A mixture of experts as torchtitan's deepseek_v3_671b_float8 converts it: the experts' grouped
        # GEMMs by their own converter (Float8LinearConverter walks Linear configs only), the router's gate
        # left in bf16 as the cost model prices it (cost_models/experts.py).
        if moe:
            return [("Float8LinearConverter", {"recipe_name": recipe.name, "filter_fqns": ["lm_head", "router.gate"]}),
                    ("Float8GroupedExpertsConverter", {})]
        return [("Float8LinearConverter", {"recipe_name": recipe.name, "filter_fqns": ["lm_head"]})]
    converted = job.model.num_layers - sum(job.high_precision_layers)
    if moe:
        # fqns is an include list (substring): as deepseek_v3_debugmodel_mxfp8 names the dense linears,
        # so that the router's gate stays bf16; the experts by the grouped converter.
        parts = ("attention", "shared_experts", "feed_forward")
        fqns = list(parts) if converted == job.model.num_layers else \
            [f"layers.{i}.{part}" for i in range(converted) for part in parts]
        # pad_multiple 128: "The CuTeDSL quantization kernel on sm_100 requires multiples of 128"
        # (components/quantization/mx.py, MXFP8GroupedExpertsConverter.Config; its default 32), as
        # torchtitan's deepseek_v3_debugmodel_mxfp8 sets it; MXFP8 runs on SM100 only (engine.py).
        return [("MXFP8LinearConverter", {"fqns": fqns}), ("MXFP8GroupedExpertsConverter", {"pad_multiple": 128})]
    fqns = ["layers."] if converted == job.model.num_layers else [f"layers.{i}." for i in range(converted)]
    name = "MXFP8LinearConverter" if job.training.precision == "mxfp8" else "NVFP4LinearConverter"
    return [(name, {"fqns": fqns})]


def _refuse(why: str) -> CaseError:
    return CaseError("--emit", "torchtitan", why)


def check(estimate) -> None:
    """Raise a CaseError for the first thing in the layout torchtitan cannot run
    (planner/engines/torchtitan/engine.py)."""
    ENGINES["torchtitan"].refuse_unrunnable(estimate.job)
    job = estimate.job
    (module, _), exact = base_config(job.model)
    if estimate.job.model.mtp_layers and not (exact and module == "deepseek_v3"):
        raise _refuse("model.mtp_layers: torchtitan builds multi-token prediction layers into its own DeepSeek-V3 "
                      "configs only (671B, 16B); this model is neither")
    if job.layout.cp > 1 and cp_exchange(job.training) in ("allgather", "alltoall"):
        # 0.3.0 runs context parallelism as FlexAttention's K/V gather (EngineBehaviour.cp_exchange); the
        # emitted files cannot run the torch ring a case asked the plan to price instead.
        raise _refuse(f"training.cp_exchange: the plan priced torch's ring attention ({cp_exchange(job.training)}), "
                      "but torchtitan 0.3.0 runs context parallelism as FlexAttention's K/V all-gather (kv_gather)")


def stage_modules(estimate) -> list[list[str]]:
    """``module_fqns_per_model_part``: pp·vpp parts in virtual-stage order."""
    job = estimate.job
    lay = job.layout
    parts: list[list[str]] = []
    first = 0
    for v, count in enumerate(job.model_chunk_layers):  # the chunks priced
        part = [f"layers.{i}" for i in range(first, first + count)]
        first += count
        if v == 0:
            part.insert(0, "tok_embeddings")
        if v == lay.pp * lay.vpp - 1:
            part += ["norm", "lm_head"]
        parts.append(part)
    assert first == job.model.num_layers
    return parts


def settings(estimate) -> dict[str, Any]:
    """The torchtitan settings for the layout: {"parallelism": {...}, "training": {...},
    "activation_checkpoint": "none" | "selective" | "full"}."""
    check(estimate)
    job = estimate.job
    lay, training = job.layout, job.training
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": lay.dp if lay.zero_stage == 0 else 1,
        "data_parallel_shard_degree": lay.dp if lay.zero_stage == 3 else 1,
        "fsdp_reshard_after_forward": "always" if lay.zero_stage == 3 else "default",
        "tensor_parallel_degree": lay.tp,
        "enable_sequence_parallel": lay.sequence_parallel or lay.tp == 1,
        "context_parallel_degree": lay.cp,
        "pipeline_parallel_degree": lay.pp,
    }
    if job.model.is_moe:
        # Expert parallelism borrows its ranks from FSDP and TP; the experts are FSDP-sharded over
        # the rest (ParallelDims: efsdp = dp_shard·cp·tp / ep).
        parallelism["expert_parallel_degree"] = lay.ep
    train: dict[str, Any] = {
        "global_batch_size": training.global_batch_size,
        "seq_len": training.seq_len,
        "mixed_precision_param": PARAM_DTYPES[training.precision],
    }
    if lay.pp > 1:
        parallelism.update({
            "pipeline_parallel_schedule": "Interleaved1F1B" if lay.vpp > 1 else "1F1B",
            "pipeline_parallel_microbatch_size": lay.micro_batch_size,
            "module_fqns_per_model_part": stage_modules(estimate),
        })
        train["local_batch_size"] = lay.micro_batch_size * job.grad_accum
    else:
        parallelism["module_fqns_per_model_part"] = None
        train["local_batch_size"] = lay.micro_batch_size
    if lay.pp > 1 or lay.ep > 1:
        # Trainer.Config refuses CUDA graphs with PP, and with expert parallelism whose token dispatcher
        # synchronizes with the host (trainer.py, _validate_cuda_graphs): the all-to-all the plan prices.
        train["disable_cuda_graphs"] = True
    if lay.offload_params:  # FSDP2 CPUOffloadPolicy: parameters, gradients and the optimizer step on the CPU
        train["enable_cpu_offload"] = True
    if lay.recompute == "full" or lay.recompute_num_layers is not None:
        ac = "full"
    else:
        ac = lay.recompute  # "none" or "selective"
    # The plan priced the model compiled (engine.py: fused element-wise kernels), and
    # the loss unless the case says not (training.compiled_loss false: eager cross-entropy's
    # memory; compile.components defaults to both); the quantization converters want it too.
    # Each written whatever the base config says: DeepSeek-V3's compile the loss alone, llama3_405b
    # runs async TP (models/*/config_registry.py).
    out = {"parallelism": parallelism, "training": train, "activation_checkpoint": ac,
           "compile": {"enable": True,
                       "components": ["model"] if training.compiled_loss is False else ["model", "loss"],
                       # Async TP pipelines the TP collectives with their matmuls; torchtitan builds it
                       # with torch.compile of the model (CompileConfig refuses it otherwise).
                       "enable_async_tensor_parallel": bool(training.tp_comm_overlap and lay.tp > 1)}}
    # The implementation the plan priced, written in both directions whatever the base config says: with bf16
    # moments, OptimizersContainer's step pre-hook creates Adam's exp_avg and exp_avg_sq in bfloat16 beside the
    # float32 parameters (components/optimizer/optimizer.py, _register_bf16_optimizer_state_hook), as
    # model_states.state_bytes prices them; with fp32 moments, "fused", torchtitan's default, which a base
    # config that sets fused_opt_states_bf16 (or foreach, as kimi_k2_7's does) would otherwise replace.
    out["optimizer"] = {"implementation": "fused_opt_states_bf16" if training.optimizer_moments == "bf16"
                        else "fused"}
    if training.recipe is not None:
        out["converters"] = converters(job)
    if lay.cp > 1:
        # The K/V exchange the plan priced with cp is FlexAttention's all-gather (stage_time.cp_exchange,
        # kv_gather): written whatever the registry's default (flex for llama3, qwen3, deepseek_v3; varlen,
        # which refuses cp, for gpt_oss), so that a changed default cannot run another exchange.
        out["attn_backend"] = "flex"
    if job.model.mtp_layers:
        out["mtp_layers"] = job.model.mtp_layers
    else:
        # The chunks the plan priced the LM head and the loss in (activations.loss_chunks), written whatever
        # the base config says (its ChunkedLossWrapper's num_chunks), and for one chunk whether it priced
        # the wrapper's (activations.chunked_loss) or the cross-entropy on whole logits.
        out["loss_chunks"] = loss_chunks(job.model, training)
        if out["loss_chunks"] == 1:
            out["chunked_loss"] = chunked_loss(job.model, training)
    return out


def whole_logits(s: dict) -> bool:
    """Whether the settings (:func:`settings`) run the loss on whole logits: one chunk, not the
    wrapper's one chunk (MTP's loss, which has no chunks, aside)."""
    return s.get("loss_chunks") == 1 and not s.get("chunked_loss")


def _cli_option(section: str, key: str, value: Any) -> list[str]:
    """One override as tyro parses it: booleans are flags (``--s.k`` / ``--s.no_k``)."""
    if isinstance(value, bool):
        return [f"--{section}.{key}" if value else f"--{section}.no_{key}"]
    if value is None:
        return [f"--{section}.{key}", "None"]
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        # list[str]: one comma-joined token (ConfigManager: "--compile.components model loss" is refused)
        return [f"--{section}.{key}", ",".join(value)]
    if isinstance(value, list):  # list[list[str]]: one comma-joined token per part
        return [f"--{section}.{key}", *(",".join(part) for part in value)]
    return [f"--{section}.{key}", str(value)]


def overrides(estimate) -> list[list[str]]:
    """Command-line overrides, one option per entry; the activation-checkpoint subcommand
    (a tyro union) comes last, since options after it belong to its scope."""
    s = settings(estimate)
    out = []
    for section in ("parallelism", "training", "compile", "optimizer"):
        for key, value in s.get(section, {}).items():
            out.append(_cli_option(section, key, value))
    chunks = s.get("loss_chunks", BASE_LOSS_CHUNKS)
    if chunks != BASE_LOSS_CHUNKS and not whole_logits(s):
        # Every base config's ChunkedLossWrapper takes its chunks from the command line (tyro:
        # --loss.num_chunks), one included; its cross-entropy on whole logits it cannot take: render says so.
        out.append(_cli_option("loss", "num_chunks", chunks))
    out.append([f"activation_checkpoint:{s['activation_checkpoint']}"])
    return out


def warnings(estimate) -> list[str]:
    """What the user must do before the files run: the CLI prints these on stderr."""
    model = estimate.job.model
    (module, function), exact = base_config(model)
    if exact:
        return []
    # apply_layout rebuilds the model from MODEL_REGISTRY and MODEL_FLAVOR, whatever BASE_CONFIG builds:
    # pointing BASE_CONFIG alone at the user's model still trained the stand-in's.
    return [f"{model.name} is not one of torchtitan's model configs: BASE_CONFIG ({module}/{function}), "
            f"MODEL_REGISTRY and MODEL_FLAVOR ({model_flavor(model)}) in {CONFIG_FILE} are a stand-in; point "
            f"BASE_CONFIG at a config registry function for your model and MODEL_REGISTRY and MODEL_FLAVOR at its "
            f"model (the model is rebuilt from those two; the settings are for {model.name})"]


def _notes(estimate) -> list[str]:
    job = estimate.job
    lay = job.layout
    notes = warnings(estimate)
    if lay.pp > 1:
        chunks = " ".join(map(str, job.model_chunk_layers))
        notes.append(f"pipeline: {lay.pp} stages x {lay.vpp} virtual, layers per model part (in the order of "
                     f"module_fqns_per_model_part) {chunks}; {job.grad_accum} micro-batches of "
                     f"{lay.micro_batch_size} per flush, one torchtitan accumulation step")
    else:
        notes.append(f"gradient accumulation: {job.grad_accum} steps of local batch {lay.micro_batch_size}")
    if lay.zero_stage == 0 and lay.cp > 1:
        notes.append("torchtitan applies FSDP over the context-parallel ranks even without "
                     "dp sharding: its states are sharded cp ways where the plan replicates them")
    if job.training.recipe is not None:
        notes.append(f"{job.training.precision}: the model is rebuilt with torchtitan's quantization converters "
                     f"(CONVERTERS below; model_spec is not a command-line option, so overrides.txt cannot "
                     f"carry them); parameters stay bfloat16")
    s = settings(estimate)
    chunks = s.get("loss_chunks", BASE_LOSS_CHUNKS)
    if whole_logits(s):
        notes.append(f"loss: the LM head and the loss run on whole logits (LOSS_CHUNKS below), not in the base "
                     f"config's {BASE_LOSS_CHUNKS} chunks; its cross-entropy is no command-line option, so "
                     f"overrides.txt cannot carry it")
    elif chunks != BASE_LOSS_CHUNKS:
        notes.append(f"loss: the LM head and the loss run in {chunks} sequence chunks (LOSS_CHUNKS below), "
                     f"not the base config's {BASE_LOSS_CHUNKS} (overrides.txt: --loss.num_chunks)")
    if job.model.mtp_layers:
        notes.append(f"multi-token prediction: the model is rebuilt with {job.model.mtp_layers} MTP layer(s) and "
                     "trained with MTPLoss (MTP_LAYERS below; not a command-line option either)")
    return notes


def _config_module(estimate, header: list[str]) -> str:
    s = settings(estimate)
    (module, function), _ = base_config(estimate.job.model)

    converter_block = (
        "# Low-precision linears: torchtitan quantization converters (class, Config fields), applied by\n"
        "# rebuilding the model spec with MODEL_REGISTRY's model_registry(MODEL_FLAVOR, converters=...).\n"
        f"CONVERTERS = {python_literal([[name, fields] for name, fields in s.get('converters', [])])}\n"
        f"MODEL_REGISTRY = {python_literal(f'torchtitan.models.{module}')}\n"
        f"MODEL_FLAVOR = {python_literal(model_flavor(estimate.job.model))}\n"
        "# Multi-token prediction layers (DeepSeek-V3's MTP modules): the model spec is rebuilt with them\n"
        "# and the loss is torchtitan's MTPLoss (models/deepseek_v3/mtp.py).\n"
        f"MTP_LAYERS = {python_literal(s.get('mtp_layers', 0))}\n"
        "# The attention backend the model is rebuilt with, where not the registry's default (None).\n"
        f"ATTN_BACKEND = {python_literal(s.get('attn_backend'))}\n"
        f"VOCAB_SIZE = {python_literal(estimate.job.model.vocab_size)}  # MTPLoss's global_vocab_size\n"
        "# The sequence chunks the LM head and the loss run in (the base config's ChunkedLossWrapper's\n"
        "# num_chunks; None: MTPLoss's), and for 1 whether it stays ChunkedLossWrapper's one chunk (True)\n"
        "# or is its cross-entropy on whole logits (False), which keeps the logits for backward.\n"
        f"LOSS_CHUNKS = {python_literal(s.get('loss_chunks'))}\n"
        f"CHUNKED_LOSS = {python_literal(not whole_logits(s) and 'loss_chunks' in s)}\n\n\n"
        "def mtp_loss():\n"
        '    """The loss of the main and the MTP predictions, as torchtitan\'s deepseek_v3_debugmodel_mtp sets it."""\n'
        "    from torchtitan.models.deepseek_v3.mtp import MTPLoss\n\n"
        "    return MTPLoss.Config(global_vocab_size=VOCAB_SIZE)\n\n\n"
        "def converters():\n"
        '    """The converter configs, as torchtitan.components.quantization defines them."""\n'
        "    from torchtitan.components import quantization\n\n"
        '    return [getattr(quantization, name).Config(model_compile_enabled=COMPILE.get("enable", False), **fields)\n'
        "            for name, fields in CONVERTERS]\n\n\n"
    )

    def block(name: str, values: dict[str, Any]) -> str:
        lines = [f"{name} = {{"]
        lines += [f"    {python_literal(key)}: {python_literal(value)}," for key, value in values.items()]
        return "\n".join(lines + ["}"]) + "\n"

    return (
        comment(header) + comment(_notes(estimate))
        + f'"""torchtitan 0.3.0 config registry for the planned layout.\n\n'
        f"Run with this folder on PYTHONPATH (launch.sh does it):\n"
        f"    torchrun ... -m torchtitan.train --module {CONFIG_MODULE} --config {CONFIG_FUNCTION}\n"
        f"Options after these (--section.key value) still override.\n"
        f'"""\n\n'
        "import importlib\n\n"
        "# The torchtitan config the layout is applied to (model, data, optimizer, ...).\n"
        f"BASE_MODULE = {python_literal(f'torchtitan.models.{module}.config_registry')}\n"
        f"BASE_CONFIG = {python_literal(function)}\n\n"
        + block("PARALLELISM", s["parallelism"]) + "\n"
        + block("TRAINING", s["training"]) + "\n"
        + block("COMPILE", s.get("compile", {})) + "\n"
        # The implementation the plan priced its Adam moments with (fused_opt_states_bf16: bf16; fused: fp32).
        + block("OPTIMIZER", s["optimizer"]) + "\n"
        + f"ACTIVATION_CHECKPOINT = {python_literal(s['activation_checkpoint'])}  # none | selective | full\n\n"
        + converter_block
        + "def apply_layout(config):\n"
        '    """Set the planned layout on a torchtitan Trainer.Config."""\n'
        "    for key, value in PARALLELISM.items():\n"
        "        setattr(config.parallelism, key, value)\n"
        "    for key, value in TRAINING.items():\n"
        "        setattr(config.training, key, value)\n"
        "    for key, value in COMPILE.items():\n"
        "        setattr(config.compile, key, value)\n"
        + "    for key, value in OPTIMIZER.items():\n"
          "        setattr(config.optimizer, key, value)\n" +
        "    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC\n\n"
        "    config.activation_checkpoint = {\n"
        '        "none": None, "selective": SelectiveAC.Config(), "full": FullAC.Config(),\n'
        "    }[ACTIVATION_CHECKPOINT]\n"
        "    # Rebuilt whatever CONVERTERS holds: a base config's own converters (llama3_405b's Float8) would\n"
        "    # otherwise train the model in another precision than the plan's.\n"
        "    registry = importlib.import_module(MODEL_REGISTRY)\n"
        "    extra = {\"num_mtp_layers\": MTP_LAYERS} if MTP_LAYERS else {}\n"
        "    if ATTN_BACKEND:\n"
        "        extra[\"attn_backend\"] = ATTN_BACKEND\n"
        "    config.model_spec = registry.model_registry(MODEL_FLAVOR, converters=converters(), **extra)\n"
        "    if MTP_LAYERS:\n"
        "        config.loss = mtp_loss()\n"
        "    elif LOSS_CHUNKS == 1 and not CHUNKED_LOSS:\n"
        "        config.loss = config.loss.loss_fn\n"
        "    else:\n"
        "        config.loss.num_chunks = LOSS_CHUNKS\n"
        "    return config\n\n\n"
        f"def {CONFIG_FUNCTION}():\n"
        "    base = getattr(importlib.import_module(BASE_MODULE), BASE_CONFIG)()\n"
        "    return apply_layout(base)\n"
    )


def launch_shape(estimate) -> tuple[int, int]:
    """(nnodes, nproc_per_node) for torchrun: equal processes on every node."""
    return launch_nodes(estimate.job.cluster, "torchtitan")


def needs_flex_attention(job) -> bool:
    """Whether the model spec must be rebuilt with FlexAttention: gpt_oss's model_registry builds
    VarlenAttention, which validate_config refuses under context parallelism with the default
    spmd_types backend (distributed/full_dtensor.py: "Use FlexAttention + CP"); its flex backend is
    the other models' default (models/*/__init__.py model_registry)."""
    return job.layout.cp > 1 and base_config(job.model)[0][0] == "gpt_oss"


def render(estimate, header_lines: list[str] | str) -> dict[str, str]:
    header = _header(header_lines)
    opts = overrides(estimate)  # also refuses what torchtitan cannot express
    (module, function), _ = base_config(estimate.job.model)
    nnodes, nproc = launch_shape(estimate)
    job = estimate.job
    not_here = (([f"Not here: the quantization converters (CONVERTERS in {CONFIG_FILE}); the model spec is "
                  "no command-line option."] if job.training.recipe is not None else [])
                + ([f"Not here either: {function} builds its model with {BASE_CONVERTERS[function]}, which no "
                    f"command-line option removes: these overrides on it train another precision than the "
                    f"plan's; run {CONFIG_FILE} (launch.sh does), which rebuilds the model as planned."]
                   if function in BASE_CONVERTERS else [])
                + ([f"Not here: the model: {function} builds torchtitan's {base_flavor(function)} model and the "
                    f"model spec is no command-line option, so these overrides on it train that model, not the "
                    f"planned {model_flavor(job.model)}; run {CONFIG_FILE} (launch.sh does), which "
                    f"rebuilds it (MODEL_FLAVOR)."]
                   if model_flavor(job.model) != base_flavor(function) else [])
                + ([f"Not here: the loss on whole logits (LOSS_CHUNKS = 1 in {CONFIG_FILE}): {function} runs "
                    f"ChunkedLossWrapper, whose chunks the command line sets but whose cross-entropy on whole "
                    f"logits it cannot: these overrides run the loss in {BASE_LOSS_CHUNKS} chunks."]
                   if whole_logits(settings(estimate)) else [])
                + ([f"Not here: the multi-token prediction layers and their loss (MTP_LAYERS in {CONFIG_FILE}); "
                    "neither is a command-line option."] if job.model.mtp_layers else [])
                + ([f"Not here: the attention backend: {function} builds VarlenAttention, which torchtitan "
                    "refuses under context parallelism, and the model spec is no command-line option: these "
                    f"overrides on it stop at startup; run {CONFIG_FILE} (launch.sh does), which rebuilds it "
                    "with FlexAttention (ATTN_BACKEND)."] if needs_flex_attention(job) else []))
    # Equivalent only where nothing the plan priced is left out: else the settings of CONFIG_FILE, short
    # of what follows (`diagnose` refuses these overrides then, as they train another job).
    title = f"Command-line overrides for torchtitan 0.3.0, equivalent to {CONFIG_FILE}:" if not not_here else \
        f"Command-line overrides for torchtitan 0.3.0: the settings of {CONFIG_FILE} on {function}, not the job it " \
        "plans (below what these leave out):"
    overrides_text = (
        comment(header)
        + comment([title,
                   f"python -m torchtitan.train --module {module} --config {function} $(grep -v '^#' {OVERRIDES_FILE})",
                   "The activation_checkpoint:<mode> subcommand must stay last."] + not_here)
        + "".join(" ".join(argument_word("torchtitan", word) for word in opt) + "\n" for opt in opts)
    )
    launch = (
        "#!/usr/bin/env bash\n"
        + comment(header)
        + comment([(f"{nnodes} node(s) x {nproc} processes; on node i run with NODE_RANK=i and "
                    "MASTER_ADDR set to node 0. Extra arguments are passed on as overrides.")])
        + "set -euo pipefail\n"
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
        # PYTHONPATH splits at ':', so a folder holding one never reaches sys.path; the ranks (python -m)
        # still import the config from their working folder, which is this one only when run from it.
        'case "$HERE" in *:*) [ "$HERE" -ef . ] || { echo "' + LAUNCH_FILE + ': $HERE holds a \':\', at which '
        'PYTHONPATH splits, so the ranks could not import ' + CONFIG_MODULE + ' from it: run it from that '
        'folder, or move the folder" >&2; exit 1; };; esac\n'
        'export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"\n'
        # exec: a signal that ends the script reaches torchrun, whose agent stops the ranks.
        f"exec torchrun --nnodes {shell_word(nnodes)} --nproc_per_node {shell_word(nproc)} \\\n"
        '    --node_rank "${NODE_RANK:-0}" --master_addr ' + master_addr(nnodes) + ' '
        '--master_port "${MASTER_PORT:-29500}" \\\n'
        f'    -m torchtitan.train --module {CONFIG_MODULE} --config {CONFIG_FUNCTION} "$@"\n'
    )
    batch = sbatch(comment(header), nnodes, nproc,
                   f'-m torchtitan.train --module {CONFIG_MODULE} --config {CONFIG_FUNCTION} "$@"',
                   cluster=estimate.job.cluster,
                   files=f'CONFIG="$(realpath -e "$HERE/{CONFIG_FILE}")"\n'
                         'export PYTHONPATH="${CONFIG%/*}${PYTHONPATH:+:$PYTHONPATH}"\n')
    return {
        CONFIG_FILE: _config_module(estimate, header),
        OVERRIDES_FILE: overrides_text,
        LAUNCH_FILE: launch,
        SBATCH_FILE: batch,
    }
