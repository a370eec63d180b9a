"""A hash computed once for the frozen specs the cost models cache on, and a property computed once."""

from __future__ import annotations

from dataclasses import fields


def cached_hash(spec) -> int:
    """The hash of a frozen spec, computed once: the cost models cache on specs, and a search
    looks them up hundreds of thousands of times (a mixture of experts' model spec has 30
    fields). Equal specs hash alike: the fields hashed are those the dataclass compares and
    hashes."""
    try:
        return spec._hash  # the instance's own, once computed: no field of a spec is named _hash
    except AttributeError:
        pass
    cached = hash(tuple(getattr(spec, f.name) for f in fields(spec)
                        if (f.hash if f.hash is not None else f.compare)))
    object.__setattr__(spec, "_hash", cached)
    return cached


def state_without_hash(spec) -> dict:
    """A spec's pickled state, less its cached hash (``__getstate__`` beside ``__hash__ = cached_hash``):
    Python salts the hashes of strings per process (PYTHONHASHSEED), so a hash carried into another
    process would differ from an equal spec's there, and every dict lookup of the one by the other miss."""
    state = dict(spec.__dict__)
    state.pop("_hash", None)
    return state


class cached_property:  # noqa: N801 - named as functools' is
    """``functools.cached_property`` without its lock: the value computed on the first read is kept in
    the instance's ``__dict__``, where later reads find it before the descriptor (as functools' does).
    Python 3.11's takes an RLock on every first read, a tenth of the reads' cost in a search that builds
    thousands of jobs (3.12 dropped the lock). A frozen spec's value is a function of its fields:
    computed twice in a race, the same value."""

    def __init__(self, func):
        self.func = func
        self.attrname = None
        self.__doc__ = func.__doc__
        self.__module__ = func.__module__

    def __set_name__(self, owner, name):
        self.attrname = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.attrname] = self.func(instance)
        return value
