"""The PostgreSQL peers of scripts/bench (--peers --database-url): receivers and workers.

Each peer is a Starlette receiver with the ceiling's signature check and event
model in front (bench_apps._checked: agentbox's own code), which defers a job
carrying the event's body, and one worker process that runs it: the job parses
the event again and awaits the no-op agent, as the reference design's worker
does. Duplicates are refused the way each library offers: procrastinate's
`queueing_lock`, pgqueuer's `dedupe_key` (both hold only while the job waits,
where agentbox keeps a key 7 days).

- procrastinate: `App(PsycopgConnector)`, `task.configure(queueing_lock=key)
  .defer_async(body=...)`; the worker is `app.run_worker_async(concurrency=...)`
  (LISTEN/NOTIFY on, jobs kept as succeeded: its defaults);
- pgqueuer: `Queries.from_asyncpg_pool(pool).enqueue(..., dedupe_key=key)`; the
  worker is `PgQueuer(AsyncpgDriver(connection))` with one entrypoint, run with
  a batch size, as its examples do.

Each runs in a virtual environment of its own that scripts/bench_pg.py makes
(the peer's package and the few agentbox needs to verify and validate), with
agentbox's source on PYTHONPATH. Settings come from the environment:
BENCH_DATABASE_URL, BENCH_SECRET, BENCH_POOL (the receiver's connections),
BENCH_CONCURRENCY (procrastinate's worker) and BENCH_BATCH (pgqueuer's worker).

    python bench_pg_apps.py {procrastinate,pgqueuer} {schema,worker}
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

from bench_apps import _answer, _checked, noop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import agentbox.review.contract  # noqa: F401 - the event types the review app brings
from agentbox.events import parse_event

URL = os.environ.get("BENCH_DATABASE_URL", "")
POOL = int(os.environ.get("BENCH_POOL", "10"))
TASK = "bench_noop"


async def _run_noop(body: str | bytes) -> None:
    """The job: the event parsed again from its body, and the no-op agent."""
    raw = body.encode() if isinstance(body, str) else body
    await noop(parse_event(raw), None)  # type: ignore[arg-type]


# -- procrastinate --------------------------------------------------------------------


def _procrastinate() -> tuple[Any, Any]:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=URL, min_size=POOL, max_size=POOL))

    @app.task(name=TASK)
    async def bench_noop(body: str) -> None:
        await _run_noop(body)

    return app, bench_noop


def procrastinate_asgi() -> Starlette:
    from procrastinate.exceptions import AlreadyEnqueued

    app, task = _procrastinate()

    async def receive(request: Request) -> Response:
        body = await request.body()
        checked = _checked(request.headers, body)
        if isinstance(checked, Response):
            return checked
        key = checked.envelope.idempotency_key
        try:
            job_id = await task.configure(queueing_lock=key).defer_async(body=body.decode())
        except AlreadyEnqueued:
            return _answer(key, duplicate=True)
        return _answer(f"job_{job_id}", duplicate=False)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with app.open_async():
            yield

    return Starlette(routes=[Route("/webhooks/events", receive, methods=["POST"])],
                     lifespan=lifespan)


async def procrastinate_main(command: str) -> None:
    app, _ = _procrastinate()
    async with app.open_async():
        if command == "schema":
            await app.schema_manager.apply_schema_async()
        else:
            await app.run_worker_async(
                concurrency=int(os.environ.get("BENCH_CONCURRENCY", "1")))


# -- pgqueuer -------------------------------------------------------------------------


def pgqueuer_asgi() -> Starlette:
    import asyncpg
    from pgqueuer import Queries
    from pgqueuer.errors import DuplicateJobError

    queries: list[Any] = []

    async def receive(request: Request) -> Response:
        body = await request.body()
        checked = _checked(request.headers, body)
        if isinstance(checked, Response):
            return checked
        key = checked.envelope.idempotency_key
        try:
            ids = await queries[0].enqueue(TASK, body, dedupe_key=key)
        except DuplicateJobError:
            return _answer(key, duplicate=True)
        return _answer(f"job_{ids[0]}", duplicate=False)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with asyncpg.create_pool(URL, min_size=POOL, max_size=POOL) as pool:
            queries.append(Queries.from_asyncpg_pool(pool))
            yield

    return Starlette(routes=[Route("/webhooks/events", receive, methods=["POST"])],
                     lifespan=lifespan)


async def pgqueuer_main(command: str) -> None:
    import asyncpg
    from pgqueuer import PgQueuer, Queries
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job

    connection = await asyncpg.connect(URL)
    try:
        if command == "schema":
            await Queries(AsyncpgDriver(connection)).install()
            return
        pgq = PgQueuer(AsyncpgDriver(connection))

        @pgq.entrypoint(TASK)
        async def bench_noop(job: Job) -> None:
            await _run_noop(job.payload or b"")

        await pgq.run(batch_size=int(os.environ.get("BENCH_BATCH", "10")))
    finally:
        await connection.close()


def __getattr__(name: str) -> Any:
    """What uvicorn loads (`bench_pg_apps:procrastinate_app`), made on first use."""
    if name == "procrastinate_app":
        return procrastinate_asgi()
    if name == "pgqueuer_app":
        return pgqueuer_asgi()
    raise AttributeError(name)


if __name__ == "__main__":
    peer, command = sys.argv[1], sys.argv[2]
    main = procrastinate_main if peer == "procrastinate" else pgqueuer_main
    import uvloop

    uvloop.run(main(command))
