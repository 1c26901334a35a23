"""One HTTP request's choices as the loop hands them out: pieces, ends, and stop strings.

Why its own module: what a choice's text is (decoded tokens, held back while it
may begin a stop string, cut where a stop string or stop token appears) is a
pure function of the tokens and the request's parameters, apart from the
scheduling loop (sim.serve.loop) that feeds it. Stop strings are found where
vLLM finds them, in the frontend, once a choice has `min_tokens` tokens.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from sim.core.request import Request
from sim.serve.api import Generation
from sim.text.base import DecoderStream


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of one choice: text (may be empty while a character is incomplete, or held
    back while it may begin a stop string); `finish` is set on the choice's last piece."""

    text: str
    token_id: int
    index: int  # the choice (0..n-1)
    position: int  # the token's place in its choice
    time_s: float
    finish: str | None = None  # "length" or "stop"
    logprobs: tuple | None = None  # (log-probability, ((id, log-probability), ...)) if asked


@dataclass(frozen=True, slots=True)
class Ended:
    """The end of one choice: its request, and why it ended early (None: it finished)."""

    request: Request
    error: str | None = None
    index: int = 0


@dataclass(slots=True, eq=False)
class Stream:
    """One choice: its request, its text so far, where its stop strings are searched."""

    request: Request
    decoder: DecoderStream
    queue: asyncio.Queue  # shared by the choices of one HTTP request
    index: int = 0
    generation: Generation | None = None
    emitted: int = 0
    text: str = ""
    sent: int = 0  # characters of text handed out
    stopped: bool = False  # a stop string or token ended it: later tokens are dropped
    output_ids: list[int] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class Group:
    """One HTTP request: its n choices (vLLM's ParentRequest: n child requests that the
    scheduler sees as n independent requests) and the queue their pieces arrive on."""

    streams: list[Stream]
    queue: asyncio.Queue
    open: int = 0  # choices not yet ended
    max_generated: int = 0

    @property
    def request_ids(self) -> list[int]:
        return [s.request.request_id for s in self.streams]


def _stop_cut(stream: Stream, generation: Generation) -> int | None:
    """Where the text ends when a stop string has appeared in it (None: no stop yet)."""
    best = None
    for stop in generation.stop:
        at = stream.text.find(stop, max(0, stream.sent - len(stop) + 1))
        if at >= 0:
            cut = at + len(stop) if generation.include_stop_str else at
            best = cut if best is None else min(best, cut)
    return best


def holdback(stream: Stream) -> int:
    """Characters kept back while they may be the start of a stop string."""
    stops = stream.generation.stop if stream.generation else ()
    return max((len(s) for s in stops), default=1) - 1

def advance_text(stream: Stream, token_id: int) -> str | None:
    """Add one token to a choice's text; returns its finish reason if it is the last."""
    generation = stream.generation
    checks = generation is not None and stream.emitted > generation.min_tokens - 1 and (
        generation.stop or generation.stop_token_ids)
    if checks and token_id in generation.stop_token_ids:  # type: ignore[union-attr]
        if generation.include_stop_str:  # type: ignore[union-attr]
            stream.text += stream.decoder.feed(token_id)
        stream.text += stream.decoder.flush()
        return "stop"
    stream.text += stream.decoder.feed(token_id)
    if checks and generation.stop:  # type: ignore[union-attr]
        cut = _stop_cut(stream, generation)  # type: ignore[arg-type]
        if cut is not None:
            stream.text = stream.text[:cut]
            return "stop"
    if stream.emitted >= stream.request.output_tokens:
        stream.text += stream.decoder.flush()
        return "length"
    return None
