"""Prefix caching: naming by content, hits, LRU eviction, and hit rates against the ideal."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from test_continuous_scheduler import drive

from sim.config.scenario import Scenario
from sim.core.contiguous import ContiguousAllocator
from sim.core.drive import run_steps
from sim.core.kv import PagedBlockManager
from sim.core.plan import StepResult
from sim.core.prefix import block_hashes
from sim.core.request import Request
from sim.core.schedulers import ContinuousScheduler
from sim.experiments.run import run_scenario
from sim.results.files.report import format_summary

MOONCAKE = (Path(__file__).resolve().parents[1] / "sim" / "workload" / "data" / "traces"
            / "mooncake_conversation.jsonl")


def ids_request(rid: int, ids: tuple[int, ...], prompt: int, unit: int = 8,
                output: int = 2, arrival_s: float = 0.0) -> Request:
    return Request(rid, arrival_s, prompt, output, prefix_block_ids=ids, prefix_unit_tokens=unit)


def test_names_depend_on_the_whole_prefix_and_any_block_size() -> None:
    a = ids_request(0, (1, 2, 3), 24)
    b = ids_request(1, (1, 2, 4), 24)
    c = ids_request(2, (9, 2, 3), 24)
    for bs in (2, 4, 8, 16, 24):  # dividing the unit, equal, larger
        ha, hb, hc = (block_hashes(r, bs) for r in (a, b, c))
        assert len(ha) == 24 // bs
        shared = 16 // bs  # tokens [0, 16) are ids 1, 2 in both a and b
        assert ha[:shared] == hb[:shared]
        assert not set(ha[shared:]) & set(hb), "blocks holding id 3 vs 4 differ"
        assert not set(ha) & set(hc), "a different first block renames every later block"
    # tokens win over ids; ids that cover less than the prompt name only what they cover
    assert block_hashes(Request(3, 0.0, 10, 1, prompt_token_ids=tuple(range(10))), 4) == \
        block_hashes(Request(4, 0.0, 10, 1, prompt_token_ids=tuple(range(10))), 4)
    assert len(block_hashes(ids_request(5, (1,), 40), 4)) == 2
    assert len(block_hashes(Request(6, 0.0, 40, 1), 4)) == 0


def test_hit_shares_blocks_and_caps_at_the_last_prompt_token() -> None:
    kv = PagedBlockManager(40, 4, watermark=0.0, enable_prefix_cache=True)
    a = ids_request(0, (1, 2), 16)
    assert kv.allocate(0, 16, request=a) == 0
    kv.cache_computed(0, 16)  # its prefill ran: all 4 prompt blocks named
    b = ids_request(1, (1, 2), 16)  # the same prompt: all but the last block hit
    assert kv.cached_prefix_tokens(b) == 12
    assert kv.allocate(1, 16, request=b) == 12
    ta, tb = kv.block_table(0), kv.block_table(1)
    assert ta[:3] == tb[:3] and ta[3] != tb[3]
    assert [kv.refcount(x) for x in ta] == [2, 2, 2, 1]
    kv.check_invariants()
    kv.free(0)
    assert [kv.refcount(x) for x in tb[:3]] == [1, 1, 1]
    kv.free(1)
    kv.check_invariants()
    assert kv.num_free_blocks == kv.num_usable_blocks and kv.num_cached_blocks == 4
    # freed blocks keep their names: a third request still hits them
    c = ids_request(2, (1, 2, 7), 20)
    assert kv.allocate(2, 20, request=c) == 16
    assert kv.block_table(2)[:4] == ta
    assert kv.num_hit_tokens == 28 and kv.num_evictions == 0
    kv.check_invariants()


def test_lru_evicts_only_free_blocks_least_recently_freed_first() -> None:
    kv = PagedBlockManager(9, 4, watermark=0.0, enable_prefix_cache=True)  # 8 blocks
    old, new = ids_request(0, (1,), 8, unit=8), ids_request(1, (2,), 8, unit=8)
    for rid, req in ((0, old), (1, new)):
        kv.allocate(rid, 8, request=req)
        kv.cache_computed(rid, 8)
    kv.free(0)
    kv.free(1)
    held = ids_request(2, (3,), 8, unit=8)
    kv.allocate(2, 8, request=held)
    kv.cache_computed(2, 8)  # in use: must survive any eviction
    # 6 free blocks, 4 of them named; taking 4 new blocks evicts the 2 unnamed + old's 2
    kv.allocate(3, 16)
    assert kv.num_evictions == 2
    assert kv.cached_prefix_tokens(ids_request(9, (1,), 9, unit=8)) == 0  # old evicted
    assert kv.cached_prefix_tokens(ids_request(9, (2,), 9, unit=8)) == 8  # new kept
    assert kv.cached_prefix_tokens(ids_request(9, (3,), 9, unit=8)) == 8  # held kept
    assert kv.allocate(4, 12) == -1  # only new's 2 free blocks left
    kv.check_invariants()


def test_hit_on_a_free_block_leaves_the_free_queue() -> None:
    kv = PagedBlockManager(7, 4, watermark=0.0, enable_prefix_cache=True)  # 6 blocks
    req = ids_request(0, (1, 2), 16)
    kv.allocate(0, 16, request=req)
    kv.cache_computed(0, 16)
    kv.free(0)
    assert kv.allocate(1, 16, request=ids_request(1, (1, 2), 16)) == 12
    assert kv.num_free_blocks == 2
    kv.allocate(2, 8)  # the two left: skipping the stale entries of the three hit blocks
    assert kv.num_free_blocks == 0
    kv.check_invariants()
    assert all(kv.refcount(b) == 1 for b in kv.block_table(2))
    kv.free(1)
    kv.free(2)
    kv.check_invariants()
    assert kv.num_free_blocks == 6


def test_cached_prefix_tokens_is_zero_without_a_cache() -> None:
    req = ids_request(0, (1, 2), 16)
    for kv in (PagedBlockManager(20, 4), ContiguousAllocator(20, 4)):
        assert kv.cached_prefix_tokens(req) == 0
        assert kv.allocate(0, 16, request=req) == 0
        assert kv.num_evictions == 0 and kv.num_hit_tokens == 0


def test_without_prefix_ids_a_request_hits_only_its_own_blocks() -> None:
    """Content no id describes is the request's own (vLLM names every block): no request
    hits another's, and one preempted by recompute resumes from its cached prompt and
    output blocks instead of recomputing them all."""
    rng = random.Random(3)
    spec = [(rng.uniform(0, 2), rng.randint(1, 300), rng.randint(1, 60)) for _ in range(200)]
    resumed = {}
    for caching in (False, True):
        kv = PagedBlockManager(120, 16, 0.0, enable_prefix_cache=caching)
        sched = ContinuousScheduler(kv, 64, 1024)
        requests = [Request(i, a, p, o) for i, (a, p, o) in enumerate(spec)]
        seen: set[int] = set()
        preempted: set[int] = set()
        hits: list[int] = []  # context of each re-admission after a preemption

        def check(plan, seen=seen, preempted=preempted, hits=hits) -> None:
            for rid, ctx in zip(plan.request_ids, plan.context_tokens, strict=True):
                if rid not in seen:
                    assert ctx == 0, "a first admission hit another request's blocks"
                    seen.add(rid)
                elif rid in preempted:
                    hits.append(ctx)
                    preempted.discard(rid)
            preempted.update(plan.preempted_ids)

        drive(sched, requests, check=check)
        assert len(hits) > 20, "a tight pool preempts"
        assert all(r.prefix_hit_tokens == 0 for r in requests)
        assert kv.num_hit_tokens == sum(hits)
        resumed[caching] = hits
    assert not any(resumed[False]) and all(ctx % 16 == 0 for ctx in resumed[True])
    assert sum(ctx > 0 for ctx in resumed[True]) > len(resumed[True]) // 2


def shared_prefix_workload(seed: int, n: int, unit: int, spacing_s: float
                           ) -> list[tuple[float, int, int, tuple[int, ...]]]:
    """(arrival, prompt, output, ids): prompts extend random earlier prompts (conversations)."""
    rng = random.Random(seed)
    rows: list[tuple[float, int, int, tuple[int, ...]]] = []
    next_id = 0
    for i in range(n):
        base: tuple[int, ...] = ()
        if rows and rng.random() < 0.7:
            parent = rng.choice(rows)[3]
            base = parent[:rng.randint(1, len(parent))]
        extra = rng.randint(0 if base else 1, 4)
        ids = base + tuple(range(next_id, next_id + extra))
        next_id += extra
        prompt = max(1, (len(ids) - 1) * unit + rng.randint(1, unit))  # last unit partial
        rows.append((i * spacing_s, prompt, rng.randint(1, 5), ids))
    return rows


def ideal_hit_tokens(rows: list[tuple[float, int, int, tuple[int, ...]]], unit: int,
                     block_size: int) -> list[int]:
    """Served one at a time, per request: the full prompt blocks whose every piece was
    seen fully inside an earlier prompt (all blocks before it too), minus the last token."""
    covered: dict[tuple[int, int], int] = {}  # (position, id) -> tokens of it seen
    hits = []
    for _, prompt, _, ids in rows:
        tokens = 0
        limit = (prompt - 1) // block_size * block_size
        while tokens + block_size <= limit:
            end = tokens + block_size
            pieces = range(tokens // unit, (end - 1) // unit + 1)
            if not all(covered.get((j, ids[j]), 0) >= min(unit, end - j * unit)
                       for j in pieces if j < len(ids)) or (end - 1) // unit >= len(ids):
                break
            tokens = end
        hits.append(tokens)
        for j, pid in enumerate(ids):
            seen = min(unit, prompt - j * unit)
            covered[(j, pid)] = max(covered.get((j, pid), 0), seen)
    return hits


@pytest.mark.parametrize("block_size", [2, 4, 8, 16])
def test_synthetic_hit_rate_equals_ideal_reuse(block_size: int) -> None:
    unit = 8
    rows = shared_prefix_workload(11, 150, unit, spacing_s=100.0)
    kv = PagedBlockManager(5000, block_size, 0.0, enable_prefix_cache=True)
    sched = ContinuousScheduler(kv, 16, 256)
    requests = [ids_request(i, ids, p, unit, o, a) for i, (a, p, o, ids) in enumerate(rows)]
    run_steps(sched, requests, after=sched.kv.check_invariants)
    assert kv.num_evictions == 0
    assert [r.prefix_hit_tokens for r in requests] == ideal_hit_tokens(rows, unit, block_size)
    assert sum(r.prefix_hit_tokens for r in requests) > 0
    assert kv.num_used_blocks == 0


def test_token_ids_hit_like_prefix_ids() -> None:
    """The same workload described by tokens (equal id = equal tokens) hits the same."""
    unit, bs = 8, 4
    rows = shared_prefix_workload(5, 80, unit, spacing_s=100.0)
    results = []
    for by_tokens in (False, True):
        kv = PagedBlockManager(3000, bs, 0.0, enable_prefix_cache=True)
        sched = ContinuousScheduler(kv, 16, 256)
        requests = []
        for i, (a, p, o, ids) in enumerate(rows):
            if by_tokens:
                tokens = tuple(1000 * pid + k for pid in ids for k in range(unit))[:p]
                requests.append(Request(i, a, p, o, prompt_token_ids=tokens))
            else:
                requests.append(ids_request(i, ids, p, unit, o, a))
        run_steps(sched, requests, after=sched.kv.check_invariants)
        results.append([r.prefix_hit_tokens for r in requests])
    assert results[0] == results[1] and sum(results[0]) > 0


def test_prefix_hits_under_concurrency_with_evictions() -> None:
    unit = 16
    rows = shared_prefix_workload(2, 300, unit, spacing_s=0.003)
    kv = PagedBlockManager(400, 16, 0.01, enable_prefix_cache=True)
    sched = ContinuousScheduler(kv, 32, 512)
    requests = [ids_request(i, ids, p, unit, o, a) for i, (a, p, o, ids) in enumerate(rows)]
    run_steps(sched, requests, after=sched.kv.check_invariants)
    assert kv.num_used_blocks == 0 and kv.num_evictions > 0
    assert sum(r.prefix_hit_tokens for r in requests) > 0


def mooncake_rows(limit: int) -> list[dict]:
    with MOONCAKE.open() as handle:
        return [json.loads(line) for line, _ in zip(handle, range(limit), strict=False)]


def test_mooncake_hit_rate_equals_ideal_reuse() -> None:
    rows = mooncake_rows(500)
    unit, bs = 512, 16
    spec = [(i * 1e4, r["input_length"], min(r["output_length"], 2) or 1, tuple(r["hash_ids"]))
            for i, r in enumerate(rows)]
    total_blocks = sum(-(-p // bs) + 1 for _, p, _, _ in spec) + 1
    kv = PagedBlockManager(total_blocks, bs, 0.0, enable_prefix_cache=True)
    sched = ContinuousScheduler(kv, 16, 8192)
    requests = [ids_request(i, ids, p, unit, o, a) for i, (a, p, o, ids) in enumerate(spec)]
    now = 0.0
    for req in requests:  # one at a time; the pool is too big to check after every step
        sched.add(req, now)
        while sched.has_unfinished():
            plan = sched.schedule(now)
            now += 0.01
            sched.on_step_done(plan, StepResult(), now)
    kv.check_invariants()
    assert kv.num_evictions == 0 and kv.num_used_blocks == 0
    ideal = ideal_hit_tokens(spec, unit, bs)
    assert [r.prefix_hit_tokens for r in requests] == ideal
    rate = sum(ideal) / sum(p for _, p, _, _ in spec)
    assert rate > 0.1, f"Mooncake conversations reuse prefixes, got {rate:.3f}"


def test_scenario_reports_hit_rate_only_with_caching(tmp_path: Path) -> None:
    rows = shared_prefix_workload(4, 120, 512, spacing_s=0.05)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": a * 1e3, "input_length": p,
                                         "output_length": o, "hash_ids": list(ids)}) + "\n"
                             for a, p, o, ids in rows))
    summaries = {}
    for on in (False, True):
        scenario = Scenario.model_validate({
            "name": "prefix", "kv": {"prefix_caching": on, "num_blocks": 4000},
            "workload": {"trace": {"path": str(trace)}, "num_requests": 120}})
        summaries[on] = run_scenario(scenario, show_progress=False).summary
    off, on_ = summaries[False], summaries[True]
    assert off["prefix_hit_rate"] == 0 and off["prefill_tokens_saved"] == 0
    assert 0 < on_["prefix_hit_rate"] < 1
    assert on_["prefill_tokens_saved"] == on_["total_prefix_hit_tokens"]
    assert on_["cache_evictions"] > 0 and off["cache_evictions"] == 0  # a small pool
    assert "Prefix hit rate" in format_summary(on_)
    assert "Prefix hit rate" not in format_summary(off)
    assert on_["completed"] == off["completed"] == 120


def test_a_prefix_scheduled_this_step_is_hit_by_a_later_admission() -> None:
    """vLLM names a block when it is allocated for the step that fills it."""
    kv = PagedBlockManager(40, 4, watermark=0.0, enable_prefix_cache=True)
    sched = ContinuousScheduler(kv, 4, 64)
    prompt = tuple(range(100, 118))  # 18 tokens: 4 full blocks
    for rid in (0, 1):
        sched.add(Request(rid, 0.0, 18, 2, prompt_token_ids=prompt), 0.0)
    plan = sched.schedule(0.0)
    # both admitted in one step; the second finds the first's 4 blocks, being computed
    assert plan.request_ids == (0, 1) and plan.context_tokens == (0, 16)
    assert plan.num_new_tokens == (18, 2) and plan.block_tables[1][:4] == plan.block_tables[0][:4]


def test_freed_blocks_named_to_the_back_unnamed_to_the_front() -> None:
    kv = PagedBlockManager(8, 4, watermark=0.0, enable_prefix_cache=True)  # blocks 1..7
    req = Request(0, 0.0, 10, 1, prompt_token_ids=tuple(range(10)))  # 2 full blocks + 2 tokens
    assert kv.allocate(0, 10, request=req) == 0 and kv.block_table(0) == (1, 2, 3)
    kv.cache_computed(0, 10)
    kv.free(0)  # tail first: block 3 (no name) to the front; 2 then 1 (named) to the back
    assert kv.allocate(1, 4) == 0 and kv.block_table(1) == (3,)
    assert kv.allocate(2, 16) == 0 and kv.block_table(2) == (4, 5, 6, 7)
    assert kv.num_evictions == 0
    assert kv.allocate(3, 4) == 0 and kv.block_table(3) == (2,)  # the least recent name goes
    # only block 1's child went: the prefix still hits its first block
    assert kv.num_evictions == 1 and kv.cached_prefix_tokens(Request(
        9, 0.0, 10, 1, prompt_token_ids=tuple(range(10)))) == 4
    kv.check_invariants()


def test_a_recomputed_copy_is_named_and_serves_once_the_first_is_evicted() -> None:
    """A block-aligned prompt's last block is recomputed by every repeat (its last token's
    logits are needed); vLLM names the copy too, and hits find it when the first goes."""
    kv = PagedBlockManager(9, 4, watermark=0.0, enable_prefix_cache=True)  # blocks 1..8
    prompt = tuple(range(8))  # two full blocks
    a, b = (Request(rid, 0.0, 8, 1, prompt_token_ids=prompt) for rid in (0, 1))
    assert kv.allocate(0, 8, request=a) == 0
    kv.cache_computed(0, 8)
    assert kv.allocate(1, 8, request=b) == 4  # block 0 hit, block 1 computed again
    kv.cache_computed(1, 8)
    first, copy = kv.block_table(0)[1], kv.block_table(1)[1]
    assert first != copy and kv.block_hash(first) == kv.block_hash(copy) is not None
    assert kv.num_cached_blocks == 3
    kv.free(0)
    kv.free(1)  # queue: the 5 never used, then first, copy, the shared block 0
    assert kv.allocate(2, 24) == 0 and first in kv.block_table(2)  # evicts the first copy
    assert kv.num_evictions == 1
    kv.free(2)  # never computed: its blocks go to the front unnamed
    longer = Request(3, 0.0, 12, 1, prompt_token_ids=prompt + (50, 51, 52, 53))
    assert kv.cached_prefix_tokens(longer) == 8  # the copy serves the hit
    assert kv.allocate(3, 12, request=longer) == 8 and kv.block_table(3)[1] == copy
    kv.check_invariants()


def test_a_preempted_request_resumes_from_its_prompt_and_output_blocks() -> None:
    kv = PagedBlockManager(50, 4, watermark=0.0, enable_prefix_cache=True)
    req = Request(0, 0.0, 10, 30, prompt_token_ids=tuple(range(10)))
    assert kv.allocate(0, 10, request=req) == 0
    req.num_output_done = 12  # 12 tokens emitted, 21 of the 22 known computed
    kv.append_slots(0, 21)
    kv.cache_computed(0, 21)  # 5 full blocks: 2 of prompt, 1 mixed, 2 of output
    kv.free(0)  # recompute preemption
    # vLLM looks up to known - 1 tokens: every full block, generated ones included
    assert kv.cached_prefix_tokens(req) == 20
    other = Request(1, 0.0, 22, 1, prompt_token_ids=tuple(range(22)))
    assert kv.cached_prefix_tokens(other) == 8  # the generated blocks are the request's own
    assert kv.allocate(0, 22, request=req) == 20
    kv.check_invariants()
