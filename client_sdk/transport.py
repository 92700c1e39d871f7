"""httpx transports that retry politely: `ResilientTransport`, `AsyncResilientTransport`.

Theory of operation: each wraps any inner httpx transport (the default HTTP
one, a MockTransport, another wrapper) and turns one request into one logical
call of up to `max_attempts` attempts. tenacity drives the loop; every decision
(retry? how long to wait? stop?) is a method of the shared `Engine`, so these
shells only do I/O: send an attempt, drain and close a response that will be
retried, sleep. That makes them drop-in for anything built on httpx:

    httpx.Client(transport=ResilientTransport())
    OpenAI(http_client=httpx.Client(transport=ResilientTransport()), max_retries=0)

A response is handed back as soon as its status line and headers decide it is
final: its body streams to the caller untouched, and is never retried after. A
call the adaptive throttle refuses is answered with a synthetic 503 in the
sidecar's shape (`ThrottledLocally.response()`), not raised: an OpenAI SDK user
then reads "throttled_locally" and the server's last refusal, not a connection
error.

Sleeping: the sync shell calls `time.sleep`; the async one `anyio.sleep`, which
is trio.sleep under trio and asyncio.sleep under asyncio (trio is never
imported here). The async shell also bounds each attempt by the call's deadline
with `anyio.fail_after`, since httpx timeouts apply per I/O phase, not in total.
Both accept `sleep=` and `clock=` so tests and benchmarks run on fake time.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable

import anyio
import httpx
import tenacity

from client_sdk.call import Call
from client_sdk.config import RetryConfig
from client_sdk.engine import ClientStatistics, Engine
from client_sdk.errors import DeadlineExceeded, ThrottledLocally
from client_sdk.events import Hooks

# A rejection about to be retried is read (to keep its keep-alive connection)
# only up to this size; a bigger body is dropped with its connection instead.
_DRAIN_LIMIT = 64 * 1024


def _engine(
    engine: Engine | None,
    config: RetryConfig | None,
    clock: Callable[[], float],
    rng: random.Random | None,
    key_factory: Callable[[], str] | None,
    hooks: Hooks | None,
    wall_clock: Callable[[], float],
) -> Engine:
    if engine is not None:
        return engine
    return Engine(config, clock=clock, rng=rng, wall_clock=wall_clock, key_factory=key_factory, hooks=hooks)


class ResilientTransport(httpx.BaseTransport):
    """Sync transport: retries, budget, throttle and deadlines around `inner`."""

    SDK_KWARGS = ("clock", "sleep", "rng", "wall_clock", "key_factory", "hooks", "engine")

    def __init__(
        self,
        inner: httpx.BaseTransport | None = None,
        config: RetryConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        wall_clock: Callable[[], float] = time.time,
        key_factory: Callable[[], str] | None = None,
        hooks: Hooks | None = None,
        engine: Engine | None = None,
    ) -> None:
        self.inner = inner if inner is not None else httpx.HTTPTransport()
        self.engine = _engine(engine, config, clock, rng, key_factory, hooks, wall_clock)
        self._sleep = sleep

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        engine = self.engine
        try:
            call = engine.begin(request)
        except ThrottledLocally as refusal:
            return refusal.response()
        retrying = tenacity.Retrying(
            retry=engine.retry,
            wait=engine.wait,
            stop=engine.stop,
            sleep=self._sleep,
            before_sleep=self._before_sleep,
            retry_error_callback=engine.give_up,
        )
        try:
            response = retrying(self._attempt, call, request)
        except BaseException as exc:
            engine.finish(call, None, exc)
            raise
        engine.finish(call, response, None)
        return response

    def _attempt(self, call: Call, request: httpx.Request) -> httpx.Response:
        self.engine.before_attempt(call, request)
        try:
            response = self.inner.handle_request(request)
        except Exception as exc:
            self.engine.after_attempt(call, None, exc)
            raise
        self.engine.after_attempt(call, response, None)
        return response

    def _before_sleep(self, rs: tenacity.RetryCallState) -> None:
        self.engine.retrying(rs)
        if rs.outcome is not None and not rs.outcome.failed:
            response: httpx.Response = rs.outcome.result()
            try:
                read = 0
                for chunk in () if response.is_stream_consumed else response.iter_raw():
                    read += len(chunk)
                    if read > _DRAIN_LIMIT:
                        break
            except httpx.HTTPError:
                pass  # the response is discarded either way; the retry is what matters
            finally:
                response.close()

    def statistics(self) -> ClientStatistics:
        return self.engine.statistics()

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"<ResilientTransport inner={self.inner!r} {self.engine!r}>"


class AsyncResilientTransport(httpx.AsyncBaseTransport):
    """Async transport (asyncio and trio): retries, budget, throttle and deadlines around `inner`.

    The default clock is `anyio.current_time`, i.e. trio's clock under trio
    (so trio's MockClock drives it) and the event loop's under asyncio.
    """

    SDK_KWARGS = ResilientTransport.SDK_KWARGS

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport | None = None,
        config: RetryConfig | None = None,
        *,
        clock: Callable[[], float] = anyio.current_time,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        rng: random.Random | None = None,
        wall_clock: Callable[[], float] = time.time,
        key_factory: Callable[[], str] | None = None,
        hooks: Hooks | None = None,
        engine: Engine | None = None,
    ) -> None:
        self.inner = inner if inner is not None else httpx.AsyncHTTPTransport()
        self.engine = _engine(engine, config, clock, rng, key_factory, hooks, wall_clock)
        self._sleep = sleep

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        engine = self.engine
        try:
            call = engine.begin(request)
        except ThrottledLocally as refusal:
            return refusal.response()
        retrying = tenacity.AsyncRetrying(
            retry=engine.retry,
            wait=engine.wait,
            stop=engine.stop,
            sleep=self._sleep,
            before_sleep=self._before_sleep,
            retry_error_callback=engine.give_up,
        )
        try:
            response: httpx.Response = await retrying(self._attempt, call, request)
        except BaseException as exc:
            engine.finish(call, None, exc)
            raise
        engine.finish(call, response, None)
        return response

    async def _attempt(self, call: Call, request: httpx.Request) -> httpx.Response:
        remaining = self.engine.before_attempt(call, request)
        try:
            if remaining is None:
                response = await self.inner.handle_async_request(request)
            else:
                try:
                    with anyio.fail_after(remaining):
                        response = await self.inner.handle_async_request(request)
                except TimeoutError as exc:
                    raise DeadlineExceeded(
                        f"{call.host}: deadline passed during attempt {call.attempts}",
                        request=request,
                        attempts=call.attempts,
                    ) from exc
        except Exception as exc:
            self.engine.after_attempt(call, None, exc)
            raise
        self.engine.after_attempt(call, response, None)
        return response

    async def _before_sleep(self, rs: tenacity.RetryCallState) -> None:
        self.engine.retrying(rs)
        if rs.outcome is not None and not rs.outcome.failed:
            response: httpx.Response = rs.outcome.result()
            try:
                read = 0
                if not response.is_stream_consumed:
                    async for chunk in response.aiter_raw():
                        read += len(chunk)
                        if read > _DRAIN_LIMIT:
                            break
            except httpx.HTTPError:
                pass  # the response is discarded either way; the retry is what matters
            finally:
                await response.aclose()

    def statistics(self) -> ClientStatistics:
        return self.engine.statistics()

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __repr__(self) -> str:
        return f"<AsyncResilientTransport inner={self.inner!r} {self.engine!r}>"
