"""The error every spec raises for a field it cannot use, and the field checks the specs share.

Validation lives in the specs themselves (as Megatron-core's ``TransformerConfig.__post_init__``
does): a spec that exists is a spec the cost models can use. Each failure raises
:class:`SpecError` naming the field, so a caller that knows where the value came from (a case
file) can say so.
"""

from __future__ import annotations

import math


class SpecError(ValueError):
    """A spec field holds a value the cost models cannot use.

    The error names the field in the cost models' own terms: ``spec`` is the name of the spec
    class that holds it (``"Layout"``, ``"ModelSpec"``), ``field`` the field's name there
    (``"tp"``, ``"hidden_size"``; a mapping's entry as ``"peak_flops.bf16"``). Where the spec's
    values came from (a case file, a launch command) is the caller's to say: the case layer
    turns ``(spec, field)`` into the case-file key (``planner.case.case_key``).
    """

    def __init__(self, spec: "type | str", field: str, message: str):
        name = spec if isinstance(spec, str) else spec.__name__
        super().__init__(f"{name}.{field}: {message}")
        self.spec = name
        self.field = field
        self.message = message

    def __reduce__(self):
        return type(self), (self.spec, self.field, self.message)  # pickled by its parts, as it is built


def _positive_int(spec: "type | str", name: str, value: object) -> None:
    if type(value) is int and value >= 1:  # the common case first: a search builds layouts by the million
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(spec, name, f"expected a positive integer, got {value!r}")


def _non_negative_int(spec: "type | str", name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(spec, name, f"expected a non-negative integer, got {value!r}")


def _positive_float(spec: "type | str", name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(spec, name, f"expected a positive number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise SpecError(spec, name, f"expected a positive finite number, got {value!r}")


def _choice(spec: "type | str", name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(spec, name, f"expected one of {', '.join(choices)}, got {value!r}")
