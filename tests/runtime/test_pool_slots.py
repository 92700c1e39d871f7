"""pool._Slots: the connection-slot counter keeps trio.Semaphore's semantics (FIFO hand-off, no lost slot)."""

import trio
import trio.testing

from proxy.http.pool import _Slots


async def test_a_slot_given_back_goes_to_the_longest_waiter_first():
    slots = _Slots(1)
    slots.free -= 1  # taken
    order: list[int] = []

    async def waiter(i: int) -> None:
        await slots.take_waiting()
        order.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(waiter, i)
            await trio.testing.wait_all_tasks_blocked()
        for _ in range(3):
            slots.give()
            await trio.testing.wait_all_tasks_blocked()
    assert order == [0, 1, 2]
    assert slots.free == 0  # each give() went to a waiter, none to the counter


async def test_a_cancelled_waiter_takes_nothing_and_the_next_give_frees_a_slot(autojump_clock):
    slots = _Slots(1)
    slots.free -= 1
    with trio.move_on_after(1) as scope:
        await slots.take_waiting()
    assert scope.cancelled_caught
    assert slots.waiters == 0
    slots.give()
    assert slots.free == 1


async def test_two_gives_before_the_waiter_resumes_lose_no_slot():
    slots = _Slots(2)
    slots.free -= 2
    got = []

    async def waiter() -> None:
        await slots.take_waiting()
        got.append(True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        slots.give()  # to the waiter, which has not run yet (still counted in `waiters`)
        slots.give()  # nobody parked: back to the counter
        assert slots.free == 1
    assert got == [True]
