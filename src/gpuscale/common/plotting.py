"""What the PNG writers (``gpuscale simulate --plot``, ``gpuscale idle --plot``) share:
matplotlib is an optional dependency (the ``plot`` extra), and everything that can be
checked about the output file is checked before the work (``check_plot``), so a long
simulation does not end in a refusal it could have given first."""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from gpuscale.common.errors import ConfigError, GpuscaleError


class PlotUnavailable(GpuscaleError, RuntimeError):
    """matplotlib is not installed."""

    exit_code = 2


def install_hint() -> str:
    """How to add the ``plot`` extra to this installation: from the checkout it was
    installed from when it is an editable install (pip's ``direct_url.json`` says so),
    from the package index otherwise."""
    try:
        raw = metadata.distribution("gpuscale").read_text("direct_url.json")
        url: Any = json.loads(raw or "{}")
    except (metadata.PackageNotFoundError, ValueError, OSError):
        url = {}
    if isinstance(url, dict) and isinstance(url.get("dir_info"), dict) \
            and url["dir_info"].get("editable") and str(url.get("url", "")).startswith(
                "file://"):
        checkout = unquote(str(url["url"]).removeprefix("file://"))
        return f"pip install -e '{checkout}[plot]' (this is an editable install of {checkout})"
    return ("pip install 'gpuscale[plot]' (from a source checkout: pip install -e "
            "'.[plot]')")


def load_pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend; PlotUnavailable, with how to install
    it, when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable(f"--plot needs matplotlib: {install_hint()}") from exc
    return plt


def check_plot(path: Path, flag: str = "--plot") -> None:
    """Refuse, before any work, what would make writing ``path`` fail afterwards:
    matplotlib missing (PlotUnavailable), a suffix no matplotlib backend writes, a folder
    that does not exist or cannot be written, a path that is a folder or a file that cannot
    be replaced (ConfigError). No suffix is matplotlib's default format, PNG."""
    load_pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = path.suffix.lower().removeprefix(".")
    if suffix and suffix not in formats:
        raise ConfigError(f"{flag} {path}: matplotlib does not write .{suffix} files; name "
                          f"one of: {', '.join('.' + f for f in sorted(formats))}")
    folder = path.parent
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path}: the folder {folder} does not exist")
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: that is a folder; name a file in it")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{flag} {path}: the file exists and cannot be written")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: the folder {folder} cannot be written")
