"""LLMs: prompts as features, tokenizers, and open-weight deployments (llama.cpp, vLLM).

Modules are imported where they are used; importing this package does no work.
"""
