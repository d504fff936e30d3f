"""`kairos consume`: the project's `streams:` consumed into its events classes, in a process
of its own (`kairos serve` consumes them too). Stops on Ctrl-C or SIGTERM after the batch in
hand is written and acknowledged.

    kairos consume --project . [--stream payments] [--drain]
"""

from __future__ import annotations

import asyncio
import signal
import sys

import click

from kairos.cli.options import Command, project_option
from kairos.client.client import Client
from kairos.client.consume import consumers_for, run_consumers
from kairos.errors import KairosError


@click.command("consume", cls=Command)
@project_option
@click.option(
    "--stream", "streams", multiple=True, metavar="NAME",
    help="only this stream (repeatable; default: every one in kairos.yaml)",
)  # fmt: skip
@click.option("--drain", is_flag=True, help="stop once the streams have nothing new")
def consume_command(project: str, streams: tuple[str, ...], drain: bool) -> int:
    """Consume the project's streams into events."""
    with Client(project) as client:
        if not client.config.streams:
            raise KairosError(f"{project}: kairos.yaml has no `streams:` to consume")
        return asyncio.run(_run(client, list(streams), drain))


async def _run(client: Client, names: list[str], drain: bool) -> int:
    consumers = consumers_for(client, names)
    if drain:
        try:
            for consumer in consumers:
                count = await consumer.drain()
                stats = consumer.stats
                print(f"{consumer.name}: {count} messages, {stats.events} events, "
                      f"{stats.dead} dead-lettered, {stats.skipped} skipped")  # fmt: skip
        finally:
            for consumer in consumers:
                await consumer.close()
        return 0
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    print(f"consuming {', '.join(c.name for c in consumers)}; Ctrl-C stops", file=sys.stderr,
          flush=True)  # fmt: skip
    await run_consumers(consumers, stop)
    return 0
