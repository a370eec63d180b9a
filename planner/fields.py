"""Typed readers for one value of a case file: each returns the value or raises a
:class:`CaseError` naming the file, the key and what was expected. Every section reader
(:mod:`planner.case`, :mod:`planner.search_options`, :mod:`planner.cluster_options`) uses these."""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .errors import CaseError, one_line, safe_repr
from .limits import MAX_FIXED_TIME_S, MAX_GPU_HOUR_COST, MAX_INT, MAX_STRING_CHARS, MIN_FIGURE, MIN_GPU_HOUR_COST
from .presets import closest
from .units import UnitError


def describe(value: Any) -> str:
    """A value as an error message quotes it: its type and a short repr."""
    if value is None:
        return "nothing"
    if isinstance(value, int) and value.bit_length() > 200:  # its repr may pass Python's digit limit
        return f"an integer of {value.bit_length()} bits"
    return f"{type(value).__name__} {one_line(safe_repr(value), 80)}"


def read_mapping(src: str, key: str, value: Any, allowed: tuple[str, ...]) -> dict:
    if not isinstance(value, dict):
        raise CaseError(src, key, f"expected a mapping, got {describe(value)}")
    for k in value:
        if k not in allowed:
            raise CaseError(src, f"{key}.{k}" if key else str(k),
                            f"unknown key{closest(k, allowed)}; expected one of {', '.join(allowed)}")
    return value


def read_int(src: str, key: str, value: Any, minimum: int = 1, maximum: int = MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CaseError(src, key, f"expected an integer, got {describe(value)}")
    if value < minimum:
        raise CaseError(src, key, f"expected an integer >= {minimum}, got {describe(value)}")
    if value > maximum:
        raise CaseError(src, key, f"expected an integer <= {maximum}, got {describe(value)}")
    return value


def read_recompute_layers(src: str, key: str, value: Any) -> int:
    """``recompute_num_layers``: layers per stage recomputed in full, at least one. megatron-core
    takes 1 to a stage's layers (TransformerConfig: "recompute_num_layers must be between 1 and
    num_layers_per_pipeline_rank"); 0 would recompute nothing, which is ``recompute: none``."""
    number = read_int(src, key, value, minimum=0)
    if number < 1:
        raise CaseError(src, key, "expected at least 1 with recompute: full, got 0 (layers per stage "
                                  "recomputed; 0 recomputes nothing: write recompute: none instead)")
    return number


def read_number(src: str, key: str, value: Any, maximum: float = math.inf) -> float:
    """A finite number, at most ``maximum`` where the key has a bound (named in the refusal)."""
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        try:
            number = float(value)  # an integer past float range overflows here
        except OverflowError:
            number = math.inf
        if number > maximum:  # inf included: the bound says more than "finite"
            raise CaseError(src, key, f"expected a number of at most {maximum:g}, got {describe(value)}")
        if math.isfinite(number):
            return number
    raise CaseError(src, key, f"expected a finite number, got {describe(value)}{_yaml_text_hint(value)}")


def _yaml_text_hint(value: Any) -> str:
    """YAML 1.1 reads 1e300 (no dot, no sign in the exponent) as text: say how to write the number."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return ""
        if not math.isfinite(number):
            return ""
        from yaml.resolver import Resolver

        implicit = [tag for tag, regexp in Resolver.yaml_implicit_resolvers.get(value[:1], [])
                    if regexp.match(value)]
        if implicit:  # a number YAML reads unquoted: it was quoted
            return " (a quoted number is text: write it without quotes)"
        return f" (YAML reads {one_line(value, 40)} as text; write it as {number:.6e})"
    return ""


def read_time(src: str, key: str, value: Any) -> float:
    """A fixed time in seconds: 0 up to MAX_FIXED_TIME_S."""
    number = read_number(src, key, value)
    if not 0 <= number <= MAX_FIXED_TIME_S:
        raise CaseError(src, key, f"expected a time in seconds from 0 to {MAX_FIXED_TIME_S:g}, got {number:g}")
    return number


def read_figure(src: str, key: str, value: Any, maximum: float = math.inf) -> float:
    """A positive figure the step time divides by: below MIN_FIGURE it would make it endless."""
    number = read_number(src, key, value, maximum)
    if number <= 0:  # here, as written: the spec's own check would name its field, in its own unit
        raise CaseError(src, key, f"expected a positive number, got {describe(value)}")
    if number < MIN_FIGURE:
        raise CaseError(src, key, f"expected a figure of at least {MIN_FIGURE:g}, got {number:g}")
    return number


def read_price(src: str, key: str, value: Any) -> float:
    """A price per GPU-hour (`size`'s gpu_hour_cost, of a case's GPU type or --gpu-hour-cost for all), from
    MIN_GPU_HOUR_COST to MAX_GPU_HOUR_COST (nan fails both comparisons)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not MIN_GPU_HOUR_COST <= value <= MAX_GPU_HOUR_COST:
        raise CaseError(src, key, f"expected a price per GPU-hour from {MIN_GPU_HOUR_COST:g} to {MAX_GPU_HOUR_COST:g}, "
                                  f"got {one_line(safe_repr(value), 60)}{_yaml_text_hint(value)}")
    return float(value)


def check_option(option: str, value: Any, low: float, high: float, what: str) -> None:
    """A command-line number from ``low`` to ``high`` (nan and inf fail: they compare as neither),
    refused before any work starts as a CaseError naming the option."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise CaseError(option, "", f"expected {what} from {low:g} to {high:g}, got {one_line(safe_repr(value), 60)}")


def read_bool(src: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise CaseError(src, key, f"expected true or false, got {describe(value)}")
    return value


def read_str(src: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise CaseError(src, key, f"expected a string, got {describe(value)}")
    if len(value) > MAX_STRING_CHARS:
        raise CaseError(src, key, f"expected a string of at most {MAX_STRING_CHARS:,} characters, got one of "
                                  f"{len(value):,}")
    return value


def canonical_choice(value: Any, choices: Iterable[str]) -> Any:
    """``value`` as the choice it names in any letter case, else ``value`` itself (None, a number,
    a string naming none: for its reader's refusal, which names the choices).

    An enumerated value reads as GPU and model preset names do: "BF16" from a Megatron log is bf16,
    "AdamW" from a paper adamw. What is read goes on in the canonical spelling, so the reports, the
    JSON and the emitted files show one spelling whatever the case (or option) wrote."""
    if not isinstance(value, str):
        return value
    folded = value.casefold()
    return next((choice for choice in choices if choice.casefold() == folded), value)


def read_choice(src: str, key: str, value: Any, choices: tuple[str, ...]) -> str:
    """A string naming one of ``choices`` (in any letter case), as its canonical spelling; a
    refusal names the canonical choices."""
    text = canonical_choice(read_str(src, key, value), choices)
    if text not in choices:
        raise CaseError(src, key, f"expected one of {', '.join(choices)}, got {one_line(safe_repr(text), 60)}")
    return text


def read_path(src: str, key: str, value: Any) -> Path:
    """A path given to the Python API (a str or os.PathLike, not empty), as a Path."""
    if isinstance(value, os.PathLike):
        try:
            value = os.fspath(value)
        except Exception as error:  # its own __fspath__ failed: said as the argument's error, not raised from it
            raise CaseError(src, key, f"expected a path, got a {type(value).__name__} whose __fspath__ raised "
                                      f"{type(error).__name__}") from None
    if isinstance(value, str) and value.strip():
        if "\0" in value:  # the OS refuses it: a ValueError from deep inside, not the argument's error
            raise CaseError(src, key, "expected a path, got one holding a NUL byte")
        # ~ is the user's home, as the shell makes it (and a case's path: planner.case.read_case)
        return Path(os.path.expanduser(read_str(src, key, value)))
    raise CaseError(src, key, f"expected a path (str or os.PathLike), got {describe(value)}")


def read_file_path(src: str, key: str, value: Any, base: Path, inside: str = "") -> Path:
    """A file a case names (an HF config, a profile): relative to the case's folder, not empty;
    a folder holding ``inside`` (a model's folder with its config.json) stands for that file."""
    text = read_str(src, key, value)
    if not text.strip():
        raise CaseError(src, key, "expected a file's path, got an empty string")
    path = Path(text) if Path(text).is_absolute() else base / text
    if path.is_dir():
        if inside and (path / inside).is_file():
            return path / inside
        raise CaseError(src, key, f"expected a file, got the directory {one_line(str(path), 200)}"
                                  + (f" (with no {inside} in it)" if inside else ""))
    if not os.path.lexists(path):  # said of the case and its key, as the directory is (it named the path alone)
        raise CaseError(src, key, f"file not found: {one_line(str(path), 200)}")
    return path


@contextmanager
def read_for(src: str, key: str, path: Path) -> Iterator[None]:
    """Reading a file the case names at ``key``: what stops the file being read at all (a device, a
    link loop, text that is no JSON), which names no key inside it, is said of the case and its key
    too (it named the path alone); an error at a key inside the file is that file's own."""
    try:
        yield
    except CaseError as error:
        if error.source == str(path) and not error.key:
            raise CaseError(src, key, f"{one_line(str(path), 200)}: {error.expected}") from None
        raise


def read_unit(src: str, key: str, value: Any, parse: Callable[[Any], float]) -> float:
    try:
        return parse(value)
    except UnitError as error:
        raise CaseError(src, key, str(error)) from None


def required(src: str, section: str, data: dict, key: str) -> Any:
    """``data[key]``, or a CaseError naming ``section.key`` (``key`` alone at a file's top level)."""
    if key not in data:
        raise CaseError(src, f"{section}.{key}" if section else key, "missing")
    return data[key]
