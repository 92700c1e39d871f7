"""Load and validate a policy: TOML text in, a whole `Policy` or a `PolicyError` out.

Theory of operation: msgspec decodes and checks types, ranges and unknown keys
against `schema.Policy`; its message names the key path (`$.listen.max_connections`),
which we turn into `listen.max_connections`, look up in the text for a line number,
and for unknown keys list the keys that are allowed. Checks that span several
fields are registered with `proxy.policy.base.cross_check` and run together after decoding, so
every rule about how fields relate lives in one place.

A policy *file* that sets nothing (empty, whitespace, or comments only) is refused
(`parse_policy_file`, used at start, by `rampmeter policy check` and by the live
reloader): applied, it would reset every tuned setting to its default, and that is
what a truncated write or an editor's non-atomic save (truncate, then write) shows
the reloader in between. Comments-only counts too: a truncated copy of a commented
file such as policies/default.toml is just its header comment. Running on the
defaults stays one step away: no --policy, or a file with an empty table (`[listen]`).
`parse_policy("")` (text, not a file) still means the defaults, for tests and callers
that build policies from strings.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import msgspec

from proxy.errors import PolicyError
from proxy.policy.base import CROSS_CHECKS
from proxy.policy.schema import PATTERN_HINTS, Policy

EMPTY_FILE = (
    "the file sets nothing (empty, whitespace or comments only); refused, because applying it would reset "
    "every setting to its default (a truncated write or a non-atomic editor save looks like this). "
    "To run on the defaults, omit --policy or write an empty table such as [listen]"
)


def load_policy(path: str | Path) -> Policy:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(str(path), [f"cannot read: {exc.strerror or exc}"]) from None
    return parse_policy_file(text, source=str(path))


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Policy text -> Policy; "" is the defaults (a file gets `parse_policy_file`)."""
    return policy_from_builtins(_decode(text, source), source, text)


def parse_policy_file(text: str, source: str) -> Policy:
    """A policy file's text -> Policy; a file that sets nothing is an error (see module doc)."""
    data = _decode(text, source)
    if not data:
        raise PolicyError(source, [f"{source}: {EMPTY_FILE}"])
    return policy_from_builtins(data, source, text)


def _decode(text: str, source: str) -> dict:
    try:
        return msgspec.toml.decode(text.encode("utf-8"))
    except msgspec.DecodeError as exc:
        raise PolicyError(source, [f"not valid TOML: {_toml_message(exc)}"]) from None


def policy_from_builtins(data: dict, source: str, text: str = "") -> Policy:
    """Validate plain data (decoded TOML, or defaults with command-line overrides)."""
    try:
        policy = msgspec.convert(data, type=Policy)
    except msgspec.ValidationError as exc:
        raise PolicyError(source, [_explain(str(exc), text, source)]) from None
    problems = [msg for check in CROSS_CHECKS for msg in check(policy)]
    if problems:
        raise PolicyError(source, problems)
    return policy


def _toml_message(exc: msgspec.DecodeError) -> str:
    cause = exc.__cause__ or exc.__context__
    return str(cause or exc)


_AT = re.compile(r"^(?P<msg>.*) - at `\$(?P<path>[^`]*)`$")
_REGEX = re.compile(r"Expected `str` matching regex '(?P<pattern>.*)'$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]+)`$")


def _explain(raw: str, text: str, source: str) -> str:
    m = _AT.match(raw)
    path, msg = (m["path"].lstrip("."), m["msg"]) if m else ("", raw)
    msg = _REGEX.sub(_pattern_hint, msg)
    unknown = _UNKNOWN.match(msg)
    if unknown:
        key = unknown["key"]
        full = f"{path}.{key}" if path else key
        allowed = ", ".join(_allowed_keys(path))
        msg = f"unknown key (allowed here: {allowed})"
        path = full
    if msg.startswith("Invalid enum value"):
        choices = _literal_choices(path)
        if choices:
            msg += f" (expected one of: {', '.join(choices)})"
    line = locate(text, path)
    where = f"{source}:{line}: " if line else ""
    return f"{where}{path or '(top level)'}: {msg}"


def _pattern_hint(match: re.Match) -> str:
    pattern = match["pattern"].replace("\\\\", "\\")  # msgspec escapes backslashes in messages
    return "expected " + PATTERN_HINTS.get(pattern, f"a value matching {pattern}")


def _allowed_keys(path: str) -> list[str]:
    """Field names of the table at `path` (e.g. 'upstreams[0]')."""
    struct = _struct_at(path)
    return [f.name for f in msgspec.structs.fields(struct)] if struct else []


def _struct_at(path: str) -> type | None:
    """The Struct type of the table at `path` ('' is the top level)."""
    typ: type | None = Policy
    for part in filter(None, re.split(r"\.|\[\d+\]", path)):
        hints = {f.name: f.type for f in msgspec.structs.fields(typ)}
        typ = _struct_of(hints.get(part))
        if typ is None:
            return None
    return typ


def _literal_choices(path: str) -> list[str]:
    """The allowed values of a Literal-typed key at `path`, for error messages."""
    table, _, key = path.rpartition(".")
    struct = _struct_at(table)
    if struct is None:
        return []
    hints = {f.name: f.type for f in msgspec.structs.fields(struct)}
    return [repr(v) for v in _literals(hints.get(key))]


def _literals(t) -> list:
    if typing.get_origin(t) is typing.Literal:
        return list(typing.get_args(t))
    return [v for arg in typing.get_args(t) for v in _literals(arg)]


def _struct_of(t) -> type | None:
    """The Struct type inside Annotated[...], list[...] or a union, if any."""
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        return t
    for arg in typing.get_args(t):
        found = _struct_of(arg)
        if found:
            return found
    return None


def locate(text: str, path: str) -> int | None:
    """1-based line in TOML `text` where `path` (a.b[2].c) is set, or None.

    Good enough for error messages: tables, arrays of tables and `key =` lines;
    inline tables and dotted keys fall back to the table's header line.
    """
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    if not parts:
        return None
    *table, key = parts
    table_name = ".".join(p for p in table if not p.startswith("["))
    index = next((int(p[1:-1]) for p in table if p.startswith("[")), 0)
    current, seen, header_line = "", {}, None
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        header = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?", stripped)
        if header:
            current = header[1]
            seen[current] = seen.get(current, -1) + 1
            if current == table_name and seen[current] == index:
                header_line = lineno
            continue
        if current == table_name and seen.get(current, 0) == index and re.match(rf"^{re.escape(key)}\s*=", stripped):
            return lineno
    # The key may itself be a table ([listen.foo]), or not be written at all.
    return _header_line(text, f"{table_name}.{key}" if table_name else key) or header_line


def _header_line(text: str, name: str) -> int | None:
    for lineno, line in enumerate(text.splitlines(), 1):
        if re.match(rf"^\[\[?\s*{re.escape(name)}\s*\]\]?", line.strip()):
            return lineno
    return None
