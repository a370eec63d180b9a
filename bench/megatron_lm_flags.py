"""Write planner/engines/megatron/megatron_lm_flags.txt: every option string Megatron-LM's parser
defines, taken from the parser itself (megatron/training/arguments.py's add_megatron_arguments, at
Megatron-LM core_v0.16.1), not from a reading of its text: most of its flags are made from
megatron-core's config dataclasses (megatron/training/argument_utils.py, ArgumentGroupFactory).

    python bench/megatron_lm_flags.py [MEGATRON_LM_GIT_DIR] [REF]

MEGATRON_LM_GIT_DIR is a clone of NVIDIA/Megatron-LM (default: the mirror under /work/.mirror), REF
its tag (default core_v0.16.1). The training package is taken from the clone at REF into a temporary
directory, with megatron/training/__init__.py and utils.py (which pull in the whole training loop)
replaced by stubs; megatron-core is the installed one (of the same release). Nothing is run but the
parser's construction. ``--check`` compares the shipped list with the parser instead of writing it
(exit 1 where they differ)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "planner" / "engines" / "megatron" / "megatron_lm_flags.txt"
MIRROR = "/work/.mirror/NVIDIA+Megatron-LM/repo"
REF = "core_v0.16.1"
# The training modules the parser's construction imports.
MODULES = ("arguments.py", "argument_utils.py", "common_config.py", "training_config.py", "resilience_config.py")
UTILS_STUB = '''
def get_device_arch_version(): return 9
def update_use_dist_ckpt(args): pass
def print_rank_0(*a, **k): pass
def warn_rank_0(*a, **k): pass
def is_rank0(): return True
'''
HEADER = """\
# The option strings Megatron-LM's parser defines (argparse.ArgumentParser(allow_abbrev=False),
# parse_args without ignore_unknown_args: it refuses any other flag, "unrecognized arguments").
# Derived from Megatron-LM core_v0.16.1 megatron/training/arguments.py (add_megatron_arguments, with
# the flags argument_utils.py makes from megatron-core's config dataclasses) by
# bench/megatron_lm_flags.py, which builds the parser and lists its actions' option strings.
# {count} option strings, one a line.
"""


def parser_flags(git_dir: str, ref: str) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        training = Path(tmp) / "megatron" / "training"
        training.mkdir(parents=True)
        for name in MODULES:
            text = subprocess.run(["git", "--git-dir", git_dir, "show", f"{ref}:megatron/training/{name}"],
                                  check=True, capture_output=True, text=True).stdout
            (training / name).write_text(text)
        (training / "__init__.py").write_text("")
        (training / "utils.py").write_text(UTILS_STUB)
        code = (f"import sys, argparse; sys.path.insert(0, {tmp!r})\n"
                "from megatron.training.arguments import add_megatron_arguments\n"
                "parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))\n"
                "print('\\n'.join(sorted({o for a in parser._actions for o in a.option_strings})))\n")
        done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True, capture_output=True, text=True)
    return [line for line in done.stdout.splitlines() if line.startswith("-")]


def shipped() -> list[str]:
    return [line for line in OUT.read_text().splitlines() if line and not line.startswith("#")]


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("git_dir", nargs="?", default=MIRROR)
    cli.add_argument("ref", nargs="?", default=REF)
    cli.add_argument("--check", action="store_true")
    options = cli.parse_args()
    flags = parser_flags(options.git_dir, options.ref)
    if options.check:
        if flags != shipped():
            print(f"{OUT}: differs from {options.ref}'s parser: missing {sorted(set(flags) - set(shipped()))[:10]}, "
                  f"extra {sorted(set(shipped()) - set(flags))[:10]}")
            return 1
        return 0
    OUT.write_text(HEADER.format(count=len(flags)) + "\n".join(flags) + "\n")
    print(f"{OUT}: {len(flags)} option strings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
