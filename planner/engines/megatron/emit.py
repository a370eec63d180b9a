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
  ``optim_grads_params``, with ``--use-distributed-optimizer`` and ``--ckpt-format fsdp_dtensor``,
  which validate_args demands, and ``--no-gradient-accumulation-fusion``, which it warns of and
  Megatron-Core's Megatron-FSDP guide asks for).
"""

from __future__ import annotations

from typing import Optional

from cost_models.activations import selective_modules
from cost_models.behaviour import DEEPEP_NVL_PEERS
from cost_models.experts import dispatches_hierarchically
from cost_models.model_states import fp32_gradients
from cost_models.partition import chunk_layers, rank_chunks
from cost_models.specs import Job, Layout
from cost_models.stage_time import cp_runs_all_to_all

from planner.engines import ENGINES
from planner.errors import CaseError
from planner.emit import header_lines as _lines
from planner.emit.quoting import argument_word, comment, shell_word
from planner.emit.slurm import SBATCH_FILE, launch_nodes, master_addr, sbatch

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
    "--expert-tensor-parallel-size", "--moe-router-topk", "--moe-router-num-groups", "--moe-router-group-topk",
    "--mtp-num-layers", "--rotary-base", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size",
    "--kv-lora-rank", "--kv-channels", "--vocab-size", "--make-vocab-size-divisible-by",
    # torchrun
    "--nnodes", "--nproc-per-node",
)
# Flags of several values (argparse nargs "+", 3; --step-batch-size-schedule one quoted word of several):
# the reader keeps the words argparse gives the flag (launch.py, _check_parser_words).
LIST_FLAGS = ("--recompute-modules", "--rampup-batch-size", "--step-batch-size-schedule",
              "--moe-router-load-balancing-type", "--moe-aux-loss-coeff", "--cp-comm-type")
STR_FLAGS = ("--pipeline-model-parallel-layout", "--recompute-granularity", "--recompute-method", "--fp8-format",
             "--fp8-recipe", "--fp4-format", "--fp4-recipe", "--data-parallel-sharding-strategy",
             "--optimizer-offload-fraction", "--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16",
             "--main-grads-dtype", "--main-params-dtype", "--megatron-fsdp-main-grads-dtype",
             "--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend", "--exp-avg-dtype", "--exp-avg-sq-dtype",
             "--normalization", "--position-embedding-type", "--window-size", "--optimizer",
             "--attention-dropout", "--hidden-dropout", "--moe-expert-capacity-factor",
             "--window-attn-skip-freq", "--moe-layer-freq", "--tokenizer-type", "--attention-backend",
             "--no-rope-freq", "--moe-router-bias-update-rate", "--rotary-percent",
             "--moe-router-topk-scaling-factor", "--moe-router-score-function")
BOOL_FLAGS = (
    "--disable-bias-linear", "--sequence-parallel", "--use-distributed-optimizer", "--recompute-activations", "--bf16", "--fp16",
    "--swiglu", "--quick-geglu", "--group-query-attention", "--untie-embeddings-and-output-weights",
    "--no-overlap-p2p-communication", "--use-torch-fsdp2", "--use-megatron-fsdp", "--use-custom-fsdp",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
    "--optimizer-cpu-offload", "--cpu-offloading", "--fp8-param-gather", "--fp4-param-gather",
    "--reuse-grad-buf-for-mxfp8-param-ag", "--first-last-layers-bf16",
    "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32", "--tp-comm-overlap",
    "--overlap-moe-expert-parallel-comm", "--moe-enable-deepep", "--overlap-grad-reduce", "--overlap-param-gather",
    "--qk-layernorm", "--multi-latent-attention", "--moe-layer-recompute", "--moe-grouped-gemm",
    "--moe-pad-expert-input-to-capacity", "--moe-router-enable-expert-bias", "--moe-router-force-load-balancing",
    "--qk-l2-norm", "--add-qkv-bias", "--fine-grained-activation-offloading", "--use-precision-aware-optimizer",
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
    "recompute_modules": "--recompute-modules",
    "stage_layers": "--decoder-first-pipeline-num-layers", "chunk_layers": "--pipeline-model-parallel-layout",
    "global_batch_size": "--global-batch-size",
    "ep": "--expert-model-parallel-size", "etp": "--expert-tensor-parallel-size",
    "offload_activations": "--cpu-offloading-num-layers", "offload_optimizer": "--optimizer-cpu-offload",
}


# Megatron-FSDP's --data-parallel-sharding-strategy for each ZeRO stage it stands for.
FSDP_STRATEGIES = {0: "no_shard", 1: "optim", 2: "optim_grads", 3: "optim_grads_params"}


def _refuse(expected: str) -> CaseError:
    return CaseError("--emit", "megatron", expected)


def refuse_what_megatron_cannot_run(job: Job) -> None:
    """Raise a CaseError for the first thing in ``job`` Megatron-LM refuses (planner/engines/megatron/engine.py)."""
    ENGINES["megatron"].refuse_unrunnable(job)


def uneven_stages(layout: Layout) -> Optional[tuple[int, int]]:
    """(first, last) layer counts for ``--decoder-first/last-pipeline-num-layers``, or None for an
    even split or a partition those flags cannot express (middle stages that differ)."""
    stages = layout.stage_layers
    if stages is None or len(set(stages)) == 1 or len(set(stages[1:-1])) > 1 \
            or any(n % layout.vpp for n in stages):  # unequal model chunks: only a layout string says them
        return None
    if layout.chunk_layers is not None \
            and any(len(set(chunks)) > 1 for chunks in rank_chunks(layout.chunk_layers, layout.pp)):
        return None
    return stages[0], stages[-1]


def layout_string(layout: Layout, mtp: int = 0) -> Optional[str]:
    """``--pipeline-model-parallel-layout`` for a partition whose middle stages differ, or whose
    stages do not split into equal model chunks, else None.

    Virtual stage ``v`` of pipeline rank ``r`` is entry ``v·pp + r``; a rank's chunks are the
    layout's own (``Layout.chunk_layers``), else equal, or differing by one layer, the spare ones
    first (``cost_models.partition.chunk_layers``), as for layers the pp·vpp virtual stages do not
    divide. The ``mtp`` multi-token prediction layers
    (``m``) go before the loss in the last entry, where Megatron builds them without a layout
    (``PipelineParallelLayerLayout.validate_layer_layout``: only in a rank's last virtual stage)."""
    stages = layout.stage_layers
    if stages is None or uneven_stages(layout) is not None:
        return None
    if layout.chunk_layers is not None:
        chunks = rank_chunks(layout.chunk_layers, layout.pp)
        if len(set(layout.chunk_layers)) == 1:
            return None
    else:
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
                tail = "m" * mtp + "L"
                entry = entry + tail if chunk <= 2 else f"{entry},{tail}"
            entries.append(entry)
    return "|".join(entries)


def arguments(job: Job) -> list[tuple[str, Optional[str]]]:
    """``pretrain_gpt.py`` arguments for ``job`` as (flag, value or None for a switch)."""
    m, t, lay = job.model, job.training, job.layout
    refuse_what_megatron_cannot_run(job)
    args: list[tuple[str, Optional[str]]] = [
        ("--tensor-model-parallel-size", str(lay.tp)),
        ("--pipeline-model-parallel-size", str(lay.pp)),
    ]
    accounted = [flag for field, flag in ACCOUNT_FLAGS.items() if getattr(lay, field)]
    # The account flags split the embedding and the loss as layers (arguments.py: num_layers += 1 each)
    if lay.stage_layers is None and lay.vpp > 1 and (m.num_layers + len(accounted)) % (lay.pp * lay.vpp):
        # Interleaving over layers the virtual stages do not divide: the layout string says how.
        lay = lay.with_changes(stage_layers=job.stage_layers, chunk_layers=job.chunk_layers)
    uneven = uneven_stages(lay)
    custom = layout_string(lay, m.mtp_layers)
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
    if lay.cp > 1 and cp_runs_all_to_all(job.model, t):
        # Transformer Engine runs a sliding window under context parallelism only as all-to-all
        # (attn_forward_func_with_cp asserts it); Megatron-LM's default is the p2p ring.
        args.append(("--cp-comm-type", "a2a"))
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
    if lay.recompute == "selective" and selective_modules(m, t, lay):
        # Named whenever they are not Megatron's default (core_attn): what the estimate recomputed.
        # Where no module frees memory (flash attention, no MLA, no experts) nothing is recomputed.
        args.append(("--recompute-granularity", "selective"))
        modules = selective_modules(m, t, lay)
        if modules != ("core_attn",):
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
    if m.mtp_layers:
        args.append(("--mtp-num-layers", str(m.mtp_layers)))
    args += [("--seq-length", str(t.seq_len)), ("--max-position-embeddings", str(t.seq_len))]
    if not m.tied_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    args += [a for a in architecture_arguments(m) if a not in args]
    # Megatron-LM drops out 0.1 of the attention probabilities and of the residual stream unless
    # told (TransformerConfig.attention_dropout, hidden_dropout): the case's, which the estimate
    # priced (the masks it saves), is written.
    args += [("--attention-dropout", f"{m.dropout:g}"), ("--hidden-dropout", f"{m.dropout:g}")]
    args.append(("--optimizer", "sgd" if t.optimizer == "sgd" else "adam"))
    if not t.flash_attention:
        # Priced as attention that keeps its scores (training.flash_attention false): Megatron's default
        # backend (auto) would run Transformer Engine's fused kernel (megatron-core AttnBackend.unfused).
        args.append(("--attention-backend", "unfused"))
    # Gradient precision as the estimate timed it: Megatron keeps bf16 gradients in fp32 by
    # default, fp16 ones in fp16 (megatron/training/arguments.py).
    if t.precision not in ("fp16", "fp32") and not fp32_gradients(t):
        args.append(("--grad-reduce-in-bf16", None))
    elif t.precision == "fp16" and fp32_gradients(t):
        args.append(("--accumulate-allreduce-grads-in-fp32", None))
    # The data-parallel traffic as the estimate hid it (EngineBehaviour: the bucketed reduction behind
    # the backward, and with the distributed optimizer the weight gathers behind the next forward):
    # Megatron-LM turns both off unless asked (megatron/training/arguments.py), and
    # --overlap-param-gather needs the distributed optimizer and --overlap-grad-reduce (validate_args).
    # The experts' gradients reduce over their own data-parallel group, which may exceed dp·cp.
    if lay.dp * lay.cp > 1 or (m.is_moe and lay.edp > 1):
        args.append(("--overlap-grad-reduce", None))
        if lay.zero_stage >= 1 and job.training.engine.overlap_param_gather:
            args.append(("--overlap-param-gather", None))
    if tp_comm_overlapped(job):
        args.append(("--tp-comm-overlap", None))  # Transformer Engine userbuffers
    if lay.offload_optimizer:
        # HybridDeviceOptimizer: validate_args wants the precision-aware optimizer with it.
        args += [("--optimizer-cpu-offload", None), ("--optimizer-offload-fraction", f"{lay.offload_optimizer:g}"),
                 ("--use-precision-aware-optimizer", None), ("--overlap-cpu-optimizer-d2h-h2d", None)]
    elif t.optimizer_moments == "bf16" or t.master_remainders:
        # Transformer Engine's FusedAdam, with the master as remainders of the bf16 weights where
        # megatron-core hands it the master (engine.precision_aware_rules), the moments in the case's dtype.
        args.append(("--use-precision-aware-optimizer", None))
    if t.optimizer_moments == "bf16":
        args += [("--exp-avg-dtype", "bf16"), ("--exp-avg-sq-dtype", "bf16")]
    if lay.offload_activations:
        # The count alone turns it on: validate_args sets cpu_offloading where it is > 0, and
        # cpu_offloading itself has no argument (megatron/training/arguments.py, core_v0.16.1).
        args.append(("--cpu-offloading-num-layers", str(lay.offload_activations)))
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


# Megatron-LM's spelling of the case's architecture (megatron/training/arguments.py: --normalization,
# --position-embedding-type, --rotary-base, --no-rope-freq, --disable-bias-linear, --qk-layernorm, --window-size,
# --window-attn-skip-freq); its defaults are
# GPT-2's (LayerNorm, learned absolute positions, biases), so a Llama must say otherwise.
NORMALIZATION_ARG = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}
POSITION_ARG = {"rope": "rope", "learned": "learned_absolute", "none": "none"}


def architecture_arguments(m) -> list[tuple[str, Optional[str]]]:
    """The architecture the case states, as Megatron-LM's arguments (ModelSpec.normalization, …)."""
    args: list[tuple[str, Optional[str]]] = []
    if m.normalization is not None:
        args.append(("--normalization", NORMALIZATION_ARG[m.normalization]))
    if m.position_embedding is not None:
        args.append(("--position-embedding-type", POSITION_ARG[m.position_embedding]))
        if m.position_embedding == "rope" and m.rope_base is not None:
            # An integer to Megatron-LM (arguments.py: --rotary-base type=int): "1e+06" stops its parser.
            if not float(m.rope_base).is_integer():
                raise CaseError("--emit", "megatron", f"model.rope_base is {m.rope_base:g}, but Megatron-LM's "
                                                      "--rotary-base takes a whole number (arguments.py: type=int)")
            args.append(("--rotary-base", str(int(m.rope_base))))
        if m.position_embedding == "rope" and m.rotary_percent != 1.0:  # GLM-4.5 rotates half of each head
            args.append(("--rotary-percent", repr(float(m.rotary_percent))))  # as given, not to 6 figures
    if m.linear_bias is False:
        args.append(("--disable-bias-linear", None))
        if m.qkv_bias:  # TransformerConfig.add_qkv_bias: the q/k/v projections' biases alone
            args.append(("--add-qkv-bias", None))
    if m.nope_every:  # megatron-core skips RoPE in the last layer of each no_rope_freq (TransformerConfig)
        args.append(("--no-rope-freq", str(m.nope_every)))
    if m.qk_norm or m.attention_type == "mla":
        # Under MLA the flag builds the two latents' norms (gpt_layer_specs.py, core_v0.16.1: the q and kv
        # up-projections with their layer norm fused), which DeepSeek's attention has and the parameters
        # count (cost_models.parameters); without it Megatron-LM builds neither.
        args.append(("--qk-layernorm", None))
    if m.qk_l2_norm:  # TransformerConfig.qk_l2_norm: "llama 4-style qk L2 norm"
        args.append(("--qk-l2-norm", None))
    if m.sliding_window:
        # megatron-core's window_size is (keys to the left, keys to the right): causal, none right.
        args.append(("--window-size", f"{m.sliding_window},0"))
        if m.sliding_window_full_every:
            args.append(("--window-attn-skip-freq", str(m.sliding_window_full_every)))
    return args


def unstated_architecture(m) -> list[str]:
    """The architecture arguments the case leaves to the user (a model without a preset that says)."""
    missing = [flag for field, flag in (("normalization", "--normalization"),
                                        ("position_embedding", "--position-embedding-type"),
                                        ("linear_bias", "--disable-bias-linear (or not)"))
               if getattr(m, field) is None]
    if m.position_embedding == "rope" and m.rope_base is None:
        missing.append("--rotary-base")
    return missing


def needs_deepep(job: Job) -> bool:
    """Whether the emitted dispatcher is DeepEP's (flex): the case asks for it
    (``training.expert_dispatch: deepep``, which diagnose then reads back), or the estimate priced
    the hierarchical dispatch (``experts.dispatches_hierarchically``: left to the engine, where its
    group spans more than DeepEP's NVLink peers and that is no slower than the all-to-all)."""
    lay = job.layout
    # The flex dispatcher spans the expert tensor- and expert-parallel groups, and refuses one of a
    # single rank (megatron-core token_dispatcher.py, MoEFlexTokenDispatcher: "requires TPxEP > 1").
    if not (job.model.is_moe and lay.expert_tp * lay.ep > 1):
        return False
    return job.training.expert_dispatch == "deepep" or dispatches_hierarchically(
        job.model, job.training, job.cluster, lay.tp, lay.cp, lay.micro_batch_size, lay.ep, lay.expert_tp)


DEEPEP_NOTE = ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep needs DeepEP "
               "(deepseek-ai/DeepEP) installed beside Megatron-LM: the plan priced its dispatch")


def deepep_internode(job: Job) -> bool:
    """Whether the emitted flex dispatcher runs DeepEP's internode kernels: its Buffer spans
    megatron-core's expert tensor- and expert-parallel group (fused_a2a.py, get_buffer), etp·ep ranks,
    and more than its NVLink peers (``behaviour.DEEPEP_NVL_PEERS``) of them are several RDMA ranks, which
    it joins through NVSHMEM with IBGDA (deep_ep/buffer.py:104 at eb9cee7, ``get_num_rdma_ranks() > 1``),
    over the NICs even where NVLink joins them (an NVL72 rack: megatron-core builds it without ``allow_mnnvl``)."""
    return needs_deepep(job) and job.layout.expert_tp * job.layout.ep > DEEPEP_NVL_PEERS


# What DeepEP's internode kernels need that no launch script can set. The NVSHMEM settings they run with
# DeepEP's Buffer exports itself, in the training process, before NVSHMEM starts (deep_ep/buffer.py:104-123
# at eb9cee7: NVSHMEM_IB_ENABLE_IBGDA=1, NVSHMEM_IBGDA_NUM_RC_PER_PE, NVSHMEM_QP_DEPTH, NVSHMEM_DISABLE_P2P,
# NVSHMEM_MAX_TEAMS, NVSHMEM_DISABLE_NVLS, NVSHMEM_CUMEM_GRANULARITY, NVSHMEM_DISABLE_MNNVL), overwriting
# any a script exported, so the files set none. The rest is the cluster's: DeepEP built with NVSHMEM_DIR
# ("disable all internode and low-latency features if not specified", README.md:85), RDMA NICs with
# GPUDirect RDMA and IBGDA, the driver's regkeys or GDRCopy (third-party/README.md:12-14, 36-56).
DEEPEP_INTERNODE_NOTE = (
    "DeepEP across nodes ({ranks} ranks, {rdma} RDMA ranks of {peers} NVLink peers): its Buffer exports the NVSHMEM_* "
    "settings its internode kernels need itself, in-process (deep_ep/buffer.py), so these files set none; the "
    "cluster must provide DeepEP built against NVSHMEM (NVSHMEM_DIR at build, else it has no internode kernels), "
    "RDMA NICs with GPUDirect RDMA, and IBGDA: the NVIDIA driver loaded with NVreg_EnableStreamMemOPs=1 "
    "NVreg_RegistryDwords=\"PeerMappingOverride=1;\" (/etc/modprobe.d/nvidia.conf), or GDRCopy's gdrdrv module "
    "(DeepEP's third-party/README.md)")


def internode_notes(job: Job) -> list[str]:
    """The cluster's part of a DeepEP dispatch across nodes (:data:`DEEPEP_INTERNODE_NOTE`), said once in
    each file that launches or configures it; nothing for any other plan."""
    if not deepep_internode(job):
        return []
    ranks = job.layout.expert_tp * job.layout.ep
    return [DEEPEP_INTERNODE_NOTE.format(ranks=ranks, rdma=max(1, ranks // DEEPEP_NVL_PEERS), peers=DEEPEP_NVL_PEERS)]


def warnings(estimate) -> list[str]:
    """What the user must know to launch the files as priced: libraries beyond Megatron-LM, and what a
    DeepEP dispatch across nodes needs of the cluster."""
    return ([DEEPEP_NOTE] if needs_deepep(estimate.job) else []) + internode_notes(estimate.job)


def moe_arguments(job: Job) -> list[tuple[str, Optional[str]]]:
    """The mixture-of-experts arguments (Megatron-LM's MoE guide, ``megatron/core/transformer/moe``):
    the experts and their widths, the router, the expert grid (MoE parallel folding), grouped
    GEMMs and the token dispatcher the estimate timed: flex (DeepEP) where tokens cross ranks,
    which megatron-core's flex dispatcher needs tp·ep > 1 for, unless the case asks for the
    all-to-all (``training.expert_dispatch``); all-to-all with a capacity factor, whose padding
    the DeepEP backend refuses (``TransformerConfig.__post_init__``)."""
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
    # Load balancing, which megatron-core runs only with a coefficient above 0 (arguments.py: default 0.0;
    # router.py): a softmax router's auxiliary loss at the 1e-2 arguments.py recommends and Megatron-LM's
    # Mixtral example runs; a sigmoid router as DeepSeek-V3 trains it, auxiliary-loss-free through a
    # per-expert bias updated at 1e-3 with a sequence-wise loss of 1e-4 (arXiv:2412.19437, §2.1.2, §4.2).
    if m.moe_router == "sigmoid":
        args += [("--moe-router-load-balancing-type", "seq_aux_loss"), ("--moe-aux-loss-coeff", "1e-4"),
                 ("--moe-router-enable-expert-bias", None), ("--moe-router-bias-update-rate", "1e-3")]
    else:
        args += [("--moe-router-load-balancing-type", "aux_loss"), ("--moe-aux-loss-coeff", "1e-2")]
    if m.moe_router_num_groups > 1:
        args += [("--moe-router-num-groups", str(m.moe_router_num_groups)),
                 ("--moe-router-group-topk", str(m.moe_router_group_topk))]
    if m.moe_router_topk_scaling != 1.0:  # TransformerConfig.moe_router_topk_scaling_factor (DeepSeek-V3: 2.5)
        args.append(("--moe-router-topk-scaling-factor", repr(float(m.moe_router_topk_scaling))))
    if m.moe_top_k == 1 and m.moe_router == "softmax":
        args.append(("--moe-router-pre-softmax", None))  # TransformerConfig: softmax over one expert has no gradient
    args += [("--expert-model-parallel-size", str(lay.ep)), ("--expert-tensor-parallel-size", str(lay.expert_tp)),
             ("--moe-grouped-gemm", None)]
    # The dispatch the estimate priced (experts.dispatches_hierarchically: no DeepEP with a capacity factor):
    # DeepEP's flex dispatcher only where it saves something, an expert group that leaves DeepEP's NVLink
    # peers and runs no slower than the all-to-all (on an NVL72 rack the all-to-all keeps all 72 GPUs on
    # NVLink, DeepEP 8); inside its peers it prices as the all-to-all, which needs no library beyond Megatron-LM.
    if needs_deepep(job):
        args += [("--moe-token-dispatcher-type", "flex"), ("--moe-flex-dispatcher-backend", "deepep")]
    else:
        args.append(("--moe-token-dispatcher-type", "alltoall"))
    if m.moe_capacity_factor is not None:
        args += [("--moe-expert-capacity-factor", f"{m.moe_capacity_factor:g}"),
                 ("--moe-pad-expert-input-to-capacity", None)]
    return args


def precision_args(job: Job) -> list[tuple[str, Optional[str]]]:
    """A low-precision recipe as megatron-core 0.16's TransformerConfig spells it: fp8 recipes by
    --fp8-format and --fp8-recipe (tensorwise, delayed, blockwise and mxfp8; E4M3 forward with E5M2
    gradients, "hybrid", for the per-tensor recipes, E4M3 throughout for the block-scaled ones, as
    Transformer Engine's Float8BlockScaling and MXFP8BlockScaling default to), NVFP4 by --fp4-format
    e2m1 --fp4-recipe nvfp4 with the recipe's last layers kept in bf16 (--first-last-layers-bf16,
    which fp4_utils.get_fp4_context counts over the whole model), weights gathered quantized by
    --fp8-param-gather (--fp4-param-gather; MXFP8's through the gradient buffer,
    --reuse-grad-buf-for-mxfp8-param-ag). The rest of the model trains in bf16."""
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
        if not recipe.weight_layouts_from_one and job.layout.zero_stage == 1:
            # MXFP8 weights are gathered in 16 bits through the gradient buffer and quantized after,
            # as the estimate prices them (model_states.gathered_weight_bytes); Megatron-FSDP sets
            # this off by itself.
            args.append(("--reuse-grad-buf-for-mxfp8-param-ag", None))
    return args


def nodes_and_gpus(job: Job) -> tuple[int, int]:
    """(nodes, processes per node) for torchrun, which starts as many on every node."""
    return launch_nodes(job.cluster, "megatron")


# The first CUDA compute capability major on which validate_args no longer asks for one connection:
# Blackwell ("CUDA_DEVICE_MAX_CONNECTIONS requirement no longer exists since the Blackwell architecture").
NO_CONNECTIONS_RULE_FROM_ARCH = 10


def one_connection_asserted(tp: int, cp: int, *, fsdp: bool, moe_overlap: bool,
                            arch_major: Optional[int]) -> bool:
    """Whether Megatron-LM's validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS == "1"
    (megatron/training/arguments.py:927-953 at core_v0.16.1, 1413-1439 at core_v0.19.0): tp or cp > 1
    on a GPU whose get_device_arch_version() (the compute capability's major) is below 10, unless
    --use-torch-fsdp2 / --use-megatron-fsdp or --overlap-moe-expert-parallel-comm is on (then it only
    warns). ``arch_major`` None (a GPU whose capability is not known: AMD's, a profile without it):
    False, no assertion is claimed. The emitter's :func:`connections_line` and the reader's check
    (read.py ``_check_connections_for_parallelism``) both follow it."""
    if (tp <= 1 and cp <= 1) or fsdp or moe_overlap:
        return False
    return arch_major is not None and arch_major < NO_CONNECTIONS_RULE_FROM_ARCH


def connections_line(job: Job) -> str:
    """CUDA_DEVICE_MAX_CONNECTIONS for tp or cp > 1 as the engine's own performance launches set it
    (Megatron-Bridge, ``src/megatron/bridge/recipes/run_plugins.py``, ``PerfEnvPlugin.setup``): 1
    before Blackwell, which validate_args asserts (:func:`one_connection_asserted`) so that the
    communication kernels launch before the GEMMs they overlap, and where the GPU's capability is not
    known; 32 from Blackwell on, where validate_args no longer asks for one and a single connection
    would serialize the data-parallel and pipeline streams the estimate overlaps with compute.
    Under Megatron-FSDP (the emitted files' ZeRO 2 and 3) anything but 1: unset. With the experts'
    dispatch and combine overlapped (training.moe_comm_overlap, which the estimate credits) more than
    one before Blackwell too: PerfEnvPlugin's 8, 32 with DeepEP, as validate_args then only warns
    that one connection serializes that overlap. The tensor-parallel overlap the estimate credits beside
    it (--tp-comm-overlap, Transformer Engine's userbuffers) still runs there: TE 2.0 on orders its
    communication kernel's launch before the GEMM on Hopper with more than one connection
    (comm_gemm_overlap.cpp, CommOverlapCore's launch-completion event), and needs no order elsewhere
    ("needed only for Hopper, which uses persistent CTA execution": on Ampere and Blackwell the GEMM
    leaves the communication its SMs, initialize_ub's set_sm_margin, or the ring exchange copies on the
    copy engines, use_ce); only megatron-core's own async sequence-parallel
    collectives (tensor_parallel/layers.py) want one, and no estimate credits those. Before Hopper the
    overlap also needs UB_SKIPMC=1 (:func:`userbuffers_line`)."""
    lay = job.layout
    if lay.zero_stage >= 2:
        return "unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP refuses 1\n"
    if lay.tp <= 1 and lay.cp <= 1:
        return ""
    arch_major = job.cluster.gpu.compute_capability_major
    if job.training.moe_comm_overlap and (arch_major is None or arch_major < NO_CONNECTIONS_RULE_FROM_ARCH):
        return (f"export CUDA_DEVICE_MAX_CONNECTIONS={32 if needs_deepep(job) else 8}  # the experts' "
                "dispatch and combine beside compute (Megatron-Bridge's PerfEnvPlugin, a2a_overlap)\n")
    if one_connection_asserted(lay.tp, lay.cp, fsdp=False, moe_overlap=False,
                               arch_major=0 if arch_major is None else arch_major):
        return "export CUDA_DEVICE_MAX_CONNECTIONS=1  # validate_args: tp or cp > 1 needs it before Blackwell\n"
    return ("export CUDA_DEVICE_MAX_CONNECTIONS=32  # Blackwell: streams in parallel "
            "(Megatron-Bridge's PerfEnvPlugin)\n")


def tp_comm_overlapped(job: Job) -> bool:
    """Whether the launch runs --tp-comm-overlap: the case asks for it and tensor parallelism has
    collectives to overlap (tp > 1)."""
    return job.training.tp_comm_overlap and job.layout.tp > 1


# The first CUDA compute capability major whose GPUs hold CUDA multicast objects, which Transformer
# Engine's userbuffers take for --tp-comm-overlap unless UB_SKIPMC=1: Hopper (TE's
# examples/pytorch/comm_gemm_overlap/README.md: multicast "on devices with compute capability 9.0 or
# newer"; "Devices older than compute capability 9.0 require UB_SKIPMC=1").
MULTICAST_FROM_ARCH = 9


def lacks_multicast(gpu) -> Optional[bool]:
    """Whether ``gpu`` has no CUDA multicast, so that Transformer Engine's ``initialize_ub`` (which
    Megatron-LM's --tp-comm-overlap calls, megatron/training/initialize.py) raises "CUDA device, driver
    and/or toolkit version does not support comm+GEMM overlap with CUDA Multicast. Launch app with
    UB_SKIPMC=1 to try CUDA IPC instead" unless UB_SKIPMC is a non-zero integer
    (transformer_engine/pytorch/module/base.py:183-187 at v2.9, 220-225 at 2.20.0.dev0; so since TE 2.0,
    and megatron-core 0.16 takes 2.9 on; ``device_supports_multicast`` reads the device's
    CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, common/util/cuda_runtime.cpp): True below compute
    capability 9 (V100, A100), False from Hopper on (the presets' NVSwitch boards and NVL72 racks), None
    where the capability is not known. False for AMD GPUs, whose HIP majors say nothing of it."""
    if getattr(gpu, "vendor", "nvidia") != "nvidia":
        return False
    major = gpu.compute_capability_major
    return None if major is None else major < MULTICAST_FROM_ARCH


def userbuffers_line(job: Job) -> str:
    """UB_SKIPMC=1 where the launch runs --tp-comm-overlap on a GPU without CUDA multicast, or whose
    capability is not known (as :func:`connections_line` reads it): without it Transformer Engine's
    initialize_ub raises before the first step (:func:`lacks_multicast`). With it the userbuffers
    exchange through CUDA IPC handles, the path TE's communicator takes where multicast is off
    (userbuffers-host.cpp, create_communicator_grouped2: "MC NOT initialized and used"), and the overlap
    the estimate credits runs."""
    if not tp_comm_overlapped(job) or lacks_multicast(job.cluster.gpu) is False:
        return ""
    return ("export UB_SKIPMC=1  # --tp-comm-overlap: Transformer Engine's userbuffers through CUDA IPC, "
            "as this GPU has no CUDA multicast (before Hopper)\n")


def environment_lines(job: Job) -> str:
    """What the launch and the batch script export before the training starts."""
    return connections_line(job) + userbuffers_line(job)


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
    unstated = unstated_architecture(job.model)
    args_text = (header + comment(warnings(estimate) + [
        summary,
        "Add data, tokenizer, learning-rate, run-length and checkpoint arguments on the command line "
        "(--data-path, --tokenizer-type and --tokenizer-model, --lr; pretrain_gpt.py needs --train-samples "
        "(tokens / seq-length) or --train-iters; without --save DIR and --save-interval N no checkpoint is "
        "written, and --load DIR resumes)"
        + (f"; the case does not state the model's {', '.join(unstated)}: add them too." if unstated else "."),
    ]) + body)
    launch = (
        "#!/usr/bin/env bash\n" + header + comment([
            f"Megatron-LM on {nodes} node(s) x {per_node} GPUs; on node i run with NODE_RANK=i"
            + (" and MASTER_ADDR set to node 0." if nodes > 1 else "."),
            "MEGATRON_LM: a Megatron-LM checkout; extra arguments (data, tokenizer, learning rate, "
            "--train-samples or --train-iters, --save/--save-interval/--load) pass through.",
        ] + internode_notes(job)) +
        "set -euo pipefail\n"
        "set -f  # no globbing of the arguments (a pipeline layout holds '*')\n"
        + environment_lines(job) +
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
        # Read before torchrun, as sbatch.sh reads it: a failed substitution inside torchrun's arguments
        # escapes set -e, and every rank started without them.
        'ARGS="$(grep -v \'^#\' "$HERE/' + ARGS_FILE + '")"\n'
        # exec: torchrun is this script's process, so a signal that ends the script reaches it and its
        # agent stops the ranks; bash would die of SIGTERM and leave them running.
        f"exec torchrun --nnodes {shell_word(nodes)} --nproc-per-node {shell_word(per_node)} \\\n"
        '    --node-rank "${NODE_RANK:-0}" --master-addr ' + master_addr(nodes) + ' '
        '--master-port "${MASTER_PORT:-6000}" \\\n'
        '    "${MEGATRON_LM:-.}/pretrain_gpt.py" $ARGS "$@"\n'
    )
    # Submitted from the folder of these files, ./pretrain_gpt.py is there only where they were written
    # into a Megatron-LM checkout: without MEGATRON_LM every rank failed to open it, once the nodes started.
    checkout = ('[ -f "${MEGATRON_LM:-.}/pretrain_gpt.py" ] || { echo "sbatch.sh: no pretrain_gpt.py in '
                '${MEGATRON_LM:-.}: export MEGATRON_LM=<a Megatron-LM checkout> before sbatch" >&2; exit 1; }\n')
    batch = sbatch(header + comment(["MEGATRON_LM: a Megatron-LM checkout (export it before sbatch); extra arguments "
                                     "(data, tokenizer, learning rate, --train-samples or --train-iters, "
                                     "--save/--save-interval/--load) pass through."] + internode_notes(job)),
                   nodes, per_node, '"${MEGATRON_LM:-.}/pretrain_gpt.py" $ARGS "$@"', environment_lines(job),
                   cluster=job.cluster, files='ARGS="$(grep -v \'^#\' "$HERE/' + ARGS_FILE + '")"\n' + checkout)
    return {ARGS_FILE: args_text, LAUNCH_FILE: launch, SBATCH_FILE: batch}


# --- reading ---------------------------------------------------------------------------------
