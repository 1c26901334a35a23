"""The README's claims a reader can check: its capacity sheet, its token counts, its worked
example and its links are what the current code gives and what the repository holds."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from sim.cli import main
from sim.cli.tokens import count_tokens
from sim.text import TokenizerError, load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def fenced_after(text: str, first_line: str) -> list[str]:
    """The lines of the fenced block that starts with `first_line` (the command)."""
    start = text.index(first_line + "\n") + len(first_line) + 1
    return text[start:text.index("```", start)].rstrip("\n").splitlines()


def test_readme_capacity_sheet_is_what_the_command_prints(
        capsys: pytest.CaptureFixture[str]) -> None:
    command = "servesim capacity --model llama-3-8b --gpu h100-sxm --context 8192 --batch 32"
    shown = fenced_after(README, f"$ {command}")
    assert main(command.split()[1:]) == 0
    assert shown == capsys.readouterr().out.rstrip("\n").splitlines()


def test_readme_does_not_fit_example_is_what_the_command_prints(
        capsys: pytest.CaptureFixture[str]) -> None:
    shown = [line for line in fenced_after(README, "$ servesim capacity --model llama-3-70b")
             if line != "..."]
    assert main(["capacity", "--model", "llama-3-70b"]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert shown and all(line in printed for line in shown)


def _readme_token_counts() -> dict[str, int]:
    match = re.search(r"`docs/tokens_sample.txt`.*?is ([\d,]+) bytes = ([\d,]+) mistral-v1 "
                      r"tokens.*?= ([\d,]+) Tekken tokens", README, re.DOTALL)
    assert match, "the README's tokens example moved"
    counts = [int(g.replace(",", "")) for g in match.groups()]
    return dict(zip(("byte", "mistral-v1", "mistral-tekken"), counts, strict=True))


@pytest.mark.parametrize("name", ["byte", "mistral-v1", "mistral-tekken"])
def test_readme_token_counts_are_the_sample_files(name: str) -> None:
    try:
        tokenizer = load_tokenizer(name)
    except TokenizerError as err:
        pytest.skip(str(err))
    text = (ROOT / "docs" / "tokens_sample.txt").read_text(encoding="utf-8")
    assert count_tokens([text], tokenizer).tokens == _readme_token_counts()[name]


def _metrics_block(lines: list[str]) -> list[str]:
    """The vLLM-style table between its ==== rules (wall times are outside it)."""
    rules = [i for i, line in enumerate(lines) if line.startswith("=====")]
    return lines[rules[0]:rules[-1] + 1]


def test_readme_worked_example_is_what_the_simulator_gives(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shown = fenced_after(README, "$ servesim run scenarios/quickstart.yaml")
    assert main(["run", "scenarios/quickstart.yaml", "--no-plots", "--out",
                 str(tmp_path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert _metrics_block(shown) == _metrics_block(printed)
    window = [line for line in printed if line.startswith("Window ")]
    assert window and window[0] in shown  # the steady-state line, as printed


def _figures() -> tuple[object, dict[str, str]]:
    """benchmarks/readme_figures.py and docs/figures.md's sections, as regenerate.py has them."""
    benchmarks = str(ROOT / "benchmarks")
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    import readme_figures
    from regenerate import read_sections

    return readme_figures, read_sections((ROOT / "docs" / "figures.md").read_text())


def test_every_figures_block_is_what_docs_figures_gives() -> None:
    readme_figures, sections = _figures()
    blocks = readme_figures.BLOCK.findall(README)
    assert {name for name, _ in blocks} == set(readme_figures.BLOCKS)  # each quoted once+
    for name, body in blocks:
        rendered = readme_figures.BLOCK.search(
            readme_figures.render(f"<!-- figures: {name} -->{body}<!-- end figures: {name} -->",
                                  sections)).group(2)
        assert body == rendered, f"README block {name!r} differs from docs/figures.md"


def test_a_changed_figure_fails_the_comparison() -> None:
    readme_figures, sections = _figures()
    name, body = readme_figures.BLOCK.findall(README)[0]
    digits = re.search(r"\d+\.\d+", body)
    assert digits, name
    stale = body[:digits.start()] + "9" + body[digits.start():]
    text = f"<!-- figures: {name} -->{stale}<!-- end figures: {name} -->"
    assert readme_figures.render(text, sections) != text


# the commands whose whole output the README copies from docs/figures.md (regenerate.py's
# refresh_readme), as the README shows them and as the figures step ran them; wall-time
# lines included, since the README says whose they are
QUICKSTART = "servesim run scenarios/quickstart.yaml"
CAPACITY = "servesim capacity --model llama-3-8b --gpu h100-sxm --context 8192 --batch 32"
PLAN = "servesim plan scenarios/plan_llama70b.yaml --rate 40 --gpu h100-sxm,h200"
COPIED = {"quickstart": (QUICKSTART, QUICKSTART + " --timeline 6 --out results/quickstart"),
          "capacity": (CAPACITY, CAPACITY), "plan": (PLAN, PLAN)}


@pytest.mark.parametrize("step", sorted(COPIED))
def test_copied_outputs_are_docs_figures(step: str) -> None:
    _, sections = _figures()
    shown, ran = COPIED[step]
    assert fenced_after(README, f"$ {shown}") == fenced_after(sections[step], f"$ {ran}")


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("doc", ["README.md", "docs/ARCHITECTURE.md", "docs/figures.md",
                                 "notebooks/README.md"])
def test_relative_links_resolve_inside_the_repository(doc: str) -> None:
    path = ROOT / doc
    targets = [t for t in LINK.findall(path.read_text()) if "://" not in t]
    for target in targets:
        resolved = (path.parent / target).resolve()
        assert resolved.is_relative_to(ROOT), f"{doc} links outside the repository: {target}"
        assert resolved.exists(), f"{doc} links a missing file: {target}"


def test_readme_links_the_projects_own_architecture() -> None:
    assert "](docs/ARCHITECTURE.md)" in README and "DESIGN.md" not in README
