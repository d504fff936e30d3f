"""One llama.cpp model in process with `slots` sequences decoded together (continuous batching).

Up to `slots` requests generate at once, each in its own slot (`kairos.serving.slots`): a
request joins the running batch at the next decode step and leaves when it ends. Requests
beyond that wait in a strict FIFO queue; each runs to its end (or its own cancellation) and
none ever cuts off another. With `slots=1` it is one generation at a time, in arrival order.
Decoding runs on one dedicated thread so the event loop keeps serving (`/health`, `/metrics`,
new arrivals) while tokens are produced.

    engine = LlamaCppEngine(EngineConfig(model_path="tiny.gguf", n_ctx=512, slots=4))
    engine.load()                                   # blocking: call it off the event loop
    job = engine.submit(engine.tokenize("Hello"), Sampling(max_tokens=8))
    async for event in job.events(): ...            # Piece(text) ..., then Finished(...)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib
import itertools
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kairos.serving.errors import ContextOverflow, EngineNotReady, LLMRequestError
from kairos.serving.slots import SlotHooks, SlotLoop


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model_path: str
    n_ctx: int = 2048
    n_threads: int | None = None  # None: llama.cpp's default (about half the cores)
    seed: int = 0
    n_batch: int = 512
    chat_format: str | None = None  # a llama-cpp chat format name; None: the GGUF's template
    # llama.cpp's extra weight buffers (repacking, AMX). None: on, except where the build uses
    # AMX, whose mat-mul crashes on Gemma 3's Q4_K weights (ggml_backend_amx_mul_mat SIGSEGV)
    extra_buffers: bool | None = None
    slots: int = 1  # requests decoded together; each gets n_ctx tokens of its own KV


@dataclass(frozen=True, slots=True)
class Sampling:
    """How to sample one completion; `seed` None keeps the engine's generator running."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    grammar: str | None = None  # GBNF (root rule `root`) every token must follow


@dataclass(frozen=True, slots=True)
class Timings:
    """One request's timings; TTFT counts from arrival (queue included), like vLLM's."""

    queue_ms: float  # arrival -> generation started
    prefill_ms: float  # generation started -> first token (prompt evaluation + one sample)
    ttft_ms: float  # arrival -> first token
    decode_ms: float  # first token -> last token
    total_ms: float  # arrival -> finished
    tokens_per_s: float  # decode rate: tokens after the first / decode time
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens whose KV a slot already held (prefix reuse)

    def as_dict(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class Piece:
    text: str


@dataclass(frozen=True, slots=True)
class Finished:
    finish_reason: str  # "stop" (eos or a stop sequence), "length", "cancelled" or "error"
    timings: Timings
    error: str | None = None


Event = Piece | Finished

_ids = itertools.count(1)


@dataclass(eq=False)
class Job:
    """One queued generation; iterate `events()` once; `cancel()` stops it wherever it is."""

    prompt: tuple[int, ...]
    sampling: Sampling
    seed: int = 0
    arrived: float = field(default_factory=time.perf_counter)
    id: int = field(default_factory=lambda: next(_ids))
    state: str = "queued"  # then "running", then "done"
    _cancel: threading.Event = field(default_factory=threading.Event)
    _on_cancel: Callable[[Job], None] | None = None
    _loop: asyncio.AbstractEventLoop | None = None  # where its events go
    _queue: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)

    def cancel(self) -> None:
        """Stop it: a queued job leaves the queue at once, a running one after its token."""
        if self._cancel.is_set():
            return
        self._cancel.set()
        if self._on_cancel is not None:
            self._on_cancel(self)

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    async def events(self) -> AsyncIterator[Event]:
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, Finished):
                return


class EngineObserver:
    """Hooks the worker's metrics hang on; the default does nothing."""

    def queued(self, depth: int) -> None: ...
    def started(self, job: Job, queue_s: float) -> None: ...
    def finished(self, job: Job, event: Finished) -> None: ...


class LlamaCppEngine:
    """A loaded GGUF model, its slots and its FIFO queue. Submit from the event loop."""

    def __init__(self, config: EngineConfig, observer: EngineObserver | None = None) -> None:
        if config.slots < 1:
            raise ValueError(f"slots must be at least 1, not {config.slots!r}")
        self.config = config
        self.observer = observer or EngineObserver()
        self._llama: Any = None
        self._eog: Callable[[int], bool] = lambda token: False
        self._chat: Any = None
        self.load_error: str | None = None
        self._pending: collections.deque[Job] = collections.deque()  # queued, oldest first
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: SlotLoop | None = None
        self._thread: threading.Thread | None = None
        self._rng = random.Random(config.seed)
        self._running: set[Job] = set()
        self.waiting = 0
        self.running = 0

    # -- loading ---------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._llama is not None

    @property
    def n_ctx(self) -> int:
        return self.config.n_ctx

    @property
    def n_vocab(self) -> int:
        return int(self._ready().n_vocab())

    @property
    def slots(self) -> int:
        return self.config.slots

    def load(self) -> None:
        """Load the model (seconds for a real one); raises EngineNotReady naming the cause."""
        path = Path(self.config.model_path)
        if not path.is_file():
            self.load_error = f"model file {str(path)!r} does not exist"
            raise EngineNotReady(self.load_error)
        try:
            import llama_cpp
        except ImportError:
            self.load_error = (
                "llama-cpp-python is not installed: pip install 'kairos-inference[llm]'"
            )
            raise EngineNotReady(self.load_error) from None
        n_batch = min(self.config.n_batch, self.config.n_ctx)
        kwargs: dict[str, Any] = {
            "model_path": str(path),
            # Llama's own context only tokenizes: the slots' context below holds the KV
            "n_ctx": 16,
            "n_batch": 16,
            "seed": self.config.seed,
            "verbose": False,
        }
        if self.config.n_threads is not None:
            kwargs["n_threads"] = self.config.n_threads
            kwargs["n_threads_batch"] = self.config.n_threads
        try:
            with model_params(extra_buffers(llama_cpp, self.config.extra_buffers)):
                llama = llama_cpp.Llama(**kwargs)
            slots = SlotLoop(
                llama_cpp,
                llama.model,
                self._context_params(llama_cpp, llama, n_batch),
                slots=self.config.slots,
                n_batch=n_batch,
                hooks=SlotHooks(
                    started=self._on_started,
                    piece=self._on_piece,
                    ended=self._on_ended,
                    detokenize=lambda tokens: bytes(llama.detokenize(list(tokens))),
                    is_eog=lambda token: self._eog(token),
                ),
            )
        except (ValueError, RuntimeError) as error:
            self.load_error = f"llama.cpp cannot load {str(path)!r}: {error}"
            raise EngineNotReady(self.load_error) from None
        vocab = llama_cpp.llama_model_get_vocab(llama.model)
        self._eog = lambda token: bool(llama_cpp.llama_vocab_is_eog(vocab, token))
        self._chat = _chat_formatter(llama, self.config.chat_format)
        self._slots = slots
        self._thread = threading.Thread(target=slots.run, name="llama-slots", daemon=True)
        self._thread.start()
        self._llama = llama

    def _context_params(self, llama_cpp: Any, llama: Any, n_batch: int) -> Any:
        """Llama's own settings (threads, KV types...), sized for `slots` sequences that each
        hold `n_ctx` tokens (llama.cpp splits a non-unified KV cache evenly between them)."""
        params = type(llama.context_params).from_buffer_copy(llama.context_params)
        params.n_ctx = self.config.n_ctx * self.config.slots
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = self.config.slots
        params.kv_unified = False
        # flash attention (where the model allows it): a prompt evaluated in pieces, as prefix
        # reuse does, then gives bit-identical logits to one evaluated whole; without it the
        # logits moved by up to 0.7 and greedy answers changed on a repeated prompt
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
        return params

    def close(self) -> None:
        """Stop: running generations are cancelled (after their current token), then freed."""
        for job in list(self._running):
            job.cancel()
        self._pending.clear()
        if self._slots is not None:
            self._slots.stop()
        if self._thread is not None:
            self._thread.join()
            self._thread, self._slots = None, None
        if self._llama is not None:
            self._llama.close()
            self._llama = None

    # -- tokens ----------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids with the model's own tokenizer (`special`: parse `<tokens>` in the text)."""
        llama = self._ready()
        return list(llama.tokenize(text.encode(), add_bos=add_bos, special=special))

    def detokenize(self, tokens: Sequence[int]) -> str:
        return bytes(self._ready().detokenize(list(tokens))).decode("utf-8", errors="replace")

    def chat_prompt(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Render messages with the model's chat template and tokenize the result.

        The template's special tokens (`<start_of_turn>`...) are parsed as tokens; generation
        ends on the model's end-of-generation tokens (EOS, end-of-turn), not on stop strings.
        """
        llama = self._ready()
        try:
            prompt = str(self._chat(messages=list(messages)).prompt)
        except Exception as error:  # a template may refuse a conversation (e.g. roles' order)
            raise LLMRequestError(
                f"the model's chat template refused these messages: {error}", param="messages"
            ) from None
        # templates write the BOS text themselves; tokenizing must not add a second one
        bos = _token_text(llama, llama.token_bos())
        return self.tokenize(prompt, add_bos=not (bos and prompt.startswith(bos)), special=True)

    def fit(self, prompt: Sequence[int], max_tokens: int, field_name: str) -> int:
        """Clamp max_tokens so prompt + output fit the context; refuse a prompt that fills it."""
        room = self.config.n_ctx - len(prompt)
        if room < 1:
            raise ContextOverflow(
                f"{field_name} is {len(prompt)} tokens; this model's context holds "
                f"{self.config.n_ctx}: shorten it to at most {self.config.n_ctx - 1} tokens",
                param=field_name,
            )
        return min(max_tokens, room)

    # -- the queue -------------------------------------------------------------------------

    def submit(self, prompt: Sequence[int], sampling: Sampling) -> Job:
        """Start a generation in a free slot, else queue it behind every earlier one; must be
        called on the event loop."""
        self._ready()
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new event loop: the old one's jobs are gone
            for job in list(self._running):
                job.cancel()
            self._loop, self._pending, self._running = loop, collections.deque(), set()
            self.running = 0
        # without a seed each request draws one from the engine's seeded generator, so answers
        # vary between requests yet a worker's sequence is reproducible
        job = Job(tuple(prompt), sampling, seed=self._rng.randrange(1 << 31))
        job._on_cancel = self._drop
        self.waiting += 1
        self.observer.queued(self.waiting)
        self._pending.append(job)
        self._dispatch()
        return job

    def _dispatch(self) -> None:
        """Hand the oldest queued jobs to free slots; on the event loop. A job starts here, in
        `submit` or as another ends, not a loop iteration later in a consumer task: that hop
        was TTFT the request paid on top of llama.cpp (bench/llm_path.py)."""
        slots = self._slots
        if slots is None or self._loop is None:
            return
        while self._pending and self.running < self.config.slots:
            job = self._pending.popleft()
            if job.state != "queued":  # cancelled while it waited: already accounted for
                continue
            job.state = "running"
            job._loop = self._loop
            self.waiting -= 1
            self.observer.queued(self.waiting)
            self.running += 1
            self._running.add(job)
            slots.admit(job)

    def _drop(self, job: Job) -> None:
        """A client left: a queued job leaves the count now (the consumer skips it); a running
        one is noticed by the slots at their next step."""
        if job.state == "queued":
            job.state = "done"
            self.waiting -= 1
            self.observer.queued(self.waiting)
            self._finish(job, _cancelled(job))
        elif job.state == "running" and self._slots is not None:
            self._slots.poke()

    def _finish(self, job: Job, event: Finished) -> None:
        self.observer.finished(job, event)
        job._queue.put_nowait(event)

    # -- hooks from the generation thread: each hops onto the job's event loop ---------------

    def _on_started(self, job: Job, started: float) -> None:
        _call(job, self.observer.started, job, started - job.arrived)

    def _on_piece(self, job: Job, text: str) -> None:
        _call(job, job._queue.put_nowait, Piece(text))

    def _on_ended(self, job: Job, reason: str, counters: dict[str, Any], error: str | None) -> None:
        _call(job, self._ended, job, Finished(reason, _timings(job, counters), error))

    def _ended(self, job: Job, event: Finished) -> None:
        """A running job's last event (on the loop): a queued one takes its slot at once."""
        if job not in self._running:  # a job of an event loop since replaced
            return
        self._running.discard(job)
        self.running -= 1
        job.state = "done"
        self._finish(job, event)
        self._dispatch()

    def _ready(self) -> Any:
        if self._llama is None:
            raise EngineNotReady(self.load_error or "the model is still loading; retry shortly")
        return self._llama


def _call(job: Job, callback: Callable[..., Any], *args: Any) -> None:
    loop = job._loop
    if loop is not None:
        with contextlib.suppress(RuntimeError):  # its event loop is closed: nobody listens
            loop.call_soon_threadsafe(callback, *args)


_PARAMS_LOCK = threading.Lock()


def extra_buffers(llama_cpp: Any, wanted: bool | None = None) -> bool:
    """Whether to load with llama.cpp's extra weight buffers: `wanted`, else on except where
    the build uses AMX (its mat-mul crashes on Gemma 3's Q4_K weights)."""
    if wanted is not None:
        return wanted
    return b"AMX_INT8 = 1" not in bytes(llama_cpp.llama_print_system_info())


@contextlib.contextmanager
def model_params(extra_buffers: bool) -> Iterator[None]:
    """Load with `use_extra_bufts` set: `Llama()` has no argument for it, so its default-params
    function is wrapped for the duration of the load (under a lock: it is module state)."""
    module: Any = importlib.import_module("llama_cpp.llama")
    if extra_buffers:
        yield
        return
    with _PARAMS_LOCK:
        original = module.llama_cpp.llama_model_default_params

        def params() -> Any:
            value = original()
            value.use_extra_bufts = False
            return value

        module.llama_cpp.llama_model_default_params = params
        try:
            yield
        finally:
            module.llama_cpp.llama_model_default_params = original


def _cancelled(job: Job) -> Finished:
    waited = (time.perf_counter() - job.arrived) * 1e3
    return Finished("cancelled", Timings(waited, 0.0, 0.0, 0.0, waited, 0.0, len(job.prompt), 0))


def _timings(job: Job, counters: dict[str, Any]) -> Timings:
    started = counters.get("started")
    if started is None:  # it never reached a slot
        waited = (time.perf_counter() - job.arrived) * 1e3
        return Timings(waited, 0.0, 0.0, 0.0, waited, 0.0, len(job.prompt), 0)
    first, done, count = counters["first"], counters["done"], counters["count"]
    decode_s = done - first
    return Timings(
        queue_ms=(started - job.arrived) * 1e3,
        prefill_ms=(first - started) * 1e3,
        ttft_ms=(first - job.arrived) * 1e3,
        decode_ms=decode_s * 1e3,
        total_ms=(done - job.arrived) * 1e3,
        tokens_per_s=(count - 1) / decode_s if count > 1 and decode_s > 0 else 0.0,
        prompt_tokens=len(job.prompt),
        completion_tokens=count,
        cached_tokens=counters["cached_tokens"],
    )


def _chat_formatter(llama: Any, chat_format: str | None) -> Callable[..., Any]:
    """The model's own Jinja chat template from its GGUF metadata, else a named llama-cpp one."""
    from llama_cpp import llama_chat_format

    template = llama.metadata.get("tokenizer.chat_template")
    if chat_format is None and template:
        return llama_chat_format.Jinja2ChatFormatter(
            template=template,
            eos_token=_token_text(llama, llama.token_eos()),
            bos_token=_token_text(llama, llama.token_bos()),
            add_generation_prompt=True,
        )
    # a GGUF without a template (Gemma 3 270M's has none) gets its family's format
    family = str(llama.metadata.get("general.architecture", ""))
    name = chat_format or next(
        (fmt for prefix, fmt in _FAMILY_FORMATS if family.startswith(prefix)), "chatml"
    )
    formatter = getattr(llama_chat_format, "format_" + name.replace("-", "_"), None) or getattr(
        llama_chat_format, "format_" + name.replace("-", "").replace("_", ""), None
    )
    if formatter is None:
        raise EngineNotReady(
            f"unknown chat format {name!r}: use one of llama-cpp-python's format names "
            "(chatml, llama2, gemma, mistral_instruct, ...), or omit it for the model's own"
        )
    return formatter  # type: ignore[no-any-return]


_FAMILY_FORMATS = (("gemma", "gemma"), ("llama", "llama2"), ("mistral", "mistral_instruct"))


def _token_text(llama: Any, token: int) -> str:
    return str(llama._model.token_get_text(token)) if token >= 0 else ""
