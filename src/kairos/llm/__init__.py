"""LLMs as features: prompts over features, tokenizers and local embeddings.

Modules are imported where they are used; importing this package does no work.
"""
