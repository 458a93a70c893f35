"""What a failed Kubernetes API call looks like above the seam."""

from __future__ import annotations

from gpuscale.common.errors import PeerError


class ApiError(PeerError):
    """An API call failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class BadReference(ApiError, ValueError):
    """A reference that cannot name an object (rejected before any request is made)."""
