"""Cost-model spec errors as case errors: a :class:`SpecError` names a spec's field
(``Performance.comm_overlap``), a case file's user a key (``cluster.performance.comm_overlap``)."""

from __future__ import annotations

import re


from cost_models.specs import (ClusterSpec, FabricSpec, GPUSpec, HostSpec, Layout, ModelSpec, Overheads, Performance,
                               SpecError, TrainingSpec)

from .errors import CaseError


# Where each cost-model spec sits in a case file: a SpecError names (spec class, field), the case
# file's user a key. GPU specs built for `size`'s cluster.options, from presets or a profile are
# named as the case's cluster.gpu, as all GPU figures are.
SPEC_SECTIONS = {spec.__name__: section for spec, section in (
    (ModelSpec, "model"), (ClusterSpec, "cluster"), (GPUSpec, "cluster.gpu"), (HostSpec, "cluster.gpu.host"),
    (FabricSpec, "cluster.fabric"), (Performance, "cluster.performance"), (TrainingSpec, "training"),
    (Layout, "layout"), (Overheads, "overheads"))}

# Spec fields the case file spells differently (it gives sizes with units, peaks in TFLOP/s).
SPEC_FIELD_KEYS = {("GPUSpec", "memory_bytes"): "memory", ("GPUSpec", "peak_flops"): "peak_tflops",
                   ("HostSpec", "memory_bytes"): "memory"}


def field_key(spec: str, field: str) -> str:
    """A spec's field as its mapping spells it (``GPUSpec.memory_bytes`` is ``memory``); a field's
    sub-key (``peak_flops.bf16``) is kept."""
    name, dot, rest = field.partition(".")
    return f"{SPEC_FIELD_KEYS.get((spec, name), name)}{dot}{rest}"


def spec_key(spec: str, field: str) -> str:
    """The case-file key of a spec's field (``Performance.comm_overlap`` is
    ``cluster.performance.comm_overlap``); a field's sub-key (``peak_flops.bf16``) is kept."""
    return f"{SPEC_SECTIONS.get(spec, spec)}.{field_key(spec, field)}"


def case_key(error: SpecError) -> str:
    """The case-file key of the field a :class:`SpecError` names."""
    return spec_key(error.spec, error.field)


# A message may point at another field than the one it is about ("... (GPUSpec.block_scaling)").
_SPEC_FIELD = re.compile(r"\b(" + "|".join(SPEC_SECTIONS) + r")\.([a-z_][a-z0-9_]*)")


def case_message(message: str) -> str:
    """A :class:`SpecError`'s message with every spec field it names written as its case-file key."""
    return _SPEC_FIELD.sub(lambda m: spec_key(m[1], m[2]), message)


class spec_errors:
    """Turns a cost-model :class:`SpecError` into a :class:`CaseError` for ``source``, at the
    case-file key of the field it names (:func:`case_key`)."""

    def __init__(self, source: str):
        self.source = source

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if isinstance(error, SpecError):
            raise CaseError(self.source, case_key(error), case_message(error.message)) from None
        return False
