"""Credentials out of every text that leaves the gateway: error messages (whole and
mid-stream), stream events, answers, log lines. A provider may quote the key it was sent, whole
or cut short by its own truncation, so a secret is masked wherever its first 8 characters
appear, together with as much of the rest of it as follows. Scrub first, then truncate.

>>> secrets = Secrets(["sk-provider-secret-42"])
>>> secrets.scrub("bad key 'sk-provider-sec'"), secrets.scrub(b"Bearer sk-provider-secret-42")
("bad key '***'", b'Bearer ***')
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from kairos.gateway.config import GatewayConfig, ProviderConfig
    from kairos.gateway.errors import GatewayError

MASK = "***"
_HEAD = 8  # characters that mark a secret: a shorter piece of one gives too little away
_SHORTEST = 4  # a configured value shorter than this is no secret (e.g. "x" for a local server)

Text = TypeVar("Text", str, bytes)


class Secrets:
    """The secrets to mask, as text and as UTF-8 bytes, grouped by their first 8 characters
    (two keys may share a public head such as `sk-proj-`: the longest match is masked)."""

    __slots__ = ("_bytes", "_text")

    def __init__(self, values: Iterable[str]) -> None:
        unique = {value for value in values if len(value) >= _SHORTEST}
        self._text = _by_head(unique)
        self._bytes = _by_head({value.encode() for value in unique})

    @classmethod
    def of_provider(cls, provider: ProviderConfig) -> Secrets:
        """What a provider is sent: its key and its configured header values (each word of
        one, so `Bearer <token>` masks the token quoted alone)."""
        return cls([provider.api_key, *_words(provider.headers.values())])

    @classmethod
    def of(cls, config: GatewayConfig) -> Secrets:
        """Every credential a gateway holds: each provider's, the admin key and the pepper."""
        values = [config.admin_key, config.pepper]
        for provider in config.providers.values():
            values += [provider.api_key, *_words(provider.headers.values())]
        return cls(values)

    def __bool__(self) -> bool:
        return bool(self._text)

    def scrub(self, text: Text) -> Text:
        """`text` with every secret (or a piece of 8 characters or more from its start)
        replaced by `***`; `text` itself, at the cost of a substring search per secret, when
        none is in it."""
        if isinstance(text, bytes):
            return _masked(text, self._bytes, MASK.encode())
        return _masked(text, self._text, MASK)

    def scrub_error(self, error: GatewayError) -> GatewayError:
        """`error` with its message scrubbed (in place: it keeps its class and fields)."""
        scrubbed = self.scrub(error.message)
        if scrubbed != error.message:
            error.message = scrubbed
            error.args = (scrubbed, *error.args[1:])
        return error


def _words(values: Iterable[str]) -> list[str]:
    """Each value, and each word of it as long as a secret's head (not `Bearer`)."""
    return [
        word
        for value in values
        for word in (value, *value.split())
        if word == value or len(word) >= _HEAD
    ]


def _by_head(values: set[Text]) -> tuple[tuple[Text, tuple[Text, ...]], ...]:
    groups: dict[Text, list[Text]] = {}
    for value in values:
        groups.setdefault(value[:_HEAD], []).append(value)
    return tuple((head, tuple(group)) for head, group in groups.items())


def _masked(text: Text, groups: tuple[tuple[Text, tuple[Text, ...]], ...], mask: Text) -> Text:
    for head, secrets in groups:
        start = text.find(head)
        while start != -1:
            end = start + max(_common(text, start, secret) for secret in secrets)
            text = text[:start] + mask + text[end:]
            start = text.find(head, start + len(mask))
    return text


def _common(text: Text, start: int, secret: Text) -> int:
    """How many characters of `secret` follow at `start` of `text`."""
    length = min(len(secret), len(text) - start)
    count = 0
    while count < length and text[start + count] == secret[count]:
        count += 1
    return count
