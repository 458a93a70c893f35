"""``gpuscale profiles``: the scaling profiles and the signals they use."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    sub.add_parser("profiles", help="list the scaling profiles and signals").set_defaults(
        run=run)


def run(args: argparse.Namespace) -> int:
    from gpuscale.scaler.core.profiles import PLANNED, PROFILES, SIGNALS

    for p in PROFILES.values():
        targets = ", ".join(f"{t.signal} target {_quantity(t.target, SIGNALS[t.signal].unit)}"
                            f"{'' if t.signal == PLANNED else ' per pod'}"
                            f" (active above {t.activation:g})" for t in p.targets)
        print(f"{p.name}: {targets}\n    {p.why}\n")
    print("signals:")
    for sig in SIGNALS.values():
        print(f"  {sig.name} [{sig.unit}]: {sig.help}")
    return 0


def _quantity(value: float, unit: str) -> str:
    """``70%``, ``32 requests``."""
    return f"{value:g}{unit}" if unit == "%" else f"{value:g} {unit}"
