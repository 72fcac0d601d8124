"""The I/O primitives of the async client (``_async.py``); ``_io_sync.py`` has the same names
for the generated sync client. Only these differ between the two."""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import IO, Any, AsyncIterator, Callable, Dict, Optional, Union

import websockets.client
import websockets.exceptions

from .errors import AgentboxError, Timeout, Unavailable, error_from_reply

CHUNK = 1 << 20  # what a streamed upload reads at a time


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def call(callback: Optional[Callable[[str], Any]], data: str) -> None:
    """Calls an output callback; a coroutine function's result is awaited."""
    if callback is None:
        return
    r = callback(data)
    if inspect.isawaitable(r):
        await r


async def iter_chunks(source: Union[IO[bytes], Any]) -> AsyncIterator[bytes]:
    """The bytes of a binary file object (read in a worker thread) or of an (async) iterable of
    bytes, a chunk at a time."""
    if hasattr(source, "read"):
        while True:
            chunk = await asyncio.to_thread(source.read, CHUNK)
            if not chunk:
                return
            yield bytes(chunk)
    elif hasattr(source, "__aiter__"):
        async for chunk in source:
            yield bytes(chunk)
    else:
        for chunk in source:
            yield bytes(chunk)


async def write_to(sink: IO[bytes], data: bytes) -> None:
    await asyncio.to_thread(sink.write, data)


def _close_reason(e: websockets.exceptions.ConnectionClosed) -> tuple[Optional[int], str]:
    if e.rcvd is not None:
        return e.rcvd.code, e.rcvd.reason
    return None, ""


class AsyncWebSocket:
    """A client WebSocket: frames in and out, and how the server closed it."""

    def __init__(self, ws: websockets.client.WebSocketClientProtocol) -> None:
        self._ws = ws
        self.close_code: Optional[int] = None
        self.close_reason: str = ""

    @classmethod
    async def connect(
        cls, url: str, headers: Dict[str, str], open_timeout: Optional[float]
    ) -> "AsyncWebSocket":
        try:
            ws = await websockets.client.connect(
                url,
                extra_headers=headers,
                open_timeout=open_timeout,
                max_size=16 << 20,
                compression=None,
                ping_interval=None,
            )
        except websockets.exceptions.InvalidStatusCode as e:
            raise error_from_reply(e.status_code, b"", {}) from None
        except asyncio.TimeoutError:
            raise Timeout("ETIMEDOUT", f"WebSocket handshake with {url} timed out") from None
        except (OSError, websockets.exceptions.WebSocketException) as e:
            raise Unavailable("EUNAVAILABLE", f"WebSocket {url}: {e}") from None
        return cls(ws)

    async def send(self, data: Union[bytes, str]) -> None:
        """Sends one frame: binary for bytes, text for str."""
        try:
            await self._ws.send(data)
        except websockets.exceptions.ConnectionClosed as e:
            self.close_code, self.close_reason = _close_reason(e)
            raise AgentboxError("ECLOSED", "the WebSocket is closed") from None

    async def send_json(self, obj: Dict[str, Any]) -> None:
        await self.send(json.dumps(obj))

    async def recv(self, timeout: Optional[float] = None) -> Union[bytes, str, None]:
        """The next frame, or ``None`` once the server closed the socket. Raises
        :class:`Timeout` when ``timeout`` seconds pass first."""
        try:
            return await asyncio.wait_for(self._ws.recv(), timeout)
        except asyncio.TimeoutError:
            raise Timeout("ETIMEDOUT", f"no WebSocket frame in {timeout} s") from None
        except websockets.exceptions.ConnectionClosed as e:
            self.close_code, self.close_reason = _close_reason(e)
            return None

    async def close(self) -> None:
        await self._ws.close()
        if self.close_code is None and self._ws.close_rcvd is not None:
            self.close_code = self._ws.close_rcvd.code
            self.close_reason = self._ws.close_rcvd.reason


async def ws_connect(
    url: str, headers: Dict[str, str], open_timeout: Optional[float]
) -> AsyncWebSocket:
    return await AsyncWebSocket.connect(url, headers, open_timeout)
