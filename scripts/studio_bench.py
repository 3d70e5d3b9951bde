"""scripts/studio_bench.py: the pages a musician opens, on a studio's store two years
on (30,000 runs over 300 projects, plus projects with real reviews) against a small
one (100 runs), each served by a real `agentbox serve` on 127.0.0.1.

    .venv/bin/python scripts/studio_bench.py [--projects 300 --exports 100]
        [--reviewed 30 --reviews 10] [--small-projects 45 --small-exports 2]
        [--small-reviewed 2 --small-reviews 5] [--requests 15] [--work DIR]

Each store is built as fast as it can be, through the code that writes it (no SQL
here, so the script follows the schema): first a server with the mix review reviews
`--reviewed` projects of `--reviews` real exports each (short WAVs this script
writes), then, with that server stopped, the store's own `ingest` (leased at once)
and `finish` record `--projects` x `--exports` exports, each finished with the
result document of a real review, in group commits of many at a time; the review's
tables (its project of each run, the projects' kept summary) are written by the
same transactions, as a server's are.

The large store also gets a project of `--small-exports` exports ("Demo"), so that
the run list's search for a project can be timed showing as many runs on either
store (the small store's is one of its own projects).

Then a server on each store answers, after a few requests to warm up, `--requests`
times each: the home page, GET /exports, GET /exports?project=, the run list's text
search (/ui/runs?q= an event's id, a project's name, the project of as many runs on
either store), its first page of 50 runs unfiltered, and a real review's page. The medians are
printed for both stores with their ratio (large / small). See
agentbox/docs/performance.md, "Pages on a large store".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench  # noqa: E402  (scripts/bench.py: Server, write_mix, SECRET, ADMIN_TOKEN)
import httpx  # noqa: E402

from agentbox.archive.history import SCHEMA  # noqa: E402
from agentbox.client import Client  # noqa: E402
from agentbox.events import parse_event  # noqa: E402
from agentbox.review import contract  # noqa: E402
from agentbox.runs import RunStatus  # noqa: E402
from agentbox.store import IngestParams, Outcome  # noqa: E402
from agentbox.store.records import Lease  # noqa: E402
from agentbox.store.sqlite import SqliteStore  # noqa: E402

DAY = 86_400.0
AGENT = "mix_review"
BATCH = 500  # ingests (then finishes) in flight at once: the writer commits them together
REVIEW_SERVER = {"AGENTBOX_AGENTS": "", "AGENTBOX_WORKER_CONCURRENCY": "2"}


def event_id(project: str, number: int) -> str:
    return f"bench-{project.replace(' ', '-')}-{number}"


def export_body(project: str, number: int, at: float) -> bytes:
    sent_as = event_id(project, number)
    stamp = datetime.fromtimestamp(at, UTC).isoformat()
    return json.dumps({
        "schema_version": "v1", "event_id": sent_as,
        "idempotency_key": f"studio:session.exported:{sent_as}",
        "event_type": "session.exported", "source": "studio", "timestamp": stamp,
        "payload": {"project_id": project, "mix_url": f"/Music/{project}/mix {number}.wav"},
    }).encode()


async def record(path: Path, projects: Sequence[str], exports: int, result: Any,
                 since: float) -> int:
    """`exports` finished exports of each project, interleaved, from `since` on."""
    contract.register()  # the review's event types, as its app makes them known
    store = SqliteStore(path)
    store.add_tables(SCHEMA)
    await store.open()
    planned = [(project, n) for n in range(exports) for project in projects]
    step = (time.time() - 60 - since) / max(len(planned), 1)
    try:
        for start in range(0, len(planned), BATCH):
            chunk = planned[start:start + BATCH]
            times = [since + (start + i) * step for i in range(len(chunk))]
            accepted = await asyncio.gather(*(
                _ingest(store, export_body(project, n, at), at)
                for (project, n), at in zip(chunk, times, strict=True)))
            await asyncio.gather(*(
                store.finish(run_id, "bench", 1, Outcome(RunStatus.SUCCEEDED, result=result),
                             at + 1)
                for run_id, at in zip(accepted, times, strict=True)))
    finally:
        await store.close()
    return len(planned)


async def _ingest(store: SqliteStore, body: bytes, at: float) -> str:
    found = await store.ingest(IngestParams(
        event=parse_event(body), body=body, agents=(AGENT,), now=at, ttl=DAY,
        max_pending=10**9, lease=Lease(owner="bench", until=at + 3600)))
    return found.runs[0].run_id


def review(data: Path, mixes: Sequence[Path], projects: Sequence[str]) -> tuple[Any, str]:
    """Real reviews of each of `mixes` in each project, by a server with the mix
    review; (one review's result document, one reviewed run's id)."""
    server = bench.Server("agentbox", data, settings=REVIEW_SERVER)
    try:
        with Client(server.url, secret=bench.SECRET, admin_token=bench.ADMIN_TOKEN,
                    timeout=120) as client:
            runs = [client.send_export(mix, project).run_id
                    for project in projects for mix in mixes]
            for run_id in runs:
                found = client.follow(run_id, timeout=600)
                if found.status != RunStatus.SUCCEEDED:
                    raise SystemExit(f"the review of {run_id} ended {found.status}")
            return client.run(runs[-1]).result, runs[-1]
    finally:
        server.stop()


def build(work: Path, name: str, args: argparse.Namespace, small: bool) -> dict[str, Any]:
    data = work / name
    mixes = [work / f"mix {n}.wav" for n in range(args.small_reviews if small
                                                  else args.reviews)]
    reviewed = [f"Reviewed {n:02d}" for n in range(args.small_reviewed if small
                                                  else args.reviewed)]
    projects = [f"Song {n:03d}" for n in range(args.small_projects if small
                                               else args.projects)]
    started = time.monotonic()
    document, run_id = review(data, mixes, reviewed)
    since = time.time() - 2 * DAY  # within the default retention (30 days)
    seeded = asyncio.run(record(data / "agentbox.sqlite3", projects,
                                args.small_exports if small else args.exports, document,
                                since))
    built = {"data": data, "runs": seeded + len(mixes) * len(reviewed),
             "projects": len(projects) + len(reviewed), "review_run": run_id,
             "project": projects[len(projects) // 2]}
    built.update(few_runs(built, args, small, document))
    return {**built, "build_s": round(time.monotonic() - started, 1)}


FEW = "Demo"  # the large store's project of as many exports as the small store's have


def few_runs(store: dict[str, Any], args: argparse.Namespace, small: bool,
             document: Any) -> dict[str, Any]:
    """A project that shows as many runs on either store (the search's like for like):
    the small store's own, one of `--small-exports` recorded on the large store."""
    if small:
        return {"few": store["project"]}
    added = asyncio.run(record(Path(store["data"]) / "agentbox.sqlite3", [FEW],
                               args.small_exports, document, time.time() - 2 * DAY))
    return {"few": FEW, "runs": store["runs"] + added, "projects": store["projects"] + 1}


async def result_of(path: Path, run_id: str) -> Any:
    store = SqliteStore(path)
    store.add_tables(SCHEMA)
    await store.open()
    try:
        found = await store.get_run(run_id)
        return None if found is None else found.result
    finally:
        await store.close()


def timings(stores: dict[str, dict[str, Any]], requests: int) -> dict[str, dict[str, float]]:
    """Median milliseconds of each page on each store, by a server on each, both
    running: each round asks the one then the other (which first alternates), so that
    a load the machine has from elsewhere falls on both alike."""
    servers = {name: bench.Server("agentbox", store["data"], settings=REVIEW_SERVER)
               for name, store in stores.items()}
    times: dict[str, dict[str, list[float]]] = {name: {} for name in stores}
    try:
        clients = {name: httpx.Client(base_url=server.url, timeout=60, headers={
            "Authorization": f"Bearer {bench.ADMIN_TOKEN}"}) for name, server in servers.items()}
        for page in PAGES:
            for n in range(requests + 3):
                order = list(stores) if n % 2 else list(stores)[::-1]
                for name in order:
                    took = _get(clients[name], _path(page, stores[name]))
                    if n >= 3:  # the first few warm the server's caches up
                        times[name].setdefault(page, []).append(took)
        for client in clients.values():
            client.close()
    finally:
        for server in servers.values():
            server.stop()
    return {name: {page: statistics.median(found) for page, found in pages.items()}
            for name, pages in times.items()}


PAGES = ("home page", "GET /exports", "GET /exports?project=", "runs: q=an event id",
         "runs: q=a project", "runs: q=a project of 2", "runs: a page of 50",
         "a review's page")


def _path(page: str, store: dict[str, Any]) -> str:
    project = quote(store["project"])
    return {"home page": "/", "GET /exports": "/exports",
            "GET /exports?project=": f"/exports?project={project}",
            "runs: q=an event id": "/ui/runs?q=" + quote(event_id(store["project"], 1)),
            "runs: q=a project": f"/ui/runs?q={project}",
            "runs: q=a project of 2": "/ui/runs?q=" + quote(store["few"]),
            "runs: a page of 50": "/ui/runs",
            "a review's page": f"/ui/runs/{store['review_run']}"}[page]


def _get(client: httpx.Client, path: str) -> float:
    """Milliseconds to the whole answer of GET `path` (200, else the bench stops)."""
    began = time.perf_counter()
    answer = client.get(path)
    took = (time.perf_counter() - began) * 1000
    if answer.status_code != 200:
        raise SystemExit(f"{path}: {answer.status_code} {answer.text[:300]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--projects", type=int, default=300)
    parser.add_argument("--exports", type=int, default=100)
    parser.add_argument("--reviewed", type=int, default=30)
    parser.add_argument("--reviews", type=int, default=10)
    parser.add_argument("--small-projects", type=int, default=45)
    parser.add_argument("--small-exports", type=int, default=2)
    parser.add_argument("--small-reviewed", type=int, default=2)
    parser.add_argument("--small-reviews", type=int, default=5)
    parser.add_argument("--seconds-of-audio", type=float, default=6.0)
    parser.add_argument("--requests", type=int, default=15)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--reuse", action="store_true",
                        help="time the stores an earlier run built in --work again")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="agentbox-studio-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    built = work / "stores.json"
    if args.reuse:
        stores = {name: {**store, "data": Path(store["data"])}
                  for name, store in json.loads(built.read_text()).items()}
        for name, store in stores.items():  # built before the stores had a project of few
            if "few" not in store:
                document = asyncio.run(result_of(store["data"] / "agentbox.sqlite3",
                                                 store["review_run"]))
                store.update(few_runs(store, args, name == "small", document))
        built.write_text(json.dumps({name: {**store, "data": str(store["data"])}
                                     for name, store in stores.items()}))
    else:
        for n in range(max(args.reviews, args.small_reviews)):  # each its own bytes
            bench.write_mix(work / f"mix {n}.wav", (args.seconds_of_audio + n) / 60)
        stores = {}
        for name, small in (("small", True), ("large", False)):
            stores[name] = build(work, name, args, small)
            print(json.dumps({name: {k: v for k, v in stores[name].items() if k != "data"}}),
                  flush=True)
        built.write_text(json.dumps({name: {**store, "data": str(store["data"])}
                                     for name, store in stores.items()}))
    figures = timings(stores, args.requests)
    small, large = stores["small"], stores["large"]
    print(f"\n{'median ms':<24}{small['runs']:>9,} runs{large['runs']:>11,} runs{'ratio':>8}")
    for page in figures["small"]:
        a, b = figures["small"][page], figures["large"][page]
        print(f"{page:<24}{a:>14.1f}{b:>16.1f}{b / a:>8.2f}")
    print(json.dumps({"work": str(work), "medians_ms": figures}))


if __name__ == "__main__":
    try:
        main()
    finally:
        for running in list(bench.RUNNING):
            running.stop()
