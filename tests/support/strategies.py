"""Hypothesis strategies shared by the parsers' property tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st


def json_values(keys: Sequence[str], max_leaves: int = 30) -> st.SearchStrategy[Any]:
    """Any JSON value, its objects keyed by ``keys`` (the field names a reader looks up)
    and a few others, so hostile shapes land where the reader looks."""
    scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
               | st.text(max_size=8))
    names = st.sampled_from([*keys, "x"])
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(names, inner, max_size=6), max_leaves=max_leaves)
