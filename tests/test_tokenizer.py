"""Tokenizers: round trips, streaming decode across split characters, loading and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.text import ByteTokenizer, Tokenizer, TokenizerError, known_names, load_tokenizer
from sim.text.bpe import require

SAMPLES = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.\n\nNew paragraph\twith a tab.",
    "  leading and trailing spaces  ",
    "Ünïcödé façade, naïve café — “quotes” … and 日本語のテキスト, 你好世界, 안녕하세요",
    "emoji 🎉👩‍👩‍👧‍👦 and flags 🇫🇷 and math ∑∫√",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\r\n",
    "",
]


@pytest.fixture(scope="module")
def named() -> Callable[[str], Tokenizer]:
    """Loads each named vocabulary once per module; skips where its package is missing."""
    loaded: dict[str, Tokenizer] = {}

    def get(name: str) -> Tokenizer:
        if name not in loaded:
            try:
                loaded[name] = load_tokenizer(name)
            except TokenizerError as err:
                pytest.skip(str(err))
        return loaded[name]

    return get


@pytest.fixture(scope="module", params=["mistral-v1", "mistral-tekken"])
def bpe(request: pytest.FixtureRequest, named: Callable[[str], Tokenizer]) -> Tokenizer:
    return named(request.param)


def _streamed(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    stream = tokenizer.decoder_stream()
    return [stream.feed(i) for i in ids] + [stream.flush()]


# -- the byte tokenizer -------------------------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(st.text())
def test_byte_round_trip_and_ids_are_the_utf8_bytes(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1))
def test_byte_stream_never_splits_a_character(text: str) -> None:
    pieces = _streamed(ByteTokenizer(), ByteTokenizer().encode(text))
    assert "".join(pieces) == text
    assert "\ufffd" not in "".join(pieces) or "\ufffd" in text
    # a piece appears exactly when a character's last byte arrives: one piece per character
    assert [p for p in pieces if p] == list(text)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=40))
def test_byte_stream_equals_decode_even_for_invalid_utf8(data: bytes) -> None:
    tok = ByteTokenizer()
    assert "".join(_streamed(tok, list(data))) == tok.decode(list(data))


def test_byte_stream_holds_a_split_character_until_its_last_byte() -> None:
    stream = ByteTokenizer().decoder_stream()
    first, second, third, fourth = "🎉".encode()
    assert [stream.feed(b) for b in (first, second, third)] == ["", "", ""]
    assert stream.feed(fourth) == "🎉"
    assert stream.feed(ord("a")) == "a"
    assert stream.feed(first) == ""
    assert stream.flush() == "\ufffd"  # an unfinished character at the end is replaced


def test_byte_tokenizer_rejects_ids_outside_a_byte() -> None:
    with pytest.raises(ValueError, match="token id 256 is outside 0-255"):
        ByteTokenizer().decode([65, 256])


# -- real BPE vocabularies ----------------------------------------------------------------

@pytest.mark.parametrize("text", SAMPLES)
def test_bpe_round_trip_on_samples(bpe: Tokenizer, text: str) -> None:
    ids = bpe.encode(text)
    assert all(0 <= i < bpe.vocab_size for i in ids)
    assert bpe.decode(ids) == text
    assert "".join(_streamed(bpe, ids)) == text


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=60))
def test_bpe_round_trip_on_any_text(bpe: Tokenizer, text: str) -> None:
    assert bpe.decode(bpe.encode(text)) == text


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_bpe_stream_equals_decode_for_any_ids(bpe: Tokenizer, data: st.DataObject) -> None:
    """Any ids a model may emit, including byte pieces that break characters."""
    ids = data.draw(st.lists(st.integers(0, bpe.vocab_size - 1), max_size=25))
    assert "".join(_streamed(bpe, ids)) == bpe.decode(ids)


def test_bpe_spends_fewer_tokens_than_bytes_and_vocabularies_differ(
        named: Callable[[str], Tokenizer]) -> None:
    small, large = named("mistral-v1"), named("mistral-tekken")
    assert small.vocab_size < large.vocab_size
    text = " ".join(SAMPLES[:4]) * 5
    counts = [len(t.encode(text)) for t in (ByteTokenizer(), small, large)]
    assert counts[0] == len(text.encode("utf-8"))
    assert counts[1] < counts[0] and counts[2] < counts[0]
    assert small.encode(text) != large.encode(text)
    assert small.eos_id is not None and large.eos_id is not None
    assert small.decode([small.eos_id]) == "" and large.decode([large.eos_id]) == ""


def test_named_vocabularies_match_mistral_common_itself(
        named: Callable[[str], Tokenizer]) -> None:
    """Our reading of the shipped files agrees with the package's own tokenizers."""
    mistral = pytest.importorskip("mistral_common.tokens.tokenizers.mistral")
    theirs = {"mistral-v1": mistral.MistralTokenizer.v1(),
              "mistral-tekken": mistral.MistralTokenizer.v3(is_tekken=True)}
    text = " ".join(SAMPLES)
    for name, wrapped in theirs.items():
        ours, raw = named(name), wrapped.instruct_tokenizer.tokenizer
        assert ours.encode(text) == raw.encode(text, bos=False, eos=False)
        assert (ours.vocab_size, ours.eos_id) == (raw.n_words, raw.eos_id)


# -- a local tokenizer.json ---------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE trained here and saved as a Hugging Face tokenizer.json."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<pad>", "<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SAMPLES * 20, trainer)
    folder = tmp_path_factory.mktemp("hf")
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"}))
    return folder


@pytest.mark.parametrize("text", SAMPLES)
def test_tokenizer_json_round_trip_and_stream(hf_dir: Path, text: str) -> None:
    tok = load_tokenizer(str(hf_dir))  # a directory holding tokenizer.json
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert "".join(_streamed(tok, ids)) == text


def test_tokenizer_json_reads_vocab_size_and_eos(hf_dir: Path) -> None:
    import tokenizers

    raw = tokenizers.Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    tok = load_tokenizer(str(hf_dir / "tokenizer.json"))
    assert tok.vocab_size == raw.get_vocab_size()
    assert tok.eos_id == raw.token_to_id("<|end|>")
    assert tok.name == str(hf_dir / "tokenizer.json")
    assert len(tok.encode(SAMPLES[1])) < len(SAMPLES[1].encode())


# -- loading errors -----------------------------------------------------------------------

def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(TokenizerError, match="unknown tokenizer 'gpt-17'") as err:
        load_tokenizer("gpt-17")
    for name in known_names():
        assert name in str(err.value)


def test_bad_paths_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="holds no tokenizer.json"):
        load_tokenizer(str(tmp_path))
    other = tmp_path / "vocab.txt"
    other.write_text("a\nb\n")
    with pytest.raises(TokenizerError, match="expected a tokenizer.json"):
        load_tokenizer(str(other))
    pytest.importorskip("tokenizers")  # reading a tokenizer.json needs the package
    junk = tmp_path / "tokenizer.json"
    junk.write_text("{not json")
    with pytest.raises(TokenizerError, match="not a readable tokenizer.json"):
        load_tokenizer(str(junk))


def test_a_missing_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sim.text.catalogue._DATA_MODULE", "no_such_package_here")
    with pytest.raises(TokenizerError, match="pip install 'mistral-common"):
        load_tokenizer("mistral-tekken")
    with pytest.raises(TokenizerError, match="needs the 'no-such-dist' package: pip install"):
        require("no_such_module_here", "no-such-dist", "tokenizer 'x'")


def test_sim_text_imports_no_torch() -> None:
    code = ("import sys, sim.text, sim.cli.tokens, sim.workload.text\n"
            "sim.text.load_tokenizer('byte')\nprint('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
