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
still collected, only later: at most ~GEN0 container objects of it wait for a pass.
"""

from __future__ import annotations

import gc

GEN0 = 5_000  # net container allocations between young passes (CPython's default: 700)
GEN1 = 20  # young passes per gen-1 pass (default 10)
GEN2 = 50  # gen-1 passes per full pass, which also waits for 25% growth of the old heap (default 10)


def settle() -> None:
    """Freeze the start-up heap out of every later pass and space the young passes (module doc)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0, GEN1, GEN2)
