"""Live policy reload: on file change or SIGHUP, validate, then swap the whole policy.

Theory of operation: one task polls the policy file (stat of the *resolved* path,
then a content hash) every `interval_s`, and a SIGHUP forces a check. Polling the
resolved path is what survives a Kubernetes ConfigMap update: the kubelet writes a
new `..<timestamp>` directory and atomically swaps the `..data` symlink, so the
watched name never changes but what it resolves to does; inotify on the name
would miss it, a stat through the links does not. Content hashing makes a touch
without change a no-op.

A new policy is built whole by `parse_policy_file`; only if it is valid is `apply`
called with it. A broken file keeps the old policy in force, logs the error once
per distinct content, and counts `policy_reloads_total{result="error"}`. A file
that sets nothing (empty, whitespace or comments only: what a truncated write or a
non-atomic editor save shows in between) is such a broken file, never "all defaults".
Command-line overrides are the app's business (`App.apply_policy` compares file
with file and keeps the restart-only values running), so `apply` gets the file as written.
No third-party watcher: watchfiles/watchdog bring threads and native code for
what a 1 s stat does here, and neither follows ConfigMap symlink swaps by name.
"""

from __future__ import annotations

import hashlib
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from proxy.errors import PolicyError
from proxy.policy.load import parse_policy_file
from proxy.policy.schema import Policy

log = logging.getLogger("rampmeter.policy")


@dataclass(frozen=True)
class PolicyVersion:
    """Where the policy in force came from."""

    source: str  # file path, or "embedded default"
    version: int  # 1 for the policy loaded at start, +1 per successful reload
    sha256: str  # of the file's bytes ("" for the embedded default)
    loaded_at: float  # trio.current_time() when it took effect


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


class PolicyReloader:
    """Watches one file; calls `apply(policy, version)` with each valid new version."""

    def __init__(
        self,
        path: str | Path,
        current: PolicyVersion,
        apply: Callable[[Policy, PolicyVersion], None],
        *,
        metrics=None,
        interval_s: float = 1.0,
    ) -> None:
        self.path = Path(path)
        self.current = current
        self._apply = apply
        self._metrics = metrics
        self._interval_s = interval_s
        self._last_seen = current.sha256
        self._last_stat: tuple[int, int, int] | None = self._stat()
        self.errors = 0
        self.last_error: str | None = None

    def __repr__(self) -> str:
        return f"<PolicyReloader {self.path} v{self.current.version} errors={self.errors}>"

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGHUP) as signals:
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._on_signals, signals)
                while True:
                    await trio.sleep(self._interval_s)
                    if self._stat() != self._last_stat:
                        self.check()

    async def _on_signals(self, signals) -> None:
        async for _ in signals:
            log.info("SIGHUP: re-reading %s", self.path)
            self.check(force=True)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()  # follows symlinks: sees the ConfigMap ..data swap
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def check(self, *, force: bool = False) -> bool:
        """Re-read now; returns True if a new policy took effect."""
        self._last_stat = self._stat()
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            return self._reject(f"{self.path}: cannot read: {exc.strerror or exc}", "")
        sha = digest(data)
        if sha == self._last_seen and not force:
            return False
        if sha == self.current.sha256:
            self._last_seen = sha
            return False
        try:
            policy = parse_policy_file(data.decode("utf-8", errors="replace"), source=str(self.path))
        except PolicyError as exc:
            return self._reject("; ".join(exc.errors), sha)
        self._last_seen = sha
        self.current = PolicyVersion(str(self.path), self.current.version + 1, sha, trio.current_time())
        self._apply(policy, self.current)
        self.last_error = None
        self._count("ok")
        log.info("policy reloaded from %s (version %d, sha256 %s)", self.path, self.current.version, sha)
        return True

    def _reject(self, message: str, sha: str) -> bool:
        self._count("error")
        self.errors += 1
        if sha != self._last_seen or message != self.last_error:
            log.error("policy reload rejected, keeping version %d in force: %s", self.current.version, message)
        self._last_seen = sha
        self.last_error = message
        return False

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.policy_reloads.labels(result).inc()

    def statistics(self) -> dict:
        return {
            "path": str(self.path),
            "version": self.current.version,
            "sha256": self.current.sha256,
            "errors": self.errors,
            "last_error": self.last_error,
        }
