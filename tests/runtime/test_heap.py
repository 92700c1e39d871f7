"""proxy/http/heap.py: the start-up heap is frozen out of the GC's passes; cycles made later are still collected."""

from __future__ import annotations

import gc

from proxy.http import heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic GC frees it


def test_settle_freezes_the_startup_heap_and_spaces_the_young_passes():
    before = gc.get_threshold()
    startup = _Node()
    try:
        heap.settle()
        assert gc.get_threshold() == (heap.GEN0, heap.GEN1, heap.GEN2)
        assert gc.get_freeze_count() > 0
        tracked = {id(o) for o in gc.get_objects()}  # every generation but the permanent one
        assert id(startup) not in tracked  # frozen: no later pass walks it
        later = _Node()
        assert id(later) in {id(o) for o in gc.get_objects(generation=0)}
        del later
        assert gc.collect() >= 1  # garbage made after start-up is still collected
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
