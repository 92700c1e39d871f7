"""Start rampmeter processes (sidecar, simulated pod, ...) for tests, benchmarks and the demo.

Every long-running rampmeter command prints exactly one line to stdout once all of
its listeners are bound and it is ready to serve:

    rampmeter-ready {"data": "127.0.0.1:41234", "admin": "127.0.0.1:41235"}

so callers can ask for port 0 and learn the real ports without racing. `Proc`
waits for that line (bounded), keeps the rest of the output in a log file for
post-mortems, and on exit sends SIGTERM, then SIGKILL if it lingers.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Self

from proxy.ready import READY_PREFIX, print_ready, ready_line

# The line itself is the product's (proxy/ready.py); re-exported for the callers here.
__all__ = ["READY_PREFIX", "Proc", "ProcFailed", "print_ready", "ready_line", "wait_for"]


class ProcFailed(RuntimeError):
    pass


class Proc:
    """A `python -m proxy ARGS...` child process, ready when constructed."""

    def __init__(
        self,
        args: list[str],
        *,
        ready_timeout_s: float = 20.0,
        env: dict[str, str] | None = None,
        cpu: int | None = None,
        name: str | None = None,
        nofile: int | None = None,
    ) -> None:
        self.args = list(args)
        self.name = name or (args[0] if args else "proc")
        self.log_path = Path(tempfile.mkstemp(prefix=f"rampmeter-{self.name}-", suffix=".log")[1])
        cmd = [sys.executable, "-m", "proxy", *args]
        if cpu is not None and _has_taskset():
            cmd = ["taskset", "-c", str(cpu), *cmd]
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed by stop(), lives as long as the process
        # nofile: the child's open-file limit (soft and hard), for tests of what happens at the limit.
        limit = None if nofile is None else functools.partial(resource.setrlimit, resource.RLIMIT_NOFILE, (nofile,) * 2)
        self.popen = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._log, env=full_env, text=True, bufsize=1, preexec_fn=limit
        )
        self.addresses = self._wait_ready(ready_timeout_s)
        # Keep draining stdout so the child never blocks on a full pipe.
        self._pump = threading.Thread(target=self._drain_stdout, daemon=True)
        self._pump.start()

    def _wait_ready(self, timeout_s: float) -> dict[str, str]:
        result: dict[str, str] = {}
        done = threading.Event()

        def read() -> None:
            assert self.popen.stdout is not None
            for line in self.popen.stdout:
                self._log.write(line)
                if line.startswith(READY_PREFIX):
                    result.update(json.loads(line[len(READY_PREFIX) :]))
                    break
            done.set()

        threading.Thread(target=read, daemon=True).start()
        if not done.wait(timeout_s) or not result:
            self.stop(timeout_s=2)
            raise ProcFailed(f"{self.name} did not become ready in {timeout_s}s; log:\n{self.log()}")
        return result

    def _drain_stdout(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self._log.write(line)

    def url(self, name: str = "data") -> str:
        return f"http://{self.addresses[name]}"

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-8000:]

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, wait up to `timeout_s`, then SIGKILL. Returns the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.flush()
        return self.popen.returncode

    def wait(self, timeout_s: float) -> int:
        return self.popen.wait(timeout_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._log.close()


def _has_taskset() -> bool:
    return any((Path(p) / "taskset").exists() for p in os.environ.get("PATH", "").split(os.pathsep))


def wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.05):
    """Poll `predicate()` until truthy; return its value or raise TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s}s")
        time.sleep(interval_s)
