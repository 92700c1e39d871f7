"""What a suspension costs by the depth of the coroutine stack it happens under: one trio task awaiting
`trio.lowlevel.checkpoint()` N times through D nested `async def` layers (each a plain `return await
inner(...)`), CPU us per checkpoint; D = 1, 2, 4, 8, 16, alternated, medians of REPEATS.

    python bench/results/2026-12-05-s33/scripts/depth.py [REPEATS]
"""
import statistics
import sys
import time

import trio


async def leaf() -> int:
    await trio.lowlevel.checkpoint()
    return 1


def nest(depth: int):
    f = leaf
    for _ in range(depth - 1):
        def make(inner):
            async def layer() -> int:
                return await inner()
            return layer
        f = make(f)
    return f


async def main(repeats: int) -> None:
    depths = (1, 2, 4, 8, 16)
    n = 50_000
    out = {d: [] for d in depths}
    for r in range(repeats):
        for d in depths if r % 2 == 0 else depths[::-1]:
            f = nest(d)
            t0 = time.process_time()
            for _ in range(n):
                await f()
            out[d].append((time.process_time() - t0) / n * 1e6)
    base = statistics.median(out[1])
    for d in depths:
        m = statistics.median(out[d])
        print(f"depth {d:2d}: {m:.2f} us a checkpoint ({(m - base) / max(1, d - 1):.3f} us a layer over depth 1)")


trio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 5)
