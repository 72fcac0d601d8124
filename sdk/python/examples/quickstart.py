"""Run a command and move files in a session. Start the daemon with `make run`, then:
    AGENTBOX_URL=http://127.0.0.1:9090 python3 sdk/python/examples/quickstart.py
(AGENTBOX_TOKEN too if the daemon has tokens)."""

import io
import uuid

from agentbox import Client, CommandError

with Client() as client:
    with client.sessions.create(f"quickstart-{uuid.uuid4().hex[:8]}") as session:
        print("session", session.id, "on backend", session.info.backend)

        result = session.commands.run("uname -s; echo $GREETING", env={"GREETING": "hi"})
        print("exit", result.exit_code, "stdout", result.stdout.split())

        session.files.write("src/main.py", "print(6 * 7)\n", mkdirs=True)
        print("main.py ->", session.commands.run("python3 src/main.py").stdout.strip())
        print("listing:", [e.name for e in session.files.list("src")])

        # Streamed from a file object, never read whole into memory.
        session.files.upload("data.bin", io.BytesIO(b"\x00" * 1_000_000))
        print("data.bin is", session.files.stat("data.bin").size, "bytes")

        try:
            session.commands.run("ls /nonexistent", check=True)
        except CommandError as e:
            print("failed as expected: exit", e.exit_code, "-", e.stderr.strip())
