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


class BadReply(ApiError):
    """The API server answered something its contract does not allow (a list item with no
    metadata.uid, a watch line that is not an event, a body that is not JSON)."""
