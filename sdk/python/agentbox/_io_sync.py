"""The I/O primitives of the sync client (the generated ``_sync.py``); the same names as
``_io_async.py``. WebSockets run on one private event-loop thread (websockets 10 has no
blocking client); everything else is plain blocking I/O."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import IO, Any, Callable, Coroutine, Dict, Iterator, Optional, TypeVar, Union

from . import _io_async

CHUNK = _io_async.CHUNK
T = TypeVar("T")


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def call(callback: Optional[Callable[[str], Any]], data: str) -> None:
    if callback is not None:
        callback(data)


def iter_chunks(source: Union[IO[bytes], Any]) -> Iterator[bytes]:
    """The bytes of a binary file object or an iterable of bytes, a chunk at a time."""
    if hasattr(source, "read"):
        while True:
            chunk = source.read(CHUNK)
            if not chunk:
                return
            yield bytes(chunk)
    else:
        for chunk in source:
            yield bytes(chunk)


def write_to(sink: IO[bytes], data: bytes) -> None:
    sink.write(data)


class _LoopThread:
    """One event loop on a daemon thread, shared by every sync WebSocket of the process."""

    _lock = threading.Lock()
    _loop: Optional[asyncio.AbstractEventLoop] = None

    @classmethod
    def run(cls, coro: Coroutine[Any, Any, T]) -> T:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="agentbox-ws", daemon=True).start()
                cls._loop = loop
            loop = cls._loop
        return asyncio.run_coroutine_threadsafe(coro, loop).result()


class WebSocket:
    """The blocking face of :class:`agentbox._io_async.AsyncWebSocket`."""

    def __init__(self, ws: _io_async.AsyncWebSocket) -> None:
        self._ws = ws

    @property
    def close_code(self) -> Optional[int]:
        return self._ws.close_code

    @property
    def close_reason(self) -> str:
        return self._ws.close_reason

    def send(self, data: Union[bytes, str]) -> None:
        _LoopThread.run(self._ws.send(data))

    def send_json(self, obj: Dict[str, Any]) -> None:
        _LoopThread.run(self._ws.send_json(obj))

    def recv(self, timeout: Optional[float] = None) -> Union[bytes, str, None]:
        return _LoopThread.run(self._ws.recv(timeout))

    def close(self) -> None:
        _LoopThread.run(self._ws.close())


def ws_connect(url: str, headers: Dict[str, str], open_timeout: Optional[float]) -> WebSocket:
    return WebSocket(_LoopThread.run(_io_async.ws_connect(url, headers, open_timeout)))
