"""Ctrl-C, SIGTERM and SIGHUP: exit code 130, 143 and 129 (128 + the signal, as a shell reports a death by it),
nothing written, no process left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from calibration.host import cpu_model

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "llama3.1-405b-16384-h100-plan.yaml"


def handles(pid: int, signum: int) -> bool:
    """Whether the process has installed a handler for ``signum`` (the CLI's main() has started)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signum - 1)))


def start(*args: str, env: dict | None = None) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "planner", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 60
    while not handles(process.pid, signal.SIGTERM):
        assert process.poll() is None and time.monotonic() < deadline, "the command never started"
        time.sleep(0.01)
    return process


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])  # SIGHUP: the terminal closed
def test_plan_interrupted_exits_130_and_writes_neither_plot_nor_configs(tmp_path, signum):
    plot, out = tmp_path / "plan.png", tmp_path / "out"
    process = start("plan", str(EXAMPLE), "--top", "100", "--plot", str(plot), "--emit", "megatron",
                    "--out", str(out))
    time.sleep(0.3)  # inside the plan: imports, search, solves
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, stderr
    assert stderr.strip() == "error: interrupted"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("module", ["planner.errors", "planner.cli"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupt_while_the_cli_still_loads_is_the_same_one_line_and_130(tmp_path, signum, module):
    """A signal in the quarter second Python spends loading the CLI (typer, rich, the cost models):
    "interrupted" and exit 130, as later, not a traceback of the import it cut short nor a death by
    the signal. The child signals itself as the import of ``module`` begins: planner.errors, which the
    package loaded before the entry point set its handlers (a KeyboardInterrupt traceback through
    planner/__init__.py, 2 of 40 Ctrl-Cs at 70-90 ms), or planner.cli."""
    code = f"""
import os, sys
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            os.kill(os.getpid(), {int(signum)})
        return None
sys.meta_path.insert(0, Interrupt())
sys.argv = ["layout-planner", "plan", {str(EXAMPLE)!r}, "--plot", {str(tmp_path / "plan.png")!r}]
from planner.entry import main
main()
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 128 + signum, done.stderr
    assert done.stderr.strip() == "error: interrupted"
    assert done.stdout == "" and list(tmp_path.iterdir()) == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the drop it stages
def test_an_interrupt_python_drops_still_stops_the_writes(tmp_path):
    """An interrupt raised where Python drops exceptions (a weakref callback inside an import prints
    "Exception ignored") is kept: write_all raises it before renaming anything into place."""
    import gc
    import weakref

    from planner.errors import Interrupted, forget_interrupts, interrupt
    from planner.files import Output, write_all

    class Dropped:
        pass

    forget_interrupts()
    try:
        target = Dropped()
        ref = weakref.ref(target, lambda _: interrupt("SIGTERM"))  # raised in the callback, dropped by Python
        del target
        gc.collect()
        assert ref() is None
        with pytest.raises(Interrupted):
            write_all([Output(tmp_path / "out" / "a.txt", "a")], force=False)
        assert list(tmp_path.iterdir()) == []
    finally:
        forget_interrupts()


LATE_SIGNAL = """
import os, signal, sys
import planner.files, planner.cli
real = planner.files.write_all
def write_then_signal(outputs, force, **options):
    written = real(outputs, force, **options)
    os.kill(os.getpid(), signal.{signum})  # lands just after the files are in place
    return written
planner.files.write_all = write_then_signal
sys.argv = ["layout-planner", "plan", {case!r}, "--top", "0", "--emit", "megatron", "--out", {out!r}]
try:
    planner.cli.main()
except SystemExit as done:
    print("handlers", signal.getsignal(signal.SIGINT) is signal.SIG_IGN, signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)
    raise
"""


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_a_signal_after_the_files_are_written_lets_the_command_finish(tmp_path, signum):
    """A signal landing after the emitted files were renamed into place gave exit 130 and
    "interrupted" with the files there; one during the interpreter's shutdown killed it by the
    signal, with no word. Past the write, and past the exit code, signals are ignored."""
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", LATE_SIGNAL.format(signum=signum, case=str(EXAMPLE), out=str(out))],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0 and "interrupted" not in done.stderr, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["launch.sh", "megatron_args.txt", "sbatch.sh"]
    assert "handlers True True" in done.stdout  # and so through the shutdown


SWALLOWED_BY_AN_IMPORT = """
import os, signal, sys
import planner.plots, planner.cli
from planner.errors import CaseError
def interrupted_while_matplotlib_loads(plan, path):
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler raises here, inside the extension's loading
    except BaseException:
        pass  # which turns it into an ImportError, and that into --plot's error
    raise CaseError(str(path), "--plot", "needs matplotlib: pip install 'layout-planner[plot]'")
planner.plots.render_plots = interrupted_while_matplotlib_loads
sys.argv = ["layout-planner", "plan", {case!r}, "--top", "0", "--plot", {plot!r}]
planner.cli.main()
"""


def test_an_interrupt_an_import_turns_into_an_error_is_still_the_interrupt(tmp_path):
    """SIGTERM while `plan --plot` loaded matplotlib: exit 2, "--plot: needs matplotlib", or the
    interpreter's shutdown aborting on the half-loaded extension (exit -6). It is the interrupt."""
    plot = tmp_path / "p.png"
    done = subprocess.run([sys.executable, "-c", SWALLOWED_BY_AN_IMPORT.format(case=str(EXAMPLE), plot=str(plot))],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 143 and done.stderr == "error: interrupted\n", done.stderr
    assert not plot.exists()


def test_the_solver_leaves_ctrl_c_to_python():
    """CP-SAT catches SIGINT by default and ends its search as if out of time; the plan would
    then go on and write its files. Solving in a loop, a Ctrl-C must stop the loop."""
    code = f"""
import sys
from planner.case import load_case
from planner.search import search
from planner.solver import LayoutModel
case = load_case({str(EXAMPLE)!r})
spec = case.search
model = LayoutModel(case, spec, search(case, spec).candidates)
print("ready", flush=True)
try:
    while True:
        model.solve()
except KeyboardInterrupt:
    sys.exit(130)
"""
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert process.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    try:
        assert process.wait(timeout=30) == 130
    finally:
        process.kill()


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def descendants(pid: int) -> set[int]:
    from calibration.processes import descendants as below

    return below(pid)


PROFILE = {
    "machine": {"device": "test-cpu", "cpu": cpu_model()},  # this machine's: validate checks it
    "gpu": {"memory": "4 GiB", "peak_tflops": {"fp32": 0.1}, "hbm_bandwidth": "10 GB/s",
            "intra_node_bandwidth": "1 GB/s", "inter_node_bandwidth": "1 GB/s", "gpus_per_node": 2,
            "nvlink_domain": 2},
}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_validate_interrupted_stops_torchrun_and_every_rank_and_leaves_no_folder(tmp_path, signum):
    pytest.importorskip("torch")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump({
        "model": {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "vocab_size": 512},
        "cluster": {"num_gpus": 2}, "training": {"precision": "fp32", "global_batch_size": 4, "seq_len": 64},
        "layout": {"dp": 2}}))
    process = start("validate", str(case), "--profile", str(profile), "--steps", "10000", "--warmup", "0",
                    "--allow-busy",
                    env={"TMPDIR": str(scratch)})
    ranks: set[int] = set()
    deadline = time.monotonic() + 120
    while len(ranks) < 3 and time.monotonic() < deadline:  # torchrun and its two ranks
        ranks = descendants(process.pid)
        time.sleep(0.2)
    assert len(ranks) >= 3, "torchrun never started its ranks"
    time.sleep(1.0)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, stderr
    assert stderr.strip().splitlines()[-1] == "error: interrupted"
    time.sleep(0.5)
    assert not [pid for pid in ranks if running(pid)]
    assert list(scratch.iterdir()) == []  # neither our run folder nor torchrun's torchelastic_*


def test_a_validate_whose_model_does_not_fit_is_one_line(tmp_path):
    pytest.importorskip("torch")
    profile = tmp_path / "profile.yaml"
    # A GPU of 1 MiB, 1 KiB of it outside the allocator: room for no model (a CUDA context past the
    # memory is the case's error, exit 2).
    profile.write_text(yaml.safe_dump({**PROFILE, "gpu": {**PROFILE["gpu"], "memory": "1 MiB"},
                                       "overheads": {"cuda_context": "1 KiB"}}))
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump({
        "model": {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "vocab_size": 512},
        "cluster": {"num_gpus": 2}, "training": {"precision": "fp32", "global_batch_size": 4, "seq_len": 64},
        "layout": {"dp": 2}}))
    run = subprocess.run([sys.executable, "-m", "planner", "validate", str(case), "--profile", str(profile)],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 3
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not fit" in lines[0] and "nothing run" in lines[0]


def test_an_interrupt_python_dropped_before_a_run_stops_it_before_torchrun_starts(tmp_path):
    """validate measures the machine's speed with torch before its run: a signal landing inside that
    import (about 1 s in) was swallowed there, and the run went on for its whole 15 s, printed its
    results and only then said "interrupted". The supervisor checks for a dropped interrupt before it
    starts torchrun and at every poll."""
    from calibration.supervisor import run_ranks
    from planner.errors import Interrupted, forget_interrupts, interrupt

    try:
        interrupt("SIGTERM")  # raised, and swallowed as an import swallows it
    except Interrupted:
        pass
    try:
        with pytest.raises(Interrupted):
            run_ranks(["calibration.worker"], 1, tmp_path, name="validation")
        assert not (tmp_path / "torchrun.log").exists()  # torchrun never started
    finally:
        forget_interrupts()


def test_python_m_planner_answers_a_ctrl_c_during_its_first_import_with_the_one_line():
    """`python -m planner` interrupted while it imports its entry point (before the handlers are set):
    a KeyboardInterrupt traceback from planner/__main__.py, exit 1 or a death by the signal. The child
    raises it as the import of planner.entry begins."""
    code = """
import runpy, sys
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "planner.entry":
            raise KeyboardInterrupt
        return None
sys.meta_path.insert(0, Interrupt())
sys.argv = ["layout-planner", "--version"]
runpy.run_module("planner", run_name="__main__", alter_sys=True)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 130 and done.stderr == "error: interrupted\n" and done.stdout == ""


SECOND_SIGNAL = """
import importlib, os, signal, sys
import planner.cli
plan_module = importlib.import_module("planner.plan")
real_plan, real_caused = plan_module.plan, planner.cli._caused_by_interrupt
def first(*args, **options):
    os.kill(os.getpid(), signal.{first})  # the first: the plan is interrupted
    return real_plan(*args, **options)
def second(error):
    os.kill(os.getpid(), signal.{second})  # the second, as the CLI answers the first
    return real_caused(error)
plan_module.plan, planner.cli._caused_by_interrupt = first, second
sys.argv = ["layout-planner", "plan", {case!r}, "--emit", "megatron", "--out", {out!r}]
planner.cli.main()
"""


@pytest.mark.parametrize("first,second", [("SIGINT", "SIGINT"), ("SIGTERM", "SIGINT"), ("SIGINT", "SIGTERM")])
def test_a_second_signal_while_the_first_is_answered_is_the_same_one_line(tmp_path, first, second):
    """Ctrl-C twice in quick succession: the second landing while the CLI answered the first (inside
    the except clause that says "interrupted") raised out of it, a traceback of two interrupts and exit 1.
    A signal while one is being answered is recorded, not raised: the first decides the exit code."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", SECOND_SIGNAL.format(first=first, second=second, case=str(EXAMPLE),
                                                                       out=str(out))],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 128 + int(getattr(signal, first)), done.stderr
    assert done.stderr == "error: interrupted\n"
    assert list(tmp_path.iterdir()) == []


BEFORE_THE_COMMAND = """
import os, signal, sys
import planner.cli
{hook}
sys.argv = ["layout-planner", "estimate", {case!r}, "--json"]
from planner.entry import main
main()
"""
HOOKS = {
    # The last module the CLI loads before a command runs (its writes' errors), after its handlers are set.
    "files' import": """
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "planner.files":
            os.kill(os.getpid(), signal.{signum})
        return None
sys.meta_path.insert(0, Interrupt())""",
    # Between the CLI setting its handlers and the command: its stream and COLUMNS checks.
    "stream checks": """
real = planner.cli._sane_columns
def interrupted():
    os.kill(os.getpid(), signal.{signum})
    real()
planner.cli._sane_columns = interrupted""",
}


@pytest.mark.parametrize("where", sorted(HOOKS))
@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_an_interrupt_between_the_cli_loading_and_the_command_is_the_one_line(tmp_path, where, signum):
    """A signal in the few milliseconds after the CLI set its handlers and before the command's own
    ``try`` (loading planner.files, guarding the streams) raised out of main(): a traceback ending in
    ``planner.errors.Interrupted`` and exit 1."""
    code = BEFORE_THE_COMMAND.format(hook=HOOKS[where].format(signum=signum), case=str(REPO / "examples" / "llama3-70b-h100.yaml"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 128 + int(getattr(signal, signum)), done.stderr
    assert done.stderr == "error: interrupted\n" and done.stdout == ""


PROFILE_THEN_SIGNAL = """
import os, signal, sys
import planner.cli, planner.files
real = planner.files.write_all
def write_then_signal(*args, **options):
    written = real(*args, **options)
    os.kill(os.getpid(), signal.{signum})  # lands just after the profile is in place
    return written
planner.files.write_all = write_then_signal
sys.argv = ["layout-planner", "calibrate", "--quick", "--nproc", "1", "--allow-busy", "--out", {out!r}]
planner.cli.main()
"""


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_a_signal_after_calibrate_wrote_its_profile_lets_it_finish(tmp_path, signum):
    """A signal after the profile was renamed into place, while the run's folder was being removed,
    said "calibration interrupted; no profile written" and exit 130 (143) with the profile there,
    4 of 4 times a signal was sent the moment it appeared. Past the write, signals are ignored."""
    pytest.importorskip("torch")
    scratch, out = tmp_path / "tmp", tmp_path / "profile.yaml"
    scratch.mkdir()
    done = subprocess.run([sys.executable, "-c", PROFILE_THEN_SIGNAL.format(signum=signum, out=str(out))],
                          capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "TMPDIR": str(scratch)})
    assert done.returncode == 0 and "interrupted" not in done.stderr, done.stderr
    assert out.is_file() and "wrote" in done.stdout
    assert list(scratch.iterdir()) == []  # the run's folder is gone all the same
