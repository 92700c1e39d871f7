"""What requests that did not finish teach: a lower bound on service time per request shape.

Theory of operation: a request cut after t ms upstream (its deadline passed, its
client left) is a censored sample: its service time is more than t, by an
unknown amount. Completed requests alone teach a survivor's story: when a
backend is slower than the deadlines, nearly every request is cut, the few that
finish are the fast ones, and the model goes on calling every request meetable
(issue 12: 3-4 samples after 2,543 requests on an embeddings server, every
request forwarded, cut and computed anyway).

`CensoredFloors` keeps, per shape bucket (power-of-two prompt and requested
output tokens), a floor under the service model's estimate:

- censored(t) where t exceeds the model's prediction p (t <= p is what the model
  expects anyway: no news): the floor's *evidence* becomes the longest cut since
  the last completion, and the floor max(floor, t * (1 + INFLATE) ** k), k the
  steps of the search (at most MAX_STREAK). The service time is above t; how far
  above is unknown, so each further cut searches higher, geometrically, like a
  backoff. A step is taken only by a request that went upstream after the floor
  last rose (it was judged against that floor and still cut): the requests in
  flight when a backend slows down are cut together, one deadline apart from
  nothing, and teach one fact, not a search (round 1 on vLLM: 16 in flight cut at
  once took a 4 s floor to 14.6x, tens of minutes of fading). The estimate after
  the update is never below t.
- completed(ms): a finish inside the bucket ends the streak, and a finish below
  the floor pulls the floor down to it (the shape can take that little). A cut
  of a request that went upstream before the newest finished one did is older
  news than that finish and raises nothing (a backend that recovered answers
  its probe while the requests of its slow spell are still being cut).
- time, in the shape's own time scale: the search's inflation fades back to the
  evidence with a time constant of FADE_MULTIPLE times the evidence (the cut
  time), whatever the streak inflated it to (before: 5x the inflated floor, so a
  14.6x floor also faded 14.6x slower: 196 cut times back to its evidence where
  it now takes 13). The evidence itself (the first step, t * (1 + INFLATE): at
  the cut time exactly, a request with the same budget would be judged meetable)
  does not fade while no completion has come since it: a clock cannot tell a
  recovered backend from a slow one, and a fade below it let through, every few
  deadlines, every request that arrived until the next cut. A floor after a
  completion (streak 0) fades whole.
- probes, the floor's half-open state: a floor that rests on cuts alone would
  otherwise reject its shape for as long as it stands, even after the backend got
  faster (round 1: 48 of 48 long requests on vLLM, nothing let through that could
  show the floor stale). `probe(key, id, ...)` lets one request of the shape
  through as a probe when the floor alone condemns it (the floor is above its
  remaining budget, the model without the floor is not), at most one in flight
  per shape: the controller judges that ticket without the floor (`floor_ms`
  with its id answers 0). A probe that completes within its deadline pulls the
  floor down (completed); one that is cut is one more step of the search. The
  first probe waits one cut time after the cut that set the floor (the backend
  has just shown itself slow), each next one twice as long as the last while
  probes are cut in a row, at most PROBE_MAX_SPACING cut times: a backend that
  stays slow gets one doomed request per ~9 deadlines of its shape, and one that
  recovers is found within ~9 (main found it when the floor had faded). A
  granted probe that never reached the backend (turned away for another reason,
  or its client left) lapses at twice its budget.

Bounded: at most 48 x 48 buckets per route. Pure: `now` is an argument.
"""

from __future__ import annotations

import math
from typing import Any

INFLATE = 0.25  # a cut request is taken to need at least 25% more than it got
MAX_STREAK = 12  # 1.25 ** 12 ~ 14.6: the most one streak multiplies a cut time by
FADE_MULTIPLE = 5.0  # the inflation fades with a time constant of 5 x the evidence (the cut time)
PROBE_MAX_SPACING = 8.0  # the longest wait between probes, in cut times of the shape
# How much earlier than a probe's grant a cut request may have gone upstream and still be that
# probe: the controller grants at the ticket's `now` and the runtime measures the time upstream
# from the admission, read later on the same clock, so only float rounding separates them.
_SAME_TIME_S = 1e-6
_MAX_BIT = 47


def shape_bucket(prompt_tokens: int, requested_output_tokens: int) -> tuple[int, int]:
    """Power-of-two bucket of a request's shape (prompt, requested output)."""
    return (
        min(max(0, int(prompt_tokens)).bit_length(), _MAX_BIT),
        min(max(0, int(requested_output_tokens)).bit_length(), _MAX_BIT),
    )


class _Floor:
    __slots__ = (
        "at",
        "evidence",
        "failed",
        "ms",
        "next_probe",
        "probe",
        "probe_at",
        "probe_until",
        "raised",
        "settled",
        "streak",
    )

    def __init__(self) -> None:
        self.ms = 0.0  # the floor at `at`, inflation included
        self.at = 0.0
        self.evidence = 0.0  # the longest cut since the last completion (0: none); the shape's time scale
        self.streak = 0  # steps of the search since the last completion
        self.raised = -math.inf  # when the search last stepped
        self.probe = 0  # the ticket id of the probe in flight (0: none)
        self.probe_at = 0.0
        self.probe_until = 0.0  # a probe that never reached the backend lapses then (twice its budget)
        self.failed = 0  # probes cut in a row
        self.next_probe = -math.inf
        self.settled = -math.inf  # when the newest request that finished went upstream

    def value(self, now: float) -> float:
        if self.ms <= 0.0:
            return 0.0
        elapsed = max(0.0, now - self.at)
        if self.evidence <= 0.0:  # set by a completion: it fades whole, on its own scale
            return self.ms * math.exp(-elapsed * 1000.0 / (FADE_MULTIPLE * self.ms))
        faded = self.ms * math.exp(-elapsed * 1000.0 / (FADE_MULTIPLE * self.evidence))
        return max(self.evidence * (1.0 + INFLATE), faded)

    def probing(self, now: float) -> bool:
        return self.probe != 0 and now < self.probe_until


class CensoredFloors:
    __slots__ = ("_floors", "cuts", "informative", "probe_failures", "probes")

    def __init__(self) -> None:
        self._floors: dict[tuple[int, int], _Floor] = {}
        self.cuts = 0  # censored samples seen
        self.informative = 0  # of them, those longer than the model's prediction
        self.probes = 0  # probes granted
        self.probe_failures = 0  # of them, cut again

    def floor_ms(self, key: tuple[int, int], now: float, ticket_id: int = 0) -> float:
        """The floor for this shape at `now`; 0 for the probe `ticket_id` while it may run."""
        f = self._floors.get(key)
        if f is None:
            return 0.0
        if ticket_id and ticket_id == f.probe and f.probing(now):
            return 0.0
        return f.value(now)

    def probe(self, key: tuple[int, int], ticket_id: int, remaining_ms: float, estimate_ms: float, now: float) -> bool:
        """Whether ticket `ticket_id` (`remaining_ms` of budget; the model says `estimate_ms` without
        the floor) goes as the shape's probe; True grants it (judge it without the floor)."""
        f = self._floors.get(key)
        if f is None or f.streak == 0 or f.probing(now) or now < f.next_probe:
            return False  # no floor, one a completion set (not censored alone), a probe out, or too soon
        if not (estimate_ms <= remaining_ms < f.value(now)):
            return False  # the floor does not decide this one: it goes, or fails, without a probe
        # Out until twice its budget: its cut is released just after its deadline and must still count.
        f.probe, f.probe_at, f.probe_until = ticket_id, now, now + 2.0 * remaining_ms / 1000.0
        self.probes += 1
        return True

    def standing(self, key: tuple[int, int]) -> bool:
        """Whether a floor from cuts alone stands on this shape: its next answer is news it wants at once."""
        f = self._floors.get(key)
        return f is not None and f.streak > 0

    def censored(self, key: tuple[int, int], cut_ms: float, predicted_ms: float, now: float) -> bool:
        """A request of this shape was cut after `cut_ms`; True when it taught something."""
        self.cuts += 1
        if not (cut_ms > predicted_ms and math.isfinite(cut_ms)):
            return False
        f = self._floors.get(key)
        upstream_at = now - cut_ms / 1000.0
        if f is None:
            f = self._floors[key] = _Floor()
        elif upstream_at < f.settled:  # went upstream before a request that since finished: older news
            return False
        self.informative += 1
        current = f.value(now)
        if f.probing(now) and upstream_at >= f.probe_at - _SAME_TIME_S:  # the probe (or one after it) was cut
            f.probe = 0
            f.failed += 1
            self.probe_failures += 1
        if upstream_at >= f.raised - _SAME_TIME_S:  # judged against the floor it met (or none) and still cut
            f.streak = min(MAX_STREAK, f.streak + 1)
            f.raised = now
            # The next probe no sooner than one cut time on (the backend has just shown it slow), twice
            # that after each probe cut in a row, at most PROBE_MAX_SPACING cut times.
            f.next_probe = now + cut_ms / 1000.0 * min(PROBE_MAX_SPACING, 2.0**f.failed)
        f.evidence = max(f.evidence, cut_ms)
        f.ms = max(current, cut_ms * (1.0 + INFLATE) ** f.streak)
        f.at = now
        return True

    def completed(self, key: tuple[int, int], ms: float, now: float) -> None:
        f = self._floors.get(key)
        if f is None:
            return
        current = f.value(now)
        f.settled = max(f.settled, now - ms / 1000.0)
        f.streak, f.evidence, f.failed, f.probe, f.raised = 0, 0.0, 0, 0, -math.inf
        f.next_probe = -math.inf
        f.ms, f.at = min(current, ms), now  # the fade from here is whole, on its own scale
        if f.ms <= 0.0:
            del self._floors[key]

    def statistics(self, now: float) -> dict[str, Any]:
        return {
            "cuts": self.cuts,
            "informative": self.informative,
            "probes": self.probes,
            "probe_failures": self.probe_failures,
            "floors_ms": {f"{1 << p >> 1}/{1 << o >> 1}": f.value(now) for (p, o), f in self._floors.items()},
        }

    def __repr__(self) -> str:
        return (
            f"<CensoredFloors {len(self._floors)} buckets cuts={self.cuts} informative={self.informative}"
            f" probes={self.probes}>"
        )
