"""What every tokenizer offers, and the two ways of decoding a token stream incrementally.

A model emits one token id at a time; a user wants text as soon as it is
complete. Byte-level vocabularies (the byte tokenizer, tiktoken BPEs) can end
a token in the middle of a UTF-8 character, so `ByteStream` feeds each token's
bytes through an incremental UTF-8 decoder and holds back a partial
character. Vocabularies whose decode is not a plain concatenation
(SentencePiece drops the leading space of the first piece; tokenizer.json
decoders merge pieces) use `WindowStream`: decode a short window of recent
ids with and without the new one and emit the difference, holding back
while the window ends in a replacement character (an unfinished byte run).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from typing import Protocol

REPLACEMENT = "\ufffd"


class TokenizerError(ValueError):
    """A tokenizer that cannot be had: unknown name, missing file or missing package."""


class DecoderStream(Protocol):
    """Incremental decode: `feed` ids one at a time, `flush` at the end.

    The pieces joined equal `decode` of all the ids fed.
    """

    def feed(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class Tokenizer(Protocol):
    """Text <-> token ids. `encode` adds no BOS/EOS: counts are the text's own."""

    name: str
    vocab_size: int
    eos_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def decoder_stream(self) -> DecoderStream: ...


class ByteStream:
    """For byte-level vocabularies: each id is a byte string; characters may span ids."""

    __slots__ = ("_decoder", "_token_bytes")

    def __init__(self, token_bytes: Callable[[int], bytes]) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        return self._decoder.decode(self._token_bytes(token_id))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class WindowStream:
    """For any `decode`: emit what decoding one more id adds to a short window of context."""

    __slots__ = ("_decode", "_ids", "_start", "_done")

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._start = 0  # first id of the context window
        self._done = 0  # ids whose text has been emitted

    def _pending(self) -> str:
        before = self._decode(self._ids[self._start:self._done])
        after = self._decode(self._ids[self._start:])
        return after[len(before):]  # the window's own context renders `before` the same way

    def feed(self, token_id: int) -> str:
        self._ids.append(token_id)
        piece = self._pending()
        if not piece or piece.endswith(REPLACEMENT):
            return ""  # nothing yet, or a character still arriving byte by byte
        self._start, self._done = self._done, len(self._ids)
        return piece

    def flush(self) -> str:
        if self._done == len(self._ids):
            return ""
        piece = self._pending()
        self._start = self._done = len(self._ids)
        return piece
