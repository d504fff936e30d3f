"""Continuous batching: N slots decoded together, one llama.cpp `llama_decode` per step.

The shape of llama.cpp's own server (`update_slots`): each slot is a sequence id with its own
KV cells, its own sampler (seed, temperature, grammar) and its own stop conditions. A step puts
one token for every generating slot into the batch, fills what room is left with prompt tokens
of slots still reading their prompt, decodes once, then samples each slot from its own row of
logits. A request joins at the next step and leaves when it ends; a cancelled one leaves at
the next step, freeing its slot for whoever waits.

A slot keeps the tokens whose KV it holds after its request ends, so a new request takes the
free slot sharing the longest prefix with its prompt and evaluates only the rest
(`cached_tokens`).

    loop = SlotLoop(lib, model, context_params, slots=8, n_ctx=2048, n_batch=512, hooks=...)
    loop.admit(job)        # from the event loop, when a slot is free; runs on loop.run()
"""

from __future__ import annotations

import codecs
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kairos.serving.sampler import SlotSampler
from kairos.serving.stops import StopMatcher


class Job(Protocol):
    """What a slot reads of the engine's job (`kairos.serving.llamacpp.Job`)."""

    prompt: tuple[int, ...]
    sampling: Any  # kairos.serving.llamacpp.Sampling
    seed: int

    @property
    def cancelled(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class SlotHooks:
    """What the loop tells the engine, from the generation thread (the engine hops threads)."""

    started: Callable[[Any, float], None]  # the job, its start time (perf_counter)
    piece: Callable[[Any, str], None]
    ended: Callable[[Any, str, dict[str, Any], str | None], None]  # reason, counters, error
    detokenize: Callable[[Sequence[int]], bytes]
    is_eog: Callable[[int], bool]


@dataclass(eq=False)
class _Slot:
    seq: int
    cached: list[int] = field(default_factory=list)  # tokens whose KV this sequence holds
    used: float = 0.0  # when it last took a request: the oldest cache is evicted first
    job: Job | None = None
    pending: list[int] = field(default_factory=list)  # prompt tokens still to evaluate
    sampler: SlotSampler | None = None
    row: int = -1  # this step's batch row whose logits it samples; -1: none
    next_token: int = -1  # sampled, not yet decoded
    started: float = 0.0
    first: float = 0.0
    count: int = 0
    cached_tokens: int = 0
    decoder: Any = None
    stops: StopMatcher | None = None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class SlotLoop:
    """The generation thread's state: a llama.cpp context with `slots` sequences."""

    def __init__(
        self,
        lib: Any,
        model: Any,
        params: Any,
        *,
        slots: int,
        n_batch: int,
        hooks: SlotHooks,
    ) -> None:
        self._lib = lib
        self._hooks = hooks
        self._ctx = lib.llama_init_from_model(model, params)
        if not self._ctx:
            raise RuntimeError(f"llama.cpp could not create a context for {slots} slots")
        self._memory = lib.llama_get_memory(self._ctx)
        self._vocab = lib.llama_model_get_vocab(model)
        self._n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self._n_swa = int(lib.llama_model_n_swa(model))
        self._n_batch = n_batch
        self._batch = lib.llama_batch_init(n_batch, 0, 1)
        self._slots = [_Slot(seq) for seq in range(slots)]
        self._inbox: deque[Job] = deque()
        self._wake = threading.Condition()
        self._closing = False

    # -- from the event loop ---------------------------------------------------------------

    def admit(self, job: Job) -> None:
        """Hand a job over; the engine admits no more than there are slots."""
        with self._wake:
            self._inbox.append(job)
            self._wake.notify()

    def poke(self) -> None:
        """A job was cancelled: wake the loop so a slot that waits on nothing notices."""
        with self._wake:
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._closing = True
            self._wake.notify()

    # -- the generation thread -------------------------------------------------------------

    def run(self) -> None:
        """Decode until `stop()`; every admitted job ends with exactly one `ended` hook."""
        try:
            while True:
                with self._wake:
                    while not self._closing and not self._inbox and not self._busy():
                        self._wake.wait()
                    if self._closing:
                        break
                    arrivals = list(self._inbox)
                    self._inbox.clear()
                for job in arrivals:
                    self._start(job)
                if self._busy():
                    self._step()
        finally:
            for slot in self._slots:
                if slot.job is not None:
                    self._end(slot, "cancelled")
            for job in self._inbox:
                self._hooks.ended(job, "cancelled", {"prompt_tokens": len(job.prompt)}, None)
            self._lib.llama_batch_free(self._batch)
            self._lib.llama_free(self._ctx)

    def _busy(self) -> bool:
        return any(slot.job is not None for slot in self._slots)

    def _start(self, job: Job) -> None:
        if job.cancelled:
            self._hooks.ended(job, "cancelled", {"prompt_tokens": len(job.prompt)}, None)
            return
        now = time.perf_counter()
        free = [slot for slot in self._slots if slot.job is None]
        prompt = list(job.prompt)
        # the free slot sharing the longest prefix; among equals the one idle longest
        slot = max(free, key=lambda s: (common_prefix(s.cached, prompt), -s.used))
        reuse = min(common_prefix(slot.cached, prompt), len(prompt) - 1)
        reuse = self._trim(slot, reuse)
        slot.cached = prompt[:reuse]
        slot.pending = prompt[reuse:]
        slot.job, slot.used, slot.started = job, now, now
        slot.count, slot.first, slot.row, slot.next_token = 0, 0.0, -1, -1
        slot.cached_tokens = reuse
        slot.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        s = job.sampling
        try:
            slot.stops = StopMatcher(s.stop)
            slot.sampler = SlotSampler(
                self._lib,
                self._vocab,
                self._n_vocab,
                temperature=s.temperature,
                top_p=s.top_p,
                top_k=s.top_k,
                min_p=s.min_p,
                repeat_penalty=s.repeat_penalty,
                frequency_penalty=s.frequency_penalty,
                presence_penalty=s.presence_penalty,
                seed=s.seed if s.seed is not None else job.seed,
                grammar=s.grammar,
            )
        except Exception as failure:  # the job ends with an event, the others go on
            self._hooks.started(job, now)
            self._end(slot, "error", f"llama.cpp failed while generating: {failure}")
            return
        self._hooks.started(job, now)

    def _trim(self, slot: _Slot, keep: int) -> int:
        """Drop this sequence's KV after `keep` tokens; how many could be kept (0: none)."""
        lib, memory, seq = self._lib, self._memory, slot.seq
        # a sliding-window cache forgets old cells: resuming at `keep` needs the window before
        # it (llama.cpp's server makes the same check)
        window = max(0, keep - self._n_swa)
        if keep > 0 and self._n_swa > 0 and lib.llama_memory_seq_pos_min(memory, seq) > window:
            keep = 0
        if keep > 0 and lib.llama_memory_seq_rm(memory, seq, keep, -1):
            return keep
        lib.llama_memory_seq_rm(memory, seq, -1, -1)
        return 0

    def _step(self) -> None:
        batch, rows = self._batch, 0
        active = [slot for slot in self._slots if slot.job is not None]
        for slot in active:
            if slot.job is not None and slot.job.cancelled:
                self._end(slot, "cancelled")
        generating = [s for s in active if s.job is not None and not s.pending]
        reading = [s for s in active if s.job is not None and s.pending]
        for slot in generating:
            self._put(rows, slot.next_token, len(slot.cached), slot.seq, True)
            slot.cached.append(slot.next_token)
            slot.row, rows = rows, rows + 1
        for slot in reading:
            room = self._n_batch - rows
            if room <= 0:
                slot.row = -1
                continue
            chunk, slot.pending = slot.pending[:room], slot.pending[room:]
            for i, token in enumerate(chunk):
                last = not slot.pending and i == len(chunk) - 1
                self._put(rows, token, len(slot.cached), slot.seq, last)
                slot.cached.append(token)
                rows += 1
            slot.row = rows - 1 if not slot.pending else -1
        if rows == 0:
            return
        batch.n_tokens = rows
        status = self._lib.llama_decode(self._ctx, batch)
        if status != 0:
            for slot in generating + reading:
                if slot.job is not None:
                    self._lib.llama_memory_seq_rm(self._memory, slot.seq, -1, -1)
                    slot.cached = []
                    self._end(slot, "error", f"llama_decode failed with status {status}")
            return
        for slot in generating + reading:
            if slot.job is not None and slot.row >= 0:
                self._sampled(slot)

    def _put(self, row: int, token: int, pos: int, seq: int, logits: bool) -> None:
        batch = self._batch
        batch.token[row] = token
        batch.pos[row] = pos
        batch.n_seq_id[row] = 1
        batch.seq_id[row][0] = seq
        batch.logits[row] = logits

    def _sampled(self, slot: _Slot) -> None:
        job, sampler = slot.job, slot.sampler
        if job is None or sampler is None or slot.stops is None:
            return
        try:
            token = sampler.sample(self._ctx, slot.row)
        except Exception as failure:
            self._end(slot, "error", f"llama.cpp failed while sampling: {failure}")
            return
        if slot.count == 0:
            slot.first = time.perf_counter()
        slot.count += 1
        s = job.sampling
        if job.cancelled:
            self._end(slot, "cancelled")
            return
        if self._hooks.is_eog(token) and not s.ignore_eos:
            self._end(slot, "stop")
            return
        text = slot.decoder.decode(self._hooks.detokenize([token]))
        piece, stopped = slot.stops.feed(text)
        if piece:
            self._hooks.piece(job, piece)
        if stopped:
            self._end(slot, "stop")
        elif slot.count >= s.max_tokens:
            self._end(slot, "length")
        else:
            slot.next_token = token

    def _end(self, slot: _Slot, reason: str, error: str | None = None) -> None:
        job = slot.job
        if job is None:
            return
        if reason in ("length",) and slot.stops is not None:
            rest = slot.stops.flush()
            if rest:
                self._hooks.piece(job, rest)
        if slot.sampler is not None:
            slot.sampler.close()
        slot.job, slot.sampler, slot.stops, slot.pending, slot.row = None, None, None, [], -1
        # the prompt tokens never evaluated are not in the cache
        done = time.perf_counter()
        counters = {
            "started": slot.started,
            "first": slot.first or done,
            "done": done,
            "count": slot.count,
            "prompt_tokens": len(job.prompt),
            "cached_tokens": slot.cached_tokens,
        }
        self._hooks.ended(job, reason, counters, error)
