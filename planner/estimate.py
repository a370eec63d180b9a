"""`estimate`: memory (and, where modelled, time) of one layout, and what to change when it does not fit."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional, Union

from cost_models.activations import selective_modules
from cost_models.topology import domains_spanned
from cost_models.memory import StageMemory, host_bytes, outside_allocator, peak_stage_memory, stage_memories
from cost_models.parameters import active_parameters, total_parameters
from cost_models.step_time import StepTime, model_flops_per_step, step_time
from cost_models.specs import Job, Layout, SpecError

from .api_values import CaseArg
from .bands import NO_BAND, Band, memory_band, throughput_band
from .case import LAYOUT_UNSET_TEXT, Case, layout_to_mapping, load_case, profile_warnings, spec_errors
from .engines import ENGINES
from .errors import CaseError
from .limits import MAX_STEP_TIME_S
# The memory limit every command holds a layout to, shared with the search; named here too.
from .search_memory import fit_limit, fits_with_margin, host_fits, usable_bytes
from .search_recompute import selective_bundles
from .units import whole_bytes


@dataclass(frozen=True)
class Remedy:
    """One change to a layout that does not fit, and what it would give."""

    # Compared by value, never hashed, as every result the API returns (docs/commands.md, Python API): most
    # hold dicts, which may change after hashing; hash() names the type rather than failing on a dict inside.
    __hash__ = None  # type: ignore[assignment]

    description: str
    # The job as changed: its layout, and the training it resolves to there (where the change is of the
    # training, fp8_param_gather, the layout is the job's own), which the case-file section needs.
    job: Job
    peak_bytes: float
    fits: bool
    # As Estimate.memory_verdict says it of the changed layout: "fits" (the band's upper end fits),
    # "at risk" or "does not fit".
    verdict: str = "does not fit"
    step_time_s: Optional[float] = None  # the changed layout's step, where it fits
    # The single changes it makes together, where no single one fits (:func:`combined_remedy`): each
    # one's description; empty for a single change.
    together: tuple[str, ...] = ()

    @property
    def layout(self) -> Layout:
        return self.job.layout

    def to_dict(self) -> dict[str, Any]:
        """What the report's "cheapest next change" line says, for `estimate --json` (a tool reading the
        JSON of a layout that does not fit was told nothing of what to change): the change as the line
        words it, the changes it makes together, the changed layout in the case-file schema (a change
        of the training, its fp8_param_gather, keeps the layout and is said in ``change``) and what the
        changed layout would give."""
        return {"change": self.description, "together": list(self.together),
                "layout": layout_section(self.job), "peak_bytes": whole_bytes(self.peak_bytes),
                "fits": self.fits, "memory_verdict": self.verdict, "step_time_s": self.step_time_s}


@dataclass(frozen=True)
class Estimate:
    # Compared by value, never hashed, as every result the API returns (docs/commands.md, Python API): most
    # hold dicts, which may change after hashing; hash() names the type rather than failing on a dict inside.
    __hash__ = None  # type: ignore[assignment]

    case: Case
    job: Job
    stages: tuple[StageMemory, ...]
    peak: StageMemory
    time: StepTime
    # Share of GPU memory a layout must leave free to fit (the case's search.headroom): the
    # same limit `estimate`, `diagnose` and `plan` hold every layout to.
    headroom: float = 0.0
    # What `estimate` says on stderr beside it (:func:`estimate_notes`: an engine left unset, priced as
    # plain PyTorch runs it; a mixture of experts' unstated routing; a seq_len past the hf_config's
    # max_position_embeddings), as Plan.notes and Sizing.notes carry
    # theirs: the API's `planner.estimate` fills it, an estimate inside a plan or a sizing leaves it empty
    # (theirs carry it). Beside the figures: not in to_dict (`estimate --json`), nor in equality.
    notes: tuple[str, ...] = field(default=(), compare=False)
    # What makes the case's hardware profile doubtful (``case.profile_warnings``: a quick calibration, a poor
    # fit, a busy machine, links one rank never measured), filled and kept as ``notes`` are.
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def layout(self) -> Layout:
        """The job's layout, as :attr:`Remedy.layout` gives the changed one: ``plan.best.layout`` is the
        plan's best, which goes back into a dict case's ``layout`` as its case-file section."""
        return self.job.layout

    @property
    def step_time_s(self) -> float:
        return self.time.total

    @property
    def tokens_per_s(self) -> float:
        return self.job.training.global_batch_size * self.job.training.seq_len / self.step_time_s

    @property
    def model_tflops_per_gpu(self) -> float:
        return model_flops_per_step(self.job) / self.step_time_s / self.job.cluster.num_gpus / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOP/s per GPU over the GPU's dense peak for the training precision."""
        return self.model_tflops_per_gpu * 1e12 / self.job.cluster.gpu.peak(self.job.training.precision)

    @property
    def mfu_bf16(self) -> Optional[float]:
        """Model FLOP/s per GPU over the bf16 dense peak, whatever the precision: an fp8 run's MFU
        against its own (twice as high) peak halves it, so runs compare on this one. None where
        the GPU (a CPU profile) has no bf16 figure."""
        try:
            return self.model_tflops_per_gpu * 1e12 / self.job.cluster.gpu.peak("bf16")
        except SpecError:
            return None

    @property
    def capacity_bytes(self) -> float:
        return self.job.cluster.gpu.memory_bytes

    @property
    def usable_bytes(self) -> float:
        return usable_bytes(self.job, self.headroom)

    @property
    def outside_allocator(self) -> tuple[str, float]:
        """What the rank holds beside the priced peak, by name, and its bytes (``memory.outside_allocator``):
        the CUDA context on a GPU, the process itself on a CPU."""
        return outside_allocator(self.job.cluster.gpu, self.job.overheads)

    @property
    def host_bytes(self) -> float:
        """Host memory the layout's offload takes per GPU (0 without offload)."""
        return host_bytes(self.job)

    @property
    def fit_limit_bytes(self) -> float:
        """The most the predicted peak may be and fit: usable memory over the memory band's low end."""
        return fit_limit(self.job, self.headroom)

    @property
    def fits(self) -> bool:
        """Whether the layout fits as far as the model can tell: unless even the low end of its
        memory band (``planner.bands``) overflows the usable memory, and what it offloads fits the host."""
        return self.overflows is None

    @property
    def memory_band(self) -> Optional[Band]:
        """None on CPUs, which no published run measured (``planner.bands``)."""
        return memory_band(self.job)

    @property
    def throughput_band(self) -> Optional[Band]:
        """None on CPUs, which no published run measured (``planner.bands``)."""
        return throughput_band(self.job)

    @property
    def tokens_per_s_band(self) -> Optional[tuple[float, float]]:
        """The 80 % band of the tokens/s, low end first: the prediction times the 10th and 90th
        percentiles of measured / predicted over published runs of its class (docs/robust-plans.md,
        ``planner.bands``); None where there is no band. `estimate`'s, `plan`'s and `size`'s, one formula."""
        band = self.throughput_band
        return None if band is None else (self.tokens_per_s * band.low, self.tokens_per_s * band.high)

    @property
    def memory_verdict(self) -> str:
        """"fits" (the band's upper end fits), "at risk" (the peak may or may not: the band straddles
        the usable memory) or "does not fit"."""
        return verdict_of(self.job, self.peak.total, self.fits, self.headroom)

    @property
    def outside_fitted_runs(self) -> list[str]:
        """Where the layout leaves what the runs behind a fitted profile covered (``planner.fitted``)."""
        from .fitted import outside

        return outside(self.case.fitted, self.job) if self.case.fitted else []

    @property
    def largest_term(self) -> str:
        terms = self.peak.by_term()
        return max(terms, key=lambda term: terms[term])

    @property
    def overflows(self) -> Optional[str]:
        """What does not fit: "gpu" (its peak, even at the band's low end), "host" (the GPU holds its
        peak but the offload overflows its share of host memory), or None where it fits."""
        if self.peak.total > self.fit_limit_bytes:
            return "gpu"
        return None if host_fits(self.job, self.headroom) else "host"

    def remedy(self) -> Optional[Remedy]:
        """The cheapest change that makes the layout fit: of those :func:`remedies` tries that fit, the
        one whose step is the shortest (a ZeRO stage can cost a quarter of what recomputing the MLPs
        of every layer does, and recomputing a few whole layers less than part of every one); where
        none fits, the fewest of them that fit together (:func:`combined_remedy`), else the one that comes
        closest. None if the layout fits."""
        if self.fits:
            return None
        # The host overflows while the GPU holds the peak: only offloading less frees host memory (a
        # deeper pipeline, say, shards nothing more of it), and what it moves back must fit the GPU.
        ladder = list(host_remedies(self.job, self.headroom) if self.overflows == "host"
                      else remedies(self.job, self.headroom))
        fastest = _fastest(ladder)
        if fastest is not None:
            return fastest
        if self.overflows != "host":
            # No single change fits: the fewest together that do (a ZeRO-2 Mixtral with its optimizer
            # offloaded was told "micro_batch_size 1", 96.8 GB of 87.0, as its cheapest next change).
            together = combined_remedy(self.job, self.headroom)
            if together is not None:
                return together
        return min(ladder, key=lambda r: r.peak_bytes) if ladder else None

    def layout_mapping(self) -> dict[str, Any]:
        """The layout as a case file gives it (:func:`layout_section`)."""
        return layout_section(self.job)

    def to_dict(self) -> dict[str, Any]:
        model = self.job.model
        band, mem = self.throughput_band, self.memory_band
        return {
            "model": {"parameters": total_parameters(model), "active_parameters": active_parameters(model)},
            "fits": self.fits,
            "memory_verdict": self.memory_verdict,
            "memory": {
                "peak_bytes": whole_bytes(self.peak.total),
                # the 80 % band: the peak times the 10th and 90th percentiles of measured / predicted
                # peaks of published runs of this class (planner/bands.py)
                "peak_band_bytes": None if mem is None else
                [whole_bytes(self.peak.total * b) for b in (mem.low, mem.high)],
                "band": None if mem is None else mem.to_dict(),
                "capacity_bytes": whole_bytes(self.capacity_bytes),
                "usable_bytes": whole_bytes(self.usable_bytes),
                # beside the allocator's peak: the CUDA context and NCCL's buffers on a GPU (``Overheads.cuda_context``),
                # the process itself on a CPU (``Overheads.cpu_process``), named by ``outside_allocator``
                "outside_allocator": self.outside_allocator[0],
                "outside_allocator_bytes": whole_bytes(self.outside_allocator[1]),
                "stage": self.peak.stage,
                "by_term": {term: whole_bytes(v) for term, v in self.peak.by_term().items()},
                "host_bytes": whole_bytes(self.host_bytes),
                "overflows": self.overflows,  # "gpu", "host" or None
            },
            "layout": self.layout_mapping(),
            # The engine that priced it and the training settings its defaults resolved at this layout,
            # in the case-file's keys, so that a tool passing the job on (to `estimate`, to a launcher)
            # gets what was priced: a plan that decided between engines names the one it picked.
            "training": {"engine": self.job.training.engine.name,
                         "fp8_param_gather": self.job.training.fp8_param_gather,
                         "master_remainders": self.job.training.master_remainders},
            # NVLink domains (nodes, or NVL72 racks) each parallel group spans: > 1 leaves it.
            "nvlink_domains_spanned": domains_spanned(self.job.cluster, self.job.layout),
            "grad_accum": self.job.grad_accum,
            "step_time_s": self.step_time_s,
            "step_time_band_s": None if band is None else [self.step_time_s / band.high, self.step_time_s / band.low],
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_band": None if band is None else list(self.tokens_per_s_band),
            "band": None if band is None else band.to_dict(),
            # Why the three above (and memory's band) are null: CPUs, which no published run measured.
            "no_band": NO_BAND if band is None else None,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "mfu_bf16": self.mfu_bf16,
            "time": self.time.by_part(),
            # Where a profile fitted to a team's runs is extrapolated (empty on presets).
            "outside_fitted_runs": self.outside_fitted_runs,
            # The text's cheapest next change (or the fewest together, or the closest), null where it fits,
            # with what each changed field takes where the engine's config has no key for it, as the text says.
            "cheapest_change": None if (remedy := self.remedy()) is None else
            {**remedy.to_dict(), "takes": change_takes(self.job, remedy.layout)},
        }


def layout_section(job: Job) -> dict[str, Any]:
    """``job``'s layout as a case file gives it, selective recomputation with the modules it runs
    named (``activations.selective_modules``) where the engine recomputes by module: what the
    emitted arguments say, and what a launcher or a later case can take as is. Every layout a JSON
    output prints is this one (the estimate's, its cheapest change, plan's advice where nothing fits):
    the bare ``layout_to_mapping`` gave nanotron's case the stage split it does not run, and a later case
    fed it was priced on another split, with a note that nanotron ignores it. The expert tensor parallel
    degree is stated where the experts are split (ep > 1), resolved where the layout leaves it to tp."""
    section = layout_to_mapping(job.layout)
    lay = job.layout
    if lay.ep > 1 and lay.etp is None:
        # The expert tensor parallel degree the experts run at, where the layout leaves it to its default
        # (tp): what the launch files state (Megatron-LM's --expert-tensor-parallel-size), beside ep.
        items = list(section.items())
        after_ep = list(section).index("ep") + 1
        section = dict(items[:after_ep] + [("etp", lay.expert_tp)] + items[after_ep:])
    if job.training.engine.splits_by_block_cost:
        # The split such an engine (nanotron) runs is its own, whatever the case stated: said as
        # the report says it, and which a later case may give back without a note.
        section.pop("chunk_layers", None)
        section.pop("stage_layers", None)
        if lay.pp > 1:
            section["stage_layers"] = list(job.stage_layers)
    if lay.recompute == "selective" and lay.recompute_modules is None \
            and job.training.engine.selective == "attention":
        modules = selective_modules(job.model, job.training, lay)
        if modules:  # none frees memory: nothing is recomputed, and no module list says that
            section["recompute_modules"] = list(modules)
    return section


def estimate_job(case: Case, job: Job, time: Optional[StepTime] = None) -> Estimate:
    """The estimate of ``job``; ``time``, where the search has already timed it, is not computed again."""
    # A figure the cost models need but the case lacks (a bf16 peak on an fp32-only
    # profile) surfaces here, as the case's error.
    refuse_what_the_engine_cannot_run(case, job)
    with spec_errors(case.source):
        stages = stage_memories(job)
        return Estimate(case=case, job=job, stages=stages, peak=max(stages, key=lambda m: m.total),
                        time=time or step_time(job), headroom=case.search.headroom)


def refuse_what_the_engine_cannot_run(case: Case, job: Job) -> None:
    """A layout the case's engine cannot run is the case's error, not a figure (planner/engines/)."""
    engine = ENGINES.get(job.training.engine.name)
    if engine is None:  # a behaviour no engine of planner/engines/ names: nothing to refuse it by
        return
    problems = engine.problems(job)
    if problems:
        key, why = problems[0]
        raise CaseError(case.source, key, f"{engine.name} cannot run it: {why}")


def check_step_time(source: str, seconds: float, parts: Optional[dict[str, float]] = None) -> None:
    """A step past MAX_STEP_TIME_S (116 days): the case's error, under `estimate` as under `plan`
    (whose solver holds step times in whole microseconds). Where the step's compute alone passes it,
    the job is the cause (a sequence of 2^24 tokens on 8 GPUs, say: "the GPU's figures" were blamed);
    else figures no hardware has (a bandwidth of a few bytes per second), named by the part they
    slow (``parts``: the step's exposed parts)."""
    if seconds <= MAX_STEP_TIME_S:
        return
    if parts and parts.get("compute_s", 0.0) + parts.get("recompute_s", 0.0) > MAX_STEP_TIME_S:
        raise CaseError(source, "training", f"its steps compute for {parts['compute_s'] + parts['recompute_s']:.3g} "
                                            f"s on these GPUs; expected a job (global_batch_size × seq_len tokens) "
                                            f"whose steps take under {MAX_STEP_TIME_S:g} s")
    slowest = f", {max(parts.values()):.3g} s of it {max(parts, key=lambda part: parts[part]).removesuffix('_s')}" if parts else ""
    raise CaseError(source, "cluster", f"the GPU's figures give steps of {seconds:.3g} s{slowest}; expected figures "
                                       f"that give steps under {MAX_STEP_TIME_S:g} s")


def estimate(case: Union[CaseArg, Case]) -> Estimate:
    """Python API: estimate the case's layout. ``case`` is a path or a dict in the case-file schema."""
    loaded = case if isinstance(case, Case) else load_case(case)
    result = estimate_job(loaded, loaded.job())
    if result.fits:  # a layout that does not fit is that, whatever its step (exit 3, not the case's error)
        check_step_time(loaded.source, result.step_time_s, result.time.by_part())  # "0 tokens/s", exit 0 otherwise
    if isinstance(case, Case):  # the planner's own callers (a fit's runs): nothing to tell
        return result
    return replace(result, notes=tuple(estimate_notes(case, loaded)), warnings=tuple(profile_warnings(case)))


def estimate_notes(case: Any, loaded: Case) -> list[str]:
    """What the CLI says on stderr beside an estimate (the API's caller reads the case it wrote): a
    mixture of experts priced with balanced routing where the case states no imbalance
    (``plan.unstated_routing``), a sequence past its hf_config's positions (``plan.past_positions``),
    a fabric other than the one a fitted profile's runs ran on (``fitted.other_fabric_notes``),
    a DeepSpeed loss left unstated (``plan.unstated_loss``), and a case that names no engine, which `estimate` prices as plain PyTorch runs it where `plan` decides between the engines it writes files for: the same layout
    copied from a plan's report prices otherwise unless the case names the plan's engine."""
    from .plan import case_notes, unstated_loss

    notes = list(case_notes(case, loaded)) + [note for note in (unstated_loss(loaded.source, loaded.job()),) if note]
    if loaded.training.engine.name == "any":  # neither training.engine nor search.target names one
        notes.append(f"{loaded.source}: training.engine is unset (or any): priced as plain PyTorch runs it (DDP buckets, "
                     "FSDP units, eager kernels); `plan` decides between Megatron-LM, DeepSpeed and torchtitan, so "
                     "to price a plan's layout as it runs, give the plan's engine (training.engine)")
    return notes


def change_takes(job: Job, layout: Layout) -> dict[str, str]:
    """What changing ``job``'s layout to ``layout`` takes, field by field, where its engine's config has no
    key for it (DeepSpeed's expert parallelism: the model's MoE blocks rebuilt as DeepSpeed-MoE's): the report
    says it beside the change, and `estimate --json`'s cheapest_change and `diagnose --json` carry it."""
    if job.training.engine.name != "deepspeed":
        return {}
    from .engines.deepspeed.read import change_takes as deepspeed_takes

    out = {}
    for key in ("ep", "etp", "pp", "stage_layers", "tp", "recompute"):
        old, new = getattr(job.layout, key, None), getattr(layout, key, None)
        if old != new:
            text = deepspeed_takes(key, new, layout)
            if text:
                out[key] = text
    return out


def verdict_of(job: Job, peak: float, fits: bool, headroom: float) -> str:
    """"fits" (the memory band's upper end fits), "at risk" (the band straddles the usable memory) or
    "does not fit", for a job whose peak is ``peak`` and which ``fits`` (at the band's low end)."""
    if not fits:
        return "does not fit"
    return "fits" if fits_with_margin(job, peak, headroom) else "at risk"


def _try(job: Job, headroom: float, description: str, **changes) -> Optional[Remedy]:
    """The change as the job's engine runs it, or None where it cannot: more tensor parallelism with
    sequence parallelism where the engine runs it only so (an MoE under Megatron-LM); the optimizer
    offloaded with the parameters where the engine offloads them together (torchtitan's
    training.enable_cpu_offload: the optimizer alone was refused, and the advice said nothing fits where
    the offload did); a ZeRO stage a pipeline refuses (DeepSpeed's above 1, Megatron-LM's distributed
    optimizer) is no remedy."""
    engine = ENGINES[job.training.engine.name]
    variants = [(description, changes)]
    if "tp" in changes and not job.layout.sequence_parallel:
        variants.append((f"{description} with sequence parallelism", {**changes, "sequence_parallel": True}))
    if changes.get("offload_optimizer") and engine.support.offload_together and not job.layout.offload_params:
        variants.append((f"{description}, with the parameters (training.enable_cpu_offload: both together)",
                         {**changes, "offload_params": True}))
    for shown, variant in variants:
        try:
            candidate = job.with_layout(job.layout.with_changes(**variant))
        except SpecError:
            continue
        if engine.problems(candidate):
            continue
        peak = peak_stage_memory(candidate).total
        fits = peak <= fit_limit(job, headroom) and host_fits(candidate, headroom)
        return Remedy(shown, candidate, peak, fits, verdict_of(candidate, peak, fits, headroom),
                      step_time(candidate).total if fits else None)
    return None


def _quantized_weights(job: Job, headroom: float) -> Optional[Remedy]:
    """The weights kept quantized (``training.fp8_param_gather``) where the engine keeps a quantized
    copy of each linear weight beside the 16-bit one (``memory.quantized_weight_copy_bytes``) and
    runs the gather so at this layout; None elsewhere. It costs no time: the gathers move half the
    bytes and the weights are quantized once a step either way."""
    training = job.training
    if training.recipe is None or training.fp8_param_gather or not training.engine.fp8_weight_cache:
        return None
    try:
        candidate = Job(job.model, job.cluster, replace(training, fp8_param_gather=True), job.layout, job.overheads)
    except SpecError:
        return None
    if ENGINES[training.engine.name].problems(candidate):
        return None
    peak = peak_stage_memory(candidate).total
    fits = peak <= fit_limit(job, headroom)
    return Remedy("training.fp8_param_gather: true (the weights kept quantized, no 16-bit copy beside them)",
                  candidate, peak, fits, verdict_of(candidate, peak, fits, headroom),
                  step_time(candidate).total if fits else None)


def _recompute_rungs(job: Job) -> list[tuple[str, dict]]:
    """More recomputation than the layout's, lightest first: selective at each module set the
    search scores (``search_recompute.selective_bundles``) heavier than the layout's, then full."""
    lay, rungs = job.layout, []
    if lay.recompute == "none" or (lay.recompute == "selective" and lay.recompute_modules is None):
        engine = ENGINES.get(job.training.engine.name)
        bundles = selective_bundles(job.model, job.training, engine.support) if engine else (None,)
        if lay.recompute == "selective":  # the layout runs the default set (None): only the heavier ones
            bundles = tuple(b for b in bundles if b is not None)
        for modules in bundles:
            name = "recompute selective" + (f" (recompute_modules: [{', '.join(modules)}])" if modules else "")
            rungs.append((name, {"recompute": "selective", "recompute_num_layers": None,
                                 "recompute_modules": modules}))
    if lay.recompute != "full":
        rungs.append(("recompute full", {"recompute": "full", "recompute_num_layers": None,
                                         "recompute_modules": None}))
    return rungs


def _fewest_full_layers(job: Job, headroom: float) -> Optional[Remedy]:
    """Full recomputation of the fewest layers per stage that fits, where the engine recomputes only
    some (Megatron's --recompute-num-layers, counted per model chunk: in steps of vpp), by bisection
    as the search finds them (``search_recompute.least_full_recompute``); None where none short of
    every layer fits, or the engine recomputes all or none."""
    lay = job.layout
    engine = ENGINES.get(job.training.engine.name)
    if engine is None or not engine.support.partial_recompute or "full" not in engine.support.recompute:
        return None
    if lay.recompute == "full" and lay.recompute_num_layers is None:
        return None  # every layer recomputed already
    stage_max, step = max(job.stage_layers), lay.vpp
    done = (lay.recompute_num_layers or 0) if lay.recompute == "full" else 0
    low, high = done // step + 1, stage_max // step - 1  # every layer is the ladder's "recompute full"
    best = None
    while low <= high:
        mid = (low + high) // 2
        layers = mid * step
        remedy = _try(job, headroom, f"recompute full of {layers} layers per stage (recompute_num_layers: {layers})",
                      recompute="full", recompute_num_layers=layers, recompute_modules=None)
        if remedy is None:
            return best
        if remedy.fits:
            best, high = remedy, mid - 1
        else:
            low = mid + 1
    return best


def host_remedies(job: Job, headroom: float = 0.0):
    """Changes that offload less, each keeping the global batch, for a layout whose offload
    overflows the host: the parameters kept on the GPU, then less of the optimizer on the host."""
    lay = job.layout
    if lay.offload_params:
        remedy = _try(job, headroom, "offload_params off (the parameters kept on the GPU)", offload_params=False)
        if remedy is not None:
            yield remedy
    for share in (0.75, 0.5, 0.25, 0.0):
        if share < lay.offload_optimizer:
            remedy = _try(job, headroom, f"offload_optimizer {share:g}", offload_optimizer=share)
            if remedy is not None:
                yield remedy


def remedies(job: Job, headroom: float = 0.0):
    """Changes to try, each keeping the global batch (:meth:`Estimate.remedy` takes the one of those that
    fit whose step is shortest):

    0. the weights kept quantized, where that drops a copy (:func:`_quantized_weights`);
    1. a smaller micro-batch with more accumulation;
    2. recomputation (selective by module set, full of the fewest layers that fit, full of all: every
       one that fits, their costs not in the order of the memory they free);
    3. a higher ZeRO stage;
    4. more tensor parallelism, inside one NVLink domain;
    5. more pipeline parallelism, across nodes;
    6. the optimizer offloaded to the host, alone and with full recomputation, where the engine
       runs it (DeepSpeed's ZeRO-Offload; what fits a 70B job on 8 GPUs at all);
    7. more expert parallelism for a mixture of experts (fewer experts on each GPU).
    Each yields the best single step of its kind (the smallest change that fits,
    else the strongest one available).
    """
    quantized = _quantized_weights(job, headroom)
    if quantized is not None:
        yield quantized
    for index, ladder in enumerate(_ladders(job)):
        tried = [r for r in (_try(job, headroom, d, **c) for d, c in ladder) if r is not None]
        if index == 1:  # recomputation: a few whole layers may cost less than part of every layer
            partial = _fewest_full_layers(job, headroom)
            tried += [partial] if partial is not None else []
        fitting = [r for r in tried if r.fits]
        if fitting:
            # The smallest change of its kind; of recomputation's, whose costs are not in the order
            # of the memory they free, each that fits.
            yield from (fitting if index == 1 else fitting[:1])
        elif tried:
            yield min(tried, key=lambda r: r.peak_bytes)


# The most single changes :func:`combined_remedy` makes together.
MAX_CHANGES_TOGETHER = 4


def combined_remedy(job: Job, headroom: float = 0.0) -> Optional[Remedy]:
    """Where no single change of :func:`remedies` fits: the fewest of them, each of another kind (a
    smaller micro-batch and recomputation, say), that fit together, of those the one whose step is
    shortest; None where no set of up to :data:`MAX_CHANGES_TOGETHER` fits."""
    from itertools import combinations, product

    lay = job.layout
    # Each kind's rungs; the optimizer offloaded with full recomputation is a pair of kinds already.
    kinds = [[(d, c) for d, c in ladder if not ("offload_optimizer" in c and "recompute" in c)]
             for ladder in _ladders(job)]
    kinds = [k for k in kinds if k]
    for size in range(2, MAX_CHANGES_TOGETHER + 1):
        fitting = []
        for chosen in combinations(kinds, size):
            for rungs in product(*chosen):
                changes: dict = {}
                for _, change in rungs:
                    changes.update(change)
                if "tp" in changes or "pp" in changes:  # the data-parallel ranks the rest leave
                    tp, pp = changes.get("tp", lay.tp), changes.get("pp", lay.pp)
                    if (lay.dp * lay.tp * lay.pp) % (tp * pp):
                        continue
                    changes["dp"] = lay.dp * lay.tp * lay.pp // (tp * pp)
                remedy = _try(job, headroom, "", **changes)
                if remedy is not None and remedy.fits:
                    # Said as the layout changes, together (each rung's own words count the
                    # accumulation and the data-parallel ranks of its change alone).
                    said = _changed_fields(lay, remedy.layout, job.training.global_batch_size)
                    # One entry a change, as many as were made: a rung that sets several fields
                    # (selective recomputation's level and module set) is one change, not two.
                    made = tuple(", ".join(c for c in said if c.split(" ", 1)[0] in change and
                                           c.split(" ", 1)[0] != "dp") for _, change in rungs)
                    fitting.append(replace(remedy, description=", ".join(said), together=made))
        fastest = _fastest(fitting)
        if fastest is not None:
            return fastest
    return None


def _fastest(remedies: list[Remedy]) -> Optional[Remedy]:
    """Of ``remedies``, the one that fits whose step is shortest (the first of equals), None where none fits.
    A remedy's step is priced exactly where it fits (:func:`_try`, :func:`_quantized_weights`: every remedy is
    made by one of them), so those that fit are those priced: the check below selects them and proves the
    step a number to compare."""
    priced = [(r.step_time_s, r) for r in remedies if r.fits and r.step_time_s is not None]
    return min(priced, key=lambda pair: pair[0])[1] if priced else None


def _changed_fields(before: Layout, after: Layout, global_batch: int) -> list[str]:
    """What ``after`` changes of ``before``, field by field (``zero_stage 2→3``), the accumulation steps
    where the micro-batch or the data-parallel ranks change."""
    said = []
    for name in ("micro_batch_size", "recompute", "recompute_num_layers", "recompute_modules", "zero_stage", "tp",
                 "sequence_parallel", "pp", "stage_layers", "dp", "ep", "etp", "offload_optimizer", "offload_params"):
        old, new = getattr(before, name), getattr(after, name)
        if old != new:
            shown = [LAYOUT_UNSET_TEXT.get(name, "none") if v is None else str(v).lower() if isinstance(v, bool) else
                     ",".join(map(str, v)) if isinstance(v, (tuple, list)) else v for v in (old, new)]
            said.append(f"{name} {shown[0]}→{shown[1]}")
    if (before.micro_batch_size, before.dp) != (after.micro_batch_size, after.dp):
        said.append(f"{global_batch // (after.micro_batch_size * after.dp)} accumulation steps")
    return said


def _expert_parallel_rungs(job: Job) -> list[tuple[str, dict]]:
    """More expert parallelism for a mixture of experts, where the engine runs it: each GPU holds
    fewer experts (what shards a DeepSpeed-MoE model's experts below ZeRO-3, which refuses them)."""
    lay, model = job.layout, job.model
    engine = ENGINES.get(job.training.engine.name)
    if not model.is_moe or engine is None or not engine.support.expert_parallel:
        return []
    return [(f"ep {e}", {"ep": e}) for e in (2 * lay.ep, 4 * lay.ep, 8 * lay.ep) if model.num_experts % e == 0]


def _ladders(job: Job) -> list[list[tuple[str, dict]]]:
    """The kinds of change :func:`remedies` tries, each its rungs, lightest first."""
    lay = job.layout
    gpu = job.cluster.gpu
    ladders: list[list[tuple[str, dict]]] = [
        [(f"micro_batch_size {m} with {job.training.global_batch_size // (m * lay.dp)} accumulation steps",
          {"micro_batch_size": m})
         for m in range(lay.micro_batch_size - 1, 0, -1) if lay.micro_batch_size % m == 0],
        _recompute_rungs(job),
        [(f"zero_stage {z}", {"zero_stage": z}) for z in range(lay.zero_stage + 1, 4)],
        [(f"tp {t} (dp {lay.dp * lay.tp // t})", {"tp": t, "dp": lay.dp * lay.tp // t})
         for t in (2 * lay.tp, 4 * lay.tp, 8 * lay.tp)
         if t <= min(gpu.nvlink_domain, job.cluster.num_gpus) and (lay.dp * lay.tp) % t == 0],
        [(f"pp {p} (dp {lay.dp * lay.pp // p})", {"pp": p, "dp": lay.dp * lay.pp // p, "stage_layers": None})
         for p in (2 * lay.pp, 4 * lay.pp, 8 * lay.pp) if (lay.dp * lay.pp) % p == 0],
        [(d, c) for d, c in (("offload_optimizer 1.0 (the optimizer stepped on the host)", {"offload_optimizer": 1.0}),
                             ("offload_optimizer 1.0 with recompute full",
                              {"offload_optimizer": 1.0, "recompute": "full", "recompute_num_layers": None,
                               "recompute_modules": None}))
         if lay.offload_optimizer < 1.0],
        _expert_parallel_rungs(job),
    ]
    return ladders
