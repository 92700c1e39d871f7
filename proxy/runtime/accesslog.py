"""The access log: one structured line per request on the `rampmeter.access` logger.

Theory of operation: `Edge` (proxy/runtime/edge.py) asks `wants(status)` when a
request ends and calls `write()` only if so, so a request that gets no line costs
one comparison and, for sampled successes, one random draw: nothing is formatted,
hashed or allocated for it. What gets a line (`[access_log]`): nothing when off
(the default); every answer with status 400 and up (rejections, upstream errors, cut
responses, 499 for a client gone) while on; answers below 400 at `sample_rate`. And
at most `max_lines_per_s` (a token bucket, one second's burst): a client sending bad
requests as fast as it can must not fill the log nor spend the sidecar's CPU on it
(the rule of every client-caused line, proxy/http/ratelog.py); what is dropped is
counted and said in one warning before the next line written.

Fields, in this order (docs/operations.md "Finding one request"):

    request_id peer method path protocol class tenant cost queue_ms service_ms
    total_ms status reason upstream bytes_in bytes_out idempotency trace_id

`tenant` is a 12-hex-digit hash of the tenant key (x-tenant where the policy trusts
it, else Authorization: proxy/core/token_bucket.tenant_key), never the key itself;
`cost` the estimated cost units admission charged; `total_ms` from the parsed head
to the end of the answer; `-` for what does not apply (a rejection's service_ms).

`--log-format text` (the default) writes the fields as logfmt in the message
(`request_id=... status=200 ...`), values quoted only when they need it;
`json` writes them as fields of the JSON object (proxy/logs.py) with the message
`METHOD PATH STATUS`, so log shippers index them without parsing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random

from proxy.core import wire
from proxy.core.token_bucket import ANONYMOUS, tenant_key

log = logging.getLogger("rampmeter.access")

MAX_PATH_CHARS = 256  # the target is the client's: bounded in the line
_TENANT = wire.TENANT.encode()
_AUTHORIZATION = b"authorization"
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/+@%,;~!*()[]&?#$'")


class AccessLog:
    """Decides which requests get a line and writes it (module doc)."""

    def __init__(
        self, policy, *, json_format: bool = False, rng: random.Random | None = None, upstream_name=str, tenants=None
    ) -> None:
        self.policy = policy  # [access_log]; swapped on reload
        self.json_format = json_format
        self._random = (rng or random.Random()).random
        self._upstream_name = upstream_name  # upstream index -> its metrics label (the address)
        self._trust_x_tenant = tenants.trust_x_tenant if tenants is not None else False
        self.written = 0
        self.suppressed = 0  # dropped over max_lines_per_s, in all
        self._unsaid = 0  # dropped since the last warning about it
        self._tokens = policy.max_lines_per_s
        self._tokens_at: float | None = None

    def configure(self, policy, tenants=None) -> None:
        self.policy = policy
        if tenants is not None:
            self._trust_x_tenant = tenants.trust_x_tenant

    def wants(self, status: int, reason: str = "") -> bool:
        policy = self.policy
        if not policy.enabled or not log.isEnabledFor(logging.INFO):
            return False
        if status >= 400 or reason:  # a failure (a response cut after a 200 head has reason "cut")
            return True
        rate = policy.sample_rate
        return rate >= 1.0 or (rate > 0.0 and self._random() < rate)

    def write(self, ex, now: float, error: BaseException | None = None) -> None:
        if not self._budget(now):
            return
        self.written += 1
        # The record is made here, not by log.info: no caller lookup (the line's origin is always this).
        if self.json_format:
            fields = self.fields(ex, now)
            args = (fields["method"], fields["path"], ex.status)
            record = log.makeRecord(log.name, logging.INFO, __file__, 0, "%s %s %d", args, None, extra=fields)
        else:
            record = log.makeRecord(log.name, logging.INFO, __file__, 0, self.text(ex, now), (), None)
        log.handle(record)

    def _budget(self, now: float) -> bool:
        """A token for one line (max_lines_per_s, one second's burst); a warning first for lines dropped."""
        rate = self.policy.max_lines_per_s
        if rate <= 0.0:
            return True
        if self._tokens_at is not None:
            self._tokens = min(rate, self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        if self._tokens < 1.0:
            self.suppressed += 1
            self._unsaid += 1
            return False
        self._tokens -= 1.0
        if self._unsaid:
            log.warning("%d access lines dropped over access_log.max_lines_per_s (%g)", self._unsaid, rate)
            self._unsaid = 0
        return True

    def text(self, ex, now: float) -> str:
        """The fields as logfmt, in order (module doc); what a client or upstream controls is quoted if need be."""
        request = ex.request
        ticket = ex.ticket
        upstream = ex.upstream
        return (
            f"request_id={ex.request_id.decode('ascii')} peer={_q(request.client)}"
            f" method={_q(request.method.decode('latin-1'))} path={_q(request.path[:MAX_PATH_CHARS].decode('latin-1'))}"
            f" protocol=HTTP/{request.http_version} class={request.klass or '-'} tenant={self._tenant(request) or '-'}"
            f" cost={'-' if ticket is None else ticket.cost.units} queue_ms={_n(ex.queue_ms)}"
            f" service_ms={_n(ex.service_ms)} total_ms={_n((now - ex.started) * 1000.0)}"
            f" status={ex.status} reason={_q(ex.reason)}"
            f" upstream={'-' if upstream is None else _q(self._upstream_name(upstream))}"
            f" bytes_in={_bytes_in(request.body)} bytes_out={ex.bytes_out} idempotency={ex.idempotency or '-'}"
            f" trace_id={'-' if ex.span is None else ex.span.trace_id}"
        )

    def fields(self, ex, now: float) -> dict:
        """The line's fields (module doc); None where a field does not apply."""
        request = ex.request
        ticket = ex.ticket
        return {
            "request_id": ex.request_id.decode("ascii"),
            "peer": request.client or None,
            "method": request.method.decode("latin-1"),
            "path": request.path[:MAX_PATH_CHARS].decode("latin-1"),
            "protocol": f"HTTP/{request.http_version}",
            "class": request.klass or None,
            "tenant": self._tenant(request),
            "cost": ticket.cost.units if ticket is not None else None,
            "queue_ms": _ms(ex.queue_ms),
            "service_ms": _ms(ex.service_ms),
            "total_ms": _ms((now - ex.started) * 1000.0),
            "status": ex.status,
            "reason": ex.reason or None,
            "upstream": self._upstream_name(ex.upstream) if ex.upstream is not None else None,
            "bytes_in": _bytes_in(request.body),
            "bytes_out": ex.bytes_out,
            "idempotency": ex.idempotency or None,
            "trace_id": ex.span.trace_id if ex.span is not None else None,
        }

    def _tenant(self, request) -> str | None:
        key = tenant_key(request.header(_TENANT), request.header(_AUTHORIZATION), trust_x_tenant=self._trust_x_tenant)
        return None if key == ANONYMOUS else hashlib.blake2b(key, digest_size=6).hexdigest()


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _q(text: str) -> str:
    if not text:
        return "-"
    return text if _SAFE.issuperset(text) else json.dumps(text)


def _bytes_in(body) -> int | None:
    received = getattr(body, "received", None)  # what the server read (proxy/http/exchange.BufferedBody)
    return body.content_length if received is None else received
