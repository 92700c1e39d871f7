"""The policy schema: every knob an SRE can turn, typed, ranged and documented.

Theory of operation: a policy is one frozen msgspec Struct tree. Each field carries
its unit in its name, its default, its range (msgspec.Meta ge/le) and a
description, which `proxy.policy.reference` turns into docs and
`rampmeter policy schema` into JSON Schema. Unknown keys are errors
(forbid_unknown_fields). Checks that span fields are registered with `proxy.policy.base.cross_check`
and run together in `proxy.policy.load`. A reload builds a whole new Policy and swaps it in; nothing mutates
a live one.

Sections owned by later features live in their own modules and are composed here.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from proxy.policy import access_log as _access_log
from proxy.policy import admission as _admission
from proxy.policy import batching as _batching
from proxy.policy import dedup as _dedup
from proxy.policy import shedding as _shedding
from proxy.policy import warmup as _warmup
from proxy.policy.base import Section, cross_check

# Ports as the OS takes them: 0-65535 (0: any free port, for listeners), without leading zeros.
_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}|0)"
_HOST = r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+)"
HOST_PORT_RE = rf"^({_HOST[1:-1]}|\*):{_PORT}$"
HTTP_URL_RE = rf"^http://{_HOST}(:{_PORT.removesuffix('|0)') + ')'})?(/.*)?$"  # port 0 cannot be dialled
PATH_PREFIX_RE = r"^/[^\s?#]*$"
# What a value must look like, in words, for errors about the patterns above.
PATTERN_HINTS = {
    HOST_PORT_RE: "HOST:PORT, e.g. 0.0.0.0:8080 or [::1]:9090 (port 0-65535)",
    HTTP_URL_RE: "http://HOST:PORT[/prefix] (cleartext; the sidecar sits in the pod; port 1-65535)",
    PATH_PREFIX_RE: "a path prefix starting with /, e.g. /v1/ (no spaces, query or fragment)",
    _dedup.REDIS_URL_RE: "redis://[:PASSWORD@]HOST[:PORT][/DB] or rediss://... (one Redis server)",
}

HostPort = Annotated[str, Meta(pattern=HOST_PORT_RE, description="HOST:PORT; [::1]:PORT for IPv6")]


class Listen(Section, frozen=True):
    """The data-path listener: HTTP/1.1 and h2c (prior knowledge) on one port."""

    address: Annotated[HostPort, Meta(description="Where clients connect.")] = "0.0.0.0:8080"
    max_connections: Annotated[
        int,
        Meta(
            ge=1,
            le=1_000_000,
            description="Open client connections. At the limit a newcomer is still served: the connection that has been silent longest (a stalled head or body, the longest-idle keep-alive one) is closed to make room; only when all are busy with requests is the newcomer refused. Capped at start to what the open-file limit allows after the upstream connections and the admin port.",
        ),
    ] = 4096
    max_concurrent_streams: Annotated[
        int,
        Meta(
            ge=1,
            le=65_535,
            description="HTTP/2 streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS); more are refused with REFUSED_STREAM.",
        ),
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
    body_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            le=3600,
            description="Longest wait for the next bytes of a request body (and for its first) while the sidecar is reading it; past it HTTP/1.1 gets 408 and the connection closes (as nginx's client_body_timeout), HTTP/2 gets RST_STREAM CANCEL. The request's own deadline (x-request-timeout-ms, grpc-timeout) also applies while its body is read.",
        ),
    ] = 30.0
    idle_timeout_s: Annotated[
        float, Meta(gt=0, le=86_400, description="Idle keep-alive connections are closed after this long.")
    ] = 75.0
    drain_timeout_s: Annotated[
        float,
        Meta(
            ge=0,
            le=3600,
            description="On SIGTERM, how long in-flight requests may finish before they are cancelled. Keep below the pod's terminationGracePeriodSeconds.",
        ),
    ] = 25.0
    served_paths: Annotated[
        list[Annotated[str, Meta(pattern=PATH_PREFIX_RE, max_length=256)]],
        Meta(
            max_length=64,
            description='Path prefixes the data port serves, e.g. ["/v1/"]; any other path gets 404 from the sidecar and never reaches the model server (its /metrics, /docs, admin routes). Empty: every path is forwarded.',
        ),
    ] = msgspec.field(default_factory=list)
    # --- bounds on what one client can make the sidecar hold or do (docs/security.md) ---
    send_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            le=3600,
            description="HTTP/1.1: a response write that makes no progress for this long (the client takes no bytes) ends the connection, as nginx's send_timeout; the request's deadline also bounds it. It covers the sidecar's own answers too (400, 404, OPTIONS *), which have no deadline. HTTP/2: h2_send_timeout_s.",
        ),
    ] = 30.0
    h2_send_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            le=3600,
            description="HTTP/2: a client that takes no response bytes for this long has the stream reset (RST_STREAM CANCEL) when it holds back its flow-control window, or the connection closed when it stops reading the socket.",
        ),
    ] = 30.0
    h2_connection_window_bytes: Annotated[
        int,
        Meta(
            ge=65_535,
            le=2_147_483_647,
            description="HTTP/2 receive window per connection: the most request-body bytes one connection can have buffered and not yet read.",
        ),
    ] = 1_048_576
    h2_body_bytes_per_connection: Annotated[
        int,
        Meta(
            ge=65_536,
            le=68_719_476_736,
            description="HTTP/2 request-body bytes one connection's open requests may hold in all (each request up to max_body_bytes); a stream that would pass it is refused (REFUSED_STREAM: safe to retry). At least max_body_bytes.",
        ),
    ] = 33_554_432
    h2_send_buffer_bytes: Annotated[
        int,
        Meta(
            ge=65_536,
            le=1_073_741_824,
            description="HTTP/2 response bytes one connection may hold for a client that is not reading them. Within it, a finished upstream response releases its admission slot at once; beyond it, responses wait for the client.",
        ),
    ] = 1_048_576
    h2_control_frame_burst: Annotated[
        int,
        Meta(
            ge=10,
            le=1_000_000_000,
            description="HTTP/2 control frames (PING, SETTINGS, WINDOW_UPDATE, RST_STREAM, PRIORITY, empty DATA, CONTINUATION) a connection may send beyond what its requests earn (100 per stream, 10 per DATA frame sent); past it: GOAWAY ENHANCE_YOUR_CALM.",
        ),
    ] = 1000
    h2_control_frames_per_s: Annotated[
        float,
        Meta(
            ge=0,
            le=1_000_000_000,
            description="HTTP/2 control frames a connection earns per second, on top of its work.",
        ),
    ] = 100.0
    h2_reset_burst: Annotated[
        int,
        Meta(
            ge=1,
            le=1_000_000_000,
            description="HTTP/2 streams a client may reset before their response ends (rapid reset, CVE-2023-44487) at once; past it and h2_resets_per_s: GOAWAY ENHANCE_YOUR_CALM.",
        ),
    ] = 200
    h2_resets_per_s: Annotated[
        float,
        Meta(ge=0, le=1_000_000_000, description="HTTP/2 early stream resets a connection earns per second."),
    ] = 33.0


@cross_check
def check_listen(policy: Policy) -> list[str]:
    listen = policy.listen
    if listen.h2_body_bytes_per_connection < listen.max_body_bytes:
        return [
            f"listen.h2_body_bytes_per_connection: must be at least listen.max_body_bytes ({listen.max_body_bytes}), "
            f"got {listen.h2_body_bytes_per_connection}"
        ]
    return []


class Admin(Section, frozen=True):
    """The admin listener: /healthz, /readyz, /metrics, /admin/stats, /admin/policy."""

    address: Annotated[
        HostPort, Meta(description="Admin port; keep it off the Service. 0.0.0.0 lets kubelet probes reach it.")
    ] = "127.0.0.1:9090"


class Upstream(Section, frozen=True):
    """One model server the sidecar forwards to."""

    url: Annotated[
        str,
        Meta(pattern=HTTP_URL_RE, description="Base URL, http://HOST:PORT (cleartext; the sidecar sits in the pod)."),
    ]
    protocol: Annotated[
        Literal["http1", "h2c"],
        Meta(description="http1: pooled keep-alive connections; h2c: HTTP/2 prior knowledge, multiplexed."),
    ] = "http1"
    max_connections: Annotated[
        int,
        Meta(
            ge=1,
            le=100_000,
            description="HTTP/1.1 connections kept open to this upstream (h2c uses one, or more when streams run out).",
        ),
    ] = 1024
    connect_timeout_ms: Annotated[
        int, Meta(ge=1, le=600_000, description="Connect timeout; failure answers 502 upstream_unavailable.")
    ] = 2000
    idle_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            le=3600,
            description="Pooled connections idle this long are closed. Keep it below the upstream's own keep-alive timeout (uvicorn: 5 s).",
        ),
    ] = 4.0
    timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            le=86_400,
            description="Upper bound on one upstream exchange, first byte to last; past it the request is cancelled and answers 504.",
        ),
    ] = 600.0
    cooldown_s: Annotated[
        float, Meta(ge=0, le=3600, description="An upstream that refuses connections is set aside this long.")
    ] = 5.0
    metrics_url: Annotated[
        str,
        Meta(
            pattern=r"^(http://[^/?#]+(/.*)?)?$",
            description="Where this server's own Prometheus gauges are, when not at the upstream URL + gpu.upstream_metrics_path (Triton: http://HOST:8002/metrics). Empty: that path.",
        ),
    ] = ""
    stops_on_cancel: Annotated[
        bool | Literal["auto"],
        Meta(
            description="Whether the server stops working on a request when the sidecar disconnects (vLLM: true; llama.cpp non-streaming, LitServe, PyTriton, MLServer, most embeddings servers: false). false: a request cut at its deadline keeps its admission slot (a phantom lease) for its expected remaining service time, since the server is still computing it. auto: assume false until the engine's own gauges (gpu.upstream_metrics_path) show cut requests gone.",
        ),
    ] = "auto"


class Policy(Section, frozen=True):
    """A whole rampmeter policy. Every table and key is optional."""

    listen: Listen = Listen()
    admin: Admin = Admin()
    upstreams: Annotated[
        list[Upstream],
        Meta(min_length=1, description="Model servers; requests go to the one with the fewest outstanding."),
    ] = msgspec.field(default_factory=lambda: [Upstream(url="http://127.0.0.1:8000")])
    # Cold start: warm-up, readiness, slow start, GPU signals (proxy/policy/warmup.py).
    # Feature tables get lazy default factories, so no feature class is needed at import time.
    warmup: _warmup.Warmup = msgspec.field(default_factory=lambda: _warmup.Warmup())
    readiness: _warmup.Readiness = msgspec.field(default_factory=lambda: _warmup.Readiness())
    slow_start: _warmup.SlowStart = msgspec.field(default_factory=lambda: _warmup.SlowStart())
    gpu: _warmup.Gpu = msgspec.field(default_factory=lambda: _warmup.Gpu())
    # Load shedding, tenant quotas, latency windows (proxy/policy/shedding.py); lazy, as above.
    shedding: _shedding.Shedding = msgspec.field(default_factory=lambda: _shedding.Shedding())
    tenants: _shedding.Tenants = msgspec.field(default_factory=lambda: _shedding.Tenants())
    latency: _shedding.Latency = msgspec.field(default_factory=lambda: _shedding.Latency())
    # Admission: queue order, classes, cost routes, concurrency limits (proxy/policy/admission.py); lazy, as above.
    scheduling: _admission.Scheduling = msgspec.field(default_factory=lambda: _admission.Scheduling())
    classes: Annotated[
        dict[_admission.ClassName, _admission.ClassPolicy],
        Meta(
            min_length=1,
            max_length=16,
            description="Request classes by x-priority value; written, they replace the defaults (realtime, interactive, batch) as a whole.",
        ),
    ] = msgspec.field(default_factory=lambda: _admission.default_classes())
    routes: Annotated[
        list[_admission.Route],
        Meta(
            max_length=256,
            description="Cost model per path prefix (longest wins; unmatched paths cost one token); written, they replace the defaults.",
        ),
    ] = msgspec.field(default_factory=lambda: _admission.default_routes())
    limits: _admission.Limits = msgspec.field(default_factory=lambda: _admission.Limits())
    # Idempotent dedup (proxy/policy/dedup.py); lazy, as above.
    dedup: _dedup.Dedup = msgspec.field(default_factory=lambda: _dedup.Dedup())
    # Dynamic micro-batching of embeddings / rerank / KServe v2 calls (proxy/policy/batching.py); lazy, as above.
    batching: _batching.Batching = msgspec.field(default_factory=lambda: _batching.Batching())
    # One line per request (proxy/policy/access_log.py); lazy, as above.
    access_log: _access_log.AccessLog = msgspec.field(default_factory=lambda: _access_log.AccessLog())
