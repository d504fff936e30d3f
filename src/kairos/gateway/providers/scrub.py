"""Credentials out of every text that leaves the gateway: error messages (whole and
mid-stream), stream events, answers, log lines. A provider may quote the key it was sent, whole
or cut short by its own truncation, so a provider's credential is masked wherever its first 8
characters appear, together with as much of the rest of it as follows. The gateway's own
secrets (admin key, pepper) are never sent to a provider and are chosen by people (a word may
begin one): they are masked whole only. Scrub first, then truncate.

>>> secrets = Secrets(["sk-provider-secret-42"])
>>> secrets.scrub("bad key 'sk-provider-sec'"), secrets.scrub(b"Bearer sk-provider-secret-42")
("bad key '***'", b'Bearer ***')
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from kairos.gateway.config import GatewayConfig, ProviderConfig
from kairos.gateway.errors import GatewayError

MASK = "***"
_HEAD = 8  # characters that mark a secret: a shorter piece of one gives too little away
_SHORTEST = 4  # a configured value shorter than this is no secret (e.g. "x" for a local server)
# headers whose values are credentials (`api-key`, `x-goog-api-key`, `Authorization`...); others
# (`OpenAI-Beta: assistants=v2`) are not, and their heads appear in ordinary answers
_CREDENTIAL_HEADERS = ("auth", "key", "token", "secret", "password", "cookie", "signature")

Text = TypeVar("Text", str, bytes)


class Secrets:
    """The secrets to mask, as text and as UTF-8 bytes, grouped by their first 8 characters
    (two keys may share a public head such as `sk-proj-`: the longest match is masked);
    those in `whole` only where they appear in full."""

    __slots__ = ("_bytes", "_text")

    def __init__(self, values: Iterable[str], *, whole: Iterable[str] = ()) -> None:
        heads = {value: value[:_HEAD] for value in values if len(value) >= _SHORTEST}
        heads.update({value: value for value in whole if len(value) >= _SHORTEST})
        self._text = _by_head(heads)
        self._bytes = _by_head({value.encode(): head.encode() for value, head in heads.items()})

    @classmethod
    def of_provider(cls, provider: ProviderConfig) -> Secrets:
        """What a provider is sent: its key and its credential headers' values (each word of
        one too, so `Bearer <token>` masks the token quoted alone)."""
        return cls(_credentials(provider))

    @classmethod
    def of(cls, config: GatewayConfig) -> Secrets:
        """Every credential a gateway holds: each provider's, the admin key and the pepper."""
        provided = [value for p in config.providers.values() for value in _credentials(p)]
        return cls(provided, whole=[config.admin_key, config.pepper])

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


def _credentials(provider: ProviderConfig) -> list[str]:
    """The provider's key and its credential headers' values, each word of one as long as a
    secret's head too (not `Bearer`)."""
    values = [provider.api_key]
    for name, value in provider.headers.items():
        if any(word in name.lower() for word in _CREDENTIAL_HEADERS):
            values += [value, *(word for word in value.split() if len(word) >= _HEAD)]
    return values


def _by_head(heads: dict[Text, Text]) -> tuple[tuple[Text, tuple[Text, ...]], ...]:
    """(head, the secrets it begins) for each head; a whole-only secret is its own head."""
    groups: dict[Text, list[Text]] = {}
    for value, head in heads.items():
        groups.setdefault(head, []).append(value)
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
