"""Policy documentation generated from the schema, so docs cannot drift from code.

Theory of operation: walk `msgspec.inspect.type_info(Policy)`; every table
becomes a section, every key a row with its type, default, range and
description. Two renderings share the walk:

- `markdown()`: docs/policy-reference.md (`make policy-docs`)
- `default_toml()`: policies/default.toml, every key present and commented with
  its unit, default and range (`python -m proxy.policy.reference --toml`)

and `schema_json()` writes policies/policy.schema.json, the file the `#:schema`
directive of every shipped policy points editors at (`--schema`). `make policy-docs`
writes all three; a test regenerates them and compares them with the committed files.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import msgspec.inspect as mi

from proxy.policy.schema import Policy


@dataclass(frozen=True)
class Key:
    name: str
    type: str
    default: object  # msgspec.NODEFAULT when required
    range: str
    description: str


@dataclass(frozen=True)
class Table:
    path: str  # "listen", "upstreams" (array of tables), "classes.<name>" (map of tables)
    array: bool
    doc: str
    keys: list[Key]


def tables() -> list[Table]:
    info = mi.type_info(Policy)
    assert isinstance(info, mi.StructType)
    return list(_walk(info, "", False, Policy.__doc__ or ""))


def _walk(info: mi.StructType, path: str, array: bool, doc: str) -> Iterator[Table]:
    keys, children = [], []
    for f in info.fields:
        struct, kind = _struct_in(f.type)
        if struct is not None:
            child_path = f"{path}.{f.name}" if path else f.name
            if kind == "dict":
                child_path += ".<name>"
            children.append((struct, child_path, kind == "list", _describe(f.type) or struct.cls.__doc__ or ""))
        else:
            keys.append(Key(f.name, type_name(f.type), _default(f), value_range(f.type), _describe(f.type)))
    if path:
        yield Table(path, array, " ".join((doc or "").split()), keys)
    for struct, child_path, child_array, child_doc in children:
        yield from _walk(struct, child_path, child_array, child_doc)


def _unwrap(t: mi.Type) -> mi.Type:
    while isinstance(t, mi.Metadata):
        t = t.type
    return t


def _struct_in(t: mi.Type) -> tuple[mi.StructType | None, str]:
    t = _unwrap(t)
    if isinstance(t, mi.StructType):
        return t, "struct"
    if isinstance(t, mi.ListType) and isinstance(item := _unwrap(t.item_type), mi.StructType):
        return item, "list"
    if isinstance(t, mi.DictType) and isinstance(value := _unwrap(t.value_type), mi.StructType):
        return value, "dict"
    return None, ""


def _describe(t: mi.Type) -> str:
    texts = []
    while isinstance(t, mi.Metadata):
        text = (t.extra_json_schema or {}).get("description")
        if text:
            texts.append(text)
        t = t.type
    return texts[0] if texts else ""


def type_name(t: mi.Type) -> str:
    t = _unwrap(t)
    names = {mi.IntType: "integer", mi.FloatType: "number", mi.StrType: "string", mi.BoolType: "boolean"}
    if type(t) in names:
        return names[type(t)]
    if isinstance(t, mi.LiteralType):
        return " | ".join(json.dumps(v) for v in t.values)
    if isinstance(t, mi.ListType):
        return f"list of {type_name(t.item_type)}"
    if isinstance(t, mi.DictType):
        return f"table of {type_name(t.value_type)}"
    if isinstance(t, mi.UnionType):
        return " | ".join(type_name(x) for x in t.types)
    if isinstance(t, mi.NoneType):
        return "none"
    return type(t).__name__.removesuffix("Type").lower()


def value_range(t: mi.Type) -> str:
    t = _unwrap(t)
    parts = []
    for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        value = getattr(t, attr, None)
        if value is not None:
            parts.append(f"{sym} {value:g}" if isinstance(value, float) else f"{sym} {value}")
    min_length = getattr(t, "min_length", None)
    if min_length:
        parts.append(f"at least {min_length} item(s)")
    return ", ".join(parts)


def _default(f: mi.Field) -> object:
    if f.default is not msgspec.NODEFAULT:
        return msgspec.to_builtins(f.default)
    if f.default_factory is not msgspec.NODEFAULT:
        return msgspec.to_builtins(f.default_factory())
    return msgspec.NODEFAULT


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


# Where the schema file ships, relative to the repository root and to policies/*.toml.
SCHEMA_FILE = "policies/policy.schema.json"
SCHEMA_DIRECTIVE = "#:schema ./policy.schema.json"

EDITOR_SETUP = """\
## Editor set-up

The policy's JSON Schema ships as `policies/policy.schema.json` (regenerated by `make policy-docs`;
`rampmeter policy schema` prints the same). Every shipped policy starts with the directive

```toml
#:schema ./policy.schema.json
```

which [taplo](https://taplo.tamasfe.dev) and the editors built on it read: VS Code's *Even Better
TOML* extension, Zed, Helix and Neovim (`taplo lsp`). With it, the editor completes keys, shows each
key's description, and underlines unknown keys, wrong types and out-of-range values as you type. In a
copy kept elsewhere, point the directive at the file (`#:schema ../rampmeter/policies/policy.schema.json`)
or at a URL that serves it. On the command line, `taplo check FILE` validates against the directive,
and `check-jsonschema --schemafile policies/policy.schema.json FILE` works too. Neither runs the rules
that relate keys to each other (`limits.min_limit` against `limits.max_limit`, class names used in
`[scheduling]`): `rampmeter policy check FILE` runs everything, names the line, the full key path and
what is allowed, and warns about the surprise below.
"""

# Said loudly where the table is documented, and warned about by `rampmeter policy check`.
TABLE_NOTES = {
    "classes.<name>": (
        "> **Written classes replace the defaults as a whole.** A policy with only `[classes.realtime]` has "
        "one class: interactive and batch are gone, requests naming them in `x-priority` are served as "
        "`scheduling.default_class`, and keys not written in `[classes.realtime]` take the column defaults "
        "below, not the default realtime class's values. Write every class you want; "
        "`policies/default.toml` has the three defaults to copy. Replacing (not merging) is deliberate: "
        "a policy that defines its own classes (`policies/batch-offline.toml`: offline, backfill) must not "
        "silently gain realtime, interactive and batch, whose priorities would interleave with its own. "
        "`rampmeter policy check` warns when a file writes some default class names but not all."
    ),
}


def markdown() -> str:
    out = [
        "# Policy reference",
        "",
        "Generated from `proxy/policy/schema.py` by `make policy-docs`; do not edit by hand.",
        "Every key is optional unless marked required. Unknown keys are errors.",
        "Check a file with `rampmeter policy check FILE`; editors use `policies/policy.schema.json` (below).",
        "",
        EDITOR_SETUP,
    ]
    for table in tables():
        header = f"[[{table.path}]]" if table.array else f"[{table.path}]"
        out += [f"## `{header}`", "", table.doc, ""]
        if table.path in TABLE_NOTES:
            out += [TABLE_NOTES[table.path], ""]
        out += ["| key | type | default | range | meaning |", "|---|---|---|---|---|"]
        for k in table.keys:
            default = "required" if k.default is msgspec.NODEFAULT else f"`{_toml_value(k.default)}`"
            cells = [f"`{k.name}`", k.type, default, k.range, k.description]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)


def schema_json() -> str:
    """policies/policy.schema.json: what `rampmeter policy schema` prints."""
    from proxy.policy.cli import json_schema

    return json.dumps(json_schema(), indent=2) + "\n"


def default_toml() -> str:
    out = [
        SCHEMA_DIRECTIVE,
        "# rampmeter policy: the embedded defaults, every key written out and commented.",
        "# Generated from the schema (python -m proxy.policy.reference --toml); edit a copy.",
        "# Reference: docs/policy-reference.md. Check: rampmeter policy check FILE.",
        "",
    ]
    defaults = msgspec.to_builtins(Policy())
    for table in tables():
        for header, row in _instances(defaults, table):
            out.append(f"# {table.doc}")
            out.append(header)
            for k in table.keys:
                note = f"{k.type}" + (f", {k.range}" if k.range else "")
                out.append(f"# {k.description} ({note})")
                if k.name in row:
                    out.append(f"{k.name} = {_toml_value(row[k.name])}")
            out.append("")
    return "\n".join(out)


def _instances(defaults: dict[str, Any], table: Table) -> Iterator[tuple[str, dict[str, Any]]]:
    """(header, values) for each default instance of `table`: one, one per array item or map key."""
    prefix, _, _ = table.path.partition(".<name>")
    value = _lookup(defaults, prefix)
    if table.path.endswith(".<name>"):
        for name, row in (value or {}).items():
            yield f"[{prefix}.{name}]", row
    elif table.array:
        for row in value or []:
            yield f"[[{table.path}]]", row
    elif isinstance(value, dict):
        yield f"[{table.path}]", value


def _lookup(data: dict[str, Any], path: str) -> Any:
    found: Any = data
    for part in path.split("."):
        found = found.get(part) if isinstance(found, dict) else None
    return found


if __name__ == "__main__":
    sys.stdout.write(
        default_toml() if "--toml" in sys.argv else schema_json() if "--schema" in sys.argv else markdown()
    )
