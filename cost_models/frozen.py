"""A hash computed once for the frozen specs the cost models cache on."""

from __future__ import annotations

from dataclasses import fields


def cached_hash(spec) -> int:
    """The hash of a frozen spec, computed once: the cost models cache on specs, and a search
    looks them up hundreds of thousands of times (a mixture of experts' model spec has 30
    fields). Equal specs hash alike: the fields hashed are those the dataclass compares and
    hashes."""
    cached = spec.__dict__.get("_hash")
    if cached is None:
        cached = hash(tuple(getattr(spec, f.name) for f in fields(spec)
                            if (f.hash if f.hash is not None else f.compare)))
        object.__setattr__(spec, "_hash", cached)
    return cached
