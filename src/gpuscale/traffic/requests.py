"""The requests a simulation or the live demo plays: a trace, or a synthetic pattern."""

from __future__ import annotations

from pathlib import Path

from gpuscale.common.errors import ConfigError
from gpuscale.traffic.patterns import synthetic
from gpuscale.traffic.scale import RateMode, scale_trace
from gpuscale.traffic.trace import TraceRequest, read_trace


def load_requests(pattern: str | None, trace: Path | None, rate: float,
                  duration: float | None, speedup: float = 1.0, loops: int = 1,
                  pattern_duration: float = 3600.0,
                  rate_mode: RateMode = "place") -> tuple[list[TraceRequest], float]:
    """The requests of a synthetic pattern or a trace, and the simulated seconds to run
    (a trace's last arrival + 5 minutes unless ``duration``); a trace's ``rate`` is
    applied by ``scale_trace`` in ``rate_mode``. ConfigError (TraceError is one): a
    reason naming the option."""
    if not rate > 0 or not speedup > 0:  # also refuses NaN
        raise ConfigError("--rate and --speedup must be positive")
    if duration is not None and not duration > 0:
        raise ConfigError("--duration must be positive")
    if loops < 1:
        raise ConfigError("--loop must be at least 1")
    if trace is None:
        seconds = duration or pattern_duration
        return synthetic(pattern or "diurnal", seconds, rate), seconds
    try:
        requests = scale_trace(read_trace(trace), rate, speedup, duration, loops,
                               mode=rate_mode)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"--rate: {exc}") from None
    if not requests:
        raise ConfigError("no request in the chosen slice of the trace")
    return requests, duration or requests[-1].arrival_s + 300.0
