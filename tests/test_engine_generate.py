"""`servesim engine generate`: random weights are announced, and their bytes cannot drive
the terminal."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from gpu_engine.generate import printable, weights_notice  # noqa: E402
from sim.cli import main  # noqa: E402


def test_printable_escapes_control_characters_but_keeps_lines_and_tabs() -> None:
    assert printable("a\x1b[2Jb\x00\r") == "a\\x1b[2Jb\\x00\\r"
    assert printable("line\n\tindented é 字") == "line\n\tindented é 字"


def test_random_weights_are_announced_and_only_then() -> None:
    assert "random weights" in weights_notice("tiny", None)
    assert weights_notice("tiny", "/models/llama") is None


def test_generate_with_random_weights_says_so_and_prints_no_control_bytes(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["engine", "generate", "--prompt", "Once upon a time", "--max-tokens", "40",
                 "--temperature", "0.8", "--seed", "3", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "tiny has random weights" in err and "noise" in err
    text = out.removesuffix("\n")
    assert text and all(ch.isprintable() or ch in "\n\t" for ch in text)
    assert "\\x" in text  # these seeded random weights do emit control bytes, escaped
