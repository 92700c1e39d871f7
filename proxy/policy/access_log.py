"""The `[access_log]` table: one structured line per request (proxy/runtime/accesslog.py)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from proxy.policy.base import Section


class AccessLog(Section, frozen=True):
    """One line per request on the `rampmeter.access` logger, as text or JSON (`--log-format`): docs/operations.md."""

    enabled: Annotated[
        bool,
        Meta(
            description="Write access lines at all (off by default, as in Envoy: a line per request is CPU and log volume the operator opts into). Off: no line is built, not even for rejections."
        ),
    ] = False
    sample_rate: Annotated[
        float,
        Meta(
            ge=0.0,
            le=1.0,
            description="Fraction of answered requests with status below 400 that get a line (1.0: all; 0.01: one in a hundred, at random). Rejections, errors, cut responses and clients gone (status 400 and up, 499) always get one while enabled. Lower it where the sidecar serves thousands of requests a second: a line costs CPU (docs/operations.md).",
        ),
    ] = 1.0
    max_lines_per_s: Annotated[
        float,
        Meta(
            ge=0.0,
            le=1_000_000.0,
            description="Most access lines written per second, a burst of one second's worth; past it lines are dropped and counted, and the next line written is preceded by a warning saying how many (a client sending bad requests cannot fill the log or spend the sidecar's CPU on it). 0: no bound.",
        ),
    ] = 1000.0
