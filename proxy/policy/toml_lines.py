"""Where each key of a TOML document is written: full key path -> line, for error messages.

Theory of operation: one pass over the lines, tracking the current table the way
TOML does: `[a.b]` opens table a.b, `[[a.b]]` opens the next element of the array
of tables a.b (so `[[upstreams]]` twice gives `upstreams[0]` and `upstreams[1]`, and a
later `[upstreams.x]` belongs to the last one), and `key = value` / `a.b = value`
under it set keys. Every prefix is recorded at the first line that mentions it, so
`[classes.realtime]` also locates `classes`. Multi-line strings and multi-line arrays
and inline tables are skipped as values: a `x = 1` inside them is not a key of the
table. `locate` answers the longest prefix of a path it knows: an element of an
inline array (`shedding.rules[1]`) is on its key's line, a key that was never
written (a required one) on its table's header.

Not a TOML parser: msgspec decodes the document; this only runs for messages about a
document that decoded.
"""

from __future__ import annotations

import re
from typing import Any

_BARE = r"[A-Za-z0-9_-]+"
_PART = re.compile(rf"\s*(?:\"((?:[^\"\\]|\\.)*)\"|'([^']*)'|({_BARE}))\s*(\.|$)")
_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(
    rf"^\s*((?:(?:{_BARE}|\"(?:[^\"\\]|\\.)*\"|'[^']*')\s*\.\s*)*(?:{_BARE}|\"(?:[^\"\\]|\\.)*\"|'[^']*'))\s*="
)


def split_key(key: str) -> list[str] | None:
    """`a."b.c".d` -> ['a', 'b.c', 'd']; None when it is not a TOML key."""
    parts, pos = [], 0
    while pos < len(key):
        m = _PART.match(key, pos)
        if m is None:
            return None
        parts.append(next(g for g in m.groups()[:3] if g is not None))
        pos = m.end()
        if not m[4]:
            break
    return parts if pos >= len(key.rstrip()) else None


def path_text(parts: list[str]) -> str:
    """['upstreams', 0, 'url'] -> 'upstreams[0].url' (the form error messages use)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = part if re.fullmatch(_BARE, part) else '"' + part.replace('"', '\\"') + '"'
            out += f".{name}" if out else name
    return out


def key_lines(text: str) -> dict[str, int]:
    """Every table and key path written in `text`, with the first line that writes it (1-based)."""
    lines: dict[str, int] = {}
    arrays: dict[str, int] = {}  # array-of-tables path -> index of its last element
    table: list[Any] = []
    depth = 0  # open brackets / braces of a multi-line value
    in_string: str | None = None  # the delimiter of an open multi-line string
    for lineno, line in enumerate(text.splitlines(), 1):
        if in_string is not None or depth > 0:
            depth, in_string = _scan(line, depth, in_string)
            continue
        header = _HEADER.match(line)
        if header:
            parts = split_key(header[2])
            if parts is None:
                continue
            if header[1] == "[[":
                table = [*_resolve(parts[:-1], arrays), parts[-1]]
                name = path_text(table)
                arrays[name] = arrays.get(name, -1) + 1
                table.append(arrays[name])
            else:
                table = _resolve(parts, arrays)
            _record(lines, table, lineno)
            continue
        key = _KEY.match(line)
        if key:
            parts = split_key(key[1])
            if parts is not None:
                _record(lines, [*table, *parts], lineno)
            depth, in_string = _scan(line[key.end() :], 0, None)
    return lines


def locate(text: str, path: str) -> int | None:
    """Line where `path` (`a.b[2].c`) or, failing that, its longest written prefix is; None if nothing is."""
    known = key_lines(text)
    while path:
        if path in known:
            return known[path]
        path = re.sub(r"(\[\d+\]|\.?(\"(?:[^\"\\]|\\.)*\"|[^.\[\]]+))$", "", path)
    return None


def _resolve(parts: list[str], arrays: dict[str, int]) -> list[Any]:
    """A header's key parts, with the current element index after each array of tables they pass."""
    out: list[Any] = []
    for part in parts:
        out.append(part)
        name = path_text(out)
        if name in arrays:
            out.append(arrays[name])
    return out


def _record(lines: dict[str, int], parts: list[Any], lineno: int) -> None:
    for end in range(1, len(parts) + 1):
        lines.setdefault(path_text(parts[:end]), lineno)


def _scan(s: str, depth: int, in_string: str | None) -> tuple[int, str | None]:
    """Bracket depth and open multi-line string after reading `s` (a value, or a line inside one)."""
    i = 0
    while i < len(s):
        if in_string is not None:
            end = s.find(in_string, i)
            if end < 0:
                return depth, in_string
            i, in_string = end + 3, None
            continue
        c = s[i]
        if s.startswith('"""', i) or s.startswith("'''", i):
            in_string, i = s[i : i + 3], i + 3
        elif c == '"':
            m = re.compile(r'"(?:[^"\\]|\\.)*"').match(s, i)
            i = m.end() if m else len(s)
        elif c == "'":
            end = s.find("'", i + 1)
            i = len(s) if end < 0 else end + 1
        elif c == "#":
            break
        else:
            depth += c in "[{"
            depth -= c in "]}"
            i += 1
    return max(depth, 0), in_string
