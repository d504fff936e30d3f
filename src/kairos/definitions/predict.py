"""Features computed by a registered model: `risk: float = kr.predict("risk", inputs=[...])`.

    @features
    class User:
        id: str
        txn_count: Windowed[int] = windowed("1d", "7d", expression=...)
        avg_ticket: float
        risk: float = kr.predict("risk", inputs=[_.txn_count["7d"], _.avg_ticket], alias="prod")

Inputs are features of the same class (`_.name`, `_.txn_count["7d"]`, a has-one path such as
`_.account.age`) or feature refs from classes declared earlier (`User.avg_ticket`); their order
is the order of the model's inputs. Like `windowed(...)`, this only records a declaration:
the client turns it into a resolver that runs the model's predictor, so the planner and the
engine treat a model like any other resolver. It does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kairos.definitions import expressions as ex
from kairos.definitions.durations import DurationLike, optional_duration
from kairos.definitions.feature import MISSING, FeatureOptions, ref_of
from kairos.errors import DefinitionError


@dataclass(frozen=True, slots=True)
class ModelOptions(FeatureOptions):
    """A feature whose value is a model's prediction from other features."""

    model: str = ""
    inputs: tuple[Any, ...] = ()  # FeatureRef | ex.Col (`_.x`), in the model's input order
    version: int | None = None
    alias: str | None = None
    timeout: timedelta | None = None


def predict(
    model: str,
    *,
    inputs: Sequence[Any],
    version: int | None = None,
    alias: str | None = None,
    timeout: DurationLike | None = None,
    max_staleness: DurationLike | None = None,
    description: str | None = None,
    tags: Iterable[str] = (),
    owner: str | None = None,
) -> Any:
    """Declare a feature as the prediction of registered model `model` (the newest version
    unless `version=` pins one or `alias=` follows an alias such as "prod")."""
    if not isinstance(model, str) or not model:
        raise DefinitionError(f"predict({model!r}, ...): name the registered model")
    if version is not None and alias is not None:
        raise DefinitionError(f"predict({model!r}): pin a version or follow an alias, not both")
    if version is not None and (not isinstance(version, int) or version < 1):
        raise DefinitionError(f"predict({model!r}, version={version!r}): versions start at 1")
    if isinstance(inputs, str) or not isinstance(inputs, Sequence) or not inputs:
        raise DefinitionError(
            f"predict({model!r}): inputs=[...] lists the features the model reads, in order"
        )
    checked: list[Any] = []
    for item in inputs:
        ref = ref_of(item)
        if ref is not None:
            checked.append(ref)
        elif isinstance(item, ex.Col):
            checked.append(item)
        else:
            raise DefinitionError(
                f"predict({model!r}): input {item!r} is not a feature; use _.name or "
                "User.name (declare an expression as its own feature first)"
            )
    return ModelOptions(
        default=MISSING,
        max_staleness=optional_duration(max_staleness, field="max_staleness"),
        description=description,
        tags=tuple(tags),
        owner=owner,
        model=model,
        inputs=tuple(checked),
        version=version,
        alias=alias,
        timeout=optional_duration(timeout, field="timeout"),
    )
