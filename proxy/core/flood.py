"""Flood budgets for one HTTP/2 connection: control frames against useful work, and client resets.

Theory of operation: a control frame (PING, SETTINGS, WINDOW_UPDATE, RST_STREAM,
PRIORITY, an empty DATA or HEADERS frame without END_STREAM, CONTINUATION, an unknown
frame type) costs the server as much CPU as a useful frame and does nothing for the
client that a handful could not. So each connection holds a budget of control frames,
a token bucket (`Allowance`):

- it starts full, at `burst` frames, and never holds more;
- it refills with time, `per_s` frames a second (keep-alive PINGs, the odd SETTINGS),
  and with useful work: every stream the client opens earns `per_stream` frames, and
  every DATA frame the server sends earns `per_data_frame` (the client's WINDOW_UPDATEs
  for it), the ratios Envoy uses (`max_inbound_priority_frames_per_stream` 100,
  `max_inbound_window_update_frames_per_data_frame_sent` 10);
- each control frame spends one; the frame that finds the bucket empty is a flood.

A client that sends control frames in proportion to its work, or slowly, never runs
out; one that floods is caught within `burst` frames of starting, however long it was
well-behaved before (credit never exceeds `burst`), which nghttp2's token buckets
(`max_outbound_ack` 1000, stream reset rate 1000 burst / 33 per s) also guarantee.

Rapid reset (CVE-2023-44487) has its own bucket: streams the client resets before
their response is complete, `resets_burst` at once and `resets_per_s` after. Useful
work earns nothing there: no amount of completed requests makes cancelling hundreds a
second affordable, since each cancelled request may already have cost an upstream.

Pure: time is the argument `now` (seconds, any monotonic clock); decisions are bools.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FloodLimits:
    control_burst: int = 1000
    control_per_s: float = 100.0
    per_stream: int = 100
    per_data_frame: int = 10
    resets_burst: int = 200
    resets_per_s: float = 33.0


class Allowance:
    """A token bucket that can also be topped up by earned credit; never above `burst`."""

    __slots__ = ("_tokens", "_updated", "burst", "per_s")

    def __init__(self, burst: float, per_s: float, now: float) -> None:
        if not (burst >= 1 and per_s >= 0):
            raise ValueError("need burst >= 1 and per_s >= 0")
        # Kept as given (ints, floats or Fractions), so a test can check the arithmetic exactly.
        self.burst, self.per_s = burst, per_s
        self._tokens, self._updated = burst, now

    def tokens(self, now: float) -> float:
        if now > self._updated:
            self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.per_s)
            self._updated = now
        return self._tokens

    def spend(self, now: float, n: int = 1) -> bool:
        """Take `n` tokens; False (nothing taken) when fewer are left: the flood."""
        if self.tokens(now) < n:
            return False
        self._tokens -= n
        return True

    def earn(self, n: float) -> None:
        self._tokens = min(self.burst, self._tokens + n)


class FloodBudget:
    """One connection's budgets. `control()` and `client_reset()` answer False on a flood."""

    __slots__ = ("_control", "_resets", "limits")

    def __init__(self, limits: FloodLimits, now: float) -> None:
        self.limits = limits
        self._control = Allowance(limits.control_burst, limits.control_per_s, now)
        self._resets = Allowance(limits.resets_burst, limits.resets_per_s, now)

    def control(self, now: float, frames: int = 1) -> bool:
        return self._control.spend(now, frames)

    def stream_opened(self) -> None:
        self._control.earn(self.limits.per_stream)

    def data_sent(self, frames: int = 1) -> None:
        self._control.earn(self.limits.per_data_frame * frames)

    def client_reset(self, now: float) -> bool:
        return self._resets.spend(now)

    def control_tokens(self, now: float) -> float:
        return self._control.tokens(now)
