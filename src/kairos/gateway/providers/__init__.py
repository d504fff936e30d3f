"""The upstreams behind the gateway: one Protocol (base.py), the OpenAI API and every server
that speaks it (openai_compatible.py), Anthropic's Messages API (anthropic.py, with the
Responses API over chat in responses_chat.py); which deployment serves a call (router.py,
breaker.py), and the credentials kept out of what leaves (scrub.py).
"""
