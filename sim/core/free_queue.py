"""The order in which free KV blocks are reused: vLLM's free-block queue.

vLLM's BlockPool (vllm/v1/core/block_pool.py) keeps free blocks in one
queue: a freed block without a name is put at the front (reused first, LIFO),
a named one at the back (reused last, so reuse evicts the least recently
freed name), and a prefix hit on a free block takes it out of the middle.

Here the front is a stack and the back a FIFO list consumed from a moving
head, so whole tables go in and come out with C-speed slices: a request
allocates and frees ~100 blocks, and a linked list popped one block at a time
cost more than the rest of the simulation. A block taken from the middle
(always a named one, so in the FIFO) has its entry marked stale and skipped
when the head reaches it; a block's stale entries always precede its live
one, so a count per block suffices. Never-used blocks start in the FIFO, in
block order, as vLLM's queue starts.
"""

from __future__ import annotations

from collections.abc import Sequence


class FreeQueue:
    """Free blocks 1 .. num_blocks - 1 (block 0 is the null block), front first."""

    __slots__ = ("_front", "_fifo", "_head", "_stale", "_num_stale", "_size")

    def __init__(self, num_blocks: int) -> None:
        self._front: list[int] = []  # its end is the queue's front
        self._fifo: list[int] = list(range(1, num_blocks))
        self._head = 0
        self._stale = [0] * num_blocks  # per block: FIFO entries a hit invalidated
        self._num_stale = 0
        self._size = num_blocks - 1  # free blocks: asked for at every admission and step

    def __len__(self) -> int:
        return self._size

    def push_front(self, blocks: Sequence[int]) -> None:
        """Put blocks without a name at the front; the last of `blocks` is taken first."""
        self._front += blocks
        self._size += len(blocks)

    def push_back(self, blocks: list[int]) -> None:
        """Put named blocks at the back, in order."""
        self._fifo += blocks
        self._size += len(blocks)

    def remove(self, block: int) -> None:
        """Take a free named block out of the middle (a prefix hit on it)."""
        self._stale[block] += 1
        self._num_stale += 1
        self._size -= 1

    def pop(self, count: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The next `count` blocks: (those from the front, never named; those from the back).

        The caller knows there are enough.
        """
        self._size -= count
        front = self._front
        taken: tuple[int, ...] = ()
        if front and count:
            n = min(count, len(front))
            taken = tuple(front[:-n - 1:-1])  # the last n, last first
            del front[-n:]
            count -= n
        if not count:
            return taken, ()
        head, fifo = self._head, self._fifo
        if self._num_stale:
            rest, head = self._pop_skipping(count, head)
        else:
            rest = tuple(fifo[head:head + count])
            head += count
        if head > 4096 and 2 * head > len(fifo):  # drop the consumed prefix
            del fifo[:head]
            head = 0
        self._head = head
        return taken, rest

    def _pop_skipping(self, count: int, head: int) -> tuple[tuple[int, ...], int]:
        """Pop `count` live entries from the head, dropping the stale ones met on the way."""
        fifo, stale = self._fifo, self._stale
        taken: list[int] = []
        while len(taken) < count:
            block = fifo[head]
            head += 1
            if stale[block]:
                stale[block] -= 1
                self._num_stale -= 1
            else:
                taken.append(block)
        return tuple(taken), head

    @property
    def num_entries(self) -> int:
        """List entries held, stale and consumed ones included: bounded by compaction."""
        return len(self._front) + len(self._fifo)

    def blocks(self) -> tuple[list[int], list[int]]:
        """(front part, back part) in the order pop would take them; for invariant checks."""
        stale = list(self._stale)
        back = []
        for block in self._fifo[self._head:]:
            if stale[block]:
                stale[block] -= 1
            else:
                back.append(block)
        assert not any(stale), "a stale free-queue entry that no longer exists"
        return self._front[::-1], back
