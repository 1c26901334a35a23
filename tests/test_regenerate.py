"""benchmarks/regenerate.py: steps chosen by name, one section per step, each stamped with the
machine and commit, a subset leaving the other sections as they were."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_script():  # noqa: ANN201 - the module object
    spec = importlib.util.spec_from_file_location("regenerate", ROOT / "benchmarks" /
                                                  "regenerate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["regenerate"] = module
    spec.loader.exec_module(module)
    return module


regenerate = load_script()


def test_unknown_steps_are_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert regenerate.main(["--only", "capacity,figurez"]) == 2
    err = capsys.readouterr().err
    assert "--only figurez: unknown step" in err and "capacity" in err
    assert regenerate.main(["--skip", "nope"]) == 2


def test_only_and_skip_keep_the_fixed_order() -> None:
    names = [s.name for s in regenerate.choose("notebooks,capacity", None)]
    assert names == ["capacity", "notebooks"]
    every = [s.name for s in regenerate.STEPS]
    assert [s.name for s in regenerate.choose(None, "notebooks")] == every[:-1]


def test_every_published_path_is_a_tracked_kind_of_file() -> None:
    for step in regenerate.STEPS:
        for path in step.publishes:
            assert not Path(path).is_absolute() and ".." not in Path(path).parts
            assert path == "README.md" or path.startswith((
                "docs/", "benchmarks/results/", "notebooks/", "calibration/cpu-tiny/fidelity")
            ), path


def test_sections_round_trip_and_keep_step_order() -> None:
    text = regenerate.write_figures({"tokens": "## tokens\nB\n", "capacity": "## capacity\nA\n"})
    assert text.index("## capacity") < text.index("## tokens")
    assert regenerate.read_sections(text) == {"capacity": "## capacity\nA\n",
                                              "tokens": "## tokens\nB\n"}


def test_a_step_run_alone_replaces_only_its_own_section(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    figures, readme = tmp_path / "figures.md", tmp_path / "README.md"
    head = "$ servesim capacity --model llama-3-8b"
    text = (ROOT / "README.md").read_text()
    start = text.index("\n", text.index(head)) + 1
    readme.write_text(text[:start] + "stale sheet\n" + text[text.index("```", start):])
    before = (ROOT / "README.md").stat().st_mtime_ns
    argv = ["--work", str(tmp_path / "work"), "--figures", str(figures), "--readme", str(readme)]
    assert regenerate.main(["--only", "capacity", *argv]) == 0
    first = regenerate.read_sections(figures.read_text())
    assert set(first) == {"capacity"}
    machine, _, commit = regenerate.provenance().partition("; ")  # load average moves
    assert f"{machine.split(', load average')[0]}" in first["capacity"]
    assert f"; {commit}, " in first["capacity"] and "CPUs" in machine
    assert commit.startswith(("commit ", "no git checkout"))
    assert "$ servesim capacity --model llama-3-70b" in first["capacity"]
    assert "does NOT fit" in first["capacity"]
    assert regenerate.main(["--only", "tokens", *argv]) == 0
    both = regenerate.read_sections(figures.read_text())
    assert both["capacity"] == first["capacity"]
    assert "docs/tokens_sample.txt: one text" in both["tokens"]
    out = capsys.readouterr().out
    assert "[1/1] capacity: done in" in out and "[1/1] tokens: done in" in out
    assert (ROOT / "README.md").stat().st_mtime_ns == before  # only the copy was refreshed
    refreshed = readme.read_text()
    assert "stale sheet" not in refreshed and "roofline step" in refreshed


figure_steps = sys.modules["figure_steps"]  # loaded by regenerate, from benchmarks/


def fenced_after(text: str, command: str) -> str:
    """The output of the fenced block that starts with `$ command`."""
    head = f"```\n$ {command}\n"
    assert head in text, f"no fenced block starts with `$ {command}`"
    start = text.index(head) + len(head)
    return text[start:text.index("```", start)]


@pytest.mark.parametrize("quote", figure_steps.PAGE_QUOTES, ids=lambda q: q[2][:40])
def test_each_quoted_run_has_its_block_and_its_step(quote: tuple[str, str, str]) -> None:
    step, page, command = quote
    fenced_after((ROOT / page).read_text(), command)  # the step's refresh finds its block
    owner = {s.name: s for s in regenerate.STEPS}[step]
    assert page in owner.publishes  # so provenance excludes it and --list names it


@pytest.mark.parametrize("quote", figure_steps.PAGE_QUOTES, ids=lambda q: q[2][:40])
def test_doc_pages_quote_docs_figures(quote: tuple[str, str, str]) -> None:
    step, page, command = quote
    sections = regenerate.read_sections((ROOT / "docs" / "figures.md").read_text())
    if step not in sections:
        pytest.skip(f"docs/figures.md has no {step} section yet (regenerate --only {step})")
    if f"$ {command}\n" not in sections[step]:
        pytest.skip(f"the {step} section skipped `{command[:40]}` (its data are absent)")
    assert fenced_after((ROOT / page).read_text(), command) == fenced_after(sections[step],
                                                                          command)


def test_quote_copies_a_sections_run_into_its_page_only(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    step, page, command = figure_steps.PAGE_QUOTES[-1]
    original = (ROOT / page).read_text()
    (tmp_path / page).parent.mkdir(parents=True)
    (tmp_path / page).write_text(original)
    monkeypatch.setattr(figure_steps, "REPO", tmp_path)
    body = f"intro\n\n```\n$ {command}\nfresh output\n```\n"
    assert figure_steps.quote(step, body) == body
    quoted = (tmp_path / page).read_text()
    assert fenced_after(quoted, command) == "fresh output\n"
    for _, other_page, other in figure_steps.PAGE_QUOTES:  # blocks the body lacks: kept
        if other_page == page and other != command:
            assert fenced_after(quoted, other) == fenced_after(original, other)
    assert figure_steps.quote("capacity", body.replace("fresh", "stale")) and \
        fenced_after((tmp_path / page).read_text(), command) == "fresh output\n"  # not its step
