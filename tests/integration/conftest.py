"""Fixtures for the integration tier: real processes on loopback.

`redis_server`: a real redis-server on a free 127.0.0.1 port, without
persistence, that a test may `kill()` and `start()` again (same port) to show
what happens while the store is away. A missing redis-server fails in CI and
skips elsewhere (tests.conftest.require_binary).
"""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from tests.conftest import free_port, require_binary


class RedisServer:
    """redis-server on a free loopback port, without persistence; can be killed and restarted."""

    def __init__(self, binary: str) -> None:
        self.binary, self.port, self.proc = binary, free_port(), None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        self.kill()
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def redis_server():
    server = RedisServer(require_binary("redis-server"))
    server.start()
    try:
        yield server
    finally:
        server.kill()
