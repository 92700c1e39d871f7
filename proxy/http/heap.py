"""The cyclic garbage collector's settings for a process that serves the data path.

Theory of operation: CPython's cyclic GC runs a young-generation pass every 700 net
allocations of container objects (3.11's default threshold), and every pass walks every
object of the generations it collects. On the data path a request is a few dozen such
objects that live as long as the request (coroutine frames, the request, its headers,
the h2 stream): with a hundred requests in flight most of them are alive at a pass, so they
are promoted, and the older generations fill with objects that refcounting frees soon after.
Measured on the h2c path (bench/overhead, `rampmeter serve`, py-spy and gc callbacks): a
gen-0 pass every ~13 requests, a gen-1 pass (~7 ms CPU) every ~130 and a full pass over the
whole ~50,000-object heap (60-90 ms CPU) every ~1,500: ~85 us of GC per request, and the
full passes were the h2c added-p99 outliers (tens of ms at 1000 req/s).

`settle()`, called once start-up is done (policy loaded, listeners bound, every module
imported): one full collection, then `gc.freeze()` moves what survives (the code, the
policy, the tables: everything built once) into the permanent generation, which later
passes never walk; and a larger young threshold (GEN0) lets most of a request's objects
die by refcount before a pass sees them. A pass then walks a few thousand young objects
(~1-3 ms CPU on a busy machine) about once per thousand requests. Garbage in cycles is
still collected, only later.

The older generations keep CPython's default spacing (10 and 10): cyclic garbage that
outlived a young pass (a connection held for seconds, then closed) waits for a pass of
its own generation, and with gen-1 every 20 young passes and a full pass every 50 gen-1
passes it waited long enough to matter: under bench.attacks' stalled_bodies (4,400
connections held, ~300 closed per second) peak RSS was 269 MiB against 143 MiB with the
defaults, past issue 13's 256 MiB bound. The frozen start-up heap is what made full passes
expensive, and it stays frozen either way.

Sweeps in a connection flood (`accepted()`, after each accept, once the process has
settled). Young passes are triggered by *net* allocations, and a client that keeps every
connection slot full (a stalled-body flood: each eviction frees a connection's ~60
tracked objects as its replacement makes as many) keeps that count flat while the young
list grows with the replacements: bench.attacks' stalled_bodies saw a young pass every
~2.5 s walking ~90,000 objects, 37-69 ms in which nothing else ran, and bad_targets
(connections opened and dropped by the thousand) young passes of up to 76 ms: each
attack's normal-load p99. So every SWEEP_ACCEPTS accepts the server runs a young and
middle pass itself, over the few thousand objects made since the last one, and then
freezes what survived: a connection held for seconds is walked once, not at every pass
until it closes. Frozen objects are still freed by reference counting, which is how a
connection's objects go (the tests/security/*_leave_no_garbage tests hold the paths an
attacker drives to that); cyclic garbage frozen before it died waits for a reclaim:
when the frozen count has grown past its size after the last reclaim (or settle) by that
size or RECLAIM_FLOOR, whichever is more, one full pass over everything (unfreeze,
collect, freeze), logged. Accepts count only while SWEEP_MIN_OPEN connections are open,
so neither keep-alive clients nor a client opening a connection per request (a few open at a
time) trigger a sweep. Measured with
bench.attacks (one pair each, normal-load p99 under attack, before / after): stalled_bodies
29 -> 12 ms (no collector pass over 2 ms left), bad_targets 15 -> 10 ms; rapid_reset had
no long pass to remove (its tail is CPU: docs/security.md).
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("rampmeter.heap")

GEN0 = 5_000  # net container allocations between young passes (CPython's default: 700)
GEN1 = 10  # young passes per gen-1 pass (CPython's default; module doc: memory under attack)
GEN2 = 10  # gen-1 passes per full pass (CPython's default), which also waits for 25% growth of the old heap


# Accepted connections between sweeps: ~60 tracked objects each (a held HTTP/1.1 connection: its task,
# 11 coroutines, cancel scopes, parser, socket), so a sweep walks a few thousand young objects (~0.1-1 ms).
SWEEP_ACCEPTS = 64
# Accepts count only while at least this many connections are open: a flood holds thousands, and with few
# open a young pass is short anyway, so ordinary traffic keeps CPython's own collection (nothing of a
# request in flight frozen) even from a client that opens a connection per request. (Its CPU was within
# noise either way: wrk -c20 with `Connection: close`, ~3,000 req/s: 317-331 us a request on the parent,
# 327-335 sweeping 47 times a second, 330-334 with this gate.)
SWEEP_MIN_OPEN = 128
# Between reads of the frozen count, at most this often and only at a sweep: gc.get_freeze_count() walks the
# frozen list, pointer after pointer, and under stalled_bodies (~310,000 frozen) that took 33-41 ms, the
# same pause the sweeps remove, when it ran every 32 sweeps (~3.5 s). Once a minute, the leak it bounds
# waits a minute longer at most.
CHECK_EVERY_S = 60.0
# Frozen objects past the last reclaim's count before a full pass (~150 per connection at 4,096 connections).
RECLAIM_FLOOR = 600_000


class _Sweeps:
    """The process's sweep state (the collector is process-wide): off until `settle()`."""

    def __init__(self) -> None:
        self.on = False
        self.accepts = 0  # since the last sweep
        self.sweeps = 0
        self.reclaims = 0
        self.base = 0  # frozen objects after settle or the last reclaim
        self.checked_at = 0.0  # time.monotonic() of the last read of the frozen count


SWEEPS = _Sweeps()


def statistics() -> dict[str, int]:
    """For /admin/stats: sweeps run, full reclaims, frozen objects after start-up or the last reclaim."""
    return {"sweeps": SWEEPS.sweeps, "reclaims": SWEEPS.reclaims, "frozen_base": SWEEPS.base}


def settle() -> None:
    """Freeze the start-up heap out of every later pass and space the young passes (module doc)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0, GEN1, GEN2)
    SWEEPS.on, SWEEPS.accepts, SWEEPS.base = True, 0, gc.get_freeze_count()
    SWEEPS.checked_at = time.monotonic()


def accepted(open_connections: int) -> None:
    """One connection accepted, `open_connections` now open: every SWEEP_ACCEPTS accepts made with at least
    SWEEP_MIN_OPEN open, a sweep (module doc). Nothing before `settle()`."""
    state = SWEEPS
    if state.on and open_connections >= SWEEP_MIN_OPEN:
        state.accepts += 1
        if state.accepts >= SWEEP_ACCEPTS:
            sweep()


def sweep() -> None:
    """A young and middle pass (the cycles among what is young die here, not frozen), then freeze the rest."""
    state = SWEEPS
    state.accepts = 0
    state.sweeps += 1
    gc.collect(1)
    gc.freeze()
    now = time.monotonic()
    if now - state.checked_at >= CHECK_EVERY_S:
        state.checked_at = now
        frozen = gc.get_freeze_count()
        if frozen > state.base + max(state.base, RECLAIM_FLOOR):
            reclaim(frozen)


def reclaim(frozen: int) -> None:
    """One full pass over everything frozen since start-up (module doc), then freeze again."""
    state = SWEEPS
    gc.unfreeze()
    freed = gc.collect()
    gc.freeze()
    state.base = gc.get_freeze_count()
    state.reclaims += 1
    log.info("gc reclaim: %d objects were frozen; a full pass freed %d, %d kept", frozen, freed, state.base)
