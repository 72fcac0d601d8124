"""The SDK's tests run against a real agentboxd, started here (as tests/integration/daemon.h
does): $AGENTBOX_BIN_DIR/agentboxd (default <repo>/build/bin) on 127.0.0.1:0 with a fresh temp
data dir, a token, and the backend $AGENTBOX_TEST_BACKEND (host unless set). The daemon dies
with the test process (PR_SET_PDEATHSIG); the temp dir (and any mount left beneath it) is
removed at the end."""

from __future__ import annotations

import ctypes
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import AsyncIterator, Iterator, List, Optional

import pytest
import pytest_asyncio

SDK = pathlib.Path(__file__).resolve().parent.parent
REPO = SDK.parent.parent
sys.path.insert(0, str(SDK))

import agentbox  # noqa: E402

BACKEND = os.environ.get("AGENTBOX_TEST_BACKEND") or "host"
TOKEN = "sdk-test-token"


def _bin_dir() -> pathlib.Path:
    d = os.environ.get("AGENTBOX_BIN_DIR")
    return pathlib.Path(d) if d else REPO / "build" / "bin"


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _detach_mounts_under(root: str) -> None:
    """Lazily unmounts whatever is still mounted beneath `root` (deepest first)."""
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    points = [p.replace("\\040", " ") for p in points]
    for p in sorted((p for p in points if p.startswith(root + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", p], check=False, capture_output=True)


class Daemon:
    """One agentboxd process and its temp dir."""

    def __init__(self, extra: Optional[List[str]] = None, token: str = TOKEN) -> None:
        self.dir = tempfile.mkdtemp(prefix="agentbox-sdk-")
        self.token = token
        # Host dirs the tests mount into sessions live here (--allow-mount-root).
        self.mount_root = os.path.join(self.dir, "mounts")
        os.makedirs(self.mount_root)
        self.runner_user = "sdk-runner"
        self.runner_token = "sdk-runner-token"
        self.log_path = os.path.join(self.dir, "daemon.log")
        ready = os.path.join(self.dir, "ready")
        argv = [
            str(_bin_dir() / "agentboxd"),
            "--listen", "127.0.0.1:0",
            "--data-dir", os.path.join(self.dir, "data"),
            "--backend", BACKEND,
            "--token", token,
            "--log-level", "info",
            "--ready-file", ready,
            "--allow-mount-root", self.mount_root,
            "--runner-token", f"{self.runner_user}={self.runner_token}",
            # The 250 sessions of the pagination test are host sessions on either daemon
            # (listing does not depend on the backend; 250 ns boxes would cost ~20 s).
            "--allow-backend", "host",
        ] + (extra or [])
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                text = pathlib.Path(ready).read_text()
            except FileNotFoundError:
                text = ""
            if text.endswith("\n"):
                self.url = "http://" + text.strip()
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log()
                self.stop()
                raise RuntimeError(f"agentboxd did not come up; log:\n{log}")
            time.sleep(0.02)

    def log(self) -> str:
        return pathlib.Path(self.log_path).read_text(errors="replace")

    def client(self, timeout: float = 30.0) -> agentbox.Client:
        return agentbox.Client(self.url, self.token, timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self._log.close()
        _detach_mounts_under(self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture(scope="session")
def limited() -> Iterator[Daemon]:
    """A daemon with tight limits: one running box, 1 MiB files."""
    d = Daemon(["--max-running-boxes", "1", "--max-file-mb", "1"])
    yield d
    d.stop()


PAGE_SESSIONS = 250


@pytest.fixture(scope="session")
def many_sessions(daemon: Daemon) -> Iterator[List[str]]:
    """250 sessions (ids page-...), created over a few connections at once, destroyed after."""
    import concurrent.futures

    ids = [f"page-{i:03d}-{uuid.uuid4().hex[:6]}" for i in range(PAGE_SESSIONS)]
    with daemon.client(timeout=60) as c, concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: c.sessions.create(i, backend="host", on_exit="keep"), ids))
        yield ids
        list(pool.map(lambda i: c.sessions.destroy(i), ids))


@pytest.fixture(scope="session")
def scratch() -> Iterator[pathlib.Path]:
    """A host temp dir for the tests' own files, removed at the end."""
    d = tempfile.mkdtemp(prefix="agentbox-sdk-scratch-")
    yield pathlib.Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def client(daemon: Daemon) -> Iterator[agentbox.Client]:
    with daemon.client() as c:
        yield c


@pytest_asyncio.fixture
async def aclient(daemon: Daemon) -> AsyncIterator[agentbox.AsyncClient]:
    async with agentbox.AsyncClient(daemon.url, daemon.token) as c:
        yield c


def new_id(prefix: str = "sdk") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def sid() -> str:
    """A fresh session id."""
    return new_id()
