"""What every attack test asserts, in one place: bystanders keep being served.

Theory of operation: an attack test starts a real sim pod and sidecar (`attacked_stack`),
starts a `Bystander` (a thread that sends ordinary requests at a steady rate from its
own connection, polls the sidecar's /readyz and samples the sidecar's RSS from /proc),
runs the attack over real TCP on 127.0.0.1 for a bounded time, and then checks
`Bystander.report()` against what a user needs:

- ordinary requests from another client keep succeeding (>= 95%) with bounded latency,
- /readyz stays 200 (Kubernetes would pull the pod otherwise),
- the sidecar's RSS stays within a stated bound,
- the sidecar's log holds no traceback (`assert_clean_log`).

The attacker's own answer (GOAWAY code, 408, 400, ...) is asserted by each test.
Bystanders use httpx over HTTP/1.1 by default (`http2=True` for h2c): a separate
connection, as another client of the pod would be.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from proxy.testing.procs import Proc
from proxy.testing.stack import sidecar, sim_pod

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|ExceptionGroup|^\s+File \"", re.M)


@dataclass
class Stack:
    pod: Proc
    sidecar: Proc

    @property
    def data(self) -> tuple[str, int]:
        host, _, port = self.sidecar.addresses["data"].rpartition(":")
        return host, int(port)

    @property
    def url(self) -> str:
        return self.sidecar.url("data")

    @property
    def admin(self) -> str:
        return self.sidecar.url("admin")

    @property
    def pid(self) -> int:
        return self.sidecar.popen.pid

    def server_stats(self) -> dict:
        """The data server's section of the sidecar's /admin/stats (connections, requests in flight)."""
        return httpx.get(self.admin + "/admin/stats", timeout=5).json()["server"]


@contextlib.contextmanager
def attacked_stack(
    *sidecar_args: str, policy: str | None = None, protocol: str = "http1", nofile: int | None = None
) -> Iterator[Stack]:
    """A fast sim pod (speed 20: a short chat answers in a few ms) and a ready sidecar in front of it.

    `nofile`: the sidecar's open-file limit (RLIMIT_NOFILE), for attacks on file descriptors.
    """
    with (
        sim_pod(speed=20.0) as pod,
        sidecar(pod.url(), *sidecar_args, policy=policy, protocol=protocol, nofile=nofile) as proxy,
    ):
        yield Stack(pod, proxy)


def rss_bytes(pid: int) -> int:
    """Resident set size of `pid` from /proc (0 once the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class Report:
    sent: int
    ok: int
    latencies_s: list[float]
    readyz_failures: list[str]
    peak_rss_bytes: int
    errors: list[str] = field(default_factory=list)

    @property
    def success_rate(self) -> float:
        return self.ok / self.sent if self.sent else 0.0

    def p99_s(self) -> float:
        if not self.latencies_s:
            return float("inf")
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    def check(self, *, min_success: float = 0.95, max_p99_s: float = 1.0, max_rss_mib: float = 256.0) -> None:
        """The bystander's verdict; the message carries every figure, for the failure report."""
        summary = (
            f"bystander: {self.ok}/{self.sent} ok, p99 {self.p99_s() * 1000:.0f} ms, "
            f"readyz failures {len(self.readyz_failures)} {self.readyz_failures[:3]}, "
            f"peak RSS {self.peak_rss_bytes / 2**20:.0f} MiB, errors {self.errors[:3]}"
        )
        assert self.sent >= 5, summary
        assert self.success_rate >= min_success, summary
        assert self.p99_s() <= max_p99_s, summary
        assert not self.readyz_failures, summary
        assert self.peak_rss_bytes <= max_rss_mib * 2**20, summary


class Bystander:
    """Ordinary traffic beside an attack: `rate` requests/s on its own connection, /readyz, RSS.

    `keepalive=False`: a new connection for every request, as a client arriving during the
    attack would be (an attack on connection slots spares a connection opened before it).
    """

    def __init__(
        self,
        stack: Stack,
        *,
        rate: float = 20.0,
        http2: bool = False,
        timeout_s: float = 5.0,
        keepalive: bool = True,
    ) -> None:
        self.stack, self.rate, self.http2, self.timeout_s = stack, rate, http2, timeout_s
        self.keepalive = keepalive
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.sent = self.ok = 0
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.readyz_failures: list[str] = []
        self.peak_rss = rss_bytes(stack.pid)

    def __enter__(self) -> Bystander:
        for target in (self._requests, self._readyz):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 2)

    def report(self) -> Report:
        with self._lock:
            return Report(
                self.sent, self.ok, list(self.latencies), list(self.readyz_failures), self.peak_rss, list(self.errors)
            )

    def _requests(self) -> None:
        period = 1.0 / self.rate
        limits = httpx.Limits() if self.keepalive else httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(http2=self.http2, http1=not self.http2, timeout=self.timeout_s, limits=limits) as client:
            next_at = time.monotonic()
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    resp = client.post(self.stack.url + "/v1/chat/completions", json=CHAT)
                    good, error = resp.status_code == 200, None if resp.status_code == 200 else str(resp.status_code)
                except httpx.HTTPError as exc:
                    good, error = False, repr(exc)
                with self._lock:
                    self.sent += 1
                    self.ok += good
                    if good:
                        self.latencies.append(time.monotonic() - start)
                    elif error:
                        self.errors.append(error)
                next_at += period
                self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _readyz(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            while not self._stop.is_set():
                try:
                    resp = client.get(self.stack.admin + "/readyz")
                    if resp.status_code != 200:
                        self._note_readyz(f"{resp.status_code} {resp.text[:80]}")
                except httpx.HTTPError as exc:
                    self._note_readyz(repr(exc))
                rss = rss_bytes(self.stack.pid)
                with self._lock:
                    self.peak_rss = max(self.peak_rss, rss)
                self._stop.wait(0.1)

    def _note_readyz(self, what: str) -> None:
        with self._lock:
            self.readyz_failures.append(what)


def assert_clean_log(proc: Proc) -> None:
    """No traceback in the sidecar's log: attacks are answered, counted and logged in one line."""
    proc.log()  # flushes
    log = proc.log_path.read_text(errors="replace")
    match = TRACEBACK.search(log)
    assert match is None, f"traceback in the sidecar log:\n{log[max(0, match.start() - 500) : match.start() + 2000]}"


def connect(stack: Stack, timeout_s: float = 5.0) -> socket.socket:
    """A raw TCP connection to the sidecar's data port, for hand-made attacks."""
    sock = socket.create_connection(stack.data, timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0
