"""JSON schemas -> llama.cpp grammars (GBNF) that every generated token must follow.

`response_format` ({"type": "json_schema", ...} or {"type": "json_object"}) and tool calls
compile here, with llama-cpp-python's converter (`llama_cpp.llama_grammar.SchemaConverter`)
changed in two ways:

- no free whitespace: its `space` rule (`" "?` between every token) becomes empty, so the
  answer is the compact JSON and a 3-field object finishes in a few dozen tokens;
- a string character is JSON's (no raw control characters, which `json.loads` refuses).

A keyword the grammar cannot enforce (`pattern`, `minimum`, `not`, `if`, `uniqueItems`...)
is refused by name: an answer the grammar allowed would not validate against the schema.

    gbnf = schema_grammar({"type": "object", "properties": {"n": {"type": "integer"}}})
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from typing import Any

from kairos.serving.errors import LLMRequestError

# keywords the converter enforces (or that only annotate)
_ENFORCED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "minLength", "maxLength", "format",
    "$ref", "$defs", "definitions",
})  # fmt: skip
_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "readOnly", "writeOnly", "deprecated", "strict",
})  # fmt: skip
_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4",
                      "uuid5"})  # fmt: skip
_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
# JSON's string character: no quote, backslash or control character; escapes as JSON has them
_CHAR = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})'


def schema_grammar(schema: Any, *, param: str = "response_format.json_schema.schema") -> str:
    """GBNF for `schema` with root rule `root`; LLMRequestError names a keyword it cannot
    enforce. Example: `schema_grammar({"type": "string", "enum": ["a", "b"]})`."""
    return _grammar(check_schema(schema, param), "")


def json_object_grammar() -> str:
    """Any JSON object: `response_format: {"type": "json_object"}`."""
    return _grammar({"type": "object"}, "")


def named_grammar(schema: Mapping[str, Any], name: str) -> str:
    """GBNF whose rules for `schema` start at rule `name` (no `root`): for combining."""
    return _grammar(schema, name)


def check_schema(schema: Any, param: str, *, refs: bool = True) -> dict[str, Any]:
    """`schema` itself once every keyword in it is one the grammar enforces; otherwise a 400
    naming the keyword and where it is."""
    if not isinstance(schema, dict):
        raise LLMRequestError(f"{param} must be a JSON schema object", param=param)
    _walk(schema, param, refs)
    return dict(normalized(schema))


def _walk(schema: Any, where: str, refs: bool) -> None:
    if isinstance(schema, bool):
        if schema:
            return
        raise LLMRequestError(f"{where} is `false` (nothing matches it)", param=where)
    if not isinstance(schema, dict):
        raise LLMRequestError(f"{where} must be a schema object", param=where)
    for key in schema:
        if key in _ANNOTATIONS:
            continue
        if key not in _ENFORCED or (not refs and key in ("$ref", "$defs", "definitions")):
            raise LLMRequestError(
                f"{where}: the JSON schema keyword {key!r} cannot be enforced while "
                f"decoding; remove it (supported: {', '.join(sorted(_ENFORCED))})",
                param=where,
            )
    kinds = schema.get("type")
    for kind in kinds if isinstance(kinds, list) else [kinds]:
        if kind is not None and kind not in _TYPES:
            raise LLMRequestError(f"{where}.type {kind!r} is not a JSON schema type", param=where)
    if "format" in schema and schema["format"] not in _FORMATS:
        raise LLMRequestError(
            f"{where}: the string format {schema['format']!r} cannot be enforced while "
            f"decoding; remove it (supported: {', '.join(sorted(_FORMATS))})",
            param=where,
        )
    ref = schema.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#/")):
        raise LLMRequestError(f"{where}.$ref {ref!r}: only local refs (#/...)", param=where)
    for key in ("properties", "$defs", "definitions"):
        for name, sub in (schema.get(key) or {}).items():
            _walk(sub, f"{where}.{key}.{name}", refs)
    for key in ("anyOf", "prefixItems"):
        for i, sub in enumerate(schema.get(key) or []):
            _walk(sub, f"{where}.{key}[{i}]", refs)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            _walk(schema[key], f"{where}.{key}", refs)


def normalized(schema: Any) -> Any:
    """A `type` list with other keywords becomes an anyOf of one type each (the converter
    would drop the keywords); an object's `required` names only its properties."""
    if isinstance(schema, list):
        return [normalized(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: normalized(v) if k != "enum" and k != "const" else v for k, v in schema.items()}
    kinds = out.get("type")
    if isinstance(kinds, list) and set(out) - {"type"} - _ANNOTATIONS:
        rest = {k: v for k, v in out.items() if k != "type"}
        return {"anyOf": [{**rest, "type": kind} for kind in kinds]}
    return out


def _grammar(schema: Mapping[str, Any], name: str) -> str:
    grammar_module: Any = importlib.import_module("llama_cpp.llama_grammar")
    converter = grammar_module.SchemaConverter(
        prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
    )
    try:
        resolved = converter.resolve_refs(json.loads(json.dumps(schema)), "request")
        converter.visit(resolved, name)
    except (AssertionError, ValueError, KeyError, TypeError, RecursionError) as error:
        raise LLMRequestError(
            f"the JSON schema cannot be turned into a grammar: {error}", param="response_format"
        ) from None
    rules: dict[str, str] = converter._rules
    rules["space"] = '""'
    if "char" in rules:
        rules["char"] = _CHAR
    return "\n".join(f"{rule} ::= {body}" for rule, body in sorted(rules.items()))
