"""One slot's sampling state: llama.cpp's sampler chain and, when asked, a grammar.

Each request gets its own chain (seed, temperature, top-p, penalties) so requests decoded in
one batch never share a generator. A grammar is checked the way llama.cpp's `common_sampler`
does it: sample without the grammar, test that one token against it, and only when it is
refused apply the grammar to the whole vocabulary (262k tokens for Gemma: the costly path)
and sample again. Most tokens of a JSON answer pass the one-token test.

    sampler = SlotSampler(llama_cpp, vocab, n_vocab, sampling, seed=7)
    token = sampler.sample(ctx, batch_index)     # accepted into the chain and the grammar
    sampler.close()
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from kairos.serving.errors import LLMRequestError

_PENALTY_LAST_N = 64  # llama-cpp-python's Llama.generate default, kept for the same answers
_CANDIDATE = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)


class SlotSampler:
    """A sampler chain for one request; `grammar` (GBNF text) constrains every token."""

    def __init__(
        self,
        lib: Any,
        vocab: Any,
        n_vocab: int,
        *,
        temperature: float,
        top_p: float,
        top_k: int,
        min_p: float,
        repeat_penalty: float,
        frequency_penalty: float,
        presence_penalty: float,
        seed: int,
        grammar: str | None,
    ) -> None:
        self._lib = lib
        self._n_vocab = n_vocab
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        self._chain = chain
        self._grammar: Any = None
        add = lib.llama_sampler_chain_add
        if (repeat_penalty, frequency_penalty, presence_penalty) != (1.0, 0.0, 0.0):
            add(chain, lib.llama_sampler_init_penalties(
                _PENALTY_LAST_N, repeat_penalty, frequency_penalty, presence_penalty))  # fmt: skip
        if temperature <= 0:
            add(chain, lib.llama_sampler_init_greedy())
        else:
            if top_k > 0:
                add(chain, lib.llama_sampler_init_top_k(top_k))
            if top_p < 1.0:
                add(chain, lib.llama_sampler_init_top_p(top_p, 1))
            if min_p > 0.0:
                add(chain, lib.llama_sampler_init_min_p(min_p, 1))
            add(chain, lib.llama_sampler_init_temp(temperature))
            add(chain, lib.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        if grammar is not None:
            self._grammar = lib.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
            if not self._grammar:
                self.close()
                raise LLMRequestError(
                    "the grammar built for this request does not parse in llama.cpp; "
                    "simplify the schema",
                    param="response_format",
                )
            self._candidates = np.zeros(n_vocab, dtype=_CANDIDATE)
            self._candidates["id"] = np.arange(n_vocab, dtype=np.intc)
            self._array = lib.llama_token_data_array(
                data=self._candidates.ctypes.data_as(lib.llama_token_data_p),
                size=n_vocab,
                selected=-1,
                sorted=False,
            )
            self._one = lib.llama_token_data()
            self._one_array = lib.llama_token_data_array(
                data=ctypes.pointer(self._one), size=1, selected=-1, sorted=False
            )

    def sample(self, ctx: Any, index: int) -> int:
        """The next token from the logits of batch row `index`, accepted into the state."""
        lib = self._lib
        if self._grammar is None:
            return int(lib.llama_sampler_sample(self._chain, ctx, index))
        logits = np.ctypeslib.as_array(lib.llama_get_logits_ith(ctx, index), (self._n_vocab,))
        token = self._apply(self._chain, logits)
        self._one.id, self._one.logit, self._one.p = token, 1.0, 0.0
        self._one_array.size, self._one_array.selected = 1, -1
        lib.llama_sampler_apply(self._grammar, ctypes.byref(self._one_array))
        if math.isinf(self._one.logit):  # the grammar refuses it: sample from what it allows
            token = self._apply(self._grammar, logits, then=self._chain)
        lib.llama_sampler_accept(self._grammar, token)
        lib.llama_sampler_accept(self._chain, token)
        return token

    def _apply(self, first: Any, logits: np.ndarray[Any, Any], then: Any = None) -> int:
        lib, array = self._lib, self._array
        self._candidates["id"] = np.arange(self._n_vocab, dtype=np.intc)
        self._candidates["logit"] = logits
        self._candidates["p"] = 0.0
        array.data = self._candidates.ctypes.data_as(lib.llama_token_data_p)
        array.size, array.selected, array.sorted = self._n_vocab, -1, False
        lib.llama_sampler_apply(first, ctypes.byref(array))
        if then is not None:
            lib.llama_sampler_apply(then, ctypes.byref(array))
        return int(array.data[array.selected].id)

    def close(self) -> None:
        if self._chain is not None:
            self._lib.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar is not None:
            self._lib.llama_sampler_free(self._grammar)
            self._grammar = None
