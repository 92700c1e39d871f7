"""Helpers for the reload tests: a sidecar serving from a policy file we rewrite, and readers of what is in force."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import httpx

from proxy.testing.procs import Proc, wait_for
from proxy.testing.stack import sidecar

# Fast readiness, no GPU, no shedding: what is left to observe is the listener.
BASE = """
[warmup]
health_interval_s = 0.2
[slow_start]
window_s = 0.0
[gpu]
enabled = false
[shedding]
rules = []
"""


def write_atomically(path: Path, text: str) -> None:
    """As editors and config tools do: a new inode, renamed over the old name."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def served_from(pod: Proc, path: Path) -> Iterator[Proc]:
    with sidecar(pod.url(), policy=str(path)) as proc:
        yield proc


def admin_policy(proc: Proc) -> dict:
    return httpx.get(proc.url("admin") + "/admin/policy", timeout=5).json()


def wait_version(proc: Proc, version: int) -> dict:
    return wait_for(lambda: (doc := admin_policy(proc))["version"] == version and doc, timeout_s=15)


def metric(proc: Proc, line_prefix: str) -> float:
    text = httpx.get(proc.url("admin") + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_prefix))


def h2_settings(proc: Proc) -> dict[int, int]:
    """The SETTINGS a new h2c connection to the data port is told (h2 client, raw socket)."""
    host, _, port = proc.addresses["data"].rpartition(":")
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(conn.data_to_send())
        while True:
            data = sock.recv(65_536)
            assert data, "connection closed before SETTINGS"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RemoteSettingsChanged):
                    return {int(code): s.new_value for code, s in event.changed_settings.items()}
