"""What is not a mirror of one method: 100 MB streamed without holding it, a real runner, the
examples and the README's example run as written, a real package install."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Iterator

import pytest

import agentbox
from conftest import BACKEND, SDK, REPO, Daemon, _bin_dir, _die_with_parent, new_id

BIG = 100 << 20


def _rss_of_import() -> int:
    code = (
        f"import sys; sys.path.insert(0, {str(SDK)!r}); import asyncio, agentbox, resource;"
        " print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout)


# The slow ones run once per `make test`, split between the two suites (the SDK code they
# exercise is the same on both): the 100 MB stream sync on host and async on ns, the examples
# and the README's example on ns (what `make run` starts), a real package install on host.
STREAM_MODE = "sync" if BACKEND == "host" else "async"


def test_100mb_streams_without_loading_it(daemon: Daemon) -> None:
    mode = STREAM_MODE
    base_kib = _rss_of_import()
    with daemon.client() as c, c.sessions.create(new_id()) as s:
        out = subprocess.run(
            [sys.executable, str(SDK / "tests" / "stream_big.py"), daemon.url, daemon.token,
             s.id, str(BIG), mode],
            capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0, out.stderr
        r = json.loads(out.stdout)
        s.files.remove("big.bin")
    assert r["size"] == BIG
    assert r["sha_up"] == r["sha_down"] == r["box_sha"]
    # The whole process peaked at what importing the SDK costs plus a few chunks: the 100 MB
    # were never in memory (reading them whole would add 100+ MB).
    grew_mib = (r["maxrss_kib"] - base_kib) / 1024
    print(f"{mode}: peak RSS {r['maxrss_kib'] // 1024} MiB, import alone {base_kib // 1024} MiB")
    assert grew_mib < 32, f"peak RSS grew {grew_mib:.0f} MiB over the import's"
    assert r["maxrss_kib"] < 100 * 1024


@pytest.fixture
def runner(daemon: Daemon) -> Iterator[str]:
    """A real agentbox-runner registered with the daemon; yields its workspace."""
    ws = tempfile.mkdtemp(prefix="agentbox-sdk-runner-")
    host_port = daemon.url.split("//", 1)[1]
    log = open(os.path.join(daemon.dir, "runner.log"), "wb")
    proc = subprocess.Popen(
        [str(_bin_dir() / "agentbox-runner"), "--server", f"ws://{host_port}/ws/{daemon.runner_user}",
         "--token", daemon.runner_token, "--workspace", ws],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
    )
    try:
        yield ws
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(ws, ignore_errors=True)


def test_remote_runner_session(daemon: Daemon, runner: str) -> None:
    with daemon.client() as c:
        deadline = time.monotonic() + 30
        while True:
            mine = [r for r in c.runners.list() if r.user == daemon.runner_user]
            if mine and mine[0].connected:
                break
            assert time.monotonic() < deadline, "the runner did not register"
            time.sleep(0.05)
        assert mine[0].workspace == runner and mine[0].connected_at
        with c.sessions.create(new_id(), backend="remote", runner=daemon.runner_user) as s:
            assert s.info.backend == "remote" and s.info.runner == daemon.runner_user
            assert s.info.workspace == runner
            assert s.commands.run("echo on the runner").stdout == "on the runner\n"
            s.files.write("r.txt", "remote")
            assert pathlib.Path(runner, "r.txt").read_text() == "remote"
            assert s.files.read_text("r.txt") == "remote"


def _readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Python SDK", 1)[1]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "README.md's Python SDK section has no python example"
    return m.group(1)


# One interpreter runs every example and the README's example in turn (an interpreter and the
# SDK's imports cost a second or more each on a busy machine); each reports its own outcome.
_DRIVER = """
import contextlib, io, json, runpy, sys, traceback
out = {}
for name, path in json.loads(sys.argv[1]):
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            if path is None:
                exec(compile(sys.argv[2], "README.md", "exec"), {"__name__": "__main__"})
            else:
                runpy.run_path(path, run_name="__main__")
        out[name] = {"ok": True, "stdout": buf.getvalue()}
    except BaseException:
        out[name] = {"ok": False, "stdout": buf.getvalue(), "error": traceback.format_exc()}
print(json.dumps(out))
"""

EXAMPLES = sorted(p.name for p in (SDK / "examples").glob("*.py"))


@pytest.fixture(scope="module")
def example_runs(daemon: Daemon) -> dict[str, dict[str, object]]:
    jobs = [(n, str(SDK / "examples" / n)) for n in EXAMPLES] + [("README.md", None)]
    env = dict(os.environ, AGENTBOX_URL=daemon.url, AGENTBOX_TOKEN=daemon.token,
               PYTHONPATH=str(SDK), PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(jobs), _readme_example()],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


if BACKEND == "ns":  # what `make run` starts

    def test_readme_example_runs_as_written(example_runs: dict[str, dict[str, object]]) -> None:
        got = example_runs["README.md"]
        assert got["ok"], got.get("error")
        assert "hello from the box" in str(got["stdout"])

    @pytest.mark.parametrize("example", EXAMPLES, ids=str)
    def test_examples_run(example_runs: dict[str, dict[str, object]], example: str) -> None:
        got = example_runs[example]
        assert got["ok"], got.get("error")
        assert str(got["stdout"]).strip()


def test_install_packages_for_real(daemon: Daemon) -> None:
    # A real pip run through the daemon's installer. A venv without pip of its own (pip from
    # the system's site-packages) keeps it to a second or two; pip finds no such package.
    with daemon.client() as c, c.sessions.create(new_id()) as s:
        s.commands.run("python3 -m venv --without-pip --system-site-packages .venv", check=True)
        r = s.install_packages("pip", ["surely-not-a-package-xyz"], no_index=True, timeout=120)
        assert isinstance(r, agentbox.PackageResult)
        assert r.exit_code != 0 and r.recorded == []
        assert "surely-not-a-package-xyz" in r.stdout + r.stderr + (r.error or "")
