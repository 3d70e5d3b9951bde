"""Runs as the client reads them (agentbox.models), made up for tests of what prints
them: every field a run has, those a test does not give set to a quiet default."""

from __future__ import annotations

from typing import Any

from agentbox.models import RunDetail

QUIET = {"run_id": "run_0", "status": "succeeded", "event_id": "e-1",
         "event_type": "session.exported", "source": "test", "agent": "agent",
         "idempotency_key": "test:session.exported:e-1", "project": None,
         "accepted_at": "2026-07-27T14:02:00Z", "started_at": None,
         "updated_at": "2026-07-27T14:02:00Z", "completed_at": None, "attempt": 1,
         "retry_count": 0, "next_attempt_at": None, "result": None, "error_code": None,
         "error_message": None, "replays": 0, "correlation_id": None, "causation_id": None,
         "hop": 0, "terminal": True, "callbacks": []}


def made_run(**fields: Any) -> RunDetail:
    return RunDetail.model_validate({**QUIET, **fields})
