"""The OpenAPI document of the HTTP server (what `GET /openapi.json` returns)."""

from __future__ import annotations

from typing import Any

from kairos.project.decisions import MAX_PAGE

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "field": {"type": "string"},
            },
        }
    },
}

_FEATURE_LIST = {"type": "array", "items": {"type": "string"}, "minItems": 1}
_COMMON = {
    "outputs": _FEATURE_LIST,
    "now": {"type": "string", "format": "date-time"},
    "staleness": {
        "type": "object",
        "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "number"}]},
    },
    "query_id": {"type": "string", "minLength": 1, "maxLength": 128},
}


def _errors(*statuses: int) -> dict[str, Any]:
    text = {
        400: "Malformed JSON, a bad option or query parameter",
        401: "Missing or wrong bearer token",
        403: "Without server.keys: a Host other than this machine, or another site's page",
        404: "Not found",
        413: "Body too large",
        415: "The body is not of the route's content type (application/json unless stated)",
        422: "Unknown feature, wrong type, or a body that does not fit the schema",
        429: "Too many failed authentications from this client lately (see Retry-After)",
    }
    return {
        str(s): {
            "description": text[s],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        for s in statuses
    }


def _post(summary: str, schema: str, example: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {"$ref": f"#/components/schemas/{schema}"},
                        "example": example,
                    }
                },
            },
            "responses": {
                "200": {
                    "description": "OK",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
                **_errors(400, 401, 413, 415, 422),
            },
        }
    }


def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "kairos", "version": "0.1.0"},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": _ERROR,
                "OnlineQuery": {
                    "type": "object",
                    "required": ["inputs", "outputs"],
                    "additionalProperties": False,
                    "properties": {"inputs": {"type": "object"}, **_COMMON},
                },
                "BulkQuery": {
                    "type": "object",
                    "required": ["inputs", "outputs"],
                    "additionalProperties": False,
                    "properties": {
                        "inputs": {
                            "type": "object",
                            "additionalProperties": {"type": "array"},
                        },
                        **_COMMON,
                    },
                },
                "OfflineQuery": {
                    "type": "object",
                    "required": ["spine", "outputs"],
                    "additionalProperties": False,
                    "properties": {
                        "spine": {"type": "object", "additionalProperties": {"type": "array"}},
                        "outputs": _FEATURE_LIST,
                        "timestamp": {"type": "string"},
                        "recompute": {
                            "oneOf": [
                                {"type": "boolean"},
                                {"type": "array", "items": {"type": "string"}},
                            ]
                        },
                    },
                },
                "PlanQuery": {
                    "type": "object",
                    "required": ["inputs", "outputs"],
                    "properties": {"inputs": _FEATURE_LIST, "outputs": _FEATURE_LIST},
                },
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/query/online": _post(
                "Compute features for one entity",
                "OnlineQuery",
                {"inputs": {"user.id": "u0001"}, "outputs": ["user.risk"]},
            ),
            "/v1/query/bulk": _post(
                "Compute features for many entities in one plan run",
                "BulkQuery",
                {"inputs": {"user.id": ["u0001", "u0002"]}, "outputs": ["user.risk"]},
            ),
            "/v1/query/offline": _post(
                "Compute features for every spine row as of its time",
                "OfflineQuery",
                {
                    "spine": {"user.id": ["u0001"], "ts": ["2026-06-01T12:00:00+00:00"]},
                    "outputs": ["user.txn_count[7d]"],
                },
            ),
            "/v1/query/plan": _post(
                "Explain the plan for inputs and outputs",
                "PlanQuery",
                {"inputs": ["user.id"], "outputs": ["user.risk"]},
            ),
            "/v1/events/{namespace}": {
                "post": {
                    "summary": "Write events of an events=True feature class",
                    "parameters": [
                        {
                            "name": "namespace",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["rows"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "rows": {"type": "array", "items": {"type": "object"}}
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": {
                            "description": "How many rows were written",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        **_errors(400, 401, 404, 413, 415, 422),
                    },
                }
            },
            "/v1/log": {
                "get": {
                    "summary": "Search the logged decisions, newest first",
                    "description": "Every record whose inputs had each entity key, whose "
                    "`now` is in [since, until), whose plan touched `feature` and called "
                    "`model`. since/until are ISO times or durations back from now (`1h`).",
                    "parameters": _search_parameters(),
                    "responses": {
                        "200": {
                            "description": "The records, as GET /v1/log/{query_id} shows each",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "required": ["records"],
                                        "properties": {
                                            "records": {
                                                "type": "array",
                                                "items": {"type": "object"},
                                            }
                                        },
                                    }
                                }
                            },
                        },
                        **_errors(400, 401),
                    },
                }
            },
            "/v1/replay": {
                "post": {
                    "summary": "Re-run logged decisions with another model version",
                    "description": "Decisions by id, or by since/until/entity, re-run as of "
                    "their logged `now` with `models` pinned (a version number or an alias) "
                    "or `recompute`d; every value not downstream of the change is the logged "
                    "one. Answers the summary and the first `rows` rows, changed ones first.",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "query_ids": {"type": "array", "items": {"type": "string"}},
                                        "since": {"type": "string"},
                                        "until": {"type": "string"},
                                        "entity": {"type": "object"},
                                        "limit": {
                                            "type": "integer",
                                            "minimum": 1,
                                            "maximum": MAX_PAGE,
                                        },
                                        "models": {"type": "object"},
                                        "recompute": {"type": "array", "items": {"type": "string"}},
                                        "rows": {"type": "integer", "minimum": 0},
                                    },
                                },
                                "example": {"since": "1d", "models": {"risk": 2}},
                            }
                        },
                    },
                    "responses": {
                        "200": {
                            "description": "The summary and rows (query_id, feature, logged, "
                            "replayed, changed)",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        **_errors(400, 401, 413, 415, 422),
                    },
                }
            },
            "/v1/log/{query_id}": {
                "get": {
                    "summary": "What a logged decision saw",
                    "parameters": [
                        {
                            "name": "query_id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": {
                            "description": "The logged query",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        **_errors(401, 404),
                    },
                }
            },
            "/healthz": {
                "get": {
                    "summary": "Alive",
                    "security": [],
                    "responses": {"200": {"description": "OK"}},
                }
            },
            "/readyz": {
                "get": {
                    "summary": "Sources reachable, the project's LLM deployments serving",
                    "security": [],
                    "responses": {
                        "200": {"description": "Ready"},
                        "503": {
                            "description": "A source is unreachable, or a deployment is "
                            "starting or failed to start"
                        },
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "responses": {"200": {"description": "Metrics"}, **_errors(401)},
                }
            },
            **_model_paths(),
        },
    }


def _search_parameters() -> list[dict[str, Any]]:
    text = {"type": "string"}
    return [
        {
            "name": "entity",
            "in": "query",
            "description": "FEATURE:KEY, e.g. user.id:u1; repeat for more keys",
            "schema": {"type": "array", "items": text},
            "style": "form",
            "explode": True,
        },
        {"name": "since", "in": "query", "description": "ISO time or `1h`", "schema": text},
        {"name": "until", "in": "query", "description": "ISO time or `10m`", "schema": text},
        {"name": "feature", "in": "query", "description": "e.g. user.risk", "schema": text},
        {"name": "model", "in": "query", "description": "risk@v2, or risk", "schema": text},
        {
            "name": "limit",
            "in": "query",
            "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 100},
        },
    ]


def _limit(default: int) -> dict[str, Any]:
    """The `limit` query parameter of a listing."""
    return {
        "name": "limit",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": default},
    }


def _path_params(*names: str) -> list[dict[str, Any]]:
    return [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names
    ]


def _json_ok(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"type": "object"}}},
    }


def _model_paths() -> dict[str, Any]:
    """The model registry and serving routes (server/models_routes.py)."""
    formats = ["onnx", "skops", "xgboost-ubj", "xgboost-json", "lightgbm-text", "catboost-cbm"]
    predict_body = {
        "type": "object",
        "required": ["rows"],
        "properties": {
            "rows": {
                "oneOf": [
                    {"type": "array", "items": {"type": "object"}},
                    {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                ]
            },
            "version": {"type": "integer", "minimum": 1},
            "alias": {"type": "string"},
        },
    }
    return {
        "/v1/models": {
            "get": {
                "summary": "Registered models, their newest version and aliases",
                "description": "The first `limit` models by name; `more` says if there are more.",
                "parameters": [_limit(MAX_PAGE)],
                "responses": {"200": _json_ok("The models"), **_errors(400, 401)},
            }
        },
        "/v1/models/{name}": {
            "get": {
                "summary": "A model's newest `limit` versions and its aliases",
                "parameters": [*_path_params("name"), _limit(MAX_PAGE)],
                "responses": {"200": _json_ok("The versions"), **_errors(400, 401, 404)},
            }
        },
        "/v1/models/{name}/versions": {
            "post": {
                "summary": "Register an artifact in a safe format as the next version",
                "parameters": [
                    *_path_params("name"),
                    {
                        "name": "format",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "string", "enum": formats},
                    },
                    {"name": "aliases", "in": "query", "schema": {"type": "string"}},
                    {"name": "inputs", "in": "query", "schema": {"type": "string"}},
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/octet-stream": {
                            "schema": {"type": "string", "format": "binary"}
                        }
                    },
                },
                "responses": {
                    "201": _json_ok("The new version"),
                    **_errors(401, 413, 415, 422),
                },
            }
        },
        "/v1/models/{name}/versions/{version}": {
            "get": {
                "summary": "One version: schema, sha256, metadata, aliases",
                "parameters": _path_params("name", "version"),
                "responses": {"200": _json_ok("The version"), **_errors(401, 404, 422)},
            }
        },
        "/v1/models/{name}/aliases": {
            "get": {
                "summary": "A model's aliases and its latest `limit` changes, with times",
                "parameters": [*_path_params("name"), _limit(MAX_PAGE)],
                "responses": {"200": _json_ok("Aliases and history"), **_errors(400, 401, 404)},
            }
        },
        "/v1/models/{name}/aliases/{alias}": {
            "put": {
                "summary": "Point an alias at a version",
                "parameters": _path_params("name", "alias"),
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["version"],
                                "properties": {"version": {"type": "integer", "minimum": 1}},
                            },
                            "example": {"version": 2},
                        }
                    },
                },
                "responses": {
                    "200": _json_ok("The change"),
                    **_errors(400, 401, 404, 415, 422),
                },
            }
        },
        "/v1/models/{name}/aliases/{alias}/rollback": {
            "post": {
                "summary": "Point an alias back where it was before its latest move",
                "parameters": _path_params("name", "alias"),
                "requestBody": {  # nothing to say, but a POST declares JSON (a 415 otherwise)
                    "required": True,
                    "content": {"application/json": {"schema": {"type": "object"}, "example": {}}},
                },
                "responses": {"200": _json_ok("The change"), **_errors(401, 404, 415, 422)},
            }
        },
        "/v1/models/{name}/predict": {
            "post": {
                "summary": "Predictions for rows",
                "description": "JSON rows, or an Arrow IPC stream sent with content-type "
                "application/vnd.apache.arrow.stream (version and alias as query parameters; "
                "ask for Arrow back with the same type in Accept).",
                "parameters": _path_params("name"),
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": predict_body,
                            "example": {"rows": [{"amount": 12.5, "count": 3}]},
                        },
                    },
                },
                "responses": {
                    "200": _json_ok("One prediction per row, and the version that made them"),
                    **_errors(400, 401, 404, 413, 415, 422),
                },
            }
        },
    }
