"""What an event costs the SQLite store alone, in CPU instructions: stable where times
are not. See agentbox/docs/performance.md, "The store's cost per event".

    .venv/bin/python scripts/store_cost.py [--batch 4] [--against DIR ...]
    .venv/bin/python scripts/store_cost.py --against /path/to/older/checkout --time

Each checkout (this one, then each `--against DIR`, the root of another copy of
agentbox's source) runs the same work in a process of its own: a SQLite store
with the review's tables (its project kept with every event, as a user's server
keeps it), events of one project stored `--batch` at a time (sent at once, so
that they share a transaction, as under load) each claimed as it is accepted,
then each run's success recorded. Under valgrind's callgrind, the instructions
the process executed are counted for 200 events and for 1,200: their difference
over 1,000 is an event's cost without the start-up's. Counted instructions move
by well under 1 % from run to run on a busy machine, where the CPU time of the
same work moved by 30 % on the 2-core VM the figures in the docs come from;
they leave out the kernel's part (the fsyncs) and the cache misses, so they
compare code, not machines. `--time` measures CPU time instead (no valgrind:
five runs of 3,000 events each, alternated, the least of each).

The database is a temporary file; no network is used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FEW, MANY = 200, 1200  # events: their difference is what one event costs
TIMED_EVENTS, TIMED_ROUNDS = 3000, 5


def work(batch: int, events: int) -> None:
    """The measured work, in this process, on the agentbox first on sys.path."""
    import agentbox.review.contract  # noqa: F401 - the event types, as the review registers them
    from agentbox.archive.history import SCHEMA
    from agentbox.events import parse_event
    from agentbox.runs import RunStatus
    from agentbox.store import IngestParams, Lease
    from agentbox.store.records import Outcome
    from agentbox.store.sqlite import SqliteStore

    def body(i: int) -> bytes:
        return json.dumps({
            "schema_version": "v1", "event_id": f"e-{i}",
            "idempotency_key": f"bench:session.exported:e-{i}",
            "event_type": "session.exported", "source": "bench",
            "timestamp": "2026-07-27T15:42:00Z",
            "payload": {"project_id": "bench", "mix_url": "/tmp/bench.wav"}}).encode()

    async def run(folder: Path) -> float:
        store = SqliteStore(folder / "agentbox.sqlite3")
        store.add_tables(SCHEMA)
        await store.open()
        bodies = [body(i) for i in range(events)]
        parsed = [parse_event(b) for b in bodies]
        done = Outcome(RunStatus.SUCCEEDED, result={"ok": True})
        now = 1.8e9

        async def one(i: int) -> None:
            result = await store.ingest(IngestParams(
                event=parsed[i], body=bodies[i], agents=("noop",), now=now, ttl=3600,
                max_pending=10**9, lease=Lease("bench", now + 60)))
            await store.finish(result.runs[0].run_id, "bench", 1, done, now + 0.001)

        started = time.process_time()
        for first in range(0, events, batch):
            await asyncio.gather(*(one(i) for i in range(first, min(events, first + batch))))
        spent = time.process_time() - started
        succeeded = (await store.stats())["runs"]["succeeded"]
        await store.close()
        if succeeded != events:
            raise SystemExit(f"store_cost: {succeeded} of {events} runs succeeded")
        return spent

    with tempfile.TemporaryDirectory(prefix="agentbox-store-cost-") as folder:
        spent = asyncio.run(run(Path(folder)))
    print(f"cpu_us_per_event {spent / events * 1e6:.1f}")


def measured(checkout: Path, batch: int, events: int, counting: bool) -> float:
    """Instructions (counting) or CPU µs per event of `events` in a process of its own."""
    command = [sys.executable, __file__, "--work", str(checkout), "--batch", str(batch),
               "--events", str(events)]
    if counting:
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    said = done.stdout + done.stderr
    found = re.search(r"Collected : (\d+)" if counting else r"cpu_us_per_event ([\d.]+)", said)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"store_cost: {checkout} failed:\n{said[-3000:]}")
    return float(found[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4, help="events a transaction (default 4)")
    parser.add_argument("--against", type=Path, action="append", default=[],
                        help="another checkout's root, measured the same way")
    parser.add_argument("--time", action="store_true", help="CPU time, not instructions")
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--events", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.work is not None:  # the measured process
        sys.path.insert(0, str(args.work))
        work(args.batch, args.events)
        return
    checkouts = checkouts_of(args.against, "store_cost")
    if not args.time and shutil.which("valgrind") is None:
        raise SystemExit("store_cost: counting instructions needs valgrind (apt install "
                         "valgrind); or measure CPU time with --time")
    costs: dict[Path, float] = {}
    if args.time:
        rounds: dict[Path, list[float]] = {checkout: [] for checkout in checkouts}
        for turn in range(TIMED_ROUNDS):
            for checkout in checkouts[::1 if turn % 2 == 0 else -1]:
                rounds[checkout].append(measured(checkout, args.batch, TIMED_EVENTS, False))
        costs = {checkout: min(found) for checkout, found in rounds.items()}
    else:
        for checkout in checkouts:
            few, many = (measured(checkout, args.batch, n, True) for n in (FEW, MANY))
            costs[checkout] = (many - few) / (MANY - FEW)
    unit = "CPU µs" if args.time else "instructions"
    report(costs, f"{unit} per event, {args.batch} events a transaction (stored, claimed, "
                  "succeeded):")


def checkouts_of(against: list[Path], script: str) -> list[Path]:
    """This checkout, then each `--against` folder: refused unless it holds agentbox."""
    checkouts = [ROOT, *(path.resolve() for path in against)]
    for checkout in checkouts:
        if not (checkout / "agentbox" / "store" / "sqlite.py").is_file():
            raise SystemExit(f"{script}: {checkout} is no checkout of agentbox")
    return checkouts


def report(costs: dict[Path, float], heading: str) -> None:
    """Each checkout's cost per event, and this checkout's over each other's."""
    first = costs[ROOT]
    print(heading)
    for checkout, cost in costs.items():
        name = "this checkout" if checkout == ROOT else str(checkout)
        ratio = "" if checkout == ROOT else f"   this checkout / it: {first / cost:.3f}"
        print(f"  {cost:>12,.0f}  {name}{ratio}")


if __name__ == "__main__":
    main()
