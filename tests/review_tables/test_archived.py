"""What the project pages say of an export whose run retention removed (every engine):
`projects` and `project_exports` mark it `archived`, and `archived_export` finds it by
its run id, so that the pages link it to no run page and the API can say where it went."""

from __future__ import annotations

from typing import Any

from agentbox.config import SECONDS_PER_DAY, Settings
from agentbox.engine.retention import Retention
from agentbox.store import Store
from tests.review_tables.test_projects import export, succeed
from tests.store.support import PERMANENT, T0, async_test, claim_one, history

DAY = SECONDS_PER_DAY


@async_test
async def test_an_export_whose_run_retention_removed_is_marked_and_found_by_its_run_id(
        store: Store, aio: Any) -> None:
    [old] = await export(store, "old", "night-drive", now=T0)
    await succeed(store, old, T0 + 1, {"verdict": "pass"})
    [failed] = await export(store, "failed", "night-drive", now=T0 + 10)
    assert (await claim_one(store, now=T0 + 10)).run_id == failed
    assert await store.finish(failed, "w1", 1, PERMANENT, T0 + 11)
    now = T0 + 40 * DAY
    [new] = await export(store, "new", "night-drive", now=now)
    before = await history(store).project_exports("night-drive")
    assert not any(e.archived for e in before)
    assert await history(store).archived_export(old) is None  # stored still

    settings = Settings(retention_days=30.0, body_retention_days=7.0,
                        idempotency_ttl_seconds=DAY)
    report = await Retention(store, settings, lambda: now, rest_ratio=0.0).prune()
    assert report.removed["runs"] == 2 and report.removed["project_exports"] == 2

    after = await history(store).project_exports("night-drive")
    assert after == before  # the same exports, as the pages read them
    assert {e.run_id: e.archived for e in after} == {new: False, failed: True, old: True}
    assert [(p.run_id, p.archived) for p in await history(store).projects()] == [(new, False)]
    kept = await history(store).archived_export(old)
    assert kept is not None and kept.archived and kept.project == "night-drive"
    assert (kept.status, kept.result) == ("succeeded", {"verdict": "pass"})
    assert kept.finished_at is not None and kept == before[2]
    gone = await history(store).archived_export(failed)
    assert gone is not None and (gone.status, gone.result) == ("failed_permanent", None)
    assert await history(store).archived_export(new) is None  # a run still stored
    assert await history(store).archived_export("run_never_was") is None
    assert await history(store).archived_export("run\x00nul") is None  # PostgreSQL cannot be asked
