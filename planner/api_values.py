"""Values a Python caller hands the API, as the case-file schema reads them.

An orchestration job builds its cases from what it has: a pandas sweep's rows give numpy integers
and floats (``np.int64(4)`` for a tp of 4), a pipeline's paths are ``pathlib.Path`` objects. A case
file read from YAML never holds either, and the readers (:mod:`planner.fields`) take Python's own
types only, so the public functions take every argument through :func:`plain` first: numpy scalars
become the Python numbers (and booleans) they hold (not dates and durations, whose item may be an
integer of nanoseconds), arrays the lists they hold, tuples inside a dict case the lists the schema
takes, a :class:`Layout` there (a plan's ``best.job.layout``) the case-file section it gives as
``to_dict()``, ``os.PathLike`` values their path strings, and a subclass of int, float or str (an
``IntEnum``, a ``str`` Enum, numpy's ``str_``) the plain value it holds. The
caller's own objects are never changed; anything else is left for the readers to accept or refuse.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar, Union

F = TypeVar("F", bound=Callable[..., Any])

# What the public functions' hints say they take, as :func:`plain` hands it on: a number as Python's or
# a numpy scalar (a pandas sweep's np.int64), a path as str or any os.PathLike (a pathlib.Path, a
# pipeline's own path type), a case as such a path or any mapping in the case-file schema (made a dict).
if TYPE_CHECKING:
    import numpy  # ortools installs it

    IntArg = Union[int, numpy.integer[Any]]
    FloatArg = Union[float, numpy.integer[Any], numpy.floating[Any]]  # an int is a float to a type checker
    BoolArg = Union[bool, numpy.bool_]
    NumpyArray = numpy.ndarray[Any, Any]
else:
    # At run time the hints name Python's own types: the planner never loads numpy (docs/speed.md), and a
    # name left unresolved made typing.get_type_hints(planner.diagnose) raise NameError.
    IntArg, FloatArg, BoolArg, NumpyArray = int, float, bool, list
PathArg = Union[str, os.PathLike[str]]
CaseArg = Union[Mapping[str, Any], PathArg]
# Where one value or several are taken (calibrate_from_logs' logs and cases): a list or a tuple of them.
# Sequence, not list, as list is invariant: a caller's list[Path] is no list[PathArg] to a type checker.
LogsArg = Union[PathArg, Sequence[PathArg]]
CasesArg = Union[CaseArg, Sequence[CaseArg]]
# A pipeline's stage_layers: (16, 16) or [16, 16] (or a numpy array's tolist()), as the readers take either.
StageLayersArg = Union[Sequence[IntArg], NumpyArray]


# The deepest a case's values are looked into: past it a structure is left as given, for the readers
# to refuse by name (a value nested past Python's recursion limit is, in tests/test_api_service.py).
MAX_DEPTH = 64


def plain(value: Any) -> Any:
    """``value`` with every numpy scalar and os.PathLike in it (through mappings, made dicts, lists and tuples, MAX_DEPTH
    deep) made the Python value it stands for; a structure that holds itself is left as it is where it
    recurs."""
    memo: dict[tuple[int, bool], Any] = {}
    made: list[Any] = []

    def walk(v: Any, depth: int = 0, in_case: bool = False) -> Any:
        if isinstance(v, (Mapping, list, tuple)) and depth < MAX_DEPTH:
            key = (id(v), in_case)  # a tuple shared in and out of a dict case is converted in it alone
            if key in memo:  # a shared part is converted once; a cycle stays the caller's object
                return memo[key]
            memo[key] = v
            if isinstance(v, Mapping):
                # Any mapping (a types.MappingProxyType, a frozen dict) is the dict the readers take: one
                # was refused as "expected a mapping, got mappingproxy". One whose items cannot be read is
                # left for the readers to refuse.
                try:
                    items = list(v.items())
                except Exception:
                    return v
                out: Any = {k: walk(x, depth + 1, True) for k, x in items}
            elif isinstance(v, list) or in_case:
                # Inside a dict case a tuple is the list the schema takes (stage_layers=(16, 16)), as
                # YAML's sequences are: the readers take lists.
                out = [walk(x, depth + 1, in_case) for x in v]
            else:
                out = tuple(walk(x, depth + 1) for x in v)
            memo[key] = out
            return out
        if in_case and _is_layout(v):
            # The layout a result carries (plan(...).best.job.layout, read_config's) put back into a case, to
            # estimate a variant: its case-file section, which it gives as to_dict() (the section's schema).
            # Kept for the walk: ``memo`` is keyed by id, which a freed section's successor could take.
            made.append(v.to_dict())
            return walk(made[-1], depth, in_case)
        if isinstance(v, (int, float, str)) and type(v) not in _PLAIN:
            return _held(v)
        if isinstance(v, os.PathLike):
            try:
                path = os.fspath(v)
            except Exception:  # a __fspath__ that raises, or returns no path: the readers refuse the value
                return v
            return path if isinstance(path, str) else v
        if type(v).__module__ == "numpy" and hasattr(v, "dtype"):
            if getattr(v, "ndim", None) == 0 and v.dtype.kind in "biuf":
                return v.item()  # np.int64(4) -> 4, np.float32(0.5) -> 0.5, np.bool_(True) -> True
            if getattr(v, "ndim", 0) >= 1 and depth < MAX_DEPTH:
                return walk(v.tolist(), depth)  # an array: the list it holds, which no reader takes for one value
        return v

    return walk(value)


def _is_layout(v: Any) -> bool:
    """Whether ``v`` is the project's own Layout (cost_models.layout_spec), looked up where it is loaded: no
    Layout exists before its module is, and the package's import loads nothing it need not (docs/speed.md)."""
    module = sys.modules.get("cost_models.layout_spec")
    return module is not None and isinstance(v, module.Layout)


# The types the readers keep as given. A subclass of one (an IntEnum, a str Enum, numpy's str_ and
# float64) passes their isinstance checks and was echoed into to_dict()'s layout as given: no plain
# JSON type, and a str Enum formats as "Engine.MEGATRON" in a message.
_PLAIN = (int, float, str, bool)


def _held(v: Any) -> Any:
    """The int, float or str a subclass's instance holds, through the base type's own conversion (str()
    of a str Enum is its member's name, not its value)."""
    for base in (int, float, str):  # bool is no subclass anyone makes: it cannot be subclassed
        if isinstance(v, base):
            return getattr(base, f"__{base.__name__}__")(v)
    return v


def plain_arguments(function: F) -> F:
    """``function`` with its arguments taken through :func:`plain`."""
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return function(*(plain(a) for a in args), **{k: plain(v) for k, v in kwargs.items()})
    return wrapper  # type: ignore[return-value]
