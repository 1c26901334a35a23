"""One request field read from an OpenAI body and checked: pure functions of the body.

Each raises ApiError (a 400 naming the field, the value echoed short) on a bad
value; sim.serve.api puts them together into a Generation.
"""

from __future__ import annotations

import math
from typing import Any

from sim.serve.body import ApiError, echo, utf8
from sim.text.base import Tokenizer

INT64_MAX = 2**63 - 1


def read_number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not low <= value <= high:
        raise ApiError(400, f"{name}: must be a number in [{low}, {high}], got {echo(value)}",
                       param=name)
    return float(value)


def read_integer(body: dict[str, Any], name: str, low: int, high: int = INT64_MAX) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(400, f"{name}: must be an integer in [{low}, {high}], got {echo(value)}",
                       param=name)
    return value


def chat_prompt(messages: object) -> str:
    """The prompt text of a chat: each message as `role: content` on its own line, then the
    assistant's turn. A plain template (no model's own), so token counts are the text's."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages: must be a non-empty list of {role, content}",
                       param="messages")
    lines = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}]: must be an object with a string role",
                           param="messages")
        content = m.get("content", "")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(t for p in content if isinstance(p, dict)
                              and isinstance(t := p.get("text", ""), str))
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content: must be text", param="messages")
        utf8(content, "messages")
        lines.append(f"{m['role']}: {content}")
    return "\n".join(lines) + "\nassistant:"


def read_prompt_ids(body: dict[str, Any], tokenizer: Tokenizer) -> tuple[int, ...]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tuple(tokenizer.encode(utf8(prompt, "prompt")))
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = next((t for t in prompt if not 0 <= t < tokenizer.vocab_size), None)
        if bad is not None:
            raise ApiError(400, f"prompt: token id {echo(bad)} is outside the vocabulary "
                                f"[0, {tokenizer.vocab_size})", param="prompt")
        return tuple(prompt)
    raise ApiError(400, "prompt: must be a string or a list of token ids (one prompt per "
                        "request)", param="prompt")


def read_stops(body: dict[str, Any], tokenizer: Tokenizer
               ) -> tuple[tuple[str, ...], tuple[int, ...]]:
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not all(isinstance(s, str) for s in stop) or len(stop) > 16:
        raise ApiError(400, f"stop: must be a string or a list of up to 16 strings, got "
                            f"{echo(stop)}", param="stop")
    ids = body.get("stop_token_ids") or ()
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < tokenizer.vocab_size
               for t in ids):
        raise ApiError(400, f"stop_token_ids: must be token ids in [0, "
                            f"{tokenizer.vocab_size}), got {echo(ids)}", param="stop_token_ids")
    return tuple(utf8(s, "stop") for s in stop if s), tuple(ids)


def read_logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """How many top log-probabilities each token carries (None: none asked): completions'
    `logprobs: k`, or chat's `logprobs: true` with `top_logprobs: k`, k in [0, 20]."""
    if chat:
        top = read_integer(body, "top_logprobs", 0, 20)
        if not body.get("logprobs"):
            if top:
                raise ApiError(400, "top_logprobs: needs logprobs: true", param="top_logprobs")
            return None
        if not isinstance(body["logprobs"], bool):
            raise ApiError(400, f"logprobs: must be true or false on chat, got "
                                f"{echo(body['logprobs'])}", param="logprobs")
        k = top or 0
    else:
        if isinstance(body.get("logprobs"), bool):
            raise ApiError(400, "logprobs: must be an integer in [0, 20] on completions",
                           param="logprobs")
        k = read_integer(body, "logprobs", 0, 20)
        if k is None:
            return None
    if body.get("echo") is True:
        raise ApiError(400, "logprobs: with echo, the prompt's log-probabilities would be "
                            "needed, and they are not served", param="logprobs")
    return k


def read_logit_bias(body: dict[str, Any], tokenizer: Tokenizer) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias: token ids (as strings, or ints) to a bias in [-100, 100]."""
    out = []
    for key, bias in (body.get("logit_bias") or {}).items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            token = -1
        if not 0 <= token < tokenizer.vocab_size:
            raise ApiError(400, f"logit_bias: {echo(key)} is not a token id in [0, "
                                f"{tokenizer.vocab_size})", param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or \
                not -100 <= bias <= 100:
            raise ApiError(400, f"logit_bias: the bias of {echo(key)} must be a number in "
                                f"[-100, 100], got {echo(bias)}", param="logit_bias")
        out.append((token, float(bias)))
    return tuple(out)


def read_echo_text(body: dict[str, Any], chat: bool, ids: tuple[int, ...],
               tokenizer: Tokenizer) -> str:
    """What `echo` puts first: the prompt (completions), or the last message's content when
    it is the assistant's own (chat, as vLLM does)."""
    if body.get("echo") is not True:
        return ""
    if not chat:
        prompt = body.get("prompt")
        prompt = prompt[0] if isinstance(prompt, list) and len(prompt) == 1 and \
            isinstance(prompt[0], str) else prompt
        return prompt if isinstance(prompt, str) else tokenizer.decode(list(ids))
    last = body["messages"][-1]
    content = last.get("content", "")
    if last.get("role") != "assistant":
        return ""
    if isinstance(content, list):
        content = "".join(t for p in content if isinstance(p, dict)
                          and isinstance(t := p.get("text", ""), str))
    return content if isinstance(content, str) else ""
