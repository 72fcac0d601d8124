"""A PEP 517 build backend with no requirements of its own, so `pip install ./sdk/python` works
offline (pip's isolated build env then needs nothing from a package index). It builds a pure-
Python wheel of the `agentbox` package and an sdist; the metadata comes from pyproject.toml."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import pathlib
import re
import tarfile
import zipfile
from typing import Any, Dict, List, Optional

ROOT = pathlib.Path(__file__).resolve().parent.parent
TAG = "py3-none-any"


def _project() -> Dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python 3.10: the few [project] keys this backend reads, by hand
        text = (ROOT / "pyproject.toml").read_text()
        section = text.split("[project]", 1)[1].split("\n[", 1)[0]
        out: Dict[str, Any] = {}
        for key in ("name", "version", "description", "requires-python"):
            m = re.search(rf'^{key}\s*=\s*"([^"]*)"', section, re.M)
            if m:
                out[key] = m.group(1)
        m = re.search(r"^dependencies\s*=\s*\[([^\]]*)\]", section, re.M)
        out["dependencies"] = re.findall(r'"([^"]+)"', m.group(1)) if m else []
        return out
    with open(ROOT / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["project"])


def _metadata() -> str:
    p = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
        f"Summary: {p.get('description', '')}",
        f"Requires-Python: {p.get('requires-python', '')}",
    ]
    lines += [f"Requires-Dist: {d}" for d in p.get("dependencies", [])]
    lines.append("Description-Content-Type: text/markdown")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return "\n".join(lines) + "\n\n" + readme


def _dist_info() -> str:
    p = _project()
    return f"{p['name']}-{p['version']}.dist-info"


def _package_files() -> List[pathlib.Path]:
    pkg = ROOT / "agentbox"
    return sorted(
        f for f in pkg.rglob("*") if f.is_file() and "__pycache__" not in f.parts
    )


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(
    config_settings: Optional[Dict[str, Any]] = None,
) -> List[str]:
    return []


def _write_wheel(wheel_directory: str, editable: bool) -> str:
    p = _project()
    name = f"{p['name']}-{p['version']}-{TAG}.whl"
    dist = _dist_info()
    entries: List[tuple[str, bytes]] = []
    if editable:
        entries.append((f"{p['name']}.pth", (str(ROOT) + "\n").encode()))
    else:
        for f in _package_files():
            entries.append((f.relative_to(ROOT).as_posix(), f.read_bytes()))
    entries.append((f"{dist}/METADATA", _metadata().encode()))
    wheel = f"Wheel-Version: 1.0\nGenerator: agentbox-backend\nRoot-Is-Purelib: true\nTag: {TAG}\n"
    entries.append((f"{dist}/WHEEL", wheel.encode()))
    record = [_record_line(n, d) for n, d in entries] + [f"{dist}/RECORD,,"]
    entries.append((f"{dist}/RECORD", ("\n".join(record) + "\n").encode()))
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in entries:
            z.writestr(zipfile.ZipInfo(n, date_time=(2026, 1, 1, 0, 0, 0)), d)
    return name


def build_wheel(
    wheel_directory: str,
    config_settings: Optional[Dict[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    return _write_wheel(wheel_directory, editable=False)


def build_editable(
    wheel_directory: str,
    config_settings: Optional[Dict[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    return _write_wheel(wheel_directory, editable=True)


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    p = _project()
    base = f"{p['name']}-{p['version']}"
    name = f"{base}.tar.gz"
    files = _package_files() + [ROOT / "pyproject.toml", ROOT / "README.md"]
    files += sorted((ROOT / "_build").glob("*.py"))
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for f in files:
            t.add(f, arcname=f"{base}/{f.relative_to(ROOT).as_posix()}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return name
