"""The byte tokenizer: token id = one UTF-8 byte, so it needs no vocabulary file at all.

It is the fallback everywhere (the tiny engine spec has exactly 256 ids) and
the worst case for cost: one token per byte, where a BPE spends about four.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.text.base import ByteStream, DecoderStream

_NUM_BYTES = 256


@dataclass(frozen=True, slots=True)
class ByteTokenizer:
    """UTF-8 bytes as ids 0-255; no special tokens, so no EOS."""

    name: str = field(default="byte", init=False)
    vocab_size: int = field(default=_NUM_BYTES, init=False)
    eos_id: int | None = field(default=None, init=False)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < _NUM_BYTES:
            raise ValueError(f"byte tokenizer: token id {token_id} is outside 0-255")
        return bytes((token_id,))

    def decode(self, ids: Sequence[int]) -> str:
        """Invalid UTF-8 (a model may emit any byte) becomes U+FFFD, never an exception."""
        bad = [i for i in ids if not 0 <= i < _NUM_BYTES]
        if bad:
            raise ValueError(f"byte tokenizer: token id {bad[0]} is outside 0-255")
        return bytes(ids).decode("utf-8", errors="replace")

    def decoder_stream(self) -> DecoderStream:
        return ByteStream(self.token_bytes)
