"""Prometheus metrics, served at `/metrics` (prometheus-client, one registry per app).

Counters and histograms are updated where things happen (receiver,
dispatcher, callback deliverer); the queue gauges are read from the store
when Prometheus scrapes.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    enable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics import MetricWrapperBase

from agentbox.store import Transition

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
                   600, 1800, 3600)


class Children(dict[tuple[str, ...], Any]):
    """A labelled metric's children by label values, each looked up once: `labels()`
    takes the metric's lock and builds its key on every call, and the hot path
    counts several things per event."""

    def __init__(self, metric: MetricWrapperBase) -> None:
        super().__init__()
        self.metric = metric

    def __missing__(self, values: tuple[str, ...]) -> Any:
        child = self[values] = self.metric.labels(*values)
        return child


def created_series_asked() -> bool:
    """Whether the `*_created` series (each counter's and histogram's start time) are
    asked for: prometheus-client's own switch, PROMETHEUS_DISABLE_CREATED_SERIES,
    set to false. Otherwise they are left out: one per labelled child (31 on a
    fresh server), which Prometheus stores and hardly anyone reads."""
    asked = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "").strip().lower()
    return asked in ("false", "0", "no")


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, instance_id: str = "", engine: str = "") -> None:
        # (the library's switch, for the metrics made from now on)
        if created_series_asked():
            enable_created_metrics()  # type: ignore[no-untyped-call]  # (untyped upstream)
        else:
            disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        r = self.registry
        # target_info{instance_id, engine}: join it to any series to tell instances apart.
        r.set_target_info({"instance_id": instance_id, "engine": engine})
        # process_cpu_seconds_total and the rest (where the OS has /proc): an instance
        # near the share of a core one process can use has reached its own limit
        # (the scaling topic's capacity model)
        ProcessCollector(registry=r)
        self.accepted = Counter("agentbox_events_accepted", "Events stored (202)",
                                ["event_type"], registry=r)
        self.duplicates = Counter("agentbox_events_duplicate",
                                  "Deliveries of an event already stored (200)", registry=r)
        self.refused = Counter("agentbox_events_refused", "Deliveries refused, by error_code",
                               ["reason"], registry=r)
        self.transitions = Counter("agentbox_run_transitions",
                                   "Run state changes (failed_retryable: retries; "
                                   "dead_lettered: dead letters)", ["agent", "status"],
                                   registry=r)
        self.run_latency = Histogram("agentbox_run_latency_seconds",
                                     "From acceptance to a terminal state", ["agent"],
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.agent_duration = Histogram("agentbox_agent_duration_seconds",
                                        "One attempt of an agent", ["agent"],
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.callbacks = Counter("agentbox_callback_deliveries",
                                 "Callback delivery attempts, by outcome "
                                 "(delivered, pending: failed and retried later, dead)",
                                 ["outcome"], registry=r)
        self.queue = Gauge("agentbox_runs", "Runs by state", ["status"], registry=r)
        self.oldest_waiting = Gauge("agentbox_oldest_waiting_age_seconds",
                                    "Age of the oldest run waiting to be claimed", registry=r)
        self.login_failures = Counter("agentbox_login_failures",
                                      "Failed logins to the page (beyond loopback)", registry=r)
        self._accepted = Children(self.accepted)
        self._refused = Children(self.refused)
        self._transitions = Children(self.transitions)
        self._run_latency = Children(self.run_latency)
        self._agent_duration = Children(self.agent_duration)

    def event_accepted(self, event_type: str) -> None:
        self._accepted[event_type,].inc()

    def event_refused(self, reason: str) -> None:
        self._refused[reason,].inc()

    def login_failed(self) -> None:
        self.login_failures.inc()

    def transition(self, t: Transition) -> None:
        self._transitions[t.agent, t.status].inc()

    def attempt(self, agent: str, seconds: float, status: str | None, accepted_at: float) -> None:
        self._agent_duration[agent,].observe(seconds)
        if status in ("succeeded", "failed_permanent", "dead_lettered"):
            self._run_latency[agent,].observe(max(0.0, time.time() - accepted_at))

    def render(self, stats: dict[str, Any], now: float) -> bytes:
        for status, count in stats["runs"].items():
            self.queue.labels(status).set(count)
        oldest = stats.get("oldest_waiting_accepted_at")
        age = 0.0 if oldest is None else now - datetime.fromisoformat(oldest).timestamp()
        self.oldest_waiting.set(max(0.0, age))
        return generate_latest(self.registry)
