"""Waiting, under trio's autojump clock, for work done in a worker thread.

The autojump clock does not wait for threads: virtual time races ahead while the
thread waits for a CPU (on a busy 2-core machine, a fail_after(600) in virtual time
ran out before one file read). So poll in virtual steps but bound in real time, and
give the thread real time on each step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import trio


async def poll_until(condition: Callable[[], object], step_s: float, real_s: float = 30.0) -> None:
    give_up = time.monotonic() + real_s
    while not condition():
        assert time.monotonic() < give_up, f"no progress in {real_s} s of real time"
        await trio.sleep(step_s)
        await trio.to_thread.run_sync(time.sleep, 0.002)
