"""What clients send the gateway and get back, in each API's own wire format: OpenAI's chat,
completions and embeddings bodies (openai.py), the Responses API (responses.py), Anthropic's
Messages (messages.py), and the streams a client reads (streams.py). A body is checked here,
before anything is held or sent; each error names the field and the fix.
"""
