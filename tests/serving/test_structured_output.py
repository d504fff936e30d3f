"""response_format on the real Gemma 3 270M: the grammar makes every answer parse and validate."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest

from kairos.serving.structured import schema_grammar

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "zip": {"type": ["string", "null"], "maxLength": 6},
            },
            "required": ["city"],
        },
        "nickname": {"type": "string", "maxLength": 10},
    },
    "required": ["name", "age", "role", "tags", "address"],
}
ASK = [{"role": "user", "content": "Describe one user of our system as JSON."}]


def chat(url: str, **body: Any) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json={"messages": ASK, **body}, timeout=120)


@pytest.mark.slow
def test_twenty_sampled_answers_all_validate(gemma_worker: str) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                   "strict": True}}  # fmt: skip
    for seed in range(20):
        r = chat(gemma_worker, response_format=fmt, max_tokens=120, temperature=1.0, seed=seed)
        assert r.status_code == 200, r.text
        [choice] = r.json()["choices"]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)


@pytest.mark.slow
def test_a_three_field_object_is_compact_and_short(gemma_worker: str) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"},
              "c": {"enum": ["x", "y"]}}, "required": ["a", "b", "c"]}  # fmt: skip
    fmt = {"type": "json_schema", "json_schema": {"name": "abc", "schema": schema}}
    r = chat(gemma_worker, response_format=fmt, max_tokens=80, temperature=0.7, seed=1).json()
    text = r["choices"][0]["message"]["content"]
    assert r["choices"][0]["finish_reason"] == "stop" and " " not in text and "\n" not in text
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.slow
def test_json_object_parses_on_chat_and_completions(gemma_worker: str) -> None:
    fmt = {"type": "json_object"}
    repeat = [{"role": "user", "content": 'Repeat this JSON: {"city":"Paris","zip":"75001"}'}]
    r = httpx.post(
        gemma_worker + "/v1/chat/completions",
        timeout=120,
        json={"messages": repeat, "response_format": fmt, "max_tokens": 200, "temperature": 0},
    ).json()
    assert r["choices"][0]["finish_reason"] == "stop", r
    assert isinstance(json.loads(r["choices"][0]["message"]["content"]), dict)
    prompt = 'Repeat {"city":"Paris","country":"France"} exactly:'
    body = {"prompt": prompt, "max_tokens": 200, "temperature": 0,
            "response_format": fmt}  # fmt: skip
    done = httpx.post(gemma_worker + "/v1/completions", json=body, timeout=120).json()
    assert done["choices"][0]["finish_reason"] == "stop", done
    assert isinstance(json.loads(done["choices"][0]["text"]), dict)


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "string", "pattern": "^a+$"}, "pattern"),
        ({"type": "object", "patternProperties": {"^x": {"type": "string"}}}, "patternProperties"),
        ({"type": "integer", "minimum": 3}, "minimum"),
        ({"not": {"type": "string"}}, "not"),
        ({"if": {"type": "string"}, "then": {"maxLength": 3}}, "if"),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
        ({"type": "object", "properties": {"e": {"type": "string", "format": "email"}}}, "email"),
        ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "oneOf"),
    ],
)
def test_a_keyword_the_grammar_cannot_enforce_is_a_400_naming_it(
    gemma_worker: str, schema: dict[str, Any], keyword: str
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    r = chat(gemma_worker, response_format=fmt, max_tokens=8)
    assert r.status_code == 400
    error = r.json()["error"]
    assert repr(keyword) in error["message"] and error["param"].startswith("response_format")


def test_the_grammar_has_no_free_whitespace() -> None:
    gbnf = schema_grammar(PERSON)
    assert 'space ::= ""' in gbnf and '" "?' not in gbnf
