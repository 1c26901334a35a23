"""Text workloads (JSONL prompts -> token ids -> requests), prefix sharing, `servesim tokens`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from sim.cli import main
from sim.core.paged import PagedBlockManager
from sim.core.request import Request
from sim.text import ByteTokenizer, Tokenizer, TokenizerError, known_names, load_tokenizer
from sim.workload import WorkloadConfig, make_requests
from sim.workload.traces import TraceFormatError, detect_format, read_trace

SYSTEM = ("You are a careful assistant for an airline. Answer in two sentences, cite the "
          "fare rules by section number, and never promise a refund. ") * 6
QUESTIONS = ["Can I change my flight to Tuesday?", "Is my checked bag free on a basic fare?",
             "Wie viel kostet ein Sitzplatz am Notausgang?", "機内に液体を持ち込めますか？"]


@pytest.fixture(scope="module")
def tekken() -> Tokenizer:
    try:
        return load_tokenizer("mistral-tekken")
    except TokenizerError as err:
        pytest.skip(str(err))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows),
                    encoding="utf-8")
    return path


def requests_of(path: Path, seed: int = 0, **workload: object) -> list[Request]:
    cfg = WorkloadConfig.model_validate({"trace": {"path": str(path)}, **workload})
    return list(make_requests(cfg, seed))


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# -- make_requests end to end ---------------------------------------------------------------

@pytest.mark.parametrize("tokenizer", ["byte", "mistral-tekken"])
def test_jsonl_prompts_become_requests_with_their_token_ids(tmp_path: Path, tokenizer: str,
                                                            request: pytest.FixtureRequest
                                                            ) -> None:
    tok = ByteTokenizer() if tokenizer == "byte" else request.getfixturevalue("tekken")
    rows = [{"prompt": SYSTEM + q, "output_tokens": 7 + i, "timestamp": 2000 + 1000 * i,
             "user": "ignored"} for i, q in enumerate(QUESTIONS)]
    path = write_jsonl(tmp_path / "prompts.jsonl", rows)
    assert detect_format(path) == "text"
    reqs = requests_of(path, tokenizer=tokenizer, trace={"path": str(path), "time_scale": 2.0})
    # request i is row i; arrivals in ms (`timestamp`), first at 0, sped up twice
    assert [r.request_id for r in reqs] == list(range(len(rows)))
    t0 = rows[0]["timestamp"]
    assert [r.arrival_s for r in reqs] == pytest.approx(
        [(row["timestamp"] - t0) / 1000 / 2.0 for row in rows])
    for req, row in zip(reqs, rows, strict=True):
        ids = tuple(tok.encode(row["prompt"]))
        assert req.prompt_token_ids == ids
        assert req.prompt_tokens == len(ids)
        assert req.output_tokens == row["output_tokens"]


def test_missing_arrivals_and_outputs_are_drawn_from_the_workload(tmp_path: Path) -> None:
    rows = [{"prompt": q} for q in QUESTIONS] + [{"prompt": "fixed", "output_tokens": 3}]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    fill = {"arrivals": {"process": "poisson", "rate": 4.0},
            "output_tokens": {"dist": "uniform", "low": 50, "high": 60}}
    reqs = requests_of(path, seed=3, **fill)
    assert [r.prompt_token_ids for r in reqs] == [tuple(q.encode()) for q in QUESTIONS] + [
        tuple(b"fixed")]  # file order kept
    gaps = np.diff([r.arrival_s for r in reqs])
    assert reqs[0].arrival_s == 0.0 and (gaps > 0).all()
    assert all(50 <= r.output_tokens <= 60 for r in reqs[:-1]) and reqs[-1].output_tokens == 3
    again, other = requests_of(path, seed=3, **fill), requests_of(path, seed=4, **fill)
    assert [r.arrival_s for r in again] == [r.arrival_s for r in reqs]
    assert [r.arrival_s for r in other] != [r.arrival_s for r in reqs]
    assert len(requests_of(path, seed=3, num_requests=2, **fill)) == 2


def test_what_the_file_lacks_must_be_configured_and_nothing_twice(tmp_path: Path) -> None:
    bare = write_jsonl(tmp_path / "bare.jsonl", [{"prompt": "hi", "output_tokens": 2}])
    with pytest.raises(ValueError, match="workload.arrivals: .* has no arrival_s or timestamp"):
        requests_of(bare)
    timed = write_jsonl(tmp_path / "timed.jsonl", [{"prompt": "hi", "arrival_s": 1.0}])
    with pytest.raises(ValueError, match="workload.output_tokens: 1 rows .* no output_tokens"):
        requests_of(timed)
    with pytest.raises(ValueError, match="gives every row an arrival time"):
        requests_of(timed, arrivals={"process": "constant", "rate": 1.0},
                    output_tokens={"dist": "fixed", "value": 4})
    csv = tmp_path / "plain.csv"
    csv.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    with pytest.raises(ValueError, match="workload.output_tokens: .* gives every row an output"):
        requests_of(csv, output_tokens={"dist": "fixed", "value": 4})
    with pytest.raises(ValueError, match=r"gives every row an arrival time; .*arrival_s: null"):
        requests_of(csv, arrivals={"process": "constant", "rate": 1.0})
    with pytest.raises(ValueError, match="'prompt_tokens'"):
        WorkloadConfig.model_validate({"trace": {"path": str(bare)},
                                       "prompt_tokens": {"dist": "fixed", "value": 4}})


@pytest.mark.parametrize(("rows", "message"), [
    ([{"prompt": "a", "arrival_s": 0}, {"prompt": "b"}], r":2: expected arrival_s or timestamp"),
    ([{"prompt": "a", "arrival_s": 1, "timestamp": 5}], r":1: expected one of arrival_s"),
    ([{"prompt": "ok"}, {"text": "no prompt"}], r":2: expected a JSON object with a \"prompt\""),
    ([{"prompt": 42}], r":1: expected a JSON object with a \"prompt\""),
    ([{"prompt": ""}], r":1: expected a prompt of at least one byte token"),
    ([{"prompt": "x", "output_tokens": -2}], r":1: expected output_tokens as a non-negative"),
])
def test_bad_rows_name_the_line_and_what_was_expected(tmp_path: Path, rows: list[dict],
                                                      message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(TraceFormatError, match=message):
        read_trace(path, "text")


def test_an_unknown_tokenizer_names_the_field(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hi", "arrival_s": 0,
                                               "output_tokens": 1}])
    with pytest.raises(TokenizerError, match="workload.tokenizer: unknown tokenizer 'gpt-17'"):
        requests_of(path, tokenizer="gpt-17")


# -- the same text shares prefix blocks -----------------------------------------------------

@pytest.mark.parametrize("tokenizer", ["byte", "mistral-tekken"])
def test_prompts_sharing_text_share_prefix_blocks(tmp_path: Path, tokenizer: str,
                                                  request: pytest.FixtureRequest) -> None:
    if tokenizer != "byte":
        request.getfixturevalue("tekken")
    rows = [{"prompt": SYSTEM + q, "arrival_s": i, "output_tokens": 4}
            for i, q in enumerate(QUESTIONS[:2])]
    rows.append({"prompt": "Unrelated: " + SYSTEM, "arrival_s": 9, "output_tokens": 4})
    a, b, c = requests_of(write_jsonl(tmp_path / "p.jsonl", rows), tokenizer=tokenizer)
    block = 16
    kv = PagedBlockManager(400, block, watermark=0.0, enable_prefix_cache=True)
    assert kv.allocate(a.request_id, a.prompt_tokens, request=a) == 0
    kv.cache_computed(a.request_id, a.prompt_tokens)  # a's prefill ran
    shared = common_prefix(a.prompt_token_ids, b.prompt_token_ids)
    expected = min(shared, b.prompt_tokens - 1) // block * block
    assert expected >= 4 * block  # the system prompt spans several blocks
    assert kv.cached_prefix_tokens(b) == expected
    assert kv.allocate(b.request_id, b.prompt_tokens, request=b) == expected
    n = expected // block
    assert kv.block_table(a.request_id)[:n] == kv.block_table(b.request_id)[:n]
    assert kv.block_table(a.request_id)[n] != kv.block_table(b.request_id)[n]
    assert kv.cached_prefix_tokens(c) == 0  # the same text, shifted: no shared block
    kv.check_invariants()
    for r in (a, b):
        kv.free(r.request_id)
    kv.check_invariants()
    assert kv.num_free_blocks == kv.num_usable_blocks


def test_a_text_scenario_runs_end_to_end_with_prefix_hits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"prompt": SYSTEM + q, "arrival_s": 0.5 * i, "output_tokens": 5}
            for i, q in enumerate(QUESTIONS)]
    write_jsonl(tmp_path / "prompts.jsonl", rows)
    scenario = {"name": "text", "seed": 0, "model": "llama-3-8b",
                "hardware": {"gpu": "h100-sxm", "count": 1}, "kv": {"prefix_caching": True},
                "workload": {"trace": {"path": "prompts.jsonl"}}}
    path = tmp_path / "text.yaml"
    path.write_text(yaml.safe_dump(scenario))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet", "--no-plots"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == len(rows)
    assert summary["total_input_tokens"] == sum(len(r["prompt"].encode()) for r in rows)
    assert summary["total_prefix_hit_tokens"] > 0
    code = main(["run", str(path), "--out", str(out), "--quiet", "--no-plots",
                 "--set", "workload.tokenizer=gpt-17"])
    err = capsys.readouterr().err
    assert code == 2 and "workload.tokenizer: unknown tokenizer 'gpt-17'" in err
    assert "Traceback" not in err


# -- servesim tokens ------------------------------------------------------------------------

def _second_tokenizer(tmp_path: Path) -> tuple[str, Tokenizer]:
    """A real BPE: Tekken where mistral-common is installed, else a tokenizer.json made here."""
    try:
        return "mistral-tekken", load_tokenizer("mistral-tekken")
    except TokenizerError:
        tokenizers = pytest.importorskip("tokenizers")
        from tokenizers import models, pre_tokenizers, trainers

        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel()
        tok.train_from_iterator([SYSTEM, *QUESTIONS] * 5, trainers.BpeTrainer(
            vocab_size=500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.save(str(tmp_path / "tokenizer.json"))
        return str(tmp_path / "tokenizer.json"), load_tokenizer(str(tmp_path))


def test_tokens_cli_counts_match_each_tokenizers_encode(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"prompt": SYSTEM + q} for q in QUESTIONS]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    name, tekken = _second_tokenizer(tmp_path)
    assert main(["tokens", str(path), "--tokenizer", "byte", "--tokenizer", name,
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    prompts = [r["prompt"] for r in rows]
    assert report["prompts"] == len(rows) and report["kind"] == "jsonl"
    assert report["characters"] == sum(len(p) for p in prompts)
    assert report["bytes"] == sum(len(p.encode()) for p in prompts)
    byte, bpe = report["tokenizers"]
    assert byte["tokens"] == report["bytes"] and byte["bytes_per_token"] == 1.0
    expected = sum(len(tekken.encode(p)) for p in prompts)
    assert 0 < expected < report["bytes"]
    assert bpe["tokens"] == expected
    assert bpe["bytes_per_token"] == pytest.approx(report["bytes"] / expected)
    assert bpe["max_prompt_tokens"] == max(len(tekken.encode(p)) for p in prompts)
    assert bpe["tokens_vs_first"] == pytest.approx(expected / report["bytes"])
    assert bpe["vocab_size"] == tekken.vocab_size


def test_tokens_cli_table_for_a_text_file(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    text = SYSTEM + "\n".join(QUESTIONS)
    path = tmp_path / "doc.txt"
    path.write_text(text, encoding="utf-8")
    assert main(["tokens", str(path), "--tokenizer", "byte"]) == 0
    out = capsys.readouterr().out
    n = len(text.encode())
    assert f"one text, {len(text):,} characters, {n:,} bytes" in out
    line = next(li for li in out.splitlines() if li.startswith("byte "))
    assert line.split()[1:5] == ["256", f"{n:,}", "1.00", f"{len(text) / n:.2f}"]


def test_tokens_cli_errors_exit_2_without_traceback(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tokens", str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt: no such file" in capsys.readouterr().err
    doc = tmp_path / "doc.txt"
    doc.write_text("hello")
    assert main(["tokens", str(doc), "--tokenizer", "gpt-17"]) == 2
    err = capsys.readouterr().err
    assert "unknown tokenizer 'gpt-17'" in err and all(n in err for n in known_names())
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"nope": 1}])
    assert main(["tokens", str(bad)]) == 2
    assert "bad.jsonl:2: expected" in capsys.readouterr().err
    binary = tmp_path / "blob.txt"
    binary.write_bytes(b"\xff\xfe\x00abc")
    assert main(["tokens", str(binary), "--tokenizer", "byte"]) == 2
    assert "not UTF-8 text" in capsys.readouterr().err
