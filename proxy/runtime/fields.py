"""The request header fields the sidecar reads, found in one pass over the headers.

Theory of operation: `Fields.read(headers)` walks the request's header list once (at
the edge, proxy/runtime/edge.py) and keeps the values the path decides by: the
request id, the content type (is it gRPC?), the class, the budget, the cost hint, the
tenant and Authorization, the idempotency key. The edge hands the typed `Fields` to
the request path by name, and each step reads its field instead of scanning the list
again: classify (proxy/runtime/classify.py), the gRPC check (grpc_answers.for_request
only for a gRPC content type), dedup (`identify` only with an idempotency key) and the
relay (the budget is restamped only when the client sent one). Before, five steps
scanned the headers, each a Python loop of a few comparisons per field.

Which occurrence counts is what each reader used when it scanned: the first for the
request id, content type and idempotency key (`header_value`), the last for the
classification fields (classify's loop kept the last). Values are raw bytes; parsing
(and its 400 on a malformed value) stays with the step that owns the field.
"""

from __future__ import annotations

from proxy.core import wire
from proxy.http.messages import Headers

_REQUEST_ID = 0
_CONTENT_TYPE = 1
_IDEMPOTENCY_KEY = 2
_FIRST = 3  # slots below this keep the first occurrence
_PRIORITY = 3
_TIMEOUT = 4
_GRPC_TIMEOUT = 5
_COST_HINT = 6
_TENANT = 7
_AUTHORIZATION = 8
_SLOTS = {
    wire.REQUEST_ID.encode(): _REQUEST_ID,
    b"content-type": _CONTENT_TYPE,
    wire.IDEMPOTENCY_KEY.encode(): _IDEMPOTENCY_KEY,
    wire.PRIORITY.encode(): _PRIORITY,
    wire.REQUEST_TIMEOUT_MS.encode(): _TIMEOUT,
    wire.GRPC_TIMEOUT.encode(): _GRPC_TIMEOUT,
    wire.COST_HINT.encode(): _COST_HINT,
    wire.TENANT.encode(): _TENANT,
    b"authorization": _AUTHORIZATION,
}
_NONE: tuple[None, ...] = (None,) * 9


class Fields:
    """The fields of one request's headers that the request path reads (module doc)."""

    __slots__ = (
        "authorization",
        "content_type",
        "cost_hint",
        "grpc_timeout",
        "idempotency_key",
        "priority",
        "request_id",
        "request_id_at",
        "tenant",
        "timeout",
    )

    def __init__(self, values: tuple[bytes | None, ...] | list[bytes | None] = _NONE, request_id_at: int = -1) -> None:
        (
            self.request_id,
            self.content_type,
            self.idempotency_key,
            self.priority,
            self.timeout,
            self.grpc_timeout,
            self.cost_hint,
            self.tenant,
            self.authorization,
        ) = values
        self.request_id_at = request_id_at  # index of the first x-request-id in the list (-1: none)

    @classmethod
    def read(cls, headers: Headers) -> Fields:
        """One pass over `headers` (lower-case names, as both servers give them)."""
        values: list[bytes | None] | None = None
        rid_at = -1
        slots = _SLOTS
        for i, (name, value) in enumerate(headers):
            slot = slots.get(name)
            if slot is None:
                continue
            if values is None:
                values = [None] * 9
            if slot >= _FIRST:
                values[slot] = value
            elif values[slot] is None:
                values[slot] = value
                if slot == _REQUEST_ID:
                    rid_at = i
        return cls(_NONE if values is None else values, rid_at)

    @property
    def has_budget(self) -> bool:
        """Whether the client sent a budget header (the relay restamps it with what remains)."""
        return self.timeout is not None or self.grpc_timeout is not None

    def __repr__(self) -> str:
        shown = {name: getattr(self, name) for name in self.__slots__ if getattr(self, name) not in (None, -1)}
        return f"<Fields {shown}>"
