"""The async client: ``AsyncClient`` and its sessions, templates, images, runners, cluster.
``_sync.py`` is generated from this file (and ``_sync_*.py`` from ``_async_*.py``) by
``scripts/unasync.py`` (``async``/``await`` dropped, ``Async*`` names without the prefix,
``_io_async`` -> ``_io_sync``): edit these files, then run
``python3 sdk/python/scripts/unasync.py``."""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable, List, Mapping, Optional, Sequence, Union

import httpx

from ._async_files import AsyncFiles, AsyncMounts, AsyncNetwork
from ._async_process import AsyncCommands, AsyncProcesses, AsyncPty
from ._async_transport import AsyncTransport, _drop_none, _q
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

    async def usage(self) -> Usage:
        """What the session uses now; asking neither resumes it nor counts as a use
        (:class:`NotSupported` on a backend without a cgroup per session)."""
        return Usage.from_json(await self._t.json("GET", self._path("/usage")))

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
