"""`servesim compare`: the same requests for every variant, the outputs, the load search."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from test_sweep import TINY

import sim.experiments.run
from sim.cli import main
from sim.experiments.compare import load_spec, run_compare
from sim.experiments.compare_spec import (
    AutoSpec,
    Bracket,
    auto_next,
    bisect_max_rate,
    bracket,
    knee_midpoints,
)
from sim.experiments.sweep import Backend

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SPEC = """\
base: scenarios/tiny.yaml
variants:
  - {name: chunked, set: {scheduler.chunked_prefill: true}}
  - {name: whole, set: {scheduler.chunked_prefill: false, scheduler.max_num_seqs: 4}}
rates: [4, 32]
bisect_steps: 2
"""


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "tiny.yaml").write_text(TINY)
    path = tmp_path / "spec" / "compare.yaml"
    path.parent.mkdir()
    path.write_text(SPEC.replace("base: scenarios", "base: ../scenarios"))
    return path


def test_every_variant_sees_the_identical_request_stream(
        spec: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[float, list[tuple]]] = []
    real = sim.experiments.run.make_requests

    def recording(workload, seed, base_dir=None):  # noqa: ANN001, ANN202
        requests = list(real(workload, seed, base_dir))
        seen.append((workload.arrivals.rate, [(r.request_id, r.arrival_s, r.prompt_tokens,
                                               r.output_tokens) for r in requests]))
        return iter(requests)

    monkeypatch.setattr(sim.experiments.run, "make_requests", recording)
    base = load_spec(spec)
    result = run_compare(base, Backend("loky", jobs=1), progress=False)  # in process
    by_rate: dict[tuple[float, int], list[list[tuple]]] = {}
    for rate, stream in seen:  # the SLO search may also run longer streams of a rate
        by_rate.setdefault((rate, len(stream)), []).append(stream)
    assert {(4, 40), (32, 40)} <= set(by_rate)
    for key, (first, *others) in by_rate.items():
        assert all(other == first for other in others)  # ids, arrivals, lengths
        assert first[:40] == by_rate[(key[0], 40)][0]  # a longer run extends the stream
    for rate in (4, 32):
        assert len(by_rate[(rate, 40)]) >= 2
    assert by_rate[(4, 40)][0] != by_rate[(32, 40)][0]
    # the streams each run reports agree with what the simulator was fed
    streams = result.table.groupby("offered_rate")["request_stream"].nunique()
    assert (streams == 1).all()


def test_compare_end_to_end_writes_tables_and_plots(spec: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["compare", str(spec), "--jobs", "2", "--out", str(out)])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert "Highest sustained rate meeting the SLOs" in stdout and "results in" in stdout
    table = pd.read_csv(out / "compare.csv")
    assert table[["variant", "offered_rate"]].values.tolist() == [
        ["chunked", 4], ["chunked", 32], ["whole", 4], ["whole", 32]]
    for column in ("request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
                   "median_tpot_ms", "p99_tpot_ms", "p99_e2el_ms", "request_goodput",
                   "slot_utilization", "kv_waste_fraction", "tokens_per_s_per_user",
                   "tokens_per_s_per_gpu"):
        assert column in table.columns
    assert (table["completed"] == 40).all()
    per_gpu = table["output_throughput"] / table["gpus"]
    assert table["tokens_per_s_per_gpu"].tolist() == pytest.approx(per_gpu.tolist())
    assert (table["tokens_per_s_per_user"] > 0).all()
    probes = pd.read_csv(out / "probes.csv")  # sweep rows plus bisection probes
    assert len(probes) >= 4 + 2 * 2  # longer runs at the boundary come on top
    slo = pd.read_csv(out / "compare_slo.csv")
    assert slo["variant"].tolist() == ["chunked", "whole"]
    assert (slo["max_slo_rate"].dropna() > 0).all()
    md = (out / "compare.md").read_text()
    assert "| variant | offered req/s | req/s |" in md and "# Highest rate meeting the SLOs" in md
    pngs = {"throughput.png", "latency_vs_throughput.png", "pareto.png", "waste.png"}
    assert {p.name for p in out.glob("*.png")} == pngs
    assert all((out / name).read_bytes().startswith(PNG_MAGIC) for name in pngs)


def test_bisection_finds_a_rate_whose_neighbour_above_fails() -> None:
    limits = {"a": 3.7, "b": 11.0, "c": 0.3, "d": 100.0}  # meets the SLOs up to these rates
    calls = []

    def evaluate(probes: dict[str, float]) -> dict[str, bool]:
        calls.append(probes)
        return {name: rate <= limits[name] for name, rate in probes.items()}

    swept = [1.0, 2.0, 4.0, 8.0, 16.0]
    start = {n: bracket([(r, r <= limit) for r in swept]) for n, limit in limits.items()}
    assert start == {"a": Bracket(2.0, 4.0), "b": Bracket(8.0, 16.0), "c": Bracket(None, 1.0),
                     "d": Bracket(16.0, None)}
    found = bisect_max_rate(start, 8, evaluate)
    assert len(calls) == 8 and all(len(c) == 4 for c in calls)  # one batch per round
    for name in ("a", "b"):
        b = found[name]
        assert b.lo <= limits[name] < b.hi
        assert b.hi - b.lo == pytest.approx((start[name].hi - start[name].lo) / 2**8)
    assert found["c"].lo <= 0.3 < found["c"].hi  # halved down, then bisected
    assert found["d"].lo <= 100.0 < found["d"].hi  # doubled to 128 (fails), then bisected


def test_bracket_ignores_a_lucky_pass_above_a_failure() -> None:
    assert bracket([(1, True), (2, False), (4, True)]) == Bracket(1, 2)
    assert bracket([(1, False), (2, False)]) == Bracket(None, 1)


def row(rate: float, achieved: float) -> dict:
    return {"offered_rate": rate, "offered_rate_measured": rate, "completion_rate": achieved}


def test_auto_sweep_doubles_until_every_variant_saturates() -> None:
    auto = AutoSpec(start=1.0, max_rate=64.0, min_gain=1.1)
    growing = [row(1, 1.0), row(2, 2.0)]
    plateau = [row(1, 1.0), row(2, 1.5)]  # below 90% of offered: saturated
    flat = [row(1, 1.0), row(2, 1.95), row(4, 3.7), row(8, 3.9)]
    assert auto_next({"x": growing, "y": plateau}, auto)
    assert not auto_next({"y": plateau, "z": flat}, auto)
    assert not auto_next({"x": [row(64, 64.0)]}, auto)  # max_rate reached
    # fill-in: midpoints where each variant stops sustaining its rate
    assert knee_midpoints({"y": plateau, "z": flat}) == pytest.approx([2 ** 0.5, 32 ** 0.5])


ERRORS = {
    "unknown key": ("base: t.yaml\nvariants: [{name: a}]\nrate: [1]\n", "rate: unknown key"),
    "base and scenario": ("base: t.yaml\nscenario: {}\nvariants: [{name: a}]\n",
                          "exactly one of 'base'"),
    "changes the stream": ("base: t.yaml\nvariants: [{name: a, set: {seed: 2}}]\n",
                           "variants must serve the same requests"),
    "duplicate names": ("base: t.yaml\nvariants: [{name: a}, {name: a}]\n", "unique"),
    "bad rates": ("base: t.yaml\nvariants: [{name: a}]\nrates: [0, 2]\n", "rates must be"),
    "unknown override": ("base: t.yaml\nvariants: [{name: a, set: {scheduler.bogus: 1}}]\n",
                         "scheduler.bogus: unknown key"),
    "missing base": ("base: nope.yaml\nvariants: [{name: a}]\n", "no such scenario file"),
    "inline scenario error": ("scenario: {modle: x}\nvariants: [{name: a}]\n",
                              "modle: unknown key"),
}


@pytest.mark.parametrize("text, expected", ERRORS.values(), ids=ERRORS)
def test_spec_errors_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          text: str, expected: str) -> None:
    (tmp_path / "t.yaml").write_text(TINY)
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    code = main(["compare", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert expected in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
