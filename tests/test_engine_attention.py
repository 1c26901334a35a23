"""Paged attention, step inputs and the KV cache against dense fp64 references."""

from __future__ import annotations

import math
import random

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gpu_engine.attention import paged_attention  # noqa: E402
from gpu_engine.block_tables import BlockTableStore  # noqa: E402
from gpu_engine.inputs import build_inputs  # noqa: E402
from gpu_engine.kv_cache import PagedKVCache  # noqa: E402
from sim.config.catalogue import get_model  # noqa: E402
from sim.config.costs import (  # noqa: E402
    kv_bytes_per_token,
)
from sim.config.specs import stored_as  # noqa: E402
from sim.core.kv import NULL_BLOCK  # noqa: E402


def _run_case(rng: random.Random, seqs: list[tuple[int, int]], emits: list[bool],
              block_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
              pad_seqs: int = 0, extra_blocks: int = 0, spare_blocks: int = 3,
              backend: str = "torch", splits: int | None = None) -> None:
    """Random history per sequence, non-contiguous blocks, garbage everywhere else.

    `extra_blocks`: each table holds that many blocks past what the step needs
    (allocated ahead, as for drafts), full of garbage that must not be read.
    """
    torch.manual_seed(rng.randrange(2**31))
    needed = [-(-(ctx + new) // block_size) + extra_blocks for ctx, new in seqs]
    num_blocks = 1 + sum(needed) + spare_blocks
    ids = list(range(1, num_blocks))
    rng.shuffle(ids)
    tables, taken = [], 0
    for count in needed:
        tables.append(ids[taken:taken + count])
        taken += count
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape) * 10, torch.randn(shape) * 10  # garbage must be masked
    history = [(torch.randn(ctx + new, num_kv_heads, head_dim),
                torch.randn(ctx + new, num_kv_heads, head_dim)) for ctx, new in seqs]
    for (ctx, _), table, (k_hist, v_hist) in zip(seqs, tables, history, strict=True):
        for pos in range(ctx):
            k_cache[table[pos // block_size], pos % block_size] = k_hist[pos]
            v_cache[table[pos // block_size], pos % block_size] = v_hist[pos]
    untouched = ids[taken:]
    before = k_cache[untouched].clone()
    queries = [torch.randn(new, num_heads, head_dim) for _, new in seqs]
    q = torch.cat(queries + [torch.randn(pad_seqs, num_heads, head_dim)])
    k = torch.cat([h[0][ctx:] for (ctx, _), h in zip(seqs, history, strict=True)]
                  + [torch.randn(pad_seqs, num_kv_heads, head_dim)])
    v = torch.cat([h[1][ctx:] for (ctx, _), h in zip(seqs, history, strict=True)]
                  + [torch.randn(pad_seqs, num_kv_heads, head_dim)])
    inputs = build_inputs([[7] * new for _, new in seqs], [ctx for ctx, _ in seqs], tables,
                          emits, block_size, "cpu", pad_seqs_to=len(seqs) + pad_seqs or None,
                          backend=backend)
    assert inputs.is_decode_only == all(new == 1 for _, new in seqs)
    scale = 1 / math.sqrt(head_dim)
    if backend == "triton":
        from gpu_engine.triton_attention import triton_attention, write_kv

        write_kv(k, v, k_cache, v_cache, inputs.slot_mapping)
        out = triton_attention(q, k, v, k_cache, v_cache, inputs, scale, splits=splits)
    else:
        out = paged_attention(q, k, v, k_cache, v_cache, inputs, scale)

    assert out.shape == q.shape and torch.isfinite(out).all()
    group = num_heads // num_kv_heads
    row = 0
    for (ctx, new), query, (k_hist, v_hist), table in zip(seqs, queries, history, tables,
                                                          strict=True):
        keys = k_hist.double().repeat_interleave(group, dim=1)
        values = v_hist.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("nhd,shd->hns", query.double(), keys) * scale
        causal = torch.arange(ctx + new)[None, :] <= (ctx + torch.arange(new))[:, None]
        probs = scores.masked_fill(~causal, -math.inf).softmax(-1)
        expected = torch.einsum("hns,shd->nhd", probs, values)
        got = out[row:row + new].double()
        assert (got - expected).norm() / expected.norm() <= 1e-5
        # the whole history now sits in the sequence's blocks
        blocks = torch.tensor([table[pos // block_size] for pos in range(ctx + new)])
        offsets = torch.arange(ctx + new) % block_size
        assert torch.equal(k_cache[blocks, offsets], k_hist)
        assert torch.equal(v_cache[blocks, offsets], v_hist)
        row += new
    assert torch.equal(k_cache[untouched], before), "a write landed outside the step's blocks"


@settings(max_examples=40, deadline=None)
@given(seqs=st.lists(st.tuples(st.integers(0, 40), st.one_of(st.just(1), st.integers(1, 24))),
                     min_size=1, max_size=5),
       block_size=st.sampled_from([1, 3, 4, 16]),
       heads=st.sampled_from([(4, 2), (4, 4), (6, 1), (2, 1)]),
       head_dim=st.sampled_from([4, 8]),
       pad_seqs=st.integers(0, 3), extra_blocks=st.integers(0, 2),
       data=st.data())
def test_paged_attention_equals_dense_reference(seqs, block_size, heads, head_dim, pad_seqs,
                                                extra_blocks, data) -> None:
    emits = data.draw(st.lists(st.booleans(), min_size=len(seqs), max_size=len(seqs)))
    seed = data.draw(st.integers(0, 2**31))
    _run_case(random.Random(seed), seqs, emits, block_size, *heads, head_dim, pad_seqs,
              extra_blocks)


@pytest.mark.parametrize("seqs", [
    [(0, 17), (0, 5)],  # prefill only, from scratch
    [(33, 1), (5, 1), (16, 1), (0, 1)],  # decode only (the batched, graph-capturable path)
    [(20, 9), (41, 1), (0, 12), (7, 1), (15, 1)],  # chunks on cached prefixes among decodes
])
@pytest.mark.parametrize("pad_seqs", [0, 3])
def test_paged_attention_step_kinds(seqs, pad_seqs) -> None:
    _run_case(random.Random(len(seqs) * 10 + pad_seqs), seqs, [True] * len(seqs), 4, 8, 2, 8,
              pad_seqs=pad_seqs, extra_blocks=2)


def test_build_inputs_fields() -> None:
    tables = [[9, 4, 6], [2], [5, 8], [7, 3]]
    contexts = [5, 0, 4, 0]
    new = [[11, 12, 13], [21], [31], [41, 42]]
    inputs = build_inputs(new, contexts, tables, [True, False, True, True], 4, "cpu",
                          pad_seqs_to=6)
    assert inputs.token_ids.tolist() == [11, 12, 13, 21, 31, 41, 42, 0, 0]
    assert inputs.positions.tolist() == [5, 6, 7, 0, 4, 0, 1, 0, 0]
    expected_slots = []
    for table, ctx, ids in zip(tables, contexts, new, strict=True):
        for pos in range(ctx, ctx + len(ids)):
            expected_slots.append(table[pos // 4] * 4 + pos % 4)
    assert inputs.slot_mapping.tolist() == expected_slots + [NULL_BLOCK * 4] * 2
    assert inputs.query_start.tolist() == [0, 3, 4, 5, 7, 8, 9]
    assert inputs.seq_lens.tolist() == [8, 1, 5, 2, 1, 1]
    assert inputs.logits_indices.tolist() == [2, 4, 6]  # the last new token of emitters only
    assert (inputs.num_seqs, inputs.max_query_len, inputs.max_seq_len) == (6, 3, 8)
    assert not inputs.is_decode_only
    assert [(s.start, s.num_new, s.context, s.is_fresh) for s in inputs.spans] == [
        (0, 3, 5, False), (3, 1, 0, False), (4, 1, 4, False), (5, 2, 0, True),
        (7, 1, 0, False), (8, 1, 0, False)]
    # torch backend: the live blocks of cached sequences only (the fresh prefill needs none):
    # decodes grouped by live block count (1 block: seq 1 and the padding; 2 blocks: seq 2),
    # then the chunk on a cached context
    groups = {g.num_blocks: g for g in inputs.decode_groups}
    assert sorted(groups) == [1, 2]
    assert inputs.decode_rows[groups[1].offset:groups[1].offset + 3].tolist() == [3, 7, 8]
    assert inputs.decode_rows[groups[2].offset:groups[2].offset + 1].tolist() == [4]
    assert inputs.decode_lens.tolist() == [1, 1, 1, 5]
    assert inputs.live_blocks.tolist() == [2, 0, 0, 5, 8, 9, 4]
    chunk = inputs.spans[0]
    assert inputs.live_blocks[chunk.live_start // 4:].tolist() == [9, 4]
    assert inputs.query_start.dtype == inputs.seq_lens.dtype == torch.int32
    assert inputs.slot_mapping.dtype == inputs.token_ids.dtype == torch.int64


def test_build_inputs_for_the_kernel_reads_tables_in_place() -> None:
    tables = [[9, 4, 6], [2], [5, 8]]
    inputs = build_inputs([[11, 12, 13], [21], [31]], [5, 0, 4], tables, [True] * 3, 4, "cpu",
                          pad_seqs_to=4, backend="triton", tile_tokens=2)
    assert inputs.live_blocks.numel() == 0  # nothing is gathered
    assert inputs.block_tables.tolist() == [[9, 4, 6], [2, 0, 0], [5, 8, 0], [0, 0, 0]]
    assert inputs.table_rows.tolist() == [0, 1, 2, 3]
    # query tiles of at most 2 tokens: the 3-token chunk is two, each decode one
    assert inputs.tiles.tolist() == [[0, 0, 1, 2, 3], [0, 2, 0, 0, 0]]
    store = BlockTableStore(4, 3, "cpu")
    first = build_inputs([[1], [2]], [5, 3], [(9, 4), (2,)], [True, True], 4, "cpu",
                         backend="triton", store=store, seq_ids=[10, 11])
    rows = first.table_rows.tolist()
    assert first.block_tables is store.table
    assert store.table[rows].tolist() == [[9, 4, 0], [2, 0, 0]]
    again = store.update([11, 10], [(2, 7), (9, 4)])  # one block more for request 11
    assert again[0] == rows[::-1] and again[2] == [7]
    assert again[1] == [rows[1] * 3 + 1]


def test_block_table_store_rewrites_a_changed_row_and_evicts_idle_rows() -> None:
    store = BlockTableStore(3, 4, "cpu")  # row 0 is the null row: two usable rows
    rows, index, values = store.update([1, 2], [(5, 6), (7,)])
    store.apply(torch.tensor(index), torch.tensor(values, dtype=torch.int32))
    # request 1 comes back (preempted, re-admitted) with other blocks: its row is rewritten
    rows2, index, values = store.update([1], [(8,)])
    store.apply(torch.tensor(index), torch.tensor(values, dtype=torch.int32))
    assert rows2 == rows[:1] and values == [8]
    assert store.table[rows[0], 0].item() == 8
    # a third request takes the least recently used row not in its step
    rows3, _, _ = store.update([1, 3], [(8,), (9,)])
    assert rows3[1] == rows[1]
    with pytest.raises(ValueError, match="5 blocks per row"):
        store.update([1], [(1, 2, 3, 4, 5)])
    with pytest.raises(ValueError, match="rows"):
        store.update([4, 5, 6], [(1,), (2,), (3,)])
    grows = BlockTableStore(2, 1, "cpu", growable=True)
    rows, index, values = grows.update([1, 2], [(3, 4), (5,)])
    grows.apply(torch.tensor(index), torch.tensor(values, dtype=torch.int32))
    assert grows.table[rows].tolist() == [[3, 4], [5, 0]]


def test_build_inputs_without_blocks_writes_only_the_null_block() -> None:
    inputs = build_inputs([[0] * 10, [0]], [0, 0], [(), ()], [True, True], 4, "cpu",
                          backend="triton")
    assert (inputs.slot_mapping // 4 == NULL_BLOCK).all()
    assert inputs.block_tables.shape == (2, 3)  # wide enough for the longest sequence
    assert (inputs.block_tables == NULL_BLOCK).all()


@pytest.mark.parametrize("kwargs, message", [
    ({"context_tokens": [0]}, "one entry per sequence"),
    ({"pad_seqs_to": 1}, "pad_seqs_to=1"),
    ({"block_size": 0}, "block_size"),
    ({"new_token_ids": [[1], []]}, "new tokens"),
    ({"backend": "flash"}, "backend must be one of torch, triton"),
])
def test_build_inputs_rejects_bad_columns(kwargs, message) -> None:
    args = {"new_token_ids": [[1], [2]], "context_tokens": [0, 3], "block_tables": [[1], [2]],
            "emits_token": [True, True], "block_size": 4, "device": "cpu"} | kwargs
    with pytest.raises(ValueError, match=message):
        build_inputs(**args)


def test_kv_cache_shapes_and_bytes() -> None:
    spec = get_model("tiny")
    cache = PagedKVCache.for_spec(spec, 10, 16, torch.float32, "cpu")
    assert len(cache.k) == len(cache.v) == spec.num_layers
    assert cache.k[0].shape == (10, 16, spec.num_kv_heads, spec.head_dim)
    assert cache.bytes_total() == 10 * 16 * kv_bytes_per_token(stored_as(spec, "fp32"))
    assert all(not t.any() for t in cache.k + cache.v)  # zeroed: masked reads stay finite
    with pytest.raises(ValueError, match="num_blocks"):
        PagedKVCache.for_spec(spec, 1, 16, torch.float32, "cpu")
