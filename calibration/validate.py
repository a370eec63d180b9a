"""Predicted against measured: one case's layout through the cost models and through real training steps.

`layout-planner validate CASE.yaml --profile PROFILE.yaml` and ``bench/validate_loop.py``
call :func:`validate`. The prediction is :func:`planner.estimate` of the case with its
GPU taken from the profile; the measurement is :func:`calibration.train.launch`.

Activations are compared as the bytes one micro-batch's forward saves for backward:
the model's activation term of the (only) stage, less, under full recomputation, the
one layer's worth it adds for the layer being recomputed in backward — live only
during backward, so no forward saves it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Union

from cost_models.behaviour import EngineBehaviour
from cost_models.memory import stage_activation_bytes
from cost_models.specs import Job
from planner.errors import CaseError
from planner.estimate import Estimate, estimate

from .speed import Speed, profiled_speed, reference_gemm_tflops, unchecked_reason
from .train import Measurement, RunSpec, Unsupported, launch, run_spec

# The repo's own GPT (calibration/gpt.py) as `layout-planner validate` trains it: PyTorch DDP
# or FSDP2, Megatron-style selective recomputation (the attention core), SwiGLU that keeps
# only its 2f input, eager cross-entropy, collectives issued from plain torch.distributed with
# no host cost worth timing at its sizes, the layers split evenly, DDP reducing the gradients
# in place (gradient_as_bucket_view, ``train.py``). Not an engine a case names.
REFERENCE = EngineBehaviour(name="reference", selective="attention", fused_elementwise=True,
                            collective_launch_s=0.0, balance_stages=False, gradient_bucket_copy=False)


# The training run's watchdog: no progress for this many predicted steps, and never less than
# the floor (start-up, the first CUDA step's kernel selection), is a hang.
STALL_STEPS = 20
STALL_FLOOR_S = 120.0


def reference_engine(spec: RunSpec) -> EngineBehaviour:
    """The loop as it runs ``spec``: DDP in bf16 autocasts its GEMMs over fp32 weights, keeping
    the residual stream and the norms in fp32; FSDP2's bf16 policy computes all in bf16."""
    return replace(REFERENCE, fp32_residual=spec.precision == "bf16" and spec.zero_stage != 3)


class DoesNotFit(Exception):
    """The case's layout does not fit in the profiled memory: one line; nothing was run."""


@dataclass(frozen=True)
class Validation:
    estimate: Estimate
    spec: RunSpec
    measurement: Measurement
    profile: Optional[str]
    # Share of the machine's CPU time other processes used just before the run (host.other_cpu_share).
    other_cpu_share: Optional[float] = None
    # On GPUs, what others used of them just before the run (host.gpu_use).
    gpu_use: Optional[dict[str, float]] = None
    # On CPUs, the reference GEMM's speed when profiled and around the run (speed.Speed).
    speed: Optional[Speed] = None
    # On CPUs, why that speed was not checked: the profile records none (speed.unchecked_reason).
    speed_not_checked: Optional[str] = None

    @property
    def predicted_step_s(self) -> float:
        return self.estimate.step_time_s

    @property
    def measured_step_s(self) -> float:
        return self.measurement.step_time_s

    @property
    def step_ratio(self) -> float:
        """Predicted over measured step time."""
        return self.predicted_step_s / self.measured_step_s

    @property
    def predicted_activation_bytes(self) -> float:
        return forward_activation_bytes(self.estimate.job)

    @property
    def activation_ratio(self) -> float:
        return self.predicted_activation_bytes / self.measurement.activation_bytes

    @property
    def predicted_allocated_bytes(self) -> float:
        """What the allocator holds at the peak: model states and activations of the heaviest
        stage (the CUDA context, NCCL buffers and fragmentation are outside
        ``torch.cuda.max_memory_allocated``)."""
        peak = self.estimate.peak
        return peak.parameters + peak.gradients + peak.optimizer_states + peak.activations

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.estimate.case.source,
            "profile": self.profile,
            "gpu": self.estimate.job.cluster.gpu.name,
            "host": {"other_cpu_share": self.other_cpu_share, "gpu_use": self.gpu_use,
                     "reference_gemm_tflops": self.speed.to_dict() if self.speed else None,
                     "speed_not_checked": self.speed_not_checked},
            "run": {"dp": self.spec.dp, "micro_batch_size": self.spec.micro_batch_size,
                    "grad_accum": self.spec.grad_accum, "zero_stage": self.spec.zero_stage,
                    "recompute": self.spec.config["recompute"], "attention": self.spec.config["attention"],
                    "threads_per_rank": self.spec.threads, "steps": self.spec.steps, "warmup": self.spec.warmup},
            "step_time_s": {"predicted": self.predicted_step_s, "measured": self.measured_step_s,
                            "ratio": self.step_ratio},
            "activation_bytes": {"predicted": self.predicted_activation_bytes,
                                 "measured": self.measurement.activation_bytes, "ratio": self.activation_ratio},
            "peak_allocated_bytes": None if self.measurement.peak_memory_bytes is None else {
                "predicted": self.predicted_allocated_bytes, "measured": self.measurement.peak_memory_bytes,
                "ratio": self.predicted_allocated_bytes / self.measurement.peak_memory_bytes},
            "predicted_by_part": self.estimate.time.by_part(),
            "measurement": self.measurement.to_dict(),
        }


def forward_activation_bytes(job: Job) -> float:
    """The model's activations of one micro-batch as its forward saves them (pp = 1): the
    stage's peak less what exists only in backward (a recomputed layer's working set, the
    loss's gradients)."""
    if job.layout.pp != 1:
        raise ValueError("forward_activation_bytes: only for pp = 1")
    return stage_activation_bytes(job, 0, forward_only=True)


def load_with_profile(case: Union[str, Path, dict], profile: Optional[Union[str, Path]]):
    """Load ``case``; with ``profile``, its GPU is the profile's (``cluster.profile``), whatever the case says."""
    from planner.case import build_case, load_case
    from planner.fields import describe
    from planner.inputs import read_yaml

    if profile is None:
        return load_case(case)
    profile = Path(profile)
    if not profile.exists():
        raise CaseError(str(profile), "--profile", "profile not found")
    if not profile.is_file():  # a folder (an empty --profile is the working directory), a pipe, a device
        raise CaseError(str(profile), "--profile", "expected a profile file (YAML), got a directory"
                        if profile.is_dir() else "expected a profile file (YAML), got no regular file")
    # Read here, so that a profile that is no YAML, or YAML but no mapping (a string, nothing, a list), is said
    # of the --profile file given, not of the case's cluster.profile key the case file never wrote (which the
    # profile is put under below).
    if not isinstance(read := read_yaml(profile), dict):
        raise CaseError(str(profile), "--profile", f"expected a mapping (a hardware profile), got {describe(read)}")
    if isinstance(case, dict):
        data, source, base = dict(case), "<case>", Path.cwd()
    else:
        path = Path(case)
        data, source, base = read_yaml(path), str(path), path.parent
        if not isinstance(data, dict):
            return load_case(path)  # reports the malformed file
    cluster = data.get("cluster")
    if isinstance(cluster, dict):
        cluster = {k: v for k, v in cluster.items() if k != "gpu"}
        cluster["profile"] = str(profile.resolve())
        data["cluster"] = cluster
    return build_case(data, source, base)


def profile_in_use(case: Union[str, Path, dict], profile: Optional[Union[str, Path]]) -> Optional[Path]:
    """The profile in use: ``--profile``, else the case's ``cluster.profile`` (beside the case file),
    or None without one."""
    from planner.inputs import read_yaml

    if profile is not None:
        return Path(profile)
    data = case if isinstance(case, dict) else read_yaml(Path(case))
    cluster = data.get("cluster") if isinstance(data, dict) else None
    if not isinstance(cluster, dict) or not isinstance(cluster.get("profile"), str):
        return None
    path = Path(cluster["profile"])
    return Path(case).parent / path if not path.is_absolute() and not isinstance(case, dict) else path


def given_inline(case: Union[str, Path, dict]) -> bool:
    """Whether the case gives its ``cluster.profile`` as the profile's contents, not a file's path."""
    from planner.inputs import read_yaml

    data = case if isinstance(case, dict) else read_yaml(Path(case))
    cluster = data.get("cluster") if isinstance(data, dict) else None
    return isinstance(cluster, dict) and isinstance(cluster.get("profile"), dict)


def profiled_machine(case: Union[str, Path, dict], profile: Optional[Union[str, Path]]) -> dict:
    """The ``machine`` section of the profile in use (:func:`profile_in_use`), or {} without one."""
    from planner.inputs import read_yaml

    profile = profile_in_use(case, profile)
    if profile is None:
        return {}
    from planner.case_cluster import read_machine

    data = read_yaml(Path(profile))
    return read_machine(str(profile), data.get("machine")) if isinstance(data, dict) else {}


def _threads(machine: dict) -> Optional[int]:
    threads = machine.get("threads_per_rank")
    return threads if isinstance(threads, int) and not isinstance(threads, bool) and threads > 0 else None


def _device(machine: dict) -> str:
    return "cuda" if machine.get("backend") == "nccl" else "cpu"


def profiled_threads(case: Union[str, Path, dict], profile: Optional[Union[str, Path]]) -> Optional[int]:
    """``machine.threads_per_rank`` of the profile in use, or None: the threads one profiled "GPU" had."""
    return _threads(profiled_machine(case, profile))


def profiled_device(case: Union[str, Path, dict], profile: Optional[Union[str, Path]]) -> str:
    """"cuda" when the profile in use was measured with NCCL (on GPUs), else "cpu"."""
    return _device(profiled_machine(case, profile))


def validate(case: Union[str, Path, dict], profile: Optional[Union[str, Path]] = None, *, steps: int = 5,
             warmup: int = 2, timeout_s: float = 600.0, warn: Callable[[str], None] = lambda _: None,
             allow_quick: bool = False, allow_busy: bool = False, stall_s: Optional[float] = None,
             progress: Callable[[str], None] = lambda _: None) -> Validation:
    """Predict the case's step time and activations, run the layout for real, and return both.

    Raises :class:`CaseError` for bad input and for layouts the CPU loop cannot run,
    :class:`DoesNotFit` for one that does not fit in the profiled memory,
    :class:`calibration.supervisor.RunFailed` naming the rank when the run fails or times out.
    Just before the run starts, ``warn`` gets each reason the measurement may not compare with
    the profile.
    A ``calibrate --quick`` profile (tiny shapes, few repeats) is refused unless ``allow_quick``.
    ``progress`` gets a line before the run starts: what runs, and how long it may take. A
    machine whose other processes keep it busy (:func:`host.busy_reason`; on GPUs,
    :func:`host.gpu_busy_reason`), or a CPU that runs the reference GEMM slower than when it was
    profiled (:mod:`calibration.speed`), is refused, or with ``allow_busy`` warned about; what was
    measured is in the result, with the reference GEMM timed again after the run. A CPU profile that records
    no reference GEMM (``machine.reference_gemm_tflops``) leaves the speed unchecked: ``warn`` gets why, and
    so does the result (``speed_not_checked``). A rank that makes no
    progress for ``stall_s`` (default: 20 predicted steps, at least two minutes) is taken for
    hung and the run stopped, naming it, without waiting for ``timeout_s``.
    """
    from planner.case import collectives_not_timed, spec_errors
    from planner.fields import check_option
    from planner.inputs import read_yaml
    from planner.limits import MAX_RUN_STEPS, MAX_TIMEOUT_S

    check_option("--steps", steps, 1, MAX_RUN_STEPS, "a number of steps")
    check_option("--warmup", warmup, 0, MAX_RUN_STEPS, "a number of steps")
    check_option("--timeout", timeout_s, 1, MAX_TIMEOUT_S, "seconds")

    from .host import (busy_reason, cpu_model, device_mismatch, gpu_busy_reason, gpu_use, local_gpu, local_gpu_count,
                       measuring_anyway, other_cpu_share)

    loaded = load_with_profile(case, profile)
    machine = profiled_machine(case, profile)  # the profile is read once; what follows derives from it
    # Where the profile was named: --profile, else the case's cluster.profile.
    named: tuple[str, str] = (str(profile), "--profile") if profile is not None else (loaded.source, "cluster.profile")
    in_use = profile_in_use(case, profile)
    if in_use is None and given_inline(case):
        # A case may give its profile's contents (the API's calibrate_from_runs hands one on): validate
        # records the file its prediction came from, and a profile fitted to runs it refuses below anyway.
        raise CaseError(*named, "is given inline: validate compares this machine with the profile file `calibrate` "
                                "wrote here, which it records; give its path (or --profile)")
    if not machine or in_use is None:  # both or neither: a machine section is read from the profile in use
        # A preset (or hand-written) GPU describes another machine: its prediction and a run here
        # do not compare (an H100's 0.0007 s against a CPU's 8 s).
        raise CaseError(*named, "validate runs the layout on this machine, so it needs "
                                "the profile `calibrate` measured here (--profile, or "
                                "cluster.profile in the case)")
    if "source" in machine and "backend" not in machine:
        # Fitted to runs (calibrate --from-runs, --from-logs: planner.learn names their files as the
        # machine's source): figures of the cluster those runs used, not timings of this machine's kernels.
        raise CaseError(*named, "was not measured on this machine by `calibrate` (a "
                                "profile fitted to runs describes their cluster): "
                                "calibrate here, and validate with that profile")
    if machine.get("quick") is True and not allow_quick:
        raise CaseError(*named, "is a `calibrate --quick` profile (tiny shapes and few "
                                "repeats: a smoke test, whose figures do not describe "
                                "this machine); calibrate without --quick, or pass "
                                "--allow-quick")
    device = _device(machine)
    # Every profile `calibrate` writes names the CPU model (and on GPUs the GPU model) it ran on. One that
    # does not cannot be told from a profile of another machine, whose ratio would be read as the model's.
    recorded = "gpu" if device == "cuda" else "cpu"
    if not isinstance(machine.get(recorded), str):
        raise CaseError(str(in_use), f"machine.{recorded}",
                        f"missing: expected the {recorded.upper()} model the profile was measured on, as `calibrate` "
                        "records it, which validate checks against this machine's; calibrate here")
    other = device_mismatch(machine, cpu_model(), device, local_gpu() if device == "cuda" else None)
    if other:
        raise CaseError(*named, other)
    ranks = loaded.layout.dp if loaded.layout is not None else 1  # no layout: run_spec names it below
    if ranks > 1 and collectives_not_timed(read_yaml(in_use)):
        # Its link bandwidths are the copy bandwidth, a placeholder: the prediction's all-reduce would run
        # at memory speed (39 GB/s where two gloo ranks measure 1.3), and its ratio read as the model's.
        # Asked before run_spec: `calibrate --nproc 1` gives its rank every core, so the ranks' threads
        # would be refused first, naming the case's layout.dp, where the profile is what cannot serve.
        raise CaseError(*named, f"was measured with one rank, which times no collective, and the layout runs "
                                f"{ranks} ranks: calibrate with --nproc {ranks} or more, and validate with that profile")
    try:
        spec = run_spec(loaded.job(), steps=steps, warmup=warmup, threads=_threads(machine), device=device)
    except Unsupported as error:
        raise CaseError(loaded.source, error.key, error.message) from None
    if spec.device == "cuda":
        if spec.dp > local_gpu_count():  # one GPU per rank: caught here, not as a rank's crash
            raise CaseError(loaded.source, "layout.dp", f"{spec.dp} ranks need {spec.dp} GPUs, one each, and this "
                                                        f"machine has {local_gpu_count()}")
    if spec.precision == "bf16" and loaded.training.fp32_grads is None:
        # The loop keeps fp32 master weights and gradients under bf16: predict that run.
        loaded = replace(loaded, training=replace(loaded.training, fp32_grads=True))
    # What runs is the repo's own GPT, whatever engine the case names: predict it as it runs. Its
    # selective recomputation checkpoints the attention core, flash attention or not (gpt.py).
    loaded = replace(loaded, training=replace(loaded.training, engine=reference_engine(spec)))
    if loaded.layout.recompute == "selective":
        loaded = replace(loaded, layout=loaded.layout.with_changes(recompute_modules=("core_attn",)))
    with spec_errors(loaded.source):  # e.g. a profile without a figure for the precision
        est = estimate(loaded)
    if not est.fits:  # the ranks would only die out of memory, or swap for hours
        # Said against the limit the peak was held to (the capacity less the headroom and what lives outside the
        # allocator, over the memory band's low end), not the capacity: "does not fit in 1.3 GB (peak 0.5 GB)".
        raise DoesNotFit(f"{loaded.source}: layout: does not fit: peak {est.peak.total / 1e9:.1f} GB, above the "
                         f"{est.fit_limit_bytes / 1e9:.1f} GB a peak may reach of the profile's "
                         f"{est.capacity_bytes / 1e9:.1f} GB less {est.outside_allocator[1] / 1e9:.2f} GB for "
                         f"{est.outside_allocator[0]} ({est.largest_term} the largest term); nothing run")
    others = other_cpu_share()
    used = gpu_use(spec.dp) if spec.device == "cuda" else None
    profiled = profiled_speed(machine) if spec.device == "cpu" else None
    speed = Speed(profiled, reference_gemm_tflops(spec.threads)) if profiled else None
    # A CPU profile with no reference GEMM to compare with: the check below cannot run, and is said not to have.
    not_checked = unchecked_reason(str(in_use), machine) if spec.device == "cpu" else None
    slower = speed.slower_reason() if speed else None
    for reason in (busy_reason(others), gpu_busy_reason(used),
                   slower and f"{slower}: timings taken now describe a slower machine; wait, or calibrate again, or "
                              "pass --allow-busy to measure anyway"):
        if reason and not allow_busy:
            raise CaseError(loaded.source, "host", reason)
        if reason:
            warn(measuring_anyway(reason))
    # The prediction is the profile's: one measured on a busy or moving machine predicts neither machine,
    # and its profiled speed (the mean of a reference GEMM that moved) is no speed the machine had.
    from planner.case import measured_while_disturbed

    for reason in measured_while_disturbed(str(profile_in_use(case, profile)), machine):
        warn(reason)
    if not_checked:
        warn(not_checked)
    progress(f"validate: predicted {est.step_time_s:.3g} s a step; running {spec.warmup} warm-up and {spec.steps} "
             f"timed steps on {spec.dp} rank{'s' if spec.dp > 1 else ''} ({spec.device}), stopped after "
             f"{timeout_s:.0f} s at most")
    if stall_s is None:  # a step may take many times its prediction, never minutes with no progress at all
        stall_s = max(STALL_FLOOR_S, STALL_STEPS * est.step_time_s)
    measurement = launch(spec, timeout_s=timeout_s, stall_s=stall_s)
    if speed:
        speed = replace(speed, after=reference_gemm_tflops(spec.threads))
        if not slower and speed.slower_reason():
            warn(f"{speed.slower_reason()} after the run: the measured steps may describe a slower machine")
    used_profile = profile_in_use(case, profile)  # the case's own, where --profile is not given: recorded too
    return Validation(est, spec, measurement, str(used_profile) if used_profile is not None else None, others, used,
                      speed, not_checked)


def print_validation(result: Validation, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    from planner.report import describe_layout

    job, spec, m = result.estimate.job, result.spec, result.measurement
    console.print(f"[bold]{escape(job.model.name)}[/] on {job.cluster.num_gpus} × {escape(job.cluster.gpu.name)}"
                  + (f" (profile {escape(result.profile)})" if result.profile else "")
                  + f", global batch {job.training.global_batch_size} × {job.training.seq_len} tokens")
    console.print(describe_layout(result.estimate) + f"; {spec.threads} thread(s) per rank")
    table = Table(title="Predicted against measured")
    for column in ("", "predicted", "measured", "predicted / measured"):
        table.add_column(column, justify="right" if column else "left")
    table.add_row("step time (s)", f"{result.predicted_step_s:.4f}", f"{result.measured_step_s:.4f}",
                  f"{result.step_ratio:.3f}")
    mib = 2**20
    table.add_row("activations per micro-batch (MiB)", f"{result.predicted_activation_bytes / mib:.2f}",
                  f"{m.activation_bytes / mib:.2f}", f"{result.activation_ratio:.4f}")
    if m.peak_memory_bytes:
        table.add_row("peak allocated memory (MiB)", f"{result.predicted_allocated_bytes / mib:.1f}",
                      f"{m.peak_memory_bytes / mib:.1f}",
                      f"{result.predicted_allocated_bytes / m.peak_memory_bytes:.4f}")
    console.print(table)
    parts = ", ".join(f"{k.removesuffix('_s')} {v:.4f}" for k, v in result.estimate.time.by_part().items() if v)
    console.print(f"predicted by part (s): {parts}")
    console.print("predicted as this loop runs (the reference engine: plain PyTorch, eager kernels, selective "
                  "recomputation of the attention core), not as the case's engine: it can differ from `estimate`")
    console.print(f"measured: median of {len(m.step_times_s)} steps after {len(m.warmup_times_s)} warm-up "
                  f"(min {min(m.step_times_s):.4f}, max {max(m.step_times_s):.4f}); "
                  f"optimizer step median {m.optimizer_time_s:.4f} s")
    if result.speed:
        s = result.speed
        console.print(f"this machine's speed: reference GEMM {s.before:.3g} TFLOP/s before the run, "
                      f"{s.after:.3g} after, against {s.profiled:.3g} when profiled (ratio {s.ratio:.3f})")
    elif result.speed_not_checked:
        console.print(f"this machine's speed: not checked: {escape(result.speed_not_checked)}")
