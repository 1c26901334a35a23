"""`servesim serve` measured by load generators: servesim's own, and vLLM's `vllm bench serve`.

    python benchmarks/serve_fidelity.py                       # all three parts, ~4 min
    python benchmarks/serve_fidelity.py --parts simulated     # one part
    python benchmarks/serve_fidelity.py --vllm-python /path/to/vllm-venv/bin/python

Parts (each writes under --out, default benchmarks/results/serve/):
- simulated: `servesim load` against `servesim serve` (the simulated backend) on
  the same scenario; the client's TTFT and TPOT p50 against what `servesim run`
  predicts for it, and the fidelity report of `load --compare`.
- engine: `servesim load --compare` against `servesim serve --engine` (the real
  engine on this CPU), the simulator with the shipped CPU table: the report.
- vllm-bench: vLLM's own benchmark client (`vllm bench serve`, from a venv with
  vLLM installed without CUDA, see docs/vllm_parity.md) against `servesim serve`,
  with a local byte-level tokenizer.json that both sides use; its report as printed.

Wall-clock figures on a shared machine: printed and written, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sim.config.loader import load_scenario  # noqa: E402
from sim.experiments.run import run_scenario  # noqa: E402

SIMULATED = (REPO / "scenarios" / "quickstart.yaml",
             ["workload.num_requests=200", "workload.arrivals.rate=6"])
ENGINE = (REPO / "scenarios" / "calibrate_cpu.yaml",
          ["workload.num_requests=120", "workload.arrivals.rate=6"])
ENGINE_TABLE = ["latency.model=table", "latency.path=../calibration/cpu-tiny"]
VLLM_DRIVER = ("import argparse, sys, vllm.benchmarks.serve as s; p = argparse.ArgumentParser(); "
               "s.add_cli_args(p); s.main(p.parse_args(sys.argv[1:]))")


def servesim(*args: str) -> list[str]:
    return [sys.executable, "-m", "sim.cli", *args]


def sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


class Served:
    """`servesim serve ...` on a free port, stopped with Ctrl-C (which writes its files)."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(servesim("serve", "--port", "0", *args),
                                     stderr=subprocess.PIPE, text=True, cwd=REPO)
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()
        found = re.search(r"http://[\d.]+:(\d+)/v1", line)
        if not found:
            self.proc.kill()
            raise SystemExit(f"servesim serve did not start: {line}{self.proc.stderr.read()}")
        self.url = f"http://127.0.0.1:{found.group(1)}"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(120)


def load(url: str, scenario: Path, overrides: list[str], out: Path, *extra: str) -> dict:
    done = subprocess.run(servesim("load", url, str(scenario), *sets(overrides), "--quiet",
                                   "--out", str(out), *extra), cwd=REPO, capture_output=True,
                          text=True)
    if done.returncode:
        raise SystemExit(f"servesim load failed: {done.stderr}")
    return json.loads((out / "summary.json").read_text())


def part_simulated(out: Path) -> list[str]:
    path, overrides = SIMULATED
    scenario, base_dir = load_scenario(path, overrides)
    predicted = run_scenario(scenario, base_dir, show_progress=False).summary
    server = Served([str(path), *sets(overrides), "--out", str(out / "served"), "--no-plots"])
    try:
        measured = load(server.url, path, overrides, out / "load", "--compare")
    finally:
        server.stop()
    served = json.loads((out / "served" / "summary.json").read_text())
    lines = [f"## Simulated backend: `servesim load` vs `servesim serve` on "
             f"{path.name} ({', '.join(overrides)})", "",
             "| metric | servesim run | server's own records | client (servesim load) | "
             "client / run |", "| --- | ---: | ---: | ---: | ---: |"]
    for key, label in (("median_ttft_ms", "TTFT p50 (ms)"), ("median_tpot_ms", "TPOT p50 (ms)"),
                       ("median_itl_ms", "ITL p50 (ms)"), ("median_e2el_ms", "E2EL p50 (ms)"),
                       ("output_throughput", "output tok/s")):
        ratio = measured[key] / predicted[key]
        lines.append(f"| {label} | {predicted[key]:.2f} | {served[key]:.2f} | "
                     f"{measured[key]:.2f} | {ratio:.3f} ({(ratio - 1) * 100:+.1f}%) |")
    within = all(abs(measured[k] / predicted[k] - 1) <= 0.05
                 for k in ("median_ttft_ms", "median_tpot_ms"))
    lines += ["", f"TTFT and TPOT p50 within 5% of `servesim run`: {'yes' if within else 'no'}.",
              "", "`load --compare` (the simulator replaying the requests as sent):", "",
              _table(out / "load" / "fidelity" / "fidelity.md")]
    return lines


def part_engine(out: Path) -> list[str]:
    path, overrides = ENGINE
    server = Served(["--engine", str(path), *sets(overrides), "--out", str(out / "served"),
                     "--no-plots"])
    try:
        load(server.url, path, overrides + ENGINE_TABLE, out / "load", "--compare")
    finally:
        server.stop()
    return [f"## Engine backend on this CPU: `servesim load --compare` vs `servesim serve "
            f"--engine` on {path.name} ({', '.join(overrides)}), simulator with "
            "calibration/cpu-tiny", "", _table(out / "load" / "fidelity" / "fidelity.md")]


def byte_tokenizer_dir(folder: Path) -> Path:
    """A Hugging Face tokenizer folder with one token per byte (ids 0-255), as servesim's
    `byte` tokenizer counts: vLLM's client and servesim then agree on every length."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    order = sorted(alphabet, key=lambda ch: _byte_of(ch))
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(order)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192}))
    return folder


def _byte_of(ch: str) -> int:
    """GPT-2's byte-to-unicode map, inverted: which byte a ByteLevel character stands for."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    code = ord(ch)
    if code in printable:
        return code
    rest = [b for b in range(256) if b not in printable]
    return rest[code - 256]


def part_vllm_bench(out: Path, vllm_python: Path) -> list[str]:
    path, overrides = SIMULATED
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = byte_tokenizer_dir(Path(tmp) / "byte-tokenizer")
        server = Served([str(path), *sets(overrides), "--tokenizer",
                         str(tokenizer / "tokenizer.json"), "--out", str(out / "served"),
                         "--no-plots"])
        try:
            started = time.perf_counter()
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}
            done = subprocess.run(
                [str(vllm_python), "-c", VLLM_DRIVER, "--backend", "openai",
                 "--base-url", server.url, "--endpoint", "/v1/completions",
                 "--model", "llama-3-8b", "--tokenizer", str(tokenizer),
                 "--dataset-name", "random", "--random-input-len", "512",
                 "--random-output-len", "128", "--num-prompts", "100", "--request-rate", "6",
                 "--ignore-eos", "--seed", "0", "--disable-tqdm", "--save-result",
                 "--result-dir", str(out), "--result-filename", "vllm_bench.json",
                 "--percentile-metrics", "ttft,tpot,itl,e2el"],
                capture_output=True, text=True, env=env, timeout=900)
            wall_s = time.perf_counter() - started
        finally:
            server.stop()
    if done.returncode:
        raise SystemExit(f"vllm bench serve failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    report = done.stdout[done.stdout.find("============ Serving Benchmark Result"):].strip()
    (out / "vllm_bench.txt").write_text(report + "\n")
    served = json.loads((out / "served" / "summary.json").read_text())
    return ["## vLLM's `vllm bench serve` against `servesim serve` (simulated, quickstart's "
            "Llama-3-8B on an H100)", "",
            "random dataset, 512 prompt / 128 output tokens, 100 prompts at 6 req/s, "
            f"--ignore-eos; {wall_s:.0f} s wall. vLLM's report as printed:", "", "```",
            report, "```", "",
            f"The server's own records of the same run: TTFT p50 "
            f"{served['median_ttft_ms']:.2f} ms, TPOT p50 {served['median_tpot_ms']:.2f} ms, "
            f"{served['completed']} requests."]


def _table(md: Path) -> str:
    """The metric table of a fidelity.md."""
    lines = md.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| metric"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")),
               len(lines))
    return "\n".join(lines[start:end])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "serve")
    parser.add_argument("--parts", nargs="+", default=["simulated", "engine", "vllm-bench"],
                        choices=["simulated", "engine", "vllm-bench"])
    parser.add_argument("--vllm-python", type=Path,
                        default=Path(os.environ.get("VLLM_PYTHON", "vllm-venv/bin/python")),
                        help="python of a venv with vLLM (env VLLM_PYTHON)")
    args = parser.parse_args()
    stamp = (f"commit {_commit()}, {time.strftime('%Y-%m-%d')}, load average "
             f"{' / '.join(f'{v:.2f}' for v in os.getloadavg())}")
    for part in args.parts:
        out = args.out / part
        if part == "vllm-bench" and not args.vllm_python.exists():
            print(f"vllm-bench skipped: no {args.vllm_python} (--vllm-python)")
            continue
        # a part rewrites its own folder whole: its old run (written before result
        # directories had manifests, or by a failed run) never mixes into the new one
        shutil.rmtree(out, ignore_errors=True)
        if part == "simulated":
            lines = part_simulated(out)
        elif part == "engine":
            lines = part_engine(out)
        else:
            lines = part_vllm_bench(out, args.vllm_python)
        lines[1:1] = ["", f"({stamp})"]
        (out / "SECTION.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)
    # the README joins every part's latest section, so a rerun of one part keeps the others
    sections = [(args.out / part / "SECTION.md") for part in ("simulated", "engine",
                                                             "vllm-bench")]
    body = "\n".join(p.read_text() for p in sections if p.is_file())
    (args.out / "README.md").write_text(
        "# servesim serve, measured (python benchmarks/serve_fidelity.py)\n\n" + body)
    print(f"written {args.out / 'README.md'}")
    return 0


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True)
    return done.stdout.strip() or "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
