"""Admission: one cold prompt per prefix, the oldest conversation first, no slot lost to a cancel."""

from __future__ import annotations

import asyncio

from responses_api_models.local_model.admission import Admission, prefix_key

SYSTEM_A = prefix_key(list(range(100)))
SYSTEM_B = prefix_key(list(range(1, 101)))


async def _started(admission: Admission, session: str | None, key: tuple[int, ...]) -> asyncio.Task[None]:
    task = asyncio.ensure_future(admission.acquire(session, key))
    await asyncio.sleep(0)
    return task


async def test_twins_and_other_cold_prefixes_wait_for_the_first_to_fill_its_prefix() -> None:
    admission = Admission(slots=8)
    first = await _started(admission, "s1", SYSTEM_A)
    twin = await _started(admission, "s2", SYSTEM_A)
    other = await _started(admission, "s3", SYSTEM_B)
    assert first.done() and not twin.done() and not other.done()
    admission.release(SYSTEM_A, ran=True)
    await asyncio.sleep(0)
    assert twin.done() and other.done()  # the twin finds A cached; B is the one cold prompt now
    after = await _started(admission, "s4", SYSTEM_A)
    other_twin = await _started(admission, "s5", SYSTEM_B)
    assert after.done() and not other_twin.done()  # A is cached: no more waiting on it
    assert admission.busy == 3


async def test_a_failed_first_hands_the_filling_to_the_next_twin_only() -> None:
    admission = Admission(slots=8)
    await _started(admission, "s1", SYSTEM_A)
    second = await _started(admission, "s2", SYSTEM_A)
    third = await _started(admission, "s3", SYSTEM_A)
    admission.release(SYSTEM_A, ran=False)
    await asyncio.sleep(0)
    assert second.done() and not third.done()


async def test_the_oldest_conversation_takes_a_free_slot_first() -> None:
    admission = Admission(slots=1)
    await _started(admission, "old", SYSTEM_A)
    admission.release(SYSTEM_A, ran=True)  # "old" had its first turn; "new" arrives before its second
    await _started(admission, "holder", SYSTEM_A)
    new_first_turn = await _started(admission, "new", SYSTEM_A)
    old_next_turn = await _started(admission, "old", SYSTEM_A)
    admission.release(SYSTEM_A, ran=True)
    await asyncio.sleep(0)
    assert old_next_turn.done() and not new_first_turn.done()


async def test_a_cancelled_waiter_loses_no_slot() -> None:
    admission = Admission(slots=1)
    await _started(admission, "s1", SYSTEM_A)
    gone = await _started(admission, "s2", SYSTEM_A)
    waiting = await _started(admission, "s3", SYSTEM_A)
    gone.cancel()
    await asyncio.sleep(0)
    admission.release(SYSTEM_A, ran=True)
    await asyncio.sleep(0)
    assert waiting.done() and admission.busy == 1
