"""Interactive generation: one prompt through the engine, streamed as text.

The same engine, scheduler and block manager as a replay, on a pool just big
enough for the one request; text comes out as the tokenizer can decode it
(a byte-level token may end in the middle of a UTF-8 character). Without
`--weights` the weights are random, so the "text" is arbitrary bytes: the
caller is told so (`weights_notice`), and every piece is passed through
`printable` so control characters cannot drive the terminal.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from gpu_engine.sampling import SamplingParams
from gpu_engine.setup import build_engine
from sim.config.catalogue import get_model
from sim.config.scenario import Scenario
from sim.core.request import Request
from sim.text import load_tokenizer


class GenerateError(ValueError):
    """A user error in a generate request."""


def printable(text: str) -> str:
    """`text` with every non-printable character but newline and tab written as an escape
    (`\\x1b`, `\\x0c`): random weights emit control bytes a terminal would act on."""
    return "".join(ch if ch.isprintable() or ch in "\n\t"
                   else ch.encode("unicode_escape").decode("ascii") for ch in text)


def weights_notice(model: str, weights: str | None) -> str | None:
    """The line to show before the text when the weights are random, else None."""
    if weights is not None:
        return None
    return (f"note: {model} has random weights (no --weights given), so the output is noise; "
            "non-printable characters are shown escaped")


def _tokenizer_name(tokenizer: str | None, weights: str | None) -> str:
    if tokenizer is not None:
        return tokenizer
    if weights is not None and (Path(weights) / "tokenizer.json").is_file():
        return str(Path(weights) / "tokenizer.json")
    return "byte"


def generate_text(prompt: str, max_tokens: int, model: str = "tiny", weights: str | None = None,
                  tokenizer: str | None = None, temperature: float = 0.0, top_k: int = 0,
                  top_p: float = 1.0, seed: int = 0, device: str = "auto",
                  stop_at_eos: bool = False, block_size: int = 16) -> Iterator[str]:
    """Yield decoded text pieces as the engine emits tokens, made `printable`."""
    tok = load_tokenizer(_tokenizer_name(tokenizer, weights))
    ids = tok.encode(prompt)
    if not ids:
        raise GenerateError("--prompt: the prompt encodes to no tokens; give some text")
    if weights is not None:
        from gpu_engine.weights import spec_from_hf_config

        spec = spec_from_hf_config(Path(weights) / "config.json")
        model_field: str | dict = {f: getattr(spec, f) for f in spec.__slots__}
        model_field["rope_scaling"] = None if spec.rope_scaling is None else {
            f: getattr(spec.rope_scaling, f) for f in spec.rope_scaling.__slots__}
    else:
        spec = get_model(model)
        model_field = model
    if tok.vocab_size > spec.vocab_size:
        raise GenerateError(f"--tokenizer: {tok.name} has {tok.vocab_size} token ids but "
                            f"{spec.name} has a vocabulary of {spec.vocab_size}; use a tokenizer "
                            "that fits the model (byte fits any model with >= 256 ids)")
    total = len(ids) + max_tokens
    if total > spec.max_context_tokens:
        raise GenerateError(f"prompt ({len(ids)} tokens) + --max-tokens ({max_tokens}) exceed "
                            f"{spec.name}'s context of {spec.max_context_tokens} tokens")
    num_blocks = -(-total // block_size) + 2  # + the null block + one spare
    scenario = Scenario.model_validate({
        "name": "generate", "seed": seed, "model": model_field,
        "kv": {"block_size": block_size, "num_blocks": num_blocks},
        "scheduler": {"max_num_seqs": 1, "max_num_batched_tokens": max(total, 256),
                      "max_model_len": spec.max_context_tokens},
        "engine": {"device": device, "weights": weights, "cuda_graphs": False,
                   "warmup": False},
    })
    engine = build_engine(scenario).engine
    engine.eos_id = tok.eos_id
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                              stop_at_eos=stop_at_eos)
    request = Request(0, 0.0, len(ids), max_tokens, prompt_token_ids=tuple(ids))
    if not engine.add_request(request, sampling):
        raise GenerateError(f"the request was rejected: {request.rejection_reason}")
    decoder = tok.decoder_stream()
    for event in engine.stream():
        if stop_at_eos and event.token_id == tok.eos_id:
            break
        piece = decoder.feed(event.token_id)
        if piece:
            yield printable(piece)
        if event.finished:
            break
    rest = decoder.flush()
    if rest:
        yield printable(rest)
