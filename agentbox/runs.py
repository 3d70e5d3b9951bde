"""The run state machine: one enum, one table of allowed transitions, the backoff."""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Callable

from agentbox import portable


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
    try:
        allowed = (RunStatus(current), target) in TRANSITIONS
    except ValueError:  # a status that is not a RunStatus at all
        allowed = False
    if not allowed:
        raise InvalidTransition(run_id, current, target)


def backoff_seconds(
    retry_number: int, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Delay before retry number `retry_number` (1-based): exponential, capped, ±20 % jitter.

    Jitter spreads retries of runs that failed together, so a recovering
    dependency is not hit by all of them at the same instant.
    """
    rng = rng or random.Random()
    # The exponent is bounded so a huge retry number cannot overflow a float.
    exponential = base * 2.0 ** min(retry_number - 1, 64)
    if exponential * 1.2 >= cap:
        return cap * rng.uniform(0.8, 1.0)  # jitter below the cap, never above it
    return exponential * rng.uniform(0.8, 1.2)


class SteadyClock:
    """Unix time that a step of the system clock does not jump.

    It advances with a clock that never steps (time since boot, suspend
    included) and slews towards the wall clock by at most SLEW seconds per
    second: when NTP or a person sets the clock an hour forward or back, leases
    do not expire early and retries do not fire early or an hour late; the hour
    is caught up over ten. Times stored in the database stay Unix times, so a
    restart (or another instance) reads them right. Signature windows compare
    the sender's clock with the wall clock itself: the receiver checks them
    against `time.time`, not this.
    """

    SLEW = 0.1

    def __init__(self, wall: Callable[[], float] = time.time,
                 steady: Callable[[], float] = portable.since_boot) -> None:
        self._wall, self._steady = wall, steady
        self._tick = steady()
        self._now = wall()

    def __call__(self) -> float:
        tick = self._steady()
        elapsed = max(0.0, tick - self._tick)
        self._tick = tick
        step = self._wall() - (self._now + elapsed)  # how far the wall clock is off
        self._now += elapsed + max(-elapsed * self.SLEW, min(elapsed * self.SLEW, step))
        return self._now
