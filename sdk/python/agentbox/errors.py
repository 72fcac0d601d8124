"""The exceptions of the SDK: one root, :class:`AgentboxError`, and a subclass per API code.

Every error the daemon answers with (``{"error": {"code": "ENOENT", "message": "..."}}``)
becomes an instance of the class for its code, carrying ``code``, ``message`` and the HTTP
``status``. Transport failures (connection refused, a request that took longer than the
client's request timeout) are :class:`Unavailable` and :class:`Timeout`.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional


class AgentboxError(Exception):
    """The root of every error the SDK raises.

    Attributes:
        code: the API's error code (``"ENOENT"``, ``"EINVAL"``, ...), or a client-side code
            (``"ETIMEDOUT"`` for a request timeout, ``"EUNAVAILABLE"`` for a connection failure).
        message: the daemon's message (names the field, path or session at fault).
        status: the HTTP status, or ``None`` when no reply came.
    """

    def __init__(self, code: str, message: str, status: Optional[int] = None) -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message
        self.status = status


class InvalidArgument(AgentboxError):
    """``EINVAL`` (400): the request is wrong; the message names the field."""


class Unauthorized(AgentboxError):
    """``EUNAUTHORIZED`` (401): no token, or a token the daemon does not know."""


class Forbidden(AgentboxError):
    """``EACCES`` (403): a path escaping the box, a read-only target, a denied mount."""


class NotFound(AgentboxError):
    """``ENOENT`` (404): no such session, file, process, template, image or route."""


class Conflict(AgentboxError):
    """``EEXIST``, ``ENOTDIR``, ``EISDIR``, ``ENOTEMPTY`` (409): the target's state forbids it."""


class TooBig(AgentboxError):
    """``ETOOBIG`` (413): an upload over the daemon's file cap."""


class QuotaExceeded(AgentboxError):
    """``EQUOTA`` (429): a limit of the daemon or the tenant is reached.

    Attributes:
        retry_after: seconds to wait before retrying, from the ``Retry-After`` header when the
            daemon sends one, else ``None``.
    """

    def __init__(
        self,
        code: str,
        message: str,
        status: Optional[int] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(code, message, status)
        self.retry_after = retry_after


class ImageError(AgentboxError):
    """``EIMAGE`` (422): an image whose digest does not match or whose layer is hostile."""


class InternalError(AgentboxError):
    """``EINTERNAL`` (500): the daemon failed; its log has the details."""


class NotSupported(AgentboxError):
    """``ENOTSUP`` (501): a field, value or route this daemon does not implement."""


class Unavailable(AgentboxError):
    """``EUNAVAILABLE`` (502/503): the backend, a runner, a node or the daemon is unreachable."""


class Timeout(AgentboxError):
    """``ETIMEDOUT``: the daemon gave up (504) or the client's request timeout passed."""


class CommandError(AgentboxError):
    """A command that ended with a non-zero exit code when the caller asked ``check=True``.

    Attributes:
        stdout: what the command wrote to stdout.
        stderr: what it wrote to stderr.
        exit_code: its exit code (``-1`` when it was killed or timed out).
        result: the whole :class:`agentbox.CommandResult`.
    """

    def __init__(self, result: Any) -> None:
        detail = result.stderr.strip().splitlines()
        why = f"exit code {result.exit_code}"
        if result.timed_out:
            why = "timed out"
        elif result.killed_by:
            why = f"killed by {result.killed_by}"
        msg = f"command failed ({why})" + (f": {detail[-1]}" if detail else "")
        super().__init__("ECOMMAND", msg, None)
        self.result = result
        self.stdout: str = result.stdout
        self.stderr: str = result.stderr
        self.exit_code: int = result.exit_code


_BY_CODE: Mapping[str, type[AgentboxError]] = {
    "EINVAL": InvalidArgument,
    "EUNAUTHORIZED": Unauthorized,
    "EACCES": Forbidden,
    "ENOENT": NotFound,
    "EEXIST": Conflict,
    "ENOTDIR": Conflict,
    "EISDIR": Conflict,
    "ENOTEMPTY": Conflict,
    "ETOOBIG": TooBig,
    "EQUOTA": QuotaExceeded,
    "EIMAGE": ImageError,
    "EINTERNAL": InternalError,
    "ENOTSUP": NotSupported,
    "EUNAVAILABLE": Unavailable,
    "ETIMEDOUT": Timeout,
}

# When a reply carries no error body (a proxy in between, a route that answered bare), the
# status decides.
_BY_STATUS: Mapping[int, str] = {
    400: "EINVAL",
    401: "EUNAUTHORIZED",
    403: "EACCES",
    404: "ENOENT",
    409: "EEXIST",
    413: "ETOOBIG",
    422: "EIMAGE",
    429: "EQUOTA",
    500: "EINTERNAL",
    501: "ENOTSUP",
    502: "EUNAVAILABLE",
    503: "EUNAVAILABLE",
    504: "ETIMEDOUT",
}


def _retry_after(headers: Mapping[str, str]) -> Optional[float]:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def error_from_reply(
    status: int, body: bytes, headers: Optional[Mapping[str, str]] = None
) -> AgentboxError:
    """The exception for an error reply: its class by the body's code (else by the status)."""
    import json

    code = _BY_STATUS.get(status, "EINTERNAL" if status >= 500 else "EINVAL")
    message = body.decode("utf-8", "replace").strip()[:500] or f"HTTP {status}"
    try:
        doc = json.loads(body)
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict) and isinstance(err.get("code"), str):
            code = err["code"]
            message = str(err.get("message", ""))
    except ValueError:
        pass
    return error_from_code(code, message, status, headers or {})


def error_from_code(
    code: str,
    message: str,
    status: Optional[int] = None,
    headers: Optional[Mapping[str, str]] = None,
) -> AgentboxError:
    """The exception for an API code; an unknown code gives a plain :class:`AgentboxError`."""
    cls = _BY_CODE.get(code, AgentboxError)
    if cls is QuotaExceeded:
        return QuotaExceeded(code, message, status, _retry_after(headers or {}))
    return cls(code, message, status)
