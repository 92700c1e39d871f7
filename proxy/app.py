"""Composition root: builds every part from a policy and owns the nursery tree.

Theory of operation: `App` is constructed from a validated `Policy` and wires the
parts together; `App.run` opens them in dependency order inside one nursery
(upstream pool, dedup store, readiness and GPU drivers, then the data and admin
listeners) and reports readiness to listen with `task_status.started(addresses)`
only when every listener is bound. `App.shutdown` drains: /readyz flips to
"draining" at once (so Kubernetes stops routing here), the data listener drains
until no request is in flight (at most `listen.drain_timeout_s`; idle client
connections and pooled upstream ones never hold it), then everything is cancelled.

The request path gets its parts typed and by name (`Collaborators`: scheduler,
dedup, readiness, pool, observatory, metrics, the policy); the admission controller
gets its arrival gate and the observed service times at construction. A policy
reload rebuilds the arrival gate (and the latency windows when `[latency]`
changed) and hands it to the scheduler with the policy in one call (queued requests
survive), dedup takes the new policy, the request path is given a whole new
`Collaborators` set, and the data listener takes the new `[listen]` limits
(`Server.update_limits`: body and header caps and timeouts from the next request or
phase, max_connections from the next accept, what h2 advertises in SETTINGS from the
next connection). Listener addresses, the upstream list and the dedup store need a
restart: a reload that changes them logs a warning, keeps them as they are in the
policy in force, and `/admin/policy` shows the file's values under `pending_restart`.

A small `_signals` task carries slow-moving signals into admission every
`SIGNAL_INTERVAL_S` (and at once when the sidecar becomes ready, so the limit is
open before the first request after /readyz turns 200): the slow-start factor of
each upstream's limit, and GPU memory / KV-cache pressure for the gpu_pressure
shedding rule.
"""

from __future__ import annotations

import errno
import logging
import random
import socket
from typing import Any

import msgspec
import trio

from proxy import build, logs
from proxy.core.arrival import ArrivalGate
from proxy.errors import StartupError
from proxy.http import heap
from proxy.http.pool import UpstreamPool
from proxy.http.server import FD_BASE_RESERVE, Server
from proxy.metrics import Metrics
from proxy.policy import shedding as shedding_policy
from proxy.policy.schema import Listen, Policy
from proxy.runtime import tracing as otel
from proxy.runtime.accesslog import AccessLog
from proxy.runtime.admin import AdminHandler
from proxy.runtime.batcher import Batcher
from proxy.runtime.dedup import Deduplicator, build_store
from proxy.runtime.drain import Drain
from proxy.runtime.edge import Edge
from proxy.runtime.gpu import GpuSampler
from proxy.runtime.observe import Observatory
from proxy.runtime.readiness import UpstreamLifecycles
from proxy.runtime.reload import PolicyReloader, PolicyVersion
from proxy.runtime.request_path import Collaborators, RequestPath
from proxy.runtime.scheduler import Scheduler
from proxy.runtime.upstream_metrics import UpstreamMetricsReader

log = logging.getLogger("rampmeter")

# The admin listener serves a handful of small GETs; tight limits keep it cheap.
ADMIN_LIMITS = Listen(max_connections=64, max_concurrent_streams=16, max_body_bytes=0, header_timeout_s=5.0)
SIGNAL_INTERVAL_S = 0.25


async def _listen(nursery: trio.Nursery, server: Server, address: str) -> str:
    """Start `server` on `address`; a bind the operator can fix (port taken...) is a StartupError."""
    try:
        return await nursery.start(server.serve, address)
    except OSError as exc:
        raise StartupError(f"cannot listen on {address}: {listen_failure(exc)}") from exc


def listen_failure(exc: OSError) -> str:
    """Why a bind failed, in the words an operator searches for."""
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host ({exc.strerror or exc})"
    reasons = {
        errno.EADDRINUSE: "address already in use",
        errno.EADDRNOTAVAIL: "no such address on this host",
        errno.EACCES: "permission denied (ports below 1024 need privileges)",
    }
    return reasons.get(exc.errno or 0, (exc.strerror or str(exc)).lower())


def _restart_parts(p: Policy) -> tuple[tuple[str, object], ...]:
    """What a running sidecar cannot change without a restart, by the key an operator edits."""
    return (
        ("listen.address", p.listen.address),
        ("admin", p.admin),
        ("upstreams", p.upstreams),
        ("dedup.store", (p.dedup.store, p.dedup.redis_url)),
    )


def restart_keys(before: Policy, after: Policy) -> list[str]:
    """Keys whose change between two policies takes effect only at the next restart."""
    return [name for (name, a), (_, b) in zip(_restart_parts(before), _restart_parts(after), strict=True) if a != b]


def keep_running(policy: Policy, running: Policy) -> Policy:
    """`policy` with the restart-only parts of the policy `running` now."""
    return msgspec.structs.replace(
        policy,
        listen=msgspec.structs.replace(policy.listen, address=running.listen.address),
        admin=running.admin,
        upstreams=running.upstreams,
        dedup=msgspec.structs.replace(policy.dedup, store=running.dedup.store, redis_url=running.dedup.redis_url),
    )


class App:
    def __init__(
        self,
        policy: Policy,
        version: PolicyVersion,
        *,
        policy_path: str | None = None,
        file_policy: Policy | None = None,
        registry=None,
        rng: random.Random | None = None,
        nvml: Any = None,
        tracing: Any = ...,
        pool: UpstreamPool | None = None,
        lifecycles: UpstreamLifecycles | None = None,
    ) -> None:
        """`tracing`: a proxy.runtime.tracing.Tracing, None (off), or ... (as the OTEL_* variables say).
        `pool` and `lifecycles`: stand-ins for tests (default: built from the policy)."""
        self.policy = policy
        self.version = version
        self.policy_path = policy_path
        # The policy file as written (before command-line overrides): reloads compare file with file.
        self.file_policy = file_policy if file_policy is not None else policy
        self.rng = rng or random.Random()
        self.metrics = metrics = Metrics(registry, upstreams=[u.url for u in policy.upstreams])
        metrics.policy_version.set(version.version)
        metrics.build_info.labels(build.version(), build.python_version()).set(1)
        self.pool = pool if pool is not None else UpstreamPool(policy.upstreams, metrics=metrics)
        self.observatory = Observatory(policy.latency, metrics.registry)
        self.gate = self._build_gate(policy, 0.0)
        self.scheduler = Scheduler(
            policy, rng=self.rng, metrics=metrics, gate=self.gate, service=self.observatory.service
        )
        self.dedup = Deduplicator(policy.dedup, build_store(policy.dedup, metrics), metrics, rng=self.rng)
        self.lifecycles = lifecycles if lifecycles is not None else UpstreamLifecycles(policy, metrics=metrics)
        for warmer in self.lifecycles.warmers:  # warm-up probes seed the service-time model
            warmer.on_sample = self.scheduler.learn_probe
        self.gpu = GpuSampler(policy.gpu, metrics=metrics, nvml=nvml)
        self.upstream_metrics = UpstreamMetricsReader(policy, metrics=metrics)
        self.batcher = Batcher(policy, metrics)
        # The engine's own gauges feed admission: engine_queue limit, gradient ceiling, cancel habit.
        self.upstream_metrics.on_reading = lambda i, s: self.scheduler.note_engine(i, s.running, s.waiting)
        self.request_path = RequestPath(self.collaborators())
        # Request ids, x-rampmeter-class, the access line, the span, the drain gate (proxy/runtime/edge.py).
        self.tracing = otel.from_environment(version=build.version()) if tracing is ... else tracing
        if self.tracing is not None:
            self.tracing.upstream_name = metrics.upstream
        self.access_log = access_log = AccessLog(
            policy.access_log,
            json_format=logs.current_format() == "json",
            upstream_name=metrics.upstream,
            tenants=policy.tenants,
        )
        self.edge = Edge(
            self.request_path,
            access_log=access_log,
            tracing=self.tracing,
            draining_retry_after_ms=policy.readiness.retry_after_ms,
            on_draining=lambda: metrics.rejections.labels("", "draining").inc(),  # no 0 series before the first
        )
        self.drain = Drain(
            self.edge, default_timeout_s=lambda: self.policy.listen.drain_timeout_s, on_start=self._start_draining
        )
        # Descriptors the data port's connections must leave free (proxy/http/server.py fd_cap).
        reserve = sum(u.max_connections for u in policy.upstreams) + ADMIN_LIMITS.max_connections + FD_BASE_RESERVE
        self.data_server = Server(
            self.edge,
            policy.listen,
            metrics=metrics,
            name="data",
            fd_reserve=reserve,
            buffer_bodies=True,  # the request path reads HTTP/1.1 bodies whole before admission
        )
        self.admin_server = Server(
            AdminHandler(
                registry=metrics.registry,
                stats=self.statistics,
                policy=self.policy_snapshot,
                readiness=self.readiness,
                drain=self.drain,
            ),
            ADMIN_LIMITS,
            name="admin",
            defer_accepts=False,  # probes open a connection each; at most 64, and each is cheap
        )
        self.reloader: PolicyReloader | None = None
        self._file_at_start = self.file_policy
        self.pending_restart: dict[str, Any] = {}  # key -> the value the file asks for, once restarted
        self.nursery: trio.Nursery | None = None
        self.draining = False

    def __repr__(self) -> str:
        return f"<App policy v{self.version.version} from {self.version.source} draining={self.draining}>"

    def _build_gate(self, policy: Policy, pressure: float) -> ArrivalGate:
        """The arrival gate (shedding, quotas, deadline check), rebuilt whole on reload; it also
        gives queue-full answers the same jittered, bounded Retry-After as shed ones."""
        shedder = shedding_policy.shedder(policy.shedding, len(policy.classes), self.rng)
        gate = ArrivalGate(policy, shedder, shedding_policy.tenant_quota(policy.tenants))
        gate.gpu_memory_fraction = pressure
        return gate

    def collaborators(self) -> Collaborators:
        """The request path's parts for the policy in force."""
        return Collaborators(
            policy=self.policy,
            scheduler=self.scheduler,
            dedup=self.dedup,
            readiness=self.lifecycles,
            pool=self.pool,
            observatory=self.observatory,
            metrics=self.metrics,
            batcher=self.batcher,
        )

    async def run(self, data_address: str, admin_address: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with self.pool, trio.open_nursery() as nursery:
            self.nursery = self.request_path.nursery = nursery
            await nursery.start(self.dedup.run)
            await nursery.start(self.lifecycles.run)
            await nursery.start(self.gpu.run)
            await nursery.start(self.upstream_metrics.run)
            await nursery.start(self.batcher.run)
            await nursery.start(self.scheduler.run)  # ends phantom leases on time
            nursery.start_soon(self._signals)
            data = await _listen(nursery, self.data_server, data_address)
            admin = await _listen(nursery, self.admin_server, admin_address)
            if self.policy_path:
                self.reloader = PolicyReloader(self.policy_path, self.version, self.apply_policy, metrics=self.metrics)
                await nursery.start(self.reloader.run)
            log.info("serving on %s (admin %s), upstreams %s", data, admin, [u.url for u in self.policy.upstreams])
            task_status.started({"data": data, "admin": admin})

    async def _signals(self) -> None:
        while True:
            for i in range(len(self.policy.upstreams)):
                self.scheduler.set_capacity_factor(i, self.lifecycles.limit_factor(i))
            pressure = [
                x for x in (self.gpu.memory_fraction(), self.upstream_metrics.kv_cache_fraction()) if x is not None
            ]
            self.gate.gpu_memory_fraction = max(pressure, default=0.0)
            if self.lifecycles.ready:
                await trio.sleep(SIGNAL_INTERVAL_S)
                continue
            # Not ready: the factor is 0. Becoming ready must open the limit at once,
            # or the first requests after /readyz turns 200 queue up to SIGNAL_INTERVAL_S.
            with trio.move_on_after(SIGNAL_INTERVAL_S):
                await self.lifecycles.wait_ready()

    async def shutdown(self) -> None:
        """Drain the data path, then stop everything (admin last, so /readyz says why)."""
        self.draining = True
        drain_s = self.policy.listen.drain_timeout_s
        log.info("draining for up to %.1fs", drain_s)
        await self.data_server.shutdown(drain_s)
        if self.nursery is not None:
            self.nursery.cancel_scope.cancel()
        if self.tracing is not None:
            await trio.to_thread.run_sync(self.tracing.shutdown)  # exports what is batched, off the event loop

    def _start_draining(self) -> None:
        """POST /admin/drain: /readyz says draining from now on (proxy/runtime/drain.py)."""
        self.draining = True

    def apply_policy(self, policy: Policy, version: PolicyVersion) -> None:
        """Put a reloaded file's policy in force. `policy` is the file as written, without command-line overrides."""
        old = self.policy
        # File against file: `--listen`/`--admin`/`--upstream` make the policy in force differ
        # from every file, which is no reason to warn at each reload.
        restart_needed = restart_keys(self.file_policy, policy)
        self.file_policy = policy
        if restart_needed:
            log.warning(
                "policy v%d changes %s; those take effect at the next restart (see /admin/policy pending_restart)",
                version.version,
                restart_needed,
            )
        # Restart-only values never change while running, so what waits for a restart is
        # what the file asks for that differs from the file the sidecar started with.
        wanted = dict(_restart_parts(policy))
        self.pending_restart = {
            name: msgspec.to_builtins(wanted[name]) for name in restart_keys(self._file_at_start, policy)
        }
        # Until then they run as they are, and the policy in force must say so: the parts
        # sized by the upstream list index it (a file listing more upstreams than
        # `--upstream` gave crashed the sidecar), and command-line overrides survive.
        policy = keep_running(policy, old)
        self.policy, self.version = policy, version
        self.data_server.update_limits(policy.listen)
        if policy.latency != old.latency:
            self.observatory.configure(policy.latency)  # new windows, samples start over
        self.gate = self._build_gate(policy, self.gate.gpu_memory_fraction)
        self.scheduler.apply_policy(policy, self.gate, self.observatory.service)
        self.dedup.policy = policy.dedup
        self.batcher.configure(policy)
        self.access_log.configure(policy.access_log, policy.tenants)
        self.edge.draining_retry_after_ms = policy.readiness.retry_after_ms
        self.lifecycles.update_policy(policy)
        self.request_path.update(self.collaborators())
        self.metrics.policy_version.set(version.version)

    # --- introspection ---------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        return self.lifecycles.readiness()

    def statistics(self) -> dict[str, Any]:
        now = trio.current_time()
        return {
            "policy": {"version": self.version.version, "source": self.version.source},
            "server": self.data_server.statistics(),
            "admission": self.scheduler.statistics(),
            "routes": self.scheduler.controller.estimator.statistics(),  # unmatched paths, costed by shape
            "shedding": self.gate.shedder.statistics(),
            "tenants": self.gate.tenants.statistics() if self.gate.tenants else None,
            "gpu_memory_pressure": self.gate.gpu_memory_fraction,
            "latency": self.observatory.statistics(now),
            "dedup": self.dedup.statistics(),
            "batching": self.batcher.statistics(),
            "readiness": self.lifecycles.statistics(),
            "gpu": self.gpu.statistics(),
            "upstream_metrics": self.upstream_metrics.statistics(),
            "upstreams": self.pool.statistics(),
            "reload": self.reloader.statistics() if self.reloader else None,
            "gc": heap.statistics(),  # the collector's sweeps under connection floods (proxy/http/heap.py)
        }

    def policy_snapshot(self) -> dict[str, Any]:
        return {
            "source": self.version.source,
            "version": self.version.version,
            "sha256": self.version.sha256,
            "policy": msgspec.to_builtins(self.policy),
            # What the file asks for that only a restart applies (the policy above is what runs).
            "pending_restart": self.pending_restart,
        }
