"""Typed views of the API's objects (docs/openapi.yaml, API.md).

Each model is a frozen dataclass built from the daemon's JSON by ``from_json``; ``raw`` keeps
the whole object, so a field a newer daemon adds is still reachable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

Json = Dict[str, Any]


def _opt_int(v: Any) -> Optional[int]:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _str_map(v: Any) -> Dict[str, str]:
    return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else {}


@dataclass(frozen=True)
class Limits:
    """A session's resource limits (the effective ones: defaults filled in)."""

    memory_mb: Optional[int] = None
    cpu_percent: Optional[int] = None
    max_pids: Optional[int] = None
    disk_mb: Optional[int] = None
    max_open_files: Optional[int] = None
    cpu_time_sec: Optional[int] = None
    tmp_mb: Optional[int] = None

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> "Limits":
        return cls(**{k: _opt_int(j.get(k)) for k in cls.__dataclass_fields__})

    def to_json(self) -> Json:
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if getattr(self, k) is not None}


@dataclass(frozen=True)
class NetworkPolicy:
    """``mode`` is ``none`` (loopback only), ``allowlist`` (via the box's proxy) or ``open``."""

    mode: str = "none"
    allow: List[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> "NetworkPolicy":
        return cls(mode=str(j.get("mode", "none")), allow=[str(a) for a in j.get("allow") or []])


@dataclass(frozen=True)
class Mount:
    """A host directory mounted into a box: ``mode`` is ``ro`` or ``rw``."""

    host_path: str
    mount_path: str
    mode: str = "ro"

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> "Mount":
        return cls(str(j["host_path"]), str(j["mount_path"]), str(j.get("mode", "ro")))

    def to_json(self) -> Json:
        return {"host_path": self.host_path, "mount_path": self.mount_path, "mode": self.mode}


@dataclass(frozen=True)
class SessionInfo:
    """What ``GET /v1/sessions/{id}`` says about a session."""

    id: str
    state: str
    backend: str
    workspace: str
    created_at: str
    last_used_at: str
    limits: Limits
    network: NetworkPolicy
    labels: Dict[str, str]
    uid: Optional[int]
    mounts: List[Mount]
    skills: Dict[str, str]
    template: Optional[str]
    runner: Optional[str]
    ttl_sec: Optional[int]
    node: Optional[str]
    image: Optional[Dict[str, Any]]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, j: Json) -> "SessionInfo":
        return cls(
            id=str(j["id"]),
            state=str(j.get("state", "")),
            backend=str(j.get("backend", "")),
            workspace=str(j.get("workspace", "")),
            created_at=str(j.get("created_at", "")),
            last_used_at=str(j.get("last_used_at", "")),
            limits=Limits.from_json(j.get("limits") or {}),
            network=NetworkPolicy.from_json(j.get("network") or {}),
            labels=_str_map(j.get("labels")),
            uid=_opt_int(j.get("uid")),
            mounts=[Mount.from_json(m) for m in j.get("mounts") or []],
            skills=_str_map(j.get("skills")),
            template=j.get("template"),
            runner=j.get("runner"),
            ttl_sec=_opt_int(j.get("ttl_sec")),
            node=j.get("node"),
            image=j.get("image"),
            raw=j,
        )


@dataclass(frozen=True)
class Artifact:
    """A file a command left in its ``artifact_dir``."""

    path: str
    size: int
    mime_type: str


@dataclass(frozen=True)
class CommandResult:
    """How a command ended, with its output.

    ``exit_code`` is ``-1`` when it timed out or was killed; ``killed_by`` says why
    (``timeout``, ``cpu_time``, ``memory``, ``pids``); ``signal`` is the signal number that
    ended it, if one did.
    """

    stdout: str
    stderr: str
    exit_code: int
    signal: Optional[int] = None
    timed_out: bool = False
    killed_by: Optional[str] = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: int = 0
    artifacts: List[Artifact] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.exit_code == 0

    @classmethod
    def from_json(cls, j: Mapping[str, Any], stdout: str = "", stderr: str = "") -> "CommandResult":
        return cls(
            stdout=str(j.get("stdout", stdout)),
            stderr=str(j.get("stderr", stderr)),
            exit_code=int(j.get("exit_code", -1)),
            signal=_opt_int(j.get("signal")),
            timed_out=bool(j.get("timed_out", False)),
            killed_by=j.get("killed_by"),
            stdout_truncated=bool(j.get("stdout_truncated", False)),
            stderr_truncated=bool(j.get("stderr_truncated", False)),
            duration_ms=int(j.get("duration_ms", 0) or 0),
            artifacts=[
                Artifact(str(a["path"]), int(a.get("size", 0)), str(a.get("mime_type", "")))
                for a in j.get("artifacts") or []
            ],
        )


@dataclass(frozen=True)
class FileInfo:
    """``stat`` of a path in the box; ``mode`` is the POSIX ``st_mode``."""

    name: str
    path: str
    size: int
    mode: int
    mod_time: str
    is_dir: bool
    is_symlink: bool

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> "FileInfo":
        return cls(
            name=str(j.get("name", "")),
            path=str(j.get("path", "")),
            size=int(j.get("size", 0)),
            mode=int(j.get("mode", 0)),
            mod_time=str(j.get("mod_time", "")),
            is_dir=bool(j.get("is_dir", False)),
            is_symlink=bool(j.get("is_symlink", False)),
        )


@dataclass(frozen=True)
class DirEntry:
    """One entry of a directory listing (``path`` is the listed dir joined with ``name``)."""

    name: str
    path: str
    size: int
    mode: int
    mod_time: str
    is_dir: bool
    is_symlink: bool

    @classmethod
    def from_json(cls, j: Mapping[str, Any], parent: str) -> "DirEntry":
        name = str(j.get("name", ""))
        return cls(
            name=name,
            path=parent.rstrip("/") + "/" + name,
            size=int(j.get("size", 0)),
            mode=int(j.get("mode", 0)),
            mod_time=str(j.get("mod_time", "")),
            is_dir=bool(j.get("is_dir", False)),
            is_symlink=bool(j.get("is_symlink", False)),
        )


@dataclass(frozen=True)
class WriteInfo:
    """What a file write stored: the path and its new size."""

    path: str
    size: int


@dataclass(frozen=True)
class FileEvent:
    """A change seen by ``files.watch``: ``type`` is ``created``, ``modified`` or ``removed``."""

    type: str
    path: str
    is_dir: bool


@dataclass(frozen=True)
class ProcessInfo:
    """A process started by ``processes.start`` or ``commands.run(background=True)``.

    ``state`` is ``running``, ``exited`` (``exit_code`` set) or ``killed`` (``signal`` set).
    """

    pid: int
    tag: Optional[str]
    command: Optional[str]
    argv: Optional[List[str]]
    cwd: str
    state: str
    exit_code: Optional[int]
    signal: Optional[int]
    started_at: str
    ended_at: Optional[str]
    restarts: int
    managed: bool
    pty: Optional[Dict[str, int]]
    stdin: bool
    raw: Json = field(repr=False, compare=False)

    @property
    def running(self) -> bool:
        return self.state == "running"

    @classmethod
    def from_json(cls, j: Json) -> "ProcessInfo":
        argv = j.get("argv")
        return cls(
            pid=int(j["pid"]),
            tag=j.get("tag"),
            command=j.get("command"),
            argv=[str(a) for a in argv] if isinstance(argv, list) else None,
            cwd=str(j.get("cwd", "")),
            state=str(j.get("state", "")),
            exit_code=_opt_int(j.get("exit_code")),
            signal=_opt_int(j.get("signal")),
            started_at=str(j.get("started_at", "")),
            ended_at=j.get("ended_at"),
            restarts=int(j.get("restarts", 0)),
            managed=bool(j.get("managed", False)),
            pty=j.get("pty"),
            stdin=bool(j.get("stdin", False)),
            raw=j,
        )


@dataclass(frozen=True)
class OutputRecord:
    """One record of a process's output.

    ``type`` is ``stdout``, ``stderr``, ``pty`` or, last, ``exit`` (then ``exit_code`` and
    ``signal`` are set and ``data`` is empty). ``offset`` is the position of the record's first
    byte in the process's whole output; pass ``offset + len(data.encode())`` as ``since`` to
    resume after it.
    """

    type: str
    data: str
    offset: int
    exit_code: Optional[int] = None
    signal: Optional[int] = None

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> "OutputRecord":
        return cls(
            type=str(j.get("type", "")),
            data=str(j.get("data", "")),
            offset=int(j.get("offset", 0) or 0),
            exit_code=_opt_int(j.get("exit_code")),
            signal=_opt_int(j.get("signal")),
        )


@dataclass(frozen=True)
class HealthCheck:
    name: str
    ok: bool
    detail: str
    repaired: Optional[bool] = None
    repair_detail: Optional[str] = None


@dataclass(frozen=True)
class Usage:
    """What a session uses now (``session.usage()``): memory, CPU time and tasks of its box
    while it runs (``cpu_usec`` is None while suspended), and what its workspace takes on disk
    (None when the workspace is a host directory)."""

    id: str
    state: str
    sampled_at: str
    memory_bytes: int
    cpu_usec: Optional[int]
    pids: int
    workspace_bytes: Optional[int]

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> "Usage":
        return cls(
            id=str(j.get("id", "")),
            state=str(j.get("state", "")),
            sampled_at=str(j.get("sampled_at", "")),
            memory_bytes=int(j.get("memory_bytes") or 0),
            cpu_usec=None if j.get("cpu_usec") is None else int(j["cpu_usec"]),
            pids=int(j.get("pids") or 0),
            workspace_bytes=None if j.get("workspace_bytes") is None else int(j["workspace_bytes"]),
        )


@dataclass(frozen=True)
class HealthReport:
    """The result of ``session.health()`` or ``session.repair()``."""

    healthy: bool
    checks: List[HealthCheck]

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> "HealthReport":
        return cls(
            healthy=bool(j.get("healthy", False)),
            checks=[
                HealthCheck(
                    name=str(c.get("name", "")),
                    ok=bool(c.get("ok", False)),
                    detail=str(c.get("detail", "")),
                    repaired=c.get("repaired"),
                    repair_detail=c.get("repair_detail"),
                )
                for c in j.get("checks") or []
            ],
        )


@dataclass(frozen=True)
class PackageResult:
    """The result of ``session.install_packages``."""

    exit_code: int
    stdout: str
    stderr: str
    recorded: List[str]
    timed_out: bool
    error: Optional[str]

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> "PackageResult":
        return cls(
            exit_code=int(j.get("exit_code", -1)),
            stdout=str(j.get("stdout", "")),
            stderr=str(j.get("stderr", "")),
            recorded=[str(r) for r in j.get("recorded") or []],
            timed_out=bool(j.get("timed_out", False)),
            error=j.get("error"),
        )


@dataclass(frozen=True)
class MountsResult:
    """The result of ``session.mounts.add``: ``applied`` is ``live`` or ``next_start``."""

    session: SessionInfo
    applied: str


@dataclass(frozen=True)
class Snapshot:
    id: str
    version: Any
    created_at: str
    bytes: int
    files: int
    current: bool

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> "Snapshot":
        return cls(
            id=str(j.get("id", "")),
            version=j.get("version"),
            created_at=str(j.get("created_at", "")),
            bytes=int(j.get("bytes", 0)),
            files=int(j.get("files", 0)),
            current=bool(j.get("current", False)),
        )


@dataclass(frozen=True)
class Template:
    """A template (seed 004's YAML, as the daemon parsed it) and its snapshots."""

    name: str
    version: Any
    description: str
    current_version: Any
    snapshots: List[Snapshot]
    warnings: List[str]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, j: Json) -> "Template":
        return cls(
            name=str(j.get("name", "")),
            version=j.get("version"),
            description=str(j.get("description", "") or ""),
            current_version=j.get("current_version"),
            snapshots=[Snapshot.from_json(s) for s in j.get("snapshots") or []],
            warnings=[str(w) for w in j.get("warnings") or []],
            raw=j,
        )


@dataclass(frozen=True)
class Build:
    """A template build: ``state`` is ``running``, ``succeeded`` or ``failed``."""

    build_id: str
    state: str
    template: Optional[str] = None
    exit_code: Optional[int] = None
    snapshot: Optional[Dict[str, Any]] = None
    error: Optional[str] = None
    raw: Json = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, j: Json) -> "Build":
        err = j.get("error")
        if isinstance(err, dict):
            err = err.get("message")
        return cls(
            build_id=str(j.get("build_id", "")),
            state=str(j.get("state", "")),
            template=j.get("template"),
            exit_code=_opt_int(j.get("exit_code")),
            snapshot=j.get("snapshot"),
            error=err,
            raw=j,
        )


@dataclass(frozen=True)
class Runner:
    """A remote runner (``agentbox-runner``) known to the daemon."""

    user: str
    connected: bool
    workspace: Optional[str]
    shell: Optional[str]
    version: Optional[int]
    connected_at: Optional[str]
    last_seen: Optional[str]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, j: Json) -> "Runner":
        return cls(
            user=str(j.get("user", "")),
            connected=bool(j.get("connected", False)),
            workspace=j.get("workspace"),
            shell=j.get("shell"),
            version=_opt_int(j.get("version")),
            connected_at=j.get("connected_at"),
            last_seen=j.get("last_seen"),
            raw=j,
        )


@dataclass(frozen=True)
class Image:
    """An OCI image the daemon pulled (API.md "Images")."""

    ref: str
    digest: str
    size: int
    layers: Any
    platform: Any
    config: Dict[str, Any]
    pulled_at: Optional[str]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, j: Json) -> "Image":
        return cls(
            ref=str(j.get("ref", "")),
            digest=str(j.get("digest", "")),
            size=int(j.get("size", 0) or 0),
            layers=j.get("layers"),
            platform=j.get("platform"),
            config=dict(j.get("config") or {}),
            pulled_at=j.get("pulled_at"),
            raw=j,
        )


@dataclass(frozen=True)
class PullProgress:
    """One progress line of an image pull: ``bytes`` of ``total`` of ``layer`` so far."""

    layer: str
    bytes: int
    total: Optional[int]


@dataclass(frozen=True)
class Node:
    """A node of the cluster (API.md "Cluster")."""

    name: str
    state: Optional[str]
    advertise: Optional[str]
    version: Optional[str]
    sessions: Optional[int]
    running_boxes: Optional[int]
    free_memory_mb: Optional[int]
    last_seen: Optional[str]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, j: Json) -> "Node":
        return cls(
            name=str(j.get("name", "")),
            state=j.get("state"),
            advertise=j.get("advertise"),
            version=None if j.get("version") is None else str(j.get("version")),
            sessions=_opt_int(j.get("sessions")),
            running_boxes=_opt_int(j.get("running_boxes")),
            free_memory_mb=_opt_int(j.get("free_memory_mb")),
            last_seen=j.get("last_seen"),
            raw=j,
        )


@dataclass(frozen=True)
class ClusterInfo:
    """``GET /v1/cluster``: ``mode`` is ``single`` or ``etcd``."""

    mode: str
    node: str
    nodes: List[Node]
    etcd: Optional[Dict[str, Any]]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, j: Json) -> "ClusterInfo":
        return cls(
            mode=str(j.get("mode", "")),
            node=str(j.get("node", "")),
            nodes=[Node.from_json(n) for n in j.get("nodes") or []],
            etcd=j.get("etcd"),
            raw=j,
        )
