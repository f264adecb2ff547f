"""The one error type of the mqd client."""
from typing import Optional


class MqdError(Exception):
    """An operation that failed: the broker's error answer, or no answer.

    ``status`` is the HTTP status (0 when no answer came: refused, reset,
    timed out), ``code`` the API's stable error code (``topic_not_found``,
    ``no_quorum``...; "" without an answer), ``message`` its text.
    ``retry_after`` is the answer's Retry-After in seconds, if any.
    """

    def __init__(self, status: int, code: str, message: str, *, method: str = "", path: str = "",
                 retry_after: Optional[float] = None, sent: bool = True, node: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.method = method
        self.path = path
        self.retry_after = retry_after
        self.sent = sent
        self.node = node

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later: no answer, 503 or 429."""
        return self.status in (0, 429, 503)

    def __str__(self) -> str:
        if self.status == 0 and self.node:
            return f"{self.method} {self.path}: no answer from {self.node}: {self.message}"
        if self.status == 0:
            return self.message
        if self.code:
            return f"{self.message} ({self.code}, HTTP {self.status})"
        return f"{self.method} {self.path}: HTTP {self.status}: {self.message}"


class TransportError(MqdError):
    """No answer (status 0). ``sent`` tells whether the request may have
    reached the node, and so may have taken effect."""

    def __init__(self, message: str, *, method: str, path: str, node: str, sent: bool) -> None:
        super().__init__(0, "", message, method=method, path=path, sent=sent, node=node)


class Reject(Exception):
    """Raised by a consumer's handler: nack the message as not retryable, so
    that it goes to the dead-letter store at once."""
