"""Speculative decoding in the engine: exact for greedy, distribution-preserving for sampling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

torch = pytest.importorskip("torch")

from gpu_engine.drafters import ModelDrafter, NgramDrafter  # noqa: E402
from gpu_engine.engine import Engine  # noqa: E402
from gpu_engine.inputs import build_inputs  # noqa: E402
from gpu_engine.kv_cache import PagedKVCache  # noqa: E402
from gpu_engine.sampling import SamplingParams  # noqa: E402
from gpu_engine.setup import build_engine  # noqa: E402
from gpu_engine.speculative import Drafts, VerifyRow, unpack, verify  # noqa: E402
from sim.assemble import build_latency  # noqa: E402
from sim.config.scenario import Scenario  # noqa: E402
from sim.core.request import Request  # noqa: E402
from sim.results.record.recorder import RunRecorder  # noqa: E402
from sim.workload import make_requests  # noqa: E402

CPU_HW = {"name": "cpu-test", "bf16_flops_per_s": 5e10, "memory_bytes": 2**26,
          "memory_bandwidth_bytes_per_s": 1e10, "interconnect_bandwidth_bytes_per_s": 1e9,
          "host_link_bandwidth_bytes_per_s": 1e9}


def scenario(k: int, draft: str | dict = "ngram", model: str | dict = "tiny",
             num_blocks: int = 400, max_num_seqs: int = 8, num_requests: int = 8) -> Scenario:
    return Scenario.model_validate({
        "name": "spec-test", "seed": 5, "model": model, "hardware": {"gpu": CPU_HW},
        "scheduler": {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": 512},
        "kv": {"num_blocks": num_blocks, "block_size": 8},
        "engine": {"device": "cpu", "warmup": False},
        "speculative": {"num_tokens": k, "draft": draft},
        "workload": {"arrivals": {"process": "poisson", "rate": 100.0},
                     "prompt_tokens": {"dist": "uniform", "low": 4, "high": 40},
                     "output_tokens": {"dist": "uniform", "low": 2, "high": 30},
                     "num_requests": num_requests},
    })


def greedy_outputs(sc: Scenario, drafter: object | None = None) -> tuple[dict, Engine]:
    engine = build_engine(sc, latency=build_latency(sc)).engine
    if drafter is not None:
        engine.drafter = drafter(engine) if callable(drafter) else drafter
    requests = list(make_requests(sc.workload, sc.seed))
    for r in requests:
        engine.add_request(Request(r.request_id, 0.0, r.prompt_tokens, r.output_tokens), now=0.0)
    for _ in engine.stream():
        pass
    return {r.request_id: engine.output_ids(r.request_id) for r in requests}, engine


def same_model_drafter(engine: Engine) -> ModelDrafter:
    """A 'perfect' draft: the target itself, with its own KV tensors."""
    kv = PagedKVCache.for_spec(engine.model.spec, engine.kv.num_blocks, engine.kv.block_size,
                               torch.float32, "cpu")
    return ModelDrafter(engine.model, kv, torch.device("cpu"))


@pytest.mark.parametrize("draft", ["ngram", "other-model", "same-model"])
def test_greedy_speculative_decoding_equals_plain_greedy(draft: str) -> None:
    plain, _ = greedy_outputs(scenario(0))
    if draft == "ngram":
        spec, engine = greedy_outputs(scenario(3))
        assert isinstance(engine.drafter, NgramDrafter)
    elif draft == "other-model":
        spec, engine = greedy_outputs(scenario(3, draft={"base": "tiny", "num_layers": 1}))
        assert isinstance(engine.drafter, ModelDrafter)
    else:
        spec, engine = greedy_outputs(scenario(3), same_model_drafter)
        accepted = sum(log.num_emitted.count(4) for log in engine.steps if log.num_emitted)
        drafted = sum(len(log.num_emitted) for log in engine.steps if log.num_emitted)
        assert drafted > 0 and accepted / drafted > 0.5  # the target agrees with itself
    assert spec == plain
    steps_plain = len(greedy_outputs(scenario(0))[1].steps)
    if draft == "same-model":
        assert len(engine.steps) < steps_plain  # more tokens per step: fewer steps


def test_speculative_replay_records_acceptance() -> None:
    sc = scenario(2)
    engine = build_engine(sc, latency=build_latency(sc)).engine
    recorder = RunRecorder()
    engine.replay(make_requests(sc.workload, sc.seed), recorder)
    summary = recorder.summary()
    emitted = sum(sum(log.num_emitted) for log in engine.steps if log.num_emitted)
    assert emitted > 0
    assert summary["completed"] == sc.workload.num_requests
    frame = recorder.requests_frame()
    wanted = {r.request_id: r.output_tokens for r in make_requests(sc.workload, sc.seed)}
    assert dict(zip(frame.request_id, frame.output_tokens, strict=True)) == wanted


@pytest.mark.parametrize("deterministic_draft", [False, True])
def test_rejection_rule_preserves_the_target_distribution(deterministic_draft: bool) -> None:
    """Emitted tokens follow p whatever q: the first token, and the second given the first.

    All trials are rows of one `verify` call (one request each, its own seed), so this is
    also the batched rule's check: rows do not leak into each other.
    """
    rng = np.random.default_rng(0)
    vocab, trials = 5, 4000
    target_logits = torch.tensor(rng.normal(0, 1.0, (3, vocab)), dtype=torch.float32)
    p = torch.softmax(target_logits, -1)
    q = torch.softmax(torch.tensor(rng.normal(0, 1.5, (2, vocab)), dtype=torch.float32), -1)
    params = SamplingParams(temperature=1.0)
    q_rows = q.double().numpy()
    q_rows /= q_rows.sum(-1, keepdims=True)
    if deterministic_draft:
        host = ((0, 1),) * trials
        drafts = Drafts(None, (2,) * trials, host)
    else:
        host = tuple(tuple(int(rng.choice(vocab, p=q_rows[j])) for j in range(2))
                     for _ in range(trials))
        drafts = Drafts(None, (2,) * trials, host, q.expand(trials, 2, vocab).contiguous(),
                        tuple(range(trials)))
    rows = [VerifyRow(3 * i, 2, i, 10, params, seed) for i, seed in enumerate(range(trials))]
    flat = verify(target_logits.repeat(trials, 1), rows, drafts).tolist()
    firsts, seconds = np.zeros(vocab), np.zeros(vocab)
    for out, draft in zip(unpack(flat, trials, 2), host, strict=True):
        assert 1 <= len(out) <= 3
        firsts[out[0]] += 1
        if len(out) > 1 and out[0] == draft[0]:
            seconds[out[1]] += 1
    assert chisquare(firsts, expected_counts(p[0], firsts.sum())).pvalue > 1e-3
    assert seconds.sum() > trials / 10
    assert chisquare(seconds, expected_counts(p[1], seconds.sum())).pvalue > 1e-3


def test_greedy_verify_keeps_the_drafts_the_argmax_agrees_with() -> None:
    logits = torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [5.0, 0.0, 0.0],  # 1, 2, 0
                           [0.0, 0.0, 9.0],  # a row that drafts nothing: 2
                           [9.0, 0.0, 0.0], [0.0, 9.0, 0.0], [0.0, 0.0, 9.0]])  # 0, 1, 2
    greedy = SamplingParams()
    rows = [VerifyRow(0, 2, 0, 5, greedy, None), VerifyRow(3, 0, -1, 7, greedy, None),
            VerifyRow(4, 2, 1, 3, greedy, None)]
    drafts = Drafts(None, (2, 2), ((1, 0), (0, 1)))
    out = unpack(verify(logits, rows, drafts).tolist(), 3, 2)
    assert out == [[1, 2], [2], [0, 1, 2]]  # one accepted then the fix; none; all + bonus


def expected_counts(probs: torch.Tensor, total: float) -> np.ndarray:
    exact = probs.double().numpy()
    return exact / exact.sum() * total


def test_sampled_speculative_engine_matches_the_targets_joint_distribution() -> None:
    """Two tokens after a fixed prompt, k = 1 from prompt lookup: (t1, t2) ~ p(t1) p(t2 | t1)."""
    tiny8 = {"base": "tiny", "vocab_size": 8}
    sc = scenario(1, model=tiny8, num_blocks=3000, max_num_seqs=256)
    engine = build_engine(sc, latency=build_latency(sc)).engine
    prompt = (1, 2, 3, 1, 2)
    n = 3000
    for i in range(n):
        engine.add_request(Request(i, 0.0, len(prompt), 3, prompt_token_ids=prompt),
                           SamplingParams(temperature=1.0, seed=i), now=0.0)
    for _ in engine.stream():
        pass
    assert any(log.num_emitted for log in engine.steps), "no speculative step ran"
    pairs = np.array([engine.output_ids(i)[:2] for i in range(n)])
    observed = np.zeros((8, 8))
    np.add.at(observed, (pairs[:, 0], pairs[:, 1]), 1)
    expected = np.outer(next_token_probs(engine, prompt), np.ones(8))
    for t1 in range(8):
        expected[t1] *= next_token_probs(engine, (*prompt, t1))
    expected *= n
    keep = expected.ravel() >= 5
    obs, exp = observed.ravel()[keep], expected.ravel()[keep]
    assert chisquare(obs, exp / exp.sum() * obs.sum()).pvalue > 1e-3


def next_token_probs(engine: Engine, tokens: tuple[int, ...]) -> np.ndarray:
    """The target's next-token distribution after `tokens`, by one plain forward pass."""
    kv = PagedKVCache.for_spec(engine.model.spec, 4, 8, torch.float32, "cpu")
    inputs = build_inputs([list(tokens)], [0], [(1,)], [True], 8, "cpu")
    with torch.inference_mode():
        logits = engine.model(inputs, kv)
    return torch.softmax(logits[0].double(), -1).numpy()


def _scan_lookup(tokens: list[int], k: int, max_ngram: int = 3) -> tuple[int, ...]:
    """Prompt lookup by rescanning the whole history: the rule the index must reproduce."""
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                follow = tokens[start + n:start + n + k]
                return tuple(follow + [follow[-1]] * (k - len(follow)))
    return (tokens[-1],) * k


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(0, 4), min_size=1, max_size=60),
       growth=st.lists(st.integers(1, 5), min_size=1, max_size=12), k=st.integers(1, 4))
def test_incremental_prompt_lookup_equals_a_rescan(tokens, growth, k) -> None:
    """The per-request index gives the rescan's drafts after every step's growth."""
    drafter = NgramDrafter()
    seen = tokens[:1]
    rest = iter(tokens[1:])
    for add in growth:
        assert drafter._lookup(7, seen, k) == _scan_lookup(seen, k)
        seen = seen + [t for _, t in zip(range(add), rest, strict=False)]
    assert drafter._lookup(7, seen, k) == _scan_lookup(seen, k) == drafter.lookup(seen, k)
    drafter.forget(7)
    assert drafter._lookup(7, seen[:2], k) == _scan_lookup(seen[:2], k)  # a fresh index
