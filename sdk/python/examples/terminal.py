"""An interactive terminal: keystrokes in, bytes out, resize, exit code."""

import uuid

from agentbox import Client

with Client() as client, client.sessions.create(f"terminal-{uuid.uuid4().hex[:8]}") as s:
    with s.pty.open(cols=100, rows=30, command="sh") as term:
        term.write("echo $((6 * 7))\n")
        print(term.read_until("42\r\n").decode(errors="replace").splitlines()[-1])
        term.resize(120, 40)
        term.write("stty size\n")
        print("size:", term.read_until("40 120").decode().split()[-2:])
        term.write("exit 3\n")
        print("exit code:", term.wait(timeout=10))
