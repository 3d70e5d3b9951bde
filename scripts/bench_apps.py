"""What scripts/bench serves: the ceiling app, the no-op agent and (--peers) the peers.

The ceiling is the least a receiver can do: verify the same signature and
validate the same event model with the same code as agentbox, store nothing,
answer 202. agentbox's accepted/s divided by the ceiling's, measured in the
same run, is the benchmark's headline figure.

The peers (scripts/bench --peers) are the designs agentbox is compared with end
to end, each with the ceiling's verification and event model in front:
- the reference design: dedup with Redis `SET key NX EX`, enqueue on a Redis
  list, one worker process popping it, running the no-op agent and recording
  the run's completion in Redis (`reference_app`, `reference_worker`);
- Starlette + huey: dedup with huey's `put_if_empty`, enqueue a huey task into
  a SqliteHuey file, run by `huey_consumer bench_apps.huey_queue`
  (`huey_app`). redis and huey are imported only by the peers, so the ceiling
  needs neither.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import agentbox.review.contract  # noqa: F401 - the event types the review app brings
from agentbox import AgentContext, Event
from agentbox.events import InvalidEvent, parse_event
from agentbox.signing import SignatureError, Verifier

_verifier = Verifier(os.environ.get("BENCH_SECRET", "bench-secret").split(","), 300)


async def _receive(request: Request) -> Response:
    body = await request.body()
    try:
        _verifier.verify(request.headers, body, time.time())
        event = parse_event(body)
    except SignatureError as exc:
        return JSONResponse({"status": "rejected", "error_code": exc.code}, status_code=401)
    except InvalidEvent as exc:
        return JSONResponse({"status": "rejected", "errors": exc.errors}, status_code=422)
    return JSONResponse({"status": "accepted", "event_id": event.envelope.event_id},
                        status_code=202)


ceiling_app = Starlette(routes=[Route("/webhooks/events", _receive, methods=["POST"])])


async def noop(event: Event, ctx: AgentContext) -> dict[str, Any]:
    """The benchmark's agent: returns at once, so the figures measure agentbox."""
    return {"ok": True}


# -- peers (scripts/bench --peers) ---------------------------------------------------

QUEUE_KEY = "bench:queue"  # the reference design's Redis list of accepted runs
COMPLETED_KEY = "bench:completed"  # how many runs the worker finished
DEDUP_TTL_S = 7 * 86_400  # as long as agentbox keeps an idempotency key


def _checked(request_headers: Any, body: bytes) -> Event | Response:
    """The ceiling's verification and validation: the event, or the answer refusing it."""
    try:
        _verifier.verify(request_headers, body, time.time())
        return parse_event(body)
    except SignatureError as exc:
        return JSONResponse({"status": "rejected", "error_code": exc.code}, status_code=401)
    except InvalidEvent as exc:
        return JSONResponse({"status": "rejected", "errors": exc.errors}, status_code=422)


def _answer(run_id: str, duplicate: bool) -> Response:
    """The wire contract's answer: 202 queued, or 200 for a known duplicate."""
    return JSONResponse({"status": "queued", "run_id": run_id, "duplicate": duplicate,
                         "status_url": f"/runs/{run_id}"}, status_code=200 if duplicate else 202)


@functools.cache
def _redis() -> Any:
    import redis.asyncio

    return redis.asyncio.Redis.from_url(os.environ["BENCH_REDIS_URL"])


async def _reference_receive(request: Request) -> Response:
    body = await request.body()
    checked = _checked(request.headers, body)
    if isinstance(checked, Response):
        return checked
    run_id = "run_" + uuid.uuid4().hex
    client = _redis()
    key = "dedup:" + checked.envelope.idempotency_key
    if not await client.set(key, run_id, nx=True, ex=DEDUP_TTL_S):
        first = await client.get(key)
        return _answer(first.decode() if first else run_id, duplicate=True)
    await client.rpush(QUEUE_KEY, json.dumps({"run_id": run_id, "body": body.decode()}))
    return _answer(run_id, duplicate=False)


reference_app = Starlette(routes=[Route("/webhooks/events", _reference_receive,
                                        methods=["POST"])])


async def _reference_work() -> None:
    client = _redis()
    while True:
        popped = await client.blpop([QUEUE_KEY], timeout=1)
        if popped is None:
            continue
        job = json.loads(popped[1])
        result = await noop(parse_event(job["body"].encode()), None)  # type: ignore[arg-type]
        async with client.pipeline(transaction=True) as pipe:
            pipe.set(f"run:{job['run_id']}", json.dumps({"status": "succeeded",
                                                          "result": result}))
            pipe.incr(COMPLETED_KEY)
            await pipe.execute()


def reference_worker() -> None:
    """The reference design's worker process: one run at a time, popped from Redis."""
    asyncio.run(_reference_work())


_loops = threading.local()


def _huey_noop(run_id: str, body: str) -> dict[str, Any]:
    """The huey task: the no-op agent on the validated event. Its result, which huey
    stores, is the run's completion record."""
    loop = getattr(_loops, "loop", None)
    if loop is None:
        loop = _loops.loop = asyncio.new_event_loop()
    result: dict[str, Any] = loop.run_until_complete(
        noop(parse_event(body.encode()), None))  # type: ignore[arg-type]
    return {"run_id": run_id, "status": "succeeded", "result": result}


@functools.cache
def _huey() -> tuple[Any, Any]:
    """The SqliteHuey queue (durable: fsync on every commit) and its task."""
    from huey import SqliteHuey

    queue = SqliteHuey("bench", filename=os.environ["BENCH_HUEY_FILE"], fsync=True)
    return queue, queue.task(name="bench_noop")(_huey_noop)


@functools.cache
def _huey_writer() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(1, thread_name_prefix="huey-enqueue")


def _huey_enqueue(idempotency_key: str, body: str) -> tuple[str, bool]:
    queue, task = _huey()
    run_id = "run_" + uuid.uuid4().hex
    if not queue.put_if_empty("dedup:" + idempotency_key, run_id):
        return str(queue.get("dedup:" + idempotency_key, peek=True)), True
    task(run_id, body)
    return run_id, False


async def _huey_receive(request: Request) -> Response:
    body = await request.body()
    checked = _checked(request.headers, body)
    if isinstance(checked, Response):
        return checked
    # One thread writes to the queue: SQLite takes one writer at a time, and writers
    # in several threads wait for its lock in sleeps (40 threads: a tenth the rate).
    run_id, duplicate = await asyncio.get_running_loop().run_in_executor(
        _huey_writer(), _huey_enqueue, checked.envelope.idempotency_key, body.decode())
    return _answer(run_id, duplicate)


huey_app = Starlette(routes=[Route("/webhooks/events", _huey_receive, methods=["POST"])])


def __getattr__(name: str) -> Any:
    if name == "huey_queue":  # what huey_consumer loads: created on first use
        return _huey()[0]
    raise AttributeError(name)


if __name__ == "__main__":
    reference_worker()
