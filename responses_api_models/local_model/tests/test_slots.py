"""SlotTable: a request goes where most of its prompt is held, a shared prefix is saved once and
restored into as many slots as want it, a conversation's slot content survives a twin."""

from __future__ import annotations

from responses_api_models.local_model.slots import MIN_SAVED_TOKENS, SlotTable, common_prefix

PREFIX = list(range(200))
"""An environment's system prompt and tools, as every row of it starts."""


def _row(n: int) -> list[int]:
    return PREFIX + [1000 + n] * 20


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_a_later_turn_goes_back_to_its_own_slot_without_saving_anything() -> None:
    table = SlotTable(slots=4, budget=1 << 30)
    first = table.place(_row(1))
    table.release(first.slot, _row(1))
    other = table.place(PREFIX[:10] + [5] * 90)  # shares only a template's opening: not worth a slot
    assert other.slot != first.slot and other.spill is None
    table.release(other.slot, PREFIX[:10] + [5] * 90)
    turn_two = table.place(_row(1) + [7] * 30)
    assert turn_two.slot == first.slot
    assert turn_two.spill is None and turn_two.restore is None


def test_twins_admitted_together_each_get_the_shared_prefix() -> None:
    table = SlotTable(slots=8, budget=1 << 30)
    first = table.place(_row(1))
    table.release(first.slot, _row(1))
    twin = table.place(_row(2))
    # The first twin takes the slot holding the prefix, after saving what it held.
    assert twin.slot == first.slot and twin.restore is None
    assert twin.spill is not None and twin.spill.tokens == tuple(_row(1))
    # The others find no idle slot with the prefix: the saved state is restored into empty slots.
    others = [table.place(_row(n)) for n in (3, 4, 5)]
    assert all(p.restore is twin.spill and p.spill is None for p in others)
    assert len({twin.slot, *(p.slot for p in others)}) == 4
    # The first conversation's next turn gets its whole history back the same way.
    table.stored(twin.spill.name, 1000)
    back = table.place(_row(1) + [7] * 30)
    assert back.restore is twin.spill and back.slot not in {twin.slot, *(p.slot for p in others)}


def test_unrelated_prompts_use_empty_slots_and_restore_nothing() -> None:
    table = SlotTable(slots=3, budget=1 << 30)
    a = table.place(_row(1))
    table.release(a.slot, _row(1))
    b = table.place(list(range(5000, 5300)))
    assert b.slot != a.slot and b.spill is None and b.restore is None


def test_short_contents_are_not_saved_and_a_saved_content_is_not_saved_twice() -> None:
    table = SlotTable(slots=1, budget=1 << 30)
    table.release(table.place([1] * (MIN_SAVED_TOKENS - 1)).slot, [1] * (MIN_SAVED_TOKENS - 1))
    assert table.place([2] * 100).spill is None
    table.release(0, _row(1))
    spill = table.place(list(range(5000, 5100))).spill
    assert spill is not None
    table.stored(spill.name, 100)
    table.release(0, _row(1))  # restored, and holding the same tokens again
    assert table.place(list(range(6000, 6100))).spill is None


def test_the_budget_drops_the_least_recently_used_states() -> None:
    table = SlotTable(slots=1, budget=250)
    names = []
    for n in range(3):
        table.release(0, _row(n))
        spill = table.place([9000 + n] * 100).spill
        assert spill is not None
        names.append(spill.name)
        dropped = table.stored(spill.name, 100)
        assert dropped == ([names[0]] if n == 2 else [])
    assert [s.name for s in table.saved] == names[1:]


def test_a_failed_save_is_forgotten() -> None:
    table = SlotTable(slots=1, budget=1 << 30)
    table.release(0, _row(1))
    spill = table.place([5] * 100).spill
    assert spill is not None
    assert table.stored(spill.name, 0) == [spill.name]
    assert table.saved == []


def test_no_idle_slot_leaves_the_choice_to_llama_cpp() -> None:
    table = SlotTable(slots=1, budget=1 << 30)
    table.place(_row(1))
    assert table.place(_row(2)).slot == -1
    table.release(-1, _row(2))  # nothing to record
