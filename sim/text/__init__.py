"""Text and tokens, in pure Python (no torch): the simulator and the engine both use it.

`load_tokenizer("byte" | "mistral-v1" | "mistral-tekken" | path)` gives a
`Tokenizer`: `encode`, `decode` and `decoder_stream()` for streaming.
"""

from sim.text.base import DecoderStream, Tokenizer, TokenizerError
from sim.text.byte import ByteTokenizer
from sim.text.catalogue import KNOWN_TOKENIZERS, describe, known_names, load_tokenizer

__all__ = [
    "KNOWN_TOKENIZERS",
    "ByteTokenizer",
    "DecoderStream",
    "Tokenizer",
    "TokenizerError",
    "describe",
    "known_names",
    "load_tokenizer",
]
