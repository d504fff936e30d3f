"""What every backend refuses before it stores or searches: vectors of the wrong length, NaN or
zero norm, naive times, attributes that are not JSON, conditions no backend can evaluate. One
set of checks so the embedded index and pgvector refuse the same things with the same words.

>>> unit_vector([3.0, 4.0], dimensions=2, what="document 'd1'")
array([0.6, 0.8], dtype=float32)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import numpy.typing as npt

from kairos.errors import InvalidInput
from kairos.stores.vectors.base import OPERATORS, Condition, Document, VectorLike

Vector = npt.NDArray[np.float32]
# Condition values a backend compares: JSON scalars (a str, a number, a bool).
Scalar = str | int | float | bool

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def unit_vector(values: VectorLike, *, dimensions: int, what: str) -> Vector:
    """`values` as float32 scaled to length 1 (cosine distance is then 1 - dot product)."""
    try:
        vector = np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError):
        raise InvalidInput(
            f"{what}: vector {_preview(values)} is not a sequence of numbers; pass "
            f"{dimensions} floats (a list or a numpy array)",
            field="vector",
        ) from None
    if vector.ndim != 1 or vector.shape[0] != dimensions:
        got = vector.shape[0] if vector.ndim == 1 else f"shape {vector.shape}"
        raise InvalidInput(
            f"{what}: vector has {got} values, the index has {dimensions} dimensions; pass "
            f"a vector of {dimensions} floats (or open an index of {got} dimensions)",
            field="vector",
        )
    wide = vector.astype(np.float64)  # no float32 squares overflow in float64
    norm = math.sqrt(float(wide @ wide))  # np.linalg.norm costs more per call
    if not math.isfinite(norm):
        raise InvalidInput(
            f"{what}: vector {_preview(values)} holds NaN or infinity; pass finite floats",
            field="vector",
        )
    if norm == 0.0:
        raise InvalidInput(
            f"{what}: vector is all zeros, which has no direction (cosine distance is "
            "undefined); pass a vector with at least one non-zero value",
            field="vector",
        )
    unit: Vector = vector / np.float32(norm)
    return unit


def unit_vectors(documents: Sequence[Document], dimensions: int) -> Vector:
    """The documents' vectors as one (n, dimensions) float32 array of unit rows."""
    out = np.empty((len(documents), dimensions), dtype=np.float32)
    for row, document in enumerate(documents):
        out[row] = unit_vector(
            document.vector, dimensions=dimensions, what=f"document {document.id!r}"
        )
    return out


def check_document(document: Document) -> None:
    """The parts of a document other than its vector: id, time, attributes."""
    if not isinstance(document.id, str) or not document.id or "\x00" in document.id:
        raise InvalidInput(
            f"document id {document.id!r} is not a non-empty str without NUL; give every "
            "document a str id (the same id for each version of one document)",
            field="id",
        )
    check_time(document.observed_at, what=f"document {document.id!r}: observed_at")
    if not isinstance(document.attributes, Mapping):
        raise InvalidInput(
            f"document {document.id!r}: attributes {document.attributes!r} is not a mapping; "
            "pass a dict of column -> JSON value",
            field="attributes",
        )
    for column, value in document.attributes.items():
        if not isinstance(column, str):
            raise InvalidInput(
                f"document {document.id!r}: attribute name {column!r} is not a str",
                field="attributes",
            )
        _check_json(value, what=f"document {document.id!r}: attribute {column!r}")


def check_time(value: datetime, *, what: str) -> int:
    """`value` (timezone-aware) as microseconds since 1970-01-01 UTC."""
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidInput(
            f"{what} {value!r} is not a timezone-aware datetime; pass one with a tzinfo, "
            "e.g. datetime.now(timezone.utc)",
            field="observed_at" if "observed_at" in what else "as_of",
        )
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def time_of(microseconds: int) -> datetime:
    """The UTC datetime `check_time` read `microseconds` from."""
    return _EPOCH + timedelta(microseconds=microseconds)


def check_search(
    query: VectorLike, k: int, as_of: datetime, where: Sequence[Condition], dimensions: int
) -> tuple[Vector, int, tuple[Condition, ...]]:
    """A search's arguments as every backend takes them: the unit query vector, `as_of` in
    microseconds since the epoch, the checked conditions; bad ones refused naming them."""
    check_k(k)
    vector = unit_vector(query, dimensions=dimensions, what="search query")
    return vector, check_time(as_of, what="search as_of"), check_conditions(where)


def check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInput(f"k {k!r} is not a positive int; ask for k >= 1 hits", field="k")


def check_conditions(where: Sequence[Condition]) -> tuple[Condition, ...]:
    """`where` with every `in` value as a tuple; a condition no backend can evaluate is refused."""
    checked: list[Condition] = []
    for condition in where:
        if not isinstance(condition, Condition):
            raise InvalidInput(
                f"condition {condition!r} is not a Condition; pass "
                "Condition(column, op, value), e.g. Condition('lang', '==', 'en')",
                field="where",
            )
        if not isinstance(condition.column, str) or not condition.column:
            raise InvalidInput(
                f"condition column {condition.column!r} is not a non-empty str", field="where"
            )
        if condition.op not in OPERATORS:
            raise InvalidInput(
                f"condition on {condition.column!r}: operator {condition.op!r} is not one of "
                f"{', '.join(OPERATORS)}",
                field="where",
            )
        value = condition.value
        if condition.op == "in":
            if isinstance(value, str | bytes) or not isinstance(value, Sequence | set | frozenset):
                raise InvalidInput(
                    f"condition on {condition.column!r}: 'in' needs a tuple of options, got "
                    f"{value!r}; pass e.g. ('en', 'fr')",
                    field="where",
                )
            options = tuple(value)
            for option in options:
                _check_scalar(condition.column, option)
            checked.append(Condition(condition.column, "in", options))
        else:
            _check_scalar(condition.column, value)
            if isinstance(value, bool) and condition.op not in ("==", "!="):
                raise InvalidInput(
                    f"condition on {condition.column!r}: {condition.op!r} {value!r} orders "
                    "booleans; compare booleans with '==' or '!='",
                    field="where",
                )
            checked.append(condition)
    return tuple(checked)


def _check_scalar(column: str, value: object) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(
            f"condition on {column!r}: value {value!r} matches nothing; pass a finite number",
            field="where",
        )
    if not isinstance(value, str | int | float):  # bool is an int
        raise InvalidInput(
            f"condition on {column!r}: value {value!r} is not a str, int, float or bool "
            "(null never matches: leave the condition out, or store a value to compare)",
            field="where",
        )


def _check_json(value: object, *, what: str) -> None:
    if isinstance(value, str) and "\x00" in value:
        raise InvalidInput(
            f"{what}: {_preview(value)} holds a NUL character, which PostgreSQL cannot store; "
            "remove it",
            field="attributes",
        )
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput(
                f"{what}: {value!r} is not a JSON number; store null or a finite float",
                field="attributes",
            )
        return
    if isinstance(value, list | tuple):
        for item in value:
            _check_json(item, what=what)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInput(f"{what}: key {key!r} is not a str", field="attributes")
            _check_json(item, what=what)
        return
    raise InvalidInput(
        f"{what}: {value!r} ({type(value).__name__}) is not a JSON value; store a str, "
        "number, bool, null, list or dict (a datetime as its ISO string)",
        field="attributes",
    )


def _preview(values: object) -> str:
    text = repr(values)
    return text if len(text) <= 60 else text[:57] + "..."
