"""Write planner/engines/megatron/megatron_lm_flags.txt: every option string Megatron-LM's parser
defines for pretrain_gpt.py in some release from core_v0.16.1 to the newest one a clone holds, taken
from the parser itself, not from a reading of its text: most of its flags are made from
megatron-core's config dataclasses (megatron/training/argument_utils.py, ArgumentGroupFactory).

    python bench/megatron_lm_flags.py [MEGATRON_LM_GIT_DIR] [--check]

MEGATRON_LM_GIT_DIR is a clone of NVIDIA/Megatron-LM (default: the mirror under /work/.mirror). The
releases are its core_vX.Y.Z tags (no release candidates) from core_v0.16.1 on. For each, the parser
is megatron/training/arguments.py's add_megatron_arguments and the extra_args_provider pretrain_gpt.py
hands parse_args (add_modelopt_args of megatron/post_training/arguments.py, in every release so far:
passed whenever nvidia-modelopt is installed); the list is their union, each flag with what argparse
checks of its value (its type where int, float or str, nargs, choices: merge, where releases differ
what any of them takes). The release's megatron/
(training, core, post_training/arguments.py) is taken into a temporary directory, with
megatron/training/__init__.py, utils and global_vars (which pull in the whole training loop) replaced
by stubs, and the modules that import triton at their top (kernels; triton is absent here) by empty
ones; typing.override (Python 3.12, used by core_v0.19.0) is given on older Pythons. Nothing is run
but the parsers' construction. ``--check`` rebuilds the list from the releases the shipped file's
header names and compares (exit 1 where they differ)."""

from __future__ import annotations

import argparse
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "planner" / "engines" / "megatron" / "megatron_lm_flags.txt"
MIRROR = "/work/.mirror/NVIDIA+Megatron-LM/repo"
FIRST = (0, 16, 1)
RELEASE = re.compile(r"core_v(\d+)\.(\d+)\.(\d+)")
# What pretrain_gpt.py hands parse_args as extra_args_provider, and where that function is.
EXTRA = {"add_modelopt_args": "megatron.post_training.arguments"}
UTILS_STUB = '''
def get_device_arch_version(): return 9
def update_use_dist_ckpt(args): pass
def print_rank_0(*a, **k): pass
def warn_rank_0(*a, **k): pass
def is_rank0(): return True
'''
HEADER = """\
# The option strings Megatron-LM's parser defines for pretrain_gpt.py (argparse.ArgumentParser(
# allow_abbrev=False), parse_args without ignore_unknown_args: it refuses any other flag,
# "unrecognized arguments"), in any of the releases below: the union of each release's
# megatron/training/arguments.py add_megatron_arguments (with the flags argument_utils.py makes from
# megatron-core's config dataclasses) and the extra_args_provider its pretrain_gpt.py passes
# (add_modelopt_args, megatron/post_training/arguments.py, wherever nvidia-modelopt is installed).
# Made by bench/megatron_lm_flags.py, which builds each release's parser and lists its actions' option
# strings, each with what argparse checks of its value: nothing after a switch (nargs 0); else its
# type, int, float or str (int() refuses "1.5", float() "abc"; 'value': a function of Megatron-LM's
# or an enum's, not checked here), nargs:N, nargs:+, nargs:* or nargs:? where the action sets it
# (none: one word), and choice:a,b,... (argparse's choices, compared after the type, case-sensitive).
# Where the releases differ, what any of them takes: choices that differ are their union, and a type
# or nargs that differs is 'any' (not checked).
# Releases: {releases}
# {count} option strings, one a line.
"""


def git(git_dir: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True).stdout


def releases(git_dir: str) -> list[str]:
    tags = [t for t in git(git_dir, "tag", "--list", "core_v*").decode().split() if RELEASE.fullmatch(t)]
    key = lambda t: tuple(int(n) for n in RELEASE.fullmatch(t).groups())  # noqa: E731
    return sorted((t for t in tags if key(t) >= FIRST), key=key)


def extra_provider(git_dir: str, ref: str) -> str | None:
    """The extra_args_provider pretrain_gpt.py passes at ref (a name in EXTRA), or None."""
    text = git(git_dir, "show", f"{ref}:pretrain_gpt.py").decode()
    names = set(re.findall(r"extra_args_provider\s*=\s*(\w+)", text))
    unknown = names - set(EXTRA) - {"None"}
    if unknown:
        raise SystemExit(f"{ref}: pretrain_gpt.py passes extra_args_provider={sorted(unknown)}, which this "
                         "script does not know: add it to EXTRA")
    return next(iter(names - {"None"}), None)


def extract(git_dir: str, ref: str, into: Path, utils_stub: str = UTILS_STUB, also: tuple[str, ...] = ()) -> str | None:
    """The release's megatron/training and megatron/core (and the paths ``also`` names) in ``into``, its
    packages made importable, megatron/training's utils and global_vars stubbed (``utils_stub``: the
    device, the ranks) and every module that imports triton a stand-in (none of argument handling needs
    it); the extra_args_provider pretrain_gpt.py passes (a key of EXTRA), or None."""
    extra = extra_provider(git_dir, ref)
    paths = ["megatron/training", "megatron/core", *also] + ([EXTRA[extra].replace(".", "/") + ".py"] if extra else [])
    tarfile.open(fileobj=io.BytesIO(git(git_dir, "archive", "--format=tar", ref, *paths))).extractall(
        into, filter="data")
    megatron = Path(into) / "megatron"
    for package in [megatron] + [p for p in megatron.iterdir() if p.is_dir()]:
        if not (package / "__init__.py").exists():
            (package / "__init__.py").write_text("")
    training = megatron / "training"
    (training / "__init__.py").write_text("")
    if (training / "utils").is_dir():
        shutil.rmtree(training / "utils")
    (training / "utils.py").write_text(utils_stub)
    (training / "global_vars.py").write_text("def set_global_variables(*a, **k): pass\n")
    for module in megatron.rglob("*.py"):  # triton kernels: nothing argument handling needs
        if re.search(r"^(import|from) triton\b", module.read_text(encoding="utf-8"), re.M):
            module.write_text("def __getattr__(name):\n    return lambda *a, **k: None\n")
    return extra


# Run in one Python for all the releases: torch and the other libraries megatron imports are the same for
# each (they are the installed ones), so they are imported once, and each release's parser is built in a
# child forked from there, which imports that release's megatron into a fresh interpreter state (nothing
# of megatron is imported before the fork) and writes its parser's option strings to a file.
PARSERS = """\
import argparse, os, sys, traceback, typing
typing.override = getattr(typing, 'override', lambda f: f)
import torch, torch.distributed, torch.distributed.tensor, torch._dynamo, torch._inductor.compile_fx  # noqa: what torch.compile loads
TYPES = {int: 'int', float: 'float', str: 'str', None: 'str'}
def spec(action):
    # What argparse checks of the action's value: nothing for a switch (nargs 0); its type where it
    # is int, float or str ('value': a function of Megatron's or an enum's, whose refusals are not
    # listed), nargs where set, and choices where they are of that type and words without commas.
    if action.nargs == 0:
        return ''
    kind = TYPES.get(action.type, 'value')
    words = [kind] + ([f'nargs:{action.nargs}'] if action.nargs is not None else [])
    python = {'int': int, 'float': float, 'str': str}.get(kind)
    choices = list(action.choices) if action.choices is not None else None
    if choices and python and all(type(c) is python and str(c) and ',' not in str(c) and not str(c).isspace()
                                  and ' ' not in str(c) for c in choices):
        words.append('choice:' + ','.join(str(c) for c in choices))
    return ' '.join(words)
failed = 0
for tmp, extra, module in zip(*[iter(sys.argv[1:])] * 3):
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            sys.path.insert(0, tmp)
            from megatron.training.arguments import add_megatron_arguments
            parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
            if extra != '-':
                parser = getattr(__import__(module, fromlist=[extra]), extra)(parser)
            import megatron.core; assert megatron.core.__file__.startswith(sys.path[0])
            with open(os.path.join(tmp, 'flags.txt'), 'w') as out:
                out.write(''.join(sorted({f'{o} {spec(a)}'.rstrip() + '\\n' for a in parser._actions
                                          for o in a.option_strings})))
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    failed |= status != 0
sys.exit(failed)
"""


def parsers_flags(git_dir: str, refs: list[str]) -> dict[str, list[str]]:
    """Each release's parser's option strings (ref: sorted list), built in one Python (PARSERS)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = []
        for ref in refs:
            into = Path(tmp) / ref
            into.mkdir()
            extra = extract(git_dir, ref, into)
            args += [str(into), extra or "-", EXTRA[extra] if extra else "-"]
        done = subprocess.run([sys.executable, "-W", "ignore", "-c", PARSERS, *args], capture_output=True, text=True)
        flags = {}
        for ref in refs:
            out = Path(tmp) / ref / "flags.txt"
            if done.returncode and not out.exists():
                raise SystemExit(f"{ref}: the parser could not be built:\n{done.stderr[-3000:]}")
            flags[ref] = [line for line in out.read_text().splitlines() if line.startswith("-")]
        if done.returncode:
            raise SystemExit(f"the parsers could not be built:\n{done.stderr[-3000:]}")
    return flags


def parser_flags(git_dir: str, ref: str) -> list[str]:
    return parsers_flags(git_dir, [ref])[ref]


def union(git_dir: str, refs: list[str]) -> list[str]:
    """Every option string some release's parser defines, each with what argparse checks of its value
    (merge)."""
    return merge(parsers_flags(git_dir, refs).values())


def merge(releases_lines) -> list[str]:
    """One line a flag from each release's ``flag [type] [nargs:N] [choice:a,b]`` lines: what the releases
    that define the flag agree on, so that no value one of them takes is refused. Choices that differ
    (a release adds one) are their union, in the first release's order; a type or nargs that differs (or
    a switch in one release that takes a value in another) leaves the flag unchecked: ``any``."""
    specs: dict[str, list[list[str]]] = {}
    for lines in releases_lines:
        for line in lines:
            flag, *spec = line.split()
            specs.setdefault(flag, []).append(spec)
    merged = []
    for flag, seen in sorted(specs.items()):
        plain = [[w for w in spec if not w.startswith("choice:")] for spec in seen]
        if any(p != plain[0] for p in plain):
            merged.append(f"{flag} any")
            continue
        choices = [next((w[len("choice:"):].split(",") for w in spec if w.startswith("choice:")), None)
                   for spec in seen]
        words = plain[0]
        if all(c is not None for c in choices):
            words = words + ["choice:" + ",".join(dict.fromkeys(c for cs in choices for c in cs))]
        merged.append(" ".join([flag, *words]))
    return merged


def shipped() -> tuple[list[str], list[str]]:
    lines = OUT.read_text().splitlines()
    refs = next(line.split(":", 1)[1].split() for line in lines if line.startswith("# Releases:"))
    return refs, [line for line in lines if line and not line.startswith("#")]


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("git_dir", nargs="?", default=MIRROR)
    cli.add_argument("--check", action="store_true")
    options = cli.parse_args()
    if options.check:
        refs, listed = shipped()
        flags = union(options.git_dir, refs)
        if flags != listed:
            print(f"{OUT}: differs from the parsers of {' '.join(refs)}: "
                  f"missing {sorted(set(flags) - set(listed))[:10]}, "
                  f"extra {sorted(set(listed) - set(flags))[:10]}")
            return 1
        return 0
    refs = releases(options.git_dir)
    flags = union(options.git_dir, refs)
    OUT.write_text(HEADER.format(releases=" ".join(refs), count=len(flags)) + "\n".join(flags) + "\n")
    print(f"{OUT}: {len(flags)} option strings ({' '.join(refs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
