"""Which llama.cpp slot a request runs in, and which saved prompt state it starts from.

llama.cpp keeps one KV cache per slot and reuses the part of a new prompt that the slot already
holds. Left to itself it sends a request to the idle slot sharing the longest prefix, else to the
least recently used one, and its host-memory prompt cache *moves* a saved state into one slot: a
cached prefix serves one request at a time. Measured on the quickstart (one thread, 2 cores): when
an environment's first prompt ended and its four twins were admitted together, one twin found the
~200-token shared prefix in that slot and the three others, sent to empty slots, processed it again
(3 x 200 tokens, ~20 s), and each conversation's later turns lost their slot the same way.

So the engine places every request itself (llama.cpp's ``id_slot``) from this table of what each
slot holds, and copies states between slots through llama.cpp's slot save/restore files:

* a request goes to the idle slot that already holds the longest part of its prompt (ties: the one
  that loses the least, then the least recently used);
* unless a saved state holds more of it: then that state is restored into the idle slot whose
  content matters least (empty, already saved, least recently used) first;
* a slot's content that a request would overwrite is saved first (``spill``), once, so that the
  conversation it belongs to, and every twin sharing its prefix, can have it restored later: a
  shared prefix is computed once and copied, in milliseconds, into as many slots as want it.

Saved states are bounded by a byte budget, least recently used dropped first. The table is only a
guess at what each slot holds (it records the prompt, not the generation): llama.cpp still compares
the actual tokens, so a wrong guess costs prompt processing, never correctness.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

MIN_SAVED_TOKENS = 48
"""Shorter contents are not worth a file: processing them again costs about a second at most."""
MIN_RESTORE_GAIN = 16
"""Tokens a saved state must hold beyond the best idle slot to be restored (a restore takes
milliseconds, but can wait for the batch llama.cpp is computing: a fraction of a second)."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class Saved:
    """A slot state saved to ``name`` (a file in llama.cpp's slot save directory)."""

    name: str
    tokens: tuple[int, ...]
    size: int = 0
    """Bytes on disk; 0 while the save is under way."""


@dataclass
class Placement:
    """Where a request runs: ``slot``, after saving its content as ``spill`` and/or loading
    ``restore`` into it (in that order). ``slot`` is -1 when no slot is free (llama.cpp chooses)."""

    slot: int
    spill: Saved | None = None
    restore: Saved | None = None


class SlotTable:
    """What each of ``slots`` llama.cpp slots holds, and the saved states, within ``budget`` bytes."""

    def __init__(self, slots: int, budget: int) -> None:
        self.budget = budget
        self._content: list[tuple[int, ...]] = [() for _ in range(slots)]
        self._last_used = [-1] * slots
        self._busy: set[int] = set()
        self._saved: OrderedDict[str, Saved] = OrderedDict()
        self._ticks = itertools.count()
        self._names = itertools.count()

    @property
    def saved(self) -> list[Saved]:
        return list(self._saved.values())

    def place(self, prompt: Sequence[int]) -> Placement:
        """Take an idle slot for ``prompt`` (see the module docstring for the choice)."""
        idle = [s for s in range(len(self._content)) if s not in self._busy]
        if not idle:
            return Placement(-1)
        best = max(idle, key=lambda s: self._fit(s, prompt))
        kept = common_prefix(self._content[best], prompt)
        state = max(self._saved.values(), key=lambda v: common_prefix(v.tokens, prompt), default=None)
        restore = None
        if state is not None and common_prefix(state.tokens, prompt) >= kept + MIN_RESTORE_GAIN:
            best = min(idle, key=self._worth)
            restore, kept = state, 0
            self._saved.move_to_end(state.name)
        self._busy.add(best)
        return Placement(best, self._spill(best, kept), restore)

    def _fit(self, slot: int, prompt: Sequence[int]) -> tuple[int, int, int]:
        """Most of the prompt kept, then least content lost, then least recently used. A few shared
        tokens (a chat template's opening) do not count: they would not pay for what is lost."""
        content = self._content[slot]
        kept = common_prefix(content, prompt)
        useful = kept if kept >= MIN_SAVED_TOKENS or kept == len(content) else 0
        return useful, kept - len(content), -self._last_used[slot]

    def _worth(self, slot: int) -> tuple[bool, bool, int]:
        """What overwriting a slot loses, smallest first: empty, already saved, then by last use."""
        content = self._content[slot]
        return bool(content), not self._is_saved(content), self._last_used[slot]

    def _is_saved(self, tokens: tuple[int, ...]) -> bool:
        return any(state.tokens == tokens for state in self._saved.values())

    def _spill(self, slot: int, kept: int) -> Saved | None:
        """The slot's content, to save before it is cut back to ``kept`` tokens, when worth it."""
        content = self._content[slot]
        if kept >= len(content) or len(content) < MIN_SAVED_TOKENS or self._is_saved(content):
            return None
        state = Saved(f"state-{next(self._names)}.bin", content)
        self._saved[state.name] = state
        return state

    def stored(self, name: str, size: int) -> list[str]:
        """A save finished (``size`` bytes, 0: it failed). The names of states to delete: a failed
        one, and the least recently used ones beyond the budget."""
        state = self._saved.get(name)
        if state is None:
            return []
        if size <= 0:
            del self._saved[name]
            return [name]
        state.size = size
        self._saved.move_to_end(name)
        dropped = []
        total = sum(s.size for s in self._saved.values())
        # Oldest first, the newest last; a save still under way (size 0) is never dropped here.
        for old in [s for s in self._saved.values() if s.size]:
            if total <= self.budget:
                break
            dropped.append(old.name)
            total -= old.size
            del self._saved[old.name]
        return dropped

    def release(self, slot: int, content: Sequence[int]) -> None:
        """The request in ``slot`` ended; the slot now holds (at least) ``content``."""
        if slot < 0:
            return
        self._busy.discard(slot)
        self._content[slot] = tuple(content)
        self._last_used[slot] = next(self._ticks)
