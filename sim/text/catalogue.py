"""Tokenizers by name or by path, all offline.

The named BPE vocabularies come from the `mistral-common` wheel, which ships
Mistral's tokenizer files inside the package (nothing is downloaded): a
32,000-id SentencePiece BPE (Mistral 7B v0.1, the Llama-2 family of
vocabularies) and the 131,072-id Tekken tiktoken BPE (Mistral NeMo), so the
same text can be priced under a small and a large vocabulary. The package is
located without importing it; its files are read by sentencepiece / tiktoken.
A path may name a Hugging Face `tokenizer.json` (or a directory holding one),
a Tekken `.json` or a SentencePiece `.model`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sim.text.base import Tokenizer, TokenizerError
from sim.text.bpe import HuggingFaceTokenizer, SentencePieceTokenizer, TiktokenTokenizer
from sim.text.byte import ByteTokenizer

_DATA_PACKAGE = "mistral-common"
_DATA_MODULE = "mistral_common"
_PIP_HINT = "pip install 'mistral-common>=1.9' tiktoken sentencepiece"


@dataclass(frozen=True, slots=True)
class KnownTokenizer:
    """A named vocabulary: where its file is and what reads it."""

    name: str
    description: str
    vocab_size: int
    data_file: str | None  # inside mistral_common/data, or None for the byte tokenizer
    reader: Callable[[Path, str], Tokenizer] | None


KNOWN_TOKENIZERS: tuple[KnownTokenizer, ...] = (
    KnownTokenizer("byte", "UTF-8 bytes, needs nothing", 256, None, None),
    KnownTokenizer("mistral-v1", "SentencePiece BPE of Mistral 7B v0.1 (Llama-2 family)",
                   32_000, "tokenizer.model.v1", SentencePieceTokenizer),
    KnownTokenizer("mistral-tekken", "Tekken tiktoken BPE of Mistral NeMo",
                   131_072, "tekken_240718.json", TiktokenTokenizer),
)


def known_names() -> tuple[str, ...]:
    return tuple(t.name for t in KNOWN_TOKENIZERS)


def find_known(name: str) -> KnownTokenizer | None:
    wanted = name.strip().lower()
    return next((t for t in KNOWN_TOKENIZERS if t.name == wanted), None)


def _data_file(known: KnownTokenizer) -> Path:
    spec = importlib.util.find_spec(_DATA_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(f"tokenizer {known.name!r} reads its vocabulary from the "
                             f"{_DATA_PACKAGE!r} wheel, which is not installed: {_PIP_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / str(known.data_file)
    if not path.is_file():
        raise TokenizerError(f"tokenizer {known.name!r}: the installed {_DATA_PACKAGE} has no "
                             f"data/{known.data_file}; {_PIP_HINT}")
    return path


def _from_path(given: str) -> Tokenizer:
    path = Path(given).expanduser()
    if path.is_dir():
        if not (path / "tokenizer.json").is_file():
            raise TokenizerError(f"tokenizer directory {given!r} holds no tokenizer.json")
        path = path / "tokenizer.json"
    if path.suffix == ".model":
        return SentencePieceTokenizer(path, given)
    if path.suffix == ".json":
        try:
            with path.open("rb") as handle:
                head = handle.read(4096)
        except OSError as err:
            raise TokenizerError(f"tokenizer file {given!r} cannot be read: {err}") from None
        if b'"config"' in head and b'"pattern"' in head:
            return TiktokenTokenizer(path, given)
        return HuggingFaceTokenizer(path, given)
    raise TokenizerError(f"tokenizer file {given!r}: expected a tokenizer.json, a Tekken "
                         ".json or a SentencePiece .model")


def load_tokenizer(name_or_path: str) -> Tokenizer:
    """A known name (see `known_names()`), or a path to a tokenizer file or directory."""
    known = find_known(name_or_path)
    if known is not None:
        if known.reader is None:
            return ByteTokenizer()
        return known.reader(_data_file(known), known.name)
    if Path(name_or_path).expanduser().exists():
        return _from_path(name_or_path)
    raise TokenizerError(f"unknown tokenizer {name_or_path!r}: expected one of "
                         f"{', '.join(known_names())}, or a path to a tokenizer.json (or a "
                         "directory holding one); no such file or directory")


def describe(tokenizer: Tokenizer) -> str:
    """One line for tables: the catalogue description, or the file it came from."""
    known = find_known(tokenizer.name)
    return known.description if known is not None else f"from {tokenizer.name}"

