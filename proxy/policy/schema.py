"""The policy schema: every knob an SRE can turn, typed, ranged and documented.

Theory of operation: a policy is one frozen msgspec Struct tree. Each field carries
its unit in its name, its default, its range (msgspec.Meta ge/le) and a
description, which `proxy.policy.reference` turns into docs and
`rampmeter policy schema` into JSON Schema. Unknown keys are errors
(forbid_unknown_fields). Checks that span fields live in `proxy.policy.load.check`,
in one place. A reload builds a whole new Policy and swaps it in; nothing mutates
a live one.

Sections owned by later features live in their own modules and are composed here.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta


class Section(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Base for every policy table: strict about keys, immutable once loaded."""


HOST_PORT_RE = r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+|\*):[0-9]{1,5}$"
HTTP_URL_RE = r"^http://[^/?#]+(/.*)?$"
# What a value must look like, in words, for errors about the patterns above.
PATTERN_HINTS = {
    HOST_PORT_RE: "HOST:PORT, e.g. 0.0.0.0:8080 or [::1]:9090",
    HTTP_URL_RE: "http://HOST:PORT[/prefix] (cleartext; the sidecar sits in the pod)",
}

HostPort = Annotated[str, Meta(pattern=HOST_PORT_RE, description="HOST:PORT; [::1]:PORT for IPv6")]


class Listen(Section):
    """The data-path listener: HTTP/1.1 and h2c (prior knowledge) on one port."""

    address: Annotated[HostPort, Meta(description="Where clients connect.")] = "0.0.0.0:8080"
    max_connections: Annotated[
        int, Meta(ge=1, le=1_000_000, description="Open client connections; more are refused at accept.")
    ] = 4096
    max_concurrent_streams: Annotated[
        int, Meta(ge=1, le=65_535, description="HTTP/2 streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS); more are refused with REFUSED_STREAM.")
    ] = 256
    max_header_bytes: Annotated[
        int, Meta(ge=1024, le=1_048_576, description="Request head size in bytes; larger gets 431.")
    ] = 65_536
    max_body_bytes: Annotated[
        int, Meta(ge=0, le=1_073_741_824, description="Request body size in bytes; larger gets 413.")
    ] = 16_777_216
    header_timeout_s: Annotated[
        float, Meta(gt=0, le=3600, description="Time a client has to send a complete request head; slower gets 408.")
    ] = 10.0
    idle_timeout_s: Annotated[
        float, Meta(gt=0, le=86_400, description="Idle keep-alive connections are closed after this long.")
    ] = 75.0
    drain_timeout_s: Annotated[
        float, Meta(ge=0, le=3600, description="On SIGTERM, how long in-flight requests may finish before they are cancelled. Keep below the pod's terminationGracePeriodSeconds.")
    ] = 25.0


class Admin(Section):
    """The admin listener: /healthz, /readyz, /metrics, /admin/stats, /admin/policy."""

    address: Annotated[HostPort, Meta(description="Admin port; keep it off the Service. 0.0.0.0 lets kubelet probes reach it.")] = "127.0.0.1:9090"


class Upstream(Section):
    """One model server the sidecar forwards to."""

    url: Annotated[
        str, Meta(pattern=HTTP_URL_RE, description="Base URL, http://HOST:PORT (cleartext; the sidecar sits in the pod).")
    ]
    protocol: Annotated[
        Literal["http1", "h2c"], Meta(description="http1: pooled keep-alive connections; h2c: HTTP/2 prior knowledge, multiplexed.")
    ] = "http1"
    max_connections: Annotated[
        int, Meta(ge=1, le=100_000, description="HTTP/1.1 connections kept open to this upstream (h2c uses one, or more when streams run out).")
    ] = 1024
    connect_timeout_ms: Annotated[int, Meta(ge=1, le=600_000, description="Connect timeout; failure answers 502 upstream_unavailable.")] = 2000
    idle_timeout_s: Annotated[
        float, Meta(gt=0, le=3600, description="Pooled connections idle this long are closed. Keep it below the upstream's own keep-alive timeout (uvicorn: 5 s).")
    ] = 4.0
    timeout_s: Annotated[
        float, Meta(gt=0, le=86_400, description="Upper bound on one upstream exchange, first byte to last; past it the request is cancelled and answers 504.")
    ] = 600.0
    cooldown_s: Annotated[
        float, Meta(ge=0, le=3600, description="An upstream that refuses connections is set aside this long.")
    ] = 5.0


class Policy(Section):
    """A whole rampmeter policy. Every table and key is optional."""

    listen: Listen = Listen()
    admin: Admin = Admin()
    upstreams: Annotated[
        list[Upstream], Meta(min_length=1, description="Model servers; requests go to the one with the fewest outstanding.")
    ] = msgspec.field(default_factory=lambda: [Upstream(url="http://127.0.0.1:8000")])
