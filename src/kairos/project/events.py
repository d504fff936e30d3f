"""Events of `@features(events=True)` classes: checked, kept durably in the offline store and
read back into the window index when a client starts.

An event is stored as its class's feature values, keyed by the event's id and observed at its
`FeatureTime`, all features of one write in one table: so an offline as-of read of
`Transaction.amount` works too, and a restarted server answers windows over every event it was
ever sent. Without an offline store (`offline_store: none://`) events live in memory only.

Several processes may share one offline store (`kairos serve --workers N`, a CLI beside a
server): `FollowingIndex` is the window index of such a process, which reads the events the
others wrote since it last looked before each answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

import pyarrow as pa

from kairos.definitions.graph import ClassInfo, Graph
from kairos.engine.values import check
from kairos.engine.windows import EventBatch, WindowIndex
from kairos.errors import InvalidInput, InvalidValue, did_you_mean
from kairos.stores.offline import FollowedStore, OfflineStore, readable

# characters an event id (the primary key of an events class) may have: it is stored, indexed
# and compared on every write and read, so a 100 KB id is refused, not kept
MAX_EVENT_ID = 256


def event_class(graph: Graph, namespace: str) -> ClassInfo:
    """The class taking events, or InvalidInput naming the fix."""
    info = graph.cls(namespace)
    if not info.events or info.feature_time is None:
        raise InvalidInput(
            f"{namespace} does not take events; declare it @features(events=True) with a "
            "FeatureTime",
            field="events",
        )
    return info


def typed_events(
    info: ClassInfo, rows: Sequence[Mapping[str, Any]], *, versions: bool = False
) -> list[dict[str, Any]]:
    """Rows checked against the class: known scalar features, typed values, an id and a time
    on every event; a later row with the id of an earlier one in the batch replaces it (with
    `versions`, only a row with the same id *and* time does: each is a version of the id)."""
    namespace, time_field = info.namespace, info.feature_time
    typed: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        clean: dict[str, Any] = {}
        for key, value in row.items():
            name = str(key).rpartition(".")[2]
            feature = info.features.get(name)
            if feature is None or feature.kind != "scalar":
                raise InvalidInput(
                    f"event {index}: {namespace} has no feature {name!r}"
                    f"{did_you_mean(name, info.features)}",
                    field=name,
                )
            try:
                clean[name] = check(feature, value, allow_null=True)
            except InvalidValue as error:
                raise InvalidInput(f"event {index}, {name!r}: {error}", field=name) from None
        if time_field is None or clean.get(time_field) is None:
            raise InvalidInput(
                f"event {index} has no {time_field!r}; every event needs its time",
                field=str(time_field),
            )
        if clean.get(info.primary) is None:
            raise InvalidInput(
                f"event {index} has no {info.primary!r}; every event needs its id (a retried "
                "event is recognised by it)",
                field=info.primary,
            )
        check_event_id(clean[info.primary], index, info.primary)
        typed.append(clean)
    return last_of_each(info, typed, versions=versions)


def check_event_id(value: Any, index: int, field: str) -> None:
    """Refuse an id that is blank or over MAX_EVENT_ID characters (InvalidInput naming it).

    >>> check_event_id("t1", 0, "id"); check_event_id(7, 0, "id")  # fine: nothing raised
    """
    if not isinstance(value, str):
        return
    if not value.strip():
        problem = f"{value!r} is blank"
    elif len(value) > MAX_EVENT_ID:
        problem = f"{value[:20]!r}... is {len(value)} characters long"
    else:
        return
    raise InvalidInput(
        f"event {index}: {field} {problem}; give every event a non-blank id of at most "
        f"{MAX_EVENT_ID} characters",
        field=field,
    )


def last_of_each(
    info: ClassInfo, rows: Sequence[dict[str, Any]], *, versions: bool = False
) -> list[dict[str, Any]]:
    """Typed rows with only the last of each id (with `versions`, of each id and time), each
    in the position of that last row."""
    time_field = str(info.feature_time)
    kept: dict[Any, dict[str, Any]] = {}
    for row in rows:
        identity = (row[info.primary], row[time_field]) if versions else row[info.primary]
        kept.pop(identity, None)
        kept[identity] = row
    return list(kept.values())


def foreign_keys(info: ClassInfo) -> list[str]:
    """The features an event class is indexed under (its foreign keys)."""
    return [name for name, f in info.features.items() if f.fk_target is not None]


def stored_features(info: ClassInfo) -> list[str]:
    """The features an event is stored with: its time first, then the other scalars."""
    time_field = str(info.feature_time)
    return [time_field] + [
        name
        for name, f in info.features.items()
        if f.kind == "scalar" and name not in (info.primary, time_field)
    ]


def persist(store: OfflineStore, info: ClassInfo, rows: Sequence[dict[str, Any]]) -> None:
    """Write checked events to the offline store in one transaction."""
    if not rows:
        return
    features = stored_features(info)
    primary = info.features[info.primary]
    key_type = primary.type
    if key_type is None:  # pragma: no cover - a primary key always has a type
        raise InvalidInput(f"{info.namespace}.{info.primary} has no type", field=info.primary)
    store.write_many(
        info.namespace,
        key_type,
        [row[info.primary] for row in rows],
        [row[features[0]] for row in rows],
        {
            name: (info.features[name].type or key_type, [row.get(name) for row in rows])
            for name in features
        },
    )


def stored_events(graph: Graph, open_store: Callable[[], OfflineStore]) -> list[EventBatch]:
    """Every event class's events as the offline store holds them (the latest write of each
    id), as batches for the window index."""
    classes = _event_classes(graph)
    if not classes:
        return []
    store = open_store()
    batches = []
    for info in classes:
        table = store.latest_rows(info.namespace, stored_features(info))
        if table.num_rows:
            batches.append(_batch(store, info, table))
    return batches


class FollowingIndex(WindowIndex):
    """The window index of one process among several that write the same offline store: it
    starts from every event the store holds and, before each answer, adds the events written
    since it last looked, by any process (its own change nothing). When nothing was written
    that costs a directory listing per table of events. A store that cannot say what changed
    (`FollowedStore`) is read once, at the start.

    >>> index = FollowingIndex(client.graph, client.offline_store)  # doctest: +SKIP
    """

    def __init__(self, graph: Graph, open_store: Callable[[], OfflineStore]) -> None:
        super().__init__(self._changes)
        self._graph = graph
        self._open_store = open_store
        self._positions: dict[str, dict[str, int]] = {}  # namespace -> where it has read to
        self._follow_lock = threading.RLock()  # _changes takes it too (the first load)
        self._loaded = False

    async def values(
        self, feature: tuple[str, str], keys: Sequence[Any], nows: Sequence[datetime]
    ) -> list[Any]:
        self._follow()
        return await super().values(feature, keys, nows)

    async def event_rows(
        self, child: str, fk: str, keys: Sequence[Any], nows: Sequence[datetime]
    ) -> list[Any]:
        self._follow()
        return await super().event_rows(child, fk, keys, nows)

    def _follow(self) -> None:
        if not self._loaded:
            self._load()  # the first read: every event
            return
        with self._follow_lock:  # applied in the order read: an older row never wins
            for child, fks, time_field, primary, rows in self._changes():
                self.write(child, fks, time_field, rows, primary)

    def _changes(self) -> list[EventBatch]:
        """The events written since the last call (every event on the first), as batches;
        where it has read to moves on only once every class was read."""
        with self._follow_lock:
            if self._loaded and not self._positions:  # nothing to follow
                return []
            store = self._open_store()
            if not self._loaded and not isinstance(store, FollowedStore):
                self._loaded = True  # read once: no positions, so nothing to follow
                return stored_events(self._graph, lambda: store)
            followed = cast(FollowedStore, store)
            batches = []
            positions = {}
            for info in _event_classes(self._graph):
                after = self._positions.get(info.namespace, {})
                table, positions[info.namespace] = followed.changed_rows(
                    info.namespace, stored_features(info), after
                )
                if table.num_rows:
                    batches.append(_batch(store, info, table))
            self._positions = positions
            self._loaded = True
            return batches


def _event_classes(graph: Graph) -> list[ClassInfo]:
    return [info for info in graph.classes.values() if info.events and info.feature_time]


def _batch(store: OfflineStore, info: ClassInfo, table: pa.Table) -> EventBatch:
    """Stored rows of an event class (`key` and its stored features) as a batch of events
    in time order."""
    features = stored_features(info)
    columns = {"key": table.column("key").to_pylist()}
    for name in features:
        kind = store.value_kind(info.namespace, name)
        found = readable(table.column(name).combine_chunks(), kind)
        columns[name] = found if isinstance(found, list) else found.to_pylist()
    rows = [
        {info.primary: key, **{name: columns[name][i] for name in features}}
        for i, key in enumerate(columns["key"])
    ]
    rows.sort(key=lambda row: row[features[0]])
    return (info.namespace, foreign_keys(info), features[0], info.primary, rows)
