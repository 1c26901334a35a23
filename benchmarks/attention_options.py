"""Decode attention over a paged KV cache on the CPU: the options measured side by side.

    python benchmarks/attention_options.py [--batch 16] [--heads 12 4 64]

One decode step (one query per sequence) over sequences of uneven length
whose blocks lie scattered in the pool, each option checked against a dense
fp64 reference and timed (median of repeats, one thread):

- dense: the engine's old path, a gather of every table padded to the widest,
  then one masked SDPA;
- live blocks: the torch backend now (gpu_engine/attention.py): a gather of
  exactly the live blocks, decodes grouped by block count, one SDPA a group;
- jagged: SDPA over nested (jagged) tensors of the live tokens;
- flex: `flex_attention` over the whole pool with a paged block mask (each
  sequence's blocks), eagerly and, where Inductor can compile for this CPU,
  compiled (the compile's own time printed apart).

The Triton kernel is the CUDA choice; on a CPU it runs only in Triton's
interpreter, whose speed means nothing (tests/test_triton_attention.py).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_engine.inputs import build_inputs  # noqa: E402
from gpu_engine.torch_attention import torch_attention  # noqa: E402

BLOCK = 16


def timed_us(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--heads", type=int, nargs=3, default=(12, 4, 64),
                        metavar=("Q_HEADS", "KV_HEADS", "HEAD_DIM"))
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    num_heads, num_kv_heads, head_dim = args.heads
    group = num_heads // num_kv_heads
    lens = [1024] + torch.randint(32, 300, (args.batch - 1,)).tolist()
    needed = [-(-n // BLOCK) for n in lens]
    pool = sum(needed) + 1
    order = (torch.randperm(pool - 1) + 1).tolist()
    tables, taken = [], 0
    for n in needed:
        tables.append(order[taken:taken + n])
        taken += n
    k_cache = torch.randn(pool, BLOCK, num_kv_heads, head_dim)
    v_cache = torch.randn(pool, BLOCK, num_kv_heads, head_dim)
    q = torch.randn(args.batch, num_heads, head_dim)
    scale = 1 / math.sqrt(head_dim)
    seq_lens = torch.tensor(lens)
    width = max(needed)
    dense_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])

    def reference() -> torch.Tensor:
        rows = []
        for i, table in enumerate(tables):
            keys = k_cache[table].flatten(0, 1)[:lens[i]].double()
            values = v_cache[table].flatten(0, 1)[:lens[i]].double()
            keys = keys.repeat_interleave(group, 1)
            values = values.repeat_interleave(group, 1)
            probs = (torch.einsum("hd,shd->hs", q[i].double(), keys) * scale).softmax(-1)
            rows.append(torch.einsum("hs,shd->hd", probs, values))
        return torch.stack(rows)

    def dense() -> torch.Tensor:
        keys = k_cache[dense_tables].view(args.batch, -1, num_kv_heads, head_dim).transpose(1, 2)
        values = v_cache[dense_tables].view(args.batch, -1, num_kv_heads,
                                            head_dim).transpose(1, 2)
        visible = torch.arange(keys.shape[2]) < seq_lens.view(-1, 1)
        folded = q.view(args.batch, num_kv_heads, group, head_dim)
        out = F.scaled_dot_product_attention(folded, keys, values, scale=scale,
                                             attn_mask=visible.view(args.batch, 1, 1, -1))
        return out.reshape(args.batch, num_heads, head_dim)

    inputs = build_inputs([[0]] * args.batch, [n - 1 for n in lens], tables,
                          [True] * args.batch, BLOCK, "cpu")

    def live() -> torch.Tensor:
        return torch_attention(q, q[:, :num_kv_heads], q[:, :num_kv_heads], k_cache, v_cache,
                               inputs, scale)

    live_index = torch.cat([torch.tensor(t).repeat_interleave(BLOCK) * BLOCK
                            + torch.arange(len(t) * BLOCK) % BLOCK for t in tables])
    token_index = torch.cat([live_index[sum(needed[:i]) * BLOCK:][:n]
                             for i, n in enumerate(lens)])
    offsets = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])

    def jagged() -> torch.Tensor:
        flat_k = k_cache.view(-1, num_kv_heads, head_dim)[token_index]
        flat_v = v_cache.view(-1, num_kv_heads, head_dim)[token_index]
        keys = torch.nested.nested_tensor_from_jagged(
            flat_k.repeat_interleave(group, 1), offsets).transpose(1, 2)
        values = torch.nested.nested_tensor_from_jagged(
            flat_v.repeat_interleave(group, 1), offsets).transpose(1, 2)
        query = torch.nested.nested_tensor_from_jagged(
            q, torch.arange(args.batch + 1)).transpose(1, 2)
        out = F.scaled_dot_product_attention(query, keys, values, scale=scale)
        return torch.stack([t.transpose(0, 1)[0] for t in out.unbind()])

    owner = torch.full((pool * BLOCK,), -1)
    position = torch.zeros(pool * BLOCK, dtype=torch.long)
    for i, table in enumerate(tables):
        slots = torch.tensor(table).repeat_interleave(BLOCK) * BLOCK + torch.arange(
            len(table) * BLOCK) % BLOCK
        owner[slots] = i
        position[slots] = torch.arange(len(table) * BLOCK)

    def paged(b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202 - flex's mask_mod signature
        return (owner[kv_idx] == b) & (position[kv_idx] < seq_lens[b])

    results: dict[str, float] = {}
    expected = reference()
    copies = {"dense": args.batch * width * BLOCK, "live blocks": sum(needed) * BLOCK,
              "jagged": sum(lens) * group, "flex": 0}
    for name, fn in (("dense", dense), ("live blocks", live), ("jagged", jagged)):
        error = float((fn().double() - expected).norm() / expected.norm())
        results[name] = timed_us(fn, args.repeats)
        print(f"{name:>12}: {results[name]:9.0f} us, K tokens copied {copies[name]:6d}, "
              f"rel error {error:.1e}")
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        mask = create_block_mask(paged, args.batch, None, 1, pool * BLOCK, device="cpu",
                                 BLOCK_SIZE=BLOCK)
        keys = k_cache.view(1, -1, num_kv_heads, head_dim).transpose(1, 2)
        values = v_cache.view(1, -1, num_kv_heads, head_dim).transpose(1, 2)
        keys, values = keys.expand(args.batch, -1, -1, -1), values.expand(args.batch, -1, -1, -1)
        query = q.view(args.batch, num_heads, 1, head_dim)

        def flex(run=flex_attention):  # noqa: ANN001, ANN202
            return run(query, keys, values, block_mask=mask, scale=scale,
                       enable_gqa=True).view(args.batch, num_heads, head_dim)

        error = float((flex().double() - expected).norm() / expected.norm())
        print(f"{'flex eager':>12}: {timed_us(flex, max(2, args.repeats // 10)):9.0f} us, "
              f"reads the whole pool ({pool * BLOCK} slots) unmasked, rel error {error:.1e}")
        compiled = torch.compile(flex_attention)
        started = time.perf_counter()
        error = float((flex(compiled).double() - expected).norm() / expected.norm())
        compile_s = time.perf_counter() - started
        print(f"{'flex comp.':>12}: {timed_us(lambda: flex(compiled), args.repeats):9.0f} us "
              f"(compile {compile_s:.0f} s), in place through the block mask, "
              f"rel error {error:.1e}")
    except Exception as err:  # noqa: BLE001 - an option that fails here is a finding
        print(f"{'flex':>12}: failed here: {type(err).__name__}: {str(err)[:200]}")


if __name__ == "__main__":
    main()
