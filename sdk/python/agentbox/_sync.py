"""The sync client: GENERATED from its _async*.py twin by scripts/unasync.py; do not
edit. Every class here has the surface of its Async* twin, blocking.
"""


from __future__ import annotations

from typing import Any, Iterator, Callable, List, Mapping, Optional, Sequence, Union

import httpx

from ._sync_files import Files, Mounts, Network
from ._sync_process import Commands, Processes, Pty
from ._sync_transport import Transport, _drop_none, _q
from .errors import InvalidArgument, NotFound, Unavailable, error_from_code
from .models import (
    Build,
    ClusterInfo,
    HealthReport,
    Image,
    Json,
    Limits,
    Mount,
    NetworkPolicy,
    PackageResult,
    PullProgress,
    Runner,
    SessionInfo,
    Snapshot,
    Template,
    Usage,
)

# --- sessions ------------------------------------------------------------------------------


class Session:
    """One session (a persistent workspace and its box).

    Its sub-APIs: ``commands``, ``files``, ``processes``, ``pty``, ``network``, ``mounts``.
    As a context manager it ends the session on exit as ``on_exit`` says: ``"destroy"``
    (the default for sessions this client created), ``"suspend"`` or ``"keep"``.
    """

    def __init__(
        self, transport: Transport, info: SessionInfo, on_exit: str = "keep"
    ) -> None:
        if on_exit not in ("destroy", "suspend", "keep"):
            raise InvalidArgument("EINVAL", "on_exit must be destroy, suspend or keep")
        self._t = transport
        self.info = info
        self.on_exit = on_exit
        self.commands = Commands(self)
        self.files = Files(self)
        self.processes = Processes(self)
        self.pty = Pty(self)
        self.network = Network(self)
        self.mounts = Mounts(self)

    @property
    def id(self) -> str:
        """The session's id."""
        return self.info.id

    def __repr__(self) -> str:
        return f"<Session {self.info.id} {self.info.state} backend={self.info.backend}>"

    def _path(self, suffix: str = "") -> str:
        return f"/v1/sessions/{_q(self.info.id)}{suffix}"

    def _lifecycle(self, step: str) -> SessionInfo:
        self.info = SessionInfo.from_json(self._t.json("POST", self._path("/" + step)))
        return self.info

    def refresh(self) -> SessionInfo:
        """What the daemon says about the session now."""
        self.info = SessionInfo.from_json(self._t.json("GET", self._path()))
        return self.info

    def suspend(self) -> SessionInfo:
        """Stops the box, keeps the workspace (a later command resumes it)."""
        return self._lifecycle("suspend")

    def resume(self) -> SessionInfo:
        """Starts the box again (a suspended session)."""
        return self._lifecycle("resume")

    def keepalive(self) -> SessionInfo:
        """Resets the idle timer."""
        return self._lifecycle("keepalive")

    def destroy(self, *, archive: bool = False) -> Optional[str]:
        """Deletes the session and its workspace; with ``archive`` the workspace is kept as a
        ``.tar.zst`` whose path is returned (``sessions.restore`` brings it back)."""
        doc = self._t.json(
            "DELETE", self._path(), params={"archive": "true" if archive else None}, long=True
        )
        return doc.get("archive")

    def update(
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
        self.info = SessionInfo.from_json(self._t.json("PATCH", self._path(), json=body))
        return self.info

    def usage(self) -> Usage:
        """What the session uses now; asking neither resumes it nor counts as a use
        (:class:`NotSupported` on a backend without a cgroup per session)."""
        return Usage.from_json(self._t.json("GET", self._path("/usage")))

    def health(self) -> HealthReport:
        """Runs the session's health checks (the template's and the built-in ones)."""
        return HealthReport.from_json(
            self._t.json("POST", self._path("/health"), long=True, wait=None)
        )

    def repair(self) -> HealthReport:
        """Runs the repair of each failing check, then the checks again."""
        return HealthReport.from_json(
            self._t.json("POST", self._path("/repair"), long=True, wait=None)
        )

    def install_packages(
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
            self._t.json("POST", self._path("/packages"), json=body, wait=timeout, long=True)
        )

    def move(self, node: str) -> SessionInfo:
        """Moves the session to another node of the cluster (API.md "Cluster")."""
        self.info = SessionInfo.from_json(
            self._t.json("POST", self._path("/move"), json={"node": node}, long=True)
        )
        return self.info

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.on_exit == "destroy":
                self.destroy()
            elif self.on_exit == "suspend":
                self.suspend()
        except NotFound:
            pass


class SessionPager:
    """The caller's sessions, fetched a page at a time: ``for s in pager`` gives
    :class:`Session` objects, ``pager.pages()`` the pages (lists)."""

    def __init__(self, transport: Transport, page_size: int) -> None:
        self._t = transport
        self._page_size = page_size

    def pages(self) -> Iterator[List[Session]]:
        """The sessions a page (a list) at a time, by id."""
        after: Optional[str] = None
        while True:
            doc = self._t.json(
                "GET", "/v1/sessions", params={"limit": self._page_size, "after": after}
            )
            page = [Session(self._t, SessionInfo.from_json(s)) for s in doc["sessions"]]
            if page:
                yield page
            nxt = doc.get("next")
            if not nxt or not page:
                return
            after = str(nxt)

    def __iter__(self) -> Iterator[Session]:
        return self._items()

    def _items(self) -> Iterator[Session]:
        for page in self.pages():
            for s in page:
                yield s


class Sessions:
    """``client.sessions``."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(
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
    ) -> Session:
        """Creates a session, or returns the existing one with that id (idempotent).

        ``id`` or ``scope`` (``"{launcher_type}_{launcher_id}"`` rendered with ``variables``)
        names it; without either the daemon's default scope applies. ``on_exit`` says what
        leaving ``with session`` does: ``destroy`` (default), ``suspend`` or ``keep``.
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
        doc = self._t.json("POST", "/v1/sessions", json=body, long=True, wait=None)
        return Session(self._t, SessionInfo.from_json(doc), on_exit)

    def get(self, id: str, *, on_exit: str = "keep") -> Session:
        """An existing session (:class:`NotFound` if there is none)."""
        doc = self._t.json("GET", f"/v1/sessions/{_q(id)}")
        return Session(self._t, SessionInfo.from_json(doc), on_exit)

    def list(self, *, page_size: int = 100) -> SessionPager:
        """The caller's sessions (its tenant's), a page of ``page_size`` at a time."""
        return SessionPager(self._t, page_size)

    def restore(self, id: str, archive: str, *, on_exit: str = "keep") -> Session:
        """Recreates session ``id`` from an archive made by ``destroy(archive=True)``
        (:class:`Conflict` if it exists)."""
        doc = self._t.json(
            "POST", f"/v1/sessions/{_q(id)}/restore", json={"archive": archive}, long=True
        )
        return Session(self._t, SessionInfo.from_json(doc), on_exit)

    def destroy(self, id: str, *, archive: bool = False) -> Optional[str]:
        """Deletes session ``id`` (see :meth:`Session.destroy`)."""
        doc = self._t.json(
            "DELETE", f"/v1/sessions/{_q(id)}", params={"archive": "true" if archive else None},
            long=True,
        )
        return doc.get("archive")


# --- templates, images, runners, cluster ---------------------------------------------------


class Templates:
    """``client.templates``: seed 004's templates, their builds and snapshots."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(self, yaml: str) -> Template:
        """Creates (or replaces) a template from its YAML."""
        doc = self._t.json(
            "POST",
            "/v1/templates",
            content=yaml.encode(),
            headers={"Content-Type": "application/yaml"},
        )
        return Template.from_json(doc)

    def list(self) -> List[Template]:
        """Every template."""
        doc = self._t.json("GET", "/v1/templates")
        return [Template.from_json(t) for t in doc.get("templates", [])]

    def get(self, name: str) -> Template:
        """One template by name (:class:`NotFound` if there is none)."""
        return Template.from_json(self._t.json("GET", f"/v1/templates/{_q(name)}"))

    def delete(self, name: str) -> None:
        """Deletes a template (:class:`Conflict` while a session uses one of its snapshots)."""
        self._t.request("DELETE", f"/v1/templates/{_q(name)}")

    def build(self, name: str, *, wait: bool = False) -> Build:
        """Starts a build (``state`` ``running``); with ``wait`` returns once it ended."""
        doc = self._t.json(
            "POST",
            f"/v1/templates/{_q(name)}/build",
            params={"wait": "true" if wait else None},
            long=wait,
        )
        return Build.from_json(doc)

    def get_build(self, name: str, build_id: str) -> Build:
        """A build's state, exit code and snapshot."""
        return Build.from_json(
            self._t.json("GET", f"/v1/templates/{_q(name)}/builds/{_q(build_id)}")
        )

    def build_log(
        self, name: str, build_id: str, *, follow: bool = False
    ) -> Iterator[str]:
        """The build's log lines; with ``follow`` until the build ends."""
        path = f"/v1/templates/{_q(name)}/builds/{_q(build_id)}/log"
        for j in self._t.ndjson(
            "GET", path, params={"follow": "true" if follow else None}, long=follow
        ):
            if "line" in j:
                yield str(j["line"])

    def snapshots(self, name: str) -> List[Snapshot]:
        """The template's snapshots (``current`` marks the one new sessions get)."""
        doc = self._t.json("GET", f"/v1/templates/{_q(name)}/snapshots")
        return [Snapshot.from_json(s) for s in doc.get("snapshots", [])]

    def rollback(self, name: str, version: Any) -> Template:
        """Makes an older snapshot version current."""
        doc = self._t.json(
            "POST", f"/v1/templates/{_q(name)}/rollback", json={"version": version}
        )
        return Template.from_json(doc)


class Images:
    """``client.images``: OCI images (API.md "Images")."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def pull(
        self, ref: str, *, on_progress: Optional[Callable[[PullProgress], Any]] = None
    ) -> Image:
        """Pulls ``ref`` from its registry; ``on_progress`` gets each layer's progress."""
        if on_progress is None:
            doc = self._t.json("POST", "/v1/images", json={"ref": ref}, long=True)
            return Image.from_json(doc)
        image: Optional[Image] = None
        for j in self._t.ndjson(
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

    def list(self) -> List[Image]:
        """The images the daemon has pulled."""
        doc = self._t.json("GET", "/v1/images")
        return [Image.from_json(i) for i in doc.get("images", [])]

    def get(self, ref_or_digest: str) -> Image:
        """One image by ref or digest."""
        return Image.from_json(self._t.json("GET", f"/v1/images/{_q(ref_or_digest)}"))

    def delete(self, digest: str) -> None:
        """Deletes an image (:class:`Conflict` while a session or template uses it)."""
        self._t.request("DELETE", f"/v1/images/{_q(digest)}")


class Runners:
    """``client.runners``: the remote runners of the caller's tenant."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def list(self) -> List[Runner]:
        """Each runner configured for the caller's tenant, connected or not."""
        doc = self._t.json("GET", "/v1/runners")
        return [Runner.from_json(r) for r in doc.get("runners", [])]


class Cluster:
    """``client.cluster``: the daemon's cluster (API.md "Cluster")."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def info(self) -> ClusterInfo:
        """The cluster's mode, this node and every node."""
        return ClusterInfo.from_json(self._t.json("GET", "/v1/cluster"))

    def cordon(self, node: str) -> None:
        """Stops placements on ``node`` (admin)."""
        self._t.request("POST", f"/v1/cluster/nodes/{_q(node)}/cordon")

    def uncordon(self, node: str) -> None:
        """Lets placements on ``node`` again (admin)."""
        self._t.request("POST", f"/v1/cluster/nodes/{_q(node)}/uncordon")


class Client:
    """A client of one agentboxd.

    Args:
        url: the daemon's base URL (default ``$AGENTBOX_URL``, else ``http://127.0.0.1:9090``).
        token: the API token (default ``$AGENTBOX_TOKEN``; none when unset).
        timeout: the request timeout in seconds: how long a request may wait for the daemon.
            A command's own ``timeout`` is separate (its request may take that long plus this).
        headers: extra HTTP headers for every request.
        http: an ``httpx.Client`` to use instead of one of its own (not closed by this).

    ``with Client() as c:`` closes the connections and WebSockets it opened.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        timeout: float = 30.0,
        headers: Optional[Mapping[str, str]] = None,
        http: Optional[httpx.Client] = None,
    ) -> None:
        self._t = Transport(url, token, timeout, headers, http)
        self.sessions = Sessions(self._t)
        self.templates = Templates(self._t)
        self.images = Images(self._t)
        self.runners = Runners(self._t)
        self.cluster = Cluster(self._t)

    @property
    def url(self) -> str:
        """The daemon's base URL."""
        return self._t.url

    def healthz(self) -> Json:
        """``GET /healthz``: liveness (no token needed)."""
        return self._t.json("GET", "/healthz")

    def ready(self) -> bool:
        """``GET /readyz``: whether the backend is usable."""
        try:
            self._t.request("GET", "/readyz")
            return True
        except Unavailable:
            return False

    def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text."""
        return (self._t.request("GET", "/metrics")).text

    def close(self) -> None:
        """Closes the client's connections and WebSockets."""
        self._t.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
