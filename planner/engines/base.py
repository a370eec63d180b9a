"""What an engine can express, and the rules a layout must meet for it to run.

An :class:`Engine` couples three things its module declares: :class:`EngineSupport` (the
choices the search may make), its :class:`~cost_models.behaviour.EngineBehaviour` (how the
cost models time and size what it runs) and the rules of its own code that a job must meet
(``rules``), each with the reason the engine gives. :meth:`Engine.problems` is the one list
the search filters by, ``estimate`` refuses on and the emitters repeat.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from cost_models.behaviour import EngineBehaviour
from cost_models.job import dispatch_refusal
from cost_models.memory import peak_stage_memory
from cost_models.quantization import FP8_RECIPES, LOW_PRECISIONS
from cost_models.specs import EXPERT_DISPATCHES, OPTIMIZER_MOMENTS, GPUSpec, Job, ModelSpec, TrainingSpec

from planner.errors import CaseError


@dataclass(frozen=True)
class EngineSupport:
    """The layout choices an engine offers the search."""

    zero_stages: tuple[int, ...]
    max_zero_with_pp: int  # highest ZeRO stage the engine combines with pipeline parallelism
    interleaving: bool
    context_parallel: bool
    sequence_parallel: tuple[bool, ...]  # allowed values when tp > 1
    recompute: tuple[str, ...]
    partial_recompute: bool  # full recomputation of only some layers per stage
    # Selective recomputation of the modules a layout names (layout.recompute_modules).
    recompute_modules: bool = False
    tp_with_pp: bool = True  # tensor and pipeline parallelism together
    # Context-parallel ranks always share the sharded model states (torchtitan folds cp into
    # its FSDP mesh), so cp > 1 needs a sharded (ZeRO ≥ 1) layout.
    cp_shards_states: bool = False
    # TP collectives pipelined with their GEMMs (training.tp_comm_overlap).
    tp_comm_overlap: bool = True
    # Expert-parallel dispatch and combine beside another micro-batch's compute (training.moe_comm_overlap).
    moe_comm_overlap: bool = False
    # The highest ZeRO stage tensor parallelism combines with (DeepSpeed's AutoTP: 2).
    max_zero_with_tp: int = 3
    # Offload (cost_models.offload). The optimizer: "none", "all" (all of it or none) or
    # "fraction" (any share), from ZeRO stage ``optimizer_offload_zero`` up; ZeRO-3
    # parameters; the first N layers' activations. ``offload_together``: parameters and the
    # whole optimizer go to the host together or not at all (FSDP2's CPUOffloadPolicy).
    optimizer_offload: str = "none"
    optimizer_offload_zero: tuple[int, ...] = (1, 2, 3)
    param_offload: bool = False
    activation_offload: bool = False
    # Whether activation offload runs beside recomputation and beside a pipeline (Megatron's CPU
    # offloading does neither: TransformerConfig).
    activation_offload_with_recompute: bool = True
    activation_offload_with_pipeline: bool = True
    offload_together: bool = False
    # Expert parallelism (layout.ep > 1) for mixtures of experts, and which expert
    # tensor-parallel degrees the engine runs: "any" divisor (Megatron's
    # --expert-tensor-parallel-size), "tp" (the experts split as the attention is: DeepSpeed's
    # enable_expert_tensor_parallelism), "one" (whole experts) or "tp_without_ep" (split as the
    # attention without expert parallelism, whole with it: torchtitan, which shards them with FSDP over
    # the ranks expert parallelism leaves). The search tries etp 1 and tp where "any".
    expert_parallel: bool = True
    expert_tp: str = "any"
    # The fp8 recipes the engine runs (``training.fp8_recipe``), and whether its weight gathers
    # can move quantized weights (``training.fp8_param_gather``): all of them for no engine in
    # particular.
    fp8_recipes: tuple[str, ...] = FP8_RECIPES
    fp8_param_gather: bool = True
    # The expert-parallel dispatches the engine runs (``training.expert_dispatch``).
    expert_dispatches: tuple[str, ...] = EXPERT_DISPATCHES
    # Training without master weights (``training.master_weights: false``): the optimizer steps the
    # bf16 weights themselves, as plain PyTorch does for a model built in bf16.
    pure_bf16: bool = True
    # The dtypes the engine keeps Adam's moments in beside fp32 master weights
    # (``training.optimizer_moments``): torch's fused Adam steps bf16 moments beside fp32 parameters.
    optimizer_moments: tuple[str, ...] = OPTIMIZER_MOMENTS
    # The fp32 master kept as remainders of the bf16 weights (``training.master_remainders: true``):
    # Transformer Engine's FusedAdam, which torch's Adam and the engines built on it do not run.
    master_remainders: bool = False
    # The loss compiled by torch.compile, or not (``training.compiled_loss``): the PyTorch stacks
    # run either; Megatron's and Megatron-DeepSpeed's vocab-parallel cross-entropy is their own.
    compiled_loss: bool = True
    # The cross-entropies a case may name (``training.loss``, ``behaviour.LOSSES``): none where the engine's
    # loss is its own; DeepSpeed, which runs the user's train.py, either.
    losses: tuple[str, ...] = ()
    # The LM head and the loss run in sequence chunks (``training.loss_chunks`` above 1, or
    # ``training.chunked_loss``): torchtitan's ChunkedLossWrapper; the others run them on the whole
    # sequence.
    chunked_loss: bool = False
    # The attention kernels a case may name (``training.fused_attention``): the vendor's fused one
    # (True) and a FlashAttention-2-class one (False). Engines whose attention is one kernel of
    # their own list only it.
    fused_attention: tuple[bool, ...] = (True, False)
    # What the engine says where a choice is missing: field name → reason.
    why: tuple[tuple[str, str], ...] = ()

    def reason(self, name: str, default: str) -> str:
        return dict(self.why).get(name, default)

    def modules_refusal(self, named_by: str) -> str:
        """Why the engine takes no list of modules to recompute (``named_by``: a layout, a search)."""
        if "selective" in self.recompute:
            return self.reason("recompute_modules", f"recomputes by its own selective policy, not by the modules "
                                                    f"{named_by} names")
        return self.reason("recompute_modules", "has no selective recomputation (it recomputes whole layers: "
                                                "recompute none or full)")

    def recipe_refusals(self, training: TrainingSpec) -> list[tuple[str, str]]:
        """(key, reason) for a low-precision recipe the engine does not run."""
        out = []
        if training.precision in LOW_PRECISIONS and not self.fp8_recipes:
            # An engine with no recipe at all (nanotron) runs no low precision: a recipe left unset
            # would otherwise pass, priced with a recipe the engine does not have.
            out.append(("training.precision", self.reason("fp8_recipe", f"runs no {training.precision} recipe")))
        elif training.precision == "fp8" and training.fp8_recipe not in (None,) + self.fp8_recipes:
            out.append(("training.fp8_recipe", self.reason("fp8_recipe", "its fp8 recipes are")
                        + f" {', '.join(self.fp8_recipes)}, not {training.fp8_recipe}"))
        if training.expert_dispatch not in (None,) + self.expert_dispatches:
            out.append(("training.expert_dispatch", self.reason("expert_dispatch", "its expert-parallel dispatch is")
                        + f" {', '.join(self.expert_dispatches)}, not {training.expert_dispatch}"))
        if training.fp8_param_gather and not self.fp8_param_gather:
            out.append(("training.fp8_param_gather", self.reason(
                "fp8_param_gather", "its weight gathers move bf16 weights (no fp8 parameter all-gather)")))
        if training.compiled_loss and not self.compiled_loss:
            out.append(("training.compiled_loss", self.reason(
                "compiled_loss", "its cross-entropy is its own kernel, not a compiled one")))
        if training.loss is not None and training.loss not in self.losses:
            out.append(("training.loss", self.reason(
                "loss", "its loss is its own, not one a case names (training.compiled_loss and loss_chunks say how it runs)")
                        + (f": {', '.join(self.losses)}" if self.losses else "") + f", not {training.loss}"))
        if ((training.loss_chunks or 1) > 1 or training.chunked_loss) and not self.chunked_loss:
            key = "training.loss_chunks" if (training.loss_chunks or 1) > 1 else "training.chunked_loss"
            out.append((key, self.reason("chunked_loss", "its LM head and loss run on the whole sequence, not in chunks")))
        if training.fused_attention is not None and training.fused_attention not in self.fused_attention:
            out.append(("training.fused_attention", self.reason(
                "fused_attention", "its attention runs one kernel of its own")))
        if not training.master_weights and not self.pure_bf16:
            out.append(("training.master_weights", self.reason(
                "pure_bf16", "its optimizer keeps master weights beside the bf16 ones")))
        if training.optimizer_moments not in self.optimizer_moments:
            out.append(("training.optimizer_moments", self.reason(
                "optimizer_moments", "its optimizer keeps Adam's moments in")
                        + f" {', '.join(self.optimizer_moments)}, not {training.optimizer_moments}"))
        if training.master_remainders and not self.master_remainders:
            out.append(("training.master_remainders", self.reason(
                "master_remainders", "its optimizer keeps the fp32 master whole (4 bytes), not as remainders of "
                                     "the bf16 weights (Transformer Engine's FusedAdam store_param_remainders)")))
        return out

    def expert_tp_choices(self, tp: int) -> tuple[int, ...]:
        """The expert tensor-parallel degrees the search tries at attention tensor parallelism ``tp``."""
        if self.expert_tp == "one":
            return (1,)
        if self.expert_tp == "tp":
            return (tp,)
        return tuple(sorted({1, tp}))  # "tp_without_ep": expert_refusals keeps the one that goes with ep

    def expert_refusals(self, tp: int, ep: int, etp: int) -> list[tuple[str, str]]:
        """(layout key, reason) for each expert-parallel choice the engine does not offer."""
        out = []
        if ep > 1 and not self.expert_parallel:
            out.append(("ep", self.reason("expert_parallel", "has no expert parallelism")))
        if self.expert_tp == "one" and etp != 1:
            out.append(("etp", self.reason("expert_tp", "runs whole experts (etp 1) only")))
        elif self.expert_tp == "tp" and etp != tp:
            out.append(("etp", self.reason("expert_tp", f"splits experts as the attention (etp = tp = {tp}) only")))
        elif self.expert_tp == "tp_without_ep" and etp != (tp if ep == 1 else 1):
            out.append(("etp", self.reason("expert_tp", f"splits the experts over the tensor-parallel ranks without "
                                                        f"expert parallelism (etp = tp = {tp}) and runs them whole "
                                                        f"with it (etp 1), so at ep {ep}: etp {tp if ep == 1 else 1}")))
        return out

    def allows(self, tp: int, pp: int, cp: int, vpp: int, zero_stage: int, sequence_parallel: bool,
               recompute: str) -> bool:
        return not self.refusals(tp, pp, cp, vpp, zero_stage, sequence_parallel, recompute)

    def refusals(self, tp: int, pp: int, cp: int, vpp: int, zero_stage: int, sequence_parallel: bool,
                 recompute: str) -> list[tuple[str, str]]:
        """(layout key, reason) for each choice the engine does not offer."""
        out = []
        if zero_stage not in self.zero_stages:
            out.append(("zero_stage", self.reason("zero_stages", f"offers ZeRO stages {self.zero_stages}, "
                                                                 f"not {zero_stage}")))
        elif pp > 1 and zero_stage > self.max_zero_with_pp:
            out.append(("zero_stage", self.reason("max_zero_with_pp", f"combines pipelining with ZeRO stages up "
                                                                      f"to {self.max_zero_with_pp}, not {zero_stage}")))
        if tp > 1 and zero_stage > self.max_zero_with_tp:
            out.append(("zero_stage", self.reason("max_zero_with_tp", f"combines tensor parallelism with ZeRO "
                                                                      f"stages up to {self.max_zero_with_tp}")))
        if vpp > 1 and not self.interleaving:
            out.append(("vpp", self.reason("interleaving", "has no interleaved pipeline schedule")))
        if cp > 1 and not self.context_parallel:
            out.append(("cp", self.reason("context_parallel", "has no context parallelism")))
        if tp > 1 and sequence_parallel not in self.sequence_parallel:
            out.append(("sequence_parallel", self.reason("sequence_parallel",
                                                         f"runs tensor parallelism with sequence_parallel "
                                                         f"{self.sequence_parallel[0]} only")))
        if tp > 1 and pp > 1 and not self.tp_with_pp:
            out.append(("tp", self.reason("tp_with_pp", "cannot combine tensor and pipeline parallelism")))
        if cp > 1 and zero_stage == 0 and self.cp_shards_states:
            out.append(("zero_stage", self.reason("cp_shards_states", "shards model states over context-parallel "
                                                                      "ranks: cp > 1 needs zero_stage ≥ 1")))
        if recompute not in self.recompute:
            out.append(("recompute", self.reason("recompute", f"recomputes {' or '.join(self.recompute)}, "
                                                              f"not {recompute}")))
        return out


    def offload_refusals(self, offload_optimizer: float, offload_params: bool, offload_activations: int,
                         zero_stage: int) -> list[tuple[str, str]]:
        """(layout key, reason) for each offload the engine does not run."""
        out = []
        if offload_optimizer:
            if self.optimizer_offload == "none":
                out.append(("offload_optimizer", self.reason("optimizer_offload", "cannot offload the optimizer")))
            elif self.optimizer_offload == "all" and offload_optimizer != 1:
                out.append(("offload_optimizer", self.reason("optimizer_offload", "offloads all of the optimizer "
                                                                                  "(1) or none of it (0)")))
            elif zero_stage not in self.optimizer_offload_zero:
                out.append(("offload_optimizer", self.reason("optimizer_offload_zero", "offloads the optimizer with "
                                                             f"ZeRO stages {self.optimizer_offload_zero}")))
        if offload_params and not self.param_offload:
            out.append(("offload_params", self.reason("param_offload", "cannot offload parameters")))
        if self.offload_together and (offload_params or offload_optimizer) \
                and not (offload_params and offload_optimizer == 1):
            out.append(("offload_params", self.reason("offload_together", "offloads parameters and the whole "
                                                                          "optimizer together or neither")))
        if offload_activations and not self.activation_offload:
            out.append(("offload_activations", self.reason("activation_offload", "cannot offload activations")))
        return out


# The keys of an engine's problems that a layout's degrees decide (the parallel grid, the pipeline's
# stages, the ZeRO stage): a layout refused on one is refused with any recomputation, offload and
# micro-batch (tests/test_search_bounds.py holds every engine's rules to it).
DEGREE_KEYS = frozenset(f"layout.{key}" for key in ("dp", "tp", "pp", "cp", "vpp", "ep", "etp", "sequence_parallel",
                                                    "stage_layers", "zero_stage"))


class Emitter(Protocol):
    """An engine's launch files (its package's ``emit`` module): ``render`` gives each file's
    name (relative to the output folder) and text for the estimate's layout, every file opening with
    the provenance ``header``; ``warnings`` what the user must know about them."""

    def render(self, estimate: Any, header: list[str]) -> dict[str, str]: ...

    def warnings(self, estimate: Any) -> list[str]: ...


class Reader(Protocol):
    """An engine's existing config read back into a layout (its package's ``read`` module),
    a CaseError naming the file and key where it contradicts the case. ``options`` are the facts the
    config leaves out that the caller gives (:attr:`Engine.reader_options`)."""

    def read(self, path: Path, case: Any, **options: Any) -> Any: ...


@dataclass(frozen=True)
class Engine:
    """An engine: its choices, its behaviour, its rules, and where its emitter and reader live."""

    name: str
    support: EngineSupport
    behaviour: EngineBehaviour
    # Rules of the engine's own code beyond the choices above: (layout or training key, reason)
    # for each the job breaks.
    rules: Callable[[Job], list[tuple[str, str]]] = field(default=lambda job: [])
    emitter: Optional[str] = None  # the module that writes its launch config (:class:`Emitter`)
    # Rules on the training section and the GPU alone, which no layout can meet: `plan` refuses
    # the case with them before it searches.
    training_rules: Callable[[TrainingSpec, GPUSpec], list[tuple[str, str]]] = \
        field(default=lambda training, gpu: [])
    # Rules on the model alone (what the engine's model code cannot build or route), likewise.
    model_rules: Callable[[ModelSpec], list[tuple[str, str]]] = field(default=lambda model: [])
    # Rules on the training and the model together, which no layout can meet either.
    case_rules: Callable[[TrainingSpec, ModelSpec], list[tuple[str, str]]] = \
        field(default=lambda training, model: [])
    # The module that reads its configs back (:class:`Reader`), and the options
    # its ``read`` takes (what its configs leave out: a ds_config.json has no pipeline degree).
    reader: Optional[str] = None
    reader_options: tuple[str, ...] = ()
    title: str = ""  # how a report names it to a person: "Megatron-LM" (``name`` is what a case writes)

    def emit_module(self) -> Emitter:
        """The engine's emitter, imported when first needed (planning needs none)."""
        if self.emitter is None:
            raise ValueError(f"{self.name} writes no launch files")
        return importlib.import_module(self.emitter)

    def reader_module(self) -> Reader:
        """The engine's config reader, imported when first needed."""
        if self.reader is None:
            raise ValueError(f"{self.name}'s configs are not read back")
        return importlib.import_module(self.reader)

    def other_loss(self, job: Job) -> Optional[tuple[str, float]]:
        """Where a case may name the loss (``support.losses``: DeepSpeed runs the user's train.py), the one
        ``job`` was not priced with and the bytes it adds to the job's peak stage (less than nothing where
        it holds less): the same memory model with the job's training naming it. None where the engine's
        loss is its own."""
        others = [loss for loss in self.support.losses if loss != job.training.loss_name]
        if len(others) != 1:
            return None
        priced = peak_stage_memory(job).total
        return others[0], peak_stage_memory(replace(job, training=replace(job.training, loss=others[0]))).total - priced

    def problems(self, job: Job) -> list[tuple[str, str]]:
        """(key, reason) for everything in ``job`` this engine cannot run; [] if it can."""
        lay, training = job.layout, job.training
        out = [(f"layout.{key}", why) for key, why in self.support.refusals(
            lay.tp, lay.pp, lay.cp, lay.vpp, lay.zero_stage, lay.sequence_parallel, lay.recompute)
            + self.support.offload_refusals(lay.offload_optimizer, lay.offload_params, lay.offload_activations,
                                            lay.zero_stage)]
        if job.model.is_moe:
            out += [(f"layout.{key}", why) for key, why in self.support.expert_refusals(lay.tp, lay.ep, lay.expert_tp)]
        if lay.recompute_num_layers is not None and lay.recompute_num_layers < max(job.stage_layers) \
                and not self.support.partial_recompute:
            out.append(("layout.recompute_num_layers",
                        self.support.reason("partial_recompute", "recomputes every layer of a stage or none")))
        if lay.recompute_modules is not None and not self.support.recompute_modules:
            out.append(("layout.recompute_modules", self.support.modules_refusal("a layout")))
        if training.moe_comm_overlap and not self.support.moe_comm_overlap:
            out.append(("training.moe_comm_overlap", self.support.reason(
                "moe_comm_overlap", "cannot overlap expert-parallel dispatch and combine with compute")))
        if training.tp_comm_overlap and lay.tp > 1 and not self.support.tp_comm_overlap:
            out.append(("training.tp_comm_overlap", self.support.reason(
                "tp_comm_overlap", "cannot overlap tensor-parallel collectives with GEMMs")))
        return out + self.training_problems(training, job.cluster.gpu, job.model) + list(self.rules(job))

    def training_problems(self, training: TrainingSpec, gpu: GPUSpec,
                          model: Optional[ModelSpec] = None) -> list[tuple[str, str]]:
        """(key, reason) for what in the training section (and ``model``) no layout on ``gpu`` can meet."""
        dispatch = dispatch_refusal(training, model, gpu) if model is not None else None
        return self.support.recipe_refusals(training) + list(self.training_rules(training, gpu)) \
            + (list(self.model_rules(model)) + list(self.case_rules(training, model)) if model is not None else []) \
            + ([("training.expert_dispatch", dispatch)] if dispatch else [])

    def refuse_unrunnable(self, job: Job) -> None:
        """Raise the CaseError an emitter answers with for the first thing in ``job`` this engine
        cannot run (:meth:`refusal`), pointing at planning for it."""
        refusal = self.refusal(job)
        if refusal:
            raise CaseError("--emit", self.name, f"{refusal}; plan with --engine {self.name}")

    def refusal(self, job: Job) -> Optional[str]:
        """The first problem as one line (``layout.cp is 2: ...``), or None if the engine runs ``job``."""
        for key, why in self.problems(job):
            section, _, name = key.partition(".")
            owner = {"layout": job.layout, "training": job.training, "model": job.model}.get(section)
            value = getattr(owner, name, None)
            if isinstance(value, tuple):
                value = list(value)
            shown = value.name if hasattr(value, "name") else value
            return f"{key} is {shown}: {why}" if value is not None else f"{key}: {why}"
        return None

