"""The OpenAPI 3.1 document of ``/api/v1``, derived from the operation table and its msgspec types.

Nothing here is written by hand per endpoint: paths, parameters, bodies and answers come from
:data:`chalie.brain.operations.OPERATIONS`; schemas from :func:`msgspec.json.schema_components`.
"""

from __future__ import annotations

import functools
from typing import Any, Final

import msgspec

import chalie
from chalie.brain import api
from chalie.brain.operations import OPERATIONS, PREFIX, Operation

REF: Final = "#/components/schemas/{name}"
# Every refusal an endpoint can give, besides its own answer.
REFUSALS: Final = {
    "400": "The request does not match its schema (the message says where)",
    "401": "No valid bearer token",
    "403": "The token is not the owner's, or the Origin is foreign",
    "404": "No such thing",
    "405": "This path does not take this method (Allow lists those it takes)",
    "409": "It exists already, or is not in a state that allows this",
    "413": "The body is larger than the server takes",
    "421": "The Host header is not this server's",
    "503": "The part of the daemon that answers this is restarting",
}


def _fields(schema: dict[str, Any], components: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """A Struct's properties and required names, following its $ref."""
    ref = schema.get("$ref", "")
    target = components[ref.rsplit("/", 1)[-1]] if ref else schema
    return dict(target.get("properties", {})), set(target.get("required", []))


@functools.cache
def document() -> dict[str, Any]:
    types: list[Any] = [api.ApiError]
    for o in OPERATIONS:
        types.append(o.args)
        if o.path_args is not None:
            types.append(o.path_args)
        types.append(o.result)
    schemas, components = msgspec.json.schema_components(types, ref_template=REF)
    it = iter(schemas)
    next(it)
    paths: dict[str, Any] = {}
    for o in OPERATIONS:
        args_schema = next(it)
        path_schema = next(it) if o.path_args is not None else None
        result_schema = next(it)
        paths.setdefault(o.openapi_path, {})[o.method.lower()] = _operation(
            o, args_schema, path_schema, result_schema, components
        )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Chalie REST API",
            "version": chalie.__version__,
            "description": "The owner's API: the same operations as the Brain dashboard.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _operation(
    o: Operation,
    args_schema: dict[str, Any],
    path_schema: dict[str, Any] | None,
    result_schema: dict[str, Any],
    components: dict[str, Any],
) -> dict[str, Any]:
    params: list[dict[str, Any]] = []
    if path_schema is not None:
        props, _ = _fields(path_schema, components)
        for name in o.params:
            params.append({"name": name, "in": "path", "required": True, "schema": props[name]})
    entry: dict[str, Any] = {"operationId": o.name, "summary": o.summary, "tags": [o.page]}
    props, required = _fields(args_schema, components)
    if not o.changes:
        for name, schema in props.items():
            params.append(
                {"name": name, "in": "query", "required": name in required, "schema": schema}
            )
    elif props:
        entry["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": args_schema}},
        }
    if params:
        entry["parameters"] = params
    error = {"application/json": {"schema": {"$ref": REF.format(name="ApiError")}}}
    if o.download:
        ok = {
            "application/x-ndjson": {"schema": {"type": "string"}},
            "text/csv": {"schema": {"type": "string"}},
        }
    else:
        ok = {"application/json": {"schema": result_schema}}
    entry["responses"] = {
        "200": {"description": o.summary, "content": ok},
        **{code: {"description": why, "content": error} for code, why in REFUSALS.items()},
    }
    return entry


def operation_url(o: Operation) -> str:
    return PREFIX + o.path
