"""The package itself: installable offline with pip, and the generated sync code up to date."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile

from conftest import SDK


def test_generated_sync_code_is_up_to_date() -> None:
    r = subprocess.run([sys.executable, str(SDK / "scripts" / "unasync.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_pip_installs_it_offline() -> None:
    d = tempfile.mkdtemp(prefix="agentbox-sdk-pip-")
    try:
        venv = f"{d}/venv"
        # The venv sees Debian's httpx and websockets; pip may reach no package index.
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                        venv], check=True)
        r = subprocess.run(
            [sys.executable, "-m", "pip", "--python", f"{venv}/bin/python", "install",
             "--no-index", "--no-cache-dir", "--disable-pip-version-check", str(SDK)],
            capture_output=True, text=True,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        code = ("import agentbox, pathlib; print(agentbox.__version__);"
                " print(pathlib.Path(agentbox.__file__).parent);"
                " print((pathlib.Path(agentbox.__file__).parent / 'py.typed').exists())")
        out = subprocess.run([f"{venv}/bin/python", "-c", code], capture_output=True, text=True,
                             cwd=d, check=True).stdout.split()
        assert out[0] == "0.1.0" and out[1].startswith(venv) and out[2] == "True"
        # The build left nothing in the source tree.
        assert not list(SDK.glob("*.egg-info")) and not (SDK / "build").exists()
    finally:
        shutil.rmtree(d, ignore_errors=True)
