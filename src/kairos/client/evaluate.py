"""Evaluation: a replay's logged and replayed values scored against labels, on the inputs
production actually served.

    >>> result = client.replay(since="1d", models={"risk": 2})  # doctest: +SKIP
    >>> ev = client.evaluate(result, labels=outcomes, metrics=["auc", "log_loss"], report="eval")
    >>> ev.metrics["user.risk"]["auc"]  # {"logged": 0.81, "replayed": 0.86, "delta": 0.05}

**Labels** are a table (pandas, polars, Arrow, a dict of columns or a list of rows) with a
`label` column (`label=` names another) and either
- a `query_id` column: the label of that decision (bulk rows are `<query_id>-<row>`), or
- entity key columns named like the decisions' inputs (`user.id`) and a time column `ts`
  (`timestamp=`): a label applies to the decisions of that entity whose `now` equals its `ts`;
  with `horizon="7d"`, to those with `ts - 7d <= now <= ts`, each decision taking the first
  label at or after its `now` (an outcome observed after the decision).

Every metric is computed over the labeled decisions, once on the logged and once on the
replayed values. Model metrics (`accuracy`, `auc`, `log_loss`, `mae`) use the decisions where
both values are numbers (`accuracy` thresholds probabilities at `threshold=`, 0.5; a
non-numeric value is compared to the label as a class). Prompt metrics count a missing answer
as a failure: `exact_match` (answer == label, text stripped), `contains` (the label's text in
the answer, case-insensitive), `json_valid` (the answer is JSON, valid against `schema=` when
given) and `judge` (the share of answers the `judge_model=` calls correct, asked through the
gateway with the client's key). A metric that cannot be computed (AUC with one class) is None.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import math
from collections.abc import AsyncIterable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from kairos.client.replay import ReplayResult, ReplayRow
from kairos.definitions.durations import DurationLike, parse_duration
from kairos.engine.values import to_utc
from kairos.errors import DefinitionError, InvalidInput, InvalidValue, KairosError, did_you_mean
from kairos.project.offline import spine_columns
from kairos.stores.query_log import LoggedQuery

MODEL_METRICS = ("accuracy", "auc", "log_loss", "mae")
PROMPT_METRICS = ("exact_match", "json_valid", "contains", "judge")
METRICS = MODEL_METRICS + PROMPT_METRICS
INSTALL = "pip install 'kairos-inference[eval]'"
REPORT = "report.md"
PLOT = "scores.png"
# judge calls in flight at once
JUDGES = 8

JUDGE_SYSTEM = "You grade answers against a reference answer. Reply with one word: yes or no."


class Chat(Protocol):
    """What the judge needs of `client.llm`: a chat completion through the gateway."""

    async def chat(
        self, body: dict[str, Any]
    ) -> dict[str, Any] | AsyncIterable[dict[str, Any]]: ...


@dataclass
class Evaluation:
    """Metrics per feature: `metrics[feature][metric] = {"logged", "replayed", "delta"}`;
    `labeled[feature]` the decisions scored; the report's files when one was written."""

    metrics: dict[str, dict[str, dict[str, float | None]]]
    labeled: dict[str, int]
    decisions: int
    report_path: Path | None = None
    plot_path: Path | None = None
    judge_calls: int = 0
    replay: ReplayResult | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "decisions": self.decisions,
            "labeled": dict(self.labeled),
            "metrics": self.metrics,
            "judge_calls": self.judge_calls,
            "report_path": None if self.report_path is None else str(self.report_path),
            "plot_path": None if self.plot_path is None else str(self.plot_path),
        }

    def to_markdown(self) -> str:
        """The metrics as a table: per feature and metric, logged, replayed and the delta."""
        lines = [
            "# Evaluation",
            "",
            f"- decisions replayed: {self.decisions}",
            "",
            "| feature | metric | labeled | logged | replayed | delta |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for name, scores in self.metrics.items():
            for metric, both in scores.items():
                lines.append(
                    f"| {name} | {metric} | {self.labeled.get(name, 0)} | {_fmt(both['logged'])}"
                    f" | {_fmt(both['replayed'])} | {_fmt(both['delta'])} |"
                )
        return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class _Scored:
    """One labeled decision of one feature: its label and both values."""

    record: LoggedQuery
    label: Any
    logged: Any
    replayed: Any


async def evaluate(
    result: ReplayResult,
    labels: Any,
    *,
    metrics: Sequence[str],
    names: Callable[[Any], str],
    chat: Chat,
    label: str = "label",
    timestamp: str = "ts",
    horizon: DurationLike | None = None,
    features: Sequence[Any] | None = None,
    schema: Mapping[str, Any] | None = None,
    judge_model: str | None = None,
    threshold: float = 0.5,
    report: str | Path | None = None,
) -> Evaluation:
    """Score `result` against `labels` (see the module's docstring for the rules)."""
    wanted = _metrics(metrics)
    if "judge" in wanted and (not isinstance(judge_model, str) or not judge_model):
        raise InvalidInput(
            "metrics=['judge'] asks an LLM to grade the answers: name it with judge_model= "
            "(a model the gateway key may call, e.g. 'gpt-4o-mini')",
            field="judge_model",
        )
    if schema is not None:
        _check_schema(schema)
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise InvalidInput(f"threshold must be a number, got {threshold!r}", field="threshold")
    window = _horizon(horizon)
    evaluated = _features(result, features, names)
    by_query = _labels(result.records, labels, label, timestamp, window, names)
    rows: dict[tuple[str, str], ReplayRow] = {(r.query_id, r.feature): r for r in result.rows}
    judge = _Judge(chat, judge_model or "", result)
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    labeled: dict[str, int] = {}
    for name in evaluated:
        scored = [
            _Scored(record, by_query[record.query_id], row.logged, row.replayed)
            for record in result.records
            if record.query_id in by_query and (row := rows.get((record.query_id, name)))
        ]
        labeled[name] = len(scored)
        out[name] = {}
        for metric in wanted:
            if metric == "judge":
                before, after = await judge.score(name, scored)
            else:
                before, after = _score(metric, name, scored, schema, threshold)
            delta = None if before is None or after is None else after - before
            out[name][metric] = {"logged": before, "replayed": after, "delta": delta}
    evaluation = Evaluation(out, labeled, result.decisions, judge_calls=judge.calls, replay=result)
    if report is not None:
        folder = Path(report)
        plot = await asyncio.to_thread(_write_report, folder, result, evaluation, evaluated)
        evaluation.report_path, evaluation.plot_path = folder / REPORT, plot
    return evaluation


# --- arguments ------------------------------------------------------------------------------


def _metrics(metrics: Sequence[str]) -> list[str]:
    if isinstance(metrics, str) or not isinstance(metrics, Sequence) or not metrics:
        raise InvalidInput(
            f"metrics must be a list of metric names, e.g. ['auc']; known: {', '.join(METRICS)}",
            field="metrics",
        )
    for metric in metrics:
        if metric not in METRICS:
            hint = did_you_mean(str(metric), METRICS)
            raise InvalidInput(
                f"unknown metric {metric!r}{hint}; known: {', '.join(METRICS)}", field="metrics"
            )
    return list(dict.fromkeys(metrics))


def _horizon(horizon: DurationLike | None) -> timedelta | None:
    if horizon is None:
        return None
    try:
        return parse_duration(horizon, field="horizon")
    except DefinitionError as error:
        raise InvalidInput(str(error), field="horizon") from None


def _features(
    result: ReplayResult, features: Sequence[Any] | None, names: Callable[[Any], str]
) -> list[str]:
    """The features asked for, or those the replay recomputed (all it compared when none)."""
    compared = list(dict.fromkeys(r.feature for r in result.rows))
    if features is None:
        return [n for n in compared if n in result.recomputed] or compared
    if isinstance(features, str) or not isinstance(features, Sequence):
        raise InvalidInput("features must be a list of features", field="features")
    chosen = []
    for feature in features:
        try:
            name = names(feature)
        except (DefinitionError, InvalidInput, KeyError) as error:
            raise InvalidInput(f"features: {error}", field="features") from None
        if name not in compared:
            raise InvalidInput(
                f"features: the replay compared no {name!r}; it compared "
                f"{', '.join(compared) or 'nothing'}",
                field="features",
            )
        chosen.append(name)
    return chosen


def _check_schema(schema: Mapping[str, Any]) -> None:
    validator = _jsonschema().validators.validator_for(schema)
    try:
        validator.check_schema(schema)
    except Exception as error:  # jsonschema.SchemaError, or a schema that is not a mapping
        raise InvalidInput(f"schema is not a JSON schema: {error}", field="schema") from None


# --- labels ---------------------------------------------------------------------------------


def _labels(
    records: Sequence[LoggedQuery],
    labels: Any,
    label: str,
    timestamp: str,
    horizon: timedelta | None,
    names: Callable[[Any], str],
) -> dict[str, Any]:
    """query id -> label, for every decision a label row applies to."""
    try:
        columns = spine_columns(labels)
    except InvalidInput as error:
        raise InvalidInput(str(error).replace("the spine", "labels"), field="labels") from None
    if label not in columns:
        raise InvalidInput(
            f"labels have no column {label!r} (columns: {', '.join(columns) or 'none'}); add "
            "one or name it with label=",
            field="label",
        )
    columns = {name: [_python(v) for v in column] for name, column in columns.items()}
    values = columns[label]
    if "query_id" in columns:
        found = {str(q): v for q, v in zip(columns["query_id"], values, strict=True) if _known(v)}
        matched = {r.query_id: found[r.query_id] for r in records if r.query_id in found}
    else:
        matched = _by_entity(records, columns, values, label, timestamp, horizon, names)
    if not matched:
        raise InvalidInput(
            f"labels match none of the {len(records)} replayed decisions; key them by "
            "query_id, or by the decisions' entity keys and ts (the decision's now, or a later "
            "outcome within horizon=)",
            field="labels",
        )
    return matched


def _by_entity(
    records: Sequence[LoggedQuery],
    columns: dict[str, list[Any]],
    values: list[Any],
    label: str,
    timestamp: str,
    horizon: timedelta | None,
    names: Callable[[Any], str],
) -> dict[str, Any]:
    inputs = {name for record in records for name in record.inputs}
    keys: list[tuple[str, str]] = []  # (column, input name)
    for column in columns:
        if column in (label, timestamp):
            continue
        try:
            name = names(column)
        except (DefinitionError, InvalidInput, KeyError):
            continue
        if name in inputs:
            keys.append((column, name))
    if not keys or timestamp not in columns:
        raise InvalidInput(
            f"labels need a query_id column, or entity key columns ({', '.join(sorted(inputs))})"
            f" and a time column {timestamp!r}; got {', '.join(columns)}",
            field="labels",
        )
    times = [_time(value, index, timestamp) for index, value in enumerate(columns[timestamp])]
    outcomes: dict[tuple[Any, ...], list[tuple[datetime, Any]]] = {}
    for index, value in enumerate(values):
        if _known(value):
            entity = tuple(columns[c][index] for c, _ in keys)
            outcomes.setdefault(entity, []).append((times[index], value))
    for found in outcomes.values():
        found.sort(key=lambda pair: pair[0])
    matched = {}
    for record in records:
        found = outcomes.get(tuple(record.inputs.get(name) for _, name in keys), [])
        at = bisect.bisect_left(found, record.now, key=lambda pair: pair[0])
        if at < len(found):
            ts, value = found[at]
            if ts == record.now or (horizon is not None and ts - record.now <= horizon):
                matched[record.query_id] = value
    return matched


def _time(value: Any, index: int, timestamp: str) -> datetime:
    if isinstance(value, str):  # ISO 8601 text from JSON or CSV
        with contextlib.suppress(ValueError):
            value = datetime.fromisoformat(value)
    if isinstance(value, datetime):
        try:
            return to_utc(value)
        except InvalidValue as error:
            raise InvalidInput(f"labels row {index}: {error}", field=timestamp) from None
    raise InvalidInput(
        f"labels row {index}: {timestamp}={value!r} is not a datetime", field=timestamp
    )


def _python(value: Any) -> Any:
    """A NumPy scalar (a dict of columns built from arrays) as the Python value."""
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return value.item()
    return value


def _known(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


# --- metrics --------------------------------------------------------------------------------


def _score(
    metric: str,
    feature: str,
    scored: Sequence[_Scored],
    schema: Mapping[str, Any] | None,
    threshold: float,
) -> tuple[float | None, float | None]:
    if metric in MODEL_METRICS:
        both = [s for s in scored if s.logged is not None and s.replayed is not None]
        numeric = [s for s in both if _number(s.logged) and _number(s.replayed)]
        if metric == "accuracy" and len(numeric) < len(both):  # classes, not scores
            return _share(lambda s, v: v == s.label, both)
        if not numeric:
            return None, None
        y = [_numeric_label(s.label, metric, feature) for s in numeric]
        return (
            _model_metric(metric, feature, y, [float(s.logged) for s in numeric], threshold),
            _model_metric(metric, feature, y, [float(s.replayed) for s in numeric], threshold),
        )
    if metric == "exact_match":
        return _share(lambda s, v: _exact(v, s.label), scored)
    if metric == "contains":
        return _share(lambda s, v: v is not None and _text(s.label) in _text(v), scored)
    return _share(lambda s, v: _json_valid(v, schema), scored)


def _share(
    test: Callable[[_Scored, Any], bool], scored: Sequence[_Scored]
) -> tuple[float | None, float | None]:
    if not scored:
        return None, None
    logged = sum(bool(test(s, s.logged)) for s in scored) / len(scored)
    replayed = sum(bool(test(s, s.replayed)) for s in scored) / len(scored)
    return logged, replayed


def _model_metric(
    metric: str, feature: str, y: list[float], scores: list[float], threshold: float
) -> float | None:
    metrics = _sklearn_metrics()
    if metric == "accuracy":
        return float(metrics.accuracy_score(y, [float(p >= threshold) for p in scores]))
    if metric == "mae":
        return float(metrics.mean_absolute_error(y, scores))
    if any(not 0.0 <= p <= 1.0 for p in scores) and metric == "log_loss":
        raise InvalidInput(
            f"log_loss needs probabilities in [0, 1]; {feature!r} has values outside it "
            "(use mae for a regression)",
            field="metrics",
        )
    if len(set(y)) < 2:  # AUC and log loss need both classes among the labels
        return None
    try:
        if metric == "auc":
            return float(metrics.roc_auc_score(y, scores))
        return float(metrics.log_loss(y, scores, labels=[0, 1]))
    except ValueError as error:
        raise InvalidInput(f"{metric} of {feature!r}: {error}", field="metrics") from None


def _numeric_label(value: Any, metric: str, feature: str) -> float:
    if isinstance(value, bool | int | float):
        number = float(value)
        if metric in ("auc", "log_loss", "accuracy") and number not in (0.0, 1.0):
            raise InvalidInput(
                f"{metric} of {feature!r} needs labels 0 or 1 (True/False), got {value!r}",
                field="label",
            )
        return number
    raise InvalidInput(
        f"{metric} of {feature!r} needs numeric labels, got {value!r}", field="label"
    )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def _exact(answer: Any, label: Any) -> bool:
    if isinstance(answer, str) and isinstance(label, str):
        return answer.strip() == label.strip()
    return answer is not None and bool(answer == label)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value.casefold()
    return json.dumps(value, sort_keys=True, default=str).casefold()


def _json_valid(answer: Any, schema: Mapping[str, Any] | None) -> bool:
    if isinstance(answer, str):
        try:
            answer = json.loads(answer)
        except ValueError:
            return False
    elif not isinstance(answer, dict | list):  # a structured answer arrives parsed
        return False
    if schema is None:
        return True
    return bool(_jsonschema().Draft202012Validator(schema).is_valid(answer))


class _Judge:
    """Asks `judge_model`, through the gateway, whether each answer is correct given its
    label; the same question is asked once."""

    def __init__(self, chat: Chat, model: str, result: ReplayResult) -> None:
        self._chat = chat
        self._model = model
        self._replayed = result.llm_calls
        self._asked: dict[str, asyncio.Task[bool]] = {}
        self._limit = asyncio.Semaphore(JUDGES)
        self.calls = 0

    async def score(
        self, feature: str, scored: Sequence[_Scored]
    ) -> tuple[float | None, float | None]:
        if not scored:
            return None, None
        logged = [
            self._verdict(s.label, s.logged, _prompt(s.record.llm_calls, feature)) for s in scored
        ]
        replayed = [
            self._verdict(
                s.label, s.replayed, _prompt(self._replayed.get(s.record.query_id, []), feature)
            )
            for s in scored
        ]
        # every call finishes (or fails) before an error is raised: none is left running
        verdicts = await asyncio.gather(*logged, *replayed, return_exceptions=True)
        for verdict in verdicts:
            if isinstance(verdict, BaseException):
                raise verdict
        before, after = verdicts[: len(scored)], verdicts[len(scored) :]
        return sum(map(bool, before)) / len(scored), sum(map(bool, after)) / len(scored)

    async def _verdict(self, label: Any, answer: Any, prompt: str | None) -> bool:
        if answer is None:  # nothing answered: not correct
            return False
        question = (
            (f"Prompt:\n{prompt}\n\n" if prompt else "")
            + f"Reference answer:\n{_plain(label)}\n\nAnswer to grade:\n{_plain(answer)}\n\n"
            + "Is the answer correct given the reference answer? Reply yes or no."
        )
        task = self._asked.get(question)
        if task is None:
            task = asyncio.ensure_future(self._ask(question))
            self._asked[question] = task
        return await task

    async def _ask(self, question: str) -> bool:
        body = {
            "model": self._model,
            "messages": [
                {"role": "system", "content": JUDGE_SYSTEM},
                {"role": "user", "content": question},
            ],
            "stream": False,
            "temperature": 0,
            "max_tokens": 4,
        }
        async with self._limit:
            self.calls += 1
            reply = await self._chat.chat(body)
        text = await _reply_text(reply)
        words = text.strip().split()
        return bool(words) and words[0].strip(".,!:;\"'*").casefold() == "yes"


def _prompt(calls: Sequence[Mapping[str, Any]], feature: str) -> str | None:
    """The rendered messages of a decision's call for `feature`, as text."""
    for call in calls:
        if call.get("feature") == feature and call.get("messages"):
            return "\n".join(
                f"{m.get('role', 'user')}: {m.get('content', '')}"
                for m in call["messages"]
                if isinstance(m, Mapping)
            )
    return None


async def _reply_text(reply: dict[str, Any] | AsyncIterable[dict[str, Any]]) -> str:
    if isinstance(reply, dict):
        choices = reply.get("choices") or [{}]
        return str((choices[0].get("message") or {}).get("content") or "")
    parts = []
    async for chunk in reply:  # a gateway that streamed anyway
        for choice in chunk.get("choices") or []:
            parts.append(str((choice.get("delta") or {}).get("content") or ""))
    return "".join(parts)


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


# --- the report -----------------------------------------------------------------------------


def _write_report(
    folder: Path, result: ReplayResult, evaluation: Evaluation, features: Sequence[str]
) -> Path:
    """report.md (the replay's summary and the metrics) and scores.png beside it."""
    figure = _plot(result, evaluation, features)
    folder.mkdir(parents=True, exist_ok=True)
    plot = folder / PLOT
    figure.savefig(plot, format="png", dpi=100)
    text = (
        result.to_markdown()
        + "\n"
        + evaluation.to_markdown()
        + f"\n![Score distributions, logged and replayed]({PLOT})\n"
    )
    (folder / REPORT).write_text(text, encoding="utf-8")
    return plot


def _plot(result: ReplayResult, evaluation: Evaluation, features: Sequence[str]) -> Any:
    """Histograms of the logged and replayed values of each numeric feature (a bar chart of
    the metrics when no feature is numeric)."""
    try:
        from matplotlib.figure import Figure  # Agg, without pyplot's global state
    except ImportError:
        raise KairosError(f"the evaluation report's plot needs matplotlib: {INSTALL}") from None
    numeric: dict[str, tuple[list[float], list[float]]] = {}
    for row in result.rows:
        if row.feature in features and _number(row.logged) and _number(row.replayed):
            before, after = numeric.setdefault(row.feature, ([], []))
            before.append(float(row.logged))
            after.append(float(row.replayed))
    panels = max(len(numeric), 1)
    figure = Figure(figsize=(7, 3 * panels), layout="constrained")
    axes = figure.subplots(panels, 1, squeeze=False)[:, 0]
    if not numeric:
        _metric_bars(axes[0], evaluation)
        return figure
    for ax, (name, (before, after)) in zip(axes, numeric.items(), strict=False):
        low, high = min(before + after), max(before + after)
        bins = [low + (high - low) * i / 20 for i in range(21)] if high > low else 10
        ax.hist(before, bins=bins, alpha=0.55, label="logged")
        ax.hist(after, bins=bins, alpha=0.55, label="replayed")
        ax.set_title(name)
        ax.set_ylabel("decisions")
        ax.legend()
    return figure


def _metric_bars(ax: Any, evaluation: Evaluation) -> None:
    labels, before, after = [], [], []
    for name, scores in evaluation.metrics.items():
        for metric, both in scores.items():
            labels.append(f"{name}\n{metric}")
            before.append(both["logged"] or 0.0)
            after.append(both["replayed"] or 0.0)
    places = list(range(len(labels)))
    ax.bar([p - 0.2 for p in places], before, width=0.4, label="logged")
    ax.bar([p + 0.2 for p in places], after, width=0.4, label="replayed")
    ax.set_xticks(places, labels)
    ax.set_title("metrics")
    ax.legend()


def _sklearn_metrics() -> Any:
    try:
        import sklearn.metrics
    except ImportError:
        raise KairosError(f"model metrics need scikit-learn: {INSTALL}") from None
    return sklearn.metrics


def _jsonschema() -> Any:
    try:
        import jsonschema
    except ImportError:
        raise KairosError(f"json_valid with schema= needs jsonschema: {INSTALL}") from None
    return jsonschema


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


__all__ = ["METRICS", "Evaluation", "evaluate"]
