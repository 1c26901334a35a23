"""Speculative decoding in the simulator: the step contract, acceptance, KV, cost, metrics."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.assemble import kv_budget
from sim.cli import main
from sim.config.catalogue import get_hardware, get_model
from sim.config.costs import kv_bytes_per_token, weights_bytes
from sim.config.loader import load_scenario
from sim.core.contiguous import ContiguousAllocator
from sim.core.drive import run_steps
from sim.core.kv import PagedBlockManager
from sim.core.plan import StepPlan, StepResult, StepShape, checked_plan
from sim.core.request import Request, RequestState
from sim.core.schedulers import ContinuousScheduler
from sim.experiments.run import run_scenario
from sim.latency import RooflineLatency
from sim.latency.draft import ModelDraft, NgramDraft, SpeculativeLatency
from sim.world.speculation import (
    AcceptanceSampler,
    BetaAcceptance,
    FixedAcceptance,
    UniformAcceptance,
    accepted_drafts,
    alpha_for_tokens_per_step,
    expected_tokens_per_step,
    request_uniform,
)

H100, LLAMA = get_hardware("h100-sxm"), get_model("llama-3-8b")


def drive_spec(sched: ContinuousScheduler, requests: list[Request], sampler: AcceptanceSampler,
               on_step=None) -> list[tuple[StepPlan, StepResult]]:
    """A virtual clock, 1 s per step (sim.core.drive); checks the pool after each step."""
    steps: list[tuple[StepPlan, StepResult]] = []

    def result(plan: StepPlan) -> StepResult:
        steps.append((plan, sampler(plan)))
        return steps[-1][1]

    def after() -> None:
        sched.kv.check_invariants()
        if on_step is not None:
            on_step(*steps[-1])

    run_steps(sched, requests, lambda _: 1.0, after=after, result=result, max_steps=100_000)
    return steps


def spec_rows(steps: list[tuple[StepPlan, StepResult]]) -> list[tuple[int, int]]:
    """(k_i, tokens emitted) for every drafting sequence-step."""
    rows = []
    for plan, result in steps:
        emitted = iter(result.num_emitted)
        for k, emits in zip(plan.num_spec_tokens or (0,) * plan.batch_size, plan.emits_token,
                            strict=True):
            count = next(emitted, 1) if emits else 0
            if k:
                rows.append((k, count))
    return rows


def tokens_pmf(alpha: float, k: int) -> np.ndarray:
    """P(a step emits j + 1 tokens), j = 0..k: accept j drafts then reject (or accept all)."""
    p = np.array([alpha**j * (1 - alpha) for j in range(k)] + [alpha**k])
    return p


@pytest.mark.parametrize(("alpha", "k"), [(0.3, 1), (0.7, 4), (0.9, 3), (0.55, 6)])
def test_mean_tokens_per_step_matches_formula(alpha: float, k: int) -> None:
    kv = PagedBlockManager(4000, 16)
    sched = ContinuousScheduler(kv, 32, 2048, speculative_tokens=k)
    reqs = [Request(i, 0.0, 50 + 3 * i, 600) for i in range(32)]
    rows = spec_rows(drive_spec(sched, reqs, AcceptanceSampler(FixedAcceptance(alpha), 11)))
    full = np.array([n for ki, n in rows if ki == k], dtype=float)
    pmf = tokens_pmf(alpha, k)
    tokens = np.arange(1, k + 2)
    mean, var = float(pmf @ tokens), float(pmf @ tokens**2) - float(pmf @ tokens) ** 2
    assert mean == pytest.approx(expected_tokens_per_step(alpha, k))  # pmf and formula agree
    assert len(full) > 3000
    # 4.5 standard errors: a false alarm about once in 150,000 (the seed is fixed anyway)
    assert abs(full.mean() - mean) < 4.5 * math.sqrt(var / len(full))
    # the whole distribution, not just its mean: a chi-square over 1..k+1 tokens
    observed = np.bincount(full.astype(int), minlength=k + 2)[1:]
    chi2 = float(((observed - len(full) * pmf) ** 2 / (len(full) * pmf)).sum())
    assert chi2 < 30.0  # chi-square with <= 6 dof: P(> 30) < 1e-4


def test_alpha_zero_emits_one_token_per_step_and_alpha_one_all() -> None:
    for alpha, k in [(0.0, 4), (1.0, 3)]:
        kv = PagedBlockManager(500, 8)
        sched = ContinuousScheduler(kv, 8, 256, speculative_tokens=k)
        reqs = [Request(i, 0.0, 20 + i, 30 + 7 * i) for i in range(6)]
        steps = drive_spec(sched, reqs, AcceptanceSampler(FixedAcceptance(alpha)))
        rows = spec_rows(steps)
        assert rows and all(n == (1 if alpha == 0 else ki + 1) for ki, n in rows)
        for r in reqs:
            decode_steps = sum(r.request_id in p.request_ids for p, _ in steps) - 1
            # the prompt's step emits token 1; alpha 0: one per decode; alpha 1: k + 1
            assert decode_steps == (r.output_tokens - 1 if alpha == 0
                                    else math.ceil((r.output_tokens - 1) / (k + 1)))
            assert r.state is RequestState.FINISHED and r.num_output_done == r.output_tokens


def test_a_speculative_decode_is_scheduled_as_the_contract_says() -> None:
    kv = PagedBlockManager(100, 4)
    sched = ContinuousScheduler(kv, 4, 64, speculative_tokens=3)
    req = Request(0, 0.0, prompt_tokens=10, output_tokens=6)
    sched.add(req, 0.0)
    first = sched.schedule(0.0)
    assert first.num_spec_tokens == () and first.num_new_tokens == (10,)  # the prompt: no drafts
    sched.on_step_done(first, StepResult(), 1.0)
    plan = sched.schedule(1.0)
    # last emitted token + 3 drafts; KV before is the prompt; slots for all 4 new tokens
    assert plan.num_new_tokens == (4,) and plan.num_spec_tokens == (3,)
    assert plan.context_tokens == (10,) and not plan.is_prefill[0] and plan.emits_token[0]
    assert len(plan.block_tables[0]) == kv.blocks_for(10 + 4)
    shape = plan.shape
    assert (shape.num_decodes, shape.num_spec_decodes, shape.num_spec_tokens,
            shape.spec_depth, shape.spec_context_sum) == (1, 1, 3, 3, 10)
    assert shape.num_tokens == 4 and shape.decode_query_tokens == 4.0
    with pytest.raises(ValueError, match="allowed 1..4"):
        sched.on_step_done(plan, StepResult(num_emitted=(5,)), 2.0)
    sched.on_step_done(plan, StepResult(num_emitted=(2,)), 2.0)  # one draft accepted
    assert (req.num_output_done, req.num_computed_tokens) == (3, 12)  # 2 drafts rolled back
    plan = sched.schedule(2.0)
    # 3 tokens left to emit: vLLM still verifies all 3 drafts ...
    assert plan.num_spec_tokens == (3,) and plan.context_tokens == (12,)
    sched.on_step_done(plan, StepResult(num_emitted=(4,)), 3.0)
    # ... and stops at max_tokens: the 4th token is discarded, though it counts as accepted
    assert req.state is RequestState.FINISHED and req.num_output_done == 6
    assert (req.spec_drafted, req.spec_accepted) == (6, 4)
    assert kv.num_used_blocks == 0


def test_drafts_stop_at_max_model_len() -> None:
    kv = PagedBlockManager(100, 4)
    sched = ContinuousScheduler(kv, 4, 64, max_model_len=16, speculative_tokens=4)
    req = Request(0, 0.0, prompt_tokens=11, output_tokens=5)  # 16 tokens: the whole context
    steps = drive_spec(sched, [req], AcceptanceSampler(FixedAcceptance(0.0)))
    # no position past max_model_len - 1 = 15: drafts shrink as the context fills
    assert [p.num_spec_tokens for p, _ in steps[1:]] == [(3,), (2,), (1,), ()]
    assert all(p.context_tokens[0] + p.num_new_tokens[0] <= 15 for p, _ in steps)


def test_a_decode_admitted_among_decodes_is_padded_to_k_plus_1() -> None:
    """vLLM pads an admission with one token left to 1 + k drafts (the CUDA-graph shape)."""
    kv = PagedBlockManager(100, 16, enable_prefix_cache=True)
    sched = ContinuousScheduler(kv, 4, 256, speculative_tokens=3)
    prompt = tuple(range(17))  # one full block and one token
    a = Request(0, 0.0, 17, 10, prompt_token_ids=prompt)
    b = Request(1, 0.0, 17, 10, prompt_token_ids=prompt)
    sched.add(a, 0.0)
    sched.on_step_done(sched.schedule(0.0), StepResult(), 1.0)  # a's prompt: no drafts
    sched.add(b, 1.0)  # b finds a's full block cached: one token left to compute
    plan = sched.schedule(1.0)
    assert plan.request_ids == (0, 1) and plan.context_tokens == (17, 16)
    assert plan.num_new_tokens == (4, 4) and plan.num_spec_tokens == (3, 3)
    assert plan.shape.num_decodes == plan.shape.num_spec_decodes == 2
    sched.on_step_done(plan, StepResult(num_emitted=(2, 3)), 2.0)
    assert (b.num_output_done, b.first_token_s, b.num_computed_tokens) == (3, 2.0, 19)


def test_draft_model_method_costs_a_budget_slot_per_request_and_k_kv_slots() -> None:
    plans = {}
    for method in ("ngram", "draft_model"):
        kv = PagedBlockManager(100, 4)
        sched = ContinuousScheduler(kv, 4, 61, speculative_tokens=2, speculative_method=method)
        for rid in (0, 1):
            sched.add(Request(rid, 0.0, 30, 5), 0.0)
        plans[method] = sched.schedule(0.0)
    # n-gram: two 30-token prompts fit 61; a draft model takes one slot per request
    assert plans["ngram"].num_new_tokens == (30, 30)
    assert plans["draft_model"].num_new_tokens == (30, 29)
    # and its drafter writes k tokens past the scheduled ones: KV for 32 tokens, 8 blocks
    assert [len(t) for t in plans["ngram"].block_tables] == [8, 8]  # 30 tokens
    assert [len(t) for t in plans["draft_model"].block_tables] == [8, 8]  # 32 and 31 tokens
    with pytest.raises(ValueError, match="speculative_method"):
        ContinuousScheduler(PagedBlockManager(10, 4), speculative_method="eagle")


def test_budget_caps_drafts() -> None:
    kv = PagedBlockManager(100, 4)
    sched = ContinuousScheduler(kv, 4, 6, speculative_tokens=4)
    reqs = [Request(i, 0.0, 2, 20) for i in range(2)]
    steps = drive_spec(sched, reqs, AcceptanceSampler(FixedAcceptance(0.0)))
    for plan, _ in steps:
        assert plan.shape.num_tokens <= 6
    # both decode: the first takes 1 + 4, the second what is left: 1 + 0
    assert any(p.num_spec_tokens == (4, 0) for p, _ in steps)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 120), st.integers(1, 60)), min_size=1, max_size=25),
       st.integers(12, 120), st.sampled_from([1, 4, 16]), st.integers(1, 8), st.integers(1, 8),
       st.sampled_from([0.0, 0.4, 0.8, 1.0]), st.booleans(),
       st.sampled_from(["paged", "contiguous", "swap"]))
def test_kv_never_leaks_speculative_blocks(spec, num_blocks, block_size, max_seqs, k, alpha,
                                           chunked, pool) -> None:
    budget = max(64, max_seqs)
    if pool == "contiguous":
        kv = ContiguousAllocator(num_blocks, block_size, 0.0)
    else:
        kv = PagedBlockManager(num_blocks, block_size, 0.01,
                               host_swap_blocks=40 if pool == "swap" else 0)
    sched = ContinuousScheduler(kv, max_seqs, budget, chunked, 200,
                                preemption="swap" if pool == "swap" else "recompute",
                                speculative_tokens=k)
    reqs = [Request(i, 0.0, p, o) for i, (p, o) in enumerate(spec)]
    for r in reqs:
        sched.add(r, 0.0)
    sampler = AcceptanceSampler(FixedAcceptance(alpha), 3)

    def check(plan: StepPlan, _result: StepResult) -> None:
        assert plan.shape.num_tokens <= budget
        for new, ctx, k_i in zip(plan.num_new_tokens, plan.context_tokens,
                                 plan.num_spec_tokens or (0,) * plan.batch_size, strict=True):
            if k_i:  # a decode verifying at most k drafts, never past max_model_len - 1
                assert new == 1 + k_i and k_i <= k and ctx + new <= 199
        for r in sched.running:  # drafts held past a step: at most k token slots
            if pool != "contiguous":  # (a contiguous table shows its whole reservation)
                assert len(kv.block_table(r.request_id)) <= kv.blocks_for(
                    r.num_computed_tokens + k)
            assert r.num_output_done <= r.output_tokens

    drive_spec(sched, [], sampler, check)  # every request was added above
    assert kv.num_used_blocks == 0
    for r in reqs:
        assert r.state is RequestState.REJECTED or r.num_output_done == r.output_tokens


def _spec_plan(rids: tuple[int, ...], k: int = 4) -> StepPlan:
    n = len(rids)
    return checked_plan(StepPlan(rids, (k + 1,) * n, (100,) * n, ((),) * n, (False,) * n,
                                 (True,) * n, StepShape(), num_spec_tokens=(k,) * n))


def test_a_requests_alpha_depends_on_seed_and_id_only() -> None:
    model = UniformAcceptance(0.2, 0.9)
    sampler = AcceptanceSampler(model, seed=4)
    before = sampler.alpha(7)
    sampler(_spec_plan((3, 7, 9)))  # a step in between changes nothing
    assert sampler.alpha(7) == before == AcceptanceSampler(model, 4).alpha(7)
    assert before != AcceptanceSampler(model, 5).alpha(7)
    assert len({sampler.alpha(r) for r in range(50)}) == 50


def test_per_request_alpha_distributions() -> None:
    u = [request_uniform(1, r) for r in range(20_000)]
    assert min(u) > 0 and max(u) < 1 and abs(np.mean(u) - 0.5) < 0.01
    beta = np.array([BetaAcceptance(0.7, 0.1).alpha_at(x) for x in u])
    assert abs(beta.mean() - 0.7) < 0.005 and abs(beta.std() - 0.1) < 0.005
    uniform = [UniformAcceptance(0.2, 0.6).alpha_at(x) for x in u]
    assert min(uniform) >= 0.2 and max(uniform) <= 0.6 and abs(np.mean(uniform) - 0.4) < 0.01
    # a mixture of alphas: the mean tokens per step is the mean of each alpha's formula
    k, rng = 3, np.random.default_rng(0)
    emitted = [1 + accepted_drafts(float(x), a, k) for x, a in zip(rng.random(20_000), uniform,
                                                                    strict=True)]
    expected = np.mean([expected_tokens_per_step(a, k) for a in uniform])
    assert abs(np.mean(emitted) - expected) < 0.03


def test_verify_pass_costs_what_a_prefill_chunk_of_k_plus_1_costs() -> None:
    """k drafts at context c are k + 1 query rows over c: a chunk's work, plus k logit rows."""
    lat = RooflineLatency(LLAMA, H100)
    k, c = 4, 3000
    verify = StepShape(num_decodes=1, decode_context_sum=c, decode_context_max=c,
                       padded_batch=1, num_spec_decodes=1, num_spec_tokens=k, spec_depth=k,
                       spec_context_sum=c)
    chunk = StepShape((k + 1,), (c,), padded_batch=1)
    v, p = lat.breakdown(verify), lat.breakdown(chunk)
    lm_head = 2 * LLAMA.hidden_size * LLAMA.vocab_size  # FLOPs of one row of logits
    assert v["flops"] == pytest.approx(p["flops"] + k * lm_head)
    assert v["bytes"] == pytest.approx(p["bytes"])


def test_verify_is_nearly_free_when_memory_bound_and_not_when_compute_bound() -> None:
    lat = RooflineLatency(LLAMA, H100)

    def step(batch: int, k: int) -> float:
        ctx = 1000 * batch
        return lat.step_time(StepShape(num_decodes=batch, decode_context_sum=ctx,
                                       decode_context_max=1000, padded_batch=batch,
                                       num_spec_decodes=batch if k else 0,
                                       num_spec_tokens=k * batch, spec_depth=k,
                                       spec_context_sum=ctx if k else 0))

    assert step(8, 4) < 1.05 * step(8, 0)  # 40 rows: the weights' read dominates
    big = lat.breakdown(StepShape(num_decodes=256, decode_context_sum=256_000,
                                  padded_batch=256, num_spec_decodes=256,
                                  num_spec_tokens=1024, spec_depth=4, spec_context_sum=256_000))
    assert big["compute_s"] > big["memory_s"]  # 1280 rows: compute-bound
    assert step(256, 4) > 1.5 * step(256, 0)  # 5x the rows, memory time no longer hides them
    assert all(step(64, k) < step(64, k + 1) for k in range(6))


def test_draft_cost() -> None:
    target = RooflineLatency(LLAMA, H100)
    shape = StepShape(num_decodes=16, decode_context_sum=16_000, decode_context_max=1000,
                      padded_batch=16, num_spec_decodes=16, num_spec_tokens=48, spec_depth=3,
                      spec_context_sum=16_000)
    assert SpeculativeLatency(target, NgramDraft()).step_time(shape) == target.step_time(shape)
    assert SpeculativeLatency(target, NgramDraft(1e-4)).step_time(shape) == pytest.approx(
        target.step_time(shape) + 1e-4)
    # a draft as big as the target: each of its k passes costs one plain decode step
    same = ModelDraft(target)
    plain = [target.step_time(StepShape(num_decodes=16, decode_context_sum=16_000 + 16 * j,
                                        decode_context_max=1000 + j, padded_batch=16))
             for j in range(3)]
    assert same.draft_time_s(shape) == pytest.approx(sum(plain))
    # a draft model also prefills the prompt chunks into its own KV; no work, no cost
    chunk = StepShape((512,), (0,), padded_batch=1)
    assert same.draft_time_s(chunk) == pytest.approx(target.step_time(chunk))
    assert same.draft_time_s(StepShape()) == 0.0


DRAFT_1B = {"base": "llama-3-8b", "name": "llama-3.2-1b", "num_layers": 16,
            "hidden_size": 2048, "num_heads": 32, "num_kv_heads": 8, "head_dim": 64,
            "intermediate_size": 8192, "tie_embeddings": True}
SMALL = ["workload.num_requests=80", "workload.arrivals.rate=2",
         "workload.output_tokens={dist: uniform, low: 100, high: 300}",
         "workload.prompt_tokens={dist: uniform, low: 100, high: 1000}"]


def _run(*sets: str) -> dict:
    scenario, base = load_scenario(None, [*SMALL, *sets])
    summary = run_scenario(scenario, base, show_progress=False).summary
    summary.pop("simulation_wall_s")
    return summary


def test_scenario_speeds_up_a_memory_bound_load_and_counts_acceptance() -> None:
    off = _run()
    on = _run("speculative.num_tokens=3", "speculative.acceptance.alpha=0.8",
              f"speculative.draft={json.dumps(DRAFT_1B)}")
    again = _run("speculative.num_tokens=3", "speculative.acceptance.alpha=0.8",
                 f"speculative.draft={json.dumps(DRAFT_1B)}")
    assert json.dumps(on, sort_keys=True) == json.dumps(again, sort_keys=True)  # deterministic
    assert "spec_acceptance_rate" not in off
    # acceptances near the end of outputs are capped, so the mean sits just below the formula
    expected = expected_tokens_per_step(0.8, 3)
    assert expected - 0.15 < on["mean_tokens_per_spec_step"] < expected + 0.05
    assert on["spec_acceptance_rate"] == pytest.approx(
        on["spec_accepted_tokens"] / on["spec_draft_tokens"])
    assert on["median_tpot_ms"] < 0.7 * off["median_tpot_ms"]
    assert on["latency_model"] == "roofline + llama-3.2-1b draft"
    # a draft that is never accepted only costs
    never = _run("speculative.num_tokens=3", "speculative.acceptance.alpha=0",
                 f"speculative.draft={json.dumps(DRAFT_1B)}")
    assert never["mean_tokens_per_seq_step"] == 1.0
    assert never["median_tpot_ms"] > off["median_tpot_ms"]
    assert never["total_output_tokens"] == off["total_output_tokens"]


def test_seed_changes_the_draws_and_nothing_else() -> None:
    plan = _spec_plan(tuple(range(2000)))
    model = FixedAcceptance(0.6)
    a, b = AcceptanceSampler(model, 0)(plan), AcceptanceSampler(model, 1)(plan)
    assert a == AcceptanceSampler(model, 0)(plan) and a != b
    mean = expected_tokens_per_step(0.6, 4)
    assert abs(np.mean(a.num_emitted) - mean) < 0.1 and abs(np.mean(b.num_emitted) - mean) < 0.1


def test_draft_model_memory_comes_out_of_the_kv_pool() -> None:
    scenario, _ = load_scenario(None, ["speculative.num_tokens=4",
                                       f"speculative.draft={json.dumps(DRAFT_1B)}"])
    plain, _ = load_scenario(None, [])
    with_draft, without = kv_budget(scenario), kv_budget(plain)
    draft = scenario.speculative.draft_spec
    assert with_draft.weights_bytes == pytest.approx(without.weights_bytes
                                                     + weights_bytes(draft))
    assert with_draft.kv_bytes_per_token == without.kv_bytes_per_token + kv_bytes_per_token(draft)
    free = H100.memory_bytes * 0.9 - with_draft.weights_bytes - with_draft.activation_reserve_bytes
    assert with_draft.num_blocks == int(free // (with_draft.kv_bytes_per_token * 16))
    assert with_draft.num_blocks < without.num_blocks


@pytest.mark.parametrize(("sets", "field"), [
    (["speculative.num_tokens=2", "scheduler.policy=static"], "speculative.num_tokens"),
    (["speculative.num_tokens=2", "speculative.draft=qwen2.5-1.5b"], "speculative.draft"),
    (["speculative.acceptance={dist: beta, mean: 0.9, std: 0.5}"], "speculative.acceptance"),
    (["speculative.acceptance.alpha=1.5"], "speculative.acceptance.alpha"),
    (["speculative.num_tokens=-1"], "speculative.num_tokens"),
])
def test_bad_speculative_settings_exit_2_naming_the_field(sets, field, capsys) -> None:
    argv = ["run", "--quiet", "--no-plots"]
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{field}:" in err and "Traceback" not in err


@settings(max_examples=80, deadline=None)
@given(alpha=st.floats(0.0, 0.999), k=st.floats(0.5, 16.0))
def test_alpha_for_tokens_per_step_inverts_the_expectation(alpha: float, k: float) -> None:
    """What validation hands the simulator: the alpha that reproduces an engine's mean."""
    mean = expected_tokens_per_step(alpha, k)
    recovered = alpha_for_tokens_per_step(mean, k)
    assert expected_tokens_per_step(recovered, k) == pytest.approx(mean, rel=1e-9, abs=1e-9)


def test_alpha_for_tokens_per_step_ends_and_refusals() -> None:
    assert alpha_for_tokens_per_step(1.0, 4) == 0.0
    assert alpha_for_tokens_per_step(5.0, 4) == 1.0
    with pytest.raises(ValueError, match="tokens_per_step must be in"):
        alpha_for_tokens_per_step(5.5, 4)
    with pytest.raises(ValueError, match="tokens_per_step must be in"):
        alpha_for_tokens_per_step(0.9, 4)


def test_each_request_counts_its_drafts_and_acceptances() -> None:
    """Per request (requests.csv with speculation on): drafts verified and accepted, summing
    to the run's totals; each request accepts at most what it drafted."""
    scenario, base = load_scenario(None, [*SMALL, "speculative.num_tokens=4",
                                          "speculative.acceptance={dist: uniform, low: 0.1, "
                                          "high: 0.9}"])
    run = run_scenario(scenario, base, show_progress=False)
    frame = run.recorder.requests_frame()
    assert frame["spec_drafted"].sum() == run.summary["spec_draft_tokens"]
    assert frame["spec_accepted"].sum() == run.summary["spec_accepted_tokens"]
    assert (frame["spec_accepted"] <= frame["spec_drafted"]).all()
    assert (frame["spec_accepted"] + 1 <= frame["output_tokens"]).all()
    off, _ = load_scenario(None, SMALL)
    assert "spec_drafted" not in run_scenario(off, base, show_progress=False) \
        .recorder.requests_frame()
