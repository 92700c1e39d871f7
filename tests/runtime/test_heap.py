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


class _Box:
    """A plain tracked object with no cycle: reference counting frees it."""


def _settled_then_restored(monkeypatch):
    before = gc.get_threshold()
    monkeypatch.setattr(heap, "SWEEPS", heap._Sweeps())
    heap.settle()
    return before


def _restore(before) -> None:
    gc.unfreeze()
    gc.set_threshold(*before)


def test_accepts_with_few_connections_open_do_not_sweep(monkeypatch):
    """A client opening a connection per request keeps a few open: its traffic keeps CPython's own passes."""
    before = _settled_then_restored(monkeypatch)
    try:
        for _ in range(3 * heap.SWEEP_ACCEPTS):
            heap.accepted(heap.SWEEP_MIN_OPEN - 1)
        assert heap.SWEEPS.sweeps == 0
        for _ in range(heap.SWEEP_ACCEPTS):
            heap.accepted(heap.SWEEP_MIN_OPEN)
        assert heap.SWEEPS.sweeps == 1
    finally:
        _restore(before)


def test_accepts_do_nothing_until_the_process_has_settled(monkeypatch):
    monkeypatch.setattr(heap, "SWEEPS", heap._Sweeps())
    for _ in range(3 * heap.SWEEP_ACCEPTS):
        heap.accepted(heap.SWEEP_MIN_OPEN)
    assert heap.SWEEPS.sweeps == 0  # a test's in-process server never freezes the test's heap


def test_a_sweep_every_sweep_accepts_freezes_survivors_and_collects_young_cycles(monkeypatch):
    import weakref

    before = _settled_then_restored(monkeypatch)
    try:
        held = _Box()  # a connection's object, alive across the sweep
        cycle = _Node()
        dead = weakref.ref(cycle)
        del cycle  # young cyclic garbage: collected by the sweep, never frozen
        for _ in range(heap.SWEEP_ACCEPTS - 1):
            heap.accepted(heap.SWEEP_MIN_OPEN)
        assert heap.SWEEPS.sweeps == 0 and dead() is not None
        heap.accepted(heap.SWEEP_MIN_OPEN)
        assert heap.SWEEPS.sweeps == 1 and heap.SWEEPS.accepts == 0
        assert dead() is None
        assert id(held) not in {id(o) for o in gc.get_objects()}  # frozen: later passes do not walk it
    finally:
        _restore(before)


def test_cyclic_garbage_frozen_alive_is_reclaimed_once_the_frozen_count_has_grown(monkeypatch, caplog):
    import weakref

    before = _settled_then_restored(monkeypatch)
    monkeypatch.setattr(heap, "CHECK_EVERY_S", 0.0)
    monkeypatch.setattr(heap, "RECLAIM_FLOOR", 1_000)
    try:
        nodes = [_Node() for _ in range(200)]
        dead = weakref.ref(nodes[0])
        heap.sweep()  # alive: frozen (the frozen count grew by 200, under the floor: no reclaim)
        assert heap.SWEEPS.reclaims == 0
        del nodes  # now garbage, but frozen: no pass sees it
        gc.collect()
        assert dead() is not None
        # Held objects push the frozen count past twice its size at settle (the whole test process's heap here).
        growth = [_Box() for _ in range(heap.SWEEPS.base + 2_000)]
        with caplog.at_level("INFO", logger="rampmeter.heap"):
            heap.sweep()
        assert heap.SWEEPS.reclaims == 1
        assert dead() is None  # the full pass over the unfrozen heap freed the cycles
        assert "gc reclaim" in caplog.text
        assert heap.SWEEPS.base >= len(growth)  # what is alive is frozen again
        heap.sweep()
        assert heap.SWEEPS.reclaims == 1  # measured from the new base: no second pass
    finally:
        _restore(before)


def test_the_frozen_count_is_read_once_a_minute_at_most(monkeypatch):
    """gc.get_freeze_count() walks the frozen list: 33-41 ms at ~310,000 objects under stalled_bodies,
    which every 32nd sweep used to pay."""
    before = _settled_then_restored(monkeypatch)
    reads = []
    real = gc.get_freeze_count
    monkeypatch.setattr(gc, "get_freeze_count", lambda: reads.append(1) or real())
    try:
        for _ in range(100):
            heap.sweep()
        assert reads == []
        monkeypatch.setattr(heap.SWEEPS, "checked_at", heap.SWEEPS.checked_at - heap.CHECK_EVERY_S)
        heap.sweep()
        assert len(reads) == 1
    finally:
        _restore(before)
