"""The async client: two sessions working at once."""

import asyncio
import uuid

from agentbox import AsyncClient


async def agent(client: AsyncClient, name: str) -> str:
    async with await client.sessions.create(f"{name}-{uuid.uuid4().hex[:8]}") as s:
        await s.files.write("task.txt", f"task of {name}\n")
        r = await s.commands.run("sleep 0.5; cat task.txt")
        return r.stdout.strip()


async def main() -> None:
    async with AsyncClient() as client:
        results = await asyncio.gather(agent(client, "alice"), agent(client, "bob"))
        print(results)


asyncio.run(main())
