"""guidellm, a client nobody here wrote, against `servesim serve` (issue 47 item 9).

guidellm pins its own torch and transformers, so it is not in servesim's test
extra: the test looks for it in this interpreter, else for the executable
named by SERVESIM_GUIDELLM (e.g. a separate venv's `bin/guidellm`), else on
PATH, and skips saying so when there is none. It runs offline (HF_HUB_OFFLINE):
its synthetic prompts need a tokenizer, which is a small BPE trained here and
saved as a local tokenizer.json, so nothing is downloaded. A guidellm that
still reaches for the network is skipped with its own last line as the reason.
Bounded: 6 requests on 127.0.0.1, a 180 s timeout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_serve import scenario
from test_serve_metrics import one, values

from sim.serve.server import BackgroundServer, simulated_served
from sim.text import load_tokenizer

REQUESTS, OUTPUT_TOKENS = 6, 8
# what an offline guidellm says when it still wants the hub (then the test skips); a
# failure to reach servesim's own server is a failure, not a skip
_NETWORK_WORDS = ("huggingface.co", "hf_hub", "offline mode", "localentrynotfound",
                  "we couldn't connect to 'https")


def guidellm_command() -> list[str] | None:
    """How to run guidellm here, or None."""
    if importlib.util.find_spec("guidellm") is not None:
        return [sys.executable, "-m", "guidellm"]
    given = os.environ.get("SERVESIM_GUIDELLM")
    if given:
        return [given] if Path(given).is_file() else None
    found = shutil.which("guidellm")
    return [found] if found else None


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE that transformers' AutoTokenizer loads from disk."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50, trainer)
    folder = tmp_path_factory.mktemp("guidellm-tokenizer")
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|end|>",
        "pad_token": "<pad>"}))
    return folder


def test_guidellm_runs_against_servesim_serve(tokenizer_dir: Path, tmp_path: Path) -> None:
    command = guidellm_command()
    if command is None:
        given = os.environ.get("SERVESIM_GUIDELLM")
        where = f"SERVESIM_GUIDELLM={given[:80]!r} is not a file" if given else \
            "not importable, SERVESIM_GUIDELLM unset, none on PATH"
        pytest.skip(f"guidellm is not installed ({where}): `pip install guidellm` in a "
                    "separate venv and set SERVESIM_GUIDELLM=VENV/bin/guidellm (docs/serve.md)")
    served = simulated_served(scenario(), load_tokenizer("byte"), model_name="tiny")
    report = tmp_path / "guidellm.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL": "WARNING"}
    with BackgroundServer(served) as url:
        try:
            done = subprocess.run(
                [*command, "run", "--backend", f"kind=openai_http,target={url},model=tiny",
                 "--profile", "kind=synchronous",
                 "--constraint", f"kind=max_requests,count={REQUESTS}",
                 "--data", f"kind=synthetic_text,prompt_tokens=16,output_tokens={OUTPUT_TOKENS}",
                 "--tokenizer", f"kind=huggingface_auto,model={tokenizer_dir}",
                 "--output", f"kind=json,path={report}", "--disable-console"],
                capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
        except subprocess.TimeoutExpired:
            pytest.fail("guidellm did not finish 6 requests in 180 s")
        scraped = values(served_metrics(url))
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines() or ["(no output)"]
        if any(word in (done.stderr + done.stdout).lower() for word in _NETWORK_WORDS):
            pytest.skip(f"guidellm needs the network here: {said[-1][:200]}")
        pytest.fail(f"guidellm exited {done.returncode}: {said[-1][:300]}")
    bench = json.loads(report.read_text())["benchmarks"][0]
    assert bench["metrics"]["request_totals"] == {
        "successful": REQUESTS, "errored": 0, "incomplete": 0, "total": REQUESTS}
    got = bench["requests"]["successful"]
    # guidellm counts what the server's usage says; servesim gave every request its tokens
    assert [r["output_tokens"] for r in got] == [OUTPUT_TOKENS] * REQUESTS
    assert all(r["time_to_first_token_ms"] > 0 for r in got)
    # and the server saw the same: REQUESTS finished by length, as many tokens each
    assert one(scraped, "vllm:request_success_total", finished_reason="length") == REQUESTS
    assert one(scraped, "vllm:generation_tokens_total") == REQUESTS * OUTPUT_TOKENS


def served_metrics(url: str) -> str:
    import httpx

    return httpx.get(url + "/metrics", timeout=30).text
