"""The seam between pynvml and our values: every NVML call goes through ``NvmlCalls.get``.

``pynvml.NVMLError`` never escapes this module's users. Each error code becomes one of:

- a reading state: NOT_SUPPORTED / FUNCTION_NOT_FOUND (older driver; pynvml's unversioned
  wrappers raise ``NVMLLibraryMismatchError`` for it, which is no ``NVMLError``) ->
  ``Absent.UNSUPPORTED`` (remembered, so the call is not repeated every tick); any other
  per-call error -> ``Absent.UNAVAILABLE`` plus a problem line for this tick;
- ``GpuLost`` for GPU_IS_LOST: the caller marks the whole GPU lost;
- ``BackendDown`` for errors that mean the library as a whole is unusable (uninitialised,
  driver not loaded, library/kernel-module version mismatch): the backend shuts NVML down
  and re-initialises on a later tick.

Each distinct fault is logged once when it first appears, and again when it clears.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from gpuscale.common.errors import PeerError
from gpuscale.telemetry.model import Absent

log = logging.getLogger("gpuscale.telemetry.nvml")

T = TypeVar("T")

# NVML return codes (nvml.h); the names are looked up from pynvml for messages.
SUCCESS = 0
UNINITIALIZED = 1
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
LIB_RM_VERSION_MISMATCH = 18
ARGUMENT_VERSION_MISMATCH = 25

UNSUPPORTED_CODES = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND})
DOWN_CODES = frozenset({UNINITIALIZED, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND,
                        LIB_RM_VERSION_MISMATCH})


class GpuLost(PeerError):
    """NVML said GPU_IS_LOST for this device."""


class BackendDown(PeerError):
    """NVML as a whole is unusable; the message says why."""


def error_name(nvml: ModuleType, code: int) -> str:
    """``NVML_ERROR_GPU_IS_LOST``-style name for a return code, without calling the library
    (which may be the thing that is broken)."""
    for name, value in vars(nvml).items():
        if name.startswith("NVML_ERROR_") and value == code:
            return str(name)
    return f"NVML error {code}"


def error_code(exc: BaseException) -> int:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else -1


class NvmlCalls:
    """Runs NVML calls for one backend, translating errors and logging each fault once."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        # An empty tuple catches nothing: bindings without the class never raise it.
        self._mismatch: Any = getattr(nvml, "NVMLLibraryMismatchError", ())
        self.unsupported: set[tuple[str, str]] = set()  # (device uuid, reading)
        self.problems: list[str] = []  # this tick's failed readings
        self._faults: dict[tuple[str, str], str] = {}  # (where, what) -> last logged fault

    def begin_tick(self) -> None:
        self.problems = []

    def reset(self) -> None:
        """Forget what was unsupported (a re-initialised driver may differ)."""
        self.unsupported.clear()

    def get(self, where: str, uuid: str, what: str, fn: Callable[..., T],
            *args: Any) -> T | Absent:
        """Call ``fn(*args)``; a number/struct, or the Absent reason. Raises GpuLost or
        BackendDown for the faults that are not about this one reading."""
        if (uuid, what) in self.unsupported:
            return Absent.UNSUPPORTED
        try:
            result = fn(*args)
        except self.nvml.NVMLError as exc:
            return self.failed(where, uuid, what, error_code(exc))
        except self._mismatch:  # the driver lacks the versioned call the wrapper chose
            return self.failed(where, uuid, what, FUNCTION_NOT_FOUND)
        self.cleared(where, what)
        return result

    def failed(self, where: str, uuid: str, what: str, code: int) -> Absent:
        """Translate a failed call's code into a reading state (or raise, see class doc)."""
        if code == GPU_IS_LOST:
            raise GpuLost(where)
        if code in DOWN_CODES:
            raise BackendDown(error_name(self.nvml, code))
        name = error_name(self.nvml, code)
        if code in UNSUPPORTED_CODES:
            self.unsupported.add((uuid, what))
            self._log_once(where, what, f"unsupported ({name})", logging.INFO)
            return Absent.UNSUPPORTED
        self.problems.append(f"{where}: {what}: unavailable ({name})")
        self._log_once(where, what, f"unavailable ({name})", logging.WARNING)
        return Absent.UNAVAILABLE

    def cleared(self, where: str, what: str) -> None:
        if self._faults and self._faults.pop((where, what), None) is not None:
            log.info("%s: %s: readable again", where, what)

    def note(self, where: str, what: str, fault: str, level: int = logging.WARNING) -> None:
        """Log a fault that did not come from a single call (lost GPU, backend down)."""
        self._log_once(where, what, fault, level)

    def _log_once(self, where: str, what: str, fault: str, level: int) -> None:
        if self._faults.get((where, what)) != fault:
            self._faults[(where, what)] = fault
            log.log(level, "%s: %s: %s", where, what, fault)
