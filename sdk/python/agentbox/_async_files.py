"""``session.files``, ``session.network`` and ``session.mounts``.

Part of the async client; the sync twin is generated from it by ``scripts/unasync.py``
(``async``/``await`` dropped, ``Async*`` names without the prefix, ``_async*`` modules ->
``_sync*``, ``_io_async`` -> ``_io_sync``): edit this file, then run
``python3 sdk/python/scripts/unasync.py``."""

from __future__ import annotations

import os
from typing import IO, TYPE_CHECKING, Any, AsyncIterator, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _io_async as io
from ._async_transport import FileData, _drop_none, _now
from .errors import NotFound
from .models import DirEntry, FileEvent, FileInfo, Json, Mount, MountsResult, NetworkPolicy, SessionInfo, WriteInfo

if TYPE_CHECKING:
    from ._async import AsyncSession

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
