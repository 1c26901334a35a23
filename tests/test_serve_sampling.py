"""The engine's logit adjustments for `servesim serve --engine`: logit_bias and vLLM's
presence, frequency and repetition penalties (gpu_engine.sampling.adjust_logits)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpu_engine.sampling import SamplingParams, adjust_logits, sample  # noqa: E402


def test_defaults_leave_the_logits_alone() -> None:
    logits = torch.randn(3, 11)
    assert adjust_logits(logits, [SamplingParams()] * 3, [[1, 2]] * 3, [1] * 3) is logits


def test_bias_then_penalties_as_vllm_orders_them() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 0.0]])
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25,
                            repetition_penalty=2.0, logit_bias=((4, 1.0), (2, -1.0)))
    # prompt [0, 1], output [3, 3, 2]
    out = adjust_logits(logits, [params], [[0, 1, 3, 3, 2]], [2])[0].tolist()
    want = [2.0 / 2,            # in the prompt: positive, divided
            -1.0 * 2,           # in the prompt: negative, multiplied
            (0.5 - 1.0) * 2 - 0.25 - 0.5,  # biased to -0.5, seen once in the output
            3.0 / 2 - 0.5 - 0.5,           # seen twice in the output
            1.0]                # biased, never seen
    assert out == pytest.approx(want)


def test_rows_are_independent_and_greedy_follows_the_bias() -> None:
    logits = torch.zeros(2, 6)
    params = [SamplingParams(logit_bias=((5, 10.0),)), SamplingParams()]
    out = adjust_logits(logits, params, [[1], [1]], [1, 1])
    assert out[1].tolist() == [0.0] * 6
    assert sample(out, params, [None, None], [1, 1]).tolist()[0] == 5


def test_bad_penalties_are_refused() -> None:
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=0.0)
    with pytest.raises(ValueError, match="presence_penalty"):
        SamplingParams(presence_penalty=float("nan"))


def test_token_logprobs_are_the_raw_distributions() -> None:
    from gpu_engine.sampling import token_logprobs

    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    tokens = torch.tensor([1, 0, 2])
    chosen, ids, values = token_logprobs(logits, tokens, [0, 2], 2)
    logp = torch.log_softmax(logits, dim=-1)
    assert chosen.tolist() == pytest.approx([logp[0, 1].item(), logp[2, 2].item()])
    assert ids[0].tolist() == [2, 1]
    assert values[0].tolist() == pytest.approx([logp[0, 2].item(), logp[0, 1].item()])
    none = token_logprobs(logits, tokens, [1], 0)
    assert none[1].shape == (1, 0) and none[0].tolist() == pytest.approx([logp[1, 0].item()])


def test_logit_bias_round_trips_through_json() -> None:
    """A replay plan stores its SamplingParams as JSON, where the pairs come back as
    lists; the value must equal (and hash as) the original."""
    import json
    from dataclasses import asdict

    params = SamplingParams(logit_bias=((4, 1.5), (7, -2)))
    back = SamplingParams(**json.loads(json.dumps(asdict(params))))
    assert back == params and hash(back) == hash(params)
    assert back.logit_bias == ((4, 1.5), (7, -2.0))
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=((1.5, 1.0),))
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=(3,))
