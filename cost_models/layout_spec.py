"""How one job is spread over the cluster (:class:`Layout`), and Megatron's interleaved order of
model chunks over pipeline ranks (:func:`rank_chunks`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, Optional, Sequence

from .spec_checks import SpecError, _choice, _positive_int

RECOMPUTE = ("none", "selective", "full")
_INT = {int}  # the types of a list of layer counts that needs no check one by one but its sign
# The parts of a layer selective recomputation can run again, in megatron-core's
# ``--recompute-modules`` names (``TransformerConfig.recompute_modules``); what each frees is
# ``activations.selective_freed_bytes``, what it runs again ``layer_time.selective_recompute_time``
# and ``experts.moe_recompute_time``.
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "layernorm", "mlp", "moe_act", "moe", "shared_experts")


# The fields only the recomputation's and the activation offload's checks read (Layout.with_changes),
# and only a stage's activations price (Job.at_activations, memory._stage_states).
ACTIVATION_FIELDS = frozenset({"recompute", "recompute_num_layers", "recompute_modules", "offload_activations"})

# ZeRO's stages (Rajbhandari et al. 2020, §5): none, optimizer states, gradients too, weights too.
ZERO_STAGES = (0, 1, 2, 3)


def rank_chunks(virtual: Sequence[int], pp: int) -> list[tuple[int, ...]]:
    """Each pipeline rank's model chunks, from the layers of the pp·vpp virtual stages in model
    order: virtual stage v·pp + r is rank r's v-th (Megatron's interleaved order)."""
    return [tuple(virtual[r::pp]) for r in range(pp)]


def _check_zero_stage(zero_stage: object) -> None:
    if isinstance(zero_stage, bool) or zero_stage not in ZERO_STAGES:
        raise SpecError(Layout, "zero_stage", f"expected 0, 1, 2 or 3, got {zero_stage!r}")


@dataclass(frozen=True)
class Layout:
    """How one training job is spread over the cluster (Megatron rank order: tp, cp, dp, pp)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    vpp: int = 1  # virtual pipeline stages (model chunks) per pipeline rank
    micro_batch_size: int = 1
    # Expert parallelism (Megatron's MoE parallel folding): the MoE layers' experts are split
    # over ep ranks and each expert's matrices over etp ranks, on a grid etp × ep × edp over
    # the same GPUs as the attention's tp × cp × dp (``expert_data_parallel``). etp None: tp
    # (megatron-core's default).
    ep: int = 1
    etp: Optional[int] = None
    zero_stage: int = 0  # Megatron's distributed optimizer is stage 1
    sequence_parallel: bool = False
    recompute: str = "none"
    recompute_num_layers: Optional[int] = None  # with full: layers per stage recomputed; None = all
    # With selective: the modules recomputed (RECOMPUTE_MODULES); None = those that free memory
    # for this model and training (``activations.selective_modules``).
    recompute_modules: Optional[tuple[str, ...]] = None
    # Layers held by each pipeline stage; None leaves the split to the engine
    # (``cost_models.partition``).
    stage_layers: Optional[tuple[int, ...]] = None
    # Layers of each of the pp·vpp model chunks in model order (chunk v·pp + r is rank r's v-th:
    # what a ``--pipeline-model-parallel-layout`` counts); None splits each stage's layers as
    # evenly as they go, the spare ones first (``partition.chunk_layers``). Sets stage_layers. Every
    # chunk holds a layer but the last, which may hold only the MTP layers and the loss.
    chunk_layers: Optional[tuple[int, ...]] = None
    # Megatron's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split:
    # the embedding (loss) counts as one layer of the first (last) virtual stage.
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    # Offload to host memory (``cost_models.offload``): the share of the optimizer states
    # (fp32 master weights and moments) kept and stepped on the CPU; ZeRO-3's parameter (and
    # gradient) shards kept there between uses; the saved activations of the first N layers
    # of each stage, copied out in forward and back in backward.
    offload_optimizer: float = 0.0
    offload_params: bool = False
    offload_activations: int = 0

    def __post_init__(self) -> None:
        s = Layout
        for name in ("dp", "tp", "pp", "cp", "vpp", "micro_batch_size", "ep"):
            _positive_int(s, name, getattr(self, name))
        if self.etp is not None:
            _positive_int(s, "etp", self.etp)
        _check_zero_stage(self.zero_stage)
        if not isinstance(self.sequence_parallel, bool):
            raise SpecError(s, "sequence_parallel", f"expected true or false, got {self.sequence_parallel!r}")
        self._check_recompute()
        if self.sequence_parallel and self.tp == 1:
            raise SpecError(s, "sequence_parallel", "needs tp > 1")
        for name in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise SpecError(s, name, f"expected true or false, got {value!r}")
            if value and self.pp == 1:
                raise SpecError(s, name, "needs pp > 1")
            if value and self.stage_layers is not None:
                raise SpecError(s, name, "give either stage_layers or the account-for flags, not both")
        if self.vpp > 1 and self.pp == 1:
            raise SpecError(s, "vpp", "interleaving needs pp > 1")
        f = self.offload_optimizer
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= 1:
            raise SpecError(s, "offload_optimizer", f"expected a fraction in [0, 1], got {f!r}")
        if not isinstance(self.offload_params, bool):
            raise SpecError(s, "offload_params", f"expected true or false, got {self.offload_params!r}")
        if self.offload_params and self.zero_stage != 3:
            raise SpecError(s, "offload_params", "needs zero_stage 3 (only sharded parameters live off the GPU)")
        self._check_offload_activations()
        if self.chunk_layers is not None:
            self._check_chunk_layers(self.chunk_layers)
        if self.stage_layers is not None:
            if len(self.stage_layers) != self.pp:
                raise SpecError(s, "stage_layers", f"expected {self.pp} entries (one per stage), got {len(self.stage_layers)}")
            plain = {*map(type, self.stage_layers)} == _INT and min(self.stage_layers) >= 0
            for n in () if plain else self.stage_layers:
                # A stage may hold no decoder layer: the edges still hold the embedding or the LM
                # head, and an engine that spreads blocks over more stages than there are layers
                # (nanotron) leaves some with none.
                if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                    raise SpecError(s, "stage_layers", f"expected non-negative layer counts, got {n!r}")

    def _check_recompute(self) -> None:
        """The checks of the recomputation fields, which no other check reads (``with_changes``)."""
        s = Layout
        _choice(s, "recompute", self.recompute, RECOMPUTE)
        if self.recompute_num_layers is not None:
            if isinstance(self.recompute_num_layers, bool) or not isinstance(self.recompute_num_layers, int) \
                    or self.recompute_num_layers < 1:
                raise SpecError(s, "recompute_num_layers",
                                f"expected at least 1 (layers per stage recomputed in full), "
                                f"got {self.recompute_num_layers!r}")
            if self.recompute != "full":
                raise SpecError(s, "recompute_num_layers", "applies only with recompute: full")
        if self.recompute_modules is not None:
            if self.recompute != "selective":
                raise SpecError(s, "recompute_modules", "applies only with recompute: selective")
            if not self.recompute_modules:
                raise SpecError(s, "recompute_modules", "expected at least one module (nothing recomputed is "
                                                        "recompute: none)")
            for name in self.recompute_modules:
                _choice(s, "recompute_modules", name, RECOMPUTE_MODULES)
            if len(set(self.recompute_modules)) != len(self.recompute_modules):
                raise SpecError(s, "recompute_modules", f"names a module twice: {list(self.recompute_modules)}")

    def _check_offload_activations(self) -> None:
        """The check of offload_activations, which no other check reads (``with_changes``)."""
        n = self.offload_activations
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise SpecError(Layout, "offload_activations", f"expected a non-negative integer, got {n!r}")

    def _check_chunk_layers(self, chunks: tuple[int, ...]) -> None:
        s = Layout
        if len(chunks) != self.pp * self.vpp:
            raise SpecError(s, "chunk_layers", f"expected pp·vpp = {self.pp * self.vpp} entries (one per model "
                                               f"chunk), got {len(chunks)}")
        # The model's last chunk may hold no decoder layer when it holds the MTP modules and the loss
        # (Megatron-Bridge's DeepSeek-V3 layout on H100, "Et|(tt|)*30mL"); Job checks the model has them.
        # The common case first, in C: every count a plain int, each positive but the last, which may be 0
        # (a search builds layouts by the ten thousand, some of 94 chunks, two checks each).
        plain = {*map(type, chunks)} == _INT and min(chunks[:-1], default=1) >= 1 and chunks[-1] >= 0
        for i, n in enumerate(() if plain else chunks):
            last = i == len(chunks) - 1
            if isinstance(n, bool) or not isinstance(n, int) or n < (0 if last else 1):
                raise SpecError(s, "chunk_layers", f"expected a positive layer count for every model chunk (the last "
                                                   f"may hold none where it holds the MTP layers), got {n!r}")
        stages = tuple(sum(c) for c in rank_chunks(chunks, self.pp))
        if self.stage_layers is not None and tuple(self.stage_layers) != stages:
            raise SpecError(s, "chunk_layers", f"hold {list(stages)} layers per stage, but stage_layers says "
                                               f"{list(self.stage_layers)}")
        object.__setattr__(self, "stage_layers", stages)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def offloads(self) -> bool:
        return bool(self.offload_optimizer or self.offload_params or self.offload_activations)

    @property
    def expert_tp(self) -> int:
        """Expert tensor parallel degree: etp, else tp."""
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        """Expert data parallel: the ranks that hold the same experts, tp·cp·dp / (etp·ep)
        (megatron-core ``parallel_state``: the expert grid folds over the attention's)."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

    def at_micro_batch(self, micro_batch_size: int, zero_stage: int) -> "Layout":
        """This layout at another micro-batch size and ZeRO stage, checked in those two alone: of the
        checks of :meth:`__post_init__`, which this layout passed, no other reads them but the
        parameters' offload (which takes them all). The search builds a layout for each micro-batch
        and ZeRO stage of each group of degrees it weighs (3,330 a three-engine plan of Mixtral 8x7B),
        most of them only to find them past its threshold."""
        if self.offload_params:
            return self.with_changes(micro_batch_size=micro_batch_size, zero_stage=zero_stage)
        _positive_int(Layout, "micro_batch_size", micro_batch_size)
        _check_zero_stage(zero_stage)
        layout = object.__new__(Layout)
        layout.__dict__.update(self.__dict__, micro_batch_size=micro_batch_size, zero_stage=zero_stage)
        return layout

    def with_changes(self, **changes) -> "Layout":
        # dataclasses.replace inspects the fields on every call; the search calls this for every
        # rung of every recompute ladder. The new layout is validated all the same: in full, or
        # where only the recomputation fields and offload_activations change, in those alone
        # (:meth:`_with_activation_changes`).
        if changes.keys() <= ACTIVATION_FIELDS:
            return self._with_activation_changes(changes)
        return Layout(**{**self.__dict__, **changes})

    def _with_activation_changes(self, changes: dict[str, Any]) -> "Layout":
        """This layout with only its recomputation fields and offload_activations changed, checked in
        those alone. Safe: this layout passed every check of :meth:`__post_init__` (a Layout is only
        built through it, :meth:`at_micro_batch` or here, each of which checks what it changes), and
        of those checks only :meth:`_check_recompute` and :meth:`_check_offload_activations` read
        these fields, in the order :meth:`__post_init__` runs them; no field is derived from them
        (``stage_layers`` is from ``chunk_layers``). The search builds each rung of every layout's
        recomputation ladder and each trial of its bisections so (3,661 layouts a three-engine plan
        of Mixtral 8x7B)."""
        layout = object.__new__(Layout)
        layout.__dict__.update(self.__dict__, **changes)
        layout._check_recompute()
        layout._check_offload_activations()
        return layout

    def to_dict(self) -> dict[str, Any]:
        """The layout as a case file's ``layout`` section gives it (docs/case-reference.md): the
        degrees, micro-batch, ZeRO stage and recomputation always; the rest where set."""
        section: dict[str, Any] = {
            "dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp, "vpp": self.vpp,
            "micro_batch_size": self.micro_batch_size, "zero_stage": self.zero_stage,
            "sequence_parallel": self.sequence_parallel, "recompute": self.recompute,
        }
        if self.ep > 1 or self.etp is not None:
            section["ep"] = self.ep
        if self.etp is not None:
            # Only where the layout states it: etp None is tp wherever it is read (``expert_tp``), and
            # the section a case reads back must give this layout, equal to it (the resolved figure is
            # the results' to state: ``planner.estimate.layout_section``).
            section["etp"] = self.etp
        if self.recompute_num_layers is not None:
            section["recompute_num_layers"] = self.recompute_num_layers
        if self.recompute_modules is not None:
            section["recompute_modules"] = list(self.recompute_modules)
        if self.stage_layers is not None:
            section["stage_layers"] = list(self.stage_layers)
        if self.chunk_layers is not None:
            section["chunk_layers"] = list(self.chunk_layers)
        for flag in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
            if getattr(self, flag):
                section[flag] = True
        for name in ("offload_optimizer", "offload_params", "offload_activations"):
            if getattr(self, name):
                section[name] = getattr(self, name)
        return section


# A layout's fields but its ACTIVATION_FIELDS, as a tuple: what keys the pricing a layout's
# recomputation ladder shares (Job.at_activations, memory._stage_states).
without_activations = attrgetter(*(f.name for f in fields(Layout) if f.name not in ACTIVATION_FIELDS))
