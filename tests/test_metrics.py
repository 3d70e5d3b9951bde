"""Prometheus metrics at /metrics, read back with prometheus-client's own parser."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentbox.engine.metrics import Metrics
from agentbox.runs import RunStatus
from agentbox.store import Transition
from tests.conftest import Server, make_event, wait_until


def samples(server: Server) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = server.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    found = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_metrics_count_what_happened(server_factory: Callable[..., Server]) -> None:
    server = server_factory().start()
    ok = make_event(project_id="ok")
    run_id = server.post(ok).json()["run_id"]
    assert server.post(ok).status_code == 200  # a duplicate
    dead = server.post(make_event(project_id="always-fail")).json()["run_id"]
    assert server.post(make_event(), secret="wrong").status_code == 401
    server.wait_terminal(run_id)
    server.wait_terminal(dead, timeout=30)
    agent = "tests.support.agents:scripted"
    found = wait_until(lambda: (lambda s: s if s.get(
        ("agentbox_run_latency_seconds_count", (("agent", agent),))) == 2 else None)(
        samples(server)), 10, "both runs in the latency histogram")
    assert found[("agentbox_events_accepted_total",
                  (("event_type", "session.exported"),))] == 2
    assert found[("agentbox_events_duplicate_total", ())] == 1
    assert found[("agentbox_events_refused_total", (("reason", "signature_invalid"),))] == 1
    assert found[("agentbox_run_transitions_total",
                  (("agent", agent), ("status", "dead_lettered")))] == 1
    assert found[("agentbox_run_transitions_total",
                  (("agent", agent), ("status", "failed_retryable")))] == 3  # retries
    assert found[("agentbox_agent_duration_seconds_count", (("agent", agent),))] == 5
    assert found[("agentbox_runs", (("status", "succeeded"),))] == 1
    assert found[("agentbox_runs", (("status", "dead_lettered"),))] == 1
    assert found[("agentbox_oldest_waiting_age_seconds", ())] == 0
    log = server.log_path.read_text()
    assert "ALERT: a run was dead-lettered" in log
    # the same ids end to end: the receiver's line names the event and its run
    accepted = [json.loads(line) for line in log.splitlines()
                if '"msg": "event accepted"' in line]
    assert {line["event_id"] for line in accepted} >= {ok["event_id"]}
    assert any(run_id in line["run_ids"] for line in accepted)


def test_counts_through_the_kept_children_land_in_the_labelled_series() -> None:
    """The hot path keeps each labelled child it looked up: what it counts must be
    what `/metrics` shows, one series per label set (a status given as the enum or
    as its text is the same series)."""
    metrics = Metrics("instance", "sqlite")
    for _ in range(2):
        metrics.event_accepted("session.exported")
    metrics.event_refused("signature_invalid")
    for status in (RunStatus.SUCCEEDED, "succeeded", "processing"):
        metrics.transition(Transition(run_id="r", status=status, attempt=1, event_id="e",
                                      event_type="session.exported", source="s", agent="a"))
    metrics.attempt("a", 0.002, "succeeded", time.time() - 1)
    metrics.attempt("a", 0.002, "failed_retryable", time.time() - 1)
    found = {}
    for family in text_string_to_metric_families(
            metrics.render({"runs": {}, "oldest_waiting_accepted_at": None}, time.time()).decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert found[("agentbox_events_accepted_total",
                  (("event_type", "session.exported"),))] == 2
    assert found[("agentbox_events_refused_total", (("reason", "signature_invalid"),))] == 1
    assert found[("agentbox_run_transitions_total",
                  (("agent", "a"), ("status", "succeeded")))] == 2
    assert found[("agentbox_run_transitions_total",
                  (("agent", "a"), ("status", "processing")))] == 1
    assert len([key for key in found if key[0] == "agentbox_run_transitions_total"]) == 2
    assert found[("agentbox_agent_duration_seconds_count", (("agent", "a"),))] == 2
    assert found[("agentbox_run_latency_seconds_count", (("agent", "a"),))] == 1
    assert found[("agentbox_run_latency_seconds_bucket", (("agent", "a"), ("le", "0.5")))] == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="read from /proc (Linux)")
def test_the_process_cpu_an_instance_has_spent_is_a_metric() -> None:
    """What tells an operator that an instance is the bottleneck (docs: scaling)."""
    metrics = Metrics("instance", "postgresql")
    sum(range(200_000))  # some CPU of our own
    text = metrics.render({"runs": {}, "oldest_waiting_accepted_at": None}, time.time())
    found = {sample.name: sample.value
             for family in text_string_to_metric_families(text.decode())
             for sample in family.samples}
    assert found["process_cpu_seconds_total"] > 0
    assert found["process_resident_memory_bytes"] > 0


def test_no_created_series_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """31 *_created series on a fresh server, one per counter and histogram child:
    left out, unless prometheus-client's own switch asks for them."""
    def rendered() -> str:
        metrics = Metrics("i1", "sqlite")
        metrics.accepted.labels("session.exported").inc()
        metrics.attempt("mix_review", 0.2, "succeeded", time.time() - 1)
        return metrics.render({"runs": {"accepted": 0}}, time.time()).decode()

    monkeypatch.delenv("PROMETHEUS_DISABLE_CREATED_SERIES", raising=False)
    plain = rendered()
    assert "agentbox_events_accepted_total" in plain and "_created" not in plain
    monkeypatch.setenv("PROMETHEUS_DISABLE_CREATED_SERIES", "false")
    assert "agentbox_events_accepted_created" in rendered()
    monkeypatch.delenv("PROMETHEUS_DISABLE_CREATED_SERIES")
    assert "_created" not in rendered()
