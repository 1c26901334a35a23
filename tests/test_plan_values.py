"""The step contract's values are NamedTuples (cheap to build and hash): what that must not
change. Shapes equal and hash as their fields' tuple (the latency memo keys), plans made
outside the builders are checked, decode runs stay equal only to themselves, everything
pickles, and an engine record still writes a shape as a JSON object."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from sim.core.decode_run import DecodeRun, FinishStep, RunSegment
from sim.core.plan import SeqWork, StepPlan, StepResult, StepShape, checked_plan

SHAPE = StepShape((64,), (16,), 3, 300, 120, 4, num_spec_decodes=1, num_spec_tokens=2)


def plan(**columns: tuple) -> StepPlan:
    base = dict(request_ids=(1, 2), num_new_tokens=(64, 1), context_tokens=(16, 99),
                block_tables=((0,), (1, 2)), is_prefill=(True, False),
                emits_token=(True, True), shape=SHAPE)
    return StepPlan(**{**base, **columns})


def test_a_shape_equals_and_hashes_as_its_fields() -> None:
    fields = tuple(getattr(SHAPE, f) for f in StepShape._fields)
    assert StepShape(*fields) == SHAPE and hash(SHAPE) == hash(fields)
    assert {SHAPE: 1}.get(StepShape(*fields)) == 1
    assert SHAPE._replace(num_decodes=4) != SHAPE and SHAPE.num_tokens == 64 + 3 + 2
    with pytest.raises(AttributeError):
        SHAPE.num_decodes = 5  # type: ignore[misc]


def test_checked_plan_refuses_columns_of_other_lengths() -> None:
    ok = plan()
    assert checked_plan(ok) is ok
    assert checked_plan(plan(num_spec_tokens=(0, 2))).num_spec_tokens == (0, 2)
    for column in ("num_new_tokens", "context_tokens", "block_tables", "is_prefill",
                   "emits_token"):
        with pytest.raises(ValueError, match="one entry per request"):
            checked_plan(plan(**{column: getattr(ok, column)[:1]}))
    with pytest.raises(ValueError, match="num_spec_tokens"):
        checked_plan(plan(num_spec_tokens=(1,)))


def test_a_plans_seqs_are_its_columns_row_by_row() -> None:
    assert list(plan().seqs) == [SeqWork(1, 64, 16, (0,), True, True, 0),
                                 SeqWork(2, 1, 99, (1, 2), False, True, 0)]


def test_decode_run_values_are_equal_only_to_themselves() -> None:
    """Two runs of equal fields are different runs; == must not compare their arrays
    (a tuple's == would, and numpy refuses the truth of a many-element comparison)."""
    def run() -> DecodeRun:
        return DecodeRun(3, SHAPE, np.array([5, 6, 7]), 0, True, 16, False)
    a, b = run(), run()
    finish = FinishStep(plan(), [], 7, 112, 2)
    for x, y in ((a, b), (finish, FinishStep(plan(), [], 7, 112, 2)),
                 (RunSegment(0, a, finish), RunSegment(0, a, finish))):
        assert (x == x, x != x, x == y, x != y) == (True, False, False, True)
        assert hash(x) == object.__hash__(x) and len({x, y}) == 2
        assert y not in [x]


def test_the_values_pickle() -> None:
    """Experiments hand results between processes."""
    run = DecodeRun(3, SHAPE, np.array([5, 6, 7]), 1, False, 16, True, ((2, 1, 50, 50, 1),))
    back = pickle.loads(pickle.dumps(run))
    assert type(back) is DecodeRun and back.shape == SHAPE and back.segments == run.segments
    assert back.kv_blocks_used.tolist() == [5, 6, 7]
    for value in (SHAPE, plan(), StepResult((3,), (1,)), SeqWork(1, 1, 0, (), False, True)):
        assert pickle.loads(pickle.dumps(value)) == value


def test_an_engine_record_writes_a_shape_as_an_object(tmp_path: Path) -> None:
    """The record file's format is unchanged: a NamedTuple would json-dump as a bare list."""
    pytest.importorskip("torch")
    from calibrate.gpu.plain_replay import EngineRecord, read_record, write_record
    from gpu_engine.engine import StepLog

    step = StepLog(0.5, 0.25, 0.2, 0.1, SHAPE, 2, 48, (1, 3), 4)
    path = tmp_path / "record.json"
    write_record(EngineRecord((step,), {"request_id": [1]}, {"device": "cpu"}), path)
    shape = json.loads(path.read_text())["steps"][0]["shape"]
    assert shape == {"prefill_chunk_tokens": [64], "prefill_context_tokens": [16],
                     "num_decodes": 3, "decode_context_sum": 300, "decode_context_max": 120,
                     "padded_batch": 4, "swap_out_tokens": 0, "swap_in_tokens": 0,
                     "num_spec_decodes": 1, "num_spec_tokens": 2, "spec_depth": 0,
                     "spec_context_sum": 0}
    assert list(shape) == list(StepShape._fields)
    assert read_record(path).steps == (step,)
