"""The sync client: GENERATED from its _async*.py twin by scripts/unasync.py; do not
edit. Every class here has the surface of its Async* twin, blocking.
"""


from __future__ import annotations

import os
from typing import IO, TYPE_CHECKING, Any, Iterator, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _io_sync as io
from ._sync_transport import FileData, _drop_none, _now
from .errors import NotFound
from .models import DirEntry, FileEvent, FileInfo, Json, Mount, MountsResult, NetworkPolicy, SessionInfo, WriteInfo

if TYPE_CHECKING:
    from ._sync import Session

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


class Files:
    """``session.files``: the files of the box (paths absolute in the box or relative to
    ``/workspace``)."""

    def __init__(self, session: "Session") -> None:
        self._s = session
        self._t = session._t

    def read(self, path: str) -> bytes:
        """A whole file, as bytes (use :meth:`download` or :meth:`iter_bytes` for big ones)."""
        r = self._t.request("GET", self._s._path("/files"), params={"path": path}, long=True)
        return r.content

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """A whole file, decoded."""
        return (self.read(path)).decode(encoding)

    def iter_bytes(self, path: str, chunk_size: int = io.CHUNK) -> Iterator[bytes]:
        """A file's bytes as they stream from the daemon, never all in memory."""
        with self._t.stream("GET", self._s._path("/files"), params={"path": path}) as r:
            for chunk in r.iter_bytes(chunk_size):
                yield chunk

    def download(self, path: str, dest: Union[str, "os.PathLike[str]", IO[bytes]]) -> int:
        """Streams a file into ``dest`` (a local path or a binary file object); returns the
        number of bytes."""
        if isinstance(dest, (str, os.PathLike)):
            with open(dest, "wb") as f:
                return self.download(path, f)
        n = 0
        for chunk in self.iter_bytes(path):
            io.write_to(dest, chunk)
            n += len(chunk)
        return n

    def write(
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
        doc = self._t.json(
            "PUT", self._s._path("/files"), params=params, content=content, headers=headers,
            long=True,
        )
        return WriteInfo(str(doc.get("path", path)), int(doc.get("size", 0)))

    def write_text(self, path: str, text: str, *, mkdirs: bool = False) -> WriteInfo:
        """Writes text (UTF-8) atomically; see :meth:`write`."""
        return self.write(path, text, mkdirs=mkdirs)

    def upload(
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
                return self.write(path, f, mkdirs=mkdirs, mode=mode)
        return self.write(path, source, mkdirs=mkdirs, mode=mode)

    def stat(self, path: str) -> FileInfo:
        """A path's metadata (:class:`NotFound` if it does not exist)."""
        return FileInfo.from_json(
            self._t.json("GET", self._s._path("/stat"), params={"path": path})
        )

    def exists(self, path: str) -> bool:
        """Whether the path exists."""
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def list(self, path: str = "/workspace") -> List[DirEntry]:
        """A directory's entries, sorted by name."""
        doc = self._t.json("GET", self._s._path("/dir"), params={"path": path})
        return [DirEntry.from_json(e, path) for e in doc.get("entries", [])]

    def mkdir(self, path: str) -> None:
        """Creates a directory and its parents (an existing one is fine)."""
        self._t.request("POST", self._s._path("/mkdir"), json={"path": path})

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file or directory (a non-empty one needs ``recursive``)."""
        params = {"path": path, "recursive": "true" if recursive else None}
        self._t.request("DELETE", self._s._path("/files"), params=params)

    def rename(self, src: str, dst: str) -> None:
        """Renames (moves) ``src`` to ``dst`` within the box."""
        self._t.request("POST", self._s._path("/rename"), json={"from": src, "to": dst})

    def _snapshot(self, path: str, recursive: bool) -> Dict[str, Tuple[bool, int, str]]:
        seen: Dict[str, Tuple[bool, int, str]] = {}
        dirs = [path]
        while dirs:
            d = dirs.pop()
            try:
                entries = self.list(d)
            except NotFound:
                continue
            for e in entries:
                seen[e.path] = (e.is_dir, e.size, e.mod_time)
                if recursive and e.is_dir and not e.is_symlink:
                    dirs.append(e.path)
        return seen

    def watch(
        self,
        path: str = "/workspace",
        *,
        recursive: bool = False,
        interval: float = 0.5,
        timeout: Optional[float] = None,
    ) -> Iterator[FileEvent]:
        """Changes under directory ``path`` as they happen: ``created``, ``modified``,
        ``removed`` events. The daemon's /v1 API has no watch route, so this polls the
        directory listing every ``interval`` seconds (a change that is undone within one
        interval is not seen). Ends after ``timeout`` seconds if given."""
        before = self._snapshot(path, recursive)
        deadline = None if timeout is None else _now() + timeout
        while deadline is None or _now() < deadline:
            io.sleep(interval)
            now = self._snapshot(path, recursive)
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


class Network:
    """``session.network``: the session's network policy."""

    def __init__(self, session: "Session") -> None:
        self._s = session

    def get(self) -> NetworkPolicy:
        """The session's current network policy."""
        return (self._s.refresh()).network

    def set(self, mode: str, allow: Optional[Sequence[str]] = None) -> NetworkPolicy:
        """Changes the policy of the live session (``none``, ``allowlist`` with ``allow``
        names, ``open``); it takes effect for new connections."""
        body = _drop_none({"mode": mode, "allow": list(allow) if allow is not None else None})
        doc = self._s._t.json("POST", self._s._path("/network"), json=body)
        self._s.info = SessionInfo.from_json(doc)
        return self._s.info.network


class Mounts:
    """``session.mounts``: host directories and skills mounted into the session."""

    def __init__(self, session: "Session") -> None:
        self._s = session

    def list(self) -> List[Mount]:
        """The session's mounts (besides the workspace)."""
        return (self._s.refresh()).mounts

    def add(
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
        doc = self._s._t.json("POST", self._s._path("/mounts"), json=body)
        self._s.info = SessionInfo.from_json(doc["session"])
        return MountsResult(self._s.info, str(doc.get("applied", "")))
