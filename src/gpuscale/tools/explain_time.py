"""``gpuscale explain --at``: the moment asked for, read from what a person types, and said
back in the same terms when the scaler has no record of it (pure)."""

from __future__ import annotations

import math
import re
import time

from gpuscale.common.errors import ConfigError

_CLOCK = re.compile(r"\d{1,2}:\d\d(:\d\d)?")
# A clock time this little ahead of now is today's: a printed second rounded up (the demo's
# decision lines round to the nearest second) or another machine's clock a little ahead -
# not a time 24 hours ago.
AHEAD_S = 300.0


def utc(when: float) -> str:
    """``when`` (wall seconds) as a person reads it: "2026-11-28 22:18:00 UTC"."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))


def parse_time(text: str, now: float) -> float:
    """``--at``: epoch seconds, an ISO time (UTC unless it says), HH:MM[:SS] today (UTC;
    yesterday when that is more than AHEAD_S later than now), or "-90s"/"-5m"/"-1h" ago.
    ConfigError else."""
    from datetime import UTC, datetime, timedelta

    t = text.strip()
    if t.startswith("-") and t[-1:] in ("s", "m", "h"):
        try:
            n = float(t[1:-1])
        except ValueError:
            raise ConfigError(f"--at {text!r}: not a duration like -90s, -5m, -1h") from None
        if not math.isfinite(n) or n < 0:
            raise ConfigError(f"--at {text!r}: not a duration")
        return now - n * {"s": 1, "m": 60, "h": 3600}[t[-1]]
    try:
        value = float(t)
        if math.isfinite(value) and value > 0:
            return value
    except ValueError:
        pass
    day = datetime.fromtimestamp(now, UTC)
    for fmt in ("%H:%M", "%H:%M:%S"):
        try:
            hm = datetime.strptime(t, fmt)
        except ValueError:
            continue
        when = day.replace(hour=hm.hour, minute=hm.minute, second=hm.second, microsecond=0)
        if when.timestamp() > now + AHEAD_S:
            when -= timedelta(days=1)
        return when.timestamp()
    try:
        parsed = datetime.fromisoformat(t)
    except ValueError:
        raise ConfigError(f"--at {text!r}: give epoch seconds, an ISO time, HH:MM (UTC) or "
                          f"-5m") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def refused_at(text: str, at: float, why: str) -> str:
    """What to say when the scaler has no record of the moment ``--at text`` named (``at``,
    wall seconds; ``why``: the scaler's reason, which gives the span its history covers):
    the time as given and as understood, then the reason; for a clock time, that it is
    the wall clock's in UTC - not the demo's simulated time, which counts from its start
    and runs faster."""
    said = f"--at {text.strip()} ({utc(at)})"
    hint = ""
    if _CLOCK.fullmatch(text.strip()):
        hint = (f"; {text.strip()} is read as a wall-clock time today in UTC (yesterday "
                f"when more than {AHEAD_S / 60:g} minutes later than now), not the demo's "
                f"simulated time since its start: "
                f"use the UTC time or a duration ago (-5m)")
    return f"{said}: {why}{hint}"
