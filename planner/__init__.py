"""layout-planner: the fastest training layout that fits, at the global batch you chose; and how
many GPUs of which type a run of so many tokens needs."""

import sys
import types
from importlib import import_module
from typing import TYPE_CHECKING

from .api_values import plain_arguments

if TYPE_CHECKING:
    # What a type checker sees of the names below, which load on first use: without these, mypy knew
    # none of them ("Module has no attribute plan") and every result was Any. Never run, so importing
    # the package still loads nothing.
    from .case import Layout
    from .configs import Emitted, diagnose, emit, read_config
    from .diagnose import Diagnosis
    from .errors import CaseError
    from .estimate import Estimate, estimate
    from .learn import Fit, calibrate_from_logs, calibrate_from_runs
    from .plan import NoFit, Plan, plan
    from .size import SizeChoice, Sizing, size

__all__ = ["CaseError", "Diagnosis", "Emitted", "Estimate", "Fit", "Layout", "NoFit", "Plan", "SizeChoice", "Sizing",
           "calibrate_from_logs", "calibrate_from_runs", "diagnose", "emit", "estimate", "plan", "read_config", "size"]

# The API loads when first asked for, so that a command imports only what it runs (`plan` never
# loads the fit of `learn`, nor `size` its sweep) and the command's entry point
# (:mod:`planner.entry`) sets its signal handlers before anything heavy: name -> its module.
_LAZY = {"CaseError": "errors", "Estimate": "estimate", "estimate": "estimate", "Emitted": "configs", "emit": "configs",
         "read_config": "configs", "diagnose": "configs", "Diagnosis": "diagnose", "calibrate_from_runs": "learn",
         "calibrate_from_logs": "learn", "Fit": "learn", "Plan": "plan", "plan": "plan", "NoFit": "plan",
         "Sizing": "size", "SizeChoice": "size", "size": "size", "Layout": "case"}


class _Package(types.ModuleType):
    """The package, whose API names above resolve on first use. Five of them (``estimate``,
    ``plan``, ``size``, ``emit``, ``diagnose``) are also the names of submodules, which the import system binds to
    the package's attribute of that name once it loads them: the package's attribute stays the API's.
    Any other submodule loads on first use too (``planner.learn.render``, as the docs write it)."""

    def __getattr__(self, name: str):
        if name == "__version__":  # what `layout-planner --version` says, read when first asked (not at import)
            from importlib.metadata import PackageNotFoundError, version

            try:
                self.__dict__[name] = version("layout-planner")
            except PackageNotFoundError:  # run from a checkout that was never installed
                self.__dict__[name] = "0+unknown"
            return self.__dict__[name]
        if name.startswith("__"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        try:
            return import_module(f".{name}", __name__)
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def _api_name(name: str, module: str) -> property:
    def get(package: types.ModuleType):
        if name not in package.__dict__:  # set by hand (a test's monkeypatch), else loaded on first use
            try:
                value = getattr(import_module(f".{module}", __name__), name)
                # A function takes numpy scalars and paths as the case schema's values (api_values).
                if isinstance(value, types.FunctionType):
                    value = plain_arguments(value)
                    # Named as the package's own, where pickle looks it up (planner.plan, not the submodule's
                    # unwrapped function): a process pool hands it to its workers.
                    value.__module__, value.__qualname__ = __name__, name
                package.__dict__[name] = value
            except AttributeError as error:
                # Raised out of a property, it would read as "module 'planner' has no attribute 'plan'"
                # (an import cut short by Ctrl-C leaves a dependency half-loaded): say what failed.
                raise ImportError(f"planner.{name} could not be loaded: {error}") from error
        return package.__dict__[name]

    def set_(package: types.ModuleType, value) -> None:
        if not isinstance(value, types.ModuleType):  # a submodule bound by the import system is not the API's
            package.__dict__[name] = value

    def delete(package: types.ModuleType) -> None:
        package.__dict__.pop(name, None)

    return property(get, set_, delete)


for _name, _module in _LAZY.items():
    setattr(_Package, _name, _api_name(_name, _module))


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


sys.modules[__name__].__class__ = _Package
