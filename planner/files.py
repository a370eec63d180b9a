"""Reading input files, and writing output files: atomically, and never over an existing
file without --force."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml

from .errors import CaseError

# yaml.safe_load's loader, on libyaml's C parser where PyYAML has it: the same safe subset
# (no object tags), several times faster on the preset files every run reads.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_text(path: Path) -> str:
    """The text of an input file, or a CaseError naming it: missing, unreadable or not UTF-8."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CaseError(str(path), "", "file not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise CaseError(str(path), "", f"cannot be read ({error.__class__.__name__})") from None


def check_writable(paths: list[Path], force: bool) -> None:
    """Refuse before anything is written if any target exists and ``force`` is off."""
    for path in paths:
        if path.exists() and not force:
            raise CaseError(str(path), "--out", "exists; pass --force to overwrite")


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it into place.

    A failure leaves the old file (or no file) and no partial one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_all(files: dict[Path, str], force: bool) -> list[Path]:
    """Write several files, all or none: each is staged, then all are renamed into place."""
    check_writable(list(files), force)
    staged: list[tuple[str, Path]] = []
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            staged.append((tmp, path))
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o644)
        for tmp, path in staged:
            os.replace(tmp, path)
    except OSError as error:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise CaseError(str(next(iter(files), "")), "--out", f"cannot write ({error.strerror or error})") from None
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise
    return list(files)
