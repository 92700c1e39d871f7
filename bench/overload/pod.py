"""The simulated pod behind a tap that reads the budget each request arrives with, in a child process.

Theory of operation: `Tap` wraps the pod's handler (PodAPI). For every inference
request it reads x-request-timeout-ms, which the sidecar re-stamps with the budget
that remains when it forwards (proxy/runtime/relay.py), and counts requests that
arrived with none left (`expired`: forwarded after their deadline) and with less than
their own uncontended service time (`doomed`: they cannot finish even alone on the
engine; from the simulator's oracle). GET /bench/tap answers the counts, POST resets
them. The body is read once here and replayed to the pod.

`PodProcess` runs it in a spawned child (nothing shared with the generator), pinned to
a CPU, and learns the bound address through a queue.
"""

from __future__ import annotations

import multiprocessing
import queue
import sys

import msgspec
import trio

from bench.common import pin
from bench.overload import POD_PROFILE, POD_SEED
from proxy.simpod import oracle

_JSON = [(b"content-type", b"application/json")]
_BUDGET = b"x-request-timeout-ms"


class _Replay:
    """A request body already read, readable again by the pod's handler."""

    def __init__(self, data: bytes) -> None:
        self._data, self.content_length = data, len(data)

    async def chunks(self):
        if self._data:
            yield self._data

    async def read_all(self) -> bytes:
        return self._data


class Tap:
    def __init__(self, api, profile) -> None:
        self.api, self.profile = api, profile
        self.reset()

    def reset(self) -> None:
        self.counts = {"arrived": 0, "no_budget_header": 0, "expired": 0, "doomed": 0, "min_budget_ms": None}

    def __repr__(self) -> str:
        return f"<Tap {self.counts}>"

    async def __call__(self, request, sink) -> None:
        if request.path == b"/bench/tap":
            if request.method == b"POST":
                self.reset()
            await sink.respond(200, _JSON, msgspec.json.encode(self.counts))
            return
        if request.method == b"POST" and request.path.startswith(b"/v1/"):
            body = await request.body.read_all()
            self._count(request, body)
            request.body = _Replay(body)
        await self.api(request, sink)

    def _count(self, request, body: bytes) -> None:
        c = self.counts
        c["arrived"] += 1
        raw = request.header(_BUDGET)
        if raw is None:
            c["no_budget_header"] += 1
            return
        budget_ms = int(raw)
        c["min_budget_ms"] = budget_ms if c["min_budget_ms"] is None else min(c["min_budget_ms"], budget_ms)
        if budget_ms <= 0:
            c["expired"] += 1
        try:
            service_ms = oracle(request.path.decode(), body, self.profile, POD_SEED).service_s * 1000
        except ValueError:  # BadRequest: not an inference the pod runs (it answers 400/404, no work)
            return
        if budget_ms < service_ms:
            c["doomed"] += 1


async def _serve(ready) -> None:
    from proxy.http.server import Server
    from proxy.policy.schema import Listen
    from proxy.simpod.api import PodAPI
    from proxy.simpod.driver import Pod

    pod = Pod(POD_PROFILE, seed=POD_SEED)
    server = Server(Tap(PodAPI(pod), POD_PROFILE), Listen(address="127.0.0.1:0"), name="sim-pod")
    async with trio.open_nursery() as nursery:
        await nursery.start(pod.run)
        ready.put(await nursery.start(server.serve, "127.0.0.1:0"))


def _main(ready, cpu: int) -> None:
    pin(cpu)
    trio.run(_serve, ready)


class PodProcess:
    """The tapped pod in a spawned child process; `url` once it listens."""

    def __init__(self, cpu: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Queue()
        self.proc = ctx.Process(target=_main, args=(ready, cpu), daemon=True, name="sim-pod")
        self.proc.start()
        try:
            self.url = "http://" + ready.get(timeout=30)
        except queue.Empty:
            self.stop()
            sys.exit("bench.overload: the simulated pod did not start within 30 s")

    def __repr__(self) -> str:
        return f"<PodProcess pid={self.proc.pid} alive={self.proc.is_alive()} {getattr(self, 'url', '')}>"

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
        self.proc.join(10)
