"""The sync client: GENERATED from its _async*.py twin by scripts/unasync.py; do not
edit. Every class here has the surface of its Async* twin, blocking.
"""


from __future__ import annotations

import json as jsonlib
import os
import time
import urllib.parse
from contextlib import contextmanager
from typing import IO, Any, Iterator, Callable, List, Mapping, Optional, Sequence, Tuple, Union

import httpx

from . import _io_sync as io
from .errors import AgentboxError, InvalidArgument, Timeout, Unavailable, error_from_reply
from .models import Json

DEFAULT_URL = "http://127.0.0.1:9090"
OutputCallback = Callable[[str], Any]
Command = Union[str, Sequence[str]]
# What a file write takes: bytes, text (UTF-8), a binary file object or an iterable of bytes.
FileData = Union[bytes, bytearray, memoryview, str, IO[bytes], Any]


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def _command_fields(cmd: Command) -> Json:
    if isinstance(cmd, str):
        return {"command": cmd}
    argv = [str(a) for a in cmd]
    if not argv:
        raise InvalidArgument("EINVAL", "command: an empty argv")
    return {"argv": argv}


def _drop_none(d: Mapping[str, Any]) -> Json:
    return {k: v for k, v in d.items() if v is not None}


def _parse_close(reason: str) -> Tuple[Optional[int], Optional[int]]:
    """``exit <code>`` / ``signal <n>`` (the close reason of a pty or an attach)."""
    parts = reason.split()
    if len(parts) == 2 and parts[1].lstrip("-").isdigit():
        if parts[0] == "exit":
            return int(parts[1]), None
        if parts[0] == "signal":
            return None, int(parts[1])
    return None, None



def _now() -> float:
    return time.monotonic()



class Transport:
    """The HTTP side of a client: base URL, token, request timeout, error mapping."""

    def __init__(
        self,
        url: Optional[str],
        token: Optional[str],
        timeout: float,
        headers: Optional[Mapping[str, str]],
        http: Optional[httpx.Client],
    ) -> None:
        self.url = (url or os.environ.get("AGENTBOX_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("AGENTBOX_TOKEN") or None
        self.timeout = timeout
        hdrs = {"User-Agent": "agentbox-python"}
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        hdrs.update(headers or {})
        self.headers = hdrs
        self._own = http is None
        self.http = http or httpx.Client(
            base_url=self.url, headers=hdrs, timeout=httpx.Timeout(timeout)
        )
        self._sockets: List[io.WebSocket] = []

    def _timeout(self, read: Optional[float], extra: Union[bool, str]) -> httpx.Timeout:
        if extra == "exact":  # a caller's own bound on the wait for the next bytes
            return httpx.Timeout(self.timeout, read=read)
        if not extra:
            return httpx.Timeout(self.timeout)
        # A request that waits on a command: the command's own timeout plus the request
        # timeout; without one, as long as the daemon runs it.
        return httpx.Timeout(self.timeout, read=None if read is None else read + self.timeout)

    def _wrap(self, e: httpx.HTTPError, method: str, path: str) -> AgentboxError:
        if isinstance(e, httpx.TimeoutException):
            return Timeout("ETIMEDOUT", f"{method} {path}: no answer in time ({e})")
        return Unavailable("EUNAVAILABLE", f"{method} {path}: {e}")

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Optional[Mapping[str, Any]] = None,
        json: Any = None,
        content: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        wait: Optional[float] = None,
        long: Union[bool, str] = False,
    ) -> httpx.Response:
        """One request; an error reply raises its :class:`AgentboxError` subclass."""
        try:
            r = self.http.request(
                method,
                path,
                params=_drop_none(params or {}),
                json=json,
                content=content,
                headers=headers,
                timeout=self._timeout(wait, long),
            )
        except httpx.HTTPError as e:
            raise self._wrap(e, method, path) from None
        if r.status_code >= 400:
            raise error_from_reply(r.status_code, r.content, r.headers)
        return r

    def json(self, method: str, path: str, **kw: Any) -> Json:
        """One request whose reply is a JSON object."""
        r = self.request(method, path, **kw)
        doc = r.json()
        if not isinstance(doc, dict):
            raise AgentboxError("EPROTO", f"{method} {path}: expected a JSON object")
        return doc

    @contextmanager
    def stream(
        self,
        method: str,
        path: str,
        *,
        params: Optional[Mapping[str, Any]] = None,
        json: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        wait: Optional[float] = None,
        long: Union[bool, str] = True,
    ) -> Iterator[httpx.Response]:
        """A streamed reply (NDJSON, file bytes), closed on leaving the block."""
        req = self.http.build_request(
            method,
            path,
            params=_drop_none(params or {}),
            json=json,
            headers=headers,
            timeout=self._timeout(wait, long),
        )
        try:
            r = self.http.send(req, stream=True)
        except httpx.HTTPError as e:
            raise self._wrap(e, method, path) from None
        try:
            if r.status_code >= 400:
                body = r.read()
                raise error_from_reply(r.status_code, body, r.headers)
            yield r
        except httpx.HTTPError as e:
            raise self._wrap(e, method, path) from None
        finally:
            r.close()

    def ndjson(self, method: str, path: str, **kw: Any) -> Iterator[Json]:
        """The objects of an NDJSON reply, one per line, as they come."""
        with self.stream(method, path, **kw) as r:
            try:
                for line in r.iter_lines():
                    if line.strip():
                        yield jsonlib.loads(line)
            except httpx.HTTPError as e:
                raise self._wrap(e, method, path) from None

    def websocket(
        self, path: str, params: Optional[Mapping[str, Any]] = None
    ) -> io.WebSocket:
        """Opens a WebSocket to `path` with the client's headers (token)."""
        base = self.url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        query = urllib.parse.urlencode(_drop_none(params or {}))
        url = base + path + ("?" + query if query else "")
        hdrs = {k: v for k, v in self.headers.items() if k.lower() != "user-agent"}
        ws = io.ws_connect(url, hdrs, self.timeout)
        self._sockets = [s for s in self._sockets if s.close_code is None]  # forget ended ones
        self._sockets.append(ws)
        return ws

    def close(self) -> None:
        """Closes the WebSockets still open and the HTTP connections (if its own)."""
        for ws in self._sockets:
            if ws.close_code is None:
                try:
                    ws.close()
                except Exception:  # noqa: BLE001 - closing what the caller left open
                    pass
        self._sockets.clear()
        if self._own:
            self.http.close()
