"""Where the repository's own files are, found from its root (the folder holding
``pyproject.toml``), so tests read what a clone holds and nothing beside it."""

from __future__ import annotations

from pathlib import Path


def _root() -> Path:
    here = Path(__file__).resolve()
    return next(p for p in here.parents if (p / "pyproject.toml").is_file())


REPO = _root()
SCHEMAS = REPO / "tests" / "schemas"  # published CRD and compose schemas (README.md there)
TRACES = REPO / "traces"  # request traces (README.md there names each one's source)
AZURE_CONV = TRACES / "azure-llm-inference-2023-conv.csv"  # one hour of Azure LLM requests
