"""OpenAI's response bodies for one request's n choices: server-sent events as tokens come,
or one JSON body at the end (vLLM's shapes: usage, choices, logprobs, continuous usage)."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from aiohttp import web

from sim.serve.api import Generation
from sim.serve.body import ApiError
from sim.serve.streams import Chunk, Ended, Group
from sim.text.base import Tokenizer


def _usage(group: Group, emitted: int) -> dict[str, int]:
    """vLLM's usage: the prompt once, every choice's tokens."""
    prompt = group.streams[0].request.prompt_tokens
    return {"prompt_tokens": prompt, "completion_tokens": emitted,
            "total_tokens": prompt + emitted}


def _choice(chat: bool, index: int, text: str, finish: str | None, first: bool,
            logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    if not chat:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
    delta: dict[str, Any] = {"content": text}
    if first:
        delta["role"] = "assistant"
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def logprobs_json(chat: bool, chunks: list[Chunk], tokenizer: Tokenizer, offset: int
                  ) -> dict[str, Any] | None:
    """OpenAI's logprobs object for these tokens: completions' parallel lists (tokens,
    token_logprobs, top_logprobs, text_offset from `offset`), or chat's `content` list."""
    if not chunks or chunks[0].logprobs is None:
        return None

    def token(token_id: int) -> str:
        return tokenizer.decode([token_id])

    if chat:
        return {"content": [{
            "token": token(c.token_id), "logprob": c.logprobs[0],
            "bytes": list(token(c.token_id).encode("utf-8", "replace")),
            "top_logprobs": [{"token": token(t), "logprob": lp,
                              "bytes": list(token(t).encode("utf-8", "replace"))}
                             for t, lp in c.logprobs[1]]} for c in chunks if c.logprobs]}
    offsets = []
    for c in chunks:
        offsets.append(offset)
        offset += len(c.text)
    return {"tokens": [token(c.token_id) for c in chunks],
            "token_logprobs": [c.logprobs[0] if c.logprobs else None for c in chunks],
            "top_logprobs": [{token(t): lp for t, lp in c.logprobs[1]} if c.logprobs else None
                             for c in chunks],
            "text_offset": offsets}


def _head(group: Group, generation: Generation, model: str, chunk: bool) -> dict[str, Any]:
    chat = generation.chat
    rid = f"{'chatcmpl' if chat else 'cmpl'}-" \
        f"{generation.request_id or group.streams[0].request.request_id}"
    kind = ("chat.completion" if chat else "text_completion") + (".chunk" if chunk and chat
                                                                 else "")
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model}


async def stream_response(request: web.Request, group: Group, first: Chunk | Ended,
               generation: Generation, model: str, headers: dict[str, str],
               tokenizer: Tokenizer) -> web.StreamResponse:
    """Server-sent events, one per token of each choice, OpenAI's chunk format, then
    `data: [DONE]`."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache", **headers})
    await response.prepare(request)
    chat = generation.chat
    head = _head(group, generation, model, chunk=True)

    async def send(payload: dict[str, Any]) -> None:
        await response.write(b"data: " + json.dumps({**head, **payload}).encode() + b"\n\n")

    emitted, open_choices, item = [0] * generation.n, generation.n, first
    offsets = [0] * generation.n
    while True:
        if isinstance(item, Ended):
            open_choices -= 1
            if item.error is not None:  # shut down or aborted mid-stream
                await send({"choices": [_choice(chat, item.index, "", "abort",
                                                emitted[item.index] == 0)]})
        else:
            i = item.index
            text = (generation.echo_text + item.text) if emitted[i] == 0 else item.text
            emitted[i] += 1
            logprobs = logprobs_json(chat, [item], tokenizer, offsets[i])
            offsets[i] += len(text)
            payload: dict[str, Any] = {
                "choices": [_choice(chat, i, text, item.finish, emitted[i] == 1, logprobs)]}
            if generation.continuous_usage:  # vLLM: this choice's tokens so far
                payload["usage"] = _usage(group, emitted[i])
            await send(payload)
        if open_choices == 0:
            break
        item = await group.queue.get()
    if generation.include_usage:
        await send({"choices": [], "usage": _usage(group, sum(emitted))})
    await response.write(b"data: [DONE]\n\n")
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof()
    return response


async def whole_response(group: Group, first: Chunk | Ended, generation: Generation, model: str,
                 headers: dict[str, str], tokenizer: Tokenizer) -> web.Response:
    """The whole completion in one JSON body, when the client did not ask for a stream."""
    n = generation.n
    pieces: list[list[str]] = [[generation.echo_text] for _ in range(n)]
    tokens: list[list[Chunk]] = [[] for _ in range(n)]
    counts, finishes = [0] * n, ["length"] * n
    item, open_choices = first, n
    while True:
        if isinstance(item, Ended):
            if item.error is not None:
                raise ApiError(503, f"request ended early: {item.error}",
                               type="ServiceUnavailable")
            open_choices -= 1
        else:
            pieces[item.index].append(item.text)
            tokens[item.index].append(item)
            counts[item.index] += 1
            finishes[item.index] = item.finish or finishes[item.index]
        if open_choices == 0:
            break
        item = await group.queue.get()
    chat = generation.chat
    choices = []
    for i in range(n):
        text = "".join(pieces[i])
        logprobs = logprobs_json(chat, tokens[i], tokenizer, 0)
        choices.append({"index": i, "message": {"role": "assistant", "content": text},
                        "logprobs": logprobs, "finish_reason": finishes[i]} if chat else
                       {"index": i, "text": text, "logprobs": logprobs,
                        "finish_reason": finishes[i]})
    return web.json_response({**_head(group, generation, model, chunk=False),
                              "choices": choices, "usage": _usage(group, sum(counts))},
                             headers=headers)
