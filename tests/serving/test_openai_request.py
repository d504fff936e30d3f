from __future__ import annotations

from typing import Any

import pytest

from kairos.errors import KairosError
from kairos.serving.errors import LLMRequestError
from kairos.serving.openai_request import chat_request, completion_request, tokenize_request


def test_a_completion_body_becomes_sampling_settings() -> None:
    r = completion_request(
        {
            "model": "m",
            "prompt": ["hi"],
            "max_tokens": 5,
            "temperature": 0,
            "stop": "x",
            "seed": 7,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    assert (r.model, r.prompt, r.stream, r.include_usage) == ("m", "hi", True, True)
    s = r.sampling
    assert (s.max_tokens, s.temperature, s.stop, s.seed) == (5, 0.0, ("x",), 7)
    assert r.max_tokens_given and not r.chat


def test_defaults_follow_openai() -> None:
    r = completion_request({"prompt": "hi"})
    assert r.sampling.max_tokens == 16 and not r.max_tokens_given and not r.include_usage
    chat = chat_request(
        {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3}
    )
    assert chat.chat and chat.sampling.max_tokens == 3


def test_text_parts_of_a_message_are_joined() -> None:
    r = chat_request(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ]
        }
    )
    assert r.messages == ({"role": "user", "content": "ab"},)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": 5}, "prompt"),
        ({}, "prompt"),
        ({"prompt": "x", "n": 2}, "n"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": "9"}, "max_tokens"),
        ({"prompt": "x", "temperature": -1}, "temperature"),
        ({"prompt": "x", "top_p": 2}, "top_p"),
        ({"prompt": "x", "stop": [1]}, "stop"),
        ({"prompt": "x", "stream": "yes"}, "stream"),
        ({"prompt": "x", "stream_options": 1}, "stream_options"),
        ({"prompt": "x", "logprobs": 2}, "logprobs"),
        ({"prompt": "x", "echo": True}, "echo"),
    ],
)
def test_bad_completion_fields_are_named(body: dict[str, Any], param: str) -> None:
    with pytest.raises(LLMRequestError) as caught:
        completion_request(body)
    assert caught.value.param == param
    assert isinstance(caught.value, KairosError) and isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "x"}]}, "messages[0]"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 3}]},
            "messages[1].content",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
        ),
        (
            {"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]},
            "tools[0]",
        ),
        ([1, 2], "body"),
    ],
)
def test_bad_chat_fields_are_named(body: Any, param: str) -> None:
    with pytest.raises(LLMRequestError) as caught:
        chat_request(body)
    assert caught.value.param == param


def test_tokenize_takes_a_prompt_or_messages() -> None:
    assert tokenize_request({"prompt": "a", "model": "m"}) == ("m", "a", None)
    _, prompt, messages = tokenize_request({"messages": [{"role": "user", "content": "a"}]})
    assert prompt is None and messages == ({"role": "user", "content": "a"},)
    with pytest.raises(LLMRequestError, match="prompt"):
        tokenize_request({"text": "a"})
