"""Phantom leases: admission slots held for work an upstream does after the sidecar stopped waiting.

Theory of operation: many model servers keep computing a request after its client (here: the
sidecar) disconnects: non-streaming llama.cpp, LitServe, PyTriton, MLServer and most embeddings
servers (docs/admission.md lists what was measured). For them cutting a request at its deadline
frees nothing: the backend still owes the work, and a slot given to the next request only puts
two requests on a backend the limit says fits one. Issue 12 measured the result on an
embeddings server: every request forwarded, cut at 200 ms, computed anyway, the backend busy
18.8 s after the load stopped.

So a lease cut upstream on such a server becomes a `Phantom`: its units stay charged against
the upstream's limit until its expected remaining service time has passed (the service model's
estimate for its shape, which the cut itself just raised: proxy/core/censored.py). `Phantoms`
keeps them in a heap by end time; `due(now)` pops each one exactly once; `drop(i)` ends every
phantom on upstream i at once (it turned out to stop on cancel).

`CancelHabit` says whether upstream i keeps computing: the policy's `stops_on_cancel` (true:
never a phantom; false: always), or with "auto" learned from the engine's own gauges (vLLM's
num_requests_running + num_requests_waiting): right after a cut, while a phantom is young (in
the first half of its expected remaining time, so it should still be running if the server
kept it), an engine that shows no more requests than the sidecar's live leases has dropped the
cut ones (evidence: stops), one that shows them all is still computing them (evidence: keeps).
EVIDENCE_RUN consistent readings decide. Until then, and for ever without gauges, "auto"
assumes the server keeps computing: holding a slot too long costs a little throughput once per
cut, releasing it too early is what caused the collapse.

Pure: `now` is an argument.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

    from proxy.core.decisions import Lease


EVIDENCE_RUN = 2  # consistent engine readings that decide "auto"
KEEPS, STOPS, UNKNOWN = "keeps_computing", "stops", "unknown"


@dataclass(frozen=True, slots=True)
class Phantom:
    lease: Lease
    charge: int
    started_at: float
    end_at: float
    remaining_ms: float


class Phantoms:
    __slots__ = ("_heap", "live", "ended")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Phantom]] = []
        self.live: dict[int, Phantom] = {}  # lease id -> phantom
        self.ended = 0

    def __len__(self) -> int:
        return len(self.live)

    def __iter__(self) -> Iterator[Phantom]:
        return iter(list(self.live.values()))

    def add(self, lease: Lease, charge: int, now: float, remaining_ms: float) -> Phantom:
        if lease.id in self.live:
            raise ValueError(f"lease {lease.id} is already a phantom")
        p = Phantom(lease, charge, now, now + remaining_ms / 1000.0, remaining_ms)
        self.live[lease.id] = p
        heapq.heappush(self._heap, (p.end_at, lease.id, p))
        return p

    def due(self, now: float) -> list[Phantom]:
        """Phantoms whose time is up, each returned exactly once."""
        out: list[Phantom] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, lease_id, p = heapq.heappop(heap)
            if self.live.get(lease_id) is p:
                del self.live[lease_id]
                out.append(p)
        self.ended += len(out)
        return out

    def drop(self, upstream: int) -> list[Phantom]:
        """End every phantom on `upstream` now (lazy in the heap)."""
        out = [p for p in self.live.values() if p.lease.upstream == upstream]
        for p in out:
            del self.live[p.lease.id]
        self.ended += len(out)
        return out

    def next_end(self) -> float | None:
        heap = self._heap
        while heap and self.live.get(heap[0][1]) is not heap[0][2]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def on(self, upstream: int) -> list[Phantom]:
        return [p for p in self.live.values() if p.lease.upstream == upstream]

    def statistics(self, now: float) -> dict[str, Any]:
        return {
            "live": len(self.live),
            "ended": self.ended,
            "held_ms": sum(max(0.0, p.end_at - now) * 1000.0 for p in self.live.values()),
        }


class CancelHabit:
    """Whether one upstream keeps computing after a disconnect (see the module docstring)."""

    __slots__ = ("_run", "_seen", "setting", "state")

    def __init__(self, setting: bool | str) -> None:
        self.setting = setting
        self.state = STOPS if setting is True else KEEPS if setting is False else UNKNOWN
        self._seen = ""  # the evidence of the current run
        self._run = 0

    @property
    def keeps_computing(self) -> bool:
        """Hold phantoms? ("auto" until learned: yes)"""
        return self.state != STOPS

    @property
    def known_to_keep_computing(self) -> bool:
        """Said so (false) or learned: worth letting a request finish past its deadline for."""
        return self.state == KEEPS

    def observe_engine(self, engine_active: float, live_leases: int, phantoms: list[Phantom], now: float) -> bool:
        """One reading of the engine's requests (running + waiting); True when it decided "stops"."""
        if self.setting != "auto" or self.state != UNKNOWN:
            return False
        young = sum(1 for p in phantoms if now < p.started_at + (p.end_at - p.started_at) / 2.0)
        if not young:
            return False
        if engine_active <= live_leases:
            evidence = STOPS
        elif engine_active >= live_leases + young:
            evidence = KEEPS
        else:
            return False
        self._run = self._run + 1 if evidence == self._seen else 1
        self._seen = evidence
        if self._run >= EVIDENCE_RUN:
            self.state = evidence
            return evidence == STOPS
        return False

    def __repr__(self) -> str:
        return f"<CancelHabit {self.setting!r} {self.state}>"
