"""OpenAI request bodies checked and turned into one value; OpenAI's error JSON.

Why its own module: every check a bad request can fail lives here, as a pure
function of the body, so the server answers each with a 400 (or 404) naming
the field, and never dies of a request. The body forms are OpenAI's
(`/v1/completions`: `prompt` as text or token ids; `/v1/chat/completions`:
`messages`) with vLLM's extra fields; what each field gets on each backend is
sim.serve.fields' table, and a hostile body never gets this far
(sim.serve.body). Each field's own reading is sim.serve.request_fields'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.serve.body import ApiError, echo, utf8
from sim.serve.fields import BY_NAME, UNKNOWN, Answer, FieldRule, is_neutral, kind_ok
from sim.serve.request_fields import (
    INT64_MAX,
    chat_prompt,
    read_echo_text,
    read_integer,
    read_logit_bias,
    read_logprobs,
    read_number,
    read_prompt_ids,
    read_stops,
)
from sim.text.base import Tokenizer

MAX_N = 128  # choices per request


@dataclass(frozen=True, slots=True)
class Generation:
    """One checked request: token ids in, how many tokens out, how to sample them."""

    chat: bool
    prompt_ids: tuple[int, ...]
    max_tokens: int | None  # None: not given (the backend picks, see SimulatedStepper)
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # usage on every chunk (vLLM: needs include_usage too)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off (vLLM's -1 is read as off too)
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    n: int = 1
    child_index: int = 0  # which of the n choices (its seed is seed + index, as vLLM's)
    echo_text: str = ""  # put before the output (`echo`)
    stop: tuple[str, ...] = ()  # only where the backend honours them
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str: bool = False
    request_id: str | None = None
    presence_penalty: float = 0.0  # honoured by the engine backend (scripted when simulated)
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None  # the k most likely tokens' log-probabilities with each token
    ignored: tuple[str, ...] = ()  # no-op and scripted fields set: the servesim-ignored header


def check_fields(body: dict[str, Any], backend: str) -> tuple[str, ...]:
    """Every field against the table: a wrong JSON type or a refused value is a 400 naming
    it; returns the no-op and scripted fields set to something (the ignored header)."""
    ignored = []
    for name, value in body.items():
        rule: FieldRule = BY_NAME.get(name, UNKNOWN)
        if rule is UNKNOWN:
            ignored.append(utf8(name, "(a field name)"))
            continue
        if not kind_ok(rule, value):
            raise ApiError(400, f"{name}: must be of type {rule.kind}, got {echo(value)}",
                           param=name)
        if is_neutral(rule, value):
            continue
        answer = rule.answer(backend)
        if answer is Answer.REJECTED:
            raise ApiError(400, f"{name}: {rule.refusal(backend)} (the {backend} backend; got "
                                f"{echo(value)})", param=name)
        if answer in (Answer.NO_OP, Answer.SCRIPTED):
            ignored.append(name)
    return tuple(ignored)


def parse_generation(body: object, chat: bool, tokenizer: Tokenizer, model: str,
                     max_model_len: int, backend: str = "simulated") -> Generation:
    """Check `body` against the API, the field table and the server's limits; raises
    ApiError on any fault."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    ignored = check_fields(body, backend)
    name = body.get("model")
    if name is not None and name != model:
        raise ApiError(404, f"model: {echo(name)} does not exist; this server serves {model!r}",
                       type="NotFoundError", param="model")
    if chat:
        text = chat_prompt(body.get("messages"))
        ids = tuple(tokenizer.encode(text))
    else:
        ids = read_prompt_ids(body, tokenizer)
    if not ids:
        raise ApiError(400, "prompt: is empty (at least one token is needed)", param="prompt")
    if len(ids) >= max_model_len:
        raise ApiError(400, f"prompt: {len(ids)} tokens; this model's context is "
                            f"{max_model_len} tokens, which leaves no room to generate",
                       param="prompt")
    max_tokens = read_integer(body, "max_completion_tokens" if chat and "max_completion_tokens"
                          in body else "max_tokens", 1)
    if max_tokens is not None and len(ids) + max_tokens > max_model_len:
        raise ApiError(400, f"max_tokens: {max_tokens} + the prompt's {len(ids)} tokens exceeds "
                            f"this model's context of {max_model_len} tokens",
                       param="max_tokens")
    n = read_integer(body, "n", 1, MAX_N) or 1
    stream = body.get("stream") or False
    options = body.get("stream_options") or {}
    if options and not stream:
        raise ApiError(400, "stream_options: can only be given with stream: true (as vLLM "
                            "answers)", param="stream_options")
    for key in ("include_usage", "continuous_usage_stats"):
        if not isinstance(options.get(key, False), bool | None):
            raise ApiError(400, f"stream_options.{key}: must be true or false, got "
                                f"{echo(options[key])}", param="stream_options")
    ignored += tuple(f"stream_options.{k}" for k in options
                     if k not in ("include_usage", "continuous_usage_stats"))
    include_usage = bool(options.get("include_usage"))
    top_k = body.get("top_k")
    top_k = 0 if top_k is None or top_k == -1 else top_k
    if top_k < 0:
        raise ApiError(400, f"top_k: must be an integer >= 0 (or -1 for off), got {top_k!r}",
                       param="top_k")
    min_tokens = read_integer(body, "min_tokens", 0) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise ApiError(400, f"min_tokens: {min_tokens} is more than max_tokens {max_tokens}",
                       param="min_tokens")
    stop, stop_ids = read_stops(body, tokenizer)
    honours_stop = BY_NAME["stop"].answer(backend) is Answer.HONOURED
    request_id = body.get("request_id")
    return Generation(
        chat=chat, prompt_ids=ids, max_tokens=max_tokens, stream=stream,
        include_usage=include_usage,
        continuous_usage=include_usage and bool(options.get("continuous_usage_stats")),
        temperature=read_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=read_number(body, "top_p", 1.0, 1e-9, 1.0), top_k=top_k,
        seed=read_integer(body, "seed", -INT64_MAX - 1), ignore_eos=body.get("ignore_eos") or False,
        min_tokens=min_tokens, n=n, echo_text=read_echo_text(body, chat, ids, tokenizer),
        stop=stop if honours_stop else (), stop_token_ids=stop_ids if honours_stop else (),
        include_stop_str=bool(body.get("include_stop_str_in_output")),
        request_id=utf8(request_id, "request_id") if request_id else None,
        presence_penalty=read_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=read_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=read_number(body, "repetition_penalty", 1.0, 1e-6, 1e6),
        logit_bias=read_logit_bias(body, tokenizer), logprobs=read_logprobs(body, chat),
        ignored=ignored)
