"""The serving frontend's per-token costs, measured on this CPU with servesim's shipped tokenizers.

    python -m calibrate.frontend_costs [--tokenizer mistral-v1] [--repeats 50]

A vLLM server's frontend tokenizes each prompt, detokenizes each output token
incrementally, and writes each token to the client's stream as a server-sent
event of an OpenAI completion chunk. This measures those three per token on
this machine: `tokenize_us_per_token` (encoding a ~575-token prompt, per
token), `detokenize_us_per_token` (feeding one id to an incremental decoder)
and `stream_us_per_token` (one chunk's JSON and SSE framing). Each figure is the
median over `--repeats` passes. The default tokenizer is mistral-v1, the
32,000-id SentencePiece vocabulary of the Llama-2 family.

These are measured, never fitted: the real runs cannot tell a per-token cost
from a constant (every prompt there is about 575 tokens). sim.config.frontend
holds the figures this printed, with the machine and date.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

SAMPLE = Path(__file__).resolve().parent.parent / "docs" / "tokens_sample.txt"
PROMPT_TOKENS = 575  # the real runs' measured prompt length


@dataclass(frozen=True, slots=True)
class FrontendCosts:
    """Microseconds per token, medians over passes."""

    tokenizer: str
    tokenize_us_per_token: float
    detokenize_us_per_token: float
    stream_us_per_token: float
    machine: str


def _prompt(tokenizer: object, tokens: int) -> tuple[str, list[int]]:
    """A text of about `tokens` tokens (the sample repeated), and its ids."""
    text = SAMPLE.read_text()
    ids = tokenizer.encode(text)  # type: ignore[attr-defined]
    while len(ids) < tokens:
        text += "\n" + SAMPLE.read_text()
        ids = tokenizer.encode(text)  # type: ignore[attr-defined]
    cut = tokenizer.decode(ids[:tokens])  # type: ignore[attr-defined]
    return cut, tokenizer.encode(cut)  # type: ignore[attr-defined]


def _chunk(piece: str, index: int) -> bytes:
    """One streamed completion chunk as a server writes it (SSE framing included)."""
    body = {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "text": piece, "logprobs": None,
                         "finish_reason": None}], "usage": None, "n": index}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def measure(tokenizer_name: str = "mistral-v1", repeats: int = 50) -> FrontendCosts:
    """Median per-token costs of tokenize, detokenize and stream over `repeats` passes."""
    from sim.text.catalogue import load_tokenizer

    tok = load_tokenizer(tokenizer_name)
    text, ids = _prompt(tok, PROMPT_TOKENS)
    enc, dec, out = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        tok.encode(text)
        enc.append((time.perf_counter() - t0) / len(ids))
        stream = tok.decoder_stream()
        pieces = []
        t0 = time.perf_counter()
        for token_id in ids:
            pieces.append(stream.feed(token_id))
        stream.flush()
        dec.append((time.perf_counter() - t0) / len(ids))
        t0 = time.perf_counter()
        for i, piece in enumerate(pieces):
            _chunk(piece, i)
        out.append((time.perf_counter() - t0) / len(ids))
    return FrontendCosts(tokenizer_name, statistics.median(enc) * 1e6,
                         statistics.median(dec) * 1e6, statistics.median(out) * 1e6,
                         f"{platform.processor() or platform.machine()}, "
                         f"Python {platform.python_version()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default="mistral-v1", help="a shipped tokenizer's name")
    parser.add_argument("--repeats", type=int, default=50, help="passes; the median is kept")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    costs = measure(args.tokenizer, args.repeats)
    print(f"tokenizer {costs.tokenizer} on {costs.machine} (medians of {args.repeats}):")
    print(f"  tokenize_us_per_token   = {costs.tokenize_us_per_token:.3f}")
    print(f"  detokenize_us_per_token = {costs.detokenize_us_per_token:.3f}")
    print(f"  stream_us_per_token     = {costs.stream_us_per_token:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
