"""Output as it comes, background commands and managed processes."""

import sys
import uuid

from agentbox import Client

with Client() as client, client.sessions.create(f"streaming-{uuid.uuid4().hex[:8]}") as s:
    # Callbacks get each piece of output while the command runs.
    s.commands.run(
        "for i in 1 2 3; do echo step $i; sleep 0.2; done",
        on_stdout=lambda data: print("[live]", data, end=""),
        on_stderr=lambda data: print("[err]", data, end="", file=sys.stderr),
    )

    # A background command: a handle to feed, wait for, or reconnect to by pid or tag.
    handle = s.commands.run("read name; echo hello $name", background=True, tag="greeter")
    handle.send_stdin("agent\n")
    print("background:", handle.wait().stdout.strip())
    print("reconnected:", s.commands.connect("greeter").info.state)

    # A managed process (restarted if it fails) and its logs, followed.
    web = s.processes.start("while true; do echo tick; sleep 0.1; done", tag="ticker",
                            restart="on-failure")
    for n, record in enumerate(web.logs(follow=True)):
        print("log:", record.data.strip())
        if n == 2:
            break
    print("killed:", web.kill().state)
