"""Why a policy does not validate: every problem, with its full key path and what is allowed.

Theory of operation: msgspec stops at the first problem and names a dict entry
`classes[...]`, which loses the class name an operator wrote. So once a conversion
fails, `problems` walks the data and the schema type together, converting each part
on its own: a table converts key by key (unknown keys are problems, with a "did
you mean" from difflib), an array item by item, a map entry by entry (its key
against the key type, its value against the value type); a part that fails whole
while each of its parts converts is a problem of that part itself (a required key
missing, a rule relating two keys of the table in `__post_init__`). Each problem
keeps the path as written (`classes.realtime.max_queue_length`, `shedding.rules[1]`)
and says what is allowed, in the words the reference uses (`integer, >= 0, <=
1000000`, the list of enum values, the address form), so every problem in a file
is reported at once, like check-jsonschema and taplo do, but with the names and
lines of the TOML rather than JSON pointers.

Only the error path runs this; a valid policy converts once, whole.
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import msgspec.inspect as mi

from proxy.policy.reference import type_name, value_range
from proxy.policy.schema import PATTERN_HINTS
from proxy.policy.toml_lines import path_text


@dataclass(frozen=True)
class Problem:
    parts: tuple[Any, ...]  # key path: names and list indices
    message: str  # what is wrong, and what is allowed
    line_parts: tuple[Any, ...] | None = None  # a key to point at instead of `parts` (a rule naming its first key)

    @property
    def path(self) -> str:
        return path_text(list(self.parts))


def problems(data: object, typ: type) -> list[Problem]:
    """Every problem in `data` as `typ`, in document order; [] when it converts."""
    return list(_walk(data, typ, ()))


def _walk(value: object, typ: Any, parts: tuple[Any, ...]) -> Iterator[Problem]:
    try:
        msgspec.convert(value, type=typ)
        return
    except msgspec.ValidationError as exc:
        raw = _strip_location(str(exc))
    inner = _unwrap(typ)
    struct = _struct_of(inner)
    if struct is not None and isinstance(value, dict):
        yield from _walk_table(value, struct, parts, raw)
    elif _origin(inner) is list and isinstance(value, list):
        yield from _walk_items(value, typing.get_args(inner)[0], parts, raw, typ)
    elif _origin(inner) is dict and isinstance(value, dict):
        key_type, value_type = typing.get_args(inner)
        yield from _walk_map(value, key_type, value_type, parts, raw, typ)
    else:
        yield Problem(parts, leaf_message(raw, typ, value))


def _walk_table(value: dict[str, Any], struct: type, parts: tuple[Any, ...], raw: str) -> Iterator[Problem]:
    fields = {f.name: f for f in msgspec.structs.fields(struct)}
    found: list[Problem] = []
    for key, sub in value.items():
        if key in fields:
            found += _walk(sub, fields[key].type, (*parts, key))
        else:
            found.append(Problem((*parts, key), unknown_key_message(key, list(fields))))
    if found:
        yield from found
        return
    missing = re.match(r"Object missing required field `(?P<key>[^`]+)`", raw)
    if missing and missing["key"] in fields:
        key = missing["key"]
        yield Problem((*parts, key), f"required key missing (allowed: {describe(fields[key].type)})", parts)
        return
    # A rule relating keys of this table (`__post_init__`): point at the first key it names.
    first = re.match(r"\w+", raw)
    named = (*parts, first[0]) if first and first[0] in fields and first[0] in value else None
    yield Problem(parts, raw, named)


def _walk_items(value: list[Any], item_type: Any, parts: tuple[Any, ...], raw: str, typ: Any) -> Iterator[Problem]:
    found = [p for i, item in enumerate(value) for p in _walk(item, item_type, (*parts, i))]
    yield from found or [Problem(parts, leaf_message(raw, typ, value))]


def _walk_map(
    value: dict[str, Any], key_type: Any, value_type: Any, parts: tuple[Any, ...], raw: str, typ: Any
) -> Iterator[Problem]:
    found: list[Problem] = []
    for key, sub in value.items():
        try:
            msgspec.convert(key, type=key_type)
        except msgspec.ValidationError:
            found.append(
                Problem((*parts, key), f"{json.dumps(key)} is not allowed as a name here: {describe(key_type)}")
            )
            continue
        found += _walk(sub, value_type, (*parts, key))
    yield from found or [Problem(parts, leaf_message(raw, typ, value))]


# --- messages ----------------------------------------------------------------------


def unknown_key_message(key: str, allowed: list[str]) -> str:
    message = f"unknown key (allowed here: {', '.join(allowed)})"
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    return message + (f"; did you mean {close[0]}?" if close else "")


def leaf_message(raw: str, typ: Any, value: object) -> str:
    """msgspec's words for one value, with the value written and what the key allows."""
    regex = re.match(r"Expected `str` matching regex '(?P<pattern>.*)'$", raw)
    if regex:
        pattern = regex["pattern"].replace("\\\\", "\\")  # msgspec escapes backslashes in messages
        return f"expected {PATTERN_HINTS.get(pattern, f'a value matching {pattern}')}, got {_shown(value)}"
    if raw.startswith("Invalid enum value"):
        choices = _literals(_unwrap(typ))
        return raw + (f" (expected one of: {', '.join(repr(c) for c in choices)})" if choices else "")
    got = "" if ", got " in raw else f", got {_shown(value)}"
    return f"{raw}{got} (allowed: {describe(typ)})"


def describe(typ: Any) -> str:
    """What a key of type `typ` allows, as the reference and policies/default.toml say it."""
    info = mi.type_info(typ)
    base = info
    while isinstance(base, mi.Metadata):
        base = base.type
    if isinstance(base, mi.StructType):
        return "a table"
    pattern = getattr(base, "pattern", None)
    if pattern:
        return PATTERN_HINTS.get(pattern) or f"{_description(info) or 'a string'} (matching {pattern})"
    rng = value_range(info)
    return type_name(info) + (f", {rng}" if rng else "")


def _description(info: mi.Type) -> str:
    while isinstance(info, mi.Metadata):
        text = (info.extra_json_schema or {}).get("description")
        if text:
            return str(text).rstrip(".")
        info = info.type
    return ""


def _shown(value: object) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return json.dumps(value, default=str)


def _strip_location(raw: str) -> str:
    return re.sub(r" - at `[^`]*`( in `[^`]*`)?$", "", raw)


# --- types ---------------------------------------------------------------------------


def _unwrap(t: Any) -> Any:
    while typing.get_origin(t) is typing.Annotated:
        t = typing.get_args(t)[0]
    return t


def _origin(t: Any) -> Any:
    return typing.get_origin(t)


def _struct_of(t: Any) -> type | None:
    """The Struct type of `t`, or of the one Struct in a union (`X | None`)."""
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        return t
    if _origin(t) in (typing.Union, types.UnionType):
        found = [a for a in typing.get_args(t) if isinstance(a, type) and issubclass(a, msgspec.Struct)]
        return found[0] if len(found) == 1 else None
    return None


def _literals(t: Any) -> list[Any]:
    if _origin(t) is typing.Literal:
        return list(typing.get_args(t))
    return [v for arg in typing.get_args(t) for v in _literals(_unwrap(arg))]
