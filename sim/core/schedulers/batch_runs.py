"""Runs of plain decode steps over the running set's columns (sim.core.decode_run).

describe_run() says what the next steps are when they are plain decodes of the
running set (RunningBatch.plain_decodes), with the segments finishers cut them
into; apply_run() applies steps of it as step by step would have: the same
blocks taken in the same order (prefix names included), the finishers retired
in plan order at their step's end.

Step s (from 0) gives row i a block when its context c_i + s is a multiple of the
block size, i.e. when s = (-c_i) mod block size: its phase, from its first step to
the step it finishes in.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import accumulate

import numpy as np

from sim.core.decode_run import DecodeRun, FinishStep, RunSegment, constant, decode_shape
from sim.core.kv import KVManager, PagedBlockManager
from sim.core.plan import StepPlan, StepShape
from sim.core.request import Request
from sim.core.schedulers.running_batch import RunningBatch
from sim.core.schedulers.running_columns import COMPUTED, DONE, TARGET


def describe_run(batch: RunningBatch, kv: KVManager, paged: bool,
                 padded_of: tuple[int, ...], num_waiting: int, kv_blocked: bool,
                 max_steps: int) -> DecodeRun | None:
    """The next plain-decode steps: across finishes while nobody waits, else up to the first
    finisher's step; cut where the free pool (frees aside) cannot cover the blocks.

    In plain Python over the rows (a few, mostly), numpy only where the pool runs short. The
    run's kv_blocks_used is left empty: the applied parts (apply_run) carry theirs.
    `padded_of[n]`: the batch n decodes run as (padded to a CUDA graph's size, or n), a
    table lookup for the ~20 segments a run describes."""
    n = len(batch.rids)
    state = batch.state
    # with requests waiting the run ends at the first finisher's step: when someone finishes
    # in the next step (a saturated pool, almost every step) there is no run, told by one
    # numpy pass before the four columns come out as lists
    if num_waiting and int((state[TARGET, :n] - state[DONE, :n]).min()) < 2:
        return None
    # one read of the columns computed, known, done, target (in this order)
    contexts, _, done, target = state[COMPUTED:TARGET + 1, :n].tolist()
    finish = [t - d - 1 for t, d in zip(target, done, strict=True)]  # the step each ends in
    first_out = min(finish)
    steps = min((first_out if num_waiting else max(finish)) + 1, max_steps)
    if steps < 2:
        return None
    bs = batch.block_size
    if paged:
        # row i takes a block at each step s <= its last with context c_i + s a multiple of
        # bs: the multiples in [c_i, c_i + last]
        last = steps - 1
        needed = 0
        for context, f in zip(contexts, finish, strict=True):
            needed += (context + (f if f < last else last)) // bs - (context - 1) // bs
        if needed > kv.num_free_blocks:  # cut at the last step the pool covers
            taken = np.cumsum(_blocks_taken(np.array(contexts, dtype=np.int64),
                                            np.array(finish, dtype=np.int64), steps, bs))
            steps = int(taken.searchsorted(kv.num_free_blocks, side="right"))
            if steps < 2:
                return None
    first = StepShape((), (), n, sum(contexts), max(contexts), padded_of[n])
    segments: list[tuple[int, int, int, int, int]] = []
    if first_out < steps - 1:  # some finish before the last step: a segment after each
        # the rows left after a finishers' step f are those finishing later: walk the rows
        # latest finisher first, and open a segment where the finish step changes
        rows = sorted(zip(finish, contexts, strict=True), reverse=True)
        after: list[tuple[int, int, int, int]] = []  # (first step, rows, context sum, max)
        left = total = top = 0
        for i, (f, context) in enumerate(rows):
            if f < steps - 1 and left and f != rows[i - 1][0]:
                after.append((f + 1, left, total, top))
            left, total = left + 1, total + context
            if context > top:
                top = context
        segments = [(s, m, total + s * m, top + s, padded_of[m])
                    for s, m, total, top in reversed(after)]
    return DecodeRun(steps, first, np.empty(0, dtype=np.int64), num_waiting,
                     not num_waiting, bs, kv_blocked, tuple(segments))


def _blocks_taken(computed: np.ndarray, finish: np.ndarray, steps: int, bs: int
                  ) -> np.ndarray:
    """Blocks the rows take in each of `steps` plain decodes, a row leaving after its
    finish step: row i takes one at steps s = phase_i + j * bs (j = 0, 1, ...) up to its
    finish step, phase_i = (-computed_i) mod bs. Counted as cycle x phase in one histogram
    of how many blocks each row takes."""
    phase = (-computed) % bs
    cycles = -(-steps // bs)
    blocks = (np.minimum(finish, steps - 1) - phase) // bs + 1  # 0 if it leaves before
    hist = np.bincount(blocks * bs + phase, minlength=(cycles + 1) * bs)
    # rows still taking at cycle j, by phase: those that take more than j blocks
    taking = hist.reshape(cycles + 1, bs)[::-1].cumsum(axis=0)[::-1]
    return taking[1:].ravel()[:steps]


def _pieces(run: DecodeRun, begin: int, end: int
            ) -> Iterator[tuple[int, int, int, StepShape]]:
    """The parts of `run`'s segments within steps [begin, end): (first step, the step after
    the part, the segment's end, the first step's shape); segments before
    `begin` are applied already, those from `end` on run later."""
    for start, length, shape in run.segment_lengths():
        if start >= end:
            break
        seg_end = start + length
        if seg_end <= begin:
            continue
        first = start if start > begin else begin
        stop = seg_end if seg_end < end else end
        if first > start:
            shape = decode_shape(shape, first - start)
        yield first, stop, seg_end, shape


def apply_run(batch: RunningBatch, run: DecodeRun, begin: int, end: int,
              step_end_s: Sequence[float], kv: KVManager, paged: bool,
              naming: PagedBlockManager | None,
              in_flight: dict[int, Request]) -> list[RunSegment]:
    """Apply steps [begin, end) of `run` (the steps before `begin` applied already):
    segment by segment, the same block calls in the same order as step by step (each
    step's new blocks, then the blocks it filled named), then the finishers of a
    segment's last step retired (their blocks freed) at its end, `step_end_s[s]`."""
    out: list[RunSegment] = []
    for first, stop, seg_end, shape in _pieces(run, begin, end):
        k = stop - first
        n = len(batch.rids)
        state = batch.state
        contexts = state[COMPUTED, :n].tolist()
        used = _take_blocks(batch, contexts, k, kv, paged, naming)
        # the whole rows, columns past the last sequence's included (scratch, written whole
        # on admission): a contiguous block costs numpy a third of a strided one
        state[COMPUTED:DONE + 1] += k
        # only a segment's last step has finishers (an arrival may cut it before): those
        # done now, found in numpy (a batch is ~40-250 rows)
        finishers = (state[DONE, :n] == state[TARGET, :n]).nonzero()[0].tolist() \
            if stop == seg_end else None
        if not finishers:
            out.append(RunSegment(first, _part(run, k, shape, used), None))
            continue
        plan = StepPlan(tuple(batch.rids), (1,) * n, tuple(map((k - 1).__add__, contexts)),
                        tuple(batch.tables), (False,) * n, (True,) * n,
                        decode_shape(shape, k - 1))
        held = int(used[-1]) * batch.block_size
        finished = batch.retire(finishers, step_end_s[stop - 1], kv, in_flight)
        out.append(RunSegment(first, _part(run, k - 1, shape, used[:k - 1]),
                              FinishStep(plan, finished, kv.num_used_blocks, held,
                                         len(batch.rids))))
    return out


def _take_blocks(batch: RunningBatch, contexts: list[int], steps: int, kv: KVManager,
                 paged: bool, naming: PagedBlockManager | None, ahead: int = 0) -> np.ndarray:
    """Give the rows (computed tokens `contexts`) their blocks for the next `steps` plain
    decodes (nobody leaves in between); returns the blocks in use while each step runs.

    Step s grows the rows of phase s % bs, in row order: without names to give between
    two steps every row's blocks come in one call, dealt round-robin over the rows in
    phase order (every row once per whole cycle of bs steps, then those of phases < rest).

    `ahead` (async scheduling, apply_run_ahead): `contexts` are the columns' computed
    tokens plus one (each step's blocks are those of the step after it, taken as it is
    planned while this one runs), and a step names the blocks of the rows it grows (those
    its predecessor filled), after growing them.
    """
    bs = batch.block_size
    used0 = kv.num_used_blocks
    cycles, rest = divmod(steps, bs)
    if len(contexts) > 32:  # numpy's fixed cost is less than the loops'
        phase = (-(batch.state[COMPUTED, :len(contexts)] + ahead)) % bs
        if not cycles and int(np.minimum.reduce(phase)) >= rest + (naming is not None):
            return constant(steps, used0)
        per_phase = np.bincount(phase, minlength=bs).tolist()
        order = phase.argsort(kind="stable").tolist()
    else:
        phases = [-c % bs for c in contexts]
        # nobody crosses a block boundary (nor, with names, fills a block)
        if not cycles and min(phases, default=bs) >= rest + (naming is not None):
            return constant(steps, used0)
        per_phase = [0] * bs
        for p in phases:
            per_phase[p] += 1
        order = sorted(range(len(phases)), key=phases.__getitem__)
    if naming is None:
        taking = sum(per_phase[:rest])  # rows taking one more block than the rest
        rows = order if cycles else order[:taking]
        rids, tables = batch.rids, batch.tables
        grown = kv.append_blocks([rids[i] for i in rows], len(contexts) * cycles + taking)
        assert grown is not None, "a decode run took more blocks than were free"
        for i, table in zip(rows, grown, strict=True):
            tables[i] = table
    else:
        _take_naming(batch, contexts, steps, kv, naming, per_phase, order, ahead)
    if not paged:
        return constant(steps, used0)
    if steps > 64:  # a long run: the cycle repeated in C
        return np.resize(np.array(per_phase), steps).cumsum() + used0
    taken = per_phase * cycles + per_phase[:rest]
    taken[0] += used0
    return np.fromiter(accumulate(taken), np.int64, steps)


def _take_naming(batch: RunningBatch, contexts: list[int], steps: int, kv: KVManager,
                 naming: PagedBlockManager, per_phase: list[int], order: list[int],
                 ahead: int = 0) -> None:
    """Step by step with a prefix cache: each step's new blocks, then the blocks its
    tokens fill named (a name given may change which block a later take evicts).
    `ahead`: the blocks named are those of the rows just grown (see _take_blocks)."""
    rids, tables, bs = batch.rids, batch.tables, batch.block_size
    rows, at = [], 0
    for count in per_phase:
        members = order[at:at + count]
        rows.append((members, [rids[i] for i in members]))
        at += count
    for s in range(steps):
        members, member_rids = rows[s % bs]
        if members:
            grown = kv.append_blocks(member_rids, len(member_rids))
            assert grown is not None, "a decode run took more blocks than were free"
            for i, table in zip(members, grown, strict=True):
                tables[i] = table
        if not ahead:
            members, member_rids = rows[(s + 1) % bs]
        for i, rid in zip(members, member_rids, strict=True):
            naming.cache_computed(rid, contexts[i] + s + 1 - ahead)


def _part(run: DecodeRun, steps: int, shape: StepShape, used: np.ndarray) -> DecodeRun:
    """`steps` steps of `run` from one with `shape`, nobody finishing, `used` blocks."""
    return DecodeRun(steps, shape, used, run.num_waiting, run.stops_at_arrival, run.block_size,
                     run.kv_blocked)


def apply_run_ahead(batch: RunningBatch, run: DecodeRun, begin: int, end: int,
                    finish_s: Sequence[float], kv: KVManager, paged: bool,
                    naming: PagedBlockManager | None,
                    in_flight: dict[int, Request]) -> list[RunSegment]:
    """apply_run under async scheduling (vLLM's AsyncScheduler, one plan ahead): step s of
    `run` (its step 0 the plan outstanding when it began) is applied after the plan of
    step s + 1 was made, as the world makes it while step s runs. So applying step s
    first grows the tables of the rows step s + 1 runs (a row finishing in step s is
    skipped), names the blocks step s filled for them, then names those of its finishers
    and frees them (apply_behind's order). The parts' kv_blocks_used have one entry more
    than their steps: the blocks in use while each step runs, then after the last one's
    apply (the next plan's blocks taken, its finishers' freed), which is what the
    recorders read as a step's blocks used under async scheduling."""
    out: list[RunSegment] = []
    bs = batch.block_size
    for first, stop, seg_end, shape in _pieces(run, begin, end):
        k = stop - first
        n = len(batch.rids)
        state = batch.state
        used0 = kv.num_used_blocks
        contexts = state[COMPUTED, :n].tolist()
        finishers: list[int] = []
        if stop == seg_end:  # only a segment's last step has finishers
            finishers = (state[TARGET, :n] - state[DONE, :n] == k).nonzero()[0].tolist()
        whole = k if not finishers else k - 1  # steps whose successor runs every row
        if whole:
            used = _take_blocks(batch, [c + 1 for c in contexts], whole, kv, paged, naming,
                                ahead=1)
        else:
            used = np.empty(0, dtype=np.int64)
        planned = tuple(batch.tables) if finishers else ()  # the finishers' step's, as planned
        if finishers:  # the last step: the survivors' next blocks, names, then the finishers'
            gone = set(finishers)
            last = k  # tokens the rows have computed once the last step is applied, less c
            rids, tables = batch.rids, batch.tables
            grow = [i for i in range(n) if i not in gone and not (contexts[i] + last) % bs]
            if grow:
                grown = kv.append_blocks([rids[i] for i in grow], len(grow))
                assert grown is not None, "a decode run took more blocks than were free"
                for i, table in zip(grow, grown, strict=True):
                    tables[i] = table
            if naming is not None:
                for i in grow:
                    naming.cache_computed(rids[i], contexts[i] + last)
                for i in finishers:
                    naming.cache_computed(rids[i], contexts[i] + last)
        state[COMPUTED:DONE + 1] += k
        blocks = np.empty(k + 1 - bool(finishers), dtype=np.int64)
        blocks[0] = used0
        blocks[1:] = used
        if not finishers:
            out.append(RunSegment(first, _part(run, k, shape, blocks), None))
            continue
        plan = StepPlan(tuple(batch.rids), (1,) * n, tuple(map((k - 1).__add__, contexts)),
                        planned, (False,) * n, (True,) * n, decode_shape(shape, k - 1))
        held = int(blocks[-1]) * bs
        finished = batch.retire(finishers, finish_s[stop - 1], kv, in_flight)
        out.append(RunSegment(first, _part(run, k - 1, shape, blocks), FinishStep(
            plan, finished, kv.num_used_blocks, held, len(batch.rids))))
    return out
