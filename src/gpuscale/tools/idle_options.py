"""What a person passes ``gpuscale idle``, checked: price tables (``--price``, a
``--prices`` YAML file) and durations (``--window``, ``--idle-for``). Every mistake is a
ConfigError naming the item and what would be accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from gpuscale.common.errors import ConfigError

MAX_PRICES = 500
MAX_MODEL = 128
MAX_PRICE = 1_000_000.0
MAX_PRICE_TEXT = 20_000
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_prices(text: str, what: str = "--price") -> dict[str, float]:
    """``"MODEL=PRICE,MODEL=PRICE"`` (price per GPU-hour; a model may contain "=" but not
    ","): the table, or ConfigError naming the item and what would be accepted."""
    if len(text) > MAX_PRICE_TEXT:
        raise ConfigError(f"{what}: longer than {MAX_PRICE_TEXT} characters; use --prices FILE")
    out: dict[str, float] = {}
    for i, item in enumerate(text.split(","), 1):
        if not item.strip():
            raise ConfigError(f"{what}: item {i} is empty (expected MODEL=PRICE, comma "
                              f"separated)")
        model, eq, price = item.rpartition("=")
        if not eq:
            raise ConfigError(f"{what}: item {i} {item[:40]!r} is not MODEL=PRICE")
        _add(out, model.strip(), price.strip(), f"{what}: item {i}")
    return out


def prices_from_mapping(data: object, what: str) -> dict[str, float]:
    """A price table read from YAML (a mapping of GPU model to price per GPU-hour)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what}: expected a mapping of GPU model to price per GPU-hour, "
                          f"e.g. 'NVIDIA H100 80GB HBM3: 2.50'")
    out: dict[str, float] = {}
    for model, price in data.items():
        if isinstance(price, bool) or not isinstance(price, int | float | str):
            raise ConfigError(f"{what}: {str(model)[:40]!r}: the price is not a number")
        _add(out, str(model).strip() if isinstance(model, str) else "", str(price).strip(),
             f"{what}: {str(model)[:40]!r}")
    return out


def _add(out: dict[str, float], model: str, price: str, where: str) -> None:
    if not model:
        raise ConfigError(f"{where}: no GPU model before the price")
    if len(model) > MAX_MODEL or not model.isprintable():
        raise ConfigError(f"{where}: the model is not a GPU name (printable, at most "
                          f"{MAX_MODEL} characters)")
    try:
        value = float(price)
    except ValueError:
        raise ConfigError(f"{where}: {price[:20]!r} is not a price (a number per "
                          f"GPU-hour)") from None
    if not (math.isfinite(value) and 0 <= value <= MAX_PRICE):
        raise ConfigError(f"{where}: the price must be 0 to {MAX_PRICE:g} per GPU-hour")
    if model in out:
        raise ConfigError(f"{where}: {model[:40]!r} is priced twice")
    if len(out) >= MAX_PRICES:
        raise ConfigError(f"{where}: more than {MAX_PRICES} prices")
    out[model] = value


def parse_duration(text: str, what: str) -> float:
    """"90", "90s", "10m", "1.5h", "2d" -> seconds (> 0), or ConfigError."""
    m = _DURATION.match(text[:40])
    if m is None or len(text) > 40:
        raise ConfigError(f"{what}: {text[:40]!r} is not a duration (e.g. 90s, 10m, 1h, 2d)")
    value = float(m.group(1)) * _UNIT_S[m.group(2) or "s"]
    if not 0 < value <= 400 * 86400:
        raise ConfigError(f"{what}: {text[:40]!r} must be above 0 and at most 400 days")
    return value
