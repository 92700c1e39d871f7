"""Which health path a model server answers, and how soon to ask again.

Theory of operation: servers disagree on where they say they are up (vLLM,
LitServe and llama.cpp `/health`, Kubernetes-minded ones `/healthz`, Triton and
MLServer `/v2/health/ready`, SageMaker-style `/ping`), and some have none at
all (a llama.cpp-style server whose `/health` is 404 was "not ready" for ever).
With `warmup.health_path` set, that path is the health check. Unset, a
`HealthDiscovery` finds one: each check is a *round* that tries the candidate
paths in order (`warmup.health_candidates`, ending with a cheap `GET /v1/models`)
and stops at the first answer that says anything about health:

- 2xx (`OK`): healthy; the path is adopted, and later rounds ask only it;
- another 4xx or a 5xx (`NOT_READY`): the path exists and says "not yet" (a
  loading vLLM answers 503, Triton's v2 endpoints a 4xx): unhealthy, and no
  later candidate is asked (a `/v1/models` that answers while the model loads
  must not overrule it);
- 404, 405, 410, 501, 401, 403 or a redirect (`ABSENT`): not a health endpoint
  here (or not ours to use): try the next candidate;
- no answer (`DOWN`: refused, reset, timed out): the server is not up; asking
  the other paths would only wait again.

An adopted path that later answers ABSENT is dropped (the server was replaced
by another kind), so the next round searches again. `describe()` says what was
tried and what answered, for /readyz and not_ready rejections.

`next_check_in(failures, interval_s)`: while an upstream is not up, health
checks back off from FIRST_RETRY_S by BACKOFF up to the policy's interval, so a
model that is up 1.2 s after start is seen within a fraction of a second instead
of at the next 2 s tick; an upstream in service keeps the plain interval (its
`unhealthy_after` count means checks at that interval).

Pure: the caller sends the requests and reads the clock.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

FIRST_RETRY_S = 0.1
BACKOFF = 1.5
_ABSENT = frozenset({401, 403, 404, 405, 410, 501})


class Answer(enum.Enum):
    OK = "ok"
    NOT_READY = "not_ready"
    ABSENT = "absent"
    DOWN = "down"


def answer_of(status: int | None) -> Answer:
    """What one health GET says; `status` None: no HTTP answer at all."""
    if status is None:
        return Answer.DOWN
    if 200 <= status < 300:
        return Answer.OK
    if status in _ABSENT or 300 <= status < 400:
        return Answer.ABSENT
    return Answer.NOT_READY


@dataclass(frozen=True)
class Tried:
    path: str
    detail: str  # "200", "404", "timeout", "ConnectError: ..."
    answer: Answer

    def __str__(self) -> str:
        return f"{self.path} {self.detail}"


class HealthDiscovery:
    """The health path of one upstream: configured, or found by trying candidates."""

    def __init__(self, configured: str, candidates: Sequence[str]) -> None:
        if not configured and not candidates:
            raise ValueError("no health path configured and no candidates to discover one")
        self.configured = configured
        self.candidates = tuple(candidates)
        self.found: str | None = configured or None
        self.last_round: tuple[Tried, ...] = ()
        self._passed_over: tuple[Tried, ...] = ()  # what answered ABSENT in the round that found `found`

    def __repr__(self) -> str:
        return f"<HealthDiscovery {self.describe()}>"

    def paths(self) -> tuple[str, ...]:
        """The paths this round may try, in order."""
        return (self.found,) if self.found else self.candidates

    def keep_going(self, tried: Tried) -> bool:
        """After one answer: whether to try the next path of this round."""
        return tried.answer is Answer.ABSENT and self.found is None

    def conclude(self, tried: Sequence[Tried]) -> bool:
        """Record one round's answers (in order); True when the upstream is healthy."""
        if not tried:
            raise ValueError("a health round tries at least one path")
        self.last_round = tuple(tried)
        last = tried[-1]
        if self.configured:
            return last.answer is Answer.OK
        if last.answer is Answer.OK:
            if self.found is None:
                self.found, self._passed_over = last.path, self.last_round[:-1]
            return True
        if self.found is not None and last.answer is Answer.ABSENT:
            self.found, self._passed_over = None, ()  # gone: search again next round
        return False

    @property
    def healthy(self) -> bool:
        return bool(self.last_round) and self.last_round[-1].answer is Answer.OK

    def describe(self) -> str:
        """One line: the health path in use and how it was chosen, or what was tried and answered."""
        if self.healthy or not self.last_round:
            if self.configured:
                return f"health {self.configured}"
            if self.found is None:
                return f"health: not checked yet (will try {', '.join(self.candidates)})"
            over = ", ".join(map(str, self._passed_over))
            return f"health {self.found} (discovered{f' after {over}' if over else ''})"
        tried = ", ".join(map(str, self.last_round))
        if self.configured:
            return f"health {tried}"
        if all(t.answer is Answer.ABSENT for t in self.last_round):
            return f"health: no 2xx from any of {tried}; set warmup.health_path"
        return f"health: tried {tried}"


def next_check_in(failures: int, interval_s: float) -> float:
    """Seconds to the next health check after `failures` failed checks in a row of an upstream not in service."""
    if failures <= 0:
        return interval_s
    return min(interval_s, FIRST_RETRY_S * BACKOFF ** (failures - 1))
