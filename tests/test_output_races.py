"""Output files are all or none, also when two runs write into one folder at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
import yaml

from planner.errors import CaseError
from planner.files import Output, write_all

pytestmark = pytest.mark.slow

CASE = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8},
        "training": {"global_batch_size": 64, "seq_len": 4096}}
TRIALS = 5  # each trial is a fresh race of two processes


def plan_emit(case: Path, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "planner", "plan", str(case), "--emit", "megatron",
                             "--out", str(out), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def writers(tmp_path: Path) -> list[Path]:
    """Two cases that differ only in their name: every file says which one wrote it."""
    paths = []
    for name in ("writer-a", "writer-b"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**CASE, "model": {"preset": "llama2-7b", "name": name}}))
        paths.append(path)
    return paths


def test_two_runs_into_one_fresh_folder_one_wins_and_files_never_mix(tmp_path):
    cases = writers(tmp_path)
    for trial in range(TRIALS):
        out = tmp_path / f"out{trial}"
        runs = [plan_emit(case, out) for case in cases]
        results = [(run.wait(timeout=120), run.communicate()[1]) for run in runs]
        codes = sorted(code for code, _ in results)
        assert codes == [0, 2], results
        loser = next(err for code, err in results if code == 2).strip().splitlines()
        assert len(loser) == 1 and "exists; pass --force to overwrite" in loser[0]
        assert sorted(p.name for p in out.iterdir()) == ["launch.sh", "megatron_args.txt", "sbatch.sh"]
        authors = {name for p in out.iterdir() for name in ("writer-a", "writer-b") if name in p.read_text()}
        assert len(authors) == 1, f"trial {trial}: files from {authors}"


def test_forced_runs_at_once_leave_one_writers_files(tmp_path):
    cases = writers(tmp_path)
    out = tmp_path / "out"
    for _ in range(3):
        runs = [plan_emit(case, out, "--force") for case in cases]
        assert [run.wait(timeout=120) for run in runs] == [0, 0]
        authors = {name for p in out.iterdir() for name in ("writer-a", "writer-b") if name in p.read_text()}
        assert len(authors) == 1
        assert sorted(p.name for p in out.iterdir()) == ["launch.sh", "megatron_args.txt", "sbatch.sh"]


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_forced_write_that_fails_part_way_puts_the_old_files_back(tmp_path, monkeypatch, failure):
    out = tmp_path / "out"
    out.mkdir()
    (out / "megatron_args.txt").write_text("old args\n")
    (out / "launch.sh").write_text("old launch\n")
    real_replace = os.replace

    def fail_on_launch(src, dst):
        if Path(dst) == out / "launch.sh" and Path(src).name == "launch.sh":  # the new one, not a put-back
            raise failure
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_on_launch)
    files = [Output(out / "megatron_args.txt", "new args\n"), Output(out / "launch.sh", "new launch\n")]
    with pytest.raises(CaseError if isinstance(failure, OSError) else KeyboardInterrupt):
        write_all(files, force=True)
    assert (out / "megatron_args.txt").read_text() == "old args\n"
    assert (out / "launch.sh").read_text() == "old launch\n"
    assert sorted(p.name for p in out.iterdir()) == ["launch.sh", "megatron_args.txt"]  # nothing staged is left


@pytest.mark.parametrize("first", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_second_ctrl_c_during_the_roll_back_still_puts_every_old_file_back(tmp_path, monkeypatch, first):
    """The module's promise (the old files, or no files) through a roll-back cut short: a second Ctrl-C,
    raised as Python raises one, at a call where SIGINT is not blocked, stopped the put-back after its
    first file. The Python API has no handler to defer it (the CLI's records a signal that lands while
    it answers the first), so the new args stayed beside the old launch file, and the old args, moved
    aside into the staging folder, went with it."""
    import signal

    out = tmp_path / "out"
    out.mkdir()
    (out / "megatron_args.txt").write_text("old args\n")
    (out / "launch.sh").write_text("old launch\n")
    real_replace = os.replace
    rolling_back = []

    def fail_then_interrupt(src, dst):
        if Path(dst) == out / "launch.sh" and Path(src).name == "launch.sh":  # the new one, not a put-back
            rolling_back.append(True)
            raise first
        if rolling_back and signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, ()):
            raise KeyboardInterrupt  # the second Ctrl-C, where the kernel would deliver it
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_then_interrupt)
    files = [Output(out / "megatron_args.txt", "new args\n"), Output(out / "launch.sh", "new launch\n")]
    try:
        write_all(files, force=True)
    except BaseException as error:  # noqa: B036 - an interrupt escaping would end the test session
        raised = error
    assert isinstance(raised, (CaseError, KeyboardInterrupt)), repr(raised)
    assert (out / "megatron_args.txt").read_text() == "old args\n"
    assert (out / "launch.sh").read_text() == "old launch\n"
    assert sorted(p.name for p in out.iterdir()) == ["launch.sh", "megatron_args.txt"]  # nothing staged is left


def test_a_failed_write_into_a_new_folder_leaves_no_folder(tmp_path, monkeypatch):
    def no_space(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(CaseError, match="nothing written"):
        write_all([Output(tmp_path / "new" / "deeper" / "a.txt", "a")], force=False)
    assert list(tmp_path.iterdir()) == []


def test_a_forced_emission_for_another_engine_takes_the_earlier_engines_files_out(tmp_path):
    """DeepSpeed's files, then Megatron-LM's with --force into the same folder: the folder holds
    Megatron-LM's alone (ds_config.json would otherwise sit beside them, a launch reading it the
    wrong run's), a file the planner did not write stays, and the removal is said."""
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump(CASE))
    out = tmp_path / "out"
    first = subprocess.run([sys.executable, "-m", "planner", "plan", str(case), "--engine", "deepspeed", "--emit",
                            "deepspeed", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert (out / "ds_config.json").exists()
    (out / "my-notes.txt").write_text("the team's own notes\n")
    second = plan_emit(case, out, "--engine", "megatron", "--force")
    _, stderr = second.communicate(timeout=120)
    assert second.returncode == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == ["launch.sh", "megatron_args.txt", "my-notes.txt", "sbatch.sh"]
    assert f"removed {out / 'ds_config.json'}" in stderr


def test_a_failed_write_puts_back_what_it_took_out(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "ds_config.json").write_text('{"_comment": ["Generated by layout-planner from a.yaml"]}\n')
    (out / "launch.sh").write_text("old launch\n")
    real_replace = os.replace

    def fail_on_removal(src, dst):
        if Path(src) == out / "ds_config.json":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_on_removal)
    with pytest.raises(CaseError, match="nothing written"):
        write_all([Output(out / "launch.sh", "new launch\n")], force=True, removes=[out / "ds_config.json"])
    assert (out / "launch.sh").read_text() == "old launch\n" and (out / "ds_config.json").exists()
    assert sorted(p.name for p in out.iterdir()) == ["ds_config.json", "launch.sh"]


def test_the_apis_forced_emit_takes_an_earlier_emissions_files_out_and_says_so(tmp_path):
    import planner

    out = tmp_path / "out"
    out.mkdir()
    (out / "ds_config.json").write_text('{"_comment": ["Generated by layout-planner from a.yaml"]}\n')
    (out / "launch.sh").write_text("# Generated by layout-planner from a.yaml\n")
    result = planner.plan(CASE, engine="megatron")
    emitted = planner.emit(result, "megatron", out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["launch.sh", "megatron_args.txt", "sbatch.sh"]
    assert [n for n in emitted.notes if n.startswith("removed")] == [
        f"removed {out / 'ds_config.json'}: an earlier emission's file (its header says layout-planner wrote it), "
        "which this plan's files replace"]


def test_a_link_to_nowhere_is_not_replaced_and_a_name_too_long_is_one_line(tmp_path):
    """`--plot` at a dangling symlink replaced the link without --force (the link exists: only its
    target does not); a file name longer than the file system takes ended in an OSError traceback."""
    from cli_in_process import run_cli

    example = str(Path(__file__).resolve().parent.parent / "examples" / "llama3-70b-1024-h100-plan.yaml")
    link = tmp_path / "plan.png"
    link.symlink_to(tmp_path / "nowhere.png")
    done = run_cli("plan", example, "--plot", str(link))
    assert done.returncode == 2 and "--plot: exists; pass --force to overwrite" in done.stderr
    assert link.is_symlink() and not (tmp_path / "nowhere.png").exists()
    long = tmp_path / ("x" * 300 + ".png")
    done = run_cli("plan", example, "--plot", str(long))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "cannot be written (File name too long)" in done.stderr


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_a_signal_during_a_forced_writes_renames_leaves_the_old_file_or_the_new(tmp_path, monkeypatch, name):
    """The terminal closing (SIGHUP, an interrupt the CLI answers) just after the old file was moved
    aside deleted it with the staging folder: only SIGINT and SIGTERM were held back there. Held back
    in the main thread alone, any of them was taken by another thread (a progress bar's), and Python
    ran the handler in the main thread all the same, mid-rename: the folder was left empty. With a
    thread beside, the handler may run only once the renames are done (the kernel delivers to it when
    it is scheduled): the file is then the new one, whole; never none. (Other tests leave threads in a
    worker's process too: the handler's timing is the kernel's either way.)"""
    import signal
    import threading

    from planner import cli, files
    from planner.errors import Interrupted, forget_interrupts

    target = tmp_path / "plan.json"
    target.write_text("OLD\n")
    signum = getattr(signal, name)
    previous = signal.signal(signum, cli._interrupted)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})  # as a command starts: delivered, not pending
    real, moves = os.replace, []

    def replace(a, b):
        real(a, b)
        moves.append(b)
        if len(moves) == 1:  # the old file just moved aside
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(files.os, "replace", replace)
    forget_interrupts()
    done = threading.Event()
    other = threading.Thread(target=done.wait, daemon=True)
    other.start()
    try:
        with pytest.raises(Interrupted):
            write_all([Output(target, "NEW\n")], force=True)
            time.sleep(0.5)  # a late handler raises here, if not already
    finally:
        done.set()
        other.join()
        signal.signal(signum, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        forget_interrupts()
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]
    assert target.read_text() in ("OLD\n", "NEW\n")


def test_two_forced_emissions_of_two_engines_into_one_folder_at_once_leave_one_engines_files(tmp_path):
    """planner.emit(..., force=True) looked for an earlier emission's files before it locked the folder:
    two threads emitting Megatron-LM's and DeepSpeed's files into one folder at once each missed the
    other's, and the folder held both engines' configs (193 of 200 races), where a launch may read the
    wrong one."""
    import threading

    import planner

    plans = {engine: planner.plan(CASE, engine=engine, top_k=0) for engine in ("megatron", "deepspeed")}
    for trial in range(20):
        out = tmp_path / f"out{trial}"
        start = threading.Barrier(2)

        def emit(engine: str) -> None:
            start.wait()
            planner.emit(plans[engine], engine, out, force=True)

        threads = [threading.Thread(target=emit, args=(engine,)) for engine in plans]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        names = {p.name for p in out.iterdir()}
        assert not {"ds_config.json", "megatron_args.txt"} <= names, names


def test_writing_files_leaves_the_process_umask_alone_and_gives_the_mode_it_allows(tmp_path, monkeypatch):
    """write_all read the umask by setting it to 0 and back: for that moment every thread of the process
    (an orchestrator's, writing its own files) created files writable by all (0o666), and emit's own
    came out so in 4 of 7 runs of 400 threaded emissions. The files get what open() gives under the
    caller's umask."""
    calls = []
    real_umask = os.umask

    def umask(mask):
        calls.append(mask)
        return real_umask(mask)

    previous = real_umask(0o027)
    try:
        monkeypatch.setattr(os, "umask", umask)
        write_all([Output(tmp_path / "a" / "launch.sh", "x\n"), Output(tmp_path / "b.json", "{}\n")], force=False)
    finally:
        real_umask(previous)
    assert calls == []  # no moment with another mask
    assert {oct((tmp_path / "a" / "launch.sh").stat().st_mode & 0o777), oct((tmp_path / "b.json").stat().st_mode & 0o777)} \
        == {oct(0o640)}


def test_an_interrupt_inside_the_clean_up_leaves_no_staging_folder(tmp_path, monkeypatch):
    """A Ctrl-C that landed in the staging folder's removal (an API caller's, in a long-lived process)
    left a .layout-planner-* folder beside the files it had written."""
    import shutil

    real_rmtree, calls = shutil.rmtree, []

    def interrupted_once(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        write_all([Output(tmp_path / "launch.sh", "x\n")], force=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch.sh"]


@pytest.mark.parametrize("module, name, target", [
    ("tempfile", "mkstemp", "launch.sh"),  # check_writable's probe
    ("tempfile", "mkdtemp", "launch.sh"),  # write_all's staging folder
    ("pathlib", "Path.mkdir", "new/launch.sh"),  # a folder --out names that did not exist
])
def test_an_interrupt_just_after_the_writer_makes_a_file_or_folder_leaves_none(tmp_path, monkeypatch, module, name,
                                                                               target):
    """The probe file, the staging folder and a folder made for --out are the planner's to remove: a signal
    landing between the file system making one and the planner holding its name (inside tempfile's own
    Python code, or before the assignment) left a .layout-planner-* file or folder, or an empty folder,
    in the user's folder, which nothing removed. Here the signal is sent the moment the call returns,
    and the CLI's handler answers it; the folder must hold what it held."""
    import importlib
    import signal

    from planner import cli
    from planner.errors import Interrupted, forget_interrupts
    from planner.files import check_writable

    owner = importlib.import_module(module)
    *inner, attribute = name.split(".")
    for part in inner:
        owner = getattr(owner, part)
    real = getattr(owner, attribute)

    def made_then_signalled(*args, **kwargs):
        made = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs as soon as this returns
        return made

    (tmp_path / "keep.txt").write_text("mine\n")
    outputs = [Output(tmp_path / target, "x\n")]
    previous = signal.signal(signal.SIGTERM, cli._interrupted)
    monkeypatch.setattr(owner, attribute, made_then_signalled)
    forget_interrupts()
    try:
        with pytest.raises(Interrupted):
            check_writable(outputs, force=False)
            write_all(outputs, force=False)
            time.sleep(0.5)  # a late handler raises here, if not already
    finally:
        signal.signal(signal.SIGTERM, previous)
        forget_interrupts()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]



# Where CPython raises the KeyboardInterrupt of a pending SIGINT (its "eval breaker" checks): a
# function's start, a call's return, a loop's jump back (Python/bytecodes.c; PRECALL is 3.11's).
_INTERRUPT_POINTS = {"RESUME", "PRECALL", "CALL", "CALL_FUNCTION_EX", "JUMP_BACKWARD"}


def _interrupted_at(k: int, call) -> Optional[BaseException]:
    """``call()`` with a KeyboardInterrupt raised at the k-th point where Python would raise one for a
    Ctrl-C, leaving out those where SIGINT is blocked (``signals_held``, as the kernel holds it back);
    what it raised, None where it ended first."""
    import dis
    import signal

    count, after_call = [0], set()

    def trace(frame, event, arg):
        frame.f_trace_opcodes = True
        if event != "opcode":
            return trace
        name = dis.opname[frame.f_code.co_code[frame.f_lasti]]
        # Before the point, or right after a call returned (its check comes once its result is back).
        point = name in _INTERRUPT_POINTS or id(frame) in after_call
        after_call.discard(id(frame))
        if name.startswith("CALL"):
            after_call.add(id(frame))
        if point and signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, ()):
            count[0] += 1
            if count[0] == k:
                raise KeyboardInterrupt  # raised in the traced frame (and the trace turned off)
        return trace

    sys.settrace(trace)
    try:
        call()
    except BaseException as error:  # noqa: B036 - the interrupt is what is looked at
        return error
    finally:
        sys.settrace(None)
    return None


def test_a_ctrl_c_anywhere_in_a_write_leaves_all_or_none_and_raises_the_interrupt(tmp_path):
    """The module's promise, "all of a command's files or none", at every point a Ctrl-C can be raised.
    One raised as the clean-up began, before its first removal, left the staging folder beside the
    files written; one raised inside shutil.rmtree between its os.close and its note of it closed the
    folder again in rmtree's finally, raising OSError [Errno 9] instead of the interrupt."""
    points = 0
    while points < 20_000:  # until the interrupt comes past the call's last point
        points += 1
        out = tmp_path / str(points)
        error = _interrupted_at(points, lambda: write_all([Output(out / "a.sh", "#!/bin/sh\n"),
                                                           Output(out / "b.json", "{}\n")], force=False))
        if error is None:
            break
        assert isinstance(error, KeyboardInterrupt), (points, repr(error))
        assert not out.exists() or sorted(p.name for p in out.iterdir()) in ([], ["a.sh", "b.json"]), \
            (points, sorted(p.name for p in out.iterdir()))
    assert 100 < points < 20_000  # every point of the write was reached: staging, renames and clean-up


def test_emit_interrupted_anywhere_leaves_the_old_files_or_says_it_wrote_the_new(tmp_path, monkeypatch):
    """planner.emit over an earlier emission (force=True), with a Ctrl-C at every point Python can raise
    one: it returns with every new file written, or raises the interrupt with the old files as they were
    (the renames are held, and put back under an interrupt), or, where the interrupt came once the files
    were in place for good (the clean-up, the way back), raises it saying so: an interrupt there left them
    written while the caller, handed no Emitted, had every reason to think emit wrote nothing. The CLI
    ignores a late interrupt instead (test_interrupts.py); a library may not. Called as the API runs it
    past its argument wrapper, from C (functools.partial): a point in the caller's own frame is the caller's."""
    import functools
    import traceback

    from planner import configs
    from planner.estimate import estimate

    est = estimate({**CASE, "training": {**CASE["training"], "engine": "megatron"},
                    "layout": {"tp": 1, "pp": 1, "dp": 8, "micro_batch_size": 1, "zero_stage": 1}})
    rendered = configs.render(est, "megatron")
    monkeypatch.setattr(configs, "render", lambda *args: rendered)  # the write alone is traced
    names = sorted(rendered[0])
    points = 0
    while points < 20_000:  # until the interrupt comes past the call's last point
        points += 1
        out = tmp_path / str(points)
        out.mkdir()
        for name in names:
            (out / name).write_text("old\n")
        error = _interrupted_at(points, functools.partial(configs.emit, est, "megatron", str(out), force=True))
        now = {p.name: p.read_text() for p in out.iterdir()}
        if error is None:
            assert now == rendered[0], points
            break
        assert isinstance(error, KeyboardInterrupt), (points, repr(error))
        if now != {name: "old\n" for name in names}:
            assert now == rendered[0], (points, sorted(now))
            assert any(str(out / names[0]) in note for note in getattr(error, "__notes__", [])), \
                (points, "".join(traceback.format_exception(error)))
    assert 100 < points < 20_000  # every point of the emission was reached: staging, renames and clean-up


def test_an_interrupt_pending_as_the_signals_are_held_leaves_them_unblocked():
    """A Ctrl-C whose C-level handler ran just before ``signals_held`` blocked the signals is raised by
    Python at the first bytecode after ``pthread_sigmask`` returns: with the mask taken from that call,
    the exception left before the ``try`` that restores it, and the process went on with SIGINT, SIGTERM
    and SIGHUP blocked; every process it started after inherited the mask (a launcher then ignored
    ``kill``; tests/test_sbatch.py failed so on a CI worker). Raised at every bytecode of the block's
    entry, up to its yield, whatever the mask (a handler pending from before the block runs when it is
    blocked too), it must leave the mask as it found it. (Past the entry Python has run any handler
    pending from before: it checks at the calls and the yield, and the kernel holds back the rest.)"""
    import signal

    from planner import files

    before = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    entry = files.signals_held.__wrapped__.__code__
    for k in range(1, 40):
        count, entered = [0], [False]

        def trace(frame, event, arg):
            if frame.f_code is not entry or entered[0]:
                return None
            frame.f_trace_opcodes = True
            if event == "return":  # the generator yields: the block is entered
                entered[0] = True
            elif event == "opcode":
                count[0] += 1
                if count[0] == k:
                    raise KeyboardInterrupt
            return trace

        sys.settrace(trace)
        try:
            with files.signals_held():
                pass
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        held = signal.pthread_sigmask(signal.SIG_SETMASK, before)
        assert held == before, (k, held)
