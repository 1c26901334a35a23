"""The profiler: its grid, thinning to a budget, the engine cycle it times, its table files."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")  # the profiler runs the engine

from calibrate.profile.grid import (  # noqa: E402
    SPEC_TOKENS,
    GridLimits,
    GridPoint,
    corners,
    default_grid,
    estimate_costs_s,
    evenly,
    plan_within,
)
from calibrate.profile.rig import build_rig  # noqa: E402
from calibrate.profile.run import ProfileSettings, profile_engine  # noqa: E402
from calibrate.profile.shaping import PointRun, shape_matches  # noqa: E402
from gpu_engine.clock import WallClock  # noqa: E402
from gpu_engine.host import ThreadCpuClock  # noqa: E402
from gpu_engine.replay import replay_scenario  # noqa: E402
from sim.cli import main  # noqa: E402
from sim.config.catalogue import get_model  # noqa: E402
from sim.config.loader import load_scenario  # noqa: E402
from sim.latency.table_files import read_measurements, read_metadata  # noqa: E402

LIMITS = GridLimits(256, 8, 512, 10**9, 20)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A small real profile of the tiny engine under a 3-second budget."""
    settings_ = ProfileSettings(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=512,
                                budget_s=3.0, warmup=1, repeats=3, passes=1, max_group=2)
    out = tmp_path_factory.mktemp("profile") / "cpu-tiny"
    return settings_, profile_engine(settings_, out, show_progress=False)


# -- the grid ---------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(budget=st.integers(8, 4096), seqs=st.integers(1, 256), longest=st.integers(64, 8192),
       pool=st.integers(1_000, 10**7), steps=st.integers(4, 40))
def test_every_grid_point_fits_the_engine(budget: int, seqs: int, longest: int, pool: int,
                                          steps: int) -> None:
    seqs = min(seqs, budget)
    limits = GridLimits(budget, seqs, longest, pool, steps)
    grid = default_grid(limits)
    assert len(set(grid)) == len(grid)
    for p in grid:
        assert limits.fits(p)
        assert p.chunk_tokens + p.num_decodes * (1 + p.spec_tokens) <= budget
        assert p.kv_tokens(steps) <= pool
        assert p.decode_context + steps * (1 + p.spec_tokens) + p.spec_tokens < longest or \
            not p.num_decodes
        shape = p.shape
        assert shape.num_decodes == p.num_decodes and shape.num_prefill_tokens == p.chunk_tokens
        assert shape.num_spec_tokens == p.num_decodes * p.spec_tokens
        assert (p.kind == "verify") == (p.spec_tokens > 0)
        assert shape.decode_context_sum <= p.num_decodes * p.decode_context


def test_grid_spans_prefill_decode_mixed_and_verify_within_the_budgets() -> None:
    grid = default_grid(LIMITS)
    prefill = [p for p in grid if p.kind == "prefill"]
    assert min(p.chunk_tokens for p in prefill) == 1
    assert max(p.chunk_tokens for p in prefill) == LIMITS.max_num_batched_tokens
    assert {p.chunk_context > 0 for p in prefill} == {True, False}  # with and without context
    decode = [p for p in grid if p.kind == "decode"]
    assert max(p.num_decodes for p in decode) == LIMITS.max_num_seqs
    assert any(p.ragged for p in decode) and any(not p.ragged for p in decode)
    mixed = [p for p in grid if p.kind == "mixed"]
    assert mixed and all(p.num_decodes and p.chunk_tokens for p in mixed)
    # the budget-filling chunks a saturated chunked-prefill scheduler runs
    assert any(p.chunk_tokens + p.num_decodes == LIMITS.max_num_batched_tokens for p in mixed)
    verify = [p for p in grid if p.kind == "verify"]  # speculative: batch x context x k
    assert {p.spec_tokens for p in verify} == set(SPEC_TOKENS)
    assert len({p.num_decodes for p in verify}) >= 2
    assert all(p.shape.decode_query_tokens == 1 + p.spec_tokens for p in verify)


def test_corners_hold_each_familys_extremes() -> None:
    grid = default_grid(LIMITS)
    chosen = [grid[i] for i in corners(grid)]
    for kind in ("prefill", "decode", "mixed", "verify"):
        members = [p for p in grid if p.kind == kind]
        mine = [p for p in chosen if p.kind == kind]
        assert 2 <= len(mine) <= 4
        if kind == "prefill":
            sizes = [p.chunk_tokens for p in members]
            assert {min(sizes), max(sizes)} <= {p.chunk_tokens for p in mine}
        elif kind == "decode":
            sizes = [p.num_decodes for p in members]
            assert {min(sizes), max(sizes)} <= {p.num_decodes for p in mine}


@settings(max_examples=60, deadline=None)
@given(costs=st.lists(st.floats(0.001, 5.0), min_size=1, max_size=120),
       budget=st.floats(0.0, 60.0))
def test_thinning_fits_the_budget_and_spreads_evenly(costs: list[float], budget: float) -> None:
    pending = list(range(len(costs)))
    array = np.array(costs)
    chosen = plan_within(pending, array, budget)
    assert set(chosen) <= set(pending) and chosen == sorted(chosen)
    assert array[chosen].sum() <= budget + 1e-9
    if len(chosen) >= 2:  # evenly: gaps differ by at most one position (rounding)
        assert chosen[0] == 0 and chosen[-1] == len(costs) - 1
        gaps = np.diff(chosen)
        assert gaps.max() - gaps.min() <= 1
    if array.sum() <= budget:
        assert chosen == pending


def test_evenly_keeps_both_ends() -> None:
    assert evenly(list(range(10)), 3) == [0, 4, 9] or evenly(list(range(10)), 3) == [0, 5, 9]
    assert evenly([4, 7], 5) == [4, 7] and evenly([1, 2, 3], 0) == []


def test_cost_estimate_follows_a_line_through_measured_points() -> None:
    grid = [GridPoint("prefill", n) for n in (1, 64, 128, 256)]
    truth = [0.01 + 0.001 * p.work for p in grid]
    estimate = estimate_costs_s(grid, {0: truth[0], 3: truth[3]})
    assert estimate == pytest.approx(truth, rel=1e-6)


# -- a real profile --------------------------------------------------------------------
def test_profile_respects_its_budget(profiled) -> None:  # noqa: ANN001
    settings_, result = profiled
    assert 0 < len(result.measurements) < result.grid_points  # thinned
    # the corners are measured whatever the budget; past them a point starts only when its
    # estimated cost fits what is left, so the overrun is at most about one point's time
    corners_s = sum(result.points_s[:result.corners])
    assert len(result.points_s) == len(result.measurements) + len(result.skipped)
    assert result.measure_s <= max(settings_.budget_s, corners_s) + 2 * max(result.points_s)
    kinds = {m.kind for m in result.measurements}
    assert kinds == {"prefill", "decode", "mixed", "verify"}


def test_profile_metadata_says_what_produced_it(profiled) -> None:  # noqa: ANN001
    settings_, result = profiled
    meta = read_metadata(result.directory)
    assert meta == result.metadata
    assert meta.torch_version == torch.__version__ and meta.device_kind == "cpu"
    assert meta.cuda_version is None and meta.dtype == "float32"
    assert meta.model_spec == get_model("tiny") and meta.block_size == settings_.block_size
    assert meta.max_num_batched_tokens == 256 and meta.max_num_seqs == 8
    assert meta.engine_commit and meta.timing == "wall"
    assert "torch_threads=1" in meta.notes and "clock=wall" in meta.notes


def test_measurements_round_trip_and_hold_the_cycle(profiled) -> None:  # noqa: ANN001
    settings_, result = profiled
    assert tuple(read_measurements(result.directory)) == result.measurements
    for m in result.measurements:
        assert m.repeats == settings_.repeats
        assert m.wall_ms_p10 <= m.wall_ms_median <= m.wall_ms_p90
        # the cycle contains the kernels: scheduling and bookkeeping come on top
        assert m.wall_ms_median >= m.device_ms_median * 0.99
        if m.kind != "prefill":
            assert m.num_decodes >= 1 and m.padded_batch >= m.num_decodes
        # a verify step ran k drafts on every decode, k as the grid asked
        assert (m.kind == "verify") == (m.decode_query_tokens > 1)
        if m.kind == "verify":
            assert m.decode_query_tokens - 1 in SPEC_TOKENS


def test_profile_cli_names_the_bad_option(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    assert main(["calibrate", "profile", "--model", "nope", "--device", "cpu",
                 "--out", str(tmp_path)]) == 2
    assert "--model: unknown model 'nope'" in capsys.readouterr().err
    assert main(["calibrate", "profile", "--model", "tiny", "--device", "cpu", "--out",
                 str(tmp_path), "--max-num-seqs", "64", "--max-num-batched-tokens", "32"]) == 2
    assert "--max-num-batched-tokens: must be >= max_num_seqs" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate", "profile", "--model", "tiny", "--device", "cpu", "--out",
              str(tmp_path), "--budget-s", "-1"])
    assert exit_info.value.code == 2
    if not torch.cuda.is_available():
        assert main(["calibrate", "profile", "--model", "tiny", "--device", "cuda",
                     "--out", str(tmp_path)]) == 2
        assert "--device" in capsys.readouterr().err
    assert not (tmp_path / "measurements.csv").exists()


def test_settings_problems_name_field_value_and_rule() -> None:
    bad = dataclasses.replace(ProfileSettings(), repeats=0, clock="cpu", device="cuda")
    problems = " | ".join(bad.problems())
    assert "repeats: must be an integer >= 1, got 0" in problems
    assert "clock: must be wall, or cpu with device cpu" in problems
    assert ProfileSettings().problems() == []


# -- the engine's clock and step durations ---------------------------------------------
def test_replayed_step_durations_tile_the_busy_time() -> None:
    """Back to back, each step starts where the last ended: host work between steps is
    charged to a step, as the simulator's steps tile its clock."""
    scenario, base = load_scenario("scenarios/calibrate_cpu.yaml", [
        "workload.num_requests=6", "workload.arrivals.rate=1000",
        "workload.output_tokens={dist: fixed, value: 6}",
        "workload.prompt_tokens={dist: fixed, value: 40}"])
    run = replay_scenario(scenario, base, show_progress=False)
    steps = run.steps
    assert len(steps) >= 6
    for prev, nxt in zip(steps, steps[1:], strict=False):
        # exactly: the step that follows starts at start + duration, the sum SimPy forms,
        # or at a later arrival it idled until
        assert nxt.start_s >= prev.start_s + prev.duration_s
    back_to_back = [nxt.start_s == prev.start_s + prev.duration_s
                    for prev, nxt in zip(steps, steps[1:], strict=False)]
    assert sum(back_to_back) >= len(steps) // 2


class FakeTime:
    """perf_counter / thread_time / sleep on a clock that only sleeping (and a 1 us tick
    per reading, so a spin ends) moves."""

    def __init__(self) -> None:
        self.t_s = 100.0
        self.slept: list[float] = []

    def now(self) -> float:
        self.t_s += 1e-6
        return self.t_s

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t_s += seconds


def test_wall_clock_sleeps_then_spins_and_cpu_clock_skips_idle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import gpu_engine.clock as clock_module
    import gpu_engine.host as host_module

    fake = FakeTime()
    monkeypatch.setattr(clock_module.time, "perf_counter", fake.now)
    monkeypatch.setattr(clock_module.time, "sleep", fake.sleep)
    clock = WallClock()
    target = clock.now() + 0.05
    clock.wait_until(target)
    assert clock.now() >= target  # never early: the last stretch is spun
    assert fake.slept == [pytest.approx(0.048, abs=1e-5)]  # asleep until 2 ms before
    fake.slept.clear()
    spinner = WallClock(spin_s=math.inf)
    spinner.wait_until(spinner.now() + 0.01)
    assert fake.slept == []  # spins throughout: the core never idles
    monkeypatch.setattr(host_module.time, "thread_time", fake.now)
    cpu = ThreadCpuClock()
    before = cpu.now()
    cpu.wait_until(before + 100.0)  # no sleeping: the clock jumps
    assert fake.slept == [] and cpu.now() == pytest.approx(before + 100.0, abs=1e-5)
    cpu.wait_until(0.0)
    assert cpu.now() >= before + 100.0


@pytest.mark.parametrize("context", [0, 32])
def test_a_prefill_after_idling_is_timed_from_its_requests_arrival(
        context: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a replay's first step after idling starts at the arrival and admits it: the prompt
    is added after the idle wait, inside the timing; on a context (a cached prefix), the
    context is shaped after the admission, off the clock."""
    import calibrate.profile.shaping as shaping

    events: list[str] = []

    class Wait:
        def __init__(self, spin_s: float) -> None:
            pass

        def wait_until(self, _t_s: float) -> None:
            events.append("wait")

    def timer() -> float:
        events.append("timer")
        return 0.0

    add = shaping.PointRun._add
    monkeypatch.setattr(shaping, "WallClock", Wait)
    monkeypatch.setattr(shaping.PointRun, "_add",
                        lambda self, *a: (events.append("add"), add(self, *a))[1])
    settings_ = ProfileSettings(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=512)
    point = GridPoint("prefill", 16, context)
    run = PointRun(build_rig(settings_), point, settings_.steps_per_point, timer)
    _, _, logs = run.run(warmup=1, repeats=2, sample_s=0.02, max_group=4, idle_gap_s=0.05)
    per_step = ["wait", "timer", "add", "timer"] if not context else \
        ["wait", "timer", "add", "timer", "timer", "timer"]
    assert events == per_step * 3
    assert all(shape_matches(point, log) for log in logs)
    # back to back (no idle gap), the next repeat's request arrives during each timed step
    events.clear()
    run = PointRun(build_rig(settings_), GridPoint("prefill", 16), settings_.steps_per_point,
                   timer)
    run.run(warmup=1, repeats=2, sample_s=0.02, max_group=1, idle_gap_s=0.0)
    assert events == ["add"] + ["timer", "add", "timer"] * 3
