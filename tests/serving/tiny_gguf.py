"""Write a tiny llama-architecture GGUF model for tests: a few hundred KB, random weights.

Its vocabulary is printable ASCII (one token per character, SentencePiece-style with `▁` for a
space) plus `\\n`, and no byte-fallback tokens, so every prompt the tests send tokenizes. Its text
is gibberish: tests assert shapes, counts and timings, never words.

    path = write_tiny_gguf(tmp_path / "tiny.gguf")
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

# A chat template in the Jinja dialect GGUF files carry, so chat requests use the model's own.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def vocabulary() -> list[str]:
    """`<unk>`, `<s>`, `</s>`, then `▁`, `\\n` and the printable ASCII characters but space."""
    chars = [chr(c) for c in range(33, 127)]
    return ["<unk>", "<s>", "</s>", "\u2581", "\n", *chars]


def write_tiny_gguf(
    path: Path,
    *,
    dim: int = 64,
    layers: int = 2,
    heads: int = 4,
    ff: int = 128,
    context: int = 512,
    seed: int = 0,
) -> Path:
    """Write the model to `path` and return it; the same arguments give the same file."""
    rng = np.random.default_rng(seed)
    tokens = vocabulary()
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("kairos-tiny")
    writer.add_context_length(context)
    writer.add_embedding_length(dim)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_rope_dimension_count(dim // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)  # all f32
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    writer.add_token_types([*types, *[TokenType.NORMAL] * (len(tokens) - 3)])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    def weight(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    vocab = len(tokens)
    # numpy shapes are (rows, columns) = ggml's ne reversed: a (out, in) matrix per projection
    writer.add_tensor("token_embd.weight", weight(vocab, dim, scale=1.0))
    for i in range(layers):
        block = f"blk.{i}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(dim, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}.{name}.weight", weight(dim, dim))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(dim, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", weight(ff, dim))
        writer.add_tensor(f"{block}.ffn_up.weight", weight(ff, dim))
        writer.add_tensor(f"{block}.ffn_down.weight", weight(dim, ff))
    writer.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
    writer.add_tensor("output.weight", weight(vocab, dim, scale=1.0))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
