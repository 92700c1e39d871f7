"""What a collection finds in reference cycles, and which of it is the data path's.

The garbage tests turn the collector off, run an attack, then collect once. A test worker
runs other test files before it (pytest-xdist `--dist loadfile`), and what they or a library
leave in cycles on first use (an import's failed attempt, a log handler's) would be found
too: CI once saw 6,135 such objects in two different tests, none of the proxy's. So a test
counts only cycles that hold a frame of the proxy's code (or of the test's own file), or an
object of the proxy's, h2's or hpack's types, and names every kind found either way.
"""

from __future__ import annotations

import gc
import types
from collections import Counter

OURS = ("proxy.", "h2.", "hpack.")


def collect_saving() -> list[object]:
    """One collection with what it finds kept (gc.DEBUG_SAVEALL), returned; gc.garbage is left empty."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
    finally:
        gc.set_debug(0)
        found, gc.garbage[:] = list(gc.garbage), []
    return found


def ours(found: list[object], test_file: str) -> list[str]:
    """The objects of `found` that are the data path's: its frames (or `test_file`'s), its types."""
    named = []
    for obj in found:
        if isinstance(obj, types.FrameType):
            name = obj.f_code.co_filename
            if "/proxy/" in name or name == test_file:
                named.append(f"{name}:{obj.f_code.co_name}")
        elif type(obj).__module__.startswith(OURS):
            named.append(f"{type(obj).__module__}.{type(obj).__qualname__}")
    return named


def kinds(found: list[object]) -> list[tuple[str, int]]:
    return Counter(type(o).__name__ for o in found).most_common(6)
