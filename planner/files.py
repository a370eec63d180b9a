"""Writing output files: all of a command's files or none, never over an existing file
without --force, and never a mix of two runs' files.

Every file is first written in full to a private staging folder beside its target.
Then, holding an exclusive lock on each target folder (``flock`` on the folder itself,
so no lock file is left behind) and with SIGINT, SIGTERM and SIGHUP held back, the existence
check is made again and the files are renamed into place, each old file moved aside
first. If a rename fails, or an interrupt arrived meanwhile, every file moved so far is
put back, with the signals still held: the folders hold the old files, or no files, and no partial one.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import stat
import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Union

from .errors import INTERRUPTS, CaseError, ignore_interrupts, interrupts_deferred, raise_if_interrupted

_STAGING_PREFIX = ".layout-planner-"
_HELD_SIGNALS = {getattr(signal, name) for name in INTERRUPTS}  # what the CLI answers as an interrupt


@dataclass(frozen=True)
class Output:
    """One file to write; ``option`` is the command-line option (or the API's argument) that named
    it, and ``force`` how its caller says to overwrite (for errors)."""

    path: Path
    data: Union[str, bytes]
    option: str = "--out"
    force: str = "--force"


def _nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _refuse_special(out: Output) -> None:
    """A target that is a device, a pipe or a socket (or a link to one) is no file to replace:
    `--write-bands /dev/full`, run as root, replaced the device with a regular file."""
    try:
        mode = os.stat(out.path).st_mode
    except OSError:
        return  # nothing there (or a link to nowhere): a file is made
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        kind = "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else \
            "a pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
        raise CaseError(str(out.path), out.option, f"is {kind}, not a file; expected a file name")


def check_writable(outputs: list[Output], force: bool) -> None:
    """Refuse, before any work, a target that exists (without ``force``) or whose folder
    cannot be created or written (a probe file is made and removed: permission bits alone
    do not tell, e.g. for root on a read-only file system)."""
    _refuse_if_told(outputs)  # said before the work, as any other reason not to write
    probed: set[Path] = set()
    for out in outputs:
        try:
            is_dir = out.path.is_dir()
        except OSError as error:  # a name longer than the file system takes, say
            raise CaseError(str(out.path), out.option, f"cannot be written ({error.strerror or error})") from None
        if is_dir:
            raise CaseError(str(out.path), out.option, "is a folder; expected a file name")
        _refuse_special(out)
        # A link to nowhere exists too: writing would replace the link the user made.
        if os.path.lexists(out.path) and not force:
            raise CaseError(str(out.path), out.option, f"exists; pass {out.force} to overwrite")
        folder = _nearest_existing(out.path.parent)
        if folder in probed:
            continue
        probed.add(folder)
        if not folder.is_dir():
            raise CaseError(str(out.path), out.option, f"cannot be written: {folder} is not a folder")
        try:
            with signals_held():  # made and removed in one step: an interrupt between would leave it
                fd, probe = tempfile.mkstemp(dir=folder, prefix=_STAGING_PREFIX)
                os.close(fd)
                os.unlink(probe)
        except OSError as error:
            raise CaseError(str(out.path), out.option,
                            f"cannot be written: folder {folder} is not writable ({error.strerror or error})") from None


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP wait until the block is done; a pending one is raised after it.

    Blocked in this thread, and deferred by the CLI's handler too (``interrupts_deferred``): a process
    with other threads (rich's progress bar, a library's pool) takes a signal in one of them, and
    Python runs its handler in the main thread all the same, mid-rename (the old file was deleted with
    the staging folder).

    The mask to restore is read before anything is blocked: a signal whose C-level handler ran just
    before the block has its Python handler run at the first bytecode after the blocking call returns,
    and an exception raised there, before the ``try``, left the signals blocked for the rest of the
    process and every process it started."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, ())  # the mask as it is: blocks nothing
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
        with interrupts_deferred():
            yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _make_folder(folder: Path, created: list[Path]) -> None:
    """mkdir -p, remembering the folders made here (removed again if nothing is written)."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            with signals_held():  # made and recorded in one step, so that the clean-up finds it
                path.mkdir()
                created.append(path)
        except FileExistsError:  # another run made it meanwhile
            pass


def _stage(folder: Path, stages: dict[Path, Path]) -> None:
    """The staging folder in ``folder``, made and recorded in one step: an interrupt landing between
    the two (inside tempfile's own code) left it beside the user's files, unknown to the clean-up."""
    if folder not in stages:
        with signals_held():
            stages[folder] = Path(tempfile.mkdtemp(dir=folder, prefix=_STAGING_PREFIX))


def _put_back(moved: list[tuple[Path, Optional[Path]]]) -> None:
    for target, backup in reversed(moved):
        try:
            if backup is not None:
                os.replace(backup, target)
            else:
                target.unlink()
        except OSError:
            pass


class WritesRefused(Exception):
    """The CLI cannot say what it would write (its stdout is closed): no file is written."""


_REFUSED: list[str] = []  # why files may not be written in this process, once the CLI has said so


def refuse_writes(why: str) -> None:
    """Every later :func:`check_writable` and :func:`write_all` raises :class:`WritesRefused` with ``why``
    (the CLI's closed stdout)."""
    _REFUSED[:] = [why]


def _refuse_if_told(outputs: list[Output]) -> None:
    if _REFUSED and outputs:
        raise WritesRefused(_REFUSED[0])


# Each try of the clean-up is cut short only by a new interrupt: two in a row at most, in practice.
_CLEAN_UP_TRIES = 8


def _clean_up(stages: dict[Path, Path], created: list[Path]) -> None:
    """The staging folders removed, and the folders made for files not written; done again from the
    start where an interrupt cut it short (what is gone already is skipped)."""
    for stage in stages.values():
        shutil.rmtree(stage, ignore_errors=True)
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            pass


def _the_interrupt(error: BaseException) -> BaseException:
    """The interrupt behind ``error``: a Ctrl-C between shutil.rmtree's os.close and its note of it
    closes the folder again in rmtree's ``finally``, whose OSError [Errno 9] replaces the
    KeyboardInterrupt (its ``__context__``); the caller is owed the interrupt."""
    cause: Optional[BaseException] = error
    while cause is not None:
        if not isinstance(cause, Exception):  # KeyboardInterrupt, the CLI's Interrupted
            return cause
        cause = cause.__context__
    return error


def _write_new(path: Path, data: Union[str, bytes]) -> None:
    """``data`` written to ``path``: bytes as they are, text in UTF-8."""
    if isinstance(data, bytes):
        with open(path, "wb") as binary:
            binary.write(data)
    else:
        with open(path, "w", encoding="utf-8") as text:
            text.write(data)


def write_all(outputs: list[Output], force: bool, last: bool = False,
              removes: Union[Sequence[Path], Callable[[], Sequence[Path]]] = (),
              committed: Optional[list[bool]] = None) -> list[Path]:
    """Write every output, all or none (see the module docstring); returns their paths. ``last``
    (the CLI's: the command's last act) ignores interrupts once the files are in place, a signal
    held back during the renames included (``errors.ignore_interrupts``). ``removes`` (with
    ``force``: an earlier emission's files that these replace) are taken out in the same step, and
    put back with the rest if it fails; given as a function, it is asked once the folders are
    locked, for files in the outputs' folders (what is there may change until then: another run's
    emission into the same folder, written a moment before). ``committed`` (the Python API's, which
    cannot ignore interrupts as the CLI does) is set to ``[True]`` the moment the files are in place for
    good: an interrupt raised after it (in the clean-up, or on the way back) leaves them written."""
    outputs = list(outputs)
    assert force or not removes
    _refuse_if_told(outputs)
    created: list[Path] = []
    stages: dict[Path, Path] = {}
    staged: list[tuple[Output, Path]] = []
    moved: list[tuple[Path, Optional[Path]]] = []
    done = [False] if committed is None else committed  # one store sets it: no point between for an interrupt
    done[0] = False
    try:
        try:
            for out in outputs:
                if out.path.is_dir():
                    raise CaseError(str(out.path), out.option, "is a folder; expected a file name")
                _refuse_special(out)
                folder = Path(os.path.abspath(out.path.parent))
                _make_folder(folder, created)
                _stage(folder, stages)
                tmp = stages[folder] / out.path.name
                _write_new(tmp, out.data)
                # open() gives the file what writing it in place would (0o666 less the umask), with no
                # os.umask to read the mask (it sets it for every thread at once). A script (#!) is
                # executable by whoever may read it, as `chmod +x` leaves it: ./launch.sh and
                # `srun ./launch.sh` were "Permission denied".
                if (out.data[:2] if isinstance(out.data, bytes) else out.data[:2].encode()) == b"#!":
                    readable = os.stat(tmp).st_mode & 0o444
                    os.chmod(tmp, os.stat(tmp).st_mode | readable >> 2)
                staged.append((out, tmp))
            for path in ([] if callable(removes) else removes):
                _stage(Path(os.path.abspath(path.parent)), stages)
            with ExitStack() as locks:
                for folder in sorted(stages):
                    locks.enter_context(_locked(folder))
                if callable(removes):
                    written = {out.path for out in outputs}
                    removes = [path for path in removes() if path not in written
                               and Path(os.path.abspath(path.parent)) in stages]
                for out, _ in staged:  # again, now that no other run can write here
                    if os.path.lexists(out.path) and not force:
                        raise CaseError(str(out.path), out.option, f"exists; pass {out.force} to overwrite")
                try:
                    with signals_held():
                        raise_if_interrupted()  # one that landed where Python drops exceptions
                        for out, tmp in staged:
                            backup = None
                            if out.path.exists() or out.path.is_symlink():
                                backup = tmp.with_name(tmp.name + ".old")
                                os.replace(out.path, backup)
                            moved.append((out.path, backup))
                            os.replace(tmp, out.path)
                        for path in removes:
                            if path.exists() or path.is_symlink():
                                backup = stages[Path(os.path.abspath(path.parent))] / (path.name + ".removed")
                                os.replace(path, backup)
                                moved.append((path, backup))
                        if last and outputs:
                            ignore_interrupts()  # before the held signals are let through
                    done[0] = True  # past this point, an interrupt held back above has been raised
                except BaseException:
                    # Held as the renames are: a second Ctrl-C cut the put-back short where no handler defers
                    # it (the Python API's), leaving new files beside old ones and the old ones moved aside
                    # into the staging folder, which the clean-up removes. One landing before the block holds
                    # it starts the put-back again (a step done already fails and is skipped); the interrupt
                    # is raised once all is back, as the clean-up's below.
                    again: Optional[BaseException] = None
                    tries = 0
                    while tries < _CLEAN_UP_TRIES:
                        tries += 1
                        try:
                            with signals_held():
                                _put_back(moved)
                            break
                        except BaseException as error:
                            again = again or error
                    if again is not None:
                        raise _the_interrupt(again)
                    raise
        except OSError as error:
            first = outputs[0] if outputs else Output(Path("."), "")
            raise CaseError(str(first.path), first.option,
                            f"cannot write ({error.strerror or error}); nothing written") from None
    finally:
        # The staging folders go whatever interrupts the clean-up (a Ctrl-C inside rmtree left one
        # beside the files): it is retried to the end, and the interrupt raised after. Nothing here
        # but the names' stores stands outside the `try` (no call, where Python raises a pending
        # KeyboardInterrupt): one landing as the clean-up began left the staging folder.
        interrupted: Optional[BaseException] = None
        tries = 0
        while tries < _CLEAN_UP_TRIES:
            tries += 1
            try:
                _clean_up(stages, [] if done[0] else created)
                break
            except BaseException as error:  # raised again below, once the folders are gone
                interrupted = interrupted or error
        if interrupted is not None:
            raise _the_interrupt(interrupted)
    return [out.path for out in outputs]


def write_atomically(path: Path, data: Union[str, bytes], force: bool = True, option: str = "--out") -> None:
    """One file, whole or not at all."""
    write_all([Output(Path(path), data, option)], force)
