"""Reading outcomes: Retry-After in both forms, the sidecar's reason and hints."""

from __future__ import annotations

import email.utils

import httpx
import pytest

from client_sdk import wire
from client_sdk.signals import (
    Signal,
    caller_timeout_s,
    classify_exception,
    classify_response,
    retry_after_s,
    timeout_hint_s,
)

WALL = 1_700_000_000.0


def test_retry_after_in_seconds() -> None:
    assert retry_after_s({"retry-after": "3"}, WALL) == 3.0
    assert retry_after_s({"retry-after": " 0 "}, WALL) == 0.0


def test_retry_after_as_http_date_counts_from_the_wall_clock() -> None:
    date = email.utils.formatdate(WALL + 7, usegmt=True)
    assert retry_after_s({"retry-after": date}, WALL) == 7.0
    past = email.utils.formatdate(WALL - 60, usegmt=True)
    assert retry_after_s({"retry-after": past}, WALL) == 0.0


def test_rampmeter_milliseconds_win_over_retry_after() -> None:
    headers = {wire.RETRY_AFTER: "1", wire.RETRY_AFTER_MS: "250"}
    assert retry_after_s(headers, WALL) == 0.25


def test_plain_retry_after_ms_comes_after_rampmeters_and_before_retry_after() -> None:
    assert retry_after_s({wire.RETRY_AFTER: "1", wire.RETRY_AFTER_MS_PLAIN: "420"}, WALL) == 0.42
    both = {wire.RETRY_AFTER_MS: "250", wire.RETRY_AFTER_MS_PLAIN: "420", wire.RETRY_AFTER: "1"}
    assert retry_after_s(both, WALL) == 0.25


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf", "Mon, 99 Foo 2024"])
def test_malformed_retry_after_is_ignored(value: str) -> None:
    assert retry_after_s({"retry-after": value}, WALL) is None


def test_malformed_rampmeter_ms_falls_back_to_retry_after() -> None:
    assert retry_after_s({wire.RETRY_AFTER_MS: "x", wire.RETRY_AFTER: "2"}, WALL) == 2.0


def test_no_header_no_floor() -> None:
    assert retry_after_s({}, WALL) is None


def test_timeout_hint_and_caller_timeout() -> None:
    assert timeout_hint_s({wire.TIMEOUT_HINT_MS: "1500"}) == 1.5
    assert timeout_hint_s({wire.TIMEOUT_HINT_MS: "0"}) is None
    assert timeout_hint_s({wire.TIMEOUT_HINT_MS: "bad"}) is None
    assert caller_timeout_s({wire.REQUEST_TIMEOUT_MS: "2500"}) == 2.5
    assert caller_timeout_s({wire.REQUEST_TIMEOUT_MS: "-5"}) is None
    assert caller_timeout_s({}) is None


@pytest.mark.parametrize(
    ("status", "headers", "signal"),
    [
        (200, {}, Signal.ANSWERED),
        (500, {}, Signal.ANSWERED),
        (404, {}, Signal.ANSWERED),
        (503, {wire.REASON: "queue_full"}, Signal.REJECTED_RETRYABLE),
        (429, {wire.REASON: "tenant_quota", wire.RETRY_AFTER: "1"}, Signal.REJECTED_BY_CALLER),
        (409, {wire.REASON: "idempotency_key_in_flight", wire.RETRY_AFTER: "1"}, Signal.REJECTED_BY_CALLER),
        (503, {wire.REASON: "deadline_unmeetable", wire.RETRY_AFTER_MS: "800"}, Signal.REJECTED_BY_CALLER),
        (503, {wire.REASON: "deadline_unmeetable", wire.RETRY_AFTER: "1"}, Signal.REJECTED_BY_CALLER),
        (503, {wire.REASON: "deadline_unmeetable"}, Signal.REJECTED_UNMEETABLE),  # "raise your timeout"
        (504, {wire.REASON: "deadline_expired"}, Signal.DEADLINE_EXPIRED),
        (502, {wire.REASON: "upstream_unavailable"}, Signal.GATEWAY_FAILED),
        (504, {wire.REASON: "upstream_timeout"}, Signal.GATEWAY_FAILED),
        (422, {wire.REASON: "idempotency_key_reused"}, Signal.REJECTED_FINAL),
        (400, {wire.REASON: "bad_request"}, Signal.REJECTED_FINAL),
        (503, {wire.REASON: "from_a_newer_sidecar"}, Signal.REJECTED_FINAL),
        (502, {}, Signal.GATEWAY_FAILED),
        (504, {}, Signal.GATEWAY_FAILED),
        (503, {}, Signal.OVERLOAD_UNQUALIFIED),
        (429, {}, Signal.OVERLOAD_UNQUALIFIED),
        (429, {wire.SHOULD_RETRY: "false"}, Signal.ANSWERED),  # e.g. OpenAI's insufficient_quota
        (503, {wire.SHOULD_RETRY: "true"}, Signal.OVERLOAD_UNQUALIFIED),
        (200, {wire.REASON: "queue_full"}, Signal.ANSWERED),  # a reason only counts on an error
    ],
)
def test_classify_response(status: int, headers: dict[str, str], signal: Signal) -> None:
    assert classify_response(status, headers) is signal


@pytest.mark.parametrize(
    ("exc", "signal"),
    [
        (httpx.ConnectError, Signal.CONNECT_FAILED),
        (httpx.ConnectTimeout, Signal.CONNECT_FAILED),
        (httpx.ReadTimeout, Signal.READ_TIMEOUT),
        (httpx.WriteTimeout, Signal.BROKEN_AFTER_SEND),
        (httpx.ReadError, Signal.BROKEN_AFTER_SEND),
        (httpx.WriteError, Signal.BROKEN_AFTER_SEND),
        (httpx.RemoteProtocolError, Signal.BROKEN_AFTER_SEND),
        (httpx.PoolTimeout, Signal.LOCAL_FAILURE),
        (httpx.LocalProtocolError, Signal.LOCAL_FAILURE),
        (httpx.UnsupportedProtocol, Signal.LOCAL_FAILURE),
    ],
)
def test_classify_exception(exc: type[Exception], signal: Signal) -> None:
    assert classify_exception(exc("x")) is signal
    assert classify_exception(ValueError("not httpx")) is Signal.LOCAL_FAILURE
