"""Per-request outcomes, stored columnar in arrays (a few dozen bytes a request).

Theory of operation: the runner writes one row per request into a step's
`Records`: intended send time, actual send time, end time (all seconds from
the start of the run), status (0: no response), error kind, rejection reason,
shape index, time to first token and output token count for streams. Open-loop
steps preallocate their rows (the schedule says how many) and fill them by
index; closed-loop steps append. Percentiles are computed later, exactly, from
these rows (`stats.py`); nothing is aggregated on the hot path.

Rows that were never sent (the run was interrupted) keep error NOT_SENT.
`ReasonTable` interns `x-rampmeter-reason` values to small integers (0: none).
"""

from __future__ import annotations

import math
from array import array

OK, TIMEOUT, CONNECT_ERROR, PROTOCOL_ERROR, NON_JSON, NOT_SENT = range(6)
ERROR_NAMES = ("ok", "timeout", "connect_error", "protocol_error", "non_json", "not_sent")
NAN = math.nan


class ReasonTable:
    """x-rampmeter-reason values <-> small integers, shared by every step of a run."""

    __slots__ = ("_index", "names")

    def __init__(self) -> None:
        self.names: list[str] = [""]
        self._index: dict[bytes, int] = {}

    def index(self, value: bytes | None) -> int:
        if value is None:
            return 0
        i = self._index.get(value)
        if i is None:
            if len(self.names) >= 255:
                return 0  # a misbehaving target inventing reasons: stop interning
            i = self._index[value] = len(self.names)
            self.names.append(value.decode("latin-1"))
        return i

    def __repr__(self) -> str:
        return f"<ReasonTable {self.names[1:]}>"


class Records:
    """Columnar rows of one step (see the module doc)."""

    __slots__ = ("end", "error", "intended", "reason", "sent", "shape", "status", "tokens", "ttft")

    def __init__(self, n: int = 0) -> None:
        self.intended = array("d", bytes(8 * n))
        self.sent = array("d", bytes(8 * n))
        self.end = array("d", bytes(8 * n))
        self.ttft = array("d", [NAN]) * n
        self.tokens = array("I", bytes(4 * n))
        self.status = array("H", bytes(2 * n))
        self.error = array("B", [NOT_SENT]) * n
        self.reason = array("B", bytes(n))
        self.shape = array("H", bytes(2 * n))

    def append(self, intended: float, shape: int) -> int:
        """A new NOT_SENT row (closed loop); returns its index."""
        self.intended.append(intended)
        self.sent.append(intended)
        self.end.append(intended)
        self.ttft.append(NAN)
        self.tokens.append(0)
        self.status.append(0)
        self.error.append(NOT_SENT)
        self.reason.append(0)
        self.shape.append(shape)
        return len(self.intended) - 1

    def __len__(self) -> int:
        return len(self.intended)

    def latency(self, i: int) -> float:
        """Seconds from the intended send time to the end (response, timeout or error)."""
        return self.end[i] - self.intended[i]

    def statistics(self) -> dict[str, int]:
        counts = dict.fromkeys(ERROR_NAMES, 0)
        for e in self.error:
            counts[ERROR_NAMES[e]] += 1
        return counts

    def __repr__(self) -> str:
        return f"<Records {len(self)} rows {self.statistics()}>"


class StepRun:
    """What the runner hands to the analysis for one step: rows plus the sender's own health."""

    __slots__ = (
        "backlogged",
        "duration_s",
        "in_flight_cap",
        "index",
        "lateness",
        "load",
        "records",
        "start_s",
        "warmup_s",
    )

    def __init__(
        self,
        index: int,
        load: float,
        start_s: float,
        duration_s: float,
        warmup_s: float,
        records: Records,
        *,
        in_flight_cap: int = 0,
    ) -> None:
        self.index, self.load = index, load
        self.start_s, self.duration_s, self.warmup_s = start_s, duration_s, warmup_s
        self.records = records
        # Sender lateness samples, seconds: open loop, one per dispatch in the measured window
        # (actual - intended); closed loop, the event loop's oversleep on a 10 ms ticker.
        self.lateness = array("d")
        self.backlogged = 0  # requests that found every worker busy at the in-flight cap
        self.in_flight_cap = in_flight_cap

    @property
    def window(self) -> tuple[float, float]:
        """The measured window [start + warm-up, start + duration), run-relative seconds."""
        return self.start_s + self.warmup_s, self.start_s + self.duration_s

    def __repr__(self) -> str:
        return (
            f"<StepRun #{self.index} load={self.load:g} window={self.window[0]:.3f}-{self.window[1]:.3f}s "
            f"rows={len(self.records)} backlogged={self.backlogged}>"
        )
