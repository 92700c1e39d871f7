"""Shared fixtures. Tier-specific ones live in each tier's conftest.py."""

from __future__ import annotations

import logging
import os
import shutil
import socket

import pytest
from hypothesis import settings

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# No per-example time limit: Hypothesis's 200 ms deadline is a timed unit test, and fails on a
# loaded 2-core runner (511 ms seen) while the property holds. Speed is checked in bench/.
settings.register_profile("rampmeter", deadline=None)
settings.load_profile("rampmeter")


def require_binary(name: str) -> str:
    """Path of a tool a test needs. Missing: fails in CI (CI=true), skips on a dev box."""
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} is not installed (apt: see .ci/run)"
    if IN_CI:
        pytest.fail(message + "; CI must install it")
    pytest.skip(message + "; outside CI only")  # CI guard above: never skips in CI
    raise AssertionError  # unreachable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """Undo `proxy.logs.configure` (the CLI's, run in-process by some tests) after each test.

    It replaces the root logger's handlers with one on the sys.stderr of the moment: under
    capsys a stream closed when that test ends, so every later log line in the worker went
    to handleError ("--- Logging error ---" and a stack per line) in whichever test came next.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def connect_sending(sockets: list[socket.socket], address: str, count: int, data: bytes) -> None:
    """Open `count` blocking TCP connections to `address` ("host:port"), send `data` on each, and add them
    to `sockets` (the caller closes them in its finally, whatever happens here)."""
    host, port = address.rsplit(":", 1)
    for _ in range(count):
        sock = socket.create_connection((host, int(port)))
        sockets.append(sock)
        sock.sendall(data)
