"""The OpenAPI 3.1 document of the reference server (served at /openapi.json; fuzz tests read
it to generate requests)."""

from __future__ import annotations

from typing import Any

_ERROR = {
    "description": "OpenAI-style error",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}
_ERRORS = {"400": _ERROR, "401": _ERROR, "403": _ERROR, "429": _ERROR, "503": _ERROR}


def _post(summary: str, schema: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}
                },
            },
            "responses": {
                "200": {"description": "JSON, or text/event-stream when stream is true"},
                **_ERRORS,
            },
        }
    }


OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "fairbench reference scheduler", "version": "1"},
    "paths": {
        "/v1/completions": _post("Text completion (SSE when stream is true)", "Completion"),
        "/v1/chat/completions": _post("Chat completion (SSE when stream is true)", "Chat"),
        "/v1/embeddings": _post("Embedding of one input", "Embedding"),
        "/v1/models": {
            "get": {
                "summary": "The served model",
                "responses": {"200": {"description": "model list"}},
            }
        },
        "/health": {"get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}},
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {"200": {"description": "text exposition format"}},
            }
        },
    },
    "components": {
        "schemas": {
            "StreamOptions": {
                "type": "object",
                "properties": {"include_usage": {"type": "boolean"}},
            },
            "Completion": {
                "type": "object",
                "required": ["prompt"],
                "properties": {
                    "model": {"type": "string"},
                    "prompt": {"type": "string"},
                    "max_tokens": {"type": "integer", "minimum": 1},
                    "stream": {"type": "boolean"},
                    "stream_options": {"$ref": "#/components/schemas/StreamOptions"},
                    "ignore_eos": {"type": "boolean"},
                    "cache_salt": {"type": "string", "minLength": 1},
                },
            },
            "Chat": {
                "type": "object",
                "required": ["messages"],
                "properties": {
                    "model": {"type": "string"},
                    "messages": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["role"],
                            "properties": {
                                "role": {"type": "string"},
                                "content": {"type": "string"},
                            },
                        },
                    },
                    "max_tokens": {"type": "integer", "minimum": 1},
                    "stream": {"type": "boolean"},
                    "stream_options": {"$ref": "#/components/schemas/StreamOptions"},
                    "ignore_eos": {"type": "boolean"},
                    "cache_salt": {"type": "string", "minLength": 1},
                },
            },
            "Embedding": {
                "type": "object",
                "required": ["input"],
                "properties": {"model": {"type": "string"}, "input": {"type": "string"}},
            },
            "Error": {
                "type": "object",
                "required": ["error"],
                "properties": {
                    "error": {
                        "type": "object",
                        "required": ["message", "type"],
                        "properties": {
                            "message": {"type": "string"},
                            "type": {"type": "string"},
                            "param": {"type": ["string", "null"]},
                            "code": {"type": ["string", "null"]},
                        },
                    }
                },
            },
        }
    },
}
