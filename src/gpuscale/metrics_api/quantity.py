"""Kubernetes Quantity strings for metric values, rounded up, never down.

The HPA parses ``value`` as a ``resource.Quantity`` and works in milli-units, so values
carry three decimals at most. prometheus-adapter truncates to a milli-quantity; here the
value is rounded *up* to the next milli-unit, so an answer is never smaller than the
reading. The string is the canonical decimal-SI form apimachinery prints: ``500m``,
``3``, ``1500m``, ``2k``, ``1500k``.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_CEILING, Decimal

_SUFFIXES = ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k"))
_SCALE = {"m": -3, "": 0, **{s: e for e, s in _SUFFIXES}}
_QUANTITY = re.compile(r"(?P<number>-?[0-9]+(?:\.[0-9]+)?)(?P<suffix>[mkMGTPE]?)")


def milli_ceiling(value: float) -> int:
    """``value`` in milli-units, rounded up (through its shortest decimal form, so 0.1
    is 100m, not 101m). ValueError for a value that is not finite."""
    if not math.isfinite(value):
        raise ValueError(f"a quantity must be finite, not {value!r}")
    return int((Decimal(repr(value)) * 1000).to_integral_value(rounding=ROUND_CEILING))


def format_milli(milli: int) -> str:
    """The canonical decimal-SI string of ``milli`` thousandths."""
    sign, milli = ("-", -milli) if milli < 0 else ("", milli)
    if milli % 1000:
        return f"{sign}{milli}m"
    whole = milli // 1000
    if whole == 0:
        return "0"
    for exp, suffix in _SUFFIXES:
        if whole % 10**exp == 0:
            return f"{sign}{whole // 10**exp}{suffix}"
    return f"{sign}{whole}"


def quantity(value: float) -> str:
    """``value`` as a Quantity string, rounded up to the next milli-unit."""
    return format_milli(milli_ceiling(value))


def parse_quantity(text: str) -> Decimal:
    """A decimal-SI Quantity string (as the HPA would read it) as a Decimal: digits with an
    optional fraction, then ``m``, ``k``, ``M``, ``G``, ``T``, ``P``, ``E`` or nothing.
    ValueError otherwise (binary suffixes and exponents are not produced here)."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"not a decimal-SI quantity: {text[:40]!r}")
    return Decimal(match["number"]).scaleb(_SCALE[match["suffix"]])
