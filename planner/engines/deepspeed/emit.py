"""DeepSpeed: ``ds_config.json`` and ``launch.sh`` for a layout, and a reader for an existing ds_config.

What the files rest on (DeepSpeed 0.19.8 source):

- ``deepspeed/runtime/config.py`` ``DeepSpeedConfig``: reads ``train_batch_size``,
  ``train_micro_batch_size_per_gpu`` and ``gradient_accumulation_steps``; any one or two
  of them are enough, the rest are derived (``_set_batch_related_parameters``) and
  ``_batch_assertion`` requires ``train_batch_size == micro × accumulation × world_size``.
  ``world_size`` is the data-parallel size only when an ``mpu`` says so
  (``mpu.get_data_parallel_world_size()``; a ``PipelineModule`` hands its grid as the mpu);
  without one it is every rank, AutoTP's tensor-parallel ranks included. Unknown top-level
  keys are ignored, so the provenance goes in ``"_comment"``.
- ``deepspeed/runtime/pipe/module.py`` ``PipelineModule(layers, num_stages, partition_method)``:
  the pipeline degree and the stage boundaries are set in the training script, not in the
  config (its ``"pipeline"`` section holds schedule knobs only), so ``launch.sh`` states them.
  ``partition_method`` is ``"parameters"``, ``"uniform"`` or ``"type:REGEX"``, each a balanced
  split; uneven stages are reproduced exactly by one list entry per stage, split uniformly.
- ``deepspeed/runtime/pipe/engine.py``: the pipeline engine refuses ZeRO 2 and 3.
- ``deepspeed/runtime/tensor_parallel/config.py``: ``tensor_parallel.autotp_size``.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any, Sequence, Union

from cost_models.memory import job_vocab, per_parameter_states
from cost_models.model_states import fp32_gradients
from cost_models.parameters import embedding_parameters

from planner.engines import ENGINES
from planner.engines.deepspeed import engine as ds_engine
from planner.engines.deepspeed.read import PLANNED_LAYOUT
from planner.errors import CaseError
from planner.emit import header_lines as _lines
from planner.emit.quoting import comment, shell_word
from planner.emit.slurm import SBATCH_FILE, launch_nodes, sbatch

CONFIG = "ds_config.json"
LAUNCH = "launch.sh"


def _refuse(expected: str) -> CaseError:
    return CaseError("--emit", "deepspeed", expected)


# training.optimizer → ds_config optimizer.type (runtime/config.py: DeepSpeed's Adam runs AdamW's decoupled
# weight decay unless told otherwise; SGD is torch.optim's).
OPTIMIZER_TYPES = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}


def check_expressible(estimate) -> None:
    """Raise a CaseError for the first thing in the layout DeepSpeed cannot run
    (planner/engines/deepspeed/engine.py)."""
    ENGINES["deepspeed"].refuse_unrunnable(estimate.job)


def config_dict(estimate, header_lines: Union[Sequence[str], str] = ()) -> dict[str, Any]:
    """The ds_config for the estimate's layout (as a dict, before JSON)."""
    check_expressible(estimate)
    job = estimate.job
    lay, training = job.layout, job.training
    config: dict[str, Any] = {}
    lines = _lines(header_lines)
    if lines:
        config["_comment"] = lines
    config["train_batch_size"] = training.global_batch_size
    config["train_micro_batch_size_per_gpu"] = lay.micro_batch_size
    config["gradient_accumulation_steps"] = job.grad_accum
    # The optimizer the plan priced (its states, and under offload DeepSpeed's CPU Adam, which it builds
    # only from this section: engine.py refuses a client optimizer with ZeRO-Offload); its learning rate
    # and the rest are the run's own (_comment).
    config["optimizer"] = {"type": OPTIMIZER_TYPES[training.optimizer]}
    if training.optimizer == "sgd" and lay.zero_stage >= 1:
        # ZeRO takes torch.optim.SGD only when told to (engine._do_optimizer_sanity_check:
        # zero/utils.py's ZERO_SUPPORTED_OPTIMIZERS are the Adam, Adagrad and Lion kinds).
        config["zero_allow_untested_optimizer"] = True
    config.setdefault("_comment", []).append("optimizer: add params (lr, betas, weight_decay) as the run sets them; "
                                             "the type is the one planned")
    config["zero_optimization"] = _zero(lay.zero_stage, job.model.hidden_size)
    if lay.pp > 1 and lay.zero_stage in (1, 2):
        # A PipelineModule's engine turns it off (runtime/engine.py), as the estimate prices it: said so.
        config["zero_optimization"]["overlap_comm"] = False
    # ZeRO-Offload / ZeRO-Infinity to CPU memory, pinned for the copies the estimate timed
    # (deepspeed/runtime/zero/offload_config.py).
    if lay.offload_optimizer:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if lay.offload_params:
        config["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
    if training.precision in ("bf16", "fp8"):  # fp8 matmuls come from Transformer Engine, not the config
        config["bf16"] = {"enabled": True}
        if not training.master_weights:  # its master partition and moments in bf16, as the estimate held them
            config["bf16"].update(bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
    elif training.precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                          "hysteresis": 2, "min_loss_scale": 1}
    if training.precision in ("bf16", "fp8") and fp32_gradients(training):
        # Accumulated and reduced in fp32, as the estimate timed the gradients: DeepSpeed casts each
        # bucket to communication_data_type before reducing it, the model's dtype unless set
        # (runtime/engine.py: communication_data_type, allreduce_bucket).
        config["data_types"] = {"grad_accum_dtype": "fp32"}
        config["communication_data_type"] = "fp32"
        if lay.zero_stage == 1 and not lay.offload_optimizer:  # DeepSpeed's BF16_Optimizer (engine.py)
            # The BF16_Optimizer folds each bf16 gradient into its fp32 one from autograd's hook and
            # frees it, as the estimate held them (4 bytes a parameter); by default it keeps the bf16
            # copy until the step (runtime/bf16_optimizer.py: accumulate_hp_grads_and_remove_lp).
            config["bf16"]["immediate_grad_update"] = True
    # What no key says, which the model's code builds (launch.sh's header tells train.py how): read back
    # by read.planned_layout, so that `diagnose` prices the layout planned, not ep 1 and no pipeline.
    config["_comment"].append(planned_layout_line(job))
    if lay.recompute == "full":
        # The planner's memory model keeps each recomputed layer's input whole on every TP rank.
        config["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                              "cpu_checkpointing": False, "synchronize_checkpoint_boundary": False,
                                              "profile": False}
    config["gradient_clipping"] = 1.0
    if lay.tp > 1 and lay.pp == 1:  # with a pipeline the model's own layers split (launch.sh)
        # The gathered LM head the plan prices (whole logits on every rank), said: left unset, DeepSpeed
        # 0.19.8 turns on its vocabulary-parallel head and distributed loss by itself for a model whose
        # embedding is tied to its head under a Hugging Face tp plan asking "embedding_rowwise"
        # (runtime/engine.py: auto_vocab_parallel_lm_head, "Set vocab_parallel_lm_head=false to retain
        # full-vocabulary logits").
        config["tensor_parallel"] = {"autotp_size": lay.tp, "vocab_parallel_lm_head": False}
    config["steps_per_print"] = 10
    config["wall_clock_breakdown"] = False
    return config


def planned_layout_line(job) -> str:
    """The ``_comment`` line stating what the model's code decides and ds_config has no key for: the
    pipeline depth, its tensor parallelism and stage layers (``PipelineModule``), DeepSpeed-MoE's
    ``ep_size`` (its experts split over the tp ranks, etp = tp, as DeepSpeed-MoE always does) and whether
    every layer is recomputed."""
    lay = job.layout
    words = [f"pp={lay.pp}"]
    if lay.pp > 1:  # without a pipeline, tensor_parallel.autotp_size states tp
        words.append(f"tp={lay.tp}")
    if lay.pp > 1 and lay.stage_layers is not None:  # else the engine's own split, as the plan priced it
        words.append("stage_layers=" + ",".join(map(str, lay.stage_layers)))
    if job.model.is_moe:
        words.append(f"ep={lay.ep}")
    words.append(f"recompute={lay.recompute}")
    return f"{PLANNED_LAYOUT} {' '.join(words)} (train.py builds it: see launch.sh; no ds_config key says so)"


def _zero(stage: int, hidden: int) -> dict[str, Any]:
    if stage == 0:
        return {"stage": 0}
    if stage in (1, 2):
        # The buckets the estimate priced (engine.py: DeepSpeed's default, 5e8 elements).
        bucket = int(ds_engine.BEHAVIOUR.bucket_params)
        return {"stage": stage, "overlap_comm": True, "contiguous_gradients": True, "reduce_scatter": True,
                "reduce_bucket_size": bucket, "allgather_bucket_size": bucket}
    # ZeRO 3: the sizes the Hugging Face integration fills in for "auto" (transformers
    # integrations/deepspeed.py): buckets of hidden² elements, parameters under 10·hidden kept whole.
    # The prefetch bucket and live parameters as the estimate priced them (engine.py).
    behaviour = ds_engine.BEHAVIOUR
    if behaviour.zero3_max_live_parameters is None:  # None is FSDP's whole units: DeepSpeed's engine sets a cap
        raise ValueError("DeepSpeed's behaviour sets no zero3_max_live_parameters to write")
    return {"stage": 3, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": hidden * hidden,
            "stage3_prefetch_bucket_size": int(behaviour.zero3_prefetch_bucket_h2 * hidden * hidden),
            "stage3_param_persistence_threshold": 10 * hidden,
            "stage3_max_live_parameters": int(behaviour.zero3_max_live_parameters),
            "stage3_max_reuse_distance": int(behaviour.zero3_max_reuse_distance or 0),
            "stage3_gather_16bit_weights_on_model_save": True}


# The plan's fp8 recipe as Transformer Engine's recipe class (transformer_engine/common/recipe).
TE_RECIPES = {"delayed": "DelayedScaling()", "tensorwise": "Float8CurrentScaling()",
              "blockwise": "Float8BlockScaling()"}


def launch_text(estimate, header_lines: Union[Sequence[str], str] = ()) -> str:
    check_expressible(estimate)
    job = estimate.job
    lay, cluster = job.layout, job.cluster
    nodes, per_node = launch_nodes(cluster, "deepspeed")
    out = ["#!/usr/bin/env bash\n", comment(_lines(header_lines))]
    out.append(comment([
        "",
        f"Layout: dp {lay.dp} x tp {lay.tp} x pp {lay.pp}"
        + (f" (experts: ep {lay.ep}, etp {lay.expert_tp})" if job.model.is_moe else "")
        + f", micro-batch {lay.micro_batch_size}, "
        f"{job.grad_accum} accumulation step{'s' if job.grad_accum != 1 else ''}, ZeRO {lay.zero_stage}, recompute {lay.recompute}, "
        f"{job.training.precision}",
        f"ds_config.json: train_batch_size {job.training.global_batch_size} = micro {lay.micro_batch_size} x "
        f"accumulation {job.grad_accum} x data-parallel {lay.dp}",
    ]))
    if job.training.precision == "fp8":
        recipe = TE_RECIPES[job.training.recipe.name]
        out.append(comment([
            "",
            "FP8: ds_config.json has no FP8 switch; it trains in bf16 and train.py runs the forward",
            "under transformer_engine.pytorch.fp8_autocast for the FP8 matmuls the plan assumed, with",
            f"fp8_recipe=transformer_engine.common.recipe.{recipe} (the plan's {job.training.recipe.name} scaling).",
        ]))
    if lay.recompute == "full":
        out.append(comment([
            "",
            "Recompute full: checkpoint every transformer layer (deepspeed.checkpointing.checkpoint,",
            "configured by ds_config.json's activation_checkpointing; or model.gradient_checkpointing_enable()).",
        ]))
    if job.model.is_moe:
        out.append(comment(_moe_snippet(job)))
    if lay.tp > 1 and lay.pp == 1:
        out.append(comment(_autotp_snippet(job)))
    if lay.pp > 1:
        out.append(comment(_pipeline_snippet(job)))
    out.append(comment(_loss_snippet(estimate)))
    if nodes > 1:
        # What follows the script's name goes to train.py: a --hostfile there never reached the launcher.
        out.append(comment(["", f"{nodes} nodes: the launcher reads the hosts from /job/hostfile, or from "
                                f"HOSTFILE=FILE bash {LAUNCH}; one line per node: HOST slots={per_node}"]))
    out.append(comment([""] + TRAIN_SCRIPT_LINES))
    out.append("set -euo pipefail\n")
    # The config and the training script beside this script, wherever it is run from (as sbatch.sh
    # finds them): train.py in the caller's folder was no file where the launch ran from elsewhere.
    out.append('HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n')
    hostfile = ""
    if nodes > 1:
        # DeepSpeed's pdsh runner writes `cd FOLDER; SCRIPT ...` into one remote shell line unquoted
        # (launcher/multinode_runner.py, PDSHRunner.get_cmd): a folder with a space splits there.
        out.append(f'case "$HERE" in *[[:space:]]*) echo "{LAUNCH}: $HERE holds a space, which DeepSpeed\'s '
                   'multi-node launcher (pdsh) splits: move the folder" >&2; exit 1;; esac\n')
        hostfile = '${HOSTFILE:+--hostfile "$HOSTFILE"} '
    # exec: the launcher is this script's process, so a signal that ends the script (kill, a
    # container's stop) reaches it and it stops its ranks (runner.py, sigkill_handler); bash would die
    # of SIGTERM and leave it running.
    out.append(f"\nexec deepspeed {hostfile}--num_nodes {shell_word(nodes)} --num_gpus {shell_word(per_node)} "
               f"{TRAIN_COMMAND}\n")
    return "".join(out)


# DeepSpeed has no training entry point of its own (``deepspeed`` starts the script it is given, with
# --local_rank: launcher/launch.py; torchrun, sbatch.sh's, gives LOCAL_RANK in the environment and no
# such argument: torch/distributed/run.py): the files run the user's, train.py beside them unless TRAIN_SCRIPT
# names another, and say what it must do for the plan to run as priced.
TRAIN_COMMAND = f'"${{TRAIN_SCRIPT:-$HERE/train.py}}" --deepspeed --deepspeed_config "$HERE/{CONFIG}" "$@"'
TRAIN_SCRIPT_LINES = [
    "train.py (not written here: DeepSpeed has no training script of its own; TRAIN_SCRIPT=PATH runs",
    "another) is yours: it accepts --local_rank (launch.sh's deepspeed launcher adds it; sbatch.sh's torchrun",
    "sets LOCAL_RANK instead), parses deepspeed.add_config_arguments;",
    "builds your model and data, and calls deepspeed.initialize(args=args, model=model,",
    "model_parameters=model.parameters()) without an optimizer of its own (ds_config.json has it), then",
    "engine.backward(loss) and engine.step() each micro-batch (a pipeline: engine.train_batch() a step),",
    "its model set up and its loss computed as launch.sh's notes say (the plan priced one loss).",
]


def warnings(estimate) -> list[str]:
    """What the user must do before the files run: the CLI prints these on stderr."""
    return ["launch.sh runs train.py beside it (or TRAIN_SCRIPT), which is yours to write: DeepSpeed has no "
            "training script of its own; launch.sh's header says what it must do"]


def _moe_snippet(job) -> list[str]:
    """DeepSpeed-MoE is built in the model, not the config: ``deepspeed.moe.layer.MoE`` with the
    planned expert-parallel degree, its expert-parallel groups inside each pipeline stage's
    data-parallel ranks (``deepspeed/utils/groups.py``), and the optimizer's parameter groups
    split so that expert weights reduce over the expert data-parallel group."""
    m, lay = job.model, job.layout
    capacity = (f"capacity_factor={m.moe_capacity_factor:g}, drop_tokens=True" if m.moe_capacity_factor is not None
                else "drop_tokens=False")  # dropless, as the plan timed it
    # DeepSpeed's top-2 gate draws the second expert with Gumbel noise unless told not to
    # (moe/sharded_moe.py, top2gating: top2_2nd_expert_sampling defaults to True), where the model
    # (Mixtral's) routes each token to its two highest-scoring experts.
    sampling = ", top2_2nd_expert_sampling=False" if m.moe_top_k == 2 else ""
    first = next(i for i in range(m.num_layers) if m.is_moe_layer(i))  # the last of its group (Llama 4)
    layers = (f"layers {first}.. of every {m.moe_layer_freq}" if m.moe_first_dense_layers
              or m.moe_layer_freq > 1 else "every layer")
    lines = [
        "",
        f"Mixture of experts: the MLP of {m.num_moe_layers} layers ({layers}) is a DeepSpeed-MoE layer of "
        f"{m.num_experts} experts, top-{m.moe_top_k},",
        f"expert-parallel over {lay.ep} ranks (each holds {m.num_experts // lay.ep}); the expert weights are "
        f"replicated over the {lay.edp} expert data-parallel ranks. In train.py:",
        "",
        "    from deepspeed.moe.layer import MoE",
        "    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer",
        f"    mlp = MoE(hidden_size={m.hidden_size}, expert=Expert(ffn_hidden_size={m.moe_ffn_hidden_size}), "
        f"num_experts={m.num_experts},",
        f"              ep_size={lay.ep}, k={m.moe_top_k}, {capacity}, use_residual=False{sampling}"
        + (f", enable_expert_tensor_parallelism=True)  # experts split over the {lay.tp} TP ranks" if lay.tp > 1
           else ")"),
        "    params = split_params_into_different_moe_groups_for_optimizer(",
        "        {'params': list(model.parameters()), 'name': 'parameters'})  # each group named (moe/utils.py)",
        "    engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=params)",
    ]
    if m.moe_shared_expert_ffn_hidden_size:
        lines.append(f"    # shared experts ({m.moe_shared_expert_ffn_hidden_size} wide) are an ordinary MLP beside it")
    if m.moe_router_num_groups > 1:
        # TopKGate (deepspeed/moe/sharded_moe.py) takes the top k of all experts: the model's own
        # group-limited router is a different model. The plan's all-to-all is priced the same
        # either way (DeepSpeed sends every copy to its expert's rank).
        lines.append(f"    # DeepSpeed-MoE's TopKGate has no group-limited routing: keep the model's router "
                     f"({m.moe_router_num_groups} groups, {m.moe_router_group_topk} picked) in place of its gate")
    return lines


WIDTH = 100  # the header's prose lines, as wide as the other notes'


def _loss_snippet(estimate) -> list[str]:
    """Which loss the plan priced (``training.loss``, else the engine's), how train.py runs it, and what
    the other would add to this plan's peak (``Engine.other_loss``): train.py is the user's, and a Hugging
    Face model's own loss holds twice the bytes a logit of Megatron's in-place one."""
    job = estimate.job
    alternative = ENGINES["deepspeed"].other_loss(job)
    loss = job.training.loss_name
    if alternative is None or loss not in ds_engine.LOSS_WORDS or job.training.loss_compiled:
        return []  # an estimate another engine priced, with a loss of its own: no DeepSpeed loss to name
    other, extra = alternative
    name, where, holds = ds_engine.LOSS_WORDS[loss]
    stated = f"training.loss {loss}" if job.training.loss is not None else f"training.loss unset: the engine's, {loss}"
    lines = [""] + textwrap.wrap(f"Loss: priced as {name} ({stated}), {where}: it {holds} at its peak.", WIDTH)
    if loss == "megatron":
        # vocab_parallel_cross_entropy all-reduces over Megatron's tensor-parallel group and asserts it
        # is initialized (parallel_state.get_tensor_model_parallel_group). Inside a pipeline with tp > 1
        # the LM head's logits are vocab-sharded over the grid's model-parallel ranks, consecutive ones as
        # Megatron's groups are; AutoTP's training LM head gathers its output, so each rank's logits are whole.
        tp = job.layout.tp if job.layout.pp > 1 else 1
        lines += [
            "train.py runs it from megatron-core, which needs Megatron's tensor-parallel group (else it",
            "asserts), and masks the labels itself (it has no ignore_index):",
            "",
            "    from megatron.core import parallel_state",
            "    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy",
            "    deepspeed.init_distributed()",
            f"    parallel_state.initialize_model_parallel(tensor_model_parallel_size={tp})",
            "    logits = model(input_ids).logits  # no labels=: not the model's own loss",
            "    mask = labels != -100  # labels shifted by one, as the model's own loss shifts them",
            "    loss = (vocab_parallel_cross_entropy(logits, labels.clamp(min=0)) * mask).sum() / mask.sum()",
            "    del logits  # nothing else keeps the 16-bit logits through the backward",
            "",
        ]
    else:
        lines += textwrap.wrap("Drop the model's output (outputs.logits) before engine.backward(loss): the plan "
                               "holds no 16-bit logits through the backward.", WIDTH)
    other_name, other_where, other_holds = ds_engine.LOSS_WORDS[other]
    change = f"adds {extra / 1e9:.2f} GB to" if extra >= 0 else f"takes {-extra / 1e9:.2f} GB off"
    lines += textwrap.wrap(f"{other_name[0].upper()}{other_name[1:]} (training.loss {other}: {other_where}) "
                           f"{other_holds}: it {change} this plan's peak of {estimate.peak.total / 1e9:.2f} GB. "
                           "Plan with the loss train.py runs.", WIDTH)
    return lines


def _autotp_snippet(job) -> list[str]:
    lay = job.layout
    world = lay.dp * lay.tp
    return [
        "",
        f"Tensor parallelism: AutoTP over {lay.tp} GPUs (tensor_parallel.autotp_size in ds_config.json).",
        "DeepSpeed checks train_batch_size against micro x accumulation x its data-parallel size; without",
        f"an mpu it counts all {world} ranks as data-parallel and rejects the config. Hand it the AutoTP",
        f"groups, whose data-parallel size is {lay.dp}, in train.py:",
        "",
        "    import deepspeed",
        "    from deepspeed.utils import groups",
        "    deepspeed.init_distributed()",
        f"    groups._init_tp_mesh_device(tensor_model_parallel_size={lay.tp})  # the groups AutoTP itself uses",
        "    engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model,",
        "                                                   model_parameters=model.parameters(), mpu=groups)",
        "",
        f"and feed the same micro-batch to the {lay.tp} ranks of each tensor-parallel group.",
    ] + _autotp_vocabulary_lines(job)


def _autotp_vocabulary_lines(job) -> list[str]:
    """Which of AutoTP's two LM heads the plan priced: the emitted files run the user's model, and only
    its Hugging Face tp plan splits the head's weight (``EngineBehaviour.whole_embedding_without_pipeline``);
    the input embedding stays whole either way."""
    lay, model = job.layout, job.model
    if model.tied_embeddings:
        head = "tied to it, whole with it (AutoTP leaves a tied head replicated)"
        return ["", *textwrap.wrap(f"Priced: the input embedding whole on every tensor-parallel rank (AutoTP "
                                   f"shards none), the LM head {head}.", WIDTH)]
    per_param = per_parameter_states(job)[0].total
    more = per_param * embedding_parameters(model, job_vocab(job)) * (1 - 1 / lay.tp)
    return ["", *textwrap.wrap(
        f"Priced: the input embedding whole on every tensor-parallel rank (AutoTP shards none), the LM "
        f"head's weight split over the {lay.tp} ranks, as a Hugging Face tp plan splits it (transformers' "
        f"lm_head: colwise_gather_output). A model without a tp plan keeps its lm_head whole on every rank: "
        f"{more / 1e9:.2f} GB more a GPU of its weights, gradients and optimizer states.", WIDTH)]


def _pipeline_snippet(job) -> list[str]:
    lay = job.layout
    stages = list(job.stage_layers)
    interval = 1 if lay.recompute == "full" else 0
    lines = [
        "",
        f"Pipeline: {lay.pp} stages holding {', '.join(map(str, stages))} transformer layers (the embedding",
        "on the first stage, the LM head on the last). ds_config.json has no pipeline degree: train.py",
        "builds a PipelineModule, whose grid gives DeepSpeed the data-parallel size "
        f"{lay.dp} (= {job.cluster.num_gpus} / {lay.pp}).",
        "",
    ]
    if job.model.mtp_layers:
        lines[-1:-1] = [f"The model's {job.model.mtp_layers} multi-token prediction module(s) go on the last stage, "
                        "after the LM head,", "with a copy of the input embedding: where the plan priced them."]
    topology = ""
    if lay.tp > 1:
        # AutoTP ignores the pipeline grid; Megatron-DeepSpeed's way: a 3D topology whose model
        # axis the model's tensor-parallel layers split over (deepspeed/runtime/pipe/topology.py).
        lines += [
            f"Tensor parallelism inside the pipeline: tp {lay.tp} is the model's own (Megatron-style",
            "column/row-parallel layers over the grid's model-parallel group, as Megatron-DeepSpeed builds",
            "them); DeepSpeed's AutoTP does not combine with a pipeline. Give the PipelineModule the 3D grid:",
            "",
            "    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology",
            f"    topology = PipeModelDataParallelTopology(num_pp={lay.pp}, num_mp={lay.tp}, num_dp={lay.dp})",
            "",
        ]
        topology = "topology=topology, "
    if len(set(stages)) == 1:
        lines += [
            "    from deepspeed.pipe import PipelineModule, LayerSpec",
            "    layers = [LayerSpec(Embedding, ...)]",
            f"    layers += [LayerSpec(TransformerLayer, ...) for _ in range({sum(stages)})]",
            "    layers += [LayerSpec(LMHead, ...)]",
            f"    model = PipelineModule(layers=layers, num_stages={lay.pp}, {topology}loss_fn=loss_fn,",
            "                           partition_method=\"type:TransformerLayer\",  # "
            f"{stages[0]} transformer layers a stage",
            f"                           activation_checkpoint_interval={interval})",
        ]
    else:
        lines += [
            "    from deepspeed.pipe import PipelineModule",
            "    # DeepSpeed's partition methods balance layers evenly; for these uneven stages give",
            "    # one entry per stage and split uniformly (one entry to each stage):",
            f"    stage_layers = {tuple(stages)}",
            "    blocks, start = [], 0",
            "    for i, n in enumerate(stage_layers):",
            "        block = [embedding] if i == 0 else []",
            "        block += transformer_layers[start:start + n]",
            "        start += n",
            "        if i == len(stage_layers) - 1:",
            "            block.append(lm_head)",
            "        blocks.append(torch.nn.Sequential(*block))",
            f"    model = PipelineModule(layers=blocks, num_stages={lay.pp}, {topology}loss_fn=loss_fn,",
            "                           partition_method=\"uniform\")",
        ]
        if interval:
            lines.append("    # recompute full: checkpoint each transformer layer inside its block "
                         "(deepspeed.checkpointing.checkpoint)")
    lines += [
        "    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())",
        f"    loss = engine.train_batch(data_iter)  # runs the {job.grad_accum} micro-batches of one step",
    ]
    return lines


def render(estimate, header_lines: Union[Sequence[str], str]) -> dict[str, str]:
    """``ds_config.json`` and ``launch.sh`` for the estimate's layout."""
    config = config_dict(estimate, header_lines)
    cluster = estimate.job.cluster
    nodes, per_node = launch_nodes(cluster, "deepspeed")
    files = {CONFIG: json.dumps(config, indent=2) + "\n", LAUNCH: launch_text(estimate, header_lines)}
    files[SBATCH_FILE] = sbatch(comment(_lines(header_lines) + [""] + TRAIN_SCRIPT_LINES), nodes, per_node,
                                TRAIN_COMMAND.replace(f'"$HERE/{CONFIG}"', '"$CONFIG"'), cluster=cluster,
                                files=f'CONFIG="$(realpath -e "$HERE/{CONFIG}")"\n')
    return files
