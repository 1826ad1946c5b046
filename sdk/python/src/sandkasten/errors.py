"""Exceptions the SDK raises: one class per error code of the API's error body (`{"error": {"code", "message"}}`),
grouped into a small hierarchy so callers catch what they can act on (`NotFound`, `Conflict`, `QuotaExceeded`, ...).
Every exception carries the API's stable `code`, its `message` (what went wrong and how to fix it) and the HTTP
`status` (0 for an error reported inside an event stream)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Type


class SandkastenError(Exception):
    """An error the server reported, or a response the SDK could not understand."""

    def __init__(self, code: str, message: str, status: int = 0) -> None:
        super().__init__(f"{code}: {message}" if status == 0 else f"{status} {code}: {message}")
        self.code = code
        self.message = message
        self.status = status


class BadRequest(SandkastenError):
    """400 `bad_request`: the request was malformed (JSON, a query parameter, a path)."""


class Unauthorized(SandkastenError):
    """401 `unauthorized`: no API key, or one the server does not know."""


class Forbidden(SandkastenError):
    """403 `forbidden`: the key's tenant may not do this (e.g. an admin-only call)."""


class NotFound(SandkastenError):
    """404 `not_found`: no such sandbox, snapshot, command, context, file or secret for this tenant."""


class MethodNotAllowed(SandkastenError):
    """405 `method_not_allowed`."""


class Conflict(SandkastenError):
    """409 `conflict`: the resource is in the wrong state (the sandbox has ended, the tier cannot do this, ...)."""


class Paused(Conflict):
    """409 `paused`: the sandbox is paused; resume it first (or create it with `auto_resume`)."""


class PayloadTooLarge(SandkastenError):
    """413 `payload_too_large`: the body (a file, an archive, a command's stdin) is over the server's limit."""


class Unprocessable(SandkastenError):
    """422 `unprocessable`: well-formed but invalid (a limit out of range, no command, a bad policy)."""


class QuotaExceeded(SandkastenError):
    """429 `quota_exceeded`: the tenant's sandbox, memory or snapshot quota is used up."""


class TierUnavailable(SandkastenError):
    """`tier_unavailable`: the requested isolation tier is not available on this server."""


class TierFailed(SandkastenError):
    """`tier_failed`: the isolation tier failed while serving the request (the sandbox may be gone)."""


class StoreFailed(SandkastenError):
    """`store_failed`: the snapshot store failed."""


class InternalError(SandkastenError):
    """`internal`: a server bug; the message says what failed."""


class TemplateBuildFailed(SandkastenError):
    """A template build's `failed` event: a step or `ready` failed (`step` says which: `{"index", "title"}`,
    `"ready"` or `"spec"`), `output` is the tail of what it printed. No template was made."""

    def __init__(self, message: str, step: Any, output: str) -> None:
        super().__init__("build_failed", message)
        self.step = step
        self.output = output


class ProtocolError(SandkastenError):
    """The server's answer was not what the API documents (not JSON, a stream that ended early)."""


#: The exception class of each error code of the API (`ErrorCode` in docs/api/openapi.json).
ERROR_CLASSES: Dict[str, Type[SandkastenError]] = {
    "bad_request": BadRequest,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "method_not_allowed": MethodNotAllowed,
    "conflict": Conflict,
    "paused": Paused,
    "payload_too_large": PayloadTooLarge,
    "unprocessable": Unprocessable,
    "tier_unavailable": TierUnavailable,
    "quota_exceeded": QuotaExceeded,
    "tier_failed": TierFailed,
    "store_failed": StoreFailed,
    "internal": InternalError,
}

#: The class for an answer without a readable error body, by HTTP status.
_STATUS_CLASSES: Dict[int, Type[SandkastenError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    422: Unprocessable,
    429: QuotaExceeded,
}


def error_from_detail(detail: Any, status: int = 0) -> SandkastenError:
    """The exception for an `ErrorDetail` object (`{"code", "message"}`), as found in error bodies and streams."""
    if isinstance(detail, dict) and isinstance(detail.get("code"), str):
        code = detail["code"]
        message = str(detail.get("message", ""))
        return ERROR_CLASSES.get(code, SandkastenError)(code, message, status)
    return ProtocolError("protocol", f"unreadable error detail: {detail!r}", status)


def error_from_body(status: int, body: bytes, json_body: Optional[Any]) -> SandkastenError:
    """The exception for an error response: from its JSON error body when it has one, else from its status."""
    if isinstance(json_body, dict) and isinstance(json_body.get("error"), dict):
        return error_from_detail(json_body["error"], status)
    text = body.decode("utf-8", "replace").strip()[:500]
    cls = _STATUS_CLASSES.get(status, InternalError if status >= 500 else SandkastenError)
    return cls(f"http_{status}", text or f"HTTP {status} without an error body", status)
