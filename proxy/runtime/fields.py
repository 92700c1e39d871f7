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

_WANTED = {
    wire.REQUEST_ID.encode(): "request_id",
    b"content-type": "content_type",
    wire.IDEMPOTENCY_KEY.encode(): "idempotency_key",
    wire.PRIORITY.encode(): "priority",
    wire.REQUEST_TIMEOUT_MS.encode(): "timeout",
    wire.GRPC_TIMEOUT.encode(): "grpc_timeout",
    wire.COST_HINT.encode(): "cost_hint",
    wire.TENANT.encode(): "tenant",
    b"authorization": "authorization",
}
_FIRST_ONLY = frozenset(("request_id", "content_type", "idempotency_key"))  # header_value's rule: the first


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

    def __init__(self) -> None:
        self.request_id: bytes | None = None
        self.content_type: bytes | None = None
        self.idempotency_key: bytes | None = None
        self.priority: bytes | None = None
        self.timeout: bytes | None = None  # x-request-timeout-ms
        self.grpc_timeout: bytes | None = None
        self.cost_hint: bytes | None = None
        self.tenant: bytes | None = None  # x-tenant
        self.authorization: bytes | None = None
        self.request_id_at = -1  # index of the first x-request-id in the list (-1: none)

    @classmethod
    def read(cls, headers: Headers) -> Fields:
        """One pass over `headers` (lower-case names, as both servers give them)."""
        f = cls()
        wanted = _WANTED
        for i, (name, value) in enumerate(headers):
            if name in wanted:
                attr = wanted[name]
                if attr in _FIRST_ONLY:
                    if getattr(f, attr) is None:
                        setattr(f, attr, value)
                        if attr == "request_id":
                            f.request_id_at = i
                else:
                    setattr(f, attr, value)
        return f

    @property
    def has_budget(self) -> bool:
        """Whether the client sent a budget header (the relay restamps it with what remains)."""
        return self.timeout is not None or self.grpc_timeout is not None

    def __repr__(self) -> str:
        shown = {name: getattr(self, name) for name in self.__slots__ if getattr(self, name) not in (None, -1)}
        return f"<Fields {shown}>"
