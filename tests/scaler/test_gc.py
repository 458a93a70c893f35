"""The scaler process's garbage-collector thresholds, from GPUSCALE_GC_THRESHOLDS."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(("given", "want"), [
    ("", (50_000, 20, 100)), ("700,10,10", (700, 10, 10)), (" 1, 2 ,3", (1, 2, 3))])
def test_gc_thresholds_from_the_environment(given: str, want: tuple[int, int, int]) -> None:
    from gpuscale.scaler.root import gc_thresholds

    assert gc_thresholds(given) == want


@pytest.mark.parametrize("given", ["700,10", "a,b,c", "0,10,10", "-1,1,1", "1,2,3,4",
                                   "9" * 10_000])
def test_gc_thresholds_that_cannot_be_used_are_refused(given: str) -> None:
    from gpuscale.common.errors import ConfigError
    from gpuscale.scaler.root import gc_thresholds

    with pytest.raises(ConfigError, match=r"^GPUSCALE_GC_THRESHOLDS: .{0,45} is not three"):
        gc_thresholds(given)
