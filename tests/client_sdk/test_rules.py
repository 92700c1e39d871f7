"""The retry decision table, row by row."""

from __future__ import annotations

import pytest

from client_sdk.rules import RULES, Rule, is_idempotent, may_retry
from client_sdk.signals import Signal

ALWAYS = {Signal.CONNECT_FAILED, Signal.REJECTED_RETRYABLE, Signal.REJECTED_BY_CALLER}
IF_SAFE = {
    Signal.READ_TIMEOUT,
    Signal.BROKEN_AFTER_SEND,
    Signal.GATEWAY_FAILED,
    Signal.OVERLOAD_UNQUALIFIED,
}


def test_every_signal_has_a_rule() -> None:
    assert set(RULES) == set(Signal)
    assert {s for s, r in RULES.items() if r is Rule.ALWAYS} == ALWAYS
    assert {s for s, r in RULES.items() if r is Rule.IF_SAFE} == IF_SAFE


@pytest.mark.parametrize("signal", list(Signal))
@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE", "head"])
@pytest.mark.parametrize("keyed", [False, True])
def test_table(signal: Signal, method: str, keyed: bool) -> None:
    want = signal in ALWAYS or (signal in IF_SAFE and (keyed or is_idempotent(method)))
    assert may_retry(signal, method=method, keyed=keyed, replayable=True) is want


@pytest.mark.parametrize("signal", list(Signal))
def test_a_body_that_cannot_be_replayed_is_never_retried(signal: Signal) -> None:
    assert may_retry(signal, method="GET", keyed=True, replayable=False) is False


def test_idempotent_methods_are_rfc_9110s() -> None:
    assert [
        m for m in ("GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE", "POST", "PATCH", "CONNECT") if is_idempotent(m)
    ] == ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"]
