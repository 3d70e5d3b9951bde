"""A step of the system clock (NTP, a person) an hour forward or back, under a
running app: no lease expires early, no retry fires early or an hour late, and
signature windows follow the wall clock within the configured tolerance.

The wall clock is injected (the app's `wall_clock`); the monotonic clock and the
agents are real.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentbox.config import load_settings
from agentbox.http.app import create_app
from agentbox.runs import SteadyClock
from agentbox.signing import sign_headers
from tests.conftest import ADMIN_TOKEN, SECRET, TEST_AGENT, encode, make_event

HOUR = 3600.0


class SteppedWall:
    """The real wall clock plus whatever steps the test made."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def test_steady_clock_slews_over_steps_of_the_wall_clock() -> None:
    ticks, step = [100.0], [0.0]

    def wall() -> float:  # a wall clock that runs with the ticks, plus its steps
        return 1_785_000_000 + ticks[0] + step[0]

    clock = SteadyClock(wall, lambda: ticks[0])
    start = clock()
    assert start == wall()
    step[0] = HOUR
    assert clock() == start  # no time passed: no jump
    ticks[0] += 2.5
    assert clock() == pytest.approx(start + 2.5 * 1.1)  # 10 % fast, not an hour ahead
    step[0] = -HOUR
    before = clock()
    ticks[0] += 10
    assert clock() == pytest.approx(before + 10 * 0.9)  # 10 % slow, never backwards
    for _ in range(400):  # the step is caught up at 0.1 s per second
        ticks[0] += 100
        clock()
    assert clock() == pytest.approx(wall())


def test_clock_steps_neither_expire_leases_nor_move_retries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = tmp_path / "journal.jsonl"
    monkeypatch.setenv("AGENTBOX_TEST_JOURNAL", str(journal))
    settings = load_settings(environ={
        "AGENTBOX_DATA_DIR": str(tmp_path / "data"), "AGENTBOX_WEBHOOK_SECRET": SECRET,
        "AGENTBOX_CALLBACK_SECRET": "callback-secret",
        "AGENTBOX_AGENTS": f"session.exported={TEST_AGENT}",
        "AGENTBOX_LEASE_SECONDS": "2",  # renewed every 2/3 s while the agent runs
        "AGENTBOX_RETRY_BASE_SECONDS": "3", "AGENTBOX_RETRY_MAX_SECONDS": "3",  # 2.4-3 s
        "AGENTBOX_SHUTDOWN_GRACE_SECONDS": "0.2"}, overrides={"config_dir": tmp_path / "c"})
    wall = SteppedWall()
    app = create_app(settings, admin_token=ADMIN_TOKEN, wall_clock=wall)

    def starts(run_id: str) -> list[float]:
        lines = [json.loads(line) for line in journal.read_text().splitlines()]
        return [entry["t"] for entry in lines
                if entry["kind"] == "start" and entry["run_id"] == run_id]

    async def scenario() -> None:
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://localhost",
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:

            async def post(event: dict[str, Any], at: float | None = None) -> httpx.Response:
                body = encode(event)
                signed = sign_headers(SECRET, body, int(wall() if at is None else at))
                return await client.post("/webhooks/events", content=body, headers=signed)

            async def until(run_id: str, *statuses: str, timeout: float = 15) -> dict[str, Any]:
                deadline = time.monotonic() + timeout
                while True:
                    run: dict[str, Any] = (await client.get(f"/runs/{run_id}")).json()
                    if run["status"] in statuses:
                        return run
                    assert time.monotonic() < deadline, f"{run_id} stayed {run['status']}"
                    await asyncio.sleep(0.02)

            slow = (await post(make_event(project_id="sleep-3"))).json()["run_id"]
            flaky = (await post(make_event(project_id="fail-1"))).json()["run_id"]
            await until(slow, "processing")
            await until(flaky, "failed_retryable")

            wall.offset += HOUR  # forward: every lease taken with the old time looks expired
            assert (await post(make_event())).status_code == 202  # wakes the claim loop
            done = await until(slow, "succeeded")
            assert done["attempt"] == 1  # its lease was not taken from it
            assert (await until(flaky, "succeeded"))["attempt"] == 2
            first, second = starts(flaky)
            assert second - first >= 2.0  # the retry waited its 2.4-3 s, not zero

            late = (await post(make_event(project_id="fail-1"))).json()["run_id"]
            await until(late, "failed_retryable")
            wall.offset -= 2 * HOUR  # back: a wall-clock retry would wait an hour more
            assert (await post(make_event())).status_code == 202
            assert (await until(late, "succeeded", timeout=10))["attempt"] == 2

            # Signatures are checked against the wall clock, whatever it says.
            assert (await post(make_event())).status_code == 202
            refused = await post(make_event(), at=time.time())  # an hour off the wall clock
            assert refused.status_code == 401, refused.text

    asyncio.run(scenario())
