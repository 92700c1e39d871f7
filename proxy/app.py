"""Composition root: builds every part from a policy and owns the nursery tree.

Theory of operation: `App` is constructed from a validated `Policy` and wires
the parts together; `App.run` opens them in dependency order inside one nursery
(upstream pool, then the data and admin listeners, then background drivers) and
reports readiness with `task_status.started(addresses)` only when every listener
is bound. `App.shutdown` drains: readiness flips to "draining" at once (so a
Kubernetes endpoint controller stops routing here), the data listener drains for
up to `listen.drain_timeout_s`, then everything is cancelled.

Policy reload swaps the whole policy into the parts that can take it live;
listener addresses and the upstream list need a restart, and a reload that
changes them says so in the log.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import msgspec
import trio

from proxy.core.balancer import Balancer
from proxy.http.pool import UpstreamPool
from proxy.http.server import Server
from proxy.policy.schema import Listen, Policy
from proxy.runtime.admin import AdminHandler
from proxy.runtime.metrics import Metrics
from proxy.runtime.reload import PolicyReloader, PolicyVersion
from proxy.runtime.request_path import RequestPath

log = logging.getLogger("rampmeter")

# The admin listener serves a handful of small GETs; tight limits keep it cheap.
ADMIN_LIMITS = Listen(max_connections=64, max_concurrent_streams=16, max_body_bytes=0, header_timeout_s=5.0)


class App:
    def __init__(
        self,
        policy: Policy,
        version: PolicyVersion,
        *,
        policy_path: str | None = None,
        registry=None,
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy
        self.version = version
        self.policy_path = policy_path
        self.metrics = Metrics(registry)
        self.metrics.policy_version.set(version.version)
        self._rng = rng or random.Random()
        self.pool = UpstreamPool(policy.upstreams, metrics=self.metrics)
        self.balancer = Balancer(
            len(policy.upstreams), [u.cooldown_s for u in policy.upstreams], rng=self._rng
        )
        self.request_path = RequestPath(
            policy=policy, pool=self.pool, balancer=self.balancer, metrics=self.metrics
        )
        self.data_server = Server(self.request_path, policy.listen, metrics=self.metrics, name="data")
        self.admin_server = Server(
            AdminHandler(
                registry=self.metrics.registry,
                stats=self.statistics,
                policy=self.policy_snapshot,
                readiness=self.readiness,
            ),
            ADMIN_LIMITS,
            name="admin",
        )
        self.reloader: PolicyReloader | None = None
        self.draining = False

    def __repr__(self) -> str:
        return f"<App policy v{self.version.version} from {self.version.source} draining={self.draining}>"

    async def run(self, data_address: str, admin_address: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with self.pool, trio.open_nursery() as nursery:
            self._nursery = nursery
            data = await nursery.start(self.data_server.serve, data_address)
            admin = await nursery.start(self.admin_server.serve, admin_address)
            if self.policy_path:
                self.reloader = PolicyReloader(
                    self.policy_path, self.version, self.apply_policy, metrics=self.metrics
                )
                await nursery.start(self.reloader.run)
            log.info("serving on %s (admin %s), upstreams %s", data, admin, [u.url for u in self.policy.upstreams])
            task_status.started({"data": data, "admin": admin})

    async def shutdown(self) -> None:
        """Drain the data path, then stop everything (admin last, so /readyz says why)."""
        self.draining = True
        drain_s = self.policy.listen.drain_timeout_s
        log.info("draining for up to %.1fs", drain_s)
        await self.data_server.shutdown(drain_s)
        self._nursery.cancel_scope.cancel()

    def apply_policy(self, policy: Policy, version: PolicyVersion) -> None:
        old = self.policy
        restart_needed = [
            name
            for name, before, after in (
                ("listen", old.listen, policy.listen),
                ("admin", old.admin, policy.admin),
                ("upstreams", old.upstreams, policy.upstreams),
            )
            if before != after
        ]
        if restart_needed:
            log.warning("policy v%d changes %s; those take effect at the next restart", version.version, restart_needed)
        self.policy = policy
        self.version = version
        self.request_path.policy = policy
        self.metrics.policy_version.set(version.version)

    # --- introspection ---------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        return True, "ready"

    def statistics(self) -> dict[str, Any]:
        return {
            "policy": {"version": self.version.version, "source": self.version.source},
            "server": self.data_server.statistics(),
            "upstreams": self.pool.statistics(),
            "balancer": self.balancer.statistics(),
            "reload": self.reloader.statistics() if self.reloader else None,
        }

    def policy_snapshot(self) -> dict[str, Any]:
        return {
            "source": self.version.source,
            "version": self.version.version,
            "sha256": self.version.sha256,
            "policy": msgspec.to_builtins(self.policy),
        }
