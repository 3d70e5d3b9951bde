"""What one PostgreSQL instance tells the others after a commit (NOTIFY payloads), and
how much of it they read: the wake-up flags always, the run changes only while a
status page is open (every instance reads every other one's notifications; the
changes are most of them). No server: the payloads are plain text."""

from __future__ import annotations

import json

import pytest

from agentbox.store import Transition
from agentbox.store.postgres import (
    NOTIFY_PAYLOAD_BYTES,
    _announced_changes,
    _payloads,
    _read_announcement,
)


def change(n: int, status: str = "succeeded") -> Transition:
    return Transition(run_id=f"run_{n:04d}", status=status, attempt=1, event_id=f"e-{n}",
                      event_type="session.exported", source="daw", agent="mix_review")


def test_the_wake_ups_are_read_without_the_changes() -> None:
    head = {"from": "host:1", "runs": True, "outbox": False}
    (payload,) = _payloads(head, [change(1), change(2, "processing")])
    assert _read_announcement(payload, changes=False) == head
    full = _read_announcement(payload, changes=True)
    assert {k: full[k] for k in head} == head
    assert _announced_changes(full["changes"]) == (change(1), change(2, "processing"))


def test_the_changes_are_not_even_parsed_when_nobody_shows_them() -> None:
    (payload,) = _payloads({"from": "host:1", "runs": False, "outbox": True}, [change(1)])
    broken = payload[:payload.index("[") + 1] + "not json at all"
    assert _read_announcement(broken, changes=False) == {
        "from": "host:1", "runs": False, "outbox": True}
    with pytest.raises(ValueError):
        _read_announcement(broken, changes=True)


def test_an_instance_id_that_looks_like_the_changes_key_is_read_whole() -> None:
    """The head is split off at the first `, "changes": [`; inside a JSON string its
    quotes are escaped, so an id can never end the head early."""
    odd = 'x", "changes": [1'
    (payload,) = _payloads({"from": odd, "runs": True, "outbox": True}, [change(1)])
    assert _read_announcement(payload, changes=False)["from"] == odd


def test_many_changes_go_in_several_payloads_each_under_the_limit() -> None:
    changes = [change(n) for n in range(200)]
    payloads = _payloads({"from": "host:1", "runs": True, "outbox": False}, changes)
    assert len(payloads) > 1
    assert all(len(p) <= NOTIFY_PAYLOAD_BYTES + 200 for p in payloads)
    read = [t for p in payloads for t in _announced_changes(json.loads(p)["changes"])]
    assert read == changes
    assert all(_read_announcement(p, changes=False)["runs"] for p in payloads)
