"""The decision core shared by the sync and async transports.

Theory of operation: one logical call is a `Call`. The transports (thin shells
in `client_sdk.transport`) drive it with tenacity, and tenacity's hooks are
this engine's methods, so sync and async make identical decisions:

    begin()          throttle check, budget deposit, headers, idempotency key, deadline
                     (the request's kind, client_sdk.kinds, is worked out when a hint needs it)
    before_attempt() x-request-timeout-ms = remaining budget; per-attempt timeout =
                     the remaining budget, or, when the caller set no deadline, the
                     hint for this kind of request if a cut can be followed by a retry
    after_attempt()  classify the outcome (Signal), feed the throttle (signals.THROTTLE)
                     and the hints (a read timeout the hint caused doubles the hint)
    retry(rs)        tenacity `retry=`: is another attempt *safe*? (client_sdk.rules)
    wait(rs)         tenacity `wait=`: backoff with full jitter above Retry-After
    stop(rs)         tenacity `stop=`: can we *afford* it? attempts, wait cap,
                     deadline, and last the budget token (spent only here, only
                     when every other check passed)
    give_up(rs)      tenacity `retry_error_callback=`: hand back the last response,
                     or raise DeadlineExceeded / RetryBudgetExhausted / the error
    finish()         summary on the response, counters, hooks

Clock (`now()`: monotonic seconds), randomness (`random.Random`), the wall clock
(for HTTP-date Retry-After) and the idempotency key factory are injected. One
`threading.Lock` guards host state and counters, so a sync client may be shared
by threads; it is never held across I/O or an await.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import tenacity

from client_sdk import signals, wire
from client_sdk.backoff import Backoff
from client_sdk.call import Call, ensure_idempotency_key
from client_sdk.config import DEFAULT_OPTIONS, EXTENSION, CallOptions, RetryConfig
from client_sdk.errors import DeadlineExceeded, RetryBudgetExhausted, ThrottledLocally
from client_sdk.events import NULL_HOOKS, AttemptInfo, CallSummary, Hooks, RetryInfo, Stop
from client_sdk.hosts import HostStatistics, HostTable, host_key
from client_sdk.rules import may_retry
from client_sdk.signals import THROTTLE, Signal, Verdict


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    calls: int  # logical calls begun (refused ones included)
    attempts: int  # requests actually sent
    retries: int  # attempts after the first of their call
    throttled_locally: int
    gave_up: dict[str, int]  # Stop value -> calls that ended with a retryable failure
    hosts: dict[str, HostStatistics]


class Engine:
    def __init__(
        self,
        config: RetryConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        wall_clock: Callable[[], float] = time.time,
        key_factory: Callable[[], str] | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.config = config or RetryConfig()
        self.backoff = Backoff(self.config.backoff_base_s, self.config.backoff_cap_s, self.config.backoff_multiplier)
        self.clock = clock
        self.rng = rng or random.Random()
        self.wall_clock = wall_clock
        self.key_factory = key_factory or (lambda: uuid.uuid4().hex)
        self.hooks = hooks or NULL_HOOKS
        self._lock = threading.Lock()
        self._hosts = HostTable(self.config)
        self._ids = itertools.count(1)
        self._calls = self._attempts = self._retries = self._throttled = 0
        self._gave_up: Counter[str] = Counter()
        self._last_now = 0.0  # for statistics() where the clock cannot be read

    # -- call lifecycle -------------------------------------------------------

    def begin(self, request: httpx.Request) -> Call:
        opts: CallOptions = request.extensions.get(EXTENSION) or DEFAULT_OPTIONS
        host = host_key(request.url)
        now = self._last_now = self.clock()
        last_failure = None
        with self._lock:
            self._calls += 1
            admission = self._hosts.admit(host, now, self.rng)
            if not admission.admitted:
                self._throttled += 1
                last_failure = self._hosts.get(host).last_failure
        if not admission.admitted:
            self.hooks.on_throttled(host, admission.probability)
            raise ThrottledLocally(host, admission.probability, last_reason=last_failure, request=request)
        for name, value in opts.headers():
            request.headers.setdefault(name, value)
        keyed = ensure_idempotency_key(request, opts, self.config.auto_idempotency_key, self.key_factory)
        budget_s = opts.deadline_s or signals.caller_timeout_s(request.headers) or self.config.deadline_s
        deadline = now + budget_s if budget_s is not None else None
        return Call(next(self._ids), host, request, deadline, keyed, now)

    def before_attempt(self, call: Call, request: httpx.Request) -> float | None:
        """Stamp the remaining budget on the request; returns it (seconds) or None."""
        call.attempts += 1
        call.signal = Signal.LOCAL_FAILURE  # until after_attempt says otherwise
        remaining = None
        if call.deadline is not None:
            remaining = call.deadline - self.clock()
            remaining_ms = int(remaining * 1000)
            if remaining_ms < 1:
                raise DeadlineExceeded(
                    f"{call.host}: deadline passed before attempt {call.attempts}",
                    request=request,
                    attempts=call.attempts - 1,
                )
            request.headers[wire.REQUEST_TIMEOUT_MS] = str(remaining_ms)
        timeout = remaining
        call.hint_s = None
        if call.deadline is None:
            call.hint_s = self._hint_for(call)
            if call.hint_s is not None:
                timeout = call.hint_s
        if timeout is not None:
            request.extensions["timeout"] = call.attempt_timeouts(timeout)
        elif call.attempts > 1:  # uncapped now: undo the previous attempt's cap
            request.extensions["timeout"] = dict(call.base_timeout)
        self.hooks.on_attempt(AttemptInfo(call.id, call.host, call.method, call.attempts, timeout))
        return remaining

    def _hint_for(self, call: Call) -> float | None:
        """The hint that may cut this attempt (no deadline set), with its retry paid up front; or None."""
        if call.attempts >= self.config.max_attempts:
            return None  # the last attempt: nothing could follow a cut
        if not may_retry(Signal.READ_TIMEOUT, method=call.method, keyed=call.keyed, replayable=call.replayable):
            return None
        now = self.clock()
        with self._lock:
            if not len(self._hosts.get(call.host).hints):
                return None  # this host never sent a hint: no body to look at
        kind = call.kind  # parses the body: outside the lock
        with self._lock:
            state = self._hosts.get(call.host)
            hint = state.hints.get(kind)
            caller_read = call.base_timeout.get("read")
            if hint is None or (caller_read is not None and hint >= caller_read):
                return None  # no hint for this kind, or the caller's own timeout comes first
            if not call.reserved:
                if state.budget.tokens(now) < 1.0:
                    return None  # a cut the budget could not pay a retry for would fail the call
                state.budget.try_withdraw(now)
                call.reserved = True
        return hint

    def after_attempt(self, call: Call, response: httpx.Response | None, exc: BaseException | None) -> None:
        if response is not None:
            call.signal = signals.classify_response(response.status_code, response.headers)
            # Only an outcome that may be retried needs its Retry-After (saves header scans).
            floor = None
            if call.signal is not Signal.ANSWERED:
                floor = signals.retry_after_s(response.headers, self.wall_clock())
            call.floor_s = floor or 0.0
            hint = signals.timeout_hint_s(response.headers)
            hint_key = signals.timeout_hint_key(response.headers) if hint is not None else ""
        else:
            call.signal = signals.classify_exception(exc) if exc is not None else Signal.LOCAL_FAILURE
            call.floor_s = 0.0
            hint, hint_key = None, ""
        verdict = THROTTLE[call.signal]
        cut_by_hint = call.signal is Signal.READ_TIMEOUT and call.hint_s is not None
        kind = call.kind if hint is not None or cut_by_hint else ""  # parses the body: outside the lock
        now = self.clock()
        with self._lock:
            self._attempts += 1
            state = self._hosts.get(call.host)
            if verdict is not Verdict.NEUTRAL:
                state.throttle.record(now, verdict is Verdict.ACCEPT)
            if verdict is Verdict.FAILURE:
                status = response.status_code if response is not None else None
                headers = response.headers if response is not None else None
                state.last_failure = signals.failure_name(status, headers, exc)
            if hint is not None:
                state.hints.learn(kind, hint_key, hint)
            elif cut_by_hint and call.hint_s is not None:
                # The hint cut this attempt off: the server got slower than the p99 the
                # hint came from. Back it off, as TCP doubles its retransmission timer
                # (RFC 6298 5.5), until a response brings a fresh one. Otherwise every
                # attempt is abandoned at the old p99 and nothing ever answers with a
                # newer hint.
                state.hints.back_off(kind, call.hint_s)
            if call.reserved and not cut_by_hint:
                state.budget.refund()  # it answered: the retry the hint paid for is not needed
                call.reserved = False

    # -- tenacity callables: retry_state.args is (call, request) --------------------

    def retry(self, rs: tenacity.RetryCallState) -> bool:
        call: Call = rs.args[0]
        if rs.outcome is not None and rs.outcome.failed and not isinstance(rs.outcome.exception(), Exception):
            return False  # cancellation, KeyboardInterrupt: never retried
        return may_retry(call.signal, method=call.method, keyed=call.keyed, replayable=call.replayable)

    def wait(self, rs: tenacity.RetryCallState) -> float:
        call: Call = rs.args[0]
        return self.backoff.delay(rs.attempt_number, self.rng, call.floor_s)

    def stop(self, rs: tenacity.RetryCallState) -> bool:
        call: Call = rs.args[0]
        call.stop = self._stop_reason(call, rs.attempt_number, rs.upcoming_sleep)
        return call.stop is not None

    def _stop_reason(self, call: Call, attempt_number: int, wait_s: float) -> Stop | None:
        if attempt_number >= self.config.max_attempts:
            return Stop.ATTEMPTS
        if wait_s > self.config.max_wait_s:
            return Stop.WAIT_TOO_LONG
        now = self.clock()
        if call.deadline is not None and now + wait_s >= call.deadline:
            return Stop.DEADLINE
        with self._lock:  # last: a token is spent only for a retry that will happen
            if call.reserved:  # the retry after a hint's cut was paid for before the attempt
                call.reserved = False
                granted = True
            else:
                granted = self._hosts.get(call.host).budget.try_withdraw(now)
            if granted:
                self._retries += 1
        return None if granted else Stop.BUDGET

    def retrying(self, rs: tenacity.RetryCallState) -> None:
        """tenacity `before_sleep=` (via the shells, which also close the response)."""
        call: Call = rs.args[0]
        self.hooks.on_retry(RetryInfo(call.id, call.host, call.attempts, call.signal.value, rs.upcoming_sleep))

    def give_up(self, rs: tenacity.RetryCallState) -> httpx.Response:
        """tenacity `retry_error_callback=`: a retryable outcome we stopped retrying."""
        call: Call = rs.args[0]
        assert rs.outcome is not None
        if not rs.outcome.failed:
            answer: httpx.Response = rs.outcome.result()
            return answer  # the caller sees the server's answer as it was
        exc = rs.outcome.exception()
        assert exc is not None  # failed
        request: httpx.Request = rs.args[1]
        if call.stop is Stop.DEADLINE:
            raise DeadlineExceeded(
                f"{call.host}: no time left to retry after {exc!r}",
                request=request,
                attempts=call.attempts,
            ) from exc
        if call.stop is Stop.BUDGET:
            raise RetryBudgetExhausted(
                f"{call.host}: retry budget exhausted after {exc!r}",
                request=request,
                last=exc,
                attempts=call.attempts,
            ) from exc
        raise exc

    def finish(self, call: Call, response: httpx.Response | None, exc: BaseException | None) -> None:
        outcome = str(response.status_code) if response is not None else type(exc).__name__
        summary = CallSummary(
            call.id,
            call.host,
            call.method,
            call.attempts,
            outcome,
            call.stop,
            self.clock() - call.started,
        )
        if call.stop is not None or call.reserved:
            with self._lock:
                if call.stop is not None:
                    self._gave_up[call.stop.value] += 1
                if call.reserved:  # reserved for a retry that never came
                    self._hosts.get(call.host).budget.refund()
                    call.reserved = False
        if response is not None:
            response.extensions[EXTENSION] = summary
        self.hooks.on_call(summary)

    # -- introspection --------------------------------------------------------

    def statistics(self) -> ClientStatistics:
        try:
            now = self.clock()
        except RuntimeError:  # anyio's clock outside an event loop: use the last time seen
            now = self._last_now
        with self._lock:
            return ClientStatistics(
                self._calls,
                self._attempts,
                self._retries,
                self._throttled,
                dict(self._gave_up),
                self._hosts.statistics(now),
            )

    def __repr__(self) -> str:
        return (
            f"<Engine calls={self._calls} attempts={self._attempts} retries={self._retries} "
            f"throttled={self._throttled} hosts={len(self._hosts)}>"
        )
