"""Real BPE vocabularies behind the `Tokenizer` protocol, each through its own library.

- `TiktokenTokenizer`: a Tekken file (Mistral's JSON of base64 byte tokens,
  ranks and the pre-split pattern), run by tiktoken. The first
  `num_special` ids are control tokens; text ids follow them, as in Mistral's
  own tokenizer. Byte-level, so it streams with `ByteStream`.
- `SentencePieceTokenizer`: a SentencePiece `.model` (BPE with byte fallback).
- `HuggingFaceTokenizer`: a Hugging Face `tokenizer.json` through `tokenizers`.

The libraries are optional: each is imported when a tokenizer needs it, and
its absence is a `TokenizerError` that says what to pip install.
"""

from __future__ import annotations

import base64
import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from sim.text.base import ByteStream, DecoderStream, TokenizerError, WindowStream

# the EOS spellings of the common vocabularies, for a tokenizer.json that names none
_EOS_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>")
_MISTRAL_EOS_ID = 2  # Tekken's default control tokens start <unk>, <s>, </s>


def require(module: str, pip_name: str, what: str) -> ModuleType:
    """Import an optional library, or say exactly what to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise TokenizerError(f"{what} needs the {pip_name!r} package: "
                             f"pip install '{pip_name}'") from None


class TiktokenTokenizer:
    """A Tekken vocabulary: byte-level BPE over a regex pre-split, via tiktoken."""

    def __init__(self, path: Path, name: str) -> None:
        tiktoken = require("tiktoken", "tiktoken", f"tokenizer {name!r}")
        try:
            model = json.loads(path.read_bytes())
            config = model["config"]
            num_special = int(config["default_num_special_tokens"])
            vocab_size = int(config["default_vocab_size"])
            ranks = {base64.b64decode(entry["token_bytes"]): int(entry["rank"])
                     for entry in model["vocab"][:vocab_size - num_special]}
            pattern = config["pattern"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise TokenizerError(f"{path}: not a readable Tekken tokenizer file ({err})") from None
        special = {t.get("token_str"): int(t["rank"]) for t in model.get("special_tokens") or []}
        self.name = name
        self.vocab_size = vocab_size
        self.eos_id: int | None = special.get("</s>", _MISTRAL_EOS_ID)
        self.num_special = num_special
        self._encoding = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks,
                                           special_tokens={})

    def encode(self, text: str) -> list[int]:
        offset = self.num_special
        return [rank + offset for rank in self._encoding.encode_ordinary(text)]

    def token_bytes(self, token_id: int) -> bytes:
        """A control token (EOS and the like) has no text."""
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"{self.name}: token id {token_id} is outside "
                             f"0-{self.vocab_size - 1}")
        if token_id < self.num_special:
            return b""
        return self._encoding.decode_single_token_bytes(token_id - self.num_special)

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

    def decoder_stream(self) -> DecoderStream:
        return ByteStream(self.token_bytes)


class SentencePieceTokenizer:
    """A SentencePiece model; control tokens (BOS, EOS) decode to nothing."""

    def __init__(self, path: Path, name: str) -> None:
        spm = require("sentencepiece", "sentencepiece", f"tokenizer {name!r}")
        try:
            self._model: Any = spm.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError) as err:
            raise TokenizerError(f"{path}: not a readable SentencePiece model ({err})") from None
        self.name = name
        self.vocab_size = int(self._model.vocab_size())
        eos = int(self._model.eos_id())
        self.eos_id: int | None = eos if eos >= 0 else None

    def encode(self, text: str) -> list[int]:
        return list(self._model.encode(text, out_type=int))

    def decode(self, ids: Sequence[int]) -> str:
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"{self.name}: token id {bad[0]} is outside 0-{self.vocab_size - 1}")
        return str(self._model.decode(list(ids)))

    def decoder_stream(self) -> DecoderStream:
        return WindowStream(self.decode)


def _configured_eos(folder: Path) -> str | int | None:
    """EOS as the files beside a tokenizer.json name it (a token string or an id)."""
    for file, key in (("tokenizer_config.json", "eos_token"), ("config.json", "eos_token_id"),
                      ("generation_config.json", "eos_token_id")):
        try:
            value = json.loads((folder / file).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, str | int) and not isinstance(value, bool):
            return value
    return None


class HuggingFaceTokenizer:
    """A local `tokenizer.json`; special tokens are neither added nor decoded."""

    def __init__(self, path: Path, name: str) -> None:
        tokenizers = require("tokenizers", "tokenizers", f"tokenizer {name!r}")
        try:
            self._model: Any = tokenizers.Tokenizer.from_file(str(path))
        except Exception as err:  # the Rust side raises a bare Exception on a bad file
            raise TokenizerError(f"{path}: not a readable tokenizer.json ({err})") from None
        self.name = name
        self.vocab_size = int(self._model.get_vocab_size(with_added_tokens=True))
        eos = _configured_eos(path.parent)
        if isinstance(eos, str):
            eos = self._model.token_to_id(eos)
        if eos is None:
            found = (self._model.token_to_id(t) for t in _EOS_NAMES)
            eos = next((i for i in found if i is not None), None)
        self.eos_id: int | None = eos

    def encode(self, text: str) -> list[int]:
        return list(self._model.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"{self.name}: token id {bad[0]} is outside 0-{self.vocab_size - 1}")
        return str(self._model.decode(list(ids), skip_special_tokens=True))

    def decoder_stream(self) -> DecoderStream:
        return WindowStream(self.decode)
