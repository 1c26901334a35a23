"""A compare spec's `confidence:` and `--confidence`: one check, one tightening, the same runs
and answer; and `plan --confidence` rows that carry the confident upper bound beside the
point figure (docs/uncertainty.md)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from test_sweep import TINY

from sim.cli import main
from sim.experiments.compare_spec import load_spec
from sim.experiments.sweep import SweepError

SPEC = """\
base: tiny.yaml
variants:
  - {name: chunked, set: {scheduler.chunked_prefill: true}}
rates: [2, 8]
bisect_steps: 1
request_budget: 0
"""


def _spec(tmp_path: Path, extra: str = "", name: str = "spec.yaml") -> Path:
    (tmp_path / "tiny.yaml").write_text(TINY)
    path = tmp_path / name
    path.write_text(SPEC + extra)
    return path


def test_the_spec_field_and_the_option_load_the_same_tightened_base(tmp_path: Path) -> None:
    stated = load_spec(_spec(tmp_path, "confidence: 0.95\n", "stated.yaml"))
    given = load_spec(_spec(tmp_path, name="plain.yaml"), confidence=0.95)
    overridden = load_spec(_spec(tmp_path, "confidence: 0.6\n", "low.yaml"), confidence=0.95)
    point = load_spec(_spec(tmp_path, name="plain.yaml"))
    assert stated.confidence == given.confidence == overridden.confidence == 0.95
    assert stated.raw == given.raw == overridden.raw
    assert stated.confidence_note == given.confidence_note != ""
    assert point.confidence is None and point.confidence_note == ""
    for key in ("ttft_ms", "tpot_ms"):  # the option beats the spec's lower confidence
        assert stated.raw["slo"][key] < point.raw["slo"][key]
    lower = load_spec(_spec(tmp_path, "confidence: 0.6\n", "low.yaml"))
    assert stated.raw["slo"]["ttft_ms"] < lower.raw["slo"]["ttft_ms"] < point.raw["slo"][
        "ttft_ms"]


def test_a_compare_gives_the_same_answer_from_the_field_as_from_the_option(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stated, plain = _spec(tmp_path, "confidence: 0.9\n", "stated.yaml"), _spec(tmp_path)
    outs = []
    for spec, extra in ((stated, []), (plain, ["--confidence", "0.9"])):
        out = tmp_path / f"out_{spec.stem}"
        code = main(["compare", str(spec), *extra, "--jobs", "1", "--no-plots", "--out",
                     str(out)])
        stdout, err = capsys.readouterr()
        assert code == 0, err
        assert "SLO search at 90% confidence: bounds the runs meet" in stdout
        outs.append(out)
    for name in ("compare_slo.csv", "compare.csv"):
        first, second = (pd.read_csv(o / name) for o in outs)
        pd.testing.assert_frame_equal(first, second)


@pytest.mark.parametrize(("extra", "option", "named"), [
    ("confidence: 1.0\n", [], "confidence: a probability in [0.5, 1)"),
    ("confidence: 0.2\n", [], "confidence: a probability in [0.5, 1)"),
    ("confidence: high\n", [], "confidence: a probability in [0.5, 1), e.g. 0.95; got 'high'"),
    ("confidence: true\n", [], "confidence: a probability in [0.5, 1), e.g. 0.95; got True"),
    ("confidence: 0.95\n", ["--confidence", "1.5"], "--confidence: a probability in [0.5, 1)"),
    ("", ["--confidence", "nan"], "--confidence: a probability in [0.5, 1)")])
def test_a_bad_confidence_exits_2_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, option: list[str],
        named: str) -> None:
    spec = _spec(tmp_path, extra)
    code = main(["compare", str(spec), *option, "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and named in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_variant_may_not_set_its_own_slo_at_a_confidence(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "confidence: 0.95\n")
    spec.write_text(spec.read_text().replace("scheduler.chunked_prefill: true",
                                             "slo.ttft_ms: 500"))
    with pytest.raises(SweepError, match="confidence: variant 'chunked' sets slo.ttft_ms"):
        load_spec(spec)
    spec.write_text(spec.read_text().replace("confidence: 0.95\n", ""))
    assert load_spec(spec).raw["slo"]["ttft_ms"] == 300  # a point search may vary them


def _plan(tmp_path: Path, out: str, *extra: str) -> int:
    (tmp_path / "tiny.yaml").write_text(TINY)
    return main(["plan", str(tmp_path / "tiny.yaml"), "--rate", "4", "--gpu", "h100-sxm",
                 "--tp", "1", "--requests", "200", "--slo", "tpot:30", "--max-replicas", "2",
                 "--jobs", "1", "--no-plots", "--out", str(tmp_path / out), *extra])


def test_confident_plan_rows_carry_the_upper_bound_beside_the_point_figure(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _plan(tmp_path, "point") == 0
    point_out = capsys.readouterr().out
    assert _plan(tmp_path, "sure", "--confidence", "0.95") == 0
    sure_out = capsys.readouterr().out
    uppers = ["p99_ttft_ms_upper", "p99_tpot_ms_upper"]
    for name in ("plan.csv", "tried.csv"):
        point, sure = (pd.read_csv(tmp_path / d / name) for d in ("point", "sure"))
        assert not set(uppers) & set(point.columns)  # no confidence: the columns as before
        assert [c for c in sure.columns if c not in uppers] == list(point.columns)
        for metric in ("ttft", "tpot"):
            both = sure[[f"p99_{metric}_ms", f"p99_{metric}_ms_upper"]].dropna()
            assert len(both), name  # validated (H100, continuous): bounds exist
            assert (both[f"p99_{metric}_ms_upper"] >= both[f"p99_{metric}_ms"]).all()
        # the column is the bound the verdict held to the SLO (tpot:30)
        judged = sure["sustained"] & (sure["p99_tpot_ms_upper"] <= 30)
        assert sure["passes"].tolist() == judged.tolist()
    assert "p99_tpot_ms_upper" in sure_out and "p99_tpot_ms_upper" not in point_out
    assert "p99_ttft_ms_upper" in (tmp_path / "sure" / "plan.md").read_text()
