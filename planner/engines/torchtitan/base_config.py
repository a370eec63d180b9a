"""The base config a torchtitan 0.3.0 command line names (``--module M --config F``), read from its
source as ConfigManager would build it, without running it (a config registry imports the whole
training stack: triton, datasets, torchao).

torchtitan's ``ConfigManager._load_config`` (``config/manager.py``) imports ``M.config_registry``
(``torchtitan.models.M``, then ``torchtitan.experiments.M``) or ``M`` itself, calls ``F()`` for a
``Trainer.Config`` and applies the ``--section.key`` overrides on top. Its model configs
(``models/*/config_registry.py``) return one ``Trainer.Config(...)`` whose sections are
``TrainingConfig(...)``, ``ParallelismConfig(...)``, ``CompileConfig(...)``, an activation-checkpoint
config and a loss: their literal fields are read here. The planner's own config module
(``emit.CONFIG_MODULE``, beside the launch script) is read the same way: its PARALLELISM,
TRAINING and COMPILE dicts and its checkpointing and loss chunks, over its own base config.

A function of another shape (one that edits another config, or computes a field) is not read:
:func:`read_base` returns None, and the reader says the base was not loaded.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from planner.inputs import read_text

from .emit import BASE_LOSS_CHUNKS, CONFIG_FILE, CONFIG_FUNCTION, CONFIG_MODULE

SECTIONS = {"TrainingConfig": "training", "ParallelismConfig": "parallelism", "CompileConfig": "compile"}
AC_CONFIGS = {"FullAC.Config": "full", "SelectiveAC.Config": "selective"}
LOSS_CHUNKS = {"ChunkedLossWrapper.Config": BASE_LOSS_CHUNKS, "CrossEntropyLoss.Config": 1}


@dataclass(frozen=True)
class BaseConfig:
    """What a base config sets: {"section.key": value} as Python values, its checkpointing mode
    (None where it leaves Trainer.Config's), and the file it was read from."""

    values: dict
    ac_mode: Optional[str]
    source: str


def read_base(module: str, function: str, beside: Path) -> Optional[BaseConfig]:
    """The base config ``--module module --config function`` builds, or None where it cannot be read
    (torchtitan not installed, the function not a literal ``Trainer.Config(...)``). ``beside``: the
    folder of the launch file, where the planner's own config module sits."""
    if module == CONFIG_MODULE and function == CONFIG_FUNCTION:
        return _read_own(beside / CONFIG_FILE)
    path = _registry_file(module)
    if path is None:
        return None
    found = _function(path, function)
    if found is None:
        return None
    returned = [node.value for node in ast.walk(found) if isinstance(node, ast.Return)]
    if len(returned) != 1 or not _is_call(returned[0], "Trainer.Config"):
        return None
    values: dict[str, Any] = {}
    ac_mode = None
    for keyword in returned[0].keywords:
        value = keyword.value
        if keyword.arg in ("training", "parallelism", "compile") and isinstance(value, ast.Call):
            section = SECTIONS.get(ast.unparse(value.func))
            if section is None:
                return None
            for field in value.keywords:
                try:
                    values[f"{section}.{field.arg}"] = ast.literal_eval(field.value)
                except ValueError:
                    return None  # a computed field: not what ConfigManager would see without running it
        elif keyword.arg == "activation_checkpoint":
            ac_mode = "none" if _is_none(value) else AC_CONFIGS.get(ast.unparse(value.func)) \
                if isinstance(value, ast.Call) else None
            if ac_mode is None:
                return None
        elif keyword.arg == "loss" and isinstance(value, ast.Call):
            chunks = LOSS_CHUNKS.get(ast.unparse(value.func))
            given = [k for k in value.keywords if k.arg == "num_chunks"]
            if given:
                try:
                    chunks = ast.literal_eval(given[0].value)
                except ValueError:
                    return None
            if chunks is not None:
                values["loss.num_chunks"] = chunks
    return BaseConfig(values, ac_mode, str(path))


def _read_own(path: Path) -> Optional[BaseConfig]:
    """The planner's config module (emit._config_module): its dicts over its own base config."""
    if not path.is_file():
        return None
    try:
        tree = ast.parse(read_text(path))
    except SyntaxError:
        return None
    names: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                names[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    base_module, base_function = str(names.get("BASE_MODULE", "")), str(names.get("BASE_CONFIG", ""))
    below = read_base(base_module.removeprefix("torchtitan.models.").removesuffix(".config_registry"),
                      base_function, path.parent) if base_module and base_function else None
    values = dict(below.values) if below else {}
    for section, name in (("parallelism", "PARALLELISM"), ("training", "TRAINING"), ("compile", "COMPILE")):
        table = names.get(name)
        if not isinstance(table, dict):
            return None
        values.update({f"{section}.{key}": value for key, value in table.items()})
    if names.get("LOSS_CHUNKS") is not None:
        values["loss.num_chunks"] = names["LOSS_CHUNKS"]
    mode = names.get("ACTIVATION_CHECKPOINT")
    return BaseConfig(values, mode if isinstance(mode, str) else (below.ac_mode if below else None), str(path))


def _registry_file(module: str) -> Optional[Path]:
    """Where ConfigManager finds ``module``'s config registry in the installed torchtitan (its
    models, then its experiments), without importing torchtitan."""
    try:
        spec = importlib.util.find_spec("torchtitan")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    for package in ("models", "experiments"):
        path = root.joinpath(package, *parts, "config_registry.py")
        if path.is_file():
            return path
    return None


def _function(path: Path, name: str) -> Optional[ast.FunctionDef]:
    try:
        tree = ast.parse(read_text(path))
    except SyntaxError:
        return None
    return next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name), None)


def _is_call(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func) == name


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None
