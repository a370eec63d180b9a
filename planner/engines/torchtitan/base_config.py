"""The base config a torchtitan 0.3.0 command line names (``--module M --config F``), read from its
source as ConfigManager would build it, without running it (a config registry imports the whole
training stack: triton, datasets, torchao).

torchtitan's ``ConfigManager._load_config`` (``config/manager.py``) imports ``M.config_registry``
(``torchtitan.models.M``, then ``torchtitan.experiments.M``) or ``M`` itself, calls ``F()`` for a
``Trainer.Config`` and applies the ``--section.key`` overrides on top. Its model configs
(``models/*/config_registry.py``) take one of two shapes: one ``Trainer.Config(...)`` whose sections are
``TrainingConfig(...)``, ``ParallelismConfig(...)``, ``CompileConfig(...)``, an activation-checkpoint
config and a loss; or another function's config with sections or fields set on it. Their literal
fields are read here (:func:`_read_function`). The planner's own config module (``emit.CONFIG_MODULE``,
beside the launch script) is read the same way: its PARALLELISM, TRAINING, COMPILE (and OPTIMIZER) dicts and its
checkpointing and loss chunks, over its own base config; and what its apply_layout rebuilds the model
spec with (MTP_LAYERS, CONVERTERS), which no command-line option sets.

A function of another shape (a branch, a loop, a computed field) is not read: :func:`read_base`
returns None, and the reader says the base was not loaded.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from planner.inputs import read_text

from .emit import BASE_LOSS_CHUNKS, CONFIG_FILE, CONFIG_FUNCTION, CONFIG_MODULE

SECTIONS = {"TrainingConfig": "training", "ParallelismConfig": "parallelism", "CompileConfig": "compile",
            "DebugConfig": "debug"}
AC_CONFIGS = {"FullAC.Config": "full", "SelectiveAC.Config": "selective"}
LOSS_CHUNKS = {"ChunkedLossWrapper.Config": BASE_LOSS_CHUNKS, "CrossEntropyLoss.Config": 1}
# Set where the base config's loss runs on whole logits (a loss other than ChunkedLossWrapper, or the
# planner's own LOSS_CHUNKS = 1 without CHUNKED_LOSS): its one "chunk" is not ChunkedLossWrapper's
# (activations.chunked_loss). No command-line option is spelt so (tyro's are dotted).
WHOLE_LOGITS = "loss:whole_logits"


@dataclass(frozen=True)
class NotLiteral:
    """A name of the planner's config module assigned something other than a literal (its source text):
    the reader does not run the file, so it cannot say what the name holds."""

    text: str


# The names of the planner's config module that apply_layout rebuilds the model spec with
# (emit._config_module: MODEL_REGISTRY's model_registry(MODEL_FLAVOR, converters=converters(),
# num_mtp_layers=MTP_LAYERS)).
MODEL_NAMES = ("MTP_LAYERS", "CONVERTERS", "MODEL_REGISTRY", "MODEL_FLAVOR")


@dataclass(frozen=True)
class BaseConfig:
    """What a base config sets: {"section.key": value} as Python values, its checkpointing mode
    (None where it leaves Trainer.Config's), and the file it was read from. ``model``: for the planner's
    own config module only, its MODEL_NAMES as written (a NotLiteral where not a literal; absent where
    the file does not assign them), which the reader checks against the case."""

    values: dict
    ac_mode: Optional[str]
    source: str
    model: Optional[dict[str, Any]] = None


def read_base(module: str, function: str, beside: Path) -> Optional[BaseConfig]:
    """The base config ``--module module --config function`` builds, or None where it cannot be read
    (torchtitan not installed, a function of another shape). ``beside``: the folder of the launch
    file, where the planner's own config module sits. ``module`` as ConfigManager takes it: the
    shorthand (``llama3``) or the full path (``torchtitan.models.llama3[.config_registry]``)."""
    if module == CONFIG_MODULE and function == CONFIG_FUNCTION:
        return _read_own(beside / CONFIG_FILE)
    path = _registry_file(module)
    if path is None:
        return None
    try:
        tree = ast.parse(read_text(path))
    except SyntaxError:
        return None
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    return _read_function(functions, function, str(path), depth=0)


# Helpers a registry function may call on its config that touch nothing the reader reads
# (deepseek_v3/config_registry.py ``enable_fused_swiglu``: it appends to ``config.override.imports``).
OVERRIDE_HELPERS = ("enable_fused_swiglu",)
# Trainer.Config's sections the reader does not read, which a function may set as it likes.
UNREAD = ("hf_assets_path", "dump_folder", "profiler", "metrics", "tokenizer", "dataloader", "lr_scheduler",
          "checkpoint", "comm", "validator", "override")
# DebugConfig (config/configs.py) is read field by field (SECTIONS) as the command line's --debug.<field>:
# torchtitan runs the base config's value unless an override changes it, and moe_force_load_balance (the
# routing), batch_invariant (Trainer.Config refuses it), deterministic and detect_anomaly (slower kernels,
# anomaly checks) change the run.
# The optimizer section (components/optimizer/optimizer.py): of it the reader reads implementation only, which
# decides the dtype of Adam's moments (OptimizersContainer.Config; default "fused", as default_adamw leaves it).
# A call other than these builds an optimizer config the reader cannot see into: its implementation is not read.
OPTIMIZER_CONFIGS = ("OptimizersContainer.Config", "default_adamw")
# The model spec's expert dispatch (model_registry's keywords): Trainer.Config._validate_cuda_graphs runs
# CUDA graphs with expert parallelism only for MinimalAsyncEP, or HybridEP with a non-blocking capacity.
DISPATCH_KEYWORDS = ("moe_comm_backend", "non_blocking_capacity_factor")
DEPTH = 8  # configs built on configs: llama3_8b_mxfp8 on llama3_8b


def _read_function(functions: dict, name: str, source: str, depth: int) -> Optional[BaseConfig]:
    """A registry function of one of its two shapes, statement by statement: locals, then one
    ``return Trainer.Config(...)``; or ``config = other()`` (another function of the file), then
    assignments to ``config.section``, ``config.section.field``, ``config.loss`` and kin, then
    ``return config``. Any other statement (a branch, a loop, a call that may edit the config) and
    any value that is no literal where the reader reads it make the function unreadable: None."""
    found = functions.get(name)
    if found is None or depth > DEPTH:
        return None
    names: dict[str, ast.AST] = {}  # the function's locals, as written
    config: Optional[str] = None  # the local holding another function's config
    state: dict[str, Any] = {}
    for statement in found.body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # the docstring
        if isinstance(statement, ast.FunctionDef):
            continue  # a local helper (sft_qwen3_8b_math's process_sample): its returns are its own
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call) \
                and ast.unparse(statement.value.func) in OVERRIDE_HELPERS:
            continue
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
            if isinstance(target, ast.Name):
                if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in functions \
                        and not value.args and not value.keywords:
                    below = _read_function(functions, value.func.id, source, depth + 1)
                    if below is None:
                        return None
                    config, state = target.id, {"values": dict(below.values), "ac_mode": below.ac_mode}
                else:
                    names[target.id] = value
                continue
            chain = _attribute_chain(target)
            if config is not None and chain and chain[0] == config and len(chain) > 1:
                if not _apply(state, chain[1:], value, names):
                    return None
                continue
            return None
        if isinstance(statement, ast.Return):
            value = statement.value
            if config is not None and isinstance(value, ast.Name) and value.id == config:
                return BaseConfig(state["values"], state["ac_mode"], source)
            if config is None and _is_call(value, "Trainer.Config"):
                state = {"values": {}, "ac_mode": None}
                if all(_apply(state, [keyword.arg], keyword.value, names) for keyword in value.keywords):
                    return BaseConfig(state["values"], state["ac_mode"], source)
            return None
        return None
    return None


def _apply(state: dict, path: list[str], value: ast.AST, names: dict) -> bool:
    """``config.<path> = value`` on what the reader reads (False where it cannot say what it sets)."""
    if isinstance(value, ast.Name) and value.id in names:
        value = names[value.id]
    values = state["values"]
    head = path[0]
    if head in UNREAD:
        return True
    if head == "optimizer":
        if len(path) == 1:
            values.pop("optimizer.implementation", None)  # replaced whole: the new one's, or the default
            if isinstance(value, ast.Call) and ast.unparse(value.func) in OPTIMIZER_CONFIGS:
                given = [k for k in value.keywords if k.arg == "implementation"]
                if given and ast.unparse(value.func) == OPTIMIZER_CONFIGS[0]:
                    try:
                        values["optimizer.implementation"] = ast.literal_eval(given[0].value)
                    except ValueError:
                        return False
            return True
        if path[1:] == ["implementation"]:
            try:
                values["optimizer.implementation"] = ast.literal_eval(value)
            except ValueError:
                return False
        return True  # the learning rate, the groups: not priced
    if head in SECTIONS.values():
        if len(path) == 1:
            if not isinstance(value, ast.Call) or SECTIONS.get(ast.unparse(value.func)) != head or value.args:
                return False
            for key in [k for k in values if k.startswith(head + ".")]:
                del values[key]  # a section replaced whole: its fields are the new one's or the defaults
            return all(_apply(state, [head, field.arg], field.value, names) for field in value.keywords)
        if len(path) == 2:
            try:
                values[f"{head}.{path[1]}"] = ast.literal_eval(value)
            except ValueError:
                return False
            return True
        return False
    if path == ["activation_checkpoint"]:
        mode = "none" if _is_none(value) else \
            AC_CONFIGS.get(ast.unparse(value.func)) if isinstance(value, ast.Call) else None
        state["ac_mode"] = mode
        return mode is not None
    if path == ["loss"]:
        if not isinstance(value, ast.Call):
            return False
        # ChunkedLossWrapper in its chunks (8 by default); any other loss (CrossEntropyLoss, MTPLoss) on
        # whole logits.
        chunks = LOSS_CHUNKS.get(ast.unparse(value.func), 1)
        given = [k for k in value.keywords if k.arg == "num_chunks"]
        if given:
            try:
                chunks = ast.literal_eval(given[0].value)
            except ValueError:
                return False
        values["loss.num_chunks"] = chunks
        if ast.unparse(value.func) != "ChunkedLossWrapper.Config":
            values[WHOLE_LOGITS] = True
        return True
    if path == ["model_spec"]:
        # What the reader needs of the model: its expert dispatch (the rest is the case's).
        for key in DISPATCH_KEYWORDS:
            values.pop(f"model_spec.{key}", None)
        if isinstance(value, ast.Call):
            for keyword in value.keywords:
                if keyword.arg in DISPATCH_KEYWORDS:
                    try:
                        values[f"model_spec.{keyword.arg}"] = ast.literal_eval(keyword.value)
                    except ValueError:
                        return False
        return True
    return False


def _attribute_chain(node: ast.AST) -> Optional[list[str]]:
    """``config.training.seq_len`` as ["config", "training", "seq_len"]; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id] + parts[::-1]


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
        # NAME = value, or NAME: type = value (an annotated assignment binds the name alike)
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target = node.target
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                names[target.id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                # Kept for the model's names, whose refusal says it is no literal (the others read as before).
                names[target.id] = NotLiteral(ast.unparse(node.value))
    base_module, base_function = (names.get(name) for name in ("BASE_MODULE", "BASE_CONFIG"))
    base_module = base_module if isinstance(base_module, str) else ""
    base_function = base_function if isinstance(base_function, str) else ""
    below = read_base(base_module, base_function, path.parent) if base_module and base_function else None
    values = dict(below.values) if below else {}
    for section, name in (("parallelism", "PARALLELISM"), ("training", "TRAINING"), ("compile", "COMPILE")):
        table = names.get(name)
        if not isinstance(table, dict):
            return None
        values.update({f"{section}.{key}": value for key, value in table.items()})
    if isinstance(names.get("OPTIMIZER"), dict):  # written where the plan keeps Adam's moments in bf16
        values.update({f"optimizer.{key}": value for key, value in names["OPTIMIZER"].items()})
    if names.get("LOSS_CHUNKS") is not None and not isinstance(names["LOSS_CHUNKS"], NotLiteral):
        values["loss.num_chunks"] = names["LOSS_CHUNKS"]
        # apply_layout: LOSS_CHUNKS 1 is the loss on whole logits unless CHUNKED_LOSS keeps the wrapper
        # (files emitted before CHUNKED_LOSS have none: whole logits).
        if names["LOSS_CHUNKS"] == 1 and names.get("CHUNKED_LOSS") is not True:
            values[WHOLE_LOGITS] = True
    state = {"values": values, "ac_mode": None}
    for function in (node for node in tree.body if isinstance(node, ast.FunctionDef)
                     and node.name in ("apply_layout", CONFIG_FUNCTION)):
        # A debug field or the optimizer's implementation set in apply_layout (or the config function) by hand:
        # torchtitan runs it, as it runs a base config's (the emitted file sets neither). Other edits there are
        # not read.
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                chain = _attribute_chain(node.targets[0])
                if chain and len(chain) > 1 and chain[1] in ("debug", "optimizer") \
                        and not _apply(state, chain[1:], node.value, {}):
                    return None
    mode = names.get("ACTIVATION_CHECKPOINT")
    model = {name: names[name] for name in MODEL_NAMES if name in names}
    return BaseConfig(values, mode if isinstance(mode, str) else (below.ac_mode if below else None), str(path),
                      model)


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
    for prefix in ("torchtitan.models.", "torchtitan.experiments."):  # ConfigManager's full paths
        module = module.removeprefix(prefix)
    parts = module.removesuffix(".config_registry").split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    for package in ("models", "experiments"):
        path = root.joinpath(package, *parts, "config_registry.py")
        if path.is_file():
            return path
    return None


def _is_call(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func) == name


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None
