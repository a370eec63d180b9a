"""A job: the model, the cluster, the training and the layout together (:class:`Job`), checked
against each other in one place. What an engine leaves to the layout is resolved by
:mod:`cost_models.resolution`; where the layers go, by :mod:`cost_models.placement`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, TypeVar

from . import placement
from .experts import deepep_group_refusal
from .frozen import cached_property
from .hardware import ClusterSpec, GPUSpec
from .layout_spec import Layout
from .model_spec import ModelSpec
from .pipeline import interleaving_refusal
from .resolution import resolve_training
from .spec_checks import SpecError
from .training_spec import Overheads, TrainingSpec


_Priced = TypeVar("_Priced")


def kept_by_stage(job: "Job", name: str, stage: int, price: Callable[["Job", int], _Priced]) -> _Priced:
    """``price(job, stage)``, kept on the job in a dict named ``name``: a Job never changes, and the
    search asks for a stage's figures many times a layout (``stage_time.stage_time``,
    ``memory.job_stage_parameters``). ``Job.at_activations`` carries no such dict to a sibling."""
    held = job.__dict__.get(name)
    if held is None:
        held = job.__dict__[name] = {}
    found = held.get(stage)
    if found is None:
        found = held[stage] = price(job, stage)
    return found


def dispatch_refusal(training: TrainingSpec, model: ModelSpec, gpu: GPUSpec) -> Optional[str]:
    """Why the expert dispatch cannot run for this model on this GPU, whatever the layout; None if it can."""
    if training.expert_dispatch == "deepep" and model.moe_capacity_factor is not None:
        return ("deepep pads no expert to a capacity (megatron-core's flex dispatcher refuses "
                "moe_pad_expert_input_to_capacity): drop model.moe_capacity_factor or dispatch all_to_all")
    if training.expert_dispatch == "deepep" and gpu.deepep_refusal:
        return f"{gpu.deepep_refusal}: dispatch all_to_all"
    return None


def context_parallel_sequence_refusal(seq_len: int, cp: int) -> Optional[str]:
    """Why a sequence of ``seq_len`` tokens cannot be split over ``cp`` context-parallel ranks; None if
    it can. Megatron-core and torchtitan balance the causal mask's work by cutting the sequence into
    2·cp chunks, rank i taking chunks i and 2·cp − 1 − i (megatron-core's ``get_batch_on_this_cp_rank``;
    torch's ``_HeadTailLoadBalancer``), so the sequence divides by 2·cp and each rank holds seq / cp."""
    if cp > 1 and seq_len % (2 * cp):
        return f"seq_len {seq_len} must divide by 2·cp = {2 * cp}"
    return None


# ACTIVATION_FIELDS (layout_spec): the layout's fields that no check of a Job but
# :meth:`Job._check_activation_fields` reads, nor the training's resolution or the stages' layers: what
# a search changes rung by rung (Job.at_activations).
# What Job.at_activations carries over from the job it is built from: the fields but the layout, the
# training as requested, and the layout's placement (cached properties) that these fields do not change.
_CARRIED = frozenset({"model", "cluster", "training", "overheads", "_requested", "stage_layers", "chunk_layers",
                      "stage_moe_layers", "high_precision_layers"})


@dataclass(frozen=True)
class Job:
    """Everything the cost models need: what is trained, on what, and how it is laid out.

    Cross-spec rules live in :meth:`__post_init__`, the one place a layout is
    checked against the model, cluster and batch.
    """

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layout: Layout
    overheads: Overheads = field(default_factory=Overheads)

    def __post_init__(self) -> None:
        m, c, t, lay = self.model, self.cluster, self.training, self.layout
        s = Layout
        resolved = resolve_training(t, lay)
        if resolved is not t:
            # The cost models read the resolved training; the request is kept for the same job at
            # another layout (with_layout).
            object.__setattr__(self, "_requested", t)
            object.__setattr__(self, "training", resolved)
        if lay.world_size != c.num_gpus:
            raise SpecError(s, "dp", f"dp·tp·pp·cp = {lay.dp}·{lay.tp}·{lay.pp}·{lay.cp} = {lay.world_size} "
                                     f"must equal the cluster's {c.num_gpus} GPUs")
        if m.num_attention_heads % lay.tp:
            raise SpecError(s, "tp", f"must divide num_attention_heads {m.num_attention_heads}, got {lay.tp}")
        if m.num_kv_heads % lay.tp and lay.tp % m.num_kv_heads:
            raise SpecError(s, "tp", f"must divide or be a multiple of num_kv_heads {m.num_kv_heads}, got {lay.tp}")
        if m.ffn_hidden_size % lay.tp and m.num_moe_layers < m.num_layers:
            raise SpecError(s, "tp", f"must divide ffn_hidden_size {m.ffn_hidden_size}, got {lay.tp}")
        if m.moe_shared_expert_ffn_hidden_size % lay.tp:
            raise SpecError(s, "tp", f"must divide moe_shared_expert_ffn_hidden_size "
                                     f"{m.moe_shared_expert_ffn_hidden_size}, got {lay.tp}")
        self._check_experts()
        refusal = dispatch_refusal(t, m, self.cluster.gpu)
        if refusal:
            raise SpecError(TrainingSpec, "expert_dispatch", refusal)
        refusal = context_parallel_sequence_refusal(t.seq_len, lay.cp)
        if refusal:
            raise SpecError(s, "cp", refusal)
        if lay.sequence_parallel and t.seq_len % (lay.tp * lay.cp):
            raise SpecError(s, "sequence_parallel", f"seq_len {t.seq_len} must divide by tp·cp = {lay.tp * lay.cp}")
        if lay.stage_layers is not None:
            if sum(lay.stage_layers) != m.num_layers:
                raise SpecError(s, "stage_layers", f"must sum to num_layers {m.num_layers}, got {sum(lay.stage_layers)}")
            # With interleaving, a stage's layers may split into unequal model chunks (Meta's
            # Llama 3 405B: 126 layers on 16 stages, one fewer on the first and last), as
            # Megatron's --pipeline-model-parallel-layout writes them; each chunk holds one at least.
            if lay.vpp > 1 and lay.chunk_layers is None and min(lay.stage_layers) < lay.vpp:
                raise SpecError(s, "stage_layers", f"every stage needs at least vpp {lay.vpp} layers "
                                                   f"(one per model chunk), got {min(lay.stage_layers)}")
            if lay.chunk_layers is not None and lay.chunk_layers[-1] == 0 and not m.mtp_layers:
                raise SpecError(s, "chunk_layers", "the last model chunk holds no decoder layer: only a model with "
                                                   "multi-token prediction layers (mtp_layers) may end in a chunk "
                                                   "of its MTP layers and loss alone")
        elif self.training.engine.splits_by_block_cost:
            # nanotron's own split, which leaves ranks empty (the Playbook ran 28 layers on 32 ranks),
            # and which Megatron's flags do not move: refused by name, not as a split that must divide.
            flag = next((f for f in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
                         if getattr(lay, f)), None)
            if flag is not None:
                raise SpecError(s, flag, f"{self.training.engine.name} has no such flag: it cuts its stages itself, "
                                         "by the blocks' running cost (nanotron/models/base.py, build_model), the "
                                         "embedding and LM head weighed in; drop it")
        elif lay.account_for_embedding_in_pipeline_split or lay.account_for_loss_in_pipeline_split:
            units = m.num_layers + lay.account_for_embedding_in_pipeline_split + lay.account_for_loss_in_pipeline_split
            if units % (lay.pp * lay.vpp):
                counted = " and ".join(name for name, on in (("embedding", lay.account_for_embedding_in_pipeline_split),
                                                             ("loss", lay.account_for_loss_in_pipeline_split)) if on)
                raise SpecError(s, "pp", f"num_layers {m.num_layers} with the {counted} counted ({units}) "
                                         f"must divide by pp·vpp = {lay.pp * lay.vpp}")
        elif self.training.engine.balance_stages and lay.vpp == 1:  # balanced split (cost_models.partition)
            if m.num_layers < lay.pp - 2:
                raise SpecError(s, "pp", f"num_layers {m.num_layers} cannot fill pp {lay.pp} stages")
        elif lay.vpp > 1 and m.num_layers < lay.pp * lay.vpp:
            raise SpecError(s, "vpp", f"num_layers {m.num_layers} cannot fill pp·vpp = {lay.pp * lay.vpp} model chunks")
        elif lay.vpp == 1 and m.num_layers % lay.pp:
            raise SpecError(s, "pp", f"num_layers {m.num_layers} must divide by pp = {lay.pp} "
                                     "(or give Layout.stage_layers)")
        self._check_activation_fields()
        per_step = lay.micro_batch_size * lay.dp
        if t.global_batch_size % per_step:
            raise SpecError(TrainingSpec, "global_batch_size",
                            f"{t.global_batch_size} must divide by micro_batch_size·dp = "
                            f"{lay.micro_batch_size}·{lay.dp} = {per_step}")
        refusal = interleaving_refusal(lay.pp, self.num_microbatches,
                                       self.training.engine.interleaving_rounds) if lay.vpp > 1 else None
        if refusal:
            raise SpecError(s, "vpp", refusal)

    def _check_activation_fields(self) -> None:
        """The checks of :meth:`__post_init__` that read the layout's ``ACTIVATION_FIELDS`` (``Layout.offloads``
        reads offload_activations), in its order: :meth:`at_activations` runs these alone."""
        lay, s = self.layout, Layout
        if lay.offloads:
            self.cluster.gpu.offload_host()  # raises where the GPU has no host figures
        if lay.offload_activations > max(self.stage_layers):
            raise SpecError(s, "offload_activations",
                            f"at most the {max(self.stage_layers)} layers of a stage, got {lay.offload_activations}")
        if lay.recompute_num_layers is not None and lay.recompute_num_layers > max(self.stage_layers):
            raise SpecError(s, "recompute_num_layers",
                            f"at most the {max(self.stage_layers)} layers of a stage, got {lay.recompute_num_layers}")

    def at_activations(self, layout: Layout) -> "Job":
        """This job at ``layout``, which differs from its own layout in ``ACTIVATION_FIELDS`` alone,
        checked in those alone: the same Job as ``Job(model, cluster, requested training, layout,
        overheads)``, the same refusal. Safe: of :meth:`__post_init__`'s checks only
        :meth:`_check_activation_fields` reads those fields, and it runs at the point where the first
        of them could fail (every other passed at this job's layout); the training's resolution reads
        the ZeRO stage and the optimizer's offload alone (``resolution.resolve_training``), and the
        stages' layers, model chunks, MoE and high-precision layers none of these fields
        (``placement``, ``partition``): they are carried over. What is kept of the job's pricing
        (``stage_time``'s ``_stage_times``) is not. A search builds a job for every rung of each
        layout's recomputation ladder and every trial of its bisections (``planner.search_memory.case_job``)."""
        job = object.__new__(Job)
        job.__dict__.update({name: value for name, value in self.__dict__.items() if name in _CARRIED},
                            layout=layout)
        job._check_activation_fields()
        return job

    def _check_experts(self) -> None:
        """Expert parallelism against the model and the attention's grid (megatron-core
        ``MoELayer``: experts divide by ep; the expert grid etp·ep·edp folds over tp·cp·dp)."""
        m, lay, s = self.model, self.layout, Layout
        if not m.is_moe:
            if lay.ep > 1:
                raise SpecError(s, "ep", f"expert parallelism needs a mixture of experts (model.num_experts), got {lay.ep}")
            if lay.etp is not None and lay.etp != lay.tp:
                raise SpecError(s, "etp", "expert tensor parallelism needs a mixture of experts (model.num_experts)")
            return
        if m.num_experts % lay.ep:
            raise SpecError(s, "ep", f"must divide num_experts {m.num_experts}, got {lay.ep}")
        etp = lay.expert_tp
        if m.moe_ffn_hidden_size % etp:
            raise SpecError(s, "etp", f"must divide moe_ffn_hidden_size {m.moe_ffn_hidden_size}, got {etp}")
        if (lay.tp * lay.cp * lay.dp) % (etp * lay.ep):
            raise SpecError(s, "ep", f"etp·ep = {etp}·{lay.ep} must divide tp·cp·dp = "
                                     f"{lay.tp}·{lay.cp}·{lay.dp} = {lay.tp * lay.cp * lay.dp} (the expert grid "
                                     "folds over the same GPUs)")
        if self.training.expert_dispatch == "deepep" and deepep_group_refusal(etp, lay.ep):
            # Left to the engine, such a group dispatches by the all-to-all (experts.hierarchical_dispatch).
            raise SpecError(s, "ep", f"training.expert_dispatch deepep: {deepep_group_refusal(etp, lay.ep)}; "
                                     "choose another ep (or etp), or dispatch all_to_all")

    @property
    def grad_accum(self) -> int:
        """Micro-batches each data-parallel rank runs per optimizer step."""
        return self.training.global_batch_size // (self.layout.micro_batch_size * self.layout.dp)

    @property
    def num_microbatches(self) -> int:
        """m in the pipeline formulas: micro-batches through each pipeline per step."""
        return self.grad_accum

    @property
    def requested_training(self) -> TrainingSpec:
        """The training as the case gave it, before its engine's defaults were resolved at this layout."""
        return self.__dict__.get("_requested", self.training)

    def with_layout(self, layout: Layout) -> "Job":
        """The same job at another layout, with the engine's defaults resolved afresh for it."""
        return Job(self.model, self.cluster, self.requested_training, layout, self.overheads)

    @cached_property  # read for every stage by every cost model; a Job never changes
    def stage_layers(self) -> tuple[int, ...]:
        """Layers of each pipeline stage (:func:`placement.stage_layers`)."""
        return placement.stage_layers(self.model, self.training, self.layout)

    @cached_property
    def chunk_layers(self) -> Optional[tuple[int, ...]]:
        """Layers of each model chunk in model order, where not each rank's split evenly
        (:func:`placement.chunk_layers`)."""
        return placement.chunk_layers(self.model, self.training, self.layout)

    @property
    def model_chunk_layers(self) -> tuple[int, ...]:
        """Layers of each of the pp·vpp model chunks in model order (chunk v·pp + r is rank r's v-th),
        whether the layout states them or each rank's layers split as evenly as they go."""
        pp = self.layout.pp
        return tuple(self.rank_chunk_layers(v % pp)[v // pp] for v in range(pp * self.layout.vpp))

    def rank_chunk_layers(self, stage: int) -> tuple[int, ...]:
        """Layers of each of pipeline rank ``stage``'s model chunks, in model order."""
        return placement.rank_chunk_layers(self.stage_layers, self.chunk_layers, self.layout, stage)

    @cached_property
    def stage_moe_layers(self) -> tuple[int, ...]:
        """MoE layers of each pipeline stage (:func:`placement.moe_layers_per_stage`)."""
        return placement.moe_layers_per_stage(self.model, self.stage_layers, self.layout.vpp, self.chunk_layers)

    @cached_property
    def high_precision_layers(self) -> tuple[int, ...]:
        """Decoder layers of each stage whose linears the recipe keeps in bf16
        (:func:`placement.high_precision_layers`)."""
        return placement.high_precision_layers(self.model, self.training, self.layout, self.stage_layers,
                                               self.chunk_layers)

    def largest_chunk(self, stage: int) -> int:
        """Layers of the largest model chunk of pipeline rank ``stage``."""
        return max(self.rank_chunk_layers(stage))
