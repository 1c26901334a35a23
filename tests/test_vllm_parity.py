"""servesim's continuous scheduler against vLLM 0.32's own Scheduler, from recorded traces.

parity/record_vllm.py ran vLLM's v1 Scheduler on every configuration of
parity/configs.py; here servesim replays the same configurations through the
same step loop and must make the same decision at every step. The
configurations where today's servesim differs are listed, each with its cause
(A-E, see parity/NOTES.md), in parity/known_mismatches.json and marked xfail
strict: a fix that makes one match turns its XFAIL into a failure until the
list is regenerated (python -m parity.classify --json parity/known_mismatches.json).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from parity.compare import DEFAULT_TRACE, first_difference, load_recorded
from parity.configs import FAMILIES, generate_configs
from parity.servesim_side import ServesimSide
from parity.steps import RunResult, StepRecord, run_config
from parity.vllm_rules import RULES, classes

PARITY = Path(__file__).resolve().parent.parent / "parity"
CONFIGS = generate_configs()
BY_NAME = {c.name: c for c in CONFIGS}
META, RECORDED = load_recorded(DEFAULT_TRACE)
KNOWN = {row["name"]: row["causes"]
         for row in json.loads((PARITY / "known_mismatches.json").read_text())["rows"]}


def _cases() -> list:
    cases = []
    for config in CONFIGS:
        causes = KNOWN.get(config.name)
        marks = [pytest.mark.xfail(strict=True, reason=f"servesim differs from vLLM: cause "
                                   f"{'+'.join(causes)} (parity/NOTES.md)")] if causes else []
        cases.append(pytest.param(config.name, marks=marks, id=config.name))
    return cases


def _servesim(name: str, path: str = "auto", rules: frozenset[str] = frozenset()) -> RunResult:
    config = BY_NAME[name]
    kv_cls, sched_cls = classes(rules)
    return run_config(config, ServesimSide(config, path, kv_cls, sched_cls))


def test_recorded_trace_is_vllm_0_32_on_these_configurations() -> None:
    assert META["scheduler"] == "vllm" and META["vllm_version"] == "0.32.0"
    assert META["vllm_scheduler_defaults"]["scheduler_reserve_full_isl"] is True
    assert set(RECORDED) == set(BY_NAME)
    stale = [n for n, run in RECORDED.items() if run.digest != BY_NAME[n].digest]
    assert not stale, f"re-record: the generator changed {stale[:3]}"
    errors = {n: run.error for n, run in RECORDED.items() if run.error}
    assert not errors, errors
    assert set(KNOWN) <= set(BY_NAME)


def test_configurations_cover_what_issue_14_asks_for() -> None:
    assert len(CONFIGS) == sum(FAMILIES.values()) >= 200
    assert {c.chunked_prefill for c in CONFIGS} == {True, False}
    seqs = {c.max_num_seqs for c in CONFIGS}
    assert 1 in seqs and 256 in seqs
    assert any(c.watermark > 0 for c in CONFIGS)
    assert any(all(r.arrival_step == 0 for r in c.requests) for c in CONFIGS)
    assert any(len({r.arrival_step for r in c.requests}) > len(c.requests) // 2 for c in CONFIGS)
    # many chunks: a prompt at least 8 budgets long
    assert any(len(r.prompt_token_ids) >= 8 * c.max_num_batched_tokens
               for c in CONFIGS if c.chunked_prefill for r in c.requests)

    def shares_a_block(c) -> bool:
        firsts = [r.prompt_token_ids[:c.block_size] for r in c.requests
                  if len(r.prompt_token_ids) > c.block_size]
        return len(set(firsts)) < len(firsts)
    assert any(c.prefix_caching and shares_a_block(c) for c in CONFIGS)
    assert any(c.prefix_caching and not shares_a_block(c) for c in CONFIGS)
    # and vLLM really was driven through prefix hits and heavy preemption
    hits = sum(hit > 0 for run in RECORDED.values() for s in run.steps for _, hit in s.admitted)
    preempted = max(sum(len(s.preempted) for s in run.steps) for run in RECORDED.values())
    assert hits > 100 and preempted >= 50


@pytest.mark.parametrize("name", _cases())
def test_servesim_makes_vllms_decisions(name: str) -> None:
    mismatch = first_difference(RECORDED[name], _servesim(name))
    assert mismatch is None, mismatch.describe()


@pytest.mark.parametrize("path", ["auto", "each", "batch"])
def test_vllm_rules_prototype_matches_every_known_mismatch(path: str) -> None:
    """With A-E on (parity/vllm_rules.py) nothing is left unexplained, on every path."""
    names = sorted(KNOWN) if path == "auto" else sorted(KNOWN)[::3]
    bad = [m for m in (first_difference(RECORDED[n], _servesim(n, path, frozenset(RULES)))
                       for n in names) if m is not None]
    assert not bad, "\n".join(m.describe() for m in bad[:3])


def test_each_known_cause_is_needed() -> None:
    """A configuration listed with cause X differs again when only X is taken away."""
    every = frozenset(RULES)
    for cause in RULES:
        name = next(n for n, causes in sorted(KNOWN.items()) if cause in causes)
        assert first_difference(RECORDED[name], _servesim(name, rules=every - {cause})), \
            f"{name} matches without rule {cause}"


def test_first_difference_names_the_step_and_both_sides() -> None:
    same = StepRecord(0, ((0, 16),), (), (), ((0, 0),), 9)
    a = RunResult("x", "d", (same, StepRecord(1, ((0, 1), (1, 8)), (), (), ((1, 16),), 8)))
    b = RunResult("x", "d", (same, StepRecord(1, ((0, 1), (1, 24)), (), (), ((1, 0),), 7)))
    m = first_difference(a, b)
    assert m is not None and m.index == 1
    assert m.fields == ("scheduled", "admitted", "free_blocks")
    text = m.describe()
    assert "(1, 8)" in text and "(1, 24)" in text and "vllm" in text and "servesim" in text
    assert first_difference(a, a) is None
    shorter = first_difference(a, RunResult("x", "d", (same,)))
    assert shorter is not None and shorter.fields == ("steps",) and shorter.index == 1


def test_recorder_does_not_import_servesim() -> None:
    """The vLLM side runs in vLLM's venv, where sim and simpy do not exist."""
    for module in ("record_vllm", "configs", "steps", "trace"):
        tree = ast.parse((PARITY / f"{module}.py").read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [x for x in names if x.split(".")[0] in ("sim", "simpy")], module
