"""Outcomes: an attempt's result recorded where the lease is still the caller's,
with the callback it owes and, on success, the events the agent emitted; the
same path for every outcome on each engine.

The engine's `Db.finish_runs` writes the runs and attempts: SQLite row by row,
PostgreSQL a whole batch in one statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentbox.jsontext import encoder
from agentbox.runs import InvalidTransition, RunStatus, check_transition
from agentbox.store.ingest import store_emitted
from agentbox.store.outbox import queue_callback
from agentbox.store.records import Callback, Finish, Outcome, Transition
from agentbox.store.subscriptions import change_agent_subscriptions
from agentbox.store.writer import Batch, Db, answer

# A result as the store keeps it: compact, keys sorted (json.dumps's options, made once).
_RESULT_JSON = encoder(separators=(",", ":"), sort_keys=True)


class FinishRun(Finish):
    """The operation: record one attempt's outcome. A batch's run together
    (`finish_batch`)."""

    __slots__ = ()

    def __call__(self, db: Db, state: Batch) -> Transition | None:
        transition: Transition | None = answer(finish_batch(db, state, [self])[0])
        return transition


def finish(run_id: str, owner: str, attempt: int, outcome: Outcome, *, now: float,
           notify_due: float) -> FinishRun:
    """The operation for an outcome, its target state checked first (a target the
    state machine forbids raises here, before anything is queued)."""
    target = RunStatus(outcome.status)
    if target is RunStatus.PROCESSING:  # only a lease reclaim stays processing
        raise InvalidTransition(run_id, RunStatus.PROCESSING, target)
    check_transition(run_id, RunStatus.PROCESSING, target)
    # A retry with no time given is due at once, never stranded without one.
    next_attempt_at = (outcome.next_attempt_at or now
                       if target is RunStatus.FAILED_RETRYABLE else None)
    result_json = None if outcome.result is None else _RESULT_JSON(outcome.result)
    return FinishRun(run_id=run_id, owner=owner, attempt=attempt, target=target,
                     next_attempt_at=next_attempt_at, result_json=result_json,
                     outcome=outcome, now=now, notify_due=notify_due)


def finish_batch(db: Db, state: Batch, items: Sequence[Finish]) -> list[tuple[bool, Any]]:
    """Per item (True, its Transition), or (True, None) when its lease was lost
    (another holder owns the run now)."""
    answers: list[tuple[bool, Any]] = []
    for item, landed in zip(items, db.finish_runs(items), strict=True):
        if landed is None:
            answers.append((True, None))
            continue
        if item.target.terminal:
            state.active -= 1
        else:
            state.runs_ready = True
        notify = queue_callback(db, state, Callback(
            url=landed.callback_url, run_id=item.run_id, status=item.target.value,
            attempt=item.attempt, event_id=landed.event_id, now=item.now, due=item.notify_due,
            result=item.outcome.result, error_code=item.outcome.error_code))
        spawned: list[Transition] = []
        emitted: list[Any] = []
        if item.target is RunStatus.SUCCEEDED and item.outcome.subscriptions:
            # Before its emitted events are routed: an agent that unsubscribed from
            # a type right before emitting it does not receive it.
            change_agent_subscriptions(db, state, agent=landed.agent, run_id=item.run_id,
                                       changes=item.outcome.subscriptions, now=item.now)
        if item.target is RunStatus.SUCCEEDED and item.outcome.emitted:
            spawned, emitted = store_emitted(db, state, item.outcome.emitted,
                                             parent_pk=landed.event_pk, now=item.now,
                                             notify_due=item.now)
        answers.append((True, Transition(
            run_id=item.run_id, status=item.target.value, attempt=item.attempt,
            event_id=landed.event_id, event_type=landed.event_type, source=landed.source,
            agent=landed.agent, error_code=item.outcome.error_code, notify=notify,
            spawned=tuple(spawned), emitted=tuple(emitted))))
    return answers
