"""Offline recompute on Ray (`engine="ray"`): the spine split by entity, each part computed by
the local engine on a Ray worker, the rows put back in the spine's order.

    client.offline_query(spine, [User.risk], engine="ray")                # Ray on this machine
    client.materialize(keys=..., ..., engine="ray", address="ray://head:10001")  # a cluster

- A row goes to the part its entity key hashes to (the spine's primary-key column of the
  outputs' class; CRC-32 of the key's repr), so one entity's rows stay together, in spine order.
  A few parts per worker CPU, of at least `ROWS_PER_PART` rows.
- A worker builds the client again from the project folder (and definitions it can import
  by module and name) with the driver's config and resolver timeout, loads its models, keeps
  it for the next parts of the same client, runs `offline_query` on its part and returns the
  computed columns (an Arrow table) and the part's errors. The driver puts each value and
  each error back at its spine row: the same rows, values and errors as the local engine.
- Windows over events kept in this process (the in-process index) go with each part: the
  events of the part's own entities, in the index's order. Windows in a store every replica
  shares (Redis) are read there by the workers.
- `kr.nearest` features search the client's vector index from the workers, which open it at
  the client's `vectors` URL: pgvector. The embedded index is a folder that one process at a
  time holds open (this one) and that workers on other machines do not see: a plan that
  searches it is refused before any work, naming the feature.
- Stored values (`recompute=False`, features not in `recompute=[...]`) are read in this
  process, as with the local engine; nothing is written by the workers.
- Progress is reported per part done (`progress(rows_done, rows)`, and the `kairos.ray`
  logger); a part that fails (its worker died, the project does not import there) raises a
  KairosError naming the part.

Ray is imported only when engine="ray" is used: `pip install 'kairos-inference[ray]'`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import math
import sys
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from kairos.backends import parse, redact
from kairos.definitions.windows import indexed_window
from kairos.engine.result import FeatureError
from kairos.engine.windows import WindowIndex
from kairos.errors import InvalidInput, KairosError
from kairos.planner.plan import Plan
from kairos.project.config import Config
from kairos.project.modules import Project
from kairos.project.offline import Progress, Recompute
from kairos.project.snapshot import Snapshot
from kairos.resolvers.sql import SqlResolver

ENGINES = ("local", "ray")
ROWS_PER_PART = 1000  # smaller parts cost more to ship and schedule than they save
PARTS_PER_CPU = 4  # a few parts per worker: a slow part does not hold the others up
TIMESTAMP = "ts"  # the time column of the spine a worker is given
# Ray runs a part again when its worker dies (up to this many times): a worker that dies
# takes the parts queued on it along, and those must not fail for it
RETRIES = 3
_LAST = datetime.max.replace(tzinfo=UTC)

logger = logging.getLogger("kairos.ray")

# (module, qualified name) of a definition a worker imports, or ("sql", path) of a SQL file
Reference = tuple[str, str]
# (child namespace, foreign key, time field, key column): events a plan reads from the index
IndexRead = tuple[str, str, str, str]
# (child namespace, foreign key, time field, rows): one part's events of one index read
EventRows = tuple[str, str, str, list[dict[str, Any]]]


@dataclass(frozen=True)
class Rebuild:
    """How a Ray worker builds a client again: the client's class, its definitions (the
    project folder, or objects importable by module and name) and config, the online store
    URL windows may live in (None: an object was passed) and the vector indexes' URL."""

    factory: Callable[..., Any]
    project: Project
    config: Config = field(repr=False)  # may hold secrets
    online_store: str | None
    token: str  # names this client's copies on the workers
    vectors: str = field(repr=False)  # a postgresql:// URL may hold a password

    def spec(self, online_store: str, timeout: timedelta) -> WorkerSpec:
        """What the workers are sent; KairosError if a definition cannot be imported there."""
        root = self.project.root
        folder = root.parent if root is not None and root.is_file() else root
        found: list[Reference] = []
        for obj in (*self.project.feature_classes, *self.project.resolvers):
            reference = _reference(obj, folder)
            if reference is not None:
                found.append(reference)
        return WorkerSpec(
            self.factory,
            None if root is None else str(root),
            tuple(dict.fromkeys(found)),
            self.config,
            timeout,
            online_store,
            self.token,
            self.vectors,
        )


@dataclass(frozen=True)
class WorkerSpec:
    """A `Rebuild` as a worker gets it: names and paths instead of the project's objects."""

    factory: Callable[..., Any]
    root: str | None
    definitions: tuple[Reference, ...]
    config: Config = field(repr=False)
    timeout: timedelta
    online_store: str
    token: str
    vectors: str = field(repr=False)


def recompute_engine(
    engine: str, address: str | None, runtime: Snapshot, rebuild: Rebuild
) -> Recompute | None:
    """The `Recompute` that `engine` names: None for "local" (the engine of this process)."""
    if engine == "local":
        if address is not None:
            raise InvalidInput(
                f"address={address!r} names a Ray cluster; pass engine='ray' with it",
                field="address",
            )
        return None
    if engine == "ray":
        return RayRecompute(runtime, rebuild, address)
    raise InvalidInput(
        f"engine={engine!r} is not one of {', '.join(map(repr, ENGINES))}", field="engine"
    )


class RayRecompute:
    """Recompute offline rows on Ray workers (a `Recompute`)."""

    def __init__(self, runtime: Snapshot, rebuild: Rebuild, address: str | None) -> None:
        self.runtime = runtime
        self.rebuild = rebuild
        self.address = address

    async def __call__(
        self,
        plan: Plan,
        inputs: dict[str, list[Any]],
        row_times: list[datetime],
        progress: Progress | None,
    ) -> tuple[dict[str, list[Any]], list[FeatureError]]:
        self._check_searches(plan)
        ray = _import_ray()
        reads, shared = self._index_reads(plan, inputs)
        spec = self.rebuild.spec(
            self.rebuild.online_store if shared and self.rebuild.online_store else "memory://",
            self.runtime.planner.default_timeout,
        )
        names = list(plan.outputs)
        rows = len(row_times)
        if rows == 0:
            return {name: [] for name in names}, []
        await asyncio.to_thread(_connect, ray, self.address)  # starting Ray takes seconds
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        count = max(1, min(math.ceil(rows / ROWS_PER_PART), cpus * PARTS_PER_CPU))
        keys = self._entity_keys(plan, inputs)
        parts = partition(keys, count)
        # the workers' copy of this client: one on the shared windows' store, and one of its
        # own for each query that ships events with its parts
        copies = f"{spec.token}-shared" if shared else spec.token
        if reads:
            copies = f"{spec.token}-{uuid.uuid4().hex}"
        remote = ray.remote(max_retries=RETRIES)(compute_part)
        sent = ray.put(spec)
        whole = _arrow_spine(inputs, row_times)
        refs = []
        for index, part in enumerate(parts):
            spine: pa.Table | dict[str, list[Any]]
            if whole is not None:  # Arrow travels to the workers without a pickle per value
                spine = whole.take(pa.array(part, pa.int64()))
            else:
                spine = {name: [values[row] for row in part] for name, values in inputs.items()}
                spine[TIMESTAMP] = [row_times[row] for row in part]
            events = await self._events(reads, inputs, part)
            label = f"kairos offline part {index + 1}/{len(parts)}"
            refs.append(remote.options(name=label).remote(sent, copies, spine, names, events))
        logger.info("offline recompute: %d rows in %d parts on Ray", rows, len(parts))
        done = await _gather(ray, refs, parts, keys, progress, rows)
        values: dict[str, list[Any]] = {name: [None] * rows for name in names}
        errors: list[FeatureError] = []
        for part, (table, part_errors) in zip(parts, done, strict=True):
            for name in names:
                column = values[name]
                for row, value in zip(part, table.column(name).to_pylist(), strict=True):
                    column[row] = value
            errors += [replace(e, row=None if e.row is None else part[e.row]) for e in part_errors]
        order = {name: index for index, name in enumerate(names)}
        errors.sort(key=lambda e: (order.get(e.feature, len(order)), e.row or 0))
        return values, errors

    def _check_searches(self, plan: Plan) -> None:
        """InvalidInput when the plan searches an embedded vector index: it is a folder this
        process holds open (a second open fails), which workers elsewhere do not even see."""
        if parse(self.rebuild.vectors).family == "postgresql":
            return  # pgvector: every worker connects to the same index
        for node in plan.nodes:
            if node.kind == "nearest":
                raise InvalidInput(
                    f"engine='ray': {', '.join(map(repr, node.outputs))} is a kr.nearest over "
                    f"the embedded vector index at {redact(self.rebuild.vectors)!r}, which "
                    "only this process opens; use engine='local' or a postgresql:// vectors "
                    "URL (pgvector), which every Ray worker reaches",
                    field="engine",
                )

    def _index_reads(self, plan: Plan, inputs: dict[str, list[Any]]) -> tuple[set[IndexRead], bool]:
        """The events the plan reads from an in-process index (shipped with each part), and
        whether it reads windows a shared store keeps (the workers open that store)."""
        windows = self.runtime.engine.windows
        reads: set[IndexRead] = set()
        shared = False
        graph = self.runtime.graph
        for node in plan.nodes:
            if node.kind not in ("events", "window"):
                continue
            if not isinstance(windows, WindowIndex):
                if self.rebuild.online_store is None:
                    raise KairosError(
                        f"engine='ray': {node.label!r} reads windows kept in an online store "
                        "given as an object, which Ray workers cannot open; pass the store "
                        "as a URL (online_store='redis://...') or use engine='local'"
                    )
                shared = True
                continue
            key = node.inputs[0] if node.inputs else ""
            if node.path or key not in inputs:
                raise KairosError(
                    f"engine='ray' sends each part the events of its own entities, but "
                    f"{node.label!r} reads events of entities the spine does not name "
                    f"(through {'.'.join(node.path) or key!r}); recompute it with "
                    "engine='local', or keep windows in a shared online store (Redis)"
                )
            info = plan.columns[node.outputs[0]].info
            indexed = indexed_window(graph, info.namespace, info.name)
            child, fk = (
                (indexed.child, indexed.fk)
                if indexed is not None
                else (info.target or "", info.join_key or "")
            )
            reads.add((child, fk, str(graph.cls(child).feature_time), key))
        return reads, shared

    def _entity_keys(self, plan: Plan, inputs: dict[str, list[Any]]) -> list[Any]:
        """Each row's entity key: the primary-key column of the outputs' class when the
        spine has it, else all the spine's input columns together."""
        roots = {self.runtime.graph.ref(name).root for name in plan.outputs}
        if len(roots) == 1:
            root = roots.pop()
            primary = f"{root}.{self.runtime.graph.cls(root).primary}"
            if primary in inputs:
                return inputs[primary]
        return list(zip(*inputs.values(), strict=True))

    async def _events(
        self, reads: set[IndexRead], inputs: dict[str, list[Any]], part: list[int]
    ) -> list[EventRows]:
        """The events of a part's entities for each index read, as this process holds them
        (an index that follows other writers reads what they wrote first)."""
        windows = self.runtime.engine.windows
        if not reads:
            return []
        shipped = []
        for child, fk, time_field, key in sorted(reads):
            keys = inputs[key]
            entities = list(dict.fromkeys(keys[row] for row in part if keys[row] is not None))
            found = await windows.event_rows(child, fk, entities, [_LAST] * len(entities))
            rows = []
            for entity, events in zip(entities, found, strict=True):
                if isinstance(events, Exception):
                    raise KairosError(
                        f"engine='ray': the {child} events of {entity!r} could not be read "
                        f"for the workers: {type(events).__name__}: {events}"
                    )
                rows += events
            shipped.append((child, fk, time_field, rows))
        return shipped


def _arrow_spine(inputs: dict[str, list[Any]], row_times: list[datetime]) -> pa.Table | None:
    """The checked spine as one Arrow table, when its inputs are plain values (a nested one
    would come back from Arrow changed: None for the keys a row's dict lacks)."""
    try:
        table = pa.table({**inputs, TIMESTAMP: row_times})
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    if any(pa.types.is_nested(column.type) for column in table.columns):
        return None
    return table


def partition(keys: list[Any], count: int) -> list[list[int]]:
    """The spine rows of each part, in spine order: a row goes to the part its key hashes to
    (stable across processes), empty parts dropped.

    >>> partition(["a", "b", "a", "c"], 2)
    [[0, 2, 3], [1]]
    """
    parts: list[list[int]] = [[] for _ in range(count)]
    placed: dict[Any, int] = {}
    for row, key in enumerate(keys):
        try:
            at = placed.get(key)
        except TypeError:  # an unhashable key (a list input): by its text
            key = repr(key)
            at = placed.get(key)
        if at is None:
            at = placed[key] = zlib.crc32(repr(key).encode()) % count
        parts[at].append(row)
    return [part for part in parts if part]


async def _gather(
    ray: Any,
    refs: list[Any],
    parts: list[list[int]],
    keys: list[Any],
    progress: Progress | None,
    rows: int,
) -> list[tuple[pa.Table, list[FeatureError]]]:
    """Each part's result, in part order, reporting each part as it finishes. A part that
    raised on its worker cancels the others and raises, naming it; parts whose worker died
    (after Ray's retries) are named together once the others have finished, since a worker
    that dies takes the parts queued on it along with the one that killed it."""

    async def one(index: int) -> tuple[int, Any]:
        try:
            return index, await asyncio.wrap_future(refs[index].future())
        except ray.exceptions.RayTaskError as error:
            cause = getattr(error, "cause", None) or error
            text = str(cause).strip().splitlines()[-1] if str(cause).strip() else ""
            raise KairosError(
                f"engine='ray': {_part(index, parts, keys)} failed on its worker: "
                f"{type(cause).__name__}: {text}"
            ) from None
        except ray.exceptions.RayError as error:  # the worker, or its node, died
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise _Lost(f"{_part(index, parts, keys)}: {type(error).__name__}: {first}") from None

    results: list[Any] = [None] * len(parts)
    lost: list[str] = []
    done = 0
    waiting = [asyncio.ensure_future(one(index)) for index in range(len(parts))]
    try:
        for finished in asyncio.as_completed(waiting):
            try:
                index, result = await finished
            except _Lost as error:
                lost.append(str(error))
                continue
            results[index] = result
            done += len(parts[index])
            logger.info(
                "offline part %d/%d done (%d of %d rows)", index + 1, len(parts), done, rows
            )
            if progress is not None:
                progress(done, rows)
    except BaseException:
        for task in waiting:
            task.cancel()
        for ref in refs:
            with contextlib.suppress(Exception):  # a finished part cannot be cancelled
                ray.cancel(ref)
        await asyncio.gather(*waiting, return_exceptions=True)
        raise
    if lost:
        raise KairosError(
            f"engine='ray': {len(lost)} of {len(parts)} parts were lost, their Ray worker died "
            f"(out of memory, or the process exited): {'; '.join(sorted(lost))}. See the Ray "
            "worker logs, or run it with engine='local'"
        )
    return results


class _Lost(Exception):
    """A part whose worker died."""


def _part(index: int, parts: list[list[int]], keys: list[Any]) -> str:
    """`part 2 of 8 (312 spine rows from row 5, 40 entities: 'u1', 'u7', ...)`."""
    part = parts[index]
    entities = list(dict.fromkeys(keys[row] for row in part))
    named = ", ".join(repr(e) for e in entities[:5]) + (", ..." if len(entities) > 5 else "")
    return (
        f"part {index + 1} of {len(parts)} ({len(part)} spine rows from row {part[0]}, "
        f"{len(entities)} entities: {named})"
    )


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise KairosError(
            "engine='ray' needs Ray, which is not installed: pip install 'kairos-inference[ray]'"
        ) from None
    return ray


def _connect(ray: Any, address: str | None) -> None:
    """Join Ray: the cluster at `address`, or the one this process already joined, or one
    found on this machine (RAY_ADDRESS), else a new local one."""
    if ray.is_initialized():
        return
    if address is None:
        ray.init(include_dashboard=False)
    else:
        ray.init(address=address)


def _reference(obj: Any, folder: Path | None) -> Reference | None:
    """How a worker finds `obj` again: None when loading the project folder makes it, else
    its module and name (or its SQL file); KairosError when a worker cannot import it."""
    if isinstance(obj, SqlResolver):
        if obj.path is None:
            raise _cannot_import(f"the SQL resolver {obj.name!r}", "it was not read from a file")
        if folder is not None and obj.path.resolve().is_relative_to(folder):
            return None
        return ("sql", str(obj.path.resolve()))
    module_name: str | None = getattr(obj, "__module__", None)
    name = str(getattr(obj, "__qualname__", None) or getattr(obj, "__name__", "?"))
    module = sys.modules.get(module_name or "")
    file = getattr(module, "__file__", None)
    if folder is not None and file is not None and Path(file).resolve().is_relative_to(folder):
        return None
    if module_name is None or module_name == "__main__" or module is None:
        raise _cannot_import(repr(name), f"it is defined in {module_name or 'no module'}")
    found: Any = module
    for part in name.split("."):
        found = getattr(found, part, None)
    if found is not obj:
        raise _cannot_import(
            f"{module_name}.{name}", "it is not reachable by that name (defined in a function?)"
        )
    return (module_name, name)


def _cannot_import(what: str, why: str) -> KairosError:
    return KairosError(
        f"engine='ray' builds the client again on each Ray worker, which cannot import "
        f"{what}: {why}; give the client a project folder (kr.Client('path/to/project')) "
        "or define it at the top level of an importable module"
    )


# --- on a worker --------------------------------------------------------------------------

# The client a worker process built last, by the name of its copy: the parts of one client
# (one query when events are shipped) that the process computes share it.
_BUILT: dict[str, Any] = {}


def compute_part(
    spec: WorkerSpec,
    copy: str,
    spine: pa.Table | dict[str, list[Any]],
    names: list[str],
    events: list[EventRows],
) -> tuple[pa.Table, list[FeatureError]]:
    """One part on a worker: the local engine over its rows (the Ray task's body)."""
    client = _BUILT.get(copy)
    if client is None:
        for old in _BUILT.values():
            old.close()
        _BUILT.clear()
        client = _BUILT[copy] = _build(spec)
    for child, fk, time_field, rows in events:
        client.windows.write(child, [fk], time_field, rows)
    result = client.offline_query(spine, names, timestamp=TIMESTAMP)
    return result.table.select(names), result.errors


def _build(spec: WorkerSpec) -> Any:
    project = Project.load(spec.root) if spec.root is not None else Project(None, (), ())
    definitions: list[Any] = []
    for module_name, name in spec.definitions:
        if module_name == "sql":
            definitions.append(SqlResolver.from_file(Path(name)))
            continue
        found: Any = importlib.import_module(module_name)
        for part in name.split("."):
            found = getattr(found, part)
        definitions.append(found)
    client = spec.factory(
        project,
        definitions=definitions,
        config=spec.config,
        online_store=spec.online_store,
        offline_store="none://",
        query_log="none://",
        default_timeout=spec.timeout,
        vectors=spec.vectors,
    )
    client.models.warm()  # as a server does: no part spends its timeout loading a model
    return client
