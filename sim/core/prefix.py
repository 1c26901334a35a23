"""Content names of a prompt's full KV blocks, for the prefix cache.

A block is named by a hash chained over its parent block's name and its own
content, so equal names mean equal prefixes, not just equal blocks. Content is
the block's tokens when the request carries them, else the pieces of the
trace's prefix ids it covers: id j covers tokens [j*U, (j+1)*U) (U =
`prefix_unit_tokens`), and a block of B tokens covers (id, first offset, end
offset) pieces of one or more ids, so any B works: dividing U, equal, or
larger. Those names cover the full prompt blocks inside what the ids (or
tokens) describe.

Every later block, and every block of a request that describes nothing, is
named too (`own_name`), as vLLM names every full block: by the request's id
and the block's index. Such a block holds generated tokens, or tokens no id
describes, which only its own request holds at that place (after the same
blocks before it), so the pair names the whole prefix as a chain would, and
only its own request can hit it: a request preempted by recompute resumes
from its cached prompt and output blocks. The simulator knows no output token
ids, so two requests that generate the same tokens never share them; vLLM
would (with scripted outputs it never matters unless two requests' outputs
are identical).

Python's hash of a tuple of ints is deterministic across processes (no string
salting), so plans are reproducible; 64-bit collisions are ignored, as vLLM
ignores them for its default hash.
"""

from __future__ import annotations

from sim.core.request import Request

ROOT_HASH = 0  # the parent name of a prompt's first block


OWN_INDEX_BITS = 24  # block indices below 2**24 (268M tokens of 16) get distinct own names


def own_name(request_id: int, index: int) -> int:
    """The name of block `index` of `request_id` when only that request can hold it.

    A plain integer (distinct for every pair, any request id), so a run of them is a
    `range` and costs no hashing; as for content names, a clash with a 64-bit content
    hash is ignored.
    """
    return own_names_base(request_id) - index


def own_names_base(request_id: int) -> int:
    """own_name(request_id, i) == own_names_base(request_id) - i."""
    return -(request_id << OWN_INDEX_BITS) - 1


def block_hashes(request: Request, block_size: int) -> tuple[int, ...]:
    """Chained names of the request's full, describable prompt blocks, first block first."""
    if request.prompt_token_ids is not None:
        return _token_hashes(request.prompt_token_ids, request.prompt_tokens, block_size)
    if request.prefix_block_ids:
        return _id_hashes(request.prefix_block_ids, request.prefix_unit_tokens,
                          request.prompt_tokens, block_size)
    return ()


def _token_hashes(tokens: tuple[int, ...], prompt_tokens: int, block_size: int
                  ) -> tuple[int, ...]:
    full = min(prompt_tokens, len(tokens)) // block_size
    names = []
    parent = ROOT_HASH
    for start in range(0, full * block_size, block_size):
        parent = hash((parent, tokens[start:start + block_size]))
        names.append(parent)
    return tuple(names)


def _id_hashes(ids: tuple[int, ...], unit: int, prompt_tokens: int, block_size: int
               ) -> tuple[int, ...]:
    full = min(len(ids) * unit, prompt_tokens) // block_size
    names = []
    parent = ROOT_HASH
    if unit % block_size == 0:  # the common case (16 | 512): one piece per block
        per_unit = unit // block_size
        for i in range(full):
            j, k = divmod(i, per_unit)
            lo = k * block_size
            parent = hash((parent, ids[j], lo, lo + block_size))
            names.append(parent)
        return tuple(names)
    for i in range(full):
        parent = hash((parent, *block_pieces(ids, unit, i * block_size, block_size)))
        names.append(parent)
    return tuple(names)


def block_pieces(ids: tuple[int, ...], unit: int, start: int, block_size: int
                 ) -> tuple[int, ...]:
    """The (id, first offset, end offset) pieces of tokens [start, start + block_size), flat."""
    pieces: list[int] = []
    end = start + block_size
    t = start
    while t < end:
        j = t // unit
        lo = t - j * unit
        hi = min(unit, end - j * unit)
        pieces += (ids[j], lo, hi)
        t = j * unit + hi
    return tuple(pieces)
