"""The sampler: greedy, temperature, top-k, top-p, per-request seeds, and its distribution."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

torch = pytest.importorskip("torch")

from gpu_engine.sampling import (  # noqa: E402
    ACCEPT,
    SAMPLE,
    SamplingParams,
    probabilities,
    sample,
    uniforms,
)

CPU = torch.device("cpu")


def _logits(rows: int, vocab: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=generator) * scale


def _draws(logits_row: torch.Tensor, params: SamplingParams, n: int, seed: int) -> np.ndarray:
    """n tokens from one row: one request's draws at n successive positions."""
    batch = logits_row.expand(n, -1).contiguous()
    return sample(batch, [params] * n, [seed] * n, list(range(n))).numpy()


def test_temperature_zero_is_argmax_and_needs_no_seed() -> None:
    logits = _logits(6, 50, seed=1)
    greedy, hot = SamplingParams(), SamplingParams(temperature=1.0, seed=3)
    params = [greedy, hot, greedy, hot, greedy, greedy]
    seeds = [None, 3, None, 4, None, None]
    tokens = sample(logits, params, seeds, [7] * 6)
    assert tokens.dtype == torch.int64 and tokens.shape == (6,)
    for i, p in enumerate(params):
        if p.is_greedy:
            assert tokens[i].item() == logits[i].argmax().item()
    # a greedy row's neighbours do not change what a sampled row draws
    alone = sample(logits[1:2], params[1:2], seeds[1:2], [7])
    assert alone.item() == tokens[1].item()


def test_all_greedy_needs_no_seeds() -> None:
    logits = _logits(4, 30, seed=2)
    tokens = sample(logits, [SamplingParams()] * 4, [None] * 4, [0] * 4)
    assert torch.equal(tokens, logits.argmax(dim=-1))


def test_uniforms_are_a_pure_function_of_seed_position_and_purpose() -> None:
    seeds, positions = [0, 1, 2**70 + 3, 5] * 250, list(range(1000))
    a = uniforms(seeds, positions)
    assert np.array_equal(a, uniforms(seeds, positions))  # reproducible
    assert ((a >= 0) & (a < 1)).all()
    assert np.array_equal(uniforms([2**70 + 3], [2]), uniforms([(2**70 + 3) % 2**64], [2]))
    # each stream differs from the others: another purpose, seed or position
    assert not np.array_equal(a, uniforms(seeds, positions, ACCEPT))
    assert uniforms([1], [5])[0] != uniforms([2], [5])[0] != uniforms([2], [6])[0]
    # one request's stream over positions is uniform, and independent of its neighbour's
    stream = uniforms([42] * 20_000, range(20_000), SAMPLE)
    assert stats.kstest(stream, "uniform").pvalue > 1e-3
    other = uniforms([43] * 20_000, range(20_000), SAMPLE)
    assert abs(np.corrcoef(stream, other)[0, 1]) < 0.05


@settings(max_examples=25, deadline=None)
@given(vocab=st.integers(2, 300), k=st.integers(1, 40), temperature=st.floats(0.2, 5.0),
       seed=st.integers(0, 2**32))
def test_top_k_never_samples_outside_the_k_largest(vocab: int, k: int, temperature: float,
                                                   seed: int) -> None:
    row = _logits(1, vocab, seed)[0]
    params = SamplingParams(temperature=temperature, top_k=k)
    tokens = _draws(row, params, n=200, seed=seed + 1)
    allowed = set(row.topk(min(k, vocab)).indices.tolist())
    assert set(tokens.tolist()) <= allowed
    assert (probabilities(row, params) > 0).sum().item() == min(k, vocab)


@settings(max_examples=25, deadline=None)
@given(vocab=st.integers(2, 300), p=st.floats(0.01, 1.0), temperature=st.floats(0.2, 5.0),
       seed=st.integers(0, 2**32))
def test_top_p_keeps_the_smallest_set_with_mass_at_least_p(vocab: int, p: float,
                                                           temperature: float, seed: int) -> None:
    row = _logits(1, vocab, seed)[0].double()
    params = SamplingParams(temperature=temperature, top_p=p)
    kept = probabilities(row.float(), params) > 0
    full = torch.softmax(row / temperature, dim=-1)
    mass = full[kept].sum().item()
    assert kept.sum().item() >= 1
    assert mass >= p - 1e-9
    # minimal: without its least likely member the set falls short of p
    if kept.sum().item() > 1:
        assert mass - full[kept].min().item() < p + 1e-9
    # the kept tokens are the most likely ones
    assert full[kept].min() >= full[~kept].max() if (~kept).any() else True
    tokens = _draws(row.float(), params, n=200, seed=seed + 1)
    assert kept[torch.as_tensor(tokens)].all()


def test_same_seed_same_tokens_different_seeds_differ() -> None:
    logits = _logits(64, 1000, seed=5, scale=0.5)  # flat enough that draws vary
    params = [SamplingParams(temperature=1.0, top_k=500, top_p=0.95)] * 64

    def run(seed: int) -> list[int]:
        return sample(logits, params, [seed] * 64, list(range(64))).tolist()

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_a_rows_tokens_do_not_depend_on_its_batch() -> None:
    """A request's stream is its own: batching it with others changes nothing."""
    logits = _logits(5, 200, seed=9)
    params = [SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(),
              SamplingParams(temperature=1.3, top_k=20), SamplingParams(temperature=0.5),
              SamplingParams(temperature=2.0, top_k=5, top_p=0.5)]
    batched = sample(logits, params, [100 + i for i in range(5)], [9] * 5)
    for i in range(5):
        alone = sample(logits[i:i + 1], params[i:i + 1], [100 + i], [9])
        assert alone.item() == batched[i].item()


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_sampling_matches_softmax_over_t(temperature: float) -> None:
    vocab, n = 8, 20_000
    row = _logits(1, vocab, seed=11, scale=1.5)[0]
    tokens = _draws(row, SamplingParams(temperature=temperature), n, seed=12)
    observed = np.bincount(tokens, minlength=vocab)
    expected = torch.softmax(row.double() / temperature, dim=-1).numpy() * n
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def _reference_top_k_top_p(logits: np.ndarray, t: float, k: int, p: float) -> np.ndarray:
    """A plain numpy statement of the rule: temperature, then top-k, then top-p."""
    order = np.argsort(-logits, kind="stable")
    keep = order[:k]
    z = logits[keep] / t
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    cut = int(np.searchsorted(np.cumsum(probs), p)) + 1  # smallest prefix with mass >= p
    out = np.zeros(logits.size)
    out[keep[:cut]] = probs[:cut] / probs[:cut].sum()
    return out


def test_top_k_and_top_p_sampling_matches_the_filtered_distribution() -> None:
    vocab, n = 12, 20_000
    row = _logits(1, vocab, seed=13, scale=1.0)[0]
    t, k, p = 0.9, 7, 0.8
    expected = _reference_top_k_top_p(row.double().numpy(), t, k, p)
    params = SamplingParams(temperature=t, top_k=k, top_p=p)
    assert np.allclose(probabilities(row, params).double().numpy(), expected, atol=1e-6)
    observed = np.bincount(_draws(row, params, n, seed=14), minlength=vocab)
    support = expected > 0
    assert observed[~support].sum() == 0
    assert stats.chisquare(observed[support], expected[support] * n).pvalue > 1e-3


def test_probabilities_keeps_leading_dimensions_and_greedy_is_one_hot() -> None:
    logits = _logits(6, 40, seed=15).reshape(2, 3, 40)
    probs = probabilities(logits, SamplingParams(temperature=0.7, top_p=0.9))
    assert probs.shape == logits.shape
    assert torch.allclose(probs.sum(-1), torch.ones(2, 3))
    greedy = probabilities(logits, SamplingParams())
    assert torch.equal(greedy.argmax(-1), logits.argmax(-1))
    assert torch.equal(greedy.sum(-1), torch.ones(2, 3))


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", -0.1), ("temperature", float("nan")), ("temperature", float("inf")),
    ("top_k", -1), ("top_k", 2.5), ("top_p", 0.0), ("top_p", 1.5), ("seed", -3),
    ("stop_at_eos", "yes"),
])
def test_bad_params_name_the_field_and_value(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field} .*got {value!r}"):
        SamplingParams(**{field: value})


def test_sample_rejects_a_sampled_row_without_seed_and_bad_shapes() -> None:
    logits = _logits(2, 10, seed=16)
    hot = SamplingParams(temperature=1.0)
    with pytest.raises(ValueError, match="row 1 samples at temperature 1.0"):
        sample(logits, [SamplingParams(), hot], [None, None], [0, 0])
    with pytest.raises(ValueError, match="2 logit rows but 1 params"):
        sample(logits, [hot], [0], [0])
    with pytest.raises(ValueError, match="rows, vocab"):
        sample(logits[0], [hot], [0], [0])
