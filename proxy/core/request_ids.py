"""Request ids: the caller's `x-request-id` when it is safe to log and forward, else one made here.

Theory of operation: an id names one request everywhere it leaves a trace: the
response headers, the rejection body, the access log line, the span and the
request sent upstream. The caller's own id is kept when it is 1-128 characters of
a small, quoting-free alphabet (letters, digits and `-_.:/+=@`, enough for UUIDs,
ULIDs, base64 and Envoy's ids), so it can be written into JSON and logfmt with no
escaping and cannot forge a log line; anything else is replaced, not refused: a
request is never answered 400 for the id it was traced by. A made id is 32
lower-case hex digits (128 random bits, drawn by the caller: no randomness here).

Pure: no I/O, no clock, no randomness of its own.
"""

from __future__ import annotations

MAX_LEN = 128
_ALLOWED = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/+=@")


def accept(value: bytes | None) -> bytes | None:
    """`value` if it may serve as the request's id as it is, else None (make one)."""
    if value is None or not 0 < len(value) <= MAX_LEN:
        return None
    return value if _ALLOWED.issuperset(value) else None


def make(bits: int) -> bytes:
    """A request id from 128 random bits: 32 lower-case hex digits."""
    return b"%032x" % (bits & ((1 << 128) - 1))
