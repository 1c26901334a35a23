"""`servesim tokens FILE`: what the same text costs in tokens under different vocabularies.

Serving cost scales with tokens, not characters: a prompt that is 1,000
tokens under a 131k-id BPE is more under a 32k-id one and about four times
that as raw bytes. FILE is plain text (one document) or a JSONL trace whose
rows carry a `prompt`; each tokenizer's counts come from its own `encode`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from sim.text import KNOWN_TOKENIZERS, Tokenizer, TokenizerError, describe, load_tokenizer


@dataclass(frozen=True, slots=True)
class TokenCount:
    """One tokenizer's counts over a set of texts."""

    tokenizer: str
    description: str
    vocab_size: int
    prompts: int
    tokens: int
    bytes: int
    characters: int
    max_prompt_tokens: int

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / self.tokens if self.tokens else 0.0

    @property
    def chars_per_token(self) -> float:
        return self.characters / self.tokens if self.tokens else 0.0

    @property
    def mean_prompt_tokens(self) -> float:
        return self.tokens / self.prompts if self.prompts else 0.0


def count_tokens(texts: Sequence[str], tokenizer: Tokenizer) -> TokenCount:
    """Tokens, UTF-8 bytes and characters of `texts`, each text encoded on its own."""
    per_text = [len(tokenizer.encode(text)) for text in texts]
    return TokenCount(
        tokenizer=tokenizer.name,
        description=describe(tokenizer),
        vocab_size=tokenizer.vocab_size,
        prompts=len(texts),
        tokens=sum(per_text),
        bytes=sum(len(text.encode("utf-8")) for text in texts),
        characters=sum(len(text) for text in texts),
        max_prompt_tokens=max(per_text, default=0),
    )


def read_texts(path: Path) -> tuple[list[str], bool]:
    """(texts, is_jsonl): a JSONL trace's prompts, or the whole file as one text."""
    from sim.workload.text import is_text_jsonl, read_prompts

    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if path.suffix.lower() == ".jsonl" or is_text_jsonl(path):
        return [record["prompt"] for _, record in read_prompts(path)], True
    try:
        return [path.read_text(encoding="utf-8")], False
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None


def _tokenizers(names: list[str]) -> tuple[list[Tokenizer], list[dict[str, str]]]:
    """The named tokenizers (errors are the user's), or every known one that loads here."""
    if names:
        return [load_tokenizer(name) for name in names], []
    loaded, skipped = [], []
    for known in KNOWN_TOKENIZERS:
        try:
            loaded.append(load_tokenizer(known.name))
        except TokenizerError as err:
            skipped.append({"name": known.name, "reason": str(err)})
    return loaded, skipped


def format_table(counts: Sequence[TokenCount], jsonl: bool) -> str:
    first = counts[0]
    header = ["tokenizer", "vocab", "tokens", "bytes/token", "chars/token"]
    if jsonl:
        header += ["tokens/prompt", "max/prompt"]
    header.append(f"vs {first.tokenizer}")
    rows = []
    for c in counts:
        row = [c.tokenizer, f"{c.vocab_size:,}", f"{c.tokens:,}", f"{c.bytes_per_token:.2f}",
               f"{c.chars_per_token:.2f}"]
        if jsonl:
            row += [f"{c.mean_prompt_tokens:,.1f}", f"{c.max_prompt_tokens:,}"]
        row.append(f"{c.tokens / first.tokens:.2f}" if first.tokens else "-")
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(r, widths, strict=True)))
             for r in [header, *rows]]
    lines += [f"  {c.tokenizer}: {c.description}" for c in counts]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        texts, jsonl = read_texts(path)
        tokenizers, skipped = _tokenizers(args.tokenizers)
    except (ValueError, FileNotFoundError) as err:  # TokenizerError and TraceFormatError too
        print(f"error: {err}", file=sys.stderr)
        return 2
    counts = [count_tokens(texts, tok) for tok in tokenizers]
    first = counts[0]
    if args.json:
        report = {
            "file": str(path), "kind": "jsonl" if jsonl else "text", "prompts": first.prompts,
            "characters": first.characters, "bytes": first.bytes,
            "tokenizers": [{**asdict(c), "bytes_per_token": c.bytes_per_token,
                            "chars_per_token": c.chars_per_token,
                            "mean_prompt_tokens": c.mean_prompt_tokens,
                            "tokens_vs_first": c.tokens / first.tokens if first.tokens else None}
                           for c in counts],
            "skipped": skipped,
        }
        print(json.dumps(report, indent=2))
        return 0
    what = f"{first.prompts:,} prompts" if jsonl else "one text"
    print(f"{path}: {what}, {first.characters:,} characters, {first.bytes:,} bytes (UTF-8)")
    print(format_table(counts, jsonl))
    for s in skipped:
        print(f"  skipped {s['name']}: {s['reason']}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    names = ", ".join(t.name for t in KNOWN_TOKENIZERS)
    p = subparsers.add_parser(
        "tokens", help="count a text's tokens under one or more tokenizers",
        description="Token counts and bytes per token of a text file or a JSONL of prompts.")
    p.add_argument("file", help="a UTF-8 text file, or a JSONL whose rows carry a 'prompt'")
    p.add_argument("--tokenizer", dest="tokenizers", action="append", default=[],
                   metavar="NAME", help=f"{names}, or a tokenizer.json path (repeatable; "
                                        "default: every known one installed here)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)
