"""The order a run's nodes run in: each as soon as the nodes it reads from are done.

A node that only computes (an expression, a default, a relation's copy) with nothing to read
from the store runs inline, as the one before it finishes; resolvers and index reads run as
tasks, concurrently. A bug in a node (not a failed resolver, which only nulls its outputs)
fails the query, and nothing is left running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from kairos.planner.plan import PlanNode


async def run_in_order(
    nodes: Sequence[PlanNode],
    runs_inline: Callable[[PlanNode], bool],
    run_node: Callable[[PlanNode], Awaitable[None]],
) -> None:
    """Run every node of `nodes` (in topological order) once those of its `after` that are
    among them are done: `run_node(node)` awaited inline where `runs_inline(node)` (it must
    not suspend then), as a task otherwise."""
    order = {node.id: at for at, node in enumerate(nodes)}
    waiting = {node.id: {i for i in node.after if i in order} for node in nodes}
    dependents: dict[int, list[PlanNode]] = {}
    for node in nodes:
        for before in waiting[node.id]:
            dependents.setdefault(before, []).append(node)
    ready = [node for node in nodes if not waiting[node.id]]
    running: dict[asyncio.Future[None], PlanNode] = {}

    def finished(node: PlanNode) -> None:
        for after in dependents.get(node.id, ()):
            waiting[after.id].discard(node.id)
            if not waiting[after.id]:
                ready.append(after)

    try:
        while ready or running:
            ready.sort(key=lambda n: order[n.id])
            batch, ready[:] = list(ready), []
            inline: list[PlanNode] = []
            for node in batch:
                if runs_inline(node):
                    inline.append(node)
                else:
                    running[asyncio.ensure_future(run_node(node))] = node
            if inline and len(inline) < len(batch):
                await asyncio.sleep(0)  # the new tasks start their I/O first
            for node in inline:
                await run_node(node)  # does not suspend: no store read, no I/O
                finished(node)
            if ready or not running:
                continue
            if len(running) == 1:  # the usual case: awaited directly, no waiter set up
                (only,) = running
                await only
                done = {only}
            else:
                done, _pending = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: order[running[t].id]):
                task.result()  # a bug in a node (not a failed resolver) fails the query
                finished(running.pop(task))
    finally:
        for task in running:  # nothing is left running if one node blew up
            # another node may fail too (one store down), even as it is cancelled: the
            # query's failure is the first one, the others are seen and not logged
            task.add_done_callback(_seen)
            task.cancel()


def _seen(task: asyncio.Future[None]) -> None:
    """Retrieve a task's failure, so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()
