"""The run state machine: one enum, one table of allowed transitions, the backoff."""

from __future__ import annotations

import enum
import random


class RunStatus(enum.StrEnum):
    ACCEPTED = "accepted"
    PROCESSING = "processing"
    SUCCEEDED = "succeeded"
    FAILED_RETRYABLE = "failed_retryable"
    FAILED_PERMANENT = "failed_permanent"
    DEAD_LETTERED = "dead_lettered"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED_PERMANENT, RunStatus.DEAD_LETTERED})

# Every allowed (from, to) pair. Anything else is a bug and raises InvalidTransition.
TRANSITIONS: frozenset[tuple[RunStatus, RunStatus]] = frozenset(
    {
        (RunStatus.ACCEPTED, RunStatus.PROCESSING),  # a worker claims it
        (RunStatus.PROCESSING, RunStatus.SUCCEEDED),
        (RunStatus.PROCESSING, RunStatus.FAILED_RETRYABLE),
        (RunStatus.PROCESSING, RunStatus.DEAD_LETTERED),  # retry budget spent
        (RunStatus.PROCESSING, RunStatus.FAILED_PERMANENT),
        (RunStatus.PROCESSING, RunStatus.PROCESSING),  # lease expired, reclaimed
        (RunStatus.FAILED_RETRYABLE, RunStatus.PROCESSING),
        (RunStatus.ACCEPTED, RunStatus.DEAD_LETTERED),  # refused before running
        (RunStatus.DEAD_LETTERED, RunStatus.ACCEPTED),  # explicit replay
        (RunStatus.FAILED_PERMANENT, RunStatus.ACCEPTED),  # explicit replay
    }
)


class InvalidTransition(RuntimeError):
    """A state change outside TRANSITIONS: a bug, never written."""

    def __init__(self, run_id: str, current: str, target: str) -> None:
        super().__init__(f"run {run_id}: transition {current} -> {target} is not allowed")
        self.run_id, self.current, self.target = run_id, current, target


def check_transition(run_id: str, current: str, target: RunStatus) -> None:
    if (RunStatus(current), target) not in TRANSITIONS:
        raise InvalidTransition(run_id, current, target)


def backoff_seconds(
    retry_number: int, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Delay before retry number `retry_number` (1-based): exponential, capped, ±20 % jitter.

    Jitter spreads retries of runs that failed together, so a recovering
    dependency is not hit by all of them at the same instant.
    """
    exponential = base * 2.0 ** (retry_number - 1)
    jitter = (rng or random).uniform(0.8, 1.2)
    return float(min(cap, exponential * jitter))
