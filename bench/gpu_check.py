"""One prepared check for a session that is lent a GPU: calibrate this machine, then validate a
few layouts on it, predicted against measured. Run through ``bench/gpu_check.sh``, which holds
it to 6 minutes so that it can be run again within a 15-minute loan.

    bench/gpu_check.sh [--quick] [--out DIR] [--profiles DIR] [--recompute none,selective,full]

Writes the profile to ``PROFILES/<device>.yaml`` (``calibration/profiles`` by default) and the
results to ``DIR/results.json`` and ``DIR/results.txt`` (``bench/out/gpu_check``). On one GPU
(NCCL, bf16) the layouts are the three recomputation modes of a 1.3B-class GPT slice; on a
CPU (gloo, fp32: how this script is tested) a small model, so that the whole path runs in
seconds. ``--quick`` calibrates with tiny shapes and times 2 steps after 1 warm-up (a smoke test of
the script, not a profile).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import yaml

from calibration.launch import calibrate
from calibration.validate import validate
from planner.errors import CaseError

ROOT = Path(__file__).resolve().parent.parent
RECOMPUTE = ("none", "selective", "full")
# What one layout is on each kind of device: a model large enough to fill an H200's GEMMs, and
# a CPU one that steps in well under a second on one thread.
GPU_CASE = {"model": {"name": "gpt-8L-2048", "num_layers": 8, "hidden_size": 2048, "num_attention_heads": 16,
                      "vocab_size": 32768, "activation": "gelu"},
            "training": {"precision": "bf16", "global_batch_size": 8, "seq_len": 2048}}
CPU_CASE = {"model": {"name": "gpt-2L-128", "num_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
                      "vocab_size": 512, "activation": "gelu"},
            "training": {"precision": "fp32", "global_batch_size": 4, "seq_len": 64}}


def device_name() -> tuple[str, bool]:
    """(a file-name form of this machine's device, whether it is a CUDA GPU)."""
    import torch

    cuda = torch.cuda.is_available()
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-"), cuda


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "gpu_check")
    parser.add_argument("--profiles", type=Path, default=ROOT / "calibration" / "profiles")
    parser.add_argument("--recompute", default=",".join(RECOMPUTE),
                        help="the recomputation modes to validate, comma-separated (default: all three)")
    args = parser.parse_args(argv)
    modes = [m for m in args.recompute.split(",") if m]
    if not modes or any(m not in RECOMPUTE for m in modes):
        print(f"error: --recompute: expected modes among {', '.join(RECOMPUTE)}, got {args.recompute!r}",
              file=sys.stderr)
        return 2
    name, cuda = device_name()
    args.out.mkdir(parents=True, exist_ok=True)
    args.profiles.mkdir(parents=True, exist_ok=True)
    profile = args.profiles / f"{name}{'-quick' if args.quick else ''}.yaml"
    started = time.monotonic()
    print(f"gpu_check: calibrating {name} into {profile}", flush=True)
    try:
        calibrate(profile, nproc=1, quick=args.quick, force=True, timeout=120.0, allow_busy=args.quick)
    except CaseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"gpu_check: calibrated in {time.monotonic() - started:.0f} s", flush=True)
    base = GPU_CASE if cuda else CPU_CASE
    results, lines = [], []
    for recompute in modes:
        case = {"model": dict(base["model"]), "cluster": {"profile": str(profile.resolve()), "num_gpus": 1},
                "training": dict(base["training"]),
                "layout": {"dp": 1, "micro_batch_size": 1, "recompute": recompute}}
        path = args.out / f"case-{recompute}.yaml"
        path.write_text(yaml.safe_dump(case))
        try:
            r = validate(path, steps=2 if args.quick else 5, warmup=1 if args.quick else 2, timeout_s=90.0, allow_quick=args.quick, allow_busy=args.quick,
                         warn=lambda line: print(f"warning: {line}", file=sys.stderr))
        except CaseError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        results.append({"recompute": recompute, **r.to_dict()})
        lines.append(f"{recompute:10} predicted {r.predicted_step_s:.4f} s  measured {r.measured_step_s:.4f} s  "
                     f"ratio {r.step_ratio:.3f}  activations ratio {r.activation_ratio:.3f}")
        print("gpu_check: " + lines[-1], flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    (args.out / "results.txt").write_text(f"{name} ({'quick ' if args.quick else ''}profile {profile})\n"
                                          + "\n".join(lines) + "\n")
    print(f"gpu_check: done in {time.monotonic() - started:.0f} s; results in {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
