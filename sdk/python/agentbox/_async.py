"""The async client. ``_sync.py`` is generated from this file by ``scripts/unasync.py``
(``async``/``await`` dropped, ``Async*`` names without the prefix, ``_io_async`` ->
``_io_sync``): edit this file, then run ``python3 sdk/python/scripts/unasync.py``."""

from __future__ import annotations

import json as jsonlib
import os
import urllib.parse
from contextlib import asynccontextmanager
from typing import (
    IO,
    Any,
    AsyncIterator,
    Callable,
    Dict,
    Literal,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
    overload,
)

import httpx

from . import _io_async as io
from .errors import (
    AgentboxError,
    CommandError,
    InvalidArgument,
    Timeout,
    Unavailable,
    error_from_code,
    error_from_reply,
)
from .models import (
    Build,
    ClusterInfo,
    CommandResult,
    DirEntry,
    FileEvent,
    FileInfo,
    HealthReport,
    Image,
    Json,
    Limits,
    Mount,
    MountsResult,
    NetworkPolicy,
    OutputRecord,
    PackageResult,
    ProcessInfo,
    PullProgress,
    Runner,
    SessionInfo,
    Snapshot,
    Template,
    WriteInfo,
)

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


class AsyncTransport:
    """The HTTP side of a client: base URL, token, request timeout, error mapping."""

    def __init__(
        self,
        url: Optional[str],
        token: Optional[str],
        timeout: float,
        headers: Optional[Mapping[str, str]],
        http: Optional[httpx.AsyncClient],
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
        self.http = http or httpx.AsyncClient(
            base_url=self.url, headers=hdrs, timeout=httpx.Timeout(timeout)
        )
        self._sockets: List[io.AsyncWebSocket] = []

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

    async def request(
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
            r = await self.http.request(
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

    async def json(self, method: str, path: str, **kw: Any) -> Json:
        """One request whose reply is a JSON object."""
        r = await self.request(method, path, **kw)
        doc = r.json()
        if not isinstance(doc, dict):
            raise AgentboxError("EPROTO", f"{method} {path}: expected a JSON object")
        return doc

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        params: Optional[Mapping[str, Any]] = None,
        json: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        wait: Optional[float] = None,
        long: Union[bool, str] = True,
    ) -> AsyncIterator[httpx.Response]:
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
            r = await self.http.send(req, stream=True)
        except httpx.HTTPError as e:
            raise self._wrap(e, method, path) from None
        try:
            if r.status_code >= 400:
                body = await r.aread()
                raise error_from_reply(r.status_code, body, r.headers)
            yield r
        except httpx.HTTPError as e:
            raise self._wrap(e, method, path) from None
        finally:
            await r.aclose()

    async def ndjson(self, method: str, path: str, **kw: Any) -> AsyncIterator[Json]:
        """The objects of an NDJSON reply, one per line, as they come."""
        async with self.stream(method, path, **kw) as r:
            try:
                async for line in r.aiter_lines():
                    if line.strip():
                        yield jsonlib.loads(line)
            except httpx.HTTPError as e:
                raise self._wrap(e, method, path) from None

    async def websocket(
        self, path: str, params: Optional[Mapping[str, Any]] = None
    ) -> io.AsyncWebSocket:
        """Opens a WebSocket to `path` with the client's headers (token)."""
        base = self.url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        query = urllib.parse.urlencode(_drop_none(params or {}))
        url = base + path + ("?" + query if query else "")
        hdrs = {k: v for k, v in self.headers.items() if k.lower() != "user-agent"}
        ws = await io.ws_connect(url, hdrs, self.timeout)
        self._sockets.append(ws)
        return ws

    async def aclose(self) -> None:
        """Closes the WebSockets still open and the HTTP connections (if its own)."""
        for ws in self._sockets:
            if ws.close_code is None:
                try:
                    await ws.close()
                except Exception:  # noqa: BLE001 - closing what the caller left open
                    pass
        self._sockets.clear()
        if self._own:
            await self.http.aclose()


# --- commands ------------------------------------------------------------------------------


class AsyncCommands:
    """``session.commands``: run a command to completion, streamed, or in the background."""

    def __init__(self, session: "AsyncSession") -> None:
        self._s = session
        self._t = session._t

    @overload
    async def run(
        self,
        cmd: Command,
        *,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[str] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        check: bool = False,
        max_output_bytes: Optional[int] = None,
        artifact_dir: Optional[str] = None,
        background: Literal[False] = False,
        tag: None = None,
    ) -> CommandResult: ...

    @overload
    async def run(
        self,
        cmd: Command,
        *,
        timeout: None = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: None = None,
        on_stdout: None = None,
        on_stderr: None = None,
        check: Literal[False] = False,
        max_output_bytes: None = None,
        artifact_dir: None = None,
        background: Literal[True],
        tag: Optional[str] = None,
    ) -> "AsyncProcess": ...

    async def run(
        self,
        cmd: Command,
        *,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[str] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        check: bool = False,
        max_output_bytes: Optional[int] = None,
        artifact_dir: Optional[str] = None,
        background: bool = False,
        tag: Optional[str] = None,
    ) -> Union[CommandResult, "AsyncProcess"]:
        """Runs ``cmd`` (a shell string run by ``/bin/sh -c``, or an argv list) and returns how
        it ended.

        Args:
            timeout: the command's own time limit in seconds (the daemon kills it and its
                children past it, and the result says ``timed_out``). The HTTP request may
                take this long plus the client's request timeout.
            env, cwd, stdin: the command's environment additions, directory and input.
            on_stdout, on_stderr: called with each piece of output as it comes (the command
                is then run over the streaming route); the result still holds all of it.
            check: raise :class:`CommandError` when the exit code is not 0.
            max_output_bytes: cap on the output kept in the result.
            artifact_dir: a directory whose new files the result lists as artifacts.

        With ``background=True`` the command is started as a process and its handle is
        returned at once (``wait``, ``kill``, ``send_stdin``, ``logs``; reconnect later with
        :meth:`connect`); ``timeout``, ``stdin``, the callbacks and ``check`` then belong to
        ``handle.wait()`` and are refused here.
        """
        if background:
            extra = {
                "timeout": timeout, "stdin": stdin, "on_stdout": on_stdout,
                "on_stderr": on_stderr, "max_output_bytes": max_output_bytes,
                "artifact_dir": artifact_dir, "check": check or None,
            }
            given = sorted(k for k, v in extra.items() if v is not None)
            if given:
                raise InvalidArgument(
                    "EINVAL", f"{', '.join(given)}: not with background=True (pass to wait())"
                )
            return await self.start(cmd, env=env, cwd=cwd, tag=tag)
        if tag is not None:
            raise InvalidArgument("EINVAL", "tag: only with background=True")
        body = _command_fields(cmd)
        body.update(
            _drop_none(
                {
                    "timeout_sec": timeout,
                    "env": dict(env) if env is not None else None,
                    "cwd": cwd,
                    "stdin": stdin,
                    "max_output_bytes": max_output_bytes,
                    "artifact_dir": artifact_dir,
                }
            )
        )
        path = self._s._path("/exec")
        if on_stdout is None and on_stderr is None:
            doc = await self._t.json("POST", path, json=body, wait=timeout, long=True)
            result = CommandResult.from_json(doc)
        else:
            out: List[str] = []
            err: List[str] = []
            last: Json = {}
            async for ev in self._t.ndjson(
                "POST", path + "/stream", json=body, wait=timeout, long=True
            ):
                kind = ev.get("type")
                if kind == "stdout":
                    out.append(str(ev.get("data", "")))
                    await io.call(on_stdout, str(ev.get("data", "")))
                elif kind == "stderr":
                    err.append(str(ev.get("data", "")))
                    await io.call(on_stderr, str(ev.get("data", "")))
                elif kind == "error":
                    e = ev.get("error") or {}
                    raise error_from_code(str(e.get("code")), str(e.get("message", "")))
                elif kind == "exit":
                    last = ev
            if not last:
                raise Unavailable("EUNAVAILABLE", "the command's stream ended without its exit")
            result = CommandResult.from_json(last, "".join(out), "".join(err))
        if check and result.exit_code != 0:
            raise CommandError(result)
        return result

    async def start(
        self,
        cmd: Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        tag: Optional[str] = None,
        stdin: bool = True,
    ) -> "AsyncProcess":
        """Starts ``cmd`` in the background and returns its handle (``wait``, ``kill``,
        ``send_stdin``, ``logs``). The command outlives this request and this client: reconnect
        to it later with :meth:`connect` by its pid or tag."""
        return await self._s.processes.start(cmd, env=env, cwd=cwd, tag=tag, stdin=stdin)

    async def connect(self, ref: Union[int, str]) -> "AsyncProcess":
        """The handle of a background command (or any process) by its pid or tag."""
        return await self._s.processes.connect(ref)


class AsyncProcess:
    """A process in a session: a background command, a managed service, a pty program.

    ``info`` is what the daemon last said about it (``refresh()`` asks again).
    """

    def __init__(self, session: "AsyncSession", info: ProcessInfo) -> None:
        self._s = session
        self._t = session._t
        self.info = info

    @property
    def pid(self) -> int:
        """The process's pid in the box."""
        return self.info.pid

    @property
    def tag(self) -> Optional[str]:
        """The tag it was started with, if any."""
        return self.info.tag

    @property
    def ref(self) -> str:
        """What the routes address it by: its pid (a tag may be reused by a later process)."""
        return str(self.info.pid)

    def _path(self, suffix: str = "") -> str:
        return self._s._path(f"/processes/{_q(self.ref)}{suffix}")

    async def refresh(self) -> ProcessInfo:
        """Asks the daemon for the process's state now."""
        self.info = ProcessInfo.from_json(await self._t.json("GET", self._path()))
        return self.info

    async def wait(
        self,
        timeout: Optional[float] = None,
        *,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        check: bool = False,
    ) -> CommandResult:
        """Follows the output until the process ends and returns its result (the output the
        daemon still keeps: at least the last MiB of each stream). ``timeout`` bounds the wait
        (:class:`Timeout` past it; the process keeps running). The daemon keeps a process's
        start and end only to the second, so the result's ``duration_ms`` is 0; ``info`` has
        ``started_at`` and ``ended_at``."""
        out: List[str] = []
        err: List[str] = []
        end: Optional[OutputRecord] = None
        deadline = None if timeout is None else _now() + timeout
        try:
            async for rec in self.logs(follow=True, wait=timeout):
                if deadline is not None and _now() > deadline and rec.type != "exit":
                    raise Timeout("ETIMEDOUT", "deadline")
                if rec.type in ("stdout", "pty"):
                    out.append(rec.data)
                    await io.call(on_stdout, rec.data)
                elif rec.type == "stderr":
                    err.append(rec.data)
                    await io.call(on_stderr, rec.data)
                elif rec.type == "exit":
                    end = rec
        except Timeout:
            raise Timeout("ETIMEDOUT", f"process {self.pid} still running after {timeout} s")
        if end is None:
            await self.refresh()
            code = self.info.exit_code
            sig = self.info.signal
        else:
            code, sig = end.exit_code, end.signal
        result = CommandResult(
            stdout="".join(out),
            stderr="".join(err),
            exit_code=code if code is not None else -1,
            signal=sig,
        )
        await self.refresh()
        if check and result.exit_code != 0:
            raise CommandError(result)
        return result

    async def logs(
        self, *, follow: bool = False, since: Optional[int] = None, wait: Optional[float] = None
    ) -> AsyncIterator[OutputRecord]:
        """The process's output records from byte ``since`` (default: the oldest kept); with
        ``follow`` until it ends (the last record is then ``type == "exit"``). ``wait`` bounds
        the wait for each next record (:class:`Timeout` past it)."""
        params = {"follow": "true" if follow else None, "since": since}
        long: Union[bool, str] = "exact" if wait is not None else follow
        async for j in self._t.ndjson(
            "GET", self._path("/output"), params=params, wait=wait, long=long
        ):
            yield OutputRecord.from_json(j)

    async def send_stdin(self, data: Union[bytes, str], *, close: bool = False) -> None:
        """Writes to the process's stdin (started with ``stdin=True``); ``close`` then closes it."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        await self._t.request(
            "POST",
            self._path("/stdin"),
            params={"close": "true" if close else None},
            content=raw,
            headers={"Content-Type": "application/octet-stream"},
        )

    async def close_stdin(self) -> None:
        """Closes the process's stdin (it reads EOF)."""
        await self.send_stdin(b"", close=True)

    async def signal(self, signal: Union[str, int]) -> ProcessInfo:
        """Sends ``SIGINT``, ``SIGTERM``, ``SIGKILL``, ``SIGHUP``, ``SIGUSR1`` or ``SIGUSR2``."""
        doc = await self._t.json("POST", self._path("/signal"), json={"signal": signal})
        self.info = ProcessInfo.from_json(doc)
        return self.info

    async def kill(self) -> ProcessInfo:
        """Kills the process and everything it started (and ends a managed one's supervision);
        returns its final state."""
        self.info = ProcessInfo.from_json(await self._t.json("DELETE", self._path()))
        return self.info

    async def resize(self, cols: int, rows: int) -> None:
        """Resizes the process's terminal (pty processes only)."""
        await self._t.request("POST", self._path("/resize"), json={"cols": cols, "rows": rows})

    async def attach(self) -> "AsyncTerminal":
        """A WebSocket to the process's terminal (pty processes): its bytes both ways."""
        ws = await self._t.websocket(self._path("/attach"))
        return AsyncTerminal(ws)

    async def attach_stdio(self) -> "AsyncLineChannel":
        """A WebSocket to a process without a pty: a line to stdin per ``send_line``, a stdout
        line per ``recv_line`` (MCP stdio servers speak newline-delimited JSON this way)."""
        ws = await self._t.websocket(self._path("/attach"))
        return AsyncLineChannel(ws)


class AsyncProcesses:
    """``session.processes``: processes that outlive the request that started them."""

    def __init__(self, session: "AsyncSession") -> None:
        self._s = session
        self._t = session._t

    async def start(
        self,
        cmd: Command,
        *,
        tag: Optional[str] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: bool = False,
        pty: Optional[Tuple[int, int]] = None,
        restart: str = "never",
    ) -> AsyncProcess:
        """Starts a process. ``restart`` other than ``never`` (``on-failure``, ``always``)
        makes it managed: supervised, restarted with backoff, kept across suspend/resume and
        daemon restarts. ``pty=(cols, rows)`` gives it a terminal; ``stdin=True`` keeps its
        stdin open for ``send_stdin``. A ``tag`` is unique among the live processes."""
        body = _command_fields(cmd)
        body.update(
            _drop_none(
                {
                    "tag": tag,
                    "cwd": cwd,
                    "env": dict(env) if env is not None else None,
                    "stdin": stdin or None,
                    "pty": {"cols": pty[0], "rows": pty[1]} if pty else None,
                    "restart": restart if restart != "never" else None,
                }
            )
        )
        doc = await self._t.json("POST", self._s._path("/processes"), json=body)
        return AsyncProcess(self._s, ProcessInfo.from_json(doc))

    async def list(self) -> List[ProcessInfo]:
        """Live processes and those that ended in the last minutes."""
        doc = await self._t.json("GET", self._s._path("/processes"))
        return [ProcessInfo.from_json(p) for p in doc.get("processes", [])]

    async def get(self, ref: Union[int, str]) -> ProcessInfo:
        """One process by pid or tag."""
        return ProcessInfo.from_json(
            await self._t.json("GET", self._s._path(f"/processes/{_q(str(ref))}"))
        )

    async def connect(self, ref: Union[int, str]) -> AsyncProcess:
        """The handle of a process by pid or tag (reconnect to a background command)."""
        return AsyncProcess(self._s, await self.get(ref))

    async def kill(self, ref: Union[int, str]) -> ProcessInfo:
        """Kills a process by pid or tag; returns its final state."""
        return await (await self.connect(ref)).kill()

    async def logs(
        self, ref: Union[int, str], *, follow: bool = False, since: Optional[int] = None
    ) -> AsyncIterator[OutputRecord]:
        """A process's output records (see :meth:`AsyncProcess.logs`)."""
        proc = await self.connect(ref)
        async for rec in proc.logs(follow=follow, since=since):
            yield rec

    async def attach(self, ref: Union[int, str]) -> "AsyncTerminal":
        """Attaches to a pty process's terminal (see :meth:`AsyncProcess.attach`)."""
        return await (await self.connect(ref)).attach()

    async def attach_stdio(self, ref: Union[int, str]) -> "AsyncLineChannel":
        """Attaches to a process's stdin/stdout by lines (see :meth:`AsyncProcess.attach_stdio`)."""
        return await (await self.connect(ref)).attach_stdio()


# --- terminals -----------------------------------------------------------------------------


class AsyncTerminal:
    """A terminal over a WebSocket: ``write`` keystrokes, ``resize``, iterate the output bytes.

    When the program ends the daemon closes the socket; ``exit_code`` (or ``signal``) then says
    how it ended. Leaving ``async with`` closes the socket, which ends a terminal from
    ``session.pty.open``.
    """

    def __init__(self, ws: io.AsyncWebSocket) -> None:
        self._ws = ws
        self._buf = b""

    @property
    def closed(self) -> bool:
        """Whether the daemon closed the terminal (the program ended)."""
        return self._ws.close_code is not None

    @property
    def exit_code(self) -> Optional[int]:
        """The program's exit code once it ended (``None`` before, or when killed)."""
        return _parse_close(self._ws.close_reason)[0]

    @property
    def signal(self) -> Optional[int]:
        """The signal that killed the program, if one did."""
        return _parse_close(self._ws.close_reason)[1]

    async def write(self, data: Union[bytes, str]) -> None:
        """Sends keystrokes (``str`` is UTF-8 encoded)."""
        await self._ws.send(data.encode() if isinstance(data, str) else bytes(data))

    async def resize(self, cols: int, rows: int) -> None:
        """Resizes the terminal to ``cols`` x ``rows``."""
        await self._ws.send_json({"type": "resize", "cols": cols, "rows": rows})

    async def read(self, timeout: Optional[float] = None) -> Optional[bytes]:
        """The next output bytes, or ``None`` once the terminal closed."""
        if self._buf:
            data, self._buf = self._buf, b""
            return data
        while True:
            frame = await self._ws.recv(timeout)
            if frame is None:
                return None
            data = frame.encode() if isinstance(frame, str) else frame
            if data:
                return data

    async def read_until(self, marker: Union[bytes, str], timeout: float = 10.0) -> bytes:
        """Reads until ``marker`` appears; returns everything up to and including it (the rest
        stays for the next read). :class:`Timeout` if it does not appear in ``timeout`` s."""
        want = marker.encode() if isinstance(marker, str) else marker
        deadline = _now() + timeout
        got = b""
        while want not in got:
            left = deadline - _now()
            if left <= 0:
                raise Timeout("ETIMEDOUT", f"{want!r} not seen in {timeout} s; got {got[-200:]!r}")
            chunk = await self.read(left)
            if chunk is None:
                raise AgentboxError("ECLOSED", f"terminal closed before {want!r}; got {got!r}")
            got += chunk
        end = got.index(want) + len(want)
        self._buf = got[end:] + self._buf
        return got[:end]

    async def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Reads (and drops) output until the program ends; returns its exit code."""
        while await self.read(timeout) is not None:
            pass
        return self.exit_code

    async def close(self) -> None:
        """Closes the WebSocket (a terminal from ``pty.open`` ends its program)."""
        await self._ws.close()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[bytes]:
        while True:
            data = await self.read()
            if data is None:
                return
            yield data

    async def __aenter__(self) -> "AsyncTerminal":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncLineChannel:
    """A process's stdin and stdout as lines over a WebSocket (``attach_stdio``)."""

    def __init__(self, ws: io.AsyncWebSocket) -> None:
        self._ws = ws

    @property
    def exit_code(self) -> Optional[int]:
        """The process's exit code once it ended."""
        return _parse_close(self._ws.close_reason)[0]

    async def send_line(self, line: str) -> None:
        """One line to the process's stdin (the newline is added)."""
        await self._ws.send(line)

    async def recv_line(self, timeout: Optional[float] = None) -> Optional[str]:
        """The next stdout line, or ``None`` once the process ended."""
        frame = await self._ws.recv(timeout)
        if frame is None:
            return None
        return frame if isinstance(frame, str) else frame.decode("utf-8", "replace")

    async def close(self) -> None:
        """Closes the WebSocket (the process keeps running)."""
        await self._ws.close()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[str]:
        while True:
            line = await self.recv_line()
            if line is None:
                return
            yield line

    async def __aenter__(self) -> "AsyncLineChannel":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncPty:
    """``session.pty``: interactive terminals."""

    def __init__(self, session: "AsyncSession") -> None:
        self._s = session

    async def open(
        self, *, cols: int = 80, rows: int = 24, command: Optional[str] = None
    ) -> AsyncTerminal:
        """Starts ``command`` (default: the daemon's shell) on a new terminal and attaches to
        it. The program ends when the terminal is closed."""
        ws = await self._s._t.websocket(
            self._s._path("/pty"), {"cols": cols, "rows": rows, "command": command}
        )
        return AsyncTerminal(ws)


# --- files ---------------------------------------------------------------------------------


def _size_of(f: Any) -> Optional[int]:
    """The bytes left in a seekable file object (for a Content-Length), else None."""
    try:
        pos = f.tell()
        end = f.seek(0, os.SEEK_END)
        f.seek(pos)
        return int(end - pos)
    except (AttributeError, OSError, ValueError):
        return None


class AsyncFiles:
    """``session.files``: the files of the box (paths absolute in the box or relative to
    ``/workspace``)."""

    def __init__(self, session: "AsyncSession") -> None:
        self._s = session
        self._t = session._t

    async def read(self, path: str) -> bytes:
        """A whole file, as bytes (use :meth:`download` or :meth:`iter_bytes` for big ones)."""
        r = await self._t.request("GET", self._s._path("/files"), params={"path": path}, long=True)
        return r.content

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """A whole file, decoded."""
        return (await self.read(path)).decode(encoding)

    async def iter_bytes(self, path: str, chunk_size: int = io.CHUNK) -> AsyncIterator[bytes]:
        """A file's bytes as they stream from the daemon, never all in memory."""
        async with self._t.stream("GET", self._s._path("/files"), params={"path": path}) as r:
            async for chunk in r.aiter_bytes(chunk_size):
                yield chunk

    async def download(self, path: str, dest: Union[str, "os.PathLike[str]", IO[bytes]]) -> int:
        """Streams a file into ``dest`` (a local path or a binary file object); returns the
        number of bytes."""
        if isinstance(dest, (str, os.PathLike)):
            with open(dest, "wb") as f:
                return await self.download(path, f)
        n = 0
        async for chunk in self.iter_bytes(path):
            await io.write_to(dest, chunk)
            n += len(chunk)
        return n

    async def write(
        self,
        path: str,
        data: FileData,
        *,
        mkdirs: bool = False,
        mode: Optional[int] = None,
    ) -> WriteInfo:
        """Writes a file atomically (readers see the old or the new content). ``data`` is
        bytes, text (UTF-8), a binary file object or an iterable of bytes; the last two are
        streamed, never read whole into memory. ``mkdirs`` creates missing parents; ``mode``
        is the permission bits (e.g. ``0o755``)."""
        params: Dict[str, Any] = {"path": path}
        if mkdirs:
            params["mkdirs"] = "true"
        if mode is not None:
            params["mode"] = format(mode, "04o")
        headers = {"Content-Type": "application/octet-stream"}
        content: Any
        if isinstance(data, str):
            content = data.encode()
        elif isinstance(data, (bytes, bytearray, memoryview)):
            content = bytes(data)
        else:
            size = _size_of(data) if hasattr(data, "read") else None
            if size is not None:
                headers["Content-Length"] = str(size)
            content = io.iter_chunks(data)
        doc = await self._t.json(
            "PUT", self._s._path("/files"), params=params, content=content, headers=headers,
            long=True,
        )
        return WriteInfo(str(doc.get("path", path)), int(doc.get("size", 0)))

    async def write_text(self, path: str, text: str, *, mkdirs: bool = False) -> WriteInfo:
        """Writes text (UTF-8) atomically; see :meth:`write`."""
        return await self.write(path, text, mkdirs=mkdirs)

    async def upload(
        self,
        path: str,
        source: Union[str, "os.PathLike[str]", IO[bytes]],
        *,
        mkdirs: bool = False,
        mode: Optional[int] = None,
    ) -> WriteInfo:
        """Streams a local file (a path or a binary file object) into the box."""
        if isinstance(source, (str, os.PathLike)):
            with open(source, "rb") as f:
                return await self.write(path, f, mkdirs=mkdirs, mode=mode)
        return await self.write(path, source, mkdirs=mkdirs, mode=mode)

    async def stat(self, path: str) -> FileInfo:
        """A path's metadata (:class:`NotFound` if it does not exist)."""
        return FileInfo.from_json(
            await self._t.json("GET", self._s._path("/stat"), params={"path": path})
        )

    async def exists(self, path: str) -> bool:
        """Whether the path exists."""
        from .errors import NotFound

        try:
            await self.stat(path)
            return True
        except NotFound:
            return False

    async def list(self, path: str = "/workspace") -> List[DirEntry]:
        """A directory's entries, sorted by name."""
        doc = await self._t.json("GET", self._s._path("/dir"), params={"path": path})
        return [DirEntry.from_json(e, path) for e in doc.get("entries", [])]

    async def mkdir(self, path: str) -> None:
        """Creates a directory and its parents (an existing one is fine)."""
        await self._t.request("POST", self._s._path("/mkdir"), json={"path": path})

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file or directory (a non-empty one needs ``recursive``)."""
        params = {"path": path, "recursive": "true" if recursive else None}
        await self._t.request("DELETE", self._s._path("/files"), params=params)

    async def rename(self, src: str, dst: str) -> None:
        """Renames (moves) ``src`` to ``dst`` within the box."""
        await self._t.request("POST", self._s._path("/rename"), json={"from": src, "to": dst})

    async def _snapshot(self, path: str, recursive: bool) -> Dict[str, Tuple[bool, int, str]]:
        from .errors import NotFound

        seen: Dict[str, Tuple[bool, int, str]] = {}
        dirs = [path]
        while dirs:
            d = dirs.pop()
            try:
                entries = await self.list(d)
            except NotFound:
                continue
            for e in entries:
                seen[e.path] = (e.is_dir, e.size, e.mod_time)
                if recursive and e.is_dir and not e.is_symlink:
                    dirs.append(e.path)
        return seen

    async def watch(
        self,
        path: str = "/workspace",
        *,
        recursive: bool = False,
        interval: float = 0.5,
        timeout: Optional[float] = None,
    ) -> AsyncIterator[FileEvent]:
        """Changes under directory ``path`` as they happen: ``created``, ``modified``,
        ``removed`` events. The daemon's /v1 API has no watch route, so this polls the
        directory listing every ``interval`` seconds (a change that is undone within one
        interval is not seen). Ends after ``timeout`` seconds if given."""
        before = await self._snapshot(path, recursive)
        deadline = None if timeout is None else _now() + timeout
        while deadline is None or _now() < deadline:
            await io.sleep(interval)
            now = await self._snapshot(path, recursive)
            for p, (is_dir, size, mtime) in sorted(now.items()):
                old = before.get(p)
                if old is None:
                    yield FileEvent("created", p, is_dir)
                elif not is_dir and (old[1], old[2]) != (size, mtime):
                    yield FileEvent("modified", p, is_dir)
            for p, (is_dir, _, _) in sorted(before.items()):
                if p not in now:
                    yield FileEvent("removed", p, is_dir)
            before = now


def _now() -> float:
    import time

    return time.monotonic()


# --- network, mounts -----------------------------------------------------------------------


class AsyncNetwork:
    """``session.network``: the session's network policy."""

    def __init__(self, session: "AsyncSession") -> None:
        self._s = session

    async def get(self) -> NetworkPolicy:
        """The session's current network policy."""
        return (await self._s.refresh()).network

    async def set(self, mode: str, allow: Optional[Sequence[str]] = None) -> NetworkPolicy:
        """Changes the policy of the live session (``none``, ``allowlist`` with ``allow``
        names, ``open``); it takes effect for new connections."""
        body = _drop_none({"mode": mode, "allow": list(allow) if allow is not None else None})
        doc = await self._s._t.json("POST", self._s._path("/network"), json=body)
        self._s.info = SessionInfo.from_json(doc)
        return self._s.info.network


class AsyncMounts:
    """``session.mounts``: host directories and skills mounted into the session."""

    def __init__(self, session: "AsyncSession") -> None:
        self._s = session

    async def list(self) -> List[Mount]:
        """The session's mounts (besides the workspace)."""
        return (await self._s.refresh()).mounts

    async def add(
        self,
        mounts: Sequence[Union[Mount, Mapping[str, str]]] = (),
        *,
        skills: Optional[Mapping[str, str]] = None,
        skill_mode: Optional[str] = None,
    ) -> MountsResult:
        """Adds mounts (``Mount(host_path, mount_path, mode)``) and skills (``name -> host
        dir``, mounted at ``/workspace/.skills/<name>``). ``applied`` in the result says
        whether they are visible now (``live``) or from the next resume (``next_start``)."""
        body: Json = {}
        if mounts:
            body["mounts"] = [m.to_json() if isinstance(m, Mount) else dict(m) for m in mounts]
        if skills:
            body["skills"] = dict(skills)
        if skill_mode is not None:
            body["skill_mode"] = skill_mode
        doc = await self._s._t.json("POST", self._s._path("/mounts"), json=body)
        self._s.info = SessionInfo.from_json(doc["session"])
        return MountsResult(self._s.info, str(doc.get("applied", "")))


# --- sessions ------------------------------------------------------------------------------


class AsyncSession:
    """One session (a persistent workspace and its box).

    Its sub-APIs: ``commands``, ``files``, ``processes``, ``pty``, ``network``, ``mounts``.
    As a context manager it ends the session on exit as ``on_exit`` says: ``"destroy"``
    (the default for sessions this client created), ``"suspend"`` or ``"keep"``.
    """

    def __init__(
        self, transport: AsyncTransport, info: SessionInfo, on_exit: str = "keep"
    ) -> None:
        if on_exit not in ("destroy", "suspend", "keep"):
            raise InvalidArgument("EINVAL", "on_exit must be destroy, suspend or keep")
        self._t = transport
        self.info = info
        self.on_exit = on_exit
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self.processes = AsyncProcesses(self)
        self.pty = AsyncPty(self)
        self.network = AsyncNetwork(self)
        self.mounts = AsyncMounts(self)

    @property
    def id(self) -> str:
        """The session's id."""
        return self.info.id

    def __repr__(self) -> str:
        return f"<Session {self.info.id} {self.info.state} backend={self.info.backend}>"

    def _path(self, suffix: str = "") -> str:
        return f"/v1/sessions/{_q(self.info.id)}{suffix}"

    async def _lifecycle(self, step: str) -> SessionInfo:
        self.info = SessionInfo.from_json(await self._t.json("POST", self._path("/" + step)))
        return self.info

    async def refresh(self) -> SessionInfo:
        """What the daemon says about the session now."""
        self.info = SessionInfo.from_json(await self._t.json("GET", self._path()))
        return self.info

    async def suspend(self) -> SessionInfo:
        """Stops the box, keeps the workspace (a later command resumes it)."""
        return await self._lifecycle("suspend")

    async def resume(self) -> SessionInfo:
        """Starts the box again (a suspended session)."""
        return await self._lifecycle("resume")

    async def keepalive(self) -> SessionInfo:
        """Resets the idle timer."""
        return await self._lifecycle("keepalive")

    async def destroy(self, *, archive: bool = False) -> Optional[str]:
        """Deletes the session and its workspace; with ``archive`` the workspace is kept as a
        ``.tar.zst`` whose path is returned (``sessions.restore`` brings it back)."""
        doc = await self._t.json(
            "DELETE", self._path(), params={"archive": "true" if archive else None}, long=True
        )
        return doc.get("archive")

    async def update(
        self,
        *,
        limits: Optional[Union[Limits, Mapping[str, int]]] = None,
        ttl_sec: Optional[int] = None,
        labels: Optional[Mapping[str, str]] = None,
    ) -> SessionInfo:
        """Changes the live session's limits (written to its cgroups in place), TTL or labels."""
        body: Json = {}
        if limits is not None:
            body["limits"] = limits.to_json() if isinstance(limits, Limits) else dict(limits)
        if ttl_sec is not None:
            body["ttl_sec"] = ttl_sec
        if labels is not None:
            body["labels"] = dict(labels)
        self.info = SessionInfo.from_json(await self._t.json("PATCH", self._path(), json=body))
        return self.info

    async def health(self) -> HealthReport:
        """Runs the session's health checks (the template's and the built-in ones)."""
        return HealthReport.from_json(
            await self._t.json("POST", self._path("/health"), long=True, wait=None)
        )

    async def repair(self) -> HealthReport:
        """Runs the repair of each failing check, then the checks again."""
        return HealthReport.from_json(
            await self._t.json("POST", self._path("/repair"), long=True, wait=None)
        )

    async def install_packages(
        self,
        manager: str,
        packages: Sequence[str],
        *,
        persist: bool = False,
        timeout: Optional[float] = None,
        index_url: Optional[str] = None,
        find_links: Optional[Sequence[str]] = None,
        no_index: Optional[bool] = None,
    ) -> PackageResult:
        """Installs ``pip`` or ``npm`` packages under the session's network policy; with
        ``persist`` they are recorded in the workspace manifest."""
        body = _drop_none(
            {
                "manager": manager,
                "packages": list(packages),
                "persist": persist or None,
                "timeout_sec": timeout,
                "index_url": index_url,
                "find_links": list(find_links) if find_links is not None else None,
                "no_index": no_index,
            }
        )
        return PackageResult.from_json(
            await self._t.json("POST", self._path("/packages"), json=body, wait=timeout, long=True)
        )

    async def move(self, node: str) -> SessionInfo:
        """Moves the session to another node of the cluster (API.md "Cluster")."""
        self.info = SessionInfo.from_json(
            await self._t.json("POST", self._path("/move"), json={"node": node}, long=True)
        )
        return self.info

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        from .errors import NotFound

        try:
            if self.on_exit == "destroy":
                await self.destroy()
            elif self.on_exit == "suspend":
                await self.suspend()
        except NotFound:
            pass


class AsyncSessionPager:
    """The caller's sessions, fetched a page at a time: ``async for s in pager`` gives
    :class:`AsyncSession` objects, ``pager.pages()`` the pages (lists)."""

    def __init__(self, transport: AsyncTransport, page_size: int) -> None:
        self._t = transport
        self._page_size = page_size

    async def pages(self) -> AsyncIterator[List[AsyncSession]]:
        """The sessions a page (a list) at a time, by id."""
        after: Optional[str] = None
        while True:
            doc = await self._t.json(
                "GET", "/v1/sessions", params={"limit": self._page_size, "after": after}
            )
            page = [AsyncSession(self._t, SessionInfo.from_json(s)) for s in doc["sessions"]]
            if page:
                yield page
            nxt = doc.get("next")
            if not nxt or not page:
                return
            after = str(nxt)

    def __aiter__(self) -> AsyncIterator[AsyncSession]:
        return self._items()

    async def _items(self) -> AsyncIterator[AsyncSession]:
        async for page in self.pages():
            for s in page:
                yield s


class AsyncSessions:
    """``client.sessions``."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def create(
        self,
        id: Optional[str] = None,
        *,
        scope: Optional[str] = None,
        variables: Optional[Mapping[str, Union[str, int]]] = None,
        backend: Optional[str] = None,
        runner: Optional[str] = None,
        template: Optional[str] = None,
        image: Optional[str] = None,
        read_only_rootfs: Optional[bool] = None,
        node: Optional[str] = None,
        mounts: Optional[Sequence[Union[Mount, Mapping[str, str]]]] = None,
        skills: Optional[Mapping[str, str]] = None,
        limits: Optional[Union[Limits, Mapping[str, int]]] = None,
        network: Optional[Union[NetworkPolicy, Mapping[str, Any]]] = None,
        env: Optional[Mapping[str, str]] = None,
        ttl_sec: Optional[int] = None,
        labels: Optional[Mapping[str, str]] = None,
        on_exit: str = "destroy",
    ) -> AsyncSession:
        """Creates a session, or returns the existing one with that id (idempotent).

        ``id`` or ``scope`` (``"{launcher_type}_{launcher_id}"`` rendered with ``variables``)
        names it; without either the daemon's default scope applies. ``on_exit`` says what
        leaving ``async with session`` does: ``destroy`` (default), ``suspend`` or ``keep``.
        Fields the daemon does not build yet are refused with :class:`NotSupported`.
        """
        net: Any = network
        if isinstance(network, NetworkPolicy):
            net = {"mode": network.mode, "allow": network.allow}
        body = _drop_none(
            {
                "id": id,
                "scope": scope,
                "variables": dict(variables) if variables is not None else None,
                "backend": backend,
                "runner": runner,
                "template": template,
                "image": image,
                "read_only_rootfs": read_only_rootfs,
                "node": node,
                "mounts": [m.to_json() if isinstance(m, Mount) else dict(m) for m in mounts]
                if mounts
                else None,
                "skills": dict(skills) if skills else None,
                "limits": limits.to_json() if isinstance(limits, Limits) else limits,
                "network": dict(net) if net is not None else None,
                "env": dict(env) if env is not None else None,
                "ttl_sec": ttl_sec,
                "labels": dict(labels) if labels is not None else None,
            }
        )
        doc = await self._t.json("POST", "/v1/sessions", json=body, long=True, wait=None)
        return AsyncSession(self._t, SessionInfo.from_json(doc), on_exit)

    async def get(self, id: str, *, on_exit: str = "keep") -> AsyncSession:
        """An existing session (:class:`NotFound` if there is none)."""
        doc = await self._t.json("GET", f"/v1/sessions/{_q(id)}")
        return AsyncSession(self._t, SessionInfo.from_json(doc), on_exit)

    def list(self, *, page_size: int = 100) -> AsyncSessionPager:
        """The caller's sessions (its tenant's), a page of ``page_size`` at a time."""
        return AsyncSessionPager(self._t, page_size)

    async def restore(self, id: str, archive: str, *, on_exit: str = "keep") -> AsyncSession:
        """Recreates session ``id`` from an archive made by ``destroy(archive=True)``
        (:class:`Conflict` if it exists)."""
        doc = await self._t.json(
            "POST", f"/v1/sessions/{_q(id)}/restore", json={"archive": archive}, long=True
        )
        return AsyncSession(self._t, SessionInfo.from_json(doc), on_exit)

    async def destroy(self, id: str, *, archive: bool = False) -> Optional[str]:
        """Deletes session ``id`` (see :meth:`AsyncSession.destroy`)."""
        doc = await self._t.json(
            "DELETE", f"/v1/sessions/{_q(id)}", params={"archive": "true" if archive else None},
            long=True,
        )
        return doc.get("archive")


# --- templates, images, runners, cluster ---------------------------------------------------


class AsyncTemplates:
    """``client.templates``: seed 004's templates, their builds and snapshots."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def create(self, yaml: str) -> Template:
        """Creates (or replaces) a template from its YAML."""
        doc = await self._t.json(
            "POST",
            "/v1/templates",
            content=yaml.encode(),
            headers={"Content-Type": "application/yaml"},
        )
        return Template.from_json(doc)

    async def list(self) -> List[Template]:
        """Every template."""
        doc = await self._t.json("GET", "/v1/templates")
        return [Template.from_json(t) for t in doc.get("templates", [])]

    async def get(self, name: str) -> Template:
        """One template by name (:class:`NotFound` if there is none)."""
        return Template.from_json(await self._t.json("GET", f"/v1/templates/{_q(name)}"))

    async def delete(self, name: str) -> None:
        """Deletes a template (:class:`Conflict` while a session uses one of its snapshots)."""
        await self._t.request("DELETE", f"/v1/templates/{_q(name)}")

    async def build(self, name: str, *, wait: bool = False) -> Build:
        """Starts a build (``state`` ``running``); with ``wait`` returns once it ended."""
        doc = await self._t.json(
            "POST",
            f"/v1/templates/{_q(name)}/build",
            params={"wait": "true" if wait else None},
            long=wait,
        )
        return Build.from_json(doc)

    async def get_build(self, name: str, build_id: str) -> Build:
        """A build's state, exit code and snapshot."""
        return Build.from_json(
            await self._t.json("GET", f"/v1/templates/{_q(name)}/builds/{_q(build_id)}")
        )

    async def build_log(
        self, name: str, build_id: str, *, follow: bool = False
    ) -> AsyncIterator[str]:
        """The build's log lines; with ``follow`` until the build ends."""
        path = f"/v1/templates/{_q(name)}/builds/{_q(build_id)}/log"
        async for j in self._t.ndjson(
            "GET", path, params={"follow": "true" if follow else None}, long=follow
        ):
            if "line" in j:
                yield str(j["line"])

    async def snapshots(self, name: str) -> List[Snapshot]:
        """The template's snapshots (``current`` marks the one new sessions get)."""
        doc = await self._t.json("GET", f"/v1/templates/{_q(name)}/snapshots")
        return [Snapshot.from_json(s) for s in doc.get("snapshots", [])]

    async def rollback(self, name: str, version: Any) -> Template:
        """Makes an older snapshot version current."""
        doc = await self._t.json(
            "POST", f"/v1/templates/{_q(name)}/rollback", json={"version": version}
        )
        return Template.from_json(doc)


class AsyncImages:
    """``client.images``: OCI images (API.md "Images")."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def pull(
        self, ref: str, *, on_progress: Optional[Callable[[PullProgress], Any]] = None
    ) -> Image:
        """Pulls ``ref`` from its registry; ``on_progress`` gets each layer's progress."""
        if on_progress is None:
            doc = await self._t.json("POST", "/v1/images", json={"ref": ref}, long=True)
            return Image.from_json(doc)
        image: Optional[Image] = None
        async for j in self._t.ndjson(
            "POST",
            "/v1/images",
            json={"ref": ref},
            headers={"Accept": "application/x-ndjson"},
        ):
            if "image" in j:
                image = Image.from_json(j["image"])
            elif "error" in j:
                e = j["error"] if isinstance(j["error"], dict) else {}
                raise error_from_code(str(e.get("code")), str(e.get("message", "")))
            else:
                total = j.get("total")
                on_progress(
                    PullProgress(
                        str(j.get("layer", "")),
                        int(j.get("bytes", 0)),
                        None if total is None else int(total),
                    )
                )
        if image is None:
            raise Unavailable("EUNAVAILABLE", f"pull of {ref}: the stream ended without the image")
        return image

    async def list(self) -> List[Image]:
        """The images the daemon has pulled."""
        doc = await self._t.json("GET", "/v1/images")
        return [Image.from_json(i) for i in doc.get("images", [])]

    async def get(self, ref_or_digest: str) -> Image:
        """One image by ref or digest."""
        return Image.from_json(await self._t.json("GET", f"/v1/images/{_q(ref_or_digest)}"))

    async def delete(self, digest: str) -> None:
        """Deletes an image (:class:`Conflict` while a session or template uses it)."""
        await self._t.request("DELETE", f"/v1/images/{_q(digest)}")


class AsyncRunners:
    """``client.runners``: the remote runners of the caller's tenant."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def list(self) -> List[Runner]:
        """Each runner configured for the caller's tenant, connected or not."""
        doc = await self._t.json("GET", "/v1/runners")
        return [Runner.from_json(r) for r in doc.get("runners", [])]


class AsyncCluster:
    """``client.cluster``: the daemon's cluster (API.md "Cluster")."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def info(self) -> ClusterInfo:
        """The cluster's mode, this node and every node."""
        return ClusterInfo.from_json(await self._t.json("GET", "/v1/cluster"))

    async def cordon(self, node: str) -> None:
        """Stops placements on ``node`` (admin)."""
        await self._t.request("POST", f"/v1/cluster/nodes/{_q(node)}/cordon")

    async def uncordon(self, node: str) -> None:
        """Lets placements on ``node`` again (admin)."""
        await self._t.request("POST", f"/v1/cluster/nodes/{_q(node)}/uncordon")


class AsyncClient:
    """A client of one agentboxd.

    Args:
        url: the daemon's base URL (default ``$AGENTBOX_URL``, else ``http://127.0.0.1:9090``).
        token: the API token (default ``$AGENTBOX_TOKEN``; none when unset).
        timeout: the request timeout in seconds: how long a request may wait for the daemon.
            A command's own ``timeout`` is separate (its request may take that long plus this).
        headers: extra HTTP headers for every request.
        http: an ``httpx.AsyncClient`` to use instead of one of its own (not closed by this).

    ``async with AsyncClient() as c:`` closes the connections and WebSockets it opened.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        timeout: float = 30.0,
        headers: Optional[Mapping[str, str]] = None,
        http: Optional[httpx.AsyncClient] = None,
    ) -> None:
        self._t = AsyncTransport(url, token, timeout, headers, http)
        self.sessions = AsyncSessions(self._t)
        self.templates = AsyncTemplates(self._t)
        self.images = AsyncImages(self._t)
        self.runners = AsyncRunners(self._t)
        self.cluster = AsyncCluster(self._t)

    @property
    def url(self) -> str:
        """The daemon's base URL."""
        return self._t.url

    async def healthz(self) -> Json:
        """``GET /healthz``: liveness (no token needed)."""
        return await self._t.json("GET", "/healthz")

    async def ready(self) -> bool:
        """``GET /readyz``: whether the backend is usable."""
        try:
            await self._t.request("GET", "/readyz")
            return True
        except Unavailable:
            return False

    async def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text."""
        return (await self._t.request("GET", "/metrics")).text

    async def aclose(self) -> None:
        """Closes the client's connections and WebSockets."""
        await self._t.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
