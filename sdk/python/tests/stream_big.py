"""Run by test_extra.py in a fresh interpreter: streams SIZE bytes into a session from a file
object that makes them as they are read, back out into a sink that only hashes them, and prints
JSON {sha_up, sha_down, box_sha, size, maxrss_kib}: the process's peak RSS shows nothing held
the file in memory. Usage: stream_big.py URL TOKEN SESSION_ID SIZE sync|async"""

import asyncio
import hashlib
import json
import pathlib
import resource
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import agentbox  # noqa: E402


class Source:
    """A readable binary file of `size` pseudo-random bytes, made as they are read."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.block = hashlib.sha512(b"seed").digest() * 1024  # 64 KiB
        self.sha = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        out = (self.block * (n // len(self.block) + 1))[:n]
        self.left -= n
        self.sha.update(out)
        return out


class Sink:
    """A writable binary file that keeps only a hash of what it got."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()
        self.n = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.n += len(data)
        return len(data)


def run_sync(url: str, token: str, sid: str, size: int) -> dict:
    src, sink = Source(size), Sink()
    with agentbox.Client(url, token, timeout=120) as c:
        s = c.sessions.get(sid)
        info = s.files.write("big.bin", src)  # type: ignore[arg-type]
        assert info.size == size, info
        assert s.files.download("big.bin", sink) == size  # type: ignore[arg-type]
        box = s.commands.run("sha256sum big.bin", timeout=120, check=True).stdout.split()[0]
    return {"sha_up": src.sha.hexdigest(), "sha_down": sink.sha.hexdigest(), "box_sha": box,
            "size": sink.n}


async def run_async(url: str, token: str, sid: str, size: int) -> dict:
    src, sink = Source(size), Sink()
    async with agentbox.AsyncClient(url, token, timeout=120) as c:
        s = await c.sessions.get(sid)
        info = await s.files.write("big.bin", src)  # type: ignore[arg-type]
        assert info.size == size, info
        assert await s.files.download("big.bin", sink) == size  # type: ignore[arg-type]
        r = await s.commands.run("sha256sum big.bin", timeout=120, check=True)
    return {"sha_up": src.sha.hexdigest(), "sha_down": sink.sha.hexdigest(),
            "box_sha": r.stdout.split()[0], "size": sink.n}


def main() -> None:
    url, token, sid, size, mode = sys.argv[1:6]
    if mode == "sync":
        out = run_sync(url, token, sid, int(size))
    else:
        out = asyncio.run(run_async(url, token, sid, int(size)))
    out["maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(out))


if __name__ == "__main__":
    main()
