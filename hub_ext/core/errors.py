"""Errors with an HTTP status and a message meant for people.

Raised by the logic modules, turned into JSON responses by the service and into
one line on stderr (and a non-zero exit) by the CLI.
"""


class LabfleetError(Exception):
    status = 400

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class InvalidInput(LabfleetError):
    status = 400


class Unauthorized(LabfleetError):
    status = 401


class Forbidden(LabfleetError):
    status = 403


class NotFound(LabfleetError):
    status = 404


class Conflict(LabfleetError):
    status = 409


class RateLimited(LabfleetError):
    """429; ``retry_after``: whole seconds until a retry may succeed (the answer's Retry-After)."""

    status = 429

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = max(1, int(retry_after))
