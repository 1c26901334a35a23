"""servesim's continuous scheduler against vLLM 0.32's own Scheduler, from recorded traces.

parity/record_vllm.py ran vLLM's v1 Scheduler on every configuration of
parity/configs.py; here servesim replays the same configurations through the
same step loop and must make the same decision at every step (the one running
set, numpy columns, speculation included). The recorded
trace is the scheduler's oracle; a newer vLLM is `python -m
parity.record_vllm` in its venv (parity/NOTES.md).

The same with async scheduling: vLLM's AsyncScheduler recorded one step ahead
(parity/traces/vllm-0.32.0-async.jsonl.gz, `record_vllm --async`) against
servesim's scheduler in async mode through the same loop (parity.steps.
run_config_async), on the configurations vLLM runs asynchronously.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

from parity.compare import (
    ASYNC_TRACE,
    DEFAULT_TRACE,
    PARALLEL_ASYNC_TRACE,
    PARALLEL_TRACE,
    first_difference,
    load_recorded,
)
from parity.configs import FAMILIES, SPEC_METHODS, generate_configs, runs_async
from parity.parallel import FAMILY as PARALLEL_FAMILY
from parity.parallel import MAX_N, generate_parallel_configs
from parity.servesim_side import ServesimSide
from parity.steps import RunResult, StepRecord, run_config, run_config_async

PARITY = Path(__file__).resolve().parent.parent / "parity"
CONFIGS = generate_configs()
BY_NAME = {c.name: c for c in CONFIGS}
META, RECORDED = load_recorded(DEFAULT_TRACE)
ASYNC_META, ASYNC_RECORDED = load_recorded(ASYNC_TRACE)
ASYNC_CONFIGS = [c for c in CONFIGS if runs_async(c)]
PARALLEL = {c.name: c for c in generate_parallel_configs()}
PARALLEL_RECORDED = {False: load_recorded(PARALLEL_TRACE),
                     True: load_recorded(PARALLEL_ASYNC_TRACE)}




def test_recorded_trace_is_vllm_0_32_on_these_configurations() -> None:
    assert META["scheduler"] == "vllm" and META["vllm_version"] == "0.32.0"
    defaults = META["vllm_scheduler_defaults"]
    assert defaults["scheduler_reserve_full_isl"] is True and defaults["watermark"] == 0.0
    assert set(RECORDED) == set(BY_NAME)
    stale = [n for n, run in RECORDED.items() if run.digest != BY_NAME[n].digest]
    assert not stale, f"re-record: the generator changed {stale[:3]}"
    errors = {n: run.error for n, run in RECORDED.items() if run.error}
    assert not errors, errors


def test_configurations_cover_what_issue_14_asks_for() -> None:
    assert len(CONFIGS) == sum(FAMILIES.values()) >= 200
    assert {c.chunked_prefill for c in CONFIGS} == {True, False}
    seqs = {c.max_num_seqs for c in CONFIGS}
    assert 1 in seqs and 256 in seqs
    assert any(c.watermark > 0 for c in CONFIGS)
    assert any(all(r.arrival_step == 0 for r in c.requests) for c in CONFIGS)
    assert any(len({r.arrival_step for r in c.requests}) > len(c.requests) // 2 for c in CONFIGS)
    # many chunks: a prompt at least 8 budgets long
    assert any(len(r.prompt_token_ids) >= 8 * c.max_num_batched_tokens
               for c in CONFIGS if c.chunked_prefill for r in c.requests)
    assert max(len(c.requests) for c in CONFIGS) >= 200  # running sets in the hundreds
    assert {c.speculative_method for c in CONFIGS if c.speculative_tokens} == set(
        SPEC_METHODS.values())

    def shares_a_block(c) -> bool:
        firsts = [r.prompt_token_ids[:c.block_size] for r in c.requests
                  if len(r.prompt_token_ids) > c.block_size]
        return len(set(firsts)) < len(firsts)
    assert any(c.prefix_caching and shares_a_block(c) for c in CONFIGS)
    assert any(c.prefix_caching and not shares_a_block(c) for c in CONFIGS)
    # and vLLM really was driven through prefix hits, heavy preemption and drafts
    hits = sum(hit > 0 for run in RECORDED.values() for s in run.steps for _, hit in s.admitted)
    preempted = max(sum(len(s.preempted) for s in run.steps) for run in RECORDED.values())
    drafting = sum(len(s.drafts) for run in RECORDED.values() for s in run.steps)
    assert hits > 100 and preempted >= 50 and drafting > 1000


@pytest.mark.parametrize("name", [c.name for c in CONFIGS])
def test_servesim_makes_vllms_decisions(name: str) -> None:
    config = BY_NAME[name]
    mismatch = first_difference(RECORDED[name], run_config(config, ServesimSide(config)))
    assert mismatch is None, mismatch.describe()


def test_async_trace_is_vllm_0_32_async_scheduler_on_these_configurations() -> None:
    assert ASYNC_META["scheduler"] == "vllm" and ASYNC_META["vllm_version"] == "0.32.0"
    assert ASYNC_META["async_scheduling"] is True and ASYNC_META["batch_queue"] == 2
    assert set(ASYNC_RECORDED) == {c.name for c in ASYNC_CONFIGS}
    # vLLM refuses async scheduling with the n-gram drafter: only those stay out
    assert {c.family for c in CONFIGS if not runs_async(c)} == {"spec_ngram"}
    stale = [n for n, run in ASYNC_RECORDED.items() if run.digest != BY_NAME[n].digest]
    assert not stale, f"re-record: the generator changed {stale[:3]}"
    assert not {n: run.error for n, run in ASYNC_RECORDED.items() if run.error}
    # the async runs decide differently from the synchronous ones somewhere (else the
    # async check would prove nothing the synchronous one does not)
    differ = sum(RECORDED[n].steps != run.steps for n, run in ASYNC_RECORDED.items())
    assert differ > len(ASYNC_RECORDED) // 2, differ


@pytest.mark.parametrize("name", [c.name for c in ASYNC_CONFIGS])
def test_servesim_makes_vllms_async_decisions(name: str) -> None:
    config = BY_NAME[name]
    mismatch = first_difference(ASYNC_RECORDED[name],
                                run_config_async(config, ServesimSide(config, True)))
    assert mismatch is None, mismatch.describe()


class _WatchingAsync(ServesimSide):
    """The async servesim side, counting the async rules its plans (= vLLM's) go through."""

    def __init__(self, config) -> None:
        super().__init__(config, async_scheduling=True)
        self.seen = Counter()

    def schedule(self):
        ahead = self.sched._outstanding[0] if self.sched._outstanding else None  # noqa: SLF001
        out = super().schedule()
        plan = self._plan
        if ahead is not None:
            self.seen["scheduled while a step runs"] += 1
            if plan is not None:
                scheduled = set(plan.request_ids)
                for rid, emits in zip(ahead.request_ids, ahead.emits_token, strict=True):
                    req = self.requests[rid]
                    if emits and rid not in scheduled and req.request_id in {
                            r.request_id for r in self.sched.running} \
                            and req.num_output_done + 1 >= req.output_tokens:
                        self.seen["skipped: the running step ends it"] += 1
                if any(k for k in plan.num_spec_tokens) and ahead.num_spec_tokens:
                    self.seen["drafts on drafts in flight"] += 1
            for rid in out.preempted:
                if rid in ahead.request_ids:
                    self.seen["preempted with a step in flight"] += 1
        return out

    def step_done(self):
        plan = self._plans[0]
        before = {rid: r.state for rid, r in self.requests.items()}
        finished = super().step_done()
        if plan is not None:
            for rid in finished:
                if before[rid].name == "WAITING":
                    self.seen["finished by a stale output"] += 1
            if len(self._plans) and self._plans[0] is not None:
                self.seen["applied under a newer plan"] += 1
        return finished


def test_the_async_runs_reach_vllms_async_rules() -> None:
    """The configurations exercise what async scheduling changes."""
    seen = Counter()
    for config in ASYNC_CONFIGS:
        side = _WatchingAsync(config)
        assert run_config_async(config, side).error is None
        seen += side.seen
    wanted = {"scheduled while a step runs", "skipped: the running step ends it",
              "drafts on drafts in flight", "preempted with a step in flight",
              "applied under a newer plan", "finished by a stale output"}
    assert wanted <= set(seen) and min(seen[w] for w in wanted) > 0, seen


def test_async_side_applies_the_oldest_plan() -> None:
    """The async loop is schedule(0), schedule(1), apply(0), schedule(2), apply(1), ..."""
    calls: list[str] = []

    class Logged(ServesimSide):
        def schedule(self):
            calls.append("s")
            return super().schedule()

        def step_done(self):
            calls.append("a")
            return super().step_done()

    config = next(c for c in ASYNC_CONFIGS if c.family == "large_batch")
    assert run_config_async(config, Logged(config, True)).error is None
    assert "".join(calls).startswith("ssasasas")


class _Watching(ServesimSide):
    """The servesim side, counting the special cases its plans (= vLLM's) go through."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.k, self.limit = config.speculative_tokens, config.max_model_len
        self.seen = Counter()

    def schedule(self):
        waiting = {r.request_id for r in self.sched.waiting}
        out = super().schedule()
        named = [n for n in map(self.kv.block_hash, range(self.kv.num_blocks)) if n is not None]
        self.seen["same-content blocks named twice"] += len(named) > len(set(named))
        plan = self._plan
        if plan is not None and plan.num_spec_tokens:
            for rid, new, ctx, k_i in zip(plan.request_ids, plan.num_new_tokens,
                                          plan.context_tokens, plan.num_spec_tokens, strict=True):
                if k_i:
                    req = self.requests[rid]
                    self.seen["drafts past the output"] += \
                        k_i > req.output_tokens - req.num_output_done - 1
                    self.seen["drafts cut at max_model_len"] += \
                        k_i < self.k and ctx + new == self.limit - 1
                    self.seen["decodes padded at admission"] += rid in waiting
        return out


def test_the_recorded_runs_reach_vllms_special_cases() -> None:
    """The configurations exercise what a simpler scheduler would get wrong."""
    seen = Counter()
    for config in CONFIGS:
        if config.family == "prefix_duplicates" or config.speculative_tokens:
            side = _Watching(config)
            assert run_config(config, side).error is None
            seen += side.seen
    assert len(seen) == 4 and min(seen.values()) > 0, seen


def test_first_difference_names_the_step_and_both_sides() -> None:
    same = StepRecord(0, ((0, 16),), (), (), ((0, 0),), 9)
    a = RunResult("x", "d", (same, StepRecord(1, ((0, 1), (1, 8)), (), (), ((1, 16),), 8)))
    b = RunResult("x", "d", (same, StepRecord(1, ((0, 1), (1, 24)), (), (), ((1, 0),), 7)))
    m = first_difference(a, b)
    assert m is not None and m.index == 1
    assert m.fields == ("scheduled", "admitted", "free_blocks")
    text = m.describe()
    assert "(1, 8)" in text and "(1, 24)" in text and "vllm" in text and "servesim" in text
    assert first_difference(a, a) is None
    shorter = first_difference(a, RunResult("x", "d", (same,)))
    assert shorter is not None and shorter.fields == ("steps",) and shorter.index == 1
    drafts = RunResult("x", "d", (StepRecord(0, ((0, 4),), (), (), (), 9, ((0, 3),)),))
    other = RunResult("x", "d", (StepRecord(0, ((0, 4),), (), (), (), 9, ((0, 2),)),))
    assert first_difference(drafts, other).fields == ("drafts",)


def test_recorder_does_not_import_servesim() -> None:
    """The vLLM side runs in vLLM's venv, where sim and simpy do not exist."""
    for module in ("record_vllm", "configs", "steps", "trace", "parallel"):
        tree = ast.parse((PARITY / f"{module}.py").read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [x for x in names if x.split(".")[0] in ("sim", "simpy")], module


# -- n > 1: vLLM's frontend splits a request into n children (parity/parallel.py) ----------

@pytest.mark.parametrize("async_scheduling", [False, True])
def test_parallel_traces_are_vllm_0_32_on_these_configurations(async_scheduling: bool) -> None:
    meta, recorded = PARALLEL_RECORDED[async_scheduling]
    assert meta["vllm_version"] == "0.32.0" and meta["configs"] == PARALLEL_FAMILY
    assert bool(meta["async_scheduling"]) is async_scheduling
    assert set(recorded) == set(PARALLEL)
    stale = [n for n, run in recorded.items() if run.digest != PARALLEL[n].digest]
    assert not stale, f"re-record with --parallel-sampling: the generator changed {stale[:3]}"
    assert not {n: run.error for n, run in recorded.items() if run.error}


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("name", list(PARALLEL))
def test_servesim_splits_n_as_vllm_does(name: str, async_scheduling: bool) -> None:
    """servesim's split (sim.serve.parallel, what `servesim serve` runs) through its
    scheduler makes the decisions vLLM made with its ParentRequest's children."""
    config = PARALLEL[name]
    run = run_config_async if async_scheduling else run_config
    mine = run(config, ServesimSide(config, async_scheduling))
    mismatch = first_difference(PARALLEL_RECORDED[async_scheduling][1][name], mine)
    assert mismatch is None, mismatch.describe()


def test_the_parallel_runs_reach_what_n_changes() -> None:
    """vLLM admitted siblings in one step, the later ones hitting the first one's full
    prompt blocks; split one parent's children over steps; and preempted children."""
    _, recorded = PARALLEL_RECORDED[False]
    together_hit = split = preempted = 0
    for name, run in recorded.items():
        config = PARALLEL[name]
        prompt = {r.request_id: len(r.prompt_token_ids) for r in config.requests}
        n_of = {r.request_id: r.n for r in config.requests}
        first_step: dict[int, int] = {}  # child -> the step that first admitted it
        for step in run.steps:
            parents = [rid // MAX_N for rid, _ in step.admitted]
            for rid, hit in step.admitted:
                parent, index = divmod(rid, MAX_N)
                first_step.setdefault(rid, step.step)
                full = (prompt[parent] - 1) // config.block_size * config.block_size
                if config.prefix_caching and index > 0 and parents.count(parent) > 1 \
                        and full and hit >= full:
                    together_hit += 1
            preempted += sum(n_of[rid // MAX_N] > 1 for rid in step.preempted)
        steps_of: dict[int, set[int]] = {}
        for rid, at in first_step.items():
            steps_of.setdefault(rid // MAX_N, set()).add(at)
        split += sum(len(steps) > 1 for steps in steps_of.values())
    assert min(together_hit, split, preempted) > 0, (together_hit, split, preempted)
