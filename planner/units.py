"""Quantities with units, as written in case files and presets.

Memory: ``"80 GB"`` (10^9 bytes) or ``"80 GiB"`` (2^30 bytes), also B, KB, MB, TB and
their binary forms. Bandwidth: ``"400 Gbit/s"`` or ``"50 GB/s"`` (bytes), also Mbit/s,
Tbit/s, MB/s, TB/s and the binary byte forms. A bare number is refused: the unit
is what tells 80 GB from 80 GiB.
"""

from __future__ import annotations

import math
import re

from .limits import MAX_DEADLINE_S, MAX_QUANTITY, MAX_TOKENS, MIN_QUANTITY
from .errors import as_typed, safe_repr

MEMORY_UNITS = {
    "B": 1.0,
    "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
    "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "TiB": 2.0**40,
}
BANDWIDTH_UNITS = {
    "bit/s": 1 / 8, "Kbit/s": 1e3 / 8, "Mbit/s": 1e6 / 8, "Gbit/s": 1e9 / 8, "Tbit/s": 1e12 / 8,
    "B/s": 1.0, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12,
    "KiB/s": 2.0**10, "MiB/s": 2.0**20, "GiB/s": 2.0**30, "TiB/s": 2.0**40,
}

_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z/]+)\s*$")


class UnitError(ValueError):
    """The text is not a quantity in one of the accepted units; the message says what is."""


def _parse(text: object, units: dict[str, float], kind: str, example: str) -> float:
    accepted = ", ".join(units)
    if isinstance(text, bool) or not isinstance(text, str):
        raise UnitError(f"expected a {kind} with a unit, like \"{example}\" ({accepted}), got {_shown(text)}")
    match = _QUANTITY.match(text)
    if not match or match.group(2) not in units:
        raise UnitError(f"expected a {kind} with a unit, like \"{example}\" ({accepted}), got {_shown(text)}")
    value = float(match.group(1)) * units[match.group(2)]
    base = "B" if units is MEMORY_UNITS else "B/s"
    if value <= 0:
        raise UnitError(f"expected a positive {kind}, got {_shown(text)}")
    if not MIN_QUANTITY <= value <= MAX_QUANTITY:  # inf (1e308 GB) included
        raise UnitError(f"expected a {kind} between {MIN_QUANTITY:g} {base} and {MAX_QUANTITY:g} {base}, "
                        f"got {_shown(text)}")
    return value


def parse_memory(text: object) -> float:
    """Bytes in a memory quantity such as ``"80 GB"`` or ``"80 GiB"``."""
    return _parse(text, MEMORY_UNITS, "memory size", "80 GB")


def parse_bandwidth(text: object) -> float:
    """Bytes per second in a bandwidth such as ``"400 Gbit/s"`` or ``"50 GB/s"``."""
    return _parse(text, BANDWIDTH_UNITS, "bandwidth", "400 Gbit/s")


# `size`: token counts with a decimal suffix, and durations in days or hours.
COUNT_SUFFIXES = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
DURATION_UNITS = {"d": 86400.0, "h": 3600.0}
# A number as a user types it: ASCII digits, with a sign, a point and an exponent where wanted. float()
# and int() read more: PEP 515's "1_0" as 10 and any script's digits (Arabic-Indic "١٠" as 10), which
# --tokens refused and --gpu-hour-cost took. Every number typed on the command line is read by this one
# rule (the count's here, the options' in planner.cli); the sign too, so that "-5T" is refused as not
# above zero rather than as no count at all.
NUMBER_TEXT = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_SUFFIXED = re.compile(rf"^\s*({NUMBER_TEXT})\s*([A-Za-z]*)\s*$")
# Past the digits, the words float() reads for infinity and not-a-number: every option's range
# refuses them, quoting them as typed ("got 'nan'"), where "not a number" would say less.
_TYPED_NUMBER = re.compile(rf"\s*(?:{NUMBER_TEXT}|[+-]?(?:inf|infinity|nan))\s*", re.ASCII | re.IGNORECASE)


def is_typed_number(text: str) -> bool:
    """Whether ``text`` is a number as a user types it (:data:`NUMBER_TEXT`), not one of float()'s other
    spellings."""
    return _TYPED_NUMBER.fullmatch(text) is not None


def _suffixed(text: object, units: dict[str, float], what: str, example: str, maximum: float,
              bare: bool, shown_maximum: str = "") -> float:
    """A positive number with one of ``units`` after it (none needed where ``bare``), at most ``maximum``."""
    accepted = ", ".join(u for u in units if u)
    expected = f"expected {what} like {example} ({accepted})"
    if bare and not isinstance(text, bool) and isinstance(text, (int, float)):
        try:
            value = float(text)
        except OverflowError:  # an integer past float range
            value = math.inf
    elif isinstance(text, str) and (match := _SUFFIXED.match(text)) and match.group(2).upper() in \
            {u.upper() for u in units if u or bare}:
        unit = next(u for u in units if u.upper() == match.group(2).upper())
        value = float(match.group(1)) * units[unit]
    else:
        raise UnitError(f"{expected}, got {_shown(text)}")
    if math.isnan(value):  # neither above zero nor past the maximum: "at most 1e+25, got nan" misled
        raise UnitError(f"{expected}, a number, got {_shown(text)}")
    if value <= 0:
        raise UnitError(f"{expected}, above zero, got {_shown(text)}")
    if not value <= maximum:  # an overflow to infinity too
        raise UnitError(f"{expected}, at most {shown_maximum or format(maximum, 'g')}, got {_shown(text)}")
    return value


def _shown(text: object) -> str:
    """The value as given, cut to 60 characters: a 5,000-digit count stays one short line."""
    if isinstance(text, str):
        return as_typed(text)
    shown = safe_repr(text)
    return shown if len(shown) <= 60 else f"{shown[:40]}… ({len(shown):,} characters)"


def parse_tokens(text: object) -> float:
    """Tokens in a count such as ``"15T"``, ``"300B"``, ``"2.5e12"`` or a plain number."""
    return _suffixed(text, COUNT_SUFFIXES, "a token count", "15T", MAX_TOKENS, bare=True)


def run_days(tokens: float, tokens_per_s: float) -> float:
    """Days a run of ``tokens`` takes at ``tokens_per_s``: `size`'s days and `plan --tokens`'s, one formula."""
    return tokens / tokens_per_s / DURATION_UNITS["d"]


def run_days_band(tokens: float, tokens_per_s_band: tuple[float, float]) -> tuple[float, float]:
    """Days a run of ``tokens`` takes at each end of a tokens/s band given low end first (``Estimate.
    tokens_per_s_band``), by :func:`run_days`: the fast end first, the slow end (the low tokens/s) last.
    `size`'s days_band and `plan --tokens`'s, one formula."""
    slow, fast = tokens_per_s_band
    return (run_days(tokens, fast), run_days(tokens, slow))


def whole_bytes(value: float) -> int:
    """A byte count as the JSON outputs print it: rounded to the nearest byte. One rule for every
    command, so that one layout's peak reads the same in `estimate`, `plan`'s no_fit and `size`
    (no_fit cut it down where the others rounded: a byte apart)."""
    return int(round(value))


def figure_text(value: float, decimals: int = 0) -> str:
    """``value`` grouped with ``decimals`` decimals, or to two significant figures where those would
    round a small figure away (a run of a billion tokens is 0.0115 days, not 0.0): every figure of
    `size`'s answer, in its tables and its sentences alike."""
    if 0 < value < 10 ** (1 - decimals):
        return f"{value:.2g}"
    if value >= 1e15:  # 1.046e+15 days, where 1,045,957,920,790,199.4 took a table past 80 columns
        return f"{value:.4g}"
    return f"{value:,.{decimals}f}"


def duration_text(seconds: float) -> str:
    """A deadline as a user gave it: in days, or in hours where under a day ("36h" is 1.5 days,
    "1h" 1 hour, not 0.04167 days)."""
    if seconds < DURATION_UNITS["d"]:
        hours = seconds / DURATION_UNITS["h"]
        return f"{hours:.4g} hour{'' if hours == 1 else 's'}"
    days = seconds / DURATION_UNITS["d"]
    return f"{days:.4g} day{'' if days == 1 else 's'}"


def parse_duration(text: object) -> float:
    """Seconds in a duration such as ``"60d"`` or ``"36h"``; a bare number has no unit and is refused."""
    return _suffixed(text, DURATION_UNITS, "a duration", "60d or 36h", MAX_DEADLINE_S, bare=False,
                     shown_maximum=f"{MAX_DEADLINE_S / 86400 / 365:g} years")
