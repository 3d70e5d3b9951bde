"""The run state machine (agentbox.runs): states, the transition table, backoff."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentbox.runs import (
    TERMINAL,
    TRANSITIONS,
    InvalidTransition,
    RunStatus,
    backoff_seconds,
    check_transition,
)

# DESIGN.md, "Run states", written out by hand: one (from, to) per table row
# (the replay row names two "from" states).
DESIGN_TABLE = {
    ("accepted", "processing"),
    ("processing", "succeeded"),
    ("processing", "failed_retryable"),
    ("processing", "dead_lettered"),
    ("processing", "failed_permanent"),
    ("processing", "processing"),
    ("failed_retryable", "processing"),
    ("accepted", "dead_lettered"),
    ("dead_lettered", "accepted"),
    ("failed_permanent", "accepted"),
}
DESIGN_TERMINAL = {"succeeded", "failed_permanent", "dead_lettered"}
ALL_PAIRS = list(itertools.product(RunStatus, RunStatus))


def test_status_values_are_the_wire_names():
    assert {s.value for s in RunStatus} == {
        "accepted", "processing", "succeeded", "failed_retryable", "failed_permanent",
        "dead_lettered",
    }
    # StrEnum: a status compares and serialises as its wire string.
    assert RunStatus.FAILED_RETRYABLE == "failed_retryable"
    assert str(RunStatus.DEAD_LETTERED) == "dead_lettered"
    assert RunStatus("processing") is RunStatus.PROCESSING


def test_transition_table_matches_design_exactly():
    assert {(a.value, b.value) for a, b in TRANSITIONS} == DESIGN_TABLE
    assert len(TRANSITIONS) == len(DESIGN_TABLE)
    assert all(isinstance(a, RunStatus) and isinstance(b, RunStatus) for a, b in TRANSITIONS)


def test_terminal_states_match_design():
    assert {s.value for s in TERMINAL} == DESIGN_TERMINAL
    for status in RunStatus:
        assert status.terminal is (status.value in DESIGN_TERMINAL)


@pytest.mark.parametrize(("current", "target"), ALL_PAIRS, ids=lambda s: s.value)
def test_check_transition_exhaustive(current, target):
    if (current.value, target.value) in DESIGN_TABLE:
        check_transition("run-1", current.value, target)  # allowed: no exception
        check_transition("run-1", current, target)
    else:
        with pytest.raises(InvalidTransition) as info:
            check_transition("run-1", current.value, target)
        err = info.value
        assert (err.run_id, err.current, err.target) == ("run-1", current.value, target)
        assert "run-1" in str(err)
        assert f"{current.value} -> {target.value}" in str(err)


def test_invalid_transition_is_a_runtime_error():
    assert issubclass(InvalidTransition, RuntimeError)


def test_terminal_states_only_leave_by_replay():
    for status in TERMINAL:
        outgoing = {b for a, b in TRANSITIONS if a is status}
        assert outgoing <= {RunStatus.ACCEPTED}
    # A succeeded run is never executed again, not even by replay.
    assert not [b for a, b in TRANSITIONS if a is RunStatus.SUCCEEDED]


def test_every_state_is_reachable_from_accepted():
    reached, frontier = {RunStatus.ACCEPTED}, [RunStatus.ACCEPTED]
    while frontier:
        here = frontier.pop()
        for a, b in TRANSITIONS:
            if a is here and b not in reached:
                reached.add(b)
                frontier.append(b)
    assert reached == set(RunStatus)


def test_unknown_current_status_raises():
    # A corrupted stored status must not pass silently.
    with pytest.raises((InvalidTransition, ValueError)):
        check_transition("run-1", "exploded", RunStatus.PROCESSING)


# -- backoff ------------------------------------------------------------------------------


def _bounds(n: int, base: float, cap: float) -> tuple[float, float]:
    exponential = base * 2.0 ** (n - 1)
    if 1.2 * exponential >= cap:  # at the cap the jitter stays below it
        return 0.8 * cap, cap
    return 0.8 * exponential, 1.2 * exponential


@pytest.mark.parametrize(
    ("n", "expected"), [(1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0), (8, 256.0)]
)
def test_backoff_nominal_values(n, expected):
    for seed in range(50):
        value = backoff_seconds(n, 2.0, 10_000.0, random.Random(seed))
        assert 0.8 * expected <= value <= 1.2 * expected


def test_backoff_is_capped_and_still_jittered():
    values = {backoff_seconds(20, 2.0, 300.0, random.Random(seed)) for seed in range(50)}
    assert all(240.0 <= v <= 300.0 for v in values)
    assert len(values) > 25  # runs that failed together do not all retry together


def test_backoff_without_rng_uses_module_random():
    for _ in range(50):
        value = backoff_seconds(3, 1.0, 100.0)
        assert 3.2 <= value <= 4.8


def test_backoff_jitter_spreads_values():
    values = {backoff_seconds(5, 2.0, 10_000.0, random.Random(seed)) for seed in range(100)}
    assert len(values) > 50
    assert min(values) < 32.0 < max(values)


def test_backoff_deterministic_for_a_seeded_rng():
    a = [backoff_seconds(n, 0.5, 60.0, random.Random(7)) for n in range(1, 12)]
    b = [backoff_seconds(n, 0.5, 60.0, random.Random(7)) for n in range(1, 12)]
    assert a == b


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=200),
    base=st.floats(min_value=0.001, max_value=1000.0),
    extra=st.floats(min_value=0.0, max_value=100_000.0),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_backoff_property_within_jitter_band_and_cap(n, base, extra, seed):
    cap = base + extra
    value = backoff_seconds(n, base, cap, random.Random(seed))
    low, high = _bounds(n, base, cap)
    assert isinstance(value, float)
    assert 0 < value <= cap
    assert low * (1 - 1e-9) <= value <= high * (1 + 1e-9)


@pytest.mark.parametrize("n", [1025, 5000])
def test_backoff_huge_retry_number_is_capped(n):
    # AGENTBOX_MAX_RETRIES has no upper bound, so the dispatcher can ask for this.
    assert 240.0 <= backoff_seconds(n, 2.0, 300.0, random.Random(0)) <= 300.0
