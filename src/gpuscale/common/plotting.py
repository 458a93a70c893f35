"""What the PNG writers (``gpuscale simulate --plot``, ``gpuscale idle --plot``) share:
matplotlib is an optional dependency (``pip install 'gpuscale[plot]'``)."""

from __future__ import annotations

from gpuscale.common.errors import GpuscaleError


class PlotUnavailable(GpuscaleError, RuntimeError):
    """matplotlib is not installed."""

    exit_code = 2
