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
"""

from __future__ import annotations

import gc

GEN0 = 5_000  # net container allocations between young passes (CPython's default: 700)
GEN1 = 10  # young passes per gen-1 pass (CPython's default; module doc: memory under attack)
GEN2 = 10  # gen-1 passes per full pass (CPython's default), which also waits for 25% growth of the old heap


def settle() -> None:
    """Freeze the start-up heap out of every later pass and space the young passes (module doc)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0, GEN1, GEN2)
