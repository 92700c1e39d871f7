"""A simulated pod and a sidecar in front of it, as processes: for tests, benchmarks and the demo.

Theory of operation: `sim_pod()` and `sidecar()` start `python -m proxy ...` with
`Proc` (ports picked by the OS, learned from the ready line) and, for the sidecar,
wait until `/readyz` answers 200, i.e. until its upstream passed health checks
(and warm-up, if the policy has probes): what a Kubernetes readiness gate waits
for, so callers never race the warm-up.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx

from proxy.testing.procs import Proc, wait_for


def wait_ok(url: str, timeout_s: float = 20.0) -> None:
    """Poll `url` until it answers 2xx, or raise TimeoutError with the last answer."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            resp = httpx.get(url, timeout=2.0)
            if resp.is_success:
                return
            last = f"{resp.status_code} {resp.text.strip()}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout_s}s: {last}")


def wait_pod_busy(pod: Proc, timeout_s: float = 10.0) -> None:
    """Until the pod runs or queues a request (its /sim/stats): then a request sent through a sidecar
    is in flight there. What a test waits for before it signals the sidecar, instead of a fixed sleep
    that a slow client start on a busy machine outlasts (the listener closed before it connected)."""

    def busy() -> bool:
        stats = httpx.get(pod.url() + "/sim/stats", timeout=5).json()
        return bool(stats["running"] or stats["waiting"])

    wait_for(busy, timeout_s=timeout_s, interval_s=0.02)


@contextlib.contextmanager
def sim_pod(*args: str, profile: str = "llm", speed: float = 1.0) -> Iterator[Proc]:
    """`rampmeter sim-pod` on a free loopback port; extra CLI flags in `args`."""
    argv = ["sim-pod", "--listen", "127.0.0.1:0", "--profile", profile, "--speed", str(speed), *args]
    with Proc(argv, name="sim-pod") as proc:
        yield proc


@contextlib.contextmanager
def sidecar(
    upstream: str | list[str],
    *args: str,
    policy: str | None = None,
    protocol: str = "http1",
    ready: bool = True,
    nofile: int | None = None,
) -> Iterator[Proc]:
    """`rampmeter serve` in front of `upstream`; waits for /readyz unless `ready` is False.

    `nofile`: the sidecar's open-file limit (RLIMIT_NOFILE, soft and hard).
    """
    upstreams = [upstream] if isinstance(upstream, str) else upstream  # [] : the policy's upstreams
    argv = ["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--upstream-protocol", protocol]
    for url in upstreams:
        argv += ["--upstream", url]
    if policy:
        argv += ["--policy", policy]
    with Proc([*argv, *args], name="sidecar", nofile=nofile) as proc:
        if ready:
            wait_ok(proc.url("admin") + "/readyz")
        yield proc
