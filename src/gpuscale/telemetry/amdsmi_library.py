"""The ``amdsmi`` package and its library, as the AMD backend reaches them: loading (and
saying why it failed in words a person can act on), the ROCm release check, and one call
for one reading with the library's errors mapped to ``Absent`` (``Calls``).

Loading. The package binds every library function by name when it is imported
(``amdsmi_wrapper.py``, generated from one ROCm's ``amdsmi.h``). Without the library it
prints and then fails on its empty library table (a KeyError): ROCm is not installed, or
not where ``ROCM_PATH`` says. With a library older than the package it fails on the first
function the library lacks (ctypes: ``<path>: undefined symbol: <name>``): that is said as
such - the symbol, the library's path and version, the node's ROCm - never "not found".
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import os
import re
from collections.abc import Callable
from importlib import metadata
from types import ModuleType
from typing import Any

from gpuscale.common.errors import PeerError
from gpuscale.telemetry.model import Absent

log = logging.getLogger("gpuscale.telemetry.amdsmi")

# amdsmi_status_t values (amdsmi.h)
NOT_SUPPORTED, NO_PERM, NOT_FOUND, DRIVER_NOT_LOADED, RESTART_ERR = 2, 10, 31, 34, 54
_WHY = {NO_PERM: "not permitted (the agent needs read access to /dev/kfd and /dev/dri)",
        DRIVER_NOT_LOADED: "the amdgpu driver is not loaded",
        NOT_FOUND: "the GPU is gone (its device node disappeared)",
        RESTART_ERR: "the amdgpu driver is restarting"}


class Lost(PeerError):
    """A GPU answered that it is gone: the rest of its tick is LOST."""


class Down(PeerError):
    """The library cannot be used at all this tick (the reason is the message)."""


def load_amdsmi() -> ModuleType:
    # The package prints to stdout when it cannot find the library (and then fails on a
    # missing table entry): keep that off our output, the exception says it.
    with contextlib.redirect_stdout(io.StringIO()):
        import amdsmi  # type: ignore[import-untyped]

    module: ModuleType = amdsmi
    return module


def load_failure(exc: BaseException) -> str:
    """Why the package could not be loaded, from what its import raised."""
    missing = re.search(r"(\S+): undefined symbol: (\w+)", str(exc))
    if isinstance(exc, AttributeError) and missing:
        path, symbol = missing.groups()
        return (f"{path} lacks {symbol}, which the amdsmi package {package_version()} "
                f"calls: the library is {library_version(path)} ({rocm_version(path)}), "
                f"older than the package. Use the agent image built for this node's ROCm, "
                f"or install the amdsmi package of its release")
    return (f"libamd_smi.so not found (ROCm not installed, or set ROCM_PATH): "
            f"{type(exc).__name__}")


def package_version() -> str:
    try:
        return metadata.version("amdsmi")
    except metadata.PackageNotFoundError:
        return "(version unknown)"


class _Version(ctypes.Structure):  # amdsmi_version_t (amdsmi.h)
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("release", ctypes.c_uint32), ("build", ctypes.c_char_p)]


def library_version(path: str) -> str:
    """``libamd_smi <major.minor.release>`` from the library itself
    (``amdsmi_get_lib_version``, which needs no init), or what could not be read."""
    try:
        lib = ctypes.CDLL(path)
        got = _Version()
        if lib.amdsmi_get_lib_version(ctypes.byref(got)) != 0:
            return "libamd_smi of unknown version"
    except (OSError, AttributeError):
        return "libamd_smi of unknown version"
    return f"libamd_smi {got.major}.{got.minor}.{got.release}"


def rocm_version(path: str) -> str:
    """``ROCm <version>`` from librocm-core.so beside the library (getROCmVersion, as the
    package reads it), or that it could not be read."""
    core = os.path.join(os.path.dirname(path) or ".", "librocm-core.so")
    try:
        get = ctypes.CDLL(core).getROCmVersion
        parts = [ctypes.c_uint32() for _ in range(3)]
        if get(*(ctypes.byref(p) for p in parts)) != 0:
            return "ROCm version unreadable"
    except (OSError, AttributeError):
        return "ROCm version unreadable"
    return "ROCm " + ".".join(str(p.value) for p in parts)


def version_skew(package: str, rocm: str) -> str:
    """Why a node's ROCm cannot be read with this package, or "". The package declares the
    library's structures in Python and is versioned as the ROCm it was generated from:
    another release may lay them out differently, and a reading through the wrong layout
    is a wrong number. Major and minor must match."""
    if rocm.split(".")[:2] == package.split(".")[:2]:
        return ""
    release = ".".join(rocm.split(".")[:2])
    return (f"ROCm {rocm} on this node, but the amdsmi package is {package}: its structure "
            f"layouts may not be this library's, so nothing is read. Use the agent image "
            f"built for ROCm {release}, or install amdsmi=={release}.*")


class Calls:
    """One library call per reading, its failure mapped to the Absent it means; the tick's
    problems, and what was logged (once per subject)."""

    def __init__(self) -> None:
        self.smi: ModuleType | None = None  # the package, once loaded
        self.worked: set[tuple[int, str]] = set()  # (gpu, call) that succeeded once
        self.problems: list[str] = []
        self._said: dict[str, str] = {}

    def call(self, index: int, what: str, fn: Callable[..., Any], handle: Any,
             *args: Any) -> Any:
        """One library call for one GPU: its result, or the Absent its failure means.
        Raises Lost when the GPU is gone. A call that worked before on this GPU and now
        answers "not supported" is unavailable, not unsupported (rocm_smi maps a vanished
        sysfs file to NOT_SUPPORTED: the GPU may be going away)."""
        assert self.smi is not None
        try:
            got = fn(handle, *args)
        except self.smi.AmdSmiLibraryException as exc:
            code = exc.get_error_code()
            if code in (NOT_FOUND, RESTART_ERR):
                raise Lost from None
            if code == NOT_SUPPORTED and (index, what) not in self.worked:
                return Absent.UNSUPPORTED
            self.problem(f"gpu {index}: {what}: unavailable ({why(exc)})")
            return Absent.UNAVAILABLE
        except Exception as exc:  # retry, timeout, undecodable text: this reading only
            self.problem(f"gpu {index}: {what}: unavailable ({type(exc).__name__})")
            return Absent.UNAVAILABLE
        self.worked.add((index, what))
        return got

    def problem(self, line: str) -> None:
        self.problems.append(line)

    def note(self, subject: str, message: str, level: int) -> None:
        if self._said.get(subject) != message:
            self._said[subject] = message
            log.log(level, "%s", message)

    def cleared(self, subject: str) -> None:
        if self._said.pop(subject, None) is not None:
            log.info("%s: readable again", subject)


def why(exc: Exception) -> str:
    code = exc.get_error_code() if hasattr(exc, "get_error_code") else None
    if code in _WHY:
        return str(_WHY[code])
    return f"{type(exc).__name__}: {str(exc).strip()[:200]}"
