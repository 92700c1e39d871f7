"""Health-path discovery and the check backoff, pure: rounds of (path, answer) by hand."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.health import FIRST_RETRY_S, Answer, HealthDiscovery, Tried, answer_of, next_check_in

CANDIDATES = ("/health", "/healthz", "/v2/health/ready", "/ping", "/v1/models", "/models")


def t(path: str, status: int | None, detail: str | None = None) -> Tried:
    return Tried(path, detail or (str(status) if status is not None else "ConnectError"), answer_of(status))


def run_round(d: HealthDiscovery, answers: dict[str, int | None]) -> tuple[bool, list[str]]:
    """Drive one round the way probes.check_health does; unknown paths answer 404."""
    tried = []
    for path in d.paths():
        tried.append(t(path, answers.get(path, 404)))
        if not d.keep_going(tried[-1]):
            break
    return d.conclude(tried), [x.path for x in tried]


@pytest.mark.parametrize(
    "status, answer",
    [
        (200, Answer.OK),
        (204, Answer.OK),
        (404, Answer.ABSENT),
        (405, Answer.ABSENT),
        (401, Answer.ABSENT),
        (307, Answer.ABSENT),
        (501, Answer.ABSENT),
        (503, Answer.NOT_READY),
        (500, Answer.NOT_READY),
        (400, Answer.NOT_READY),  # KServe v2: "a 4xx status code indicates false"
        (None, Answer.DOWN),
    ],
)
def test_answers(status, answer):
    assert answer_of(status) is answer


def test_a_server_without_health_is_found_at_v1_models_and_then_asked_only_there():
    d = HealthDiscovery("", CANDIDATES)
    assert d.describe().startswith("health: not checked yet (will try /health, /healthz")
    ok, tried = run_round(d, {"/v1/models": 200})
    assert ok and tried == list(CANDIDATES[:5]) and d.found == "/v1/models"
    assert d.describe() == (
        "health /v1/models (discovered after /health 404, /healthz 404, /v2/health/ready 404, /ping 404)"
    )
    ok, tried = run_round(d, {"/v1/models": 200})
    assert ok and tried == ["/v1/models"]
    assert "discovered after /health 404" in d.describe()  # still says how it was found


def test_the_first_path_that_says_anything_decides_the_round():
    d = HealthDiscovery("", CANDIDATES)
    ok, tried = run_round(d, {"/healthz": 503, "/v1/models": 200})  # loading: /v1/models must not overrule
    assert not ok and tried == ["/health", "/healthz"] and d.found is None
    assert d.describe() == "health: tried /health 404, /healthz 503"
    ok, tried = run_round(d, {"/healthz": 200, "/v1/models": 200})
    assert ok and d.found == "/healthz"


def test_a_server_that_is_down_is_not_asked_every_path():
    d = HealthDiscovery("", CANDIDATES)
    ok, tried = run_round(d, {"/health": None})
    assert not ok and tried == ["/health"]
    assert d.describe() == "health: tried /health ConnectError"


def test_no_candidate_answers_says_what_to_set():
    d = HealthDiscovery("", CANDIDATES)
    ok, _ = run_round(d, {})
    assert not ok
    assert d.describe() == (
        "health: no 2xx from any of /health 404, /healthz 404, /v2/health/ready 404, /ping 404, /v1/models 404, "
        "/models 404; set warmup.health_path"
    )


def test_a_found_path_that_disappears_is_searched_for_again():
    d = HealthDiscovery("", CANDIDATES)
    run_round(d, {"/ping": 200})
    ok, tried = run_round(d, {"/ping": 503})  # restarting: keep asking it
    assert not ok and tried == ["/ping"] and d.found == "/ping"
    ok, tried = run_round(d, {"/health": 200})  # replaced by another server: /ping is 404 now
    assert not ok and tried == ["/ping"] and d.found is None
    ok, tried = run_round(d, {"/health": 200})
    assert ok and tried == ["/health"] and d.describe() == "health /health (discovered)"


def test_a_configured_path_is_the_only_one_ever_asked():
    d = HealthDiscovery("/status", CANDIDATES)
    ok, tried = run_round(d, {"/status": 404, "/health": 200})
    assert not ok and tried == ["/status"] and d.describe() == "health /status 404"
    ok, _ = run_round(d, {"/status": 200})
    assert ok and d.describe() == "health /status"


def test_misuse_is_loud():
    with pytest.raises(ValueError):
        HealthDiscovery("", ())
    with pytest.raises(ValueError):
        HealthDiscovery("", CANDIDATES).conclude([])


@given(
    st.dictionaries(st.sampled_from(CANDIDATES), st.sampled_from([200, 404, 405, 503, 400, None])),
    st.integers(1, 4),
)
def test_rounds_find_the_first_candidate_that_answers_2xx_past_absent_ones(answers, rounds):
    d = HealthDiscovery("", CANDIDATES)
    for _ in range(rounds):
        ok, tried = run_round(d, answers)
    first_decisive = next((p for p in CANDIDATES if answers.get(p, 404) not in (404, 405)), None)
    assert ok == (first_decisive is not None and answers[first_decisive] == 200)
    assert d.found == (first_decisive if ok else None)
    assert len(tried) <= len(CANDIDATES)


def test_backoff_while_not_in_service():
    assert next_check_in(0, 2.0) == 2.0
    delays = [next_check_in(k, 2.0) for k in range(1, 12)]
    assert delays[0] == FIRST_RETRY_S and delays == sorted(delays) and delays[-1] == 2.0
    assert sum(delays[:5]) < 1.5  # a model up after 1.2 s is seen by about 1.3 s, not at the next 2 s tick
    assert next_check_in(3, 0.05) == 0.05  # never slower than the policy's own interval
