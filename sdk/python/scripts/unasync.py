#!/usr/bin/env python3
"""Generates agentbox/_sync*.py from agentbox/_async*.py, so the two clients have one source and
the same surface (and tests/test_api_sync.py from tests/test_api_async.py). `unasync.py` writes it; `unasync.py --check` exits 1 if it is out of date."""

import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent.parent / "agentbox"

RULES = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\bawait\(", "("),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\basynccontextmanager\b", "contextmanager"),
    (r"\baclose\b", "close"),
    (r"\baread\b", "read"),
    (r"\baiter_lines\b", "iter_lines"),
    (r"\baiter_bytes\b", "iter_bytes"),
    (r"\b_io_async\b", "_io_sync"),
    (r"\b_async(_\w+)?\b", r"_sync\1"),
    (r"\bAsync([A-Z]\w*)", r"\1"),
    (r"\basync\b", "sync"),  # words in docstrings ("the async client")
]

HEADER = (
    '"""The sync client: GENERATED from its _async*.py twin by scripts/unasync.py; do not\n'
    "edit. Every class here has the surface of its Async* twin, blocking.\n"
    '"""\n'
)


def convert(src: str, header: str, extra: list) -> str:
    body = src.split('"""', 2)[2]  # drop the async module's docstring
    for pat, rep in extra + RULES:
        body = re.sub(pat, rep, body)
    return header + body


# The tests are written once too: tests/test_api_async.py -> tests/test_api_sync.py.
TEST_RULES = [(r"\baclient\b", "client")]
TEST_HEADER = (
    '"""Every method of the SDK against the real daemon, sync: GENERATED from\n'
    'test_api_async.py by scripts/unasync.py; do not edit."""\n'
)

PAIRS = [
    (HERE / f"_async{part}.py", HERE / f"_sync{part}.py", HEADER, [])
    for part in ("", "_transport", "_process", "_files")
] + [
    (
        HERE.parent / "tests" / "test_api_async.py",
        HERE.parent / "tests" / "test_api_sync.py",
        TEST_HEADER,
        TEST_RULES,
    ),
]


def main() -> int:
    stale = []
    for src, target, header, extra in PAIRS:
        out = convert(src.read_text(), header, extra)
        if "--check" in sys.argv[1:]:
            if not target.exists() or target.read_text() != out:
                stale.append(str(target.relative_to(HERE.parent)))
        else:
            target.write_text(out)
    if stale:
        print(f"{', '.join(stale)} out of date: run sdk/python/scripts/unasync.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
