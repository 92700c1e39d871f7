"""The SDK and the sidecar agree on the wire contract, name for name.

client_sdk keeps its own copy (it must not import the proxy); this test is
what keeps the copy honest: header names, reason names, reason -> status, which
reasons invite a retry, and that the SDK reads what the sidecar's `rejection()`
actually sends.
"""

from __future__ import annotations

import httpx
import pytest

from client_sdk import wire as sdk
from client_sdk.rules import may_retry
from client_sdk.signals import Signal, classify_response, retry_after_s
from proxy.core import wire as proxy

HEADER_NAMES = (
    "PRIORITY",
    "REQUEST_TIMEOUT_MS",
    "GRPC_TIMEOUT",
    "IDEMPOTENCY_KEY",
    "COST_HINT",
    "TENANT",
    "QUEUE_MS",
    "TIMEOUT_HINT_MS",
    "IDEMPOTENT_REPLAYED",
    "RETRY_AFTER",
    "RETRY_AFTER_MS",
    "REASON",
    "TIMEOUT_HINT_KEY",
    "RETRY_AFTER_MS_PLAIN",
    "SHOULD_RETRY",
    "REQUEST_ID",
    "SERVED_CLASS",
)


@pytest.mark.parametrize("name", HEADER_NAMES)
def test_every_header_name_agrees(name: str) -> None:
    assert getattr(sdk, name) == getattr(proxy, name)


def test_header_lists_and_constants_agree() -> None:
    assert sdk.REQUEST_HEADERS == proxy.REQUEST_HEADERS
    assert sdk.RESPONSE_HEADERS == proxy.RESPONSE_HEADERS
    assert set(sdk.REQUEST_HEADERS + sdk.RESPONSE_HEADERS) == {getattr(sdk, n) for n in HEADER_NAMES}
    assert sdk.ERROR_TYPE == proxy.ERROR_TYPE
    assert sdk.MAX_IDEMPOTENCY_KEY_LEN == proxy.MAX_IDEMPOTENCY_KEY_LEN


def test_every_reason_name_and_value_agrees() -> None:
    assert {r.name: r.value for r in sdk.Reason} == {r.name: r.value for r in proxy.Reason}


def test_reason_to_status_agrees() -> None:
    assert {r.value: s for r, s in sdk.STATUS_FOR_REASON.items()} == {
        r.value: s for r, s in proxy.STATUS_FOR_REASON.items()
    }
    assert set(sdk.STATUS_FOR_REASON) == set(sdk.Reason)


def test_the_reasons_that_invite_a_retry_agree() -> None:
    assert {r.value for r in sdk.RETRYABLE_REASONS} == {r.value for r in proxy.RETRYABLE_REASONS}
    assert {r.value for r in proxy.RETRYABLE_REASONS} == sdk.RETRYABLE_REASON_NAMES


@pytest.mark.parametrize("reason", list(proxy.Reason), ids=[r.value for r in proxy.Reason])
def test_the_sdk_reads_the_sidecars_rejection_as_the_contract_says(reason: proxy.Reason) -> None:
    status, raw_headers, _ = proxy.rejection(reason, "msg", retry_after_ms=1250)
    headers = {k.decode(): v.decode() for k, v in raw_headers}
    signal = classify_response(status, headers)
    assert retry_after_s(headers, wall_now=0.0) == 1.25
    # A POST without a key may be retried exactly when the sidecar says it was not run.
    retried = may_retry(signal, method="POST", keyed=False, replayable=True)
    assert retried is (reason in proxy.RETRYABLE_REASONS)
    if reason is proxy.Reason.DEADLINE_EXPIRED:
        assert signal is Signal.DEADLINE_EXPIRED


# --- plain clients: the OpenAI SDK's own retry code reads what rejection() sends ------------


@pytest.fixture(scope="module")
def openai_client():
    import openai  # a dev dependency (make setup); only these tests need it
    from openai._models import FinalRequestOptions

    client = openai.OpenAI(api_key="unused", base_url="http://pod.test/v1")  # no request is sent
    return client, FinalRequestOptions.construct(method="post", url="/chat/completions")


def as_response(status: int, raw_headers: list[tuple[bytes, bytes]]) -> httpx.Response:
    return httpx.Response(status, headers=[(k.decode(), v.decode()) for k, v in raw_headers])


@pytest.mark.parametrize("reason", list(proxy.Reason), ids=[r.value for r in proxy.Reason])
def test_the_openai_sdk_waits_the_exact_jittered_retry_after_and_retries(openai_client, reason) -> None:
    client, options = openai_client
    status, headers, _ = proxy.rejection(reason, "msg", retry_after_ms=2417)
    response = as_response(status, headers)
    assert client._should_retry(response) is True
    # retry-after-ms, not the whole seconds of retry-after (3): the sidecar's jitter survives.
    assert client._calculate_retry_timeout(2, options, response.headers) == pytest.approx(2.417)


@pytest.mark.parametrize("reason", list(proxy.Reason), ids=[r.value for r in proxy.Reason])
def test_the_openai_sdk_does_not_retry_what_a_retry_cannot_fix(openai_client, reason) -> None:
    client, _ = openai_client
    status, headers, _ = proxy.rejection(reason, "msg")
    upstream = reason in (proxy.Reason.UPSTREAM_UNAVAILABLE, proxy.Reason.UPSTREAM_TIMEOUT)
    # The upstream reasons carry no x-should-retry: the SDK's own rule (>= 500: retry) applies.
    assert client._should_retry(as_response(status, headers)) is upstream


@pytest.mark.parametrize("retry_after_ms", [None, 1250])
@pytest.mark.parametrize("reason", list(proxy.Reason), ids=[r.value for r in proxy.Reason])
def test_the_sdk_test_fakes_send_what_the_sidecar_sends(reason: proxy.Reason, retry_after_ms: int | None) -> None:
    from tests.client_sdk.fakes import rejection_headers

    _, raw_headers, _ = proxy.rejection(reason, "msg", retry_after_ms=retry_after_ms)
    assert rejection_headers(sdk.Reason(reason.value), retry_after_ms) == {
        k.decode(): v.decode() for k, v in raw_headers
    }


# The rejections the sidecar sends without Retry-After: every reason that invites no retry, and
# deadline_unmeetable when the service time alone exceeds the budget. (The load reasons always
# carry one: docs/rejections.md.)
WITHOUT_RETRY_AFTER = [r for r in proxy.Reason if r not in proxy.RETRYABLE_REASONS] + [proxy.Reason.DEADLINE_UNMEETABLE]


@pytest.mark.parametrize("reason", WITHOUT_RETRY_AFTER, ids=[r.value for r in WITHOUT_RETRY_AFTER])
def test_what_the_sidecar_calls_final_the_sdk_does_not_retry(reason: proxy.Reason) -> None:
    status, raw_headers, _ = proxy.rejection(reason, "msg")
    headers = {k.decode(): v.decode() for k, v in raw_headers}
    retried = may_retry(classify_response(status, headers), method="GET", keyed=True, replayable=True)
    # Retried (a keyed GET) only where the sidecar leaves it to the client: the upstream reasons.
    assert retried is (headers.get(proxy.SHOULD_RETRY) is None)
