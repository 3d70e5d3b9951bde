"""Random interleavings of every operation against a model (every engine)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from agentbox.runs import TERMINAL, RunStatus
from agentbox.store import (
    AdmissionRefused,
    NotReplayable,
    Outcome,
    RunNotFound,
)
from tests.store.conftest import (
    ENGINES,
    engine_params,
    prepare_engine,
)
from tests.store.support import (
    DEAD,
    LEASE,
    MAX_ATTEMPTS,
    PERMANENT,
    STATUSES,
    SUCCEEDED,
    T0,
    T,
    ingest,
    retryable,
)

# -- the state machine -------------------------------------------------------------------

KEYS = ["k0", "k1", "k2"]
OWNERS = ["w1", "w2"]
MACHINE_PENDING = 4  # small, so that admission refusals happen
MACHINE_TTL = 40.0  # short, so that keys expire within an example
RETRY_DELAY = 1.5  # between two clock steps, so that an early retry shows
WAITS = st.sampled_from([0.0, 1.0, 5.0, LEASE, 30.0])  # the clock moves before most rules


@dataclass
class ModelRun:
    status: RunStatus = RunStatus.ACCEPTED
    attempt: int = 0
    base: int = 0  # attempt count at the last replay
    owner: str | None = None
    lease_until: float | None = None
    next_at: float | None = None


class StoreMachine(RuleBasedStateMachine):
    """Random interleavings against a model of what the store must hold."""

    engine_name = "sqlite"  # set per engine by test_store_state_machine

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="agentbox-store-"))
        self.engine = ENGINES[self.engine_name](self.directory)
        self.runner = asyncio.Runner()
        self.store = self.engine.new_store()
        self.aio(self.store.open())
        self.now = T0
        self.keys: dict[str, tuple[list[str], float]] = {}  # key -> (run ids, expires at)
        self.runs: dict[str, ModelRun] = {}
        self.stale: list[tuple[str, str, int]] = []  # (run, owner, attempt) no longer current

    def aio(self, awaitable: Awaitable[T]) -> T:
        return self.runner.run(awaitable)  # type: ignore[arg-type]

    def teardown(self) -> None:
        try:
            self.aio(self.store.close())
        finally:
            self.runner.close()
            self.engine.dispose()
            shutil.rmtree(self.directory, ignore_errors=True)

    def active(self) -> int:
        return sum(r.status not in TERMINAL for r in self.runs.values())

    def next_due(self) -> float | None:
        times = [r.next_at for r in self.runs.values()
                 if r.status in (RunStatus.ACCEPTED, RunStatus.FAILED_RETRYABLE)]
        times += [r.lease_until for r in self.runs.values() if r.status is RunStatus.PROCESSING]
        due = [t for t in times if t is not None]
        return min(due) if due else None

    def ids_with(self, *statuses: RunStatus) -> list[str]:
        return sorted(i for i, r in self.runs.items() if r.status in statuses)

    # -- rules ---------------------------------------------------------------------------

    @initialize()
    def some_work(self) -> None:
        for key in KEYS[:2]:  # so that every example has runs to claim from its first step
            self.ingest(0.0, key, 1)

    @rule(wait=WAITS, key=st.sampled_from(KEYS), agents=st.integers(1, 2))
    def ingest(self, wait: float, key: str, agents: int) -> None:
        self.now += wait
        names = [f"agent{i}" for i in range(agents)]
        known = self.keys.get(key)
        live = known is not None and known[1] > self.now
        active = self.active()
        try:
            result = self.aio(ingest(self.store, key, agents=names, now=self.now,
                                     ttl=MACHINE_TTL, max_pending=MACHINE_PENDING))
        except AdmissionRefused as refused:
            assert not live and active + agents > MACHINE_PENDING
            assert (refused.pending, refused.limit) == (active, MACHINE_PENDING)
            return
        if live:
            assert known is not None and result.duplicate
            assert [r.run_id for r in result.runs] == known[0]
            assert [r.status for r in result.runs] == [self.runs[i].status for i in known[0]]
            return
        assert not result.duplicate and active + agents <= MACHINE_PENDING
        assert [(r.agent, r.status) for r in result.runs] == [(n, "accepted") for n in names]
        ids = [r.run_id for r in result.runs]
        assert self.runs.keys().isdisjoint(ids)
        for run_id in ids:
            self.runs[run_id] = ModelRun(next_at=self.now)
        self.keys[key] = (ids, self.now + MACHINE_TTL)

    @rule(wait=WAITS, owner=st.sampled_from(OWNERS), limit=st.integers(1, 4),
          max_attempts=st.integers(1, MAX_ATTEMPTS))
    def claim(self, wait: float, owner: str, limit: int, max_attempts: int) -> None:
        self.now += wait
        expired = {i for i in self.ids_with(RunStatus.PROCESSING)
                   if self.runs[i].lease_until is not None
                   and self.runs[i].lease_until <= self.now}  # type: ignore[operator]
        waiting = {i for i in self.ids_with(RunStatus.ACCEPTED, RunStatus.FAILED_RETRYABLE)
                   if self.runs[i].next_at <= self.now}  # type: ignore[operator]
        result = self.aio(self.store.claim(owner, limit, self.now, LEASE, max_attempts))
        dead = [t for t in result.transitions if t.status == "dead_lettered"]
        handled = [c.run_id for c in result.claimed] + [t.run_id for t in dead]
        assert len(handled) == len(set(handled)) and len(result.claimed) <= limit
        # Progress: as many due runs as asked for are claimed or dead-lettered.
        assert len(handled) >= min(limit, len(expired) + len(waiting))
        for t in dead:
            run = self.runs[t.run_id]
            assert t.run_id in expired and run.attempt - run.base >= max_attempts
            assert t.error_code == "lease_expired"
            self.stale.append((t.run_id, run.owner or "", run.attempt))
            run.status, run.owner, run.lease_until = RunStatus.DEAD_LETTERED, None, None
        for c in result.claimed:
            run = self.runs[c.run_id]
            assert run.status not in TERMINAL, f"claimed a {run.status} run"
            assert c.run_id in expired | waiting
            if c.run_id in expired:
                assert run.attempt - run.base < max_attempts
                self.stale.append((c.run_id, run.owner or "", run.attempt))
            assert (c.attempt, c.round_attempt) == (run.attempt + 1, run.attempt + 1 - run.base)
            run.status, run.attempt = RunStatus.PROCESSING, c.attempt
            run.owner, run.lease_until, run.next_at = owner, self.now + LEASE, None
        if len(result.claimed) < limit:
            assert result.next_due_at == self.next_due()

    @precondition(lambda self: self.ids_with(RunStatus.PROCESSING))
    @rule(pick=st.integers(0, 1000), kind=st.sampled_from(
        ["succeeded", "failed_retryable", "failed_permanent", "dead_lettered"]))
    def finish(self, pick: int, kind: str) -> None:
        processing = self.ids_with(RunStatus.PROCESSING)
        run_id = processing[pick % len(processing)]
        run = self.runs[run_id]
        assert run.owner is not None
        outcome = {
            "succeeded": Outcome(RunStatus.SUCCEEDED, result={"pick": pick}),
            "failed_retryable": retryable(self.now + RETRY_DELAY),
            "failed_permanent": PERMANENT,
            "dead_lettered": DEAD,
        }[kind]
        transition = self.aio(self.store.finish(run_id, run.owner, run.attempt, outcome,
                                                self.now))
        assert transition is not None
        assert (transition.status, transition.attempt) == (kind, run.attempt)
        self.stale.append((run_id, run.owner, run.attempt))
        run.status, run.owner, run.lease_until = RunStatus(kind), None, None
        run.next_at = outcome.next_attempt_at

    @precondition(lambda self: self.stale or self.ids_with(RunStatus.PROCESSING))
    @rule(pick=st.integers(0, 1000))
    def finish_without_the_lease(self, pick: int) -> None:
        processing = self.ids_with(RunStatus.PROCESSING)
        candidates = [(i, "intruder", self.runs[i].attempt) for i in processing]
        # Old attempts of runs now running again are the ones a store could mistake.
        candidates += [s for s in self.stale if s[0] in processing] or self.stale
        run_id, owner, attempt = candidates[pick % len(candidates)]
        assert self.aio(self.store.finish(run_id, owner, attempt, SUCCEEDED, self.now)) is None


    @precondition(lambda self: self.ids_with(RunStatus.DEAD_LETTERED, RunStatus.FAILED_PERMANENT))
    @rule(pick=st.integers(0, 1000))
    def replay(self, pick: int) -> None:
        candidates = self.ids_with(RunStatus.DEAD_LETTERED, RunStatus.FAILED_PERMANENT)
        run_id = candidates[pick % len(candidates)]
        transition = self.aio(self.store.replay(run_id, self.now))
        assert (transition.run_id, transition.status) == (run_id, "accepted")
        run = self.runs[run_id]
        run.status, run.base, run.next_at = RunStatus.ACCEPTED, run.attempt, self.now

    @rule(pick=st.integers(0, 1000))
    def replay_refused(self, pick: int) -> None:
        candidates = [*self.ids_with(RunStatus.ACCEPTED, RunStatus.PROCESSING,
                                     RunStatus.FAILED_RETRYABLE, RunStatus.SUCCEEDED),
                      "run_missing"]
        run_id = candidates[pick % len(candidates)]
        expected = RunNotFound if run_id == "run_missing" else NotReplayable
        with pytest.raises(expected):
            self.aio(self.store.replay(run_id, self.now))

    @rule(wait=st.sampled_from([0.0, 1.0, 30.0, 60.0]))
    def prune(self, wait: float) -> None:
        self.now += wait
        expired = [k for k, (_, expires) in self.keys.items() if expires <= self.now]
        assert self.aio(self.store.prune_idempotency_keys(self.now, 1000)) == len(expired)
        for key in expired:
            del self.keys[key]

    @rule(wait=WAITS, owner=st.sampled_from([*OWNERS, "*"]))
    def release(self, wait: float, owner: str) -> None:
        self.now += wait
        held = [self.runs[i] for i in self.ids_with(RunStatus.PROCESSING)
                if owner == "*" or self.runs[i].owner == owner]
        assert self.aio(self.store.release_leases(owner, self.now)) == len(held)
        for run in held:
            run.lease_until = self.now

    @rule(owner=st.sampled_from(OWNERS), seconds=st.sampled_from([LEASE, 3 * LEASE]),
          stale=st.booleans())
    def extend(self, owner: str, seconds: float, stale: bool) -> None:
        processing = self.ids_with(RunStatus.PROCESSING)  # other owners' runs are ignored
        # `stale`: an earlier attempt's holder asks (its run was claimed again since).
        attempts = [(run_id, self.runs[run_id].attempt - stale) for run_id in processing]
        held = self.aio(self.store.extend_leases(owner, attempts, self.now + seconds))
        renewed = [] if stale else [run_id for run_id in processing
                                    if self.runs[run_id].owner == owner]
        assert held == sorted(renewed)
        for run_id in renewed:
            self.runs[run_id].lease_until = self.now + seconds

    @rule()
    def reopen(self) -> None:
        self.aio(self.store.close())
        self.store = self.engine.new_store()
        self.aio(self.store.open())

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def runs_match_the_model(self) -> None:
        views = self.aio(self.store.list_runs(None, 10_000))
        assert {v["run_id"] for v in views} == set(self.runs)
        for view in views:
            run = self.runs[view["run_id"]]
            assert view["status"] in STATUSES
            assert (view["status"], view["attempt"]) == (run.status.value, run.attempt)
            assert view["retry_count"] == max(run.attempt - 1, 0)

    @invariant()
    def only_processing_runs_hold_a_lease(self) -> None:
        for run_id, (status, owner, until) in self.engine.leases().items():
            assert (status == "processing") == (owner is not None), (run_id, status, owner)
            if status == "processing":
                assert (owner, until) == (self.runs[run_id].owner, self.runs[run_id].lease_until)

    @invariant()
    def stats_match_the_model(self) -> None:
        stats = self.aio(self.store.stats())
        expected = dict.fromkeys(STATUSES, 0)
        for run in self.runs.values():
            expected[run.status.value] += 1
        assert stats["runs"] == expected and stats["active"] == self.active()

    @invariant()
    def next_due_matches_the_model(self) -> None:
        assert self.aio(self.store.next_due_at()) == self.next_due()


@pytest.mark.parametrize("engine_name", engine_params())
def test_store_state_machine(engine_name: str, request: pytest.FixtureRequest) -> None:
    prepare_engine(request, engine_name)
    machine = type(f"StoreMachine_{engine_name}", (StoreMachine,), {"engine_name": engine_name})
    run_state_machine_as_test(
        machine,
        # Every step commits: on PostgreSQL (a network round trip and a WAL flush
        # each) fewer examples keep the suite's time in bounds.
        settings=settings(max_examples=30 if engine_name == "sqlite" else 10,
                          stateful_step_count=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )

