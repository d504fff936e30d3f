"""Prompt templates over features: sandboxed Jinja2, the features a template reads, and how
many prompt tokens each feature contributed.

A template is compiled once, in a `SandboxedEnvironment` (no attribute access to Python
internals, no imports) with `StrictUndefined` (a name that is not a feature fails when the
project loads, not silently as an empty string). The features a template reads are its
undeclared variables.

Token attribution is by difference: a feature's tokens are the prompt's tokens minus the
tokens of the same prompt rendered with that feature empty (an empty string, an empty list of
rows, a window mapping of empty values). So text a feature switches on (`{% if declines %}...`)
counts for it, and the rows of a has-many feature count for that feature. What no feature
accounts for is the template's own text. The counts sum to the rendered prompt's tokens by
construction.

Rows retrieved by vector search (`kr.nearest`) are attributed one by one, by the same
difference with that row left out: `related[0]`, `related[1]`, ... (nearest first), and
`related` keeps what the rows share (a header the template shows when there are any).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.sandbox import SandboxedEnvironment

from kairos.definitions.completion import Message
from kairos.definitions.feature import window_name
from kairos.errors import DefinitionError, KairosError

TEMPLATE = "(template)"  # the bucket of tokens no feature accounts for


class PromptError(KairosError, ValueError):
    """A template failed to render for a row (a missing value, a bad filter argument)."""


def _environment() -> SandboxedEnvironment:
    return SandboxedEnvironment(
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )


@dataclass(frozen=True)
class Template:
    """One compiled template and the names it reads."""

    text: str
    variables: frozenset[str]
    compiled: jinja2.Template

    @classmethod
    def compile(cls, text: str, where: str) -> Template:
        environment = _environment()
        try:
            tree = environment.parse(text)
        except jinja2.TemplateSyntaxError as error:
            raise DefinitionError(
                f"{where}: template line {error.lineno}: {error.message}"
            ) from None
        variables = frozenset(meta.find_undeclared_variables(tree))
        return cls(text, variables, environment.from_string(text))

    def render(self, values: Mapping[str, Any]) -> str:
        try:
            return self.compiled.render(**values)
        except jinja2.TemplateError as error:
            raise PromptError(f"template {self.text[:40]!r}: {error}") from None
        except (TypeError, ValueError, ArithmeticError) as error:
            raise PromptError(f"template {self.text[:40]!r}: {error}") from None


@dataclass(frozen=True)
class Prompt:
    """Chat messages compiled from templates."""

    roles: tuple[str, ...]
    templates: tuple[Template, ...]

    @classmethod
    def compile(cls, messages: Sequence[Message], where: str) -> Prompt:
        return cls(
            tuple(m.role for m in messages),
            tuple(Template.compile(m.template, where) for m in messages),
        )

    @property
    def variables(self) -> frozenset[str]:
        found: frozenset[str] = frozenset()
        for template in self.templates:
            found |= template.variables
        return found

    def render(self, values: Mapping[str, Any]) -> list[dict[str, str]]:
        """The messages for one row, OpenAI-shaped."""
        return [
            {"role": role, "content": template.render(values)}
            for role, template in zip(self.roles, self.templates, strict=True)
        ]

    def attribute(
        self,
        values: Mapping[str, Any],
        empty: Mapping[str, Any],
        count: Callable[[str], int],
        rendered: Sequence[Mapping[str, str]] | None = None,
        per_row: frozenset[str] = frozenset(),
    ) -> dict[str, int]:
        """Tokens of the rendered messages per feature (by difference; see the module), plus
        TEMPLATE for the rest; the values sum to the tokens of all messages' contents.
        `rendered` is `render(values)` when the caller already has it; the has-many features
        in `per_row` are attributed row by row too (`name[i]`)."""

        def tokens(messages: Sequence[Mapping[str, str]]) -> int:
            return sum(count(m["content"]) for m in messages)

        total = tokens(self.render(values) if rendered is None else rendered)
        found: dict[str, int] = {}
        for name in sorted(self.variables & set(values)):
            try:
                without = tokens(self.render({**values, name: empty[name]}))
            except PromptError:  # e.g. a filter that needs a number: count the value alone
                without = total - count(str(values[name]))
            found[name] = max(total - without, 0)
            rows = values[name]
            if name in per_row and isinstance(rows, list):
                for index in range(len(rows)):
                    others = [row for i, row in enumerate(rows) if i != index]
                    row_tokens = max(total - tokens(self.render({**values, name: others})), 0)
                    found[f"{name}[{index}]"] = row_tokens
                    found[name] = max(found[name] - row_tokens, 0)
        found[TEMPLATE] = total - sum(found.values())
        return found


class Windows(dict[str, Any]):
    """A windowed feature in a template: `txn_count['7d']`, also `txn_count['168h']`."""

    def __getitem__(self, window: Any) -> Any:
        if isinstance(window, str) and window not in self:
            with contextlib.suppress(KairosError):
                window = window_name(window)
        return super().__getitem__(window)
