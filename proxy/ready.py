"""The readiness line: how a long-running rampmeter command says it is serving, and where.

Every long-running command (`rampmeter serve`, `sim-pod`) prints exactly one line to
stdout once all of its listeners are bound:

    rampmeter-ready {"data": "127.0.0.1:41234", "admin": "127.0.0.1:41235"}

so a caller can ask for port 0 and learn the real ports without racing
(proxy/testing/procs.py waits for it; so can a supervisor).
"""

from __future__ import annotations

import json

READY_PREFIX = "rampmeter-ready "


def ready_line(addresses: dict[str, str]) -> str:
    """The line a server prints when it is ready (see module doc)."""
    return READY_PREFIX + json.dumps(addresses, sort_keys=True)


def print_ready(addresses: dict[str, str]) -> None:
    print(ready_line(addresses), flush=True)
