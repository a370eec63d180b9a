"""Read `plan --emit megatron`'s files back through Megatron-LM's own argument handling: for generated
cases, plan, write the files as `plan --emit megatron` does, run the emitted launch.sh under bash with a
stand-in torchrun on PATH, which runs megatron/training/arguments.py's real parse_args (with the
extra_args_provider pretrain_gpt.py passes) and validate_args on the arguments launch.sh hands it, at the
world size its --nnodes and --nproc-per-node give; and compare what they resolved (parallel sizes,
micro and global batch, ZeRO through the distributed optimizer or Megatron FSDP, recomputation, stage
split, experts, offload, fp8, the overlaps) with the layout `plan --json` prints for the case.

    python bench/megatron_validate.py [MEGATRON_LM_GIT_DIR] [--cases N] [--seed S] [--ref core_vX.Y.Z ...]

MEGATRON_LM_GIT_DIR is a clone of NVIDIA/Megatron-LM (default: the mirror under /work/.mirror); the
releases are the --ref tags (default: core_v0.16.1, the megatron-core the tests install). megatron-core
ships no megatron/training, so each release's megatron/ and pretrain_gpt.py are taken into a temporary
directory, as bench/megatron_lm_flags.py takes them, with its stubs: megatron/training/__init__.py,
utils and global_vars (the whole training loop) replaced (utils keeping update_use_dist_ckpt's rule and
recording warn_rank_0's warnings), and the modules that import triton at their top by empty ones. What
needs a GPU is stood in: torch.cuda.get_device_capability answers the case's GPU's (validate_args's
Hopper and Blackwell rules), and Transformer Engine, not installed on CPU, is taken as 2.9. The data and
tokenizer arguments launch.sh leaves to the user are appended as its "$@" (--mock-data, NullTokenizer).
The validator's Python is forked, for each case, from one that has imported torch (and what
torch.compile loads) once per release (SERVER below); the release's megatron is imported in the fork.

Exit 0 where every case resolved as planned; 1 otherwise, each mismatch printed. ``--json`` prints the
per-case results."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from megatron_lm_flags import EXTRA, MIRROR  # noqa: E402
from megatron_lm_flags import extract as extract_release  # noqa: E402

DEFAULT_REFS = ["core_v0.16.1"]
USER_ARGS = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "32000", "--train-samples", "1000",
             "--mock-data"]
# Compute capability (major) of each GPU preset's family: validate_args branches on Hopper and Blackwell.
ARCH = {"v100": 7, "a100": 8, "h100": 9, "h200": 9, "h800": 9, "b200": 10, "b300": 10, "gb200": 10, "gb300": 10,
        "mi300x": 9, "mi325x": 9, "mi355x": 9}
UTILS_STUB = '''
import os
def get_device_arch_version(): return int(os.environ["FAKE_ARCH"])
def update_use_dist_ckpt(args):  # megatron/training/utils.py's rule
    args.use_dist_ckpt = args.ckpt_format != "torch"
def print_rank_0(*a, **k): pass
WARNINGS = []
def warn_rank_0(msg, *a, **k): WARNINGS.append(str(msg))
def is_rank0(): return True
'''
# torchrun as launch.sh calls it: the world from --nnodes x --nproc-per-node, the program and its arguments
# to the validator.
TORCHRUN = '''#!/usr/bin/env bash
nnodes=1; nproc=1
while [ $# -gt 0 ]; do
  case "$1" in
    --nnodes) nnodes="$2"; shift 2;;
    --nproc-per-node|--nproc_per_node) nproc="$2"; shift 2;;
    --*=*|--standalone) shift;;
    --*) shift 2;;
    *) break;;
  esac
done
[ -f "$1" ] || { echo "torchrun stand-in: no program $1" >&2; exit 2; }
program="$1"; shift
export WORLD_SIZE=$((nnodes * nproc))
[ -n "$VALIDATE_SERVER" ] && exec "$VALIDATE_PYTHON" "$VALIDATE_CLIENT" "$VALIDATE_SCRIPT" "$program" "$@"
exec "$VALIDATE_PYTHON" -W ignore "$VALIDATE_SCRIPT" "$program" "$@"
'''
# The validator's Python, as the stand-in torchrun would start it, but forked from one that has imported
# torch and what torch.compile loads (megatron's jit_fuser imports them: seconds a case, the same for every
# case): SERVER takes each stand-in's arguments, environment, folder and standard streams (CLIENT, a bare
# Python, sends them over a Unix socket) and runs the validator in a child forked for it, which imports the
# release's megatron afresh (nothing of megatron is imported before the fork); CLIENT exits with the
# child's status.
SERVER = '''
import json, os, selectors, socket, sys, traceback, typing, warnings
warnings.simplefilter("ignore")
typing.override = getattr(typing, "override", lambda f: f)
import torch, torch.distributed, torch.distributed.tensor, torch._dynamo, torch._inductor.compile_fx  # noqa
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen()
print("ready", flush=True)
# Its standard input is a pipe its starter holds and never writes: end of file there is the starter gone
# (killed by SIGTERM or SIGKILL, whose finally never ran), and the server goes too, its socket with it.
watch = selectors.DefaultSelector()
watch.register(listener, selectors.EVENT_READ)
watch.register(0, selectors.EVENT_READ)
while True:
    if any(key.fd == 0 for key, _ in watch.select()) and not os.read(0, 1):
        os.unlink(sys.argv[1])
        sys.exit(0)
    conn, _ = listener.accept()
    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not message.endswith(b"\\n"):
        more = conn.recv(1 << 20)
        if not more:
            break
        message += more
    request = json.loads(message)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        listener.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        sys.stdin, sys.stdout, sys.stderr = (open(i, mode, closefd=False) for i, mode in ((0, "r"), (1, "w"), (2, "w")))
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = request["argv"]
        code = 0
        try:
            exec(compile(open(sys.argv[0]).read(), sys.argv[0], "exec"), {"__name__": "__main__"})
        except SystemExit as error:
            code = error.code if isinstance(error.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    for fd in fds:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    conn.sendall(str(os.waitstatus_to_exitcode(status)).encode())
    conn.close()
'''
CLIENT = '''
import json, os, socket, sys
conn = socket.socket(socket.AF_UNIX)
conn.connect(os.environ["VALIDATE_SERVER"])
request = {"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}
socket.send_fds(conn, [json.dumps(request).encode() + b"\\n"], [0, 1, 2])
status = b""
while True:
    more = conn.recv(64)
    if not more:
        break
    status += more
sys.exit(int(status) if status else 1)
'''
# Run by the stand-in torchrun: parse_args and validate_args of the release in MEGATRON_LM, resolved
# fields to $VALIDATE_OUT.
VALIDATOR = '''
import json, os, sys, typing
sys.path.insert(0, os.environ["MEGATRON_LM"])
typing.override = getattr(typing, "override", lambda f: f)
program, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
import torch
torch.cuda.get_device_capability = lambda *a, **k: (int(os.environ["FAKE_ARCH"]), 0)
from packaging.version import Version
import megatron.core.utils as core_utils
core_utils.get_te_version = lambda: Version("2.9.0")
from megatron.training import arguments
if hasattr(arguments, "is_te_min_version"):
    arguments.is_te_min_version = lambda v, check_equality=True: Version("2.9.0") >= Version(v)
import megatron.core
assert megatron.core.__file__.startswith(os.environ["MEGATRON_LM"]), megatron.core.__file__
extra = None
if os.environ.get("EXTRA_MODULE"):
    import importlib
    extra = getattr(importlib.import_module(os.environ["EXTRA_MODULE"]), os.environ["EXTRA_FUNCTION"])
FIELDS = FIELDS_PLACEHOLDER
out = {"program": program}
try:
    args = arguments.parse_args(extra_args_provider=extra)
    arguments.validate_args(args, {"tokenizer_type": "NullTokenizer"})
    out.update({f: getattr(args, f, None) for f in FIELDS})
    from megatron.training.utils import WARNINGS
    out["warnings"] = WARNINGS
except SystemExit as error:
    out["error"] = f"SystemExit {error.code}"
except Exception as error:
    out["error"] = f"{type(error).__name__}: {error}"
json.dump(out, open(os.environ["VALIDATE_OUT"], "w"), default=str)
'''
FIELDS = ["tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
          "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size", "data_parallel_size",
          "micro_batch_size", "global_batch_size", "num_layers", "recompute_granularity", "recompute_method",
          "recompute_num_layers", "recompute_modules", "use_distributed_optimizer", "use_megatron_fsdp",
          "data_parallel_sharding_strategy", "sequence_parallel", "overlap_grad_reduce", "overlap_param_gather",
          "fp8", "fp8_param_gather", "fp4", "bf16", "fp16", "optimizer_cpu_offload", "optimizer_offload_fraction",
          "cpu_offloading", "cpu_offloading_num_layers", "tp_comm_overlap", "overlap_moe_expert_parallel_comm",
          "pipeline_model_parallel_layout", "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
          "num_experts", "seq_length", "use_precision_aware_optimizer", "exp_avg_dtype", "exp_avg_sq_dtype",
          "main_params_dtype"]

MODELS = ("llama3-8b", "llama3-70b", "llama2-7b", "llama2-13b", "mistral-7b", "qwen2.5-72b", "gpt-1.7b",
          "mixtral-8x7b", "deepseek-v2-lite", "qwen3-30b-a3b")
GPUS = ("a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "b200", "mi300x")
# Pins steer searches to pipelines (and interleaving), context parallelism, ZeRO stages, recomputation
# and offload; the rest are left to the search.
PINS = ({}, {}, {}, {"vpp": 2}, {"min_cp": 2}, {"zero_stage": 0}, {"zero_stage": 3}, {"recompute": "full"},
        {"recompute": "selective"}, {"offload_optimizer": 1}, {"min_ep": 4})


def generated_cases(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        gpu = rng.choice(GPUS)
        gpus = rng.choice((8, 16, 32, 64, 128))
        precisions = ("bf16", "bf16", "fp8") if gpu.startswith(("h", "b")) else ("bf16", "bf16", "fp16")
        pins = rng.choice(PINS)
        model = rng.choice(MODELS)
        if "min_ep" in pins and model not in ("mixtral-8x7b", "deepseek-v2-lite", "qwen3-30b-a3b"):
            pins = {}
        cases.append({"model": {"preset": model}, "cluster": {"gpu": gpu, "num_gpus": gpus},
                      "training": {"global_batch_size": gpus * rng.choice((1, 2, 4, 8)),
                                   "seq_len": rng.choice((2048, 4096, 8192)), "precision": rng.choice(precisions)},
                      "search": {"target": "megatron", **pins}})
    return cases


def extract(git_dir: str, ref: str, into: Path) -> tuple[str, str] | None:
    """The release's megatron/ and pretrain_gpt.py in `into`, stubbed as the docstring says; the
    extra_args_provider pretrain_gpt.py passes, as (module, function), or None."""
    extra = extract_release(git_dir, ref, into, UTILS_STUB, also=("pretrain_gpt.py",))
    return (EXTRA[extra], extra) if extra else None


def resolved_layout(m: dict) -> dict:
    """The layout keys of plan --json, from what parse_args and validate_args resolved."""
    if m["use_megatron_fsdp"]:
        zero = {"optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(m["data_parallel_sharding_strategy"], 0)
    else:
        zero = 1 if m["use_distributed_optimizer"] else 0
    got = {"dp": m["data_parallel_size"], "tp": m["tensor_model_parallel_size"], "pp": m["pipeline_model_parallel_size"],
           "cp": m["context_parallel_size"], "vpp": m["virtual_pipeline_model_parallel_size"] or 1,
           "micro_batch_size": m["micro_batch_size"], "zero_stage": zero, "sequence_parallel": m["sequence_parallel"],
           "recompute": m["recompute_granularity"] or "none",
           # --recompute-num-layers counts the layers of one model chunk (block method); the plan's, a stage's.
           "recompute_num_layers": (m["recompute_num_layers"] * (m["virtual_pipeline_model_parallel_size"] or 1)
                                    if m["recompute_method"] == "block" else None),
           "ep": m["expert_model_parallel_size"], "etp": m["expert_tensor_parallel_size"],
           "offload_optimizer": m["optimizer_offload_fraction"] if m["optimizer_cpu_offload"] else 0,
           "offload_activations": m["cpu_offloading_num_layers"] if m["cpu_offloading"] else 0,
           "recompute_modules": m["recompute_modules"]}
    first, last = m["decoder_first_pipeline_num_layers"], m["decoder_last_pipeline_num_layers"]
    if m["pipeline_model_parallel_layout"] is None and m["pipeline_model_parallel_size"] > 1:
        pp, layers = m["pipeline_model_parallel_size"], m["num_layers"]
        middle = pp - (first is not None) - (last is not None)
        rest = layers - (first or 0) - (last or 0)
        if middle == 0 or rest % middle == 0:
            got["stage_layers"] = ([first] if first is not None else []) + [rest // middle if middle else 0] * middle \
                + ([last] if last is not None else [])
    return got


def compare(case: dict, estimate, m: dict) -> list[str]:
    planned = estimate.to_dict()
    layout, job = planned["layout"], estimate.job
    got = resolved_layout(m)
    issues = []
    for key, value in got.items():
        if key not in layout:
            continue
        if key == "sequence_parallel" and layout["tp"] == 1:  # validate_args turns it off at tp 1
            continue
        if key == "recompute_modules" and layout.get("recompute") != "selective":
            continue
        if layout[key] != value:
            issues.append(f"{key}: planned {layout[key]!r}, Megatron-LM resolved {value!r}")
    if m["global_batch_size"] != case["training"]["global_batch_size"]:
        issues.append(f"global batch: case {case['training']['global_batch_size']}, resolved {m['global_batch_size']}")
    accumulation = m["global_batch_size"] // (m["micro_batch_size"] * m["data_parallel_size"])
    if accumulation != planned["grad_accum"]:
        issues.append(f"gradient accumulation: planned {planned['grad_accum']}, resolved {accumulation}")
    if m["seq_length"] != case["training"]["seq_len"]:
        issues.append(f"seq_length: case {case['training']['seq_len']}, resolved {m['seq_length']}")
    precision = job.training.precision
    if (m["fp8"] is not None) != (precision in ("fp8", "mxfp8")):
        issues.append(f"fp8: planned {precision}, resolved {m['fp8']}")
    if (m["fp4"] is not None) != (precision == "nvfp4"):
        issues.append(f"fp4: planned {precision}, resolved {m['fp4']}")
    if bool(m["bf16"]) != (precision in ("bf16", "fp8", "mxfp8", "nvfp4")) or bool(m["fp16"]) != (precision == "fp16"):
        issues.append(f"bf16/fp16: planned {precision}, resolved bf16 {m['bf16']} fp16 {m['fp16']}")
    if precision in ("fp8", "mxfp8") and bool(m["fp8_param_gather"]) != planned["training"]["fp8_param_gather"]:
        issues.append(f"fp8_param_gather: planned {planned['training']['fp8_param_gather']}, "
                      f"resolved {m['fp8_param_gather']}")
    # What the estimate credits: the data-parallel reduction (and the distributed optimizer's gathers)
    # hidden behind compute.
    if layout["dp"] > 1 and not m["overlap_grad_reduce"]:
        issues.append("overlap_grad_reduce: priced overlapped, resolved off")
    if layout["dp"] > 1 and layout["zero_stage"] >= 1 and not m["overlap_param_gather"]:
        issues.append("overlap_param_gather: priced overlapped, resolved off")
    if bool(m["tp_comm_overlap"]) != bool(job.training.tp_comm_overlap and layout["tp"] > 1):
        issues.append(f"tp_comm_overlap: planned {job.training.tp_comm_overlap}, resolved {m['tp_comm_overlap']}")
    # The optimizer's states as priced (model_states.state_bytes): the moments' dtype, and the precision-aware
    # optimizer (Transformer Engine's FusedAdam) wherever the master is kept as remainders or the moments in bf16.
    moments = job.training.optimizer_moments
    for field in ("exp_avg_dtype", "exp_avg_sq_dtype"):
        if m.get(field) is not None and str(m[field]) != f"torch.{'bfloat16' if moments == 'bf16' else 'float32'}":
            issues.append(f"{field}: planned {moments}, resolved {m[field]}")
    aware = moments == "bf16" or bool(job.training.master_remainders) or bool(layout.get("offload_optimizer"))
    if m.get("use_precision_aware_optimizer") is not None and bool(m["use_precision_aware_optimizer"]) != aware:
        issues.append(f"use_precision_aware_optimizer: planned {aware}, resolved {m['use_precision_aware_optimizer']}")
    if m.get("main_params_dtype") is not None and str(m["main_params_dtype"]) != "torch.float32":
        issues.append(f"main_params_dtype: priced an fp32 master, resolved {m['main_params_dtype']}")
    if job.model.is_moe and m["num_experts"] != job.model.num_experts:
        issues.append(f"num_experts: model {job.model.num_experts}, resolved {m['num_experts']}")
    return issues


def plan_of(case: dict):
    import planner

    try:
        return planner.plan(case, top_k=0).best
    except planner.CaseError:  # pins no Megatron-LM layout can meet
        return None


def check_case(case: dict, estimate, release: Path, extra, arch: int, work: Path) -> dict:
    """Emit the plan as `plan --emit megatron` does, run its launch.sh, compare."""
    from planner.configs import render

    files, _ = render(estimate, "megatron", "case.yaml")
    for name, text in files.items():
        (work / name).write_text(text)
    out = work / "resolved.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "NVTE_", "NCCL_"))}
    env.update(PATH=f"{release / 'bin'}:{os.environ['PATH']}", MEGATRON_LM=str(release), FAKE_ARCH=str(arch),
               VALIDATE_PYTHON=sys.executable, VALIDATE_SCRIPT=str(release / "validate.py"),
               VALIDATE_OUT=str(out), MASTER_ADDR="localhost", VALIDATE_SERVER=str(release / "validate.sock"),
               VALIDATE_CLIENT=str(release / "client.py"), EXTRA_MODULE=extra[0] if extra else "",
               EXTRA_FUNCTION=extra[1] if extra else "")
    done = subprocess.run(["bash", str(work / "launch.sh"), *USER_ARGS], env=env, cwd=work, capture_output=True,
                          text=True, timeout=600)
    if not out.exists():
        return {"issues": [f"launch.sh did not reach parse_args (exit {done.returncode}): {done.stderr[-800:]}"]}
    m = json.loads(out.read_text())
    if "error" in m:
        return {"issues": [f"parse_args/validate_args refused: {m['error']}"]}
    return {"issues": compare(case, estimate, m), "warnings": m["warnings"]}


def prepare(git_dir: str, ref: str, into: Path):
    extra = extract(git_dir, ref, into)
    (into / "bin").mkdir()
    (into / "bin" / "torchrun").write_text(TORCHRUN)
    (into / "bin" / "torchrun").chmod(0o755)
    (into / "validate.py").write_text(VALIDATOR.replace("FIELDS_PLACEHOLDER", repr(FIELDS)))
    return extra


def run(git_dir: str, refs: list[str], cases: list[dict]) -> list[dict]:
    results = []
    plans = [plan_of(case) for case in cases]
    with tempfile.TemporaryDirectory() as tmp:
        for ref in refs:
            release = Path(tmp) / ref
            release.mkdir()
            extra = prepare(git_dir, ref, release)
            server = start_server(release)
            try:
                results += run_release(ref, release, extra, cases, plans, Path(tmp))
            finally:
                server.kill()
                server.wait()
    return results


def start_server(release: Path) -> subprocess.Popen:
    """The release's validator server (SERVER), ready on release/validate.sock, and its client. Its
    standard input is a pipe this Python holds: where this Python dies without its finally (SIGTERM's
    default, SIGKILL), the server sees end of file there and exits, not left serving with torch imported."""
    (release / "server.py").write_text(SERVER)
    (release / "client.py").write_text(CLIENT)
    server = subprocess.Popen([sys.executable, str(release / "server.py"), str(release / "validate.sock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if server.stdout.readline().strip() != "ready":
        server.kill()
        server.wait()
        raise SystemExit(f"{release.name}: the validator's server did not start")
    return server


def run_release(ref: str, release: Path, extra, cases: list[dict], plans: list, tmp: Path) -> list[dict]:
    results = []
    for index, (case, estimate) in enumerate(zip(cases, plans)):
        if estimate is None:
            results.append({"ref": ref, "case": index, "skipped": "nothing fits or the pins are refused"})
            continue
        work = Path(tmp) / f"{ref}-case{index}"
        work.mkdir()
        arch = ARCH[case["cluster"]["gpu"].split("-")[0]]
        result = check_case(case, estimate, release, extra, arch, work)
        results.append({"ref": ref, "case": index, "layout": estimate.to_dict()["layout"],
                        "gpu": case["cluster"]["gpu"], "model": case["model"]["preset"], **result})
    return results


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("git_dir", nargs="?", default=os.environ.get("MEGATRON_LM_GIT_DIR", MIRROR))
    cli.add_argument("--cases", type=int, default=40)
    cli.add_argument("--seed", type=int, default=2026)
    cli.add_argument("--ref", action="append", help="a core_vX.Y.Z tag (repeatable; default core_v0.16.1)")
    cli.add_argument("--json", action="store_true")
    options = cli.parse_args(argv)
    refs = options.ref or DEFAULT_REFS
    results = run(options.git_dir, refs, generated_cases(options.cases, options.seed))
    checked = [r for r in results if "skipped" not in r]
    failed = [r for r in checked if r["issues"]]
    if options.json:
        print(json.dumps(results, indent=1, default=str))
    for r in failed:
        print(f"{r['ref']} case {r['case']} ({r['model']} on {r['gpu']}, {r['layout']}):")
        for issue in r["issues"]:
            print(f"    {issue}")
    print(f"{len(checked) - len(failed)} of {len(checked)} emitted cases resolved as planned "
          f"({len(results) - len(checked)} skipped: nothing fits) on {' '.join(refs)}", file=sys.stderr)
    return 1 if failed or not checked else 0


if __name__ == "__main__":
    sys.exit(main())
