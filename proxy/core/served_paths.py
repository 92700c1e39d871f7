"""Which request paths the data port serves: an optional allowlist of path prefixes.

Theory of operation: by default (`listen.served_paths = []`) every path on the data
port goes to the model server, as it always did: the model's own `/metrics`,
`/docs` or admin routes included. With prefixes set (e.g. `["/v1/"]`), a path is
served only if it starts with one of them; anything else is answered 404 by the
sidecar, before its body is read and without reaching admission or the model.

A prefix check on the raw path is not enough: the model server may normalise
`/v1/../metrics` or `/v1/%2e%2e/metrics` to `/metrics` after we let it through. So
a served path must also be plain: no `.` or `..` segment and no encoded `/` or `\\`
once percent-escapes are decoded, and no backslash. A client that needs such a path
gets 404; nothing real is lost (no OpenAI-style route has one).

Pure; `ServedPaths` is built once per policy and asked once per request.
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

_DOTS = frozenset({b".", b".."})


class ServedPaths:
    """`allows(path)`: the request path (no query string) may go to the model server."""

    __slots__ = ("prefixes",)

    def __init__(self, prefixes: list[str] | tuple[str, ...]) -> None:
        self.prefixes = tuple(p.encode() for p in prefixes)

    @property
    def enabled(self) -> bool:
        return bool(self.prefixes)

    def allows(self, path: bytes) -> bool:
        if not self.prefixes:
            return True
        return path.startswith(self.prefixes) and plain(path)

    def __repr__(self) -> str:
        return f"<ServedPaths {[p.decode() for p in self.prefixes] or 'all'}>"


def plain(path: bytes) -> bool:
    """No dot segment and no encoded separator: what we check is what the model server routes."""
    if b"\\" in path:
        return False
    if b"%" in path:
        lowered = path.lower()
        if b"%2f" in lowered or b"%5c" in lowered:
            return False  # an encoded / or \: a separator the model server may decode
        path = unquote_to_bytes(path)
    return not any(segment in _DOTS for segment in path.split(b"/"))
