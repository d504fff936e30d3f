"""The LLM serving runtime: llama.cpp workers, vLLM, supervised deployment groups."""
