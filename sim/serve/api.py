"""OpenAI request bodies checked and turned into one value; OpenAI's error JSON.

Why its own module: every check a bad request can fail lives here, as a pure
function of the body, so the server answers each with a 400 (or 404) naming
the field, and never dies of a request. The body forms are OpenAI's
(`/v1/completions`: `prompt` as text or token ids; `/v1/chat/completions`:
`messages`), with vLLM's extra sampling fields `top_k`, `ignore_eos` and
`min_tokens`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sim.text.base import Tokenizer


@dataclass(frozen=True, slots=True)
class ApiError(Exception):
    """An OpenAI-style error: `status` (HTTP), a message, its type and the field at fault."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.status}}


@dataclass(frozen=True, slots=True)
class Generation:
    """One checked request: token ids in, how many tokens out, how to sample them."""

    chat: bool
    prompt_ids: tuple[int, ...]
    max_tokens: int | None  # None: not given (the backend picks, see SimulatedStepper)
    stream: bool = False
    include_usage: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off (vLLM's -1 is read as off too)
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not low <= value <= high:
        raise ApiError(400, f"{name}: must be a number in [{low}, {high}], got {value!r}",
                       param=name)
    return float(value)


def _integer(body: dict[str, Any], name: str, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ApiError(400, f"{name}: must be an integer >= {low}, got {value!r}", param=name)
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
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content: must be text", param="messages")
        lines.append(f"{m['role']}: {content}")
    return "\n".join(lines) + "\nassistant:"


def _prompt_ids(body: dict[str, Any], tokenizer: Tokenizer) -> tuple[int, ...]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tuple(tokenizer.encode(prompt))
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = next((t for t in prompt if not 0 <= t < tokenizer.vocab_size), None)
        if bad is not None:
            raise ApiError(400, f"prompt: token id {bad} is outside the vocabulary "
                                f"[0, {tokenizer.vocab_size})", param="prompt")
        return tuple(prompt)
    raise ApiError(400, "prompt: must be a string or a list of token ids (one prompt per "
                        "request)", param="prompt")


def parse_generation(body: object, chat: bool, tokenizer: Tokenizer, model: str,
                     max_model_len: int) -> Generation:
    """Check `body` against the API and the server's limits; raises ApiError on any fault."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    name = body.get("model")
    if name is not None and name != model:
        raise ApiError(404, f"model: {name!r} does not exist; this server serves {model!r}",
                       type="NotFoundError", param="model")
    if chat:
        text = chat_prompt(body.get("messages"))
        ids = tuple(tokenizer.encode(text))
    else:
        ids = _prompt_ids(body, tokenizer)
    if not ids:
        raise ApiError(400, "prompt: is empty (at least one token is needed)", param="prompt")
    if len(ids) >= max_model_len:
        raise ApiError(400, f"prompt: {len(ids)} tokens; this model's context is "
                            f"{max_model_len} tokens, which leaves no room to generate",
                       param="prompt")
    max_tokens = _integer(body, "max_completion_tokens" if chat and "max_completion_tokens"
                          in body else "max_tokens", 1)
    if max_tokens is not None and len(ids) + max_tokens > max_model_len:
        raise ApiError(400, f"max_tokens: {max_tokens} + the prompt's {len(ids)} tokens exceeds "
                            f"this model's context of {max_model_len} tokens",
                       param="max_tokens")
    n = _integer(body, "n", 1)
    if n not in (None, 1):
        raise ApiError(400, f"n: only 1 completion per request is served, got {n}", param="n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, f"stream: must be true or false, got {stream!r}", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options: must be an object", param="stream_options")
    top_k = body.get("top_k", 0)
    if top_k == -1 or top_k is None:
        top_k = 0
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ApiError(400, f"top_k: must be an integer >= 0 (or -1 for off), got {top_k!r}",
                       param="top_k")
    min_tokens = _integer(body, "min_tokens", 0) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise ApiError(400, f"min_tokens: {min_tokens} is more than max_tokens {max_tokens}",
                       param="min_tokens")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise ApiError(400, f"ignore_eos: must be true or false, got {ignore_eos!r}",
                       param="ignore_eos")
    return Generation(
        chat=chat, prompt_ids=ids, max_tokens=max_tokens, stream=stream,
        include_usage=bool(options.get("include_usage", False)),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 1e-9, 1.0), top_k=top_k,
        seed=_integer(body, "seed", 0), ignore_eos=ignore_eos, min_tokens=min_tokens)
