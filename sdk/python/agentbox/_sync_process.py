"""The sync client: GENERATED from its _async*.py twin by scripts/unasync.py; do not
edit. Every class here has the surface of its Async* twin, blocking.
"""


from __future__ import annotations

from typing import (
    TYPE_CHECKING,
    Iterator,
    List,
    Literal,
    Mapping,
    Optional,
    Tuple,
    Union,
    overload,
)

from . import _io_sync as io
from ._sync_transport import (
    Command,
    OutputCallback,
    _command_fields,
    _drop_none,
    _now,
    _parse_close,
    _q,
)
from .errors import (
    AgentboxError,
    CommandError,
    InvalidArgument,
    Timeout,
    Unavailable,
    error_from_code,
)
from .models import CommandResult, Json, OutputRecord, ProcessInfo

if TYPE_CHECKING:
    from ._sync import Session

# --- commands ------------------------------------------------------------------------------


class Commands:
    """``session.commands``: run a command to completion, streamed, or in the background."""

    def __init__(self, session: "Session") -> None:
        self._s = session
        self._t = session._t

    @overload
    def run(
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
    def run(
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
    ) -> "Process": ...

    def run(
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
    ) -> Union[CommandResult, "Process"]:
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
            return self.start(cmd, env=env, cwd=cwd, tag=tag)
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
            doc = self._t.json("POST", path, json=body, wait=timeout, long=True)
            result = CommandResult.from_json(doc)
        else:
            out: List[str] = []
            err: List[str] = []
            last: Json = {}
            for ev in self._t.ndjson(
                "POST", path + "/stream", json=body, wait=timeout, long=True
            ):
                kind = ev.get("type")
                if kind == "stdout":
                    out.append(str(ev.get("data", "")))
                    io.call(on_stdout, str(ev.get("data", "")))
                elif kind == "stderr":
                    err.append(str(ev.get("data", "")))
                    io.call(on_stderr, str(ev.get("data", "")))
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

    def start(
        self,
        cmd: Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        tag: Optional[str] = None,
        stdin: bool = True,
    ) -> "Process":
        """Starts ``cmd`` in the background and returns its handle (``wait``, ``kill``,
        ``send_stdin``, ``logs``). The command outlives this request and this client: reconnect
        to it later with :meth:`connect` by its pid or tag."""
        return self._s.processes.start(cmd, env=env, cwd=cwd, tag=tag, stdin=stdin)

    def connect(self, ref: Union[int, str]) -> "Process":
        """The handle of a background command (or any process) by its pid or tag."""
        return self._s.processes.connect(ref)


class Process:
    """A process in a session: a background command, a managed service, a pty program.

    ``info`` is what the daemon last said about it (``refresh()`` asks again).
    """

    def __init__(self, session: "Session", info: ProcessInfo) -> None:
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

    def refresh(self) -> ProcessInfo:
        """Asks the daemon for the process's state now."""
        self.info = ProcessInfo.from_json(self._t.json("GET", self._path()))
        return self.info

    def wait(
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
            for rec in self.logs(follow=True, wait=timeout):
                if deadline is not None and _now() > deadline and rec.type != "exit":
                    raise Timeout("ETIMEDOUT", "deadline")
                if rec.type in ("stdout", "pty"):
                    out.append(rec.data)
                    io.call(on_stdout, rec.data)
                elif rec.type == "stderr":
                    err.append(rec.data)
                    io.call(on_stderr, rec.data)
                elif rec.type == "exit":
                    end = rec
        except Timeout:
            raise Timeout("ETIMEDOUT", f"process {self.pid} still running after {timeout} s")
        if end is None:
            self.refresh()
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
        self.refresh()
        if check and result.exit_code != 0:
            raise CommandError(result)
        return result

    def logs(
        self, *, follow: bool = False, since: Optional[int] = None, wait: Optional[float] = None
    ) -> Iterator[OutputRecord]:
        """The process's output records from byte ``since`` (default: the oldest kept); with
        ``follow`` until it ends (the last record is then ``type == "exit"``). ``wait`` bounds
        the wait for each next record (:class:`Timeout` past it)."""
        params = {"follow": "true" if follow else None, "since": since}
        long: Union[bool, str] = "exact" if wait is not None else follow
        for j in self._t.ndjson(
            "GET", self._path("/output"), params=params, wait=wait, long=long
        ):
            yield OutputRecord.from_json(j)

    def send_stdin(self, data: Union[bytes, str], *, close: bool = False) -> None:
        """Writes to the process's stdin (started with ``stdin=True``); ``close`` then closes it."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        self._t.request(
            "POST",
            self._path("/stdin"),
            params={"close": "true" if close else None},
            content=raw,
            headers={"Content-Type": "application/octet-stream"},
        )

    def close_stdin(self) -> None:
        """Closes the process's stdin (it reads EOF)."""
        self.send_stdin(b"", close=True)

    def signal(self, signal: Union[str, int]) -> ProcessInfo:
        """Sends ``SIGINT``, ``SIGTERM``, ``SIGKILL``, ``SIGHUP``, ``SIGUSR1`` or ``SIGUSR2``."""
        doc = self._t.json("POST", self._path("/signal"), json={"signal": signal})
        self.info = ProcessInfo.from_json(doc)
        return self.info

    def kill(self) -> ProcessInfo:
        """Kills the process and everything it started (and ends a managed one's supervision);
        returns its final state."""
        self.info = ProcessInfo.from_json(self._t.json("DELETE", self._path()))
        return self.info

    def resize(self, cols: int, rows: int) -> None:
        """Resizes the process's terminal (pty processes only)."""
        self._t.request("POST", self._path("/resize"), json={"cols": cols, "rows": rows})

    def attach(self) -> "Terminal":
        """A WebSocket to the process's terminal (pty processes): its bytes both ways."""
        ws = self._t.websocket(self._path("/attach"))
        return Terminal(ws)

    def attach_stdio(self) -> "LineChannel":
        """A WebSocket to a process without a pty: a line to stdin per ``send_line``, a stdout
        line per ``recv_line`` (MCP stdio servers speak newline-delimited JSON this way)."""
        ws = self._t.websocket(self._path("/attach"))
        return LineChannel(ws)


class Processes:
    """``session.processes``: processes that outlive the request that started them."""

    def __init__(self, session: "Session") -> None:
        self._s = session
        self._t = session._t

    def start(
        self,
        cmd: Command,
        *,
        tag: Optional[str] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: bool = False,
        pty: Optional[Tuple[int, int]] = None,
        restart: str = "never",
    ) -> Process:
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
        doc = self._t.json("POST", self._s._path("/processes"), json=body)
        return Process(self._s, ProcessInfo.from_json(doc))

    def list(self) -> List[ProcessInfo]:
        """Live processes and those that ended in the last minutes."""
        doc = self._t.json("GET", self._s._path("/processes"))
        return [ProcessInfo.from_json(p) for p in doc.get("processes", [])]

    def get(self, ref: Union[int, str]) -> ProcessInfo:
        """One process by pid or tag."""
        return ProcessInfo.from_json(
            self._t.json("GET", self._s._path(f"/processes/{_q(str(ref))}"))
        )

    def connect(self, ref: Union[int, str]) -> Process:
        """The handle of a process by pid or tag (reconnect to a background command)."""
        return Process(self._s, self.get(ref))

    def kill(self, ref: Union[int, str]) -> ProcessInfo:
        """Kills a process by pid or tag; returns its final state."""
        return (self.connect(ref)).kill()

    def logs(
        self, ref: Union[int, str], *, follow: bool = False, since: Optional[int] = None
    ) -> Iterator[OutputRecord]:
        """A process's output records (see :meth:`Process.logs`)."""
        proc = self.connect(ref)
        for rec in proc.logs(follow=follow, since=since):
            yield rec

    def attach(self, ref: Union[int, str]) -> "Terminal":
        """Attaches to a pty process's terminal (see :meth:`Process.attach`)."""
        return (self.connect(ref)).attach()

    def attach_stdio(self, ref: Union[int, str]) -> "LineChannel":
        """Attaches to a process's stdin/stdout by lines (see :meth:`Process.attach_stdio`)."""
        return (self.connect(ref)).attach_stdio()


# --- terminals -----------------------------------------------------------------------------


class Terminal:
    """A terminal over a WebSocket: ``write`` keystrokes, ``resize``, iterate the output bytes.

    When the program ends the daemon closes the socket; ``exit_code`` (or ``signal``) then says
    how it ended. Leaving ``with`` closes the socket, which ends a terminal from
    ``session.pty.open``.
    """

    def __init__(self, ws: io.WebSocket) -> None:
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

    def write(self, data: Union[bytes, str]) -> None:
        """Sends keystrokes (``str`` is UTF-8 encoded)."""
        self._ws.send(data.encode() if isinstance(data, str) else bytes(data))

    def resize(self, cols: int, rows: int) -> None:
        """Resizes the terminal to ``cols`` x ``rows``."""
        self._ws.send_json({"type": "resize", "cols": cols, "rows": rows})

    def read(self, timeout: Optional[float] = None) -> Optional[bytes]:
        """The next output bytes, or ``None`` once the terminal closed."""
        if self._buf:
            data, self._buf = self._buf, b""
            return data
        while True:
            frame = self._ws.recv(timeout)
            if frame is None:
                return None
            data = frame.encode() if isinstance(frame, str) else frame
            if data:
                return data

    def read_until(self, marker: Union[bytes, str], timeout: float = 10.0) -> bytes:
        """Reads until ``marker`` appears; returns everything up to and including it (the rest
        stays for the next read). :class:`Timeout` if it does not appear in ``timeout`` s."""
        want = marker.encode() if isinstance(marker, str) else marker
        deadline = _now() + timeout
        got = b""
        while want not in got:
            left = deadline - _now()
            if left <= 0:
                self._buf = got + self._buf  # nothing read is lost to the next read
                raise Timeout("ETIMEDOUT", f"{want!r} not seen in {timeout} s; got {got[-200:]!r}")
            try:
                chunk = self.read(left)
            except Timeout:
                self._buf = got + self._buf
                raise Timeout(
                    "ETIMEDOUT", f"{want!r} not seen in {timeout} s; got {got[-200:]!r}"
                ) from None
            if chunk is None:
                raise AgentboxError("ECLOSED", f"terminal closed before {want!r}; got {got!r}")
            got += chunk
        end = got.index(want) + len(want)
        self._buf = got[end:] + self._buf
        return got[:end]

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Reads (and drops) output until the program ends; returns its exit code."""
        while self.read(timeout) is not None:
            pass
        return self.exit_code

    def close(self) -> None:
        """Closes the WebSocket (a terminal from ``pty.open`` ends its program)."""
        self._ws.close()

    def __iter__(self) -> Iterator[bytes]:
        return self._iter()

    def _iter(self) -> Iterator[bytes]:
        while True:
            data = self.read()
            if data is None:
                return
            yield data

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LineChannel:
    """A process's stdin and stdout as lines over a WebSocket (``attach_stdio``)."""

    def __init__(self, ws: io.WebSocket) -> None:
        self._ws = ws

    @property
    def exit_code(self) -> Optional[int]:
        """The process's exit code once it ended."""
        return _parse_close(self._ws.close_reason)[0]

    def send_line(self, line: str) -> None:
        """One line to the process's stdin (the newline is added)."""
        self._ws.send(line)

    def recv_line(self, timeout: Optional[float] = None) -> Optional[str]:
        """The next stdout line, or ``None`` once the process ended."""
        frame = self._ws.recv(timeout)
        if frame is None:
            return None
        return frame if isinstance(frame, str) else frame.decode("utf-8", "replace")

    def close(self) -> None:
        """Closes the WebSocket (the process keeps running)."""
        self._ws.close()

    def __iter__(self) -> Iterator[str]:
        return self._iter()

    def _iter(self) -> Iterator[str]:
        while True:
            line = self.recv_line()
            if line is None:
                return
            yield line

    def __enter__(self) -> "LineChannel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Pty:
    """``session.pty``: interactive terminals."""

    def __init__(self, session: "Session") -> None:
        self._s = session

    def open(
        self, *, cols: int = 80, rows: int = 24, command: Optional[str] = None
    ) -> Terminal:
        """Starts ``command`` (default: the daemon's shell) on a new terminal and attaches to
        it. The program ends when the terminal is closed."""
        ws = self._s._t.websocket(
            self._s._path("/pty"), {"cols": cols, "rows": rows, "command": command}
        )
        return Terminal(ws)
