"""`client.log` and `client.models` of a `RemoteClient`: decision records and the model
registry read from (and alias moves sent to) a kairos server.

    client.log.get(query_id); client.models.set_alias("risk", "prod", 2)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import numpy as np
import pyarrow as pa

from kairos.client.wire import (
    Call,
    NotFound,
    Transport,
    _json,
    _moment,
)
from kairos.definitions.durations import DurationLike
from kairos.errors import (
    InvalidInput,
    KairosError,
    did_you_mean,
)
from kairos.models.errors import UnknownModel
from kairos.models.registry import AliasChange, ModelVersion
from kairos.stores.query_log import LoggedQuery

T = TypeVar("T")


class RemoteLog:
    """`client.log` of a remote client: decision records read from the server."""

    def __init__(self, client: Transport) -> None:
        self._client = client

    def get(self, query_id: str) -> LoggedQuery | None:
        """One decision's record, or None."""
        if not isinstance(query_id, str) or not query_id:
            raise InvalidInput("query_id must be a non-empty str", field="query_id")
        call = Call(
            "GET", f"/v1/log/{quote(query_id, safe='')}", LoggedQuery.from_dict, idempotent=True
        )
        try:
            return self._client._send(call)
        except NotFound:
            return None

    def search(
        self,
        *,
        entity: Mapping[Any, Any] | None = None,
        since: datetime | DurationLike | None = None,
        until: datetime | DurationLike | None = None,
        feature: Any = None,
        model: str | None = None,
        limit: int = 100,
    ) -> list[LoggedQuery]:
        """Decisions newest first, found as `client.log.search` finds them embedded."""
        params = []
        for key, value in (entity or {}).items():
            if type(value) not in (str, int):
                raise InvalidInput(
                    f"entity {key!r}: search by a str or int key, got {value!r}", field="entity"
                )
            params.append(("entity", f"{self._client.name(key)}:{value}"))
        for bound, given in (("since", since), ("until", until)):
            text = _moment(given, bound)
            if text is not None:
                params.append((bound, text))
        if feature is not None:
            params.append(("feature", self._client.name(feature)))
        if model is not None:
            params.append(("model", str(model)))
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise InvalidInput(f"limit must be a whole number, got {limit!r}", field="limit")
        params.append(("limit", str(limit)))
        call = Call(
            "GET",
            "/v1/log",
            lambda answer: [LoggedQuery.from_dict(r) for r in answer["records"]],
            params=params,
            idempotent=True,
        )
        return self._client._send(call)


class RemoteModels:
    """`client.models` of a remote client: the server's registry and its predictors."""

    def __init__(self, client: Transport) -> None:
        self._client = client

    def _get(self, path: str, read: Callable[[Any], T]) -> T:
        return self._client._send(Call("GET", path, read, idempotent=True, not_found=UnknownModel))

    def names(self) -> list[str]:
        return self._get("/v1/models", lambda answer: [m["name"] for m in answer["models"]])

    def versions(self, name: str) -> list[ModelVersion]:
        return self._get(
            _path(name), lambda answer: [ModelVersion.from_json(v) for v in answer["versions"]]
        )

    def get(self, name: str, version: int | None = None, alias: str | None = None) -> ModelVersion:
        """One version (by number or alias; the newest when neither is given)."""
        if version is not None and alias is not None:
            raise InvalidInput("pass a version or an alias, not both", field="version")
        if alias is not None:
            aliases = self.aliases(name)
            if alias not in aliases:
                raise UnknownModel(
                    f"model {name!r} has no alias {alias!r}{did_you_mean(alias, aliases)}; "
                    f"its aliases: {', '.join(sorted(aliases)) or 'none'}",
                    field="alias",
                )
            version = aliases[alias]
        if version is None:
            return self.versions(name)[-1]
        return self._get(f"{_path(name)}/versions/{int(version)}", ModelVersion.from_json)

    def aliases(self, name: str) -> dict[str, int]:
        return self._get(f"{_path(name)}/aliases", lambda answer: dict(answer["aliases"]))

    def history(self, name: str, alias: str | None = None) -> list[AliasChange]:
        """Every alias change of `name`, oldest first, each with its time."""
        return self._get(
            f"{_path(name)}/aliases",
            lambda answer: [
                AliasChange.from_json(name, c)
                for c in answer["history"]
                if alias is None or c["alias"] == alias
            ],
        )

    def set_alias(
        self, name: str, alias: str, version: int, *, by: str | None = None
    ) -> AliasChange:
        """Point `alias` at `version`; the server records who did from the key."""
        _no_by(by)
        body = _json({"version": version}, "version")
        return self._client._send(
            Call(
                "PUT",
                f"{_path(name)}/aliases/{quote(alias, safe='')}",
                lambda answer: AliasChange.from_json(name, answer),
                body,
                not_found=UnknownModel,
            )
        )

    def rollback(self, name: str, alias: str, *, by: str | None = None) -> AliasChange:
        """Point `alias` back where it was before its latest move."""
        _no_by(by)
        return self._client._send(
            Call(
                "POST",
                f"{_path(name)}/aliases/{quote(alias, safe='')}/rollback",
                lambda answer: AliasChange.from_json(name, answer),
                b"{}",  # a POST declares JSON: the server refuses one without a body type
                not_found=UnknownModel,
            )
        )

    def predict(
        self, name: str, rows: Any, *, version: int | None = None, alias: str | None = None
    ) -> np.ndarray:
        """Predictions for `rows` (objects keyed by input name, lists, Arrow, pandas or
        NumPy), by the server's predictor."""
        return self._client._send(self._predict(name, rows, version, alias))[1]

    async def predict_async(
        self, name: str, rows: Any, *, version: int | None = None, alias: str | None = None
    ) -> tuple[ModelVersion, np.ndarray]:
        number, predictions = await self._client._send_async(
            self._predict(name, rows, version, alias)
        )
        path = f"{_path(name)}/versions/{number}"
        record = await self._client._send_async(
            Call("GET", path, ModelVersion.from_json, idempotent=True, not_found=UnknownModel)
        )
        return record, predictions

    def _predict(
        self, name: str, rows: Any, version: int | None, alias: str | None
    ) -> Call[tuple[int, np.ndarray]]:
        body = {"rows": _rows(rows), "version": version, "alias": alias}
        return Call(
            "POST",
            f"{_path(name)}/predict",
            lambda answer: (int(answer["version"]), np.asarray(answer["predictions"])),
            _json(body, "rows"),
            idempotent=True,  # a prediction changes nothing on the server
            not_found=UnknownModel,
        )

    def register(
        self,
        name: str,
        artifact: bytes | str | Path,
        *,
        format: str,
        aliases: Sequence[str] = (),
        inputs: Sequence[str] | None = None,
        output: str | None = None,
    ) -> ModelVersion:
        """Register a saved artifact in a safe format (its bytes, or a file's path): `format`
        is one of onnx, skops, xgboost-ubj, xgboost-json, lightgbm-text, catboost-cbm. The
        server infers its schema as `client.models.register` does for a Python object, which
        only an embedded client can send."""
        if isinstance(artifact, (str, Path)):
            path = Path(artifact)
            if not path.is_file():
                raise InvalidInput(f"artifact {str(path)!r} is not a file", field="artifact")
            data = path.read_bytes()
        elif isinstance(artifact, (bytes, bytearray, memoryview)):
            data = bytes(artifact)
        else:
            raise InvalidInput(
                f"a remote client registers an artifact's bytes or path, not a "
                f"{type(artifact).__name__}; save it in a safe format (e.g. skops.io.dumps) "
                "or register the object with an embedded client, kr.Client(project)",
                field="artifact",
            )
        params = [("format", format), ("aliases", ",".join(aliases))]
        params += [("inputs", ",".join(inputs))] if inputs else []
        params += [("output", output)] if output else []
        return self._client._send(
            Call(
                "POST",
                f"{_path(name)}/versions",
                ModelVersion.from_json,
                data,
                params,
                content_type="application/octet-stream",
            )
        )

    def score(self, name: str, data: Any, **options: Any) -> Any:
        raise KairosError(
            f"score with model {name!r} over HTTP by predict(); batch scoring of files "
            "runs where the files are, with an embedded client"
        )


def _path(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidInput("a model's name is a non-empty str, e.g. 'risk'", field="model")
    return f"/v1/models/{quote(name, safe='')}"


def _no_by(by: str | None) -> None:
    if by is not None:
        raise InvalidInput(
            "by: the server records who moved an alias from the key it was sent (key:<hash>); "
            "leave by= out",
            field="by",
        )


def _rows(rows: Any) -> Any:
    """Model rows as JSON: objects by input name, or lists in input order."""
    if isinstance(rows, np.ndarray):
        return rows.tolist()
    if isinstance(rows, pa.Table):
        return rows.to_pylist()
    if type(rows).__module__.startswith("pandas"):
        return pa.Table.from_pandas(rows, preserve_index=False).to_pylist()
    return rows
