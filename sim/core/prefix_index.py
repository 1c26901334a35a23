"""The prefix cache's index: which block holds which name, as vLLM's BlockHashToBlockMap.

Names come from sim/core/prefix.py. A block is named when it is allocated for
the step that fills it (`name`), keeps its name while free, and loses it when
taken for other content (`evict`). Two blocks may carry one name (two
requests computed the same content at once; vLLM keeps both): hits take the
first named, and the next takes over when it is evicted. The index is dicts,
so a prefill's blocks are named in bulk.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat

from sim.core.prefix import block_hashes, own_names_base
from sim.core.request import Request


def _is_name(name: int | None) -> bool:
    return name is not None


class PrefixIndex:
    """Names of blocks; per held request its prompt's content names and how many are given."""

    __slots__ = ("block_size", "cached", "copies", "names", "_chains", "_named", "_memo")

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.cached: dict[int, int] = {}  # name -> the block hits get (the first named)
        self.copies: dict[int, list[int]] = {}  # name -> later blocks so named, in order
        self.names: dict[int, int] = {}  # block -> name, named blocks only
        self._chains: dict[int, tuple[int, ...]] = {}  # held request -> its prompt's names
        self._named: dict[int, int] = {}  # held request -> leading table blocks named
        self._memo: tuple[Request, tuple[int, ...]] | None = None  # last request's names

    @property
    def num_named_blocks(self) -> int:
        return len(self.names)

    def _prompt_names(self, request: Request) -> tuple[int, ...]:
        memo = self._memo
        if memo is not None and memo[0] is request:
            return memo[1]
        chain = block_hashes(request, self.block_size)
        self._memo = (request, chain)
        return chain

    def match(self, request: Request) -> list[int]:
        """Cached blocks of the longest cached prefix of prompt + output, up to known - 1 tokens.

        Past the described prompt, names are the request's own (a resumed request
        finds its own blocks), made only as far as the hits go.
        """
        chain, cached = self._prompt_names(request), self.cached
        limit = (request.num_known_tokens - 1) // self.block_size
        own, described = own_names_base(request.request_id), len(chain)
        blocks: list[int] = []
        for i in range(limit):
            block = cached.get(chain[i] if i < described else own - i)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def names_between(self, request: Request, start: int, stop: int) -> list[int]:
        """The names of `request`'s blocks start..stop-1 (its prompt's chain, then its own
        names), as match() would look them up: what an offload tier is asked for."""
        chain = self._prompt_names(request)
        own, described = own_names_base(request.request_id), len(chain)
        return [chain[i] if i < described else own - i for i in range(start, stop)]

    def hold(self, request_id: int, request: Request, num_named: int) -> None:
        """`request` now holds a table whose first `num_named` blocks are named (its hits)."""
        self._chains[request_id] = self._prompt_names(request)
        self._named[request_id] = num_named

    def release(self, request_id: int) -> None:
        self._chains.pop(request_id, None)
        self._named.pop(request_id, None)

    def name(self, request_id: int, table: tuple[int, ...], num_tokens: int) -> None:
        """Name the held request's blocks that its first `num_tokens` tokens fill."""
        chain = self._chains.get(request_id)
        if chain is None:
            return
        full = num_tokens // self.block_size
        start = self._named[request_id]
        if full <= start:
            return
        self._named[request_id] = full
        cached = self.cached
        if full == start + 1:  # a decode filled its block: most calls
            name = chain[start] if start < len(chain) else own_names_base(request_id) - start
            block = table[start]
            if name in cached:
                self.copies.setdefault(name, []).append(block)
            else:
                cached[name] = block
            self.names[block] = name
            return
        names = list(chain[start:full])
        if full > len(chain):
            own = own_names_base(request_id)
            names += range(own - max(start, len(chain)), own - full, -1)
        blocks = table[start:full]
        if cached.keys().isdisjoint(names):  # the common case: no content computed twice
            cached.update(zip(names, blocks, strict=True))
        else:
            for name, block in zip(names, blocks, strict=True):
                if name in cached:
                    self.copies.setdefault(name, []).append(block)
                else:
                    cached[name] = block
        self.names.update(zip(blocks, names, strict=True))

    def evict(self, blocks: tuple[int, ...]) -> int:
        """Drop the names of blocks taken for new content; returns how many had one."""
        names = list(map(self.names.pop, blocks, repeat(None, len(blocks))))
        unnamed = names.count(None)
        if unnamed == len(names):
            return 0
        cached, copies = self.cached, self.copies
        if not copies:  # every name is on one block: the one taken
            deque(map(cached.__delitem__, filter(_is_name, names) if unnamed else names), 0)
            return len(names) - unnamed
        for block, name in zip(blocks, names, strict=True):
            if name is None:
                continue
            later = copies.get(name)
            if cached[name] == block:
                if later:
                    cached[name] = later.pop(0)
                else:
                    del cached[name]
            else:
                assert later is not None
                later.remove(block)
            if later is not None and not later:
                del copies[name]
        return len(names) - unnamed

    def check(self) -> None:
        """Raise AssertionError if the index is out of sync; for tests."""
        names = self.names
        assert all(names.get(b) == h for h, b in self.cached.items()), "name index out of sync"
        assert all(h in self.cached and later and all(names.get(b) == h for b in later)
                   for h, later in self.copies.items()), "copy index out of sync"
        assert len(names) == len(self.cached) + sum(map(len, self.copies.values())), \
            "stray block name"
