"""Prints the client's answer types (sandfork/types.py) as JSON, for types.test.ts to compare
with the OpenAPI document: per TypedDict its fields, each required or not, nullable or not, and
its kind (string, integer, number, boolean, array with items, object with fields, enum values).
"""

import json
import sys
import types
import typing
from typing import Any

import sandfork.types as api

NONE = type(None)
SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


def describe(hint: Any) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    arguments = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in arguments if a is not NONE]
        described = describe(rest[0]) if len(rest) == 1 else {"kind": "union"}
        return {**described, "nullable": NONE in arguments}
    if origin is typing.Literal:
        return {"kind": "string", "enum": sorted(arguments), "nullable": False}
    if origin is list:
        return {"kind": "array", "items": describe(arguments[0]), "nullable": False}
    if typing.is_typeddict(hint):
        hints = typing.get_type_hints(hint)
        fields = {
            name: {"required": name in hint.__required_keys__, **describe(field)}
            for name, field in hints.items()
        }
        return {"kind": "object", "fields": fields, "nullable": False}
    if hint in SCALARS:
        return {"kind": SCALARS[hint], "nullable": False}
    raise TypeError(f"no description for {hint!r}")


json.dump({name: describe(getattr(api, name)) for name in sys.argv[1:]}, sys.stdout)
