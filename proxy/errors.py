"""One exception tree for the whole sidecar.

trio, h11 and h2 errors never leak past `proxy/http/`: the wire layer translates
them into these, and the request path translates these into answers per the wire
contract (`proxy/core/wire.py`).
"""

from __future__ import annotations


class RampmeterError(Exception):
    """Base of every error rampmeter raises on purpose."""


class PolicyError(RampmeterError):
    """A policy file or value is invalid; `errors` holds one line per problem."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(f"{source}: " + "; ".join(errors))


class StartupError(RampmeterError):
    """Something the operator asked for cannot start (a port in use, an address not on this host).

    The message is the whole story, one line: `rampmeter serve` prints it and exits 1,
    without a traceback, because nothing in the code is wrong.
    """


class ProtocolError(RampmeterError):
    """A peer broke HTTP (malformed request, bad framing)."""


class BodyTooLarge(ProtocolError):
    """A request or response body passed its configured cap."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"body larger than {limit} bytes")
        self.limit = limit


class RequestTimeout(ProtocolError):
    """The client did not send its request (body) in time: its deadline passed, or it stalled."""


class ClientGone(RampmeterError):
    """The downstream client disconnected or reset its stream."""


class ResponseCut(RampmeterError):
    """A handler ends a response it had started, on purpose (the upstream died mid-stream, the
    deadline passed while streaming): the server aborts the client's stream, which the client
    sees as a truncated response. Expected and already logged where it happened: no traceback."""


class UpstreamError(RampmeterError):
    """Talking to the model server failed."""

    def __init__(self, message: str, *, upstream: str = "", request_sent: bool = False) -> None:
        super().__init__(message)
        self.upstream = upstream
        # True once any byte of the request may have reached the upstream: after
        # that a retry could run the request twice, so the pool never retries.
        self.request_sent = request_sent


class UpstreamConnectError(UpstreamError):
    """Could not open a connection (refused, unreachable, connect timeout)."""


class UpstreamProtocolError(UpstreamError):
    """The upstream closed early, reset the stream or spoke broken HTTP."""


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer within the request's budget."""
